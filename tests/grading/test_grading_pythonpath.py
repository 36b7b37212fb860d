"""``grader.pythonpath``: a src/ layout's package is importable by the hidden tests, and the copy
installed in hangar's own environment is never importable by them."""

from __future__ import annotations

from pathlib import Path

import pytest
from grading_builders import commit_all, experiment, write

from hangar_dagster.experiment.spec import Grader
from hangar_dagster.grading.grader import grader_digest, run_grader
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.gitrepo import git

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

# tomli is installed beside hangar (a dependency of its tools): the hidden test must see the
# repo's src/tomli instead, as `PYTHONPATH=src pytest` in the repo would.
HIDDEN = {
    "test_src.py": (
        "import tomli\n\n\n"
        "def test_repo_copy():\n    assert tomli.loads('') == 'repo copy', tomli.__file__\n\n\n"
        "def test_helper():\n    import helper\n\n    assert helper.VALUE == 1\n"
    )
}


@pytest.fixture
def src_repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "src-repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", str(repo))
    write(repo, {"src/tomli/__init__.py": "def loads(s):\n    return 'repo copy'\n",
                 "helper.py": "VALUE = 1\n"})  # fmt: skip
    return repo, commit_all(repo, "base")


def test_import_roots_go_first_on_the_tests_path(
    src_repo: tuple[Path, str], tmp_path: Path
) -> None:
    import tomli  # noqa: F401  (it must be there for the test to mean anything)

    repo, base = src_repo
    task = {"t1": {"repo": str(repo), "base_sha": base, "hidden_files": HIDDEN}}
    work = HangarPaths(tmp_path / "home").work / "grading"
    with_src = experiment(task, grader={"pythonpath": ["src"]})
    run = run_grader(with_src, "t1", "", label="src", work_root=work, env_extra={})
    # The repo root stays importable too (helper.py), after src.
    assert (run.passed, run.counts["passed"]) == (True, 2), run.output
    without = experiment(task)
    run = run_grader(without, "t1", "", label="no-src", work_root=work, env_extra={})
    # Without the import root the repo's tomli is not importable, and hangar's own installed
    # copy never stands in (issue 18): the test module cannot import tomli at all.
    assert not run.passed, run.output
    assert "No module named 'tomli'" in run.output, run.output
    assert "site-packages/tomli" not in run.output
    assert with_src.grader_digest != without.grader_digest


@pytest.mark.parametrize("bad", ["..", "../other", "/abs", "src/../..", "a\\b", "a:b", ""])
def test_pythonpath_must_stay_inside_the_repo(bad: str) -> None:
    with pytest.raises(ValueError, match="must be a directory inside the repo"):
        Grader.model_validate({"pythonpath": [bad]})


def test_digest_without_pythonpath_is_unchanged() -> None:
    # Graders that do not set it pin the digest they pinned before the field existed.
    grader = Grader.model_validate({"command": "hangar-grade pytest -q"})
    assert grader_digest(grader, {"t": {"test_a.py": "x"}}) == (
        "sha256:" + _old_digest(grader, {"t": {"test_a.py": "x"}})
    )


def _old_digest(grader: Grader, hidden: dict[str, dict[str, str]]) -> str:
    from hangar_dagster.util.digests import sha256_json

    return sha256_json(
        {"command": grader.command, "network": grader.network, "files_mode": grader.files_mode,
         "timeout_s": grader.timeout_s, "files": grader.files, "tasks": hidden}
    )  # fmt: skip
