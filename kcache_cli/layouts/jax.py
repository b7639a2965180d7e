"""JAX's persistent compilation cache (jax_compilation_cache_dir / JAX_COMPILATION_CACHE_DIR; jax 0.10's
jax/_src/lru_cache.py and compilation_cache.py).

The cache is one flat directory: `<name>-<sha256>-cache` per compiled executable (its compile time, 4
bytes big-endian, and the serialized executable, zstd- or zlib-compressed) and, when a size cap
(jax_compilation_cache_max_size) is set, a `<key>-atime` sidecar holding the last read in ns (8 bytes,
little-endian) and a `.lockfile` (filelock's flock) taken around every read and write.

kcache's entries are directories, so the JAX cache is one entry, listed from its parent (the layout's
root), as the CUDA driver's JIT cache is; it is removed only whole (every `-cache` with its `-atime`).
There is no default place: jax keeps no persistent cache unless the directory is configured, so
`dir --all` shows one only when JAX_COMPILATION_CACHE_DIR is set. What jax does with it:
- a `-cache` without its `-atime` in a capped cache: jax's eviction reads every sidecar before a write
  and fails on the missing one, so no new executable is written any more (jax#39880): partial.
- a `-cache` that does not decompress (cut short, emptied): jax warns, compiles again and never
  replaces it (put keeps an existing key): corrupt (deep: every file decompressed).
- a file that is a FIFO, device, socket or symlink: jax opens it (a FIFO blocks it), kcache never does:
  unreadable, never removed for it (checks.not_regular).
- a `-cache` or `-atime` that is a directory: jax's read of that key raises IsADirectoryError (a miss
  every time, warned) and put never replaces it; an `-atime` one also fails the eviction before every
  write (measured: jax 0.10.2): corrupt.
- an `-atime` whose `-cache` is gone: ignored by jax (eviction walks the `-cache` files): an orphan,
  counted in inspect's facts and removed with the cache.
Moving it: the key covers jax, jaxlib, the backend, the devices and the compile options, and the compile
options name files inside the cache directory (XLA's xla_gpu_kernel_cache_file and per-fusion autotune
cache dir, set by jax/_src/compiler.py even on CPU): a copy hits only at the same absolute path, with the
same jax and devices; anywhere else every key misses (measured: 0 hits in a copy, all hits in place).
The executables hold those options, so kcache reads where each was built (zlib; zstd when zstandard is
installed; the first MiB of each, smallest first, until one may hit here): moved when none was built for
this path (jax misses every key; import says so), complete when some were (jax ran in the copy and wrote
keys for its new path beside the copied ones; inspect counts the others, which jax never uses here and
which go only with the whole cache). Export and import carry it whole.
JAX documents the cache as trusted code (an executable is run as it is read), so an archive
of it must come from someone trusted.
"""

from __future__ import annotations

import os
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import Iterator

from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.fs.locking import probe_locked
from kcache_cli.layouts._common import leads_here
from kcache_cli.layouts.base import MISS, UNKNOWN, Here, Judging, Layout, ScanContext, Verdict, not_installed, unasked
from kcache_cli.layouts.shapes import JAX
from kcache_cli.model.checks import first_not_regular, list_files
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    CORRUPT,
    MOVED,
    PARTIAL,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    ScanFilter,
    measure_tree,
)

NAME = JAX.name
KIND = "compile_cache"
PACKAGE = "jax"
CACHE, LOCKFILE = "-cache", ".lockfile"  # and "<key>-atime", the sidecar (KEY)
# What XLA keeps beside the keys when jax points its GPU kernel and autotune caches into the directory.
XLA_FILES = (LOCKFILE, "xla_gpu_kernel_cache_file", "xla_gpu_per_fusion_autotune_cache_dir")
# <module name>-<sha256>: jax's module name keeps \w, "." and "-" of the function's name (mlir.sanitize_name).
# \Z, not $ (which also matches before a final newline): jax's glob `*-cache` never matches such a name.
KEY = re.compile(r"^(?P<key>[\w.-]+-[0-9a-f]{64})(?P<suffix>-cache|-atime)\Z")
MAX_EXECUTABLE = 4 << 30  # bytes a decompressed executable may take while it is checked


def configured_dir() -> Path | None:
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return Path(os.path.abspath(os.path.expanduser(env))) if env else None


def keys(names: list[str] | dict[str, int]) -> tuple[set[str], set[str]]:
    """(keys with a -cache file, keys with an -atime file) among a cache directory's names."""
    caches: set[str] = set()
    atimes: set[str] = set()
    for n in names:
        m = KEY.match(n)
        if m:
            (caches if m.group("suffix") == CACHE else atimes).add(m.group("key"))
    return caches, atimes


def is_cache_dir(path: str) -> bool:
    """JAX_COMPILATION_CACHE_DIR, or a directory that holds `-cache` files and nothing but jax's and XLA's
    names."""
    here = configured_dir()
    if here is not None and os.path.abspath(path) == str(here):
        return True
    try:
        names = fsread.listdir(path)
    except OSError:
        return False
    caches, _ = keys(names)
    return bool(caches) and all(n in XLA_FILES or KEY.match(n) for n in names)


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    try:
        names, _ = d.files()
    except OSError:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    if LOCKFILE in names and probe_locked(os.path.join(d.path, LOCKFILE)):  # a write's -cache before its -atime
        return Judgement.of(BUILDING, f"jax holds the cache's {LOCKFILE} (writing)")
    odd = first_not_regular(d, names, "jax")
    if odd:  # a FIFO, device or link among its files: not judged, and the cache is never removed for it
        return Judgement.of(UNREADABLE, odd)
    folder = _key_folder(d)
    if folder:
        return Judgement.of(CORRUPT, folder)
    caches, atimes = keys(names)
    if atimes or LOCKFILE in names:  # a size cap is in use: eviction reads every sidecar
        bare = sorted(caches - atimes)
        if bare:
            more = f" (and {len(bare) - 1} more)" if len(bare) > 1 else ""
            return Judgement.of(PARTIAL, f"{bare[0]}-cache has no -atime sidecar{more}: jax's eviction fails on "
                                         "it, so nothing new is written to this cache")
    empty = sorted(k for k in caches if names.get(k + CACHE, 0) <= 4)
    if empty:
        return Judgement.of(CORRUPT, f"{empty[0]}-cache holds no executable: jax compiles it again every time")
    if jc.deep:
        for k in sorted(caches):
            bad = _undecodable(d, k + CACHE)
            if bad:
                return Judgement.of(CORRUPT, f"{bad}: jax compiles it again every time and never replaces it")
    recorded = moved_from(d, caches, names)
    return Judgement.of(MOVED, moved_reason(recorded)) if recorded is not None else Judgement(COMPLETE)


def _key_folder(d: EntryDir) -> str | None:
    """Why a directory named as a key's file breaks the cache (jax's read_bytes and write_bytes of it raise
    IsADirectoryError, and put keeps a key whose -cache exists), or None when there is none."""
    name = next((n for n in d.subdirs() if KEY.match(n)), None)
    if name is None:
        return None
    also = ", and its eviction fails on it, so nothing new is written" if name.endswith("-atime") else ""
    return f"{name} is a directory: jax's read of that key fails, so it misses it every time, never replacing it{also}"


def moved_from(d: EntryDir, caches: set[str], names: dict[str, int]) -> str | None:
    """Where the cache's executables were compiled (the path most name) when none of them was compiled
    for this directory, so jax misses every key here (moved); None when one may hit."""
    foreign, usable = built_elsewhere(d, caches, names, every=False)
    return Counter(foreign.values()).most_common(1)[0][0] if foreign and not usable else None


AUTOTUNE = b"/xla_gpu_per_fusion_autotune_cache_dir"
# How much of an executable is inflated to find it: the compile options follow the HLO module (1 to 10 kB
# in for small functions), and `ls` must not inflate a 4 GiB bomb to look. Not found there: no verdict of
# moved (none is guessed). The first _LOOK bytes inflate from at most _READ of the file (a stored block,
# incompressible, grows by a few bytes in 16 kB), so no more of it is read.
_LOOK = 1 << 20
_READ = _LOOK + (64 << 10)


def built_elsewhere(d: EntryDir, caches: set[str], names: dict[str, int], every: bool = True
                    ) -> tuple[dict[str, str], int]:
    """({`-cache` file: the cache directory it was compiled for} of those compiled for another path than
    this one, which jax never uses here; how many may hit here: compiled for this path or one that leads
    to it (a link: jax configured with it hits), or where they were compiled not read). Smallest first;
    without `every`, the first that may hit here ends the walk (a directory jax hits is not moved, ls needs
    no more), so a cache in place reads one file."""
    here = os.path.abspath(d.path)
    foreign: dict[str, str] = {}
    usable = 0
    for k in sorted(caches, key=lambda k: (names[k + CACHE], k)):
        recorded = built_in(d, k + CACHE)
        if recorded is None or recorded == here or leads_here(d, k + CACHE, os.path.join(recorded, k + CACHE)):
            usable += 1
            if not every:
                break
        else:
            foreign[k + CACHE] = recorded
    return foreign, usable


def moved_reason(recorded: str) -> str:
    return (f"built in {recorded}: jax hashes that path (XLA's autotune cache dir in the compile options) into "
            "every key, so it misses every one here")


def built_in(d: EntryDir, name: str) -> str | None:
    """The cache directory the executable `name` was compiled for (jax/_src/compiler.py puts
    <cache dir>/xla_gpu_per_fusion_autotune_cache_dir into the compile options the executable holds and
    cache_key.py hashes), or None when it is not read (zstd without zstandard, not found)."""
    try:
        data = d.read_bytes(name, _READ, strict=False)
    except OSError:
        return None
    raw = _inflated(data) or _inflated(data[4:])
    at = raw.find(AUTOTUNE) if raw else -1
    if raw is None or at < 0:
        return None
    end = at + len(AUTOTUNE)
    for start in range(at, max(0, at - 4096), -1):
        if raw[start:start + 1] == b"/" and _string_at(raw, start, end - start):
            return raw[start:at].decode("utf-8", "replace")
    return None


def _string_at(raw: bytes, start: int, n: int) -> bool:
    """Whether a protobuf string of `n` bytes starts at `start`: its length before it (a 1 or 2 byte varint)
    and before that the field's tag, two bytes of wire type 2 (xla_gpu_per_fusion_autotune_cache_dir is
    DebugOptions field 310: b2 13). A "/" inside the path preceded by a byte that equals the rest's length
    (/tmp's "p", 112) has no such tag before it: a path's bytes never have the high bit a two-byte tag's
    first byte has (a one-byte tag was taken too, and "b" before "d/r" of /tmp/tmp...bd/r was one)."""
    size = 1 if n < 128 else 2
    length = bytes([n]) if n < 128 else bytes([(n & 0x7F) | 0x80, n >> 7])
    tag = start - size - 1  # the tag's last byte
    if tag < 1 or raw[tag + 1:start] != length or raw[tag] & 0x80:
        return False
    return raw[tag - 1] & 0x87 == 0x82


def _inflated(data: bytes) -> bytes | None:
    try:
        if data[:4] == b"\x28\xb5\x2f\xfd":
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(data) as reader:  # bounded, as zlib's below
                return reader.read(_LOOK)
        out = zlib.decompressobj()
        return out.decompress(data, _LOOK)
    except Exception:  # zstd's own error, unknown until imported; zlib's; a missing zstandard
        return None


def landed_elsewhere(path: str) -> str | None:
    """What import says of a cache it published at `path` whose executables were compiled for another."""
    try:
        with EntryDir.open(path) as d:
            j = judge(d, KIND, Judging())
    except OSError:
        return None
    return f"{j.reason} (kcache cannot rewrite a key; `kcache ls` shows it moved)" if j.status == MOVED else None


def _undecodable(d: EntryDir, name: str) -> str | None:
    """Why the `-cache` file does not decompress as jax wrote it (zstd or zlib), or None."""
    data = d.read_bytes(name, MAX_EXECUTABLE)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        try:
            import zstandard  # kcache's own optional dependency; jax uses it (or Python 3.14's) when present
        except ImportError:
            return None  # cannot tell here: not judged
        try:
            zstandard.ZstdDecompressor().decompressobj().decompress(data)
            return None
        except zstandard.ZstdError as exc:
            return f"{name} does not decompress ({exc})"
    try:
        out = zlib.decompressobj()
        out.decompress(data, MAX_EXECUTABLE)
        return None if out.eof else f"{name} is cut short"
    except zlib.error as exc:
        return f"{name} does not decompress ({exc})"


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    if not (flt.wants_target("cpu") or flt.wants_target("cuda")) or flt.spaces or flt.ops:
        return
    prefixes = flt.name_prefixes()
    for de in ctx.listdir(ctx.root):
        if not de.is_dir(follow_symlinks=False) or JAX.kinds[0].match_segment(0, de.name) is None:
            continue
        if (prefixes and not any(de.name.startswith(p) for p in prefixes)) or not is_cache_dir(de.path):
            continue
        with ctx.open_entry(de.path) as d:
            j = judge(d, KIND, Judging())
        yield ctx.entry(path=de.path, usage=measure_tree(de.path, ctx.warn), layout=NAME, kind=KIND, target=None,
                        space=None, op=None, hash=de.name, status=j.status, reason=j.reason)


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    if kind != KIND or "/" in relpath:
        return f"{relpath!r} is not a JAX compilation cache"
    if root is not None and not is_cache_dir(os.path.join(root, relpath)):
        return "it is not a JAX compilation cache (files other than jax's -cache, -atime and .lockfile)"
    return None


def describe(root: Path, entry: Entry) -> Details:
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
        try:
            names, _ = d.files()
        except OSError:
            names = {}
        caches, atimes = keys(names)
        foreign, _ = built_elsewhere(d, caches, names)
    facts = [("executables", str(len(caches))),
             *_foreign_fact(foreign, len(caches)),
             ("size cap", "in use (-atime sidecars)" if atimes else "none seen (no -atime sidecars)"),
             ("orphan -atime files", f"{len(atimes - caches)}: ignored by jax, removed with the cache"),
             ("reused", "only at this path: jax hashes the cache directory's path into every key"),
             ("trust", "JAX runs the executables it reads: import a cache only from someone you trust")]
    return Details(entry, j.status, j.reason, j.problems, list_files(entry.path), facts=tuple(facts))


def _foreign_fact(foreign: dict[str, str], total: int) -> list[tuple[str, str]]:
    """The fact counting the executables compiled for another cache directory (none when there is none)."""
    if not foreign:
        return []
    paths = Counter(foreign.values()).most_common()
    more = f" and {len(paths) - 1} other paths" if len(paths) > 1 else ""
    return [("built elsewhere", f"{len(foreign)} of {total} executables, compiled for {paths[0][0]}{more}: jax "
             "never uses them here, and they go only with the whole cache")]


def explain(root: Path, entry: Entry, here: Here) -> Verdict:
    """jax reads the cache only where it is installed, and hits a key only at the path the executable was
    compiled for (judged as ls does: moved is a miss); the key also hashes jax's and jaxlib's versions, the
    backend, the devices and the compile options, which no file records in a form kcache can compare (a
    sha256): never a hit."""
    if (not_asked := unasked(here)) is not None:
        return not_asked
    have = here.versions.get(PACKAGE)
    if have is None:
        return not_installed("jax", PACKAGE, why=": nothing reads the cache")
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
        names = d.files()[0] if j.status == MOVED else {}
        recorded = moved_from(d, keys(names)[0], names) if names else None
    if j.status == MOVED:
        return Verdict(MISS, f"jax {have}: {j.reason}", "cache directory", recorded, os.path.abspath(entry.path))
    if j.status == UNREADABLE:
        return Verdict(MISS, f"jax {have} cannot read it: {j.reason}", "status", UNREADABLE, COMPLETE)
    said = f"{j.status} ({j.reason})" if j.reason else "complete (not moved)"
    return Verdict(UNKNOWN, f"jax {have} here, the cache {said}; each key also hashes jax's and jaxlib's "
                   "versions, the backend, the devices and the compile options, which kcache cannot compare")


def no_log(entry: Entry) -> str:
    return "jax keeps no compile log in its compilation cache (JAX_LOG_COMPILES=1 prints one)"


class JaxLayout(Layout):
    shape = JAX
    fact_files = ()
    packages = (PACKAGE, "jaxlib")
    binary_kinds = frozenset({KIND})
    writer_locks = (LOCKFILE,)  # filelock's flock, held by jax around each read and write

    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    judge = staticmethod(judge)
    describe = staticmethod(describe)
    no_log = staticmethod(no_log)
    landed_elsewhere = staticmethod(landed_elsewhere)
    explain = staticmethod(explain)


LAYOUT = JaxLayout()
