"""The CUDA driver's JIT cache: one opaque entry, listed from its parent, removed only whole and only
while no process of its owner has the CUDA driver (a file named libcuda.so.1) mapped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_kcache

MAPPER = """
import mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print("mapped", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def jit(tmp_path: Path) -> Path:
    """A JIT cache shaped like the driver's: an index file beside hex directories of cached binaries."""
    cache = tmp_path / "home" / ".nv" / "ComputeCache"
    for i, d in enumerate(("0", "a", "f")):
        sub = cache / d / f"{i}{i}"
        sub.mkdir(parents=True)
        (sub / f"{i:08x}deadbeef").write_bytes(os.urandom(1000 + i))
    (cache / "index").write_bytes(os.urandom(256))
    return cache


def test_one_opaque_entry_with_size_against_the_cap(jit, monkeypatch):
    monkeypatch.setenv("CUDA_CACHE_MAXSIZE", str(1 << 20))
    rows = run_kcache("--cache-dir", str(jit.parent), "ls", "--json").json()["entries"]
    assert [(r["layout"], r["kind"], r["hash"], r["file_count"], r["apparent_size"], r["status"]) for r in rows] == [
        ("cudajit", "jit", "ComputeCache", 4, 1000 + 1001 + 1002 + 256, "complete")]
    shown = run_kcache("--cache-dir", str(jit.parent), "inspect", "ComputeCache", "--json").json()
    assert shown["facts"]["size_against_the_cap"].startswith(f"{3259} of {1 << 20} bytes (0%, CUDA_CACHE_MAXSIZE)")
    listed = run_kcache("dir", "--all", "--json").json()["caches"]
    assert {"cache": "cudajit", "path": str(jit.parent)}.items() <= next(
        r for r in listed if r["cache"] == "cudajit").items()


def test_cuda_cache_path_names_the_entry(tmp_path, monkeypatch):
    where = tmp_path / "jitcache"
    (where / "3").mkdir(parents=True)
    (where / "index").write_bytes(b"x")
    monkeypatch.setenv("CUDA_CACHE_PATH", str(where))
    run = run_kcache("dir", "--all", "--json")
    row = next(r for r in run.json()["caches"] if r["cache"] == "cudajit")
    assert row["path"] == str(tmp_path) and row["entry_count"] == 1


def test_a_process_with_the_driver_loaded_blocks_removal(jit, tmp_path):
    lib = tmp_path / "fake-driver" / "libcuda.so.1"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 4096)
    before = sorted(jit.rglob("*"))
    proc = subprocess.Popen([sys.executable, "-c", MAPPER, str(lib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "mapped"
        run = run_kcache("--cache-dir", str(jit.parent), "clear", "--all", "--yes", "--json")
        assert run.exit_code in (0, 1), run.stderr
        out = json.dumps(run.json())
        assert "CUDA driver is loaded by process" in out and str(proc.pid) in out
        assert sorted(jit.rglob("*")) == before  # not one file removed
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=30)
    run = run_kcache("--cache-dir", str(jit.parent), "clear", "--all", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert not jit.exists()  # removed whole once nobody has the driver loaded


def test_prune_broken_never_touches_it_and_never_a_file_of_it(jit):
    before = sorted(p.relative_to(jit) for p in jit.rglob("*"))
    run = run_kcache("--cache-dir", str(jit.parent), "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert sorted(p.relative_to(jit) for p in jit.rglob("*")) == before


def test_other_directories_beside_it_are_not_entries(jit):
    (jit.parent / "nsight").mkdir()
    (jit.parent / "nsight" / "x.txt").write_text("not the JIT cache\n")
    (jit.parent / "lookalike" / "3").mkdir(parents=True)  # the driver's files, not its name: left alone
    (jit.parent / "lookalike" / "index").write_text("x")
    rows = run_kcache("--cache-dir", str(jit.parent), "ls", "--json").json()["entries"]
    assert [r["hash"] for r in rows] == ["ComputeCache"]
    run = run_kcache("--cache-dir", str(jit.parent), "clear", "--all", "--yes", "--json")
    assert run.exit_code == 0 and (jit.parent / "nsight" / "x.txt").is_file()
    assert (jit.parent / "lookalike" / "index").is_file()
