"""``hangar grade``: one patch, by hand, through the real CLI and the real grader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import hangar

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]


def flat(text: str) -> str:
    return "".join(text.split())


def test_reference_patch_passes_and_base_fails(example_dir: Path, hangar_home: Path) -> None:
    spec = example_dir / "experiment.yaml"
    ref = example_dir / "fixtures" / "median" / "reference.diff"
    done = hangar("grade", "--spec", str(spec), "--task", "median", "--patch", str(ref), "--json",
                  home=hangar_home, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr
    grade = json.loads(done.stdout)
    assert (grade["passed"], grade["graded"], grade["task"]) == (True, "by-hand", "median")
    assert grade["hidden_tests"]["passed"] == grade["hidden_tests"]["total"] > 0
    assert grade["canary_files"] >= 1 and grade["tamper_signals"] == []
    base = hangar("grade", "--spec", str(spec), "--task", "median", "--base", home=hangar_home,
                  timeout=180)  # fmt: skip
    assert base.returncode == 1, base.stderr
    assert "fail median (base)" in base.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [("", "the file is empty"), ("just words\n", "no `diff --git` file header")],
)
def test_empty_or_malformed_patch_is_refused(
    example_dir: Path, hangar_home: Path, tmp_path: Path, content: str, message: str
) -> None:
    patch = tmp_path / "p.diff"
    patch.write_text(content)
    done = hangar("grade", "--spec", str(example_dir / "experiment.yaml"), "--task", "median",
                  "--patch", str(patch), home=hangar_home)  # fmt: skip
    said = flat(done.stderr)  # rich wraps long lines
    assert done.returncode == 2 and flat(message) in said and str(patch) in said


def test_unknown_task_and_missing_choice_are_refused(example_dir: Path, hangar_home: Path) -> None:
    spec = str(example_dir / "experiment.yaml")
    done = hangar("grade", "--spec", spec, "--task", "nope", "--base", home=hangar_home)
    assert done.returncode == 2 and "--task'nope'" in flat(done.stderr)
    assert "median" in done.stderr
    done = hangar("grade", "--spec", spec, "--task", "median", home=hangar_home)
    assert done.returncode == 2 and "exactlyoneof--patch" in flat(done.stderr)
