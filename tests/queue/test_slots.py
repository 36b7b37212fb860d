"""An experiment's slots: at most ``parallel`` holders across threads and processes, and a
killed holder's slot is free again (the kernel drops its lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hangar_dagster.queue.slots import Slots, experiment_slots, next_run_due

pytestmark = pytest.mark.unit


def test_threads_never_hold_more_slots_than_there_are(tmp_path: Path) -> None:
    slots = Slots(tmp_path / "slots", 2, poll_s=0.005)
    lock = threading.Lock()
    now = [0]
    most = [0]

    def work() -> None:
        with slots.hold(lambda: None) as why:
            assert why is None
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            time.sleep(0.03)
            with lock:
                now[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 2  # both slots used, never a third holder


HOLD_SLOT = "with Slots(Path(sys.argv[1]), 1).hold(lambda: None):\n    print('held', flush=True)\n    time.sleep(600)\n"
HOLD_TURN = "assert Slots(Path(sys.argv[1]), 1).turn().take(lambda: None) is None\nprint('held', flush=True)\ntime.sleep(600)\n"


def _holder(root: Path, hold: str = HOLD_SLOT) -> subprocess.Popen[str]:
    """Another process holding the experiment's only slot (or the turn) until it is killed."""
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom hangar_dagster.queue.slots import Slots\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code + hold, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_another_process_holding_the_slot_makes_a_start_wait_until_told_to_stop(
    tmp_path: Path,
) -> None:
    slots = experiment_slots(tmp_path / "exp-1", 1)
    proc = _holder(slots.root)
    try:
        deadline = time.monotonic() + 0.3
        with slots.hold(lambda: "drained" if time.monotonic() > deadline else None) as why:
            assert why == "drained"  # nothing was held: the caller starts nothing
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holders_slot_is_free_again(tmp_path: Path) -> None:
    slots = Slots(tmp_path / "slots", 1)
    proc = _holder(slots.root)
    os.kill(proc.pid, signal.SIGKILL)  # no cleanup of its own: the kernel releases the lock
    proc.wait()
    deadline = time.monotonic() + 5
    with slots.hold(lambda: "still held" if time.monotonic() > deadline else None) as why:
        assert why is None


def test_parallel_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="parallel must be at least 1, not 0"):
        Slots(tmp_path, 0)


def test_the_next_run_takes_the_turn_only_once_the_earlier_one_gives_it_up(tmp_path: Path) -> None:
    """Overlapping runs start trials one run at a time: the earlier until its keys are all
    handed out, then the next (else they share the slots and run out of keys together)."""
    earlier, later = Slots(tmp_path, 2).turn(), Slots(tmp_path, 2).turn()
    assert earlier.take(lambda: None) is None
    deadline = time.monotonic() + 0.2
    assert later.take(lambda: "waited" if time.monotonic() > deadline else None) == "waited"
    earlier.give_up()
    earlier.give_up()  # again (the last key, then the run's end): harmless
    assert later.take(lambda: "still held") is None
    later.give_up()


def test_a_killed_runs_turn_passes_to_the_next(tmp_path: Path) -> None:
    proc = _holder(tmp_path, HOLD_TURN)
    turn = Slots(tmp_path, 1).turn()
    deadline = time.monotonic() + 0.2
    assert turn.take(lambda: "waited" if time.monotonic() > deadline else None) == "waited"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    assert turn.take(lambda: "still held" if time.monotonic() > deadline else None) is None
    turn.give_up()


@pytest.mark.parametrize(
    ("handed", "total", "elapsed_s", "due"),
    [
        (3, 500, 0.1, False),  # the first wave goes at once: it says nothing of the pace
        (4, 500, 1.5, False),  # 496 keys left at one per 1.5 s: 744 s to go
        (460, 500, 685.5, True),  # 457 freed in 685.5 s: 40 left at 1.5 s, 60 s to go, the lead
        (459, 500, 684.0, False),  # 41 left at 1.5 s: 61.5 s
        (500, 500, 750.0, True),  # the last key holds its slot
        (2, 2, 0.0, True),  # a run smaller than its slots: every key at once
    ],
)
def test_the_next_run_is_due_a_lead_before_the_last_key_at_the_pace_slots_free(
    handed: int, total: int, elapsed_s: float, due: bool
) -> None:
    assert next_run_due(handed, total, 3, elapsed_s, lead_s=60.0) is due
