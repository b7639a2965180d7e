"""TorchInductor caches made for real by torch.compile on CPU (torch 2.13.0's CPU build in the loader venv
"torch", C++ kernels through g++), and the loader oracle: a second run in a fresh process on a damaged
copy reads torch's own counters (fxgraph_cache_hit/miss, autograd_cache_hit/miss), and kcache's status
of the damaged entry must agree (hit: complete; miss: partial, failed or corrupt; unreadable and a link
kcache does not follow: never removed), and `prune --broken` must plan only what torch missed."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import copy_tree, run_kcache
from loaders import recorded
from loaders.venvs import python_for

PROBE = Path(__file__).resolve().parent / "loaders" / "inductor_probe.py"
BROKEN = {"partial", "failed", "corrupt"}
ALL_HITS = {"hit": 4, "miss": 0, "aot_hit": 3, "aot_miss": 0}


def probe(root: Path, crash_ok: bool = False) -> dict:
    """Run the compile script in a fresh process against the cache at `root`: torch's counters ({} when
    torch crashed and `crash_ok`)."""
    # nor CI: torch reads CI=true (as .ci/run runs) into the configs its AOTAutograd keys hash, so the
    # recorded cache (made without it) would miss every autograd entry there
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_")) and k != "CI"}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(root), HOME=os.environ.get("HOME", "/tmp"))
    # torch's AOTAutograd keys hash the compiled functions' source file names: the probe runs under one
    # name wherever the checkout lies, so that the recorded cache hits in another clone too
    run_as = ("import sys; exec(compile(open(sys.argv[1]).read(), 'inductor_probe.py', 'exec'), "
              "{'__name__': '__main__', '__file__': 'inductor_probe.py'})")
    done = subprocess.run([str(python_for("torch")), "-c", run_as, str(PROBE)], capture_output=True, text=True,
                          env=env, timeout=600)
    if crash_ok and done.returncode != 0:
        return {}
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: got[k] for k in ALL_HITS}


@pytest.fixture(scope="module")
def real_made(tmp_path_factory) -> Path:
    """A real Inductor cache: the first run compiles everything (all misses), a second run hits all."""
    root = tmp_path_factory.mktemp("inductor") / "cache"
    first = probe(root)
    assert first["hit"] == 0 and first["miss"] == 4, first
    assert probe(root) == ALL_HITS
    if recorded.RECORD:
        recorded.save_tree("inductor", root)
    return root


@pytest.fixture(scope="module")
def recorded_made(tmp_path_factory) -> Path:
    """The cache torch made in the slow run that recorded it (tests/loaders/recorded/inductor.tar.gz)."""
    return recorded.extract_tree("inductor", tmp_path_factory.mktemp("inductor-recorded"))


@pytest.fixture(scope="module", params=["recorded", pytest.param("real", marks=pytest.mark.slow)])
def made(request) -> Path:
    """Fast tier: the recorded cache; slow tier: one torch makes now, too."""
    return request.getfixturevalue(f"{request.param}_made")


@pytest.fixture
def cache(made, tmp_path) -> Path:
    return copy_tree(made, tmp_path / "torchinductor_test")


@pytest.fixture
def real_cache(real_made, tmp_path) -> Path:
    """For the tests that run torch on the cache: the one torch made in this run."""
    return copy_tree(real_made, tmp_path / "torchinductor_test")


@pytest.mark.slow
def test_the_recorded_cache_still_hits_every_graph(recorded_made, tmp_path):
    """The recorded cache is current: today's torch hits every graph of it (else KCACHE_ORACLE_RECORD=1
    pytest -m slow tests/test_inductor.py records it anew)."""
    assert probe(copy_tree(recorded_made, tmp_path / "torchinductor_test")) == ALL_HITS


def rows(root: Path, *args: str) -> dict[str, dict]:
    r = run_kcache("--cache-dir", str(root), "ls", "--json", *args)
    assert r.exit_code == 0, r.stderr
    return {row["relpath"] if "relpath" in row else os.path.relpath(row["path"], root): row
            for row in r.json()["entries"]}


def one(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert found, pattern
    return found[0]


def test_lists_a_real_cache_exactly(cache):
    listed = rows(cache)
    kinds: dict[str, int] = {}
    for r in listed.values():
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    shards = {p.name for p in cache.iterdir() if len(p.name) == 2}
    assert kinds == {"graph": 4, "autograd": 3, "code": len(shards)}
    assert all(r["status"] == "complete" and r["layout"] == "inductor" for r in listed.values())
    for rel, r in listed.items():
        walked = [p for p in (cache / rel).rglob("*") if p.is_file()]
        assert r["file_count"] == len(walked) and r["apparent_size"] == sum(p.stat().st_size for p in walked)
    assert "locks" not in {rel.split("/")[0] for rel in listed}  # torch's FileLocks are left alone
    verify = run_kcache("--cache-dir", str(cache), "verify", "--json")
    assert verify.exit_code == 0, verify.stdout


def test_a_code_shard_by_its_name_lists_no_graph_shard(cache, monkeypatch):
    """`inspect 2a` (a code shard): no fx graph key starts with anything but "f", so none of fxgraph/'s
    1,024 shard directories is listed to look (they were, one by one); a graph's prefix lists its own."""
    from kcache_cli.catalog import names
    from kcache_cli.layouts.shapes import inductor_graph_shard

    assert [inductor_graph_shard(p) for p in ("", "f", "fa", "fabc", "2a", "a")] == [None, None, None, "ab", "", ""]
    listed: list[str] = []
    real = names.visible_dirs

    def visible(path, *args, **kwargs):
        listed.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(names, "visible_dirs", visible)
    shard = next(p.name for p in sorted(cache.iterdir()) if len(p.name) == 2)
    r = run_kcache("--cache-dir", str(cache), "inspect", shard)
    assert r.exit_code == 0, r.stderr
    assert not [p for p in listed if "/fxgraph/" in p]
    graph = one(cache, "fxgraph/*/*")
    listed.clear()
    assert run_kcache("--cache-dir", str(cache), "inspect", graph.name[:8]).exit_code == 0
    assert {os.path.basename(p) for p in listed if "/fxgraph/" in p} == {graph.parent.name}


def _graph_variant(root: Path) -> Path:
    return one(root, "fxgraph/*/*/*")


def _aot_named_graph(root: Path) -> Path:
    """The fx graph directory an aotautograd entry names (the model's forward or backward)."""
    from kcache_cli.layouts import inductor

    aot = one(root, "aotautograd/*")
    keys = inductor.graph_keys(str(aot), os.listdir(aot))
    return root / inductor.graph_relpath(keys[0])


def _old(path: Path) -> None:
    old = time.time() - 7200
    os.utime(path, (old, old))


def dmg_missing(root):
    v = _graph_variant(root)
    v.unlink()
    _old(v.parent)
    return v.parent


def dmg_empty(root):
    v = _graph_variant(root)
    v.write_bytes(b"")
    return v.parent


def dmg_garbage(root):
    v = _graph_variant(root)
    v.write_bytes(os.urandom(v.stat().st_size))
    return v.parent


def dmg_truncated(root):
    v = _graph_variant(root)
    v.write_bytes(v.read_bytes()[: v.stat().st_size // 2])
    return v.parent


def dmg_old_tmp_beside_graph(root):
    v = _graph_variant(root)
    tmp = v.parent / ".999999.140000.tmp"
    tmp.write_bytes(v.read_bytes()[:100])
    _old(tmp)
    return v.parent


def dmg_only_old_tmp(root):
    v = _graph_variant(root)
    v.rename(v.parent / ".999999.140000.tmp")
    _old(v.parent / ".999999.140000.tmp")
    _old(v.parent)
    return v.parent


def dmg_mode_000(root):
    v = _graph_variant(root)
    v.chmod(0)
    return v.parent


def dmg_link(root):
    v = _graph_variant(root)
    outside = root.parent / "elsewhere"
    outside.write_bytes(v.read_bytes())
    v.unlink()
    v.symlink_to(outside)
    return v.parent


def dmg_aot_variant_missing(root):
    v = one(root, "aotautograd/*/*")
    v.unlink()
    _old(v.parent)
    return v.parent


def dmg_aot_graph_gone(root):
    g = _aot_named_graph(root)
    shutil.move(str(g), str(root.parent / "moved-away"))
    return one(root, "aotautograd/*")  # judged: the aotautograd entry naming it (the first one)


def dmg_garbage_variant_beside_good(root):
    v = _graph_variant(root)
    (v.parent / ("a" * 51)).write_bytes(os.urandom(4000))  # tried first (name order), skipped with a warning
    return v.parent


def dmg_source_emptied_beside_library(root):
    """A kernel's .cpp (and a wrapper's .main.cpp) emptied while its .so is whole: torch loads the .so and
    never reads the source again (a hit), so the shard stays complete."""
    kernel = next(p for p in sorted(root.glob("??/c*.cpp")) if not p.name.endswith(".main.cpp"))
    for src in (kernel, one(root, "??/c*.main.cpp")):
        src.write_bytes(b"")
    return kernel.parent


MATRIX = [dmg_missing, dmg_empty, dmg_garbage, dmg_truncated, dmg_old_tmp_beside_graph, dmg_only_old_tmp,
          dmg_mode_000, dmg_link, dmg_aot_variant_missing, dmg_aot_graph_gone, dmg_garbage_variant_beside_good,
          dmg_source_emptied_beside_library]


@pytest.mark.slow
@pytest.mark.parametrize("damage", MATRIX, ids=[d.__name__[4:] for d in MATRIX])
def test_damage_matrix_agrees_with_torch(real_cache, damage):
    cache = real_cache
    target = damage(cache)
    rel = os.path.relpath(target, cache)
    if rel.startswith("aotautograd") and damage is dmg_aot_graph_gone:
        rel = _first_aot_naming_missing(cache)
    listed = rows(cache)
    status = listed[rel]["status"]
    deep = run_kcache("--cache-dir", str(cache), "inspect", listed[rel]["hash"], "--json")
    deep_status = deep.json()["status"]
    plan = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--dry-run", "--json")
    assert plan.exit_code == 0, plan.stderr
    planned = {os.path.relpath(r["path"], cache) for r in plan.json().get("removed", plan.json().get("entries", []))}
    got = probe(cache)
    hit = got["miss"] == 0 and got["aot_miss"] == 0
    print(damage.__name__, got, status, deep_status, listed[rel]["reason"])
    if hit:
        assert status in ("complete", "unreadable") and deep_status in ("complete", "unreadable"), (status, got)
        assert not planned, planned
    else:
        assert status in BROKEN and deep_status in BROKEN, (status, deep_status, got)
    assert planned <= {rel} | _graph_users(cache, rel), planned  # only what torch missed


@pytest.mark.slow
def test_truncated_wrapper_libraries_crash_torch_and_are_corrupt(real_cache):
    cache = real_cache
    """torch loads each graph's compiled wrapper (.main.so) on a hit: truncated, it crashes (corrupt)."""
    for so in cache.glob("*/*.so"):
        so.write_bytes(so.read_bytes()[:5000])
    listed = rows(cache, "--kind", "code")
    assert {r["status"] for rel, r in listed.items() if list((cache / rel).glob("*.so"))} == {"corrupt"}
    assert probe(cache, crash_ok=True) == {}  # torch fails loading them
    run = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--yes")
    assert run.exit_code == 0 and not list(cache.glob("*/*.so"))
    assert probe(cache) == ALL_HITS  # removal cured it: the graphs hit and their code is compiled again


@pytest.mark.slow
def test_a_wrapper_cut_short_crashes_torch_and_is_corrupt(real_cache):
    """torch writes a graph's .py wrapper only when it is missing and compiles the text it finds: cut
    short, every load dies of its SyntaxError. verify calls it corrupt, `prune --broken --deep` removes the
    shard, and torch then writes it again from the fx graph: every graph hits."""
    cache = real_cache
    wrapper = _cut_wrapper(cache)
    assert probe(cache, crash_ok=True) == {}
    assert _verified(cache)[wrapper.parent.name] == "corrupt"
    run = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--deep", "--yes")
    assert run.exit_code == 0 and not wrapper.exists(), run.stdout
    assert probe(cache) == ALL_HITS


def _cut_wrapper(root: Path) -> Path:
    wrapper = one(root, "??/c*.py")
    data = wrapper.read_bytes()
    wrapper.write_bytes(data[: len(data) // 2])
    return wrapper


def _verified(root: Path) -> dict[str, str]:
    """verify's deep status of each entry it finds a problem in, by hash."""
    return {p["hash"]: p["status"] for p in run_kcache("--cache-dir", str(root), "verify", "--json").json()["problems"]}


@pytest.mark.slow
def test_removing_every_code_shard_keeps_every_graph_hit(real_cache):
    cache = real_cache
    """The code cache is rebuilt from the fx graphs (they hold their source): clearing it loses no hit."""
    shards = sorted(rows(cache, "--kind", "code"))
    run = run_kcache("--cache-dir", str(cache), "clear", *shards, "--yes", "--json")
    assert run.exit_code == 0 and not rows(cache, "--kind", "code")
    assert probe(cache) == ALL_HITS


@pytest.mark.slow
def test_torch_uses_a_shards_kernels_one_by_one(real_cache):
    """A shard with a whole kernel beside an interrupted one (complete to kcache): torch loses no hit and
    loads the whole kernel's .so as it is; a shard whose only kernel lost its .so (partial): torch
    compiles that kernel again, no hit lost either."""
    cache = real_cache
    shard, _ = _interrupted_beside(cache)
    kept = one(shard, "c*.so")
    before = kept.stat()
    cut = next(p for p in sorted(cache.glob("??/c*.so")) if p.parent != shard)
    cut.unlink()
    for p in (cut.parent, *cut.parent.iterdir()):
        os.utime(p, (time.time() - 7200,) * 2)  # an old interrupted compile (a fresh one may be waiting)
    listed = rows(cache, "--kind", "code")
    assert listed[shard.name]["status"] == "complete" and listed[cut.parent.name]["status"] == "partial"
    assert probe(cache) == ALL_HITS
    assert (kept.stat().st_ino, kept.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert cut.is_file()  # compiled again


def _first_aot_naming_missing(root: Path) -> str:
    for row in rows(root, "--kind", "autograd").values():
        if row["status"] != "complete":
            return os.path.relpath(row["path"], root)
    raise AssertionError("no aotautograd entry judged broken")


def _graph_users(root: Path, rel: str) -> set[str]:
    """The aotautograd entries naming the fx graph at `rel` (torch misses them along with it)."""
    from kcache_cli.layouts import inductor

    users = inductor.LAYOUT.users(root, [str(root / rel)]).get(str(root / rel), [])
    return {os.path.relpath(u, root) for u in users}


# ---- every command on a real cache ----------------------------------------------------------------------

@pytest.mark.slow
def test_export_then_import_elsewhere_hits_everything(real_cache, tmp_path):
    cache = real_cache
    archive = tmp_path / "inductor.tar.gz"
    run = run_kcache("--cache-dir", str(cache), "export", str(archive), "--json")
    assert run.exit_code == 0, run.stderr
    fresh = tmp_path / "fresh"
    run = run_kcache("--cache-dir", str(fresh), "import", str(archive), "--json")
    assert run.exit_code == 0, run.stderr
    assert sorted(rows(fresh)) == sorted(rows(cache))
    assert not (fresh / "locks").exists()  # torch's lock files are no entry and do not travel
    assert probe(fresh) == ALL_HITS


def test_prune_by_age_size_and_clear(cache):
    """A graph counts as used while an aotautograd entry naming it is: both age out together."""
    aot = sorted(rows(cache, "--kind", "autograd"))[0]
    from kcache_cli.layouts import inductor

    graphs = [inductor.graph_relpath(k) for k in inductor.graph_keys(str(cache / aot), os.listdir(cache / aot))]
    old = time.time() - 40 * 86400
    for rel in graphs:
        for p in [cache / rel, *(cache / rel).iterdir()]:
            os.utime(p, (old, old))
    kept = run_kcache("--cache-dir", str(cache), "prune", "--older-than", "30d", "--dry-run", "--json").json()
    assert kept["removed"] == []  # its aotautograd entry is recent: the graphs are in use
    for p in [cache / aot, *(cache / aot).iterdir()]:
        os.utime(p, (old, old))
    run = run_kcache("--cache-dir", str(cache), "prune", "--older-than", "30d", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    gone = {os.path.relpath(r["path"], cache) for r in run.json()["removed"]}
    assert gone == {aot, *graphs}
    total = sum(r["size"] for r in rows(cache).values())
    run = run_kcache("--cache-dir", str(cache), "prune", "--max-size", f"{total // 2}B", "--yes", "--json")
    assert run.exit_code == 0 and sum(r["size"] for r in rows(cache).values()) <= total // 2
    run = run_kcache("--cache-dir", str(cache), "clear", "--all", "--yes", "--json")
    assert run.exit_code == 0 and rows(cache) == {}
    assert (cache / "locks").is_dir()  # never torch's own lock files


def test_inspect_names_the_graphs_an_autograd_entry_needs(cache):
    aot = rows(cache, "--kind", "autograd")
    needing = [r for r in aot.values()]
    shown = run_kcache("--cache-dir", str(cache), "inspect", needing[0]["hash"], "--json").json()
    assert shown["status"] == "complete"
    assert shown["facts"]["variants"] == "1 guard variant(s), 0 damaged"
    assert "present" in json.dumps(shown["facts"])
    log = run_kcache("--cache-dir", str(cache), "log", needing[0]["hash"])
    assert log.exit_code == 1 and "TORCH_LOGS=output_code" in log.stderr


def test_export_brings_the_graphs_an_autograd_entry_names(cache, tmp_path):
    aot = sorted(rows(cache, "--kind", "autograd").values(), key=lambda r: -r["size"])[0]
    archive = tmp_path / "one.tar"
    run = run_kcache("--cache-dir", str(cache), "export", str(archive), aot["hash"], "--json")
    assert run.exit_code == 0, run.stderr
    fresh = tmp_path / "one"
    assert run_kcache("--cache-dir", str(fresh), "import", str(archive)).exit_code == 0
    kinds = sorted(r["kind"] for r in rows(fresh).values())
    assert kinds.count("autograd") == 1 and kinds.count("graph") >= 1
    assert all(r["status"] == "complete" for r in rows(fresh).values())


def test_dir_all_finds_it_by_torchs_rule(tmp_path, monkeypatch):
    import tempfile

    where = Path(tempfile.gettempdir()) / f"torchinductor_{os.environ.get('USER') or 'root'}"
    import getpass

    where = Path(tempfile.gettempdir()) / ("torchinductor_" + getpass.getuser().replace("/", "_"))
    (where / "fxgraph").mkdir(parents=True)
    run = run_kcache("dir", "--all", "--json")
    row = next(r for r in run.json()["caches"] if r["cache"] == "inductor")
    assert row["path"] == str(where) and row["layouts"] == ["inductor"]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "rel/ind")
    row = next(r for r in run_kcache("dir", "--all", "--json").json()["caches"] if r["cache"] == "inductor")
    assert row["path"] == str(tmp_path / "rel" / "ind")  # made absolute, as torch does


def test_user_name_sanitised_as_torch_does(monkeypatch):
    from kcache_cli.layouts import homes

    monkeypatch.setattr("getpass.getuser", lambda: 'dom\\a/b:c*d?e"f<g>h|i')
    assert homes.inductor().path.name == "torchinductor_dom_a_b_c_d_e_f_g_h_i"


def test_completion_offers_its_kinds_and_hashes(cache):
    env = {"_KCACHE_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args"}
    kinds = run_kcache(env={**env, "_TYPER_COMPLETE_ARGS": f"kcache --cache-dir {cache} ls --kind "})
    offered = {ln.split("\t")[0] for ln in kinds.stdout.splitlines()}
    assert {"graph", "autograd", "code"} <= offered
    aot = sorted(rows(cache, "--kind", "autograd"))[0].split("/")[-1]
    hashes = run_kcache(env={**env, "_TYPER_COMPLETE_ARGS": f"kcache --cache-dir {cache} inspect {aot[:6]}"})
    assert [ln.split("\t")[0] for ln in hashes.stdout.splitlines()] == [aot]


# ---- nested Triton cache, code shards, writers' leftovers (no torch needed) ---------------------------------

def test_nested_triton_cache_is_judged_by_triton_rules(tmp_path):
    from conftest import FIXTURES

    root = tmp_path / "ind"
    nested = root / "triton" / "0"
    nested.mkdir(parents=True)
    (root / "fxgraph").mkdir()
    for key in sorted((FIXTURES / "triton" / "cache").iterdir())[:2]:
        shutil.copytree(key, nested / key.name)
    # the group files name the fixture's own paths: relocate them where they now are
    assert run_kcache("--cache-dir", str(root), "verify", "--fix").exit_code == 0
    listed = {r["hash"]: r for r in run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]}
    assert {(r["kind"], r["space"], r["status"]) for r in listed.values()} == {("triton", "triton/0", "complete")}
    assert all(r["op"] and r["target"] == "cuda" for r in listed.values())
    first = sorted(listed)[0]
    group = next((nested / first).glob("__grp__*.json"))
    group.unlink()
    old = time.time() - 7200
    for p in [nested / first, *(nested / first).iterdir()]:
        os.utime(p, (old, old))
    now = {r["hash"]: r["status"] for r in run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]}
    assert now == {first: "partial", **{h: "complete" for h in listed if h != first}}
    run = run_kcache("--cache-dir", str(root), "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0 and not (nested / first).exists() and len(list(nested.iterdir())) == 1
    dirs = run_kcache("dir", "--all", "--json", env={"TORCHINDUCTOR_CACHE_DIR": str(root)}).json()["caches"]
    row = next(r for r in dirs if r["cache"] == "inductor")
    assert row["nested"] == [{"layout": "triton", "path": str(nested)}]


def test_an_emptied_source_beside_its_library_is_no_damage(cache):
    """torch (CppCodeCache) writes a kernel's .cpp only when it is missing and compiles it only when its
    .so is: a .cpp emptied beside a whole .so is never read again (the slow matrix sees every graph hit),
    so ls, verify and prune --broken leave the shard; an empty .so is still torch's failure."""
    src = one(cache, "??/c*.main.cpp")
    src.write_bytes(b"")
    shard = src.parent.name
    assert rows(cache)[shard]["status"] == "complete"
    assert run_kcache("--cache-dir", str(cache), "verify", shard).exit_code == 0
    plan = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--dry-run", "--json")
    assert plan.exit_code == 0 and not plan.json()["removed"], plan.stdout
    Path(str(src)[:-3] + "so").write_bytes(b"")
    assert rows(cache)[shard]["status"] == "corrupt"


def test_a_wrapper_that_does_not_compile_is_corrupt_deep(cache):
    """A graph's .py wrapper cut short (or overwritten) fails torch's import on every load (the slow test
    above): the deep judgement compiles it (compile() parses, runs nothing) and calls the shard corrupt;
    ls's cheap one, which reads no wrapper, still calls it complete, as `prune --broken` without --deep."""
    wrapper = _cut_wrapper(cache)
    shard = wrapper.parent.name
    assert rows(cache)[shard]["status"] == "complete"
    problem = run_kcache("--cache-dir", str(cache), "verify", "--json").json()["problems"]
    assert [(p["hash"], p["status"]) for p in problem] == [(shard, "corrupt")]
    assert problem[0]["reason"].startswith(f"{wrapper.name} does not compile (")
    assert run_kcache("--cache-dir", str(cache), "inspect", shard, "--json").json()["status"] == "corrupt"
    plan = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--deep", "--dry-run", "--json").json()
    assert [r["hash"] for r in plan["removed"]] == [shard]
    wrapper.write_bytes(b"x = 1\n\0\n")  # a null byte: Python refuses it too
    assert _verified(cache) == {shard: "corrupt"}



def test_a_big_wrapper_is_parsed_apart_within_bounds(cache, monkeypatch):
    """Parsing dense code costs ~350 bytes of memory per byte (8 MB of `x = 1 < 1 < ...`: 2.5 GB, 8 s): a
    wrapper over INLINE_WRAPPER is parsed in an interpreter of its own, bounded in memory and CPU time. One
    whose parse stays within the bounds is judged there (cut short: corrupt); one past them is not judged,
    and this process never holds its tree (here a bound of 64 MB: the parse of 600 kB of dense code needs
    ~200 MB)."""
    from kcache_cli.layouts import inductor

    wrapper = one(cache, "??/c*.py")
    shard = wrapper.parent.name
    big = inductor.INLINE_WRAPPER + 1000
    wrapper.write_bytes(b"x = '" + b"a" * big + b"'\ndef f(:\n")  # cheap to parse, cut short
    assert _verified(cache) == {shard: "corrupt"}
    monkeypatch.setattr(inductor, "APART_MEMORY", 64 << 20)
    wrapper.write_bytes(b"x = 1" + b" < 1" * (600_000 // 4) + b"\ndef f(:\n")
    assert _verified(cache) == {}  # past the bound: not judged (compiled here, it was corrupt)


def test_code_shard_statuses(tmp_path):
    root = tmp_path / "ind"
    shard = root / "ab"
    shard.mkdir(parents=True)
    key = "c" + "ab" + "a" * 49
    so = subprocess.run(["g++", "-shared", "-fPIC", "-x", "c++", "-", "-o", str(shard / f"{key}.so")],
                        input="extern \"C\" int f() { return 1; }\n", text=True, capture_output=True)
    assert so.returncode == 0, so.stderr
    (shard / f"{key}.cpp").write_text("extern \"C\" int f() { return 1; }\n")
    other = root / "cd"
    other.mkdir()
    (other / ("c" + "cd" + "b" * 49 + ".cpp")).write_text("int g();\n")  # its .so never came
    (root / "zz").mkdir()
    (root / "zz" / "notes.txt").write_text("not torch's\n")
    old = time.time() - 7200
    for p in (root / "cd", *(root / "cd").iterdir()):
        os.utime(p, (old, old))
    listed = {r["hash"]: r for r in run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]}
    assert listed["ab"]["status"] == "complete" and listed["cd"]["status"] == "partial"
    data = (shard / f"{key}.so").read_bytes()
    (shard / f"{key}.so").write_bytes(data[: len(data) // 2])
    listed = {r["hash"]: r for r in run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]}
    assert listed["ab"]["status"] == "corrupt" and "truncated" in listed["ab"]["reason"]
    run = run_kcache("--cache-dir", str(root), "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0
    assert sorted(os.listdir(root)) == [".kcache", "zz"] and (root / "zz" / "notes.txt").is_file()
    assert "zz" not in {r["hash"] for r in run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]}


def test_a_kernel_torch_is_compiling_makes_its_shard_building(tmp_path):
    """torch writes a kernel's .cpp, then compiles and links it holding the flock locks/<key>.lock, the
    .so written in place: while that lock is held the shard is building and prune --broken keeps it (it
    crashed torch's compile: cc1plus found no .cpp); a source newer than an hour with no .so may still
    wait for its lock, building too; an old one whose lock is free is an interrupted compile."""
    root = tmp_path / "ind"
    shard = root / "ab"
    shard.mkdir(parents=True)
    (root / "locks").mkdir()
    key = "c" + "ab" + "a" * 49
    (shard / f"{key}.cpp").write_text("extern \"C\" int f() { return 1; }\n")

    def age(*paths: Path) -> None:
        old = time.time() - 7200
        for p in paths:
            os.utime(p, (old, old))

    def status() -> dict:
        return run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"][0]

    age(shard / f"{key}.cpp", shard)
    with open(root / "locks" / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert status()["status"] == "building" and f"locks/{key}.lock" in status()["reason"]
        (shard / f"{key}.so").write_bytes(b"")  # being linked
        age(shard / f"{key}.so", shard)
        assert status()["status"] == "building"
        run = run_kcache("--cache-dir", str(root), "prune", "--broken", "--yes", "--json")
        assert run.exit_code == 0 and (shard / f"{key}.cpp").is_file() and (shard / f"{key}.so").is_file()
    assert status()["status"] == "corrupt"  # its lock free: a link that died half-way
    (shard / f"{key}.so").unlink()
    os.utime(shard / f"{key}.cpp")
    assert status()["status"] == "building" and "no .so yet" in status()["reason"]
    age(shard / f"{key}.cpp", shard)
    assert status()["status"] == "partial"
    run = run_kcache("--cache-dir", str(root), "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0 and not shard.exists()


def test_torch_locks_each_kernel_by_the_name_kcache_probes(cache):
    """Every C++ kernel torch compiled (`<xx>/c<key>.*cpp`) left its FileLock `locks/<key>.lock`: the lock
    whose holder makes the shard building."""
    keys = {p.name.split(".")[0] for p in cache.glob("??/c*.*cpp")}
    assert keys and all((cache / "locks" / f"{k}.lock").is_file() for k in keys), keys


def _interrupted_beside(cache: Path) -> tuple[Path, str]:
    """A real shard holding a whole C++ kernel, and beside it another kernel's .cpp with no .so (an
    interrupted compile, an hour old): (the shard, the interrupted key)."""
    cpp = one(cache, "??/c*.cpp")
    shard = cpp.parent
    other = "c" + shard.name + "z" * 49
    (shard / f"{other}.cpp").write_text("extern \"C\" void k() {}\n")
    old = time.time() - 7200
    for p in (shard, *shard.iterdir()):
        os.utime(p, (old, old))
    return shard, other


def test_an_interrupted_kernel_leaves_its_shards_whole_kernels_in_use(cache):
    """torch compiles a kernel whose .cpp has no .so again on its next use; the shard's other kernels
    still hit: the shard stays complete (inspect names the interrupted kernel) and prune --broken keeps
    it. Only a shard with no whole kernel is partial; a damaged .so torch would load keeps it corrupt."""
    shard, other = _interrupted_beside(cache)
    rel = os.path.relpath(shard, cache)
    assert rows(cache, "--kind", "code")[rel]["status"] == "complete"
    deep = run_kcache("--cache-dir", str(cache), "inspect", shard.name, "--kind", "code", "--json").json()
    assert deep["status"] == "complete"
    assert other in deep["facts"]["interrupted_kernels"], deep["facts"]
    assert run_kcache("--cache-dir", str(cache), "verify", "--json").exit_code == 0
    plan = run_kcache("--cache-dir", str(cache), "prune", "--broken", "--dry-run", "--json")
    assert plan.exit_code == 0 and rel not in [r["relpath"] for r in plan.json()["removed"]], plan.stdout
    so = one(shard, "c*.so")
    so.write_bytes(so.read_bytes()[:100])
    assert rows(cache, "--kind", "code")[rel]["status"] == "corrupt"
    for p in shard.iterdir():
        if not p.name.startswith(other):
            p.unlink()
    assert rows(cache, "--kind", "code")[rel]["status"] == "partial"


def test_inspect_json_names_every_kernel_of_a_shard(cache):
    """A shard's `code` fact is said once per kernel: --json keeps every one, a line each (it kept the last)."""
    shard, other = _interrupted_beside(cache)
    text = run_kcache("--cache-dir", str(cache), "inspect", shard.name, "--kind", "code").stdout
    deep = run_kcache("--cache-dir", str(cache), "inspect", shard.name, "--kind", "code", "--json").json()
    kernels = deep["facts"]["code"].split("\n")
    assert len(kernels) == len({n.split(".")[0] for n in os.listdir(shard) if n.startswith("c")}) >= 2
    assert any(k.startswith(other + ":") for k in kernels) and all(k.split(":")[0] in text for k in kernels)


def test_live_writers_temp_file_is_building_never_removed(tmp_path):
    root = tmp_path / "ind"
    key = "f" + "ab" + "c" * 49
    entry = root / "fxgraph" / "ab" / key
    entry.mkdir(parents=True)
    (entry / f".{os.getpid()}.1234.tmp").write_bytes(b"\x80\x04half")
    old = time.time() - 7200
    for p in (entry, *entry.iterdir()):
        os.utime(p, (old, old))
    row = run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"][0]
    assert row["status"] == "building" and str(os.getpid()) in row["reason"]
    run = run_kcache("--cache-dir", str(root), "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0 and entry.is_dir()


def test_autotune_tables(tmp_path):
    root = tmp_path / "ind"
    (root / "cache").mkdir(parents=True)
    (root / "fxgraph").mkdir()
    (root / "cache" / ("0" * 64)).write_text('{"triton_poi_fused_0": {"XBLOCK": 128, "num_warps": 4}}')
    row = run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]
    assert [(r["kind"], r["status"]) for r in row] == [("autotune", "complete")]
    (root / "cache" / ("1" * 64)).write_text("")
    row = run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]
    assert [(r["kind"], r["status"]) for r in row] == [("autotune", "corrupt")]


@pytest.mark.parametrize("deep", [False, True], ids=["cheap", "deep"])
def test_a_judgement_reads_only_through_the_entry_it_is_handed(cache, deep):
    """Every entry held open from one anchor is judged the same once the whole cache has moved to another
    name: the aotautograd entries' fx graphs are found from the anchor, nothing by a path of its own."""
    from kcache_cli import layouts
    from kcache_cli.fs import read as fsread
    from kcache_cli.fs.entrydir import EntryDir

    layout = layouts.get("inductor")
    anchor = fsread.Anchor(cache)
    held = [(r["kind"], rel, EntryDir.open(str(cache / rel), anchor)) for rel, r in rows(cache).items()]
    try:
        before = {rel: layout.judge(d, kind, layout.judging(deep)) for kind, rel, d in held}
        assert {kind for kind, _, _ in held} == {"graph", "autograd", "code"}
        assert all(j.status == "complete" for j in before.values()), before
        moved = cache.with_name(cache.name + "-moved")
        graph = _aot_named_graph(cache)
        os.rename(cache, moved)  # every path the scan handed out now names nothing
        assert {rel: layout.judge(d, kind, layout.judging(deep)) for kind, rel, d in held} == before
        shutil.rmtree(moved / graph.relative_to(cache))  # an fx graph the aotautograd entries name
        after = {rel: layout.judge(d, kind, layout.judging(deep)) for kind, rel, d in held if kind == "autograd"}
        assert any(j.status == "partial" and graph.name in (j.reason or "") for j in after.values()), after
    finally:
        for _, _, d in held:
            d.close()
        anchor.close()


def test_an_fx_graph_that_is_a_link_is_never_followed(tmp_path):
    """An aotautograd entry whose fx graph is a symlink (to a whole graph elsewhere) is unreadable: the
    judgement never follows a link to find what it names, and unreadable is never removed."""
    import base64
    import hashlib
    import pickle

    def b32(data: bytes) -> str:
        return base64.b32encode(hashlib.sha256(data).digest())[:51].decode().lower()

    root = tmp_path / "ind"
    data = pickle.dumps({"graph": 1}, protocol=4)
    key = "f" + b32(b"graph 1")
    elsewhere = tmp_path / "elsewhere" / key
    elsewhere.mkdir(parents=True)
    (elsewhere / b32(data)).write_bytes(data)
    (root / "fxgraph" / key[1:3]).mkdir(parents=True)
    (root / "fxgraph" / key[1:3] / key).symlink_to(elsewhere)
    variant = pickle.dumps({"forward": key}, protocol=4)
    aot = root / "aotautograd" / ("a" + b32(b"aot"))
    aot.mkdir(parents=True)
    (aot / b32(variant)).write_bytes(variant)
    listed = {r["kind"]: r for r in run_kcache("--cache-dir", str(root), "ls", "--json").json()["entries"]}
    assert listed["autograd"]["status"] == "unreadable" and key in listed["autograd"]["reason"]
    verify = run_kcache("--cache-dir", str(root), "verify", "--json")
    assert verify.exit_code != 0 and key in verify.stdout


def test_a_reference_that_is_a_whole_hash_names_that_entry_alone(cache):
    """`clear as`, where `as` is a code shard and also begins an autograd entry's hash, removes the shard
    only (an exact name wins over a prefix, as in git); `asc` still names the autograd entry."""
    autograd = sorted(r["hash"] for r in rows(cache, "--kind", "autograd").values())[0]
    shard = sorted(rows(cache, "--kind", "code"))[0]
    name = autograd[:2]
    if name != shard:
        os.rename(cache / shard, cache / name)  # a shard whose name begins the autograd entry's hash
    plan = run_kcache("--cache-dir", str(cache), "clear", name, "--dry-run", "--json")
    assert plan.exit_code == 0, plan.stderr
    assert [(r["kind"], r["hash"]) for r in plan.json()["removed"]] == [("code", name)]
    plan = run_kcache("--cache-dir", str(cache), "clear", autograd[:3], "--dry-run", "--json")
    assert [(r["kind"], r["hash"]) for r in plan.json()["removed"]] == [("autograd", autograd)]
    listed = run_kcache("--cache-dir", str(cache), "ls", name, "--json").json()["entries"]
    assert [e["hash"] for e in listed] == [name]


def test_a_lookup_by_prefix_lists_no_code_shard_it_does_not_name(cache, monkeypatch):
    """`ls <fx graph prefix>` lists the shards whose names start with the prefix only (each code shard it
    would list is opened to see that it is torch's): the answer is the full listing's, filtered."""
    from kcache_cli.catalog import scan_context
    from kcache_cli.layouts import inductor

    monkeypatch.setattr(scan_context, "PARALLEL_MIN_JOBS", 10**9)  # listed here, where it is counted
    full = rows(cache)
    graph = os.path.basename(one(cache, "fxgraph/*/*"))
    listed: list[str] = []
    real = inductor._entry

    def counting(ctx, job):
        if job[1] == "code":
            listed.append(os.path.basename(job[0]))
        return real(ctx, job)

    monkeypatch.setattr(inductor, "_entry", counting)
    named = rows(cache, graph[:12])
    assert named == {k: v for k, v in full.items() if os.path.basename(k).startswith(graph[:12])} and named
    assert all(n.startswith(graph[:12]) for n in listed)


def test_a_name_lookup_by_graph_prefix_looks_into_its_shard_alone(cache, monkeypatch):
    """catalog/names.py finds entries by their names for inspect, log, clear <prefix> and TAB: a prefix of
    three or more characters looks into fxgraph/<its 2nd and 3rd characters>/ alone (KindShape.derived),
    none for a prefix no graph key starts with, and finds what the full listing holds."""
    from kcache_cli.catalog import names

    full = {os.path.basename(k) for k in rows(cache)}
    looked: list[str] = []
    real = names.visible_dirs

    def counting(path, prefix="", kept=None):
        looked.append(os.path.relpath(str(path), cache))
        return real(path, prefix, kept)

    monkeypatch.setattr(names, "visible_dirs", counting)
    graph = os.path.basename(one(cache, "fxgraph/*/*"))
    for ref in (graph[:3], graph[:10], "fzz", "zzz", "f"):
        looked.clear()
        found = {e.hash for e in names.entries(cache, ref)}
        assert found == {h for h in full if h.startswith(ref)}
        into = {p for p in looked if p.startswith("fxgraph")}
        if ref == "f":  # too short to tell the shard: every one
            assert into == {"fxgraph", *(f"fxgraph/{d.name}" for d in (cache / "fxgraph").iterdir())}
        elif ref.startswith("f"):
            assert into == ({f"fxgraph/{ref[1:3]}"} if (cache / "fxgraph" / ref[1:3]).is_dir() else set())
            assert found or ref == "fzz"
        else:
            assert not into


def test_a_lookup_by_prefix_lists_only_the_shard_its_graphs_lie_in(cache, monkeypatch):
    """A graph key is `f` and 51 more, in fxgraph/<its 2nd and 3rd characters>/: `ls <prefix>` lists that
    shard alone (none for a prefix no graph key can start with, and no aotautograd/ unless it starts with
    `a`), and answers as the full listing filtered."""
    from kcache_cli.catalog import scan_context

    monkeypatch.setattr(scan_context, "PARALLEL_MIN_JOBS", 10**9)
    full = rows(cache)
    listed: list[str] = []
    real = scan_context.ScanContext.subdirs

    def counting(self, path, prefixes=()):
        listed.append(os.path.relpath(str(path), cache))
        return real(self, path, prefixes)

    monkeypatch.setattr(scan_context.ScanContext, "subdirs", counting)
    for ref in (os.path.basename(one(cache, "fxgraph/*/*"))[:9], os.path.basename(one(cache, "aotautograd/*"))[:9],
                "zz", "f"):
        listed.clear()
        run = run_kcache("--cache-dir", str(cache), "ls", "--json", ref)
        named = {os.path.relpath(r["path"], cache): r for r in run.json()["entries"]} if run.exit_code == 0 else {}
        assert named == {k: v for k, v in full.items() if os.path.basename(k).startswith(ref)}
        shards = {p for p in listed if p.startswith("fxgraph/")}
        if ref.startswith("f") and len(ref) >= 3:
            assert shards == {f"fxgraph/{ref[1:3]}"} and named
        elif ref == "f":
            assert len(shards) == len(list(cache.glob("fxgraph/*")))
        else:
            assert not shards
        assert ("aotautograd" in listed) == (ref.startswith("a") or ref == "")


def test_fx_keys_finds_what_the_regular_expression_finds():
    """fx_keys searches only the runs of bytes a key may hold: the same keys as FX_KEY_RE.findall over
    the whole variant, for keys at either end, side by side, inside longer runs, runs one byte short,
    and random bytes drawn mostly from a key's alphabet (where runs are long and full of f)."""
    import random

    from kcache_cli.layouts.inductor import FX_KEY_RE, fx_keys

    key = b"f" + b"abcdefghijklmnopqrstuvwxyz234567"[:26] * 2
    key = key[:52]
    cases = [b"", key, key + key, b"." + key + b".", b"ff" + key[:-1] + b"x" + key, key[:-1], b"\x8c4" + key + b"\x94",
             b"f" * 200, b"f" * 51 + b"." + key, key + b"ab" + key]
    rng = random.Random(35)
    alphabet = b"abcdefghijklmnopqrstuvwxyz234567f" * 3 + b"._/\x00A9"
    for _ in range(300):
        cases.append(bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 600))))
    for data in cases:
        assert fx_keys(data) == FX_KEY_RE.findall(data), data
    assert sum(len(fx_keys(d)) for d in cases) > 100  # the random cases do hold keys
