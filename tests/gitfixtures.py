"""Small real git repositories for tests (no mocks of git)."""

from __future__ import annotations

from pathlib import Path

from hangar_dagster.util.gitrepo import git, isolated_clone

CALC = "def add(a, b):\n    return a - b\n"


class Upstream:
    """A task repo: the buggy base (tag v1), an ``answers`` branch off it with its own blob,
    then a later commit on main with the fix (annotated tag v2)."""

    def __init__(self, root: Path):
        self.path = root / "upstream"
        self.path.mkdir()
        git("init", "-q", "-b", "main", str(self.path))
        (self.path / "calc.py").write_text(CALC)
        (self.path / "old.txt").write_text("old\n")
        self.commit("base")
        self.base = self.head()
        git("tag", "v1", cwd=self.path)
        git("checkout", "-q", "-b", "answers", cwd=self.path)
        (self.path / "ANSWER.txt").write_text("secret answer\n")
        self.commit("answer")
        self.answer_commit = self.head()
        self.answer_blob = git("rev-parse", "HEAD:ANSWER.txt", cwd=self.path).strip()
        git("checkout", "-q", "main", cwd=self.path)
        (self.path / "calc.py").write_text(CALC.replace("a - b", "a + b"))
        self.commit("the fix")
        self.later = self.head()
        git("tag", "-a", "v2", "-m", "annotated", cwd=self.path)

    def commit(self, message: str) -> None:
        git("add", "-A", cwd=self.path)
        git("commit", "-q", "-m", message, cwd=self.path)

    def head(self) -> str:
        return git("rev-parse", "HEAD", cwd=self.path).strip()


def make_clone(tmp_path: Path) -> tuple[Path, str]:
    """A one-commit repo with the calc bug, and an isolated clone of it at that commit."""
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    git("init", "-q", "-b", "main", str(upstream))
    (upstream / "calc.py").write_text(CALC)
    git("add", "-A", cwd=upstream)
    git("commit", "-q", "-m", "calc", cwd=upstream)
    sha = git("rev-parse", "HEAD", cwd=upstream).strip()
    clone = tmp_path / "clone"
    isolated_clone(str(upstream), sha, clone)
    return clone, sha
