"""Lookups by name (`inspect`, `log`, `clear <prefix>`) read the entry they name, not the whole cache,
and judge it exactly as `ls` does."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from kcache_cli.cli import common
from kcache_cli.layouts import hidet

SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
ADD = "ops/cuda_space_0/add/8d1f7691cdf75e90"
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"
SEED = "ops/cuda_space_1/bad/0123456789abcdef"  # a failed compile in the seed layout: no version.txt


@pytest.fixture
def searches(monkeypatch):
    """Every search of the cache's version.txt files (hidet's newest version in use) is recorded."""
    calls: list[str] = []
    real = hidet._version_texts

    def spy(root, ops_too=True):
        calls.append(root)
        return real(root, ops_too)

    monkeypatch.setattr(hidet, "_version_texts", spy)
    monkeypatch.setattr(hidet, "installed_version", lambda: "")
    return calls


@pytest.fixture
def cache(fixture_copy):
    root = fixture_copy("hidet")
    (root / SEED).mkdir(parents=True)
    (root / SEED / "nvcc_log.txt").write_text("nvcc -shared source.cu -o lib.so\nsource.cu(1): error: x\n")
    (root / ADD / "version.txt").unlink()
    (root / MATMUL / "version.txt").write_text("0.7.0\n")  # newer than softmax's 0.6.1: softmax is stale
    return root


def _status(kcache, root, *args) -> dict[str, str]:
    return {os.path.relpath(r["path"], root): r["status"] for r in kcache("--cache-dir", root, *args, "--json").json()}


@pytest.mark.parametrize("rel, want", [(SEED, "failed"), (ADD, "corrupt")])
def test_inspect_of_an_entry_without_version_txt_searches_no_other_entry(kcache, cache, searches, rel, want):
    listed = _status(kcache, cache, "ls", "--no-index")[rel]
    searches.clear()
    r = kcache("--cache-dir", cache, "inspect", rel.rsplit("/", 1)[1][:8], "--json")
    assert r.json()["status"] == listed == want
    assert searches == []
    assert "hidet in use" not in kcache("--cache-dir", cache, "inspect", rel.rsplit("/", 1)[1][:8]).stdout
    log = kcache("--cache-dir", cache, "log", rel.rsplit("/", 1)[1][:8])
    assert searches == [] and log.exit_code == 0 and "==> " in log.stdout


def test_inspect_of_an_entry_with_version_txt_still_weighs_the_whole_cache(kcache, cache, searches):
    r = kcache("--cache-dir", cache, "inspect", "ad25", "--json").json()
    assert r["status"] == "stale" == _status(kcache, cache, "ls", "--no-index")[SOFTMAX]
    assert "0.7.0" in r["reason"] and searches
    out = kcache("--cache-dir", cache, "inspect", "ad25").stdout
    assert "hidet in use     0.7.0" in out


def test_a_version_txt_appearing_sends_the_lookup_back_to_the_search(kcache, cache, searches):
    assert kcache("--cache-dir", cache, "inspect", "8d1f", "--json").json()["status"] == "corrupt"
    (cache / ADD / "version.txt").write_text("0.6.1\n")  # now older than matmul's 0.7.0
    r = kcache("--cache-dir", cache, "inspect", "8d1f", "--json").json()
    assert r["status"] == "stale" == _status(kcache, cache, "ls", "--no-index")[ADD] and searches


def test_clear_by_prefix_judges_only_where_names_show_the_entry(kcache, cache, searches, monkeypatch):
    judged: list[str] = []
    real = hidet.judge

    def spy(path, *a, **kw):
        judged.append(os.path.relpath(path, cache))
        return real(path, *a, **kw)

    monkeypatch.setattr(hidet, "judge", spy)
    os.symlink("/etc", cache / "ops/cpu_space_0/relu/8d1fffffffffffff")  # a link where an entry belongs
    r = kcache("--cache-dir", cache, "clear", "8d1f", "--dry-run", "--json").json()
    assert {x["path"] for x in r["removed"]} == {str(cache / ADD), str(cache / "ops/cpu_space_0/relu/8d1fffffffffffff")}
    assert [x["status"] for x in r["removed"] if x["path"] == str(cache / ADD)] == ["corrupt"]
    assert judged == [ADD] and searches == []  # no other space's entries, no version.txt but its own
    assert os.path.isdir("/etc") and (cache / ADD).is_dir()


def test_log_into_a_pipe_is_the_text_with_headers(kcache, fixture_copy):
    root = fixture_copy("hidet")
    text = "x :smile: [bold]y[/] \x1b[31mred\n\ttab\r\n"
    with open(root / SOFTMAX / "nvcc_output.txt", "a") as f:
        f.write(text)
    out = kcache("--cache-dir", root, "log", "ad25").stdout
    assert out.startswith("==> compile.sh <==\n") and "\n==> nvcc_output.txt <==\n" in out
    assert out.endswith("x :smile: [bold]y[/] \\x1b[31mred\n\ttab\n")  # escapes shown, nothing rendered


def test_consoles_never_turn_cache_text_into_emoji(capsys):
    common.stdout_console().print("a :smile: b")
    common.stderr_console().print("c :warning: d")
    got = capsys.readouterr()
    assert "a :smile: b" in got.out and "c :warning: d" in got.err


# ---- the version.txt texts kept under .kcache/index (index.group_texts) are never stale ----

def _rewrite_keeping_size_and_mtime(path, text):
    st = os.stat(path)
    with open(path, "r+") as f:  # in place: same inode
        f.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as `touch -d` would put it back
    assert os.stat(path).st_size == st.st_size


CHANGES = {
    "rewritten_in_place_same_size_mtime_restored":
        lambda r: _rewrite_keeping_size_and_mtime(r / SOFTMAX / "version.txt", "0.9.9"),
    "added": lambda r: (r / ADD / "version.txt").write_text("0.9.9\n"),
    "removed": lambda r: (r / MATMUL / "version.txt").unlink(),
    "new_entry": lambda r: (r / "ops/cuda_space_0/add/1111222233334444").mkdir() or
        (r / "ops/cuda_space_0/add/1111222233334444/version.txt").write_text("0.9.9\n"),
    "entry_replaced": lambda r: os.rename(r / MATMUL, r / "ops/cpu_space_0/matmul/aaaabbbbccccdddd"),
    "op_removed": lambda r: shutil.rmtree(r / "ops/cpu_space_0/matmul"),  # the 0.7.0 goes with it
    "index_garbled": lambda r: (r / ".kcache/index" / index_name("texts")).write_bytes(b"garbage"),
    "index_deleted": lambda r: (r / ".kcache/index" / index_name("texts")).unlink(),
}


def index_name(kind):
    from kcache_cli import index

    return index.index_name(kind)


def _newest(root) -> str:
    hidet._forget(root)
    return hidet.version_in_use(root)


@pytest.mark.parametrize("workers", [False, True])
@pytest.mark.parametrize("change", list(CHANGES))
def test_kept_version_texts_are_never_stale(cache, searches, monkeypatch, change, workers):
    from kcache_cli import fsread, index

    monkeypatch.setattr(index, "TEXTS_MIN", 0)
    monkeypatch.setattr(index, "PARALLEL_TEXTS", 0 if workers else 10**9)  # workers: one per core
    monkeypatch.setattr(index, "RACY_SECONDS", 0.0)
    time.sleep(0.05)  # the copy is older than the file system's clock tick
    assert _newest(cache) == "0.7.0"
    assert (cache / ".kcache/index" / index_name("texts")).is_file()
    reads: list[str] = []
    real = fsread.read_bytes
    monkeypatch.setattr(fsread, "read_bytes", lambda p, *a, **k: reads.append(p) or real(p, *a, **k))
    assert _newest(cache) == "0.7.0" and reads == []  # unchanged: proven by lstat, nothing read
    CHANGES[change](cache)
    got = _newest(cache)
    shutil.rmtree(cache / ".kcache/index")
    assert got == _newest(cache)  # what reading every version.txt says
    if change in ("rewritten_in_place_same_size_mtime_restored", "added", "new_entry"):
        assert got == "0.9.9"
    if change == "op_removed":
        assert got == "0.6.1"


def test_a_recent_version_txt_is_not_kept(cache, searches, monkeypatch):
    from kcache_cli import index

    monkeypatch.setattr(index, "TEXTS_MIN", 0)
    monkeypatch.setattr(index, "RACY_SECONDS", 3600.0)  # everything is "recent"
    assert _newest(cache) == "0.7.0"
    stored = index.load(str(cache), (index.FORMAT, "texts", __import__("kcache_cli").__version__, os.geteuid(),
                                     str(cache), "version.txt", 256), "texts")
    assert stored == {}


@pytest.mark.parametrize("selector", [("--op", "softmax"), ("--space", "cuda_space_0"), ("--target", "cuda")])
def test_a_filtered_ls_judges_as_the_full_one(kcache, cache, searches, selector):
    """Without an installed hidet the newest version.txt of the whole cache decides, whatever part of
    it is listed (a newer version in another op makes softmax stale for `ls --op softmax` too)."""
    full = _status(kcache, cache, "ls", "--no-index")
    part = _status(kcache, cache, "ls", *selector, "--no-index")
    assert part[SOFTMAX] == full[SOFTMAX] == "stale" and all(full[k] == v for k, v in part.items())


def test_log_shows_no_status_and_looks_up_no_version(kcache, cache, searches):
    """`log` names an entry to show its logs, never its status: the whole cache's newest version.txt is
    not looked for, even for an entry that has one (inspect still weighs it: see above)."""
    r = kcache("--cache-dir", cache, "log", "ad25")
    assert r.exit_code == 0 and "==> compile.sh <==" in r.stdout and searches == []
    assert kcache("--cache-dir", cache, "inspect", "ad25", "--json").json()["status"] == "stale" and searches
