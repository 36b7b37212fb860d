"""The ``command`` adapter: a shell command from harness.yaml, run in bwrap on a real clone."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from hangar_dagster.environment.egress import NO_EGRESS
from hangar_dagster.experiment.harness import HarnessError, HarnessLock, freeze, tree_digest
from hangar_dagster.settings import Settings
from hangar_dagster.trials.agents import AgentContext, get_agent
from hangar_dagster.trials.agents.command import CommandAgent
from hangar_dagster.trials.sandbox import get_sandbox
from hangar_dagster.util.gitrepo import take_patch
from tests.gitfixtures import make_clone

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

FIX = "sed -i 's/a - b/a + b/' calc.py"
EVENTS = (
    'printf \'%s\\n\' \'{"type": "turn", "fingerprint": {"tools": ["edit"]}}\' '
    '\'{"type": "usage", "tokens_in": 100, "tokens_out": 20, "cost_usd": 0.5}\' '
    "'not json' '{\"type\": \"turn\"}' "
    '\'{"type": "usage", "tokens_in": 1, "tokens_out": 2, "cost_usd": 0.25}\' '
    '>> "$HANGAR_TRACE_OUT"'
)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))


def make_lock(tmp_path: Path, command: str | None, skills: bool = True) -> HarnessLock:
    src = tmp_path / "harness-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    agent = {"adapter": "command", "cli": "fixer-cli", "version": "1.2.3"}
    if command is not None:
        agent["command"] = command
    manifest = {
        "name": "fixer",
        "agent": agent,
        "model": "fixer-model-2025-01-01",
        "instructions": "instructions.md",
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    (src / "instructions.md").write_text("Harness says: keep the diff small.\n")
    if skills:
        (src / "skills" / "care").mkdir(parents=True)
        (src / "skills" / "care" / "SKILL.md").write_text("Read the tests first.\n")
    return freeze(src, tmp_path / "registry")


def context(
    tmp_path: Path, lock: HarnessLock, clone: Path, timeout_s: float = 30, **env: str
) -> AgentContext:
    return AgentContext(
        trial_key="v/calc/1",
        task_id="calc",
        seed="exp:v/calc/1:1",
        workdir=clone,
        harness=lock,
        model="fixer-model-2025-01-01",
        instructions="Make add() add.",
        verify="python -c 'import calc'",
        timeout_s=timeout_s,
        memory_mb=1024,
        sandbox=get_sandbox("bwrap"),
        egress=NO_EGRESS,
        out_dir=tmp_path / "agent-out",
        settings=Settings.from_env(),
        env=dict(env),
    )


def test_registry_gives_the_command_adapter() -> None:
    agent = get_agent("command")
    assert isinstance(agent, CommandAgent) and not agent.is_standin


def test_command_edits_the_clone_and_reports_its_trace(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, f"{FIX} && {EVENTS}")
    clone, sha = make_clone(tmp_path)
    run = CommandAgent().run(context(tmp_path, lock, clone))
    assert run.exit_code == 0 and run.error is None, run.output_tail
    assert "+    return a + b" in take_patch(clone, sha)
    assert run.turns == 2
    assert (run.tokens_in, run.tokens_out, run.cost_usd) == (101, 22, 0.75)
    assert [e["type"] for e in run.events] == ["turn", "usage", "raw", "turn", "usage"]
    fp = run.fingerprint
    assert fp["cli"] == "fixer-cli" and fp["cli_version"] == "1.2.3"
    assert fp["model"] == "fixer-model-2025-01-01"
    assert (
        fp["instructions_digest"]
        == hashlib.sha256((lock.path / "instructions.md").read_bytes()).hexdigest()
    )
    assert fp["skills_digest"] == tree_digest(lock.skills_dir)
    assert fp["reported"] == {"tools": ["edit"]}


def test_no_skills_dir_gives_no_skills_digest(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, "true", skills=False)
    clone, _ = make_clone(tmp_path)
    run = CommandAgent().run(context(tmp_path, lock, clone))
    assert run.exit_code == 0
    assert run.fingerprint["skills_digest"] is None and run.turns == 0


def test_environment_and_files_reach_the_command(tmp_path: Path) -> None:
    script = (
        'env > "$HANGAR_TRACE_OUT.env"; cp "$HANGAR_INSTRUCTIONS_FILE" /out/instructions.seen; '
        'ls "$HANGAR_HARNESS_DIR" > /out/harness.ls; '
        'for f in "$HANGAR_INSTRUCTIONS_FILE" "$HANGAR_HARNESS_DIR/harness.yaml"; do '
        '(echo x >> "$f") 2>/dev/null && echo "$f writable" >> /out/flags; done; '
        "true"
    )
    lock = make_lock(tmp_path, script)
    clone, _ = make_clone(tmp_path)
    run = CommandAgent().run(
        context(tmp_path, lock, clone, API_BASE="http://proxy", HANGAR_MODEL="evil")
    )
    assert run.exit_code == 0, run.output_tail
    out = tmp_path / "agent-out" / "out"
    env = dict(
        line.split("=", 1)
        for line in (out / "trace.jsonl.env").read_text().splitlines()
        if "=" in line
    )
    assert env["HANGAR_MODEL"] == "fixer-model-2025-01-01"  # the context's extras can't override it
    assert env["API_BASE"] == "http://proxy"
    assert env["HANGAR_TASK"] == "calc" and env["HANGAR_SEED"] == "exp:v/calc/1:1"
    assert env["HANGAR_VERIFY"] == "python -c 'import calc'"
    assert env["HANGAR_HARNESS_DIR"] == "/harness" and env["PWD"] == str(clone)
    assert (
        out / "instructions.seen"
    ).read_text() == "Make add() add.\n\nHarness says: keep the diff small.\n"
    assert "harness.yaml" in (out / "harness.ls").read_text()
    assert not (out / "flags").exists()
    assert (
        lock.path.joinpath("instructions.md").read_text() == "Harness says: keep the diff small.\n"
    )


def test_nonzero_exit_is_an_error_with_the_last_stderr_line(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, "echo working; echo 'model refused' >&2; exit 3")
    clone, _ = make_clone(tmp_path)
    run = CommandAgent().run(context(tmp_path, lock, clone))
    assert run.exit_code == 3 and not run.timed_out
    assert run.error == "the agent command exited with code 3: model refused"
    assert "working" in run.output_tail and "model refused" in run.output_tail


def test_timeout(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, "sleep 60")
    clone, _ = make_clone(tmp_path)
    run = CommandAgent().run(context(tmp_path, lock, clone, timeout_s=1))
    assert run.timed_out and run.exit_code is None
    assert run.error is not None and "out of time" in run.error


def test_a_symlinked_trace_is_not_followed_on_the_host(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.jsonl"
    secret.write_text('{"type": "turn", "leak": "SECRET"}\n')
    lock = make_lock(tmp_path, f'rm "$HANGAR_TRACE_OUT"; ln -s {secret} "$HANGAR_TRACE_OUT"')
    clone, _ = make_clone(tmp_path)
    run = CommandAgent().run(context(tmp_path, lock, clone))
    assert (tmp_path / "agent-out" / "out" / "trace.jsonl").is_symlink()  # the command did plant it
    assert run.events == [] and run.turns == 0


def test_missing_command_names_the_field(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, None)
    clone, _ = make_clone(tmp_path)
    with pytest.raises(HarnessError, match="agent.command"):
        CommandAgent().run(context(tmp_path, lock, clone))


IMPORT_AND_COMPILE = (
    'env > /out/agent.env; python -c "import calc"; '
    "python -c \"import py_compile; print(py_compile.compile('calc.py'))\" > /out/compiled"
)


def test_python_in_the_agent_leaves_no_bytecode_in_the_patch(tmp_path: Path) -> None:
    """Importing, even compiling by hand: the bytecode lands outside the work tree."""
    lock = make_lock(tmp_path, IMPORT_AND_COMPILE)
    clone, sha = make_clone(tmp_path)
    # The experiment's extras cannot turn bytecode back on.
    ctx = context(tmp_path, lock, clone, PYTHONDONTWRITEBYTECODE="", PYTHONPYCACHEPREFIX="")
    run = CommandAgent().run(ctx)
    assert run.exit_code == 0, run.output_tail
    seen = dict(
        line.split("=", 1)
        for line in (tmp_path / "agent-out" / "out" / "agent.env").read_text().splitlines()
        if "=" in line
    )
    assert seen["PYTHONDONTWRITEBYTECODE"] == "1"
    assert seen["PYTHONPYCACHEPREFIX"] == "/tmp/hangar-pycache"
    compiled = (tmp_path / "agent-out" / "out" / "compiled").read_text().strip()
    assert compiled.startswith("/tmp/hangar-pycache/") and compiled.endswith(".pyc"), compiled
    patch = take_patch(clone, sha)
    assert ".pyc" not in patch and "__pycache__" not in patch, patch
    assert not list(clone.rglob("__pycache__")) and not list(clone.rglob("*.pyc"))


def test_without_the_variables_the_same_command_leaves_bytecode(tmp_path: Path) -> None:
    """The control: the check above sees bytecode when Python is told to write it."""
    command = "env -u PYTHONDONTWRITEBYTECODE -u PYTHONPYCACHEPREFIX " + 'python -c "import calc"'
    lock = make_lock(tmp_path, command)
    clone, sha = make_clone(tmp_path)
    run = CommandAgent().run(context(tmp_path, lock, clone))
    assert run.exit_code == 0, run.output_tail
    assert "__pycache__/calc." in take_patch(clone, sha)
