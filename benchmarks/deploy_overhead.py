"""The bundled example on the Docker deployment (deploy/docker) against the embedded default.

    .venv/bin/python benchmarks/deploy_overhead.py [--trials 3]

Brings the deployment up as the tests do (tests/deploy/compose.py: images cached by recipe, a
compose project of its own, removed at the end), then runs examples/skills-ab (3 tasks x 2
variants x --trials) with the Docker sandbox from the project image twice, one after the other:

- deployment: `hangar experiment run SPEC` on the host, the daemon launching every stage run
  in a run worker container, results in the DuckLake store; timed from the submit to the
  moment the store has every trial graded and the index run has ended;
- embedded: `hangar experiment run SPEC --wait` on a fresh HANGAR_HOME (SQLite instance,
  embedded store, stages in the CLI's process).

Both run every trial in a Docker sandbox of the same image, so the sandbox's own start is in
both; per-trial overhead = (deployment wall - embedded wall) / trials is what the deployment
adds. Prints both walls, the ratio, the per-trial overhead and the trials' own median
duration in each; the figures go into docs/performance.md.
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
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hangar_dagster.results.store import Store  # noqa: E402
from hangar_dagster.settings import Settings  # noqa: E402
from tests.conftest import copy_example  # noqa: E402
from tests.deploy.compose import up  # noqa: E402

HANGAR = str(Path(sys.executable).with_name("hangar"))


def make_spec(where: Path, image: str, trials: int) -> Path:
    example = copy_example(where / "example")
    data = yaml.safe_load((example / "experiment.yaml").read_text())
    data["environment"] |= {"sandbox": "docker", "image": image}
    data |= {"name": "skills-ab-bench", "trials": trials}
    path = example / "bench.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def submitted(out: str) -> str:
    return out.split("submitted ")[1].split()[0]


def durations(store: Store, eid: str) -> list[float]:
    return [float(t.duration_s) for t in store.trials(eid)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hangar-deploy-bench-"))
    dep = up(work / "shared")
    try:
        spec = make_spec(dep.shared, dep.image, args.trials)
        env = dep.host_env()
        store = Store(Settings.from_env(env).paths)
        t0 = time.monotonic()
        done = subprocess.run(
            [HANGAR, "experiment", "run", str(spec)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        eid = submitted(done.stdout)
        planned = 6 * args.trials
        while True:
            if len(store.grades(eid)) >= planned and (dep.home / "experiments" / eid).exists():
                index = subprocess.run(
                    [HANGAR, "experiment", "get", eid, "--json"],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if '"complete": true' in index.stdout:
                    break
            time.sleep(1)
        deployed = time.monotonic() - t0
        dep_trials = durations(store, eid)

        home = work / "embedded"
        emb_env = {k: v for k, v in os.environ.items() if not k.startswith(("HANGAR_", "DAGSTER_"))}
        emb_env |= {"HANGAR_HOME": str(home), "HANGAR_EVAL_WINDOW": "always"}
        t0 = time.monotonic()
        done = subprocess.run(
            [HANGAR, "experiment", "run", str(spec), "--wait"],
            env=emb_env,
            capture_output=True,
            text=True,
        )
        embedded = time.monotonic() - t0
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        emb_trials = durations(Store(Settings.from_env(emb_env).paths), submitted(done.stdout))
    finally:
        dep.down()
        shutil.rmtree(work, ignore_errors=True)
    print(f"trials: {planned} (3 tasks x 2 variants x {args.trials}), parallel 3")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(f"deployment wall s: {deployed:.1f}  embedded wall s: {embedded:.1f}")
    print(f"ratio deployment/embedded: {deployed / embedded:.2f}")
    print(f"per-trial overhead s: {(deployed - embedded) / planned:.2f}")
    print(
        f"trial duration median s: deployment {statistics.median(dep_trials):.2f}, "
        f"embedded {statistics.median(emb_trials):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
