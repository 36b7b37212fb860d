"""The state rule of `hangar experiment list` and the archive rule, as pure functions."""

from __future__ import annotations

import datetime as dt

import pytest

from hangar_dagster.experiment.state import State, archive_refusal, experiment_state

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
LATER = T0 + dt.timedelta(minutes=5)


@pytest.mark.parametrize(
    ("archived", "in_flight", "pending", "indexed_at", "last_trial_at", "expected"),
    [
        # submitted, nothing ran yet
        (False, False, 18, None, None, State.WAITING),
        # pending work blocked (window, budget, queue): waiting, whatever the index says
        (False, False, 3, LATER, T0, State.WAITING),
        # a run in flight
        (False, True, 3, None, T0, State.RUNNING),
        # all trials done, but the last index came before the last trial: the index is due
        (False, False, 0, T0, LATER, State.WAITING),
        (False, False, 0, None, LATER, State.WAITING),
        # all done and indexed after the last trial
        (False, False, 0, LATER, T0, State.COMPLETE),
        (False, False, 0, T0, T0, State.COMPLETE),
        # indexed with no trial at all (every trial of it was skipped): nothing left to do
        (False, False, 0, T0, None, State.COMPLETE),
        # archived, finished or forced with work pending
        (True, False, 0, LATER, T0, State.ARCHIVED),
        (True, False, 5, None, None, State.ARCHIVED),
        # a run in flight is what is happening now, even beside the archive mark
        (True, True, 0, LATER, T0, State.RUNNING),
    ],
)
def test_experiment_state(
    archived: bool,
    in_flight: bool,
    pending: int,
    indexed_at: dt.datetime | None,
    last_trial_at: dt.datetime | None,
    expected: State,
) -> None:
    assert (
        experiment_state(
            archived=archived,
            in_flight=in_flight,
            pending_trials=pending,
            indexed_at=indexed_at,
            last_trial_at=last_trial_at,
        )
        == expected
    )


def test_archive_is_allowed_once_complete() -> None:
    assert (
        archive_refusal(
            in_flight=None, pending_trials=0, indexed_at=LATER, last_trial_at=T0, force=False
        )
        is None
    )


def test_archive_refuses_pending_work_unless_forced() -> None:
    refused = archive_refusal(
        in_flight=None, pending_trials=4, indexed_at=None, last_trial_at=T0, force=False
    )
    assert refused is not None
    assert refused.message == "4 trial(s) still pending"
    assert "--force" in refused.fix and "resume" in refused.fix
    assert (
        archive_refusal(
            in_flight=None, pending_trials=4, indexed_at=None, last_trial_at=T0, force=True
        )
        is None
    )


def test_archive_refuses_an_index_still_due_unless_forced() -> None:
    refused = archive_refusal(
        in_flight=None, pending_trials=0, indexed_at=T0, last_trial_at=LATER, force=False
    )
    assert refused is not None and "index" in refused.message
    assert (
        archive_refusal(
            in_flight=None, pending_trials=0, indexed_at=T0, last_trial_at=LATER, force=True
        )
        is None
    )


def test_archive_never_beside_a_run_in_flight_even_forced() -> None:
    run = "its trials run abc is STARTED since 2026-12-01 12:00:00 UTC"
    for force in (False, True):
        refused = archive_refusal(
            in_flight=run, pending_trials=0, indexed_at=LATER, last_trial_at=T0, force=force
        )
        assert refused is not None
        assert refused.message == run
        assert "stop its worker (`kill PID`" in refused.fix and "UI" not in refused.fix
