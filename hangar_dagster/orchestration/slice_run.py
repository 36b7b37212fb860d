"""One trials slice of ``hangar experiment run --wait`` / ``resume``, in a process of its own.

``python -m hangar_dagster.orchestration.slice_run EXPERIMENT TAGS_JSON OUT PARENT_PID``
executes one trials run with those run tags (``driver._Slice`` starts it, so that the next
slice's run overlaps this one's tail) and writes ``{"run_id", "success"}`` or
``{"interrupted"}`` to ``OUT``. SIGINT and SIGTERM cut its trials off as they do for ``drive``;
it gets SIGTERM when its parent dies (Linux's parent-death signal), so it never outlives the
command that started it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from hangar_dagster.util.procs import die_with_parent


def _die_with(parent: int) -> None:
    # The signal comes when the parent's thread that started us ends; a parent already gone
    # before the call would never send it, hence the check after.
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    experiment_id, tags_json, out, parent = argv
    _die_with(int(parent))
    import warnings

    import dagster as dg

    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.orchestration.driver import Interrupted, execute_stage, with_signals
    from hangar_dagster.orchestration.instance import ensure_dagster_home
    from hangar_dagster.queue.drain import interrupted
    from hangar_dagster.settings import Settings

    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    settings = Settings.from_env()
    exp = load_resolved(settings.paths, experiment_id)
    ensure_dagster_home(settings)
    tags: dict[str, str] = json.loads(tags_json)

    def one() -> tuple[str, bool]:
        if why := interrupted():  # stopped while starting: make no run at all
            raise Interrupted(why)
        with dg.DagsterInstance.get() as instance:
            return execute_stage(exp, instance, "trials", tags)

    try:
        run_id, success = with_signals(exp, one, own_runs=True)
    except Interrupted as cut:
        Path(out).write_text(json.dumps({"interrupted": cut.why}))
        return 130
    Path(out).write_text(json.dumps({"run_id": run_id, "success": success}))
    return 0 if success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
