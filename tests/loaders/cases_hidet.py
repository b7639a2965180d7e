"""hidet's damage matrix: the real cache (tests/fixtures/real/hidet, hidet 0.6.1) plus what `make_hidet.py`
adds (a compiled cpu graph) and an entry `kcache build` made, damaged one way per case.

`hidet_source(base, python)` makes that tree (the hidet venv compiles the graph with g++, kcache compiles
its own entry with g++); `cases(graph)` lists the cases. Nothing here says what hidet does: the probe
measures it (matrix.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from loaders.matrix import (
    Case,
    add_file,
    chain,
    dangling_link,
    empty,
    garbage,
    link_to_good,
    missing,
    mode000,
    one_mtime,
    replace_text,
    truncated,
)

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "fixtures" / "real" / "hidet"
RELU = "ops/cpu_space_0/relu/31857fe085635b31"  # cpu, real hidet 0.6.1
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"  # cpu, with hidet's run-time dispatch_table.txt
SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"  # cuda, nvcc for sm_90a
BUILT = "ops/cpu_space_0/relu/74f9c4149e9b9b3d"  # made by `kcache build` (hidet made it first: its task)


def hidet_source(base: Path, python: Path) -> tuple[Path, str]:
    """The undamaged tree: base/cache (the root), base/tasks (every op's task.pickle). -> (root, graph)."""
    root = base / "cache"
    shutil.copytree(FIXTURE, root, symlinks=True)
    done = subprocess.run([str(python), str(HERE / "make_hidet.py"), str(root), str(base / "tasks")],
                          capture_output=True, text=True, env=dict(os.environ, HOME=str(base)), timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"make_hidet.py failed: {done.stderr[-2000:]}")
    graph = done.stdout.strip().splitlines()[-1]
    _kcache_build(root, base)
    return root, graph


def _kcache_build(root: Path, base: Path) -> None:
    """hidet's entry BUILT replaced by one `kcache build` compiles from the same task.txt and source.cc."""
    inputs = base / "built-from"
    inputs.mkdir()
    for name in ("task.txt", "source.cc"):
        shutil.copy(root / BUILT / name, inputs / name)
    # hidet's headers and runtime, as hidet's own compile.sh names them
    flags = [t for t in (root / BUILT / "compile.sh").read_text().split() if t.startswith(("-I", "-L", "-l"))]
    shutil.rmtree(root / BUILT)  # the test's own copy
    cmd = [sys.executable, "-c", "from kcache_cli.cli.app import main; main()", "--cache-dir", str(root), "build",
           str(inputs / "task.txt"), "--source", str(inputs / "source.cc"), "--", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HOME=str(base)), timeout=600)
    if done.returncode != 0 or not (root / BUILT / "lib.so").exists():
        raise RuntimeError(f"kcache build failed: {done.stderr[-2000:]}")


def _f(entry: str, *names: str) -> list[str]:
    return [f"{entry}/{n}" for n in names]


def _per_file(entry: str) -> list[Case]:
    """Each of a cpu entry's files damaged in each way that means something for it."""
    ops: list[tuple[str, list[str], object]] = [
        ("missing", ["lib.so", "func_types.pickle", "meta.json", "version.txt", "task.txt", "task.pickle",
                     "source.cc", "compile.sh", "gcc_output.txt", "candidates.txt", "candidates.json",
                     "dispatch_table.txt", ".lock"], missing),
        ("empty", ["lib.so", "func_types.pickle", "meta.json", "version.txt", "task.txt", "dispatch_table.txt"],
         empty),
        ("truncated", ["lib.so", "func_types.pickle", "meta.json"], truncated),
        ("garbage", ["lib.so", "func_types.pickle", "meta.json", "task.txt", "dispatch_table.txt", "task.pickle"],
         garbage),
        ("link to a good copy", ["lib.so", "func_types.pickle", "meta.json", "version.txt"], link_to_good),
        ("dangling link", ["lib.so", "func_types.pickle", "meta.json", "task.txt"], dangling_link),
    ]
    out = []
    for what, names, damage in ops:
        for n in names:
            out.append(Case("hidet", f"{n} {what}", entry, damage(f"{entry}/{n}")))  # type: ignore[operator]
    for n in ("lib.so", "func_types.pickle", "meta.json", "version.txt", "task.txt", "source.cc", ".lock"):
        out.append(Case("hidet", f"{n} mode 000", entry, mode000(f"{entry}/{n}"), as_owner=True))
    return out


def _versions(entry: str) -> list[Case]:
    v = f"{entry}/version.txt"
    return [
        Case("hidet", "version.txt 0.5.0 (older hidet)", entry, replace_text(v, "0.5.0")),
        Case("hidet", "version.txt 0.7.0 (newer hidet)", entry, replace_text(v, "0.7.0")),
        Case("hidet", "version.txt 0.5.0, meta.json garbage", entry,
             chain(replace_text(v, "0.5.0"), garbage(f"{entry}/meta.json"))),
        Case("hidet", "version.txt 0.5.0, lib.so empty", entry,
             chain(replace_text(v, "0.5.0"), empty(f"{entry}/lib.so"))),
        Case("hidet", "version.txt 0.5.0, meta.json mode 000", entry,
             chain(replace_text(v, "0.5.0"), mode000(f"{entry}/meta.json")), as_owner=True),
        Case("hidet", "version.txt 0.5.0, task.txt mode 000", entry,
             chain(replace_text(v, "0.5.0"), mode000(f"{entry}/task.txt")), as_owner=True),
        Case("hidet", "version.txt missing, meta.json missing", entry,
             chain(missing(v), missing(f"{entry}/meta.json"))),
        Case("hidet", "another entry's version.txt 0.7.0", entry, replace_text(f"{SOFTMAX}/version.txt", "0.7.0")),
    ]


def _leftovers(entry: str) -> list[Case]:
    """What a hidet killed at each step of compile_task_from_scratch leaves in place (it writes in place)."""
    later = ("meta.json", "candidates.txt", "candidates.json", "source.cc", "compile.sh", "lib.so",
             "gcc_output.txt", "func_types.pickle", "dispatch_table.txt", "dispatch_table.txt.lock",
             "dispatch_table.txt.t_lock")
    return [
        Case("hidet", "killed after writing task files", entry, chain(*(missing(p) for p in _f(entry, *later)))),
        Case("hidet", "killed before func_types.pickle", entry,
             chain(*(missing(p) for p in _f(entry, "func_types.pickle", "dispatch_table.txt")))),
        Case("hidet", "killed while the compiler wrote lib.so", entry,
             chain(truncated(f"{entry}/lib.so"), *(missing(p) for p in _f(entry, "func_types.pickle",
                                                                             "gcc_output.txt")))),
    ]


def _cuda(entry: str) -> list[Case]:
    return [
        Case("hidet", "cuda: pristine", entry, lambda root: None),
        Case("hidet", "cuda: lib.so missing", entry, missing(f"{entry}/lib.so")),
        Case("hidet", "cuda: lib.so truncated", entry, truncated(f"{entry}/lib.so")),
        Case("hidet", "cuda: func_types.pickle garbage", entry, garbage(f"{entry}/func_types.pickle")),
        Case("hidet", "cuda: meta.json missing", entry, missing(f"{entry}/meta.json")),
        Case("hidet", "cuda: version.txt 0.5.0", entry, replace_text(f"{entry}/version.txt", "0.5.0")),
    ]


def _graph(g: str) -> list[Case]:
    return [
        Case("hidet", "graph: pristine", g, lambda root: None),
        Case("hidet", "graph: graph_execution.json missing", g, missing(f"{g}/graph_execution.json")),
        Case("hidet", "graph: graph_string.txt missing", g, missing(f"{g}/graph_string.txt")),
        Case("hidet", "graph: meta.json garbage", g, garbage(f"{g}/meta.json")),
        Case("hidet", "graph: weights.npz missing", g, missing(f"{g}/weights.npz")),
        Case("hidet", "graph: kernels/0/meta.json missing", g, missing(f"{g}/kernels/0/meta.json")),
        Case("hidet", "graph: kernels/0/lib.so truncated", g, truncated(f"{g}/kernels/0/lib.so")),
        Case("hidet", "graph: kernels/0/func_types.pickle missing", g, missing(f"{g}/kernels/0/func_types.pickle")),
        Case("hidet", "graph: kernels/1 missing", g, missing(f"{g}/kernels/1")),
        Case("hidet", "graph: graph_module/lib.so empty", g, empty(f"{g}/graph_module/lib.so")),
        Case("hidet", "graph: kernels/0/version.txt 0.5.0", g, replace_text(f"{g}/kernels/0/version.txt", "0.5.0")),
    ]


def cases(graph: str) -> list[Case]:
    return [
        Case("hidet", "pristine", RELU, lambda root: None),
        *_per_file(RELU),
        Case("hidet", "junk file added", RELU, add_file(f"{RELU}/junk.txt")),
        Case("hidet", "candidates/ kept (debug_cache_tuning)", RELU, add_file(f"{RELU}/candidates/0/lib.so",
                                                                              b"\x7fELF")),
        Case("hidet", "one mtime for every file", RELU, one_mtime()),
        Case("hidet", "dispatch_table.txt garbage (matmul)", MATMUL, garbage(f"{MATMUL}/dispatch_table.txt")),
        *_versions(RELU),
        *_leftovers(RELU),
        *_cuda(SOFTMAX),
        *_graph(graph),
        Case("hidet", "made by kcache build", BUILT, lambda root: None),
        Case("hidet", "made by kcache build, lib.so truncated", BUILT, truncated(f"{BUILT}/lib.so")),
    ]
