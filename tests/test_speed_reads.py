"""The scan's cheaper reads (issue 15) keep fsread's rules: an entry's files read through its EntryDir (one
fd of its directory, opened from the anchored root) are refused or read exactly as by path."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from kcache_cli.formats.taskfile import sha256_hex
from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.model import checks


@pytest.fixture
def entry(tmp_path):
    root = tmp_path / "cache"
    d = root / "ops" / "s" / "op" / "abc"
    d.mkdir(parents=True)
    (d / "task.txt").write_bytes(b"Task(name: add)")
    (d / "lib.so").write_bytes(b"\x7fELF" + bytes(60))
    (tmp_path / "outside.txt").write_bytes(b"secret")
    os.symlink(tmp_path / "outside.txt", d / "link.txt")
    fsread.anchor(root)
    return root, str(d)


def test_entrydir_reads_equal_plain_reads_and_refuse_links(entry):
    root, d = entry
    plain = fsread.read_bytes(f"{d}/task.txt", 1 << 20, base=d)
    with EntryDir.open(d, fsread.anchor(root)) as held:
        assert held.fd is not None and not held.swapped
        assert held.read_bytes("task.txt", 1 << 20) == plain == b"Task(name: add)"
        assert held.read_head("lib.so", 4) == b"\x7fELF"
        with pytest.raises(fsread.NotRegularFile):
            held.read_bytes("link.txt", 1 << 20)
        assert held.read_bytes("link.txt", 1 << 20, follow=True) == b"secret"  # only where asked to follow
        with pytest.raises(fsread.TooLarge):
            held.read_bytes("task.txt", 4)
        assert held.unreadable("task.txt") is None == checks.unreadable(f"{d}/task.txt")
        sizes, _ = held.files()
        assert sizes == {"task.txt": 15, "lib.so": 64, "link.txt": os.lstat(f"{d}/link.txt").st_size}
        assert set(held.listing) == set(sizes)  # the lstats a read then skips its own stat by
    assert held.fd is None  # closed on exit


def test_a_listed_file_read_the_short_way_is_what_the_careful_way_reads(entry, monkeypatch):
    """EntryDir.read_bytes of a file as listed (fsread.read_listed): the same bytes, the same refusals;
    one changed or swapped since the listing is read the careful way, as it is now."""
    root, d = entry
    careful: list[str] = []
    real_open = EntryDir.open_file

    def open_file(self, name, **kw):
        careful.append(name)
        return real_open(self, name, **kw)

    monkeypatch.setattr(EntryDir, "open_file", open_file)
    with EntryDir.open(d, fsread.anchor(root)) as held:
        held.files()  # listed
        assert held.read_bytes("task.txt", 1 << 20) == b"Task(name: add)" and careful == []
        assert held.read_bytes("lib.so", 4, strict=False) == b"\x7fELF" and careful == []  # its head
        with pytest.raises(fsread.TooLarge):
            held.read_bytes("task.txt", 4)
        with pytest.raises(fsread.NotRegularFile):
            held.read_bytes("link.txt", 1 << 20)
        careful.clear()
        with open(f"{d}/task.txt", "ab") as f:  # grown since the listing
            f.write(b" more")
        assert held.read_bytes("task.txt", 1 << 20) == b"Task(name: add) more" and careful == ["task.txt"]
        os.rename(f"{d}/lib.so", f"{d}/old.so")
        os.mkfifo(f"{d}/lib.so")  # swapped for a FIFO: never opened for reading, never blocks
        with pytest.raises(fsread.NotRegularFile):
            held.read_bytes("lib.so", 4, strict=False)


def test_entrydir_subdirectory_follows_no_link(entry, tmp_path):
    root, d = entry
    os.mkdir(f"{d}/kernels")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "meta.json").write_text("{}")
    os.symlink(tmp_path / "outside", f"{d}/kernels/0")
    with EntryDir.open(d, fsread.anchor(root)) as held:
        with held.sub("kernels/0") as sub:
            assert sub.fd is None
            with pytest.raises(fsread.NotRegularFile):
                sub.read_bytes("meta.json", 100)
        with pytest.raises(fsread.NotRegularFile):
            held.read_bytes("kernels/0/meta.json", 100)
        with pytest.raises(fsread.NotRegularFile):
            held.read_bytes("../abc/task.txt", 100)


def test_nothing_held_through_a_linked_directory_below_the_root(entry, tmp_path):
    root, d = entry
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "abc").mkdir(parents=True)
    (elsewhere / "abc" / "task.txt").write_bytes(b"not the cache's")
    os.symlink(elsewhere, root / "ops" / "s" / "linked")
    linked = str(root / "ops" / "s" / "linked" / "abc")
    anchor = fsread.anchor(root)
    with EntryDir.open(linked, anchor) as held:
        assert held.fd is None and held.swapped  # the judgement concludes nothing
        with pytest.raises(fsread.NotRegularFile):
            held.read_bytes("task.txt", 1 << 20)
    with pytest.raises(fsread.NotRegularFile):
        fsread.read_bytes(f"{linked}/task.txt", 1 << 20, base=linked)


def test_a_file_that_grew_after_its_fstat_is_still_read_to_the_end(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 10)
    fd = os.open(p, os.O_RDONLY)
    try:
        with open(p, "ab") as f:
            f.write(b"y" * 10)
        assert fsread._read_fd(fd, 100, size=10) == b"x" * 10 + b"y" * 10
    finally:
        os.close(fd)


def test_sha256_found_once_is_sha256():
    for data in (b"", b"abc", os.urandom(1000)):
        assert sha256_hex(data) == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("flags", [fsread.DIR_FLAGS, fsread.FILE_FLAGS])
def test_one_name_opened_without_openat2_refuses_what_openat2_refuses(tmp_path, flags):
    """openat2 under RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH of one plain name is a plain openat with
    O_NOFOLLOW: every name opens, or is refused as a link, alike (the kernel's own openat2 is the judge)."""
    call = fsread._load_openat2()
    if not call:
        pytest.skip("this kernel has no openat2 to compare with")
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    for name, target in (("to_d", "d"), ("to_f", "f"), ("to_abs", "/etc"), ("dangling", "nowhere"), ("up", "..")):
        os.symlink(target, tmp_path / name)
    rules = fsread.RESOLVE_NO_SYMLINKS | fsread.RESOLVE_BENEATH
    dfd = os.open(tmp_path, fsread.DIR_FLAGS)

    def outcome(opener, name):
        try:
            os.close(opener(dfd, name, flags | os.O_NONBLOCK, rules))
            return "opened"
        except OSError as exc:
            return "refused" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else errno.errorcode[exc.errno]

    try:
        for name in ("d", "f", "fifo", "to_d", "to_f", "to_abs", "dangling", "up", "missing"):
            assert outcome(fsread.openat2, name) == outcome(call, name), name
        assert outcome(fsread.openat2, "to_d") == "refused" and outcome(fsread.openat2, "d") == "opened"
        assert outcome(fsread.openat2, "..") == outcome(call, "..") == "EXDEV"  # not one plain name: openat2's
    finally:
        os.close(dfd)


def test_the_first_paths_walked_refuse_what_openat2_refuses(tmp_path, monkeypatch):
    """A process's first WALKS_BEFORE_OPENAT2 paths of several components are walked by the caller, one
    O_NOFOLLOW openat per component, without loading ctypes: each caller (the anchor, an entry's
    directory, the writer) opens or refuses every path as it does through openat2 once loaded."""
    if not fsread._load_openat2():
        pytest.skip("this kernel has no openat2 to compare with")
    from kcache_cli.fs import write as fswrite

    root = tmp_path / "root"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    os.symlink("b", root / "a" / "to_b")
    os.symlink(str(tmp_path), root / "a" / "out")
    paths = ("a/b", "a/b/c", "a/to_b/c", "a/out/root", "a/f/x", "a/missing/c", "a/to_b")

    def outcomes() -> list[str]:
        got = []
        with fsread.Anchor(root) as anchor:
            d = EntryDir(str(root / "a"), os.open(root / "a", fsread.DIR_FLAGS), anchor)
            for rel in paths:
                for opener in (lambda r: anchor.open_dir(anchor.key + r),
                               lambda r: fswrite.open_dir(anchor.fd, r),
                               lambda r: d.sub(r[2:]).fd if r.startswith("a/") else None):
                    try:
                        fd = opener(rel)
                        got.append("opened" if fd is not None else "refused")
                        if fd is not None:
                            os.close(fd)
                    except OSError as exc:  # a link or a file on the way: refused, however it is said
                        refused = exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV, None)
                        got.append("refused" if refused else errno.errorcode[exc.errno])
            d.close()
        return got

    loaded = outcomes()
    monkeypatch.setattr(fsread, "_openat2", None)
    monkeypatch.setattr(fsread, "_walks", 0)
    walked = outcomes()
    assert fsread._openat2 is None  # every path was walked: ctypes was never loaded
    assert walked == loaded
    assert loaded.count("opened") == 6  # a/b and a/b/c by all three callers; every other path refused
    with fsread.Anchor(root) as anchor:  # ".." is refused by a walk, even where openat2 would stay beneath
        with pytest.raises(OSError):
            anchor.open_dir(anchor.key + "a/b/../b")


@pytest.mark.parametrize("rules", [fsread.RESOLVE_NO_SYMLINKS | fsread.RESOLVE_BENEATH,
                                   fsread.RESOLVE_NO_XDEV | fsread.RESOLVE_NO_SYMLINKS])
def test_a_name_with_a_nul_opens_nothing(tmp_path, rules):
    """As a C string "d\\0x" is "d": openat2 through ctypes would open d. It is refused instead, one
    plain name or not."""
    (tmp_path / "d").mkdir()
    dfd = os.open(tmp_path, fsread.DIR_FLAGS)
    try:
        for name in ("d\0x", "d/\0", "\0"):
            with pytest.raises(OSError) as got:
                fsread.openat2(dfd, name, fsread.DIR_FLAGS, rules)
            assert got.value.errno == errno.EINVAL
    finally:
        os.close(dfd)


def test_a_read_takes_the_whole_file_whatever_its_size(tmp_path):
    """The one-read path for a small file, a file that grew or shrank since its fstat, and one longer than
    a chunk all read exactly its bytes now (fsread._read_fd)."""
    for size in (0, 1, 300, fsread.CHUNK - 1, fsread.CHUNK, fsread.CHUNK + 1, 3 * fsread.CHUNK + 7):
        data = os.urandom(size)
        (tmp_path / "f").write_bytes(data)
        assert fsread.read_bytes(str(tmp_path / "f"), 1 << 30) == data
        fd = os.open(tmp_path / "f", os.O_RDONLY)
        try:
            assert fsread._read_fd(fd, 1 << 30, max(size - 5, 0)) == data  # grew since a stat saw it smaller
        finally:
            os.close(fd)
        fd = os.open(tmp_path / "f", os.O_RDONLY)
        try:
            assert fsread._read_fd(fd, 1 << 30, size + 50) == data  # shrank since
            os.lseek(fd, 0, os.SEEK_SET)
            assert fsread._read_fd(fd, 10, size) == data[:10]  # a limit below the size
        finally:
            os.close(fd)
    r, w = os.pipe()  # a short read before the end (a pipe delivers what is written so far)
    os.write(w, b"abc")
    pid = os.fork()
    if pid == 0:
        import time

        time.sleep(0.2)
        os.write(w, b"defgh")
        os._exit(0)
    os.close(w)
    try:
        assert fsread._read_fd(r, 100, 8) == b"abcdefgh"
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_a_shared_walk_answers_as_the_file_system_did(tmp_path, monkeypatch):
    """A tree walked once (walk_tree) answers its directories' listings and lstats from the walk, as listing
    them then would: a name it did not see is not there, a link is no directory; a name through `..` still
    goes to the file system (refused), and a directory outside the tree (a sibling sharing its name's
    start) shares nothing. The usage is measure_tree's, the key every name beneath it."""
    import stat

    from kcache_cli.layouts._common import walk_tree
    from kcache_cli.model.records import measure_tree

    root = tmp_path / "cache"
    unit = root / "u"
    (unit / "a" / "b").mkdir(parents=True)
    (unit / "a" / "b" / "f").write_bytes(b"x" * 5000)
    (unit / "top").write_bytes(b"t")
    os.symlink("a", unit / "link")
    os.mkfifo(unit / "a" / "fifo")
    (root / "u-x").mkdir()
    anchor = fsread.anchor(root)
    warned: list[str] = []
    with EntryDir.open(str(unit), anchor) as d:
        usage, key = walk_tree(d, warned.append, True)
        assert usage == measure_tree(str(unit), warned.append) and not warned
        assert key is not None and [n for n, _ in key[1]] == ["a", "a/b", "a/b/f", "a/fifo", "link", "top"]
        listed: list[object] = []
        monkeypatch.setattr(os, "scandir", lambda *a: listed.append(a))  # nothing may list again
        assert d.subdirs() == ["a"] and sorted(d.names()) == ["a", "link", "top"]
        assert stat.S_ISLNK(d.lstat("link").st_mode) and d.lstat("a/b/f").st_size == 5000
        (unit / "a" / "b" / "g").write_bytes(b"")  # after the walk: not in it
        with d.sub("a") as a:
            assert a.subdirs() == ["b"] and list(a.files()[0]) == ["fifo"]
            with pytest.raises(FileNotFoundError):
                a.lstat("b/g")
            with a.sub("b") as b:
                assert b.read_bytes("f", 1 << 20) == b"x" * 5000 and b.walked() is not None
        assert listed == []
        with pytest.raises(OSError, match="outside its entry"):
            d.lstat("a/../top")
        with d.sub("link") as linked:
            assert linked.fd is None and linked.walk is None
        with EntryDir.open(str(root / "u-x"), anchor) as sibling:
            sibling.share_walk(d.walk)
            assert sibling.walk is None


def test_a_walk_stops_where_measure_tree_stops(tmp_path):
    """A tree nested deeper than MAX_TREE_DEPTH: walk_tree counts what measure_tree counts (nothing below
    the limit), warns as it does, once, and makes no index key of it (not stored: it was not read whole)."""
    from kcache_cli.layouts._common import walk_tree
    from kcache_cli.model.records import measure_tree

    root = tmp_path / "cache"
    unit = root / "u"
    deep = unit.joinpath(*(["d"] * (fsread.MAX_TREE_DEPTH + 2)))
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"below the limit")
    (unit / "top").write_bytes(b"t")
    walked: list[str] = []
    measured: list[str] = []
    with EntryDir.open(str(unit), fsread.anchor(root)) as d:
        usage, key = walk_tree(d, walked.append, True)
    assert usage == measure_tree(str(unit), measured.append) and usage.files == 1
    assert walked == measured and len(walked) == 1 and "nested more than" in walked[0]
    assert key is None
