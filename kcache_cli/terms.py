"""kcache's fixed vocabulary. A module of its own so that start-up (option parsing, completion)
can name layouts, kinds and statuses without creating the core's dataclasses."""

COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING = "complete", "partial", "failed", "corrupt", "building"
# stale: whole and valid, but built by another version of the compiler, which will rebuild it.
# unreadable: permissions keep kcache (and the compiler) from reading it; never judged broken.
STALE, UNREADABLE = "stale", "unreadable"
STATUSES = (COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING, STALE, UNREADABLE)
LAYOUT_NAMES = ("hidet", "tilus", "tilelang")
KINDS = ("op", "graph", "ir_module", "program", "script", "kernel", "binary")
