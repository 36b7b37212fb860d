"""Every common test style grades right: unittest, pytest functions/classes/fixtures/marks, doctests.

Each style is a set of hidden files over the ``calc.add`` task repo, graded
through the real grader and sandbox (``run_grader`` with ``hangar-grade``):
the honest fix passes with the counts plain pytest gives, ``trust:
isolated`` (as root) and no signal; the base and a wrong fix fail; a skip,
xfail or exit raised from the repo's code is a fatal tamper signal.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from grading_builders import FIXED, PatchMaker, experiment

from hangar_dagster.grading.grader import GraderRun, grade_trust, run_grader
from hangar_dagster.settings import HangarPaths

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

TRUST = "isolated" if os.geteuid() == 0 else "best_effort"
WRONG = "def add(a, b):\n    return 5\n"

UNITTEST = {
    "test_unit.py": """\
import unittest

from calc import add

EVENTS = []


def setUpModule():
    EVENTS.append("module")


def tearDownModule():
    EVENTS.clear()


class TestAdd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.base = 2

    @classmethod
    def tearDownClass(cls):
        del cls.base

    def setUp(self):
        self.other = 3

    def tearDown(self):
        self.other = None

    def test_add(self):
        self.assertEqual(add(self.base, self.other), 5)
        self.assertEqual(EVENTS, ["module"])

    def test_subtests(self):
        for a, b, total in [(1, 1, 2), (2, 5, 7), (0, 4, 4)]:
            with self.subTest(a=a, b=b):
                self.assertEqual(add(a, b), total)

    def test_zero(self):
        self.assertEqual(add(0, 0), 0)

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(add(1, 1), 3)

    @unittest.skip("not today")
    def test_skipped(self):
        self.fail("never runs")

    @unittest.skipIf(True, "condition holds")
    def test_skipped_if(self):
        self.fail("never runs")

    def test_skip_in_body(self):
        self.skipTest("skipped from the test itself")


@unittest.skip("the whole class")
class TestSkippedClass(unittest.TestCase):
    def test_never(self):
        self.fail("never runs")
""",
}
# Fixed: 3 passed (add, subtests, zero); 5 skipped (the expected failure, 2 skip marks, skipTest,
# the skipped class): JUnit counts an xfail as skipped, and subtests not at all. On base test_add
# and test_subtests fail.
UNITTEST_FIXED = {"total": 8, "passed": 3, "failed": 0, "errors": 0, "skipped": 5}
UNITTEST_BASE = {"total": 8, "passed": 1, "failed": 2, "errors": 0, "skipped": 5}

PYTEST = {
    "conftest.py": """\
import pytest


@pytest.fixture
def pair():
    return (2, 3)


@pytest.fixture(params=[(1, 1, 2), (4, 5, 9)])
def triple(request):
    yield request.param
""",
    "test_style.py": """\
import pytest

from calc import add


@pytest.fixture
def offset():
    yield 10


def test_function(pair):
    assert add(*pair) == 5


@pytest.mark.parametrize(("a", "b", "total"), [(1, 2, 3), (0, 0, 0), (-1, 1, 0)])
def test_parametrized(a, b, total):
    assert add(a, b) == total


def test_param_fixture(triple):
    a, b, total = triple
    assert add(a, b) == total


class TestClass:
    def setup_method(self):
        self.a = 7

    def test_method(self, offset):
        assert add(self.a, offset) == 17

    def test_zero(self):
        assert add(0, 0) == 0


@pytest.mark.xfail(reason="known wrong", strict=False)
def test_xfail_lax():
    assert add(1, 1) == 3


@pytest.mark.xfail(reason="known wrong", strict=True)
def test_xfail_strict():
    assert add(1, 1) == 3


@pytest.mark.xfail(reason="runs at all?", run=False)
def test_xfail_not_run():
    assert False


@pytest.mark.skip(reason="not today")
def test_skip_mark():
    assert False


@pytest.mark.skipif(True, reason="condition holds")
def test_skipif_mark():
    assert False


def test_skip_in_body():
    pytest.skip("skipped by the test itself")


def test_xfail_in_body():
    pytest.xfail("xfailed by the test itself")
""",
}
# Fixed: function, 3 parametrized, 2 param fixture, 2 methods = 8 passed; 7 skipped (2 xfail marks
# that fail, xfail run=False, 2 skip marks, skip and xfail in the body). On base: function,
# param fixture, method and the (1, 2, 3) / (-1, 1, 0) cases fail.
PYTEST_FIXED = {"total": 15, "passed": 8, "failed": 0, "errors": 0, "skipped": 7}
PYTEST_BASE = {"total": 15, "passed": 2, "failed": 6, "errors": 0, "skipped": 7}

DOCTEST = {
    "test_doc.py": '''\
def test_plain():
    from calc import add

    assert add(1, 2) == 3


def documented():
    """
    >>> from calc import add
    >>> add(2, 3)
    5
    """
''',
    "test_readme.txt": ">>> from calc import add\n>>> add(20, 22)\n42\n",
}
# A test function, a docstring's doctest (--doctest-modules) and a text file's (test*.txt).
DOCTEST_FIXED = {"total": 3, "passed": 3, "failed": 0, "errors": 0, "skipped": 0}
DOCTEST_BASE = {"total": 3, "passed": 0, "failed": 3, "errors": 0, "skipped": 0}


def grade(
    task_repo: tuple[Path, str],
    hidden: dict[str, str],
    patch: str,
    paths: HangarPaths,
    command: str = "hangar-grade pytest -q",
) -> tuple[GraderRun, str]:
    repo, base = task_repo
    exp = experiment(
        {"t1": {"repo": str(repo), "base_sha": base, "hidden_files": hidden}},
        grader={"command": command},
    )
    run = run_grader(
        exp, "t1", patch, label="styles", work_root=paths.work / "grading", env_extra={}
    )
    return run, grade_trust(exp.spec.grader, run.uid_split)


@pytest.fixture
def hpaths(tmp_path: Path) -> HangarPaths:
    return HangarPaths(tmp_path / "home")


STYLES = [
    pytest.param(UNITTEST, "hangar-grade pytest -q", UNITTEST_FIXED, UNITTEST_BASE, id="unittest"),
    pytest.param(PYTEST, "hangar-grade pytest -q", PYTEST_FIXED, PYTEST_BASE, id="pytest"),
    pytest.param(
        DOCTEST, "hangar-grade pytest -q --doctest-modules", DOCTEST_FIXED, DOCTEST_BASE,
        id="doctest",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("hidden", "command", "fixed", "base"), STYLES)
def test_honest_fix_passes_clean_and_base_fails(
    task_repo: tuple[Path, str],
    make_patch: PatchMaker,
    hpaths: HangarPaths,
    hidden: dict[str, str],
    command: str,
    fixed: dict[str, int],
    base: dict[str, int],
) -> None:
    run, trust = grade(task_repo, hidden, make_patch({"calc.py": FIXED}), hpaths, command)
    assert (run.passed, run.reason, run.counts) == (True, None, fixed), run.output
    assert (trust, run.run_signals) == (TRUST, ())

    run, trust = grade(task_repo, hidden, "", hpaths, command)
    assert (run.passed, run.reason, run.counts) == (False, None, base), run.output
    assert (trust, run.run_signals) == (TRUST, ())

    run, _ = grade(task_repo, hidden, make_patch({"calc.py": WRONG}), hpaths, command)
    assert run.passed is False and run.counts["failed"] > 0, run.output


# Repo code that turns the hidden tests' failures into skips / xfails / an early exit.
SKIP_FROM_REPO = {
    "unittest-skiptest": "import unittest\n\n\ndef add(a, b):\n    raise unittest.SkipTest('no')\n",
    "pytest-skip": "import pytest\n\n\ndef add(a, b):\n    pytest.skip('no')\n",
    "pytest-xfail": "import pytest\n\n\ndef add(a, b):\n    pytest.xfail('no')\n",
    "pytest-exit": "import pytest\n\n\ndef add(a, b):\n    pytest.exit('no', returncode=0)\n",
}


@pytest.mark.parametrize("style", ["unittest", "pytest"])
@pytest.mark.parametrize("how", sorted(SKIP_FROM_REPO))
def test_skip_xfail_or_exit_raised_by_repo_code_is_fatal(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths, style: str, how: str
) -> None:
    hidden = UNITTEST if style == "unittest" else PYTEST
    run, _ = grade(task_repo, hidden, make_patch({"calc.py": SKIP_FROM_REPO[how]}), hpaths)
    assert run.passed is False, run.output
    fatal = [s for s in run.run_signals if "repo code raised" in s]
    assert fatal and "(calc.py)" in fatal[0], run.run_signals
    assert run.reason is not None and "tamper: repo code raised" in run.reason


def test_skip_raised_by_repo_code_in_a_fixture_is_fatal(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths
) -> None:
    # The hidden fixture calls the repo while the test is set up: a skip there hides the test,
    # and the unrelated test alone would pass the grade.
    hidden = {
        "test_fixture.py": (
            "import pytest\n\nfrom calc import add\n\n\n"
            "@pytest.fixture\ndef total():\n    return add(2, 3)\n\n\n"
            "def test_total(total):\n    assert total == 5\n\n\n"
            "def test_unrelated():\n    assert 1 + 1 == 2\n"
        )
    }
    patch = make_patch({"calc.py": SKIP_FROM_REPO["pytest-skip"]})
    run, _ = grade(task_repo, hidden, patch, hpaths)
    assert run.passed is False
    assert any("repo code raised Skipped (calc.py)" in s for s in run.run_signals), run.run_signals


def test_unittest_failure_swallowed_as_an_expected_one_is_not_a_pass(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths
) -> None:
    # The repo tells the running unittest outcome to expect a failure: the failed assertion is
    # then kept aside, and since the test method itself carries no expectedFailure, unittest
    # ends by calling addSuccess (pytest: passed). Only the outcome's kept failure tells.
    calc = (
        "import sys\n\n\n"
        "def add(a, b):\n"
        "    test = sys._getframe(1).f_locals.get('self')\n"
        "    if test is not None and test._outcome is not None:\n"
        "        test._outcome.expecting_failure = True\n"
        "    return a - b\n"
    )
    hidden = {
        "test_unit.py": (
            "import unittest\n\nfrom calc import add\n\n\n"
            "class TestAdd(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
            "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n"
        )
    }
    run, _ = grade(task_repo, hidden, make_patch({"calc.py": calc}), hpaths)
    assert run.passed is False, run.output
    assert run.counts["passed"] == 2, run.output  # pytest itself was fooled
    assert run.reason is not None and "saw no clean call: test_unit.TestAdd::test_add" in run.reason


def test_unittest_result_methods_replaced_by_repo_code_are_fatal(
    task_repo: tuple[Path, str], make_patch: PatchMaker, hpaths: HangarPaths
) -> None:
    # unittest reports a failure by calling the result (pytest's item): the repo rewires that.
    calc = (
        "import unittest\n\n"
        "unittest.TestCase.run = lambda self, result=None: result.addSuccess(self)\n\n\n"
        "def add(a, b):\n    return a - b\n"
    )
    run, _ = grade(task_repo, UNITTEST, make_patch({"calc.py": calc}), hpaths)
    assert run.passed is False, run.output
    assert run.reason is not None and "pytest internals replaced" in run.reason
    assert "TestCase.run" in run.reason
