"""A real git repository whose mainline a test adds merges to (shadow tests)."""

from __future__ import annotations

from pathlib import Path

import yaml

from hangar_dagster.experiment.harness import freeze
from hangar_dagster.util.gitrepo import git

CALC = """def add(a, b):
    return a - b


def sub(a, b):
    return a + b


def neg(a):
    return -a


def double(a):
    return a * 3
"""


class Mainline:
    """``main`` with a small buggy module; ``merge`` lands a change as a real merge commit
    (a feature branch merged with --no-ff), ``squash`` as one commit on main."""

    def __init__(self, root: Path):
        self.path = root / "mainline"
        self.path.mkdir(parents=True)
        git("init", "-q", "-b", "main", str(self.path))
        self.write({"calc.py": CALC, "README.md": "calc\n", "tests/__init__.py": ""})
        self.commit("initial")
        self.n = 0

    def write(self, files: dict[str, str | None]) -> None:
        for rel, text in files.items():
            path = self.path / rel
            if text is None:
                path.unlink()
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)

    def commit(self, message: str) -> str:
        git("add", "-A", cwd=self.path)
        git("commit", "-q", "-m", message, cwd=self.path)
        return self.head()

    def head(self) -> str:
        return git("rev-parse", "HEAD", cwd=self.path).strip()

    def merge(self, message: str, files: dict[str, str | None]) -> str:
        """Land ``files`` on main through a merge commit; returns the merge's SHA."""
        self.n += 1
        branch = f"feature-{self.n}"
        git("checkout", "-q", "-b", branch, cwd=self.path)
        self.write(files)
        self.commit(f"wip {self.n}")
        git("checkout", "-q", "main", cwd=self.path)
        git("merge", "-q", "--no-ff", "-m", message, branch, cwd=self.path)
        return self.head()

    def squash(self, message: str, files: dict[str, str | None]) -> str:
        self.write(files)
        return self.commit(message)

    def fix_add(self) -> str:
        """Merge the fix of add with its test: kept, and a valid task."""
        return self.merge(
            "Fix add: it subtracted",
            {
                "calc.py": self.calc("return a - b", "return a + b"),
                "tests/test_add.py": hidden_test("add", "assert add(2, 3) == 5"),
            },
        )

    def fix_sub(self) -> str:
        """Merge the fix of sub with its test (after fix_add, or before it)."""
        return self.merge(
            "Fix sub: it added",
            {
                "calc.py": self.calc("return a + b\n\n\ndef neg", "return a - b\n\n\ndef neg"),
                "tests/test_sub.py": hidden_test("sub", "assert sub(5, 3) == 2"),
            },
        )

    def calc(self, old: str, new: str) -> str:
        """calc.py as it reads now with ``old`` replaced by ``new``."""
        text = (self.path / "calc.py").read_text()
        assert old in text, old
        return text.replace(old, new)


def hidden_test(name: str, body: str) -> str:
    return f"from calc import *\n\n\ndef test_{name}():\n    {body}\n"


def standin_candidate(root: Path, playbook: dict[str, object]) -> tuple[Path, str]:
    """The scripted stand-in agent frozen as a candidate that always applies its playbook's
    ``fix`` edits (solve_rate 1); returns (registry, lock name)."""
    src = root / "candidate-src"
    src.mkdir(parents=True)
    (src / "harness.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "candidate",
                "agent": {"adapter": "standin", "cli": "hangar-standin", "version": "0.1.0"},
                "model": "standin-scripted-2026-01-01",
                "approvals": "full-auto",
                "instructions": "instructions.md",
                "standin": {"solve_rate": 1.0},
            }
        )
    )
    (src / "instructions.md").write_text("Fix what the task says.\n")
    (src / "playbook.yaml").write_text(yaml.safe_dump(playbook))
    registry = root / "registry"
    return registry, freeze(src, registry).ref
