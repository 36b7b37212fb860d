"""JUnit parsing: counts from explicit outcomes only, and refusal of anything unsafe or broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangar_dagster.grading.junit import MAX_BYTES, parse_junit, parse_junit_bytes

pytestmark = pytest.mark.unit

VALID = b"""<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests">
  <testsuite name="pytest" tests="99" failures="0" errors="0" skipped="0">
    <testcase classname="test_a" name="test_ok" time="0.1"/>
    <testcase classname="test_a" name="test_ok2"><system-out>hello</system-out></testcase>
    <testcase classname="test_a" name="test_fail"><failure message="boom">trace</failure></testcase>
    <testcase classname="test_b" name="test_err"><error message="fixture">trace</error></testcase>
    <testcase classname="test_b" name="test_skip"><skipped message="later"/></testcase>
    <testsuite name="nested"><testcase classname="test_c" name="test_inner"/></testsuite>
  </testsuite>
</testsuites>
"""


def test_valid_report_counts_each_testcase_by_its_own_outcome(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_bytes(VALID)
    result = parse_junit(path)
    assert result.ok and result.error is None
    # The suite claims tests="99" and failures="0": ignored, only testcases count.
    assert result.counts == {"total": 6, "passed": 3, "failed": 1, "errors": 1, "skipped": 1}
    assert ("test_a::test_fail", "failed") in result.cases
    assert ("test_b::test_err", "error") in result.cases
    assert ("test_b::test_skip", "skipped") in result.cases
    assert ("test_c::test_inner", "passed") in result.cases


def test_bare_testsuite_root_is_accepted() -> None:
    result = parse_junit_bytes(b'<testsuite><testcase name="t"/></testsuite>')
    assert result.ok and result.counts["passed"] == 1 and result.cases == [("t", "passed")]


def test_error_outranks_failure_and_skip_in_one_testcase() -> None:
    data = b'<testsuite><testcase name="t"><skipped/><failure/><error/></testcase></testsuite>'
    assert parse_junit_bytes(data).counts == {
        "total": 1,
        "passed": 0,
        "failed": 0,
        "errors": 1,
        "skipped": 0,
    }


def test_zero_tests_is_a_valid_empty_report() -> None:
    result = parse_junit_bytes(b'<testsuites><testsuite name="pytest" tests="0"/></testsuites>')
    assert result.ok and result.counts["total"] == 0 and result.cases == []


def test_malformed_xml_is_an_error_not_a_pass() -> None:
    result = parse_junit_bytes(b'<testsuites><testsuite><testcase name="t"></testsuite>')
    assert not result.ok and result.error is not None and "not a JUnit XML report" in result.error
    assert result.counts["passed"] == 0


def test_an_empty_report_is_an_error_whichever_xml_parser_junitparser_uses() -> None:
    """Regression: with lxml installed (the mirror's proxpi needs it) junitparser parses with
    lxml, whose XMLSyntaxError is no ElementTree ParseError: an empty report crashed the grade."""
    for data in (b"", b"<testsuites><testsuite>"):
        result = parse_junit_bytes(data)
        assert (
            not result.ok and result.error is not None and "not a JUnit XML report" in result.error
        )


def test_wrong_root_element_is_an_error() -> None:
    result = parse_junit_bytes(b"<html><testcase name='t'/></html>")
    assert not result.ok and result.error is not None


def test_doctype_and_entities_are_refused_before_parsing() -> None:
    laughs = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>
<testsuite><testcase name="&lol2;"/></testsuite>"""
    external = (
        b'<!doctype x [<!entity xxe SYSTEM "file:///etc/passwd">]>'
        b'<testsuite><testcase name="&xxe;"/></testsuite>'
    )
    for data in (laughs, external, b"<!DOCTYPE testsuite><testsuite/>"):
        result = parse_junit_bytes(data, "r.xml")
        assert result.error == "r.xml: JUnit report declares a DOCTYPE/entities; refused unparsed"
    # The same report without its declarations is well-formed: the ban refused it, not the parser.
    assert parse_junit_bytes(laughs.replace(b"&lol2;", b"x").split(b"]>")[1]).ok


def test_non_utf8_report_is_refused() -> None:
    # UTF-16 could carry a DOCTYPE past a byte-level check.
    result = parse_junit_bytes("<!DOCTYPE x><testsuite/>".encode("utf-16"))
    assert not result.ok and result.error is not None and "not UTF-8" in result.error


def test_oversized_report_is_refused_unread(tmp_path: Path) -> None:
    def report(size: int) -> bytes:  # well-formed at any size: whitespace between elements
        head, tail = b'<testsuite><testcase name="t"/>', b"</testsuite>"
        return head + b" " * (size - len(head) - len(tail)) + tail

    data = report(MAX_BYTES + 1000)
    path = tmp_path / "junit.xml"
    path.write_bytes(data)
    why = f"JUnit report larger than {MAX_BYTES} bytes ({len(data)}); refused unread"
    assert parse_junit(path).error == f"junit.xml: {why}"
    assert parse_junit_bytes(data, "j").error == f"j: {why}"
    # Cut short at the cap while read from a pipe: the full size still refuses it.
    assert parse_junit_bytes(data[: MAX_BYTES + 1], "j", len(data)).error == f"j: {why}"
    # The same report at the cap parses: the size alone refused it.
    assert parse_junit_bytes(report(MAX_BYTES)).ok


def test_missing_report_and_directory_are_errors(tmp_path: Path) -> None:
    assert parse_junit(tmp_path / "nope.xml").error == "nope.xml: no JUnit report was written"
    (tmp_path / "dir.xml").mkdir()
    assert not parse_junit(tmp_path / "dir.xml").ok
