"""The eval queue's decisions: pending work, what blocks a start, the tokens-per-minute throttle."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import yaml

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.experiment.submit import submit
from hangar_dagster.orchestration.stages import stage_tags
from hangar_dagster.queue.starts import (
    FIT_MIN_MEASURED,
    OPEN_GRACE,
    Need,
    TokenThrottle,
    blocker,
    fit_blocker,
    pending,
    record_queue_notes,
    trial_needs,
    waiting_reason,
    window_fit,
)
from hangar_dagster.queue.window import parse_window
from hangar_dagster.results.records import TrialRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests import factories as f

pytestmark = pytest.mark.unit

NY = ZoneInfo("America/New_York")
AT_NIGHT = dt.datetime(2026, 11, 29, 21, 0, tzinfo=NY)
NIGHTLY = parse_window("20:00-00:15")


@pytest.fixture
def exp(example_dir: Path, hangar_home: Path) -> ResolvedExperiment:
    return submit(example_dir / "experiment.yaml", Settings.from_env())


def attempt(exp: ResolvedExperiment, key: str, n: int, **kw: object) -> TrialRecord:
    return f.attempt_of(exp.experiment_id, key, n, **{"finished_at": AT_NIGHT, **kw})


def test_pending_lists_untried_keys_and_allowed_retries(exp: ResolvedExperiment) -> None:
    store = Store(paths())
    assert len(pending(exp, store, f.settings()).new) == 18
    store.put(attempt(exp, "plain/median/1", 1))
    store.put(
        attempt(exp, "plain/median/2", 1, outcome_class="infra_error", infra_reason="preempted")
    )
    store.put(attempt(exp, "plain/median/3", 1, outcome_class="infra_error", infra_reason="drift"))
    work = pending(exp, store, f.settings())
    assert len(work.new) == 15
    retry = work.retries["plain/median/2"]
    assert (retry.attempt, retry.retry_of) == (2, "run-plain-median-2-1")
    assert "plain/median/3" not in work.retries  # drift is never retried
    assert [k.key for k in work.keys][:2] == ["plain/durations/1", "plain/durations/2"]


def test_finished_attempts_without_a_grade_are_pending_work(exp: ResolvedExperiment) -> None:
    # A crash between a trial and its grade: pending must carry the grade, or nothing grades it.
    store = Store(paths())
    graded = attempt(exp, "plain/median/1", 1)
    store.put(graded)
    store.put(f.grade("plain", "median", 1, experiment_id=exp.experiment_id))
    store.put(attempt(exp, "plain/median/2", 1))  # finished, never graded
    store.put(attempt(exp, "plain/median/3", 1, outcome_class="agent_error"))  # gradeable too
    store.put(
        attempt(exp, "plain/durations/1", 1, outcome_class="infra_error", infra_reason="drift")
    )
    # Attempt 1 was graded, attempt 2 (the one that counts) was not.
    store.put(
        attempt(exp, "plain/durations/2", 1, outcome_class="infra_error", infra_reason="preempted")
    )
    store.put(f.grade("plain", "durations", 2, experiment_id=exp.experiment_id, passed=False))
    store.put(attempt(exp, "plain/durations/2", 2))
    work = pending(exp, store, f.settings())
    assert [k.key for k in work.grades] == [
        "plain/durations/2",
        "plain/median/2",
        "plain/median/3",
    ]
    assert "plain/median/2" not in {k.key for k in work.keys}  # graded, never run again
    # Grades alone are work: pending is not empty once every trial ran.
    tried = {t.trial_key for t in store.trials(exp.experiment_id)}
    for key in (k for k in exp.trial_keys() if k.key not in tried):
        store.put(attempt(exp, key.key, 1))
        store.put(f.grade(key.variant, key.task, key.replicate, experiment_id=exp.experiment_id))
    only_grades = pending(exp, store, f.settings())
    assert only_grades and not only_grades.keys
    assert [k.key for k in only_grades.grades] == [k.key for k in work.grades]


def test_trials_of_an_invalid_task_never_start_and_a_queue_note_says_why(
    exp: ResolvedExperiment,
) -> None:
    store = Store(paths())
    store.put(f.base_check("slugify", experiment_id=exp.experiment_id))
    store.put(
        f.base_check(
            "median",
            experiment_id=exp.experiment_id,
            base_passed=True,
            invalid=True,
            reason="hidden tests pass on base",
        )
    )
    # An infra error of the invalid task is not retried either (it ran before the check said so).
    store.put(
        attempt(exp, "plain/median/1", 1, outcome_class="infra_error", infra_reason="preempted")
    )
    work = pending(exp, store, Settings.from_env())
    assert len(work.new) == 12 and not work.retries
    assert {k.task for k in work.keys} == {"slugify", "durations"}
    note = "trials of invalid tasks are not started: median (hidden tests pass on base)"
    assert note in work.notes
    assert [n.message for n in record_queue_notes(exp, store, Settings.from_env())] == [note]
    assert record_queue_notes(exp, store, Settings.from_env()) == []  # stored once


def test_closed_window_blocks_with_reason_eval_window(exp: ResolvedExperiment) -> None:
    store = Store(paths())
    afternoon = dt.datetime(2026, 11, 29, 14, 0, tzinfo=NY)
    why = blocker(exp, store, f.settings(NIGHTLY), afternoon)
    assert why is not None and why.startswith("eval_window")
    assert "2026-11-29 20:00" in why
    assert blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT) is None
    assert blocker(exp, store, f.settings(parse_window("always")), afternoon) is None


def test_waiting_reason_names_the_opening_schedule_during_its_grace(
    exp: ResolvedExperiment,
) -> None:
    store = Store(paths())
    opens = dt.datetime(2027, 1, 15, 20, 0, tzinfo=NY)  # after the submission (now)
    at_two = waiting_reason(
        exp, store, f.settings(NIGHTLY), opens.replace(hour=14), exp.trial_keys()
    )
    assert at_two is not None and at_two.startswith("eval_window: ")
    why = waiting_reason(
        exp, store, f.settings(NIGHTLY), opens + dt.timedelta(seconds=30), exp.trial_keys()
    )
    assert why == (
        "eval_window_open: the window opened at 20:00 EST; schedule "
        f"{exp.experiment_id}__eval_window_open starts these trials (the driver sensor "
        "starts them at 20:02:00 EST if it has not)"
    )
    assert (
        blocker(exp, store, f.settings(NIGHTLY), opens) is None
    )  # a trial may start: the grace is no block
    assert (
        waiting_reason(exp, store, f.settings(NIGHTLY), opens + OPEN_GRACE, exp.trial_keys())
        is None
    )
    # Submitted inside the window (the window of the night it was submitted): nothing to wait for.
    submitted = exp.submitted_at.astimezone(NY)
    inside = parse_window(f"{submitted:%H:%M}-{submitted + dt.timedelta(hours=1):%H:%M}")
    assert (
        waiting_reason(exp, store, f.settings(inside), exp.submitted_at, exp.trial_keys()) is None
    )


def test_a_spent_budget_blocks_new_starts(
    exp: ResolvedExperiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(paths())
    monkeypatch.setenv("HANGAR_EVAL_BUDGET_USD_MONTH", "5")
    store.put(attempt(exp, "plain/median/1", 1, cost_usd=4.0))
    assert blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT) is None
    store.put(attempt(exp, "plain/median/2", 1, cost_usd=1.5))
    why = blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT)
    assert why is not None and why.startswith("budget:") and "5.50 of 5.00" in why


def test_the_experiments_own_budget_stops_new_starts_reused_trials_cost_nothing(
    example_dir: Path, hangar_home: Path
) -> None:
    spec = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec.update(name="capped", budget={"max_cost_usd": 2.0})
    (example_dir / "capped.yaml").write_text(yaml.safe_dump(spec))
    exp = submit(example_dir / "capped.yaml", Settings.from_env())
    store = Store(paths())
    store.put(attempt(exp, "plain/median/1", 1, cost_usd=1.5))
    reused = {"experiment_id": "earlier", "trial_key": "plain/median/2", "attempt": 1}
    store.put(attempt(exp, "plain/median/2", 1, cost_usd=9.0, reused_from=reused))
    assert blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT) is None  # 1.50 paid of 2.00
    store.put(attempt(exp, "plain/median/3", 1, cost_usd=0.6))
    why = blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT)
    assert why is not None and why.startswith("budget: the experiment spent 2.10 of its ")
    assert "budget.max_cost_usd 2.00" in why
    # Another experiment's spend is not this one's.
    other = submit(example_dir / "experiment.yaml", Settings.from_env())
    assert blocker(other, store, f.settings(NIGHTLY), AT_NIGHT) is None


def test_a_trial_that_cannot_finish_before_the_window_closes_waits_with_the_reason(
    exp: ResolvedExperiment,
) -> None:
    store = Store(paths())
    keys = pending(exp, store, f.settings(NIGHTLY)).keys
    needs = trial_needs(exp, keys, store)
    assert {(n.seconds, n.basis) for n in needs.values()} == {(60.0, "its timeout_s")}
    closing = dt.datetime(2026, 11, 30, 0, 14, 30, tzinfo=NY)  # 30 s before 00:15
    why = window_fit(needs[keys[0]], NIGHTLY, closing)
    assert why == (
        "window_fit: needs 60 s (its timeout_s) and the eval window closes at 00:15 EST, "
        "30 s from now"
    )
    assert window_fit(needs[keys[0]], NIGHTLY, AT_NIGHT) is None
    assert window_fit(needs[keys[0]], parse_window("always"), closing) is None
    # The experiment waits, and says so, when none of its pending trials fits.
    said = waiting_reason(exp, store, f.settings(NIGHTLY), closing, keys)
    assert said is not None and said.startswith(why) and "start when the window next opens" in said
    assert fit_blocker(exp, keys, store, f.settings(NIGHTLY), AT_NIGHT) is None


def test_measured_durations_stand_in_for_the_timeout_once_enough_are_stored(
    exp: ResolvedExperiment,
) -> None:
    store = Store(paths())
    plain_pins = exp.variants["plain"].pin_set
    plain, skill = TrialKey("plain", "median", 1), TrialKey("skill", "median", 1)
    took = [10.0, 12.0, 20.0, 30.0]  # an earlier experiment's, on the same pin set
    for rep in range(1, FIT_MIN_MEASURED):
        store.put(
            f.attempt_of(
                "earlier", f"plain/median/{rep}", 1, duration_s=took[rep - 1], pin_set=plain_pins
            )
        )
    assert trial_needs(exp, [plain], store)[plain].basis == "its timeout_s"  # too few measured
    for rep in range(FIT_MIN_MEASURED, len(took) + 1):
        store.put(
            f.attempt_of(
                "earlier", f"plain/median/{rep}", 1, duration_s=took[rep - 1], pin_set=plain_pins
            )
        )
    # Not counted: an infra error's time, a reused row (it repeats a measurement).
    store.put(
        f.attempt_of(
            "earlier", "plain/median/5", 1, duration_s=500.0, pin_set=plain_pins,
            outcome_class="infra_error", infra_reason="preempted",
        )
    )  # fmt: skip
    copied = {"experiment_id": "earlier", "trial_key": "plain/median/4", "attempt": 1}
    store.put(
        attempt(exp, "plain/median/1", 1, duration_s=300.0, pin_set=plain_pins, reused_from=copied)
    )
    needs = trial_needs(exp, [plain, skill], store)
    assert needs[plain].seconds == pytest.approx(27.0)  # p90 of 10, 12, 20, 30
    assert needs[plain].basis == "the 90th percentile of 4 measured trials of its pin set"
    assert needs[skill] == Need(60.0, "its timeout_s")  # its own pin set has none
    closing = dt.datetime(2026, 11, 30, 0, 14, 30, tzinfo=NY)
    assert window_fit(needs[plain], NIGHTLY, closing) is None  # 27 s fits in the last 30
    assert window_fit(needs[skill], NIGHTLY, closing) is not None
    assert fit_blocker(exp, [plain, skill], store, f.settings(NIGHTLY), closing) is None  # one fits
    assert fit_blocker(exp, [skill], store, f.settings(NIGHTLY), closing) is not None


def test_the_outage_breaker_blocks_after_a_streak(
    exp: ResolvedExperiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(paths())
    monkeypatch.setenv("HANGAR_OUTAGE_BREAKER_STREAK", "3")
    for i, key in enumerate(["plain/median/1", "plain/median/2", "plain/median/3"]):
        at = AT_NIGHT + dt.timedelta(minutes=i)
        store.put(
            attempt(
                exp,
                key,
                1,
                outcome_class="infra_error",
                infra_reason="sandbox_create",
                finished_at=at,
            )
        )
        why = blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT)
    assert why is not None and why.startswith("outage:") and "3 systemic" in why


def test_past_the_retry_cap_no_first_attempt_starts_either(exp: ResolvedExperiment) -> None:
    # 18 trials allow 1 counted retry. One infra error: its retry may start. A second one cannot
    # be retried, and that many infra errors usually mean an outage, so nothing else starts
    # either, untried keys included (the seed's 10% rule).
    store = Store(paths())

    def infra(key: str, minute: int) -> None:
        store.put(attempt(exp, key, 1, outcome_class="infra_error", infra_reason="preempted",
                          finished_at=AT_NIGHT + dt.timedelta(minutes=minute)))  # fmt: skip

    infra("plain/median/1", 0)
    assert blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT) is None
    infra("plain/median/2", 1)
    why = blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT)
    assert why is not None and why.startswith("retry_cap:"), why
    assert "1 of 1 allowed" in why and "not retried: plain/median/2" in why
    assert "no further trial of this experiment starts" in why
    assert len(pending(exp, store, f.settings(NIGHTLY)).new) == 16  # still pending, only held
    notes = [n.message for n in record_queue_notes(exp, store, f.settings(NIGHTLY))]
    assert any("no further trial of this experiment starts" in n for n in notes), notes


def test_a_power_down_retry_past_the_cap_does_not_hold_the_experiment(
    exp: ResolvedExperiment,
) -> None:
    store = Store(paths())
    store.put(
        attempt(exp, "plain/median/1", 1, outcome_class="infra_error", infra_reason="preempted")
    )
    store.put(attempt(exp, "plain/median/2", 1, outcome_class="infra_error",
                      infra_reason="power_down"))  # fmt: skip
    assert blocker(exp, store, f.settings(NIGHTLY), AT_NIGHT) is None


def test_token_throttle_waits_until_the_last_minute_is_under_budget() -> None:
    now = [dt.datetime(2026, 11, 29, 21, 0, tzinfo=dt.UTC)]
    finished = [(now[0] - dt.timedelta(seconds=30), 900)]  # 900 tokens, 30 s ago

    def recent(since: dt.datetime) -> int:
        return sum(n for at, n in finished if at > since)

    def sleep(s: float) -> None:
        now[0] += dt.timedelta(seconds=s)

    throttle = TokenThrottle(recent, budget_tpm=1000, clock=lambda: now[0], sleep=sleep)
    assert throttle.wait() == 0.0
    finished.append((now[0], 200))  # 1100 in the last minute: hold until the first ages out
    assert throttle.wait() == 30.0
    assert TokenThrottle(recent, budget_tpm=None).wait() == 0.0
    assert throttle.wait(cancelled=lambda: True) == 0.0


def test_tpm_budget_env_is_checked() -> None:
    assert Settings.from_env({}).tpm_budget is None
    assert Settings.from_env({"HANGAR_EVAL_TPM_BUDGET": "40000"}).tpm_budget == 40000
    for bad in ("lots", "0"):
        with pytest.raises(ValueError, match="HANGAR_EVAL_TPM_BUDGET"):
            _ = Settings.from_env({"HANGAR_EVAL_TPM_BUDGET": bad}).tpm_budget


def test_eval_runs_take_at_most_half_the_run_slots_and_queue_behind_interactive_runs() -> None:
    shipped = yaml.safe_load(
        (
            Path(__file__).parents[2] / "hangar_dagster" / "orchestration" / "dagster.yaml"
        ).read_text()
    )
    config = shipped["run_coordinator"]["config"]
    (limit,) = [
        x
        for x in config["tag_concurrency_limits"]
        if x["key"] == "hangar/queue" and x["value"] == "eval"
    ]
    assert 0 < limit["limit"] <= config["max_concurrent_runs"] // 2


def test_trials_runs_are_tagged_as_eval_work(exp: ResolvedExperiment) -> None:
    tags = stage_tags(exp, "trials")
    assert tags["hangar/queue"] == "eval"
    assert int(tags["dagster/priority"]) < 0
    assert "hangar/queue" not in stage_tags(exp, "base_checks")


def test_a_trials_run_given_its_due_keys_covers_only_their_rectangle(
    exp: ResolvedExperiment,
) -> None:
    import dagster as dg

    from hangar_dagster.orchestration.stages import RANGE_END, RANGE_START, partitions

    *_, trials_def = partitions(exp)
    last = exp.trial_keys()[-1]
    due = [k for k in exp.trial_keys() if k.task_rep == last.task_rep]
    tags = stage_tags(exp, "trials", due)
    covered = trials_def.get_partition_keys_in_range(
        dg.PartitionKeyRange(tags[RANGE_START], tags[RANGE_END])
    )
    assert sorted(covered) == sorted(f"{k.task_rep}|{k.variant}" for k in due)
    assert tags["hangar/queue"] == "eval"
    whole = stage_tags(exp, "trials")
    assert (
        len(
            trials_def.get_partition_keys_in_range(
                dg.PartitionKeyRange(whole[RANGE_START], whole[RANGE_END])
            )
        )
        == len(trials_def.get_partition_keys())
        > len(covered)
    )


def test_the_slice_size_is_a_setting_and_narrows_the_run(exp: ResolvedExperiment) -> None:
    import dagster as dg

    from hangar_dagster.orchestration.stages import RANGE_END, RANGE_START, partitions
    from hangar_dagster.queue.partitions import RUN_PARTITIONS
    from hangar_dagster.queue.retries import RetryConfigError

    assert Settings.from_env({}).run_partitions == RUN_PARTITIONS
    width = len(exp.variants)
    limit = Settings.from_env({"HANGAR_RUN_PARTITIONS": str(width)}).run_partitions
    *_, trials_def = partitions(exp)
    tags = stage_tags(exp, "trials", exp.trial_keys(), limit)
    covered = trials_def.get_partition_keys_in_range(
        dg.PartitionKeyRange(tags[RANGE_START], tags[RANGE_END])
    )
    assert 0 < len(covered) <= width < len(exp.trial_keys())  # one task_rep row, not all of them
    assert len({k.split("|")[0] for k in covered}) == 1
    with pytest.raises(RetryConfigError, match=r"HANGAR_RUN_PARTITIONS='0' is below 1"):
        _ = Settings.from_env({"HANGAR_RUN_PARTITIONS": "0"}).run_partitions
