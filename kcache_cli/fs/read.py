"""Reading what a cache holds, when a file in it may be hostile: the one set of read helpers.

Every file is opened with O_NOFOLLOW|O_NONBLOCK and fstat'ed before a byte is read: a symlink, a
FIFO, a device or a socket is refused with a reason (a FIFO would block forever, /dev/zero never
ends), never read. Every read has a bound. JSON is parsed only under a size and a nesting limit,
and directory walks are iterative with a depth limit, so no file can make kcache hang, take
unbounded memory, or hit Python's recursion limit.

Light on purpose (os, stat, errno): start-up imports it (the layouts' shapes detect through it), and so
do `kcache build`'s hit path and `ls`."""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

try:  # a dependency, and loaded with the commands anyway (util/jsonout.py); json alone where it is not
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None  # type: ignore[assignment]

from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:
    import hashlib
else:  # its first use loads it: _hashlib's OpenSSL costs 2.3 ms of every start, a digest is rare
    hashlib = lazy_module("hashlib")

FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
MAX_TEXT = 1 << 20  # a text file kcache shows or parses (logs are streamed instead)
MAX_JSON = 16 << 20  # a JSON record inside an entry (kcache.json, meta.json, manifest.json...)
MAX_JSON_DEPTH = 64  # nesting; real records are 3 or 4 deep
MAX_TREE_DEPTH = 256  # directories inside one entry; real entries are at most 5 deep


class NotRegularFile(OSError):
    """The path is a symlink, FIFO, device, socket or directory: kcache never reads it."""

    kind = "not a regular file"  # "a FIFO", "a symlink"...


class TooLarge(OSError):
    """A file over the bound its reader sets."""


class JsonTooDeep(ValueError):
    """JSON nested deeper than MAX_JSON_DEPTH (a ValueError, like any other bad JSON)."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, for a reason shown to people."""
    for test, what in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return what
    return "not a regular file"


def refuse(path: str, what: str) -> NotRegularFile:
    exc = NotRegularFile(errno.EINVAL, f"{what}, not a regular file (kcache never reads it)", path)
    exc.kind = what
    return exc


# ---- openat2: resolution that follows no link (one syscall), shared with fsdelete --------------------

RESOLVE_NO_XDEV, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x04, 0x08
_ONE_NAME_RESOLVE = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH  # what O_NOFOLLOW gives one plain name (openat2)
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "ppc64le": 437, "s390x": 437, "riscv64": 437}
_openat2: Any = None  # the ctypes call once known to work; False when the kernel (or a seccomp filter) has none
# Below these two rules, the first few paths of a process are walked by the caller (an openat with O_NOFOLLOW
# per component, never ".."), which refuses what openat2 refuses: loading ctypes for the call costs 2 ms, more
# than a lookup's few walks (`inspect 7ebb` walks six paths), less than a scan's thousands.
WALKS_BEFORE_OPENAT2 = 32
_walks = 0


def _load_openat2() -> Any:
    global _openat2
    if _openat2 is not None:
        return _openat2
    _openat2 = False
    nr = _SYS_OPENAT2.get(os.uname().machine)
    if nr is None:
        return _openat2
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long

        class OpenHow(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

        hows: dict[tuple[int, int], Any] = {}  # never written once made: threads may share them
        syscall, byref, size = libc.syscall, ctypes.byref, ctypes.sizeof(OpenHow)

        def call(dir_fd: int, name: str, flags: int, resolve: int) -> int:
            how = hows.get((flags, resolve))
            if how is None:
                how = hows[flags, resolve] = OpenHow(flags, 0, resolve)
            fd = syscall(nr, dir_fd, os.fsencode(name), byref(how), size)
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), name)
            return fd

        top = os.open("/", DIR_FLAGS)
        try:
            os.close(call(top, ".", DIR_FLAGS, RESOLVE_NO_SYMLINKS))  # ENOSYS or a seccomp EPERM: no openat2
        finally:
            os.close(top)
        _openat2 = call
    except (OSError, AttributeError, ImportError):
        _openat2 = False
    return _openat2


def openat2(dir_fd: int, name: str, flags: int, resolve: int) -> int | None:
    """`name` opened inside `dir_fd` under the RESOLVE_* rules, or None where openat2 does not exist or
    is not loaded yet (WALKS_BEFORE_OPENAT2; the caller then walks the components itself). One plain
    name under no rule but these two is one openat with O_NOFOLLOW, which refuses what they refuse (a
    link: ELOOP, or ENOTDIR with O_DIRECTORY) without the ctypes call (1.4 µs less): a scan opens every
    entry directory from its parent so. A name holding a NUL is refused (EINVAL) whichever way: as a C
    string it would name another file."""
    if "\0" in name:  # a C string ends there: the call would open the name before it, another file
        raise OSError(errno.EINVAL, "a NUL byte in a file name", name)
    if not resolve & ~_ONE_NAME_RESOLVE:
        if "/" not in name and name not in ("", ".", ".."):
            return os.open(name, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
        global _walks
        if _openat2 is None and _walks < WALKS_BEFORE_OPENAT2:  # a few walks cost less than ctypes' import
            _walks += 1
            return None
    call = _load_openat2()
    if not call:
        return None
    try:
        return call(dir_fd, name, flags, resolve)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            return None
        raise


# ---- anchors: reads inside a cache resolve from its root, never through a link below it ---------------


class Anchor:
    """A cache root held open: reads below it resolve from this fd and follow no link between the root
    and the file, so a directory of the cache swapped for a link mid-run (`ops/cuda_space_0` ->
    elsewhere) makes the read fail instead of judging an entry by someone else's files. The root is the
    one the user named: a link to it is followed once, here. `refused` counts the reads refused because
    a directory on the way was a link (or not a directory): a judgement during which it moved saw the
    cache being swapped under it, and concludes nothing (entrydir.EntryDir.swapped)."""

    __slots__ = ("key", "fd", "refused")

    def __init__(self, root: str | os.PathLike) -> None:
        self.key = os.path.join(os.path.abspath(root), "")
        self.fd = open_root(self.key)
        self.refused = 0

    def __enter__(self) -> Anchor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def holds(self, path: str) -> bool:
        """Whether the absolute `path` lies below the root."""
        return path.startswith(self.key)

    def rel(self, path: str) -> str:
        """The absolute `path` below the root, relative to it (for calls with `dir_fd=self.fd`)."""
        return path[len(self.key):].rstrip("/") or "."

    def current(self) -> bool:
        """Whether the root's path still names the directory held (a held root's anchor always does:
        reads go on through the directory vetted, whatever its path names now)."""
        held = _HELD.get(self.key)
        if held is not None:
            return _same_dir(held, self.fd)
        try:
            return os.path.samestat(os.stat(self.key), os.fstat(self.fd))
        except OSError:
            return False

    def dir_of(self, path: str) -> tuple[int, str]:
        """(a new fd of the directory holding the absolute `path` below the root, the file name)."""
        head, name = os.path.split(path[len(self.key):])
        if not head:
            return os.dup(self.fd), name
        return self.open_dir(self.key + head), name

    def open_dir(self, path: str) -> int:
        """A new fd of the directory at the absolute `path` below the root, no link on the way followed."""
        rel = path[len(self.key):].rstrip("/")
        if not rel:
            return os.dup(self.fd)
        try:
            fd = openat2(self.fd, rel, DIR_FLAGS, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
            return fd if fd is not None else dir_beneath_fd(self.fd, self.key, rel)
        except NotRegularFile:
            self.refused += 1
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                self.refused += 1
                raise refuse(path, f"{rel}/ holds a symlink or a non-directory") from None
            raise


# ---- held roots: a root vetted once (kcache_cli/catalog/locate.py) is the directory every later step uses -------
# "<root>/" -> the fd opened when the root was vetted (without following a link in its last component, or
# following the one an explicit --cache-dir names, once). Anchors, fswrite.open_root and the deleter start
# from it, never from the root's path again: a path swapped for a link after vetting redirects nothing.
_HELD: dict[str, int] = {}
_HANDED: dict[str, dict[str, tuple[int, Any]]] = {}  # "<root>/" -> what one step learnt of it, for the next


def hand_on(root: str | os.PathLike, what: str, value: Any) -> None:
    """Leave `value` (what a step found out about the held `root`: its layouts) for the next step that
    asks for `what` (take): so that one command finds it out once. Nothing for a root not held."""
    key = os.path.join(os.path.abspath(root), "")
    fd = _HELD.get(key)
    if fd is not None:
        _HANDED.setdefault(key, {})[what] = (os.fstat(fd).st_mtime_ns, value)


def take(root: str | os.PathLike, what: str) -> Any:
    """What hand_on left about `root` as `what`, once, while the root's own directory is unchanged since
    (no name made or removed in it); else None."""
    key = os.path.join(os.path.abspath(root), "")
    left = _HANDED.get(key, {}).pop(what, None)
    fd = _HELD.get(key)
    if left is None or fd is None or os.fstat(fd).st_mtime_ns != left[0]:
        return None
    return left[1]


def hold_root(root: str | os.PathLike, fd: int) -> None:
    """Hold `fd` (kcache's to close, by release_roots) as the directory `root` names from now on."""
    key = os.path.join(os.path.abspath(root), "")
    old = _HELD.pop(key, None)
    if old is not None:
        os.close(old)
    stale = _ANCHORS.pop(key, None)
    if stale is not None:
        stale.close()
    _HANDED.pop(key, None)
    _HELD[key] = fd


def held_root(root: str | os.PathLike) -> int | None:
    """The fd `root` was vetted and held with (not to be closed), or None."""
    return _HELD.get(os.path.join(os.path.abspath(root), ""))


def open_root(root: str | os.PathLike) -> int:
    """A new fd of the cache root: a copy of the held one when it was vetted, else opened by the path the
    user named (a link to it followed, here and only here)."""
    held = held_root(root)
    if held is not None:
        return os.dup(held)
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def root_moved(root: str | os.PathLike) -> bool:
    """Whether `root` is held and its path names another directory now (swapped since it was vetted)."""
    held = held_root(root)
    if held is None:
        return False
    try:
        return not os.path.samestat(os.stat(root), os.fstat(held))
    except OSError:
        return True


def release_roots() -> None:
    """Close every held root and its anchor (the end of a command: main runs many in one test process)."""
    _HANDED.clear()
    for key in list(_HELD):
        anchored = _ANCHORS.pop(key, None)
        if anchored is not None:
            anchored.close()
        os.close(_HELD.pop(key))


# ---- paths below a held root: resolved from its fd, never from `/` again -----------------------------
# A scan, a layout's detection and a plan name what they read by absolute path (they show it); below a
# held root the calls go through the held fd with the path's rest (links below the root are followed as
# the path's own resolution would: the one difference is that the root is the directory vetted).


def held_place(path: str | os.PathLike) -> tuple[int, str] | None:
    """(the held root's fd, `path` relative to it, "." for the root) when the absolute `path` lies below
    a held root (the innermost); else None."""
    if not _HELD:
        return None
    path = os.fspath(path)
    if path[:1] != "/":
        return None
    best = None
    for key, fd in _HELD.items():
        if (path.startswith(key) or path == key[:-1]) and (best is None or len(key) > len(best[0])):
            best = (key, fd)
    if best is None:
        return None
    return best[1], path[len(best[0]):].rstrip("/") or "."


def stat_path(path: str | os.PathLike, follow: bool = True) -> os.stat_result:
    """os.stat (os.lstat with follow=False) of `path`, from its held root when it has one."""
    place = held_place(path)
    if place is None:
        return os.stat(path, follow_symlinks=follow)
    return os.stat(place[1], dir_fd=place[0], follow_symlinks=follow)


def is_dir(path: str | os.PathLike) -> bool:
    """os.path.isdir of `path` (a link to a directory is one), from its held root when it has one."""
    try:
        return stat.S_ISDIR(stat_path(path).st_mode)
    except (OSError, ValueError):
        return False


def is_real_dir(path: str | os.PathLike) -> bool:
    """A directory, not a link to one (os.lstat), from its held root when it has one."""
    try:
        return stat.S_ISDIR(stat_path(path, follow=False).st_mode)
    except (OSError, ValueError):
        return False


def is_link(path: str | os.PathLike) -> bool:
    """os.path.islink of `path`, from its held root when it has one."""
    try:
        return stat.S_ISLNK(stat_path(path, follow=False).st_mode)
    except (OSError, ValueError):
        return False


def exists(path: str | os.PathLike, follow: bool = False) -> bool:
    """os.path.lexists (os.path.exists when `follow`) of `path`, from its held root when it has one."""
    try:
        stat_path(path, follow=follow)
    except (OSError, ValueError):
        return False
    return True


def readlink(path: str | os.PathLike) -> str:
    """os.readlink of `path`, from its held root when it has one."""
    place = held_place(path)
    if place is None:
        return os.readlink(os.fspath(path))
    return os.readlink(place[1], dir_fd=place[0])


def real_path(path: str | os.PathLike) -> str:
    """os.path.realpath of `path`; of a held root, where the directory held is now (not what its path
    names: the mount it lies on is the held directory's)."""
    place = held_place(path)
    if place is not None and place[1] == ".":
        try:
            found = os.readlink(f"/proc/self/fd/{place[0]}")
            if found.startswith("/") and not found.endswith(" (deleted)"):
                return found
        except OSError:
            pass
    return os.path.realpath(path)


def open_path(path: str | os.PathLike, flags: int, mode: int = 0o777) -> int:
    """os.open of `path`, from its held root when it has one."""
    place = held_place(path)
    if place is None:
        return os.open(path, flags, mode)
    return os.open(place[1], flags, mode, dir_fd=place[0])


def listdir(path: str | os.PathLike) -> list[str]:
    """os.listdir of `path`, from its held root when it has one."""
    place = held_place(path)
    if place is None:
        return os.listdir(path)
    fd = os.open(place[1], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=place[0])
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


class Listed:
    """What os.DirEntry tells of a name listed below a held root (name, path, types, inode; stat() on
    demand, from the held root's fd): os.scandir of an fd hands out entries whose path is the bare name
    and whose stat() needs that fd open."""

    __slots__ = ("name", "path", "_fd", "_rel", "_ino", "_dir", "_file", "_link", "_lst", "_st")

    def __init__(self, de: os.DirEntry, path: str, fd: int, rel: str) -> None:
        self.name, self.path, self._fd, self._rel = de.name, path, fd, rel
        self._ino = de.inode()
        self._link = de.is_symlink()
        self._dir = de.is_dir(follow_symlinks=False)
        self._file = de.is_file(follow_symlinks=False)
        self._lst: os.stat_result | None = None
        self._st: os.stat_result | None = None

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<Listed {self.name!r}>"

    def inode(self) -> int:
        return self._ino

    def is_symlink(self) -> bool:
        return self._link

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self._link:
            try:
                return stat.S_ISDIR(self.stat().st_mode)
            except OSError:
                return False
        return self._dir

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self._link:
            try:
                return stat.S_ISREG(self.stat().st_mode)
            except OSError:
                return False
        return self._file

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        follow = follow_symlinks and self._link
        got = self._st if follow else self._lst
        if got is None:
            if _HELD.get(self._where()) == self._fd:
                got = os.stat(self._rel, dir_fd=self._fd, follow_symlinks=follow)
            else:  # the command that listed it is over: by path, as os.DirEntry's would
                got = os.stat(self.path, follow_symlinks=follow)
            if follow:
                self._st = got
            else:
                self._lst = got
        return got

    def _where(self) -> str:
        return self.path[: len(self.path) - len(self._rel)]


def scandir_list(path: str | os.PathLike, keep: Callable[[os.DirEntry], bool] | None = None,
                 limit: int | None = None) -> list[os.DirEntry]:
    """list(os.scandir(path)) (its first `limit` names; those `keep` keeps, judged while listing), from
    its held root when it has one (then Listed entries, which answer as os.DirEntry does)."""
    place = held_place(path)
    if place is None:
        with os.scandir(os.fspath(path)) as it:
            return [d for d in itertools.islice(it, limit) if keep is None or keep(d)]
    root_fd, rel = place
    base = os.fspath(path).rstrip("/")
    prefix = "" if rel == "." else rel + "/"
    fd = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
    try:
        with os.scandir(fd) as it:
            found = [Listed(d, f"{base}/{d.name}", root_fd, prefix + d.name) for d in itertools.islice(it, limit)
                     if keep is None or keep(d)]
    finally:
        os.close(fd)
    return found  # type: ignore[return-value]  # Listed answers as os.DirEntry does


def _same_dir(a: int, b: int) -> bool:
    try:
        return os.path.samestat(os.fstat(a), os.fstat(b))
    except OSError:
        return False


# The roots reads by path (`base=`) resolve from: describe's, log's and the archive's reads, which are
# not handed an EntryDir. A judgement never looks here: it reads through the EntryDir it is handed.
_ANCHORS: dict[str, Anchor] = {}  # "<root>/" -> its anchor (the newest few)
_MAX_ANCHORS = 8


def anchor(root: str | os.PathLike) -> Anchor | None:
    """The anchor of `root` that reads by path below it resolve from from now on (opened again when the
    root's path names another directory now), or None when it cannot be opened."""
    key = os.path.join(os.path.abspath(root), "")
    held = _ANCHORS.get(key)
    if held is not None and held.current():
        return held
    if held is not None:
        _ANCHORS.pop(key).close()
    try:
        new = Anchor(key)
    except OSError:
        return None
    while len(_ANCHORS) >= _MAX_ANCHORS:
        _ANCHORS.pop(next(iter(_ANCHORS))).close()
    _ANCHORS[key] = new
    return new


def _anchored_dir(path: str) -> tuple[int, str] | None:
    """(a new fd of the directory holding `path`, the file name) when `path` lies below an anchor."""
    for held in _ANCHORS.values():
        if held.holds(path):
            return held.dir_of(path)
    return None


def open_regular(path: str, *, dir_fd: int | None = None, base: str | None = None,
                 follow: bool = False) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file at `path`; NotRegularFile for anything else.

    The last component is never followed (O_NOFOLLOW) and a FIFO does not block the open
    (O_NONBLOCK, which has no effect on a regular file). With `base`, `path` must lie below that
    directory and no component below it is followed either (a `module/` that is a symlink out of
    the cache is refused like a symlinked file). `follow` is for a path the user named (a task
    file given to `build`): a link is followed, the file must still be regular."""
    if base is not None and dir_fd is None:
        path, base = absolute(path), absolute(base)
        rel = _relative(path, base)
        if rel == ".." or rel.startswith("../"):
            raise refuse(path, "outside its entry")
        anchored = _anchored_dir(path)
        if anchored is not None:
            dfd, name = anchored
            try:
                return open_regular(name, dir_fd=dfd)
            finally:
                os.close(dfd)
        head, name = os.path.split(rel)
        if head:
            dfd = open_dir_beneath(base, head)
            try:
                return open_regular(name, dir_fd=dfd)
            finally:
                os.close(dfd)
    place = held_place(path) if dir_fd is None else None
    if place is not None:  # below a held root: from its fd
        return open_file(place[1], place[0], follow, path)
    return open_file(path, dir_fd, follow, path)


def open_file(path: str, dir_fd: int | None, follow: bool, shown: str,
               pre: os.stat_result | None = None) -> tuple[int, os.stat_result]:
    """open_regular's open of `path` (relative to `dir_fd`); `shown` names it in refusals. `pre`: its
    lstat as a scan just listed it (held_listing), which spares the stat below. Root follows a link only
    to what the link's owner may read (linked_for)."""
    try:
        # A device is not even opened (opening one can act: a tape rewinds, a watchdog arms); the
        # fstat below catches what is swapped in between.
        if pre is None:
            pre = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
        if not stat.S_ISREG(pre.st_mode):
            raise refuse(shown, kind_of(pre.st_mode))
        if follow and EUID == 0:
            own = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(own.st_mode):
                linked_for(own, pre, shown)
        fd = open_quietly(path, FILE_FLAGS & ~os.O_NOFOLLOW if follow else FILE_FLAGS, dir_fd, pre.st_uid)
    except NotRegularFile:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise refuse(shown, "a symlink") from None
        raise
    return fd, fstat_regular(fd, lambda st: refuse(shown, kind_of(st.st_mode)))


def linked_for(link: os.stat_result, target: os.stat_result, shown: str) -> None:
    """PermissionError when `link` (an lstat) is a symlink, or a file that names another (Triton's group file),
    whose owner may not read `target` by its mode: run as root, kcache reads nothing through what a user
    made that the user could not read themself (a member's link in a shared cache to a root-only file),
    nor says anything of its bytes; the compiler, run by that user, fails reading it too."""
    if may_read(link.st_uid, target):
        return
    raise PermissionError(errno.EACCES, f"Permission denied to its maker (uid {link.st_uid}), so not read by root",
                          shown)


def may_read(uid: int, st: os.stat_result) -> bool:
    """Whether the user `uid` may read the file `st` by its mode bits (owner, group, others), as the kernel
    decides for that user; root may read anything."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid in _groups_of(uid):
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


_GROUPS: dict[int, frozenset[int]] = {}


def _groups_of(uid: int) -> frozenset[int]:
    """The groups of the user `uid` (its primary group and those that list it); none for a uid with no name."""
    if uid not in _GROUPS:
        import pwd

        try:
            pw = pwd.getpwuid(uid)
            _GROUPS[uid] = frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except (KeyError, OSError):
            _GROUPS[uid] = frozenset()
    return _GROUPS[uid]


def fstat_regular(fd: int, refusal: Callable[[os.stat_result], OSError]) -> os.stat_result:
    """The fstat of the just-opened `fd`, a regular file; otherwise (a file swapped for a FIFO or device
    between a stat and the open) `fd` is closed and `refusal(its stat)` raised."""
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise refusal(st)
    return st


def names(path: str) -> list[str]:
    """os.listdir(path); [] when it cannot be listed (the caller judges what is missing)."""
    try:
        return listdir(path)
    except OSError:
        return []


def sorted_entries(path: str | os.PathLike[str], keep: Callable[[os.DirEntry], bool] | None = None
                   ) -> list[os.DirEntry]:
    """The directory's entries (those `keep` keeps), sorted by name; [] when it is missing, OSError when
    it cannot be read."""
    try:
        return sorted(scandir_list(path, keep), key=lambda d: d.name)
    except FileNotFoundError:
        return []


def subdir_names(path: str | os.PathLike) -> list[str]:
    """The names of the subdirectories of `path` (a link is not one), sorted, from its held root when it
    has one; [] when it is missing, OSError when it cannot be read. Names only: a root of 10^5 key
    directories lists in a fraction of what scandir_list's entries cost."""
    try:
        fd = open_path(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        with os.scandir(fd) as it:
            names = [d.name for d in it if d.is_dir(follow_symlinks=False)]
    finally:
        os.close(fd)
    names.sort()
    return names


def subdir_paths(path: str) -> list[str]:
    """The paths of the subdirectories of `path`, sorted (a link is not one); [] when it cannot be listed."""
    try:
        return [os.path.join(path, n) for n in subdir_names(path)]
    except OSError:
        return []


_NOATIME = getattr(os, "O_NOATIME", 0)
EUID = os.geteuid()  # kcache never changes it: asked once (here, and by entrydir, readmarks and checks)


# Files open_quietly opened without O_NOATIME (another user's: the kernel grants it to owners and root only):
# fd -> its fstat before any read. close_read puts what the reads moved in MOVED, ("<root>/" of the cache
# being read, READING, inode) -> (atime after kcache's reads, atime before them) in ns, which
# fs/readmarks.py notes in that cache: kcache's own reads are never a use, whichever command made them.
_WATCHED: dict[int, os.stat_result] = {}
MOVED: dict[tuple[str, int], tuple[int, int]] = {}
READING: str | None = None  # set by readmarks.reading: no cache, nothing noted (a build's own sources)


def open_quietly(path: str, flags: int, dir_fd: int | None = None, owner: int | None = None) -> int:
    """os.open, with O_NOATIME where the kernel allows it (the file's owner, or root): kcache's own reads
    leave a file's access time alone, so that atime keeps saying when a compiler last read it (the last
    use kcache reports). Another user's file (`owner`, when known) is read without it (EPERM), and its
    atime before the read is kept for close_read: close the fd with it."""
    euid = EUID
    if _NOATIME and (owner is None or owner == euid or euid == 0):
        try:
            fd = os.open(path, flags | _NOATIME, dir_fd=dir_fd)
        except PermissionError:  # root without CAP_FOWNER over this file (a user namespace)
            pass
        else:
            _WATCHED.pop(fd, None)  # a number an earlier file had, closed by os.close
            return fd
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        _WATCHED[fd] = os.fstat(fd)
    except OSError:
        _WATCHED.pop(fd, None)
    return fd


def close_read(fd: int) -> None:
    """os.close of a file open_quietly opened (open_regular, EntryDir.open_file): where kcache's reads of
    it moved its atime, the atimes after and before them go to MOVED."""
    before = _WATCHED.pop(fd, None)
    if before is not None and READING is not None:
        try:
            now = os.fstat(fd)
        except OSError:
            now = before
        if (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino) and now.st_atime_ns != before.st_atime_ns:
            moved(READING, now.st_ino, now.st_atime_ns, before.st_atime_ns)
    os.close(fd)


def read_listed(dir_fd: int, name: str, listed: os.stat_result, limit: int, head: bool = False) -> bytes | None:
    """The bytes of the small file `name` in the directory `dir_fd` (with `head`, the first `limit` bytes
    of a bigger one), when it is still the regular file a listing just lstat'ed (`listed`: same inode and
    size) and this process reads it without moving its atime (its owner, or root: O_NOATIME); else None,
    and the caller reads it the careful way (open_file, read_open). No link is followed, no FIFO or device
    read: a scan's fast path (layouts/triton.py, EntryDir.read_bytes: a third of the Python of a read)."""
    size = listed.st_size
    if not stat.S_ISREG(listed.st_mode) or not _NOATIME or (listed.st_uid != EUID and EUID != 0):
        return None
    if size > limit:
        if not head:
            return None
        return _read_listed(dir_fd, name, listed, limit, limit)
    return _read_listed(dir_fd, name, listed, size + 1, size)


def _read_listed(dir_fd: int, name: str, listed: os.stat_result, ask: int, want: int) -> bytes | None:
    """read_listed's open, check and read of `ask` bytes, which must give `want`."""
    try:
        fd = os.open(name, FILE_FLAGS | _NOATIME, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_ino != listed.st_ino or st.st_size != listed.st_size or not stat.S_ISREG(st.st_mode):
            return None
        data = os.read(fd, ask)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == want else None


def moved(root: str, ino: int, after: int, before: int) -> None:
    """MOVED: kcache's read of the file `ino` in the cache `root` moved its atime from `before` to `after`.
    Read before in this process (its atime then `before`, or already `after`: a listing taken between two
    reads reports an atime in between), the atime before that first read stays. A scan's threads may read
    one file at once (an fx graph two AOTAutograd entries name)."""
    with _MOVED_LOCK:
        prev = MOVED.get((root, ino))
        MOVED[(root, ino)] = (after, prev[1] if prev is not None and prev[0] in (before, after) else before)


_MOVED_LOCK = threading.Lock()


def absolute(path: str) -> str:
    """os.path.abspath, without its cost for the absolute, already normal paths scans hand out."""
    if (path[:1] == "/" and "//" not in path and "/./" not in path and "/../" not in path
            and not path.endswith(("/", "/.", "/.."))):
        return path
    return os.path.abspath(path)


def _relative(path: str, base: str) -> str:
    """os.path.relpath(path, base), without its cost where `path` is plainly `base/<clean rest>`."""
    if base and path.startswith(base) and path[len(base):len(base) + 1] == "/" and not base.endswith("/"):
        parts = path[len(base) + 1:].split("/")
        if all(p not in ("", ".", "..") for p in parts):
            return "/".join(parts)
    return os.path.relpath(path, base)


def open_dir_beneath(base: str, rel: str) -> int:
    """An fd of the directory `base/rel`, opened one component at a time without following links."""
    return dir_beneath_fd(os.open(base, DIR_FLAGS), base, rel, own=True)


def dir_beneath_fd(fd: int, base: str, rel: str, own: bool = False) -> int:
    """`rel` below the directory `fd` (named `base` in errors), one component at a time, no link followed.
    The caller's `fd` stays open unless `own`."""
    if not own:
        fd = os.dup(fd)
    try:
        for part in rel.split(os.sep):
            if part in ("", "."):
                continue
            if part == "..":
                raise refuse(os.path.join(base, rel), "outside its entry")
            try:
                sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise refuse(os.path.join(base, rel), f"{part}/ is a symlink or not a directory") from None
                raise
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_fd(fd: int, limit: int, size: int = CHUNK) -> bytes:
    """Up to `limit` bytes, in reads of at most CHUNK; the first asks for `size` + 1 (the file's size at
    its fstat), as os.read allocates all it asks for: a 1 MiB buffer per 300-byte task.txt cost more
    than the read."""
    want = min(size + 1, CHUNK)
    if want <= limit:  # the usual small file: one read that comes back short is all of it
        first = os.read(fd, want)
        if len(first) < want and len(first) >= size:
            return first
        parts, left, got, want = [first], limit - len(first), len(first), CHUNK
    else:
        parts, left, got = [], limit, 0
    while left > 0:
        ask = min(want, left)
        chunk = os.read(fd, ask)
        want = CHUNK
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
        got += len(chunk)
        if len(chunk) < ask and got >= size:
            break  # a short read past the size fstat saw: the end of the file (one read less per file)
    return b"".join(parts)


def read_bytes(path: str, limit: int, *, base: str | None = None, dir_fd: int | None = None,
               strict: bool = True, follow: bool = False) -> bytes:
    """The bytes of a regular file, at most `limit`. With `strict`, a longer file is TooLarge
    (its contents would be judged wrongly if cut); otherwise the first `limit` bytes."""
    fd, st = open_regular(path, base=base, dir_fd=dir_fd, follow=follow)
    return read_open(fd, st, limit, strict, path)


def read_open(fd: int, st: os.stat_result, limit: int, strict: bool, shown: str) -> bytes:
    """read_bytes of the file just opened as `fd` (fstat `st`), named `shown` in errors; closes `fd`."""
    try:
        if strict and st.st_size > limit:
            raise TooLarge(errno.EFBIG, f"over {limit} bytes ({st.st_size}), not read", shown)
        data = _read_fd(fd, limit + 1 if strict else limit, st.st_size)
    finally:
        close_read(fd)
    if strict and len(data) > limit:  # grew since the fstat
        raise TooLarge(errno.EFBIG, f"over {limit} bytes, not read", shown)
    return data


def read_head(path: str, n: int = 64, *, base: str | None = None) -> bytes:
    """Up to `n` first bytes; b"" when the file cannot be read (callers judge the bytes)."""
    try:
        return read_bytes(path, n, base=base, strict=False)
    except OSError:
        return b""


def read_text(path: str, limit: int = MAX_TEXT, *, base: str | None = None) -> str | None:
    """The text of a file (cut at `limit` bytes, decoded with replacement), or None when it is
    missing or not a readable regular file."""
    try:
        return read_bytes(path, limit, base=base, strict=False).decode("utf-8", "replace")
    except OSError:
        return None


def iter_chunks(path: str, *, base: str | None = None, chunk: int = CHUNK) -> Iterator[bytes]:
    """A regular file's bytes in chunks of at most `chunk` (streaming: memory stays bounded)."""
    fd, _ = open_regular(path, base=base)
    return chunks_of(fd, chunk)


def chunks_of(fd: int, chunk: int = CHUNK) -> Iterator[bytes]:
    """The bytes of the file open as `fd`, in chunks of at most `chunk`; closes `fd` when done."""
    try:
        while True:
            data = os.read(fd, chunk)
            if not data:
                return
            yield data
    finally:
        close_read(fd)


def sha256_file(path: str, *, base: str | None = None) -> str:
    h = hashlib.sha256()
    for data in iter_chunks(path, base=base):
        h.update(data)
    return h.hexdigest()


# ---- JSON ----------------------------------------------------------------------------------------

_STRING = _PAIR = None
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')


def json_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of a JSON text (its bracket count when that is at most `limit`), or more
    than `limit` when it is deeper (then counting stops).

    At C speed: escapes dropped, everything but brackets and quotes dropped, strings cut out, then
    the innermost pairs removed, one level per pass (re.sub never rescans what a removal joins)."""
    global _STRING, _PAIR
    opens = data.count(b"[") + data.count(b"{")
    if opens <= limit:
        return opens  # cannot nest deeper than it has brackets

    if _STRING is None or _PAIR is None:
        _STRING = re.compile(rb'"[^"]*"')
        _PAIR = re.compile(rb"\[\]|\{\}")
    # backslashes pair up left to right, as JSON reads them; then no quote left is escaped
    bare = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    # two quotes side by side close a string and open the next with no structure between them (or
    # enclose an empty one): dropping them changes nothing, and leaves few strings for the regex
    brackets = _STRING.sub(b"", bare.replace(b'""', b""))
    depth = 0
    while brackets:
        if depth > limit:
            return depth
        shorter = _PAIR.sub(b"", brackets)
        if len(shorter) == len(brackets):
            break  # unbalanced: json.loads says what is wrong
        brackets = shorter
        depth += 1
    return depth


# orjson parses a scan's small JSON files 3x as fast as json (2 us of a Triton kernel's 1.2 kB metadata
# against 7), and gives the same values, but for integers past 64 bits (floats there): a text with a run
# of 19 digits anywhere (in a string too: rare) is left to json, found in C (digits to "0", the rest to
# " ", then a substring search: 1 us, where a regex took 10). Whatever orjson refuses goes to json too,
# which accepts more (NaN, a BOM, UTF-16, lone surrogates) and says what is wrong in its own words.
_DIGITS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))
_LONG_RUN = b"0" * 19


def _orjson_value(raw: bytes) -> Any:
    """What json.loads(raw) gives, when orjson can tell it; else _NOT_PARSED."""
    if _orjson is None or not isinstance(raw, (bytes, bytearray)) or _LONG_RUN in raw.translate(_DIGITS):
        return _NOT_PARSED
    try:
        return _orjson.loads(raw)
    except _orjson.JSONDecodeError:
        return _NOT_PARSED


_NOT_PARSED = object()


def parse_json(data: bytes | str, what: str = "JSON", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads under a nesting limit: too deep is a ValueError that says so, never a RecursionError."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if json_depth(raw, max_depth) > max_depth:
        raise JsonTooDeep(f"{what} is nested more than {max_depth} levels deep")
    value = _orjson_value(raw)
    if value is not _NOT_PARSED:
        return value
    try:
        return json.loads(data)
    except RecursionError:  # a second net: never a traceback
        raise JsonTooDeep(f"{what} is nested too deeply") from None


def load_json(path: str, limit: int = MAX_JSON, *, base: str | None = None,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON file under a size and nesting limit. OSError (NotRegularFile, TooLarge...) when it
    cannot be read, ValueError when it is not JSON (JsonTooDeep when nested too deep)."""
    return parse_json(read_bytes(path, limit, base=base), os.path.basename(path), max_depth)


def json_object(path: str | os.PathLike, limit: int = MAX_JSON, *, base: str | None = None) -> dict | None:
    """The JSON object in the file at `path` under the size and nesting limits, or None when it is
    missing, unreadable, not a regular file, too big, too deep, not JSON or not an object: the one
    JSON-or-None reader (every caller treats all of those alike)."""
    try:
        data = load_json(os.fspath(path), limit, base=base)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def json_problem(path: str, limit: int = MAX_JSON, *, base: str | None = None) -> tuple[Any, str | None]:
    """(value, None) or (None, a one-line reason naming the file) for a JSON record of an entry."""
    try:
        return load_json(path, limit, base=base), None
    except (OSError, ValueError) as exc:
        return None, json_reason(os.path.basename(path), exc)


def json_reason(name: str, exc: OSError | ValueError) -> str:
    """json_problem's one-line reason for the error reading or parsing the JSON file `name`."""
    if isinstance(exc, FileNotFoundError):
        return f"{name} is missing"
    if isinstance(exc, OSError):
        return f"{name} is unreadable: {exc.strerror or exc}"
    if isinstance(exc, JsonTooDeep):
        return str(exc)
    return f"{name} is not valid JSON"


# ---- walking -------------------------------------------------------------------------------------

class TreeTooDeep(OSError):
    """A directory tree deeper than the walk's limit."""


def walk_files(path: str, max_depth: int = MAX_TREE_DEPTH) -> Iterator[tuple[str, os.stat_result, str | None]]:
    """(name relative to `path`, lstat, link target or None) of every file, link and other
    non-directory under `path`: a directory's own files (sorted) before its subdirectories'.
    Iterative and relative to directory fds (no path grows past PATH_MAX), never following links.
    TreeTooDeep past `max_depth` (after what came before it); an unreadable subdirectory is skipped."""
    top = open_path(path, DIR_FLAGS)
    try:
        yield from walk_fd(top, path, max_depth)
    finally:
        os.close(top)


def walk_fd(top: int, path: str, max_depth: int = MAX_TREE_DEPTH) -> Iterator[tuple[str, os.stat_result, str | None]]:
    """walk_files of the directory open as `top` (named `path` in errors; `top` stays open)."""
    stack: list[tuple[int, str, list[str]]] = []  # (dir fd, its prefix, subdirectories still to visit)
    try:
        stack.append((os.dup(top), "", []))
        yield from _visit(stack[-1][0], "", stack[-1][2])
        while stack:
            fd, prefix, subdirs = stack[-1]
            if not subdirs:
                stack.pop()
                os.close(fd)
                continue
            name = subdirs.pop()
            if len(stack) > max_depth:
                raise TreeTooDeep(errno.ELOOP, f"directories nested more than {max_depth} deep", path)
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            stack.append((sub, prefix + name + "/", []))
            try:
                yield from _visit(sub, prefix + name + "/", stack[-1][2])
            except OSError:
                continue  # unreadable: its files are not listed
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _visit(fd: int, prefix: str, subdirs: list[str]) -> Iterator[tuple[str, os.stat_result, str | None]]:
    """The non-directories of one open directory; its subdirectories go to `subdirs` (reversed, to pop)."""
    for name in sorted(os.listdir(fd)):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            subdirs.append(name)
            continue
        link = None
        if stat.S_ISLNK(st.st_mode):
            try:
                link = os.readlink(name, dir_fd=fd)
            except OSError:
                link = "?"
        yield prefix + name, st, link
    subdirs.reverse()
