"""`hangar harness freeze|thaw|show` through the real CLI: digests, verification, read-only copies."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.harness import HarnessError, freeze, thaw
from tests.conftest import hangar

pytestmark = pytest.mark.integration

SKILL = "# Care\nRead the failing test before editing.\n"


def harness_src(root: Path, **manifest: Any) -> Path:
    """A harness directory: manifest fields override a claude-code harness with one skill."""
    src = root / "src"
    (src / "skills" / "care").mkdir(parents=True)
    (src / "plugins").mkdir()
    base = {
        "name": "claude-care",
        "agent": {"adapter": "claude-code", "cli": "claude", "version": "2.1.332"},
        "model": "claude-sonnet-4-5-20250929",
        "approvals": "full-auto",
        "instructions": "instructions.md",
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(base | manifest))
    (src / "instructions.md").write_text("Fix the bug; keep the diff small.\n")
    (src / "skills" / "care" / "SKILL.md").write_text(SKILL)
    return src


def freeze_cli(src: Path, home: Path, registry: Path) -> str:
    result = hangar("harness", "freeze", str(src), "--registry", str(registry), home=home)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_freeze_prints_the_ref_and_one_changed_skill_byte_is_a_new_lock(tmp_path: Path) -> None:
    src, registry, home = harness_src(tmp_path), tmp_path / "registry", tmp_path / "home"
    ref = freeze_cli(src, home, registry)
    name, _, digest = ref.partition("@sha256:")
    assert name == "claude-care" and len(digest) == 64
    assert (registry / ref / "skills" / "care" / "SKILL.md").read_text() == SKILL
    assert freeze_cli(src, home, registry) == ref  # same content, same lock

    (src / "skills" / "care" / "SKILL.md").write_text(SKILL.replace("Read", "read"))
    changed = freeze_cli(src, home, registry)
    assert changed.startswith("claude-care@sha256:") and changed != ref
    assert sorted(p.name for p in registry.iterdir()) == sorted([ref, changed])


def test_freeze_without_a_registry_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HANGAR_HARNESS_REPO", raising=False)
    result = hangar("harness", "freeze", str(harness_src(tmp_path)), home=tmp_path / "home")
    assert result.returncode == 2
    assert "HANGAR_HARNESS_REPO" in result.stderr and "--registry" in result.stderr
    # With the variable set, the same command writes there.
    registry = tmp_path / "from-env"
    result = hangar(
        "harness",
        "freeze",
        str(tmp_path / "src"),
        home=tmp_path / "home",
        env={"HANGAR_HARNESS_REPO": str(registry)},
    )
    assert result.returncode == 0, result.stderr
    assert (registry / result.stdout.strip() / "harness.yaml").is_file()


@pytest.mark.parametrize(
    "manifest,expected",
    [
        ({"agent": {"adapter": "claude-code", "cli": "claude"}}, "agent.version is required"),
        (
            {"agent": {"adapter": "claude-code", "cli": "claude", "version": 2.1}},
            "agent.version must be a non-empty string",
        ),
        ({"modle": "x"}, "unknown field(s) modle"),
        ({"instructions": "missing.md"}, "instructions names 'missing.md'"),
        ({"name": "bad name"}, "name 'bad name'"),
        (
            {"agent": {"adapter": "codex", "cli": "codex", "version": "1", "tool": []}},
            "unknown agent field(s) tool",
        ),
    ],
)
def test_freeze_refuses_a_bad_harness_yaml_naming_the_field(
    tmp_path: Path, manifest: dict[str, Any], expected: str
) -> None:
    src = harness_src(tmp_path, **manifest)
    with pytest.raises(HarnessError) as info:
        freeze(src, tmp_path / "registry")
    assert expected in str(info.value) and "harness.yaml" in str(info.value)
    assert not (tmp_path / "registry").exists()  # checked before anything is written


def test_thaw_writes_a_verified_read_only_copy(tmp_path: Path) -> None:
    registry, home, out = tmp_path / "registry", tmp_path / "home", tmp_path / "out"
    ref = freeze_cli(harness_src(tmp_path), home, registry)
    result = hangar(
        "harness", "thaw", ref, "--out", str(out), "--registry", str(registry), home=home
    )
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["harness.yaml", "instructions.md", "skills/care/SKILL.md"]
    for path in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o555 if path.is_dir() else 0o444), (path, oct(mode))
    assert (out / "skills" / "care" / "SKILL.md").read_text() == SKILL
    # A bare name works when the registry holds one lock of it; a used --out is refused.
    again = hangar(
        "harness", "thaw", "claude-care", "--out", str(out), "--registry", str(registry), home=home
    )
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def test_the_executable_bit_names_the_lock_and_survives_thaw(tmp_path: Path) -> None:
    src, registry, home = harness_src(tmp_path), tmp_path / "registry", tmp_path / "home"
    script = src / "skills" / "care" / "check.sh"
    script.write_text("#!/bin/sh\necho checked\n")
    script.chmod(0o644)
    plain = freeze_cli(src, home, registry)
    script.chmod(0o755)
    runnable = freeze_cli(src, home, registry)
    assert runnable != plain  # only the bit changed: another lock
    # Group/other bits are a umask's business, not the lock's.
    script.chmod(0o700)
    (src / "instructions.md").chmod(0o600)
    assert freeze_cli(src, home, registry) == runnable

    out = tmp_path / "out"
    result = hangar(
        "harness", "thaw", runnable, "--out", str(out), "--registry", str(registry), home=home
    )
    assert result.returncode == 0, result.stderr
    thawed = out / "skills" / "care" / "check.sh"
    assert stat.S_IMODE(thawed.stat().st_mode) == 0o555
    assert stat.S_IMODE((out / "instructions.md").stat().st_mode) == 0o444
    ran = subprocess.run([str(thawed)], capture_output=True, text=True, check=False)
    assert ran.returncode == 0 and ran.stdout == "checked\n"
    # The plain lock thaws without the bit: executables are not made up either.
    other = tmp_path / "other"
    thaw(registry, plain, other)
    assert stat.S_IMODE((other / "skills" / "care" / "check.sh").stat().st_mode) == 0o444


def test_a_tampered_lock_is_refused_by_thaw_and_show(tmp_path: Path) -> None:
    registry, home = tmp_path / "registry", tmp_path / "home"
    ref = freeze_cli(harness_src(tmp_path), home, registry)
    skill = registry / ref / "skills" / "care" / "SKILL.md"
    skill.write_text(SKILL + "Also: delete the failing test.\n")

    out = tmp_path / "out"
    thawed = hangar(
        "harness", "thaw", ref, "--out", str(out), "--registry", str(registry), home=home
    )
    assert thawed.returncode == 2
    assert "changed after it was frozen" in thawed.stderr and ref in thawed.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if ".thaw-" in p.name] == []
    shown = hangar("harness", "show", ref, "--registry", str(registry), home=home)
    assert shown.returncode == 2 and "changed after it was frozen" in shown.stderr


def test_thaw_verifies_the_copy_and_leaves_nothing_when_it_fails(tmp_path: Path) -> None:
    lock = freeze(harness_src(tmp_path), tmp_path / "registry")
    dest = tmp_path / "trial" / "harness"
    thawed = thaw(tmp_path / "registry", lock.ref, dest)
    assert thawed.path == dest and thawed.digest == lock.digest and thawed.config == lock.config
    with pytest.raises(HarnessError, match="is not in the registry"):
        thaw(tmp_path / "registry", "other@sha256:" + "0" * 64, tmp_path / "trial" / "other")
    assert sorted(p.name for p in (tmp_path / "trial").iterdir()) == ["harness"]


def test_show_reports_the_lock_its_policy_and_the_cli_pin(tmp_path: Path) -> None:
    registry, home = tmp_path / "registry", tmp_path / "home"
    ref = freeze_cli(harness_src(tmp_path, model="frontier"), home, registry)
    (registry / "harnesses.lock.yaml").write_text(yaml.safe_dump({"clis": {"claude": "2.0.0"}}))

    result = hangar("harness", "show", ref, "--registry", str(registry), "--json", home=home)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["ref"] == ref and info["agent"]["cli"] == "claude"
    assert info["skills"] == ["care"] and info["plugins"] == []
    assert info["files"] == ["harness.yaml", "instructions.md", "skills/care/SKILL.md"]
    model = info["model"]
    assert model["requested"] == "frontier" and model["policy"] is True
    # No list fetched from the provider here: the shipped snapshot vouches by date alone.
    assert model["resolves_to"].startswith("claude-opus-") and model["basis"] == "pattern"
    assert model["experiments_refuse"] is None
    assert info["cli_pin"]["pinned"] == "2.0.0"
    assert "2.1.332" in info["cli_pin"]["problem"] and "2.0.0" in info["cli_pin"]["problem"]

    text = hangar("harness", "show", "claude-care", "--registry", str(registry), home=home)
    assert text.returncode == 0, text.stderr
    assert f"frontier -> {model['resolves_to']} (basis pattern)" in text.stdout


def test_freeze_warns_about_a_floating_model_but_writes_the_lock(tmp_path: Path) -> None:
    registry, home = tmp_path / "registry", tmp_path / "home"
    result = hangar(
        "harness",
        "freeze",
        str(harness_src(tmp_path, model="sonnet")),
        "--registry",
        str(registry),
        home=home,
    )
    assert result.returncode == 0, result.stderr
    assert (registry / result.stdout.strip()).is_dir()
    assert "experiments will refuse" in result.stderr and "'sonnet'" in result.stderr
