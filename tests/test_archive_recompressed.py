"""An archive decompressed or compressed again on its way (`zstd -d`, `gzip`, `pzstd`, a store that keeps
tars) is still the one ordinary tar stream docs/archives.md promises: import reads it as one stream when the
manifest's parts no longer lie where it says, and checks every member against the manifest as always."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from test_archive import ls_json, tree


def _skippable(payload: bytes, nibble: int = 0) -> bytes:
    """A zstd skippable frame (RFC 8878 3.1.2): magic 0x184D2A5?, length, payload; decoders skip it."""
    return struct.pack("<II", 0x184D2A50 | nibble, len(payload)) + payload


def _tar_of(arc: Path) -> bytes:
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(arc.read_bytes()), read_across_frames=True) as r:
        return r.read()


def _pzstd_like(tar: bytes) -> bytes:
    """As pzstd writes: each zstd frame preceded by a skippable frame holding its compressed size."""
    out = b""
    for i in range(0, len(tar), 1 << 16):
        frame = zstandard.ZstdCompressor(level=3).compress(tar[i:i + (1 << 16)])
        out += _skippable(struct.pack("<I", len(frame)), 0xE) + frame
    return out


RECODED = {
    "decompressed": (".tar", lambda tar: tar),
    "gzip": (".tar.gz", lambda tar: gzip.compress(tar, mtime=0)),
    "zstd again, one frame": (".tar.zst", lambda tar: zstandard.ZstdCompressor(level=19).compress(tar)),
    "pzstd's skippable frames": (".tar.zst", _pzstd_like),
}


@pytest.fixture
def exported(kcache, fixture_copy, tmp_path) -> tuple[Path, Path]:
    src = fixture_copy("hidet")
    arc = tmp_path / "a.tar.zst"
    r = kcache("--cache-dir", src, "export", arc)
    assert r.exit_code == 0, r.stderr
    return src, arc


@pytest.mark.parametrize("how", list(RECODED))
def test_a_recoded_archive_imports_as_the_original(kcache, exported, tmp_path, how):
    src, arc = exported
    suffix, recode = RECODED[how]
    again = tmp_path / f"b{suffix}"
    again.write_bytes(recode(_tar_of(arc)))
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", again, "--json")
    assert r.exit_code == 0, r.stderr
    assert tree(dst) == tree(src)
    assert ls_json(kcache, dst) == ls_json(kcache, src)


def test_real_pzstd_output_imports(kcache, exported, tmp_path):
    if shutil.which("pzstd") is None:
        pytest.skip("pzstd is not installed (Debian's zstd package has it)")
    src, arc = exported
    plain = tmp_path / "a.tar"
    plain.write_bytes(_tar_of(arc))
    subprocess.run(["pzstd", "-q", "-p", "2", str(plain), "-o", str(tmp_path / "p.tar.zst")], check=True)
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", tmp_path / "p.tar.zst")
    assert r.exit_code == 0, r.stderr
    assert tree(dst) == tree(src)


def test_a_member_changed_in_a_recoded_archive_is_still_refused(kcache, exported, tmp_path):
    """Read as one stream, every member is still checked against the manifest: a byte changed in a file
    is refused, and nothing is imported."""
    src, arc = exported
    tar = bytearray(_tar_of(arc))
    at = tar.find(b"\x7fELF")
    assert at > 0
    tar[at + 40] ^= 0xFF
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(tar))
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", bad)
    assert r.exit_code == 1
    assert "archive rejected" in r.stderr and "sha256" in r.stderr
    assert not any(p for p in tree(dst) if not p.startswith(".kcache")) if dst.exists() else True


def test_a_recoded_archive_through_a_pipe(exported, tmp_path):
    src, arc = exported
    dst = tmp_path / "dst"
    env = {**os.environ, "TMPDIR": str(tmp_path), "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(dst), "import", "-"],
                       input=_pzstd_like(_tar_of(arc)), capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert tree(dst) == tree(src)


@pytest.mark.parametrize("lie, said", [
    (lambda parts: b'"' + b"x" * (len(parts) - 2) + b'"', "malformed part list"),
    (lambda parts: re.sub(rb'"entries":(\d)', lambda m: b'"entries":' + (b"9" if m[1] != b"9" else b"8"), parts,
                          count=1), "do not add up"),
])
def test_a_part_list_that_is_no_list_or_miscounts_is_refused(kcache, exported, tmp_path, lie, said):
    """Parts are where import may read in parallel, never what it trusts: but a manifest whose list is not
    one, or counts other entries than it lists, is not kcache's."""
    _, arc = exported
    tar = _tar_of(arc)
    start = tar.index(b'"parts":') + len(b'"parts":')
    end = tar.index(b"]", start) + 1
    new = lie(tar[start:end])
    assert new is not None and len(new) == end - start
    bad = tmp_path / "bad.tar"
    bad.write_bytes(tar[:start] + new + tar[end:])
    r = kcache("--cache-dir", tmp_path / "dst", "import", bad)
    assert r.exit_code == 1 and said in r.stderr, r.stderr
