"""The scan index (kcache_cli/catalog/index.py) answers unchanged tilus programs, keyed by every name in the
program's tree and by the failed build the scripts recorded for it (carried in the job), and never stale: a
file rewritten in place, a name added deep in module/, or another failed build recorded after the scan
sends the program back to the real scan, whose answer it equals. Scripts are judged every time: their
verdict goes by their programs and they hold links; a program being built (partial) is never stored."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from test_index import aged, both, counting_judge, served

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.layouts import tilus

REAL = Path(__file__).parent / "fixtures/real/tilus"
RACY = 0.05
PROGRAM = "programs/f006237ca7a5"
SCRIPT = "scripts/add_one/1-845a0ed6"
FAILED = "programs/0badc0de0bad"


@pytest.fixture
def judged(monkeypatch):
    return counting_judge(monkeypatch, tilus, "_program_entry")


def record_failure(root: Path, n: int, error: str) -> None:
    """tilus's record of a failed build of FAILED under the script: failed/building/<n>.txt."""
    record = root / SCRIPT / "failed/building"
    record.mkdir(parents=True, exist_ok=True)
    (record / f"{n}.txt").write_text(f"nvcc -o {root}/{FAILED}/module/lib.so\n"
                                     f"{root}/{FAILED}/module/source.cu(42): error: {error}\n")


@pytest.fixture
def cache(tmp_path) -> Path:
    """The real tilus cache plus a second program whose build failed (no lib.so, tilus's record of it)."""
    root = tmp_path / "tilus"
    shutil.copytree(REAL, root, symlinks=True)
    shutil.copytree(root / PROGRAM, root / FAILED, symlinks=True)
    for n in ("lib.so", "nvcc_output.txt", "func_types.pickle"):
        (root / FAILED / "module" / n).unlink()
    record_failure(root, 0, "identifier \"k\" is undefined")
    aged(root)
    time.sleep(RACY * 2)
    return root


def primed(root: Path, judged: list[str]) -> None:
    got = served(root, judged)
    assert {e.hash: e.status for e in got if e.kind == "program"} == {"f006237ca7a5": "complete",
                                                                      "0badc0de0bad": "failed"}


def test_unchanged_programs_are_answered_from_the_index(cache, judged):
    primed(cache, judged)


def test_a_lib_rewritten_in_place_is_judged_again(cache, judged):
    primed(cache, judged)
    lib = cache / PROGRAM / "module/lib.so"
    st = lib.stat()
    lib.write_bytes(b"\0" * st.st_size)  # same size, times put back: only its ctime tells
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(RACY * 2)
    got, real = both(cache, judged)
    assert judged == ["f006237ca7a5"] and got == real
    assert next(e for e in got if e.hash == "f006237ca7a5").status == "corrupt"


def test_a_fifo_where_tilus_loads_lib_so_is_unreadable_and_never_stored(cache, judged):
    """A FIFO module/lib.so leaves the program unjudged (tilus's load blocks on it; kcache never opens it):
    `unreadable` is never stored (its corrupt verdict was), so every scan judges it again."""
    lib = cache / PROGRAM / "module/lib.so"
    lib.unlink()
    os.mkfifo(lib)
    aged(cache)
    time.sleep(RACY * 2)
    scan_cache(cache, use_index=True)
    judged.clear()
    got, real = both(cache, judged)
    assert got == real and judged == ["f006237ca7a5"], judged
    assert next(e for e in got if e.hash == "f006237ca7a5").status == "unreadable"


def test_a_name_added_deep_in_the_tree_is_judged_again(cache, judged):
    primed(cache, judged)
    (cache / FAILED / "module/lib.so").write_bytes((cache / PROGRAM / "module/lib.so").read_bytes())
    time.sleep(RACY * 2)
    got, real = both(cache, judged)
    assert judged == ["0badc0de0bad"] and got == real
    assert next(e for e in got if e.hash == "0badc0de0bad").status != "failed"


def test_a_failed_build_recorded_later_is_not_served_stale(cache, judged):
    """The failure lives in a script's tree, not the program's: the job carries it."""
    primed(cache, judged)
    record_failure(cache, 1, "expected a \";\"")
    os.utime(cache / SCRIPT / "failed/building/1.txt", (time.time() + 5, time.time() + 5))  # the latest
    time.sleep(RACY * 2)
    got, real = both(cache, judged)
    assert judged == ["0badc0de0bad"] and got == real
    assert "expected a" in (next(e for e in got if e.hash == "0badc0de0bad").reason or "")
