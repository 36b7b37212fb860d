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
- ``call``: for each test function, whether its call returned or raised
  (observed around the test function itself, beneath every report hook);
- ``tamper``: what it saw repo code do, ``fatal`` when that can forge a result
  (pytest internals replaced, hooks registered from the repo, a skip or exit
  raised by repo code, the JUnit or report pipe opened by repo code) and not
  fatal when it is only suspicious (a caller's frame read, the garbage
  collector's objects walked, an ``__eq__`` from the repo called by a test);
- ``end``: the session finished (its exit status).

The grader fails a grade whose JUnit report says ``passed`` for a test this
reporter did not see return, and any grade with a fatal tamper event. Code
under test runs in this process and could still write lines here itself; the
cross-check raises the cost of a lie, it does not make one impossible.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import _pytest.junitxml
import _pytest.outcomes
import _pytest.reports
import _pytest.runner
import pluggy
import pytest

REPORT_ENV = "HANGAR_GRADE_REPORT"
# Hooks through which a plugin can change what is reported or which tests run.
_WATCHED_HOOKS = (
    "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_report_teststatus",
    "pytest_runtest_protocol", "pytest_runtest_call", "pytest_pyfunc_call",
    "pytest_collection_modifyitems", "pytest_collectreport", "pytest_sessionfinish",
    "pytest_terminal_summary", "pytest_deselected", "pytest_runtestloop",
)  # fmt: skip
# Audit events that hand out live objects: pytest's items, reports, the reporter itself.
_GC_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
# Frame objects reached through these attributes let code read its caller's locals.
_FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}
# The ways to name an inherited descriptor as a path.
_FD_PATH = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)(?:/task/\d+)?|dev)/fd/(\d+)$")


def _internals() -> dict[str, object]:
    """The objects a lying plugin would replace, by name."""
    found: dict[str, object] = {
        "runner.call_and_report": _pytest.runner.call_and_report,
        "runner.runtestprotocol": _pytest.runner.runtestprotocol,
        "runner.pytest_runtest_makereport": _pytest.runner.pytest_runtest_makereport,
        "runner.CallInfo.from_call": _pytest.runner.CallInfo.__dict__["from_call"],
        "pluggy.HookCaller.__call__": pluggy.HookCaller.__call__,
        "pluggy.PluginManager._hookexec": pluggy.PluginManager._hookexec,
        "junitxml.mangle_test_address": _pytest.junitxml.mangle_test_address,
        "outcomes.exit": _pytest.outcomes.exit,
    }
    for cls in (_pytest.reports.TestReport, _pytest.reports.BaseReport, _pytest.junitxml.LogXML,
                _pytest.junitxml._NodeReporter):  # fmt: skip
        for name, value in vars(cls).items():
            if not name.startswith("__") or name == "__init__":
                found[f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}.{name}"] = value
    return found


class Reporter:
    def __init__(self, stream: Any, repo: str, private: set[int]) -> None:
        self.stream = stream
        self.repo = repo.rstrip("/") + "/"
        self.private = private  # descriptors repo code must not open: the JUnit and report pipes
        self.snapshot = _internals()
        self.mangle = _pytest.junitxml.mangle_test_address
        self.lock = threading.Lock()
        self.local = threading.local()
        self.seen: set[str] = set()
        self.in_test = False

    def send(self, event: str, **fields: object) -> None:
        line = json.dumps({"event": event, **fields}) + "\n"
        with self.lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):
                pass  # the pipe is gone (closed by the code under test): the grader sees no end

    def tamper(self, what: str, fatal: bool) -> None:
        if what not in self.seen:
            self.seen.add(what)
            self.send("tamper", what=what, fatal=fatal)

    def junit_id(self, nodeid: str) -> str:
        names = self.mangle(nodeid)
        classname = ".".join(names[:-1])
        return f"{classname}::{names[-1]}" if classname else names[-1]

    def repo_frame(self, frame: FrameType | None, depth: int = 1) -> str | None:
        """The repo file of the first ``depth`` frames from ``frame``, if one is the repo's."""
        for _ in range(depth):
            if frame is None:
                return None
            if frame.f_code.co_filename.startswith(self.repo):
                return frame.f_code.co_filename[len(self.repo) :]
            frame = frame.f_back
        return None

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in ("open", "sys._getframe", "object.__getattr__", "sys._current_frames",
                         *_GC_EVENTS):  # fmt: skip
            return
        if getattr(self.local, "busy", False):
            return  # our own sys._getframe below
        self.local.busy = True
        try:
            caller = sys._getframe(1)
            if event == "open":
                fd = _FD_PATH.match(args[0]) if isinstance(args[0], str) else None
                if fd is not None and int(fd.group(1)) in self.private:
                    if where := self.repo_frame(caller, 8):
                        self.tamper(f"repo code opened a grader pipe ({where})", True)
            elif event in _GC_EVENTS:
                if where := self.repo_frame(caller):
                    self.tamper(f"repo code walked the garbage collector ({where})", False)
            elif event != "object.__getattr__" or args[1] in _FRAME_ATTRS:
                if where := self.repo_frame(caller):
                    self.tamper(f"repo code read a frame ({where})", False)
        finally:
            self.local.busy = False

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_name in ("__eq__", "__ne__"):
            if where := self.repo_frame(frame):
                self.tamper(f"a test compared with {frame.f_code.co_name} from {where}", False)

    def check_internals(self, config: pytest.Config) -> None:
        now = _internals()
        changed = sorted(k for k, v in self.snapshot.items() if now.get(k) is not v)
        added = sorted(set(now) - set(self.snapshot))
        if changed or added:
            self.tamper(f"pytest internals replaced: {', '.join(changed + added)}", True)
        for name in _WATCHED_HOOKS:
            for impl in getattr(config.hook, name).get_hookimpls():
                code = getattr(impl.function, "__code__", None)
                if code is not None and code.co_filename.startswith(self.repo):
                    where = code.co_filename[len(self.repo) :]
                    self.tamper(f"hook {name} registered from repo code ({where})", True)


def _open_report() -> Reporter | None:
    path, repo = os.environ.get(REPORT_ENV), os.environ.get("HANGAR_REPO")
    if not path or not repo:
        return None  # not under hangar's grader: nothing to report to
    stream = open(path, "w", encoding="utf-8")  # noqa: SIM115 - kept open for the whole run
    pipes = (_FD_PATH.match(p) for p in (path, os.environ.get("HANGAR_GRADE_JUNIT", "")))
    reporter = Reporter(stream, repo, {int(m.group(1)) for m in pipes if m is not None})
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "CapEff", "NoNewPrivs"):
                status[key] = value.split()[0]
    reporter.send("start", uid=int(status["Uid"]), cap_eff=status["CapEff"],
                  no_new_privs=status["NoNewPrivs"] == "1")  # fmt: skip
    sys.addaudithook(reporter.audit)
    return reporter


_reporter = _open_report()


def pytest_collection_finish(session: pytest.Session) -> None:
    if _reporter is not None:
        ids = [_reporter.junit_id(i.nodeid) for i in session.items]
        xfail = [
            _reporter.junit_id(i.nodeid) for i in session.items if i.get_closest_marker("xfail")
        ]
        _reporter.send("collected", ids=ids, xfail=xfail)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    # Outermost wrapper: it sees the test function's own result, beneath any report hook.
    if _reporter is None:
        return (yield)
    reporter: Reporter = _reporter
    test_id = reporter.junit_id(pyfuncitem.nodeid)
    previous: Callable[..., Any] | None = sys.getprofile()
    sys.setprofile(reporter.profile)
    try:
        result = yield
    except BaseException as exc:
        sys.setprofile(previous)
        if isinstance(exc, _pytest.outcomes.OutcomeException):
            tb = exc.__traceback__
            while tb is not None:
                if where := reporter.repo_frame(tb.tb_frame):
                    kind = type(exc).__name__
                    reporter.tamper(f"repo code raised {kind} ({where})", True)
                    break
                tb = tb.tb_next
        reporter.send("call", id=test_id, raised=type(exc).__name__)
        raise
    sys.setprofile(previous)
    reporter.send("call", id=test_id, raised=None)
    return result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _reporter is not None:
        _reporter.check_internals(session.config)
        _reporter.send("end", exitstatus=int(exitstatus))
