"""``hangar experiment``: submit, run, resume, read, export and freeze experiments."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hangar_dagster.cli.common import (
    STANDIN_NOTE,
    console,
    err,
    find_experiment,
    store_of,
    summary_table,
    where_next,
)
from hangar_dagster.cli.ui import notify_webserver
from hangar_dagster.experiment.spec import SpecError, json_schema
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import Settings, paths

app = typer.Typer(no_args_is_help=True, help="Submit, run, read and export experiments.")


@app.command("run")
def run_cmd(
    spec: Annotated[Path, typer.Argument(help="The experiment spec (YAML).")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Run the stages here and wait for the index.")
    ] = False,
) -> None:
    """Validate and submit SPEC; with --wait, run it to its index and print the summary."""
    from hangar_dagster.experiment.submit import submit

    settings = Settings.from_env()
    p = settings.paths
    try:
        exp = submit(spec, settings)
    except SpecError as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    console.print(
        f"submitted [bold]{exp.experiment_id}[/] ({len(exp.trial_keys())} trials, {len(exp.variants)} variants)"
    )
    ensure_dagster_home(settings)  # the daemon and the UI need the instance even before a run
    notify_webserver(settings)
    if not wait:
        from hangar_dagster.orchestration.sensors import DAEMON_MARKER

        (p.experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
        console.print(
            "queued for the daemon: `hangar ui` (or dagster-daemon) runs it; `hangar experiment get` follows it"
        )
        return
    _drive(settings, exp)


@app.command("resume")
def resume_cmd(name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")]) -> None:
    """Run an experiment's stages again: finished trials are kept, missing and infra-failed ones run."""
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.orchestration.driver import run_in_flight

    settings = Settings.from_env()
    p = settings.paths
    exp = load_resolved(p, find_experiment(p, name_or_id).experiment_id)
    busy = run_in_flight(exp, settings)
    if busy is not None:  # running beside it would run (and pay for) the same trials twice
        err.print(
            f"[red]refused:[/] {exp.experiment_id}: {escape(busy)}; resume runs the "
            "same trials, so wait until it ends (`hangar experiment get` follows it), or terminate "
            "it in the Dagster UI if its worker is gone"
        )
        raise typer.Exit(2)
    _drive(settings, exp)


def _drive(settings: Settings, exp: Any) -> None:
    from hangar_dagster.orchestration.driver import StageFailed, drive

    p = settings.paths
    try:
        drive(exp, store_of(p), settings, say=lambda m: console.print(f"[yellow]{m}[/]"))
    except StageFailed as e:
        err.print(f"[red]{e}[/]")
        raise typer.Exit(1) from None
    store = store_of(p)
    console.print(
        summary_table(store.summary(exp.experiment_id), f"{exp.name} ({exp.experiment_id})")
    )
    if any(v.adapter == "standin" for v in exp.variants.values()):
        console.print(f"[yellow]{STANDIN_NOTE}[/]")
    where_next(p, exp.experiment_id)


@app.command("get")
def get_cmd(
    name_or_id: Annotated[
        str, typer.Argument(help="Experiment id or name (the latest with that name).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the index as JSON.")] = False,
) -> None:
    """Show an experiment's pins, summary and per-trial index."""
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.trials.redact import redact

    p = paths()
    record = find_experiment(p, name_or_id)
    store = store_of(p)
    canary = load_resolved(p, record.experiment_id).canary
    out = {
        "experiment": record.model_dump(mode="json", exclude={"spec_json"}),
        "pins": {
            v: pin.model_dump(mode="json") for v, pin in store.pins(record.experiment_id).items()
        },
        "base_checks": {
            t: c.model_dump(mode="json") for t, c in store.base_checks(record.experiment_id).items()
        },
        "summary": store.summary(record.experiment_id),
        "trials": store.index(record.experiment_id),
        "attempts": _attempts(store.trials(record.experiment_id, all_attempts=True)),
        "notes": [n.model_dump(mode="json") for n in store.notes(record.experiment_id)],
        "queue": _queue_state(load_resolved(p, record.experiment_id), store),
    }
    out = redact(json.loads(json.dumps(out, default=str)), canary)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    console.print(
        f"[bold]{record.experiment_id}[/]  {record.name} by {record.author}, submitted {record.submitted_at:%Y-%m-%d %H:%M %Z}"
    )
    for variant, pin in out["pins"].items():
        console.print(f"  {variant}: {pin['pin_set']}  {pin['harness_lock']}  model {pin['model']}")
    for task, check in out["base_checks"].items():
        state = f"[red]invalid: {check['reason']}[/]" if check["invalid"] else "ok (fails on base)"
        console.print(f"  base check {task}: {state}")
    console.print(summary_table(out["summary"], "summary"))
    table = Table(title="trials (highest attempt per key)")
    for col in ("trial", "attempt", "outcome", "verify", "grade", "trust", "tests", "duration s"):
        table.add_column(col)
    for row in out["trials"]:
        counts = row.get("hidden_tests") or {}
        grade = "-" if row.get("passed") is None else ("pass" if row["passed"] else "fail")
        table.add_row(
            row["trial_key"],
            str(row["attempt"]),
            row["outcome_class"],
            str(row.get("verify_passed")),
            grade,
            str(row.get("trust") or "-"),
            f"{counts.get('passed', 0)}/{counts.get('total', 0)}" if counts else "-",
            f"{row.get('duration_s', 0):.1f}",
        )
    console.print(table)
    by_key: dict[str, list[dict[str, Any]]] = {}
    for a in out["attempts"]:
        by_key.setdefault(a["trial_key"], []).append(a)
    for key, tries in by_key.items():
        if len(tries) > 1:
            said = "; ".join(
                f"{a['attempt']} {a['outcome_class']}"
                + (f" / {a['infra_reason']}" if a["infra_reason"] else "")
                + f" (run {a['run_id'][:8]}{', counts' if a['counts'] else ', excluded'})"
                for a in tries
            )
            console.print(escape(f"  attempts of {key}: {said}"))
    for note in out["notes"]:
        console.print(escape(f"  note [{note['kind']}]: {note['message']}"))
    queue = out["queue"]
    if queue["pending_trials"]:
        console.print(
            f"  queue: {queue['pending_trials']} trial(s) to run; {queue['reason'] or 'ready to start'}"
        )
    for note in queue["notes"]:
        console.print(f"  queue note: {note}")


def _attempts(trials: list[Any]) -> list[dict[str, Any]]:
    """Every attempt of every key: the highest counts; an earlier one was excluded by a retry,
    ``retried_by`` names the run of the attempt after it."""
    runs = {(t.trial_key, t.attempt): t.run_id for t in trials}
    return [
        t.model_dump(mode="json", exclude={"manifest", "trace"})
        | {
            "counts": (t.trial_key, t.attempt + 1) not in runs,
            "retried_by": runs.get((t.trial_key, t.attempt + 1)),
        }
        for t in trials
    ]


def _queue_state(exp: Any, store: Any) -> dict[str, Any]:
    """What the eval queue still has for the experiment and why it waits (e.g. reason eval_window)."""
    import datetime as dt

    from hangar_dagster.queue.starts import pending, waiting_reason

    settings = Settings.from_env()
    work = pending(exp, store, settings)
    why = waiting_reason(exp, store, settings, dt.datetime.now(dt.UTC)) if work else None
    return {"pending_trials": len(work.keys), "reason": why, "notes": work.notes}


@app.command("export")
def export_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Folder to write index.json and trials/ into.")
    ],
) -> None:
    """Write index.json and each trial's manifest.json and trace.json (canary masked)."""
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.results.export import export_experiment

    p = paths()
    record = find_experiment(p, name_or_id)
    target = export_experiment(
        store_of(p), record.experiment_id, out, load_resolved(p, record.experiment_id).canary
    )
    console.print(f"exported {record.experiment_id} to {target}")


@app.command("freeze-variants")
def freeze_variants_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
    out: Annotated[
        Path, typer.Option("--out", help="Harness registry to freeze the variants into.")
    ],
    locked: Annotated[
        Path, typer.Option("-o", "--output", help="Where to write the spec with harness locks.")
    ],
) -> None:
    """Turn each overlay variant into a harness lock from its first finished trial; write the spec."""
    from hangar_dagster.experiment.overlay import FreezeError, freeze_variants
    from hangar_dagster.experiment.submit import load_resolved

    p = paths()
    record = find_experiment(p, name_or_id)
    try:
        refs = freeze_variants(load_resolved(p, record.experiment_id), store_of(p), out, locked)
    except FreezeError as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    for variant, ref in refs.items():
        console.print(f"  {variant}: {ref}")
    console.print(
        f"wrote {locked} (harness_repo {out}); run it with `hangar experiment run {locked}`"
    )


@app.command("schema")
def schema_cmd(
    out: Annotated[Path | None, typer.Option("-o", help="Write here instead of stdout.")] = None,
) -> None:
    """Print the experiment spec's JSON schema (experiment.schema.json is generated by this)."""
    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
