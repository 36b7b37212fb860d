"""The pytest plugin ``hangar-grade pytest`` loads with ``-p``: the repo on sys.path, hidden conftests.

The repo (after the spec's ``grader.pythonpath`` directories of it, from
``$HANGAR_PYTHONPATH``) goes on sys.path only here, once pytest has started, so nothing in it
(a .pth file, sitecustomize.py, a pytest plugin it declares, a module named
like one pytest imports at startup) can run before the runner is in place.

``--noconftest`` keeps every conftest.py out, the hidden tests' own included;
those are registered here instead, by path, as plugins: their fixtures and
hooks work (for every hidden test, whatever directory they sit in), options
they would add do not (the command line is parsed by then), and nothing of
the repo is loaded with them.

It runs inside the grader's sandbox and reads the ``HANGAR_`` variables the sandbox was
given (the grader's contract, not operator settings), so it reads its environment itself
(the one exception to ``settings.Settings``, allowed in tests/test_settings_source.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest


def _register_hidden_conftests(config: pytest.Config, hidden: str) -> None:
    for n, path in enumerate(sorted(Path(hidden).rglob("conftest.py"))):
        name = f"hangar_hidden_conftest_{n}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise pytest.UsageError(f"hangar-grade: cannot load hidden {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        config.pluginmanager.register(module, name)


def _import_roots(repo: str) -> list[str]:
    """``$HANGAR_PYTHONPATH``'s directories (relative to the repo), each checked to be inside it."""
    roots = []
    for rel in filter(None, os.environ.get("HANGAR_PYTHONPATH", "").split(":")):
        path = os.path.normpath(os.path.join(repo, rel))
        if os.path.commonpath([path, os.path.normpath(repo)]) != os.path.normpath(repo):
            raise pytest.UsageError(
                f"hangar-grade: HANGAR_PYTHONPATH entry {rel!r} leaves the repo"
            )
        roots.append(path)
    return roots


def pytest_configure(config: pytest.Config) -> None:
    repo = os.environ.get("HANGAR_REPO")
    if not repo or not os.path.isdir(repo):
        raise pytest.UsageError(
            f"hangar-grade: HANGAR_REPO={repo!r} is not a directory; "
            "run the hidden tests through `hangar-grade pytest`"
        )
    # First, as a plain `python -m pytest` in the repo would have it: the patched code wins
    # over any installed copy of the same package (hangar's own venv has packaging, tomli, ...).
    # The spec's import roots (grader.pythonpath, e.g. src) go before the repo root.
    for path in reversed([*_import_roots(repo), repo]):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    hidden = os.environ.get("HANGAR_HIDDEN_TESTS")
    # In files_mode in_repo the hidden tests are the repo: its conftests stay out.
    if hidden and os.path.isdir(hidden) and os.path.realpath(hidden) != os.path.realpath(repo):
        _register_hidden_conftests(config, hidden)


def pytest_report_header(config: pytest.Config) -> str:
    hidden, repo = os.environ.get("HANGAR_HIDDEN_TESTS"), os.environ.get("HANGAR_REPO")
    return f"hangar-grade: hidden tests {hidden}, repo {repo}"


# hypothesis's settings profile for grader runs: the test's own, without the too_slow check.
HYPOTHESIS_PROFILE = "hangar-grade"


def pytest_collection(session: pytest.Session) -> None:
    # After the hidden conftests (which often load a hypothesis profile of their own), before
    # any test module is imported: @given reads the default settings when it decorates.
    relax_hypothesis()


def relax_hypothesis() -> bool:
    """Suppress hypothesis's ``too_slow`` health check in the current default profile.

    That check fails a test whose first examples take more than a second to generate. In a
    grader run every Python call goes through the trusted reporter's profile hook, which makes
    generation several times slower than under plain pytest (docs/grading.md, "Hypothesis"):
    hangar's own overhead must not fail a test plain pytest passes. True when hypothesis is
    there and the profile is loaded.
    """
    if "hypothesis" not in sys.modules and importlib.util.find_spec("hypothesis") is None:
        return False
    try:
        hypothesis = importlib.import_module("hypothesis")
        settings, too_slow = hypothesis.settings, hypothesis.HealthCheck.too_slow
    except (ImportError, AttributeError):  # not the hypothesis this knows: leave it alone
        return False
    current = settings.default
    settings.register_profile(
        HYPOTHESIS_PROFILE,
        parent=current,
        suppress_health_check=[*current.suppress_health_check, too_slow],
    )
    settings.load_profile(HYPOTHESIS_PROFILE)
    return True
