"""Slices overlap in ``run --wait``: the next slice's run is made and started while the one before
still works, their trials share the experiment's ``parallel``, and the index is written once
after the last (docs/architecture.md, "Between slices")."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.orchestration.stages import (
    RANGE_END,
    RANGE_START,
    TAG_EXPERIMENT,
    TAG_INDEX,
    TAG_STAGE,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths
from tests.conftest import cli_env, command_agent_spec, hangar, stage_succeeded, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.needs_sandbox("bwrap")]


def most_at_once(spans: list[tuple[dt.datetime, dt.datetime]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = most = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def test_slices_overlap_share_parallel_and_write_the_index_once(
    example_dir: Path, tmp_path: Path
) -> None:
    # Long enough that the second slice's process has made its run before the first trial ends,
    # even on a loaded machine (a slice's process imports Dagster: seconds).
    spec = command_agent_spec(example_dir, tmp_path, "overlap", "sleep 12")
    spec.update(trials=4, parallel=1)
    home = tmp_path / "h"
    ran = hangar(
        "experiment",
        "run",
        str(write_spec(example_dir, spec)),
        "--wait",
        home=home,
        env={"HANGAR_RUN_PARTITIONS": "1"},  # one key per slice: four slices
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    store = Store(HangarPaths(home))
    (exp,) = store.experiments()
    trials = store.trials(exp.experiment_id, all_attempts=True)
    assert sorted((t.trial_key, t.attempt) for t in trials) == [
        (f"overlap/median/{r}", 1) for r in range(1, 5)
    ]
    assert {g.trial_key for g in store.grades(exp.experiment_id)} == {t.trial_key for t in trials}
    # Four runs, one trial each, never two at once: the runs share the spec's parallel.
    assert most_at_once([(t.started_at, t.finished_at) for t in trials]) == 1

    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        records = instance.get_run_records(
            dg.RunsFilter(tags={TAG_EXPERIMENT: exp.experiment_id, TAG_STAGE: "trials"})
        )
    runs = sorted(records, key=lambda r: r.create_timestamp)
    assert [r.dagster_run.status for r in runs] == [dg.DagsterRunStatus.SUCCESS] * 4
    ranges = [(r.dagster_run.tags[RANGE_START], r.dagster_run.tags[RANGE_END]) for r in runs]
    assert len(set(ranges)) == 4, ranges  # each slice its own partition
    assert {r.dagster_run.tags[TAG_INDEX] for r in runs} == {"false"}
    # The first two slices' runs are made at once; the second's trial starts in the first run's
    # tail: its slot did not wait for that run's materializations, grades step and end. (Later
    # boundaries overlap too when a slice's process is ready before the slice beside it ends,
    # which is a matter of load: docs/performance.md measures them.)
    first, second = runs[0], runs[1]
    assert second.create_timestamp.timestamp() < first.end_time  # type: ignore[operator]
    ended = {r.dagster_run.run_id: r.end_time for r in runs}
    by_start = sorted(trials, key=lambda t: t.started_at)
    assert by_start[1].started_at.timestamp() < ended[by_start[0].run_id]  # type: ignore[operator]
    assert stage_succeeded(home, exp.experiment_id, "index")  # once, after the last slice


def slice_processes() -> list[int]:
    from hangar_dagster.util.procs import all_procs, cmdline

    module = "hangar_dagster.orchestration.slice_run"
    return [p.pid for p in all_procs() if module in cmdline(p.pid)]


def test_sigterm_stops_both_slices_leaves_no_run_in_flight_and_resume_finishes(
    example_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    # The one slot runs a trial (every first attempt sleeps; which slice's process is ready first
    # decides which key) while the other slice's run waits beside it for the slot.
    spec = command_agent_spec(
        example_dir, tmp_path, "overlap-stop", "sh $HANGAR_HARNESS_DIR/agent.sh",
        {"agent.sh": 'case "$HANGAR_SEED" in *:1) sleep 10;; esac\n'},
    )  # fmt: skip
    spec.update(trials=3, parallel=1)
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("hangar")), "experiment", "run"]
        + [str(write_spec(example_dir, spec)), "--wait"],
        env=cli_env(home) | {"HANGAR_RUN_PARTITIONS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the signal goes to the CLI alone: it stops its slices itself
    )
    try:
        deadline = time.monotonic() + 300
        while not list(home.glob("artifacts/*/*/attempt-1/started.json")) or (
            len(slice_processes()) < 2
        ):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(3)  # slice 2's run is made and waits for the slot
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out + err
    assert slice_processes() == [], "a slice's process outlived the command"
    eid = out.split("submitted ")[1].split()[0]
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        runs = instance.get_runs(dg.RunsFilter(tags={TAG_EXPERIMENT: eid}))
    assert [r.run_id for r in runs if not r.is_finished] == []
    assert len([r for r in runs if r.tags.get(TAG_STAGE) == "trials"]) == 2
    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    assert [(a["attempt"], a["outcome_class"], a["infra_reason"]) for a in got["attempts"]] == [
        (1, "infra_error", "interrupted")
    ], "the trial waiting for the slot never started"

    resumed = hangar("experiment", "resume", eid, home=home, env={"HANGAR_RUN_PARTITIONS": "1"})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    assert got["queue"]["complete"] is True
    assert [(v["trials"], v["graded"]) for v in got["summary"]] == [(3, 3)]
