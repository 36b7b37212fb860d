"""The trial runner end to end: a real repo, a frozen harness lock, the command adapter in bwrap."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.environment import build
from hangar_dagster.environment.egress import egress_lines
from hangar_dagster.environment.mirror import Mirror
from hangar_dagster.experiment.harness import freeze
from hangar_dagster.experiment.plan import (
    ResolvedExperiment,
    ResolvedTask,
    ResolvedVariant,
    TrialKey,
)
from hangar_dagster.experiment.spec import Environment, ExperimentSpec
from hangar_dagster.results.records import TrialRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.trials.canary import MASK
from hangar_dagster.trials.trial import TrialRequest, _live_tokens, run_trial
from tests.buildfixtures import local_index
from tests.gitfixtures import Upstream

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]
__all__ = ["local_index"]  # the fixture: builds install from a local wheel index (buildfixtures)

CANARY = "HANGAR-CANARY-0123456789abcdef0123456789abcdef"
FIX = "sed -i 's/a - b/a + b/' calc.py"
VERIFY = "python -c 'import calc; assert calc.add(2, 3) == 5'"
TURN = (
    """printf '%s\\n' '{"type": "turn"}' '{"type": "usage", "tokens_in": 7, "cost_usd": 0.1}' """
    '>> "$HANGAR_TRACE_OUT"'
)
KEY = TrialKey("v1", "calc", 1)


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    return Upstream(tmp_path)


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HangarPaths:
    home = tmp_path / "hangar-home"
    monkeypatch.setenv("HANGAR_HOME", str(home))
    return HangarPaths(home)


def settings() -> Settings:
    """The settings of the test's environment (its HANGAR_HOME), read now."""
    return Settings.from_env()


def experiment(
    tmp_path: Path,
    upstream: Upstream,
    command: str,
    *,
    timeout_s: int = 60,
    environment: dict[str, Any] | None = None,
    base_sha: str | None = None,
    verify: str | None = VERIFY,
) -> ResolvedExperiment:
    src = tmp_path / "harness-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    manifest = {
        "name": "fixer",
        "agent": {"adapter": "command", "cli": "fixer-cli", "version": "1.0", "command": command},
        "model": "fixer-model-2025-01-01",
        "instructions": "instructions.md",
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    (src / "instructions.md").write_text("Keep it small.\n")
    lock = freeze(src, tmp_path / "registry")
    resources = {"timeout_s": timeout_s, "memory_mb": 1024}
    env = Environment.model_validate({"resources": resources, **(environment or {})})
    spec = ExperimentSpec.model_validate(
        {
            "name": "calc-exp",
            "tasks": [
                {
                    "id": "calc",
                    "instructions": "Make add() add.",
                    "repo": str(upstream.path),
                    "base": upstream.base,
                }
            ],
            "variants": {"v1": {"harness_lock": lock.ref}},
            "grader": {"canary": CANARY},
        }
    )
    task = ResolvedTask(
        id="calc",
        instructions="Make add() add.",
        repo=str(upstream.path),
        base_sha=base_sha or upstream.base,
        verify=verify,
        reference_patch=None,
        hidden_files={},
    )
    variant = ResolvedVariant(
        name="v1",
        harness_lock=lock.ref,
        harness_digest=lock.digest,
        harness_path=str(lock.path),
        adapter="command",
        model="fixer-model-2025-01-01",
        environment=env,
        environment_digest="sha256:env-test",
        tasks=("calc",),
        pin_set="pin-test",
    )
    return ResolvedExperiment(
        experiment_id="exp-test",
        name="calc-exp",
        author="tester",
        spec_path=str(tmp_path / "spec.yaml"),
        submitted_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
        spec=spec,
        tasks={"calc": task},
        variants={"v1": variant},
        grader_digest="sha256:grader-test",
    )


def trial(exp: ResolvedExperiment, paths: HangarPaths, attempt: int = 1) -> tuple[TrialRecord, str]:
    record, patch = run_trial(TrialRequest(exp, KEY, attempt, None, "run-1"), settings())
    # The scratch dir is gone, whatever the outcome (grading/ holds the pristine clones).
    assert [p.name for p in paths.work.iterdir() if p.name != "grading"] == []
    return record, patch


@pytest.mark.parametrize(
    "backend",
    [
        "bwrap",
        pytest.param(
            "unshare",
            marks=pytest.mark.needs_sandbox("unshare"),
        ),
    ],
)
def test_completed_trial_writes_its_artifacts(
    backend: str, tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    command = f"{FIX} && {TURN} && echo fixed it"
    exp = experiment(tmp_path, upstream, command, environment={"sandbox": backend})
    record, patch = trial(exp, paths)
    assert record.outcome_class == "completed", record.error
    assert record.infra_reason is None and record.error is None
    assert "+    return a + b" in patch and record.changed_files == ["calc.py"]
    assert (
        record.agent_exit_code == 0
        and record.verify_passed is True
        and record.verify_exit_code == 0
    )
    assert (record.turns, record.tokens_in, record.cost_usd) == (1, 7, 0.1)
    assert not record.agent_is_standin and record.trace["agent_is_standin"] is False
    art = Path(record.artifacts_dir)
    assert art == paths.trial_artifacts("exp-test", KEY.key, 1)
    assert sorted(p.name for p in art.iterdir()) == [
        "agent.log",
        "manifest.json",
        "patch.diff",
        "patch.raw.diff",
        "started.json",
        "trace.json",
        "verify.log",
    ]
    assert (art / "patch.diff").read_text() == patch
    assert "fixed it" in (art / "agent.log").read_text()
    assert "verify: exit 0" in (art / "verify.log").read_text()
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest == record.manifest
    assert manifest["task"] == {"id": "calc", "repo": str(upstream.path), "base_sha": upstream.base}
    assert manifest["harness_lock"] == exp.variants["v1"].harness_lock
    assert manifest["sandbox"]["backend"] == backend and manifest["sandbox"]["version"]
    assert manifest["environment"]["resources"]["timeout_s"] == 60
    assert manifest["agent"] == "command" and manifest["agent_is_standin"] is False
    trace = json.loads((art / "trace.json").read_text())
    assert trace == record.trace
    assert trace["verify"]["passed"] is True and trace["outcome_class"] == "completed"
    assert trace["fingerprint"]["cli"] == "fixer-cli" and trace["canary_seen_in"] == []


def test_the_canary_is_masked_in_every_artifact(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    command = (
        f"{FIX} && echo '# {CANARY}' >> calc.py && echo 'saw {CANARY}' && "
        f"""printf '%s\\n' '{{"type": "turn", "note": "{CANARY}"}}' >> "$HANGAR_TRACE_OUT" && """
        f"echo 'result {CANARY}' > /out/RESULT.md"
    )
    record, patch = trial(experiment(tmp_path, upstream, command), paths)
    assert record.outcome_class == "completed", record.error
    assert CANARY in patch  # the raw patch is returned as the agent made it
    art = Path(record.artifacts_dir)
    # Only the grader's copy keeps the agent's bytes: owner-only, never exported or shown.
    raw = art / "patch.raw.diff"
    assert raw.read_text() == patch and raw.stat().st_mode & 0o777 == 0o600
    for f in art.iterdir():
        assert f == raw or CANARY not in f.read_text(), f.name
    assert MASK in (art / "patch.diff").read_text()
    assert MASK in (art / "agent.log").read_text()
    assert MASK in (art / "RESULT.md").read_text()
    assert CANARY not in record.model_dump_json()
    assert record.trace["canary_seen_in"] == ["RESULT.md", "agent.log", "patch", "trace"]


def test_the_clone_holds_the_base_and_nothing_later(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    probe = (
        "{ "
        f"git cat-file -e {upstream.later} && echo LATER-REACHABLE; "
        f"git cat-file -e {upstream.answer_blob} && echo ANSWER-REACHABLE; "
        "echo commits $(git log --all --format=%H | wc -l); "
        "echo remotes $(git remote | wc -l) tags $(git tag | wc -l); "
        "echo refs $(git for-each-ref | wc -l); "
        "git log --all --format=%H; "
        "} > /out/RESULT.md 2>/dev/null"
    )
    record, _ = trial(experiment(tmp_path, upstream, probe), paths)
    assert record.outcome_class == "empty_patch", record.error
    seen = (Path(record.artifacts_dir) / "RESULT.md").read_text()
    assert "REACHABLE" not in seen
    assert "commits 1" in seen and "remotes 0 tags 0" in seen and "refs 1" in seen
    assert upstream.base in seen and upstream.later not in seen


def test_a_clone_the_agent_overwrote_leaves_the_next_trials_clone_whole(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    # Trials copy one pristine clone per (repo, base) kept under the work dir: the copy's files
    # are the agent's own (no shared inode), and the pristine clone is out of the sandbox's sight.
    pristine = paths.work / "grading" / "pristine"
    vandal = (
        'chmod -R u+w .git && find .git -type f | while read -r f; do echo x > "$f"; done; '
        f"test ! -e {pristine} && {FIX}"
    )
    first, _ = trial(experiment(tmp_path, upstream, vandal), paths, attempt=1)
    assert first.outcome_class == "completed", first.error
    assert [p.name for p in pristine.iterdir()], "the trial did not use the pristine clone"
    whole = f"git fsck --strict --no-dangling && git cat-file -e {upstream.base} && {FIX}"
    second, patch = trial(experiment(tmp_path, upstream, whole), paths, attempt=2)
    assert second.outcome_class == "completed", second.error
    assert "+    return a + b" in patch


def test_git_config_written_by_the_agent_does_not_run_on_the_host(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    pwned = tmp_path / "pwned"
    command = f"{FIX} && git config core.fsmonitor 'touch {pwned}; false'"
    record, patch = trial(experiment(tmp_path, upstream, command), paths)
    assert record.outcome_class == "completed", record.error
    assert "+    return a + b" in patch
    assert not pwned.exists()


def test_empty_patch(tmp_path: Path, upstream: Upstream, paths: HangarPaths) -> None:
    record, patch = trial(experiment(tmp_path, upstream, "echo nothing to do"), paths)
    assert record.outcome_class == "empty_patch"
    assert patch == "" and record.patch_bytes == 0 and record.verify_passed is False
    assert (Path(record.artifacts_dir) / "patch.diff").read_text() == ""


def test_agent_error(tmp_path: Path, upstream: Upstream, paths: HangarPaths) -> None:
    record, patch = trial(experiment(tmp_path, upstream, f"{FIX}; echo broke >&2; exit 4"), paths)
    assert record.outcome_class == "agent_error"
    assert (
        record.agent_exit_code == 4 and record.error is not None and "code 4: broke" in record.error
    )
    assert "+    return a + b" in patch  # what it changed is still recorded


def test_timeout(tmp_path: Path, upstream: Upstream, paths: HangarPaths) -> None:
    record, _ = trial(experiment(tmp_path, upstream, "sleep 60", timeout_s=1, verify=None), paths)
    assert record.outcome_class == "timeout"
    assert record.agent_exit_code is None and record.duration_s < 30
    assert record.verify_passed is None


def test_build_output_is_not_part_of_the_patch(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths, local_index: Path
) -> None:
    env: dict[str, Any] = {"build": ["echo built > build.txt"]}
    record, patch = trial(
        experiment(tmp_path, upstream, f"test -f build.txt && {FIX}", environment=env), paths
    )
    assert record.outcome_class == "completed", record.error
    assert record.changed_files == ["calc.py"]
    assert "build: exit 0" in (Path(record.artifacts_dir) / "build.log").read_text()


def test_trials_of_one_task_share_one_build_and_the_agent_runs_in_its_venv(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths, local_index: Path
) -> None:
    env: dict[str, Any] = {"build": ["echo built > build.txt"]}
    # The agent's python is the build's venv (VIRTUAL_ENV set, first on PATH), and the clone
    # is also at the build's repo path, where an editable install points.
    agent = (
        'test "$(command -v python)" = "$VIRTUAL_ENV/bin/python" && '
        'test -f "$(dirname "$VIRTUAL_ENV")/repo/build.txt" && ' + FIX
    )
    exp = experiment(tmp_path, upstream, agent, environment=env)
    first, _ = trial(exp, paths, attempt=1)
    second, _ = trial(exp, paths, attempt=2)
    assert first.outcome_class == second.outcome_class == "completed", (first.error, second.error)
    assert first.build_digest == second.build_digest and first.build_digest
    key = first.build_digest.removeprefix("sha256:")[:24]
    assert build.BUILDS_RUN[key] == 1  # the second trial found the cache
    assert second.build_s is not None and second.build_s < 1.0


def test_without_a_build_the_agent_and_verify_run_in_the_runner_environment(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    # Issue 18: hangar's own packages (pyyaml, pydantic, dagster) never reach a trial's python;
    # the runner environment's pytest does, so a task's verify still runs.
    probe = "import importlib.util as u, sys; assert not any(u.find_spec(m) for m in ('yaml', 'pydantic', 'dagster')), sys.path; import pytest"  # fmt: skip
    agent = (
        f'test "$(command -v python)" = "$VIRTUAL_ENV/bin/python" && python -c "{probe}" && ' + FIX
    )
    verify = f'python -c "{probe}" && python -m pytest -q -p no:cacheprovider --version'
    record, _ = trial(experiment(tmp_path, upstream, agent, verify=verify), paths)
    assert record.outcome_class == "completed", record.error
    assert record.verify_passed is True and record.verify_exit_code == 0
    assert record.build_digest is None  # nothing was built: the runner environment is no build


def test_verify_reads_the_runner_environments_bytecode_and_writes_none(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    # Verify runs after the patch is taken, so it needs no pycache prefix (which makes Python
    # ignore every compiled module and compile pytest afresh, ~1.7 CPU s per run): it loads the
    # runner's pycs, still writes no bytecode, and the patch carries none.
    probe = (
        "import os, sys, pytest; assert sys.pycache_prefix is None, sys.pycache_prefix; "
        "assert sys.dont_write_bytecode; assert os.path.isfile(pytest.__spec__.cached)"
    )
    verify = f'python -c "{probe}" && python -c "import calc"'
    record, patch = trial(experiment(tmp_path, upstream, FIX, verify=verify), paths)
    assert record.outcome_class == "completed", record.error
    log = (Path(record.artifacts_dir) / "verify.log").read_text()
    assert record.verify_passed is True, log
    assert ".pyc" not in patch and "__pycache__" not in patch


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("no_bwrap", "sandbox_create"),
        ("egress", "egress_unsupported"),
        ("bad_base", "clone"),
        ("tampered_lock", "harness"),
        ("failing_build", "build"),
    ],
)
def test_infra_errors_are_records(
    setup: str,
    reason: str,
    tmp_path: Path,
    upstream: Upstream,
    paths: HangarPaths,
    monkeypatch: pytest.MonkeyPatch,
    local_index: Path,
) -> None:
    environment: dict[str, Any] | None = None
    if setup == "egress":
        # An egress policy hangar cannot give: the mirror it names is no package index.
        environment = {"egress": {"mode": "allowlist"}}
        monkeypatch.setenv("HANGAR_PACKAGE_MIRROR_URL", "ftp://mirror.invalid/simple/")
    if setup == "failing_build":
        environment = {"build": ["exit 9"]}
    exp = experiment(
        tmp_path,
        upstream,
        FIX,
        environment=environment,
        base_sha="0" * 40 if setup == "bad_base" else None,
    )
    if setup == "no_bwrap":
        empty = tmp_path / "bin-without-bwrap"
        empty.mkdir()
        monkeypatch.setenv("PATH", str(empty))
    if setup == "tampered_lock":
        Path(exp.variants["v1"].harness_path, "instructions.md").write_text(
            "changed after freezing\n"
        )
    record, patch = trial(exp, paths)
    assert record.outcome_class == "infra_error"
    assert record.infra_reason == reason
    assert record.error
    assert patch == ""
    art = Path(record.artifacts_dir)
    assert json.loads((art / "trace.json").read_text())["infra_reason"] == reason
    assert json.loads((art / "manifest.json").read_text())["trial_key"] == KEY.key


def test_attempts_get_their_own_artifacts(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths
) -> None:
    exp = experiment(tmp_path, upstream, FIX)
    first, _ = trial(exp, paths, attempt=1)
    second, _ = run_trial(TrialRequest(exp, KEY, 2, "run-1", "run-2"), settings())
    assert first.artifacts_dir != second.artifacts_dir
    assert (
        Path(first.artifacts_dir, "patch.diff").is_file()
        and Path(second.artifacts_dir, "patch.diff").is_file()
    )
    assert second.retry_of == "run-1" and second.manifest["retry_of"] == "run-1"


@pytest.mark.slow
@pytest.mark.needs_sandbox("bwrap")
@pytest.mark.parametrize("mode", ["none", "allowlist", None])
def test_the_agent_installs_from_the_mirror_as_its_egress_policy_says(
    mode: str | None,
    tmp_path: Path,
    upstream: Upstream,
    paths: HangarPaths,
    monkeypatch: pytest.MonkeyPatch,
    package_mirror: tuple[Settings, Mirror],
) -> None:
    """Regression: any egress but none was an infra_error (no proxy); unset now means allowlist."""
    monkeypatch.setenv("HANGAR_PACKAGE_MIRROR_URL", package_mirror[1].index_url)
    pip = (
        f"{sys.executable} -m pip install -q --no-deps --retries 0 --timeout 10 "
        "--target /tmp/site six==1.16.0"
    )
    command = f"{pip} && echo SIX-INSTALLED; {FIX}"
    environment = {"egress": {"mode": mode}} if mode else None
    record, _ = trial(experiment(tmp_path, upstream, command, environment=environment), paths)
    assert record.outcome_class == "completed", record.error
    assert record.drift is None  # the policy it ran under is the one pinned
    art = Path(record.artifacts_dir)
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["environment"]["egress"]["mode"] == (mode or "allowlist")
    agent_log = (art / "agent.log").read_text()
    if mode == "none":
        assert "SIX-INSTALLED" not in agent_log
        assert not (art / "egress.jsonl").exists()  # no proxy ran, so nothing to log
        return
    assert "SIX-INSTALLED" in agent_log, agent_log
    lines = egress_lines((art / "egress.jsonl").read_text())
    assert lines and all(e["verdict"] == "allowed" and e["policy"] == "allowlist" for e in lines)
    assert any(e["url"].endswith("six-1.16.0-py2.py3-none-any.whl") for e in lines)


def test_a_running_trials_model_answers_reach_the_tally_only_under_a_tpm_budget(
    tmp_path: Path, upstream: Upstream, paths: HangarPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = experiment(tmp_path, upstream, FIX)
    request = TrialRequest(exp, KEY, 1, None, "run-1")
    assert _live_tokens(request, settings()) is None  # no budget: nothing is counted live
    monkeypatch.setenv("HANGAR_EVAL_TPM_BUDGET", "10000")
    count = _live_tokens(request, settings())
    assert count is not None
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    count(420)  # as the model proxy calls it, per answer
    count(80)
    assert Store(paths).tokens_since(since) == 500
