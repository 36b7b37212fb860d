"""The real daemon on a short eval window: the window's opening schedule starts a waiting
experiment's trials, the running trial is drained at the window's end and retried (with
retry_of) in the next window. The trial starts because earlier measurements say it fits in the
window (queue/starts.py ``window_fit``); it then runs longer than they did.

Sized for a loaded machine (load average 10 on 2 cores): nothing waits a guessed number of
seconds. The setup stages run under a window that opens hours later, until they are seen to
succeed; the UI is then restarted on a window whose opening leaves twice the UI's measured
start-up time, and which lasts long enough for the trial to start in it."""

from __future__ import annotations

import datetime as dt
import math
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from hangar_dagster.orchestration.stages import SETUP_STAGES, TAG_EXPERIMENT, TAG_STAGE
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths
from tests import factories as f
from tests.conftest import (
    SLEEP_THEN_FIX,
    attempts,
    command_agent_spec,
    hangar,
    start_ui,
    stop_ui,
    write_spec,
)

pytestmark = pytest.mark.slow

# The window under test lasts three times the UI's measured start-up, at least two minutes: its
# trials run is queued, its worker starts and the trial is running before the drain at its end.
# Measured, not fixed, so a quiet machine does not wait out a window sized for a loaded one.
MIN_WINDOW_MINUTES = 2


def window_minutes(startup_s: float) -> int:
    return max(MIN_WINDOW_MINUTES, math.ceil(3 * startup_s / 60))


# Setup stages and the trial's start may take this long on a loaded machine.
SLOW_S = 900


def window_opening_after(seconds: float, minutes: int) -> tuple[str, dt.datetime]:
    """A window (New York time) opening at the first whole minute ``seconds`` from now."""
    at = dt.datetime.now(ZoneInfo("America/New_York")) + dt.timedelta(seconds=seconds, minutes=1)
    start = at.replace(second=0, microsecond=0)
    end = start + dt.timedelta(minutes=minutes)
    return f"{start:%H:%M}-{end:%H:%M}", start


def setup_done(home: Path, experiment_id: str) -> bool:
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        records = instance.get_run_records(
            dg.RunsFilter(
                tags={TAG_EXPERIMENT: experiment_id}, statuses=[dg.DagsterRunStatus.SUCCESS]
            )
        )
    return {r.dagster_run.tags.get(TAG_STAGE) for r in records} >= set(SETUP_STAGES)


def wait_for(
    home: Path, experiment_id: str, done: object, seconds: float, log: Path
) -> list[tuple[int, str, str | None, str, str | None]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = attempts(home, experiment_id)
        if done(rows):  # type: ignore[operator]
            return rows
        time.sleep(2)
    raise AssertionError(
        f"timed out; attempts: {attempts(home, experiment_id)}\n{log.read_text()[-4000:]}"
    )


def test_opened_by_the_schedule_drained_at_window_end_then_retried_next_window(
    example_dir: Path, tmp_path: Path
) -> None:
    spec = command_agent_spec(
        example_dir,
        tmp_path,
        "drain-me",
        "sh $HANGAR_HARNESS_DIR/agent.sh",
        {"agent.sh": SLEEP_THEN_FIX},
    )
    spec.update(parallel=1)
    spec["environment"]["resources"]["timeout_s"] = 900
    spec_path = write_spec(example_dir, spec)
    home, log = tmp_path / "home", tmp_path / "ui.log"

    # Submitted before the window opens; the daemon runs its setup stages meanwhile, under a
    # window hours away (nothing may start a trial yet), until they are seen to have succeeded.
    submitted = hangar("experiment", "run", str(spec_path), home=home)
    assert submitted.returncode == 0, submitted.stderr
    experiment_id = submitted.stdout.split("submitted ")[1].split()[0]
    far, _ = window_opening_after(seconds=6 * 3600, minutes=MIN_WINDOW_MINUTES)
    started = time.monotonic()
    ui = start_ui(home, log, env={"HANGAR_EVAL_WINDOW": far}, seconds=SLOW_S)
    startup_s = time.monotonic() - started  # this machine, now
    try:
        deadline = time.monotonic() + SLOW_S
        while not setup_done(home, experiment_id):
            assert ui.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
        assert attempts(home) == []
    finally:
        stop_ui(ui)

    # Measured before: three attempts of this pin set on the task took 5 s each, so the trial
    # is expected to finish well inside the window (queue/starts.py ``window_fit``: its 900 s
    # timeout alone would keep it from starting). It sleeps past the window's end instead, as a
    # trial that runs longer than measured does, and the drain at the end cuts it.
    store = Store(HangarPaths(home))
    (pins,) = store.pins(experiment_id).values()
    for rep in (1, 2, 3):
        key = f"drain-me/median/{rep}"
        store.put(f.attempt_of("measured-before", key, 1, pin_set=pins.pin_set, duration_s=5.0))

    # The window opens once the UI is surely up again: twice its measured start-up, and more.
    minutes = window_minutes(startup_s)
    window, opens = window_opening_after(seconds=2 * startup_s + 20, minutes=minutes)
    ui = start_ui(home, log, env={"HANGAR_EVAL_WINDOW": window}, seconds=SLOW_S)
    try:
        rows = wait_for(home, experiment_id, lambda r: len(r) == 1, minutes * 60 + SLOW_S, log)
        assert rows[0][:3] == (1, "infra_error", "power_down")
        with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
            run = instance.get_run_by_id(rows[0][3])
        assert run is not None and run.tags["hangar/stage"] == "trials"
        assert run.tags.get("dagster/schedule_name") == f"{experiment_id}__eval_window_open"
        assert "dagster/sensor_name" not in run.tags  # not the driver's catch-up
        assert run.tags["dagster/run_key"] == f"{experiment_id}:trials:window-{opens:%Y-%m-%d}"
        waiting = hangar(
            "experiment", "get", "drain-me", home=home, env={"HANGAR_EVAL_WINDOW": window}
        )
        assert "eval_window" in waiting.stdout, waiting.stdout
    finally:
        stop_ui(ui)

    ui = start_ui(home, log, env={"HANGAR_EVAL_WINDOW": "always"}, seconds=SLOW_S)  # next window
    try:
        rows = wait_for(home, experiment_id, lambda r: len(r) == 2, SLOW_S, log)
    finally:
        stop_ui(ui)
    first, second = rows
    assert second[:3] == (2, "completed", None)
    assert second[4] == first[3], "the retry names the drained attempt's run"
