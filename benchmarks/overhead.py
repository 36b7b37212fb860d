"""Per-trial orchestration overhead: the Dagster pipeline against a plain process pool.

    .venv/bin/python benchmarks/overhead.py [--trials N]

Builds a throwaway experiment of N trivial trials (one tiny task repo; the
scripted stand-in agent of the bundled example), then runs the same domain
work twice, serially (parallel 1) so wall time adds up:

- pipeline: ``hangar experiment run --wait`` semantics (five stage runs
  through ``dagster.execute_job`` on a fresh SQLite instance);
- pool: ``run_trial`` + ``grade_trial`` for each key in a
  ``ProcessPoolExecutor(max_workers=1)``, plus the base check once.

Per-trial overhead = the wall time a trial costs in that path minus the
trial's own work (its agent run and its grade, as recorded in the records).
The pipeline's fixed costs (stage runs, store, definitions) are spread over
the N trials. Prints median and p90 for each path and the ratios; the figures
go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "skills-ab"


def p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.9 * len(xs))) - 1)]


def make_spec(work: Path, trials: int) -> Path:
    example = work / "example"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("repos", "__pycache__"))
    subprocess.run(
        [sys.executable, str(example / "make_repos.py"), "--out", str(example / "repos")],
        check=True,
        capture_output=True,
    )
    spec = yaml.safe_load((example / "experiment.yaml").read_text())
    spec["name"] = "overhead-bench"
    spec["tasks"] = spec["tasks"][:1]
    spec["variants"] = {"plain": spec["variants"]["plain"]}
    spec["trials"] = trials
    spec["parallel"] = 1
    path = example / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _pool_trial(args: tuple[str, str, int]) -> float:
    """In a worker process: one trial and its grade; returns their own work in seconds."""
    from hangar_dagster.experiment.plan import TrialKey
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.grading.grader import grade_trial
    from hangar_dagster.settings import Settings
    from hangar_dagster.trials.trial import TrialRequest, run_trial

    home, experiment_id, rep = args
    settings = Settings.from_env({**os.environ, "HANGAR_HOME": home})
    paths = settings.paths
    exp = load_resolved(paths, experiment_id)
    key = TrialKey("plain", next(iter(exp.tasks)), rep)
    record, patch = run_trial(
        TrialRequest(experiment=exp, key=key, attempt=1, retry_of=None, run_id="pool"), settings
    )
    grade = grade_trial(exp, record, patch, None, "pool", paths)
    return record.duration_s + grade.duration_s


def run_pool(spec: Path, home: Path, trials: int) -> tuple[float, list[float], float]:
    from hangar_dagster.experiment.submit import submit
    from hangar_dagster.grading.grader import check_base
    from hangar_dagster.settings import Settings

    settings = Settings.from_env({**os.environ, "HANGAR_HOME": str(home)})
    paths = settings.paths
    start = time.perf_counter()
    exp = submit(spec, settings)
    check_base(exp, next(iter(exp.tasks)), "pool", paths)
    loop, work = [], 0.0
    with ProcessPoolExecutor(max_workers=1) as pool:
        for rep in range(1, trials + 1):
            t0 = time.perf_counter()
            own = pool.submit(_pool_trial, (str(home), exp.experiment_id, rep)).result()
            loop.append((time.perf_counter() - t0, own))
            work += own
    wall = time.perf_counter() - start
    return wall, spread(wall, loop), work


def spread(wall: float, loop: list[tuple[float, float]]) -> list[float]:
    """Per trial: its own overhead in the loop plus an equal share of the fixed costs."""
    share = (wall - sum(w for w, _ in loop)) / len(loop)
    return [share + w - own for w, own in loop]


def run_pipeline(spec: Path, home: Path) -> tuple[float, list[float], float]:
    # Measure now, not in tonight's eval window.
    env = {**os.environ, "HANGAR_HOME": str(home), "HANGAR_EVAL_WINDOW": "always"}
    env.pop("DAGSTER_HOME", None)
    hangar = Path(sys.executable).with_name("hangar")
    start = time.perf_counter()
    subprocess.run(
        [str(hangar), "experiment", "run", str(spec), "--wait"],
        env=env,
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - start
    import duckdb

    con = duckdb.connect(str(home / "hangar.duckdb"), read_only=True)
    trials = con.execute(
        "select finished_at, duration_s from trials order by finished_at"
    ).fetchall()
    grades = con.execute("select graded_at, duration_s from grades order by graded_at").fetchall()
    con.close()
    # In the serial trials run, a trial's loop wall is the gap since the previous one finished
    # (likewise for grades); the first of each is taken at its own duration.
    loop = [
        (gaps(trials)[i] + gaps(grades)[i], trials[i][1] + grades[i][1]) for i in range(len(trials))
    ]
    return wall, spread(wall, loop), sum(own for _, own in loop)


def gaps(rows: list[tuple[Any, float]]) -> list[float]:
    return [rows[0][1]] + [
        (b[0] - a[0]).total_seconds() for a, b in zip(rows, rows[1:], strict=False)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hangar-bench-") as tmp:
        work = Path(tmp)
        spec = make_spec(work, args.trials)
        pipe_wall, pipe_over, pipe_work = run_pipeline(spec, work / "pipeline-home")
        pool_wall, pool_over, pool_work = run_pool(spec, work / "pool-home", args.trials)
    n = args.trials
    trial_median = pipe_work / n
    print(f"trials: {n} (serial, one task, scripted stand-in agent)")
    print(f"{'path':<10}{'wall s':>9}{'work s':>9}{'overhead/trial median s':>26}{'p90 s':>8}")
    print(
        f"{'pipeline':<10}{pipe_wall:>9.2f}{pipe_work:>9.2f}{statistics.median(pipe_over):>26.3f}{p90(pipe_over):>8.3f}"
    )
    print(
        f"{'pool':<10}{pool_wall:>9.2f}{pool_work:>9.2f}{statistics.median(pool_over):>26.3f}{p90(pool_over):>8.3f}"
    )
    print(f"ratio pipeline/pool wall: {pipe_wall / pool_wall:.2f}")
    print(
        f"pipeline overhead per trial / mean trial work: {statistics.median(pipe_over) / trial_median:.2f}"
    )


if __name__ == "__main__":
    main()
