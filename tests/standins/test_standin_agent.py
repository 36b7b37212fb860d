"""The scripted stand-in agent: its decision function, its program, and its adapter in bwrap."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.environment.egress import NO_EGRESS
from hangar_dagster.experiment.drift import check_drift, harness_fingerprint
from hangar_dagster.experiment.harness import HarnessLock, freeze, tree_digest
from hangar_dagster.settings import Settings
from hangar_dagster.standins.agent import (
    MAX_RAW_EVENTS,
    StandinAgent,
    parse_trace,
    result_file,
    to_run,
)
from hangar_dagster.standins.agent_main import (
    STANDIN_CLI,
    StandinError,
    decide,
    decide_retry,
    load_playbook,
    solve_rate,
    unit,
)
from hangar_dagster.trials.agents import AgentContext, get_agent
from hangar_dagster.trials.sandbox import SandboxResult, SandboxUnavailable, get_sandbox
from hangar_dagster.util.gitrepo import take_patch
from tests.gitfixtures import CALC, make_clone

pytestmark = pytest.mark.unit

VERIFY = "python -c 'import calc; assert calc.add(2, 3) == 5'"
PLAYBOOK = {
    "calc": {
        "fix": [{"file": "calc.py", "find": "a - b", "replace": "a + b"}],
        "wrong": [{"file": "calc.py", "find": "return a - b", "replace": "return abs(a - b)"}],
    }
}
SKILL = "---\nname: care\nstandin_solve_rate_bonus: 0.25\n---\nRead the tests first.\n"


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))


def make_lock(
    tmp_path: Path,
    rate: float,
    skill: str | None = None,
    playbook: Any = None,
    plugin: str | None = None,
) -> HarnessLock:
    src = tmp_path / "harness-src"
    src.mkdir()
    manifest = {
        "name": "calc-standin",
        "agent": {"adapter": "standin", "cli": "hangar-standin", "version": "0.1.0"},
        "model": "standin-scripted-2026-01-01",
        "approvals": "full-auto",
        "instructions": "instructions.md",
        "standin": {"solve_rate": rate},
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    (src / "instructions.md").write_text("Fix the bug; run the check.\n")
    (src / "playbook.yaml").write_text(yaml.safe_dump(PLAYBOOK if playbook is None else playbook))
    if skill is not None:
        (src / "skills" / "care").mkdir(parents=True)
        (src / "skills" / "care" / "SKILL.md").write_text(skill)
    if plugin is not None:
        (src / "plugins" / "lint").mkdir(parents=True)
        (src / "plugins" / "lint" / "plugin.json").write_text(plugin)
    return freeze(src, tmp_path / "registry")


def seed_where(wanted: bool, retry: bool, rate: float) -> str:
    """The first seed s0, s1, ... whose first try (and retry) come out as asked."""
    for i in range(1000):
        seed = f"s{i}"
        if decide(seed, rate) == wanted and decide_retry(seed, rate) == retry:
            return seed
    raise AssertionError("no such seed among the first 1000")


# --- the pure decision ---------------------------------------------------------------


def test_unit_is_fixed_by_the_seed_and_spread_over_0_1() -> None:
    values = [unit(f"seed-{i}") for i in range(400)]
    assert values == [unit(f"seed-{i}") for i in range(400)]
    assert all(0 <= v < 1 for v in values)
    assert 0.4 < sum(values) / len(values) < 0.6
    assert unit("x") == int(hashlib.sha256(b"x").hexdigest(), 16) / 2**256


def test_decide_follows_the_rate() -> None:
    seeds = [f"k{i}" for i in range(300)]
    assert not any(decide(s, 0.0) for s in seeds)
    assert all(decide(s, 1.0) for s in seeds)
    low = {s for s in seeds if decide(s, 0.3)}
    high = {s for s in seeds if decide(s, 0.7)}
    assert low < high  # a higher rate solves everything a lower one does, and more
    assert 0.6 < len(high) / len(seeds) < 0.8


def test_solve_rate_adds_skill_bonuses_and_stays_within_0_1() -> None:
    config = {"standin": {"solve_rate": 0.3}}
    assert solve_rate(config, {}) == pytest.approx(0.3)
    assert solve_rate(config, {"care": SKILL}) == pytest.approx(0.55)
    assert solve_rate(config, {"a": SKILL, "b": SKILL, "c": SKILL}) == 1.0
    assert solve_rate(config, {"plain": "# no front matter\n"}) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("config", "skills", "names"),
    [
        ({}, {}, "standin.solve_rate"),
        ({"standin": {"solve_rate": 1.5}}, {}, "standin.solve_rate"),
        ({"standin": {"solve_rate": "high"}}, {}, "standin.solve_rate"),
        (
            {"standin": {"solve_rate": 0.2}},
            {"care": "---\nstandin_solve_rate_bonus: lots\n---\n"},
            "skills/care/SKILL.md",
        ),
    ],
)
def test_bad_rates_name_the_field(
    config: dict[str, Any], skills: dict[str, str], names: str
) -> None:
    with pytest.raises(StandinError, match=names):
        solve_rate(config, skills)


def test_playbook_errors_name_the_task_and_field() -> None:
    text = yaml.safe_dump(PLAYBOOK)
    fix, wrong = load_playbook(text, "calc")
    assert [e.replace for e in fix] == ["a + b"] and len(wrong) == 1
    with pytest.raises(StandinError, match="no entry for task 'other'"):
        load_playbook(text, "other")
    bad = {"calc": {"fix": [{"file": "calc.py", "find": "x"}], "wrong": []}}
    with pytest.raises(StandinError, match=r"calc\.fix\[0\]"):
        load_playbook(yaml.safe_dump(bad), "calc")
    outside = {"calc": {"fix": [{"file": "../x.py", "find": "a", "replace": "b"}], "wrong": []}}
    with pytest.raises(StandinError, match="inside the repo"):
        load_playbook(yaml.safe_dump(outside), "calc")


# --- reading the trace -------------------------------------------------------------------


def test_parse_trace_keeps_garbage_as_bounded_raw_events() -> None:
    lines = ['{"type": "turn", "n": 1, "standin": true}', "not json", "[1, 2]", '{"no": "type"}']
    lines += [f"noise {i}" for i in range(MAX_RAW_EVENTS + 20)]
    lines += ['{"type": "result", "standin": true}']
    events = parse_trace("\n".join(lines) + "\n")
    assert events[0]["type"] == "turn" and events[-1]["type"] == "result"
    raws = [e for e in events if e["type"] == "raw"]
    assert len(raws) == MAX_RAW_EVENTS
    assert raws[0]["text"] == "not json"


def test_to_run_totals_fingerprint_and_errors() -> None:
    stdout = "\n".join(
        json.dumps(e)
        for e in [
            {"type": "turn", "n": 1, "fingerprint": {"cli": STANDIN_CLI}, "standin": True},
            {"type": "usage", "tokens_in": 100, "tokens_out": 7, "cost_usd": 0.0},
            {"type": "turn", "n": 2, "standin": True},
            {"type": "usage", "tokens_in": 50, "tokens_out": 3, "cost_usd": 0.0},
            {"type": "error", "message": "playbook.yaml: edit of calc.py: ..."},
        ]
    )
    run = to_run(SandboxResult(2, False, stdout, "boom\n", 0.5))
    assert (run.turns, run.tokens_in, run.tokens_out, run.cost_usd) == (2, 150, 10, 0.0)
    assert run.fingerprint == {"cli": STANDIN_CLI}
    assert run.error == "playbook.yaml: edit of calc.py: ..."
    assert run.output_tail.endswith("boom\n")
    late = to_run(SandboxResult(None, True, "garbage only", "", 60.0))
    assert late.timed_out and late.exit_code is None and late.fingerprint == {}
    assert late.error is not None and "time" in late.error
    crashed = to_run(SandboxResult(1, False, "", "Traceback ...", 0.1))
    assert crashed.error == "the stand-in agent exited with code 1"


# --- the program, run directly (no sandbox) ----------------------------------------------


def run_program(
    clone: Path, lock: HarnessLock, seed: str, out: Path
) -> subprocess.CompletedProcess[str]:
    out.mkdir(exist_ok=True)
    env = {
        "HANGAR_HARNESS_DIR": str(lock.path),
        "HANGAR_TASK": "calc",
        "HANGAR_SEED": seed,
        "HANGAR_MODEL": lock.model,
        "HANGAR_INSTRUCTIONS": "add() subtracts",
        "HANGAR_VERIFY": VERIFY,
        "HOME": str(out),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    argv = [sys.executable, "-I", "-m", "hangar_dagster.standins.agent_main", "--out", str(out)]
    return subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=60)


def test_program_applies_the_fix_and_labels_every_event(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, rate=1.0)
    clone, sha = make_clone(tmp_path)
    proc = run_program(clone, lock, "any", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert all(e["standin"] is True for e in events)
    assert [e["type"] for e in events] == ["turn", "tool_call", "tool_call", "usage", "result"]
    shell = events[2]
    assert (shell["tool"], shell["command"], shell["exit_code"]) == ("shell", VERIFY, 0)
    assert events[3]["estimated"] is True and events[3]["tokens_in"] > 0
    assert "return a + b" in (clone / "calc.py").read_text()
    assert "Scripted stand-in" in (tmp_path / "out" / "RESULT.md").read_text()
    assert take_patch(clone, sha).count("diff --git") == 1  # calc.py only


def test_program_reports_a_missing_find_text_as_an_agent_error(tmp_path: Path) -> None:
    missing = {"file": "calc.py", "find": "a * b", "replace": "a + b"}
    playbook = {"calc": {"fix": [missing], "wrong": []}}
    lock = make_lock(tmp_path, rate=1.0, playbook=playbook)
    clone, _ = make_clone(tmp_path)
    proc = run_program(clone, lock, "any", tmp_path / "out")
    assert proc.returncode == 2
    error = json.loads(proc.stdout.splitlines()[-1])
    assert error["type"] == "error" and "'a * b'" in error["message"]
    assert (clone / "calc.py").read_text() == CALC
    assert not (tmp_path / "out" / "RESULT.md").exists()


# --- the adapter in the real bwrap sandbox -----------------------------------------------


def context(tmp_path: Path, lock: HarnessLock, clone: Path, seed: str) -> AgentContext:
    try:
        sandbox = get_sandbox("bwrap")
    except SandboxUnavailable as err:  # pragma: no cover - depends on the host
        pytest.skip(str(err))
    return AgentContext(
        trial_key="v/calc/1",
        task_id="calc",
        seed=seed,
        workdir=clone,
        harness=lock,
        model=lock.model,
        instructions="add() subtracts instead of adding",
        verify=VERIFY,
        timeout_s=60,
        memory_mb=2048,
        sandbox=sandbox,
        egress=NO_EGRESS,
        out_dir=tmp_path / "agent-out",
        settings=Settings.from_env(),
    )


def test_adapter_is_registered_as_the_standin() -> None:
    agent = get_agent("standin")
    assert isinstance(agent, StandinAgent) and agent.is_standin and agent.name == "standin"


@pytest.mark.needs_sandbox("bwrap")
def test_adapter_in_bwrap_fixes_and_fingerprints_what_it_saw(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, rate=0.0, skill=SKILL)  # 0.25 from the skill
    seed = seed_where(True, False, 0.25)
    clone, sha = make_clone(tmp_path)
    ctx = context(tmp_path, lock, clone, seed)
    run = StandinAgent().run(ctx)
    assert run.error is None, run.output_tail
    assert (run.exit_code, run.timed_out, run.turns, run.cost_usd) == (0, False, 1, 0.0)
    fp = run.fingerprint
    assert fp["cli"] == STANDIN_CLI and fp["model"] == "standin-scripted-2026-01-01"
    assert fp["adapter"] == "standin" and fp["harness"] == lock.ref
    assert fp["cli_version"] == "0.1.0" and fp["tools"] == ["edit", "shell"]
    skill_md = (lock.skills_dir / "care" / "SKILL.md").read_bytes()
    assert fp["skills"] == {"care": hashlib.sha256(skill_md).hexdigest()}
    assert fp["skills_digest"] == tree_digest(lock.skills_dir)
    instructions = (lock.path / "instructions.md").read_bytes()
    assert fp["instructions_digest"] == hashlib.sha256(instructions).hexdigest()
    assert fp["solve_rate"] == pytest.approx(0.25)
    # Every key the pin set pins was reported, and matched.
    compared = check_drift(harness_fingerprint(lock, lock.model), fp, {}, {})
    assert not compared and compared.unreported == ()
    assert all(e.get("standin") is True for e in run.events)
    assert run.tokens_in > 0 and run.tokens_out > 0
    patch = take_patch(clone, sha)
    assert "+    return a + b" in patch and "RESULT.md" not in patch
    assert result_file(ctx.out_dir).read_text().startswith("# calc")


@pytest.mark.needs_sandbox("bwrap")
def test_skills_changed_after_pinning_are_reported_as_seen_and_drift(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, rate=0.0, skill=SKILL)
    pinned = harness_fingerprint(lock, lock.model)
    # The copy the agent gets claims the pinned lock, but a skill was edited after pinning.
    changed = tmp_path / "changed"
    shutil.copytree(lock.path, changed)
    (changed / "skills" / "care" / "SKILL.md").write_text(SKILL + "Also rewrite everything.\n")
    clone, _ = make_clone(tmp_path)
    seed = seed_where(False, False, 0.25)
    run = StandinAgent().run(context(tmp_path, replace(lock, path=changed), clone, seed))
    assert run.error is None, run.output_tail
    drift = check_drift(pinned, run.fingerprint, {}, {})
    assert set(drift.harness) == {"harness", "skills_digest"}
    assert drift.harness["skills_digest"] == (
        tree_digest(lock.skills_dir),
        tree_digest(changed / "skills"),
    )
    assert drift.harness["harness"] == (lock.ref, f"{lock.name}@sha256:{tree_digest(changed)}")
    assert str(drift.summary()).startswith("harness: harness ")


@pytest.mark.needs_sandbox("bwrap")
def test_plugins_changed_after_pinning_are_drift(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, rate=0.0, plugin='{"name": "lint"}\n')
    pinned = harness_fingerprint(lock, lock.model)
    changed = tmp_path / "changed"
    shutil.copytree(lock.path, changed)
    (changed / "plugins" / "lint" / "plugin.json").write_text('{"name": "lint", "v": 2}\n')
    clone, _ = make_clone(tmp_path)
    run = StandinAgent().run(context(tmp_path, replace(lock, path=changed), clone, "s0"))
    assert run.error is None, run.output_tail
    assert check_drift(pinned, run.fingerprint, {}, {}).harness == {
        "harness": (lock.ref, f"{lock.name}@sha256:{tree_digest(changed)}"),
        "plugins_digest": (tree_digest(lock.plugins_dir), tree_digest(changed / "plugins")),
    }


@pytest.mark.needs_sandbox("bwrap")
def test_adapter_in_bwrap_retries_after_a_failed_check(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, rate=0.5)
    seed = seed_where(False, True, 0.5)
    clone, sha = make_clone(tmp_path)
    run = StandinAgent().run(context(tmp_path, lock, clone, seed))
    assert run.error is None, run.output_tail
    calls = [e for e in run.events if e["type"] == "tool_call"]
    assert [(c["tool"], c.get("revert"), c.get("exit_code")) for c in calls] == [
        ("edit", False, None),
        ("shell", None, 1),
        ("edit", True, None),
        ("edit", False, None),
        ("shell", None, 0),
    ]
    assert run.turns == 2 and run.events[-1]["applied"] == "fix"
    assert "+    return a + b" in take_patch(clone, sha)


@pytest.mark.needs_sandbox("bwrap")
def test_adapter_in_bwrap_gives_up_without_a_retry(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, rate=0.5)
    seed = seed_where(False, False, 0.5)
    clone, sha = make_clone(tmp_path)
    run = StandinAgent().run(context(tmp_path, lock, clone, seed))
    assert run.error is None and run.turns == 1, run.output_tail
    assert run.events[-1] == {
        "type": "result",
        "applied": "wrong",
        "turns": 1,
        "verify_exit_code": 1,
        "standin": True,
    }
    assert "abs(a - b)" in take_patch(clone, sha)


@pytest.mark.needs_sandbox("bwrap")
def test_adapter_sees_only_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEAK_PROBE_FOR_TEST", "do-not-leak")
    probe = 'test -z "${LEAK_PROBE_FOR_TEST+set}"'
    lock = make_lock(tmp_path, rate=1.0)
    clone, _ = make_clone(tmp_path)
    ctx = replace(context(tmp_path, lock, clone, "any"), verify=probe)
    run = StandinAgent().run(ctx)
    shell = next(e for e in run.events if e.get("tool") == "shell")
    assert shell["exit_code"] == 0, shell
