"""Fixtures for grading tests: a real task repo in tmp_path, and patches taken from it with git."""

from __future__ import annotations

from pathlib import Path

import pytest
from grading_builders import BUGGY, VISIBLE_TEST, PatchMaker, commit_all, write

from hangar_dagster.util.gitrepo import git, take_patch


@pytest.fixture
def task_repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repo whose ``calc.add`` subtracts; returns (path, base SHA)."""
    repo = tmp_path / "task-repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", str(repo))
    write(repo, {"calc.py": BUGGY, "tests/test_calc.py": VISIBLE_TEST})
    return repo, commit_all(repo, "base")


@pytest.fixture
def make_patch(task_repo: tuple[Path, str], tmp_path: Path) -> PatchMaker:
    """A real ``git diff`` of the base with ``files`` written over it, as a trial leaves it."""
    repo, base = task_repo
    counter = iter(range(1000))

    def make(files: dict[str, str]) -> str:
        work = tmp_path / f"patch-work-{next(counter)}"
        git("clone", "-q", str(repo), str(work))
        write(work, files)
        return take_patch(work, base)

    return make
