"""How an entry lives on a remote: its keys, and what a layout changes on the way (a hook per layout).

kcache's own format (every layout unless its module says otherwise):

    kcache:v1:<layout>:<relpath>:manifest          the entry's record, as in an export manifest, plus
                                                   "executable" (names) and "pushed" (ISO time)
    kcache:v1:<layout>:<relpath>:data:<sha256>:<i> the i-th piece (CHUNK bytes) of a file with that sha256
    kcache:v1:index                                hash: "<layout>:<relpath>" -> a summary (remote ls)
    kcache:v1:pulled                               hash: "<layout>:<relpath>" -> when last pulled (prune)

A layout may override `Layout.remote_format()` to keep its files under its own tool's keys (Triton:
`TritonFormat` in kcache_cli/layouts/triton_remote.py); the record and the index stay kcache's, so
that pulls are verified the same way whatever the format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kcache_cli.archive.manifest import EntryRecord


NAMESPACE = "kcache:v1"
INDEX = f"{NAMESPACE}:index"
PULLED = f"{NAMESPACE}:pulled"
CHUNK = 64 << 20  # bytes per value (Redis takes up to 512 MB in one)


def entry_id(layout: str, relpath: str) -> str:
    return f"{layout}:{relpath}"


def record_key(layout: str, relpath: str) -> str:
    return f"{NAMESPACE}:{layout}:{relpath}:manifest"


MAX_FILE = 4 << 30  # bytes of one file a record may claim: import's limit (ImportLimits.max_member)


class ClaimTooBig(ValueError):
    """A record claims a file bigger than any cache holds (its keys are never spelt out)."""


def pieces(size: int) -> int:
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE:
        raise ClaimTooBig(f"its record claims a file of {size!r} bytes, over the limit of {MAX_FILE}")
    return max(1, -(-size // CHUNK))


class RemoteFormat:
    """kcache's own format. A layout's own format (returned by `Layout.remote_format`) overrides what
    differs."""

    name = "kcache"
    content_addressed = True  # a data key names its bytes: write it only if new

    def data_keys(self, record: EntryRecord) -> dict[str, list[str]]:
        """File name -> the keys of its pieces, in order."""
        base = f"{NAMESPACE}:{record.key.layout}:{record.relpath}:data"
        return {name: [f"{base}:{sha}:{i}" for i in range(pieces(size))]
                for name, (size, sha) in record.files.items()}

    def outgoing(self, record: EntryRecord, data: dict[str, bytes]) -> tuple[EntryRecord, dict[str, bytes]]:
        """The record and files as they go to the remote (a layout drops what is machine-local)."""
        return record, data

    def last(self, record: EntryRecord) -> tuple[tuple[str, bytes], ...]:
        """Keys set when the entry is published, after its data (a tool's own completion marker)."""
        return ()

    def local_files(self, record: EntryRecord, entry_path: str) -> dict[str, bytes]:
        """Files a pull writes besides the record's (made for this machine, such as absolute paths)."""
        return {}

    def foreign(self, store, wanted: Callable[[dict], bool] = lambda rec: True
                ) -> Iterator[tuple[dict, dict[str, bytes]]]:
        """Entries another tool pushed in this format without a kcache record that `wanted` selects
        (asked before their files are fetched): (its record as JSON, to be checked like any remote
        record, and its files)."""
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
