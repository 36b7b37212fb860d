"""Issue 15 item 5 end to end: the real shadow sensor over a local repository to which the
test adds merges; dropped merges say why, kept ones become graded shadow trials."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from hangar_dagster.experiment.submit import load_resolved
from hangar_dagster.orchestration.definitions import build_definitions
from hangar_dagster.orchestration.driver import drive
from hangar_dagster.queue.starts import blocker
from hangar_dagster.queue.window import parse_window
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from hangar_dagster.util.gitrepo import git
from tests import factories as f
from tests.conftest import hangar
from tests.shadowfixtures import Mainline, hidden_test, standin_candidate
from tests.stall import Stall

pytestmark = pytest.mark.integration


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, name: str) -> dg.SensorExecutionData:
    """One evaluation of a real sensor of ``defs``, as the daemon runs it."""
    sensor = defs.resolve_sensor_def(name)
    with dg.build_sensor_context(
        instance=instance, repository_def=defs.get_repository_def(), resources=defs.resources
    ) as context:
        return sensor.evaluate_tick(context)


def skip(data: dg.SensorExecutionData) -> str:
    return data.skip_message or ""


def test_the_sensor_shadows_new_merges_and_grades_the_kept_ones(
    tmp_path: Path,
    hangar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    repo = Mainline(tmp_path)
    start = repo.head()
    # The merges are made first and main is put back, so that the candidate's playbook can
    # name their tasks; the test lands them on main after the policy is registered.
    docs = repo.merge("Document calc", {"README.md": "calc: add, sub, neg, double\n"})
    fix_add = repo.fix_add()
    fix_sub = repo.fix_sub()
    base_passes = repo.merge(
        "Test neg",  # neg was right already: its new test passes without the change
        {
            "calc.py": repo.calc("def neg(a):\n", "def neg(a):  # unary minus\n"),
            "tests/test_neg.py": hidden_test("neg", "assert neg(2) == -2"),
        },
    )
    reference_fails = repo.merge(
        "Fix double",  # the merged change does not make its own test pass
        {
            "calc.py": repo.calc("return a * 3", "return a * 4"),
            "tests/test_double.py": hidden_test("double", "assert double(2) == 4"),
        },
    )
    over_cap = repo.squash(
        "Fix double again",
        {
            "calc.py": repo.calc("return a * 4", "return a * 2"),
            "tests/test_double.py": hidden_test("double", "assert double(3) == 6"),
        },
    )
    git("branch", "landed", cwd=repo.path)
    git("reset", "-q", "--hard", start, cwd=repo.path)

    # The candidate fixes add, and gets sub wrong.
    registry, lock = standin_candidate(
        tmp_path,
        {
            f"m-{fix_add[:12]}": {
                "fix": [{"file": "calc.py", "find": "return a - b", "replace": "return a + b"}],
                "wrong": [],
            },
            f"m-{fix_sub[:12]}": {
                "fix": [
                    {
                        "file": "calc.py",
                        "find": "return a + b\n\n\ndef neg",
                        "replace": "return a * b\n\n\ndef neg",
                    }
                ],
                "wrong": [],
            },
        },
    )
    policy = tmp_path / "shadow.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "name": "calc",
                "repo": "mainline",
                "mainline": "main",
                "harness_lock": lock,
                "harness_repo": str(registry),
                "sample_rate": 1.0,
                "max_per_night": 4,
                "grader": {"command": "hangar-grade pytest -q"},
            }
        )
    )
    said = hangar("shadow", "register", str(policy), home=hangar_home)
    assert said.returncode == 0, said.stderr
    assert f"from {start[:12]}" in said.stdout

    webserver = Stall()  # a webserver started elsewhere (HANGAR_WEBSERVER_URL)
    request.addfinalizer(webserver.close)
    monkeypatch.setenv("HANGAR_WEBSERVER_URL", webserver.url)
    settings = Settings.from_env()
    defs = build_definitions(settings)
    with dg.instance_for_test() as instance:
        assert "no new merge on main" in skip(tick(defs, instance, "shadow_merges"))
        git("merge", "-q", "--ff-only", "landed", cwd=repo.path)  # the merges land
        said_tick = skip(tick(defs, instance, "shadow_merges"))
        assert (
            "calc: 6 new merge(s) on main, 4 kept; submitted 4 as experiment shadow_calc_"
            in said_tick
        )
        # The webserver started elsewhere is asked to load the new experiment, in the background.
        deadline = time.monotonic() + 30
        while b"reloadRepositoryLocation" not in webserver.received:
            assert time.monotonic() < deadline, "the sensor never asked for a reload"
            time.sleep(0.2)
        # A tick evaluated again looks from the moved cursor: nothing is submitted twice.
        assert "no new merge on main" in skip(tick(defs, instance, "shadow_merges"))

        [exp_id] = [e.name for e in settings.paths.experiments.iterdir() if e.is_dir()]
        exp = load_resolved(settings.paths, exp_id)
        assert exp.shadow is not None
        assert set(exp.shadow.merges.values()) == {fix_add, fix_sub, base_passes, reference_fails}
        assert exp.variants["candidate"].environment.egress.mode == "none"
        # Driven by the daemon like any experiment: its first stage is requested once loaded,
        # and a closed eval window holds its trials back.
        loaded = build_definitions(settings)
        [request] = tick(loaded, instance, "experiment_driver").run_requests or []
        assert request.job_name == f"{exp_id}__pin_sets_job"

    store = Store(settings.paths)
    # Its trials are eval work like any: outside the window they wait, saying so.
    at = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    closed = blocker(exp, store, f.settings(parse_window("03:00-04:00", "UTC")), at)
    assert closed is not None and closed.startswith("eval_window")
    drive(exp, store, settings, say=lambda _: None)

    status = hangar("shadow", "status", "calc", "--json", home=hangar_home)
    assert status.returncode == 0, status.stderr
    out = json.loads(status.stdout)
    merges = {m["sha"]: m for m in out["merges"]}
    assert {sha: (m["state"], m["reason"]) for sha, m in merges.items()} == {
        docs: ("dropped", "no_test_changes"),
        fix_add: ("passed", None),
        fix_sub: ("failed", None),
        base_passes: ("dropped", "base_passes"),
        reference_fails: ("dropped", "reference_fails"),
        over_cap: ("dropped", "over_cap"),
    }
    assert "hidden tests pass on base" in merges[base_passes]["detail"]
    rate = out["pass_rate"]
    assert rate["merges"] == 2 and rate["pts"] == 50.0
    assert rate["low_pts"] < 50.0 < rate["high_pts"]

    # The trials carry where they came from, in the store, `get` and the export.
    trials = {t.shadow_of: t for t in store.trials(exp_id)}
    assert set(trials) == {fix_add, fix_sub}
    assert {t.source for t in trials.values()} == {"shadow"}
    got = hangar("experiment", "get", exp_id, "--json", home=hangar_home)
    index = {r["shadow_of"]: r for r in json.loads(got.stdout)["trials"]}
    assert index[fix_add]["source"] == "shadow" and index[fix_add]["passed"] is True
    assert index[fix_sub]["passed"] is False
    assert json.loads(got.stdout)["shadow"]["policy"] == "calc"
    shown = hangar("experiment", "get", exp_id, home=hangar_home).stdout
    assert f"shadow of {fix_add[:12]}" in shown
    exported = hangar("experiment", "export", exp_id, "-o", str(tmp_path / "out"), home=hangar_home)
    assert exported.returncode == 0, exported.stderr
    attempts = json.loads((tmp_path / "out" / "index.json").read_text())["attempts"]
    assert {(a["source"], a["shadow_of"]) for a in attempts} == {
        ("shadow", fix_add),
        ("shadow", fix_sub),
    }
    report = (tmp_path / "out" / "report.html").read_text()
    assert f"shadow of {fix_add}" in report and f"shadow of {fix_sub}" in report
    # They count against the eval budget like any trial.
    assert len(store._query("SELECT * FROM budget_ledger WHERE experiment_id = ?", [exp_id])) == 2
    human = hangar("shadow", "status", "calc", home=hangar_home).stdout
    assert "base_passes" in human and "pass rate over the sampled merges: 50" in human

    listed = json.loads(hangar("shadow", "list", "--json", home=hangar_home).stdout)
    assert [(x["name"], x["cursor"], x["merges_seen"], x["merges_kept"]) for x in listed] == [
        ("calc", over_cap, 6, 4)
    ]
    assert hangar("shadow", "remove", "calc", home=hangar_home).returncode == 0
    gone = hangar("shadow", "status", "calc", home=hangar_home)
    assert gone.returncode == 2 and "no shadow 'calc'" in gone.stderr
    assert hangar("experiment", "get", exp_id, home=hangar_home).returncode == 0  # it stays
    policy.write_text(yaml.safe_dump({"name": "calc", "repo": "mainline", "sample_rate": 2}))
    refused = hangar("shadow", "register", str(policy), home=hangar_home)
    assert refused.returncode == 2
    assert "harness_lock" in refused.stderr and "sample_rate" in refused.stderr
