"""Export: index.json plus every attempt's manifest and trace, canary masked, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import factories as f
import pytest

from hangar_dagster.results.export import ExportError, export_experiment
from hangar_dagster.trials.canary import MASK, new_canary

pytestmark = pytest.mark.unit


def test_export_writes_every_attempt_and_masks_the_canary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    canary = new_canary()
    store.put(f.experiment())
    store.put(f.pin_set())
    store.put(f.experiment_pin())
    store.put(f.base_check())
    store.put(f.trial(attempt=1, outcome_class="infra_error", infra_reason="preempted"))
    leaked = {
        "events": [{"type": "tool_output", "text": f"# {canary}\ndef test_x(): ..."}],
        canary: "as a key too",
    }
    store.put(f.trial(attempt=2, trace=leaked, manifest={"note": f"saw {canary}"}))
    store.put(f.grade(attempt=2, contamination=["trace"]))
    store.put(f.note(f"canary {canary} seen in trace", kind="contamination"))

    out = export_experiment(store, f.EXP, tmp_path / "out", canary)

    assert out == (tmp_path / "out").resolve()
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [
        "index.json",
        "trials/base__t1__1/attempt-1/manifest.json",
        "trials/base__t1__1/attempt-1/trace.json",
        "trials/base__t1__1/attempt-2/manifest.json",
        "trials/base__t1__1/attempt-2/trace.json",
    ]
    for p in out.rglob("*.json"):
        assert canary not in p.read_text(), p
    trace = json.loads((out / "trials/base__t1__1/attempt-2/trace.json").read_text())
    assert trace["events"][0]["text"].startswith(f"# {MASK}")
    assert trace[MASK] == "as a key too"

    index = json.loads((out / "index.json").read_text())
    assert index["experiment"]["experiment_id"] == f.EXP
    assert set(index["pins"]) == {"base"} and set(index["base_checks"]) == {"t1"}
    assert index["notes"][0]["message"] == f"canary {MASK} seen in trace"
    assert [(r["trial_key"], r["attempt"], r["contamination"]) for r in index["index"]] == [
        ("base/t1/1", 2, ["trace"])
    ]
    assert index["summary"][0]["pass_rate_pts"] == 100.0
    assert [a["attempt"] for a in index["attempts"]] == [1, 2]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no staging left


def test_export_replaces_an_earlier_export_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.experiment())
    store.put(f.trial())
    out = export_experiment(store, f.EXP, tmp_path / "out", None)
    (out / "stale.txt").write_text("from before")
    store.put(f.trial("skill"))
    export_experiment(store, f.EXP, out, None)
    assert not (out / "stale.txt").exists()
    assert (out / "trials/skill__t1__1/attempt-1/trace.json").is_file()


def test_export_refuses_unknown_experiment_and_foreign_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    with pytest.raises(ExportError, match="no experiment 'exp-missing'"):
        export_experiment(store, "exp-missing", tmp_path / "out", None)
    assert not (tmp_path / "out").exists()
    store.put(f.experiment())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    with pytest.raises(ExportError, match="not a hangar export"):
        export_experiment(store, f.EXP, mine, None)
    assert (mine / "thesis.tex").read_text() == "keep me"
