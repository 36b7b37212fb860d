"""The drain schedule, evaluated at chosen instants with Dagster's own schedule context."""

from __future__ import annotations

import datetime
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

# The iterator the scheduler daemon uses to pick a cron schedule's ticks (private API):
# testing against it catches a Dagster upgrade that changes its DST handling.
from dagster._utils.schedules import cron_string_iterator

from hangar_dagster.schedules import DRAIN_NAME, build_drain_schedule
from hangar_dagster.window import EvalWindow, parse_window, window_from_env

NY = ZoneInfo("America/New_York")
UTC = datetime.UTC
SECOND = datetime.timedelta(seconds=1)


def ny(y: int, mo: int, d: int, h: int, mi: int = 0) -> datetime.datetime:
    return datetime.datetime(y, mo, d, h, mi, tzinfo=NY)


@dg.asset(partitions_def=dg.StaticPartitionsDefinition(["fix-a.r1", "fix-a.r2"]))
def trials() -> None: ...


TRIALS_JOB = dg.define_asset_job("exp1__trials", selection=[trials])


class Recorder:
    """A real on_close that remembers each tick Dagster handed it."""

    def __init__(self) -> None:
        self.closed: list[datetime.datetime] = []

    def on_close(self, context: dg.ScheduleEvaluationContext) -> None:
        self.closed.append(context.scheduled_execution_time)


def drain_of(window: EvalWindow, recorder: Recorder) -> dg.ScheduleDefinition:
    [drain] = build_drain_schedule(window, recorder.on_close)
    return drain


def tick(drain: dg.ScheduleDefinition, at: datetime.datetime) -> str:
    repo = dg.Definitions(
        assets=[trials], jobs=[TRIALS_JOB], schedules=[drain]
    ).get_repository_def()
    context = dg.build_schedule_context(scheduled_execution_time=at, repository_def=repo)
    data = drain.evaluate_tick(context)
    assert data.run_requests == []  # the drain never launches a run
    assert data.skip_message is not None
    return data.skip_message


def fires(drain: dg.ScheduleDefinition, after: datetime.datetime) -> datetime.datetime:
    """The first tick the scheduler daemon takes at or after ``after``, in UTC.

    In UTC because a fold=1 local time never equals an instant in another zone (PEP 495).
    """
    assert isinstance(drain.cron_schedule, str)
    ticks = cron_string_iterator(after.timestamp(), drain.cron_schedule, drain.execution_timezone)
    return next(ticks).astimezone(UTC)


@pytest.mark.parametrize(
    ("opens", "closes"),
    [
        pytest.param(ny(2026, 1, 15, 20), ny(2026, 1, 16, 0, 15), id="winter"),
        pytest.param(ny(2026, 7, 15, 20), ny(2026, 7, 16, 0, 15), id="summer"),
    ],
)
def test_drain_fires_at_quarter_past_midnight_new_york(
    opens: datetime.datetime, closes: datetime.datetime
) -> None:
    window, recorder = window_from_env({}), Recorder()
    drain = drain_of(window, recorder)
    assert drain.execution_timezone == "America/New_York"
    assert window.is_open(opens) and window.closes_at(opens) == closes
    assert fires(drain, opens) == closes
    message = tick(drain, closes)
    assert message.startswith("drained at the end of the eval window 20:00-00:15 America/New_York")
    assert f"({closes:%Y-%m-%d %H:%M %Z})" in message
    assert recorder.closed == [closes]
    # From the drain on, trials wait for the next evening.
    assert not window.is_open(closes)
    assert window.next_open(closes) == opens + datetime.timedelta(days=1)


def test_drain_at_two_in_the_afternoon_is_not_due() -> None:
    window, recorder = window_from_env({}), Recorder()
    afternoon = ny(2026, 1, 15, 14)
    assert fires(drain_of(window, recorder), afternoon) == ny(2026, 1, 16, 0, 15)
    assert not window.is_open(afternoon) and window.next_open(afternoon) == ny(2026, 1, 15, 20)
    assert recorder.closed == []


@pytest.mark.parametrize(
    ("spec", "night_start", "opens", "closes"),
    [
        # 2027-03-14: 02:00 EST jumps to 03:00 EDT.
        pytest.param(
            "01:30-02:30", ny(2027, 3, 14, 0), ny(2027, 3, 14, 1, 30), ny(2027, 3, 14, 3),
            id="spring-end-in-gap",
        ),
        pytest.param(
            "02:30-04:00", ny(2027, 3, 14, 0), ny(2027, 3, 14, 3), ny(2027, 3, 14, 4),
            id="spring-start-in-gap",
        ),
        pytest.param(
            "23:00-02:30", ny(2027, 3, 13, 12), ny(2027, 3, 13, 23), ny(2027, 3, 14, 3),
            id="spring-crossing-two",
        ),
        # 2026-11-01: 02:00 EDT falls back to 01:00 EST; the later 01:30 (06:30 UTC) counts.
        pytest.param(
            "23:00-01:30", ny(2026, 10, 31, 12), ny(2026, 10, 31, 23),
            datetime.datetime(2026, 11, 1, 6, 30, tzinfo=UTC), id="fall-end-ambiguous",
        ),
        pytest.param(
            "01:30-02:30", ny(2026, 11, 1, 0), datetime.datetime(2026, 11, 1, 6, 30, tzinfo=UTC),
            ny(2026, 11, 1, 2, 30), id="fall-start-ambiguous",
        ),
        pytest.param(
            "23:00-03:00", ny(2026, 10, 31, 12), ny(2026, 10, 31, 23), ny(2026, 11, 1, 3),
            id="fall-crossing-two",
        ),
    ],
)  # fmt: skip
def test_window_and_dagster_cron_agree_on_dst_nights(
    spec: str,
    night_start: datetime.datetime,
    opens: datetime.datetime,
    closes: datetime.datetime,
) -> None:
    window, recorder = parse_window(spec), Recorder()
    assert window.start is not None
    # Arithmetic in UTC: ``local - SECOND`` is wall-clock arithmetic and can land in the gap.
    opens, closes = opens.astimezone(UTC), closes.astimezone(UTC)
    drain = drain_of(window, recorder)
    # A cron at the window's start would fire when the window opens ...
    at_start = dg.ScheduleDefinition(
        name="at_start",
        cron_schedule=f"{window.start.minute} {window.start.hour} * * *",
        execution_timezone=window.tz.key,
        target=dg.AssetSelection.assets(),
    )
    assert fires(at_start, night_start) == opens == window.next_open(night_start)
    # ... and the drain fires when it closes.
    assert fires(drain, opens) == closes == window.closes_at(opens)
    assert not window.is_open(opens - SECOND) and window.is_open(opens)
    assert window.is_open(closes - SECOND) and not window.is_open(closes)
    assert tick(drain, closes).startswith("drained")
    assert recorder.closed == [closes]


def test_always_has_no_drain() -> None:
    recorder = Recorder()
    window = window_from_env({"HANGAR_EVAL_WINDOW": "always"})
    assert build_drain_schedule(window, recorder.on_close) == []


def test_drain_loads_beside_the_stage_jobs_and_starts_running() -> None:
    drain = drain_of(window_from_env({"HANGAR_EVAL_TZ": "Europe/Paris"}), Recorder())
    assert drain.name == DRAIN_NAME
    assert drain.default_status == dg.DefaultScheduleStatus.RUNNING
    assert (drain.cron_schedule, drain.execution_timezone) == ("15 0 * * *", "Europe/Paris")
    defs = dg.Definitions(assets=[trials], jobs=[TRIALS_JOB], schedules=[drain])
    dg.Definitions.validate_loadable(defs)
    # Its target is empty: it is tied to no experiment's job.
    assert not defs.get_repository_def().get_job(drain.job_name).asset_layer.executable_asset_keys
