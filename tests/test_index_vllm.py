"""The scan index (kcache_cli/catalog/index.py) answers unchanged vLLM units, keyed by every name in the unit's tree,
and never stale: a change anywhere in the tree (an index, an artifact, a graph deep in an unpacked one, a
name added) sends the unit back to the real scan, whose answer it equals."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import run_kcache
from loaders import recorded
from test_index import aged, both, counting_judge, served

from kcache_cli.catalog import scan_context as scan_mod
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.layouts import vllm

RACY = 0.05
BINARY, UNPACKED = "0123456789", "abcdef0123"


@pytest.fixture
def judged(monkeypatch):
    return counting_judge(monkeypatch, vllm, "_unit_entry")


@pytest.fixture(scope="module")
def recorded_tree(tmp_path_factory) -> Path:
    return recorded.extract_tree("vllm", tmp_path_factory.mktemp("vllm-recorded") / "root")


@pytest.fixture
def cache(recorded_tree, tmp_path) -> Path:
    root = tmp_path / "torch_compile_cache"
    shutil.copytree(recorded_tree, root, symlinks=True)
    fixed = run_kcache("--cache-dir", str(root), "verify", "--fix", "--json")
    assert fixed.exit_code == 0, fixed.stdout + fixed.stderr
    for unit in (BINARY, UNPACKED):
        aged(root / unit)  # no vLLM is writing them: complete, as the index stores
    time.sleep(RACY * 2)
    return root


def primed(root, judged) -> None:
    assert {e.status for e in served(root, judged)} == {"complete"}


def test_unchanged_units_are_answered_from_the_index(cache, judged):
    primed(cache, judged)


def _deep_variant(unit: Path) -> Path:
    return next(p for p in sorted(unit.rglob("fxgraph/*/*/*")) if p.is_file())


@pytest.mark.parametrize("change", ["index", "artifact", "deep_graph", "new_name"])
def test_a_change_anywhere_in_the_unit_is_judged_again(cache, judged, change):
    primed(cache, judged)
    unit = cache / (BINARY if change in ("index", "artifact") else UNPACKED)
    if change == "index":
        (unit / "rank_0_0" / "backbone" / "vllm_compile_cache.py").write_text("{ (1, 2: oops")
    elif change == "artifact":
        art = unit / "rank_0_0" / "backbone" / "artifact_compile_range_1_8192_subgraph_1"
        os.truncate(art, art.stat().st_size - 100)
    elif change == "deep_graph":  # same size, mtime restored, five directories down: only its ctime tells
        variant = _deep_variant(unit)
        st = variant.stat()
        variant.write_bytes(b"\0" * st.st_size)
        os.utime(variant, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        (unit / "rank_0_0" / "eagle_head" / "stray.txt").write_text("x")
    got, real = both(cache, judged)
    assert got == real and judged == [unit.name]
    if change != "new_name":
        assert next(e.status for e in got if e.hash == unit.name) != "complete"


def test_parallel_workers_serve_and_record(cache, judged, monkeypatch):
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 1)
    first = scan_cache(cache, use_index=True)
    assert first.entries == scan_cache(cache, use_index=True).entries == scan_cache(cache).entries
    shutil.rmtree(next((cache / UNPACKED).rglob("aotautograd")))
    got, real = both(cache, judged)
    assert got == real and next(e.status for e in got if e.hash == UNPACKED) != "complete"
