"""kcache's fixed vocabulary. A module of its own so that start-up (option parsing, completion)
can name layouts, kinds and statuses without creating the core's dataclasses. Layout names and
kinds come from the layouts' registry (kcache_cli/layouts/shapes.py)."""

from kcache_cli.layouts.shapes import SHAPES

COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING = "complete", "partial", "failed", "corrupt", "building"
STATUSES = (COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING)
LAYOUT_NAMES = tuple(s.name for s in SHAPES)
KINDS = tuple(dict.fromkeys(k.kind for s in SHAPES for k in s.kinds))  # tilelang and triton share two
