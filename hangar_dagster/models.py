"""Model policy: experiments run only concrete, dated model ids.

A floating alias can mean another model between two trials, so it is refused
before anything runs. This module decides what counts as floating; issue #4
extends it with provider model lists and the ``balanced``/``frontier`` policies.
"""

from __future__ import annotations

import re

# Names that providers re-point as new models ship.
FLOATING_ALIASES = frozenset(
    {"opus", "sonnet", "haiku", "gpt-5", "gpt-5-mini", "gpt-4o", "o3", "o4-mini", "default"}
)
_DATED = re.compile(r"(?<!\d)(20\d{2}-?[01]\d-?[0-3]\d)(?!\d)")


def floating_reason(model: str) -> str | None:
    """Why ``model`` is a floating alias, or None when it is a concrete, dated id."""
    name = model.strip()
    if not name:
        return "the model is empty"
    if name.lower() in FLOATING_ALIASES:
        return f"{name!r} is a provider alias that moves as new models ship"
    if name.startswith("~") or name.lower().endswith("-latest"):
        return f"{name!r} is a floating '-latest' alias"
    if not _DATED.search(name):
        return f"{name!r} carries no release date (expected e.g. claude-sonnet-4-5-20250929)"
    return None
