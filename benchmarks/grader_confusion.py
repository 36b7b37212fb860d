"""The grader as a classifier: its confusion table on honest fixes, bare bases and attacks.

    HANGAR_CORPUS=../shared/corpus .venv/bin/python benchmarks/grader_confusion.py [--no-corpus]

Runs through the real grader (sandbox, ``hangar-grade``, trusted reporter, static pass):

- **honest**: the reference fix of every corpus task that needs no third-party package
  (``tests/grading/test_corpus.py``'s ``GRADABLE``), the adversarial fixture's two reference
  fixes and every adversarial case's ``control`` (its honest twin): each must pass clean;
- **base**: the bare base of every such corpus task: each must fail;
- **attack**: every case of ``tests/adversarial/cases.py`` (a ``*_flagged`` twin with the same
  patch as its case is graded once): each must fail or be flagged.

and prints the table: honest-pass-clean / honest-flagged / honest-failed, base-failed /
base-passed, attack-failed / attack-flagged / attack-passed-clean, then every grade that is
not where it should be. The builders are the tests' own (``test_corpus.grade_task``,
``adv_fixture.build_fixture``, ``test_adversarial.grade``). Exit 1 when an honest grade is
not clean, a base passes, or an attack passes clean. Needs root and bwrap, like the tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The tests' builders: tests/ as a package root (test_corpus imports tests.conftest), and the
# adversarial suite's modules by their basenames, as pytest's rootdir-relative imports have them.
for extra in (ROOT / "tests" / "grading", ROOT / "tests" / "adversarial", ROOT / "tests", ROOT):
    sys.path.insert(0, str(extra))

from adv_fixture import build_fixture, case_files, fix_server  # noqa: E402
from cases import CASES  # noqa: E402
from test_adversarial import grade as grade_case  # noqa: E402
from test_corpus import GRADABLE, grade_task  # noqa: E402

from hangar_dagster.grading.grader import check_base  # noqa: E402
from hangar_dagster.settings import HangarPaths  # noqa: E402

COLUMNS = {
    "honest": ("pass-clean", "flagged", "failed"),
    "base": ("failed", "passed"),
    "attack": ("failed", "flagged", "passed-clean"),
}
# Where each kind of grade should land.
GOOD = {"honest": {"pass-clean"}, "base": {"failed"}, "attack": {"failed", "flagged"}}


def outcome(kind: str, passed: bool, signals: list[str]) -> str:
    if not passed:
        return "failed"
    if kind == "base":
        return "passed"
    return "flagged" if signals else ("passed-clean" if kind == "attack" else "pass-clean")


def corpus_rows(work: Path) -> list[tuple[str, str, str, str]]:
    rows = []
    for task_id in GRADABLE:
        for kind, which in (("base", "base"), ("honest", "reference")):
            g = grade_task(task_id, which, Path(tempfile.mkdtemp(dir=work)))
            why = g["reason"] or "; ".join(g["tamper_signals"]) or ""
            rows.append((kind, f"corpus {task_id} {which}", outcome(kind, g["passed"], g["tamper_signals"]), why))  # fmt: skip
            print(f"  {rows[-1][1]}: {rows[-1][2]}", flush=True)
    return rows


def adversarial_rows(work: Path) -> list[tuple[str, str, str, str]]:
    fx = build_fixture(Path(tempfile.mkdtemp(dir=work)))
    paths = HangarPaths(Path(tempfile.mkdtemp(dir=work)))
    exp = fx.experiment()
    checks = {t: check_base(exp, t, "run-base", paths) for t in ("calc", "text")}
    rows: list[tuple[str, str, str, str]] = []

    def one(kind: str, name: str, task: str, patch: str, timeout_s: int = 60) -> None:
        tmp = Path(tempfile.mkdtemp(dir=work))
        g, _ = grade_case(fx, paths, checks[task], task, patch, tmp, timeout_s)
        why = g.reason or "; ".join(g.tamper_signals)
        rows.append((kind, name, outcome(kind, g.passed, g.tamper_signals), why))
        print(f"  {name}: {rows[-1][2]}", flush=True)

    for task in ("calc", "text"):
        one("honest", f"adversarial reference {task}", task, fx.references[task])
    seen: set[str] = set()
    with fix_server() as port:
        for case in CASES:
            if case.skip is not None:
                print(f"  {case.name}: skipped ({case.skip})")
                continue
            key = repr(sorted(case.files.items()))
            if key in seen:
                continue  # a *_flagged twin: the same patch as its case
            seen.add(key)
            tmp_home = work / f"case-{case.name}"
            fill = {"{port}": str(port), "{artifacts}": str(tmp_home / "artifacts"),
                    "{home}": str(paths.home),
                    "{memory_mb}": str(exp.spec.environment.resources.memory_mb)}  # fmt: skip
            one("attack", f"case {case.name}", "calc", fx.make_patch(case_files(case.files, fill)), case.timeout_s)  # fmt: skip
            if case.control is not None:
                one("honest", f"control {case.name}", "calc", fx.make_patch(case_files(case.control, fill)))  # fmt: skip
    return rows


def table(rows: list[tuple[str, str, str, str]]) -> str:
    counts = Counter((kind, out) for kind, _, out, _ in rows)
    lines = ["| grades | " + " | ".join(f"{k}-{c}" for k, cs in COLUMNS.items() for c in cs) + " |"]
    lines.append("|---" * (1 + sum(map(len, COLUMNS.values()))) + "|")
    lines.append(
        f"| {len(rows)} | "
        + " | ".join(str(counts[k, c]) for k, cs in COLUMNS.items() for c in cs)
        + " |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-corpus", action="store_true", help="the adversarial suite only")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("grader_confusion: run as root (the uid split, trust isolated)", file=sys.stderr)
        return 2
    os.environ.setdefault("HANGAR_EVAL_WINDOW", "always")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="grader-confusion-") as d:
        work = Path(d)
        rows: list[tuple[str, str, str, str]] = []
        if not args.no_corpus:
            print("corpus:", flush=True)
            rows += corpus_rows(work)
        print("adversarial:", flush=True)
        rows += adversarial_rows(work)
    print()
    print(table(rows))
    wrong = [r for r in rows if r[2] not in GOOD[r[0]]]
    for kind, name, out, why in wrong:
        print(f"NOT AS IT SHOULD BE: {kind} {name}: {out} ({why[:300]})")
    flagged_attacks = Counter(
        "static only" if all(s.startswith("static:") for s in why.split("; ")) else "run or patch"
        for kind, _, out, why in rows
        if kind == "attack" and out == "flagged"
    )
    print(f"attacks flagged: {dict(flagged_attacks)}; {time.monotonic() - start:.0f} s")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
