"""Numba's on-disk cache of `@jit(cache=True)` functions (numba 0.68's numba/core/caching.py).

Per source file and function, an index `<module>.<qualname>-<line>.py<XY>.nbi` (a pickle of numba's
version, then a pickle of (the source file's stamp, {overload key: data file name})) and one
`<same>.<n>.nbc` per compiled overload. Where (numba's locators, first that fits): NUMBA_CACHE_DIR/
<source dir name>_<sha1 of its path>/ (hidden for a hidden directory's sources: `.venv_<sha1>/`); else
`__pycache__/` beside the source; else the user-wide <user cache dir>/numba/<source dir name>_<sha1>/. So
an entry is one such directory, the cache of one source directory's functions, and a root is
NUMBA_CACHE_DIR (or ~/.cache/numba, `dir --all`'s default root: the only place common to all projects) or
a project directory whose `__pycache__/` holds them.

What numba does with an entry (IndexDataCacheFile.load): an index that names a data file that is gone
is a miss, and numba compiles that overload again and writes a new one (partial); an index or data file
that does not unpickle raises out of the call (corrupt: deep, read with pickletools, never unpickled);
an index or data file that is a symlink, FIFO, device or socket is opened by numba (a FIFO blocks it),
never by kcache (unreadable in ls and verify alike, never removed for it: checks.not_regular);
an index written by another numba version is ignored and rewritten (stale, when numba is installed
beside kcache, whose version is then the one compared; else not judged); an index whose source file's
stamp differs is ignored and rewritten too (stale): judged for a `__pycache__/`, whose source is
`<the directory holding it>/<module>.py` (gone: no numba call uses that index), not for a `<dir>_<sha1>/`,
which does not say where its source directory is. kcache never unpickles: a pickle runs code. Moving
it: the index holds the sha256 of the source file's bytes (numba 0.67 and older: its mtime and size)
and each overload's key the CPU it was compiled for, so a copy is a hit only beside a source file of the
same bytes (at the same path for NUMBA_CACHE_DIR's sha1), with the same numba and Python, on the same
CPU: import carries it, numba misses elsewhere. A `__pycache__/` that also holds Python's .pyc files is
never removed by kcache. numba writes each file as `<name>.tmp.<16 hex>` and renames it: a killed write
leaves that temp file, the layout's leftover (prune removes it once an hour old; a directory holding only
such files is a leftover itself).
"""

from __future__ import annotations

import hashlib
import os
import pickletools
import re
import stat
import time
from pathlib import Path
from typing import Iterator, NamedTuple

from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts.base import (
    MISS,
    STALE_AFTER,
    TEMP,
    UNKNOWN,
    Here,
    InnerLeftover,
    Judging,
    Layout,
    Leftover,
    ScanContext,
    Verdict,
    not_installed,
    unasked,
)
from kcache_cli.layouts.shapes import NUMBA
from kcache_cli.model.checks import first_not_regular, list_files
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
# A source beside __pycache__/ larger than this is not hashed (not judged): a link someone planted to a big
# file must not make root's cron `ls` read gigabytes. Python sources are kilobytes.
MAX_SOURCE = 16 << 20
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


# numba's _open_for_write: `<index or data file>.tmp.<uuid4 hex[:16]>`, renamed over the file once written;
# a killed write leaves it (no numba call reads it): the layout's leftover, removed by prune once old.
TEMP_FILE = re.compile(r"^.+\.nb[ic]\.tmp\.[0-9a-f]{16}$")


def numba_files(names) -> bool:
    return any(n.endswith((INDEX, DATA)) for n in names)


def temp_files(names) -> list[str]:
    return sorted(n for n in names if TEMP_FILE.match(n))


class Target(NamedTuple):
    """What numba's codegen compiled an overload for (`CPUCodegen.magic_tuple`, part of its key)."""

    triple: str  # LLVM's process triple: x86_64-unknown-linux-gnu
    cpu: str  # the host CPU's name (LLVM's), or NUMBA_CPU_NAME
    features: str  # "+64bit,+adx,..." (LLVM's), or NUMBA_CPU_FEATURES


class Index(NamedTuple):
    """What an index records, read with pickletools (nothing runs): numba's version, the source file's
    stamp (numba 0.68's sha256 of its bytes, 32 bytes; 0.67 and older: (st_mtime, st_size); None: another
    shape), the data files it names and the target of each overload's key that could be read."""

    version: str
    stamp: bytes | tuple[float, int] | None
    refs: list[str]
    targets: list[Target]


_NO_DATA = frozenset({"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "MARK"})
_BYTES = frozenset({"SHORT_BINBYTES", "BINBYTES", "BINBYTES8"})


def _pickles(data: bytes) -> list[list[tuple[str, object]]]:
    """The (op name, argument) of each of the two whole pickles at the start of `data`: ValueError when
    they are not there."""
    out: list[list[tuple[str, object]]] = [[], []]
    start = 0
    for ops in out:
        stop = None
        for op, arg, at in pickletools.genops(data[start:]):
            ops.append((op.name, arg))
            if op.name == "STOP":
                stop = at
                break
        if stop is None:
            raise ValueError("cut short")
        start += stop + 1
    return out


def _stamp(ops: list[tuple[str, object]]) -> bytes | tuple[float, int] | None:
    """The source stamp that opens the second pickle ((stamp, overloads))."""
    first = [(name, arg) for name, arg in ops if name not in _NO_DATA][:3]
    if first and first[0][0] in _BYTES and isinstance(first[0][1], bytes) and len(first[0][1]) == 32:
        return first[0][1]
    if len(first) == 3 and first[0][0] == "BINFLOAT" and first[2][0] in ("TUPLE2", "TUPLE"):
        mtime, size = first[0][1], first[1][1]
        if isinstance(mtime, float) and isinstance(size, int) and not isinstance(size, bool):
            return mtime, size
    return None


_TRIPLE = re.compile(r"[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+){2,3}")


def _targets(ops: list[tuple[str, object]]) -> list[Target]:
    """The target of each overload key (sig, magic tuple, hashes) in the second pickle: its stack followed
    as far as tuples (a tuple of three strings opening with a triple is a magic tuple) and the memo go."""
    memo: dict[object, object] = {}
    stack: list[object] = []  # what each op pushed: a string, a Target, else None
    found: list[Target] = []
    for name, arg in ops:
        if name in ("PROTO", "FRAME", "STOP"):
            continue
        if name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1] if stack else None
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo.get(arg))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items, stack[-n:] = stack[-n:], []
            value = None
            if len(items) == 3 and all(isinstance(v, str) for v in items) and _TRIPLE.fullmatch(str(items[0])):
                value = Target(*(str(v) for v in items))
            elif len(items) == 3 and isinstance(items[1], Target):
                found.append(items[1])
            stack.append(value)
        else:
            stack.append(arg if isinstance(arg, str) else None)
    return found


def read_index(data: bytes, targets: bool = True) -> Index:
    """What the index `data` records (without `targets`, no overload's target: a judgement needs none);
    ValueError when it is not two whole pickles."""
    version, rest = _pickles(data)
    names = [arg for _, arg in version if isinstance(arg, str)]
    if not names:
        raise ValueError("no numba version")
    refs = [arg for _, arg in rest if isinstance(arg, str) and arg.endswith(DATA)]
    return Index(names[0], _stamp(rest), refs, _targets(rest) if targets else [])


def source_of(entry_path: str, idx: str) -> str | None:
    """The source file numba's in-tree locator stamped index `idx` of the `__pycache__/` at `entry_path`
    with: `<the directory holding __pycache__>/<modname>.py` (or a script without the suffix: numba's
    modname is the file's name less its extension), the index being named
    `<modname>.<qualname>-<line>.py<XY><abiflags>.nbi`. None for another entry (NUMBA_CACHE_DIR's or the
    user-wide `<dir name>_<sha1 of its path>/`: the path cannot be found from the entry). A modname with
    dots in it is told from the qualname by the file that is there; none there: the first `.py`."""
    m = re.fullmatch(r"(.+)-\d+\.py\d+[a-z]*\.nbi", idx)
    if os.path.basename(entry_path) != "__pycache__" or m is None or "." not in m.group(1):
        return None
    parts = m.group(1).split(".")
    where = os.path.dirname(entry_path)
    found = [os.path.join(where, ".".join(parts[:i]) + ext) for i in range(1, len(parts)) for ext in (".py", "")]
    return next((f for f in found if os.path.lexists(f)), found[0])


def _source_digest(src: str) -> bytes | None:
    """The sha256 of the source file `src`, as numba stamps it; None when it is not judged: a symlink
    (numba follows it; kcache, maybe root over another user's project, opens nothing a link names: a
    /proc file reads without end, /proc/kmsg gives up the kernel's messages), not a regular file, not
    readable, or above MAX_SOURCE bytes read (counted as read: a file may grow while it is read)."""
    try:
        fd, _ = fsread.open_regular(src)  # the last component never followed, a FIFO never blocks
    except OSError:
        return None
    h, left = hashlib.sha256(), MAX_SOURCE
    try:
        for chunk in fsread.chunks_of(fd):
            left -= len(chunk)
            if left < 0:
                return None
            h.update(chunk)
    except OSError:
        return None
    return h.digest()


def source_problem(src: str, idx: str, stamp: bytes | tuple[float, int], hashes: dict[str, bytes | None]
                   ) -> str | None:
    """Why numba's stamp of `src` now differs from the `stamp` index `idx` records (numba then misses
    every overload it names), or None: the same, or not judged (_source_digest). `hashes` keeps each
    file's sha256 for one judgement."""
    shown = f"{os.path.basename(src)} beside __pycache__/"
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        return f"its source {shown} is gone: no numba call uses {idx}"
    except OSError:
        return None
    if isinstance(stamp, tuple):
        if stat.S_ISLNK(st.st_mode) or (st.st_mtime, st.st_size) == stamp:
            return None
        return f"{shown} has another mtime or size than {idx} records: numba compiles every overload again"
    if src not in hashes:
        hashes[src] = _source_digest(src)
    if hashes[src] in (None, stamp):
        return None
    return (f"{shown} changed since {idx} was written (numba compares its sha256): numba compiles every "
            "overload again")


ONLY_TEMP = "only temp files of an interrupted numba write (.tmp.<hex>): no numba call reads them"


def leftover(entry: Entry) -> Leftover | None:
    """A directory holding nothing but numba's temp files (its first write was killed)."""
    if entry.layout != NAME or entry.reason != ONLY_TEMP:
        return None
    return Leftover(TEMP, "temp files of an interrupted numba write", None)


def inner_leftovers(entry: Entry) -> list[InnerLeftover]:
    """The temp files of killed writes in an entry that stays, untouched for an hour."""
    if entry.layout != NAME or entry.reason == ONLY_TEMP:
        return []
    now, out = time.time(), []
    try:
        temps = fsread.scandir_list(entry.path, lambda de: bool(TEMP_FILE.match(de.name))
                                    and de.is_file(follow_symlinks=False))
    except OSError:
        return []
    for de in sorted(temps, key=lambda d: d.name):
        if now - de.stat(follow_symlinks=False).st_mtime >= STALE_AFTER:
            out.append(InnerLeftover(de.name, f"numba temp file {de.name} left by a killed write",
                                     f"{de.name} kept: written to less than an hour ago", TEMP))
    return out


_SEVERITY = {UNREADABLE: 4, CORRUPT: 3, PARTIAL: 2, STALE: 1}  # unreadable: never removed for one file


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    """Every index judged (one module's edited source must not hide another's corrupt index): the entry
    is corrupt or partial when one index is; stale only when every index is (numba compiles again only
    the functions of the stale ones: the others still hit, and `prune --stale` must not take them)."""
    return _whole(_index_verdicts(d, jc))


def _index_verdicts(d: EntryDir, jc: Judging) -> dict[str, Judgement] | None:
    """Each index of the entry -> what numba does with it and the data files it names; None when the
    directory cannot be listed."""
    try:
        names, _ = d.files()
    except OSError:
        return None
    hashes: dict[str, bytes | None] = {}
    return {idx: _index_verdict(d, idx, names, jc, hashes) for idx in sorted(n for n in names if n.endswith(INDEX))}


def _whole(verdicts: dict[str, Judgement] | None) -> Judgement:
    """The entry's status from its indexes' (None: unreadable)."""
    if verdicts is None:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    worst = max(verdicts.values(), key=lambda v: _SEVERITY.get(v.status, 0), default=Judgement(COMPLETE))
    if worst.status == STALE and any(v.status != STALE for v in verdicts.values()):
        return Judgement(COMPLETE)
    return worst


def _index_verdict(d: EntryDir, idx: str, names, jc: Judging, hashes: dict[str, bytes | None]) -> Judgement:
    """What numba does with the index `idx` and the data files it names. One of them a symlink, FIFO,
    device or socket: numba opens it, kcache never does (checks.not_regular): unreadable, in ls too."""
    odd = first_not_regular(d, (idx,), "numba")
    if odd:
        return Judgement.of(UNREADABLE, odd)
    try:
        index = read_index(d.read_bytes(idx, MAX_INDEX), targets=False)
    except (ValueError, OSError, IndexError) as exc:
        return Judgement.of(CORRUPT, f"{idx} is not a whole index ({exc}): numba's call raises on it")
    if jc.version and index.version != jc.version:  # ignored whole: its data files are never read
        return Judgement.of(STALE, f"{idx} was written by numba {index.version}: numba {jc.version} ignores "
                                   "it and compiles again")
    src = source_of(d.path, idx)
    why = source_problem(src, idx, index.stamp, hashes) if src and index.stamp is not None else None
    if why:
        return Judgement.of(STALE, why)
    gone = [r for r in index.refs if r not in names]
    if gone:
        return Judgement.of(PARTIAL, f"{idx} names {gone[0]}, which is gone: numba compiles that overload again")
    odd = first_not_regular(d, index.refs, "numba")
    if odd:
        return Judgement.of(UNREADABLE, odd)
    bad = next((r for r in index.refs if not _whole_pickle(d, r)), None) if jc.deep else None
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
            if not names or not (numba_files(names) or temp_files(names)):
                continue
            j = judge(d, KIND, jc) if numba_files(names) else Judgement.of(PARTIAL, ONLY_TEMP)
        yield ctx.entry(path=de.path, usage=usage, layout=NAME, kind=KIND, target="cpu", space=None, op=None,
                        hash=de.name, status=j.status, reason=j.reason)


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    if kind != KIND or "/" in relpath or not NUMBA.kinds[0].fits(relpath):
        return f"{relpath!r} is not where numba's cache of a source directory lies"
    if names is not None:
        if not (numba_files(names) or temp_files(names)):
            return "it holds no numba cache file (.nbi, .nbc)"
        other = sorted(n for n in names if not (n.endswith((INDEX, DATA)) or TEMP_FILE.match(n)))
        if other:
            return f"it holds other files too ({other[0]}): kcache removes only numba's own directories"
    return None


def describe(root: Path, entry: Entry) -> Details:
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        verdicts = _index_verdicts(d, Judging(deep=True, version=installed_version()))
        j = _whole(verdicts)
        try:
            names = d.names()
            versions = sorted({read_index(d.read_bytes(n, MAX_INDEX)).version for n in names if n.endswith(INDEX)})
        except (OSError, ValueError, IndexError):
            names, versions = [], []
    facts = [("indexes", str(sum(n.endswith(INDEX) for n in names))), *_stale_indexes(verdicts or {}, j),
             ("overloads", str(sum(n.endswith(DATA) for n in names))),
             ("numba version", ", ".join(versions) or "unknown"),
             ("reused", "only beside a source file of the same bytes (the index holds their sha256; numba 0.67 "
                        "and older: its mtime and size), by the same numba and Python, on the same CPU")]
    return Details(entry, j.status, j.reason, j.problems, list_files(entry.path), facts=tuple(facts))


def _stale_indexes(verdicts: dict[str, Judgement], whole: Judgement) -> list[tuple[str, str]]:
    """The fact naming the stale indexes of a complete entry (a source edited since, a function moved to
    another line: numba writes a new index beside the old one and never reads the old again), which its
    status does not show: the entry stays complete while one index hits."""
    dead = [idx for idx, v in verdicts.items() if v.status == STALE]
    if whole.status != COMPLETE or not dead:
        return []
    first = verdicts[dead[0]].reason or ""
    more = f" (and {len(dead) - 1} more)" if len(dead) > 1 else ""
    return [("stale indexes", f"{len(dead)}: {first}{more}; they and their .nbc files stay while the "
                              "directory's other indexes are used")]


def no_log(entry: Entry) -> str:
    return "numba keeps no compile log in its cache (NUMBA_DEBUG_CACHE=1 prints what it loads and saves)"


# ---- will numba here use it (kcache explain) ------------------------------------------------------------

PACKAGE = "numba"
# numba's config: the CPU its overload keys name (else LLVM's host CPU and features), and no JIT at all
ENV_SWITCHES = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_DISABLE_JIT")


def _indexes(root: Path, entry: Entry) -> dict[str, Index]:
    """The entry's indexes that read whole (the judgement says what is wrong with the others)."""
    out = {}
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        try:
            names = d.names()
        except OSError:
            names = []
        for name in sorted(n for n in names if n.endswith(INDEX)):
            try:
                out[name] = read_index(d.read_bytes(name, MAX_INDEX))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _python(name: str) -> str | None:
    """The Python an index was written for, from its name (`.py311.nbi`: 3.11), or None."""
    m = re.search(r"\.py(\d)(\d+)[a-z]*\.nbi$", name)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _number(value: str) -> int:
    """A switch's value as numba's config reads an int one (one it cannot parse is its default, 0)."""
    try:
        return int(value)
    except ValueError:
        return 0


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """numba uses an index only when its own version wrote it for its own Python (the index's name), with
    the source stamp it records (judged for a `__pycache__/`), and an overload only for the CPU its key
    holds, which kcache does not ask here (but NUMBA_CPU_NAME/NUMBA_CPU_FEATURES set here): never a hit."""
    if (not_asked := unasked(here)) is not None:
        return not_asked
    indexes = _indexes(root, entry)
    versions = ", ".join(sorted({i.version for i in indexes.values()})) or None
    have = here.versions.get(PACKAGE)
    if have is None:
        return not_installed("numba", PACKAGE, versions)
    off = here.env.get("NUMBA_DISABLE_JIT", "0")
    if _number(off):
        return Verdict(MISS, "NUMBA_DISABLE_JIT is set here: numba compiles and loads nothing", "NUMBA_DISABLE_JIT",
                       None, off)
    if indexes and all(i.version != have for i in indexes.values()):
        return Verdict(MISS, f"numba {have} ignores an index another numba wrote and compiles again",
                       "numba version", versions, have)
    py = ".".join((here.python or "").split(".")[:2])
    pythons = sorted({p for p in map(_python, indexes) if p})
    if pythons and py not in pythons:
        return Verdict(MISS, f"numba on Python {py} reads only indexes named .py{py.replace('.', '')}.nbi",
                       "python version", ", ".join(pythons), py)
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True, version=have))
    if j.status != COMPLETE:
        return Verdict(MISS, f"numba {have} does not use a {j.status} entry: {j.reason}", "status", j.status,
                       COMPLETE)
    return _cpu_verdict(list(indexes.values()), here, f"numba {have} and Python {py} as recorded, the entry complete")


def _short(features: str) -> str:
    return "none" if not features else features if len(features) <= 60 else features[:57] + "..."


def _cpu_verdict(indexes: list[Index], here: Here, said: str) -> Verdict:
    """Each overload's key holds the CPU it was compiled for (target triple, CPU name, features): a miss
    when NUMBA_CPU_NAME or NUMBA_CPU_FEATURES set here names another for every overload, else unknown."""
    targets = [t for i in indexes for t in i.targets]
    every = bool(targets) and len(targets) == sum(len(i.refs) for i in indexes)
    name = here.env.get("NUMBA_CPU_NAME")  # numba's config: the features then default to none for "generic"
    features = here.env.get("NUMBA_CPU_FEATURES", "" if name is not None and name.lower() == "generic" else None)
    if every and not any(name in (None, t.cpu) and features in (None, t.features) for t in targets):
        if name is not None and all(t.cpu != name for t in targets):
            return Verdict(MISS, f"NUMBA_CPU_NAME is set here: numba compiles for {name!r} and looks up no other "
                           "CPU", "CPU name", ", ".join(sorted({t.cpu for t in targets})), name)
        return Verdict(MISS, "numba here compiles with other CPU features (NUMBA_CPU_FEATURES, or none for the "
                       "generic CPU) than any overload's key holds", "CPU features",
                       ", ".join(sorted({_short(t.features) for t in targets})), _short(features or ""))
    cpus = ", ".join(sorted({f"{t.triple} {t.cpu}" for t in targets})) or "not read"
    return Verdict(UNKNOWN, f"{said}; each overload's key also holds the CPU it was compiled for ({cpus}, and its "
                   "features), which kcache does not ask here")


class NumbaLayout(Layout):
    shape = NUMBA
    hidden_names = True  # the cache of a hidden source directory: `.<dir name>_<sha1>/`
    fact_files = ()
    binary_kinds = frozenset({KIND})
    packages = (PACKAGE,)
    env_switches = ENV_SWITCHES

    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    leftover = staticmethod(leftover)
    inner_leftovers = staticmethod(inner_leftovers)

    def judging(self, deep: bool = False, *, statuses: bool = True, caller_reads: bool = False) -> Judging:
        """Goes by the installed numba's version (looked up once, here), when one is installed."""
        return Judging(deep, version=installed_version() if statuses else "", caller_reads=caller_reads)

    judge = staticmethod(judge)
    describe = staticmethod(describe)
    no_log = staticmethod(no_log)
    explain = staticmethod(explain)


LAYOUT = NumbaLayout()
