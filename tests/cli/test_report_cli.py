"""`hangar experiment report` and `export` on a stored experiment: the files, the JSON, the
readback printed, and a JSON error for an unknown experiment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import hangar
from tests.results.reports import DEMO, spec_file, stored

pytestmark = pytest.mark.integration


def test_report_writes_the_three_files_and_prints_five_lines_and_the_readback(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    exp, _ = stored(spec_file(example_dir, "cli-report"))
    out = tmp_path / "report"
    done = hangar("experiment", "report", exp.experiment_id, "-o", str(out), home=hangar_home)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "figure.png",
        "report.html",
        "report.md",
        "trials",
    ]
    assert (out / "figure.png").read_bytes().startswith(b"\x89PNG")
    text = " ".join(done.stdout.split())  # rich wraps long lines
    for word in ("Changed:", "Moved:", "Why:", "Learned:", "Reproduce:"):
        assert text.count(word) == 2, word
    assert "readback: variant skill: the spec seeks 20 pts" in text
    assert "44.4 pts (95% CI 9.2-86.3; 3 tasks, 9 trials)" in text


def test_report_json_carries_the_figures_and_defaults_to_the_experiment_folder(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, _ = stored(spec_file(example_dir, "cli-json"))
    done = hangar("experiment", "report", "cli-json", "--json", home=hangar_home)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["experiment_id"] == exp.experiment_id
    rows = {r["variant"]: r for r in data["table"]}
    assert rows["skill"]["diff_pts"] == 33.3 and rows["skill"]["verdict"] == "undecided"
    files = data["files"]
    assert Path(files["html"]).parent == hangar_home / "experiments" / exp.experiment_id / "report"
    assert Path(files["figure"]).is_file()


def test_an_unknown_experiment_with_json_is_a_json_error_on_stdout(hangar_home: Path) -> None:
    done = hangar("experiment", "report", "no-such", "--json", home=hangar_home)
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert "no experiment 'no-such'" in error["error"] and "hangar experiment" in error["fix"]


def test_export_includes_the_report(example_dir: Path, hangar_home: Path, tmp_path: Path) -> None:
    exp, _ = stored(spec_file(example_dir, "cli-export"))
    out = tmp_path / "export"
    done = hangar("experiment", "export", exp.experiment_id, "-o", str(out), home=hangar_home)
    assert done.returncode == 0, done.stderr
    for name in ("index.json", "report.md", "report.html", "figure.png", "report.json"):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    assert {v["name"] for v in report["variants"]} == {"plain", "skill"}
    assert exp.canary not in (out / "report.html").read_text()


def test_get_shows_points_with_interval_and_n_the_difference_and_invalid_tasks(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, _ = stored(spec_file(example_dir, "cli-get"), invalid={"durations": "passes on base"})
    done = hangar("experiment", "get", exp.experiment_id, home=hangar_home)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "95% CI (pts; tasks, trials)" in text  # the summary table carries the interval
    assert "plain (baseline): 50.0 pts (95% CI " in text and "2 tasks, 6 trials" in text
    assert "skill: 83.3 pts (95% CI " in text
    assert "vs plain +33.3 pts (95% CI " in text and ": undecided" in text
    assert "invalid tasks, left out of every rate: durations (passes on base)" in text
    assert "readback: task durations is invalid (passes on base)" in text
    # a failed grade's reason, worst first
    assert "failed plain/slugify/2: 1 hidden test(s) failed: test_slugify.py::test_1 " in text
    data = json.loads(
        hangar("experiment", "get", exp.experiment_id, "--json", home=hangar_home).stdout
    )
    skill = next(v for v in data["report"]["variants"] if v["name"] == "skill")
    assert skill["rate"]["n_tasks"] == 2 and skill["difference"]["n_tasks"] == 2


def test_get_json_of_an_unknown_experiment_is_json(hangar_home: Path) -> None:
    done = hangar("experiment", "get", "no-such", "--json", home=hangar_home)
    assert done.returncode == 2 and "no experiment" in json.loads(done.stdout)["error"]


def test_compare_pairs_two_experiments_by_variant_and_task(
    example_dir: Path, hangar_home: Path
) -> None:
    before, _ = stored(spec_file(example_dir, "last-night"))
    tonight = {"plain": DEMO["plain"], "skill": {t: [True] * 3 for t in DEMO["skill"]}}
    after, _ = stored(spec_file(example_dir, "tonight"), tonight)
    done = hangar("experiment", "compare", "last-night", "tonight", "--json", home=hangar_home)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["before"], data["after"]) == (before.experiment_id, after.experiment_id)
    plain, skill = data["variants"]["plain"], data["variants"]["skill"]
    assert plain["difference"]["pts"] == 0 and plain["flips"] == []
    assert round(skill["difference"]["pts"], 1) == 22.2  # 77.8 -> 100.0, paired over 3 tasks
    assert skill["difference"]["n_tasks"] == 3 and "p_value" in skill["difference"]
    assert {f["task"] for f in skill["flips"]} == {"slugify", "durations"}
    assert skill["after_label"] == "100.0 pts (95% CI " + skill["after_label"].split("CI ")[1]
    assert "mde_pts" in skill["power"]
    text = " ".join(
        hangar("experiment", "compare", "last-night", "tonight", home=hangar_home).stdout.split()
    )
    assert "skill: 77.8 pts (95% CI " in text and "-> 100.0 pts (95% CI " in text
    assert "after - before: +22.2 pts (95% CI " in text


def test_compare_without_shared_tasks_is_a_json_error_with_json(
    example_dir: Path, hangar_home: Path
) -> None:
    stored(spec_file(example_dir, "only-plain"), {"plain": DEMO["plain"]})
    stored(spec_file(example_dir, "only-skill"), {"skill": DEMO["skill"]})
    done = hangar("experiment", "compare", "only-plain", "only-skill", "--json", home=hangar_home)
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert "no variant of the two experiments shares a task" in error["error"]
    assert "same tasks" in error["fix"]
    gone = hangar("experiment", "compare", "only-plain", "no-such", "--json", home=hangar_home)
    assert gone.returncode == 2 and "no experiment 'no-such'" in json.loads(gone.stdout)["error"]


def test_get_json_carries_every_figure_of_the_report(example_dir: Path, hangar_home: Path) -> None:
    exp, _ = stored(spec_file(example_dir, "cli-get-json"))
    got = json.loads(
        hangar("experiment", "get", exp.experiment_id, "--json", home=hangar_home).stdout
    )
    report = got["report"]
    rows = {r["variant"]: r for r in report["table"]}
    assert (rows["plain"]["pass_rate_pts"], rows["plain"]["ci_low_pts"]) == (44.4, 9.2)
    skill = next(v for v in report["variants"] if v["name"] == "skill")
    assert skill["difference"]["p_value"] == 0.25 and skill["power"]["mde_pts"] is not None
    assert skill["rate"]["n_eff"] > 0 and set(skill["lines"]) >= {"Changed", "Why"}
    assert report["readback"] and len(report["trial_pages"]) == 18
    # the summary table's rate is the report's (one definition)
    assert {s["variant"]: s["pass_rate_pts"] for s in got["summary"]} == {
        "plain": 44.4,
        "skill": 77.8,
    }
