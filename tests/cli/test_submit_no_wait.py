"""`hangar experiment run` without --wait does not wait on the webserver: against a stand-in
that accepts connections and never answers (a real socket), it returns at once, the reload is
asked for in the background, and the asking is bounded."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangar_dagster.cli.ui import reload_location
from hangar_dagster.experiment.catalog import DAEMON_MARKER
from tests.conftest import hangar, stage_succeeded, start_ui
from tests.stall import Stall

pytestmark = pytest.mark.integration


@pytest.fixture
def stall() -> Iterator[Stall]:
    s = Stall()
    yield s
    s.close()


def _askers(url: str) -> list[int]:
    """Pids of background reload processes asking ``url`` (``notify_webserver``'s child)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hangar_dagster.cli.ui" in argv and url.encode() in argv:
            found.append(int(proc.name))
    return found


def test_run_returns_promptly_though_the_webserver_never_answers(
    example_dir: Path, tmp_path: Path, stall: Stall
) -> None:
    # Not timed: the CLI has exited while its reload request is still unanswered, so it did
    # not wait on it (the old synchronous reload asked from the CLI's own process).
    submitted = hangar(
        "experiment",
        "run",
        str(example_dir / "experiment.yaml"),
        home=tmp_path / "home",
        env={"HANGAR_WEBSERVER_URL": stall.url},
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr
    assert "queued for the daemon" in submitted.stdout
    assert "in the background" in submitted.stderr
    askers = _askers(stall.url)
    assert askers, "the reload is asked by a process that outlives the CLI"
    # The reload was asked for all the same, by the background process.
    deadline = time.monotonic() + 60
    while b"reloadRepositoryLocation" not in stall.received and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"POST /graphql" in stall.received
    assert b"reloadRepositoryLocation" in stall.received


def test_the_reload_gives_up_at_its_deadline_and_says_how_to_reload(stall: Stall) -> None:
    started = time.monotonic()
    why = reload_location(stall.url, deadline_s=3)
    took = time.monotonic() - started
    assert why is not None and stall.url in why and "use Reload in the UI" in why
    assert took < 3 + 2, f"took {took:.1f}s"


def test_no_reload_is_asked_for_from_a_webserver_url_nobody_holds(
    example_dir: Path, tmp_path: Path, stall: Stall
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # Left by a `hangar ui` that was SIGKILLed: ui.lock is free.
    (home / "webserver.url").write_text(stall.url + "\n")
    (home / "ui.lock").write_text("999999\n")
    submitted = hangar("experiment", "run", str(example_dir / "experiment.yaml"), home=home)
    assert submitted.returncode == 0, submitted.stderr
    assert "reload" not in submitted.stderr
    time.sleep(2)
    assert stall.received == b""


@pytest.mark.slow
def test_the_daemon_picks_the_experiment_up_though_the_reload_request_stalled(
    example_dir: Path, tmp_path: Path, stall: Stall
) -> None:
    """`hangar ui` notices the new experiment itself and reloads: the daemon runs its stages."""
    home, log = tmp_path / "home", tmp_path / "ui.log"
    ui = start_ui(home, log)  # nothing submitted yet: no job, no sensor loaded
    try:
        submitted = hangar(
            "experiment",
            "run",
            str(example_dir / "experiment.yaml"),
            home=home,
            env={"HANGAR_WEBSERVER_URL": stall.url},  # the CLI's own request goes nowhere
        )
        assert submitted.returncode == 0, submitted.stderr
        experiment_id = submitted.stdout.split("submitted ")[1].split()[0]
        deadline = time.monotonic() + 600
        while not stage_succeeded(home, experiment_id, "pin_sets"):
            assert ui.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
        assert "reloaded the code location: 1 active experiment(s)" in log.read_text()
    finally:
        ui.send_signal(signal.SIGTERM)
        ui.wait(timeout=120)


def test_a_submit_whose_dagster_home_cannot_be_made_stays_queued_for_the_daemon(
    example_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    blocked = home / "dagster"
    blocked.write_text("a file where the Dagster instance's directory goes\n")
    submitted = hangar(
        "experiment", "run", str(example_dir / "experiment.yaml"), home=home,
        env={"DAGSTER_HOME": str(blocked)},
    )  # fmt: skip
    assert submitted.returncode == 2, submitted.stderr
    assert "Traceback" not in submitted.stderr
    experiment_id = submitted.stdout.split("submitted ")[1].split()[0]
    said = "".join(submitted.stderr.split())  # rich folds a long path anywhere, even mid-word
    assert str(blocked) in said and "(DAGSTER_HOME)cannotbemade" in said, submitted.stderr
    # The submit happened; the daemon runs it once the instance can be made.
    marker = home / "experiments" / experiment_id / DAEMON_MARKER
    assert marker.exists(), sorted(p.name for p in marker.parent.iterdir())
