"""Cross-checks of one grader run: the JUnit report against the trusted reporter and the base check.

Pure functions over what the grader received through its pipes. Each problem
found is a reason the grade fails; each tamper event the reporter sent is also
a signal stored on the grade (``run: ...``), fatal or not.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from hangar_dagster.grading.junit import JunitResult
from hangar_dagster.trials.sandbox import RunAs

_SHOWN = 5  # test ids named in one reason
# What a test itself raises to skip or xfail (pytest.skip / pytest.xfail): not a failure.
_SKIPS = ("Skipped", "XFailed")


@dataclass(frozen=True)
class ReporterStream:
    """What the trusted reporter sent (``reporter`` module), parsed leniently."""

    start: dict[str, Any] | None = None
    collected: list[str] | None = None
    xfail: frozenset[str] = frozenset()  # collected with an xfail mark
    calls: dict[str, list[str | None]] = field(default_factory=dict)  # id -> raised per call
    tamper: list[tuple[str, bool]] = field(default_factory=list)  # (what, fatal)
    ended: bool = False
    garbage: int = 0  # lines that were not reporter events
    # Where each module was loaded from when the session ended (name -> file, None: no file);
    # None when no ``modules`` event came.
    modules: dict[str, str | None] | None = None


def parse_reporter(data: bytes) -> ReporterStream:
    start: dict[str, Any] | None = None
    collected: list[str] | None = None
    xfail: frozenset[str] = frozenset()
    calls: dict[str, list[str | None]] = {}
    tamper: list[tuple[str, bool]] = []
    ended, garbage = False, 0
    modules: dict[str, str | None] | None = None
    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            ev = json.loads(raw)
            kind = ev["event"]
            if kind == "start" and start is None:
                start = {k: ev[k] for k in ("uid", "cap_eff", "no_new_privs")}
            elif kind == "collected":
                collected = [str(i) for i in ev["ids"]]
                xfail = frozenset(str(i) for i in ev.get("xfail", ()))
            elif kind == "call":
                raised = ev["raised"]
                calls.setdefault(str(ev["id"]), []).append(None if raised is None else str(raised))
            elif kind == "tamper":
                tamper.append((str(ev["what"]), bool(ev["fatal"])))
            elif kind == "modules" and modules is None:
                names, paths = ev["names"], ev["paths"]
                if len(names) != len(paths):
                    raise ValueError("modules: names and paths differ in length")
                modules = {str(n): (str(p) or None) for n, p in zip(names, paths, strict=True)}
            elif kind == "end":
                ended = True
            else:
                garbage += 1
        except (ValueError, KeyError, TypeError):
            garbage += 1
    return ReporterStream(start, collected, xfail, calls, tamper, ended, garbage, modules)


def split_confirmed(stream: ReporterStream, run_as: RunAs | None) -> bool:
    """The reporter saw, before any repo code ran, the uid asked for, no capability, no_new_privs."""
    if run_as is None or stream.start is None:
        return False
    s = stream.start
    return bool(
        s["uid"] == run_as.uid and int(str(s["cap_eff"]), 16) == 0 and s["no_new_privs"] is True
    )


def _ids(ids: Collection[str]) -> str:
    shown = sorted(ids)[:_SHOWN]
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return ", ".join(shown) + more


def _seen(stream: ReporterStream) -> str:
    """What the reporter saw of the tests, as words; empty when it saw none collected or run."""
    collected, called = len(stream.collected or ()), len(stream.calls)
    if not collected and not called:
        return ""
    return f"{collected} test(s) collected and {called} called"


def cross_check(
    junit: JunitResult,
    stream: ReporterStream | None,
    expected: Collection[str] = (),
    timed_out: bool = False,
) -> tuple[list[str], list[str]]:
    """(problems that fail the grade, tamper signals seen at run time).

    ``stream`` None: no trusted reporter was expected (a command that is not
    hangar-grade); ``expected``: test ids the base check collected;
    ``timed_out``: the grader was killed at its time limit, which explains a missing report.
    """
    signals = [f"run: {what}" for what, _ in (stream.tamper if stream else [])]
    problems = [f"tamper: {what}" for what, fatal in (stream.tamper if stream else []) if fatal]
    if not junit.ok:
        # decide already fails it, with the parser's reason; tests the reporter saw run while
        # no report came (an exit mid-run, a report silenced or spoiled) are evidence too.
        if stream is not None and not timed_out and (seen := _seen(stream)):
            what = f"no usable JUnit report, though the trusted reporter saw {seen}"
            problems.append(what)
            signals.append(f"run: {what}")
        return problems, signals
    counts = Counter(case_id for case_id, _ in junit.cases)
    if dups := [i for i, n in counts.items() if n > 1]:
        problems.append(f"duplicated test id(s) in the JUnit report: {_ids(dups)}")
    if missing := set(expected) - set(counts):
        problems.append(f"expected hidden test(s) missing from the JUnit report: {_ids(missing)}")
    if stream is None:
        return problems, signals
    if stream.start is None:
        return [*problems, "the trusted reporter sent nothing (it never loaded)"], signals
    if not stream.ended:
        problems.append("the trusted reporter saw no end of the pytest session")
    if stream.collected is not None and (lost := set(stream.collected) - set(counts)):
        problems.append(f"collected test(s) missing from the JUnit report: {_ids(lost)}")
    unseen = [
        case_id
        for case_id, outcome in junit.cases
        if outcome == "passed" and stream.calls.get(case_id, ["not called"]) != [None]
    ]
    if unseen:
        problems.append(
            "the JUnit report says passed where the trusted reporter saw no clean call: "
            + _ids(unseen)
        )
    # A failure reported as skipped is an xfail; only a mark present at collection may make one
    # (an xfail mark added while the tests run, from wherever, would hide any failure).
    hidden = [
        case_id
        for case_id, outcome in junit.cases
        if outcome == "skipped"
        and case_id not in stream.xfail
        and any(r not in (None, *_SKIPS) for r in stream.calls.get(case_id, ()))
    ]
    if hidden:
        problems.append(
            "the JUnit report says skipped where the trusted reporter saw the test fail "
            "with no xfail mark at collection: " + _ids(hidden)
        )
    return problems, signals
