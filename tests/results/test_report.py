"""The report of a stored experiment: points with intervals and n, five lines per variant,
health, failed rows worst first, the readback; rendered as markdown, self-contained HTML, PNG
and JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.results import stats
from hangar_dagster.results.report import (
    Report,
    build_report,
    to_html,
    to_json,
    to_markdown,
    verdict_of,
    write_report,
)
from hangar_dagster.results.store import Store
from tests.results.reports import DEMO, spec_file, stored

pytestmark = pytest.mark.unit


def test_the_demo_reads_as_undecided_with_its_intervals(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "demo"))
    report = build_report(exp, store)
    plain, skill = report.variant("plain"), report.variant("skill")
    assert plain.rate is not None and skill.rate is not None and skill.difference is not None
    assert plain.rate.label == "44.4 pts (95% CI 9.2-86.3; 3 tasks, 9 trials)"
    assert (round(skill.rate.pts, 1), skill.rate.n_tasks, skill.rate.n_trials) == (77.8, 3, 9)
    assert round(skill.difference.pts, 1) == 33.3 and skill.difference.low_pts < 0
    # 33 points on 3 tasks is not a finding: the interval holds 0 and the 20 points sought.
    assert skill.verdict == "undecided"
    assert skill.lines.learned.startswith("undecided: the interval -")
    assert "wider than the 20 pts sought" in skill.lines.learned
    assert skill.lines.moved.startswith(
        "plain 44.4 pts (95% CI 9.2-86.3; 3 tasks, 9 trials) to 77.8"
    )
    assert skill.lines.moved.endswith("on 3 task(s) x 3 trial(s)")
    assert skill.lines.changed.startswith("adds the general-fix skill. Against the baseline: ")
    assert "skills added: general-fix" in skill.lines.changed
    assert "model, CLI, instructions the same" in skill.lines.changed
    assert "environment" not in skill.lines.changed
    # Why: the tasks that moved, with the failing hidden test the skill fixed.
    assert skill.lines.why.startswith("tasks fixed: ")
    assert (
        "median 66.7 to 100.0 pts (3 vs 3 trials), was failing: 1 hidden test(s) failed: "
        "test_median.py::test_1 (assert median() == expected)" in skill.lines.why
    )
    assert "hidden tests fixed: " in skill.lines.why
    assert skill.lines.reproduce.startswith(
        f"hangar experiment run {exp.spec_path} --wait (spec sha256:"
    )
    assert exp.variants["skill"].pin_set in skill.lines.reproduce
    assert plain.is_baseline and plain.lines.changed.startswith("the stand-in agent with its base")
    # The readback: 3 tasks cannot detect the 20 points the spec seeks.
    (line,) = report.readback
    assert line.startswith("variant skill: the spec seeks 20 pts but 3 task(s) x 3 trial(s) ")


def test_failed_rows_come_worst_first_with_why(example_dir: Path, hangar_home: Path) -> None:
    exp, store = stored(
        spec_file(example_dir, "rows"),
        infra_then_ok=["plain/median/1"],
        infra_left=["skill/median/1"],
    )
    report = build_report(exp, store)
    keys = [r.trial_key for r in report.failed]
    # 5 + 2 failed grades, then the infra error left unretried; the retried one passed
    assert len(keys) == 8 and keys[-1] == "skill/median/1"
    assert all(r.why and "hidden test(s) failed" in r.why for r in report.failed[:-1])
    assert report.failed[-1].why == "infra error (oom): the sandbox ran out of memory"
    assert keys[:-1] == sorted(keys[:-1])  # equal failures (1 of 2 tests each): by key
    assert report.variant("skill").health.execution_failures == 1
    plain = report.variant("plain").health
    assert (plain.trials, plain.admissible, plain.infra_retries) == (9, 9, 1)
    assert plain.cost_usd == pytest.approx(9 * 0.02 + 0.01)  # the retried attempt was paid
    assert plain.cost_per_pass_usd == pytest.approx((9 * 0.02 + 0.01) / 4)
    assert plain.tokens == 9 * 150 + 1200  # the infra attempt's tokens too
    assert plain.trust == {"isolated": 9}


def test_a_flagged_pass_is_counted_apart_not_in_the_headline(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "flagged"), flagged=["skill/median/3"])
    report = build_report(exp, store)
    skill = report.variant("skill")
    assert skill.rate is not None and skill.rate.n_trials == 8  # the flagged pass left out
    assert skill.health.flagged_passes == 1 and skill.health.flagged == ("skill/median/3",)
    assert skill.health.passed == 6
    row = next(r for r in report.failed if r.trial_key == "skill/median/3")
    assert row.why == "passed, but flagged: tamper: conftest.py rewrites the report"
    md = to_markdown(report)
    assert "flagged passes, counted apart (not in the pass rate): 1 (skill/median/3)" in md


def view_agrees_with_report(store: Store, report: Report) -> dict[str, dict[str, Any]]:
    """variant_summary's rows by variant, each checked against the report's figures."""
    rows = {r["variant"]: r for r in store.summary(report.experiment_id)}
    for v in report.variants:
        assert v.rate is not None
        row, h = rows[v.name], v.health
        assert row["pass_rate_pts"] == round(v.rate.pts, 1), v.name
        assert (row["graded"], row["passed"]) == (v.rate.n_trials, h.passed), v.name
        assert row["flagged_passes"] == h.flagged_passes, v.name
        assert (row["admissible"], row["evidence_failures"]) == (
            h.admissible,
            h.evidence_failures,
        ), v.name
    return rows


def test_the_summary_view_and_the_report_give_the_same_pass_rate(
    example_dir: Path, hangar_home: Path
) -> None:
    # Uneven trials per task (the mean of task rates is not passes / trials), a flagged pass,
    # an infra error left and a retried one: variant_summary and the report still agree.
    uneven = {
        "plain": {
            "median": [True, False, False, False],
            "slugify": [True],
            "durations": [False, True],
        },
        "skill": {"median": [True, True, False], "slugify": [True, False], "durations": [True]},
    }
    exp, store = stored(
        spec_file(example_dir, "agree"),
        uneven,
        flagged=["skill/median/1"],
        infra_left=["plain/median/4"],
        infra_then_ok=["skill/slugify/2"],
    )
    rows = view_agrees_with_report(store, build_report(exp, store))
    # median/4 is the infra error: (1/3 + 1 + 1/2) / 3, not passes / trials = 3/6
    assert rows["plain"]["pass_rate_pts"] == 61.1
    assert rows["skill"]["flagged_passes"] == 1 and rows["skill"]["pass_rate_pts"] == 66.7


def test_a_base_check_that_finds_the_task_invalid_after_its_grades_leaves_it_out_of_the_view_too(
    example_dir: Path, hangar_home: Path
) -> None:
    # The grades were written with task_invalid = false (no base check yet); the base check
    # stored afterwards says the task is invalid. The view and the report read one rule.
    exp, store = stored(spec_file(example_dir, "late-invalid"), invalid={"durations": "passes"})
    assert not any(g.task_invalid for g in store.grades(exp.experiment_id))
    report = build_report(exp, store)
    rows = view_agrees_with_report(store, report)
    assert all(row["invalid_task"] == 3 for row in rows.values())
    index = store.index(exp.experiment_id)
    assert {r["task"] for r in index if r["task_invalid"]} == {"durations"}
    durations = [r for r in report.failed if r.task == "durations"]
    assert len(durations) == 6 and all(
        r.why == "the task is invalid: its base check failed" for r in durations
    )
    assert all(e.task_invalid == (e.trial.task == "durations") for e in report.evidence)
    assert rows["plain"]["pass_rate_pts"] == 50.0  # (2/3 + 1/3) / 2: durations left out
    assert rows["skill"]["pass_rate_pts"] == 83.3


def test_an_invalid_task_is_named_and_left_out_of_every_rate(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "invalid"), invalid={"durations": "passes on base"})
    report = build_report(exp, store)
    assert report.invalid_tasks == {"durations": "passes on base"}
    for v in report.variants:
        assert v.rate is not None and v.rate.n_tasks == 2, v.name
        assert v.health.evidence_failures == 3
    assert any(
        line.startswith("task durations is invalid (passes on base)") for line in report.readback
    )
    assert "Invalid tasks (left out of every rate): durations (passes on base)" in to_markdown(
        report
    )


def test_without_question_or_baseline_the_report_says_so(
    example_dir: Path, hangar_home: Path
) -> None:
    bare = {"question": None, "hypothesis": None, "baseline": None, "decide": None}
    exp, store = stored(spec_file(example_dir, "bare", bare))
    report = build_report(exp, store)
    assert report.readback[:4] == (
        "no question: say what the experiment asks in the spec's `question:`",
        "no hypothesis: write the expected answer and why in `hypothesis:`",
        "no decision rule: give the smallest effect that matters in "
        "`decide: {min_effect_pts: N}` (points out of 100)",
        "no baseline: name the variant the others are compared with in `baseline:` "
        "(one of plain, skill)",
    )
    assert all(v.difference is None and v.verdict is None for v in report.variants)
    changed = report.variant("skill").lines.changed
    assert changed.startswith("adds the general-fix skill. model standin-scripted-2026-01-01, ")
    assert "hangar-standin 0.1.0" in changed and "skills general-fix" in changed
    md = to_markdown(report)
    assert "**Question:** no question: say what the experiment asks" in md
    assert "undecided: no baseline to compare with" in md


def test_a_changed_environment_is_in_the_changed_line(example_dir: Path, hangar_home: Path) -> None:
    import yaml

    variants = yaml.safe_load((example_dir / "experiment.yaml").read_text())["variants"]
    variants["skill"]["environment"] = {"resources": {"timeout_s": 60, "memory_mb": 2048}}
    exp, store = stored(spec_file(example_dir, "envs", {"variants": variants}))
    changed = build_report(exp, store).variant("skill").lines.changed
    assert "environment resources.memory_mb 1024 -> 2048" in changed


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (25, 60, "shown"),
        (20, 60, "shown"),
        (-10, 15, "not shown"),
        (-40, 90, "undecided"),
        (10, 30, "undecided"),
    ],
)
def test_the_decision_closes_against_the_effect_sought(
    low: float, high: float, verdict: str
) -> None:
    d = stats.Difference(
        pts=(low + high) / 2,
        low_pts=low,
        high_pts=high,
        p_value=0.01,
        test="sign-flip exact",
        n_tasks=12,
        baseline_trials=12,
        variant_trials=12,
        only_baseline=(),
        only_variant=(),
    )
    assert verdict_of(d, 20) == verdict


def test_the_sections_come_in_the_order_the_issue_lists(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "order"))
    md = to_markdown(build_report(exp, store))
    marks = [
        "**Question:**",
        "**Hypothesis:**",
        "**Decision rule:**",
        "![",
        "| variant |",
        "## plain",
        "- **Changed:**",
        "- **Moved:**",
        "- **Why:**",
        "- **Learned:**",
        "- **Reproduce:**",
        "## skill",
        "## Health",
        "## Failed rows, worst first",
        "## Readback",
    ]
    at = [md.index(m) for m in marks]
    assert at == sorted(at)


def test_the_files_are_self_contained_and_masked(example_dir: Path, hangar_home: Path) -> None:
    exp, store = stored(spec_file(example_dir, "files"))
    report = build_report(exp, store)
    # a reason carrying the canary must not reach a file
    from dataclasses import replace

    leaked = replace(report, question=f"is {exp.canary} hidden?")
    written = write_report(leaked, hangar_home / "out", exp.canary)
    png = written.figure.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    page = written.html.read_text()
    assert page.count("data:image/png;base64,") == 1
    assert not re.search(r"""(src|href)=["']?(https?:|//|/|\.\.?/)""", page)  # nothing outside
    for f in (written.markdown, written.html):
        assert exp.canary not in f.read_text(), f.name
    assert "44.4 (9.2-86.3)" in page and "<td>skill</td>" in page
    assert to_html(report, None).count("<img") == 0


def test_the_figure_draws_a_variant_at_0_and_one_at_100_pts(
    example_dir: Path, hangar_home: Path
) -> None:
    # Wilson's bound at 0 pts is 5.6e-15, past the rate: a negative error bar for matplotlib
    edges = {"plain": {"median": [False] * 3}, "skill": {"median": [True] * 3}}
    exp, store = stored(spec_file(example_dir, "edges"), edges)
    written = write_report(build_report(exp, store), hangar_home / "edges", exp.canary)
    assert written.figure.read_bytes().startswith(b"\x89PNG")


def test_the_json_carries_every_figure(example_dir: Path, hangar_home: Path) -> None:
    exp, store = stored(spec_file(example_dir, "json"))
    data = to_json(build_report(exp, store))
    json.dumps(data)
    rows = {r["variant"]: r for r in data["table"]}
    assert (
        rows["plain"]["pass_rate_pts"],
        rows["plain"]["ci_low_pts"],
        rows["plain"]["ci_high_pts"],
    ) == (44.4, 9.2, 86.3)
    assert (rows["skill"]["tasks"], rows["skill"]["trials"], rows["skill"]["diff_pts"]) == (
        3,
        9,
        33.3,
    )
    skill = next(v for v in data["variants"] if v["name"] == "skill")
    assert set(skill["lines"]) == {"Changed", "Moved", "Why", "Learned", "Reproduce"}
    assert skill["rate"]["n_eff"] > 0 and skill["difference"]["p_value"] == 0.25
    assert skill["power"]["tasks_needed"] > 3 and skill["health"]["passed"] == 7
    assert len(skill["task_flips"]) == 3 and data["readback"]
    assert sum(len(t) for t in DEMO["skill"].values()) == skill["health"]["trials"]


def test_against_the_skill_as_baseline_the_plain_variant_removes_it(
    example_dir: Path, hangar_home: Path
) -> None:
    exp, store = stored(spec_file(example_dir, "reverse", {"baseline": "skill"}))
    report = build_report(exp, store)
    plain = report.variant("plain")
    assert "skills removed: general-fix" in plain.lines.changed
    assert plain.difference is not None and round(plain.difference.pts, 1) == -33.3
    assert plain.lines.why.startswith("tasks broken: ")  # failures first


def test_an_unknown_cost_reads_as_its_estimate_in_the_report_not_as_free(
    example_dir: Path, hangar_home: Path
) -> None:
    # item 7 of issue 14: an attempt closed after a restart has cost_usd None and an estimate;
    # the report's cost line counts the estimate (as the budget does) and says how much of it
    # is estimated, rather than reading unknown as $0.
    import dataclasses

    from hangar_dagster.results import report as rep

    exp, store = stored(spec_file(example_dir, "demo"))
    attempts = store.trials(exp.experiment_id, all_attempts=True)
    variant = attempts[0].variant
    before = build_report(exp, store)
    v0 = next(v for v in before.variants if v.name == variant)
    known = attempts[0].cost_usd or 0.0
    unknown = attempts[0].model_copy(update={"cost_usd": None, "cost_estimate_usd": 0.25})
    # rows only feed the evidence counts; the cost reads every attempt of the variant
    h = rep._health([], [unknown, *attempts[1:]], variant)
    assert h.cost_estimated_usd == pytest.approx(0.25)
    assert h.cost_usd == pytest.approx(v0.health.cost_usd - known + 0.25)
    line = rep._health_lines(dataclasses.replace(v0, health=h))[-1]
    assert "($0.2500 of it estimated: costs unknown)" in line
    # and with every cost known, no estimate is claimed
    assert "estimated" not in rep._health_lines(v0)[-1]
