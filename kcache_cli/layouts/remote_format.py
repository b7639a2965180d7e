"""What a layout may change about how its entries are stored on a remote: `RemoteFormat`, kcache's
own format, which a layout's `remote_format()` subclasses (Triton's, in triton_remote.py). The keys of
the remote's record and index, and which format a layout uses, are the remote's (kcache_cli/remote/formats.py).

A format reads an entry's record (kcache_cli.archive.manifest.EntryRecord) only through `RemoteRecord`,
so that this floor imports nothing of the archive or the remote."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from kcache_cli.model.records import EntryKey

NAMESPACE = "kcache:v1"
CHUNK = 64 << 20  # bytes per value (Redis takes up to 512 MB in one)
MAX_FILE = 4 << 30  # bytes of one file a record may claim: import's limit (ImportLimits.max_member)


class ClaimTooBig(ValueError):
    """A record claims a file bigger than any cache holds (its keys are never spelt out)."""


def pieces(size: int) -> int:
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE:
        raise ClaimTooBig(f"its record claims a file of {size!r} bytes, over the limit of {MAX_FILE}")
    return max(1, -(-size // CHUNK))


def names_problem(record: Mapping[str, object], field: str) -> str | None:
    value = record.get(field, [])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return None
    return f"its record's {field!r} is not a list of file names"


R = TypeVar("R", bound="RemoteRecord")


class RemoteRecord(Protocol):
    """What a format reads of an entry's record (an EntryRecord)."""

    @property
    def key(self) -> EntryKey: ...

    @property
    def relpath(self) -> str: ...

    @property
    def files(self) -> Mapping[str, tuple[int, str]]: ...  # name -> (size, sha256)

    @property
    def extra(self) -> Mapping[str, object]: ...

    def _replace(self: R, *, files: dict[str, tuple[int, str]] = ..., extra: Mapping[str, object] = ...) -> R: ...


class RemoteFormat:
    """kcache's own format. A layout's own format (returned by `Layout.remote_format`) overrides what
    differs."""

    name = "kcache"
    content_addressed = True  # a data key names its bytes: write it only if new

    def data_keys(self, record: RemoteRecord) -> dict[str, list[str]]:
        """File name -> the keys of its pieces, in order."""
        base = f"{NAMESPACE}:{record.key.layout}:{record.relpath}:data"
        return {name: [f"{base}:{sha}:{i}" for i in range(pieces(size))]
                for name, (size, sha) in record.files.items()}

    def record_problem(self, record: Mapping[str, object]) -> str | None:
        """What is wrong with the fields of a remote record (as JSON) that pull uses and import does not
        check, or None: kcache's "executable" must be a list of names (a layout adds its own fields)."""
        return names_problem(record, "executable")

    def outgoing(self, record: R, data: dict[str, bytes]) -> tuple[R, dict[str, bytes]]:
        """The record and files as they go to the remote (a layout drops what is machine-local)."""
        return record, data

    def last(self, record: RemoteRecord) -> tuple[tuple[str, bytes], ...]:
        """Keys set when the entry is published, after its data (a tool's own completion marker)."""
        return ()

    def local_files(self, record: RemoteRecord, entry_path: str) -> dict[str, bytes]:
        """Files a pull writes besides the record's (made for this machine, such as absolute paths)."""
        return {}

    def foreign(self, store, wanted: Callable[[dict], bool] = lambda rec: True
                ) -> Iterator[tuple[dict, dict[str, bytes]]]:
        """Entries another tool pushed in this format without a kcache record that `wanted` selects
        (asked before their files are fetched): (its record as JSON, to be checked like any remote
        record, and its files)."""
        return iter(())
