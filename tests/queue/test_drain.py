"""The end-of-window drain cancels each trial while it is drainable, and only then.

A trial whose agent is still running when the drain lands ends ``infra_error /
power_down`` with its sandbox's processes gone and runs again; a trial whose
agent had already finished keeps its outcome: its verify is not cut short, it
is stored and graded, and it never runs again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.experiment.submit import load_resolved, submit
from hangar_dagster.orchestration.sensors import drain_all
from hangar_dagster.queue.drain import DrainWatcher
from hangar_dagster.queue.starts import pending
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.trials.agents import AgentRun
from hangar_dagster.trials.trial import InfraError, TrialRequest, _drained
from tests.conftest import FIX_MEDIAN, cli_env, command_agent_spec, write_spec

pytestmark = pytest.mark.unit


def test_the_watcher_cancels_every_trial_it_handed_out() -> None:
    go = threading.Event()
    asked: list[object] = []

    def reason(now: object) -> str | None:
        asked.append(now)
        return "power_down: drain requested" if go.is_set() else None

    with DrainWatcher(reason, interval_s=0.01) as watcher:
        running = [watcher.trial_cancel(), watcher.trial_cancel()]
        assert not any(e.is_set() for e in running) and not watcher.cancel.is_set()
        go.set()
        assert watcher.cancel.wait(5)
        late = watcher.trial_cancel()  # a trial starting after the drain is born cancelled
        asks = len(asked)
        time.sleep(0.05)
    assert all(e.is_set() for e in running) and late.is_set()
    assert watcher.why == "power_down: drain requested"
    assert len(asked) == asks, "once drained the watcher stops asking"


def test_an_interrupt_cuts_trials_off_as_interrupted_not_power_down(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    go = threading.Event()
    why = "interrupted: SIGINT to pid 1"
    with DrainWatcher(lambda _now: why if go.is_set() else None, interval_s=0.01) as watcher:
        running = watcher.trial_cancel()
        go.set()
        assert watcher.cancel.wait(5)
        late = watcher.trial_cancel()
    for cancel in (running, late):
        req = TrialRequest(exp, exp.trial_keys()[0], 1, None, "run-1", cancel=cancel)
        with pytest.raises(InfraError) as cut:
            _drained(req)
        assert cut.value.reason == "interrupted" and "runs again on resume" in str(cut.value)


def agent_run(exit_code: int | None, **kw: bool) -> AgentRun:
    return AgentRun(exit_code, kw.get("timed_out", False), [], 0, 0, 0, 0.0, {}, "", None,
                    kw.get("budget_stopped", False))  # fmt: skip


def test_after_its_agent_ended_by_itself_a_trial_is_not_drained(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    cancel = threading.Event()
    req = TrialRequest(exp, exp.trial_keys()[0], 1, None, "run-1", cancel=cancel)
    _drained(req)  # not set: nothing happens
    cancel.set()
    with pytest.raises(InfraError) as before_agent:
        _drained(req)
    assert before_agent.value.reason == "power_down"
    with pytest.raises(InfraError):
        _drained(req, agent_run(None))  # the drain stopped the agent: no exit code of its own
    # The agent got there first: its exit, its time limit or its budget is the outcome.
    for ended in (agent_run(0), agent_run(1), agent_run(None, timed_out=True)):
        _drained(req, ended)
    _drained(req, agent_run(None, budget_stopped=True))


# Replicate 1's first attempt runs until the drain (with a double-forked child that left its
# session); every other attempt fixes the bug. Verify waits for the test to release it, once
# the drain has stopped replicate 1.
RELEASE = ".release-verify"
AGENT_SH = """case "$HANGAR_SEED" in
  */1:1) setsid sh -c 'sleep 600; : {token}' & sh -c 'sleep 600; : {token}'; exit 0;;
esac
""" + FIX_MEDIAN  # fmt: skip


def processes_with(token: str) -> list[int]:
    """Host pids whose command line holds ``token`` (sandboxed processes are visible here too)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry.name))
    return found


def wait_until(ready: object, seconds: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + seconds
    while not ready():  # type: ignore[operator]
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate(timeout=60) if proc.poll() is None else ("", "")
            raise AssertionError(f"gave up waiting (exit {proc.returncode}): {out}{err}")
        time.sleep(0.1)


@pytest.mark.slow
def test_drain_stops_a_running_agent_and_spares_a_trial_in_verify(
    example_dir: Path, tmp_path: Path
) -> None:
    token = f"hangar-drain-{uuid.uuid4().hex}"
    spec = command_agent_spec(
        example_dir,
        tmp_path,
        "drain-race",
        "sh $HANGAR_HARNESS_DIR/agent.sh",
        {"agent.sh": AGENT_SH.format(token=token)},
    )
    spec.update(trials=2, parallel=2)
    spec["tasks"][0]["verify"] = (
        f": verify-{token}; while [ ! -e {RELEASE} ]; do sleep 0.1; done; python -m pytest -q tests"
    )
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("hangar")), "experiment", "run", "--wait"]
        + [str(write_spec(example_dir, spec))],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Replicate 2's agent has finished and its verify runs; replicate 1's agent still runs.
        wait_until(lambda: processes_with(f"verify-{token}"), 300, proc)
        assert processes_with(f": {token}"), "replicate 1's agent should still be running"
        with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
            assert len(drain_all(instance, HangarPaths(home))) == 1  # the schedule's own call
        artifacts = home / "artifacts"
        wait_until(lambda: list(artifacts.glob("*/*__1/attempt-1/trace.json")), 60, proc)
        assert processes_with(f": {token}") == [], "the drained sandbox left processes behind"
        assert processes_with(f"verify-{token}"), "replicate 2's verify goes on after the drain"
        [repo] = (home / "work").glob("*__median__2-a1-*/repo")
        (repo / RELEASE).touch()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, out + err

    experiment_id = out.split("submitted ")[1].split()[0]
    store = Store(HangarPaths(home))
    attempts = {(t.replicate, t.attempt): t for t in store.trials(experiment_id, all_attempts=True)}
    assert sorted(attempts) == [(1, 1), (1, 2), (2, 1)], "the trial in verify never runs again"
    stopped, retried, kept = attempts[(1, 1)], attempts[(1, 2)], attempts[(2, 1)]
    assert (stopped.outcome_class, stopped.infra_reason) == ("infra_error", "power_down")
    assert stopped.duration_s < 120
    assert (retried.outcome_class, retried.retry_of) == ("completed", stopped.run_id)
    # The kept trial was in verify when the drain stopped replicate 1; verify ran to its end.
    assert (kept.outcome_class, kept.infra_reason) == ("completed", None)
    assert kept.run_id == stopped.run_id and kept.finished_at > stopped.finished_at
    assert (kept.verify_exit_code, kept.verify_passed) == (0, True)
    grades = {(g.replicate, g.attempt): g for g in store.grades(experiment_id, all_attempts=True)}
    assert grades[(2, 1)].passed is True
    assert not pending(load_resolved(HangarPaths(home), experiment_id), store, Settings.from_env())
