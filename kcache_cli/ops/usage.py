"""Where a cache's space goes, for `stats`: bytes by age of last use, and what `prune --broken` would free.

Raw numbers only (bytes, counts, seconds); the CLI draws them as bars."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from kcache_cli.model.records import Entry, ScanResult, Warn
from kcache_cli.ops.delete import plan_prune

DAY = 86400.0
# Age buckets of last use, youngest first: (key, upper bound in seconds; None: no bound).
AGE_BUCKETS: tuple[tuple[str, float | None], ...] = (("<1d", DAY), ("<7d", 7 * DAY), ("<30d", 30 * DAY),
                                                     ("older", None))
RECLAIM_COMMAND = "kcache prune --broken"


def by_age(entries: Iterable[Entry], now: float | None = None) -> dict[str, dict[str, int]]:
    """Entries and bytes per age bucket of last use (every bucket present, youngest first)."""
    now = time.time() if now is None else now
    out = {key: {"entry_count": 0, "size": 0} for key, _ in AGE_BUCKETS}
    for e in entries:
        age = now - e.last_used
        key = next(k for k, bound in AGE_BUCKETS if bound is None or age < bound)
        out[key]["entry_count"] += 1
        out[key]["size"] += e.size
    return out


@dataclass(frozen=True)
class Reclaimable:
    """What `command` frees: broken entries (partial, failed, corrupt as ls judges them), symlinks where
    entries belong, stale temp and staging directories and what killed imports and exports left, and the
    trash an interrupted prune or clear left (`trash`, in `size` too)."""

    size: int
    entries: int  # entries, temp directories, links and leftovers removed (not candidates/ inside kept ones)
    command: str = RECLAIM_COMMAND
    trash: int = 0

    def to_json(self) -> dict:
        return {"bytes": self.size, "entry_count": self.entries, "command": self.command, "trash": self.trash}


def reclaimable(root: Path, result: ScanResult, warn: Warn | None = None) -> Reclaimable:
    """The plan `prune --broken` would make of the cache `result` scanned (the same rules, no second
    scan): its bytes and count."""
    if not result.exists:
        return Reclaimable(0, 0)
    plan = plan_prune(root, broken=True, deep=False, warn=warn, scanned=result)
    return Reclaimable(plan.expected_freed_size + plan.trash, plan.entries, trash=plan.trash)
