"""The scan index (kcache_cli/catalog/index.py) answers unchanged Triton kernels too, and never stale: whatever
changes behind its back, `ls` with the index says exactly what a real scan says, and a kernel whose
judgement looked outside its own directory (group paths into another root, a symlinked file, a temp dir)
is judged every time."""

from __future__ import annotations

import json
import os
import time

import pytest
from test_index import both, counting_judge, served
from test_triton import ADD_90, KERNELS, MATMUL, SOFTMAX, age, settle

from kcache_cli.catalog import scan_context as scan_mod
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import read as fsread
from kcache_cli.ops.delete import plan_prune
from kcache_cli.layouts import triton
from kcache_cli.model.records import ScanFilter

RACY = 0.05


@pytest.fixture
def judged(monkeypatch):
    """The key directories the scan really judged (the rest came from the index)."""
    return counting_judge(monkeypatch, triton, "_key_entries")


@pytest.fixture
def cache(fixture_copy):
    root = fixture_copy("triton") / "cache"
    settle(root)
    age(root)
    time.sleep(RACY * 2)  # older than the racy window: the first scan stores every kernel
    return root


def primed(root, judged) -> None:
    served(root, judged)


def by_hash(entries) -> dict:
    return {e.hash: e for e in entries}


def keep_times(path, st) -> None:
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_unchanged_kernels_are_answered_from_the_index(cache, judged):
    first = scan_cache(cache, use_index=True)
    assert sorted(judged) == sorted(KERNELS)
    judged.clear()
    got, real = both(cache, judged)
    assert judged == [] and got == real == first.entries
    assert {e.hash: (e.op, e.space, e.status) for e in got} == {
        k: (v[0], v[1], "complete") for k, v in KERNELS.items()}


def test_metadata_rewritten_in_place_with_its_mtime_restored(cache, judged):
    """Only the file's ctime tells: the arch the listing shows comes from the new metadata."""
    primed(cache, judged)
    meta = cache / ADD_90 / "add_kernel.json"
    st = os.stat(meta)
    data = json.loads(meta.read_text())
    data["target"]["arch"] = 80
    meta.write_text(json.dumps(data))
    keep_times(meta, st)
    got, real = both(cache, judged)
    assert got == real and by_hash(got)[ADD_90].space == "sm_80" and judged == [ADD_90]


@pytest.mark.parametrize("change", ["truncate_cubin", "drop_group", "drop_child", "temp_dir", "add_file",
                                    "bad_group"])
def test_a_changed_kernel_is_judged_again(cache, judged, change):
    primed(cache, judged)
    entry = cache / MATMUL
    if change == "truncate_cubin":
        cubin = entry / "matmul_kernel.cubin"
        cubin.write_bytes(cubin.read_bytes()[:4096])
    elif change == "drop_group":
        (entry / "__grp__matmul_kernel.json").unlink()
    elif change == "drop_child":
        (entry / "matmul_kernel.llir").unlink()
    elif change == "temp_dir":
        (entry / "tmp.pid_1_abcd").mkdir()
        (entry / "tmp.pid_1_abcd" / "matmul_kernel.ptx").write_text("half")
    elif change == "add_file":
        (entry / "stray.txt").write_text("x")
    else:
        (entry / "__grp__matmul_kernel.json").write_text("{not json")
    got, real = both(cache, judged)
    assert got == real and judged == [MATMUL]
    want = {"truncate_cubin": "corrupt", "drop_group": "building", "drop_child": "partial", "temp_dir": "complete",
            "add_file": "complete", "bad_group": "partial"}[change]
    assert by_hash(got)[MATMUL].status == want


def test_a_kernel_says_how_many_directories_it_holds(cache, judged):
    """Entry.subdirs: 0 for the usual kernel, from the index too; a kernel holding a temp dir is judged
    again (its directory changed) and counts it."""
    primed(cache, judged)
    assert {e.subdirs for e in scan_cache(cache, use_index=True).entries} == {0} and judged == []
    (cache / MATMUL / "tmp.pid_1_abcd").mkdir()
    got, real = both(cache, judged)
    assert judged == [MATMUL] and by_hash(got)[MATMUL].subdirs == by_hash(real)[MATMUL].subdirs == 1
    assert {e.subdirs for e in got if e.hash != MATMUL} == {0}


def test_prune_looks_into_no_kernel_the_scan_found_without_a_directory(cache, judged, monkeypatch):
    """prune's plan lists no kernel directory of an unchanged cache again for the temp dirs of killed
    writes (a listing each: a third of a big cache's plan), and still finds one where a kernel holds it."""
    primed(cache, judged)
    listed: list[str] = []
    real = fsread.scandir_list

    def listing(path, *args, **kwargs):
        listed.append(os.path.basename(str(path)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fsread, "scandir_list", listing)
    plan = plan_prune(cache, use_index=True)
    assert judged == [] and not set(listed) & set(KERNELS) and not plan.removals
    temp = cache / MATMUL / "tmp.pid_7_dead"
    temp.mkdir()
    (temp / "matmul_kernel.ptx").write_text("half")
    old = time.time() - 7200  # a killed write's, an hour and more ago
    for p in (temp / "matmul_kernel.ptx", temp):
        os.utime(p, (old, old))
    time.sleep(RACY * 2)
    plan = plan_prune(cache, use_index=True)
    assert judged == [MATMUL] and set(listed) & set(KERNELS) == {MATMUL}
    assert [r.relpath for r in plan.removals] == [f"{MATMUL}/tmp.pid_7_dead"]


def test_kernels_whose_group_points_elsewhere_are_never_stored(cache, judged, tmp_path):
    """The verdict of a moved kernel depends on paths outside it (the root it was copied from)."""
    other = tmp_path / "elsewhere"
    settle(cache, written_at=str(other))
    age(cache)
    time.sleep(RACY * 2)
    scan_cache(cache, use_index=True)
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and sorted(judged) == sorted(KERNELS)
    assert {e.status for e in got} == {"moved"}
    # the other root appears with the kernels' files: Triton hits them there, and so does the listing
    (other / SOFTMAX).mkdir(parents=True)
    for f in (cache / SOFTMAX).iterdir():
        (other / SOFTMAX / f.name).write_bytes(f.read_bytes())
    time.sleep(RACY * 2)
    got, real = both(cache, judged)
    assert got == real and by_hash(got)[SOFTMAX].status == "complete"
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and SOFTMAX in judged, "a hit through another root is never served from the index"
    for f in (other / SOFTMAX).iterdir():
        f.unlink()
    got, real = both(cache, judged)
    assert got == real and by_hash(got)[SOFTMAX].status == "moved"


def test_a_symlinked_child_is_judged_every_time(cache, judged, tmp_path):
    target = tmp_path / "ptx"
    ptx = cache / SOFTMAX / "softmax_kernel.ptx"
    target.write_bytes(ptx.read_bytes())
    ptx.unlink()
    ptx.symlink_to(target)
    age(cache)
    time.sleep(RACY * 2)
    scan_cache(cache, use_index=True)
    judged.clear()
    target.write_bytes(b"\xff\xfe not text")  # behind the link: nothing in the key directory changes
    got, real = both(cache, judged)
    assert got == real and judged == [SOFTMAX] and by_hash(got)[SOFTMAX].status == "corrupt"


def test_filtered_scans_and_records(cache, judged):
    """An op filter is part of the job: a filtered scan (`ls --op`) is answered from the unfiltered
    listing's records, the filter applied to each kernel's op, and never replaces them (ls, stats and prune
    would judge every kernel again after each `ls --op`); a kernel with no record gets its own."""
    primed(cache, judged)
    for ops, want in ((("softmax_kernel",), [SOFTMAX]), (("soft*",), [SOFTMAX]), (("nothing",), [])):
        got, real = both(cache, judged, ScanFilter(ops=ops))
        assert got == real and [e.hash for e in got] == want and judged == [], ops
    got, real = both(cache, judged, ScanFilter(hash_prefixes=(MATMUL[:6],)))
    assert got == real and [e.hash for e in got] == [MATMUL]
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and len(got) == len(KERNELS) and judged == []
    fresh = cache / ("2" * 52)
    fresh.mkdir()
    for f in (cache / SOFTMAX).iterdir():
        text = f.read_bytes().replace(str(cache / SOFTMAX).encode(), str(fresh).encode())
        (fresh / f.name).write_bytes(text)  # the group file's paths lead into the copy
    age(fresh)
    time.sleep(RACY * 2)
    flt = ScanFilter(ops=("softmax_kernel",))
    scan_cache(cache, flt, use_index=True)
    assert judged == [fresh.name]
    judged.clear()
    got, real = both(cache, judged, flt)
    assert got == real and sorted(e.hash for e in got) == sorted([SOFTMAX, fresh.name]) and judged == []
    got, real = both(cache, judged)
    assert got == real and judged == [fresh.name]  # its record was the filtered scan's: judged, recorded


def test_parallel_workers_serve_and_record(cache, judged, monkeypatch):
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 1)
    first = scan_cache(cache, use_index=True)
    second = scan_cache(cache, use_index=True)
    assert first.entries == second.entries == scan_cache(cache).entries
    cubin = cache / ADD_90 / "add_kernel.cubin"
    os.truncate(cubin, 100)
    got, real = both(cache, judged)
    assert got == real and by_hash(got)[ADD_90].status == "corrupt"


def test_kcache_own_reads_are_no_use_in_the_listing(cache, monkeypatch):
    """Atimes that kcache's own reads left (readmarks) count as the atimes before them, in Triton's listing
    as in read_dir and the index: all three answer the same last use."""
    from kcache_cli.fs import readmarks
    from kcache_cli.fs.entrydir import EntryDir

    entry = cache / SOFTMAX
    stats = [os.stat(f) for f in entry.iterdir() if f.is_file()]
    before = min(st.st_atime_ns for st in stats) - 10**12  # a thousand seconds before any of them
    monkeypatch.setattr(readmarks, "MARKS", {st.st_ino: readmarks.Mark(st.st_atime_ns, before, 0, -1) for st in stats})
    with EntryDir.open(str(entry)) as d:
        assert triton._Listing(d, lambda m: None).accessed == before / 1e9
    monkeypatch.setattr(readmarks, "MARKS", {})
    with EntryDir.open(str(entry)) as d:
        assert triton._Listing(d, lambda m: None).accessed == max(st.st_atime for st in stats)
