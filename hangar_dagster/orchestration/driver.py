"""Driving an experiment through its stages as real Dagster runs.

``stages.stage_tags`` says which partitions a stage's run covers (all of them for the
setup stages; for trials, the next slice of the pending work) and, for trials, that it is
eval-queue work. ``run_stages`` executes the
stages in this process against the shared instance (``hangar experiment run
--wait``): the setup stages once, then trials runs while the queue has work
for the experiment (waiting for the eval window when it is closed), then the
index unless the last run wrote it (the last slice's trials run does: ``stages.stage_tags``). The ``experiment_driver`` sensor walks the same stages through the
daemon instead (no ``--wait``).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import dagster as dg

from hangar_dagster.experiment.catalog import active_experiments
from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.orchestration.stages import (
    job_name,
    job_tags,
    run_selection,
    setup_stages,
    stage_tags,
    writes_index,
)
from hangar_dagster.queue.drain import interrupt, interrupt_wait, interrupted
from hangar_dagster.queue.liveness import TAG_CREATOR, creator_tag
from hangar_dagster.queue.starts import (
    base_checks_stored,
    blocker,
    fit_blocker,
    invalid_tasks,
    pending,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings

# The CLI shows trial progress at INFO; step-level DEBUG events stay in the UI's run log.
QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
# How long an interrupted `run --wait` waits for its cut-off trials to be stored and its run to end.
INTERRUPT_GRACE_S = 8.0


@functools.lru_cache(maxsize=1)
def _definitions(settings: Settings, experiments: tuple[str, ...]) -> dg.Definitions:
    from hangar_dagster.orchestration.definitions import build_definitions

    return build_definitions(settings)


def stage_job(job: str) -> dg.JobDefinition:
    """The stage job named ``job`` of the definitions this process's settings load.

    ``run_stages`` executes jobs reconstructable from here (``dg.build_reconstructable_job``,
    the public way to rebuild a job made by a factory): the run's process, this one with the
    in-process executor, builds the definitions as the code location does; again only when
    an experiment was stored since, so the stages of one ``--wait`` build them once.
    """
    settings = Settings.from_env()
    stored = tuple(e.experiment_id for e in active_experiments(settings.paths))
    return _definitions(settings, stored).resolve_job_def(job)


class Interrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the stages: no trial started since, the running ones were cut off."""

    def __init__(self, why: str, runs_failed: list[str] | None = None):
        super().__init__(why)
        self.why = why
        self.runs_failed = runs_failed or []  # runs still going after the grace, marked failed


class StageFailed(RuntimeError):
    def __init__(self, stage: str, run_id: str):
        super().__init__(
            f"stage {stage} failed in Dagster run {run_id}; `hangar ui` shows its logs"
        )
        self.stage = stage
        self.run_id = run_id


# The waiting reasons `run --wait` sleeps through: the window will open, or close and open.
WINDOW_REASONS = ("eval_window", "window_fit")


def run_stages(
    exp: ResolvedExperiment,
    instance: dg.DagsterInstance,
    store: Store,
    settings: Settings,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
    window_wait: bool = True,
) -> list[str]:
    """Execute the experiment's stage jobs in this process until the queue has nothing it may run.

    ``window_wait``: sleep while the eval window is closed (else stop there, as for any other
    blocker, leaving the trials pending: the CLI's ``--no-window-wait``).
    """
    run_ids: list[str] = []
    indexed = False  # the last run wrote the index (a regrade's trials run does)

    def execute(stage: str, due: list[TrialKey] | None = None) -> None:
        nonlocal indexed
        if why := interrupted():
            raise Interrupted(why)
        job = dg.build_reconstructable_job(__name__, stage_job.__name__, (job_name(exp, stage),))
        tags = stage_tags(exp, stage, due, settings.run_partitions) | {TAG_CREATOR: creator_tag()}
        result = dg.execute_job(
            job,
            instance,
            run_config=QUIET,
            tags=tags,
            raise_on_error=False,
            asset_selection=run_selection(exp, stage, tags),
        )
        run_ids.append(result.run_id)
        indexed = result.success and writes_index(job_tags(exp, stage) | tags)
        if why := interrupted():  # the run ended early because of it: say that, not its status
            raise Interrupted(why)
        if result.success:
            return
        if stage == "base_checks" and base_checks_stored(exp, store):
            for task, why in invalid_tasks(exp, store).items():
                say(f"task {task} is invalid ({why}): its trials are not started")
            return
        raise StageFailed(stage, result.run_id)

    for stage in setup_stages(exp):
        execute(stage)
    window = settings.window

    def progress() -> tuple[int, int]:
        # Narrow reads (the tally's attempts, the grades' keys), twice per slice: the full
        # records of a 50,000-trial experiment took seconds each time, between runs.
        eid = exp.experiment_id
        return len(store.attempts(eid)), len(store.graded_attempts(eid))

    while work := pending(exp, store, settings):
        if cut := interrupted():  # also while sleeping for the window
            raise Interrupted(cut)
        now = dt.datetime.now(dt.UTC)
        why = blocker(exp, store, settings, now) or fit_blocker(
            exp, work.keys, store, settings, now
        )
        # Grades missing (a crash between a trial and its grade) are graded whatever blocks a
        # start: the trials run grades every finished attempt, and starts no trial while blocked.
        if why and not work.grades and why.startswith(WINDOW_REASONS) and window_wait:
            say(f"waiting ({len(work.keys)} trials): {why}")
            # Closed: until it opens. Open, but no trial fits: until it closes (then it is closed).
            wake = window.next_open(now) if why.startswith("eval_window") else window.closes_at(now)
            sleep(min(60.0, max(1.0, ((wake or now) - now).total_seconds())))
            continue
        if why and not work.grades:
            say(f"not starting {len(work.keys)} trials: {why}")
            break
        if work.grades:
            say(f"grading {len(work.grades)} finished trial(s) that have no grade")
        before = progress()
        # While starts are blocked the run only grades; else it covers the next slice of work.
        execute("trials", work.grades if why else work.keys + work.grades)
        if progress() == before:
            break  # nothing could start (e.g. the window closed as the run began): don't spin
    if not indexed:
        execute("index")
    return run_ids


def run_in_flight(
    exp: ResolvedExperiment, settings: Settings, say: Callable[[str], None] = print
) -> str | None:
    """What run of ``exp`` is in flight on the CLI's instance (described), or None.

    A run whose worker is known to be gone is marked failed first (``say`` tells which), as
    the driver sensor does: it would otherwise stay in flight and block ``resume`` for good.
    """
    from hangar_dagster.orchestration.sensors import (
        describe_run,
        end_dead_runs,
        in_flight,
        stage_runs,
    )

    ensure_dagster_home(settings)
    with dg.DagsterInstance.get() as instance:
        runs = stage_runs(instance, exp)
        if ended := end_dead_runs(instance, settings.paths, runs):
            for e in ended:
                say(e)
            runs = stage_runs(instance, exp)
        busy = in_flight(runs)
    return None if busy is None else describe_run(busy)


def drive(
    exp: ResolvedExperiment,
    store: Store,
    settings: Settings,
    say: Callable[[str], None] = print,
    window_wait: bool = True,
) -> list[str]:
    """``run_stages`` on the CLI's instance (``hangar experiment run --wait`` and ``resume``).

    SIGINT and SIGTERM interrupt it (``Interrupted``): no trial starts from then on, the
    running ones are cut off (``infra_error / interrupted``, retried by the next run), and it
    waits at most ``INTERRUPT_GRACE_S`` for the stage run to end. The stages run in a worker
    thread so that Dagster, which turns SIGINT into an error raised inside the step on the
    main thread only, leaves the signals to us.
    """
    import warnings

    # Beta/preview notices about APIs we pin deliberately are noise to a CLI user.
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    ensure_dagster_home(settings)

    def stages() -> list[str]:
        with dg.DagsterInstance.get() as instance:
            return run_stages(
                exp,
                instance,
                store,
                settings,
                say=say,
                sleep=interrupt_wait,
                window_wait=window_wait,
            )

    if threading.current_thread() is not threading.main_thread():
        return stages()  # signals reach only the main thread: nothing to catch here
    done: dict[str, Any] = {}

    def worker() -> None:
        try:
            done["runs"] = stages()
        except BaseException as e:  # handed to the main thread, raised there
            done["error"] = e

    def on_signal(signo: int, _frame: object) -> None:
        interrupt(f"{signal.Signals(signo).name} to pid {os.getpid()}")

    thread = threading.Thread(target=worker, name="hangar-stages", daemon=True)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        thread.start()
        while thread.is_alive() and interrupted() is None:
            thread.join(0.2)
        if (why := interrupted()) is not None:
            thread.join(INTERRUPT_GRACE_S)  # the cut-off trials are stored, the run ends
            failed = _fail_runs_in_flight(exp, why) if thread.is_alive() else []
            raise Interrupted(why, failed)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if "error" in done:
        raise done["error"]
    runs: list[str] = done["runs"]
    return runs


def _fail_runs_in_flight(exp: ResolvedExperiment, why: str) -> list[str]:
    """Mark failed the runs of ``exp`` this process leaves behind, so ``resume`` may start.

    ``resume`` refuses beside a run in flight, and this one's process is about to exit.
    """
    from hangar_dagster.orchestration.sensors import IN_FLIGHT
    from hangar_dagster.orchestration.stages import TAG_EXPERIMENT

    failed = []
    with dg.DagsterInstance.get() as instance:
        for run in instance.get_runs(dg.RunsFilter(tags={TAG_EXPERIMENT: exp.experiment_id})):
            if run.status in IN_FLIGHT:
                instance.report_run_failed(run, f"{why}; its process exited")
                failed.append(run.run_id)
    return failed
