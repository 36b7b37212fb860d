"""Setting a real agent CLI up for a trial: find it, mount its install, place the lock's files.

The CLI is installed on the orchestrator, not in the sandbox image: it is found
in ``$HANGAR_AGENT_BIN_DIR`` (else on ``PATH``) and its install directory is
mounted read-only at the same path, so its scripts and symlinks resolve inside
the sandbox as they do outside. An npm CLI brings its npm prefix (and node, when
the sandbox's system directories do not show it); a pip CLI brings its
virtualenv (and the base interpreter, likewise). The lock's instructions file,
``skills/`` and ``plugins/`` are copied into the CLI's config directory,
outside the repo, and their digests are what the agent saw (whether the CLI
loads plugins from there is per adapter: docs/architecture.md, "Adapters").
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from hangar_dagster.experiment.harness import HarnessError, tree_digest
from hangar_dagster.settings import AGENT_BIN_DIR_VAR as BIN_DIR_VAR
from hangar_dagster.trials.agents import AgentContext
from hangar_dagster.trials.sandbox import Mount
from hangar_dagster.trials.sandbox._common import SYSTEM_DIRS


class CliUnavailable(HarnessError):
    """The variant's agent CLI cannot be found or used on this orchestrator.

    A configuration error, not infrastructure: submit refuses the spec with it, and a trial
    that meets it anyway ends ``infra_error / agent_cli``, never retried (docs/queue.md).
    """


def find_cli(binary: str, install_hint: str, bin_dir: str | None) -> Path:
    """``<bin_dir>/<binary>``, else ``binary`` on PATH; the error says how to install it.

    ``bin_dir`` is ``Settings.agent_bin_dir`` (``HANGAR_AGENT_BIN_DIR``); ``install_hint`` is
    the install command, e.g. ``npm install @openai/codex@<version>``.
    """
    found = (
        str(Path(bin_dir) / binary)
        if bin_dir and (Path(bin_dir) / binary).is_file()
        else shutil.which(binary)
    )
    if found is None:
        raise CliUnavailable(
            f"the {binary!r} CLI is not installed here: put it on PATH or set {BIN_DIR_VAR} to "
            f"its directory ({install_hint})"
        )
    if not os.access(found, os.X_OK):
        raise CliUnavailable(
            f"{found}: the {binary!r} CLI is not executable; reinstall it ({install_hint})"
        )
    return Path(os.path.abspath(found))


def _visible(path: Path) -> bool:
    """Whether the sandbox shows ``path`` anyway (it mounts the system directories)."""
    return any(path == Path(d) or Path(d) in path.parents for d in SYSTEM_DIRS)


def _node_script(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline(200)
    return first.startswith(b"#!") and b"node" in first


def install_mounts(binary: Path) -> list[Mount]:
    """Read-only mounts at the same paths: the CLI's install (its npm prefix), and node if needed."""
    real = binary.resolve()
    roots: list[Path] = []
    for path in (binary, real):
        if not _visible(path):
            # An npm install: the prefix holding node_modules, so its .bin symlinks resolve.
            roots.append(
                next((p.parent for p in path.parents if p.name == "node_modules"), path.parent)
            )
    node = shutil.which("node") if _node_script(real) else None
    if node is not None and not _visible(Path(node).resolve()):
        roots.append(Path(node).resolve().parent.parent)
    unique: list[Path] = []
    for root in sorted(set(roots), key=lambda p: len(p.parts)):
        if not any(u == root or u in root.parents for u in unique):
            unique.append(root)
    return [Mount(root, str(root)) for root in unique]


def venv_cli(binary: Path, install_hint: str) -> Path:
    """The script ``binary`` is, inside its virtualenv: symlinks followed one hop at a time.

    pipx (``~/.local/bin/mini`` -> ``~/.local/pipx/venvs/<pkg>/bin/mini``) and bin folders of
    links put the script elsewhere than its venv; the first hop whose directory is a venv's
    ``bin/`` wins (not the fully resolved path: a venv's ``bin/python`` is itself a link out).
    """
    path, seen = binary, set()
    while path not in seen:
        seen.add(path)
        if (path.parent.parent / "pyvenv.cfg").is_file():
            return path
        if not path.is_symlink():
            break
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
    raise CliUnavailable(
        f"{binary}: the CLI must be installed in a virtualenv (no pyvenv.cfg next to its "
        f"bin/ directory, links followed); {install_hint} into one (pip in a venv, pipx) and "
        f"put its bin/ or a link to its script on PATH or in {BIN_DIR_VAR}"
    )


def venv_mounts(script: Path) -> list[Mount]:
    """The virtualenv of ``script`` (from ``venv_cli``), and its base interpreter if the sandbox
    hides it."""
    venv = script.parent.parent
    cfg = venv / "pyvenv.cfg"
    mounts = [Mount(venv, str(venv))]
    home = next(
        (
            line.split("=", 1)[1].strip()
            for line in cfg.read_text().splitlines()
            if line.split("=", 1)[0].strip() == "home"
        ),
        None,
    )
    if home:
        prefix = Path(home).parent
        shown = [Path(d) for d in (*SYSTEM_DIRS, sys.base_prefix, sys.prefix)]
        if not any(prefix == d or d in prefix.parents for d in shown):
            mounts.append(Mount(prefix, str(prefix)))
    return mounts


def scratch_dir(path: Path) -> Path:
    """``path`` as a new empty directory (a previous attempt's leftovers removed)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def lock_instructions(ctx: AgentContext) -> bytes | None:
    """The lock's instructions file, None when it names none; refused when it is missing."""
    file = ctx.harness.instructions_file
    if file is None:
        return None
    if not file.is_file():
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: instructions file {file.name} is missing"
        )
    return file.read_bytes()


def place_lock_files(
    ctx: AgentContext, config_dir: Path, instructions_name: str
) -> dict[str, str | None]:
    """Copy the lock's instructions (as ``instructions_name``), skills/ and plugins/ to ``config_dir``.

    Returns the contract's ``instructions_digest``, ``skills_digest`` and
    ``plugins_digest`` of the files as placed (modes kept: a script stays executable).
    """
    config_dir.mkdir(parents=True, exist_ok=True)
    digests: dict[str, str | None] = {
        "instructions_digest": None,
        "skills_digest": None,
        "plugins_digest": None,
    }
    data = lock_instructions(ctx)
    if data is not None:
        (config_dir / instructions_name).write_bytes(data)
        digests["instructions_digest"] = hashlib.sha256(data).hexdigest()
    for name, source in (("skills", ctx.harness.skills_dir), ("plugins", ctx.harness.plugins_dir)):
        if source.is_dir():
            placed = config_dir / name
            shutil.copytree(source, placed)
            digests[f"{name}_digest"] = tree_digest(placed)
    return digests


def prompt(ctx: AgentContext) -> str:
    """The task as the CLI is asked it: the task's instructions and how to check the work."""
    text = ctx.instructions.rstrip("\n")
    if ctx.verify:
        text += f"\n\nYou can check your work with: {ctx.verify}"
    return text
