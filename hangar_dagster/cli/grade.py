"""``hangar grade``: one patch, or the bare base, graded by hand with the real grader."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from hangar_dagster.cli.common import console, err
from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.settings import Settings


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
    from hangar_dagster.environment.build import BuildFailed
    from hangar_dagster.grading.by_hand import PatchFileError, grade_by_hand, read_patch_file

    if (patch is None) == (not base):
        err.print("[red]refused:[/] give exactly one of --patch FILE.diff or --base")
        raise typer.Exit(2)
    try:
        text = "" if patch is None else read_patch_file(patch)
        result = grade_by_hand(spec, task, text, Settings.from_env())
    except (SpecError, PatchFileError) as e:
        err.print(f"[red]refused:[/] {e}")
        raise typer.Exit(2) from None
    except KeyError as e:
        err.print(f"[red]refused:[/] {e.args[0]}")
        raise typer.Exit(2) from None
    except BuildFailed as e:
        err.print("[red]environment build failed:[/]")
        err.print(f"{e}\n{e.tail}", markup=False, highlight=False)
        raise typer.Exit(1) from None
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
