"""The CUDA driver's JIT cache: PTX the driver compiled for the GPU at hand (CUDA_CACHE_PATH, else
~/.nv/ComputeCache; size cap CUDA_CACHE_MAXSIZE, 256 MiB by default since CUDA 10.1 per NVIDIA's CUDA
environment variable documentation).

Its format is undocumented (an `index` file beside hex-named directories), so kcache treats the whole
directory as one opaque entry: its size, its file count, its size against the cap. It is listed from
its parent directory (the layout's root), because an entry is a directory inside a root. kcache never
removes a file of it: only the whole directory, and only while no process of the cache's owner has
the CUDA driver (libcuda.so) mapped (/proc/<pid>/maps), since the driver keeps the index open and
rewrites it. A file in it that is a symlink, FIFO, device or socket (the driver opens it, a FIFO blocks
it; kcache never does: checks.not_regular) makes it unreadable, in ls and verify alike, never removed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts.base import Judging, Layout, ScanContext
from kcache_cli.layouts.shapes import CUDAJIT, cudajit_evidence, cudajit_names
from kcache_cli.model.checks import list_files, not_regular, read_every_byte
from kcache_cli.model.records import (
    COMPLETE,
    UNREADABLE,
    UNREADABLE_REASON,
    Details,
    Entry,
    Judgement,
    ScanFilter,
    measure_tree,
)
from kcache_cli.util.units import is_digits

NAME = CUDAJIT.name
KIND = "jit"
DEFAULT_MAXSIZE = 256 << 20  # bytes, NVIDIA's default for CUDA_CACHE_MAXSIZE
HARD_MAXSIZE = 4 << 30  # the driver caps CUDA_CACHE_MAXSIZE at 4 GiB
DRIVER = b"/libcuda.so"
MAPS_LIMIT = 64 << 20


def configured_dir() -> Path:
    """The JIT cache directory the driver uses for this environment."""
    env = os.environ.get("CUDA_CACHE_PATH")
    return Path(env).expanduser() if env else Path.home() / ".nv" / "ComputeCache"


def max_size() -> tuple[int, str]:
    """(the cap in bytes, where it comes from)."""
    raw = os.environ.get("CUDA_CACHE_MAXSIZE", "")
    if is_digits(raw.strip()):
        return min(int(raw), HARD_MAXSIZE), "CUDA_CACHE_MAXSIZE"
    return DEFAULT_MAXSIZE, "NVIDIA's default (CUDA_CACHE_MAXSIZE unset)"


def is_jit_dir(path: str) -> bool:
    """The driver's JIT cache: the directory CUDA_CACHE_PATH (or the default) names, or one named like
    it (ComputeCache) holding the driver's `index` file beside hex-named directories."""
    if os.path.abspath(path) == os.path.abspath(configured_dir()):
        return True
    return os.path.basename(path) in cudajit_names() and cudajit_evidence(path)


def detect(root: Path) -> bool:
    return any(fsread.is_dir(os.path.join(root, n)) and is_jit_dir(os.path.join(root, n)) for n in cudajit_names())


def judge(d: EntryDir, kind: str, jc: Judging) -> Judgement:
    """Complete when its directory (held as `d`) can be read (deep: every file); kcache cannot judge more.
    A file in it that is a symlink, FIFO, device or socket (in ls too) leaves it unreadable."""
    try:
        d.files()
    except OSError:
        return Judgement.of(UNREADABLE, UNREADABLE_REASON)
    odd = _not_regular(d)
    if odd:
        return Judgement.of(UNREADABLE, odd)
    if jc.deep:
        bad = read_every_byte(d, jc.caller_reads)
        if bad:
            return Judgement.of(UNREADABLE, bad)
    return Judgement(COMPLETE)


def _not_regular(d: EntryDir) -> str | None:
    """checks.not_regular's reason for the first file anywhere in the tree (no link followed) that is not a
    regular file: the driver opens what it finds there, kcache never does."""
    try:
        return next((why for rel, st, _ in d.walk_files() if (why := not_regular(rel, st.st_mode, "the driver"))),
                    None)
    except OSError:  # TreeTooDeep, or gone: the deep read says so
        return None


def scan(ctx: ScanContext, flt: ScanFilter) -> Iterator[Entry]:
    if not flt.wants_target("cuda") or flt.spaces or flt.ops:
        return
    prefixes = flt.name_prefixes()
    for de in ctx.listdir(ctx.root, lambda d: d.name in cudajit_names()):
        if not de.is_dir(follow_symlinks=False) or not is_jit_dir(de.path):
            continue
        if prefixes and not any(de.name.startswith(p) for p in prefixes):
            continue
        with ctx.open_entry(de.path) as d:
            j = judge(d, KIND, Judging())
        yield ctx.entry(path=de.path, usage=measure_tree(de.path, ctx.warn), layout=NAME, kind=KIND, target="cuda",
                        space=None, op=None, hash=de.name, status=j.status, reason=j.reason)


def shape_problem(relpath: str, kind: str, names: frozenset[str] | None, root: Path | None = None) -> str | None:
    if kind != KIND or "/" in relpath:
        return f"{relpath!r} is not the CUDA driver's JIT cache"
    if root is not None and not is_jit_dir(os.path.join(root, relpath)):
        return "it is not the CUDA driver's JIT cache (no index file, not CUDA_CACHE_PATH)"
    return None


def driver_users(uid: int) -> list[int]:
    """Pids of the processes of `uid` that have the CUDA driver (libcuda.so*) mapped."""
    out = []
    for name in os.listdir("/proc"):
        if not is_digits(name):
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            if _maps_driver(f"/proc/{name}/maps"):
                out.append(int(name))
        except OSError:
            continue  # gone, or not ours to read
    return sorted(out)


def _maps_driver(maps: str) -> bool:
    """Whether a /proc/<pid>/maps names libcuda.so (read in chunks, at most MAPS_LIMIT bytes)."""
    seen, tail = 0, b""
    with open(maps, "rb") as f:
        while seen < MAPS_LIMIT:
            chunk = f.read(1 << 16)
            if not chunk:
                return False
            if DRIVER in tail + chunk:
                return True
            seen, tail = seen + len(chunk), chunk[-len(DRIVER):]
    return False


def _owner(path: str) -> int:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return os.getuid()


def describe(root: Path, entry: Entry) -> Details:
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        j = judge(d, entry.kind, Judging(deep=True))
    cap, why = max_size()
    used = entry.apparent_size  # the driver caps the bytes of its files
    facts = [("size against the cap", f"{used} of {cap} bytes ({100 * used // max(cap, 1)}%, {why})"),
             ("format", "undocumented: kcache removes it only whole, never file by file")]
    users = driver_users(_owner(entry.path))
    if users:
        facts.append(("in use", f"processes with the CUDA driver loaded: {', '.join(map(str, users[:10]))}"))
    return Details(entry, j.status, j.reason, j.problems, list_files(entry.path), facts=tuple(facts))


def no_log(entry: Entry) -> str:
    return "the CUDA driver keeps no compile log in its JIT cache"


class CudaJitLayout(Layout):
    shape = CUDAJIT
    fact_files = ()
    binary_kinds = frozenset({KIND})

    detect = staticmethod(detect)
    shape_problem = staticmethod(shape_problem)
    scan = staticmethod(scan)
    judge = staticmethod(judge)
    describe = staticmethod(describe)
    no_log = staticmethod(no_log)

    def shown_path(self, root: Path) -> Path:
        """The JIT cache directory itself (CUDA_CACHE_PATH, else ComputeCache), not the root holding it."""
        configured = configured_dir()
        return configured if os.path.abspath(configured.parent) == os.path.abspath(root) else root / "ComputeCache"

    def in_use(self, entry: Entry) -> str | None:
        users = driver_users(_owner(entry.path))
        if users:
            return (f"the CUDA driver is loaded by process {users[0]}"
                    f"{f' and {len(users) - 1} more' if len(users) > 1 else ''}: removed only when none has it")
        return None


LAYOUT = CudaJitLayout()
