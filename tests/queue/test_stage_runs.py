"""The rules for a stage whose run did not succeed (queue/stage_runs.py): a dead worker is
started again, at most STAGE_RUN_RETRIES times in a row; a run that failed by itself or was
canceled waits for a person, and every wait names the stage, the run and what to do."""

from __future__ import annotations

import pytest

from hangar_dagster.queue.stage_runs import (
    STAGE_RUN_RETRIES,
    EndedRun,
    after_failure,
    deaths_in_a_row,
    retry_note,
)

pytestmark = pytest.mark.unit

DIED = "GRPC server: Subprocess for r terminated unexpectedly with exit code -9"


def died(n: int) -> EndedRun:
    return EndedRun(f"dead-{n}", "FAILURE", record_left=True, message=DIED)


OK = EndedRun("ok", "SUCCESS", record_left=False, message="")


def test_a_dead_worker_is_retried_up_to_the_bound_then_waits_naming_the_runs() -> None:
    for n in range(1, STAGE_RUN_RETRIES + 1):
        runs = [died(i) for i in range(n, 0, -1)]
        assert after_failure("base_checks", runs) is None
        assert f"retry {n} of {STAGE_RUN_RETRIES}" in retry_note("base_checks", runs)
    runs = [died(i) for i in range(STAGE_RUN_RETRIES + 1, 0, -1)]
    why = after_failure("base_checks", runs)
    assert why is not None
    assert why.startswith(f"base_checks: the workers of its last {STAGE_RUN_RETRIES + 1} runs died")
    assert runs[0].run_id in why and "exit code -9" in why
    assert "hangar experiment resume" in why


def test_a_success_in_between_resets_the_count() -> None:
    runs = [died(3), died(2), OK, died(1)]
    assert deaths_in_a_row(runs) == [died(3), died(2)]
    assert after_failure("spec", runs) is None


def test_a_run_that_ended_by_itself_failed_waits_for_a_person_with_its_message() -> None:
    failed = EndedRun("r1", "FAILURE", record_left=False, message="Execution of step failed.")
    why = after_failure("pin_sets", [failed])
    assert why is not None and "pin_sets: its run r1 failed (Execution of step failed.)" in why
    assert "Execution of step failed." in why and "hangar experiment resume" in why


def test_a_canceled_run_is_not_retried_by_the_sensor() -> None:
    canceled = EndedRun("r2", "CANCELED", record_left=True, message="")
    why = after_failure("spec", [canceled])
    assert why is not None and "canceled" in why and "resume" in why
    assert not canceled.worker_died


def test_a_run_that_failed_before_it_started_is_a_death_and_is_retried() -> None:
    # Launched by a daemon that died, failed by run monitoring's start timeout: none of its
    # code ran, so no person has logs to read; the sensor starts the stage again.
    never = EndedRun(
        "r3",
        "FAILURE",
        record_left=False,
        message="Run timed out due to taking longer than 300 seconds to start.",
        started=False,
    )
    assert never.worker_died
    assert after_failure("base_checks", [never]) is None
    assert "retry 1 of" in retry_note("base_checks", [never])
    runs = [
        EndedRun(f"n{i}", "FAILURE", record_left=False, message=never.message, started=False)
        for i in range(STAGE_RUN_RETRIES + 1)
    ]
    why = after_failure("base_checks", runs)
    assert why is not None and "not started again" in why
    # hangar's own finding, for a STARTING run whose `hangar ui` (and launcher) was killed
    lost = EndedRun(
        "r5",
        "FAILURE",
        record_left=False,
        message="hangar: its launcher is gone: no `hangar ui` runs on this home, and the run is"
        " STARTING since 2026-12-02 01:41:20 UTC with no process recorded; marked failed so that"
        " its experiment goes on",
        started=False,
    )
    assert lost.worker_died and after_failure("pin_sets", [lost]) is None
    # a run that failed before starting for another reason (its job did not load) waits
    broken = EndedRun(
        "r4", "FAILURE", record_left=False, message="Could not load job", started=False
    )
    assert not broken.worker_died and after_failure("base_checks", [broken]) is not None
