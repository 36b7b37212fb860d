"""``hangar experiment``: submit, run, resume, read, export and freeze experiments."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from hangar_dagster.cli.common import (
    STANDIN_NOTE,
    console,
    err,
    find_experiment,
    hangar_command,
    store_of,
    summary_table,
    where_next,
)
from hangar_dagster.cli.ui import notify_webserver
from hangar_dagster.experiment.spec import SpecError, json_schema
from hangar_dagster.experiment.state import Refusal, State
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import HangarPaths, Settings, paths

if TYPE_CHECKING:
    from hangar_dagster.orchestration.status import RunStatus

app = typer.Typer(no_args_is_help=True, help="Submit, run, read and export experiments.")


WindowWait = Annotated[
    bool,
    typer.Option(
        "--window-wait/--no-window-wait",
        help="With the eval window closed, sleep until it opens (default), or stop there: exit"
        " 3, incomplete, the window named, the trials left pending for `resume`.",
    ),
]


@app.command("run")
def run_cmd(
    spec: Annotated[Path, typer.Argument(help="The experiment spec (YAML).")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Run the stages here and wait for the index.")
    ] = False,
    window_wait: WindowWait = True,
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
    if not wait:  # before the instance: a submit the daemon cannot see yet is still queued
        from hangar_dagster.experiment.catalog import DAEMON_MARKER

        (p.experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    try:
        ensure_dagster_home(settings)  # the daemon and the UI need the instance before a run
    except OSError as e:
        then = (
            "the daemon runs it once it can"
            if not wait
            else f"then `hangar experiment resume {exp.experiment_id}` runs it"
        )
        err.print(
            f"[red]error:[/] the Dagster instance's directory {settings.dagster_home} "
            f"(DAGSTER_HOME) cannot be made: {e.strerror or e}. Point DAGSTER_HOME at a "
            f"writable directory or free that path; {then}."
        )
        raise typer.Exit(2) from None
    notify_webserver(settings)  # in the background: returns at once whatever the webserver does
    if not wait:
        console.print(
            "queued for the daemon: `hangar ui` (or dagster-daemon) runs it; `hangar experiment get` follows it"
        )
        return
    _drive(settings, exp, window_wait)


@app.command("regrade")
def regrade_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="The spec with the new grader (default: the experiment's own spec file as it "
            "reads now, hidden test files included).",
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait",
            help="Grade here and print the summary (default), or leave it to the daemon.",
        ),
    ] = True,
) -> None:
    """Grade every counted trial's stored patch again under a changed grader: no agent runs.

    A new experiment (its id printed) holds the same trials and their new grades; the old
    one's grades stay as they were. A spec that changes anything but the grader is refused
    (exit 2, each field named). Run again with the same grader, it goes on with that regrade
    and grades only what has no grade yet (after a crash, say). Exits as run --wait."""
    from hangar_dagster.experiment.regrade import RegradeSubmitted, spec_of
    from hangar_dagster.experiment.submit import finish_submit, load_resolved, submit
    from hangar_dagster.orchestration.driver import run_in_flight
    from hangar_dagster.results.store import Store

    settings = Settings.from_env()
    p = settings.paths
    old = load_resolved(p, find_experiment(p, name_or_id).experiment_id)
    try:
        exp = submit(spec_of(old, spec), settings, regrade=old)
    except SpecError as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    except RegradeSubmitted as again:  # run again (after a crash, say): go on with that one
        exp = again.experiment
        finish_submit(exp, Store(p), p, regrade=old)  # what a crash in its submit cut off
        busy = run_in_flight(exp, settings, say=lambda m: err.print(f"[yellow]{escape(m)}[/]"))
        if busy is not None:
            err.print(f"[red]refused:[/] {exp.experiment_id}: {escape(busy)}; wait until it ends")
            raise typer.Exit(2) from None
        console.print(
            f"continuing [bold]{exp.experiment_id}[/]: the regrade of {old.experiment_id} under "
            f"grader {exp.grader_digest}, submitted before; its stored grades are kept"
        )
    else:
        console.print(
            f"submitted [bold]{exp.experiment_id}[/]: regrade of {old.experiment_id} "
            f"({len(exp.trial_keys())} trials, grader {exp.grader_digest}; "
            f"was {old.grader_digest})"
        )
    ensure_dagster_home(settings)
    if not wait:
        from hangar_dagster.experiment.catalog import DAEMON_MARKER

        (p.experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    notify_webserver(settings)
    if wait:
        _drive(settings, exp)


@app.command("resume")
def resume_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
    window_wait: WindowWait = True,
) -> None:
    """Run an experiment's stages again: finished trials are kept, missing and infra-failed ones run."""
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.orchestration.driver import run_in_flight

    settings = Settings.from_env()
    p = settings.paths
    exp = load_resolved(p, find_experiment(p, name_or_id).experiment_id)
    _refuse_if_archived(p, exp.experiment_id, "resume")
    busy = run_in_flight(exp, settings, say=lambda m: err.print(f"[yellow]{escape(m)}[/]"))
    if busy is not None:  # running beside it would run (and pay for) the same trials twice
        # Its worker is alive (or on another host): a run whose worker is gone was ended above.
        err.print(
            f"[red]refused:[/] {exp.experiment_id}: {escape(busy)}; resume runs the "
            "same trials, so wait until it ends (`hangar experiment get` follows it)"
        )
        raise typer.Exit(2)
    _drive(settings, exp, window_wait)


def _print_headline(lines: list[str], canary: str) -> None:
    """Points with interval and n, the paired difference, invalid tasks, the readback."""
    from hangar_dagster.trials.redact import redact

    for line in lines:
        style = "yellow" if line.startswith(("readback:", "invalid tasks")) else "bold"
        console.print(f"[{style}]{escape(str(redact(line, canary)))}[/]")


def _refuse_if_archived(p: HangarPaths, experiment_id: str, what: str) -> None:
    from hangar_dagster.experiment.catalog import read_archived

    if read_archived(p, experiment_id) is not None:  # its jobs are not in the definitions
        err.print(
            f"[red]refused:[/] {experiment_id} is archived, so its jobs are not loaded; "
            f"`hangar experiment unarchive {experiment_id}` first, then {what}"
        )
        raise typer.Exit(2)


# `run --wait` and `resume` exit codes (README.md, docs/operations.md): 0 complete, 1 a stage
# run failed, 2 refused, 3 incomplete (the reason printed), 130 interrupted (SIGINT/SIGTERM).
EXIT_STAGE_FAILED = 1
EXIT_REFUSED = 2
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130


def _drive(settings: Settings, exp: Any, window_wait: bool = True) -> None:
    import datetime as dt

    from hangar_dagster.cli.progress import Ticker, read_progress
    from hangar_dagster.orchestration.driver import Interrupted, StageFailed, drive
    from hangar_dagster.results.report import build_report, report_dir
    from hangar_dagster.results.summary import (
        Terminal,
        headline,
        intervals,
        read_terminal,
        unfinished,
    )

    p = settings.paths
    eid = exp.experiment_id
    planned = len(exp.trial_keys())
    watch = store_of(p)  # the ticker's own reader, beside the stages' store
    try:
        with Ticker(console, lambda elapsed: read_progress(watch, eid, planned, elapsed)):
            runs = drive(
                exp,
                store_of(p),
                settings,
                say=lambda m: console.print(f"[yellow]{m}[/]"),
                window_wait=window_wait,
            )
    except Interrupted as e:
        store = store_of(p)
        cut = [
            t.trial_key
            for t in store.trials(eid)
            if t.outcome_class == "infra_error" and t.infra_reason == "interrupted"
        ]
        err.print(
            f"[red]interrupted[/] ({escape(e.why.removeprefix('interrupted: '))}): no trial "
            f"started since; {len(cut)} running trial(s) cut off as infra_error / interrupted"
            + (f", run(s) {', '.join(e.runs_failed)} marked failed" if e.runs_failed else "")
        )
        err.print(f"resume with: [bold]{hangar_command()} experiment resume {eid}[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except StageFailed as e:
        err.print(f"[red]{e}[/]")
        raise typer.Exit(EXIT_STAGE_FAILED) from None
    store = store_of(p)
    # The stages' last run is the index's: what it computed (report, readback, unfinished) is
    # read back rather than built again; built here only when that file is not its.
    said = read_terminal(report_dir(p, eid), runs[-1]) if runs else None
    if said is None:
        report = build_report(exp, store)
        now = dt.datetime.now(dt.UTC)
        said = Terminal(
            "", intervals(report), headline(report), unfinished(exp, store, settings, now)
        )
    console.print(summary_table(store.summary(eid), f"{exp.name} ({eid})", said.intervals))
    _print_headline(said.headline, exp.canary)
    if any(v.adapter == "standin" for v in exp.variants.values()):
        console.print(f"[yellow]{STANDIN_NOTE}[/]")
    where_next(p, eid)
    if why := said.unfinished:
        for line in why:
            err.print(f"[red]incomplete:[/] {escape(line)}")
        err.print(
            f"the pass rate is not final; `{hangar_command()} experiment resume {eid}` goes on"
        )
        raise typer.Exit(EXIT_INCOMPLETE)


@app.command("get")
def get_cmd(
    name_or_id: Annotated[
        str, typer.Argument(help="Experiment id or name (the latest with that name).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the index as JSON.")] = False,
) -> None:
    """Show an experiment's pins, summary and per-trial index."""
    from hangar_dagster.experiment.catalog import read_archived
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.queue.starts import waiting_grades_note
    from hangar_dagster.results.summary import headline, intervals
    from hangar_dagster.trials.redact import redact

    p = paths()
    record = _found(p, name_or_id, as_json)
    store = store_of(p)
    exp = load_resolved(p, record.experiment_id)
    canary = exp.canary
    archived = read_archived(p, record.experiment_id)
    out, report = experiment_state(exp, store, record, archived)
    out = redact(json.loads(json.dumps(out, default=str)), canary)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    console.print(
        f"[bold]{record.experiment_id}[/]  {record.name} by {record.author}, submitted {record.submitted_at:%Y-%m-%d %H:%M %Z}"
    )
    if archived is not None:
        console.print(
            f"  [yellow]archived[/] {archived.at:%Y-%m-%d %H:%M %Z} by {escape(archived.by)}"
            + (f" (forced, {archived.pending_trials} trial(s) given up)" if archived.forced else "")
            + f"; not in the loaded definitions (`hangar experiment unarchive {record.experiment_id}`)"
        )
    if exp.shadow is not None:
        console.print(
            f"  shadow {exp.shadow.policy}: {len(exp.shadow.merges)} merge(s) of "
            f"{escape(exp.shadow.repo)} {exp.shadow.mainline} (`hangar shadow status "
            f"{exp.shadow.policy}`)"
        )
    for variant, pin in out["pins"].items():
        # The egress the variant's trials run under (the seed's pins.trial_egress).
        console.print(
            f"  {variant}: {pin['pin_set']}  {pin['harness_lock']}  model {pin['model']}"
            f"  egress {pin['egress']}"
        )
    for task, check in out["base_checks"].items():
        state = f"[red]invalid: {check['reason']}[/]" if check["invalid"] else "ok (fails on base)"
        console.print(f"  base check {task}: {state}")
    console.print(summary_table(out["summary"], "summary", intervals(report)))
    _print_headline(headline(report), canary)
    table = Table(title="trials (highest attempt per key)")
    for col in (
        "trial", "attempt", "outcome", "verify", "grade", "trust", "tests", "duration s", "source"
    ):  # fmt: skip
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
            _source(row),
        )
    console.print(table)
    for row in report.failed:  # worst first, each with the grader's or the trial's reason
        console.print(escape(f"  failed {row.trial_key}: {redact(row.why, canary)}"))
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
    if queue["waiting_grades"]:
        console.print(
            f"  [yellow]{waiting_grades_note(queue['waiting_grades'])}[/] "
            f"(`hangar experiment resume {record.experiment_id}` grades them)"
        )
    for note in queue["notes"]:
        console.print(f"  queue note: {note}")


def experiment_state(
    exp: Any, store: Any, record: Any, archived: Any
) -> tuple[dict[str, Any], Any]:
    """What `get` shows: the experiment's records, figures and queue state, and its report.

    The queue is read first. Grades and trials are only ever added, so every read after it
    sees at least what it counted: "complete" is never printed beside a summary read before
    the last grade landed (a reader polling for "complete" took such a stale summary).
    """
    from hangar_dagster.results.report import build_report, to_json

    eid = record.experiment_id
    queue = _queue_state(exp, store, archived is not None)
    report = build_report(exp, store)
    out = {
        "experiment": record.model_dump(mode="json", exclude={"spec_json"}),
        "archived": None if archived is None else archived.model_dump(mode="json"),
        # A shadow's experiment: the policy and the merge each task is (task id -> SHA).
        "shadow": None if exp.shadow is None else exp.shadow.model_dump(mode="json"),
        "pins": {v: pin.model_dump(mode="json") for v, pin in store.pins(eid).items()},
        "base_checks": {t: c.model_dump(mode="json") for t, c in store.base_checks(eid).items()},
        "summary": store.summary(eid),
        "trials": store.index(eid),
        "attempts": _attempts(store.trials(eid, all_attempts=True)),
        "notes": [n.model_dump(mode="json") for n in store.notes(eid)],
        "queue": queue,
        "report": to_json(report),
    }
    return out, report


def _source(row: dict[str, Any]) -> str:
    if row.get("source") == "shadow":  # a candidate run on a merge, graded against it
        return f"shadow of {str(row.get('shadow_of'))[:12]}"
    # reused: measured by an earlier experiment, not run or paid here
    if row.get("reused_from"):
        return f"reused {(row.get('reused_from') or {}).get('experiment_id')}"
    return "fresh"


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


def _queue_state(exp: Any, store: Any, archived: bool) -> dict[str, Any]:
    """What the eval queue still has for the experiment and why it waits (e.g. reason eval_window).

    An archived experiment's pending trials (archived with --force) wait for its unarchive.
    """
    import datetime as dt

    from hangar_dagster.queue.starts import pending, waiting_reason

    settings = Settings.from_env()
    work = pending(exp, store, settings)
    why = (
        waiting_reason(exp, store, settings, dt.datetime.now(dt.UTC), work.keys)
        if work.keys
        else None
    )
    if work.keys and archived:
        why = "archived: `hangar experiment unarchive` lets them run"
    return {
        "pending_trials": len(work.keys),
        "waiting_grades": len(work.grades),
        "complete": not work,
        "reason": why,
        "notes": work.notes,
    }


@app.command("export")
def export_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Folder to write index.json and trials/ into.")
    ],
) -> None:
    """Write index.json, each trial's manifest.json and trace.json, and the report (canary masked)."""
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.results.export import export_experiment
    from hangar_dagster.results.report import build_report

    p = paths()
    record = find_experiment(p, name_or_id)
    exp = load_resolved(p, record.experiment_id)
    store = store_of(p)
    target = export_experiment(
        store, record.experiment_id, out, exp.canary, report=build_report(exp, store)
    )
    console.print(f"exported {record.experiment_id} to {target}")


@app.command("report")
def report_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
    out: Annotated[
        Path | None,
        typer.Option("-o", "--out", help="Folder for report.md, report.html and figure.png."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print every figure of the report as JSON.")
    ] = False,
) -> None:
    """Write the report: question, picture, five lines per variant, health, failed rows."""
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.results.report import build_report, report_dir, to_json, write_report
    from hangar_dagster.trials.redact import redact

    p = paths()
    record = _found(p, name_or_id, as_json)
    exp = load_resolved(p, record.experiment_id)
    report = build_report(exp, store_of(p))
    target = out if out is not None else report_dir(p, record.experiment_id)
    written = write_report(report, target, exp.canary)
    if as_json:
        data = to_json(report) | {
            "files": {
                "markdown": str(written.markdown),
                "html": str(written.html),
                "figure": str(written.figure),
                "trial_pages": [str(t) for t in written.trials],
            }
        }
        print(json.dumps(redact(data, exp.canary), indent=2))
        return
    for v in report.variants:
        console.print(f"[bold]{escape(v.name)}[/]" + (" (baseline)" if v.is_baseline else ""))
        for word, line in v.lines.items():
            console.print(f"  {word}: {escape(str(redact(line, exp.canary)))}")
    for line in report.readback:
        console.print(f"[yellow]readback:[/] {escape(line)}")
    console.print(
        f"wrote {written.markdown}, {written.html.name}, {written.figure.name} and "
        f"{len(written.trials)} trial page(s) under trials/"
    )


@app.command("compare")
def compare_cmd(
    before: Annotated[
        str | None, typer.Argument(help="The earlier experiment (id or name).")
    ] = None,
    after: Annotated[str | None, typer.Argument(help="The later experiment (id or name).")] = None,
    nightly_name: Annotated[
        str | None,
        typer.Option(
            "--nightly",
            metavar="NAME",
            help="Instead of two experiments: a night of this nightly schedule beside the "
            "night before it.",
        ),
    ] = None,
    night: Annotated[
        str | None,
        typer.Option(
            "--night",
            metavar="YYYY-MM-DD",
            help="With --nightly: which night (default the latest).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
) -> None:
    """Compare two experiments that share tasks (last night against tonight), variant by
    variant: each rate with its interval and n, the paired difference, power and flips."""
    from dataclasses import asdict

    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.results import stats
    from hangar_dagster.results.report import counted_outcomes

    p = paths()
    store = store_of(p)
    nights: dict[str, Any] = {}
    if nightly_name is not None:
        if before is not None or after is not None:
            _fail(as_json, "give two experiments or --nightly NAME, not both", "drop one")
        before, after, nights = _nights_to_compare(p, nightly_name, night, as_json)
    elif before is None or after is None:
        _fail(
            as_json,
            "compare needs two experiments (BEFORE AFTER) or --nightly NAME",
            "e.g. `hangar experiment compare --nightly skills-ab`",
        )
    assert before is not None and after is not None
    a, b = (load_resolved(p, _found(p, n, as_json).experiment_id) for n in (before, after))
    decide = b.spec.decide or a.spec.decide
    min_effect = decide.min_effect_pts if decide is not None else None
    try:
        pairs = stats.compare_experiments(
            counted_outcomes(a, store), counted_outcomes(b, store), min_effect_pts=min_effect
        )
    except stats.NoSharedTasks as e:
        _fail(
            as_json,
            f"{a.experiment_id} and {b.experiment_id}: {e}",
            "compare experiments that ran the same tasks under the same variant names",
        )
    if as_json:
        data = {
            "before": a.experiment_id,
            "after": b.experiment_id,
            "nights": nights or None,
            "min_effect_pts": min_effect,
            "variants": {
                name: asdict(c)
                | {
                    "before_label": c.baseline.label,
                    "after_label": c.variant.label,
                    "difference_label": c.difference.label,
                    "power_label": c.power.label,
                }
                for name, c in pairs.items()
            },
        }
        print(json.dumps(data, indent=2, default=str))
        return
    console.print(f"[bold]{a.experiment_id}[/] ({a.name}) -> [bold]{b.experiment_id}[/] ({b.name})")
    if nights:
        console.print(
            f"nightly {escape(nights['schedule'])}: night {nights['before']['night']} -> "
            f"night {nights['after']['night']}"
        )
        for task, (was, now) in nights["moved"].items():
            console.print(f"  base of {escape(task)} moved: {was[:12]} -> {now[:12]}")
        if not nights["moved"]:
            console.print("  no base moved")
    for name, c in pairs.items():
        console.print(f"[bold]{escape(name)}[/]: {c.baseline.label} -> {c.variant.label}")
        console.print(f"  after - before: {c.difference.label}")
        console.print(f"  power: {escape(c.power.label)}")
        for f in c.flips:
            console.print(f"  {escape(f.label)}")


@app.command("schedule")
def schedule_cmd(
    spec: Annotated[
        Path | None, typer.Argument(help="A spec with nightly: {at, timezone} to register.")
    ] = None,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Register SPEC over the copy stored under its name."),
    ] = False,
    list_: Annotated[
        bool, typer.Option("--list", help="The registered schedules and their last night.")
    ] = False,
    pause: Annotated[
        str | None, typer.Option("--pause", metavar="NAME", help="Submit no night until resumed.")
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", metavar="NAME", help="Submit its nights again.")
    ] = None,
    remove: Annotated[
        str | None,
        typer.Option("--remove", metavar="NAME", help="Unregister it; its nights stay."),
    ] = None,
) -> None:
    """Register SPEC to be submitted afresh every night at its nightly.at (a copy of it: later
    edits of the file change nothing until registered again with --replace); or list, pause,
    resume or remove registered schedules (docs/queue.md, "Nightly experiments")."""
    import datetime as dt

    from hangar_dagster.experiment import nightly

    settings = Settings.from_env()
    p = settings.paths
    chosen = [
        flag
        for flag, given in (
            ("SPEC", spec is not None),
            ("--list", list_),
            ("--pause", pause is not None),
            ("--resume", resume is not None),
            ("--remove", remove is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        err.print(
            f"[red]refused:[/] give one of SPEC, --list, --pause NAME, --resume NAME, "
            f"--remove NAME (got {', '.join(chosen) or 'none'})"
        )
        raise typer.Exit(2)
    now = dt.datetime.now(dt.UTC)
    try:
        if spec is not None:
            done = nightly.register(spec, settings, replace=replace)
            nxt = nightly.next_due(done.nightly, now).astimezone(done.nightly.zone)
            console.print(
                f"nightly schedule [bold]{escape(done.name)}[/] registered: {done.at} "
                f"{done.timezone}, spec {done.spec_digest[:19]} (a copy of {escape(done.spec_path)}); "
                f"next night submitted {nxt:%Y-%m-%d %H:%M %Z} by the daemon "
                f"(schedule nightly_experiments; eval window {settings.window.describe()})"
            )
        elif pause is not None or resume is not None:
            name = pause if pause is not None else resume
            assert name is not None
            done = nightly.set_paused(p, name, pause is not None)
            console.print(
                f"nightly schedule {escape(name)} {'paused' if done.paused else 'resumed'}"
            )
        elif remove is not None:
            nightly.remove(p, remove)
            console.print(
                f"nightly schedule {escape(remove)} removed; its nights and their experiments stay"
            )
        else:
            _list_schedules(p, now)
    except SpecError as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    except nightly.NightlyError as e:
        err.print(f"[red]refused:[/] {escape(str(e))}")
        raise typer.Exit(2) from None


def _list_schedules(p: HangarPaths, now: Any) -> None:
    from hangar_dagster.experiment import nightly

    found, broken = nightly.schedules(p), nightly.broken_schedules(p)
    for why in broken.values():  # listed, not a traceback: the others still show
        err.print(f"[red]broken:[/] {escape(why)}")
    if not found:
        console.print(f"no nightly schedule under {p.nightly}" + (" that reads" if broken else ""))
        return
    table = Table(title=f"nightly schedules under {p.nightly}")
    for col in ("name", "at", "state", "spec", "next night", "last night"):
        table.add_column(col)
    for s in found:
        zone = s.nightly.zone
        nights = nightly.nights(p, s.name)
        last = "-"
        if nights:
            n = nights[-1]
            last = f"{n.night}: " + (n.experiment_id or f"refused: {n.refused}")
        table.add_row(
            escape(s.name),
            f"{s.at} {s.timezone}",
            "paused" if s.paused else "active",
            s.spec_digest[:19],
            "-"
            if s.paused
            else f"{nightly.next_due(s.nightly, now).astimezone(zone):%Y-%m-%d %H:%M %Z}",
            escape(last),
        )
    console.print(table)


def _fail(as_json: bool, error: str, fix: str) -> NoReturn:
    """Exit 2 with ``error`` and its ``fix``: JSON on stdout with --json, else on stderr."""
    if as_json:
        print(json.dumps({"error": error, "fix": fix}))
    else:
        err.print(f"[red]refused:[/] {escape(error)}; {escape(fix)}")
    raise typer.Exit(2)


def _nights_to_compare(
    p: HangarPaths, name: str, night: str | None, as_json: bool
) -> tuple[str, str, dict[str, Any]]:
    """The experiments of a nightly schedule's night (default its latest) and of the night
    before it, and what the two nights' records say (bases, what moved)."""
    import datetime as dt

    from hangar_dagster.experiment import nightly

    submitted = [n for n in nightly.nights(p, name) if n.experiment_id is not None]
    if night is not None:
        try:
            wanted = dt.date.fromisoformat(night)
        except ValueError:
            _fail(as_json, f"--night {night!r} is not a date", "write it as YYYY-MM-DD")
        submitted = [n for n in submitted if n.night <= wanted]
        if not submitted or submitted[-1].night != wanted:
            _fail(
                as_json,
                f"nightly schedule {name!r} submitted no experiment on night {night}",
                "`hangar experiment schedule --list` shows its last night",
            )
    if len(submitted) < 2:
        _fail(
            as_json,
            f"nightly schedule {name!r} has {len(submitted)} submitted night(s) up to there; "
            "a comparison needs the night and one before it",
            "wait for the next night, or compare two experiments by id",
        )
    before, after = submitted[-2], submitted[-1]
    assert before.experiment_id is not None and after.experiment_id is not None
    return (
        before.experiment_id,
        after.experiment_id,
        {
            "schedule": name,
            "before": before.model_dump(mode="json"),
            "after": after.model_dump(mode="json"),
            "moved": nightly.moved_bases(before, after),
        },
    )


def _found(p: HangarPaths, name_or_id: str, as_json: bool) -> Any:
    """The experiment; with --json an unknown one is a JSON error on stdout (exit 2)."""
    if not as_json:
        return find_experiment(p, name_or_id)
    record = store_of(p).find_experiment(name_or_id)
    if record is None:
        _fail(
            True,
            f"no experiment {name_or_id!r} under {p.home}",
            "`hangar experiment list` shows the experiments; `hangar experiment run SPEC` submits one",
        )
    return record


@app.command("list")
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    active: Annotated[
        bool, typer.Option("--active", help="Leave archived experiments out.")
    ] = False,
    state: Annotated[
        State | None, typer.Option("--state", help="Only experiments in this state.")
    ] = None,
) -> None:
    """Every experiment with its state (waiting, running, complete, archived) and trials done."""
    settings = Settings.from_env()
    p = settings.paths
    rows = experiment_rows(settings)
    shown = [
        r
        for r in rows
        if (r["state"] == state if state is not None else not active or r["state"] != "archived")
    ]
    if as_json:
        print(json.dumps(shown, indent=2))
        return
    hidden = sum(r["state"] == "archived" for r in rows) if state is None and active else 0
    if not shown:
        console.print(f"no {f'{state} ' if state else ''}experiments under {p.home}")
    else:
        console.print(_list_table(p, shown))
    if hidden:
        console.print(f"{hidden} archived experiment(s) left out (--active)")


def _list_table(p: HangarPaths, shown: list[dict[str, Any]]) -> Table:
    table = Table(title=f"experiments under {p.home}")
    for col in ("experiment", "name", "author", "submitted", "state", "trials done", "why"):
        table.add_column(col, justify="right" if col == "trials done" else "left")
    for r in shown:
        table.add_row(
            r["experiment_id"],
            escape(r["name"]),
            escape(r["author"]),
            r["submitted_at"][:16].replace("T", " "),
            r["state"],
            f"{r['trials_done']}/{r['trials_planned']}",
            escape(r["why"] or ""),
        )
    return table


def experiment_rows(settings: Settings) -> list[dict[str, Any]]:
    """One row per stored experiment, oldest first; the state from ``state.experiment_state``."""
    p = settings.paths
    import datetime as dt

    from hangar_dagster.experiment.catalog import archived_ids
    from hangar_dagster.experiment.state import experiment_state
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.queue.starts import pending, waiting_grades_note, waiting_reason

    store = store_of(p)
    records = [r for r in store.experiments() if p.experiment_dir(r.experiment_id).is_dir()]
    if not records:
        return []
    from hangar_dagster.orchestration.status import run_status  # dagster: only when there is a row

    runs = run_status(settings)
    archived = archived_ids(p)
    progress = store.trial_progress()
    now = dt.datetime.now(dt.UTC)
    rows = []
    for rec in records:
        eid = rec.experiment_id
        tried, last = progress.get(eid, (0, None))
        if eid in archived:  # its resolved.json stays unread: archived work is not pending
            n_pending, done, why, n_grades = 0, min(tried, rec.trials_planned), None, 0
        else:
            exp = load_resolved(p, eid)
            work = pending(exp, store, settings)
            n_pending, done = len(work.keys), rec.trials_planned - len(work.keys)
            n_grades = len(work.grades)
            why = (
                waiting_reason(exp, store, settings, now, work.keys)
                if work.keys
                else waiting_grades_note(n_grades)
                if n_grades
                else None
            )
        state = experiment_state(
            archived=eid in archived,
            in_flight=eid in runs.in_flight,
            pending_trials=n_pending,
            indexed_at=runs.indexed_at.get(eid),
            last_trial_at=last,
            waiting_grades=n_grades,
        )
        if state == "running":
            why = runs.in_flight[eid]
        elif state == "archived":
            why = None
        elif state == "waiting" and why is None:
            why = f"{n_pending} trial(s) to run" if n_pending else "its index is due"
        rows.append(
            {
                "experiment_id": eid,
                "name": rec.name,
                "author": rec.author,
                "submitted_at": rec.submitted_at.isoformat(),
                "state": str(state),
                "trials_planned": rec.trials_planned,
                "trials_done": done,
                "pending_trials": n_pending,
                "waiting_grades": n_grades,
                "why": why,
            }
        )
    return rows


@app.command("archive")
def archive_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Archive although trials are pending or the index is due (never beside a run in flight).",
        ),
    ] = False,
) -> None:
    """Take a finished experiment out of the loaded definitions; its rows and artifacts stay."""
    import getpass

    from hangar_dagster.experiment.catalog import (
        Archived,
        read_archived,
        remove_archived,
        write_archived,
    )
    from hangar_dagster.experiment.state import archive_refusal
    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.orchestration.driver import run_in_flight
    from hangar_dagster.orchestration.status import run_status
    from hangar_dagster.queue.starts import pending
    from hangar_dagster.results.records import NoteRecord, utcnow

    settings = Settings.from_env()
    p = settings.paths
    eid = find_experiment(p, name_or_id).experiment_id
    if (already := read_archived(p, eid)) is not None:
        console.print(f"{eid} is already archived ({already.at:%Y-%m-%d %H:%M %Z} by {already.by})")
        return
    store = store_of(p)
    work = pending(load_resolved(p, eid), store, settings)
    last = store.trial_progress().get(eid, (0, None))[1]

    def check(force: bool, runs: RunStatus) -> Refusal | None:
        return archive_refusal(
            in_flight=runs.in_flight.get(eid),
            pending_trials=len(work.keys),
            indexed_at=runs.indexed_at.get(eid),
            last_trial_at=last,
            force=force,
        )

    def refuse(why: Refusal) -> NoReturn:
        err.print(f"[red]refused:[/] {eid}: {escape(why.message)}; {escape(why.fix)}")
        raise typer.Exit(2)

    # A run whose worker is gone would block the archive for good: end it first, as resume does.
    run_in_flight(
        load_resolved(p, eid), settings, say=lambda m: err.print(f"[yellow]{escape(m)}[/]")
    )
    runs = run_status(settings)
    if (why := check(force, runs)) is not None:
        refuse(why)
    forced = check(False, runs) is not None  # --force was needed, and is recorded
    by = getpass.getuser()
    write_archived(
        p,
        Archived(
            experiment_id=eid,
            at=utcnow(),
            by=by,
            forced=forced,
            pending_trials=len(work.keys),
        ),
    )
    # A run the daemon launched while we checked would lose its job: check again, then undo.
    if (late := check(True, run_status(settings))) is not None:
        remove_archived(p, eid)
        refuse(late)
    given_up = f"; forced, {len(work.keys)} trial(s) pending given up" if forced else ""
    store.put(NoteRecord(experiment_id=eid, kind="archive", message=f"archived by {by}{given_up}"))
    notify_webserver(settings)
    console.print(
        f"archived {eid}: out of the loaded definitions; `get`, `export` and SQL still read it"
        f" (`hangar experiment unarchive {eid}` brings it back)"
    )


@app.command("unarchive")
def unarchive_cmd(
    name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")],
) -> None:
    """Bring an archived experiment back into the loaded definitions."""
    import getpass

    from hangar_dagster.experiment.catalog import remove_archived
    from hangar_dagster.results.records import NoteRecord

    settings = Settings.from_env()
    p = settings.paths
    eid = find_experiment(p, name_or_id).experiment_id
    if not remove_archived(p, eid):
        console.print(f"{eid} is not archived")
        return
    store_of(p).put(
        NoteRecord(experiment_id=eid, kind="archive", message=f"unarchived by {getpass.getuser()}")
    )
    notify_webserver(settings)
    console.print(f"unarchived {eid}: back in the loaded definitions")


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
