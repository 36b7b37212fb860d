"""One page per trial: from a number in the report to its evidence.

A trial page shows the attempt that counts: its outcome, the grade and why, the per-test
results (``grade_tests``), the patch, the trace (messages and tool calls, event by event),
the verify output and the grade log. It is plain HTML with no script and no outside link,
written under ``<report>/trials/``, so the report folder opens from disk; the UI's trial and
grade metadata link to the same file. Every page passes the redactor with the canary.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangar_dagster.results.records import GradeRecord, GradeTestRecord, TrialRecord
from hangar_dagster.settings import HangarPaths
from hangar_dagster.trials.redact import redact

MAX_FILE_CHARS = 200_000  # per shown file: a runaway log does not make a page unreadable
MAX_EVENTS = 500
TRIALS_DIR = "trials"
_CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
pre{background:#f6f6f6;padding:.6rem;overflow:auto;max-height:40rem;white-space:pre-wrap}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
.passed{color:#176b2c}.failed,.error{color:#a30000}.ev{margin:.3rem 0}.ev b{display:inline-block;min-width:7rem}"""


@dataclass(frozen=True)
class Evidence:
    """What a trial page shows: the attempt that counts, its grade and its hidden tests."""

    trial: TrialRecord
    grade: GradeRecord | None
    tests: tuple[GradeTestRecord, ...]
    # The task's base check found it invalid (also when stored after this grade was made).
    task_invalid: bool = False


def page_name(trial_key: str) -> str:
    """The page's file name: a trial key's ``/`` cannot be in one (``plain/median/1``)."""
    return trial_key.replace("/", "__") + ".html"


def page_path(paths: HangarPaths, experiment_id: str, trial_key: str) -> Path:
    """Where the index (and the trials and grades stages before it) write a trial's page."""
    from hangar_dagster.results.report import report_dir

    return report_dir(paths, experiment_id) / TRIALS_DIR / page_name(trial_key)


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    if len(text) > MAX_FILE_CHARS:
        text = text[:MAX_FILE_CHARS] + f"\n[... cut at {MAX_FILE_CHARS} characters]"
    return text


def _event(e: Any) -> str:
    if not isinstance(e, dict):
        return f"<div class=ev><pre>{html.escape(json.dumps(e))}</pre></div>"
    kind = str(e.get("type", "event"))
    rest = {k: v for k, v in e.items() if k != "type"}
    text = rest.pop("text", None)
    body = html.escape(str(text)) if isinstance(text, str) else ""
    if rest:
        body += ("\n" if body else "") + html.escape(json.dumps(rest, indent=1, default=str))
    return f"<div class=ev><b>{html.escape(kind)}</b><pre>{body}</pre></div>"


def _reused(r: dict[str, Any] | None) -> str | None:
    """The earlier measurement a reused trial is (not run here), or None for a fresh one."""
    if not r:
        return None
    return (
        f"{r.get('experiment_id')} {r.get('trial_key')} attempt {r.get('attempt')} "
        f"(run {r.get('run_id')}, measured {r.get('finished_at')}); not run or paid here"
    )


def _section(title: str, anchor: str, content: str | None, empty: str) -> str:
    inner = f"<pre>{html.escape(content)}</pre>" if content else f"<p>{html.escape(empty)}</p>"
    return f"<h2 id={anchor}>{html.escape(title)}</h2>{inner}"


def trial_page_html(experiment: str, ev: Evidence, back: str | None = "../report.html") -> str:
    """The page (not yet redacted: ``write_trial_page`` masks it)."""
    e = html.escape
    t, g = ev.trial, ev.grade
    art = Path(t.artifacts_dir)
    trace = t.trace if t.trace else json.loads(_read(art / "trace.json") or "{}")
    events: Sequence[Any] = trace.get("events") or []
    if g is None:
        verdict = "not graded"
    elif g.task_invalid or ev.task_invalid:
        verdict = "the task is invalid (its base check failed)"
    else:
        verdict = "passed" if g.passed else "failed"
    facts = [
        ("experiment", experiment),
        ("trial", f"{t.trial_key}, attempt {t.attempt}"),
        ("outcome", t.outcome_class + (f" / {t.infra_reason}" if t.infra_reason else "")),
        ("error", t.error),
        ("agent", f"{t.agent} (scripted stand-in, no model)" if t.agent_is_standin else t.agent),
        ("model", t.model),
        ("verify passed", None if t.verify_passed is None else str(t.verify_passed)),
        ("grade", verdict),
        ("trust", g.trust if g else None),
        ("reason", g.reason if g else None),
        ("tamper or run signals", "; ".join(g.tamper_signals) if g and g.tamper_signals else None),
        ("hidden tests", json.dumps(g.hidden_tests) if g else None),
        ("trial run", t.run_id),
        ("reused from", _reused(t.reused_from)),
        ("shadow of", t.shadow_of),  # a shadow trial: the merge it was graded against
        ("graded in run", g.run_id if g else None),
        ("cost", f"${t.cost_usd:.4f}, {t.tokens_in + t.tokens_out} tokens, {t.turns} turns"),
    ]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{e(t.trial_key)}: {e(experiment)}</title><style>{_CSS}</style></head><body>",
    ]
    if back:
        parts.append(f'<p><a href="{e(back)}">back to the report</a></p>')
    parts.append(f"<h1 id=trial>{e(t.trial_key)} <small>attempt {t.attempt}</small></h1>")
    parts.append(
        "<table id=facts>"
        + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in facts if v)
        + "</table>"
    )
    parts.append("<h2 id=tests>Hidden tests</h2>")
    if ev.tests:
        parts.append(
            "<table><tr><th>test</th><th>outcome</th><th>on base</th><th>message</th></tr>"
        )
        parts += [
            f"<tr><td>{e(x.test_id)}</td><td class={e(x.outcome)}>{e(x.outcome)}</td>"
            f"<td>{e(x.on_base or '')}</td><td>{e(x.message or '')}</td></tr>"
            for x in sorted(ev.tests, key=lambda x: (x.outcome == "passed", x.test_id))
        ]
        parts.append("</table>")
    else:
        parts.append("<p>no per-test results (not graded, or no hidden test ran)</p>")
    parts.append(_section("Patch", "patch", _read(art / "patch.diff"), "no patch"))
    parts.append(f"<h2 id=trace>Trace ({len(events)} events: messages and tool calls)</h2>")
    parts += [_event(x) for x in events[:MAX_EVENTS]] or ["<p>no event</p>"]
    if len(events) > MAX_EVENTS:
        parts.append(f"<p>and {len(events) - MAX_EVENTS} more events (trace.json)</p>")
    parts.append(_section("Verify output", "verify", _read(art / "verify.log"), "no verify log"))
    parts.append(_section("Grade log", "grade-log", _read(art / "grade.log"), "no grade log"))
    parts.append(_section("Agent log", "agent-log", _read(art / "agent.log"), "no agent log"))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_trial_page(
    out: Path,
    experiment: str,
    ev: Evidence,
    canary: str | None,
    back: str | None = "../report.html",
) -> Path:
    """``out`` (a file path) gets the page, secrets and the canary masked."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(str(redact(trial_page_html(experiment, ev, back), canary)))
    return out
