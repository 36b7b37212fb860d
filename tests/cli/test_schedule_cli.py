"""`hangar experiment schedule` as a person types it: register, list, pause, resume, remove, and
the refusals (exit 2, the field or the flag named); `compare --nightly` without two nights."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import hangar
from tests.nightlyfixtures import nightly_spec

pytestmark = pytest.mark.integration


def flat(text: str) -> str:
    """``text`` with rich's line wrapping undone."""
    return " ".join(text.split())


def test_register_list_pause_resume_remove(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = nightly_spec(example_dir, tmp_path, at="19:30", timezone="America/New_York")
    done = hangar("experiment", "schedule", str(spec), home=hangar_home)
    assert done.returncode == 0, done.stderr
    assert "nightly schedule nightly-ab registered: 19:30 America/New_York, spec sha256:" in flat(
        done.stdout
    )
    assert "next night submitted" in flat(done.stdout) and "eval window always" in flat(done.stdout)

    listed = hangar("experiment", "schedule", "--list", home=hangar_home)
    assert listed.returncode == 0
    assert "nightly-ab" in listed.stdout and "active" in listed.stdout

    spec.write_text(spec.read_text().replace("trials: 1", "trials: 2"))
    edited = hangar("experiment", "schedule", str(spec), home=hangar_home)
    assert edited.returncode == 2 and "add --replace" in flat(edited.stderr)

    paused = hangar("experiment", "schedule", "--pause", "nightly-ab", home=hangar_home)
    assert paused.returncode == 0 and "nightly schedule nightly-ab paused" in flat(paused.stdout)
    assert "paused" in hangar("experiment", "schedule", "--list", home=hangar_home).stdout
    resumed = hangar("experiment", "schedule", "--resume", "nightly-ab", home=hangar_home)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout

    none_yet = hangar("experiment", "compare", "--nightly", "nightly-ab", home=hangar_home)
    assert none_yet.returncode == 2
    assert "has 0 submitted night(s)" in flat(none_yet.stderr)

    removed = hangar("experiment", "schedule", "--remove", "nightly-ab", home=hangar_home)
    assert removed.returncode == 0 and "removed" in removed.stdout
    gone = hangar("experiment", "schedule", "--pause", "nightly-ab", home=hangar_home)
    assert gone.returncode == 2 and "no nightly schedule 'nightly-ab'" in flat(gone.stderr)


def test_refusals_name_the_field_or_the_flags(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    bad = nightly_spec(example_dir, tmp_path, timezone="Mars/Olympus")
    refused = hangar("experiment", "schedule", str(bad), home=hangar_home)
    assert refused.returncode == 2
    assert "nightly.timezone: 'Mars/Olympus' is not a known time zone" in flat(refused.stderr)
    both = hangar("experiment", "schedule", str(bad), "--list", home=hangar_home)
    assert both.returncode == 2 and "give one of SPEC, --list" in flat(both.stderr)
