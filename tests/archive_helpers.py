"""Building archives by hand (with Python's tarfile, independent of kcache's writer) and taking a
full picture of a directory tree, for the export/import tests."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class M:
    """One tar member: type is file, dir, symlink, hardlink, fifo, chr or blk."""

    name: str
    type: str = "file"
    data: bytes = b""
    linkname: str = ""
    size: int | None = None  # header size, when it should lie
    pax: dict = field(default_factory=dict)


_TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
          "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE}


def entry(relpath: str, files: dict[str, bytes], layout: str = "hidet", kind: str = "op", links=None, dirs=(),
          locks=(), **fields) -> tuple[dict, list[M]]:
    """A manifest record and its members, honest unless changed afterwards."""
    parts = relpath.split("/")
    record = {"layout": layout, "kind": kind, "target": fields.get("target"), "space": fields.get("space"),
              "op": fields.get("op"), "hash": parts[-1], "relpath": relpath, "status": "complete",
              "files": {n: [len(d), hashlib.sha256(d).hexdigest()] for n, d in files.items()},
              "links": dict(links or {}), "dirs": list(dirs), "locks": list(locks)}
    if layout == "hidet" and kind == "op":
        record["space"], record["op"] = parts[1], parts[2]
    members = [M(relpath, "dir")] + [M(f"{relpath}/{d}", "dir") for d in dirs]
    members += [M(f"{relpath}/{n}", "file", d) for n, d in files.items()]
    members += [M(f"{relpath}/{n}", "symlink", linkname=t) for n, t in (links or {}).items()]
    return record, members


def hidet_entry(hash_: str = "0123456789abcdef", op: str = "add", files=None) -> tuple[dict, list[M]]:
    files = files if files is not None else {"lib.so": b"\x7fELF" + b"\0" * 60, "task.txt": b"Task(...)",
                                             "source.cu": b"__global__ void k() {}\n"}
    return entry(f"ops/cuda_space_0/{op}/{hash_}", files)


def entry_from_dir(root: Path, relpath: str, layout: str, kind: str, **fields) -> tuple[dict, list[M]]:
    base = Path(root) / relpath
    files, links, dirs, locks = {}, {}, [], []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, base)
            if os.path.islink(full):
                links[rel] = os.readlink(full)
            elif os.path.isdir(full):
                dirs.append(rel)
            elif n.endswith(".lock"):
                locks.append(rel)
            else:
                files[rel] = Path(full).read_bytes()
    return entry(relpath, files, layout, kind, links=links, dirs=dirs, locks=locks, **fields)


def manifest_for(entries: list[tuple[dict, list[M]]]) -> dict:
    return {"format": "kcache-archive", "format_version": 1, "kcache_version": "0.1.0", "sources_only": False,
            "entries": [rec for rec, _ in entries]}


def build_archive(path: Path, entries: list[tuple[dict, list[M]]], manifest: dict | None = None,
                  extra: list[M] = (), lead: list[M] | None = None) -> Path:
    """A tar (.tar, .tar.gz or .tar.zst by suffix): `lead` members (default: manifest.json), then
    every entry's members, then `extra`."""
    manifest = manifest if manifest is not None else manifest_for(entries)
    members = list(lead) if lead is not None else [M("manifest.json", "file", json.dumps(manifest).encode())]
    for _, ms in entries:
        members += ms
    members += list(extra)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for m in members:
            ti = tarfile.TarInfo(m.name)
            ti.type = _TYPES[m.type]
            ti.mode = 0o755 if m.type == "dir" else 0o644
            ti.linkname = m.linkname
            ti.pax_headers = dict(m.pax)
            if m.type == "file":
                ti.size = len(m.data) if m.size is None else m.size
                data = m.data if m.size is None or m.size <= len(m.data) else m.data + bytes(m.size - len(m.data))
                tf.addfile(ti, io.BytesIO(data[:ti.size]))
            else:
                tf.addfile(ti)
    raw = buf.getvalue()
    name = str(path)
    if name.endswith((".tar.gz", ".tgz")):
        import gzip

        raw = gzip.compress(raw)
    elif name.endswith(".tar.zst"):
        import zstandard

        raw = zstandard.ZstdCompressor().compress(raw)
    Path(path).write_bytes(raw)
    return Path(path)


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything under `root` (kcache's .kcache/ included): path -> (type, mode, content digest or
    link target). Missing root: {}."""
    out = {}
    if not os.path.lexists(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(Path(full).read_bytes()).hexdigest())
    return out
