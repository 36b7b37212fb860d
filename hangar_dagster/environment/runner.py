"""The runner environment: the pinned test runner in a venv of its own, for tasks without a build.

Hidden tests, verify and the agent's commands must never run with hangar's own virtualenv:
it holds a hundred packages (``packaging``, ``attrs``, ``six``, ``pyyaml``, ...) that would stand
in for a repo's package of the same name, or for one of its dependencies at another version
(docs/grading.md, "Whose code is measured"). A task with an environment build gets its own venv
(``environment/build.py``); every other task gets this one: a venv made from the base
interpreter (``python -m venv --without-pip``: no system or hangar site-packages) holding only
the distributions of the test runner hangar drives (pytest and what it requires, at the
versions hangar itself runs), copied from hangar's environment file by file from their
``RECORD``. No network, no pip: it is made on the host in well under a second, once per home
and runner digest, complete-or-absent like a build (``builds/runner-<key>/``).

It is handed around as a ``Built`` without a repo, so trials, graders and base checks use it
exactly as they use a build (``Built.sandbox``).
"""

from __future__ import annotations

import compileall
import functools
import importlib.metadata
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement

from hangar_dagster.environment.build import RUNNER, Built, base_python, key_lock
from hangar_dagster.environment.bytecode import TREE, make_tree, site_packages
from hangar_dagster.settings import Settings
from hangar_dagster.util.digests import sha256_json
from hangar_dagster.util.fs import remove_tree, write_atomic

_KEY_CHARS = 24
# Console scripts the runner's distributions declare that are written into the venv's bin.
_SCRIPTS = ("pytest", "py.test")
HANGAR_GRADE = Path(__file__).resolve().parents[1] / "grading" / "hangar_grade.py"
GRADE_BIN = "grade-bin"  # in the runner's root: a directory holding only `hangar-grade`


def runner_distributions(root: str = RUNNER) -> dict[str, str]:
    """``{distribution: version}`` of ``root`` and everything it requires here, recursively.

    Requirements are evaluated for this interpreter and platform without extras, as pip would
    have installed them.
    """
    found: dict[str, str] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        dist = importlib.metadata.distribution(name)
        canonical = dist.metadata["Name"]
        if canonical in found:
            continue
        found[canonical] = dist.version
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dict(sorted(found.items()))


@functools.cache
def runner_definition() -> dict[str, object]:
    """What the runner environment is made of: its digest covers these."""
    return {
        "distributions": runner_distributions(),
        "python": ".".join(map(str, sys.version_info[:3])),
        "base_python": str(base_python()),
        # grade-bin's hangar-grade points into hangar's own environment
        "hangar": str(Path(sys.prefix)),
        # The runner's bytecode is compiled when it is made (checked-hash pycs), and
        # grade-bin's hangar-grade runs this file with -I -S (``grade_script``); 3: with the
        # bytecode tree an agent's Python reads under its cache prefix (environment/bytecode.py).
        "layout": 3,
        "hangar_grade": str(HANGAR_GRADE),
    }


@functools.cache
def runner_digest() -> str:
    return "sha256:" + sha256_json(runner_definition())


def install_runner(venv: Path, final: Path | None = None) -> list[str]:
    """Copy the runner's distributions into ``venv`` (its site-packages and its pytest scripts).

    Only the files each distribution's RECORD lists inside site-packages (no bytecode), then
    compiled here, once: every grade runs pytest with ``-B`` from a read-only venv, so without
    bytecode each one compiled pytest afresh (docs/performance.md). The pycs are
    checked-hash (validated against their source at every import, like the flag hangar-grade
    passes) and name ``final`` (the venv's final place; default ``venv``) in tracebacks. The
    console scripts are written anew for ``venv``'s python. Returns the top-level names
    installed (what provenance calls "the pinned test runner").
    """
    dest = site_packages(venv)
    tops: set[str] = set()
    for name in runner_distributions():
        dist = importlib.metadata.distribution(name)
        base = Path(str(dist.locate_file(""))).resolve()
        for entry in dist.files or ():
            rel = Path(str(entry))
            if ".." in rel.parts or rel.suffix == ".pyc" or "__pycache__" in rel.parts:
                continue  # bin/ scripts (written below) and bytecode
            src = base / rel
            if not src.is_file():
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, target)  # the same bytes: a link where one filesystem holds both
            except OSError:
                shutil.copy2(src, target)
            top = rel.parts[0]
            if not top.endswith((".dist-info", ".pth")):
                tops.add(top.removesuffix(".py"))
    compileall.compile_dir(
        dest, quiet=2, ddir=site_packages(final or venv),
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )  # fmt: skip
    python = venv / "bin" / "python"
    for script in _SCRIPTS:
        path = venv / "bin" / script
        path.write_text(
            f"#!{python}\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n"
        )
        path.chmod(0o755)
    return sorted(tops)


def grade_script() -> str:
    """grade-bin's ``hangar-grade``: ``grading/hangar_grade.py`` run by path with ``-I -S``.

    Not hangar's console script: that imports the ``hangar_dagster`` package (pydantic and
    all) in every grade, while hangar_grade.py needs only the standard library. ``-I -S``: no
    PYTHON* variables, user site or site-packages reach it.
    """
    # compile + exec rather than runpy.run_path: runpy's imports cost more than the script.
    return (
        f"#!{sys.executable} -IS\n"
        f"path = {str(HANGAR_GRADE)!r}\n"
        "with open(path, 'rb') as f:\n"
        "    code = compile(f.read(), path, 'exec')\n"
        "exec(code, {'__name__': '__main__', '__file__': path, '__builtins__': __builtins__})\n"
    )


def runner_root(settings: Settings) -> Path:
    """``builds/runner-<key>`` of the home, or under ``HANGAR_RUNNER_DIR`` (shared by homes)."""
    base = Path(settings.runner_dir) if settings.runner_dir else settings.paths.builds
    return base / f"runner-{runner_digest().removeprefix('sha256:')[:_KEY_CHARS]}"


def _cached(root: Path, digest: str) -> Built | None:
    try:
        meta = json.loads((root / "build.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("digest") != digest:
        return None
    return Built(
        root, digest, float(meta.get("duration_s", 0.0)), (), ran_now=False, has_repo=False
    )


def ensure_runner(settings: Settings) -> Built:
    """The runner environment of this home: from the cache, or made now (once, under a lock)."""
    started = time.monotonic()
    digest, root = runner_digest(), runner_root(settings)
    if (hit := _cached(root, digest)) is not None:
        return hit
    with key_lock(root.parent, root.name):
        if (hit := _cached(root, digest)) is not None:
            return hit
        for stale in root.parent.glob(f".tmp-{root.name}-*"):
            remove_tree(stale)
        if root.exists():
            remove_tree(root)  # incomplete: no matching build.json
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{root.name}-", dir=root.parent))
        try:
            venv = tmp / "venv"
            subprocess.run(
                [str(base_python()), "-I", "-m", "venv", "--without-pip", str(venv)],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            tops = install_runner(venv, root / "venv")
            # Agents' Pythons run under a cache prefix: give them this bytecode there too.
            make_tree(tmp / TREE, venv, root / "venv")
            # hangar-grade alone: the grader's PATH starts here, so `python` and `pytest` are
            # the test environment's, and hangar's wrapper is found first by its own name.
            (tmp / GRADE_BIN).mkdir()
            grade = tmp / GRADE_BIN / "hangar-grade"
            grade.write_text(grade_script())
            grade.chmod(0o755)
            # The scripts name the final place of the venv, not the temporary one.
            for script in _SCRIPTS:
                path = venv / "bin" / script
                path.write_text(path.read_text().replace(str(tmp), str(root), 1))
            meta = {
                "digest": digest,
                "kind": "runner",
                **runner_definition(),
                "top_level": tops,
                "duration_s": round(time.monotonic() - started, 3),
            }
            write_atomic(tmp / "build.json", json.dumps(meta, indent=2, sort_keys=True))
            write_atomic(tmp / "build.log", f"# runner environment {digest}\n{json.dumps(meta)}\n")
            for dirpath, _, _ in os.walk(tmp):
                os.chmod(dirpath, 0o755)  # the grader's unprivileged uid reads the venv
            os.rename(tmp, root)
        finally:
            if tmp.exists():
                remove_tree(tmp)
    built = _cached(root, digest)
    assert built is not None, f"runner environment at {root} vanished after it was made"
    return Built(root, digest, built.duration_s, (), ran_now=True, has_repo=False)


def grade_bin(runner: Built) -> Path:
    """The directory holding only ``hangar-grade`` (a link to hangar's own), for the grader's PATH."""
    return runner.root / GRADE_BIN


def runner_top_level(built: Built) -> list[str]:
    """The top-level modules of the runner's distributions in ``built`` (a runner env or a build)."""
    try:
        return list(json.loads((built.root / "build.json").read_text()).get("top_level", []))
    except (OSError, ValueError):
        return []
