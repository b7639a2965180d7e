"""vLLM's torch_compile_cache. vLLM needs a GPU, so the fixture is made by tests/loaders/vllm_probe.py in
the torch venv: torch's own standalone_compile artifacts (binary and unpacked) plus the index files vLLM's
CompilerManager writes, by vLLM's rules. The loader oracle is what vLLM's InductorStandaloneAdaptor.load
does (literal_eval of the index, CompiledArtifact.load of every handle, a call); kcache's status of the
unit must agree on every damage (loads: complete; fails: partial), and `prune --broken` never plans a
unit that loads."""

from __future__ import annotations

import ast
import json
import os
import pprint
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import copy_tree, run_kcache
from loaders import recorded
from loaders.venvs import python_for

PROBE = Path(__file__).resolve().parent / "loaders" / "vllm_probe.py"
UNITS = {"0123456789": "binary", "abcdef0123": "unpacked"}


def torch_run(*args: str, inductor: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor)
    done = subprocess.run([str(python_for("torch")), str(PROBE), *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


@pytest.fixture(scope="module")
def real_made(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("vllm")
    for h10, fmt in UNITS.items():
        torch_run("make", str(base / "root"), h10, fmt, inductor=base / "inductor")
    if recorded.RECORD:
        recorded.save_tree("vllm", base / "root" / "torch_compile_cache")
    return base / "root" / "torch_compile_cache"


@pytest.fixture(scope="module")
def recorded_made(tmp_path_factory) -> Path:
    """The cache the slow run that recorded it made (tests/loaders/recorded/vllm.tar.gz), its indexes
    pointed where it now is (as if made here: kcache's `verify --fix`, which test_a_copied_cache... proves)."""
    root = recorded.extract_tree("vllm", tmp_path_factory.mktemp("vllm-recorded") / "root")
    fixed = run_kcache("--cache-dir", str(root), "verify", "--fix", "--json")
    assert fixed.exit_code == 0, fixed.stdout + fixed.stderr
    for unit in root.iterdir():
        if unit.name in UNITS:
            _age(unit)  # made long ago, as the real fixture's units are by the time its tests read them
    return root


@pytest.fixture(scope="module", params=["recorded", pytest.param("real", marks=pytest.mark.slow)])
def made(request) -> Path:
    """Fast tier: the recorded cache; slow tier: one torch makes now, too."""
    return request.getfixturevalue(f"{request.param}_made")


def loads(unit: Path, tmp_path: Path) -> dict:
    """What vLLM's load makes of the unit, in a fresh process with a fresh Inductor cache."""
    return json.loads(torch_run("load", str(unit), UNITS[unit.name], inductor=tmp_path / "ind-load"))


def _relocated_copy(made: Path, tmp_path: Path) -> Path:
    """A private copy, relocated by kcache (its indexes named the original's paths)."""
    root = copy_tree(made, tmp_path / "torch_compile_cache")
    fixed = run_kcache("--cache-dir", str(root), "verify", "--fix", "--json")
    assert fixed.exit_code == 0, fixed.stdout + fixed.stderr
    return root


@pytest.fixture
def cache(made, tmp_path) -> Path:
    return _relocated_copy(made, tmp_path)


@pytest.fixture
def real_cache(real_made, tmp_path) -> Path:
    """For the tests that run torch on the cache: the one made in this run."""
    return _relocated_copy(real_made, tmp_path)


def rows(root: Path) -> dict[str, dict]:
    r = run_kcache("--cache-dir", str(root), "ls", "--json")
    assert r.exit_code == 0, r.stderr
    return {row["hash"]: row for row in r.json()["entries"]}


def test_lists_units_and_their_key_factors(made, cache, tmp_path):
    before = rows(made)
    assert {h: (r["layout"], r["kind"], r["status"]) for h, r in before.items()} == {
        h: ("vllm", "compile", "complete") for h in UNITS}
    for h, r in before.items():
        walked = [p for p in (made / h).rglob("*") if p.is_file()]
        assert r["file_count"] == len(walked) and r["apparent_size"] == sum(p.stat().st_size for p in walked)
    moved = run_kcache("--cache-dir", str(made.parent.parent / "nowhere"), "verify")
    assert moved.exit_code == 2  # no such cache: a usage error, not a traceback
    shown = run_kcache("--cache-dir", str(cache), "inspect", "0123", "--json").json()
    assert shown["facts"]["key_factor_compiler_hash"] == "1234abcd56"
    assert shown["facts"]["index_rank_0_0_backbone"].startswith("2 artifact(s), inductor_standalone")


@pytest.mark.slow
def test_a_listed_unit_loads(real_cache, tmp_path):
    assert rows(real_cache)["0123456789"]["status"] == "complete"
    assert loads(real_cache / "0123456789", tmp_path) == {"loaded": 4, "failed": []}


@pytest.mark.slow
def test_the_recorded_cache_still_loads(recorded_made, tmp_path):
    """The recorded cache is current: today's torch loads every unit of it (else KCACHE_ORACLE_RECORD=1
    pytest -m slow tests/test_vllm.py records it anew)."""
    root = _relocated_copy(recorded_made, tmp_path)
    for h10 in UNITS:
        assert loads(root / h10, tmp_path) == {"loaded": 4, "failed": []}


def test_a_copied_cache_is_reported_moved_until_fixed(made, tmp_path):
    root = copy_tree(made, tmp_path / "copied")
    verify = run_kcache("--cache-dir", str(root), "verify", "--json")
    assert verify.exit_code == 1
    assert all("was moved or copied" in p["reason"] for p in verify.json()["problems"])
    assert run_kcache("--cache-dir", str(root), "verify", "--fix").exit_code == 0
    assert run_kcache("--cache-dir", str(root), "verify").exit_code == 0
    text = (root / "abcdef0123" / "rank_0_0" / "backbone" / "vllm_compile_cache.py").read_text()
    assert str(root) in text and str(made) not in text


def _index(unit: Path) -> Path:
    return unit / "rank_0_0" / "backbone" / "vllm_compile_cache.py"


def _artifact(unit: Path) -> Path:
    return unit / "rank_0_0" / "backbone" / "artifact_compile_range_1_8192_subgraph_1"


def dmg_index_garbage(root):
    _index(root / "0123456789").write_text("{ (1, 2: oops")
    return "0123456789"


def _age(unit: Path) -> None:
    old = time.time() - 7200
    for p in (unit, *unit.rglob("*")):
        os.utime(p, (old, old), follow_symlinks=False)


def dmg_index_missing(root):
    for p in (root / "abcdef0123").rglob("vllm_compile_cache.py"):
        p.unlink()
    return "abcdef0123"


def dmg_binary_missing(root):
    _artifact(root / "0123456789").unlink()
    return "0123456789"


def dmg_binary_truncated(root):
    a = _artifact(root / "0123456789")
    a.write_bytes(a.read_bytes()[:-100])
    return "0123456789"


def dmg_binary_flipped(root):
    a = _artifact(root / "0123456789")
    data = bytearray(a.read_bytes())
    data[len(data) // 2] ^= 0xFF
    a.write_bytes(bytes(data))
    return "0123456789"


def dmg_unpacked_aot_gone(root):
    import shutil

    shutil.move(str(_artifact(root / "abcdef0123") / "aotautograd"), str(root.parent / "aot-elsewhere"))
    return "abcdef0123"


def dmg_nothing(root):
    return "abcdef0123"


MATRIX = [dmg_index_garbage, dmg_index_missing, dmg_binary_missing, dmg_binary_truncated, dmg_binary_flipped,
          dmg_unpacked_aot_gone, dmg_nothing]


@pytest.mark.slow
@pytest.mark.parametrize("damage", MATRIX, ids=[d.__name__[4:] for d in MATRIX])
def test_damage_matrix_agrees_with_the_loader(real_cache, damage, tmp_path):
    cache = real_cache
    h10 = damage(cache)
    _age(cache / h10)  # damage long done: no vLLM process is writing it any more
    shown = run_kcache("--cache-dir", str(cache), "inspect", h10, "--json").json()
    # --deep reads every byte, as inspect does; the default judges as ls does (a flipped byte unseen)
    plan = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--deep", "--dry-run", "--json").json()
    planned = {r["hash"] for r in plan["removed"]}
    cheap = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--dry-run", "--json").json()
    listed = {r["hash"]: r["status"] for r in run_kcache("--cache-dir", str(cache), "ls", "--json").json()["entries"]}
    broken = {h for h, s in listed.items() if s in ("partial", "failed", "corrupt")}
    assert {r["hash"] for r in cheap["removed"]} == broken <= planned
    got = loads(cache / h10, tmp_path)
    print(damage.__name__, got, shown["status"], shown["reason"])
    if got["loaded"] == 4 and not got["failed"]:
        assert shown["status"] == "complete" and h10 not in planned
    else:
        assert shown["status"] == "partial" and h10 in planned
    assert planned <= {h10}


def _export_import_elsewhere(cache: Path, tmp_path: Path) -> Path:
    archive = tmp_path / "vllm.tar.gz"
    assert run_kcache("--cache-dir", str(cache), "export", str(archive)).exit_code == 0
    other = tmp_path / "elsewhere" / "torch_compile_cache"
    run = run_kcache("--cache-dir", str(other), "import", str(archive), "--json")
    assert run.exit_code == 0, run.stderr
    assert sorted(rows(other)) == sorted(UNITS)
    assert run_kcache("--cache-dir", str(other), "verify").exit_code == 0  # paths rewritten on import
    return other


def test_export_import_elsewhere_verifies(cache, tmp_path):
    _export_import_elsewhere(cache, tmp_path)


@pytest.mark.slow
def test_export_import_elsewhere_loads(real_cache, tmp_path):
    other = _export_import_elsewhere(real_cache, tmp_path)
    for h10 in UNITS:
        assert loads(other / h10, tmp_path) == {"loaded": 4, "failed": []}


def test_hostile_index_is_data_not_a_crash(cache):
    _index(cache / "0123456789").write_text("(" * 200_000)
    r = run_kcache("--cache-dir", str(cache), "ls", "--json")
    assert r.exit_code == 0
    assert {x["hash"]: x["status"] for x in r.json()["entries"]}["0123456789"] == "building"  # written just now
    _age(cache / "0123456789")
    r = run_kcache("--cache-dir", str(cache), "ls", "--json")
    assert {x["hash"]: x["status"] for x in r.json()["entries"]}["0123456789"] == "partial"
    (cache / "0123456789" / "rank_0_0" / "backbone" / "cache_key_factors.json").write_text("[" * 100_000)
    assert run_kcache("--cache-dir", str(cache), "inspect", "0123", "--json").exit_code in (0, 1)


def test_aot_compile_entries(tmp_path):
    root = tmp_path / "torch_compile_cache"
    good = root / "torch_aot_compile" / ("a" * 64) / "rank_0_0"
    good.mkdir(parents=True)
    (good / "model").write_bytes(b"serialized")
    half = root / "torch_aot_compile" / ("b" * 64) / "rank_0_0"
    half.mkdir(parents=True)
    (half / "model").write_bytes(b"")
    got = {r["hash"]: (r["kind"], r["status"]) for r in run_kcache("--cache-dir", str(root), "ls",
                                                                   "--json").json()["entries"]}
    assert got == {"a" * 64: ("aot", "complete"), "b" * 64: ("aot", "partial")}
    run = run_kcache("--cache-dir", str(root), "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0 and (good / "model").is_file() and not half.exists()


def test_hostile_handles_are_never_followed_or_rewritten_outside(tmp_path):
    root = tmp_path / "torch_compile_cache"
    local = root / "0123456789" / "rank_0_0" / "backbone"
    local.mkdir(parents=True)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not yours")
    index = {((1, 8), 0, "inductor_standalone"): ("../../../../outside.bin", str(outside)),
             ((1, 8), 1, "inductor_standalone"): ("x", "/etc/passwd")}
    text = pprint.PrettyPrinter(indent=4).pformat(index)
    (local / "vllm_compile_cache.py").write_text(text)
    old = time.time() - 7200
    for p in (root / "0123456789", *(root / "0123456789").rglob("*")):
        os.utime(p, (old, old))
    row = run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"][0]
    assert row["status"] == "partial" and "not a file name" in row["reason"]
    run_kcache("--cache-dir", str(root), "verify", "--fix")
    assert (local / "vllm_compile_cache.py").read_text() == text  # a unit with problems is not rewritten
    assert outside.read_bytes() == b"not yours"
    run = run_kcache("--cache-dir", str(root), "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0 and not (root / "0123456789").exists() and outside.read_bytes() == b"not yours"


def test_inductor_adaptor_units_need_their_fx_graphs(tmp_path):
    """vLLM's InductorAdaptor (torch < 2.8) names fx graph keys found in rank_<r>_<d>/inductor_cache/."""
    import base64
    import hashlib
    import pickle

    root = tmp_path / "torch_compile_cache"
    rank = root / "fedcba9876" / "rank_0_0"
    (rank / "backbone").mkdir(parents=True)
    data = pickle.dumps({"graph": 1}, protocol=4)
    key = "f" + "q" * 51
    graph = rank / "inductor_cache" / "fxgraph" / key[1:3] / key
    graph.mkdir(parents=True)
    (graph / base64.b32encode(hashlib.sha256(data).digest())[:51].decode().lower()).write_bytes(data)
    index = {(None, 0, "inductor"): (key, str(rank / "inductor_cache" / "xx" / "cxx.py"))}
    (rank / "backbone" / "vllm_compile_cache.py").write_text(pprint.PrettyPrinter(indent=4).pformat(index))
    (rank / "triton_cache").mkdir()
    _age(root / "fedcba9876")
    shown = run_kcache("--cache-dir", str(root), "inspect", "fedcba", "--json").json()
    assert shown["status"] == "complete", shown["reason"]
    assert shown["facts"]["nested_triton_cache"] == str(rank / "triton_cache")
    for p in graph.iterdir():
        p.unlink()
    _age(root / "fedcba9876")
    row = run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"][0]
    assert row["status"] == "partial" and key in row["reason"]


@pytest.mark.parametrize("deep", [False, True], ids=["cheap", "deep"])
def test_a_judgement_reads_only_through_the_unit_it_is_handed(cache, deep):
    """Every unit held open from one anchor is judged the same once the whole cache has moved to another
    name (its indexes, artifacts and the unpacked artifacts' Inductor entries read beneath the unit)."""
    from kcache_cli import layouts
    from kcache_cli.fs import read as fsread
    from kcache_cli.fs.entrydir import EntryDir

    aot = cache / "torch_aot_compile" / ("c" * 64) / "rank_0_0"
    aot.mkdir(parents=True)
    (aot / "model").write_bytes(b"serialized")
    layout = layouts.get("vllm")
    anchor = fsread.Anchor(cache)
    held = [(r["kind"], h, EntryDir.open(r["path"], anchor)) for h, r in rows(cache).items()]
    try:
        before = {h: layout.judge(d, kind, layout.judging(deep)) for kind, h, d in held}
        assert {kind for kind, _, _ in held} == {"compile", "aot"} and len(held) == len(UNITS) + 1
        assert all(j.status == "complete" for j in before.values()), before
        moved = cache.with_name(cache.name + "-moved")
        os.rename(cache, moved)  # every path the scan handed out now names nothing
        assert {h: layout.judge(d, kind, layout.judging(deep)) for kind, h, d in held} == before
        artifact = moved / _artifact(cache / "0123456789").relative_to(cache)
        artifact.write_bytes(artifact.read_bytes()[:-7])
        (moved / aot.relative_to(cache) / "model").write_bytes(b"")
        after = {h: layout.judge(d, kind, layout.judging(deep)).status for kind, h, d in held}
        assert after.pop("0123456789") in ("partial", "building") and after.pop("c" * 64) == "partial"
        assert set(after.values()) == {"complete"}  # the unpacked unit's own files are untouched
    finally:
        for _, _, d in held:
            d.close()
        anchor.close()


def test_explain_misses_on_a_recorded_switch_set_otherwise_here(cache, tmp_path):
    """cache_key_factors.json records VLLM_USE_STANDALONE_COMPILE=True: set to 0 here, vLLM hashes another
    unit name (a miss naming it); without vLLM a miss; with it and the switch unset, unknown, never hit."""
    exe = tmp_path / "py"

    def here(versions: dict) -> str:
        doc = {"python": "3.11", "executable": str(exe), "versions": versions}
        exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(doc)}\nEOF\n")
        exe.chmod(0o755)
        return str(exe)

    def verdicts(versions: dict, env: dict | None = None) -> dict[str, dict]:
        r = run_kcache("--cache-dir", str(cache), "--json", "explain", "--python", here(versions), env=env)
        assert r.exit_code == 0, r.stderr
        return {i["what"]: i for i in r.json()["items"] if i["kind"] == "compile"}

    assert all(v["verdict"] == "miss" and v["here"] == "not installed" for v in verdicts({"vllm": None}).values())
    off = verdicts({"vllm": "0.11.0"}, {"VLLM_USE_STANDALONE_COMPILE": "0"})
    assert set(off) == set(UNITS) and all(
        (v["verdict"], v["factor"], v["recorded"], v["here"]) == ("miss", "VLLM_USE_STANDALONE_COMPILE", "True", "0")
        for v in off.values())
    on = verdicts({"vllm": "0.11.0"}, {"VLLM_USE_STANDALONE_COMPILE": "1"})
    assert all(v["verdict"] == "unknown" for v in on.values())


def test_a_unit_whose_index_names_paths_where_nothing_is_is_moved(made, tmp_path):
    """The original gone (a cache moved, or restored from a backup): vLLM's load of the paths its index
    names fails at start-up, as the slow oracle below shows. kcache says moved (Triton's word for it): not
    complete, never removed by prune --broken, and `verify --fix` makes it complete."""
    original = copy_tree(made, tmp_path / "original")
    assert run_kcache("--cache-dir", str(original), "verify", "--fix").exit_code == 0  # it names itself
    root = copy_tree(original, tmp_path / "moved")
    shutil.rmtree(original)
    listed = run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]
    units = {e["hash"]: e for e in listed if e["kind"] == "compile"}
    assert set(units) == set(UNITS)
    for e in units.values():
        assert e["status"] == "moved", e
        assert str(original) in e["reason"] and "verify --fix" in e["reason"]
    plan = run_kcache("--cache-dir", str(root), "prune", "--broken", "--dry-run", "--json").json()
    assert not {r["hash"] for r in plan["removed"]} & set(UNITS)
    assert run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"] == listed  # never indexed
    assert run_kcache("--cache-dir", str(root), "verify", "--fix").exit_code == 0
    after = run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]
    assert {e["hash"]: e["status"] for e in after if e["kind"] == "compile"} == dict.fromkeys(UNITS, "complete")


@pytest.mark.slow
def test_vllm_fails_loading_a_moved_unit(real_made, tmp_path):
    """The oracle for the test above: the paths the index names lead nowhere, and vLLM's load fails."""
    original = copy_tree(real_made, tmp_path / "original")
    assert run_kcache("--cache-dir", str(original), "verify", "--fix").exit_code == 0
    root = copy_tree(original, tmp_path / "moved")
    shutil.rmtree(original)
    for h10 in UNITS:
        got = loads(root / h10, tmp_path)
        assert got["loaded"] == 0 and got["failed"], got


def test_a_unit_whose_index_names_no_such_artifact_elsewhere_is_moved(made, tmp_path):
    """An index naming, elsewhere, a FIFO (vLLM's open blocks at start-up), a device (its load reads what
    it yields: /dev/zero, forever) or a file of the other kind than the artifact here (a directory for a
    binary artifact, a file for an unpacked one): vLLM cannot load that path, as where nothing is. Moved,
    never complete; `verify --fix` points the index at the artifact here."""
    os.mkfifo(tmp_path / "fifo")
    elsewhere = {"0123456789": [str(tmp_path / "fifo"), "/dev/null", str(tmp_path)],
                 "abcdef0123": ["/dev/null", str(tmp_path / "fifo")]}
    (tmp_path / "file").write_bytes(b"not vLLM's")
    elsewhere["abcdef0123"].append(str(tmp_path / "file"))
    for h10, paths in elsewhere.items():
        for path in paths:
            root = copy_tree(made, tmp_path / "copy")
            index = _index(root / h10)
            handles = ast.literal_eval(index.read_text())
            index.write_text(pprint.pformat({k: (key, path) for k, (key, _) in handles.items()}))
            _age(root / h10)
            row = rows(root)[h10]
            assert row["status"] == "moved" and path in row["reason"] and "verify --fix" in row["reason"], row
            assert run_kcache("--cache-dir", str(root), "verify", "--fix").exit_code == 0
            assert rows(root)[h10]["status"] == "complete"
            shutil.rmtree(root)


def test_each_directory_of_a_unit_is_listed_once(cache, monkeypatch):
    """A unit is walked once: its usage, the index's key and its judgement (its indexes, an unpacked
    artifact's Inductor entries and the fx graphs they name) all go by that one listing of each directory
    (they listed it two or three times, the most of what a cold vLLM listing cost)."""
    from kcache_cli.catalog.scan_context import ScanContext
    from kcache_cli.fs import read as fsread
    from kcache_cli.layouts import inductor, vllm
    from kcache_cli.model.records import measure_tree

    listed: list[object] = []
    for name in ("scandir", "listdir"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, **k: listed.append(a) or _real(*a, **k))
    judged: list[str] = []  # the Inductor entries an unpacked artifact holds: each judged once
    guarded = inductor.judge_guarded
    monkeypatch.setattr(inductor, "judge_guarded", lambda d, *a: judged.append(d.path) or guarded(d, *a))
    fsread.anchor(cache)
    for unit in UNITS:
        path = str(cache / unit)
        dirs = sum(1 for _ in os.walk(path))  # os.walk lists through scandir too: counted, then dropped
        expected = measure_tree(path, print)
        listed.clear()
        warned: list[str] = []
        ctx = ScanContext(cache, warned.append)
        ctx.recording = {}
        entry = vllm._unit_entry(ctx, (path, "compile"))
        assert entry.status == "complete" and not warned, (entry, warned)
        assert len(listed) == dirs, (unit, UNITS[unit], len(listed), dirs)
        inside = [*Path(path).glob("rank_*/*/*/aotautograd/*"), *Path(path).glob("rank_*/*/*/fxgraph/*/*")]
        assert sorted(judged) == sorted(map(str, inside)) and (inside or UNITS[unit] == "binary"), judged
        judged.clear()
        assert (entry.size, entry.files, entry.apparent_size) == (expected.size, expected.files, expected.apparent)
        names = [name for name, _ in ctx.recording[path][1]]  # the key: every name beneath it, sorted per directory
        assert len(names) == sum(len(ds) + len(fs) for _, ds, fs in os.walk(path)) and names[0] == "rank_0_0"
    broken = cache / "00000000aa"  # a unit with a problem: its age is asked too (building or partial)
    shutil.copytree(cache / "0123456789", broken)
    _artifact(broken).unlink()
    dirs = sum(1 for _ in os.walk(broken))
    listed.clear()
    entry = vllm._unit_entry(ScanContext(cache, print), (str(broken), "compile"))
    assert entry.status in ("building", "partial") and "missing" in entry.reason, entry
    assert len(listed) == dirs, (len(listed), dirs)
