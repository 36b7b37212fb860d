"""Canaries: a per-experiment secret written into hidden tests, masked wherever it could show."""

from __future__ import annotations

import secrets
from typing import Any

MASK = "HANGAR-CANARY-[masked]"


def new_canary() -> str:
    return f"HANGAR-CANARY-{secrets.token_hex(16)}"


def mask(value: Any, canary: str | None) -> Any:
    """Replace the canary in a string, or in every string of a JSON-like value."""
    if not canary:
        return value
    if isinstance(value, str):
        return value.replace(canary, MASK)
    if isinstance(value, dict):
        return {mask(k, canary): mask(v, canary) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, canary) for v in value]
    return value
