"""One size budget over several caches (`prune --all-caches --max-size`, `[all]` in kcache's config): the
least recently used entries go first whichever cache holds them, so a budget of 10GB keeps the 10GB used
most recently across the machine rather than 10GB in each cache. And the budget `kcache config` holds:
what `kcache prune` with no criteria enforces on each cache, and what `stats` shows usage against."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.layouts import get
from kcache_cli.model.records import ScanResult, Warn
from kcache_cli.ops.config import ALL, load_cache
from kcache_cli.util.errors import KcacheError
from kcache_cli.util.units import format_size


def shared_limits(roots: list[Path], limit: int, warn: Warn, caps: dict[str, int | None] | None = None,
                  ages: dict[str, float | None] | None = None, now: float | None = None,
                  scan: Callable[[Path], ScanResult] | None = None) -> dict[str, int]:
    """For each root, the size its own least-recently-used prune must reach so that together they keep the
    entries used most recently across all of them within `limit` bytes: the kept entries' size in it.
    `caps` and `ages` (by root) are what each root's own budget removes first: its entries beyond its
    own size cap (least recently used first) and those unused for longer than its age never count.
    `scan(root)`: the root's scan (the caller's one scan of it, that its plan reads again)."""
    now = time.time() if now is None else now
    found: list[tuple[float, int, str]] = []
    for root in roots:
        result = scan(root) if scan is not None else scan_cache(root, warn=warn)
        mine = sorted(((e.last_used, e.size) for e in result.entries
                       if e.hash and get(e.layout).leftover(e) is None), key=_recent_first)
        age, cap = (ages or {}).get(str(root)), (caps or {}).get(str(root))
        if age is not None:
            mine = [f for f in mine if now - f[0] <= age]
        if cap is not None:
            mine = mine[:len(_fitting(mine, cap))]
        found.extend((last, size, str(root)) for last, size in mine)
    kept: dict[str, int] = {str(r): 0 for r in roots}
    for _last, size, where in _fitting(sorted(found, key=_recent_first), limit):
        kept[where] += size
    return kept


def _recent_first(f: tuple) -> tuple:
    """Most recently used first; of entries used at the same time the smaller first (the larger go first)."""
    return -f[0], f[1]


def _fitting(ordered: list[tuple], limit: int) -> list[tuple]:
    """The longest head of `ordered` ((last used, size, ...) tuples) whose sizes fit in `limit`."""
    total = 0
    for n, f in enumerate(ordered):
        if total + f[1] > limit:
            return ordered[:n]
        total += f[1]
    return ordered


@dataclass(frozen=True)
class RootBudget:
    """What `prune` with no criteria enforces on one root: bytes and seconds (None: no limit), and where
    each comes from (a file, and which part of it), for the line prune prints."""

    max_size: int | None
    max_age: float | None
    size_from: str = ""
    age_from: str = ""


def configured(roots: list[tuple[Path, tuple[str, ...]]], cfg, warn: Warn,
               scan: Callable[[Path], ScanResult] | None = None) -> dict[str, RootBudget]:
    """Each root's budget from the config `cfg` (kcache_cli.ops.config.Config), given the layouts each holds:
    its own `[cache.<layout>]` values, then `[all]` (its max-age for each, its max-size shared across
    the roots, least recently used first, after each root's own cap; `scan` as for shared_limits)."""
    every = cfg.budget(ALL)
    own = {str(root): cfg.budget_for(layouts) for root, layouts in roots}
    ages = {r: _least(b.max_age, every.max_age) for r, b in own.items()}
    sizes = {r: b.max_size for r, b in own.items()}
    size_from = {r: f"{cfg.path} [cache.*]" for r in sizes}
    if every.max_size is not None:
        if len(roots) == 1:
            shared = {r: every.max_size for r in sizes}
        else:
            shared = shared_limits([p for p, _ in roots], every.max_size, warn, sizes, ages, scan=scan)
        for r, n in list(sizes.items()):
            if n is None or shared[r] < n:
                sizes[r] = shared[r]
                size_from[r] = (f"{cfg.path} [all]" if len(roots) == 1 else
                                f"its share of [all] max-size {format_size(every.max_size)}, {cfg.path}")
    age_from = {r: f"{cfg.path} [cache.*]" if own[r].max_age == ages[r] else f"{cfg.path} [all]" for r in ages}
    return {r: RootBudget(sizes[r], ages[r], size_from[r], age_from[r]) for r in own}


def effective(roots: list[tuple[Path, tuple[str, ...]]], cfg, warn: Warn,
              scan: Callable[[Path], ScanResult] | None = None,
              unread: dict[str, str] | None = None) -> dict[str, RootBudget]:
    """What a bare `prune` keeps each root to: the budget kept in the cache (`.kcache/budget/config.toml`, binding
    every user and winning over personal settings), then, only for caches this user owns, the user's own
    config (`configured`, `scan` as there). A budget in a cache that cannot be read or trusted is an error
    naming its file (KcacheError); with `unread`, that root is left out of the answer and its error put
    there instead (one cache a member broke stops no prune of the others)."""
    kept, files = {}, {}
    for root, _ in roots:
        try:
            if root.is_dir():
                cached = load_cache(root)
                kept[str(root)], files[str(root)] = cached.budget(), str(cached.path)
        except KcacheError as exc:
            if unread is None:
                raise
            unread[str(root)] = str(exc)
    roots = [(root, layouts) for root, layouts in roots if str(root) not in (unread or {})]
    owned = [(root, layouts) for root, layouts in roots if yours(root)]
    personal = configured(owned, cfg, warn, scan=scan) if owned else {}
    out = {}
    for root, _ in roots:
        r, inside = str(root), kept.get(str(root))
        mine = personal.get(r, RootBudget(None, None))
        here = files.get(r, "")
        size = (inside.max_size, here) if inside and inside.max_size is not None else (mine.max_size, mine.size_from)
        age = (inside.max_age, here) if inside and inside.max_age is not None else (mine.max_age, mine.age_from)
        out[r] = RootBudget(size[0], age[0], size[1], age[1])
    return out


def yours(root: Path) -> bool:
    """Whether this user owns the cache at `root` (or it is not made yet): personal settings bind only those."""
    return not root.is_dir() or root.stat().st_uid == os.geteuid()


def _least(a, b):
    return b if a is None else a if b is None else min(a, b)


@dataclass(frozen=True)
class Usage:
    """One line of `stats`: a cache's bytes against the max-size that binds it (`name` "all": the caches of
    this user's own against [all])."""

    name: str
    used: int
    limit: int
    root: str = ""  # the cache's root ("" for the line of [all])

    def to_json(self) -> dict:
        return {"used": self.used, "limit": self.limit}


def usage(caches: list[tuple[Path, tuple[str, ...], int]], cfg, warn: Warn) -> list[Usage]:
    """What `stats` shows against the budget a bare `prune` enforces (`effective`), from each cache's (root,
    layouts, bytes used): its bytes against the max-size kept in the cache, else, in a cache this user
    owns, the user's `[cache.<layout>]`; then the bytes of the caches this user owns against `[all]`'s
    max-size when set. A cache whose own budget cannot be read is a warning, and shows none."""
    out, mine = [], []
    for root, layouts, used in caches:
        own = yours(root)
        if own:
            mine.append(used)
        try:
            limit = load_cache(root).budget().max_size
        except KcacheError as exc:
            warn(f"budget of {root} not shown: {exc}")
            continue
        if limit is None and own:
            limit = cfg.budget_for(layouts).max_size
        if limit is not None:
            out.append(Usage("+".join(layouts), used, limit, str(root)))
    every = cfg.budget(ALL).max_size
    if every is not None and mine:
        out.append(Usage(ALL, sum(mine), every))
    return out
