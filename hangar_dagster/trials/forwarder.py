"""The in-sandbox loopback forwarder: relays 127.0.0.1 ports to unix sockets, runs a command.

Started inside a sandbox (its own network namespace, loopback only) as
``python -I <this file> --pair PORT=SOCKET [--pair ...] -- COMMAND...``: for each
pair it listens on ``127.0.0.1:PORT`` of the sandbox's own loopback and relays
every connection byte for byte to the unix socket ``SOCKET`` (its directory is
mounted in), then runs the command as its child and exits with its status. The
model proxy (trials/model_proxy.py) and the egress proxy (environment/egress.py)
are reached this way.

Standard library only, and run as a script rather than ``-m``: importing
hangar's package (pydantic and all) costs ~0.4 s per sandbox run, this file
~0.05 s. ``python -m hangar_dagster.trials.model_proxy forward`` runs the same.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def relay(client: socket.socket, socket_path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(socket_path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, socket_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=relay, args=(client, socket_path), daemon=True).start()


def _listen(port: int) -> socket.socket | str:
    """A listener on 127.0.0.1:``port`` inside the sandbox, or why there cannot be one."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as err:
        listener.close()
        return f"cannot listen on 127.0.0.1:{port}: {err}"
    listener.listen(64)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        listener.accept()[0].close()  # that probe, so it is not relayed to the proxy
    except OSError as err:
        listener.close()
        # A new network namespace starts with loopback down until the sandbox brings it up.
        return f"loopback is not usable in this sandbox ({err}); the sandbox backend must bring up 'lo'"
    return listener


def forward(pairs: list[tuple[int, str]], argv: list[str]) -> int:
    """Listen on 127.0.0.1:port and relay to its unix socket, for each (port, socket) of
    ``pairs`` (the model proxy, the egress proxy, the mirror); run ``argv``; its exit status."""
    listeners: list[socket.socket] = []
    for port, socket_path in pairs:
        listener = _listen(port)
        if isinstance(listener, str):
            print(f"hangar forwarder: {listener}", file=sys.stderr)
            for opened in listeners:
                opened.close()
            return 125
        listeners.append(listener)
        threading.Thread(target=_serve, args=(listener, socket_path), daemon=True).start()
    try:
        # close_fds=False: the fds the sandbox passed on (the grader's pipes) reach the command.
        child = subprocess.Popen(argv, close_fds=False)
    except OSError as err:
        print(f"hangar forwarder: cannot start {argv[0]}: {err}", file=sys.stderr)
        return 127
    # Pass a polite stop on to the agent; a kill of the sandbox takes both anyway.
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    code = child.wait()
    for listener in listeners:
        listener.close()
    return code if code >= 0 else 128 - code


def _pair(text: str) -> tuple[int, str]:
    port, sep, path = text.partition("=")
    if not sep or not port.isdigit() or not path:
        raise argparse.ArgumentTypeError(f"--pair {text!r}: expected PORT=SOCKET_PATH")
    return int(port), path


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hangar forwarder")
    sub = parser.add_subparsers(dest="command", required=True)
    fwd = sub.add_parser("forward", help="relay loopback ports to unix sockets, run a command")
    fwd.add_argument("--pair", type=_pair, action="append", default=[], help="PORT=SOCKET")
    fwd.add_argument("--port", type=int, help="one pair: with --socket")
    fwd.add_argument("--socket")
    fwd.add_argument("argv", nargs=argparse.REMAINDER)
    parsed = parser.parse_args(args)
    argv = parsed.argv[1:] if parsed.argv[:1] == ["--"] else parsed.argv
    if not argv:
        parser.error("forward: give the command to run after --")
    pairs: list[tuple[int, str]] = list(parsed.pair)
    if (parsed.port is None) != (parsed.socket is None):
        parser.error("forward: --port and --socket go together")
    if parsed.port is not None:
        pairs.insert(0, (parsed.port, parsed.socket))
    if not pairs:
        parser.error("forward: give at least one --pair PORT=SOCKET")
    return forward(pairs, argv)


def script_main() -> int:
    """As a script: ``forward`` is implied."""
    return main(["forward", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(script_main())
