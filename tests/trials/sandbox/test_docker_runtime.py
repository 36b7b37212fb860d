"""HANGAR_SANDBOX_RUNTIME=image: what the Docker backend refuses to bind (pure checks, no engine).

The run worker's bind sources are resolved by the engine on its own host: a path outside the
directories shared at the same path would bind the host's file of that name, or nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hangar_dagster.trials.sandbox import Mount, SandboxRequest, SandboxRuntime, SandboxUnavailable
from hangar_dagster.trials.sandbox._common import LOGIN_PROFILE, sandbox_mounts
from hangar_dagster.trials.sandbox.docker import check_shared

pytestmark = pytest.mark.unit


def test_a_bind_source_outside_the_shared_dirs_is_refused_naming_it(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "home" / "wd").mkdir(parents=True)
    runtime = SandboxRuntime(in_image=True, shared=(shared / "home",))
    check_shared([shared / "home" / "wd"], runtime)  # under HANGAR_HOME: fine
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(SandboxUnavailable, match=f"bind source {outside} is outside"):
        check_shared([shared / "home" / "wd", outside], runtime)
    # A symlink in the shared dir is judged by where it leads.
    (shared / "home" / "out").symlink_to(outside)
    with pytest.raises(SandboxUnavailable, match="is outside"):
        check_shared([shared / "home" / "out"], runtime)


def test_with_the_runtime_from_the_host_any_source_binds(tmp_path: Path) -> None:
    check_shared([tmp_path], SandboxRuntime())  # hangar on the engine's host: its own paths


def test_the_login_profile_is_bound_only_when_the_image_lacks_it(tmp_path: Path) -> None:
    req = SandboxRequest(argv=["true"], workdir=tmp_path, env={}, timeout_s=1)
    bound = sandbox_mounts(req, etc_from_host=False)
    assert [m.source for m in bound] == [LOGIN_PROFILE]
    assert sandbox_mounts(req, etc_from_host=False, profile=False) == []
    extra = Mount(tmp_path, "/x")
    assert sandbox_mounts(
        SandboxRequest(argv=["true"], workdir=tmp_path, env={}, timeout_s=1, mounts=[extra]),
        etc_from_host=False,
        profile=False,
    ) == [extra]
