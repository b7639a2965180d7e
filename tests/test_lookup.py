"""Lookups by name (`inspect`, `log`, `clear <prefix>`) read the entry they name, not the whole cache,
and judge it exactly as `ls` does."""

from __future__ import annotations

import os
import shutil

import pytest

from kcache_cli.catalog import index
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
    loaded: list[str] = []  # the scan index: a lookup loads none (a 10^5-entry one costs more than it saves)
    monkeypatch.setattr(index, "load", lambda root, *a, **k: loaded.append(root) or {})
    os.symlink("/etc", cache / "ops/cpu_space_0/relu/8d1fffffffffffff")  # a link where an entry belongs
    r = kcache("--cache-dir", cache, "clear", "8d1f", "--dry-run", "--json").json()
    assert loaded == []
    assert {x["path"] for x in r["removed"]} == {str(cache / ADD), str(cache / "ops/cpu_space_0/relu/8d1fffffffffffff")}
    assert [x["status"] for x in r["removed"] if x["path"] == str(cache / ADD)] == ["complete"]
    assert judged == [ADD] and _others(searches, cache, ADD) == []  # no other entry's files
    assert os.path.isdir("/etc") and (cache / ADD).is_dir()
    listed = kcache("--cache-dir", cache, "ls", "8d1f", "--json").json()["entries"]  # ls by prefix: no index either
    assert loaded == [] and str(cache / ADD) in {e["path"] for e in listed}


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


# ---- a reference that names nothing: what it may have meant --------------------------------------
@pytest.mark.parametrize("args", [("ls", "8d2"), ("inspect", "8d2"), ("log", "8d2"), ("clear", "8d2", "--yes"),
                                  ("export", "{tmp}/x.tar", "8d2"), ("verify", "8d2"),
                                  ("ls", "ops/cuda_space_0/add/8d2")])
def test_a_near_miss_names_the_nearest_hash_prefix(kcache, cache, tmp_path, args):
    """The entry whose hash shares the longest prefix with the reference, as docs/output.md says; exit 2,
    one line, nothing written."""
    r = kcache("--cache-dir", cache, *(a.format(tmp=tmp_path) for a in args))
    assert r.exit_code == 2, r.stderr
    assert r.stderr == f"Error: no entry matches '{args[-1] if args[-1] != '--yes' else args[-2]}' in {cache}; " \
                       "did you mean 8d1f7691?\n", r.stderr
    assert not (tmp_path / "x.tar").exists()


@pytest.mark.parametrize("args", [("inspect", "zzzz"), ("ls", "zzzz"), ("clear", "zzzz", "--yes")])
def test_a_reference_near_nothing_says_where_to_see_what_is_there(kcache, cache, args):
    """No hash prefix or op name is near it: the one line says `kcache ls` lists the entries, where it
    said no more than that nothing matched."""
    r = kcache("--cache-dir", cache, *args)
    assert r.exit_code == 2
    assert r.stderr == f"Error: no entry matches 'zzzz' in {cache} (kcache ls lists its entries)\n", r.stderr


def test_an_op_s_name_as_the_reference(kcache, cache):
    """A command that selects with --op offers it; inspect and log, whose --op only picks among the entries
    named, offer the ls that lists the op's entries."""
    for cmd in ("ls", "verify", "clear"):
        r = kcache("--cache-dir", cache, cmd, "matmul")
        assert r.exit_code == 2 and r.stderr.rstrip().endswith("did you mean --op matmul?"), r.stderr
    for cmd in ("inspect", "log"):
        r = kcache("--cache-dir", cache, cmd, "matmul")
        assert r.exit_code == 2 and r.stderr.rstrip().endswith(
            "did you mean the op matmul? (kcache ls --op matmul lists its entries)"), r.stderr
    r = kcache("--cache-dir", cache, "ls", "add")  # the op, and the hash sharing "ad"
    assert r.stderr.rstrip().endswith("did you mean ad252b06 or --op add?"), r.stderr
    r = kcache("--cache-dir", cache, "inspect", "zz")
    assert r.exit_code == 2 and "did you mean" not in r.stderr


@pytest.mark.parametrize("cmd", ["inspect", "ls", "log"])
def test_a_value_copied_with_the_tables_ellipsis_says_to_drop_it(kcache, cache, cmd):
    """A table ends a name it cut short in `…` (ls, diff, prune): pasted back as typed, the error says
    what to give instead, rather than only that the prefix is bad."""
    r = kcache("--cache-dir", cache, cmd, "ad252b06\u2026")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "give ad252b06 without the \u2026" in r.stderr, r.stderr


def test_a_path_inside_an_entry_names_that_entry_as_the_hint(kcache, cache):
    """A file of an entry (as `find` prints it) names no entry: the hint is the entry it lies in, not a
    hash that shares a first letter with the file's name; a file name no hash could be gets no hash."""
    for ref in (f"{ADD}/lib.so", str(cache / ADD / "lib.so")):
        r = kcache("--cache-dir", cache, "inspect", ref)
        assert r.exit_code == 2 and r.stderr.rstrip().endswith("did you mean 8d1f7691?"), r.stderr
    r = kcache("--cache-dir", cache, "inspect", "ops/cuda_space_0/add/ad.bin")  # shares "ad" with ad252b06
    assert r.exit_code == 2 and "did you mean" not in r.stderr, r.stderr


def test_hints_show_a_cache_s_names_escaped(kcache, cache):
    (cache / "ops/cuda_space_0/add/8d1\x1b[31mX").mkdir()
    r = kcache("--cache-dir", cache, "inspect", "8d2")
    assert r.exit_code == 2 and "\x1b" not in r.stderr and "8d1\\x1b[31m" in r.stderr, r.stderr


@pytest.mark.parametrize("typed", ["iljq", "iljqft5r", "Iljq"])
def test_a_key_typed_in_another_case_is_named(kcache, fixture_copy, typed):
    """Triton's keys are upper-case base32 (hidet's lower-case hex): one typed in the other case matches
    nothing (hashes are matched as written), and the hint names the key it meant."""
    root = fixture_copy("triton") / "cache"
    for command in ("inspect", "ls"):
        r = kcache("--cache-dir", root, command, typed)
        assert r.exit_code == 2 and r.stderr.rstrip().endswith("did you mean ILJQFT5R?"), r.stderr


def test_a_miss_in_a_triton_cache_lists_few_kernels(kcache, fixture_copy, monkeypatch):
    """A hint costs lookups by prefix, not a listing of every kernel directory (where Triton's kernel names
    lie): a key off by its last character gets the key, an op's name gets --op."""
    from kcache_cli.catalog import names

    root = fixture_copy("triton") / "cache"
    key = "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"
    listed: list[str] = []
    real = fsread.names

    def spy(path):
        listed.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(fsread, "names", spy)
    monkeypatch.setattr(names, "READS", 1)
    r = kcache("--cache-dir", root, "inspect", key[:-1] + "B")
    assert r.exit_code == 2 and r.stderr.rstrip().endswith(f"did you mean {key}?"), r.stderr
    assert len(set(listed) - {key}) <= 1, listed  # the key the prefixes lead to, and READS for op names
    monkeypatch.setattr(names, "READS", 1000)
    r = kcache("--cache-dir", root, "ls", "add_kernel")
    assert r.exit_code == 2 and r.stderr.rstrip().endswith("did you mean --op add_kernel?"), r.stderr
