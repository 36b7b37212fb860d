"""The corpus of real tasks grades exactly: base fails, the reference passes clean, counts as recorded.

``../shared/corpus`` (beside the checkout; ``$HANGAR_CORPUS`` overrides it)
holds tasks made from real bug-fix commits of public projects (its
README.md). Each task here becomes a spec in a temporary directory (the
bundle cloned, ``hidden_tests`` and ``reference_patch`` pointing at the
task's files, ``grader.pythonpath: [src]`` for a src/ layout) and is graded
the way ``hangar grade --base`` and ``hangar grade --patch reference.diff``
grade it (``grade_by_hand``): through the real grader, sandbox and
``hangar-grade``. A task that needs third-party packages or a setup step gets
them as its own build (``tasks[].build``: ``pip install <requires>``, then
its setup), built once in the sandbox through the session's real package
mirror and mounted read-only into the grader; those tasks are graded on the
namespace sandbox and on Docker.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.grading.by_hand import grade_by_hand, read_patch_file
from hangar_dagster.grading.provenance import repo_modules
from hangar_dagster.settings import Settings
from hangar_dagster.util.gitrepo import git
from tests.conftest import CORPUS, EXAMPLE

TRUST = "isolated" if os.geteuid() == 0 else "best_effort"

# Tasks whose corpus record names third-party packages (``requires``) or a setup step: they are
# graded with a build, and on Docker as well as bubblewrap (issue 10 item 5). The list is checked
# against the corpus, so a task that stops needing a build here says so.
NEEDS_BUILD = {
    "dateutil-isodate-error-text": "requires six",
    "dateutil-relativedelta-weeks": "requires six",
    "parver-replace-none": "requires Arpeggio, attrs, six, hypothesis",
    "semanticversion-truncate-copy": "setup: pip install -e . (reads its version from metadata)",
    "slugify-normalize-twice": "requires text-unidecode",
    "slugify-uppercase-pretranslation": "requires text-unidecode",
}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not CORPUS.is_dir() and not os.environ.get("CI"),
        reason=f"no corpus at {CORPUS} (set HANGAR_CORPUS)",
    ),
]


def corpus_tasks() -> list[dict[str, Any]]:
    if not CORPUS.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(CORPUS.glob("*/task.json"))]


TASKS = {t["id"]: t for t in corpus_tasks()}
GRADABLE = [tid for tid, t in TASKS.items() if not t["requires"] and not t["setup"]]


CASES = [(tid, "bwrap") for tid in sorted(TASKS)] + [(tid, "docker") for tid in sorted(NEEDS_BUILD)]


def test_corpus_is_there_and_the_build_list_matches_it() -> None:
    assert len(TASKS) >= 14, f"corpus at {CORPUS}: {sorted(TASKS)}"
    for tid in NEEDS_BUILD:
        assert TASKS[tid]["requires"] or TASKS[tid]["setup"], f"{tid} needs nothing: drop it"
    assert set(GRADABLE) == set(TASKS) - set(NEEDS_BUILD)


def task_build(task: dict[str, Any]) -> list[str]:
    """The corpus's recipe (its README, "Using a task") as the task's own build steps."""
    steps = [f"pip install -q {' '.join(task['requires'])}"] if task["requires"] else []
    return [*steps, *task["setup"]]


def spec_for(task: dict[str, Any], dest: Path, environment: dict[str, Any] | None = None) -> Path:
    """A spec for one corpus task in ``dest``: the bundle cloned, the hidden files and the fix."""
    src = CORPUS / task["id"]
    git("clone", "-q", str(src / "repo.bundle"), str(dest / "repo"))
    assert git("rev-parse", "HEAD", cwd=dest / "repo").strip() == task["base_sha"]
    shutil.copytree(src / "hidden", dest / "hidden")
    shutil.copy(src / "reference.diff", dest / "reference.diff")
    grader: dict[str, Any] = {"command": "hangar-grade pytest -q", "timeout_s": 600}
    if task["import_root"] != ".":
        grader["pythonpath"] = [task["import_root"]]
    lock = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())["variants"]["plain"]
    spec = {
        "name": f"corpus-{task['id']}"[:48],
        "harness_repo": str(EXAMPLE / "harnesses"),
        "tasks": [
            {
                "id": task["id"],
                "instructions": task["instructions"],
                "repo": "repo",
                "base": task["base_sha"],
                "reference_patch": "reference.diff",
                "hidden_tests": "hidden",
                **({"build": task_build(task)} if task_build(task) else {}),
            }
        ],
        "variants": {"plain": lock},
        "grader": grader,
        **({"environment": environment} if environment else {}),
    }
    path = dest / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


Graded = dict[tuple[str, str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def graded() -> Graded:
    """(task id, "base" / "reference", backend) -> the grade ``hangar grade --json`` prints."""
    return {}


@pytest.fixture(scope="module")
def corpus_home(
    tmp_path_factory: pytest.TempPathFactory, package_mirror: tuple[Settings, Any]
) -> Settings:
    """One home for every corpus grade: builds are keyed by digest, so base and reference of a
    task share one; the session's real mirror serves their installs."""
    home = tmp_path_factory.mktemp("corpus-home")
    return Settings.from_env(
        {"HANGAR_HOME": str(home), "HANGAR_PACKAGE_MIRROR_URL": package_mirror[1].index_url}
    )


def grade(
    graded: Graded,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[str, str],
    which: str,
) -> dict[str, Any]:
    task_id, backend = case
    if (task_id, which, backend) not in graded:
        settings: Settings = request.getfixturevalue("corpus_home")
        environment: dict[str, Any] = {"sandbox": backend}
        if backend == "docker":
            environment["image"] = request.getfixturevalue("docker_base_image")
        spec_dir = tmp_path_factory.mktemp(f"{task_id[:36]}-{backend}")
        spec = spec_for(TASKS[task_id], spec_dir, environment)
        patch = read_patch_file(spec_dir / "reference.diff") if which == "reference" else ""
        graded[task_id, which, backend] = grade_by_hand(spec, task_id, patch, settings)
    return graded[task_id, which, backend]


# Tasks whose grade knowingly differs from the corpus record (strict xfail: the day the grade
# matches plain pytest, this says so). None now. parver-replace-none was one: its hypothesis test
# failed the too_slow health check in every grader run (the reporter's profile hook slows data
# generation several times over), until hangar-grade turned that check off
# (test_hypothesis_too_slow_check_is_off_in_a_grader_run pins it).
DIFFERS: dict[str, str] = {}


def backend_marks(case: tuple[str, str], counted: bool) -> Any:
    marks: list[Any] = [pytest.mark.needs_sandbox(case[1])]
    if counted and case[0] in DIFFERS:
        marks.append(pytest.mark.xfail(strict=True, reason=DIFFERS[case[0]]))
    return pytest.param(case, id=f"{case[0]}-{case[1]}", marks=marks)


PARAMS = [backend_marks(c, counted=False) for c in CASES]
COUNTED = [backend_marks(c, counted=True) for c in CASES]


def counts(expected: dict[str, int]) -> dict[str, int]:
    return {"total": sum(expected.values()), **expected}


@pytest.mark.parametrize("case", COUNTED)
def test_base_fails_with_the_recorded_counts(
    graded: Graded,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[str, str],
) -> None:
    task_id = case[0]
    base = grade(graded, request, tmp_path_factory, case, "base")
    assert base["passed"] is False, base["output"][-3000:]
    # The repo's own copy was tested, not one installed beside hangar (packaging, tomli, pathspec).
    assert base["hidden_tests"] == counts(TASKS[task_id]["expected_base"]), base["output"][-3000:]
    assert base["reason"] is None and base["trust"] == TRUST


@pytest.mark.parametrize("case", COUNTED)
def test_reference_passes_with_the_recorded_counts(
    graded: Graded,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[str, str],
) -> None:
    task_id = case[0]
    ref = grade(graded, request, tmp_path_factory, case, "reference")
    expected = counts(TASKS[task_id]["expected_reference"])
    assert (ref["passed"], ref["reason"]) == (True, None), ref["output"][-3000:]
    assert ref["hidden_tests"] == expected, ref["output"][-3000:]
    assert (ref["trust"], ref["runner"]) == (TRUST, "hangar-grade")


# Seven of these compare value objects (packaging's Version, Specifier, Marker, ...; semver's and
# semantic_version's Version) in nearly every test: the reporter probes each such comparison
# (docs/grading.md, "Run signals") and an honest value object raises nothing.
@pytest.mark.parametrize("case", PARAMS)
def test_reference_raises_no_signal(
    graded: Graded,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[str, str],
) -> None:
    ref = grade(graded, request, tmp_path_factory, case, "reference")
    assert ref["tamper_signals"] == []


@functools.cache
def repo_packages(task_id: str) -> list[str]:
    """The task repo's own top-level modules, read from its base tree as the grader reads them."""
    with tempfile.TemporaryDirectory() as tmp:
        git("clone", "-q", "--bare", str(CORPUS / task_id / "repo.bundle"), tmp)
        files = git("ls-tree", "-r", "--name-only", TASKS[task_id]["base_sha"], cwd=Path(tmp))
    return repo_modules(files.splitlines(), [TASKS[task_id]["import_root"]])


def installed_beside_hangar(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize("case", PARAMS)
def test_the_repos_own_package_is_what_was_graded(
    graded: Graded,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[str, str],
) -> None:
    """Issue 18: every repo package the hidden tests imported came from the repo, as recorded in
    the grade's provenance, above all those also installed where hangar runs (packaging,
    dateutil, pathspec, tomli here: hangar's own would otherwise stand in)."""
    task_id = case[0]
    own = repo_packages(task_id)
    assert own, f"{task_id}: no package found in the base tree"
    for which in ("base", "reference"):
        where = grade(graded, request, tmp_path_factory, case, which)["provenance"]
        imported = [name for name in own if name in where]
        assert imported, f"{task_id} {which}: none of {own} in the provenance {sorted(where)}"
        for name in imported:
            assert where[name]["from"] == "repo", (task_id, which, name, where[name])
        # Nothing of hangar's own environment: every module is the repo's, the hidden tests',
        # the runner's, the build's, hangar's trusted plugins' or the standard library's.
        assert {e["from"] for e in where.values()} <= {"repo", "hidden_tests", "runner", "build", "hangar"}, where  # fmt: skip
        assert not any("/.venv/" in e["path"] for e in where.values()), where


def test_corpus_has_tasks_whose_package_hangar_also_has() -> None:
    # The check above means most for these: without separate interpreters they measured
    # hangar's copy. Which ones is read here, not assumed.
    shadowed = {tid for tid in TASKS if any(installed_beside_hangar(n) for n in repo_packages(tid))}
    assert {"packaging-wheel-name-newline", "packaging-marker-trailing-newline"} <= shadowed, (
        shadowed
    )


# What the hidden conftest of parver-replace-none does (a profile of its own), then what
# hangar-grade's plugin does after the hidden conftests, in the task's real build (hypothesis 6.82).
_RELAX = """
import sys
sys.path.insert(0, sys.argv[1])
from runner_bootstrap import register_plugin_packages
from pathlib import Path
register_plugin_packages(Path(sys.argv[1]).parent)
from hypothesis import HealthCheck, settings
settings.register_profile("own", max_examples=7, suppress_health_check=[HealthCheck.filter_too_much])
settings.load_profile("own")
from hangar_dagster.grading.pytest_plugin import relax_hypothesis
print(relax_hypothesis(), settings.default.max_examples,
      sorted(h.name for h in settings.default.suppress_health_check))
"""


@pytest.mark.needs_sandbox("bwrap")
def test_hypothesis_too_slow_check_is_off_in_a_grader_run(
    graded: Graded, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The cause of parver-replace-none's extra failure, pinned: in a grader run every Python
    call passes through the trusted reporter's profile hook, so the test's first examples took
    over a second to generate and hypothesis's too_slow health check failed it (plain pytest:
    well under). hangar-grade's plugin keeps the test's own profile and drops that check only;
    hangar-grade gives hypothesis a private writable storage directory."""
    base = grade(graded, request, tmp_path_factory, ("parver-replace-none", "bwrap"), "base")
    # hypothesis got a writable storage directory (the hidden dir, its cwd, is read-only).
    assert "default location is unusable" not in base["output"], base["output"][-3000:]
    settings: Settings = request.getfixturevalue("corpus_home")
    pythons = sorted(settings.paths.builds.glob("*/venv/bin/python"))
    python = next(
        p for p in pythons if list(p.parent.parent.glob("lib/*/site-packages/hypothesis"))
    )
    grading = Path(__file__).resolve().parents[2] / "hangar_dagster" / "grading"
    out = (
        subprocess.run(
            [str(python), "-I", "-c", _RELAX, str(grading)],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split(maxsplit=2)
    )
    assert out == ["True", "7", "['filter_too_much', 'too_slow']"]
