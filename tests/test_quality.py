"""The package stays strictly typed and lint-clean (mypy --strict, ruff with DTZ)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_mypy_strict_on_the_package() -> None:
    result = run("mypy", "--no-incremental", "hangar_dagster")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_on_package_tests_benchmarks_and_examples() -> None:
    result = run("ruff", "check", "--no-cache", "hangar_dagster", "tests", "benchmarks", "examples")
    assert result.returncode == 0, result.stdout + result.stderr
