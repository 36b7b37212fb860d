"""The example's Dagster definitions, pinned in a committed snapshot so a change shows in review.

The snapshot (``snapshots/definitions.json``) lists every asset of the bundled
example (key, group, dependencies with their partition mappings, partitions
by dimension, kinds, owners, code version, tags), every asset check (key,
blocking, partitions), every job (name, selected assets, tags), every schedule
(name, cron, zone, job) and every sensor. The experiment id's random suffix
is written as ``<experiment>``; the author is fixed and the eval window is
set so that both window schedules exist.

After an intended change, regenerate and review the diff:

    HANGAR_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/orchestration/test_definitions_snapshot.py
    git diff tests/orchestration/snapshots/definitions.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from hangar_dagster.experiment.submit import submit
from hangar_dagster.orchestration.definitions import build_definitions
from hangar_dagster.settings import Settings

pytestmark = pytest.mark.unit

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.json"
UPDATE = "HANGAR_UPDATE_SNAPSHOTS"


def _partitions(part: dg.PartitionsDefinition[Any] | None) -> dict[str, list[str]] | None:
    if part is None:
        return None
    if isinstance(part, dg.MultiPartitionsDefinition):
        return {d.name: list(d.partitions_def.get_partition_keys()) for d in part.partitions_defs}
    return {"": list(part.get_partition_keys())}


def _asset(spec: dg.AssetSpec) -> dict[str, Any]:
    return {
        "key": spec.key.to_user_string(),
        "group": spec.group_name,
        "deps": sorted(
            [
                dep.asset_key.to_user_string(),
                # (an AllPartitionMapping is an empty tuple: falsy, so test for None)
                repr(dep.partition_mapping) if dep.partition_mapping is not None else None,
            ]
            for dep in spec.deps
        ),
        "partitions": _partitions(spec.partitions_def),
        "kinds": sorted(spec.kinds),
        "owners": list(spec.owners),
        "code_version": spec.code_version,
        "tags": dict(sorted(spec.tags.items())),
    }


def _checks(defs: dg.Definitions) -> list[dict[str, Any]]:
    """Every asset check, wherever it is declared (on an asset or as its own definition)."""
    found: dict[str, dict[str, Any]] = {}
    for item in [*(defs.assets or []), *(defs.asset_checks or [])]:
        for check in getattr(item, "check_specs", ()):
            key = f"{check.asset_key.to_user_string()}:{check.name}"
            found[key] = {
                "key": key,
                "blocking": check.blocking,
                "partitions": _partitions(check.partitions_def),
            }
    return [found[k] for k in sorted(found)]


def describe(defs: dg.Definitions) -> dict[str, Any]:
    assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)]
    jobs: list[Any] = [j for j in defs.jobs or [] if hasattr(j, "selection")]  # asset jobs
    return {
        "assets": sorted(
            (_asset(s) for s in defs.resolve_all_asset_specs()), key=lambda a: a["key"]
        ),
        "asset_checks": _checks(defs),
        "jobs": sorted(
            (
                {
                    "name": j.name,
                    "assets": sorted(k.to_user_string() for k in j.selection.resolve(assets)),
                    "tags": dict(sorted((j.tags or {}).items())),
                }
                for j in jobs
            ),
            key=lambda j: j["name"],
        ),
        "schedules": sorted(
            (
                {
                    "name": s.name,
                    "cron": s.cron_schedule,
                    "timezone": s.execution_timezone,
                    "job": s.job_name,
                }
                for s in defs.schedules or []
                if isinstance(s, dg.ScheduleDefinition)
            ),
            key=lambda s: s["name"],
        ),
        "sensors": sorted(s.name for s in defs.sensors or [] if isinstance(s, dg.SensorDefinition)),
    }


def normalised(defs: dg.Definitions, experiment_id: str) -> dict[str, Any]:
    text = json.dumps(describe(defs), indent=2, sort_keys=True)
    loaded: dict[str, Any] = json.loads(text.replace(experiment_id, "<experiment>"))
    return loaded


@pytest.fixture
def example_defs(
    example_dir: Path, hangar_home: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dg.Definitions, str]:
    monkeypatch.setenv("USER", "snapshot")  # the spec's author, when the spec names none
    monkeypatch.setenv("HANGAR_EVAL_WINDOW", "22:00-06:00")
    monkeypatch.setenv("HANGAR_EVAL_TZ", "Europe/Berlin")
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    defs = build_definitions(Settings.from_env())
    dg.Definitions.validate_loadable(defs)
    return defs, exp.experiment_id


def test_the_example_definitions_match_the_snapshot(
    example_defs: tuple[dg.Definitions, str],
) -> None:
    got = normalised(*example_defs)
    if os.environ.get(UPDATE) == "1":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(SNAPSHOT.read_text())
    assert got == want, (
        f"the definitions changed; if that is intended, run with {UPDATE}=1 and review "
        f"the diff of {SNAPSHOT.relative_to(Path.cwd()) if SNAPSHOT.is_relative_to(Path.cwd()) else SNAPSHOT}"
    )


def test_the_snapshot_covers_every_stage(example_defs: tuple[dg.Definitions, str]) -> None:
    want = json.loads(SNAPSHOT.read_text())
    assert [a["key"] for a in want["assets"]] == [
        f"<experiment>/{s}"
        for s in ("base_checks", "grades", "index", "pin_sets", "spec", "trials")
    ]
    assert {s["name"] for s in want["schedules"]} == {
        "eval_window_drain",
        "nightly_experiments",
        "<experiment>__eval_window_open",
    }
    assert want["sensors"] == ["experiment_driver", "shadow_merges"]
