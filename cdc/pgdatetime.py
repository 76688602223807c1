"""PostgreSQL's text of dates, times, timestamps and intervals -> the envelope's JSON values
(cdc/typemap.py builds the converters; the representations are Debezium's with
`time.precision.mode=adaptive_time_microseconds` and `interval.handling.mode=string`).

timestamptz fractions have the column's precision, as Debezium 3 prints them. timetz fractions follow Java's ISO formatting:
no fraction when it is zero, else 3 digits when the value fits in milliseconds, else 6.
Years after 9999 print as `+10000-01-01T...`, years BC astronomically (1 BC = `0000`,
44 BC = `-0043`). Date and time arithmetic is done here on integers (proleptic Gregorian
calendar), so PostgreSQL's whole range is supported, from 4714-11-24 BC to 5874897 AD.
Timestamps after about 294247 AD exceed a signed 64-bit microsecond count since 1970; they
are still written exactly. The C speedup (cdc/_render.c) repeats the common cases' fast paths.
"""

from __future__ import annotations

import re

from cdc.pgtypes import Converter

INT64_MAX = 9223372036854775807
INT64_MIN = -9223372036854775808

_US_PER_SECOND = 1_000_000
_US_PER_DAY = 86_400_000_000


# ---------------------------------------------------------------------------------------------
# Calendar arithmetic (proleptic Gregorian, astronomical years: 1 BC = 0, 44 BC = -43)
# ---------------------------------------------------------------------------------------------
def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, astronomical numbering)."""
    if month <= 2:
        year -= 1
        shifted_month = month + 9  # March-based months: Mar=0 ... Feb=11
    else:
        shifted_month = month - 3
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * shifted_month + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """The inverse of `days_from_civil`: (year, month, day) of a day count since 1970-01-01."""
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    year = year_of_era + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


def _parse_date_part(text: str, bc: bool) -> int:
    """'2024-01-31' (year of 4+ digits) -> days since the epoch; `bc` flips the year."""
    year_s, month_s, day_s = text.rsplit("-", 2)
    year = int(year_s)
    if bc:
        year = 1 - year
    return days_from_civil(year, int(month_s), int(day_s))


def _parse_time_part(text: str) -> int:
    """'HH:MM:SS[.ffffff]' -> microseconds since midnight."""
    hours = int(text[0:2])
    minutes = int(text[3:5])
    seconds = int(text[6:8])
    micros = (hours * 3600 + minutes * 60 + seconds) * _US_PER_SECOND
    if len(text) > 8:
        if text[8] != ".":
            raise ValueError(f"not a time of day: {text!r}")
        frac = text[9:]
        if not frac.isdigit() or len(frac) > 6:
            raise ValueError(f"not a time of day: {text!r}")
        micros += int(frac.ljust(6, "0"))
    return micros


def _parse_offset(text: str) -> int:
    """'+05:30', '-03', '+05:53:28' -> seconds east of UTC."""
    sign = -1 if text[0] == "-" else 1
    parts = text[1:].split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a UTC offset: {text!r}")
    seconds = int(parts[0]) * 3600
    if len(parts) > 1:
        seconds += int(parts[1]) * 60
    if len(parts) > 2:
        seconds += int(parts[2])
    return sign * seconds


def _split_offset(text: str) -> tuple[str, int]:
    """'10:15:30.5+02' -> ('10:15:30.5', 7200). The offset starts after HH:MM:SS."""
    for i in range(8, len(text)):
        if text[i] in "+-":
            return text[:i], _parse_offset(text[i:])
    raise ValueError(f"no UTC offset in {text!r}")


def _fraction(micros: int) -> str:
    """Java ISO style: '' when zero, '.mmm' when whole milliseconds, else '.uuuuuu'."""
    if micros == 0:
        return ""
    if micros % 1000 == 0:
        return f".{micros // 1000:03d}"
    return f".{micros:06d}"


def _format_year(year: int) -> str:
    if 0 <= year <= 9999:
        return f"{year:04d}"
    if year > 9999:
        return f"+{year}"
    return f"-{-year:04d}"


def _format_time_of_day(micros: int) -> str:
    seconds, frac = divmod(micros, _US_PER_SECOND)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}{_fraction(frac)}"


def _format_instant(epoch_micros: int) -> str:
    days, of_day = divmod(epoch_micros, _US_PER_DAY)
    year, month, day = civil_from_days(days)
    return f"{_format_year(year)}-{month:02d}-{day:02d}T{_format_time_of_day(of_day)}Z"


_DAYS_CACHE: dict[str, int] = {}
_DAYS_CACHE_MAX = 8192


def _days_of_iso_date(text: str) -> int:
    days = _DAYS_CACHE.get(text)
    if days is None:
        if text[7] != "-" or not (text[0:4] + text[5:7] + text[8:10]).isdigit():
            raise ValueError(f"not a date: {text!r}")
        days = days_from_civil(int(text[0:4]), int(text[5:7]), int(text[8:10]))
        if len(_DAYS_CACHE) >= _DAYS_CACHE_MAX:
            _DAYS_CACHE.clear()
        _DAYS_CACHE[text] = days
    return days


def convert_date(text: str) -> int:
    if len(text) == 10 and text[4] == "-":  # the common case: a 4-digit year AD
        return _days_of_iso_date(text)
    if text == "infinity":
        return INT64_MAX
    if text == "-infinity":
        return INT64_MIN
    bc = text.endswith(" BC")
    return _parse_date_part(text[:-3] if bc else text, bc)


def convert_time(text: str) -> int:
    return _parse_time_part(text)


def convert_timetz(text: str) -> str:
    time_text, offset = _split_offset(text)
    utc = (_parse_time_part(time_text) - offset * _US_PER_SECOND) % _US_PER_DAY
    return _format_time_of_day(utc) + "Z"


def _timestamp_micros(text: str, bc: bool) -> int:
    date_text, _, time_text = text.partition(" ")
    if not time_text:
        raise ValueError(f"not a timestamp: {text!r}")
    return _parse_date_part(date_text, bc) * _US_PER_DAY + _parse_time_part(time_text)


def convert_timestamp(text: str) -> int:
    n = len(text)
    # Fast path: 'YYYY-MM-DD HH:MM:SS[.ffffff]' (4-digit year AD).
    if 19 <= n <= 26 and text[4] == "-" and text[10] == " " and text[16] == ":" and text[n - 1] != "C":
        micros = (
            _days_of_iso_date(text[0:10]) * 86400
            + int(text[11:13]) * 3600
            + int(text[14:16]) * 60
            + int(text[17:19])
        ) * 1_000_000
        if n == 19:
            return micros
        if text[19] == "." and text[20:].isdigit():
            return micros + int(text[20:].ljust(6, "0"))
    if text[-1:] == "y":
        if text == "infinity":
            return INT64_MAX
        if text == "-infinity":
            return INT64_MIN
    bc = text.endswith(" BC")
    return _timestamp_micros(text[:-3] if bc else text, bc)


def timestamptz_converter(precision: int) -> Converter:
    """timestamptz -> ISO-8601 UTC instant with exactly `precision` fraction digits (none for 0):
    Debezium's ZonedTimestamp prints the column's precision (6 when it has none declared)."""

    def fraction(micros: int) -> str:
        if precision == 0:
            return ""
        return "." + f"{micros:06d}"[:precision]

    def convert(text: str) -> str:
        n = len(text)
        # Fast path (in C too: cdc/_render.c): what TimeZone=UTC prints for years 1000..9999: 'YYYY-MM-DD HH:MM:SS[.ffffff]+00'.
        if (
            n >= 22
            and text[n - 3 :] == "+00"
            and text[4] == "-"
            and text[10] == " "
            and (n == 22 or text[19] == ".")
        ):
            micros = int(text[20 : n - 3].ljust(6, "0")) if n > 22 else 0
            return f"{text[0:10]}T{text[11:19]}{fraction(micros)}Z"
        if text == "infinity" or text == "-infinity":
            return text
        bc = text.endswith(" BC")
        if bc:
            text = text[:-3]
        date_text, _, time_text = text.partition(" ")
        time_text, offset = _split_offset(time_text)
        epoch = (
            _parse_date_part(date_text, bc) * _US_PER_DAY
            + _parse_time_part(time_text)
            - offset * _US_PER_SECOND
        )
        days, of_day = divmod(epoch, _US_PER_DAY)
        year, month, day = civil_from_days(days)
        seconds, micros = divmod(of_day, _US_PER_SECOND)
        hh, rest = divmod(seconds, 3600)
        return f"{_format_year(year)}-{month:02d}-{day:02d}T{hh:02d}:{rest // 60:02d}:{rest % 60:02d}{fraction(micros)}Z"

    convert.precision = precision  # type: ignore[attr-defined]  # read by c_kind
    return convert


convert_timestamptz = timestamptz_converter(6)


_INTERVAL_RE = re.compile(
    r"(?P<neg>-)?P"
    r"(?:(?P<years>[-+]?\d+)Y)?(?:(?P<months>[-+]?\d+)M)?(?:(?P<weeks>[-+]?\d+)W)?(?:(?P<days>[-+]?\d+)D)?"
    r"(?:T(?:(?P<hours>[-+]?\d+)H)?(?:(?P<minutes>[-+]?\d+)M)?(?:(?P<seconds>[-+]?(?:\d+(?:\.\d*)?|\.\d+))S)?)?"
)


def _seconds_text(text: str | None, negate: bool) -> str:
    """'-01.50' -> '-1.5', '6.0' -> '6', '-0' -> '0' (no trailing zeros, no -0)."""
    if not text:
        return "0"
    negative = text[0] == "-"
    digits = text.lstrip("+-")
    whole, _, frac = digits.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    body = f"{whole}.{frac}" if frac else whole
    if body == "0":
        return "0"
    return f"-{body}" if negative != negate else body


def convert_interval(text: str) -> str:
    m = _INTERVAL_RE.fullmatch(text)
    if m is None or text.endswith(("P", "T")):
        raise ValueError(f"not an ISO-8601 interval (IntervalStyle=iso_8601): {text!r}")
    negate = m["neg"] is not None
    sign = -1 if negate else 1

    def part(name: str) -> int:
        value = m[name]
        return sign * int(value) if value else 0

    days = part("days") + 7 * part("weeks")
    return (
        f"P{part('years')}Y{part('months')}M{days}DT{part('hours')}H{part('minutes')}M"
        f"{_seconds_text(m['seconds'], negate)}S"
    )
