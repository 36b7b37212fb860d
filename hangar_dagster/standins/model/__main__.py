"""``python -m hangar_dagster.standins.model --script FILE --model ID [--port N]``.

Runs the scripted STAND-IN model endpoint in the foreground until interrupted
and prints its base URL; point an agent CLI's base URL variable at it.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from hangar_dagster.standins.model.script import Script, ScriptError
from hangar_dagster.standins.model.server import ScriptedEndpoint
from hangar_dagster.util.procs import restore_stop_signals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hangar_dagster.standins.model",
        description="A scripted stand-in model endpoint (no model behind it) on loopback.",
    )
    parser.add_argument("--script", type=Path, required=True, help="YAML/JSON script file")
    parser.add_argument("--model", required=True, help="model id the endpoint reports")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    restore_stop_signals()
    try:
        script = Script.from_file(args.script)
    except ScriptError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with ScriptedEndpoint(script, args.model, host=args.host, port=args.port) as endpoint:
        print("scripted stand-in model endpoint (no model behind it)", file=sys.stderr)
        print(endpoint.base_url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
