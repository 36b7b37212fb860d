"""Precompiled bytecode for Pythons that run under a cache prefix (agents' commands).

Agents run with ``PYTHONPYCACHEPREFIX`` (``trials.agents.NO_BYTECODE_ENV``) so that what a tool
compiles lands in the sandbox's private /tmp, never the work tree. Under a prefix Python looks
for every module's bytecode there and ignores each ``__pycache__``: with an empty prefix each
start compiled the standard library and pytest from source. A build therefore carries a tree in
the prefix's layout (``<tree>/<source dir>/<name>.cpython-3X.pyc``) holding the bytecode that
already exists for the standard library and its own site-packages, and each agent sandbox mounts
its two directories read-only at the same place under the prefix. Python validates each file
against its source as it does in ``__pycache__``; whatever else is compiled goes to the writable
rest of the prefix, as before.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

PYCACHE_PREFIX = "/tmp/hangar-pycache"
TREE = "pycache"  # in a build's root
# Parts of the standard library no agent's command imports: left out of the tree.
_SKIP = frozenset({"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages"})  # fmt: skip
_TAG = f".{sys.implementation.cache_tag}.pyc"


def site_packages(venv: Path) -> Path:
    return (
        venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def link_bytecode(tree: Path, source: Path, final: Path) -> int:
    """Put the bytecode of ``source``'s ``__pycache__`` directories into ``tree`` in the prefix
    layout for ``final`` (where ``source`` will be seen; the same place unless it is being
    made in a temporary directory). Hard links where the filesystem allows, else copies.
    Returns how many files."""
    count = 0
    for dirpath, dirnames, _ in os.walk(source):
        dirnames[:] = [d for d in dirnames if d not in _SKIP or Path(dirpath) != source]
        if "__pycache__" not in dirnames:
            continue
        dirnames.remove("__pycache__")
        cache = Path(dirpath, "__pycache__")
        dest = tree / _relative(final / Path(dirpath).relative_to(source))
        for pyc in cache.iterdir():
            if not pyc.name.endswith(_TAG):  # optimized (opt-1, opt-2) and other versions' files
                continue
            dest.mkdir(parents=True, exist_ok=True)
            try:
                os.link(pyc, dest / pyc.name)
            except OSError:
                shutil.copy2(pyc, dest / pyc.name)
            count += 1
    return count


def tree_sources(venv: Path) -> list[Path]:
    """What a build's tree holds the bytecode of: the standard library and ``venv``'s packages."""
    return [stdlib_dir(), site_packages(venv)]


def make_tree(tree: Path, venv: Path, final_venv: Path) -> None:
    """The tree of a build whose ``venv`` is being made where ``final_venv`` will be."""
    for source, final in zip(tree_sources(venv), tree_sources(final_venv), strict=True):
        link_bytecode(tree, source, final)


def prefix_mounts(tree: Path, venv: Path) -> list[tuple[Path, str]]:
    """(directory in ``tree``, where it goes in a sandbox) for each source the tree holds."""
    return [
        (tree / _relative(s), PYCACHE_PREFIX + str(s))
        for s in tree_sources(venv)
        if (tree / _relative(s)).is_dir()
    ]


def _relative(path: Path) -> Path:
    return path.relative_to(path.anchor)
