"""Sizes and ages as people write them, and sizes as people read them: one grammar each, used by every
option that takes one (`prune --max-size`, `import --max-file-size`, `prune --older-than`...)."""

from __future__ import annotations

import re

from kcache_cli.errors import UsageError

# K/M/G/T are decimal (as sizes are printed), Ki/Mi/Gi/Ti binary; a trailing "B" is optional.
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
               "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")
_AGE_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "day": 86400,
              "days": 86400, "w": 7 * 86400, "week": 7 * 86400, "weeks": 7 * 86400}
_AGE_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]+)")


def parse_size(text: str, option: str | None = None) -> int:
    """'10GB', '500M', '1.5GiB', '.5G', '4096' -> bytes."""
    m = _SIZE.fullmatch(text or "")
    unit = m.group(2).lower() if m else ""
    if unit.endswith("b") and unit != "b":
        unit = unit[:-1]
    if not m or unit not in _SIZE_UNITS:
        where = f" for {option}" if option else ""
        raise UsageError(f"bad size '{text}'{where} (expected e.g. 10GB, 500M, 2GiB, .5G or a number of bytes)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def parse_age(text: str, option: str | None = None) -> float:
    """'30d', '12h', '90m', '1w', '1d12h', '.5d' -> seconds."""
    parts = _AGE_PART.findall(text or "")
    rebuilt = "".join(n + u for n, u in parts)
    if not parts or rebuilt != re.sub(r"\s+", "", text) or any(u.lower() not in _AGE_UNITS for _, u in parts):
        where = f" for {option}" if option else ""
        raise UsageError(f"bad age '{text}'{where} (expected e.g. 30d, 12h, 90m, 2w or 1d12h)")
    return sum(float(n) * _AGE_UNITS[u.lower()] for n, u in parts)


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


def format_age(seconds: float) -> str:
    """A duration in its largest whole unit: '30d', '5h', '12m', '40s' (parse_age reads it back)."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.0f}{unit}"
    return f"{seconds:.0f}s"


def format_ago(ts: float, now: float | None = None) -> str:
    """How long ago an epoch time was, for people ('3 days ago'); '-' for none."""
    import time

    import humanize

    if not ts:
        return "-"
    return humanize.naturaltime((time.time() if now is None else now) - ts)
