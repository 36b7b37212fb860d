"""The bundled example experiment examples/skills-ab: repos, hidden tests, harnesses, spec."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hangar_dagster.experiment.harness import freeze, load_lock
from hangar_dagster.experiment.plan import TrialKey
from hangar_dagster.experiment.spec import ExperimentSpec, load_spec
from hangar_dagster.experiment.submit import submit
from hangar_dagster.results.report import Stored, report_of
from hangar_dagster.results.summary import headline
from hangar_dagster.settings import Settings
from hangar_dagster.standins.agent_main import (
    Session,
    decide,
    decide_retry,
    load_playbook,
    solve_rate,
)
from hangar_dagster.util.gitrepo import GitError, apply_patch, git, isolated_clone
from tests import factories as f

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "skills-ab"
sys.path.insert(0, str(EXAMPLE))
from make_repos import TASKS  # noqa: E402  the ten tasks, as make_repos.py builds them

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("hangar_home")]


def make_repos(out: Path) -> None:
    script = EXAMPLE / "make_repos.py"
    argv = [sys.executable, str(script), "--out", str(out)]
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def whole_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example copied whole, every task's repo built (conftest's ``example_dir`` is cut to
    three tasks x three trials; this module is about the whole example)."""
    dest = tmp_path_factory.mktemp("whole") / "skills-ab"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("repos", "__pycache__"))
    make_repos(dest / "repos")
    return dest


@pytest.fixture(scope="module")
def repos(whole_example: Path) -> Path:
    return whole_example / "repos"


@pytest.fixture(scope="module")
def spec() -> ExperimentSpec:
    return load_spec(EXAMPLE / "experiment.yaml")


def refs(repo: Path) -> dict[str, str]:
    return {r: git("rev-parse", r, cwd=repo).strip() for r in ("base", "later", "main")}


def clone_at_base(repos: Path, task: str, dest: Path) -> Path:
    repo = repos / task
    isolated_clone(str(repo), refs(repo)["base"], dest)
    return dest


def pytest_over_tasks(root: Path, dirs: dict[str, Path], repos: list[Path]) -> dict[str, str]:
    """One pytest process over every task's test directory (``dirs``: task -> its folder under
    ``root``), each task's repo on sys.path; per task "passed", "failed" or "error".

    One process for all ten tasks, not one per task: the module and test file names differ
    between tasks, and pytest's start-up is most of each run."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
        + [str(d.relative_to(root)) for d in dirs.values()],
        cwd=root,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": os.pathsep.join(map(str, repos)),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # plain pytest: half the start-up
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    seen: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        word, _, nodeid = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR"):
            seen.setdefault(nodeid.split("/")[0], set()).add(word)
    out = {}
    for task in dirs:
        words = seen.get(task, set())
        assert words, f"{task}: no test ran\n{proc.stdout}{proc.stderr}"
        out[task] = "error" if "ERROR" in words else "failed" if "FAILED" in words else "passed"
    return out


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


@pytest.fixture(scope="module")
def ran(repos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Every task's hidden tests on its base, with its reference patch, with the playbook's fix
    and with its wrong edits; and its visible tests with the fix and the wrong edits:
    ``ran["<state> hidden|visible"][task]`` is "passed", "failed" or "error"."""
    root = tmp_path_factory.mktemp("states")
    clones: dict[str, dict[str, Path]] = {}
    for state in ("base", "reference", "fix", "wrong"):
        for task in TASKS:
            repo = root / state / task / "repo"
            if state == "base":
                clone_at_base(repos, task, repo)
            else:  # a copy of the base clone: one clone per task, not four
                shutil.copytree(clones["base"][task], repo, symlinks=True)
            if state == "reference":
                apply_patch(repo, (EXAMPLE / "fixtures" / task / "reference.diff").read_text())
            elif state in ("fix", "wrong"):
                apply_edits(repo, task, state)
            shutil.copytree(EXAMPLE / "fixtures" / task / "hidden", root / state / task / "hidden")
            clones.setdefault(state, {})[task] = repo
    out = {}
    for state, repo_of in clones.items():
        where = root / state
        hidden = {t: where / t / "hidden" for t in TASKS}
        out[f"{state} hidden"] = pytest_over_tasks(where, hidden, list(repo_of.values()))
        if state in ("fix", "wrong"):
            visible = {t: repo_of[t] / "tests" for t in TASKS}
            out[f"{state} visible"] = pytest_over_tasks(where, visible, list(repo_of.values()))
    return out


@pytest.mark.parametrize("task", TASKS)
def test_hidden_tests_fail_on_base_and_pass_with_the_reference(
    task: str, ran: dict[str, dict[str, str]]
) -> None:
    assert ran["base hidden"][task] == "failed"
    assert ran["reference hidden"][task] == "passed"


# --- the stand-in's playbook against the repos ---------------------------------------------


@pytest.fixture(scope="module")
def wrong_fails_visible(ran: dict[str, dict[str, str]]) -> dict[str, bool]:
    """Per task, whether the playbook's wrong edits fail the visible check (allowing a retry)."""
    assert set(ran["wrong visible"].values()) <= {"passed", "failed"}
    return {task: ran["wrong visible"][task] == "failed" for task in TASKS}


@pytest.mark.parametrize("task", TASKS)
def test_playbook_fix_passes_and_wrong_fails_the_hidden_tests(
    task: str, ran: dict[str, dict[str, str]]
) -> None:
    assert ran["fix hidden"][task] == "passed"
    assert ran["fix visible"][task] == "passed"
    assert ran["wrong hidden"][task] == "failed"


def test_some_wrong_edits_overfit_and_some_fail_the_visible_check(
    wrong_fails_visible: dict[str, bool],
) -> None:
    # Overfitting (visible passes, hidden fails) is the case the hidden tests exist for;
    # a failing visible check exercises the stand-in's second try.
    expected = {t: t in ("median", "dedupe") for t in TASKS}
    assert wrong_fails_visible == expected


def predicted(
    spec: ExperimentSpec, variant: str, fails_visible: dict[str, bool]
) -> dict[str, list[bool]]:
    """Per task, whether each trial of ``variant`` ends with the fix's edits (and so passes the
    hidden tests, as the playbook test shows), from the runner's attempt-1 seeds."""
    lock = load_lock(EXAMPLE / "harnesses", str(spec.variants[variant].harness_lock))
    skills = {p.parent.name: p.read_text() for p in lock.skills_dir.glob("*/SKILL.md")}
    rate = solve_rate(lock.config, skills)
    out: dict[str, list[bool]] = {}
    for task in spec.tasks:
        for rep in range(1, spec.trials + 1):
            seed = f"{spec.name}:{TrialKey(variant, task.id, rep).key}:1"
            retried = fails_visible[task.id] and decide_retry(seed, rate)
            out.setdefault(task.id, []).append(decide(seed, rate) or retried)
    return out


def test_the_skill_variant_passes_clearly_more_often(
    spec: ExperimentSpec, wrong_fails_visible: dict[str, bool]
) -> None:
    plain = predicted(spec, "plain", wrong_fails_visible)
    skill = predicted(spec, "skill", wrong_fails_visible)
    passes = (sum(map(sum, plain.values())), sum(map(sum, skill.values())))
    assert passes == (14, 37)  # of 40 each; examples/skills-ab/README.md says so


def test_the_readme_reads_what_the_example_gives(
    spec: ExperimentSpec,
    wrong_fails_visible: dict[str, bool],
    whole_example: Path,
) -> None:
    # The predicted outcomes as trials and grades: the lines `run --wait` and `get` print
    # under the summary are the README's, word for word.
    exp = submit(whole_example / "experiment.yaml", Settings.from_env())
    trials, grades = [], []
    for variant in ("plain", "skill"):
        for task, results in predicted(spec, variant, wrong_fails_visible).items():
            for rep, passed in enumerate(results, start=1):
                eid, pin = exp.experiment_id, exp.variants[variant].pin_set
                trials.append(f.trial(variant, task, rep, 1, experiment_id=eid, pin_set=pin))
                grades.append(f.grade(variant, task, rep, 1, passed=passed, experiment_id=eid))
    checks = {t: f.base_check(t, experiment_id=exp.experiment_id) for t in exp.tasks}
    report = report_of(exp, Stored("sha256:x", trials, trials, grades, (), checks, {}))
    skill = report.variant("skill")
    assert skill.verdict == "shown" and skill.difference is not None
    assert skill.difference.p_value < 0.05 and skill.difference.low_pts >= 20
    readme = " ".join((EXAMPLE / "README.md").read_text().split())
    for line in headline(report):
        assert " ".join(line.split()) in readme, line


# --- harnesses and spec ---------------------------------------------------------------------


def test_spec_loads_and_points_at_existing_files(spec: ExperimentSpec) -> None:
    assert spec.name == "skills-ab" and spec.trials == 4 and spec.parallel == 6
    assert [t.id for t in spec.tasks] == list(TASKS) and len(TASKS) == 10
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
    assert yaml.safe_load(skill_md.split("---")[1])["standin_solve_rate_bonus"] == 0.6
