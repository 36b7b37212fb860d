"""Through the pipeline: a trial whose patch carries the canary is marked contaminated, the
experiment gets a note and an audit entry, and the canary is masked in what is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import command_agent_spec, hangar, write_spec

pytestmark = pytest.mark.slow

CANARY = "HANGAR-CANARY-0123456789abcdef0123456789abcdef"


def test_a_leaked_canary_is_noted_audited_and_masked(example_dir: Path, tmp_path: Path) -> None:
    # Stands in for an agent that saw the hidden tests somewhere and copied from them.
    spec = command_agent_spec(example_dir, tmp_path, "leaky", f"echo '# {CANARY}' >> stats.py")
    spec["grader"]["canary"] = CANARY
    spec_path = write_spec(example_dir, spec)
    home = tmp_path / "home"

    ran = hangar("experiment", "run", str(spec_path), "--wait", home=home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    got = hangar("experiment", "get", "leaky", "--json", home=home)
    assert got.returncode == 0, got.stderr
    assert CANARY not in got.stdout
    data = json.loads(got.stdout)
    (row,) = data["trials"]
    assert "patch" in row["contamination"]
    kinds = sorted(n["kind"] for n in data["notes"])
    assert "contamination" in kinds and "audit" in kinds
    out = tmp_path / "export"
    assert hangar("experiment", "export", "leaky", "-o", str(out), home=home).returncode == 0
    for f in out.rglob("*"):
        if f.is_file():
            assert CANARY not in f.read_text(errors="replace"), f
