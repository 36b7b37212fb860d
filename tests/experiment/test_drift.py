"""Drift: a trial whose turn 1 did not run what its pin set pinned ends as infra_error / drift."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.drift import (
    check_drift,
    environment_observed,
    environment_pins,
    harness_fingerprint,
    turn1_harness_digest,
)
from hangar_dagster.experiment.harness import freeze, load_lock, tree_digest
from hangar_dagster.experiment.pins import lock_pin_content, pin_set_id
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.retries import plan_retries
from hangar_dagster.results.records import TrialRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.trials import trial as trial_module
from hangar_dagster.trials.sandbox import Sandbox
from hangar_dagster.trials.sandbox.bwrap import BwrapSandbox
from hangar_dagster.trials.trial import TrialRequest, run_trial
from tests.conftest import command_agent_spec, write_spec

pytestmark = pytest.mark.unit
needs_bwrap = pytest.mark.needs_sandbox("bwrap")

EDIT = "echo '# touched' >> stats.py"


def _turn(fingerprint: dict[str, Any]) -> str:
    event = json.dumps({"type": "turn", "fingerprint": fingerprint})
    return f"printf '%s\\n' '{event}' >> \"$HANGAR_TRACE_OUT\""


def one_trial(example_dir: Path, tmp_path: Path, name: str, command: str) -> TrialRecord:
    """Submit a one-trial spec under a command harness and run its trial in process."""
    spec = command_agent_spec(example_dir, tmp_path, name, command)
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    (key,) = exp.trial_keys()
    record, _patch = run_trial(TrialRequest(exp, key, 1, None, "run-drift"), Settings.from_env())
    return record


def test_the_pinned_fingerprint_comes_from_the_lock(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "skills" / "care").mkdir(parents=True)
    (src / "skills" / "care" / "SKILL.md").write_text("Read the tests first.\n")
    (src / "plugins" / "lint").mkdir(parents=True)
    (src / "plugins" / "lint" / "plugin.json").write_text('{"name": "lint"}\n')
    (src / "notes.md").write_text("Keep the diff small.\n")
    manifest = {
        "name": "fixer",
        "agent": {"adapter": "command", "cli": "fixer", "version": "1.2.3", "tools": ["b", "a"]},
        "model": "fixer-model-2025-01-01",
        "instructions": "notes.md",
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    lock = freeze(src, tmp_path / "registry")
    assert harness_fingerprint(lock, "fixer-model-2025-01-01") == {
        "adapter": "command",
        "harness": lock.ref,
        "cli": "fixer",
        "cli_version": "1.2.3",
        "model": "fixer-model-2025-01-01",
        "tools": ["a", "b"],
        "instructions_digest": hashlib.sha256(b"Keep the diff small.\n").hexdigest(),
        "skills_digest": tree_digest(src / "skills"),
        "plugins_digest": tree_digest(src / "plugins"),
    }
    # A changed plugin is another lock, and a trial that saw it drifted on its plugins.
    (src / "plugins" / "lint" / "plugin.json").write_text('{"name": "lint", "hooks": "all"}\n')
    changed = freeze(src, tmp_path / "registry")
    seen = harness_fingerprint(changed, "fixer-model-2025-01-01")
    drift = check_drift(harness_fingerprint(lock, "fixer-model-2025-01-01"), seen, {}, {})
    assert set(drift.harness) == {"harness", "plugins_digest"}
    assert drift.harness["plugins_digest"][1] == tree_digest(src / "plugins")


def test_check_names_each_moved_field_per_half() -> None:
    pinned = {"cli": "claude", "cli_version": "2.0.5", "model": "m-2025-01-01", "tools": ["a", "b"]}
    seen = {
        "cli": "claude (labelled)",  # a label is not a different CLI
        "cli_version": "2.0.6",
        "model": "m-2025-01-01",
        "tools": ["b", "a"],  # order is not drift
    }
    env = environment_pins(Environment())
    observed = environment_observed(
        {"backend": "bwrap", "isolation": "none"},
        egress="allowlist",  # the default policy, as pinned
        timeout_s=600,
        memory_mb=4096,
        build=[],
    )
    drift = check_drift(pinned, seen, env, observed)
    assert drift.harness == {"cli_version": ("2.0.5", "2.0.6")}
    assert drift.environment == {"isolation": ("namespaces", "none")}
    assert drift.summary() == (
        "harness: cli_version '2.0.5' -> '2.0.6'; environment: isolation 'namespaces' -> 'none'"
    )
    assert "environment.image" in drift.unreported  # the local sandbox reports no image
    assert not check_drift(pinned, {}, env, {})  # nothing reported: nothing compared
    assert turn1_harness_digest(seen) == turn1_harness_digest(seen | {"tools": ["a", "b"]})
    assert turn1_harness_digest(seen) != turn1_harness_digest(seen | {"model": "other"})


def test_the_pin_set_records_both_halves(example_dir: Path, hangar_home: Path) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    variant = exp.variants["skill"]
    lock_dir = Path(variant.harness_path)
    assert (lock_dir / "skills").is_dir()
    lock = load_lock(lock_dir.parent, variant.harness_lock)
    content = lock_pin_content(
        lock,
        variant.environment,
        model=variant.model,
        model_concrete_basis=variant.model_concrete_basis,
        task_bases={t: exp.tasks[t].base_sha for t in variant.tasks},
        grader_digest=exp.grader_digest,
        aliases=frozenset(),
    )
    # Submit pinned exactly these halves: the pin set id covers them.
    assert pin_set_id(content) == variant.pin_set
    assert content["harness_fingerprint"]["skills_digest"] == tree_digest(lock_dir / "skills")
    assert content["environment"]["resources.timeout_s"] == 60
    without = content | {"harness_fingerprint": {}}
    assert pin_set_id(without) != variant.pin_set


@needs_bwrap
@pytest.mark.parametrize(
    "reported,summary",
    [
        ({"cli_version": "9.9.9"}, "harness: cli_version '1' -> '9.9.9'"),
        (
            {"model": "scripted-2026-06-01"},
            "harness: model 'scripted-2026-01-01' -> 'scripted-2026-06-01'",
        ),
    ],
)
def test_a_cli_reporting_another_version_or_model_drifts(
    example_dir: Path,
    tmp_path: Path,
    hangar_home: Path,
    reported: dict[str, str],
    summary: str,
) -> None:
    name = f"drift-{next(iter(reported))}".replace("_", "-")
    record = one_trial(example_dir, tmp_path, name, f"{EDIT} && {_turn(reported)}")
    assert (record.outcome_class, record.infra_reason) == ("infra_error", "drift"), record.error
    assert record.drift == summary
    assert record.error is not None and summary in record.error
    assert record.verify_passed is None  # a drifted run is not measured
    assert record.changed_files == ["stats.py"]  # its patch is kept for the audit
    field = next(iter(reported))
    pinned = record.manifest["harness_fingerprint"][field]
    assert record.trace["drift"]["harness"] == {field: {"pinned": pinned, "seen": reported[field]}}
    assert record.trace["drift"]["environment"] == {}
    assert record.trace["turn1_harness_digest"] == turn1_harness_digest(record.trace["fingerprint"])
    # Never retried: running it again would not run what was pinned either.
    Store(paths()).put(record)
    plan = plan_retries(
        Store(paths()).trials(record.experiment_id, all_attempts=True),
        1,
        Settings.from_env().infra_retries,
    )
    assert plan.retries == [] and plan.notes == [f"drift is never retried: {record.trial_key}"]


@needs_bwrap
@pytest.mark.parametrize(
    "described,summary",
    [
        ({"isolation": "none"}, "environment: isolation 'namespaces' -> 'none'"),
        ({"backend": "unshare"}, "environment: sandbox 'bwrap' -> 'unshare'"),
    ],
)
def test_a_sandbox_other_than_pinned_is_environment_drift(
    example_dir: Path,
    tmp_path: Path,
    hangar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    described: dict[str, str],
    summary: str,
) -> None:
    class Reports(BwrapSandbox):
        """A real bwrap sandbox that describes itself otherwise (another backend or isolation)."""

        def describe(self) -> dict[str, str]:
            return super().describe() | described

    def sandbox(_name: str, **_options: object) -> Sandbox:  # image, labels: Docker's
        return Reports()

    monkeypatch.setattr(trial_module, "get_sandbox", sandbox)
    name = f"envdrift-{next(iter(described))}"
    record = one_trial(example_dir, tmp_path, name, EDIT)
    assert (record.outcome_class, record.infra_reason) == ("infra_error", "drift"), record.error
    assert record.drift == summary
    assert record.trace["drift"]["harness"] == {}


@needs_bwrap
def test_no_drift_on_the_normal_path(example_dir: Path, tmp_path: Path, hangar_home: Path) -> None:
    # The command harness, reporting exactly what was launched ...
    record = one_trial(
        example_dir, tmp_path, "nodrift", f"{EDIT} && {_turn({'cli': 'sh', 'cli_version': '1'})}"
    )
    assert record.outcome_class == "completed", record.error
    assert record.drift is None and record.trace["drift"]["harness"] == {}
    assert record.trace["turn1_harness_digest"].startswith("sha256:")
    # ... and the example's scripted stand-in (which labels its CLI as a stand-in).
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    key = next(k for k in exp.trial_keys() if k.variant == "skill")
    standin, _ = run_trial(TrialRequest(exp, key, 1, None, "run-drift"), Settings.from_env())
    assert standin.infra_reason is None and standin.drift is None, standin.error
    compared = standin.trace["drift"]
    assert compared["harness"] == {} and compared["environment"] == {}
    assert "harness.cli_version" not in compared["unreported"]  # it was compared, and matched
