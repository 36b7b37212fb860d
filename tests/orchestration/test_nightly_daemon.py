"""A nightly spec with no person after `hangar experiment schedule`: the real daemon (`hangar
ui`) ticks ``nightly_experiments``, which submits tonight's experiment; the UI reloads the code
location when it sees it, and the driver sensor runs it to its index.

The spec's ``at`` is two minutes ago (UTC): a night is due from its time for the catch-up (six
hours), so the daemon's first tick submits it, whatever minute the UI comes up in."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from hangar_dagster.experiment import nightly
from hangar_dagster.settings import HangarPaths
from tests.conftest import attempts, hangar, stage_succeeded, start_ui, stop_ui
from tests.nightlyfixtures import nightly_spec

pytestmark = pytest.mark.slow

SLOW_S = 900  # the UI's start-up, a tick, the reload and the stages on a loaded machine


def test_the_daemon_submits_tonight_and_drives_it_to_its_index(
    example_dir: Path, tmp_path: Path
) -> None:
    home, log = tmp_path / "home", tmp_path / "ui.log"
    at = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)
    spec = nightly_spec(example_dir, tmp_path, at=f"{at:%H:%M}", timezone="UTC")
    registered = hangar("experiment", "schedule", str(spec), home=home)
    assert registered.returncode == 0, registered.stderr
    p = HangarPaths(home)

    ui = start_ui(home, log, seconds=SLOW_S)
    try:
        deadline = time.monotonic() + SLOW_S
        while not (found := nightly.nights(p, "nightly-ab")):
            assert ui.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
        [night] = found
        assert night.night == at.date() and night.experiment_id is not None, night
        eid = night.experiment_id
        while not stage_succeeded(home, eid, "index"):
            assert ui.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
    finally:
        stop_ui(ui)

    rows = attempts(home, eid)
    assert len(rows) == 4 and all(r[1] != "infra_error" for r in rows), rows
    assert len(nightly.nights(p, "nightly-ab")) == 1  # every later tick that night did nothing
    got = hangar("experiment", "get", eid, "--json", home=home)
    assert got.returncode == 0, got.stderr
    [note] = [n for n in json.loads(got.stdout)["notes"] if n["kind"] == "nightly"]
    assert note["message"].startswith(f"night {night.night} of nightly schedule nightly-ab")
    assert "the schedule's first night" in note["message"]
