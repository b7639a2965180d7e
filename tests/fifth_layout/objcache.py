"""A fifth layout that kcache does not ship, written only against the Layout interface: the proof that a
new layout is one new module plus its registration (tests/test_fifth_layout.py runs kcache with it).

objcache keeps one directory per compiled object, `objects/<16 hex>/`, holding `obj.o` (the binary),
`stderr.txt` (the compiler's output) and `done` (written last). No `done`: partial; an empty `obj.o`
after `done`: corrupt."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts.base import Judging, Layout, ScanContext
from kcache_cli.layouts.shapes import BY_NAME
from kcache_cli.model.checks import list_files, read_every_byte
from kcache_cli.model.records import COMPLETE, CORRUPT, PARTIAL, Details, Entry, Judgement, LogFile, ScanFilter

SHAPE = BY_NAME["objcache"]  # registered in shapes.SHAPES (run_kcache.py does it at run time)


def _judge_names(names: dict[str, int]) -> Judgement:
    if "done" not in names:
        return Judgement.of(PARTIAL, "no done marker: the compile was interrupted")
    if not names.get("obj.o"):
        return Judgement.of(CORRUPT, "obj.o is missing or empty after the compile finished")
    return Judgement(COMPLETE)


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    try:
        names, _ = d.files()
    except OSError as exc:
        return Judgement.of(PARTIAL, f"cannot list it: {exc.strerror}")
    found = _judge_names(names)
    if found.status == COMPLETE and jc.deep:
        bad = read_every_byte(d, jc.caller_reads)
        if bad:
            return Judgement.of(CORRUPT, bad)
    return found


def scan(ctx, flt: ScanFilter) -> Iterator[Entry]:
    if not flt.wants_target("cpu"):
        return
    for de in ctx.listdir(os.path.join(ctx.root, "objects")):
        if not de.is_dir(follow_symlinks=False) or SHAPE.kinds[0].match_segment(1, de.name) is None:
            continue
        if flt.hash_prefixes and not any(de.name.startswith(p) for p in flt.hash_prefixes):
            continue
        names, usage, _ = ctx.read_dir(de.path)
        j = _judge_names(names or {})
        yield ctx.entry(path=de.path, usage=usage, layout="objcache", kind="object", target="cpu", space=None,
                        op=None, hash=de.name, status=j.status, reason=j.reason)


def describe(root: Path, entry: Entry) -> Details:
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
    binaries = (os.path.join(entry.path, "obj.o"),) if j.status == COMPLETE else ()
    return Details(entry, j.status, j.reason, j.problems, list_files(entry.path), binaries=binaries,
                   facts=(("compiler", "objcache"),))


def log_files(entry: Entry) -> list[LogFile]:
    p = os.path.join(entry.path, "stderr.txt")
    return [LogFile("stderr.txt", p)] if os.path.isfile(p) else []


class ObjcacheLayout(Layout):
    shape = SHAPE
    binary_kinds = frozenset({"object"})

    def scan(self, ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
        return scan(ctx, flt)

    def judge(self, d: EntryDir, kind: str, jc: Judging) -> Judgement:
        return judge(d, kind, jc)

    def describe(self, root: Path, entry: Entry) -> Details:
        return describe(root, entry)

    def log_files(self, entry: Entry) -> list[LogFile]:
        return log_files(entry)


LAYOUT = ObjcacheLayout()
