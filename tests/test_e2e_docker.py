"""A small experiment end to end on the Docker sandbox: the stand-in agent, the base image by
digest, sealed grades; afterwards no hangar container is left on the engine. And submit
refuses the image by tag, naming the digest to pin instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.experiment.submit import submit
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.trials.sandbox.docker import MANAGED_LABEL, client
from tests.conftest import hangar, one_task_spec

pytestmark = [pytest.mark.slow, pytest.mark.needs_sandbox("docker")]


def docker_spec(example_dir: Path, image: str, name: str) -> Path:
    return one_task_spec(example_dir, name, sandbox="docker", image=image)


def test_an_experiment_runs_and_grades_on_docker_and_leaves_no_container(
    example_dir: Path, docker_base_image: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    spec = docker_spec(example_dir, docker_base_image, "docker-e2e.yaml")
    result = hangar("experiment", "run", str(spec), "--wait", home=home)
    assert result.returncode == 0, result.stdout + result.stderr
    experiment_id = result.stdout.split("submitted ")[1].split()[0]
    store = Store(HangarPaths(home))
    trials, grades = store.trials(experiment_id), store.grades(experiment_id)
    assert len(trials) == 2 and len(grades) == 2, (trials, grades)
    for t in trials:
        assert t.outcome_class != "infra_error", (t.infra_reason, t.error)
        assert t.manifest["sandbox"]["backend"] == "docker"
        assert t.manifest["sandbox"]["image"] == docker_base_image
    # The skill variant fixes the bug; graded sealed, with the uid split in the container.
    by_variant = {t.trial_key.split("/")[0]: t for t in trials}
    assert by_variant.keys() == {"plain", "skill"}
    assert {g.trust for g in grades} == {"isolated"}
    assert any(g.passed for g in grades)
    left = client().api.containers(
        all=True, filters={"label": [f"{MANAGED_LABEL}=1", f"hangar.experiment={experiment_id}"]}
    )
    assert left == []


def test_submit_refuses_an_image_by_tag_with_the_digest_it_resolves_to(
    example_dir: Path, docker_base_image: str, hangar_home: Path
) -> None:
    spec = docker_spec(example_dir, "hangar-base:bookworm", "docker-tag.yaml")
    with pytest.raises(SpecError) as info:
        submit(spec, Settings.from_env())
    (problem,) = [p for p in info.value.problems if p.path == "environment.image"]
    assert "is a tag" in problem.message and docker_base_image in problem.fix
    assert not hangar_home.exists()


def test_submit_pins_a_local_image_id(
    example_dir: Path, docker_base_image: str, hangar_home: Path
) -> None:
    exp = submit(docker_spec(example_dir, docker_base_image, "docker-id.yaml"), Settings.from_env())
    assert exp.spec.environment.image == docker_base_image
    assert {v.environment.image for v in exp.variants.values()} == {docker_base_image}
