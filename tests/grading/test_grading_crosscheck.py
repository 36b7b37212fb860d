"""Cross-checks of a grader run, and the new patch signals, on hand-made inputs."""

from __future__ import annotations

import json

import pytest

from hangar_dagster.grading.crosscheck import cross_check, parse_reporter, split_confirmed
from hangar_dagster.grading.junit import parse_junit_bytes
from hangar_dagster.grading.signals import tamper_signals
from hangar_dagster.trials.sandbox import RunAs

pytestmark = pytest.mark.unit


def junit(*cases: str) -> bytes:
    body = "".join(f'<testcase classname="t" name="{c}"/>' for c in cases)
    return f"<testsuites><testsuite>{body}</testsuite></testsuites>".encode()


def stream(*events: dict[str, object]) -> bytes:
    start = {"event": "start", "uid": 7, "cap_eff": "0000000000000000", "no_new_privs": True}
    return "".join(json.dumps(e) + "\n" for e in (start, *events)).encode()


CLEAN = [{"event": "collected", "ids": ["t::a", "t::b"]},
         {"event": "call", "id": "t::a", "raised": None},
         {"event": "call", "id": "t::b", "raised": None}, {"event": "end", "exitstatus": 0}]  # fmt: skip


def test_clean_run_has_no_problem_and_confirms_the_split() -> None:
    s = parse_reporter(stream(*CLEAN))
    assert cross_check(parse_junit_bytes(junit("a", "b")), s, ["t::a", "t::b"]) == ([], [])
    assert split_confirmed(s, RunAs(7, 7)) and not split_confirmed(s, RunAs(8, 8))
    assert not split_confirmed(s, None)


def test_each_lie_is_a_problem() -> None:
    s = parse_reporter(stream(*CLEAN))
    cases = {
        "duplicated test id": (junit("a", "a", "b"), s, []),
        "expected hidden test(s) missing": (junit("a", "b"), s, ["t::c"]),
        "collected test(s) missing": (junit("a"), s, []),
        "saw no clean call: t::b": (
            junit("a", "b"),
            parse_reporter(
                stream(
                    *CLEAN[:2],
                    {"event": "call", "id": "t::b", "raised": "AssertionError"},
                    CLEAN[3],
                )
            ),
            [],
        ),  # fmt: skip
        "saw no end": (junit("a", "b"), parse_reporter(stream(*CLEAN[:3])), []),
        "sent nothing": (junit("a", "b"), parse_reporter(b""), []),
    }
    for expected, (report, st, exp_ids) in cases.items():
        problems, _ = cross_check(parse_junit_bytes(report), st, exp_ids)
        assert any(expected in p for p in problems), (expected, problems)


def test_tamper_events_are_signals_and_fatal_ones_problems() -> None:
    s = parse_reporter(stream(*CLEAN, {"event": "tamper", "what": "x replaced", "fatal": True},
                              {"event": "tamper", "what": "frame read", "fatal": False}))  # fmt: skip
    problems, signals = cross_check(parse_junit_bytes(junit("a", "b")), s)
    assert problems == ["tamper: x replaced"]
    assert signals == ["run: x replaced", "run: frame read"]
    # A broken report still carries the fatal tamper (decide gives the parser's reason).
    assert cross_check(parse_junit_bytes(b"<nope"), s)[0][0] == "tamper: x replaced"


def test_no_report_while_the_reporter_saw_tests_run_is_evidence() -> None:
    seen = (
        "no usable JUnit report, though the trusted reporter saw 2 test(s) collected and 1 called"
    )
    s = parse_reporter(stream(*CLEAN[:2]))  # the run ended after one call, no end, no report
    for report in (b"", b"<nope"):
        problems, signals = cross_check(parse_junit_bytes(report), s, ["t::a", "t::b"])
        assert (problems, signals) == ([seen], [f"run: {seen}"])
    # No test collected or called (an exit at import): the parser's reason is the whole story.
    assert cross_check(parse_junit_bytes(b""), parse_reporter(stream())) == ([], [])
    assert cross_check(parse_junit_bytes(b""), None) == ([], [])


def xfail_junit(*skipped: str) -> bytes:
    body = "".join(
        f'<testcase classname="t" name="{c}"><skipped type="pytest.xfail"/></testcase>'
        for c in skipped
    )
    return f'<testsuite><testcase classname="t" name="a"/>{body}</testsuite>'.encode()


def test_a_failure_reported_as_skipped_needs_an_xfail_mark_from_collection() -> None:
    def run(raised: str, xfail: list[str]) -> list[str]:
        s = parse_reporter(stream({"event": "collected", "ids": ["t::a", "t::b"], "xfail": xfail},
                                  CLEAN[1], {"event": "call", "id": "t::b", "raised": raised},
                                  CLEAN[3]))  # fmt: skip
        return cross_check(parse_junit_bytes(xfail_junit("b")), s)[0]

    problem = "saw the test fail with no xfail mark at collection: t::b"
    assert any(problem in p for p in run("AssertionError", []))
    assert run("AssertionError", ["t::b"]) == []  # marked xfail in the hidden tests
    assert run("XFailed", []) == run("Skipped", []) == []  # pytest.xfail / pytest.skip by the test


def test_new_patch_signals_compiled_links_and_entry_points() -> None:
    patch = (
        "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n"
        "@@ -0,0 +1 @@\n+../hidden/test_x.py\n\\ No newline at end of file\n"
        "diff --git a/inside b/inside\nnew file mode 120000\n--- /dev/null\n+++ b/inside\n"
        "@@ -0,0 +1 @@\n+calc.py\n\\ No newline at end of file\n"
        "diff --git a/__pycache__/calc.cpython-311.pyc b/__pycache__/calc.cpython-311.pyc\n"
        "new file mode 100644\nBinary files /dev/null and b/__pycache__/calc.cpython-311.pyc differ\n"
        "diff --git a/x.dist-info/entry_points.txt b/x.dist-info/entry_points.txt\n"
        "new file mode 100644\n--- /dev/null\n+++ b/x.dist-info/entry_points.txt\n"
        "@@ -0,0 +1 @@\n+[pytest11]\n"
    )
    assert tamper_signals(patch) == [
        "__pycache__/calc.cpython-311.pyc", "link", "x.dist-info/entry_points.txt",
    ]  # fmt: skip


def test_a_timed_out_run_is_not_also_a_missing_report_signal() -> None:
    # Regression: a grader killed at its limit wrote no report; the timeout is the whole story.
    s = parse_reporter(stream(*CLEAN[:2]))
    assert cross_check(parse_junit_bytes(b""), s, ["t::a", "t::b"], timed_out=True) == ([], [])
