"""Shadow policies: the YAML's checks name the field, and registering stores a cursor."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.settings import Settings
from hangar_dagster.shadow.policy import (
    load_policy,
    matches,
    read_state,
    register,
    registered,
    remove,
)
from tests.shadowfixtures import Mainline, standin_candidate

pytestmark = pytest.mark.unit

LOCK = "cand@sha256:" + "a" * 64
NOW = dt.datetime(2026, 12, 3, 1, 0, tzinfo=dt.UTC)


def write(tmp_path: Path, **kw: Any) -> Path:
    data: dict[str, Any] = {
        "name": "calc",
        "repo": "mainline",
        "mainline": "main",
        "harness_lock": LOCK,
        "sample_rate": 0.5,
        "max_per_night": 5,
    }
    data |= kw
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return path


def problems(path: Path) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        load_policy(path)
    return {p.path: f"{p.message} -> {p.fix}" for p in caught.value.problems}


def test_a_good_policy_loads_with_its_paths_made_absolute(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, harness_repo="registry"))
    assert policy.repo == str(tmp_path / "mainline")
    assert policy.harness_repo == str(tmp_path / "registry")
    assert policy.environment.egress.mode == "none"  # shadows always run with none
    assert policy.paths.tests  # defaults name the usual test files


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"sample_rate": 0}, "sample_rate", "greater than 0"),
        ({"sample_rate": 1.5}, "sample_rate", "less than or equal to 1"),
        ({"sample_rate": "half"}, "sample_rate", "number"),
        ({"max_per_night": 0}, "max_per_night", "larger number"),
        ({"harness_lock": "candidate"}, "harness_lock", "name@sha256"),
        ({"name": "no spaces"}, "name", "not a valid shadow name"),
        ({"name": "x" * 31}, "name", "at most 30"),
        ({"repo": None}, "repo", "add this field"),
        ({"sampel_rate": 0.1}, "sampel_rate", "check its spelling"),
        ({"environment": {"egress": {"mode": "allowlist"}}}, "environment.egress.mode", "none"),
        ({"paths": {"tests": ["/abs/**"]}}, "paths.tests[0]", "relative glob"),
        ({"grader": {"files": {"a.py": ""}}}, "grader.files", "remove it"),
    ],
)
def test_each_bad_field_is_named_with_its_fix(
    tmp_path: Path, change: dict[str, Any], field: str, words: str
) -> None:
    said = problems(write(tmp_path, **change))
    assert field in said, said
    assert words in said[field]


def test_every_problem_is_listed_not_just_the_first(tmp_path: Path) -> None:
    said = problems(write(tmp_path, name="a b", harness_lock="x"))
    assert {"name", "harness_lock"} <= said.keys()


def test_globs_match_at_the_root_too() -> None:
    assert matches("test_calc.py", ["**/test_*.py"])
    assert matches("pkg/tests/test_calc.py", ["**/test_*.py"])
    assert matches("tests/unit/x.py", ["tests/**"])
    assert not matches("calc.py", ["tests/**", "**/test_*.py"])


def test_register_sets_the_cursor_at_the_mainline_head_and_remove_forgets_it(
    tmp_path: Path,
) -> None:
    repo = Mainline(tmp_path)
    registry, lock = standin_candidate(tmp_path, {})
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    policy = load_policy(write(tmp_path, harness_lock=lock, harness_repo="registry"))
    register(policy, settings, NOW)
    assert registered(settings.paths) == ["calc"]
    assert read_state(settings.paths, "calc").cursor == repo.head()
    with pytest.raises(SpecError, match="is registered"):
        register(policy, settings, NOW)
    assert remove(settings.paths, "calc") and registered(settings.paths) == []
    assert not remove(settings.paths, "calc")


def test_register_refuses_a_missing_branch_or_lock_and_writes_nothing(tmp_path: Path) -> None:
    Mainline(tmp_path)
    standin_candidate(tmp_path, {})
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    policy = load_policy(write(tmp_path, mainline="trunk", harness_repo="registry"))
    with pytest.raises(SpecError) as caught:
        register(policy, settings, NOW)
    said = {p.path for p in caught.value.problems}
    assert said == {"mainline", "harness_lock"}
    assert registered(settings.paths) == []
