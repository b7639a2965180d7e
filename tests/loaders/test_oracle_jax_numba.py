"""The loader oracle for JAX's compilation cache (jax 0.10.2, CPU) and Numba's cache (numba 0.68.1): the
real package on damaged copies of a cache it made (tests/loaders/probe_jax.py, probe_numba.py), and
kcache's status of each copy must say what the package did. JAX: complete keeps hitting and writing
(/jax/compilation_cache/cache_hits, a new key's -cache written); partial (a -cache without its -atime in
a capped cache) writes nothing new; corrupt (a cut -cache) misses that key; a copy elsewhere is moved
(every key missed; explain: miss) until jax has written keys for its new path there (complete: they
hit). Numba: complete hits every overload (the dispatcher's cache_hits); partial (a named .nbc gone)
misses it and compiles it again; corrupt (a cut .nbc or .nbi) makes numba's call raise. Numba's in-tree
`__pycache__/` beside the source: the index's stamp is the sha256 of the source's bytes, so a source
touched (mtime only) still hits every overload, one edited or renamed away misses them all (stale)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_kcache
from loaders.venvs import python_for

HERE = Path(__file__).resolve().parent
MAKE = HERE.parent / "fixtures" / "real" / "make"
pytestmark = pytest.mark.slow


def run(python: Path, *args: str, env: dict | None = None) -> dict:
    done = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def status(root: Path) -> str:
    """The deep status verify gives the one entry under `root`."""
    run_ = run_kcache("--cache-dir", root, "verify", "--json")
    problems = run_.json()["problems"]
    assert run_.json()["checked"] == 1
    return problems[0]["status"] if problems else "complete"


def explained(root: Path, python: Path) -> str:
    """explain's verdict on the one entry under `root` for the real `python` (whose jax it must read)."""
    run_ = run_kcache("--cache-dir", root, "--json", "explain", "--python", python)
    assert run_.json()["here"]["versions"]["jax"], run_.stdout
    [item] = run_.json()["items"]
    return item["verdict"]


def cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# ---- JAX ---------------------------------------------------------------------------------------------
JAX_CASES = {  # damage -> (kcache's status, what jax does)
    "pristine": ("complete", "hit and write"),
    "atime_gone": ("partial", "writes nothing"),
    "cache_cut": ("corrupt", "misses it"),
    "cache_gone": ("complete", "hit and write"),  # an orphan -atime: the other keys work as before
    "cache_dir": ("corrupt", "misses it"),  # read_bytes: IsADirectoryError, and put keeps what exists
    "atime_dir": ("corrupt", "misses it, writes nothing"),  # get's and eviction's -atime read/write fail
}


def jax_cache(python: Path, where: Path, case: str) -> tuple[str, dict]:
    """Fill a cache at `where` with the real jax, damage it for `case`, and return kcache's status of it
    and what jax then did. In place: jax hashes the cache directory's path into every key (XLA's debug
    options name files inside it), so a copy elsewhere would miss whatever kcache said."""
    run(python, str(HERE / "probe_jax.py"), str(where), "fill")
    affine = next(p.name[:-len("-cache")] for p in where.iterdir()
                  if p.name.startswith("jit_kc_affine") and p.name.endswith("-cache"))
    if case == "atime_gone":
        (where / f"{affine}-atime").unlink()
    elif case == "cache_cut":
        cut(where / f"{affine}-cache", 300)
    elif case == "cache_gone":
        (where / f"{affine}-cache").unlink()
    elif case in ("cache_dir", "atime_dir"):
        suffix = case.replace("_dir", "")
        (where / f"{affine}-{suffix}").unlink()
        (where / f"{affine}-{suffix}").mkdir()
    said = status(where.parent)
    return said, run(python, str(HERE / "probe_jax.py"), str(where), "probe")


@pytest.fixture(scope="module")
def jax_pristine(tmp_path_factory) -> tuple[Path, int]:
    python = python_for("jax")
    said, got = jax_cache(python, tmp_path_factory.mktemp("oracle-jax") / "jaxcache", "pristine")
    assert said == "complete" and got["written"] and got["hits"] >= 1, got
    return python, got["hits"]


@pytest.mark.parametrize("case", list(JAX_CASES))
def test_jax_agrees(jax_pristine, tmp_path, case):
    python, hits = jax_pristine
    said, got = jax_cache(python, tmp_path / "root" / "jaxcache", case)
    kcache_says, expected = JAX_CASES[case]
    assert said == kcache_says
    if expected == "hit and write":
        assert got["written"] and got["hits"] == hits - (case == "cache_gone"), got
    elif expected == "writes nothing":
        assert not got["written"] and any("Error writing" in w for w in got["warnings"]), got
    elif expected == "misses it, writes nothing":
        assert not got["written"] and got["hits"] == hits - 1, got
    else:
        assert got["written"] and got["hits"] == hits - 1, got


def test_a_jax_cache_copied_elsewhere_misses_every_key_until_jax_writes_its_own(jax_pristine, tmp_path):
    """A copy misses every key (moved); the run there writes the keys of its new path beside the copied
    ones, and the next run hits those (complete: kcache reads every executable, not one)."""
    python, hits = jax_pristine
    made, copy = tmp_path / "made" / "jaxcache", tmp_path / "copy" / "jaxcache"
    run(python, str(HERE / "probe_jax.py"), str(made), "fill")
    shutil.copytree(made, copy)
    assert status(copy.parent) == "moved" and explained(copy.parent, python) == "miss"
    assert run(python, str(HERE / "probe_jax.py"), str(copy), "probe")["hits"] == 0
    assert status(copy.parent) == "complete" and explained(copy.parent, python) == "unknown"
    assert run(python, str(HERE / "probe_jax.py"), str(copy), "probe")["hits"] == hits
    assert run(python, str(HERE / "probe_jax.py"), str(made), "probe")["hits"] == hits


def colliding(base: Path) -> Path:
    """A cache directory under `base` whose path ends a byte before its first inner "/" whose code is the
    length of the rest of the compile option's string (`/tmp` and 116 bytes: "p" is 112), as a varint
    length before that "/" would be: a reader that takes the last such "/" reads a shorter path."""
    option = len("/xla_gpu_per_fusion_autotune_cache_dir")
    slash = str(base).index("/", 1)
    want = slash + str(base)[slash - 1].encode()[0] - option
    pad = want - len(str(base)) - 1
    assert pad > 0, base
    return base / ("c" * pad)


def test_a_jax_cache_whose_path_has_a_slash_like_a_length_byte_is_not_moved(jax_pristine, tmp_path_factory):
    """The compile option names the cache directory as a protobuf string (tag, varint length, bytes): one
    inner "/" of the path preceded by a byte equal to the rest's length looks like the string's start too,
    and only the tag before the real length tells them apart. jax hits every key in place."""
    python, hits = jax_pristine
    where = colliding(tmp_path_factory.mktemp("j"))
    run(python, str(HERE / "probe_jax.py"), str(where), "fill")
    assert status(where.parent) == "complete"
    assert run(python, str(HERE / "probe_jax.py"), str(where), "probe")["hits"] == hits


def test_a_jax_cache_filled_through_a_link_is_not_moved(jax_pristine, tmp_path):
    """jax configured with a link to the cache directory records the link's path, and hits every key
    through it: the recorded path leads to this directory, so kcache, which lists the directory itself (a
    link is no entry), calls it complete, as torchext does a build.ninja naming it through a link."""
    python, hits = jax_pristine
    real, link = tmp_path / "root" / "jaxcache", tmp_path / "link"
    real.mkdir(parents=True)
    link.symlink_to(real)
    run(python, str(HERE / "probe_jax.py"), str(link), "fill")
    assert status(real.parent) == "complete"
    assert run(python, str(HERE / "probe_jax.py"), str(link), "probe")["hits"] == hits


# ---- Numba -------------------------------------------------------------------------------------------
NUMBA_CASES = {
    "pristine": ("complete", {"hits": 2, "misses": 0}),
    "nbc_gone": ("partial", {"hits": 1, "misses": 1}),
    "nbc_cut": ("corrupt", "error"),
    "nbi_cut": ("corrupt", "error"),
}


@pytest.fixture(scope="module")
def numba_made(tmp_path_factory) -> tuple[Path, Path, Path]:
    python = python_for("numba")
    work = tmp_path_factory.mktemp("oracle-numba")
    src = work / "src"
    src.mkdir()
    shutil.copy(MAKE / "kc_numba.py", src / "kc_numba.py")
    base = work / "cache"
    assert run(python, str(HERE / "probe_numba.py"), str(src), env={"NUMBA_CACHE_DIR": str(base)}) == {
        "hits": 0, "misses": 2}
    return python, src, base


@pytest.mark.parametrize("case", list(NUMBA_CASES))
def test_numba_agrees(numba_made, tmp_path, case):
    python, src, base = numba_made
    root = tmp_path / "cache"
    shutil.copytree(base, root)
    [entry] = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    first = sorted(entry.glob("*.1.nbc"))[0]
    if case == "nbc_gone":
        first.unlink()
    elif case == "nbc_cut":
        cut(first, 100)
    elif case == "nbi_cut":
        cut(next(entry.glob("*.nbi")), 60)
    kcache_says, expected = NUMBA_CASES[case]
    assert status(root) == kcache_says
    got = run(python, str(HERE / "probe_numba.py"), str(src), env={"NUMBA_CACHE_DIR": str(root)})
    assert ("error" in got) if expected == "error" else got == expected, got


IN_TREE_CASES = {  # what happens to the source -> (kcache's status, what numba counts)
    "pristine": ("complete", {"hits": 2, "misses": 0}),
    "touched": ("complete", {"hits": 2, "misses": 0}),
    "edited": ("stale", {"hits": 0, "misses": 2}),
    "renamed": ("stale", {"hits": 0, "misses": 2}),  # numba writes a new index under the new name
}


IN_TREE = {"NUMBA_CACHE_DIR": "", "PYTHONDONTWRITEBYTECODE": "1"}  # numba's cache in __pycache__/ beside the source


def in_tree_project(python: str, sources: Path, where: Path) -> Path:
    """A copy of `sources` at `where` whose __pycache__/ numba itself filled (it missed both overloads)."""
    shutil.copytree(sources, where, ignore=shutil.ignore_patterns("__pycache__"))
    assert run(python, str(HERE / "probe_numba.py"), str(where), env=IN_TREE) == {"hits": 0, "misses": 2}
    return where


@pytest.mark.parametrize("case", list(IN_TREE_CASES))
def test_numba_in_tree_agrees(numba_made, tmp_path, case):
    python, made, _ = numba_made
    project = in_tree_project(python, made, tmp_path / "project")
    src, module = project / "kc_numba.py", "kc_numba"
    if case == "touched":
        os.utime(src, (1e9, 1e9))
    elif case == "edited":
        src.write_bytes(src.read_bytes() + b"# edited\n")
    elif case == "renamed":
        src, module = src.rename(project / "kc_moved.py"), "kc_moved"
    kcache_says, expected = IN_TREE_CASES[case]
    assert status(project) == kcache_says
    assert run(python, str(HERE / "probe_numba.py"), str(project), module, env=IN_TREE) == expected
