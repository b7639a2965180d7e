"""One size budget over several caches (`prune --all-caches --max-size`): the least recently used entries
go first whichever cache holds them, so a budget of 10GB keeps the 10GB used most recently across the
machine rather than 10GB in each cache."""

from __future__ import annotations

from pathlib import Path

from kcache_cli.model import Warn


def shared_limits(roots: list[Path], limit: int, warn: Warn) -> dict[str, int]:
    """For each root, the size its own least-recently-used prune must reach so that together they keep the
    entries used most recently across all of them within `limit` bytes: the kept entries' size in it."""
    from kcache_cli.layouts import get
    from kcache_cli.scan import scan_cache

    found = []
    for root in roots:
        for e in scan_cache(root, warn=warn).entries:
            if e.hash and get(e.layout).leftover(e) is None:
                found.append((e.last_used, e.size, str(root)))
    kept: dict[str, int] = {str(r): 0 for r in roots}
    total = 0
    for _last, size, where in sorted(found, key=lambda f: -f[0]):  # most recently used first
        if total + size > limit:
            break  # this one and every older one go
        total += size
        kept[where] += size
    return kept
