"""What the adversarial suite shares: the fixture tasks' code and hidden tests, and patch files."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grading_builders import commit_all, experiment

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.util.gitrepo import git, take_patch

BUGGY_CALC = "def add(a, b):\n    return a - b\n"
FIXED_CALC = "def add(a, b):\n    return a + b\n"
BUGGY_TEXT = "def slug(s):\n    return s.lower()\n"
FIXED_TEXT = "def slug(s):\n    return s.lower().replace(' ', '-')\n"
# The hidden conftest gives a fixture and a hook: both must work through hangar-grade.
HIDDEN_CONFTEST = (
    "import pytest\n\n\n"
    "@pytest.fixture\n"
    "def pair():\n    return (2, 3)\n\n\n"
    "def pytest_terminal_summary(terminalreporter):\n"
    "    terminalreporter.write_line('hidden conftest hook ran')\n"
)
# Each expected value sits in a local named `expected` (what a frame-reading patch looks for).
HIDDEN_CALC = {
    "conftest.py": HIDDEN_CONFTEST,
    "test_calc_hidden.py": (
        "from calc import add\n\n\n"
        "def test_add(pair):\n    expected = 5\n    assert add(*pair) == expected\n\n\n"
        "def test_negative():\n    expected = -2\n    assert add(-1, -1) == expected\n\n\n"
        "def test_zero():\n    expected = 0\n    assert add(0, 0) == expected\n"
    ),
}
HIDDEN_TEXT = {
    "test_text_hidden.py": (
        "from text import slug\n\n\n"
        "def test_slug():\n    assert slug('A B') == 'a-b'\n\n\n"
        "def test_plain():\n    assert slug('ab') == 'ab'\n"
    )
}


@dataclass(frozen=True)
class Link:
    """A symlink a patch adds, pointing at ``target``."""

    target: str


Files = dict[str, "str | bytes | Link | None"]  # None deletes the file
PatchMaker = Callable[[Files], str]


@dataclass(frozen=True)
class Fixture:
    repo: Path
    base: str
    make_patch: PatchMaker
    references: dict[str, str]  # task id -> reference patch
    sandbox: str = "bwrap"  # environment.sandbox the grader runs on
    image: str | None = None  # environment.image (docker)

    def experiment(self, **grader: Any) -> ResolvedExperiment:
        tasks = {
            "calc": {"repo": str(self.repo), "base_sha": self.base, "hidden_files": HIDDEN_CALC,
                     "reference_patch": self.references["calc"]},
            "text": {"repo": str(self.repo), "base_sha": self.base, "hidden_files": HIDDEN_TEXT,
                     "reference_patch": self.references["text"]},
        }  # fmt: skip
        env = {"sandbox": self.sandbox, **({"image": self.image} if self.image else {})}
        return experiment(tasks, grader={"timeout_s": 60, **grader}, environment=env)


def write_files(root: Path, files: Files) -> None:
    for rel, content in files.items():
        path = root / rel
        if content is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.unlink(missing_ok=True)  # a link can stand where a module was
            path.symlink_to(content.target)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def build_fixture(root: Path) -> Fixture:
    """The fixture task repo under ``root`` (buggy calc and text at its base) and its references."""
    repo = root / "task-repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", str(repo))
    write_files(repo, {"calc.py": BUGGY_CALC, "text.py": BUGGY_TEXT,
                  "tests/test_calc.py": "from calc import add\n\n\ndef test_zero():\n"
                                        "    assert add(0, 0) == 0\n"})  # fmt: skip
    base = commit_all(repo, "base")
    counter = iter(range(10_000))

    def make(files: Files) -> str:
        work = root / f"patch-{next(counter)}"
        git("clone", "-q", str(repo), str(work))
        write_files(work, files)
        return take_patch(work, base)

    refs = {"calc": make({"calc.py": FIXED_CALC}), "text": make({"text.py": FIXED_TEXT})}
    return Fixture(repo, base, make, refs)


@contextmanager
def fix_server() -> Iterator[int]:
    """A host loopback server that hands out the fix to whoever connects (none should): its port."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.sendall(b"+")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        srv.close()


def case_files(files: dict[str, object], fill: dict[str, str]) -> Files:
    """A case's files with its ``{port}``-style placeholders filled in."""
    out: Files = {}
    for path, content in files.items():
        if isinstance(content, str):
            for token, value in fill.items():
                content = content.replace(token, value)
        out[path] = content  # type: ignore[assignment]
    return out
