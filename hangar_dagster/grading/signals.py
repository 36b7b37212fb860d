"""Signals read from a trial's patch: what could hook a test run, tests it edited, canary hits.

Pure functions over diff text (``git diff`` format, as ``gitrepo.take_patch``
writes it). They are signals for a reader of the grade, not refusals: the
grader still runs, and ``hangar-grade`` ignores these files anyway.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from hangar_dagster.util.gitrepo import changed_files

# Files that run code or change options when pytest or Python starts, wherever they sit.
_HOOK_NAMES = {"conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", ".pytest.ini"}
# Compiled modules: an extension wins over a .py of the same name, a .pyc can stand in for one.
_COMPILED = (".pyc", ".pyo", ".so", ".pyd")
# Config files that hook a test run only through their pytest section.
_SECTIONED = {"tox.ini", "setup.cfg", "pyproject.toml"}
# ini keys pytest reads; a changed line with one of them counts when its section is out of view.
_PYTEST_KEYS = {
    "addopts",
    "testpaths",
    "python_files",
    "python_classes",
    "python_functions",
    "norecursedirs",
    "required_plugins",
    "pythonpath",
    "confcutdir",
    "usefixtures",
    "filterwarnings",
    "minversion",
    "rootdir",
    "asyncio_mode",
    "timeout",
}
_SECTION = re.compile(r"^\s*\[+\s*([^\]]+?)\s*\]+\s*$")
_KEY = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*[=:]")


@dataclass(frozen=True)
class FileDiff:
    old_path: str | None  # None when the patch adds the file
    new_path: str | None  # None when the patch deletes it
    lines: list[str]  # the section's lines after the ``diff --git`` header


def file_diffs(patch: str) -> list[FileDiff]:
    """Split a patch into one entry per file, with whether it was added, deleted or renamed."""
    sections: list[list[str]] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    out: list[FileDiff] = []
    for section in sections:
        paths = _header_paths(section[0])
        if not paths:
            continue  # a header changed_files can't read (quoted path): nothing to attribute
        old, new = paths[0], paths[-1]
        header = [line for line in section[1:] if not line.startswith("@@")][:6]
        if any(line.startswith("new file mode") for line in header):
            out.append(FileDiff(None, new, section[1:]))
        elif any(line.startswith("deleted file mode") for line in header):
            out.append(FileDiff(old, None, section[1:]))
        else:
            out.append(FileDiff(old, new, section[1:]))
    return out


_QUOTED_OR_WORD = re.compile(r'"(?:[^"\\]|\\.)*"|\S+')
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(token: str) -> str:
    """A path as git's C-style quoting writes it (non-ASCII bytes as octal escapes)."""
    if not (token.startswith('"') and token.endswith('"')):
        return token
    body, out, i = token[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and body[i + 1 : i + 4].isdigit() and len(body[i + 1 : i + 4]) == 3:
            out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        elif ch == "\\" and i + 1 < len(body) and body[i + 1] in _ESCAPES:
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        else:
            out += ch.encode()
            i += 1
    return out.decode("utf-8", errors="replace")


def _header_paths(header: str) -> list[str]:
    """Both paths of a ``diff --git`` header; git quotes a name with non-ASCII or odd bytes,
    and such a file must not slip past the signals."""
    if '"' not in header:
        return changed_files(header)
    tokens = _QUOTED_OR_WORD.findall(header[len("diff --git ") :])
    if len(tokens) != 2:
        return []
    paths = [_unquote(t) for t in tokens]
    if not (paths[0].startswith("a/") and paths[1].startswith("b/")):
        return []
    return [paths[0][2:], paths[1][2:]]


def _is_pytest_section(name: str) -> bool:
    # [pytest], [tool:pytest], [tool.pytest.ini_options], [tool.pytest],
    # [project.entry-points.pytest11]
    return "pytest" in name.lower()


def _touches_pytest_section(lines: list[str]) -> bool:
    """Whether a changed line of these hunks lies in, adds or removes a pytest section."""
    in_hunk = False
    section: str | None = None  # None: the hunk starts inside a section it doesn't show
    for line in lines:
        if line.startswith("@@"):
            in_hunk, section = True, None
            continue
        if not in_hunk or line[:1] not in ("+", "-", " "):
            continue  # file headers and "no newline at end of file" markers
        body = line[1:]
        if m := _SECTION.match(body):
            section = m.group(1)
            if line[0] != " " and _is_pytest_section(section):
                return True
            continue
        if line[0] == " ":
            continue
        if "pytest" in body.lower():
            return True
        if section is not None and _is_pytest_section(section):
            return True
        if section is None and (k := _KEY.match(body)) and k.group(1).lower() in _PYTEST_KEYS:
            return True
    return False


def _escaping_link(fd: FileDiff) -> bool:
    """Whether this file is a symlink the patch points outside the repo."""
    if not any(line.startswith(("new file mode 120000", "new mode 120000")) for line in fd.lines):
        return False
    added = [line[1:] for line in fd.lines if line.startswith("+") and not line.startswith("+++")]
    if not added or fd.new_path is None:
        return False
    target = PurePosixPath(added[0])
    if target.is_absolute():
        return True
    depth = len(PurePosixPath(fd.new_path).parts) - 1
    for part in target.parts:
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def tamper_signals(patch: str) -> list[str]:
    """Paths the patch adds or changes that can hook a test run (deletions are not counted)."""
    hits: set[str] = set()
    for fd in file_diffs(patch):
        if fd.new_path is None:
            continue
        name = PurePosixPath(fd.new_path).name
        if name in _HOOK_NAMES or name.endswith((".pth", *_COMPILED)):
            hits.add(fd.new_path)
        elif name == "entry_points.txt" or _escaping_link(fd):
            hits.add(fd.new_path)
        elif name in _SECTIONED and _touches_pytest_section(fd.lines):
            hits.add(fd.new_path)
    return sorted(hits)


def is_test_file(path: str) -> bool:
    p = PurePosixPath(path)
    if p.suffix == ".py" and (p.name.startswith("test_") or p.stem.endswith("_test")):
        return True
    return any(part in ("tests", "test") for part in p.parts[:-1])


def touched_tests(patch: str, base_files: Collection[str]) -> list[str]:
    """Existing test files (in ``base_files``) the patch modifies, deletes or renames away."""
    touched: set[str] = set()
    for fd in file_diffs(patch):
        if fd.old_path is not None and fd.old_path in base_files and is_test_file(fd.old_path):
            touched.add(fd.old_path)
    return sorted(touched)


def canary_hits(texts: Mapping[str, str], canary: str) -> list[str]:
    """The keys of ``texts`` whose value contains the canary, sorted."""
    if not canary:
        return []
    return sorted(where for where, text in texts.items() if canary in text)
