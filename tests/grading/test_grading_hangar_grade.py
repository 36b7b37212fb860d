"""hangar-grade pytest: the command it execs, and a real run that the repo's tricks cannot bend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from grading_builders import BUGGY, write

from hangar_dagster.environment.build import base_python, runner_requirement
from hangar_dagster.grading.crosscheck import parse_reporter
from hangar_dagster.grading.hangar_grade import BOOTSTRAP, UsageError, main, pytest_command
from hangar_dagster.grading.junit import parse_junit
from tests.buildfixtures import wheelhouse

pytestmark = pytest.mark.integration

HANGAR_GRADE = Path(sys.executable).with_name("hangar-grade")

# Each of these would make the failing hidden test pass, or run code before pytest, if loaded.
TRICKS = {
    "conftest.py": (
        "import pytest\n\n\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n"
        "    outcome.get_result().outcome = 'passed'\n"
    ),
    "pytest.ini": "[pytest]\naddopts = -p no:junitxml --deselect test_calc_hidden.py::test_add\n",
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-k zero'\n",
    "sitecustomize.py": "import os\nos.environ['TRICK_RAN'] = 'sitecustomize ran'\n",
    "hook.pth": "import os; os.environ['TRICK_RAN'] = 'pth ran'\n",
}
HIDDEN_TEST = (
    "import os\n\nfrom calc import add\n\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_nothing_ran_before_pytest():\n"
    "    assert os.environ.get('TRICK_RAN') is None\n"
    "    assert 'PYTEST_ADDOPTS' not in os.environ\n"
)


def env_for(tmp_path: Path) -> dict[str, str]:
    return {
        "HANGAR_HIDDEN_TESTS": str(tmp_path / "hidden"),
        "HANGAR_REPO": str(tmp_path / "repo"),
        "HANGAR_GRADE_JUNIT": str(tmp_path / "out" / "junit.xml"),
    }


def test_command_isolates_python_and_pytest(tmp_path: Path) -> None:
    (tmp_path / "hidden").mkdir()
    environ = {
        **env_for(tmp_path), "PATH": "/usr/bin", "HOME": "/tmp", "PYTEST_ADDOPTS": "-x",
        "PYTEST_PLUGINS": "evil", "PYTHONPATH": "/evil", "PYTHONSTARTUP": "/evil.py",
        "SECRET_TOKEN": "t", "HANGAR_X": "1",
    }  # fmt: skip
    argv, env, cwd = pytest_command(["-q", "-k", "add"], environ)
    assert argv[:7] == [
        sys.executable, "-I", "-B", "--check-hash-based-pycs", "always", "-m", "pytest"
    ]  # fmt: skip
    for flag in ("--noconftest", "-p", "no:cacheprovider", "hangar_dagster.grading.pytest_plugin"):
        assert flag in argv
    # The trusted reporter loads first of hangar's plugins, before anything of the repo.
    plugins = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert plugins == [
        "no:cacheprovider", "hangar_dagster.grading.reporter", "hangar_dagster.grading.pytest_plugin"
    ]  # fmt: skip
    assert argv[argv.index("-c") + 1] == "/dev/null"
    assert argv[argv.index("--rootdir") + 1] == str(tmp_path / "hidden")
    assert argv[argv.index("--junitxml") + 1] == str(tmp_path / "out" / "junit.xml")
    assert "addopts=" in argv
    assert argv[-4:] == ["-q", "-k", "add", str(tmp_path / "hidden")]
    assert cwd == str(tmp_path / "hidden")
    assert env == {
        **env_for(tmp_path), "PATH": "/usr/bin", "HOME": "/tmp",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "usage: hangar-grade pytest"),
        (["jest"], "unknown subcommand 'jest'"),
        (["pytest"], "not set"),
    ],
)
def test_bad_use_exits_2_with_a_clear_message(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HANGAR_HIDDEN_TESTS", "HANGAR_REPO", "HANGAR_GRADE_JUNIT"):
        monkeypatch.delenv(name, raising=False)
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_missing_hidden_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="HANGAR_HIDDEN_TESTS=.* is not a directory"):
        pytest_command([], env_for(tmp_path))


def layout(tmp_path: Path, hidden_inside_repo: bool) -> dict[str, str]:
    """The buggy repo with every trick, and the hidden tests beside it or inside it."""
    repo = tmp_path / "repo"
    hidden = repo / ".hidden" if hidden_inside_repo else tmp_path / "hidden"
    write(repo, {"calc.py": BUGGY, **TRICKS})
    write(hidden, {"test_calc_hidden.py": HIDDEN_TEST})
    (tmp_path / "out").mkdir()
    return {**env_for(tmp_path), "HANGAR_HIDDEN_TESTS": str(hidden)}


def test_control_plain_pytest_is_fooled_by_the_tricks(tmp_path: Path) -> None:
    # Shows the tricks work when loaded, so the test below can fail.
    env = layout(tmp_path, hidden_inside_repo=True)
    hidden = env["HANGAR_HIDDEN_TESTS"]
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", hidden]
    proc = subprocess.run(
        argv,
        cwd=tmp_path / "repo",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "repo")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("hidden_inside_repo", [False, True])
def test_real_run_ignores_repo_conftest_ini_pth_and_env(
    tmp_path: Path, hidden_inside_repo: bool
) -> None:
    # As the grader runs it: from the repo as cwd. PYTEST_ADDOPTS would deselect test_add.
    env = {**layout(tmp_path, hidden_inside_repo), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTEST_ADDOPTS": "-k zero"}  # fmt: skip
    proc = subprocess.run(
        [str(HANGAR_GRADE), "pytest", "-q"], cwd=tmp_path / "repo", env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = parse_junit(tmp_path / "out" / "junit.xml")
    assert result.ok
    assert dict(result.cases) == {
        "test_calc_hidden::test_add": "failed",  # the conftest would have turned this into a pass
        "test_calc_hidden::test_nothing_ran_before_pytest": "passed",
    }
    # No cache and no bytecode written next to the hidden tests or in the repo.
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name in ("__pycache__", ".pytest_cache")]
    assert leftovers == []


def test_real_run_passes_a_fixed_repo(tmp_path: Path) -> None:
    write(tmp_path / "repo", {"calc.py": "def add(a, b):\n    return a + b\n"})
    write(tmp_path / "hidden", {"test_calc_hidden.py": HIDDEN_TEST})
    env = {**env_for(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(HANGAR_GRADE), "pytest", "-q"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert parse_junit(tmp_path / "out" / "junit.xml").counts["passed"] == 2


def test_a_build_python_runs_pytest_through_the_bootstrap(tmp_path: Path) -> None:
    (tmp_path / "hidden").mkdir()
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    environ = {**env_for(tmp_path), "HANGAR_TEST_PYTHON": str(python)}
    argv, env, _ = pytest_command(["-q"], environ)
    assert argv[:6] == [
        str(python),
        "-I",
        "-B",
        "--check-hash-based-pycs",
        "always",
        str(BOOTSTRAP),
    ]
    plain, _, _ = pytest_command(["-q"], env_for(tmp_path))
    assert argv[6:] == plain[7:]  # the same isolation flags, plugins and args after the script
    assert env["HANGAR_TEST_PYTHON"] == str(python)
    for bad in ("python", str(tmp_path / "missing")):
        with pytest.raises(UsageError, match="HANGAR_TEST_PYTHON"):
            pytest_command([], {**env_for(tmp_path), "HANGAR_TEST_PYTHON": bad})


def test_real_run_in_a_venv_without_hangar_loads_the_trusted_plugins(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A build's venv: the base interpreter, pytest, no pydantic, no hangar_dagster.
    venv = tmp_path / "venv"
    subprocess.run([str(base_python()), "-m", "venv", str(venv)], check=True, timeout=300)
    wheels = wheelhouse(tmp_path_factory)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
         "--find-links", str(wheels), runner_requirement()],
        check=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"},
    )  # fmt: skip
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import pydantic"]).returncode
    env = layout(tmp_path, False)
    write(
        tmp_path / "hidden",
        {
            "test_where.py": (
                "import sys\n\n\ndef test_runs_in_the_build_venv():\n"
                f"    assert sys.prefix == {str(venv)!r}\n"
                "    assert 'pydantic' not in sys.modules\n"
                "    assert not any('site-packages' in p and p.startswith(sys.base_prefix)"
                " for p in sys.path)\n"
            )
        },
    )
    env = {
        **env, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
        "HANGAR_TEST_PYTHON": str(venv / "bin" / "python"),
        "HANGAR_GRADE_REPORT": str(tmp_path / "out" / "report.jsonl"),
    }  # fmt: skip
    (tmp_path / "out" / "report.jsonl").touch()  # the grader's pipe, here a file
    proc = subprocess.run(
        [str(HANGAR_GRADE), "pytest", "-q"], cwd=tmp_path / "repo", env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert dict(parse_junit(tmp_path / "out" / "junit.xml").cases) == {
        "test_calc_hidden::test_add": "failed",
        "test_calc_hidden::test_nothing_ran_before_pytest": "passed",
        "test_where::test_runs_in_the_build_venv": "passed",
    }
    # The trusted reporter loaded in the venv's interpreter: its stream starts and ends.
    stream = parse_reporter((tmp_path / "out" / "report.jsonl").read_bytes())
    assert stream.start is not None and stream.ended and not stream.tamper
    assert sorted(stream.calls) == sorted(dict(parse_junit(tmp_path / "out" / "junit.xml").cases))


def test_the_hypothesis_dir_is_new_and_private_to_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hangar_dagster.grading.hangar_grade import _private_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    made = {_private_dir("hangar-hypothesis-") for _ in range(3)}
    assert len(made) == 3  # a new directory each time, never one left by someone else
    for path in made:
        assert Path(path).parent == tmp_path and Path(path).is_dir()
        assert Path(path).stat().st_mode & 0o777 == 0o700


def test_the_hypothesis_dir_falls_back_to_tmp_when_tmpdir_is_unusable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As tempfile.mkdtemp would: a container's $TMPDIR may name a host path it does not have.
    from hangar_dagster.grading.hangar_grade import _private_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path / "not-here"))
    made = Path(_private_dir("hangar-hypothesis-test-"))
    try:
        assert made.parent in (Path("/tmp"), Path("/var/tmp")) and made.is_dir()
        assert made.stat().st_mode & 0o777 == 0o700
    finally:
        made.rmdir()


def test_hangar_grade_starts_on_little_of_the_standard_library(tmp_path: Path) -> None:
    # It runs before pytest in every grade: tempfile, pathlib and runpy cost more to import than
    # the script itself (issue 16 item 4); it must stay on os and sys.
    from hangar_dagster.environment.runner import grade_script

    script = tmp_path / "hangar-grade"
    body = grade_script().split("\n", 1)[1]
    script.write_text(
        "import atexit, sys\n"
        "BIG = {'tempfile', 'pathlib', 'runpy', 'shutil', 'random'}\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules if m in BIG)))\n" + body
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr  # usage: no subcommand given
    assert "usage: hangar-grade pytest" in done.stderr
    assert done.stdout.strip() == "[]", done.stdout
