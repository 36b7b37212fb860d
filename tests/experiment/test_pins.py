"""Pin sets are content-addressed: same inputs, same id; any one input changed, a new id."""

from __future__ import annotations

from typing import Any

import pytest

from hangar_dagster.experiment.pins import (
    environment_digest,
    pin_content,
    pin_set_id,
    pin_set_record,
)
from hangar_dagster.experiment.spec import Environment

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
