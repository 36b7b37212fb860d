"""Setting real CLIs up: each adapter says how to install its own CLI when it is missing."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from hangar_dagster.experiment.drift import check_drift, harness_fingerprint
from hangar_dagster.experiment.harness import HarnessError, HarnessLock, freeze, thaw, tree_digest
from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.retries import plan_retries
from hangar_dagster.settings import Settings
from hangar_dagster.trials.agents import get_agent, mini_swe
from hangar_dagster.trials.agents.install import BIN_DIR_VAR, place_lock_files, prompt
from hangar_dagster.trials.trial import TrialRequest, run_trial
from tests.conftest import write_spec
from tests.trials.agents.cli_locks import (
    INSTRUCTIONS,
    cli_context,
    freeze_cli_lock,
    median_spec,
)

pytestmark = pytest.mark.unit

MODEL = "gpt-5-2025-08-07"


def lock_for(tmp_path: Path, adapter: str, cli: str) -> HarnessLock:
    agent = {"adapter": adapter, "cli": cli, "version": "1.0.0"}
    return freeze_cli_lock(tmp_path, adapter, agent, MODEL)


@pytest.mark.parametrize(
    "adapter,cli,install",
    [
        ("claude-code", "claude", "npm install @anthropic-ai/claude-code@"),
        ("codex", "codex", "npm install @openai/codex@"),
        ("mini-swe-agent", "mini-swe-agent", "pip install mini-swe-agent=="),
    ],
)
def test_a_missing_cli_names_its_own_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adapter: str, cli: str, install: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv(BIN_DIR_VAR, str(tmp_path / "empty"))
    ctx = cli_context(tmp_path, lock_for(tmp_path, adapter, cli), tmp_path, MODEL)
    with pytest.raises(HarnessError, match=f"not installed here.*{BIN_DIR_VAR}") as err:
        get_agent(adapter).run(ctx)
    assert install in str(err.value)


def test_lock_files_are_placed_with_the_digests_of_what_was_placed(tmp_path: Path) -> None:
    lock = lock_for(tmp_path, "codex", "codex")
    ctx = cli_context(tmp_path, lock, tmp_path, MODEL, verify="make check")
    placed = tmp_path / "home" / ".codex"
    digests = place_lock_files(ctx, placed, "AGENTS.md")
    assert (placed / "AGENTS.md").read_text() == INSTRUCTIONS
    assert digests == {
        "instructions_digest": hashlib.sha256(INSTRUCTIONS.encode()).hexdigest(),
        "skills_digest": tree_digest(placed / "skills"),
        "plugins_digest": None,  # the lock holds no plugins/
    }
    assert digests["skills_digest"] == tree_digest(lock.skills_dir)
    assert not (placed / "plugins").exists()
    assert prompt(ctx) == "Make add() add.\n\nYou can check your work with: make check"


def lock_with_plugin(tmp_path: Path, script_mode: int) -> HarnessLock:
    """The codex test lock plus ``plugins/lint`` (a manifest and a script), frozen and thawed."""
    src = lock_for(tmp_path, "codex", "codex").path
    plugin = tmp_path / "plugin-src"
    shutil.copytree(src, plugin)
    (plugin / "plugins" / "lint" / "bin").mkdir(parents=True)
    (plugin / "plugins" / "lint" / "plugin.json").write_text('{"name": "lint"}\n')
    script = plugin / "plugins" / "lint" / "bin" / "lint.sh"
    script.write_text("#!/bin/sh\necho linted\n")
    script.chmod(script_mode)
    lock = freeze(plugin, tmp_path / "registry")
    return thaw(tmp_path / "registry", lock.ref, tmp_path / f"thawed-{script_mode:o}")


def test_plugins_are_placed_beside_skills_and_fingerprinted(tmp_path: Path) -> None:
    lock = lock_with_plugin(tmp_path, 0o755)
    ctx = cli_context(tmp_path, lock, tmp_path, MODEL)
    placed = tmp_path / "home" / ".codex"
    digests = place_lock_files(ctx, placed, "AGENTS.md")
    script = placed / "plugins" / "lint" / "bin" / "lint.sh"
    assert (placed / "plugins" / "lint" / "plugin.json").read_text() == '{"name": "lint"}\n'
    assert subprocess.run([str(script)], capture_output=True, text=True).stdout == "linted\n"
    assert digests["plugins_digest"] == tree_digest(placed / "plugins")
    # What was placed is what the pin set pins: no drift.
    pinned = harness_fingerprint(lock, MODEL)
    assert pinned["plugins_digest"] == digests["plugins_digest"]
    assert not check_drift(pinned, digests, {}, {})
    # The same plugin whose script is not executable is another lock, and drift.
    other = lock_with_plugin(tmp_path / "other", 0o644)
    assert other.ref != lock.ref
    seen = place_lock_files(cli_context(tmp_path, other, tmp_path, MODEL), tmp_path / "o", "A.md")
    drift = check_drift(pinned, seen, {}, {})
    assert set(drift.harness) == {"plugins_digest"}
    assert drift.harness["plugins_digest"] == (pinned["plugins_digest"], seen["plugins_digest"])


def test_mini_swe_reports_the_plugins_it_can_see(tmp_path: Path) -> None:
    lock = lock_with_plugin(tmp_path, 0o755)
    ctx = cli_context(tmp_path, lock, tmp_path, MODEL)
    seen = mini_swe.fingerprint(ctx, mini_swe.Trajectory(), None)
    assert seen["plugins_digest"] == harness_fingerprint(lock, MODEL)["plugins_digest"]
    assert seen["plugins_digest"] == tree_digest(lock.plugins_dir)


@pytest.mark.integration
@pytest.mark.needs_sandbox("bwrap")
def test_a_missing_cli_is_refused_at_submit_and_a_trial_meeting_it_is_not_retried(
    example_dir: Path, tmp_path: Path, hangar_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The setup error of a CLI that is not installed ended infra_error / harness and was
    # retried as if it were infrastructure, in every trial of the experiment.
    lock = lock_for(tmp_path, "codex", "codex")
    spec = median_spec(example_dir, tmp_path, "no-cli", {"codex": lock}, 4096)
    path = write_spec(example_dir, spec)
    bin_dir = tmp_path / "agent-bin"
    bin_dir.mkdir()
    monkeypatch.setenv(BIN_DIR_VAR, str(bin_dir))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(SpecError) as refused:
        submit(path, Settings.from_env())
    (problem,) = refused.value.problems
    assert problem.path == "variants.codex" and "npm install @openai/codex@" in problem.message
    # Installed at submit, gone by the first trial: a configuration error, reported once.
    stub = bin_dir / "codex"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    exp = submit(path, Settings.from_env())
    stub.unlink()
    (key,) = exp.trial_keys()
    record, _ = run_trial(TrialRequest(exp, key, 1, None, "run-no-cli"), Settings.from_env())
    assert (record.outcome_class, record.infra_reason) == ("infra_error", "agent_cli")
    assert record.error is not None and "not installed here" in record.error
    plan = plan_retries([record], 1, Settings.from_env().infra_retries)
    assert plan.retries == [] and f"agent_cli is never retried: {key.key}" in plan.notes
