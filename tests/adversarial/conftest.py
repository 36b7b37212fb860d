"""Fixtures for the adversarial suite: a real task repo, its base checks, and patches taken with git.

Every malicious patch here is graded only through hangar's real grader, in its
sandbox; nothing in this directory runs the patched code on the host.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# grading_builders (the ResolvedExperiment builder) lives beside the grading tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))

from adv_fixture import (  # noqa: E402
    BUGGY_CALC,
    BUGGY_TEXT,
    FIXED_CALC,
    FIXED_TEXT,
    Files,
    Fixture,
    write_files,
)
from grading_builders import commit_all  # noqa: E402

from hangar_dagster.grading.grader import check_base  # noqa: E402
from hangar_dagster.results.records import BaseCheckRecord  # noqa: E402
from hangar_dagster.settings import HangarPaths  # noqa: E402
from hangar_dagster.util.gitrepo import git, take_patch  # noqa: E402


@pytest.fixture(scope="session")
def fixture_repo(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    root = tmp_path_factory.mktemp("adversarial")
    repo = root / "task-repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", str(repo))
    write_files(repo, {"calc.py": BUGGY_CALC, "text.py": BUGGY_TEXT,
                  "tests/test_calc.py": "from calc import add\n\n\ndef test_zero():\n"
                                        "    assert add(0, 0) == 0\n"})  # fmt: skip
    base = commit_all(repo, "base")
    counter = iter(range(10_000))

    def make(files: Files) -> str:
        work = root / f"patch-{next(counter)}"
        git("clone", "-q", str(repo), str(work))
        write_files(work, files)
        return take_patch(work, base)

    refs = {"calc": make({"calc.py": FIXED_CALC}), "text": make({"text.py": FIXED_TEXT})}
    return Fixture(repo, base, make, refs)


@pytest.fixture(scope="session")
def session_paths(tmp_path_factory: pytest.TempPathFactory) -> HangarPaths:
    return HangarPaths(tmp_path_factory.mktemp("adversarial-home"))


@pytest.fixture(scope="session")
def base_checks(fixture_repo: Fixture, session_paths: HangarPaths) -> dict[str, BaseCheckRecord]:
    """The base-must-fail check of each fixture task, once for the whole suite."""
    exp = fixture_repo.experiment()
    return {t: check_base(exp, t, "run-base", session_paths) for t in ("calc", "text")}
