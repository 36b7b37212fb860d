"""File helpers shared by the trial runner and the grader."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` so readers see the old file or the whole new one, never a half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def remove_tree(root: Path) -> None:
    """Delete a work dir even where it (or code run in it) made directories read-only."""
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
    if root.exists():
        os.chmod(root, stat.S_IRWXU)
    shutil.rmtree(root, ignore_errors=True)
