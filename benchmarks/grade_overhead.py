"""The sealed grader's overhead beyond pytest itself, per grade.

    HANGAR_EVAL_WINDOW=always HANGAR_CORPUS=../shared/corpus \\
        .venv/bin/python benchmarks/grade_overhead.py [--runs 10] [--large] [--no-cli]

For each task, interleaved (grade, pytest, CLI grade, grade, pytest, ...), ``--runs`` times each:

- **grade** (the figure the goal is judged on): ``run_grader`` called in this process on the
  resolved spec, wall time of the call, as the grades stage pays it per trial (clone, patch,
  static pass, sandbox, ``hangar-grade`` with the trusted reporter, cross-checks, clean-up).
  One grade of the task runs first, untimed: it makes the runner environment and the task's
  pristine clone, which a stage pays once per home / task base, not per trial;
- **pytest**: ``python -m pytest -q -p no:cacheprovider HIDDEN`` of the same hidden files (as the
  grader writes them, in a directory beside the repo) in the same patched checkout, made once,
  with ``PYTHONPATH`` set to the repo's import root (``grader.pythonpath``) and the python the
  grade's tests run with: the runner environment's (environment/runner.py; the same pytest,
  without hangar's hundred packages and their pytest plugins, which make hangar's own
  interpreter a slower baseline);
- **CLI grade** (a separate line, unless ``--no-cli``): ``hangar grade --spec SPEC --task TASK
  --patch FILE.diff --json`` in a subprocess, exactly as a user runs it; it adds the ``hangar``
  process itself (interpreter start, importing the CLI, resolving the spec).

Tasks: the bundled example's ``median`` (graded with its reference patch; the example copied
and its repos built as tests/conftest.py's ``example_dir`` does), the corpus task
``semver-subclass-compare`` (3 tests, src layout; its spec built by
``tests/grading/test_corpus.py``'s ``spec_for``) and, with ``--large``,
``packaging-wheel-name-newline`` (75 tests). Prints, per task, the median and p90 of each,
the difference of the grade's and pytest's medians and their ratio, and whether the difference
meets the goal (at most 0.3 s beyond pytest). Every grade must be a clean pass. Needs root and
bwrap, like the tests.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The tests' builders: tests/ as a package root (test_corpus imports tests.conftest).
for extra in (ROOT / "tests" / "grading", ROOT / "tests", ROOT):
    sys.path.insert(0, str(extra))

from test_corpus import TASKS, spec_for  # noqa: E402

from hangar_dagster.environment.runner import ensure_runner  # noqa: E402
from hangar_dagster.experiment.plan import ResolvedExperiment  # noqa: E402
from hangar_dagster.experiment.spec import load_spec  # noqa: E402
from hangar_dagster.experiment.submit import resolve  # noqa: E402
from hangar_dagster.grading.by_hand import read_patch_file  # noqa: E402
from hangar_dagster.grading.grader import (  # noqa: E402
    hidden_files_for,
    run_grader,
    write_hidden_files,
)
from hangar_dagster.settings import Settings  # noqa: E402
from hangar_dagster.util.gitrepo import apply_patch, isolated_clone  # noqa: E402

EXAMPLE = ROOT / "examples" / "skills-ab"
HANGAR = Path(sys.executable).with_name("hangar")
GOAL_S = 0.3
SMALL = "semver-subclass-compare"
LARGE = "packaging-wheel-name-newline"


def example_spec(dest: Path) -> tuple[Path, str, Path]:
    """The bundled example copied to ``dest`` with its repos built: (spec, task, patch)."""
    ex = dest / "skills-ab"
    shutil.copytree(EXAMPLE, ex, ignore=shutil.ignore_patterns("repos", "__pycache__"))
    subprocess.run(
        [sys.executable, str(ex / "make_repos.py"), "--out", str(ex / "repos")],
        check=True,
        capture_output=True,
    )
    return ex / "experiment.yaml", "median", ex / "fixtures" / "median" / "reference.diff"


def corpus_spec(task_id: str, dest: Path) -> tuple[Path, str, Path]:
    if task_id not in TASKS:
        sys.exit(f"no corpus task {task_id!r} (set HANGAR_CORPUS; found {sorted(TASKS)})")
    spec = spec_for(TASKS[task_id], dest)
    return spec, task_id, dest / "reference.diff"


def checkout(experiment: ResolvedExperiment, task_id: str, patch: Path, dest: Path) -> tuple[Path, Path, str]:  # fmt: skip
    """The patched checkout and the hidden files beside it, as the grader makes them:
    (repo, hidden dir, PYTHONPATH)."""
    task = experiment.tasks[task_id]
    repo, hidden = dest / "repo", dest / "hidden"
    isolated_clone(task.repo, task.base_sha, repo)
    apply_patch(repo, read_patch_file(patch))
    hidden.mkdir()
    write_hidden_files(hidden, hidden_files_for(experiment, task_id), experiment.canary)
    roots = experiment.spec.grader.pythonpath or ["."]
    return repo, hidden, os.pathsep.join(str((repo / r).resolve()) for r in roots)


def time_grade(spec: Path, task_id: str, patch: Path, env: dict[str, str]) -> tuple[float, dict[str, Any]]:  # fmt: skip
    argv = [str(HANGAR), "grade", "--spec", str(spec), "--task", task_id, "--patch", str(patch), "--json"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"hangar grade {task_id}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    if proc.returncode != 0 or not result["passed"] or result["tamper_signals"]:
        sys.exit(f"hangar grade {task_id}: not a clean pass\n{result['output'][-3000:]}")
    return elapsed, result


def time_inprocess(experiment: ResolvedExperiment, task_id: str, patch: str, settings: Settings) -> tuple[float, int]:  # fmt: skip
    """Wall time of one ``run_grader`` call, and how many hidden tests it ran."""
    t0 = time.perf_counter()
    run = run_grader(
        experiment, task_id, patch, label="bench", work_root=settings.paths.work / "grading",
        env_extra={}, settings=settings,
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    if not run.passed or run.run_signals:
        sys.exit(f"run_grader {task_id}: not a clean pass ({run.reason})\n{run.output[-3000:]}")
    return elapsed, run.counts["total"]


def time_pytest(python: Path, repo: Path, hidden: Path, pythonpath: str, env: dict[str, str]) -> float:  # fmt: skip
    argv = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(hidden)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=repo, env=env | {"PYTHONPATH": pythonpath}, capture_output=True, text=True)  # fmt: skip
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"plain pytest in {repo}: exit {proc.returncode}\n{proc.stdout[-3000:]}")
    return elapsed


def p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]


def bench(name: str, made: tuple[Path, str, Path], work: Path, runs: int, cli: bool) -> dict[str, Any]:  # fmt: skip
    spec, task_id, patch = made
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PYTHONPATH")}
    env["HANGAR_HOME"] = str(work / "home")
    env.setdefault("HANGAR_EVAL_WINDOW", "always")
    settings = Settings.from_env(env)
    experiment = resolve(load_spec(spec), spec, settings)
    if experiment.tasks[task_id].build:
        sys.exit(f"{task_id} has an environment build; this benchmark times tasks without one")
    patch_text = read_patch_file(patch)
    repo, hidden, pythonpath = checkout(experiment, task_id, patch, work / "plain")
    time_inprocess(experiment, task_id, patch_text, settings)  # runner env, pristine clone
    runner = ensure_runner(settings)
    grades, plains, clis, inner = [], [], [], []
    tests = 0
    for i in range(runs):
        g, tests = time_inprocess(experiment, task_id, patch_text, settings)
        p = time_pytest(runner.python, repo, hidden, pythonpath, env)
        grades.append(g)
        plains.append(p)
        line = f"  {name} run {i + 1}: grade {g:.3f} s, pytest {p:.3f} s"
        if cli:
            c, result = time_grade(spec, task_id, patch, env)
            clis.append(c)
            inner.append(result["duration_s"])
            line += f", CLI grade {c:.3f} s (its duration_s {result['duration_s']:.3f})"
        print(line, flush=True)
    gm, pm = statistics.median(grades), statistics.median(plains)
    row = {
        "task": name, "tests": tests, "grade_median": gm, "grade_p90": p90(grades),
        "pytest_median": pm, "pytest_p90": p90(plains), "diff": gm - pm, "ratio": gm / pm,
        "meets": gm - pm <= GOAL_S, "load": os.getloadavg()[0],
    }  # fmt: skip
    if clis:
        cm = statistics.median(clis)
        row |= {"cli_median": cm, "cli_p90": p90(clis), "cli_diff": cm - pm,
                "inner_median": statistics.median(inner)}  # fmt: skip
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| task | tests | grade median s | grade p90 s | pytest median s | pytest p90 s "
        "| difference s | ratio | goal (<= 0.3 s) | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['tests']} | {r['grade_median']:.3f} | {r['grade_p90']:.3f} "
            f"| {r['pytest_median']:.3f} | {r['pytest_p90']:.3f} | {r['diff']:.3f} "
            f"| {r['ratio']:.2f} | {'met' if r['meets'] else 'not met'} | {r['load']:.1f} |"
        )
    if any("cli_median" in r for r in rows):
        lines += [
            "",
            "The CLI (`hangar grade ... --json`, a separate figure: it adds the `hangar` process):",
            "",
            "| task | CLI grade median s | CLI grade p90 s | CLI minus pytest s | its duration_s (median) |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            if "cli_median" in r:
                lines.append(
                    f"| {r['task']} | {r['cli_median']:.3f} | {r['cli_p90']:.3f} "
                    f"| {r['cli_diff']:.3f} | {r['inner_median']:.3f} |"
                )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="grades and pytest runs per task")
    ap.add_argument("--large", action="store_true", help=f"also {LARGE} (75 tests)")
    ap.add_argument("--no-cli", action="store_true", help="skip the `hangar grade` CLI line")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="grade-overhead-") as tmp:
        work = Path(tmp)
        tasks = [("example median", example_spec), (SMALL, lambda d: corpus_spec(SMALL, d))]
        if args.large:
            tasks.append((LARGE, lambda d: corpus_spec(LARGE, d)))
        for i, (name, make) in enumerate(tasks):
            d = work / f"t{i}"
            d.mkdir()
            rows.append(bench(name, make(d), d, args.runs, not args.no_cli))
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
