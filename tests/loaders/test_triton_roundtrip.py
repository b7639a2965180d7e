"""Issue 24, Triton: real caches from Triton 3.1, 3.2 and 3.9 are listed exactly and survive being moved.

Each cache is written in the session by that Triton release itself (probe_triton.py `make`: `triton.compile`
for GPU targets, no GPU needed). Then:
- `kcache ls --json` lists exactly the key directories Triton wrote: count, kind, size (the sum of the file
  sizes), file count, op and status;
- `kcache export` -> `kcache import` into a fresh root in another directory (the original root renamed away,
  as on another machine) -> Triton's own second compile with TRITON_CACHE_DIR = the new root hits every
  kernel (probe_triton_rerun.py: no backend stage ran, 3.9's listener says cache_hit) and writes nothing;
- the same after `cp -r` of the root and `kcache verify --fix`; without the fix the copy is a miss for Triton
  (the control: the group files hold absolute paths into the old root).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from loaders.matrix import kcache
from loaders.venvs import python_for

HERE = Path(__file__).resolve().parent
VERSIONS = ("triton31", "triton32", "triton39")
KEY_SHAPES = {"triton31": r"[0-9a-f]{64}", "triton32": r"[A-Za-z0-9_-]{43}", "triton39": r"[A-Z2-7]{52}"}
KCACHE_OWN = {".kcache", "CACHEDIR.TAG"}  # what `kcache import` adds to a root it creates (locks, the tag)
KERNELS = {"triton31": 3, "triton32": 3, "triton39": 4}  # 3.9 adds an AMD (gfx942) kernel


def triton(venv: str, script: str, *args: str, home: Path, cwd: Path | None = None, **env: str) -> dict:
    """probe_triton.py / probe_triton_rerun.py in the loader venv: its JSON answer."""
    home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(python_for(venv)), str(HERE / script), *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home), PYTHONDONTWRITEBYTECODE="1", **env), timeout=900,
                          cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def make(variant: str, root: Path) -> dict[str, str]:
    """A real cache written by Triton `variant` at `root` (its group files name `root`): {key dir: kernel name}.
    `triton39-binary-only`: Triton 3.9 with TRITON_STORE_BINARY_ONLY=1 (no IR stages kept)."""
    venv, _, only = variant.partition("-")
    env = {"TRITON_STORE_BINARY_ONLY": "1"} if only == "binary-only" else {}
    out = triton(venv, "probe_triton.py", "make", str(root), home=root.parent / "make-home", **env)
    assert all(not k["detail"] for k in out["kernels"].values()), out
    return {key: k["name"] for key, k in out["kernels"].items()}


def cp_r(src: Path, dest: Path) -> Path:
    """`cp -r src dest`, as a user copies a cache: new mtimes, the paths inside the group files untouched."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
    return dest


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root: relative path -> (size, mtime_ns); what a compile would change."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


def ls(root: Path) -> list[dict]:
    done = kcache(root, "ls", home=root.parent / "kc-home")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["entries"]


def assert_listed_exactly(venv: str, root: Path, kernels: dict[str, str]) -> None:
    listed = ls(root)
    on_disk = sorted(n for n in os.listdir(root) if n not in KCACHE_OWN)
    assert sorted(kernels) == on_disk, "probe_triton's keys are the directories Triton wrote"
    assert len(on_disk) == KERNELS[venv.partition("-")[0]]
    assert sorted(os.path.relpath(e["path"], root) for e in listed) == on_disk, listed
    for e in listed:
        key = os.path.basename(e["path"])
        files = [f for f in Path(e["path"]).iterdir() if f.is_file()]
        assert re.fullmatch(KEY_SHAPES[venv.partition("-")[0]], key), key
        assert (e["layout"], e["kind"], e["status"], e["reason"]) == ("triton", "kernel", "complete", None), e
        assert e["hash"] == key and e["op"] == kernels[key], e
        assert e["apparent_size"] == sum(f.stat().st_size for f in files), e
        # bytes on disk, as du counts them: the files' blocks and the key directory's own
        assert e["size"] == sum(f.stat().st_blocks * 512 for f in files) + Path(e["path"]).stat().st_blocks * 512, e
        assert e["file_count"] == len(files), e
        assert e["target"] == ("hip" if kernels[key] == "amd_kernel" else "cuda"), e


def assert_paths_lead_into(root: Path) -> None:
    for g in root.glob("*/__grp__*.json"):
        children = json.loads(g.read_text())["child_paths"]
        assert children and all(p == str(g.parent / n) for n, p in children.items()), (g, children)


def assert_second_run_all_hits(venv: str, root: Path, kernels: dict[str, str]) -> None:
    before = files_of(root)
    elsewhere = root.parent / "rerun-cwd"  # never the directory a relative path could resolve from
    elsewhere.mkdir(exist_ok=True)
    again = triton(venv.partition("-")[0], "probe_triton_rerun.py", str(root), home=root.parent / "rerun-home",
                   cwd=elsewhere)
    assert set(again["kernels"]) == set(kernels), again
    missed = {k: v for k, v in again["kernels"].items() if v["verdict"] != "hit"}
    assert not missed, f"Triton {again['version']} did not hit: {missed}"
    assert files_of(root) == before, "Triton's second run wrote into the cache (it compiled)"


@pytest.mark.slow
@pytest.mark.parametrize("venv", VERSIONS)
def test_triton_cache_is_listed_exactly(venv, tmp_path):
    root = tmp_path / "cache"
    assert_listed_exactly(venv, root, make(venv, root))


@pytest.mark.slow
@pytest.mark.parametrize("venv", (*VERSIONS, "triton39-binary-only"))
def test_export_import_elsewhere_then_triton_hits_every_kernel(venv, tmp_path):
    here = tmp_path / "machine-a" / "triton-cache"
    kernels = make(venv, here)
    archive = tmp_path / ("kernels.tar.zst" if venv.endswith("binary-only") else "kernels.tar.gz")
    done = kcache(here, "export", str(archive), home=tmp_path / "kc-home")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entry_count"] == len(kernels), done.stdout
    here.rename(here.with_name("gone"))  # another machine: the paths written in the groups do not exist
    there = tmp_path / "machine-b" / "elsewhere" / "new-root"
    there.parent.mkdir(parents=True)
    done = kcache(there, "import", str(archive), home=tmp_path / "kc-home")
    assert done.returncode == 0, done.stderr
    assert_listed_exactly(venv, there, kernels)
    assert_paths_lead_into(there)
    assert kcache(there, "verify", home=tmp_path / "kc-home").returncode == 0
    assert_second_run_all_hits(venv, there, kernels)


@pytest.mark.slow
@pytest.mark.parametrize("venv", VERSIONS)
def test_cp_r_then_verify_fix_then_triton_hits_every_kernel(venv, tmp_path):
    here = tmp_path / "a" / "cache"
    kernels = make(venv, here)
    copy = cp_r(here, tmp_path / "b" / "copied")
    control = cp_r(here, tmp_path / "c" / "copied")
    here.rename(here.with_name("gone"))
    # the control: an unfixed copy is a miss in Triton itself, so the hits below are the fix's doing
    unfixed = triton(venv, "probe_triton_rerun.py", str(control), home=tmp_path / "control-home")
    assert {v["verdict"] for v in unfixed["kernels"].values()} == {"recompile"}, unfixed
    checked = kcache(copy, "verify", home=tmp_path / "kc-home")
    assert checked.returncode == 1, checked.stdout
    assert {p["status"] for p in json.loads(checked.stdout)["problems"]} == {"moved"}, checked.stdout
    fixed = kcache(copy, "verify", "--fix", home=tmp_path / "kc-home")
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    assert kcache(copy, "verify", home=tmp_path / "kc-home").returncode == 0
    assert_paths_lead_into(copy)
    assert_listed_exactly(venv, copy, kernels)
    assert_second_run_all_hits(venv, copy, kernels)


@pytest.mark.slow
@pytest.mark.parametrize("venv", VERSIONS)
def test_copy_beside_its_original_then_verify_fix_then_triton_hits_every_kernel(venv, tmp_path):
    """A copy whose original is still there: Triton hits it, reading the ORIGINAL's files; verify says so
    (still complete), --fix makes the copy stand alone, and it keeps hitting once the original is gone."""
    here = tmp_path / "a" / "cache"
    kernels = make(venv, here)
    copy = cp_r(here, tmp_path / "b" / "copied")
    checked = kcache(copy, "verify", home=tmp_path / "kc-home")
    assert checked.returncode == 1, checked.stdout
    problems = json.loads(checked.stdout)["problems"]
    assert sorted(os.path.basename(p["path"]) for p in problems) == sorted(kernels), problems
    assert all(p["status"] == "complete" and str(here) in json.dumps(p) for p in problems), problems
    assert kcache(copy, "verify", "--fix", home=tmp_path / "kc-home").returncode == 0
    here.rename(here.with_name("gone"))
    assert kcache(copy, "verify", home=tmp_path / "kc-home").returncode == 0
    assert_paths_lead_into(copy)
    assert_listed_exactly(venv, copy, kernels)
    assert_second_run_all_hits(venv, copy, kernels)


@pytest.mark.slow
@pytest.mark.parametrize("venv", VERSIONS)
def test_import_over_a_moved_copy_replaces_it_and_triton_hits(venv, tmp_path):
    """The archive imported into a root that already holds an unfixed `cp -r` of the same cache (every entry
    moved): import replaces those entries rather than skipping them as present, and Triton hits."""
    here = tmp_path / "a" / "cache"
    kernels = make(venv, here)
    archive = tmp_path / "kernels.tar"
    assert kcache(here, "export", str(archive), home=tmp_path / "kc-home").returncode == 0
    there = cp_r(here, tmp_path / "b" / "cache")
    here.rename(here.with_name("gone"))
    assert {e["status"] for e in ls(there)} == {"moved"}
    done = kcache(there, "import", str(archive), home=tmp_path / "kc-home")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["imported"], report["replaced"], report["skipped"]) == (0, len(kernels), 0), report
    assert_paths_lead_into(there)
    assert_listed_exactly(venv, there, kernels)
    assert_second_run_all_hits(venv, there, kernels)


@pytest.mark.slow
@pytest.mark.parametrize("venv", VERSIONS)
def test_relative_triton_cache_dir_survives_export_import_and_cp_r_fix(venv, tmp_path):
    """TRITON_CACHE_DIR=triton-cache (relative, as a project sets it): Triton writes RELATIVE child paths,
    which it finds only from the directory it ran in. Imported elsewhere, or copied and fixed, the kernels
    get absolute paths and Triton hits them from any directory."""
    project = tmp_path / "project"
    project.mkdir()
    first = triton(venv, "probe_triton_rerun.py", "--as-given", "triton-cache", home=tmp_path / "h", cwd=project)
    kernels = {k: v["name"] for k, v in first["kernels"].items()}
    assert {v["verdict"] for v in first["kernels"].values()} == {"recompile"}, first  # an empty cache: compiled
    here = project / "triton-cache"
    groups = list(here.glob("*/__grp__*.json"))
    assert len(groups) == len(kernels)
    assert all(p.startswith("triton-cache/") for g in groups for p in json.loads(g.read_text())["child_paths"].values())
    again = triton(venv, "probe_triton_rerun.py", "--as-given", "triton-cache", home=tmp_path / "h", cwd=project)
    assert {v["verdict"] for v in again["kernels"].values()} == {"hit"}, again  # from where Triton ran: hits
    archive = tmp_path / "kernels.tar.gz"
    assert kcache(here, "export", str(archive), home=tmp_path / "kc-home").returncode == 0
    copy = cp_r(here, tmp_path / "copied" / "cache")
    there = tmp_path / "machine-b" / "root"
    there.parent.mkdir()
    done = kcache(there, "import", str(archive), home=tmp_path / "kc-home")
    assert done.returncode == 0, done.stderr
    fixed = kcache(copy, "verify", "--fix", home=tmp_path / "kc-home")
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    here.rename(here.with_name("gone"))
    for root in (there, copy):
        assert_paths_lead_into(root)
        assert_listed_exactly(venv, root, kernels)
        assert_second_run_all_hits(venv, root, kernels)
