"""The suite's own rules (tests/conftest.py): every test has one tier, and CI never skips a sandbox.

The static checks (ruff, mypy) are not tests: scripts/test runs them before pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ALLOW_MISSING_SANDBOX, ROOT

pytestmark = pytest.mark.unit


def pytest_on(tmp_path: Path, source: str, *args: str, **env: str) -> str:
    """Run pytest with the suite's conftest and settings on one small module; PATH has no bwrap.

    Returns pytest's output, with its exit code on the last line.
    """
    (tmp_path / "test_tiny.py").write_text(source)
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in ("CI", ALLOW_MISSING_SANDBOX)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
         "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", *args, str(tmp_path)],
        cwd=ROOT, env=inherited | {"PATH": str(empty)} | env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return f"{done.stdout}{done.stderr}\nexit {done.returncode}"


NEEDS_BWRAP = """
import pytest
pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]
def test_isolated():
    assert True
"""


def test_in_ci_a_missing_backend_fails_naming_it_and_the_opt_out(tmp_path: Path) -> None:
    out = pytest_on(tmp_path, NEEDS_BWRAP, CI="true")
    assert out.endswith("exit 1"), out
    assert "1 error" in out and "bwrap (Debian package bubblewrap)" in out, out
    assert f"{ALLOW_MISSING_SANDBOX}=1" in out, out


@pytest.mark.parametrize(
    "env", [{}, {"CI": "true", ALLOW_MISSING_SANDBOX: "1"}], ids=["developer", "ci-opted-out"]
)
def test_elsewhere_or_opted_out_a_missing_backend_skips(
    tmp_path: Path, env: dict[str, str]
) -> None:
    out = pytest_on(tmp_path, NEEDS_BWRAP, "-rs", **env)
    assert out.endswith("exit 0") and "1 skipped" in out, out
    assert "needs bwrap (Debian package bubblewrap)" in out, out


def test_a_module_without_a_tier_fails_the_run(tmp_path: Path) -> None:
    out = pytest_on(tmp_path, "def test_anything():\n    assert True\n")
    assert out.endswith("exit 4"), out  # a usage error: nothing ran
    assert "test_tiny.py: no tier" in out, out


MIXED = """
import pytest
pytestmark = pytest.mark.unit
def test_fast():
    assert True
@pytest.mark.slow
def test_end_to_end():
    assert True
@pytest.mark.needs_sandbox("unshare")
def test_in_a_sandbox():
    assert True
"""


@pytest.mark.parametrize(
    ("tier", "selected"),
    [("unit", "test_fast"), ("slow", "test_end_to_end"), ("integration", "test_in_a_sandbox")],
)
def test_a_tests_own_tier_wins_over_its_modules(tmp_path: Path, tier: str, selected: str) -> None:
    out = pytest_on(tmp_path, MIXED, "--collect-only", "-m", tier)
    assert out.endswith("exit 0"), out
    assert [line.split("::")[1] for line in out.splitlines() if "::" in line] == [selected], out
