"""The pytest plugin ``hangar-grade pytest`` loads with ``-p``: it puts the repo on sys.path.

The repo goes on sys.path only here, once pytest has started, so nothing in it
(a .pth file, sitecustomize.py, a pytest plugin it declares, a module named
like one pytest imports at startup) can run before the runner is in place.
Issue 3 hooks the hidden tests' own conftest.py in here too.
"""

from __future__ import annotations

import os
import sys

import pytest


def pytest_configure(config: pytest.Config) -> None:
    repo = os.environ.get("HANGAR_REPO")
    if not repo or not os.path.isdir(repo):
        raise pytest.UsageError(
            f"hangar-grade: HANGAR_REPO={repo!r} is not a directory; "
            "run the hidden tests through `hangar-grade pytest`"
        )
    # First, as a plain `python -m pytest` in the repo would have it: the patched code wins
    # over any installed copy of the same package.
    if repo not in sys.path:
        sys.path.insert(0, repo)


def pytest_report_header(config: pytest.Config) -> str:
    hidden, repo = os.environ.get("HANGAR_HIDDEN_TESTS"), os.environ.get("HANGAR_REPO")
    return f"hangar-grade: hidden tests {hidden}, repo {repo}"
