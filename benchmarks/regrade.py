"""What a regrade costs against running the trials again: 100 stored trials.

    .venv/bin/python benchmarks/regrade.py [--trials 25]

In one fresh ``HANGAR_HOME`` (``HANGAR_EVAL_WINDOW=always``), the bundled example narrowed to two
tasks (median, durations), both variants, ``--trials`` each (25: 100 trials):

1. ``hangar experiment run SPEC --wait``: the trials run and are graded. This is what running
   them again costs (the same spec with reuse off: every trial runs);
2. the grader changes (``grader.timeout_s``) and ``hangar experiment regrade EXP --spec NEW``
   grades every stored patch again, no agent run.

``--keep DIR`` keeps the home in DIR: run again with the same DIR, the first step is not run
again (its wall time and experiment are read from DIR/run.json) and only a regrade is timed,
each under another ``timeout_s`` (a regrade under a grader already regraded would go on with it).

Prints both wall times with their CPU seconds (the CLI and its children) and the load average
at each one's start and end, their ratio, the trials, and how many distinct patches the regrade
graded (each once). The figures go into docs/performance.md ("Regrade (issue 15 item 2)").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.reuse import hangar, run_wait  # noqa: E402
from tests.conftest import copy_example  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--keep", type=Path, help="keep the home here; reuse its run if there")
    args = parser.parse_args()
    trials = args.trials
    work = args.keep or Path(tempfile.mkdtemp(prefix="hangar-regrade-bench-"))
    kept = work / "run.json"
    try:
        if not kept.exists():
            shutil.rmtree(work / "example", ignore_errors=True)
            shutil.rmtree(work / "home", ignore_errors=True)
            copy_example(work / "example")
        ex = work / "example"  # the tests' 3-task cut, its repos made
        data: dict[str, Any] = yaml.safe_load((ex / "experiment.yaml").read_text())
        data["tasks"] = [t for t in data["tasks"] if t["id"] in ("median", "durations")]
        data.update(trials=trials, reuse={"enabled": False})
        first = ex / "first.yaml"
        first.write_text(yaml.safe_dump(data))
        done = json.loads(kept.read_text()) if kept.exists() else {"regrades": 0}
        data["grader"]["timeout_s"] = 301 + done["regrades"]
        changed = ex / "changed.yaml"
        changed.write_text(yaml.safe_dump(data))
        home = work / "home"

        if "eid" in done:
            eid, run_s, run_cpu = done["eid"], done["run_s"], done.get("run_cpu")
        else:
            cpu = children_cpu()
            load = os.getloadavg()[0]
            eid, run_s = run_wait(home, first)
            run_cpu = children_cpu() - cpu
            print(f"rerun: load {load:.1f} at its start, {os.getloadavg()[0]:.1f} at its end")
        done |= {"eid": eid, "run_s": run_s, "run_cpu": run_cpu, "regrades": done["regrades"] + 1}
        if args.keep:
            kept.write_text(json.dumps(done))

        started, cpu, load = time.monotonic(), children_cpu(), os.getloadavg()[0]
        again = hangar(home, "experiment", "regrade", eid, "--spec", str(changed))
        regrade_s = time.monotonic() - started
        regrade_cpu = children_cpu() - cpu
        print(f"regrade: load {load:.1f} at its start, {os.getloadavg()[0]:.1f} at its end")
        if again.returncode != 0:
            raise SystemExit(f"the regrade failed ({again.returncode}):\n{again.stderr[-3000:]}")
        new = again.stdout.split("submitted ")[1].split(":")[0]
        old = json.loads(hangar(home, "experiment", "get", eid, "--json").stdout)
        got = json.loads(hangar(home, "experiment", "get", new, "--json").stdout)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    n = len(old["trials"])
    distinct = {(a["task"], a["patch_sha256"]) for a in old["attempts"]}
    agents = sum(1 for a in got["attempts"] if not a.get("reused_from"))
    same = {r["variant"]: r["pass_rate_pts"] for r in old["summary"]} == {
        r["variant"]: r["pass_rate_pts"] for r in got["summary"]
    }
    cpu_said = f"{run_cpu:7.1f} s CPU" if run_cpu is not None else "(CPU not recorded)"
    print(f"run --wait of {n} trials (= running them again): {run_s:7.1f} s, {cpu_said}")
    print(
        f"regrade of the {n} stored patches:             {regrade_s:7.1f} s, {regrade_cpu:7.1f} s CPU"
    )
    print(f"regrade / rerun: {regrade_s / run_s:.3f}   (goal: under 0.10)")
    print(f"distinct patches graded: {len(distinct)}; agent runs in the regrade: {agents}")
    print(f"pass rates unchanged by a timeout-only grader change: {same}")


def children_cpu() -> float:
    """User + system CPU seconds of the ended child processes (the CLI and what it waited for:
    the grader and sandbox runs); the machine is shared, so CPU is reported beside wall."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


if __name__ == "__main__":
    main()
