"""A stored experiment to report on: the bundled example submitted for real, with trials and
grades written to the store (the demo's outcomes unless told otherwise). Shared by the report,
CLI and index tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.stage import check_spec, pin_variants
from hangar_dagster.experiment.submit import submit
from hangar_dagster.results.records import GradeRecord, GradeTestRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests import factories as f

# The example's outcomes when it had 3 tasks x 3 trials (the cut tests/conftest.py's
# copy_example makes): plain 4 of 9, skill 7 of 9, an undecided difference.
DEMO: dict[str, dict[str, Sequence[bool]]] = {
    "plain": {
        "median": [True, True, False],
        "slugify": [True, False, False],
        "durations": [True, False, False],
    },
    "skill": {
        "median": [True, True, True],
        "slugify": [True, True, False],
        "durations": [True, True, False],
    },
}


def spec_file(example_dir: Path, name: str, edit: Mapping[str, Any] | None = None) -> Path:
    """The example's spec under another name, with top-level fields replaced (None: removed)."""
    spec = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec["name"] = name
    for key, value in (edit or {}).items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    path = example_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def tests_of(eid: str, key: str, attempt: int, task: str, passed: bool) -> list[GradeTestRecord]:
    variant, _, rep = key.split("/")
    out = []
    for i, ok in enumerate((True, passed)):
        out.append(
            GradeTestRecord(
                experiment_id=eid,
                trial_key=key,
                variant=variant,
                task=task,
                replicate=int(rep),
                attempt=attempt,
                test_id=f"test_{task}.py::test_{i}",
                outcome="passed" if ok else "failed",
                duration_s=0.01,
                message=None if ok else f"assert {task}() == expected",
                on_base="pass_to_pass" if i == 0 else "fail_to_pass",
            )
        )
    return out


def graded_record(
    eid: str, key: str, attempt: int, passed: bool, *, flagged: bool = False
) -> GradeRecord:
    """The grade ``stored`` writes for ``key``'s ``attempt``, with its per-test rows."""
    variant, task, rep = key.split("/")
    signals = ["tamper: conftest.py rewrites the report"] if flagged else []
    grade = f.grade(
        variant, task, int(rep), attempt, passed=passed, experiment_id=eid, tamper_signals=signals
    )
    return grade.with_tests(tests_of(eid, key, attempt, task, passed))


def stored(
    spec: Path,
    outcomes: Mapping[str, Mapping[str, Sequence[bool]]] = DEMO,
    *,
    flagged: Sequence[str] = (),
    infra_then_ok: Sequence[str] = (),
    infra_left: Sequence[str] = (),
    invalid: Mapping[str, str] | None = None,
    ungraded: Sequence[str] = (),
) -> tuple[ResolvedExperiment, Store]:
    """Submit ``spec`` and store a trial and a grade per outcome.

    ``flagged``: trial keys whose pass carries a tamper signal; ``infra_then_ok``: trial keys
    whose first attempt was an infra error (retried); ``infra_left``: trial keys whose only
    attempt is an infra error, with no grade; ``invalid``: task -> base check reason;
    ``ungraded``: trial keys stored without their grade (``graded_record`` makes it).
    """
    settings = Settings.from_env()
    exp = submit(spec, settings)
    store = Store(paths())
    eid = exp.experiment_id
    check_spec(exp, store, settings)  # the spec and pin_sets stages, as a run does them
    pin_variants(exp, store, "run-pins", list(exp.variants), aliases=settings.model_aliases)
    for variant, tasks in outcomes.items():
        pin = exp.variants[variant].pin_set
        for task, results in tasks.items():
            for rep, passed in enumerate(results, start=1):
                key = f"{variant}/{task}/{rep}"
                attempt = 1
                if key in infra_then_ok:
                    store.put(
                        f.trial(
                            variant,
                            task,
                            rep,
                            1,
                            experiment_id=eid,
                            pin_set=pin,
                            outcome_class="infra_error",
                            infra_reason="preempted",
                            error="the sandbox was preempted",
                            cost_usd=0.01,
                        )
                    )
                    attempt = 2
                if key in infra_left:
                    store.put(
                        f.trial(
                            variant,
                            task,
                            rep,
                            1,
                            experiment_id=eid,
                            pin_set=pin,
                            outcome_class="infra_error",
                            infra_reason="oom",
                            error="the sandbox ran out of memory",
                            cost_usd=0.01,
                        )
                    )
                    continue
                store.put(
                    f.trial(
                        variant,
                        task,
                        rep,
                        attempt,
                        experiment_id=eid,
                        pin_set=pin,
                        cost_usd=0.02,
                        tokens_in=100,
                        tokens_out=50,
                    )
                )
                if key not in ungraded:
                    store.put(graded_record(eid, key, attempt, passed, flagged=key in flagged))
    for task in exp.tasks:
        reason = (invalid or {}).get(task)
        store.put(f.base_check(task, experiment_id=eid, invalid=reason is not None, reason=reason))
    return exp, store
