"""Stage results as metadata a person can read: real booleans, run links, paths, a table, no
empty rows; and what Dagster records of it (kinds, owners, the pin sets as code version)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.experiment.plan import TrialKey
from hangar_dagster.experiment.stage import pins_version
from hangar_dagster.experiment.submit import submit
from hangar_dagster.grading.stage import BaseCheckPartition, GradePartition
from hangar_dagster.orchestration import metadata as md
from hangar_dagster.orchestration.assets import build_experiment_assets
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.results.summary import IndexSummary
from hangar_dagster.settings import Settings
from hangar_dagster.trials.stage import TrialPartition
from tests import factories as f

pytestmark = pytest.mark.integration

KEY = TrialKey("base", "t1", 1)
CANARY = "HANGAR-CANARY-0123456789abcdef0123456789abcdef"


def test_trial_metadata_has_typed_values_and_no_rows_for_absent_fields() -> None:
    record = f.trial(verify_passed=True, retry_of=None, infra_reason=None, drift=None)
    meta = md.trial_metadata(TrialPartition(KEY, record=record), CANARY)
    assert meta["verify_passed"] is True and meta["reused"] is False
    assert meta["run_of_attempt"] == dg.MetadataValue.dagster_run(record.run_id)
    assert meta["artifacts"] == dg.MetadataValue.path(record.artifacts_dir)
    assert not {"retry_of", "infra_reason", "drift"} & set(meta)
    assert all(v != "" for v in meta.values())


def test_trial_metadata_links_the_retried_run_and_leaves_out_an_unrun_verify() -> None:
    record = f.trial(
        attempt=2, retry_of="run-first", verify_passed=None, infra_reason="provider_5xx"
    )
    meta = md.trial_metadata(TrialPartition(KEY, record=record, reused=True), CANARY)
    assert meta["retry_of"] == dg.MetadataValue.dagster_run("run-first")
    assert "verify_passed" not in meta
    assert (meta["reused"], meta["infra_reason"], meta["attempt"]) == (True, "provider_5xx", 2)


def test_skipped_and_unstarted_trials_say_only_why() -> None:
    assert md.trial_metadata(TrialPartition(KEY, skipped="not pending"), CANARY) == {
        "skipped": "not pending"
    }
    assert md.trial_metadata(TrialPartition(KEY, not_started="eval_window: x"), CANARY) == {
        "started": False,
        "reason": "eval_window: x",
    }


def test_trial_metadata_is_redacted() -> None:
    record = f.trial(drift=f"harness: cli_version '1' -> '{CANARY}'")
    meta = md.trial_metadata(TrialPartition(KEY, record=record), CANARY)
    assert CANARY not in str(meta["drift"])


def test_grade_metadata_joins_signals_and_omits_empty_ones() -> None:
    clean = md.grade_metadata(GradePartition(KEY, grade=f.grade()), CANARY)
    assert clean["passed"] is True and clean["task_invalid"] is False
    assert not {"tamper_signals", "touched_tests", "contamination", "reason"} & set(clean)
    assert clean["graded_in_run"] == dg.MetadataValue.dagster_run(f.grade().run_id)
    flagged = f.grade(passed=False, tamper_signals=["conftest", "gc"], reason="timed out")
    meta = md.grade_metadata(GradePartition(KEY, grade=flagged), CANARY)
    assert (meta["passed"], meta["tamper_signals"], meta["reason"]) == (
        False,
        "conftest, gc",
        "timed out",
    )
    assert md.grade_metadata(GradePartition(KEY, skipped="no trial"), CANARY) == {
        "skipped": "no trial"
    }


def test_a_grade_links_its_trials_run_materialization_and_evidence_page(tmp_path: Path) -> None:
    trials = dg.AssetKey(["exp-1", "trials"])
    page = tmp_path / "report" / "trials" / "base__t1__1.html"
    links = md.TrialLinks(
        "run-of-trial",
        trials,
        "base|t1.r1",
        md.partition_url("http://127.0.0.1:3000/", trials, "base|t1.r1"),
        page,
    )
    meta = md.grade_metadata(GradePartition(KEY, grade=f.grade()), CANARY, links)
    assert meta["trial_run"] == dg.MetadataValue.dagster_run("run-of-trial")
    assert meta["trial_asset"] == dg.MetadataValue.asset(trials)
    assert meta["trial_partition"] == "base|t1.r1"
    assert meta["trial_materialization"] == dg.MetadataValue.url(
        "http://127.0.0.1:3000/assets/exp-1/trials?view=partitions&partition=base%7Ct1.r1"
    )
    assert meta["evidence"] == dg.MetadataValue.path(str(page))
    # without a known webserver URL: no URL row, the asset link and the run stay
    bare = md.grade_metadata(
        GradePartition(KEY, grade=f.grade()), CANARY, md.TrialLinks("r", trials, "p")
    )
    assert "trial_materialization" not in bare and "evidence" not in bare and "trial_run" in bare
    trial = md.trial_metadata(TrialPartition(KEY, record=f.trial()), CANARY, page)
    assert trial["evidence"] == dg.MetadataValue.path(str(page))


def test_base_check_metadata_has_booleans_a_run_link_and_the_log_path(tmp_path: Path) -> None:
    check = f.base_check(reference_passed=True, run_id="run-b")
    meta = md.base_check_metadata(BaseCheckPartition("t1", check, False, tmp_path / "log"))
    assert meta["reference_passed"] is True and meta["invalid"] is False
    assert meta["checked_in_run"] == dg.MetadataValue.dagster_run("run-b")
    assert meta["log"] == dg.MetadataValue.path(str(tmp_path / "log"))
    assert "reason" not in meta
    no_ref = f.base_check(reference_given=False, reference_passed=None, reference_counts=None)
    meta = md.base_check_metadata(BaseCheckPartition("t1", no_ref, True, tmp_path / "log"))
    assert not {"reference_passed", "reference_counts"} & set(meta)


def test_index_metadata_is_a_table_with_a_schema(tmp_path: Path) -> None:
    summary = IndexSummary(
        variants=[
            {"variant": "plain", "trials": 9, "graded": 9, "passed": 3, "pass_rate_pts": 33.3},
            {"variant": "skill", "trials": 9, "graded": 0, "passed": 0, "pass_rate_pts": None},
        ],
        trial_keys=18,
        pending_trials=0,
        waiting_for=None,
        queue_notes=[],
        graded=9,
        passed=3,
        invalid_tasks=[],
        duckdb=tmp_path / "hangar.duckdb",
    )
    meta = md.index_metadata(summary, CANARY)
    table = meta["summary"]
    assert isinstance(table, dg.TableMetadataValue)
    assert table.schema == md.SUMMARY_SCHEMA
    assert [c.name for c in table.schema.columns] == [
        "variant",
        "trials",
        "graded",
        "passed",
        "pass_rate_pts",
    ]
    assert [r.data for r in table.records][0] == summary.variants[0]
    assert not {"waiting_for", "queue_notes", "invalid_tasks"} & set(meta)
    assert meta["duckdb"] == dg.MetadataValue.path(str(tmp_path / "hangar.duckdb"))


@pytest.mark.parametrize(
    ("author", "owner"), [("ana", "team:ana"), ("ana@example.com", "ana@example.com")]
)
def test_the_author_is_an_owner_dagster_accepts(
    example_dir: Path, hangar_home: Path, author: str, owner: str
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    exp = exp.model_copy(update={"author": author})
    defs = dg.Definitions(
        assets=build_experiment_assets(exp),
        resources={"hangar": HangarResource.from_settings(Settings.from_env())},
    )
    specs = defs.resolve_all_asset_specs()
    assert {tuple(s.owners) for s in specs} == {(owner,)}
    assert {frozenset(s.kinds) for s in specs} == {frozenset(md.KINDS)}


def test_a_materialization_records_the_pin_sets_and_typed_metadata(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            build_experiment_assets(exp),
            selection=[dg.AssetKey([exp.experiment_id, s]) for s in ("spec", "pin_sets")],
            resources={"hangar": HangarResource.from_settings(Settings.from_env())},
            instance=instance,
            partition_key="plain",
        )
        assert result.success
        pins = dg.AssetKey([exp.experiment_id, "pin_sets"])
        [record] = instance.fetch_materializations(pins, limit=10).records
        mat = record.asset_materialization
        assert mat is not None and mat.partition == "plain"
        assert mat.tags is not None and mat.tags["dagster/code_version"] == pins_version(exp)
        assert mat.metadata["pin_set"] == dg.TextMetadataValue(exp.variants["plain"].pin_set)
        assert isinstance(mat.metadata["task_bases"], dg.JsonMetadataValue)
        [spec] = instance.fetch_materializations(
            dg.AssetKey([exp.experiment_id, "spec"]), limit=10
        ).records
        assert spec.asset_materialization is not None
        spec_meta = spec.asset_materialization.metadata
        assert spec_meta["spec_path"] == dg.MetadataValue.path(exp.spec_path)
        assert spec_meta["trials_planned"] == dg.IntMetadataValue(18)
