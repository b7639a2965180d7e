"""Remotes are untrusted input (DESIGN.md §9, issue 21): hostile servers on loopback
(tests/hostile_resp.py) and a real redis-server holding crafted records."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import CXX, FIXTURES, copy_tree
from hostile_resp import OK, HostileServer, array, bulk, integer

from kcache_cli.remote import formats as f

needs_redis = pytest.mark.redis
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")
KCACHE = [sys.executable, "-m", "kcache_cli"]


def one_line_error(run, code: int = 1) -> str:
    lines = run.stderr.splitlines()
    assert run.exit_code == code and len(lines) == 1 and lines[0].startswith("Error: "), run
    assert "unexpected" not in lines[0] and "Traceback" not in run.stderr
    return lines[0]


def child(args: list[str], env: dict | None = None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, int]:
    """Run `kcache ARGS` as the child of a small wrapper that reports the child's peak RSS (bytes)
    from resource.getrusage(RUSAGE_CHILDREN): (the run, peak RSS). The timeout guards against a hang."""
    wrapper = textwrap.dedent("""
        import resource, subprocess, sys
        p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        sys.stderr.write(p.stderr.decode(errors="replace"))
        sys.stdout.write(p.stdout.decode(errors="replace")[-2000:])
        sys.stderr.write("\\nRSS %d RC %d\\n" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode))
    """)
    run = subprocess.run([sys.executable, "-c", wrapper, *KCACHE, *args], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **(env or {})})
    tail = run.stderr.rsplit("RSS ", 1)[1].split()
    run.returncode = int(tail[2])
    run.stderr = run.stderr.rsplit("\nRSS ", 1)[0]
    return run, int(tail[0]) * 1024


def cpu_task(where: Path) -> Path:
    from test_build import write_task

    return write_task(where, name="vadd", n=64, kind="cc")


# ---- a server that is not Redis ---------------------------------------------------------------------

def _hello_ok(cmd: list[bytes]) -> bytes:
    return OK  # HELLO, and everything else, answered +OK


def test_a_server_answering_hello_with_ok_is_a_clear_error(kcache):
    server = HostileServer(_hello_ok)
    try:
        run = kcache("remote", "ls", "--remote", server.url + "?protocol=3")
        line = one_line_error(run)
        assert "not one a Redis server gives" in line and b"HELLO" in server.commands
    finally:
        server.stop()


@needs_cxx
def test_build_against_a_server_answering_hello_with_ok_builds_locally(kcache, tmp_path):
    server = HostileServer(_hello_ok)
    try:
        run = kcache("build", str(cpu_task(tmp_path / "tasks")), "--cache-dir", tmp_path / "node",
                     "--remote", server.url + "?protocol=3")
    finally:
        server.stop()
    assert run.exit_code == 0, run.stderr
    assert Path(run.stdout.strip(), "lib.so").is_file()
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert warnings and all("remote" in w for w in warnings) and "unexpected" not in run.stderr


def _pong_slowly(cmd: list[bytes]) -> bytes:
    return bulk(b"x" * 64)  # whatever was asked: 64 bytes, one every 3 s


@needs_cxx
def test_a_trickling_server_cannot_hang_build_past_its_remote_timeout(tmp_path):
    server = HostileServer(_pong_slowly, trickle=3.0)
    start = time.monotonic()
    try:
        run, _ = child(["build", str(cpu_task(tmp_path / "tasks")), "--cache-dir", str(tmp_path / "node"),
                        "--remote", server.url, "--remote-timeout", "1"], timeout=90)
    finally:
        server.stop()
    took = time.monotonic() - start
    assert run.returncode == 0, run.stderr
    assert "--remote-timeout" in run.stderr and "Traceback" not in run.stderr
    assert Path(run.stdout.strip().splitlines()[-1], "lib.so").is_file()
    print(f"build against a trickling remote, --remote-timeout 1: {took:.1f} s")


def test_a_trickling_server_cannot_hang_remote_ls(kcache):
    server = HostileServer(_pong_slowly, trickle=3.0)
    try:
        run = kcache("remote", "ls", "--remote", server.url, "--remote-timeout", "0.5")
    finally:
        server.stop()
    assert "--remote-timeout" in one_line_error(run)


def _scripted(replies: dict[str, bytes]):
    """Answers EVALSHA of the script holding a given word (HSCAN, STRLEN...) with a canned reply; the
    scripts themselves are accepted by SCRIPT LOAD, as Redis would."""
    scripts: dict[bytes, bytes] = {}

    def answer(cmd: list[bytes]) -> bytes:
        name = cmd[0].upper()
        if name == b"HELLO":
            return b"%1\r\n$5\r\nproto\r\n:3\r\n"
        if name == b"SCAN":
            return array([bulk(b"0"), array([])])
        if name == b"SCRIPT" and cmd[1].upper() == b"LOAD":
            sha = hashlib.sha1(cmd[2]).hexdigest().encode()
            scripts[sha] = cmd[2]
            return bulk(sha)
        if name == b"EVALSHA":
            text = scripts.get(cmd[1])
            if text is None:
                return b"-NOSCRIPT No matching script.\r\n"
            for word, reply in replies.items():
                if word.encode() in text:
                    return reply
        return OK
    return answer


def test_a_server_claiming_a_huge_value_is_never_asked_for_it(kcache, tmp_path):
    summary = json.dumps({"layout": "hidet", "kind": "op", "relpath": "ops/cpu_space_0/a/1", "hash": "1"}).encode()
    server = HostileServer(_scripted({
        "HSCAN": array([bulk(b"0"), array([bulk(b"hidet:ops/cpu_space_0/a/1"), bulk(summary)])]),
        "HSTRLEN": array([bulk(None)]),
        "STRLEN": array([integer(10 ** 18)]),  # the record: "10^18 bytes"
    }))
    try:
        run = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", server.url, "--json")
    finally:
        server.stop()
    assert run.exit_code == 1 and "Traceback" not in run.stderr, run.stderr
    entry, = run.json()["entries"]
    assert entry["action"] == "refuse" and f"{10 ** 18} bytes" in entry["reason"]
    assert b"GET" not in server.commands and b"MGET" not in server.commands



def test_a_server_sending_more_than_it_was_asked_for_is_cut_off(tmp_path):
    """The record is asked for within MAX_RECORD (16 MiB); the server answers with a 160 MB string (a
    3 GB one held 8.8 GB): kcache stops reading it a little past the limit, in one line."""
    summary = json.dumps({"layout": "hidet", "kind": "op", "relpath": "ops/cpu_space_0/a/1", "hash": "1"}).encode()
    huge = 160_000_000
    server = HostileServer(_scripted({
        "HSCAN": array([bulk(b"0"), array([bulk(b"hidet:ops/cpu_space_0/a/1"), bulk(summary)])]),
        "HSTRLEN": array([bulk(None)]),
        "STRLEN": b"*1\r\n$%d\r\n%s\r\n" % (huge, bytes(huge)),
    }))
    try:
        run, rss = child(["pull", "--cache-dir", str(tmp_path / "dest"), "--remote", server.url])
    finally:
        server.stop()
    print(f"pull answered with a {huge / 1e6:.0f} MB string: peak RSS {rss / 1e6:.0f} MB")
    assert run.returncode == 1 and run.stderr.startswith("Error: ") and "Traceback" not in run.stderr, run.stderr
    assert "more than" in run.stderr, run.stderr
    assert rss < 150e6

# ---- a real redis-server holding crafted records ---------------------------------------------------------

def _push(kcache, root: Path, url: str) -> None:
    run = kcache("push", "--cache-dir", root, "--remote", url)
    assert run.exit_code == 0, run.stderr


def _record(client, relpath: str, layout: str = "hidet") -> dict:
    return json.loads(client.get(f.record_key(layout, relpath)))


@needs_redis
def test_a_record_claiming_a_huge_file_is_refused_once_and_never_blocks_prune(kcache, tmp_path, redis_server):
    server = redis_server()
    client = server.client()
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    _push(kcache, root, server.url)
    victim = "ops/cpu_space_0/relu/31857fe085635b31"
    rec = _record(client, victim)
    name = next(iter(rec["files"]))
    rec["files"][name][0] = 10 ** 20
    client.set(f.record_key("hidet", victim), json.dumps(rec))
    pulled = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", server.url, "--json")
    assert pulled.exit_code == 1
    refused = [e for e in pulled.json()["entries"] if e["action"] == "refuse"]
    assert [e["relpath"] for e in refused] == [victim] and pulled.json()["pulled"] == 4
    pruned = kcache("remote", "prune", "--remote", server.url, "--older-than", "0s", "--json")
    assert pruned.exit_code == 0, pruned.stderr
    assert pruned.json()["entry_count"] == 5
    warnings = [line for line in pruned.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and victim in warnings[0] and str(10 ** 20) in warnings[0]
    assert client.hlen(f.INDEX) == 0 and client.get(f.record_key("hidet", victim)) is None


@needs_redis
def test_pruning_a_junk_record_naming_another_entry_keeps_that_entrys_data(kcache, tmp_path, redis_server):
    server = redis_server()
    client = server.client()
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    _push(kcache, root, server.url)
    victim = "ops/cuda_space_0/add/8d1f7691cdf75e90"
    junk = "ops/cuda_space_0/add/0000000000000000"
    client.set(f.record_key("hidet", junk), json.dumps(_record(client, victim)))  # names the victim
    client.hset(f.INDEX, f.entry_id("hidet", junk), json.dumps({"kind": "op", "pushed": "2001-01-01T00:00:00"}))
    before = sorted(client.keys(f"kcache:v1:hidet:{victim}:*"))
    pruned = kcache("remote", "prune", "--remote", server.url, "--older-than", "30d", "--json")
    assert pruned.exit_code == 0, pruned.stderr
    assert [r["relpath"] for r in pruned.json()["removed"]] == [junk]
    assert "names another entry" in pruned.stderr
    assert sorted(client.keys(f"kcache:v1:hidet:{victim}:*")) == before and len(before) > 1
    again = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", server.url, "8d1f7691", "--json")
    assert again.exit_code == 0 and again.json()["pulled"] == 1, again.stderr


BIG = 100 << 20


def _triton_group(client, key: str, name: str, times: int, size: int) -> None:
    client.set(f"triton:{key}:{name}", os.urandom(1 << 20) * (size >> 20))
    client.set(f"triton:{key}:__grp__k.json", json.dumps({"child_paths": [name] * times}))


@needs_redis
@pytest.mark.slow
def test_a_value_named_many_times_is_fetched_once(tmp_path, redis_server):
    server = redis_server()
    _triton_group(server.client(), "a" * 64, "k.cubin", 200, BIG)  # 200 x 100 MiB if fetched each time
    dest = tmp_path / "triton"
    run, rss = child(["pull", "--cache-dir", str(dest), "--remote", server.url, "--json"])
    print(f"pull of a 100 MiB value named 200 times: peak RSS {rss / 1e6:.0f} MB")
    assert run.returncode == 0, run.stderr
    assert (dest / ("a" * 64) / "k.cubin").stat().st_size == BIG
    assert rss < 400e6


@needs_redis
def test_triton_keys_are_fetched_only_when_selected(tmp_path, redis_server, monkeypatch):
    from kcache_cli.model.records import ScanFilter
    from kcache_cli.remote.pull import pull
    from kcache_cli.remote.store import open_store

    server = redis_server()
    client = server.client()
    for key in ("a" * 64, "b" * 64):
        client.set(f"triton:{key}:k.cubin", b"x" * 100)
        client.set(f"triton:{key}:__grp__k.json", json.dumps({"child_paths": ["k.cubin"]}))
    store = open_store(server.url)
    asked: list[str] = []
    real = type(store).get

    def counting(self, keys, limit=f.MAX_FILE):
        asked.extend(keys)
        return real(self, keys, limit)

    monkeypatch.setattr(type(store), "get", counting)
    result = pull(tmp_path / "t", store, ScanFilter(hash_prefixes=("bbbb",)))
    assert [e.relpath for e in result.entries if e.done] == ["b" * 64]
    assert not any("aaaa" in k for k in asked), asked


@needs_redis
@pytest.mark.slow
def test_remote_ls_of_many_entries_streams_in_bounded_memory(tmp_path, redis_server):
    server = redis_server()
    client = server.client()
    n = 300_000
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        summary = {"layout": "hidet", "kind": "op", "space": "cpu_space_0", "op": f"op{i % 50}", "hash": f"{i:016x}",
                   "files": 10, "size": 35000, "pushed": "2026-01-01T00:00:00"}
        pipe.hset(f.INDEX, f"hidet:ops/cpu_space_0/op{i % 50}/{i:016x}", json.dumps(summary))
        if i % 10000 == 9999:
            pipe.execute()
    pipe.execute()
    run, rss = child(["remote", "ls", "--remote", server.url, "--json"], timeout=600)
    print(f"remote ls --json of {n} entries: peak RSS {rss / 1e6:.0f} MB")
    assert run.returncode == 0, run.stderr
    # one JSON object whose entries are streamed a line each; the wrapper keeps the last 2,000 characters
    tail = run.stdout.rstrip()
    assert tail.endswith("}") and f'], "entry_count": {n}, ' in tail[-200:], tail[-300:]
    assert rss < 150e6


# ---- passwords never printed --------------------------------------------------------------------------

SECRET_URLS = [
    "redis://:hunter2@127.0.0.1:1/0",
    "redis://alice:hunter2@127.0.0.1:1/0",
    "redis://127.0.0.1:1/0?password=hunter2",
    "redis://127.0.0.1:1/0?db=0&password=hunter2&socket_timeout=1",
    "redis://:hun@ter2@127.0.0.1:1/0",
    "redis://:hun%40ter2@127.0.0.1:1/0",
    "redis://:hun/ter2@127.0.0.1:1/0",
    "redis://:hun%2Fter2@127.0.0.1:1/0",
    "redis://alice:hun/t@er2@127.0.0.1:1/0",
    "rediss://:hun?ter2@127.0.0.1:1/0",
    "redis://:hun#ter2@127.0.0.1:1/0",
]
PIECES = ("hunter2", "hun", "ter2", "er2")


@pytest.mark.parametrize("url", SECRET_URLS)
def test_redact_hides_every_part_of_a_password(url):
    from kcache_cli.remote.redact import redact_text, redact_url

    for shown in (redact_url(url), redact_text(f"Error: remote {url}: refused"), redact_text(f"'{url}'")):
        assert not any(p in shown for p in PIECES), shown
        assert "127.0.0.1" in shown or "hun/" in url or "hun?" in url or "hun#" in url, shown


@pytest.mark.parametrize("url", SECRET_URLS)
def test_no_output_path_prints_a_password(kcache, tmp_path, url):
    for args in (["remote", "ls"], ["remote", "ls", "--json"], ["--debug", "remote", "stats"],
                 ["push", "--cache-dir", str(tmp_path), "--json"]):
        run = kcache(*args, "--remote", url, "--connect-timeout", "0.2")
        assert run.exit_code != 0
        assert not any(p in run.stdout + run.stderr for p in PIECES), (args, run)


@needs_redis
def test_a_password_in_the_query_never_reaches_json(kcache, tmp_path, redis_server):
    server = redis_server(password="hunter2")
    url = f"redis://127.0.0.1:{server.port}/0?password=hunter2"
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    run = kcache("push", "--cache-dir", root, "--remote", url, "--json")
    assert run.exit_code == 0 and run.json()["pushed"] == 5, run.stderr
    listed = kcache("--debug", "remote", "stats", "--remote", url, "--json")
    assert listed.exit_code == 0 and listed.json()["entry_count"] == 5
    assert "hunter2" not in run.stdout + run.stderr + listed.stdout + listed.stderr
    assert run.json()["remote"] == f"redis://127.0.0.1:{server.port}/0?password=***"


# ---- clear errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e300"])
@pytest.mark.parametrize("args", [["remote", "ls", "--connect-timeout"], ["pull", "--connect-timeout"],
                                  ["pull", "--lock-timeout"], ["remote", "ls", "--remote-timeout"],
                                  ["build", "task", "--remote-timeout"]])
def test_a_timeout_that_is_not_a_number_of_seconds_is_a_usage_error(kcache, tmp_path, args, value):
    run = kcache(*args, value, "--remote", f"file://{tmp_path}")
    assert run.exit_code == 2 and "Traceback" not in run.stderr and "unexpected" not in run.stderr, run
    assert args[-1] in run.stderr


@pytest.mark.parametrize("fmt", ["{0}", "{", "{key:>99999999}", "triton:{key}", "{key}{filename}{other}",
                                 "{key!r}:{filename}", "{key}:{key}:{filename}"])
def test_a_bad_triton_key_format_is_one_line_exit_2(kcache, tmp_path, fmt):
    (tmp_path / "shared").mkdir()
    run = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", f"file://{tmp_path / 'shared'}",
                 env={"TRITON_REDIS_KEY_FORMAT": fmt})
    assert "TRITON_REDIS_KEY_FORMAT" in one_line_error(run, 2)


def test_one_op_directory_not_in_utf8_does_not_fail_the_push(kcache, tmp_path):
    import shutil

    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    odd = os.fsencode(root / "ops" / "cpu_space_0") + b"/m\xffx"
    shutil.copytree(root / "ops" / "cpu_space_0" / "matmul", os.fsdecode(odd))
    (tmp_path / "shared").mkdir()
    run = kcache("push", "--cache-dir", root, "--remote", f"file://{tmp_path / 'shared'}", "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["pushed"] == 5 and run.json()["left_out"] == 1
    left, = [e for e in run.json()["entries"] if e["action"] == "left out"]
    assert "UTF-8" in left["reason"]


# ---- one selection path ------------------------------------------------------------------------------------

SELECTIONS = [["--op", "mat*"], ["--space", "cuda_*"], ["--space", "0"], ["--op", "re?u", "--space", "cpu_*"],
              ["8d1f"], ["--layout", "hidet", "--op", "add", "--op", "soft*"]]


def _stores(tmp_path, redis_server):
    (tmp_path / "shared").mkdir()
    yield f"file://{tmp_path / 'shared'}"
    if os.environ.get("KCACHE_NO_REDIS") is None:
        from redis_server import REDIS_SERVER

        if REDIS_SERVER is not None:
            yield redis_server().url


def test_remote_selection_is_ls_selection(kcache, tmp_path, redis_server):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    for url in _stores(tmp_path, redis_server):
        _push(kcache, root, url)
        for sel in SELECTIONS:
            local = sorted(os.path.relpath(e["path"], root)
                           for e in kcache("ls", "--cache-dir", root, *sel, "--json").json()["entries"])
            assert local, sel
            remote = [e["relpath"] for e in kcache("remote", "ls", "--remote", url, *sel, "--json").json()["entries"]]
            assert sorted(remote) == local, (url, sel)
            dest = tmp_path / "dest" / str(abs(hash((url, *sel))))
            pulled = kcache("pull", "--cache-dir", dest, "--remote", url, *sel, "--json")
            assert sorted(e["relpath"] for e in pulled.json()["entries"] if e["done"]) == local, (url, sel)
            dry = kcache("push", "-n", "--cache-dir", root, "--remote", url, *sel, "--json").json()
            assert sorted(e["relpath"] for e in dry["entries"]) == local and dry["dry_run"], (url, sel)


def test_remote_counts_are_in_the_right_plural(kcache, tmp_path):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    run = kcache("push", "--cache-dir", root, "--remote", url, "8d1f")
    assert "pushed 1 entry " in run.stderr, run.stderr
    assert "1 entry " in kcache("remote", "ls", "--remote", url).stderr
    assert "would remove 1 entry," in kcache("remote", "prune", "-n", "--remote", url, "--older-than", "0s").stderr
    assert "pulled 1 entry " in kcache("pull", "--cache-dir", tmp_path / "d", "--remote", url).stderr


@needs_redis
def test_a_pull_into_a_root_of_another_layout_is_refused_as_import_refuses_it(kcache, tmp_path, redis_server):
    server = redis_server()
    triton = copy_tree(FIXTURES / "triton" / "cache", tmp_path / "triton")
    assert kcache("verify", "--fix", "--cache-dir", triton).exit_code == 0  # group files for this root
    _push(kcache, triton, server.url)
    hidet_root = copy_tree(FIXTURES / "hidet", tmp_path / "hidet")
    before = sorted(p.name for p in hidet_root.iterdir())
    run = kcache("pull", "--cache-dir", hidet_root, "--remote", server.url)
    line = one_line_error(run)
    assert "triton" in line and "hidet cache" in line and "never looks" in line
    assert sorted(p.name for p in hidet_root.iterdir()) == before
    # the rule is import's: an archive of the same entries is refused the same way
    archive = tmp_path / "t.tar.zst"
    assert kcache("export", "--cache-dir", triton, archive).exit_code == 0
    imported = kcache("import", "--cache-dir", hidet_root, archive)
    assert "never looks" in one_line_error(imported)
    # selecting the root's own layout is fine
    assert kcache("pull", "--cache-dir", hidet_root, "--remote", server.url, "--layout", "hidet").exit_code == 0


@needs_redis
@needs_cxx
def test_a_record_claiming_a_huge_file_never_fails_a_build(kcache, tmp_path, redis_server):
    server = redis_server()
    client = server.client()
    task = cpu_task(tmp_path / "tasks")
    first = kcache("build", str(task), "--cache-dir", tmp_path / "a", "--remote", server.url)
    assert first.exit_code == 0, first.stderr
    rel = str(Path(first.stdout.strip()).relative_to(tmp_path / "a"))
    key = next(k for k in client.keys("kcache:v1:*:manifest"))
    rec = json.loads(client.get(key))
    assert rec["relpath"] == rel
    rec["files"]["lib.so"][0] = 10 ** 20
    client.set(key, json.dumps(rec))
    second = kcache("build", str(task), "--cache-dir", tmp_path / "b", "--remote", server.url)
    assert second.exit_code == 0, second.stderr
    warnings = [line for line in second.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(10 ** 20) in warnings[0] and "not used" in warnings[0], warnings
    assert Path(second.stdout.strip(), "lib.so").is_file()


def test_remote_ls_json_stays_one_list_across_batches_the_filter_empties(kcache, tmp_path, monkeypatch):
    from kcache_cli.remote import store

    monkeypatch.setattr(store, "SCAN_BATCH", 1)  # one entry per batch: most are filtered out
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    _push(kcache, root, url)
    for sel in ([], ["--op", "relu"], ["--op", "nothing"]):
        run = kcache("remote", "ls", "--remote", url, "--json", *sel)
        assert run.exit_code == 0 and isinstance(run.json()["entries"], list), run
    assert len(kcache("remote", "ls", "--remote", url, "--json").json()["entries"]) == 5
    assert kcache("remote", "ls", "--remote", url, "--json", "--op", "nothing").json()["entries"] == []


def test_an_index_naming_one_entry_many_times_reads_its_record_once(kcache, tmp_path):
    name = bulk(b"hidet:ops/cpu_space_0/a/1")
    summary = bulk(json.dumps({"kind": "op", "hash": "1"}).encode())
    server = HostileServer(_scripted({
        "HSCAN": array([bulk(b"0"), array([name, summary] * 5000)]),
        "STRLEN": array([integer(10 ** 18)]),  # one value per key asked: more keys would be an error
    }))
    try:
        run = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", server.url, "--json")
    finally:
        server.stop()
    assert run.exit_code == 1 and "Traceback" not in run.stderr, run.stderr
    assert [e["relpath"] for e in run.json()["entries"]] == ["ops/cpu_space_0/a/1"]


def test_a_huge_index_file_in_a_shared_directory_is_not_read(kcache, tmp_path):
    shared = tmp_path / "shared"
    index = shared / (f.INDEX + ".d")
    index.mkdir(parents=True)
    with open(index / "hidet:ops%2Fcpu_space_0%2Fa%2F1", "wb") as out:
        out.truncate(1 << 40)  # sparse: 1 TiB claimed, nothing read
    run = kcache("remote", "ls", "--remote", f"file://{shared}", "--json")
    assert run.exit_code == 0, run.stderr
    listed, = run.json()["entries"]
    assert listed["relpath"] == "ops/cpu_space_0/a/1" and listed["size"] == 0


def test_a_scan_that_goes_round_in_circles_ends(kcache):
    server = HostileServer(_scripted({"HSCAN": array([bulk(b"7"), array([])])}))  # "more to come", for ever
    try:
        run = kcache("remote", "ls", "--remote", server.url)
    finally:
        server.stop()
    assert "round in circles" in one_line_error(run)


@pytest.mark.parametrize("url", ["redis://", "redis:///0", "redis://127.0.0.1:1/abc", "redis://127.0.0.1:1/0/extra",
                                 "redis://127.0.0.1:1/0?db=3", "redis://127.0.0.1:1/0?foo=hunter2",
                                 "redis://[::1/0"])
def test_a_redis_url_redis_py_would_read_otherwise_is_a_usage_error(kcache, url):
    """No host (redis-py takes localhost:6379), a database that is no number (it takes 0), a query that
    overrides the path or means nothing: refused before any connection, exit 2, one line."""
    run = kcache("remote", "ls", "--remote", url, "--connect-timeout", "0.2")
    assert run.exit_code == 2 and len(run.stderr.splitlines()) == 1, run
    assert "hunter2" not in run.stderr and "connecting" not in run.stderr


def test_a_file_remote_on_localhost_is_this_machines_path(kcache, tmp_path):
    (tmp_path / "remote").mkdir()
    run = kcache("remote", "stats", "--remote", f"file://localhost{tmp_path / 'remote'}", "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["entry_count"] == 0


@needs_redis
def test_a_record_key_of_another_type_is_refused_not_taken_for_pruned(kcache, tmp_path, redis_server):
    """A SET where an entry's record belongs made `_GET` answer false, read as "pruned meanwhile": the pull
    said pulled 0, refused 0, exit 0. It is refused in one line, as a truncated record is (exit 1); a data key
    of another type is too, and prune removes such an entry with a warning that says what its record is."""
    server = redis_server()
    client = server.client()
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    _push(kcache, root, server.url)
    victim = "ops/cpu_space_0/relu/31857fe085635b31"
    client.delete(f.record_key("hidet", victim))
    client.sadd(f.record_key("hidet", victim), "x")
    pulled = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", server.url, "--json")
    assert pulled.exit_code == 1
    refused = [e for e in pulled.json()["entries"] if e["action"] == "refuse"]
    assert [e["relpath"] for e in refused] == [victim] and "a Redis set, not a value" in refused[0]["reason"]
    assert pulled.json()["pulled"] == 4
    other = next(e["relpath"] for e in pulled.json()["entries"] if e["action"] == "pull")
    key = next(k for k in client.scan_iter("kcache:v1:hidet:*") if b"manifest" not in k and other.encode() in k)
    client.delete(key)
    client.hset(key, "a", "b")
    again = kcache("pull", "--cache-dir", tmp_path / "dest2", "--remote", server.url, "--json")
    notes = {e["relpath"]: e["reason"] for e in again.json()["entries"] if e["action"] == "refuse"}
    assert again.exit_code == 1 and "a Redis hash on the remote, not a value" in notes[other], notes
    pruned = kcache("remote", "prune", "--remote", server.url, "--older-than", "0s")
    assert pruned.exit_code == 0, pruned.stderr
    assert any(victim in line and "a Redis set" in line for line in pruned.stderr.splitlines()), pruned.stderr


def test_junk_in_a_shared_directory_s_hashes_is_skipped_with_a_warning(kcache, tmp_path):
    """One stray link in kcache:v1:index.d/ made `remote ls` fail whole (ELOOP); Redis skips an index field it
    cannot take and goes on. Both now say each skipped field in one line and list the rest; a record that is a
    link is refused on pull like any bad record, never followed."""
    shared = tmp_path / "shared"
    shared.mkdir()
    root = copy_tree(FIXTURES / "hidet", tmp_path / "src")
    _push(kcache, root, f"file://{shared}")
    index, pulled_d = shared / (f.INDEX + ".d"), shared / (f.PULLED + ".d")
    os.symlink("loop", index / "loop")
    os.mkfifo(index / "hidet:fifo")
    pulled_d.mkdir(exist_ok=True)
    listed = sorted(p.name for p in index.iterdir() if p.name not in ("loop", "hidet:fifo"))
    os.symlink("/etc/passwd", pulled_d / listed[0])
    run = kcache("remote", "ls", "--remote", f"file://{shared}", "--json")
    assert run.exit_code == 0, run.stderr
    assert len(run.json()["entries"]) == 5
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 3 and all("skipped" in w for w in warnings), run.stderr
    assert any("'loop': a symlink" in w for w in warnings) and any("a FIFO" in w for w in warnings)
    victim = "ops/cpu_space_0/relu/31857fe085635b31"
    record = shared / f.record_key("hidet", victim).replace("%", "%25").replace("/", "%2F")
    record.unlink()
    os.symlink("/etc/passwd", record)
    pulled = kcache("pull", "--cache-dir", tmp_path / "dest", "--remote", f"file://{shared}", "--json")
    assert pulled.exit_code == 1
    refused = [e for e in pulled.json()["entries"] if e["action"] == "refuse"]
    assert [e["relpath"] for e in refused] == [victim] and "a symlink, not a value" in refused[0]["reason"]
    assert pulled.json()["pulled"] == 4
