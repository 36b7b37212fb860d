"""The scripted stand-in agent: the program the ``standin`` adapter runs inside a trial's sandbox.

No model is involved. It stands in for a model-backed coding agent so the
offline demo and the tests exercise the whole trial path (sandbox, trace,
patch, verify, grade), and it says so in every event it prints.

Its knowledge is ``playbook.yaml`` in the harness lock: per task a ``fix`` and
a ``wrong`` list of exact-text edits. Whether it "solves" a task is a pure
function of the trial's seed and a solve rate (``harness.yaml`` ``standin:
solve_rate`` plus each skill's ``standin_solve_rate_bonus``), so a trial run
twice does the same thing and an A/B experiment's outcome is known in advance.
It prints its trace as JSON lines on stdout and writes RESULT.md to ``/out``.
Its first ``turn`` event carries the turn-1 fingerprint with every key of the
adapter contract, computed from the lock files it read (so drift compares them
all), and the stand-in's own ``STANDIN_VERSION`` as ``cli_version``.

It runs inside the trial's sandbox and reads the ``HANGAR_`` variables the sandbox was
given (the agent contract, not operator settings), so it reads its environment itself
(allowed in tests/test_settings_source.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.experiment.harness import MANIFEST, tree_digest

STANDIN_CLI = "hangar-standin (scripted stand-in, no model)"
# The program's own version, reported at turn 1 as a real CLI reports its own: a lock
# pinning another agent.version drifts.
STANDIN_VERSION = "0.1.0"
HARNESS_MOUNT = "/harness"
OUT_MOUNT = "/out"  # writable, outside the repo, so RESULT.md is not part of the patch
PLAYBOOK = "playbook.yaml"
TOOLS = ("edit", "shell")
VERIFY_TIMEOUT_S = 300
TAIL_CHARS = 2000
EXIT_AGENT_ERROR = 2
REQUIRED_ENV = ("HANGAR_HARNESS_DIR", "HANGAR_TASK", "HANGAR_SEED")


class StandinError(Exception):
    """Bad harness content or a playbook edit that does not fit the repo."""


def unit(seed: str) -> float:
    """A number in [0, 1) fixed by ``seed``."""
    return int(hashlib.sha256(seed.encode()).hexdigest(), 16) / 2**256


def decide(seed: str, rate: float) -> bool:
    """Whether the first try applies the fix."""
    return unit(seed) < rate


def decide_retry(seed: str, rate: float) -> bool:
    """Whether a failed visible check leads to a second try with the fix (at half the rate)."""
    return unit(f"{seed}:retry") < rate / 2


def tokens(chars: int) -> int:
    """A rough token count (four characters a token); only ever reported as an estimate."""
    return (chars + 3) // 4


@dataclass(frozen=True)
class Edit:
    file: str
    find: str
    replace: str


def front_matter(text: str) -> dict[str, Any]:
    """The YAML between a leading ``---`` line and the next one (empty when there is none)."""
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---", 4)
    if end < 0:
        return {}
    data = yaml.safe_load(text[4:end])
    return data if isinstance(data, dict) else {}


def solve_rate(config: dict[str, Any], skills: dict[str, str]) -> float:
    """The harness's base rate plus every skill's bonus, kept within [0, 1]."""
    standin = config.get("standin")
    rate = standin.get("solve_rate") if isinstance(standin, dict) else None
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 <= rate <= 1:
        raise StandinError(
            f"{MANIFEST}: standin.solve_rate must be a number in [0, 1] (got {rate!r})"
        )
    total = float(rate)
    for name, text in sorted(skills.items()):
        bonus = front_matter(text).get("standin_solve_rate_bonus", 0)
        if not isinstance(bonus, int | float) or isinstance(bonus, bool):
            raise StandinError(
                f"skills/{name}/SKILL.md: standin_solve_rate_bonus must be a number (got {bonus!r})"
            )
        total += float(bonus)
    return min(1.0, max(0.0, total))


def _edits(task: str, kind: str, raw: Any) -> list[Edit]:
    where = f"{PLAYBOOK}: {task}.{kind}"
    if not isinstance(raw, list):
        raise StandinError(f"{where} must be a list of edits {{file, find, replace}}")
    edits = []
    for i, item in enumerate(raw):
        fields = ("file", "find", "replace")
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in fields):
            raise StandinError(f"{where}[{i}] must have string fields file, find and replace")
        path = Path(item["file"])
        if path.is_absolute() or ".." in path.parts:
            raise StandinError(
                f"{where}[{i}].file must be a path inside the repo, not {item['file']!r}"
            )
        edits.append(Edit(item["file"], item["find"], item["replace"]))
    return edits


def load_playbook(text: str, task: str) -> tuple[list[Edit], list[Edit]]:
    """The ``fix`` and ``wrong`` edits the playbook holds for ``task``."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise StandinError(f"{PLAYBOOK}: expected a mapping of task id -> {{fix, wrong}}")
    entry = data.get(task)
    if not isinstance(entry, dict):
        raise StandinError(
            f"{PLAYBOOK}: no entry for task {task!r}; add {task}: {{fix: [...], wrong: [...]}}"
        )
    return _edits(task, "fix", entry.get("fix")), _edits(task, "wrong", entry.get("wrong"))


class Session:
    """One stand-in run: prints events as it goes and counts the text it read and wrote."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.read_chars = 0
        self.written_chars = 0

    def emit(self, event: dict[str, Any]) -> None:
        print(json.dumps({**event, "standin": True}), flush=True)

    def usage(self) -> None:
        self.emit(
            {
                "type": "usage",
                "tokens_in": tokens(self.read_chars),
                "tokens_out": tokens(self.written_chars),
                "estimated": True,
                "cost_usd": 0.0,  # no model was paid
            }
        )
        self.read_chars = self.written_chars = 0

    def edit(self, edit: Edit, revert: bool = False) -> None:
        find, replace = (edit.replace, edit.find) if revert else (edit.find, edit.replace)
        path = self.repo / edit.file
        try:
            text = path.read_text()
        except OSError as err:
            raise StandinError(
                f"{PLAYBOOK}: edit of {edit.file}: cannot read it ({err.strerror})"
            ) from None
        self.read_chars += len(text)
        if find not in text:
            raise StandinError(
                f"{PLAYBOOK}: edit of {edit.file}: the text to find is not in the file: {find!r}"
            )
        path.write_text(text.replace(find, replace, 1))
        self.written_chars += len(replace)
        self.emit({"type": "tool_call", "tool": "edit", "file": edit.file, "revert": revert})

    def verify(self, command: str) -> int:
        # The check sees the sandbox's environment minus the agent's own settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGAR_")}
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", command],
                cwd=self.repo,
                env=env,
                capture_output=True,
                text=True,
                timeout=VERIFY_TIMEOUT_S,
            )
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            code, output = 124, f"verify timed out after {VERIFY_TIMEOUT_S} s"
        self.read_chars += len(output)
        self.emit(
            {
                "type": "tool_call",
                "tool": "shell",
                "command": command,
                "exit_code": code,
                "output_tail": output[-TAIL_CHARS:],
            }
        )
        return code


def _read_harness(harness: Path) -> tuple[dict[str, Any], bytes | None, dict[str, str]]:
    config = yaml.safe_load((harness / MANIFEST).read_text())
    if not isinstance(config, dict):
        raise StandinError(f"{MANIFEST}: expected a mapping")
    instructions = None
    if config.get("instructions"):
        path = harness / str(config["instructions"])
        if not path.is_file():
            raise StandinError(
                f"{MANIFEST}: instructions names {config['instructions']!r}, not in the lock"
            )
        instructions = path.read_bytes()
    skills = {p.parent.name: p.read_text() for p in sorted((harness / "skills").glob("*/SKILL.md"))}
    return config, instructions, skills


def fingerprint(
    harness: Path,
    config: dict[str, Any],
    instructions: bytes | None,
    skills: dict[str, str],
    model: str,
    rate: float,
) -> dict[str, Any]:
    """Turn 1 as the stand-in saw it: the adapter contract's keys, digests of the files it read."""
    skills_dir, plugins_dir = harness / "skills", harness / "plugins"
    return {
        "adapter": "standin",
        # A lock's digest is the tree digest of its directory: recomputed here, not taken on trust.
        "harness": f"{config.get('name')}@sha256:{tree_digest(harness)}",
        "cli": STANDIN_CLI,
        "cli_version": STANDIN_VERSION,
        "model": model,
        "tools": sorted(TOOLS),
        "instructions_digest": hashlib.sha256(instructions).hexdigest()
        if instructions is not None
        else None,
        "skills_digest": tree_digest(skills_dir) if skills_dir.is_dir() else None,
        # The stand-in loads no plugins; the digest says which ones its harness held.
        "plugins_digest": tree_digest(plugins_dir) if plugins_dir.is_dir() else None,
        # Extras: per-skill digests, the lock's approvals and the rate the skills gave.
        "skills": {
            name: hashlib.sha256(text.encode()).hexdigest() for name, text in skills.items()
        },
        "approvals": config.get("approvals"),
        "solve_rate": rate,
    }


def run(env: dict[str, str], repo: Path, out: Path) -> int:
    """One stand-in run in ``repo``; the exit code (0 also when the visible check fails)."""
    session = Session(repo)
    task, seed, verify = env["HANGAR_TASK"], env["HANGAR_SEED"], env.get("HANGAR_VERIFY", "")
    harness = Path(env["HANGAR_HARNESS_DIR"])
    try:
        config, instructions, skills = _read_harness(harness)
        rate = solve_rate(config, skills)
        seen = fingerprint(harness, config, instructions, skills, env.get("HANGAR_MODEL", ""), rate)
        session.emit({"type": "turn", "n": 1, "fingerprint": seen})
        session.read_chars += len(env.get("HANGAR_INSTRUCTIONS", "")) + len(instructions or b"")
        session.read_chars += sum(len(t) for t in skills.values())
        fix, wrong = load_playbook((harness / PLAYBOOK).read_text(), task)
        applied = "fix" if decide(seed, rate) else "wrong"
        for edit in fix if applied == "fix" else wrong:
            session.edit(edit)
        turns, verify_code = 1, session.verify(verify) if verify else None
        if applied == "wrong" and verify_code not in (None, 0) and decide_retry(seed, rate):
            session.usage()
            turns = 2
            session.emit({"type": "turn", "n": 2})
            # A second try starts from the base: undo the first edits, then fix.
            for edit in reversed(wrong):
                session.edit(edit, revert=True)
            for edit in fix:
                session.edit(edit)
            applied = "fix"
            verify_code = session.verify(verify)
    except StandinError as err:
        session.emit({"type": "error", "message": str(err)})
        return EXIT_AGENT_ERROR
    summary = (
        f"# {task}\n\nScripted stand-in agent (no model). Applied the playbook's "
        f"`{applied}` edits in {turns} turn(s); solve rate {rate:.2f}.\n"
        f"Visible check: {'not given' if verify_code is None else f'exit code {verify_code}'}.\n"
    )
    (out / "RESULT.md").write_text(summary)
    session.written_chars += len(summary)
    session.usage()
    session.emit(
        {"type": "result", "applied": applied, "turns": turns, "verify_exit_code": verify_code}
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # --out is for running the program outside a sandbox (tests); the adapter mounts /out.
    out = Path(args[1]) if len(args) == 2 and args[0] == "--out" else Path(OUT_MOUNT)
    missing = [k for k in REQUIRED_ENV if not os.environ.get(k)]
    if missing:
        print(
            f"hangar-standin: missing environment variable(s) {', '.join(missing)}", file=sys.stderr
        )
        return EXIT_AGENT_ERROR
    return run(dict(os.environ), Path.cwd(), out)


if __name__ == "__main__":
    sys.exit(main())
