"""Manifest entry records (archive.manifest.EntryRecord): what export writes is what import reads, and
archives written before records were typed (commit b32df76) still read and write the same bytes."""

from __future__ import annotations

import json

import pytest

from kcache_cli import archive
from kcache_cli.archive.manifest import EntryRecord, records_from_json
from kcache_cli.model.records import ScanFilter

# The entry records of tests/fixtures/real/tilus as `kcache export` wrote them at b32df76 (a program with
# a lock file, a script whose links point at it), one JSON text each, exactly as in its manifest.json.
TILUS_RECORDS = (
    ('{"layout":"tilus","kind":"program","target":"cuda","space":null,"op":"add_one","hash":"f006237ca7a5"'
     ',"relpath":"programs/f006237ca7a5","status":"complete","compiler":"nvcc","arch":"sm_90a","platform":'
     'null,"files":{"module/compile.sh":[747,"fbce5847734c14a0cd9487106a92a939ecbcd037554bfc50823a1a5cd13a'
     '6f47"],"module/func_types.pickle":[507,"4bfb57248b2ffa1688c955f4b18e29a0057785c1fa18bd1593caff167b00'
     '909e"],"module/lib.so":[68816,"41cde10dd4a3343d90e26a0cf484410eea3257dd476b0f9e2b9a6c87f2fa6bb1"],"m'
     'odule/nvcc_output.txt":[370,"64b1c5af65aed559a1b8c80e35faa8c8fc657f124af79496c731c16f506ec7f8"],"mod'
     'ule/source.cu":[3538,"c0502c5c14aebd522be1e81c129bf0d64e36dd83f9c29e41320458d8f8abe233"],"options.tx'
     't":[203,"5805aabe585ce2e1237b7b11797c42c2631ac5a6cc69e100b17f0fc735ef6d0f"],"program.txt":[972,"e87d'
     '4079d475b8b4ed5b7eb239186c696f9f1d63786b3efb32b4cbb95037358f"]},"links":{},"dirs":["module"],"locks"'
     ':[".lock"]}'),
    ('{"layout":"tilus","kind":"script","target":"cuda","space":null,"op":"add_one","hash":"1-845a0ed6","r'
     'elpath":"scripts/add_one/1-845a0ed6","status":"complete","compiler":null,"arch":null,"platform":null'
     ',"files":{"build_options.txt":[30,"807b87057276e7b002df76128998ebdf95822650d892c519ee9603c851f9d0c4"'
     '],"dispatch_table.pickle":[37,"9c35ce80c3d2ef0d893aaaaf5219d485a3674fe04e01d028cb5ece0022272a96"],"d'
     'ispatch_table.txt":[74,"ab49b06fca6fc9331215b9780882eaefc719caa5b60a97d301959aedecd58cb1"],"latency/'
     '1024/report.txt":[71,"fb0c30abf023af2fa6097ddd071894dd158af797517a3fae2fd20f4a5f68623b"],"latency/40'
     '96/report.txt":[71,"fb0c30abf023af2fa6097ddd071894dd158af797517a3fae2fd20f4a5f68623b"],"latency/6144'
     '/report.txt":[71,"fb0c30abf023af2fa6097ddd071894dd158af797517a3fae2fd20f4a5f68623b"],"meta.json":[52'
     '3,"bc3cfe51b4ced9aab5faf2f30e027030bbe9426e5754a336b930b119b8c17a23"],"schedule.txt":[23,"df92e6aa47'
     'e6422a1e4bbb440817b73435b728d9a673cebf906b56cbc6bd8e4d"],"source.txt":[710,"3f476d156835161c69855748'
     '7cd3de68dcfe3fda620bf61fd7a8b50b9734be60"]},"links":{"latency/1024/0":"../../../../../programs/f0062'
     '37ca7a5","latency/4096/0":"../../../../../programs/f006237ca7a5","latency/6144/0":"../../../../../pr'
     'ograms/f006237ca7a5","programs/0":"../../../../programs/f006237ca7a5"},"dirs":["latency","latency/10'
     '24","latency/4096","latency/6144","programs"],"locks":[".lock"]}'),
)
# A --sources-only record of tests/fixtures/real/hidet (with "omitted") as b32df76 wrote it.
HIDET_SOURCES_ONLY = (
    '{"layout":"hidet","kind":"op","target":"cpu","space":"cpu_space_0","op":"fused","hash":"af3046266c6a'
    'bdd1","relpath":"ops/cpu_space_0/fused/af3046266c6abdd1","status":"complete","compiler":"g++","arch"'
    ':null,"platform":null,"files":{"candidates.json":[79,"6ecc7258d3218d6496f60b8a51ea4766f1e43184222e03'
    '3aed967b9ed8a5c87a"],"candidates.txt":[15,"2f0990c6a483eac20d34e26f54fa8a531295c36b4278c68987bf534b7'
    '104d6b6"],"compile.sh":[424,"1b8b34ee168f87b5bc298c00502e257e2c455173508028a198da47e5f3bfd5d8"],"fun'
    'c_types.pickle":[889,"fa925114f4f53926008e6a27ac0918ebb9f94af7139f1d21a4c7d14cd55df525"],"gcc_output'
    '.txt":[28,"679063124cb34ac197b5a0b8ea76886ef7810028801c310e577b7cd5717ab6f7"],"meta.json":[604,"d3e6'
    '71f6e706913bacf3612b8af479e2d3d65623695868feaa6e23cb464c1ab4"],"source.cc":[1919,"a754b1e6ee0613540d'
    'a98e2b2de6f49ef8c3b1ba35ada82795b76942cc149730"],"task.pickle":[5515,"8c4f8181dc9f771ac3b12a036cba0b'
    '3d4abd6d6c3c5299e5378a145375ebc408"],"task.txt":[510,"af3046266c6abdd1edbb630c283cf13585ed9cd3fd3d5c'
    '9df1efda0d21aec2ce"],"version.txt":[5,"14848c5f87427ae54b00bf9eb86bfd3fb6288e611d3af1d7739ee09050cd4'
    '6df"]},"links":{},"dirs":[],"locks":[".lock"],"omitted":["lib.so"]}')


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))  # as export encodes the manifest


@pytest.mark.parametrize("text", [*TILUS_RECORDS, HIDET_SOURCES_ONLY])
def test_records_written_at_b32df76_read_and_write_the_same_bytes(text):
    record = EntryRecord.from_json(json.loads(text))
    assert _dumps(record.to_json()) == text
    assert record.relpath.rsplit("/", 1)[-1] == record.key.hash and record.status == "complete"
    assert record.size == sum(size for size, _ in json.loads(text)["files"].values())


def test_a_record_reads_into_named_fields():
    program, script = records_from_json([json.loads(t) for t in TILUS_RECORDS], 0, archive.ImportLimits())
    assert program.key == ("tilus", "program", "cuda", None, "add_one", "f006237ca7a5", "programs/f006237ca7a5")
    assert program.locks == (".lock",) and program.dirs == ("module",) and program.arch == "sm_90a"
    assert script.links["programs/0"] == "../../../../programs/f006237ca7a5"
    assert script.files["meta.json"][0] == 523 and script.omitted is None
    assert EntryRecord.from_json(json.loads(HIDET_SOURCES_ONLY)).omitted == ("lib.so",)


def test_export_writes_the_records_b32df76_wrote_and_its_archive_imports(fixture_copy, tmp_path):
    import tarfile
    from datetime import datetime

    src = fixture_copy("tilus")
    out = tmp_path / "tilus.tar"
    archive.export_archive(archive.plan_export(src, ScanFilter()), str(out))
    with tarfile.open(out) as tf:
        data = tf.extractfile("manifest.json").read().decode()  # type: ignore[union-attr]
    entries = json.loads(data)["entries"]
    assert data.endswith(',"entries":' + _dumps(entries) + "}")
    assert all(datetime.fromisoformat(e.pop("last_used")).tzinfo for e in entries)  # the one field added since
    assert [_dumps(e) for e in entries] == list(TILUS_RECORDS)
    result = archive.import_archive(tmp_path / "dest", str(out))
    assert [(e.relpath, e.action, e.done) for e in result.entries] == [
        ("programs/f006237ca7a5", "import", True), ("scripts/add_one/1-845a0ed6", "import", True)]
    assert result.entries[0].arch == "sm_90a" and result.entries[1].hash == "1-845a0ed6"


def test_fields_this_kcache_does_not_read_are_kept_in_order_after_the_others():
    raw = {**json.loads(TILUS_RECORDS[0]), "pushed": "2026-01-01T00:00:00+00:00", "omitted": 7, "groups": []}
    record = EntryRecord.from_json(raw)
    assert record.omitted is None and dict(record.extra) == {"pushed": raw["pushed"], "omitted": 7, "groups": []}
    assert _dumps(record.to_json()).startswith(TILUS_RECORDS[0][:-1] + ',"pushed":')


@pytest.mark.parametrize("change,message", [
    (lambda r: 5, "manifest entry 7 is not an object"),
    (lambda r: {**r, "layout": "ccache"}, "manifest entry 7: unknown layout 'ccache'"),
    (lambda r: {**r, "kind": 5}, "manifest entry 7 has no valid kind or path"),
    (lambda r: {**r, "hash": "0" * 16}, "its hash, space or op disagree with its path"),
    (lambda r: {**r, "op": "other"}, "its hash, space or op disagree with its path"),
    (lambda r: {**r, "locks": ["x.txt"]}, "is listed as a lock file but is not named like one"),
    (lambda r: {**r, "files": {"a": [1, "xyz"]}}, "the manifest gives no valid size and sha256"),
])
def test_from_json_refuses_a_bad_record_in_one_line(change, message):
    with pytest.raises(archive.ArchiveRejected) as exc:
        EntryRecord.from_json(change(json.loads(HIDET_SOURCES_ONLY)), 7)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_last_use_reads_as_a_time_and_anything_else_as_absent():
    """`last_used` (ISO-8601 with its offset, as export writes it) round-trips; a value that is no such time
    (a hostile or older manifest's) reads as absent, and import then keeps the import's time."""
    base = json.loads(TILUS_RECORDS[0])
    record = EntryRecord.from_json({**base, "last_used": "2026-01-02T03:04:05+00:00"})
    assert record.last_used == 1767323045.0
    assert _dumps(record.to_json()) == TILUS_RECORDS[0][:-1] + ',"last_used":"2026-01-02T03:04:05+00:00"}'
    for bad in (7, "yesterday", "2026-01-02T03:04:05", None, ["x"], "9" * 100):
        assert EntryRecord.from_json({**base, "last_used": bad}).last_used is None
