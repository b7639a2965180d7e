"""Nothing kcache reads for its own state can block it (issue 21, "Hangs again"): FIFOs planted where its
index and lock files belong, and another user holding the gc lock, which every lock wait outlasts only
until its --lock-timeout (exit 3, naming the holder)."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TIMEOUT = 60  # a command that has not finished by then hangs
NOBODY = 65534
HOLD_AS = """
import fcntl, os, sys
fd = int(sys.argv[1])
if os.geteuid() == 0:
    os.setgid({uid}); os.setgroups([]); os.setuid({uid})
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", os.getpid(), flush=True)
sys.stdin.read()
"""


def run(*args, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """The real CLI in its own process: a hang is a TimeoutExpired, not a stuck test run."""
    return subprocess.run([sys.executable, "-m", "kcache_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["texts", "scan"])
@pytest.mark.parametrize("args", [("ls", "--no-index"), ("ls",), ("stats",), ("inspect", "8d1f"),
                                  ("prune", "--older-than", "1s", "--dry-run"), ("verify",)])
def test_a_fifo_as_an_index_file_hangs_nothing(fixture_copy, kind, args):
    root = fixture_copy("hidet")
    planted = fifo(root / ".kcache" / "index" / f"{kind}.{os.geteuid()}")
    r = run("--cache-dir", root, *args)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(f"{planted} is not a regular file") <= 1
    if args[0] in ("ls", "stats"):
        assert r.stderr.count(f"{planted} is not a regular file") == 1, r.stderr


def test_a_fifo_index_is_replaced_by_a_real_one(fixture_copy, monkeypatch):
    """A cache big enough to keep an index writes it over the FIFO (rename replaces it): rebuilt."""
    from kcache_cli.catalog import index
    from kcache_cli.catalog.scan import scan_cache
    from kcache_cli.fs import state

    root = fixture_copy("hidet")
    planted = fifo(root / ".kcache" / "index" / state.index_name("scan"))
    monkeypatch.setattr(index, "MIN_ENTRIES", 1)
    monkeypatch.setattr(index, "RACY_SECONDS", -3600.0)
    warned: list[str] = []
    first = scan_cache(root, use_index=True, warn=warned.append)
    assert [w for w in warned if "not a regular file" in w] and planted.is_file()
    warned.clear()
    again = scan_cache(root, use_index=True, warn=warned.append)
    assert not warned and {e.relpath for e in again.entries} == {e.relpath for e in first.entries}


@pytest.mark.parametrize("kind", ["scan", "names"])
def test_a_fifo_index_file_is_said_once_not_every_night(fixture_copy, kind):
    """A FIFO (a member's, in a group-shared cache) at this user's index file of a cache too small to keep
    an index: every quiet prune of the cron line warned "kcache writes a new index over it", and none did,
    so the cron job mailed the same warning every night. The first says it and removes it; then silence."""
    root = fixture_copy("hidet")
    planted = fifo(root / ".kcache" / "index" / f"{kind}.{os.geteuid()}")
    first = run("-q", "--cache-dir", root, "prune", "--broken")
    assert first.returncode == 0 and first.stdout == "", first.stdout
    assert first.stderr.count(f"{planted} is not a regular file: removed") == 1, first.stderr
    assert not os.path.lexists(planted)
    for args in (("prune", "--yes"), ("prune", "--broken")):
        again = run("-q", "--cache-dir", root, *args)
        assert again.returncode == 0 and (again.stdout, again.stderr) == ("", ""), (args, again.stderr)


@pytest.mark.parametrize("args", [("clear", "--op", "relu", "--yes"), ("prune", "--older-than", "1s", "--yes"),
                                  ("clear", "--all", "--yes")])
def test_fifo_lock_files_hang_neither_clear_nor_prune(fixture_copy, args):
    root = fixture_copy("hidet")
    relu = root / "ops/cpu_space_0/relu/31857fe085635b31"
    (relu / ".lock").unlink(missing_ok=True)
    fifo(relu / ".lock")  # the entry's own writer lock (hidet's)
    old = fifo(root / ".kcache/locks/ops%2Fcpu_space_0%2Fgone%2F0123456789abcdef.lock")
    os.utime(old, (time.time() - 7200, time.time() - 7200), follow_symlinks=False)
    fifo(root / ".kcache/locks/ops%2Fcpu_space_0%2Frelu%2F31857fe085635b31.lock")  # kcache's lock of relu
    time.sleep(1.1)
    r = run("--cache-dir", root, *args)
    assert r.returncode == 0, r.stderr
    assert not relu.exists()
    assert stat.S_ISFIFO(os.lstat(old).st_mode)  # not kcache's lock file: never opened, never removed
    again = run("--cache-dir", root, "prune", "--yes", "--older-than", "1s")  # and the next prune runs too
    assert again.returncode == 0, again.stderr


def test_fifo_where_a_build_lock_belongs_is_a_clear_error(tmp_path):
    from kcache_cli.fs import state

    task = tmp_path / "t"
    task.mkdir()
    (task / "task.txt").write_text("name: plus\ntarget: cpu\n")
    (task / "source.cc").write_text('extern "C" int f() { return 1; }\n')
    root = tmp_path / "cache"
    import hashlib

    h = hashlib.sha256((task / "task.txt").read_bytes()).hexdigest()[:16]
    fifo(state.lock_path(root, f"ops/cpu_space_0/plus/{h}"))
    r = run("--cache-dir", root, "build", task, "--lock-timeout", "1")
    assert r.returncode in (1, 3) and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr, r.stderr


def _holder(lock: Path, as_uid: int | None):
    """A process holding an exclusive flock on `lock`, opened read-only (all a reader needs), as `as_uid`
    where the tests run as root."""
    fd = os.open(lock, os.O_RDONLY)
    code = HOLD_AS.format(uid=as_uid if as_uid is not None else os.geteuid())
    proc = subprocess.Popen([sys.executable, "-c", code, str(fd)], pass_fds=(fd,), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    os.close(fd)
    line = proc.stdout.readline().split()
    assert line[:1] == ["held"], line
    return proc, int(line[1])


@pytest.mark.parametrize("args", [("prune", "--max-size", "0", "--yes"), ("clear", "--all", "--yes"),
                                  ("prune", "--yes", "--broken", "--json")])
def test_a_reader_holding_the_gc_lock_delays_only_until_the_deadline(fixture_copy, args):
    root = fixture_copy("hidet")
    locks = root / ".kcache/locks"
    locks.mkdir(parents=True)
    gc = locks / ".gc.lock"
    gc.touch()
    os.chmod(gc, 0o644)
    as_uid = NOBODY if os.geteuid() == 0 else None
    if as_uid is None:
        print("not root: the holder runs as this user (the other-user case needs root)", file=sys.stderr)
    holder, pid = _holder(gc, as_uid)
    try:
        started = time.monotonic()
        r = run("--cache-dir", root, *args, "--lock-timeout", "1.5")
        took = time.monotonic() - started
    finally:
        holder.stdin.close()
        holder.wait(TIMEOUT)
    assert r.returncode == 3, r.stderr
    user = pwd.getpwuid(as_uid).pw_name if as_uid is not None else pwd.getpwuid(os.geteuid()).pw_name
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: the gc lock of") and f"pid {pid} (user {user})" in last, r.stderr
    assert took < TIMEOUT / 2
    assert (root / "ops/cuda_space_0/add/8d1f7691cdf75e90").is_dir()  # nothing removed
    after = run("--cache-dir", root, *args, "--lock-timeout", "1.5")  # the holder gone: it runs
    assert after.returncode == 0, after.stderr


def test_the_old_timeout_name_still_works_hidden(kcache):
    r = kcache("build", "--help")
    assert "--lock-timeout" in r.stdout and "--timeout " not in r.stdout.replace("--remote-timeout", "")
    for cmd in ("prune", "clear", "import"):
        assert "--lock-timeout" in kcache(cmd, "--help").stdout
    r = kcache("build", "x", "--timeout", "1", "--lock-timeout", "2")
    assert r.exit_code == 2 and "same option" in r.stderr


def test_holders_reads_proc_locks(tmp_path):
    from kcache_cli.fs.locking import holder_text, holders, open_lock

    lock = tmp_path / "x.lock"
    lock.touch()
    proc, pid = _holder(lock, None)
    try:
        fd = open_lock(lock)
        try:
            assert [p for p, _ in holders(fd)] == [pid]
            assert holder_text(fd) == f" by pid {pid} (user {pwd.getpwuid(os.geteuid()).pw_name})"
        finally:
            os.close(fd)
    finally:
        proc.stdin.close()
        proc.wait(TIMEOUT)


def test_open_lock_refuses_what_is_not_a_regular_file(tmp_path):
    from kcache_cli.fs.locking import NotALockFile, open_lock, probe_locked

    f = fifo(tmp_path / "f.lock")
    with pytest.raises(NotALockFile):
        open_lock(f)
    assert probe_locked(f) is False
    os.symlink(tmp_path / "elsewhere", tmp_path / "l.lock")
    with pytest.raises(OSError):
        open_lock(tmp_path / "l.lock", create=True)
    assert not (tmp_path / "elsewhere").exists()
    fd = open_lock(tmp_path / "new.lock", create=True)
    os.close(fd)
    # only those who may write the cache may open a lock (issue 32): 0600 outside a group-shared cache
    assert (tmp_path / "new.lock").stat().st_mode & 0o777 == 0o600


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_fifo_as_the_gc_lock_is_a_clear_error(fixture_copy):
    root = fixture_copy("hidet")
    fifo(root / ".kcache/locks/.gc.lock")
    r = run("--cache-dir", root, "prune", "--yes", "--max-size", "0")
    assert r.returncode == 1 and "is not a regular file" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert (root / "ops/cpu_space_0/relu/31857fe085635b31").is_dir()


def test_a_group_cache_gets_group_writable_locks(fixture_copy):
    """In a group-shared cache (2775) the lock directory, the trash and the lock files kcache makes are
    group-writable whatever the umask (root's cron with 022 included, issue 32), so every member can
    take them; lock files are closed to others (a reader must not hold the gc lock)."""
    for umask, want_dir, want_file in ((0o002, 0o2775, 0o660), (0o022, 0o2775, 0o660)):
        root = fixture_copy("hidet", dest=f"group-{umask:o}")
        os.chmod(root, 0o2775)
        r = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "clear", "--op", "relu",
                            "--yes"], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                           preexec_fn=lambda m=umask: os.umask(m))
        assert r.returncode == 0, r.stderr
        for d in ("locks", "trash"):
            assert os.stat(root / ".kcache" / d).st_mode & 0o7777 == want_dir, (umask, d)
        assert os.stat(root / ".kcache/locks/.gc.lock").st_mode & 0o7777 == want_file


def test_a_lock_that_cannot_be_created_is_an_error_not_a_loop(tmp_path, monkeypatch):
    """Where the lock directory is not writable (another user's cache: EACCES injected, as root writes
    anywhere), taking a build lock fails at once instead of retrying for ever."""
    from kcache_cli.fs import locking

    real_open = os.open

    def denied(path, flags, *args, **kw):
        if str(path).endswith(".lock") and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kw)

    (tmp_path / "cache" / ".kcache" / "locks").mkdir(parents=True)
    monkeypatch.setattr(locking.os, "open", denied)
    with pytest.raises(PermissionError):
        locking.open_lock(tmp_path / "cache" / ".kcache" / "locks" / "x.lock", create=True)
    started = time.monotonic()
    with pytest.raises(PermissionError):
        locking.EntryFlock(tmp_path / "cache", "ops/cpu_space_0/x/0123456789abcdef").acquire(timeout=5)
    assert time.monotonic() - started < 4


HOLD_ENTRY = """
import sys
from pathlib import Path
from kcache_cli.fs.locking import entry_lock
lock = entry_lock(Path(sys.argv[1]), sys.argv[2])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
"""


@contextmanager
def entry_lock_held(root: Path, relpath: str) -> Iterator[None]:
    """Another process (a build, say) holds the lock of the entry `relpath` of `root` meanwhile."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_ENTRY, str(root), relpath], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(TIMEOUT)


def test_an_import_that_skips_a_locked_entry_is_exit_3(fixture_copy, tmp_path):
    """A build holding an entry's lock past --lock-timeout: import brings the rest in, then exits 3, as
    build does (it said "skip ... its lock was held" and exited 0, so a CI step went on without it)."""
    arc, dest, add = tmp_path / "k.tar.gz", tmp_path / "dest", "ops/cuda_space_0/add/8d1f7691cdf75e90"
    assert run("--cache-dir", fixture_copy("hidet"), "export", arc).returncode == 0
    with entry_lock_held(dest, add):
        r = run("-q", "--cache-dir", dest, "import", arc, "--lock-timeout", "0.5")
        j = run("--json", "--cache-dir", dest, "import", arc, "--lock-timeout", "0.5")
    assert r.returncode == 3 and r.stdout == "", r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: 1 entry not imported: its lock was held"), r.stderr
    assert not (dest / add).exists() and len(list(dest.glob("ops/*/*/*"))) == 4  # the rest came in
    assert "waiting" not in r.stderr and "waiting for the lock of " + add in j.stderr  # a note: -q drops it
    doc = json.loads(j.stdout)
    assert j.returncode == 3 and doc["lock_timeouts"] == 1 and doc["skipped"] == 5, j.stdout
    again = run("--json", "--cache-dir", dest, "import", arc)  # the build gone: it comes in
    assert again.returncode == 0 and json.loads(again.stdout)["imported"] == 1 and (dest / add).is_dir()


def test_a_mega_cache_import_that_skips_a_locked_entry_is_exit_3(tmp_path):
    """A torch Mega-Cache blob's entry whose lock a build holds: the rest is imported, then exit 3, as a
    tar import's and a pull's (it was reported a skip of an entry "present", exit 0)."""
    blob, dest = Path(__file__).parent / "fixtures" / "real" / "torch-mega" / "sin_cos_cpu.bin", tmp_path / "dest"
    plan = json.loads(run("--json", "--cache-dir", dest, "import", blob, "--dry-run").stdout)
    held = plan["artifacts"][0]["relpath"].rpartition("/")[0]
    with entry_lock_held(dest, held):
        r = run("--json", "--cache-dir", dest, "import", blob, "--lock-timeout", "0.5")
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: 1 entry not imported: its lock was held"), r.stderr
    doc = json.loads(r.stdout)
    assert doc["lock_timeouts"] == 1 and doc["imported"] == len(plan["artifacts"]) - 1
    assert not (dest / held).exists()
    again = json.loads(run("--json", "--cache-dir", dest, "import", blob).stdout)
    assert again["lock_timeouts"] == 0 and (dest / held).is_dir()
