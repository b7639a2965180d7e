"""kcache's fixed vocabulary. A module of its own so that start-up (option parsing, completion)
can name layouts, kinds and statuses without creating the core's dataclasses. Layout names and
kinds come from the layouts' registry (kcache_cli/layouts/shapes.py)."""

from kcache_cli.layouts.shapes import SHAPES

COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING = "complete", "partial", "failed", "corrupt", "building"
# stale: whole and valid, but built by another version of the compiler, which will rebuild it.
# unreadable: permissions keep kcache (and the compiler) from reading it; never judged broken.
STALE, UNREADABLE = "stale", "unreadable"
# moved: whole, but the paths it records lead into another root (a relocatable layout copied by hand):
# the compiler misses it until `verify --fix` rewrites them; never removed by prune --broken.
MOVED = "moved"
STATUSES = (COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING, STALE, UNREADABLE, MOVED)
LAYOUT_NAMES = tuple(s.name for s in SHAPES)
KINDS = tuple(dict.fromkeys(k.kind for s in SHAPES for k in s.kinds))  # tilelang and triton share two
