"""The grader and the base check with an environment build: built once, before any trial, and
the hidden tests importing the repo through its editable install, in each run's own clone."""

from __future__ import annotations

import json
from pathlib import Path

import factories
import pytest
from grading_builders import HIDDEN, experiment

from hangar_dagster.environment import build
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.grading.grader import base_check_log, check_base, grade_trial, task_build
from hangar_dagster.grading.stage import run_base_checks
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings, paths
from tests.buildfixtures import SEMVER_TASK, local_index, semver_repo
from tests.conftest import CORPUS
from tests.trials.test_trials_stage import Said

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]
__all__ = ["local_index"]  # the fixture, used by name


@pytest.fixture
def hpaths(hangar_home: Path) -> HangarPaths:
    return paths()


def counts(expected: dict[str, int]) -> dict[str, int]:
    return {"total": sum(expected.values()), **expected}


@pytest.mark.skipif(not (CORPUS / SEMVER_TASK).is_dir(), reason=f"no corpus at {CORPUS}")
def test_a_real_repo_needing_an_editable_install_grades_base_fails_reference_passes(
    local_index: Path, hpaths: HangarPaths, tmp_path: Path
) -> None:
    task = json.loads((CORPUS / SEMVER_TASK / "task.json").read_text())
    repo, sha = semver_repo(CORPUS, tmp_path / "semver")
    hidden = {p.name: p.read_text() for p in sorted((CORPUS / SEMVER_TASK / "hidden").iterdir())}
    reference = (CORPUS / SEMVER_TASK / "reference.diff").read_text()
    exp = experiment(
        {
            "sv": {
                "repo": str(repo), "base_sha": sha, "hidden_files": hidden,
                "reference_patch": reference, "build": task["setup"],
            }
        },
        grader={"timeout_s": 600},
    )  # fmt: skip
    plan = task_build(exp, "sv")
    assert plan is not None and plan.task_steps == tuple(task["setup"])
    check = check_base(exp, "sv", "run-base", hpaths)
    assert (check.invalid, check.reason) == (False, None)
    assert check.base_counts == counts(task["expected_base"])
    assert check.reference_counts == counts(task["expected_reference"])
    assert check.build_digest == plan.digest and check.build_s and check.build_s > 0
    assert build.BUILDS_RUN[plan.key] == 1
    assert "=== build (" in base_check_log(hpaths, exp.experiment_id, "sv").read_text()
    # A trial's patch (the fix) grades through the cached build: no second build.
    art = tmp_path / "art"
    art.mkdir()
    trial = factories.trial(
        experiment_id=exp.experiment_id, variant="v1", task="sv", base_sha=sha,
        artifacts_dir=str(art),
    )  # fmt: skip
    fixed = grade_trial(exp, trial, reference, check, "run-g", hpaths)
    assert fixed.passed, fixed.reason
    unfixed = grade_trial(exp, trial, "", check, "run-g", hpaths)
    assert not unfixed.passed and unfixed.hidden_tests["failed"] == 1
    assert build.BUILDS_RUN[plan.key] == 1


def test_a_build_failing_the_same_way_twice_makes_the_task_invalid_with_the_log_tail(
    local_index: Path, hpaths: HangarPaths, task_repo: tuple[Path, str]
) -> None:
    repo, sha = task_repo
    step = "echo no-such-dependency-on-the-mirror >&2; exit 3"
    exp = experiment(
        {"t1": {"repo": str(repo), "base_sha": sha, "hidden_files": {"test_x.py": "x = 1\n"}}},
        environment={"build": [step]},
    )
    check = check_base(exp, "t1", "run-base", hpaths)
    assert check.invalid
    assert check.reason is not None
    assert "fails the same way twice" in check.reason and "exit 3" in check.reason
    assert "no-such-dependency-on-the-mirror" in check.reason  # the log's tail
    plan = task_build(exp, "t1")
    assert plan is not None and check.build_digest == plan.digest
    assert len(build.failures(Settings.from_env(), plan)) == 2  # stopped at the repeat
    assert "no-such-dependency" in base_check_log(hpaths, exp.experiment_id, "t1").read_text()


def test_the_base_check_stage_builds_every_variant_environment_before_the_trials(
    local_index: Path, hpaths: HangarPaths, task_repo: tuple[Path, str]
) -> None:
    repo, sha = task_repo
    # Only the variants set builds: the check builds and grades in the first one's, and the
    # stage builds the other's too, so no trial of either builds.
    exp = experiment({"t1": {"repo": str(repo), "base_sha": sha, "hidden_files": HIDDEN}})
    v1 = exp.variants["v1"].model_copy(update={"environment": Environment(build=["echo a > a"])})
    v2 = v1.model_copy(update={"name": "v2", "environment": Environment(build=["echo b > b"])})
    exp = exp.model_copy(update={"variants": {"v1": v1, "v2": v2}})
    said = Said()
    [part] = run_base_checks(exp, Store(paths()), paths(), "run-1", ["t1"], said).values()
    assert not part.check.invalid, part.check.reason
    own = task_build(exp, "t1", v1.environment)
    assert own is not None and part.check.build_digest == own.digest
    settings = Settings.from_env()
    for variant in (v1, v2):
        plan = task_build(exp, "t1", variant.environment)
        assert plan is not None and build.cached(settings, plan) is not None
        assert build.BUILDS_RUN[plan.key] == 1
    assert said.lines == []
