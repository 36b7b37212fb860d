"""The example with a third variant (the skill harness at a higher solve rate), for the reuse
test and benchmark: the same tasks, two old variants and one new."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.experiment.harness import freeze


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
