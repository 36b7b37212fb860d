"""`hangar experiment archive / unarchive / list` through the real CLI, against real Dagster and DuckDB."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pytest

from hangar_dagster.experiment.catalog import ARCHIVED
from hangar_dagster.orchestration.definitions import build_definitions
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import Settings, paths
from tests.conftest import command_agent_spec, hangar, killed_worker, write_spec

pytestmark = pytest.mark.integration


def listed(home: Path, *flags: str) -> dict[str, dict[str, Any]]:
    done = hangar("experiment", "list", "--json", *flags, home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    return {row["experiment_id"]: row for row in json.loads(done.stdout)}


def loaded_experiments() -> set[str]:
    """The experiment ids whose assets the definitions load, as the webserver would."""
    defs = build_definitions(Settings.from_env())
    dg.Definitions.validate_loadable(defs)
    return {k.path[0] for k in defs.resolve_all_asset_keys()}


def submitted_id(out: str) -> str:
    return out.split("submitted ", 1)[1].split()[0]


def test_archive_takes_a_finished_experiment_out_of_the_definitions_and_keeps_it_readable(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    finished_spec = write_spec(
        example_dir, command_agent_spec(example_dir, tmp_path, "done", "true")
    )
    ran = hangar("experiment", "run", str(finished_spec), "--wait", home=hangar_home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    finished = submitted_id(ran.stdout)
    queued_spec = write_spec(
        example_dir, command_agent_spec(example_dir, tmp_path, "queued", "true")
    )
    sub = hangar("experiment", "run", str(queued_spec), home=hangar_home)  # left to the daemon
    assert sub.returncode == 0, sub.stdout + sub.stderr
    queued = submitted_id(sub.stdout)

    rows = listed(hangar_home)
    assert rows[finished]["state"] == "complete"
    assert (rows[finished]["trials_planned"], rows[finished]["trials_done"]) == (1, 1)
    assert rows[finished]["name"] == "done" and rows[finished]["author"]
    assert rows[queued]["state"] == "waiting"
    assert (rows[queued]["trials_done"], rows[queued]["pending_trials"]) == (0, 1)

    # Pending work: refused, nothing written.
    refused = hangar("experiment", "archive", queued, home=hangar_home)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert f"refused: {queued}: 1 trial(s) still pending" in said
    assert "--force" in said and "hangar experiment resume" in said
    assert not (paths().experiment_dir(queued) / ARCHIVED).exists()

    archived = hangar("experiment", "archive", finished, home=hangar_home)
    assert archived.returncode == 0, archived.stdout + archived.stderr
    again = hangar("experiment", "archive", finished, home=hangar_home)
    assert again.returncode == 0 and "already archived" in again.stdout, again.stdout + again.stderr

    assert set(listed(hangar_home, "--active")) == {queued}
    everything = listed(hangar_home)  # every experiment, archived ones too
    assert {k: r["state"] for k, r in everything.items()} == {
        finished: "archived",
        queued: "waiting",
    }
    assert everything[finished]["trials_done"] == 1
    assert set(listed(hangar_home, "--state", "archived")) == {finished}
    assert loaded_experiments() == {queued}

    # Still readable in full: get (which says it is archived), export, SQL.
    got = hangar("experiment", "get", finished, "--json", home=hangar_home)
    assert got.returncode == 0, got.stderr
    index = json.loads(got.stdout)
    assert index["archived"]["experiment_id"] == finished and index["archived"]["forced"] is False
    assert [t["trial_key"] for t in index["trials"]] == ["done/median/1"]
    assert any(n["kind"] == "archive" for n in index["notes"])
    text = hangar("experiment", "get", finished, home=hangar_home)
    assert "archived" in text.stdout and "unarchive" in " ".join(text.stdout.split())
    out = tmp_path / "export"
    exported = hangar("experiment", "export", finished, "-o", str(out), home=hangar_home)
    assert exported.returncode == 0, exported.stderr
    written = json.loads((out / "index.json").read_text())
    assert [row["trial_key"] for row in written["index"]] == ["done/median/1"]
    assert [a["dir"] for a in written["attempts"]] and (
        out / written["attempts"][0]["dir"]
    ).is_dir()
    with duckdb.connect(str(paths().duckdb), read_only=True) as con:
        (n,) = con.execute(
            "SELECT count(*) FROM experiment_index WHERE experiment_id = ?", [finished]
        ).fetchone() or (0,)
        notes = con.execute(
            "SELECT message FROM notes WHERE experiment_id = ? AND kind = 'archive'", [finished]
        ).fetchall()
    assert n == 1
    assert [m for (m,) in notes] and notes[0][0].startswith("archived by ")

    # Its jobs are not loaded, so resume refuses instead of failing in Dagster.
    resumed = hangar("experiment", "resume", finished, home=hangar_home)
    assert resumed.returncode == 2
    assert "unarchive" in " ".join(resumed.stderr.split())

    # --force gives pending work up, and says so.
    forced = hangar("experiment", "archive", queued, "--force", home=hangar_home)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    q = json.loads(hangar("experiment", "get", queued, "--json", home=hangar_home).stdout)
    assert q["archived"]["forced"] is True and q["archived"]["pending_trials"] == 1
    assert q["queue"]["reason"].startswith("archived")
    assert loaded_experiments() == set()

    back = hangar("experiment", "unarchive", finished, home=hangar_home)
    assert back.returncode == 0, back.stdout + back.stderr
    twice = hangar("experiment", "unarchive", finished, home=hangar_home)
    assert twice.returncode == 0 and "not archived" in twice.stdout
    assert loaded_experiments() == {finished}
    assert listed(hangar_home)[finished]["state"] == "complete"


def test_archive_refuses_beside_a_run_in_flight_even_forced_and_list_says_running(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = write_spec(example_dir, command_agent_spec(example_dir, tmp_path, "busy", "true"))
    sub = hangar("experiment", "run", str(spec), home=hangar_home)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    eid = submitted_id(sub.stdout)
    ensure_dagster_home(Settings.from_env())  # the CLI's instance: $HANGAR_HOME/dagster
    run_id = str(uuid.uuid4())
    with dg.DagsterInstance.get() as instance:
        instance.add_run(
            dg.DagsterRun(
                job_name=f"{eid}__trials_job",
                run_id=run_id,
                status=dg.DagsterRunStatus.STARTED,
                tags={"hangar/experiment": eid, "hangar/stage": "trials"},
            )
        )
    row = listed(hangar_home)[eid]
    assert row["state"] == "running" and run_id in row["why"]
    for flags in ((), ("--force",)):
        refused = hangar("experiment", "archive", eid, *flags, home=hangar_home)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        said = " ".join(refused.stderr.split())
        assert f"refused: {eid}: its trials run {run_id} is STARTED" in said
        assert "stop its worker (`kill PID`" in said and "Dagster UI" not in said
        assert not (paths().experiment_dir(eid) / ARCHIVED).exists()


def test_archive_beside_a_run_whose_worker_died_ends_that_run_and_archives_without_the_ui(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = write_spec(example_dir, command_agent_spec(example_dir, tmp_path, "orphan", "true"))
    sub = hangar("experiment", "run", str(spec), home=hangar_home)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    eid = submitted_id(sub.stdout)
    ensure_dagster_home(Settings.from_env())
    run_id = str(uuid.uuid4())
    with dg.DagsterInstance.get() as instance:
        instance.add_run(
            dg.DagsterRun(
                job_name=f"{eid}__trials_job",
                run_id=run_id,
                status=dg.DagsterRunStatus.STARTED,
                tags={"hangar/experiment": eid, "hangar/stage": "trials"},
            )
        )
    pid = killed_worker(hangar_home, run_id)  # recorded itself, then died with its daemon

    done = hangar("experiment", "archive", eid, "--force", home=hangar_home)
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert f"its trials run {run_id} was STARTED, but its process (pid {pid} on" in said
    assert (paths().experiment_dir(eid) / ARCHIVED).exists()
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
