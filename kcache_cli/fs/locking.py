"""Cross-process locks: all of kcache's locking is here. kcache's own per-entry locks live in
`.kcache/locks/`; the compilers' own lock files inside entries (hidet's and tilus's `.lock`) are
probed without creating anything.

Why raw flock next to filelock: filelock locks a path, and opens (and creates) it itself. Deleting and
importing must lock files reached from an open directory descriptor (`openat` with O_NOFOLLOW, so a
symlink swapped into the path is never followed) and must not create lock files in entries they
probe; filelock cannot do either, so those take `try_flock` on a descriptor they opened. filelock's
locks are flocks too, so both kinds exclude each other on the same file."""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import stat
import time
from pathlib import Path
from typing import Callable, NamedTuple

from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs import write as fswrite
from kcache_cli.util.errors import LockTimeout
from kcache_cli.util.units import is_digits

# Every lock file is opened this way: a FIFO, device or socket planted where a lock belongs never blocks
# the open (O_NONBLOCK), never becomes the controlling terminal (O_NOCTTY), a link is never followed
# (O_NOFOLLOW), and what is not a regular file is refused after fstat (NotALockFile).
LOCK_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# Lock files can be opened only by those who may write the cache: 0600, or 0660 in a group-shared
# cache (its members), whatever the umask. A reader who could open one could hold its flock and block
# every prune and clear; so no lock is opened read-only unless this user may write its directory.
LOCK_MODE = 0o600


class NotALockFile(OSError):
    """A lock file that is not a regular file (a FIFO, device, socket or directory planted there)."""


def open_lock(name: str | os.PathLike, dir_fd: int | None = None, create: bool = False) -> int:
    """A descriptor for the lock file `name` (relative to `dir_fd`), for flock: opened without blocking,
    never through a link, read-write (read-only only for a writer of its directory, when another member
    made it); NotALockFile when it is not a regular file, FileNotFoundError when it is missing and not
    `create`d. A lock this user owns gets the mode above (group-shared: the directory's group)."""
    flags = LOCK_FLAGS | (os.O_CREAT if create else 0)
    try:
        fd = os.open(name, os.O_RDWR | flags, LOCK_MODE, dir_fd=dir_fd)
    except PermissionError as denied:
        if not _may_write(name, dir_fd):
            raise
        try:
            fd = os.open(name, os.O_RDONLY | (flags & ~os.O_CREAT), dir_fd=dir_fd)
        except FileNotFoundError:  # could not be created here: the permission is the problem
            raise denied from None
    fsread.fstat_regular(fd, lambda st: NotALockFile(errno.EINVAL, "not a regular file: ignored as a lock",
                                                     os.fsdecode(name)))
    try:
        _lock_mode(fd, dir_fd)
    except OSError:
        os.close(fd)
        raise
    return fd


def _may_write(name: str | os.PathLike, dir_fd: int | None) -> bool:
    """Whether this user may write the directory the lock `name` sits in."""
    where = "." if dir_fd is not None else (os.path.dirname(os.fspath(name)) or ".")
    return os.access(where, os.W_OK, dir_fd=dir_fd, effective_ids=os.access in os.supports_effective_ids)


def _lock_mode(fd: int, dir_fd: int | None) -> None:
    """0660 with the directory's group in a group-shared cache, else 0600 (an older kcache made them
    0644: mended by their owner's next use). A lock with another name too (a hard link someone who may
    write the locks directory planted to a file elsewhere) is locked as it is, never changed."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_nlink != 1:
        return
    if dir_fd is not None and fswrite.share_like_dir(fd, dir_fd):
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o007:
            os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~0o007)
        return
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o077)


def entry_lock(root: Path, relpath: str, timeout: float = -1):
    """A FileLock for one entry (blocking by default); its file sits outside the entry."""
    from filelock import FileLock  # 40 ms of imports: only a build or an import takes entry locks

    path = state.lock_path(root, relpath)
    _make_locks_dir(root)
    return FileLock(str(path), timeout=timeout)


def _make_locks_dir(root: Path) -> None:
    """.kcache/locks/, made beneath the root without following a link (fswrite), owners checked."""
    os.close(_locks_dir(root))


def _locks_dir(root: Path) -> int:
    try:
        rfd = fswrite.open_root(root)
    except FileNotFoundError:  # a lock taken before the cache exists makes it, as makedirs did
        try:
            fswrite.make_dirs(root)
        except FileExistsError:
            pass
        rfd = fswrite.open_root(root)
    try:
        return state.open_state(rfd, root, "locks", create=True)
    finally:
        os.close(rfd)


def _open_lock(root: Path, name: str, create: bool = True) -> int:
    """The lock file `name` in .kcache/locks/ (open_lock's rules), through the locks directory's
    descriptor: a locks/ swapped for a link is refused, never written through."""
    lfd = _locks_dir(root)
    try:
        return open_lock(name, lfd, create=create)
    finally:
        os.close(lfd)


def try_flock(fd: int) -> bool:
    """Take an exclusive flock on `fd` without waiting: True when taken, False when another process
    holds it (the one try-lock of kcache)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def wait_flock(fd: int, timeout: float | None = None, what: str = "the lock", poll: float = 0.05) -> None:
    """Take an exclusive flock on `fd`, waiting at most `timeout` seconds (None: as long as it takes);
    LockTimeout (exit 3) naming who holds it when the time runs out."""
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout
    while not try_flock(fd):
        left = deadline - time.monotonic()
        if left <= 0:
            raise LockTimeout(f"{what} is still held{holder_text(fd)} after {timeout:g}s "
                              "(--lock-timeout to wait longer)")
        time.sleep(min(poll, left))


def holders(fd: int) -> list[tuple[int, str]]:
    """(pid, user) of each process /proc/locks says holds a flock on `fd`'s file (matched on its device
    and inode); [] where /proc/locks cannot tell (another OS, a pid of another namespace shows as 0)."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"; waiters have "->" after the number
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[5] != want or not is_digits(parts[4]):
            continue
        pid = int(parts[4])
        if pid and pid != os.getpid():
            out.append((pid, _user_of(pid)))
    return out


def _user_of(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def holder_text(fd: int) -> str:
    """' by pid 4242 (user alice)' for the holders of `fd`'s lock, or '' when unknown."""
    found = holders(fd)
    if not found:
        return ""
    return " by " + ", ".join(f"pid {pid} (user {user})" for pid, user in found[:3])


class EntryFlock:
    """The lock `entry_lock` gives, taken with flock directly: the same file and the same kind of
    lock (a filelock holder and this exclude each other), without filelock's per-lock bookkeeping
    (about 0.2 ms), which matters to an import that publishes thousands of entries."""

    def __init__(self, root: Path, relpath: str) -> None:
        self.root = root
        self.path = str(state.lock_path(root, relpath))
        self.name = os.path.basename(self.path)
        self._fd: int | None = None

    def acquire(self, timeout: float = -1, poll: float = 0.05) -> bool:
        """Take the lock, waiting up to `timeout` seconds (forever if negative); False on timeout."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while True:
            fd = _open_lock(self.root, self.name)
            try:
                taken = try_flock(fd)
            except OSError:
                os.close(fd)
                raise
            if taken:
                if os.fstat(fd).st_nlink:  # not unlinked by someone cleaning up between open and flock
                    self._fd = fd
                    return True
                os.close(fd)
                continue
            os.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)

    def holder(self) -> str:
        """' by pid N (user U)' for whoever holds this lock now, or ''."""
        try:
            fd = _open_lock(self.root, self.name, create=False)
        except OSError:
            return ""
        try:
            return holder_text(fd)
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "EntryFlock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def probe_locked(path: str | os.PathLike, dir_fd: int | None = None) -> bool:
    """True when another process holds a flock on `path` (relative to `dir_fd`, if given: filelock's and
    hidet's kind of lock).

    Opens read-only and never creates the file; a missing file is not locked. (Taking and dropping the
    lock is the probe: closing the descriptor releases it.)"""
    try:
        fd = os.open(path, os.O_RDONLY | LOCK_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:  # a FIFO or device where a lock belongs: no lock, and never read
        os.close(fd)
        return False
    try:
        return not try_flock(fd)
    except OSError:
        return False
    finally:
        os.close(fd)


def entry_build_locked(root: Path, relpath: str) -> bool:
    return probe_locked(state.lock_path(root, relpath))


# ---- leftovers of killed imports and exports (their names and ages: kcache_cli/fs/state.py) ----------
def _flock_free(fd: int) -> bool:
    """True when nobody holds a flock on `fd`'s file (the lock is dropped at once)."""
    if not try_flock(fd):
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def leftover_live(dir_fd: int, name: str, now: float | None = None) -> bool | None:
    """Is this import staging dir or export temp file still held by its writer? None when it is not
    a leftover at all (wrong type, a link). Writers hold a flock on it while they run."""
    staging = state.IMPORT_STAGING.match(name)
    if staging is None and not state.EXPORT_TEMP.match(name):
        return None
    flags = (os.O_RDONLY | os.O_DIRECTORY if staging else os.O_RDONLY | os.O_NONBLOCK) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if staging is None and not stat.S_ISREG(st.st_mode):
            return None
        if not _flock_free(fd):
            return True
        return state.leftover_live_held(name, st, now) is not None
    except OSError:
        return None
    finally:
        os.close(fd)


# ---- lock files that are not flocks (torch's FileBaton: an exclusive-create file held open) -------------
class Openers(NamedTuple):
    pids: list[int]  # processes that have the file open
    blind: int  # processes of the file's owner whose open files could not be read: one may hold it


def file_openers(st: os.stat_result) -> Openers:
    """Which processes have the file `st` (device and inode) open, read from /proc/<pid>/fd. A file
    created by open(O_CREAT|O_EXCL) is created by its owner's process, so processes of other users are
    not asked; a process of the owner whose fds cannot be read counts in `blind` (kcache is not root
    and the process changed its credentials, or it vanished mid-read: it may hold the file)."""
    return _owner_processes(st, lambda pid: _holds(pid, os.listdir(f"/proc/{pid}/fd"), st))


def cwd_users(st: os.stat_result) -> Openers:
    """Which processes of the directory `st`'s owner work in it (/proc/<pid>/cwd is it): a build tool and
    its compilers go on there when the process that started them was killed alone. One whose cwd cannot be
    read is passed over, not counted in `blind` (a container's init denies even root its cwd): this is a
    second look, after file_openers, which counts those it cannot read."""
    return _owner_processes(st, lambda pid: _works_in(pid, st))


def _works_in(pid: str, st: os.stat_result) -> bool:
    try:
        return os.path.samestat(os.stat(f"/proc/{pid}/cwd"), st)
    except OSError:
        return False


def _owner_processes(st: os.stat_result, test: Callable[[str], bool]) -> Openers:
    """The processes of `st`'s owner (but kcache's own) that pass `test(pid)`; those `test` or /proc could
    not read counted in `blind`."""
    me, pids, blind = os.getpid(), [], 0
    try:
        procs = [n for n in os.listdir("/proc") if is_digits(n)]
    except OSError:
        return Openers([], 1)
    for name in procs:
        pid = int(name)
        try:
            if pid == me or os.stat(f"/proc/{name}").st_uid != st.st_uid:
                continue
            found = test(name)
        except FileNotFoundError:
            continue  # exited
        except OSError:
            blind += 1
            continue
        if found:
            pids.append(pid)
    return Openers(pids, blind)


def _holds(pid: str, fds: list[str], st: os.stat_result) -> bool:
    for fd in fds:
        try:
            got = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if got.st_ino == st.st_ino and got.st_dev == st.st_dev:
            return True
    return False
