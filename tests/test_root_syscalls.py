"""A root vetted once is held, and what lies below it is reached from the held fd (DESIGN §1.1): the real
`kcache`, run under `strace -f -e trace=%file`, names a path under a cache root from `/` only a few times
(vetting the root, and checking that its path still names the directory held) however many entries the
cache holds. A call with a path relative to a directory fd does not count: the root's path is not
resolved again, so a swap of it for a link redirects nothing.

Spawned on purpose: only a process of its own shows every system call kcache makes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, copy_tree

sys.path.insert(0, str(REPO / "bench"))
from gen_cache import generate  # noqa: E402

STRACE = shutil.which("strace")
ONE_ROOT = 8  # calls naming a path under the root, per root (issue 31)
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
FIRST_ONLY = re.compile(r"^(?:\d+\s+)?(?:execve|execveat|readlink|readlinkat)\(")  # then come no paths


def _strace_works() -> str | None:
    """Why strace cannot trace here (missing, or ptrace refused), or None."""
    if STRACE is None:
        return "strace not found"
    run = subprocess.run([STRACE, "-f", "-e", "trace=%file", "-o", os.devnull, "true"], capture_output=True,
                         text=True, timeout=60)
    return None if run.returncode == 0 else f"strace not usable here: {run.stderr.strip()[:200]}"


@pytest.fixture(scope="module")
def strace() -> str:
    why = _strace_works()
    if why is not None:
        pytest.skip(f"{why}: nothing proved that kcache reads below a held root through its fd")
    assert STRACE is not None
    return STRACE


def under(line: str, roots: list[Path]) -> bool:
    """Whether one strace line names (in a path argument) an absolute path under one of `roots`. An
    execve's argument list is no path it resolves (its program is), nor what a readlink read."""
    args = QUOTED.findall(line)
    if FIRST_ONLY.match(line):
        args = args[:1]
    for arg in args:
        if any(arg == str(r) or arg.startswith(f"{r}/") for r in roots):
            return True
    return False


def traced(strace: str, tmp_path: Path, roots: list[Path], *args: str) -> tuple[dict, list[str]]:
    """Run the real kcache under strace: (its --json output, the calls that named a path under `roots`)."""
    log = tmp_path / f"strace-{len(list(tmp_path.glob('strace-*')))}.log"
    run = subprocess.run([strace, "-f", "-e", "trace=%file", "-o", str(log), sys.executable, "-m", "kcache_cli",
                          *args, "--json"], capture_output=True, text=True, timeout=120,
                         cwd=os.environ["TMPDIR"], env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    calls = [line for line in log.read_text().splitlines() if under(line, roots)]
    return json.loads(run.stdout), calls


@pytest.fixture
def hidet() -> Path:
    """A 30-entry hidet cache of root's own in the default scope (~/.cache/hidet), over 1 MB."""
    root = Path(os.environ["HOME"]) / ".cache" / "hidet"
    generate(str(root), 30, lib_size=8192)
    return root


@pytest.fixture
def three(hidet) -> list[Path]:
    """The default scope holds three caches: hidet, tilus and Triton."""
    home = Path(os.environ["HOME"])
    tilus = copy_tree(FIXTURES / "tilus", home / ".cache" / "tilus")
    triton = copy_tree(FIXTURES / "triton" / "cache", home / ".triton" / "cache")
    return [hidet, tilus, triton]


def _show(calls: list[str]) -> str:
    return "\n".join(calls)


def test_prune_dry_run_on_one_root(strace, hidet, tmp_path):
    doc, calls = traced(strace, tmp_path, [hidet], "--cache-dir", str(hidet), "prune", "--max-size", "1M",
                        "--dry-run")
    assert doc["dry_run"] and doc["removed"] and doc["size_before"] > doc["max_size"] >= doc["size_after"], doc
    assert len(calls) <= ONE_ROOT, _show(calls)


def test_ls_op_on_one_root(strace, hidet, tmp_path):
    doc, calls = traced(strace, tmp_path, [hidet], "--cache-dir", str(hidet), "ls", "--op", "matmul")
    assert len(doc["entries"]) == 2 and {e["op"] for e in doc["entries"]} == {"matmul"}, doc["entries"]
    assert len(calls) <= ONE_ROOT, _show(calls)


@pytest.mark.parametrize("command, key, want", [
    (("stats",), "entry_count", 30), (("verify",), "ok", 30), (("clear", "--op", "matmul", "--dry-run"), "removed", 2),
    (("export", "ARCHIVE"), "exported", 30), (("prune", "--max-size", "1M", "--yes"), "removed", None)])
def test_other_commands_on_one_root(strace, hidet, tmp_path, command, key, want):
    """The same for the other commands that read every entry (a deep verify, an export), and for a prune
    that removes."""
    args = [str(tmp_path / "out.tar") if a == "ARCHIVE" else a for a in command]
    doc, calls = traced(strace, tmp_path, [hidet], "--cache-dir", str(hidet), *args)
    got = doc[key] if isinstance(doc[key], int) else len(doc[key])
    assert got == want if want is not None else got > 0, doc
    assert len(calls) <= ONE_ROOT, _show(calls)


@pytest.mark.parametrize("command", [("prune", "--max-size", "1M", "--dry-run"), ("ls",)])
def test_a_default_scope_of_three_caches(strace, three, tmp_path, command):
    doc, calls = traced(strace, tmp_path, three, *command)
    docs = doc["caches"] if "caches" in doc else [doc]
    if command[0] == "ls":
        assert {e["layout"] for e in doc["entries"]} == {"hidet", "tilus", "triton"}, doc
    else:
        assert {d["root"] for d in docs} == {str(r) for r in three}, docs
        assert any(d["removed"] for d in docs), docs
    assert len(calls) <= 3 * ONE_ROOT, _show(calls)
    for root in three:  # and no one root takes the others' share
        assert len([c for c in calls if under(c, [root])]) <= ONE_ROOT, _show(calls)


def test_the_count_sees_paths_from_slash_only():
    """What the tests above count: a path under the root from `/` (and the root itself), not a name
    relative to a held fd, nor a sibling whose name starts like the root's."""
    roots = [Path("/c/hidet")]
    assert under('openat(AT_FDCWD, "/c/hidet/ops", O_RDONLY|O_DIRECTORY) = 4', roots)
    assert under('newfstatat(AT_FDCWD, "/c/hidet", {st_mode=S_IFDIR|0755, ...}, 0) = 0', roots)
    assert not under('newfstatat(3, "ops/cuda_space_0", {st_mode=S_IFDIR|0755, ...}, AT_SYMLINK_NOFOLLOW) = 0',
                     roots)
    assert not under('openat(AT_FDCWD, "/c/hidet-old/ops", O_RDONLY) = 4', roots)
    assert not under('12 execve("/usr/bin/python3", ["python3", "-m", "kcache_cli", "--cache-dir", "/c/hidet"], '
                     '0x7ffd /* 30 vars */) = 0', roots)
    assert not under('12 readlink("/proc/self/fd/3", "/c/hidet", 4096) = 8', roots)
    assert under('12 renameat2(AT_FDCWD, "/tmp/x", AT_FDCWD, "/c/hidet/ops/a", RENAME_NOREPLACE) = 0', roots)
