"""The index asset in a real Dagster run carries the report (its table with intervals, the five
lines, the readback and the files), and its readback check warns until the report reads clean."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.orchestration.stages import job_name, stage_tags
from hangar_dagster.results.report import report_dir
from hangar_dagster.settings import paths
from tests.orchestration.test_checks import definitions
from tests.results.reports import spec_file, stored

pytestmark = pytest.mark.integration


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def run_index(
    exp: ResolvedExperiment, home: Path, instance: dg.DagsterInstance
) -> dg.ExecuteInProcessResult:
    job = definitions(exp, home).resolve_job_def(job_name(exp, "index"))
    return job.execute_in_process(instance=instance, tags=stage_tags(exp, "index"))


def test_the_index_shows_the_report_and_its_readback_warns(
    example_dir: Path, hangar_home: Path, instance: dg.DagsterInstance
) -> None:
    exp, _ = stored(spec_file(example_dir, "index-report"))
    result = run_index(exp, hangar_home, instance)
    assert result.success  # a WARN check never fails the run
    [mat] = result.asset_materializations_for_node(f"{exp.experiment_id}__index")
    meta = mat.metadata
    table = meta["report"]
    assert isinstance(table, dg.TableMetadataValue)
    rows = {r.data["variant"]: r.data for r in table.records}
    assert (rows["plain"]["pass_rate_pts"], rows["plain"]["ci_low_pts"]) == (44.4, 9.2)
    assert (rows["skill"]["tasks"], rows["skill"]["trials"], rows["skill"]["diff_pts"]) == (
        3,
        9,
        33.3,
    )
    five = meta["five_lines"]
    assert isinstance(five, dg.MarkdownMetadataValue) and five.md_str is not None
    for word in ("Changed", "Moved", "Why", "Learned", "Reproduce"):
        assert five.md_str.count(f"**{word}:**") == 2
    assert five.md_str.startswith("**Question:** Does the general-fix skill")
    folder = report_dir(paths(), exp.experiment_id)
    assert meta["figure"] == dg.MetadataValue.path(str(folder / "figure.png"))
    assert (folder / "figure.png").is_file() and (folder / "report.html").is_file()
    picture = meta["picture"]  # the figure itself, shown in the UI as a markdown image
    assert isinstance(picture, dg.MarkdownMetadataValue) and picture.md_str is not None
    png = base64.b64encode((folder / "figure.png").read_bytes()).decode()
    assert picture.md_str.endswith(f"(data:image/png;base64,{png})")
    assert len(list((folder / "trials").glob("*.html"))) == 18  # a page per trial

    [check] = result.get_asset_check_evaluations()
    assert (check.check_name, check.passed, check.severity) == (
        "readback",
        False,
        dg.AssetCheckSeverity.WARN,
    )
    assert check.description is not None
    assert check.description.startswith("variant skill: the spec seeks 20 pts but 3 task(s)")
    assert check.metadata["lines"] == dg.MetadataValue.int(1)


def test_the_readback_check_passes_once_the_report_reads_clean(
    example_dir: Path, hangar_home: Path, instance: dg.DagsterInstance
) -> None:
    # Only an effect of 100 points is sought: these 3 tasks can say whether it is there.
    spec = spec_file(example_dir, "index-clean", {"decide": {"min_effect_pts": 100}})
    exp, _ = stored(spec)
    [check] = run_index(exp, hangar_home, instance).get_asset_check_evaluations()
    assert check.passed and check.description == "the report reads clean"
