"""The report of one experiment: the question, one picture, five lines per variant, health, and
the rows that failed. Built from the store and the resolved spec; no Dagster.

``build_report`` reads; ``to_markdown``, ``to_html`` and ``to_json`` render the same ``Report``;
``write_report`` puts report.md, report.html (self-contained: the figure is inlined) and
figure.png into a folder. Every rate is in points with its 95% interval and n
(``results.stats``); what a reader could not read is the readback (``results.readback``).
docs/report.md says what each part means and how it is computed.
"""

from __future__ import annotations

import base64
import html
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hangar_dagster.experiment.plan import ResolvedExperiment, ResolvedVariant
from hangar_dagster.queue.retries import EvidenceClass, evidence_class
from hangar_dagster.results import stats
from hangar_dagster.results.readback import Arm, Number, Page, readback
from hangar_dagster.results.records import (
    BaseCheckRecord,
    GradeRecord,
    GradeTestRecord,
    PinSetRecord,
    TrialRecord,
)
from hangar_dagster.results.report_trials import (
    TRIALS_DIR,
    Evidence,
    page_name,
    write_trial_page,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths
from hangar_dagster.trials.redact import redact

MAX_FLIPS = 5  # per kind in a Why line; the JSON carries all of them
MAX_FAILED_TESTS = 3  # per failed row


@dataclass(frozen=True)
class Row:
    """A trial key's attempt that counts, with its grade, as the report reads it."""

    trial_key: str
    variant: str
    task: str
    replicate: int
    attempt: int
    evidence: EvidenceClass
    outcome_class: str
    passed: bool | None
    flagged: bool  # a pass that carries a tamper or run signal: counted apart
    trust: str | None
    hidden: dict[str, int]
    why: str | None  # for a row that did not pass: the grader's or the trial's reason

    @property
    def counted(self) -> bool:
        """In the headline: admissible, on a valid task, and not a flagged pass."""
        return self.evidence == "admissible" and not self.flagged


@dataclass(frozen=True)
class Health:
    trials: int  # trial keys with an attempt
    admissible: int
    execution_failures: int
    evidence_failures: int
    infra_retries: int  # attempts an infra error made the queue run again
    flagged_passes: int
    flagged: tuple[str, ...]  # their trial keys
    trust: dict[str, int]
    cost_usd: float  # every attempt, retries too: what was spent
    tokens: int
    passed: int  # counted passes
    cost_per_pass_usd: float | None
    tokens_per_pass: float | None
    cost_estimated_usd: float = 0.0  # the part of cost_usd that is an estimate of unknown costs
    # Trial keys whose counting trial is a reused measurement of an earlier experiment
    # (experiment/reuse.py), and those experiments; the rest ran (and were paid) here.
    reused_keys: tuple[str, ...] = ()
    reused_from: tuple[str, ...] = ()
    fresh_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class FiveLines:
    changed: str
    moved: str
    why: str
    learned: str
    reproduce: str

    def items(self) -> list[tuple[str, str]]:
        return [
            ("Changed", self.changed),
            ("Moved", self.moved),
            ("Why", self.why),
            ("Learned", self.learned),
            ("Reproduce", self.reproduce),
        ]


@dataclass(frozen=True)
class VariantReport:
    name: str
    changes: str | None
    is_baseline: bool
    rate: stats.Rate | None  # None: no counted trial
    difference: stats.Difference | None  # against the baseline
    power: stats.Power | None
    task_flips: tuple[stats.TaskFlip, ...]
    test_flips: tuple[stats.HiddenTestFlip, ...]
    verdict: str | None  # shown | not shown | undecided (None: the baseline, or no comparison)
    lines: FiveLines
    health: Health


@dataclass(frozen=True)
class Report:
    experiment_id: str
    name: str
    spec_path: str
    spec_digest: str
    question: str | None
    hypothesis: str | None
    min_effect_pts: float | None
    rule: str | None
    baseline: str | None
    variants: tuple[VariantReport, ...]
    invalid_tasks: dict[str, str | None]
    failed: tuple[Row, ...]  # worst first
    readback: tuple[str, ...]
    standin: bool  # a variant ran the scripted stand-in agent, not a model
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The grader digest each grade of a counting attempt was made under (a regrade's is the
    # new grader's; a reused grade keeps the one that made it), with how many; and the
    # experiment a regrade graded again.
    graders: dict[str, int] = field(default_factory=dict)
    regrade_of: str | None = None
    # Per trial key, the attempt that counts with its grade and tests: the trial pages.
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)

    def variant(self, name: str) -> VariantReport:
        return next(v for v in self.variants if v.name == name)


# --- reading the store ------------------------------------------------------------------------


def _why(
    trial: TrialRecord,
    grade: GradeRecord | None,
    tests: Sequence[GradeTestRecord],
    task_invalid: bool = False,
) -> str:
    if trial.outcome_class == "infra_error":
        return f"infra error ({trial.infra_reason or 'unknown'}): {trial.error or 'retried'}"
    if grade is None:
        return f"{trial.outcome_class}, not graded" + (f": {trial.error}" if trial.error else "")
    if grade.task_invalid or task_invalid:
        return "the task is invalid: its base check failed"
    parts: list[str] = [] if trial.outcome_class == "completed" else [str(trial.outcome_class)]
    if grade.reason:
        parts.append(grade.reason)
    failed = [t for t in tests if t.outcome in ("failed", "error")]
    if failed:
        shown = "; ".join(
            t.test_id + (f" ({t.message})" if t.message else "") for t in failed[:MAX_FAILED_TESTS]
        )
        more = (
            f" and {len(failed) - MAX_FAILED_TESTS} more" if len(failed) > MAX_FAILED_TESTS else ""
        )
        parts.append(f"{len(failed)} hidden test(s) failed: {shown}{more}")
    elif not grade.reason:
        h = grade.hidden_tests
        ran = h.get("passed", 0) + h.get("failed", 0) + h.get("errors", 0)
        parts.append(f"{h.get('passed', 0)} of {ran} hidden tests passed")
    return "; ".join(parts)


def _rows(
    trials: Sequence[TrialRecord],
    grades: Mapping[str, GradeRecord],
    tests: Mapping[tuple[str, int], list[GradeTestRecord]],
    invalid: Mapping[str, str | None],
) -> list[Row]:
    out = []
    for t in trials:
        g = grades.get(t.trial_key)
        if g is not None and g.attempt != t.attempt:
            g = None  # the grade of an earlier attempt: this one is not graded yet
        ev = evidence_class(t, g, base_check_invalid=t.task in invalid)
        passed = None if g is None else g.passed
        flagged = bool(passed and g is not None and g.tamper_signals)
        ok = ev == "admissible" and bool(passed) and not flagged
        out.append(
            Row(
                trial_key=t.trial_key,
                variant=t.variant,
                task=t.task,
                replicate=t.replicate,
                attempt=t.attempt,
                evidence=ev,
                outcome_class=t.outcome_class,
                passed=passed,
                flagged=flagged,
                trust=None if g is None else g.trust,
                hidden=dict(g.hidden_tests) if g is not None else {},
                why=None
                if ok
                else _flag_why(g)
                if flagged
                else _why(t, g, tests.get((t.trial_key, t.attempt), []), t.task in invalid),
            )
        )
    return out


def _flag_why(g: GradeRecord | None) -> str:
    assert g is not None
    return "passed, but flagged: " + "; ".join(g.tamper_signals)


def outcomes(rows: Sequence[Row], variant: str) -> dict[str, list[bool]]:
    """{task: [passed?, ...]} of a variant's counted rows: what the statistics read."""
    out: dict[str, list[bool]] = {}
    for r in rows:
        if r.variant == variant and r.counted:
            out.setdefault(r.task, []).append(bool(r.passed))
    return out


def _health(rows: Sequence[Row], attempts: Sequence[TrialRecord], variant: str) -> Health:
    mine = [r for r in rows if r.variant == variant]
    tried = [a for a in attempts if a.variant == variant]
    # A reused trial was paid by the experiment that measured it: not spent here.
    spent = [a for a in tried if not a.reused_from]
    reused = sorted({a.trial_key for a in tried if a.reused_from})
    ev = Counter(r.evidence for r in mine)
    passed = sum(1 for r in mine if r.counted and r.passed)
    # An unknown cost (None) counts as its estimate, as the budget does.
    estimated = sum(a.cost_estimate_usd or 0.0 for a in spent if a.cost_usd is None)
    cost = sum(a.cost_usd for a in spent if a.cost_usd is not None) + estimated
    tokens = sum(a.tokens_in + a.tokens_out for a in spent)
    flagged = tuple(r.trial_key for r in mine if r.flagged)
    return Health(
        trials=len(mine),
        admissible=ev["admissible"],
        execution_failures=ev["execution_failure"],
        evidence_failures=ev["evidence_failure"],
        infra_retries=len(tried) - len(mine),
        flagged_passes=len(flagged),
        flagged=flagged,
        trust=dict(sorted(Counter(r.trust for r in mine if r.trust).items())),
        cost_usd=round(cost, 6),
        tokens=tokens,
        passed=passed,
        cost_per_pass_usd=round(cost / passed, 6) if passed else None,
        tokens_per_pass=round(tokens / passed, 1) if passed else None,
        cost_estimated_usd=round(estimated, 6),
        reused_keys=tuple(reused),
        reused_from=tuple(
            sorted(
                {str((a.reused_from or {}).get("experiment_id")) for a in tried if a.reused_from}
            )
        ),
        fresh_keys=tuple(r.trial_key for r in mine if r.trial_key not in set(reused)),
    )


# --- the five lines ---------------------------------------------------------------------------


def _names(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


def _setup(v: ResolvedVariant, pin: PinSetRecord | None) -> dict[str, Any]:
    """What Changed compares: from the pin set (the locks as pinned) and the lock directory."""
    fp = pin.harness_fingerprint if pin is not None else {}
    env = pin.environment if pin is not None and pin.environment else {}
    if not env:
        from hangar_dagster.experiment.drift import environment_pins

        env = environment_pins(v.environment)
    lock = Path(v.harness_path)
    return {
        "harness": v.harness_lock,
        "model": pin.model if pin is not None else v.model,
        "cli": fp.get("cli"),
        "cli_version": fp.get("cli_version"),
        "adapter": fp.get("adapter", v.adapter),
        "instructions_digest": fp.get("instructions_digest"),
        "skills_digest": fp.get("skills_digest"),
        "plugins_digest": fp.get("plugins_digest"),
        "skills": _names(lock / "skills"),
        "plugins": _names(lock / "plugins"),
        "environment": env,
    }


def _cli(s: Mapping[str, Any]) -> str:
    cli = s["cli"] or s["adapter"]
    return f"{cli} {s['cli_version']}" if s["cli_version"] else str(cli)


def _changed(
    words: str | None,
    mine: Mapping[str, Any],
    base: Mapping[str, Any] | None,
    role: str = "The baseline: ",
) -> str:
    """The spec's words, then what the locks changed against the baseline's (``base``); with
    no ``base``, what this variant runs, after ``role``."""
    lead = f"{words}. " if words else ""
    if base is None:
        return f"{lead}{role}model {mine['model']}, {_cli(mine)}, harness {mine['harness']}" + (
            f", skills {', '.join(mine['skills'])}" if mine["skills"] else ""
        )
    diffs = []
    if mine["model"] != base["model"]:
        diffs.append(f"model {base['model']} -> {mine['model']}")
    if _cli(mine) != _cli(base):
        diffs.append(f"CLI {_cli(base)} -> {_cli(mine)}")
    if mine["instructions_digest"] != base["instructions_digest"]:
        diffs.append("instructions rewritten")
    for kind in ("skills", "plugins"):
        added = [s for s in mine[kind] if s not in base[kind]]
        removed = [s for s in base[kind] if s not in mine[kind]]
        if added:
            diffs.append(f"{kind} added: {', '.join(added)}")
        if removed:
            diffs.append(f"{kind} removed: {', '.join(removed)}")
        if not added and not removed and mine[f"{kind}_digest"] != base[f"{kind}_digest"]:
            diffs.append(f"{kind} edited")
    env_a, env_b = base["environment"], mine["environment"]
    for key in sorted(set(env_a) | set(env_b)):
        if env_a.get(key) != env_b.get(key):
            diffs.append(f"environment {key} {env_a.get(key)!r} -> {env_b.get(key)!r}")
    if not diffs:
        return f"{lead}Nothing against the baseline: the same model, CLI, instructions, skills, plugins and environment"
    same = [
        what
        for what, key in (
            ("model", "model"),
            ("CLI", "cli"),
            ("instructions", "instructions_digest"),
        )
        if not any(d.startswith(what) for d in diffs)
    ]
    tail = f" ({', '.join(same)} the same)" if same else ""
    return f"{lead}Against the baseline: {'; '.join(diffs)}{tail}"


def _design(rate: stats.Rate) -> str:
    per = rate.n_trials / rate.n_tasks if rate.n_tasks else 0
    return f"{rate.n_tasks} task(s) x {per:g} trial(s)"


def _moved(
    v_rate: stats.Rate | None,
    b_rate: stats.Rate | None,
    d: stats.Difference | None,
    baseline: str | None,
) -> str:
    if v_rate is None:
        return "no counted trial: nothing to read (see health)"
    if baseline is None:
        return f"{v_rate.label}; no baseline to compare with"
    if b_rate is None or d is None:
        return f"{v_rate.label}; no task counted in both it and {baseline}: nothing pairs"
    per = d.variant_trials / d.n_tasks
    return (
        f"{baseline} {b_rate.label} to {v_rate.label}: {d.label}, on {d.n_tasks} task(s) x "
        f"{per:.3g} trial(s)"
    )


def _first_why(rows: Sequence[Row], variant: str, task: str) -> str | None:
    return next((r.why for r in rows if r.variant == variant and r.task == task and r.why), None)


def _why_line(
    task_flips: Sequence[stats.TaskFlip],
    test_flips: Sequence[stats.HiddenTestFlip],
    rows: Sequence[Row],
    baseline: str,
    variant: str,
) -> str:
    """The tasks and hidden tests that flipped, broken (failures) first, each with the grader's
    reason from the arm where it failed."""
    if not task_flips and not test_flips:
        return "no task and no hidden test moved"
    parts = []
    for direction in ("broken", "fixed"):
        tf = [f for f in task_flips if f.direction == direction]
        if tf:
            said = []
            for f in tf[:MAX_FLIPS]:
                why = _first_why(rows, variant if direction == "broken" else baseline, f.task)
                said.append(
                    f"{f.task} {f.baseline_pts:.1f} to {f.variant_pts:.1f} pts "
                    f"({f.baseline_trials} vs {f.variant_trials} trials)"
                    + (
                        f", {'failing' if direction == 'broken' else 'was failing'}: {why}"
                        if why
                        else ""
                    )
                )
            more = f" and {len(tf) - MAX_FLIPS} more" if len(tf) > MAX_FLIPS else ""
            parts.append(f"tasks {direction}: " + "; ".join(said) + more)
    for direction in ("broken", "fixed"):
        hf = [f for f in test_flips if f.direction == direction]
        if hf:
            more = f" and {len(hf) - MAX_FLIPS} more" if len(hf) > MAX_FLIPS else ""
            parts.append(
                f"hidden tests {direction}: "
                + "; ".join(_test_flip(f) for f in hf[:MAX_FLIPS])
                + more
            )
    return ". ".join(parts)


def _test_flip(f: stats.HiddenTestFlip) -> str:
    why = f" ({f.message})" if f.message else ""
    return f"{f.task} {f.test_id} {f.baseline_pts:.1f} to {f.variant_pts:.1f} pts{why}"


def verdict_of(d: stats.Difference, min_effect_pts: float) -> str:
    """shown: the whole interval clears the effect sought; not shown: it lies below it;
    undecided: it contains it."""
    if d.low_pts >= min_effect_pts:
        return "shown"
    if d.high_pts < min_effect_pts:
        return "not shown"
    return "undecided"


def _learned(
    d: stats.Difference | None,
    p: stats.Power | None,
    min_effect: float | None,
    hypothesis: str | None,
) -> tuple[str | None, str]:
    if d is None:
        return None, "undecided: nothing was paired with the baseline"
    ci = f"{d.low_pts:+.1f} to {d.high_pts:+.1f} pts"
    if min_effect is None:
        return "undecided", (
            f"undecided: there is no decision rule to close the hypothesis against "
            f"(decide.min_effect_pts); the difference's interval is {ci}"
        )
    v = verdict_of(d, min_effect)
    claim = f" that {hypothesis[0].lower()}{hypothesis[1:].rstrip('.')}" if hypothesis else ""
    if v == "shown":
        return (
            v,
            f"shown: the interval {ci} lies above the {min_effect:g} pts sought, so the hypothesis{claim} holds here",
        )
    if v == "not shown":
        return (
            v,
            f"not shown: the interval {ci} lies below the {min_effect:g} pts sought; an effect that large is ruled out here",
        )
    need = ""
    if p is not None and p.tasks_needed:
        need = f"; {p.tasks_needed} tasks would detect {min_effect:g} pts at 80% power"
    width = d.high_pts - d.low_pts
    return v, (
        f"undecided: the interval {ci} ({width:.1f} pts wide) is wider than the "
        f"{min_effect:g} pts sought and contains it{need}"
    )


def _reproduce(
    spec_path: str, spec_digest: str, v: ResolvedVariant, pin: PinSetRecord | None
) -> str:
    return (
        f"hangar experiment run {spec_path} --wait (spec {spec_digest}; pin set "
        f"{pin.pin_set if pin else v.pin_set}; harness {v.harness_lock}; model {v.model})"
    )


# --- the report -------------------------------------------------------------------------------


def _failed_order(r: Row) -> tuple[int, float, str]:
    rank = {"admissible": 0, "evidence_failure": 1, "execution_failure": 2}[r.evidence]
    ran = r.hidden.get("passed", 0) + r.hidden.get("failed", 0) + r.hidden.get("errors", 0)
    share = r.hidden.get("passed", 0) / ran if ran else 0.0
    return (rank, share, r.trial_key)


def counted_outcomes(exp: ResolvedExperiment, store: Store) -> dict[str, dict[str, list[bool]]]:
    """{variant: {task: [passed?, ...]}} over the counted trials, as the report's rates read
    them: what `hangar experiment compare` pairs between two experiments."""
    eid = exp.experiment_id
    grades = {g.trial_key: g for g in store.grades(eid)}
    invalid = {t: c.reason for t, c in store.base_checks(eid).items() if c.invalid}
    rows = _rows(store.trials(eid), grades, {}, invalid)
    return {name: out for name in exp.variants if (out := outcomes(rows, name))}


@dataclass(frozen=True)
class Stored:
    """What the report reads of one experiment, as the store returns it."""

    spec_digest: str
    trials: Sequence[TrialRecord]  # each key's attempt that counts (the highest)
    attempts: Sequence[TrialRecord]  # every attempt, retried ones too
    grades: Sequence[GradeRecord]  # the grades of the attempts that count
    tests: Sequence[GradeTestRecord]  # per-test rows of every graded attempt
    base_checks: Mapping[str, BaseCheckRecord]
    pins: Mapping[str, PinSetRecord]  # variant -> its pin set

    @classmethod
    def read(cls, exp: ResolvedExperiment, store: Store) -> Stored:
        eid = exp.experiment_id
        record = store.experiment(eid)
        return cls(
            spec_digest=record.spec_digest if record is not None else "(not stored)",
            trials=store.trials(eid),
            attempts=store.trials(eid, all_attempts=True),
            grades=store.grades(eid),
            tests=store.grade_tests(eid),
            base_checks=store.base_checks(eid),
            pins=store.pins(eid),
        )


def build_report(exp: ResolvedExperiment, store: Store) -> Report:
    return report_of(exp, Stored.read(exp, store))


def report_of(exp: ResolvedExperiment, stored: Stored) -> Report:
    """The report from what was read (``Stored``): no store, and no I/O but the lock
    directories the Changed lines list (tests/test_example.py reports on predicted outcomes)."""
    eid = exp.experiment_id
    spec = exp.spec
    spec_digest = stored.spec_digest
    trials, attempts, pins = stored.trials, stored.attempts, stored.pins
    grades = {g.trial_key: g for g in stored.grades}
    tests: dict[tuple[str, int], list[GradeTestRecord]] = {}
    for t in stored.tests:
        tests.setdefault((t.trial_key, t.attempt), []).append(t)
    invalid = {t: c.reason for t, c in stored.base_checks.items() if c.invalid}
    rows = _rows(trials, grades, tests, invalid)
    baseline = spec.baseline if spec.baseline in exp.variants else None
    min_effect = spec.decide.min_effect_pts if spec.decide is not None else None
    setups = {n: _setup(v, pins.get(n)) for n, v in exp.variants.items()}
    counted_tests = {(r.trial_key, r.attempt) for r in rows if r.counted}

    def test_rows(variant: str) -> list[dict[str, Any]]:
        return [
            {"task": t.task, "test_id": t.test_id, "outcome": t.outcome, "message": t.message}
            for (key, attempt), ts in tests.items()
            if (key, attempt) in counted_tests and key.split("/")[0] == variant
            for t in ts
        ]

    base_out = outcomes(rows, baseline) if baseline else {}
    base_rate = stats.pass_rate(base_out) if base_out else None
    variants = []
    for name, v in exp.variants.items():
        out = outcomes(rows, name)
        rate = stats.pass_rate(out) if out else None
        is_base = name == baseline
        d = pw = None
        tflips: tuple[stats.TaskFlip, ...] = ()
        hflips: tuple[stats.HiddenTestFlip, ...] = ()
        if baseline and not is_base and out and base_out:
            try:
                d = stats.paired_difference(base_out, out)
                pw = stats.power(base_out, out, min_effect_pts=min_effect)
            except stats.NoSharedTasks:
                d = pw = None
            tflips = tuple(stats.task_flips(base_out, out))
            hflips = tuple(stats.hidden_test_flips(test_rows(baseline), test_rows(name)))
        words = spec.variants[name].changes if name in spec.variants else None
        if is_base:
            verdict = None
            lines = FiveLines(
                changed=_changed(words, setups[name], None),
                moved=(rate.label if rate else "no counted trial: nothing to read (see health)")
                + "; the other variants are read against it",
                why="the baseline: the others' flips are against it",
                learned="the baseline: the others' Learned lines close the hypothesis",
                reproduce=_reproduce(exp.spec_path, spec_digest, v, pins.get(name)),
            )
        else:
            verdict, learned = _learned(d, pw, min_effect, spec.hypothesis)
            if baseline is None:
                verdict, learned = None, "undecided: no baseline to compare with (`baseline:`)"
            lines = FiveLines(
                changed=_changed(words, setups[name], setups[baseline])
                if baseline
                else _changed(words, setups[name], None, role=""),
                moved=_moved(rate, base_rate, d, baseline),
                why=_why_line(tflips, hflips, rows, baseline, name)
                if baseline
                else "no baseline to find flips against",
                learned=learned,
                reproduce=_reproduce(exp.spec_path, spec_digest, v, pins.get(name)),
            )
        variants.append(
            VariantReport(
                name=name,
                changes=words,
                is_baseline=is_base,
                rate=rate,
                difference=d,
                power=pw,
                task_flips=tflips,
                test_flips=hflips,
                verdict=verdict,
                lines=lines,
                health=_health(rows, attempts, name),
            )
        )
    failed = tuple(sorted((r for r in rows if r.why is not None), key=_failed_order))
    evidence = tuple(
        Evidence(
            t,
            g if (g := grades.get(t.trial_key)) is not None and g.attempt == t.attempt else None,
            tuple(tests.get((t.trial_key, t.attempt), [])),
            task_invalid=t.task in invalid,
        )
        for t in sorted(trials, key=lambda t: t.trial_key)
    )
    report = Report(
        experiment_id=eid,
        name=exp.name,
        spec_path=exp.spec_path,
        spec_digest=spec_digest,
        question=spec.question,
        hypothesis=spec.hypothesis,
        min_effect_pts=min_effect,
        rule=spec.decide.rule if spec.decide is not None else None,
        baseline=baseline,
        variants=tuple(variants),
        invalid_tasks=invalid,
        failed=failed,
        readback=(),
        standin=any(v.adapter == "standin" for v in exp.variants.values()),
        evidence=evidence,
        graders=dict(sorted(Counter(g.grader_digest for g in grades.values()).items())),
        regrade_of=exp.regrade_of,
    )
    return replace(report, readback=tuple(readback(page_of(report))))


def page_of(report: Report) -> Page:
    """What the report shows, as the readback reads it."""
    arms = []
    for v in report.variants:
        numbers: list[Number] = []
        if v.rate is not None:
            r = v.rate
            numbers.append(
                Number(f"{v.name} pass rate", r.pts, r.low_pts, r.high_pts, r.n_tasks, r.n_trials)
            )
        if v.difference is not None:
            d = v.difference
            numbers.append(
                Number(
                    f"{v.name} - {report.baseline}",
                    d.pts,
                    d.low_pts,
                    d.high_pts,
                    d.n_tasks,
                    d.baseline_trials + d.variant_trials,
                )
            )
        p = v.power
        arms.append(
            Arm(
                name=v.name,
                changes=v.changes,
                numbers=tuple(numbers),
                flagged_in_headline=0,  # counted apart: Row.counted leaves them out
                mde_pts=p.mde_pts if p is not None else None,
                tasks_needed=p.tasks_needed if p is not None else None,
                trials_needed=p.trials_needed if p is not None else None,
                n_tasks=p.n_tasks if p is not None else None,
                trials_per_task=p.trials_per_task if p is not None else None,
            )
        )
    return Page(
        question=report.question,
        hypothesis=report.hypothesis,
        min_effect_pts=report.min_effect_pts,
        baseline=report.baseline,
        arms=tuple(arms),
        invalid_tasks=report.invalid_tasks,
    )


# --- rendering --------------------------------------------------------------------------------


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table_rows(report: Report) -> list[dict[str, Any]]:
    """The report's table: one row per variant, every number in points with its interval and n."""
    out = []
    for v in report.variants:
        r, d, h = v.rate, v.difference, v.health
        out.append(
            {
                "variant": v.name,
                "changes": v.changes or "",
                "pass_rate_pts": None if r is None else round(r.pts, 1),
                "ci_low_pts": None if r is None else round(r.low_pts, 1),
                "ci_high_pts": None if r is None else round(r.high_pts, 1),
                "tasks": None if r is None else r.n_tasks,
                "trials": None if r is None else r.n_trials,
                "diff_pts": None if d is None else round(d.pts, 1),
                "diff_ci_low_pts": None if d is None else round(d.low_pts, 1),
                "diff_ci_high_pts": None if d is None else round(d.high_pts, 1),
                "p_value": None if d is None else round(d.p_value, 4),
                "mde_pts": None
                if v.power is None or v.power.mde_pts is None
                else round(v.power.mde_pts, 1),
                "verdict": v.verdict or ("baseline" if v.is_baseline else ""),
                "flagged_passes": h.flagged_passes,
            }
        )
    return out


def _md_table(rows: list[dict[str, Any]]) -> str:
    head = [
        "variant",
        "pass rate (pts, 95% CI)",
        "n",
        "vs baseline (pts, 95% CI)",
        "p",
        "MDE",
        "verdict",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        rate = (
            "-"
            if r["pass_rate_pts"] is None
            else f"{r['pass_rate_pts']:.1f} ({r['ci_low_pts']:.1f}-{r['ci_high_pts']:.1f})"
        )
        n = "-" if r["tasks"] is None else f"{r['tasks']} tasks, {r['trials']} trials"
        diff = (
            "-"
            if r["diff_pts"] is None
            else f"{r['diff_pts']:+.1f} ({r['diff_ci_low_pts']:+.1f} to {r['diff_ci_high_pts']:+.1f})"
        )
        p = "-" if r["p_value"] is None else f"{r['p_value']:.3g}"
        mde = "-" if r["mde_pts"] is None else f"{r['mde_pts']:.1f}"
        lines.append(f"| {r['variant']} | {rate} | {n} | {diff} | {p} | {mde} | {r['verdict']} |")
    return "\n".join(lines)


def five_lines_markdown(v: VariantReport) -> str:
    return "\n".join(f"- **{k}:** {_md(t)}" for k, t in v.lines.items())


def _md(text: str) -> str:
    # CommonMark leaves intra-word underscores alone (test_x.py); a pipe would end a table cell
    return text.replace("|", "\\|").replace("<", "&lt;")


def _health_lines(v: VariantReport) -> list[str]:
    h = v.health
    trust = ", ".join(f"{k} {n}" for k, n in h.trust.items()) or "none graded"
    per_pass = (
        f"${h.cost_per_pass_usd:.4f} and {h.tokens_per_pass:g} tokens per passed trial"
        if h.cost_per_pass_usd is not None and h.tokens_per_pass is not None
        else "no passed trial"
    )
    flagged = f" ({', '.join(h.flagged)})" if h.flagged else ""
    estimated = (
        f" (${h.cost_estimated_usd:.4f} of it estimated: costs unknown)"
        if h.cost_estimated_usd
        else ""
    )
    reuse = []
    if h.reused_keys:
        fresh = ", ".join(h.fresh_keys) if len(h.fresh_keys) <= 10 else f"{len(h.fresh_keys)} keys"
        reuse = [
            f"reused: {len(h.reused_keys)} trial(s) measured by {', '.join(h.reused_from)}, "
            f"not run or paid here; fresh: {len(h.fresh_keys)} ({fresh or 'none'})"
        ]
    return [
        f"{h.trials} trials: {h.admissible} admissible, {h.execution_failures} execution "
        f"failure(s), {h.evidence_failures} evidence failure(s); {h.infra_retries} infra retr"
        f"{'y' if h.infra_retries == 1 else 'ies'}",
        *reuse,
        f"flagged passes, counted apart (not in the pass rate): {h.flagged_passes}{flagged}",
        f"trust: {trust}",
        f"cost ${h.cost_usd:.4f}{estimated}, {h.tokens} tokens"
        + (" (paid here: reused trials left out)" if h.reused_keys else "")
        + f"; {per_pass}",
    ]


def _question_lines(report: Report) -> list[tuple[str, str]]:
    missing = {line.split(":")[0]: line for line in report.readback}
    rule = None
    if report.min_effect_pts is not None:
        rule = (
            f"a difference of at least {report.min_effect_pts:g} pts against {report.baseline or '(no baseline)'}"
            + (f": {report.rule}" if report.rule else "")
        )
    return [
        ("Question", report.question or missing.get("no question", "(none)")),
        ("Hypothesis", report.hypothesis or missing.get("no hypothesis", "(none)")),
        ("Decision rule", rule or missing.get("no decision rule", "(none)")),
    ]


def grader_line(report: Report) -> str | None:
    """Which grader each number was graded by (and what a regrade replaced), or None ungraded."""
    if not report.graders:
        return None
    said = "graded by " + ", ".join(
        f"grader {d} ({n} grade{'s' if n != 1 else ''})" for d, n in report.graders.items()
    )
    if report.regrade_of:
        said += (
            f"; a regrade of {report.regrade_of}: its trials' stored patches graded again, "
            "its own grades unchanged"
        )
    return said


def to_markdown(report: Report, figure: str | None = "figure.png") -> str:
    out = [f"# {report.name} ({report.experiment_id})", ""]
    for k, t in _question_lines(report):
        out.append(f"**{k}:** {_md(t)}  ")
    out.append("")
    if report.standin:
        out += ["> Stand-in: the scripted stand-in agent (no model) produced these trials.", ""]
    if graded := grader_line(report):
        out += [f"Grader: {_md(graded)}", ""]
    if figure:
        out += [
            f"![pass rate per variant and the paired difference against the baseline]({figure})",
            "",
        ]
    out += [_md_table(table_rows(report)), ""]
    out.append(
        "Pass rates are points out of 100 over tasks, with 95% intervals clustered by task; "
        "differences are paired by task (docs/report.md)."
    )
    out.append("")
    for v in report.variants:
        out += [
            f"## {v.name}" + (" (baseline)" if v.is_baseline else ""),
            "",
            five_lines_markdown(v),
            "",
        ]
    out += ["## Health", ""]
    for v in report.variants:
        out += [f"**{v.name}**", ""] + [f"- {_md(line)}" for line in _health_lines(v)] + [""]
    if report.invalid_tasks:
        out.append(
            "Invalid tasks (left out of every rate): "
            + "; ".join(
                f"{t} ({r or 'base check failed'})" for t, r in report.invalid_tasks.items()
            )
        )
    else:
        out.append("Invalid tasks: none")
    out += ["", "## Failed rows, worst first", ""]
    if report.failed:
        out += ["| trial | attempt | class | why |", "|---|---|---|---|"]
        out += [
            f"| {r.trial_key} | {r.attempt} | {r.evidence.replace('_', ' ')} | {_md(r.why or '')} |"
            for r in report.failed
        ]
    else:
        out.append("none")
    out += ["", "## Readback", ""]
    out += [f"- {_md(line)}" for line in report.readback] or [
        "clean: nothing a reader could not read"
    ]
    return "\n".join(out) + "\n"


_CSS = """body{font:15px/1.45 system-ui,sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#f4f4f4}dt{font-weight:600}dd{margin:0 0 .4rem 1.2rem}img{max-width:100%}
.readback li{color:#8a4b00}.standin{background:#fff6d6;padding:.5rem}"""


def to_html(report: Report, png: bytes | None) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{e(report.name)} ({e(report.experiment_id)})</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(report.name)} <small>({e(report.experiment_id)})</small></h1><dl>",
    ]
    for k, t in _question_lines(report):
        parts.append(f"<dt>{e(k)}</dt><dd>{e(t)}</dd>")
    parts.append("</dl>")
    if report.standin:
        parts.append(
            "<p class=standin>Stand-in: the scripted stand-in agent (no model) produced these trials.</p>"
        )
    if graded := grader_line(report):
        parts.append(f"<p id=grader>Grader: {e(graded)}</p>")
    if png:
        data = base64.b64encode(png).decode()
        parts.append(
            f'<img id=figure alt="pass rate per variant and the paired difference" src="data:image/png;base64,{data}">'
        )
    rows = table_rows(report)
    parts.append(
        "<table id=summary><tr><th>variant</th><th>pass rate (pts, 95% CI)</th><th>n</th>"
        "<th>vs baseline (pts, 95% CI)</th><th>p</th><th>MDE</th><th>verdict</th></tr>"
    )
    for line in _md_table(rows).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        parts.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    for v in report.variants:
        parts.append(f"<h2>{e(v.name)}{' (baseline)' if v.is_baseline else ''}</h2><dl class=five>")
        parts += [f"<dt>{e(k)}</dt><dd>{e(t)}</dd>" for k, t in v.lines.items()]
        parts.append("</dl>")
    parts.append("<h2>Health</h2>")
    for v in report.variants:
        parts.append(
            f"<h3>{e(v.name)}</h3><ul>"
            + "".join(f"<li>{e(x)}</li>" for x in _health_lines(v))
            + "</ul>"
        )
    invalid = "; ".join(
        f"{t} ({r or 'base check failed'})" for t, r in report.invalid_tasks.items()
    )
    parts.append(f"<p>Invalid tasks: {e(invalid or 'none')}</p>")
    parts.append("<h2>Failed rows, worst first</h2>")
    if report.failed:
        parts.append(
            "<table id=failed><tr><th>trial</th><th>attempt</th><th>class</th><th>why</th></tr>"
        )
        parts += [
            f"<tr><td>{_trial_link(report, r.trial_key)}</td><td>{r.attempt}</td><td>{e(r.evidence.replace('_', ' '))}</td><td>{e(r.why or '')}</td></tr>"
            for r in report.failed
        ]
        parts.append("</table>")
    else:
        parts.append("<p>none</p>")
    if report.evidence:
        parts.append(
            "<h2>Trials</h2><p>Each trial's page shows its patch, trace (messages and tool "
            "calls), verify output, grade log and per-test results.</p><table id=trials>"
            "<tr><th>trial</th><th>attempt</th><th>outcome</th><th>grade</th><th>hidden tests</th>"
            "<th>source</th></tr>"
        )
        for ev in report.evidence:
            g = ev.grade
            grade = "-" if g is None else ("pass" if g.passed else "fail")
            h = g.hidden_tests if g is not None else {}
            tests = f"{h.get('passed', 0)}/{h.get('total', 0)}" if h else "-"
            parts.append(
                f"<tr><td>{_trial_link(report, ev.trial.trial_key)}</td><td>{ev.trial.attempt}</td>"
                f"<td>{e(ev.trial.outcome_class)}</td><td>{grade}</td><td>{tests}</td>"
                f"<td>{e(trial_source(ev.trial))}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Readback</h2><ul class=readback>")
    parts += [f"<li>{e(line)}</li>" for line in report.readback] or ["<li>clean</li>"]
    parts.append("</ul></body></html>\n")
    return "".join(parts)


def trial_source(t: TrialRecord) -> str:
    """Fresh (run here), a shadow's merge, or the earlier measurement a reused trial is."""
    if t.source == "shadow":
        return f"shadow of {t.shadow_of}"
    r = t.reused_from
    if not r:
        return "fresh"
    return f"reused: {r.get('experiment_id')} {r.get('trial_key')} attempt {r.get('attempt')}"


def _trial_link(report: Report, trial_key: str) -> str:
    """The trial key, linked to its page when the report has one (relative: opens from disk)."""
    key = html.escape(trial_key)
    if not any(ev.trial.trial_key == trial_key for ev in report.evidence):
        return key
    return f'<a href="{TRIALS_DIR}/{html.escape(page_name(trial_key))}">{key}</a>'


def to_json(report: Report) -> dict[str, Any]:
    """Every figure of the report, JSON-able (the trial pages by their relative paths)."""
    data = asdict(replace(report, evidence=()))
    data.pop("evidence")
    data["trial_pages"] = {
        ev.trial.trial_key: f"{TRIALS_DIR}/{page_name(ev.trial.trial_key)}"
        for ev in report.evidence
    }
    data["table"] = table_rows(report)
    for v, raw in zip(report.variants, data["variants"], strict=True):
        raw["lines"] = dict(v.lines.items())
        raw["rate_label"] = v.rate.label if v.rate else None
        raw["difference_label"] = v.difference.label if v.difference else None
        raw["power_label"] = v.power.label if v.power else None
    out: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return out


def report_dir(paths: HangarPaths, experiment_id: str) -> Path:
    """Where the index stage and `hangar experiment report` write the report by default."""
    return paths.experiment_dir(experiment_id) / "report"


@dataclass(frozen=True)
class Written:
    markdown: Path
    html: Path
    figure: Path
    trials: tuple[Path, ...] = ()  # one page per trial key, under trials/


def write_report(report: Report, out_dir: Path, canary: str | None) -> Written:
    """report.md, report.html (the figure inlined), figure.png and a page per trial under
    ``trials/`` into ``out_dir``: one folder that opens from disk."""
    from hangar_dagster.results.figure import figure_png

    out_dir.mkdir(parents=True, exist_ok=True)
    png = figure_png(report)
    paths = Written(out_dir / "report.md", out_dir / "report.html", out_dir / "figure.png")
    paths.figure.write_bytes(png)
    paths.markdown.write_text(str(redact(to_markdown(report), canary)))
    paths.html.write_text(str(redact(to_html(report, png), canary)))
    label = f"{report.name} ({report.experiment_id})"
    pages = tuple(
        write_trial_page(out_dir / TRIALS_DIR / page_name(ev.trial.trial_key), label, ev, canary)
        for ev in report.evidence
    )
    return replace(paths, trials=pages)
