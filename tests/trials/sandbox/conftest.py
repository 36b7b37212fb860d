"""Every sandbox backend, each needing its binary or engine (`needs_sandbox`, tests/conftest.py)."""

from __future__ import annotations

import pytest

from hangar_dagster.trials.sandbox import Sandbox, get_sandbox

BACKENDS = [
    pytest.param(name, marks=pytest.mark.needs_sandbox(name))
    for name in ("bwrap", "unshare", "docker")
]


@pytest.fixture(params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "docker":
        request.getfixturevalue("docker_base_image")
    return get_sandbox(request.param)
