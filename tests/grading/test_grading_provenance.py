"""Whose code is measured: a repo package named like one hangar has installed is the repo's.

The fixture repo ships a package ``packaging`` (the name of a dependency of hangar and of the
pinned test runner itself) with a bug the installed copy does not have. The hidden tests must
measure the repo's copy: base fails, the reference passes, and a patch that deletes the package
(so that only the installed copy is left to import) fails with the provenance reason.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from grading_builders import commit_all, experiment, write

from hangar_dagster.grading import provenance
from hangar_dagster.grading.grader import GraderRun, check_base, run_grader
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.util.gitrepo import git

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

# The installed packaging lower-cases and dashes names; the repo's base only dashes them.
BUGGY = "import re\n\n\ndef canonicalize_name(name):\n    return re.sub(r'[-_.]+', '-', name)\n"
FIXED = BUGGY.replace("return re.sub(r'[-_.]+', '-', name)", "return re.sub(r'[-_.]+', '-', name).lower()")  # fmt: skip
HIDDEN = {
    "test_names.py": (
        "from packaging.utils import canonicalize_name\n\n\n"
        "def test_lowercases():\n    assert canonicalize_name('Foo_Bar') == 'foo-bar'\n\n\n"
        "def test_dashes():\n    assert canonicalize_name('a_b').replace('A', 'a') == 'a-b'\n"
    )
}


def _diff(repo: Path, change: dict[str, str | None]) -> str:
    for rel, text in change.items():
        if text is None:
            (repo / rel).unlink()
        else:
            write(repo, {rel: text})
    diff = git("diff", "--binary", cwd=repo)
    git("checkout", "-q", "--", ".", cwd=repo)
    return diff


@pytest.fixture
def shadowed(tmp_path: Path) -> dict[str, object]:
    """A repo whose package ``packaging`` (root or src/ layout) has a bug the installed one has not."""
    # The name must be taken where hangar runs, or the test shows nothing.
    assert importlib.metadata.version("packaging")
    repos: dict[str, object] = {}
    for layout, prefix in (("root", ""), ("src", "src/")):
        repo = tmp_path / f"repo-{layout}"
        repo.mkdir()
        git("init", "-q", "-b", "main", str(repo))
        write(repo, {f"{prefix}packaging/__init__.py": "", f"{prefix}packaging/utils.py": BUGGY,
                     "setup.py": "raise SystemExit('not run')\n"})  # fmt: skip
        base = commit_all(repo, "base")
        fix = _diff(repo, {f"{prefix}packaging/utils.py": FIXED})
        delete = _diff(repo, {f"{prefix}packaging/utils.py": None, f"{prefix}packaging/__init__.py": None})  # fmt: skip
        repos[layout] = {"repo": str(repo), "base_sha": base, "hidden_files": HIDDEN,
                         "reference_patch": fix, "delete": delete}  # fmt: skip
    return repos


def _task(t: object) -> dict[str, object]:
    assert isinstance(t, dict)
    return {k: v for k, v in t.items() if k != "delete"}


def _grade(task: dict[str, object], patch: str, label: str, tmp_path: Path) -> GraderRun:
    """``patch`` graded on the task in a home of the test's own (its own runner environment)."""
    home = HangarPaths(tmp_path / "home")
    settings = Settings.from_env({"HANGAR_HOME": str(home.home)})
    return run_grader(experiment({"t1": task}), "t1", patch, label=label,
                      work_root=home.work / "grading", env_extra={}, settings=settings)  # fmt: skip


def test_repo_package_named_like_an_installed_one_is_the_repos(
    shadowed: dict[str, object], tmp_path: Path
) -> None:
    t = _task(shadowed["root"])
    base = _grade(t, "", "base", tmp_path)
    assert (base.passed, base.counts["failed"], base.counts["passed"]) == (False, 1, 1), base.output
    assert base.provenance["packaging"]["from"] == "repo", base.provenance
    work = HangarPaths(tmp_path / "home").work / "grading"
    assert base.provenance["packaging"]["path"].startswith(str(work)), base.provenance
    ref = _grade(t, str(t["reference_patch"]), "ref", tmp_path)
    assert (ref.passed, ref.counts["passed"]) == (True, 2), ref.output
    assert ref.provenance["packaging"]["from"] == "repo"
    # The runner itself is recorded as the runner's, from the test environment, not hangar's.
    assert ref.provenance["pytest"]["from"] == "runner", ref.provenance
    assert ".venv" not in ref.provenance["pytest"]["path"], ref.provenance


def test_patch_deleting_the_package_fails_with_the_provenance_reason(
    shadowed: dict[str, object], tmp_path: Path
) -> None:
    t = shadowed["root"]
    assert isinstance(t, dict)
    run = _grade(_task(t), str(t["delete"]), "delete", tmp_path)
    # The installed copy has no bug: every test passes, and the grade still fails.
    assert run.counts["passed"] == 2 and run.counts["failed"] == 0, run.output
    assert not run.passed
    assert run.reason is not None and "module 'packaging' of the repo was loaded from" in run.reason
    assert "the pinned test runner" in run.reason and "site-packages" in run.reason, run.reason
    assert run.provenance["packaging"]["from"] == "runner"


def test_base_check_names_the_misplaced_module_instead_of_calling_the_task_invalid(
    shadowed: dict[str, object], tmp_path: Path
) -> None:
    # src/ layout without grader.pythonpath: the repo's package is not importable from the root,
    # so the installed copy is what the tests would measure (the packaging corpus task's trap).
    t = shadowed["src"]
    assert isinstance(t, dict)
    home = HangarPaths(tmp_path / "home")
    check = check_base(experiment({"t1": _task(t)}), "t1", "run-base", home)
    assert check.setup_error and check.invalid
    assert check.reason is not None and check.reason.startswith("grading setup: module 'packaging'")
    assert "hidden tests pass on base" not in check.reason
    assert "grader.pythonpath" in check.reason, check.reason
    # With its import root the same task is valid, and graded with the repo's code.
    fixed = check_base(
        experiment({"t1": _task(t)}, grader={"pythonpath": ["src"]}), "t1", "run-base", home
    )
    assert (fixed.invalid, fixed.setup_error, fixed.reason) == (False, False, None), fixed.reason
    assert fixed.provenance["packaging"]["from"] == "repo"


def test_hangar_own_packages_are_not_importable_by_hidden_tests(
    shadowed: dict[str, object], tmp_path: Path
) -> None:
    # pyyaml and pydantic are hangar's dependencies, not the runner's: the tests cannot see them.
    assert importlib.metadata.version("pyyaml") and importlib.metadata.version("pydantic")
    t = shadowed["root"]
    assert isinstance(t, dict)
    hidden = {"test_env.py": (
        "import importlib.util, sys\n\n\n"
        "def test_yaml():\n    assert importlib.util.find_spec('yaml') is None\n\n\n"
        "def test_pydantic():\n    assert importlib.util.find_spec('pydantic') is None\n\n\n"
        "def test_hangar():\n    assert importlib.util.find_spec('dagster') is None\n\n\n"
        "def test_prefix():\n    assert '.venv' not in sys.prefix, sys.prefix\n"
    )}  # fmt: skip
    run = _grade({**_task(t), "hidden_files": hidden}, "", "env", tmp_path)
    assert (run.passed, run.counts["passed"]) == (True, 4), run.output


def test_repo_modules_read_from_the_tree() -> None:
    files = ["setup.py", "conftest.py", "tests/__init__.py", "tests/test_x.py", "pkg/__init__.py",
             "pkg/mod.py", "single.py", "src/nsp/a.py", "src/lone.py", "lib/deep/__init__.py", "test_x.py", "src/a_test.py",
             "docs/conf.py", "README.md", "json.py", "bad-name/__init__.py"]  # fmt: skip
    assert provenance.repo_modules(files) == ["lone", "nsp", "pkg", "single"]
    assert provenance.repo_modules(files, ["lib"]) == ["deep", "lone", "nsp", "pkg", "single"]


def test_classify_names_each_place() -> None:
    places = provenance.Places(
        repos=("/w/repo", "/b/repo"), hidden="/w/hidden", venv="/b/venv",
        runner_top_level=frozenset({"pytest", "_pytest"}), hangar="/h/hangar_dagster",
    )  # fmt: skip
    sp = "/b/venv/lib/python3.11/site-packages"
    assert provenance.classify("pkg", "/w/repo/pkg/__init__.py", places) == "repo"
    assert provenance.classify("pkg", "/b/repo/src/pkg/__init__.py", places) == "repo"
    assert provenance.classify("pkg", "/w/repository/pkg.py", places) == "elsewhere"
    assert provenance.classify("t", "/w/hidden/t.py", places) == "hidden_tests"
    assert provenance.classify("pytest", f"{sp}/pytest/__init__.py", places) == "runner"
    assert provenance.classify("six", f"{sp}/six.py", places) == "build"
    assert provenance.classify("sys", None, places) == "builtin"
    loaded = {
        "pkg": f"{sp}/pkg/__init__.py",
        "pkg.mod": "/w/repo/pkg/mod.py",
        "six": f"{sp}/six.py",
    }
    found = provenance.violations(loaded, ["pkg"], places, "/w/repo")
    assert len(found) == 1 and found[0].startswith("module 'pkg' of the repo was loaded from")
    assert "the task's built environment" in found[0]
    assert provenance.violations({"pkg.sub": f"{sp}/pkg/sub.py"}, ["pkg"], places, "/w/repo")
    assert provenance.table(loaded, places) == {
        "pkg": {"from": "build", "path": f"{sp}/pkg/__init__.py"},
        "six": {"from": "build", "path": f"{sp}/six.py"},
    }
