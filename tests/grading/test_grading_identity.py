"""The pristine-code and per-test boundary checks (``identity.py``) leave honest hidden tests alone.

The adversarial suite shows what they catch (``swap_hidden_module``, ``reclass_hidden_module``,
``wrap_hidden_tests``, ``builtin_until_teardown``, ...). Here: the digest they compare, and
hidden tests that do on purpose what those checks watch (patch a builtin with ``monkeypatch``
or ``mock.patch``, wrap their own tests, inherit tests from a hidden helper module, make tests
in a factory), graded with the honest fix: a clean pass; with the base: a plain failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from grading_builders import FIXED, PatchMaker
from test_grading_styles import TRUST, grade

from hangar_dagster.grading.identity import code_digest, pristine_digests
from hangar_dagster.settings import HangarPaths

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

SOURCE = "def test_add():\n    expected = 5\n    assert 2 + 3 == expected\n"


def function_code(source: str, filename: str) -> object:
    code = compile(source, filename, "exec", dont_inherit=True)  # not this file's __future__
    return next(c for c in code.co_consts if hasattr(c, "co_code"))


def test_digest_is_what_code_does_not_where_it_claims_to_come_from() -> None:
    here = function_code(SOURCE, "/hidden/test_a.py")
    assert code_digest(here) == code_digest(function_code(SOURCE, "<string>"))  # type: ignore[arg-type]
    moved = "\n\n" + SOURCE  # other line numbers
    assert code_digest(here) == code_digest(function_code(moved, "x.py"))  # type: ignore[arg-type]
    for other in (SOURCE.replace("5", "6"), SOURCE.replace("expected", "wanted"),
                  SOURCE.replace("2 + 3", "2 - 3"), "def test_add():\n    pass\n"):  # fmt: skip
        assert code_digest(here) != code_digest(function_code(other, "/hidden/test_a.py"))  # type: ignore[arg-type]


def test_pristine_digests_cover_plain_and_rewritten_code_and_nested_functions(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_a.py").write_text(
        SOURCE + "\n\nclass TestB:\n    def test_c(self):\n        f = lambda: 1\n"
        "        assert f() == 1\n"
    )
    (tmp_path / "broken.py").write_text("def (:\n")  # left out: pytest reports it itself
    found = pristine_digests(str(tmp_path))
    assert {"test_add", "TestB", "TestB.test_c", "TestB.test_c.<locals>.<lambda>"} <= set(found)
    assert len(found["test_add"]) == 2  # plain and as pytest's assertion rewriting makes it
    plain = function_code(SOURCE, "elsewhere.py")
    assert code_digest(plain) in found["test_add"]  # type: ignore[arg-type]


HONEST = {
    "helpers.py": (
        "from calc import add\n\n\n"
        "class Shared:\n    def test_inherited(self):\n        assert add(1, 1) == 2\n"
    ),
    "test_honest.py": """\
import builtins
import functools
from unittest import mock

import pytest

from calc import add
from helpers import Shared


def retried(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


def test_monkeypatched_builtin(monkeypatch):
    monkeypatch.setattr(builtins, "input", lambda prompt="": "2")
    assert add(int(input()), 3) == 5


@pytest.fixture
def quiet_print(monkeypatch):
    monkeypatch.setattr(builtins, "print", lambda *a, **k: None)


def test_builtin_patched_in_a_fixture(quiet_print):
    print("hidden")
    assert add(2, 2) == 4


@mock.patch("builtins.open", mock.mock_open(read_data="7"))
def test_mock_patched_open():
    with open("anything") as f:
        assert add(int(f.read()), 0) == 7


@retried
def test_own_decorator():
    assert add(3, 3) == 6


def make(a, b, total):
    def test():
        assert add(a, b) == total

    return test


test_made = make(4, 5, 9)


class TestInherits(Shared):
    pass
""",
}


def test_honest_tests_that_patch_builtins_and_wrap_themselves_pass_clean(
    task_repo: tuple[Path, str], make_patch: PatchMaker, tmp_path: Path
) -> None:
    paths = HangarPaths(tmp_path / "home")
    run, trust = grade(task_repo, HONEST, make_patch({"calc.py": FIXED}), paths)
    assert (run.passed, run.reason, run.counts["passed"]) == (True, None, 6), run.output
    assert (trust, run.run_signals) == (TRUST, ())
    run, trust = grade(task_repo, HONEST, "", paths)
    assert (run.passed, run.reason, run.counts["failed"]) == (False, None, 5), run.output
    assert (trust, run.run_signals) == (TRUST, ())
