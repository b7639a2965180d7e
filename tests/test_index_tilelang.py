"""The scan index (kcache_cli/catalog/index.py) answers unchanged tilelang kernels and binaries, and never stale: a
changed file, added file or symlinked file sends the entry back to the real scan, whose answer it equals."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from test_index import both, counting_judge

from kcache_cli.catalog import scan_context as scan_mod
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.layouts import tilelang

RACY = 0.05
KERNELS = "0.1.15/linux-x86_64/kernels"
BINARIES = "0.1.15/cuda-binaries"


@pytest.fixture
def judged(monkeypatch):
    return counting_judge(monkeypatch, tilelang, "_judged_entry")


@pytest.fixture
def cache(fixture_copy):
    """The real cache, its kernel and binary each copied under two more keys."""
    root = fixture_copy("tilelang")
    for where in (KERNELS, BINARIES):
        (only,) = (root / where).iterdir()
        for i in range(2):
            shutil.copytree(only, root / where / f"{i + (10 if where == BINARIES else 0):064x}")
    time.sleep(RACY * 2)
    return root



def primed(root, judged) -> None:
    scan_cache(root, use_index=True)
    assert len(judged) == 6
    judged.clear()
    got, real = both(root, judged)
    assert got == real and judged == [], "an unchanged tilelang cache is answered from the index alone"


def status(entries, key: str) -> str:
    return next(e.status for e in entries if e.hash == key)


def test_unchanged_entries_are_answered_from_the_index(cache, judged):
    primed(cache, judged)
    assert {e.kind for e in scan_cache(cache).entries} == {"kernel", "binary"}


@pytest.mark.parametrize("change", ["truncate_lib", "params_in_place", "manifest", "add_file", "binary_size"])
def test_a_changed_entry_is_judged_again(cache, judged, change):
    primed(cache, judged)
    key = f"{1:064x}" if change != "binary_size" else f"{11:064x}"
    kernel, binary = cache / KERNELS / key, cache / BINARIES / key
    if change == "truncate_lib":
        os.truncate(kernel / "executable.so", 100)
    elif change == "params_in_place":  # same size, mtime restored: only its ctime tells
        params = kernel / "params.json"
        st = os.stat(params)
        data = params.read_bytes()
        params.write_bytes(data[:-2] + b"\x00" + data[-1:])
        os.utime(params, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "manifest":
        (kernel / "manifest.json").write_text("{")
    elif change == "add_file":
        (kernel / "stray.txt").write_text("x")
    else:
        meta = json.loads((binary / "metadata.json").read_text())
        meta["size"] += 1
        (binary / "metadata.json").write_text(json.dumps(meta))
    got, real = both(cache, judged)
    assert got == real and judged == [key]
    want = {"truncate_lib": "partial", "manifest": "partial", "add_file": "complete", "binary_size": "corrupt"}
    assert status(got, key) == want.get(change, status(real, key))  # params: as its mtime says it changed


def test_a_symlinked_file_is_judged_every_time(cache, judged, tmp_path):
    key = f"{0:064x}"
    lib = cache / KERNELS / key / "executable.so"
    shutil.move(lib, tmp_path / "executable.so")
    lib.symlink_to(tmp_path / "executable.so")
    time.sleep(RACY * 2)
    scan_cache(cache, use_index=True)
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and judged == [key]


def test_parallel_workers_serve_and_record(cache, judged, monkeypatch):
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 1)
    first = scan_cache(cache, use_index=True)
    assert first.entries == scan_cache(cache, use_index=True).entries == scan_cache(cache).entries
    key = f"{0:064x}"
    os.truncate(cache / KERNELS / key / "params.json", 3)
    got, real = both(cache, judged)
    assert got == real and status(got, key) == "partial"
