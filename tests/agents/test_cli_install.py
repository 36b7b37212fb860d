"""Setting real CLIs up: each adapter says how to install its own CLI when it is missing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hangar_dagster.agents import get_agent
from hangar_dagster.agents.cli_install import BIN_DIR_VAR, place_lock_files, prompt
from hangar_dagster.harness import HarnessError, HarnessLock, tree_digest
from tests.agents.cli_locks import INSTRUCTIONS, cli_context, freeze_cli_lock

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
    }
    assert digests["skills_digest"] == tree_digest(lock.skills_dir)
    assert prompt(ctx) == "Make add() add.\n\nYou can check your work with: make check"
