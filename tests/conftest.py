"""Shared fixtures: an isolated HANGAR_HOME and a copy of the bundled example with its repos built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.harness import freeze

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "skills-ab"


@pytest.fixture
def hangar_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hangar-home"
    monkeypatch.setenv("HANGAR_HOME", str(home))
    # Set (not deleted) so that code which exports DAGSTER_HOME is undone after the test.
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    monkeypatch.setenv("HANGAR_EVAL_WINDOW", "always")
    return home


@pytest.fixture(scope="session")
def example_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The skills-ab example copied out of the checkout, with its task repos generated."""
    dest = tmp_path_factory.mktemp("example") / "skills-ab"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("repos", "__pycache__"))
    subprocess.run(
        [sys.executable, str(dest / "make_repos.py"), "--out", str(dest / "repos")],
        check=True,
        capture_output=True,
    )
    return dest


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env["HANGAR_HOME"] = str(home)
    env["HANGAR_EVAL_WINDOW"] = "always"  # tests that need a window set their own
    return env


def hangar(
    *args: str, home: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``hangar`` CLI in a subprocess against ``home`` (``env`` adds variables)."""
    exe = Path(sys.executable).with_name("hangar")
    return subprocess.run(
        [str(exe), *args],
        env=cli_env(home) | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def command_agent_spec(
    example_dir: Path, tmp_path: Path, name: str, command: str, files: dict[str, str] | None = None
) -> dict[str, Any]:
    """The example's `median` task, one trial, under a frozen `command` harness running ``command``.

    Returns the spec as a dict for the test to adjust and write next to the example's spec.
    """
    src = tmp_path / f"{name}-harness"
    src.mkdir()
    manifest = {
        "name": name,
        "agent": {"adapter": "command", "command": command, "cli": "sh", "version": "1"},
        "model": "scripted-2026-01-01",
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    for rel, text in (files or {}).items():
        (src / rel).write_text(text)
    lock = freeze(src, tmp_path / "registry")
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec.update(
        name=name,
        harness_repo=str(tmp_path / "registry"),
        tasks=[t for t in spec["tasks"] if t["id"] == "median"],
        variants={name: {"harness_lock": lock.ref}},
        trials=1,
    )
    return spec


def write_spec(example_dir: Path, spec: dict[str, Any]) -> Path:
    path = example_dir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
