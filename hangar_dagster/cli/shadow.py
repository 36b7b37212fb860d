"""``hangar shadow``: register, list and remove shadow policies; what became of their merges.

A policy names a repository's mainline and a candidate harness lock; the ``shadow_merges``
sensor (running under ``hangar ui`` or dagster-daemon) submits each night's sampled merges as
a shadow experiment (docs/architecture.md, "Shadows").
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from hangar_dagster.cli.common import console, err, store_of
from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.settings import Settings

app = typer.Typer(
    no_args_is_help=True, help="Shadows: a candidate harness run on a repository's real merges."
)

AsJson = Annotated[bool, typer.Option("--json", help="Print it as JSON.")]


def _known(settings: Settings, name: str) -> None:
    from hangar_dagster.shadow.policy import registered

    if name not in registered(settings.paths):
        err.print(
            f"[red]no shadow {name!r} under {settings.paths.home}[/] "
            "(`hangar shadow register POLICY.yaml` registers one; `hangar shadow list` lists them)"
        )
        raise typer.Exit(2)


@app.command("register")
def register_cmd(
    policy: Annotated[Path, typer.Argument(help="The shadow policy (YAML).")],
) -> None:
    """Check POLICY and register it: merges on its mainline from now on are shadowed."""
    from hangar_dagster.shadow.policy import load_policy, register

    settings = Settings.from_env()
    try:
        checked = load_policy(policy)
        state = register(checked, settings, dt.datetime.now(dt.UTC))
    except SpecError as e:
        err.print(f"[red]refused:[/] {escape(str(e))}")
        raise typer.Exit(2) from None
    console.print(
        f"registered shadow [bold]{checked.name}[/]: {escape(checked.repo)} {checked.mainline} "
        f"from {state.cursor[:12]}, candidate {checked.harness_lock}, sample "
        f"{checked.sample_rate:g}, at most {checked.max_per_night} a night; the shadow_merges "
        "sensor (`hangar ui`) picks merges up"
    )


@app.command("list")
def list_cmd(as_json: AsJson = False) -> None:
    """The registered shadows with their cursor and counts."""
    from hangar_dagster.shadow.policy import read_policy, read_state, registered

    p = Settings.from_env().paths
    out = []
    for name in registered(p):
        policy, state = read_policy(p, name), read_state(p, name)
        out.append(
            {
                "name": name,
                "repo": policy.repo,
                "mainline": policy.mainline,
                "harness_lock": policy.harness_lock,
                "sample_rate": policy.sample_rate,
                "max_per_night": policy.max_per_night,
                "cursor": state.cursor,
                "merges_seen": len(state.merges),
                "merges_kept": sum(d.kept for d in state.merges),
            }
        )
    if as_json:
        print(json.dumps(out, indent=2))
        return
    table = Table(title="shadows")
    for col in ("name", "repo", "mainline", "candidate", "sample", "per night", "cursor", "kept"):
        table.add_column(col)
    for s in out:
        table.add_row(
            str(s["name"]),
            escape(str(s["repo"])),
            str(s["mainline"]),
            str(s["harness_lock"]).split("@")[0],
            f"{s['sample_rate']:g}",
            str(s["max_per_night"]),
            str(s["cursor"])[:12],
            f"{s['merges_kept']}/{s['merges_seen']}",
        )
    console.print(table)


@app.command("remove")
def remove_cmd(name: Annotated[str, typer.Argument(help="The shadow's name.")]) -> None:
    """Unregister NAME: no merge is shadowed any more; its experiments and rows stay."""
    from hangar_dagster.shadow.policy import remove

    settings = Settings.from_env()
    _known(settings, name)
    remove(settings.paths, name)
    console.print(
        f"removed shadow [bold]{name}[/]; its experiments stay (`hangar experiment list`)"
    )


@app.command("status")
def status_cmd(
    name: Annotated[str, typer.Argument(help="The shadow's name.")], as_json: AsJson = False
) -> None:
    """Every merge NAME looked at: dropped (and why), queued, passed or failed; and the
    candidate's pass rate over the merges whose trial counted, with its 95% interval."""
    from hangar_dagster.shadow.policy import read_policy, read_state
    from hangar_dagster.shadow.status import merge_rows, shadow_rate

    settings = Settings.from_env()
    _known(settings, name)
    p = settings.paths
    policy, state = read_policy(p, name), read_state(p, name)
    rows = merge_rows(state, store_of(p))
    rate = shadow_rate(rows)
    if as_json:
        out = {
            "name": name,
            "cursor": state.cursor,
            "resets": [r.model_dump(mode="json") for r in state.resets],
            "merges": [r.as_dict() for r in rows],
            "pass_rate": None
            if rate is None
            else {
                "pts": rate.pts,
                "low_pts": rate.low_pts,
                "high_pts": rate.high_pts,
                "merges": rate.n_tasks,
                "method": rate.method,
            },
        }
        print(json.dumps(out, indent=2))
        return
    console.print(
        f"[bold]shadow {name}[/]: {escape(policy.repo)} {policy.mainline}, candidate "
        f"{policy.harness_lock}, cursor {state.cursor[:12]}"
    )
    for reset in state.resets:
        console.print(
            f"cursor reset at {reset.at:%Y-%m-%d %H:%M} UTC: {reset.lost[:12]} was gone from "
            f"the repository (force-pushed?); moved to {reset.to[:12]}, the merges between "
            "not looked at"
        )
    table = Table(title="merges (mainline order)")
    for col in ("merge", "night", "state", "reason", "subject", "trial"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.sha[:12],
            r.night,
            r.state,
            escape(r.reason or "-") + (f": {escape(r.detail)}" if r.detail else ""),
            escape(r.subject[:60]),
            f"{r.experiment_id} {r.trial_key}" if r.trial_key else "-",
        )
    console.print(table)
    if rate is None:
        console.print("pass rate: no shadow trial has counted yet")
    else:
        console.print(f"candidate pass rate over the sampled merges: {rate.label}")
