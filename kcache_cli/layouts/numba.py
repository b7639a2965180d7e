"""Numba's on-disk cache of `@jit(cache=True)` functions (numba 0.68's numba/core/caching.py).

Per source file and function, an index `<module>.<qualname>-<line>.py<XY>.nbi` (a pickle of numba's
version, then a pickle of (the source file's stamp, {overload key: data file name})) and one
`<same>.<n>.nbc` per compiled overload. Where (numba's locators, first that fits): NUMBA_CACHE_DIR/
<source dir name>_<sha1 of its path>/; else `__pycache__/` beside the source; else the user-wide
<user cache dir>/numba/<source dir name>_<sha1>/. So an entry is one such directory, the cache of one
source directory's functions, and a root is NUMBA_CACHE_DIR (or ~/.cache/numba, `dir --all`'s default
root: the only place common to all projects) or a project directory whose `__pycache__/` holds them.

What numba does with an entry (IndexDataCacheFile.load): an index that names a data file that is gone
is a miss, and numba compiles that overload again and writes a new one (partial); an index or data file
that does not unpickle raises out of the call (corrupt: deep, read with pickletools, never unpickled);
an index written by another numba version is ignored and rewritten (stale, when numba is installed
beside kcache, whose version is then the one compared; else not judged). kcache never unpickles: a pickle runs
code. Moving it: the index holds the source file's mtime and size, so a copy is a hit only beside the
same source file (same path for NUMBA_CACHE_DIR's sha1) with the same numba: import carries it, numba
misses elsewhere. A `__pycache__/` that also holds Python's .pyc files is never removed by kcache.
"""

from __future__ import annotations

import pickletools
from pathlib import Path
from typing import Iterator

from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts.base import Judging, Layout, ScanContext
from kcache_cli.layouts.shapes import NUMBA
from kcache_cli.model.checks import list_files
from kcache_cli.model.records import (
    COMPLETE,
    CORRUPT,
    PARTIAL,
    STALE,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    ScanFilter,
)

NAME = NUMBA.name
KIND = "functions"
INDEX, DATA = ".nbi", ".nbc"
MAX_INDEX = 16 << 20
_INSTALLED: list[str] = []


def installed_version() -> str:
    """The version of the numba installed beside kcache, from its metadata (numba is not imported), or ""."""
    if not _INSTALLED:
        import importlib.metadata

        try:
            _INSTALLED.append(importlib.metadata.version("numba"))
        except (importlib.metadata.PackageNotFoundError, ValueError):
            _INSTALLED.append("")
    return _INSTALLED[0]


def numba_files(names) -> bool:
    return any(n.endswith((INDEX, DATA)) for n in names)


def index_refs(data: bytes) -> tuple[str, list[str]]:
    """(numba's version, the data file names) an index records, read with pickletools (nothing runs):
    ValueError when it is not two whole pickles."""
    strings: tuple[list[str], list[str]] = ([], [])
    start = 0
    for part in strings:
        stop = None
        for op, arg, at in pickletools.genops(data[start:]):
            if isinstance(arg, str):
                part.append(arg)
            if op.name == "STOP":
                stop = at
                break
        if stop is None:
            raise ValueError("cut short")
        start += stop + 1
    if not strings[0]:
        raise ValueError("no numba version")
    return strings[0][0], [s for s in strings[1] if s.endswith(DATA)]


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    try:
        names, _ = d.files()
    except OSError:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    for idx in sorted(n for n in names if n.endswith(INDEX)):
        try:
            version, refs = index_refs(d.read_bytes(idx, MAX_INDEX))
        except (ValueError, OSError, IndexError) as exc:
            return Judgement.of(CORRUPT, f"{idx} is not a whole index ({exc}): numba's call raises on it")
        if jc.version and version != jc.version:
            return Judgement.of(STALE, f"{idx} was written by numba {version}: numba {jc.version} ignores it and "
                                       "compiles again")
        gone = [r for r in refs if r not in names]
        if gone:
            return Judgement.of(PARTIAL, f"{idx} names {gone[0]}, which is gone: numba compiles that overload "
                                         "again")
        if jc.deep:
            bad = next((r for r in refs if not _whole_pickle(d, r)), None)
            if bad:
                return Judgement.of(CORRUPT, f"{bad} is not a whole pickle: numba's call raises on it")
    return Judgement(COMPLETE)


def _whole_pickle(d: EntryDir, name: str) -> bool:
    try:
        for op, _, _ in pickletools.genops(d.read_bytes(name, 1 << 30)):
            if op.name == "STOP":
                return True
    except (ValueError, OSError):
        return False
    return False


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    if not flt.wants_target("cpu") or flt.spaces or flt.ops:
        return
    prefixes = flt.name_prefixes()
    jc = Judging(version=installed_version() if ctx.statuses else "")
    for de in ctx.listdir(ctx.root):
        if not de.is_dir(follow_symlinks=False) or NUMBA.kinds[0].match_segment(0, de.name) is None:
            continue
        if prefixes and not any(de.name.startswith(p) for p in prefixes):
            continue
        with ctx.open_entry(de.path) as d:
            names, usage, _ = ctx.read_dir(d)
            if not names or not numba_files(names):
                continue
            j = judge(d, KIND, jc)
        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind=KIND, target="cpu", space=None, op=None,
                        hash=de.name, status=j.status, reason=j.reason)


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    if kind != KIND or "/" in relpath or NUMBA.kinds[0].match(relpath) is None:
        return f"{relpath!r} is not where numba's cache of a source directory lies"
    if names is not None:
        if not numba_files(names):
            return "it holds no numba cache file (.nbi, .nbc)"
        other = sorted(n for n in names if not n.endswith((INDEX, DATA)))
        if other:
            return f"it holds other files too ({other[0]}): kcache removes only numba's own directories"
    return None


def describe(root: Path, entry: Entry) -> Details:
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True, version=installed_version()))
        try:
            names = d.names()
            versions = sorted({index_refs(d.read_bytes(n, MAX_INDEX))[0] for n in names if n.endswith(INDEX)})
        except (OSError, ValueError, IndexError):
            names, versions = [], []
    facts = [("indexes", str(sum(n.endswith(INDEX) for n in names))),
             ("overloads", str(sum(n.endswith(DATA) for n in names))),
             ("numba version", ", ".join(versions) or "unknown"),
             ("reused", "only beside the same source file (its mtime and size are in the index) by the same numba")]
    return Details(entry, j.status, j.reason, j.problems, list_files(entry.path), facts=tuple(facts))


def no_log(entry: Entry) -> str:
    return "numba keeps no compile log in its cache (NUMBA_DEBUG_CACHE=1 prints what it loads and saves)"


class NumbaLayout(Layout):
    shape = NUMBA
    fact_files = ()
    binary_kinds = frozenset({KIND})

    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)

    def judging(self, deep: bool = False, *, statuses: bool = True, caller_reads: bool = False) -> Judging:
        """Goes by the installed numba's version (looked up once, here), when one is installed."""
        return Judging(deep, version=installed_version() if statuses else "", caller_reads=caller_reads)

    judge = staticmethod(judge)
    describe = staticmethod(describe)
    no_log = staticmethod(no_log)


LAYOUT = NumbaLayout()
