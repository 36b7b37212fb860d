"""benchmarks/inspect_compare.py's pure parts: the fit, the run order, the checks and the verdict.

The benchmark itself (timed, against Inspect AI in its own virtualenv) is run by hand; its
figures are in docs/performance.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from benchmarks.inspect_compare import (
    INSPECT_TASK,
    Fit,
    Run,
    busy_cpu_s,
    fit,
    inspect_log_problem,
    report,
    samples_for,
    schedule,
)

pytestmark = pytest.mark.unit


def test_two_sizes_give_the_two_point_marginal_and_fixed() -> None:
    got = fit([(20, 30.0), (100, 110.0)])
    assert got.marginal == pytest.approx((110.0 - 30.0) / 80)
    assert got.fixed == pytest.approx(30.0 - 20 * got.marginal)


def test_more_rounds_fit_by_least_squares() -> None:
    # two sizes: the line through the means at each size
    got = fit([(20, 28.0), (100, 108.0), (20, 36.0), (100, 120.0)])
    assert got == Fit(fixed=pytest.approx(32.0 - 20 * 1.025), marginal=pytest.approx(1.025))
    # three sizes, not on one line: least squares, not the end points
    got = fit([(20, 30.0), (60, 80.0), (100, 110.0)])
    assert got.marginal == pytest.approx(1.0)
    assert got.fixed == pytest.approx(73.333333 - 60.0)


def test_one_size_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"--sizes.*N = \[20\]"):
        fit([(20, 30.0), (20, 31.0)])


def test_runs_are_interleaved_size_by_size_round_by_round() -> None:
    assert schedule(2, (20, 100)) == [
        (1, "hangar", 20),
        (1, "inspect", 20),
        (1, "hangar", 100),
        (1, "inspect", 100),
        (2, "hangar", 20),
        (2, "inspect", 20),
        (2, "hangar", 100),
        (2, "inspect", 100),
    ]


def test_busy_cpu_leaves_out_idle_and_iowait() -> None:
    stat = "cpu  100 5 50 1000 20 3 2 7 0 0\ncpu0 50 2 25 500 10 1 1 3 0 0\n"
    assert busy_cpu_s(stat, 100) == pytest.approx((100 + 5 + 50 + 3 + 2 + 7) / 100)
    with pytest.raises(ValueError, match="cpu"):
        busy_cpu_s("intr 1 2 3\n", 100)


def test_samples_cycle_through_the_tasks_like_hangars_trials() -> None:
    tasks = [{"task": t} for t in "abc"]
    assert [s["task"] for s in samples_for(6, tasks)] == list("abcabc")
    with pytest.raises(ValueError, match="--sizes: 7 is not a multiple of the 3 tasks"):
        samples_for(7, tasks)


def _log(codes: list[int], status: str = "success") -> dict[str, object]:
    return {
        "status": status,
        "samples": [
            {"scores": {"hidden_tests": {"value": "I", "metadata": {"returncode": c}}}}
            for c in codes
        ],
    }


def test_an_inspect_log_passes_only_when_every_sample_ran_the_hidden_tests() -> None:
    assert inspect_log_problem(_log([1, 1, 0]), 3) is None
    assert inspect_log_problem(_log([1, 1]), 3) == "2 samples in the log, 3 expected"
    assert "exit codes [4]" in str(inspect_log_problem(_log([1, 4, 1]), 3))
    assert "status 'error'" in str(inspect_log_problem(_log([1], status="error"), 1))
    assert "exit codes [None]" in str(
        inspect_log_problem({"status": "success", "samples": [{}]}, 1)
    )


def _runs(hangar: tuple[float, float], inspect: tuple[float, float]) -> list[Run]:
    """One run per tool at 20 and 100 on the lines fixed + marginal x N (CPU = wall / 2)."""
    runs = []
    for tool, (fixed, marginal) in (("hangar", hangar), ("inspect", inspect)):
        for n in (20, 100):
            wall = fixed + marginal * n
            runs.append(Run(tool, n, 1, wall, wall / 2, wall, 1.0, 1.0))
    return runs


def test_the_report_gives_each_tools_costs_the_ratio_and_the_verdict() -> None:
    lines = report(_runs(hangar=(20.0, 1.5), inspect=(5.0, 0.5)))
    assert lines[0].endswith("two points: marginal = (W100 - W20) / 80")
    hangar = "hangar fixed 20.0 s marginal 1.500 s/trial CPU: fixed 10.0 s marginal 0.750 s/trial"
    assert lines[1].split() == hangar.split()
    assert "inspect fixed 5.0 s marginal 0.500 s/trial" in " ".join(lines[2].split())
    assert lines[3] == "marginal wall per trial, hangar / inspect: 3.0x (CPU: 3.0x)"
    assert lines[4] == "N = 20: wall hangar 50.0 s, inspect 15.0 s: 3.3x"
    assert lines[-1].endswith("at most 2x Inspect's: NOT met")
    assert report(_runs(hangar=(20.0, 1.0), inspect=(5.0, 0.5)))[-1].endswith(": holds")
    rounds = _runs((20.0, 1.5), (5.0, 0.5)) * 2
    assert report(rounds)[0].endswith("least squares over 4 runs per tool")


def test_the_inspect_task_reads_the_config_keys_the_benchmark_writes() -> None:
    # The task file runs in Inspect's virtualenv only; this reads it as text.
    source = Path(INSPECT_TASK).read_text()
    tree = ast.parse(source)
    keys = {
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
    }
    assert {"samples", "agent", "python", "base", "hidden"} <= keys
    assert 'sandbox="local"' in source
