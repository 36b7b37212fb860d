"""The static pass: Python constructs a patch adds that can bend a test run, by file and line.

Every ``.py`` file the patch adds or changes is parsed (``ast``) as it is
after the patch, and each construct below becomes a signal
``static: <file>:<line>: <what>`` when its node spans a line the patch added
or changed (an ``import ctypes`` the base already had is not the patch's
doing). Symlinks the patch adds are signals too, and so is a ``.py`` file that
does not parse. Signals flag a grade; they never fail it. docs/grading.md
("Static pass") lists what is caught and what cannot be.

Names are resolved through the file's own imports and simple aliases
(``import sys as s``, ``from sys import modules``, ``m = sys.modules``); a
name built at run time (``getattr(sys, name)``) is out of reach.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import stat
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from hangar_dagster.grading.signals import FileDiff, file_diffs, is_test_file

_MAX_BYTES = 2 * 1024 * 1024  # a larger .py file is a signal of its own, not parsed
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")

# Mappings whose writes change what every module imports or sees as a builtin.
_MAPPINGS = {"sys.modules": "sys.modules", "builtins": "builtins", "builtins.__dict__": "builtins"}
_MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
# Attributes whose assignment changes what an object is or what a function runs.
_IDENTITY = {"__class__", "__code__", "__globals__", "__bases__", "cell_contents"}
# Attributes that reach another frame (the caller's locals, a traceback's frames).
_FRAME_ATTRS = {"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame",
                "cr_frame", "ag_frame"}  # fmt: skip
# Names whose mere use is a signal, with what they do.
_REFS = {
    "sys._getframe": "frame access",
    "sys._current_frames": "frame access",
    "inspect.currentframe": "frame access",
    "inspect.stack": "frame access",
    "inspect.trace": "frame access",
    "inspect.getouterframes": "frame access",
    "inspect.getinnerframes": "frame access",
    "gc.get_referrers": "garbage collector walk",
    "gc.get_referents": "garbage collector walk",
    "gc.get_objects": "garbage collector walk",
    "os._exit": "process exit without cleanup",
    "atexit.register": "exit handler",
    "signal.signal": "signal handler",
    "os.dup2": "descriptor redirection",
    "sys.settrace": "trace hook",
    "sys.setprofile": "profile hook",
    "threading.settrace": "trace hook",
    "threading.setprofile": "profile hook",
    "sys.addaudithook": "audit hook",
}
# Only a call counts: `isinstance(f, types.FunctionType)` is everyday code.
_CALLS = {
    "types.FunctionType": "function built from a code object",
    "types.CodeType": "code object built by hand",
}
_CODE_RUNNERS = {"builtins.exec": "exec", "builtins.eval": "eval", "builtins.compile": "compile"}
_SETTERS = {
    "builtins.setattr", "builtins.delattr", "builtins.object.__setattr__",
    "builtins.object.__delattr__", "builtins.type.__setattr__",
}  # fmt: skip
_TEST_ONLY = {"pytest", "_pytest", "pluggy"}
# unittest's machinery (what runs and reports tests); TestCase, mock and the decorators are fine.
_UNITTEST_INTERNAL = {
    "case", "result", "runner", "loader", "suite", "main", "signals", "util", "async_case",
    "TestResult", "TextTestResult", "TextTestRunner", "TestLoader", "TestSuite", "TestProgram",
    "defaultTestLoader", "installHandler", "registerResult", "removeResult", "removeHandler",
}  # fmt: skip
_PATHS = re.compile(
    r"/proc/[^/\s'\"]*/(?:fd|mem|environ)\b|/dev/fd\b"
    r"|HANGAR_(?:HIDDEN_TESTS|GRADE_OUT|GRADE_JUNIT|GRADE_REPORT|REPO)\b"
)
_BUILTIN_NAMES = frozenset(dir(builtins))


def static_signals(repo: Path, patch: str) -> list[str]:
    """Signals for the constructs the patch adds to ``repo`` (the patched checkout), in order."""
    return check_read(read_patched(repo, patch))


# What the static pass reads of the patched checkout: a signal already decided, or a .py file's
# (path, bytes, the lines the patch added or None for all).
Read = str | tuple[str, bytes, set[int] | None]


def read_patched(repo: Path, patch: str) -> list[Read]:
    """Everything the static pass needs of ``repo``, read now: the grader reads before any code
    of the patch runs and checks (``check_read``) while the tests run."""
    out: list[Read] = []
    for fd in file_diffs(patch):
        if fd.new_path is None:
            continue
        path = fd.new_path
        if link := _added_link(fd):
            out.append(f"static: {path}:1: symlink to {link[:200]!r}")
            continue
        if not path.endswith(".py"):
            continue
        added = added_lines(fd.lines)
        if added is not None and not added:
            continue  # a pure rename or mode change: the patch wrote no line of it
        source = _read(repo, path)
        if isinstance(source, str):
            out.append(f"static: {path}:1: {source}")
            continue
        if added is not None and not _lines_match(source, fd.lines):
            added = None  # applied at another offset than the hunk says: every line counts
        out.append((path, source, added))
    return out


def check_read(read: list[Read]) -> list[str]:
    """The signals of what ``read_patched`` read, in order."""
    out: list[str] = []
    for item in read:
        if isinstance(item, str):
            out.append(item)
            continue
        path, source, added = item
        for line, what in check_source(source, path, added):
            out.append(f"static: {path}:{line}: {what}")
    return out


def added_lines(lines: Iterable[str]) -> set[int] | None:
    """Line numbers (in the new file) the diff section adds; None for a binary diff (all)."""
    added: set[int] = set()
    new: int | None = None
    for line in lines:
        if line.startswith("@@"):
            m = _HUNK.match(line)
            new = int(m.group(1)) if m else None
            continue
        if new is None:
            if line.startswith(("GIT binary patch", "Binary files ")):
                return None
            continue
        if line.startswith("+"):
            added.add(new)
            new += 1
        elif line.startswith(" ") or line == "":
            new += 1
        elif not line.startswith(("-", "\\")):
            new = None  # past the hunk
    return added


def _hunk_additions(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    new: int | None = None
    for line in lines:
        if line.startswith("@@"):
            m = _HUNK.match(line)
            new = int(m.group(1)) if m else None
        elif new is not None and line.startswith("+"):
            yield new, line[1:]
            new += 1
        elif new is not None and (line.startswith(" ") or line == ""):
            new += 1


def _lines_match(source: bytes, lines: list[str]) -> bool:
    """Whether each line the hunks add is at the line number they claim in the patched file."""
    text = source.decode("utf-8", errors="replace").splitlines()
    return all(n <= len(text) and text[n - 1] == body for n, body in _hunk_additions(lines))


def _added_link(fd: FileDiff) -> str | None:
    if not any(line.startswith(("new file mode 120000", "new mode 120000")) for line in fd.lines):
        return None
    added = [line[1:] for line in fd.lines if line.startswith("+") and not line.startswith("+++")]
    return added[0] if added else ""


def _read(repo: Path, rel: str) -> bytes | str:
    """The patched file's bytes, or why it cannot be read (links and odd files never followed)."""
    root = os.path.realpath(repo)
    path = os.path.join(root, rel)
    if os.path.commonpath([root, os.path.realpath(os.path.dirname(path))]) != root:
        return "outside the repo"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError) as err:  # ValueError: a NUL in a path git never wrote
        return f"not readable by the static pass ({getattr(err, 'strerror', None) or err})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size > _MAX_BYTES:
            return f"too large for the static pass ({st.st_size} bytes)"
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(_MAX_BYTES + 1)
    finally:
        os.close(fd)


def check_source(source: bytes | str, path: str, added: set[int] | None) -> list[tuple[int, str]]:
    """(line, what) for each construct in ``source`` whose node spans an ``added`` line (None:
    every line); one entry per line and kind. ``path`` decides what counts as test code."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        line = getattr(err, "lineno", None) or 1
        return [(line, f"does not parse ({type(err).__name__}: {getattr(err, 'msg', err)})")]
    checker = _Checker(tree, test_code=_is_test_code(path))
    hits: dict[tuple[int, str], None] = {}
    for node, line, what in checker.findings(tree, depth=0):
        first = getattr(node, "lineno", line)
        last = getattr(node, "end_lineno", None) or first
        if added is None or any(n in added for n in range(first, last + 1)):
            hits[(line, what)] = None
    return sorted(hits)


def _is_test_code(path: str) -> bool:
    """Test files as the repo's own pytest would collect them, its conftests, anything in tests/."""
    return is_test_file(path) or PurePosixPath(path).name == "conftest.py"


class _Checker:
    def __init__(self, tree: ast.AST, *, test_code: bool) -> None:
        self.test_code = test_code
        self.aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        # `m = sys.modules`: one level of aliasing, assignments anywhere in the file; a builtin's
        # name bound by the file (`compile = re.compile`, `def eval(...)`) is that, not the builtin.
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name in _BUILTIN_NAMES:
                    self.aliases.setdefault(node.name, f"<local>.{node.name}")
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                continue
            name, q = node.targets[0].id, self.qualname(node.value)
            if q and q.split(".")[0] in ("sys", "builtins", "gc", "inspect", "os", "atexit"):
                self.aliases.setdefault(name, q)
            elif name in _BUILTIN_NAMES:
                self.aliases.setdefault(name, f"<local>.{name}")

    def qualname(self, node: ast.AST, depth: int = 0) -> str | None:
        """The dotted name an expression stands for, as far as imports and literals tell."""
        if depth > 30:
            return None
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id == "__builtins__":
                return "builtins"
            return f"builtins.{node.id}" if node.id in _BUILTIN_NAMES else None
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value, depth + 1)
            if base == "builtins.__builtins__":
                base = "builtins"
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            func = self.qualname(node.func, depth + 1)
            arg = _const_str(node.args[0]) if node.args else None
            if func in ("builtins.__import__", "importlib.import_module") and arg:
                return arg
            if func == "builtins.vars" and node.args:
                base = self.qualname(node.args[0], depth + 1)
                return f"{base}.__dict__" if base else None
        if (
            isinstance(node, ast.Subscript)
            and self.qualname(node.value, depth + 1) == "sys.modules"
        ):
            return _const_str(node.slice)
        return None

    def findings(self, tree: ast.AST, depth: int) -> Iterator[tuple[ast.AST, int, str]]:
        for node in ast.walk(tree):
            line = getattr(node, "lineno", 1)
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                targets = (
                    node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                )
                verb = "deletes" if isinstance(node, ast.Delete) else "writes"
                for target in _flatten(targets):
                    if what := self._write(target, verb):
                        yield node, line, what
            elif isinstance(node, ast.Call):
                for what in self._call(node, depth):
                    yield node, line, what
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for what in self._import(node):
                    yield node, line, what
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
                q = self.qualname(node)
                if q in _REFS:
                    yield node, line, f"{_REFS[q]}: {q}"
                elif isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRS:
                    yield node, line, f"frame access: .{node.attr}"
            elif isinstance(node, ast.Constant | ast.JoinedStr | ast.BinOp):
                text = _const_str(node, placeholder=True)
                if text and (m := _PATHS.search(text)):
                    yield node, line, f"names {m.group(0)!r}"

    def _write(self, target: ast.AST, verb: str) -> str | None:
        if isinstance(target, ast.Name) and target.id == "__builtins__":
            return f"{verb} __builtins__"
        if isinstance(target, ast.Attribute):
            base = self.qualname(target.value)
            if base == "builtins":
                return f"{verb} builtins.{target.attr}"
            if base == "sys" and target.attr == "modules":
                return f"{verb} sys.modules"
            if target.attr in _IDENTITY:
                return f"{verb} {target.attr}"
        if isinstance(target, ast.Subscript):
            base = self.qualname(target.value)
            if base in _MAPPINGS:
                return f"{verb} {_MAPPINGS[base]}[...]"
        return None

    def _call(self, node: ast.Call, depth: int) -> Iterator[str]:
        func = self.qualname(node.func)
        if func in _REFS:  # the whole call, so a changed argument line counts too
            yield f"{_REFS[func]}: {func}"
        if func in _CALLS:
            yield f"{_CALLS[func]}: {func}"
        if func in _SETTERS and node.args:
            obj = self.qualname(node.args[0])
            name = _const_str(node.args[1]) if len(node.args) > 1 else None
            short = func.rsplit(".", 1)[1]
            if obj in _MAPPINGS or obj == "builtins":
                yield f"{short} on builtins"
            elif obj == "sys" and name in ("modules", None):
                yield f"{short} on sys ({name or 'computed name'})"
            elif name in _IDENTITY:
                yield f"{short} of {name}"
        if isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            base = self.qualname(node.func.value)
            if base in _MAPPINGS:
                yield f"writes {_MAPPINGS[base]} (.{node.func.attr})"
        if any(k.arg in ("co_filename", "co_code") for k in node.keywords):
            yield "code object rebuilt (co_filename / co_code)"
        if func in ("builtins.__import__", "importlib.import_module") and node.args:
            if mod := _const_str(node.args[0]):
                yield from self._module(mod, [])
        if func in _CODE_RUNNERS:
            yield from self._code_runner(node, _CODE_RUNNERS[func], depth)

    def _code_runner(self, node: ast.Call, name: str, depth: int) -> Iterator[str]:
        source = node.args[0] if node.args else _keyword(node, "source")
        code = _const_str(source) if source is not None else None
        if isinstance(source, ast.Call) and self.qualname(source.func) == "builtins.compile":
            pass  # exec(compile(...)): the compile call is checked on its own
        elif code is None:
            yield f"{name} of non-literal code"
        elif depth < 3:
            # Literal code is checked like the file's own, reported at the call's line.
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    inner = ast.parse(code)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                inner = None
            if inner is not None:
                for _node, _line, what in _Checker(inner, test_code=self.test_code).findings(
                    inner, depth + 1
                ):
                    yield f"in the code {name} runs: {what}"
        if name == "compile":
            filename = node.args[1] if len(node.args) > 1 else _keyword(node, "filename")
            # A real file's name other than this one's is what hides code from attribution.
            shown = _const_str(filename) if filename is not None else ""
            if shown is None:
                yield "compile under a computed filename"
            elif shown and not shown.startswith("<"):
                yield f"compile under filename {shown[:120]!r}"

    def _import(self, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield from self._module(a.name, [])
        elif node.module and not node.level:
            names = [a.name for a in node.names]
            yield from self._module(node.module, names)
            for a in node.names:
                q = f"{node.module}.{a.name}"
                if q in _REFS:
                    yield f"{_REFS[q]}: {q}"

    def _module(self, module: str, names: list[str]) -> Iterator[str]:
        top = module.split(".")[0]
        if top in ("ctypes", "_ctypes"):
            yield f"imports {module}"
        if self.test_code:
            return
        if top in _TEST_ONLY:
            yield f"imports {module} from non-test code"
        elif top == "unittest":
            parts = module.split(".")
            inner = [n for n in names if n in _UNITTEST_INTERNAL]
            if (len(parts) > 1 and parts[1] != "mock") or inner:
                yield f"imports unittest internals ({', '.join([module, *inner])}) from non-test code"


def _flatten(targets: Iterable[ast.AST]) -> Iterator[ast.AST]:
    stack = list(targets)
    while stack:
        t = stack.pop()
        if isinstance(t, ast.Tuple | ast.List):
            stack.extend(t.elts)
        elif isinstance(t, ast.Starred):
            stack.append(t.value)
        else:
            yield t


def _keyword(node: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _const_str(node: ast.AST | None, placeholder: bool = False, depth: int = 0) -> str | None:
    """A string literal's text (bytes as latin-1, ``"a" + "b"`` folded); with ``placeholder``,
    an f-string with its fields as NUL."""
    if node is None or depth > 20:
        return None
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        if isinstance(node.value, bytes):
            return node.value.decode("latin-1")
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _const_str(node.left, placeholder, depth + 1)
        right = _const_str(node.right, placeholder, depth + 1)
        return left + right if left is not None and right is not None else None
    if placeholder and isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "\0"
            for v in node.values
        )
    return None
