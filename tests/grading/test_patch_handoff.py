"""The grader grades the agent's own patch; only what is stored for people to read is redacted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import command_agent_spec, hangar, write_spec

pytestmark = pytest.mark.slow

# A correct fix of the median task that also defines an upper-case *_KEY constant: the shape
# redaction rewrites (it looks like `API_KEY = "..."`), so a redacted copy no longer runs.
FIX = (
    """sed -i '1i SORT_KEY = "by_value"\\nassert SORT_KEY == "by_value"' stats.py && """
    r"""sed -i 's/^    return ordered\[mid\]$/    if len(ordered) % 2 == 0:\n"""
    r"""        return (ordered[mid - 1] + ordered[mid]) \/ 2\n    return ordered[mid]/' stats.py"""
)


def test_grades_the_agents_patch_not_its_redacted_copy(example_dir: Path, tmp_path: Path) -> None:
    spec_path = write_spec(example_dir, command_agent_spec(example_dir, tmp_path, "keyed", FIX))
    home = tmp_path / "home"
    ran = hangar("experiment", "run", str(spec_path), "--wait", home=home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    got = json.loads(hangar("experiment", "get", "keyed", "--json", home=home).stdout)
    (row,) = got["trials"]
    assert row["outcome_class"] == "completed"
    assert row["passed"] is True, row
    # What people read is still redacted: the stored patch and the export.
    (stored,) = (home / "artifacts").rglob("patch.diff")
    shown = stored.read_text()
    assert 'SORT_KEY = "by_value"' not in shown and "[redacted" in shown
    out = tmp_path / "export"
    assert hangar("experiment", "export", "keyed", "-o", str(out), home=home).returncode == 0
    for f in out.rglob("*"):
        assert not f.is_file() or 'SORT_KEY = "by_value"' not in f.read_text(errors="replace"), f
