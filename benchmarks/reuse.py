"""What reuse saves: the example run twice, the second time with one variant added.

    .venv/bin/python benchmarks/reuse.py [--trials 3]

In one fresh ``HANGAR_HOME``, three ``hangar experiment run --wait`` (the CLI, as a user runs
it; ``HANGAR_EVAL_WINDOW=always``):

1. the bundled example cut to its first 3 tasks (2 variants x 3 tasks x ``--trials``);
2. the same spec plus a third variant (the skill harness at a higher solve rate): its old
   variants' trials are reused but one health trial each;
3. the same as 2 with ``reuse: {enabled: false}``: what the second run cost before reuse.

Prints each run's wall time, trials paid (rows without ``reused_from``) and reused, the
ratios 2/3 and 2/1, and whether the old variants' figures in run 2 are run 1's. The figures
go into docs/performance.md ("Reuse and regrade").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import copy_example  # noqa: E402
from tests.reusefixtures import add_variant_specs  # noqa: E402


def hangar(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env |= {"HANGAR_HOME": str(home), "HANGAR_EVAL_WINDOW": "always"}
    exe = Path(sys.executable).with_name("hangar")
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, check=False)


def run_wait(home: Path, spec: Path) -> tuple[str, float]:
    """``hangar experiment run SPEC --wait`` in ``home``: the experiment id and the wall time."""
    started = time.monotonic()
    result = hangar(home, "experiment", "run", str(spec), "--wait")
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(
            f"{spec.name} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
        )
    return result.stdout.split("submitted ")[1].split()[0], wall


def prepare(work: Path, trials: int) -> dict[str, Path]:
    """The example's copy with its repos, a third lock in its registry, and the three specs."""
    ex = copy_example(work / "example")  # cut to 3 tasks, as the tests run it
    first, second = add_variant_specs(ex, work, trials, registry=ex / "harnesses")
    data: dict[str, Any] = yaml.safe_load(second.read_text())
    data["reuse"] = {"enabled": False}
    off = ex / "off.yaml"
    off.write_text(yaml.safe_dump(data))
    return {"first": first, "second": second, "off": off}


def run(home: Path, spec: Path) -> dict[str, Any]:
    eid, wall = run_wait(home, spec)
    got = json.loads(hangar(home, "experiment", "get", eid, "--json").stdout)
    rows = got["attempts"]
    return {
        "experiment": eid,
        "wall_s": round(wall, 1),
        "paid": sum(1 for r in rows if not r.get("reused_from")),
        "reused": sum(1 for r in rows if r.get("reused_from")),
        "summary": {
            r["variant"]: (r["passed"], r["graded"], r["pass_rate_pts"]) for r in got["summary"]
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    trials = parser.parse_args().trials
    work = Path(tempfile.mkdtemp(prefix="hangar-reuse-bench-"))
    try:
        specs = prepare(work, trials)
        home = work / "home"
        first = run(home, specs["first"])
        second = run(home, specs["second"])
        off = run(home, specs["off"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, r in (
        ("1 example", first),
        ("2 + a variant, reuse", second),
        ("3 = 2, reuse off", off),
    ):
        print(f"{name:24} wall {r['wall_s']:7.1f} s  paid {r['paid']:3d}  reused {r['reused']:3d}")
    same = all(second["summary"][v] == first["summary"][v] for v in first["summary"])
    print(
        f"paid 2/3: {second['paid'] / off['paid']:.2f}   wall 2/3: {second['wall_s'] / off['wall_s']:.2f}"
    )
    print(
        f"paid 2/1: {second['paid'] / first['paid']:.2f}   wall 2/1: {second['wall_s'] / first['wall_s']:.2f}"
    )
    print(f"old variants' figures in run 2 equal run 1's: {same} {first['summary']}")
    new = trials * 3
    print(f"goal: only the new variant's {new} trials and one health trial per reused variant")
    print(f"(2) paid: {second['paid']} = {new} + 2: {second['paid'] == new + 2}")


if __name__ == "__main__":
    main()
