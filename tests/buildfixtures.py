"""Environment builds in tests: a local wheel index in place of the package mirror, and a real
repo whose package reads its version from installed metadata (needs ``pip install -e .``).

``local_index`` stands in for ``open_egress("mirror")`` (the egress branch's proxy) in the tests
that are about builds rather than the mirror: the build's sandbox gets a directory of real
wheels mounted read-only and pip pointed at it (``--no-index --find-links``), so pip installs
for real, offline. The wheels (hangar's pinned pytest and its dependencies, setuptools and
wheel for build isolation) are fetched once per session by the host's pip, from whatever index
the host is configured with: the same upstream the mirror serves. Tests of the mirror itself
(``tests/environment/test_build_mirror.py``) use the real seam.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hangar_dagster.environment import build
from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox import Mount
from hangar_dagster.util.gitrepo import git

SEMVER_TASK = "semanticversion-truncate-copy"


@dataclass(frozen=True)
class LocalIndexGrant:
    """An egress grant's shape (``environment.egress.EgressGrant``) for a local wheel index."""

    wheels: Path
    policy: str = "mirror"
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()

    @classmethod
    def of(cls, wheels: Path) -> LocalIndexGrant:
        return cls(
            wheels=wheels,
            mounts=(Mount(wheels, str(wheels)),),
            env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)},
        )


_WHEELS: dict[str, Path] = {}


def wheelhouse(factory: pytest.TempPathFactory) -> Path:
    """This session's wheels: the pinned runner and what pip's build isolation needs."""
    if "dir" not in _WHEELS:
        dest = factory.mktemp("wheels")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest),
             build.runner_requirement(), "setuptools", "wheel"],
            check=True, timeout=600,
        )  # fmt: skip
        _WHEELS["dir"] = dest
    return _WHEELS["dir"]


@pytest.fixture
def local_index(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Builds install from a local wheel index instead of the mirror; returns the wheels dir."""
    wheels = wheelhouse(tmp_path_factory)

    @contextlib.contextmanager
    def grant(log_path: Path, settings: Settings) -> Iterator[LocalIndexGrant]:
        yield LocalIndexGrant.of(wheels)

    monkeypatch.setattr(build, "open_build_egress", grant)
    return wheels


def semver_repo(corpus: Path, dest: Path) -> tuple[Path, str]:
    """The corpus's python-semanticversion at the task base: its version comes from installed
    metadata, so importing it needs ``pip install -e .``. Returns (repo, base sha)."""
    git("clone", "-q", str(corpus / SEMVER_TASK / "repo.bundle"), str(dest))
    return dest, git("rev-parse", "HEAD", cwd=dest).strip()
