"""`build` streams its source (issue 21: a 3 GB source was read whole into memory): copied into the entry
and hashed in chunks, so kcache's peak memory does not grow with the source. Measured on a sparse source
(no disk for the input) through the real CLI, with a real g++ behind a wrapper that compiles a small
file (the compiler's own memory is not kcache's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CXX
from test_build import TASK

SOURCE_SIZE = 512 << 20  # read whole, as before, this alone would be 512 MiB of peak RSS
RSS_LIMIT = 160 << 20  # kcache's own peak with the source streamed (an interpreter with its imports: ~60 MiB)
TIMEOUT = 300
needs_cxx = pytest.mark.skipif(CXX is None, reason="g++ not found")


# kcache in a process of its own, reporting its peak resident memory (VmHWM) at exit. Not wait4's ru_maxrss:
# that keeps the high-water mark of the forked child before its exec, which is pytest's own size.
MEASURED = """
import atexit, sys
def report():
    with open("/proc/self/status") as f:
        peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(path, "w") as out:
        out.write(peak)
atexit.register(report)
path, sys.argv = sys.argv[1], ["kcache", *sys.argv[2:]]
if sys.argv[1:2] == ["--allocate"]:
    b = bytearray(300 << 20)
    b[::4096] = b"x" * len(b[::4096])
    sys.exit(0)
from kcache_cli.cli.app import main
main()
"""


def run_measured(tmp_path: Path, *args) -> tuple[subprocess.CompletedProcess, int]:
    """Run the CLI; (result, kcache's own peak RSS in bytes: the compiler's is its own)."""
    report = tmp_path / f"peak-{len(list(tmp_path.glob('peak-*')))}"
    r = subprocess.run([sys.executable, "-c", MEASURED, str(report), *map(str, args)], capture_output=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return r, int(report.read_text()) * 1024


def small_compiler(tmp_path: Path) -> Path:
    """A C++ "compiler" that builds lib.so from a small file whatever the source (the source's size is
    kcache's business here, not g++'s)."""
    small = tmp_path / "small.cc"
    small.write_text('extern "C" int plus_one(int x) { return x + 1; }\n')
    wrapper = tmp_path / "cxx"
    wrapper.write_text(f'#!/bin/sh\nfor a; do case "$a" in --version|-v) exec {CXX} --version;; esac; done\n'
                       f'exec {CXX} -shared -fPIC -O0 -o lib.so {small}\n')
    wrapper.chmod(0o755)
    return wrapper


@needs_cxx
def test_a_big_sparse_source_is_streamed(tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    (task / "task.txt").write_text(TASK.format(name="big", n=8))
    with open(task / "source.cc", "wb") as f:
        f.write(b'extern "C" int f() { return 1; }\n')
        f.truncate(SOURCE_SIZE)  # the rest is a hole: no disk, but every byte is read
    cxx = small_compiler(tmp_path)
    root = tmp_path / "cache"
    r, peak = run_measured(tmp_path, "--cache-dir", root, "build", task, "--cxx", cxx, "--json")
    assert r.returncode == 0, r.stderr
    print(f"peak RSS building from a {SOURCE_SIZE >> 20} MiB source: {peak >> 20} MiB")
    assert peak < RSS_LIMIT
    entry = Path(__import__("json").loads(r.stdout)["results"][0]["path"])
    assert (entry / "source.cc").stat().st_size == SOURCE_SIZE
    # a hit compares the source with the one recorded: hashed in chunks too
    hit, peak = run_measured(tmp_path, "--cache-dir", root, "build", task, "--cxx", cxx)
    assert hit.returncode == 0, hit.stderr
    print(f"peak RSS of the hit: {peak >> 20} MiB")
    assert peak < RSS_LIMIT
    with open(task / "source.cc", "r+b") as f:
        f.seek(SOURCE_SIZE - 1)
        f.write(b"x")
    changed, _ = run_measured(tmp_path, "--cache-dir", root, "build", task, "--cxx", cxx)
    assert changed.returncode == 0 and b"was built from another source.cc" in changed.stderr, changed.stderr


def test_a_fifo_source_is_refused_not_waited_on(tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    (task / "task.txt").write_text(TASK.format(name="pipe", n=8))
    os.mkfifo(task / "source.cc")
    r = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(tmp_path / "cache"), "build",
                        str(task), "--cxx", "/bin/true"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and "source" in r.stderr, r.stderr
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("source.cc"))


def test_the_measurement_sees_an_allocation(tmp_path):
    """The measurement itself: a process that allocates shows it, so a whole read would have."""
    r, peak = run_measured(tmp_path, "--allocate")
    assert r.returncode == 0, r.stderr
    assert peak > 300 << 20


def test_a_source_swapped_for_a_fifo_after_it_was_found_is_refused(tmp_path):
    """Past the task's checks, the copy itself opens the source as a regular file only."""
    from kcache_cli.ops.build import BuildError, _source_chunks

    fifo = tmp_path / "source.cc"
    os.mkfifo(fifo)
    with pytest.raises(BuildError, match="cannot read source"):
        list(_source_chunks(str(fifo)))
