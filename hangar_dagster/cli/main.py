"""``hangar``: submit, run, read and export experiments; open the UI.

One module per command group (experiment, eval, grade, ui, harness, models, image, shadow). Heavy imports
(dagster, duckdb, pandas) happen inside the commands that need them, so ``hangar --help`` and
a refused spec answer quickly.
"""

from __future__ import annotations

import typer

from hangar_dagster.cli import eval as cli_eval
from hangar_dagster.cli import experiment as cli_experiment
from hangar_dagster.cli import grade as cli_grade
from hangar_dagster.cli import harness as cli_harness
from hangar_dagster.cli import image as cli_image
from hangar_dagster.cli import models as cli_models
from hangar_dagster.cli import shadow as cli_shadow
from hangar_dagster.cli import ui as cli_ui

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Experiments on coding agents, on Dagster."
)
app.add_typer(cli_experiment.app, name="experiment")
app.add_typer(cli_harness.app, name="harness")
app.add_typer(cli_models.app, name="models")
app.add_typer(cli_eval.app, name="eval")
app.add_typer(cli_image.app, name="image")
app.add_typer(cli_shadow.app, name="shadow")
app.command("grade")(cli_grade.grade_cmd)
app.command("ui")(cli_ui.ui_cmd)


def main() -> None:
    app()
