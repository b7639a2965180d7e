"""Real last use (issue 25): a compiler's hit reads an entry's files and writes nothing, so where the mount
records reads (relatime, strictatime, lazytime) an entry's last use is its files' newest atime; on a
`noatime` mount it stays kcache's stamp or the mtime. kcache's own reads (ls, verify, inspect, export)
never count as a use. Real mounts (tmpfs, as root) where a mount option is the point."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from gen_cache import generate  # noqa: E402

from kcache_cli.fs import state  # noqa: E402

T = 1_700_000_000  # 2023: older than relatime's day, so the next read sets atime
ADD = "ops/cuda_space_0/add/8d1f7691cdf75e90"
RELU = "ops/cpu_space_0/relu/31857fe085635b31"


def same_times(root: Path, t: float = T) -> None:
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (t, t), follow_symlinks=False)
    os.utime(root, (t, t))


def read_like_a_compiler(entry: Path) -> None:
    """What a hit does: read the files (hidet dlopens lib.so; cat reads it as plainly)."""
    for name in ("lib.so", "meta.json", "func_types.pickle"):
        if (entry / name).exists():
            subprocess.run(["cat", str(entry / name)], check=True, stdout=subprocess.DEVNULL)


def atimes(root: Path) -> dict[str, int]:
    return {str(p): p.lstat().st_atime_ns for p in root.rglob("*")}


def last_used(kcache, root: Path) -> dict[str, float]:
    from datetime import datetime

    run = kcache("--cache-dir", root, "ls", "--json")
    assert run.exit_code == 0, run.stderr
    return {e["path"][len(str(root)) + 1:]: datetime.fromisoformat(e["last_used"]).timestamp()
            for e in run.json()["entries"]}


@contextlib.contextmanager
def mounted(where: Path, options: str, size: str = "64m"):
    """A real tmpfs at `where` with `options` (root only), unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"{options},size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs with {options}: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


# ---- the mount table --------------------------------------------------------------------------------
def test_mountinfo_is_read_with_escapes_and_longest_prefix(tmp_path):
    from kcache_cli.fs import mounts

    info = tmp_path / "mountinfo"
    info.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 27 0:39 / /data rw,noatime - xfs /dev/vdb rw\n"
        "41 40 0:40 / /data/my\\040cache rw,nodiratime - tmpfs tmpfs rw,lazytime\n"
        "42 40 0:41 / /data/strict rw - ext4 /dev/vdc rw\n"
        "garbage\n")
    table = mounts.table(str(info))
    assert [m.point for m in table] == ["/", "/data", "/data/my cache", "/data/strict"]
    assert [m.records_reads for m in table] == [True, False, True, True]  # strictatime shows as nothing
    assert mounts.mount_of("/data/my cache/x", table).point == "/data/my cache"
    assert mounts.mount_of("/data/my cachex", table).point == "/data"
    assert mounts.mount_of("/home/u", table).point == "/"
    assert mounts.table(str(tmp_path / "missing")) == []


def test_atime_rule_decides_per_mount_below_the_root(tmp_path, monkeypatch):
    from kcache_cli.fs import mounts

    root = tmp_path / "cache"
    (root / "fast").mkdir(parents=True)
    real = os.path.realpath(root)
    info = tmp_path / "mountinfo"
    info.write_text(f"27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
                    f"40 27 0:39 / {real}/fast rw,noatime - tmpfs tmpfs rw\n")
    monkeypatch.setattr(mounts, "MOUNTINFO", str(info))
    rule = mounts.AtimeRule(root)
    assert rule(str(root / "ops" / "x")) is True
    assert rule(str(root / "fast" / "x")) is False
    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "none"))
    assert mounts.AtimeRule(root)(str(root / "ops")) is False  # no table: today's rule (stamps, mtime)


# ---- last use from atime --------------------------------------------------------------------------------
def test_a_read_on_a_relatime_mount_is_a_use_and_prune_keeps_it(kcache, fixture_copy):
    root = fixture_copy("hidet")
    same_times(root)
    read_like_a_compiler(root / ADD)
    used = last_used(kcache, root)
    assert used[ADD] > time.time() - 600, "the read is the entry's last use"
    assert all(abs(t - T) < 2 for rel, t in used.items() if rel != ADD)
    # a budget that holds add alone (its size on disk) keeps it, though it shares its mtime with all the rest
    add = next(e["size"] for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]
               if e["path"] == str(root / ADD))
    run = kcache("--cache-dir", root, "prune", "--max-size", f"{add}B", "--yes")
    assert run.exit_code == 0, run.stderr
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("ops/*/*/*")) == [ADD]


def test_kcache_own_reads_are_not_a_use(kcache, fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    same_times(root)
    before = atimes(root)
    for args in (("ls",), ("stats",), ("verify",), ("inspect", "8d1f7691"), ("log", "8d1f7691"),
                 ("export", tmp_path / "out.tar")):
        run = kcache("--cache-dir", root, *args)
        assert run.exit_code in (0, 1), (args, run.stderr)
    after = atimes(root)
    changed = [p for p in before if p in after and after[p] != before[p] and not Path(p).is_dir()]
    assert not changed, f"kcache's reads moved atimes: {changed[:5]}"
    assert all(abs(t - T) < 2 for t in last_used(kcache, root).values())


@pytest.mark.parametrize("options, records", [("noatime", False), ("strictatime", True), ("relatime", True),
                                              ("nodiratime", True), ("lazytime", True)])
def test_mount_options_decide(kcache, tmp_path, options, records):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with mounted(tmp_path / "mnt", options) as mnt:
        root = mnt / "cache"
        subprocess.run(["cp", "-r", str(REPO / "tests" / "fixtures" / "real" / "hidet"), str(root)], check=True)
        same_times(root)
        read_like_a_compiler(root / RELU)
        assert ((root / RELU / "lib.so").stat().st_atime > T + 1) is (options != "noatime")  # the kernel's view
        used = last_used(kcache, root)
        assert (used[RELU] > time.time() - 600) is records
        if not records:
            assert abs(used[RELU] - T) < 2  # today's rule: the mtime


@pytest.mark.slow
def test_index_serves_fresh_atimes(kcache, tmp_path):
    """An entry answered from the index (1,000 entries or more) still shows a read made after the index
    was written: atime is no part of the record's key, and it is read from the same lstat."""
    root = tmp_path / "cache"
    generate(str(root), 1200)
    same_times(root)
    time.sleep(2.5)  # past the index's racy window (ctime moved with utime)
    first = last_used(kcache, root)
    assert any(p.name.startswith("scan.") for p in (root / ".kcache" / "index").iterdir()), "an index was written"
    target = sorted(first)[100]
    read_like_a_compiler(root / target)
    second = last_used(kcache, root)
    assert second[target] > time.time() - 600
    assert sum(1 for rel, t in second.items() if abs(t - T) < 2) == len(first) - 1


def test_a_triton_only_machine_keeps_its_budget_and_the_kernels_read_last(kcache):
    """Issue 25, done when: on a machine whose only cache is Triton's, `kcache ls` lists it, and a bare
    `kcache prune` with a configured budget brings it under the budget, keeping the kernels read most
    recently (though every file shares one mtime, as a copied cache does)."""
    from conftest import FIXTURES, copy_tree

    root = copy_tree(FIXTURES / "triton" / "cache", Path.home() / ".triton" / "cache")
    same_times(root)
    hot = ["ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA",  # 30 kB and 44 kB of the 419 kB
           "VHF5NYJI46Z5SH764YNBNADKGBWRZQ7ZZXWIAKML3FZVBJSTRSDQ"]
    for kernel in hot:  # what a Triton hit does: read the group file and the kernel's files
        for f in (root / kernel).iterdir():
            subprocess.run(["cat", str(f)], check=True, stdout=subprocess.DEVNULL)
    listed = kcache("ls", "--json")
    assert listed.exit_code == 0, listed.stderr
    assert {e["cache"] for e in listed.json()["entries"]} == {"triton"} and len(listed.json()["entries"]) == 6
    sizes = {e["hash"]: e["size"] for e in listed.json()["entries"]}  # on disk (issue 32)
    limit = sum(sizes[k] for k in hot)
    assert kcache("config", "set", "--cache", "triton", "max-size", f"{limit}B").exit_code == 0
    run = kcache("prune", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == sorted(hot)
    after = kcache("stats", "--json").json()["caches"][0]
    assert after["size"] <= limit and after["budget"] == {"used": after["size"], "limit": limit}


def test_a_read_without_noatime_is_noted_when_its_file_is_closed(fixture_copy, monkeypatch):
    """Another user's file is opened without O_NOATIME (the kernel refuses it): fsread.close_read notes what
    the read moved (only while a cache is being read: readmarks.reading), the note is saved in that cache and
    no other, and the next scan takes the atime before the read as the file's last use. Twice in one
    process: the note keeps the first atime."""
    from kcache_cli.fs import read as fsread
    from kcache_cli.fs import readmarks

    root = fixture_copy("hidet")
    lib = root / ADD / "lib.so"
    os.utime(lib, (T, T + 10))  # an atime older than the mtime: the next read moves it
    monkeypatch.setattr(fsread, "EUID", 4242)  # kcache as a member of the group, not the file's owner
    monkeypatch.setattr(fsread, "MOVED", {})
    monkeypatch.setattr(fsread, "READING", None)
    fd = fsread.open_quietly(str(lib), os.O_RDONLY, owner=0)  # no cache is being read: nothing noted
    fsread.close_read(fd)
    assert fsread.MOVED == {}
    os.utime(lib, (T, T + 10))
    readmarks.reading(root)
    for _ in range(2):
        fd = fsread.open_quietly(str(lib), os.O_RDONLY, owner=0)
        assert os.read(fd, 16)
        fsread.close_read(fd)
    st = lib.stat()
    key = (os.path.join(str(root), ""), st.st_ino)
    assert st.st_atime_ns > T * 10**9 and fsread.MOVED == {key: (st.st_atime_ns, T * 10**9)}
    readmarks.save(root / "ops")  # another cache's notes: none of this one's go there
    assert fsread.MOVED and not (root / "ops" / ".kcache").exists()
    readmarks.save_all()
    assert fsread.MOVED == {}
    readmarks.load(root)
    assert readmarks.atime(lib.stat()) == T
    fd = fsread.open_quietly(str(lib), os.O_RDONLY, owner=4242)  # its owner's read: O_NOATIME, nothing kept
    fsread.close_read(fd)
    assert fsread.MOVED == {}


def test_reads_in_a_row_keep_the_atime_before_the_first(monkeypatch):
    """A file read twice in one command, and the listing of its directory taken between the two reads (its
    atime then the first read's) reported when the directory is closed: the note keeps the atime before
    the first read. An atime kcache did not leave (a compiler's read in between) is a use, and starts anew."""
    from kcache_cli.fs import read as fsread

    monkeypatch.setattr(fsread, "MOVED", {})
    fsread.moved("/c/", 7, 20, 10)  # the first read: 10 -> 20
    fsread.moved("/c/", 7, 30, 20)  # the second: 20 -> 30
    fsread.moved("/c/", 7, 30, 20)  # the listing taken between them, at the directory's close
    assert fsread.MOVED == {("/c/", 7): (30, 10)}
    fsread.moved("/c/", 7, 40, 35)  # a compiler read it at 35 since
    assert fsread.MOVED == {("/c/", 7): (40, 35)}


def test_an_export_onto_a_full_disk_says_nothing_was_published(kcache, fixture_copy, tmp_path):
    """`Error: No space left on device`, and nothing more: the file system filled mid-export. It now says
    what kcache's writes through temp files mean (nothing half-written is there) and what to do."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = fixture_copy("hidet")
    with mounted(tmp_path / "small", "rw", "64k") as small:
        r = kcache("--cache-dir", root, "export", small / "all.tar")
        assert r.exit_code == 1 and "Traceback" not in r.stderr, r.stderr
        assert "No space left on device" in r.stderr and "not published" in r.stderr, r.stderr
        assert list(small.iterdir()) == []  # the temp archive went too


# ---- last use across export and import (the CI round trip) ----------------------------------------------
def rewrite_manifest(arc: Path, edit) -> None:
    """`edit(manifest)` applied to the manifest of the plain .tar `arc`, in place (its body, whose parts are
    counted from the end of the file, stays as it was)."""
    import json

    from kcache_cli.fs import tarstream as ts

    raw = arc.read_bytes()
    size = int(raw[124:135], 8)
    manifest = json.loads(raw[512:512 + size])
    edit(manifest)
    data = json.dumps(manifest, separators=(",", ":")).encode()
    body = raw[512 + size + (-size % 512):]
    arc.write_bytes(ts.file_header("manifest.json", len(data), 0o644, 0) + data + ts.padding(len(data)) + body)


def exported(kcache, src: Path, arc: Path) -> Path:
    run = kcache("--cache-dir", src, "export", arc)
    assert run.exit_code == 0, run.stderr
    return arc


def imported(kcache, arc: Path, dest: Path) -> dict:
    run = kcache("--cache-dir", dest, "import", arc, "--json")
    assert run.exit_code == 0, run.stderr
    return {e["relpath"]: e["action"] for e in run.json()["entries"]}


def test_import_restores_the_last_uses_and_mtimes_an_export_recorded(kcache, fixture_copy, tmp_path):
    """Every imported entry was "used now" (files got the import's time, the manifest had no last use): in
    CI's export -> actions/cache -> import loop `prune --older-than` never fired and a size budget could not
    tell a kernel unused for 50 runs from one used today. The archive now carries each entry's last use and
    import restores it, with the files' mtimes; a compiler's read after the import is still a use."""
    src = fixture_copy("hidet")
    same_times(src)
    state.mark_used(src, ADD, now=T + 10 * 86400)  # kcache's stamp: a use ten days after the build
    read_like_a_compiler(src / RELU)  # and a hit today
    before = last_used(kcache, src)
    dest = tmp_path / "dest"
    assert set(imported(kcache, exported(kcache, src, tmp_path / "a.tar.zst"), dest).values()) == {"import"}
    after = last_used(kcache, dest)
    assert after.keys() == before.keys() and all(abs(after[r] - before[r]) < 1 for r in before), (before, after)
    assert abs(after[ADD] - (T + 10 * 86400)) < 1 and after[RELU] > time.time() - 600
    assert {p.lstat().st_mtime for p in (dest / ADD).rglob("*")} == {T}  # each file's own mtime
    run = kcache("--cache-dir", dest, "prune", "--older-than", "30d", "--dry-run", "--json")
    assert sorted(e["path"][len(str(dest)) + 1:] for e in run.json()["removed"]) == sorted(set(before) - {RELU})
    read_like_a_compiler(dest / ADD)  # a hit after the import
    assert last_used(kcache, dest)[ADD] > time.time() - 600


def test_an_import_keeps_a_newer_use_and_never_takes_one_from_the_future(kcache, fixture_copy, tmp_path):
    """The use an import restores never moves an entry's last use back (an incomplete entry it replaces was
    used since), and an archive's times in the future (a remote may lie) are taken as now: a last use, a
    file's mtime."""
    src = fixture_copy("hidet")
    same_times(src)
    future = time.time() + 30 * 86400
    os.utime(src / RELU / "lib.so", (future, future))
    arc = exported(kcache, src, tmp_path / "a.tar")
    dest = fixture_copy("hidet", "dest")  # used just now (copied), but ADD is partial there
    (dest / ADD / "func_types.pickle").unlink()
    softmax = "ops/cuda_space_0/softmax/ad252b064b266eea"
    rewrite_manifest(arc, lambda m: next(e for e in m["entries"] if e["relpath"] == softmax).update(
        last_used="2100-01-01T00:00:00+00:00"))
    assert imported(kcache, arc, dest)[ADD] == "replace"
    assert time.time() - 600 < last_used(kcache, dest)[ADD] <= time.time() + 1
    last = tmp_path / "last"
    imported(kcache, arc, last)
    used = last_used(kcache, last)
    assert all(time.time() - 600 < used[r] <= time.time() + 1 for r in (softmax, RELU)), used
    assert (last / RELU / "lib.so").stat().st_mtime <= time.time()
    assert abs(used[ADD] - T) < 1


def test_an_archive_without_last_uses_imports_as_it_did(kcache, fixture_copy, tmp_path):
    """An older kcache's archive says no last use: its files get the import's time, as before (their mtimes
    alone would make entries used since look unused)."""
    src = fixture_copy("hidet")
    same_times(src)
    arc = exported(kcache, src, tmp_path / "a.tar")
    rewrite_manifest(arc, lambda m: [e.pop("last_used", None) for e in m["entries"]])
    dest = tmp_path / "dest"
    imported(kcache, arc, dest)
    assert all(t > time.time() - 600 for t in last_used(kcache, dest).values())
    assert not (dest / ".kcache" / "used").exists() or not list((dest / ".kcache" / "used").iterdir())


@pytest.mark.parametrize("measure", ["tree", "inductor listing"])
def test_a_usage_measured_after_a_read_takes_the_atime_before_it(tmp_path, monkeypatch, measure):
    """A judgement may read an entry's files before its usage is measured (records.measure_tree after a tilus
    program's judgement; Inductor's listing): an atime this process's own read left (fsread.MOVED, not saved
    yet) is taken back to the one before it, as a note saved by an earlier run is (readmarks.MARKS); any
    other atime is a use."""
    from kcache_cli.fs import read as fsread
    from kcache_cli.fs import readmarks
    from kcache_cli.layouts import inductor
    from kcache_cli.model.records import measure_tree

    entry = tmp_path / "entry"
    entry.mkdir()
    lib = entry / "lib.so"
    lib.write_bytes(b"\x7fELF")
    os.utime(lib, (T + 500, T))
    monkeypatch.setattr(fsread, "MOVED", {})
    monkeypatch.setattr(readmarks, "MARKS", {})
    readmarks.reading(tmp_path)

    def usage() -> float:
        if measure == "tree":
            return measure_tree(str(entry), print).atime
        return inductor.listing(str(entry)).usage(str(entry), print).atime

    assert usage() == T + 500  # no read of kcache's: the atime is a use
    fsread.moved(fsread.READING, lib.stat().st_ino, (T + 500) * 10**9, (T + 100) * 10**9)
    assert usage() == T + 100  # this process's read moved it from T + 100
    readmarks.MARKS[lib.stat().st_ino] = readmarks.Mark((T + 100) * 10**9, T * 10**9, os.geteuid(), -1)
    assert usage() == T  # ... and an earlier run's read from T, as its note says
    os.utime(lib, (T + 900, T))  # a compiler's read since: a use
    assert usage() == T + 900
