"""The runner environment as made on the host: compiled once, and a hangar-grade that starts light."""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys
from pathlib import Path

import pytest

from hangar_dagster.environment.build import Built
from hangar_dagster.environment.runner import ensure_runner, grade_bin, site_packages
from hangar_dagster.settings import Settings

pytestmark = pytest.mark.integration

FIXED = "def add(a, b):\n    return a + b\n"
HIDDEN_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A runner made in a home of this module's own (not the session's shared one)."""
    home = tmp_path_factory.mktemp("runner-home")
    return ensure_runner(Settings.from_env({"HANGAR_HOME": str(home)}))


def test_the_runner_is_compiled_once_with_checked_hash_pycs(runner: Built) -> None:
    # Every grade runs pytest with -B from this read-only venv: without bytecode here, each
    # one compiled pytest anew (the runner used to hold no .pyc at all).
    site = site_packages(runner.venv)
    sources = sorted(site.rglob("*.py"))
    assert any(p.name == "python.py" and p.parent.name == "_pytest" for p in sources)
    for source in sources:
        pyc = Path(importlib.util.cache_from_source(str(source)))
        assert pyc.is_file(), f"no bytecode for {source}"
        header = pyc.read_bytes()[:16]
        # PEP 552 flags: bit 0 hash-based, bit 1 check the source: checked-hash.
        assert int.from_bytes(header[4:8], "little") == 0b11, pyc
        assert header[8:16] == importlib.util.source_hash(source.read_bytes()), pyc
    # Compiled in a temporary directory, but naming the venv's final place in tracebacks.
    code = marshal.loads((Path(importlib.util.cache_from_source(str(sources[0])))).read_bytes()[16:])  # fmt: skip
    assert code.co_filename == str(sources[0]), code.co_filename


def test_grade_bins_hangar_grade_runs_the_runner_script_with_a_bare_interpreter(
    runner: Built, tmp_path: Path
) -> None:
    script = grade_bin(runner) / "hangar-grade"
    assert script.is_file() and not script.is_symlink(), script
    # Hangar's console script imported the hangar_dagster package (pydantic and all) in every
    # grade; this one runs grading/hangar_grade.py by path with -I -S, where that package
    # cannot even be found.
    assert script.read_text().splitlines()[0] == f"#!{sys.executable} -IS"
    bare = subprocess.run(
        [sys.executable, "-IS", "-c", "import hangar_dagster"], capture_output=True, text=True
    )
    assert bare.returncode != 0 and "No module named 'hangar_dagster'" in bare.stderr
    usage = subprocess.run([str(script)], capture_output=True, text=True, env={}, timeout=60)
    assert usage.returncode == 2 and "usage: hangar-grade pytest" in usage.stderr, usage.stderr
    # A real run through it, with the runner's python as the grader sets it.
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "calc.py").write_text(FIXED)
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "test_calc_hidden.py").write_text(HIDDEN_TEST)
    env = {
        "HANGAR_HIDDEN_TESTS": str(tmp_path / "hidden"),
        "HANGAR_REPO": str(tmp_path / "repo"),
        "HANGAR_GRADE_JUNIT": str(tmp_path / "junit.xml"),
        "HANGAR_TEST_PYTHON": str(runner.python),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        [str(script), "pytest", "-q"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert 'tests="1"' in (tmp_path / "junit.xml").read_text()


@pytest.mark.needs_sandbox("bwrap")
def test_an_agents_python_reads_precompiled_bytecode_and_writes_none_in_the_repo(
    runner: Built, tmp_path: Path
) -> None:
    """Regression: agents run Python under PYTHONPYCACHEPREFIX (NO_BYTECODE_ENV), where Python
    ignores every __pycache__, so each start compiled the stdlib and pytest from source (about
    0.45 CPU s per `import pytest`). The prefix now holds the runner's and the stdlib's
    bytecode, read-only; what the agent compiles itself still lands there, never in the repo."""
    import sysconfig

    from hangar_dagster.trials.agents import NO_BYTECODE_ENV
    from hangar_dagster.trials.sandbox import SandboxRequest
    from hangar_dagster.trials.sandbox.bwrap import BwrapSandbox

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(FIXED)
    script = (
        "import compileall, json, pytest, sys\n"
        "print('compiled', compileall.compile_file('calc.py', quiet=1))\n"
        "print('cached', json.__cached__)\n"
    )
    request = SandboxRequest(
        argv=["python", "-v", "-c", script],
        workdir=repo,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", **NO_BYTECODE_ENV},
        timeout_s=120,
    )
    result = runner.sandbox(BwrapSandbox(), repo).run(request)
    assert result.exit_code == 0, result.stderr[-3000:]
    prefix = NO_BYTECODE_ENV["PYTHONPYCACHEPREFIX"]
    loaded = [
        line.split("'")[1]
        for line in result.stderr.splitlines()
        if line.startswith("# code object from '")
    ]
    stdlib = prefix + sysconfig.get_paths()["stdlib"] + "/json/__init__."
    pytest_pkg = prefix + str(site_packages(runner.venv)) + "/_pytest/"
    assert any(p.startswith(stdlib) for p in loaded), loaded[:20]
    assert any(p.startswith(pytest_pkg) for p in loaded), loaded[:20]
    assert "compiled True" in result.stdout, result.stdout + result.stderr[-2000:]
    assert not list(repo.rglob("__pycache__")) and not list(repo.rglob("*.pyc"))
