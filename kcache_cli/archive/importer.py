"""Import: the whole archive verified while it is extracted into a staging directory inside the root,
then each entry published with one rename under its lock (the `Importer`)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass
from dataclasses import replace as _with
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping, NamedTuple

from kcache_cli.archive.export import PARALLEL_MIN_ENTRIES
from kcache_cli.archive.manifest import (
    MANIFEST_NAME,
    PATH_MAX,
    STAGING_NAME_ROOM,
    ArchiveRejected,
    ImportLimits,
    Manifest,
    PlannedEntry,
    check_proportion,
    is_lock_name,
    layout_names,
    layout_of,
    link_problem,
    parse_manifest,
    path_problem,
    path_too_long,
    records_from_json,
    reject,
    rejection_reason,
)
from kcache_cli.catalog.locate import known_caches
from kcache_cli.catalog.scan import detect_layouts, scan_cache
from kcache_cli.fs import delete as fsdelete
from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs import tarstream as ts
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.locking import EntryFlock, leftover_live
from kcache_cli.layouts.shapes import BY_NAME
from kcache_cli.model.records import BUILDING, COMPLETE, Entry, EntryKey, Keyed, ScanFilter, Warn
from kcache_cli.model.terms import ImportAction, unknown_layout
from kcache_cli.ops.verify import judge_entry
from kcache_cli.util import parallel
from kcache_cli.util.errors import KcacheError, LockTimeout, UsageError
from kcache_cli.util.progress import NO_PROGRESS, Progress
from kcache_cli.util.signing import verifier
from kcache_cli.util.units import plural


@dataclass(frozen=True)
class ImportedEntry(Keyed):
    """One archive entry and what import did with it (import, replace, skip...)."""

    key: EntryKey
    action: ImportAction
    done: bool  # published (False for skips and in a dry run)
    reason: str | None
    files: int
    size: int
    arch: str | None
    compiler: str | None
    platform: str | None
    lock_timed_out: bool = False  # skipped: another process held its lock past --lock-timeout

    def to_json(self, arch_ok: bool | None = None) -> dict:
        """An entry of `import --json`; `arch_ok`: whether its arch runs on this machine's GPU (None: unknown)."""
        layout, kind, target, space, op, hash_, relpath = self.key
        return {"layout": layout, "kind": kind, "target": target, "space": space, "op": op, "hash": hash_,
                "relpath": relpath, "action": self.action, "done": self.done, "reason": self.reason,
                "file_count": self.files, "size": self.size, "arch": self.arch, "arch_ok": arch_ok,
                "compiler": self.compiler, "platform": self.platform}


@dataclass(frozen=True)
class ImportResult:
    """What `kcache import` verified and published from one archive."""

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

    def count(self, action: ImportAction) -> int:
        return sum(1 for e in self.entries if e.action == action)

    @property
    def lock_timeouts(self) -> int:
        """Of the skipped entries, those whose lock another process held past the timeout (exit 3)."""
        return sum(1 for e in self.entries if e.lock_timed_out)

    @property
    def obstructed(self) -> tuple[ImportedEntry, ...]:
        """Of the skipped entries, those something in the cache stands in the way of (IN_THE_WAY: exit 1)."""
        return tuple(e for e in self.entries if e.action == "skip" and (e.reason or "").startswith(IN_THE_WAY))

    def to_json(self, gpus: tuple[tuple[int, int], ...] | None = None,
                arch_ok: Mapping[str, bool | None] | None = None) -> dict:
        """`import --json`: with this machine's GPUs' compute capabilities (None: none found, or not asked)
        and, per entry relpath, whether its layout's consumer uses its arch on them (gpu.arch_fit)."""
        return {"archive": self.archive, "root": self.root, "dry_run": self.dry_run,
                "archive_kcache_version": self.kcache_version, "imported": self.count("import"),
                "replaced": self.count("replace"), "skipped": self.count("skip"),
                "lock_timeouts": self.lock_timeouts, "file_count": self.files,
                "size": self.size, "gpu": [f"{a}.{b}" for a, b in gpus] if gpus else None,
                "entries": [e.to_json((arch_ok or {}).get(e.relpath)) for e in self.entries]}


# The reason of an entry skipped because something in the cache stands where it goes (a link or a file on
# its path, a directory that is not an entry at it): not imported, and not mended by importing again.
IN_THE_WAY = "in the way: "


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


def _present_entry(root: Path, rel: str, chains: dict) -> bool:
    """An entry directory at `rel` in the cache, reached without a symlink."""
    return _real_dir_chain(root, f"{rel}/x", chains) is None and os.path.isdir(os.path.join(root, rel))


def _check_records(records: list, offset: int, limits: ImportLimits) -> list[PlannedEntry]:
    """Each JSON record (record `offset` first) checked on its own (`records_from_json`), to be planned; one
    that says when its entry was last used keeps the archive's times (PlannedEntry.dir_times)."""
    return [PlannedEntry(i, r, dir_times=None if r.last_used is None else {})
            for i, r in enumerate(records_from_json(records, offset, limits), offset)]


def _plan(root: Path, planned: list[PlannedEntry], archive_relpaths: set[str]) -> None:
    """Decide each entry's action from the destination, and check every link against it."""
    existing = {p.relpath for p in planned if os.path.lexists(os.path.join(root, p.relpath))}
    found: dict[str, Entry] = {}
    if existing:
        layouts = tuple(sorted({p.layout for p in planned if p.relpath in existing}))
        found = {e.relpath: e for e in scan_cache(root, ScanFilter(layouts=layouts)).entries}
    chains: dict = {}

    def target_ok(rel: str) -> bool:  # a link's target entry is in the archive, or a real one in the cache
        return rel in archive_relpaths or _present_entry(root, rel, chains)

    room = PATH_MAX - 1 - len(os.fsencode(str(root))) - STAGING_NAME_ROOM
    for p in planned:
        for name, target in p.record.links.items():
            bad = link_problem(p.layout, p.kind, p.relpath, name, target, target_ok)
            if bad:
                raise reject(bad)
        too_long = path_too_long(p, room)
        if too_long:  # decided here, in a dry run too: a real import would fail to write it
            raise reject(f"{too_long} would be longer than the system's path limit ({PATH_MAX} bytes) in {root}")
        blocked = _real_dir_chain(root, p.relpath, chains)
        if blocked:
            p.action, p.reason, p.write = "skip", f"{IN_THE_WAY}{blocked}", False
            continue
        if p.relpath in existing:
            there = found.get(p.relpath)
            if there is not None and there.status != BUILDING:  # the one judgement, as verify's


                verdict = judge_entry(root, there, deep=True)
                there = _with(there, status=verdict.status, reason=verdict.reason)
            if there is None:
                p.action, p.reason = "skip", f"{IN_THE_WAY}something that is not an entry is there"
            elif there.status == COMPLETE:
                p.action, p.reason = "skip", "already present (complete)"
            elif there.status == BUILDING:
                p.action, p.reason = "skip", f"being built ({there.reason})"
            elif p.record.status != COMPLETE:
                p.action, p.reason = "skip", f"already present ({there.status})"
            else:
                p.action, p.reason = "replace", f"replaces a {there.status} entry ({there.reason})"
            p.write = p.action != "skip"


# ---- import: reading the archive ----------------------------------------------------------------

class _Staging:
    """Where an import extracts before publishing: <root>/.kcache/import-<pid>-<random>/, made 0700 by
    this process and checked to be its own after it is opened; removed (with any directory it had to
    create) when the import ends. Every write under it, and every publish from it, goes through
    descriptors held from the root (fswrite): a co-user who swaps .kcache/, the staging directory or
    an entry directory for a link makes the import fail, never write elsewhere."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dirs: set[str] = {""}
        self._last: tuple[str, int] | None = None  # the directory written to last: entries come file by file
        self.state_fd = self.fd = -1
        self.created: list[str] = fswrite.make_dirs(root) if not os.path.lexists(root) else []
        self.root_fd = fswrite.open_root(root)
        try:
            self._open(fswrite.token(4))
        except BaseException:
            self.close()
            raise

    def _open(self, token: str) -> None:
        made_state = not fswrite.lexists_at(self.root_fd, state.STATE_DIR)
        try:
            self.state_fd = state.open_state(self.root_fd, self.root, create=True)
        except state.UntrustedState as exc:
            raise KcacheError(exc.strerror or str(exc)) from None
        except OSError as exc:
            raise KcacheError(f"{exc.filename or self.root}: {exc.strerror or exc}") from None
        if made_state:
            self.created.append(os.path.join(self.root, state.STATE_DIR))
        for sub in ("locks", "trash"):  # where publishing writes
            if fswrite.lexists_at(self.state_fd, sub) and not _isdir_at(self.state_fd, sub):
                raise KcacheError(f"{self.root}/{state.STATE_DIR}/{sub} is not a directory "
                                  f"(kcache never writes through a symlink)")
        if str(self.root) in self.created:
            state.write_cachedir_tag(self.root)  # a root kcache makes is tagged: evidence that it is a cache
        self.name = f"import-{os.getpid()}-{token}"
        self.path = os.path.join(self.root, state.STATE_DIR, self.name)
        fswrite.mkdir_at(self.state_fd, self.name, 0o700)
        try:
            self.fd = os.open(self.name, fsread.DIR_FLAGS, dir_fd=self.state_fd)
        except OSError as exc:  # ELOOP, ENOTDIR, ENOENT: swapped or removed the moment it was made
            raise KcacheError(f"{self.path}: {exc.strerror}, right after kcache made it (another user?): "
                              "import stopped") from None
        why = fswrite.owner_problem(os.fstat(self.fd), self.path, private=True)
        if why:  # what was made is not what was opened: someone swapped it
            raise KcacheError(f"{why}: import stopped")
        # Held until cleanup: a prune sees a live import and leaves its staging alone (locking.leftover_live).

        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def dir_fd(self, rel: str) -> int:
        """The staged directory `rel` (made by ensure_dir), opened beneath the staging fd; do not close."""
        if not rel:
            return self.fd
        if self._last is not None and self._last[0] == rel:
            return self._last[1]
        fd = fswrite.open_dir(self.fd, rel)
        if self._last is not None:
            os.close(self._last[1])
        self._last = (rel, fd)
        return fd

    def fd_path(self, rel: str) -> str:
        """A path naming the staged `rel` through the held staging fd (for code that takes paths)."""
        return f"/proc/self/fd/{self.fd}/{rel}" if os.path.isdir(f"/proc/self/fd/{self.fd}") else \
            os.path.join(self.path, rel)

    def ensure_dir(self, rel: str) -> None:
        missing = []  # a loop, not recursion: names are at most MAX_NAME_DEPTH deep, but never trust that
        while rel not in self.dirs:
            missing.append(rel)
            parent = os.path.dirname(rel)
            if parent == rel:  # "/": names were checked to be relative; never loop on one that is not
                raise KcacheError(f"bad staging path {rel!r}")
            rel = parent
        for rel in reversed(missing):
            head, _, name = rel.rpartition("/")
            fswrite.mkdir_at(self.dir_fd(head), name, exist_ok=True)  # another worker may have made it
            self.dirs.add(rel)

    def new_file(self, rel: str, mode: int) -> int:
        """A new file at the staged `rel`, open for writing (its directory made by ensure_dir)."""
        head, _, name = rel.rpartition("/")
        return fswrite.create_excl(self.dir_fd(head), name, mode)

    def write(self, rel: str, data: bytes, mode: int) -> None:
        head, _, name = rel.rpartition("/")
        fswrite.write_file(self.dir_fd(head), name, data, mode)

    def symlink(self, rel: str, target: str) -> None:
        head, _, name = rel.rpartition("/")
        fswrite.symlink_at(target, self.dir_fd(head), name)

    def set_times(self, rel: str, mtime: float, atime: float | None = None) -> None:
        """The staged `rel` (a link itself, not what it names) gets these times (atime: its mtime)."""
        head, _, name = rel.rpartition("/")
        m = int(mtime * 1e9)
        fswrite.set_times_at(self.dir_fd(head), name, (m if atime is None else int(atime * 1e9), m))

    def copy(self, src: str, dst: str) -> None:
        shead, _, sname = src.rpartition("/")
        sfd = fswrite.open_dir(self.fd, shead)
        try:
            st = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
            dhead, _, dname = dst.rpartition("/")
            fswrite.copy_file_at(sfd, sname, self.dir_fd(dhead), dname, stat.S_IMODE(st.st_mode))
        finally:
            os.close(sfd)

    def close(self) -> None:
        if self._last is not None:
            os.close(self._last[1])
            self._last = None
        for fd in (self.fd, self.state_fd, self.root_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.state_fd = self.root_fd = -1

    def cleanup(self) -> None:
        fsdelete.remove_tree(self.state_fd, self.name, label=f"{state.STATE_DIR}/{self.name}")
        root_fd = os.dup(self.root_fd)
        self.close()
        try:
            for d in reversed(self.created):
                if d == str(self.root):  # a root that stayed empty goes, tag and all
                    fswrite.unlink_at(root_fd, state.CACHEDIR_TAG)
                    if not _rmdir(d):
                        state.write_cachedir_tag(self.root)
                elif d == os.path.join(self.root, state.STATE_DIR):
                    state.remove_made_state(root_fd)
                elif not _rmdir(d):
                    break
        finally:
            os.close(root_fd)


def _rmdir(path: str) -> bool:
    """rmdir a directory this import made above the root (empty directories only: nothing else can go)."""
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False


def _isdir_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


_ROOT, _DIR, _FILE, _LINK = 0, 1, 2, 3


def _expectations(planned: list[PlannedEntry]) -> dict[str, tuple]:
    """member name -> (entry, kind, size, check): what the manifest says it is, `kind` one of _ROOT,
    _DIR, _FILE, _LINK and `check` a file's sha256 or a link's target. Plain tuples, unpacked by name
    where read: an import makes one per member, and a NamedTuple costs that loop 10%."""
    expect: dict[str, tuple] = {}
    for p in planned:
        r = p.record
        rel = p.relpath + "/"
        expect[p.relpath] = (p, _ROOT, 0, "")
        for name in r.dirs:
            expect[rel + name] = (p, _DIR, 0, "")
        for name, (size, digest) in r.files.items():
            expect[rel + name] = (p, _FILE, size, digest)
        for name, target in r.links.items():
            expect[rel + name] = (p, _LINK, 0, target)
    return expect


def _unexpected(name: str, listed: dict) -> ArchiveRejected:
    if name == MANIFEST_NAME or name in listed:
        return reject(f"duplicate member {name!r}")
    bad = path_problem(name, "member name")
    if bad:
        return reject(bad)
    if is_lock_name(name):
        return reject(f"member {name!r} is named like a lock file (lock files are never shipped)")
    return reject(f"member {name!r} is not listed in the manifest (or not in its part)")


def _extract(reader, planned: list[PlannedEntry], staging: _Staging | None, limits: ImportLimits,
             abort: Callable[[], bool] = lambda: False) -> tuple[int, int]:
    """Read members until the end of `reader`: each one must be listed for `planned` (once), of the
    listed type, size and sha256. Files of entries to publish go into `staging`; the others are
    only hashed. Returns (files, bytes) read."""
    listed = _expectations(planned)
    expect = dict(listed)  # what has not come yet: each member takes itself out
    files = size = 0
    sha256 = hashlib.sha256
    dirs = staging.dirs if staging is not None else set()
    regular, max_member = ts.REGULAR, limits.max_member
    count = 0
    now = time.time()
    while True:
        m = reader.next()
        if m is None:
            break
        count += 1
        if count & 255 == 0 and abort():
            raise parallel.Aborted("import aborted")
        name = m.name
        x = expect.pop(name, None)
        if x is None:
            raise _unexpected(name, listed)
        entry, want, wsize, wdigest = x
        out = staging is not None and entry.write
        kind = m.type
        if kind == regular and want == _FILE:
            if m.size != wsize:
                raise reject(f"member {name!r} is {m.size} bytes, the manifest says {wsize}")
            if m.size > max_member:  # the manifest's sizes were checked; this is a second net
                raise reject(f"member {name!r} is over the limit of {max_member} bytes per file")
            if out and name.rpartition("/")[0] not in dirs:
                staging.ensure_dir(name.rpartition("/")[0])  # type: ignore[union-attr]
            kept = _kept_time(m.mtime, now, entry) if out and entry.dir_times is not None else None
            if _read_member(reader, m, staging if out else None, name, sha256, kept) != wdigest:
                raise reject(f"{name}: its sha256 differs from the manifest's (damaged or tampered with)")
            files += 1
            size += wsize
            continue
        if _extract_other(m, x, listed, expect, staging if out else None, now):  # a hard link: a file
            files += 1
            size += wsize
    _check_none_missing(expect)
    return files, size


def _kept_time(mtime: float, now: float, entry: PlannedEntry) -> float:
    """A member's mtime as import keeps it: one in the future (a clock ahead, or a lie) is now."""
    t = min(max(mtime, 0), now)
    if t > entry.newest:
        entry.newest = t
    return t


def _extract_other(m, x: tuple, listed: dict[str, tuple], expect: dict[str, tuple],
                   staging: _Staging | None, now: float) -> bool:
    """A member other than a listed regular file: checked against its listing `x` and, with
    `staging`, made there, with its mtime where the entry keeps the archive's times. True for a hard
    link (a copy of a file already read)."""
    name, kind = m.name, m.type
    entry, want, _, wdigest = x
    if kind not in (ts.REGULAR, ts.DIRECTORY, ts.SYMLINK, ts.HARDLINK):
        raise reject(f"member {name!r} is a {kind}")
    kept = _kept_time(m.mtime, now, entry) if staging is not None and entry.dir_times is not None else None
    if kind == ts.HARDLINK:
        _hardlink(m, x, listed, expect, staging)
        if staging is not None and kept is not None:
            staging.set_times(name, kept)
        return True
    expected = {_ROOT: ts.DIRECTORY, _DIR: ts.DIRECTORY, _FILE: ts.REGULAR, _LINK: ts.SYMLINK}[want]
    if kind != expected:
        raise reject(f"member {name!r} is a {kind}, the manifest says {expected}")
    if m.size:
        raise reject(f"{kind} member {name!r} carries data")
    if kind == ts.DIRECTORY:
        if staging is not None:
            staging.ensure_dir(name)
            if kept is not None:  # set once its contents are in (_finish_staging)
                entry.dir_times[name] = kept
    else:  # a symlink: its target was checked against the rules with the manifest
        if m.linkname != wdigest:
            raise reject(f"symlink {name!r} -> {m.linkname!r}, the manifest says -> {wdigest!r}")
        if staging is not None:
            staging.ensure_dir(name.rpartition("/")[0])
            staging.symlink(name, m.linkname)
            if kept is not None:
                staging.set_times(name, kept)
    return False


def _check_none_missing(expect: dict[str, tuple]) -> None:
    """Every file and symlink the manifest lists came (its directories are not checked here)."""
    for key, (_, kind, _, _) in expect.items():
        if kind in (_FILE, _LINK):
            raise reject(f"{key} is listed in the manifest but missing from the archive (truncated?)")


def _read_member(reader, m, staging: _Staging | None, name: str, sha256, mtime: float | None = None) -> str:
    """A file member's sha256, its bytes written to a new staged file `name` on the way (no staging: only
    hashed), then given `mtime` (as its atime too, so that a compiler's first read moves the atime) when
    not None."""
    data = reader.small_data(m)
    if staging is None:
        if data is not None:
            return sha256(data).hexdigest()
        h = sha256()
        for chunk in reader.data(m):
            h.update(chunk)
        return h.hexdigest()
    fd = staging.new_file(name, 0o755 if m.mode & 0o111 else 0o644)
    try:
        if data is not None:
            fswrite.write_all(fd, data)
            digest = sha256(data).hexdigest()
        else:
            h = sha256()
            for chunk in reader.data(m):
                h.update(chunk)
                fswrite.write_all(fd, chunk)
            digest = h.hexdigest()
        if mtime is not None:
            ns = int(mtime * 1e9)
            fswrite.set_times_fd(fd, (ns, ns))
        return digest
    finally:
        os.close(fd)


def _hardlink(m, x: tuple, listed: dict[str, tuple], expect: dict[str, tuple], staging: _Staging | None) -> None:
    """A hard link inside its own entry, to a file already read, becomes a copy of that file."""
    target = m.linkname.rstrip("/")
    entry, kind, size, digest = x
    t_entry, t_kind, t_size, t_digest = listed.get(target) or (None, None, None, None)
    if t_entry is not entry:
        raise reject(f"hard link {m.name!r} -> {m.linkname!r} points outside its entry")
    if kind != _FILE or t_kind != _FILE or target in expect:
        raise reject(f"hard link {m.name!r} -> {m.linkname!r} is not to a file read before it")
    if (t_size, t_digest) != (size, digest):
        raise reject(f"hard link {m.name!r}: the manifest gives it another size or sha256 than its target")
    if staging is not None:
        staging.ensure_dir(m.name.rpartition("/")[0])
        staging.copy(target, m.name)


@dataclass(frozen=True)
class _Region:
    """A part of the archive one worker reads: its byte range and the entries in it."""

    start: int
    length: int
    lo: int  # entries[lo:hi] live in this part
    hi: int
    last: bool


def _regions(manifest: dict, n_entries: int, file_size: int) -> list[_Region] | None:
    """Where each part of the body is, from the manifest's part sizes (the parts end the file). None
    when the manifest lists no parts, or parts that do not fit the file (an archive decompressed or
    compressed again on its way: the parts, concatenated, were one ordinary stream, and still are): the
    body is then read as one stream."""
    parts = manifest.get("parts")
    if parts is None:
        return None
    if not isinstance(parts, list) or not parts or len(parts) > 4096:
        raise reject("manifest.json has a malformed part list")
    sizes: list[int] = []
    counts: list[int] = []
    for p in parts:
        size, count = (p.get("size"), p.get("entries")) if isinstance(p, dict) else (None, None)
        if not (isinstance(size, int) and isinstance(count, int)) or isinstance(size, bool) \
                or isinstance(count, bool) or size < 0 or count < 0:
            raise reject("manifest.json has a malformed part list")
        sizes.append(size)
        counts.append(count)
    if sum(counts) != n_entries:
        raise reject("the manifest's parts do not add up to the archive")
    if sum(sizes) >= file_size:
        return None
    out, pos, lo = [], file_size - sum(sizes), 0
    for i, (size, count) in enumerate(zip(sizes, counts)):
        out.append(_Region(pos, size, lo, lo + count, i == len(sizes) - 1))
        pos += size
        lo += count
    return out


def _region_reader(fd: int, kind: str, start: int, length: int, counted, threaded: bool):
    return ts.TarReader(ts.region_source(fd, kind, start, length, counted, threaded))


def _head_fits(fd: int, kind: str, end: int, digest: str) -> bool:
    """Whether the bytes before the first part hold the manifest and nothing else (when not, the parts
    are not where the manifest says: the archive was compressed again)."""
    try:
        reader = _region_reader(fd, kind, 0, end, NO_PROGRESS.advance, False)
    except ts.TarFormatError:
        return False
    try:
        m = reader.next()
        if m is None or m.name != MANIFEST_NAME or m.type != ts.REGULAR:
            return False
        h = hashlib.sha256()
        for chunk in reader.data(m):
            h.update(chunk)
        return h.hexdigest() == digest and reader.next() is None and not reader.end_marker
    except ts.TarFormatError:
        return False
    finally:
        reader.close()


class _Extracted(NamedTuple):
    files: int  # read and verified
    size: int  # bytes of them
    planned: list[PlannedEntry]


def _extract_regions(fd: int, kind: str, regions: list[_Region], records: list, staging: _Staging | None,
                     root: Path, programs: set[str], limits: ImportLimits, advance, abort, threaded: bool
                     ) -> _Extracted:
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
                raise reject("an end-of-archive marker before the last part")
        finally:
            reader.close()
        if staging is not None:
            _finish_staging(staging, planned)
        files += f
        size += s
    return _Extracted(files, size, [p for planned in planned_by_region for p in planned])


# ---- import: publishing --------------------------------------------------------------------------

def _dest_parent(root_fd: int, root: Path, relpath: str) -> tuple[int, str]:
    """(a descriptor of the directory an entry is published into, made as needed beneath the root
    without following a link; the entry's name)."""
    try:
        return fswrite.open_parent(root_fd, relpath, create=True)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
            raise KcacheError(f"{root}/{relpath.rpartition('/')[0]} holds a symlink or a non-directory "
                              f"(kcache never writes through one)") from None
        raise


def _dest_entry(root: Path, p: PlannedEntry) -> Entry | None:
    """The entry at `p`'s place in the cache, with the status its deep judgement gives (None: none there)."""
    shape = layout_of(p.layout).kind_shape(p.kind)
    key = (shape.match(p.relpath) if shape else None) or {}
    space, op = key.get("space"), key.get("op")  # so that the scan reads only this entry's directories
    flt = ScanFilter(layouts=(p.layout,), kinds=(p.kind,), hash_prefixes=(p.relpath.split("/")[-1],),
                     spaces=(space,) if space else (), ops=(op,) if op else ())

    for e in scan_cache(root, flt).entries:
        if e.relpath == p.relpath:
            return e if e.status == BUILDING else _with(e, status=judge_entry(root, e, deep=True).status)
    return None


# What publishing one entry came to: (published, reason, whether its lock was held past the timeout). A plain
# tuple: one per entry travels back from the workers.
Published = tuple[bool, "str | None", bool]


def _publish(root: Path, p: PlannedEntry, staging: _Staging, lock_timeout: float, note: Warn,
             made: set[str]) -> Published:
    """Move one staged entry into place with one rename, under its lock (`note`: that it waits for it)."""
    dest = os.path.join(root, p.relpath)
    lock = EntryFlock(root, p.relpath)
    if not lock.acquire(0):
        note(f"waiting for the lock of {p.relpath} (a build in progress?)")
        if not lock.acquire(lock_timeout):
            return False, f"its lock was held (a build in progress?) for more than {lock_timeout:g}s", True
    trashed = None
    try:
        if os.path.lexists(dest):
            if p.action != "replace":
                return False, "already present (appeared during the import)", False
            busy = layout_of(p.layout).busy(dest)
            if busy:
                return False, f"being built ({busy})", False
            there = _dest_entry(root, p)
            if there is not None and there.status == COMPLETE:
                return False, "already present (completed during the import)", False
            p.replaced_use = there.last_used if there is not None else 0.0  # its last use stays, if newer
            trashed = f"{p.relpath.replace('/', '%2F')}-{fswrite.token(4)}"
            _to_trash(staging, p.relpath, trashed)
        # paths the entry records about itself (Triton's), rewritten through the held staging fd
        layout = layout_of(p.layout)
        times = _staged_times(staging, p.relpath) if p.dir_times is not None and layout.relocates else None
        layout.relocate(staging.fd_path(p.relpath), dest, root)
        if times:  # the files it rewrote (and the directory it rewrote them in) keep the archive's times
            for name, atime, mtime in reversed(times):
                if fswrite.lexists_at(staging.fd, name):
                    staging.set_times(name, mtime, atime)
        if not _move_in(staging, p.relpath, layout.writer_locks):
            return False, "already present (appeared during the import)", False
        elsewhere = None if layout.relocates else layout.landed_elsewhere(dest)
        return True, "; ".join(r for r in (p.reason, elsewhere) if r) or None, False
    finally:
        lock.release()
        if trashed:
            fsdelete.remove_under(root, f"{state.STATE_DIR}/trash/{trashed}")


def _staged_times(staging: _Staging, relpath: str) -> list[tuple[str, float, float]]:
    """(name, atime, mtime) of the staged entry `relpath` and of everything in it, each directory before
    what it holds (reversed: what it holds first)."""
    out: list[tuple[str, float, float]] = []
    todo = [relpath]
    while todo:
        rel = todo.pop()
        head, _, name = rel.rpartition("/")
        st = os.stat(name, dir_fd=staging.dir_fd(head), follow_symlinks=False)
        out.append((rel, st.st_atime, st.st_mtime))
        if stat.S_ISDIR(st.st_mode):
            fd = fswrite.open_dir(staging.fd, rel)
            try:
                todo += [f"{rel}/{n}" for n in sorted(os.listdir(fd))]
            finally:
                os.close(fd)
    return out


def _note_uses(root: Path, published: list[PlannedEntry]) -> None:
    """The last use each published entry's record gives (one in the future is now), or that of the incomplete
    entry it replaced when newer, noted in kcache's stamps (state.note_uses) where its files' restored times
    do not say it already: `ls --sort age` and a prune by age or size see the archive's uses, not the import."""
    now = time.time()
    uses = {}
    for p in published:
        if p.record.last_used is not None:
            when = max(min(p.record.last_used, now), p.replaced_use)
            if when > p.newest:
                uses[p.relpath] = when
    if uses:
        state.note_uses(root, uses)


def _move_in(staging: _Staging, relpath: str, locks: tuple[str, ...] = ()) -> bool:
    """Rename the staged entry to its place (no-replace), both ends held as directory fds; where they
    are on different filesystems, copy it beside its place first. False when something is there."""
    src_fd, name = fswrite.open_parent(staging.fd, relpath)
    try:
        _share_staged(staging, src_fd, name, locks)
        dst_fd, _ = _dest_parent(staging.root_fd, staging.root, relpath)
        try:
            try:
                rename_noreplace_at(src_fd, name, dst_fd, name)
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
            tmp = fswrite.temp_name(f"{state.TEMP_PREFIX}{name}-")
            fswrite.copy_tree_at(src_fd, name, dst_fd, tmp)
            _share_staged(staging, dst_fd, tmp, locks)
            try:
                rename_noreplace_at(dst_fd, tmp, dst_fd, name)
                return True
            except FileExistsError:
                fsdelete.remove_tree(dst_fd, tmp)
                return False
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


rename_noreplace_at = fswrite.rename_noreplace_at  # a name tests can replace to inject EXDEV


def _share_staged(staging: _Staging, src_fd: int, name: str, locks: tuple[str, ...] = ()) -> None:
    """The staged entry handed over before it is published (fswrite.hand_over_tree): in a group-shared
    root its directories the group's (a member must be able to prune what root's cron imported under
    umask 022), and its writer's lock files `locks` (its layout's writer_locks); root's import into a
    user's cache all the user's."""
    try:
        fd = os.open(name, fsread.DIR_FLAGS, dir_fd=src_fd)
    except OSError:
        return  # a file, or gone: the move says what is wrong
    try:
        fswrite.hand_over_tree(fd, os.fstat(staging.root_fd), locks)
    finally:
        os.close(fd)


def _to_trash(staging: _Staging, relpath: str, name: str) -> None:
    """Rename the entry at `relpath` to .kcache/trash/`name`, both reached from the root without
    following a link (a trash swapped for a symlink never receives an entry)."""
    trash = state.open_state(staging.root_fd, staging.root, "trash", create=True)
    try:
        parent, base = fswrite.open_parent(staging.root_fd, relpath)
        try:
            fswrite.rename_at(parent, base, trash, name)
        finally:
            os.close(parent)
    finally:
        os.close(trash)


def is_provider(layout: object, kind: object) -> bool:
    """Whether entries of this kind are used by others of their layout (Layout.provider_kinds): they are
    published first. Asked of JSON records before they are checked, too."""
    return layout in layout_names() and kind in layout_of(str(layout)).provider_kinds


def _provides(rec: dict) -> bool:
    """A JSON record (not checked yet) of an entry that others use."""
    return is_provider(rec.get("layout"), rec.get("kind"))


def _refuse_other_layout(root: Path, records: list[dict]) -> None:
    """An archive of one layout never goes into a root of another (other_layout_problem); a layout this
    kcache does not know is refused as such first, before any message names it."""
    for i, rec in enumerate(records):
        unknown = unknown_layout(rec.get("layout"))
        if unknown:
            raise reject(f"manifest entry {i}: {unknown}")
    why = other_layout_problem(root, {str(rec.get("layout")) for rec in records}, "the archive holds")
    if why:
        raise KcacheError(why)


def _refuse_unsigned(records: list[dict], relpaths: list[str]) -> None:
    """With a trust list set (kcache_cli/util/signing.py), an archive is taken only when a listed key
    signed every record in it, as pull takes only such records."""
    check = verifier()
    for rec, rel in zip(records, relpaths) if check is not None else ():
        why = check.problem(rec)  # type: ignore[union-attr]
        if why:
            raise KcacheError(f"entry {rel} of the archive: {why}")


def other_layout_problem(root: Path, brought_layouts: Iterable[str], holds: str = "the archive holds",
                         doing: str = "import it") -> str | None:
    """The rule import and pull share: entries of one layout never go into a root of another, where
    that compiler would never look (tilus programs/ inside a hidet cache); an empty or new root takes
    the entries' layout, and a directory that holds something else but no cache takes nothing (a
    KCACHE_DIR set to /dev or a project's folder must not fill with ops/ and .kcache/). Why
    `brought_layouts` cannot come into `root`, or None."""
    have = detect_layouts(root) if root.is_dir() else ()
    if not have:
        return _not_a_cache(root, set(brought_layouts), doing)
    brought = sorted(set(brought_layouts) - set(have))
    if not brought:
        return None

    where = dict(known_caches())
    homes = "".join(f"{name}'s cache is {where[name]}; " for name in brought if name in where)
    return (f"{holds} {' and '.join(brought)} entries but {root} is a {'/'.join(have)} cache, "
            f"where {' and '.join(brought)} never looks; {doing} into the {' and '.join(brought)} "
            f"cache with --cache-dir ({homes}`kcache dir --all` lists them)")


_OURS = frozenset({state.STATE_DIR, state.CACHEDIR_TAG})


def _not_a_cache(root: Path, brought: set[str], doing: str) -> str | None:
    """Why nothing may come into `root`, which holds no cache: it holds names none of the `brought`
    layouts' paths start with (a dot-name aside, and kcache's own). None for an empty or new root, one that
    cannot be listed (the import then says why), or one holding such a layout's emptied folders (ops/)."""
    try:
        names = sorted(set(os.listdir(root)) - _OURS)
    except OSError:
        return None
    shapes = [BY_NAME[name] for name in brought if name in BY_NAME]
    claimed = {n for shape in shapes for n in (*shape.tops(names), *shape.keeps)}
    foreign = [n for n in names if n not in claimed and not n.startswith(".")]
    if not foreign:
        return None
    more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
    return (f"{root} holds no kernel cache, yet is not empty ({foreign[0]!r}{more}): {doing} into an empty or "
            "new directory, or into the cache of its layout with --cache-dir (`kcache dir --all` lists them)")


def import_archive(root: Path, archive: str, *, dry_run: bool = False, limits: ImportLimits = ImportLimits(),
                   lock_timeout: float = 60.0, note: Warn | None = None, progress: Progress | None = None
                   ) -> ImportResult:
    """Verify `archive` completely, then publish its entries into `root` (see the module doc).

    Staged then published: every member is checked while it is extracted into a staging directory
    inside the root; nothing is published unless the whole archive is valid. The parts of a big
    archive are read by forked workers, each from its own offset."""
    root = Path(os.path.realpath(root))
    archive = os.path.abspath(archive)
    if os.path.lexists(root) and not root.is_dir():
        raise KcacheError(f"{root} is not a directory")
    raw = open_archive(archive)
    importer = Importer(root, raw, dry_run, limits, lock_timeout, note or (lambda m: None), progress)
    with raw:
        try:
            importer.run()
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            raise KcacheError(f"import failed: {exc.strerror or exc}{where}") from None
        finally:
            if importer.staging is not None:
                importer.staging.cleanup()
    results = importer.results()
    if not dry_run and any(r.done for r in results):
        _remove_stale_staging(root)
    return ImportResult(archive, str(root), dry_run, _str(importer.manifest.header.get("kcache_version")),
                        tuple(results), importer.files, importer.size)


def open_archive(archive: str) -> BinaryIO:
    """The archive file the user named (through a link), open for reading: a FIFO, a device or a directory
    is refused at once (a FIFO nobody writes would block the open), as a path that is not there."""
    try:
        fd, _ = fsread.open_regular(archive, follow=True)
    except (FileNotFoundError, NotADirectoryError, fsread.NotRegularFile) as exc:  # the command line's mistake
        raise UsageError(f"cannot read {archive}: {exc.strerror}") from None
    except OSError as exc:
        raise KcacheError(f"cannot read {archive}: {exc.strerror}") from None
    return os.fdopen(fd, "rb")


def archive_layouts(archive: str, limits: ImportLimits = ImportLimits()) -> tuple[str, ...]:
    """The layouts of the entries `archive`'s manifest lists (sorted), read from its first member only:
    where `import` without --cache-dir puts them. () when it cannot be read (import then says why)."""
    try:
        records = archive_records(archive, limits)
    except KcacheError:
        return ()
    return tuple(sorted({str(rec.get("layout")) for rec in records}))


def archive_records(archive: str, limits: ImportLimits = ImportLimits()) -> list[dict]:
    """The entry records of `archive`'s manifest (its first member only; nothing else is read)."""
    try:
        with open_archive(archive) as raw:
            reader = ts.TarReader(ts.open_source(raw, NO_PROGRESS.advance)[0])
            try:
                head = reader.next()
                if head is None or head.name != MANIFEST_NAME or head.size > limits.max_manifest:
                    raise KcacheError(f"{archive}: no {MANIFEST_NAME} first: not an archive kcache exported")
                man = parse_manifest(b"".join(reader.data(head)), limits)
            finally:
                reader.close()
    except (OSError, ts.TarFormatError, ValueError) as exc:
        raise KcacheError(f"{archive}: {getattr(exc, 'strerror', None) or exc}") from None
    return [r for r in man.records if isinstance(r, dict)]


class Importer:
    """One import: reads the manifest, plans and extracts every entry (phase one, in workers), publishes
    the entries others use (here, between the phases), then the rest (phase two, in the same workers)."""

    def __init__(self, root: Path, raw, dry_run: bool, limits: ImportLimits, lock_timeout: float, note: Warn,
                 progress: Progress | None) -> None:
        self.root, self.raw, self.dry_run, self.limits = root, raw, dry_run, limits
        self.lock_timeout, self.note, self.progress = lock_timeout, note, progress
        self.staging: _Staging | None = None
        self.manifest = Manifest({}, [], [], [])
        self.providers: set[str] = set()  # relpaths of the entries others use: links may point at them
        self.mine: dict[int, list[PlannedEntry]] = {}  # what each worker planned, for its phase two
        self.made: set[str] = set()
        self.outcome: dict[int, Published] = {}  # entry index -> (published, reason, lock timed out)
        self.decisions: dict[int, tuple[ImportAction, str | None, bool]] = {}  # entry index -> (action, reason, write)
        self.files = self.size = 0
        self.reader: Any = None
        self.kind = ""
        self.region_groups: list = []

    def run(self) -> None:
        file_size = os.fstat(self.raw.fileno()).st_size
        if self.progress:
            self.progress.start(file_size)
        try:
            source, self.kind = ts.open_source(self.raw, (self.progress or NO_PROGRESS).advance)
            self.reader = ts.TarReader(source)
            n, first = self._read_manifest(file_size)
            writing = self.staging is not None and not self.dry_run
            counts, published = parallel.run_phased(n, first, self.progress, self._between if writing else None,
                                             self._second if writing else None)
        except ts.TarFormatError as exc:
            raise reject(str(exc)) from None
        finally:
            if self.reader is not None:
                self.reader.close()
        self.files, self.size = sum(c.files for c in counts), sum(c.size for c in counts)
        self.decisions = {i: (action, reason, write) for c in counts for i, action, reason, write in c.decisions}
        for batch in published:
            self.outcome.update((i, (done, why, locked)) for i, done, why, locked in batch)

    def _read_manifest(self, file_size: int) -> tuple[int, Callable]:
        """Read and check the manifest; make the staging directory; (workers, phase one)."""
        reader, limits = self.reader, self.limits
        assert reader is not None
        head = reader.next()
        if head is None and not reader.end_marker:  # a zstd frame cut short decompresses to nothing at all
            raise reject("the archive is truncated: it ends before its first member")
        if head is None or head.name != MANIFEST_NAME or head.type != ts.REGULAR:
            raise reject("its first member is not manifest.json (not a kcache archive?)")
        if head.size > limits.max_manifest:
            raise reject(f"manifest.json is {head.size} bytes, over the limit of {limits.max_manifest}")
        scale = file_size if stat.S_ISREG(os.fstat(self.raw.fileno()).st_mode) else None
        check_proportion(head.size, scale, limits)
        data = b"".join(reader.data(head))
        self.manifest = man = parse_manifest(data, limits, scale)
        _refuse_other_layout(self.root, man.records)
        _refuse_unsigned(man.records, man.relpaths)
        regions = _regions(man.header, len(man.records), file_size)
        if regions is not None and not _head_fits(self.raw.fileno(), self.kind, regions[0].start,
                                                  hashlib.sha256(data).hexdigest()):
            regions = None  # compressed again on its way: one stream, read on from the manifest
        if regions is not None:
            reader.close()  # the parts are read from their own offsets
        self.providers = {rel for rec, rel in zip(man.records, man.relpaths) if _provides(rec)}
        if not self.dry_run and man.records:
            absent = [t for rel, t in zip(man.relpaths, man.totals) if not os.path.lexists(self.root / rel)]
            _check_space(self.root, sum(absent))
            self.staging = _Staging(self.root)
        if regions is None:  # one stream: read on from the manifest, here
            return 1, self._first_stream
        n = min(parallel.cpus(), len(regions)) if len(man.records) >= PARALLEL_MIN_ENTRIES else 1
        self.region_groups = parallel.split(regions, n)
        return n, self._first_regions

    def _first_stream(self, w: int, advance, abort) -> _PhaseOne:
        planned = _check_records(self.manifest.records, 0, self.limits)
        _plan(self.root, planned, self.providers)
        files, size = _extract(self.reader, planned, self.staging, self.limits, abort)
        if self.staging is not None:
            _finish_staging(self.staging, planned)
        self.mine[w] = planned
        return _PhaseOne(files, size, _decisions(planned))

    def _first_regions(self, w: int, advance, abort) -> _PhaseOne:
        got = _extract_regions(self.raw.fileno(), self.kind, self.region_groups[w], self.manifest.records,
                               self.staging, self.root, self.providers, self.limits, advance, abort, True)
        self.mine[w] = got.planned
        return _PhaseOne(got.files, got.size, _decisions(got.planned))

    def _publish(self, ps: list[PlannedEntry]) -> list[tuple[int, bool, str | None, bool]]:
        """(entry index, *Published) of each; plain tuples: they travel back from the workers. Then the last
        use each record gives is noted for those published (_note_uses)."""
        assert self.staging is not None
        out = [(p.index, *_publish(self.root, p, self.staging, self.lock_timeout, self.note, self.made)) for p in ps]
        _note_uses(self.root, [p for p, (_, done, _, _) in zip(ps, out) if done])
        return out

    def _between(self, results: list[_PhaseOne]) -> None:
        """The entries others use first (a tilus script links to its programs)."""
        decided = {i: (action, reason, write) for r in results for i, action, reason, write in r.decisions}
        todo = []
        for i, rec in enumerate(self.manifest.records):
            if _provides(rec) and decided[i][2]:
                p = _check_records([rec], i, self.limits)[0]
                p.action, p.reason, p.write = decided[i]
                todo.append(p)
        self.outcome.update((i, (done, why, locked)) for i, done, why, locked in self._publish(todo))

    def _second(self, w: int) -> list[tuple[int, bool, str | None, bool]]:
        return self._publish([p for p in self.mine.get(w, ()) if p.write and not is_provider(p.layout, p.kind)])

    def results(self) -> list[ImportedEntry]:
        out = []
        for i, rec in enumerate(self.manifest.records):  # all checked by the workers
            action, reason, write = self.decisions[i]
            done, reason, locked = self.outcome.get(i, (False, reason, False))
            if write and not self.dry_run and not done:
                action = "skip"
            out.append(_imported(rec, self.manifest.totals[i], action, done, reason, locked))
        return sorted(out, key=lambda r: r.relpath)


def _imported(rec: dict, size: int, action: ImportAction, done: bool, reason: str | None,
              locked: bool) -> ImportedEntry:
    """The result line of a JSON record the workers checked, read from the JSON: an EntryRecord built
    again here, in the one process, would cost each entry as much as a tenth of its import."""
    relpath = rec["relpath"]
    key = EntryKey(rec["layout"], rec["kind"], _str(rec.get("target")), _str(rec.get("space")),
                   _str(rec.get("op")), relpath.rsplit("/", 1)[-1], relpath)
    return ImportedEntry(key, action, done, reason, len(rec["files"]), size, _str(rec.get("arch")),
                         _str(rec.get("compiler")), _str(rec.get("platform")), locked)


# What a worker decided for one entry: (its index in the manifest, action, reason, write). A plain
# tuple: one per entry is pickled back from the workers, and a NamedTuple pickles three times slower.
Decision = tuple[int, ImportAction, "str | None", bool]


class _PhaseOne(NamedTuple):
    """What a worker sends back from phase one."""

    files: int  # read and verified
    size: int  # bytes of them
    decisions: list[Decision]


def _decisions(planned: list[PlannedEntry]) -> list[Decision]:
    return [(p.index, p.action, p.reason, p.write) for p in planned]


_STAGING_NAME = re.compile(r"^import-(\d+)-[0-9a-f]+$")


def _remove_stale_staging(root: Path) -> None:
    """Staging directories of imports that were killed: no import holds their flock, and (made by an
    older kcache without one) no live process of that pid here for a day. Removed fd-relative."""
    try:
        fd = fsdelete.open_under(root, state.STATE_DIR)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            if _STAGING_NAME.match(name) and leftover_live(fd, name) is False:
                fsdelete.remove_tree(fd, name, label=f"{state.STATE_DIR}/{name}")
    except OSError:
        pass
    finally:
        os.close(fd)


def _finish_staging(staging: _Staging, planned: list[PlannedEntry]) -> None:
    """Directories that came without a member, and the lock files, as new empty files."""
    for p in planned:
        if not p.write:
            continue
        staging.ensure_dir(p.relpath)
        for name in p.record.dirs:
            staging.ensure_dir(f"{p.relpath}/{name}")
        for name in p.record.locks:
            staging.ensure_dir(f"{p.relpath}/{name}".rpartition("/")[0])
            os.close(staging.new_file(f"{p.relpath}/{name}", 0o666))  # the umask applies: shared caches
        if p.dir_times is not None:
            _keep_dir_times(staging, p, p.dir_times)


def _keep_dir_times(staging: _Staging, p: PlannedEntry, times: dict[str, float]) -> None:
    """The archive's mtimes on the staged entry's directories, deepest first, once nothing more is made in
    them; its lock files (made here) and any directory that came without a member take the entry's own."""
    top = times.get(p.relpath)
    if top is None:  # an archive without the entry's directory member: its files' times are all there is
        return
    for name in p.record.locks:
        staging.set_times(f"{p.relpath}/{name}", top)
    names = [p.relpath, *(f"{p.relpath}/{d}" for d in p.record.dirs)]
    for name in sorted(names, key=lambda n: n.count("/"), reverse=True):
        staging.set_times(name, times.get(name, top))


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
        raise KcacheError(f"not enough space in {root}: the entries need {need} bytes, {free} are free")


# ---- entry by entry: the same rules for importers other than the archive reader (kcache pull) ----

ImportStaging = _Staging  # <root>/.kcache/import-<pid>-<random>/: where entries are written before publishing


def plan_records(root: Path, records: list[dict], limits: ImportLimits = ImportLimits(),
                 targets: Iterable[str] = ()) -> tuple[list[PlannedEntry], list[tuple[int, str]]]:
    """Every rule import applies to a manifest entry — its path and key fields, file names, sizes and
    digests, links (where its layout allows one out of the entry, to one of `targets` (relpaths) or
    an entry in the cache: a tilus script's program) — then
    import's plan against `root` (a complete entry present is skipped, an incomplete one replaced).

    Unlike an archive, records are judged one by one: a record that breaks a rule is refused alone,
    as (its index, one-line reason), and the others are planned."""
    root = Path(os.path.realpath(root))
    good: list[PlannedEntry] = []
    refused: list[tuple[int, str]] = []
    for i, rec in enumerate(records):
        try:
            good.append(_check_records([rec], i, limits)[0])
        except ArchiveRejected as exc:
            refused.append((i, rejection_reason(exc)))
    seen: dict[str, PlannedEntry] = {}
    for p in sorted(good, key=lambda p: p.relpath):
        clash = seen.get(p.relpath) or next((seen[a] for a in _ancestors(p.relpath) if a in seen), None)
        if clash is not None:
            refused.append((p.index, f"entry {p.relpath} clashes with entry {clash.relpath}"))
        else:
            seen[p.relpath] = p
    wanted = set(targets)
    chains: dict = {}

    def target_ok(rel: str) -> bool:
        return rel in wanted or _present_entry(root, rel, chains)

    ok = []
    for p in seen.values():
        bad = next(filter(None, (link_problem(p.layout, p.kind, p.relpath, n, t, target_ok)
                                 for n, t in p.record.links.items())), None)
        (refused.append((p.index, bad)) if bad else ok.append(p))
    _plan(root, ok, wanted)
    ok.sort(key=lambda p: p.index)
    return ok, sorted(refused)


def _ancestors(relpath: str) -> list[str]:
    parts = relpath.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts))]


def publish_staged(root: Path, planned: PlannedEntry, staging: _Staging, lock_timeout: float = 60.0,
                   note: Warn | None = None, made: set[str] | None = None) -> Published:
    """Publish one entry whose files are under `staging.path/<relpath>/` exactly as import does: its
    directories and empty lock files added, then one rename (no-replace) under the entry's lock.
    Returns (published, reason, whether its lock was held past `lock_timeout`). `root` must be a real
    path (no symlink on the way), as ImportStaging's root is."""
    _finish_staging(staging, [planned])
    return _publish(root, planned, staging, lock_timeout, note or (lambda m: None), made if made is not None else set())


def in_the_way(result: ImportResult, command: str) -> KcacheError:
    """The error an import or pull (`command`) ends with, the rest published, when something in the cache
    stands where entries go (ImportResult.obstructed): exit 1, for a person to look at, since importing
    again changes nothing; a CI step that imported nothing of them must not pass."""
    blocked = result.obstructed
    first = blocked[0]
    return KcacheError(f"{plural(len(blocked), 'entry')} not {command}ed, something in {result.root} in the way: "
                       f"{first.relpath}: {(first.reason or '')[len(IN_THE_WAY):]}"
                       f"{'' if len(blocked) == 1 else ' (and others: see --json)'}")


def held_locks(n: int, lock_timeout: float, command: str) -> LockTimeout:
    """The error an import or pull (`command`) ends with, the rest published, when it skipped `n` entries
    because another process (a build) held their lock past `lock_timeout`: exit 3, as build's."""
    its, it = ("its", "it") if n == 1 else ("their", "them")
    return LockTimeout(f"{plural(n, 'entry')} not {command}ed: {its} lock was held for more than {lock_timeout:g}s "
                       f"(a build in progress?); {command} again to bring {it} in")


def check_total(root: Path, need: int, limits: ImportLimits = ImportLimits()) -> None:
    """Import's bounds on what a whole import writes: the total limit, then the free space."""
    if need > limits.max_total:
        raise KcacheError(f"the selected entries would expand to {need} bytes, over the limit of {limits.max_total}")
    _check_space(Path(os.path.realpath(root)), need)


def remove_stale_staging(root: Path) -> None:
    """Staging directories that killed imports (or pulls) left behind a day ago."""
    _remove_stale_staging(Path(os.path.realpath(root)))
