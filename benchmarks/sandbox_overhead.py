"""Per-trial sandbox overhead, Docker vs bubblewrap, on trivial commands and on one grade.

    HANGAR_EVAL_WINDOW=always .venv/bin/python benchmarks/sandbox_overhead.py [--runs 20]

Interleaved (bwrap, docker, bwrap, docker, ...), ``--runs`` times each:

- **trial command**: ``Sandbox.run`` of ``/bin/true`` and of ``python -c pass`` (the host
  interpreter, as the agent's forwarders and hangar-grade start), with the mounts a
  stand-in trial has (a read-only harness directory, a writable output directory);
- **grade**: ``run_grader`` of the bundled example's ``median`` task with its reference patch
  (clone, patch, static pass, sandbox, ``hangar-grade`` with the trusted reporter), on each
  backend (Docker with the base image by id, and the uid split when run as root).

Prints median and p90 per backend and what Docker adds (difference of the medians, and their
ratio). Goal: Docker adds at most 0.5 s median per trial command and per grade. Needs bwrap, a
Docker engine and the base image (``hangar image build``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from grade_overhead import example_spec, p90  # noqa: E402

from hangar_dagster.environment.image import build_base_image  # noqa: E402
from hangar_dagster.experiment.spec import load_spec  # noqa: E402
from hangar_dagster.experiment.submit import resolve  # noqa: E402
from hangar_dagster.grading.by_hand import read_patch_file  # noqa: E402
from hangar_dagster.grading.grader import run_grader  # noqa: E402
from hangar_dagster.settings import Settings  # noqa: E402
from hangar_dagster.trials.sandbox import Mount, SandboxRequest, get_sandbox  # noqa: E402
from hangar_dagster.trials.sandbox.docker import client  # noqa: E402

GOAL_S = 0.5
BACKENDS = ("bwrap", "docker")


def trial_command(backend: str, image: str, argv: list[str], work: Path) -> Callable[[], float]:
    sandbox = get_sandbox(backend, image=image if backend == "docker" else None)
    harness, out = work / "harness", work / "out"
    harness.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    (harness / "harness.yaml").write_text("name: bench\n")

    def once() -> float:
        wd = Path(tempfile.mkdtemp(dir=work))
        req = SandboxRequest(
            argv=argv,
            workdir=wd,
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            timeout_s=60,
            mounts=[Mount(harness, "/harness"), Mount(out, "/out", writable=True)],
        )
        t0 = time.perf_counter()
        res = sandbox.run(req)
        elapsed = time.perf_counter() - t0
        if res.exit_code != 0:
            sys.exit(f"{backend} {argv}: exit {res.exit_code}\n{res.stderr}")
        return elapsed

    return once


def grade(backend: str, image: str, work: Path) -> Callable[[], float]:
    spec_path, task_id, patch_file = example_spec(work / backend)
    spec = load_spec(spec_path)
    env = spec.environment.model_copy(
        update={"sandbox": backend, "image": image if backend == "docker" else None}
    )
    spec = spec.model_copy(update={"environment": env})
    experiment = resolve(spec, spec_path, Settings.from_env())
    patch = read_patch_file(patch_file)

    def once() -> float:
        t0 = time.perf_counter()
        run = run_grader(
            experiment, task_id, patch, label="bench", work_root=work / "grading", env_extra={}
        )
        elapsed = time.perf_counter() - t0
        if not run.passed:
            sys.exit(f"grade on {backend}: not a pass\n{run.output[-3000:]}")
        return elapsed

    return once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    image = build_base_image(client(), log=lambda _: None).image_id
    print(f"load average {os.getloadavg()[0]:.2f}; docker image {image[:19]}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hangar-bench-") as tmp:
        work = Path(tmp)
        cases = {
            "/bin/true": {b: trial_command(b, image, ["/bin/true"], work) for b in BACKENDS},
            "python -c pass": {
                b: trial_command(b, image, [sys.executable, "-c", "pass"], work) for b in BACKENDS
            },
            "grade (example median)": {b: grade(b, image, work) for b in BACKENDS},
        }
        for name, fns in cases.items():
            times: dict[str, list[float]] = {b: [] for b in BACKENDS}
            for b in BACKENDS:
                fns[b]()  # warm-up: caches, the image lookup
            for _ in range(args.runs):
                for b in BACKENDS:
                    times[b].append(fns[b]())
            bm, dm = statistics.median(times["bwrap"]), statistics.median(times["docker"])
            rows.append((name, bm, p90(times["bwrap"]), dm, p90(times["docker"]), dm - bm, dm / bm))
            print(f"  {name}: bwrap {bm:.3f} s, docker {dm:.3f} s", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end; {args.runs} runs each")
    print(
        "| command | bwrap median s | bwrap p90 s | docker median s | docker p90 s "
        f"| docker adds s | ratio | goal (<= {GOAL_S} s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, bm, bp, dm, dp, diff, ratio in rows:
        met = "met" if diff <= GOAL_S else "not met"
        print(
            f"| {name} | {bm:.3f} | {bp:.3f} | {dm:.3f} | {dp:.3f} | {diff:.3f} | "
            f"{ratio:.2f} | {met} |"
        )


if __name__ == "__main__":
    main()
