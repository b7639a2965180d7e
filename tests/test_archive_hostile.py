"""Hostile archives: each one is rejected with a one-line error and exit 1, the cache is left exactly
as it was (a full listing of every file, link, directory and mode before and after), and nothing
appears outside the cache (a sentinel directory next to it stays empty)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from archive_helpers import M, build_archive, entry, hidet_entry, manifest_for, snapshot

H = "ops/cuda_space_0/add/0123456789abcdef"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# Each case: tmp -> (archive, extra import arguments, words the error must contain)

def absolute_member(tmp):
    e = hidet_entry()
    return build_archive(tmp / "a.tar", [e], extra=[M(str(tmp / "sentinel" / "pwned"), data=b"x")]), [], "absolute"


def absolute_entry_path(tmp):
    e = entry(str(tmp / "sentinel" / "e"), {"f": b"x"})
    return build_archive(tmp / "a.tar", [e]), [], "absolute"


def dotdot_member(tmp):
    e = hidet_entry()
    evil = M(f"{H}/../../../../../sentinel/pwned", data=b"x")
    return build_archive(tmp / "a.tar.gz", [e], extra=[evil]), [], "'..'"


def dotdot_in_manifest(tmp):
    e = entry(H, {"../../../../../sentinel/pwned": b"x"})
    return build_archive(tmp / "a.tar", [e]), [], "'..'"


def symlink_outside(tmp):
    e = entry(H, {"lib.so": b"x"}, links={"escape": "../../../../../sentinel"})
    return build_archive(tmp / "a.tar", [e]), [], "outside"


def symlink_absolute(tmp):
    e = entry(H, {"lib.so": b"x"}, links={"escape": str(tmp / "sentinel")})
    return build_archive(tmp / "a.tar", [e]), [], "absolute"


def file_through_symlink(tmp):
    rec, members = entry(H, {"lib.so": b"x"}, links={"d": "."})
    rec["files"]["d/pwned"] = [1, _sha(b"x")]
    members.append(M(f"{H}/d/pwned", data=b"x"))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "under a file or link"


def member_under_unlisted_path(tmp):
    rec, members = entry(H, {"lib.so": b"x"}, links={"d": "sub"}, dirs=["sub"])
    members.append(M(f"{H}/d/pwned", data=b"x"))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "not listed"


def hardlink_outside(tmp):
    rec, members = entry(H, {"lib.so": b"x"})
    rec["files"]["passwd"] = [1, _sha(b"x")]
    members.append(M(f"{H}/passwd", "hardlink", linkname="/etc/passwd"))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "hard link"


def hardlink_other_entry(tmp):
    a = hidet_entry("aaaaaaaaaaaaaaaa")
    rec, members = hidet_entry("bbbbbbbbbbbbbbbb")
    lib = a[0]["files"]["lib.so"]
    rec["files"]["copy.so"] = list(lib)
    members.append(M("ops/cuda_space_0/add/bbbbbbbbbbbbbbbb/copy.so", "hardlink",
                     linkname="ops/cuda_space_0/add/aaaaaaaaaaaaaaaa/lib.so"))
    return build_archive(tmp / "a.tar", [a, (rec, members)]), [], "outside its entry"


def fifo(tmp):
    rec, members = entry(H, {"lib.so": b"x"})
    rec["files"]["pipe"] = [0, _sha(b"")]
    members.append(M(f"{H}/pipe", "fifo"))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "fifo"


def char_device(tmp):
    rec, members = entry(H, {"lib.so": b"x"})
    rec["files"]["null"] = [0, _sha(b"")]
    members.append(M(f"{H}/null", "chr"))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "character device"


def member_over_limit(tmp):
    e = entry(H, {"lib.so": os.urandom(4096)})
    return build_archive(tmp / "a.tar", [e]), ["--max-file-size", "1KB"], "over the limit"


def total_over_limit(tmp):
    e = entry(H, {f"f{i}": os.urandom(40_000) for i in range(3)})
    return build_archive(tmp / "a.tar", [e]), ["--max-total-size", "100KB"], "expand"


def tar_bomb(tmp):
    """200 MB of zeros in a small .tar.gz; rejected before a byte is written."""
    zeros = bytes(1 << 20)
    e = entry(H, {f"z{i:03}": zeros for i in range(200)})
    path = build_archive(tmp / "bomb.tar.gz", [e])
    assert path.stat().st_size < 2 << 20
    return path, ["--max-total-size", "50MB"], "expand"


def header_size_lies(tmp):
    """The manifest says 10 bytes; the member's header says 64 MiB of zeros."""
    rec, members = entry(H, {"lib.so": b"0123456789"})
    members[-1] = M(f"{H}/lib.so", data=b"", size=64 << 20)
    return build_archive(tmp / "a.tar.gz", [(rec, members)]), [], "the manifest says 10"


def huge_pax_header(tmp):
    rec, members = entry(H, {"lib.so": b"x"})
    members[-1].pax = {"comment": "A" * (3 << 20)}
    return build_archive(tmp / "a.tar.gz", [(rec, members)]), [], "extension header"


def _pax_block(keys: range) -> bytes:
    """One pax header whose records are keys of their own (no tar reader keeps to a key it knows)."""
    records = []
    for k in keys:
        body = f" k{k:x}=\n".encode()
        n = len(body) + len(str(len(body)))
        n = len(body) + len(str(n))
        records.append(str(n).encode() + body)
    data = b"".join(records)
    head = tarfile.TarInfo("././@PaxHeader")
    head.type, head.size = tarfile.XHDTYPE, len(data)
    return head.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def chained_pax_headers(tmp):
    """Pax headers each under the limit, one after another before the manifest: their keys add up in memory
    (a 2 MB tar.zst of them once held 1.7 GB), so the limit is on them all together."""
    honest = build_archive(tmp / "honest.tar", [hidet_entry()])
    path = tmp / "a.tar"
    path.write_bytes(b"".join(_pax_block(range(i * 60_000, (i + 1) * 60_000)) for i in range(3))
                     + honest.read_bytes())
    return path, [], "extension header"


def duplicate_member(tmp):
    rec, members = entry(H, {"lib.so": b"x"})
    members.append(M(f"{H}/lib.so", data=b"x"))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "duplicate"


def duplicate_manifest(tmp):
    e = hidet_entry()
    again = M("manifest.json", data=json.dumps(manifest_for([e])).encode())
    return build_archive(tmp / "a.tar", [e], extra=[again]), [], "duplicate"


def missing_manifest(tmp):
    e = hidet_entry()
    return build_archive(tmp / "a.tar", [e], lead=[]), [], "manifest"


def manifest_not_first(tmp):
    e = hidet_entry()
    man = M("manifest.json", data=json.dumps(manifest_for([e])).encode())
    return build_archive(tmp / "a.tar", [e], lead=[M(H, "dir")], extra=[man]), [], "manifest"


def unlisted_member(tmp):
    rec, members = hidet_entry()
    members.append(M(f"{H}/extra.so", data=b"payload"))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "not listed"


def unlisted_entry(tmp):
    e = hidet_entry()
    return build_archive(tmp / "a.tar", [e], extra=[M("ops/cuda_space_0/add/ffffffffffffffff/lib.so",
                                                      data=b"x")]), [], "not listed"


def size_lie(tmp):
    rec, members = entry(H, {"lib.so": b"abcdef"})
    rec["files"]["lib.so"][0] = 3
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "the manifest says 3"


def hash_lie(tmp):
    rec, members = entry(H, {"lib.so": b"abcdef"})
    rec["files"]["lib.so"][1] = _sha(b"ABCDEF")
    return build_archive(tmp / "a.tar.zst", [(rec, members)]), [], "sha256"


def hash_lie_in_late_entry(tmp):
    """The first entries are fine and could be published at once: nothing may be."""
    good = [hidet_entry(f"{i:016x}") for i in range(5)]
    rec, members = hidet_entry("ffffffffffffffff")
    members[-1].data = members[-1].data.upper()  # same size, other bytes
    return build_archive(tmp / "a.tar.gz", good + [(rec, members)]), [], "sha256"


def lock_member(tmp):
    rec, members = entry(H, {"lib.so": b"x", ".lock": b""})
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "lock file"


def lock_member_unlisted(tmp):
    rec, members = entry(H, {"lib.so": b"x"})
    members.append(M(f"{H}/dispatch_table.txt.lock", data=b""))
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "lock file"


def into_kcache_dir(tmp):
    e = hidet_entry()
    lock = M(".kcache/locks/ops%2Fcuda_space_0%2Fadd%2F0123456789abcdef.lock", data=b"")
    return build_archive(tmp / "a.tar", [e], extra=[lock]), [], ".kcache"


def kcache_dir_entry(tmp):
    e = entry(".kcache/trash/x", {"f": b"x"})
    return build_archive(tmp / "a.tar", [e]), [], ".kcache"


def hidden_entry(tmp):
    e = entry("ops/cuda_space_0/add/.kcache-tmp-0123-abcd", {"lib.so": b"x"})
    return build_archive(tmp / "a.tar", [e]), [], "hidden"


def nested_entries(tmp):
    a = entry("programs/abc", {"program.txt": b"x"}, layout="tilus", kind="program")
    b = entry("programs/abc/module", {"lib.so": b"x"}, layout="tilus", kind="program")
    return build_archive(tmp / "a.tar", [a, b]), [], "inside entry"


def missing_listed_file(tmp):
    rec, members = hidet_entry()
    members.pop()
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "missing"


def type_mismatch(tmp):
    rec, members = hidet_entry()
    members[-1] = M(members[-1].name, "dir")
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "the manifest says"


def tilus_link_to_absent_program(tmp):
    e = entry("scripts/add_one/1-845a0ed6", {"meta.json": b"{}"}, layout="tilus", kind="script", op="add_one",
              links={"programs/0": "../../../../programs/ffffffffffff"}, dirs=["programs"])
    return build_archive(tmp / "a.tar", [e]), [], "neither in the archive nor in the cache"


def truncated(tmp):
    e = entry(H, {"lib.so": os.urandom(200_000)})
    path = build_archive(tmp / "a.tar.gz", [e])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path, [], "truncated"


def truncated_zstd(tmp):
    e = entry(H, {"lib.so": os.urandom(200_000), "task.txt": b"t"})
    path = build_archive(tmp / "a.tar.zst", [e])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return path, [], "a"  # the zstd reader or the member checks: either way, one line


def truncated_zstd_in_its_first_block(tmp):
    """Cut inside the first zstd block, the stream decompresses to nothing at all: said truncated, not "not a
    kcache archive"."""
    e = entry(H, {"lib.so": os.urandom(200_000), "task.txt": b"t"})
    path = build_archive(tmp / "a.tar.zst", [e])
    path.write_bytes(path.read_bytes()[:12])  # the frame header, no block whole
    return path, [], "the archive is truncated: it ends before its first member"


def not_an_archive(tmp):
    path = tmp / "a.tar.gz"
    path.write_bytes(os.urandom(4096))
    return path, [], "not a tar"


def corrupt_gzip(tmp):
    e = entry(H, {"lib.so": os.urandom(50_000)})
    path = build_archive(tmp / "a.tar.gz", [e])
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    return path, [], "gzip"


def newer_format(tmp):
    e = hidet_entry()
    man = manifest_for([e])
    man["format_version"] = 99
    return build_archive(tmp / "a.tar", [e], manifest=man), [], "newer kcache"


def manifest_key_lies(tmp):
    rec, members = hidet_entry()
    rec["hash"] = "ffffffffffffffff"
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "disagree"


def unknown_layout_dotdot(tmp):
    rec, members = hidet_entry()
    rec["layout"] = "../../etc"  # refused as unknown before any message uses it as a layout's name
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "manifest entry 0: unknown layout '../../etc'"


def unknown_layout_controls(tmp):
    rec, members = hidet_entry()
    rec["layout"] = "x\x1b]52;c;cHduZWQ=\x07y"  # an OSC 52 clipboard write: shown escaped
    return build_archive(tmp / "a.tar", [(rec, members)]), [], "unknown layout 'x\\x1b]52;c;cHduZWQ=\\x07y'"


CASES = [absolute_member, absolute_entry_path, dotdot_member, dotdot_in_manifest, symlink_outside,
         symlink_absolute, file_through_symlink, member_under_unlisted_path, hardlink_outside, hardlink_other_entry,
         fifo, char_device, member_over_limit, total_over_limit, tar_bomb, header_size_lies, huge_pax_header,
         chained_pax_headers,
         duplicate_member, duplicate_manifest, missing_manifest, manifest_not_first, unlisted_member, unlisted_entry,
         size_lie, hash_lie, hash_lie_in_late_entry, lock_member, lock_member_unlisted, into_kcache_dir,
         kcache_dir_entry, hidden_entry, nested_entries, missing_listed_file, type_mismatch,
         tilus_link_to_absent_program, truncated, truncated_zstd,
         truncated_zstd_in_its_first_block, not_an_archive, corrupt_gzip, newer_format,
         manifest_key_lies, unknown_layout_dotdot, unknown_layout_controls]


@pytest.fixture
def victim(fixture_copy, tmp_path):
    """A real cache to import into (hidet and tilus in one root, so that archives of either layout get
    as far as their own checks: import refuses a layout the root does not hold), and an empty sentinel
    directory next to it."""
    root = fixture_copy("hidet", dest="cache")
    tilus = fixture_copy("tilus")
    for top in ("programs", "scripts"):
        shutil.copytree(tilus / top, root / top, symlinks=True)
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    return root, sentinel


def _outside(tmp_path: Path, root: Path) -> set[str]:
    return {str(p) for p in tmp_path.rglob("*") if root not in p.parents and p != root and "home" not in p.parts}


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_hostile_archive_is_rejected(kcache, victim, tmp_path, case):
    root, sentinel = victim
    archive, args, words = case(tmp_path)
    before, around = snapshot(root), _outside(tmp_path, root)
    r = kcache("--cache-dir", root, "import", archive, *args)
    assert r.exit_code == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert snapshot(root) == before
    assert list(sentinel.iterdir()) == []
    assert _outside(tmp_path, root) == around


@pytest.mark.parametrize("case", [symlink_outside, hash_lie, tar_bomb, lock_member, unknown_layout_dotdot],
                         ids=lambda c: c.__name__)
def test_rejected_into_missing_root_creates_nothing(kcache, tmp_path, case):
    (tmp_path / "sentinel").mkdir()
    archive, args, _ = case(tmp_path)
    root = tmp_path / "new" / "cache"
    r = kcache("--cache-dir", root, "import", archive, *args)
    assert r.exit_code == 1
    assert not (tmp_path / "new").exists()


def test_dry_run_rejects_too(kcache, victim, tmp_path):
    root, _ = victim
    archive, _, _ = hash_lie(tmp_path)
    r = kcache("--cache-dir", root, "import", archive, "--dry-run")
    assert r.exit_code == 1 and "sha256" in r.stderr


def test_lying_parts_are_read_as_one_stream(kcache, fixture_copy, tmp_path):
    """kcache's own archives list their parts' sizes, where import may read them in parallel; parts that
    are not where the manifest says are read as the one stream they make (as a recompressed archive's:
    tests/test_archive_recompressed.py), every member checked against the manifest as always."""
    src = fixture_copy("tilelang")
    arc = tmp_path / "t.tar"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    data = arc.read_bytes()
    i = data.index(b'"parts":[{"size":') + len(b'"parts":[{"size":')
    digit = data[i:i + 1]
    arc.write_bytes(data[:i] + (b"1" if digit != b"1" else b"2") + data[i + 1:])
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", arc)
    assert r.exit_code == 0, r.stderr
    assert "imported 2 entries" in r.stderr
    assert snapshot(dst / "0.1.15") == snapshot(src / "0.1.15") != {}


def test_honest_hand_made_archive_is_accepted(kcache, victim, tmp_path):
    """The builders above make valid archives unless told to lie: the rules are not over-broad."""
    root, sentinel = victim
    e = entry(H, {"lib.so": b"\x7fELF" + bytes(60), "task.txt": b"t"}, links={"alias.so": "lib.so"},
              dirs=["candidates"], locks=[".lock"])
    r = kcache("--cache-dir", root, "import", build_archive(tmp_path / "ok.tar.gz", [e]))
    assert r.exit_code == 0, r.stderr
    assert os.readlink(root / H / "alias.so") == "lib.so" and (root / H / ".lock").read_bytes() == b""
    assert (root / H / "candidates").is_dir() and list(sentinel.iterdir()) == []


def test_hardlink_inside_entry_is_a_copy(kcache, victim, tmp_path):
    root, _ = victim
    rec, members = entry(H, {"lib.so": b"payload"})
    rec["files"]["copy.so"] = list(rec["files"]["lib.so"])
    members.append(M(f"{H}/copy.so", "hardlink", linkname=f"{H}/lib.so"))
    r = kcache("--cache-dir", root, "import", build_archive(tmp_path / "h.tar", [(rec, members)]))
    assert r.exit_code == 0, r.stderr
    assert (root / H / "copy.so").read_bytes() == b"payload"
    assert os.stat(root / H / "copy.so").st_ino != os.stat(root / H / "lib.so").st_ino


def test_tilus_link_to_present_program_is_accepted(kcache, fixture_copy, tmp_path):
    root = fixture_copy("tilus", dest="cache")
    import shutil

    shutil.rmtree(root / "scripts")
    e = entry("scripts/add_one/1-845a0ed6", {"meta.json": b"{}"}, layout="tilus", kind="script", op="add_one",
              links={"programs/0": "../../../../programs/f006237ca7a5"}, dirs=["programs"])
    r = kcache("--cache-dir", root, "import", build_archive(tmp_path / "s.tar", [e]))
    assert r.exit_code == 0, r.stderr
    assert (root / "scripts/add_one/1-845a0ed6/programs/0/program.txt").is_file()


def test_control_characters_in_names(kcache, victim, tmp_path):
    root, _ = victim
    for i, name in enumerate(["a\nb", "tab\there", "esc\x1b[31m"]):
        rec, members = entry(H, {name: b"x", "lib.so": b"y"})
        r = kcache("--cache-dir", root, "import", build_archive(tmp_path / f"c{i}.tar", [(rec, members)]))
        assert r.exit_code == 1 and "control characters" in r.stderr, (name, r.stderr)
