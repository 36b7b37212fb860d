"""The report in a real browser: headless Chromium opens report.html from disk, the figure
decodes, and the first trial page it links to renders with its sections
(scripts/check_report_in_browser.py; skipped where no Chromium is installed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hangar_dagster.results.report import build_report, write_report
from tests.results.reports import spec_file, stored

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_report_in_browser.py"
sys.path.insert(0, str(SCRIPT.parent))
from check_report_in_browser import find_browser  # noqa: E402

BROWSER = find_browser()
needs_browser = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium on PATH (apt-get install chromium)"
)


def run_check(folder: Path) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=120
    )
    return done.returncode, json.loads(done.stdout)


@needs_browser
def test_the_report_and_a_trial_page_render_in_headless_chromium(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "browser"))
    folder = hangar_home / "report"
    write_report(build_report(exp, store), folder, exp.canary)
    code, found = run_check(folder)
    assert code == 0, found
    assert found["figure"] == {"complete": True, "width": 1100, "height": 462}
    assert found["summary_rows"] == 2  # plain and skill
    assert str(found["trial_link"]).startswith("trials/")
    assert found["sections"] == ["patch", "trace", "verify", "grade-log", "tests"]
    assert (
        found["trial_title"]
        == f"{str(found['trial_h1']).split(' ')[0]}: browser ({exp.experiment_id})"
    )


@needs_browser
def test_the_check_fails_on_a_report_whose_figure_does_not_render(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "browser-broken"))
    folder = hangar_home / "broken"
    written = write_report(build_report(exp, store), folder, exp.canary)
    page = written.html.read_text()
    # a cut data URI: the <img> is there but no picture decodes
    start = page.index("base64,") + len("base64,")
    written.html.write_text(page[:start] + "AAAA" + page[start + 5000 :])
    code, found = run_check(folder)
    assert code == 1 and found["ok"] is False
    assert found["figure"] is not None and found["figure"]["width"] == 0  # type: ignore[index]
