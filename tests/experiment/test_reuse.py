"""Reuse of measured trials across experiments: what binds a trial, what submit plans, what it
writes (experiment/reuse.py). The earlier experiment's trials are stored as the trials stage
stores them (``trial.pinned_fields``, a raw patch in the attempt's folder, a grade); the slow
end-to-end test runs them for real (tests/test_reuse_e2e.py)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
import yaml

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.reuse import BINDING_FIELDS, binding, mismatch
from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.budget import month_report
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.trials.trial import RAW_PATCH, STARTED_MARKER
from tests.reusefixtures import finish, finished_first, spec_file

pytestmark = pytest.mark.unit


@pytest.fixture
def first(example_dir: Path, hangar_home: Path) -> tuple[ResolvedExperiment, Store]:
    return finished_first(example_dir, "first")


def test_the_same_spec_again_reuses_all_but_one_health_trial_per_variant(
    example_dir: Path, first: tuple[ResolvedExperiment, Store]
) -> None:
    a, store = first
    b = submit(spec_file(example_dir, "again"), Settings.from_env())
    assert b.reuse is not None
    # 6 planned, the first planned key of each variant runs fresh: its health check
    assert b.reuse.health == {"plain": "plain/median/1", "skill": "skill/median/1"}
    assert len(b.reuse.sources) == 4
    # key by key, each measurement used once
    assert all(
        s.trial_key == k and s.experiment_id == a.experiment_id for k, s in b.reuse.sources.items()
    )
    rows = {t.trial_key: t for t in store.trials(b.experiment_id)}
    assert set(rows) == set(b.reuse.sources)  # written at submit; the health keys wait to run
    before = {t.trial_key: t for t in store.trials(a.experiment_id)}
    for key, row in rows.items():
        assert row.reused_from == {
            "experiment_id": a.experiment_id,
            "trial_key": key,
            "attempt": 1,
            "run_id": f"run-{a.experiment_id}",
            "finished_at": before[key].finished_at.isoformat(),
        }
        # the measurement's own clock, cost and run: copying refreshes none of them
        assert (row.finished_at, row.cost_usd, row.run_id) == (
            before[key].finished_at,
            before[key].cost_usd,
            before[key].run_id,
        )
        art = Path(row.artifacts_dir)
        assert art.parent.parent.name == b.experiment_id
        assert os.path.samefile(art / RAW_PATCH, Path(before[key].artifacts_dir) / RAW_PATCH)
        assert not (art / STARTED_MARKER).exists()
    grades = {g.trial_key: g for g in store.grades(b.experiment_id)}
    assert {k: g.passed for k, g in grades.items()} == {
        "plain/slugify/1": False,
        "plain/durations/1": True,
        "skill/slugify/1": False,
        "skill/durations/1": True,
    }
    # the budget projects the 2 paid trials; nothing reused is in the ledger or the tally
    record = store.experiment(b.experiment_id)
    assert record is not None and record.trials_reused == 4
    month = f"{dt.datetime.now(dt.UTC):%Y-%m}"
    assert store.spent_by_author(month) == pytest.approx({"tester": 6 * 0.25})
    report = month_report(store, month, Settings.from_env().caps)
    assert not any(e.experiment_id == b.experiment_id for e in report.experiments)
    notes = [n.message for n in store.notes(b.experiment_id) if n.kind == "reuse"]
    assert notes[0].startswith(f"variant plain: 2 of 3 trials reused from {a.experiment_id}")
    assert "plain/median/1 as its health check" in notes[0]


def test_the_projection_counts_only_what_will_be_paid(
    example_dir: Path, first: tuple[ResolvedExperiment, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1.50 spent of 7.50: 6 trials x 3.00 = 18 would not fit in what is left; 2 paid x 3.00 = 6 does
    monkeypatch.setenv("HANGAR_EVAL_BUDGET_USD_MONTH", "7.5")
    b = submit(spec_file(example_dir, "paid"), Settings.from_env())
    assert b.reuse is not None and len(b.reuse.sources) == 4
    spec_off = spec_file(example_dir, "paid-off", {"reuse": {"enabled": False}})
    with pytest.raises(SpecError, match=r"projected 18.00 \(6 trials x trial_job_budget"):
        submit(spec_off, Settings.from_env())


def test_reuse_turned_off_runs_everything_and_says_so(
    example_dir: Path, first: tuple[ResolvedExperiment, Store]
) -> None:
    _, store = first
    b = submit(spec_file(example_dir, "off", {"reuse": {"enabled": False}}), Settings.from_env())
    assert b.reuse is not None and not b.reuse.sources and not b.reuse.enabled
    assert store.trials(b.experiment_id) == []
    assert [n.message for n in store.notes(b.experiment_id) if n.kind == "reuse"] == [
        "reuse is off for this experiment (reuse.enabled: false): every trial runs"
    ]


def test_changed_hidden_tests_reuse_nothing_and_the_note_names_the_field(
    example_dir: Path, first: tuple[ResolvedExperiment, Store]
) -> None:
    _, store = first
    hidden = example_dir / "reuse-hidden"
    hidden.mkdir(exist_ok=True)
    (hidden / "test_hidden_median.py").write_text(
        (example_dir / "fixtures/median/hidden/test_hidden_median.py").read_text() + "\n# more\n"
    )
    b = submit(
        spec_file(example_dir, "hidden", {"tasks.0.hidden_tests": str(hidden)}), Settings.from_env()
    )
    assert b.reuse is not None
    assert not any(k.split("/")[1] == "median" for k in b.reuse.sources)
    assert len(b.reuse.sources) == 4  # slugify and durations of each variant
    assert b.reuse.health == {}  # each variant pays its median trial: that is its fresh one
    notes = [n.message for n in store.notes(b.experiment_id) if n.kind == "reuse"]
    assert notes[0].endswith("; 1 fresh; not reused: median (hidden_tests differs)")


def test_a_copy_of_a_copy_names_the_first_measurement_and_ages_with_it(
    example_dir: Path, hangar_home: Path
) -> None:
    store = Store(paths())
    a = submit(spec_file(example_dir, "night1"), Settings.from_env())
    finish(a, store, ago=dt.timedelta(days=6, hours=23))  # just inside the week
    b = submit(spec_file(example_dir, "night2"), Settings.from_env())
    finish(b, store, ago=dt.timedelta(minutes=1))  # its two health trials ran just now
    c = submit(spec_file(example_dir, "night3"), Settings.from_env())
    assert c.reuse is not None and len(c.reuse.sources) == 4
    copied = store.trials(c.experiment_id)
    # b's copies stood in again, but every row names a's measurement, not b's copy
    assert {t.reused_from["experiment_id"] for t in copied if t.reused_from} == {a.experiment_id}
    # the same night a week and a day later: a's measurements are too old, b's copies of them
    # too (they kept a's clock); only b's two fresh trials may stand in
    d = submit(
        spec_file(example_dir, "night4", {"reuse": {"max_age_days": 6.9}}), Settings.from_env()
    )
    assert d.reuse is not None
    assert {s.original["experiment_id"] for s in d.reuse.sources.values()} == {b.experiment_id}
    assert set(d.reuse.sources) == {"plain/median/1", "skill/median/1"}


def test_two_variants_of_one_lock_never_share_a_measurement(
    example_dir: Path, first: tuple[ResolvedExperiment, Store]
) -> None:
    a, _ = first
    data = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    twin = spec_file(example_dir, "twin", {"variants.twin": data["variants"]["plain"]})
    b = submit(twin, Settings.from_env())
    assert b.reuse is not None
    originals = [s.original["trial_key"] for s in b.reuse.sources.values()]
    assert len(originals) == len(set(originals))
    # plain takes its own trials (2, one fresh as its health check); none is left for twin
    assert sum(k.startswith("plain/") for k in b.reuse.sources) == 2
    assert not any(k.startswith("twin/") for k in b.reuse.sources)
    assert "twin" not in b.reuse.health


def test_a_measurement_stamped_in_the_future_or_without_its_patch_is_not_reused(
    example_dir: Path, hangar_home: Path
) -> None:
    store = Store(paths())
    a = submit(spec_file(example_dir, "clock"), Settings.from_env())
    finish(a, store, ago=-dt.timedelta(hours=2))  # a clock two hours ahead: corrupt
    b = submit(spec_file(example_dir, "clock2"), Settings.from_env())
    assert b.reuse is not None and not b.reuse.sources
    notes = " ".join(n.message for n in store.notes(b.experiment_id))
    assert "is in the future (corrupt)" in notes


def test_a_missing_digest_on_either_side_is_a_mismatch(
    example_dir: Path, first: tuple[ResolvedExperiment, Store]
) -> None:
    a, _ = first
    new = binding(a, "plain", "median")
    assert mismatch(new, dict(new)) is None
    assert all(new[field] for field in BINDING_FIELDS)
    for field in ("environment", "build", "grader"):
        assert (
            mismatch(new, new | {field: None}) == f"{field}: the earlier trial has no digest for it"
        )
        assert (
            mismatch(new | {field: None}, new) == f"{field}: this experiment has no digest for it"
        )
    assert mismatch(new, new | {"instructions": "sha256:other"}) == "instructions differs"
