"""Harness locks: immutable, digest-named agent configurations in a registry directory.

A lock is a directory ``<registry>/<name>@sha256:<digest>/`` holding
``harness.yaml`` (agent adapter, CLI and version, model, approvals) and
whatever it names: the instructions file, ``skills/``, ``plugins/``. The
digest is over the directory's canonical content (every file's relative path,
bytes and whether it is executable, sorted), so one changed byte of a skill, or
a script made executable, is a new lock, and a lock whose content no longer
matches its name is refused. ``thaw`` gives a trial a read-only copy
(executables stay executable), verified again after copying.

A registry may pin CLI versions in ``<registry>/harnesses.lock.yaml``
(``clis: {claude: "2.0.5", ...}``); ``CliPins.problem`` says why a lock
disagrees with it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.experiment.spec_yaml import YAMLRefusal, load_yaml
from hangar_dagster.util.fs import InputFileError, read_text_bounded

MANIFEST = "harness.yaml"
MAX_HARNESS_FILE_BYTES = 1_000_000
CLI_PINS = "harnesses.lock.yaml"
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
_NAME = re.compile(NAME_PATTERN)
_REF = re.compile(rf"({NAME_PATTERN})@sha256:([0-9a-f]{{64}})")
# overlay: {base, fields}, written by overlay.py on the harness it builds from an overlay variant.
_TOP_FIELDS = (
    "name",
    "description",
    "agent",
    "model",
    "approvals",
    "instructions",
    "overlay",
    "provider_retries",
)
# provider_retries: the CLI's own retry count and request timeout, set through each CLI's own
# knobs (docs/architecture.md, "Bounded time against a dead provider"); field -> (low, high).
PROVIDER_RETRY_FIELDS = {"max_retries": (0, 20), "timeout_s": (1, 3600)}
_AGENT_FIELDS = ("adapter", "cli", "version", "command", "tools")
_DIRS = ("skills", "plugins")


class HarnessError(ValueError):
    pass


def _executable(path: Path) -> bool:
    # The owner's bit only: a umask clears group/other bits, never this one.
    return bool(path.stat().st_mode & stat.S_IXUSR)


def tree_digest(root: Path) -> str:
    """sha256 over every regular file under ``root`` (path, executable or not, content).

    No other mode bit counts, so the same files give the same digest under any
    umask. Symlinks are refused.
    """
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise HarnessError(f"{path}: symlinks are not allowed in a harness lock")
        if path.is_file():
            h.update(rel.encode() + b"\0" + (b"x" if _executable(path) else b"-") + b"\0")
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
    def cli(self) -> str:
        return str(self.config["agent"]["cli"])

    @property
    def cli_version(self) -> str:
        return str(self.config["agent"]["version"])

    @property
    def model(self) -> str:
        """As written: a concrete id or a policy (``balanced``/``frontier``), resolved at submit."""
        return str(self.config["model"])

    @property
    def instructions_file(self) -> Path | None:
        name = self.config.get("instructions")
        return self.path / name if name else None

    @property
    def skills_dir(self) -> Path:
        return self.path / "skills"

    @property
    def plugins_dir(self) -> Path:
        return self.path / "plugins"


def _text(manifest: Path, field: str, value: Any, example: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise HarnessError(f"{manifest}: {field} must be a non-empty string (e.g. {example})")
    return value


def validate_config(root: Path, data: Any) -> dict[str, Any]:
    """Check ``harness.yaml``'s fields against the lock directory; every error names the field."""
    manifest = root / MANIFEST
    if not isinstance(data, dict):
        raise HarnessError(f"{manifest}: expected a mapping with name, agent and model")
    missing = [k for k in ("name", "agent", "model") if k not in data]
    if missing:
        raise HarnessError(f"{manifest}: missing field(s) {', '.join(missing)}")
    name = _text(manifest, "name", data["name"], "claude-plain")
    if not _NAME.fullmatch(name):
        raise HarnessError(
            f"{manifest}: name {name!r} must be letters, digits, '.', '_' and '-' (at most 100)"
        )
    agent = data["agent"]
    if not isinstance(agent, dict) or "adapter" not in agent:
        raise HarnessError(
            f"{manifest}: agent.adapter is required (e.g. claude-code, codex, standin, command)"
        )
    adapter = _text(manifest, "agent.adapter", agent["adapter"], "claude-code")
    # One section named after the adapter holds its own settings (e.g. `standin: {solve_rate}`).
    unknown = sorted(set(data) - {*_TOP_FIELDS, adapter})
    if unknown:
        raise HarnessError(
            f"{manifest}: unknown field(s) {', '.join(unknown)}; a lock holds "
            f"{', '.join(_TOP_FIELDS)} and one section named after its adapter ({adapter})"
        )
    if adapter in data and not isinstance(data[adapter], dict):
        raise HarnessError(f"{manifest}: {adapter} (the adapter's settings) must be a mapping")
    unknown = sorted(set(agent) - set(_AGENT_FIELDS))
    if unknown:
        raise HarnessError(
            f"{manifest}: unknown agent field(s) {', '.join(unknown)}; agent takes "
            f"{', '.join(_AGENT_FIELDS)}"
        )
    for field, example in (("cli", "claude"), ("version", '"2.0.5" (quoted)')):
        if field not in agent:
            raise HarnessError(
                f"{manifest}: agent.{field} is required: the CLI and its exact version (e.g. {example})"
            )
        _text(manifest, f"agent.{field}", agent[field], example)
    if "command" in agent:
        _text(manifest, "agent.command", agent["command"], "my-agent --task-file $HANGAR_TASK_FILE")
    tools = agent.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools)
    ):
        raise HarnessError(
            f"{manifest}: agent.tools must be a list of tool names (e.g. [Read, Edit])"
        )
    _text(manifest, "model", data["model"], "claude-sonnet-4-5-20250929, or balanced / frontier")
    if "approvals" in data:
        _text(manifest, "approvals", data["approvals"], "full-auto")
    if "provider_retries" in data:
        _provider_retries(manifest, data["provider_retries"])
    if "description" in data and not isinstance(data["description"], str):
        raise HarnessError(f"{manifest}: description must be a string")
    if "overlay" in data and not isinstance(data["overlay"], dict):
        raise HarnessError(f"{manifest}: overlay must be a mapping (base, fields)")
    if "instructions" in data:
        rel = _text(manifest, "instructions", data["instructions"], "instructions.md")
        target = (root / rel).resolve()
        if not target.is_relative_to(root.resolve()) or not target.is_file():
            raise HarnessError(
                f"{manifest}: instructions names {rel!r}, which is not a file inside the harness; "
                "put it beside harness.yaml"
            )
    for name in _DIRS:
        if (root / name).exists() and not (root / name).is_dir():
            raise HarnessError(f"{root / name}: {name}/ must be a directory (one folder per entry)")
    return data


def _provider_retries(manifest: Path, value: Any) -> None:
    example = "{max_retries: 2, timeout_s: 60}"
    if not isinstance(value, dict) or not value:
        raise HarnessError(f"{manifest}: provider_retries must be a mapping, e.g. {example}")
    unknown = sorted(set(value) - set(PROVIDER_RETRY_FIELDS))
    if unknown:
        raise HarnessError(
            f"{manifest}: unknown provider_retries field(s) {', '.join(map(str, unknown))}; "
            f"it takes {', '.join(PROVIDER_RETRY_FIELDS)}, e.g. {example}"
        )
    for field, (low, high) in PROVIDER_RETRY_FIELDS.items():
        number = value.get(field)
        if field in value and (
            isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high
        ):
            raise HarnessError(
                f"{manifest}: provider_retries.{field} must be a whole number from {low} to "
                f"{high}, not {number!r}"
            )


def _load(file: Path) -> Any:
    """A harness file through the spec's bounded loader: duplicate keys, bombs and FIFOs refused."""
    try:
        return load_yaml(read_text_bounded(file, MAX_HARNESS_FILE_BYTES, file.name))
    except InputFileError as err:
        raise HarnessError(
            f"{err} (a harness file is UTF-8 YAML of at most {MAX_HARNESS_FILE_BYTES} bytes)"
        ) from None
    except YAMLRefusal as err:
        raise HarnessError(f"{file}: {err.path}: {err.message}; {err.fix}") from None
    except yaml.YAMLError as err:
        raise HarnessError(f"{file}: not valid YAML: {err}") from None


def _read_config(root: Path) -> dict[str, Any]:
    manifest = root / MANIFEST
    if not manifest.exists():
        raise HarnessError(
            f"{root}: no {MANIFEST}; a harness names at least name, agent (adapter, cli, version) and model"
        )
    return validate_config(root, _load(manifest))


def parse_ref(ref: str) -> tuple[str, str]:
    """(name, digest) of ``name@sha256:<64 hex>``."""
    found = _REF.fullmatch(ref)
    if found is None:
        raise HarnessError(f"{ref!r} is not a lock name: expected name@sha256:<64 hex digits>")
    return found.group(1), found.group(2)


def _verified(path: Path, ref: str) -> HarnessLock:
    name, digest = parse_ref(ref)
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


def load_lock(registry: Path, ref: str) -> HarnessLock:
    """Find ``ref`` (name@sha256:digest) in ``registry`` and verify its content still matches."""
    parse_ref(ref)
    path = registry / ref
    if not path.is_dir():
        raise HarnessError(f"harness lock {ref} is not in the registry {registry}")
    return _verified(path, ref)


def find_ref(registry: Path, name_or_ref: str) -> str:
    """A full lock name, given one or the bare name of the only lock of that name in ``registry``."""
    if "@" in name_or_ref:
        return name_or_ref
    found = sorted(p.name for p in registry.glob(f"{name_or_ref}@sha256:*") if p.is_dir())
    if len(found) != 1:
        which = ", ".join(found) if found else "none"
        raise HarnessError(
            f"{name_or_ref!r} names {len(found)} lock(s) in {registry} ({which}); give the full name@sha256:<digest>"
        )
    return found[0]


def freeze(source: Path, registry: Path) -> HarnessLock:
    """Copy a harness directory into the registry under its digest name (idempotent).

    The digest is taken of the copy, so a source edited while it is copied cannot
    leave a lock whose name does not match its content.
    """
    if not source.is_dir():
        raise HarnessError(f"{source}: not a directory; freeze a folder holding {MANIFEST}")
    _read_config(source)
    registry.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=registry, prefix=".freeze-"))
    try:
        shutil.copytree(source, tmp, symlinks=True, dirs_exist_ok=True)
        os.chmod(tmp, 0o755)
        config = _read_config(tmp)
        ref = f"{config['name']}@sha256:{tree_digest(tmp)}"
        if not (registry / ref).exists():
            os.replace(tmp, registry / ref)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_lock(registry, ref)


def _make_read_only(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = Path(dirpath, name)
            os.chmod(path, 0o555 if _executable(path) else 0o444)
        os.chmod(dirpath, 0o555)


def thaw(registry: Path, ref: str, dest: Path) -> HarnessLock:
    """Materialise lock ``ref`` at ``dest`` read-only, verified after copying.

    Files are 0444, executables 0555 (a skill's script still runs), dirs 0555.

    ``dest`` must not exist or be an empty directory. The returned lock's ``path`` is ``dest``.
    """
    source = load_lock(registry, ref)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise HarnessError(f"{dest}: exists and is not an empty directory; thaw into a new one")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.thaw-"))
    try:
        shutil.copytree(source.path, tmp, symlinks=True, dirs_exist_ok=True)
        _make_read_only(tmp)
        thawed = _verified(tmp, ref)  # the copy, not just the registry, must match the name
        os.replace(tmp, dest)
    except BaseException:
        for dirpath, _, _ in os.walk(tmp):
            os.chmod(dirpath, stat.S_IRWXU)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return HarnessLock(name=thawed.name, digest=thawed.digest, path=dest, config=thawed.config)


@dataclass(frozen=True)
class CliPins:
    """``clis`` of a registry's ``harnesses.lock.yaml``: CLI name -> the exact version locks must run."""

    file: Path
    clis: dict[str, str]

    def problem(self, lock: HarnessLock) -> tuple[str, str] | None:
        """(why, fix) when ``lock``'s CLI version disagrees with these pins.

        A CLI the file does not pin is refused too: a registry that pins versions
        means every lock in it to run a pinned one.
        """
        pinned = self.clis.get(lock.cli)
        if pinned is None:
            return (
                f"{self.file} pins no version of {lock.cli!r} (lock {lock.ref} runs {lock.cli_version})",
                f'add `{lock.cli}: "{lock.cli_version}"` under clis: if that is the version meant',
            )
        if pinned != lock.cli_version:
            return (
                f"lock {lock.ref} runs {lock.cli} {lock.cli_version} but {self.file} pins "
                f"{lock.cli} {pinned}",
                f'freeze the harness again with agent.version: "{pinned}", or change the pin to '
                f'"{lock.cli_version}"',
            )
        return None


def read_cli_pins(registry: Path) -> CliPins | None:
    """``<registry>/harnesses.lock.yaml``, or None when the registry pins no CLI versions."""
    file = registry / CLI_PINS
    if not file.is_file():
        return None
    data = _load(file)
    clis = data.get("clis") if isinstance(data, dict) else None
    if not isinstance(clis, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in clis.items()
    ):
        raise HarnessError(
            f'{file}: expected `clis:` mapping each CLI to a quoted exact version (e.g. claude: "2.0.5")'
        )
    return CliPins(file, dict(clis))
