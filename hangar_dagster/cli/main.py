"""``hangar``: submit, run, read and export experiments; open the UI.

Heavy imports (dagster, duckdb, pandas) happen inside the commands that need
them, so ``hangar --help`` and a refused spec answer quickly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hangar_dagster.cli import harness as cli_harness
from hangar_dagster.cli import models as cli_models
from hangar_dagster.experiment.spec import SpecError, json_schema
from hangar_dagster.settings import HangarPaths, ensure_dagster_home, paths

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Experiments on coding agents, on Dagster."
)
experiment = typer.Typer(no_args_is_help=True, help="Submit, run, read and export experiments.")
app.add_typer(experiment, name="experiment")
app.add_typer(cli_harness.app, name="harness")
app.add_typer(cli_models.app, name="models")
# Piped output (logs, CI) gets room for the summary table instead of rich's 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=140)
err = Console(stderr=True)

WORKSPACE_YAML = """load_from:
  - python_module:
      module_name: hangar_dagster.orchestration.definitions
      attribute: defs
      location_name: hangar
"""
WEBSERVER_URL_FILE = "webserver.url"
STANDIN_NOTE = "stand-in: the scripted stand-in agent (no model) produced these trials"


def _store(p: HangarPaths) -> Any:
    from hangar_dagster.results.store import Store

    return Store(p)


def _find(p: HangarPaths, name_or_id: str) -> Any:
    record = _store(p).find_experiment(name_or_id)
    if record is None:
        err.print(
            f"[red]no experiment {name_or_id!r} under {p.home}[/] (`hangar experiment run SPEC` submits one)"
        )
        raise typer.Exit(2)
    return record


def _summary_table(summary: list[dict[str, Any]], title: str) -> Table:
    table = Table(
        title=title, caption="execution failures are retried and left out; see docs/queue.md"
    )
    columns = (
        "variant",
        "trials",
        "passed",
        "pass rate (pts)",
        "admissible",
        "execution failures",
        "evidence failures",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for row in summary:
        table.add_row(
            row["variant"],
            str(row["trials"]),
            str(row["passed"]),
            f"{row['pass_rate_pts']}",
            str(row["admissible"]),
            str(row["execution_failures"]),
            str(row["evidence_failures"]),
        )
    return table


def _where_next(p: HangarPaths, experiment_id: str) -> None:
    # Name the command as it can be typed here: the venv's bin is often not on PATH.
    hangar = "hangar" if shutil.which("hangar") else sys.argv[0]
    console.print("\nWhere to look next:")
    console.print(
        f"  UI (assets, partitions, lineage):  [bold]{hangar} ui[/]  (dagster dev -w workspace.yaml, same DAGSTER_HOME)"
    )
    console.print(
        f"  DuckDB (analysts):                 [bold]{p.duckdb}[/]  e.g. select * from variant_summary"
    )
    console.print(f"  Parquet:                           {p.parquet}")
    console.print(f"  Index:                             {hangar} experiment get {experiment_id}")
    console.print(
        f"  Export:                            {hangar} experiment export {experiment_id} -o out/{experiment_id}"
    )


@experiment.command("run")
def run_cmd(
    spec: Annotated[Path, typer.Argument(help="The experiment spec (YAML).")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Run the stages here and wait for the index.")
    ] = False,
) -> None:
    """Validate and submit SPEC; with --wait, run it to its index and print the summary."""
    from hangar_dagster.experiment.submit import submit

    p = paths()
    try:
        exp = submit(spec, p)
    except SpecError as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    console.print(
        f"submitted [bold]{exp.experiment_id}[/] ({len(exp.trial_keys())} trials, {len(exp.variants)} variants)"
    )
    ensure_dagster_home()  # the daemon and the UI need the instance even before a run
    _notify_webserver(p)
    if not wait:
        from hangar_dagster.orchestration.sensors import DAEMON_MARKER

        (p.experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
        console.print(
            "queued for the daemon: `hangar ui` (or dagster-daemon) runs it; `hangar experiment get` follows it"
        )
        return
    _drive(p, exp)


@experiment.command("resume")
def resume_cmd(name_or_id: Annotated[str, typer.Argument(help="Experiment id or name.")]) -> None:
    """Run an experiment's stages again: finished trials are kept, missing and infra-failed ones run."""
    import dagster as dg

    from hangar_dagster.experiment.submit import load_resolved
    from hangar_dagster.orchestration.sensors import describe_run, in_flight, stage_runs

    p = paths()
    exp = load_resolved(p, _find(p, name_or_id).experiment_id)
    ensure_dagster_home()
    with dg.DagsterInstance.get() as instance:
        busy = in_flight(stage_runs(instance, exp))
    if busy is not None:  # running beside it would run (and pay for) the same trials twice
        err.print(
            f"[red]refused:[/] {exp.experiment_id}: {escape(describe_run(busy))}; resume runs the "
            "same trials, so wait until it ends (`hangar experiment get` follows it), or terminate "
            "it in the Dagster UI if its worker is gone"
        )
        raise typer.Exit(2)
    _drive(p, exp)


def _drive(p: HangarPaths, exp: Any) -> None:
    import warnings

    import dagster as dg

    # Beta/preview notices about APIs we pin deliberately are noise to a CLI user.
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)

    from hangar_dagster.orchestration.driver import StageFailed, run_stages

    ensure_dagster_home()
    with dg.DagsterInstance.get() as instance:
        try:
            run_stages(exp, instance, _store(p), say=lambda m: console.print(f"[yellow]{m}[/]"))
        except StageFailed as e:
            err.print(f"[red]{e}[/]")
            raise typer.Exit(1) from None
    store = _store(p)
    console.print(
        _summary_table(store.summary(exp.experiment_id), f"{exp.name} ({exp.experiment_id})")
    )
    if any(v.adapter == "standin" for v in exp.variants.values()):
        console.print(f"[yellow]{STANDIN_NOTE}[/]")
    _where_next(p, exp.experiment_id)


@experiment.command("get")
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
    record = _find(p, name_or_id)
    store = _store(p)
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
    console.print(_summary_table(out["summary"], "summary"))
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
    from hangar_dagster.queue.window import window_from_env

    work = pending(exp, store)
    why = waiting_reason(exp, store, window_from_env(), dt.datetime.now(dt.UTC)) if work else None
    return {"pending_trials": len(work.keys), "reason": why, "notes": work.notes}


@experiment.command("export")
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
    record = _find(p, name_or_id)
    target = export_experiment(
        _store(p), record.experiment_id, out, load_resolved(p, record.experiment_id).canary
    )
    console.print(f"exported {record.experiment_id} to {target}")


@experiment.command("freeze-variants")
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
    record = _find(p, name_or_id)
    try:
        refs = freeze_variants(load_resolved(p, record.experiment_id), _store(p), out, locked)
    except FreezeError as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    for variant, ref in refs.items():
        console.print(f"  {variant}: {ref}")
    console.print(
        f"wrote {locked} (harness_repo {out}); run it with `hangar experiment run {locked}`"
    )


@experiment.command("schema")
def schema_cmd(
    out: Annotated[Path | None, typer.Option("-o", help="Write here instead of stdout.")] = None,
) -> None:
    """Print the experiment spec's JSON schema (experiment.schema.json is generated by this)."""
    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)


eval_cli = typer.Typer(no_args_is_help=True, help="The eval budget.")
app.add_typer(eval_cli, name="eval")


@eval_cli.command("budget")
def budget_cmd(
    month: Annotated[
        str | None, typer.Option("--month", help="YYYY-MM, a UTC month (default: this one).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the month as JSON.")] = False,
) -> None:
    """The month's eval spend per author and per experiment, against the monthly caps."""
    from hangar_dagster.queue.budget import BudgetConfigError, check_month, month_of, month_report
    from hangar_dagster.results.records import utcnow

    try:
        chosen = check_month(month) if month else month_of(utcnow())
    except ValueError as e:
        err.print(f"[red]--month: {e}[/]")
        raise typer.Exit(2) from None
    try:
        report = month_report(_store(paths()), chosen)
    except BudgetConfigError as e:
        err.print(f"[red]{e}[/]")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
        return
    team = report.team
    state = " [red](spent: no new trial starts)[/]" if team.exhausted else ""
    console.print(f"[bold]eval budget {report.month}[/] (UTC month)")
    console.print(f"team: {team.numbers()} USD{state}")
    authors = Table(title="per author")
    for col in ("author", "spent", "cap", "left"):
        authors.add_column(col, justify="left" if col == "author" else "right")
    for name, s in report.authors.items():
        authors.add_row(name, f"{s.spent_usd:.2f}", f"{s.cap_usd:.2f}", f"{s.left_usd:.2f}")
    experiments = Table(title="per experiment (projected: its own cap; -: none)")
    for col in ("experiment", "author", "attempts", "spent", "projected", "left"):
        experiments.add_column(col, justify="left" if col in ("experiment", "author") else "right")
    for x in report.experiments:
        experiments.add_row(
            x.experiment_id,
            x.author,
            str(x.attempts),
            f"{x.spent_usd:.2f}",
            f"{x.projected_usd:.2f}" if x.left_usd is not None else "-",
            f"{x.left_usd:.2f}" if x.left_usd is not None else "-",
        )
    console.print(authors)
    console.print(experiments)


@app.command("grade")
def grade_cmd(
    spec: Annotated[Path, typer.Option("--spec", help="The experiment spec (YAML).")],
    task: Annotated[str, typer.Option("--task", help="The task id to grade against.")],
    patch: Annotated[
        Path | None, typer.Option("--patch", help="The patch to grade (git diff).")
    ] = None,
    base: Annotated[bool, typer.Option("--base", help="Grade the unpatched base.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the grade as JSON.")] = False,
) -> None:
    """Grade one patch (or, with --base, the bare base) against one task with the real grader."""
    from hangar_dagster.grading.by_hand import PatchFileError, grade_by_hand, read_patch_file

    if (patch is None) == (not base):
        err.print("[red]refused:[/] give exactly one of --patch FILE.diff or --base")
        raise typer.Exit(2)
    try:
        text = "" if patch is None else read_patch_file(patch)
        result = grade_by_hand(spec, task, text, paths())
    except (SpecError, PatchFileError) as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    except KeyError as e:
        err.print(f"[red]refused:[/] {e.args[0]}")
        raise typer.Exit(2) from None
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    else:
        console.print(result["output"], markup=False, highlight=False)
        verdict = "[green]pass[/]" if result["passed"] else "[red]fail[/]"
        console.print(
            f"{verdict} {result['task']} ({result['graded']}): tests {result['hidden_tests']} "
            f"trust {result['trust']} reason {result['reason']} "
            f"signals {result['tamper_signals']}"
        )
    raise typer.Exit(0 if result["passed"] else 1)


@app.command("ui")
def ui_cmd(port: Annotated[int, typer.Option(help="Webserver port.")] = 3000) -> None:
    """Start the Dagster UI and daemon on the same instance the CLI uses."""
    p = paths()
    os.environ["HANGAR_HOME"] = str(p.home)
    command = dagster_dev_command()
    # Tells `hangar experiment run` in other shells where to ask for a reload.
    url_file = p.home / WEBSERVER_URL_FILE
    url_file.write_text(f"http://127.0.0.1:{port}\n")
    # A shell may start us with SIGINT ignored, which children would inherit; dagster dev needs it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Its own process group, so that stopping hangar stops the webserver, daemon and code servers.
    child = subprocess.Popen([*command, "-h", "127.0.0.1", "-p", str(port)], start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: _interrupt(child.pid))
    try:
        code = child.wait()
    except KeyboardInterrupt:
        _interrupt(child.pid)
        code = child.wait()
    finally:
        url_file.unlink(missing_ok=True)
    raise typer.Exit(code)


def _interrupt(pgid: int) -> None:
    """What Ctrl-C does: SIGINT to the whole group (dagster dev waits for its children)."""
    try:
        os.killpg(pgid, signal.SIGINT)
    except ProcessLookupError:
        pass


def dagster_dev_command() -> list[str]:
    """``dagster dev`` on hangar's workspace (location ``hangar``), wherever the CLI was started."""
    home = ensure_dagster_home()
    workspace = home / "workspace.yaml"
    workspace.write_text(WORKSPACE_YAML)
    dagster = shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))
    return [dagster, "dev", "-w", str(workspace)]


def _notify_webserver(p: HangarPaths) -> None:
    """Ask a running webserver to reload its code location, so a new experiment shows at once.

    The webserver is HANGAR_WEBSERVER_URL, else the one `hangar ui` started on this HANGAR_HOME.
    """
    url = os.environ.get("HANGAR_WEBSERVER_URL")
    url_file = p.home / WEBSERVER_URL_FILE
    if not url and url_file.is_file():
        url = url_file.read_text().strip()
    if not url:
        return
    import urllib.request

    query = 'mutation { reloadRepositoryLocation(repositoryLocationName: "hangar") { __typename } }'
    req = urllib.request.Request(
        url.rstrip("/") + "/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    # A webserver that `hangar ui` is still starting refuses connections for a few seconds.
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(req, timeout=30).read()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                err.print(
                    f"[yellow]could not reach the webserver at {url} to reload it ({e}); use Reload in the UI[/]"
                )
                return
            time.sleep(2)


def main() -> None:
    app()
