"""Shared fixtures (an isolated HANGAR_HOME, a copy of the bundled example with its repos built),
the test tiers and the `needs_sandbox` marker."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.environment.mirror import Mirror, ensure_mirror, stop_mirror
from hangar_dagster.experiment.harness import freeze
from hangar_dagster.settings import HangarPaths, Settings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "skills-ab"
# The corpus of real tasks: ../shared/corpus beside the checkout (CI has it there);
# $HANGAR_CORPUS points elsewhere (a git worktree, say).
CORPUS = Path(os.environ.get("HANGAR_CORPUS") or ROOT.parent / "shared" / "corpus")

# --- tiers -------------------------------------------------------------------------------
# Every test module names its tier in `pytestmark`; a test that differs from its module carries
# its own tier mark, and a test marked `needs_sandbox` is never `unit`. `pytest -m unit` is the
# fast tier a developer runs while working; `bash scripts/test` runs all three.
TIERS = ("unit", "integration", "slow")


def _tier_marks(node: pytest.Item | pytest.Collector) -> set[str]:
    return {m.name for m in node.own_markers if m.name in TIERS}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: an untiered module fails any run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems: list[str] = []
    modules: set[pytest.Module] = set()
    resolved: list[tuple[pytest.Item, str]] = []
    for item in items:
        module = item.getparent(pytest.Module)
        if module is not None:
            modules.add(module)
        own = _tier_marks(item)
        declared = _tier_marks(module) if module is not None else set()
        tier = own or declared
        if len(tier) != 1:
            where = item.nodeid if own else item.nodeid.split("::")[0]
            problems.append(
                f"{where}: {'two tiers ' + str(sorted(tier)) if tier else 'no tier'};"
                f" set pytestmark to one of {', '.join(TIERS)} (tests/conftest.py)"
            )
            continue
        (name,) = tier
        if name == "unit" and item.get_closest_marker("needs_sandbox") is not None:
            name = "integration"
        resolved.append((item, name))
        for mark in item.iter_markers("needs_sandbox"):
            if mark.args not in [(b,) for b in SANDBOX_NEEDS]:
                problems.append(
                    f"{item.nodeid}: needs_sandbox takes one of {sorted(SANDBOX_NEEDS)}"
                )
    if problems:
        raise pytest.UsageError("\n".join(sorted(set(problems))))
    # A test's own tier wins over its module's: the module's mark becomes a per-test mark, so
    # that `-m unit` does not pick a slow test out of a unit module.
    for module in modules:
        module.own_markers[:] = [m for m in module.own_markers if m.name not in TIERS]
    for item, name in resolved:
        item.own_markers[:] = [m for m in item.own_markers if m.name not in TIERS]
        item.add_marker(name)
    _xdist_groups(items, resolved)


# --- xdist workers (`bash scripts/test` runs pytest-xdist) ----------------------------------
# A worker takes a whole group: a module's tests stay together, so its module and session
# fixtures (a shared build, the corpus's grade cache) are made once. Every test that needs the
# Docker engine is one group, run by one worker at a time: `cleanup_leftovers` removes every
# hangar container whose owner is gone, so one worker's deliberately crashed container would be
# another's leftover, and the deployment tests size their waits for one user of the engine.
# xdist's own `xdist_group` cannot carry this: it renames the item's nodeid through an attribute
# pytest 9.2 no longer reads. So each worker writes its nodeid -> group map where the
# controller's scheduler (below) reads it. docs/performance.md, "The whole suite's time".
DOCKER_GROUP = "docker"
GROUPS_DIR = "HANGAR_TEST_GROUPS_DIR"
_TIER_ORDER = {"slow": 0, "integration": 1, "unit": 2}


def _needs_docker(item: pytest.Item) -> bool:
    return "docker_base_image" in getattr(item, "fixturenames", ()) or any(
        mark.args == ("docker",) for mark in item.iter_markers("needs_sandbox")
    )


def _group(item: pytest.Item) -> str:
    return DOCKER_GROUP if _needs_docker(item) else item.nodeid.split("::")[0]


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        import tempfile

        # the controller, before it starts the workers (they inherit the variable)
        os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="hangar-test-groups-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") and (where := os.environ.pop(GROUPS_DIR, "")):
        shutil.rmtree(where, ignore_errors=True)


def _xdist_groups(items: list[pytest.Item], resolved: list[tuple[pytest.Item, str]]) -> None:
    """In a worker: the longest work first, so that no long group starts last (the Docker
    group, then the modules with slow tests, integration, unit; a stable sort keeps each
    group's order), and the nodeid -> group map written for the controller."""
    worker, where = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(GROUPS_DIR)
    if not worker or not where:
        return
    import json

    group = {id(item): _group(item) for item, _ in resolved}
    rank: dict[str, int] = {}
    for item, tier in resolved:
        name = group[id(item)]
        rank[name] = min(rank.get(name, 3), -1 if name == DOCKER_GROUP else _TIER_ORDER[tier])
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (rank[group[id(item)]], order[id(item)]))
    mapping = json.dumps({item.nodeid: group[id(item)] for item in items})
    Path(where, f"{worker}.json.tmp").write_text(mapping)
    os.replace(Path(where, f"{worker}.json.tmp"), Path(where, f"{worker}.json"))


def _worker_groups(where: Path) -> dict[str, str]:
    """The nodeid -> group maps every worker wrote into ``where``, merged."""
    import json

    groups: dict[str, str] = {}
    for found in sorted(where.glob("*.json")):
        groups.update(json.loads(found.read_text()))
    return groups


@pytest.hookimpl(optionalhook=True)  # a venv without pytest-xdist runs the suite in one process
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with our groups as its scopes (a whole group per worker). Work
    goes out in collection order, which the workers sorted longest first."""

    from xdist.scheduler import LoadScopeScheduling

    where = Path(os.environ[GROUPS_DIR])
    config.option.loadscopereorder = False  # by test count: not the order we sorted

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            # Called once every worker has collected, so every worker's map is written.
            if self.groups is None:
                self.groups = _worker_groups(where)
            return self.groups.get(nodeid) or nodeid.split("::")[0]

    return ByGroup(config, log)


# --- where the suite's time went -----------------------------------------------------------
# After the slowest tests, the controller prints each worker's busy seconds and idle tail, and
# the groups by time: the run is as long as its busiest worker, so these say whether a group
# (the Docker one) is the critical path or the workers are balanced. docs/performance.md.
_STARTED = time.monotonic()
_BY_GROUP: dict[str, float] = {}
_BY_WORKER: dict[str, list[float]] = {}  # worker -> [busy seconds, monotonic time of its last]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller sums what the workers report
    node = getattr(report, "node", None)
    worker = str(node.workerinput["workerid"]) if node is not None else "main"
    _BY_GROUP[report.nodeid] = _BY_GROUP.get(report.nodeid, 0.0) + report.duration
    busy = _BY_WORKER.setdefault(worker, [0.0, 0.0])
    busy[0] += report.duration
    busy[1] = time.monotonic()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or not _BY_WORKER:
        return
    where = os.environ.get(GROUPS_DIR)
    mapping = _worker_groups(Path(where)) if where else {}
    groups: dict[str, float] = {}
    for nodeid, seconds in _BY_GROUP.items():
        name = mapping.get(nodeid) or nodeid.split("::")[0]
        groups[name] = groups.get(name, 0.0) + seconds
    end = time.monotonic()
    write = terminalreporter.write_line
    terminalreporter.section("where the time went (tests/conftest.py)")
    for worker, (busy, last) in sorted(_BY_WORKER.items()):
        write(f"worker {worker}: {busy:.0f} s of tests, idle for the last {end - last:.0f} s")
    write(f"run: {end - _STARTED:.0f} s; tests summed: {sum(groups.values()):.0f} s")
    for name, seconds in sorted(groups.items(), key=lambda kv: -kv[1])[:25]:
        write(f"{seconds:8.1f} s  {name}")


# --- sandbox backends ----------------------------------------------------------------------
# What each `needs_sandbox(...)` name needs, and how to say it is missing.
SANDBOX_NEEDS: dict[str, tuple[Callable[[], bool], str]] = {
    "bwrap": (lambda: shutil.which("bwrap") is not None, "bwrap (Debian package bubblewrap)"),
    "unshare": (lambda: shutil.which("unshare") is not None, "unshare (package util-linux)"),
    "root": (lambda: os.geteuid() == 0, "root (the uid split between agent and grader)"),
    "docker": (
        lambda: _docker_engine() is None,
        "a running Docker engine (scripts/bootstrap installs docker.io and starts dockerd;"
        " CI=true always does)",
    ),
}


def _docker_engine() -> str | None:
    """None when the Docker engine answers, else why not."""
    try:
        from hangar_dagster.trials.sandbox.docker import client

        client()
    except Exception as err:  # noqa: BLE001  any failure means: no engine to test against
        return str(err)
    return None


ALLOW_MISSING_SANDBOX = "HANGAR_ALLOW_MISSING_SANDBOX"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A missing backend skips on a developer's machine and fails in CI, unless opted out.

    A skip in CI would pass the run green with the adversarial and isolation suites unrun.
    """
    for mark in item.iter_markers("needs_sandbox"):
        available, what = SANDBOX_NEEDS[mark.args[0]]
        if available():
            continue
        if _flag("CI") and not _flag(ALLOW_MISSING_SANDBOX):
            pytest.fail(
                f"CI={os.environ['CI']} and this test needs {what}, which is missing here;"
                f" install it, or set {ALLOW_MISSING_SANDBOX}=1 to skip such tests",
                pytrace=False,
            )
        pytest.skip(f"needs {what}")


@pytest.fixture(scope="session", autouse=True)
def shared_runner_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One runner environment for the whole session (``HANGAR_RUNNER_DIR``), not one per test
    home: every grade and trial needs it, and it is the same everywhere. Tests that pass their
    own ``Settings.from_env({...})`` still make theirs under the home's builds/."""
    path = tmp_path_factory.mktemp("runner-env")
    patch = pytest.MonkeyPatch()
    patch.setenv("HANGAR_RUNNER_DIR", str(path))
    yield path
    patch.undo()


@pytest.fixture
def hangar_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hangar-home"
    monkeypatch.setenv("HANGAR_HOME", str(home))
    # Set (not deleted) so that code which exports DAGSTER_HOME is undone after the test.
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    monkeypatch.setenv("HANGAR_EVAL_WINDOW", "always")
    return home


# The example's answer needs all its tasks and trials (10 x 4, 80 trials: tests/test_example.py
# checks them against its README). A test needs a run of the example, not its answer, so the
# copy's experiment.yaml is the example cut to its first EXAMPLE_CUT_TASKS tasks and
# EXAMPLE_CUT_TRIALS trials (18 trials, its size before it grew; the suite's cost stays as it
# was). Cut as text, so the copy keeps the spec's layout and comments (tests edit it as text).
EXAMPLE_CUT_TASKS = ("median", "slugify", "durations")
EXAMPLE_CUT_TRIALS = 3
# The tests' timings and their parallel-trial checks were set at 3 slots; the whole example
# runs wider (its 80 trials are latency-bound: docs/performance.md, "The example experiment").
EXAMPLE_CUT_PARALLEL = 3


def cut_example_spec(text: str) -> str:
    """The example's experiment.yaml with only EXAMPLE_CUT_TASKS and EXAMPLE_CUT_TRIALS."""
    head, rest = text.split("\ntasks:\n", 1)
    body, tail = rest.split("\nvariants:\n", 1)
    kept = [f"  - id: {b}" for b in body.split("  - id: ")[1:] if b.split()[0] in EXAMPLE_CUT_TASKS]
    tail, n = re.subn(r"(?m)^trials: \d+$", f"trials: {EXAMPLE_CUT_TRIALS}", tail)
    tail, m = re.subn(r"(?m)^parallel: \d+$", f"parallel: {EXAMPLE_CUT_PARALLEL}", tail)
    cut = f"{head}\ntasks:\n{''.join(kept).rstrip()}\nvariants:\n{tail}"
    data = yaml.safe_load(cut)
    # The example changed shape if this fails: update the cut, not the tests.
    assert n == m == 1 and [t["id"] for t in data["tasks"]] == list(EXAMPLE_CUT_TASKS), cut
    assert data["trials"] == EXAMPLE_CUT_TRIALS and data["parallel"] == EXAMPLE_CUT_PARALLEL
    return cut


def copy_example(dest: Path, *, cut: bool = True) -> Path:
    """The skills-ab example copied to ``dest`` (made), with its task repos generated and its
    experiment.yaml cut to three tasks x three trials (``cut_example_spec``); ``cut`` False:
    the whole example, as bundled (a benchmark's)."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("repos", "__pycache__"))
    spec = dest / "experiment.yaml"
    if cut:
        spec.write_text(cut_example_spec(spec.read_text()))
    subprocess.run(
        [sys.executable, str(dest / "make_repos.py"), "--out", str(dest / "repos")]
        + [f"--task={t}" for t in EXAMPLE_CUT_TASKS if cut],
        check=True,
        capture_output=True,
    )
    return dest


@pytest.fixture(scope="session")
def example_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The skills-ab example copied out of the checkout, with its task repos generated, cut to
    three tasks x three trials (``copy_example``)."""
    return copy_example(tmp_path_factory.mktemp("example") / "skills-ab")


def one_task_spec(example_dir: Path, name: str, **environment: object) -> Path:
    """The example with one task and one trial per variant (two trials, two grades), its
    ``environment`` keys set (sandbox, image), written as ``name`` beside it."""
    data = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    data["environment"].update(environment)
    data["tasks"] = data["tasks"][:1]
    data["trials"] = 1
    spec = example_dir / name
    spec.write_text(yaml.safe_dump(data))
    return spec


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env["HANGAR_HOME"] = str(home)
    env["HANGAR_EVAL_WINDOW"] = "always"  # tests that need a window set their own
    return env


def hangar(
    *args: str, home: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``hangar`` CLI in a subprocess against ``home`` (``env`` adds variables)."""
    exe = Path(sys.executable).with_name("hangar")
    return subprocess.run(
        [str(exe), *args],
        env=cli_env(home) | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def command_agent_spec(
    example_dir: Path, tmp_path: Path, name: str, command: str, files: dict[str, str] | None = None
) -> dict[str, Any]:
    """The example's `median` task, one trial, under a frozen `command` harness running ``command``.

    Returns the spec as a dict for the test to adjust and write next to the example's spec.
    """
    src = tmp_path / f"{name}-harness"
    src.mkdir()
    manifest = {
        "name": name,
        "agent": {"adapter": "command", "command": command, "cli": "sh", "version": "1"},
        "model": "scripted-2026-01-01",
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    for rel, text in (files or {}).items():
        (src / rel).write_text(text)
    lock = freeze(src, tmp_path / "registry")
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec.pop("baseline", None)  # the example's baseline names a variant this spec replaces
    spec.update(
        name=name,
        harness_repo=str(tmp_path / "registry"),
        tasks=[t for t in spec["tasks"] if t["id"] == "median"],
        variants={name: {"harness_lock": lock.ref}},
        trials=1,
    )
    return spec


def write_spec(example_dir: Path, spec: dict[str, Any]) -> Path:
    path = example_dir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="session")
def package_mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Mirror]]:
    """One real package mirror (proxpi, upstream = pip's index here) for the whole session.

    Returns the settings of the home it belongs to and the mirror; stopped at the end. A test
    of another home reaches it with ``HANGAR_PACKAGE_MIRROR_URL`` = ``mirror.index_url``.
    """
    home = tmp_path_factory.mktemp("mirror-home")
    settings = Settings(home=home, dagster_home=home / "dagster")
    mirror = ensure_mirror(settings)
    try:
        yield settings, mirror
    finally:
        stop_mirror(settings)


@pytest.fixture(scope="session")
def docker_base_image() -> str:
    """The id of hangar's base image: a cache hit when scripts/bootstrap built it already."""
    from hangar_dagster.environment.image import build_base_image
    from hangar_dagster.trials.sandbox.docker import client

    return build_base_image(client()).image_id


# --- a real `hangar ui` ------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ui_answers(home: Path) -> bool:
    """Whether the webserver `hangar ui` started on ``home`` answers."""
    import urllib.request

    try:
        url = (home / "webserver.url").read_text().strip()
        with urllib.request.urlopen(url + "/server_info", timeout=5):
            return True
    except OSError:
        return False


def start_ui(
    home: Path, log: Path, env: dict[str, str] | None = None, seconds: float = 300
) -> subprocess.Popen[bytes]:
    """`hangar ui` as an operator's shell starts it (a process group of its own), once it answers."""
    import time

    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("hangar")), "ui", "--port", str(free_port())],
        env=cli_env(home) | (env or {}),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + seconds
    while not ui_answers(home):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    return proc


def stop_ui(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to `hangar ui` (it stops everything it started), then SIGKILL to what is left."""
    import signal

    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


# --- a stage run's worker, recorded and killed ---------------------------------------------
_RECORD_RUN_PROCESS = """
import sys, time
from pathlib import Path
from hangar_dagster.queue.liveness import record_run_process
from hangar_dagster.settings import HangarPaths
record_run_process(HangarPaths(Path(sys.argv[1])), sys.argv[2])
print("recorded", flush=True)
time.sleep(600)
"""


def recorded_worker(home: Path, run_id: str) -> subprocess.Popen[str]:
    """A real process that recorded itself as run ``run_id``'s worker (queue/liveness.py)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECORD_RUN_PROCESS, str(home), run_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "recorded"
    return proc


def ui_lock_holder(home: Path) -> subprocess.Popen[str]:
    """A real process holding the home's `hangar ui` lock, as a running UI does (its pid)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from hangar_dagster.util.procs import"
            " PidLock; lock = PidLock(Path(sys.argv[1])); lock.acquire(); print('held',"
            " flush=True); time.sleep(600)",
            str(HangarPaths(home).ui_lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def killed_worker(home: Path, run_id: str) -> int:
    """Run ``run_id``'s recorded worker, SIGKILLed as an OOM killer or an operator would; its pid."""
    import signal

    proc = recorded_worker(home, run_id)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.pid


# --- a command agent whose first attempt outlives whatever stops it ------------------------
# Fixes the example's median task (a command agent's script, run in the clone).
FIX_MEDIAN = """python - <<'PY'
import pathlib
p = pathlib.Path("stats.py")
fix = "    if len(ordered) % 2 == 0:\\n        return (ordered[mid - 1] + ordered[mid]) / 2\\n"
p.write_text(p.read_text().replace("    return ordered[mid]", fix + "    return ordered[mid]"))
PY
"""
# Attempt 1 sleeps until it is stopped (drained, killed); a retry fixes the bug at once.
SLEEP_THEN_FIX = 'case "$HANGAR_SEED" in *:1) sleep 600;; esac\n' + FIX_MEDIAN


def stage_succeeded(home: Path, experiment_id: str, stage: str) -> bool:
    """Whether a run of ``experiment_id``'s ``stage`` succeeded in ``home``'s Dagster instance.

    ``stage`` "index": a run that writes the index (the last trials run, or the index's own).
    """
    import dagster as dg

    from hangar_dagster.orchestration.stages import TAG_EXPERIMENT, TAG_INDEX, TAG_STAGE

    selects = {TAG_INDEX: "true"} if stage == "index" else {TAG_STAGE: stage}
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        records = instance.get_run_records(
            dg.RunsFilter(
                tags={TAG_EXPERIMENT: experiment_id} | selects,
                statuses=[dg.DagsterRunStatus.SUCCESS],
            )
        )
    return bool(records)


def attempts(
    home: Path, experiment_id: str | None = None
) -> list[tuple[int, str, str | None, str, str | None]]:
    """(attempt, outcome_class, infra_reason, run_id, retry_of) of every stored attempt (of
    ``experiment_id`` only, if given)."""
    import duckdb

    if not (home / "hangar.duckdb").exists():
        return []
    try:
        con = duckdb.connect(str(home / "hangar.duckdb"), read_only=True)
    except duckdb.Error:
        return []  # a writer holds it this instant
    try:
        return con.execute(
            "select attempt, outcome_class, infra_reason, run_id, retry_of from trials"
            " where ? is null or experiment_id = ? order by attempt",
            [experiment_id, experiment_id],
        ).fetchall()
    finally:
        con.close()


# --- a Docker sandbox container left behind by a run killed mid-command -----------------------
_CRASHING_DOCKER_RUN = """
import sys
from pathlib import Path
from hangar_dagster.trials.sandbox import SandboxRequest
from hangar_dagster.trials.sandbox.docker import DockerSandbox
print("starting", flush=True)
DockerSandbox().run(SandboxRequest(argv=["/bin/sh", "-c", "echo up; sleep 120"],
    workdir=Path(sys.argv[1]), env={"PATH": "/usr/bin:/bin"}, timeout_s=120,
    on_stdout=lambda chunk: print("running", flush=True)))
"""


def crashed_docker_run(wd: Path) -> str:
    """The id of the container a run left behind when it was SIGKILLed mid-command."""
    from hangar_dagster.trials.sandbox.docker import MANAGED_LABEL, OWNER_LABEL, client

    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_DOCKER_RUN, str(wd)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) and line.strip() != "running":
        pass
    proc.kill()
    proc.wait()
    (left,) = [
        c["Id"]
        for c in client().api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=1"})
        if c["Labels"][OWNER_LABEL].split(":")[1] == str(proc.pid)
    ]
    return left
