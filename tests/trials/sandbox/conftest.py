"""Both local sandbox backends, each needing its binary (`needs_sandbox`, tests/conftest.py)."""

from __future__ import annotations

import pytest

from hangar_dagster.trials.sandbox import Sandbox, get_sandbox

BACKENDS = [
    pytest.param(name, marks=pytest.mark.needs_sandbox(name)) for name in ("bwrap", "unshare")
]


@pytest.fixture(params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return get_sandbox(request.param)
