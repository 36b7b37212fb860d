"""The grader: hidden tests run in a sandbox against a patched clone, and the grade made from them.

One grader run (``run_grader``) is: a fresh clone of the task at its base
SHA, the patch applied, the hidden files written outside the repo (canary
line on top, directory made read-only and mounted read-only), the grader
command run with ``/bin/sh -c`` in the sandbox with no network (``network:
mirror``: only the package mirror, through its egress proxy) and an
environment built from scratch, then the JUnit report read and ``decide``
applied. ``grade_trial`` and ``check_base`` turn runs into stored rows.
docs/grading.md describes the whole path, the trust levels and the seams
left for sealing (uid split, pipes, a trusted reporter).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
import secrets
import shlex
import stat
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from hangar_dagster.environment.build import (
    BuildFailed,
    BuildPlan,
    Built,
    MirrorUnavailable,
    ensure_build,
    plan_build,
    repeated_failure,
)
from hangar_dagster.environment.egress import (
    EgressError,
    EgressGrant,
    Policy,
    egress_lines,
    open_egress,
)
from hangar_dagster.environment.mirror import MirrorError
from hangar_dagster.environment.runner import ensure_runner, grade_bin, runner_top_level
from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.spec import Environment, Grader, hidden_path_problem
from hangar_dagster.grading import provenance
from hangar_dagster.grading.crosscheck import (
    ReporterStream,
    cross_check,
    parse_reporter,
    split_confirmed,
)
from hangar_dagster.grading.junit import MAX_BYTES, JunitResult, parse_junit_bytes, zero_counts
from hangar_dagster.grading.signals import canary_hits, tamper_signals, touched_tests
from hangar_dagster.grading.static import check_read, read_patched
from hangar_dagster.results.records import (
    BaseCheckRecord,
    GradeRecord,
    GradeTestRecord,
    NoteRecord,
    TestOutcome,
    TrialRecord,
    Trust,
)
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.trials.canary import mask
from hangar_dagster.trials.model_proxy import EGRESS_NAME
from hangar_dagster.trials.redact import redact
from hangar_dagster.trials.sandbox import Mount, RunAs, SandboxRequest, SandboxRuntime, get_sandbox
from hangar_dagster.trials.sandbox._common import Capture
from hangar_dagster.util.digests import sha256_json
from hangar_dagster.util.fs import remove_tree, write_atomic
from hangar_dagster.util.gitrepo import GitError, apply_patch, cached_clone, changed_files

Runner = Literal["hangar-grade", "command"]

# Files whose format has comments; the canary goes on top of each. Anything else (.txt, .json,
# .csv, golden outputs, data) is written as given: a line there would change what a test reads.
_HASH_COMMENT = {
    ".py",
    ".pyi",
    ".cfg",
    ".toml",
    ".ini",
    ".sh",
    ".bash",
    ".yaml",
    ".yml",
    ".rb",
    ".pl",
    ".r",
}
_SLASH_COMMENT = {
    ".js",
    ".jsx",
    ".ts",
    ".tsx",
    ".mjs",
    ".cjs",
    ".go",
    ".java",
    ".kt",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".hpp",
    ".rs",
    ".cs",
    ".swift",
    ".scala",
}
# Must stay on the first lines: a shebang, and Python's encoding declaration (PEP 263).
_KEEP_FIRST = re.compile(r"^(#!|#.*coding[:=])")
# Anything but a plain `hangar-grade ...` call: the shell could run something else as well.
_SHELL_META = re.compile(r"[;&|`$<>(){}\n]")
_OUT_CAP = 64 * 1024  # bytes of $HANGAR_GRADE_OUT kept in the output
_REPORT_CAP = 4 * 1024 * 1024  # bytes of the trusted reporter's stream
# The unprivileged uids grader commands run as: a range no account uses.
_UID_BASE, _UID_SPAN = 1_500_000_000, 100_000_000
_MAX_PROCESSES = 256  # processes and threads of one grader run (RLIMIT_NPROC)
_MAX_FILE_MB = 256  # the largest file a grader command can write (RLIMIT_FSIZE)
_ENV_EXTRA = {"HANGAR_TRIAL", "HANGAR_VARIANT"}
_MESSAGE_CHARS = 200  # of a test's failure / skip message kept per test
PRISTINE = "pristine"  # in a grader's work root: one pristine clone per (repo, base SHA)


# The background removers of grades' work dirs while a trials stage's slots run
# (``work_removed_behind``): the innermost block's.
_BEHIND: list[concurrent.futures.ThreadPoolExecutor] = []
_BEHIND_GUARD = threading.Lock()


@contextmanager
def work_removed_behind() -> Iterator[None]:
    """Within the block, a grader run's work dir is removed by a background thread once the
    run is over, not by the thread that graded: a trials stage's slot goes on to store the
    grade and start its next trial (the removal, outside the grader's time, was the largest
    part of a slot's time between trials: docs/performance.md). Every one is removed when the
    block ends; a process that dies first leaves them, as one killed mid-grade does."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hangar-grade-cleanup")
    with _BEHIND_GUARD:
        _BEHIND.append(pool)
    try:
        yield
    finally:
        with _BEHIND_GUARD:
            _BEHIND.remove(pool)
        pool.shutdown(wait=True)


def _remove_work(work: Path) -> None:
    """A grader run's work dir removed: now, or behind (``work_removed_behind``)."""
    with _BEHIND_GUARD:
        if _BEHIND:
            _BEHIND[-1].submit(remove_tree, work)
            return
    remove_tree(work)


def grading_root(paths: HangarPaths) -> Path:
    """Where grades work: each grade's scratch dir, and the pristine clones (``PRISTINE``) that
    grades and trials copy."""
    return paths.work / "grading"


@dataclass(frozen=True)
class HiddenTestResult:
    """One hidden test as the grade stores it (grade_tests): outcome, time, short message."""

    test_id: str
    outcome: TestOutcome
    duration_s: float
    message: str | None  # first line, at most _MESSAGE_CHARS, redacted and canary-masked


@dataclass(frozen=True)
class GraderRun:
    exit_code: int | None
    timed_out: bool
    counts: dict[str, int]
    junit_ok: bool
    reason: str | None
    output: str  # stdout, stderr and $HANGAR_GRADE_OUT, canary masked
    duration_s: float
    passed: bool
    # Paths the patch names that exist at the base commit (for touched_tests).
    base_paths: tuple[str, ...] = ()
    uid_split: bool = False  # the command ran unprivileged, as the trusted reporter confirmed
    # The static pass over the patch, then tamper seen while it ran (reporter, hidden digest).
    run_signals: tuple[str, ...] = ()
    canary_files: int = 0  # hidden files that carry the canary line
    collected: tuple[str, ...] = ()  # test ids the trusted reporter saw collected
    tests: tuple[HiddenTestResult, ...] = ()  # every testcase of the JUnit report
    # Where the tests' modules were loaded from (grading/provenance.py ``table``), and why the
    # grade measured other code than the repo's, when it did.
    provenance: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    provenance_problems: tuple[str, ...] = ()


def _short(message: str | None, canary: str) -> str | None:
    if not message or not message.strip():
        return None
    line = message.strip().splitlines()[0]
    if len(line) > _MESSAGE_CHARS:
        line = line[: _MESSAGE_CHARS - 3] + "..."
    text: str = redact(line, canary)
    return text


def per_test_results(
    junit: JunitResult, stream: ReporterStream | None, canary: str
) -> tuple[HiddenTestResult, ...]:
    """Each testcase with pytest's xfail / xpass told apart from skips and passes.

    JUnit has no xfail outcome: pytest writes an xfailed test as skipped with type
    ``pytest.xfail``, and an xpassed one (not strict) as passed; the reporter's list of tests
    that expected a failure at collection tells the second.
    """
    xfail = stream.xfail if stream is not None else frozenset()
    out: dict[str, HiddenTestResult] = {}
    for d in junit.details:
        outcome: TestOutcome = d.outcome
        if d.outcome == "skipped" and d.result_type == "pytest.xfail":
            outcome = "xfailed"
        elif d.outcome == "passed" and d.test_id in xfail:
            outcome = "xpassed"
        # A duplicated id (a failure of its own, in the cross-check) keeps its first row.
        out.setdefault(d.test_id, HiddenTestResult(d.test_id, outcome, d.time_s, _short(d.message, canary)))  # fmt: skip
    return tuple(out.values())


def hidden_files_for(experiment: ResolvedExperiment, task_id: str) -> dict[str, str]:
    """The grader's shared files with the task's own on top (a task file wins on the same path)."""
    return {**experiment.spec.grader.files, **experiment.tasks[task_id].hidden_files}


def grader_digest(grader: Grader, hidden_files: dict[str, dict[str, str]]) -> str:
    """sha256 over what decides a grade: command, network, files_mode, timeout, hidden files, pythonpath.

    ``hidden_files`` is {task id: {path: content}}; ``grader.files`` are
    covered too. The canary is left out: it is a secret and differs per
    experiment, while the same grader should pin the same digest.
    """
    return "sha256:" + sha256_json(
        {
            "command": grader.command,
            "network": grader.network,
            "files_mode": grader.files_mode,
            "timeout_s": grader.timeout_s,
            "files": grader.files,
            "tasks": hidden_files,
            # Only when set: the digests of graders without it stay what they were.
            **({"pythonpath": grader.pythonpath} if grader.pythonpath else {}),
        }
    )


def grader_runner(command: str) -> Runner:
    """``hangar-grade`` when the command is a plain hangar-grade call, else ``command``."""
    if _SHELL_META.search(command):
        return "command"
    try:
        words = shlex.split(command)
    except ValueError:
        return "command"
    return "hangar-grade" if words and words[0] == "hangar-grade" else "command"


def grade_trust(grader: Grader, uid_split: bool = False) -> Trust:
    """low for files in the repo or a command that isn't hangar-grade; else isolated with the
    uid split, best_effort without it."""
    if grader.files_mode == "in_repo" or grader_runner(grader.command) != "hangar-grade":
        return "low"
    return "isolated" if uid_split else "best_effort"


def decide(exit_code: int | None, timed_out: bool, junit: JunitResult) -> tuple[bool, str | None]:
    """Pass only on exit 0 with a readable report of >=1 passed test and no failure or error.

    The reason says why a grade failed when it is not simply failing tests
    (those give ``(False, None)``). All-skipped runs fail: they show nothing.
    """
    if timed_out:
        return False, "grader timed out"
    if not junit.ok:
        return False, f"no usable JUnit report: {junit.error}"
    c = junit.counts
    if c["total"] == 0:
        return False, "no hidden tests were collected"
    bad = c["failed"] + c["errors"]
    if bad:
        if exit_code == 0:
            return False, f"the command exited 0 but the JUnit report shows {bad} failing test(s)"
        return False, None
    if exit_code != 0:
        return False, f"the command exited {exit_code} though its JUnit report shows no failure"
    if c["passed"] == 0:
        return False, f"all {c['total']} hidden test(s) were skipped"
    return True, None


def with_canary(path: str, content: str, canary: str) -> str:
    """``content`` with a ``canary`` comment line on top, if the file's type takes comments."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in _HASH_COMMENT:
        marker = f"# {canary}\n"
    elif suffix in _SLASH_COMMENT:
        marker = f"// {canary}\n"
    else:
        return content
    lines = content.splitlines(keepends=True)
    keep = 0
    while keep < min(2, len(lines)) and _KEEP_FIRST.match(lines[keep]):
        keep += 1
    if keep and not lines[keep - 1].endswith("\n"):
        lines[keep - 1] += "\n"
    return "".join(lines[:keep]) + marker + "".join(lines[keep:])


def write_hidden_files(dest: Path, files: dict[str, str], canary: str) -> int:
    """Write ``files`` under ``dest`` with the canary line; return how many carry it."""
    marked = 0
    for rel, content in sorted(files.items()):
        if problem := hidden_path_problem(rel):
            raise ValueError(
                f"grader.files / tasks[].hidden_tests: {problem}; rename it in the spec"
            )
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        text = with_canary(rel, content, canary)
        marked += text != content
        target.write_text(text)
    return marked


def _make_read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o555)
    os.chmod(root, 0o555)


def _failed(
    reason: str, started: float, output: str = "", base_paths: tuple[str, ...] = ()
) -> GraderRun:
    return GraderRun(
        exit_code=None, timed_out=False, counts=zero_counts(), junit_ok=False, reason=reason,
        output=output, duration_s=time.monotonic() - started, passed=False, base_paths=base_paths,
    )  # fmt: skip


def _safe_label(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:60] or "run"


def grader_user() -> RunAs | None:
    """A fresh unprivileged uid for one grader run, or None where hangar cannot switch uid.

    Fresh per run, so RLIMIT_NPROC (counted per uid, host-wide) bounds this run
    alone and no two grader runs share a uid.
    """
    if os.geteuid() != 0:
        return None
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
    return RunAs(uid=uid, gid=uid, max_processes=_MAX_PROCESSES, max_file_mb=_MAX_FILE_MB)


def tree_digest(root: Path) -> str:
    """sha256 over every entry under ``root``: path, type, mode, and content or link target."""
    entries: list[list[str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            full = Path(dirpath, name)
            st = full.lstat()
            rel = full.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                body = "link:" + os.readlink(full)
            elif stat.S_ISREG(st.st_mode):
                body = hashlib.sha256(full.read_bytes()).hexdigest()
            else:
                body = "dir" if stat.S_ISDIR(st.st_mode) else "other"
            entries.append([rel, oct(st.st_mode), str(st.st_uid), body])
    return "sha256:" + sha256_json([oct(root.lstat().st_mode), entries])


def _hand_over(repo: Path, uid: int) -> None:
    """Make the patched repo the unprivileged user's (links themselves, never their targets)."""
    os.lchown(repo, uid, uid)
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def _purge_bytecode(repo: Path) -> None:
    """Delete every compiled Python file of the repo: a stale or planted .pyc is never loaded."""
    for dirpath, dirnames, filenames in os.walk(repo):
        if ".git" in dirnames:
            dirnames.remove(".git")
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                os.unlink(os.path.join(dirpath, name))
        if "__pycache__" in dirnames:
            dirnames.remove("__pycache__")
            cache = Path(dirpath, "__pycache__")
            if cache.is_symlink():
                cache.unlink()
            else:
                remove_tree(cache)


class _Pipe:
    """A pipe the grader reads while the command runs; the command gets its write end."""

    def __init__(self, cap: int, uid: int | None) -> None:
        read_end, self.write_end = os.pipe()
        if uid is not None:
            # /proc/self/fd/N reopens the pipe: its inode must be the command's to open.
            os.fchown(self.write_end, uid, uid)
        self.reader = Capture(os.fdopen(read_end, "rb"), cap + 1)
        self.reader.start()

    @property
    def path(self) -> str:
        return f"/proc/self/fd/{self.write_end}"

    def finish(self) -> bytes:
        """Everything read (at most cap + 1 bytes), once every writer is gone."""
        os.close(self.write_end)
        self.reader.join(timeout=30)
        return bytes(self.reader.kept)

    @property
    def total(self) -> int:
        """How many bytes came through, kept or not."""
        return self.reader.total


def run_grader(
    experiment: ResolvedExperiment,
    task_id: str,
    patch: str,
    *,
    label: str,
    work_root: Path,
    env_extra: dict[str, str],
    expected_tests: Collection[str] = (),
    settings: Settings | None = None,
    built: Built | None = None,
) -> GraderRun:
    """Grade ``patch`` (empty for the bare base) on a fresh clone of the task, in the sandbox.

    ``env_extra`` may set HANGAR_TRIAL and HANGAR_VARIANT (defaults: ``label``
    and empty); ``expected_tests`` are test ids the base check collected, each
    of which must be in the report. A patch that does not apply, or a package
    mirror that cannot be reached for ``network: mirror``, is a failed run with
    a reason; a sandbox that cannot be created raises ``SandboxUnavailable``
    (infrastructure, not a grade). ``settings`` (the operator's) say where the
    mirror is; a caller without them gets this process's (``Settings.from_env``).
    ``built``: the task's environment build; without one, the runner environment
    (environment/runner.py). Either way the command runs with that venv mounted and on PATH
    (after a directory holding only ``hangar-grade``), the clone also at the build's repo
    path, and ``$HANGAR_TEST_PYTHON`` naming the venv's python for hangar-grade: hangar's own
    installed packages are never where the tests import from.
    """
    unknown = sorted(set(env_extra) - _ENV_EXTRA)
    if unknown:
        raise ValueError(
            f"run_grader env_extra: {', '.join(unknown)} not allowed; "
            f"only {', '.join(sorted(_ENV_EXTRA))}"
        )
    started = time.monotonic()
    grader = experiment.spec.grader
    settings = settings or Settings.from_env()
    runner_env = ensure_runner(settings)
    work_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"grade-{_safe_label(label)}-", dir=work_root))
    pipes: list[_Pipe] = []
    try:
        # Sealed, or (network: mirror) the read-only package mirror and nothing else.
        policy: Policy = "mirror" if grader.network == "mirror" else "none"
        try:
            with open_egress(policy, work / EGRESS_NAME, settings) as grant:
                return _run_sealed(
                    experiment, task_id, patch, label, env_extra, expected_tests, started,
                    work, pipes, grant, built or runner_env, runner_env,
                    settings.sandbox_runtime,
                )  # fmt: skip
        except (MirrorError, EgressError) as err:
            return _failed(f"grader network mirror: {err}", started)
    finally:
        for p in pipes:
            p.finish()
        _remove_work(work)


def _run_sealed(
    experiment: ResolvedExperiment,
    task_id: str,
    patch: str,
    label: str,
    env_extra: dict[str, str],
    expected_tests: Collection[str],
    started: float,
    work: Path,
    pipes: list[_Pipe],
    grant: EgressGrant,
    built: Built,
    runner_env: Built,
    runtime: SandboxRuntime,
) -> GraderRun:
    """``run_grader`` in its work dir with its way out (``grant``); ``pipes`` are closed by it."""
    grader = experiment.spec.grader
    task = experiment.tasks[task_id]
    canary = experiment.canary
    repo, hidden = work / "repo", work / "hidden"
    # A copy of the task's pristine clone, kept beside the grades' work dirs (never mounted).
    tracked = cached_clone(task.repo, task.base_sha, repo, work.parent / PRISTINE)
    # The repo's own modules, from the base tree: a patch deleting one leaves it the repo's.
    own_modules = provenance.repo_modules(tracked, grader.pythonpath)
    base_paths = tuple(p for p in changed_files(patch) if os.path.lexists(repo / p))
    try:
        apply_patch(repo, patch)
    except GitError as err:
        return _failed(
            f"patch does not apply: {mask(str(err), canary)}", started, base_paths=base_paths
        )
    built.copy_outputs(repo)  # what the build left in its repo (*.egg-info)
    _purge_bytecode(repo)
    # Read before any code of the patch runs; checked on another thread while the tests run.
    static_read = read_patched(repo, patch)
    static_pass = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="static-pass")
    static_checked = static_pass.submit(check_read, static_read)
    static_pass.shutdown(wait=False)
    files = hidden_files_for(experiment, task_id)
    mounts: list[Mount] = []
    hidden_digest: str | None = None
    if grader.files_mode == "hidden":
        hidden.mkdir()
        canary_files = write_hidden_files(hidden, files, canary)
        _make_read_only(hidden)
        hidden_digest = tree_digest(hidden)
        mounts.append(Mount(hidden, str(hidden), writable=False))
        hidden_dir = hidden
    else:
        # The old layout: the files sit in the repo, where the patch's code can change them.
        canary_files = write_hidden_files(repo, files, canary)
        hidden_dir = repo
    run_as = grader_user()
    if run_as is not None:
        _hand_over(repo, run_as.uid)
    uid = run_as.uid if run_as else None
    pipes[:] = [_Pipe(_OUT_CAP, uid), _Pipe(MAX_BYTES, uid), _Pipe(_REPORT_CAP, uid)]
    grade_out, junit_pipe, report_pipe = pipes
    env = {
        "HANGAR_HIDDEN_TESTS": str(hidden_dir),
        "HANGAR_REPO": str(repo),
        "HANGAR_GRADE_OUT": grade_out.path,
        "HANGAR_GRADE_JUNIT": junit_pipe.path,
        "HANGAR_GRADE_REPORT": report_pipe.path,
        "HANGAR_TRIAL": label,
        "HANGAR_TASK": task_id,
        "HANGAR_VARIANT": "",
        "HANGAR_EXPERIMENT": experiment.experiment_id,
        # The repo's import roots (relative to it): hangar-grade puts them first on sys.path.
        "HANGAR_PYTHONPATH": ":".join(grader.pythonpath),
        "HANGAR_REPO_MODULES": ":".join(own_modules),
        **env_extra,
        **grant.env,
        # hangar-grade (alone in its directory) first, then the test environment's bin
        # (inserted by the built sandbox): `python` and `pytest` are the test environment's.
        "PATH": f"{grade_bin(runner_env)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
    }
    environment = experiment.spec.environment
    labels = {"hangar.experiment": experiment.experiment_id, "hangar.grade": label}
    sandbox = get_sandbox(
        environment.sandbox, image=environment.image, labels=labels, runtime=runtime
    )
    env["HANGAR_TEST_PYTHON"] = str(built.python)
    # After grade-bin: the `hangar-grade` found first stays hangar's own.
    sandbox = built.sandbox(sandbox, repo, venv_first=False)
    mounts.append(Mount(grade_bin(runner_env), str(grade_bin(runner_env)), writable=False))
    result = sandbox.run(
        SandboxRequest(
            argv=grant.wrap(["/bin/sh", "-c", grader.command]),
            workdir=repo,
            env=env,
            timeout_s=grader.timeout_s,
            memory_mb=experiment.spec.environment.resources.memory_mb,
            mounts=[*mounts, *grant.mounts],
            network=False,
            run_as=run_as,
            pass_fds=tuple(p.write_end for p in pipes),
        )
    )
    # Every process of the sandbox is gone: what the pipes hold now is all there is.
    extra, junit_bytes, report_bytes = (p.finish() for p in pipes)
    pipes.clear()
    junit = parse_junit_bytes(junit_bytes, "$HANGAR_GRADE_JUNIT", junit_pipe.total)
    if not junit_bytes:
        junit = JunitResult(False, "no JUnit report was written to $HANGAR_GRADE_JUNIT")
    passed, reason = decide(result.exit_code, result.timed_out, junit)
    runner = grader_runner(grader.command)
    stream = parse_reporter(report_bytes) if report_bytes or runner == "hangar-grade" else None
    problems, signals = cross_check(junit, stream, expected_tests, result.timed_out)
    signals = [*static_checked.result(), *signals]
    where: dict[str, dict[str, str]] = {}
    misplaced: list[str] = []
    if stream is not None and stream.modules is not None:
        places = provenance.Places(
            repos=(str(repo), *((str(built.repo),) if built.has_repo else ())),
            hidden=str(hidden_dir),
            venv=str(built.venv),
            runner_top_level=frozenset(runner_top_level(runner_env)),
            hangar=str(Path(provenance.__file__).resolve().parents[1]),
        )
        where = provenance.table(stream.modules, places)
        misplaced = provenance.violations(stream.modules, own_modules, places, str(repo))
        problems.extend(misplaced)
    if len(report_bytes) > _REPORT_CAP:
        problems.append("the trusted reporter's stream is over its size cap")
    if hidden_digest is not None and tree_digest(hidden) != hidden_digest:
        problems.append("the hidden tests' digest changed during the run")
        signals.append("run: hidden tests' digest changed")
    if problems:
        passed = False
        reason = "; ".join([*([reason] if reason else []), *problems])
    uid_split = stream is not None and split_confirmed(stream, run_as)
    parts = [result.stdout]
    if result.stderr:
        parts.append(f"--- stderr ---\n{result.stderr}")
    if extra:
        text = extra[:_OUT_CAP].decode("utf-8", errors="replace")
        parts.append(f"--- $HANGAR_GRADE_OUT ---\n{text}")
    if grant.policy != "none":
        log = work / EGRESS_NAME  # written at the first request: none made, no file
        lines = egress_lines(log.read_text(errors="replace")) if log.exists() else []
        refused = [f"{e.get('method')} {e.get('host')}:{e.get('port')}" for e in lines
                   if e.get("verdict") == "refused"]  # fmt: skip
        parts.append(
            f"--- egress ({grant.policy}) ---\n{len(lines) - len(refused)} allowed, "
            f"{len(refused)} refused" + "".join(f"\nrefused: {r}" for r in refused[:20])
        )
    parts.append(
        f"--- hangar ---\nexit: {result.exit_code} timed_out: {result.timed_out} "
        f"tests: {json.dumps(junit.counts)} passed: {passed} reason: {reason} "
        f"canary_files: {canary_files} uid_split: {uid_split} "
        f"signals: {json.dumps(signals)}\n"
    )
    return GraderRun(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        counts=junit.counts,
        junit_ok=junit.ok,
        reason=mask(reason, canary),
        output=mask("\n".join(parts), canary),
        duration_s=time.monotonic() - started,
        passed=passed,
        base_paths=base_paths,
        uid_split=uid_split,
        run_signals=tuple(mask(signals, canary)),
        canary_files=canary_files,
        collected=tuple(stream.collected or ()) if stream is not None else (),
        tests=per_test_results(junit, stream, canary),
        provenance=where,
        provenance_problems=tuple(mask(misplaced, canary)),
    )


def _contamination_texts(trial: TrialRecord, patch: str) -> dict[str, str]:
    texts = {"patch": patch, "trace": json.dumps(trial.trace)}
    art = Path(trial.artifacts_dir)
    if art.is_dir():
        for found in [art / "trace.json", *sorted(art.rglob("RESULT.md"))]:
            if found.is_file():
                texts[found.relative_to(art).as_posix()] = found.read_text(errors="replace")
    return texts


def build_settings(paths: HangarPaths, settings: Settings | None) -> Settings:
    """The settings a build runs under: the caller's, or (a caller that passed none) the
    defaults for ``paths``' home."""
    if settings is None:
        return Settings.from_env({"HANGAR_HOME": str(paths.home)})
    return (
        settings if settings.home == paths.home else dataclasses.replace(settings, home=paths.home)
    )


def task_build(
    experiment: ResolvedExperiment, task_id: str, environment: Environment | None = None
) -> BuildPlan | None:
    """The build a grader run of ``task_id`` uses: the variant's environment (default: the
    experiment's), then the task's own steps; None when there is nothing to build."""
    task = experiment.tasks[task_id]
    env = environment or experiment.spec.environment
    return plan_build(env, task.repo, task.base_sha, task.build)


def check_environment(experiment: ResolvedExperiment, task_id: str) -> Environment:
    """The environment a base check of ``task_id`` builds and grades in: the experiment's, or,
    when only variants set a build, the first (by name) of those that run the task."""
    own = experiment.spec.environment
    if own.build:
        return own
    for _, variant in sorted(experiment.variants.items()):
        if task_id in variant.tasks and variant.environment.build:
            return variant.environment
    return own


def grader_run(
    experiment: ResolvedExperiment,
    trial: TrialRecord,
    patch: str,
    base_check: BaseCheckRecord | None,
    paths: HangarPaths,
    settings: Settings | None = None,
) -> GraderRun:
    """The grader's run on one trial attempt's patch (none for an infra error: a placeholder)."""
    if trial.outcome_class == "infra_error":
        return GraderRun(
            exit_code=None, timed_out=False, counts=zero_counts(), junit_ok=False,
            reason=f"not graded: infra_error ({trial.infra_reason or 'no reason recorded'})",
            output="", duration_s=0.0, passed=False,
        )  # fmt: skip
    variant = experiment.variants.get(trial.variant)
    plan = task_build(experiment, trial.task, variant.environment if variant else None)
    built: Built | None = None
    if plan is not None:
        try:  # a cache hit, normally: the base check or the trial built it
            built = ensure_build(plan, build_settings(paths, settings))
        except MirrorUnavailable:
            raise  # infrastructure: no grade is stored, the next grades run tries again
        except BuildFailed as failed:
            return GraderRun(
                exit_code=None, timed_out=False, counts=zero_counts(), junit_ok=False,
                reason=mask(f"environment build failed: {failed}", experiment.canary),
                output=mask(failed.tail, experiment.canary), duration_s=0.0, passed=False,
            )  # fmt: skip
    return run_grader(
        experiment,
        trial.task,
        patch,
        label=trial.trial_key,
        work_root=grading_root(paths),
        env_extra={"HANGAR_TRIAL": trial.trial_key, "HANGAR_VARIANT": trial.variant},
        expected_tests=base_check.expected_tests if base_check is not None else (),
        built=built,
        settings=build_settings(paths, settings),
    )


def grade_trial(
    experiment: ResolvedExperiment,
    trial: TrialRecord,
    patch: str,
    base_check: BaseCheckRecord | None,
    run_id: str,
    paths: HangarPaths,
    settings: Settings | None = None,
    run: GraderRun | None = None,
) -> GradeRecord:
    """Grade one trial attempt, and save the grader's output as ``grade.log`` in its artifacts.

    A trial that ended as ``infra_error`` is not run (it is excluded and
    retried): its grade fails with reason ``not graded: infra_error (...)``,
    while the patch signals and canary search still apply. ``base_check``
    None means the task was not checked: ``task_invalid`` is then False. ``run``: the grader's
    run of this very patch already made (a regrade grades each distinct patch once,
    grading/stage.py); this attempt's own signals and canary search still apply.
    """
    grader = experiment.spec.grader
    if run is None:
        run = grader_run(experiment, trial, patch, base_check, paths, settings)
    if trial.outcome_class != "infra_error":
        write_atomic(Path(trial.artifacts_dir) / "grade.log", run.output)
    grade = GradeRecord(
        experiment_id=experiment.experiment_id,
        trial_key=trial.trial_key,
        variant=trial.variant,
        task=trial.task,
        replicate=trial.replicate,
        attempt=trial.attempt,
        run_id=run_id,
        graded_at=dt.datetime.now(dt.UTC),
        passed=run.passed,
        hidden_tests=run.counts,
        exit_code=run.exit_code,
        reason=run.reason,
        trust=grade_trust(grader, run.uid_split),
        files_mode=grader.files_mode,
        network=grader.network,
        runner=grader_runner(grader.command),
        tamper_signals=[*tamper_signals(patch), *run.run_signals],
        touched_tests=touched_tests(patch, run.base_paths),
        # The trial searched its own outputs before masking them; the grader adds what it can see.
        contamination=sorted(
            set(trial.trace.get("canary_seen_in", []))
            | set(canary_hits(_contamination_texts(trial, patch), experiment.canary))
        ),
        task_invalid=base_check.invalid if base_check is not None else False,
        grader_digest=experiment.grader_digest,
        duration_s=run.duration_s,
        canary_files=run.canary_files,
        provenance=run.provenance,
        # a regrade's grade names the one it replaces (experiment/regrade.py)
        regrade_of=experiment.reuse.regrade_of.get(trial.trial_key) if experiment.reuse else None,
    )
    base = base_check.base_outcomes if base_check is not None else None
    return grade.with_tests([grade_test(grade, t, (base or {}).get(t.test_id)) for t in run.tests])


def grade_test(grade: GradeRecord, test: HiddenTestResult, on_base: str | None) -> GradeTestRecord:
    """The grade_tests row of one test; ``on_base`` is its outcome on the base check, if run."""
    kind = {"failed": "fail_to_pass", "error": "fail_to_pass", "passed": "pass_to_pass",
            "xpassed": "pass_to_pass"}.get(on_base or "")  # fmt: skip
    return GradeTestRecord(
        experiment_id=grade.experiment_id, trial_key=grade.trial_key, variant=grade.variant,
        task=grade.task, replicate=grade.replicate, attempt=grade.attempt, test_id=test.test_id,
        outcome=test.outcome, duration_s=test.duration_s, message=test.message,
        on_base="fail_to_pass" if kind == "fail_to_pass" else "pass_to_pass" if kind else None,
    )  # fmt: skip


def contamination_notes(grade: GradeRecord) -> list[NoteRecord]:
    """For a grade whose trial leaked the canary: the experiment note and the audit entry."""
    if not grade.contamination:
        return []
    where = ", ".join(grade.contamination)
    who = f"trial {grade.trial_key} attempt {grade.attempt}"
    return [
        NoteRecord(
            experiment_id=grade.experiment_id,
            kind="contamination",
            message=f"{who} is contaminated: the grader's canary was seen in {where}",
        ),
        NoteRecord(
            experiment_id=grade.experiment_id,
            kind="audit",
            message=f"grade.canary_seen: {who} (run {grade.run_id}): {where}",
        ),
    ]


def base_check_log(paths: HangarPaths, experiment_id: str, task_id: str) -> Path:
    """Where a base check keeps its grader output (beside the trials' artifacts, canary masked)."""
    # Variant names start with a letter or digit, so this never meets a trial's directory.
    return paths.artifacts / experiment_id / "_base_checks" / f"{task_id}.log"


def _failing(counts: dict[str, int]) -> str:
    return f"{counts['failed']} failed, {counts['errors']} error(s) of {counts['total']}"


BUILD_ATTEMPTS = 3  # a base check's tries at a failing build before it gives up


def _build_for_check(plan: BuildPlan, settings: Settings) -> tuple[Built | None, str | None]:
    """The build, or why the task is invalid: it failed the same way twice (same step and
    exit), or ``BUILD_ATTEMPTS`` times; the reason ends with the log's tail."""
    last: BuildFailed | None = None
    for _ in range(BUILD_ATTEMPTS):
        try:
            return ensure_build(plan, settings), None
        except MirrorUnavailable:
            raise  # infrastructure: the check is not stored, the next run checks again
        except BuildFailed as err:
            last = err
            if (same := repeated_failure(settings, plan)) is not None:
                how = "timed out" if same["exit_code"] is None else f"exit {same['exit_code']}"
                return None, (
                    f"environment build fails the same way twice: step {same['step']!r} "
                    f"({how}); log tail:\n{same['tail']}"
                )
    assert last is not None
    return None, f"environment build failed {BUILD_ATTEMPTS} times; last: {last}\n{last.tail}"


def check_base(
    experiment: ResolvedExperiment,
    task_id: str,
    run_id: str,
    paths: HangarPaths,
    settings: Settings | None = None,
) -> BaseCheckRecord:
    """Base must fail: the hidden tests on the unpatched base, and on the reference patch if given.

    Invalid when they pass on base, collect nothing there, or fail on the
    reference patch; ``reason`` lists every cause. With an environment build, the build runs
    first (this is where builds normally happen, before any trial starts); a build that fails
    the same way twice makes the task invalid with the build log's tail as the reason. A
    mirror that cannot be opened raises ``MirrorUnavailable`` (nothing is stored).
    """
    task = experiment.tasks[task_id]
    work_root = grading_root(paths)
    env = {"HANGAR_TRIAL": f"base-check/{task_id}"}
    built: Built | None = None
    build_log = ""
    plan = task_build(experiment, task_id, check_environment(experiment, task_id))
    if plan is not None:
        built, invalid = _build_for_check(plan, build_settings(paths, settings))
        if built is None:
            reason = mask(invalid or "environment build failed", experiment.canary)
            write_atomic(
                base_check_log(paths, experiment.experiment_id, task_id),
                f"=== build ({plan.digest}) ===\n{reason}\n",
            )
            return BaseCheckRecord(
                experiment_id=experiment.experiment_id, task=task_id, base_sha=task.base_sha,
                grader_digest=experiment.grader_digest, base_passed=False,
                base_counts=zero_counts(), reference_given=task.reference_patch is not None,
                reference_passed=None, reference_counts=None, invalid=True, reason=reason,
                checked_at=dt.datetime.now(dt.UTC), run_id=run_id, build_digest=plan.digest,
            )  # fmt: skip
        build_log = (
            f"=== build ({plan.digest}, {built.duration_s:.1f}s"
            f"{', cached' if not built.ran_now else ''}) ===\n"
            f"{built.log.read_text(errors='replace')}\n"
        )
    grade_settings = build_settings(paths, settings)
    base = run_grader(
        experiment, task_id, "", label=f"base-{task_id}", work_root=work_root, env_extra=env,
        settings=grade_settings,
        built=built,
    )  # fmt: skip
    reasons: list[str] = []
    if base.passed:
        reasons.append("hidden tests pass on base")
    elif base.counts["total"] == 0:
        reasons.append(f"no hidden tests were collected on base ({base.reason})")
    ref: GraderRun | None = None
    if task.reference_patch is not None:
        ref = run_grader(
            experiment, task_id, task.reference_patch,
            label=f"reference-{task_id}", work_root=work_root, env_extra=env,
            settings=grade_settings, built=built,
        )  # fmt: skip
        if not ref.passed:
            reasons.append(
                f"hidden tests fail on reference_patch ({ref.reason or _failing(ref.counts)})"
            )
    misplaced = [*base.provenance_problems, *(ref.provenance_problems if ref else ())]
    if misplaced:
        # Not a verdict on the task: the grade would have measured another copy of its code.
        reasons = [f"grading setup: {misplaced[0]} (the task itself was not judged)"]
    log = f"{mask(build_log, experiment.canary)}=== base ({task.base_sha}) ===\n{base.output}"
    if ref is not None:
        log += f"\n=== reference_patch ===\n{ref.output}"
    write_atomic(base_check_log(paths, experiment.experiment_id, task_id), log)
    return BaseCheckRecord(
        experiment_id=experiment.experiment_id,
        task=task_id,
        base_sha=task.base_sha,
        grader_digest=experiment.grader_digest,
        base_passed=base.passed,
        base_counts=base.counts,
        reference_given=ref is not None,
        reference_passed=ref.passed if ref is not None else None,
        reference_counts=ref.counts if ref is not None else None,
        invalid=bool(reasons),
        reason="; ".join(reasons) or None,
        checked_at=dt.datetime.now(dt.UTC),
        run_id=run_id,
        # What every trial's report must name: collected on base or on the reference patch.
        expected_tests=sorted({*base.collected, *(ref.collected if ref is not None else ())}),
        base_outcomes={t.test_id: t.outcome for t in base.tests},
        build_digest=plan.digest if plan is not None else None,
        build_s=round(built.duration_s if built.ran_now else 0.0, 3) if built else None,
        provenance=base.provenance,
        setup_error=bool(misplaced),
    )
