"""Malicious patches graded through the real grader: each ends failed, or flagged with its signal.

Plus the controls: on every fixture task the reference patch passes (isolated,
no signal) and the empty patch fails.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import factories
import pytest
from adv_fixture import Fixture, case_files, fix_server
from cases import BACKEND_NAMES, CASES, DEFAULT_BACKEND_ONLY, EVERY_BACKEND, Case, backends_of

from hangar_dagster.grading.grader import grade_trial
from hangar_dagster.results.records import BaseCheckRecord, GradeRecord
from hangar_dagster.settings import HangarPaths

pytestmark = pytest.mark.integration  # each backend needs its sandbox: conftest.BACKENDS
TRUST = "isolated" if os.geteuid() == 0 else "best_effort"


@pytest.fixture(scope="module")
def listener() -> Iterator[int]:
    with fix_server() as port:
        yield port


def grade(
    fx: Fixture, paths: HangarPaths, check: BaseCheckRecord, task: str, patch: str,
    tmp_path: Path, timeout_s: int = 60,
) -> tuple[GradeRecord, str]:  # fmt: skip
    exp = fx.experiment(timeout_s=timeout_s)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir(exist_ok=True)
    trial = factories.trial(
        variant="v1", task=task, experiment_id=exp.experiment_id, base_sha=fx.base,
        artifacts_dir=str(artifacts),
    )  # fmt: skip
    g = grade_trial(exp, trial, patch, check, "run-adv", paths)
    return g, (artifacts / "grade.log").read_text()


def test_base_checks_are_valid_and_collect_the_hidden_tests(
    base_checks: dict[str, BaseCheckRecord],
) -> None:
    calc, text = base_checks["calc"], base_checks["text"]
    assert (calc.invalid, calc.reference_passed, text.invalid, text.reference_passed) == (
        False, True, False, True,
    )  # fmt: skip
    assert calc.expected_tests == [
        "test_calc_hidden::test_add", "test_calc_hidden::test_negative",
        "test_calc_hidden::test_zero",
    ]  # fmt: skip
    assert text.expected_tests == ["test_text_hidden::test_plain", "test_text_hidden::test_slug"]


@pytest.mark.parametrize("task", ["calc", "text"])
def test_control_reference_passes_isolated(
    task: str, fixture_repo: Fixture, session_paths: HangarPaths,
    base_checks: dict[str, BaseCheckRecord], tmp_path: Path,
) -> None:  # fmt: skip
    g, log = grade(fixture_repo, session_paths, base_checks[task], task,
                   fixture_repo.references[task], tmp_path)  # fmt: skip
    assert g.passed is True and g.reason is None, log
    assert g.trust == TRUST and g.tamper_signals == [] and g.task_invalid is False
    assert g.hidden_tests["passed"] == g.hidden_tests["total"] > 0
    if task == "calc":  # the hidden conftest's fixture (test_add uses it) and hook both worked
        assert g.hidden_tests["total"] == 3 and "hidden conftest hook ran" in log


@pytest.mark.parametrize("task", ["calc", "text"])
def test_control_empty_patch_fails(
    task: str, fixture_repo: Fixture, session_paths: HangarPaths,
    base_checks: dict[str, BaseCheckRecord], tmp_path: Path,
) -> None:  # fmt: skip
    g, log = grade(fixture_repo, session_paths, base_checks[task], task, "", tmp_path)
    assert g.passed is False and g.hidden_tests["failed"] >= 1, log
    assert g.tamper_signals == []


def still_running(marker: str) -> list[str]:
    """Processes whose environment mentions ``marker`` (a grader run's work directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()!r}")
        except OSError:
            continue  # gone meanwhile
    return found


def test_every_case_has_its_backends() -> None:
    """Each case is in exactly one of cases.EVERY_BACKEND and DEFAULT_BACKEND_ONLY."""
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)
    every, default = set(EVERY_BACKEND), set(DEFAULT_BACKEND_ONLY)
    assert len(default) == len(DEFAULT_BACKEND_ONLY), "a case is twice in DEFAULT_BACKEND_ONLY"
    assert every & default == set(), "in both lists"
    assert set(names) - every - default == set(), "in neither list: say where it runs"
    assert (every | default) - set(names) == set(), "listed, but no such case"


# One parameter per (backend, case); conftest groups them by backend.
PARAMS = [
    pytest.param(
        backend, c, id=f"{backend}-{c.name}",
        marks=[pytest.mark.needs_sandbox(backend),
               *([pytest.mark.xfail(strict=True, raises=AssertionError, reason=c.known_gap)]
                 if c.known_gap else [])],
    )
    for backend in BACKEND_NAMES
    for c in CASES
    if backend in backends_of(c)
]  # fmt: skip


@pytest.mark.parametrize(("fixture_repo", "case"), PARAMS, indirect=["fixture_repo"])
def test_malicious_patch(
    case: Case, fixture_repo: Fixture, session_paths: HangarPaths,
    base_checks: dict[str, BaseCheckRecord], tmp_path: Path, listener: int,
) -> None:  # fmt: skip
    if case.skip is not None:
        pytest.skip(case.skip)
    fill = {"{port}": str(listener), "{artifacts}": str(tmp_path / "artifacts"),
            "{home}": str(session_paths.home),
            "{memory_mb}": str(fixture_repo.experiment().spec.environment.resources.memory_mb)}  # fmt: skip
    patch = fixture_repo.make_patch(case_files(case.files, fill))
    g, log = grade(fixture_repo, session_paths, base_checks["calc"], "calc", patch, tmp_path,
                   case.timeout_s)  # fmt: skip
    if case.control is not None:
        # The honest twin passes clean: the case's signal comes from its construct alone.
        twin = fixture_repo.make_patch(case.control)  # type: ignore[arg-type]
        (tmp_path / "control").mkdir()
        c, c_log = grade(fixture_repo, session_paths, base_checks["calc"], "calc", twin,
                         tmp_path / "control")  # fmt: skip
        assert c.passed is True and c.tamper_signals == [] and c.trust == TRUST, (c, c_log)
    if case.passed is False:
        assert g.passed is False, log
    if case.reason is not None:
        assert g.reason is not None and case.reason in g.reason, log
    if case.signal is not None:
        assert any(case.signal in s for s in g.tamper_signals), (g.tamper_signals, log)
    for pattern in case.log:
        assert re.search(pattern, log), (pattern, log)
    for text in case.not_in_log:
        assert text not in log, (text, log)
    assert not (tmp_path / "artifacts" / "big.bin").exists()
    # Nothing the patch started outlives its grade (HANGAR_HIDDEN_TESTS names the work dir).
    assert still_running(str(session_paths.work / "grading")) == []
    # The wall-clock limit holds: a run ends within it, plus setup and teardown.
    assert g.duration_s < case.timeout_s + 15, g.duration_s
