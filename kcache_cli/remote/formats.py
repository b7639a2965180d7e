"""How an entry lives on a remote: its keys, and what a layout changes on the way (a hook per layout).

kcache's own format (every layout unless its module says otherwise):

    kcache:v1:<layout>:<relpath>:manifest          the entry's record, as in an export manifest, plus
                                                   "executable" (names) and "pushed" (ISO time)
    kcache:v1:<layout>:<relpath>:data:<sha256>:<i> the i-th piece (CHUNK bytes) of a file with that sha256
    kcache:v1:index                                hash: "<layout>:<relpath>" -> a summary (remote ls)
    kcache:v1:pulled                               hash: "<layout>:<relpath>" -> when last pulled (prune)

A layout may override `Layout.remote_format()` to keep its files under its own tool's
keys (Triton: `TritonFormat` below); the record and the index stay kcache's, so that pulls are
verified the same way whatever the format.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

NAMESPACE = "kcache:v1"
INDEX = f"{NAMESPACE}:index"
PULLED = f"{NAMESPACE}:pulled"
CHUNK = 64 << 20  # bytes per value (Redis takes up to 512 MB in one)


def entry_id(layout: str, relpath: str) -> str:
    return f"{layout}:{relpath}"


def record_key(layout: str, relpath: str) -> str:
    return f"{NAMESPACE}:{layout}:{relpath}:manifest"


def pieces(size: int) -> int:
    return max(1, -(-size // CHUNK))


class RemoteFormat:
    """kcache's own format. A layout overrides what differs (see TritonFormat)."""

    name = "kcache"
    content_addressed = True  # a data key names its bytes: write it only if new

    def data_keys(self, record: dict) -> dict[str, list[str]]:
        """File name -> the keys of its pieces, in order."""
        base = f"{NAMESPACE}:{record['layout']}:{record['relpath']}:data"
        return {name: [f"{base}:{sha}:{i}" for i in range(pieces(size))]
                for name, (size, sha) in record["files"].items()}

    def outgoing(self, record: dict, data: dict[str, bytes]) -> tuple[dict, dict[str, bytes]]:
        """The record and files as they go to the remote (a layout drops what is machine-local)."""
        return record, data

    def last(self, record: dict) -> tuple[tuple[str, bytes], ...]:
        """Keys set when the entry is published, after its data (a tool's own completion marker)."""
        return ()

    def local_files(self, record: dict, entry_path: str) -> dict[str, bytes]:
        """Files a pull writes besides the record's (made for this machine, such as absolute paths)."""
        return {}

    def foreign(self, store) -> Iterator[tuple[dict, dict[str, bytes]]]:
        """Entries another tool pushed in this format without a kcache record: (record, files)."""
        return iter(())


def split_pieces(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]


KCACHE_FORMAT = RemoteFormat()


def format_for(layout: str) -> RemoteFormat:
    """The layout's own remote format (Layout.remote_format), else kcache's."""
    from kcache_cli import layouts

    own = layouts.get(layout).remote_format() if layout in layouts.NAMES else None
    return own if own is not None else KCACHE_FORMAT


def foreign_formats() -> list[RemoteFormat]:
    from kcache_cli import layouts

    return [f for f in (format_for(name) for name in layouts.NAMES) if f is not KCACHE_FORMAT]


# ---- Triton ------------------------------------------------------------------------------------

GROUP_PREFIX = "__grp__"
DEFAULT_TRITON_KEY_FORMAT = "triton:{key}:{filename}"


@dataclass
class TritonFormat(RemoteFormat):
    """Triton's RedisRemoteCacheBackend format, so that Triton and kcache share one Redis.

    Each file of the kernel directory `<key>/` is the value of `triton:{key}:{filename}` (or
    TRITON_REDIS_KEY_FORMAT); the group file `__grp__<name>.json`, which Triton reads first, holds
    `{"child_paths": [sorted file names]}` remotely and, on disk, `{"child_paths": {name: absolute
    path}}`: it is set last when pushing and rewritten for the local root when pulling."""

    layout: str = "triton"
    kind: str = "kernel"  # the kind triton.py gives a kernel directory
    key_format: str = ""
    name = "triton"
    content_addressed = False

    def __post_init__(self) -> None:
        self.key_format = self.key_format or os.environ.get("TRITON_REDIS_KEY_FORMAT") or DEFAULT_TRITON_KEY_FORMAT

    def key(self, record: dict, filename: str) -> str:
        return self.key_format.format(key=record["relpath"].rsplit("/", 1)[-1], filename=filename)

    def data_keys(self, record: dict) -> dict[str, list[str]]:
        return {name: [self.key(record, name)] for name in record["files"]}

    def outgoing(self, record: dict, data: dict[str, bytes]) -> tuple[dict, dict[str, bytes]]:
        groups = sorted(n for n in record["files"] if n.startswith(GROUP_PREFIX) and "/" not in n)
        files = {n: v for n, v in record["files"].items() if n not in groups}
        return {**record, "files": files, "groups": groups}, {n: v for n, v in data.items() if n not in groups}

    def group_value(self, record: dict) -> bytes:
        # Exactly what Triton's RemoteCacheManager.put_group stores.
        return json.dumps({"child_paths": sorted(record["files"])}).encode()

    def last(self, record: dict) -> tuple[tuple[str, bytes], ...]:
        value = self.group_value(record)
        return tuple((self.key(record, g), value) for g in record.get("groups", ()))

    def local_files(self, record: dict, entry_path: str) -> dict[str, bytes]:
        paths = {n: os.path.join(entry_path, n) for n in sorted(record["files"])}
        text = json.dumps({"child_paths": paths}).encode()
        return {g: text for g in record.get("groups", ())}

    def _key_pattern(self) -> re.Pattern:
        parts = re.split(r"(\{key\}|\{filename\})", self.key_format)
        rx = "".join("(?P<key>[^:]+)" if p == "{key}" else "(?P<filename>.+)" if p == "{filename}"
                     else re.escape(p) for p in parts)
        return re.compile(rx + r"\Z")

    def foreign(self, store) -> Iterator[tuple[dict, dict[str, bytes]]]:
        """Kernels Triton itself pushed: every group key, its children fetched (sizes and sha256 are
        those of the bytes found: Triton keeps no checksums)."""
        pattern = self.key_format.format(key="*", filename=GROUP_PREFIX + "*")
        rx = self._key_pattern()
        for gkey in sorted(store.keys(pattern)):
            m = rx.match(gkey)
            if not m:
                continue
            key, gname = m.group("key"), m.group("filename")
            raw = store.get([gkey])[0]
            try:
                children = json.loads(raw or b"")["child_paths"]
                if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                continue  # not a group file Triton would read either
            values = store.get([self.key_format.format(key=key, filename=c) for c in children])
            if any(v is None for v in values):
                continue  # Triton misses on it too
            data = dict(zip(children, values))
            record = {"layout": self.layout, "kind": self.kind, "target": None, "space": None, "op": None,
                      "hash": key, "relpath": key, "status": "complete", "compiler": "triton", "arch": None,
                      "platform": None, "files": {n: [len(v), hashlib.sha256(v).hexdigest()] for n, v in data.items()},
                      "links": {}, "dirs": [], "locks": [], "groups": [gname], "pushed_by": "triton"}
            yield record, data
