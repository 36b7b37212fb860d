"""harnesses.lock.yaml: a lock whose CLI version differs from the registry's pin is refused at submit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.experiment.submit import submit
from hangar_dagster.settings import Settings
from tests.conftest import EXAMPLE, command_agent_spec, write_spec

pytestmark = pytest.mark.unit


def pinned_spec(example_dir: Path, tmp_path: Path, name: str, pins: object) -> Path:
    """The one-task command-harness spec (cli sh, version 1) with ``pins`` as its registry's file."""
    spec = command_agent_spec(example_dir, tmp_path, name, "true")
    (tmp_path / "registry" / "harnesses.lock.yaml").write_text(yaml.safe_dump(pins))
    return write_spec(example_dir, spec)


def refused(spec: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        submit(spec, Settings.from_env())
    return [str(p) for p in info.value.problems]


def test_a_lock_running_another_cli_version_is_refused_naming_both(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = pinned_spec(example_dir, tmp_path, "pins-mismatch", {"clis": {"sh": "2"}})
    [problem] = refused(spec)
    assert problem.startswith("variants.pins-mismatch.harness_lock:")
    assert "runs sh 1 but" in problem and "pins sh 2" in problem
    assert 'freeze the harness again with agent.version: "2"' in problem


def test_a_cli_the_file_does_not_pin_is_refused(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = pinned_spec(example_dir, tmp_path, "pins-missing", {"clis": {"claude": "2.1.332"}})
    [problem] = refused(spec)
    assert "pins no version of 'sh'" in problem and 'add `sh: "1"`' in problem


def test_a_malformed_pin_file_is_refused_naming_it(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = pinned_spec(example_dir, tmp_path, "pins-bad", {"clis": {"sh": 1}})
    problems = refused(spec)
    assert any(
        p.startswith("harness_repo:") and "harnesses.lock.yaml" in p and "quoted" in p
        for p in problems
    )


def test_a_matching_pin_submits(example_dir: Path, hangar_home: Path, tmp_path: Path) -> None:
    spec = pinned_spec(example_dir, tmp_path, "pins-ok", {"clis": {"sh": "1"}})
    exp = submit(spec, Settings.from_env())
    assert list(exp.variants) == ["pins-ok"]


def test_the_example_registry_pins_the_standin_its_locks_run() -> None:
    pins = yaml.safe_load((EXAMPLE / "harnesses" / "harnesses.lock.yaml").read_text())["clis"]
    for lock in (EXAMPLE / "harnesses").glob("*@sha256:*"):
        agent = yaml.safe_load((lock / "harness.yaml").read_text())["agent"]
        assert pins[agent["cli"]] == agent["version"]
    assert {"claude", "codex", "mini-swe-agent", "hangar-standin"} <= set(pins)
