"""torch 2.13 itself against kcache's Mega-Cache blobs (slow: real torch.compile on CPU, loader venv "torch").

- A blob kcache exports from an Inductor cache, loaded by torch's `load_cache_artifacts` into an empty cache
  directory, turns the same compiles into fx graph hits only.
- A blob torch saved, imported by kcache into an empty root, is complete fx graph and AOTAutograd entries,
  and torch then hits on every graph without loading the blob itself.
- With a variable that turns a cache off, `kcache explain BLOB` says miss for exactly the artifact types
  torch, loading the blob, then takes no hit from.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from loaders.venvs import python_for

from kcache_cli.formats import megacache
from kcache_cli.layouts.inductor import MEGA_TYPES

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def _torch(tmp_path: Path, *args: str, env: dict | None = None) -> list[dict]:
    done = subprocess.run([str(python_for("torch")), str(HERE / "mega_probe.py"), *args], capture_output=True,
                          text=True, timeout=1200, env=dict(os.environ, HOME=str(tmp_path), **(env or {})))
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    """(the Inductor cache torch filled, the blob torch saved from the same process)."""
    where = tmp_path_factory.mktemp("mega")
    cache, blob = where / "cache", where / "torch.bin"
    first = _torch(where, "save", str(cache), str(blob))[-1]
    assert first["hit"] == 0 and first["miss"] >= 3
    return cache, blob


def test_a_blob_kcache_exports_makes_torch_hit_every_graph(saved, tmp_path, kcache):
    cache, _ = saved
    out = tmp_path / "kcache.bin"
    r = kcache("--cache-dir", cache, "--json", "export", out, "--format", "torch-mega",
               "--python", str(python_for("torch")))
    assert r.exit_code == 0, r.stderr
    side = json.loads(Path(str(out) + ".kcache.json").read_text())
    assert side["torch_version"].startswith("2.13.0")
    lines = _torch(tmp_path, "load", str(tmp_path / "empty"), str(out))
    loaded, counts = lines[0]["loaded"], lines[-1]
    assert loaded and len(loaded["inductor"]) == sum(a["type"] == "inductor" for a in side["artifacts"])
    assert counts["miss"] == 0 and counts["hit"] >= 3, counts
    assert counts["aot_miss"] == 0 and counts["aot_hit"] >= 1, counts


def test_a_blob_torch_saved_imports_as_complete_entries_torch_hits(saved, tmp_path, kcache):
    _, blob = saved
    parsed = megacache.parse(blob.read_bytes(), MEGA_TYPES)
    assert parsed.state == megacache.OK and {t for t, _ in parsed.groups} >= {"inductor", "aot_autograd"}
    root = tmp_path / "root"
    assert kcache("--cache-dir", root, "import", blob).exit_code == 0
    entries = json.loads(kcache("--cache-dir", root, "--json", "ls").stdout)["entries"]
    graphs = [e for e in entries if e["kind"] == "graph"]
    autograd = [e for e in entries if e["kind"] == "autograd"]
    assert len(graphs) == len({a.key for a in parsed.artifacts if a.type == "inductor"}) and autograd
    assert all(e["status"] == "complete" for e in entries), entries
    counts = _torch(tmp_path, "run", str(root), "-")[-1]  # a plain run: no blob loaded, only the cache
    assert counts["miss"] == 0 and counts["hit"] >= 3, counts


OFF = [("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1"), ("TORCHINDUCTOR_FX_GRAPH_CACHE", "0"),
       ("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")]


@pytest.mark.parametrize("var,value", OFF)
def test_explain_misses_exactly_what_torch_does_not_read_with_a_cache_off(saved, tmp_path, kcache, var, value):
    _, blob = saved
    env = {var: value}
    counts = _torch(tmp_path, "load", str(tmp_path / "empty"), str(blob), env=env)[-1]
    r = kcache("--json", "explain", blob, "--python", str(python_for("torch")), env=env)
    assert r.exit_code == 0, r.stderr
    verdicts = {(i["kind"], i["verdict"], i["factor"]) for i in json.loads(r.stdout)["items"]
                if i["kind"] in ("inductor", "aot_autograd")}
    torch_read = {"inductor": counts["hit"] > 0, "aot_autograd": counts["aot_hit"] > 0}
    assert verdicts == {(k, "unknown" if read else "miss", None if read else var) for k, read in torch_read.items()}, \
        (counts, verdicts)
