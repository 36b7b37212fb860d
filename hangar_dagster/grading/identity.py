"""What the hidden tests run is what the hidden files say: code identity and per-test boundaries.

Part of the trusted reporter (``reporter`` imports it and calls ``install`` at its own
import, before any repo code can run). Two things:

- **pristine code.** Every ``.py`` file among the hidden tests is read and compiled here, as
  plain Python and as pytest's assertion rewriting makes it, and each code object (functions,
  methods, nested ones) recorded by qualname with a digest of what it does (``co_code``, the
  constants recursively, names, variables; not its filename or lines). At each test's call the
  function pytest is about to run (``item.obj``; a ``TestCase`` method's ``__func__``) must be
  one of them, reached through ``__wrapped__`` only across wrappers that are not the repo's, and
  run with the globals of a hidden module. Otherwise: fatal (``test function ... not ...``).
- **boundaries.** At each test's setup, call and teardown the builtins (ids of their values at
  import), the ``sys.modules`` entries of the hidden test modules (the module collected, its
  class, the functions and classes in it) and pytest's and the reporter's internals (the
  reporter's snapshot) are compared: a monkeypatch made during one test and undone before the
  session ends is caught where the session-end check cannot. The builtins module is re-classed
  (a ``ModuleType`` subclass) so that a ``setattr`` on it says who made it: from repo code it is
  fatal at once (even if undone in the same call); from elsewhere (a hidden test's
  ``monkeypatch``, ``mock.patch``) the new value is taken as explained. A builtin changed any
  other way (its dict written) is fatal at the next boundary.

Like the reporter, everything used once repo code may run is bound in closures here.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import os
import sys
import types
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import cast

import pytest
from _pytest.assertion.rewrite import rewrite_asserts

Send = Callable[..., None]
_MISSING = object()
# Names Python itself rebinds in builtins while code runs (the interactive result).
_REBOUND = frozenset({"_"})


def _const_key(value: object) -> str:
    """A constant as text, the same in every process (frozensets sorted, code by its digest)."""
    if isinstance(value, types.CodeType):
        return "code:" + code_digest(value)
    if isinstance(value, tuple):
        return "(" + ",".join(_const_key(v) for v in value) + ")"
    if isinstance(value, frozenset):
        return "{" + ",".join(sorted(_const_key(v) for v in value)) + "}"
    return f"{type(value).__name__}:{value!r}"


def code_digest(code: types.CodeType) -> str:
    """What a code object does, not where it claims to come from: filename and lines left out."""
    h = hashlib.sha256(code.co_code)
    shape = (code.co_name, code.co_qualname, code.co_names, code.co_varnames, code.co_freevars,
             code.co_cellvars, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
             code.co_flags)  # fmt: skip
    h.update(repr(shape).encode())
    h.update(_const_key(code.co_consts).encode())
    return h.hexdigest()


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def pristine_digests(hidden: str) -> dict[str, frozenset[str]]:
    """{qualname: digests} of every code object compiled from the hidden ``.py`` files.

    Each file is compiled plain (a hidden conftest or helper module is imported that way) and
    with pytest's assertion rewriting (a test module is); a file that does not compile is left
    out (pytest reports it as an error of its own).
    """
    found: dict[str, set[str]] = {}
    for path in sorted(Path(hidden).rglob("*.py")):
        try:
            source = path.read_bytes()
            plain = compile(source, str(path), "exec", dont_inherit=True)
            tree = ast.parse(source, filename=str(path))
            rewrite_asserts(tree, source, str(path), None)
            rewritten = compile(tree, str(path), "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            continue
        for top in (plain, rewritten):
            for code in _codes(top):
                found.setdefault(code.co_qualname, set()).add(code_digest(code))
    return {k: frozenset(v) for k, v in found.items()}


def _inodes(hidden: str) -> frozenset[tuple[int, int]]:
    """(device, inode) of every file under ``hidden`` (symlinks followed, as realpath would)."""
    found = set()
    for root, _dirs, files in os.walk(hidden, followlinks=False):
        for name in files:
            if (got := _inode(os.path.join(root, name))) is not None:
                found.add(got)
    return frozenset(found)


def _inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # gone, or a name no file can have: not a hidden file
        return None
    return (st.st_dev, st.st_ino)


def _cells(functions: tuple[Callable[..., object], ...]) -> list[tuple[types.CellType, object]]:
    """Every closure cell reachable from ``functions`` (through functions they hold), as set now."""
    found: list[tuple[types.CellType, object]] = []
    todo, done = list(functions), set()
    while todo:
        fn = todo.pop()
        if id(fn) in done:
            continue
        done.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue  # not bound yet: assigned after this closure was made
            found.append((cell, value))
            if isinstance(value, types.FunctionType):
                todo.append(value)
    return found


def install(
    send: Send,
    repo: str,
    hidden: str,
    junit_id: Callable[[str], str],
    internals_changed: Callable[[], list[str]],
    guarded: tuple[Callable[..., object], ...],
) -> types.SimpleNamespace:
    """Record the pristine code, builtins and the reporter's closures now; return the checks.

    ``send`` is the reporter's writer: fatal events go through it directly, not through
    anything ``guarded`` holds. ``repo`` ends with ``/``; ``internals_changed()`` names what of
    the reporter's snapshot of pytest's internals differs now (empty until it is taken at
    configure); the closure cells of ``guarded`` (the reporter's functions) must keep what they
    hold now (rewriting the cell of its ``send`` forged every event, ``forge_closure_cells``).
    """
    cells = _cells(guarded)
    checks = bool(hidden) and os.path.realpath(hidden) != os.path.realpath(repo)
    pristine = pristine_digests(hidden) if checks else {}
    # The hidden files by inode: a module loads from the hidden dir when its file is one of them
    # (one stat per module; a realpath of every module's path was an lstat per component).
    hidden_files = _inodes(hidden) if checks else frozenset()
    digest, getframe, inode, is_file = (
        code_digest,
        sys._getframe,
        _inode,
        os.path.isfile,
    )
    kind, attr, is_a, length, ordered = type, getattr, isinstance, len, sorted
    getattribute, function, module_type = (
        object.__getattribute__,
        types.FunctionType,
        types.ModuleType,
    )
    modules, builtin_dict, function_item, module_node = (
        sys.modules,
        vars(builtins),
        pytest.Function,
        pytest.Module,
    )
    builtin_values = dict(builtin_dict)
    explained: dict[str, object] = {}  # builtins set by code that is not the repo's
    reported: set[str] = set()
    digests: dict[int, tuple[types.CodeType, str]] = {}
    # The hidden test modules when collection ended: (name, module, class, {name: function/class}).
    hidden_modules: list[tuple[str, object, type, dict[str, object]]] = []
    hidden_globals: set[int] = set()

    def repo_in_stack(frame: types.FrameType | None) -> str | None:
        while frame is not None:
            if frame.f_code.co_filename.startswith(repo):
                return frame.f_code.co_filename[length(repo) :]
            frame = frame.f_back
        return None

    class WatchedBuiltins(types.ModuleType):
        """The builtins module's class while the hidden tests run: a setattr says who made it."""

        def __setattr__(self, name: str, value: object) -> None:
            note(name, value)
            module_type.__setattr__(self, name, value)

        def __delattr__(self, name: str) -> None:
            note(name, _MISSING)
            module_type.__delattr__(self, name)

    def note(name: str, value: object) -> None:
        if where := repo_in_stack(getframe(2)):
            once(f"set builtins.{name}", f"repo code replaced builtins.{name} ({where})")
        else:
            explained[name] = value

    def once(key: str, what: str) -> None:
        if key not in reported:
            reported.add(key)
            send("tamper", what=what, fatal=True)

    def boundary(item: pytest.Item, phase: str, internals: bool) -> None:
        def where() -> str:
            return f"{junit_id(item.nodeid)} ({phase})"

        if kind(builtins) is not WatchedBuiltins:
            once("builtins.__class__", f"builtins module re-classed, seen at {where()}")
        for name in [
            n for n, v in builtin_values.items() if builtin_dict.get(n, _MISSING) is not v
        ]:
            if name not in _REBOUND and explained.get(name, _MISSING) is not builtin_dict.get(name, _MISSING):  # fmt: skip
                once(f"builtins.{name}", f"builtins.{name} replaced, seen at {where()}")
        own = item_module(item)
        for name, module, cls, members in hidden_modules:
            if modules.get(name) is not module:
                once(f"module {name}", f"hidden test module {name} replaced in sys.modules, seen at {where()}")  # fmt: skip
            if kind(module) is not cls:
                once(f"class {name}", f"hidden test module {name} re-classed, seen at {where()}")
            if module is not own:
                continue  # the functions of the module whose test this is (each in its turn)
            space = getattribute(module, "__dict__")
            if changed := [n for n, v in members.items() if space.get(n, _MISSING) is not v]:
                once(f"members {name}", f"hidden test module {name}: {', '.join(ordered(changed))} replaced, seen at {where()}")  # fmt: skip
        if [cell for cell, value in cells if cell.cell_contents is not value]:
            once("cells", f"the trusted reporter's closures rewritten, seen at {where()}")
        # The builtins are checked above, where a hidden test's own monkeypatch is explained.
        if internals and (
            changed := [c for c in internals_changed() if not c.startswith("builtins.")]
        ):
            once("internals", f"pytest internals replaced, seen at {where()}: {', '.join(changed)}")

    def item_module(item: pytest.Item) -> object:
        node = item.getparent(module_node)
        return None if node is None else node.obj

    def pytest_collection_finish(session: pytest.Session) -> None:
        for module in {id(m): m for m in map(item_module, session.items) if m is not None}.values():
            space = getattribute(module, "__dict__")
            name = space.get("__name__", "")
            members = {n: v for n, v in space.items() if is_a(v, (function, type))}
            if kind(module) is not module_type:
                once(f"class {name}", f"hidden test module {name} re-classed ({kind(module).__qualname__}) at collection")  # fmt: skip
            hidden_modules.append((name, module, kind(module), members))
            hidden_globals.add(id(space))
        # Helper modules of the hidden tests (base classes, shared checks) by where they load from.
        for module in list(modules.values()):
            file = attr(module, "__file__", None) if is_a(module, module_type) else None
            if is_a(file, str) and inode(cast(str, file)) in hidden_files:
                hidden_globals.add(id(getattribute(module, "__dict__")))

    def code_of(code: types.CodeType) -> str:
        cached = digests.get(id(code))
        if cached is None or cached[0] is not code:
            cached = digests[id(code)] = (code, digest(code))
        return cached[1]

    def unfaithful(item: pytest.Item) -> str | None:
        """Why the function pytest is about to run is not a pristine hidden one, or None."""
        fn = attr(item, "obj", None)
        fn = attr(fn, "__func__", fn)
        for _ in range(64):
            code = cast(types.CodeType, attr(fn, "__code__", None))
            if kind(fn) is function and is_a(code, types.CodeType):
                if code_of(code) in pristine.get(code.co_qualname, ()):
                    if id(attr(fn, "__globals__", None)) not in hidden_globals:
                        return "runs with the globals of a module that is not a hidden one"
                    return None
                if code.co_filename.startswith(repo) or not is_file(code.co_filename):
                    wrapped = attr(fn, "__wrapped__", None)
                    shown = code.co_filename.removeprefix(repo)
                    if wrapped is not None:
                        return f"wrapped by code that is not the hidden tests' ({shown})"
                    return f"not compiled from the hidden files ({code.co_qualname} from {shown})"
            wrapped = attr(fn, "__wrapped__", None)
            if wrapped is None:
                # Hypothesis's @given wrapper (code outside the repo, checked above) sets no
                # __wrapped__; it keeps the test it runs as .hypothesis.inner_test.
                wrapped = attr(attr(fn, "hypothesis", None), "inner_test", None)
            if wrapped is None:
                return "not compiled from the hidden files"
            fn = wrapped
        return "a __wrapped__ chain that does not end"

    def verify(item: pytest.Item) -> None:
        if not checks or not is_a(item, function_item):
            return  # a doctest has no function; under files_mode in_repo nothing is pristine
        if reason := unfaithful(item):
            test_id = junit_id(item.nodeid)
            once(f"test {test_id}", f"test function {test_id} {reason}")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
        boundary(item, "setup", False)
        try:
            return (yield)
        finally:
            boundary(item, "after setup", False)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
        verify(item)
        try:
            return (yield)
        finally:
            boundary(item, "after call", True)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
        boundary(item, "teardown", False)
        try:
            return (yield)
        finally:
            boundary(item, "after teardown", False)

    builtins.__class__ = WatchedBuiltins
    return types.SimpleNamespace(
        pytest_collection_finish=pytest_collection_finish,
        pytest_runtest_setup=pytest_runtest_setup,
        pytest_runtest_call=pytest_runtest_call,
        pytest_runtest_teardown=pytest_runtest_teardown,
    )
