"""torch's Mega-Cache blob (`torch.compiler.save_cache_artifacts()` / `load_cache_artifacts()`), read and
written without torch and without unpickling anything.

The format, read against torch 2.13's `torch/utils/_appending_byte_serializer.py` and
`torch/compiler/_cache.py` (the same on torch's main branch):

    crc32      4 bytes, big-endian: zlib.crc32 of every byte after it
    version    u64 big-endian, 1
    groups     until the end: type (a string), count (u64), then `count` times key (a string) and
               content (bytes)

A u64 is 8 bytes big-endian; bytes are a u64 length and the bytes; a string is the base64 of its UTF-8
as bytes. torch checks the CRC first and refuses the whole blob when it differs; it then makes a dict of
the groups, so a later group of a type replaces an earlier one (a process that saved twice wrote two
groups of a type: torch loads only the last). Every content is a pickle (an fx graph, an AOTAutograd
entry, a PGO code state, a Dynamo package) or JSON (autotune): torch runs the pickles when it loads
them. This module only frames bytes: nothing in a blob is ever unpickled, evaluated or imported.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Iterable, NamedTuple

from kcache_cli.util.units import plural

VERSION = 1
CRC_SIZE = 4
U64 = 8
MAX_BLOB = 1 << 34  # 16 GiB: a blob is read into memory whole (torch does the same)

# What a blob is, as a whole
OK, EMPTY, PARTIAL, CORRUPT = "ok", "empty", "partial", "corrupt"


class Artifact(NamedTuple):
    type: str
    key: str
    content: bytes
    group: int  # the index of its group in the blob
    offset: int  # where its content starts in the blob


class Blob(NamedTuple):
    """A parsed blob: what framed correctly, and what did not (`problems`, in the order found)."""

    size: int
    crc_stored: int | None
    crc_computed: int | None
    version: int | None
    artifacts: tuple[Artifact, ...]
    groups: tuple[tuple[str, int], ...]  # (type, count) as each group's header states it
    state: str  # OK, EMPTY, PARTIAL, CORRUPT
    problems: tuple[str, ...]

    @property
    def crc_ok(self) -> bool:
        return self.crc_stored is not None and self.crc_stored == self.crc_computed

    def shadowed(self) -> list[int]:
        """Groups torch's load drops: a later group of the same type replaces them."""
        last = {t: i for i, (t, _) in enumerate(self.groups)}
        return [i for i, (t, _) in enumerate(self.groups) if last[t] != i]

    def loaded(self) -> list[Artifact]:
        """The artifacts torch's `load_cache_artifacts` would write (none unless the blob is whole)."""
        if self.state != OK:
            return []
        dropped = set(self.shadowed())
        return [a for a in self.artifacts if a.group not in dropped]


class _Short(Exception):
    """The blob ends inside a field."""


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.i = CRC_SIZE

    def done(self) -> bool:
        return self.i >= len(self.data)

    def u64(self, what: str) -> int:
        if self.i + U64 > len(self.data):
            raise _Short(f"the blob ends at byte {len(self.data)} inside {what}'s 8-byte length (at {self.i})")
        v = int.from_bytes(self.data[self.i:self.i + U64], "big")
        self.i += U64
        return v

    def raw(self, what: str) -> tuple[bytes, int]:
        n = self.u64(what)
        start = self.i
        if n > len(self.data) - start:
            raise _Short(f"{what} says it holds {n} bytes but the blob ends {len(self.data) - start} bytes later "
                         f"(at byte {start})")
        self.i += n
        return bytes(self.data[start:start + n]), start

    def text(self, what: str) -> str:
        raw, start = self.raw(what)
        try:  # as torch reads it: base64.b64decode (not validating), then UTF-8
            return base64.b64decode(raw).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise ValueError(f"{what} at byte {start} is not base64 of UTF-8 text (torch fails loading the blob)"
                             ) from None


def parse(data: bytes | memoryview, known: Iterable[str] | None = None) -> Blob:
    """Every group and artifact the blob frames, and each problem torch's load would hit (never raises on
    bad input: a damaged blob is described, not refused). `known`: the artifact types torch registers
    (the layouts' `mega_types`); a group of another type fails torch's load as a whole."""
    size = len(data)
    if size == 0:
        return Blob(0, None, None, None, (), (), EMPTY, ("the blob is empty (0 bytes)",))
    if size < CRC_SIZE:
        return Blob(size, None, None, None, (), (), PARTIAL,
                    (f"the blob is {size} bytes: shorter than its 4-byte checksum",))
    stored = int.from_bytes(bytes(data[:CRC_SIZE]), "big")
    computed = zlib.crc32(data[CRC_SIZE:])
    problems = [] if stored == computed else [
        f"checksum mismatch: the blob states CRC32 {stored:08x}, its bytes have {computed:08x} (damaged; "
        "torch refuses the whole blob)"]
    r = _Reader(data)
    try:
        version = r.u64("the version")
    except _Short as exc:
        return Blob(size, stored, computed, None, (), (), PARTIAL, (*problems, str(exc)))
    if version != VERSION:
        problems.append(f"version {version}: torch 2.13 reads version {VERSION} only")
        return Blob(size, stored, computed, version, (), (), CORRUPT, tuple(problems))
    arts, groups, framing, short = _groups(r, None if known is None else frozenset(known))
    problems += framing
    state = PARTIAL if short else CORRUPT if problems else OK if arts or groups else EMPTY
    if state == EMPTY:
        problems.append("the blob holds no artifact (a version and nothing else)")
    return Blob(size, stored, computed, version, tuple(arts), tuple(groups), state, tuple(problems))


def _groups(r: _Reader, known: frozenset[str] | None) -> tuple[list[Artifact], list[tuple[str, int]], list[str], bool]:
    """(artifacts, group headers, problems, whether the blob ends inside a field)."""
    arts: list[Artifact] = []
    groups: list[tuple[str, int]] = []
    problems: list[str] = []
    try:
        while not r.done():
            g = len(groups)
            kind = r.text(f"group {g}'s type")
            count = r.u64(f"group {g}'s count")
            if count > (len(r.data) - r.i) // (2 * U64):
                raise _Short(f"group {g} ({kind}) says it holds {plural(count, 'artifact')}, more than the "
                             f"{plural(len(r.data) - r.i, 'byte')} left can frame")
            groups.append((kind, count))
            if known is not None and kind not in known:
                problems.append(f"group {g} has type {kind!r}, which torch 2.13 does not know (its load fails)")
            for n in range(count):
                key = r.text(f"artifact {n} of group {g} ({kind})'s key")
                content, start = r.raw(f"artifact {n} of group {g} ({kind})'s content")
                arts.append(Artifact(kind, key, content, g, start))
    except _Short as exc:
        return arts, groups, [*problems, f"partial: {exc}"], True
    except ValueError as exc:
        return arts, groups, [*problems, str(exc)], False
    return arts, groups, problems, False


def _u64(n: int) -> bytes:
    return n.to_bytes(U64, "big")


def _text(s: str) -> bytes:
    b = base64.b64encode(s.encode("utf-8"))
    return _u64(len(b)) + b


def build(artifacts: list[tuple[str, str, bytes]]) -> bytes:
    """A blob torch loads: (type, key, content) grouped by type in first-seen order (one group per type,
    as one `save_cache_artifacts()` writes), the version, then the CRC32 of it all in front."""
    order: dict[str, list[tuple[str, bytes]]] = {}
    for kind, key, content in artifacts:
        order.setdefault(kind, []).append((key, content))
    parts = [_u64(VERSION)]
    for kind, items in order.items():
        parts += [_text(kind), _u64(len(items))]
        for key, content in items:
            parts += [_text(key), _u64(len(content)), content]
    body = b"".join(parts)
    return zlib.crc32(body).to_bytes(CRC_SIZE, "big") + body


def looks_like_blob(head: bytes) -> bool:
    """Whether the first 12+ bytes could start a blob: a CRC, then version 1 (for telling a blob from an
    archive or an entry path without reading all of it)."""
    return len(head) >= CRC_SIZE + U64 and int.from_bytes(head[CRC_SIZE:CRC_SIZE + U64], "big") == VERSION
