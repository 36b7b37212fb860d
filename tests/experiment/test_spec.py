"""The spec model refuses bad input with every problem named by field path and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.experiment.spec import SpecError, json_schema, load_spec, parse_spec

pytestmark = pytest.mark.unit

LOCK = "plain@sha256:" + "a" * 64


def good() -> dict[str, Any]:
    return {
        "name": "demo",
        "tasks": [
            {"id": "t1", "instructions": "fix it", "repo": "repo", "base": "base"},
            {"id": "t2", "instructions": "fix it too", "repo": "repo", "base": "base"},
        ],
        "variants": {"plain": {"harness_lock": LOCK}},
        "trials": 2,
    }


def problems_of(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return {p.path: f"{p.message} | {p.fix}" for p in info.value.problems}


def test_a_good_spec_parses_with_defaults() -> None:
    spec = parse_spec(good())
    assert spec.trials == 2
    assert spec.grader.command.startswith("hangar-grade pytest")
    assert spec.environment.egress.mode == "allowlist"  # the seed's default


def test_every_structural_problem_is_listed_at_once() -> None:
    data = good()
    data["trials"] = 0
    del data["tasks"][0]["base"]
    data["tasks"][1]["colour"] = "red"
    found = problems_of(data)
    assert set(found) == {"trials", "tasks[0].base", "tasks[1].colour"}
    assert "larger number" in found["trials"]
    assert "add this field" in found["tasks[0].base"]
    assert "remove it" in found["tasks[1].colour"]


def test_harness_lock_mixed_with_overlay_fields_names_them() -> None:
    data = good()
    data["variants"]["plain"].update({"model": "claude-sonnet-4-5-20250929", "skills": []})
    found = problems_of(data)
    assert "model, skills" in found["variants.plain"]


def test_unknown_task_in_variant_and_duplicate_task() -> None:
    data = good()
    data["tasks"][1]["id"] = "t1"
    data["variants"]["other"] = {"harness": "standin", "model": "sonnet", "tasks": ["t1", "nope"]}
    found = problems_of(data)
    assert "duplicate task id" in found["tasks[1].id"]
    assert "unknown task 'nope'" in found["variants.other.tasks[1]"]
    # An overlay's alias is refused at submit, not here: `hangar grade` may keep it.
    assert "variants.other.model" not in found


def test_malformed_lock_and_bad_names() -> None:
    data = good()
    data["name"] = "bad name!"
    data["variants"]["plain"]["harness_lock"] = "plain@sha256:1234"
    found = problems_of(data)
    assert {"name", "variants.plain.harness_lock"} <= set(found)


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError) as info:
        load_spec(bad)
    assert str(bad) in str(info.value)
    assert "YAML" in info.value.problems[0].message
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_committed_schema_is_fresh() -> None:
    committed = Path(__file__).parents[2] / "experiment.schema.json"
    assert committed.is_file(), "generate it: hangar experiment schema -o experiment.schema.json"
    assert json.loads(committed.read_text()) == json_schema(), (
        "experiment.schema.json is stale: run `hangar experiment schema -o experiment.schema.json`"
    )


def test_overlay_fields_are_marked_deprecated_in_the_schema() -> None:
    variant = json_schema()["$defs"]["Variant"]["properties"]
    assert variant["skills_remove"].get("deprecated") is True
    assert not variant["harness_lock"].get("deprecated")


def test_a_merge_key_may_override_what_it_merges(tmp_path: Path) -> None:
    """The loader refuses bombs and duplicate keys, not YAML's ordinary sharing."""
    data = good()
    path = tmp_path / "merge.yaml"
    path.write_text(
        "name: demo\n"
        "tasks:\n"
        "  - &t1 {id: t1, instructions: fix it, repo: repo, base: base}\n"
        "  - {<<: *t1, id: t2, base: other}\n"
        f"variants: {{plain: {{harness_lock: '{LOCK}'}}}}\n"
        "trials: 2\n"
    )
    spec = load_spec(path)
    assert [(t.id, t.base) for t in spec.tasks] == [("t1", "base"), ("t2", "other")]
    assert spec.trials == data["trials"]


def test_a_file_larger_than_its_size_says_is_cut_at_the_bound(tmp_path: Path) -> None:
    from hangar_dagster.util.fs import InputFileError, read_text_bounded

    # /proc files claim size 0; this one is far over a 16-byte bound.
    with pytest.raises(InputFileError, match="over the limit of 16 bytes"):
        read_text_bounded(Path("/proc/self/status"), 16, "probe")
    assert read_text_bounded(Path("/proc/self/status"), 1 << 20, "probe").startswith("Name:")


def test_the_question_fields_parse_and_stay_optional() -> None:
    data = good()
    data["variants"]["skill"] = {"harness_lock": LOCK, "changes": "adds the general-fix skill"}
    data.update(
        question="Does the skill help?",
        hypothesis="It steers the agent to the general fix.",
        baseline="plain",
        decide={"min_effect_pts": 10, "rule": "adopt it if it wins by 10 points"},
    )
    spec = parse_spec(data)
    assert (spec.question, spec.baseline) == ("Does the skill help?", "plain")
    assert spec.decide is not None and spec.decide.min_effect_pts == 10
    assert spec.variants["skill"].changes == "adds the general-fix skill"
    bare = parse_spec(good())
    assert (bare.question, bare.hypothesis, bare.baseline, bare.decide) == (None, None, None, None)
    assert bare.variants["plain"].changes is None


def test_an_unknown_baseline_names_the_field_and_the_known_variants() -> None:
    data = good()
    data["variants"]["skill"] = {"harness_lock": LOCK}
    data["baseline"] = "plian"
    found = problems_of(data)
    assert set(found) == {"baseline"}
    assert "'plian' is not a variant" in found["baseline"]
    assert "plain, skill" in found["baseline"]


@pytest.mark.parametrize(
    ("decide", "fix"),
    [
        ({"min_effect_pts": 0}, "larger number"),
        ({"min_effect_pts": -5}, "larger number"),
        ({"min_effect_pts": 150}, "smaller number"),
        ({"min_effect_pts": "10"}, "write a number"),
        ({"rule": "adopt it"}, "add this field"),
        ({"min_effect_pts": 10, "alpha": 0.1}, "remove it"),
    ],
)
def test_a_bad_decision_rule_is_refused_by_field(decide: dict[str, Any], fix: str) -> None:
    data = good()
    data["decide"] = decide
    found = problems_of(data)
    assert len(found) == 1
    ((path, why),) = found.items()
    assert path.startswith("decide") and fix in why


def test_an_empty_changes_line_is_refused() -> None:
    data = good()
    data["variants"]["plain"]["changes"] = ""
    assert "at least one character" in problems_of(data)["variants.plain.changes"]


def test_the_schema_documents_the_question_fields() -> None:
    schema = json_schema()
    for field in ("question", "hypothesis", "baseline", "decide"):
        assert schema["properties"][field].get("description") or field == "decide", field
    decide = schema["$defs"]["Decide"]
    assert decide["required"] == ["min_effect_pts"]
    assert decide["properties"]["min_effect_pts"]["exclusiveMinimum"] == 0
    assert "changes" in schema["$defs"]["Variant"]["properties"]
