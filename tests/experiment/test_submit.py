"""Submit resolves what a spec points at, and a refused spec writes nothing at all."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.experiment.submit import load_resolved, submit
from hangar_dagster.settings import Settings, paths
from hangar_dagster.util.gitrepo import git
from tests.conftest import hangar

pytestmark = pytest.mark.unit


def edited_spec(example_dir: Path, tmp_path: Path, edit: dict[str, object]) -> Path:
    data = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    for dotted, value in edit.items():
        target = data
        *parents, last = dotted.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is None:
            del target[last]
        else:
            target[last] = value
    spec = example_dir / f"edited-{tmp_path.name}.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec


def test_submit_resolves_bases_to_full_shas_and_pins_every_variant(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    for task in exp.tasks.values():
        assert task.base_sha == git("rev-parse", "base", cwd=Path(task.repo)).strip()
        assert task.hidden_files
    assert {v.pin_set for v in exp.variants.values()} and all(
        v.pin_set.startswith("pin-") for v in exp.variants.values()
    )
    assert len({v.pin_set for v in exp.variants.values()}) == len(exp.variants)
    assert exp.canary.startswith("HANGAR-CANARY-")
    again = load_resolved(paths(), exp.experiment_id)
    assert again == exp


def test_a_second_submit_gets_a_fresh_canary_but_the_same_pins(
    example_dir: Path, hangar_home: Path
) -> None:
    a = submit(example_dir / "experiment.yaml", Settings.from_env())
    b = submit(example_dir / "experiment.yaml", Settings.from_env())
    assert a.experiment_id != b.experiment_id
    assert a.canary != b.canary
    assert {v.pin_set for v in a.variants.values()} == {v.pin_set for v in b.variants.values()}


def test_a_tasks_own_build_is_resolved_and_moves_the_pins_of_its_variants(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    plain = submit(example_dir / "experiment.yaml", Settings.from_env())
    spec = edited_spec(example_dir, tmp_path, {"tasks.0.build": ["pip install six==1.16.0"]})
    built = submit(spec, Settings.from_env())
    first = next(iter(built.tasks))
    assert built.tasks[first].build == ("pip install six==1.16.0",)
    assert all(t.build == () for t in plain.tasks.values())
    for name, variant in built.variants.items():
        moved = first in variant.tasks
        assert (variant.environment_digest != plain.variants[name].environment_digest) == moved
        assert (variant.pin_set != plain.variants[name].pin_set) == moved
    assert load_resolved(paths(), built.experiment_id) == built


@pytest.mark.parametrize(
    "edit,path",
    [
        ({"tasks.0.base": "no-such-ref"}, "tasks[0].base"),
        (
            {"variants.plain.harness_lock": "standin-plain@sha256:" + "0" * 64},
            "variants.plain.harness_lock",
        ),
        ({"tasks.1.hidden_tests": "no/such/dir"}, "tasks[1].hidden_tests"),
        ({"tasks.0.reference_patch": "missing.diff"}, "tasks[0].reference_patch"),
    ],
)
def test_resolution_problems_are_refused_with_the_field(
    example_dir: Path, hangar_home: Path, tmp_path: Path, edit: dict[str, object], path: str
) -> None:
    spec = edited_spec(example_dir, tmp_path, edit)
    with pytest.raises(SpecError) as info:
        submit(spec, Settings.from_env())
    assert path in [p.path for p in info.value.problems]
    assert not hangar_home.exists(), "a refused spec must write nothing"


def test_every_egress_mode_is_accepted_and_pinned(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    """Regression: a mode other than none was refused at submit (there was no egress proxy)."""
    pin_sets: dict[str | None, set[str]] = {}
    for mode in ("none", "allowlist", "mirror", None):
        # None deletes the example's own `mode: none`: the spec then sets no egress.mode.
        spec = edited_spec(
            example_dir, tmp_path / (mode or "unset"), {"environment.egress.mode": mode}
        )
        exp = submit(spec, Settings.from_env())
        modes = {v.environment.egress.mode for v in exp.variants.values()}
        assert modes == {mode or "allowlist"}  # unset: the seed's default
        pin_sets[mode] = {v.pin_set for v in exp.variants.values()}
    assert pin_sets[None] == pin_sets["allowlist"]  # the default is pinned as allowlist
    assert len({frozenset(p) for p in pin_sets.values()}) == 3  # each policy: its own pin sets


@pytest.mark.parametrize("image", [None, "registry.example.com/hangar-dagster:0.1.0"])
def test_a_k8s_environment_needs_its_image_by_digest(
    example_dir: Path, hangar_home: Path, tmp_path: Path, image: str | None
) -> None:
    edit: dict[str, object] = {"environment.sandbox": "k8s"}
    if image is not None:
        edit["environment.image"] = image
    with pytest.raises(SpecError) as info:
        submit(edited_spec(example_dir, tmp_path, edit), Settings.from_env())
    (problem,) = [p for p in info.value.problems if p.path == "environment.image"]
    assert "by digest" in problem.message and "repo@sha256" in problem.fix
    assert not hangar_home.exists()
    pinned = "registry.example.com/hangar-dagster@sha256:" + "c" * 64
    edit["environment.image"] = pinned
    exp = submit(edited_spec(example_dir, tmp_path / "pinned", edit), Settings.from_env())
    assert {v.environment.image for v in exp.variants.values()} == {pinned}
    assert {v.environment.sandbox for v in exp.variants.values()} == {"k8s"}


def test_a_lock_edited_after_freezing_is_refused(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "example"
    shutil.copytree(example_dir, copy, symlinks=True)
    lock_dir = next((copy / "harnesses").iterdir())
    (lock_dir / "harness.yaml").write_text((lock_dir / "harness.yaml").read_text() + "\n# edited\n")
    with pytest.raises(SpecError, match="changed after it was frozen"):
        submit(copy / "experiment.yaml", Settings.from_env())


@pytest.mark.integration
def test_cli_refuses_a_bad_spec_lists_every_problem_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "bad",
                "trials": 0,
                "tasks": [
                    {"id": "a", "instructions": "x", "repo": "r", "base": "b"},
                    {"id": "a", "instructions": "y", "repo": "r"},
                ],
                "variants": {"v": {"harness_lock": "x@sha256:" + "1" * 64, "model": "opus"}},
            }
        )
    )
    home = tmp_path / "home"
    result = hangar("experiment", "run", str(bad), "--wait", home=home)
    assert result.returncode == 2
    for expected in ("trials", "tasks[1].base"):
        assert expected in result.stderr
    assert not home.exists()
