"""Builders of valid records for the store, export and doc tests; override fields by keyword."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.queue.window import EvalWindow
from hangar_dagster.results.records import (
    BaseCheckRecord,
    ExperimentPinRecord,
    ExperimentRecord,
    GradeRecord,
    GradeTestRecord,
    NoteRecord,
    PinSetRecord,
    TrialRecord,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings, paths

T0 = dt.datetime(2025, 3, 4, 1, 2, 3, tzinfo=dt.UTC)
EXP = "exp-0001"


def make_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Store:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "hangar"))
    return Store(paths(), **kw)


def experiment(**kw: Any) -> ExperimentRecord:
    fields: dict[str, Any] = dict(
        experiment_id=EXP,
        name="skill-vs-none",
        author="ana",
        submitted_at=T0,
        spec_path="spec.yaml",
        spec_digest="sha256:" + "a" * 64,
        spec_json='{"name": "x"}',
        variants=["base", "skill"],
        tasks=["t1", "t2"],
        trials_per_task=1,
        trials_planned=4,
        parallel=2,
    )
    return ExperimentRecord(**(fields | kw))


def pin_set(**kw: Any) -> PinSetRecord:
    fields: dict[str, Any] = dict(
        pin_set="pin-" + "1" * 16,
        harness_lock="claude@sha256:" + "b" * 64,
        harness_digest="sha256:" + "b" * 64,
        environment_digest="sha256:" + "c" * 64,
        model="claude-sonnet-4-20250514",
        model_concrete=True,
        task_bases={"t1": "d" * 40},
        grader_digest="sha256:" + "e" * 64,
        egress="none",
        created_at=T0,
    )
    return PinSetRecord(**(fields | kw))


def experiment_pin(
    variant: str = "base", pin: str = "pin-" + "1" * 16, **kw: Any
) -> ExperimentPinRecord:
    return ExperimentPinRecord(
        **(dict(experiment_id=EXP, variant=variant, pin_set=pin, run_id="run-pins") | kw)
    )


def base_check(task: str = "t1", **kw: Any) -> BaseCheckRecord:
    fields: dict[str, Any] = dict(
        experiment_id=EXP,
        task=task,
        base_sha="d" * 40,
        grader_digest="sha256:" + "e" * 64,
        base_passed=False,
        base_counts={"total": 3, "passed": 0, "failed": 3},
        reference_given=True,
        reference_passed=True,
        reference_counts={"total": 3, "passed": 3},
        invalid=False,
        reason=None,
        checked_at=T0,
        run_id="run-base",
    )
    return BaseCheckRecord(**(fields | kw))


def trial(
    variant: str = "base", task: str = "t1", replicate: int = 1, attempt: int = 1, **kw: Any
) -> TrialRecord:
    fields: dict[str, Any] = dict(
        experiment_id=EXP,
        trial_key=f"{variant}/{task}/{replicate}",
        variant=variant,
        task=task,
        replicate=replicate,
        attempt=attempt,
        retry_of=None,
        run_id=f"run-{variant}-{task}-{replicate}-{attempt}",
        pin_set="pin-" + "1" * 16,
        harness_digest="sha256:" + "b" * 64,
        environment_digest="sha256:" + "c" * 64,
        model="claude-sonnet-4-20250514",
        agent="scripted",
        agent_is_standin=True,
        base_sha="d" * 40,
        started_at=T0,
        finished_at=T0 + dt.timedelta(seconds=90),
        duration_s=90.0,
        outcome_class="completed",
        infra_reason=None,
        agent_exit_code=0,
        verify_passed=True,
        verify_exit_code=0,
        patch_sha256="f" * 64,
        patch_bytes=120,
        changed_files=["src/app.py"],
        turns=4,
        tokens_in=1000,
        tokens_out=200,
        cost_usd=0.25,
        error=None,
        manifest={"harness_lock": "claude@sha256:" + "b" * 64},
        trace={"events": [{"type": "tool_call", "name": "bash", "input": "pytest -q"}]},
        artifacts_dir="/tmp/none",
    )
    return TrialRecord(**(fields | kw))


def attempt_of(experiment_id: str, key: str, n: int, **kw: Any) -> TrialRecord:
    """Attempt ``n`` of trial key ``variant/task/replicate`` in ``experiment_id``."""
    variant, task, rep = key.split("/")
    return trial(variant, task, int(rep), n, experiment_id=experiment_id, **kw)


def grade(
    variant: str = "base",
    task: str = "t1",
    replicate: int = 1,
    attempt: int = 1,
    passed: bool = True,
    **kw: Any,
) -> GradeRecord:
    total = 3
    fields: dict[str, Any] = dict(
        experiment_id=EXP,
        trial_key=f"{variant}/{task}/{replicate}",
        variant=variant,
        task=task,
        replicate=replicate,
        attempt=attempt,
        run_id=f"run-g-{variant}-{task}-{attempt}",
        graded_at=T0 + dt.timedelta(minutes=5),
        passed=passed,
        hidden_tests={
            "total": total,
            "passed": total if passed else 1,
            "failed": 0 if passed else total - 1,
            "errors": 0,
            "skipped": 0,
        },
        exit_code=0 if passed else 1,
        reason=None,
        trust="isolated",
        files_mode="hidden",
        network="none",
        runner="hangar-grade",
        tamper_signals=[],
        touched_tests=[],
        contamination=[],
        task_invalid=False,
        grader_digest="sha256:" + "e" * 64,
        duration_s=4.5,
    )
    return GradeRecord(**(fields | kw))


def graded(
    variant: str, task: str, attempt: int = 1, tests: int = 3, experiment_id: str = EXP
) -> GradeRecord:
    """``grade`` of the key with ``tests`` per-test rows (all passed, each failing on base)."""
    g = grade(variant, task, attempt=attempt, experiment_id=experiment_id)
    return g.with_tests(
        [
            GradeTestRecord(
                experiment_id=experiment_id,
                trial_key=g.trial_key,
                variant=variant,
                task=task,
                replicate=1,
                attempt=attempt,
                test_id=f"test_mod::test_{n}",
                outcome="passed",
                duration_s=0.1,
                message=None,
                on_base="fail_to_pass",
            )
            for n in range(tests)
        ]
    )


def note(message: str = "overlay variant 'base' is deprecated", **kw: Any) -> NoteRecord:
    return NoteRecord(**(dict(experiment_id=EXP, kind="deprecation", message=message) | kw))


def settings(window: EvalWindow | None = None, **env: str) -> Settings:
    """This process's settings (its HANGAR_HOME), with ``window`` and the variables in ``env``."""
    import dataclasses
    import os

    base = Settings.from_env({**os.environ, **env})
    if window is None:
        return base
    written = "always" if window.always else f"{window.start:%H:%M}-{window.end:%H:%M}"
    return dataclasses.replace(base, eval_window=written, eval_tz=window.tz.key)


class CutOff(BaseException):
    """A process stopping at a chosen write (a BaseException: no ``except Exception`` eats it)."""


def cut_off_before(
    monkeypatch: pytest.MonkeyPatch, home: HangarPaths, kind: type[Any]
) -> Callable[[], None]:
    """Make the home's store raise CutOff at its first ``put`` of a ``kind`` record, as a crash
    there would stop the process; returns what restores the store."""
    backend = type(Store(home))
    put = backend.put

    def stopped(self: Store, record: Any) -> None:
        if isinstance(record, kind):
            raise CutOff(f"stopped before storing a {kind.__name__}")
        put(self, record)

    monkeypatch.setattr(backend, "put", stopped)
    return lambda: monkeypatch.setattr(backend, "put", put)
