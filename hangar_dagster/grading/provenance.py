"""Whose code the hidden tests ran: where each module they imported was loaded from.

Pure functions over the grader's saved outputs. The trusted reporter sends, when the session
ends, the file every loaded module came from (``modules`` event: top-level modules, and every
submodule of the repo's own packages); ``classify`` names each file's place, and
``violations`` fails a grade in which a module of the repo's own distribution was loaded from
anywhere but the repo: an installed copy (the test runner's ``packaging``, a build's
non-editable install) stood in for the code under test, so the grade measured other code
(docs/grading.md, "Whose code is measured").

The repo's own modules are read from the task's base tree (``repo_modules``), never from the
patched one: a patch that deletes the package must not make it "not the repo's".
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

# Where a module came from. "repo": the clone under test (or its editable install);
# "hidden_tests": the hidden files; "runner": the pinned test runner's distributions;
# "build": the task's built environment; "stdlib"; "builtin" (compiled in, frozen, no file);
# "hangar": hangar's trusted plugins; "elsewhere": none of these.
Origin = str

# Top-level names found in a repo that are not its distribution: tooling and test dirs.
_NOT_DISTRIBUTED = frozenset(
    {"setup", "conftest", "noxfile", "tasks", "fabfile", "docs", "doc", "tests", "test",
     "testing", "examples", "benchmarks", "scripts", "tools", "build", "dist", "bin"}
)  # fmt: skip


def repo_modules(files: Iterable[str], import_roots: Sequence[str] = ()) -> list[str]:
    """The top-level modules the repo's own distribution provides, from its tracked files.

    A package directory (``x/__init__.py``) or module (``x.py``) at the repo root; under
    ``src/`` and each of the grader's import roots (``grader.pythonpath``) any directory with
    Python files (namespace packages included) or module. Tooling and test directories
    (``tests``, ``docs``, ``setup.py``, ...), test modules (``test_*``, ``*_test``) and names of
    the standard library are left out.
    """
    roots = [r.strip("/") for r in ("src", *import_roots) if r.strip("/") not in ("", ".")]
    names: set[str] = set()
    for path in files:
        parts = path.split("/")
        if not path.endswith(".py"):
            continue
        if len(parts) == 1:
            names.add(parts[0][:-3])
        elif len(parts) == 2 and parts[1] == "__init__.py":
            names.add(parts[0])
        for root in roots:
            depth = root.count("/") + 1
            if "/".join(parts[:depth]) == root and len(parts) > depth:
                head = parts[depth]
                names.add(head[:-3] if len(parts) == depth + 1 else head)
    stdlib = sys.stdlib_module_names
    return sorted(
        n
        for n in names
        if n.isidentifier()
        and n not in _NOT_DISTRIBUTED
        and n not in stdlib
        and not n.startswith("test_")
        and not n.endswith("_test")
    )


@dataclass(frozen=True)
class Places:
    """The directories a grade's modules can come from (absolute paths, as the sandbox saw them)."""

    repos: tuple[str, ...]  # the clone, and the build's repo path it is also mounted at
    hidden: str
    venv: str  # the test environment (a build's venv, or the runner environment)
    runner_top_level: frozenset[str]  # top-level names of the runner's distributions
    hangar: str  # hangar's package directory (the trusted plugins)


def _under(path: str, root: str) -> bool:
    root = os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.normpath(paths[k]) for k in ("stdlib", "platstdlib"))


def classify(name: str, path: str | None, places: Places) -> Origin:
    """Where module ``name``, loaded from ``path`` (None: no file), came from."""
    if not path or not os.path.isabs(path):
        return "builtin"
    path = os.path.normpath(path)
    if any(_under(path, r) for r in places.repos):
        return "repo"
    if _under(path, places.hidden):
        return "hidden_tests"
    if _under(path, places.hangar):
        return "hangar"
    if _under(path, places.venv):
        top = name.partition(".")[0]
        return "runner" if top in places.runner_top_level else "build"
    if any(_under(path, d) for d in _stdlib_dirs()) and "site-packages" not in path.split("/"):
        return "stdlib"
    return "elsewhere"


def table(loaded: Mapping[str, str | None], places: Places) -> dict[str, dict[str, str]]:
    """Each loaded top-level module that is not the standard library's: ``{from, path}``."""
    out: dict[str, dict[str, str]] = {}
    for name, path in sorted(loaded.items()):
        if "." in name:
            continue
        origin = classify(name, path, places)
        if origin not in ("stdlib", "builtin"):
            out[name] = {"from": origin, "path": path or ""}
    return out


def violations(
    loaded: Mapping[str, str | None], own: Collection[str], places: Places, repo: str
) -> list[str]:
    """A reason for each module of the repo's distribution (``own``) loaded from elsewhere."""
    found: list[str] = []
    for name, path in sorted(loaded.items()):
        top = name.partition(".")[0]
        if top not in own:
            continue
        origin = classify(name, path, places)
        if origin in ("repo", "hidden_tests"):  # hidden files may replace the repo's own
            continue
        where = {"runner": "the pinned test runner", "build": "the task's built environment"}
        found.append(
            f"module {name!r} of the repo was loaded from {path or '(no file)'} "
            f"({where.get(origin, origin)}), not from the repo ({repo}): the grade would "
            "measure that copy, not the code under test; put the repo's import root on "
            "grader.pythonpath (e.g. src) or install it editable in the build (pip install -e .)"
        )
    return found[:5]
