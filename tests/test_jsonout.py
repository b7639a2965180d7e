"""--json documents: orjson's bytes where they mean what json.dumps's mean, json.dumps's otherwise."""

from __future__ import annotations

import json

import pytest

from kcache_cli.util import jsonout

DOC = {"schema": "kcache/ls/1", "entries": [{"path": "/c/ops/a", "size": 4096, "reason": None, "ok": True,
                                             "modified": 1.5, "files": [], "more": {}}], "total": 1}


def test_compact_and_indented_documents_read_back_the_same():
    assert json.loads(jsonout.encode(DOC)) == DOC
    assert jsonout.encode(DOC, indent=True) == json.dumps(DOC, indent=2).encode()  # byte for byte, for people


@pytest.mark.parametrize("value", ["caf\u00e9", "\x9b31m", "\x7f", "\udcff", 2 ** 70, "\u202e"])
def test_what_orjson_would_write_otherwise_is_json_dumps_bytes(value):
    """Non-ASCII (a C1 control, a bidi override), DEL, an undecodable name's surrogate, a huge integer:
    escaped and written as the standard library writes them, ASCII only."""
    doc = {"entries": [{"path": value}]}
    got = jsonout.encode(doc)
    assert got == json.dumps(doc).encode()
    assert got.isascii() and b"\x7f" not in got and json.loads(got) == doc


def test_a_document_json_cannot_encode_fails_as_json_fails():
    class Odd:
        pass

    with pytest.raises(TypeError):
        jsonout.encode({"x": Odd()})
