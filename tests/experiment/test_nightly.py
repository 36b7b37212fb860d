"""Nightly schedules (issue 15 item 4) as plain functions: the spec's ``nightly:`` field, which
night is due when, the night's derived id, registration, and a tick's submission: once per
night, its branch resolved to that night's SHA."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
import yaml

from hangar_dagster.experiment import nightly
from hangar_dagster.experiment.catalog import DAEMON_MARKER
from hangar_dagster.experiment.spec import Nightly, SpecError, parse_spec
from hangar_dagster.results.records import ExperimentRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests import factories as f
from tests.nightlyfixtures import local, move_branch, nightly_spec, sha_of

pytestmark = pytest.mark.unit

UTC = dt.UTC
NY = Nightly(at="19:30", timezone="America/New_York")


def problems_of(example_dir: Path, value: object) -> list[str]:
    data = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    data["nightly"] = value
    with pytest.raises(SpecError) as e:
        parse_spec(data)
    return [str(p) for p in e.value.problems]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"at": "25:00", "timezone": "UTC"}, "nightly.at: '25:00': hours must be 00-23 and minutes 00-59"),
        ({"at": "7:30", "timezone": "UTC"}, "nightly.at: '7:30' is not HH:MM"),
        ({"at": 1170, "timezone": "UTC"}, "nightly.at: 1170 is a number, not a time (YAML reads an unquoted 19:30 as 1170)"),
        ({"at": "19:30", "timezone": "Mars/Olympus"}, "nightly.timezone: 'Mars/Olympus' is not a known time zone"),
        ({"at": "19:30"}, "nightly.timezone: Field required -> add this field"),
        ({"at": "19:30", "timezone": "UTC", "every": "day"}, "nightly.every: Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_a_bad_nightly_is_refused_naming_the_field_and_the_fix(
    example_dir: Path, value: object, said: str
) -> None:
    [problem] = problems_of(example_dir, value)
    assert problem.startswith(said)
    if "nightly.at" in said:
        assert problem.endswith(
            '-> write the local time as a quoted "HH:MM" (24-hour), e.g. at: "19:30"'
        )
    if "known time zone" in said:
        assert problem.endswith("-> write an IANA zone name such as America/New_York or UTC")


def test_unquoted_yaml_time_reads_as_a_number_and_is_refused(
    example_dir: Path, tmp_path: Path
) -> None:
    text = (
        example_dir / "experiment.yaml"
    ).read_text() + "nightly:\n  at: 19:30\n  timezone: UTC\n"
    spec = tmp_path / "unquoted.yaml"
    spec.write_text(text)
    from hangar_dagster.experiment.spec import load_spec

    with pytest.raises(SpecError, match=r"nightly\.at: 1170 is a number"):
        load_spec(spec)


def test_a_good_nightly_parses() -> None:
    assert NY.time == dt.time(19, 30) and NY.zone.key == "America/New_York"


def test_which_night_is_due() -> None:
    night = dt.date(2027, 1, 15)
    assert nightly.night_time(NY, night) == dt.datetime(2027, 1, 16, 0, 30, tzinfo=UTC)
    assert nightly.due_night(NY, local(2027, 1, 15, 19, 29)) is None
    assert nightly.due_night(NY, local(2027, 1, 15, 19, 30)) == night
    # after local midnight it is still the night before, until the catch-up ends
    assert nightly.due_night(NY, local(2027, 1, 16, 1, 0)) == night
    assert nightly.due_night(NY, local(2027, 1, 16, 1, 29)) == night
    assert nightly.due_night(NY, local(2027, 1, 16, 1, 30)) is None
    assert nightly.next_due(NY, local(2027, 1, 16, 1, 30)) == nightly.night_time(
        NY, dt.date(2027, 1, 16)
    )


def test_a_night_in_the_spring_forward_gap_is_due_at_the_first_instant_after_it() -> None:
    early = Nightly(at="02:30", timezone="America/New_York")
    night = dt.date(2027, 3, 14)  # 02:00 EST -> 03:00 EDT
    assert nightly.night_time(early, night) == local(2027, 3, 14, 3, 0)
    assert nightly.due_night(early, local(2027, 3, 14, 1, 59)) is None
    assert nightly.due_night(early, local(2027, 3, 14, 3, 0)) == night
    fall = dt.date(2026, 11, 1)  # 01:30 happens twice: its later occurrence, 06:30 UTC
    assert nightly.night_time(Nightly(at="01:30", timezone="America/New_York"), fall) == (
        dt.datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
    )


def test_the_night_id_is_derived_so_a_retry_finds_it() -> None:
    a = nightly.night_experiment_id("nightly-ab", dt.date(2027, 1, 15), "sha256:aa")
    assert a == nightly.night_experiment_id("nightly-ab", dt.date(2027, 1, 15), "sha256:aa")
    assert a.startswith("nightly_ab_") and len(a) == len("nightly_ab_") + 8
    assert a != nightly.night_experiment_id("nightly-ab", dt.date(2027, 1, 16), "sha256:aa")
    assert a != nightly.night_experiment_id("nightly-ab", dt.date(2027, 1, 15), "sha256:bb")


def test_moved_bases_names_each_task_whose_sha_changed() -> None:
    def night(d: int, **shas: str) -> nightly.Night:
        when = dt.datetime(2027, 1, d, tzinfo=UTC)
        bases = {t: nightly.TaskBase(ref="trunk", sha=s) for t, s in shas.items()}
        return nightly.Night(
            schedule="s", night=when.date(), due_at=when, submitted_at=when, spec_digest="d",
            experiment_id=f"e{d}", bases=bases,
        )  # fmt: skip

    one, two = (
        night(1, median="a" * 40, slugify="b" * 40),
        night(2, median="c" * 40, slugify="b" * 40),
    )
    assert nightly.moved_bases(one, two) == {"median": ("a" * 40, "c" * 40)}
    assert nightly.moved_bases(None, two) == {}


def test_register_copies_the_spec_and_refuses_another_copy_without_replace(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = nightly_spec(example_dir, tmp_path)
    settings = Settings.from_env()
    s = nightly.register(spec, settings)
    assert s.spec_text == spec.read_text() and s.spec_digest == nightly.spec_digest(
        spec.read_text()
    )
    assert nightly.register(spec, settings) == s  # the same copy: nothing changes
    spec.write_text(spec.read_text().replace("trials: 1", "trials: 2"))
    with pytest.raises(nightly.NightlyError, match="add --replace"):
        nightly.register(spec, settings)
    assert nightly.read_schedule(paths(), "nightly-ab") == s  # the stored copy runs, not the edit
    replaced = nightly.register(spec, settings, replace=True)
    assert replaced.spec_digest != s.spec_digest and "trials: 2" in replaced.spec_text


def test_register_refuses_a_spec_without_nightly_or_with_an_unknown_branch(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    with pytest.raises(SpecError, match="nightly: the spec has no nightly schedule"):
        nightly.register(example_dir / "experiment.yaml", settings)
    spec = nightly_spec(example_dir, tmp_path)
    spec.write_text(spec.read_text().replace("base: trunk", "base: no-such-branch"))
    with pytest.raises(
        SpecError, match=r"tasks\[0\]\.base: .*no commit, tag or branch named 'no-such-branch'"
    ):
        nightly.register(spec, settings)
    assert nightly.schedules(paths()) == []


def test_pause_resume_remove(example_dir: Path, hangar_home: Path, tmp_path: Path) -> None:
    p = paths()
    nightly.register(nightly_spec(example_dir, tmp_path), Settings.from_env())
    assert nightly.set_paused(p, "nightly-ab", True).paused
    night_time = local(2027, 1, 15, 19, 30)
    said = nightly.tick(Settings.from_env(), night_time)
    assert said.submitted == [] and said.said == [
        "nightly-ab: paused (`hangar experiment schedule --resume`)"
    ]
    assert not nightly.set_paused(p, "nightly-ab", False).paused
    nightly.remove(p, "nightly-ab")
    assert nightly.schedules(p) == []
    with pytest.raises(nightly.NightlyError, match="no nightly schedule 'nightly-ab'"):
        nightly.set_paused(p, "nightly-ab", True)


def test_a_tick_submits_each_night_once_with_that_nights_branch_sha(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    p = settings.paths
    spec = nightly_spec(example_dir, tmp_path)
    nightly.register(spec, settings)
    spec.write_text("an edit after registering changes nothing that runs\n")
    first = local(2027, 1, 15, 19, 30)
    assert nightly.tick(settings, first - dt.timedelta(minutes=1)).submitted == []

    sha1 = sha_of(tmp_path, "median")
    [one] = nightly.tick(settings, first).submitted
    assert one.night == dt.date(2027, 1, 15) and one.experiment_id is not None
    assert one.bases["median"] == nightly.TaskBase(ref="trunk", sha=sha1)
    assert (p.experiment_dir(one.experiment_id) / DAEMON_MARKER).is_file()  # the daemon drives it
    # the tick again (retried), a minute later, or past midnight: the same night, no second one
    for again in (first, first + dt.timedelta(minutes=1), local(2027, 1, 16, 0, 10)):
        result = nightly.tick(settings, again)
        assert result.submitted == []
        assert result.said == [
            f"nightly-ab: night 2027-01-15 submitted {one.experiment_id} (4 trials, 0 reused)"
        ]
    assert [n.experiment_id for n in nightly.nights(p, "nightly-ab")] == [one.experiment_id]

    sha2 = move_branch(tmp_path, "median")
    assert sha2 != sha1
    [two] = nightly.tick(settings, local(2027, 1, 16, 19, 31)).submitted
    assert two.night == dt.date(2027, 1, 16) and two.previous == one.experiment_id
    assert two.bases["median"] == nightly.TaskBase(ref="trunk", sha=sha2)
    assert two.bases["slugify"] == one.bases["slugify"]
    assert nightly.moved_bases(one, two) == {"median": (sha1, sha2)}
    [note] = [n for n in Store(p).notes(two.experiment_id) if n.kind == "nightly"]
    assert (
        f"moved since night 2027-01-15 ({one.experiment_id}): median {sha1[:12]} -> {sha2[:12]}"
        in note.message
    )


def test_a_tick_that_crashed_after_submitting_finishes_that_night_without_a_second_or_a_note(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    p = settings.paths
    nightly.register(nightly_spec(example_dir, tmp_path), settings)
    first = local(2027, 1, 15, 19, 30)
    [one] = nightly.tick(settings, first).submitted
    assert one.experiment_id is not None
    # as if the tick died after submit, before its record: the next tick records that experiment
    (p.nightly / "nightly-ab" / "nights" / "2027-01-15.json").unlink()
    [again] = nightly.tick(settings, first + dt.timedelta(minutes=1)).submitted
    assert again.experiment_id == one.experiment_id
    assert sorted(d.name for d in p.experiments.iterdir()) == [one.experiment_id]
    # the nightly note was stored before the crash: the retry adds no second one
    notes = [n for n in Store(p).notes(one.experiment_id) if n.kind == "nightly"]
    assert len(notes) == 1


def test_a_tick_cut_off_inside_submit_stores_the_experiment_row_on_the_next_tick(
    example_dir: Path, hangar_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut off after the experiment's directory appeared, before its store rows: the next tick
    goes on with that experiment and writes what is missing, each once."""
    settings = Settings.from_env()
    p = settings.paths
    nightly.register(nightly_spec(example_dir, tmp_path), settings)
    restore = f.cut_off_before(monkeypatch, p, ExperimentRecord)
    first = local(2027, 1, 15, 19, 30)
    with pytest.raises(f.CutOff):
        nightly.tick(settings, first)
    [eid] = [d.name for d in p.experiments.iterdir() if not d.name.startswith(".")]
    assert Store(p).experiment(eid) is None
    restore()
    [one] = nightly.tick(settings, first + dt.timedelta(minutes=1)).submitted
    assert one.experiment_id == eid
    row = Store(p).experiment(eid)
    assert row is not None and row.trials_planned == one.trials_planned
    nightly.tick(settings, first + dt.timedelta(minutes=2))  # a later tick changes nothing
    kinds = [n.kind for n in Store(p).notes(eid)]
    assert kinds.count("nightly") == 1 and len(kinds) == len(set(kinds)), kinds


def test_a_refused_night_is_recorded_and_not_tried_again_that_night(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    registry = tmp_path / "harnesses"  # a copy: the example is shared by the session's tests
    shutil.copytree(example_dir / "harnesses", registry)
    edit = {"harness_repo": str(registry)}
    nightly.register(nightly_spec(example_dir, tmp_path, edit=edit), settings)
    # A lock gone from the registry: the spec cannot run as it is, whenever it is tried.
    locks = list(registry.glob("*@sha256:*"))
    assert locks
    for lock in locks:
        shutil.rmtree(lock)
    first = local(2027, 1, 15, 19, 30)
    [refused] = nightly.tick(settings, first).submitted
    assert refused.experiment_id is None and "harness_lock" in (refused.refused or "")
    assert nightly.read_night(settings.paths, "nightly-ab", first.date()) == refused
    assert nightly.tick(settings, first + dt.timedelta(minutes=5)).submitted == []


def test_a_night_the_world_refuses_for_now_is_tried_again_within_the_catch_up(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    p = settings.paths
    nightly.register(nightly_spec(example_dir, tmp_path), settings)
    # The repository unreachable for a while (a remote down): its base does not resolve.
    (tmp_path / "repos" / "median").rename(tmp_path / "away")
    first = local(2027, 1, 15, 19, 30)
    [later] = nightly.tick(settings, first).submitted
    assert later.experiment_id is None and "tasks[0].base" in (later.refused or "")
    assert nightly.read_night(p, "nightly-ab", first.date()) is None  # not decided
    assert "tried again" in nightly.tick(settings, first + dt.timedelta(minutes=1)).said[0]
    (tmp_path / "away").rename(tmp_path / "repos" / "median")
    [one] = nightly.tick(settings, first + dt.timedelta(minutes=2)).submitted
    assert one.experiment_id is not None and one.refused is None
    assert nightly.read_night(p, "nightly-ab", first.date()) == one

    # Never back within the catch-up: the night is recorded refused with the last error.
    (tmp_path / "repos" / "median").rename(tmp_path / "away")
    second = local(2027, 1, 16, 19, 30)
    nightly.tick(settings, second)
    assert nightly.read_night(p, "nightly-ab", second.date()) is None
    nightly.tick(settings, second + nightly.CATCH_UP + dt.timedelta(minutes=1))
    night = nightly.read_night(p, "nightly-ab", second.date())
    assert night is not None and night.experiment_id is None
    assert "tasks[0].base" in (night.refused or "") and "catch-up" in (night.refused or "")


def test_a_broken_schedule_does_not_stop_the_others(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    nightly.register(nightly_spec(example_dir, tmp_path), settings)
    broken = settings.paths.nightly / "aaa-broken"
    broken.mkdir()
    (broken / nightly.SCHEDULE).write_text('{"name": "aaa-broken"')  # cut off mid-write by hand
    result = nightly.tick(settings, local(2027, 1, 15, 19, 30))
    [one] = result.submitted
    assert one.schedule == "nightly-ab" and one.experiment_id is not None
    assert any(s.startswith("aaa-broken: failed:") for s in result.said)
    assert "aaa-broken: failed:" in (broken / nightly.LAST_ERROR).read_text()


def test_a_broken_schedule_is_listed_as_broken_and_can_be_removed_or_replaced(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    """A schedule.json nobody can read (cut off, edited by hand) must not stop --list, and the
    commands its error names must work on it."""
    settings = Settings.from_env()
    p = settings.paths
    spec = nightly_spec(example_dir, tmp_path)
    good = nightly.register(spec, settings)
    path = p.nightly / good.name / nightly.SCHEDULE
    path.write_text('{"name": "nightly-ab"')  # cut off mid-write
    assert nightly.schedules(p) == []
    [(name, why)] = nightly.broken_schedules(p).items()
    assert name == "nightly-ab" and str(path) in why and "--remove nightly-ab" in why
    with pytest.raises(nightly.NightlyError, match="--replace"):
        nightly.register(spec, settings)  # without --replace: refused, naming the fixes
    assert nightly.register(spec, settings, replace=True).spec_digest == good.spec_digest
    path.write_text("not json")
    nightly.remove(p, "nightly-ab")
    assert not path.exists() and nightly.broken_schedules(p) == {}
