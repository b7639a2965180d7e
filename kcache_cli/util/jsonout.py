"""A command's JSON document as bytes: orjson where it gives exactly what the standard library would
mean, json.dumps where it cannot.

orjson encodes `ls --json` of 20,000 entries in 5 ms where json.dumps takes 70-90 ms. It writes no spaces
after separators (compact for pipes; indented for people, as json.dumps's indent=2), and UTF-8 where
json.dumps escapes every non-ASCII character: a document that is not all ASCII is written by json.dumps,
so a C1 control or a look-alike in a path still reaches a terminal as a \\u escape. What orjson refuses
or would write differently (integers beyond 64 bits, non-string keys, lone surrogates from undecodable
file names, dataclasses and datetimes, which json.dumps refuses) also goes to json.dumps. (orjson writes
NaN as null, json.dumps as the NaN no JSON parser need take: kcache's documents hold none.)"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a declared dependency; the standard library still works
    orjson = None  # type: ignore[assignment]


def encode(data: Any, indent: bool = False) -> bytes:
    """`data` as one JSON document (indented by two spaces with `indent`), ASCII only, with no newline."""
    if orjson is not None:
        options = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
        if indent:
            options |= orjson.OPT_INDENT_2
        try:
            out = orjson.dumps(data, option=options)
        except TypeError:  # orjson.JSONEncodeError is one
            out = b""
        if out and out.isascii() and b"\x7f" not in out:  # json.dumps escapes DEL too
            return out
    # No cycle check: documents are trees kcache built (8% of encoding 20,000 entries).
    return json.dumps(data, indent=2 if indent else None, check_circular=False).encode("ascii")
