"""Export and import of cache entries as one verified archive (DESIGN.md §6).

An archive is a tar stream (plain, gzip or zstd). Its first member is `manifest.json`: the kcache
version and, per entry, its layout, kind, key fields (space, op, hash, path in the cache), each
file's size and sha256, each symlink's target, the empty lock files it had, and the compiler, arch
and platform where known. Then come the entries' directories, files and symlinks, named by their
path relative to the cache root (so `tar -tzf` shows where each lands).

Import is all or nothing for the archive: every member is checked against the manifest and its
sha256 while it is extracted into a staging directory inside the root (`.kcache/import-*`); only
when the whole archive has been read and found valid is anything published, entry by entry, each
with one rename under the entry's lock. A rejected archive leaves the cache as it was.

Links: a symlink must stay inside its own entry, except that a tilus script's `programs/<i>` and
`latency/<key>/<i>` links may point at `programs/<h12>` when that program is in the archive or
already in the cache. Lock files (`.lock`, `*.lock`, `*.t_lock`) are machine-local: they travel
as names in the manifest and come back as new empty files; a lock-file member is rejected.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol

from kcache_cli import __version__, state
from kcache_cli.errors import KcacheError, UsageError
from kcache_cli.model import BUILDING, COMPLETE, LAYOUT_NAMES, Entry, ScanFilter, Warn, iso, measure_tree

FORMAT = "kcache-archive"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
COMPRESSION_BY_SUFFIX = ((".tar.gz", "gz"), (".tgz", "gz"), (".tar.zst", "zst"), (".tzst", "zst"),
                         (".tar.zstd", "zst"), (".tar", "tar"))
BINARY_SUFFIXES = (".so", ".cubin", ".fatbin", ".o", ".a", ".hsaco", ".dylib", ".dll")
BIG_FILE = 32 << 20  # files above this are streamed instead of read whole
META_FILES = ("kcache.json", "compile.sh", "module/compile.sh", "nvcc_log.txt", "options.txt")
_META = frozenset(META_FILES)
_LOCK_NAME = re.compile(r"(^|/)(\.lock|[^/]*\.(t_)?lock)$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)$")
_HIDET_SPACE = re.compile(r"^[a-z0-9]+_space_\d+$")
_TILELANG_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+\-\w]*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# File names that need no closer look: ASCII, no component starting with '.', components of 1-255
# bytes, at most 16 deep; matched for all names of a manifest at once, one per line.
_SIMPLE = r"[\w+\-=,@%~][\w.+\-=,@%~]{0,254}(?:/[\w+\-=,@%~][\w.+\-=,@%~]{0,254}){0,15}"
_SIMPLE_NAMES = re.compile(rf"(?:{_SIMPLE}(?:\n{_SIMPLE})*)?", re.ASCII)
_SIMPLE_PATH = re.compile(_SIMPLE, re.ASCII)
_LOCK_LINE = re.compile(r"(?:^|/)(?:\.lock|[^/\n]*\.(?:t_)?lock)$", re.MULTILINE)
_HEX = re.compile(r"[0-9a-f]*")


class ArchiveRejected(KcacheError):
    """The archive breaks a rule: nothing of it is published (exit 1)."""


class Progress(Protocol):
    def start(self, total: int) -> None: ...

    def advance(self, n: int) -> None: ...


@dataclass(frozen=True)
class ImportLimits:
    """Bounds on what an archive may make kcache write (tar-bomb defences)."""

    max_member: int = 4 << 30  # one file
    max_total: int = 64 << 30  # all files together
    max_members: int = 5_000_000  # files, links and directories
    max_manifest: int = 256 << 20  # the manifest itself, held in memory


@dataclass(frozen=True)
class ExportedEntry:
    layout: str
    kind: str
    target: str | None
    space: str | None
    op: str | None
    hash: str
    relpath: str
    status: str
    files: int
    size: int
    compiler: str | None
    arch: str | None
    platform: str | None
    omitted: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExportResult:
    archive: str
    compression: str
    entries: tuple[ExportedEntry, ...]
    left_out: tuple[tuple[Entry, str], ...]
    files: int
    size: int
    archive_size: int
    sources_only: bool


@dataclass(frozen=True)
class ImportedEntry:
    layout: str
    kind: str
    target: str | None
    space: str | None
    op: str | None
    hash: str
    relpath: str
    action: str  # "import", "replace" or "skip"
    done: bool  # published (False for skips and in a dry run)
    reason: str | None
    files: int
    size: int
    arch: str | None
    compiler: str | None
    platform: str | None


@dataclass(frozen=True)
class ImportResult:
    archive: str
    root: str
    dry_run: bool
    kcache_version: str | None
    entries: tuple[ImportedEntry, ...]
    files: int  # files read and verified
    size: int  # bytes read and verified

    @property
    def published(self) -> tuple[ImportedEntry, ...]:
        return tuple(e for e in self.entries if e.done)


# ---- shared rules ------------------------------------------------------------------------------

def compression_for(path: str) -> str:
    """'tar', 'gz' or 'zst' from an archive's name."""
    low = path.lower()
    for suffix, kind in COMPRESSION_BY_SUFFIX:
        if low.endswith(suffix):
            return kind
    raise UsageError(f"cannot tell the archive format from '{os.path.basename(path)}': "
                     "name it .tar, .tar.gz (.tgz) or .tar.zst")


def is_lock_name(name: str) -> bool:
    return name.endswith("lock") and bool(_LOCK_NAME.search(name))


def is_binary_name(name: str) -> bool:
    return name.lower().endswith(BINARY_SUFFIXES)


def path_problem(name: object, what: str = "path") -> str | None:
    """Why `name` is not a safe relative path ('a/b/c'), or None."""
    if not isinstance(name, str) or not name:
        return f"empty or non-text {what}"
    if _CONTROL.search(name):
        return f"{what} {name!r} holds control characters"
    if name.startswith("/"):
        return f"absolute {what} {name!r}"
    if len(name.encode("utf-8", "surrogatepass")) > 4096:
        return f"{what} longer than 4096 bytes"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"{what} {name!r} has an empty, '.' or '..' component" if part != ".." else \
                f"{what} {name!r} goes up with '..'"
        if part == state.STATE_DIR:
            return f"{what} {name!r} lands in kcache's own {state.STATE_DIR}/"
        if len(part.encode("utf-8", "surrogatepass")) > 255:
            return f"{what} {name!r} has a component longer than 255 bytes"
    return None


def entry_path_problem(layout: str, kind: str, relpath: str) -> str | None:
    """Why `relpath` is not where an entry of this layout and kind lives, or None."""
    if _SIMPLE_PATH.fullmatch(relpath) is None:
        bad = path_problem(relpath, "entry path")
        if bad:
            return bad
        if any(p.startswith(".") for p in relpath.split("/")):
            return f"entry path {relpath!r} has a hidden component (temp, staging or state directory)"
    parts = relpath.split("/")
    n = len(parts)
    if layout == "hidet":
        ok = (kind == "op" and n == 4 and parts[0] == "ops" and _HIDET_SPACE.match(parts[1]) is not None) or \
             (kind == "graph" and n == 2 and parts[0] == "graphs") or \
             (kind == "ir_module" and n == 2 and parts[0] == "ir_modules")
    elif layout == "tilus":
        ok = (kind == "program" and n == 2 and parts[0] == "programs") or \
             (kind == "script" and n == 3 and parts[0] == "scripts")
    elif layout == "tilelang":
        ok = _TILELANG_VERSION.match(parts[0]) is not None and (
            (kind == "kernel" and n == 4 and parts[1] != "cuda-binaries" and parts[2] == "kernels") or
            (kind == "binary" and n == 3 and parts[1] == "cuda-binaries"))
    else:
        ok = _layout_path_ok(layout, kind, parts)
    return None if ok else f"{relpath!r} is not where a {layout} {kind} entry lives"


def _layout_path_ok(layout: str, kind: str, parts: list[str]) -> bool:
    """Where the layout's registered path shapes put an entry of `kind` (Layout.entry_path_problem)."""
    from kcache_cli.layouts import NAMES, get

    return layout in NAMES and get(layout).entry_path_problem(kind, "/".join(parts)) is None


def link_problem(layout: str, kind: str, relpath: str, name: str, target: object,
                 program_ok: Callable[[str], bool]) -> str | None:
    """Why the symlink `name` (inside the entry at `relpath`) -> `target` is not allowed, or None.

    Allowed: a relative target of the form ../../a/b that stays inside the entry; for a tilus
    script, also exactly `programs/<h>` at the root when `program_ok(h)`."""
    where = f"symlink {relpath}/{name} -> {target!r}"
    if not isinstance(target, str) or not target or "\0" in target or _CONTROL.search(target):
        return f"{where} has an empty or malformed target"
    if target.startswith("/"):
        return f"{where} is absolute"
    parts = target.split("/")
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    rest = parts[ups:]
    if not rest or any(p in ("", ".", "..") for p in rest):
        return f"{where} is not a plain relative path"
    base = (relpath + "/" + name).split("/")[:-1]
    if ups > len(base):
        return f"{where} points outside the cache"
    resolved = base[:len(base) - ups] + rest
    mine = relpath.split("/")
    if len(resolved) > len(mine) and resolved[:len(mine)] == mine:
        return None
    if (layout, kind) == ("tilus", "script") and len(resolved) == 2 and resolved[0] == "programs" \
            and not resolved[1].startswith(".") and program_ok(resolved[1]):
        return None
    if (layout, kind) == ("tilus", "script") and len(resolved) == 2 and resolved[0] == "programs":
        return f"{where} points to a tilus program that is neither in the archive nor in the cache"
    return f"{where} points outside its entry"


def archs_from_command(command: str) -> str | None:
    """CUDA archs from an nvcc command line: -gencode code=..., else -arch/--gpu-architecture."""
    found: list[str] = []
    for codes in re.findall(r"code=\[?([\w,]+)\]?", command):
        found.extend(c for c in codes.split(",") if _ARCH.match(c))
    if not found:
        for a in re.findall(r"(?:-arch|--gpu-architecture)[= ]+((?:sm|compute)_\d+[af]?)\b", command):
            found.append(a)
            if a.startswith("sm_"):  # nvcc -arch=sm_XY also embeds compute_XY PTX
                found.append("compute_" + a[3:])
    out = list(dict.fromkeys(found))
    return ",".join(out) or None


def cuda_archs(arch: str) -> list[tuple[str, tuple[int, int], str]]:
    """("sm" | "compute", (major, minor), "" | "a" | "f") for each CUDA arch named in "sm_90a,compute_90"."""
    parsed = []
    for item in arch.split(","):
        m = _ARCH.match(item.strip())
        if m:
            n = int(m.group(2))
            parsed.append((m.group(1), (n // 10, n % 10), m.group(3)))
    return parsed


def arch_runs_on(arch: str, caps: Iterable[tuple[int, int]]) -> bool | None:
    """Whether code built for `arch` ("sm_90a", "sm_80,compute_80") runs on any GPU of compute
    capability in `caps`; None when `arch` names no CUDA arch."""
    parsed = cuda_archs(arch)
    if not parsed:
        return None
    for cap in caps:
        for kind, cc, suffix in parsed:
            if suffix == "a":
                ok = cc == cap
            elif kind == "sm":  # SASS runs on the same major, same or newer minor
                ok = cc[0] == cap[0] and cc[1] <= cap[1]
            else:  # PTX is compiled by the driver for any newer GPU
                ok = cc <= cap
            if ok:
                return True
    return False


def local_compute_caps(timeout: float = 10.0) -> tuple[tuple[int, int], ...] | None:
    """Compute capabilities of this machine's GPUs from nvidia-smi; None when there is no GPU
    (or no nvidia-smi) to ask."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    caps = []
    for line in out.stdout.splitlines():
        m = re.match(r"^\s*(\d+)\.(\d+)\s*$", line)
        if m:
            caps.append((int(m.group(1)), int(m.group(2))))
    return tuple(caps) if out.returncode == 0 and caps else None


# ---- export --------------------------------------------------------------------------------------

PARALLEL_MIN_ENTRIES = 1000  # below this, forking workers costs more than it saves
ENTRIES_PER_PART = 500
MAX_PARTS = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a fifo never blocks


@dataclass
class ExportPlan:
    """What to export. Most of a big cache is hidet op directories: those are jobs
    (path, name, target, space, op) whose status is decided while they are read, in one pass;
    everything else was scanned already and comes as an Entry."""

    root: Path
    flt: ScanFilter
    sources_only: bool
    jobs: list  # tuple job or Entry, sorted by path
    left: list[tuple[Entry, str]]
    last_used: dict[str, float] = field(default_factory=dict)


def _leave_out(e: Entry, flt: ScanFilter, sources_only: bool) -> str | None:
    """Why a selected entry stays out of an archive, or None."""
    if entry_path_problem(e.layout, e.kind, e.relpath):
        return "a temp, staging or stray directory, not an entry"
    if e.status == BUILDING:
        return f"being built ({e.reason})"
    if not flt.statuses and e.status != COMPLETE:
        return f"{e.status}: {e.reason} (select it with --status {e.status})"
    if sources_only:
        from kcache_cli.layouts import get

        if e.kind in get(e.layout).binary_kinds:  # Layout.binary_kinds: useless without their binaries
            return "is of no use without its binaries (--sources-only)"
    return None


def plan_export(root: Path, flt: ScanFilter, warn: Warn | None = None, sources_only: bool = False) -> ExportPlan:
    """The entries `flt` selects for export. Without a --status filter only complete entries go;
    entries in flight never do. Programs that selected tilus scripts link to come along."""
    from kcache_cli.layouts import hidet
    from kcache_cli.scan import ScanContext, detect_layouts, scan_cache

    root = Path(root)
    if not root.is_dir():
        raise KcacheError(f"no cache at {root}")
    warn = warn or (lambda m: None)
    layouts = [n for n in detect_layouts(root) if not flt.layouts or n in flt.layouts]
    jobs: list = []
    left: list[tuple[Entry, str]] = []
    ctx = ScanContext(root, warn, state.load_last_used(root))
    if "hidet" in layouts:
        if not flt.kinds or "op" in flt.kinds:
            jobs.extend(_hidet_op_jobs(ctx, flt))
        if not (flt.ops or flt.spaces or flt.targets):  # graphs and ir_modules have none of these
            for dirname, kind in hidet.OTHER_KINDS:
                if flt.kinds and kind not in flt.kinds:
                    continue
                for de in ctx.listdir(root / dirname):
                    if de.is_dir(follow_symlinks=False):
                        verdict = hidet.judge(de.path, kind, True, root=root)
                        e = ctx.entry(path=de.path, usage=measure_tree(de.path, warn), layout="hidet", kind=kind,
                                      target=hidet.other_target(de.path, kind), space=None, op=None, hash=de.name,
                                      status=verdict.status, reason=verdict.reason)
                        if flt.matches(e):
                            jobs.append(e)
    others = tuple(n for n in layouts if n != "hidet")
    if others:
        from dataclasses import replace

        scanned = scan_cache(root, replace(flt, layouts=others, statuses=()), warn).entries
        chosen = []
        from kcache_cli.verify import judge_entry

        for e in scanned:
            verdict = judge_entry(root, e, deep=True)  # the one judgement, as verify's
            e = replace(e, status=verdict.status, reason=verdict.reason)
            if not flt.matches(e):
                continue
            why = _leave_out(e, flt, sources_only)
            (left.append((e, why)) if why else chosen.append(e))
        chosen += _linked_programs(root, chosen, left, warn)
        jobs.extend(chosen)
    jobs.sort(key=lambda j: j.relpath if isinstance(j, Entry) else ctx.rel(j[0]))
    return ExportPlan(root, flt, sources_only, jobs, left, ctx.last_used)


def _hidet_op_jobs(ctx, flt: ScanFilter) -> list[tuple[str, str, str, str, str]]:
    """(path, name, target, space, op) of every op directory the filter's names allow (cheap: listings)."""
    from kcache_cli.layouts import hidet

    ops = ctx.root / "ops"
    spaces = flt.spaces or [d.name for d in ctx.listdir(ops) if d.is_dir(follow_symlinks=False)]
    jobs = []
    for space in spaces:
        m = hidet.SPACE_RE.match(space)
        space_path = os.path.join(ops, space)
        if not m or not flt.wants_target(m.group(1)) or not os.path.isdir(space_path):
            continue
        op_names = flt.ops or [d.name for d in ctx.listdir(space_path) if d.is_dir(follow_symlinks=False)]
        for op in op_names:
            for de in ctx.listdir(os.path.join(space_path, op)):
                if not de.is_dir(follow_symlinks=False):
                    continue
                if flt.name_prefixes() and not any(de.name.startswith(p) for p in flt.name_prefixes()):
                    continue
                jobs.append((de.path, de.name, m.group(1), space, op))
    return jobs


def _linked_programs(root: Path, chosen: list[Entry], left: list, warn: Warn) -> list[Entry]:
    """tilus programs that chosen scripts link to and that are not chosen themselves."""
    scripts = [e for e in chosen if (e.layout, e.kind) == ("tilus", "script")]
    if not scripts:
        return []
    from kcache_cli.layouts import tilus
    from kcache_cli.scan import scan_cache

    have = {e.relpath for e in chosen}
    need = set()
    for s in scripts:
        for _, _, target in tilus.script_links(s.path):
            if target:
                rel = os.path.relpath(target, root).replace(os.sep, "/")
                if rel not in have:
                    need.add(rel)
    out = []
    if need:
        for e in scan_cache(root, ScanFilter(layouts=("tilus",), kinds=("program",)), warn).entries:
            if e.relpath in need:
                if e.status == BUILDING:
                    left.append((e, f"being built ({e.reason})"))
                else:
                    out.append(e)
    return out


class _Skip(Exception):
    """This entry cannot be exported as it is (a warning, not an error)."""


def _read_tree(dfd: int, prefix: str, out: list, budget: list[int]) -> None:
    """Everything under an open directory, sorted, depth first, as (name, kind, size, mode, mtime,
    extra): kind 'file' (extra: its bytes, or None past BIG_FILE or the memory budget), 'dir',
    'link' (extra: its target) or 'other'. Types come from the directory listing; each file is
    opened once (relative to `dfd`, never following a link), fstat'ed and read whole."""
    with os.scandir(dfd) as it:
        items = sorted(it, key=_by_name)
    for de in items:
        name = prefix + de.name
        if de.is_file(follow_symlinks=False):
            fd = os.open(de.name, _FILE_FLAGS, dir_fd=dfd)
            try:
                st = os.fstat(fd)
                mode = st.st_mode
                if not stat.S_ISREG(mode):  # replaced since the listing
                    out.append((name, "other", 0, mode, st.st_mtime, None))
                    continue
                size = st.st_size
                data = None
                if size <= BIG_FILE and size <= budget[0]:
                    data = os.read(fd, size) if size else b""
                    while len(data) < size:  # short reads happen on some filesystems
                        more = os.read(fd, size - len(data))
                        if not more:
                            break
                        data += more
                    budget[0] -= len(data)
                    size = len(data)
                out.append((name, "file", size, mode, st.st_mtime, data))
            finally:
                os.close(fd)
        elif de.is_dir(follow_symlinks=False):
            sub = os.open(de.name, _DIR_FLAGS, dir_fd=dfd)
            try:
                out.append((name, "dir", 0, 0o755, os.fstat(sub).st_mtime, None))
                _read_tree(sub, name + "/", out, budget)
            finally:
                os.close(sub)
        elif de.is_symlink():
            st = de.stat(follow_symlinks=False)
            out.append((name, "link", st.st_size, st.st_mode, st.st_mtime, os.readlink(de.name, dir_fd=dfd)))
        else:
            out.append((name, "other", 0, 0, 0.0, None))


ENTRY_BUDGET = 256 << 20  # bytes of one entry held in memory; the rest is read again when written


_by_name = attrgetter("name")


def _read_file(dfd: int, name: str, size: int) -> bytes:
    fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    try:
        data = os.read(fd, size) if size else b""
        while len(data) < size:  # short reads happen on some filesystems
            more = os.read(fd, size - len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


class _PartWriter:
    """Turns entries into tar members and manifest records (one worker, one or more parts)."""

    def __init__(self, plan: ExportPlan, writer, programs: set[str], advance: Callable[[int], None]) -> None:
        import hashlib

        from kcache_cli.scan import ScanContext

        self.plan = plan
        self.writer = writer
        self.programs = programs
        self.advance = advance
        self.sha256 = hashlib.sha256
        self.warnings: list[str] = []
        self.ctx = ScanContext(plan.root, self.warnings.append, plan.last_used)
        self.records: list[dict] = []
        self.done: list[ExportedEntry] = []
        self.left: list[tuple[Entry, str]] = []
        self.files = self.size = 0

    def job(self, job) -> None:
        try:
            if isinstance(job, Entry):
                self._entry(job)
            else:
                self._hidet_op(job)
        except _Skip as exc:
            entry, why = exc.args
            self.left.append((entry, why))
            self.warnings.append(f"skipping {entry.relpath}: {why}")
        self.advance(1)

    def _hidet_op(self, job) -> None:
        from kcache_cli.layouts import hidet
        from kcache_cli.locking import probe_locked
        from kcache_cli.model import PARTIAL, TreeUsage

        path, name, target, space, op = job
        flt = self.plan.flt
        if name.startswith("."):  # temp and hidden directories: let the scan say exactly what they are
            e = hidet._op_entry(self.ctx, job)
            if flt.matches(e):
                self.left.append((e, _leave_out(e, flt, self.plan.sources_only) or "not an entry"))
            return
        try:
            dfd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            return self._unreadable(job, exc)
        try:
            items: list = []
            try:
                newest = os.fstat(dfd).st_mtime
                _read_tree(dfd, "", items, [ENTRY_BUDGET])
            except OSError as exc:
                return self._unreadable(job, exc)
            names = {}
            size = files = 0
            for it in items:
                if it[1] != "dir":
                    size += it[2]
                    files += 1
                    if "/" not in it[0]:
                        names[it[0]] = it[2]
                if it[4] > newest:
                    newest = it[4]
            verdict = hidet.judge(path, "op", True, root=self.ctx.root)  # the one judgement, as verify's
            status, reason = verdict.status, verdict.reason
            if status == PARTIAL and ".lock" in names and probe_locked(os.path.join(path, ".lock")):
                status, reason = BUILDING, "hidet holds the entry's lock (compiling)"
            e = self.ctx.entry(path=path, usage=TreeUsage(size, files, newest), layout="hidet", kind="op",
                               target=target, space=space, op=op, hash=name, status=status, reason=reason)
            if not flt.matches(e):
                return
            why = _leave_out(e, flt, self.plan.sources_only)
            if why:
                self.left.append((e, why))
                return
            self._emit(e, dfd, items, newest)
        finally:
            os.close(dfd)

    def _unreadable(self, job, exc: OSError) -> None:
        path, name, target, space, op = job
        from kcache_cli.model import UNREADABLE, TreeUsage

        e = self.ctx.entry(path=path, usage=TreeUsage(0, 0, 0.0), layout="hidet", kind="op", target=target,
                           space=space, op=op, hash=name, status=UNREADABLE, reason=f"unreadable: {exc.strerror}")
        if self.plan.flt.matches(e):
            self.left.append((e, e.reason))
            self.warnings.append(f"skipping {e.relpath}: {e.reason}")

    def _entry(self, e: Entry) -> None:
        try:
            dfd = os.open(e.path, _DIR_FLAGS)
        except OSError as exc:
            raise _Skip(e, f"unreadable: {exc.strerror}") from None
        try:
            items: list = []
            try:
                mtime = os.fstat(dfd).st_mtime
                _read_tree(dfd, "", items, [ENTRY_BUDGET])
            except OSError as exc:
                raise _Skip(e, f"unreadable: {exc.strerror}") from None
            self._emit(e, dfd, items, mtime)
        finally:
            os.close(dfd)

    def _emit(self, e: Entry, dfd: int, items: list, mtime: float) -> None:
        """Check the listing, then read and append the entry. Its members are collected first, so
        that an entry that changes under us is skipped whole (entries above BIG_FILE stream)."""
        from kcache_cli import tarstream as ts

        rel = e.relpath
        for name, kind, _, _, _, extra in items:
            if kind == "file":
                if not name.isascii():
                    try:
                        name.encode("utf-8")
                    except UnicodeEncodeError:
                        raise _Skip(e, f"{name!r} is not a UTF-8 file name") from None
                continue
            if kind == "other":
                raise _Skip(e, f"{name} is a device, fifo or socket")
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise _Skip(e, f"{name!r} is not a UTF-8 file name") from None
            if kind == "link":
                bad = link_problem(e.layout, e.kind, rel, name, extra, self.programs.__contains__)
                if bad:
                    raise _Skip(e, bad)
        sources_only = self.plan.sources_only
        sha256 = self.sha256
        file_header, padding = ts.file_header, ts.padding
        pieces = [ts.dir_header(rel, mtime)]
        put = pieces.append
        files: dict[str, dict] = {}
        links: dict[str, str] = {}
        dirs: list[str] = []
        locks: list[str] = []
        omitted: list[str] = []
        small: dict[str, bytes] = {}
        size = 0
        streamed = False
        prefix = rel + "/"
        for name, kind, fsize, mode, ftime, extra in items:
            if kind == "file":
                if name.endswith("lock") and is_lock_name(name):
                    locks.append(name)
                    continue
                if sources_only and is_binary_name(name):
                    omitted.append(name)
                    continue
                if fsize > BIG_FILE:
                    if not streamed:  # from here on, members go straight to the writer
                        self.writer.write(b"".join(pieces))
                        pieces.clear()
                        streamed = True
                    files[name] = self._stream(dfd, name, prefix + name, fsize, mode, ftime)
                    size += fsize
                    continue
                data = extra
                if data is None:
                    try:
                        data = _read_file(dfd, name, fsize)
                    except OSError as exc:
                        if streamed:
                            raise KcacheError(f"cannot read {e.path}/{name}: {exc.strerror} (the entry changed "
                                              "during the export)") from None
                        raise _Skip(e, f"cannot read {name}: {exc.strerror} (changed during the export?)") from None
                n = len(data)
                put(file_header(prefix + name, n, mode, ftime))
                put(data)
                put(padding(n))
                files[name] = [n, sha256(data).hexdigest()]
                size += n
                if name in _META:
                    small[name] = data
            elif kind == "dir":
                dirs.append(name)
                put(ts.dir_header(prefix + name, ftime))
            else:
                links[name] = extra
                put(ts.symlink_header(prefix + name, extra, ftime))
        if pieces:
            self.writer.write(b"".join(pieces))
        compiler, arch, platform = _entry_facts(e, small, (*files, *omitted))
        record = {"layout": e.layout, "kind": e.kind, "target": e.target, "space": e.space, "op": e.op,
                  "hash": e.hash, "relpath": rel, "status": e.status, "compiler": compiler, "arch": arch,
                  "platform": platform, "files": files, "links": links, "dirs": dirs, "locks": locks}
        if sources_only:
            record["omitted"] = omitted
        self.records.append(record)
        self.done.append(ExportedEntry(e.layout, e.kind, e.target, e.space, e.op, e.hash, rel, e.status,
                                       len(files), size, compiler, arch, platform, tuple(omitted)))
        self.files += len(files)
        self.size += size

    def _stream(self, dfd: int, name: str, member: str, size: int, mode: int, mtime: float) -> dict:
        from kcache_cli import tarstream as ts

        write = self.writer.write
        write(ts.file_header(member, size, mode, mtime))
        h = self.sha256()
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        try:
            left = size
            while left:
                chunk = os.read(fd, min(ts.CHUNK, left))
                if not chunk:
                    raise KcacheError(f"{member} shrank while it was being exported")
                h.update(chunk)
                write(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        write(ts.padding(size))
        return [size, h.hexdigest()]


def _entry_facts(entry: Entry, small: dict[str, bytes], names: Iterable[str]) -> tuple[str | None, str | None,
                                                                                       str | None]:
    """(compiler, arch, platform) of an entry: what it recorded (kcache.json), else its compile
    command, else tilus's options, else (no command at all) the archs inside its binaries."""
    compiler = arch = platform = None
    record = small.get("kcache.json")
    if record:
        try:
            data = json.loads(record)
            compiler, arch, platform = (str(data[k]) if data.get(k) else None
                                        for k in ("compiler", "arch", "platform"))
        except (ValueError, AttributeError, TypeError):
            pass
    command = None
    script = small.get("compile.sh") or small.get("module/compile.sh")
    if script is not None:
        from kcache_cli.layouts.hidet import command_from_script

        command = command_from_script(script.decode("utf-8", "replace"))
    elif small.get("nvcc_log.txt"):
        command = (small["nvcc_log.txt"].decode("utf-8", "replace").splitlines() or [""])[0]
    if command:
        words = command.split()
        if compiler is None and words:
            compiler = os.path.basename(words[0])
        arch = arch or archs_from_command(command)
    options = small.get("options.txt")
    if arch is None and options:
        m = re.search(rb"arch='sm_?(\d+)([af]?)'", options)
        if m:
            arch = f"sm_{m.group(1).decode()}{m.group(2).decode()}"
    if entry.layout == "tilelang" and entry.kind == "kernel" and entry.space and "/" in entry.space:
        platform = platform or entry.space.split("/", 1)[1]
    binaries = [os.path.join(entry.path, n) for n in names if is_binary_name(n)] \
        if arch is None and not command and entry.target != "cpu" else []
    if binaries:
        try:
            from kcache_cli.binary import read_binary
        except ImportError:  # the ELF reader is optional here
            return compiler, arch, platform
        found: list[str] = []
        for b in binaries:
            info = read_binary(b)
            found.extend(info.archs)
            found.extend(info.ptx_archs)
        arch = ",".join(dict.fromkeys(found)) or None
    return compiler, arch, platform


def _split(items: list, n: int) -> list[list]:
    """`items` in `n` contiguous chunks of nearly equal length."""
    k, r = divmod(len(items), n)
    out, i = [], 0
    for c in range(n):
        j = i + k + (1 if c < r else 0)
        out.append(items[i:j])
        i = j
    return out


def _export_worker(plan: ExportPlan, parts: list[list], path: str, compression: str, programs: set[str],
                   advance: Callable[[int], None], abort: Callable[[], bool]) -> dict:
    """Write `parts` (lists of jobs) into the file at `path`, one compressed part after the other."""
    from kcache_cli import tarstream as ts

    with open(path, "wb") as out:
        writer = ts.FrameWriter(out, compression)
        pw = _PartWriter(plan, writer, programs, advance)
        sizes, counts = [], []
        try:
            start = 0
            for jobs in parts:
                before = len(pw.records)
                for job in jobs:
                    if abort():
                        raise _aborted("export aborted")
                    pw.job(job)
                end = writer.end_part()
                sizes.append(end - start)
                counts.append(len(pw.records) - before)
                start = end
        finally:
            writer.close()
    # The records travel back as JSON text: encoding them here is done in parallel, and a string
    # pickles much faster than the dicts.
    text = json.dumps(pw.records, separators=(",", ":"))[1:-1]
    return {"records": text, "done": pw.done, "left": pw.left, "files": pw.files, "size": pw.size,
            "sizes": sizes, "counts": counts, "warnings": pw.warnings}


def export_archive(plan: ExportPlan, archive: str, *, warn: Warn | None = None,
                   progress: Progress | None = None) -> ExportResult:
    """Write the planned entries into `archive` (compression from its name) through a temp file
    renamed at the end: a failed export leaves no half archive behind.

    The tar stream is `manifest.json`, then the entries in parts (independent gzip members or zstd
    frames, listed in the manifest with their sizes) written by forked workers on big caches."""
    import tempfile

    from kcache_cli import tarstream as ts

    compression = compression_for(archive)
    archive = os.path.abspath(archive)
    out_dir = os.path.dirname(archive)
    if not os.path.isdir(out_dir):
        raise KcacheError(f"cannot write {archive}: {out_dir} is not a directory")
    warn = warn or (lambda m: None)
    jobs = plan.jobs
    programs = {j.relpath.split("/", 1)[1] for j in jobs
                if isinstance(j, Entry) and (j.layout, j.kind) == ("tilus", "program")}
    n_parts = max(1, min(MAX_PARTS, len(jobs) // ENTRIES_PER_PART))
    workers = min(_cpus(), n_parts) if len(jobs) >= PARALLEL_MIN_ENTRIES else 1
    if workers == 1:
        n_parts = 1
    part_jobs = _split(jobs, n_parts)
    per_worker = _split(part_jobs, workers)
    if progress:
        progress.start(len(jobs))
    temps: list[str] = []
    try:
        for _ in range(workers + 1):
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(archive)}.", suffix=".kcache-tmp", dir=out_dir)
            os.close(fd)
            temps.append(tmp)
    except OSError as exc:
        _unlink_all(temps)
        raise KcacheError(f"cannot write in {out_dir}: {exc.strerror}") from None
    final_tmp, bodies = temps[0], temps[1:]
    try:
        def run(w: int, advance, abort):
            return _export_worker(plan, per_worker[w], bodies[w], compression, programs, advance, abort)

        results, _ = _run_workers(workers, run, progress)
        records, done, left = [], [], list(plan.left)
        sizes, counts = [], []
        n_files = total = 0
        for r in results:
            if r["records"]:
                records.append(r["records"])
            done += r["done"]
            left += r["left"]
            sizes += r["sizes"]
            counts += r["counts"]
            n_files += r["files"]
            total += r["size"]
            for w in r["warnings"]:
                warn(w)
        # The end-of-archive blocks close the last part; no part is empty (import checks that).
        with open(bodies[-1], "ab") as last:
            tail = ts.FrameWriter(last, compression)
            tail.write(ts.END_OF_ARCHIVE)
            sizes[-1] += tail.close()
        parts = [{"size": s, "entries": c} for s, c in zip(sizes, counts)]
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kcache_version": __version__,
            "created": iso(time.time()), "platform": _platform(), "sources_only": plan.sources_only,
            "totals": {"entries": len(done), "files": n_files, "size": total},
            "parts": parts,
        }
        head_json = json.dumps(manifest, separators=(",", ":"))
        data = (head_json[:-1] + ',"entries":[' + ",".join(records) + "]}").encode()
        with open(final_tmp, "wb") as final:
            head = ts.FrameWriter(final, compression)
            head.write(ts.file_header(MANIFEST_NAME, len(data), 0o644, time.time()))
            head.write(data)
            head.write(ts.padding(len(data)))
            head.close()
            for body in bodies:
                _append_file(final, body)
            os.fchmod(final.fileno(), 0o666 & ~_umask())  # mkstemp makes 0600; an archive is a file the user makes
        os.replace(final_tmp, archive)
    finally:
        _unlink_all(temps)
    return ExportResult(archive, compression, tuple(done), tuple(left), n_files, total, os.path.getsize(archive),
                        plan.sources_only)


def _umask() -> int:
    """The process's umask: from /proc (Linux 4.7+) without changing it, else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _append_file(out, path: str) -> None:
    out.flush()
    with open(path, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        copied = 0
        try:
            while copied < size:
                n = os.copy_file_range(src.fileno(), out.fileno(), size - copied)
                if n == 0:
                    break
                copied += n
        except (AttributeError, OSError):
            src.seek(copied)
            out.seek(0, os.SEEK_END)
            import shutil

            shutil.copyfileobj(src, out, 1 << 20)


def _unlink_all(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def _cpus() -> int:
    from kcache_cli import parallel

    return parallel.cpus()


def _run_workers(n: int, first: Callable, progress: Progress | None = None,
                 between: Callable[[list], None] | None = None, second: Callable[[int], object] | None = None
                 ) -> tuple[list, list]:
    """The phases of an export or import in `n` workers (kcache_cli.parallel.run_phased)."""
    from kcache_cli import parallel

    return parallel.run_phased(n, first, progress, between, second)


def _ignore(n: int) -> None:
    pass


def _aborted(message: str) -> KcacheError:
    from kcache_cli.parallel import Aborted

    return Aborted(message)


def _platform() -> str:
    import platform

    return f"{sys.platform}-{platform.machine()}"


# ---- import: the plan ---------------------------------------------------------------------------

@dataclass
class _Planned:
    index: int
    record: dict
    layout: str
    kind: str
    relpath: str
    files: dict  # name -> (size, sha256)
    links: dict  # name -> target
    dirs: list
    locks: list
    action: str = "import"
    reason: str | None = None
    write: bool = True  # extract into staging (False: verify only)
    size: int = 0


def _reject(msg: str) -> ArchiveRejected:
    return ArchiveRejected(f"archive rejected: {msg}")


def _parse_manifest(data: bytes, limits: ImportLimits) -> tuple[dict, list[dict], list[int]]:
    """The manifest's header and the rules that span all entries: unique, non-nested entry paths
    and the limits on sizes and member counts (checked in bulk). Returns the manifest, its entry
    records and each entry's size. Each record's own rules are `_check_records`' (the workers')."""
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise _reject("manifest.json is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _reject("manifest.json is not a kcache archive manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version < 1:
        raise _reject("manifest.json has no valid format_version")
    if version > FORMAT_VERSION:
        raise _reject(f"made by a newer kcache (archive format {version}, this kcache reads {FORMAT_VERSION})")
    records = manifest.get("entries")
    if not isinstance(records, list):
        raise _reject("manifest.json has no entry list")
    try:
        rels = [rec["relpath"] + "" for rec in records]
        sizes = [[info[0] + 0 for info in rec["files"].values()] for rec in records]
        members = sum(len(rec["files"]) + len(rec.get("links") or ()) + len(rec.get("dirs") or ())
                      + len(rec.get("locks") or ()) + 1 for rec in records)
        if any(type(x) is not int or x < 0 for ss in sizes for x in ss):
            raise TypeError
    except (TypeError, KeyError, IndexError, AttributeError):
        _check_records(records, 0, limits)  # names the malformed record
        raise _reject("manifest.json has malformed entries") from None
    totals = [sum(ss) for ss in sizes]
    largest = max((max(ss) for ss in sizes if ss), default=0)
    if largest > limits.max_member:
        _check_records(records, 0, limits)  # names the file
    if members > limits.max_members:
        raise _reject(f"{members} members, over the limit of {limits.max_members}")
    if sum(totals) > limits.max_total:
        raise _reject(f"it would expand to {sum(totals)} bytes, over the limit of {limits.max_total}")
    ordered = sorted(rels)
    for a, b in zip(ordered, ordered[1:]):
        if a == b:
            raise _reject(f"entry {a} is listed twice in the manifest")
        if b.startswith(a + "/"):
            raise _reject(f"entry {b} lies inside entry {a}")
    return manifest, records, totals


def _check_records(records: list, offset: int, limits: ImportLimits) -> list[_Planned]:
    """Each entry record against the rules that need no member: the shape of its path, its key
    fields, its names and records. File names and digests are checked in bulk (one regex over all
    of them); only when that fails is each looked at, to say which one is wrong."""
    planned: list[_Planned] = []
    all_names: list[str] = []
    all_sizes: list = []
    all_digests: list = []
    for i, rec in enumerate(records, offset):
        if not isinstance(rec, dict):
            raise _reject(f"manifest entry {i} is not an object")
        layout, kind, relpath = rec.get("layout"), rec.get("kind"), rec.get("relpath")
        if layout not in LAYOUT_NAMES or not isinstance(kind, str) or not isinstance(relpath, str):
            raise _reject(f"manifest entry {i} has no valid layout, kind or path")
        bad = entry_path_problem(layout, kind, relpath)
        if bad:
            raise _reject(f"manifest entry {i}: {bad}")
        parts = relpath.split("/")
        if rec.get("hash") != parts[-1] or (layout == "hidet" and kind == "op" and
                                            (rec.get("space"), rec.get("op")) != (parts[1], parts[2])) \
                or ((layout, kind) == ("tilus", "script") and rec.get("op") != parts[1]):
            raise _reject(f"manifest entry {relpath}: its hash, space or op disagree with its path")
        files, links, dirs, locks = rec.get("files"), rec.get("links", {}), rec.get("dirs", []), rec.get("locks", [])
        if not isinstance(files, dict) or not isinstance(links, dict) or not isinstance(dirs, list) \
                or not isinstance(locks, list):
            raise _reject(f"manifest entry {relpath}: malformed files, links, dirs or locks")
        try:
            sizes = [info[0] for info in files.values()]
            digests = [info[1] for info in files.values()]
            if any(len(info) != 2 for info in files.values()):
                raise TypeError
        except (TypeError, KeyError, IndexError):
            _check_files(relpath, files, limits)  # says which record is malformed
            raise _reject(f"manifest entry {relpath}: malformed file records") from None
        p = _Planned(i, rec, layout, kind, relpath, dict(zip(files, zip(sizes, digests))), dict(links), list(dirs),
                     list(locks))
        all_names.extend(files)
        all_sizes.extend(sizes)
        all_digests.extend(digests)
        names = set(files)
        for name, target in links.items():
            if not isinstance(target, str):
                raise _reject(f"{relpath}/{name}: malformed link record")
        for group, what in ((links, "link"), (dirs, "directory"), (locks, "lock file")):
            for name in group or ():
                bad = path_problem(name, f"{what} name")
                if bad:
                    raise _reject(f"{relpath}: {bad}")
                if name in names:
                    raise _reject(f"{relpath}/{name} is listed twice in the manifest")
                names.add(name)
        for name in locks:
            if not is_lock_name(name):
                raise _reject(f"{relpath}/{name} is listed as a lock file but is not named like one")
        nested = [n for n in names if "/" in n]
        if nested:
            not_dirs = names - set(dirs)
            for name in nested:
                parts_ = name.split("/")
                for k in range(1, len(parts_)):
                    if "/".join(parts_[:k]) in not_dirs:
                        raise _reject(f"{relpath}/{name} lies under a file or link of the same entry")
        planned.append(p)
    # In bulk: every file name simple and no lock, every size a non-negative int, every digest hex64.
    joined = "\n".join(all_names)
    ok = joined.count("\n") == len(all_names) - 1 if all_names else True  # no name holds a newline itself
    ok = ok and _SIMPLE_NAMES.fullmatch(joined) is not None and not _LOCK_LINE.search(joined) \
        and all(type(x) is int and 0 <= x <= limits.max_member for x in all_sizes) \
        and all(type(d) is str for d in all_digests) and set(map(len, all_digests)) <= {64} \
        and _HEX.fullmatch("".join(all_digests)) is not None
    if not ok:
        for p in planned:
            _check_files(p.relpath, p.record["files"], limits)
    for p in planned:
        p.size = sum(size for size, _ in p.files.values())
    return planned


def _check_files(relpath: str, files: dict, limits: ImportLimits) -> None:
    """The file records of one entry, one by one (the slow path that names what is wrong)."""
    for name, info in files.items():
        bad = path_problem(name, "file name")
        if bad:
            raise _reject(f"{relpath}: {bad}")
        if is_lock_name(name):
            raise _reject(f"{relpath}/{name} is named like a lock file (lock files are never shipped)")
        if not isinstance(info, list) or len(info) != 2:
            raise _reject(f"{relpath}/{name}: malformed file record (want [size, sha256])")
        size, digest = info
        if type(size) is not int or size < 0 or type(digest) is not str or not _HEX64.fullmatch(digest):
            raise _reject(f"{relpath}/{name}: the manifest gives no valid size and sha256")
        if size > limits.max_member:
            raise _reject(f"{relpath}/{name} is {size} bytes, over the limit of {limits.max_member} per file")


def _real_dir_chain(root: Path, relpath: str, cache: dict | None = None) -> str | None:
    """Why the parents of `relpath` under `root` cannot be written without following a link, or None."""
    cache = {} if cache is None else cache
    cur = str(root)
    for part in relpath.split("/")[:-1]:
        cur = os.path.join(cur, part)
        if cur in cache:
            problem = cache[cur]
        else:
            try:
                st = os.lstat(cur)
                problem = (f"{cur} is a symlink (kcache never writes through one)" if stat.S_ISLNK(st.st_mode)
                           else None if stat.S_ISDIR(st.st_mode) else f"{cur} is not a directory")
            except FileNotFoundError:
                problem = ""  # missing: made at publish time
            except OSError as exc:
                problem = f"cannot check {cur}: {exc.strerror}"
            cache[cur] = problem
        if problem is not None:
            return problem or None
    return None


def _plan(root: Path, planned: list[_Planned], archive_programs: set[str]) -> None:
    """Decide each entry's action from the destination, and check every link against it."""
    from kcache_cli.scan import scan_cache

    existing = {p.relpath for p in planned if os.path.lexists(os.path.join(root, p.relpath))}
    found: dict[str, Entry] = {}
    if existing:
        layouts = tuple(sorted({p.layout for p in planned if p.relpath in existing}))
        found = {e.relpath: e for e in scan_cache(root, ScanFilter(layouts=layouts)).entries}
    chains: dict = {}

    def program_ok(h: str) -> bool:
        if h in archive_programs:
            return True
        return _real_dir_chain(root, f"programs/{h}/x", chains) is None and \
            os.path.isdir(os.path.join(root, "programs", h))

    for p in planned:
        for name, target in p.links.items():
            bad = link_problem(p.layout, p.kind, p.relpath, name, target, program_ok)
            if bad:
                raise _reject(bad)
        blocked = _real_dir_chain(root, p.relpath, chains)
        if blocked:
            p.action, p.reason, p.write = "skip", blocked, False
            continue
        if p.relpath in existing:
            there = found.get(p.relpath)
            if there is not None and there.status != BUILDING:  # the one judgement, as verify's
                from dataclasses import replace as _with

                from kcache_cli.verify import judge_entry

                verdict = judge_entry(root, there, deep=True)
                there = _with(there, status=verdict.status, reason=verdict.reason)
            if there is None:
                p.action, p.reason = "skip", "something that is not an entry is in the way"
            elif there.status == COMPLETE:
                p.action, p.reason = "skip", "already present (complete)"
            elif there.status == BUILDING:
                p.action, p.reason = "skip", f"being built ({there.reason})"
            elif p.record.get("status") != COMPLETE:
                p.action, p.reason = "skip", f"already present ({there.status})"
            else:
                p.action, p.reason = "replace", f"replaces a {there.status} entry ({there.reason})"
            p.write = p.action != "skip"


# ---- import: reading the archive ----------------------------------------------------------------

class _Staging:
    """Where an import extracts before publishing: <root>/.kcache/import-<pid>-<random>/, made by
    this process, removed (with any directory it had to create) when the import ends."""

    def __init__(self, root: Path) -> None:
        import secrets

        self.created: list[str] = []
        cur = str(root)
        missing = []
        while not os.path.lexists(cur):
            missing.append(cur)
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
        for d in reversed(missing):
            os.mkdir(d)
            self.created.append(d)
        sdir = os.path.join(root, state.STATE_DIR)
        try:
            st = os.lstat(sdir)
            if not stat.S_ISDIR(st.st_mode):
                raise KcacheError(f"{sdir} is not a directory")
        except FileNotFoundError:
            os.mkdir(sdir)
            self.created.append(sdir)
        for sub in (state.locks_dir(root), state.trash_dir(root)):  # where publishing writes
            if os.path.islink(sub) or (os.path.lexists(sub) and not os.path.isdir(sub)):
                raise KcacheError(f"{sub} is not a directory (kcache never writes through a symlink)")
        self.path = os.path.join(sdir, f"import-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(self.path, 0o700)
        self.dirs: set[str] = {""}

    def ensure_dir(self, rel: str) -> None:
        if rel in self.dirs:
            return
        self.ensure_dir(os.path.dirname(rel))
        full = os.path.join(self.path, rel)
        try:
            os.mkdir(full)
        except FileExistsError:  # another worker made it, or a member made it a file: check
            st = os.lstat(full)
            if not stat.S_ISDIR(st.st_mode):
                raise
        self.dirs.add(rel)

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)
        for d in reversed(self.created):
            try:
                os.rmdir(d)
            except OSError:
                pass


_ROOT, _DIR, _FILE, _LINK = 0, 1, 2, 3


def _expectations(planned: list[_Planned]) -> dict[str, tuple]:
    """member name -> (entry, kind, size, sha256 or link target)."""
    expect: dict[str, tuple] = {}
    for p in planned:
        rel = p.relpath + "/"
        expect[p.relpath] = (p, _ROOT, 0, "")
        for name in p.dirs:
            expect[rel + name] = (p, _DIR, 0, "")
        for name, (size, digest) in p.files.items():
            expect[rel + name] = (p, _FILE, size, digest)
        for name, target in p.links.items():
            expect[rel + name] = (p, _LINK, 0, target)
    return expect


def _unexpected(name: str, listed: dict) -> ArchiveRejected:
    if name == MANIFEST_NAME or name in listed:
        return _reject(f"duplicate member {name!r}")
    bad = path_problem(name, "member name")
    if bad:
        return _reject(bad)
    if is_lock_name(name):
        return _reject(f"member {name!r} is named like a lock file (lock files are never shipped)")
    return _reject(f"member {name!r} is not listed in the manifest (or not in its part)")


def _extract(reader, planned: list[_Planned], staging: _Staging | None, limits: ImportLimits,
             abort: Callable[[], bool] = lambda: False) -> tuple[int, int]:
    """Read members until the end of `reader`: each one must be listed for `planned` (once), of the
    listed type, size and sha256. Files of entries to publish go into `staging`; the others are
    only hashed. Returns (files, bytes) read."""
    import hashlib

    from kcache_cli import tarstream as ts

    listed = _expectations(planned)
    expect = dict(listed)  # what has not come yet: each member takes itself out
    files = size = 0
    sha256 = hashlib.sha256
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    base = staging.path + "/" if staging is not None else ""
    dirs = staging.dirs if staging is not None else set()
    regular, max_member = ts.REGULAR, limits.max_member
    count = 0
    while True:
        m = reader.next()
        if m is None:
            break
        count += 1
        if count & 255 == 0 and abort():
            raise _aborted("import aborted")
        name = m.name
        x = expect.pop(name, None)
        if x is None:
            raise _unexpected(name, listed)
        entry, want, wsize, wdigest = x
        out = staging is not None and entry.write
        kind = m.type
        if kind == regular and want == _FILE:
            if m.size != wsize:
                raise _reject(f"member {name!r} is {m.size} bytes, the manifest says {wsize}")
            if m.size > max_member:  # the manifest's sizes were checked; this is a second net
                raise _reject(f"member {name!r} is over the limit of {max_member} bytes per file")
            data = reader.small_data(m)
            if data is not None:
                digest = sha256(data).hexdigest()
            if out:
                parent = name.rpartition("/")[0]
                if parent not in dirs:
                    staging.ensure_dir(parent)
                fd = os.open(base + name, flags, 0o755 if m.mode & 0o111 else 0o644)
                try:
                    if data is not None:
                        if os.write(fd, data) != len(data):
                            _write_all(fd, data)
                    else:
                        h = sha256()
                        for chunk in reader.data(m):
                            h.update(chunk)
                            _write_all(fd, chunk)
                        digest = h.hexdigest()
                finally:
                    os.close(fd)
            elif data is None:
                h = sha256()
                for chunk in reader.data(m):
                    h.update(chunk)
                digest = h.hexdigest()
            if digest != wdigest:
                raise _reject(f"{name}: its sha256 differs from the manifest's (damaged or tampered with)")
            files += 1
            size += wsize
            continue
        if kind not in (ts.REGULAR, ts.DIRECTORY, ts.SYMLINK, ts.HARDLINK):
            raise _reject(f"member {name!r} is a {kind}")
        if kind == ts.HARDLINK:
            _hardlink(m, x, listed, expect, staging if out else None)
            files += 1
            size += wsize
            continue
        expected = {_ROOT: ts.DIRECTORY, _DIR: ts.DIRECTORY, _FILE: ts.REGULAR, _LINK: ts.SYMLINK}[want]
        if kind != expected:
            raise _reject(f"member {name!r} is a {kind}, the manifest says {expected}")
        if m.size:
            raise _reject(f"{kind} member {name!r} carries data")
        if kind == ts.DIRECTORY:
            if out:
                staging.ensure_dir(name)
        else:  # a symlink: its target was checked against the rules with the manifest
            if m.linkname != wdigest:
                raise _reject(f"symlink {name!r} -> {m.linkname!r}, the manifest says -> {wdigest!r}")
            if out:
                staging.ensure_dir(name.rpartition("/")[0])
                os.symlink(m.linkname, base + name)
    for key, x in expect.items():
        if x[1] in (_FILE, _LINK):
            raise _reject(f"{key} is listed in the manifest but missing from the archive (truncated?)")
    return files, size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _hardlink(m, x: tuple, listed: dict, expect: dict, staging: _Staging | None) -> None:
    """A hard link inside its own entry, to a file already read, becomes a copy of that file."""
    target = m.linkname.rstrip("/")
    t = listed.get(target)
    if t is None or t[0] is not x[0]:
        raise _reject(f"hard link {m.name!r} -> {m.linkname!r} points outside its entry")
    if x[1] != _FILE or t[1] != _FILE or target in expect:
        raise _reject(f"hard link {m.name!r} -> {m.linkname!r} is not to a file read before it")
    if t[2:] != x[2:]:
        raise _reject(f"hard link {m.name!r}: the manifest gives it another size or sha256 than its target")
    if staging is not None:
        import shutil

        staging.ensure_dir(m.name.rpartition("/")[0])
        shutil.copyfile(os.path.join(staging.path, target), os.path.join(staging.path, m.name),
                        follow_symlinks=False)


@dataclass(frozen=True)
class _Region:
    start: int
    length: int
    lo: int  # entries[lo:hi] live in this part
    hi: int
    last: bool


def _regions(manifest: dict, n_entries: int, file_size: int) -> list[_Region] | None:
    """Where each part of the body is, from the manifest's part sizes (the parts end the file).
    None when the manifest lists no parts: the body is then read as one stream."""
    parts = manifest.get("parts")
    if parts is None:
        return None
    if not isinstance(parts, list) or not parts or len(parts) > 4096:
        raise _reject("manifest.json has a malformed part list")
    sizes, counts = [], []
    for p in parts:
        size, count = (p.get("size"), p.get("entries")) if isinstance(p, dict) else (None, None)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (size, count)):
            raise _reject("manifest.json has a malformed part list")
        sizes.append(size)
        counts.append(count)
    if sum(counts) != n_entries or sum(sizes) >= file_size:
        raise _reject("the manifest's parts do not add up to the archive")
    out, pos, lo = [], file_size - sum(sizes), 0
    for i, (size, count) in enumerate(zip(sizes, counts)):
        out.append(_Region(pos, size, lo, lo + count, i == len(sizes) - 1))
        pos += size
        lo += count
    return out


def _region_reader(fd: int, kind: str, start: int, length: int, counted, threaded: bool):
    from kcache_cli import tarstream as ts

    return ts.TarReader(ts.region_source(fd, kind, start, length, counted, threaded))


def _check_head(fd: int, kind: str, end: int, digest: str) -> None:
    """The bytes before the first part hold the manifest and nothing else."""
    import hashlib

    from kcache_cli import tarstream as ts

    reader = _region_reader(fd, kind, 0, end, _ignore, False)
    try:
        m = reader.next()
        if m is None or m.name != MANIFEST_NAME or m.type != ts.REGULAR:
            raise _reject("the manifest's part sizes do not match the archive")
        h = hashlib.sha256()
        for chunk in reader.data(m):
            h.update(chunk)
        if h.hexdigest() != digest or reader.next() is not None or reader.end_marker:
            raise _reject("the manifest's part sizes do not match the archive")
    finally:
        reader.close()


def _extract_regions(fd: int, kind: str, regions: list[_Region], records: list, staging: _Staging | None,
                     root: Path, programs: set[str], limits: ImportLimits, advance, abort, threaded: bool
                     ) -> tuple[int, int, list[_Planned]]:
    """One worker's share: check its entries' records, plan them, then read its parts."""
    planned_by_region = []
    for r in regions:
        planned = _check_records(records[r.lo:r.hi], r.lo, limits)
        _plan(root, planned, programs)
        planned_by_region.append(planned)
    files = size = 0
    for r, planned in zip(regions, planned_by_region):
        reader = _region_reader(fd, kind, r.start, r.length, advance, threaded)
        try:
            f, s = _extract(reader, planned, staging, limits, abort)
            if reader.end_marker and not r.last:
                raise _reject("an end-of-archive marker before the last part")
        finally:
            reader.close()
        if staging is not None:
            _finish_staging(staging, planned)
        files += f
        size += s
    return files, size, [p for planned in planned_by_region for p in planned]


# ---- import: publishing --------------------------------------------------------------------------

_RENAMEAT2 = None


def rename_noreplace(src: str, dst: str) -> None:
    """Rename `src` to `dst`, failing with FileExistsError if `dst` exists (even an empty directory,
    which a plain rename would silently replace)."""
    global _RENAMEAT2
    if _RENAMEAT2 is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _RENAMEAT2 = (fn, ctypes)
        except (OSError, AttributeError):
            _RENAMEAT2 = False
    if _RENAMEAT2:
        fn, ctypes = _RENAMEAT2
        if fn(-100, os.fsencode(src), -100, os.fsencode(dst), 1) == 0:  # AT_FDCWD, RENAME_NOREPLACE
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), dst)
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst)


def _make_parents(root: Path, relpath: str, made: set[str]) -> None:
    """Create the missing parents of an entry, as real directories (`made` remembers them)."""
    cur = str(root)
    for part in relpath.split("/")[:-1]:
        cur = os.path.join(cur, part)
        if cur in made:
            continue
        try:
            os.mkdir(cur)
        except FileExistsError:
            st = os.lstat(cur)
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                raise KcacheError(f"{cur} is not a directory (kcache never writes through a symlink)") from None
        made.add(cur)


def _relocate(root: Path, layout: str, staged: str, dest: str) -> None:
    """Paths an entry records about itself, rewritten to where it is about to be published
    (Layout.relocate: Triton's group files name every file by its absolute path)."""
    from kcache_cli.layouts import get

    get(layout).relocate(staged, dest, root)


def _dest_status(root: Path, p: _Planned) -> str | None:
    from kcache_cli.scan import scan_cache

    parts = p.relpath.split("/")
    flt = ScanFilter(layouts=(p.layout,), kinds=(p.kind,), hash_prefixes=(parts[-1],),
                     spaces=(parts[1],) if p.layout == "hidet" and p.kind == "op" else (),
                     ops=(parts[2],) if p.layout == "hidet" and p.kind == "op" else ())
    from kcache_cli.verify import judge_entry

    for e in scan_cache(root, flt).entries:
        if e.relpath == p.relpath:
            return e.status if e.status == BUILDING else judge_entry(root, e, deep=True).status
    return None


def _publish(root: Path, p: _Planned, staging: _Staging, lock_timeout: float, warn: Warn,
             made: set[str]) -> tuple[bool, str | None]:
    """Move one staged entry into place with one rename, under its lock. (published, reason)."""
    import shutil

    from kcache_cli.locking import EntryFlock, probe_locked

    src = os.path.join(staging.path, p.relpath)
    dest = os.path.join(root, p.relpath)
    lock = EntryFlock(root, p.relpath)
    if not lock.acquire(0):
        warn(f"waiting for the lock of {p.relpath} (a build in progress?)")
        if not lock.acquire(lock_timeout):
            return False, f"its lock was held (a build in progress?) for more than {lock_timeout:g}s"
    trashed = None
    try:
        if os.path.lexists(dest):
            if p.action != "replace":
                return False, "already present (appeared during the import)"
            if probe_locked(os.path.join(dest, ".lock")):
                return False, "being built (its .lock is held)"
            if _dest_status(root, p) == COMPLETE:
                return False, "already present (completed during the import)"
            import secrets

            trash = state.trash_dir(root)
            trash.mkdir(parents=True, exist_ok=True)
            trashed = os.path.join(trash, f"{p.relpath.replace('/', '%2F')}-{secrets.token_hex(4)}")
            os.rename(dest, trashed)
        _make_parents(root, p.relpath, made)
        _relocate(root, p.layout, src, dest)
        try:
            rename_noreplace(src, dest)
        except FileExistsError:
            return False, "already present (appeared during the import)"
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # The entry's directory is on another filesystem: copy next to it, then rename.
            import secrets

            tmp = os.path.join(os.path.dirname(dest), f"{state.TEMP_PREFIX}{p.relpath.rsplit('/', 1)[-1]}-"
                                                      f"{secrets.token_hex(4)}")
            shutil.copytree(src, tmp, symlinks=True)
            try:
                rename_noreplace(tmp, dest)
            except FileExistsError:
                shutil.rmtree(tmp, ignore_errors=True)
                return False, "already present (appeared during the import)"
        return True, p.reason
    finally:
        lock.release()
        if trashed:
            shutil.rmtree(trashed, ignore_errors=True)


def _refuse_other_layout(root: Path, records: list[dict]) -> None:
    """An archive of one layout never goes into a root of another: that compiler would never look
    there (tilus programs/ inside a hidet cache). An empty or new root takes the archive's layout."""
    from kcache_cli.scan import detect_layouts

    have = detect_layouts(root) if root.is_dir() else ()
    brought = sorted({str(rec.get("layout")) for rec in records} - set(have))
    if not have or not brought:
        return
    from kcache_cli.locate import known_caches

    where = dict(known_caches())
    homes = "; ".join(f"{name}'s cache is {where[name]}" for name in brought if name in where)
    raise KcacheError(f"the archive holds {' and '.join(brought)} entries but {root} is a {'/'.join(have)} cache, "
                      f"where {' and '.join(brought)} never looks; import it into the {' and '.join(brought)} "
                      f"cache with --cache-dir ({homes or 'see'}; `kcache dir --all` lists them)")


def import_archive(root: Path, archive: str, *, dry_run: bool = False, limits: ImportLimits = ImportLimits(),
                   lock_timeout: float = 60.0, warn: Warn | None = None, progress: Progress | None = None
                   ) -> ImportResult:
    """Verify `archive` completely, then publish its entries into `root` (see the module doc).

    Staged then published: every member is checked while it is extracted into a staging directory
    inside the root; nothing is published unless the whole archive is valid. The parts of a big
    archive are read by forked workers, each from its own offset."""
    import hashlib

    from kcache_cli import tarstream as ts

    warn = warn or (lambda m: None)
    root = Path(os.path.realpath(root))
    archive = os.path.abspath(archive)
    if os.path.lexists(root) and not root.is_dir():
        raise KcacheError(f"{root} is not a directory")
    try:
        raw = open(archive, "rb")
    except OSError as exc:
        raise KcacheError(f"cannot read {archive}: {exc.strerror}") from None
    staging: _Staging | None = None
    with raw:
        try:
            file_size = os.fstat(raw.fileno()).st_size
            if progress:
                progress.start(file_size)
            advance = progress.advance if progress else _ignore
            try:
                source, kind = ts.open_source(raw, advance)
            except ts.TarFormatError as exc:
                raise _reject(str(exc)) from None
            reader = ts.TarReader(source)
            try:
                head = reader.next()
                if head is None or head.name != MANIFEST_NAME or head.type != ts.REGULAR:
                    raise _reject("its first member is not manifest.json (not a kcache archive?)")
                if head.size > limits.max_manifest:
                    raise _reject(f"manifest.json is {head.size} bytes, over the limit of {limits.max_manifest}")
                data = b"".join(reader.data(head))
                manifest, records, totals = _parse_manifest(data, limits)
                _refuse_other_layout(root, records)
                regions = _regions(manifest, len(records), file_size)
                if regions is not None:
                    reader.close()  # the parts are read from their own offsets
                    _check_head(raw.fileno(), kind, regions[0].start, hashlib.sha256(data).hexdigest())
                programs = {rec["relpath"].split("/", 1)[-1] for rec in records
                            if (rec.get("layout"), rec.get("kind")) == ("tilus", "program")}
                if not dry_run and records:
                    absent = [t for rec, t in zip(records, totals) if not os.path.lexists(root / rec["relpath"])]
                    _check_space(root, sum(absent))
                    staging = _Staging(root)
                mine: dict[int, list[_Planned]] = {}  # what each worker planned, for its phase two

                if regions is None:  # one stream: read on from the manifest, here
                    n = 1

                    def first(w: int, advance, abort) -> tuple:
                        planned = _check_records(records, 0, limits)
                        _plan(root, planned, programs)
                        files, size = _extract(reader, planned, staging, limits, abort)
                        if staging is not None:
                            _finish_staging(staging, planned)
                        mine[w] = planned
                        return files, size, _decisions(planned)
                else:
                    n = min(_cpus(), len(regions)) if len(records) >= PARALLEL_MIN_ENTRIES else 1
                    region_groups = _split(regions, n)

                    def first(w: int, advance, abort) -> tuple:
                        files, size, planned = _extract_regions(raw.fileno(), kind, region_groups[w], records,
                                                                staging, root, programs, limits, advance, abort, True)
                        mine[w] = planned
                        return files, size, _decisions(planned)

                made: set[str] = set()
                outcome: dict[int, tuple[bool, str | None]] = {}

                def publish(ps: list[_Planned]) -> list:
                    return [(p.index, *_publish(root, p, staging, lock_timeout, warn, made)) for p in ps]

                def is_program(p: _Planned) -> bool:
                    return (p.layout, p.kind) == ("tilus", "program")

                def between(results: list) -> None:  # tilus programs first: scripts link to them
                    decided = {i: d for r in results for i, *d in r[2]}
                    todo = []
                    for i, rec in enumerate(records):
                        if (rec.get("layout"), rec.get("kind")) == ("tilus", "program") and decided[i][2]:
                            p = _check_records([rec], i, limits)[0]
                            p.action, p.reason, p.write = decided[i]
                            todo.append(p)
                    outcome.update((i, (d, why)) for i, d, why in publish(todo))

                def second(w: int) -> list:
                    return publish([p for p in mine.get(w, ()) if p.write and not is_program(p)])

                writing = staging is not None and not dry_run
                counts, published = _run_workers(n, first, progress, between if writing else None,
                                                 second if writing else None)
                n_files, n_bytes = sum(c[0] for c in counts), sum(c[1] for c in counts)
                decisions = {i: d for c in counts for i, *d in c[2]}
                for batch in published:
                    outcome.update((i, (d, why)) for i, d, why in batch)
            except ts.TarFormatError as exc:
                raise _reject(str(exc)) from None
            finally:
                reader.close()
            results = []
            for i, rec in enumerate(records):
                action, reason, write = decisions[i]
                done, reason = outcome.get(i, (False, reason))
                if write and not dry_run and not done:
                    action = "skip"
                relpath = rec["relpath"]
                results.append(ImportedEntry(rec["layout"], rec["kind"], _str(rec.get("target")),
                                             _str(rec.get("space")), _str(rec.get("op")), relpath.rsplit("/", 1)[-1],
                                             relpath, action, done, reason, len(rec["files"]), totals[i],
                                             _str(rec.get("arch")), _str(rec.get("compiler")),
                                             _str(rec.get("platform"))))
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            raise KcacheError(f"import failed: {exc.strerror or exc}{where}") from None
        finally:
            if staging is not None:
                staging.cleanup()
    if not dry_run and any(r.done for r in results):
        _remove_stale_staging(root)
    results.sort(key=lambda r: r.relpath)
    return ImportResult(archive, str(root), dry_run, _str(manifest.get("kcache_version")), tuple(results),
                        n_files, n_bytes)


def _decisions(planned: list[_Planned]) -> list[tuple]:
    """What a worker decided for each of its entries, small enough to send back."""
    return [(p.index, p.action, p.reason, p.write) for p in planned]


STALE_STAGING = 24 * 3600.0
_STAGING_NAME = re.compile(r"^import-(\d+)-[0-9a-f]+$")


def _remove_stale_staging(root: Path) -> None:
    """Staging directories of imports that were killed: a day old, and no live process of that pid here."""
    import shutil

    sdir = os.path.join(root, state.STATE_DIR)
    try:
        names = os.listdir(sdir)
    except OSError:
        return
    now = time.time()
    for name in names:
        m = _STAGING_NAME.match(name)
        if not m:
            continue
        path = os.path.join(sdir, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or now - st.st_mtime < STALE_STAGING:
                continue
            os.kill(int(m.group(1)), 0)
            continue  # that process is alive (or the pid was reused): leave it
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, ValueError, OverflowError):
            continue


def _finish_staging(staging: _Staging, planned: list[_Planned]) -> None:
    """Directories that came without a member, and the lock files, as new empty files."""
    from kcache_cli import tarstream as ts

    for p in planned:
        if not p.write:
            continue
        staging.ensure_dir(p.relpath)
        for name in p.dirs:
            staging.ensure_dir(f"{p.relpath}/{name}")
        for name in p.locks:
            staging.ensure_dir(f"{p.relpath}/{name}".rpartition("/")[0])
            os.close(ts.sink_file(os.path.join(staging.path, p.relpath, name)))


def _str(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _check_space(root: Path, need: int) -> None:
    cur = str(root)
    while not os.path.exists(cur) and os.path.dirname(cur) != cur:
        cur = os.path.dirname(cur)
    try:
        st = os.statvfs(cur)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise KcacheError(f"not enough space in {root}: the archive needs {need} bytes, {free} are free")


# ---- entry by entry: the same rules for importers other than the archive reader (kcache pull) ----

PlannedEntry = _Planned
ImportStaging = _Staging  # <root>/.kcache/import-<pid>-<random>/: where entries are written before publishing


def rejection_reason(exc: ArchiveRejected) -> str:
    """The rule a record broke, without the 'archive rejected: ' that import puts first."""
    return str(exc).removeprefix("archive rejected: ")


def plan_records(root: Path, records: list[dict], limits: ImportLimits = ImportLimits(),
                 programs: Iterable[str] = ()) -> tuple[list[_Planned], list[tuple[int, str]]]:
    """Every rule import applies to a manifest entry — its path and key fields, file names, sizes and
    digests, links (a tilus script's may point at one of `programs` or a program in the cache) — then
    import's plan against `root` (a complete entry present is skipped, an incomplete one replaced).

    Unlike an archive, records are judged one by one: a record that breaks a rule is refused alone,
    as (its index, one-line reason), and the others are planned."""
    root = Path(os.path.realpath(root))
    good: list[_Planned] = []
    refused: list[tuple[int, str]] = []
    for i, rec in enumerate(records):
        try:
            good.append(_check_records([rec], i, limits)[0])
        except ArchiveRejected as exc:
            refused.append((i, rejection_reason(exc)))
    seen: dict[str, _Planned] = {}
    for p in sorted(good, key=lambda p: p.relpath):
        clash = seen.get(p.relpath) or next((seen[a] for a in _ancestors(p.relpath) if a in seen), None)
        if clash is not None:
            refused.append((p.index, f"entry {p.relpath} clashes with entry {clash.relpath}"))
        else:
            seen[p.relpath] = p
    wanted = set(programs)
    chains: dict = {}

    def program_ok(h: str) -> bool:
        return h in wanted or (_real_dir_chain(root, f"programs/{h}/x", chains) is None
                               and os.path.isdir(os.path.join(root, "programs", h)))

    ok = []
    for p in seen.values():
        bad = next(filter(None, (link_problem(p.layout, p.kind, p.relpath, n, t, program_ok)
                                 for n, t in p.links.items())), None)
        (refused.append((p.index, bad)) if bad else ok.append(p))
    _plan(root, ok, wanted)
    ok.sort(key=lambda p: p.index)
    return ok, sorted(refused)


def _ancestors(relpath: str) -> list[str]:
    parts = relpath.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts))]


def publish_staged(root: Path, planned: _Planned, staging: _Staging, lock_timeout: float = 60.0,
                   warn: Warn | None = None, made: set[str] | None = None) -> tuple[bool, str | None]:
    """Publish one entry whose files are under `staging.path/<relpath>/` exactly as import does: its
    directories and empty lock files added, then one rename (no-replace) under the entry's lock.
    Returns (published, reason). `root` must be a real path (no symlink on the way), as
    ImportStaging's root is."""
    _finish_staging(staging, [planned])
    return _publish(root, planned, staging, lock_timeout, warn or (lambda m: None),
                    made if made is not None else set())


def check_total(root: Path, need: int, limits: ImportLimits = ImportLimits()) -> None:
    """Import's bounds on what a whole import writes: the total limit, then the free space."""
    if need > limits.max_total:
        raise KcacheError(f"the selected entries would expand to {need} bytes, over the limit of {limits.max_total}")
    _check_space(Path(os.path.realpath(root)), need)


def remove_stale_staging(root: Path) -> None:
    """Staging directories that killed imports (or pulls) left behind a day ago."""
    _remove_stale_staging(Path(os.path.realpath(root)))


class _Capture:
    """A writer that keeps the tar bytes of one entry, for `entry_records`."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


def entry_records(plan: ExportPlan) -> Iterator[tuple[dict, dict[str, bytes], tuple[str, ...]]]:
    """Each planned entry as export writes it: (its manifest record, {file name: bytes}, the names of
    its executable files), judged and read exactly as by `export_archive`. Entries export would
    leave out (incomplete, changed while read...) are in `plan.left` afterwards."""
    import io

    from kcache_cli import tarstream as ts

    programs = {j.relpath.split("/", 1)[1] for j in plan.jobs
                if isinstance(j, Entry) and (j.layout, j.kind) == ("tilus", "program")}
    capture = _Capture()
    pw = _PartWriter(plan, capture, programs, _ignore)
    for job in plan.jobs:
        capture.chunks.clear()
        before, left = len(pw.records), len(pw.left)
        pw.job(job)
        plan.left.extend(pw.left[left:])
        if len(pw.records) == before:
            continue
        record = pw.records[-1]
        reader = ts.TarReader(io.BytesIO(b"".join(capture.chunks)))
        prefix = record["relpath"] + "/"
        data: dict[str, bytes] = {}
        executable = []
        while (m := reader.next()) is not None:
            if m.type == ts.REGULAR:
                name = m.name[len(prefix):]
                data[name] = reader.small_data(m) or b"".join(reader.data(m))
                if m.mode & 0o111:
                    executable.append(name)
        yield record, data, tuple(executable)
