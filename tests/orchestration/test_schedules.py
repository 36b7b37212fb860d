"""The eval window's schedules (each experiment's opening, the drain), evaluated at chosen
instants with Dagster's own schedule context."""

from __future__ import annotations

import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pytest
from dagster._core.definitions.schedule_definition import ScheduleExecutionData

# The iterator the scheduler daemon uses to pick a cron schedule's ticks (private API):
# testing against it catches a Dagster upgrade that changes its DST handling.
from dagster._utils.schedules import cron_string_iterator

from hangar_dagster.experiment.catalog import DAEMON_MARKER
from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.submit import submit
from hangar_dagster.orchestration.assets import build_experiment_assets
from hangar_dagster.orchestration.definitions import build_definitions
from hangar_dagster.orchestration.jobs import build_experiment_jobs
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.schedules import (
    DRAIN_NAME,
    LATE_TICK,
    NIGHTLY_NAME,
    build_drain_schedule,
    build_open_schedule,
)
from hangar_dagster.orchestration.stages import SETUP_STAGES, stage_tags
from hangar_dagster.queue.window import EvalWindow, parse_window
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests import factories as f
from tests.orchestration.test_sensors import stage_run

pytestmark = pytest.mark.unit

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
    window, recorder = Settings.from_env({}).window, Recorder()
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
    window, recorder = Settings.from_env({}).window, Recorder()
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
    window = Settings.from_env({"HANGAR_EVAL_WINDOW": "always"}).window
    assert build_drain_schedule(window, recorder.on_close) == []


def test_drain_loads_beside_the_stage_jobs_and_starts_running() -> None:
    drain = drain_of(Settings.from_env({"HANGAR_EVAL_TZ": "Europe/Paris"}).window, Recorder())
    assert drain.name == DRAIN_NAME
    assert drain.default_status == dg.DefaultScheduleStatus.RUNNING
    assert (drain.cron_schedule, drain.execution_timezone) == ("15 0 * * *", "Europe/Paris")
    defs = dg.Definitions(assets=[trials], jobs=[TRIALS_JOB], schedules=[drain])
    dg.Definitions.validate_loadable(defs)
    # Its target is empty: it is tied to no experiment's job.
    assert not defs.get_repository_def().get_job(drain.job_name).asset_layer.executable_asset_keys


# The opening schedule: one per experiment, on its trials job.


@pytest.fixture
def waiting(example_dir: Path, hangar_home: Path) -> ResolvedExperiment:
    """The example, submitted for the daemon (`hangar experiment run` without --wait)."""
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    (paths().experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    return exp


class Opening:
    """An experiment's opening schedule in a repository like the one Dagster loads.

    Each tick is evaluated ``late`` after its scheduled time (the schedule's clock).
    """

    def __init__(self, exp: ResolvedExperiment, window: EvalWindow) -> None:
        self.now = datetime.datetime.now(UTC)
        group = build_experiment_assets(exp)
        jobs = build_experiment_jobs(exp, group)
        [self.schedule] = build_open_schedule(exp, jobs, window, clock=lambda: self.now)
        # The schedule's tick reads the window from the resource, as built from the same settings.
        self.resources = {"hangar": HangarResource.from_settings(f.settings(window))}
        self.repo = dg.Definitions(
            assets=group, jobs=jobs, schedules=[self.schedule], resources=self.resources
        ).get_repository_def()

    def tick(
        self,
        instance: dg.DagsterInstance,
        at: datetime.datetime,
        late: datetime.timedelta = SECOND,
    ) -> ScheduleExecutionData:
        self.now = at.astimezone(UTC) + late
        # Closed after the tick: the context holds the resources it built until then.
        with dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=at,
            repository_def=self.repo,
            resources=self.resources,
        ) as context:
            return self.schedule.evaluate_tick(context)


def setup_done(instance: dg.DagsterInstance, exp: ResolvedExperiment) -> None:
    for stage in SETUP_STAGES:
        stage_run(instance, exp, stage)


def started(data: ScheduleExecutionData, exp: ResolvedExperiment, night: str) -> dg.RunRequest:
    assert data.skip_message is None and data.run_requests is not None
    [request] = data.run_requests
    assert request.run_key == f"{exp.experiment_id}:trials:window-{night}"
    assert request.tags["dagster/schedule_name"] == f"{exp.experiment_id}__eval_window_open"
    assert stage_tags(exp, "trials").items() <= request.tags.items()  # eval queue, all partitions
    return request


@pytest.mark.parametrize(
    ("opens", "utc_hour"),
    [pytest.param(ny(2027, 1, 15, 20), 1, id="winter"), pytest.param(ny(2027, 7, 15, 20), 0, id="summer")],
)  # fmt: skip
@pytest.mark.integration
def test_opening_starts_the_waiting_trials_at_eight_new_york(
    waiting: ResolvedExperiment, opens: datetime.datetime, utc_hour: int
) -> None:
    opening = Opening(waiting, Settings.from_env({}).window)
    assert (opening.schedule.cron_schedule, opening.schedule.execution_timezone) == (
        "0 20 * * *",
        "America/New_York",
    )
    assert opening.schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert opening.schedule.job_name == f"{waiting.experiment_id}__trials_job"
    assert fires(opening.schedule, opens.replace(hour=14)) == opens
    assert opens.astimezone(UTC).hour == utc_hour
    with dg.instance_for_test() as instance:
        setup_done(instance, waiting)
        started(opening.tick(instance, opens), waiting, f"{opens:%Y-%m-%d}")


@pytest.mark.integration
def test_opening_at_two_in_the_afternoon_skips_with_eval_window(
    waiting: ResolvedExperiment,
) -> None:
    opening = Opening(waiting, Settings.from_env({}).window)
    with dg.instance_for_test() as instance:
        setup_done(instance, waiting)
        data = opening.tick(instance, ny(2027, 1, 15, 14))
    assert data.run_requests == []
    assert data.skip_message == (
        f"{waiting.experiment_id}: eval_window: trials start inside 20:00-00:15 "
        "America/New_York; next opens 2027-01-15 20:00 EST"
    )


@pytest.mark.integration
def test_opening_after_the_spring_forward_night(waiting: ResolvedExperiment) -> None:
    nightly, gap = Settings.from_env({}).window, parse_window("02:30-04:00")
    # 2027-03-14, 02:00 EST -> 03:00 EDT: eight o'clock moves from 01:00 to 00:00 UTC ...
    at_eight = Opening(waiting, nightly)
    before = fires(at_eight.schedule, ny(2027, 3, 13, 12))
    after = fires(at_eight.schedule, before + SECOND)
    assert (before, after) == (
        datetime.datetime(2027, 3, 14, 1, tzinfo=UTC),
        datetime.datetime(2027, 3, 15, 0, tzinfo=UTC),
    )
    # ... and a window opening at 02:30, which does not exist that night, opens at 03:00 EDT.
    in_gap = Opening(waiting, gap)
    three = fires(in_gap.schedule, ny(2027, 3, 14, 0))
    assert three == ny(2027, 3, 14, 3) == gap.next_open(ny(2027, 3, 14, 0))
    with dg.instance_for_test() as instance:
        setup_done(instance, waiting)
        started(at_eight.tick(instance, after), waiting, "2027-03-14")
        started(in_gap.tick(instance, three), waiting, "2027-03-14")


@pytest.mark.integration
def test_opening_skips_and_says_why(waiting: ResolvedExperiment, example_dir: Path) -> None:
    opens = ny(2027, 1, 15, 20)
    opening = Opening(waiting, Settings.from_env({}).window)
    eid = waiting.experiment_id
    with dg.instance_for_test() as instance:
        assert opening.tick(instance, opens).skip_message == (
            f"{eid}: setup stage pin_sets has not run; trials start once the setup stages succeed"
        )
        stage_run(instance, waiting, "pin_sets", dg.DagsterRunStatus.FAILURE)
        assert "setup stage pin_sets ended FAILURE" in str(
            opening.tick(instance, opens).skip_message
        )
        setup_done(instance, waiting)
        # Daemon down at eight: a tick evaluated late leaves the start to the driver sensor.
        late = opening.tick(instance, opens, late=LATE_TICK + SECOND)
        assert late.run_requests == []
        assert "evaluated 61s late" in str(late.skip_message)
        assert "experiment_driver sensor starts the trials" in str(late.skip_message)
        assert opening.tick(instance, opens, late=LATE_TICK).run_requests != []
        run_id = stage_run(instance, waiting, "index", dg.DagsterRunStatus.STARTED)
        assert opening.tick(instance, opens).skip_message == (
            f"{eid}: its index run {run_id} is in flight; "
            "the experiment_driver sensor goes on once it ends"
        )
        instance.delete_run(run_id)
        store = Store(paths())
        for key in waiting.trial_keys():
            v, t, r = key.key.split("/")
            store.put(f.trial(v, t, int(r), experiment_id=eid))
            store.put(f.grade(v, t, int(r), experiment_id=eid))  # graded: nothing left to do
        assert opening.tick(instance, opens).skip_message == f"{eid}: no trial is pending"

    waited = submit(
        example_dir / "experiment.yaml", Settings.from_env()
    )  # `run --wait`: no daemon marker
    with dg.instance_for_test() as instance:
        setup_done(instance, waited)
        skipped = Opening(waited, Settings.from_env({}).window).tick(instance, opens).skip_message
    assert skipped == (
        f"{waited.experiment_id}: not driven by the daemon "
        "(submitted with --wait; that process starts its trials)"
    )


def test_definitions_hold_one_opening_per_experiment_and_one_drain(
    waiting: ResolvedExperiment, example_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = submit(example_dir / "experiment.yaml", Settings.from_env())
    monkeypatch.setenv("HANGAR_EVAL_WINDOW", "20:00-00:15")
    defs = build_definitions(Settings.from_env())
    dg.Definitions.validate_loadable(defs)
    names = {s.name: s for s in defs.get_repository_def().schedule_defs}
    assert set(names) == {
        DRAIN_NAME,
        NIGHTLY_NAME,
        f"{waiting.experiment_id}__eval_window_open",
        f"{other.experiment_id}__eval_window_open",
    }
    assert names[f"{other.experiment_id}__eval_window_open"].job_name == (
        f"{other.experiment_id}__trials_job"
    )
    monkeypatch.setenv("HANGAR_EVAL_WINDOW", "always")
    # always open: no window to open or drain; the nightly schedule stays
    always = build_definitions(Settings.from_env()).get_repository_def().schedule_defs
    assert [s.name for s in always] == [NIGHTLY_NAME]
