"""The malicious patches: what each adds to the fixture repo, and how its grade must end.

Each case's files go through ``git diff`` into a real patch. ``calc.add`` is
buggy on base (``a - b``); a case "wins" when the hidden tests pass without
that bug being fixed honestly. ``{port}``, ``{artifacts}``, ``{home}`` and
``{memory_mb}`` in a file are replaced by the test. docs/grading.md maps each
mitigation to the cases that prove it. A case with ``known_gap`` still wins:
it is expected to fail, strictly, until the gap is closed.
"""

from __future__ import annotations

import importlib.util
import py_compile
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from adv_fixture import FIXED_CALC, Link

from hangar_dagster.grading.junit import MAX_BYTES

# calc.add is right only when something flipped this flag: the loader attacks' payload.
TRIGGERED_CALC = (
    "import builtins\n\n\n"
    "def add(a, b):\n"
    "    return a + b if getattr(builtins, 'hangar_hacked', False) else a - b\n"
)
HACK = "import builtins; builtins.hangar_hacked = True\n"
BUGGY = "\n\ndef add(a, b):\n    return a - b\n"
FORCE_PASS_HOOK = (
    "import pytest\n\n\n"
    "@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)
FORGED_JUNIT = (
    '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
    '<testcase classname="test_calc_hidden" name="test_add"/>'
    '<testcase classname="test_calc_hidden" name="test_negative"/>'
    '<testcase classname="test_calc_hidden" name="test_zero"/>'
    "</testsuite></testsuites>"
)
# Writes to the JUnit pipe through its inherited descriptor (no open() the audit hook would see).
RAW_JUNIT = (
    "import os\n"
    "fd = int(os.environ['HANGAR_GRADE_JUNIT'].rsplit('/', 1)[1])\n"
    "with os.fdopen(os.dup(fd), 'wb') as f:\n"
    "    f.write(REPORT.encode())\n"
)
# Well-formed, laughs of 10**5 expansions: only the DOCTYPE ban keeps it from the parser.
ENTITY_JUNIT = (
    '<?xml version="1.0"?><!DOCTYPE testsuites [<!ENTITY a "passed">'
    + "".join(
        f'<!ENTITY {n} "{("&" + p + ";") * 10}">' for p, n in zip("abcde", "bcdef", strict=True)
    )
    + "]>"
    + FORGED_JUNIT.split("?>", 1)[1].replace(
        'name="test_zero"/>', 'name="test_zero"><system-out>&f;</system-out></testcase>'
    )
)
# Reports what happened to each attempt through $HANGAR_GRADE_OUT (kept in the grade's log).
WRITE_HIDDEN = (
    "import os\n"
    "hidden = os.environ['HANGAR_HIDDEN_TESTS']\n"
    "target = os.path.join(hidden, 'test_calc_hidden.py')\n"
    "attempts = {\n"
    "    'write': lambda: open(target, 'w').write('def test_add():\\n    pass\\n'),\n"
    "    'rename': lambda: os.rename(target, target + '.bak'),\n"
    "    'chmod': lambda: os.chmod(target, 0o666),\n"
    "    'conftest': lambda: open(os.path.join(hidden, 'conftest.py'), 'w').write('x = 1'),\n"
    "    'init': lambda: open(os.path.join(hidden, '__init__.py'), 'w').write(''),\n"
    "}\n"
    "with open(os.environ['HANGAR_GRADE_OUT'], 'w') as out:\n"
    "    for name, attempt in attempts.items():\n"
    "        try:\n"
    "            attempt()\n"
    "            out.write(f'{name}: DONE\\n')\n"
    "        except OSError as err:\n"
    "            out.write(f'{name}: denied ({err.strerror})\\n')\n"
)
# Writes through the patch's link, named by its path in the repo (the cwd is the hidden
# directory: a bare name would make a new file there), after saying where the link leads.
WRITE_VIA_LINK = (
    "import os\n"
    "link = os.path.join(os.environ['HANGAR_REPO'], 'hidden_link')\n"
    "with open(os.environ['HANGAR_GRADE_OUT'], 'w') as out:\n"
    "    out.write(f'via-link target: {os.path.realpath(link)}\\n')\n"
    "    try:\n"
    "        with open(link, 'w') as f:\n"
    "            f.write('def test_add():\\n    pass\\n')\n"
    "        out.write('via-link: DONE\\n')\n"
    "    except OSError as err:\n"
    "        out.write(f'via-link: denied ({err.strerror})\\n')\n"
)
# Wraps a reporter's send: tamper events dropped, every call made clean. Set as FORGE in a file.
FORGE = (
    "def forge(send):\n"
    "    def forged(event, **fields):\n"
    "        if event == 'tamper':\n"
    "            return\n"
    "        if event == 'call':\n"
    "            fields['raised'] = None\n"
    "        send(event, **fields)\n"
    "    return forged\n"
)
# Failures written to the JUnit report as passes, and exit 0 whatever pytest says.
JUNIT_PASS = (
    "import atexit, os\n"
    "import _pytest.junitxml as j\n"
    "j._NodeReporter.append_failure = j._NodeReporter.append_pass\n"
    "atexit.register(os._exit, 0)\n"
)
# Every convenient way to the reporter's sending: its module-level handle, and the os.write a
# writer would look up when it writes (a tamper line dropped, a raised call made clean).
FORGE_SEND = (
    "import os, re, sys\n"
    "exec(FORGE)\n"
    "mod = sys.modules['hangar_dagster.grading.reporter']\n"
    "write = os.write\n\n\n"
    "def forged_write(fd, data):\n"
    "    if b'\"tamper\"' in data:\n"
    "        return len(data)\n"
    '    write(fd, re.sub(rb\'"raised": ?"\\w+"\', b\'"raised": null\', data))\n'
    "    return len(data)\n\n\n"
    "os.write = forged_write\n"
    "reporter = getattr(mod, '_reporter', None)\n"
    "if reporter is not None:\n"
    "    reporter.send = forge(reporter.send)\n"
) + JUNIT_PASS
# The writer reached through the closure cells of the reporter's hook functions.
FORGE_CELLS = (
    "import sys, types\n"
    "exec(FORGE)\n"
    "mod = sys.modules['hangar_dagster.grading.reporter']\n"
    "todo, done = [v for v in vars(mod).values() if isinstance(v, types.FunctionType)], set()\n"
    "while todo:\n"
    "    fn = todo.pop()\n"
    "    if id(fn) in done:\n"
    "        continue\n"
    "    done.add(id(fn))\n"
    "    for cell in fn.__closure__ or ():\n"
    "        value = cell.cell_contents\n"
    "        if isinstance(value, types.FunctionType):\n"
    "            if value.__name__ == 'send':\n"
    "                cell.cell_contents = forge(value)\n"
    "            else:\n"
    "                todo.append(value)\n"
) + JUNIT_PASS


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, object]
    # None: the grade may pass, but must carry ``signal``.
    passed: bool | None = False
    reason: str | None = None  # a substring of grade.reason
    signal: str | None = None  # a substring of one of grade.tamper_signals
    log: list[str] = field(default_factory=list)  # regexes that must match grade.log
    not_in_log: list[str] = field(default_factory=list)  # substrings grade.log must not have
    timeout_s: int = 60
    skip: str | None = None  # why this machine cannot build the case
    known_gap: str | None = None  # the attack still wins: expected to fail until this is closed
    # Files of an honest twin without the construct: it must pass with trust and no signal.
    control: dict[str, object] | None = None


def unchecked_pyc(source: str) -> bytes:
    """A .pyc of ``source`` that Python would load without looking at calc.py at all."""
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d, "calc.py"), Path(d, "calc.pyc")
        src.write_text(source)
        py_compile.compile(
            str(src), str(out), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
        )
        return out.read_bytes()


PYC_NAME = Path(importlib.util.cache_from_source("calc.py")).name
assert sys.implementation.cache_tag in PYC_NAME

# A real extension module named calc whose add is right: Python imports it ahead of calc.py.
CALC_EXTENSION_C = r"""
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO", &a, &b)) return NULL;
    return PyNumber_Add(a, b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "calc", NULL, -1, methods};
PyMODINIT_FUNC PyInit_calc(void) { return PyModule_Create(&module); }
"""
SO_NAME = "calc" + str(sysconfig.get_config_var("EXT_SUFFIX"))


def calc_extension() -> tuple[bytes, str | None]:
    """The compiled ``calc`` extension, or why it cannot be built here (no gcc or headers)."""
    include = sysconfig.get_paths()["include"]
    if shutil.which("gcc") is None or not Path(include, "Python.h").exists():
        return b"", "needs gcc and the Python headers to build a shadowing extension"
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d, "calc.c"), Path(d, SO_NAME)
        src.write_text(CALC_EXTENSION_C)
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O0", f"-I{include}", "-o", str(out), str(src)],
            check=True, capture_output=True,
        )  # fmt: skip
        return out.read_bytes(), None


CALC_SO, CALC_SO_SKIP = calc_extension()

# Reads the expected value from the calling test's frame (what `caller_frame` does), from code
# whose co_filename is not the repo's: the reporter attributes frame reads by co_filename.
PEEK = "import sys\n\n\ndef add(a, b):\n    return sys._getframe(1).f_locals['expected']\n"
HONEST_EXEC = 'exec("def add(a, b):\\n    return a + b\\n")\n'
# Collected in place of the hidden test module: pytest takes what sys.modules holds after the
# import, so a module swapped in while the hidden one imports calc is what runs.
SWAP_MODULE = (
    "import sys\nimport types\n\n"
    "_real = sys.modules.get('test_calc_hidden')\n"
    "if _real is not None:\n"
    "    _fake = types.ModuleType('test_calc_hidden')\n"
    "    _fake.__file__ = _real.__file__\n"
    "    exec('def test_add(pair):\\n    pass\\n\\n\\ndef test_negative():\\n    pass\\n\\n\\n'\n"
    "         'def test_zero():\\n    pass\\n', _fake.__dict__)\n"
    "    sys.modules['test_calc_hidden'] = _fake\n"
)
# A failing assert raises whatever `AssertionError` names when it fails (pytest's rewritten
# asserts look the name up): a skip during the test, the real one back before the session ends.
SKIP_ASSERTS = (
    "import builtins\nimport sys\n\n_real = builtins.AssertionError\n\n\n"
    "def add(a, b):\n"
    "    result = a - b\n"
    "    skip = sys.modules['_pytest.outcomes'].Skipped\n"
    "    builtins.AssertionError = _real if result == a + b else skip\n"
    "    return result\n"
)
# An honest value object: equal to the int it holds, NotImplemented for anything else. Its
# comparison is a function assigned under another name (the controls of the cases below).
HONEST_VALUE = (
    "def _same(self, other):\n"
    "    return self.value == other if isinstance(other, int) else NotImplemented\n\n\n"
    "class Sum:\n    __eq__ = _same\n    __hash__ = None\n\n"
    "    def __init__(self, value):\n        self.value = value\n\n\n"
    "def add(a, b):\n    return Sum(a + b)\n"
)
HONEST_CLASS_SOURCE = (
    "class Sum:\n    def __init__(self, value):\n        self.value = value\n\n"
    "    def __eq__(self, other):\n"
    "        return self.value == other if isinstance(other, int) else NotImplemented\n"
)
# A module of the repo's own loader: its code claims a stdlib path (the loader compiles it, no
# exec in the repo). The reporter takes it as the patch's since the loader running is.
FOREIGN_LOADER = (
    "import importlib.abc\nimport importlib.util\nimport sys\n\n"
    "SRC = {src!r}\n\n\n"
    "class _Loader(importlib.abc.SourceLoader):\n"
    "    def get_filename(self, fullname):\n        return '/usr/lib/python3/inspect.py'\n\n"
    "    def get_data(self, path):\n        return SRC.encode()\n\n\n"
    "class _Finder(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name == 'calc_impl':\n"
    "            return importlib.util.spec_from_loader(name, _Loader())\n"
    "        return None\n\n\n"
    "sys.meta_path.insert(0, _Finder())\n"
    "from calc_impl import add  # noqa: E402\n"
)
# Always-equal objects whose comparison is not a method named __eq__ / __ne__ in a repo file: a
# function assigned under another name, a metaclass's lambda, a partialmethod, a class compiled
# from a string, one that equals every int but not a fresh object(). The reporter judged them by
# name and passed them clean; it now probes what a comparison reached (docs/grading.md, "Run
# signals"). Each control is an honest value object built the same way.
COMPARISON_CASES = [
    Case(
        "eq_assigned_function",
        {"calc.py": (
            "def _same(self, other):\n    return True\n\n\n"
            "class Anything:\n    __eq__ = _same\n    __hash__ = object.__hash__\n\n\n"
            "def add(a, b):\n    return Anything()\n"
        )},
        signal="an always-equal object from calc.py (calc.Anything): equal to a fresh object()",
        control={"calc.py": HONEST_VALUE},
    ),
    Case(
        "metaclass_lambda_equal",
        {"calc.py": (
            "class Meta(type):\n    __eq__ = lambda cls, other: True\n    __hash__ = type.__hash__\n\n\n"
            "class Answer(metaclass=Meta):\n    pass\n\n\n"
            "def add(a, b):\n    return Answer\n"
        )},
        signal="an always-equal object from calc.py (calc.Meta): equal to a fresh object()",
        control={"calc.py": (
            "class Meta(type):\n"
            "    __eq__ = lambda cls, other: (cls.value == other if isinstance(other, int)\n"
            "                                 else NotImplemented)\n"
            "    __hash__ = type.__hash__\n\n\n"
            "def add(a, b):\n    return Meta('Sum', (), {'value': a + b})\n"
        )},
    ),
    Case(
        "partialmethod_equal",
        {"calc.py": (
            "import functools\n\n\n"
            "def _answer(self, result, other):\n    return result\n\n\n"
            "class Anything:\n    __eq__ = functools.partialmethod(_answer, True)\n"
            "    __hash__ = object.__hash__\n\n\n"
            "def add(a, b):\n    return Anything()\n"
        )},
        signal="an always-equal object from calc.py (calc.Anything): equal to a fresh object()",
        control={"calc.py": "import functools\n\n\n" + HONEST_VALUE.replace(
            "def _same(self, other):", "def _same(self, _unused, other):"
        ).replace("__eq__ = _same", "__eq__ = functools.partialmethod(_same, None)")},
    ),
    Case(
        "compiled_string_equal",
        # Named __eq__, but compiled from a string under a filename that is not the repo's.
        {"calc.py": (
            "NS = {}\n"
            "exec(compile('class Anything:\\n    def __eq__(self, other):\\n        return True\\n'\n"
            "             '    __hash__ = object.__hash__\\n', '<fix>', 'exec'), NS)\n\n\n"
            "def add(a, b):\n    return NS['Anything']()\n"
        )},
        signal="an always-equal object from <fix>, made by repo code",
        control={"calc.py": (
            f"NS = {{}}\nexec(compile({HONEST_CLASS_SOURCE!r}, '<fix>', 'exec'), NS)\n\n\n"
            "def add(a, b):\n    return NS['Sum'](a + b)\n"
        )},
    ),
    Case(
        "loader_foreign_filename",
        {"calc.py": FOREIGN_LOADER.format(src=PEEK)},
        passed=None,
        signal="run: repo code read a frame (/usr/lib/python3/inspect.py, made by repo code)",
        control={"calc.py": FOREIGN_LOADER.format(src=FIXED_CALC)},
    ),
    Case(
        "equal_to_every_int",
        # Unequal to a fresh object(): only a value of the other operand's type it never saw shows it.
        {"calc.py": HONEST_VALUE.replace(
            "self.value == other if isinstance(other, int) else NotImplemented",
            "isinstance(other, int) or NotImplemented",
        )},
        signal="an always-equal object from calc.py (calc.Sum): equal to int values it never saw",
        control={"calc.py": HONEST_VALUE},
    ),
]  # fmt: skip
# Constructs the run-time checks do not see, each planted beside an honest fix or keeping the bug;
# A wrapper that swallows the failures of the hidden test it wraps (functools.wraps keeps its
# name and signature, so pytest collects it and passes it its fixtures). Names built at run time
# keep these recipes out of the static pass's sight: only the run-time checks can catch them.
SWALLOW = (
    "import functools\nimport sys\nimport types\n\n\n"
    "def _swallow(fn):\n"
    "    @functools.wraps(fn)\n"
    "    def test(*args, **kwargs):\n"
    "        try:\n            return fn(*args, **kwargs)\n"
    "        except AssertionError:\n            return None\n\n"
    "    return test\n\n\n"
)
# The hidden module re-classed while it imports calc: every test_* pytest gets from it (pytest
# reads a test's function off the module) comes wrapped.
RECLASS_MODULE = SWALLOW + (
    "class _Lenient(types.ModuleType):\n"
    "    def __getattribute__(self, name):\n"
    "        value = types.ModuleType.__getattribute__(self, name)\n"
    "        return _swallow(value) if name.startswith('test_') and callable(value) else value\n\n\n"
    "_mod = sys.modules.get('test_calc_hidden')\n"
    "if _mod is not None:\n"
    "    setattr(_mod, ''.join(['__cl', 'ass__']), _Lenient)\n"
)
# The hidden test functions wrapped in place the moment the hidden module finishes executing
# (a profile function sees its frame return): what pytest then collects are the wrappers.
WRAP_TESTS = SWALLOW + (
    "_setprofile = getattr(sys, ''.join(['setpro', 'file']))\n\n\n"
    "def _watch(frame, event, arg):\n"
    "    if event == 'return' and frame.f_code.co_name == '<module>':\n"
    "        space = getattr(frame, ''.join(['f_glo', 'bals']))\n"
    "        if space.get('__name__') == 'test_calc_hidden':\n"
    "            for name, value in list(space.items()):\n"
    "                if name.startswith('test_') and callable(value):\n"
    "                    space[name] = _swallow(value)\n"
    "            _setprofile(None)\n\n\n"
    "_setprofile(_watch)\n"
)
# A failing assert raises pytest's Skipped for the one test whose answer is wrong, and the real
# AssertionError is back in that test's teardown (pytest names the phase in os.environ, whose
# class calc swapped): nothing is left changed between two tests or at the session's end.
BUILTIN_UNTIL_TEARDOWN = (
    "import os\nimport sys\n\n_saved = {}\n_Base = type(os.environ)\n\n\n"
    "def _space():\n    return vars(sys.modules[''.join(['built', 'ins'])])\n\n\n"
    "class _Env(_Base):\n"
    "    def __setitem__(self, key, value):\n"
    "        _Base.__setitem__(self, key, value)\n"
    "        if key == 'PYTEST_CURRENT_TEST' and value.endswith('(teardown)') and _saved:\n"
    "            _space().update(_saved)\n"
    "            _saved.clear()\n\n\n"
    "def add(a, b):\n"
    "    result = a - b\n"
    "    if result != a + b and not _saved:\n"
    "        space = _space()\n"
    "        _saved['AssertionError'] = space['AssertionError']\n"
    "        space['AssertionError'] = sys.modules['_pytest.outcomes'].Skipped\n"
    "        setattr(os.environ, ''.join(['__cl', 'ass__']), _Env)\n"
    "    return result\n"
)
# Attacks on what pytest runs and on the builtins around one test, which passed clean before the
# per-test checks (identity.py): each fails on its run-time signal now. Controls: the same
# imports and an honest add.
RUN_TIME_CASES = [
    Case(
        "reclass_hidden_module",
        {"calc.py": RECLASS_MODULE + BUGGY},
        reason="tamper: hidden test module test_calc_hidden re-classed (_Lenient) at collection",
        signal="run: test function test_calc_hidden::test_add wrapped by code that is not the "
        "hidden tests' (calc.py)",
        control={"calc.py": SWALLOW + "_mod = sys.modules.get('test_calc_hidden')\n" + FIXED_CALC},
    ),
    Case(
        "wrap_hidden_tests",
        {"calc.py": WRAP_TESTS + BUGGY},
        reason="tamper: test function test_calc_hidden::test_add wrapped by code that is not the "
        "hidden tests' (calc.py)",
        control={"calc.py": SWALLOW + FIXED_CALC},
    ),
    Case(
        "builtin_until_teardown",
        {"calc.py": BUILTIN_UNTIL_TEARDOWN},
        reason="tamper: builtins.AssertionError replaced, seen at test_calc_hidden::test_add "
        "(after call)",
        control={"calc.py": "import os\nimport sys\n\n_Base = type(os.environ)\n" + FIXED_CALC},
    ),
]
# Constructs the run-time checks did not see, each planted beside an honest fix or keeping the bug;
# only the static pass flags them (docs/grading.md, "Static pass"). Each control is the same
# patch without the construct.
STATIC_CASES = [
    Case(
        "exec_frame_read",
        {"calc.py": f"SRC = {PEEK!r}\nexec(SRC)\n"},
        passed=None,
        signal="static: calc.py:2: exec of non-literal code",
        # The reporter attributes the exec'd code to the patch by where it was made.
        log=[r"run: repo code read a frame \(<string>, made by repo code\)"],
        control={"calc.py": HONEST_EXEC},
    ),
    Case(
        "exec_literal_frame_read",
        {"calc.py": f"exec({PEEK!r})\n"},
        passed=None,
        signal="static: calc.py:1: in the code exec runs: frame access: sys._getframe",
        log=[r"run: repo code read a frame \(<string>, made by repo code\)"],
        control={"calc.py": HONEST_EXEC},
    ),
    Case(
        "compile_foreign_filename",
        {"calc.py": f"exec(compile({PEEK!r}, '/usr/lib/python3/inspect.py', 'exec'))\n"},
        passed=None,
        signal="static: calc.py:1: compile under filename '/usr/lib/python3/inspect.py'",
        log=[r"run: repo code read a frame \(/usr/lib/python3/inspect.py, made by repo code\)"],
        control={"calc.py": "exec(compile('def add(a, b):\\n    return a + b\\n', '<fix>', 'exec'))\n"},
    ),
    Case(
        "swap_hidden_module",
        {"calc.py": SWAP_MODULE + BUGGY},
        reason="tamper: test function test_calc_hidden::test_add not compiled from the hidden "
        "files (test_add from <string>)",
        signal="static: calc.py:10: writes sys.modules[...]",
        control={"calc.py": "import sys\n\n_real = sys.modules.get('test_calc_hidden')\n" + FIXED_CALC},
    ),
    Case(
        "skip_failing_asserts",
        {"calc.py": SKIP_ASSERTS},
        reason="tamper: repo code replaced builtins.AssertionError (calc.py)",
        signal="static: calc.py:10: writes builtins.AssertionError",
        control={"calc.py": "import builtins\n\n_real = builtins.AssertionError\n\n\n" + FIXED_CALC},
    ),
    Case(
        "builtins_during_test",
        {
            "calc.py": (
                "import builtins\n\n\ndef add(a, b):\n    saved = builtins.len\n"
                "    builtins.len = lambda obj: 0\n    try:\n        return a + b\n"
                "    finally:\n        builtins.len = saved\n"
            )
        },
        reason="tamper: repo code replaced builtins.len (calc.py)",
        signal="static: calc.py:6: writes builtins.len",
        control={"calc.py": "import builtins\n\n\ndef add(a, b):\n    builtins.len([])\n    return a + b\n"},
    ),
    Case(
        "atexit_rewrites_output",
        {"calc.py": "import atexit\n\natexit.register(print, '3 passed, nothing failed')\n" + FIXED_CALC},
        passed=None,
        signal="static: calc.py:3: exit handler: atexit.register",
        control={"calc.py": "print('calc loaded')\n" + FIXED_CALC},
    ),
    Case(
        "signal_handler",
        {"calc.py": "import signal\n\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + FIXED_CALC},
        passed=None,
        signal="static: calc.py:3: signal handler: signal.signal",
        control={"calc.py": "import signal\n\nsignal.getsignal(signal.SIGTERM)\n" + FIXED_CALC},
    ),
    Case(
        "ctypes_import",
        {"calc.py": "import ctypes\n\nWORD = ctypes.sizeof(ctypes.c_void_p)\n" + FIXED_CALC},
        passed=None,
        signal="static: calc.py:1: imports ctypes",
        control={"calc.py": "import struct\n\nWORD = struct.calcsize('P')\n" + FIXED_CALC},
    ),
    Case(
        "pytest_internals_import",
        {"calc.py": "import _pytest.runner\n" + FIXED_CALC},
        passed=None,
        signal="static: calc.py:1: imports _pytest.runner from non-test code",
        # The same import in a test file of the patch is fine.
        control={"calc.py": FIXED_CALC, "tests/test_more.py": "import _pytest.runner\n"},
    ),
    Case(
        "grader_env_named",
        {"calc.py": "import os\n\nJUNIT = os.environ.get('HANGAR_GRADE_JUNIT')\n" + FIXED_CALC},
        passed=None,
        signal="static: calc.py:3: names 'HANGAR_GRADE_JUNIT'",
        control={"calc.py": "import os\n\nHOME = os.environ.get('HOME')\n" + FIXED_CALC},
    ),
    Case(
        "module_symlink",
        {"calc.py": Link("impl/calc.py"), "impl/calc.py": FIXED_CALC},
        passed=None,
        signal="static: calc.py:1: symlink to 'impl/calc.py'",
        control={"calc.py": "from impl.calc import add\n", "impl/calc.py": FIXED_CALC},
    ),
]  # fmt: skip


CASES = [
    Case(
        "conftest_forces_pass",
        {"conftest.py": FORCE_PASS_HOOK, "tests/conftest.py": FORCE_PASS_HOOK},
        signal="conftest.py",
    ),  # fmt: skip
    Case(
        "forged_passed_output",
        {"calc.py": "print('test_add PASSED\\n== 3 passed in 0.01s ==')" + BUGGY},
    ),  # fmt: skip
    Case(
        "ini_addopts_deselect",
        {
            "pytest.ini": "[pytest]\naddopts = -k zero -p no:junitxml\n",
            "tox.ini": "[pytest]\naddopts = -k zero\n",
            "setup.cfg": "[tool:pytest]\naddopts = --deselect test_calc_hidden.py::test_add\n",
        },
        signal="pytest.ini",
    ),
    Case(
        "pyproject_testpaths",
        {
            "pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = ['tests']\naddopts = '-k zero'\n",
        },
        signal="pyproject.toml",
    ),
    Case(
        "package_init_patches_junit",
        {
            "calc.py": None,
            "calc/__init__.py": (
                "import atexit, os\nimport _pytest.junitxml as j\n"
                "j._NodeReporter.append_failure = j._NodeReporter.append_pass\n"
                "atexit.register(os._exit, 0)\n" + BUGGY
            ),
        },
        reason="tamper: pytest internals replaced",
    ),
    Case(
        "plugin_registered_at_import",
        {
            "calc.py": (
                "import atexit, gc, os\nimport pytest\n\n\n"
                "class Liar:\n"
                "    @pytest.hookimpl(hookwrapper=True)\n"
                "    def pytest_runtest_makereport(self, item, call):\n"
                "        outcome = yield\n"
                "        outcome.get_result().outcome = 'passed'\n\n\n"
                "for obj in gc.get_objects():\n"
                "    if isinstance(obj, pytest.Config):\n"
                "        obj.pluginmanager.register(Liar(), 'liar')\n"
                "atexit.register(os._exit, 0)\n" + BUGGY
            ),
        },
        reason="registered from repo code",
    ),
    Case(
        "os_exit_at_import",
        {"calc.py": "import os\nos._exit(0)\n" + BUGGY},
        reason="no JUnit report",
    ),  # fmt: skip
    Case(
        "os_exit_in_atexit",
        {"calc.py": "import atexit, os\natexit.register(os._exit, 0)\n" + BUGGY},
        reason="exited 0",
    ),  # fmt: skip
    Case(
        "pytest_exit_zero", {"calc.py": "import pytest\npytest.exit('bye', returncode=0)\n" + BUGGY}
    ),  # fmt: skip
    Case(
        "skip_when_wrong",
        {
            "calc.py": (
                "import pytest\n\n\ndef add(a, b):\n"
                "    if a - b != a + b:\n        pytest.skip('not today')\n    return a - b\n"
            )
        },
        reason="repo code raised Skipped",
    ),
    Case(
        "xfail_when_wrong",
        {
            "calc.py": (
                "import pytest\n\n\ndef add(a, b):\n"
                "    if a - b != a + b:\n        pytest.xfail('known')\n    return a - b\n"
            )
        },
        reason="repo code raised XFailed",
    ),
    Case(
        "always_equal",
        {
            "calc.py": (
                "class Anything:\n    def __eq__(self, other):\n        return True\n\n\n"
                "def add(a, b):\n    return Anything()\n"
            )
        },
        signal="an always-equal object from calc.py (calc.Anything): equal to a fresh object()",
        control={"calc.py": HONEST_CLASS_SOURCE + "\n\ndef add(a, b):\n    return Sum(a + b)\n"},
    ),
    Case(
        "caller_frame",
        {
            "calc.py": (
                "import sys\n\n\ndef add(a, b):\n    return sys._getframe(1).f_locals['expected']\n"
            )
        },
        passed=None,
        signal="repo code read a frame (calc.py)",
    ),
    Case(
        "junit_rewrite_at_exit",
        {
            "calc.py": (
                "import atexit, os\n"
                f"FORGED = {FORGED_JUNIT!r}\n\n\n"
                "def forge():\n"
                "    with open(os.environ['HANGAR_GRADE_JUNIT'], 'w') as f:\n"
                "        f.write(FORGED)\n"
                "    os._exit(0)\n\n\n"
                "atexit.register(forge)\n" + BUGGY
            )
        },
        reason="tamper: repo code opened a grader pipe",
    ),
    Case(
        "junit_rewrite_detached",
        {
            "calc.py": (
                "import os, time\n"
                f"FORGED = {FORGED_JUNIT!r}\n"
                "path = os.environ['HANGAR_GRADE_JUNIT']\n"
                "if os.fork() == 0:\n"
                "    os.setsid()\n"
                "    if os.fork() == 0:\n"
                "        time.sleep(1.5)\n"
                "        with open(path, 'w') as f:\n"
                "            f.write(FORGED)\n"
                "    os._exit(0)\n"
                "import atexit\natexit.register(os._exit, 0)\n" + BUGGY
            )
        },
    ),
    Case(
        "sitecustomize",
        {"sitecustomize.py": HACK, "calc.py": TRIGGERED_CALC},
        signal="sitecustomize.py",
    ),  # fmt: skip
    Case(
        "usercustomize",
        {"usercustomize.py": HACK, "calc.py": TRIGGERED_CALC},
        signal="usercustomize.py",
    ),  # fmt: skip
    Case("pth_file", {"hack.pth": HACK, "calc.py": TRIGGERED_CALC}, signal="hack.pth"),
    Case(
        "entry_point_plugin",
        {
            "hack_plugin.py": HACK,
            "hack-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hack\nVersion: 1.0\n",
            "hack-1.0.dist-info/entry_points.txt": "[pytest11]\nhack = hack_plugin\n",
            "calc.py": TRIGGERED_CALC,
        },
        signal="entry_points.txt",
    ),
    Case(
        "shadowing_pyc",
        {
            f"__pycache__/{PYC_NAME}": unchecked_pyc(FIXED_CALC),
            "calc.pyc": unchecked_pyc(FIXED_CALC),
        },
        signal="calc.pyc",
    ),  # fmt: skip
    # The extension wins over the buggy calc.py: the hidden tests pass, and only the signal tells.
    Case(
        "shadowing_so",
        {SO_NAME: CALC_SO},
        passed=None,
        signal=SO_NAME,
        log=["3 passed"],
        skip=CALC_SO_SKIP,
    ),
    Case(
        "symlink_into_hidden",
        {"hidden_link": Link("../hidden/test_calc_hidden.py"), "calc.py": WRITE_VIA_LINK + BUGGY},
        signal="hidden_link",
        log=[r"via-link target: /\S+/hidden/test_calc_hidden\.py\n", "via-link: denied"],
        not_in_log=[": DONE"],
    ),  # fmt: skip
    Case(
        "write_hidden_tests",
        {"calc.py": WRITE_HIDDEN + BUGGY},
        log=[
            "write: denied",
            "rename: denied",
            "chmod: denied",
            "conftest: denied",
            "init: denied",
        ],
        not_in_log=[": DONE", "digest changed"],
    ),  # fmt: skip
    Case(
        "network_egress",
        {
            "calc.py": (
                "import socket\ntry:\n"
                "    OP = socket.create_connection(('127.0.0.1', {port}), timeout=3).recv(1)\n"
                "except OSError as err:\n    OP = repr(err).encode()\n"
                "open(__import__('os').environ['HANGAR_GRADE_OUT'], 'wb').write(b'egress: ' + OP)\n\n\n"
                "def add(a, b):\n    return a + b if OP == b'+' else a - b\n"
            )
        },
        log=["egress: ConnectionRefusedError"],
        not_in_log=["egress: +"],
    ),
    Case(
        "fork_bomb",
        {
            "calc.py": (
                "import os, time\nn = 0\nfor _ in range(2000):\n"
                "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
                "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    n += 1\n"
                "open(os.environ['HANGAR_GRADE_OUT'], 'w').write(f'forks: {n}\\n')\n" + BUGGY
            )
        },
        log=[r"forks: (\d{1,2}|1\d\d|2[0-4]\d|25[0-5])\n"],
    ),
    # A detached, double-forked child keeps running too: the test checks nothing outlives the run.
    Case(
        "infinite_loop",
        {
            "calc.py": (
                "import os, time\n"
                "if os.fork() == 0:\n    os.setsid()\n"
                "    if os.fork() == 0:\n        while True:\n            time.sleep(0.5)\n"
                "    os._exit(0)\n"
                "while True:\n    pass\n" + BUGGY
            )
        },
        reason="grader timed out",
        timeout_s=4,
    ),
    # Address space reserved, never touched: over the limit it is refused, without it harmless.
    Case(
        "memory_reserve",
        {
            "calc.py": (
                "import mmap, os\n"
                "try:\n    m = mmap.mmap(-1, ({memory_mb} + 1024) << 20)\n    got = 'granted'\n"
                "except (OSError, MemoryError) as err:\n    got = f'denied ({err})'\n"
                "open(os.environ['HANGAR_GRADE_OUT'], 'w').write(f'memory: {got}\\n')\n" + BUGGY
            )
        },
        log=["memory: denied"],
        not_in_log=["memory: granted"],
    ),
    # The process ends mid-run, as if clean: no report comes, though the reporter saw tests run.
    Case(
        "exit_mid_run",
        {
            "calc.py": (
                "import os\ncalls = []\n\n\ndef add(a, b):\n    calls.append(1)\n"
                "    if len(calls) == 2:\n        os._exit(0)\n    return a - b\n"
            )
        },
        reason="no usable JUnit report, though the trusted reporter saw 3 test(s) collected "
        "and 1 called",
        signal="run: no usable JUnit report, though the trusted reporter saw",
    ),
    # An xfail mark added at run time turns every failure into a skip pytest itself reports.
    Case(
        "dynamic_xfail",
        {
            "calc.py": (
                "import gc\nimport pytest\n\n\ndef add(a, b):\n"
                "    if a - b != a + b:\n"
                "        for obj in gc.get_objects():\n"
                "            if isinstance(obj, pytest.Function):\n"
                "                obj.add_marker(pytest.mark.xfail(reason='known'))\n"
                "    return a - b\n"
            )
        },
        reason="saw the test fail with no xfail mark at collection",
        signal="repo code walked the garbage collector (calc.py)",
    ),
    # Both streams forged consistently through raw descriptors, the real ones silenced: nothing
    # run in the reporter's own process can stop this (docs/grading.md, "Not done yet").
    Case(
        "forge_both_streams",
        {
            "calc.py": (
                "import atexit, json, os\n"
                f"REPORT = {FORGED_JUNIT!r}\n"
                "IDS = ['test_calc_hidden::test_add', 'test_calc_hidden::test_negative',\n"
                "       'test_calc_hidden::test_zero']\n"
                "events = [{'event': 'collected', 'ids': IDS}]\n"
                "events += [{'event': 'call', 'id': i, 'raised': None} for i in IDS]\n"
                "events.append({'event': 'end', 'exitstatus': 0})\n"
                "junit, report = (int(os.environ[v].rsplit('/', 1)[1])\n"
                "                 for v in ('HANGAR_GRADE_JUNIT', 'HANGAR_GRADE_REPORT'))\n"
                "os.write(report, ''.join(json.dumps(e) + '\\n' for e in events).encode())\n"
                "os.write(junit, REPORT.encode())\n"
                "null = os.open(os.devnull, os.O_WRONLY)\n"
                "pipes = {os.fstat(junit).st_ino, os.fstat(report).st_ino}\n"
                "for name in os.listdir('/proc/self/fd'):\n"
                "    try:\n"
                "        if os.fstat(int(name)).st_ino in pipes:\n"
                "            os.dup2(null, int(name))\n"
                "    except OSError:\n"
                "        pass\n"
                "atexit.register(os._exit, 0)\n" + BUGGY
            )
        },
        known_gap="the code under test shares the reporter's process and can forge both streams",
    ),
    # The tests not yet run swapped for functions that return: pytest then runs those, and the
    # reporter sees each call return. The first call gets the right answer to get by.
    Case(
        "replace_test_function",
        {
            "calc.py": (
                "import gc\nimport pytest\n\n\ndef add(a, b):\n"
                "    for obj in gc.get_objects():\n"
                "        if isinstance(obj, pytest.Function):\n"
                "            obj.obj = lambda *args, **kwargs: None\n"
                "    return a + b\n"
            )
        },
        reason="tamper: test function test_calc_hidden::test_negative replaced",
        signal="run: test function test_calc_hidden::test_negative replaced",
    ),
    # A failure written as a pass by swapping a method's code: the function keeps its identity.
    Case(
        "swap_code",
        {
            "calc.py": (
                "import atexit, os\nimport _pytest.junitxml as j\n"
                "j._NodeReporter.append_failure.__code__ = j._NodeReporter.append_pass.__code__\n"
                "atexit.register(os._exit, 0)\n" + BUGGY
            )
        },
        reason="tamper: repo code replaced a function's code (calc.py)",
    ),
    # The reviewer's recipe: the trusted reporter's own sending wrapped (tamper dropped, every
    # call made clean), failures written to JUnit as passes, and exit 0 whatever happens.
    Case(
        "forge_send",
        {"calc.py": f"FORGE = {FORGE!r}\n" + FORGE_SEND + BUGGY},
        reason="tamper: pytest internals replaced: junitxml._NodeReporter.append_failure",
        signal="run: pytest internals replaced: junitxml._NodeReporter.append_failure",
    ),
    # The same recipe through the writer held in the reporter's closures: the cell holding its
    # send rewritten. The per-test check of those cells (identity.py) sends through a writer of
    # its own, which the recipe does not reach (one that walked that too would win again).
    Case(
        "forge_closure_cells",
        {"calc.py": f"FORGE = {FORGE!r}\n" + FORGE_CELLS + BUGGY},
        reason="tamper: the trusted reporter's closures rewritten, seen at test_calc_hidden::test_add "
        "(setup)",
    ),
    Case(
        "huge_write",
        {
            "calc.py": (
                "import os\nchunk = b'x' * (8 << 20)\nn = 0\n"
                "try:\n    with open(os.path.join(os.environ['HANGAR_REPO'], 'big.bin'), 'wb') as f:\n"
                "        while n < (2 << 30):\n            f.write(chunk)\n            n += len(chunk)\n"
                "except OSError as err:\n    n = f'stopped at {n >> 20} MiB: {err.strerror}'\n"
                "open(os.environ['HANGAR_GRADE_OUT'], 'w').write(f'huge: {n}\\n')\n" + BUGGY
            )
        },
        log=[r"huge: stopped at 25\d MiB: File too large"],
    ),
    Case(
        "junit_oversized",
        # A well-formed forged report: only its size refuses it (pytest's own follows it).
        {
            "calc.py": "REPORT = "
            + repr(FORGED_JUNIT.replace("</testsuite>", " " * (6 << 20) + "</testsuite>"))
            + "\n"
            + RAW_JUNIT
            + BUGGY
        },
        reason=f"JUnit report larger than {MAX_BYTES} bytes",
    ),
    Case(
        "junit_entities",
        {"calc.py": f"REPORT = {ENTITY_JUNIT!r}\n" + RAW_JUNIT + BUGGY},
        reason="JUnit report declares a DOCTYPE/entities",
    ),
    Case(
        "reach_the_grade_dir",
        {
            "calc.py": (
                "import os\nout = []\nfor d in ('{artifacts}', '{home}'):\n"
                "    try:\n        open(os.path.join(d, 'grade.log'), 'w').write('forged')\n"
                "        out.append(d + ': DONE')\n"
                "    except OSError as err:\n        out.append(f'{d}: {err.strerror}')\n"
                "open(os.environ['HANGAR_GRADE_OUT'], 'w').write('\\n'.join(out))\n" + BUGGY
            )
        },
        log=["artifacts: No such file or directory", r"home\d*: (Permission denied|No such file)"],
        not_in_log=["DONE", "forged"],
    ),
    *STATIC_CASES,
    *COMPARISON_CASES,
    *RUN_TIME_CASES,
]

# The known gap (and forge_closure_cells, one before the per-test checks) no longer forge a clean
# pass: the static pass flags each recipe as it is written (a recipe rewritten to dodge it would
# win clean again).
_GAPS = {c.name: c for c in CASES}
CASES += [
    Case(f"{name}_flagged", _GAPS[name].files, passed=None, signal=signal)
    for name, signal in (
        ("forge_both_streams", "descriptor redirection: os.dup2"),
        ("forge_closure_cells", "writes cell_contents"),
    )
]

# Where each case runs. The sandbox backends (conftest.BACKENDS) differ in how they build the
# mount tree, the uid switch, the network, the process tree and its limits, and the grader's
# pipes (inherited descriptors on bwrap and unshare; on Docker, pipes made by _docker_init whose
# bytes reach the host through files). Everything else a grade decides is the same code on
# every backend, run by the same host interpreter under the same `python -I` (hangar_grade.py),
# with the environment each backend passes exactly (tests/trials/sandbox's
# test_environment_is_exactly_the_request pins that on all three): the static pass, the
# trusted reporter and its run-time checks, the comparison probes, the JUnit parser and the
# cross-checks. A case only those decide runs on the default backend alone; the controls
# (reference passes, empty patch fails) and the base checks still run on every backend.
# test_every_case_has_its_backends fails when a case is in neither list, or in both.
BACKEND_NAMES = ("bwrap", "unshare", "docker")
DEFAULT_BACKEND = "bwrap"
EVERY_BACKEND: dict[str, str] = {
    # filesystem and uid split: read-only root-owned hidden tests, what the grader's uid may reach
    "write_hidden_tests": "writes, renames, chmods the hidden tests: their mount and owner",
    "symlink_into_hidden": "a link into the hidden tests: the mount tree resolves it",
    "reach_the_grade_dir": "the artifacts and HANGAR_HOME must not be in the mount tree",
    "shadowing_so": "a native extension loads from the repo: the workdir's mount options",
    # network
    "network_egress": "a host listener: each backend's network namespace must not reach it",
    # processes and resource limits
    "fork_bomb": "the process-count limit (prlimit --nproc; Docker's pids limit)",
    "infinite_loop": "the wall-clock kill and a detached double-forked child reaped with it",
    "junit_rewrite_detached": "a setsid child outliving the command: the pid namespace ends it",
    "memory_reserve": "the memory limit (RLIMIT_AS; Docker's memory limit)",
    "huge_write": "the file-size limit (prlimit --fsize; in the Docker wrapper)",
    # the grader's pipes and the command's end: how each backend carries pass_fds and exit codes
    "junit_rewrite_at_exit": "opens the JUnit pipe by its path",
    "junit_oversized": "writes past the cap on the JUnit descriptor",
    "junit_entities": "writes raw bytes on the JUnit descriptor",
    "forge_both_streams": "writes both pipes, then dup2s /dev/null over every descriptor on them",
    "os_exit_at_import": "exits before any report: the pipes' end with nothing on them",
    "os_exit_in_atexit": "exit status 0 carried out of the sandbox after a failing run",
    "pytest_exit_zero": "pytest.exit(0) at import: the exit status and the empty report",
    "exit_mid_run": "exits mid-run: the reporter's stream cut short as the backend carries it",
}
DEFAULT_BACKEND_ONLY: tuple[str, ...] = (
    # pytest's configuration and hooks, as the repo ships them: the static pass and the reporter
    "conftest_forces_pass",
    "forged_passed_output",
    "ini_addopts_deselect",
    "pyproject_testpaths",
    "package_init_patches_junit",
    "plugin_registered_at_import",
    # start-up loaders: `python -I -B --check-hash-based-pycs always` decides, with the signal
    "sitecustomize",
    "usercustomize",
    "pth_file",
    "entry_point_plugin",
    "shadowing_pyc",
    # outcomes rewritten in the reporter's own process: its run-time checks
    "skip_when_wrong",
    "xfail_when_wrong",
    "always_equal",
    "caller_frame",
    "dynamic_xfail",
    "replace_test_function",
    "swap_code",
    "forge_send",
    "forge_closure_cells",
    # flagged by the static pass on the patch's text, before anything runs
    "forge_both_streams_flagged",
    "forge_closure_cells_flagged",
    *(c.name for c in STATIC_CASES),
    # the comparison probes and the per-test identity checks, in the reporter's process
    *(c.name for c in COMPARISON_CASES),
    *(c.name for c in RUN_TIME_CASES),
)


def backends_of(case: Case) -> tuple[str, ...]:
    """The backends ``case`` is graded on (EVERY_BACKEND says why)."""
    return BACKEND_NAMES if case.name in EVERY_BACKEND else (DEFAULT_BACKEND,)
