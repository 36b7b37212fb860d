"""The script a stand-in model endpoint follows: its replies, in order, then a final one forever.

A script file is YAML or JSON::

    replies:
      - tool_calls: [{name: Write, arguments: {file_path: /repo/a.py, content: "..."}}]
      - text: "Fixed."
        model: claude-other-2026-01-01   # optional: report another model id (drift tests)
    final: {text: "Done."}               # optional; answered once the replies run out
    usage_per_reply: [120, 30, 80]       # optional: tokens in/out (and of in, cached) per reply
    # a reply may also carry reasoning: "..." (sent as thinking / reasoning content) and
    # usage: [in, out, cached] of its own

No model is behind it: this is a stand-in, labelled as such where it shows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_USAGE = (100, 20)
PIECE = 24  # characters per streamed delta, so clients see a real stream of several events


class ScriptError(ValueError):
    """A script file or value that cannot be followed; the message names the field."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    model: str | None = None  # overrides the model id the endpoint reports
    reasoning: str = ""  # sent as the dialect's thinking / reasoning content
    usage: tuple[int, int, int] | None = None  # (in, out, cached of in); else the script's


@dataclass(frozen=True)
class Usage:
    """What one response reports: input tokens (cached ones included), output, cached input."""

    tokens_in: int
    tokens_out: int
    cached_in: int = 0


class Script:
    """Thread-safe: concurrent requests each take the next reply exactly once."""

    def __init__(
        self,
        replies: Sequence[Reply],
        final: Reply = Reply(text="Done."),
        usage_per_reply: tuple[int, int] | tuple[int, int, int] = DEFAULT_USAGE,
    ) -> None:
        self.replies = tuple(replies)
        self.final = final
        self.usage_per_reply = usage_per_reply
        self._next = 0
        self._lock = threading.Lock()

    def usage_of(self, reply: Reply) -> Usage:
        """The usage reported for ``reply``: its own, else the script's per-reply usage."""
        return Usage(*(reply.usage or self.usage_per_reply))

    def next_reply(self) -> Reply:
        with self._lock:
            if self._next < len(self.replies):
                reply = self.replies[self._next]
                self._next += 1
                return reply
            return self.final

    @property
    def consumed(self) -> int:
        """How many scripted replies (not counting ``final``) have been handed out."""
        with self._lock:
            return self._next

    @classmethod
    def from_file(cls, path: Path) -> Script:
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as err:
            raise ScriptError(f"script file {path}: cannot be read ({err.strerror})") from err
        except yaml.YAMLError as err:
            raise ScriptError(f"script file {path}: not valid YAML or JSON ({err})") from err
        return cls.from_data(data, where=str(path))

    @classmethod
    def from_data(cls, data: Any, where: str = "script") -> Script:
        if not isinstance(data, dict):
            raise ScriptError(f"{where}: expected a mapping with 'replies' (a list of replies)")
        unknown = sorted(set(data) - {"replies", "final", "usage_per_reply"})
        if unknown:
            raise ScriptError(
                f"{where}: unknown field(s) {', '.join(unknown)}; "
                "a script has replies, final and usage_per_reply"
            )
        raw_replies = data.get("replies", [])
        if not isinstance(raw_replies, list):
            raise ScriptError(f"{where}: 'replies' must be a list of replies")
        replies = [_reply(r, f"{where}: replies[{i}]") for i, r in enumerate(raw_replies)]
        final = _reply(data["final"], f"{where}: final") if "final" in data else Reply(text="Done.")
        usage = _usage(
            data.get("usage_per_reply", list(DEFAULT_USAGE)), f"{where}: usage_per_reply"
        )
        return cls(replies, final, usage)


def _usage(raw: Any, where: str) -> tuple[int, int, int]:
    if (
        not isinstance(raw, list | tuple)
        or len(raw) not in (2, 3)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in raw)
        or (len(raw) == 3 and raw[2] > raw[0])
    ):
        raise ScriptError(
            f"{where}: must be two or three non-negative integers [tokens_in, tokens_out] or "
            "[tokens_in, tokens_out, cached_tokens_in], the cached ones no more than tokens_in"
        )
    return (raw[0], raw[1], raw[2] if len(raw) == 3 else 0)


def stream_pieces(text: str) -> list[str]:
    """``text`` cut into the deltas a streamed answer sends (at least one, maybe empty)."""
    return [text[i : i + PIECE] for i in range(0, len(text), PIECE)] or [""]


def _reply(raw: Any, where: str) -> Reply:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: expected a mapping with text and/or tool_calls")
    unknown = sorted(set(raw) - {"text", "tool_calls", "model", "reasoning", "usage"})
    if unknown:
        raise ScriptError(
            f"{where}: unknown field(s) {', '.join(unknown)}; a reply has text, tool_calls, "
            "model, reasoning, usage"
        )
    reasoning = raw.get("reasoning", "")
    if not isinstance(reasoning, str):
        raise ScriptError(f"{where}.reasoning: must be a string")
    usage = _usage(raw["usage"], f"{where}.usage") if "usage" in raw else None
    text = raw.get("text", "")
    model = raw.get("model")
    calls = raw.get("tool_calls", [])
    if not isinstance(text, str):
        raise ScriptError(f"{where}.text: must be a string")
    if model is not None and not isinstance(model, str):
        raise ScriptError(f"{where}.model: must be a string (a model id)")
    if not isinstance(calls, list):
        raise ScriptError(f"{where}.tool_calls: must be a list of {{name, arguments}}")
    tool_calls = []
    for i, call in enumerate(calls):
        at = f"{where}.tool_calls[{i}]"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{at}: needs a 'name' (the tool's name) and 'arguments' (a mapping)")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ScriptError(f"{at}.arguments: must be a mapping of argument name to value")
        tool_calls.append(ToolCall(call["name"], arguments))
    if not text and not tool_calls:
        raise ScriptError(f"{where}: a reply needs text, tool_calls or both")
    return Reply(
        text=text, tool_calls=tuple(tool_calls), model=model, reasoning=reasoning, usage=usage
    )
