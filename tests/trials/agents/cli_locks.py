"""What the real-CLI adapter tests share: a frozen lock, a trial context, a one-task spec."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.environment.egress import NO_EGRESS
from hangar_dagster.experiment.harness import HarnessLock, freeze
from hangar_dagster.settings import Settings
from hangar_dagster.standins.model import Script, ScriptedEndpoint
from hangar_dagster.trials.agents import AgentContext, AgentRun, get_agent
from hangar_dagster.trials.model_proxy import EGRESS_NAME, log_entries, provider_failure
from hangar_dagster.trials.sandbox import get_sandbox
from tests.gitfixtures import make_clone

INSTRUCTIONS = "Harness rule: keep every diff minimal.\n"
SKILL = "---\nname: careful\ndescription: Read before editing.\n---\nRead the file first.\n"


# The task's own verify command (cli_context's), as the scripted model asks the agent to run it:
# its exit status and the `python` it found are printed where the trace keeps the tool's output.
VERIFY = "python -c 'import calc'"
VERIFY_PROBE = f'{VERIFY}; echo "verify exit $?"; command -v python'


def freeze_cli_lock(
    tmp_path: Path, name: str, agent: dict[str, str], model: str, **manifest: Any
) -> HarnessLock:
    """A lock in ``tmp_path/registry`` with ``INSTRUCTIONS`` and one skill, ``careful``.

    ``manifest`` adds harness.yaml fields (``approvals``, an adapter's own section).
    """
    src = tmp_path / f"{name}-src"
    (src / "skills" / "careful").mkdir(parents=True)
    config = {
        "name": name,
        "agent": agent,
        "model": model,
        "instructions": "instructions.md",
        **manifest,
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(config))
    (src / "instructions.md").write_text(INSTRUCTIONS)
    (src / "skills" / "careful" / "SKILL.md").write_text(SKILL)
    return freeze(src, tmp_path / "registry")


def cli_context(
    tmp_path: Path,
    lock: HarnessLock,
    workdir: Path,
    model: str,
    memory_mb: int = 4096,
    **fields: Any,
) -> AgentContext:
    """The context of trial ``v/calc/1`` (the calc clone's task); ``fields`` override any field."""
    values: dict[str, Any] = {
        "trial_key": "v/calc/1",
        "task_id": "calc",
        "seed": "exp:v/calc/1:1",
        "workdir": workdir,
        "harness": lock,
        "model": model,
        "instructions": "Make add() add.",
        "verify": VERIFY,
        "timeout_s": 120,
        "memory_mb": memory_mb,
        "sandbox": get_sandbox("bwrap"),
        "egress": NO_EGRESS,
        "out_dir": tmp_path / "agent-out",
        "settings": Settings.from_env(),  # read now: the test's HANGAR_AGENT_BIN_DIR and URLs
    }
    return AgentContext(**(values | fields))


def median_spec(
    example_dir: Path, tmp_path: Path, name: str, variants: dict[str, HarnessLock], memory_mb: int
) -> dict[str, Any]:
    """The example's spec cut to its ``median`` task, one trial per variant, one at a time.

    One trial at a time: the scripted endpoint's conversation is shared.
    """
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec.pop("baseline", None)  # the example's baseline names a variant this spec replaces
    spec.update(
        name=name,
        harness_repo=str(tmp_path / "registry"),
        tasks=[t for t in spec["tasks"] if t["id"] == "median"],
        variants={v: {"harness_lock": lock.ref} for v, lock in variants.items()},
        trials=1,
        parallel=1,
    )
    spec["environment"]["resources"] = {"timeout_s": 120, "memory_mb": memory_mb}
    return spec


def assert_verify_ran_as_in_verify(events: list[dict[str, Any]]) -> None:
    """The agent's run of ``VERIFY_PROBE`` exited 0 with the venv's ``python`` (the one the
    trial's verify step finds first on its PATH), not "command not found" (exit 127)."""
    results = [str(e.get("content")) for e in events if e["type"] == "tool_result"]
    probe = [r for r in results if "verify exit" in r]
    assert probe, f"no tool result of the verify probe in {results}"
    assert "verify exit 0" in probe[0], probe[0]
    assert str(Path(sys.prefix) / "bin" / "python") in probe[0], probe[0]


def real_cli_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bin_dir: Path, key_var: str, key: str
) -> None:
    """A home of its own, the CLI found in ``bin_dir``, the provider key in ``key_var``."""
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(bin_dir))
    monkeypatch.setenv(key_var, key)


FAULTS = [
    ("503", "provider_5xx"),
    ("429", "rate_limit"),
    ("401", "auth"),
    ("cut", "provider_stream"),
    ("malformed", "provider_stream"),
]


def run_against(
    adapter: str,
    bin_dir: Path,
    lock: HarnessLock,
    script: Script,
    model: str,
    base_url_var: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: str | None = None,
    memory_mb: int = 4096,
) -> tuple[AgentRun, str, float]:
    """``adapter``'s real CLI (found in ``bin_dir``) on a fresh calc clone against the scripted
    endpoint (failing as ``fault``): its run, the model proxy's log (what trial._finish
    classifies from) and the seconds it took."""
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(bin_dir))
    clone = make_clone(tmp_path)[0]
    with ScriptedEndpoint(script, model) as endpoint:
        endpoint.fault = fault
        monkeypatch.setenv(base_url_var, endpoint.base_url)
        ctx = cli_context(tmp_path, lock, clone, model, memory_mb)  # reads the endpoint's URL
        started = time.monotonic()
        run = get_agent(adapter).run(ctx)
        elapsed = time.monotonic() - started
    return run, (ctx.out_dir / EGRESS_NAME).read_text(), elapsed


def assert_named_by_the_proxy(run: AgentRun, log: str, elapsed: float, reason: str) -> None:
    """The CLI failed, the proxy's log names ``reason`` (what trial._finish decides from, over
    the CLI's exit), and a dead provider held it under 60 s."""
    assert run.error is not None, run.output_tail
    found = provider_failure(log)
    assert found is not None and found[0] == reason, (found, run.error)
    assert elapsed < 60, f"{elapsed:.0f}s against a dead provider"


# A lock that lets its CLI make no retry of its own, and what the proxy then saw.
NO_RETRIES = {"max_retries": 0, "timeout_s": 30}


def failed_answers(egress_text: str) -> int:
    """How many 5xx answers the model proxy passed on (its own lines, not the egress proxy's)."""
    return sum(
        1
        for e in log_entries(egress_text)
        if e.get("source") != "egress-proxy"
        and isinstance(e.get("status"), int)
        and e["status"] >= 500
    )
