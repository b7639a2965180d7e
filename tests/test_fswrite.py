"""kcache_cli/fs/write.py: writes through held directory descriptors, never through a link."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from kcache_cli.fs import state
from kcache_cli.fs import write as fswrite


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    fd = fswrite.open_root(r)
    yield r, fd
    os.close(fd)


def victim(tmp_path):
    v = tmp_path / "victim"
    v.mkdir()
    (v / "keep").write_text("mine")
    return v


def test_open_dir_refuses_a_link_anywhere_and_dotdot(root, tmp_path):
    r, fd = root
    v = victim(tmp_path)
    (r / "a").mkdir()
    (r / "a" / "b").symlink_to(v)
    for rel in ("a/b", "a/b/c"):
        with pytest.raises(OSError) as exc:
            fswrite.open_dir(fd, rel, create=True)
        assert exc.value.errno in (errno.ELOOP, errno.ENOENT)
    with pytest.raises(OSError):
        fswrite.open_dir(fd, "a/../..")
    assert sorted(os.listdir(v)) == ["keep"]
    made = fswrite.open_dir(fd, "x/y/z", create=True)
    os.close(made)
    assert (r / "x/y/z").is_dir()


def test_create_never_follows_nor_replaces(root, tmp_path):
    r, fd = root
    v = victim(tmp_path)
    (r / "link").symlink_to(v / "new")
    with pytest.raises(FileExistsError):
        fswrite.write_file(fd, "link", b"x")
    fswrite.write_file(fd, "f", [b"a", b"b"])
    with pytest.raises(FileExistsError):
        fswrite.write_file(fd, "f", b"c")
    assert (r / "f").read_bytes() == b"ab" and not (v / "new").exists()


def test_replace_file_replaces_a_link_not_its_target(root, tmp_path):
    r, fd = root
    v = victim(tmp_path)
    (r / "memo").symlink_to(v / "keep")
    fswrite.replace_file(fd, "memo", b"new")
    assert (v / "keep").read_text() == "mine"
    assert not (r / "memo").is_symlink() and (r / "memo").read_bytes() == b"new"
    assert [n for n in os.listdir(r) if n.startswith(".tmp-")] == []


@pytest.mark.parametrize("planted", ["link-to-missing", "link-to-file", "hard-link", "fifo"])
def test_touch_at_never_creates_or_retimes_outside(root, tmp_path, planted):
    r, fd = root
    v = victim(tmp_path)
    before = os.stat(v / "keep").st_mtime_ns
    if planted == "link-to-missing":
        (r / "stamp").symlink_to(v / "nologin")
    elif planted == "link-to-file":
        (r / "stamp").symlink_to(v / "keep")
    elif planted == "hard-link":
        os.link(v / "keep", r / "stamp")
    else:
        os.mkfifo(r / "stamp")
    fswrite.touch_at(fd, "stamp", (5_000_000_000, 5_000_000_000))
    st = os.lstat(r / "stamp")
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_mtime_ns == 5_000_000_000
    assert not (v / "nologin").exists() and os.stat(v / "keep").st_mtime_ns == before


def test_touch_at_retimes_its_own_stamp_in_place(root):
    r, fd = root
    (r / "stamp").write_text("")
    ino = os.stat(r / "stamp").st_ino
    fswrite.touch_at(fd, "stamp", (7_000_000_000, 7_000_000_000))
    st = os.stat(r / "stamp")
    assert st.st_ino == ino and st.st_mtime_ns == 7_000_000_000


def test_renames(root):
    r, fd = root
    (r / "a").mkdir()
    (r / "b").mkdir()
    (r / "a" / "in-a").write_text("")
    with pytest.raises(FileExistsError):
        fswrite.rename_noreplace_at(fd, "a", fd, "b")  # a plain rename would replace the empty b
    assert (r / "a" / "in-a").exists() and not any((r / "b").iterdir())  # neither moved


def test_a_name_with_a_nul_renames_nothing(root):
    """As a C string "a\\0x" is "a": renameat2 through ctypes would move a. It is refused instead."""
    r, fd = root
    (r / "a").mkdir()
    for src, dst in (("a\0x", "b"), ("a", "b\0x")):
        with pytest.raises((OSError, ValueError)):
            fswrite.rename_noreplace_at(fd, src, fd, dst)
        with pytest.raises(OSError) as got:
            fswrite.renameat2(fd, src, fd, dst, 0)
        assert got.value.errno == errno.EINVAL
    assert (r / "a").is_dir() and not (r / "b").exists()


def test_copy_tree_at_copies_files_and_links(root):
    r, fd = root
    (r / "src/sub").mkdir(parents=True)
    (r / "src/sub/f").write_bytes(b"data")
    (r / "src/l").symlink_to("sub/f")
    fswrite.copy_tree_at(fd, "src", fd, "dst")
    assert (r / "dst/sub/f").read_bytes() == b"data" and os.readlink(r / "dst/l") == "sub/f"


def test_owner_rules(tmp_path, monkeypatch):
    st = os.stat(tmp_path)
    assert fswrite.owner_problem(st, "d") is None  # this user's
    fake = os.stat_result((stat.S_IFDIR | 0o2775, 0, 0, 0, 12345, 777, 0, 0, 0, 0))
    assert "uid 12345" in fswrite.owner_problem(fake, "d")
    assert fswrite.owner_problem(fake, "d", group=777) is None  # group-shared with the cache's group
    assert fswrite.owner_problem(fake, "d", group=778) is not None
    nosgid = os.stat_result((stat.S_IFDIR | 0o775, 0, 0, 0, 12345, 777, 0, 0, 0, 0))
    assert fswrite.owner_problem(nosgid, "d", group=777) is not None


def test_state_dir_opt_in(tmp_path, monkeypatch):
    monkeypatch.setenv(state.SAFE_ENV, f"/elsewhere:{tmp_path}")
    assert state.trusted_root(tmp_path)
    monkeypatch.setenv(state.SAFE_ENV, "/elsewhere")
    assert not state.trusted_root(tmp_path)
    monkeypatch.setenv(state.SAFE_ENV, "*")
    assert state.trusted_root(tmp_path)


def test_open_state_refuses_a_linked_state_dir(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    (r / ".kcache").symlink_to(victim(tmp_path))
    fd = fswrite.open_root(r)
    try:
        with pytest.raises(OSError) as exc:
            state.open_state(fd, r, "used", create=True)
        assert exc.value.filename == os.path.join(r, ".kcache")
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path / "victim")) == ["keep"]
