"""``hangar ui``: the Dagster webserver and daemon on the CLI's instance, and reloading it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from hangar_dagster.cli.common import err
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import HOME_VAR, HangarPaths, Settings
from hangar_dagster.util.procs import (
    LockHeld,
    PidLock,
    become_subreaper,
    die_with_parent,
    stop_tree,
)

WORKSPACE_YAML = """load_from:
  - python_module:
      module_name: hangar_dagster.orchestration.definitions
      attribute: defs
      location_name: hangar
"""
WEBSERVER_URL_FILE = "webserver.url"


# How long dagster dev gets to stop its webserver and daemon after SIGINT, and then what is left
# below us (code servers, run workers, sandboxes) after SIGTERM, before SIGKILL.
DEV_STOP_S = 30.0
TREE_STOP_S = 10.0


def ui_lock(home: Path) -> PidLock:
    """The lock a running `hangar ui` holds on its HANGAR_HOME (one daemon per instance)."""
    return PidLock(HangarPaths(home).ui_lock)


def ui_cmd(port: Annotated[int, typer.Option(help="Webserver port.")] = 3000) -> None:
    """Start the Dagster UI and daemon on the same instance the CLI uses."""
    settings = Settings.from_env()
    p = settings.paths
    lock = ui_lock(p.home)
    try:
        lock.acquire()
    except LockHeld as e:
        err.print(
            f"[red]refused:[/] `hangar ui` (pid {e.pid if e.pid is not None else '?'}) already runs"
            f" on HANGAR_HOME {p.home} ({e.path}); a second one would run a second daemon against"
            " the same instance. Stop that one first, or use another HANGAR_HOME"
        )
        raise typer.Exit(2) from None
    try:
        code = _serve(settings, port)
    finally:
        lock.release()
    raise typer.Exit(code)


def _serve(settings: Settings, port: int) -> int:
    p = settings.paths
    command = dagster_dev_command(settings)
    # Orphans below us (a run worker whose code server exited) are reparented to us, not init,
    # so the sweep at the end finds them.
    become_subreaper()
    # Tells `hangar experiment run` in other shells where to ask for a reload.
    url_file = p.home / WEBSERVER_URL_FILE
    url_file.write_text(f"http://127.0.0.1:{port}\n")
    stopping: list[signal.Signals] = []

    def on_signal(signo: int, _frame: object) -> None:
        stopping.append(signal.Signals(signo))

    # A shell may start us with SIGINT ignored, which children would inherit; dagster dev needs it.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)
    # dagster dev and its code servers resolve HANGAR_HOME as this process did (it may be relative).
    env = {**os.environ, HOME_VAR: str(p.home)}
    # In our process group (a kill of the group reaches the webserver, daemon, code servers and
    # run workers at once), and told to stop when we die however we die.
    child = subprocess.Popen(
        [*command, "-h", "127.0.0.1", "-p", str(port)],
        env=env,
        preexec_fn=lambda: die_with_parent(signal.SIGINT),  # no threads here yet: safe
    )
    watcher = threading.Thread(
        target=watch_experiments,
        args=(settings, f"http://127.0.0.1:{port}", done := threading.Event()),
        name="hangar-watch-experiments",
        daemon=True,
    )
    watcher.start()
    try:
        while child.poll() is None and not stopping:
            try:
                child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        if stopping:
            err.print(f"[yellow]{stopping[0].name}: stopping the webserver, daemon and runs[/]")
            # Once, and not after a Ctrl-C, which the terminal sent to the whole group already:
            # a second SIGINT would cut dagster dev's own shutdown short (the sweep below would
            # still stop what it leaves, but less gently).
            if not _terminal_sent(stopping[0]):
                _interrupt(child.pid)
            try:
                child.wait(timeout=DEV_STOP_S)
            except subprocess.TimeoutExpired:
                child.kill()
        code = child.wait()
    finally:
        done.set()
        # Code servers, run workers and their sandboxes dagster dev left behind.
        left = stop_tree(os.getpid(), TREE_STOP_S)
        if left:
            err.print(f"[yellow]killed {len(left)} process(es) that outlived dagster dev[/]")
        if removed := remove_orphan_containers():
            err.print(f"[yellow]removed {removed} sandbox container(s) of the stopped runs[/]")
        url_file.unlink(missing_ok=True)
    # Stopped on request: the shell's convention (130 for SIGINT, 143 for SIGTERM).
    return 128 + stopping[0] if stopping else code


def remove_orphan_containers() -> int:
    """The Docker sandboxes of the run workers just stopped: they are children of dockerd, not
    of us, so the sweep above cannot reach them; each names its owner process, now gone."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return 0  # no engine here: no Docker sandbox ran
    from hangar_dagster.trials.sandbox import SandboxUnavailable
    from hangar_dagster.trials.sandbox.docker import cleanup_leftovers

    try:
        return cleanup_leftovers()
    except (SandboxUnavailable, ImportError) as e:  # the stop goes on; the next trials run retries
        err.print(f"[yellow]could not look for sandbox containers left behind: {e}[/]")
        return 0


def _terminal_sent(sig: signal.Signals) -> bool:
    """Whether a SIGINT most likely came from the terminal (we are its foreground group)."""
    try:
        return sig == signal.SIGINT and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):  # no terminal, or no stdin at all
        return False


def _interrupt(pid: int) -> None:
    """What Ctrl-C does to dagster dev: it stops its webserver and daemon and waits for them."""
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        pass


def dagster_dev_command(settings: Settings) -> list[str]:
    """``dagster dev`` on hangar's workspace (location ``hangar``), wherever the CLI was started."""
    home = ensure_dagster_home(settings)
    workspace = home / "workspace.yaml"
    workspace.write_text(WORKSPACE_YAML)
    dagster = shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))
    return [dagster, "dev", "-w", str(workspace)]


RELOAD_LOG_FILE = "webserver-reload.log"
# A reload is asked for at most this long (a webserver still starting refuses for a few seconds;
# a loaded one may take long to answer); each request waits RELOAD_REQUEST_S.
RELOAD_DEADLINE_S = 60.0
RELOAD_REQUEST_S = 15.0
# How often `hangar ui` looks for experiments submitted, archived or unarchived since it loaded.
WATCH_INTERVAL_S = 3.0


def webserver_url(settings: Settings) -> str | None:
    """HANGAR_WEBSERVER_URL, else the webserver of the `hangar ui` running on this HANGAR_HOME.

    A webserver.url no `hangar ui` holds the lock for was left by one that was killed: ignored.
    """
    if settings.webserver_url:
        return settings.webserver_url
    url_file = settings.home / WEBSERVER_URL_FILE
    if not url_file.is_file() or ui_lock(settings.home).holder() is None:
        return None
    return url_file.read_text().strip() or None


def notify_webserver(settings: Settings) -> None:
    """Ask a running webserver to reload its code location, in the background: returns at once.

    The request runs in a detached process (bounded by RELOAD_DEADLINE_S, its outcome appended to
    HANGAR_HOME/webserver-reload.log), so a slow or stalled webserver never holds up the CLI.
    Nothing depends on it answering: `hangar ui` reloads by itself when it sees the change
    (``watch_experiments``); a webserver started elsewhere (HANGAR_WEBSERVER_URL) relies on it.
    """
    url = webserver_url(settings)
    if not url:
        return
    log = settings.home / RELOAD_LOG_FILE
    with log.open("ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "hangar_dagster.cli.ui", url],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # not stopped by a Ctrl-C meant for the CLI
            close_fds=True,
        )
    err.print(f"[dim]asked {url} to reload its code location (in the background; {log})[/]")


def reload_location(url: str, deadline_s: float = RELOAD_DEADLINE_S) -> str | None:
    """Ask the webserver at ``url`` to reload location ``hangar``; None, or why it did not."""
    import urllib.request

    query = 'mutation { reloadRepositoryLocation(repositoryLocationName: "hangar") { __typename } }'
    req = urllib.request.Request(
        url.rstrip("/") + "/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    deadline = time.monotonic() + deadline_s
    while True:
        left = deadline - time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=max(1.0, min(RELOAD_REQUEST_S, left))) as r:
                r.read()
            return None
        except OSError as e:  # refused while starting, or timed out: again, until the deadline
            if deadline - time.monotonic() < 2:
                return f"could not reach the webserver at {url} to reload it ({e}); use Reload in the UI"
            time.sleep(2)


def _loaded_key(settings: Settings) -> tuple[str, ...]:
    """What the definitions depend on: the active experiments (catalog.active_experiments)."""
    from hangar_dagster.experiment.catalog import archived_ids, stored_ids

    p = settings.paths
    archived = archived_ids(p)
    return tuple(i for i in stored_ids(p) if i not in archived)


def watch_experiments(settings: Settings, url: str, done: threading.Event) -> None:
    """Reload the code location whenever the active experiments change, until ``done``.

    This is what makes the daemon pick a new experiment up whoever submitted it and whatever the
    submitting CLI's own request did: the daemon refreshes its copy when the code server reloads.
    """
    loaded = _loaded_key(settings)
    while not done.wait(WATCH_INTERVAL_S):
        now = _loaded_key(settings)
        if now == loaded:
            continue
        why = reload_location(url)
        if why is None:
            loaded = now
            err.print(f"[dim]reloaded the code location: {len(now)} active experiment(s)[/]")
        else:
            err.print(f"[yellow]{why}[/]")


if __name__ == "__main__":  # notify_webserver's background request
    problem = reload_location(sys.argv[1])
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} {sys.argv[1]}: {problem or 'reloaded'}", flush=True)
    sys.exit(1 if problem else 0)
