"""Start pytest in a build's interpreter with hangar's trusted plugins importable, nothing more.

``hangar-grade`` runs this file with the built venv's python (``-I``: no PYTHONPATH, no script
directory on sys.path) when ``$HANGAR_TEST_PYTHON`` is set. The venv has the repo's
dependencies and the pinned pytest, but not hangar: ``hangar_dagster/__init__`` imports pydantic
and more, and putting hangar's site-packages on sys.path would let its packages stand in for the
repo's. So the two packages the plugins live in are registered by path, without running their
``__init__`` (the plugins, ``reporter``, ``identity`` and ``pytest_plugin``, need only the
standard library and pytest), before pytest starts with the arguments given.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path


def register_plugin_packages(package_dir: Path) -> None:
    """Make ``hangar_dagster`` and ``hangar_dagster.grading`` importable from ``package_dir``."""
    for name, path in (
        ("hangar_dagster", package_dir),
        ("hangar_dagster.grading", package_dir / "grading"),
    ):
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(path)]
        module = types.ModuleType(name)
        module.__spec__ = spec
        module.__path__ = [str(path)]
        sys.modules[name] = module
    sys.modules["hangar_dagster"].grading = sys.modules["hangar_dagster.grading"]  # type: ignore[attr-defined]


def main() -> int:
    register_plugin_packages(Path(__file__).resolve().parents[1])
    import pytest  # the build's pinned runner, imported after the packages are in place

    return int(pytest.main(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
