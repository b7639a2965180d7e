"""The loader oracle for `kcache explain` (slow): each verdict against the compiler's own lookup, for Triton
and Numba.

Caches are made by Triton 3.2 and 3.9 themselves (probe_triton.py make: add_kernel for sm_80 and sm_90,
scale_kernel for sm_80, and with 3.9 an AMD gfx942 kernel). "Here" is the Triton 3.9 venv and a GPU arch;
probe_triton_here.py compiles every CUDA kernel for that arch against a copy of the cache and reports the
key directories Triton used without compiling. kcache's `hit` set must be exactly that set, every other
entry a `miss` naming the factor that differs (never `hit` by guess).

Numba 0.68.1 (its venv is "here"): a cache probe_numba.py made in NUMBA_CACHE_DIR, as made and with one
factor changed (another numba's index, another Python's, NUMBA_CPU_NAME, NUMBA_CPU_FEATURES,
NUMBA_DISABLE_JIT), and an in-tree `__pycache__/` whose source was edited: every `miss` is a call where
numba's dispatcher hit nothing of the cache, and the cache as made (where numba hits every overload) is
`unknown`, since the CPU in its keys is not asked here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pickle
import pickletools

import pytest
from loaders.test_oracle_jax_numba import IN_TREE, MAKE, in_tree_project, run
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


# ---- Numba -------------------------------------------------------------------------------------------
NUMBA_CASES = {  # case -> (what is changed: the index or the environment, kcache's verdict, its factor)
    "as made": ({}, "unknown", None),
    "another numba wrote it": ({}, "miss", "numba version"),
    "another Python's index": ({}, "miss", "python version"),
    "the generic CPU": ({"NUMBA_CPU_NAME": "generic"}, "miss", "CPU name"),
    "other CPU features": ({"NUMBA_CPU_FEATURES": "+avx"}, "miss", "CPU features"),
    "no JIT": ({"NUMBA_DISABLE_JIT": "1"}, "miss", "NUMBA_DISABLE_JIT"),
}


@pytest.fixture(scope="module")
def numba_made(tmp_path_factory) -> tuple[Path, Path, Path]:
    python = python_for("numba")
    work = tmp_path_factory.mktemp("explain-numba")
    (work / "src").mkdir()
    shutil.copy(MAKE / "kc_numba.py", work / "src" / "kc_numba.py")
    assert run(python, str(HERE / "probe_numba.py"), str(work / "src"), env={"NUMBA_CACHE_DIR": str(work / "cache")}
               ) == {"hits": 0, "misses": 2}
    return python, work / "src", work / "cache"


def another_numba(index: Path, version: str) -> None:
    """Make `index` look written by numba `version`: its first pickle (numba's version) replaced."""
    data = index.read_bytes()
    stop = next(at for op, _, at in pickletools.genops(data) if op.name == "STOP")
    index.write_bytes(pickle.dumps(version, protocol=pickle.HIGHEST_PROTOCOL) + data[stop + 1:])


def numba_explain(kcache, root: Path, python: Path, env: dict) -> dict:
    r = kcache("--cache-dir", root, "--json", "explain", "--python", str(python), env=env)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["here"]["versions"]["numba"] == "0.68.1"
    [item] = doc["items"]
    return item


@pytest.mark.parametrize("case", list(NUMBA_CASES))
def test_numba_explain_agrees_with_numba(numba_made, tmp_path, kcache, case):
    python, src, made = numba_made
    root = tmp_path / "cache"
    shutil.copytree(made, root)
    [entry] = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    [index] = entry.glob("*.nbi")
    if case == "another numba wrote it":
        another_numba(index, "0.67.0")
    elif case == "another Python's index":
        index.rename(index.with_name(index.name.replace(".py311.", ".py312.")))
    env, verdict, factor = NUMBA_CASES[case]
    item = numba_explain(kcache, root, python, env)
    got = run(python, str(HERE / "probe_numba.py"), str(src), env={**env, "NUMBA_CACHE_DIR": str(root)})
    assert (item["verdict"], item["factor"]) == (verdict, factor), item
    if verdict == "miss":
        assert got["hits"] == 0, got
    else:  # numba hits every overload where kcache cannot tell (the CPU in the keys is this machine's)
        assert got == {"hits": 2, "misses": 0} and "which kcache does not ask here" in item["why"], (item, got)


def test_numba_explain_misses_a_pycache_whose_source_was_edited(numba_made, tmp_path, kcache):
    python, src, _ = numba_made
    project = in_tree_project(python, src, tmp_path / "project")
    assert numba_explain(kcache, project, python, {})["verdict"] == "unknown"
    (project / "kc_numba.py").write_text((project / "kc_numba.py").read_text() + "# edited\n")
    item = numba_explain(kcache, project, python, {})
    assert (item["verdict"], item["factor"], item["recorded"]) == ("miss", "status", "stale")
    assert run(python, str(HERE / "probe_numba.py"), str(project), env=IN_TREE) == {"hits": 0, "misses": 2}
