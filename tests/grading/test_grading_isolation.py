"""What the grader command sees of the host: no network but loopback, no variable of its parent.

Each test runs a real grader (``run_grader``, the bwrap sandbox) whose hidden
tests assert on what they observe from inside.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from grading_builders import experiment

from hangar_dagster.grading.grader import PRISTINE, run_grader
from hangar_dagster.settings import HangarPaths, paths

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

# Every variable the grader sets (docs/grading.md), and those a plain pytest run adds itself.
GRADER_ENV = {
    "HANGAR_HIDDEN_TESTS", "HANGAR_REPO", "HANGAR_GRADE_OUT", "HANGAR_GRADE_JUNIT",
    "HANGAR_GRADE_REPORT", "HANGAR_TRIAL", "HANGAR_TASK", "HANGAR_VARIANT", "HANGAR_EXPERIMENT",
    "HANGAR_PYTHONPATH", "HANGAR_REPO_MODULES", "HANGAR_TEST_PYTHON", "VIRTUAL_ENV",
    "PATH", "HOME", "LANG",
}  # fmt: skip
PYTEST_OWN = {"PYTEST_CURRENT_TEST", "PYTEST_VERSION"}
# What /bin/sh exports of its own to what it runs.
SHELL_OWN = {"PWD", "OLDPWD", "SHLVL", "_"}
SECRET = "HANGAR_TEST_PARENT_SECRET"
SECRET_VALUE = "planted-by-the-parent-7f3a"

NETWORK_TEST = (
    "import socket\n\n\n"
    "def test_only_loopback():\n"
    "    names = sorted(name for _, name in socket.if_nameindex())\n"
    "    assert names == ['lo'], names\n"
)
ENV_TEST = (
    "import os\n\n\n"
    "def test_nothing_of_the_parent():\n"
    f"    assert {SECRET!r} not in os.environ\n"
    f"    assert not [k for k, v in os.environ.items() if {SECRET_VALUE!r} in v]\n\n\n"
    "def test_only_the_grader_variables():\n"
    f"    allowed = {sorted(GRADER_ENV | PYTEST_OWN | SHELL_OWN)!r}\n"
    "    assert sorted(set(os.environ) - set(allowed)) == []\n"
    "    assert os.environ['HOME'] == '/tmp' and os.environ['LANG'] == 'C.UTF-8'\n"
)
# A plain pytest, not hangar-grade (which rebuilds its own environment from a fixed list):
# its tests see the grader command's environment as the sandbox gave it.
PLAIN_PYTEST = (
    'python -m pytest -q -p no:cacheprovider --junitxml "$HANGAR_GRADE_JUNIT" '
    '"$HANGAR_HIDDEN_TESTS"'
)


@pytest.fixture
def hpaths(hangar_home: Path) -> HangarPaths:
    return paths()


def grade_base(
    task_repo: tuple[Path, str], hpaths: HangarPaths, hidden: dict[str, str], command: str
) -> tuple[bool, dict[str, int], str]:
    repo, base = task_repo
    exp = experiment(
        {"t1": {"repo": str(repo), "base_sha": base, "hidden_files": hidden}},
        grader={"command": command},
    )
    run = run_grader(exp, "t1", "", label="isolation", work_root=hpaths.work, env_extra={})
    return run.passed, run.counts, run.output


@pytest.mark.parametrize("command", ["hangar-grade pytest -q", PLAIN_PYTEST])
def test_grader_command_sees_no_network_interface_but_loopback(
    command: str, task_repo: tuple[Path, str], hpaths: HangarPaths
) -> None:
    passed, counts, output = grade_base(task_repo, hpaths, {"test_net.py": NETWORK_TEST}, command)
    assert passed is True and counts["passed"] == 1, output


def test_grader_command_environment_has_nothing_of_its_parent(
    task_repo: tuple[Path, str], hpaths: HangarPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET, SECRET_VALUE)
    monkeypatch.setenv("PYTHONPATH", "/planted/by/the/parent")
    passed, counts, output = grade_base(task_repo, hpaths, {"test_env.py": ENV_TEST}, PLAIN_PYTEST)
    assert passed is True and counts["passed"] == 2, output


TAMPER_TEST = (
    "import os\nfrom pathlib import Path\n\n\n"
    "def test_tamper_with_the_checkout():\n"
    "    repo = Path(os.environ['HANGAR_REPO'])\n"
    "    (repo / 'calc.py').write_text('def add(a, b):\\n    return a + b\\n')\n"
    "    (repo / 'planted.txt').write_text('left for the next grade')\n"
    "    (repo / '.git' / 'config').write_text('[core]\\n\\tfsmonitor = planted\\n')\n"
)
PRISTINE_TEST = (
    "import os\nfrom pathlib import Path\n\n\n"
    "def test_the_checkout_is_the_base():\n"
    "    repo = Path(os.environ['HANGAR_REPO'])\n"
    "    assert (repo / 'calc.py').read_text() == 'def add(a, b):\\n    return a - b\\n'\n"
    "    assert not (repo / 'planted.txt').exists()\n"
    "    assert 'planted' not in (repo / '.git' / 'config').read_text()\n"
)


def test_what_a_grade_does_to_its_checkout_never_reaches_the_next_grade(
    task_repo: tuple[Path, str], hpaths: HangarPaths
) -> None:
    # Every grade of a base copies one pristine clone kept beside the grades (gitrepo.cached_clone).
    passed, _, output = grade_base(task_repo, hpaths, {"test_t.py": TAMPER_TEST}, "hangar-grade pytest -q")  # fmt: skip
    assert passed is True, output
    passed, counts, output = grade_base(task_repo, hpaths, {"test_p.py": PRISTINE_TEST}, "hangar-grade pytest -q")  # fmt: skip
    assert passed is True and counts["passed"] == 1, output
    assert len(list((hpaths.work / PRISTINE).iterdir())) == 1  # made once, copied twice
