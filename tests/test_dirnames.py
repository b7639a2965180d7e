"""Kept directory listings for lookups by hash prefix (kcache_cli/fs/dirnames.py): served only while
the directory is provably unchanged, never stale, never trusted from another user or a garbled file."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from kcache_cli.catalog import names
from kcache_cli.fs import dirnames, state
from kcache_cli.fs.dirnames import DirNames

RACY = 0.05


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch):
    monkeypatch.setattr(dirnames, "RACY_SECONDS", RACY)
    monkeypatch.setattr(dirnames, "MIN_BYTES", 0)


def settle() -> None:
    time.sleep(RACY * 3)


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "cache"
    op = r / "ops" / "cuda_space_0" / "add"
    op.mkdir(parents=True)
    for h in ("abc0000000000001", "abd0000000000002", "b000000000000003"):
        (op / h).mkdir()
    settle()
    return r


def names_file(root: Path) -> Path:
    return root / ".kcache" / "index" / state.index_name(dirnames.KIND)


def lookup(root: Path, prefix: str) -> list[str]:
    kept = DirNames(root)
    got = sorted(kept.starting(str(root / "ops/cuda_space_0/add"), prefix))
    kept.save()
    return got


def no_listing(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("listed again")

    monkeypatch.setattr(dirnames, "_read", refuse)
    monkeypatch.setattr(os, "listdir", refuse)


def test_second_lookup_is_answered_without_a_listing(root, monkeypatch):
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002"]
    assert names_file(root).is_file()
    no_listing(monkeypatch)
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002"]
    assert lookup(root, "b") == ["b000000000000003"]
    assert lookup(root, "z") == []


@pytest.mark.parametrize("change", ["add", "remove", "rename", "replace"])
def test_a_changed_directory_is_listed_again(root, change):
    op = root / "ops/cuda_space_0/add"
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002"]
    st = os.stat(op)
    if change == "add":
        (op / "abe0000000000004").mkdir()
    elif change == "remove":
        (op / "abd0000000000002").rmdir()
    elif change == "rename":
        os.rename(op / "abc0000000000001", op / "x000000000000001")
    else:  # another directory with other names and the same times takes its place
        shutil.copytree(op, root / "other")
        (root / "other" / "abe0000000000004").mkdir()
        shutil.rmtree(op)
        os.rename(root / "other", op)
    os.utime(op, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: ctime and the inode still tell
    expected = sorted(n for n in os.listdir(op) if n.startswith("ab"))
    assert lookup(root, "ab") == expected


def test_a_directory_changed_just_before_its_listing_is_not_kept(root, monkeypatch):
    monkeypatch.setattr(dirnames, "RACY_SECONDS", 3600.0)  # every directory is "just changed"
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002"]
    assert not names_file(root).exists()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "group-writable", "fifo", "other fields"])
def test_an_untrusted_or_damaged_file_means_a_listing(root, damage):
    lookup(root, "ab")
    path = names_file(root)
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "truncated":
        path.write_bytes(data[:-7])
    elif damage == "group-writable":
        os.chmod(path, 0o664)
    elif damage == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:  # a valid header over a payload whose fields do not come in sevens
        payload = b"ops/cuda_space_0/add\x001\x002"
        path.write_bytes(dirnames.MAGIC + dirnames._HEADER.pack(len(payload), __import__("zlib").crc32(payload))
                         + payload)
    (root / "ops/cuda_space_0/add/abf0000000000005").mkdir()
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002", "abf0000000000005"]


def test_kept_names_are_still_checked(root, monkeypatch):
    """A name a kept listing gives that is no directory now is not an entry (visible_dirs' lstat)."""
    assert sorted(e.hash for e in names.entries(root, "ab")) == ["abc0000000000001", "abd0000000000002"]
    monkeypatch.setattr(dirnames.DirNames, "starting", lambda self, path, prefix: ["abc0000000000001", "nothere"])
    assert sorted(e.hash for e in names.entries(root, "ab")) == ["abc0000000000001"]


def test_cli_lookup_sees_an_entry_added_after_the_last_one(kcache, fixture_copy, monkeypatch):
    """`inspect <prefix>` twice with an entry added between, in another op directory the first lookup
    listed: the second finds both (never stale)."""
    src = fixture_copy("hidet")
    entries = sorted(p for p in (src / "ops").glob("*/*/*") if p.is_dir())
    entry = entries[0]
    other = next(p.parent for p in entries if p.parent != entry.parent)
    settle()
    r = kcache("--cache-dir", src, "inspect", entry.name[:6])
    assert r.exit_code == 0, r.stderr
    assert names_file(src).is_file()
    twin = other / (entry.name[:6] + "f" * (len(entry.name) - 6))
    shutil.copytree(entry, twin)
    r = kcache("--cache-dir", src, "inspect", entry.name[:6])
    assert r.exit_code == 2 and "ambiguous" in r.stderr, r.stderr


def test_a_root_that_holds_the_entries_is_kept_too(tmp_path, monkeypatch):
    """A Triton cache's keys lie in its root: the root's listing is kept like any other."""
    root = tmp_path / "triton"
    for key in ("K" * 52, "A" * 52):
        (root / key).mkdir(parents=True)
    for _ in range(2):  # the first save makes .kcache/ in the root: the root changed, and is kept the next time
        settle()
        kept = DirNames(root)
        assert kept.starting(str(root), "KK") == ["K" * 52]
        kept.save()
    no_listing(monkeypatch)
    assert DirNames(root).starting(str(root), "A") == ["A" * 52]


def test_small_lookups_keep_nothing(root, monkeypatch):
    monkeypatch.setattr(dirnames, "MIN_BYTES", 16 << 10)
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002"]
    assert not (root / ".kcache").exists()


def test_an_unchanged_cache_never_rewrites_the_file(root):
    """Lookups whose walk meets directories that are not there (a hidet cache without graphs/) and
    directories all kept: the file stays as it is (no write per lookup)."""
    assert sorted(e.hash for e in names.entries(root, "ab")) == ["abc0000000000001", "abd0000000000002"]
    before = os.stat(names_file(root))
    for _ in range(2):
        assert sorted(e.hash for e in names.entries(root, "ab")) == ["abc0000000000001", "abd0000000000002"]
    after = os.stat(names_file(root))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_subdirs_by_prefix_are_the_listings_own(tmp_path, monkeypatch):
    """ScanContext.subdirs with prefixes gives what a listing filtered by them gives: real directories
    only (no file, no link), sorted; the second time from the kept listing."""
    from kcache_cli.catalog.scan_context import ScanContext
    from kcache_cli.fs import read as fsread

    root = tmp_path / "triton"
    root.mkdir()
    for name in ("AB1", "AB2", "AC3", "B44"):
        (root / name).mkdir()
    (root / "ABfile").write_text("x")
    os.symlink("AB1", root / "ABlink")
    settle()
    ctx = ScanContext(root, lambda m: None, {})
    want = [n for n in fsread.subdir_names(root) if n.startswith(("AB", "B"))]
    assert want == ["AB1", "AB2", "B44"]
    for _ in range(2):  # the first keeps the root's listing (its .kcache/ is made), the second keeps it anew
        assert ctx.subdirs(root, ("AB", "B")) == want
        settle()
    no_listing(monkeypatch)
    assert ctx.subdirs(root, ("AB", "B")) == want
    assert ctx.subdirs(root / "missing", ("AB",)) == []
    dotted = ctx.subdirs(root, ("AB", "."))  # a dot prefix: listed, never kept, still only what it names
    assert dotted == sorted(n for n in fsread.subdir_names(root) if n.startswith(("AB", "."))) and "B44" not in dotted


def test_triton_lookup_sees_a_key_added_after_the_last_one(kcache, fixture_copy):
    """`inspect <prefix>` on a Triton cache twice, a key directory with the same prefix added between: the
    second finds both (the root's kept listing is never stale)."""
    src = fixture_copy("triton") / "cache"
    key = next(p for p in sorted(src.iterdir()) if p.is_dir() and not p.name.startswith("."))
    settle()
    for _ in range(2):
        r = kcache("--cache-dir", src, "inspect", key.name[:10])
        assert r.exit_code in (0, 1), r.stderr
        settle()
    assert names_file(src).is_file()
    shutil.copytree(key, src / (key.name[:10] + "Z" * (len(key.name) - 10)))
    r = kcache("--cache-dir", src, "inspect", key.name[:10])
    assert r.exit_code == 2 and "ambiguous" in r.stderr, r.stderr


def test_a_lookup_takes_the_layouts_its_root_check_found(kcache, fixture_copy, monkeypatch):
    """The layouts the command's check of --cache-dir detected narrow the reference: not found again from
    the root's names."""
    src = fixture_copy("hidet")
    entry = next(p for p in (src / "ops").glob("*/*/*") if p.is_dir())

    def refuse(root):
        raise AssertionError("layouts found again")

    monkeypatch.setattr(names, "layouts_of", refuse)
    r = kcache("--cache-dir", src, "inspect", entry.name[:8])
    assert r.exit_code in (0, 1) and entry.name in r.stdout, r.stderr


def test_a_lookup_reads_the_kept_listings_once(kcache, fixture_copy, monkeypatch):
    """On a Triton root both the narrowing and the scan look the key up by prefix: the names file is read
    once for the command, not once for each."""
    src = fixture_copy("triton") / "cache"
    key = next(p for p in sorted(src.iterdir()) if p.is_dir() and not p.name.startswith("."))
    for _ in range(2):  # the listings are kept (the first save makes .kcache/: the root changed)
        settle()
        assert kcache("--cache-dir", src, "inspect", key.name[:10]).exit_code in (0, 1)
    assert names_file(src).is_file()
    monkeypatch.setattr(dirnames, "_OF", {})  # a new command
    reads: list[str] = []
    real = state.read_index_file

    def counting(root, kind, limit):
        reads.append(kind)
        return real(root, kind, limit)

    monkeypatch.setattr(state, "read_index_file", counting)
    assert kcache("--cache-dir", src, "inspect", key.name[:10]).exit_code in (0, 1)
    assert reads.count(dirnames.KIND) == 1


def test_types_come_with_the_names_and_links_are_asked_each_time(tmp_path, monkeypatch):
    """subdirs: real directories only; dirs_and_links: directories and the links that lead to one now (a
    link retargeted from a directory to a file changes nothing in the directory that holds it)."""
    root = tmp_path / "c"
    root.mkdir()
    for name in ("d1", "d2"):
        (root / name).mkdir()
    (root / "f").write_text("x")
    os.symlink("d1", root / "ln")
    os.symlink("nowhere", root / "dangling")
    for _ in range(2):  # the first save makes .kcache/ in it: the root changed, and is kept the next time
        settle()
        kept = DirNames(root)
        assert kept.subdirs(str(root)) == [".kcache", "d1", "d2"][_ == 0:]
        names, linked = kept.dirs_and_links(str(root))
        assert sorted(names)[-3:] == ["d1", "d2", "ln"] and linked == {"ln"}
        assert kept.links(str(root)) == ["dangling", "ln"] and kept.links(str(root / "d1")) == []
        kept.save()
    no_listing(monkeypatch)
    assert DirNames(root).subdirs(str(root)) == [".kcache", "d1", "d2"]
    assert DirNames(root).links(str(root)) == ["dangling", "ln"]
    os.unlink(root / "ln")  # the same name, now a link to a file: the directory changed...
    os.symlink("f", root / "ln")
    monkeypatch.undo()
    monkeypatch.setattr(dirnames, "RACY_SECONDS", RACY)
    monkeypatch.setattr(dirnames, "MIN_BYTES", 0)
    names, linked = DirNames(root).dirs_and_links(str(root))
    assert sorted(names)[-2:] == ["d1", "d2"] and not linked
    target = root / "d2"  # ...while a link's own target may change without the directory changing
    os.symlink("d2", root / "via")
    settle()
    kept = DirNames(root)
    assert "via" in kept.dirs_and_links(str(root))[1]
    kept.save()
    target.rmdir()
    target.write_text("now a file")
    names, linked = DirNames(root).dirs_and_links(str(root))
    assert "via" not in names and "via" not in linked


def test_directories_beside_files_and_no_link_are_picked_by_type(tmp_path, monkeypatch):
    """A root of directories and a few other names, none a link (a Triton root with a stray file, a FIFO):
    subdirs and dirs_and_links give the directories alone, listed or kept alike; links gives none."""
    root = tmp_path / "c"
    root.mkdir()
    for name in ("b", "a", "z", "m"):
        (root / name).mkdir()
    (root / "a-file").write_text("x")
    os.mkfifo(root / "n-fifo")
    (root / "zz").write_text("")
    for listed in (True, True, False):  # the first save makes .kcache/ in it; the third is the kept listing
        settle()
        if not listed:
            no_listing(monkeypatch)
        kept = DirNames(root)
        names, linked = kept.dirs_and_links(str(root))
        assert names == sorted(names) and linked == frozenset()
        assert [n for n in names if not n.startswith(".")] == ["a", "b", "m", "z"]
        assert [n for n in kept.subdirs(str(root)) if not n.startswith(".")] == ["a", "b", "m", "z"]
        assert kept.links(str(root)) == []
        kept.save()


def test_a_listing_serves_the_same_command_again_unless_just_changed(root, monkeypatch):
    """Detection and then the scan ask for the same directory: one listing, when it had not changed for
    RACY_SECONDS; a directory changed within that time is listed each time it is asked about (a command
    that removes entries and lists again sees the removal)."""
    op = str(root / "ops/cuda_space_0/add")
    calls = []
    real = dirnames._read
    monkeypatch.setattr(dirnames, "_read", lambda fd: calls.append(fd) or real(fd))
    kept = DirNames(root)
    assert kept.subdirs(op) == ["abc0000000000001", "abd0000000000002", "b000000000000003"]
    assert kept.starting(op, "ab") and len(calls) == 1
    (root / "ops/cuda_space_0/add/abd0000000000002").rmdir()  # now changed less than RACY_SECONDS ago
    assert kept.subdirs(op) == ["abc0000000000001", "b000000000000003"]
    assert kept.subdirs(op) == ["abc0000000000001", "b000000000000003"] and len(calls) == 3


def test_detection_keeps_nothing_and_a_scan_keeps_the_root_for_the_next_command(tmp_path, fixture_copy,
                                                                                 monkeypatch):
    """layouts.detect of a directory writes nothing in it (it may be no cache); a scan of a Triton root
    keeps the root's listing, and the next command's detection and scan list the root no more."""
    from kcache_cli import layouts
    from kcache_cli.catalog.scan import scan_cache

    plain = tmp_path / "plain"
    (plain / ("K" * 52)).mkdir(parents=True)
    settle()
    layouts.detect(plain)
    assert not (plain / ".kcache").exists()
    src = fixture_copy("triton") / "cache"
    for _ in range(2):  # the first keeps the listing, and makes .kcache/ (the root changed): again
        settle()
        monkeypatch.setattr(dirnames, "_OF", {})
        first = scan_cache(src).entries
    monkeypatch.setattr(dirnames, "_OF", {})  # the next command
    listed = []
    real = dirnames._read
    monkeypatch.setattr(dirnames, "_read", lambda fd: listed.append(os.fstat(fd).st_ino) or real(fd))
    assert layouts.detect(src) == ("triton",)
    assert [e.relpath for e in scan_cache(src).entries] == [e.relpath for e in first]
    assert os.stat(src).st_ino not in listed


def test_an_unchanged_directory_is_answered_by_one_stat(root, monkeypatch):
    """A kept listing whose directory one stat still finds unchanged is served without opening it (a
    thousand Inductor graph shards: one call each, not three); a changed one is opened and listed."""
    op = root / "ops/cuda_space_0/add"
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002"]
    from kcache_cli.fs import read as fsread

    opened = []
    real_open = fsread.open_path
    monkeypatch.setattr(fsread, "open_path", lambda path, *a: opened.append(os.fspath(path)) or real_open(path, *a))
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002"]
    assert opened == []
    (op / "abe0000000000004").mkdir()
    assert lookup(root, "ab") == ["abc0000000000001", "abd0000000000002", "abe0000000000004"]
    assert opened == [str(op)]


def test_kept_listings_come_back_whole_from_a_file_of_many(tmp_path):
    """Many directories in one file, each listing found in place: names with every byte but NUL and "/"
    (spaces, newlines, non-UTF-8), an empty directory, a link; each served equal to a fresh listing."""
    root = tmp_path / "cache"
    dirs = {f"d{i}": [f"n{i}-{j}" for j in range(i)] for i in range(6)}
    dirs["odd"] = ["a b", "new\nline", os.fsdecode(b"\xff\xfe"), "é", "x" * 200]
    for d, names_in in dirs.items():
        (root / d).mkdir(parents=True)
        for n in names_in:
            (root / d / n).mkdir()
    os.symlink("d1", root / "odd" / "link")
    settle()
    first = DirNames(root)
    fresh = {d: (first.subdirs(str(root / d)), first.links(str(root / d))) for d in dirs}
    first.save()
    data = dirnames._parse(names_file(root).read_bytes())
    assert set(data) >= set(dirs)
    kept = DirNames(root)
    assert {d: (kept.subdirs(str(root / d)), kept.links(str(root / d))) for d in dirs} == fresh
    assert fresh["odd"] == (sorted(dirs["odd"]), ["link"])
    assert sorted(kept.starting(str(root / "d5"), "n5-")) == sorted(dirs["d5"])
    assert kept.starting(str(root / "d0"), "n") == []
