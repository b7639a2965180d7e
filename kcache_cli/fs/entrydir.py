"""An entry's directory held open: the handle a judgement reads through (`EntryDir`), opened from the
cache root the caller holds (`fsread.Anchor`).

A judgement is handed one `EntryDir` and reads every file of the entry through it, by name: one fd of
the directory, opened once from the anchored root without following any link on the way (a directory
of the cache swapped for a link mid-run makes the open fail, and `swapped` says so), the lstat of
each file a scan listed (`listing`: a read then skips its own stat), and files in subdirectories
opened beneath it, no link followed. Nothing is looked up in module or per-thread state: what the
judgement reads is what it was handed. A caller that read the files already (export) hands their bytes
too (`held`): a read of a file that is still the one they came from (inode, size, mtime) takes them; and
the listing it read them by (`listed`), which the judgement then goes by instead of listing again.
A scan that walked the whole tree already (a vLLM unit) hands that walk (`Walk`, `share_walk`): every
directory beneath then answers its listings and lstats from it, and is only opened to read a file.

Light on purpose (os, stat, errno, fsread): the scan opens one per entry."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from kcache_cli.fs import read as fsread
from kcache_cli.fs import readmarks
from kcache_cli.fs.read import DIR_FLAGS, RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS, Anchor, TooLarge
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:
    import hashlib
else:  # its first use loads it: _hashlib's OpenSSL costs 2.3 ms of every start, a digest is rare
    hashlib = lazy_module("hashlib")


class Walk(NamedTuple):
    """One walk of a directory tree, no link followed: every directory listed whole (a part that could not
    be listed is absent) by its path relative to `top` ("" the top), each holding every name directly in
    it with its lstat."""

    top: str
    dirs: dict[str, dict[str, os.stat_result]]


class EntryDir:
    """One directory of an entry, held open for the reads that judge it. Names given to its methods
    are relative to it ('/'-separated; no component is followed when it is a link). Where the
    directory cannot be opened, `fd` is None and every read raises why (`error`)."""

    __slots__ = ("path", "fd", "listing", "anchor", "error", "held", "held_changed", "derived", "_refused",
                 "_listed", "walk", "at")

    def __init__(self, path: str, fd: int | None, anchor: Anchor | None = None,
                 error: OSError | None = None) -> None:
        self.path = path
        self.fd = fd
        self.anchor = anchor
        self.error = error
        self.listing: dict[str, os.stat_result] = {}  # name -> lstat, as a scan of it saw each file
        # name -> (inode, size, mtime_ns, bytes) of files a caller read through `fd` already (export): a
        # read of one that is still that file takes these bytes, so what is judged is what was read
        self.held: dict[str, tuple[int, int, int, bytes]] | None = None
        self.held_changed = False  # a read found a held file changed since (the caller's bytes are not its)
        # (what, name) -> what a judgement made of the file's bytes while the directory is held: the index's
        # key and the verdict then go by one read of it (inductor.graph_keys)
        self.derived: dict[tuple[str, str], Any] = {}
        self._refused = anchor.refused if anchor is not None else 0
        self._listed = False  # `listing` is the whole directory but its subdirectories (listed())
        self.walk: Walk | None = None  # a walk of a tree holding it (share_walk), and its place in it
        self.at = ""

    @classmethod
    def open(cls, path: str | os.PathLike, anchor: Anchor | None = None, *, follow: bool = False) -> EntryDir:
        """The directory `path`, opened from `anchor` (no link between the root and it is followed)
        when it lies below it, else without following its last component. `follow`: opened as a compiler
        that follows links opens it (a tilus script's program, reached through the script's link)."""
        path = fsread.absolute(os.fspath(path))
        before = anchor.refused if anchor is not None else 0
        try:
            if follow:  # from the root held open when it lies below it: the root's path is not resolved again
                if anchor is not None and anchor.holds(path):
                    fd = os.open(anchor.rel(path), DIR_FLAGS & ~os.O_NOFOLLOW, dir_fd=anchor.fd)
                else:
                    fd = fsread.open_path(path, DIR_FLAGS & ~os.O_NOFOLLOW)
            elif anchor is not None and anchor.holds(path):
                fd = anchor.open_dir(path)
            else:
                fd = fsread.open_path(path, DIR_FLAGS)
            d = cls(path, fd, anchor)
        except OSError as exc:
            d = cls(path, None, anchor, exc)
        d._refused = before  # a refusal opening it is a swap seen during its judgement
        return d

    def __enter__(self) -> EntryDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            if self.listing:
                readmarks.note(self.fd, self.listing)  # another user's atimes our reads moved
            os.close(self.fd)
        self.fd = None

    @property
    def swapped(self) -> bool:
        """Whether a read through the anchor was refused since this was opened because a directory on
        the way had become a link: the judgement saw the cache being swapped, and concludes nothing."""
        return self.anchor is not None and self.anchor.refused != self._refused

    def join(self, name: str) -> str:
        """The path of `name` in this directory (for messages and for callers that need a path)."""
        return f"{self.path}/{name}" if name else self.path

    def _dir(self) -> int:
        if self.fd is None:
            raise (self.error or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.path)
                   ).with_traceback(None)  # the open's own error, its `kind` with it (NotRegularFile)
        return self.fd

    def _parent(self, name: str) -> tuple[int, str, bool]:
        """(the fd of the directory holding `name`, its last component, whether the fd is the caller's to
        close): a name with directories in it is opened beneath this one, no link followed."""
        fd = self._dir()
        head, _, last = name.rpartition("/")
        if not head:
            return fd, last, False
        if last in ("", ".", "..") or ".." in head.split("/"):
            raise fsread.refuse(self.join(name), "outside its entry")
        try:
            sub = fsread.openat2(fd, head, DIR_FLAGS, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                raise fsread.refuse(self.join(name), f"{head}/ holds a symlink or a non-directory") from None
            raise
        return (sub if sub is not None else fsread.dir_beneath_fd(fd, self.path, head)), last, True

    # ---- directories -------------------------------------------------------------------------------

    def sub(self, name: str) -> EntryDir:
        """The subdirectory `name`, held open beneath this one (no link followed); fd None when it
        cannot be opened (reads through it raise why)."""
        try:
            fd = self._dir()
            new = fsread.openat2(fd, name, DIR_FLAGS, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
            if new is None:
                new = fsread.dir_beneath_fd(fd, self.path, name)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                exc = fsread.refuse(self.join(name), "a symlink or not a directory")
            return EntryDir(self.join(name), None, self.anchor, exc)
        d = EntryDir(self.join(name), new, self.anchor)
        if self.walk is not None:
            d.share_walk(self.walk)
        if self.held:
            cut = len(name) + 1
            d.held = {k[cut:]: v for k, v in self.held.items() if k.startswith(name + "/")}
        return d

    def listed(self, stats: dict[str, os.stat_result]) -> None:
        """What the caller listed through its fd (export, which reads every file once): the lstat of each
        name directly in it but its subdirectories (a file's, the fstat of what it read). `files` and
        `lstat` answer from it, so that the judgement goes by the listing the bytes came with."""
        self.listing = stats
        self._listed = True

    def share_walk(self, walk: Walk | None) -> None:
        """Answer listings and lstats from `walk` when it walked this directory (by path; held open)."""
        if walk is None or self.fd is None:
            return
        if self.path == walk.top:
            at = ""
        elif self.path.startswith(walk.top + "/"):
            at = self.path[len(walk.top) + 1:]
        else:
            return
        if at in walk.dirs:
            self.walk, self.at = walk, at

    def walked(self) -> dict[str, os.stat_result] | None:
        """Every name directly in it with its lstat, as the walk it shares saw them (share_walk), or None."""
        return self.walk.dirs.get(self.at) if self.walk is not None else None

    def _walked_at(self, name: str) -> dict[str, os.stat_result] | None:
        """walked() of its subdirectory `name` ("": itself), or None (no walk shared, or not a directory
        the walk listed: a name through `..` or a link never is)."""
        if self.walk is None:
            return None
        return self.walk.dirs.get(f"{self.at}/{name}" if self.at and name else name or self.at)

    def files(self) -> tuple[dict[str, int], dict[str, float]]:
        """The sizes and mtimes of the files (not subdirectories) directly in it, listed through its fd
        (or as the caller listed it: `listed`); each lstat kept in `listing`. OSError when it cannot be
        listed."""
        walked = self.walked()
        if walked is not None:
            self.listing.update((n, st) for n, st in walked.items() if not stat.S_ISDIR(st.st_mode))
        if self._listed or walked is not None:
            return ({n: st.st_size for n, st in self.listing.items()},
                    {n: st.st_mtime for n, st in self.listing.items()})
        sizes: dict[str, int] = {}
        mtimes: dict[str, float] = {}
        with os.scandir(self._dir()) as it:
            for de in it:
                try:
                    if de.is_dir(follow_symlinks=False):
                        continue
                    st = de.stat(follow_symlinks=False)
                except OSError:
                    continue
                self.listing[de.name] = st
                sizes[de.name] = st.st_size
                mtimes[de.name] = st.st_mtime
        return sizes, mtimes

    def subdirs(self, name: str = "") -> list[str]:
        """The names of its subdirectories (or of its subdirectory `name`'s), sorted (a link is not one);
        [] when it cannot be listed."""
        walked = self._walked_at(name)
        if walked is not None:
            return sorted(n for n, st in walked.items() if stat.S_ISDIR(st.st_mode))
        if name:
            with self.sub(name) as d:
                return d.subdirs()
        try:
            with os.scandir(self._dir()) as it:
                return sorted(de.name for de in it if de.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def own_lstat(self) -> os.stat_result:
        """The directory's own lstat: of the fd held, else asked of its parent beneath the anchor (no link
        on the way followed; a mode-000 directory a user cannot open still has a mode). OSError when it
        is not there."""
        if self.fd is not None:
            return os.fstat(self.fd)
        if self.anchor is None or not self.anchor.holds(self.path):
            return os.lstat(self.path)
        fd, name = self.anchor.dir_of(self.path)
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        """Every name directly in it; [] when it cannot be listed."""
        walked = self.walked()
        if walked is not None:
            return list(walked)
        try:
            return os.listdir(self._dir())
        except OSError:
            return []

    def walk_files(self) -> Iterator[tuple[str, os.stat_result, str | None]]:
        """fsread.walk_files of this directory, from its fd."""
        return fsread.walk_fd(self._dir(), self.path)

    # ---- one file ----------------------------------------------------------------------------------

    def lstat(self, name: str) -> os.stat_result:
        """The file's lstat: as a scan listed it or the walk shared saw it (a name the walk did not see in a
        directory it listed is not there), else asked now (a link is not followed)."""
        st = self.listing.get(name)
        if st is not None:
            return st
        if self.walk is not None:
            head, _, last = name.rpartition("/")
            walked = self._walked_at(head)
            if walked is not None and last not in ("", ".", ".."):
                st = walked.get(last)
                if st is None:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.join(name))
                return st
        fd, last, own = self._parent(name)
        try:
            return os.stat(last, dir_fd=fd, follow_symlinks=False)
        finally:
            if own:
                os.close(fd)

    def stat(self, name: str) -> os.stat_result:
        """The file's stat as a compiler that follows links meets it: every link in `name` (the file, or a
        directory of it inside the entry) followed, from this directory (never a swapped parent)."""
        return os.stat(name, dir_fd=self._dir())

    def access(self, name: str, mode: int = os.R_OK) -> bool:
        """os.access of `name` from this directory, links followed as by stat()."""
        return os.access(name, mode, dir_fd=self._dir())

    def readlink(self, name: str) -> str:
        fd, last, own = self._parent(name)
        try:
            return os.readlink(last, dir_fd=fd)
        finally:
            if own:
                os.close(fd)

    def open_file(self, name: str, *, follow: bool = False, shown: str = "") -> tuple[int, os.stat_result]:
        """(fd, fstat) of the regular file `name` (fsread.open_regular's rules). `follow`: every link in
        `name` is followed as the compiler follows it, from this directory (never a swapped parent); the
        file reached must still be regular. `shown`: its path for messages, when the caller has it."""
        shown = shown or self.join(name)
        if follow:
            return fsread.open_file(name, self._dir(), True, shown)
        fd, last, own = self._parent(name)
        try:
            pre = None if own else self.listing.get(last)
            return fsread.open_file(last, fd, follow, shown, pre)
        finally:
            if own:
                os.close(fd)

    def _held_bytes(self, name: str) -> bytes | None:
        """The bytes held for `name` when it is still the file they were read from (same inode, size and
        mtime, as its lstat now or the scan's shows it), else None (read it again; `held_changed` says so)."""
        got = self.held.get(name) if self.held else None
        if got is None:
            return None
        try:
            st = self.lstat(name)
        except OSError:
            self.held_changed = True
            return None
        if (st.st_ino, st.st_size, st.st_mtime_ns) != got[:3] or not stat.S_ISREG(st.st_mode):
            self.held_changed = True
            return None
        return got[3]

    def read_bytes(self, name: str, limit: int, *, strict: bool = True, follow: bool = False) -> bytes:
        """fsread.read_bytes of the file `name` (held bytes when it has them: `held`). A file of this
        directory as it was listed (or walked) is read the short way (fsread.read_listed, no link followed)
        when it still is that file, `follow` or not where the listing shows a regular file."""
        data = None if follow else self._held_bytes(name)
        if data is not None:
            if strict and len(data) > limit:
                raise TooLarge(errno.EFBIG, f"over {limit} bytes ({len(data)}), not read", self.join(name))
            return data[:limit]
        listed = None if "/" in name else self.listing.get(name) or (self.walked() or {}).get(name)
        if listed is not None and self.fd is not None:
            data = fsread.read_listed(self.fd, name, listed, limit, head=not strict)
            if data is not None:
                return data
        shown = self.join(name)
        fd, st = self.open_file(name, follow=follow, shown=shown)
        return fsread.read_open(fd, st, limit, strict, shown)

    def read_head(self, name: str, n: int = 64) -> bytes:
        """Up to `n` first bytes; b"" when the file cannot be read."""
        try:
            return self.read_bytes(name, n, strict=False)
        except OSError:
            return b""

    def read_text(self, name: str, limit: int = fsread.MAX_TEXT) -> str | None:
        """The file's text (cut at `limit` bytes, decoded with replacement), or None when it cannot be read."""
        try:
            return self.read_bytes(name, limit, strict=False).decode("utf-8", "replace")
        except OSError:
            return None

    def iter_chunks(self, name: str, chunk: int = fsread.CHUNK, *, follow: bool = False) -> Iterator[bytes]:
        """The file's bytes in chunks of at most `chunk` (`follow` as for open_file; held bytes as for
        read_bytes)."""
        data = None if follow else self._held_bytes(name)
        if data is not None:
            return (data[i:i + chunk] for i in range(0, len(data), chunk))
        fd, _ = self.open_file(name, follow=follow)
        return fsread.chunks_of(fd, chunk)

    def sha256(self, name: str, *, follow: bool = False) -> str:
        """The sha256 of the file's bytes, streamed (`follow` as for open_file)."""
        h = hashlib.sha256()
        for data in self.iter_chunks(name, follow=follow):
            h.update(data)
        return h.hexdigest()

    def load_json(self, name: str, limit: int = fsread.MAX_JSON) -> Any:
        """fsread.load_json of the file `name`."""
        return fsread.parse_json(self.read_bytes(name, limit), name.rpartition("/")[2])

    def json_object(self, name: str, limit: int = fsread.MAX_JSON) -> dict | None:
        """fsread.json_object of the file `name`: the object, or None for anything else."""
        try:
            data = self.load_json(name, limit)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def json_problem(self, name: str, limit: int = fsread.MAX_JSON) -> tuple[Any, str | None]:
        """fsread.json_problem of the file `name`: (value, None) or (None, a reason naming it)."""
        try:
            return self.load_json(name, limit), None
        except ValueError as exc:
            return None, fsread.json_reason(name.rpartition("/")[2], exc)
        except OSError as exc:
            return None, fsread.json_reason(name.rpartition("/")[2], exc)

    def unreadable(self, name: str) -> str | None:
        """Why the file cannot be read by the people using the cache, or None (checks.unreadable's rule:
        a regular file nobody may read counts as unreadable whoever runs kcache; a missing one is None)."""
        try:
            st = self.listing.get(name) or self.stat(name)
        except OSError:
            return None
        shown = name.rpartition("/")[2]
        if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o444:
            return f"{shown} is unreadable (mode {stat.S_IMODE(st.st_mode):03o}: permission denied)"
        if stat.S_ISREG(st.st_mode) and st.st_uid == fsread.EUID and st.st_mode & 0o400:
            return None  # the owner reads by its mode bits alone (an ACL never narrows the owner's)
        try:
            readable = self.access(name)
        except OSError:
            return None
        return None if readable else f"{shown} is unreadable (permission denied)"


__all__ = ["Anchor", "EntryDir", "TooLarge", "Walk"]
