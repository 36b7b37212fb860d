"""Drift: did a trial's first turn run what its pin set pinned?

A pin set fixes two halves of what a trial runs with, and drift names which
one moved:

- the **harness** half, ``harness_fingerprint(lock, model)``: the turn-1
  fingerprint a trial of that lock must report (the adapter contract's keys:
  ``adapter``, ``harness``, ``model``, ``instructions_digest``,
  ``skills_digest``, ``plugins_digest``, and ``cli``, ``cli_version``,
  ``tools`` when the lock declares them). ``instructions_digest`` is the
  sha256 of the lock's instructions file, ``skills_digest`` and
  ``plugins_digest`` the ``tree_digest`` of its ``skills/`` and ``plugins/``
  (None without one): adapters report the digests of those files as the agent
  saw them, not of the task's own instructions;
- the **environment** half, ``environment_pins(environment)``: the fields
  ``environment_digest`` covers (sandbox, image, build, egress, resources,
  isolation), flattened to dotted names (``resources.memory_mb``).

After the agent ran, ``check_drift`` compares the adapter's reported
fingerprint and ``environment_observed`` (what the sandbox said it is and what
the trial handed the agent) with them. A key the adapter or sandbox did not
report is not compared (the trace lists it under ``unreported``); a key reported
with another value is drift. The trial then ends as ``infra_error / drift`` and
is never retried (``retries.NEVER_RETRIED``): running it again would not run
what was pinned either.

Values are compared after a small normalisation: ``cli_version`` as text,
``tools`` as a sorted list, and ``cli`` without a trailing parenthesised label
(the scripted stand-in names itself ``hangar-standin (scripted stand-in, no
model)`` so it shows as a stand-in wherever it appears).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hangar_dagster.experiment.harness import HarnessLock, tree_digest
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.util.digests import sha256_json

# The adapter contract's turn-1 keys (docs/architecture.md, "Drift").
HARNESS_KEYS = (
    "adapter",
    "harness",
    "cli",
    "cli_version",
    "model",
    "tools",
    "instructions_digest",
    "skills_digest",
    "plugins_digest",
)
# Pinned only when the lock declares them: a lock that leaves them open pins nothing there.
_DECLARED_ONLY = {"cli": "cli", "cli_version": "version", "tools": "tools"}
_LABEL = re.compile(r"\s*\([^()]*\)\s*$")


def harness_fingerprint(lock: HarnessLock, model: str) -> dict[str, Any]:
    """The turn-1 fingerprint a trial of ``lock`` running ``model`` must report."""
    agent = lock.config["agent"]
    file = lock.instructions_file
    expected: dict[str, Any] = {
        "adapter": lock.adapter,
        "harness": lock.ref,
        "model": model,
        "instructions_digest": hashlib.sha256(file.read_bytes()).hexdigest()
        if file is not None and file.is_file()
        else None,
        "skills_digest": tree_digest(lock.skills_dir) if lock.skills_dir.is_dir() else None,
        "plugins_digest": tree_digest(lock.plugins_dir) if lock.plugins_dir.is_dir() else None,
    }
    for key, name in _DECLARED_ONLY.items():
        if agent.get(name) is not None:
            expected[key] = _normal(key, agent[name])
    return {k: expected[k] for k in HARNESS_KEYS if k in expected}


def _flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping):
            out.update(_flatten(item, f"{name}."))
        else:
            out[name] = item
    return out


def environment_pins(environment: Environment) -> dict[str, Any]:
    """The environment half of a pin set: every field its digest covers, by dotted name."""
    return _flatten(environment.model_dump(mode="json"))


def environment_observed(
    sandbox_info: Mapping[str, str],
    *,
    egress: str,
    timeout_s: float,
    memory_mb: int,
    build: Sequence[str],
) -> dict[str, Any]:
    """The environment a trial ran in: the sandbox's own description, and what the agent got.

    ``sandbox_info`` is ``Sandbox.describe()``: its ``backend`` is the sandbox,
    and ``image``, ``isolation`` and ``egress`` count when the backend reports
    them. ``egress`` is the policy the trial's egress proxy enforced (``none``: no proxy ran).
    """
    seen: dict[str, Any] = {
        "sandbox": sandbox_info.get("backend"),
        "build": list(build),
        "resources.timeout_s": timeout_s,
        "resources.memory_mb": memory_mb,
    }
    for key in ("image", "isolation"):
        if key in sandbox_info:
            seen[key] = sandbox_info[key]
    seen["egress.mode"] = egress
    return seen


def _normal(key: str, value: Any) -> Any:
    if value is None:
        return None
    if key == "cli":
        return _LABEL.sub("", str(value))
    if key == "cli_version":
        return str(value)
    if key == "tools" and isinstance(value, list | tuple):
        return sorted(str(t) for t in value)
    return value


def turn1_harness_digest(fingerprint: Mapping[str, Any]) -> str:
    """sha256 over the canonical turn-1 fingerprint (the contract keys the adapter reported)."""
    view = {k: _normal(k, fingerprint[k]) for k in HARNESS_KEYS if k in fingerprint}
    return "sha256:" + sha256_json(view)


@dataclass(frozen=True)
class Drift:
    """Fields that moved, per half: name -> (pinned, seen)."""

    harness: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    environment: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    unreported: tuple[str, ...] = ()  # pinned keys nobody reported (not compared)

    def __bool__(self) -> bool:
        return bool(self.harness or self.environment)

    def summary(self) -> str | None:
        """One line for the ``drift`` column: which half moved, each field old -> new."""
        parts = [
            f"{half}: "
            + ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in sorted(fields.items()))
            for half, fields in (("harness", self.harness), ("environment", self.environment))
            if fields
        ]
        return "; ".join(parts) or None

    def as_json(self) -> dict[str, Any]:
        """The trace's ``drift`` entry."""
        return {
            half: {
                name: {"pinned": old, "seen": new} for name, (old, new) in sorted(fields.items())
            }
            for half, fields in (("harness", self.harness), ("environment", self.environment))
        } | {"unreported": list(self.unreported)}


def _moved(
    pinned: Mapping[str, Any], seen: Mapping[str, Any], half: str
) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    moved: dict[str, tuple[Any, Any]] = {}
    unreported: list[str] = []
    for key, want in pinned.items():
        if key not in seen:
            unreported.append(f"{half}.{key}")
            continue
        got = _normal(key, seen[key]) if half == "harness" else seen[key]
        if got != want:
            moved[key] = (want, got)
    return moved, unreported


def check_drift(
    pinned_harness: Mapping[str, Any],
    fingerprint: Mapping[str, Any],
    pinned_environment: Mapping[str, Any],
    observed_environment: Mapping[str, Any],
) -> Drift:
    """Compare what turn 1 reported and where the trial ran with the pin set's two halves."""
    harness, missing_h = _moved(pinned_harness, fingerprint, "harness")
    environment, missing_e = _moved(pinned_environment, observed_environment, "environment")
    return Drift(harness, environment, tuple(missing_h + missing_e))
