"""``hangar eval``: the month's eval spend against the budgets."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from hangar_dagster.cli.common import console, err, store_of
from hangar_dagster.settings import Settings

app = typer.Typer(no_args_is_help=True, help="The eval budget.")


@app.command("budget")
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
        settings = Settings.from_env()
        report = month_report(store_of(settings.paths), chosen, settings.caps)
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
