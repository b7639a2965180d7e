"""Triton's kernel cache (layout `triton`), on the real cache triton 3.9.0 wrote (tests/fixtures/real/triton).

The fixture was written with TRITON_CACHE_DIR=/home/kc/.triton/cache: its group files name every child by
an absolute path under that root, so here (as on any machine it is copied to) Triton would miss every
kernel until the paths are rewritten."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from kcache_cli.catalog import names
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.layouts import triton
from kcache_cli.model.records import ScanFilter

HOUR = 3600.0
# key -> (kernel, arch, bytes, files): what triton 3.9.0 wrote (see the fixture's README)
KERNELS = {
    "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA": ("add_kernel", "sm_80", 26156, 8),
    "LOZKL4OW66ML5G7PWO4EI23LW6FIRVU24FT4ZLGIYGLVKG65YUFQ": ("add_kernel", "sm_80", 38802, 8),
    "QKJDT6YVJBF6PBUBRY6ITHX2267DQCKVQW4DRRFH5NS63H4H25FA": ("add_kernel", "sm_90a", 27323, 8),
    "VHF5NYJI46Z5SH764YNBNADKGBWRZQ7ZZXWIAKML3FZVBJSTRSDQ": ("add_kernel", "sm_90a", 39969, 8),
    "WSRDZ7AW2HMXGD7PVRPZJPPD4Y55TOITD3D7EUO6Z7SMUXQ4QBRA": ("matmul_kernel", "sm_90a", 192886, 8),
    "22DX5RUZ7YPKNU74O7GAUCGIGIPAEV2FCKTGJU2B2LNOL5MZNINQ": ("softmax_kernel", "sm_80", 69481, 8),
}
ADD_90 = "QKJDT6YVJBF6PBUBRY6ITHX2267DQCKVQW4DRRFH5NS63H4H25FA"
MATMUL = "WSRDZ7AW2HMXGD7PVRPZJPPD4Y55TOITD3D7EUO6Z7SMUXQ4QBRA"
SOFTMAX = "22DX5RUZ7YPKNU74O7GAUCGIGIPAEV2FCKTGJU2B2LNOL5MZNINQ"
ORIGIN = "/home/kc/.triton/cache"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "real" / "triton" / "cache"


@pytest.fixture
def cache(fixture_copy) -> Path:
    """A writable copy of the real cache as Triton would have written it here (its group paths lead into
    the copy), its files an hour and a half old (no writer is active)."""
    root = fixture_copy("triton") / "cache"
    settle(root)
    age(root)
    return root


@pytest.fixture
def moved(fixture_copy) -> Path:
    """A copy of the real cache as it was copied: its group paths lead into /home/kc/.triton/cache."""
    root = fixture_copy("triton") / "cache"
    age(root)
    return root


def settle(root: Path, written_at: str | None = None) -> None:
    """Point every group file's child paths at this copy (or at `written_at`), as Triton writes them."""
    for grp in root.glob("*/__grp__*.json"):
        try:
            group = json.loads(grp.read_text())
        except ValueError:
            group = json.loads((FIXTURE / grp.parent.name / grp.name).read_text()) \
                if (FIXTURE / grp.parent.name).is_dir() else json.loads(
                    (FIXTURE / ADD_90 / "__grp__add_kernel.json").read_text())
        group["child_paths"] = {n: os.path.join(written_at or root, grp.parent.name, n) for n in group["child_paths"]}
        grp.write_text(json.dumps(group))


def age(path: Path, seconds: float = 1.5 * HOUR) -> None:
    """Make everything under `path` (and `path` itself) look untouched for `seconds`."""
    t = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(path):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (t, t), follow_symlinks=False)
    os.utime(path, (t, t))


def ls(kcache, root: Path, *args: str) -> dict[str, dict]:
    r = kcache("--cache-dir", root, "ls", "--json", *args)
    assert r.exit_code == 0, r.stderr
    return {e["hash"]: e for e in r.json()["entries"]}


def get_group(entry_dir: Path) -> dict[str, str] | None:
    """Triton's FileCacheManager.get_group (triton/runtime/cache.py, 3.9.0), applied literally: the
    group file parses, and the children are those whose path exists. The compiler uses the kernel
    only when the metadata file `<name>.json` is among them."""
    grp = next(entry_dir.glob("__grp__*.json"))
    with open(grp) as f:
        grp_data = json.load(f)
    child_paths = grp_data.get("child_paths", None)
    if child_paths is None:
        return None
    result = {}
    for c, p in child_paths.items():
        if os.path.exists(p):
            result[c] = p
    return result


def triton_hits(entry_dir: Path) -> bool:
    meta = next(entry_dir.glob("__grp__*.json")).name[len("__grp__"):]
    group = get_group(entry_dir) or {}
    return group.get(meta) is not None and len(group) == len(json.loads(
        next(entry_dir.glob("__grp__*.json")).read_text())["child_paths"])


# ---- where, what, how it is judged -------------------------------------------------------------

def test_fixture_listed_exactly(kcache, moved):
    """As copied here, every group leads into /home/kc/.triton/cache: Triton misses each kernel (moved)."""
    got = ls(kcache, moved)
    assert {h: (e["op"], e["space"], e["apparent_size"], e["file_count"]) for h, e in got.items()} == KERNELS
    for e in got.values():
        assert (e["layout"], e["kind"], e["target"], e["status"]) == ("triton", "kernel", "cuda", "moved")
        assert ORIGIN in e["reason"] and "verify --fix" in e["reason"]
        assert e["path"] == str(moved / e["hash"])
    r = kcache("--cache-dir", moved, "dir", "--json")
    assert r.json()["layouts"] == ["triton"]


def test_fixture_in_place_is_complete(kcache, cache):
    got = ls(kcache, cache)
    assert set(got) == set(KERNELS)
    assert {(e["status"], e["reason"]) for e in got.values()} == {("complete", None)}
    assert all(triton_hits(cache / k) for k in KERNELS)


def test_detection_needs_triton_files(tmp_path):
    root = tmp_path / "c"
    (root / ADD_90).mkdir(parents=True)  # a key-named directory alone is no evidence
    (root / "notes").mkdir()
    assert not triton.LAYOUT.detect(root) and names.layouts_of(root) == ()
    (root / ADD_90 / "add_kernel.ttir").write_text("module {}")
    assert triton.LAYOUT.detect(root) and names.layouts_of(root) == ("triton",)
    other = tmp_path / "d" / ("A" * 52)
    other.mkdir(parents=True)
    (other / "readme.txt").write_text("x")  # base32-looking name, foreign files
    assert not triton.LAYOUT.detect(other.parent)


def test_an_arch_glob_selects_every_kernel_and_warns_of_none(kcache, moved, monkeypatch):
    """Triton's archs lie in the kernels' metadata: `--space 'sm_8*'` selects by what the scan reads (never by
    the few kernels a hint reads: names.READS), says nothing of a space present, and a space absent is one
    warning naming the archs there are."""
    from kcache_cli.catalog import names

    monkeypatch.setattr(names, "READS", 1)  # a cache bigger than the hints' sample
    r = kcache("--cache-dir", moved, "ls", "--json", "--space", "sm_8*")
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    assert {e["hash"] for e in r.json()["entries"]} == {k for k, v in KERNELS.items() if v[1] == "sm_80"}
    monkeypatch.setattr(names, "READS", 1000)
    r = kcache("--cache-dir", moved, "ls", "--space", "sm_70")
    assert r.stderr.count("warning: no space 'sm_70'") == 1 and "(spaces present: sm_80, sm_90a)" in r.stderr, \
        r.stderr


def test_op_hints_and_globs_read_no_kernel_the_index_names(kcache, cache, monkeypatch):
    """A hint that an --op names nothing lists the kernel names the scan index recorded when it recorded
    every kernel present (no kernel's files listed again), else every kernel's; an op glob is matched by
    the scan as it reads each kernel, not expanded by reading every kernel first."""
    from kcache_cli.catalog import index

    monkeypatch.setattr(index, "MIN_ENTRIES", 0)
    monkeypatch.setattr(index, "RACY_SECONDS", 0.05)
    monkeypatch.setattr(names, "READS", 1)  # a cache bigger than the hints' sample
    time.sleep(0.1)
    assert kcache("--cache-dir", cache, "ls").exit_code == 0  # the index: every kernel's op recorded
    walked: list[str] = []
    real_walk = names._walk
    monkeypatch.setattr(names, "_walk", lambda root, k, *a, **kw: walked.append(k.kind) or real_walk(root, k, *a, **kw))
    r = kcache("--cache-dir", cache, "ls", "--op", "add_kernl")
    assert "no op 'add_kernl'" in r.stderr and "(ops present: add_kernel, matmul_kernel, softmax_kernel)" in r.stderr
    assert set(ls(kcache, cache, "--op", "soft*")) == set(ls(kcache, cache, "--op", "softmax_kernel", "--no-index")) \
        == {k for k, v in KERNELS.items() if v[0] == "softmax_kernel"}
    assert walked == []
    fresh = cache / ("A" * 52)  # a kernel made since, too recent to be recorded: the hint reads every kernel
    shutil.copytree(cache / SOFTMAX, fresh)
    settle(cache)
    r = kcache("--cache-dir", cache, "ls", "--op", "add_kernl")
    assert "(ops present: add_kernel, matmul_kernel, softmax_kernel)" in r.stderr and walked, r.stderr


def test_filters_and_stats(kcache, moved):
    cache = moved
    assert set(ls(kcache, cache, "--op", "add_kernel")) == {k for k, v in KERNELS.items() if v[0] == "add_kernel"}
    assert set(ls(kcache, cache, "--space", "sm_90a")) == {k for k, v in KERNELS.items() if v[1] == "sm_90a"}
    assert len(ls(kcache, cache, "--target", "cuda", "--layout", "triton")) == 6
    assert ls(kcache, cache, "--target", "hip") == {}
    assert set(ls(kcache, cache, "QKJ")) == {ADD_90}
    s = kcache("--cache-dir", cache, "stats", "--json").json()
    assert s["layout"] == "triton" and s["entry_count"] == 6
    assert s["apparent_size"] == sum(v[2] for v in KERNELS.values())
    assert s["by_op"]["add_kernel"]["entry_count"] == 4 and s["by_space"]["sm_80"]["entry_count"] == 3
    assert s["by_status"] == {"moved": {"entry_count": 6, "size": s["size"]}}


def test_partial_and_corrupt_variants(kcache, cache):
    add80 = cache / "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"
    (add80 / "__grp__add_kernel.json").unlink()  # killed before the group file
    tmp = cache / SOFTMAX / "tmp.pid_4242_0123abcd"
    tmp.mkdir()
    (tmp / "softmax_kernel.ptx").write_text("half a ptx")  # killed between a write and its rename
    cubin = cache / MATMUL / "matmul_kernel.cubin"
    cubin.write_bytes(cubin.read_bytes()[:4096])  # truncated binary
    (cache / ADD_90 / "add_kernel.llir").unlink()  # a child the group lists is gone
    empty = cache / "VHF5NYJI46Z5SH764YNBNADKGBWRZQ7ZZXWIAKML3FZVBJSTRSDQ" / "add_kernel.ptx"
    empty.write_bytes(b"")
    age(cache)
    got = ls(kcache, cache)
    assert got[add80.name]["status"] == "partial" and "__grp__" in got[add80.name]["reason"]
    assert got[add80.name]["op"] == "add_kernel" and got[add80.name]["space"] == "sm_80"
    # Triton never looks into a temp dir: the kernel is whole, the temp dir part of it (prune takes it)
    assert got[SOFTMAX]["status"] == "complete" and "tmp.pid_4242_0123abcd" not in got
    assert got[SOFTMAX]["file_count"] == KERNELS[SOFTMAX][3] + 1
    assert got[MATMUL]["status"] == "corrupt" and "truncated" in got[MATMUL]["reason"]
    # a listed path that does not exist is a miss: Triton compiles the kernel again over it
    assert got[ADD_90]["status"] == "partial" and "add_kernel.llir is missing" in got[ADD_90]["reason"]
    assert got[empty.parent.name]["status"] == "complete"  # Triton reads an empty stage as "" and hits
    assert set(ls(kcache, cache, "--status", "corrupt")) == {MATMUL}
    cubin.write_bytes(b"not an elf at all, but long enough" * 4)
    assert "not an ELF" in ls(kcache, cache)[MATMUL]["reason"]


def test_fresh_writes_are_building_not_broken(kcache, cache):
    """Within the hour a group-less entry may belong to a Triton process compiling now: it is `building`,
    which prune and clear leave alone, with a reason that names no lock (Triton takes none). A fresh temp
    dir in a whole kernel is part of it: prune leaves it, the kernel stays complete."""
    add80 = cache / "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"
    (add80 / "__grp__add_kernel.json").unlink()
    (cache / SOFTMAX / "tmp.pid_99_ff").mkdir()
    got = ls(kcache, cache)
    assert got[add80.name]["status"] == "building" and got[SOFTMAX]["status"] == "complete"
    r = kcache("--cache-dir", cache, "prune", "--yes", "--broken", "--json")
    assert r.exit_code == 0 and r.json()["removed"] == []
    assert add80.is_dir() and (cache / SOFTMAX / "tmp.pid_99_ff").is_dir()
    r = kcache("--cache-dir", cache, "clear", "--all", "--yes", "--json")
    why = {s["hash"]: s["why"] for s in r.json()["skipped"]}
    assert "lock" not in why[add80.name] and "Triton process" in why[add80.name]
    assert add80.is_dir()
    assert {e["hash"] for e in r.json()["removed"]} == set(KERNELS) - {add80.name}


def test_unparseable_metadata_is_corrupt_and_group_partial(kcache, cache):
    """Triton's get_group treats a group that does not parse as a miss (it compiles again and replaces
    it: partial); a hit whose metadata does not parse fails on every lookup (corrupt)."""
    (cache / ADD_90 / "add_kernel.json").write_text('{"name": "add_kernel", "target": ')  # cut short
    (cache / SOFTMAX / "__grp__softmax_kernel.json").write_text("")
    age(cache)
    got = ls(kcache, cache)
    assert got[ADD_90]["status"] == "corrupt" and "add_kernel.json is not Triton's metadata" in got[ADD_90]["reason"]
    assert got[ADD_90]["space"] is None and got[ADD_90]["op"] == "add_kernel"
    assert got[SOFTMAX]["status"] == "partial" and "does not parse" in got[SOFTMAX]["reason"]
    r = kcache("--cache-dir", cache, "prune", "--yes", "--broken", "--json")
    assert {x["hash"] for x in r.json()["removed"]} == {ADD_90, SOFTMAX}


def test_a_group_file_kcache_may_not_read_is_unreadable_not_corrupt(cache, monkeypatch):
    """As the suite runs as root, a failed read is simulated for one group file."""
    from kcache_cli.model.terms import UNREADABLE

    denied = str(cache / ADD_90 / "__grp__add_kernel.json")
    real = triton._Listing.read

    def read(self, path, limit):
        if path == denied:
            raise PermissionError(13, "Permission denied", path)
        return real(self, path, limit)
    monkeypatch.setattr(triton._Listing, "read", read)
    got = {e.hash: e for e in scan_cache(cache).entries}
    assert got[ADD_90].status == UNREADABLE and "permission denied" in (got[ADD_90].reason or "")
    assert {e.status for h, e in got.items() if h != ADD_90} == {"complete"}


def test_single_file_entries_are_complete(kcache, cache):
    """The driver's launcher module and autotuner results live in key dirs without a group file."""
    mod = cache / ("M" * 52)
    mod.mkdir()
    (mod / "cuda_utils.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF" + b"\0" * 100)
    tune = cache / ("T" * 52)
    tune.mkdir()
    (tune / "matmul_kernel.autotune.json").write_text(json.dumps({"key": [1], "configs_timings": [  # as 3.9 writes it
        [{"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_ctas": 1, "num_stages": 3, "maxnreg": None}, [0.5]]]}))
    age(cache)
    got = ls(kcache, cache)
    assert (got[mod.name]["kind"], got[mod.name]["op"], got[mod.name]["target"], got[mod.name]["status"]) == \
        ("binary", "cuda_utils", "cuda", "complete")
    assert (got[tune.name]["op"], got[tune.name]["status"]) == ("matmul_kernel", "complete")


@pytest.mark.parametrize("timings", [
    [[{"kwargs": [64]}, [0.5]]],  # Config(**c): kwargs not a map, "'list' object is not a mapping"
    [[{"kwargs": None}, [0.5]]],
    [[{"kwargs": {"BLOCK": [64]}}, [0.5]]],  # Config's hash: "unhashable type: 'list'"
    [[{"kwargs": {"BLOCK": 64}, "num_warps": [4]}, [0.5]]],
    [[{"kwargs": {"BLOCK": 64}}, [0.5]], [{"kwargs": {"BLOCK": 128}}, "fast"]],  # min(): '<' not supported
])
def test_autotuner_results_triton_raises_on_are_corrupt(kcache, cache, timings):
    """check_disk_cache makes each config a Config (kwargs a map), keys a dict by it (hashed: every value
    hashable) and takes the min of the timings (comparable): Triton 3.9 raised TypeError on each of these at
    every call (tests/loaders/probe_triton_autotune.py), and never writes the file again."""
    tune = cache / ("T" * 52)
    tune.mkdir()
    (tune / "matmul_kernel.autotune.json").write_text(json.dumps({"key": [1], "configs_timings": timings}))
    age(cache)
    got = ls(kcache, cache)[tune.name]
    assert got["status"] == "corrupt" and "configs_timings" in got["reason"], got


# ---- inspect, log, completion --------------------------------------------------------------------

def test_inspect(kcache, moved):
    cache = moved
    d = kcache("--cache-dir", cache, "inspect", MATMUL[:10], "--json").json()
    assert d["op"] == "matmul_kernel" and d["status"] == "moved" and d["archs"] == ["sm_90a"]
    facts = d["facts"]
    assert facts["kernel"] == "matmul_kernel" and facts["target"] == "cuda sm_90a"
    assert (facts["num_warps"], facts["num_stages"], facts["num_ctas"]) == ("4", "3", "1")
    assert facts["shared_memory"] == "8192 bytes" and facts["triton_version"] == "3.9.0"
    assert facts["group_file"] == (f"__grp__matmul_kernel.json: 7 child paths: 7 into a copy of it under {ORIGIN}; "
                                   "`kcache verify --fix` rewrites them")
    [b] = d["binaries"]
    assert b["format"] == "cubin" and b["archs"] == ["sm_90a"] and b["symbols"] == ["matmul_kernel"]
    assert {f["name"]: f["size"] for f in d["files"]}["matmul_kernel.cubin"] == 38264
    assert len(d["files"]) == 8
    text = kcache("--cache-dir", cache, "inspect", SOFTMAX).stdout
    assert "softmax_kernel.cubin" in text and "sm_80" in text and "num_warps" in text


def test_log_says_there_is_none(kcache, cache):
    r = kcache("--cache-dir", cache, "log", ADD_90)
    assert r.exit_code == 1 and r.stdout == ""
    line, = r.stderr.strip().splitlines()
    assert line.startswith("Error: Triton keeps no compile log") and "add_kernel.ttir" in line
    assert str(cache / ADD_90) in line


def test_completion_of_kernel_names(kcache, cache):
    assert names.op_places(cache) == {"add_kernel": ("triton",), "matmul_kernel": ("triton",),
                                      "softmax_kernel": ("triton",)}
    assert [(e.hash, e.op) for e in names.entries(cache, "WS")] == [(MATMUL, "matmul_kernel")]
    assert sorted(e.hash for e in names.entries(cache, ops=["add_kernel"])) == \
        sorted(k for k, v in KERNELS.items() if v[0] == "add_kernel")
    scanned = scan_cache(cache).entries
    assert sorted((e.layout, e.kind, e.hash, e.op) for e in names.entries(cache)) == \
        sorted((e.layout, e.kind, e.hash, e.op) for e in scanned)


def test_tab_completes_kernel_names_and_keys(kcache, cache):
    def complete(line: str) -> list[tuple[str, str]]:
        run = kcache(env={"_KCACHE_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                          "_TYPER_COMPLETE_ARGS": line})
        assert run.exit_code == 0 and run.stderr == ""
        return [tuple(ln.split("\t", 1)) for ln in run.stdout.splitlines() if ln]  # type: ignore[misc]

    assert complete(f"kcache --cache-dir {cache} ls --op ") == [
        ("add_kernel", "triton"), ("matmul_kernel", "triton"), ("softmax_kernel", "triton")]
    assert complete(f"kcache --cache-dir {cache} clear --op so") == [("softmax_kernel", "triton")]
    assert complete(f"kcache --cache-dir {cache} inspect WS") == [(MATMUL, "matmul_kernel")]
    assert ("triton", "<base32 key>/ per kernel") in complete(f"kcache --cache-dir {cache} ls --layout ")


# ---- prune, clear ----------------------------------------------------------------------------------

def test_prune_removes_stale_leftovers_and_broken(kcache, cache):
    tmp = cache / SOFTMAX / "tmp.pid_4242_0123abcd"
    tmp.mkdir()
    (tmp / "softmax_kernel.ptx").write_text("half")
    cubin = cache / MATMUL / "matmul_kernel.cubin"
    cubin.write_bytes(cubin.read_bytes()[:100])
    age(cache)
    r = kcache("--cache-dir", cache, "prune", "--yes", "--json")  # no --broken: only the leftover
    assert r.exit_code == 0, r.stderr
    assert [(x["what"], x["removed_path"]) for x in r.json()["removed"]] == [("temp", str(tmp))]
    assert not tmp.exists() and (cache / SOFTMAX / "softmax_kernel.cubin").is_file()
    assert ls(kcache, cache)[SOFTMAX]["status"] == "complete"  # whole again once the leftover is gone
    r = kcache("--cache-dir", cache, "prune", "--yes", "--broken", "--json")
    assert [x["hash"] for x in r.json()["removed"]] == [MATMUL]
    assert not (cache / MATMUL).exists() and len(ls(kcache, cache)) == 5


def test_prune_never_takes_a_fresh_leftover(kcache, cache):
    tmp = cache / SOFTMAX / "tmp.pid_1_aa"
    tmp.mkdir()
    (tmp / "x.ptx").write_text("being written")
    r = kcache("--cache-dir", cache, "prune", "--yes", "--json")
    assert r.json()["removed"] == [] and tmp.is_dir()
    assert ls(kcache, cache)[SOFTMAX]["status"] == "complete"


def test_clear_and_prune_by_size_and_age(kcache, cache):
    r = kcache("--cache-dir", cache, "clear", "--op", "add_kernel", "--space", "sm_80", "--yes", "--json")
    assert r.exit_code == 0 and r.json()["entry_count"] == 2
    assert set(ls(kcache, cache)) == set(KERNELS) - {k for k, v in KERNELS.items() if v[:2] == ("add_kernel", "sm_80")}
    r = kcache("--cache-dir", cache, "prune", "--yes", "--max-size", "200K", "--json")
    assert r.exit_code == 0 and r.json()["size_after"] <= 200_000
    r = kcache("--cache-dir", cache, "prune", "--yes", "--older-than", "1h", "--json")
    assert ls(kcache, cache) == {} and os.listdir(cache) == [".kcache"]


# ---- relocation: export, import, verify --fix --------------------------------------------------

def test_verify_reports_moved_groups_and_fix_rewrites_them(kcache, moved):
    cache = moved
    r = kcache("--cache-dir", cache, "verify", "--json")
    assert r.exit_code == 1
    data = r.json()
    assert data["failed"] == 6 and data["fixed"] == []
    for p in data["problems"]:
        assert p["status"] == "moved"  # the files are whole; where they point is the problem
        assert [x for x in p["problems"] if ORIGIN in x and "verify --fix" in x] == p["problems"][:1]
        assert len(p["problems"]) == 1
    assert not any(triton_hits(cache / k) for k in KERNELS)
    r = kcache("--cache-dir", cache, "verify", "--fix", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert len(r.json()["fixed"]) == 6 and r.json()["failed"] == 0
    for k in KERNELS:
        assert triton_hits(cache / k)
        assert not any(n.startswith("tmp.pid_") for n in os.listdir(cache / k))
    assert kcache("--cache-dir", cache, "verify").exit_code == 0
    assert {e["status"] for e in ls(kcache, cache).values()} == {"complete"}


def test_relative_child_paths_are_a_moved_cache_fix_makes_absolute(kcache, moved):
    """Under a relative TRITON_CACHE_DIR Triton writes child paths relative to where it ran
    (`triton-cache/<key>/<name>`): found only from there. The day's "one other root" rule took them for
    paths led astray (partial: export refused them); they are a moved copy, which verify --fix makes
    absolute (the slow round trip runs the real Triton on it)."""
    import json

    for grp in moved.glob("*/__grp__*.json"):
        doc = json.loads(grp.read_text())
        doc["child_paths"] = {n: f"triton-cache/{grp.parent.name}/{n}" for n in doc["child_paths"]}
        grp.write_text(json.dumps(doc))
    assert {e["status"] for e in ls(kcache, moved).values()} == {"moved"}
    assert kcache("--cache-dir", moved, "verify", "--fix").exit_code == 0
    assert {e["status"] for e in ls(kcache, moved).values()} == {"complete"}


def test_verify_fix_says_how_many_entries_it_rewrote(kcache, moved):
    r = kcache("--cache-dir", moved, "verify", "--fix")
    assert r.exit_code == 0 and "6 ok, 0 with problems, rewrote the paths of 6 entries" in r.stderr, r.stderr
    r = kcache("--cache-dir", moved, "verify", "--fix")
    assert r.exit_code == 0 and r.stderr.rstrip().endswith("--fix changed nothing"), r.stderr


def test_verify_fix_leaves_broken_entries_broken(kcache, moved):
    cache = moved
    (cache / ADD_90 / "add_kernel.llir").unlink()
    r = kcache("--cache-dir", cache, "verify", "--fix", "--json")
    assert r.exit_code == 1 and [p["hash"] for p in r.json()["problems"]] == [ADD_90]
    assert ORIGIN in (cache / ADD_90 / "__grp__add_kernel.json").read_text()  # not rewritten: it is corrupt



@pytest.mark.parametrize("damage", ["truncated", "fifo"])
def test_verify_fix_checks_a_moved_kernel_again_once_its_paths_lead_here(kcache, moved, damage):
    """A moved kernel is judged no further than its group file's paths (Triton misses it there): its cubin
    cut short, or a FIFO, shows only once they lead here. `verify --fix` rewrites them and checks the
    kernel again: a problem (exit 1), not "ok", as the next verify and ls say too."""
    cubin = next((moved / ADD_90).glob("*.cubin"))
    if damage == "truncated":
        cubin.write_bytes(cubin.read_bytes()[:100])
    else:
        cubin.unlink()
        os.mkfifo(cubin)
    r = kcache("--cache-dir", moved, "verify", "--fix", "--json")
    assert r.exit_code == 1, r.stdout
    assert [(p["hash"], p["status"]) for p in r.json()["problems"]] == [
        (ADD_90, "corrupt" if damage == "truncated" else "unreadable")]
    assert kcache("--cache-dir", moved, "verify").exit_code == 1


def test_export_import_under_another_root_is_a_triton_hit(kcache, cache, tmp_path):
    archive = tmp_path / "triton.tar.zst"
    r = kcache("--cache-dir", cache, "export", archive, "--json")
    assert r.exit_code == 0, r.stderr
    assert len(r.json()["exported"]) == 6
    new_root = tmp_path / "elsewhere" / ".triton" / "cache"
    r = kcache("--cache-dir", new_root, "import", archive, "--json")
    assert r.exit_code == 0, r.stderr
    assert [e["action"] for e in r.json()["entries"]] == ["import"] * 6
    real = os.path.realpath(new_root)
    for key in KERNELS:
        entry = new_root / key
        group = get_group(entry)  # Triton's own rule, literally
        listed = json.loads(next(entry.glob("__grp__*.json")).read_text())["child_paths"]
        assert group is not None and group == listed and len(group) == 7  # every file but the group itself
        for child, path in group.items():
            assert os.path.exists(path) and os.path.commonpath([real, path]) == real
            assert path == os.path.join(real, key, child)
        assert not any(n.startswith("tmp.pid_") for n in os.listdir(entry))
    # every other byte came over unchanged
    for key in KERNELS:
        for f in (cache / key).iterdir():
            if not f.name.startswith("__grp__"):
                assert (new_root / key / f.name).read_bytes() == f.read_bytes()
    assert kcache("--cache-dir", new_root, "verify").exit_code == 0
    again = kcache("--cache-dir", new_root, "import", archive, "--json").json()
    assert {e["action"] for e in again["entries"]} == {"skip"}


def test_import_replaces_incomplete_and_dry_run_writes_nothing(kcache, moved, tmp_path):
    cache = moved
    archive = tmp_path / "t.tar.gz"
    assert kcache("--cache-dir", cache, "export", archive).exit_code == 0
    dest = tmp_path / "dest"
    shutil.copytree(cache, dest)
    settle(dest)  # a cache Triton wrote there: whole entries are skipped
    (dest / MATMUL / "matmul_kernel.cubin").write_bytes(b"")
    r = kcache("--cache-dir", dest, "import", archive, "--dry-run", "--json")
    assert r.exit_code == 0 and (dest / MATMUL / "matmul_kernel.cubin").stat().st_size == 0
    r = kcache("--cache-dir", dest, "import", archive, "--json")
    actions = {e["hash"]: e["action"] for e in r.json()["entries"]}
    assert actions[MATMUL] == "replace" and list(actions.values()).count("skip") == 5
    assert (dest / MATMUL / "matmul_kernel.cubin").stat().st_size == 38264 and triton_hits(dest / MATMUL)


def test_export_leaves_out_broken_and_in_flight(kcache, cache, tmp_path):
    (cache / ADD_90 / "__grp__add_kernel.json").unlink()
    r = kcache("--cache-dir", cache, "export", tmp_path / "a.tar", "--json")
    assert r.exit_code == 0
    assert ADD_90 not in {e["hash"] for e in r.json()["exported"]} and len(r.json()["exported"]) == 5


def test_sources_only_leaves_triton_kernels_out(kcache, cache, tmp_path):
    """Without its cubin a kernel whose group lists one makes Triton fail: none go."""
    r = kcache("--cache-dir", cache, "export", tmp_path / "s.tar", "--sources-only", "--json")
    # an empty archive is refused (issue 25): none written, a warning, and the JSON says what was left out;
    # nothing to export is nothing to do (exit 0), as an empty selection is
    assert r.exit_code == 0 and r.json()["exported"] == [] and r.json()["archive"] is None
    assert not (tmp_path / "s.tar").exists() and "no archive written" in r.stderr
    assert {x["relpath"] for x in r.json()["left_out"]} == set(KERNELS)
    assert all("--sources-only" in x["reason"] for x in r.json()["left_out"])


def test_import_rejects_a_triton_entry_in_the_wrong_place(tmp_path):
    from kcache_cli.archive import entry_path_problem

    assert entry_path_problem("triton", "kernel", ADD_90) is None
    assert entry_path_problem("triton", "kernel", f"{ADD_90}/{ADD_90}") is not None
    assert entry_path_problem("triton", "kernel", "ops") is not None
    assert entry_path_problem("triton", "op", ADD_90) is not None


def test_relocate_never_points_outside_the_entry(tmp_path):
    entry = tmp_path / "root" / ADD_90
    entry.mkdir(parents=True)
    (entry / "add_kernel.json").write_text("{}")
    hostile = {"child_paths": {"add_kernel.json": "/etc/passwd", "../../escape": "/etc/shadow", "x/y": "/tmp/z"}}
    (entry / "__grp__add_kernel.json").write_text(json.dumps(hostile))
    assert triton.relocate(str(entry), str(entry)) == 1
    fixed = json.loads((entry / "__grp__add_kernel.json").read_text())
    assert fixed == {"child_paths": {"add_kernel.json": str(entry / "add_kernel.json")}}
    assert triton.relocate(str(entry), str(entry)) == 0  # already right: untouched
    assert sorted(os.listdir(entry)) == ["__grp__add_kernel.json", "add_kernel.json"]


def test_verify_fix_never_writes_through_a_key_dir_swapped_for_a_link(moved, tmp_path):
    """Between verify's scan and its --fix, a key directory is swapped for a link to a copy of it
    elsewhere: the rewrite refuses, and nothing outside the cache is written (not even a temp dir)."""
    cache = moved
    from kcache_cli.fs import read as fsread
    from kcache_cli.ops.verify import verify_cache

    outside = tmp_path / "outside"
    shutil.copytree(cache / ADD_90, outside)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    real = triton.relocate

    def swap_then_relocate(src: str, dest: str, root=None) -> int:
        if os.path.basename(src) == ADD_90:
            shutil.rmtree(src)
            os.symlink(outside, src)
        return real(src, dest, root)

    triton.relocate = swap_then_relocate  # the layout's hook calls the module's function
    try:
        result = verify_cache(cache, fix=True)
    finally:
        triton.relocate = real
    assert [e.hash for e, _ in result.fix_errors] == [ADD_90]
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
    assert len(result.fixed) == 5
    fsread.anchor(cache)  # and called directly, on the link: refused the same way
    with pytest.raises(OSError):
        real(str(cache / ADD_90), str(cache / ADD_90), cache)
    with pytest.raises(OSError):  # and with no root to open it from
        real(str(cache / ADD_90), str(cache / ADD_90))
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_a_reader_never_sees_half_a_group_file(moved):
    """relocate replaces a group file atomically: Triton reading it meanwhile gets the old or the new one."""
    cache = moved
    import threading

    entry = cache / MATMUL
    grp = entry / "__grp__matmul_kernel.json"
    seen: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                with open(grp) as f:
                    seen.append(json.load(f)["child_paths"]["matmul_kernel.cubin"])
        except BaseException as exc:  # half a file, or no file at all
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            assert triton.relocate(str(entry), str(cache / f"r{i}" / MATMUL)) == 1
    finally:
        stop.set()
        reader.join()
    assert errors == [] and len(seen) > 0
    allowed = {f"{ORIGIN}/{MATMUL}/matmul_kernel.cubin"} | {str(cache / f"r{i}" / MATMUL / "matmul_kernel.cubin")
                                                            for i in range(200)}
    assert set(seen) <= allowed
    assert not any(n.startswith("tmp.pid_") for n in os.listdir(entry))


def test_dir_all_and_triton_rule(kcache, cache, monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_HOME", raising=False)
    assert triton.LAYOUT.default_root()[0] == Path.home() / ".triton" / "cache"
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "th"))
    assert triton.LAYOUT.default_root()[0] == tmp_path / "th" / ".triton" / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert triton.LAYOUT.default_root() == (cache, "TRITON_CACHE_DIR environment variable")
    rows = {r["cache"]: r for r in kcache("dir", "--all", "--json").json()["caches"]}
    assert rows["triton"]["path"] == str(cache) and rows["triton"]["layouts"] == ["triton"]
    assert rows["triton"]["entry_count"] == 6


def test_symlinked_root_is_not_moved_and_a_symlinked_child_is_read_as_triton_reads_it(kcache, moved, tmp_path):
    """Triton opens a child through a link (os.path.exists, open): so does the judgement, never a FIFO (a link
    to one leaves the kernel unjudged: unreadable)."""
    cache = moved
    assert kcache("--cache-dir", cache, "verify", "--fix").exit_code == 0
    alias = tmp_path / "alias"
    alias.symlink_to(cache)  # Triton reached through another path still finds every child
    r = kcache("--cache-dir", alias, "verify", "--json")
    assert r.exit_code == 0 and r.json()["failed"] == 0
    secret = tmp_path / "secret.cubin"
    secret.write_bytes(b"\x7fELF" + b"s" * 100)
    cubin = cache / SOFTMAX / "softmax_kernel.cubin"
    good = tmp_path / "good.cubin"
    good.write_bytes(cubin.read_bytes())
    cubin.unlink()
    cubin.symlink_to(secret)  # a link to a broken binary: Triton loads it, broken
    got = ls(kcache, cache)[SOFTMAX]
    assert got["status"] == "corrupt" and "truncated" in got["reason"]
    cubin.unlink()
    cubin.symlink_to(good)  # a link to a good one: Triton hits
    assert ls(kcache, cache)[SOFTMAX]["status"] == "complete"
    assert kcache("--cache-dir", cache, "inspect", SOFTMAX, "--json").json()["status"] == "complete"
    cubin.unlink()
    os.mkfifo(tmp_path / "fifo")
    cubin.symlink_to(tmp_path / "fifo")  # never opened for reading: no hang
    got = ls(kcache, cache)[SOFTMAX]
    assert got["status"] == "unreadable", got
    assert got["reason"] == "softmax_kernel.cubin is a symlink to a FIFO, not a regular file (Triton opens it; " \
                            "kcache never does)", got
    cubin.unlink()
    cubin.symlink_to(tmp_path / "gone.cubin")  # dangling: a miss, Triton compiles again
    assert ls(kcache, cache)[SOFTMAX]["status"] == "partial"


def test_a_symlinked_group_file_is_read_as_triton_reads_it_and_never_rewritten(kcache, cache, tmp_path):
    """Triton opens `__grp__<name>.json` through a symlink (get_group: os.path.exists, open): the judgement
    reads it so too, and the reason says it is a link and where it leads; `verify --fix` never writes
    through one, so a link to a moved group is a miss Triton compiles over (replacing the link), not
    `moved`."""
    grp = cache / ADD_90 / "__grp__add_kernel.json"
    kept = tmp_path / "kept.json"
    kept.write_bytes(grp.read_bytes())
    grp.unlink()
    grp.symlink_to(kept)  # a link to a good group: Triton hits (the oracle's "a link to a good copy")
    assert ls(kcache, cache)[ADD_90]["status"] == "complete"
    fact = kcache("--cache-dir", cache, "inspect", ADD_90, "--json").json()["facts"]["group_file"]
    assert f"a symlink to {kept}" in fact and "all in this entry" in fact
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    grp.unlink()
    grp.symlink_to(passwd)  # Triton reads it, json.load fails: a miss
    got = ls(kcache, cache)[ADD_90]
    assert got["status"] == "partial", got
    assert got["reason"].startswith(f"__grp__add_kernel.json (a symlink to {passwd}, which Triton follows) does "
                                    "not parse: Triton misses the kernel"), got
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps({"child_paths": {n: f"{ORIGIN}/{ADD_90}/{n}" for n in os.listdir(cache / ADD_90)
                                                 if not n.startswith("__grp__")}}))
    before = moved.read_bytes()
    grp.unlink()
    grp.symlink_to(moved)  # a moved group behind a link: --fix cannot mend it, Triton compiles over it
    r = kcache("--cache-dir", cache, "verify", "--fix", "--json")
    assert r.exit_code == 1 and r.json()["fixed"] == [], r.stdout
    [problem] = r.json()["problems"]
    assert problem["status"] == "partial" and ORIGIN in problem["reason"], problem
    assert "never rewrites a file through a symlink" in problem["reason"] and len(problem["problems"]) == 1
    assert grp.is_symlink() and moved.read_bytes() == before  # nothing written, here or there
    r = kcache("--cache-dir", cache, "verify", "--fix")
    assert "--fix changed nothing" in r.stderr and "rewrote" not in r.stderr
    fact = kcache("--cache-dir", cache, "inspect", ADD_90, "--json").json()["facts"]["group_file"]
    assert f"7 child paths: 7 into a copy of it under {ORIGIN}" in fact
    assert "never rewrites a file through a link" in fact
    assert "verify --fix` rewrites them" not in fact
    grp.unlink()
    grp.symlink_to(tmp_path)  # a directory: Triton's open fails, a miss
    assert "leads to a directory" in ls(kcache, cache)[ADD_90]["reason"]
    os.mkfifo(tmp_path / "fifo")
    grp.unlink()
    grp.symlink_to(tmp_path / "fifo")  # never opened by kcache; Triton's open blocks on every lookup: unjudged
    got = ls(kcache, cache)[ADD_90]
    assert got["status"] == "unreadable" and "__grp__add_kernel.json is a symlink to a FIFO" in got["reason"], got
    grp.unlink()
    grp.symlink_to(tmp_path / "gone.json")
    got = ls(kcache, cache)[ADD_90]
    assert got["status"] == "partial" and f"a symlink to {tmp_path / 'gone.json'}, which leads to no file" \
        in got["reason"], got


def redirect(entry_dir: Path, paths: dict[str, str]) -> None:
    """Point some child paths of the entry's group file elsewhere."""
    grp = next(entry_dir.glob("__grp__*.json"))
    group = json.loads(grp.read_text())
    group["child_paths"].update(paths)
    grp.write_text(json.dumps(group))


def test_child_paths_led_astray_are_no_moved_cache_and_inspect_counts_them(kcache, moved, tmp_path):
    """Moved means every child path names this key's same-named file under one other root. A group that
    sends some children elsewhere (another directory, /etc/passwd) is no moved cache: Triton misses it while
    a path leads nowhere (partial, the paths named; `--fix` leaves it), and inspect counts each place."""
    other = tmp_path / "victim"
    other.mkdir()
    for n in ("secret", "other"):
        (other / n).write_text(f"{n}\n")
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    redirect(moved / ADD_90, {"add_kernel.ttir": str(passwd), "add_kernel.llir": str(other / "secret"),
                              "add_kernel.source": str(other / "other")})
    before = (moved / ADD_90 / "__grp__add_kernel.json").read_bytes()
    row = ls(kcache, moved)[ADD_90]
    assert row["status"] == "partial", row
    assert row["reason"] == (
        "__grp__add_kernel.json does not point into one moved copy of this entry: 4 of its 7 child paths lead to "
        f"no file (add_kernel.ttgir -> {ORIGIN}/{ADD_90}/add_kernel.ttgir and 3 more) and 3 to files outside this "
        f"entry (add_kernel.source -> {other / 'other'} and 2 more): Triton misses the kernel and compiles it again")
    d = kcache("--cache-dir", moved, "inspect", ADD_90, "--json").json()
    assert (d["status"], d["reason"]) == ("partial", row["reason"])
    assert d["facts"]["group_file"] == (f"__grp__add_kernel.json: 7 child paths: 4 into a copy of it under {ORIGIN}, "
                                        f"3 elsewhere (add_kernel.source -> {other / 'other'} and 2 more)")
    r = kcache("--cache-dir", moved, "verify", "--fix", "--json")
    assert ADD_90 not in {e["hash"] for e in r.json()["fixed"]}
    assert [p["status"] for p in r.json()["problems"] if p["hash"] == ADD_90] == ["partial"]
    assert (moved / ADD_90 / "__grp__add_kernel.json").read_bytes() == before
    # two roots, every file here: no one cache moved either
    redirect(moved / ADD_90, {n: f"{ORIGIN}/{ADD_90}/{n}" for n in ("add_kernel.ttir", "add_kernel.llir")}
             | {"add_kernel.source": f"/srv/cache/{ADD_90}/add_kernel.source"})
    row = ls(kcache, moved)[ADD_90]
    assert row["status"] == "partial" and "7 of its 7 child paths lead to no file" in row["reason"], row
    fact = kcache("--cache-dir", moved, "inspect", ADD_90, "--json").json()["facts"]["group_file"]
    assert fact == ("__grp__add_kernel.json: 7 child paths: 1 into a copy of it under /srv/cache, 6 into a copy of it "
                    f"under {ORIGIN}")  # in the group's order


def test_child_paths_that_lead_to_other_files_are_what_triton_loads(kcache, cache, tmp_path):
    """Every child path exists: Triton loads what they name (CompiledKernel: the binary is the child whose
    PATH ends in .cubin, every other one is read as text). kcache judges those files, and verify names the
    paths and rewrites them to this entry's own files."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes").write_text("not IR at all\n")
    shutil.copy(cache / ADD_90 / "add_kernel.llir", elsewhere / "add_kernel.llir")
    redirect(cache / ADD_90, {"add_kernel.ttir": str(elsewhere / "notes"),
                              "add_kernel.llir": str(elsewhere / "add_kernel.llir")})
    assert ls(kcache, cache)[ADD_90]["status"] == "complete"  # Triton hits, reading those files
    fact = kcache("--cache-dir", cache, "inspect", ADD_90, "--json").json()["facts"]["group_file"]
    assert fact == (f"__grp__add_kernel.json: 7 child paths: 5 in this entry, 2 elsewhere (add_kernel.ttir -> "
                    f"{elsewhere / 'notes'} and 1 more); `kcache verify --fix` rewrites them")
    r = kcache("--cache-dir", cache, "verify", "--json")
    [p] = r.json()["problems"]
    assert p["status"] == "complete" and p["problems"] == [
        "__grp__add_kernel.json points 2 of its 7 child paths outside this entry, not into a copy of it "
        f"(add_kernel.ttir -> {elsewhere / 'notes'} and 1 more): Triton reads those files, not this entry's, until "
        "`kcache verify --fix` rewrites the paths"]
    (elsewhere / "notes").write_bytes(b"\xff\xfe not utf-8")  # read_text fails: on every lookup
    assert ls(kcache, cache)[ADD_90]["status"] == "corrupt"  # ls reads a path led astray, whatever its mtime
    (elsewhere / "notes").write_text("text again\n")
    assert kcache("--cache-dir", cache, "verify", "--fix").exit_code == 0
    assert triton_hits(cache / ADD_90) and ls(kcache, cache)[ADD_90]["status"] == "complete"
    shutil.copy(cache / ADD_90 / "add_kernel.cubin", elsewhere / "kernel.bin")
    redirect(cache / ADD_90, {"add_kernel.cubin": str(elsewhere / "kernel.bin")})  # no path ends in .cubin
    row = ls(kcache, cache)[ADD_90]
    assert row["status"] == "corrupt" and "whose name does not end in .cubin" in row["reason"], row


def test_arch_from_metadata():
    assert triton.arch_of({"target": {"backend": "cuda", "arch": 80}}) == ("cuda", "sm_80")
    assert triton.arch_of({"target": {"backend": "cuda", "arch": 90}}) == ("cuda", "sm_90a")
    assert triton.arch_of({"target": {"backend": "cuda", "arch": 100}}) == ("cuda", "sm_100a")
    assert triton.arch_of({"target": {"backend": "hip", "arch": "gfx942", "warp_size": 64}}) == ("hip", "gfx942")
    assert triton.arch_of({"target": "cuda"}) == (None, None) and triton.arch_of(None) == (None, None)


def test_a_hip_kernel_is_listed_by_its_target_and_arch(kcache, cache):
    """An AMD entry as Triton's hip backend writes it (.amdgcn, .hsaco), made from a copy of a real one."""
    key = "H" * 52
    src, dst = cache / SOFTMAX, cache / key
    dst.mkdir()
    children = {}
    for f in src.iterdir():
        if f.name.startswith("__grp__"):
            continue
        name = f.name.replace(".cubin", ".hsaco").replace(".ptx", ".amdgcn")
        data = f.read_bytes()
        if name == "softmax_kernel.json":
            meta = json.loads(data)
            meta["target"] = {"backend": "hip", "arch": "gfx942", "warp_size": 64}
            data = json.dumps(meta).encode()
        (dst / name).write_bytes(data)
        children[name] = str(dst / name)
    (dst / "__grp__softmax_kernel.json").write_text(json.dumps({"child_paths": children}))
    age(cache)
    got = ls(kcache, cache, "--target", "hip")
    assert list(got) == [key] and (got[key]["space"], got[key]["status"]) == ("gfx942", "complete")
    assert set(ls(kcache, cache, "--space", "gfx942")) == {key}
    (dst / "softmax_kernel.hsaco").write_bytes((src / "softmax_kernel.cubin").read_bytes()[:200])
    assert "truncated" in ls(kcache, cache)[key]["reason"]


def test_scan_filter_core(cache):
    res = scan_cache(cache, ScanFilter(ops=("softmax_kernel",)))
    assert [e.hash for e in res.entries] == [SOFTMAX] and res.layouts == ("triton",)


# ---- permissions: the same status in every command, as root too -------------------------------

def test_mode_000_is_unreadable_in_every_command_as_root(kcache, cache):
    """Root reads a mode-000 file anyway; the user Triton runs as does not: unreadable, never removed."""
    cubin = cache / ADD_90 / "add_kernel.cubin"
    cubin.chmod(0)
    key_dir = cache / SOFTMAX
    key_dir.chmod(0)
    try:
        got = ls(kcache, cache)
        assert got[ADD_90]["status"] == "unreadable" and "add_kernel.cubin" in got[ADD_90]["reason"]
        assert got[SOFTMAX]["status"] == "unreadable"
        problems = {p["hash"]: p["status"] for p in kcache("--cache-dir", cache, "verify", "--json").json()["problems"]}
        assert problems == {ADD_90: "unreadable", SOFTMAX: "unreadable"}
        for key in (ADD_90, SOFTMAX):
            assert kcache("--cache-dir", cache, "inspect", key, "--json").json()["status"] == "unreadable"
        r = kcache("--cache-dir", cache, "prune", "--broken", "--yes", "--json")
        assert r.exit_code == 0 and r.json()["removed"] == [] and cubin.exists()
    finally:
        key_dir.chmod(0o755)
        cubin.chmod(0o644)


def test_a_root_whose_only_key_dir_denies_reading_is_listed_not_empty(tmp_path, cache):
    """Run as the owner without root's override (setpriv drops it): the one key directory is mode 000."""
    import subprocess
    import sys

    only = tmp_path / "only"
    only.mkdir()
    shutil.copytree(cache / ADD_90, only / ADD_90)
    (only / ADD_90).chmod(0)
    caps = "-dac_override,-dac_read_search,-fowner"
    cmd = ["setpriv", "--bounding-set", caps, "--inh-caps", caps] if os.getuid() == 0 else []
    try:
        done = subprocess.run([*cmd, sys.executable, "-m", "kcache_cli", "--cache-dir", str(only), "ls", "--json"],
                              capture_output=True, text=True, env=dict(os.environ, HOME=str(tmp_path)))
    finally:
        (only / ADD_90).chmod(0o755)
    assert done.returncode == 0 and done.stdout.strip(), (done.stdout, done.stderr)
    [e] = json.loads(done.stdout)["entries"]
    assert (e["layout"], e["hash"], e["status"]) == ("triton", ADD_90, "unreadable")


# ---- key shapes: Triton 3.1 (hex), 3.2 (base64url), >= 3.3 (base32) --------------------------------

def test_every_key_shape_is_listed_and_old_keys_follow_old_triton(kcache, cache):
    """Triton <= 3.2's get_group lets a group that does not parse raise and drops missing children
    (tests/loaders/test_oracle_triton.py proves both on 3.1 and 3.2); >= 3.3 misses the kernel instead."""
    hex_key = "6faf8446c3ad3ede80514ba2ca3bf2b082d8b03b6c58f638f64bc5d6a38773e1"
    b64_key = "I5oKKmEO9ff3KEdI9SXm1LsMZ2iarRgiMGf-9GUu6I_"
    for key in (hex_key, b64_key):
        shutil.copytree(cache / ADD_90, cache / key)
    settle(cache)
    age(cache)
    got = ls(kcache, cache)
    assert {got[k]["status"] for k in (hex_key, b64_key)} == {"complete"} and len(got) == 8
    for key in (hex_key, b64_key, ADD_90):
        (cache / key / "__grp__add_kernel.json").write_text("{not json")
    age(cache)
    got = ls(kcache, cache)
    assert got[hex_key]["status"] == got[b64_key]["status"] == "corrupt" and got[ADD_90]["status"] == "partial"
    settle(cache)
    for key in (hex_key, b64_key, ADD_90):
        (cache / key / "add_kernel.ttir").unlink()
    age(cache)
    got = ls(kcache, cache)
    assert got[hex_key]["status"] == got[b64_key]["status"] == "complete" and got[ADD_90]["status"] == "partial"


def test_the_dry_run_lists_what_the_real_prune_removes(kcache, cache, tmp_path):
    """One plan: an old temp dir inside a whole kernel (removed, the kernel stays), a group-less kernel
    with an old temp dir (removed whole), a truncated cubin (removed) — the same in both runs."""
    tmp = cache / SOFTMAX / "tmp.pid_4242_0123abcd"
    tmp.mkdir()
    (tmp / "softmax_kernel.ptx").write_text("half")
    add80 = cache / "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA"
    (add80 / "__grp__add_kernel.json").unlink()
    (add80 / "tmp.pid_7_ab").mkdir()
    cubin = cache / MATMUL / "matmul_kernel.cubin"
    cubin.write_bytes(cubin.read_bytes()[:100])
    age(cache)
    twin = tmp_path / "twin"
    shutil.copytree(cache, twin, symlinks=True)
    settle(twin)
    age(twin)

    def removed(root: Path, *args: str) -> list[tuple[str, str]]:
        r = kcache("--cache-dir", root, "prune", "--broken", "--json", *args)
        assert r.exit_code == 0, r.stderr
        return sorted((x["what"], os.path.relpath(x.get("removed_path") or x["path"], root))
                      for x in r.json()["removed"])

    dry = removed(cache, "--dry-run")
    assert dry == removed(twin, "--yes")
    assert dry == sorted([("temp", f"{SOFTMAX}/tmp.pid_4242_0123abcd"), ("entry", add80.name), ("entry", MATMUL)])
    assert ls(kcache, twin)[SOFTMAX]["status"] == "complete"


def test_a_copied_kernel_missing_a_file_names_that_file(tmp_path, kcache):
    """A copied (moved) cache whose kernel also lost its cubin here: the reason named the first child the
    group lists (add_kernel.source, which is here), not the file really gone."""
    root = tmp_path / "copy"
    shutil.copytree(FIXTURE, root)
    (root / ADD_90 / "add_kernel.cubin").unlink()
    entry = {e["hash"]: e for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]}[ADD_90]
    assert entry["status"] == "partial" and entry["reason"].startswith("add_kernel.cubin is missing"), entry
    assert "moved or copied" in entry["reason"]
    (root / ADD_90 / "add_kernel.ptx").unlink()  # two gone: both counted
    entry = {e["hash"]: e for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]}[ADD_90]
    assert " and 1 more are missing" in entry["reason"], entry  # the group's order names the first


def test_a_child_swapped_for_a_fifo_after_the_listing_is_unreadable_not_corrupt(cache):
    """The one rule for what kcache never opens holds in a race too: a child the listing saw as a file and
    that is a FIFO when read (swapped between) is unreadable (Triton's open would block), never corrupt
    (which `prune --broken` removes)."""
    from kcache_cli.fs.entrydir import EntryDir
    from kcache_cli.layouts.base import Judging

    key = cache / SOFTMAX
    with EntryDir.open(str(key)) as d:
        lst = triton._Listing(d, lambda m: None)
        (key / "softmax_kernel.ptx").unlink()
        os.mkfifo(key / "softmax_kernel.ptx")  # after the listing: it still says a regular file
        status, reason = triton.judge_files(lst, Judging(deep=True))
    assert status == "unreadable" and reason is not None and "softmax_kernel.ptx is a FIFO" in reason, reason
