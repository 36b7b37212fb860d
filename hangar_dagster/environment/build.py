"""Environment builds: a task's dependencies, built once per (environment, task base), shared.

A build is ``environment.build`` followed by the task's own ``build`` steps, run in a clone of
the task at its base, in the sandbox backend the trial uses, with network only to the package
mirror (``open_build_egress``: the one network seam). Its result is a virtualenv made from the
base interpreter (``python -m venv``, no system site packages: hangar's own packages never stand
in for the repo's) into which hangar first installs its pinned test runner (pytest at the version
hangar runs), then the steps run with the venv's bin first on PATH and VIRTUAL_ENV set.

Layout, under ``HANGAR_HOME/builds/<key>/`` (``key``: the build digest's first hex digits):
``venv/``, ``repo/`` (the clone the steps ran in), ``build.log``, ``build.json`` (digest,
duration, the files the build left in the repo). The build runs in a temporary directory
mounted in the sandbox at that final path (so every absolute path the build writes, shebangs,
``pyvenv.cfg`` and editable-install finders, names the final place) and is renamed there when
complete: a crash mid-build leaves no half cache, only a temporary directory the next build of
that key removes. A file lock per key makes concurrent trials of one task build once.

Every user of a build (trials, graders, base checks) runs through ``BuiltSandbox``: the venv
mounted read-only at its path, the caller's own clone mounted at the build's repo path as well
(so ``pip install -e .`` resolves to that clone's code), the venv's bin first on PATH.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.metadata
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from hangar_dagster.environment.bytecode import PYCACHE_PREFIX, make_tree, prefix_mounts
from hangar_dagster.environment.bytecode import TREE as BYTECODE_TREE
from hangar_dagster.environment.egress import open_egress
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox import (
    Mount,
    Sandbox,
    SandboxRequest,
    SandboxResult,
    get_sandbox,
)
from hangar_dagster.util.digests import sha256_json
from hangar_dagster.util.fs import remove_tree, write_atomic
from hangar_dagster.util.gitrepo import git, isolated_clone

RUNNER = "pytest"  # the test runner hangar-grade drives, installed first into every build
LOG_LIMIT = 1_000_000  # bytes of each step's stdout and stderr kept in build.log
TAIL_CHARS = 2_000  # of the log kept as a failure's reason
_KEY_CHARS = 24  # hex digits of the build digest naming its directory
_FAILURES = "failures.jsonl"  # per key, beside the build: how each failed attempt ended


class Grant(Protocol):
    """What a build needs of an egress grant (``environment.egress.EgressGrant``)."""

    @property
    def mounts(self) -> tuple[Mount, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def prefix(self) -> tuple[str, ...]: ...


def open_build_egress(log_path: Path, settings: Settings) -> AbstractContextManager[Grant]:
    """The build's only way out: the package mirror (``open_egress("mirror", ...)``).

    The one network seam of a build (tests of build logic put a local wheel index here).
    """
    return open_egress("mirror", log_path, settings)


def runner_requirement() -> str:
    """``pytest==<the version hangar itself runs>``: the grader's runner, pinned."""
    return f"{RUNNER}=={importlib.metadata.version(RUNNER)}"


def base_python() -> Path:
    """The base interpreter (not hangar's venv) a build's venv is made from."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in (version, "python3"):
        candidate = Path(sys.base_prefix) / "bin" / name
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"no {version} under sys.base_prefix {sys.base_prefix}")


def _python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def build_definition(
    environment: Environment, task_steps: Mapping[str, Sequence[str]]
) -> dict[str, Any] | None:
    """What a variant's builds are made of, for its environment digest; None: nothing to build.

    ``task_steps``: each task's own ``build`` steps. Covers the steps, the pinned runner, the
    base interpreter's version, the sandbox backend and the image, so changing any of them is
    a new environment digest (a new pin set).
    """
    tasks = {t: list(s) for t, s in sorted(task_steps.items()) if s}
    if not environment.build and not tasks:
        return None
    return {
        "steps": list(environment.build),
        "tasks": tasks,
        "runner": runner_requirement(),
        "python": _python_version(),
        "sandbox": environment.sandbox,
        "image": environment.image,
    }


@dataclass(frozen=True)
class BuildPlan:
    """One build: what runs (environment steps, then the task's) and on which clone."""

    repo: str
    base_sha: str
    environment_steps: tuple[str, ...]
    task_steps: tuple[str, ...]
    sandbox: str
    image: str | None
    timeout_s: int
    memory_mb: int
    runner: str = field(default_factory=runner_requirement)
    python: str = field(default_factory=_python_version)

    @property
    def steps(self) -> tuple[str, ...]:
        return (*self.environment_steps, *self.task_steps)

    @property
    def digest(self) -> str:
        return "sha256:" + sha256_json(
            {
                "repo": self.repo,
                "base_sha": self.base_sha,
                "steps": list(self.environment_steps),
                "task_steps": list(self.task_steps),
                "runner": self.runner,
                "python": self.python,
                "sandbox": self.sandbox,
                "image": self.image,
            }
        )

    @property
    def key(self) -> str:
        return self.digest.removeprefix("sha256:")[:_KEY_CHARS]


def plan_build(
    environment: Environment, repo: str, base_sha: str, task_steps: Sequence[str] = ()
) -> BuildPlan | None:
    """The build a trial of this task in this environment needs; None when it has no steps."""
    if not environment.build and not task_steps:
        return None
    return BuildPlan(
        repo=repo,
        base_sha=base_sha,
        environment_steps=tuple(environment.build),
        task_steps=tuple(task_steps),
        sandbox=environment.sandbox,
        image=environment.image,
        timeout_s=environment.resources.timeout_s,
        memory_mb=environment.resources.memory_mb,
    )


class BuildFailed(Exception):
    """A build step failed; ``step`` and ``exit_code`` say which and how, ``tail`` the log's end."""

    def __init__(self, step: str, exit_code: int | None, tail: str, log: Path | None = None):
        how = "timed out" if exit_code is None else f"exit {exit_code}"
        super().__init__(f"build step {step!r} failed ({how}): {tail[-500:]}")
        self.step, self.exit_code, self.tail, self.log = step, exit_code, tail, log

    @property
    def signature(self) -> tuple[str, int | None]:
        """What makes two failures 'the same way': the failing step and its exit."""
        return self.step, self.exit_code


class MirrorUnavailable(BuildFailed):
    """The build's way out (the egress proxy, the mirror) could not be opened: infrastructure,
    not the build's steps, so it is never counted among the key's failures (it cannot make a
    task invalid) and a base check that meets it fails for the run to try again."""

    def __init__(self, reason: str):
        super().__init__("(open the package mirror)", None, reason)


@dataclass(frozen=True)
class Built:
    """A complete build in the cache (``root`` = ``builds/<key>``)."""

    root: Path
    digest: str
    duration_s: float  # how long the build itself took, when it ran
    outputs: tuple[str, ...]  # repo-relative paths the build created (copied into each clone)
    ran_now: bool  # this call ran it (False: a cache hit)
    waited_s: float = 0.0  # what this call spent getting it (building, or waiting for a lock)
    # False for the runner environment (environment/runner.py): a venv and no repo of its own.
    has_repo: bool = True

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def log(self) -> Path:
        return self.root / "build.log"

    def mounts(self, clone: Path) -> list[Mount]:
        """The venv read-only at its path, and ``clone`` at the build's repo path (if it has one)."""
        venv = Mount(self.venv, str(self.venv), writable=False)
        return [venv, Mount(clone, str(self.repo), writable=True)] if self.has_repo else [venv]

    def bytecode_mounts(self) -> list[Mount]:
        """The build's bytecode tree (environment/bytecode.py), read-only under the prefix an
        agent's Python runs with: none if the build has no tree."""
        return [Mount(d, at) for d, at in prefix_mounts(self.root / BYTECODE_TREE, self.venv)]

    def copy_outputs(self, clone: Path) -> None:
        """Copy what the build left in its repo (``*.egg-info``, generated files) into ``clone``."""
        if not self.has_repo:
            return
        for rel in self.outputs:
            src, dest = self.repo / rel, clone / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir() and not src.is_symlink():
                shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(src, dest, follow_symlinks=False)

    def sandbox(self, inner: Sandbox, clone: Path, *, venv_first: bool = True) -> BuiltSandbox:
        return BuiltSandbox(inner, self, clone, venv_first=venv_first)


class BuiltSandbox(Sandbox):
    """``inner`` with the build on every request: its mounts, VIRTUAL_ENV, its bin on PATH.

    ``venv_first`` False puts the venv's bin after the first PATH entry (the grader's: its
    own ``hangar-grade`` stays the one found first).
    """

    def __init__(self, inner: Sandbox, built: Built, clone: Path, *, venv_first: bool = True):
        self.inner, self.built, self.clone, self.venv_first = inner, built, clone, venv_first
        self.name = inner.name

    def describe(self) -> dict[str, str]:
        return self.inner.describe()

    def run(self, request: SandboxRequest) -> SandboxResult:
        env = dict(request.env)
        parts = [p for p in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":") if p]
        at = 0 if self.venv_first else min(1, len(parts))
        parts.insert(at, str(self.built.venv / "bin"))
        env["PATH"] = ":".join(parts)
        env["VIRTUAL_ENV"] = str(self.built.venv)
        mounts = [*request.mounts, *self.built.mounts(self.clone)]
        if env.get("PYTHONPYCACHEPREFIX") == PYCACHE_PREFIX:
            mounts += self.built.bytecode_mounts()
        return self.inner.run(replace(request, env=env, mounts=mounts))


# Counts builds this process ran, per key: what the cache tests and the benchmark read.
BUILDS_RUN: dict[str, int] = {}
_COUNT_LOCK = threading.Lock()


def build_root(settings: Settings, plan: BuildPlan) -> Path:
    return settings.paths.builds / plan.key


def cached(settings: Settings, plan: BuildPlan) -> Built | None:
    """The complete build of ``plan`` in the cache, or None."""
    root = build_root(settings, plan)
    try:
        meta = json.loads((root / "build.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("digest") != plan.digest:
        return None
    return Built(
        root=root,
        digest=plan.digest,
        duration_s=float(meta.get("duration_s", 0.0)),
        outputs=tuple(meta.get("outputs", ())),
        ran_now=False,
    )


def failures(settings: Settings, plan: BuildPlan) -> list[dict[str, Any]]:
    """How earlier attempts of this build failed (step, exit_code, tail), oldest first."""
    path = settings.paths.builds / f"{plan.key}.{_FAILURES}"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def repeated_failure(settings: Settings, plan: BuildPlan) -> dict[str, Any] | None:
    """The failure seen twice the same way (same step and exit), if there is one."""
    seen: set[tuple[str, int | None]] = set()
    for f in failures(settings, plan):
        sig = (f["step"], f["exit_code"])
        if sig in seen:
            return f
        seen.add(sig)
    return None


@contextlib.contextmanager
def key_lock(directory: Path, key: str) -> Iterator[None]:
    """One process at a time makes the cache entry ``key`` in ``directory`` (a build, the runner)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{key}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, a crash included
        yield


def ensure_build(
    plan: BuildPlan, settings: Settings, cancel: threading.Event | None = None
) -> Built:
    """The build of ``plan``: from the cache, or run now (once, whoever else asks meanwhile).

    Raises ``BuildFailed`` (recorded in the key's failures) when a step fails.
    """
    started = time.monotonic()
    if (hit := cached(settings, plan)) is not None:
        return replace(hit, waited_s=time.monotonic() - started)
    with key_lock(settings.paths.builds, plan.key):
        if (hit := cached(settings, plan)) is not None:  # built while this call waited
            return replace(hit, waited_s=time.monotonic() - started)
        for stale in settings.paths.builds.glob(f".tmp-{plan.key}-*"):
            remove_tree(stale)  # a build that crashed: never complete, never used
        root = build_root(settings, plan)
        if root.exists():
            remove_tree(root)  # incomplete (no matching build.json)
        built = _run_build(plan, settings, root, cancel)
        return replace(built, waited_s=time.monotonic() - started)


def _step_log(step: str, result: SandboxResult) -> str:
    status = "timed out" if result.timed_out else f"exit {result.exit_code}"
    head = f"$ {step}\n# build: {status} in {result.duration_s:.1f}s\n"
    return f"{head}{result.stdout}{result.stderr}\n"


def _record_failure(settings: Settings, plan: BuildPlan, err: BuildFailed) -> None:
    line = {"step": err.step, "exit_code": err.exit_code, "tail": err.tail[-TAIL_CHARS:]}
    with open(settings.paths.builds / f"{plan.key}.{_FAILURES}", "a") as fh:
        fh.write(json.dumps(line) + "\n")


def _outputs(repo: Path) -> tuple[str, ...]:
    """Files the build created in the repo: untracked and ignored paths, directories whole."""
    out = git("status", "--porcelain", "-z", "--untracked-files=normal", "--ignored", cwd=repo)
    paths = []
    for entry in out.split("\0"):
        if entry[:3] in ("?? ", "!! "):
            paths.append(entry[3:].rstrip("/"))
    return tuple(sorted(p for p in paths if p))


def _run_build(
    plan: BuildPlan, settings: Settings, root: Path, cancel: threading.Event | None
) -> Built:
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{plan.key}-", dir=settings.paths.builds))
    log: list[str] = [f"# build {plan.digest} of {plan.repo} at {plan.base_sha}\n"]
    try:
        isolated_clone(plan.repo, plan.base_sha, tmp / "repo")
        sandbox = get_sandbox(plan.sandbox, image=plan.image, runtime=settings.sandbox_runtime)
        venv, repo = root / "venv", root / "repo"
        # Hangar's own steps first: the venv from the base interpreter, then the pinned runner.
        steps = [
            (f"{shlex.quote(str(base_python()))} -m venv {shlex.quote(str(venv))}", False),
            (f"python -m pip install -q {shlex.quote(plan.runner)}", True),
            *((step, True) for step in plan.steps),
        ]
        with contextlib.ExitStack() as stack:
            try:
                grant = stack.enter_context(open_build_egress(tmp / "egress.jsonl", settings))
            except Exception as exc:  # whatever the egress side raises: the build never ran
                raise MirrorUnavailable(f"{type(exc).__name__}: {exc}") from exc
            for step, in_venv in steps:
                env = {
                    "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                    "HOME": "/tmp",
                    "LANG": "C.UTF-8",
                    "PIP_CONFIG_FILE": os.devnull,  # the host's pip config is not the build's
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                    "PIP_NO_INPUT": "1",
                    "PYTHONDONTWRITEBYTECODE": "1",
                    **({"VIRTUAL_ENV": str(venv)} if in_venv else {}),
                    **grant.env,
                }
                command = f"cd {shlex.quote(str(repo))} && {step}"
                result = sandbox.run(
                    SandboxRequest(
                        argv=[*grant.prefix, "/bin/sh", "-c", command],
                        workdir=tmp,
                        env=env,
                        timeout_s=plan.timeout_s,
                        memory_mb=plan.memory_mb,
                        # At the final path: what the build writes names where it will live.
                        mounts=[*grant.mounts, Mount(tmp, str(root), writable=True)],
                        output_limit=LOG_LIMIT,
                        cancel=cancel,
                    )
                )
                log.append(_step_log(step, result))
                if result.timed_out or result.cancelled or result.exit_code != 0:
                    text = "".join(log)
                    write_atomic(settings.paths.builds / f"{plan.key}.failed.log", text)
                    failed = BuildFailed(
                        step,
                        None if result.timed_out or result.cancelled else result.exit_code,
                        text[-TAIL_CHARS:],
                        settings.paths.builds / f"{plan.key}.failed.log",
                    )
                    if not result.cancelled:  # a drain says nothing about the build
                        _record_failure(settings, plan, failed)
                    raise failed
        duration = time.monotonic() - started
        outputs = _outputs(tmp / "repo")
        # Agents' Pythons run under a cache prefix: the bytecode pip and the interpreter's
        # install made, in the prefix's layout (environment/bytecode.py). A build made before
        # this has none; its agents compile as they did.
        make_tree(tmp / BYTECODE_TREE, tmp / "venv", venv)
        write_atomic(tmp / "build.log", "".join(log))
        meta = {
            "digest": plan.digest,
            "repo": plan.repo,
            "base_sha": plan.base_sha,
            "steps": list(plan.steps),
            "runner": plan.runner,
            "python": plan.python,
            "sandbox": plan.sandbox,
            "duration_s": round(duration, 3),
            "outputs": list(outputs),
        }
        write_atomic(tmp / "build.json", json.dumps(meta, indent=2, sort_keys=True))
        tmp.chmod(0o755)  # the grader's unprivileged uid reads the venv
        os.rename(tmp, root)  # complete, all at once
    finally:
        if tmp.exists():
            remove_tree(tmp)
    with _COUNT_LOCK:
        BUILDS_RUN[plan.key] = BUILDS_RUN.get(plan.key, 0) + 1
    return Built(root, plan.digest, duration, outputs, ran_now=True)
