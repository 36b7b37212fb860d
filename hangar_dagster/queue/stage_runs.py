"""When the driver sensor runs a stage again after its run failed: only a dead worker, a bounded
number of times.

A stage run can fail two ways. Its worker died under it (SIGKILL, OOM, the
machine or the UI went down; Dagster's code server or hangar's liveness check
then marked it failed): that is infrastructure, and the sensor starts the
stage again, up to ``STAGE_RUN_RETRIES`` times in a row; past that it waits,
naming the runs. Or it ended by itself, failed (its code raised, a task was
invalid, it never started): a person looks, and the sensor waits, saying so.
The evidence of a death is hangar's own: the run's process record
(queue/liveness.py) is removed when the run's resources are torn down, which
every run that ends by itself does, so a failed run whose record is still
there lost its worker. A run that never started (no RUN_START) and was
failed for it (run monitoring's start timeout: its launcher died; or
hangar's liveness check: the CLI that created it died) counts as a death
too: none of its code ran, so there is nothing for a person to read. A run that succeeds resets the count. Dagster-free: the
sensor hands in what it read from the instance (docs/queue.md, "Runs whose
worker died").
"""

from __future__ import annotations

from dataclasses import dataclass

# Runs of one stage in a row whose worker died, after the first, that the sensor starts.
STAGE_RUN_RETRIES = 2


@dataclass(frozen=True)
class EndedRun:
    run_id: str
    status: str  # Dagster's run status name: SUCCESS, FAILURE, CANCELED
    record_left: bool  # its process record outlived it: it never tore down (liveness.py)
    message: str  # why it ended, as Dagster recorded it ("" when unknown)
    # It reached RUN_START. A run failed before that by run monitoring's start timeout (its
    # launcher died) or by hangar's liveness check (its CLI died) ran none of its code.
    started: bool = True

    @property
    def worker_died(self) -> bool:
        if self.status != "FAILURE":
            return False
        return self.record_left or (not self.started and _never_started(self.message))


def _never_started(message: str) -> bool:
    """Whether a run that never started was failed for that reason (not, say, a load error)."""
    # run monitoring's "Run timed out due to taking longer than N seconds to start.", and
    # sensors.end_dead_runs' "hangar: its process (...) is gone; marked failed ..." and
    # "hangar: its launcher is gone: ..."
    return message.endswith("seconds to start.") or (
        message.startswith(("hangar: its process", "hangar: its launcher"))
        and " is gone" in message
    )


def deaths_in_a_row(runs: list[EndedRun]) -> list[EndedRun]:
    """The newest runs (newest first) whose worker died, up to the first that did not."""
    out = []
    for run in runs:
        if not run.worker_died:
            break
        out.append(run)
    return out


def after_failure(stage: str, runs: list[EndedRun]) -> str | None:
    """None: start ``stage`` again; else why the experiment waits (its latest run did not succeed).

    ``runs`` are the stage's ended runs, newest first; the first did not succeed.
    """
    last = runs[0]
    if last.status == "CANCELED":
        return (
            f"{stage}: its run {last.run_id} was canceled; `hangar experiment resume` runs it again"
        )
    if not last.worker_died:
        return (
            f"{stage}: its run {last.run_id} failed ({_short(last.message)}); "
            "a person looks at its logs (`hangar ui`), then `hangar experiment resume`"
        )
    died = deaths_in_a_row(runs)
    if len(died) <= STAGE_RUN_RETRIES:
        return None
    return (
        f"{stage}: the workers of its last {len(died)} runs died (latest {last.run_id}: "
        f"{_short(last.message)}); not started again after {STAGE_RUN_RETRIES} retries: "
        "look at the machine and the run logs, then `hangar experiment resume`"
    )


def retry_note(stage: str, runs: list[EndedRun]) -> str:
    """What the sensor says when it starts ``stage`` again after a dead worker."""
    died = deaths_in_a_row(runs)
    return (
        f"{stage}: its run {runs[0].run_id}'s worker died ({_short(runs[0].message)}); "
        f"started again (retry {len(died)} of {STAGE_RUN_RETRIES})"
    )


def _short(message: str, limit: int = 200) -> str:
    text = " ".join(message.split()) or "no message"
    return text if len(text) <= limit else text[: limit - 3] + "..."
