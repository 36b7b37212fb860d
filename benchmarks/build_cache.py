"""What the build cache saves: N grader runs of a task with a build step, cached vs built each time.

    .venv/bin/python benchmarks/build_cache.py [--runs N]

The task is the corpus's python-semanticversion (its package reads its version from installed
metadata, so its tests need ``pip install --no-deps -e .``; ``$HANGAR_CORPUS`` or
``../shared/corpus``). Each run is what a trial or a grade pays for its environment, then the
real grader on the base (bwrap, hangar-grade in the build's venv):

- cached: one ``ensure_build`` (the base check's), then per run ``ensure_build`` again (a
  cache hit) and the grade;
- per run: every run builds from nothing (its own empty ``HANGAR_HOME``), as trials did when
  ``environment.build`` ran in each trial's clone, then grades.

Builds install through the package mirror (``open_egress("mirror")``) when the egress module is
there, else from a local wheel index fetched once by the host's pip (said in the output). Prints
wall times, the environment's cost per further run in the cached path, and the ratios; the
figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hangar_dagster.environment import build  # noqa: E402
from hangar_dagster.grading.grader import run_grader, task_build  # noqa: E402
from hangar_dagster.settings import Settings  # noqa: E402
from tests.buildfixtures import SEMVER_TASK, LocalIndexGrant, semver_repo  # noqa: E402
from tests.grading.grading_builders import experiment  # noqa: E402

CORPUS = Path(os.environ.get("HANGAR_CORPUS") or ROOT.parent / "shared" / "corpus")


def use_local_index(work: Path) -> str:
    """Builds install from a local wheel index (the egress module is not there yet)."""
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--dest", str(wheels),
         build.runner_requirement(), "setuptools", "wheel"],
        check=True,
    )  # fmt: skip

    @contextlib.contextmanager
    def grant(log_path: Path, settings: Settings) -> Iterator[LocalIndexGrant]:
        yield LocalIndexGrant.of(wheels)

    build.open_build_egress = grant  # type: ignore[assignment]
    return f"a local wheel index ({wheels})"


def grade(exp: object, built: build.Built, work: Path) -> float:
    started = time.monotonic()
    run = run_grader(exp, "sv", "", label="bench", work_root=work, env_extra={}, built=built)  # type: ignore[arg-type]
    assert run.counts["failed"] == 1, run.output[-2000:]  # the base fails as the corpus says
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    work = Path(tempfile.mkdtemp(prefix="hangar-build-bench-"))
    try:
        run_benchmark(work, runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_benchmark(work: Path, runs: int) -> None:
    if importlib.util.find_spec("hangar_dagster.environment.egress") is not None:
        source = "the package mirror (open_egress)"
    else:
        source = use_local_index(work)
    repo, sha = semver_repo(CORPUS, work / "semver")
    hidden = {p.name: p.read_text() for p in sorted((CORPUS / SEMVER_TASK / "hidden").iterdir())}
    exp = experiment(
        {"sv": {"repo": str(repo), "base_sha": sha, "hidden_files": hidden,
                "build": ["pip install -q --no-deps -e ."]}},
        grader={"timeout_s": 600},
    )  # fmt: skip
    plan = task_build(exp, "sv")
    assert plan is not None

    # Cached: one build, then each run finds it.
    settings = Settings.from_env({"HANGAR_HOME": str(work / "cached")})
    t0 = time.monotonic()
    first = build.ensure_build(plan, settings)
    one_build = time.monotonic() - t0
    env_costs, grades = [], []
    for _ in range(runs):
        t = time.monotonic()
        built = build.ensure_build(plan, settings)
        env_costs.append(time.monotonic() - t)
        grades.append(grade(exp, built, work / "grading"))
    cached_wall = time.monotonic() - t0
    assert build.BUILDS_RUN[plan.key] == 1 and first.ran_now

    # Per run: a build from nothing every time.
    t0 = time.monotonic()
    build_times = []
    for i in range(runs):
        fresh = Settings.from_env({"HANGAR_HOME": str(work / f"fresh-{i}")})
        t = time.monotonic()
        built = build.ensure_build(plan, fresh)
        build_times.append(time.monotonic() - t)
        grade(exp, built, work / "grading")
    per_run_wall = time.monotonic() - t0
    assert build.BUILDS_RUN[plan.key] == 1 + runs

    print(f"builds install from {source}; {runs} runs; task {SEMVER_TASK}")
    print(f"cached:  wall {cached_wall:.1f}s = one build {one_build:.1f}s + {runs} runs")
    print(
        f"         environment per further run: median {statistics.median(env_costs) * 1000:.1f} ms,"
        f" max {max(env_costs) * 1000:.1f} ms; grade median {statistics.median(grades):.2f}s"
    )
    print(
        f"per run: wall {per_run_wall:.1f}s; build median {statistics.median(build_times):.1f}s "
        f"({runs} builds)"
    )
    print(
        f"ratio per-run / cached wall: {per_run_wall / cached_wall:.2f}x; builds paid "
        f"{runs} vs 1; cached environment cost per further run / one build: "
        f"{statistics.median(env_costs) / one_build:.5f}"
    )


if __name__ == "__main__":
    main()
