"""Read a JUnit XML report into counts, refusing anything that could lie its way past the parser.

The report is written by code that ran beside the code under test, so it is
untrusted input: its size is capped, DOCTYPE and entity declarations are
refused before parsing (no entity expansion, no external references), and
counts are taken only from the outcome each ``<testcase>`` states, never from
a suite's ``tests=`` / ``failures=`` attributes. A report that cannot be read
is an error result, which ``decide`` never turns into a pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from xml.etree.ElementTree import ParseError

from junitparser import Error, Failure, JUnitXml, JUnitXmlError, Skipped, TestCase

MAX_BYTES = 5 * 1024 * 1024

Outcome = Literal["passed", "failed", "error", "skipped"]
COUNT_KEYS = ("total", "passed", "failed", "errors", "skipped")
_DECLARATION = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def zero_counts() -> dict[str, int]:
    return dict.fromkeys(COUNT_KEYS, 0)


@dataclass(frozen=True)
class CaseDetail:
    """One ``<testcase>`` as the report states it (untrusted: the report's own words)."""

    test_id: str
    outcome: Outcome
    time_s: float  # the testcase's time attribute; 0 when missing or not a number
    message: str | None  # the result element's message (or text), if any
    result_type: str | None  # its type attribute: pytest writes "pytest.xfail" for an xfail


@dataclass(frozen=True)
class JunitResult:
    ok: bool
    error: str | None  # why the report could not be used (ok is False)
    counts: dict[str, int] = field(default_factory=zero_counts)
    cases: list[tuple[str, Outcome]] = field(default_factory=list)  # (test id, outcome)
    details: list[CaseDetail] = field(default_factory=list)  # the same cases, with more said


def _outcome(case: TestCase) -> Outcome:
    # Worst outcome wins when a testcase carries several result elements.
    results = case.result
    if any(isinstance(r, Error) for r in results):
        return "error"
    if any(isinstance(r, Failure) for r in results):
        return "failed"
    if any(isinstance(r, Skipped) for r in results):
        return "skipped"
    return "passed"


def _detail(case: TestCase, outcome: Outcome) -> CaseDetail:
    kinds = {"error": Error, "failed": Failure, "skipped": Skipped}
    result = next((r for r in case.result if isinstance(r, kinds[outcome])), None) if outcome in kinds else None  # fmt: skip
    message = None
    if result is not None:
        message = result.message or result.text or None
    try:
        time_s = max(float(case.time or 0.0), 0.0)
    except (TypeError, ValueError):
        time_s = 0.0
    return CaseDetail(
        _case_id(case), outcome, time_s, message, getattr(result, "type", None) or None
    )


def _case_id(case: TestCase) -> str:
    name = case.name or "<unnamed>"
    return f"{case.classname}::{name}" if case.classname else name


def _too_large(source: str, size: int) -> JunitResult:
    return JunitResult(
        False, f"{source}: JUnit report larger than {MAX_BYTES} bytes ({size}); refused unread"
    )


def parse_junit_bytes(data: bytes, source: str = "<junit>", size: int | None = None) -> JunitResult:
    """Counts from ``data``; over ``MAX_BYTES``, not UTF-8, a DOCTYPE/entity or not JUnit: an error.

    ``size`` is the report's full length when ``data`` was cut short while
    reading it. The size and the declarations are checked before any parsing,
    each with its own reason, so a report refused for them never reaches the
    XML parser.
    """
    size = max(len(data), size or 0)
    if size > MAX_BYTES:
        return _too_large(source, size)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        # Other encodings could hide a declaration from the check below.
        return JunitResult(
            False, f"{source}: report is not UTF-8 ({err.reason} at byte {err.start})"
        )
    if _DECLARATION.search(text):
        return JunitResult(
            False, f"{source}: JUnit report declares a DOCTYPE/entities; refused unparsed"
        )
    try:
        xml = JUnitXml.fromstring(data)
    # junitparser parses with lxml when it is installed (the package mirror, proxpi, needs it):
    # lxml's XMLSyntaxError is a SyntaxError as ElementTree's ParseError is, not a ParseError.
    except (ParseError, SyntaxError, JUnitXmlError) as err:
        return JunitResult(False, f"{source}: not a JUnit XML report ({err})")
    counts = zero_counts()
    cases: list[tuple[str, Outcome]] = []
    details: list[CaseDetail] = []
    key = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}
    for suite in xml:
        for case in suite:
            outcome = _outcome(case)
            counts["total"] += 1
            counts[key[outcome]] += 1
            cases.append((_case_id(case), outcome))
            details.append(_detail(case, outcome))
    return JunitResult(True, None, counts, cases, details)


def parse_junit(path: Path) -> JunitResult:
    """Parse the report at ``path``; a missing, oversized or malformed file is an error result."""
    try:
        size = path.stat().st_size
    except OSError:
        return JunitResult(False, f"{path.name}: no JUnit report was written")
    if not path.is_file():
        return JunitResult(False, f"{path.name}: the JUnit report is not a regular file")
    if size > MAX_BYTES:
        return _too_large(path.name, size)
    with path.open("rb") as fh:
        data = fh.read(MAX_BYTES + 1)  # the file could still grow after stat
    return parse_junit_bytes(data, path.name)
