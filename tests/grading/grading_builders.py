"""Builders for grading tests: task repo contents and a ResolvedExperiment around a real repo."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hangar_dagster.experiment.plan import ResolvedExperiment, ResolvedTask, ResolvedVariant
from hangar_dagster.experiment.spec import Environment, ExperimentSpec
from hangar_dagster.grading.grader import grader_digest
from hangar_dagster.trials.canary import new_canary
from hangar_dagster.util.gitrepo import git

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
VISIBLE_TEST = "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
HIDDEN = {
    "test_calc_hidden.py": (
        "from calc import add\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_zero():\n    assert add(0, 0) == 0\n"
    )
}
# Passes on the buggy base as well: a task that cannot tell a fix from no fix.
HIDDEN_WEAK = {
    "test_calc_weak.py": "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
}
PatchMaker = Callable[[dict[str, str]], str]
LOCK = "standin@sha256:" + "a" * 64


def commit_all(repo: Path, message: str) -> str:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo).strip()


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def experiment(
    tasks: dict[str, dict[str, Any]],
    *,
    grader: dict[str, Any] | None = None,
    canary: str | None = None,
    environment: dict[str, Any] | None = None,
) -> ResolvedExperiment:
    """A ResolvedExperiment over ``tasks`` ({id: {repo, base_sha, hidden_files, build, ...}});
    ``environment``: the spec's (and the variant's) environment (e.g. ``{"sandbox": "docker",
    "image": ...}``)."""
    grader_spec = {
        "command": "hangar-grade pytest -q",
        "timeout_s": 120,
        **(grader or {}),
        "canary": canary or new_canary(),
    }
    spec = ExperimentSpec.model_validate(
        {
            "name": "grading-test",
            "tasks": [
                {"id": tid, "instructions": "fix it", "repo": t["repo"], "base": t["base_sha"]}
                for tid, t in tasks.items()
            ],
            "variants": {"v1": {"harness_lock": LOCK}},
            "grader": grader_spec,
            **({"environment": environment} if environment is not None else {}),
        }
    )
    resolved = {
        tid: ResolvedTask(
            id=tid,
            instructions="fix it",
            repo=t["repo"],
            base_sha=t["base_sha"],
            verify=None,
            reference_patch=t.get("reference_patch"),
            hidden_files=t["hidden_files"],
            build=tuple(t.get("build", ())),
        )
        for tid, t in tasks.items()
    }
    variant = ResolvedVariant(
        name="v1",
        harness_lock=LOCK,
        harness_digest="a" * 64,
        harness_path="/nonexistent",
        adapter="standin",
        model="standin-2025-01-01",
        environment=spec.environment if environment is not None else Environment(),
        environment_digest="sha256:" + "c" * 64,
        tasks=tuple(tasks),
        pin_set="pin-" + "0" * 20,
    )
    return ResolvedExperiment(
        experiment_id="exp-grading",
        name="grading-test",
        author="tester",
        spec_path="/nonexistent/spec.yaml",
        submitted_at=dt.datetime(2025, 1, 2, tzinfo=dt.UTC),
        spec=spec,
        tasks=resolved,
        variants={"v1": variant},
        grader_digest=grader_digest(
            spec.grader, {tid: t.hidden_files for tid, t in resolved.items()}
        ),
    )
