"""The scan index (kcache_cli/catalog/index.py) never answers stale: whatever changes behind its back, `ls`/`stats`
with the index say exactly what a real scan says, and the index does answer when nothing changed."""

from __future__ import annotations

import multiprocessing
import json
import os
import pickle
import shutil
import subprocess
import sys
import time

import pytest

from kcache_cli.catalog import index
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import state
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.fs.locking import entry_lock
from kcache_cli.layouts import hidet
from kcache_cli.model.records import ScanFilter

SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
ADD = "ops/cuda_space_0/add/8d1f7691cdf75e90"
RACY = 0.05  # the tests' racy window: short, so that they need not wait two seconds


@pytest.fixture
def judged(monkeypatch):
    """How many hidet op entries the scan really judged (the rest came from the index)."""
    return counting_judge(monkeypatch, hidet, "_op_entry", lambda job: job[0])


def aged(tree, seconds: float = 7200) -> None:
    """Every name in `tree` (links themselves) last changed `seconds` ago: no compiler is writing it."""
    old = time.time() - seconds
    for p in (tree, *tree.rglob("*")):
        os.utime(p, (old, old), follow_symlinks=False)


def counting_judge(monkeypatch, module, name: str, label=lambda job: os.path.basename(job[0])) -> list[str]:
    """Wrap the layout's per-entry function `module.name` so that each job it really judges is counted, as
    `label(job)` (the rest came from the index), with the tests' short racy window and no minimum size.
    Every layout's index tests use it."""
    calls: list[str] = []
    real = getattr(module, name)

    def counting(ctx, job):
        calls.append(label(job))
        return real(ctx, job)

    monkeypatch.setattr(module, name, counting)
    monkeypatch.setattr(index, "RACY_SECONDS", RACY)
    monkeypatch.setattr(index, "MIN_ENTRIES", 0)
    return calls


@pytest.fixture
def cache(fixture_copy):
    root = fixture_copy("hidet")
    time.sleep(RACY * 2)  # older than the racy window, so that the first scan stores every entry
    return root


def index_object(data: bytes) -> dict:
    """An index file's {"context", "records"}, the records of every part of it gathered (index.unframed)."""
    parts = index.unframed(data)
    assert parts is not None
    objs = [pickle.loads(part) for part in parts]
    for more in objs[1:]:
        objs[0]["records"].update(more)
    return objs[0]


def both(root, judged, flt: ScanFilter = ScanFilter()):
    """(the index's answer, the real scan's answer): Entry tuples compared field by field. `judged` keeps
    only what the scan with the index judged. Every layout's index tests use it."""
    got = scan_cache(root, flt, use_index=True).entries
    n = len(judged)
    real = scan_cache(root, flt).entries
    del judged[n:]
    return got, real


def served(root, judged, flt: ScanFilter = ScanFilter()) -> tuple:
    """Index `root`, then scan it again: the index's answer equals the real scan's and nothing was judged
    again (every entry came from the index). That answer. The other layouts' index tests prime with it."""
    scan_cache(root, flt, use_index=True)
    judged.clear()
    got, real = both(root, judged, flt)
    assert got == real and judged == [], "an unchanged cache is answered from the index alone"
    return got


def primed(root, judged) -> None:
    """Index `root`, and check that the next scan is answered from the index alone."""
    scan_cache(root, use_index=True)
    judged.clear()
    assert scan_cache(root, use_index=True).entries == scan_cache(root).entries
    assert len(judged) == 5, "only the real scan judged"
    judged.clear()


def settle() -> None:
    time.sleep(RACY * 2)


def restore_times(path, st) -> None:
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_unchanged_cache_is_answered_from_the_index(cache, judged):
    first = scan_cache(cache, use_index=True)
    assert len(judged) == 5 and (cache / ".kcache" / "index" / state.index_name()).is_file()
    judged.clear()
    again = scan_cache(cache, use_index=True)
    assert judged == []
    assert again.entries == first.entries == scan_cache(cache).entries


def test_a_group_shared_cache_is_answered_from_the_index_too(cache, judged):
    """In a group-shared root (2775) kcache's state is the group's, but a user's index is theirs alone: it
    is read back only when no one else may write it (a member could forge what root's scan believes), so it
    must not be written group-writable, or no `ls` of a shared cache is ever answered from it. It lies in
    the user's own directory of .kcache/index/, which no member may write (nor rename a file into), nor
    read (its names are of other members' private entries too); the files an older kcache left in
    .kcache/index/ itself go when it is made."""
    os.chmod(cache, 0o2775)
    old = cache / ".kcache" / "index"
    old.mkdir(parents=True)
    for kind in ("scan", "names"):  # what the code before wrote, group-writable, and never read back
        (old / state.index_name(kind)).write_bytes(b"KCACHE")
        os.chmod(old / state.index_name(kind), 0o664)
    first = scan_cache(cache, use_index=True)
    own = old / str(os.geteuid())
    made = os.stat(own / state.index_name())
    judged.clear()
    again = scan_cache(cache, use_index=True)
    assert judged == [] and again.entries == first.entries, oct(made.st_mode)
    for st in (made, os.stat(own)):
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, oct(st.st_mode)
    assert not os.stat(own).st_mode & 0o077 and sorted(p.name for p in old.iterdir()) == [own.name]


def test_cli_ls_and_stats_json_same_with_and_without_index(cache, kcache, judged):
    """The same answers with the index as without; unchanged entries judged once. Entries named by hash
    prefix are judged from their own directories each time, as inspect and clear judge them: the index
    is not loaded for them (100,000 records cost more than reading the few entries named)."""
    for args in (["ls", "--json"], ["stats", "--json"], ["ls", "--op", "add", "--json"], ["ls", "8d1f", "--json"]):
        without = kcache("--cache-dir", cache, *args, "--no-index")
        first = kcache("--cache-dir", cache, *args)
        judged.clear()
        second = kcache("--cache-dir", cache, *args)
        assert without.exit_code == first.exit_code == second.exit_code == 0
        assert first.json() == second.json() == without.json(), args
        assert judged == ([] if "8d1f" not in args else [str(cache / "ops/cuda_space_0/add/8d1f7691cdf75e90")]), args


@pytest.mark.parametrize("args, removed", [
    (["prune", "--max-size", "0"], 5), (["clear", "--all"], 5), (["clear", "--op", "add"], 1)])
def test_prune_and_clear_plan_from_the_index(cache, kcache, judged, args, removed):
    """A prune (a cron job's: --max-size, a budget) or clear plans from a scan as ls's is made: unchanged
    entries answered from the index, the plan the one a full scan (--no-index) makes."""
    args = [*args, "--dry-run", "--json"]
    without = kcache("--cache-dir", cache, *args, "--no-index")
    assert judged
    first = kcache("--cache-dir", cache, *args)
    judged.clear()
    second = kcache("--cache-dir", cache, *args)
    assert without.exit_code == first.exit_code == second.exit_code == 0
    assert first.json() == second.json() == without.json()
    assert judged == [] and len(second.json()["removed"]) == removed


def test_no_index_option_in_help(kcache):
    for cmd in ("ls", "stats", "prune", "clear"):
        assert "--no-index" in kcache(cmd, "--help").stdout


def test_lib_so_rewritten_in_place_same_size_mtime_restored(cache, judged):
    """The case only a file's ctime reveals: same size, same mtime (`touch -d`), same inode, same directory."""
    entry = cache / SOFTMAX
    t = os.stat(entry / "func_types.pickle").st_mtime_ns
    for f in entry.iterdir():  # as tar x leaves them: one mtime, so ls reads lib.so's header
        os.utime(f, ns=(t, t))
    settle()
    primed(cache, judged)
    lib = entry / "lib.so"
    st = os.stat(lib)
    with open(lib, "r+b") as f:
        f.write(b"\0" * st.st_size)
    restore_times(lib, st)
    assert os.stat(lib).st_ino == st.st_ino and os.stat(lib).st_size == st.st_size
    got, real = both(cache, judged)
    assert got == real
    assert {e.relpath: e.status for e in got}[SOFTMAX] == "corrupt"
    assert judged == [str(entry)]


def test_touch_d_restores_mtime_of_a_rewritten_task(cache, judged, tmp_path):
    primed(cache, judged)
    task = cache / ADD / "task.txt"
    st = os.stat(task)
    data = task.read_bytes()
    task.write_bytes(data.replace(b"add", b"xyz", 1))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime))
    subprocess.run(["touch", "-d", stamp, str(task)], check=True)
    got, real = both(cache, judged)
    assert got == real and judged == [str(cache / ADD)]


@pytest.mark.parametrize("change", ["add", "remove", "grow", "truncate_lib", "empty_lib", "chmod", "rename"])
def test_changed_entry_is_judged_again(cache, judged, change):
    primed(cache, judged)
    entry = cache / SOFTMAX
    lib = entry / "lib.so"
    st = os.stat(lib)
    if change == "add":
        (entry / "kcache.json").write_text('{"files": {"lib.so": {"size": 1}}}')  # sizes now disagree
    elif change == "remove":
        (entry / "func_types.pickle").unlink()
    elif change == "grow":
        with open(entry / "source.cu", "ab") as f:
            f.write(b"// more\n")
    elif change == "truncate_lib":
        os.truncate(lib, 100)
        restore_times(lib, st)
    elif change == "empty_lib":
        os.truncate(lib, 0)
        restore_times(lib, st)
    elif change == "chmod":
        os.chmod(entry / "source.cu", 0o600)
    elif change == "rename":
        os.rename(entry / "func_types.pickle", entry / "func_types.old")
    got, real = both(cache, judged)
    assert got == real
    assert judged == [str(entry)]
    if change in ("remove", "empty_lib", "rename"):
        assert {e.relpath: e.status for e in got}[SOFTMAX] != "complete"


def test_entry_directory_replaced_and_entries_added_or_removed(cache, judged):
    primed(cache, judged)
    entry = cache / SOFTMAX
    copy = cache / "ops" / "cuda_space_0" / "softmax" / "tmpcopy"
    shutil.copytree(entry, copy)
    os.truncate(copy / "lib.so", 10)
    shutil.rmtree(entry)
    os.rename(copy, entry)  # another directory, same name, same file names
    new = cache / "ops" / "cuda_space_0" / "add" / "0123456789abcdef"
    shutil.copytree(cache / ADD, new)
    shutil.rmtree(cache / "ops" / "cpu_space_0" / "relu")
    got, real = both(cache, judged)
    assert got == real
    assert {e.relpath: e.status for e in got}[SOFTMAX] == "corrupt"
    assert sorted(judged) == sorted([str(entry), str(new)])


def test_an_entry_removed_alone_leaves_the_index_and_a_filtered_scan_keeps_the_others(cache, judged):
    """Nothing changed but an entry gone: the next complete scan writes the index without its record; a
    filtered scan (only part of the entries visited) keeps the records of those it did not visit."""
    primed(cache, judged)
    ctx = index._context(str(cache))
    before = set(index.load(str(cache), ctx))
    scan_cache(cache, ScanFilter(ops=("add",)), use_index=True)
    assert set(index.load(str(cache), ctx)) == before
    shutil.rmtree(cache / SOFTMAX)
    scan_cache(cache, use_index=True)
    assert set(index.load(str(cache), ctx)) == before - {str(cache / SOFTMAX)} and judged == []


def test_truncated_garbage_or_deleted_index_means_a_scan(cache, judged):
    primed(cache, judged)
    path = cache / ".kcache" / "index" / state.index_name()
    good = path.read_bytes()
    for bad in (good[: len(good) // 2], b"garbage", b"", good[:-1] + bytes([good[-1] ^ 1]),
                index.MAGIC + b"\0" * 12 + b"x", good + b"x", index.MAGIC + b"\xff" * 16,
                index.framed([b"not a pickle"]), index.framed([good[len(index.MAGIC):]] * 2)):
        path.write_bytes(bad)
        judged.clear()
        got, real = both(cache, judged)
        assert got == real and len(judged) == len(real)
    path.unlink()
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and len(judged) == len(real)


def test_a_loaded_index_is_frozen_before_the_collector_runs_again(cache, judged):
    """Unpickling an index makes objects for every field of every record: were the cyclic collector let
    back on before they are frozen (gc.freeze), the next object made would set off a collection of them all
    (80 ms of a 100,000-entry listing, and every later collection slower)."""
    import gc

    primed(cache, judged)
    context = index._context(str(cache))
    young: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            young.append(len(gc.get_objects(generation=0)))

    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)  # a collection at every object made, where the collector is on
    gc.callbacks.append(watch)
    try:
        records = index.load(str(cache), context)
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*threshold)
    assert len(records) >= 3
    assert max(young, default=0) < 5 * len(records), young  # never the records' own objects


def test_index_with_a_global_in_its_pickle_is_refused(cache, judged):
    """A file that passes its CRC but asks the unpickler for a class or function is not loaded."""
    primed(cache, judged)
    path = cache / ".kcache" / "index" / state.index_name()
    payload = pickle.dumps({"context": None, "records": {}, "x": os.system})
    path.write_bytes(index.framed([payload]))
    assert index.load(str(cache), ("anything",)) == {}


def test_a_record_naming_another_path_than_its_entrys_is_never_served(cache, judged, tmp_path):
    """An index that passed every check of its file (root's, in a user's cache the user may rename a file
    of root's into) holds a record whose path is a directory outside the cache: the entry is judged
    again, never listed (nor exported) as that directory."""
    primed(cache, judged)
    path = cache / ".kcache" / "index" / state.index_name()
    obj = index_object(path.read_bytes())
    elsewhere = str(tmp_path / "elsewhere")
    for key, rec in obj["records"].items():
        values = list(rec[3])
        values[index.FIELDS.index("path")] = elsewhere
        obj["records"][key] = (*rec[:3], tuple(values), rec[4])
    path.write_bytes(index.framed([pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)]))
    got, real = both(cache, judged)
    assert got == real and elsewhere not in {e.path for e in got}


def test_index_writable_by_others_or_owned_by_another_user_is_ignored(cache, judged):
    primed(cache, judged)
    path = cache / ".kcache" / "index" / state.index_name()
    os.chmod(path, 0o666)
    judged.clear()
    scan_cache(cache, use_index=True)
    assert len(judged) == 5
    if os.geteuid() == 0:
        scan_cache(cache, use_index=True)  # rewritten, ours again
        os.chown(path, 65534, 65534)
        judged.clear()
        scan_cache(cache, use_index=True)
        assert len(judged) == 5


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 3 << 20])
def test_index_file_read_whole_even_when_it_grew_after_its_fstat(tmp_path, monkeypatch, size):
    """An index file is read in one read of the size fstat saw; bytes past that size (the file grew)
    are read on, and a file past the limit is none."""
    data = os.urandom(size)
    root = str(tmp_path)
    dfd = state.open_index_dir(root, create=True)
    os.close(dfd)
    (tmp_path / ".kcache" / "index" / state.index_name("names")).write_bytes(data)
    assert state.read_index_file(root, "names", size) == data
    if size:
        assert state.read_index_file(root, "names", size - 1) is None
    real_fstat = os.fstat

    def shrunk(fd):  # the size at the fstat, before a writer appended the rest
        st = real_fstat(fd)
        return os.stat_result((*st[:6], st.st_size // 3, *st[7:]))

    monkeypatch.setattr(os, "fstat", shrunk)
    assert state.read_index_file(root, "names", size) == data
    if size:
        assert state.read_index_file(root, "names", size - 1) is None


def test_small_caches_get_no_index(cache, monkeypatch):
    assert index.MIN_ENTRIES > 5
    assert scan_cache(cache, use_index=True).entries == scan_cache(cache).entries
    assert not (cache / ".kcache" / "index").exists()


def test_recent_changes_are_not_stored(fixture_copy, judged, monkeypatch):
    """An entry changed within the racy window before the scan could change again within the same
    timestamp tick after it: such entries are judged again next time."""
    root = fixture_copy("hidet")
    monkeypatch.setattr(index, "RACY_SECONDS", 3600.0)
    scan_cache(root, use_index=True)
    judged.clear()
    scan_cache(root, use_index=True)
    assert len(judged) == 5


def test_lock_dependent_statuses_are_never_served(cache, judged):
    """`building` and `partial` depend on who holds a lock, which no stat shows."""
    entry = cache / "ops" / "cuda_space_0" / "add" / "8d1f7691cdf75e90"
    (entry / "func_types.pickle").unlink()  # partial, and building while hidet holds .lock
    settle()
    primed_statuses = {e.relpath: e.status for e in scan_cache(cache, use_index=True).entries}
    assert primed_statuses[ADD] == "partial"
    import fcntl

    with open(entry / ".lock", "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        got, real = both(cache, judged)
        assert got == real and {e.relpath: e.status for e in got}[ADD] == "building"
    got, real = both(cache, judged)
    assert got == real and {e.relpath: e.status for e in got}[ADD] == "partial"


def test_kcache_temp_dir_follows_its_build_lock(cache, judged):
    tmp = cache / "ops" / "cuda_space_0" / "add" / f"{state.TEMP_PREFIX}8d1f7691cdf75e90-0a1b"
    shutil.copytree(cache / ADD, tmp)
    settle()
    scan_cache(cache, use_index=True)
    with entry_lock(cache, ADD, timeout=5):
        got, real = both(cache, judged)
        assert got == real and {e.path: e.status for e in got}[str(tmp)] == "building"
    got, real = both(cache, judged)
    assert got == real and {e.path: e.status for e in got}[str(tmp)] == "partial"


def test_last_used_stamps_move_on(cache, judged):
    primed(cache, judged)
    state.mark_used(cache, ADD, now=time.time() + 5000)
    got, real = both(cache, judged)
    assert got == real and judged == []
    assert {e.relpath: e.last_used for e in got}[ADD] > time.time() + 4000


def test_index_never_written_through_a_symlink(cache, judged, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kdir = cache / ".kcache"
    kdir.mkdir(exist_ok=True)
    shutil.rmtree(kdir / "index", ignore_errors=True)
    (kdir / "index").symlink_to(elsewhere)
    got, real = both(cache, judged)
    assert got == real
    assert list(elsewhere.iterdir()) == []



def test_index_never_written_through_a_temp_file_swapped_for_a_hard_link(cache, judged, tmp_path, monkeypatch):
    """A member who may write .kcache/index/ (a group-shared cache) swaps the writer's temp file, while its
    scan runs, for a hard link to a file elsewhere: root's index is written only through the file it made."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"not kcache's\n")
    real = hidet._op_entry

    def swapping(ctx, job):
        for tmp in (cache / ".kcache" / "index").glob(".tmp-*"):
            tmp.unlink()
            os.link(outside, tmp)
        return real(ctx, job)

    monkeypatch.setattr(hidet, "_op_entry", swapping)
    scan_cache(cache, use_index=True)
    assert outside.read_bytes() == b"not kcache's\n"

def test_unwritable_cache_has_no_index_and_still_answers(cache, judged):
    shutil.rmtree(cache / ".kcache", ignore_errors=True)
    (cache / ".kcache").write_text("not a directory")  # mkdir fails, as on a read-only cache
    got, real = both(cache, judged)
    assert got == real
    judged.clear()
    scan_cache(cache, use_index=True)
    assert len(judged) == 5


def test_filtered_scan_keeps_the_other_records(cache, judged):
    primed(cache, judged)
    with open(cache / ADD / "source.cu", "ab") as f:
        f.write(b"//\n")
    settle()
    scan_cache(cache, hidet_filter("add"), use_index=True)
    assert judged == [str(cache / ADD)]
    judged.clear()
    add = hidet_filter("add")
    assert scan_cache(cache, add, use_index=True).entries == scan_cache(cache, add).entries
    assert judged == [str(cache / ADD)], "the filtered scan's own record served it; --no-index judged it"
    judged.clear()
    got, real = both(cache, judged)
    # Every scan asks the same question (the installed hidet's version): the filtered scan's record serves.
    assert got == real and judged == []


def hidet_filter(op):
    from kcache_cli.model.records import ScanFilter

    return ScanFilter(ops=(op,))


def _flipper(lib: str, good: bytes, stop, mtime_ns: int) -> None:
    """A concurrent writer: rewrites lib.so in place, whole or truncated, restoring its mtime each time."""
    i = 0
    while not stop.is_set():
        with open(lib, "r+b") as f:
            f.write(good if i % 2 == 0 else b"\0" * len(good))
        os.utime(lib, ns=(mtime_ns, mtime_ns))
        i += 1


def test_concurrent_writer_never_leaves_a_stale_record(cache, judged):
    entry = cache / SOFTMAX
    t = os.stat(entry / "func_types.pickle").st_mtime_ns
    for f in entry.iterdir():
        os.utime(f, ns=(t, t))
    lib = str(entry / "lib.so")
    with open(lib, "rb") as f:
        good = f.read()
    settle()
    ctx = multiprocessing.get_context("fork")
    for _ in range(6):
        stop = ctx.Event()
        proc = ctx.Process(target=_flipper, args=(lib, good, stop, t))
        proc.start()
        try:
            for _ in range(3):
                scan_cache(cache, use_index=True)
        finally:
            stop.set()
            proc.join(10)
        settle()
        got, real = both(cache, judged)
        assert got == real


def test_parallel_scan_with_index_matches(fixture_copy, judged, monkeypatch):
    """Big caches are read by forked workers: records and hits travel back from them."""
    from kcache_cli.catalog import scan_context as scan_mod

    root = fixture_copy("hidet")
    settle()
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 1)
    first = scan_cache(root, use_index=True)
    # each worker's records are written as it pickled them, a part of the file each, and loaded back
    parts = index.unframed((root / ".kcache" / "index" / state.index_name()).read_bytes())
    assert parts is not None and len(parts) >= 2
    storable = {e.path for e in first.entries if e.status in index.STORABLE and e.kind == "op"}
    assert storable and set(index.load(str(root), index._context(str(root)))) == storable
    second = scan_cache(root, use_index=True)
    assert first.entries == second.entries == scan_cache(root).entries
    os.truncate(root / SOFTMAX / "lib.so", 0)
    got, real = both(root, judged)
    assert got == real and {e.relpath: e.status for e in got}[SOFTMAX] == "partial"  # hidet compiles an empty one


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_an_index_made_for_root_is_not_used_by_another_user(judged):
    """Permissions decide what a user can read: root's records, even handed to `nobody` as its own
    index file, are refused (the index's context names the user)."""
    import json
    import tempfile
    from pathlib import Path

    from conftest import FIXTURES, copy_tree

    shared_tmp = tempfile.mkdtemp(prefix="kcache-nobody-", dir="/tmp")  # pytest's tmp_path is 0700
    try:
        os.chmod(shared_tmp, 0o755)
        cache = copy_tree(FIXTURES / "hidet", Path(shared_tmp) / "cache")
        for dirpath, _, filenames in os.walk(cache):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o644)
        os.chmod(cache / SOFTMAX, 0o711)  # root lists it; nobody cannot
        settle()
        assert {e.relpath: e.status for e in scan_cache(cache, use_index=True).entries}[SOFTMAX] == "complete"
        idx = cache / ".kcache" / "index"
        theirs = idx / "scan.65534"
        shutil.copy(idx / state.index_name(), theirs)
        os.chown(theirs, 65534, 65534)
        os.chmod(idx, 0o777)
        src = os.path.dirname(os.path.dirname(os.path.abspath(index.__file__)))
        code = (f"import json,sys; sys.path.insert(0, {src!r}); from kcache_cli.catalog.scan import scan_cache; "
                f"print(json.dumps({{e.relpath: e.status for e in scan_cache({str(cache)!r}, use_index=True)"
                ".entries}))")
        proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                               "-c", code], check=False, capture_output=True, text=True, cwd=shared_tmp,
                              env={**os.environ, "HOME": shared_tmp})
        if proc.returncode != 0:
            pytest.skip(f"nobody cannot run kcache from here: {proc.stderr.strip()[-200:]}")
        assert json.loads(proc.stdout)[SOFTMAX] == "unreadable"  # issue 10: a directory nobody may list
    finally:
        shutil.rmtree(shared_tmp, ignore_errors=True)


def test_prefix_resolution_judges_only_the_entries_its_names_match(cache, judged, kcache):
    """inspect/log <prefix> find the entry by directory names (kcache_cli/catalog/names.py), then read only it."""
    from kcache_cli.catalog.scan import resolve_entry

    assert resolve_entry(cache, "ad25").relpath == SOFTMAX
    assert judged == [str(cache / SOFTMAX)]
    judged.clear()
    run = kcache("--cache-dir", cache, "log", "8d1f", "--raw")
    assert run.exit_code == 0 and run.stdout
    assert judged == [str(cache / ADD)]
    judged.clear()
    # issue 14's references: a path in the cache, relative or absolute, and a selector with a prefix
    assert resolve_entry(cache, SOFTMAX).relpath == SOFTMAX
    assert resolve_entry(cache, str(cache / SOFTMAX)).relpath == SOFTMAX
    assert judged == [str(cache / SOFTMAX)] * 2
    judged.clear()
    from kcache_cli.model.records import ScanFilter
    from kcache_cli.util.errors import UsageError

    with pytest.raises(UsageError, match="no entry matches"):
        resolve_entry(cache, "ad25", flt=ScanFilter(spaces=("cuda_space_1",)))
    assert resolve_entry(cache, "ad25", flt=ScanFilter(ops=("softmax",))).relpath == SOFTMAX


def test_a_killed_writer_leaves_nothing_that_matters(cache, judged):
    """A writer killed mid-write leaves its temp file (removed once an hour old) and never a half index:
    the index is renamed into place whole."""
    primed(cache, judged)
    idx = cache / ".kcache" / "index"
    old, fresh = idx / ".tmp-1-dead", idx / ".tmp-2-live"
    old.write_bytes(b"half an index")
    fresh.write_bytes(b"another writer, still running")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    with open(cache / ADD / "source.cu", "ab") as f:
        f.write(b"//\n")  # something to write about
    settle()
    got, real = both(cache, judged)
    assert got == real and judged == [str(cache / ADD)]
    assert not old.exists() and fresh.exists()
    assert sorted(p.name for p in idx.iterdir()) == sorted([fresh.name, state.index_name()])


def test_a_symlinked_manifest_is_judged_every_time(cache, judged, tmp_path):
    """ls reads kcache.json through a symlink: changes to its target show in no stat of the entry."""
    import json

    entry = cache / SOFTMAX
    size = os.path.getsize(entry / "source.cu")
    outside = tmp_path / "kcache.json"
    outside.write_text(json.dumps({"files": {"source.cu": {"size": size}}}))
    (entry / "kcache.json").symlink_to(outside)
    t = os.stat(entry / "func_types.pickle").st_mtime_ns
    for marker in hidet.HIDET_MARKERS:  # an entry kcache built: judged by its kcache.json (issue 10)
        (entry / marker).unlink()
    for f in entry.iterdir():  # one mtime: ls compares sizes with the manifest
        os.utime(f, ns=(t, t), follow_symlinks=False)
    settle()
    # fsread never reads a manifest through a link (issue 9): corrupt whatever the target says, and the
    # entry is never stored, so it is judged on every scan.
    first = {e.relpath: e for e in scan_cache(cache, use_index=True).entries}[SOFTMAX]
    assert first.status == "corrupt" and "kcache.json" in (first.reason or "")
    outside.write_text(json.dumps({"files": {"source.cu": {"size": size + 1}}}))
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and str(entry) in judged


# ---- fidelity (issue 10): what a judgement takes from outside the entry -----------------------------

def statuses(entries) -> dict[str, str]:
    return {e.relpath: e.status for e in entries}


@pytest.fixture
def no_hidet(monkeypatch):
    """No hidet installed (as in the test venv), read afresh: installed_version() caches its answer."""
    monkeypatch.setattr(hidet, "_INSTALLED", [])
    return monkeypatch


def test_a_newer_version_elsewhere_changes_no_indexed_entry(cache, judged, no_hidet):
    """Each entry is judged against the installed hidet alone (issue 22): one entry rebuilt by a newer
    hidet behind the index's back is judged again, and the others are served as they were."""
    primed(cache, judged)
    (cache / SOFTMAX / "version.txt").write_text("0.7.0")
    settle()
    got, real = both(cache, judged)
    assert got == real and set(statuses(got).values()) == {"complete"}
    assert judged == [str(cache / SOFTMAX)], "the others came from the index"
    newer = cache / "ir_modules" / "0123456789abcdef"
    newer.mkdir(parents=True)
    (newer / "version.txt").write_text("0.8.0")
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and statuses(got)[ADD] == "complete" and judged == []
    for flt in (hidet_filter("add"), hidet_filter("softmax")):
        for _ in range(2):  # building the records, then served from them
            assert scan_cache(cache, flt, use_index=True).entries == scan_cache(cache, flt).entries


def _metadata_version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


@pytest.mark.parametrize("dirname, metadata, version", [
    ("hidet-0.6.1.dist-info", "METADATA", "0.6.1"), ("Hidet-0.7.0rc1+cu13.dist-info", "METADATA", "0.7.0rc1+cu13"),
    ("hidet-0.5.0-py3.11.egg-info", "PKG-INFO", "0.5.0"), ("hidet.egg-info", "PKG-INFO", "0.4.2")])
def test_installed_version_is_what_importlib_metadata_says(tmp_path, monkeypatch, dirname, metadata, version):
    """installed_version reads the dist-info's name instead of importing importlib.metadata: it must
    give the same answer (a name without a version falls back to importlib.metadata)."""
    (tmp_path / dirname).mkdir()
    (tmp_path / dirname / metadata).write_text(f"Metadata-Version: 2.1\nName: hidet\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hidet, "_INSTALLED", [])
    assert hidet.installed_version() == _metadata_version("hidet") == version


def test_installing_or_removing_hidet_rejudges_indexed_entries(cache, judged, no_hidet, tmp_path):
    """The installed hidet's version (its dist-info on sys.path, read by installed_version) decides: the
    index never serves a judgement made against another version in use."""
    site = tmp_path / "site-packages"
    site.mkdir()
    no_hidet.syspath_prepend(str(site))

    def install(version: str | None) -> None:
        for d in site.iterdir():
            shutil.rmtree(d)
        if version:
            (site / f"hidet-{version}.dist-info").mkdir()
            (site / f"hidet-{version}.dist-info" / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: hidet\nVersion: {version}\n")

    # hidet 0.6.1 loads softmax as it is and fails on its meta.json; another hidet rewrites meta.json first
    (cache / SOFTMAX / "meta.json").write_text("{not json")
    settle()
    primed(cache, judged)
    for now, expected in (("0.7.0", "complete"), ("0.6.1", "corrupt"), ("0.7.0", "complete"), (None, "corrupt")):
        install(now)
        hidet._INSTALLED.clear()
        assert hidet.installed_version() == (now or "") == _metadata_version("hidet")
        hidet._INSTALLED.clear()
        got, real = both(cache, judged)
        assert got == real, now
        assert statuses(got)[SOFTMAX] == expected and statuses(got)[ADD] == "complete", now
        hidet._INSTALLED.clear()
        for op in ("add", None):
            flt = hidet_filter(op) if op else None
            with_index = scan_cache(cache, *([flt] if flt else []), use_index=True).entries
            assert with_index == scan_cache(cache, *([flt] if flt else [])).entries, (now, op)


def test_unreadable_is_never_stored(cache, judged, monkeypatch):
    """`unreadable` depends on permissions, which no stat of the entry's files records: judged every time."""
    real = EntryDir.unreadable
    denied = str(cache / SOFTMAX / "lib.so")
    monkeypatch.setattr(EntryDir, "unreadable", lambda d, name: "lib.so is unreadable (permission denied)"
                        if d.join(name) == denied else real(d, name))
    first = scan_cache(cache, use_index=True)
    assert statuses(first.entries)[SOFTMAX] == "unreadable"
    judged.clear()
    assert scan_cache(cache, use_index=True).entries == first.entries
    assert judged == [str(cache / SOFTMAX)]
    monkeypatch.setattr(EntryDir, "unreadable", real)  # permission given back: nothing on disk changed
    judged.clear()
    got, real_scan = both(cache, judged)
    assert got == real_scan and statuses(got)[SOFTMAX] == "complete" and judged == [str(cache / SOFTMAX)]
    assert index._record(first.entries[0].__class__(**{**first.entries[0].__dict__, "status": "unreadable"}),
                         ("f", (first.entries[0].path,)), (os.lstat(cache), []), [], 1 << 62) is None


def test_workers_started_by_a_forkserver_get_the_index_pickled(fixture_copy, monkeypatch):
    """When forking is not safe (a thread runs), parallel.map_parts pickles the work: the index's
    wrapper is a class, not a closure, and the answers are the same."""
    from kcache_cli.catalog import scan_context as scan_mod
    from kcache_cli.util import parallel

    root = fixture_copy("hidet")
    settle()
    monkeypatch.setattr(index, "RACY_SECONDS", RACY)
    monkeypatch.setattr(index, "MIN_ENTRIES", 0)
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 1)
    monkeypatch.setattr(parallel, "fork_safe", lambda: False)
    first = scan_cache(root, use_index=True)
    assert (root / ".kcache" / "index" / state.index_name()).is_file()
    assert scan_cache(root, use_index=True).entries == first.entries == scan_cache(root).entries


def test_the_index_keys_on_every_judging_module_imported_or_not(tmp_path):
    """The index's context names each judging module's file (size, mtime, inode), also of the layouts the
    scan never imported: a change to any of them drops the index, and building the context imports none."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(index.__file__)))  # kcache_cli/
    code = (f"import json, sys; sys.path.insert(0, {os.path.dirname(src)!r}); from kcache_cli.catalog import index; "
            f"c = index._context({str(tmp_path)!r}); "
            "print(json.dumps([[e[0], 'kcache_cli.layouts.numba' in sys.modules, *e[1:]] for e in c[-1]]))")
    proc = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    got = {name: rest for name, *rest in json.loads(proc.stdout)}
    loaded, size, mtime, ino = got["kcache_cli.layouts.numba"]
    st = os.stat(os.path.join(src, "layouts", "numba.py"))
    assert not loaded and (size, mtime, ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert all(len(rest) == 4 and rest[1] is not None for rest in got.values())


# Modules the layouts import that decide nothing a record holds: pushing, pulling and images, the last use
# (never stored: recomputed when a record serves), relocation's writes, lazy imports, the layouts' registry.
NOT_JUDGING = {"kcache_cli.layouts", "kcache_cli.util.lazy", "kcache_cli.fs.readmarks", "kcache_cli.fs.write",
               "kcache_cli.fs.dirnames", "kcache_cli.layouts.image_format", "kcache_cli.layouts.remote_format",
               "kcache_cli.layouts.triton_image", "kcache_cli.layouts.triton_remote", "kcache_cli.layouts.vllm_image"}


def test_every_module_a_layout_judges_with_drops_the_index_when_it_changes():
    """A helper a layout's judgement calls (layouts/_common.py's leads_here, EntryDir, the ELF reader)
    changed: the index must drop its records, as for the layout's own module. Every kcache module a layout
    imports is in the index's context, or named above as one that decides nothing a record holds."""
    import ast
    from importlib import import_module
    from importlib.util import find_spec

    from kcache_cli.layouts import NAMES

    judging = set(index._JUDGES) | {f"kcache_cli.layouts.{n}" for n in NAMES}
    here = os.path.dirname(os.path.abspath(index.__file__))
    missing = set()
    for n in NAMES:
        tree = ast.parse(open(os.path.join(here, "..", "layouts", f"{n}.py")).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kcache_cli"):
                package = hasattr(import_module(node.module), "__path__")
                names = {f"{node.module}.{a.name}" if package and find_spec(f"{node.module}.{a.name}") else node.module
                         for a in node.names}  # a module of a package (`from kcache_cli.fs import read`), or the module
                missing |= {m for m in names if m not in judging and m not in NOT_JUDGING}
    assert not missing, sorted(missing)
