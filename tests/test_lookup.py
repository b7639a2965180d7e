"""Lookups by name (`inspect`, `log`, `clear <prefix>`) read the entry they name, not the whole cache,
and judge it exactly as `ls` does."""

from __future__ import annotations

import os

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
    calls: list[tuple] = []
    real = hidet._version_texts

    def spy(root, ops, ops_too=True):
        calls.append((root, ops))
        return real(root, ops, ops_too)

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
    assert searches == [] and log.exit_code in (0, 1)


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
