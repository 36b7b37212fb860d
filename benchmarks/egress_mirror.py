"""Egress proxy cost: a trial-like sandbox installs one small package through the mirror, twice.

    .venv/bin/python benchmarks/egress_mirror.py [--backend bwrap] [--package six==1.16.0]

In a fresh HANGAR_HOME: starts the embedded package mirror (proxpi; its start time is
reported), then runs, in the chosen sandbox under ``open_egress("allowlist")`` as a trial
does, ``pip install --no-deps --no-cache-dir --target <fresh dir> <package>`` two times.
pip's own cache is off, so each install asks the mirror for the index page and the file;
the first time the mirror fetches both from its upstream (pip's configured index), the
second time it should answer from its cache. Whether upstream was contacted is read from
the mirror's log (one line per request it sends upstream). Also reported: a trivial command
(``true``) in the same sandbox with and without the egress grant, what the proxy and
forwarder add to any sandbox run (median of ``--repeat``). The figures go into
docs/performance.md ("Egress proxy and package mirror").
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hangar_dagster.environment.egress import egress_lines, open_egress
from hangar_dagster.environment.mirror import ensure_mirror, stop_mirror
from hangar_dagster.settings import Settings
from hangar_dagster.standins.agent import sandbox_path
from hangar_dagster.trials.sandbox import SandboxRequest, get_sandbox

# proxpi's line per fetch from its upstream: an index page, a file.
UPSTREAM_REQUEST = re.compile(r"proxpi\._cache: (Refreshing|Downloading) '")


def run(backend: str, settings: Settings, work: Path, argv: list[str], egress: bool) -> float:
    log = work / "egress.jsonl"
    started = time.perf_counter()
    with open_egress("allowlist" if egress else "none", log, settings) as grant:
        result = get_sandbox(backend).run(
            SandboxRequest(
                argv=grant.wrap(argv),
                workdir=work,
                env={"PATH": sandbox_path(), "HOME": "/tmp", **grant.env},
                timeout_s=300,
                mounts=list(grant.mounts),
            )
        )
    elapsed = time.perf_counter() - started
    if result.exit_code != 0:
        raise SystemExit(
            f"{argv} failed in {backend}: {result.stdout[-800:]}{result.stderr[-800:]}"
        )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="bwrap")
    parser.add_argument("--package", default="six==1.16.0")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hangar-bench-egress-"))
    settings = Settings(home=home, dagster_home=home / "dagster")
    started = time.perf_counter()
    mirror = ensure_mirror(settings)
    start_s = time.perf_counter() - started
    assert mirror.log_path is not None
    try:
        installs = []
        for n in (1, 2):
            work = home / f"work-{n}"
            work.mkdir()
            before = len(UPSTREAM_REQUEST.findall(mirror.log_path.read_text(errors="replace")))
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir",
                   "--target", str(work / "site"), args.package]  # fmt: skip
            seconds = run(args.backend, settings, work, pip, egress=True)
            after = len(UPSTREAM_REQUEST.findall(mirror.log_path.read_text(errors="replace")))
            lines = egress_lines((work / "egress.jsonl").read_text())
            installs.append(
                {
                    "install": n,
                    "seconds": round(seconds, 3),
                    "upstream_requests": after - before,
                    "proxy_lines": len(lines),
                    "bytes_through_proxy": sum(e["bytes"] for e in lines),
                }
            )
        trivial: dict[str, list[float]] = {"none": [], "allowlist": []}
        for _ in range(args.repeat):
            for policy in trivial:
                work = Path(tempfile.mkdtemp(dir=home))
                trivial[policy].append(
                    run(args.backend, settings, work, ["true"], policy != "none")
                )
    finally:
        stop_mirror(settings)
    median = {k: statistics.median(v) for k, v in trivial.items()}
    out = {
        "backend": args.backend,
        "package": args.package,
        "mirror_start_s": round(start_s, 3),
        "installs": installs,
        "second_over_first": round(installs[1]["seconds"] / installs[0]["seconds"], 3),
        "trivial_median_s": {k: round(v, 3) for k, v in median.items()},
        "grant_adds_s": round(median["allowlist"] - median["none"], 3),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
