"""`kcache prune --max-size` while 4 processes build (real g++ through `kcache build`) and read
entries: no build fails, no reader sees a partial entry in the cache, and the size ends under the limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcache_cli.catalog.scan import scan_cache

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from gen_cache import generate  # noqa: E402

CXX = os.environ.get("CXX") or "g++"
TASKS = 12
WORKERS = 4
PRUNES = 12
LIMIT = 120_000  # bytes: about half of what the builds alone make, far below the generated cache

# One worker: build a task with the real CLI, then read every entry it can see; repeat until told to stop.
# A visible entry (a directory named like a hash in an op directory) must hold a complete set of files;
# one that an opened handle sees emptied is fine if it is no longer at that path (it was moved away
# whole, into the trash), which the inode check tells apart.
WORKER = r'''
import json, os, random, subprocess, sys, time
root, tasks_dir, stop, seed, cxx = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
KCACHE = {"task.txt", "lib.so", "nvcc_log.txt", "kcache.json"}
GENERATED = {"task.txt", "lib.so", "compile.sh", "nvcc_output.txt", "version.txt", "meta.json", "func_types.pickle"}
rng = random.Random(seed)
tasks = sorted(os.listdir(tasks_dir))
report = {"builds": 0, "build_failures": [], "checked": 0, "partial": []}

def read_all():
    ops = os.path.join(root, "ops")
    for space in os.listdir(ops) if os.path.isdir(ops) else ():
        try:
            opnames = os.listdir(os.path.join(ops, space))
        except FileNotFoundError:
            continue
        for op in opnames:
            try:
                names = os.listdir(os.path.join(ops, space, op))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for h in names:
                if h.startswith("."):
                    continue  # a build's temp dir: not an entry
                path = os.path.join(ops, space, op, h)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                except FileNotFoundError:
                    continue  # gone between the listing and the open: whole
                try:
                    ino = os.fstat(fd).st_ino
                    files = set(os.listdir(fd))
                finally:
                    os.close(fd)
                report["checked"] += 1
                if not (KCACHE <= files or GENERATED <= files):
                    try:
                        still_there = os.stat(path).st_ino == ino
                    except FileNotFoundError:
                        still_there = False
                    if still_there:
                        report["partial"].append([path, sorted(files)])

while not os.path.exists(stop):
    task = os.path.join(tasks_dir, rng.choice(tasks), "task.txt")
    p = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", root, "-q", "build", task,
                        "--cxx", cxx, "--json"], capture_output=True, text=True)
    report["builds"] += 1
    try:
        statuses = [r["status"] for r in json.loads(p.stdout)["results"]]
    except ValueError:
        statuses = []
    if p.returncode != 0 or not statuses or any(s not in ("built", "hit") for s in statuses):
        report["build_failures"].append([task, p.returncode, p.stdout[-500:], p.stderr[-1000:]])
    read_all()
print(json.dumps(report))
'''


def make_tasks(where: Path) -> None:
    for i in range(TASKS):
        d = where / f"t{i:02d}"
        d.mkdir(parents=True)
        op = f"stress_op{i % 3}"
        (d / "task.txt").write_bytes(
            (f"Task(\n  name: {op}\n  parameters: \n    a: tensor(float32, [{i + 1}, 4])\n  inputs: [a]\n"
             f"  outputs: [a]\n  computations: \n    a: float32[{i + 1}, 4]\n  attributes: {{}}\n)").encode())
        (d / "source.cc").write_text(
            f'#include <cstddef>\nextern "C" int kernel_{i}(float* a, std::size_t n) {{\n'
            f"  for (std::size_t j = 0; j < n; ++j) a[j] = a[j] * {i + 2}.0f + 1.0f;\n  return {i};\n}}\n")


@pytest.mark.slow
def test_prune_max_size_while_building_and_reading(tmp_path):
    if not shutil_which(CXX):
        pytest.skip(f"{CXX} not found")
    root = tmp_path / "cache"
    generate(str(root), 150)  # older entries for prune to start on
    tasks = tmp_path / "tasks"
    make_tasks(tasks)
    stop = tmp_path / "stop"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(root), str(tasks), str(stop), str(seed), CXX],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
               for seed in range(WORKERS)]
    prunes = []
    try:
        time.sleep(1.0)  # let the builds start
        for _ in range(PRUNES):
            p = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "-q", "prune", "--yes",
                                "--max-size", f"{LIMIT}B", "--json"], capture_output=True, text=True, env=env,
                               cwd=str(tmp_path))
            assert p.returncode == 0, p.stderr
            prunes.append(json.loads(p.stdout))
            time.sleep(0.2)
    finally:
        stop.touch()
        outs = [w.communicate(timeout=120) for w in workers]
    reports = []
    for w, (out, err) in zip(workers, outs):
        assert w.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))

    failures = [f for r in reports for f in r["build_failures"]]
    assert failures == [], failures[:3]
    partial = [p for r in reports for p in r["partial"]]
    assert partial == [], partial[:3]
    assert sum(r["builds"] for r in reports) >= WORKERS and sum(r["checked"] for r in reports) > 0
    # every concurrent prune brought what it saw under the limit, and really removed things
    assert all(p["size_after"] <= LIMIT for p in prunes), [(p["size_before"], p["size_after"]) for p in prunes]
    assert prunes[0]["entry_count"] > 100 and sum(p["entry_count"] for p in prunes) > prunes[0]["entry_count"]
    assert not [p for p in prunes if p["errors"]]
    # what the cache holds now: whole entries only; builds made after the last prune may add to it,
    # and one more prune (nothing running now) brings it under the limit
    result = scan_cache(root)
    assert {e.status for e in result.entries} == {"complete"}
    assert not [e for e in result.entries if os.path.basename(e.path).startswith(".")]
    p = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "prune", "--yes", "--max-size",
                        f"{LIMIT}B", "--json"], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert scan_cache(root).size <= LIMIT
    assert list((root / ".kcache" / "trash").iterdir()) == []


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)
