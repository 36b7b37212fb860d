"""The real daemon on a short eval window: the window's opening schedule starts a waiting
experiment's trials, the running trial is drained at the window's end and retried (with
retry_of) in the next window."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import duckdb
import pytest

from tests.conftest import cli_env, command_agent_spec, hangar, write_spec

pytestmark = pytest.mark.slow

# Seconds from submitting to the window's opening: the UI starts and the driver sensor runs the
# three setup stages (one run each) before it, or the opening schedule skips them.
SETUP_LEAD_S = 75

# Fixes the example's median task (a command agent's script, run in the clone).
FIX_MEDIAN = """python - <<'PY'
import pathlib
p = pathlib.Path("stats.py")
fix = "    if len(ordered) % 2 == 0:\\n        return (ordered[mid - 1] + ordered[mid]) / 2\\n"
p.write_text(p.read_text().replace("    return ordered[mid]", fix + "    return ordered[mid]"))
PY
"""
# Attempt 1 outlives the window; a retry fixes the bug at once.
AGENT_SH = (
    """case "$HANGAR_SEED" in *:1) sleep 600;; esac
"""
    + FIX_MEDIAN
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def window_opening_after(seconds: float, minutes: int) -> tuple[str, dt.datetime]:
    """A window (New York time) opening at the first whole minute ``seconds`` from now."""
    at = dt.datetime.now(ZoneInfo("America/New_York")) + dt.timedelta(seconds=seconds, minutes=1)
    start = at.replace(second=0, microsecond=0)
    end = start + dt.timedelta(minutes=minutes)
    return f"{start:%H:%M}-{end:%H:%M}", start


def start_ui(home: Path, window: str, log: Path) -> subprocess.Popen[bytes]:
    env = cli_env(home) | {"HANGAR_EVAL_WINDOW": window}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("hangar")), "ui", "--port", str(free_port())],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not answers(home):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    return proc


def answers(home: Path) -> bool:
    url = home / "webserver.url"
    try:
        with urllib.request.urlopen(url.read_text().strip() + "/server_info", timeout=5):
            return True
    except OSError:
        return False


def stop_ui(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def attempts(home: Path) -> list[tuple[int, str, str | None, str, str | None]]:
    if not (home / "hangar.duckdb").exists():
        return []
    try:
        con = duckdb.connect(str(home / "hangar.duckdb"), read_only=True)
    except duckdb.Error:
        return []  # a writer holds it this instant
    try:
        return con.execute(
            "select attempt, outcome_class, infra_reason, run_id, retry_of from trials order by attempt"
        ).fetchall()
    finally:
        con.close()


def wait_for(
    home: Path, done: object, seconds: float, log: Path
) -> list[tuple[int, str, str | None, str, str | None]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = attempts(home)
        if done(rows):  # type: ignore[operator]
            return rows
        time.sleep(2)
    raise AssertionError(f"timed out; attempts: {attempts(home)}\n{log.read_text()[-4000:]}")


def test_opened_by_the_schedule_drained_at_window_end_then_retried_next_window(
    example_dir: Path, tmp_path: Path
) -> None:
    spec = command_agent_spec(
        example_dir, tmp_path, "drain-me", "sh $HANGAR_HARNESS_DIR/agent.sh", {"agent.sh": AGENT_SH}
    )
    spec.update(parallel=1)
    spec["environment"]["resources"]["timeout_s"] = 900
    spec_path = write_spec(example_dir, spec)
    home, log = tmp_path / "home", tmp_path / "ui.log"

    # Submitted before the window opens; the daemon runs its setup stages meanwhile (time enough
    # for the UI to start and them to finish), and the opening schedule starts its trials.
    submitted = hangar("experiment", "run", str(spec_path), home=home)
    assert submitted.returncode == 0, submitted.stderr
    experiment_id = submitted.stdout.split("submitted ")[1].split()[0]
    window, opens = window_opening_after(seconds=SETUP_LEAD_S, minutes=1)
    ui = start_ui(home, window, log)
    try:
        rows = wait_for(home, lambda r: len(r) == 1, 600, log)
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

    ui = start_ui(home, "always", log)  # the next window
    try:
        rows = wait_for(home, lambda r: len(r) == 2, 300, log)
    finally:
        stop_ui(ui)
    first, second = rows
    assert second[:3] == (2, "completed", None)
    assert second[4] == first[3], "the retry names the drained attempt's run"
