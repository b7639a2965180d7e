"""Sizes and ages as people write them, and sizes as people read them: one grammar each, used by every
option that takes one (`prune --max-size`, `import --max-file-size`, `prune --older-than`...)."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real import, for mypy; at run time it loads at its first use
    import humanize
else:
    humanize = lazy_module("humanize")

if TYPE_CHECKING:
    from fractions import Fraction

# ASCII only: Python's int() and float() also read other scripts' digits ("٣"), "nan", "inf", "1e9" and
# "1_000"; none of them is a size or a duration here. [0-9], not \d (which is any Unicode digit).
_NUMBER = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_MAX_DIGITS = 24  # more digits than any real size or duration has: refused before any arithmetic
MAX_SIZE = 2**63 - 1  # bytes: what a file offset can hold
MAX_SECONDS = 100 * 366 * 86400.0  # a century

# K/M/G/T/P are decimal (as sizes are printed), Ki/Mi/Gi/Ti/Pi binary; a trailing "B" is optional; a
# bare number is refused (ccache reads `-M 10` as 10 GB, du as 10 KiB: kcache asks), but 0 stays 0.
_SIZE_UNITS = {"b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
               "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_SIZE = re.compile(r"[ \t]*" + _NUMBER + r"[ \t]*([a-zA-Z]*)[ \t]*", re.ASCII)
_DAY = 86400
# Matched without case, but for a bare "M": minutes to Go and to kcache's "90m", months to systemd and to
# Java, so "6M" is refused rather than read as the 6 minutes that would prune a whole cache from cron.
_AGE_UNITS = {**dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
              **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
              **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
              **dict.fromkeys(("d", "day", "days"), _DAY),
              **dict.fromkeys(("w", "wk", "week", "weeks"), 7 * _DAY),
              **dict.fromkeys(("mo", "month", "months"), 30 * _DAY),
              **dict.fromkeys(("y", "yr", "year", "years"), 365 * _DAY)}
_AGE_PART = re.compile(_NUMBER + r"[ \t]*([a-zA-Z]+)", re.ASCII)
_AGE = re.compile(r"[ \t]*(?:" + _NUMBER + r"[ \t]*[a-zA-Z]+[ \t]*)+", re.ASCII)


def is_digits(text: str) -> bool:
    """Whether `text` is one or more ASCII digits, the only digits kcache reads as a number (str.isdigit is
    true of "²" too, which int() refuses, and of other scripts' digits, which no file of ours holds)."""
    return text.isascii() and text.isdigit()


def _where(option: str | None) -> str:
    return f" for {option}" if option else ""


def _number(digits: str, text: str, what: str, option: str | None) -> Fraction:
    """The exact value of an ASCII decimal (no float on the way: 5,000 digits are refused, not inf)."""
    from fractions import Fraction  # here, not at the top: every command imports this module, few parse

    if sum(is_digits(ch) for ch in digits) > _MAX_DIGITS:
        raise UsageError(f"bad {what} '{_short(text)}'{_where(option)}: too many digits")
    return Fraction(digits if not digits.endswith(".") else digits[:-1])


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def parse_size(text: str, option: str | None = None) -> int:
    """'10GB', '500M', '1.5GiB', '.5G', '4096B', '0' -> bytes. A bare number other than 0 is a usage
    error with a hint ('10 what? say 10G')."""
    m = _SIZE.fullmatch(text or "")
    unit = m.group(2).lower() if m else ""
    if unit.endswith("b") and unit != "b":
        unit = unit[:-1]
    if m and not unit:
        value = _number(m.group(1), text, "size", option)
        if value == 0:
            return 0
        n = m.group(1).rstrip(".")
        said = f"{option} {n}: " if option else ""
        raise UsageError(f"{said}{n} what? say {n}G (or {n}M, {n}B: a size needs a unit)")
    if not m or unit not in _SIZE_UNITS:
        raise UsageError(f"bad size '{_short(text)}'{_where(option)} (expected e.g. 10GB, 500M, 2GiB, .5G or 4096B)")
    size = int(_number(m.group(1), text, "size", option) * _SIZE_UNITS[unit])
    if size > MAX_SIZE:
        raise UsageError(f"bad size '{_short(text)}'{_where(option)}: more than any disk holds")
    return size


def parse_age(text: str, option: str | None = None) -> float:
    """'30d', '12h', '90m', '1w', '6mo', '1y', '1d12h', '.5d' -> seconds (a unit is required; a month is 30
    days, a year 365; a bare "M" is refused: minutes or months?)."""
    parts = _AGE_PART.findall(text or "") if _AGE.fullmatch(text or "") else []
    if any(u == "M" for _, u in parts):
        n = next(n for n, u in parts if u == "M")
        raise UsageError(f"bad age '{_short(text)}'{_where(option)}: M is minutes or months? say {n}m (minutes) "
                         f"or {n}mo (months)")
    if not parts or any(u.lower() not in _AGE_UNITS for _, u in parts):
        raise UsageError(f"bad age '{_short(text)}'{_where(option)} (expected e.g. 30d, 12h, 90m, 2w, 6mo, 1y "
                         "or 1d12h)")
    seconds = sum(_number(n, text, "age", option) * _AGE_UNITS[u.lower()] for n, u in parts)
    if seconds > MAX_SECONDS:
        raise UsageError(f"bad age '{_short(text)}'{_where(option)}: more than a century")
    return float(seconds)


def parse_seconds(text: str, option: str | None = None) -> float:
    """A duration to wait ('--lock-timeout 30', '2.5', '90s', '5m', '1h'): a bare number is seconds;
    finite, not negative, at most a century. nan, inf, '-1' and other scripts' digits are usage errors."""
    m = re.fullmatch(r"[ \t]*" + _NUMBER + r"[ \t]*", text or "", re.ASCII)
    if m is not None:
        seconds = _number(m.group(1), text, "duration", option)
        if seconds > MAX_SECONDS:
            raise UsageError(f"bad duration '{_short(text)}'{_where(option)}: more than a century")
        return float(seconds)
    try:
        return parse_age(text, option)
    except UsageError:
        raise UsageError(f"bad duration '{_short(text)}'{_where(option)} (expected seconds, e.g. 30, 2.5, "
                         "90s, 5m or 1h)") from None


def plural(n: int, singular: str, many: str | None = None) -> str:
    """A count as English says it: `1 entry`, `2 entries`, `0 files`, `20,022 entries` (the one way kcache
    counts things, in the CLI and in the core's messages)."""
    if many is None:
        many = singular[:-1] + "ies" if singular.endswith("y") and singular[-2:-1] not in "aeiou" else singular + "s"
    return f"{n:,} {singular if n == 1 else many}"


def format_size(n: int) -> str:
    """Bytes for people in powers of 1000, as parse_size reads them back: "0 B", "1 B", "41.3 MB"."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if value < 999.95 or unit == "PB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def describe_age(seconds: float) -> str:
    """A duration in words, in its largest whole-ish unit, for echoing what an age was read as: '180 days',
    '6 minutes', '1.5 hours' (no months: '6mo' reads back as '180 days', which is what it means)."""
    for unit, n in (("day", _DAY), ("hour", 3600), ("minute", 60)):
        if seconds >= n:
            value = f"{seconds / n:.1f}".removesuffix(".0")
            return f"{value} {unit}{'' if value == '1' else 's'}"
    value = f"{seconds:.1f}".removesuffix(".0")
    return f"{value} second{'' if value == '1' else 's'}"


def format_age(seconds: float) -> str:
    """A duration in its largest whole unit: '30d', '5h', '12m', '40s' (parse_age reads it back)."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.0f}{unit}"
    return f"{seconds:.0f}s"


def format_ago(ts: float, now: float | None = None) -> str:
    """How long ago an epoch time was, for people ('3 days ago'); '-' for none."""
    if not ts:
        return "-"
    return humanize.naturaltime((time.time() if now is None else now) - ts)
