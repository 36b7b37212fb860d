"""The package mirror trials, graders and builds install from: proxpi, started on demand.

``ensure_mirror(settings)`` returns the mirror of this ``HANGAR_HOME``:

- ``HANGAR_PACKAGE_MIRROR_URL`` set: that index, as it is; hangar starts nothing.
- otherwise the embedded default: one proxpi (a small caching proxy of a
  package index, docs/operations.md says why this one) per ``HANGAR_HOME``,
  listening on 127.0.0.1 only, its files cached under ``<home>/mirror/cache``.
  The first caller starts it (detached, so it outlives the process that
  started it and serves every later trial, grader and build of the home);
  the others find it through ``<home>/mirror/mirror.json`` (pid, port,
  upstream), under an exclusive lock on ``<home>/mirror/mirror.lock`` so two
  processes never start two. A pid that is gone or is no longer the mirror
  (a stale file, a reused pid) is replaced by a new start.

The mirror's upstream is the index pip on this host is configured with, read
from pip's own configuration (``pip config list``: ``PIP_INDEX_URL`` and the
pip.conf files, pip's default https://pypi.org/simple/ when none is set), and
its http(s) ``extra-index-url`` entries. What it cannot carry: ``file://``
indexes and ``find-links`` are directories on this host that proxpi does not
read (it fetches over HTTP); ``Mirror.skipped`` lists them, and a package only
there is not installable in a sandbox.

Read-only to trials and graders: the egress proxy lets only GET and HEAD reach
the mirror (proxpi's own cache-invalidation DELETE routes are never reached).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from hangar_dagster.settings import PACKAGE_MIRROR_URL_VAR, Settings
from hangar_dagster.util.procs import restore_stop_signals

DEFAULT_INDEX = "https://pypi.org/simple/"  # pip's own default when nothing is configured
START_TIMEOUT_S = 30.0
# proxpi redirects a download to the upstream file URL when it takes longer than this; a
# sandbox may reach only the mirror, so it must wait for the file instead.
DOWNLOAD_TIMEOUT_S = 600
MARKER = "hangar_dagster.environment.mirror"  # in the served process's argv: how a pid is known


class MirrorError(RuntimeError):
    """The mirror cannot be used as configured; the message names what to fix."""


@dataclass(frozen=True)
class PipIndex:
    """What pip on this host installs from, as pip's configuration says."""

    index_url: str
    extra_index_urls: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # file:// indexes and find-links: not carried by the mirror
    cert: str | None = None  # pip's CA bundle, so the mirror verifies upstream as pip would


@dataclass(frozen=True)
class Mirror:
    index_url: str  # what pip is given (PIP_INDEX_URL), e.g. http://127.0.0.1:41234/index/
    host: str
    port: int
    started_by_hangar: bool  # False: HANGAR_PACKAGE_MIRROR_URL, an existing mirror
    pid: int | None = None
    upstream: str | None = None
    extra_upstreams: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    log_path: Path | None = None
    cache_dir: Path | None = None
    scheme: str = "http"
    methods: frozenset[str] = field(default_factory=lambda: frozenset({"GET", "HEAD"}))


def _pip_values(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("'\"")
    return values


def _first(values: dict[str, str], name: str) -> str | None:
    # pip's precedence: the environment, then a command's own section, then [global].
    for section in (":env:", "install", "download", "global"):
        if value := values.get(f"{section}.{name}"):
            return value
    return None


def pip_index(python: str = sys.executable) -> PipIndex:
    """The index pip of ``python`` uses here, from ``pip config list`` (files and PIP_* vars)."""
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MirrorError(f"cannot read pip's configuration ({python} -m pip): {err}") from err
    if proc.returncode != 0:
        raise MirrorError(f"`{python} -m pip config list` failed: {proc.stderr.strip()[-300:]}")
    values = _pip_values(proc.stdout)
    index = _first(values, "index-url") or DEFAULT_INDEX
    extras: list[str] = []
    skipped: list[str] = []
    for url in (_first(values, "extra-index-url") or "").split():
        (extras if urlsplit(url).scheme in ("http", "https") else skipped).append(url)
    skipped += [f"find-links {p}" for p in (_first(values, "find-links") or "").split()]
    if urlsplit(index).scheme not in ("http", "https"):
        skipped.insert(0, index)
        index = DEFAULT_INDEX
    # proxpi joins project names onto the URL: without the slash the last segment is lost.
    return PipIndex(
        _slash(index), tuple(_slash(u) for u in extras), tuple(skipped), _first(values, "cert")
    )


def _slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def _external(url: str) -> Mirror:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MirrorError(
            f"{PACKAGE_MIRROR_URL_VAR}={url!r}: expected the http(s) URL of a package index "
            "(the one pip's --index-url takes), e.g. http://mirror.example:3141/root/pypi/+simple/"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Mirror(
        index_url=url, host=parts.hostname, port=port, started_by_hangar=False, scheme=parts.scheme
    )


def mirror_dir(settings: Settings) -> Path:
    return settings.home / "mirror"


def _alive(pid: int) -> bool:
    """``pid`` runs and is a hangar mirror (a reused pid of another program is not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return MARKER.encode() in cmdline and b"\0serve\0" in cmdline


def _healthy(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _from_state(state: dict[str, object], where: Path) -> Mirror:
    port = int(str(state["port"]))
    return Mirror(
        index_url=f"http://127.0.0.1:{port}/index/",
        host="127.0.0.1",
        port=port,
        started_by_hangar=True,
        pid=int(str(state["pid"])),
        upstream=str(state["upstream"]),
        extra_upstreams=tuple(str(u) for u in state.get("extra_upstreams", []) or []),  # type: ignore[attr-defined]
        skipped=tuple(str(u) for u in state.get("skipped", []) or []),  # type: ignore[attr-defined]
        log_path=where / "mirror.log",
        cache_dir=where / "cache",
    )


def running_mirror(settings: Settings) -> Mirror | None:
    """The embedded mirror of this home if it runs and answers; None otherwise."""
    where = mirror_dir(settings)
    try:
        state = json.loads((where / "mirror.json").read_text())
        mirror = _from_state(state, where)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if mirror.pid is None or not _alive(mirror.pid) or not _healthy(mirror.host, mirror.port):
        return None
    return mirror


def ensure_mirror(settings: Settings) -> Mirror:
    """The package mirror of ``settings``: HANGAR_PACKAGE_MIRROR_URL's, or the embedded one
    (started now if it does not run; shared by every process of this HANGAR_HOME)."""
    if settings.package_mirror_url:
        return _external(settings.package_mirror_url)
    where = mirror_dir(settings)
    with _locked(where / "mirror.lock"):
        if (found := running_mirror(settings)) is not None:
            return found
        return _start(settings, where)


def _start(settings: Settings, where: Path) -> Mirror:
    index = pip_index()
    port = _free_port()
    cache = where / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        MARKER,
        "serve",
        "--port",
        str(port),
        "--cache-dir",
        str(cache),
        "--upstream",
        index.index_url,
        *(a for url in index.extra_index_urls for a in ("--extra", url)),
        *(["--cert", index.cert] if index.cert else []),
    ]
    log = (where / "mirror.log").open("ab")
    try:
        # Its own session: it outlives this process and a ^C of the command that started it.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=where,
        )
    finally:
        log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _healthy("127.0.0.1", port, timeout=1.0):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            tail = (where / "mirror.log").read_text(errors="replace")[-800:]
            raise MirrorError(
                f"the package mirror (proxpi) did not start on 127.0.0.1:{port}; its log "
                f"{where / 'mirror.log'} ends:\n{tail}\nset {PACKAGE_MIRROR_URL_VAR} to use "
                "an existing mirror instead"
            )
        time.sleep(0.05)
    state = {
        "pid": proc.pid,
        "port": port,
        "upstream": index.index_url,
        "extra_upstreams": list(index.extra_index_urls),
        "skipped": list(index.skipped),
        "started_at": time.time(),
    }
    tmp = where / "mirror.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(where / "mirror.json")
    return _from_state(state, where)


def stop_mirror(settings: Settings, timeout_s: float = 10.0) -> bool:
    """Stop the embedded mirror of this home; True when one was running."""
    where = mirror_dir(settings)
    with _locked(where / "mirror.lock"):
        try:
            pid = int(json.loads((where / "mirror.json").read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        (where / "mirror.json").unlink(missing_ok=True)
        if not _alive(pid):
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # our own child: reap it, or it stays a zombie
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        return True


# ---- the served process ------------------------------------------------------------------


def serve(
    port: int, cache_dir: str, upstream: str, extras: list[str], cert: str | None
) -> None:  # pragma: no cover - runs as its own process
    import logging

    # proxpi reads its configuration from the environment when it is imported.
    os.environ.update(
        PROXPI_INDEX_URL=upstream,
        PROXPI_EXTRA_INDEX_URLS=",".join(extras),
        PROXPI_CACHE_DIR=cache_dir,
        PROXPI_DOWNLOAD_TIMEOUT=str(DOWNLOAD_TIMEOUT_S),
        PROXPI_LOGGING_LEVEL="INFO",
        NO_COLOR="1",  # a log file, not a terminal
    )
    if cert:
        os.environ["REQUESTS_CA_BUNDLE"] = cert
    from proxpi.server import app
    from werkzeug.serving import run_simple

    # Each upstream fetch is a log line ("Refreshing '<project>'", "Downloading '<url>'"): how
    # an operator (and the benchmark) tells a cache hit from a trip upstream.
    logging.getLogger("proxpi._cache").setLevel(logging.DEBUG)
    for handler in logging.root.handlers:  # coloredlogs, when installed, sets its own to INFO
        handler.setLevel(logging.DEBUG)
    run_simple("127.0.0.1", port, app, threaded=True, use_reloader=False)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MARKER}")
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve the package mirror (started by ensure_mirror)")
    srv.add_argument("--port", type=int, required=True)
    srv.add_argument("--cache-dir", required=True)
    srv.add_argument("--upstream", required=True)
    srv.add_argument("--extra", action="append", default=[])
    srv.add_argument("--cert")
    parsed = parser.parse_args(args)
    restore_stop_signals()
    serve(parsed.port, parsed.cache_dir, parsed.upstream, parsed.extra, parsed.cert)
    return 0


if __name__ == "__main__":
    sys.exit(main())
