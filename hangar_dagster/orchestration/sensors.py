"""Sensors: the daemon-side driver that walks submitted experiments through their stages.

It launches the setup stages once, then a trials run whenever the eval queue
has work for the experiment and nothing blocks it (new keys, and infra-error
retries within the retry rules: this is the infra-retry sensor), or a finished
trial waits for its grade (then whatever blocks starts), and the index after
each trials run. One run of an experiment is in flight at a time, but for the
next slice's trials run, made beside the one before once that one is about
to hand out its last key (``overlap_request``).

When the window opens, the trials of an experiment that was already waiting
belong to the window's opening schedule (schedules.py) for ``OPEN_GRACE``; the
driver starts them only if no trials run began since the opening by then (the
daemon was down at the opening), and says so in its skip reason meanwhile.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from hangar_dagster.experiment.catalog import DAEMON_MARKER, active_experiments
from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.stages import (
    TAG_EXPERIMENT,
    TAG_INDEX,
    TAG_STAGE,
    TAG_TRIALS_OF,
    grid,
    job_name,
    run_selection,
    run_span,
    setup_stages,
    stage_tags,
    trials_span,
    writes_index,
)
from hangar_dagster.queue.drain import request_drain
from hangar_dagster.queue.liveness import (
    TAG_CREATOR,
    launcher_gone,
    not_under_the_ui,
    read_run_process,
    worker_gone,
)
from hangar_dagster.queue.partitions import RUN_PARTITIONS
from hangar_dagster.queue.slots import experiment_slots
from hangar_dagster.queue.stage_runs import (
    STAGE_RUN_RETRIES,
    EndedRun,
    after_failure,
    deaths_in_a_row,
    retry_note,
)
from hangar_dagster.queue.starts import (
    base_checks_stored,
    blocker,
    fit_blocker,
    pending,
    schedule_grace,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.shadow.tick import tick as shadow_tick

IN_FLIGHT = frozenset(
    {
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.CANCELING,
    }
)

StageRuns = dict[str, list[dg.RunRecord]]  # stage -> its runs, newest first


@dataclass
class Decisions:
    requests: list[dg.RunRequest] = field(default_factory=list)
    waiting: list[str] = field(
        default_factory=list
    )  # "<experiment>: <reason>": the skip reason, or the tick's log when it requests a run
    notes: list[str] = field(default_factory=list)  # what the tick did besides, for the log


def daemon_driven(paths: HangarPaths, exp: ResolvedExperiment) -> bool:
    return (paths.experiment_dir(exp.experiment_id) / DAEMON_MARKER).exists()


def stage_runs(instance: dg.DagsterInstance, exp: ResolvedExperiment) -> StageRuns:
    by_stage: StageRuns = {}
    records = instance.get_run_records(dg.RunsFilter(tags={TAG_EXPERIMENT: exp.experiment_id}))
    for record in records:  # newest first
        by_stage.setdefault(record.dagster_run.tags.get(TAG_STAGE, ""), []).append(record)
    return by_stage


def in_flight(runs: StageRuns) -> dg.RunRecord | None:
    return next((r for rs in runs.values() for r in rs if r.dagster_run.status in IN_FLIGHT), None)


def describe_run(record: dg.RunRecord) -> str:
    """``its <stage> run <id> is <STATUS> since <when> UTC`` (started, else created)."""
    run = record.dagster_run
    since = (
        dt.datetime.fromtimestamp(record.start_time, dt.UTC)
        if record.start_time is not None
        else record.create_timestamp
    )
    return (
        f"its {run.tags.get(TAG_STAGE, '?')} run {run.run_id} is {run.status.value} "
        f"since {since.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
    )


def busy_reason(record: dg.RunRecord) -> str:
    """Why an experiment waits for its run in flight (a dead worker's run is ended first:
    ``end_dead_runs``; one on another host, or not yet recorded, is waited for)."""
    return f"in_flight: {describe_run(record)}; the next run starts when it ends"


# Statuses in which a run has (or had) a worker that hangar's liveness check can look at.
HAS_WORKER = frozenset(
    {dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING}
)


def end_dead_runs(instance: dg.DagsterInstance, paths: HangarPaths, runs: StageRuns) -> list[str]:
    """Mark failed every run in flight whose worker is known to be gone; say which and why.

    Where the run launcher has a worker health check of its own (Docker, Kubernetes), the
    runs it launched are Dagster's run monitoring's job; the runs the CLI executes in its own
    process (``run --wait``, ``resume``: tagged with their creator) are still this check's.
    """
    watched = instance.run_launcher.supports_check_run_worker_health
    ended = []
    for stage, records in runs.items():
        for record in records:
            run = record.dagster_run
            creator = run.tags.get(TAG_CREATOR)
            if watched and creator is None:
                continue  # launched: run monitoring checks its container or pod
            # NOT_STARTED has a worker only for a run the CLI executes itself (it tags those)
            has_worker = run.status in HAS_WORKER or (
                run.status == dg.DagsterRunStatus.NOT_STARTED and creator is not None
            )
            if not has_worker:
                continue
            why = worker_gone(paths, run.run_id, creator)
            if (
                why is None
                and run.status == dg.DagsterRunStatus.STARTING
                and creator is None
                and read_run_process(paths, run.run_id) is None
            ):
                # Launched by the daemon, its worker not yet recorded: its launcher may be gone.
                why = launcher_gone(paths, record.update_timestamp)
            if why is None:
                continue
            instance.report_run_failed(
                run, f"hangar: {why}; marked failed so that its experiment goes on"
            )
            ended.append(
                f"its {stage} run {run.run_id} was {run.status.value}, but {why}: marked failed"
            )
    return ended


def ended_run(instance: dg.DagsterInstance, paths: HangarPaths, record: dg.RunRecord) -> EndedRun:
    """How a run that is not in flight ended, for the rules in queue/stage_runs.py."""
    run = record.dagster_run
    message = ""
    if run.status == dg.DagsterRunStatus.FAILURE:
        failures = instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE, limit=1, ascending=False
        ).records
        if failures and (event := failures[0].event_log_entry.dagster_event) is not None:
            message = event.message or ""
    left = read_run_process(paths, run.run_id) is not None
    return EndedRun(
        run.run_id, run.status.value, left, message, started=record.start_time is not None
    )


def ended_runs(
    instance: dg.DagsterInstance, paths: HangarPaths, records: list[dg.RunRecord], limit: int
) -> list[EndedRun]:
    """The newest ``limit`` runs' endings, stopping after the first that was not a dead worker."""
    out: list[EndedRun] = []
    for record in records[:limit]:
        out.append(ended_run(instance, paths, record))
        if not out[-1].worker_died:
            break
    return out


def setup_gap(exp: ResolvedExperiment, runs: StageRuns) -> tuple[str, dg.RunRecord | None] | None:
    """The first setup stage whose latest run did not succeed, with that run (None: never ran)."""
    for stage in setup_stages(exp):
        done = runs.get(stage, [])
        if not done:
            return stage, None
        if done[0].dagster_run.status != dg.DagsterRunStatus.SUCCESS:
            return stage, done[0]
    return None


def started_since(runs: list[dg.RunRecord], at: dt.datetime | None) -> bool:
    return at is not None and any(r.create_timestamp >= at for r in runs)


def _request(
    exp: ResolvedExperiment,
    stage: str,
    n: int,
    due: list[TrialKey] | None = None,
    limit: int = RUN_PARTITIONS,
    beside: dict[str, str] | None = None,
) -> dg.RunRequest:
    tags = stage_tags(exp, stage, due, limit) | (beside or {})
    return dg.RunRequest(
        run_key=f"{exp.experiment_id}:{stage}:{n}",
        job_name=job_name(exp, stage),
        # The job's tags name the experiment too; here the sensor can say whose job is not loaded.
        tags=tags | {TAG_EXPERIMENT: exp.experiment_id},
        asset_selection=run_selection(exp, stage, tags),
    )


def overlap_request(
    instance: dg.DagsterInstance,
    exp: ResolvedExperiment,
    store: Store,
    settings: Settings,
    runs: StageRuns,
    now: dt.datetime,
) -> dg.RunRequest | None:
    """The next slice's trials run, made beside the one in flight once that one says it is due
    (within about two minutes of handing out its last key: ``slots.next_run_due``), or None (wait
    for it to end, as for any run in flight). The new run waits for the turn (``slots.Turn``).

    A trials run's tail (its last trials and grades, then the metadata and materialization
    events of its 500 partitions) and the next run's launch and planned events would otherwise
    leave the slots idle at every slice boundary; ``run --wait`` overlaps its slices the same
    way (driver.py). The two runs share the experiment's ``parallel`` through lock files in its
    folder (queue/slots.py), which hold only where the runs share one kernel: so only under the
    default launcher (run workers are processes on the daemon's machine). Two runs at most;
    the keys of a run that ended beside the one in flight are left to a run made once nothing
    runs; a sibling that was canceled or failed stops the overlap (``sibling_failure``); the
    overlapping run never writes the index (the index follows once both have ended).
    """
    if type(instance.run_launcher) is not dg.DefaultRunLauncher:
        return None
    flying = [r for rs in runs.values() for r in rs if r.dagster_run.status in IN_FLIGHT]
    trials_runs = runs.get("trials", [])
    if len(flying) != 1 or not trials_runs or flying[0] is not trials_runs[0]:
        return None
    going = flying[0].dagster_run
    # Only beside a run that is running (not one being canceled) and that the daemon launched
    # (a CLI's slice is planned by its own driver, which does not look at the daemon's runs).
    if going.status != dg.DagsterRunStatus.STARTED or TAG_CREATOR in going.tags:
        return None
    slots = experiment_slots(settings.paths.experiment_dir(exp.experiment_id), exp.spec.parallel)
    span = run_span(exp, going.tags)
    if span is None or not slots.next_due(going.run_id).exists():
        return None
    grid_ = grid(exp)
    work = pending(exp, store, settings).without(functools.partial(grid_.covers, span))
    if len(trials_runs) > 1:
        sibling = trials_runs[1]  # the run the one in flight was made beside, or after
        if sibling.dagster_run.status != dg.DagsterRunStatus.SUCCESS:
            return None  # a cancel or a failure waits for the one in flight to end (decide)
        if ended_beside(sibling, flying[0]):
            # It ended beside the one in flight: what it left (retries, what could not start)
            # is planned once nothing runs, not in run after run beside it (driver.py's held).
            left = run_span(exp, sibling.dagster_run.tags)
            if left is None:
                return None
            work = work.without(functools.partial(grid_.covers, left))
    due = work.keys + work.grades
    if (
        not work.keys
        or blocker(exp, store, settings, now)
        or fit_blocker(exp, work.keys, store, settings, now)
    ):
        return None
    # The rectangle around what is left may still cut through the running run's (keys above
    # and below it): its unstarted keys would then run twice. Such a slice waits, as in driver.py.
    if grid_.overlap(span, trials_span(exp, due, settings.run_partitions) or span):
        return None
    # The run queue holds one trials run per value of this tag (dagster.yaml): the two
    # overlapping runs carry two values, one after the other.
    ours = going.tags.get(TAG_TRIALS_OF, exp.experiment_id)
    beside = exp.experiment_id if ours != exp.experiment_id else f"{exp.experiment_id}/beside"
    return _request(
        exp,
        "trials",
        len(trials_runs) + 1,
        due,
        settings.run_partitions,
        {TAG_INDEX: "false", TAG_TRIALS_OF: beside},
    )


def ended_beside(record: dg.RunRecord, newer: dg.RunRecord) -> bool:
    """Whether ``record`` ended after ``newer`` was made (the two ran side by side)."""
    return record.end_time is not None and record.end_time >= newer.create_timestamp.timestamp()


def sibling_failure(
    instance: dg.DagsterInstance, paths: HangarPaths, trials_runs: list[dg.RunRecord]
) -> str | None:
    """Why the experiment waits when the newest trials run succeeded but the one beside it did
    not end well by itself (canceled by a person, failed by its own code): as if it had been the
    last (``after_failure``). A run that ended before the newest was made was judged then."""
    if len(trials_runs) < 2:
        return None
    newest, before = trials_runs[0], trials_runs[1]
    status = before.dagster_run.status
    if status in IN_FLIGHT or status == dg.DagsterRunStatus.SUCCESS:
        return None
    if not ended_beside(before, newest):
        return None
    ended = ended_run(instance, paths, before)
    return None if ended.worker_died else after_failure("trials", [ended])


def decide(instance: dg.DagsterInstance, settings: Settings, now: dt.datetime) -> Decisions:
    """For each daemon-driven experiment, the next run it needs under ``settings``, or why it waits."""
    out = Decisions()
    paths = settings.paths
    window = settings.window
    store = Store(paths)
    for exp in active_experiments(paths):
        if not daemon_driven(paths, exp):
            continue
        runs = stage_runs(instance, exp)
        if ended := end_dead_runs(instance, paths, runs):
            out.notes += [f"{exp.experiment_id}: {e}" for e in ended]
            runs = stage_runs(instance, exp)
        busy = in_flight(runs)
        if busy is not None:
            if (beside := overlap_request(instance, exp, store, settings, runs, now)) is not None:
                out.requests.append(beside)
                continue
            out.waiting.append(f"{exp.experiment_id}: {busy_reason(busy)}")
            continue
        gap = setup_gap(exp, runs)
        if gap is not None and gap[0] == "base_checks" and gap[1] is not None:
            # Failed on a blocking check (an invalid task) once every task was checked: go on.
            gap = None if base_checks_stored(exp, store) else gap
        if gap is not None:
            stage, last = gap
            if last is None:
                out.requests.append(_request(exp, stage, 1))
                continue
            # It did not succeed: again if its worker died (bounded), else a person looks.
            done = ended_runs(instance, paths, runs[stage], STAGE_RUN_RETRIES + 2)
            if (why := after_failure(stage, done)) is None:
                out.requests.append(_request(exp, stage, len(runs[stage]) + 1))
                out.notes.append(f"{exp.experiment_id}: {retry_note(stage, done)}")
            else:
                out.waiting.append(f"{exp.experiment_id}: {why}")
            continue
        trials_runs = runs.get("trials", [])
        if work := pending(exp, store, settings):
            endings = ended_runs(instance, paths, trials_runs, STAGE_RUN_RETRIES + 2)
            died = deaths_in_a_row(endings)
            # The setup stages' rules (queue/stage_runs.py), grading too: a run that failed by
            # itself or was canceled waits for a person; one that keeps dying is not retried.
            held = (
                after_failure("trials", endings)
                if endings and endings[0].status != "SUCCESS"
                else sibling_failure(instance, paths, trials_runs)
            )
            if held is not None:
                out.waiting.append(f"{exp.experiment_id}: {held}")
            else:
                why = blocker(exp, store, settings, now) or fit_blocker(
                    exp, work.keys, store, settings, now
                )
                if why is None and not started_since(trials_runs, window.opens_at(now)):
                    why = schedule_grace(exp, window, now)
                # A finished trial without a grade is graded by a trials run (its grades asset)
                # whatever holds the starts back: that run starts no trial while blocked.
                if why is None or work.grades:
                    if died:
                        out.notes.append(f"{exp.experiment_id}: {retry_note('trials', died)}")
                    due = work.grades if why else work.keys + work.grades
                    out.requests.append(
                        _request(exp, "trials", len(trials_runs) + 1, due, settings.run_partitions)
                    )
                    continue
                out.waiting.append(f"{exp.experiment_id}: {why}")
        # The index follows the last trials run: the last slice's run writes it itself
        # (stages.stage_tags); an index run alone only when that one did not (it failed, it
        # was an earlier slice, or it predates trials runs with the index).
        indexed = runs.get("index", []) + [
            r
            for r in trials_runs
            if r.dagster_run.status == dg.DagsterRunStatus.SUCCESS
            and writes_index(r.dagster_run.tags)
        ]
        if trials_runs and (
            not indexed
            or max(r.create_timestamp for r in indexed) < trials_runs[0].create_timestamp
        ):
            out.requests.append(_request(exp, "index", len(trials_runs)))
    return out


def trials_runs_in_flight(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    runs = instance.get_runs(dg.RunsFilter(tags={TAG_STAGE: "trials"}))
    return [r for r in runs if r.status in IN_FLIGHT]


def drain_all(instance: dg.DagsterInstance, paths: HangarPaths) -> list[str]:
    """The end-of-window drain: ask every trials run in flight to stop (its trials end as power_down)."""
    drained = []
    for run in trials_runs_in_flight(instance):
        request_drain(paths, run.run_id)
        drained.append(run.run_id)
    return drained


def foreign_daemon(instance: dg.DagsterInstance, settings: Settings) -> str | None:
    """Why this daemon may not launch on ``instance`` (None: it may). Only hangar's embedded
    instance (``HANGAR_HOME/dagster``) has the one-UI rule; a deployment's instance has its own
    daemon and launchers with health checks (docs/operations.md)."""
    # HANGAR_HOME/dagster, not settings.dagster_home: DAGSTER_HOME pointed elsewhere (a
    # deployment's, a test's) is not the embedded instance.
    if Path(instance.root_directory).resolve() != (settings.paths.home / "dagster").resolve():
        return None
    if instance.run_launcher.supports_check_run_worker_health:  # Docker, Kubernetes: deployed
        return None
    return not_under_the_ui(settings.paths)


def build_experiment_driver(jobs: list[dg.UnresolvedAssetJobDefinition]) -> dg.SensorDefinition:
    # Every 5 s, the daemon's sensor loop's own period (it evaluates no sensor more often): an
    # experiment's next stage waits for this tick after each run (docs/operations.md, "The
    # daemon's intervals"). 4, not 5: a loop that comes back a few milliseconds under 5 s after
    # the last tick skipped a sensor asking for 5, so ticks were 5 or 10 s apart.
    @dg.sensor(jobs=jobs, minimum_interval_seconds=4, default_status=dg.DefaultSensorStatus.RUNNING)
    def experiment_driver(
        context: dg.SensorEvaluationContext, hangar: HangarResource
    ) -> Iterator[dg.RunRequest | dg.SkipReason]:
        # The settings are read once per tick, from the resource the definitions were built with.
        settings = hangar.settings()
        if (refused := foreign_daemon(context.instance, settings)) is not None:
            yield dg.SkipReason(refused)
            return
        decisions = decide(context.instance, settings, dt.datetime.now(dt.UTC))
        for note in decisions.notes:
            context.log.warning(note)
        requested = False
        for request in decisions.requests:
            if (
                request.job_name
                and context.repository_def
                and context.repository_def.has_job(request.job_name)
            ):
                requested = True
                yield request
            else:  # submitted after this code location loaded: it runs once the location reloads
                decisions.waiting.append(
                    f"{request.tags.get(TAG_EXPERIMENT)}: not_loaded: its job {request.job_name} "
                    "is not loaded yet; `hangar ui` reloads the code location when it sees a new "
                    "experiment (elsewhere: Reload in the UI)"
                )
        if not requested and decisions.waiting:
            yield dg.SkipReason("waiting: " + "; ".join(decisions.waiting))
        else:  # a tick that requests shows no skip reason: the others' reasons go to its log
            for why in decisions.waiting:
                context.log.info(f"waiting: {why}")

    return experiment_driver


def build_shadow_sensor() -> dg.SensorDefinition:
    """``shadow_merges``: each tick looks at every registered shadow policy's mainline and
    submits the kept merges as a shadow experiment for the driver (shadow/tick.py). It requests
    no run itself: the experiment_driver sensor runs the experiment once the location loaded it
    (the webserver is asked to reload it, as for any submit)."""

    @dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
    def shadow_merges(
        context: dg.SensorEvaluationContext, hangar: HangarResource
    ) -> Iterator[dg.SkipReason]:
        settings = hangar.settings()
        if (refused := foreign_daemon(context.instance, settings)) is not None:
            yield dg.SkipReason(refused)
            return
        results = shadow_tick(settings, dt.datetime.now(dt.UTC))
        for r in results:
            context.log.info(r.said)
        if any(r.experiment_id for r in results):
            # Its jobs load with the code location: ask the webserver to reload it, as the
            # nightly schedule and `hangar experiment run` do.
            from hangar_dagster.cli.ui import notify_webserver

            notify_webserver(settings)
        yield dg.SkipReason(
            "; ".join(r.said for r in results)
            or "no shadow policy is registered (`hangar shadow register POLICY.yaml`)"
        )

    return shadow_merges
