"""`hangar experiment run --wait` and `resume` end saying what happened.

A finished trial left without a grade (a crash between the two) is graded by the next
`resume`; the exit code tells complete (0), refused (2), incomplete (3) and interrupted (130).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.conftest import command_agent_spec, hangar, write_spec

pytestmark = pytest.mark.slow


def experiment_id_of(stdout: str) -> str:
    return stdout.split("submitted ")[1].split()[0]


def test_a_grade_lost_in_a_crash_is_graded_by_resume_and_counted(
    example_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    spec = write_spec(example_dir, command_agent_spec(example_dir, tmp_path, "regrade", "true"))
    ran = hangar("experiment", "run", str(spec), "--wait", home=home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    eid = experiment_id_of(ran.stdout)

    # The run worker died after the grader's per-test rows were written, before the grade row.
    [grade_file] = (home / "parquet" / "grades").rglob("*.parquet")
    grade_file.unlink()
    assert list((home / "parquet" / "grade_tests").rglob("*.parquet")), "the orphaned tests stay"
    con = duckdb.connect(str(home / "hangar.duckdb"))
    try:
        con.execute("DELETE FROM grades WHERE experiment_id = ?", [eid])
    finally:
        con.close()

    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    assert got["queue"]["waiting_grades"] == 1 and got["queue"]["complete"] is False
    assert [v["graded"] for v in got["summary"]] == [0]
    text = hangar("experiment", "get", eid, home=home).stdout
    assert "1 trial waits for a grade; the pass rate is not final" in " ".join(text.split())
    listed = json.loads(hangar("experiment", "list", "--json", home=home).stdout)
    assert [(r["state"], r["waiting_grades"]) for r in listed] == [("waiting", 1)]

    resumed = hangar("experiment", "resume", eid, home=home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "grading 1 finished trial(s) that have no grade" in resumed.stdout
    got = json.loads(hangar("experiment", "get", eid, "--json", home=home).stdout)
    assert got["queue"]["waiting_grades"] == 0 and got["queue"]["complete"] is True
    assert [(v["trials"], v["graded"]) for v in got["summary"]] == [(1, 1)]
    assert [t["attempt"] for t in got["attempts"]] == [1], "grading ran no trial again"
    [row] = got["trials"]
    assert row["passed"] is not None
    listed = json.loads(hangar("experiment", "list", "--json", home=home).stdout)
    assert [r["state"] for r in listed] == ["complete"]
