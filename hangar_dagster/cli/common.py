"""What the command groups share: the consoles, finding an experiment, the summary table."""

from __future__ import annotations

import shutil
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from hangar_dagster.settings import HangarPaths

# Piped output (logs, CI) gets room for the summary table instead of rich's 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=140)
err = Console(stderr=True)

STANDIN_NOTE = "stand-in: the scripted stand-in agent (no model) produced these trials"


def store_of(p: HangarPaths) -> Any:
    from hangar_dagster.results.store import Store

    return Store(p)


def find_experiment(p: HangarPaths, name_or_id: str) -> Any:
    record = store_of(p).find_experiment(name_or_id)
    if record is None:
        err.print(
            f"[red]no experiment {name_or_id!r} under {p.home}[/] (`hangar experiment run SPEC` submits one)"
        )
        raise typer.Exit(2)
    return record


def summary_table(
    summary: list[dict[str, Any]], title: str, intervals: dict[str, str] | None = None
) -> Table:
    """The variant_summary rows; ``intervals`` (variant -> the report's 95% CI and n) adds the
    interval beside each pass rate, so no bare number is shown as a finding."""
    table = Table(
        title=title, caption="execution failures are retried and left out; see docs/queue.md"
    )
    columns = (
        "variant",
        "trials",
        "passed",
        "pass rate (pts)",
        *(("95% CI (pts; tasks, trials)",) if intervals is not None else ()),
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
            *((intervals.get(row["variant"], "-"),) if intervals is not None else ()),
            str(row["admissible"]),
            str(row["execution_failures"]),
            str(row["evidence_failures"]),
        )
    return table


def hangar_command() -> str:
    """The CLI as it can be typed here: the venv's bin is often not on PATH."""
    return "hangar" if shutil.which("hangar") else sys.argv[0]


def where_next(p: HangarPaths, experiment_id: str) -> None:
    hangar = hangar_command()
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
