"""Triton's own remote format (its `RedisRemoteCacheBackend` keys), returned by
`TritonLayout.remote_format`: kcache pushes and pulls Triton kernels under the keys Triton itself reads
and writes, so that both share one Redis. Imported only by remote commands (it needs nothing heavy,
but the layout module stays free of remote code)."""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kcache_cli.fs.read import parse_json
from kcache_cli.layouts.remote_format import MAX_FILE, R, RemoteFormat, RemoteRecord, names_problem
from kcache_cli.layouts.shapes import TRITON
from kcache_cli.layouts.shapes import TRITON_GROUP as GROUP_PREFIX
from kcache_cli.util.errors import UsageError
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:
    import hashlib
else:  # its first use loads it: _hashlib's OpenSSL costs 2.3 ms of every start, a digest is rare
    hashlib = lazy_module("hashlib")

DEFAULT_TRITON_KEY_FORMAT = "triton:{key}:{filename}"


@dataclass
class TritonFormat(RemoteFormat):
    """Triton's RedisRemoteCacheBackend format, so that Triton and kcache share one Redis.

    Each file of the kernel directory `<key>/` is the value of `triton:{key}:{filename}` (or
    TRITON_REDIS_KEY_FORMAT); the group file `__grp__<name>.json`, which Triton reads first, holds
    `{"child_paths": [sorted file names]}` remotely and, on disk, `{"child_paths": {name: absolute
    path}}`: it is set last when pushing and rewritten for the local root when pulling."""

    layout: str = TRITON.name
    kind: str = TRITON.kinds[0].kind  # what triton.py calls a kernel directory
    key_format: str = ""
    name = "triton"
    content_addressed = False

    def __post_init__(self) -> None:
        self.key_format = check_key_format(self.key_format or os.environ.get("TRITON_REDIS_KEY_FORMAT")
                                           or DEFAULT_TRITON_KEY_FORMAT)

    def key(self, record: RemoteRecord, filename: str) -> str:
        return self.key_format.format(key=record.relpath, filename=filename)  # a key dir: the whole relpath

    def data_keys(self, record: RemoteRecord) -> dict[str, list[str]]:
        return {name: [self.key(record, name)] for name in record.files}

    def record_problem(self, record: Mapping[str, object]) -> str | None:
        """kcache's fields, and "groups": the group files' names, which pull writes."""
        return super().record_problem(record) or names_problem(record, "groups")

    def outgoing(self, record: R, data: dict[str, bytes]) -> tuple[R, dict[str, bytes]]:
        groups = sorted(n for n in record.files if n.startswith(GROUP_PREFIX) and "/" not in n)
        files = {n: v for n, v in record.files.items() if n not in groups}
        return (record._replace(files=files, extra={**record.extra, "groups": groups}),
                {n: v for n, v in data.items() if n not in groups})

    def group_value(self, record: RemoteRecord) -> bytes:
        # Exactly what Triton's RemoteCacheManager.put_group stores.
        return json.dumps({"child_paths": sorted(record.files)}).encode()

    def last(self, record: RemoteRecord) -> tuple[tuple[str, bytes], ...]:
        value = self.group_value(record)
        return tuple((self.key(record, g), value) for g in _groups(record))

    def local_files(self, record: RemoteRecord, entry_path: str) -> dict[str, bytes]:
        paths = {n: os.path.join(entry_path, n) for n in sorted(record.files)}
        text = json.dumps({"child_paths": paths}).encode()
        return {g: text for g in _groups(record)}

    def _key_pattern(self) -> re.Pattern:
        rx = ""
        for literal, field, _spec, _conv in string.Formatter().parse(self.key_format):
            rx += re.escape(literal)
            if field is not None:
                rx += "(?P<key>[^:]+)" if field == "key" else "(?P<filename>.+)"
        return re.compile(rx + r"\Z")

    def foreign(self, store, wanted: Callable[[dict], bool] = lambda rec: True
                ) -> Iterator[tuple[dict, dict[str, bytes]]]:
        """Kernels Triton itself pushed that `wanted(record)` selects (asked with the record's key
        fields before anything is fetched): each group key's children, each fetched once and only
        within MAX_FILE (sizes and sha256 are those of the bytes found: Triton keeps no checksums)."""
        pattern = self.key_format.format(key="*", filename=GROUP_PREFIX + "*")
        rx = self._key_pattern()
        for gkey in sorted(store.keys(pattern)):
            m = rx.match(gkey)
            if not m:
                continue
            key, gname = m.group("key"), m.group("filename")
            record = {"layout": self.layout, "kind": self.kind, "target": None, "space": None, "op": None,
                      "hash": key, "relpath": key, "status": "complete", "compiler": "triton", "arch": None,
                      "platform": None, "links": {}, "dirs": [], "locks": [], "groups": [gname], "pushed_by": "triton"}
            if not wanted(record):
                continue
            children = _children(store.get([gkey])[0])  # within the store's MAX_RECORD
            if children is None:
                continue  # not a group file Triton would read either
            values = store.get([self.key_format.format(key=key, filename=c) for c in children], MAX_FILE)
            if not all(isinstance(v, bytes) for v in values):
                continue  # Triton misses on it too (or a file no cache holds)
            data: dict[str, bytes] = dict(zip(children, values))
            record["files"] = {n: [len(v), hashlib.sha256(v).hexdigest()] for n, v in data.items()}
            yield record, data


def _children(raw: object) -> list[str] | None:
    """The distinct file names a remote group file lists, or None when it is not one."""
    if not isinstance(raw, bytes):
        return None
    try:
        children = parse_json(raw)["child_paths"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
        return None
    return list(dict.fromkeys(children))  # a name listed many times is one file, fetched once


def check_key_format(fmt: str) -> str:
    """TRITON_REDIS_KEY_FORMAT as Triton uses it: the fields {key} and {filename}, each once, nothing
    else (no position, conversion or width); else a usage error."""
    try:
        fields = [(field, spec, conv) for _, field, spec, conv in string.Formatter().parse(fmt) if field is not None]
    except ValueError as exc:
        raise UsageError(f"TRITON_REDIS_KEY_FORMAT {fmt[:80]!r}: {exc}") from None
    names = sorted(field for field, _, _ in fields)
    if names != ["filename", "key"] or any(spec or conv for _, spec, conv in fields):
        raise UsageError(f"TRITON_REDIS_KEY_FORMAT {fmt[:80]!r} must hold {{key}} and {{filename}} once each and "
                         f"no other field (Triton's default: {DEFAULT_TRITON_KEY_FORMAT})")
    return fmt


def _groups(record: RemoteRecord) -> list[str]:
    """The group files a remote record names (its "groups": checked by pull like the files it writes)."""
    groups = record.extra.get("groups", ())
    return list(groups) if isinstance(groups, (list, tuple)) else []
