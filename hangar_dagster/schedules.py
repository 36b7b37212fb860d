"""The eval window's drain: a Dagster cron schedule at the window's end.

Opening is not a schedule: a Dagster schedule launches only its own target
(the scheduler daemon creates every run a schedule requests under the
schedule's job and ignores ``RunRequest.job_name``), while the stage jobs are
one per experiment. Trials therefore start from the experiment driver sensor
(``jobs=`` all stage jobs), which asks the window before each start.

The drain is a schedule because its moment is exact: a cron at the window's
end in the window's zone, which Dagster keeps right across DST changes. It
launches nothing, so it targets an empty asset selection rather than some
experiment's job.
"""

from __future__ import annotations

from collections.abc import Callable

import dagster as dg

from hangar_dagster.window import EvalWindow

DRAIN_NAME = "eval_window_drain"

OnClose = Callable[[dg.ScheduleEvaluationContext], object]  # its result is ignored


def build_drain_schedule(window: EvalWindow, on_close: OnClose) -> list[dg.ScheduleDefinition]:
    """``eval_window_drain``, running by default; none when the window is always open.

    ``on_close`` runs once at each end of the window and should stop what is running.
    """
    if window.end is None:  # always open: nothing to drain
        return []
    end = window.end
    described = window.describe()

    @dg.schedule(
        cron_schedule=f"{end.minute} {end.hour} * * *",
        execution_timezone=window.tz.key,
        name=DRAIN_NAME,
        target=dg.AssetSelection.assets(),
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Drains running trials at the end of the eval window ({described}).",
    )
    def eval_window_drain(context: dg.ScheduleEvaluationContext) -> dg.SkipReason:
        on_close(context)
        at = context.scheduled_execution_time.astimezone(window.tz)
        return dg.SkipReason(
            f"drained at the end of the eval window {described}"
            f" ({at:%Y-%m-%d %H:%M %Z}); nothing launched"
        )

    return [eval_window_drain]
