"""A machine holding all seven layouts in their default places (HOME and the temp dir are the test's own):
`dir --all` finds each once, with the Triton caches nested in Inductor and vLLM shown with them, and
`prune --all-caches --max-size` frees the least recently used entries across all of them."""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import pickle
import pprint
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree, run_kcache


def b32(data: bytes) -> str:
    return base64.b32encode(hashlib.sha256(data).digest())[:51].decode().lower()


def inductor_graph(root: Path, payload: object) -> Path:
    """An fx graph entry framed as torch writes one (a pickle named by the base32 sha256 of its bytes)."""
    data = pickle.dumps(payload, protocol=4)
    key = "f" + b32(repr(payload).encode())
    entry = root / "fxgraph" / key[1:3] / key
    entry.mkdir(parents=True)
    (entry / b32(data)).write_bytes(data)
    return entry


def binary_artifact(path: Path, fields: list[bytes]) -> None:
    """Framed as torch's BytesWriter: CRC32 of the rest, then 8-byte big-endian lengths and bytes."""
    body = b"".join(len(f).to_bytes(8, "big") + f for f in fields)
    path.write_bytes(zlib.crc32(body).to_bytes(4, "big") + body)


def vllm_unit(root: Path, h10: str) -> Path:
    local = root / h10 / "rank_0_0" / "backbone"
    local.mkdir(parents=True)
    key = "artifact_compile_range_1_8192_subgraph_0"
    binary_artifact(local / key, [b"header", b"torch key", base64.b64encode(key.encode()), os.urandom(300)])
    index = {((1, 8192), 0, "inductor_standalone"): (key, str(local / key))}
    (local / "vllm_compile_cache.py").write_text(pprint.PrettyPrinter(indent=4).pformat(index))
    return root / h10


@pytest.fixture
def machine(tmp_path) -> dict[str, Path]:
    home = Path(os.environ["HOME"])
    user = getpass.getuser()
    roots = {
        "hidet": home / ".cache" / "hidet", "tilus": home / ".cache" / "tilus",
        "tilelang": home / ".tilelang" / "cache", "triton": home / ".triton" / "cache",
        "inductor": Path(tempfile.gettempdir()) / f"torchinductor_{user}",
        "cudajit": home / ".nv", "vllm": home / ".cache" / "vllm" / "torch_compile_cache",
        # torch is not installed beside kcache here: torch's rule with the cpu accelerator
        "torchext": home / ".cache" / "torch_extensions" / f"py{sys.version_info[0]}{sys.version_info[1]}_cpu",
        "numba": home / ".cache" / "numba",  # numba's user-wide cache (no JAX cache unless configured)
    }
    copy_tree(FIXTURES / "torch_ext", roots["torchext"])
    copy_tree(FIXTURES / "numba", roots["numba"])
    for name in ("hidet", "tilus", "tilelang"):
        copy_tree(FIXTURES / name, roots[name])
    copy_tree(FIXTURES / "triton" / "cache", roots["triton"])
    for i in range(3):
        inductor_graph(roots["inductor"], {"graph": i})
    nested = roots["inductor"] / "triton" / "0"
    kernel = sorted((FIXTURES / "triton" / "cache").iterdir())[0]
    shutil.copytree(kernel, nested / kernel.name)
    jit = roots["cudajit"] / "ComputeCache"
    (jit / "7").mkdir(parents=True)
    (jit / "7" / "blob").write_bytes(os.urandom(5000))
    (jit / "index").write_bytes(b"i" * 64)
    for h10 in ("0123456789", "abcdef0123"):
        unit = vllm_unit(roots["vllm"], h10)
        (unit / "rank_0_0" / "triton_cache").mkdir()
    # each layout's fixture lies where its compiler would find it: relocate the absolute paths
    for name in ("triton", "vllm", "inductor"):
        assert run_kcache("--cache-dir", str(roots[name]), "verify", "--fix").exit_code in (0, 1)
    return roots


def test_dir_all_lists_every_cache_once_with_nested_ones(machine, monkeypatch):
    rows = run_kcache("dir", "--all", "--json").json()["caches"]
    assert {r["cache"]: r["path"] for r in rows} == {k: str(v) for k, v in machine.items()}
    by = {r["cache"]: r for r in rows}
    assert all(by[k]["layouts"] == [k] for k in machine), {k: by[k]["layouts"] for k in machine}
    assert by["inductor"]["nested"] == [{"layout": "triton", "path": str(machine["inductor"] / "triton" / "0")}]
    assert [n["layout"] for n in by["vllm"]["nested"]] == ["triton", "triton"]
    # a Triton cache set to live inside them is not listed a second time
    monkeypatch.setenv("TRITON_CACHE_DIR", str(machine["vllm"] / "0123456789" / "rank_0_0" / "triton_cache"))
    rows = run_kcache("dir", "--all", "--json").json()["caches"]
    assert "triton" not in {r["cache"] for r in rows}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(machine["inductor"] / "triton" / "0"))
    assert "triton" not in {r["cache"] for r in run_kcache("dir", "--all", "--json").json()["caches"]}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(machine["tilelang"]))  # two variables, one directory
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(machine["tilelang"]))
    paths = [r["path"] for r in run_kcache("dir", "--all", "--json").json()["caches"]]
    assert len(paths) == len(set(paths))


def test_ls_all_caches_sees_seven_layouts(machine):
    rows = run_kcache("ls", "--all-caches", "--json").json()["entries"]
    assert {r["layout"] for r in rows} == set(machine)


def test_prune_all_caches_max_size_frees_the_least_recently_used_across_them(machine):
    shutil.rmtree(machine["torchext"])  # its one 0.5 MB extension alone would outweigh half the rest
    rows = [r for r in run_kcache("ls", "--all-caches", "--json").json()["entries"] if r["status"] == "complete"
            and r["layout"] != "tilus"]  # tilus programs live as long as their scripts: not in this order
    rows.sort(key=lambda r: r["path"])
    now = time.time()
    for i, r in enumerate(rows):  # interleave the layouts in age
        age = now - 86400 * (len(rows) - i)
        for p in [Path(r["path"]), *Path(r["path"]).rglob("*")]:
            os.utime(p, (age, age), follow_symlinks=False)
    listed = [r for r in run_kcache("ls", "--all-caches", "--json").json()["entries"]]
    total = sum(r["size"] for r in listed)
    budget = total // 2
    plan = run_kcache("prune", "--all-caches", "--max-size", f"{budget}B", "--dry-run", "--json")
    assert plan.exit_code == 0, plan.stderr
    removed = {r["path"] for section in plan.json()["caches"] for r in section["removed"]}
    kept = [r for r in listed if r["path"] not in removed]
    assert sum(r["size"] for r in kept) <= budget
    aged = {x["path"] for x in rows}
    oldest_kept = min(r["last_used"] for r in kept if r["path"] in aged)
    assert all(r["last_used"] <= oldest_kept for r in listed if r["path"] in removed and r["path"] in aged)
    assert len({r["layout"] for r in listed if r["path"] in removed}) >= 3  # taken across caches, not from one


@pytest.mark.parametrize("layout", ["inductor", "vllm", "cudajit"])
def test_push_pull_through_a_file_remote(machine, tmp_path, layout):
    remote = tmp_path / "remote"
    remote.mkdir()
    run = run_kcache("--cache-dir", str(machine[layout]), "push", "--remote", f"file://{remote}", "--json")
    assert run.exit_code == 0, run.stderr
    fresh = tmp_path / "fresh" / machine[layout].name
    run = run_kcache("--cache-dir", str(fresh), "pull", "--remote", f"file://{remote}", "--json")
    assert run.exit_code == 0, run.stderr
    before = {r["hash"]: (r["kind"], r["file_count"], r["size"]) for r in
              run_kcache("--cache-dir", str(machine[layout]), "ls", "--json").json()["entries"]}
    after = {r["hash"]: (r["kind"], r["file_count"], r["size"], r["status"]) for r in
             run_kcache("--cache-dir", str(fresh), "ls", "--json").json()["entries"]}
    # sizes change only where absolute paths were rewritten for the new place (Triton groups, vLLM indexes)
    relocated = {h for h, v in before.items() if v[0] in ("triton", "compile")}
    assert {h: v[:2] for h, v in after.items()} == {h: v[:2] for h, v in before.items()}
    assert all(after[h][2] == before[h][2] for h in before if h not in relocated)
    assert {v[3] for v in after.values()} == {"complete"}
    assert run_kcache("--cache-dir", str(fresh), "verify").exit_code == 0  # vLLM's paths rewritten on pull
