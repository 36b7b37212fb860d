"""For the nightly tests: the example's spec with ``nightly:``, its tasks' repos cloned where
the test may move a branch (``trunk``, at the example's ``base``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.util.gitrepo import git


def nightly_spec(
    example_dir: Path,
    where: Path,
    *,
    at: str = "19:30",
    timezone: str = "America/New_York",
    tasks: tuple[str, ...] = ("median", "slugify"),
    edit: dict[str, Any] | None = None,
) -> Path:
    """``where/nightly.yaml``: the example, one trial of ``tasks``, each based on branch
    ``trunk`` of its own clone under ``where/repos`` (the test moves it: ``move_branch``)."""
    data: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    data.update(
        name="nightly-ab",
        harness_repo=str(example_dir / "harnesses"),
        trials=1,
        author="tester",
        nightly={"at": at, "timezone": timezone},
    )
    kept = []
    for task in data["tasks"]:
        if task["id"] not in tasks:
            continue
        repo = where / "repos" / task["id"]
        if not repo.exists():
            repo.parent.mkdir(parents=True, exist_ok=True)
            git("clone", "-q", str(example_dir / task["repo"]), str(repo))
            git("branch", "-f", "trunk", "base", cwd=repo)
        for field in ("reference_patch", "hidden_tests"):
            task[field] = str(example_dir / task[field])
        task.update(repo=str(repo), base="trunk")
        kept.append(task)
    data["tasks"] = kept
    data.update(edit or {})
    spec = where / "nightly.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def move_branch(where: Path, task: str) -> str:
    """A commit on ``trunk`` of ``task``'s clone that fixes nothing (a note); its SHA."""
    repo = where / "repos" / task
    git("checkout", "-q", "trunk", cwd=repo)
    (repo / "NOTES.md").write_text("a note the night's commit added\n")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "a later note", cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo).strip()


def sha_of(where: Path, task: str, ref: str = "trunk") -> str:
    return git("rev-parse", ref, cwd=where / "repos" / task).strip()


def local(
    y: int, mo: int, d: int, h: int, mi: int = 0, tz: str = "America/New_York"
) -> dt.datetime:
    from zoneinfo import ZoneInfo

    return dt.datetime(y, mo, d, h, mi, tzinfo=ZoneInfo(tz))
