"""From a number to its evidence: the report folder has a page per trial (patch, trace, verify
output, grade log, per-test results), linked from report.html, masked, opening from disk."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hangar_dagster.results.report import build_report, to_json, write_report
from hangar_dagster.results.report_trials import page_name
from tests.results.reports import spec_file, stored

pytestmark = pytest.mark.unit


def test_every_trial_has_a_page_linked_from_the_report(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "pages"))
    report = build_report(exp, store)
    assert len(report.evidence) == 18
    written = write_report(report, hangar_home / "out", exp.canary)
    assert len(written.trials) == 18 and all(p.parent.name == "trials" for p in written.trials)
    page = written.html.read_text()
    links = set(re.findall(r'href="(trials/[^"]+)"', page))
    assert len(links) == 18
    for link in links:  # relative: the folder opens from disk
        assert (written.html.parent / link).is_file(), link
    assert 'href="trials/plain__slugify__2.html">plain/slugify/2</a>' in page
    assert to_json(report)["trial_pages"]["plain/slugify/2"] == "trials/plain__slugify__2.html"


def test_a_trial_page_shows_patch_trace_verify_grade_log_and_tests_masked(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "page"))
    report = build_report(exp, store)
    key = "plain/slugify/2"  # a failed grade
    ev = next(e for e in report.evidence if e.trial.trial_key == key)
    art = tmp_path / "art"
    art.mkdir()
    secret = "sk-ant-api03-" + "A" * 40
    (art / "patch.diff").write_text(f"--- a/slug.py\n+++ b/slug.py\n+# {exp.canary}\n")
    (art / "verify.log").write_text("1 passed in 0.01s\n")
    (art / "grade.log").write_text(f"FAILED test_hidden::test_1 token {secret}\n")
    trial = ev.trial.model_copy(update={"artifacts_dir": str(art)})
    from dataclasses import replace

    report = replace(
        report,
        evidence=tuple(
            replace(e, trial=trial) if e.trial.trial_key == key else e for e in report.evidence
        ),
    )
    written = write_report(report, hangar_home / "out", exp.canary)
    text = (hangar_home / "out" / "trials" / page_name(key)).read_text()
    assert exp.canary not in text and secret not in text  # the canary and the key masked
    for part in (
        "id=patch",
        "+++ b/slug.py",
        "id=trace",
        "tool_call",
        "pytest -q",
        "id=verify",
        "1 passed in 0.01s",
        "id=grade-log",
        "FAILED test_hidden::test_1",
        "id=tests",
        "test_slugify.py::test_1",
        "assert slugify() == expected",
    ):
        assert part in text, part
    assert "<td class=failed>failed</td>" in text and "grade</th><td>failed" in text
    assert '<a href="../report.html">' in text
    assert not re.search(r"""(src|href)=["']?(https?:|//|/)""", text)  # nothing outside
    assert written.trials
