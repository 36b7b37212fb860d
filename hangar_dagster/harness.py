"""Harness locks: immutable, digest-named agent configurations in a registry directory.

A lock is a directory ``<registry>/<name>@sha256:<digest>/`` holding
``harness.yaml`` (agent adapter, CLI and version, concrete model, approvals)
and whatever it names: ``instructions.md``, ``skills/``, ``plugins/``. The
digest is over the directory's canonical content (every file's relative path
and bytes, sorted), so one changed byte of a skill is a new lock, and a lock
whose content no longer matches its name is refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MANIFEST = "harness.yaml"


class HarnessError(ValueError):
    pass


def tree_digest(root: Path) -> str:
    """sha256 over every regular file under ``root`` (path and content), symlinks refused."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise HarnessError(f"{path}: symlinks are not allowed in a harness lock")
        if path.is_file():
            h.update(rel.encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class HarnessLock:
    name: str
    digest: str
    path: Path
    config: dict[str, Any]

    @property
    def ref(self) -> str:
        return f"{self.name}@sha256:{self.digest}"

    @property
    def adapter(self) -> str:
        return str(self.config["agent"]["adapter"])

    @property
    def model(self) -> str:
        return str(self.config["model"])

    @property
    def instructions_file(self) -> Path | None:
        name = self.config.get("instructions")
        return self.path / name if name else None

    @property
    def skills_dir(self) -> Path:
        return self.path / "skills"


def _read_config(root: Path) -> dict[str, Any]:
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise HarnessError(
            f"{root}: no {MANIFEST}; a harness names at least agent.adapter and model"
        )
    data = yaml.safe_load(manifest.read_text())
    if not isinstance(data, dict):
        raise HarnessError(f"{manifest}: expected a mapping")
    missing = [k for k in ("name", "agent", "model") if k not in data]
    if missing:
        raise HarnessError(f"{manifest}: missing field(s) {', '.join(missing)}")
    if not isinstance(data["agent"], dict) or "adapter" not in data["agent"]:
        raise HarnessError(f"{manifest}: agent.adapter is required (e.g. standin, command)")
    return data


def load_lock(registry: Path, ref: str) -> HarnessLock:
    """Find ``ref`` (name@sha256:digest) in ``registry`` and verify its content still matches."""
    name, _, digest = ref.partition("@sha256:")
    path = registry / ref
    if not path.is_dir():
        raise HarnessError(f"harness lock {ref} is not in the registry {registry}")
    actual = tree_digest(path)
    if actual != digest:
        raise HarnessError(
            f"harness lock {ref} was changed after it was frozen: its content hashes to sha256:{actual}"
        )
    config = _read_config(path)
    if config["name"] != name:
        raise HarnessError(
            f"harness lock {ref}: harness.yaml names {config['name']!r}, not {name!r}"
        )
    return HarnessLock(name=name, digest=digest, path=path, config=config)


def freeze(source: Path, registry: Path) -> HarnessLock:
    """Copy a harness directory into the registry under its digest name (idempotent)."""
    config = _read_config(source)
    digest = tree_digest(source)
    ref = f"{config['name']}@sha256:{digest}"
    dest = registry / ref
    if not dest.exists():
        registry.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=registry, prefix=".freeze-"))
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        os.replace(tmp, dest)
    return load_lock(registry, ref)
