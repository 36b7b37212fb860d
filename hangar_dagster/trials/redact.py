"""Redaction: the one pass every stored or shown text goes through (canary, keys, tokens).

``redact(value, canary, secrets)`` is called wherever a trial's output leaves
hangar's hands: the trial writer (trace, manifest, agent.log, verify.log,
build.log, RESULT.md, egress.jsonl, patch, error), the export, and the Dagster
asset metadata. It replaces, in a string or in every string (and key) of a
JSON-like value:

1. the experiment's canary, with ``canary.MASK`` (``canary.mask``);
2. known secret values: ``secrets`` (e.g. ``secret_values(agent_env)``, the
   values of the variables named like a key, token, secret or password that
   the agent was given) and the orchestrator's own provider keys
   (``HOST_SECRET_VARS``, read from ``os.environ`` at each call);
3. the shapes of credentials wherever they come from: Anthropic ``sk-ant-...``,
   OpenAI ``sk-...``/``sk-proj-...``, GitHub ``ghp_``/``gho_``/``ghu_``/
   ``ghs_``/``ghr_``/``github_pat_``, AWS access key ids ``AKIA``/``ASIA``,
   ``Bearer`` tokens, and the value of an upper-case variable whose name has a
   ``KEY``/``TOKEN``/``SECRET``/``PASSWORD`` part written as ``NAME=value``,
   ``NAME: value`` or ``"NAME": "value"`` (an ``env`` dump, a JSON object).

Each secret becomes ``[redacted:<kind>]``. A value shorter than
``MIN_SECRET_CHARS`` is not treated as a secret: replacing every ``1`` or
``true`` would garble the trace without protecting anything.

Redaction is not a grader signal: where the canary was seen is worked out on
the raw texts before they are redacted (the trace's ``canary_seen_in``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from hangar_dagster.trials.canary import mask

MIN_SECRET_CHARS = 8
# The orchestrator's own credentials: never in the sandbox, so never legitimately in a trace.
HOST_SECRET_VARS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "OPENAI_API_KEY",
    "OPENROUTER_API_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
)
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
_NAME_PART = r"(?:KEY|KEYS|TOKEN|SECRET|PASSWORD|PASSWD|APIKEY)"
# Not an already redacted value: one pass must give the same text as two.
_VALUE = rf"(?!\[redacted:)[^\s\"',;&]{{{MIN_SECRET_CHARS},}}"

# (kind, pattern, group to replace); sk-ant before sk- so the kind says which provider.
_PATTERNS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    ("anthropic_key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{16,}"), 0),
    ("openai_key", re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}"), 0),
    (
        "github_token",
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
        0,
    ),
    ("aws_key", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), 0),
    ("bearer", re.compile(r"(\bBearer\s+)([A-Za-z0-9\-._~+/]{12,}=*)"), 2),
    (
        "env_secret",
        re.compile(rf"\b((?:[A-Z0-9]+_)*{_NAME_PART}(?:_[A-Z0-9]+)*)(\"?\s*[=:]\s*\"?)({_VALUE})"),
        3,
    ),
)


def _label(kind: str) -> str:
    return f"[redacted:{kind}]"


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of the variables in ``env`` whose name contains KEY, TOKEN, SECRET or PASSWORD."""
    return [
        value
        for name, value in env.items()
        if _SECRET_NAME.search(name) and len(value) >= MIN_SECRET_CHARS
    ]


def host_secrets(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The orchestrator's provider keys and tokens that are set (``HOST_SECRET_VARS``).

    A safety net, not a setting: it must catch every credential this process holds, those
    hangar never uses (``GITHUB_TOKEN``, AWS) included, so it reads the live environment
    rather than ``Settings``.
    """
    return [
        environ[name] for name in HOST_SECRET_VARS if len(environ.get(name, "")) >= MIN_SECRET_CHARS
    ]


def _sub(pattern: re.Pattern[str], group: int, kind: str, text: str) -> str:
    if group == 0:
        return pattern.sub(_label(kind), text)
    return pattern.sub(lambda m: m.group(0)[: m.start(group) - m.start()] + _label(kind), text)


def _text(text: str, values: list[str]) -> str:
    for value in values:
        text = text.replace(value, _label("secret"))
    for kind, pattern, group in _PATTERNS:
        text = _sub(pattern, group, kind, text)
    return text


def _walk(value: Any, values: list[str]) -> Any:
    if isinstance(value, str):
        return _text(value, values)
    if isinstance(value, dict):
        return {_walk(k, values): _walk(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, values) for v in value]
    return value


def redact(value: Any, canary: str | None, secrets: Iterable[str] = ()) -> Any:
    """``value`` with the canary masked and every key, token and secret replaced.

    ``value`` is a string or a JSON-like value (dicts, lists, scalars; other
    objects pass through unchanged). ``secrets`` are extra literal values to
    replace, e.g. ``secret_values`` of the environment the agent was given.
    """
    known = {s for s in (*secrets, *host_secrets()) if len(s) >= MIN_SECRET_CHARS}
    # Longest first: a secret that contains another is replaced whole.
    values = sorted(known, key=len, reverse=True)
    return _walk(mask(value, canary), values)
