"""``hangar grade``: one patch (or the bare base) graded against one task of a spec, by hand.

For users who regrade a trial or debug a grader: the same ``run_grader`` the
pipeline uses, on a spec resolved as ``submit`` would (nothing is stored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hangar_dagster.environment.build import ensure_build
from hangar_dagster.experiment.spec import MAX_PATCH_BYTES, load_spec
from hangar_dagster.grading.grader import (
    check_environment,
    grade_trust,
    grader_runner,
    grading_root,
    run_grader,
    task_build,
)
from hangar_dagster.grading.signals import tamper_signals, touched_tests
from hangar_dagster.settings import Settings
from hangar_dagster.trials.canary import mask
from hangar_dagster.util.fs import InputFileError, read_text_bounded
from hangar_dagster.util.gitrepo import changed_files


class PatchFileError(ValueError):
    """The --patch file cannot be graded; the message names the file and the fix."""


def read_patch_file(path: Path) -> str:
    """The patch text, or PatchFileError for a missing, oversized, non-regular (a FIFO, /dev/zero),
    empty, binary or non-diff file."""
    try:
        text = read_text_bounded(path, MAX_PATCH_BYTES, "patch")
    except InputFileError as err:
        hint = "; write it with `git diff --binary`" if "UTF-8" in str(err) else ""
        raise PatchFileError(f"--patch {err}{hint}") from None
    if not text.strip():
        raise PatchFileError(f"--patch {path}: the file is empty; to grade the base, use --base")
    if not changed_files(text):
        raise PatchFileError(
            f"--patch {path}: no `diff --git` file header found; write it with `git diff`"
        )
    return text


def grade_by_hand(spec_path: Path, task_id: str, patch: str, settings: Settings) -> dict[str, Any]:
    """Grade ``patch`` ("" for the base) on ``task_id`` of the spec; a JSON-able grade summary."""
    from hangar_dagster.experiment.submit import resolve

    paths = settings.paths
    experiment = resolve(load_spec(spec_path), spec_path, settings)
    if task_id not in experiment.tasks:
        known = ", ".join(sorted(experiment.tasks))
        raise KeyError(f"--task {task_id!r}: not a task of {spec_path} (tasks: {known})")
    label = "base" if not patch else "by-hand"
    plan = task_build(experiment, task_id, check_environment(experiment, task_id))
    # A build that fails raises BuildFailed: the command says so, with the log's tail.
    built = ensure_build(plan, settings) if plan is not None else None
    run = run_grader(
        experiment, task_id, patch, label=f"{label}-{task_id}",
        work_root=grading_root(paths), env_extra={"HANGAR_TRIAL": f"{label}/{task_id}"},
        settings=settings,
        built=built,
    )  # fmt: skip
    grader = experiment.spec.grader
    result: dict[str, Any] = mask(
        {
            "task": task_id,
            "base_sha": experiment.tasks[task_id].base_sha,
            "graded": label,
            "passed": run.passed,
            "hidden_tests": run.counts,
            "exit_code": run.exit_code,
            "reason": run.reason,
            "trust": grade_trust(grader, run.uid_split),
            "runner": grader_runner(grader.command),
            "tamper_signals": [*tamper_signals(patch), *run.run_signals],
            "touched_tests": touched_tests(patch, run.base_paths),
            "canary_files": run.canary_files,
            "provenance": run.provenance,
            "duration_s": round(run.duration_s, 3),
            "output": run.output,
        },
        experiment.canary,
    )
    return result
