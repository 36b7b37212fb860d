"""Fixtures for the adversarial suite: a real task repo, its base checks, and patches taken with git.

Every malicious patch here is graded only through hangar's real grader, in its
sandbox; nothing in this directory runs the patched code on the host.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

# grading_builders (the ResolvedExperiment builder) lives beside the grading tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))

from adv_fixture import Fixture, build_fixture  # noqa: E402
from cases import BACKEND_NAMES  # noqa: E402

from hangar_dagster.grading.grader import check_base  # noqa: E402
from hangar_dagster.results.records import BaseCheckRecord  # noqa: E402
from hangar_dagster.settings import HangarPaths  # noqa: E402

# The controls run on every backend, with the same expected results (needs_sandbox skips or, in
# CI, fails a backend that is missing); the malicious patches as cases.EVERY_BACKEND says.
BACKENDS = [pytest.param(name, marks=pytest.mark.needs_sandbox(name)) for name in BACKEND_NAMES]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This directory's tests grouped by backend, in place, so that fixture_repo and base_checks
    are built once per backend: test_malicious_patch's own (backend, case) parameters would
    otherwise interleave the backends, rebuilding both at every switch."""
    here = Path(__file__).parent
    slots = [n for n, item in enumerate(items) if item.path.is_relative_to(here)]

    def backend(item: pytest.Item) -> int:
        params = getattr(item, "callspec", None)
        name = params.params.get("fixture_repo") if params is not None else None
        return BACKEND_NAMES.index(name) if name in BACKEND_NAMES else -1

    for n, item in zip(slots, sorted((items[n] for n in slots), key=backend), strict=True):
        items[n] = item


@pytest.fixture(scope="session")
def fixture_task(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return build_fixture(tmp_path_factory.mktemp("adversarial"))


@pytest.fixture(scope="session", params=BACKENDS)
def fixture_repo(fixture_task: Fixture, request: pytest.FixtureRequest) -> Fixture:
    """The fixture tasks, graded on one backend (the parameter)."""
    image = request.getfixturevalue("docker_base_image") if request.param == "docker" else None
    return dataclasses.replace(fixture_task, sandbox=request.param, image=image)


@pytest.fixture(scope="session")
def session_paths(tmp_path_factory: pytest.TempPathFactory) -> HangarPaths:
    return HangarPaths(tmp_path_factory.mktemp("adversarial-home"))


@pytest.fixture(scope="session")
def base_checks(fixture_repo: Fixture, session_paths: HangarPaths) -> dict[str, BaseCheckRecord]:
    """The base-must-fail check of each fixture task, once for the whole suite."""
    exp = fixture_repo.experiment()
    return {t: check_base(exp, t, "run-base", session_paths) for t in ("calc", "text")}
