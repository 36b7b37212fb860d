"""Chaos: kill hangar's processes and drain at random instants, then check what the store kept.

Run by hand from the checkout's root (it builds its own example, harness and homes under a
temporary directory, and uses the scripted `command` stand-in agent, no model):

    HANGAR_EVAL_WINDOW=always .venv/bin/python -m tests.chaos --rounds 20 [--seed S] [--modes ...]

Each round submits a small experiment (the example's `median` task, ``--trials`` trials in
parallel) into a fresh ``HANGAR_HOME`` and, at an instant drawn uniformly over one run's span,
does one of:

- ``worker``: SIGKILL the process group of ``hangar experiment run --wait`` (under ``--wait``
  the CLI is the run worker: the stage runs and their sandboxes die with it);
- ``drain``: ask every trials run in flight to drain (the end-of-window drain's marker);
- ``ui-worker``: with ``hangar ui`` driving, SIGKILL the run worker of the run in flight;
- ``daemon``: with ``hangar ui`` driving, SIGKILL its ``dagster-daemon``;
- ``ui``: SIGKILL ``hangar ui``'s whole process group (webserver, daemon, code server, run
  worker at once), then start ``hangar ui`` again.

It records the stage the instant fell in (spec, pin_sets, base_checks, mid-trial, mid-verify,
mid-grade, trials (other), index, or between runs), lets the experiment finish by itself
(``run --wait`` to its end, or the daemon) and, if it does not, runs ``hangar experiment
resume`` once, saying which. Then it checks the store: no finished trial lost (every attempt
stored at the kill is still there, unchanged), no counted trial ungraded, no key with two
counted attempts, attempt numbers without gaps, Parquet and DuckDB holding the same rows, and
the experiment complete. The seed is printed first; the same seed draws the same modes and
instants (the machine's timing still varies). Exit 1 if any round broke a rule.
tests/orchestration/test_chaos.py runs it with a few rounds; docs/operations.md ("Chaos")
records the figures of the last run by hand.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("worker", "drain", "ui-worker", "daemon", "ui")
UI_MODES = frozenset({"ui-worker", "daemon", "ui"})
# The stages a kill is aimed at (``--aim``, the default): the round waits until the run is
# seen in the stage, then a random fraction of a second more, and kills. A drain only acts on
# a trials run, so it is aimed at the trials stages alone.
# The spec runs in the pin sets' run (its first step), the index in the last trials run (its
# last step: ``stage_now`` reads the run's step events to tell it).
STAGES = ("pin_sets", "base_checks", "mid-trial", "mid-verify", "mid-grade", "index")
TRIAL_STAGES = ("mid-trial", "mid-verify", "mid-grade")
AIM_DELAY_S = 0.8  # the kill lands uniformly within this long after the stage is first seen
AGENT = "sleep 1.5\n"  # long enough that a kill can land mid-agent; the fix follows


@dataclass
class Round:
    n: int
    mode: str
    at_s: float  # drawn over the span (uniform draws); for an aimed kill, when it landed
    aim: str = ""  # the stage the kill is aimed at ("": an instant drawn over the span)
    delay_s: float = 0.0  # for an aimed kill: how long after the stage was first seen
    stage: str = "?"
    outcome: str = "?"
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    run_s: float = 0.0  # how long the first run (`run --wait`) lasted
    complete: bool = False  # complete before any resume
    kept: set[tuple[Any, ...]] = field(default_factory=set)  # trials stored at the kill


# --- the world of one run ---------------------------------------------------------------------
def example(work: Path) -> Path:
    from tests.conftest import copy_example

    return copy_example(work / "example" / "skills-ab")


def spec_file(example_dir: Path, work: Path, trials: int) -> Path:
    from tests.conftest import FIX_MEDIAN, command_agent_spec, write_spec

    spec = command_agent_spec(
        example_dir,
        work,
        "chaos",
        "sh $HANGAR_HARNESS_DIR/agent.sh",
        {"agent.sh": AGENT + FIX_MEDIAN},
    )
    spec.update(trials=trials, parallel=trials)
    return write_spec(example_dir, spec)


def env_of(home: Path) -> dict[str, str]:
    from tests.conftest import cli_env

    return cli_env(home)


def hangar_exe() -> str:
    return str(Path(sys.executable).with_name("hangar"))


def cmdline(pid: int) -> list[str]:
    from hangar_dagster.util.procs import cmdline as of

    return of(pid)


def tree(root: int) -> list[list[str]]:
    from hangar_dagster.util.procs import descendants

    return [c for p in descendants(root) if (c := cmdline(p.pid))]


def _runs(home: Path) -> list[tuple[str, str, dict[str, str]]]:
    """(run id, status, tags) of every run in the home's Dagster run storage.

    Read with sqlite3, read-only, never through a DagsterInstance: opening an instance creates
    and stamps its storages, and one opened while the CLI creates them stamped the schedule
    storage twice ("more than one head"; seen in CI). Before the CLI made the tables: none.
    """
    import sqlite3

    db = home / "dagster" / "history" / "runs.db"
    if not db.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            runs = conn.execute("SELECT run_id, status FROM runs").fetchall()
            tags = conn.execute("SELECT run_id, key, value FROM run_tags").fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):  # the CLI has not made them yet: no run
            return []
        raise  # (a lock is waited for up to the timeout; past it the round says so)
    by_run: dict[str, dict[str, str]] = {}
    for run_id, key, value in tags:
        by_run.setdefault(run_id, {})[key] = value
    return [(run_id, status, by_run.get(run_id, {})) for run_id, status in runs]


def in_flight(home: Path, experiment_id: str | None) -> list[tuple[str, str]]:
    """(run id, stage) of the experiment's runs in flight."""
    from hangar_dagster.orchestration.stages import TAG_EXPERIMENT, TAG_STAGE

    flying = {"NOT_STARTED", "QUEUED", "STARTING", "STARTED"}
    return [
        (run_id, tags.get(TAG_STAGE, "?"))
        for run_id, status, tags in _runs(home)
        if status in flying and (experiment_id is None or tags.get(TAG_EXPERIMENT) == experiment_id)
    ]


def index_done(home: Path, experiment_id: str) -> bool:
    """Whether a run that writes the experiment's index succeeded (the last trials run, or an
    index run alone: the experiment ended)."""
    from hangar_dagster.orchestration.stages import TAG_EXPERIMENT, writes_index

    return any(
        status == "SUCCESS" and tags.get(TAG_EXPERIMENT) == experiment_id and writes_index(tags)
        for _, status, tags in _runs(home)
    )


def step_now(home: Path, run_id: str) -> str:
    """The step the run started last and has not ended ("" if none), from its event log (read
    only with sqlite3, as ``_runs``)."""
    import sqlite3

    db = home / "dagster" / "history" / "runs" / f"{run_id}.db"
    if not db.exists():
        return ""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            rows = conn.execute(
                "SELECT step_key, dagster_event_type FROM event_logs WHERE dagster_event_type "
                "IN ('STEP_START', 'STEP_SUCCESS', 'STEP_FAILURE', 'STEP_SKIPPED') ORDER BY id"
            ).fetchall()
    except sqlite3.OperationalError:  # not made yet, or locked past the timeout: unknown
        return ""
    started = [k for k, e in rows if e == "STEP_START"]
    ended = {k for k, e in rows if e != "STEP_START"}
    return next((k for k in reversed(started) if k not in ended), "")


def stage_now(home: Path, experiment_id: str | None, root: int) -> str:
    """Which stage the instant falls in, from the runs in flight and the processes below ``root``."""
    flying = in_flight(home, experiment_id)
    stages = {s for _, s in flying}
    if not stages:
        return "between runs"
    if "trials" not in stages:
        return sorted(stages)[0]
    if any(step_now(home, run_id).endswith("__index") for run_id, s in flying if s == "trials"):
        return "index"
    procs = [" ".join(c) for c in tree(root)]
    if any("hangar-grade" in c or "hangar_grade" in c for c in procs):
        return "mid-grade"
    if any(c.startswith("sleep 1.5") for c in procs):
        return "mid-trial"
    if any("pytest -q tests" in c for c in procs):
        return "mid-verify"
    return "trials (other)"


def experiment_id_of(home: Path) -> str | None:
    exps = home / "experiments"
    ids = sorted(p.name for p in exps.iterdir()) if exps.exists() else []
    return ids[0] if ids else None


def listed_state(home: Path, experiment_id: str) -> str:
    import json

    done = subprocess.run(
        [hangar_exe(), "experiment", "list", "--json"],
        env=env_of(home),
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows = {r["experiment_id"]: r for r in json.loads(done.stdout or "[]")}
    return str(rows.get(experiment_id, {}).get("state", "?"))


# --- the store --------------------------------------------------------------------------------
def parquet_rows(home: Path, table: str) -> set[tuple[Any, ...]]:
    import pyarrow.parquet as pq

    cols = (
        ["trial_key", "attempt", "outcome_class", "infra_reason", "run_id"]
        if table == "trials"
        else ["trial_key", "attempt", "passed", "run_id"]
    )
    root = home / "parquet" / table
    out = set()
    for f in sorted(root.rglob("*.parquet")) if root.exists() else []:
        t = pq.read_table(f, columns=cols).to_pylist()
        out |= {tuple(r[c] for c in cols) for r in t}
    return out


def check_store(
    home: Path, experiment_id: str, planned: int, kept: set[tuple[Any, ...]]
) -> list[str]:
    import duckdb

    problems = []
    trials = parquet_rows(home, "trials")
    grades = parquet_rows(home, "grades")
    if lost := kept - trials:
        problems.append(f"finished trials lost or changed: {sorted(lost)}")
    con = duckdb.connect(str(home / "hangar.duckdb"), read_only=True)
    try:
        db_trials = set(
            con.execute(
                "SELECT trial_key, attempt, outcome_class, infra_reason, run_id FROM trials"
            ).fetchall()
        )
        db_grades = set(
            con.execute("SELECT trial_key, attempt, passed, run_id FROM grades").fetchall()
        )
        index = con.execute(
            "SELECT trial_key, outcome_class, passed, task_invalid FROM experiment_index "
            "WHERE experiment_id = ?",
            [experiment_id],
        ).fetchall()
    finally:
        con.close()
    if db_trials != trials or db_grades != grades:
        problems.append(
            f"Parquet and DuckDB disagree: trials only in Parquet {sorted(trials - db_trials)}, "
            f"only in DuckDB {sorted(db_trials - trials)}; grades only in Parquet "
            f"{sorted(grades - db_grades)}, only in DuckDB {sorted(db_grades - grades)}"
        )
    if len(index) != planned:
        problems.append(f"{len(index)} trial keys in the index, {planned} planned")
    ungraded = [k for k, o, p, inv in index if o != "infra_error" and p is None and not inv]
    if ungraded:
        problems.append(f"counted trials without a grade: {ungraded}")
    if failed := [k for k, o, _, _ in index if o == "infra_error"]:
        problems.append(f"keys whose counted attempt is an infra_error: {failed}")
    by_key: dict[str, list[tuple[int, str]]] = {}
    for key, attempt, outcome, _, _ in trials:
        by_key.setdefault(key, []).append((attempt, outcome))
    for key, rows in sorted(by_key.items()):
        numbers = sorted(a for a, _ in rows)
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"{key}: attempt numbers with a gap or twice: {numbers}")
        if (counted := sum(1 for _, o in rows if o != "infra_error")) > 1:
            problems.append(f"{key}: {counted} counted attempts")
    graded = Counter((k, a) for k, a, _, _ in grades)
    if twice := [ka for ka, n in graded.items() if n > 1]:
        problems.append(f"attempts graded twice: {twice}")
    return problems


# --- one round --------------------------------------------------------------------------------
def reach(
    r: Round, home: Path, root: int, t0: float, ended: Callable[[], bool], limit: float
) -> str:
    """Wait for the kill's instant; the stage the kill lands in ("after the end": the run
    finished first; "missed <stage>": an aimed stage was never seen, so no kill)."""
    if not r.aim:
        time.sleep(max(0.0, r.at_s - (time.monotonic() - t0)))
        return "after the end" if ended() else stage_now(home, experiment_id_of(home), root)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not ended():
        if stage_now(home, experiment_id_of(home), root) == r.aim:
            time.sleep(r.delay_s)
            r.at_s = round(time.monotonic() - t0, 2)
            return "after the end" if ended() else stage_now(home, experiment_id_of(home), root)
        time.sleep(0.05)
    r.at_s = round(time.monotonic() - t0, 2)
    return f"missed {r.aim}"


def wait_for(pred: Callable[[], bool], seconds: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def start_ui(home: Path, log: Path) -> subprocess.Popen[bytes]:
    from tests.conftest import start_ui as start

    return start(home, log, seconds=300)


def stop_ui(proc: subprocess.Popen[bytes]) -> None:
    from tests.conftest import stop_ui as stop

    if proc.poll() is None:
        stop(proc)


def resume(home: Path, experiment_id: str, r: Round, timeout: float) -> None:
    done = subprocess.run(
        [hangar_exe(), "experiment", "resume", experiment_id],
        env=env_of(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    r.outcome += f"; then one resume (exit {done.returncode})"
    if done.returncode != 0:
        r.problems.append(f"resume exit {done.returncode}: {done.stderr[-1500:]}")


def round_cli(r: Round, home: Path, spec: Path, timeout: float) -> str:
    """``worker`` and ``drain``: under ``hangar experiment run --wait`` (no daemon)."""
    from hangar_dagster.queue.drain import request_drain
    from hangar_dagster.settings import HangarPaths

    t0 = time.monotonic()
    proc = subprocess.Popen(
        [hangar_exe(), "experiment", "run", str(spec), "--wait"],
        env=env_of(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        r.stage = reach(r, home, proc.pid, t0, lambda: proc.poll() is not None, timeout)
        eid = experiment_id_of(home)
        if r.stage != "after the end" and not r.stage.startswith("missed"):
            if r.mode == "worker":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                for run_id, stage in in_flight(home, eid):
                    if stage == "trials":
                        request_drain(HangarPaths(home), run_id)
            r.kept = parquet_rows(home, "trials")
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    r.run_s = time.monotonic() - t0
    r.outcome = f"run --wait exit {code}"
    r.complete = code == 0  # run --wait exits 0 only when complete (docs/operations.md)
    return experiment_id_of(home) or ""


def round_ui(r: Round, home: Path, spec: Path, timeout: float) -> str:
    """``ui-worker``, ``daemon``, ``ui``: the daemon drives the experiment."""
    from hangar_dagster.queue.liveness import read_run_process
    from hangar_dagster.settings import HangarPaths

    log = home.parent / f"ui-{r.n}.log"
    home.mkdir(parents=True)
    ui = start_ui(home, log)
    try:
        sub = subprocess.run(
            [hangar_exe(), "experiment", "run", str(spec)],
            env=env_of(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        eid = sub.stdout.split("submitted ")[1].split()[0] if "submitted " in sub.stdout else ""
        if not eid:
            r.problems.append(f"submit failed: {sub.stderr[-1500:]}")
            return ""
        t0 = time.monotonic()
        r.stage = reach(
            r, home, ui.pid, t0, lambda: ui.poll() is not None or index_done(home, eid), timeout
        )
        r.kept = parquet_rows(home, "trials")  # a moment before the kill: all of it must stay
        if ui.poll() is not None:  # before any kill of ours: say so, and start it again
            r.problems.append(
                f"`hangar ui` exited by itself (code {ui.returncode}) before the kill; its log:"
                f" {log} (tail: {log.read_text(errors='replace')[-600:]!r})"
            )
            ui = start_ui(home, log)
            r.outcome = "UI exited by itself; started again"
        elif r.stage == "after the end" or r.stage.startswith("missed"):
            r.outcome = "nothing killed"
        elif r.mode == "ui":
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
            ui = start_ui(home, log)
            r.outcome = "UI killed and started again"
        elif r.mode == "daemon":
            daemons = [p.pid for p in _descendants(ui.pid) if _is_daemon(p.pid)]
            for pid in daemons:
                os.kill(pid, signal.SIGKILL)
            if not wait_for(lambda: ui.poll() is None and _has_daemon(ui.pid), 20, 1.0):
                stop_ui(ui)  # dagster dev does not restart its daemon: the operator restarts the UI
                ui = start_ui(home, log)
                r.outcome = f"daemon killed ({len(daemons)}), UI started again"
            else:
                r.outcome = f"daemon killed ({len(daemons)})"
        else:
            workers = [
                rec.pid
                for run_id, _ in in_flight(home, eid)
                if (rec := read_run_process(HangarPaths(home), run_id)) is not None
            ]
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            r.outcome = f"run worker killed ({len(workers)})"
        r.complete = wait_for(lambda: listed_state(home, eid) == "complete", timeout, 3.0)
        return eid
    finally:
        stop_ui(ui)


def _descendants(pid: int) -> list[Any]:
    from hangar_dagster.util.procs import descendants

    return list(descendants(pid))


def _is_daemon(pid: int) -> bool:
    # `dagster dev` starts it as `python -m dagster._daemon run`; by hand it is `dagster-daemon`
    return any(a == "dagster._daemon" or a.endswith("dagster-daemon") for a in cmdline(pid)[:4])


def _has_daemon(pid: int) -> bool:
    return any(_is_daemon(p.pid) for p in _descendants(pid))


def one_round(r: Round, work: Path, spec: Path, planned: int, timeout: float) -> Round:
    home = work / f"round-{r.n}" / "home"
    t0 = time.monotonic()
    eid = (round_ui if r.mode in UI_MODES else round_cli)(r, home, spec, timeout)
    if not eid:
        r.problems.append("no experiment was submitted")
        return r
    if r.complete:
        r.outcome += "; complete without a person"
    else:
        resume(home, eid, r, timeout)
    if (state := listed_state(home, eid)) != "complete":
        r.problems.append(f"experiment {state}, not complete, after one resume")
    r.problems += check_store(home, eid, planned, r.kept)
    r.seconds = time.monotonic() - t0
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated of {MODES}")
    ap.add_argument("--trials", type=int, default=2, help="trials of the experiment (parallel)")
    ap.add_argument(
        "--span",
        type=float,
        default=None,
        help="seconds the instants are drawn over "
        "(default: measured by one undisturbed run --wait first)",
    )
    ap.add_argument(
        "--draw",
        choices=("aim", "uniform"),
        default="aim",
        help="aim: each round's kill aimed at a stage, every stage in turn (shuffled), at a"
        " random instant within it; uniform: an instant drawn over one run's span",
    )
    ap.add_argument("--timeout", type=float, default=420, help="seconds a round may take to end")
    ap.add_argument(
        "--work", type=Path, default=None, help="keep the homes here (default: a temp dir)"
    )
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: unknown {bad}; choose from {', '.join(MODES)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"chaos: seed {seed}, {args.rounds} rounds, modes {','.join(modes)}", flush=True)
    rng = random.Random(seed)
    os.environ["HANGAR_EVAL_WINDOW"] = "always"
    with tempfile.TemporaryDirectory(prefix="hangar-chaos-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        spec = spec_file(example(work), work, args.trials)
        span = args.span or 0.0
        if args.span is None and args.draw == "uniform":
            control = one_round(Round(0, "worker", 10**6), work, spec, args.trials, args.timeout)
            span = control.run_s
            print(
                f"control: an undisturbed run --wait took {span:.1f}s; problems {control.problems}"
            )
            if control.problems:
                return 1
        rounds = []
        aims: list[str] = []
        for n in range(1, args.rounds + 1):
            mode = rng.choice(modes)
            if args.draw == "uniform":
                r = Round(n, mode, round(rng.uniform(0, span), 2))
            else:
                if not aims:  # every stage once, in a fresh order, before any stage again
                    aims = rng.sample(STAGES, len(STAGES))
                aim = aims.pop()
                if mode == "drain" and aim not in TRIAL_STAGES:
                    aim = rng.choice(TRIAL_STAGES)
                r = Round(n, mode, 0.0, aim=aim, delay_s=round(rng.uniform(0, AIM_DELAY_S), 2))
            one_round(r, work, spec, args.trials, args.timeout)
            rounds.append(r)
            aimed = f"aimed at {r.aim} +{r.delay_s}s, " if r.aim else ""
            print(
                f"round {n}: {r.mode} ({aimed}at {r.at_s}s, in {r.stage}): {r.outcome}"
                f" [{r.seconds:.0f}s]" + (f" PROBLEMS: {r.problems}" if r.problems else ""),
                flush=True,
            )
    broken = [r for r in rounds if r.problems]
    drawn = f"span {span:.1f}s" if args.draw == "uniform" else "aimed at every stage in turn"
    print(f"chaos: seed {seed}; {drawn}; {len(rounds)} rounds, {len(broken)} broken")
    print("  kills by mode:", dict(sorted(Counter(r.mode for r in rounds).items())))
    print("  by stage:", dict(sorted(Counter(r.stage for r in rounds).items())))
    print(
        "  by mode and stage:", dict(sorted(Counter(f"{r.mode}@{r.stage}" for r in rounds).items()))
    )
    print(
        "  outcomes:",
        dict(sorted(Counter(r.outcome.split("; ", 1)[-1] for r in rounds).items())),
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
