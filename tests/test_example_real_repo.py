"""examples/real-repo end to end: a real repository with a dependency, built once, graded honestly.

python-slugify imports text-unidecode, so nothing grades until the task's environment is built:
the build (``pip install -e .`` through the package mirror) runs once for the task, its venv is
mounted read-only into all four trials and their grades, and the egress default (allowlist) is
what the trials ran under. The agent is the scripted stand-in; its choice is a pure function of
the trial seed, so the count of passes is known in advance.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from hangar_dagster.util.gitrepo import git
from tests.conftest import ROOT, hangar

pytestmark = [pytest.mark.slow, pytest.mark.needs_sandbox("bwrap")]

EXAMPLE = ROOT / "examples" / "real-repo"


@pytest.fixture(scope="module")
def ran(
    tmp_path_factory: pytest.TempPathFactory, package_mirror: tuple[Any, Any]
) -> tuple[Path, str]:
    """The example copied out, its repo cloned from the bundle, run with ``run --wait``."""
    dest = tmp_path_factory.mktemp("real") / "real-repo"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("repo"))
    git("clone", "-q", str(dest / "repo.bundle"), str(dest / "repo"))
    home = dest.parent / "home"
    done = hangar(
        "experiment", "run", str(dest / "experiment.yaml"), "--wait",
        home=home, timeout=1200,
        env={"HANGAR_PACKAGE_MIRROR_URL": package_mirror[1].index_url},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return home, done.stdout


def test_four_trials_one_build_and_the_known_passes(ran: tuple[Path, str]) -> None:
    home, out = ran
    # The task's one build; the runner environment (runner-*, no build) sits beside it.
    builds = [
        p
        for p in (home / "builds").iterdir()
        if (p / "venv").is_dir() and not p.name.startswith("runner-")
    ]
    assert len(builds) == 1, sorted(p.name for p in (home / "builds").iterdir())
    with duckdb.connect(str(home / "hangar.duckdb"), read_only=True) as db:
        trials = db.execute(
            "select trial_key, outcome_class, build_digest from trials order by trial_key"
        ).fetchall()
        grades = db.execute("select passed, reason from grades order by trial_key").fetchall()
        checks = db.execute(
            "select base_passed, reference_passed, invalid from base_checks"
        ).fetchall()
    assert len(trials) == 4 and {t[1] for t in trials} == {"completed"}, trials
    assert len({t[2] for t in trials}) == 1 and trials[0][2]  # all four ran in the one build
    assert checks == [(False, True, False)]  # the repo's code fails; upstream's fix passes
    assert sum(bool(g[0]) for g in grades) == 3, grades  # the stand-in's seeded choices
    assert "75.0 pts" in out


def test_each_trial_ran_under_allowlist_egress(ran: tuple[Path, str]) -> None:
    home, _ = ran
    manifests = sorted(home.rglob("manifest.json"))
    assert manifests, "no trial manifest was written"
    for m in manifests:
        assert json.loads(m.read_text())["environment"]["egress"]["mode"] == "allowlist", m
