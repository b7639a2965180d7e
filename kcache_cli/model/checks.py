"""Deep checks shared by the layouts: file listings, checksums against a manifest."""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from kcache_cli.fs import dirnames
from kcache_cli.fs import read as fsread
from kcache_cli.model.records import UNREADABLE, FileInfo, TreeUsage

if TYPE_CHECKING:
    from kcache_cli.fs.entrydir import EntryDir


def list_files(path: str, warn=None) -> tuple:
    """Every file and symlink under `path` as FileInfo (name relative to `path`, size, link target).

    Iterative, never following links, at most fsread.MAX_TREE_DEPTH directories deep: a deeper
    tree lists what came before and, with `warn`, says so."""
    out = []
    try:
        for name, st, link in fsread.walk_files(path):
            out.append(FileInfo(name, st.st_size, link))
    except fsread.TreeTooDeep as exc:
        if warn is not None:
            warn(f"{exc.strerror}: the files below are not listed")
    except OSError as exc:
        if warn is not None and exc.errno != errno.ENOENT:
            warn(f"cannot list {exc.filename or path}: {exc.strerror}")
    return tuple(out)


def sha256_file(path: str) -> str:
    """sha256 of a regular file, streamed (fsread: no link, FIFO or device is read)."""
    return fsread.sha256_file(path)


def check_manifest(d: EntryDir, manifest: str, files: dict) -> list[str]:
    """Problems found comparing the files in the entry held as `d` with a {name: {size, sha256}} map."""
    problems = []
    for name, rec in sorted(files.items()):
        if not isinstance(rec, dict) or os.path.isabs(name) or ".." in Path(name).parts:
            problems.append(f"{manifest}: bad record for {name!r}")
            continue
        name = os.path.normpath(name)
        try:
            size = d.lstat(name).st_size
        except OSError:
            problems.append(f"{name} is missing ({manifest} lists it)")
            continue
        if rec.get("size") is not None and size != rec["size"]:
            problems.append(f"{name} is {size} bytes, {manifest} says {rec['size']}")
        elif rec.get("sha256"):
            try:
                digest = d.sha256(name)
            except OSError as exc:
                problems.append(f"cannot read {name}: {exc.strerror}")
                continue
            if digest != rec["sha256"]:
                problems.append(f"{name} sha256 {digest[:16]}... differs from {manifest}")
    return problems


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    """A text file, cut at `limit` bytes, or None (missing, or not a regular file: fsread)."""
    return fsread.read_text(path, limit)


def size_mismatch(manifest: str, listed: object, names: dict[str, int]) -> str | None:
    """The first top-level file whose size disagrees with a {name: {size, ...}} manifest map."""
    if not isinstance(listed, dict):
        return f"{manifest} is malformed"
    for name, rec in sorted(listed.items()):
        if not isinstance(rec, dict):
            return f"{manifest} is malformed"
        if "/" in name:
            continue  # nested files are checked by inspect/verify
        if name not in names:
            return f"{name} is missing ({manifest} lists it)"
        if rec.get("size") is not None and names[name] != rec["size"]:
            return f"{name} is {names[name]} bytes, {manifest} says {rec['size']}"
    return None


def elf_truncated(name: str, head: bytes, size: int) -> str | None:
    """A cheap check on a compiled binary: its ELF header (the first 64 bytes) says how long the file
    must at least be (the section header table comes last). Returns a reason, or None if it looks whole."""
    if head[:4] != b"\x7fELF" or len(head) < 52:
        return f"{name} is not an ELF file" if len(head) >= 4 or size >= 4 else f"{name} is truncated: {size} bytes"
    endian = "<" if head[5] == 1 else ">"
    if head[4] == 2:
        if len(head) < 64:
            return f"{name} is truncated: {size} bytes"
        shoff, = struct.unpack_from(endian + "Q", head, 0x28)
        shentsize, shnum = struct.unpack_from(endian + "HH", head, 0x3A)
    else:
        shoff, = struct.unpack_from(endian + "I", head, 0x20)
        shentsize, shnum = struct.unpack_from(endian + "HH", head, 0x2E)
    need = shoff + shentsize * shnum
    if need > size:
        return f"{name} is truncated: {size} bytes, its ELF header needs {need}"
    return None


def read_head(path: str, n: int = 64) -> bytes:
    """The first `n` bytes of a regular file, b"" when it cannot be read (fsread)."""
    return fsread.read_head(path, n)


def changed_since(mtimes: dict[str, float] | None, marker: str, names=None) -> bool:
    """Whether any of `names` (default: every file) was modified at or after `marker` was written.

    `ls` reads a file's contents (an ELF header, a manifest) only for entries where this is true:
    an entry untouched since its completion marker (hidet's func_types.pickle, a manifest) cannot have
    been truncated or edited since, and reading one block per entry of a cold 100,000-entry cache
    costs more than the whole scan. Unknown times, or no marker, mean "changed"."""
    if mtimes is None or marker not in mtimes:
        return True
    limit = mtimes[marker]
    return any(mtimes.get(n, limit) >= limit for n in (names if names is not None else mtimes) if n != marker)


def not_regular(name: str, mode: int, consumer: str, *, linked: bool = False) -> str | None:
    """Why the file `name` of an entry (its lstat's `mode`) leaves the entry unjudged: a symlink, FIFO,
    device or socket where the `consumer` opens one of its files. kcache never opens one (no link is
    followed, no FIFO waited on, no device read), so it cannot tell what the consumer would get: the entry
    is `unreadable`, never complete nor broken, and never removed (DESIGN 2.8). None for a regular file
    or a directory. `linked`: `name` is a symlink the consumer follows and `mode` the stat of what it
    leads to (a link to a regular file is judged through it; the reason says it is a link)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    does = "follows it" if stat.S_ISLNK(mode) else "opens it"
    what = f"a symlink to {fsread.kind_of(mode)}" if linked else fsread.kind_of(mode)
    return f"{name} is {what}, not a regular file ({consumer} {does}; kcache never does)"


def first_not_regular(d: EntryDir, names, consumer: str, *, follow: bool = False) -> str | None:
    """not_regular's reason for the first of `names` (files of the entry held as `d`, by lstat: as listed,
    no link followed) that is a symlink, FIFO, device or socket; None when all are regular (or gone).
    `follow`: the consumer follows links, so a symlink is judged by what it leads to, from `d` (a dangling
    one is passed over: the caller's rule for a missing file says what it is)."""
    for name in sorted(names):
        try:
            st = d.lstat(name)
            linked = follow and stat.S_ISLNK(st.st_mode)
            why = not_regular(name, d.stat(name).st_mode if linked else st.st_mode, consumer, linked=linked)
        except (OSError, ValueError):  # gone, or a name no file can have (a NUL in a path a record gives)
            continue
        if why:
            return why
    return None


def unreadable(path: str) -> str | None:
    """Why a file cannot be read by the people using the cache, or None. Root reads mode 000 files
    anyway, so a file nobody may read counts as unreadable whoever runs kcache. (A judgement asks its
    EntryDir instead: `d.unreadable(name)`, the same rule through the entry's fd.)"""
    try:
        st = os.stat(path)
    except OSError:
        return None  # missing: the caller's rules say what that means
    if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o444:
        return f"{os.path.basename(path)} is unreadable (mode {stat.S_IMODE(st.st_mode):03o}: permission denied)"
    if stat.S_ISREG(st.st_mode) and st.st_uid == fsread.EUID and st.st_mode & 0o400:
        return None  # the owner reads by its mode bits alone (an ACL never narrows the owner's)
    if not os.access(path, os.R_OK):
        return f"{os.path.basename(path)} is unreadable (permission denied)"
    return None


def read_every_byte(d: EntryDir, caller_reads: bool = False) -> str | None:
    """Read every file in the entry held as `d` to the end (links are not followed, FIFOs and devices
    are never opened: fsread). Returns why one could not be read: a permission problem says
    'unreadable', any other error is the caller's corruption. With `caller_reads` (export, which reads
    every byte itself right after), each file is only checked to be readable by its mode."""
    try:
        for rel, _st, link in d.walk_files():
            if link is not None:
                continue
            why = d.unreadable(rel)
            if why:
                return why.replace(rel.rpartition("/")[2], rel, 1)
            if caller_reads:
                continue
            try:
                for _ in d.iter_chunks(rel):
                    pass
            except PermissionError:
                return f"{rel} is unreadable (permission denied)"
            except OSError as exc:
                return f"cannot read {rel}: {exc.strerror or exc}"
    except fsread.TreeTooDeep as exc:
        return f"{os.path.basename(d.path)}: {exc.strerror}"
    return None


def listing_or_unreadable(ctx, path: str, out: list, **fields) -> list[os.DirEntry]:
    """A directory's entries, sorted. One that cannot be read becomes one
    `unreadable` entry in `out` (with `fields`: layout, kind, target, space, op): the entries in it
    cannot be counted one by one, but they are not dropped from the counts either. Nothing deletes
    such an entry."""
    try:
        return fsread.sorted_entries(path)
    except OSError as exc:
        _unreadable_listing(ctx, path, exc, out, fields)
        return []


def subdirs_or_unreadable(ctx, path: str, out: list, prefixes: tuple[str, ...] = (), **fields) -> list[str]:
    """listing_or_unreadable's real subdirectories, by name (sorted), from the listing the cache keeps
    while the directory is unchanged (fs/dirnames.py): no object per name. With `prefixes`, only the names
    that start with one, each then lstat'ed (an entry named by its hash prefix: one op directory holds
    thousands)."""
    try:
        kept = dirnames.of(ctx.root)
        return kept.subdirs_starting(path, prefixes) if prefixes else kept.subdirs(path)
    except OSError as exc:
        _unreadable_listing(ctx, path, exc, out, fields)
        return []


def _unreadable_listing(ctx, path: str, exc: OSError, out: list, fields: dict) -> None:
    """One `unreadable` entry in `out` for the directory `path` that could not be listed (`exc`)."""
    ctx.warn(f"cannot read {path}: {exc.strerror}")
    try:
        mtime = os.lstat(path).st_mtime
    except OSError:
        mtime = 0.0
    out.append(ctx.entry(path=path, usage=TreeUsage(0, 0, mtime), hash="", status=UNREADABLE,
                         reason=f"cannot read the directory {ctx.rel(path)}: {exc.strerror}; its entries "
                                "are not counted one by one", **fields))
