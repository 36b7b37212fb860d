"""Real agent CLIs for the adapter tests, installed by the tests themselves at pinned versions.

Installs go into ``$HANGAR_TEST_CACHE`` (default ``~/.cache/hangar-tests``),
one directory per package and version, and are reused once complete. A test
is skipped, with the installer's own words, only when the package registry
cannot be reached; any other install failure fails the test.

``VERSIONS`` is the one place the versions are pinned: the harness locks the
tests freeze and any ``harnesses.lock.yaml`` they write take them from here.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VERSIONS = {
    "@anthropic-ai/claude-code": "2.1.332",
    "@openai/codex": "0.171.0",
    "mini-swe-agent": "2.4.6",
}
INSTALL_TIMEOUT_S = 900
# npm's words for "the registry is not reachable from here".
OFFLINE = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
    r"network request to .* failed|socket hang up",
)
# pip's words for the same.
PIP_OFFLINE = re.compile(
    r"Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|Name or service not known|Connection refused|ConnectTimeoutError|"
    r"Max retries exceeded",
)


def cache_dir() -> Path:
    root = os.environ.get("HANGAR_TEST_CACHE") or "~/.cache/hangar-tests"
    return Path(root).expanduser()


def _installed_version(prefix: Path, package: str) -> str | None:
    manifest = prefix / "node_modules" / package / "package.json"
    try:
        version = json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


def _install(argv: list[str], what: str, offline: re.Pattern[str], scratch: Path) -> str:
    """Run an install command; its output. On failure ``scratch`` is removed and the test skips
    (the registry is unreachable) or fails (anything else)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        shutil.rmtree(scratch, ignore_errors=True)
        pytest.skip(f"{what} did not finish in {INSTALL_TIMEOUT_S}s")
    output = done.stdout + done.stderr
    if done.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        if found := offline.search(output):
            pytest.skip(f"{what}: cannot reach the registry: {found.group(0)}")
        pytest.fail(f"{what} failed:\n{output[-3000:]}")
    return output


def ensure_npm_cli(package: str, version: str, binary: str) -> Path:
    """``binary`` of ``package@version`` installed with npm under the test cache; its path."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed: run scripts/bootstrap (it installs nodejs and npm)")
    prefix = cache_dir() / "npm" / f"{package.lstrip('@').replace('/', '__')}-{version}"
    exe = prefix / "node_modules" / ".bin" / binary
    prefix.parent.mkdir(parents=True, exist_ok=True)
    # Tests in parallel processes wait for one install instead of racing.
    with (prefix.parent / f"{prefix.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.exists() and _installed_version(prefix, package) == version:
            return exe
        staging = prefix.with_name(f"{prefix.name}.installing")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        output = _install(
            [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund"]
            + ["--loglevel=error", f"{package}@{version}"],
            f"npm install {package}@{version}",
            OFFLINE,
            staging,
        )
        if _installed_version(staging, package) != version:
            shutil.rmtree(staging, ignore_errors=True)
            pytest.fail(f"npm install {package}@{version} left another version:\n{output[-3000:]}")
        shutil.rmtree(prefix, ignore_errors=True)
        staging.rename(prefix)
        check_version(exe, version)
    if not exe.exists():
        pytest.fail(f"{package}@{version} installed but has no {binary} in {exe.parent}")
    return exe


def check_version(exe: Path, version: str) -> None:
    """Fail unless ``exe --version`` names ``version`` (a package whose install step did not run
    leaves a stub that prints something else)."""
    done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    if version not in done.stdout:
        pytest.fail(
            f"{exe} --version printed {(done.stdout + done.stderr)[-500:]!r}, not {version}; "
            f"remove {exe.parents[2]} and run the test again"
        )


def ensure_pip_cli(package: str, version: str, binary: str) -> Path:
    """``binary`` of ``package==version`` installed with pip into a venv under the test cache.

    A venv cannot be moved once built (its scripts name its interpreter by path), so it is
    built in place and marked complete by a file written last.
    """
    venv = cache_dir() / "pip" / f"{package}-{version}"
    exe = venv / "bin" / binary
    marker = venv / ".hangar-installed"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == f"{package}=={version}" and exe.exists():
            return exe
        shutil.rmtree(venv, ignore_errors=True)
        # The base interpreter, not this venv's: the sandbox shows sys.base_prefix read-only.
        python = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
        _install(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
            + ["--no-input", "--quiet", f"{package}=={version}"],
            f"pip install {package}=={version}",
            PIP_OFFLINE,
            venv,
        )
        if not exe.exists():
            pytest.fail(f"{package}=={version} installed but has no {binary} in {exe.parent}")
        marker.write_text(f"{package}=={version}")
    return exe
