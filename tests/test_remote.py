"""kcache push / pull / remote ls|stats|prune / build --remote, against a real redis-server started by
the tests (tests/redis_server.py) and against a shared directory (file://)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CXX, FIXTURES, copy_tree

from kcache_cli.archive.manifest import EntryRecord
from kcache_cli.model.records import EntryKey
from kcache_cli.remote import formats as f

LAYOUTS = ("hidet", "tilus", "tilelang")
needs_redis = pytest.mark.redis
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")


def tree(root: Path) -> dict[str, object]:
    """Every file (bytes) and symlink (target) under root, kcache's own .kcache/ and CACHEDIR.TAG aside."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == root and d == ".kcache")]
        for n in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            if rel == "CACHEDIR.TAG":
                continue
            out[rel] = ("link", os.readlink(p)) if p.is_symlink() else p.read_bytes()
    return out


def fixtures(tmp_path: Path) -> dict[str, Path]:
    return {name: copy_tree(FIXTURES / name, tmp_path / "src" / name) for name in LAYOUTS}


def one_line_error(run) -> str:
    lines = run.stderr.splitlines()
    assert run.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: "), run
    assert "Traceback" not in run.stderr
    return lines[0]


# ---- the whole round trip ------------------------------------------------------------------------------

def round_trip(kcache, tmp_path: Path, url: str) -> None:
    src = fixtures(tmp_path)
    for root in src.values():
        run = kcache("push", "--cache-dir", root, "--remote", url, "--json")
        assert run.exit_code == 0, run.stderr
        data = run.json()
        assert data["pushed"] == len(data["entries"]) > 0 and data["left_out"] == 0
    for name, root in src.items():
        dest = tmp_path / "dst" / name
        run = kcache("pull", "--cache-dir", dest, "--remote", url, "--layout", name, "--json")
        assert run.exit_code == 0, run.stderr
        assert run.json()["refused"] == 0 and run.json()["pulled"] > 0
        assert tree(dest) == tree(root)
        assert kcache("verify", "--cache-dir", dest).exit_code == 0
        again = kcache("pull", "--cache-dir", dest, "--remote", url, "--layout", name, "--json").json()
        assert again["pulled"] == 0 and {e["action"] for e in again["entries"]} == {"skip"}


@needs_redis
def test_push_then_pull_into_an_empty_root_is_byte_identical_redis(kcache, tmp_path, redis_server):
    round_trip(kcache, tmp_path, redis_server().url)


@needs_redis
def test_a_scheme_in_capitals_is_the_same_remote(kcache, tmp_path, redis_server):
    """RFC 3986: a URL's scheme is case-insensitive (redis-py reads REDIS:// as redis://): kcache too."""
    src = fixtures(tmp_path)["hidet"]
    url = redis_server().url
    pushed = kcache("push", "--cache-dir", src, "--remote", "REDIS" + url[len("redis"):], "--json")
    assert pushed.exit_code == 0 and pushed.json()["pushed"] > 0, pushed.stderr
    (tmp_path / "shared").mkdir()
    filed = kcache("push", "--cache-dir", src, "--remote", f"File://{tmp_path / 'shared'}", "--json")
    assert filed.exit_code == 0 and filed.json()["pushed"] == pushed.json()["pushed"], filed.stderr


def test_push_then_pull_into_an_empty_root_is_byte_identical_file(kcache, tmp_path):
    (tmp_path / "shared").mkdir()
    round_trip(kcache, tmp_path, f"file://{tmp_path / 'shared'}")


def test_a_pull_warns_of_the_kernels_the_layout_does_not_use_here(kcache, tmp_path):
    """As import: a pulled Triton sm_80 kernel is never looked up on an 8.6 GPU (Triton's exact rule,
    Layout.runs_on), though the driver would load it; pull warned only of the sm_90a ones."""
    from test_archive import _fake_nvidia_smi

    shared = tmp_path / "shared"
    shared.mkdir()
    src = copy_tree(FIXTURES / "triton" / "cache", tmp_path / "src")
    assert kcache("push", "--cache-dir", src, "--remote", f"file://{shared}").exit_code == 0
    run = kcache("pull", "--cache-dir", tmp_path / "dst", "--remote", f"file://{shared}",
                 env=_fake_nvidia_smi(tmp_path, "8.6"))
    assert run.exit_code == 0, run.stderr
    assert run.stderr.count("is built for sm_80, which does not run on this machine's GPU") == 3, run.stderr
    assert run.stderr.count("is built for sm_90a, which does not run on this machine's GPU") == 3, run.stderr


def test_a_pull_that_fills_the_disk_says_how_many_entries_it_published(kcache, tmp_path):
    """Free space for the bytes but not for the blocks (66 small files): the disk fills mid-pull. One
    line saying how many entries are here (each whole), and they are exactly those published."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    from test_last_used import mounted

    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    assert kcache("push", "--cache-dir", fixtures(tmp_path)["hidet"], "--remote", url).exit_code == 0
    with mounted(tmp_path / "small", "rw", "300k") as small:
        r = kcache("pull", "--cache-dir", small / "hidet", "--remote", url)
        line = one_line_error(r)
        assert "No space left on device" in line and "pulled " in line and " of 5 entries" in line, line
        n = int(line.split("pulled ")[1].split()[0])
        assert 0 < n < 5
        listed = kcache("--cache-dir", small / "hidet", "ls", "--json").json()["entries"]
        assert len(listed) == n and {e["status"] for e in listed} == {"complete"}


def test_a_pull_of_one_entry_that_fills_the_disk_says_1_entry(kcache, tmp_path):
    """"pulled 0 of 1 entries": the count takes its noun's number."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    from test_last_used import mounted

    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    assert kcache("push", "--cache-dir", fixtures(tmp_path)["hidet"], "--remote", url, "8d1f").exit_code == 0
    with mounted(tmp_path / "small", "rw", "48k") as small:  # room for its bytes, not for its 12 files' blocks
        line = one_line_error(kcache("pull", "--cache-dir", small / "hidet", "--remote", url))
        if "not enough space" in line:
            pytest.skip(f"this tmpfs refuses the pull before it starts: {line}")
        assert "No space left on device" in line and "pulled 0 of 1 entry before it filled" in line, line


@pytest.mark.parametrize("kind", ["file", pytest.param("redis", marks=needs_redis)])
def test_a_pull_that_skips_a_locked_entry_is_exit_3(kcache, tmp_path, request, kind):
    """A build holding an entry's lock past --lock-timeout: pull brings the rest in, then exits 3, as import
    and build do (it said "skip ... its lock was held" and exited 0, so a CI step went on without it)."""
    from test_json_schemas import check
    from test_locks import entry_lock_held

    (tmp_path / "shared").mkdir()
    url = request.getfixturevalue("redis_server")().url if kind == "redis" else f"file://{tmp_path / 'shared'}"
    src, dest = copy_tree(FIXTURES / "hidet", tmp_path / "src"), tmp_path / "dest"
    add = "ops/cuda_space_0/add/8d1f7691cdf75e90"
    assert kcache("push", "--cache-dir", src, "--remote", url).exit_code == 0
    with entry_lock_held(dest, add):
        r = kcache("-q", "pull", "--cache-dir", dest, "--remote", url, "--lock-timeout", "0.5")
        j = kcache("--json", "pull", "--cache-dir", dest, "--remote", url, "--lock-timeout", "0.5")
    assert r.exit_code == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: 1 entry not pulled: its lock was held"), r.stderr
    assert not (dest / add).exists() and len(list(dest.glob("ops/*/*/*"))) == 4  # the rest came in
    doc = j.json()
    assert j.exit_code == 3 and doc["lock_timeouts"] == 1 and doc["skipped"] == 5 and doc["pulled"] == 0, j.stdout
    check(doc, "pull")
    again = kcache("--json", "pull", "--cache-dir", dest, "--remote", url)  # the build gone: it comes in
    assert again.exit_code == 0 and again.json()["pulled"] == 1 and again.json()["lock_timeouts"] == 0
    assert (dest / add).is_dir()


def test_a_pull_that_refuses_an_entry_too_is_exit_1_and_warns_of_the_held_lock(kcache, tmp_path):
    """Refused entries and one whose lock was held: a refusal is what pulling again will not mend (exit 1);
    the held lock is a warning line, and `lock_timeouts` counts it."""
    pytest.importorskip("cryptography")
    from test_locks import entry_lock_held
    from test_remote_trust import keygen, node

    (tmp_path / "shared").mkdir()
    url, src, dest = f"file://{tmp_path / 'shared'}", copy_tree(FIXTURES / "hidet", tmp_path / "src"), tmp_path / "dest"
    signing = node(tmp_path, "a")
    trusted = {**node(tmp_path, "b"), "KCACHE_TRUSTED_KEYS": keygen(kcache, signing)}
    assert kcache("push", "--cache-dir", src, "--remote", url, "8d1f", env=signing).exit_code == 0  # add, signed
    assert kcache("push", "--cache-dir", src, "--remote", url).exit_code == 0  # the 4 others, unsigned
    with entry_lock_held(dest, "ops/cuda_space_0/add/8d1f7691cdf75e90"):
        r = kcache("--json", "pull", "--cache-dir", dest, "--remote", url, "--lock-timeout", "0.5", env=trusted)
    doc = r.json()
    assert r.exit_code == 1 and doc["refused"] == 4 and doc["lock_timeouts"] == 1 and doc["pulled"] == 0, r.stderr
    assert "warning: 1 entry not pulled: its lock was held" in r.stderr and "Error:" not in r.stderr, r.stderr


def test_push_skips_what_the_remote_has_and_dry_run_writes_nothing(kcache, tmp_path):
    root = fixtures(tmp_path)["hidet"]
    shared = tmp_path / "shared"
    shared.mkdir()
    url = f"file://{shared}"
    dry = kcache("push", "--cache-dir", root, "--remote", url, "--dry-run", "--json").json()
    assert dry["pushed"] == 5 and os.listdir(shared) == []
    first = kcache("push", "--cache-dir", root, "--remote", url, "--op", "matmul", "--json").json()
    assert [e["relpath"] for e in first["entries"] if e["done"]] == ["ops/cpu_space_0/matmul/064b4a6c035246e8"]
    second = kcache("push", "--cache-dir", root, "--remote", url, "--json").json()
    assert second["pushed"] == 4 and second["skipped"] == 1
    ls = kcache("remote", "ls", "--remote", url, "--json").json()["entries"]
    assert sorted(e["op"] for e in ls) == ["add", "fused", "matmul", "relu", "softmax"]
    assert all(e["pushed"] and e["last_pulled"] is None and e["size"] > 0 for e in ls)


def test_push_leaves_out_incomplete_and_corrupt_entries(kcache, tmp_path):
    src = fixtures(tmp_path)
    hidet, tilelang = src["hidet"], src["tilelang"]
    (hidet / "ops/cpu_space_0/relu/31857fe085635b31/func_types.pickle").unlink()  # partial
    kernel = next((tilelang / "0.1.15/linux-x86_64/kernels").iterdir())
    victim = kernel / "device_kernel.cu"
    data = bytearray(victim.read_bytes())
    data[10] ^= 1  # same size: the scan calls it complete, its sha256 in manifest.json says otherwise
    victim.write_bytes(bytes(data))
    shared = tmp_path / "shared"
    shared.mkdir()
    h = kcache("push", "--cache-dir", hidet, "--remote", f"file://{shared}", "--json").json()
    t = kcache("push", "--cache-dir", tilelang, "--remote", f"file://{shared}", "--json").json()
    left = {e["relpath"]: e["reason"] for e in h["entries"] + t["entries"] if e["action"] == "left out"}
    assert set(left) == {"ops/cpu_space_0/relu/31857fe085635b31", str(kernel.relative_to(tilelang))}
    assert "corrupt" in left[str(kernel.relative_to(tilelang))]
    remote = {e["relpath"] for e in kcache("remote", "ls", "--remote", f"file://{shared}", "--json").json()["entries"]}
    assert not remote & set(left) and len(remote) == 4 + 1


def test_the_push_summary_points_at_notes_only_when_it_left_entries_out(kcache, tmp_path):
    """The summary said "left out 0 (see the note)" with no entry left out and no note to see."""
    hidet = fixtures(tmp_path)["hidet"]
    shared = tmp_path / "shared"
    shared.mkdir()
    whole = kcache("push", "--cache-dir", hidet, "--remote", f"file://{shared}")
    assert whole.exit_code == 0 and "left out 0" in whole.stderr and "see the note" not in whole.stderr, whole.stderr
    (hidet / "ops/cpu_space_0/relu/31857fe085635b31/func_types.pickle").unlink()  # partial: left out
    (shared / "again").mkdir()
    part = kcache("push", "--cache-dir", hidet, "--remote", f"file://{shared / 'again'}")
    assert part.exit_code == 0 and "left out 1 (see the note)" in part.stderr, part.stderr
    assert "left out" in part.stdout  # the table's row, with its note


# ---- a bad remote entry --------------------------------------------------------------------------------

@needs_redis
def test_a_value_altered_in_redis_is_refused_and_the_others_arrive(kcache, tmp_path, redis_server):
    server = redis_server()
    root = fixtures(tmp_path)["hidet"]
    assert kcache("push", "--cache-dir", root, "--remote", server.url).exit_code == 0
    victim = "ops/cuda_space_0/add/8d1f7691cdf75e90"
    r = server.client()
    record = json.loads(r.get(f.record_key("hidet", victim)))
    key = f.KCACHE_FORMAT.data_keys(EntryRecord.from_json(record))["lib.so"][0]
    value = bytearray(r.get(key))
    value[100] ^= 0xFF
    r.set(key, bytes(value))  # same size, other bytes
    dest = tmp_path / "dest"
    run = kcache("pull", "--cache-dir", dest, "--remote", server.url)
    assert run.exit_code == 1
    refused = [line for line in run.stderr.splitlines() if line.startswith("warning: refused")]
    assert refused == [(f"warning: refused {victim}: lib.so: its sha256 differs from the pushed record "
                        "(damaged or tampered with)")]
    assert not (dest / victim).exists()
    arrived = {str(p.relative_to(dest)) for p in dest.glob("ops/*/*/*")}
    assert arrived == {e for e in (str(p.relative_to(root)) for p in root.glob("ops/*/*/*")) if e != victim}
    assert not list((dest / ".kcache").glob("import-*"))


def test_a_record_breaking_imports_rules_is_refused_alone(kcache, tmp_path):
    from kcache_cli.remote.store import open_store

    root = fixtures(tmp_path)["hidet"]
    shared = tmp_path / "shared"
    shared.mkdir()
    url = f"file://{shared}"
    assert kcache("push", "--cache-dir", root, "--remote", url).exit_code == 0
    store = open_store(url)
    rel = "ops/cpu_space_0/relu/31857fe085635b31"
    rec = json.loads(store.get([f.record_key("hidet", rel)])[0])
    rec["links"] = {"escape": "../../../../../etc/passwd"}
    store.delete([f.record_key("hidet", rel)])
    store.put({f.record_key("hidet", rel): json.dumps(rec).encode()})
    dest = tmp_path / "dest"
    run = kcache("pull", "--cache-dir", dest, "--remote", url, "--json")
    assert run.exit_code == 1
    refused = [e for e in run.json()["entries"] if e["action"] == "refuse"]
    assert [(e["relpath"], "points outside the cache" in e["reason"]) for e in refused] == [(rel, True)]
    assert run.json()["pulled"] == 4 and not (dest / rel).exists()


def test_a_pushed_record_says_no_last_use_and_a_pull_is_a_use(kcache, tmp_path):
    """Export's records say when each entry was last used, and import restores it; a remote's record is
    pushed once for every node to pull, so the pusher's last use would make what a node pulls today look
    unused to its prune by age. Push leaves it out (the remote keeps its own: last_pulled)."""
    import time
    from datetime import datetime

    from kcache_cli.remote.store import open_store

    root = fixtures(tmp_path)["hidet"]
    for p in [root, *root.rglob("*")]:
        os.utime(p, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    url = f"file://{shared}"
    assert kcache("push", "--cache-dir", root, "--remote", url).exit_code == 0
    rel = "ops/cpu_space_0/relu/31857fe085635b31"
    rec = json.loads(open_store(url).get([f.record_key("hidet", rel)])[0])
    assert "pushed" in rec and "last_used" not in rec
    dest = tmp_path / "dest"
    assert kcache("pull", "--cache-dir", dest, "--remote", url).exit_code == 0
    entries = kcache("ls", "--cache-dir", dest, "--json").json()["entries"]
    assert len(entries) == 5
    assert all(datetime.fromisoformat(e["last_used"]).timestamp() > time.time() - 600 for e in entries)


# ---- build --remote ------------------------------------------------------------------------------------

def counting_cxx(tmp_path: Path) -> tuple[Path, Path]:
    """A g++ wrapper that counts its compiles (not `--version` probes) in a file, then runs the real g++."""
    count = tmp_path / "compiles"
    count.write_text("")
    script = tmp_path / "counting-g++"
    script.write_text(f"#!/bin/sh\ncase \" $* \" in *\" -o \"*) echo x >> {count};; esac\nexec {CXX} \"$@\"\n")
    script.chmod(0o755)
    return script, count


def cpu_task(where: Path) -> Path:
    from test_build import write_task

    return write_task(where, name="vadd", n=64, kind="cc")


@needs_redis
@needs_cxx
def test_two_nodes_building_the_same_task_compile_once(kcache, tmp_path, redis_server):
    server = redis_server()
    cxx, count = counting_cxx(tmp_path)
    task = cpu_task(tmp_path / "tasks")
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    a = kcache("build", str(task), "--cache-dir", node_a, "--remote", server.url, "--cxx", cxx)
    assert a.exit_code == 0, a.stderr
    b = kcache("build", str(task), "--cache-dir", node_b, "--remote", server.url, "--cxx", cxx, "--json")
    assert b.exit_code == 0, b.stderr
    result = b.json()["results"][0]
    assert result["status"] == "hit" and any("pulled" in n for n in result["notes"])
    assert count.read_text().count("x") == 1
    entry = result["relpath"]
    assert tree(node_a / entry) == tree(node_b / entry)
    assert os.access(node_b / entry / "lib.so", os.X_OK)
    hit = kcache("build", str(task), "--cache-dir", node_b, "--remote", server.url, "--cxx", cxx)
    assert hit.exit_code == 0 and count.read_text().count("x") == 1


@needs_redis
@needs_cxx
def test_build_with_redis_stopped_builds_locally_and_exits_0(kcache, tmp_path, redis_server):
    server = redis_server()
    server.stop()
    task = cpu_task(tmp_path / "tasks")
    root = tmp_path / "node"
    run = kcache("build", str(task), "--cache-dir", root, "--remote", server.url)
    assert run.exit_code == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "remote not used" in warnings[0] and "127.0.0.1" in warnings[0]
    assert Path(run.stdout.strip(), "lib.so").is_file()


@needs_redis
@needs_cxx
def test_build_with_a_redis_that_refuses_us_builds_locally(kcache, tmp_path, redis_server):
    server = redis_server(password="s3cret")
    task = cpu_task(tmp_path / "tasks")
    run = kcache("build", str(task), "--cache-dir", tmp_path / "node", "--remote", server.url)  # no password
    assert run.exit_code == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert warnings and all("remote" in w for w in warnings) and "Traceback" not in run.stderr
    ok = kcache("push", "--cache-dir", tmp_path / "node", "--remote",
                f"redis://:s3cret@127.0.0.1:{server.port}/0", "--json")
    assert ok.exit_code == 0 and ok.json()["pushed"] == 1 and "s3cret" not in ok.stdout


def test_build_with_a_local_hit_never_opens_the_remote(kcache, tmp_path):
    task = cpu_task(tmp_path / "tasks")
    root = tmp_path / "node"
    assert kcache("build", str(task), "--cache-dir", root).exit_code == 0
    run = kcache("build", str(task), "--cache-dir", root, "--remote", "redis://127.0.0.1:1/0")
    assert run.exit_code == 0 and run.stderr == ""


# ---- a Redis killed midway ----------------------------------------------------------------------------

def _complete_on_the_remote(client) -> dict[str, dict]:
    """Every entry the index lists, each with a record and all its data."""
    out = {}
    for field in client.hkeys(f.INDEX):
        layout, _, rel = field.decode().partition(":")
        record = json.loads(client.get(f.record_key(layout, rel)))
        for keys in f.KCACHE_FORMAT.data_keys(EntryRecord.from_json(record)).values():
            assert all(client.exists(k) for k in keys), rel
        out[rel] = record
    return out


@needs_redis
def test_redis_killed_in_the_middle_of_a_push_leaves_no_partial_entry(kcache, tmp_path, redis_server,
                                                                     monkeypatch):
    from kcache_cli.remote import push as push_mod
    from kcache_cli.remote.store import RedisStore

    server = redis_server(persistent=True)
    root = fixtures(tmp_path)["hidet"]
    monkeypatch.setattr(push_mod, "BATCH_ENTRIES", 1)  # one entry per round trip: the crash falls between two
    calls = []
    real_put = RedisStore.put

    def put_then_die(self, items, ttl=None, only_new=False):
        calls.append(len(items))
        if len(calls) == 3:  # two entries published; the third one's data half written, then the crash
            half = dict(list(items.items())[:len(items) // 2])
            real_put(self, half, ttl, only_new)
            server.kill()
        return real_put(self, items, ttl, only_new)

    monkeypatch.setattr(RedisStore, "put", put_then_die)
    run = kcache("push", "--cache-dir", root, "--remote", server.url)
    assert one_line_error(run).startswith(f"Error: remote {server.url}: ")
    monkeypatch.setattr(RedisStore, "put", real_put)
    server.start()  # the same append-only file: what it had acknowledged
    client = server.client()
    published = _complete_on_the_remote(client)
    assert len(published) == 2
    pending = [k for k in client.keys(f"{f.NAMESPACE}:*:data:*") if client.ttl(k) > 0]
    assert pending  # the third entry's data is there, unpublished, and expires by itself
    dest = tmp_path / "dest"
    pulled = kcache("pull", "--cache-dir", dest, "--remote", server.url, "--json").json()
    assert pulled["pulled"] == 2 and pulled["refused"] == 0
    assert kcache("verify", "--cache-dir", dest).exit_code == 0
    again = kcache("push", "--cache-dir", root, "--remote", server.url, "--json").json()
    assert again["pushed"] == 3 and again["skipped"] == 2
    assert all(client.ttl(k) == -1 for k in client.keys(f"{f.NAMESPACE}:*:data:*")
               if any(k.decode().startswith(f"{f.NAMESPACE}:hidet:{rel}:") for rel in _complete_on_the_remote(client)))


@needs_redis
def test_redis_killed_in_the_middle_of_a_pull_leaves_no_partial_entry(kcache, tmp_path, redis_server, monkeypatch):
    from kcache_cli.remote import pull as pull_mod
    from kcache_cli.remote.store import RedisStore

    server = redis_server()
    root = fixtures(tmp_path)["hidet"]
    assert kcache("push", "--cache-dir", root, "--remote", server.url).exit_code == 0
    monkeypatch.setattr(pull_mod, "BATCH_ENTRIES", 2)
    real_get = RedisStore.get
    calls = []

    def get_then_die(self, keys, limit=f.MAX_FILE):
        calls.append(keys)
        if len(calls) == 3:  # the records, the first batch's data, then the crash
            server.kill()
        return real_get(self, keys, limit)

    monkeypatch.setattr(RedisStore, "get", get_then_die)
    dest = tmp_path / "dest"
    run = kcache("pull", "--cache-dir", dest, "--remote", server.url)
    assert one_line_error(run).startswith(f"Error: remote {server.url}: ")
    entries = kcache("ls", "--cache-dir", dest, "--json").json()["entries"]
    assert len(entries) == 2 and {e["status"] for e in entries} == {"complete"}
    assert kcache("verify", "--cache-dir", dest).exit_code == 0
    assert not list((dest / ".kcache").glob("import-*"))
    for e in entries:
        assert tree(Path(e["path"])) == tree(root / e["path"][len(str(dest)) + 1:])


# ---- two pushers of one entry --------------------------------------------------------------------------

def _stores(tmp_path, redis_server):
    from kcache_cli.remote.store import open_store

    (tmp_path / "shared").mkdir()
    yield open_store(f"file://{tmp_path / 'shared'}")
    from redis_server import REDIS_SERVER

    if REDIS_SERVER:
        yield open_store(redis_server().url)


def test_two_pushers_of_one_entry_do_not_fight(tmp_path, redis_server):
    from kcache_cli.remote.pull import read_records
    from kcache_cli.remote.push import publish_entry

    record = {"layout": "hidet", "kind": "op", "target": "cpu", "space": "cpu_space_0", "op": "relu",
              "hash": "0123456789abcdef", "relpath": "ops/cpu_space_0/relu/0123456789abcdef", "files": {},
              "links": {}, "dirs": [], "locks": [], "status": "complete"}

    def entry(payload: bytes):
        import hashlib

        files = {"lib.so": [len(payload), hashlib.sha256(payload).hexdigest()]}
        return EntryRecord.from_json({**record, "files": files}), {"lib.so": payload}

    for store in _stores(tmp_path, redis_server):
        first, second = entry(b"built on node A"), entry(b"built on node B!")
        assert publish_entry(store, *first) is True
        assert publish_entry(store, *second) is False
        (rec,), _ = read_records(store, [("hidet", record["relpath"])])
        assert rec["files"] == {n: list(v) for n, v in first[0].files.items()}
        keys = f.KCACHE_FORMAT.data_keys(EntryRecord.from_json(rec))["lib.so"]
        loser = f.KCACHE_FORMAT.data_keys(second[0])["lib.so"]
        assert store.get(keys) == [b"built on node A"] and store.get(loser) == [None]


# ---- remote ls / stats / prune -------------------------------------------------------------------------

def test_remote_ls_stats_and_prune_least_recently_pulled_first(kcache, tmp_path):
    from kcache_cli.remote.store import open_store

    root = fixtures(tmp_path)["hidet"]
    shared = tmp_path / "shared"
    shared.mkdir()
    url = f"file://{shared}"
    assert kcache("push", "--cache-dir", root, "--remote", url).exit_code == 0
    kept = ["ops/cuda_space_0/add/8d1f7691cdf75e90", "ops/cpu_space_0/matmul/064b4a6c035246e8"]
    assert kcache("pull", "--cache-dir", tmp_path / "d", "--remote", url, "8d1f7691", "064b4a6c").exit_code == 0
    store = open_store(url)
    pulled = dict(kv for batch in store.hash_scan(f.PULLED) for kv in batch)
    assert sorted(k.split(":", 1)[1] for k in pulled) == sorted(kept)
    stats = kcache("remote", "stats", "--remote", url, "--json").json()
    assert stats["entry_count"] == 5 and stats["never_pulled"] == 3 and stats["by_layout"]["hidet"]["entry_count"] == 5
    total = stats["size"]
    sizes = {e["relpath"]: e["size"] for e in kcache("remote", "ls", "--remote", url, "--json").json()["entries"]}
    limit = sum(sizes[k] for k in kept)
    dry = kcache("remote", "prune", "--remote", url, "--max-size", f"{limit}B", "--dry-run", "--json").json()
    assert sorted(e["relpath"] for e in dry["removed"]) == sorted(set(sizes) - set(kept))
    assert kcache("remote", "stats", "--remote", url, "--json").json()["size"] == total  # dry run: nothing gone
    done = kcache("remote", "prune", "--remote", url, "--max-size", f"{limit}B", "--json").json()
    assert done["freed"] == total - limit
    assert sorted(e["relpath"] for e in kcache("remote", "ls", "--remote", url,
                                               "--json").json()["entries"]) == sorted(kept)
    assert sorted(os.listdir(shared)) == sorted(os.listdir(shared))  # no stray files:
    left = [n for n in os.listdir(shared) if not n.endswith(".d")]
    assert all(any(k.replace("/", "%2F") in n for k in kept) for n in left)
    old = kcache("remote", "prune", "--remote", url, "--older-than", "1s", "--dry-run", "--json").json()
    assert old["removed"] == []  # pulled just now


# ---- errors and start-up -------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("push",), ("pull", "--remote", "ftp://x"), ("remote", "ls", "--remote", "file://rel"),
                                  ("push", "--remote", "file:///no/such/dir"),
                                  ("pull", "--remote", "redis://127.0.0.1:1/0")])
def test_errors_are_one_line(kcache, tmp_path, args):
    one_line_error(kcache(*args, "--cache-dir", tmp_path / "c") if args[0] != "remote" else kcache(*args))


@pytest.mark.parametrize("argv, store", [(["--version"], False), (["push", "--help"], True)])
def test_version_and_help_do_not_import_redis(argv, store):
    """The redis client loads when a redis:// store is opened; `--version` loads no remote code at all."""
    code = ("import sys\nfrom kcache_cli.cli.app import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint('redis' in sys.modules, 'kcache_cli.remote.store' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == f"False {store}"


# ---- Triton's own format -------------------------------------------------------------------------------

def triton_entry(root: Path) -> Path:
    """A Triton-style kernel directory: files, and __grp__ with absolute child paths (written last)."""
    d = root / "CZJ5GTQ6TE5VJRXZQKQ3BBXV6XWKB6MCHHXM2TL5U5R2IGNCS3MA"
    d.mkdir(parents=True)
    names = ["add_kernel.cubin", "add_kernel.json", "add_kernel.ptx", "add_kernel.ttir"]
    for i, n in enumerate(names):
        (d / n).write_bytes(bytes([i]) * (100 + i))
    (d / "__grp__add_kernel.json").write_text(json.dumps({"child_paths": {n: str(d / n) for n in names}}))
    return d


def triton_record(d: Path) -> tuple[dict, dict[str, bytes]]:
    import hashlib

    data = {p.name: p.read_bytes() for p in d.iterdir()}
    files = {n: [len(v), hashlib.sha256(v).hexdigest()] for n, v in data.items()}
    return {"layout": "triton", "kind": "kernel", "target": None, "space": None, "op": None, "hash": d.name,
            "relpath": d.name, "files": files, "links": {}, "dirs": [], "locks": [], "status": "complete"}, data


@needs_redis
@pytest.mark.parametrize("key_format", [None, "tk/{key}/{filename}"])
def test_triton_entries_use_tritons_own_keys_and_group_format(tmp_path, redis_server, monkeypatch, key_format):
    from kcache_cli.layouts.triton_remote import TritonFormat
    from kcache_cli.remote.push import publish_entry
    from kcache_cli.remote.store import open_store

    if key_format:
        monkeypatch.setenv("TRITON_REDIS_KEY_FORMAT", key_format)
    server = redis_server()
    d = triton_entry(tmp_path / "triton-cache")
    record, data = triton_record(d)
    assert isinstance(f.format_for("triton"), TritonFormat)  # what TritonLayout.remote_format returns
    store = open_store(server.url)
    assert publish_entry(store, EntryRecord.from_json(record), data) is True
    r = server.client()
    fmt = key_format or "triton:{key}:{filename}"
    children = sorted(n for n in data if not n.startswith("__grp__"))
    for n in children:
        assert r.get(fmt.format(key=d.name, filename=n)) == data[n]
        assert r.ttl(fmt.format(key=d.name, filename=n)) == -1
    group = r.get(fmt.format(key=d.name, filename="__grp__add_kernel.json"))
    assert group == json.dumps({"child_paths": children}).encode()  # literally what Triton's put_group stores
    assert group.decode() == ('{"child_paths": ["add_kernel.cubin", "add_kernel.json", "add_kernel.ptx", '
                              '"add_kernel.ttir"]}')
    # Pulled elsewhere, the group file names this machine's absolute paths.
    (rec,), _ = __import__("kcache_cli.remote.pull", fromlist=["x"]).read_records(store, [("triton", d.name)])
    assert rec["groups"] == ["__grp__add_kernel.json"] and "__grp__add_kernel.json" not in rec["files"]
    local = TritonFormat().local_files(EntryRecord.from_json(rec), "/elsewhere/cache/" + d.name)
    assert json.loads(local["__grp__add_kernel.json"]) == {
        "child_paths": {n: f"/elsewhere/cache/{d.name}/{n}" for n in children}}


@needs_redis
def test_kernels_triton_pushed_itself_are_found(redis_server):
    from kcache_cli.layouts.triton_remote import TritonFormat
    from kcache_cli.remote.store import open_store

    server = redis_server()
    r = server.client()
    # What triton's RedisRemoteCacheBackend.put writes: one MSET per file, the group file last.
    r.mset({"triton:ABC:k.cubin": b"\x7fELF cubin", "triton:ABC:k.json": b'{"name": "k"}'})
    r.set("triton:ABC:__grp__k.json", json.dumps({"child_paths": ["k.cubin", "k.json"]}))
    r.set("triton:HALF:__grp__h.json", json.dumps({"child_paths": ["h.cubin"]}))  # a child never came
    found = list(TritonFormat().foreign(open_store(server.url)))
    assert [(rec["relpath"], sorted(rec["files"]), rec["groups"]) for rec, _ in found] == \
        [("ABC", ["k.cubin", "k.json"], ["__grp__k.json"])]
    assert found[0][1]["k.cubin"] == b"\x7fELF cubin"


@needs_cxx
def test_kcache_remote_in_the_environment_is_the_default_and_no_remote_ignores_it(kcache, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {"KCACHE_REMOTE": f"file://{shared}"}
    task = cpu_task(tmp_path / "tasks")
    off = kcache("build", str(task), "--cache-dir", tmp_path / "a", "--no-remote", env=env)
    assert off.exit_code == 0 and os.listdir(shared) == []
    on = kcache("build", str(task), "--cache-dir", tmp_path / "b", env=env)
    assert on.exit_code == 0, on.stderr
    listed = kcache("remote", "ls", "--json", env=env).json()["entries"]
    assert [e["op"] for e in listed] == ["vadd"] and listed[0]["relpath"] == str(
        Path(on.stdout.strip()).relative_to(tmp_path / "b"))


@needs_redis
@needs_cxx
def test_build_with_a_stalled_redis_gives_up_on_it_and_builds_locally(kcache, tmp_path, redis_server):
    import signal

    server = redis_server()
    task = cpu_task(tmp_path / "tasks")
    os.kill(server.proc.pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        run = kcache("build", str(task), "--cache-dir", tmp_path / "node", "--remote", server.url,
                     "--remote-timeout", "0.2")
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert run.exit_code == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "remote not used" in warnings[0] and "imeout" in warnings[0], warnings
    assert Path(run.stdout.strip(), "lib.so").is_file()


def test_a_layouts_local_files_are_held_to_imports_rules(tmp_path):
    from kcache_cli.remote.pull import _extra_problem

    rec = EntryRecord(EntryKey("triton", "kernel", None, None, None, "k", "k"), {"k.cubin": (1, "0" * 64)}, {}, (), (),
                      "complete", None, None, None)
    assert _extra_problem(rec, {"__grp__k.json": b"{}"}) is None
    for bad in ("../../escape", "sub/file", "k.cubin", ".lock", ""):
        assert _extra_problem(rec, {bad: b"x"}) is not None, bad


@pytest.mark.parametrize("sub", ["ls", "stats", "prune"])
def test_remote_subcommands_have_help_with_an_example_and_take_global_options(kcache, tmp_path, sub):
    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    app = full_app()

    cmd = get_command(app).commands["remote"].commands[sub]
    assert cmd.callback.__doc__.strip().splitlines()[-1].strip().startswith(f"Example: kcache remote {sub}")
    assert all(p.help for p in cmd.params if not getattr(p, "hidden", False))
    shared = tmp_path / "shared"
    shared.mkdir()
    run = kcache("remote", sub, "-q", "--debug", "--json", "--remote", f"file://{shared}")
    assert run.exit_code == 0 and run.stderr == "" and json.loads(run.stdout) is not None


def test_entries_of_a_layout_this_kcache_does_not_know_are_skipped_not_refused(kcache, tmp_path):
    from kcache_cli.remote.push import publish_entry
    from kcache_cli.remote.store import open_store

    shared = tmp_path / "shared"
    shared.mkdir()
    record, data = triton_record(triton_entry(tmp_path / "triton-cache"))
    record = EntryRecord.from_json(record)
    record = record._replace(key=record.key._replace(layout="newtool"))  # a layout this kcache does not know
    assert publish_entry(open_store(f"file://{shared}"), record, data)
    run = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", f"file://{shared}", "--json")
    assert run.exit_code == 0, run.stderr
    assert [(e["action"], e["reason"]) for e in run.json()["entries"]] == [
        ("skip", "unknown layout 'newtool': this kcache does not know it")]  # as import and explain name it


def test_a_shared_directory_takes_keys_longer_than_a_file_name(tmp_path):
    from kcache_cli.remote.store import open_store

    (tmp_path / "shared").mkdir()
    store = open_store(f"file://{tmp_path / 'shared'}")
    long_a, long_b = "kcache:v1:hidet:" + "x" * 300 + ":a", "kcache:v1:hidet:" + "x" * 300 + ":b"
    store.put({long_a: b"A", long_b: b"B"})
    assert store.get([long_a, long_b]) == [b"A", b"B"]


def test_a_pull_is_bounded_like_an_import(tmp_path):
    from kcache_cli.archive import ImportLimits, check_total
    from kcache_cli.util.errors import KcacheError

    check_total(tmp_path, 10, ImportLimits(max_total=10))
    with pytest.raises(KcacheError, match="over the limit of 10"):
        check_total(tmp_path, 11, ImportLimits(max_total=10))
    with pytest.raises(KcacheError, match="not enough space"):
        check_total(tmp_path, 1 << 60, ImportLimits(max_total=1 << 62))


def test_prune_of_a_shared_directory_removes_data_of_pushes_that_never_published(kcache, tmp_path):
    import time

    shared = tmp_path / "shared"
    shared.mkdir()
    old, fresh = shared / ".pending-kcache:v1:hidet:x:data:ab:0", shared / ".pending-kcache:v1:hidet:y:data:cd:0"
    old.write_bytes(b"orphan")
    fresh.write_bytes(b"a push in progress")
    then = time.time() - 2 * 24 * 3600
    os.utime(old, (then, then))
    run = kcache("remote", "prune", "--remote", f"file://{shared}", "--older-than", "30d")
    assert run.exit_code == 0, run.stderr
    assert not old.exists() and fresh.exists()


@needs_redis
def test_the_real_triton_cache_through_redis_is_a_triton_hit_elsewhere(kcache, tmp_path, redis_server):
    """The cache triton 3.9.0 wrote, pushed with kcache to a real redis-server under Triton's own keys and
    pulled into another root: every child Triton's get_group lists exists in the new root (Triton's rule,
    applied literally as in test_triton.py), every other byte is the same, and verify is clean."""
    server = redis_server()
    src = copy_tree(FIXTURES / "triton" / "cache", tmp_path / "src")
    run = kcache("push", "--cache-dir", src, "--remote", server.url, "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["pushed"] == 6
    keys = {k.decode() for k in server.client().keys("triton:*:__grp__*")}
    assert len(keys) == 6  # one group key per kernel, in Triton's RedisRemoteCacheBackend format
    dest = tmp_path / "node2" / ".triton" / "cache"
    run = kcache("pull", "--cache-dir", dest, "--remote", server.url, "--layout", "triton", "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["pulled"] == 6 and run.json()["refused"] == 0
    real = os.path.realpath(dest)
    for entry in src.iterdir():
        grp = next((dest / entry.name).glob("__grp__*.json"))
        children = json.loads(grp.read_text())["child_paths"]
        assert children and all(os.path.exists(p) and p == os.path.join(real, entry.name, c)
                                for c, p in children.items())
        assert grp.name[len("__grp__"):] in children  # the metadata file the compiler needs
        for fpath in entry.iterdir():
            if not fpath.name.startswith("__grp__"):
                assert (dest / entry.name / fpath.name).read_bytes() == fpath.read_bytes()
    assert kcache("verify", "--cache-dir", dest).exit_code == 0


@pytest.mark.parametrize("sub", ["ls", "stats", "prune"])
def test_a_remote_named_with_an_escape_reaches_no_terminal_raw(kcache, tmp_path, sub):
    """A file:// remote whose path holds ESC: every line naming it, the totals `remote stats` prints on
    stdout included, shows the escape as `\\x1b`, as paths are shown everywhere else."""
    shared = tmp_path / "shared\x1b[31mred"
    shared.mkdir()
    url = f"file://{shared}"
    assert kcache("push", "--cache-dir", fixtures(tmp_path)["hidet"], "--remote", url).exit_code == 0
    run = kcache("remote", sub, "--remote", url, *(["--max-size", "1T"] if sub == "prune" else []))
    assert run.exit_code == 0, run.stderr
    assert "\x1b" not in run.stdout + run.stderr and "\\x1b[31mred" in run.stdout + run.stderr


def test_push_and_pull_q_are_silent_when_they_work(kcache, tmp_path, fixture_copy):
    """A CI step (`kcache -q push`, `-q pull`) prints nothing when it works, as `-q export` and `-q import`
    do: push printed a row per entry and its totals whatever -q said."""
    shared = tmp_path / "shared"
    shared.mkdir()
    src = fixture_copy("hidet")
    url = f"file://{shared}"
    pushed = kcache("-q", "push", "--cache-dir", src, "--remote", url)
    assert pushed.exit_code == 0 and pushed.stdout == "" and pushed.stderr == "", pushed.stdout + pushed.stderr
    pulled = kcache("-q", "pull", "--cache-dir", tmp_path / "dst", "--remote", url)
    assert pulled.exit_code == 0 and pulled.stdout == "" and pulled.stderr == "", pulled.stdout + pulled.stderr
    assert kcache("--cache-dir", tmp_path / "dst", "ls", "--json").json()["entry_count"] == 5
    loud = kcache("push", "--cache-dir", src, "--remote", url)
    assert loud.exit_code == 0 and "skip" in loud.stdout  # without -q: the table, each entry the remote has


def test_remote_stats_groups_the_digits_of_its_counts(kcache, tmp_path):
    """`remote stats` of 1,000 entries said "1000" in its table under "1,000 entries" in its last line."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_cache import generate

    generate(str(tmp_path / "src"), 1000, lib_size=256)
    shared = tmp_path / "shared"
    shared.mkdir()
    url = f"file://{shared}"
    assert kcache("-q", "push", "--cache-dir", tmp_path / "src", "--remote", url).exit_code == 0
    run = kcache("remote", "stats", "--remote", url)
    assert run.exit_code == 0, run.stderr
    assert "1,000" in run.stdout.splitlines()[1] and "1000" not in run.stdout.replace(str(shared), ""), run.stdout
