"""`kcache build`: real compiles (nvcc for sm_90, g++) into the hashed tree, hits, failures, locks.

Concurrency and SIGKILL stress tests are in test_build_stress.py."""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import CXX, FIXTURES, NVCC

from kcache_cli.fs import state
from kcache_cli.fs.locking import entry_lock
from kcache_cli.model.records import ScanFilter
from kcache_cli.ops import build as b
from kcache_cli.util.errors import LockTimeout

needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")

TASK = """Task(
  name: {name}
  parameters: 
    a: tensor(float32, [{n}])
    b: tensor(float32, [{n}])
    c: tensor(float32, [{n}])
  inputs: [a, b]
  outputs: [c]
  computations: 
    c: float32[{n}] where c[v] = (a[v] + b[v])
  attributes: {{}}
)"""  # hidet writes task.txt without a trailing newline

CUDA_SOURCE = """#include <cuda_runtime.h>
__global__ void vector_add(const float* a, const float* b, float* c, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}}
extern "C" int launch_{name}(const float* a, const float* b, float* c, int n) {{
    vector_add<<<(n + {n} - 1) / {n}, {n}>>>(a, b, c, n);
    return (int)cudaGetLastError();
}}
"""

CPU_SOURCE = """extern "C" int {name}_sum(int a, int b) {{ return a + b + {n} - {n}; }}
"""


def write_task(where: Path, name: str = "vadd", n: int = 256, kind: str = "cu", source: str | None = None) -> Path:
    """A task directory: task.txt plus source.cu (kind "cu") or source.cc (kind "cc")."""
    d = where / f"{name}-{n}-{kind}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "task.txt").write_bytes(TASK.format(name=name, n=n).encode())
    text = source if source is not None else (CUDA_SOURCE if kind == "cu" else CPU_SOURCE).format(name=name, n=n)
    (d / f"source.{kind}").write_text(text)
    return d


def task_hash_of(task_dir: Path) -> str:
    return hashlib.sha256((task_dir / "task.txt").read_bytes()).hexdigest()[:16]


def snapshot(path: Path) -> dict:
    """Everything that a no-op must not change: names, inodes, sizes, mtimes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), path)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def temp_dirs(root: Path) -> list[Path]:
    return sorted(root.glob(f"ops/*/*/{state.TEMP_PREFIX}*"))


# ---- CUDA --------------------------------------------------------------------------------------

@pytest.mark.nvcc
def test_cuda_entry_lands_in_the_hashed_tree(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "vadd")
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--arch", "sm_90", "--nvcc", NVCC)
    assert r.exit_code == 0, r.stderr
    h = task_hash_of(task)
    entry = root / "ops" / "cuda_space_0" / "vadd" / h
    assert r.stdout.strip() == str(entry)
    assert sorted(p.name for p in entry.iterdir()) == ["kcache.json", "lib.so", "nvcc_log.txt", "source.cu",
                                                       "task.txt"]
    assert (entry / "task.txt").read_bytes() == (task / "task.txt").read_bytes()
    assert (entry / "source.cu").read_bytes() == (task / "source.cu").read_bytes()
    assert temp_dirs(root) == []

    manifest = json.loads((entry / "kcache.json").read_text())
    assert manifest["arch"] == "sm_90" and manifest["arch_source"] == "--arch"
    assert manifest["compiler_path"] == os.path.abspath(shutil.which(NVCC))
    assert "release" in manifest["compiler_version"]
    assert manifest["kcache_version"] and manifest["platform"] and manifest["elapsed"] > 0
    for name, rec in manifest["files"].items():
        data = (entry / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert set(manifest["files"]) == {"source.cu", "task.txt", "lib.so", "nvcc_log.txt"}

    log = (entry / "nvcc_log.txt").read_text().splitlines()
    argv = shlex.split(log[0])
    assert log[0] == manifest["command"]
    assert argv[1:] == ["-shared", "-Xcompiler", "-fPIC", "-O3", "-arch=sm_90", "-o", "lib.so", "source.cu"]
    assert re.fullmatch(r"elapsed time: \d+\.\d+ seconds", log[-1])

    ls = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert [(e["hash"], e["status"], e["space"], e["op"]) for e in ls] == [(h, "complete", "cuda_space_0", "vadd")]
    info = kcache("--cache-dir", root, "inspect", h, "--json").json()
    assert info["status"] == "complete"
    assert info["facts"]["recorded_arch"] == "sm_90"
    assert "sm_90" in info["archs"]  # read from the fatbin inside lib.so
    assert "launch_vadd" in info["binaries"][0]["symbols"]
    raw = kcache("--cache-dir", root, "log", h, "--raw")
    assert raw.stdout.splitlines()[0] == log[0]


@pytest.mark.nvcc
def test_arch_mismatch_is_reported_and_force_rebuilds(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "vadd", 128)
    root = tmp_path / "cache"
    assert kcache("--cache-dir", root, "build", task, "--arch", "sm_90", "--nvcc", NVCC).exit_code == 0
    entry = root / "ops" / "cuda_space_0" / "vadd" / task_hash_of(task)
    before = snapshot(entry)

    r = kcache("--cache-dir", root, "build", task, "--arch", "sm_80", "--nvcc", NVCC)
    assert r.exit_code == 1
    assert "built for sm_90, not sm_80" in r.stderr and "--force" in r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert snapshot(entry) == before  # reported, not reused, not replaced

    r = kcache("--cache-dir", root, "build", task, "--arch", "sm_80", "--nvcc", NVCC, "--force")
    assert r.exit_code == 0, r.stderr
    assert json.loads((entry / "kcache.json").read_text())["arch"] == "sm_80"
    assert kcache("--cache-dir", root, "inspect", entry.name, "--json").json()["archs"] == ["sm_80"]
    assert not any(state.trash_dir(root).iterdir())  # the old entry went through the trash and is gone
    assert kcache("--cache-dir", root, "build", task, "--arch", "sm_80", "--nvcc", NVCC).exit_code == 0


def nvcc_own_default_arch() -> str:
    out = subprocess.run([NVCC, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    return re.search(r"ptxas .*?-arch=(sm_\w+)", out).group(1)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU is present: its arch is the default")
def test_default_arch_is_nvccs_own_and_recorded(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "vadd", 64)
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task, "--nvcc", NVCC, "--json")
    assert r.exit_code == 0, r.stderr
    res = r.json()["results"][0]
    default = nvcc_own_default_arch()
    if "release 13." in subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout:
        assert default == "sm_75"  # nvcc 13 dropped everything below Turing
    assert (res["arch"], res["arch_source"]) == (default, "nvcc default")
    assert f"-arch={default}" in shlex.split(res["command"])  # always explicit in the command
    manifest = json.loads((Path(res["path"]) / "kcache.json").read_text())
    assert (manifest["arch"], manifest["arch_source"]) == (default, "nvcc default")
    # the hit check uses the remembered default: no compiler needed, no change
    before = snapshot(Path(res["path"]))
    hit = kcache("--cache-dir", root, "build", task, "--nvcc", NVCC, "--json").json()["results"][0]
    assert hit["status"] == "hit" and hit["arch"] == default
    assert snapshot(Path(res["path"])) == before


@pytest.mark.nvcc
def test_cuda_compile_error_publishes_nothing(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "broken", source="__global__ void k(float* a) {\n    a[0] = nope;\n}\n")
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task, "--arch", "sm_90", "--nvcc", NVCC)
    assert r.exit_code == 1
    assert 'identifier "nope" is undefined' in r.stderr and "a[0] = nope;" in r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith("Error: compile failed")
    assert r.stdout == ""
    assert not (root / "ops" / "cuda_space_0" / "broken" / task_hash_of(task)).exists()
    assert temp_dirs(root) == []
    assert kcache("--cache-dir", root, "ls", "--json").json()["entries"] == []


# ---- what a compiler leaves is checked before it is published ----------------------------------

_FAKE_BODIES = {
    # exit 0 with garbage for lib.so: was published `complete` (only verify and inspect said corrupt)
    "garbage": ('head -c 1000 /dev/urandom > lib.so', "lib.so is not an ELF file"),
    "object": (f'{CXX} -c -x c++ /dev/null -o lib.so', "its lib.so is not a shared object"),
    "task": (f'{CXX} -shared -fPIC -o lib.so source.cc && echo tampered > task.txt', "it changed task.txt"),
    "link": (f'{CXX} -shared -fPIC -o lib.so source.cc && ln -s / evil', "it left 'evil', not a regular file"),
    "killed": ('kill -9 $$', "killed by signal 9"),
}


@needs_cxx
@pytest.mark.parametrize("how", sorted(_FAKE_BODIES))
def test_what_a_compiler_leaves_is_checked_before_it_is_published(tmp_path, kcache, how):
    """A compiler (a fault-injecting fake around g++) that exits 0 but wrote garbage or an object file for
    lib.so, changed task.txt or left a link: the build fails (exit 1) naming why, nothing is published;
    one killed by a signal is said to be, not "exit status -9"."""
    body, why = _FAKE_BODIES[how]
    fake = tmp_path / "fake-cxx"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *--version*) echo fake 1.0; exit 0;; esac\n{body}\n')
    fake.chmod(0o755)
    task = write_task(tmp_path / "tasks", "plus", 7, kind="cc")
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--cxx", fake)
    assert r.exit_code == 1 and f"compile failed ({why})" in r.stderr and "nothing was published" in r.stderr, \
        r.stderr
    assert kcache("--cache-dir", root, "ls", "--json").json()["entries"] == []


# ---- CPU ---------------------------------------------------------------------------------------

@needs_cxx
def test_cpu_entry_is_a_working_library(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "plus", 7, kind="cc")
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--cxx", CXX)
    assert r.exit_code == 0, r.stderr
    entry = root / "ops" / "cpu_space_0" / "plus" / task_hash_of(task)
    assert r.stdout.strip() == str(entry)
    assert sorted(p.name for p in entry.iterdir()) == ["kcache.json", "lib.so", "nvcc_log.txt", "source.cc",
                                                       "task.txt"]
    lib = ctypes.CDLL(str(entry / "lib.so"))
    assert lib.plus_sum(2, 3) == 5
    manifest = json.loads((entry / "kcache.json").read_text())
    assert manifest["arch"] == os.uname().machine and manifest["target"] == "cpu"
    assert shlex.split(manifest["command"])[1:] == ["-shared", "-fPIC", "-O3", "-o", "lib.so", "source.cc"]
    ls = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert [(e["space"], e["status"]) for e in ls] == [("cpu_space_0", "complete")]


@needs_cxx
def test_force_replaces_the_entry_in_one_step(tmp_path, kcache, monkeypatch):
    """--force exchanges the new entry with the old one (renameat2 RENAME_EXCHANGE): when the old one is
    moved into the trash, the new one already stands at the entry's path; there was no moment with none
    (a kill between the two renames left no entry). The old one is gone from the trash afterwards."""
    from kcache_cli.ops import build as build_mod

    task = write_task(tmp_path / "tasks", "plus", 9, kind="cc")
    root = tmp_path / "cache"
    entry = Path(kcache("--cache-dir", root, "build", task, "--cxx", CXX).stdout.strip())
    before = os.stat(entry).st_ino
    seen = []
    real = build_mod._trash_old

    def trash_old(*args):
        seen.append(os.stat(entry).st_ino)
        return real(*args)

    monkeypatch.setattr(build_mod, "_trash_old", trash_old)
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--force")
    assert r.exit_code == 0, r.stderr
    after = os.stat(entry).st_ino
    assert seen == [after] and after != before  # the new entry stood there before the old one left
    assert list((root / ".kcache" / "trash").iterdir()) == [] and temp_dirs(root) == []


@needs_cxx
def test_a_replaced_entry_that_cannot_go_to_the_trash_leaves_the_build_published(tmp_path, kcache, monkeypatch):
    """After the exchange the new entry is published: the old one failing to move into the trash (an
    entry another user wrote 0755: moving a directory to another parent takes write on it) must not
    turn the build into "nothing was published" and remove the old entry as if it were the temp dir.
    It stays under the temp name, a leftover prune removes once old."""
    from kcache_cli.fs import write as fswrite

    task = write_task(tmp_path / "tasks", "plus", 10, kind="cc")
    root = tmp_path / "cache"
    entry = Path(kcache("--cache-dir", root, "build", task, "--cxx", CXX).stdout.strip())
    old = os.stat(entry).st_ino

    def denied(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fswrite, "rename_at", denied)
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--force")
    assert r.exit_code == 0 and r.stdout.strip() == str(entry), r.stderr
    assert os.stat(entry).st_ino != old and (entry / "lib.so").is_file()
    [left] = temp_dirs(root)  # the old entry, whole, under the temp name
    assert os.stat(left).st_ino == old and (Path(left) / "lib.so").is_file()


@needs_cxx
def test_hit_prints_the_path_and_changes_nothing(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "plus", 8, kind="cc")
    root = tmp_path / "cache"
    first = kcache("--cache-dir", root, "build", task, "--cxx", CXX)
    assert first.exit_code == 0
    entry = Path(first.stdout.strip())
    before = snapshot(root / "ops")
    # a compiler that cannot run proves that a hit never compiles
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--cxx", "/bin/false")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == f"{entry}\n"
    assert snapshot(root / "ops") == before
    assert (state.used_dir(root) / "ops%2Fcpu_space_0%2Fplus%2F" f"{entry.name}").exists()
    # a different source for the same task is still the same entry, but people are told
    (task / "source.cc").write_text(CPU_SOURCE.format(name="plus", n=9))
    r = kcache("--cache-dir", root, "build", task, "--cxx", "/bin/false")
    assert r.exit_code == 0 and "built from another source.cc" in r.stderr
    assert snapshot(root / "ops") == before


@needs_cxx
def test_other_flags_are_a_hit_with_a_warning_naming_both(tmp_path, kcache):
    """Flags after -- (or -I directories) other than those kcache.json records gave a silent hit: the old
    binary, built without them, with no word. As with another source: a hit, and a warning naming both."""
    inc = tmp_path / "inc"
    inc.mkdir()
    task = write_task(tmp_path / "tasks", "plus", 12, kind="cc")
    root = tmp_path / "cache"
    built = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "-I", inc, "--", "-DSCALE=3")
    assert built.exit_code == 0, built.stderr
    before = snapshot(root / "ops")
    same = kcache("--cache-dir", root, "build", task, "--cxx", "/bin/false", "-I", inc, "--", "-DSCALE=3")
    assert same.exit_code == 0 and same.stdout == built.stdout and "flags" not in same.stderr, same.stderr
    other = kcache("--cache-dir", root, "build", task, "--cxx", "/bin/false", "--", "-DSCALE=4", "-g")
    said = other.stderr.replace("\n  ", " ")
    assert other.exit_code == 0 and other.stdout == built.stdout, said
    assert f"the entry's: -I{inc} -DSCALE=3; asked for: -DSCALE=4 -g" in said and "--force rebuilds it" in said
    r = kcache("--cache-dir", root, "--json", "build", task, "--cxx", "/bin/false")
    (res,) = r.json()["results"]
    assert r.exit_code == 0 and res["status"] == "hit"
    assert any("asked for: none" in n for n in res["notes"]), res["notes"]
    assert snapshot(root / "ops") == before


@needs_cxx
def test_an_installed_hidet_06_that_compiles_builds_again_is_said_once(tmp_path, kcache, monkeypatch):
    """hidet 0.6+ compiles what build makes again in place (no version.txt, meta.json, func_types.pickle):
    ls and verify said partial, and build reported a hit or a build with no word. It warns once per run,
    naming the version and what hidet needs, and --json says so per task; the exit code stays 0."""
    from kcache_cli.layouts import hidet

    plus, minus = write_task(tmp_path / "tasks", "plus", 13, kind="cc"), write_task(tmp_path / "tasks", "minus", 13,
                                                                                    kind="cc")
    root = tmp_path / "cache"
    monkeypatch.setattr(hidet, "installed_version", lambda: "")
    first = kcache("--cache-dir", root, "--json", "build", plus, "--cxx", CXX)
    assert first.exit_code == 0 and first.json()["results"][0]["recompiled_by"] is None
    assert "is installed" not in first.stderr
    monkeypatch.setattr(hidet, "installed_version", lambda: "0.5.2")  # loads them as built: nothing to say
    assert "is installed" not in kcache("--cache-dir", root, "build", plus, "--cxx", "/bin/false").stderr
    monkeypatch.setattr(hidet, "installed_version", lambda: "0.6.1")
    hit = kcache("--cache-dir", root, "build", plus, "--cxx", "/bin/false")
    said = hit.stderr.replace("\n  ", " ")
    assert hit.exit_code == 0 and hit.stdout.strip().endswith(task_hash_of(plus)), said
    assert "hidet 0.6.1 is installed" in said and "version.txt, meta.json and func_types.pickle" in said
    both = kcache("--cache-dir", root, "--json", "build", plus, minus, "--cxx", CXX)
    assert both.exit_code == 0 and both.stderr.count("hidet 0.6.1 is installed") == 1, both.stderr
    assert [(r["status"], r["recompiled_by"]) for r in both.json()["results"]] == [("hit", "hidet 0.6.1"),
                                                                                   ("built", "hidet 0.6.1")]
    assert "2 entries" in both.stderr.replace("\n  ", " ")


def _task_of_a_hidet_entry(tmp_path):
    """(a copy of the real hidet cache, its cpu matmul entry, a task directory holding that entry's task.txt
    and source.cc): a build of it hits the entry hidet made itself."""
    root = tmp_path / "hidet"
    shutil.copytree(FIXTURES / "hidet", root, symlinks=True)
    entry = root / "ops" / "cpu_space_0" / "matmul" / "064b4a6c035246e8"
    task = tmp_path / "task"
    task.mkdir()
    shutil.copy(entry / "task.txt", task / "task.txt")
    shutil.copy(entry / "source.cc", task / "source.cc")
    return root, entry, task


def test_a_hit_on_an_entry_hidet_made_says_nothing_of_compiling_again(tmp_path, kcache, monkeypatch):
    """An entry hidet 0.6.1 made itself is loaded as it is: no warning, recompiled_by null."""
    from kcache_cli.layouts import hidet

    monkeypatch.setattr(hidet, "installed_version", lambda: "0.6.1")
    root, entry, task = _task_of_a_hidet_entry(tmp_path)
    r = kcache("--cache-dir", root, "--json", "build", task, "--cxx", "/bin/false")
    (res,) = r.json()["results"]
    assert r.exit_code == 0 and res["status"] == "hit" and res["recompiled_by"] is None, r.stderr
    assert "is installed" not in r.stderr


@needs_cxx
def test_force_replaces_the_entry_atomically(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "plus", 9, kind="cc")
    root = tmp_path / "cache"
    entry = Path(kcache("--cache-dir", root, "build", task, "--cxx", CXX).stdout.strip())
    ino = (entry / "lib.so").stat().st_ino
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--force", "--json")
    assert r.exit_code == 0
    res = r.json()["results"][0]
    assert res["status"] == "built" and res["replaced"] == "complete entry"
    assert (entry / "lib.so").stat().st_ino != ino
    assert kcache("--cache-dir", root, "ls", "--json").json()["entries"][0]["status"] == "complete"
    assert temp_dirs(root) == [] and not any(state.trash_dir(root).iterdir())


@needs_cxx
def test_a_lib_so_that_differs_from_its_record_is_rebuilt_not_a_hit(tmp_path, kcache):
    """A byte of lib.so changed in place (same size): verify and inspect say corrupt, and build called it a
    hit (exit 0): a CI job would ship the damaged library. A hit goes by every byte, as verify does."""
    task = write_task(tmp_path / "tasks", "plus", 11, kind="cc")
    root = tmp_path / "cache"
    entry = Path(kcache("--cache-dir", root, "build", task, "--cxx", CXX).stdout.strip())
    lib = entry / "lib.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    assert kcache("--cache-dir", root, "verify").exit_code == 1
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--json")
    res = r.json()["results"][0]
    assert r.exit_code == 0 and res["status"] == "built" and res["replaced"].startswith("corrupt entry"), res
    assert kcache("--cache-dir", root, "verify").exit_code == 0


def test_an_entry_hidet_made_from_another_source_is_a_hit_with_a_warning(tmp_path, kcache):
    """hidet's own entries keep no kcache.json: build compared no source and said nothing, while a kcache-made
    entry of another source warns. The entry's own source.cc is what it was built from."""
    root, entry, task = _task_of_a_hidet_entry(tmp_path)
    same = kcache("--cache-dir", root, "build", task, "--cxx", "/bin/false")
    assert same.exit_code == 0 and same.stdout == f"{entry}\n" and "another source" not in same.stderr
    (task / "source.cc").write_text("extern \"C\" int f() { return 1; }\n")
    other = kcache("--cache-dir", root, "build", task, "--cxx", "/bin/false")
    assert other.exit_code == 0 and "built from another source.cc" in other.stderr, other.stderr
    if CXX is not None:  # --force over it says what hidet 0.6 will do with kcache's build (it said nothing)
        forced = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--force")
        said = forced.stderr.replace("\n  ", " ")
        assert forced.exit_code == 0 and "an entry hidet made itself" in said, said
        again = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--force")
        assert again.exit_code == 0 and "hidet made itself" not in again.stderr  # kcache's own build now


@needs_cxx
def test_a_broken_entry_at_the_path_is_replaced(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "plus", 10, kind="cc")
    root = tmp_path / "cache"
    entry = root / "ops" / "cpu_space_0" / "plus" / task_hash_of(task)
    entry.mkdir(parents=True)
    (entry / "task.txt").write_bytes((task / "task.txt").read_bytes())  # a build killed before lib.so
    assert kcache("--cache-dir", root, "ls", "--json").json()["entries"][0]["status"] == "partial"
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--json")
    res = r.json()["results"][0]
    assert r.exit_code == 0 and res["status"] == "built" and res["replaced"].startswith("partial entry")
    assert kcache("--cache-dir", root, "ls", "--json").json()["entries"][0]["status"] == "complete"


@needs_cxx
def test_include_dirs_extra_flags_space_and_target(tmp_path, kcache):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "scale.h").write_text("#define BASE 100\n")
    source = '#include "scale.h"\nextern "C" int value() { return BASE * SCALE; }\n'
    task = write_task(tmp_path / "tasks", "scaled", 3, kind="cc", source=source)
    os.rename(task / "source.cc", task / "kernel.cpp")
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task / "task.txt", "--source", task / "kernel.cpp", "--space", "2",
               "--cxx", CXX, "-I", inc, "--", "-DSCALE=3", "-Wall")
    assert r.exit_code == 0, r.stderr
    entry = Path(r.stdout.strip())
    assert entry.parent.parent.name == "cpu_space_2"
    assert (entry / "source.cc").read_text() == source  # stored under the layout's name
    assert ctypes.CDLL(str(entry / "lib.so")).value() == 300
    argv = shlex.split((entry / "nvcc_log.txt").read_text().splitlines()[0])
    assert f"-I{inc}" in argv and argv[-4:] == ["-Wall", "-o", "lib.so", "source.cc"] and "-DSCALE=3" in argv

    r = kcache("--cache-dir", root, "build", task, "--source", task / "kernel.cpp", "--", "-arch=sm_80")
    assert r.exit_code == 2 and "--arch" in r.stderr


@needs_cxx
def test_cpu_compile_error_highlights_the_failing_lines(tmp_path, kcache, monkeypatch):
    task = write_task(tmp_path / "tasks", "oops", kind="cc", source='extern "C" int f() {\n  return missing + 1;\n}\n')
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX)
    assert r.exit_code == 1
    assert re.search(r"missing.{1,3} was not declared", r.stderr) and "return missing + 1;" in r.stderr
    assert temp_dirs(root) == [] and not (root / "ops" / "cpu_space_0" / "oops" / task_hash_of(task)).exists()

    # the same failure on a colour terminal: error lines and the quoted source in red, the rest plain
    from rich.console import Console

    from kcache_cli.cli import cmd_build
    from kcache_cli.cli import common as c

    monkeypatch.delenv("NO_COLOR", raising=False)
    buf = io.StringIO()
    monkeypatch.setattr(c, "stderr_console", lambda: Console(file=buf, force_terminal=True, color_system="standard",
                                                             highlight=False, width=200))
    result = b.build_task(root, task, b.BuildOptions(cxx=CXX))
    cmd_build._show_failure(result)
    lines = {re.sub(r"\x1b\[[0-9;]*m", "", line): line for line in buf.getvalue().splitlines()}
    error = next(k for k in lines if "error:" in k and "missing" in k)
    quoted = next(k for k in lines if "return missing + 1;" in k and "error" not in k)
    assert "\x1b[1;31m" in lines[error]  # bold red
    assert "\x1b[31m" in lines[quoted]  # red
    plain = next(k for k in lines if k.startswith("$ "))
    assert "\x1b[31m" not in lines[plain] and "\x1b[1;31m" not in lines[plain]


# ---- errors that stop before compiling -----------------------------------------------------------

def _no_name_task(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "task.txt").write_text("just some text\n")
    (d / "source.cc").write_text("int x;\n")
    return d / "task.txt"


@pytest.mark.parametrize("case", ["missing-task", "no-name", "missing-source", "unknown-suffix", "no-compiler",
                                  "dotdot-op", "bad-arch", "bad-target"])
def test_setup_errors_are_one_line(tmp_path, kcache, case):
    root = tmp_path / "cache"
    tasks = tmp_path / "tasks"
    args: list = []
    if case == "missing-task":
        args = [tasks / "nope" / "task.txt"]
        want = "task file not found"
    elif case == "no-name":
        args = [_no_name_task(tasks / "t")]
        want = "no valid `name:` field"
    elif case == "missing-source":
        t = write_task(tasks, "lonely", kind="cc")
        (t / "source.cc").unlink()
        args = [t / "task.txt"]
        want = "no source.cu or source.cc next to"
    elif case == "unknown-suffix":
        t = write_task(tasks, "odd", kind="cc")
        (t / "kernel.txt").write_text("int x;\n")
        args = [t / "task.txt", "--source", t / "kernel.txt"]
        want = "cannot tell the target"
    elif case == "no-compiler":
        t = write_task(tasks, "plus", kind="cc")
        args = [t, "--cxx", tmp_path / "no" / "such" / "g++"]
        want = "compiler not found"
    elif case == "dotdot-op":
        t = write_task(tasks, "x", kind="cc")
        (t / "task.txt").write_text((t / "task.txt").read_text().replace("name: x", "name: .."))
        args = [t]
        want = "not a usable directory name"
    elif case == "bad-arch":
        t = write_task(tasks, "plus", kind="cc")
        args = [t, "--arch", "sm90; rm -rf /"]
        want = "bad arch"
    else:
        t = write_task(tasks, "plus", kind="cc")
        args = [t, "--target", "tpu"]
        want = "unknown target"
    r = kcache("--cache-dir", root, "build", *args)
    assert r.exit_code in (1, 2), r.stderr
    assert r.stderr.startswith("Error: ") and want in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert not (root / "ops").exists()  # nothing compiled, nothing published
    assert not (tmp_path / "cache" / "..").resolve().joinpath("x").exists()


@needs_cxx
def test_symlinked_op_directory_leading_out_is_refused(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "plus", 11, kind="cc")
    root = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "ops" / "cpu_space_0").mkdir(parents=True)
    os.symlink(outside, root / "ops" / "cpu_space_0" / "plus")
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX)
    assert r.exit_code == 1 and "leads outside the cache" in r.stderr
    assert list(outside.iterdir()) == []


@needs_cxx
def test_a_build_makes_its_temp_dir_under_its_lock_so_prune_and_clear_keep_it(tmp_path, monkeypatch):
    """prune and clear remove a kcache temp dir as soon as its build lock is free (its build is gone): safe
    only if a build makes its temp dir after taking the lock and holds it until it publishes. A prune and a
    clear --all run while the compiler runs: the temp dir stays, and the build publishes."""
    from kcache_cli.fs.locking import entry_build_locked
    from kcache_cli.ops import delete

    task = write_task(tmp_path / "tasks", "plus", 14, kind="cc")
    root = tmp_path / "cache"
    relpath = f"ops/cpu_space_0/plus/{task_hash_of(task)}"
    locked_at_mkdir = []
    real_make_temp, real_run = b.make_temp, b.run_compiler

    def make_temp(*args):
        locked_at_mkdir.append(entry_build_locked(root, relpath))  # another open file: the build's flock shows
        return real_make_temp(*args)

    def run_compiler(argv, cwd=None, timeout=None):
        if "--version" not in argv:
            assert [p.name for p in temp_dirs(root)] and kcache_status(root) == ["building"]
            for plan in (delete.plan_prune(root, broken=True), delete.plan_clear(root, ScanFilter(), everything=True)):
                plan.execute()
            assert len(temp_dirs(root)) == 1, "a build in flight lost its temp dir"
        return real_run(argv, cwd, timeout)

    monkeypatch.setattr(b, "make_temp", make_temp)
    monkeypatch.setattr(b, "run_compiler", run_compiler)
    res = b.build_task(root, task / "task.txt", b.BuildOptions(cxx=CXX))
    assert res.status == b.BUILT and locked_at_mkdir == [True] and temp_dirs(root) == []
    assert (root / relpath / "lib.so").is_file()


def kcache_status(root: Path) -> list[str]:
    from kcache_cli.catalog.scan import scan_cache

    return [e.status for e in scan_cache(root).entries]


# ---- many tasks ------------------------------------------------------------------------------------

@needs_cxx
def test_directory_of_tasks_in_parallel_with_a_summary(tmp_path, kcache):
    tasks = tmp_path / "tasks"
    for i in range(4):
        write_task(tasks, f"op{i}", i, kind="cc")
    bad = write_task(tasks, "bad", kind="cc", source="this is not C++\n")
    root = tmp_path / "cache"
    r = kcache("--cache-dir", root, "build", tasks, "-j", "2", "--cxx", CXX, "--json")
    assert r.exit_code == 1
    out = r.json()
    assert (out["built"], out["hits"], out["failed"]) == (4, 0, 1)
    failed = [x for x in out["results"] if x["status"] == "failed"]
    assert [x["op"] for x in failed] == ["bad"] and "this is not C++" in failed[0]["output"]
    assert "failed:" in r.stderr and "this is not C++" in r.stderr  # each failure's compiler errors shown
    assert sorted(e["op"] for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]) == [f"op{i}"
                                                                                                      for i in range(4)]

    r = kcache("--cache-dir", root, "build", tasks, "-j", "2", "--cxx", CXX)
    assert r.exit_code == 1
    assert r.stdout.splitlines()[-1] == "0 built, 4 hits, 1 failed"
    rows = r.stdout.splitlines()[1:-1]
    assert sorted(row.split()[0] for row in rows) == ["failed"] + ["hit"] * 4

    bad_dir = tasks / bad.name
    shutil.rmtree(bad_dir)
    r = kcache("--cache-dir", root, "build", *[tasks / f"op{i}-{i}-cc" / "task.txt" for i in range(4)], "--json")
    assert r.exit_code == 0 and r.json()["hits"] == 4


@needs_cxx
def test_core_api_for_other_commands(tmp_path):
    root = tmp_path / "cache"
    tasks = tmp_path / "tasks"
    dirs = [write_task(tasks, f"k{i}", i, kind="cc") for i in range(3)]
    opts = b.BuildOptions(cxx=CXX)
    found = b.find_tasks([tasks])
    assert found == [str(d / "task.txt") for d in dirs]
    first = b.build_task(root, found[0], opts)
    assert (first.status, first.relpath) == (b.BUILT, f"ops/cpu_space_0/k0/{task_hash_of(dirs[0])}")
    results = b.build_tasks(root, found, opts, jobs=2)
    assert [r.status for r in results] == [b.HIT, b.BUILT, b.BUILT]
    assert b.exit_code(results) == 0 and b.summary_json(results)["built"] == 2
    status, reason, manifest = b.entry_status(results[1].path)
    assert (status, reason, manifest["op"]) == ("complete", None, "k1")


@needs_cxx
def test_waits_for_the_lock_then_builds(tmp_path):
    root = tmp_path / "cache"
    task = write_task(tmp_path / "tasks", "plus", 12, kind="cc")
    spec = b.load_task(task)
    events: list = []
    asked = threading.Event()

    class Listener(b.BuildListener):
        def waiting(self, s, holder):
            events.append(("waiting", holder))
            asked.set()

    held = entry_lock(root, spec.relpath)
    held.acquire()
    t = threading.Thread(target=lambda: events.append(b.build_task(root, spec, b.BuildOptions(cxx=CXX),
                                                                   listener=Listener())), daemon=True)
    t.start()
    assert asked.wait(60)
    assert not (root / spec.relpath).exists()  # nothing happens while the other build holds the lock
    held.release()
    t.join(60)
    assert events[0] == ("waiting", "another kcache build")
    result = events[-1]
    assert result.status == b.BUILT and result.waited


@needs_cxx
def test_lock_timeout_exits_3(tmp_path, kcache):
    root = tmp_path / "cache"
    task = write_task(tmp_path / "tasks", "plus", 13, kind="cc")
    spec = b.load_task(task)
    with entry_lock(root, spec.relpath):
        r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--timeout", "0.2")
        assert r.exit_code == 3
        assert "waiting: another kcache build is building" in r.stderr
        assert r.stderr.rstrip().splitlines()[-1].startswith("Error: another build of")
        with pytest.raises(LockTimeout):
            b.build_task(root, spec, b.BuildOptions(cxx=CXX, timeout=0))
        r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--timeout", "0.2", "--json")
        res = r.json()["results"][0]
        assert r.exit_code == 3 and res["exit_code"] == 3
        assert res["waited"] is True and res["path"] == str(root / spec.relpath)  # as the text says it waited
    assert not (root / spec.relpath).exists() and temp_dirs(root) == []
    assert kcache("--cache-dir", root, "build", task, "--cxx", CXX).exit_code == 0


@needs_cxx
def test_compiler_from_environment(tmp_path, kcache, monkeypatch):
    wrapper = tmp_path / "my-cxx"
    log = tmp_path / "calls"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {CXX} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", f"{wrapper} -DFROM_ENV=1")
    task = write_task(tmp_path / "tasks", "envy", kind="cc", source='extern "C" int f() { return FROM_ENV; }\n')
    r = kcache("--cache-dir", tmp_path / "cache", "build", task)
    assert r.exit_code == 0, r.stderr
    assert "-DFROM_ENV=1" in log.read_text()
    manifest = json.loads((Path(r.stdout.strip()) / "kcache.json").read_text())
    assert manifest["compiler_path"] == str(wrapper)


def test_build_help_has_an_example(kcache):
    r = kcache("build", "--help")
    assert r.exit_code == 0 and "Example:" in r.stdout and "--arch" in r.stdout


# ---- entries that real hidet made ----------------------------------------------------------------

def test_real_hidet_entries_are_hits_checked_against_their_binary(fixture_copy, kcache, tmp_path):
    root = fixture_copy("hidet")
    before = snapshot(root / "ops")
    # every entry holds its own task.txt and source: building the tree from itself finds all of them
    r = kcache("--cache-dir", root, "build", root / "ops", "--arch", "sm_90a", "--nvcc", "/bin/false",
               "--cxx", "/bin/false", "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert (out["built"], out["hits"], out["failed"]) == (0, 5, 0)
    cuda = [x for x in out["results"] if x["target"] == "cuda"]
    assert {(x["arch"], x["arch_source"]) for x in cuda} == {("sm_90a", "lib.so")}  # read from the fatbin
    assert snapshot(root / "ops") == before

    entry = root / "ops" / "cuda_space_0" / "add" / "8d1f7691cdf75e90"
    r = kcache("--cache-dir", root, "build", entry, "--arch", "sm_90", "--nvcc", "/bin/false")
    assert r.exit_code == 1 and "built for sm_90a, not sm_90" in r.stderr
    assert snapshot(root / "ops") == before


@needs_cxx
def test_waits_while_hidet_compiles_the_entry(tmp_path, kcache):
    import fcntl

    task = write_task(tmp_path / "tasks", "plus", 14, kind="cc")
    root = tmp_path / "cache"
    entry = root / "ops" / "cpu_space_0" / "plus" / task_hash_of(task)
    entry.mkdir(parents=True)
    (entry / "task.txt").write_bytes((task / "task.txt").read_bytes())
    fd = os.open(entry / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what hidet's FileLock does while it compiles in place
    try:
        assert kcache("--cache-dir", root, "ls", "--json").json()["entries"][0]["status"] == "building"
        r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--timeout", "0.3")
        assert r.exit_code == 3 and "waiting: hidet is building" in r.stderr
        assert sorted(os.listdir(entry)) == [".lock", "task.txt"]  # left alone
    finally:
        os.close(fd)
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX, "--json")
    assert r.exit_code == 0 and r.json()["results"][0]["replaced"].startswith("partial entry")


def test_two_sources_need_a_choice(tmp_path, kcache):
    t = write_task(tmp_path / "tasks", "both", kind="cc")
    (t / "source.cu").write_text("int y;\n")
    r = kcache("--cache-dir", tmp_path / "cache", "build", t)
    assert r.exit_code == 1 and "both source.cu and source.cc" in r.stderr
    spec = b.load_task(t / "task.txt", b.BuildOptions(target="cpu"))
    assert spec.source_path.endswith("source.cc") and spec.space == "cpu_space_0"


@needs_cxx
def test_manifest_is_the_completion_marker(tmp_path, kcache, monkeypatch):
    """kcache.json is stamped after every file it lists, so `ls` trusts an untouched entry without
    reading it, and reads it (and finds the damage) once a file changed after the build."""
    import kcache_cli.layouts.hidet as hidet_mod

    task = write_task(tmp_path / "tasks", "marker", 3, kind="cc")
    root = tmp_path / "cache"
    assert kcache("--cache-dir", root, "build", task / "task.txt", "--cxx", CXX).exit_code == 0
    entry = root / "ops" / "cpu_space_0" / "marker" / task_hash_of(task)
    marker = (entry / "kcache.json").stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns < marker for p in entry.iterdir() if p.name != "kcache.json")
    reads = []
    real = hidet_mod._manifest_mismatch
    monkeypatch.setattr(hidet_mod, "_manifest_mismatch", lambda d, n: reads.append(d.path) or real(d, n))
    assert kcache("--cache-dir", root, "ls", "--json").json()["entries"][0]["status"] == "complete"
    assert reads == []
    with open(entry / "nvcc_log.txt", "ab") as f:
        f.write(b"appended later\n")
    (row,) = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert row["status"] == "corrupt" and "nvcc_log.txt" in row["reason"] and reads == [str(entry)]
