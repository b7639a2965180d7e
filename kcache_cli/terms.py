"""kcache's fixed vocabulary. A module of its own so that start-up (option parsing, completion)
can name layouts, kinds and statuses without creating the core's dataclasses."""

COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING = "complete", "partial", "failed", "corrupt", "building"
STATUSES = (COMPLETE, PARTIAL, FAILED, CORRUPT, BUILDING)
LAYOUT_NAMES = ("hidet", "tilus", "tilelang", "triton")
KINDS = ("op", "graph", "ir_module", "program", "script", "kernel", "binary")
