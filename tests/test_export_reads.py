"""Export reads each file of an entry once and judges the bytes it read (EntryDir.held): the bytes a
judgement takes from the caller are those of the very file it lists (same inode, size and mtime), and
a file replaced since is read again."""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

import pytest
from test_index import RACY, counting_judge

from kcache_cli import archive
from kcache_cli.catalog.scan import scan_cache as real_scan
from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts import hidet
from kcache_cli.model.records import ScanFilter
from kcache_cli.ops.verify import not_judged


def _held_dir(tmp_path: Path, data: bytes = b"0123456789") -> tuple[EntryDir, Path]:
    d = tmp_path / "entry"
    (d / "sub").mkdir(parents=True)
    for p in (d / "f", d / "sub" / "g"):
        p.write_bytes(data)
    ed = EntryDir.open(d)
    ed.held = {}
    for name in ("f", "sub/g"):
        st = os.lstat(d / name)
        ed.held[name] = (st.st_ino, st.st_size, st.st_mtime_ns, data)
    return ed, d


def _rewrite_keeping_identity(path: Path, data: bytes) -> None:
    """New bytes of the same length in the same inode, its mtime put back: only the bytes differ."""
    st = os.lstat(path)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_held_bytes_are_read_for_the_same_file(tmp_path):
    ed, d = _held_dir(tmp_path)
    with ed:
        _rewrite_keeping_identity(d / "f", b"ABCDEFGHIJ")
        _rewrite_keeping_identity(d / "sub" / "g", b"ABCDEFGHIJ")
        assert ed.read_bytes("f", 100) == b"0123456789"  # what the caller read, not the disk's
        assert ed.read_bytes("f", 4, strict=False) == b"0123"
        assert b"".join(ed.iter_chunks("f", 3)) == b"0123456789"
        assert list(ed.iter_chunks("f", 3))[0] == b"012"
        assert ed.sub("sub").read_bytes("g", 100) == b"0123456789"
        with pytest.raises(fsread.TooLarge):
            ed.read_bytes("f", 4)  # strict: over the limit, as a read from disk says


def test_a_replaced_file_is_read_again(tmp_path):
    ed, d = _held_dir(tmp_path)
    with ed:
        (d / "new").write_bytes(b"ABCDEFGHIJ")
        os.replace(d / "new", d / "f")  # another inode: the held bytes are not its
        (d / "sub" / "g").write_bytes(b"longer than before")  # same inode, another size
        assert not ed.held_changed
        assert ed.read_bytes("f", 100) == b"ABCDEFGHIJ"
        assert ed.held_changed  # the caller's bytes are not the file's now
        assert ed.read_bytes("sub/g", 100) == b"longer than before"
        os.unlink(d / "f")
        os.symlink("sub/g", d / "f")  # a link now: never read through the held bytes
        with pytest.raises(OSError):
            ed.read_bytes("f", 100)


def test_followed_reads_never_take_held_bytes(tmp_path):
    ed, d = _held_dir(tmp_path)
    with ed:
        _rewrite_keeping_identity(d / "f", b"ABCDEFGHIJ")
        assert ed.read_bytes("f", 100, follow=True) == b"ABCDEFGHIJ"


def test_export_opens_each_file_once(fixture_copy, tmp_path, monkeypatch):
    """Before, a hidet entry's lib.so was opened three times (the judgement's header and whole read,
    then the archive's read); now once, and the archive still holds the same entries."""
    src = fixture_copy("hidet")
    plan = archive.plan_export(src, ScanFilter())
    assert plan.jobs
    opened: dict[str, int] = {}
    real_open = os.open

    def counting(path, flags, mode=0o777, *, dir_fd=None):
        name = os.path.basename(os.fsdecode(path))
        opened[name] = opened.get(name, 0) + 1
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", counting)
    result = archive.export_archive(plan, str(tmp_path / "a.tar"))
    monkeypatch.undo()
    assert result.entries
    judged = [e for e in plan.jobs if not_judged(e) is None]  # read before their judgement, shipped or not
    libs = sum(1 for e in judged if os.path.isfile(os.path.join(e.path, "lib.so")))
    assert libs and opened["lib.so"] == libs


def test_export_lists_unchanged_entries_from_the_index(fixture_copy, tmp_path, monkeypatch):
    """The plan's listing goes through the index as `ls` does: an unchanged cache is listed without a
    judgement, and the archive is the same as one planned by a real scan (every entry is still judged
    deeply when it is written)."""
    src = fixture_copy("hidet")
    time.sleep(RACY * 2)  # older than the index's racy window
    judged = counting_judge(monkeypatch, hidet, "_op_entry", lambda job: job[0])
    first = archive.plan_export(src, ScanFilter())
    assert len(judged) == len(first.jobs) == 5
    judged.clear()
    again = archive.plan_export(src, ScanFilter())
    assert judged == [] and again.jobs == first.jobs
    a = archive.export_archive(again, str(tmp_path / "a.tar"))
    monkeypatch.setattr(archive.export, "scan_cache", lambda *a, use_index=False, **k: real_scan(*a, **k))
    b = archive.export_archive(archive.plan_export(src, ScanFilter()), str(tmp_path / "b.tar"))
    assert a.entries == b.entries and a.entries


def _rewrite_after_read(monkeypatch, victim_path: str, name: str, data: bytes | None = None) -> None:
    """Between the export's read of the entry at `victim_path` and its judgement, `name` in it is replaced
    by a new inode (its own bytes again, or `data`)."""
    real = archive.export.judge_open

    def rewrite_first(entry, d, *a, **k):
        if entry.path == victim_path:
            path = os.path.join(entry.path, name)
            new = open(path, "rb").read() if data is None else data
            with open(path + ".new", "wb") as f:
                f.write(new)
            os.replace(path + ".new", path)  # a new inode: not the file the export read
        return real(entry, d, *a, **k)

    monkeypatch.setattr(archive.export, "judge_open", rewrite_first)


def test_an_entry_is_judged_from_the_listing_and_bytes_it_ships(fixture_copy, tmp_path, monkeypatch):
    """The status an archive records is that of the bytes it holds: the judgement goes by the listing
    and the bytes the export read (it lists nothing again), so a lib.so replaced by a truncated one after
    the read neither reaches the archive nor changes the verdict of the lib.so that does."""
    src = fixture_copy("hidet")
    plan = archive.plan_export(src, ScanFilter())
    victim = next(e for e in plan.jobs if not_judged(e) is None and os.path.isfile(os.path.join(e.path, "lib.so")))
    shipped = open(os.path.join(victim.path, "lib.so"), "rb").read()
    _rewrite_after_read(monkeypatch, victim.path, "lib.so", shipped[:100])
    result = archive.export_archive(plan, str(tmp_path / "a.tar"))
    done = {x.key.relpath: x for x in result.entries}
    assert victim.relpath in done and done[victim.relpath].status == "complete" and not result.left_out
    with tarfile.open(tmp_path / "a.tar") as tar:
        assert tar.extractfile(f"{victim.relpath}/lib.so").read() == shipped
    assert os.path.getsize(os.path.join(victim.path, "lib.so")) == 100  # the cache holds the truncated one now


def test_a_nested_file_rewritten_between_its_read_and_its_judgement_is_left_out(fixture_copy, tmp_path,
                                                                                 monkeypatch):
    """A file below the entry's own directory is looked up again by the judgement: one replaced since the
    read (a tilus program's module/lib.so, written again) means the verdict is of other bytes than those
    read for the archive, and the entry is skipped."""
    src = fixture_copy("tilus")
    plan = archive.plan_export(src, ScanFilter())
    victim = next(e for e in plan.jobs if os.path.isfile(os.path.join(e.path, "module", "lib.so")))
    _rewrite_after_read(monkeypatch, victim.path, "module/lib.so")
    result = archive.export_archive(plan, str(tmp_path / "a.tar"))
    left = {e.relpath: why for e, why in result.left_out}
    assert "changed while it was being read" in left[victim.relpath]
    assert victim.relpath not in {x.key.relpath for x in result.entries}
