"""Driving an experiment through its stages as real Dagster runs.

``stages.stage_tags`` says which partitions a stage's run covers (all of them for the
setup stages; for trials, the next slice of the pending work) and, for trials, that it is
eval-queue work. ``run_stages`` executes the
stages in this process against the shared instance (``hangar experiment run
--wait``): the setup stages once, then trials runs while the queue has work
for the experiment (waiting for the eval window when it is closed), then the
index unless the last run wrote it (a trials run that covers all that is due does:
``stages.stage_tags``; slices that overlap, each in a process of its own, never do). The
``experiment_driver`` sensor walks the same stages through the daemon instead (no ``--wait``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg

from hangar_dagster.experiment.catalog import active_experiments
from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.orchestration.stages import (
    TAG_INDEX,
    grid,
    job_name,
    job_tags,
    run_selection,
    setup_stages,
    span_tags,
    stage_tags,
    trials_span,
    writes_index,
)
from hangar_dagster.queue.drain import interrupt, interrupt_wait, interrupted
from hangar_dagster.queue.liveness import TAG_CREATOR, creator_tag
from hangar_dagster.queue.partitions import RunRange
from hangar_dagster.queue.starts import (
    base_checks_stored,
    blocker,
    fit_blocker,
    invalid_tasks,
    pending,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings

T = TypeVar("T")
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


def execute_stage(
    exp: ResolvedExperiment, instance: dg.DagsterInstance, stage: str, tags: dict[str, str]
) -> tuple[str, bool]:
    """Execute one run of ``stage`` with run tags ``tags`` in this process: (run id, success)."""
    job = dg.build_reconstructable_job(__name__, stage_job.__name__, (job_name(exp, stage),))
    tags = tags | {TAG_CREATOR: creator_tag()}
    result = dg.execute_job(
        job,
        instance,
        run_config=QUIET,
        tags=tags,
        raise_on_error=False,
        asset_selection=run_selection(exp, stage, tags),
    )
    return result.run_id, result.success


# The waiting reasons `run --wait` sleeps through: the window will open, or close and open.
WINDOW_REASONS = ("eval_window", "window_fit")


# Every slice process this one started and has not seen end (``_Slice.kill_left``).
_SLICE_PROCS: set[subprocess.Popen[bytes]] = set()


class _Slice:
    """One trials slice's run, executed by ``python -m hangar_dagster.orchestration.slice_run``.

    A process of its own because two runs in one process would share its stdout and stderr,
    which Dagster's compute log capture redirects per run (file descriptors, not threads).
    """

    def __init__(self, proc: subprocess.Popen[bytes], out: Path, span: RunRange, before: Any):
        self.proc, self.out, self.span, self.before = proc, out, span, before

    @classmethod
    def start(cls, exp: ResolvedExperiment, span: RunRange, before: Any) -> _Slice:
        tags = span_tags(span) | {TAG_INDEX: "false"}  # the index runs once, after the last
        fd, out = tempfile.mkstemp(prefix="hangar-slice-", suffix=".json")
        os.close(fd)
        cmd = [sys.executable, "-m", "hangar_dagster.orchestration.slice_run"]
        cmd += [exp.experiment_id, json.dumps(tags), out, str(os.getpid())]
        proc = subprocess.Popen(cmd)
        _SLICE_PROCS.add(proc)
        return cls(proc, Path(out), span, before)

    def made_no_progress(self, now: Any) -> bool:
        return bool(now == self.before)

    @staticmethod
    def first_to_end(running: list[_Slice]) -> _Slice:
        """Wait for the first of ``running`` to end and take it out (``Interrupted`` if this
        process is: the caller stops the others)."""
        while not (done := [s for s in running if s.proc.poll() is not None]):
            if why := interrupted():
                raise Interrupted(why)
            time.sleep(0.2)
        running.remove(done[0])
        return done[0]

    def result(self) -> str:
        """The ended run's id, or ``Interrupted`` / ``StageFailed``."""
        try:
            said = json.loads(self.out.read_text() or "{}")
        finally:
            self.out.unlink(missing_ok=True)
        if why := said.get("interrupted"):
            raise Interrupted(str(why))
        if "run_id" not in said:
            raise RuntimeError(
                f"a trials slice's process exited {self.proc.returncode} before its run ended; "
                "its output above says why"
            )
        if not said["success"]:
            raise StageFailed("trials", said["run_id"])
        return str(said["run_id"])

    @staticmethod
    def kill_left() -> None:
        for proc in list(_SLICE_PROCS):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    @staticmethod
    def stop(slices: list[_Slice]) -> None:
        """SIGTERM the slices still running (each cuts off its trials and ends its run, as
        ``drive`` does), then SIGKILL what is left before the caller's grace runs out."""
        alive = [s for s in slices if s.proc.poll() is None]
        for s in alive:
            s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + INTERRUPT_GRACE_S - 2  # within the main thread's grace
        for s in alive:
            try:
                s.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()  # its run stays in flight: drive marks it failed
                s.proc.wait()
        for s in slices:
            s.out.unlink(missing_ok=True)
            _SLICE_PROCS.discard(s.proc)


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
        tags = stage_tags(exp, stage, due, settings.run_partitions)
        run_id, success = execute_stage(exp, instance, stage, tags)
        run_ids.append(run_id)
        indexed = success and writes_index(job_tags(exp, stage) | tags)
        if why := interrupted():  # the run ended early because of it: say that, not its status
            raise Interrupted(why)
        if success:
            return
        if stage == "base_checks" and base_checks_stored(exp, store):
            for task, why in invalid_tasks(exp, store).items():
                say(f"task {task} is invalid ({why}): its trials are not started")
            return
        raise StageFailed(stage, run_id)

    for stage in setup_stages(exp):
        execute(stage)
    window = settings.window

    def progress() -> tuple[int, int]:
        # Narrow reads (the tally's attempts, the grades' keys), twice per slice: the full
        # records of a 50,000-trial experiment took seconds each time, between runs.
        eid = exp.experiment_id
        return len(store.attempts(eid)), len(store.graded_attempts(eid))

    grid_ = grid(exp)
    running: list[_Slice] = []  # slices' runs, each in its own process: at most two at once
    started: list[_Slice] = []

    # The keys of slices that ended while another still ran: planned again (retries, what could
    # not start) only once none runs, so a slice that could start nothing is not made again and
    # again beside a long sibling.
    held: set[str] = set()

    def finish_one() -> bool:
        """Wait for a slice to end; False when nothing was stored since it began and no other
        slice runs (nothing could start: stop, don't spin). A failed slice lets the others end
        (their trials are sound) before ``StageFailed`` is raised."""
        ended = _Slice.first_to_end(running)
        try:
            run_ids.append(ended.result())
        except StageFailed:
            while running:
                with contextlib.suppress(StageFailed):
                    run_ids.append(_Slice.first_to_end(running).result())
            raise
        if running:
            held.update(k.key for k in grid_.keys(ended.span))
        return bool(running) or not ended.made_no_progress(progress())

    try:
        while True:
            if not running:
                held.clear()
            work = pending(exp, store, settings)
            for r in running:  # its keys are its own: the next slice is planned without them
                work = work.without(functools.partial(grid_.covers, r.span))
            if held:
                work = work.without(lambda k: k.key in held)
            if not work:
                if not running:
                    break
                if not finish_one():  # then plan again: its failures may be due now
                    break
                continue
            if cut := interrupted():  # also while sleeping for the window
                raise Interrupted(cut)
            now = dt.datetime.now(dt.UTC)
            why = blocker(exp, store, settings, now) or fit_blocker(
                exp, work.keys, store, settings, now
            )
            if why and not work.grades and running:
                if not finish_one():  # blocked now: what it ran decides what comes next
                    break
                continue
            # Grades missing (a crash between a trial and its grade) are graded whatever blocks
            # a start: the trials run grades every finished attempt, and starts no trial while
            # blocked.
            if why and not work.grades and why.startswith(WINDOW_REASONS) and window_wait:
                say(f"waiting ({len(work.keys)} trials): {why}")
                # Closed: until it opens. Open, but no trial fits: until it closes (then closed).
                wake = (
                    window.next_open(now)
                    if why.startswith("eval_window")
                    else window.closes_at(now)
                )
                sleep(min(60.0, max(1.0, ((wake or now) - now).total_seconds())))
                continue
            if why and not work.grades:
                say(f"not starting {len(work.keys)} trials: {why}")
                break
            if work.grades:
                say(f"grading {len(work.grades)} finished trial(s) that have no grade")
            # While starts are blocked the run only grades; else it covers the next slice of work.
            due = work.grades if why else work.keys + work.grades
            span = trials_span(exp, due, settings.run_partitions)
            assert span is not None  # due is not empty
            if not running and span.last:
                # One slice holds all that is due: this process runs it (and the index).
                before = progress()
                execute("trials", due)
                if progress() == before:
                    break  # nothing could start (e.g. the window closed as it began): don't spin
                continue
            if len(running) == 2 or any(grid_.overlap(r.span, span) for r in running):
                # Two at once are enough to keep the slots busy; a relaunch's ragged rectangles
                # that share a partition go one at a time.
                if not finish_one():
                    break
                continue
            # Several slices: each runs in a process of its own, and the next one's run is made
            # and started while this one still works, so the slots go on at once where they
            # would wait for this run's tail and the next one's creation (docs/architecture.md,
            # "Between slices"). The runs share the experiment's `parallel` (queue/slots.py);
            # none of them writes the index, which runs once when the last has ended.
            running.append(_Slice.start(exp, span, progress()))
            started.append(running[-1])
            indexed = False
    finally:
        _Slice.stop(started)  # an interrupt or a failure: no slice's process outlives this
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

    return with_signals(exp, stages)


def with_signals(exp: ResolvedExperiment, work: Callable[[], T], own_runs: bool = False) -> T:
    """``work()`` in a worker thread, SIGINT and SIGTERM turned into ``interrupt`` (see ``drive``).

    After an interrupt it waits ``INTERRUPT_GRACE_S`` for ``work`` to end, marks failed the
    experiment's runs still in flight (``own_runs``: only those this process created, as a
    slice's process does beside its siblings) and raises ``Interrupted``.
    """
    if threading.current_thread() is not threading.main_thread():
        return work()  # signals reach only the main thread: nothing to catch here
    done: dict[str, Any] = {}

    def worker() -> None:
        try:
            done["result"] = work()
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
            _Slice.kill_left()  # a slice process the worker thread has not stopped in time
            # A slice's process killed after its grace leaves its run in flight, so this looks
            # even when the worker thread ended.
            raise Interrupted(why, _fail_runs_in_flight(exp, why, own_runs))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if "error" in done:
        raise done["error"]
    result: T = done["result"]
    return result


def _fail_runs_in_flight(exp: ResolvedExperiment, why: str, own_runs: bool) -> list[str]:
    """Mark failed the runs of ``exp`` this process leaves behind, so ``resume`` may start.

    ``resume`` refuses beside a run in flight, and this one's process is about to exit.
    ``own_runs``: only the runs this process created (``TAG_CREATOR``).
    """
    from hangar_dagster.orchestration.sensors import IN_FLIGHT
    from hangar_dagster.orchestration.stages import TAG_EXPERIMENT

    failed = []
    with dg.DagsterInstance.get() as instance:
        for run in instance.get_runs(dg.RunsFilter(tags={TAG_EXPERIMENT: exp.experiment_id})):
            if own_runs and _creator_pid(run.tags.get(TAG_CREATOR)) != os.getpid():
                continue
            if run.status in IN_FLIGHT:
                instance.report_run_failed(run, f"{why}; its process exited")
                failed.append(run.run_id)
    return failed


def _creator_pid(tag: str | None) -> int | None:
    try:
        return int(json.loads(tag)["pid"]) if tag else None
    except (ValueError, KeyError, TypeError):
        return None
