"""Overlay variants: built as real harnesses at submit, noted as deprecated, pinned by their first
finished trial, and turned into harness locks by freeze-variants (whose spec reproduces the pins)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.harness import MANIFEST, HarnessLock, freeze, load_lock, tree_digest
from hangar_dagster.experiment.overlay import (
    OverlayError,
    build,
    first_finished,
    ran_harness_digest,
    record_pins,
)
from hangar_dagster.experiment.spec import SpecError, Variant
from hangar_dagster.experiment.submit import submit
from hangar_dagster.settings import Settings
from tests.conftest import EXAMPLE, hangar, write_spec
from tests.factories import trial

pytestmark = pytest.mark.unit

APPEND = "Before you stop, run the visible check a second time."


def registry_with_default(tmp_path: Path) -> tuple[Path, HarnessLock]:
    """A registry holding the example's skill harness frozen under the name ``default``."""
    src = tmp_path / "default-src"
    shutil.copytree(EXAMPLE / "harness-src" / "standin-skill", src)
    config = yaml.safe_load((src / MANIFEST).read_text())
    config["name"] = "default"
    (src / MANIFEST).write_text(yaml.safe_dump(config))
    registry = tmp_path / "registry"
    return registry, freeze(src, registry)


def built(tmp_path: Path, name: str, registry: Path | None, **fields: Any) -> HarnessLock:
    return build(
        "demo", name, Variant.model_validate(fields), EXAMPLE, registry, tmp_path / "overlays"
    )


def test_empty_overlay_is_the_default_harness_renamed_with_its_provenance(tmp_path: Path) -> None:
    registry, default = registry_with_default(tmp_path)
    lock = built(tmp_path, "base", registry)
    assert lock.name == "demo-base" and lock.path.parent == tmp_path / "overlays"
    assert lock.config["overlay"] == {"base": default.ref, "fields": []}
    assert lock.model == default.model and lock.adapter == "standin"
    for rel in ("instructions.md", "playbook.yaml", "skills/general-fix/SKILL.md"):
        assert (lock.path / rel).read_bytes() == (default.path / rel).read_bytes()
    # Same base and fields, same digest: the pin does not depend on when or where it was built.
    again = build(
        "demo", "base", Variant.model_validate({}), EXAMPLE, registry, tmp_path / "elsewhere"
    )
    assert again.ref == lock.ref


def test_overlay_fields_change_the_harness(tmp_path: Path) -> None:
    registry, default = registry_with_default(tmp_path)
    no_skills = built(tmp_path, "noskills", registry, skills=[])
    assert not no_skills.skills_dir.exists()
    removed = built(tmp_path, "removed", registry, skills_remove=["general-fix"])
    assert not removed.skills_dir.exists()
    careful = built(
        tmp_path,
        "careful",
        registry,
        instructions_append=APPEND,
        model="standin-scripted-2026-02-01",
        approvals="ask",
    )
    assert careful.instructions_file is not None
    text = careful.instructions_file.read_text()
    assert default.instructions_file is not None
    assert text.startswith(default.instructions_file.read_text().rstrip())
    assert text.endswith(f"\n\n{APPEND}\n")
    assert careful.model == "standin-scripted-2026-02-01"
    assert careful.config["approvals"] == "ask"
    assert careful.config["overlay"]["fields"] == ["model", "approvals", "instructions_append"]
    replaced = built(tmp_path, "replaced", registry, instructions="Only this.")
    assert replaced.instructions_file is not None
    assert replaced.instructions_file.read_text() == "Only this.\n"
    assert len({no_skills.digest, careful.digest, replaced.digest, default.digest}) == 4


def test_base_by_directory_ref_and_name(tmp_path: Path) -> None:
    registry, default = registry_with_default(tmp_path)
    from_dir = built(tmp_path, "dir", None, harness="harness-src/standin-plain")
    plain = EXAMPLE / "harness-src" / "standin-plain"
    assert from_dir.config["overlay"]["base"] == f"standin-plain@sha256:{tree_digest(plain)}"
    assert not from_dir.skills_dir.exists()
    by_ref = built(tmp_path, "ref", registry, harness=default.ref)
    by_name = built(tmp_path, "ref", registry, harness="default")
    assert by_ref.ref == by_name.ref
    assert by_ref.config["overlay"]["base"] == default.ref


@pytest.mark.parametrize(
    ("fields", "path", "words"),
    [
        ({}, "variants.v", "'default'"),
        ({"harness": "nothing-here"}, "variants.v.harness", "nothing-here"),
        ({"skills_remove": ["nope"]}, "variants.v.skills_remove", "general-fix"),
        ({"skills": ["general-fix", "nope"]}, "variants.v.skills", "nope"),
    ],
)
def test_an_overlay_that_cannot_apply_names_the_field(
    tmp_path: Path, fields: dict[str, Any], path: str, words: str
) -> None:
    registry, _ = registry_with_default(tmp_path)
    if not fields:  # no default harness in this registry
        registry = tmp_path / "empty-registry"
        registry.mkdir()
    with pytest.raises(OverlayError) as caught:
        built(tmp_path, "v", registry, **fields)
    assert caught.value.problem.path == path
    assert words in str(caught.value)
    assert caught.value.problem.fix


def test_the_first_finished_trial_and_the_digest_its_turn_1_ran() -> None:
    import datetime as dt

    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    early_infra = trial(
        variant="v", outcome_class="infra_error", finished_at=at, infra_reason="clone"
    )
    later = trial(variant="v", replicate=2, finished_at=at + dt.timedelta(minutes=1))
    first = trial(variant="v", replicate=3, finished_at=at + dt.timedelta(seconds=30))
    other = trial(variant="w", finished_at=at - dt.timedelta(hours=1))
    assert first_finished([early_infra, later, first, other], "v") is first
    assert first_finished([early_infra], "v") is None
    reported = first.model_copy(update={"trace": {"fingerprint": {"harness_digest": "c" * 64}}})
    assert ran_harness_digest(reported) == "c" * 64
    ref = first.model_copy(update={"trace": {"fingerprint": {"harness": f"x@sha256:{'d' * 64}"}}})
    assert ran_harness_digest(ref) == "d" * 64
    silent = first.model_copy(update={"trace": {"fingerprint": {}}})
    assert ran_harness_digest(silent) == first.harness_digest


def test_a_refused_overlay_spec_writes_nothing(
    example_dir: Path, tmp_path: Path, hangar_home: Path
) -> None:
    spec_path = overlay_spec(example_dir, tmp_path, "overlay-refused")
    spec = yaml.safe_load(spec_path.read_text())
    spec["variants"]["noskills"] = {"skills_remove": ["no-such-skill"]}
    spec_path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as caught:
        submit(spec_path, Settings.from_env())
    (problem,) = caught.value.problems
    assert problem.path == "variants.noskills.skills_remove" and "no-such-skill" in problem.message
    assert not hangar_home.exists()


def overlay_spec(example_dir: Path, tmp_path: Path, name: str) -> Path:
    registry, _ = registry_with_default(tmp_path)
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec.pop("baseline", None)  # the example's baseline names a variant this spec replaces
    spec.update(
        name=name,
        harness_repo=str(registry),
        tasks=[t for t in spec["tasks"] if t["id"] == "median"],
        variants={
            "base": {},
            "noskills": {"skills": []},
            "careful": {"instructions_append": APPEND},
        },
        trials=1,
    )
    return write_spec(example_dir, spec)


def get_json(name: str, home: Path) -> dict[str, Any]:
    got = hangar("experiment", "get", name, "--json", home=home)
    assert got.returncode == 0, got.stdout + got.stderr
    data: dict[str, Any] = json.loads(got.stdout)
    return data


@pytest.mark.slow
def test_overlay_experiment_runs_pins_and_freezes_into_locks_that_reproduce_the_pins(
    example_dir: Path, tmp_path: Path
) -> None:
    spec_path = overlay_spec(example_dir, tmp_path, "overlay-demo")
    home = tmp_path / "home"
    ran = hangar("experiment", "run", str(spec_path), "--wait", home=home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    first = get_json("overlay-demo", home)
    experiment_id = first["experiment"]["experiment_id"]
    notes = [n["message"] for n in first["notes"] if n["kind"] == "deprecation"]
    assert sorted(m.split()[1] for m in notes) == ["base", "careful", "noskills"]
    assert all("freeze-variants" in m for m in notes)
    assert {t["outcome_class"] for t in first["trials"]} <= {"completed", "empty_patch"}
    pins = first["pins"]
    assert sorted(pins) == ["base", "careful", "noskills"]
    assert len({p["harness_digest"] for p in pins.values()}) == 3
    overlays = home / "experiments" / experiment_id / "overlays"
    for variant, pin in pins.items():
        # Built in the experiment's own directory, never in the team registry.
        lock = load_lock(overlays, pin["harness_lock"])
        assert lock.name == f"overlay-demo-{variant}"
        (row,) = [t for t in first["trials"] if t["trial_key"].startswith(f"{variant}/")]
        assert row["pin_set"] == pin["pin_set"]
    assert not list((tmp_path / "registry").glob("overlay-demo-*"))
    assert sum(n["kind"] == "pins" for n in first["notes"]) == 3

    out, locked = tmp_path / "team-registry", tmp_path / "specs" / "locked.yaml"
    froze = hangar(
        "experiment", "freeze-variants", experiment_id, "--out", str(out), "-o", str(locked),
        home=home,
    )  # fmt: skip
    assert froze.returncode == 0, froze.stdout + froze.stderr
    spec = yaml.safe_load(locked.read_text())
    assert spec["variants"] == {v: {"harness_lock": pins[v]["harness_lock"]} for v in pins}
    assert "canary" not in spec["grader"]
    # Bases are the resolved SHAs: a tag moved later cannot change what locked.yaml pins.
    assert {t["id"]: t["base"] for t in spec["tasks"]} == pins["base"]["task_bases"]
    assert (locked.parent / spec["harness_repo"]).resolve() == out.resolve()
    text, listing = locked.read_text(), sorted(p.name for p in out.iterdir())
    again = hangar(
        "experiment", "freeze-variants", experiment_id, "--out", str(out), "-o", str(locked),
        home=home,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert locked.read_text() == text and sorted(p.name for p in out.iterdir()) == listing

    rerun = hangar("experiment", "run", str(locked), "--wait", home=home)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    second = get_json("overlay-demo", home)
    assert second["experiment"]["experiment_id"] != experiment_id
    assert not [n for n in second["notes"] if n["kind"] == "deprecation"]
    for variant, pin in second["pins"].items():
        assert pin["harness_digest"] == pins[variant]["harness_digest"]
        assert pin["pin_set"] == pins[variant]["pin_set"]

    # What ran is what gets frozen: a harness edited after its trial is refused, not frozen.
    edited = overlays / pins["careful"]["harness_lock"] / "instructions.md"
    edited.write_text(edited.read_text() + "One more rule.\n")
    refused = hangar(
        "experiment", "freeze-variants", experiment_id, "--out", str(out),
        "-o", str(tmp_path / "other.yaml"), home=home,
    )  # fmt: skip
    assert refused.returncode == 2
    message = " ".join(refused.stderr.split())
    assert "variant careful" in message and "changed afterwards" in message
    assert not (tmp_path / "other.yaml").exists()


@pytest.mark.integration
def test_freeze_variants_without_a_finished_trial_names_the_variants(
    example_dir: Path, tmp_path: Path
) -> None:
    spec_path = overlay_spec(example_dir, tmp_path, "overlay-queued")
    home = tmp_path / "home"
    queued = hangar("experiment", "run", str(spec_path), home=home)  # submitted, nothing ran
    assert queued.returncode == 0, queued.stdout + queued.stderr
    out = tmp_path / "team-registry"
    froze = hangar(
        "experiment", "freeze-variants", "overlay-queued", "--out", str(out),
        "-o", str(tmp_path / "locked.yaml"), home=home,
    )  # fmt: skip
    assert froze.returncode == 2
    message = " ".join(froze.stderr.split())
    assert "no finished trial of overlay variant(s) base, careful, noskills" in message
    assert not out.exists() and not (tmp_path / "locked.yaml").exists()


def test_recording_pins_reads_no_store_without_an_overlay_variant() -> None:
    # called after every finished trial: an experiment of harness locks only costs nothing there
    class NoReads:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the store was read: {name}")

    exp: Any = SimpleNamespace(
        experiment_id="e", variants={"a": SimpleNamespace(name="a", overlay=None)}
    )
    assert record_pins(exp, NoReads(), "run-1") == []  # type: ignore[arg-type]
