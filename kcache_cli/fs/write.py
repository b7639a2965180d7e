"""Writing under a cache root or a file:// remote when a co-user may swap any directory in it: the one
set of write helpers.

Every write starts from a directory descriptor held from the root (the directory the user named;
a link to it is followed once, there). A directory below it is opened with openat2
RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS (or, without openat2, one component at a time with O_NOFOLLOW),
so a directory swapped for a symlink, even atomically with renameat2(RENAME_EXCHANGE) between two
calls, makes the write fail instead of landing where the link points. Names are then created,
renamed and removed relative to that descriptor (mkdirat, openat O_CREAT|O_EXCL|O_NOFOLLOW,
symlinkat, renameat2, unlinkat), and times are set through an open file, never by path: nothing
is ever resolved by path twice. The ownership checks of shared caches (`owner_problem`) live here too.

Light on purpose (os, stat, errno): `kcache build`'s hit path imports it."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable
from typing import Any

from kcache_cli.fs import read as fsread

DIR_FLAGS = fsread.DIR_FLAGS
_BENEATH = fsread.RESOLVE_BENEATH | fsread.RESOLVE_NO_SYMLINKS
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


# ---- directories ---------------------------------------------------------------------------------

def open_root(path: str | os.PathLike) -> int:
    """A descriptor of the root: a copy of the one held since it was vetted (fsread.hold_root), else of
    the root the user named (a link to it is followed, here and only here)."""
    return fsread.open_root(path)


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EXDEV, "a path with '..' never leaves its root", rel)
    return parts


def open_dir(dir_fd: int, rel: str, *, create: bool = False, mode: int = 0o777) -> int:
    """A new descriptor of the directory `rel` beneath `dir_fd`: no component may be a symlink (ELOOP)
    or lead out (EXDEV). With `create`, missing components are made (mkdirat, `mode` less the umask); one
    made in a group-shared directory of a group-shared `dir_fd` (the cache root: setgid, group-writable,
    the same group) is made group-shared too, whatever the umask: root's cron under 022 must not make an
    op directory the group's members cannot build in. (A setgid directory a co-user made inside a cache
    that is not group-shared shares nothing.) One root makes under another user's `dir_fd` is given to
    that user (give_to)."""
    parts = _parts(rel)
    if not parts:
        return os.dup(dir_fd)
    if not create:
        fd = fsread.openat2(dir_fd, "/".join(parts), DIR_FLAGS, _BENEATH)
        if fd is not None:
            return fd
    fd = os.dup(dir_fd)
    top = os.fstat(dir_fd) if create else None
    shared_gid = top.st_gid if top is not None and group_shared(top) else None
    try:
        for part in parts:
            try:
                sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                made = mkdir_at(fd, part, mode, exist_ok=True)
                sub = os.open(part, DIR_FLAGS, dir_fd=fd)
                if made and shared_gid is not None and mode & 0o070 and group_shared(parent := os.fstat(fd)) \
                        and parent.st_gid == shared_gid:
                    try:
                        share_with_group(sub, shared_gid)
                    except OSError:  # as the umask made it: the members' writes then say why
                        pass
                elif made and top is not None:
                    give_to(sub, owner_for(top))
            os.close(fd)
            fd = sub
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.ENOTDIR:
            raise OSError(errno.ELOOP, "a symlink or not a directory (kcache never writes through one)", rel) from None
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_parent(dir_fd: int, rel: str, *, create: bool = False, mode: int = 0o777) -> tuple[int, str]:
    """(a new descriptor of the directory holding `rel` beneath `dir_fd`, the last name of `rel`)."""
    head, _, name = rel.rstrip("/").rpartition("/")
    if name in ("", ".", ".."):
        raise OSError(errno.EINVAL, "not a name inside a directory", rel)
    return open_dir(dir_fd, head, create=create, mode=mode), name


def mkdir_at(dir_fd: int, name: str, mode: int = 0o777, exist_ok: bool = False) -> bool:
    """mkdirat; True if made. With `exist_ok` whatever is there is left for the open that follows to
    judge (O_NOFOLLOW|O_DIRECTORY refuses a link or a file)."""
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
        return True
    except FileExistsError:
        if not exist_ok:
            raise
        return False


def rmdir_at(dir_fd: int, name: str) -> bool:
    """rmdir `name` in `dir_fd` if empty; False when it is not (or is gone, or cannot be)."""
    try:
        os.rmdir(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


# ---- files ---------------------------------------------------------------------------------------

def create_excl(dir_fd: int, name: str, mode: int = 0o644) -> int:
    """A new file `name` in `dir_fd`, opened for writing: never follows a link, never replaces anything."""
    return os.open(name, _NEW_FILE, mode, dir_fd=dir_fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Every byte of `data` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(dir_fd: int, name: str, data: bytes | Iterable[bytes], mode: int = 0o644, sync: bool = False,
               give: bool = False) -> None:
    """A new file `name` in `dir_fd` holding `data` (bytes or chunks); removed again if writing fails. With
    `give`, root's is given to the owner of a user's `dir_fd` (give_like_dir)."""
    fd = create_excl(dir_fd, name, mode)
    try:
        if give:
            give_like_dir(fd, dir_fd)
        for chunk in ((data,) if isinstance(data, (bytes, bytearray, memoryview)) else data):
            write_all(fd, chunk)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_at(dir_fd, name)
        raise
    os.close(fd)


def token(nbytes: int) -> str:
    """`nbytes` random bytes in hex, for temp names (secrets.token_hex, without its start-up imports)."""
    return os.urandom(nbytes).hex()


def temp_name(prefix: str = ".tmp-") -> str:
    return f"{prefix}{os.getpid()}-{token(6)}"


def replace_file(dir_fd: int, name: str, data: bytes, mode: int = 0o644, sync: bool = True,
                 prefix: str = ".tmp-") -> None:
    """Replace `name` in `dir_fd` with a file holding `data`, atomically: a temp file in the same held
    directory, renamed over it (whatever `name` was, a link included, is replaced, never written through)."""
    tmp = temp_name(prefix)
    write_file(dir_fd, tmp, data, mode, sync)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        unlink_at(dir_fd, tmp)
        raise
    if sync:
        try:
            os.fsync(dir_fd)
        except OSError:
            pass


def replace_file_shared(dir_fd: int, name: str, data: bytes, group_reads_only: bool = False) -> None:
    """replace_file for kcache's own state: the new file is shared with the group of a group-shared
    directory (share_like_dir) before it takes the name, whatever the umask; with `group_reads_only`
    the group may read it but not write it (a member replaces it, as its own, but cannot change it in
    place under its writer's name)."""
    tmp = temp_name(f".{name}.tmp-")
    fd = create_excl(dir_fd, tmp, 0o644)
    try:
        if share_like_dir(fd, dir_fd) and group_reads_only:
            os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~0o022)
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_at(dir_fd, tmp)
        raise
    os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        unlink_at(dir_fd, tmp)
        raise


def replace_file_via_dir(dir_fd: int, name: str, data: bytes, dir_prefix: str) -> None:
    """Replace `name` in `dir_fd` with `data`, atomically and durably, as Triton writes: the new file is
    written in a private directory `<dir_prefix><pid>_<random>` beside it (a reader of the cache passes
    over such a directory, never over a stray file), renamed over `name`, the directory removed."""
    tmp_name = f"{dir_prefix}{os.getpid()}_{token(16)}"
    mkdir_at(dir_fd, tmp_name, 0o700)
    try:
        tfd = open_dir(dir_fd, tmp_name)
        try:
            give_like_dir(tfd, dir_fd)  # root's in a user's cache: the new file the owner's, as the old was
            write_file(tfd, name, data, 0o644, sync=True, give=True)
            rename_at(tfd, name, dir_fd, name)
            os.fsync(dir_fd)
        finally:
            unlink_at(tfd, name)
            os.close(tfd)
    finally:
        rmdir_at(dir_fd, tmp_name)


def symlink_at(target: str, dir_fd: int, name: str) -> None:
    """symlinkat: a new link `name` in `dir_fd` (its target is only text; nothing is followed)."""
    os.symlink(target, name, dir_fd=dir_fd)


def link_at(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """linkat without following `src`: FileExistsError if `dst` exists (an atomic no-replace publish)."""
    os.link(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)


def lexists_at(dir_fd: int, name: str) -> bool:
    """Is there anything (a link counts, never followed) named `name` in `dir_fd`?"""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def unlink_at(dir_fd: int, name: str, missing_ok: bool = True) -> bool:
    """unlinkat a file or link (never a directory); False when it was not there."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False


def copy_file_at(src_fd: int, src: str, dst_fd: int, dst: str, mode: int = 0o644) -> None:
    """Copy the regular file `src` (never a link, FIFO or device) to the new file `dst`."""
    fd, _ = fsread.open_regular(src, dir_fd=src_fd)
    try:
        write_file(dst_fd, dst, iter(lambda: os.read(fd, fsread.CHUNK), b""), mode)
    finally:
        fsread.close_read(fd)


def copy_tree_at(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """Copy the directory `src` to the new directory `dst` (links as links, files as files; anything
    else is refused), iteratively and through descriptors only, with the times of what it copies (as the
    rename it stands in for would keep them: a directory's once all it holds is in)."""
    mkdir_at(dst_fd, dst)
    stack = [_pair(src_fd, src, dst_fd, dst)]
    try:
        while stack:
            sfd, dfd = stack.pop()
            try:
                times = os.fstat(sfd)
                for de in sorted(os.scandir(sfd), key=lambda d: d.name):
                    st = de.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        mkdir_at(dfd, de.name)
                        stack.append(_pair(sfd, de.name, dfd, de.name))
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        symlink_at(os.readlink(de.name, dir_fd=sfd), dfd, de.name)
                    else:
                        copy_file_at(sfd, de.name, dfd, de.name, stat.S_IMODE(st.st_mode) & 0o777)
                    set_times_at(dfd, de.name, (st.st_atime_ns, st.st_mtime_ns))
                set_times_fd(dfd, (times.st_atime_ns, times.st_mtime_ns))
            finally:
                os.close(sfd)
                os.close(dfd)
    finally:
        for sfd, dfd in stack:
            os.close(sfd)
            os.close(dfd)


def _pair(src_fd: int, src: str, dst_fd: int, dst: str) -> tuple[int, int]:
    sfd = os.open(src, DIR_FLAGS, dir_fd=src_fd)
    try:
        return sfd, os.open(dst, DIR_FLAGS, dir_fd=dst_fd)
    except BaseException:
        os.close(sfd)
        raise


def set_times_fd(fd: int, ns: tuple[int, int] | None = None) -> None:
    """Set an open file's access and modification times (now when None): never utime by path."""
    if ns is None:
        os.utime(fd)
    else:
        os.utime(fd, ns=ns)


def set_times_at(dir_fd: int, name: str, ns: tuple[int, int]) -> None:
    """Set the access and modification times of `name` in `dir_fd` itself: a link is re-timed, never
    what it names."""
    os.utime(name, ns=ns, dir_fd=dir_fd, follow_symlinks=False)


def touch_at(dir_fd: int, name: str, ns: tuple[int, int] | None = None, mode: int = 0o644,
             group: int | None = None) -> None:
    """Give the file `name` in `dir_fd` the times `ns` (now when None), making it if missing. Only a
    regular file of this user with one link is re-timed through its descriptor; anything else (a link,
    a FIFO, another user's stamp, a hard link to a file elsewhere) is replaced by a new file instead,
    so no file outside the directory is ever created or re-timed. With `group` (a group-shared root's
    group), a new file is shared with it (share_with_group); else root's is given to the directory's owner
    (give_like_dir)."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dir_fd)
    except FileNotFoundError:
        fd = None
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ETXTBSY):
            raise
        fd = None
    if fd is not None:
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
                set_times_fd(fd, ns)
                return
        finally:
            os.close(fd)
    tmp = temp_name()
    fd = create_excl(dir_fd, tmp, mode)
    try:
        if group is not None:
            share_with_group(fd, group)
        else:
            give_like_dir(fd, dir_fd)
        set_times_fd(fd, ns)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        unlink_at(dir_fd, tmp)
        raise


# ---- renames -------------------------------------------------------------------------------------

_renameat2: Any = None


def _load_renameat2() -> Any:
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = (fn, ctypes)
        except (OSError, AttributeError):
            _renameat2 = False
    return _renameat2


def renameat2(src_fd: int, src: str, dst_fd: int, dst: str, flags: int) -> bool:
    """renameat2 with `flags`; False where the kernel or the filesystem has none (the caller falls back)."""
    if "\0" in src or "\0" in dst:  # a C string ends there: the call would rename another file
        raise OSError(errno.EINVAL, "a NUL byte in a file name", dst)
    loaded = _load_renameat2()
    if not loaded:
        return False
    fn, ctypes = loaded
    if fn(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), dst)


def rename_at(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """renameat: `dst` is replaced if it is a file (or an empty directory, for a directory)."""
    os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def rename_noreplace_at(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """renameat2(RENAME_NOREPLACE): FileExistsError rather than replace what is at `dst` (even an
    empty directory, which a plain rename replaces silently)."""
    if renameat2(src_fd, src, dst_fd, dst, RENAME_NOREPLACE):
        return
    try:
        os.stat(dst, dir_fd=dst_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)


def rename_held(src_fd: int, src: str, dst_fd: int, dst: str, held: os.stat_result) -> None:
    """Rename `src` to `dst` only while `src` is still the object `held` (the fstat of a descriptor kept
    open): a co-user who swapped the name for something else between the check and the rename is
    caught after it, the stranger is moved back where it was, and OSError(ESTALE) says so."""
    def same(st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)

    if not same(os.stat(src, dir_fd=src_fd, follow_symlinks=False)):
        raise OSError(errno.ESTALE, "replaced by something else meanwhile (another user?)", src)
    rename_at(src_fd, src, dst_fd, dst)
    if not same(os.stat(dst, dir_fd=dst_fd, follow_symlinks=False)):
        try:
            rename_noreplace_at(dst_fd, dst, src_fd, src)
        except OSError:
            pass
        raise OSError(errno.ESTALE, "replaced by something else meanwhile (another user?)", src)


def exchange_held(dir_fd: int, src: str, dst: str, held: os.stat_result) -> bool:
    """Swap the names `src` (still the object `held`) and `dst` in `dir_fd` in one step (renameat2
    RENAME_EXCHANGE): readers see the one or the other at `dst`, never none. False where the kernel or
    the file system cannot (nothing changed: the caller renames in two steps); OSError(ESTALE), the swap
    undone, when `src` was not `held` (a co-user's stranger)."""
    if not renameat2(dir_fd, src, dir_fd, dst, RENAME_EXCHANGE):
        return False
    st = os.stat(dst, dir_fd=dir_fd, follow_symlinks=False)
    if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):
        renameat2(dir_fd, src, dir_fd, dst, RENAME_EXCHANGE)
        raise OSError(errno.ESTALE, "replaced by something else meanwhile (another user?)", src)
    return True


# ---- ownership (shared caches) -------------------------------------------------------------------

def owner_problem(st: os.stat_result, what: str, *, private: bool = False, group: int | None = None,
                  owner: int | None = None) -> str | None:
    """Why a directory kcache is about to use for its own state cannot be trusted, or None.

    Trusted: owned by this user, by root, or by the cache root's `owner` (root pruning a user's own
    cache uses that user's trash and locks); or, in a group-shared cache (`group`: its group, None for any
    other cache), group-owned by that group with the setgid bit (what `chmod 2775` and a umask of 002
    make), and not writable by others. With `private` it must be this user's and closed to everyone else
    (a staging directory: mode 0700)."""
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} is {fsread.kind_of(st.st_mode)}, not a directory"
    if private:
        if st.st_uid != me:
            return f"{what} is owned by uid {st.st_uid}, not by you (uid {me})"
        if st.st_mode & 0o077:
            return f"{what} is open to other users (mode {stat.S_IMODE(st.st_mode):o}, kcache made it 0700)"
        return None
    if st.st_uid in (me, 0) or (owner is not None and st.st_uid == owner):
        return None
    if group is not None and st.st_gid == group and st.st_mode & stat.S_ISGID and not st.st_mode & 0o002:
        return None
    return f"{what} is owned by uid {st.st_uid}, not by you (uid {me}){'' if me == 0 else ' or root'}, " \
        "and is not group-shared"


def group_shared(st: os.stat_result) -> bool:
    """A group-shared cache root: setgid and group-writable (`chmod 2775`)."""
    return bool(st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IWGRP)


def share_with_group(fd: int, gid: int) -> None:
    """Give what this user made under a group-shared root's `.kcache/` the root's group `gid` and group
    read-write (directories also setgid), whatever the umask (root's cron with 022 included), and take
    write from others. What another user owns is left as it is (only its owner may change it)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        return
    if st.st_gid != gid:
        os.fchown(fd, -1, gid)
    want = stat.S_IMODE(st.st_mode) & ~0o002 | (0o2070 if stat.S_ISDIR(st.st_mode) else 0o060)
    if want != stat.S_IMODE(os.fstat(fd).st_mode):  # a chown may drop the setgid bit: read again
        os.fchmod(fd, want)


def _walk_held(fd: int, act: Callable[[int], bool], files: bool = False) -> None:
    """act(d) on each directory `d` of the tree held open as `fd` (itself first; its subdirectories only
    when act returns True) and, with `files`, act on each regular file in them: each opened beneath its
    held parent as its listing typed it, no link followed (O_NOFOLLOW; a file non-blocking, no FIFO waited
    on). What cannot be opened or changed (an OSError) is left as it is, and not descended into."""
    stack = [os.dup(fd)]
    while stack:
        cur = stack.pop()
        try:
            if not act(cur):
                continue
            with os.scandir(cur) as it:
                found = [(de.name, de.is_dir(follow_symlinks=False)) for de in it
                         if de.is_dir(follow_symlinks=False) or files and de.is_file(follow_symlinks=False)]
            for name, is_dir in found:
                try:
                    sub = os.open(name, DIR_FLAGS if is_dir else _FILE_FLAGS, dir_fd=cur)
                except OSError:  # gone, or swapped for a link (ELOOP, ENOTDIR): passed over
                    continue
                if is_dir:
                    stack.append(sub)
                    continue
                try:
                    act(sub)
                except OSError:
                    pass
                finally:
                    os.close(sub)
        except OSError:
            pass
        finally:
            os.close(cur)


_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def share_tree(fd: int, gid: int) -> None:
    """Every directory of the tree held open as `fd` that this user made, the group `gid`'s
    (share_with_group): an entry root's cron builds or imports under umask 022 into a group-shared cache
    must be one a member can remove (renaming or emptying a directory takes write on it). No link
    followed; what cannot be opened or changed is left as it is (_walk_held)."""

    def share(d: int) -> bool:
        share_with_group(d, gid)
        return True

    _walk_held(fd, share)


def share_like_dir(fd: int, dir_fd: int) -> bool:
    """share_with_group(fd) when the directory `dir_fd` it was made in is group-shared; whether it is. Else
    root's is given to the owner of a user's directory (give_to)."""
    st = os.fstat(dir_fd)
    if not group_shared(st):
        give_to(fd, owner_for(st))
        return False
    share_with_group(fd, st.st_gid)
    return True


# ---- root's work in a user's cache stays the user's ----------------------------------------------

def owner_for(st: os.stat_result) -> tuple[int, int] | None:
    """Whom root gives what it makes in the directory `st` (a cache root, or a directory of kcache's in
    one): its owner's uid and gid, when kcache runs as root and the directory is another user's and not
    group-shared (a group-shared cache keeps its group rule, share_with_group); else None (nothing
    changes hands: runs as a user, root's own caches)."""
    if os.geteuid() != 0 or st.st_uid == 0 or group_shared(st):
        return None
    return st.st_uid, st.st_gid


def give_to(fd: int, owner: tuple[int, int] | None, public_only: bool = False) -> bool:
    """fchown what root made, held as `fd`, to `owner` (owner_for; None: nothing): only a directory or a
    regular file with no other name that root owns; anything else (a hard link to a file elsewhere above
    all) is left as it is. Through the descriptor, never a path: a name the user swaps changes nothing.
    With `public_only`, only what gives the user nothing to read they could not read before (_public, of
    the descriptor's own fstat). Whether it was given."""
    if owner is None:
        return False
    st = os.fstat(fd)
    if st.st_uid != 0 or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
        return False
    if public_only and not _public(st):
        return False
    os.fchown(fd, *owner)
    return True


def give_like_dir(fd: int, dir_fd: int) -> None:
    """give_to the owner of the directory `dir_fd` that `fd` was made in (owner_for)."""
    give_to(fd, owner_for(os.fstat(dir_fd)))


def give_tree(fd: int, owner: tuple[int, int] | None, public_only: bool = False) -> None:
    """give_to every directory and regular file root owns in the tree held open as `fd`, itself included:
    an entry staged for publishing, or kcache's state an earlier root run left root's (_walk_held: opened
    beneath its held parent, no link followed, changed through its own descriptor). With `public_only` (a
    tree the user could have put things in), only what gives the user nothing to read they could not read
    before, judged on the descriptor (a name swapped after the listing changes nothing): a file of root's
    that the user moved there (they own the directory) never becomes theirs to read, and a directory not
    given is not descended into."""
    if owner is None:
        return

    def give(f: int) -> bool:
        give_to(f, owner, public_only)
        return not public_only or _public(os.fstat(f))

    _walk_held(fd, give, files=True)


def _public(st: os.stat_result) -> bool:
    """Nothing in it is root's to keep: a file empty (a lock, a stamp) or world-readable, a directory
    world-readable and searchable."""
    if stat.S_ISDIR(st.st_mode):
        return st.st_mode & 0o005 == 0o005
    return st.st_size == 0 or bool(st.st_mode & 0o004)


def give_back_state(fd: int, root_st: os.stat_result) -> None:
    """A directory of kcache's state (`.kcache/` or one in it, held as `fd`) that an earlier run of root's
    left root's in another user's cache (`root_st`: owner_for), given back with all of root's in it that
    gives the user nothing new to read (give_tree, public_only: kcache's locks and stamps are empty, its
    directories 0755 under umask 022; a private file of root's the user moved in stays root's): the owner's
    own prune, clear and builds must use and empty it."""
    owner = owner_for(root_st)
    if owner is not None and os.fstat(fd).st_uid == 0:
        give_tree(fd, owner, public_only=True)


def hand_over_tree(fd: int, root_st: os.stat_result, locks: Iterable[str] = ()) -> None:
    """What root (or a member) made in the tree `fd` under the cache root `root_st`, before it is published:
    the group's in a group-shared cache (share_tree), the root's owner's when root works in a user's cache
    (give_tree); otherwise left as the umask made it. `locks`: the names of the lock files the entry's own
    writer opens for writing (Layout.writer_locks), in the entry's directory: in a group-shared cache the
    group's to write too (hidet run by a member takes `.lock` of an entry root's cron imported)."""
    if not group_shared(root_st):
        give_tree(fd, owner_for(root_st))
        return
    share_tree(fd, root_st.st_gid)
    for name in locks:
        try:
            lock = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError:  # not there, or not a file (a link): left as it is
            continue
        try:
            if stat.S_ISREG(os.fstat(lock).st_mode):
                share_with_group(lock, root_st.st_gid)
        except OSError:
            pass
        finally:
            os.close(lock)


def make_dirs(path: str | os.PathLike) -> list[str]:
    """Make the directory `path` and its missing parents, as the user named them (a root being created:
    there is no root above it to hold); the directories made, top first. FileExistsError if `path` is there."""
    made: list[str] = []
    cur = os.path.abspath(path)
    missing = []
    while not os.path.lexists(cur):
        missing.append(cur)
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    if not missing:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path))
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if d == missing[0]:
                raise
            continue
        made.append(d)
    return made


def umask() -> int:
    """This process's umask, read without changing it (os.umask sets it: a race with other threads);
    read each time, as a caller may have changed it."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f.read(1 << 16).splitlines():
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
