"""The bundled example on the Docker deployment (deploy/docker) against the embedded default.

    .venv/bin/python benchmarks/deploy_overhead.py [--trials 3] [--rounds 3] [--whole]

Brings the deployment up as the tests do (tests/deploy/compose.py: images cached by recipe, a
compose project of its own, removed at the end), then runs examples/skills-ab (3 tasks x 2
variants x --trials; --whole: as bundled, 80 trials) with the Docker sandbox from the project
image, --rounds times each way,
interleaved (deployment, embedded, deployment, embedded, ...) so a load that moves during the
run weighs on both alike; reuse is off, so every round runs every trial:

- deployment: `hangar experiment run SPEC` on the host, the daemon launching every stage run
  in a run worker container, results in the DuckLake store; timed from the submit to the
  moment the store has every trial graded and the run that writes the index has ended;
- embedded: `hangar experiment run SPEC --wait` on a fresh HANGAR_HOME (SQLite instance,
  embedded store, stages in the CLI's process).

Both run every trial in a Docker sandbox of the same image, so the sandbox's own start is in
both; per-trial overhead = (deployment wall - embedded wall) / trials, from the medians of the
rounds and from each round's pair, is what the deployment adds. Prints every round's walls,
the medians, the ratio, the per-trial overhead and the trials' own median duration in each;
the figures go into docs/performance.md. After each experiment it prints its stage runs'
timeline (benchmarks/stage_timeline.py: created, queued, launched, worker up, first step, end,
and the gap since the previous run's end) and the driver sensor's ticks, and beside each wall
the machine's busy CPU seconds meanwhile (every process, other users' too: read it with the
load average). Two sizes (--trials 1 and 3) separate the part per experiment from the part
per trial.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.inspect_compare import machine_cpu_s  # noqa: E402
from hangar_dagster.results.store import Store  # noqa: E402
from hangar_dagster.settings import Settings  # noqa: E402
from tests.conftest import copy_example  # noqa: E402
from tests.deploy.compose import Deployment, up  # noqa: E402

HANGAR = str(Path(sys.executable).with_name("hangar"))


def make_spec(example: Path, image: str, trials: int | None, name: str) -> tuple[Path, int]:
    """The example's spec on the Docker sandbox with ``trials`` (None: its own), reuse off;
    returns it with its number of trials."""
    data = yaml.safe_load((example / "experiment.yaml").read_text())
    data["environment"] |= {"sandbox": "docker", "image": image}
    data |= {"name": name, "reuse": {"enabled": False}}
    if trials is not None:
        data["trials"] = trials
    path = example / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, len(data["tasks"]) * len(data["variants"]) * int(data["trials"])


def print_timeline(env: dict[str, str], eid: str, submit: float) -> None:
    """The experiment's stage runs' timeline (benchmarks/stage_timeline.py) from its instance."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "stage_timeline.py"), eid, str(submit)],
        env=env,
        capture_output=True,
        text=True,
    )
    print(out.stdout + out.stderr[-2000:], flush=True)


def submitted(out: str) -> str:
    return out.split("submitted ")[1].split()[0]


def durations(store: Store, eid: str) -> list[float]:
    return [float(t.duration_s) for t in store.trials(eid)]


def on_deployment(dep: Deployment, spec: Path, planned: int) -> tuple[float, list[float]]:
    """Wall seconds from the submit to the experiment complete and indexed; trial durations."""
    env = dep.host_env()
    store = Store(Settings.from_env(env).paths)
    t0, submit = time.monotonic(), time.time()
    done = subprocess.run(
        [HANGAR, "experiment", "run", str(spec)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    eid = submitted(done.stdout)
    while True:
        if len(store.grades(eid)) >= planned:
            # State "complete" (experiment/state.py): no run in flight and the index written
            # after the last trial, i.e. the run that writes it (the last trials run) has ended,
            # as `run --wait` waits for it.
            # (`experiment get`'s "complete": true, read before session 33, says only that no
            # trial or grade is left: it came before the index run, which was not timed.)
            listed = subprocess.run(
                [HANGAR, "experiment", "list", "--json"], env=env, capture_output=True, text=True
            )
            rows = json.loads(listed.stdout or "[]")
            if any(r.get("experiment_id") == eid and r.get("state") == "complete" for r in rows):
                wall = time.monotonic() - t0
                print_timeline(env, eid, submit)
                return wall, durations(store, eid)
        time.sleep(1)


def embedded(spec: Path, home: Path) -> tuple[float, list[float]]:
    """Wall seconds of `run --wait` on a fresh embedded home; trial durations."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HANGAR_", "DAGSTER_"))}
    env |= {"HANGAR_HOME": str(home), "HANGAR_EVAL_WINDOW": "always"}
    t0, submit = time.monotonic(), time.time()
    done = subprocess.run(
        [HANGAR, "experiment", "run", str(spec), "--wait"], env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    eid = submitted(done.stdout)
    print_timeline(env | {"DAGSTER_HOME": str(home / "dagster")}, eid, submit)
    return wall, durations(Store(Settings.from_env(env).paths), eid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--whole",
        action="store_true",
        help="the example as bundled (10 tasks x 2 variants x 4 trials, parallel 6), not the "
        "tests' cut of 3 tasks; --trials is ignored",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hangar-deploy-bench-"))
    planned = 0
    walls: dict[str, list[float]] = {"deployment": [], "embedded": []}
    trial_s: dict[str, list[float]] = {"deployment": [], "embedded": []}
    dep = up(work / "shared")
    try:
        example = copy_example(dep.shared / "example", cut=not args.whole)
        trials = None if args.whole else args.trials
        for n in range(args.rounds):
            spec, planned = make_spec(example, dep.image, trials, f"skills-ab-bench-{n}")
            for way in ("deployment", "embedded"):
                cpu0 = machine_cpu_s()
                if way == "deployment":
                    wall, took = on_deployment(dep, spec, planned)
                else:
                    wall, took = embedded(spec, work / f"embedded-{n}")
                cpu = machine_cpu_s() - cpu0
                walls[way].append(wall)
                trial_s[way] += took
                print(
                    f"round {n + 1} {way}: {wall:.1f} s, machine CPU {cpu:.1f} s "
                    f"(load {' '.join(f'{x:.1f}' for x in os.getloadavg())})",
                    flush=True,
                )
    finally:
        dep.down()
        shutil.rmtree(work, ignore_errors=True)
    med = {way: statistics.median(w) for way, w in walls.items()}
    pairs = [(d - e) / planned for d, e in zip(walls["deployment"], walls["embedded"], strict=True)]
    shape = "the whole example" if args.whole else f"3 tasks x 2 variants x {args.trials}"
    print(f"trials per round: {planned} ({shape}), the spec's parallel")
    print(f"deployment wall median s: {med['deployment']:.1f}  embedded: {med['embedded']:.1f}")
    print(f"ratio deployment/embedded (medians): {med['deployment'] / med['embedded']:.2f}")
    print(f"per-trial overhead s (medians): {(med['deployment'] - med['embedded']) / planned:.2f}")
    print("per-trial overhead s per round: " + ", ".join(f"{x:.2f}" for x in pairs))
    print(
        f"trial duration median s: deployment {statistics.median(trial_s['deployment']):.2f}, "
        f"embedded {statistics.median(trial_s['embedded']):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
