"""`hangar experiment run --wait` and `resume` end saying what happened.

A finished trial left without a grade (a crash between the two) is graded by the next
`resume`; the exit code tells complete (0), refused (2), incomplete (3) and interrupted (130).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from hangar_dagster.results.schema import INDEX_REBUILD
from tests.conftest import cli_env, command_agent_spec, hangar, write_spec

pytestmark = pytest.mark.slow


def experiment_id_of(stdout: str) -> str:
    return stdout.split("submitted ")[1].split()[0]


def test_a_grade_lost_in_a_crash_is_graded_by_resume_and_counted(
    example_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    spec = write_spec(example_dir, command_agent_spec(example_dir, tmp_path, "regrade", "true"))
    ran = hangar("experiment", "run", str(spec), "--wait", home=home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    eid = experiment_id_of(ran.stdout)

    # The run worker died after the grader's per-test rows were written, before the grade row.
    [grade_file] = (home / "parquet" / "grades").rglob("*.parquet")
    grade_file.unlink()
    assert list((home / "parquet" / "grade_tests").rglob("*.parquet")), "the orphaned tests stay"
    con = duckdb.connect(str(home / "hangar.duckdb"))
    try:
        con.execute("DELETE FROM grades WHERE experiment_id = ?", [eid])
        # experiment_index is stored, refreshed in the grade row's own transaction: after such
        # a crash it never had the grade either
        for sql in INDEX_REBUILD:
            con.execute(sql)
    finally:
        con.close()

    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    assert got["queue"]["waiting_grades"] == 1 and got["queue"]["complete"] is False
    assert [v["graded"] for v in got["summary"]] == [0]
    text = hangar("experiment", "get", eid, home=home).stdout
    assert "1 trial waits for a grade; the pass rate is not final" in " ".join(text.split())
    listed = json.loads(hangar("experiment", "list", "--json", home=home).stdout)
    assert [(r["state"], r["waiting_grades"]) for r in listed] == [("waiting", 1)]

    resumed = hangar("experiment", "resume", eid, home=home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "grading 1 finished trial(s) that have no grade" in resumed.stdout
    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    assert got["queue"]["waiting_grades"] == 0 and got["queue"]["complete"] is True
    assert [(v["trials"], v["graded"]) for v in got["summary"]] == [(1, 1)]
    assert [t["attempt"] for t in got["attempts"]] == [1], "grading ran no trial again"
    [row] = got["trials"]
    assert row["passed"] is not None
    listed = json.loads(hangar("experiment", "list", "--json", home=home).stdout)
    assert [r["state"] for r in listed] == ["complete"]


def run_wait(spec: Path, home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("hangar")), "experiment", "run", str(spec), "--wait"],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the signal goes to the CLI alone, as `kill <pid>` sends it
    )


@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_starts_cuts_off_the_running_trial_and_says_how_to_resume(
    example_dir: Path, tmp_path: Path, signo: signal.Signals
) -> None:
    home = tmp_path / "home"
    # One trial at a time: the first sleeps, the second waits in the queue. Only trial 1's
    # first attempt sleeps (the trials start in key order): the resume's runs need not wait.
    spec = command_agent_spec(
        example_dir, tmp_path, f"stopped-{signo.name.lower()}", "sh $HANGAR_HARNESS_DIR/agent.sh",
        {"agent.sh": 'case "$HANGAR_SEED" in */1:1) sleep 20;; esac\n'},
    )  # fmt: skip
    spec.update(trials=2, parallel=1)
    proc = run_wait(write_spec(example_dir, spec), home)
    try:
        deadline = time.monotonic() + 300
        while not list(home.glob("artifacts/*/*/attempt-1/started.json")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(2)  # the agent is running
        proc.send_signal(signo)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = out + err
    assert proc.returncode == 130, said
    assert took < 12, f"took {took:.1f}s to stop"
    # ... and the running trial's sandbox died with it: its agent's `sleep 20` is gone.
    from hangar_dagster.util.procs import all_procs, cmdline

    agents = [p.pid for p in all_procs() if cmdline(p.pid) == ["sleep", "20"]]
    assert agents == [], f"the cut-off trial's agent still runs: pids {agents}"
    assert "Traceback" not in said and "DagsterExecutionInterruptedError" not in said, said
    eid = experiment_id_of(out)
    assert f"experiment resume {eid}" in " ".join(err.split())
    assert f"interrupted ({signo.name} to pid {proc.pid})" in " ".join(err.split())

    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    assert [(a["attempt"], a["outcome_class"], a["infra_reason"]) for a in got["attempts"]] == [
        (1, "infra_error", "interrupted")
    ], "the queued trial never started"
    assert got["queue"]["pending_trials"] == 2 and got["queue"]["complete"] is False
    if signo == signal.SIGTERM:
        return  # resume is the same for both; once is enough time
    resumed = hangar("experiment", "resume", eid, home=home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    by_key = {(a["trial_key"], a["attempt"]): a for a in got["attempts"]}
    [cut] = [k for k, a in by_key.items() if a["infra_reason"] == "interrupted"]
    again = by_key[(cut[0], 2)]
    assert again["outcome_class"] != "infra_error" and again["retry_of"] is not None
    assert got["queue"]["complete"] is True
    assert [(v["trials"], v["graded"]) for v in got["summary"]] == [(2, 2)]


# Every trial of this spec ends infra_error / egress_unsupported: the environment's default
# egress (allowlist) needs the package mirror, and the one named is no package index. The base
# check needs none (grader network none, no build), so it passes and the trial starts.
BROKEN_MIRROR = {"HANGAR_PACKAGE_MIRROR_URL": "ftp://mirror.invalid/simple/"}


def broken_build_spec(example_dir: Path, tmp_path: Path, name: str) -> Path:
    spec = command_agent_spec(example_dir, tmp_path, name, "true")
    spec["environment"] = {**spec.get("environment", {}), "egress": {"mode": "allowlist"}}
    return write_spec(example_dir, spec)


def assert_incomplete(ran: subprocess.CompletedProcess[str], reason: str, *also: str) -> None:
    """Exit 3, the reason printed as `incomplete: ...` (and ``also``), how to go on, no traceback."""
    said = " ".join(ran.stderr.split())
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert f"incomplete: {reason}" in said, said
    assert all(more in said for more in also), said
    assert "Traceback" not in ran.stdout + ran.stderr
    assert f"experiment resume {experiment_id_of(ran.stdout)}" in said


# One trial, so the retry cap is 1 retry (10%, at least one). A streak of 1 opens the breaker
# at the first failure; with 10 it stays shut, attempt 1's retry fails too and the cap stops a
# third (the per-key limit, 2 retries, would allow it).
@pytest.mark.parametrize(
    "stop, streak, said",
    [
        ("breaker", "1", ("1 trial(s) not run: outage:",)),
        ("retry-cap", "10", (
            "1 trial(s) ended as infra_error with no retry: retries stopped: 1 of 1 allowed",
            "no further trial of this experiment starts",
        )),
    ],
    ids=["breaker", "retry-cap"],
)  # fmt: skip
def test_a_run_stopped_by_the_breaker_or_the_retry_cap_exits_incomplete_and_says_why(
    example_dir: Path, tmp_path: Path, stop: str, streak: str, said: tuple[str, ...]
) -> None:
    spec = broken_build_spec(example_dir, tmp_path, f"broken-build-{stop}")
    env = {"HANGAR_OUTAGE_BREAKER_STREAK": streak, **BROKEN_MIRROR}
    ran = hangar("experiment", "run", str(spec), "--wait", home=tmp_path / "home", env=env)
    assert_incomplete(ran, *said)


def test_a_run_stopped_by_a_spent_budget_exits_incomplete_and_says_why(
    example_dir: Path, tmp_path: Path
) -> None:
    # Two trials, one at a time; each reports $5 (a `usage` event of the command agent's
    # trace). The author's $5 a month is spent by the first: the second does not start.
    usage = json.dumps({"type": "usage", "cost_usd": 5.0})
    spec = command_agent_spec(
        example_dir, tmp_path, "spent", f"echo '{usage}' >> \"$HANGAR_TRACE_OUT\""
    )
    spec.update(trials=2, parallel=1)
    env = {"HANGAR_EVAL_AUTHOR_CAP_USD_MONTH": "5"}
    ran = hangar(
        "experiment", "run", str(write_spec(example_dir, spec)), "--wait",
        home=tmp_path / "home", env=env,
    )  # fmt: skip
    assert_incomplete(ran, "1 trial(s) not run: budget: author ", "spent 5.00 of 5.00")


def test_with_no_window_wait_a_closed_window_ends_the_run_incomplete_naming_the_window(
    example_dir: Path, tmp_path: Path
) -> None:
    """Regression: `run --wait` (and `resume`) slept through a closed eval window with no way to
    get exit 3 ("waiting for the window") instead; a CI job could only time out."""
    import datetime as dt

    opens = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=6)).strftime("%H:%M")
    closes = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=6, minutes=1)).strftime("%H:%M")
    env = {"HANGAR_EVAL_WINDOW": f"{opens}-{closes}", "HANGAR_EVAL_TZ": "UTC"}
    spec = write_spec(example_dir, command_agent_spec(example_dir, tmp_path, "closed", "true"))
    home = tmp_path / "home"
    ran = hangar("experiment", "run", str(spec), "--wait", "--no-window-wait", home=home, env=env)
    assert_incomplete(ran, "1 trial(s) not run: eval_window: ", "next opens", f"{opens} UTC")
    # The trials are left pending: `resume` (here with the window open) runs them.
    resumed = hangar(
        "experiment", "resume", experiment_id_of(ran.stdout), home=home,
        env={"HANGAR_EVAL_WINDOW": "always"},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
