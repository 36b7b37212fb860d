"""The hidden tests' digest: any change to the pristine copy during a run fails the grade.

The sandbox stops the code under test from changing the hidden files, so these
tests change them from outside it: a real bwrap run, then the change, as if
something had escaped. ``run_grader`` looks up ``get_sandbox`` at call time,
the seam used here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from grading_builders import FIXED, HIDDEN, PatchMaker, experiment

from hangar_dagster.grading import grader
from hangar_dagster.grading.grader import run_grader, tree_digest, write_hidden_files
from hangar_dagster.settings import HangarPaths, paths
from hangar_dagster.trials.sandbox import Sandbox, SandboxRequest, SandboxResult, get_sandbox

pytestmark = pytest.mark.unit

Change = Callable[[Path], None]


def rewrite_test(hidden: Path) -> None:
    target = hidden / "test_calc_hidden.py"
    target.chmod(0o644)
    target.write_text("def test_add():\n    pass\n")


def add_conftest(hidden: Path) -> None:
    hidden.chmod(0o755)
    (hidden / "conftest.py").write_text("x = 1\n")


def chmod_test(hidden: Path) -> None:
    (hidden / "test_calc_hidden.py").chmod(0o666)


def rename_test(hidden: Path) -> None:
    hidden.chmod(0o755)
    (hidden / "test_calc_hidden.py").rename(hidden / "test_calc_hidden.bak")


def link_instead(hidden: Path) -> None:
    hidden.chmod(0o755)
    target = hidden / "test_calc_hidden.py"
    target.unlink()
    target.symlink_to("/dev/null")


CHANGES: dict[str, Change] = {
    "content": rewrite_test,
    "added_conftest": add_conftest,
    "mode": chmod_test,
    "rename": rename_test,
    "symlink": link_instead,
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_tree_digest_sees_every_kind_of_change(change: Change, tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    write_hidden_files(hidden, HIDDEN, "HANGAR-CANARY-feedface")
    before = tree_digest(hidden)
    assert tree_digest(hidden) == before  # stable when nothing changed
    change(hidden)
    assert tree_digest(hidden) != before


@pytest.mark.needs_sandbox("root")  # changing the owner needs root
def test_tree_digest_sees_a_new_owner(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    write_hidden_files(hidden, HIDDEN, "HANGAR-CANARY-feedface")
    before = tree_digest(hidden)
    os.lchown(hidden / "test_calc_hidden.py", 65534, 65534)
    assert tree_digest(hidden) != before


class ChangesHiddenAfterRun(Sandbox):
    """The real bwrap sandbox; once its run is over, ``change`` is applied to the hidden mount."""

    name = "bwrap"

    def __init__(self, change: Change) -> None:
        self.change = change
        self.changed: list[Path] = []

    def run(self, request: SandboxRequest) -> SandboxResult:
        result = get_sandbox("bwrap").run(request)
        (hidden,) = [m.source for m in request.mounts if m.source.name == "hidden"]
        self.change(hidden)
        self.changed.append(hidden)
        return result


@pytest.mark.needs_sandbox("bwrap")
@pytest.mark.parametrize(
    "change", [None, rewrite_test, add_conftest], ids=["none", "content", "added_conftest"]
)
def test_hidden_digest_changed_after_the_run_fails_a_passing_grade(
    change: Change | None, task_repo: tuple[Path, str], make_patch: PatchMaker,
    hangar_home: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    repo, base = task_repo
    exp = experiment({"t1": {"repo": str(repo), "base_sha": base, "hidden_files": HIDDEN}})
    sandbox = ChangesHiddenAfterRun(change or (lambda _hidden: None))
    monkeypatch.setattr(grader, "get_sandbox", lambda _name, **_options: sandbox)
    hp: HangarPaths = paths()
    run = run_grader(exp, "t1", make_patch({"calc.py": FIXED}), label="digest",
                     work_root=hp.work / "grading", env_extra={})  # fmt: skip
    assert len(sandbox.changed) == 1  # the wrapped sandbox really ran
    assert run.exit_code == 0 and run.counts["passed"] == run.counts["total"] > 0, run.output
    if change is None:  # the control: the same fixed patch passes when nothing changed
        assert run.passed is True and run.reason is None and run.run_signals == ()
        return
    assert run.passed is False
    assert run.reason == "the hidden tests' digest changed during the run"
    assert run.run_signals == ("run: hidden tests' digest changed",)
