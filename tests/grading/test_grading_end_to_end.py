"""The grader end to end: a real task repo, real patches, the bwrap sandbox and hangar-grade."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import factories
import pytest
from grading_builders import FIXED, HIDDEN, HIDDEN_WEAK, PatchMaker, experiment

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.grading import grader
from hangar_dagster.grading.grader import (
    PRISTINE,
    base_check_log,
    check_base,
    grade_trial,
    run_grader,
)
from hangar_dagster.results.records import BaseCheckRecord, TrialRecord
from hangar_dagster.settings import HangarPaths, paths
from hangar_dagster.trials.canary import MASK

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

FORCE_PASS_CONFTEST = (
    "import pytest\n\n\n"
    "@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)
# Still buggy, and on import tries to overwrite the hidden tests with ones that pass; it reports
# how that went through $HANGAR_GRADE_OUT, which the grader keeps in its output.
SNEAKY_CALC = (
    "import os\n\n"
    "hidden = os.path.join(os.environ['HANGAR_HIDDEN_TESTS'], 'test_calc_hidden.py')\n"
    "try:\n"
    "    with open(hidden, 'w') as f:\n"
    "        f.write('def test_add():\\n    pass\\n')\n"
    "    result = 'ok'\n"
    "except OSError as err:\n"
    "    result = err.strerror\n"
    "with open(os.environ['HANGAR_GRADE_OUT'], 'a') as out:\n"
    "    out.write(f'hidden write: {result}\\n')\n\n\n"
    "def add(a, b):\n    return a - b\n"
)


def exp_for(
    task_repo: tuple[Path, str], hidden: dict[str, str] | None = None, **kw: Any
) -> ResolvedExperiment:
    repo, base = task_repo
    task = {"repo": str(repo), "base_sha": base, "hidden_files": hidden or HIDDEN}
    reference = kw.pop("reference_patch", None)
    if reference is not None:
        task["reference_patch"] = reference
    return experiment({"t1": task}, **kw)


def trial_for(exp: ResolvedExperiment, tmp_path: Path, **kw: Any) -> TrialRecord:
    artifacts = tmp_path / "artifacts" / "v1__t1__1" / "attempt-1"
    artifacts.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = dict(
        experiment_id=exp.experiment_id,
        base_sha=exp.tasks["t1"].base_sha,
        artifacts_dir=str(artifacts),
    )
    return factories.trial(variant="v1", task="t1", **(fields | kw))


@pytest.fixture
def hpaths(hangar_home: Path) -> HangarPaths:
    return paths()


def work_is_clean(hp: HangarPaths) -> bool:
    """No grade left its work dir behind (the pristine clones beside them are kept on purpose)."""
    root = hp.work / "grading"
    return not root.exists() or all(p.name == PRISTINE for p in root.iterdir())


def test_valid_task_base_fails_and_reference_passes(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths
) -> None:
    exp = exp_for(task_repo, reference_patch=make_patch({"calc.py": FIXED}))
    check = check_base(exp, "t1", "run-base", hpaths)
    assert isinstance(check, BaseCheckRecord)
    assert (check.invalid, check.reason) == (False, None)
    assert check.base_passed is False
    assert check.base_counts == {"total": 2, "passed": 1, "failed": 1, "errors": 0, "skipped": 0}
    assert check.reference_given and check.reference_passed is True
    assert check.reference_counts == {
        "total": 2,
        "passed": 2,
        "failed": 0,
        "errors": 0,
        "skipped": 0,
    }
    assert (check.base_sha, check.grader_digest, check.run_id) == (
        task_repo[1],
        exp.grader_digest,
        "run-base",
    )
    log = base_check_log(hpaths, exp.experiment_id, "t1").read_text()
    assert "=== reference_patch ===" in log and "1 failed, 1 passed" in log
    assert work_is_clean(hpaths)


def test_hidden_tests_that_pass_on_base_make_the_task_invalid(
    task_repo: tuple[Path, str], hpaths: HangarPaths
) -> None:
    check = check_base(exp_for(task_repo, HIDDEN_WEAK), "t1", "run-base", hpaths)
    assert check.base_passed is True
    assert check.invalid is True and check.reason == "hidden tests pass on base"
    assert check.reference_given is False and check.reference_passed is None


def test_no_tests_collected_and_a_failing_reference_are_invalid(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths
) -> None:
    empty = {"test_nothing.py": "HELPER = 1\n"}
    check = check_base(exp_for(task_repo, empty), "t1", "r", hpaths)
    assert check.invalid and check.reason is not None
    assert check.reason.startswith("no hidden tests were collected on base")

    wrong_fix = make_patch({"calc.py": "def add(a, b):\n    return 5\n"})
    check = check_base(exp_for(task_repo, reference_patch=wrong_fix), "t1", "r", hpaths)
    assert check.invalid and check.reference_passed is False
    assert check.reason == "hidden tests fail on reference_patch (1 failed, 0 error(s) of 2)"


def test_trial_that_fixes_the_bug_passes_with_counts(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths, tmp_path: Path
) -> None:
    exp = exp_for(task_repo)
    patch = make_patch({"calc.py": FIXED, "tests/test_calc.py": "def test_zero():\n    pass\n"})
    check = factories.base_check(task="t1", invalid=False)
    trial = trial_for(exp, tmp_path)
    grade = grade_trial(exp, trial, patch, check, "run-grade", hpaths)
    assert grade.passed is True and grade.reason is None and grade.exit_code == 0
    assert grade.hidden_tests == {"total": 2, "passed": 2, "failed": 0, "errors": 0, "skipped": 0}
    # As root the grader splits uids, and the trusted reporter confirms it: isolated.
    trust = "isolated" if os.geteuid() == 0 else "best_effort"
    assert (grade.trust, grade.runner, grade.files_mode, grade.network) == (
        trust, "hangar-grade", "hidden", "none",
    )  # fmt: skip
    assert grade.tamper_signals == [] and grade.contamination == []
    assert grade.touched_tests == ["tests/test_calc.py"]
    assert grade.task_invalid is False and grade.grader_digest == exp.grader_digest
    assert (grade.trial_key, grade.attempt, grade.run_id) == ("v1/t1/1", 1, "run-grade")
    assert "2 passed" in (Path(trial.artifacts_dir) / "grade.log").read_text()
    assert work_is_clean(hpaths)


def test_invalid_base_check_marks_the_grade(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths, tmp_path: Path
) -> None:
    exp = exp_for(task_repo)
    check = factories.base_check(task="t1", invalid=True, reason="hidden tests pass on base")
    grade = grade_trial(
        exp, trial_for(exp, tmp_path), make_patch({"calc.py": FIXED}), check, "r", hpaths
    )
    assert grade.passed is True and grade.task_invalid is True


def test_repo_conftest_forcing_passes_does_not_pass_and_is_flagged(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths, tmp_path: Path
) -> None:
    exp = exp_for(task_repo)
    patch = make_patch(
        {
            "conftest.py": FORCE_PASS_CONFTEST,
            "pytest.ini": "[pytest]\naddopts = -k zero\n",
            "calc.py": SNEAKY_CALC,
        }
    )
    trial = trial_for(exp, tmp_path)
    grade = grade_trial(exp, trial, patch, None, "r", hpaths)
    assert grade.passed is False and grade.reason is None
    assert grade.hidden_tests["failed"] == 1 and grade.hidden_tests["total"] == 2
    assert grade.tamper_signals == [
        "conftest.py",
        "pytest.ini",
        # The static pass: the calc module names the grader's variables.
        "static: calc.py:3: names 'HANGAR_HIDDEN_TESTS'",
        "static: calc.py:10: names 'HANGAR_GRADE_OUT'",
    ]
    log = (Path(trial.artifacts_dir) / "grade.log").read_text()
    # The hidden tests are mounted read-only: the patch's code could not replace them.
    assert "--- $HANGAR_GRADE_OUT ---\nhidden write: Read-only file system" in log


def test_control_in_repo_files_and_plain_pytest_are_fooled_and_say_trust_low(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths, tmp_path: Path
) -> None:
    # The old layout with a plain pytest command: the same trick now makes a failing grade pass,
    # which is why such grades say trust: low.
    exp = exp_for(
        task_repo,
        grader={
            "files_mode": "in_repo",
            "command": 'python -m pytest -q --junitxml "$HANGAR_GRADE_JUNIT"',
        },
    )
    patch = make_patch({"conftest.py": FORCE_PASS_CONFTEST})
    grade = grade_trial(exp, trial_for(exp, tmp_path), patch, None, "r", hpaths)
    assert grade.passed is True
    assert (grade.trust, grade.runner, grade.files_mode) == ("low", "command", "in_repo")
    assert grade.tamper_signals == ["conftest.py"]


def test_canary_is_on_disk_in_hidden_files_but_masked_in_output(
    task_repo: tuple[Path, str], hpaths: HangarPaths, tmp_path: Path
) -> None:
    hidden = {
        "test_canary.py": (
            "def first_line():\n"
            "    with open(__file__) as f:\n"
            "        return f.readline()\n\n\n"
            "def test_marked():\n"
            "    assert first_line().startswith('# HANGAR-CANARY-')\n\n\n"
            "def test_show():\n"
            "    print('FIRST LINE:', first_line())\n"
            "    assert False\n"
        )
    }
    exp = exp_for(task_repo, hidden)
    assert exp.canary not in json.dumps(hidden)
    run = run_grader(exp, "t1", "", label="canary", work_root=hpaths.work / "grading", env_extra={})
    assert run.counts["passed"] == 1 and run.counts["failed"] == 1  # test_marked saw the line
    assert f"FIRST LINE: # {MASK}" in run.output and "canary_files: 1" in run.output
    assert exp.canary not in run.output
    assert work_is_clean(hpaths)


def test_grader_time_limit_fails_the_grade(
    task_repo: tuple[Path, str], hpaths: HangarPaths
) -> None:
    hidden = {"test_slow.py": "import time\n\n\ndef test_slow():\n    time.sleep(60)\n"}
    exp = exp_for(task_repo, hidden, grader={"timeout_s": 1})
    run = run_grader(exp, "t1", "", label="slow", work_root=hpaths.work / "grading", env_extra={})
    assert (run.passed, run.timed_out, run.exit_code) == (False, True, None)
    assert run.reason == "grader timed out" and run.duration_s < 30
    assert work_is_clean(hpaths)


def test_patch_that_does_not_apply_is_a_failed_grade(
    task_repo: tuple[Path, str], hpaths: HangarPaths, tmp_path: Path
) -> None:
    exp = exp_for(task_repo)
    bad = (
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n"
        "@@ -1,2 +1,2 @@\n-nope\n+x\n yes\n"
    )
    grade = grade_trial(exp, trial_for(exp, tmp_path), bad, None, "r", hpaths)
    assert grade.passed is False and grade.exit_code is None
    assert grade.reason is not None and grade.reason.startswith("patch does not apply: ")
    assert work_is_clean(hpaths)


def test_infra_error_trial_is_not_run_but_contamination_is_still_searched(
    task_repo: tuple[Path, str], hpaths: HangarPaths, tmp_path: Path
) -> None:
    exp = exp_for(task_repo)
    trial = trial_for(
        exp, tmp_path, outcome_class="infra_error", infra_reason="sandbox_create",
        trace={"events": [{"type": "tool_call", "input": f"cat {exp.canary}"}]},
    )  # fmt: skip
    (Path(trial.artifacts_dir) / "RESULT.md").write_text(f"found {exp.canary}\n")
    patch = f"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+# {exp.canary}\n"
    grade = grade_trial(exp, trial, patch, None, "r", hpaths)
    assert grade.passed is False and grade.reason == "not graded: infra_error (sandbox_create)"
    assert grade.contamination == ["RESULT.md", "patch", "trace"]
    assert not (Path(trial.artifacts_dir) / "grade.log").exists()


def test_mirror_network_runs_behind_the_egress_proxy(
    task_repo: tuple[Path, str], hpaths: HangarPaths
) -> None:
    """Regression: network mirror failed every grade ("not supported by the local sandbox")."""
    exp = exp_for(task_repo, grader={"network": "mirror"})
    run = run_grader(exp, "t1", "", label="m", work_root=hpaths.work / "grading", env_extra={})
    # The base fails its hidden tests as it does under none; the run itself was given.
    assert run.passed is False and run.counts["total"] > 0, run.output
    assert "--- egress (mirror) ---\n0 allowed, 0 refused" in run.output
    assert not (hpaths.home / "mirror").exists()  # nothing asked for the mirror: none started
    with pytest.raises(ValueError, match="env_extra: PATH not allowed"):
        run_grader(exp, "t1", "", label="m", work_root=hpaths.work, env_extra={"PATH": "/evil"})


# Reports a grader command hands over, refused before parsing: each fails for its own reason.
HEAD, TAIL = '<testsuite><testcase name="t"/>', "</testsuite>"
OVERSIZED = f"{HEAD!r} + ' ' * (6 << 20) + {TAIL!r}"
LAUGHS = repr(
    '<!DOCTYPE s [<!ENTITY a "aa"><!ENTITY b "&a;&a;">]>' + HEAD.replace('"t"', '"&b;"') + TAIL
)


@pytest.mark.parametrize(
    ("report", "why"),
    [(OVERSIZED, f"JUnit report larger than 5242880 bytes ({len(HEAD + TAIL) + (6 << 20)}); "
                 "refused unread"),
     (LAUGHS, "JUnit report declares a DOCTYPE/entities; refused unparsed")],
    ids=["oversized", "entities"],
)  # fmt: skip
def test_refused_reports_fail_the_grade_for_their_own_reason(
    report: str, why: str, task_repo: tuple[Path, str], hpaths: HangarPaths
) -> None:
    writer = f"import os\nopen(os.environ['HANGAR_GRADE_JUNIT'], 'w').write({report})\n"
    exp = exp_for(
        task_repo,
        hidden={**HIDDEN, "write_report.py": writer},
        grader={"command": 'python "$HANGAR_HIDDEN_TESTS/write_report.py"'},
    )
    run = run_grader(exp, "t1", "", label="refused", work_root=hpaths.work, env_extra={})
    assert run.passed is False and run.exit_code == 0
    assert run.reason == f"no usable JUnit report: $HANGAR_GRADE_JUNIT: {why}"


def test_golden_txt_hidden_file_gets_no_canary_line(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths
) -> None:
    # A hidden golden output compared byte for byte: a canary line in it broke the task.
    hidden = {
        "expected_sum.txt": "5\n",
        "test_golden.py": (
            "from pathlib import Path\n\nfrom calc import add\n\n\n"
            "def test_matches_golden():\n"
            "    golden = (Path(__file__).parent / 'expected_sum.txt').read_text()\n"
            "    assert f'{add(2, 3)}\\n' == golden\n"
        ),
    }
    exp = exp_for(task_repo, hidden)
    fixed = make_patch({"calc.py": FIXED})
    run = run_grader(exp, "t1", fixed, label="golden", work_root=hpaths.work, env_extra={})
    assert run.passed is True and run.counts["passed"] == 1, run.output
    assert run.canary_files == 1  # the test file carries it, the golden file does not


def test_inside_a_trials_stage_a_grades_work_dir_is_removed_behind_it(
    task_repo: tuple[Path, str], hpaths: HangarPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The removal, outside the grader's time, was the largest part of a slot's time between
    # trials: the slot goes on, and the block's end waits for every removal.
    exp = exp_for(task_repo)
    gate = threading.Event()
    remove = grader.remove_tree

    def held(work: Path) -> None:
        assert gate.wait(60)
        remove(work)

    monkeypatch.setattr(grader, "remove_tree", held)
    with grader.work_removed_behind():
        run = run_grader(
            exp, "t1", "", label="behind", work_root=hpaths.work / "grading", env_extra={}
        )
        assert run.counts["failed"] == 1, run.output
        assert not work_is_clean(hpaths), "the work dir is removed behind the grade"
        gate.set()
    assert work_is_clean(hpaths)
