"""The eval window: the nightly local-time span in which trials may start.

A window is ``start-end`` in wall-clock time of one IANA zone; ``end`` before
``start`` means it crosses midnight (20:00-00:15 opens on day D and closes on
D+1). Wall times are turned into instants with the rules Dagster's cron
schedules use, so the drain schedule fires exactly when ``is_open`` turns false:

- a wall time skipped by a spring-forward change (02:30 on 2027-03-14 in New
  York) resolves to the first instant after the gap (03:00 EDT);
- a wall time that occurs twice on a fall-back night (01:30 on 2026-11-01)
  resolves to its later occurrence (01:30 EST).

If both ends of a window fall in the same gap, the window is empty that night.

Instants are computed and returned in UTC: Python compares and subtracts two
datetimes that share a tzinfo by wall time, and a fold=1 local time never
equals an instant in another zone (PEP 495), so local results mislead callers.
"""

from __future__ import annotations

import datetime
import re
import zoneinfo
from dataclasses import dataclass

from hangar_dagster.settings import TZ_VAR, WINDOW_VAR

DEFAULT_WINDOW = "20:00-00:15"
DEFAULT_TZ = "America/New_York"
ALWAYS = "always"

_UTC = datetime.UTC
_WINDOW_RE = re.compile(r"^([0-9]{1,2}):([0-9]{2})\s*-\s*([0-9]{1,2}):([0-9]{2})$")
_FORMAT_HINT = "write HH:MM-HH:MM (local time, e.g. 20:00-00:15) or always"


class WindowError(ValueError):
    """A window setting that cannot be used; the message names the variable and the fix."""


@dataclass(frozen=True)
class EvalWindow:
    start: datetime.time | None  # None when always open
    end: datetime.time | None
    tz: zoneinfo.ZoneInfo

    def __post_init__(self) -> None:
        if (self.start is None) != (self.end is None):
            raise WindowError("EvalWindow: give both start and end, or neither for always")
        if self.start is not None and self.start == self.end:
            raise WindowError(
                f"EvalWindow: start and end are both {self.start:%H:%M}; use always for a window that never closes"
            )
        for t in (self.start, self.end):
            if t is not None and t.tzinfo is not None:
                raise WindowError("EvalWindow: start and end are wall-clock times without tzinfo")
        if self.tz.key is None:  # Dagster's execution_timezone needs the zone's name
            raise WindowError("EvalWindow: tz must be loaded by IANA name, e.g. ZoneInfo('UTC')")

    @property
    def always(self) -> bool:
        return self.start is None

    def describe(self) -> str:
        if self.start is None or self.end is None:
            return ALWAYS
        return f"{self.start:%H:%M}-{self.end:%H:%M} {self.tz.key}"

    def is_open(self, at: datetime.datetime) -> bool:
        return self.always or self._containing(_utc(at, "is_open")) is not None

    def next_open(self, at: datetime.datetime) -> datetime.datetime:
        """``at`` itself when open; otherwise the instant (UTC) the next non-empty window opens."""
        now = _utc(at, "next_open")
        if self.always or self._containing(now) is not None:
            return at
        day = now.astimezone(self.tz).date()
        for offset in range(3):
            opens, closes = self._span(day + datetime.timedelta(days=offset))
            if now <= opens < closes:
                return opens
        # Only a night whose both ends fall in one DST gap has no window; the next night does.
        raise AssertionError(f"no window opens within two days of {at.isoformat()}")

    def opens_at(self, at: datetime.datetime) -> datetime.datetime | None:
        """The start (UTC) of the window containing ``at``; None when closed or always open."""
        now = _utc(at, "opens_at")
        span = None if self.always else self._containing(now)
        return None if span is None else span[0]

    def closes_at(self, at: datetime.datetime) -> datetime.datetime | None:
        """The end (UTC) of the window containing ``at``; None when closed or always open."""
        now = _utc(at, "closes_at")
        span = None if self.always else self._containing(now)
        return None if span is None else span[1]

    def _containing(
        self, now: datetime.datetime
    ) -> tuple[datetime.datetime, datetime.datetime] | None:
        day = now.astimezone(self.tz).date()
        # A window opening yesterday may cross midnight into today.
        for d in (day - datetime.timedelta(days=1), day):
            opens, closes = self._span(d)
            if opens <= now < closes:
                return opens, closes
        return None

    def _span(self, day: datetime.date) -> tuple[datetime.datetime, datetime.datetime]:
        """The UTC instants the window opening on local date ``day`` opens and closes."""
        assert self.start is not None and self.end is not None
        end_day = day + datetime.timedelta(days=1) if self.end < self.start else day
        return local_instant(day, self.start, self.tz), local_instant(end_day, self.end, self.tz)


def _utc(at: datetime.datetime, method: str) -> datetime.datetime:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(
            f"EvalWindow.{method} needs a timezone-aware datetime; got naive {at.isoformat()}"
        )
    return at.astimezone(_UTC)


def _wall(instant: datetime.datetime, tz: zoneinfo.ZoneInfo) -> datetime.datetime:
    return instant.astimezone(_UTC).astimezone(tz).replace(tzinfo=None, fold=0)


def local_instant(
    day: datetime.date, wall: datetime.time, tz: zoneinfo.ZoneInfo
) -> datetime.datetime:
    """The UTC instant local ``wall`` on ``day`` names, by the rules in the module docstring."""
    naive = datetime.datetime.combine(day, wall)
    later = naive.replace(tzinfo=tz, fold=1)  # fold=1 is the later of two occurrences
    if _wall(later, tz) == naive:
        return later.astimezone(_UTC)
    # In a spring-forward gap fold=1 applies the new offset (an instant before the change)
    # and fold=0 the old one (an instant after it).
    # Bisect (to the second) for the change itself: the first instant whose wall time is past ``naive``.
    lo = int(later.timestamp())
    hi = int(naive.replace(tzinfo=tz, fold=0).timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(datetime.datetime.fromtimestamp(mid, _UTC), tz) >= naive:
            hi = mid
        else:
            lo = mid
    return datetime.datetime.fromtimestamp(hi, _UTC)


def _zone(name: str) -> zoneinfo.ZoneInfo:
    hint = "write an IANA zone name such as America/New_York or UTC"
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise WindowError(f"{TZ_VAR}={name!r}: not a known time zone; {hint}") from exc


def _clock(text: str, hour: str, minute: str) -> datetime.time:
    if not 0 <= int(hour) <= 23:
        raise WindowError(f"{WINDOW_VAR}={text!r}: hours must be 00-23; {_FORMAT_HINT}")
    if not 0 <= int(minute) <= 59:
        raise WindowError(f"{WINDOW_VAR}={text!r}: minutes must be 00-59; {_FORMAT_HINT}")
    return datetime.time(int(hour), int(minute))


def parse_window(text: str, tz: str = DEFAULT_TZ) -> EvalWindow:
    """``HH:MM-HH:MM`` (end before start crosses midnight) or ``always``, in zone ``tz``."""
    zone = _zone(tz.strip())
    value = text.strip()
    if value.lower() == ALWAYS:
        return EvalWindow(None, None, zone)
    match = _WINDOW_RE.match(value)
    if match is None:
        raise WindowError(f"{WINDOW_VAR}={text!r}: {_FORMAT_HINT}")
    start = _clock(text, match[1], match[2])
    end = _clock(text, match[3], match[4])
    if start == end:
        raise WindowError(
            f"{WINDOW_VAR}={text!r}: start and end are equal; write always for a window that never closes"
        )
    return EvalWindow(start, end, zone)
