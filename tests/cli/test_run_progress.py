"""`run --wait`'s progress display: done/planned, graded, passed, failed, infra errors and
elapsed, read from the store while the stages run; plain lines when not on a terminal."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from hangar_dagster.cli.progress import Progress, Ticker, read_progress
from tests.conftest import command_agent_spec, hangar, write_spec
from tests.results.reports import spec_file, stored

pytestmark = pytest.mark.integration

LINE = re.compile(
    r"progress: trials (\d+)/(\d+) done, (\d+) graded: (\d+) passed, (\d+) failed, "
    r"(\d+) infra error\(s\); \d+:\d\d elapsed"
)


def test_the_counts_come_from_the_store(example_dir: Path, hangar_home: Path) -> None:
    exp, store = stored(
        spec_file(example_dir, "progress"),
        infra_then_ok=["plain/median/1"],
        infra_left=["skill/slugify/2"],
    )
    got = read_progress(store, exp.experiment_id, len(exp.trial_keys()), 75.0)
    # the demo's 18 keys, one ended as an infra error (not done); 4 + 7 passes, less the one cut
    assert (got.planned, got.done, got.graded) == (18, 17, 17)
    assert (got.passed, got.failed, got.infra_errors) == (10, 7, 2)
    assert got.line().endswith("2 infra error(s); 1:15 elapsed")


def test_piped_it_prints_a_line_each_time_a_count_moves_and_the_last_one_at_the_end() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    seen = [Progress(3, 0, 0, 0, 0, 0, 0.0)]

    def read(elapsed: float) -> Progress:
        return seen[-1]

    with Ticker(console, read, interval_s=0.05):
        time.sleep(0.2)  # unchanged: no second line
        seen.append(Progress(3, 1, 0, 0, 0, 0, 0.3))  # a trial done
        time.sleep(0.2)
        seen.append(Progress(3, 1, 1, 0, 1, 0, 0.5))  # and graded, failing
    lines = out.getvalue().splitlines()
    assert [LINE.fullmatch(x) is not None for x in lines] == [True, True, True], lines
    assert lines[1].startswith("progress: trials 1/3 done, 0 graded")
    assert lines[2].startswith("progress: trials 1/3 done, 1 graded: 0 passed, 1 failed")


@pytest.mark.slow
def test_run_wait_shows_progress_moving_through_trials_and_grades(
    example_dir: Path, tmp_path: Path
) -> None:
    spec = command_agent_spec(example_dir, tmp_path, "progress-run", "sleep 2")
    spec.update(trials=3, parallel=1)
    ran = hangar(
        "experiment", "run", str(write_spec(example_dir, spec)), "--wait", home=tmp_path / "h"
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    counts = [tuple(map(int, m.groups())) for m in LINE.finditer(ran.stdout)]
    assert counts[0][:3] == (0, 3, 0), counts  # before the first trial
    assert counts[-1][:3] == (3, 3, 3), counts  # every trial done and graded
    dones = [c[0] for c in counts]
    assert sorted(set(dones)) == [0, 1, 2, 3], counts  # it moved trial by trial
    assert any(c[0] > c[2] for c in counts) or len({c[2] for c in counts}) > 1, counts
