"""The scan's cheaper reads (issue 15) keep fsread's rules: an entry's files read through one held fd of
its directory are refused or read exactly as without it."""

from __future__ import annotations

import hashlib
import os

import pytest

from kcache_cli import checks, fsread
from kcache_cli.taskfile import sha256_hex


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


def test_held_reads_equal_plain_reads_and_refuse_links(entry):
    root, d = entry
    plain = fsread.read_bytes(f"{d}/task.txt", 1 << 20, base=d)
    with fsread.held(d):
        assert fsread.held_fd(d) is not None
        assert fsread.read_bytes(f"{d}/task.txt", 1 << 20, base=d) == plain == b"Task(name: add)"
        assert fsread.read_head(f"{d}/lib.so", 4) == b"\x7fELF"
        with pytest.raises(fsread.NotRegularFile):
            fsread.read_bytes(f"{d}/link.txt", 1 << 20, base=d)
        with pytest.raises(fsread.TooLarge):
            fsread.read_bytes(f"{d}/task.txt", 4, base=d)
        assert checks.unreadable(f"{d}/task.txt") is None
        with fsread.held(d):  # re-entrant: the inner exit keeps the outer hold
            pass
        assert fsread.held_fd(d) is not None
    assert fsread.held_fd(d) is None


def test_nothing_held_through_a_linked_directory_below_the_root(entry, tmp_path):
    root, d = entry
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "abc").mkdir(parents=True)
    (elsewhere / "abc" / "task.txt").write_bytes(b"not the cache's")
    os.symlink(elsewhere, root / "ops" / "s" / "linked")
    linked = str(root / "ops" / "s" / "linked" / "abc")
    with fsread.held(linked):
        assert fsread.held_fd(linked) is None
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
