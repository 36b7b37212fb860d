"""The folder is the architecture: one package per room, and only orchestration imports dagster."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "hangar_dagster"

# The rooms (docs/architecture.md); a new one is added here and in the docs together.
ROOMS = {
    "experiment",
    "trials",
    "environment",
    "grading",
    "results",
    "queue",
    "orchestration",
    "cli",
    "standins",
    "util",
    "shadow",
}
TOP_MODULES = {"__init__.py", "settings.py"}


def dagster_imports(path: Path) -> list[str]:
    """Every `import dagster...` / `from dagster... import` in the file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] == "dagster"]
    return found


def outside_orchestration() -> list[str]:
    return sorted(
        p.relative_to(PACKAGE.parent).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "orchestration" not in p.relative_to(PACKAGE).parts
    )


def test_the_scan_sees_nested_and_dotted_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import os, dagster_pipes\n"
        "from . import dagster\n"
        "def f():\n"
        "    import dagster.core as dc\n"
        "    from dagster import asset\n"
    )
    assert dagster_imports(src) == ["line 4: dagster.core", "line 5: dagster"]


@pytest.mark.parametrize("module", outside_orchestration())
def test_only_orchestration_imports_dagster(module: str) -> None:
    assert dagster_imports(PACKAGE.parent / module) == []


def test_the_package_has_only_its_rooms_and_top_modules() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert packages - ROOMS == set(), "a new room goes in ROOMS and docs/architecture.md together"
    assert modules - TOP_MODULES == set(), "a flat module belongs in one of the rooms"


# The attack suite stands apart: it is run through the grader but attacks whatever runs it.
# tests/deploy/ mirrors the repo's deploy/ (compose, Dockerfiles, instance YAML), not a room.
TEST_ONLY_FOLDERS = {"adversarial", "deploy"}


def test_the_tests_mirror_the_rooms() -> None:
    tests = PACKAGE.parent / "tests"
    folders = {p.relative_to(tests).parts[0] for p in tests.glob("*/**/test_*.py")}
    assert folders - ROOMS - TEST_ONLY_FOLDERS == set(), (
        "tests/<room>/ mirrors hangar_dagster/<room>/"
    )
    for sub in tests.glob("*/*/"):
        if sub.is_dir() and any(sub.glob("test_*.py")):
            room = PACKAGE / sub.relative_to(tests)
            assert room.is_dir(), f"{sub} has no package folder {room} to mirror"


def test_every_data_file_of_the_package_is_installed_with_it() -> None:
    # The bug: package-data listed "*.json", which setuptools globs in the package's own
    # directory only, so the wheel (the project image, deploy/docker) had no
    # experiment/model_lists.json and no orchestration/dagster.yaml: submit failed there.
    import glob
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["hangar_dagster"]
    shipped = {p for pattern in patterns for p in glob.glob(pattern, root_dir=PACKAGE)}
    data = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    assert data - shipped == set()
