"""The webserver loads the code location and lists a submitted experiment's assets (over GraphQL)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hangar_dagster.util.procs import alive, descendants
from tests.conftest import cli_env, hangar

pytestmark = pytest.mark.slow

QUERY = """{ assetNodes { assetKey { path } groupName isPartitioned
  dependencyKeys { path } } }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def graphql(port: int, query: str) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_hangar_ui_lists_the_experiment_assets_with_lineage(
    example_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    submitted = hangar("experiment", "run", str(example_dir / "experiment.yaml"), home=home)
    assert submitted.returncode == 0, submitted.stderr
    experiment_id = submitted.stdout.split("submitted ")[1].split()[0]
    port = free_port()
    log = tmp_path / "ui.log"
    # `hangar ui` with the CLI's environment: it must find the same DAGSTER_HOME by itself.
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("hangar")), "ui", "--port", str(port)],
        env=cli_env(home),
        cwd=tmp_path,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        nodes = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                nodes = graphql(port, QUERY)["data"]["assetNodes"]  # type: ignore[index]
                break
            except OSError:
                time.sleep(1)
        assert nodes is not None, "the webserver never answered:\n" + log.read_text()[-3000:]
        mine = {
            tuple(n["assetKey"]["path"]): n
            for n in nodes
            if n["assetKey"]["path"][0] == experiment_id
        }
        names = {k[1] for k in mine}
        assert names == {"spec", "pin_sets", "base_checks", "trials", "grades", "index"}
        assert all(n["groupName"] == experiment_id for n in mine.values())
        deps = {k[1]: {d["path"][1] for d in n["dependencyKeys"]} for k, n in mine.items()}
        assert deps["trials"] == {"pin_sets", "base_checks"}
        assert deps["grades"] >= {"trials"}
        assert deps["index"] == {"grades"}
        assert mine[(experiment_id, "trials")]["isPartitioned"] is True
        assert (home / "webserver.url").read_text().strip() == f"http://127.0.0.1:{port}"
        # SIGTERM to hangar alone stops the whole UI (webserver, daemon, code servers).
        tree = descendants(proc.pid)
        assert len(tree) >= 3, tree
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM
        assert not (home / "webserver.url").exists()
        assert [p for p in tree if alive(p)] == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass
        proc.wait()
