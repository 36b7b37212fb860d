"""The bundled example experiment examples/skills-ab: repos, hidden tests, harnesses, spec."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hangar_dagster.experiment.harness import freeze, load_lock
from hangar_dagster.experiment.plan import TrialKey
from hangar_dagster.experiment.spec import ExperimentSpec, load_spec
from hangar_dagster.standins.agent_main import (
    Session,
    decide,
    decide_retry,
    load_playbook,
    solve_rate,
)
from hangar_dagster.util.gitrepo import GitError, apply_patch, git, isolated_clone

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "skills-ab"
TASKS = ("median", "slugify", "durations")


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("hangar_home")]


def make_repos(out: Path) -> None:
    script = EXAMPLE / "make_repos.py"
    argv = [sys.executable, str(script), "--out", str(out)]
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def repos(example_dir: Path) -> Path:
    return example_dir / "repos"  # built by make_repos.py in conftest's copy of the example


@pytest.fixture(scope="module")
def spec() -> ExperimentSpec:
    return load_spec(EXAMPLE / "experiment.yaml")


def refs(repo: Path) -> dict[str, str]:
    return {r: git("rev-parse", r, cwd=repo).strip() for r in ("base", "later", "main")}


def clone_at_base(repos: Path, task: str, dest: Path) -> Path:
    repo = repos / task
    isolated_clone(str(repo), refs(repo)["base"], dest)
    return dest


def hidden_run(repo: Path, task: str, tmp: Path) -> int:
    """pytest's exit code for the task's hidden tests, copied beside the repo, repo on sys.path."""
    hidden = tmp / "hidden"
    shutil.copytree(EXAMPLE / "fixtures" / task / "hidden", hidden)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(hidden)],
        cwd=tmp,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2-5: not a test result
    return proc.returncode


def visible_run(repo: Path) -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode


def apply_edits(repo: Path, task: str, kind: str) -> None:
    playbook = (EXAMPLE / "harness-src" / "standin-plain" / "playbook.yaml").read_text()
    fix, wrong = load_playbook(playbook, task)
    session = Session(repo)
    for edit in fix if kind == "fix" else wrong:
        session.edit(edit)


# --- the repositories ------------------------------------------------------------------


def test_make_repos_is_reproducible_and_idempotent(repos: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    make_repos(again)
    make_repos(again)  # over an existing output
    for task in TASKS:
        first, second = refs(repos / task), refs(again / task)
        assert first == second
        assert first["later"] == first["main"] != first["base"]
        assert git("rev-parse", "later^", cwd=repos / task).strip() == first["base"]
    assert sorted(p.name for p in again.iterdir()) == sorted(TASKS)  # no temp dirs left


def test_reference_diffs_are_what_git_says_upstream_changed(repos: Path) -> None:
    for task in TASKS:
        generated = git("diff", "--no-color", "--no-ext-diff", "base", "later", cwd=repos / task)
        assert (EXAMPLE / "fixtures" / task / "reference.diff").read_text() == generated


def test_a_trial_clone_cannot_reach_the_later_fix(repos: Path, tmp_path: Path) -> None:
    clone = clone_at_base(repos, "median", tmp_path / "clone")
    later = refs(repos / "median")["later"]
    with pytest.raises(GitError):
        git("cat-file", "-e", f"{later}^{{commit}}", cwd=clone)
    assert git("tag", cwd=clone).strip() == ""
    assert git("remote", cwd=clone).strip() == ""


@pytest.mark.parametrize("task", TASKS)
def test_hidden_tests_fail_on_base_and_pass_with_the_reference(
    task: str, repos: Path, tmp_path: Path
) -> None:
    base = clone_at_base(repos, task, tmp_path / "base" / "repo")
    assert hidden_run(base, task, tmp_path / "base") == 1
    fixed = clone_at_base(repos, task, tmp_path / "fixed" / "repo")
    apply_patch(fixed, (EXAMPLE / "fixtures" / task / "reference.diff").read_text())
    assert hidden_run(fixed, task, tmp_path / "fixed") == 0


# --- the stand-in's playbook against the repos ---------------------------------------------


@pytest.fixture(scope="module")
def wrong_fails_visible(repos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bool]:
    """Per task, whether the playbook's wrong edits fail the visible check (allowing a retry)."""
    result = {}
    for task in TASKS:
        repo = clone_at_base(repos, task, tmp_path_factory.mktemp(task) / "repo")
        apply_edits(repo, task, "wrong")
        result[task] = visible_run(repo) != 0
    return result


@pytest.mark.parametrize("task", TASKS)
def test_playbook_fix_passes_and_wrong_fails_the_hidden_tests(
    task: str, repos: Path, tmp_path: Path
) -> None:
    for kind, hidden_code in (("fix", 0), ("wrong", 1)):
        repo = clone_at_base(repos, task, tmp_path / kind / "repo")
        apply_edits(repo, task, kind)
        assert hidden_run(repo, task, tmp_path / kind) == hidden_code, kind
        if kind == "fix":
            assert visible_run(repo) == 0


def test_some_wrong_edits_overfit_and_some_fail_the_visible_check(
    wrong_fails_visible: dict[str, bool],
) -> None:
    # Overfitting (visible passes, hidden fails) is the case the hidden tests exist for;
    # a failing visible check exercises the stand-in's second try.
    assert wrong_fails_visible == {"median": True, "slugify": False, "durations": False}


def expected_passes(spec: ExperimentSpec, variant: str, fails_visible: dict[str, bool]) -> int:
    """Trials of ``variant`` whose final edits are the fix, with the runner's attempt-1 seeds."""
    lock = load_lock(EXAMPLE / "harnesses", str(spec.variants[variant].harness_lock))
    skills = {p.parent.name: p.read_text() for p in lock.skills_dir.glob("*/SKILL.md")}
    rate = solve_rate(lock.config, skills)
    passes = 0
    for task in spec.tasks:
        for rep in range(1, spec.trials + 1):
            seed = f"{spec.name}:{TrialKey(variant, task.id, rep).key}:1"
            retried = fails_visible[task.id] and decide_retry(seed, rate)
            passes += decide(seed, rate) or retried
    return passes


def test_the_skill_variant_passes_clearly_more_often(
    spec: ExperimentSpec, wrong_fails_visible: dict[str, bool]
) -> None:
    plain = expected_passes(spec, "plain", wrong_fails_visible)
    skill = expected_passes(spec, "skill", wrong_fails_visible)
    assert (plain, skill) == (4, 7)  # of 9 each; examples/skills-ab/README.md says so


# --- harnesses and spec ---------------------------------------------------------------------


def test_spec_loads_and_points_at_existing_files(spec: ExperimentSpec) -> None:
    assert spec.name == "skills-ab" and spec.trials == 3 and spec.parallel == 3
    assert [t.id for t in spec.tasks] == list(TASKS)
    assert spec.grader.command == "hangar-grade pytest -q"
    for task in spec.tasks:
        assert task.repo == f"repos/{task.id}" and task.base == "base"
        assert task.verify == "python -m pytest -q tests"
        assert (EXAMPLE / str(task.reference_patch)).is_file()
        assert isinstance(task.hidden_tests, str) and (EXAMPLE / task.hidden_tests).is_dir()


def test_checked_in_locks_are_fresh_and_differ_only_by_the_skill(
    spec: ExperimentSpec, tmp_path: Path
) -> None:
    registry = EXAMPLE / str(spec.harness_repo)
    for variant, source in (("plain", "standin-plain"), ("skill", "standin-skill")):
        ref = str(spec.variants[variant].harness_lock)
        lock = load_lock(registry, ref)  # raises if the content changed after freezing
        assert freeze(EXAMPLE / "harness-src" / source, tmp_path / "registry").ref == ref
        assert lock.adapter == "standin" and "standin" in lock.model
        assert lock.config["standin"]["solve_rate"] == 0.3
    assert sorted(p.name for p in registry.glob("*@sha256:*")) == sorted(
        str(v.harness_lock) for v in spec.variants.values()
    )
    assert sorted(p.name for p in registry.iterdir() if "@" not in p.name) == [
        "harnesses.lock.yaml"
    ]
    plain_src, skill_src = (EXAMPLE / "harness-src" / n for n in ("standin-plain", "standin-skill"))
    for name in ("playbook.yaml", "instructions.md"):
        assert (plain_src / name).read_text() == (skill_src / name).read_text()
    skill_md = (skill_src / "skills" / "general-fix" / "SKILL.md").read_text()
    assert yaml.safe_load(skill_md.split("---")[1])["standin_solve_rate_bonus"] == 0.4
