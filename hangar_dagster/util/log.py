"""The log a stage body writes to: Dagster's ``context.log`` in a run, any logger in a test."""

from __future__ import annotations

from typing import Protocol


class Log(Protocol):
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...
