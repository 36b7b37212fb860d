"""Grades pipelined behind trials (issue 16 item 3): makespan against the fed-pool bound.

    HANGAR_EVAL_WINDOW=always .venv/bin/python benchmarks/pipeline.py [--mix skewed|trivial|both]

Each mix is the bundled example's ten task repos under one `command` harness (a stand-in for
an agent: it sleeps a set time, then adds one file, so that the sealed grade runs the hidden
tests on a real patch), run with `hangar experiment run --wait` (real Dagster runs):

- skewed: 3 trials of each task, parallel 3; the agent's sleep depends on the task (0.7 s to
  10 s: median 1.3 s, max 10 s; the longest task is the last in partition order, the worst
  case for a run that starts keys in order). Run twice as two experiments with reuse off:
  the first has no history (keys start in partition order), the second knows each task's
  duration from the first (same pin set and tasks) and starts the longest work first.
- trivial: 10 trials of each task (100), parallel 3, the agent adding its file with no sleep.

From the stored records of each experiment: work = a trial's duration_s + its grade's
duration_s; makespan = first trial start -> last grade stored; the ideal fed-pool bound =
max(longest work, sum of work / slots); busy = sum of work / (slots x makespan). Goals:
skewed makespan <= 1.05 x the bound (with history), trivial busy >= 90%.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.reuse import run_wait  # noqa: E402

EXAMPLE = ROOT / "examples" / "skills-ab"
# Seconds the agent sleeps per task, in the example's task order: median 1.3, max 10 (last).
SKEWED = [0.9, 1.3, 0.7, 1.2, 2.0, 1.3, 1.5, 4.0, 1.0, 10.0]


def agent_command(sleeps: dict[str, float] | None) -> str:
    """A shell command: sleep the task's time (none: no sleep), then add a file (the patch)."""
    wait = ""
    if sleeps:
        cases = " ".join(f"{task}) sleep {s};;" for task, s in sleeps.items())
        wait = f'case "$HANGAR_TASK" in {cases} esac; '
    return wait + "echo bench > hangar_bench.txt"


def make_spec(work: Path, name: str, trials: int, sleeps: dict[str, float] | None) -> Path:
    from hangar_dagster.experiment.harness import freeze

    example = work / "example"
    if not example.exists():
        shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("repos", "__pycache__"))
        subprocess.run(
            [sys.executable, str(example / "make_repos.py"), "--out", str(example / "repos")],
            check=True,
            capture_output=True,
        )
    src = work / f"{name}-harness"
    src.mkdir()
    manifest = {
        "name": name,
        "agent": {
            "adapter": "command",
            "command": agent_command(sleeps),
            "cli": "sh",
            "version": "1",
        },
        "model": "scripted-2026-01-01",  # a stand-in: no model is called
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    lock = freeze(src, work / "registry")
    spec: dict[str, Any] = yaml.safe_load((example / "experiment.yaml").read_text())
    spec.pop("baseline", None)
    spec.update(
        name=name,
        harness_repo=str(work / "registry"),
        variants={"bench": {"harness_lock": lock.ref}},
        trials=trials,
        parallel=3,
        reuse={"enabled": False},  # every trial runs: the point is to time them
    )
    path = example / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def measure(home: Path, name: str, slots: int) -> dict[str, float]:
    import duckdb

    con = duckdb.connect(str(home / "hangar.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT t.started_at, t.duration_s, g.graded_at, g.duration_s FROM trials t "
        "JOIN grades g USING (experiment_id, trial_key, attempt) "
        "JOIN experiments e USING (experiment_id) WHERE e.name = ?",
        [name],
    ).fetchall()
    con.close()
    work = [t + g for _, t, _, g in rows]
    start = min(r[0] for r in rows)
    end = max(r[2] for r in rows)
    makespan = (end - start).total_seconds()
    bound = max(max(work), sum(work) / slots)
    return {
        "trials": len(rows),
        "work_s": sum(work),
        "trial_median_s": statistics.median(t for _, t, _, _ in rows),
        "longest_s": max(work),
        "makespan_s": makespan,
        "bound_s": bound,
        "ratio": makespan / bound,
        "busy": sum(work) / (slots * makespan),
    }


def cpu_children() -> float:
    """CPU seconds of the finished child processes (each `hangar` command and what it ran)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def show(label: str, wall: float, m: dict[str, float], cpu: float) -> None:
    print(
        f"{label:<28} trials {m['trials']:>4.0f}  wall {wall:7.1f} s  work {m['work_s']:7.1f} s"
        f"  trial median {m['trial_median_s']:5.2f} s  longest {m['longest_s']:5.2f} s"
        f"  makespan {m['makespan_s']:6.1f} s  bound {m['bound_s']:6.1f} s"
        f"  ratio {m['ratio']:5.3f}  busy {m['busy']:5.1%}  CPU {cpu:6.1f} s"
        f"  load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mix", choices=["skewed", "trivial", "both"], default="both")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="hangar-bench-pipeline-") as tmp:
        work = Path(tmp)
        home = work / "home"
        tasks = [
            t["id"] for t in yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())["tasks"]
        ]
        if args.mix in ("skewed", "both"):
            sleeps = dict(zip(tasks, SKEWED, strict=True))
            spec = make_spec(work, "skewed", 3, sleeps)
            for label in ("skewed, no history", "skewed, with history"):
                cpu = cpu_children()
                _, wall = run_wait(home, spec)
                name = str(yaml.safe_load(spec.read_text())["name"])
                show(label, wall, measure(home, name, 3), cpu_children() - cpu)
                if label.endswith("no history"):
                    # the same pin set and tasks again, as a new experiment (new name)
                    text = spec.read_text().replace("name: skewed", "name: skewed-again")
                    spec = spec.with_name("skewed-again.yaml")
                    spec.write_text(text)
        if args.mix in ("trivial", "both"):
            spec = make_spec(work, "trivial", 10, None)
            cpu = cpu_children()
            _, wall = run_wait(home, spec)
            name = "trivial"
            show("trivial, 100 trials", wall, measure(home, name, 3), cpu_children() - cpu)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
