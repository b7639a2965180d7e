"""Deleting a tree relative to directory descriptors, as coreutils `rm --one-file-system` and Rust's
`remove_dir_all` (after CVE-2022-21658) do: no path is trusted twice.

- Every directory is opened from its parent's descriptor with O_DIRECTORY|O_NOFOLLOW (and, where the
  kernel has openat2, RESOLVE_NO_XDEV|RESOLVE_NO_SYMLINKS, which also stops at bind mounts of the same
  filesystem); names are removed with unlinkat/rmdir relative to the parent's descriptor. A symlink is
  unlinked as a link, never followed.
- Nothing on another filesystem than the top of the removal is entered (st_dev is compared too):
  such a directory is skipped and reported, and so are its ancestors (they cannot become empty).
- The walk is iterative (an explicit stack): a 10,000-deep tree is no RecursionError. At most
  `_OPEN_WINDOW` descriptors stay open; a directory whose descriptor was closed is reopened through
  `..` of its child and must have the (st_dev, st_ino) it had when it was entered, else the removal
  stops (the tree was moved meanwhile) rather than delete somewhere else.
- With `writable`, a directory that refuses an unlink or a listing (EACCES/EPERM) is made
  user-writable (through an O_PATH descriptor, never a path) and retried: kcache's own trash and temp
  directories are its to delete."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.mounts import table

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_WINDOW = 48  # directory descriptors kept open below the top of one removal


@dataclass
class TreeRemoval:
    """What one removal did: `gone` is True when nothing is left of it."""

    gone: bool = True
    mounts: list[str] = field(default_factory=list)  # directories on another filesystem: left alone
    errors: list[str] = field(default_factory=list)  # "path: reason"

    @property
    def problems(self) -> list[str]:
        return [f"{m}: another filesystem (a mount point), never crossed" for m in self.mounts] + self.errors


def open_dir(dir_fd: int, name: str, same_mount: bool = True) -> int:
    """`name` inside `dir_fd` as a directory descriptor, never through a symlink (ELOOP/ENOTDIR) and,
    with `same_mount`, never onto another mount (EXDEV)."""
    fd = fsread.openat2(dir_fd, name, _DIR, fsread.RESOLVE_NO_XDEV | fsread.RESOLVE_NO_SYMLINKS) if same_mount else None
    return os.open(name, _DIR, dir_fd=dir_fd) if fd is None else fd


def make_writable(dir_fd: int, name: str | None = None) -> bool:
    """chmod u+rwx a directory (`dir_fd` itself, or `name` inside it) without following a link."""
    try:
        if name is None:
            os.fchmod(dir_fd, stat.S_IRWXU | (os.fstat(dir_fd).st_mode & 0o077))
            return True
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return False
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IRWXU | (st.st_mode & 0o077))  # the inode held, not a path
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


class _Frame:
    __slots__ = ("blocked", "fd", "ino", "label", "name", "todo")

    def __init__(self, fd: int, name: str, ino: int, label: str) -> None:
        self.fd: int | None = fd
        self.name, self.ino, self.label = name, ino, label
        self.todo: list[str] | None = None  # subdirectories still to remove
        self.blocked = False  # something below stays (a mount, an error): this one cannot be rmdir'ed


def remove_tree(parent_fd: int, name: str, label: str | None = None, writable: bool = True) -> TreeRemoval:
    """Remove `name` (a file, a link or a whole directory tree) from the directory `parent_fd`."""
    out = TreeRemoval()
    label = label or name
    try:
        top = _open_child(parent_fd, name, writable)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return out
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            if _unlink(parent_fd, name, label, writable, out) is None:
                out.errors.append(f"{label}: replaced by a directory during the removal")
        elif exc.errno == errno.EXDEV:
            out.mounts.append(label)
        else:
            out.errors.append(f"{label}: {exc.strerror or exc}")
        out.gone = not (out.mounts or out.errors)
        return out
    _Walk(parent_fd, top, name, label, writable, out).run()
    out.gone = not (out.mounts or out.errors)
    return out


def _open_child(dir_fd: int, name: str, writable: bool) -> int:
    try:
        return open_dir(dir_fd, name)
    except PermissionError:
        if not writable or not make_writable(dir_fd, name):
            raise
        return open_dir(dir_fd, name)


def _is_dir(de: os.DirEntry) -> bool | None:
    try:
        return de.is_dir(follow_symlinks=False)
    except OSError:
        return None


def _unlink(dir_fd: int, name: str, label: str, writable: bool, out: TreeRemoval) -> bool | None:
    """True when `name` is gone, False on failure (recorded), None when it is a directory."""
    for attempt in (0, 1):
        try:
            os.unlink(name, dir_fd=dir_fd)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EISDIR:  # a directory after all (or since the listing): walk it
                return None
            if attempt == 0 and writable and exc.errno in (errno.EACCES, errno.EPERM) and make_writable(dir_fd):
                continue
            out.errors.append(f"{label}: {exc.strerror or exc}")
            return False
    return False


class _Walk:
    """One iterative removal below an open top directory."""

    def __init__(self, parent_fd: int, top: int, name: str, label: str, writable: bool, out: TreeRemoval):
        st = os.fstat(top)
        self.parent_fd, self.dev, self.writable, self.out = parent_fd, st.st_dev, writable, out
        self.stack = [_Frame(top, name, st.st_ino, label)]

    def run(self) -> None:
        try:
            while self.stack:
                f = self.stack[-1]
                if f.todo is None:
                    f.todo = self._clear_files(f)
                if f.todo:
                    self._descend(f, f.todo.pop())
                elif not self._ascend():
                    return
        finally:
            for f in self.stack:
                if f.fd is not None:
                    os.close(f.fd)

    def _clear_files(self, f: _Frame) -> list[str]:
        """Unlink everything in `f` that is not a directory; its subdirectories' names. The type comes
        from the directory listing (d_type, no stat per name), like rm; a name that turns out to be a
        directory when unlinked is walked instead."""
        assert f.fd is not None
        try:
            with os.scandir(f.fd) as it:
                listed = [(de.name, _is_dir(de)) for de in it]
        except OSError as exc:
            f.blocked = True
            self.out.errors.append(f"{f.label}: {exc.strerror or exc}")
            return []
        subdirs = []
        for n, is_dir in listed:
            if is_dir is None:
                f.blocked = True
                self.out.errors.append(f"{f.label}/{n}: cannot tell its type")
            elif is_dir:
                subdirs.append(n)
            else:
                done = _unlink(f.fd, n, f"{f.label}/{n}", self.writable, self.out)
                if done is None:
                    subdirs.append(n)
                elif not done:
                    f.blocked = True
        subdirs.reverse()
        return subdirs

    def _descend(self, f: _Frame, name: str) -> None:
        assert f.fd is not None
        label = f"{f.label}/{name}"
        try:
            fd = _open_child(f.fd, name, self.writable)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced by a link or a file: unlink that
                if not _unlink(f.fd, name, label, self.writable, self.out):
                    f.blocked = True  # (None: a directory again; its parent's rmdir reports it)
                return
            f.blocked = True
            if exc.errno == errno.EXDEV:
                self.out.mounts.append(label)
            else:
                self.out.errors.append(f"{label}: {exc.strerror or exc}")
            return
        st = os.fstat(fd)
        if st.st_dev != self.dev:
            os.close(fd)
            f.blocked = True
            self.out.mounts.append(label)
            return
        self.stack.append(_Frame(fd, name, st.st_ino, label))
        if len(self.stack) > _OPEN_WINDOW + 1:  # keep the top and the deepest levels open
            old = self.stack[-_OPEN_WINDOW - 1]
            if old.fd is not None and old is not self.stack[0]:
                os.close(old.fd)
                old.fd = None

    def _ascend(self) -> bool:
        """The deepest directory is empty (or blocked): rmdir it from its parent. False to stop."""
        f = self.stack.pop()
        assert f.fd is not None
        if self.stack:
            p = self.stack[-1]
            if p.fd is None and not self._reopen(f, p):
                os.close(f.fd)
                return False
            parent_fd: int = p.fd  # type: ignore[assignment]  # reopened above when it was closed
        else:
            parent_fd = self.parent_fd
        os.close(f.fd)
        f.fd = None
        if f.blocked:
            if self.stack:
                self.stack[-1].blocked = True
            return True
        for attempt in (0, 1):
            try:
                os.rmdir(f.name, dir_fd=parent_fd)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if attempt == 0 and self.writable and exc.errno in (errno.EACCES, errno.EPERM) \
                        and make_writable(parent_fd):
                    continue
                if self.stack:
                    self.stack[-1].blocked = True
                self.out.errors.append(f"{f.label}: {exc.strerror or exc}")
                break
        return True

    def _reopen(self, child: _Frame, p: _Frame) -> bool:
        """Reopen `p` as `..` of its child; it must be the directory entered before."""
        assert child.fd is not None
        try:
            fd = os.open("..", _DIR, dir_fd=child.fd)
        except OSError as exc:
            self.out.errors.append(f"{p.label}: cannot reopen: {exc.strerror or exc}")
            return False
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (self.dev, p.ino):
            os.close(fd)
            self.out.errors.append(f"{p.label}: moved during the removal; stopped")
            return False
        p.fd = fd
        return True


# ---- mount points --------------------------------------------------------------------------------
def mount_points_under(path: str) -> list[str]:
    """Mount points at or below `path` (a real path), from /proc/self/mountinfo; [] if unknown."""
    base = os.path.join(path, "")
    return [m.point for m in table() if m.point == path or m.point.startswith(base)]


def open_under(root: str | os.PathLike, relpath: str) -> int:
    """A descriptor for the directory `relpath` under `root`, opened one component at a time without
    following a symlink (ELOOP/ENOTDIR when one is on the way). The root itself may be a link."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in relpath.split("/") if p]:
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_under(root: str | os.PathLike, relpath: str, writable: bool = True) -> TreeRemoval:
    """Remove `relpath` (a file, link or tree) under `root`, reached without following links."""
    head, _, name = relpath.rpartition("/")
    try:
        fd = open_under(root, head)
    except FileNotFoundError:
        return TreeRemoval()
    except OSError as exc:
        return TreeRemoval(False, [], [f"{head or root}: {exc.strerror or exc}"])
    try:
        return remove_tree(fd, name, label=relpath, writable=writable)
    finally:
        os.close(fd)


def remove_held_file(dir_fd: int, name: str, seen: os.stat_result) -> None:
    """Unlink the file `name` in `dir_fd` only while it is still the file `seen` (its lstat when it was
    judged removable): it is renamed aside first (fswrite.rename_held, which moves a stranger back),
    then unlinked under the new name, so a file created at `name` meanwhile is never the one removed."""
    if not stat.S_ISREG(seen.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", name)
    aside = fswrite.temp_name(".kcache-stale-")
    fswrite.rename_held(dir_fd, name, dir_fd, aside, seen)
    now = os.stat(aside, dir_fd=dir_fd, follow_symlinks=False)
    if now.st_mtime_ns != seen.st_mtime_ns:  # a new file that reuses the inode number: put back
        fswrite.rename_noreplace_at(dir_fd, aside, dir_fd, name)
        raise OSError(errno.ESTALE, "replaced by a new file meanwhile", name)
    os.unlink(aside, dir_fd=dir_fd)
