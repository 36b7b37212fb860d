"""Open a report folder in headless Chromium and check that it renders from disk.

    python scripts/check_report_in_browser.py REPORT_DIR [--browser PATH]

REPORT_DIR is what `hangar experiment report -o DIR` (or the index stage) wrote. The check
loads report.html from file:// in a real browser, then the first trial page it links to, and
prints what it found as JSON: the figure decoded (its natural size), the summary table's
rows, the trial page's title and which of its sections (patch, trace, verify output, grade
log, hidden tests) are there. Exit 0 when all of that holds, 1 when not, 2 without a browser.
tests/results/test_report_browser.py runs it when Chromium is installed (Debian: `apt-get
install chromium`).

How: a probe page is written beside a copy of the folder; it frames report.html, reads it
(file:// pages may read each other with --allow-file-access-from-files), follows the first
trials/ link in a second frame, and writes its findings into its own DOM, which
--dump-dom prints. No driver library is needed: only the browser binary.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SECTIONS = ("patch", "trace", "verify", "grade-log", "tests")

PROBE = """<!doctype html><html><body><pre id=out>pending</pre>
<iframe id=report src="report.html" width=1100 height=900></iframe>
<iframe id=trial width=1100 height=900></iframe>
<script>
const out = document.getElementById('out');
const found = {};
document.getElementById('report').onload = function () {
  try {
    const d = this.contentDocument;
    const img = d.getElementById('figure');
    found.figure = img ? {complete: img.complete, width: img.naturalWidth, height: img.naturalHeight} : null;
    found.summary_rows = d.querySelectorAll('#summary tr').length - 1;
    const link = d.querySelector('a[href^="trials/"]');
    found.trial_link = link ? link.getAttribute('href') : null;
    if (!link) { out.textContent = JSON.stringify(found); return; }
    const t = document.getElementById('trial');
    t.onload = function () {
      const p = this.contentDocument;
      found.trial_title = p.title;
      found.trial_h1 = p.querySelector('h1') ? p.querySelector('h1').textContent : null;
      found.sections = __SECTIONS__.filter(s => p.getElementById(s));
      found.back = !!p.querySelector('a[href="../report.html"]');
      out.textContent = JSON.stringify(found);
    };
    t.src = link.getAttribute('href');
  } catch (e) { out.textContent = JSON.stringify({error: String(e)}); }
};
</script></body></html>
""".replace("__SECTIONS__", json.dumps(list(SECTIONS)))


def find_browser(given: str | None = None) -> str | None:
    if given:
        return shutil.which(given) or (given if Path(given).is_file() else None)
    return next((p for b in BROWSERS if (p := shutil.which(b))), None)


def check(report_dir: Path, browser: str, timeout_s: float = 60.0) -> dict[str, object]:
    """What the browser found in ``report_dir`` (see the module doc); ``ok`` says if it holds."""
    with tempfile.TemporaryDirectory(prefix="hangar-report-check-") as tmp:
        copy = Path(tmp) / "report"
        shutil.copytree(report_dir, copy)  # the probe goes beside it, not into the user's folder
        probe = copy / "_probe.html"
        probe.write_text(PROBE)
        args = [
            browser,
            "--headless",
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--virtual-time-budget=10000",
            f"--user-data-dir={tmp}/profile",
            "--dump-dom",
            probe.as_uri(),
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    m = re.search(r'<pre id="out">(.*?)</pre>', done.stdout, re.S)
    raw = m.group(1) if m else ""
    try:
        found: dict[str, object] = json.loads(html.unescape(raw))
    except json.JSONDecodeError:
        return {
            "ok": False,
            "error": f"no result from the probe: {raw[:200]!r}",
            "stderr": done.stderr[-500:],
        }
    fig = found.get("figure")
    found["ok"] = bool(
        isinstance(fig, dict)
        and fig.get("complete")
        and int(fig.get("width") or 0) > 0
        and int(found.get("summary_rows") or 0) > 0  # type: ignore[call-overload]
        and found.get("trial_link")
        and found.get("sections") == list(SECTIONS)
        and found.get("back")
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--browser", help="the Chromium binary (default: the first on PATH)")
    args = parser.parse_args(argv)
    if not (args.report_dir / "report.html").is_file():
        print(
            json.dumps(
                {
                    "ok": False,
                    "error": f"{args.report_dir}/report.html: not found; "
                    "`hangar experiment report EXP -o DIR` writes it",
                }
            )
        )
        return 1
    browser = find_browser(args.browser)
    if browser is None:
        print(json.dumps({"ok": False, "error": "no Chromium on PATH (apt-get install chromium)"}))
        return 2
    found = check(args.report_dir, browser)
    print(json.dumps(found, indent=2))
    return 0 if found["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
