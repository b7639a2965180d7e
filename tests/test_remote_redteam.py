"""What an outside red team found in the Redis remote, against a real redis-server: a junk record at a path
that is not its layout's entry shape owns no other entry's data (prune removes only itself), and a record
whose fields pull uses hold the wrong types is refused in one line while the others arrive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree

from kcache_cli.remote import formats as f

pytestmark = pytest.mark.redis


def _push(kcache, root: Path, url: str) -> None:
    run = kcache("push", "--cache-dir", root, "--remote", url)
    assert run.exit_code == 0, run.stderr


def _triton(kcache, tmp_path: Path) -> Path:
    root = copy_tree(FIXTURES / "triton" / "cache", tmp_path / "triton")
    assert kcache("verify", "--fix", "--cache-dir", root).exit_code == 0  # the fixture's group files: this root's
    return root


def test_a_junk_record_under_a_triton_key_prunes_only_itself(kcache, tmp_path, redis_server):
    """`junk/<key>`'s data keys would be `triton:<key>:*` (Triton's keys name only the key): a path that is not
    exactly one Triton key owns none, and the real entry stays whole and pullable."""
    server = redis_server()
    client = server.client()
    _push(kcache, _triton(kcache, tmp_path), server.url)
    key = "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"
    junk = f"junk/{key}"
    rec = json.loads(client.get(f.record_key("triton", key)))
    client.set(f.record_key("triton", junk), json.dumps({**rec, "relpath": junk}))
    summary = json.loads(client.hget(f.INDEX, f.entry_id("triton", key)))
    client.hset(f.INDEX, f.entry_id("triton", junk), json.dumps({**summary, "relpath": junk,
                                                                 "pushed": "2000-01-01T00:00:00"}))
    before = sorted(client.keys(f"triton:{key}:*"))
    assert len(before) > 2
    pruned = kcache("remote", "prune", "--remote", server.url, "--older-than", "365d", "--json")
    assert pruned.exit_code == 0, pruned.stderr
    assert [r["relpath"] for r in pruned.json()["removed"]] == [junk]
    assert "its path is not an entry's" in pruned.stderr
    assert sorted(client.keys(f"triton:{key}:*")) == before
    again = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", server.url, key[:8], "--json")
    assert again.exit_code == 0 and again.json()["pulled"] == 1, again.stderr


@pytest.mark.parametrize(("field", "value"), [("executable", [{"a": 1}]), ("executable", [["x"]]),
                                              ("executable", "lib.so"), ("groups", [{"a": 1}])])
def test_a_record_field_of_the_wrong_type_refuses_that_record_alone(kcache, tmp_path, redis_server, field, value):
    server = redis_server()
    client = server.client()
    layout, root = ("triton", _triton(kcache, tmp_path)) if field == "groups" else \
        ("hidet", copy_tree(FIXTURES / "hidet", tmp_path / "hidet"))
    _push(kcache, root, server.url)
    records = client.keys(f"kcache:v1:{layout}:*:manifest")
    victim = sorted(k.decode().split(":", 3)[3].rsplit(":", 1)[0] for k in records)[0]
    rec = json.loads(client.get(f.record_key(layout, victim)))
    client.set(f.record_key(layout, victim), json.dumps({**rec, field: value}))
    run = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", server.url, "--json")
    assert run.exit_code == 1 and "unexpected" not in run.stderr, run.stderr
    doc = run.json()
    refused = [e for e in doc["entries"] if e["action"] == "refuse"]
    assert [e["relpath"] for e in refused] == [victim]
    assert f"'{field}' is not a list of file names" in refused[0]["reason"]
    assert doc["pulled"] == len(doc["entries"]) - 1
