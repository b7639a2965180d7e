"""torch Mega-Cache blobs without torch: the framing (kcache_cli/formats/megacache.py) against a blob torch 2.13 saved
(tests/fixtures/real/torch-mega/), damaged and hostile blobs, and inspect / verify / import / export of
blobs (kcache_cli/archive/mega.py). The real torch loading what kcache writes is tests/loaders/test_mega_torch.py."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import zlib
from pathlib import Path

import pytest

from kcache_cli.formats import megacache
from kcache_cli.layouts.inductor import MEGA_TYPES, variant_name

FIXTURE = Path(__file__).parent / "fixtures" / "real" / "torch-mega" / "sin_cos_cpu.bin"
GRAPH_KEY = "f" + "a" * 51
AUTOGRAD_KEY = "a" + "b" * 51


def _blob(tmp_path: Path, data: bytes, name: str = "x.bin") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _whole(body: bytes) -> bytes:
    """A blob whose CRC states its body (so framing problems are seen alone)."""
    return zlib.crc32(body).to_bytes(4, "big") + body


# ---- the framing, against torch's own blob ------------------------------------------------------

def test_the_blob_torch_saved_parses_and_rebuilds_byte_for_byte():
    data = FIXTURE.read_bytes()
    blob = megacache.parse(data, MEGA_TYPES)
    assert blob.state == megacache.OK and blob.problems == () and blob.crc_ok and blob.version == 1
    assert blob.groups == (("inductor", 2), ("aot_autograd", 1))
    for a in blob.artifacts:  # each content a pickle (read as bytes only), each key the shape torch gives it
        assert a.content[:1] == b"\x80" and a.content[-1:] == b"."
        assert len(a.key) == 52 and a.key[0] == {"inductor": "f", "aot_autograd": "a"}[a.type]
    assert megacache.build([(a.type, a.key, a.content) for a in blob.artifacts]) == data


def test_strings_are_base64_inside_a_length_and_contents_are_raw():
    data = megacache.build([("autotune", "ab/x.best_config", b'{"a": 1}')])
    assert data[4:12] == (1).to_bytes(8, "big")
    assert data[12:20] == (12).to_bytes(8, "big") and data[20:32] == b"YXV0b3R1bmU="  # "autotune"
    assert data[32:40] == (1).to_bytes(8, "big")
    assert data.endswith((8).to_bytes(8, "big") + b'{"a": 1}')
    assert int.from_bytes(data[:4], "big") == zlib.crc32(data[4:])


def test_a_flipped_byte_is_a_checksum_mismatch(tmp_path, kcache):
    data = bytearray(FIXTURE.read_bytes())
    data[5000] ^= 0x01
    blob = megacache.parse(bytes(data), MEGA_TYPES)
    assert not blob.crc_ok and blob.state == megacache.CORRUPT and blob.loaded() == []
    assert "checksum" in blob.problems[0]
    r = kcache("verify", _blob(tmp_path, bytes(data)))
    assert r.exit_code == 1 and "checksum mismatch" in r.stdout and "MISMATCH" in r.stdout
    r = kcache("--json", "verify", _blob(tmp_path, bytes(data)))
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["crc32"]["ok"] is False and doc["state"] == "corrupt"
    assert kcache("verify", str(FIXTURE)).exit_code == 0


@pytest.mark.parametrize("data, state, words", [
    (b"", megacache.EMPTY, "empty"),
    (b"\x00\x01", megacache.PARTIAL, "shorter than its 4-byte checksum"),
    (_whole((1).to_bytes(8, "big")), megacache.EMPTY, "no artifact"),
    (_whole(b"\x00\x00\x01"), megacache.PARTIAL, "inside the version"),
    (_whole((2).to_bytes(8, "big")), megacache.CORRUPT, "version 2"),
])
def test_empty_short_and_foreign_blobs_are_named(tmp_path, kcache, data, state, words):
    blob = megacache.parse(data, MEGA_TYPES)
    assert blob.state == state and any(words in p for p in blob.problems), blob.problems
    r = kcache("verify", _blob(tmp_path, data))
    assert r.exit_code == 1 and words in r.stdout


def test_a_blob_cut_short_is_partial_and_says_where(tmp_path, kcache):
    whole = FIXTURE.read_bytes()
    cut = _whole(whole[4:200_000])  # the CRC made right again: only the framing tells
    blob = megacache.parse(cut, MEGA_TYPES)
    assert blob.state == megacache.PARTIAL and blob.crc_ok
    assert blob.problems[-1].startswith("partial:") and "content" in blob.problems[-1]
    assert len(blob.artifacts) == 2 and blob.loaded() == []  # torch loads nothing of a partial blob
    r = kcache("--json", "inspect", _blob(tmp_path, cut))
    assert r.exit_code == 1 and json.loads(r.stdout)["state"] == "partial"
    raw_cut = whole[:200_000]  # as a copy cut short leaves it: the checksum says so first
    problems = megacache.parse(raw_cut, MEGA_TYPES).problems
    assert "checksum" in problems[0] and problems[-1].startswith("partial:")


def test_a_count_no_blob_could_hold_is_refused_without_reading_on():
    body = (1).to_bytes(8, "big") + megacache._text("inductor") + (2**63).to_bytes(8, "big")
    blob = megacache.parse(_whole(body), MEGA_TYPES)
    assert blob.state == megacache.PARTIAL and "holds 9,223,372,036,854,775,808 artifacts" in blob.problems[-1]


def test_an_unknown_type_and_a_shadowed_group_are_what_torch_trips_on(tmp_path, kcache):
    body = (1).to_bytes(8, "big")
    for kind, key in (("autotune", "ab/one.best_config"), ("mystery", "k"), ("autotune", "ab/two.best_config")):
        body += megacache._text(kind) + (1).to_bytes(8, "big") + megacache._text(key) + (2).to_bytes(8, "big") + b"{}"
    blob = megacache.parse(_whole(body), MEGA_TYPES)
    assert any("'mystery', which torch 2.13 does not know" in p for p in blob.problems)
    assert blob.shadowed() == [0]
    doc = json.loads(kcache("--json", "inspect", _blob(tmp_path, _whole(body))).stdout)
    assert any("group 0 (autotune) is shadowed" in p for p in doc["problems"])


@pytest.mark.parametrize("columns", [40, 80])
def test_a_blob_s_types_print_escaped_and_its_problems_fit_the_width(tmp_path, kcache, columns):
    """A group type is the blob's text: `inspect` and `verify` print it escaped on every line (the groups
    line printed it raw: a window title set), and fold their problem lines to the terminal's width."""
    body = (1).to_bytes(8, "big")
    for kind, key in (("autotune", "ab/one.best_config"), ("bogus\x1b]0;pwned\x07", "k"),
                      ("autotune", "ab/two.best_config")):
        body += megacache._text(kind) + (1).to_bytes(8, "big") + megacache._text(key) + (2).to_bytes(8, "big") + b"{}"
    path = _blob(tmp_path, _whole(body))
    for command in ("inspect", "verify"):
        r = kcache(command, path, env={"COLUMNS": str(columns)})
        assert r.exit_code == 1, r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "bogus\\x1b]0;pwned" in r.stdout
        assert "shadowed" in r.stdout
        wide = [line for line in r.stdout.splitlines() if len(line) > columns and not line.startswith("blob ")]
        assert not wide, wide


def test_base64_that_is_not_text_is_a_framing_problem():
    bad = b"//4="  # base64 of 0xff 0xfe: no UTF-8
    body = (1).to_bytes(8, "big") + (len(bad)).to_bytes(8, "big") + bad
    blob = megacache.parse(_whole(body), MEGA_TYPES)
    assert blob.state == megacache.CORRUPT and "not base64 of UTF-8" in blob.problems[-1]


# ---- hostile payloads: nothing is ever unpickled -----------------------------------------------

class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_payload_that_runs_code_when_unpickled_runs_nothing(tmp_path, kcache):
    marker = tmp_path / "RAN"
    payload = pickle.dumps(_Boom(str(marker)), protocol=4)
    assert payload[:1] == b"\x80" and payload.endswith(b".")  # a whole pickle: it would run if loaded
    data = megacache.build([("inductor", GRAPH_KEY, payload), ("aot_autograd", AUTOGRAD_KEY, payload),
                            ("pgo", "job", payload)])
    path = _blob(tmp_path, data)

    root = tmp_path / "root"
    assert kcache("inspect", path).exit_code == 0
    assert kcache("verify", path).exit_code == 0
    assert kcache("--cache-dir", root, "import", path).exit_code == 0
    r = kcache("--cache-dir", root, "--json", "ls")
    assert r.exit_code == 0 and len(json.loads(r.stdout)["entries"]) == 2
    assert kcache("--cache-dir", root, "verify").exit_code in (0, 1)
    assert not marker.exists()
    pickle.loads(payload)  # the payload is live: loading it runs the command (proof the test could fail)
    assert marker.exists()
    assert (root / "fxgraph" / GRAPH_KEY[1:3] / GRAPH_KEY / variant_name(payload)).read_bytes() == payload
    assert (root / "dynamo" / "code_state_job.pkl").read_bytes() == payload


@pytest.mark.parametrize("kind, key", [
    ("autotune", "../../outside.best_config"), ("autotune", "/etc/x.best_config"),
    ("precompile", ".."), ("precompile", "a/../../b"), ("inductor", "../" + GRAPH_KEY), ("aot_autograd", "x"),
])
def test_keys_that_would_leave_the_root_are_refused(tmp_path, kcache, kind, key):
    root = tmp_path / "deep" / "root"
    r = kcache("--cache-dir", root, "--json", "import", _blob(tmp_path, megacache.build([(kind, key, b"{}")])))
    assert r.exit_code == 1
    assert json.loads(r.stdout)["artifacts"][0]["action"] == "refuse"
    written = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["x.bin"]


def test_a_pgo_key_whose_file_name_is_too_long_in_bytes_is_refused_before_any_write(tmp_path, kcache):
    """200 two-byte characters: 200 characters but 400 bytes, which no file system takes as a name. It was
    planned as fine, and the import wrote the other artifacts, then failed on it with "File name too long"
    naming no artifact."""
    root = tmp_path / "root"
    blob = _blob(tmp_path, megacache.build([("pgo", "a", b"ok"), ("pgo", "\u00e9" * 200, b"x")]))
    r = kcache("--cache-dir", root, "--json", "import", blob)
    assert r.exit_code == 1, r.stderr
    acts = {a["key"][:1]: a for a in json.loads(r.stdout)["artifacts"]}
    assert acts["\u00e9"]["action"] == "refuse" and "over 255 bytes" in acts["\u00e9"]["reason"]
    assert acts["a"]["action"] == "import" and (root / "dynamo" / "code_state_a.pkl").read_bytes() == b"ok"


def test_the_same_graph_twice_in_a_blob_is_one_file(tmp_path, kcache):
    """A blob holding one fx graph artifact twice (same key, same bytes): imported once, where it ended in a
    bare "File exists" and nothing imported."""
    root = tmp_path / "root"
    r = kcache("--cache-dir", root, "import", _blob(tmp_path, megacache.build([("inductor", GRAPH_KEY, b"one")] * 2)))
    assert r.exit_code == 0, r.stderr
    assert (root / "fxgraph" / GRAPH_KEY[1:3] / GRAPH_KEY / variant_name(b"one")).read_bytes() == b"one"


def test_a_link_on_the_way_is_never_written_through(tmp_path, kcache):
    root, away = tmp_path / "root", tmp_path / "away"
    root.mkdir()
    away.mkdir()
    (root / "ab").symlink_to(away)
    r = kcache("--cache-dir", root, "--json", "import",
               _blob(tmp_path, megacache.build([("autotune", "ab/k.best_config", b"{}")])))
    assert r.exit_code == 1 and json.loads(r.stdout)["artifacts"][0]["action"] == "refuse"
    assert list(away.iterdir()) == []


def test_a_blob_goes_into_an_inductor_root_that_holds_only_torch_s_locks(tmp_path, kcache):
    """/tmp/torchinductor_$USER after torch took a lock and cached nothing holds locks/ alone: it is an
    Inductor root (its shape keeps locks/), not a folder that holds no cache."""
    root = tmp_path / "torchinductor_me"
    (root / "locks").mkdir(parents=True)
    r = kcache("--cache-dir", root, "--json", "import",
               _blob(tmp_path, megacache.build([("autotune", "ab/k.best_config", b"{}")])))
    assert r.exit_code == 0 and (root / "ab" / "k.best_config").is_file(), r.stderr
    other = tmp_path / "project"
    (other / "locks").mkdir(parents=True)
    (other / "README").write_text("mine\n")  # anything else is no Inductor's: refused
    r = kcache("--cache-dir", other, "import", _blob(tmp_path, megacache.build([("autotune", "cd/k.best_config",
                                                                                 b"{}")])))
    assert r.exit_code == 1 and "holds no kernel cache, yet is not empty ('README')" in r.stderr, r.stderr


# ---- import and export ----------------------------------------------------------------------

def test_torch_s_blob_imports_as_complete_graph_and_autograd_entries(tmp_path, kcache):
    root = tmp_path / "root"
    assert kcache("--cache-dir", root, "import", str(FIXTURE), "--dry-run").exit_code == 0
    assert not (root / "fxgraph").exists()
    r = kcache("--cache-dir", root, "--json", "import", str(FIXTURE))
    assert r.exit_code == 0 and json.loads(r.stdout)["imported"] == 3
    entries = json.loads(kcache("--cache-dir", root, "--json", "ls").stdout)["entries"]
    assert sorted((e["kind"], e["status"]) for e in entries) == [
        ("autograd", "complete"), ("graph", "complete"), ("graph", "complete")]
    assert kcache("--cache-dir", root, "verify").exit_code == 0  # each variant's name is its sha256
    again = json.loads(kcache("--cache-dir", root, "--json", "import", str(FIXTURE)).stdout)
    assert again["imported"] == 0 and again["skipped"] == 3


def test_quiet_blob_import_says_only_what_it_refused(tmp_path, kcache):
    """-q: a blob imported, or every artifact present, prints nothing; a refused one keeps its row (exit 1
    says no more)."""
    root = tmp_path / "root"
    for _ in range(2):
        r = kcache("-q", "--cache-dir", root, "import", str(FIXTURE))
        assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    r = kcache("-q", "--cache-dir", root, "import", _blob(tmp_path, megacache.build([("autotune", "/etc/x.best_config",
                                                                                     b"{}")])))
    assert r.exit_code == 1 and r.stdout.count("refuse") == 1 and "/etc/x.best_config" in r.stdout, r.stdout


def test_a_new_guard_variant_joins_an_existing_graph(tmp_path, kcache):
    root = tmp_path / "root"
    one = megacache.build([("inductor", GRAPH_KEY, b"\x80\x04K\x01.")])
    two = megacache.build([("inductor", GRAPH_KEY, b"\x80\x04K\x02.")])
    assert kcache("--cache-dir", root, "import", _blob(tmp_path, one, "1.bin")).exit_code == 0
    dry = kcache("--cache-dir", root, "--json", "import", _blob(tmp_path, two, "2.bin"), "--dry-run")
    assert json.loads(dry.stdout)["artifacts"][0]["action"] == "add"  # the dry run says what the run does
    r = kcache("--cache-dir", root, "--json", "import", _blob(tmp_path, two, "2.bin"))
    assert json.loads(r.stdout)["artifacts"][0]["action"] == "add"
    assert len(list((root / "fxgraph" / GRAPH_KEY[1:3] / GRAPH_KEY).iterdir())) == 2


def test_a_damaged_blob_writes_nothing(tmp_path, kcache):
    data = bytearray(FIXTURE.read_bytes())
    data[-1] ^= 0xFF
    root = tmp_path / "root"
    r = kcache("--cache-dir", root, "import", _blob(tmp_path, bytes(data)))
    assert r.exit_code == 1 and "checksum" in r.stderr and not root.exists()


def test_export_carries_every_graph_autograd_and_autotune_record(tmp_path, kcache):
    root = tmp_path / "root"
    kcache("--cache-dir", root, "import", str(FIXTURE))
    (root / "q6").mkdir()
    (root / "q6" / "k7.best_config").write_text('{"XBLOCK": 64}')
    out = tmp_path / "out.bin"
    r = kcache("--cache-dir", root, "--json", "export", out, "--format", "torch-mega", "--python", "/bin/false")
    assert r.exit_code == 0, r.stderr
    got = megacache.parse(out.read_bytes(), MEGA_TYPES)
    want = megacache.parse(FIXTURE.read_bytes(), MEGA_TYPES)
    assert got.state == megacache.OK
    assert sorted((a.type, a.key, a.content) for a in got.artifacts) == sorted(
        [(a.type, a.key, a.content) for a in want.artifacts] + [("autotune", "q6/k7.best_config", b'{"XBLOCK": 64}')])
    side = json.loads((tmp_path / "out.bin.kcache.json").read_text())
    assert side["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest() and len(side["artifacts"]) == 4
    assert set(side) >= {"torch_version", "device", "kcache_version", "format"}


def test_with_a_trust_list_an_unsigned_blob_is_refused_and_a_signed_one_taken(tmp_path, kcache, monkeypatch):
    pytest.importorskip("cryptography")
    from kcache_cli.util.signing import make_key

    monkeypatch.setenv("KCACHE_SIGNING_KEY", str(tmp_path / "key"))
    _, public = make_key(tmp_path / "key")
    src = tmp_path / "src"
    kcache("--cache-dir", src, "import", str(FIXTURE))
    out = tmp_path / "signed.bin"
    assert kcache("--cache-dir", src, "export", out, "--format", "torch-mega", "--python", "/bin/false").exit_code == 0
    monkeypatch.setenv("KCACHE_TRUSTED_KEYS", public)
    r = kcache("--cache-dir", tmp_path / "a", "import", str(FIXTURE))
    assert r.exit_code == 1 and "sidecar" in r.stderr
    assert kcache("--cache-dir", tmp_path / "b", "import", out).exit_code == 0
    side = tmp_path / "signed.bin.kcache.json"
    doc = json.loads(side.read_text())
    doc["sha256"] = "0" * 64
    side.write_text(json.dumps(doc))
    r = kcache("--cache-dir", tmp_path / "c", "import", out)
    assert r.exit_code == 1 and "altered" in r.stderr


def test_a_blob_never_goes_into_another_layout_s_cache(tmp_path, kcache):
    root = tmp_path / "triton"
    shutil.copytree(Path(__file__).parent / "fixtures" / "real" / "triton" / "cache", root)
    before = sorted(p.name for p in root.iterdir())
    r = kcache("--cache-dir", root, "import", str(FIXTURE))
    assert r.exit_code == 1 and "inductor entries" in r.stderr and "triton cache" in r.stderr
    assert sorted(p.name for p in root.iterdir()) == before


def test_a_blob_of_autotune_files_alone_imports_into_a_new_root_as_its_dry_run_says(tmp_path, kcache):
    """No entry's staging makes the root for a blob of autotune files alone: import failed with "No such
    file or directory". An autotune file is imported (`import`, as the dry run says; `add` is a file
    joining an entry there already, as a guard variant joins its graph)."""
    data = megacache.build([("autotune", "ab/x.best_config", b'{"a": 1}')])
    path = _blob(tmp_path, data)
    root = tmp_path / "inductor"
    dry = json.loads(kcache("--cache-dir", root, "--json", "import", path, "--dry-run").stdout)
    done = json.loads(kcache("--cache-dir", root, "--json", "import", path).stdout)
    assert [a["action"] for a in dry["artifacts"]] == [a["action"] for a in done["artifacts"]] == ["import"]
    assert done["imported"] == 1
