"""How an entry lives on a remote: its keys, and what a layout changes on the way (a hook per layout).

kcache's own format (every layout unless its module says otherwise):

    kcache:v1:<layout>:<relpath>:manifest          the entry's record, as in an export manifest, plus
                                                   "executable" (names) and "pushed" (ISO time)
    kcache:v1:<layout>:<relpath>:data:<sha256>:<i> the i-th piece (CHUNK bytes) of a file with that sha256
    kcache:v1:index                                hash: "<layout>:<relpath>" -> a summary (remote ls)
    kcache:v1:pulled                               hash: "<layout>:<relpath>" -> when last pulled (prune)

A layout may override `Layout.remote_format()` to keep its files under its own tool's keys (Triton:
`TritonFormat` in kcache_cli/layouts/triton_remote.py, a `RemoteFormat` of
kcache_cli/layouts/remote_format.py); the record and the index stay kcache's, so that pulls are
verified the same way whatever the format.
"""

from __future__ import annotations

from kcache_cli import layouts
from kcache_cli.layouts.remote_format import CHUNK, NAMESPACE, RemoteFormat
from kcache_cli.layouts.remote_format import MAX_FILE as MAX_FILE  # the remote's limits, used beside its keys
from kcache_cli.layouts.remote_format import ClaimTooBig as ClaimTooBig
from kcache_cli.layouts.remote_format import pieces as pieces

INDEX = f"{NAMESPACE}:index"
PULLED = f"{NAMESPACE}:pulled"


def entry_id(layout: str, relpath: str) -> str:
    return f"{layout}:{relpath}"


def record_key(layout: str, relpath: str) -> str:
    return f"{NAMESPACE}:{layout}:{relpath}:manifest"


def split_pieces(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]


KCACHE_FORMAT = RemoteFormat()


def format_for(layout: str) -> RemoteFormat:
    """The layout's own remote format (Layout.remote_format), else kcache's."""
    own = layouts.get(layout).remote_format() if layout in layouts.NAMES else None
    return own if own is not None else KCACHE_FORMAT


def foreign_formats() -> list[RemoteFormat]:
    return [f for f in (format_for(name) for name in layouts.NAMES) if f is not KCACHE_FORMAT]
