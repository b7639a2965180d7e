"""Signed entries (DESIGN.md §9, kcache_cli/util/signing.py): node A pushes signed, node B trusting A's key
pulls; unsigned, foreign-signed and altered records written straight into Redis are refused."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import CXX, FIXTURES, copy_tree

from kcache_cli.remote import formats as f

pytest.importorskip("cryptography")
needs_redis = pytest.mark.redis
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")


def node(tmp_path: Path, name: str) -> dict[str, str]:
    """A node's environment: its own config directory (its key, its trust list)."""
    conf = tmp_path / f"conf-{name}"
    conf.mkdir()
    return {"XDG_CONFIG_HOME": str(conf), "KCACHE_SIGNING_KEY": "", "KCACHE_TRUSTED_KEYS": ""}


def keygen(kcache, env: dict[str, str]) -> str:
    run = kcache("remote", "keygen", "--json", env=env)
    assert run.exit_code == 0, run.stderr
    key = Path(run.json()["key"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    return run.json()["public_key"]


@needs_redis
def test_node_b_trusting_a_pulls_what_a_signed_and_refuses_the_rest(kcache, tmp_path, redis_server):
    server = redis_server()
    client = server.client()
    a, b, mallory = node(tmp_path, "a"), node(tmp_path, "b"), node(tmp_path, "m")
    a_key = keygen(kcache, a)
    keygen(kcache, mallory)
    src = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    pushed = kcache("push", "--cache-dir", src, "--remote", server.url, "--json", env=a)
    assert pushed.exit_code == 0 and pushed.json()["pushed"] == 5, pushed.stderr
    rels = sorted(e["relpath"] for e in pushed.json()["entries"])
    for rel in rels:
        assert json.loads(client.get(f.record_key("hidet", rel)))["signature"]["key"] == a_key
    # Mallory, who can write the Redis: one record unsigned, one signed by her own key, one altered.
    unsigned, foreign, altered = rels[0], rels[1], rels[2]
    rec = json.loads(client.get(f.record_key("hidet", unsigned)))
    del rec["signature"]
    client.set(f.record_key("hidet", unsigned), json.dumps(rec))
    from kcache_cli.util.signing import Signer, load_key

    mallory_key = load_key(Path(mallory["XDG_CONFIG_HOME"]) / "kcache" / "signing.key")
    rec = json.loads(client.get(f.record_key("hidet", foreign)))
    client.set(f.record_key("hidet", foreign), json.dumps(Signer(mallory_key).sign(rec)))
    rec = json.loads(client.get(f.record_key("hidet", altered)))
    rec["arch"] = "sm_00"
    client.set(f.record_key("hidet", altered), json.dumps(rec))

    b_env = {**b, "KCACHE_TRUSTED_KEYS": a_key}
    run = kcache("pull", "--cache-dir", tmp_path / "b", "--remote", server.url, env=b_env)
    assert run.exit_code == 1
    refused = [line for line in run.stderr.splitlines() if line.startswith("warning: refused")]
    assert len(refused) == 3, run.stderr
    assert "not signed" in refused[0] and unsigned in refused[0]
    assert "not in the trust list" in refused[1] and foreign in refused[1]
    assert "does not match" in refused[2] and altered in refused[2]
    got = sorted(str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b" / "ops").glob("*/*/*"))
    assert got == rels[3:]
    # Without a trust list the same node takes them all (the README's warning: write access to the
    # remote is code execution on the fleet).
    open_run = kcache("pull", "--cache-dir", tmp_path / "open", "--remote", server.url, "--json", env=b)
    assert open_run.exit_code == 0 and open_run.json()["pulled"] == 5


@needs_redis
def test_the_trust_list_file_is_read_and_must_be_the_users_own(kcache, tmp_path, redis_server):
    server = redis_server()
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    a_key = keygen(kcache, a)
    src = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    assert kcache("push", "--cache-dir", src, "--remote", server.url, env=a).exit_code == 0
    trust = Path(b["XDG_CONFIG_HOME"]) / "kcache" / "trusted_keys"
    trust.parent.mkdir()
    trust.write_text(f"# node a\n{a_key}  # build-01\n")
    run = kcache("pull", "--cache-dir", tmp_path / "b", "--remote", server.url, "--json", env=b)
    assert run.exit_code == 0 and run.json()["pulled"] == 5, run.stderr
    os.chmod(trust, 0o666)
    run = kcache("pull", "--cache-dir", tmp_path / "c", "--remote", server.url, env=b)
    assert run.exit_code == 1 and "trust list" in run.stderr and len(run.stderr.splitlines()) == 1
    os.chmod(trust, 0o644)
    trust.write_text("ed25519:nonsense\n")
    run = kcache("pull", "--cache-dir", tmp_path / "c", "--remote", server.url, env=b)
    assert run.exit_code == 2 and "not a public key" in run.stderr


@needs_redis
def test_triton_kernels_pushed_by_triton_itself_are_unsigned_and_refused_under_a_trust_list(kcache, tmp_path,
                                                                                          redis_server):
    server = redis_server()
    client = server.client()
    client.set("triton:" + "c" * 64 + ":k.cubin", b"x" * 10)
    client.set("triton:" + "c" * 64 + ":__grp__k.json", json.dumps({"child_paths": ["k.cubin"]}))
    a = node(tmp_path, "a")
    env = {**a, "KCACHE_TRUSTED_KEYS": keygen(kcache, a)}
    run = kcache("pull", "--cache-dir", tmp_path / "t", "--remote", server.url, "--json", env=env)
    assert run.exit_code == 1 and run.json()["refused"] == 1
    assert "not signed" in run.json()["entries"][0]["reason"]


@needs_redis
@needs_cxx
def test_build_remote_with_a_trust_list_builds_locally_rather_than_load_an_unsigned_entry(kcache, tmp_path,
                                                                                         redis_server):
    from test_remote_hostile import cpu_task

    server = redis_server()
    task = cpu_task(tmp_path / "tasks")
    a, b = node(tmp_path, "a"), node(tmp_path, "b")
    first = kcache("build", str(task), "--cache-dir", tmp_path / "a", "--remote", server.url, env=a)  # no key
    assert first.exit_code == 0, first.stderr
    env = {**b, "KCACHE_TRUSTED_KEYS": keygen(kcache, node(tmp_path, "c"))}
    second = kcache("build", str(task), "--cache-dir", tmp_path / "b", "--remote", server.url, env=env)
    assert second.exit_code == 0, second.stderr
    assert "not signed" in second.stderr and "pulled" not in second.stderr
    assert Path(second.stdout.strip(), "lib.so").is_file()


def test_import_under_a_trust_list_takes_only_archives_a_listed_key_signed(kcache, tmp_path):
    a, b, m = node(tmp_path, "a"), node(tmp_path, "b"), node(tmp_path, "m")
    a_key = keygen(kcache, a)
    keygen(kcache, m)
    src = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    signed, foreign, plain = tmp_path / "a.tar.zst", tmp_path / "m.tar.zst", tmp_path / "plain.tar.zst"
    assert kcache("export", "--cache-dir", src, signed, env=a).exit_code == 0
    assert kcache("export", "--cache-dir", src, foreign, env=m).exit_code == 0
    assert kcache("export", "--cache-dir", src, plain, env=b).exit_code == 0  # b has no key
    trusting = {**b, "KCACHE_TRUSTED_KEYS": a_key}
    ok = kcache("import", "--cache-dir", tmp_path / "ok", signed, "--json", env=trusting)
    assert ok.exit_code == 0 and len([e for e in ok.json()["entries"] if e["done"]]) == 5, ok.stderr
    for archive, why in ((foreign, "not in the trust list"), (plain, "not signed")):
        run = kcache("import", "--cache-dir", tmp_path / "no", archive, env=trusting)
        lines = run.stderr.splitlines()
        assert run.exit_code == 1 and len(lines) == 1 and why in lines[0], run
        assert not (tmp_path / "no" / "ops").exists()
    # without a trust list, every archive imports, signed or not
    assert kcache("import", "--cache-dir", tmp_path / "open", plain, env=b).exit_code == 0


def test_a_signing_key_named_but_missing_signs_nothing_unseen(kcache, tmp_path):
    """KCACHE_SIGNING_KEY naming a file that is not there (a typo in a fleet's environment) pushed and exported
    unsigned records, exit 0: what a trust list then refuses everywhere. It is a usage error, nothing
    written; an empty variable is unset (the default key, none here: unsigned, as before)."""
    src = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    env = {**node(tmp_path, "a"), "KCACHE_SIGNING_KEY": str(tmp_path / "typo.key")}
    r = kcache("--cache-dir", src, "export", tmp_path / "a.tar", env=env)
    assert r.exit_code == 2 and r.stderr.startswith(f"Error: KCACHE_SIGNING_KEY names {tmp_path / 'typo.key'}"), r
    assert not (tmp_path / "a.tar").exists()
    assert kcache("--cache-dir", src, "export", tmp_path / "b.tar", env=node(tmp_path, "b")).exit_code == 0


def test_a_trust_variable_that_lists_no_key_is_named_as_the_reason(kcache, tmp_path):
    """KCACHE_TRUSTED_KEYS="# none" trusts nothing (fails closed); the refusal names the variable, not a
    trust file that does not exist."""
    src = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    assert kcache("--cache-dir", src, "export", tmp_path / "a.tar", env=node(tmp_path, "a")).exit_code == 0
    env = {**node(tmp_path, "b"), "KCACHE_TRUSTED_KEYS": "# none"}
    r = kcache("--cache-dir", tmp_path / "dst", "import", tmp_path / "a.tar", env=env)
    assert r.exit_code != 0 and "KCACHE_TRUSTED_KEYS lists no key" in r.stderr, r.stderr
