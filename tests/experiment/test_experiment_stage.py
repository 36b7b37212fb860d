"""The spec and pin-set stage bodies, called without Dagster on the submitted example."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangar_dagster.experiment.stage import (
    StageRefused,
    check_spec,
    pin_variants,
    pins_version,
)
from hangar_dagster.experiment.submit import submit
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests.experiment.test_model_policy import model_spec

pytestmark = pytest.mark.unit


def test_check_spec_returns_the_stored_experiment(example_dir: Path, hangar_home: Path) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    record = check_spec(exp, Store(paths()), Settings.from_env())
    assert (record.experiment_id, record.trials_planned) == (exp.experiment_id, 18)


def test_check_spec_refuses_an_experiment_never_submitted_here(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    elsewhere = Settings.from_env({"HANGAR_HOME": str(tmp_path / "other-home")})
    with pytest.raises(StageRefused, match="was never submitted"):
        check_spec(exp, Store(elsewhere.paths), elsewhere)


def test_check_spec_refuses_an_alias_declared_since_submit_and_notes_it(
    example_dir: Path, hangar_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = "fixer-model-2025-01-01"
    exp = submit(
        model_spec(example_dir, tmp_path, "alias-stage", model, "true"), Settings.from_env()
    )
    monkeypatch.setenv("HANGAR_MODEL_ALIASES", model)
    store = Store(paths())
    with pytest.raises(StageRefused, match="may not start") as refused:
        check_spec(exp, store, Settings.from_env())
    assert "variants.v.harness_lock" in str(refused.value)
    assert [n.message for n in store.notes(exp.experiment_id) if n.kind == "model"][-1] == str(
        refused.value
    )


def test_pin_variants_stores_each_pin_set_and_links_it_once(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    store = Store(paths())
    pinned = pin_variants(exp, store, "run-1", ["plain", "skill"], aliases=frozenset())
    assert [(p.variant, p.record.pin_set, p.pinned_by) for p in pinned] == [
        (v, exp.variants[v].pin_set, "submit") for v in ("plain", "skill")
    ]
    assert {v: p.pin_set for v, p in store.pins(exp.experiment_id).items()} == {
        v: exp.variants[v].pin_set for v in ("plain", "skill")
    }
    # Again (a re-run of the stage): the same pin sets, no second link.
    again = pin_variants(exp, store, "run-2", ["skill"], aliases=frozenset())
    assert [p.record.pin_set for p in again] == [exp.variants["skill"].pin_set]
    assert pins_version(exp) == (
        f"plain={exp.variants['plain'].pin_set},skill={exp.variants['skill'].pin_set}"
    )


def test_pin_variants_refuses_pins_that_moved_since_submit(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    moved = exp.variants["plain"].model_copy(update={"pin_set": "pin-" + "0" * 16})
    exp = exp.model_copy(update={"variants": {**exp.variants, "plain": moved}})
    store = Store(paths())
    with pytest.raises(StageRefused, match="variant plain: pins moved since submit"):
        pin_variants(exp, store, "run-1", ["plain"], aliases=frozenset())
    assert "plain" not in store.pins(exp.experiment_id)
