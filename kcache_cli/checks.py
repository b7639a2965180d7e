"""Deep checks shared by the layouts: file listings, checksums against a manifest."""

from __future__ import annotations

import os
from pathlib import Path


def list_files(path: str) -> tuple:
    """Every file and symlink under `path` as FileInfo (name relative to `path`, size, link target)."""
    from kcache_cli.model import FileInfo

    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for n in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, path)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            link = os.readlink(full) if os.path.islink(full) else None
            out.append(FileInfo(rel, st.st_size, link))
    return tuple(out)


def sha256_file(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_manifest(path: str, manifest: str, files: dict) -> list[str]:
    """Problems found comparing files under `path` with a {name: {size, sha256}} map."""
    problems = []
    for name, rec in sorted(files.items()):
        full = os.path.normpath(os.path.join(path, name))
        if not isinstance(rec, dict) or os.path.isabs(name) or ".." in Path(name).parts:
            problems.append(f"{manifest}: bad record for {name!r}")
            continue
        try:
            size = os.lstat(full).st_size
        except OSError:
            problems.append(f"{name} is missing ({manifest} lists it)")
            continue
        if rec.get("size") is not None and size != rec["size"]:
            problems.append(f"{name} is {size} bytes, {manifest} says {rec['size']}")
        elif rec.get("sha256"):
            try:
                digest = sha256_file(full)
            except OSError as exc:
                problems.append(f"cannot read {name}: {exc.strerror}")
                continue
            if digest != rec["sha256"]:
                problems.append(f"{name} sha256 {digest[:16]}... differs from {manifest}")
    return problems


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def read_json(path: str | os.PathLike) -> dict | None:
    """The JSON object in the file at `path`, or None when it is missing, unreadable, not JSON or not an
    object (the one JSON-or-None reader: every caller treats all of those alike)."""
    import json

    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
    import struct

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
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


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


def unreadable(path: str) -> str | None:
    """Why a file cannot be read by the people using the cache, or None. Root reads mode 000 files
    anyway, so a file nobody may read counts as unreadable whoever runs kcache."""
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return None  # missing: the caller's rules say what that means
    if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o444:
        return f"{os.path.basename(path)} is unreadable (mode {stat.S_IMODE(st.st_mode):03o}: permission denied)"
    if not os.access(path, os.R_OK):
        return f"{os.path.basename(path)} is unreadable (permission denied)"
    return None


def read_every_byte(path: str) -> str | None:
    """Read every file under `path` to the end (links are not followed). Returns why one could not be
    read: a permission problem says 'unreadable', any other error is the caller's corruption."""
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for n in sorted(filenames):
            full = os.path.join(dirpath, n)
            if os.path.islink(full):
                continue
            why = unreadable(full)
            if why:
                return why.replace(n, os.path.relpath(full, path), 1)
            try:
                with open(full, "rb") as f:
                    while f.read(1 << 20):
                        pass
            except PermissionError:
                return f"{os.path.relpath(full, path)} is unreadable (permission denied)"
            except OSError as exc:
                return f"cannot read {os.path.relpath(full, path)}: {exc.strerror}"
    return None


def listing_or_unreadable(ctx, path: str, out: list, **fields) -> list[os.DirEntry]:
    """A directory's entries, sorted. One that cannot be read becomes one `unreadable` entry in `out`
    (with `fields`: layout, kind, target, space, op): the entries in it cannot be counted one by one,
    but they are not dropped from the counts either. Nothing deletes such an entry."""
    from kcache_cli.model import UNREADABLE, TreeUsage

    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda d: d.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        ctx.warn(f"cannot read {path}: {exc.strerror}")
        try:
            mtime = os.lstat(path).st_mtime
        except OSError:
            mtime = 0.0
        out.append(ctx.entry(path=path, usage=TreeUsage(0, 0, mtime), hash="", status=UNREADABLE,
                             reason=f"cannot read the directory {ctx.rel(path)}: {exc.strerror}; its entries "
                                    "are not counted one by one", **fields))
        return []
