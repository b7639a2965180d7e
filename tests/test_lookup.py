"""Lookups by name (`inspect`, `log`, `clear <prefix>`) read the entry they name, not the whole cache,
and judge it exactly as `ls` does."""

from __future__ import annotations

import os
import shutil

import pytest

from kcache_cli.cli import common
from kcache_cli.fs import read as fsread
from kcache_cli.layouts import hidet

SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
ADD = "ops/cuda_space_0/add/8d1f7691cdf75e90"
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"
SEED = "ops/cuda_space_1/bad/0123456789abcdef"  # a failed compile in the seed layout: no version.txt


@pytest.fixture
def searches(monkeypatch):
    """Every version.txt read, wherever it is: an entry is judged by its own one alone (against the
    installed hidet, none here), never by a search of the cache for the newest one."""
    calls: list[str] = []
    real = fsread.read_bytes

    def spy(path, *a, **k):
        if str(path).endswith("version.txt"):
            calls.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(fsread, "read_bytes", spy)
    monkeypatch.setattr(hidet, "installed_version", lambda: "")
    return calls


@pytest.fixture
def cache(fixture_copy):
    root = fixture_copy("hidet")
    (root / SEED).mkdir(parents=True)
    (root / SEED / "nvcc_log.txt").write_text("nvcc -shared source.cu -o lib.so\nsource.cu(1): error: x\n")
    (root / ADD / "version.txt").unlink()
    (root / MATMUL / "version.txt").write_text("0.7.0\n")  # newer than softmax's 0.6.1: a note, no more
    return root


def _status(kcache, root, *args) -> dict[str, str]:
    return {os.path.relpath(r["path"], root): r["status"] for r in kcache("--cache-dir", root, *args,
                                                                          "--json").json()["entries"]}


def _others(calls: list[str], root, rel: str) -> list[str]:
    return [c for c in calls if not c.startswith(str(root / rel) + "/")]


@pytest.mark.parametrize("rel, want", [(SEED, "failed"), (ADD, "complete"), (SOFTMAX, "complete")])
def test_inspect_reads_no_other_entry(kcache, cache, searches, rel, want):
    listed = _status(kcache, cache, "ls", "--no-index")[rel]
    searches.clear()
    r = kcache("--cache-dir", cache, "inspect", rel.rsplit("/", 1)[1][:8], "--json")
    assert r.json()["status"] == listed == want
    assert _others(searches, cache, rel) == []
    log = kcache("--cache-dir", cache, "log", rel.rsplit("/", 1)[1][:8])
    assert _others(searches, cache, rel) == [] and log.exit_code == 0 and "==> " in log.stdout


def test_a_newer_version_elsewhere_changes_nothing(kcache, cache, searches):
    """hidet 0.7.0's version.txt in matmul once made every other entry stale; each entry is its own now."""
    r = kcache("--cache-dir", cache, "inspect", "ad25", "--json").json()
    assert r["status"] == "complete" == _status(kcache, cache, "ls", "--no-index")[SOFTMAX]
    assert r["facts"]["version_txt"] == "0.6.1" and "0.7.0" not in str(r["facts"])
    (cache / ADD / "version.txt").write_text("0.5.0\n")
    assert kcache("--cache-dir", cache, "inspect", "8d1f", "--json").json()["status"] == "complete"


def test_clear_by_prefix_judges_only_where_names_show_the_entry(kcache, cache, searches, monkeypatch):
    judged: list[str] = []
    real = hidet.judge

    def spy(d, *a, **kw):
        judged.append(os.path.relpath(d.path, cache))
        return real(d, *a, **kw)

    monkeypatch.setattr(hidet, "judge", spy)
    os.symlink("/etc", cache / "ops/cpu_space_0/relu/8d1fffffffffffff")  # a link where an entry belongs
    r = kcache("--cache-dir", cache, "clear", "8d1f", "--dry-run", "--json").json()
    assert {x["path"] for x in r["removed"]} == {str(cache / ADD), str(cache / "ops/cpu_space_0/relu/8d1fffffffffffff")}
    assert [x["status"] for x in r["removed"] if x["path"] == str(cache / ADD)] == ["complete"]
    assert judged == [ADD] and _others(searches, cache, ADD) == []  # no other entry's files
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


@pytest.mark.parametrize("selector", [("--op", "softmax"), ("--space", "cuda_space_0"), ("--target", "cuda")])
def test_a_filtered_ls_judges_as_the_full_one(kcache, cache, searches, selector):
    full = _status(kcache, cache, "ls", "--no-index")
    searches.clear()
    part = _status(kcache, cache, "ls", *selector, "--no-index")
    assert part[SOFTMAX] == full[SOFTMAX] == "complete" and all(full[k] == v for k, v in part.items())
    assert not [c for c in searches if "/cpu_space_0/" in c]  # `ls --op X` reads X's entries only


def test_log_reads_no_other_entry(kcache, cache, searches):
    """`log` names an entry to show its logs: no other entry's files are read."""
    r = kcache("--cache-dir", cache, "log", "ad25")
    assert r.exit_code == 0 and "==> compile.sh <==" in r.stdout and _others(searches, cache, SOFTMAX) == []


def test_a_tilus_lookup_judges_only_the_programs_it_names(kcache, fixture_copy, monkeypatch):
    """`inspect <prefix>` of a tilus program judges the programs whose names start with the prefix, not
    every program of the cache (it judged all 20,000 of the bench's cache: 1.35 s against 0.14 s now);
    and the answer is the one `ls` gives."""
    from kcache_cli.catalog import scan_context
    from kcache_cli.layouts import tilus

    monkeypatch.setattr(scan_context, "PARALLEL_MIN_JOBS", 10**9)  # judged here, where they are counted
    root = fixture_copy("tilus")
    real = next((root / "programs").iterdir())
    for name in ("aaaaaaaaaaa1", "aaaaaaaaaaa2", "bbbbbbbbbbb3"):  # copies under other names
        shutil.copytree(real, root / "programs" / name, symlinks=True)
    judged: list[str] = []
    judge = tilus._program_entry

    def counting(ctx, job):
        judged.append(os.path.basename(job[0]))
        return judge(ctx, job)

    monkeypatch.setattr(tilus, "_program_entry", counting)
    r = kcache("--cache-dir", root, "inspect", "aaaaaaaaaaa1", "--json")
    assert r.json()["path"].endswith("programs/aaaaaaaaaaa1"), r.stderr
    assert judged == ["aaaaaaaaaaa1"]
    judged.clear()
    r = kcache("--cache-dir", root, "ls", "--json", "--no-index", "aaa")
    assert sorted(os.path.basename(e["path"]) for e in r.json()["entries"]) == ["aaaaaaaaaaa1", "aaaaaaaaaaa2"]
    assert sorted(judged) == ["aaaaaaaaaaa1", "aaaaaaaaaaa2"]
