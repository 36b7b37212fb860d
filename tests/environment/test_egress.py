"""The egress proxy: each policy lets through what it lists and nothing else, from a real sandbox.

Destinations are real loopback listeners on the host: one stands in for the package mirror
(``HANGAR_PACKAGE_MIRROR_URL`` points at it) and receives a request only when the policy
allows the mirror (the control); the other is outside every policy and receives nothing.
The pip tests install a real package through the real mirror (proxpi, one per session).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.environment.egress import (
    NO_EGRESS,
    EgressError,
    Policy,
    egress_lines,
    open_egress,
)
from hangar_dagster.environment.mirror import Mirror
from hangar_dagster.settings import Settings
from hangar_dagster.standins.agent import sandbox_path
from hangar_dagster.trials.model_proxy import EgressLog, provider_failure
from hangar_dagster.trials.sandbox import SandboxRequest, SandboxResult, get_sandbox
from tests.netfixtures import PROBE, Listener

pytestmark = pytest.mark.integration

BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.needs_sandbox("bwrap")),
    pytest.param("unshare", marks=pytest.mark.needs_sandbox("unshare")),
    pytest.param("docker", marks=pytest.mark.needs_sandbox("docker")),
]


def settings_for(home: Path, mirror_url: str | None = None) -> Settings:
    return Settings(home=home, dagster_home=home / "dagster", package_mirror_url=mirror_url)


def image_for(backend: str, request: pytest.FixtureRequest) -> str | None:
    """Docker runs hangar's base image (built once per machine); the namespace sandboxes none."""
    return str(request.getfixturevalue("docker_base_image")) if backend == "docker" else None


def run_in(backend: str, grant_policy: Policy, settings: Settings, log: Path, argv: list[str],
           workdir: Path, image: str | None = None) -> tuple[SandboxResult, list[dict[str, Any]]]:  # fmt: skip
    with open_egress(grant_policy, log, settings) as grant:
        result = get_sandbox(backend, image=image).run(
            SandboxRequest(
                argv=grant.wrap(argv),
                workdir=workdir,
                env={"PATH": sandbox_path(), "HOME": "/tmp", **grant.env},
                timeout_s=180,
                mounts=list(grant.mounts),
            )
        )
    lines = egress_lines(log.read_text()) if log.exists() else []
    return result, lines


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["none", "mirror", "allowlist"])
def test_each_policy_reaches_only_its_list_from_a_real_sandbox(
    backend: str, policy: Policy, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with Listener() as mirror, Listener() as outside:
        settings = settings_for(tmp_path / "home", f"{mirror.url}simple/")
        result, lines = run_in(
            backend, policy, settings, tmp_path / "egress.jsonl",
            [sys.executable, "-c", PROBE, f"{mirror.url}simple/", str(outside.port)], tmp_path,
            image_for(backend, request),
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        got = json.loads(result.stdout)
        # Outside the policy, every way: nothing reaches the host's other loopback port.
        assert outside.connections == []
        assert got["outside_direct"] == "ConnectionRefusedError"  # the sandbox's own loopback
        assert got["outside_via_env"] != 200
        if policy == "none":
            assert got["mirror"] == "ConnectionRefusedError"
            assert mirror.connections == []  # nothing is allowed under none
            assert lines == [] and not (tmp_path / "egress.jsonl").exists()
            return
        # The control: the listener the policy allows does receive (GET only: read-only).
        assert got["mirror"] == 200
        assert len(mirror.connections) == 1 and mirror.connections[0].startswith(b"GET /simple/")
        assert got["outside_via_proxy"] == 403
        assert got["link_local_via_proxy"] == 403
        assert got["mirror_post"] == 403 and got["mirror_post_via_proxy"] == 403
    verdicts = {(e["method"], e["host"], e["port"], e["verdict"]) for e in lines}
    assert ("GET", "127.0.0.1", mirror.port, "allowed") in verdicts
    assert ("GET", "127.0.0.1", outside.port, "refused") in verdicts
    assert ("GET", "169.254.169.254", 80, "refused") in verdicts
    assert ("POST", "127.0.0.1", mirror.port, "refused") in verdicts
    assert all(e["policy"] == policy and isinstance(e["bytes"], int) for e in lines)
    allowed = next(e for e in lines if e["verdict"] == "allowed")
    assert allowed["bytes"] > 0 and allowed["http_status"] == 200


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["none", "mirror", "allowlist"])
def test_pip_installs_through_the_mirror_only_when_the_policy_allows_it(
    backend: str,
    policy: Policy,
    tmp_path: Path,
    package_mirror: tuple[Settings, Mirror],
    request: pytest.FixtureRequest,
) -> None:
    settings, mirror = package_mirror  # the embedded mirror, found running by its home
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--retries", "0", "--timeout",
           "10", "--target", str(target), "six==1.16.0"]  # fmt: skip
    result, lines = run_in(
        backend, policy, settings, tmp_path / "egress.jsonl", pip, tmp_path,
        image_for(backend, request),
    )  # fmt: skip
    if policy == "none":
        assert result.exit_code != 0
        assert not (target / "six.py").exists()
        return
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (target / "six.py").is_file()
    urls = [e["url"] for e in lines if e["verdict"] == "allowed"]
    assert any(u.endswith("six-1.16.0-py2.py3-none-any.whl") for u in urls), lines
    assert all(e["verdict"] == "allowed" for e in lines)


@pytest.mark.unit
def test_the_mirror_url_setting_makes_hangar_start_nothing(tmp_path: Path) -> None:
    with Listener() as mirror:
        settings = settings_for(tmp_path / "home", f"{mirror.url}simple/")
        with open_egress("mirror", tmp_path / "egress.jsonl", settings) as grant:
            assert grant.env["PIP_INDEX_URL"] == f"{mirror.url}simple/"
            assert grant.mirror_url == f"{mirror.url}simple/"
    assert not (tmp_path / "home").exists()  # no mirror dir, no pid file, no process


@pytest.mark.unit
def test_none_is_an_empty_grant_and_an_unknown_policy_is_refused(tmp_path: Path) -> None:
    with open_egress("none", tmp_path / "e.jsonl", settings_for(tmp_path / "home")) as grant:
        assert grant == NO_EGRESS and grant.wrap(["x"]) == ["x"]
    with pytest.raises(EgressError, match="expected one of none, allowlist, mirror"):
        with open_egress("open", tmp_path / "e.jsonl", settings_for(tmp_path)):  # type: ignore[arg-type]
            pass


@pytest.mark.unit
def test_two_writers_of_one_egress_log_never_interleave(tmp_path: Path) -> None:
    """The model proxy's and the egress proxy's lines share egress.jsonl: each stays whole."""
    path = tmp_path / "egress.jsonl"
    writers = [EgressLog(path), EgressLog(path)]
    body = "x" * 200_000  # far past any buffer: a torn write would split it

    def write(n: int) -> None:
        for i in range(40):
            writers[n].write({"writer": n, "i": i, "body": body})

    threads = [threading.Thread(target=write, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted((e["writer"], e["i"]) for e in entries) == [
        (n, i) for n in (0, 1) for i in range(40)
    ]
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.unit
def test_a_mirror_error_after_model_lines_is_not_a_provider_outage() -> None:
    model = json.dumps(
        {"provider": "anthropic", "method": "POST", "path": "/v1/messages", "status": 200}
    )
    mirror = json.dumps(
        {"source": "egress-proxy", "method": "GET", "status": 503, "http_status": 503}
    )
    assert provider_failure("\n".join([model, mirror])) is None
