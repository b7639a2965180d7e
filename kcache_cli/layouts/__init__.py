"""Cache layouts, one module each. A layout module provides:

    NAME: str                                   "hidet", "tilus", "tilelang" or "triton"
    detect(root: Path) -> bool                  does this root hold this layout?
    scan(ctx: ScanContext, flt: ScanFilter)     -> Iterator[Entry]; cheap checks only
                                                (names, links, sizes); uses flt.ops/spaces/targets
                                                to skip whole directories
    describe(root: Path, entry: Entry) -> Details   deep checks that read every byte
    log_files(entry: Entry) -> list[LogFile]    the compile log, in reading order

A new layout is one new module added to LAYOUTS.
"""

from kcache_cli.layouts import hidet, tilelang, tilus, triton

LAYOUTS = {m.NAME: m for m in (hidet, tilus, tilelang, triton)}
