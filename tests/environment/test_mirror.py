"""The package mirror: its upstream from pip's own configuration, one per HANGAR_HOME, reused
across processes, a stale pid file replaced, and HANGAR_PACKAGE_MIRROR_URL starting nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hangar_dagster.environment.mirror import (
    DEFAULT_INDEX,
    Mirror,
    MirrorError,
    ensure_mirror,
    mirror_dir,
    pip_index,
    running_mirror,
    stop_mirror,
)
from hangar_dagster.settings import Settings

pytestmark = pytest.mark.unit


def settings_for(home: Path, mirror_url: str | None = None) -> Settings:
    return Settings(home=home, dagster_home=home / "dagster", package_mirror_url=mirror_url)


def test_the_upstream_is_what_pip_is_configured_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = https://index.example/simple\n"
        "extra-index-url = https://extra.example/simple file:///opt/local/simple\n"
        "find-links = /opt/wheels\ncert = /etc/ssl/certs/ca-certificates.crt\n"
    )
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    index = pip_index()
    assert index.index_url == "https://index.example/simple/"  # proxpi needs the slash
    assert index.extra_index_urls == ("https://extra.example/simple/",)
    # Host directories the mirror does not read: said, not silently dropped.
    assert index.skipped == ("file:///opt/local/simple", "find-links /opt/wheels")
    assert index.cert == "/etc/ssl/certs/ca-certificates.crt"
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/pypi/simple/")
    assert pip_index().index_url == "https://env.example/pypi/simple/"  # the environment wins
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_INDEX_URL")
    assert pip_index().index_url == DEFAULT_INDEX  # nothing configured: pip's own default


def test_the_mirror_url_setting_is_used_as_it_is_and_starts_nothing(tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "home", "http://mirror.example:3141/root/pypi/+simple/")
    mirror = ensure_mirror(settings)
    assert mirror == Mirror(
        index_url="http://mirror.example:3141/root/pypi/+simple/",
        host="mirror.example",
        port=3141,
        started_by_hangar=False,
    )
    assert not mirror_dir(settings).exists()  # no lock, no pid file, no process
    assert ensure_mirror(settings_for(tmp_path, "https://m.example/simple/")).port == 443


def test_a_mirror_url_that_is_no_index_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(MirrorError, match="HANGAR_PACKAGE_MIRROR_URL='ftp://m/'.*http"):
        ensure_mirror(settings_for(tmp_path, "ftp://m/"))


def test_settings_read_the_mirror_url() -> None:
    env = {"HANGAR_HOME": "/tmp/h", "HANGAR_PACKAGE_MIRROR_URL": " http://m:1/simple/ "}
    assert Settings.from_env(env).package_mirror_url == "http://m:1/simple/"
    assert Settings.from_env({"HANGAR_HOME": "/tmp/h"}).package_mirror_url is None


def listening_addresses(port: int) -> set[str]:
    """The local addresses (kernel hex) of the TCP sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


@pytest.mark.integration
def test_one_mirror_per_home_shared_by_processes_and_a_stale_pid_replaced(tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "home")
    first = ensure_mirror(settings)
    try:
        assert first.started_by_hangar and first.host == "127.0.0.1"
        assert first.cache_dir == tmp_path / "home" / "mirror" / "cache"
        # Another process of the same home finds it, and starts none of its own.
        code = (
            "from hangar_dagster.environment.mirror import ensure_mirror; "
            "from hangar_dagster.settings import Settings; "
            "print(ensure_mirror(Settings.from_env()).pid)"
        )
        env = {"HANGAR_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert int(out.stdout) == first.pid
        with urllib.request.urlopen(f"http://127.0.0.1:{first.port}/health", timeout=5) as r:
            assert r.status == 200
        # Loopback only: its listening socket is bound to 127.0.0.1 and nothing else.
        assert listening_addresses(first.port) == {"0100007F"}
        state = json.loads((mirror_dir(settings) / "mirror.json").read_text())
        assert state["upstream"] == pip_index().index_url
    finally:
        assert stop_mirror(settings)
    assert running_mirror(settings) is None
    # A pid file whose process is gone (or is another program): a new mirror replaces it.
    (mirror_dir(settings) / "mirror.json").write_text(
        json.dumps({"pid": first.pid, "port": first.port, "upstream": "x"})
    )
    second = ensure_mirror(settings)
    try:
        assert second.pid != first.pid
        assert running_mirror(settings) == second
    finally:
        stop_mirror(settings)


@pytest.mark.integration
def test_a_mirror_started_while_sigterm_is_ignored_still_stops_on_sigterm(tmp_path: Path) -> None:
    # A background shell ignores SIGINT and Dagster copies that onto SIGTERM; the mirror started
    # then inherited the ignore and outlived `stop_mirror`'s SIGTERM until its SIGKILL.
    settings = settings_for(tmp_path / "home")
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        mirror = ensure_mirror(settings)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    try:
        os.kill(mirror.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        status = None
        while status is None and time.monotonic() < deadline:
            pid, code = os.waitpid(mirror.pid, os.WNOHANG)  # our own child
            status = code if pid else None
            time.sleep(0.05)
        assert status is not None, "the mirror outlived SIGTERM by 10 s"
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    finally:
        stop_mirror(settings)
