"""util.fs.write_atomic under writers racing on one path."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hangar_dagster.util.fs import write_atomic

pytestmark = pytest.mark.unit


def test_writers_racing_on_one_path_all_succeed_and_leave_a_whole_file(tmp_path: Path) -> None:
    """The bug it pins: every writer used one temporary name, so one writer's rename took the
    file another was about to rename (FileNotFoundError; seen seeding a fresh home's
    dagster.yaml from three processes in CI)."""
    target = tmp_path / "dagster.yaml"
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        start.wait()
        for _ in range(200):
            try:
                write_atomic(target, f"writer {n}\n" * 100)
            except BaseException as err:  # noqa: BLE001 - collected for the assert
                errors.append(err)
                return

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    lines = set(target.read_text().splitlines())
    assert len(lines) == 1 and lines.pop().startswith("writer ")
    assert [p.name for p in tmp_path.iterdir()] == ["dagster.yaml"]  # no temporary left
