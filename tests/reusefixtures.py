"""For the reuse and regrade tests and benchmarks: the example with a third variant (the skill
harness at a higher solve rate), the example's spec edited, and an experiment's trials stored
as its trials and grades stages store them."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.experiment.harness import freeze
from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.submit import submit
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.trials.trial import RAW_PATCH, STARTED_MARKER, pinned_fields
from tests import factories as f

PATCH = "diff --git a/stats.py b/stats.py\n--- a/stats.py\n+++ b/stats.py\n@@ -1 +1 @@\n-a\n+b\n"


def add_variant_specs(
    example_dir: Path, work: Path, trials: int, registry: Path | None = None
) -> tuple[Path, Path]:
    """Write the example's spec (``trials`` per task) and the same plus variant ``eager`` next
    to the example; the new lock is frozen into ``registry`` (a copy of the example's, made in
    ``work`` when not given). Returns (first, second)."""
    if registry is None:
        registry = work / "registry"
        shutil.copytree(example_dir / "harnesses", registry)
    src = work / "standin-eager"
    shutil.copytree(example_dir / "harness-src" / "standin-skill", src)
    manifest = yaml.safe_load((src / "harness.yaml").read_text())
    manifest["name"] = "standin-eager"
    manifest["standin"]["solve_rate"] = 0.6
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    eager = freeze(src, registry).ref
    data: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    data.update(harness_repo=str(registry), trials=trials)
    first = example_dir / f"reuse-first-{work.name}.yaml"
    first.write_text(yaml.safe_dump(data))
    data["variants"]["eager"] = {"changes": "a higher solve rate", "harness_lock": eager}
    second = example_dir / f"reuse-second-{work.name}.yaml"
    second.write_text(yaml.safe_dump(data))
    return first, second


def spec_file(example_dir: Path, name: str, edit: dict[str, Any] | None = None) -> Path:
    """The example's spec, one trial per task, with a trial budget (it binds a trial too),
    edited by dotted path."""
    data = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    data["trial_job_budget"] = {"max_cost_usd": 3.0}
    data["trials"] = 1
    data["author"] = "tester"
    for dotted, value in (edit or {}).items():
        target = data
        *parents, last = dotted.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    path = example_dir / f"reuse-{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def finish(
    exp: ResolvedExperiment, store: Store, *, ago: dt.timedelta, keys: list[str] | None = None
) -> None:
    """Store ``exp``'s trials (all, or ``keys``) as its trials and grades stages store them,
    finished ``ago`` before now; the slugify trials fail their grade."""
    p = paths()
    when = dt.datetime.now(dt.UTC) - ago
    for key in exp.trial_keys():
        if (keys is not None and key.key not in keys) or key.key in _stored(store, exp):
            continue
        art = p.trial_artifacts(exp.experiment_id, key.key, 1)
        art.mkdir(parents=True)
        (art / RAW_PATCH).write_text(PATCH)
        (art / STARTED_MARKER).write_text("{}")
        fields = pinned_fields(exp, key, 1, None, f"run-{exp.experiment_id}", frozenset())
        store.put(
            f.grade(
                key.variant,
                key.task,
                key.replicate,
                passed=key.task != "slugify",
                experiment_id=exp.experiment_id,
                grader_digest=exp.grader_digest,
                graded_at=when,
            )
        )
        times = {"started_at": when - dt.timedelta(seconds=5), "finished_at": when}
        store.put(f.trial(**(fields | times), agent_is_standin=True, artifacts_dir=str(art)))


def _stored(store: Store, exp: ResolvedExperiment) -> set[str]:
    return {t.trial_key for t in store.trials(exp.experiment_id, all_attempts=True)}


def finished_first(example_dir: Path, name: str) -> tuple[ResolvedExperiment, Store]:
    """An experiment of ``spec_file(example_dir, name)`` submitted, its trials finished an
    hour ago: the earlier experiment the reuse and regrade tests start from."""
    exp = submit(spec_file(example_dir, name), Settings.from_env())
    store = Store(paths())
    finish(exp, store, ago=dt.timedelta(hours=1))
    return exp, store
