"""The trial budget stop: reported cost is summed as it streams and the agent is stopped past the cap."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.environment.egress import NO_EGRESS
from hangar_dagster.experiment.harness import HarnessLock
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.retries import plan_retries
from hangar_dagster.settings import Settings
from hangar_dagster.trials.agents import AgentContext
from hangar_dagster.trials.agents.command import CommandAgent
from hangar_dagster.trials.agents.live import MAX_LINE, LiveUsage
from hangar_dagster.trials.sandbox import get_sandbox
from hangar_dagster.trials.trial import TrialRequest, run_trial
from tests.conftest import command_agent_spec, write_spec
from tests.gitfixtures import make_clone
from tests.trials.agents.test_command import make_lock

pytestmark = pytest.mark.unit
needs_bwrap = pytest.mark.needs_sandbox("bwrap")

USAGE = '{"type": "usage", "tokens_in": 10, "cost_usd": 0.1}'
# Spends 0.1 USD every 0.1 s for a minute unless something stops it.
SPENDER = (
    "i=0; while [ $i -lt 600 ]; do "
    f"printf '%s\\n' '{USAGE}' >> \"$HANGAR_TRACE_OUT\"; sleep 0.1; i=$((i+1)); done"
)


def _ctx(
    tmp_path: Path, cap: float | None, lock: HarnessLock | None = None, workdir: Path | None = None
) -> AgentContext:
    return AgentContext(
        trial_key="v/t/1",
        task_id="t",
        seed="s",
        workdir=workdir or tmp_path,
        harness=lock if lock is not None else HarnessLock("h", "0" * 64, tmp_path, {}),
        model="m-2025-01-01",
        instructions="do it",
        verify=None,
        timeout_s=60,
        memory_mb=1024,
        sandbox=get_sandbox("bwrap"),
        egress=NO_EGRESS,
        out_dir=tmp_path / "out",
        settings=Settings.from_env(),
        max_cost_usd=cap,
    )


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def test_cost_is_summed_across_chunks_and_the_agent_cancelled_once_past_the_cap(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path, cap=0.25)
    watcher = LiveUsage(ctx)
    stream = b"not json\n" + _line({"type": "turn"}) + _line(json.loads(USAGE)) * 2
    for i in range(0, len(stream), 7):  # lines split anywhere
        watcher.feed(stream[i : i + 7])
    assert watcher.cost_usd == pytest.approx(0.2)
    assert not watcher.stopped and not ctx.cancel.is_set()  # at the cap is not past it
    watcher.feed(_line({"type": "usage", "cost_usd": 0.05}))
    assert not ctx.cancel.is_set()
    watcher.feed(_line({"type": "usage", "cost_usd": 0.01})[:-1])
    assert not ctx.cancel.is_set()  # the line is not complete yet
    watcher.feed(b"\n")
    assert watcher.stopped and ctx.cancel.is_set()


def test_running_totals_keep_the_highest_and_no_cap_never_stops(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, cap=None)

    def total(event: dict[str, Any]) -> float | None:
        value = event.get("total_cost_usd")
        return float(value) if isinstance(value, int | float) else None

    watcher = LiveUsage(ctx, cost_of=total, running_total=True)
    for value in (0.5, 2.0, 1.5, "x"):
        watcher.feed(_line({"total_cost_usd": value}))
    assert watcher.cost_usd == 2.0 and not watcher.stopped and not ctx.cancel.is_set()


def test_an_overlong_line_is_skipped_not_buffered(tmp_path: Path) -> None:
    watcher = LiveUsage(_ctx(tmp_path, cap=1.0))
    watcher.feed(b'{"type": "usage", "cost_usd": 5, "pad": "' + b"x" * (MAX_LINE + 10))
    watcher.feed(b'"}\n' + _line({"type": "usage", "cost_usd": 0.5}))
    assert watcher.cost_usd == 0.5 and not watcher.stopped


def test_following_a_file_starts_over_when_the_agent_replaces_it(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(_line({"type": "usage", "cost_usd": 0.75}) * 2)
    watcher = LiveUsage(_ctx(tmp_path, cap=None))
    with watcher.follow(trace, interval_s=0.01):
        deadline = time.monotonic() + 5
        while watcher.cost_usd < 1.5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.cost_usd == 1.5
        replacement = tmp_path / "new.jsonl"
        replacement.write_bytes(_line({"type": "usage", "cost_usd": 0.25}))
        os.replace(replacement, trace)
    assert watcher.cost_usd == 0.25  # what the adapter's final read of the file will count
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(_line({"type": "usage", "cost_usd": 9}))
    trace.unlink()
    trace.symlink_to(elsewhere)
    with watcher.follow(trace, interval_s=0.01):  # a symlink is never followed
        time.sleep(0.05)
    assert watcher.cost_usd == 0.25


@needs_bwrap
def test_the_command_adapter_is_stopped_soon_after_passing_the_cap(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, SPENDER)
    clone, _ = make_clone(tmp_path)
    ctx = _ctx(tmp_path, cap=0.35, lock=lock, workdir=clone)
    started = time.monotonic()
    run = CommandAgent().run(ctx)
    assert time.monotonic() - started < 15  # not the minute it would otherwise spend
    assert run.budget_stopped and run.exit_code is None and not run.timed_out
    assert 0.35 < run.cost_usd < 1.5
    assert run.error is not None and "max_cost_usd (0.35 USD)" in run.error


@needs_bwrap
def test_a_trial_past_its_budget_ends_budget_exceeded_keeps_its_patch_and_is_not_retried(
    example_dir: Path, tmp_path: Path, hangar_home: Path
) -> None:
    command = f"echo '# partial work' >> stats.py; {SPENDER}"
    spec = command_agent_spec(example_dir, tmp_path, "spender", command)
    spec["trial_job_budget"] = {"max_cost_usd": 0.35}
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    (key,) = exp.trial_keys()
    record, patch = run_trial(TrialRequest(exp, key, 1, None, "run-live"), Settings.from_env())
    assert record.outcome_class == "budget_exceeded", record.error
    assert record.infra_reason is None and record.trace["budget_stopped"] is True
    assert record.duration_s < 30
    assert "# partial work" in patch and record.changed_files == ["stats.py"]
    assert 0.35 < record.cost_usd < 1.5
    assert plan_retries([record], 1, Settings.from_env().infra_retries).retries == []
