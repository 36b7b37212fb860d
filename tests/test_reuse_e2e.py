"""Reuse end to end through Dagster (issue 15 item 1): the example runs, then a second
experiment adds one variant. The two old variants' trials are reused (no sandbox starts for
them, but one health trial each), the new variant runs, and the old variants' figures are the
first run's. The first experiment runs through the trials and grades stage bodies (what its
assets call; the Dagster path is tests/test_e2e.py's), the second through Dagster in this
process (``driver.drive``, as ``run --wait`` does), so the test sees every sandbox a trial
starts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.experiment.submit import submit
from hangar_dagster.grading.stage import run_grades
from hangar_dagster.orchestration.driver import drive
from hangar_dagster.results.report import build_report
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from hangar_dagster.trials import trial as trial_module
from hangar_dagster.trials.sandbox import Sandbox, SandboxRequest, SandboxResult
from hangar_dagster.trials.stage import run_trials
from tests.reusefixtures import add_variant_specs

pytestmark = pytest.mark.slow


def test_a_second_experiment_reuses_the_old_variants_and_runs_only_the_new_one(
    example_dir: Path, hangar_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    real = trial_module.get_sandbox

    def counting(*args: Any, **kwargs: Any) -> Sandbox:
        sandbox = real(*args, **kwargs)
        run = sandbox.run
        key = (kwargs.get("labels") or {})["hangar.trial"]

        def counted(request: SandboxRequest) -> SandboxResult:
            started.append(key)
            return run(request)

        sandbox.run = counted  # type: ignore[method-assign]
        return sandbox

    monkeypatch.setattr(trial_module, "get_sandbox", counting)
    first_spec, second_spec = add_variant_specs(example_dir, tmp_path, trials=1)
    settings = Settings.from_env()
    store = Store(settings.paths)

    a = submit(first_spec, settings)
    log = logging.getLogger("first")
    run_trials(a, store, settings, "run-first", a.trial_keys(), in_flight=lambda _: False, log=log)
    run_grades(a, store, settings.paths, "run-first", a.trial_keys(), settings)
    assert sorted(set(started)) == sorted(k.key for k in a.trial_keys())
    started.clear()

    b = submit(second_spec, settings)
    drive(b, store, settings, say=lambda _: None)
    eager = sorted(k.key for k in b.trial_keys() if k.variant == "eager")
    # the new variant's trials and one health trial per reused variant: nothing else started
    assert sorted(set(started)) == sorted([*eager, "plain/median/1", "skill/median/1"])
    rows = {t.trial_key: t for t in store.trials(b.experiment_id)}
    assert len(rows) == 9 and all(r.outcome_class != "infra_error" for r in rows.values())
    reused = sorted(k for k, t in rows.items() if t.reused_from)
    assert reused == [
        "plain/durations/1",
        "plain/slugify/1",
        "skill/durations/1",
        "skill/slugify/1",
    ]
    assert all(rows[k].reused_from["experiment_id"] == a.experiment_id for k in reused)  # type: ignore[index]

    # the old variants' figures are the first run's (the health trials run with the same seed)
    before = {r["variant"]: r for r in store.summary(a.experiment_id)}
    after = {r["variant"]: r for r in store.summary(b.experiment_id)}
    for v in ("plain", "skill"):
        for col in ("trials", "graded", "passed", "pass_rate_pts"):
            assert after[v][col] == before[v][col], (v, col)
    rates_a = {v.name: v.rate for v in build_report(a, store).variants}
    report_b = build_report(b, store)
    for v in report_b.variants:
        if v.name != "eager":
            assert v.rate == rates_a[v.name]
            assert v.health.reused_keys == tuple(k for k in reused if k.startswith(v.name))
            assert v.health.fresh_keys == (f"{v.name}/median/1",)
    # what the second experiment paid: the 5 trials that ran, not the 4 it reused
    assert store.experiment(b.experiment_id).trials_reused == 4  # type: ignore[union-attr]
