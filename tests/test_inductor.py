"""TorchInductor caches made for real by torch.compile on CPU (torch 2.13.0's CPU build in the loader venv
"torch", C++ kernels through g++), and the loader oracle: a second run in a fresh process on a damaged
copy reads torch's own counters (fxgraph_cache_hit/miss, autograd_cache_hit/miss), and kcache's status
of the damaged entry must agree (hit: complete; miss: partial, failed or corrupt; unreadable and a link
kcache does not follow: never removed), and `prune --broken` must plan only what torch missed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import copy_tree, run_kcache
from loaders.venvs import python_for

PROBE = Path(__file__).resolve().parent / "loaders" / "inductor_probe.py"
BROKEN = {"partial", "failed", "corrupt"}
ALL_HITS = {"hit": 4, "miss": 0, "aot_hit": 3, "aot_miss": 0}


def probe(root: Path) -> dict:
    """Run the compile script in a fresh process against the cache at `root`: torch's counters."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(root), HOME=os.environ.get("HOME", "/tmp"))
    done = subprocess.run([str(python_for("torch")), str(PROBE)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: got[k] for k in ALL_HITS}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A real Inductor cache: the first run compiles everything (all misses), a second run hits all."""
    root = tmp_path_factory.mktemp("inductor") / "cache"
    first = probe(root)
    assert first["hit"] == 0 and first["miss"] == 4, first
    assert probe(root) == ALL_HITS
    return root


@pytest.fixture
def cache(made, tmp_path) -> Path:
    return copy_tree(made, tmp_path / "torchinductor_test")


def rows(root: Path, *args: str) -> dict[str, dict]:
    r = run_kcache("--cache-dir", str(root), "ls", "--json", *args)
    assert r.exit_code == 0, r.stderr
    return {row["relpath"] if "relpath" in row else os.path.relpath(row["path"], root): row for row in r.json()}


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
        assert r["files"] == len(walked) and r["size"] == sum(p.stat().st_size for p in walked)
    assert "locks" not in {rel.split("/")[0] for rel in listed}  # torch's FileLocks are left alone
    verify = run_kcache("--cache-dir", str(cache), "verify", "--json")
    assert verify.exit_code == 0, verify.stdout


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


MATRIX = [dmg_missing, dmg_empty, dmg_garbage, dmg_truncated, dmg_old_tmp_beside_graph, dmg_only_old_tmp,
          dmg_mode_000, dmg_link, dmg_aot_variant_missing, dmg_aot_graph_gone]


@pytest.mark.slow
@pytest.mark.parametrize("damage", MATRIX, ids=[d.__name__[4:] for d in MATRIX])
def test_damage_matrix_agrees_with_torch(cache, damage):
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
