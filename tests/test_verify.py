"""kcache verify: the real caches pass; each kind of damage is listed and makes the exit status 1."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kcache_cli.model.records import ScanFilter
from kcache_cli.ops.verify import verify_cache


@pytest.mark.parametrize("layout", ["hidet", "tilus", "tilelang"])
def test_real_caches_verify_clean(kcache, fixture_copy, layout):
    root = fixture_copy(layout)
    r = kcache("--cache-dir", root, "verify", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    data = r.json()
    assert data["checked"] > 0 and data["failed"] == 0 and data["problems"] == []
    r = kcache("--cache-dir", root, "verify")
    assert r.exit_code == 0 and r.stdout == "" and "0 with problems" in r.stderr


def _problems(kcache, root: Path, *args) -> dict[str, list[str]]:
    r = kcache("--cache-dir", root, "verify", "--json", *args)
    assert r.exit_code == (1 if r.json()["failed"] else 0), r.stderr
    return {p["hash"]: p["problems"] for p in r.json()["problems"]}


def test_hidet_damage(kcache, fixture_copy):
    root = fixture_copy("hidet")
    ops = root / "ops"
    meta = ops / "cpu_space_0/matmul/064b4a6c035246e8/meta.json"
    meta.write_bytes(meta.read_bytes()[:100])  # hidet fails reading it on every call
    lib = ops / "cuda_space_0/add/8d1f7691cdf75e90/lib.so"
    lib.write_bytes(lib.read_bytes()[:200])  # truncated binary
    (ops / "cpu_space_0/relu/31857fe085635b31/func_types.pickle").unlink()  # partial
    found = _problems(kcache, root)
    assert set(found) == {"064b4a6c035246e8", "8d1f7691cdf75e90", "31857fe085635b31"}
    assert any("meta.json is not valid JSON" in p for p in found["064b4a6c035246e8"])
    assert any("truncated" in p or "lib.so" in p for p in found["8d1f7691cdf75e90"])
    assert any("func_types.pickle" in p for p in found["31857fe085635b31"])
    r = kcache("--cache-dir", root, "verify")
    assert r.exit_code == 1
    assert "064b4a6c035246e8" in r.stdout and "meta.json" in r.stdout and "3 with problems" in r.stderr


def test_kcache_json_checksums(kcache, fixture_copy):
    """An entry kcache built records sha256s in kcache.json: a same-size change is caught. (kcache.json
    rules only while hidet's own files are absent: an entry hidet rebuilt is judged by hidet's rule.)"""
    root = fixture_copy("hidet")
    entry = root / "ops/cuda_space_0/softmax/ad252b064b266eea"
    from hashlib import sha256

    for marker in ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle"):
        (entry / marker).unlink()

    files = {n: {"size": (entry / n).stat().st_size, "sha256": sha256((entry / n).read_bytes()).hexdigest()}
             for n in ("source.cu", "task.txt")}
    (entry / "kcache.json").write_text(json.dumps({"files": files, "arch": "sm_90a", "compiler": "nvcc"}))
    assert _problems(kcache, root) == {}
    src = entry / "source.cu"
    src.write_bytes(src.read_bytes().replace(b"float", b"FLOAT", 1))
    found = _problems(kcache, root)
    assert list(found) == ["ad252b064b266eea"] and "source.cu sha256" in found["ad252b064b266eea"][0]


def test_tilelang_manifest_checksums(kcache, fixture_copy):
    root = fixture_copy("tilelang")
    kernel = next((root / "0.1.15/linux-x86_64/kernels").iterdir())
    params = kernel / "params.json"
    params.write_bytes(params.read_bytes().replace(b"a", b"b", 1))  # same size, other bytes
    cubin = next((root / "0.1.15/cuda-binaries").iterdir()) / "kernel.cubin"
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 0xFF
    cubin.write_bytes(bytes(data))
    found = _problems(kcache, root, "--layout", "tilelang")
    assert set(found) == {kernel.name, cubin.parent.name}
    assert any("params.json" in p for p in found[kernel.name])
    assert any("kernel.cubin" in p for p in found[cubin.parent.name])


def test_tilus_script_whose_program_is_gone(kcache, fixture_copy):
    root = fixture_copy("tilus")
    shutil.rmtree(root / "programs/f006237ca7a5")
    found = _problems(kcache, root)
    assert any("is gone" in p and "compiles it again" in p for p in found["1-845a0ed6"])


def test_selectors(kcache, fixture_copy):
    root = fixture_copy("hidet")
    lib = root / "ops/cuda_space_0/add/8d1f7691cdf75e90/lib.so"
    lib.write_bytes(lib.read_bytes()[:200])
    assert _problems(kcache, root, "--space", "cpu_space_0") == {}
    assert list(_problems(kcache, root, "--op", "add")) == ["8d1f7691cdf75e90"]
    r = kcache("--cache-dir", root, "verify", "--op", "softmax", "--json")
    assert r.exit_code == 0 and r.json()["checked"] == 1


def test_building_entries_are_skipped(fixture_copy):
    from kcache_cli.fs import state
    from kcache_cli.fs.locking import entry_lock

    root = fixture_copy("hidet")
    op_dir = root / "ops/cuda_space_0/add"
    tmp = op_dir / f"{state.TEMP_PREFIX}feedfacefeedface-1234"
    tmp.mkdir()
    (tmp / "source.cu").write_text("x")
    with entry_lock(root, "ops/cuda_space_0/add/feedfacefeedface"):
        result = verify_cache(root, ScanFilter())
    assert [e.hash for e in result.skipped] == ["feedfacefeedface-1234"]
    assert result.failed == ()
    result = verify_cache(root, ScanFilter())  # the lock is gone: a left-over temp directory
    assert [c.entry.hash for c in result.failed] == ["feedfacefeedface-1234"]


def test_missing_cache_is_not_an_error(kcache, tmp_path):
    env = {"KCACHE_DIR": str(tmp_path / "nothing")}  # not an explicit --cache-dir: that one must exist
    r = kcache("verify", env=env)
    assert r.exit_code == 0 and "nothing to verify" in r.stderr
    r = kcache("verify", "--json", env=env)
    assert r.exit_code == 0 and r.json()["checked"] == 0


def test_unreadable_binary_is_a_problem(kcache, fixture_copy):
    root = fixture_copy("tilelang")
    kernel = next((root / "0.1.15/linux-x86_64/kernels").iterdir())
    exe = kernel / "executable.so"
    exe.write_bytes(b"#!/bin/sh\n" + bytes(exe.stat().st_size - 10))  # same size: only the bytes tell
    manifest = json.loads((kernel / "manifest.json").read_text())
    from hashlib import sha256

    manifest["files"]["executable.so"]["sha256"] = sha256(exe.read_bytes()).hexdigest()
    (kernel / "manifest.json").write_text(json.dumps(manifest))
    found = _problems(kcache, root)
    assert any("executable.so" in p for p in found[kernel.name])


def test_verify_core_reports_progress(fixture_copy):
    root = fixture_copy("hidet")
    seen = []

    class P:
        def start(self, total):
            seen.append(("start", total))

        def advance(self, n):
            seen.append(("advance", n))

    verify_cache(root, ScanFilter(), progress=P())
    assert seen[0] == ("start", 5) and seen.count(("advance", 1)) == 5


def test_verify_help_has_example(kcache):
    for cmd in ("export", "import", "verify"):
        r = kcache(cmd, "--help")
        assert r.exit_code == 0 and "Example: kcache" in r.stdout, cmd


def test_verify_help_claims_only_the_checks_it_makes(kcache, fixture_copy):
    """hidet hashes the task in memory and never reads task.txt on load, so verify does not hold task.txt
    against the entry's name (an edited task.txt is a note in inspect): its help must not say it does."""
    root = fixture_copy("hidet")
    (root / "ops/cpu_space_0/relu/31857fe085635b31/task.txt").write_text("Task(\n  name: relu\n)")
    r = kcache("--cache-dir", root, "verify", "31857fe0")
    assert r.exit_code == 0 and "1 ok" in r.stderr, r.stdout + r.stderr
    text = " ".join(kcache("verify", "--help").stdout.split())
    assert "task.txt against the hash" not in text
    assert "every file the compiler's loader reads on a hit" in text


def test_verify_summary_groups_every_count_s_digits(kcache, fixture_copy, monkeypatch):
    """'checked 1,250 entries: 1,250 ok': each count of the summary line in the one number format."""
    import dataclasses

    from kcache_cli.ops import verify

    real = verify.verify_cache

    def many(*a, **k):  # the five real entries' checks, 250 times over
        result = real(*a, **k)
        return dataclasses.replace(result, checked=result.checked * 250)

    monkeypatch.setattr(verify, "verify_cache", many)
    r = kcache("--cache-dir", fixture_copy("hidet"), "verify")
    assert r.exit_code == 0, r.stderr
    assert "checked 1,250 entries" in r.stderr and "1,250 ok, 0 with problems" in r.stderr, r.stderr


def test_verify_after_import_of_damaged_archive_source(kcache, fixture_copy, tmp_path):
    """Corruption that a size check cannot see: export's selection reads every byte (the judgement
    verify uses), so the entry stays out unless asked for; shipped with --status partial, verify on the
    other side finds it. (tilelang checks params.json and the executable by sha256, sources by size only:
    tests/loaders/test_oracle_tilelang.py.)"""
    src = fixture_copy("tilelang")
    kernel = next((src / "0.1.15/linux-x86_64/kernels").iterdir())
    p = kernel / "params.json"
    p.chmod(0o644)
    p.write_bytes(p.read_bytes().replace(b"int", b"INT", 1))
    arc = tmp_path / "t.tar.gz"
    left = kcache("--cache-dir", src, "export", arc, "--kind", "kernel", "--json").json()
    assert left["exported"] == [] and "params.json" in left["left_out"][0]["reason"]
    assert kcache("--cache-dir", src, "export", arc, "--status", "partial").exit_code == 0
    dst = tmp_path / "dst"
    assert kcache("--cache-dir", dst, "import", arc).exit_code == 0
    r = kcache("--cache-dir", dst, "verify")
    assert r.exit_code == 1 and "params.json" in r.stdout
    assert os.path.isdir(dst)


def test_results_serialize_at_the_core(fixture_copy):
    """`verify --json` and `stats --json` come from the results' own to_json (the stable keys)."""
    from kcache_cli.catalog.scan import scan_cache
    from kcache_cli.model.records import JSON_KEYS
    from kcache_cli.ops.verify import verify_cache

    root = fixture_copy("hidet")
    lib = next(root.glob("ops/cuda_space_0/*/*/lib.so"))
    lib.write_bytes(lib.read_bytes()[:100])
    v = verify_cache(root).to_json()
    assert set(v) == {"root", "exists", "checked", "ok", "failed", "skipped_building", "fixed", "problems",
                      "lock_removal_notes"}
    assert v["failed"] == len(v["problems"]) >= 1 and v["ok"] + v["failed"] == v["checked"]
    row = v["problems"][0]
    assert set(JSON_KEYS) <= set(row) and row["status"] == "corrupt" and row["reason"] == row["problems"][0]
    s = scan_cache(root).to_json(top=2)
    assert s["entry_count"] == sum(g["entry_count"] for g in s["by_status"].values())
    assert s["size"] == sum(g["size"] for g in s["by_layout"].values()) and len(s["biggest"]) == 2
    assert s["layout"] == "hidet" and set(JSON_KEYS) <= set(s["biggest"][0])
