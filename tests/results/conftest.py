"""A private Postgres cluster for the DuckLake store's tests: initdb in a temp dir, a Unix socket
only (no TCP port to collide on), stopped at the end. No system cluster or state is used;
scripts/bootstrap installs the binaries (Debian's postgresql)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"no {name}: run scripts/bootstrap (it installs Debian's postgresql)")
    return found[-1]


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "run"

    def _run(self, *cmd: str) -> None:
        # initdb and postgres refuse to run as root: as root, run them as the postgres user
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *cmd], check=True, capture_output=True, text=True)

    def start(self) -> None:
        self.socket.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.socket, "postgres")
        data = str(self.root / "data")
        self._run(
            _bin("initdb"), "-D", data, "-U", "hangar", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        opts = f"-k {self.socket} -c listen_addresses= -c fsync=off -c max_connections=200"
        self._run(
            _bin("pg_ctl"), "-D", data, "-l", str(self.root / "log"), "-o", opts, "-w", "start"
        )

    def stop(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")

    def conninfo(self, db: str = "postgres") -> str:
        return f"host={self.socket} dbname={db} user=hangar"

    def new_database(self) -> str:
        """A fresh database's connection string (one DuckLake catalog per test)."""
        name = f"lake_{uuid.uuid4().hex[:10]}"
        subprocess.run(
            [
                _bin("psql"),
                "-q",
                "-h",
                str(self.socket),
                "-U",
                "hangar",
                "-d",
                "postgres",
                "-c",
                f"CREATE DATABASE {name}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return self.conninfo(name)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    # not under pytest's tmp dirs: they are private to root, and postgres runs as its own user
    root = Path(tempfile.mkdtemp(prefix="hangar-pg-"))
    root.chmod(0o755)
    cluster = Cluster(root)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def lake_env(
    pg_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """HANGAR_* for a DuckLake store on a fresh catalog database, data under tmp_path/lake."""
    env = {
        "HANGAR_HOME": str(tmp_path / "hangar"),
        "HANGAR_STORE": "ducklake",
        "HANGAR_STORE_CATALOG": pg_cluster.new_database(),
        "HANGAR_STORE_DATA": str(tmp_path / "lake"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env
