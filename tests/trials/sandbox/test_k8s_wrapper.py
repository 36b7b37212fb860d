"""The pod's wrapper as the Kubernetes backend starts it: already the command's unprivileged uid
with no capability (a pod's securityContext; here ``setpriv`` does the same to a local
process, no cluster), and its bridged socket relayed over TCP to the run worker's side."""

from __future__ import annotations

import os
import shutil
import socketserver
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangar_dagster.trials.sandbox import SandboxRequest
from hangar_dagster.trials.sandbox._container import INIT_SOURCE, write_setup

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("root")]

UID = 2_000_000_321
# The system's: this venv's interpreter may live where the uid cannot reach (pyenv under /root);
# in a pod it is the image's. The wrapper and the client need only the standard library.
PYTHON = "/usr/bin/python3"
CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"hi")
print(s.recv(100).decode())
print(open("/proc/self/status").read())
"""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"echo:" + self.request.recv(100))


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory the unprivileged uid can reach (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="hangar-k8s-wrapper-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_wrapper_started_unprivileged_runs_the_command_and_bridges_its_socket(
    base: Path,
) -> None:
    control, wd, socks = base / "control", base / "wd", base / "socks"
    for d in (control, wd, socks):
        d.mkdir()
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    port = server.server_address[1]
    sock = str(socks / "proxy.sock")
    req = SandboxRequest(
        argv=[PYTHON, "-I", "-c", CLIENT, sock], workdir=wd,
        env={"PATH": "/usr/bin:/bin"}, timeout_s=30,
    )  # fmt: skip
    write_setup(req, UID, UID, control, bridges=[(sock, "127.0.0.1", port)])
    for d in (control, wd, socks, *control.iterdir()):
        os.chown(d, UID, UID)
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    proc = subprocess.run(
        [setpriv, f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", "--no-new-privs",
         PYTHON, "-I", "-S", "-c", INIT_SOURCE, str(control / "setup.json")],
        capture_output=True, timeout=60,
    )  # fmt: skip
    server.shutdown()
    server.server_close()
    out, err = (control / "out").read_text(), (control / "err").read_text()
    assert proc.returncode == 0, (out, err, proc.stderr)
    assert out.splitlines()[0] == "echo:hi"  # through the wrapper's socket to the TCP side
    status = dict(line.split(":", 1) for line in out.splitlines()[1:] if ":" in line)
    assert status["Uid"].split() == [str(UID)] * 4
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
