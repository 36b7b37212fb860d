"""Environment builds for real: bwrap sandboxes, real venvs, real pip (from a local wheel index,
``tests/buildfixtures.py``; the mirror's own tests are in test_build_mirror.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangar_dagster.environment import build
from hangar_dagster.environment.build import (
    BuildFailed,
    BuildPlan,
    MirrorUnavailable,
    ensure_build,
    plan_build,
)
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox import SandboxRequest, get_sandbox
from hangar_dagster.util.gitrepo import git, isolated_clone
from tests.buildfixtures import LocalIndexGrant, semver_repo, wheelhouse
from tests.conftest import CORPUS
from tests.gitfixtures import Upstream

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

WHERE = (
    'echo "$VIRTUAL_ENV" > where.txt && command -v python >> where.txt && '
    "python -c 'import pytest; print(pytest.__version__)' >> where.txt"
)


def plan_for(repo: Path, sha: str, *steps: str, task_steps: tuple[str, ...] = ()) -> BuildPlan:
    plan = plan_build(Environment(build=list(steps)), str(repo), sha, task_steps)
    assert plan is not None
    return plan


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The local wheel index in place of the mirror, for the whole module."""
    wheels = wheelhouse(tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "open_build_egress", lambda log, s: _grant(wheels))
        yield wheels


def _grant(wheels: Path) -> object:
    import contextlib

    return contextlib.nullcontext(LocalIndexGrant.of(wheels))


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return Upstream(tmp_path_factory.mktemp("up"))


@pytest.fixture(scope="module")
def concurrent(
    index: Path, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Settings, BuildPlan, list[build.Built]]:
    """Three callers asking for one build at once (as three trials of one task do)."""
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path_factory.mktemp("home"))})
    plan = plan_for(upstream.path, upstream.base, WHERE, task_steps=("echo task-step > task.txt",))
    results: list[build.Built] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_build(plan, settings)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return settings, plan, results


def test_concurrent_callers_of_one_build_pay_for_one(
    concurrent: tuple[Settings, BuildPlan, list[build.Built]],
) -> None:
    settings, plan, results = concurrent
    assert len(results) == 3
    assert build.BUILDS_RUN[plan.key] == 1
    assert sorted(r.ran_now for r in results) == [False, False, True]
    assert {r.root for r in results} == {settings.paths.builds / plan.key}
    again = ensure_build(plan, settings)  # a later trial: a cache hit, no build
    assert not again.ran_now and build.BUILDS_RUN[plan.key] == 1
    assert again.waited_s < 1.0


def test_a_build_is_a_venv_of_the_base_interpreter_with_the_pinned_runner_and_no_hangar(
    concurrent: tuple[Settings, BuildPlan, list[build.Built]],
) -> None:
    _, plan, results = concurrent
    built = results[0]
    cfg = (built.venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    assert f"home = {Path(sys.base_prefix) / 'bin'}" in cfg
    where = (built.repo / "where.txt").read_text().split()
    # The steps ran in the venv: VIRTUAL_ENV set, its python first, the pinned pytest in it.
    assert where == [
        str(built.venv),
        str(built.venv / "bin" / "python"),
        plan.runner.split("==")[1],
    ]
    assert (built.repo / "task.txt").read_text() == "task-step\n"  # the task's own step, after
    assert set(built.outputs) == {"where.txt", "task.txt"}
    # Hangar's own packages are not there to stand in for the repo's.
    for module in ("pydantic", "hangar_dagster", "dagster"):
        probe = subprocess.run([str(built.python), "-c", f"import {module}"], capture_output=True)
        assert probe.returncode != 0, module
    meta = json.loads((built.root / "build.json").read_text())
    assert meta["digest"] == plan.digest and meta["duration_s"] > 0
    assert "# build: exit 0" in built.log.read_text()


def test_the_built_sandbox_mounts_the_venv_read_only_and_the_clone_at_the_build_path(
    concurrent: tuple[Settings, BuildPlan, list[build.Built]],
    upstream: Upstream,
    tmp_path: Path,
) -> None:
    _, _, results = concurrent
    built = results[0]
    clone = tmp_path / "clone"
    isolated_clone(str(upstream.path), upstream.base, clone)
    built.copy_outputs(clone)
    assert (clone / "where.txt").is_file()
    (clone / "mine.txt").write_text("this clone\n")
    sandbox = built.sandbox(get_sandbox("bwrap"), clone)
    script = (
        f"cat {built.repo}/mine.txt; echo $VIRTUAL_ENV; command -v python; "
        f"touch {built.venv}/written 2>/dev/null && echo venv-writable || echo venv-read-only"
    )
    result = sandbox.run(
        SandboxRequest(
            argv=["/bin/sh", "-c", script], workdir=clone, env={"PATH": "/usr/bin:/bin"},
            timeout_s=60,
        )
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\n")[:4] == [
        "this clone",
        str(built.venv),
        str(built.venv / "bin" / "python"),
        "venv-read-only",
    ]
    assert not (built.venv / "written").exists()


def test_an_agent_in_a_build_reads_the_builds_own_bytecode_under_its_cache_prefix(
    concurrent: tuple[Settings, BuildPlan, list[build.Built]],
    upstream: Upstream,
    tmp_path: Path,
) -> None:
    """As for the runner environment (test_runner.py): the pinned pytest pip put in the build's
    venv loads from the bytecode tree, not compiled afresh at every start of an agent's Python."""
    from hangar_dagster.environment.bytecode import site_packages
    from hangar_dagster.trials.agents import NO_BYTECODE_ENV

    built = concurrent[2][0]
    clone = tmp_path / "clone"
    isolated_clone(str(upstream.path), upstream.base, clone)
    result = built.sandbox(get_sandbox("bwrap"), clone).run(
        SandboxRequest(
            argv=["python", "-v", "-c", "import pytest"], workdir=clone,
            env={"PATH": "/usr/bin:/bin", **NO_BYTECODE_ENV}, timeout_s=60,
        )
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr[-3000:]
    prefix = NO_BYTECODE_ENV["PYTHONPYCACHEPREFIX"] + str(site_packages(built.venv))
    assert f"# code object from '{prefix}/_pytest/" in result.stderr, result.stderr[-3000:]
    assert not list(clone.rglob("*.pyc"))


@pytest.mark.skipif(not (CORPUS / "semanticversion-truncate-copy").is_dir(), reason="no corpus")
def test_an_editable_install_resolves_to_each_clones_own_code(index: Path, tmp_path: Path) -> None:
    repo, sha = semver_repo(CORPUS, tmp_path / "semver")
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    built = ensure_build(plan_for(repo, sha, "pip install -q --no-deps -e ."), settings)
    assert any(o.endswith(".egg-info") for o in built.outputs), built.outputs
    probe = (
        "cd / && python -c 'import importlib.metadata as m, semantic_version as s; "
        'print(s.__file__, getattr(s, "PATCHED", False), m.version("semantic_version"))\''
    )
    seen = {}
    for name, patched in (("base", False), ("trial", True)):
        clone = tmp_path / name
        isolated_clone(str(repo), sha, clone)
        built.copy_outputs(clone)
        if patched:
            with open(clone / "semantic_version" / "__init__.py", "a") as fh:
                fh.write("\nPATCHED = True\n")
        result = built.sandbox(get_sandbox("bwrap"), clone).run(
            SandboxRequest(
                argv=["/bin/sh", "-c", probe], workdir=clone, env={"PATH": "/usr/bin:/bin"},
                timeout_s=60,
            )
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        seen[name] = result.stdout.split()
    # Each clone's own code, through the build's repo path; the version from the metadata.
    assert seen["base"][:2] == [str(built.repo / "semantic_version" / "__init__.py"), "False"]
    assert seen["trial"][:2] == [str(built.repo / "semantic_version" / "__init__.py"), "True"]
    assert seen["base"][2] == seen["trial"][2] and seen["base"][2][0].isdigit()


def test_a_failing_step_fails_the_build_and_leaves_no_cache(
    index: Path, upstream: Upstream, tmp_path: Path
) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    step = "echo the-dependency-is-missing >&2; exit 7"
    plan = plan_for(upstream.path, upstream.base, "echo ok", step)
    for attempt in (1, 2):
        with pytest.raises(BuildFailed) as caught:
            ensure_build(plan, settings)
        assert caught.value.signature == (step, 7)
        assert "the-dependency-is-missing" in caught.value.tail
        assert build.cached(settings, plan) is None
        assert not (settings.paths.builds / plan.key).exists()
        assert not list(settings.paths.builds.glob(".tmp-*"))
        assert len(build.failures(settings, plan)) == attempt
        # Twice the same way (same step, same exit): what makes the base check mark it invalid.
        assert (build.repeated_failure(settings, plan) is not None) == (attempt == 2)


CRASH = """
import contextlib, sys
from pathlib import Path
from hangar_dagster.environment import build
from hangar_dagster.settings import Settings
from tests.buildfixtures import LocalIndexGrant
wheels, home, repo, sha, step = sys.argv[1:]
build.open_build_egress = lambda log, s: contextlib.nullcontext(LocalIndexGrant.of(Path(wheels)))
plan = build.plan_build(build.Environment(build=[step]), repo, sha)
build.ensure_build(plan, Settings.from_env({"HANGAR_HOME": home}))
"""


def test_a_crash_mid_build_leaves_no_half_cache(
    index: Path, upstream: Upstream, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    shutil.copytree(index, wheels)
    (wheels / "SLOW").write_text("")
    home = tmp_path / "home"
    # Slow only while the index holds SLOW: the same plan (same digest) runs fast afterwards.
    step = f"if [ -e {wheels}/SLOW ]; then touch started; sleep 120; fi; echo done > out.txt"
    args = [str(wheels), str(home), str(upstream.path), upstream.base, step]
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH, *args], cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not list((home / "builds").glob(".tmp-*/repo/started")):
        assert proc.poll() is None and time.monotonic() < deadline, "the build never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # the process dies mid-step, as a crashed run does
    proc.wait()
    settings = Settings.from_env({"HANGAR_HOME": str(home)})
    plan = plan_for(upstream.path, upstream.base, step)
    assert build.cached(settings, plan) is None
    assert not (home / "builds" / plan.key).exists()
    assert list((home / "builds").glob(".tmp-*"))  # the half build, never under the key
    (wheels / "SLOW").unlink()
    built = ensure_build(plan, settings)  # the same digest, built again, completely
    assert built.ran_now and (built.repo / "out.txt").read_text() == "done\n"
    assert not list((home / "builds").glob(".tmp-*"))  # the next build cleared it


def test_build_outputs_are_untracked_and_ignored_files_not_tracked_edits(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git("init", "-q", str(repo))
    (repo / ".gitignore").write_text("*.egg-info/\n")
    (repo / "a.py").write_text("x = 1\n")
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a", cwd=repo)
    (repo / "pkg.egg-info").mkdir()
    (repo / "pkg.egg-info" / "PKG-INFO").write_text("Name: pkg\n")
    (repo / "gen" / "deep").mkdir(parents=True)
    (repo / "gen" / "deep" / "x.c").write_text("")
    (repo / "a.py").write_text("x = 2\n")  # a tracked edit is not an output
    assert build._outputs(repo) == ("gen", "pkg.egg-info")


def test_a_mirror_that_cannot_open_is_infrastructure_never_a_counted_failure(
    upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(log_path: Path, settings: Settings) -> object:
        raise ConnectionRefusedError("the mirror's upstream did not answer")

    monkeypatch.setattr(build, "open_build_egress", refused)
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    plan = plan_for(upstream.path, upstream.base, "true")
    for _ in range(2):
        with pytest.raises(MirrorUnavailable, match="did not answer"):
            ensure_build(plan, settings)
    assert build.failures(settings, plan) == [] and build.repeated_failure(settings, plan) is None
    assert not list(settings.paths.builds.glob(".tmp-*")) and build.cached(settings, plan) is None
