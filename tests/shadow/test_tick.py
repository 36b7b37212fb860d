"""The shadow sensor's body without Dagster: submit, cursor, a crash between them, refusals,
and what ``status`` makes of the base checks' verdicts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.catalog import DAEMON_MARKER
from hangar_dagster.experiment.submit import load_resolved
from hangar_dagster.queue.window import parse_window
from hangar_dagster.results.records import ExperimentRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from hangar_dagster.shadow.policy import (
    STATE,
    load_policy,
    policy_dir,
    read_state,
    register,
)
from hangar_dagster.shadow.status import merge_rows, shadow_rate
from hangar_dagster.shadow.tick import LAST_ERROR, SUBMIT_REFUSED, night_of, tick, tick_policy
from tests import factories as f
from tests.shadowfixtures import Mainline, hidden_test, standin_candidate

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 12, 3, 1, 30, tzinfo=dt.UTC)


def registered_shadow(tmp_path: Path, settings: Settings, **kw: Any) -> Mainline:
    repo = Mainline(tmp_path)
    registry, lock = standin_candidate(tmp_path, {})
    data = {
        "name": "calc",
        "repo": "mainline",
        "harness_lock": lock,
        "harness_repo": str(registry),
        "sample_rate": 1.0,
        "max_per_night": 5,
    } | kw
    path = tmp_path / "shadow.yaml"
    path.write_text(yaml.safe_dump(data))
    register(load_policy(path), settings, NOW)
    return repo


def test_a_tick_submits_the_kept_merges_for_the_daemon_and_moves_the_cursor(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    sha = repo.fix_add()
    result = tick_policy(settings, "calc", NOW)
    assert result.experiment_id is not None
    exp = load_resolved(settings.paths, result.experiment_id)
    assert exp.shadow is not None and exp.shadow.merges == {f"m-{sha[:12]}": sha}
    assert exp.tasks[f"m-{sha[:12]}"].base_sha == git_parent(repo, sha)
    assert (settings.paths.experiment_dir(exp.experiment_id) / DAEMON_MARKER).exists()
    state = read_state(settings.paths, "calc")
    assert state.cursor == sha and [d.experiment_id for d in state.merges] == [exp.experiment_id]


def git_parent(repo: Mainline, sha: str) -> str:
    from hangar_dagster.util.gitrepo import git

    return git("rev-parse", f"{sha}^1", cwd=repo.path).strip()


def test_a_tick_cut_off_before_it_moved_the_cursor_does_not_submit_twice(tmp_path: Path) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    before = (policy_dir(settings.paths, "calc") / STATE).read_text()
    repo.fix_add()
    first = tick_policy(settings, "calc", NOW)
    # The crash: the experiment was submitted, the state not yet written.
    (policy_dir(settings.paths, "calc") / STATE).write_text(before)
    again = tick_policy(settings, "calc", NOW)
    assert again.experiment_id == first.experiment_id
    assert len([d for d in settings.paths.experiments.iterdir() if d.is_dir()]) == 1
    assert len(read_state(settings.paths, "calc").merges) == 1


def test_a_tick_cut_off_inside_submit_stores_the_experiment_row_on_the_next_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut off after the experiment's directory appeared, before its store rows: the next tick
    goes on with that experiment, stores its row and hands it to the daemon."""
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    repo.fix_add()
    restore = f.cut_off_before(monkeypatch, settings.paths, ExperimentRecord)
    with pytest.raises(f.CutOff):
        tick_policy(settings, "calc", NOW)
    [eid] = [d.name for d in settings.paths.experiments.iterdir() if not d.name.startswith(".")]
    assert Store(settings.paths).experiment(eid) is None
    restore()
    again = tick_policy(settings, "calc", NOW)
    assert again.experiment_id == eid
    row = Store(settings.paths).experiment(eid)
    assert row is not None and row.trials_planned == 1
    assert (settings.paths.experiment_dir(eid) / DAEMON_MARKER).exists()


def test_a_submit_the_budget_refuses_drops_the_merges_saying_why(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"HANGAR_HOME": str(tmp_path / "home"), "HANGAR_EVAL_BUDGET_USD_MONTH": "1"}
    )
    repo = registered_shadow(tmp_path, settings, trial_job_budget={"max_cost_usd": 5.0})
    repo.fix_add()
    result = tick_policy(settings, "calc", NOW)
    [d] = result.decisions
    assert result.experiment_id is None
    assert (d.kept, d.reason) == (False, SUBMIT_REFUSED)
    assert "team eval budget" in (d.detail or "")
    assert read_state(settings.paths, "calc").cursor == repo.head()  # not looked at again


def test_kept_merges_wait_for_the_window_and_a_days_merges_make_one_experiment(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env(
        {
            "HANGAR_HOME": str(tmp_path / "home"),
            "HANGAR_EVAL_WINDOW": "20:00-23:00",
            "HANGAR_EVAL_TZ": "UTC",
        }
    )
    repo = registered_shadow(tmp_path, settings)
    noon = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    a = repo.fix_add()
    first = tick_policy(settings, "calc", noon)
    assert first.experiment_id is None and "wait for the eval window" in first.said
    [row] = merge_rows(read_state(settings.paths, "calc"), Store(settings.paths))
    assert (row.state, row.reason) == ("queued", None) and "eval window" in (row.detail or "")
    b = repo.fix_sub()
    tick_policy(settings, "calc", noon + dt.timedelta(hours=1))
    assert not settings.paths.experiments.exists() or not any(settings.paths.experiments.iterdir())
    evening = tick_policy(settings, "calc", noon + dt.timedelta(hours=8, minutes=30))
    assert evening.experiment_id is not None and "submitted 2" in evening.said
    exp = load_resolved(settings.paths, evening.experiment_id)
    assert exp.shadow is not None and set(exp.shadow.merges.values()) == {a, b}
    state = read_state(settings.paths, "calc")
    assert {d.night for d in state.merges} == {"2026-12-03"}
    assert {d.experiment_id for d in state.merges} == {evening.experiment_id}


def test_the_night_is_the_date_the_window_opens_on() -> None:
    window = parse_window("20:00-00:15", "America/New_York")
    # 01:30 UTC on the 3rd is 20:30 on the 2nd in New York: inside the night of the 2nd.
    assert night_of(window, NOW) == "2026-12-02"
    # At noon New York time the window is shut: merges count towards that evening.
    assert night_of(window, dt.datetime(2026, 12, 3, 17, 0, tzinfo=dt.UTC)) == "2026-12-03"


def test_status_reads_the_base_check_and_the_graded_trial(tmp_path: Path) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    a = repo.fix_add()
    b = repo.fix_sub()
    eid = tick_policy(settings, "calc", NOW).experiment_id
    assert eid is not None
    store = Store(settings.paths)
    state = read_state(settings.paths, "calc")
    assert [r.state for r in merge_rows(state, store)] == ["queued", "queued"]
    assert shadow_rate(merge_rows(state, store)) is None
    store.put(f.base_check(f"m-{b[:12]}", experiment_id=eid, base_passed=True, invalid=True))
    store.put(f.base_check(f"m-{a[:12]}", experiment_id=eid))
    store.put(f.trial("candidate", f"m-{a[:12]}", 1, experiment_id=eid))
    store.put(f.grade("candidate", f"m-{a[:12]}", 1, experiment_id=eid, passed=True))
    rows = {r.sha: r for r in merge_rows(state, store)}
    assert (rows[a].state, rows[b].state, rows[b].reason) == ("passed", "dropped", "base_passes")
    rate = shadow_rate(list(rows.values()))
    assert rate is not None and rate.n_tasks == 1 and rate.pts == 100.0


def test_a_merge_landed_between_a_cut_off_tick_and_its_retry_is_submitted_not_stuck(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    before = (policy_dir(settings.paths, "calc") / STATE).read_text()
    a = repo.fix_add()
    first = tick_policy(settings, "calc", NOW)
    (policy_dir(settings.paths, "calc") / STATE).write_text(before)  # the crash
    b = repo.fix_sub()  # lands before the retry: not a task of the first experiment
    again = tick_policy(settings, "calc", NOW)
    state = {d.sha: d for d in read_state(settings.paths, "calc").merges}
    assert state[a].experiment_id == first.experiment_id
    second = state[b].experiment_id
    assert second is not None and second != first.experiment_id
    exp = load_resolved(settings.paths, second)
    assert exp.shadow is not None and exp.shadow.merges == {f"m-{b[:12]}": b}
    assert (settings.paths.experiment_dir(second) / DAEMON_MARKER).exists()
    assert again.experiment_id == second
    # Its row waits for its own experiment's trial, which that experiment plans.
    rows = {r.sha: r for r in merge_rows(read_state(settings.paths, "calc"), Store(settings.paths))}
    assert rows[b].experiment_id == second and rows[b].trial_key in {
        k.key for k in exp.trial_keys()
    }


def test_a_mainline_that_moves_back_and_forward_decides_a_merge_once(tmp_path: Path) -> None:
    from hangar_dagster.util.gitrepo import git

    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    start = repo.head()
    a = repo.fix_add()
    tick_policy(settings, "calc", NOW)
    git("reset", "-q", "--hard", start, cwd=repo.path)
    tick_policy(settings, "calc", NOW)
    git("reset", "-q", "--hard", a, cwd=repo.path)
    tick_policy(settings, "calc", NOW)
    state = read_state(settings.paths, "calc")
    assert [d.sha for d in state.merges] == [a] and state.cursor == a
    assert len([d for d in settings.paths.experiments.iterdir() if d.is_dir()]) == 1


def test_a_merge_whose_test_path_is_a_submodule_is_dropped_alone(tmp_path: Path) -> None:
    from hangar_dagster.util.gitrepo import git

    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    # A gitlink under tests/: a test path git cannot read as a file.
    repo.write({"calc.py": repo.calc("return a - b", "return a + b")})
    git("add", "calc.py", cwd=repo.path)
    gitlink = f"160000,{repo.head()},tests/vendored"
    git("update-index", "--add", "--cacheinfo", gitlink, cwd=repo.path)
    git("commit", "-q", "-m", "Vendor a test suite", cwd=repo.path)
    bad = repo.head()
    git("checkout", "-q", "--", ".", cwd=repo.path)
    good = repo.fix_sub()
    result = tick_policy(settings, "calc", NOW)
    state = {d.sha: d for d in read_state(settings.paths, "calc").merges}
    assert not state[bad].kept and state[bad].reason == "unreadable_tests"
    assert "tests/vendored" in (state[bad].detail or "")
    assert state[good].kept and state[good].experiment_id == result.experiment_id is not None
    assert read_state(settings.paths, "calc").cursor == good


def test_a_cursor_a_force_push_pruned_resets_to_the_tip_and_says_so(tmp_path: Path) -> None:
    from hangar_dagster.util.gitrepo import git

    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    start = repo.head()
    tick_policy(settings, "calc", NOW)
    repo.fix_add()
    tick_policy(settings, "calc", NOW)
    lost = read_state(settings.paths, "calc").cursor
    # The force-push: main rewritten from the start, the old commits gone from the repository.
    git("reset", "-q", "--hard", start, cwd=repo.path)
    git("branch", "-D", "feature-1", cwd=repo.path)
    git("reflog", "expire", "--expire=now", "--all", cwd=repo.path)
    git("gc", "-q", "--prune=now", cwd=repo.path)
    rewritten = repo.squash("Rewrite history", {"README.md": "calc, rewritten\n"})
    result = tick_policy(settings, "calc", NOW)
    state = read_state(settings.paths, "calc")
    assert state.cursor == rewritten and "reset" in result.said
    [reset] = state.resets
    assert (reset.lost, reset.to) == (lost, rewritten)
    after = repo.fix_sub()  # the policy goes on
    again = tick_policy(settings, "calc", NOW)
    assert again.experiment_id is not None
    assert read_state(settings.paths, "calc").merges[-1].sha == after


def test_a_bad_policy_does_not_stop_the_others(tmp_path: Path) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    broken = policy_dir(settings.paths, "aaa")
    broken.mkdir(parents=True)
    (broken / STATE).write_text("{not json")
    repo.fix_add()
    results = {r.policy: r for r in tick(settings, NOW)}
    assert results["calc"].experiment_id is not None
    assert "aaa" in results and "failed" in results["aaa"].said
    assert "aaa: failed" in (broken / LAST_ERROR).read_text()


def test_a_merge_too_big_to_inline_in_a_spec_is_submitted_beside_the_others(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    small = repo.fix_add()
    # Under the task bounds (2 MB of tests, 10 MiB of patch), over the 1 MiB of a spec file.
    cases = "".join(
        f"\n\ndef test_case_{i}():\n    assert add({i}, 1) == {i + 1}\n" for i in range(20000)
    )
    table = "".join(f"ROW_{i} = {i}\n" for i in range(40000))
    big = repo.merge(
        "Add a table and its cases",
        {"table.py": table, "tests/test_cases.py": "from calc import *\n" + cases},
    )
    assert len(cases) + len(table) > (1 << 20)
    result = tick_policy(settings, "calc", NOW)
    state = {d.sha: d for d in read_state(settings.paths, "calc").merges}
    assert state[small].experiment_id == state[big].experiment_id == result.experiment_id
    assert result.experiment_id is not None
    exp = load_resolved(settings.paths, result.experiment_id)
    task = exp.tasks[f"m-{big[:12]}"]
    assert task.hidden_files["tests/test_cases.py"].endswith(cases)
    assert task.reference_patch is not None and "+ROW_39999 = 39999" in task.reference_patch


def test_a_task_the_submit_refuses_is_dropped_alone_and_the_rest_submitted(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    good = repo.fix_add()
    # Its only test file is in a __pycache__ folder, which a hidden-tests folder leaves out:
    # the submit finds the task without hidden tests.
    cached = repo.merge(
        "Cache a test",
        {
            "calc.py": repo.calc("return -a", "return 0 - a"),
            "tests/__pycache__/test_neg.py": hidden_test("neg", "assert neg(1) == -1"),
        },
    )
    result = tick_policy(settings, "calc", NOW)
    state = {d.sha: d for d in read_state(settings.paths, "calc").merges}
    assert state[good].kept and state[good].experiment_id == result.experiment_id is not None
    assert (state[cached].kept, state[cached].reason) == (False, SUBMIT_REFUSED)
    assert "hidden_tests" in (state[cached].detail or "")
    exp = load_resolved(settings.paths, result.experiment_id)
    assert exp.shadow is not None and exp.shadow.merges == {f"m-{good[:12]}": good}


def test_a_policy_another_tick_is_looking_at_is_skipped(tmp_path: Path) -> None:
    import fcntl

    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings)
    repo.fix_add()
    with open(policy_dir(settings.paths, "calc") / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other evaluation, mid-tick
        busy = tick_policy(settings, "calc", NOW)
    assert busy.experiment_id is None and "another tick" in busy.said
    assert not settings.paths.experiments.exists() or not any(settings.paths.experiments.iterdir())
    assert tick_policy(settings, "calc", NOW).experiment_id is not None


def test_a_url_is_cloned_whole_or_not_at_all(tmp_path: Path) -> None:
    settings = Settings.from_env({"HANGAR_HOME": str(tmp_path / "home")})
    repo = registered_shadow(tmp_path, settings, repo=f"file://{tmp_path / 'mainline'}")
    where = policy_dir(settings.paths, "calc")
    # A clone killed mid-way leaves its temporary folder, never a mirror.git to fetch into.
    (where / ".mirror-killed").mkdir()
    (where / ".mirror-killed" / "HEAD").write_text("ref: refs/heads/main\n")
    sha = repo.fix_add()
    result = tick_policy(settings, "calc", NOW)
    assert result.experiment_id is not None, result.said
    assert (where / "mirror.git").is_dir() and not (where / ".mirror-killed").exists()
    assert read_state(settings.paths, "calc").cursor == sha
