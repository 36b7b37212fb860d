"""The driver sensor's decisions at chosen instants, against a real (test) Dagster instance."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from hangar_dagster.experiment.catalog import DAEMON_MARKER
from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.experiment.submit import RESOLVED, submit
from hangar_dagster.orchestration.sensors import decide
from hangar_dagster.orchestration.stages import (
    TAG_INDEX,
    TAG_TRIALS_OF,
    grid,
    job_tags,
    run_span,
    stage_tags,
)
from hangar_dagster.queue.liveness import TAG_CREATOR, creator_tag
from hangar_dagster.queue.slots import experiment_slots
from hangar_dagster.queue.stage_runs import STAGE_RUN_RETRIES
from hangar_dagster.queue.starts import OPEN_GRACE
from hangar_dagster.queue.window import parse_window
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests import factories as f
from tests.conftest import killed_worker, recorded_worker, ui_lock_holder
from tests.reusefixtures import finished_first, spec_file

pytestmark = pytest.mark.integration

NY = ZoneInfo("America/New_York")
NIGHTLY = parse_window("20:00-00:15")
RUNNING = dg.DagsterRunStatus.STARTED


def stage_run(
    instance: dg.DagsterInstance,
    exp: ResolvedExperiment,
    stage: str,
    status: dg.DagsterRunStatus = dg.DagsterRunStatus.SUCCESS,
    tags: dict[str, str] | None = None,
) -> str:
    """A run of ``exp``'s ``stage`` job in ``status``, created now; returns its run id.

    Its tags are its job's with ``tags`` over them, as Dagster stores a launched run's.
    """
    run_id = str(uuid.uuid4())
    instance.add_run(
        dg.DagsterRun(
            job_name=f"{exp.experiment_id}__{stage}_job",
            run_id=run_id,
            status=status,
            tags=job_tags(exp, stage) | (tags or {}),
        )
    )
    return run_id


@pytest.fixture
def queued(example_dir: Path, hangar_home: Path) -> ResolvedExperiment:
    """The example, submitted for the daemon, its setup stages done."""
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    (paths().experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    return exp


def setup_done(instance: dg.DagsterInstance, exp: ResolvedExperiment) -> None:
    for stage in ("pin_sets", "base_checks"):
        stage_run(instance, exp, stage)


def store_all_but_one_drained(exp: ResolvedExperiment) -> None:
    store = Store(paths())
    for key in exp.trial_keys():
        v, t, r = key.key.split("/")
        drained = key.key == "plain/median/1"
        store.put(
            f.trial(
                v,
                t,
                int(r),
                experiment_id=exp.experiment_id,
                outcome_class="infra_error" if drained else "completed",
                infra_reason="power_down" if drained else None,
            )
        )
        if not drained:  # the trials run grades what it ran
            store.put(f.grade(v, t, int(r), experiment_id=exp.experiment_id))


def test_trials_wait_for_the_window_then_start_and_retry(queued: ResolvedExperiment) -> None:
    # Instants after the submission (now): the experiment waits for the window.
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        afternoon = decide(instance, f.settings(NIGHTLY), dt.datetime(2027, 7, 1, 14, 0, tzinfo=NY))
        assert afternoon.requests == []
        assert len(afternoon.waiting) == 1 and "eval_window:" in afternoon.waiting[0]

        # Past the opening schedule's grace (it did not start them: the daemon was down).
        evening = decide(instance, f.settings(NIGHTLY), dt.datetime(2027, 7, 1, 20, 2, tzinfo=NY))
        assert [r.run_key for r in evening.requests] == [f"{queued.experiment_id}:trials:1"]
        assert evening.requests[0].tags["hangar/queue"] == "eval"

        # After the trials run (it covered every key: it wrote the index), every key done but
        # one drained: nothing runs while the window is closed, then a retry run.
        store_all_but_one_drained(queued)
        stage_run(instance, queued, "trials")
        late = decide(instance, f.settings(NIGHTLY), dt.datetime(2027, 7, 2, 0, 20, tzinfo=NY))
        assert late.requests == []
        assert "eval_window" in late.waiting[0]
        next_night = decide(
            instance, f.settings(NIGHTLY), dt.datetime(2027, 7, 2, 20, 5, tzinfo=NY)
        )
        assert [r.run_key for r in next_night.requests] == [f"{queued.experiment_id}:trials:2"]


def test_only_the_last_slice_of_the_trials_writes_the_index_and_the_index_runs_alone_after_another(
    queued: ResolvedExperiment,
) -> None:
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    eid = queued.experiment_id
    index = dg.AssetKey([eid, "index"])
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        # 18 keys, slices of at most 8 partitions (rows of 2 variants): not the last slice.
        [first] = decide(instance, f.settings(NIGHTLY, HANGAR_RUN_PARTITIONS="8"), at).requests
        assert first.tags[TAG_INDEX] == "false"
        assert first.asset_selection is not None and index not in first.asset_selection
        assert {k.path[-1] for k in first.asset_selection} == {"trials", "grades"}
        # Every key fits one slice: the run is the whole trials job, the index with it.
        [whole] = decide(instance, f.settings(NIGHTLY), at).requests
        assert whole.tags[TAG_INDEX] == "true" and whole.asset_selection is None

        # An earlier slice's run ended and the rest is held back (the window closed): the
        # index runs alone. After the last slice's run nothing is left to run.
        store_all_but_one_drained(queued)
        stage_run(instance, queued, "trials", tags={TAG_INDEX: "false"})
        closed = dt.datetime(2027, 7, 2, 0, 20, tzinfo=NY)
        assert [r.run_key for r in decide(instance, f.settings(NIGHTLY), closed).requests] == [
            f"{eid}:index:1"
        ]
        stage_run(instance, queued, "trials", tags={TAG_INDEX: "true"})
        assert decide(instance, f.settings(NIGHTLY), closed).requests == []


def test_a_trial_left_ungraded_gets_a_trials_run_even_while_the_window_is_closed(
    queued: ResolvedExperiment,
) -> None:
    # The run worker died between a trial and its grade: only a trials run (its grades asset)
    # grades it, and grading starts no trial, so the closed window does not hold it back.
    store = Store(paths())
    for key in queued.trial_keys():
        store.put(f.attempt_of(queued.experiment_id, key.key, 1))
        if key.key != "plain/median/1":
            store.put(
                f.grade(key.variant, key.task, key.replicate, experiment_id=queued.experiment_id)
            )
    afternoon = dt.datetime(2027, 7, 1, 14, 0, tzinfo=NY)
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        stage_run(instance, queued, "trials")
        stage_run(instance, queued, "index")
        got = decide(instance, f.settings(NIGHTLY), afternoon)
        assert [r.run_key for r in got.requests] == [f"{queued.experiment_id}:trials:2"]
        store.put(f.grade("plain", "median", 1, experiment_id=queued.experiment_id))
        stage_run(instance, queued, "trials")
        stage_run(instance, queued, "index")
        assert decide(instance, f.settings(NIGHTLY), afternoon).requests == []


@pytest.mark.parametrize(
    "opens", [dt.datetime(2027, 1, 15, 20, tzinfo=NY), dt.datetime(2027, 7, 15, 20, tzinfo=NY)]
)
def test_at_the_opening_a_waiting_experiment_is_left_to_the_schedule_for_the_grace(
    queued: ResolvedExperiment, opens: dt.datetime
) -> None:
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        for at in (opens, opens + OPEN_GRACE - dt.timedelta(seconds=1)):
            held = decide(instance, f.settings(NIGHTLY), at)
            assert held.requests == []
            [why] = held.waiting
            assert why.startswith(f"{queued.experiment_id}: eval_window_open: the window opened")
            assert f"schedule {queued.experiment_id}__eval_window_open starts these trials" in why
            assert f"at {opens + OPEN_GRACE:%H:%M:%S %Z} if it has not" in why
        # The schedule did not fire (the daemon was down at the opening): the driver catches up.
        caught_up = decide(instance, f.settings(NIGHTLY), opens + OPEN_GRACE)
        assert [r.run_key for r in caught_up.requests] == [f"{queued.experiment_id}:trials:1"]


def backdate(exp: ResolvedExperiment, days: int) -> ResolvedExperiment:
    """The experiment as if submitted ``days`` earlier (its stored resolved spec says when)."""
    path = paths().experiment_dir(exp.experiment_id) / RESOLVED
    data = json.loads(path.read_text())
    earlier = exp.submitted_at - dt.timedelta(days=days)
    data["submitted_at"] = earlier.isoformat()
    path.write_text(json.dumps(data))
    return exp.model_copy(update={"submitted_at": earlier})


def window_opened_at(at: dt.datetime) -> str:
    """A 30-minute window (UTC) that opened at the start of the minute of ``at``."""
    start = at.astimezone(dt.UTC).replace(second=0, microsecond=0)
    return f"{start:%H:%M}-{start + dt.timedelta(minutes=30):%H:%M}"


def test_the_grace_ends_once_a_trials_run_began_since_the_opening(
    queued: ResolvedExperiment,
) -> None:
    # Runs are created now (the instance's clock), so this window opened this minute.
    exp = backdate(queued, days=1)
    window = parse_window(window_opened_at(dt.datetime.now(dt.UTC)), "UTC")
    with dg.instance_for_test() as instance:
        setup_done(instance, exp)
        now = dt.datetime.now(dt.UTC)
        assert "eval_window_open" in decide(instance, f.settings(window), now).waiting[0]
        # The schedule started a run; one key was drained: its retry need not wait for the grace.
        store_all_but_one_drained(exp)
        stage_run(instance, exp, "trials")
        retry = decide(instance, f.settings(window), dt.datetime.now(dt.UTC))
        assert [r.run_key for r in retry.requests] == [f"{exp.experiment_id}:trials:2"]


def test_an_experiment_submitted_inside_the_window_starts_at_once(
    queued: ResolvedExperiment,
) -> None:
    window = parse_window(window_opened_at(queued.submitted_at), "UTC")
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        now = dt.datetime.now(dt.UTC)
        assert [r.run_key for r in decide(instance, f.settings(window), now).requests] == [
            f"{queued.experiment_id}:trials:1"
        ]


def test_a_run_in_flight_makes_the_experiment_wait_and_says_which_run(
    queued: ResolvedExperiment,
) -> None:
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        stuck = stage_run(instance, queued, "trials", dg.DagsterRunStatus.STARTED)
        created = instance.get_run_record_by_id(stuck)
        assert created is not None
        at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)  # inside the window: only the run blocks
        held = decide(instance, f.settings(NIGHTLY), at)
        assert held.requests == []
        [why] = held.waiting
        since = f"{created.create_timestamp.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
        assert why.startswith(
            f"{queued.experiment_id}: in_flight: its trials run {stuck} is STARTED since {since}"
        )
        # Once hangar's liveness check (or run monitoring) ends it as dead, its keys run again
        # (one a person ends waits for them: test_a_trials_run_that_failed_by_itself_...).
        run = instance.get_run_by_id(stuck)
        assert run is not None
        instance.report_run_failed(
            run,
            "hangar: its process (pid 4242 on here) is gone; marked failed so that its "
            "experiment goes on",
        )
        assert [r.run_key for r in decide(instance, f.settings(NIGHTLY), at).requests] == [
            f"{queued.experiment_id}:trials:2"
        ]


def test_a_base_checks_run_failed_by_an_invalid_task_goes_on_with_the_valid_tasks(
    queued: ResolvedExperiment,
) -> None:
    store = Store(paths())
    now = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    with dg.instance_for_test() as instance:
        for stage in ("pin_sets",):
            stage_run(instance, queued, stage)
        stage_run(instance, queued, "base_checks", dg.DagsterRunStatus.FAILURE)
        # Failed before every task was checked: a person looks before anything else starts.
        store.put(f.base_check("median", experiment_id=queued.experiment_id))
        assert decide(instance, f.settings(NIGHTLY), now).requests == []
        # Every task checked, slugify invalid: the run failed on its blocking check alone.
        store.put(f.base_check("durations", experiment_id=queued.experiment_id))
        store.put(
            f.base_check(
                "slugify",
                experiment_id=queued.experiment_id,
                base_passed=True,
                invalid=True,
                reason="hidden tests pass on base",
            )
        )
        assert [r.run_key for r in decide(instance, f.settings(NIGHTLY), now).requests] == [
            f"{queued.experiment_id}:trials:1"
        ]


@pytest.mark.parametrize("stage", ["pin_sets", "trials"])  # a setup stage's branch, the trials'
def test_a_run_whose_worker_was_killed_is_failed_and_its_stage_retried_a_bounded_number_of_times(
    queued: ResolvedExperiment, hangar_home: Path, stage: str
) -> None:
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    eid = queued.experiment_id
    with dg.instance_for_test() as instance:
        if stage == "trials":
            setup_done(instance, queued)
        for n in range(1, STAGE_RUN_RETRIES + 2):
            # The daemon launched run n; its worker recorded itself, then was SIGKILLed.
            run_id = stage_run(instance, queued, stage, dg.DagsterRunStatus.STARTED)
            pid = killed_worker(hangar_home, run_id)
            decided = decide(instance, f.settings(NIGHTLY), at)
            run = instance.get_run_by_id(run_id)
            assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
            [failure] = instance.get_records_for_run(
                run_id, of_type=dg.DagsterEventType.RUN_FAILURE
            ).records
            said = failure.event_log_entry.dagster_event.message  # type: ignore[union-attr]
            assert f"hangar: its process (pid {pid} on " in (said or "") and "is gone" in said
            assert f"{eid}: its {stage} run {run_id} was STARTED, but" in decided.notes[0]
            # (Past the bound a trials run's index is still written: only the stage is held.)
            again = [r.run_key for r in decided.requests if r.run_key.startswith(f"{eid}:{stage}:")]
            if n <= STAGE_RUN_RETRIES:
                assert again == [f"{eid}:{stage}:{n + 1}"]
                assert f"started again (retry {n} of {STAGE_RUN_RETRIES})" in decided.notes[1]
            else:  # past the bound: it waits, and says why
                assert again == []
                [why] = decided.waiting
                assert why.startswith(
                    f"{eid}: {stage}: the workers of its last {n} runs died (latest {run_id}: hangar:"
                )
                assert "hangar experiment resume" in why


def test_a_setup_run_that_failed_by_itself_waits_for_a_person_and_says_so(
    queued: ResolvedExperiment,
) -> None:
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    with dg.instance_for_test() as instance:
        stage_run(instance, queued, "pin_sets")
        failed = stage_run(instance, queued, "pin_sets", dg.DagsterRunStatus.FAILURE)
        decided = decide(instance, f.settings(NIGHTLY), at)
        assert decided.requests == []
        [why] = decided.waiting
        assert why.startswith(f"{queued.experiment_id}: pin_sets: its run {failed} failed")
        assert "a person looks at its logs" in why


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (dg.DagsterRunStatus.FAILURE, "a person looks at its logs"),
        (dg.DagsterRunStatus.CANCELED, "was canceled; `hangar experiment resume` runs it again"),
    ],
)
def test_a_trials_run_that_failed_by_itself_or_was_canceled_is_not_started_again_each_tick(
    queued: ResolvedExperiment, status: dg.DagsterRunStatus, said: str
) -> None:
    """The bug it pins: only a dead worker's trials run was held to the rules; one that failed
    on its own error (or that a person canceled) was requested again at every tick, forever."""
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    eid = queued.experiment_id
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        ended = stage_run(instance, queued, "trials", status)
        decided = decide(instance, f.settings(NIGHTLY), at)
        assert not [r for r in decided.requests if r.run_key.startswith(f"{eid}:trials:")]
        [why] = decided.waiting
        assert why.startswith(f"{eid}: trials: its run {ended} ") and said in why
        # Once a run of it succeeds (`hangar experiment resume`), the sensor goes on.
        stage_run(instance, queued, "trials")
        again = decide(instance, f.settings(NIGHTLY), at)
        assert [r.run_key for r in again.requests if r.run_key.startswith(f"{eid}:trials:")] == [
            f"{eid}:trials:3"
        ]


def test_a_run_whose_worker_is_alive_is_waited_for(
    queued: ResolvedExperiment, hangar_home: Path
) -> None:
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    with dg.instance_for_test() as instance:
        run_id = stage_run(instance, queued, "pin_sets", dg.DagsterRunStatus.STARTED)
        worker = recorded_worker(hangar_home, run_id)
        try:
            decided = decide(instance, f.settings(NIGHTLY), at)
            run = instance.get_run_by_id(run_id)
            assert run is not None and run.status == dg.DagsterRunStatus.STARTED
            assert decided.requests == [] and decided.notes == []
            assert f"in_flight: its pin_sets run {run_id} is STARTED" in decided.waiting[0]
        finally:
            worker.kill()
            worker.wait()


def test_a_run_left_starting_by_a_killed_ui_is_failed_by_the_next_ui_which_waits_for_its_own(
    queued: ResolvedExperiment, hangar_home: Path
) -> None:
    """Regression (tests/chaos.py): the whole `hangar ui` SIGKILLed while its daemon launched a
    run left it STARTING with no process record; the next UI's sensor waited beside it until
    run monitoring's 300 s start timeout."""
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    eid = queued.experiment_id
    with dg.instance_for_test() as instance:
        lost = stage_run(instance, queued, "pin_sets", dg.DagsterRunStatus.STARTING)
        time.sleep(2.5)  # past the second of slack a process's start time is read with
        ui = ui_lock_holder(hangar_home)  # the UI started again, after the run became STARTING
        try:
            # One this UI's daemon launches is waited for: its worker may be loading.
            ours = stage_run(instance, queued, "trials", dg.DagsterRunStatus.STARTING)
            decided = decide(instance, f.settings(NIGHTLY), at)
            run = instance.get_run_by_id(lost)
            assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
            assert (
                f"{eid}: its pin_sets run {lost} was STARTING, but its launcher is gone"
                in (decided.notes[0])
            )
            assert f"pid {ui.pid}" in decided.notes[0]
            still = instance.get_run_by_id(ours)
            assert still is not None and still.status == dg.DagsterRunStatus.STARTING
            assert decided.requests == []
            [why] = decided.waiting
            assert f"its trials run {ours} is STARTING" in why
        finally:
            ui.kill()
            ui.wait()


def test_under_the_deployments_launcher_a_dead_cli_run_is_ended_and_a_launched_one_left_to_monitoring(
    queued: ResolvedExperiment, hangar_home: Path
) -> None:
    # The Docker deployment's launcher has a health check, so its launched runs are run
    # monitoring's; a run the host CLI executes itself has no container, and hangar's liveness
    # check still watches it (it used to skip every run under such a launcher).
    from hangar_dagster.orchestration.sensors import end_dead_runs, stage_runs
    from hangar_dagster.queue.liveness import TAG_CREATOR, creator_tag

    launcher = {
        "module": "hangar_dagster.orchestration.launcher",
        "class": "HangarDockerRunLauncher",
        "config": {},
    }
    with dg.instance_for_test(overrides={"run_launcher": launcher}) as instance:
        assert instance.run_launcher.supports_check_run_worker_health
        launched = stage_run(instance, queued, "pin_sets", dg.DagsterRunStatus.STARTED)
        killed_worker(hangar_home, launched)  # recorded and gone: still monitoring's to judge
        cli = str(uuid.uuid4())
        dead = json.loads(creator_tag()) | {"pid": 2**22 + 7, "start_ticks": 1}  # no such pid
        instance.add_run(
            dg.DagsterRun(
                job_name=f"{queued.experiment_id}__pin_sets_job",
                run_id=cli,
                status=dg.DagsterRunStatus.STARTED,
                tags={
                    "hangar/experiment": queued.experiment_id,
                    "hangar/stage": "pin_sets",
                    TAG_CREATOR: json.dumps(dead, sort_keys=True),
                },
            )
        )
        ended = end_dead_runs(instance, paths(), stage_runs(instance, queued))
        assert [e.split(" was ")[0] for e in ended] == [f"its pin_sets run {cli}"]
        statuses = {r: instance.get_run_by_id(r).status for r in (launched, cli)}  # type: ignore[union-attr]
        assert statuses == {
            launched: dg.DagsterRunStatus.STARTED,
            cli: dg.DagsterRunStatus.FAILURE,
        }


def test_a_daemon_driven_regrade_takes_three_runs_its_trials_run_writing_the_index(
    example_dir: Path, hangar_home: Path
) -> None:
    old, store = finished_first(example_dir, "rg-daemon-first")
    settings = Settings.from_env()
    new = submit(
        spec_file(example_dir, "rg-daemon", {"grader.timeout_s": 200}), settings, regrade=old
    )
    (paths().experiment_dir(new.experiment_id) / DAEMON_MARKER).touch()
    eid = new.experiment_id
    now = dt.datetime.now(dt.UTC)
    with dg.instance_for_test() as instance:

        def asked() -> list[str]:
            return [r.job_name or "" for r in decide(instance, settings, now).requests]

        # no spec job: the spec is materialized in the pin sets' run (stages.stage_assets)
        assert asked() == [f"{eid}__pin_sets_job"]
        stage_run(instance, new, "pin_sets")
        assert asked() == [f"{eid}__base_checks_job"]
        stage_run(instance, new, "base_checks")
        assert asked() == [f"{eid}__trials_job"]  # it grades the stored patches
        for key in new.trial_keys():
            v, t, r = key.key.split("/")
            store.put(f.grade(v, t, int(r), experiment_id=eid))
        # a trials run that failed skipped its index step: the index runs alone
        stage_run(instance, new, "trials", dg.DagsterRunStatus.FAILURE)
        assert asked() == [f"{eid}__index_job"]
        # one that succeeded wrote the index: nothing is left to run
        stage_run(instance, new, "trials")
        assert asked() == []


def mark_due(exp: ResolvedExperiment) -> Callable[[str], None]:
    """Leave the mark a trials run leaves once the next slice's run is due (slots.next_due)."""
    slots = experiment_slots(paths().experiment_dir(exp.experiment_id), exp.spec.parallel)

    def mark(run_id: str) -> None:
        slots.root.mkdir(parents=True, exist_ok=True)
        slots.next_due(run_id).touch()

    return mark


def test_the_next_slice_is_made_beside_a_trials_run_once_that_run_says_it_is_due(
    queued: ResolvedExperiment,
) -> None:
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    eid = queued.experiment_id
    sliced = f.settings(NIGHTLY, HANGAR_RUN_PARTITIONS="8")  # 18 keys: three slices
    due = mark_due(queued)
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        [first] = decide(instance, sliced, at).requests
        going = stage_run(instance, queued, "trials", dg.DagsterRunStatus.STARTED, first.tags)
        # Still starting its own keys: the experiment waits for it.
        held = decide(instance, sliced, at)
        assert held.requests == [] and "in_flight: its trials run" in held.waiting[0]

        due(going)  # about to hand out its last key (trials/stage.py, slots.next_run_due)
        [beside] = decide(instance, sliced, at).requests
        assert beside.run_key == f"{eid}:trials:2"
        # Another value of the queue's one-per-experiment tag, and no index (it follows both).
        assert beside.tags[TAG_TRIALS_OF] == f"{eid}/beside" and beside.tags[TAG_INDEX] == "false"
        assert beside.asset_selection is not None
        assert dg.AssetKey([eid, "index"]) not in beside.asset_selection
        spans = [run_span(queued, r.tags) for r in (first, beside)]
        assert None not in spans
        assert not grid(queued).overlap(*spans)  # type: ignore[arg-type]

        # Two in flight: the third slice waits, though the second says it is due too.
        second = stage_run(instance, queued, "trials", dg.DagsterRunStatus.STARTED, beside.tags)
        due(second)
        assert decide(instance, sliced, at).requests == []

        # The second ended beside the first: nothing more is made until the first ends (what
        # the second left is planned again then, not a new run each tick).
        run = instance.get_run_by_id(second)
        assert run is not None
        instance.report_run_failed(run, "ended")
        assert decide(instance, sliced, at).requests == []


def test_no_slice_is_made_beside_a_run_the_window_would_stop_or_under_another_launcher(
    queued: ResolvedExperiment,
) -> None:
    sliced = f.settings(NIGHTLY, HANGAR_RUN_PARTITIONS="8")
    due = mark_due(queued)
    inside = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        [first] = decide(instance, sliced, inside).requests
        going = stage_run(instance, queued, "trials", dg.DagsterRunStatus.STARTED, first.tags)
        due(going)
        closed = dt.datetime(2027, 7, 2, 0, 20, tzinfo=NY)
        assert decide(instance, sliced, closed).requests == []
        assert len(decide(instance, sliced, inside).requests) == 1
    # A launcher whose run workers may be on other machines, where the slots' lock files do not
    # hold: one trials run at a time, as the run queue's tag says.
    with dg.instance_for_test(
        overrides={
            "run_launcher": {
                "module": "hangar_dagster.orchestration.launcher",
                "class": "HangarDockerRunLauncher",
                "config": {"image": "hangar-test"},
            }
        }
    ) as instance:
        setup_done(instance, queued)
        going = stage_run(instance, queued, "trials", dg.DagsterRunStatus.STARTED, first.tags)
        due(going)
        assert decide(instance, sliced, inside).requests == []


def store_done_but(exp: ResolvedExperiment, left: list[TrialKey]) -> None:
    store = Store(paths())
    for key in exp.trial_keys():
        if key in left:
            continue
        v, t, r = key.key.split("/")
        store.put(f.trial(v, t, int(r), experiment_id=exp.experiment_id))
        store.put(f.grade(v, t, int(r), experiment_id=exp.experiment_id))


def going_with_due_keys_around_it(
    instance: dg.DagsterInstance,
    exp: ResolvedExperiment,
    status: dg.DagsterRunStatus,
    **extra: str,
) -> dict[str, str]:
    """A trials run over rows 2-3 x two variants, marked due, with due keys above and below it."""
    g = grid(exp)

    def key(row: int, col: int) -> TrialKey:
        return TrialKey.from_partition(g.variants[col], g.task_reps[row])

    running = [key(2, 0), key(2, 1), key(3, 0), key(3, 1)]
    store_done_but(exp, running + [key(0, 0), key(5, 0)])
    tags = stage_tags(exp, "trials", running, 8) | extra
    mark_due(exp)(stage_run(instance, exp, "trials", status, tags))
    return tags


def test_the_run_beside_never_cuts_through_the_running_runs_rectangle(
    queued: ResolvedExperiment,
) -> None:
    """The rectangle around keys above and below the running run's would cover its keys not yet
    started: the beside run would run them again (duplicate attempts)."""
    sliced = f.settings(NIGHTLY, HANGAR_RUN_PARTITIONS="8")
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        going = run_span(queued, going_with_due_keys_around_it(instance, queued, RUNNING))
        assert going is not None
        for request in decide(instance, sliced, at).requests:
            span = run_span(queued, request.tags)
            assert span is not None and not grid(queued).overlap(going, span), (going, span)


@pytest.mark.parametrize(
    ("status", "extra"),
    [
        (dg.DagsterRunStatus.CANCELING, {}),  # a person is stopping it
        (RUNNING, {TAG_CREATOR: creator_tag()}),  # a CLI's slice: its driver plans the next
    ],
    ids=["canceling", "cli_slice"],
)
def test_no_run_beside_a_run_being_canceled_or_one_the_cli_runs(
    queued: ResolvedExperiment, status: dg.DagsterRunStatus, extra: dict[str, str]
) -> None:
    sliced = f.settings(NIGHTLY, HANGAR_RUN_PARTITIONS="8")
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        going_with_due_keys_around_it(instance, queued, status, **extra)
        assert decide(instance, sliced, at).requests == []


def test_a_canceled_run_holds_the_experiment_though_the_run_beside_it_succeeded(
    queued: ResolvedExperiment,
) -> None:
    """A person canceled the first run: the run made beside it goes on, no third is made beside
    that one, and once it has ended the experiment waits for the person as after any cancel."""
    sliced = f.settings(NIGHTLY, HANGAR_RUN_PARTITIONS="8")
    at = dt.datetime(2027, 7, 1, 21, 0, tzinfo=NY)
    eid = queued.experiment_id
    with dg.instance_for_test() as instance:
        setup_done(instance, queued)
        [first] = decide(instance, sliced, at).requests
        a = stage_run(instance, queued, "trials", RUNNING, first.tags)
        mark_due(queued)(a)
        [beside] = decide(instance, sliced, at).requests
        b = stage_run(instance, queued, "trials", RUNNING, beside.tags)
        run = instance.get_run_by_id(a)
        assert run is not None
        instance.report_run_canceled(run, "a person stopped it")
        mark_due(queued)(b)
        assert decide(instance, sliced, at).requests == []

        run = instance.get_run_by_id(b)
        assert run is not None
        instance.handle_run_event(
            b,
            dg.DagsterEvent(
                event_type_value=dg.DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name
            ),
        )
        after = decide(instance, sliced, at)
        # No trials run (the index may be refreshed, as after any canceled trials run).
        assert [r.run_key for r in after.requests if ":trials:" in (r.run_key or "")] == []
        assert any(f"{eid}: trials: its run {a} was canceled" in w for w in after.waiting)
