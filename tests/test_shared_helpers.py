"""The helpers that replaced twins: each one serves every former copy the same way."""

from __future__ import annotations

import errno
import os

import pytest

from kcache_cli.cli import common
from kcache_cli.fs import locking
from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.util import parallel


def test_fstat_regular_closes_and_refuses_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    fd = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    with pytest.raises(OSError, match="refused"):
        fsread.fstat_regular(fd, lambda st: OSError(errno.EINVAL, "refused"))
    with pytest.raises(OSError) as closed:
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF
    (tmp_path / "f").write_bytes(b"x")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert fsread.fstat_regular(fd, lambda st: OSError("never")).st_size == 1
    finally:
        os.close(fd)


def test_a_fifo_is_neither_a_lock_nor_a_file_to_read(tmp_path):
    os.mkfifo(tmp_path / "x.lock")
    with pytest.raises(locking.NotALockFile):
        locking.open_lock(tmp_path / "x.lock")
    with pytest.raises(fsread.NotRegularFile):
        fsread.open_regular(str(tmp_path / "x.lock"))


def test_listings(tmp_path):
    tmp_path = tmp_path / "d"  # (tmp_path holds the tests' HOME)
    tmp_path.mkdir()
    for name in ("b", "a", "c"):
        (tmp_path / name).mkdir()
    (tmp_path / "f").write_text("")
    (tmp_path / "l").symlink_to("a")
    assert fsread.subdir_paths(str(tmp_path)) == [str(tmp_path / n) for n in ("a", "b", "c")]
    assert sorted(fsread.names(str(tmp_path))) == ["a", "b", "c", "f", "l"]
    assert [d.name for d in fsread.sorted_entries(tmp_path)] == ["a", "b", "c", "f", "l"]
    assert [d.name for d in fsread.sorted_entries(tmp_path, lambda d: d.name > "b")] == ["c", "f", "l"]
    gone = str(tmp_path / "gone")
    assert fsread.subdir_paths(gone) == [] and fsread.names(gone) == [] and fsread.sorted_entries(gone) == []
    with pytest.raises(NotADirectoryError):
        fsread.sorted_entries(tmp_path / "f")


def test_replace_file_via_dir(tmp_path):
    tmp_path = tmp_path / "d"
    tmp_path.mkdir()
    (tmp_path / "g.json").write_text("old")
    (tmp_path / "target").write_text("kept")
    os.symlink("target", tmp_path / "link")
    fd = fswrite.open_root(tmp_path)
    try:
        fswrite.replace_file_via_dir(fd, "g.json", b"new", "tmp.pid_")
        fswrite.replace_file_via_dir(fd, "link", b"over", "tmp.pid_")  # the link is replaced, not written through
    finally:
        os.close(fd)
    assert (tmp_path / "g.json").read_text() == "new" and (tmp_path / "link").read_text() == "over"
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "target").read_text() == "kept"
    assert sorted(os.listdir(tmp_path)) == ["g.json", "link", "target"]  # no temp directory left


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_split(n):
    items = list(range(10))
    parts = parallel.split(items, n)
    assert len(parts) == n and sum(parts, []) == items and max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("n, block", [(0, 4), (1, 1), (23, 1), (23, 3), (23, 256), (5000, 2)])
def test_claims_hand_out_every_block_once(n, block):
    """Claims: every block's start taken once, in order from one process; more than MAX_BLOCKS blocks
    are made bigger (their starts must fit in the pipe unread); the shares a forkserver's workers get
    (pickled) deal the same blocks between them."""
    import pickle

    claims = parallel.Claims(n, block)
    try:
        share = claims.share(0, 1)
        got = list(iter(share.take, None))
    finally:
        claims.close()
    assert claims.block >= block and len(got) <= parallel.Claims.MAX_BLOCKS
    assert got == list(range(0, n, claims.block))
    claims = parallel.Claims(n, block)
    claims.close()
    shares = [pickle.loads(pickle.dumps(claims.share(i, 3))) for i in range(3)]
    dealt = [list(iter(s.take, None)) for s in shares]
    assert sorted(sum(dealt, [])) == got and dealt[1][:1] == got[1:2]


@pytest.mark.parametrize("line, kind", [
    ('source.cu(3): error: identifier "x" is undefined', "error"),
    ("1 error detected in the compilation of source.cu", "error"),
    ("cc1plus: fatal error: x.h: No such file", "error"),
    ("Error: compilation failed", "error"),
    ("make: *** [all] Error 1", "error"),
    ("source.cu(1): warning #177-D: unused", "warning"),
    ("compiled with no errors", None),
    ("elapsed time: 0.5 seconds", None),
])
def test_one_error_and_warning_classifier(line, kind):
    """`kcache build`'s failure output and `kcache log` colour the same lines."""
    from kcache_cli.cli.cmd_read import _log_line

    assert common.line_kind(line) == kind
    shown = _log_line(line, lambda s: s)
    assert shown.startswith({"error": "[bold red]", "warning": "[yellow]", None: line}[kind])
