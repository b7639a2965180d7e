"""kcache_cli.fs.tarstream against Python's tarfile, both ways: what kcache writes, tarfile reads the same;
what tarfile writes (ustar, pax), kcache reads the same; what kcache never writes, it refuses."""

from __future__ import annotations

import io
import tarfile

import pytest

from kcache_cli.fs import tarstream as ts

# name, kind, data or link target: short, long (ustar prefix), longer (pax path), non-ASCII, long link
MEMBERS = [
    ("e", "dir", None),
    ("e/lib.so", "file", b"\x7fELF" + bytes(range(256)) * 5),
    ("e/empty", "file", b""),
    ("e/" + "d" * 120 + "/f.txt", "file", b"under a ustar prefix\n"),
    ("e/" + "x" * 300, "file", b"a pax path\n"),
    ("e/caf\u00e9/n\u00e4me.cu", "file", b"// utf-8 name\n"),
    ("e/programs/0", "symlink", "../../../../programs/0123456789ab"),
    ("e/long-link", "symlink", "../" * 40 + "target"),
    ("e/block", "file", bytes(512)),
]


def _kcache_tar(compression: str = "tar") -> bytes:
    out = io.BytesIO()
    w = ts.FrameWriter(out, compression)
    for name, kind, data in MEMBERS:
        if kind == "dir":
            w.write(ts.dir_header(name, 1_700_000_000))
        elif kind == "symlink":
            w.write(ts.symlink_header(name, data, 1_700_000_000))
        else:
            w.write(ts.file_header(name, len(data), 0o755 if name.endswith(".so") else 0o644, 1_700_000_000))
            w.write(data + ts.padding(len(data)))
    w.write(ts.END_OF_ARCHIVE)
    w.close()
    return out.getvalue()


@pytest.mark.parametrize("compression,mode", [("tar", "r:"), ("gz", "r:gz"), ("zst", None)])
def test_tarfile_reads_what_kcache_writes(compression, mode):
    raw = _kcache_tar(compression)
    if mode is None:  # tarfile has no zstd before Python 3.14: decompress first
        import zstandard

        raw, mode = zstandard.ZstdDecompressor().decompressobj().decompress(raw), "r:"
    with tarfile.open(fileobj=io.BytesIO(raw), mode=mode) as tf:
        got = [(m.name, m.type, m) for m in tf.getmembers()]
        assert [n for n, _, _ in got] == [n for n, _, _ in MEMBERS]
        for (_name, kind, data), (_, _, m) in zip(MEMBERS, got):
            assert m.mtime == 1_700_000_000
            if kind == "dir":
                assert m.isdir()
            elif kind == "symlink":
                assert m.issym() and m.linkname == data
            else:
                assert m.isfile() and tf.extractfile(m).read() == data
    assert _members(_kcache_tar(compression), compressed=True) == _expected()


def _expected() -> list[tuple[str, str, bytes | str | None]]:
    return [(n, {"dir": ts.DIRECTORY, "file": ts.REGULAR, "symlink": ts.SYMLINK}[k], d) for n, k, d in MEMBERS]


def _members(raw: bytes, compressed: bool = False) -> list[tuple[str, str, bytes | str | None]]:
    src = ts.open_source(io.BytesIO(raw), threaded=False)[0] if compressed else io.BytesIO(raw)
    reader = ts.TarReader(src)
    out = []
    while (m := reader.next()) is not None:
        if m.type == ts.REGULAR:
            small = reader.small_data(m)
            out.append((m.name, m.type, small if small is not None else b"".join(reader.data(m))))
        else:
            out.append((m.name, m.type, m.linkname or None))
    return out


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("compression", ["", "gz"])
def test_kcache_reads_what_tarfile_writes(fmt, compression):
    members = MEMBERS if fmt == tarfile.PAX_FORMAT else [m for m in MEMBERS if len(m[0]) < 250 and m[0].isascii()
                                                         and len(m[2] or "") < 100]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}", format=fmt) as tf:
        for name, kind, data in members:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1_700_000_000
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    want = [(n, {"dir": ts.DIRECTORY, "file": ts.REGULAR, "symlink": ts.SYMLINK}[k], d) for n, k, d in members]
    assert _members(buf.getvalue(), compressed=True) == want


def test_sizes_past_8gib_go_in_a_pax_header_tarfile_reads():
    head = ts.file_header("big.bin", 9 << 30, 0o644, 0)
    assert len(head) > ts.BLOCK  # a pax header, then the ustar block
    info = tarfile.TarInfo.frombuf(head[-ts.BLOCK:], "utf-8", "surrogateescape")
    assert info.name == "big.bin" and info.size == 0  # the real size is the pax record's
    reader = ts.TarReader(io.BytesIO(head))
    assert reader.next().size == 9 << 30


@pytest.mark.parametrize("name", ["e", "e/", "e/lib.so", "a/" * 49 + "b", "a" * 101, "d" * 120 + "/f", "caf\u00e9"])
@pytest.mark.parametrize("mode,mtime", [(0o644, 1_700_000_000.7), (0o100755, 0), (0o4755, -5), (0o600, 1e13)])
def test_the_one_step_headers_are_the_general_ones(name, mode, mtime):
    """file_header and dir_header build short ASCII names in one step (their fields cached): byte for
    byte what `header` builds, whatever the name, mode, size and time."""
    for size in (0, 7, 1 << 33):
        assert ts.file_header(name, size, mode, mtime) == ts.header(name, b"0", size, mode, int(mtime))
    assert ts.dir_header(name, mtime) == ts.header(name.rstrip("/") + "/", b"5", 0, 0o755, int(mtime))


@pytest.mark.parametrize("what,make", [
    ("GNU long name record", lambda tf: tf.addfile(_named("g/" + "n" * 150, 3), io.BytesIO(b"abc"))),
    ("global pax header", None),
])
def test_what_kcache_never_writes_comes_back_as_an_unknown_member(what, make):
    buf = io.BytesIO()
    if make is not None:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
            make(tf)
    else:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "x"}) as tf:
            tf.addfile(_named("a", 1), io.BytesIO(b"a"))
    first = ts.TarReader(io.BytesIO(buf.getvalue())).next()
    assert first is not None and first.type == what


def _named(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    return ti


def test_base256_numbers_are_refused():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        ti = _named("a", 1)
        ti.mtime = 8 ** 12  # too big for octal: GNU writes base-256
        tf.addfile(ti, io.BytesIO(b"a"))
    with pytest.raises(ts.TarFormatError):
        ts.TarReader(io.BytesIO(buf.getvalue())).next()
