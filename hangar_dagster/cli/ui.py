"""``hangar ui``: the Dagster webserver and daemon on the CLI's instance, and reloading it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from hangar_dagster.cli.common import err
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import HOME_VAR, Settings

WORKSPACE_YAML = """load_from:
  - python_module:
      module_name: hangar_dagster.orchestration.definitions
      attribute: defs
      location_name: hangar
"""
WEBSERVER_URL_FILE = "webserver.url"


def ui_cmd(port: Annotated[int, typer.Option(help="Webserver port.")] = 3000) -> None:
    """Start the Dagster UI and daemon on the same instance the CLI uses."""
    settings = Settings.from_env()
    p = settings.paths
    command = dagster_dev_command(settings)
    # Tells `hangar experiment run` in other shells where to ask for a reload.
    url_file = p.home / WEBSERVER_URL_FILE
    url_file.write_text(f"http://127.0.0.1:{port}\n")
    # A shell may start us with SIGINT ignored, which children would inherit; dagster dev needs it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Its own process group, so that stopping hangar stops the webserver, daemon and code servers.
    # dagster dev and its code servers resolve HANGAR_HOME as this process did (it may be relative).
    env = {**os.environ, HOME_VAR: str(p.home)}
    child = subprocess.Popen(
        [*command, "-h", "127.0.0.1", "-p", str(port)], start_new_session=True, env=env
    )
    signal.signal(signal.SIGTERM, lambda *_: _interrupt(child.pid))
    try:
        code = child.wait()
    except KeyboardInterrupt:
        _interrupt(child.pid)
        code = child.wait()
    finally:
        url_file.unlink(missing_ok=True)
    raise typer.Exit(code)


def _interrupt(pgid: int) -> None:
    """What Ctrl-C does: SIGINT to the whole group (dagster dev waits for its children)."""
    try:
        os.killpg(pgid, signal.SIGINT)
    except ProcessLookupError:
        pass


def dagster_dev_command(settings: Settings) -> list[str]:
    """``dagster dev`` on hangar's workspace (location ``hangar``), wherever the CLI was started."""
    home = ensure_dagster_home(settings)
    workspace = home / "workspace.yaml"
    workspace.write_text(WORKSPACE_YAML)
    dagster = shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))
    return [dagster, "dev", "-w", str(workspace)]


def notify_webserver(settings: Settings) -> None:
    """Ask a running webserver to reload its code location, so a new experiment shows at once.

    The webserver is HANGAR_WEBSERVER_URL, else the one `hangar ui` started on this HANGAR_HOME.
    """
    url = settings.webserver_url
    url_file = settings.home / WEBSERVER_URL_FILE
    if not url and url_file.is_file():
        url = url_file.read_text().strip()
    if not url:
        return
    import urllib.request

    query = 'mutation { reloadRepositoryLocation(repositoryLocationName: "hangar") { __typename } }'
    req = urllib.request.Request(
        url.rstrip("/") + "/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    # A webserver that `hangar ui` is still starting refuses connections for a few seconds.
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(req, timeout=30).read()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                err.print(
                    f"[yellow]could not reach the webserver at {url} to reload it ({e}); use Reload in the UI[/]"
                )
                return
            time.sleep(2)
