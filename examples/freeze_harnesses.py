"""Freeze an example's harnesses into its registry and point its experiment.yaml at them.

    python examples/freeze_harnesses.py examples/skills-ab

Each <example>/harness-src/<name>/ becomes the lock <example>/harnesses/<name>@sha256:<digest>/.
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

LOCK_LINE = re.compile(r"(harness_lock:\s*)([A-Za-z0-9][A-Za-z0-9._-]*)(@sha256:[0-9a-f]{64})")


def freeze_all(example: Path) -> dict[str, str]:
    """Freeze every harness in <example>/harness-src/; harness name -> lock ref."""
    refs: dict[str, str] = {}
    registry = example / "harnesses"
    for source in sorted(p for p in (example / "harness-src").iterdir() if p.is_dir()):
        lock = freeze(source, registry)
        refs[lock.name] = lock.ref
        for stale in registry.glob(f"{lock.name}@sha256:*"):
            if stale.name != lock.ref:
                shutil.rmtree(stale)
    return refs


def point_spec(spec: str, refs: dict[str, str]) -> str:
    """``spec`` with each ``harness_lock: <name>@sha256:...`` naming the current lock of <name>."""

    def current(match: re.Match[str]) -> str:
        return match.group(1) + refs.get(match.group(2), match.group(2) + match.group(3))

    return LOCK_LINE.sub(current, spec)


def main() -> int:
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "harness-src").is_dir():
        print("usage: python examples/freeze_harnesses.py EXAMPLE_DIR (holding harness-src/)")
        return 2
    example = Path(sys.argv[1]).resolve()
    refs = freeze_all(example)
    spec = example / "experiment.yaml"
    spec.write_text(point_spec(spec.read_text(), refs))
    for ref in refs.values():
        print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
