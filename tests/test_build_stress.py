"""`kcache build` under stress: many processes building one entry, builds killed with SIGKILL."""

from __future__ import annotations

import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CXX, NVCC
from test_build import task_hash_of, temp_dirs, write_task

from kcache_cli.ops import build as b


def kcache_proc(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kcache_cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def counting_wrapper(where: Path, real: str, counter: Path, delay: float = 0.0) -> Path:
    """A compiler that appends its arguments to `counter`, optionally dawdles, then runs the real one."""
    script = where / f"counting-{Path(real).name}"
    pause = f"sleep {delay}\n" if delay else ""
    script.write_text(f'#!/bin/sh\necho "$@" >> "{counter}"\n{pause}"{real}" "$@"\nrc=$?\n{pause}exit $rc\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def compiles(counter: Path) -> int:
    """Compile invocations only (`--version` and `--dryrun` probes are not compiles)."""
    if not counter.exists():
        return 0
    return sum(1 for line in counter.read_text().splitlines() if "-shared" in line.split())


def assert_complete_or_absent(entry: Path) -> bool:
    """The published path holds a whole entry or nothing: never a partial one."""
    if not os.path.lexists(entry):
        return False
    status, reason, manifest = b.entry_status(str(entry))
    assert status == "complete", (entry, status, reason, sorted(os.listdir(entry)))
    assert manifest is not None, f"{entry} has no kcache.json (written last): a partial entry was published"
    assert (entry / "nvcc_log.txt").read_text().rstrip().splitlines()[-1].startswith("elapsed time:")
    for name, rec in manifest["files"].items():
        assert (entry / name).stat().st_size == rec["size"], name
    return True


@pytest.mark.nvcc
@pytest.mark.slow
def test_eight_processes_one_compile(tmp_path, kcache):
    task = write_task(tmp_path / "tasks", "vadd", 512)
    root = tmp_path / "cache"
    counter = tmp_path / "nvcc-calls"
    nvcc = counting_wrapper(tmp_path, shutil.which(NVCC) or NVCC, counter)
    procs = [kcache_proc("--cache-dir", root, "build", task / "task.txt", "--arch", "sm_90", "--nvcc", nvcc)
             for _ in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    entry = root / "ops" / "cuda_space_0" / "vadd" / task_hash_of(task)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out == f"{entry}\n"
    assert compiles(counter) == 1
    assert assert_complete_or_absent(entry)
    ls = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert [(e["hash"], e["status"]) for e in ls] == [(entry.name, "complete")]
    assert temp_dirs(root) == []


@pytest.mark.skipif(CXX is None, reason="g++ not found")
@pytest.mark.slow
def test_sigkill_at_random_moments_never_leaves_a_partial_entry(tmp_path, kcache, stress_seed):
    task = write_task(tmp_path / "tasks", "plus", 21, kind="cc")
    root = tmp_path / "cache"
    counter = tmp_path / "cxx-calls"
    slow = counting_wrapper(tmp_path, CXX, counter, delay=0.15)  # stretches the compile and publish phases
    entry = root / "ops" / "cpu_space_0" / "plus" / task_hash_of(task)
    args = ("--cache-dir", root, "build", task / "task.txt", "--cxx", slow)

    start = time.monotonic()
    p = kcache_proc(*args)
    assert p.wait(120) == 0, p.stderr.read()
    whole = time.monotonic() - start
    rng = random.Random(stress_seed)
    kills = published = rounds = 0
    while kills < 24 and rounds < 80:
        rounds += 1
        if os.path.lexists(entry):
            shutil.rmtree(entry)  # every round is a miss again
        p = kcache_proc(*args, start_new_session=True)
        time.sleep(rng.uniform(0.0, whole * 1.1))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.communicate(timeout=120)
        published += assert_complete_or_absent(entry)
        # a reader right now sees no half-written entry at the hash either
        assert [e["status"] for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"]
                if e["hash"] == entry.name] in ([], ["complete"])
    assert kills >= 24, (kills, rounds)
    time.sleep(0.5)  # let orphaned compilers of killed builds finish writing into their temp dirs

    leftovers = temp_dirs(root)
    assert leftovers  # some kills landed while a temp directory existed
    r = kcache("--cache-dir", root, "build", task, "--cxx", CXX)
    assert r.exit_code == 0, r.stderr
    assert assert_complete_or_absent(entry)
    partial = kcache("--cache-dir", root, "ls", "--status", "partial", "--json").json()["entries"]
    assert sorted(e["path"] for e in partial) == sorted(str(p) for p in leftovers)
    assert all(e["reason"] == "temp directory left by an interrupted kcache build" for e in partial)
    # their builds are gone (their locks are free): the next prune removes them at once, not in an hour
    r = kcache("--cache-dir", root, "prune")
    assert r.exit_code == 0 and temp_dirs(root) == [], r.stderr
    assert kcache("--cache-dir", root, "verify").exit_code == 0
    print(f"{kills} kills, {published} published before the kill, {len(leftovers)} temp dirs left")


def dawdling_compiler(where: Path, real: str) -> tuple[Path, Path]:
    """A compiler wrapper (fault injection) that, on every call (a compile, its --version probe), notes the
    pid of the `sleep` it starts in a file of its own (`compile-*` or `probe-*`), and waits on it before
    running the real compiler: (the wrapper, the notes' directory)."""
    notes = where / "started"
    notes.mkdir()
    script = where / "dawdling-cxx"
    script.write_text(f'#!/bin/sh\ncase " $* " in *" -shared "*) kind=compile;; *) kind=probe;; esac\n'
                      f'sleep 30 &\necho $! > "{notes}/$kind-$$"\nwait $!\nexec "{real}" "$@"\n')
    script.chmod(0o755)
    return script, notes


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie nobody reaped yet is gone for our purpose
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(CXX is None, reason="g++ not found")
@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_mid_compile_ends_the_compilers_and_leaves_nothing(tmp_path, jobs):
    """CI timeouts, docker stop and Kubernetes send SIGTERM: kcache stopped at once and left the compiler
    (and what it starts) running, writing lib.so into a temp directory nobody would publish or remove.
    Now SIGTERM unwinds as Ctrl-C does: the compilers' groups end, the temps go, exit 143 (128 + 15)."""
    cxx, notes = dawdling_compiler(tmp_path, CXX)
    tasks = [write_task(tmp_path / "tasks", f"slow{i}", kind="cc") for i in range(jobs)]
    root = tmp_path / "cache"
    proc = kcache_proc("--cache-dir", root, "build", *[t / "task.txt" for t in tasks], "--cxx", cxx, "-j", jobs)
    deadline = time.monotonic() + 60
    while len(list(notes.glob("compile-*"))) < jobs and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the --version probes start beside the compiles
    sleeps = [int(p.read_text() or 0) for p in notes.iterdir()]
    assert len(list(notes.glob("compile-*"))) == jobs and all(sleeps), "the compilers never started"
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=25)
    assert proc.returncode == 143 and "interrupted" in err, (proc.returncode, err)  # 128 + SIGTERM
    assert time.monotonic() - sent < 10, "kcache waited on a compiler (or its probe) it should have ended"
    time.sleep(0.2)
    assert not any(alive(pid) for pid in sleeps), "a compiler or probe kcache started outlived it"
    assert temp_dirs(root) == [] and not list(root.glob("ops/*/*/*")), sorted(root.rglob("*"))
