"""The index stage's summary without Dagster: pass rates per variant and why trials wait."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.window import parse_window
from hangar_dagster.results.report import build_report
from hangar_dagster.results.store import Store
from hangar_dagster.results.summary import (
    headline,
    intervals,
    read_terminal,
    summarize,
    write_terminal,
)
from hangar_dagster.settings import Settings, paths
from tests import factories as f

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)


def test_a_fresh_experiment_has_everything_pending_and_nothing_waiting(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    got = summarize(exp, Store(paths()), f.settings(parse_window("always")), NOW)
    assert (got.variants, got.trial_keys, got.pending_trials) == ([], 0, 18)
    assert (got.waiting_for, got.queue_notes, got.graded, got.passed) == (None, [], 0, 0)
    assert got.invalid_tasks == [] and got.duckdb == paths().duckdb


def test_summary_counts_stored_trials_and_grades_and_names_invalid_tasks(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    store = Store(paths())
    eid = exp.experiment_id
    for variant, passed in (("plain", False), ("skill", True)):
        store.put(
            f.trial(variant, "median", experiment_id=eid, pin_set=exp.variants[variant].pin_set)
        )
        store.put(f.grade(variant, "median", passed=passed, experiment_id=eid))
    store.put(f.base_check("durations", experiment_id=eid, invalid=True, reason="passes on base"))
    got = summarize(exp, store, f.settings(parse_window("always")), NOW)
    assert [(v["variant"], v["trials"], v["graded"], v["passed"]) for v in got.variants] == [
        ("plain", 1, 1, 0),
        ("skill", 1, 1, 1),
    ]
    # 18 planned, 2 stored, and the invalid task's 6 never start (queue/starts.py).
    assert (got.trial_keys, got.pending_trials, got.graded, got.passed) == (2, 10, 2, 1)
    assert got.invalid_tasks == ["durations"]


def test_pending_trials_say_they_wait_for_the_window(example_dir: Path, hangar_home: Path) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    closed = parse_window("22:00-23:00", "UTC")
    got = summarize(exp, Store(paths()), f.settings(closed), NOW)
    assert got.waiting_for is not None and got.waiting_for.startswith("eval_window: ")


def test_an_ungraded_trial_keeps_the_experiment_incomplete_and_says_so(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    store = Store(paths())
    eid = exp.experiment_id
    first, *rest = exp.trial_keys()
    store.put(f.attempt_of(eid, first.key, 1))  # its grade was lost in a crash
    for key in rest:
        store.put(f.attempt_of(eid, key.key, 1))
        store.put(f.grade(key.variant, key.task, key.replicate, experiment_id=eid))
    got = summarize(exp, store, f.settings(parse_window("22:00-23:00", "UTC")), NOW)
    assert (got.pending_trials, got.waiting_grades, got.complete) == (0, 1, False)
    assert got.waiting_for == "1 trial waits for a grade; the pass rate is not final"
    store.put(f.grade(first.variant, first.task, first.replicate, experiment_id=eid))
    done = summarize(exp, store, f.settings(parse_window("always")), NOW)
    assert (done.waiting_grades, done.complete, done.waiting_for) == (0, True, None)


def test_the_terminal_file_is_what_the_report_says_and_read_only_by_its_own_run(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    store = Store(paths())
    eid = exp.experiment_id
    first, *rest = exp.trial_keys()
    store.put(f.attempt_of(eid, first.key, 1))  # ungraded: the experiment is not complete
    for key in rest:
        store.put(f.attempt_of(eid, key.key, 1))
        store.put(f.grade(key.variant, key.task, key.replicate, experiment_id=eid))
    report = build_report(exp, store)
    summary = summarize(exp, store, f.settings(parse_window("always")), NOW)
    write_terminal(tmp_path, "run-a", report, summary)
    said = read_terminal(tmp_path, "run-a")
    assert said is not None
    assert said.headline == headline(report) and said.intervals == intervals(report)
    assert said.intervals and said.headline  # the example's variants have rates
    assert (
        said.unfinished
        == summary.unfinished
        == ["1 trial waits for a grade; the pass rate is not final"]
    )
    # another run's file (an index run before this command's) is not read as this one's
    assert read_terminal(tmp_path, "run-b") is None
    assert read_terminal(tmp_path / "nowhere", "run-a") is None
