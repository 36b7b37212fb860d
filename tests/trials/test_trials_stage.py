"""The trials stage body without Dagster: the example's stand-in agent on the median task."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.drain import request_drain
from hangar_dagster.queue.partitions import NOT_IN_VARIANT
from hangar_dagster.queue.restarts import StartedMarker
from hangar_dagster.queue.slots import experiment_slots, next_run_due
from hangar_dagster.queue.window import EvalWindow, parse_window
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.trials import stage as trials_stage
from hangar_dagster.trials.stage import TrialPartition, run_trials
from tests import factories as f
from tests.conftest import write_spec

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

PLAIN = TrialKey("plain", "median", 1)
SKILL = TrialKey("skill", "median", 1)
ALWAYS = parse_window("always")


class Said:
    """A log that keeps what the stage said."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, msg: str) -> None:
        self.lines.append(("info", msg))

    def warning(self, msg: str) -> None:
        self.lines.append(("warning", msg))


def never_in_flight(marker: StartedMarker) -> bool:
    return False


def median_only(example_dir: Path, name: str, **more: Any) -> ResolvedExperiment:
    """The example on its median task, one trial per variant (two trial keys); ``more`` over
    the spec's fields."""
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec.update(name=name, trials=1, tasks=[t for t in spec["tasks"] if t["id"] == "median"])
    spec.update(more)
    return submit(write_spec(example_dir, spec), Settings.from_env())


def stage(
    exp: ResolvedExperiment,
    run_id: str,
    keys: list[TrialKey],
    log: Said,
    window: EvalWindow = ALWAYS,
) -> dict[TrialKey, TrialPartition]:
    return run_trials(
        exp,
        Store(paths()),
        f.settings(window),
        run_id,
        keys,
        in_flight=never_in_flight,
        log=log,
    )


def test_runs_the_pending_keys_then_keeps_them(example_dir: Path, hangar_home: Path) -> None:
    exp = median_only(example_dir, "stage-trials")
    said = Said()
    first = stage(exp, "run-1", [PLAIN, SKILL], said)
    assert set(first) == {PLAIN, SKILL}
    for key, part in first.items():
        assert part.record is not None and not part.reused
        assert (part.record.trial_key, part.record.attempt, part.record.run_id) == (
            key.key,
            1,
            "run-1",
        )
        assert part.record.outcome_class == "completed"
    stored = {t.trial_key for t in Store(paths()).trials(exp.experiment_id)}
    assert stored == {PLAIN.key, SKILL.key}
    # Each was graded in its slot as it finished, by this run, with no grades stage run yet.
    grades = Store(paths()).grades(exp.experiment_id, all_attempts=True)
    assert sorted((g.trial_key, g.attempt, g.run_id) for g in grades) == [
        (PLAIN.key, 1, "run-1"),
        (SKILL.key, 1, "run-1"),
    ]
    for g in grades:
        trial = first[TrialKey.parse(g.trial_key)].record
        assert trial is not None and g.graded_at >= trial.finished_at
    assert {m for level, m in said.lines if level == "info" and "attempt 1: completed" in m} == {
        f"trial {k.key} attempt 1: completed ({first[k].record.duration_s:.1f}s)"  # type: ignore[union-attr]
        for k in (PLAIN, SKILL)
    }

    # A second run over the same keys (a resume) starts nothing and reports what exists.
    again = stage(exp, "run-2", [PLAIN, SKILL], Said())
    assert {k: (p.reused, p.record.run_id if p.record else None) for k, p in again.items()} == {
        PLAIN: (True, "run-1"),
        SKILL: (True, "run-1"),
    }
    assert len(Store(paths()).trials(exp.experiment_id, all_attempts=True)) == 2


def test_nothing_starts_while_the_window_is_closed_and_the_run_says_why(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = median_only(example_dir, "stage-closed")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    closed = parse_window(f"{later:%H:%M}-{later + dt.timedelta(minutes=30):%H:%M}", "UTC")
    said = Said()
    got = stage(exp, "run-c", [PLAIN, SKILL], said, window=closed)
    assert set(got) == {PLAIN, SKILL}
    for key, part in got.items():
        assert part.record is None and part.skipped is None and part.not_started is not None
        # The start check or the run's drain watcher, whichever sees the closed window first.
        assert part.not_started.startswith(("eval_window: ", "power_down: the eval window"))
        assert ("info", f"trial {key.key} not started: {part.not_started}") in said.lines
    assert Store(paths()).trials(exp.experiment_id, all_attempts=True) == []


def test_a_trial_that_would_outlast_the_window_does_not_start_and_says_why(
    example_dir: Path, hangar_home: Path
) -> None:
    # Issue 15: a start at 00:14 with a ten-minute timeout would be drained and paid twice.
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec["environment"]["resources"]["timeout_s"] = 600
    spec.update(name="stage-fit", trials=1, tasks=[t for t in spec["tasks"] if t["id"] == "median"])
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    now = dt.datetime.now(dt.UTC)
    closing = parse_window(
        f"{now - dt.timedelta(hours=1):%H:%M}-{now + dt.timedelta(minutes=3):%H:%M}", "UTC"
    )
    said = Said()
    got = stage(exp, "run-f", [PLAIN, SKILL], said, window=closing)
    for key, part in got.items():
        assert part.record is None and part.not_started is not None, key
        assert part.not_started.startswith("window_fit: needs 600 s (its timeout_s)")
    assert Store(paths()).trials(exp.experiment_id, all_attempts=True) == []


def test_a_key_whose_task_the_variant_does_not_run_is_skipped(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = median_only(example_dir, "stage-narrow")
    plain = exp.variants["plain"].model_copy(update={"tasks": ()})
    exp = exp.model_copy(update={"variants": {**exp.variants, "plain": plain}})
    got = stage(exp, "run-n", [PLAIN], Said())
    assert got == {PLAIN: TrialPartition(PLAIN, skipped=NOT_IN_VARIANT)}
    assert Store(paths()).trials(exp.experiment_id, all_attempts=True) == []


def test_a_run_marks_the_next_slice_due_no_later_than_its_last_key_and_clears_it_at_its_end(
    example_dir: Path, hangar_home: Path
) -> None:
    """The daemon's driver makes the next slice's run beside this one once it is due
    (sensors.overlap_request): with two keys at parallel 1 the pace is unknown until the last
    key, so the mark comes with the last key's slot; it is gone at the run's end."""
    exp = median_only(example_dir, "stage-handed-mark", parallel=1)
    mark = experiment_slots(paths().experiment_dir(exp.experiment_id), 1).next_due("run-m")
    seen: list[float] = []  # when the watcher saw the mark
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if mark.exists():
                seen.append(time.time())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        got = stage(exp, "run-m", [PLAIN, SKILL], Said())
    finally:
        done.set()
        watcher.join()
    records = sorted((p.record for p in got.values() if p.record), key=lambda r: r.started_at)
    assert len(records) == 2
    assert seen, "the run never marked the next slice due"
    # parallel 1: the last key gets the slot only once the first trial (and its grade) let it go.
    assert min(seen) >= records[0].finished_at.timestamp()
    assert not mark.exists()


def test_a_run_drained_while_another_holds_the_slots_never_marks_the_next_slice_due(
    example_dir: Path, hangar_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys that stop waiting for a slot (a drain) are not hand-outs: counting them marked the
    next slice due at once, and the daemon's driver made a run beside one that was stopping."""
    exp = median_only(example_dir, "stage-drained-mark", parallel=1)
    slots = experiment_slots(paths().experiment_dir(exp.experiment_id), 1)
    request_drain(paths(), "run-d")  # asked to drain before it could start anything
    asked: list[tuple[int, int]] = []  # (handed, total) each time the stage asked

    def counted(handed: int, total: int, *args: Any) -> bool:
        asked.append((handed, total))
        return next_run_due(handed, total, *args)

    # The mark is removed at the run's end, so what shows a stopping key counted as handed out
    # is the stage asking whether the next run is due.
    monkeypatch.setattr(trials_stage, "next_run_due", counted)
    with slots.hold(lambda: None):  # another run of the experiment holds the one slot
        got = stage(exp, "run-d", [PLAIN, SKILL], Said())
    assert all(p.record is None and p.not_started for p in got.values())
    assert asked == []


def test_two_runs_of_one_experiment_share_its_parallel_slots(
    example_dir: Path, hangar_home: Path
) -> None:
    """A slice's run overlapping the next one's (driver: "Between slices") keeps ``parallel``:
    with ``parallel: 1`` their trials never run at once, each run on its own keys."""
    exp = median_only(example_dir, "stage-shared-slots", parallel=1)
    got: dict[str, dict[TrialKey, TrialPartition]] = {}

    def run(run_id: str, key: TrialKey) -> None:
        got[run_id] = run_trials(
            exp,
            Store(paths()),
            f.settings(ALWAYS),
            run_id,
            [key],
            in_flight=lambda marker: True,  # the other run is alive: its trial is not cut off
            log=Said(),
        )

    threads = [threading.Thread(target=run, args=a) for a in (("run-a", PLAIN), ("run-b", SKILL))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    records = [p.record for parts in got.values() for p in parts.values()]
    assert len(records) == 2 and all(r is not None for r in records)
    first, second = sorted(records, key=lambda r: r.started_at)  # type: ignore[union-attr]
    assert first is not None and second is not None
    assert {first.run_id, second.run_id} == {"run-a", "run-b"}
    assert second.started_at >= first.finished_at, "both runs' trials ran at once"
