"""Both local sandbox backends, each skipped where its binary is missing."""

from __future__ import annotations

import shutil

import pytest

from hangar_dagster.trials.sandbox import Sandbox, get_sandbox

BACKENDS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            shutil.which(binary) is None, reason=f"{binary} not installed ({package})"
        ),
    )
    for name, binary, package in (
        ("bwrap", "bwrap", "bubblewrap"),
        ("unshare", "unshare", "util-linux"),
    )
]


@pytest.fixture(params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return get_sandbox(request.param)
