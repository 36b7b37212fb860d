"""Pin sets are content-addressed: same inputs, same id; any one input changed, a new id."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

import pytest

from hangar_dagster.environment.build import build_definition
from hangar_dagster.experiment.pins import (
    environment_digest,
    pin_content,
    pin_set_id,
    pin_set_record,
)
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.util.digests import sha256_json

pytestmark = pytest.mark.unit


def inputs() -> dict[str, Any]:
    return {
        "harness_lock": "plain@sha256:" + "a" * 64,
        "harness_digest": "a" * 64,
        "environment_digest": environment_digest(Environment()),
        "model": "standin-scripted-2026-01-01",
        "task_bases": {"t1": "1" * 40, "t2": "2" * 40},
        "grader_digest": "sha256:" + "g" * 64,
        "egress": "none",
        "aliases": frozenset(),
    }


def test_same_inputs_same_id_regardless_of_task_order() -> None:
    a = pin_content(**inputs())
    shuffled = inputs()
    shuffled["task_bases"] = {"t2": "2" * 40, "t1": "1" * 40}
    assert pin_set_id(a) == pin_set_id(pin_content(**shuffled))
    assert pin_set_id(a).startswith("pin-")


@pytest.mark.parametrize(
    "field,value",
    [
        ("harness_digest", "b" * 64),
        ("environment_digest", environment_digest(Environment(sandbox="unshare"))),
        ("model", "standin-scripted-2026-02-01"),
        ("task_bases", {"t1": "1" * 40, "t2": "3" * 40}),
        ("grader_digest", "sha256:" + "h" * 64),
        ("egress", "allowlist"),
    ],
)
def test_any_changed_input_is_a_new_id(field: str, value: Any) -> None:
    changed = inputs()
    changed[field] = value
    assert pin_set_id(pin_content(**changed)) != pin_set_id(pin_content(**inputs()))


def test_environment_digest_covers_resources() -> None:
    assert environment_digest(Environment()) != environment_digest(
        Environment(resources={"timeout_s": 5})
    )  # type: ignore[arg-type]


def test_record_carries_its_own_id() -> None:
    record = pin_set_record(pin_content(**inputs()))
    assert record.pin_set == pin_set_id(pin_content(**inputs()))
    assert record.model_concrete is True


def test_a_build_is_part_of_the_environment_digest() -> None:
    plain = Environment()
    built = Environment(build=["pip install -e ."])
    # Without a build anywhere, the digest is what it always was (no pin set moves).
    assert environment_digest(plain) == environment_digest(plain, {"t1": []})
    assert environment_digest(plain) == "sha256:" + sha256_json(plain.model_dump(mode="json"))
    digests = {
        environment_digest(built),
        environment_digest(Environment(build=["pip install -e .", "pip install six"])),
        environment_digest(plain, {"t1": ["pip install six==1.16.0"]}),
        environment_digest(plain, {"t1": ["pip install six==1.17.0"]}),
        environment_digest(built, {"t1": ["pip install six==1.16.0"]}),
        environment_digest(Environment(build=["pip install -e ."], sandbox="unshare")),
    }
    assert len(digests) == 6  # every changed build is a new environment digest


def test_the_build_definition_covers_the_runner_and_the_interpreter() -> None:
    definition = build_definition(Environment(build=["true"]), {"t2": ["b"], "t1": ["a"], "t3": []})
    assert definition is not None
    assert definition["runner"] == f"pytest=={importlib.metadata.version('pytest')}"
    assert definition["python"] == ".".join(map(str, sys.version_info[:3]))
    assert definition["tasks"] == {"t1": ["a"], "t2": ["b"]}  # sorted, empty ones left out
    assert (definition["sandbox"], definition["image"]) == ("bwrap", None)
    assert build_definition(Environment(), {"t1": []}) is None
