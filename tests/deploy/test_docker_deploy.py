"""The Docker deployment (deploy/docker) end to end, for real: one bring-up shared by every case.

The images are built or found cached by their recipes (scripts/bootstrap prebuilds them), the
compose project is named uniquely (other engineers use the same engine), the host CLI submits
through the deployment's Postgres instance and reads the DuckLake store the run workers write
(catalog in the same Postgres, data on the shared directory). The last case brings everything
down and checks that nothing of the project is left: containers (the run workers too),
network, volume.

The spec is a lean subset of examples/skills-ab: its three tasks and two variants, one trial
each (6 trials; the whole example's 18 are the benchmark's, benchmarks/deploy_overhead.py),
on the Docker sandbox from the project image. The agent is the example's scripted stand-in;
the eval pool case's two long experiments run a `sleep 25` command harness instead (no model).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox.docker import MANAGED_LABEL, OWNER_LABEL, client
from tests.conftest import cli_env, command_agent_spec, copy_example, write_spec
from tests.deploy.compose import Deployment, up

pytestmark = [pytest.mark.slow, pytest.mark.needs_sandbox("docker")]

HANGAR = str(Path(sys.executable).with_name("hangar"))


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, docker_base_image: str
) -> Iterator[Deployment]:
    dep = up(tmp_path_factory.mktemp("deploy") / "shared")
    try:
        yield dep
    finally:
        dep.down()  # again: a no-op after the last case, the cleanup when a case failed first


@pytest.fixture(scope="module")
def example(deployment: Deployment) -> Path:
    """The example on the shared directory: run workers clone its task repos from there."""
    return copy_example(deployment.shared / "example")


def spec(example: Path, image: str, name: str, **changes: Any) -> Path:
    data = yaml.safe_load((example / "experiment.yaml").read_text())
    data["environment"]["sandbox"] = "docker"
    data["environment"]["image"] = image  # the project image: it carries hangar's runtime
    # Every trial runs: the module submits the example several times, and a later experiment
    # would otherwise reuse the earlier one's finished trials (nothing to kill, nothing to hold).
    data.update({"name": name, "trials": 1, "reuse": {"enabled": False}} | changes)
    path = example / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def median_plain(example: Path, image: str, name: str, parallel: int) -> Path:
    """``spec`` cut to the median task and the plain variant, 3 trials at ``parallel``."""
    data = yaml.safe_load((example / "experiment.yaml").read_text())
    return spec(
        example,
        image,
        name,
        tasks=[t for t in data["tasks"] if t["id"] == "median"],
        variants={"plain": data["variants"]["plain"]},
        baseline="plain",
        trials=3,
        parallel=parallel,
    )


def hangar_on(
    dep: Deployment, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HANGAR, *args], env=dep.host_env(), capture_output=True, text=True, timeout=timeout
    )


def submit(dep: Deployment, path: Path) -> str:
    """`hangar experiment run SPEC` on the host, queued for the deployment's daemon."""
    done = hangar_on(dep, "experiment", "run", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    return submitted(done.stdout)


def submitted(out: str) -> str:
    return out.split("submitted ")[1].split()[0]


def store_of(dep: Deployment) -> Store:
    return Store(Settings.from_env(dep.host_env()).paths)


def wait_complete(dep: Deployment, eid: str, timeout_s: float = 600) -> dict[str, Any]:
    """`hangar experiment get --json` once the store says every key is counted and graded."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = hangar_on(dep, "experiment", "get", eid, "--json")
        assert got.returncode == 0, got.stdout + got.stderr
        data: dict[str, Any] = json.loads(got.stdout)
        if data["queue"]["complete"]:
            return data
        if time.monotonic() > deadline:
            runs = stage_runs(dep, [eid])
            workers = client().api.containers(
                all=True, filters={"label": f"dagster/job_name={eid}__trials_job"}
            )
            tails = [client().api.logs(c["Id"], tail=80).decode()[-4000:] for c in workers]
            pytest.fail(
                f"{eid} not complete: {data['queue']}\nits trials runs: {runs}\n"
                f"its trials run workers' logs: {tails}\n{dep.logs()}"
            )
        dep.note_run_workers()
        time.sleep(5)


def wait_stage_run(dep: Deployment, eid: str, stage: str, timeout_s: float = 300) -> None:
    """Until a run of the experiment's STAGE has succeeded (read over GraphQL)."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = stage_runs(dep, [eid], stage)
        if any(r["status"] == "SUCCESS" for r in runs):
            return
        assert time.monotonic() < deadline, (stage, runs, dep.logs())
        time.sleep(2)


def figures(data: dict[str, Any]) -> dict[str, Any]:
    """What must agree between the deployment and the embedded default."""
    keep = ("trials", "passed", "graded", "pass_rate_pts", "completed", "infra_error")
    return {
        "summary": {s["variant"]: {k: s[k] for k in keep} for s in data["summary"]},
        "trials": {
            t["trial_key"]: (t["outcome_class"], t["verify_passed"], t["passed"])
            for t in data["trials"]
        },
    }


# Three or more stage runs, each a run worker container: 7-15 min at a load of 25-30 here.
@pytest.mark.timeout(1800)
def test_the_example_completes_on_the_deployment_with_the_embedded_figures(
    deployment: Deployment, example: Path, tmp_path: Path
) -> None:
    path = spec(example, deployment.image, "skills-ab-deploy")
    eid = submit(deployment, path)
    # The same spec on the embedded default (SQLite instance, embedded store, `run --wait`),
    # meanwhile: its figures are the reference.
    home = tmp_path / "embedded"
    embedded = subprocess.Popen(
        [HANGAR, "experiment", "run", str(path), "--wait"],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    on_deployment = wait_complete(deployment, eid)
    out, _ = embedded.communicate(timeout=600)
    assert embedded.returncode == 0, out
    reference = subprocess.run(
        [HANGAR, "experiment", "get", submitted(out), "--json"],
        env=cli_env(home),
        capture_output=True,
        text=True,
    )
    assert reference.returncode == 0, reference.stderr
    assert figures(on_deployment) == figures(json.loads(reference.stdout))
    assert len(on_deployment["trials"]) == 6
    # The rows are in the deployment's DuckLake, written by the run workers (not the host).
    store = store_of(deployment)
    rows = store.trials(eid)
    assert {r.manifest["sandbox"]["backend"] for r in rows} == {"docker"}
    assert len(store.grades(eid)) == 6
    # Every stage ran in a run worker container the launcher started, not on the host: three
    # runs, the trials run writing the index after the last grade, so it may still run here.
    wait_stage_run(deployment, eid, "trials")
    workers = deployment.note_run_workers()
    jobs = {
        client().api.inspect_container(w)["Config"]["Labels"]["dagster/job_name"] for w in workers
    }
    assert {f"{eid}__{s}_job" for s in ("pin_sets", "base_checks", "trials")} <= jobs


def test_the_asset_graph_and_a_run_read_over_graphql(deployment: Deployment) -> None:
    nodes = deployment.graphql("{ assetNodes { assetKey { path } dependencyKeys { path } } }")
    graph = {
        "/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in n["dependencyKeys"]}
        for n in nodes["assetNodes"]
    }
    (eid,) = {k.split("/")[0] for k in graph if k.startswith("skills_ab_deploy_")}
    assert graph[f"{eid}/grades"] >= {f"{eid}/trials"}
    assert f"{eid}/index" in graph
    runs = deployment.graphql(
        """query($eid: String!) { runsOrError(filter: {tags: [{key: "hangar/experiment",
        value: $eid}, {key: "hangar/stage", value: "trials"}]}) { ... on Runs { results {
        runId status tags { key value } } } } }""",
        {"eid": eid},
    )["runsOrError"]["results"]
    assert runs and all(r["status"] == "SUCCESS" for r in runs), runs
    run = deployment.graphql(
        """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { jobName status
        stats { ... on RunStatsSnapshot { stepsSucceeded stepsFailed } } } } }""",
        {"id": runs[0]["runId"]},
    )["runOrError"]
    assert run["jobName"] == f"{eid}__trials_job" and run["status"] == "SUCCESS"
    assert run["stats"]["stepsFailed"] == 0 and run["stats"]["stepsSucceeded"] >= 2
    tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
    assert tags["hangar/queue"] == "eval" and "docker/container_id" in tags


# Three or more stage runs, each a run worker container: 7-15 min at a load of 25-30 here.
@pytest.mark.timeout(1800)
def test_killing_the_run_worker_mid_trials_loses_no_finished_trial(
    deployment: Deployment, example: Path
) -> None:
    # One task, three trials one after the other: the kill lands with some stored, one running.
    path = median_plain(example, deployment.image, "skills-ab-kill", parallel=1)
    eid = submit(deployment, path)
    store = store_of(deployment)
    deadline = time.monotonic() + 300
    while not store.trials(eid, all_attempts=True):
        assert time.monotonic() < deadline, deployment.logs()
        time.sleep(1)
    (worker,) = [
        c for c in client().api.containers(filters={"label": f"dagster/job_name={eid}__trials_job"})
    ]
    deployment.note_run_workers()
    stored = {(t.trial_key, t.attempt): t for t in store.trials(eid, all_attempts=True)}
    sandboxes = [
        c["Id"]
        for c in client().api.containers(filters={"label": f"{MANAGED_LABEL}=1"})
        if c["Labels"].get(OWNER_LABEL, "").startswith(f"container:{worker['Id']}:")
    ]
    client().api.kill(worker["Id"])  # SIGKILL: nothing in the run worker runs any more
    done = wait_complete(deployment, eid)
    after = {(t.trial_key, t.attempt): t for t in store.trials(eid, all_attempts=True)}
    # Every trial stored before the kill is there, unchanged, and counts; none ran twice.
    for key, row in stored.items():
        assert after[key].model_dump() == row.model_dump(), key
    counted = [t["trial_key"] for t in done["trials"]]
    assert sorted(counted) == ["plain/median/1", "plain/median/2", "plain/median/3"]
    assert done["summary"][0]["graded"] == 3
    # The killed worker's run was failed by run monitoring, and its stage started again (the
    # grades are stored before that run ends: wait for its end).
    deadline = time.monotonic() + 120
    runs = stage_runs(deployment, [eid])
    while any(r["status"] in ("QUEUED", "STARTING", "STARTED") for r in runs):
        assert time.monotonic() < deadline, runs
        time.sleep(2)
        runs = stage_runs(deployment, [eid])
    assert sorted(r["status"] for r in runs) == ["FAILURE", "SUCCESS"], runs
    # The killed run's eval pool slot is given back (it held it when its worker died): else it
    # would hold one of the pool's slots for good, and at a limit of 1 no trials step would run.
    (failed,) = [r["runId"] for r in runs if r["status"] == "FAILURE"]
    deadline = time.monotonic() + 180
    while failed in (held := eval_pool_claims(deployment)):
        assert time.monotonic() < deadline, held
        time.sleep(3)
    # Its sandboxes (a dead worker's leftovers) were removed by the next run worker.
    alive = {c["Id"] for c in client().api.containers(all=True)}
    assert not alive & set(sandboxes)


def stage_runs(dep: Deployment, eids: list[str], stage: str = "trials") -> list[dict[str, Any]]:
    """The runs of the experiments' STAGE, with their steps' times, read over GraphQL."""
    found = []
    for eid in eids:
        found += dep.graphql(
            """query($eid: String!, $stage: String!) { runsOrError(filter: {tags: [{key:
            "hangar/experiment", value: $eid}, {key: "hangar/stage", value: $stage}]}) {
            ... on Runs { results { runId status startTime endTime
            stepStats { stepKey startTime endTime } } } } }""",
            {"eid": eid, "stage": stage},
        )["runsOrError"]["results"]
    return found


def eval_pool_claims(dep: Deployment) -> list[str]:
    """The run ids holding a slot of the hangar_eval pool, read over GraphQL."""
    got = dep.graphql(
        """{ instance { concurrencyLimit(concurrencyKey: "hangar_eval") {
        claimedSlots { runId stepKey } } } }"""
    )
    return [c["runId"] for c in got["instance"]["concurrencyLimit"]["claimedSlots"]]


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (touching ones do not overlap)."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def set_eval_pool(dep: Deployment, limit: int) -> None:
    """The operator's command: the hangar_eval pool's limit in the deployment's instance."""
    dagster = str(Path(sys.executable).with_name("dagster"))
    argv = [dagster, "instance", "concurrency", "set", "hangar_eval", str(limit)]
    done = subprocess.run(argv, env=dep.host_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def sleeping(example: Path, image: str, name: str) -> Path:
    """Experiment NAME: the median task's 3 trials one at a time, each agent a 25 s sleep, so
    two of its kind launched together are surely in their trials steps at the same time."""
    tmp = example.parent / f"{name}-harness"  # on the shared directory: run workers read it
    tmp.mkdir()
    data = command_agent_spec(example, tmp, name, "sleep 25")
    data["environment"] |= {"sandbox": "docker", "image": image}
    data.update(trials=3, parallel=1, reuse={"enabled": False})
    return write_spec(example, data)


def step_span(run: dict[str, Any]) -> tuple[float, float]:
    (step,) = [s for s in run["stepStats"] if s["stepKey"].endswith("__trials")]
    return step["startTime"], step["endTime"]


# Nine setup runs and three trials runs, two of them in run worker containers at once.
@pytest.mark.timeout(1800)
def test_two_run_workers_and_a_host_run_hold_the_eval_pool_and_parallel_together(
    deployment: Deployment, example: Path
) -> None:
    # Three run workers on the one instance, two of them at once: the daemon's containers for
    # experiments A and B, then the host CLI's `run --wait` for C (in-process: the run queue never
    # sees it). The eval pool's limit is 0 until A's and B's trials runs are queued, then 2 (the
    # shipped limit): both containers run their trials steps at once, and C, started while they
    # hold both slots, waits for one. Each experiment keeps its own `parallel`.
    lean = median_plain(example, deployment.image, "skills-ab-pool-c", parallel=2)
    store = store_of(deployment)
    set_eval_pool(deployment, 0)
    try:
        a = submit(deployment, sleeping(example, deployment.image, "pool-a"))
        b = submit(deployment, sleeping(example, deployment.image, "pool-b"))
        deadline = time.monotonic() + 600
        while True:
            runs = stage_runs(deployment, [a, b])
            if [r["status"] for r in runs] == ["QUEUED"] * 2:
                break
            assert time.monotonic() < deadline, (runs, deployment.logs())
            time.sleep(2)
        assert [store.trials(e, all_attempts=True) for e in (a, b)] == [[], []]  # both held
        set_eval_pool(deployment, 2)
        ids = {r["runId"] for r in runs}
        deadline = time.monotonic() + 600
        while not ids <= set(held := eval_pool_claims(deployment)):
            assert time.monotonic() < deadline, (held, stage_runs(deployment, [a, b]))
            time.sleep(1)
        # Both slots are held by the two containers: C's trials step has to wait for one.
        host_run = subprocess.run(
            [HANGAR, "experiment", "run", str(lean), "--wait"],
            env=deployment.host_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert host_run.returncode == 0, (host_run.stdout + host_run.stderr)[-4000:]
        c = submitted(host_run.stdout)
        done = [wait_complete(deployment, e, timeout_s=900) for e in (a, b, c)]
    finally:
        set_eval_pool(deployment, 2)  # the shipped default, for the cases after this one
    assert [len(d["trials"]) for d in done] == [3, 3, 3]
    runs = stage_runs(deployment, [a, b, c])
    assert len(runs) == 3 and {r["status"] for r in runs} == {"SUCCESS"}, runs
    spans = [step_span(r) for r in runs]
    # A's and B's run workers ran their trials steps at the same time: two at once ...
    assert max_overlap(spans[:2]) == 2, spans
    # ... and never a third with them: C's step started once one of theirs had ended.
    assert max_overlap(spans) == 2, spans
    assert spans[2][0] >= min(spans[0][1], spans[1][1]), spans
    # Within each experiment, at most its `parallel` trials at once.
    for e, parallel in ((a, 1), (b, 1), (c, 2)):
        rows = store.trials(e, all_attempts=True)
        spans_e = [(t.started_at.timestamp(), t.finished_at.timestamp()) for t in rows]
        assert max_overlap(spans_e) <= parallel, (e, spans_e)


def test_down_leaves_no_container_network_or_volume(deployment: Deployment) -> None:
    workers = deployment.note_run_workers()  # every one the launcher started, kept or not
    deployment.down()
    assert deployment.leftovers() == {
        "containers": [],
        "run_workers": [],
        "networks": [],
        "volumes": [],
    }
    # No sandbox of any of its run workers either.
    owners = {
        c["Labels"].get(OWNER_LABEL, "").split(":")[1]
        for c in client().api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=1"})
        if c["Labels"].get(OWNER_LABEL, "").startswith("container:")
    }
    assert not owners & workers
