"""Freeze the example's harnesses into its registry and point experiment.yaml at them.

    python examples/skills-ab/freeze_harnesses.py

Each harness-src/<name>/ becomes the lock harnesses/<name>@sha256:<digest>/.
The example's registry keeps only the current lock of each of its harnesses
(older ones are removed), and experiment.yaml's ``harness_lock:`` lines that
name one of them are rewritten to the new digest. The result is meant to be
checked in.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from hangar_dagster.experiment.harness import freeze

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "harness-src"
REGISTRY = HERE / "harnesses"
SPEC = HERE / "experiment.yaml"
LOCK_LINE = re.compile(r"(harness_lock:\s*)([A-Za-z0-9][A-Za-z0-9._-]*)(@sha256:[0-9a-f]{64})")


def freeze_all() -> dict[str, str]:
    """Freeze every harness in harness-src/; harness name -> lock ref."""
    refs: dict[str, str] = {}
    for source in sorted(p for p in SOURCES.iterdir() if p.is_dir()):
        lock = freeze(source, REGISTRY)
        refs[lock.name] = lock.ref
        for stale in REGISTRY.glob(f"{lock.name}@sha256:*"):
            if stale.name != lock.ref:
                shutil.rmtree(stale)
    return refs


def point_spec(spec: str, refs: dict[str, str]) -> str:
    """``spec`` with each ``harness_lock: <name>@sha256:...`` naming the current lock of <name>."""

    def current(match: re.Match[str]) -> str:
        return match.group(1) + refs.get(match.group(2), match.group(2) + match.group(3))

    return LOCK_LINE.sub(current, spec)


def main() -> int:
    refs = freeze_all()
    SPEC.write_text(point_spec(SPEC.read_text(), refs))
    for ref in refs.values():
        print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
