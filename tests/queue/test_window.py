"""The eval window: local-time spans across midnight and DST changes, and its settings."""

from __future__ import annotations

import datetime
from zoneinfo import ZoneInfo

import pytest

from hangar_dagster.queue.window import EvalWindow, WindowError, parse_window
from hangar_dagster.settings import Settings

pytestmark = pytest.mark.unit

NY = ZoneInfo("America/New_York")
UTC = datetime.UTC
SECOND = datetime.timedelta(seconds=1)


def ny(y: int, mo: int, d: int, h: int, mi: int = 0, fold: int = 0) -> datetime.datetime:
    return datetime.datetime(y, mo, d, h, mi, tzinfo=NY, fold=fold)


def elapsed(start: datetime.datetime, end: datetime.datetime) -> datetime.timedelta:
    """Real time between two instants (subtracting datetimes that share a tzinfo uses wall time)."""
    return end.astimezone(UTC) - start.astimezone(UTC)


def utc(y: int, mo: int, d: int, h: int, mi: int = 0) -> datetime.datetime:
    return datetime.datetime(y, mo, d, h, mi, tzinfo=UTC)


def test_default_window_comes_from_an_empty_environment() -> None:
    window = Settings.from_env({}).window
    assert (window.start, window.end) == (datetime.time(20, 0), datetime.time(0, 15))
    assert window.describe() == "20:00-00:15 America/New_York"
    assert not window.always
    # Set-but-empty variables (as compose files pass them) take the defaults too.
    assert Settings.from_env({"HANGAR_EVAL_WINDOW": " ", "HANGAR_EVAL_TZ": ""}).window == window


@pytest.mark.parametrize(
    ("day", "offset_hours"), [((2026, 1, 15), -5), ((2026, 7, 15), -4)], ids=["winter", "summer"]
)
def test_default_window_in_winter_and_summer(day: tuple[int, int, int], offset_hours: int) -> None:
    window = Settings.from_env({}).window
    y, m, d = day
    opens, closes = ny(y, m, d, 20), ny(y, m, d + 1, 0, 15)
    assert opens.utcoffset() == datetime.timedelta(hours=offset_hours)
    assert window.is_open(opens) and window.is_open(closes - SECOND)
    assert not window.is_open(opens - SECOND) and not window.is_open(closes)
    assert window.closes_at(opens) == closes
    assert window.closes_at(ny(y, m, d + 1, 0, 5)) == closes  # after midnight, same window
    assert window.next_open(ny(y, m, d, 21)) == ny(y, m, d, 21)  # open: now
    assert window.next_open(closes) == ny(y, m, d + 1, 20)
    assert elapsed(opens, closes) == datetime.timedelta(hours=4, minutes=15)


def test_opens_at_is_the_start_of_the_window_containing_an_instant() -> None:
    window = Settings.from_env({}).window
    opens = ny(2026, 7, 15, 20)
    assert window.opens_at(opens) == opens
    assert window.opens_at(ny(2026, 7, 16, 0, 14)) == opens  # after midnight, same window
    assert window.opens_at(ny(2026, 7, 16, 0, 15)) is None  # closed
    assert window.opens_at(ny(2026, 7, 15, 14)) is None
    # The spring-forward night: 02:30 does not exist, the window opens at 03:00 EDT.
    assert parse_window("02:30-04:00").opens_at(ny(2027, 3, 14, 3, 10)) == ny(2027, 3, 14, 3)
    assert parse_window("always").opens_at(opens) is None


def test_submitted_at_two_in_the_afternoon_waits_for_eight() -> None:
    window = Settings.from_env({}).window
    afternoon = ny(2026, 1, 15, 14)
    assert not window.is_open(afternoon)
    assert window.closes_at(afternoon) is None
    assert window.next_open(afternoon) == ny(2026, 1, 15, 20)
    # The same instant given in UTC gives the same answer.
    assert window.next_open(afternoon.astimezone(UTC)) == ny(2026, 1, 15, 20)


def test_spring_forward_end_in_the_gap_closes_at_three() -> None:
    # 2027-03-14: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist.
    window = parse_window("01:30-02:30")
    opens = ny(2027, 3, 14, 1, 30)
    assert window.next_open(ny(2027, 3, 14, 0)) == opens
    closes = window.closes_at(opens)
    assert closes == ny(2027, 3, 14, 3)
    assert window.is_open(utc(2027, 3, 14, 7) - SECOND)
    assert not window.is_open(utc(2027, 3, 14, 7))
    assert closes is not None and elapsed(opens, closes) == datetime.timedelta(minutes=30)


def test_spring_forward_start_in_the_gap_opens_at_three() -> None:
    window = parse_window("02:30-04:00")
    assert window.next_open(ny(2027, 3, 14, 0)) == ny(2027, 3, 14, 3)
    assert not window.is_open(ny(2027, 3, 14, 1, 59))
    # The next night is ordinary again.
    assert window.next_open(ny(2027, 3, 14, 5)) == ny(2027, 3, 15, 2, 30)


def test_window_crossing_two_on_the_spring_forward_night_is_an_hour_short() -> None:
    window = parse_window("23:00-03:00")
    opens = ny(2027, 3, 13, 23)
    assert window.next_open(ny(2027, 3, 13, 12)) == opens
    for inside in (utc(2027, 3, 14, 6, 59), ny(2027, 3, 14, 1, 59)):
        assert window.is_open(inside)
    closes = window.closes_at(opens)
    assert closes == ny(2027, 3, 14, 3)
    assert closes is not None and elapsed(opens, closes) == datetime.timedelta(hours=3)


def test_window_inside_the_gap_is_empty_that_night() -> None:
    window = parse_window("02:10-02:50")
    for at in (utc(2027, 3, 14, 6, 59), utc(2027, 3, 14, 7), ny(2027, 3, 14, 3, 30)):
        assert not window.is_open(at)
    assert window.next_open(ny(2027, 3, 14, 0)) == ny(2027, 3, 15, 2, 10)


def test_window_crossing_two_on_the_fall_back_night_is_an_hour_long() -> None:
    # 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:00-01:59 happens twice.
    window = parse_window("23:00-03:00")
    opens = ny(2026, 10, 31, 23)
    first, second = ny(2026, 11, 1, 1, 30, fold=0), ny(2026, 11, 1, 1, 30, fold=1)
    assert elapsed(first, second) == datetime.timedelta(hours=1)
    assert window.is_open(first) and window.is_open(second)
    closes = window.closes_at(first)
    assert closes == ny(2026, 11, 1, 3)
    assert closes is not None and elapsed(opens, closes) == datetime.timedelta(hours=5)


def test_ambiguous_start_uses_the_later_occurrence() -> None:
    window = parse_window("01:30-02:30")
    first = ny(2026, 11, 1, 1, 45, fold=0)  # 05:45 UTC, EDT
    assert not window.is_open(first)
    opens = window.next_open(first)
    assert opens == utc(2026, 11, 1, 6, 30)
    assert opens.astimezone(NY).utcoffset() == datetime.timedelta(hours=-5)  # 01:30 EST
    assert window.closes_at(opens) == utc(2026, 11, 1, 7, 30)


def test_ambiguous_end_compares_instants_not_wall_times() -> None:
    # 01:45 EDT is later on the wall than the 01:30 EST end but an hour before it:
    # comparing datetimes that share a tzinfo would get this wrong.
    window = parse_window("23:00-01:30")
    at = ny(2026, 11, 1, 1, 45, fold=0)
    assert window.is_open(at)
    assert window.closes_at(at) == utc(2026, 11, 1, 6, 30)
    assert not window.is_open(utc(2026, 11, 1, 6, 30))


def test_other_zone_and_case_insensitive_always() -> None:
    window = Settings.from_env(
        {"HANGAR_EVAL_WINDOW": "09:00-17:30", "HANGAR_EVAL_TZ": "UTC"}
    ).window
    assert window.describe() == "09:00-17:30 UTC"
    assert window.is_open(utc(2026, 1, 15, 9)) and not window.is_open(utc(2026, 1, 15, 17, 30))
    assert window.next_open(ny(2026, 1, 15, 14)) == utc(2026, 1, 16, 9)  # 19:00 UTC: after 17:30
    assert Settings.from_env({"HANGAR_EVAL_WINDOW": " Always "}).window.always


def test_always_is_open_at_every_instant() -> None:
    window = Settings.from_env({"HANGAR_EVAL_WINDOW": "always"}).window
    assert window.always and window.describe() == "always"
    for at in (ny(2026, 1, 15, 14), ny(2027, 3, 14, 3), ny(2026, 11, 1, 1, 30, fold=1)):
        assert window.is_open(at)
        assert window.next_open(at) == at
        assert window.closes_at(at) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("25:00-01:00", "HANGAR_EVAL_WINDOW='25:00-01:00': hours must be 00-23"),
        ("20:00-24:00", "HANGAR_EVAL_WINDOW='20:00-24:00': hours must be 00-23"),
        ("20:60-21:00", "HANGAR_EVAL_WINDOW='20:60-21:00': minutes must be 00-59"),
        ("8pm-midnight", "HANGAR_EVAL_WINDOW='8pm-midnight': write HH:MM-HH:MM"),
        ("20:00", "HANGAR_EVAL_WINDOW='20:00': write HH:MM-HH:MM"),
        ("20:00-20:00", "start and end are equal; write always"),
    ],
)
def test_bad_window_values_say_what_to_write(value: str, expected: str) -> None:
    with pytest.raises(WindowError) as err:
        _ = Settings.from_env({"HANGAR_EVAL_WINDOW": value}).window
    assert expected in str(err.value)
    assert "always" in str(err.value)


@pytest.mark.parametrize("value", ["Mars/Olympus_Mons", "../../etc/passwd", "EST+5"])
def test_bad_time_zones_say_what_to_write(value: str) -> None:
    with pytest.raises(WindowError) as err:
        _ = Settings.from_env({"HANGAR_EVAL_TZ": value}).window
    message = str(err.value)
    assert message.startswith(f"HANGAR_EVAL_TZ={value!r}: not a known time zone")
    assert "America/New_York" in message


def test_naive_datetimes_are_refused() -> None:
    window = Settings.from_env({}).window
    naive = datetime.datetime(2026, 1, 15, 20)  # noqa: DTZ001 - the point of the test
    for method in (window.is_open, window.next_open, window.opens_at, window.closes_at):
        with pytest.raises(ValueError, match="needs a timezone-aware datetime"):
            method(naive)


def test_constructed_windows_are_checked() -> None:
    with pytest.raises(WindowError, match="use always"):
        EvalWindow(datetime.time(20), datetime.time(20), NY)
    with pytest.raises(WindowError, match="both start and end"):
        EvalWindow(datetime.time(20), None, NY)
