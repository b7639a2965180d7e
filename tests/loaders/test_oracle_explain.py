"""The loader oracle for `kcache explain` on Triton caches (slow): each verdict against Triton's own lookup.

Caches are made by Triton 3.2 and 3.9 themselves (probe_triton.py make: add_kernel for sm_80 and sm_90,
scale_kernel for sm_80, and with 3.9 an AMD gfx942 kernel). "Here" is the Triton 3.9 venv and a GPU arch;
probe_triton_here.py compiles every CUDA kernel for that arch against a copy of the cache and reports the
key directories Triton used without compiling. kcache's `hit` set must be exactly that set, every other
entry a `miss` naming the factor that differs (never `hit` by guess)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from loaders.test_oracle_triton import make_cache, settle
from loaders.venvs import python_for

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for venv in ("triton39", "triton32"):
        root = tmp_path_factory.mktemp(venv) / "cache"
        make_cache(venv, root)
        out[venv] = root
    return out


def triton_hits(root: Path, cc: int, tmp: Path) -> set[str]:
    """The key directories of `root` that Triton 3.9 compiling for `cc` uses without compiling."""
    copy = tmp / f"lookup-{cc}"
    shutil.copytree(root, copy, symlinks=True)
    settle(copy)
    done = subprocess.run([str(python_for("triton39")), str(HERE / "probe_triton_here.py"), str(copy), str(cc)],
                          capture_output=True, text=True, timeout=900, env=dict(os.environ, HOME=str(tmp)))
    assert done.returncode == 0, done.stderr[-2000:]
    hits = set(json.loads(done.stdout.splitlines()[-1])["hits"])
    return hits & set(os.listdir(root))  # a miss compiles into the copy: only keys the cache held count


def explain(kcache, root: Path, gpu: str) -> dict[str, dict]:
    r = kcache("--cache-dir", root, "--json", "explain", "--python", str(python_for("triton39")), "--gpu", gpu)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["here"]["versions"]["triton"] == "3.9.0"
    return {i["what"]: i for i in doc["items"]}


@pytest.mark.parametrize("gpu, cc", [("sm_90a", 90), ("sm_80", 80)])
def test_a_triton39_cache_hits_exactly_its_complete_kernels_for_the_arch(caches, tmp_path, kcache, gpu, cc):
    root = tmp_path / "c39"
    shutil.copytree(caches["triton39"], root, symlinks=True)
    settle(root)
    verdicts = explain(kcache, root, gpu)
    real = triton_hits(root, cc, tmp_path)
    assert real, "Triton used no kernel: the oracle would prove nothing"
    assert {k for k, v in verdicts.items() if v["verdict"] == "hit"} == real
    for key, v in verdicts.items():
        if key not in real:
            assert v["verdict"] == "miss" and v["factor"] in ("target arch", "target backend"), v
            assert v["here"] in (gpu, "cuda")


def test_an_incomplete_kernel_of_the_arch_is_a_miss_as_triton_finds(caches, tmp_path, kcache):
    root = tmp_path / "c39"
    shutil.copytree(caches["triton39"], root, symlinks=True)
    settle(root)
    ours = sorted(k for k, v in explain(kcache, root, "sm_90a").items() if v["verdict"] == "hit")
    broken = root / ours[0]
    for cubin in broken.glob("*.cubin"):
        cubin.unlink()
    verdicts = explain(kcache, root, "sm_90a")
    assert verdicts[ours[0]]["verdict"] == "miss" and verdicts[ours[0]]["factor"] == "status"
    assert ours[0] not in triton_hits(root, 90, tmp_path)


def test_a_triton32_cache_misses_every_kernel_under_triton39(caches, tmp_path, kcache):
    root = tmp_path / "c32"
    shutil.copytree(caches["triton32"], root, symlinks=True)
    settle(root)
    verdicts = explain(kcache, root, "sm_90a")
    assert verdicts and all(v["verdict"] == "miss" and v["factor"] == "triton version" for v in verdicts.values())
    assert all(v["here"] == "3.9.0" and "3.2" in v["recorded"] for v in verdicts.values())
    assert triton_hits(root, 90, tmp_path) == set()
