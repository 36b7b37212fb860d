"""Hangar beside Inspect AI on the same trivial work (issue 16 item 5): fixed and marginal cost.

    .venv/bin/python benchmarks/inspect_compare.py [--rounds R] [--parallel 3] [--sizes 20 100]

The trivial work is benchmarks/pipeline.py's: the bundled example's ten task repos, an agent
command that adds one file (``echo bench > hangar_bench.txt``), then the task's hidden tests.
N trials cycle through the ten tasks (N / 10 each). The two sides:

- hangar: ``hangar experiment run --wait`` (real Dagster runs, ``HANGAR_EVAL_WINDOW=always``,
  reuse off, a fresh ``HANGAR_HOME`` per run) with the `command` harness: per trial a clean
  clone at the base commit, the agent in a sandbox, the visible verify in a sandbox, and the
  sealed grade (hidden tests in a sandbox), every record stored; per experiment the submit and
  a base check per task.
- Inspect AI (``inspect-ai`` pinned below, in its own virtualenv, cached under
  ``$HANGAR_TEST_CACHE`` or ``~/.cache/hangar-tests``): benchmarks/inspect_task.py, ``inspect
  eval`` with ``--model mockllm/model`` and the ``local`` sandbox: per sample two commands on
  the host, no isolation (the repo's files at base copied in + the agent; pytest on the hidden
  tests with the python of hangar's runner environment, the pytest hangar's grade runs).

The same concurrency on both: hangar ``parallel: P``, Inspect ``--max-samples P
--max-subprocesses P --max-sandboxes P``. Runs are interleaved: per round hangar N1, Inspect N1,
hangar N2, Inspect N2. Each run prints its wall time, the CPU seconds of the command and its
children, the machine's busy CPU seconds (all processes, /proc/stat) and the load average at
its start and end. Per tool, wall = fixed + marginal x N by least squares over all runs (with
one run at each of two sizes, exactly marginal = (W100 - W20) / 80, fixed = W20 - 20 x
marginal); the goal: hangar's marginal at most 2x Inspect's.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INSPECT_VERSION = "0.3.285"
INSPECT_TASK = Path(__file__).with_name("inspect_task.py")
GOAL = 2.0  # hangar's marginal cost per trial at most this many times Inspect's
TOOLS = ("hangar", "inspect")
TASKS_IN_EXAMPLE = 10


@dataclass(frozen=True)
class Run:
    tool: str
    n: int
    round: int
    wall_s: float
    cpu_s: float  # the command and its children
    machine_cpu_s: float  # every process on the machine, while the run lasted
    load_start: float
    load_end: float


@dataclass(frozen=True)
class Fit:
    fixed: float
    marginal: float


def fit(points: Sequence[tuple[int, float]]) -> Fit:
    """``value = fixed + marginal x N`` by least squares over (N, value) points."""
    if len({n for n, _ in points}) < 2:
        raise ValueError(
            f"a fit needs runs at two sizes at least (--sizes); got N = {sorted({n for n, _ in points})}"
        )
    slope, intercept = statistics.linear_regression(
        [float(n) for n, _ in points], [v for _, v in points]
    )
    return Fit(fixed=intercept, marginal=slope)


def schedule(rounds: int, sizes: Sequence[int]) -> list[tuple[int, str, int]]:
    """(round, tool, N) in run order: each size by both tools in turn, round after round."""
    return [(r, tool, n) for r in range(1, rounds + 1) for n in sizes for tool in TOOLS]


def busy_cpu_s(proc_stat: str, hz: int) -> float:
    """The machine's busy CPU seconds since boot from /proc/stat's ``cpu`` line (not idle/iowait)."""
    fields = proc_stat.splitlines()[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"/proc/stat: first line is not the `cpu` total: {fields[:3]}")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / hz


def machine_cpu_s() -> float:
    return busy_cpu_s(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))


def samples_for(n: int, tasks: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """N samples cycling through the tasks, as hangar's N / len(tasks) trials of each."""
    if n % len(tasks):
        raise ValueError(f"--sizes: {n} is not a multiple of the {len(tasks)} tasks")
    return [tasks[i % len(tasks)] for i in range(n)]


def inspect_log_problem(log: dict[str, Any], n: int) -> str | None:
    """What is wrong with an Inspect eval log of N samples, or None: every sample ran pytest."""
    if log.get("status") != "success":
        return f"status {log.get('status')!r}: {str(log.get('error'))[:2000]}"
    samples = log.get("samples") or []
    if len(samples) != n:
        return f"{len(samples)} samples in the log, {n} expected"
    # pytest's exit code: 0 all passed, 1 some failed; anything else means no tests ran.
    codes = []
    for sample in samples:
        score = (sample.get("scores") or {}).get("hidden_tests") or {}
        codes.append((score.get("metadata") or {}).get("returncode"))
    bad = [code for code in codes if code not in (0, 1)]
    if bad:
        return f"{len(bad)} samples' pytest did not run the hidden tests (exit codes {bad[:5]})"
    return None


def cache_root() -> Path:
    return Path(os.environ.get("HANGAR_TEST_CACHE") or Path.home() / ".cache" / "hangar-tests")


def inspect_venv(version: str = INSPECT_VERSION) -> Path:
    """A virtualenv with inspect-ai==VERSION from PyPI, made once per version; never hangar's."""
    venv = cache_root() / f"inspect-ai-{version}"
    done = venv / "hangar-complete"
    if done.exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)  # what an interrupted install left
    print(f"installing inspect-ai=={version} into {venv} (once per version)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"inspect-ai=={version}"],
        check=True,
    )
    done.write_text(version)
    return venv


def prepare(work: Path, sizes: Sequence[int], rounds: int, parallel: int) -> dict[str, Any]:
    """Hangar's specs (one experiment per run) and Inspect's configs, made before any timing."""
    import yaml

    from benchmarks.pipeline import agent_command, make_spec

    specs = {}
    for r in range(1, rounds + 1):
        for n in sizes:
            spec = make_spec(work, f"hangar{n}-r{r}", n // TASKS_IN_EXAMPLE, None)
            data = yaml.safe_load(spec.read_text())
            data["parallel"] = parallel
            spec.write_text(yaml.safe_dump(data))
            specs[(r, n)] = spec
    example = work / "example"  # make_spec copied the example and built its repos
    tasks = []
    for t in yaml.safe_load((example / "experiment.yaml").read_text())["tasks"]:
        base = work / "inspect-base" / t["id"]  # the repo's files at `base`, no .git
        base.mkdir(parents=True)
        tar = subprocess.run(
            ["git", "-C", str(example / t["repo"]), "archive", t["base"]],
            check=True,
            capture_output=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(base, filter="data")
        tasks.append(
            {"task": t["id"], "base": str(base), "hidden": str(example / t["hidden_tests"])}
        )
    if len(tasks) != TASKS_IN_EXAMPLE:
        raise SystemExit(
            f"{example}/experiment.yaml: {len(tasks)} tasks, {TASKS_IN_EXAMPLE} expected"
        )
    configs, python = {}, str(runner_python(work))
    for n in sizes:
        config = work / f"inspect{n}.json"
        config.write_text(
            json.dumps(
                {
                    "samples": samples_for(n, tasks),
                    "agent": agent_command(None),
                    "python": python,
                }
            )
        )
        configs[n] = config
    task_file = work / "inspect-task" / INSPECT_TASK.name  # Inspect loads it from a temp dir
    task_file.parent.mkdir()
    shutil.copyfile(INSPECT_TASK, task_file)
    return {"specs": specs, "configs": configs, "task_file": task_file}


def runner_python(work: Path) -> Path:
    """The python of hangar's runner environment: the pytest that hangar's verify and grade run."""
    from hangar_dagster.environment.runner import ensure_runner
    from hangar_dagster.settings import Settings

    runner = ensure_runner(Settings.from_env({"HANGAR_HOME": str(work / "runner-home")}))
    return runner.root / "venv" / "bin" / "python"


def run_hangar(home: Path, spec: Path) -> None:
    from benchmarks.reuse import run_wait

    run_wait(home, spec)


def hangar_detail(home: Path, spec: Path, n: int, parallel: int) -> str:
    """From the stored records: where a hangar run's time went (after the timing)."""
    import yaml

    from benchmarks.pipeline import measure

    m = measure(home, str(yaml.safe_load(spec.read_text())["name"]), parallel)
    if m["trials"] != n:
        raise SystemExit(f"{spec.name}: {m['trials']:.0f} graded trials stored, {n} expected")
    return (
        f"stored: trial + grade per trial {m['work_s'] / n:.2f} s (/ {parallel} slots:"
        f" {m['work_s'] / n / parallel:.2f} s), trial median {m['trial_median_s']:.2f} s,"
        f" first trial start -> last grade {m['makespan_s']:.1f} s, slots busy {m['busy']:.1%}"
    )


def run_inspect(work: Path, venv: Path, prep: dict[str, Any], n: int, r: int, p: int) -> None:
    logs = work / f"inspect-logs-{n}-r{r}"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    result = subprocess.run(
        [
            str(venv / "bin" / "inspect"),
            "eval",
            prep["task_file"].name,  # relative to the cwd: Inspect globs it
            "--model",
            "mockllm/model",
            "-T",
            f"config={prep['configs'][n]}",
            "--max-samples",
            str(p),
            "--max-subprocesses",
            str(p),
            "--max-sandboxes",
            str(p),
            "--log-dir",
            str(logs),
            "--log-format",
            "json",
            "--display",
            "none",
        ],
        cwd=prep["task_file"].parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"inspect eval failed ({result.returncode}):\n{result.stderr[-3000:]}")
    found = sorted(logs.glob("*.json"))
    if len(found) != 1:
        raise SystemExit(f"{logs}: {len(found)} eval logs, one expected")
    problem = inspect_log_problem(json.loads(found[0].read_text()), n)
    if problem:
        raise SystemExit(f"inspect, N = {n}: {problem} ({found[0]})")


def timed(tool: str, n: int, r: int, body: Callable[[], None]) -> Run:
    from benchmarks.pipeline import cpu_children

    load_start, cpu, machine = os.getloadavg()[0], cpu_children(), machine_cpu_s()
    started = time.monotonic()
    body()
    return Run(
        tool=tool,
        n=n,
        round=r,
        wall_s=time.monotonic() - started,
        cpu_s=cpu_children() - cpu,
        machine_cpu_s=machine_cpu_s() - machine,
        load_start=load_start,
        load_end=os.getloadavg()[0],
    )


def report(runs: Sequence[Run], goal: float = GOAL) -> list[str]:
    """The summary lines: each tool's fixed and marginal wall and CPU, the ratios, the goal."""
    sizes = sorted({run.n for run in runs})
    if len(sizes) == 2 and len(runs) == 2 * len(TOOLS):  # one run per tool and size
        how = f"two points: marginal = (W{sizes[1]} - W{sizes[0]}) / {sizes[1] - sizes[0]}"
    else:
        how = f"least squares over {len(runs) // len(TOOLS)} runs per tool"
    lines = [f"fit: wall (and CPU) = fixed + marginal x N, {how}"]
    fits: dict[str, tuple[Fit, Fit]] = {}
    for tool in TOOLS:
        mine = [run for run in runs if run.tool == tool]
        wall = fit([(run.n, run.wall_s) for run in mine])
        cpu = fit([(run.n, run.cpu_s) for run in mine])
        fits[tool] = (wall, cpu)
        lines.append(
            f"{tool:8} fixed {wall.fixed:6.1f} s  marginal {wall.marginal:6.3f} s/trial"
            f"   CPU: fixed {cpu.fixed:6.1f} s  marginal {cpu.marginal:6.3f} s/trial"
        )
    ratio = fits["hangar"][0].marginal / fits["inspect"][0].marginal
    cpu_ratio = fits["hangar"][1].marginal / fits["inspect"][1].marginal
    lines.append(f"marginal wall per trial, hangar / inspect: {ratio:.1f}x (CPU: {cpu_ratio:.1f}x)")
    for n in sizes:
        walls = {
            tool: statistics.mean(run.wall_s for run in runs if run.tool == tool and run.n == n)
            for tool in TOOLS
        }
        lines.append(
            f"N = {n}: wall hangar {walls['hangar']:.1f} s, inspect {walls['inspect']:.1f} s: "
            f"{walls['hangar'] / walls['inspect']:.1f}x"
        )
    held = "holds" if ratio <= goal else "NOT met"
    lines.append(f"goal: hangar's marginal cost per trial at most {goal:g}x Inspect's: {held}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 100])
    args = parser.parse_args()
    os.environ["HANGAR_EVAL_WINDOW"] = "always"
    venv = inspect_venv()
    p = args.parallel
    print(
        f"inspect-ai {INSPECT_VERSION} ({venv}); concurrency {p} on both: hangar parallel {p}, "
        f"inspect --max-samples {p} --max-subprocesses {p} --max-sandboxes {p}; "
        f"{os.cpu_count()} CPUs; load average at start {os.getloadavg()}",
        flush=True,
    )
    runs = []
    with tempfile.TemporaryDirectory(prefix="hangar-bench-inspect-") as tmp:
        work = Path(tmp)
        prep = prepare(work, args.sizes, args.rounds, p)
        for r, tool, n in schedule(args.rounds, args.sizes):
            spec = prep["specs"][(r, n)]
            # A fresh home per run: every run pays the same fixed costs.
            home = work / f"home-{spec.stem}"
            if tool == "hangar":
                run = timed(tool, n, r, functools.partial(run_hangar, home, spec))
            else:
                run = timed(tool, n, r, functools.partial(run_inspect, work, venv, prep, n, r, p))
            runs.append(run)
            print(
                f"round {r}  {tool:8} N {n:4d}  wall {run.wall_s:7.1f} s  CPU {run.cpu_s:6.1f} s"
                f"  machine CPU {run.machine_cpu_s:6.1f} s  load {run.load_start:.1f} ->"
                f" {run.load_end:.1f}",
                flush=True,
            )
            if tool == "hangar":
                print(f"    {hangar_detail(home, spec, n, p)}", flush=True)
    print("\n".join(report(runs)))
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
