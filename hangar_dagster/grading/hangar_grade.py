"""``hangar-grade``: run a grader's hidden tests so that nothing the patch added loads first.

``hangar-grade pytest [args]`` replaces itself (``os.execve``) with

    python -I -B --check-hash-based-pycs always -m pytest -p no:cacheprovider --noconftest
        -c /dev/null -o addopts= ... --rootdir $HANGAR_HIDDEN_TESTS
        -p hangar_dagster.grading.reporter -p hangar_dagster.grading.pytest_plugin
        --junitxml $HANGAR_GRADE_JUNIT [args] $HANGAR_HIDDEN_TESTS

from the hidden tests directory, with an environment built from scratch:

* ``-I``: no PYTHONPATH or other PYTHON* variables, no user site, no script
  directory or cwd on sys.path, so a sitecustomize.py / usercustomize.py in the
  repo never runs; ``-B`` and PYTHONDONTWRITEBYTECODE: no bytecode left behind.
* ``--noconftest``: no conftest.py is loaded, the repo's included.
* ``-c /dev/null``, ``-o addopts=`` and ``--rootdir``: no pytest.ini, tox.ini,
  setup.cfg or pyproject.toml of the repo is read.
* PYTEST_DISABLE_PLUGIN_AUTOLOAD, no PYTEST_ADDOPTS / PYTEST_PLUGINS: only
  the plugins named here load; ``-p no:cacheprovider``: no cache written.
* the repo reaches sys.path only through ``pytest_plugin`` once pytest runs;
  ``reporter`` (the trusted reporter) loads first of all.
* ``--check-hash-based-pycs always``: a hash-based .pyc is checked against
  its source (the grader also deletes every .pyc of the repo before the run).
* ``HYPOTHESIS_STORAGE_DIRECTORY``: a fresh private directory, since the cwd (the hidden
  tests) is read-only (docs/grading.md, "Hypothesis").

The ``args`` come from the experiment's grader command (the spec's author),
never from the code under test.

With an environment build (``$HANGAR_TEST_PYTHON``, set by the grader to the build's venv
python), the same command runs in that interpreter instead, through ``runner_bootstrap.py``
(``python -I ... runner_bootstrap.py <the pytest args>``): the repo's dependencies and the
pinned pytest come from the build, the trusted plugins from hangar's read-only package dir.

It runs inside the grader's sandbox and reads the ``HANGAR_`` variables the sandbox was
given (the grader's contract, not operator settings), so it reads its environment itself
(allowed in tests/test_settings_source.py).
"""

from __future__ import annotations

import os
import sys

# Standard library only, and little of it: this file runs in every grade before pytest starts
# (tempfile and pathlib alone took tens of milliseconds to import). mypy reads the names below.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

USAGE = "usage: hangar-grade pytest [pytest args]"
REQUIRED_ENV = ("HANGAR_HIDDEN_TESTS", "HANGAR_REPO", "HANGAR_GRADE_JUNIT")
# The only variables kept from the caller's environment: the grader's own and a few basics.
# A named list, not a HANGAR_* prefix, so nothing can smuggle a variable through by its name.
_KEEP = (
    *REQUIRED_ENV, "HANGAR_GRADE_OUT", "HANGAR_GRADE_REPORT", "HANGAR_TRIAL", "HANGAR_TASK", "HANGAR_VARIANT",
    "HANGAR_EXPERIMENT", "HANGAR_PYTHONPATH", "HANGAR_TEST_PYTHON", "HANGAR_REPO_MODULES", "PATH", "HOME", "LANG",
    "LC_ALL", "TZ",
)  # fmt: skip
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner_bootstrap.py")


class UsageError(Exception):
    pass


def pytest_env(environ: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k in _KEEP}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def pytest_command(
    args: Sequence[str], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str], str]:
    """The argv, environment and working directory ``hangar-grade pytest args`` execs."""
    missing = [name for name in REQUIRED_ENV if not environ.get(name)]
    if missing:
        raise UsageError(
            f"hangar-grade: {', '.join(missing)} not set; hangar-grade runs inside hangar's "
            "grader, which sets them (HANGAR_HIDDEN_TESTS: the hidden tests dir, "
            "HANGAR_REPO: the patched repo, HANGAR_GRADE_JUNIT: where to write the JUnit report)"
        )
    hidden = environ["HANGAR_HIDDEN_TESTS"]
    if not os.path.isdir(hidden):
        raise UsageError(f"hangar-grade: HANGAR_HIDDEN_TESTS={hidden!r} is not a directory")
    python, start = sys.executable, ["-m", "pytest"]
    if test_python := environ.get("HANGAR_TEST_PYTHON"):
        if not os.path.isabs(test_python) or not os.access(test_python, os.X_OK):
            raise UsageError(
                f"hangar-grade: HANGAR_TEST_PYTHON={test_python!r} is not an executable "
                "absolute path (the grader sets it to the environment build's venv python)"
            )
        python, start = test_python, [BOOTSTRAP]
    argv = [
        python, "-I", "-B", "--check-hash-based-pycs", "always", *start,
        "-p", "no:cacheprovider",
        "--noconftest",
        "-c", os.devnull,
        "-o", "addopts=",
        "-o", "python_files=test_*.py *_test.py",
        "--import-mode=prepend",
        "--rootdir", hidden,
        "-p", "hangar_dagster.grading.reporter",
        "-p", "hangar_dagster.grading.pytest_plugin",
        "--junitxml", environ["HANGAR_GRADE_JUNIT"],
        *args,
        hidden,
    ]  # fmt: skip
    # Not the repo: pytest must not find anything of it by looking around its cwd.
    return argv, pytest_env(environ), hidden


def _private_dir(prefix: str) -> str:
    """A new directory only this user can use, in the first writable place of $TMPDIR, /tmp
    and /var/tmp (tempfile.mkdtemp's contract and fallback, without importing tempfile)."""
    for base in (os.environ.get("TMPDIR"), "/tmp", "/var/tmp"):
        if not base:
            continue
        while True:
            path = os.path.join(base, prefix + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            except OSError:
                break  # missing or not writable here: the next place
            return path
    raise OSError("hangar-grade: no writable temporary directory ($TMPDIR, /tmp, /var/tmp)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if not args or args[0] != "pytest":
            raise UsageError(
                f"hangar-grade: unknown subcommand {args[0]!r}; {USAGE}"
                if args
                else f"hangar-grade: {USAGE}"
            )
        command, env, cwd = pytest_command(args[1:], os.environ)
    except UsageError as err:
        print(err, file=sys.stderr)
        return 2
    # hypothesis keeps its example database and caches under .hypothesis in the cwd, the
    # read-only hidden dir: a fresh private directory instead (under the sandbox's own /tmp).
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = _private_dir("hangar-hypothesis-")
    os.chdir(cwd)
    os.execve(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
