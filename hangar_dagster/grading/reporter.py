"""The trusted reporter: a pytest plugin that reports, outside the JUnit file, what it saw happen.

``hangar-grade pytest`` loads it with ``-p`` before anything of the repo can
load. At import it snapshots pytest's reporting internals, installs an audit
hook (which nothing can remove afterwards), and writes JSON lines to the pipe
named by ``$HANGAR_GRADE_REPORT`` that the grader on the host reads:

- ``start``: the process's uid, CapEff and NoNewPrivs, read before any repo
  code ran (the grader's proof that the uid split held);
- ``collected``: every collected test, as JUnit names it, and those that
  carried an xfail mark when collection ended (a failure may be reported as
  skipped only for those);
- ``call``: for each test, whether it passed, beneath every report hook: a
  pytest function by its call returning or raising (``pytest_pyfunc_call``),
  a unittest ``TestCase`` by what unittest itself tells its result (the
  item's ``addSuccess`` / ``addFailure`` / ...), a doctest by its run raising
  (``pytest_runtest_call``);
- ``tamper``: what it saw repo code do, ``fatal`` when that can forge a result
  (pytest's or this reporter's internals replaced, hooks registered from the
  repo, a skip or exit raised by repo code, the JUnit or report pipe opened by
  repo code, a function's code swapped, a test function swapped after
  collection, a TestCase's result rewired, an always-equal object of the
  patch's reached by a comparison) and not fatal when it is only suspicious (a
  caller's frame read, the garbage collector's objects walked). Code is the
  patch's by where it came from (``_provenance``), comparisons are judged by
  behaviour (``_comparisons``), never by a name;
- ``end``: the session finished (its exit status).

``identity`` (installed here, at import) checks that each test pytest runs is compiled from the
pristine hidden files, and compares the builtins, the hidden test modules and these internals
at every test's boundary.

Everything the reporter uses once repo code may run is held in closures made
at import: the descriptor, ``os.write``, the JSON encoder, the builtins it
calls. No module attribute leads to it, and replacing ``os.write``, a builtin
or a name of this module changes nothing it does (and the last two are fatal
tamper). Code under test still shares this process: it can rewrite closure
cells or forge both pipes (docs/grading.md, "Not done yet").

It runs inside the grader's sandbox and reads the ``HANGAR_`` variables the sandbox was
given (the grader's contract, not operator settings), so it reads its environment itself
(allowed in tests/test_settings_source.py).
"""

from __future__ import annotations

import builtins
import dis
import importlib.machinery
import inspect
import os
import re
import sys
import threading
import time
import types
import unittest.case
import xml.etree.ElementTree
from collections.abc import Callable, Generator
from json.encoder import encode_basestring_ascii
from types import FrameType
from typing import Any

import _pytest.doctest
import _pytest.junitxml
import _pytest.outcomes
import _pytest.python
import _pytest.reports
import _pytest.runner
import _pytest.skipping
import _pytest.unittest
import pluggy
import pytest

from hangar_dagster.grading import identity

REPORT_ENV = "HANGAR_GRADE_REPORT"
# Hooks through which a plugin can change what is reported or which tests run.
_WATCHED_HOOKS = (
    "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_report_teststatus",
    "pytest_runtest_protocol", "pytest_runtest_call", "pytest_pyfunc_call",
    "pytest_collection_modifyitems", "pytest_collectreport", "pytest_sessionfinish",
    "pytest_terminal_summary", "pytest_deselected", "pytest_runtestloop",
    "pytest_runtest_setup", "pytest_runtest_teardown", "pytest_pycollect_makeitem",
    "pytest_collect_file", "pytest_itemcollected",
)  # fmt: skip
# Audit events that hand out live objects: pytest's items, reports, the reporter itself.
_GC_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
# Frame objects reached through these attributes let code read its caller's locals.
_FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}
# The ways to name an inherited descriptor as a path.
_FD_PATH = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)(?:/task/\d+)?|dev)/fd/(\d+)$")
# Classes whose methods decide a test's outcome and what the JUnit report says: pytest's
# runner, reports and junitxml, the ElementTree it writes with, pluggy's hook calling.
_CLASSES = (
    _pytest.reports.TestReport, _pytest.reports.BaseReport, _pytest.reports.CollectReport,
    _pytest.runner.CallInfo, _pytest.junitxml.LogXML, _pytest.junitxml._NodeReporter,
    _pytest.python.Function, xml.etree.ElementTree.ElementTree, pluggy.HookCaller,
    pluggy.PluginManager, pluggy.HookImpl, pluggy.Result,
    # unittest reports a TestCase's outcome by calling its result (pytest's item): both sides.
    _pytest.unittest.TestCaseFunction, _pytest.unittest.UnitTestCase, unittest.case.TestCase,
    unittest.case._Outcome, _pytest.doctest.DoctestItem,  # type: ignore[attr-defined]
)  # fmt: skip
# The methods through which unittest reports a TestCase's outcome to its result.
_UNITTEST_RESULTS = (
    "addSuccess", "addError", "addFailure", "addSkip", "addExpectedFailure",
    "addUnexpectedSuccess", "addSubTest",
)  # fmt: skip
# The modules whose functions and classes do, pluggy's found by what they define (its module
# names are private and move between versions).
_MODULES = (
    _pytest.runner, _pytest.reports, _pytest.skipping, _pytest.outcomes, _pytest.junitxml,
    _pytest.unittest, unittest.case, xml.etree.ElementTree,
    *{sys.modules[c.__module__] for c in _CLASSES if c.__module__.startswith("pluggy.")},
    sys.modules[vars(sys.modules[pluggy.PluginManager.__module__])["_multicall"].__module__],
)  # fmt: skip

Send = Callable[..., None]


def _writer(fd: int) -> Send:
    """``send(event, **fields)``: one JSON line to ``fd``, with only what is captured now.

    The fields are str, int, bool, None and lists of str (JSON by hand: ``json.dumps``
    goes through module attributes the code under test could replace).
    """
    write, quote, lock = os.write, encode_basestring_ascii, threading.Lock()
    kind, text, integer, join, encode_bytes = type, str, int, ",".join, str.encode

    def value(v: object) -> str:
        if v is None or v is True or v is False:
            return "null" if v is None else "true" if v else "false"
        if kind(v) is integer:
            return f"{v}"
        # The captured type() does not narrow for mypy: the fields are only these shapes.
        if kind(v) is text:
            return quote(v)  # type: ignore[arg-type]
        return "[" + join([quote(i) for i in v]) + "]"  # type: ignore[attr-defined]

    def send(event: str, **fields: object) -> None:
        items = [f"{quote(k)}: {value(v)}" for k, v in [("event", event), *fields.items()]]
        data = encode_bytes("{" + join(items) + "}\n")
        with lock:
            try:
                while data:
                    data = data[write(fd, data) :]
            except OSError:
                pass  # the pipe is gone (closed by the code under test): the grader sees no end

    return send


def _snapshotter() -> Callable[[], dict[str, object]]:
    """``take()``: what the internals check compares at the end of the session, by name.

    Each watched module's functions, classes and modules, each watched class's
    methods, this module's whole namespace, and the builtins. Everything it
    uses is bound now: a replaced ``vars`` could otherwise show the old values.
    """
    names, is_a, is_callable = vars, isinstance, callable
    plain = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)
    methods = (classmethod, staticmethod, property)
    modules, classes, namespaces = _MODULES, _CLASSES, (sys.modules[__name__], builtins)

    def take() -> dict[str, object]:
        found: dict[str, object] = {}
        for module in modules:
            prefix = module.__name__.rsplit(".", 1)[-1]
            found.update((f"{prefix}.{n}", v) for n, v in names(module).items() if is_a(v, plain))
        for cls in classes:
            prefix = f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"
            # Methods and descriptors only: pytest keeps flags of its own on some of these classes.
            found.update(
                (f"{prefix}.{n}", v)
                for n, v in names(cls).items()
                if is_callable(v) or is_a(v, methods)
            )
        for space in namespaces:
            found.update(
                (f"{space.__name__.rsplit('.', 1)[-1]}.{n}", v) for n, v in names(space).items()
            )
        return found

    return take


# Audit events through which code comes to exist at run time: source compiled, code run, a code
# object or a function built by hand.
_MADE_EVENTS = ("compile", "exec", "code.__new__", "function.__new__")
# The instructions of a comparison: ``==``, ``!=``, ``<``, ... and ``in`` / ``not in``.
_COMPARE_OPS = frozenset({dis.opmap["COMPARE_OP"], dis.opmap["CONTAINS_OP"]})
# How far the code that made code is looked for up the stack, and how long a probe may run.
_MAKER_DEPTH, _PROBE_STEPS, _PROBE_SECONDS = 8, 100_000, 0.5


def _provenance(
    repo: str,
) -> tuple[Callable[[types.CodeType], bool], Callable[[types.CodeType], str | None], Callable[[str, tuple[Any, ...]], None]]:  # fmt: skip
    """``is_patch(code)``, ``where(code)`` and the audit hook that decide which code is the patch's.

    By where code came from, not the filename it claims: a file of the repo, or code that
    repo code made while it ran (source it compiled, exec'd or eval'd, a code object or
    function it built, a module its own loader loaded), whatever ``co_filename`` that says.
    The hook sees every ``compile`` / ``exec`` / ``code.__new__`` / ``function.__new__``
    from the moment the reporter loads, before any repo code can run.
    """
    getframe, is_a, kind, attr, span, text = sys._getframe, isinstance, type, getattr, range, str
    length = len
    code_type, function_type = types.CodeType, types.FunctionType
    method_types = (types.FunctionType, classmethod, staticmethod)
    names, made_events, depth = vars, _MADE_EVENTS, _MAKER_DEPTH
    files: set[str] = set()  # filenames the patch compiled or built code under
    codes: dict[int, types.CodeType] = {}  # code objects it ran or built (held: ids stay unique)
    local = threading.local()

    def is_patch(code: types.CodeType) -> bool:
        name = code.co_filename
        return name.startswith(repo) or name in files or codes.get(id(code)) is code

    def where(code: types.CodeType) -> str | None:
        name = code.co_filename
        if name.startswith(repo):
            return name[length(repo) :]
        if name in files or codes.get(id(code)) is code:
            return f"{name}, made by repo code"
        return None

    def mark(code: types.CodeType) -> None:
        todo = [code]
        while todo:
            c = todo.pop()
            if codes.get(id(c)) is not c:
                codes[id(c)] = c
                todo.extend(k for k in c.co_consts if is_a(k, code_type))

    def patch_class(cls: type) -> bool:
        """A class with a method of the patch's (a loader the repo defined)."""
        for klass in cls.__mro__[:-1]:
            for v in names(klass).values():
                func: Any = attr(v, "__func__", v) if is_a(v, method_types) else None
                if kind(func) is function_type and is_patch(func.__code__):
                    return True
        return False

    def made_by_patch(frame: FrameType | None) -> bool:
        """Repo code among the callers, or the import system running the patch's own loader."""
        for _ in span(depth):
            if frame is None:
                return False
            if is_patch(frame.f_code):
                return True
            if frame.f_code.co_filename.startswith("<frozen importlib"):
                # The import system compiles each module under its real path (the repo's are the
                # repo's by that); a module is the patch's also when the loader running is.
                while frame is not None and frame.f_code.co_filename.startswith(
                    "<frozen importlib"
                ):
                    loader = frame.f_locals.get("self")
                    if loader is not None and patch_class(kind(loader)):
                        return True
                    frame = frame.f_back
                return False
            frame = frame.f_back
        return False

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event not in made_events or attr(local, "busy", False):
            return
        local.busy = True
        try:
            if not made_by_patch(getframe(1)):
                return
            if event in ("compile", "code.__new__"):
                # A claimed path (a stdlib file's, say) marks all code under it. "<string>" and
                # the like are shared with code the stdlib generates (dataclasses): only the
                # code objects the patch runs or builds are marked, below.
                if length(args) > 1 and kind(args[1]) is text and not args[1].startswith("<"):
                    files.add(args[1])
            elif args and is_a(args[0], code_type):
                mark(args[0])
        finally:
            local.busy = False

    return is_patch, where, audit


def _comparisons(
    repo: str,
    is_patch: Callable[[types.CodeType], bool],
    where: Callable[[types.CodeType], str | None],
    tamper: Callable[[str, bool], None],
) -> tuple[Callable[[FrameType, str, object], None], Callable[[], None]]:
    """``watch`` (a profile function) and ``probe``: always-equal objects of the patch, by behaviour.

    ``watch`` notes the object whose code runs when a comparison made outside the patch
    (``==``, ``!=``, ordering, ``in``: the caller's instruction is a comparison) calls into
    the patch's code, whatever that code is named. ``probe``, after the test's call and
    outside the profile, compares each with a fresh ``object()`` and with a value of the
    other operand's builtin type it never saw, under a step and time bound. Equal to either
    (or ``<=`` and ``>=`` it, or ``<`` and ``>``) is an always-equal object: fatal, since no
    honest value equals an object it has never seen. A container is not asked whether it
    holds a fresh ``object()``: an honest universal set (packaging's empty ``SpecifierSet``)
    does. An honest value object answers ``NotImplemented``,
    ``False`` or raises an ``Exception`` (a refusal, not a signal); anything else it raises,
    and a probe that runs out of steps or time, is fatal: it hides the answer.
    """
    compare_ops = _COMPARE_OPS
    kind, truth, new_object, length, text = type, bool, object, len, str
    gettrace, settrace, monotonic = sys.gettrace, sys.settrace, time.monotonic
    max_steps, max_seconds, varargs_flag = _PROBE_STEPS, _PROBE_SECONDS, inspect.CO_VARARGS
    growable = (int, float, str, bytes)
    # One object per kind (its class, the code reached, the other operand's class) per test:
    # a test comparing a thousand Versions probes one (probing each cost 1 ms a test).
    pending: dict[tuple[type, int, type], tuple[object, object, types.CodeType]] = {}

    class OutOfSteps(BaseException):
        """Raised into a probe that ran too long."""

    def watch(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not is_patch(code):
            return
        back = frame.f_back
        # The repo comparing its own values decides nothing by itself (and is most of them). By
        # its real files only: code made under a hidden test's filename must not hide the test.
        caller = back.f_code if back is not None else None
        if caller is None or caller.co_filename.startswith(repo) or caller.co_code[back.f_lasti] not in compare_ops:  # type: ignore[union-attr]  # fmt: skip
            return
        values = frame.f_locals
        params = code.co_varnames
        if code.co_argcount:
            obj = values.get(params[0])
            other = values.get(params[1]) if code.co_argcount > 1 else None
        elif code.co_flags & varargs_flag:
            packed = values.get(params[code.co_kwonlyargcount], ())
            obj = packed[0] if packed else None
            other = packed[1] if length(packed) > 1 else None
        else:
            return
        key = (kind(obj), id(code), kind(other))  # a code object's hash is not cached: its id
        if key not in pending:
            pending[key] = (obj, other, code)

    def lies(obj: object, other: object) -> str | None:
        def ask(question: Callable[[], object]) -> bool | None:
            try:
                return truth(question())
            except Exception:  # an honest refusal: TypeError, InvalidVersion, ...
                return None

        stranger = new_object()
        equal = ask(lambda: obj == stranger)
        if equal or ask(lambda: stranger == obj):
            return "equal to a fresh object()"
        # `!=` False while `==` answers False is an honest bug (a `__ne__` of `not
        # self.__eq__(other)` gives `not NotImplemented`, as dateutil's does): it makes no
        # equality assertion pass. Only when `==` gives no answer does it stand for one.
        if equal is None and ask(lambda: obj != stranger) is False:
            return "not unequal to a fresh object()"
        if (ask(lambda: obj <= stranger) and ask(lambda: obj >= stranger)) or (  # type: ignore[operator]
            ask(lambda: obj < stranger) and ask(lambda: obj > stranger)  # type: ignore[operator]
        ):
            return "ordered both ways against a fresh object()"
        if kind(other) in growable:
            unseen = other + ("\0hangar" if kind(other) is str else b"\0" if kind(other) is bytes else 7919)  # type: ignore[operator]  # fmt: skip
            if unseen != other and ask(lambda: obj == unseen) and ask(lambda: obj == other):
                return f"equal to {kind(other).__name__} values it never saw"
        return None

    def bounded(run: Callable[..., object], *args: object) -> tuple[object, str | None]:
        """``run(*args)`` under a step and time bound: (its result, or None and what went wrong)."""
        steps, deadline = [0], monotonic() + max_seconds

        # Calls only (line events would cost more than the probe); a loop that calls nothing runs on
        # until the grader's time limit fails the grade.
        def count(frame: FrameType, event: str, arg: Any) -> Any:
            steps[0] += 1
            if steps[0] > max_steps or monotonic() > deadline:
                raise OutOfSteps
            return None

        previous = gettrace()
        settrace(count)
        try:
            return run(*args), None
        except OutOfSteps:
            return None, "ran out of steps or time"
        except BaseException as exc:  # noqa: BLE001 - a skip, an exit: never a value's answer
            return None, f"raised {kind(exc).__name__}"
        finally:
            settrace(previous)

    def named(obj: object) -> str:
        return f"{kind(obj).__module__}.{kind(obj).__qualname__}"

    def probe() -> None:
        found = [*pending.values()]
        pending.clear()
        for obj, other, code in found:
            at = where(code) or code.co_filename
            # A metaclass's attributes are the patch's code too: even the name is bounded.
            name = text(bounded(named, obj)[0] or "?")
            lie, trouble = bounded(lies, obj, other)
            if lie:
                tamper(f"an always-equal object from {at} ({name}): {lie}", True)
            elif trouble:
                # An answer the probe cannot get hides one: fatal too (no honest value stalls,
                # exits or skips when asked about a stranger).
                tamper(f"a comparison probe of an object from {at} ({name}) {trouble}", True)
        del found

    return watch, probe


# Namespaces that gain names legitimately while pytest runs (only replacements count there).
_GROWING = ("builtins.",)


def _install(
    report_path: str, repo: str, junit_path: str, repo_modules: str = ""
) -> tuple[Callable[..., Any], ...]:
    """Open the report pipe, send ``start``, install the audit hook; return the pytest hooks.

    Every name the hooks and the checks use is bound here, so they reach nothing
    through a module attribute.
    """
    send = _writer(os.open(report_path, os.O_WRONLY | os.O_CLOEXEC))
    repo = repo.rstrip("/") + "/"
    pipes = (_FD_PATH.match(p) for p in (report_path, junit_path))
    private = frozenset(int(m.group(1)) for m in pipes if m is not None)
    junit_file = os.path.normpath(os.path.abspath(junit_path))
    junitxml_file = _pytest.junitxml.__file__
    mangle = _pytest.junitxml.mangle_test_address
    # What a test raises to skip, xfail or end the session: never the repo's to raise.
    outcome_exc = (_pytest.outcomes.OutcomeException, _pytest.outcomes.Exit, unittest.case.SkipTest)
    skip_exc = (_pytest.outcomes.Skipped, unittest.case.SkipTest)
    test_case_item, doctest_item = _pytest.unittest.TestCaseFunction, _pytest.doctest.DoctestItem
    sub_test, exc_info, is_tuple = unittest.case._SubTest, sys.exc_info, tuple  # type: ignore[attr-defined]
    # The item's own result methods, as they are now: the wrappers below call these.
    unittest_results = tuple((n, vars(test_case_item)[n]) for n in _UNITTEST_RESULTS)
    xml_key, log_xml, node_reporter = _pytest.junitxml.xml_key, _pytest.junitxml.LogXML, _pytest.junitxml._NodeReporter  # fmt: skip
    getframe, getprofile, setprofile = sys._getframe, sys.getprofile, sys.setprofile
    kind, is_a, attr, names, ordered, length = type, isinstance, getattr, vars, sorted, len
    text, integer, span, new_set, is_callable = str, int, range, set, callable
    fd_path, gc_events, frame_attrs, watched_hooks = _FD_PATH, _GC_EVENTS, _FRAME_ATTRS, _WATCHED_HOOKS  # fmt: skip
    growing, take_snapshot, hook_caller = _GROWING, _snapshotter(), pluggy.HookCaller
    seen: set[str] = set()
    local = threading.local()
    # Taken at configure, before any repo code can run: the internals, each hook's function,
    # the plugin manager's hook calling.
    snapshot: list[tuple[str, object]] = []
    hookimpls: list[tuple[pluggy.HookImpl, object]] = []
    hookexec: list[object] = []
    log_xmls: list[_pytest.junitxml.LogXML] = []  # the LogXML instance, at session start
    collected: dict[str, object] = {}  # each test's code object when collection ended
    # For provenance (grading/provenance.py): the interpreter's module table, the repo's own
    # top-level modules (the grader read them from the base tree).
    modules, module_type, module_spec = (
        sys.modules,
        types.ModuleType,
        importlib.machinery.ModuleSpec,
    )
    repo_own = frozenset(n for n in repo_modules.split(":") if n)

    def tamper(what: str, fatal: bool) -> None:
        if what not in seen:
            seen.add(what)
            send("tamper", what=what, fatal=fatal)

    # Which code is the patch's (by where it came from), and its comparisons judged by behaviour.
    is_patch, where, provenance_audit = _provenance(repo)
    watch, probe = _comparisons(repo, is_patch, where, tamper)

    def junit_id(nodeid: str) -> str:
        parts = mangle(nodeid)
        classname = ".".join(parts[:-1])
        return f"{classname}::{parts[-1]}" if classname else parts[-1]

    def repo_file(frame: FrameType | None, depth: int = 1) -> str | None:
        """Where the first of ``depth`` frames from ``frame`` that runs the patch's code came from."""
        for _ in span(depth):
            if frame is None:
                return None
            if found := where(frame.f_code):
                return found
            frame = frame.f_back
        return None

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event not in ("open", "sys._getframe", "object.__getattr__", "object.__setattr__",
                         "sys._current_frames", *gc_events):  # fmt: skip
            return
        if attr(local, "busy", False):
            return  # our own getframe below
        local.busy = True
        try:
            caller = getframe(1)
            if event == "open":
                fd = fd_path.match(args[0]) if is_a(args[0], text) else None
                if fd is not None and integer(fd.group(1)) in private:
                    if where := repo_file(caller, 8):
                        tamper(f"repo code opened a grader pipe ({where})", True)
            elif event in gc_events:
                if where := repo_file(caller):
                    tamper(f"repo code walked the garbage collector ({where})", False)
            elif event == "object.__setattr__":
                # A function's code swapped keeps its identity: every check here would miss it.
                if args[1] == "__code__" and (where := repo_file(caller)):
                    tamper(f"repo code replaced a function's code ({where})", True)
            elif event != "object.__getattr__" or args[1] in frame_attrs:
                if where := repo_file(caller):
                    tamper(f"repo code read a frame ({where})", False)
        finally:
            local.busy = False

    def raised_by_repo(exc: object, tb: types.TracebackType | None) -> None:
        """A skip, xfail or exit whose traceback passes through repo code: fatal."""
        if is_a(exc, outcome_exc):
            while tb is not None:
                if where := repo_file(tb.tb_frame):
                    tamper(f"repo code raised {kind(exc).__name__} ({where})", True)
                    return
                tb = tb.tb_next

    # During a test's call: comparisons that reach the patch's code, probed once the call ends.
    profile = watch

    def shadowed(obj: object, cls: type) -> list[str]:
        """Methods of ``cls`` that ``obj`` overrides on itself, or its class when it was swapped.

        junitxml's own overrides are fine: a finalized ``_NodeReporter`` keeps its XML in a
        ``to_xml`` lambda of its own.
        """
        if kind(obj) is not cls:
            return ["__class__"]
        return [
            n for n, v in ordered(names(obj).items())
            if is_callable(attr(cls, n, None))
            and attr(attr(v, "__code__", None), "co_filename", None) != junitxml_file
        ]  # fmt: skip

    def check(config: pytest.Config) -> None:
        now = take_snapshot()
        changed = [k for k, v in snapshot if now.get(k) is not v]
        before = {k for k, _ in snapshot}
        added = [k for k in now if k not in before and not k.startswith(growing)]
        changed += [f"{f.__qualname__}.__code__" for f, code in codes if f.__code__ is not code]
        changed += [f"hook {i.plugin_name}: {i.function!r}" for i, f in hookimpls if i.function is not f]  # fmt: skip
        if hookexec and config.pluginmanager._inner_hookexec is not hookexec[0]:
            changed.append("PluginManager._inner_hookexec")
        for logxml in log_xmls:
            changed += [f"LogXML.{n}" for n in shadowed(logxml, log_xml)]
            if logxml.logfile != junit_file:
                changed.append("LogXML.logfile")
            for nr in [*logxml.node_reporters.values(), *logxml.node_reporters_ordered]:
                changed += [f"_NodeReporter.{n} (instance)" for n in shadowed(nr, node_reporter)]
        if changed or added:
            what = ", ".join(ordered(new_set(changed)) + ordered(added))
            send("tamper", what=f"pytest internals replaced: {what}", fatal=True)
        for name in watched_hooks:
            for impl in attr(config.hook, name).get_hookimpls():
                code = attr(impl.function, "__code__", None)
                if code is not None and (found := where(code)):
                    send("tamper", what=f"hook {name} registered from repo code ({found})", fatal=True)  # fmt: skip

    # Where each snapshotted value sits, looked up once: a fresh snapshot per test costs too much.
    owners = (*_MODULES, *_CLASSES, sys.modules[__name__])
    placed: list[tuple[str, Any, str, object]] = []  # (owner, its namespace, name, value)

    def internals_changed() -> list[str]:
        """What of the snapshot differs now (the per-test boundary check, ``identity``)."""
        if not snapshot:
            return []
        if not placed:
            wanted = new_set(id(v) for _, v in snapshot)
            for owner in owners:
                label = f"{owner.__module__.rsplit('.', 1)[-1]}.{owner.__name__}" if is_a(owner, type) else owner.__name__.rsplit(".", 1)[-1]  # fmt: skip
                space = names(owner)
                placed.extend((label, space, n, v) for n, v in space.items() if id(v) in wanted)
        changed = [f"{label}.{n}" for label, space, n, v in placed if space.get(n) is not v]
        changed += [f"hook {i.plugin_name}" for i, f in hookimpls if i.function is not f]
        return ordered(new_set(changed))

    # Pristine test code and builtins recorded now, checked at each test's boundaries.
    boundaries = identity.install(
        send, repo, os.environ.get("HANGAR_HIDDEN_TESTS", ""), junit_id, internals_changed,
        (tamper, internals_changed, audit, raised_by_repo, repo_file),
    )  # fmt: skip

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(config: pytest.Config) -> None:
        # Before the hidden conftests load and long before any repo code can.
        config.pluginmanager.register(boundaries, "hangar-grade-boundaries")
        snapshot.extend(take_snapshot().items())
        hookexec.append(config.pluginmanager._inner_hookexec)
        for caller in names(config.hook).values():
            if is_a(caller, hook_caller):
                hookimpls.extend((i, i.function) for i in caller.get_hookimpls())

    def test_code(item: pytest.Item) -> object:
        func = attr(item, "obj", None)
        return attr(attr(func, "__func__", func), "__code__", None)

    def pytest_sessionstart(session: pytest.Session) -> None:
        # Created by junitxml's pytest_configure; kept here, whatever later becomes of the stash.
        log_xmls.extend(x for x in [session.config.stash.get(xml_key, None)] if x is not None)

    def expects_failure(item: pytest.Item) -> bool:
        """An xfail mark, or unittest's expectedFailure on the method or its class."""
        if item.get_closest_marker("xfail"):
            return True
        if kind(item) is not test_case_item:
            return False
        flag = "__unittest_expecting_failure__"
        return bool(attr(attr(item, "obj", None), flag, False) or attr(attr(item.parent, "obj", None), flag, False))  # fmt: skip

    def pytest_collection_finish(session: pytest.Session) -> None:
        collected.update((i.nodeid, test_code(i)) for i in session.items)
        ids = [junit_id(i.nodeid) for i in session.items]
        xfail = [junit_id(i.nodeid) for i in session.items if expects_failure(i)]
        send("collected", ids=ids, xfail=xfail)

    def unittest_results_of(item: pytest.Item, results: list[str]) -> dict[str, Callable[..., Any]]:
        """Wrappers of the item's unittest result methods that note each outcome in ``results``.

        ``""`` a success, ``"-"`` a subtest that passed or skipped, ``"Skipped"`` the test
        skipped, anything else the name of what failed it. unittest calls these from inside
        ``TestCase.run``, beneath every pytest hook and report.
        """

        def exception(info: object) -> tuple[object, types.TracebackType | None]:
            if is_a(info, is_tuple):
                return info[1], info[2]  # type: ignore[index]
            return attr(info, "value", None), attr(info, "tb", None)

        def failed(info: object) -> str:
            exc, tb = exception(info)
            raised_by_repo(exc, tb)
            return kind(exc).__name__

        def note(name: str, args: tuple[Any, ...]) -> None:
            if name == "addSuccess":
                # A failure swallowed by an expecting_failure set on the running outcome (the
                # test's own decorator would have made this addExpectedFailure): not a success.
                swallowed = attr(attr(args[0] if args else None, "_outcome", None), "expectedFailure", None)  # fmt: skip
                results.append(failed(swallowed) if swallowed is not None else "")
            elif name in ("addError", "addFailure", "addExpectedFailure"):
                results.append(failed(args[1]))
            elif name == "addUnexpectedSuccess":
                results.append("UnexpectedSuccess")
            elif name == "addSkip":
                current = exc_info()
                raised_by_repo(current[1], current[2])
                results.append("-" if is_a(args[0], sub_test) else "Skipped")
            elif name == "addSubTest":
                info = args[2] if length(args) > 2 else None
                if info is None or is_a(exception(info)[0], skip_exc):
                    results.append("-")
                else:
                    results.append(failed(info))

        def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                note(name, args)
                return original(item, *args, **kwargs)

            return wrapper

        return {name: wrap(name, original) for name, original in unittest_results}

    def verdict(results: list[str]) -> str | None:
        bad = [r for r in results if r not in ("", "-", "Skipped")]
        if bad:
            return bad[0]
        if "Skipped" in results:
            return "Skipped"
        return None if results else "NoResult"

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
        # Outermost: every item's call passes here, whatever its style. A plain test function's
        # call is reported by pytest_pyfunc_call (beneath this); a unittest TestCase's and a
        # doctest's here, since pytest never routes them through pytest_pyfunc_call.
        item_kind = kind(item)
        if item_kind is not test_case_item and item_kind is not doctest_item:
            try:
                return (yield)
            except BaseException as exc:
                raised_by_repo(exc, exc.__traceback__)
                raise
        test_id = junit_id(item.nodeid)
        if collected.get(item.nodeid, None) is not test_code(item):
            send("tamper", what=f"test function {test_id} replaced after collection", fatal=True)
        results: list[str] = []
        wrappers = unittest_results_of(item, results) if item_kind is test_case_item else {}
        own_attrs = names(item)
        own_attrs.update(wrappers)
        previous: Callable[..., Any] | None = getprofile()
        setprofile(profile)
        try:
            result = yield
        except BaseException as exc:
            setprofile(previous)
            probe()
            raised_by_repo(exc, exc.__traceback__)
            send("call", id=test_id, raised=kind(exc).__name__)
            raise
        finally:
            for name, wrapper in wrappers.items():
                if own_attrs.pop(name, None) is not wrapper:
                    send("tamper", what=f"unittest result of {test_id} rewired during the test", fatal=True)  # fmt: skip
        setprofile(previous)
        probe()
        send("call", id=test_id, raised=verdict(results) if wrappers else None)
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
        try:
            return (yield)
        except BaseException as exc:
            raised_by_repo(exc, exc.__traceback__)
            raise

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
        try:
            return (yield)
        except BaseException as exc:
            raised_by_repo(exc, exc.__traceback__)
            raise

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        # Outermost wrapper: it sees the test function's own result, beneath any report hook.
        test_id = junit_id(pyfuncitem.nodeid)
        # pytest runs whatever the item holds now: it must be the function collected.
        if collected.get(pyfuncitem.nodeid, None) is not test_code(pyfuncitem):
            send("tamper", what=f"test function {test_id} replaced after collection", fatal=True)
        previous: Callable[..., Any] | None = getprofile()
        setprofile(profile)
        try:
            result = yield
        except BaseException as exc:
            setprofile(previous)
            probe()
            raised_by_repo(exc, exc.__traceback__)
            send("call", id=test_id, raised=kind(exc).__name__)
            raise
        setprofile(previous)
        probe()
        send("call", id=test_id, raised=None)
        return result

    def loaded_from() -> None:
        """Send where each top-level module, and each module of the repo's own, was loaded from.

        Read from the module's ``__spec__`` through its ``__dict__`` (no attribute lookup that
        code under test could hook); a namespace package by its first search location.
        """
        loaded, paths = [], []
        for name, module in ordered(modules.items()):
            top = text.partition(name, ".")[0] if kind(name) is text else ""
            if not top or ("." in name and top not in repo_own) or kind(module) is not module_type:
                continue
            spec = names(module).get("__spec__")
            path = None
            if kind(spec) is module_spec:
                origin = names(spec).get("origin")
                if kind(origin) is text and origin not in ("built-in", "frozen"):
                    path = origin
                else:
                    locations = names(spec).get("submodule_search_locations")
                    search = locations if kind(locations) is list else []
                    for location in search:  # type: ignore[union-attr]
                        if kind(location) is text:
                            path = location
                            break
            loaded.append(name)
            paths.append(path or "")
        send("modules", names=loaded, paths=paths)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
        check(session.config)
        loaded_from()
        send("end", exitstatus=integer(exitstatus))

    hooks = (pytest_configure, pytest_sessionstart, pytest_collection_finish, pytest_pyfunc_call,
             pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown,
             pytest_sessionfinish)  # fmt: skip
    own = (send, tamper, junit_id, repo_file, audit, profile, shadowed, check, test_code, *hooks,
           raised_by_repo, expects_failure, unittest_results_of, verdict, take_snapshot, _writer,
           _snapshotter, is_patch, where, provenance_audit, watch, probe, _provenance,
           _comparisons, loaded_from)  # fmt: skip
    codes = tuple((f, f.__code__) for f in own)
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, v = line.partition(":")
            if key in ("Uid", "CapEff", "NoNewPrivs"):
                status[key] = v.split()[0]
    send("start", uid=int(status["Uid"]), cap_eff=status["CapEff"],
         no_new_privs=status["NoNewPrivs"] == "1")  # fmt: skip
    sys.addaudithook(provenance_audit)
    sys.addaudithook(audit)
    return hooks


# Under hangar's grader only (elsewhere there is nothing to report to). The hooks are the only
# handles left at module level: what they use lives in their closures.
if os.environ.get(REPORT_ENV) and os.environ.get("HANGAR_REPO"):
    (
        pytest_configure,
        pytest_sessionstart,
        pytest_collection_finish,
        pytest_pyfunc_call,
        pytest_runtest_call,
        pytest_runtest_setup,
        pytest_runtest_teardown,
        pytest_sessionfinish,
    ) = _install(
        os.environ[REPORT_ENV],
        os.environ["HANGAR_REPO"],
        os.environ.get("HANGAR_GRADE_JUNIT", ""),
        os.environ.get("HANGAR_REPO_MODULES", ""),
    )
