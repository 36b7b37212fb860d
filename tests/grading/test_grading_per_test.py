"""Per-test results: every hidden test of a grade lands in grade_tests, with its base-check class."""

from __future__ import annotations

import os
from pathlib import Path

import factories
import pytest
from grading_builders import FIXED, PatchMaker, experiment

from hangar_dagster.grading.grader import check_base, grade_trial
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths
from hangar_dagster.trials.canary import MASK

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

SECRET = "sk-ant-api03-" + "x" * 40
HIDDEN = {
    "test_mixed.py": f"""\
import pytest

from calc import add


def test_add():
    assert add(2, 3) == 5


def test_zero():
    assert add(0, 0) == 0


@pytest.mark.xfail(reason="fixed by the patch")
def test_turns():
    assert add(1, 1) == 2


@pytest.mark.xfail(reason="never holds")
def test_never():
    assert add(1, 1) == 3


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_error(broken):
    pass


def test_tells():
    # The failure message names the canary (read from this file) and a key: both stay out.
    canary = open(__file__).readline().split()[-1]
    assert add(2, 2) == 5, f"{{canary}} {SECRET} " + "y" * 500
""",
}


def test_each_hidden_test_is_stored_with_outcome_time_message_and_base_class(
    task_repo: tuple[Path, str], make_patch: PatchMaker, tmp_path: Path
) -> None:
    repo, base = task_repo
    exp = experiment({"t1": {"repo": str(repo), "base_sha": base, "hidden_files": HIDDEN}})
    hpaths = HangarPaths(tmp_path / "home")
    check = check_base(exp, "t1", "run-base", hpaths)
    assert check.base_outcomes == {
        "test_mixed::test_add": "failed",
        "test_mixed::test_zero": "passed",
        "test_mixed::test_turns": "xfailed",
        "test_mixed::test_never": "xfailed",
        "test_mixed::test_skipped": "skipped",
        "test_mixed::test_error": "error",
        "test_mixed::test_tells": "failed",
    }
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    trial = factories.trial(variant="v1", task="t1", experiment_id=exp.experiment_id,
                            base_sha=base, artifacts_dir=str(artifacts))  # fmt: skip
    grade = grade_trial(exp, trial, make_patch({"calc.py": FIXED}), check, "run-1", hpaths)
    store = Store(hpaths)
    store.put(grade)
    rows = {r.test_id.split("::")[1]: r for r in store.grade_tests(exp.experiment_id)}
    assert {k: (r.outcome, r.on_base) for k, r in rows.items()} == {
        "test_add": ("passed", "fail_to_pass"),
        "test_zero": ("passed", "pass_to_pass"),
        "test_turns": ("xpassed", None),
        "test_never": ("xfailed", None),
        "test_skipped": ("skipped", None),
        "test_error": ("error", "fail_to_pass"),
        "test_tells": ("failed", "fail_to_pass"),
    }
    assert all(r.duration_s >= 0 for r in rows.values())
    assert {(r.trial_key, r.attempt, r.variant, r.task) for r in rows.values()} == {
        (grade.trial_key, grade.attempt, "v1", "t1")
    }
    tells = rows["test_tells"].message
    assert tells is not None and len(tells) <= 200 and tells.endswith("...")
    assert MASK in tells and exp.canary not in tells
    assert SECRET not in tells and "[redacted:" in tells
    assert rows["test_skipped"].message is not None and "not today" in rows["test_skipped"].message
    assert rows["test_zero"].message is None
    # One Parquet file per grade; DuckDB rebuilt from Parquet has every row again.
    files = list((hpaths.parquet / "grade_tests").rglob("*.parquet"))
    assert [f.name for f in files] == ["v1.t1.1.attempt-1.parquet"]
    os.unlink(hpaths.duckdb)
    assert len(Store(hpaths).grade_tests(exp.experiment_id, grade.trial_key)) == 7


def test_a_grade_without_a_base_check_has_no_base_class(
    task_repo: tuple[Path, str], make_patch: PatchMaker, tmp_path: Path
) -> None:
    repo, base = task_repo
    exp = experiment({"t1": {"repo": str(repo), "base_sha": base, "hidden_files": HIDDEN}})
    hpaths = HangarPaths(tmp_path / "home")
    trial = factories.trial(variant="v1", task="t1", experiment_id=exp.experiment_id,
                            base_sha=base, artifacts_dir=str(tmp_path))  # fmt: skip
    grade = grade_trial(exp, trial, "", None, "run-1", hpaths)
    assert len(grade.tests) == 7 and {t.on_base for t in grade.tests} == {None}
    assert grade.model_dump().keys().isdisjoint({"tests", "_tests"})
