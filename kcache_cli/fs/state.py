"""kcache's own bookkeeping inside a cache root: `.kcache/` (locks, trash, last-used stamps)
and the temp directories of builds in flight."""

from __future__ import annotations

import errno
import os
import re
import shlex
import stat
import time
from pathlib import Path
from typing import NamedTuple

from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite

STATE_DIR = ".kcache"
INDEX_DIR = "index"  # .kcache/index/: the scan index
# A build compiles into <op dir>/.kcache-tmp-<hash>-<random>/ and renames it to <hash>/.
TEMP_PREFIX = ".kcache-tmp-"
STAMP_REFRESH = 3600.0  # a last-used stamp is rewritten at most once an hour


def state_dir(root: Path) -> Path:
    return Path(root) / STATE_DIR


def locks_dir(root: Path) -> Path:
    return state_dir(root) / "locks"


def trash_dir(root: Path) -> Path:
    return state_dir(root) / "trash"


def used_dir(root: Path) -> Path:
    return state_dir(root) / "used"


def stamp_name(relpath: str) -> str:
    return relpath.replace("%", "%25").replace("/", "%2F")


def relpath_of_stamp(name: str) -> str:
    return name.replace("%2F", "/").replace("%25", "%")


def lock_path(root: Path, relpath: str) -> Path:
    """The lock of one entry: outside the entry, so publishing and deleting never touch it."""
    return locks_dir(root) / (stamp_name(relpath) + ".lock")


def temp_hash(name: str) -> str | None:
    """The hash a kcache temp directory is building, from its name, or None."""
    if not name.startswith(TEMP_PREFIX):
        return None
    return name[len(TEMP_PREFIX):].split("-", 1)[0] or None


def load_last_used(root: Path) -> dict[str, float]:
    """relpath -> last-used time, from the stamps kcache leaves when it resolves or builds an entry
    (read through .kcache/used opened beneath the root, no link followed; an untrusted one is skipped)."""
    out: dict[str, float] = {}
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return out
    try:
        ufd = open_state(rfd, root, "used")
    except OSError:
        return out
    finally:
        os.close(rfd)
    try:
        names = os.listdir(ufd)
        for name in names:
            try:
                out[relpath_of_stamp(name)] = os.stat(name, dir_fd=ufd, follow_symlinks=False).st_mtime
            except OSError:
                pass
    except OSError:
        pass
    finally:
        os.close(ufd)
    return out


def mark_used(root: Path, relpath: str, now: float | None = None) -> str | None:
    """Refresh an entry's last-used stamp, at most once an hour; never fails the caller. Written through
    descriptors held from the root (fswrite): a .kcache/, used/ or stamp swapped for a link, or a stamp
    that is another user's or a hard link, never makes kcache create or re-time a file elsewhere.
    Returns why the use could not be noted when permissions stopped it (a group-shared cache whose
    used/ another member made closed to the group), else None."""
    now = time.time() if now is None else now
    name = stamp_name(relpath)
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return None
    ufd = None
    try:
        ufd = open_state(rfd, root, "used", create=True)
        try:
            if now - os.stat(name, dir_fd=ufd, follow_symlinks=False).st_mtime < STAMP_REFRESH:
                return None
        except OSError:
            pass
        ns = int(now * 1e9)
        shared = shared_group(rfd)
        fswrite.touch_at(ufd, name, (ns, ns), mode=0o664 if shared is not None else 0o644, group=shared)
    except OSError as exc:  # a read-only or untrusted state dir: last use falls back to mtime
        if exc.errno in (errno.EACCES, errno.EPERM) and not isinstance(exc, UntrustedState) \
                and shared_group(rfd) is not None:  # a group cache a member made closed: say so
            where = exc.filename if isinstance(exc.filename, str) and os.path.isabs(exc.filename) else \
                os.path.join(root, STATE_DIR, "used")  # (the stamp's temp file: a name in used/)
            return (f"cannot note this use in {where} ({exc.strerror}): a prune by age or size may take "
                    f"{relpath} for unused; fix: the directory's owner or root runs `chmod g+ws {where}`, or "
                    "root's next kcache prune or clear of this cache makes it the group's")
    finally:
        os.close(rfd)
        if ufd is not None:
            os.close(ufd)
    return None


def note_uses(root: Path, uses: dict[str, float]) -> None:
    """mark_used for many entries at once, each at the time given (an import's restored last uses): a stamp
    only ever moves forward (a newer one stays), and at once, not once an hour. Never fails the caller:
    where the state cannot be written, last use falls back to the entries' times."""
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return
    ufd = None
    try:
        ufd = open_state(rfd, root, "used", create=True)
        shared = shared_group(rfd)
        for relpath, when in uses.items():
            name = stamp_name(relpath)
            try:
                if os.stat(name, dir_fd=ufd, follow_symlinks=False).st_mtime >= when:
                    continue
            except OSError:
                pass
            ns = int(when * 1e9)
            fswrite.touch_at(ufd, name, (ns, ns), mode=0o664 if shared is not None else 0o644, group=shared)
    except OSError:
        pass
    finally:
        os.close(rfd)
        if ufd is not None:
            os.close(ufd)


# ---- who may own kcache's state (shared caches) -------------------------------------------------
SAFE_ENV = "KCACHE_SAFE_DIRECTORY"  # roots whose state dir kcache trusts whoever owns it (':'-separated, or '*')


class UntrustedState(OSError):
    """.kcache/ (or a directory in it) is not a directory kcache may trust: the message says how to opt in."""


def trusted_root(root: str | os.PathLike) -> bool:
    """Whether KCACHE_SAFE_DIRECTORY lists `root`: kcache uses it (and its state) whoever owns it."""
    wanted = os.environ.get(SAFE_ENV, "")
    if not wanted:
        return False
    real = os.path.realpath(root)
    return any(w == "*" or (w and os.path.realpath(w) == real) for w in wanted.split(":"))


def open_state(root_fd: int, root: str | os.PathLike, sub: str = "", *, create: bool = False) -> int:
    """A descriptor of <root>/.kcache (or .kcache/<sub>) opened beneath the root's `root_fd`, no link
    followed, each level checked for its owner (fswrite.owner_problem: yours, root's, or group-shared
    with the root's group) unless the root is listed in KCACHE_SAFE_DIRECTORY. Run as root in another
    user's cache, a level root owns is given to that user (fswrite.give_back_state). UntrustedState when
    it may not be used, with a one-line reason; other OSErrors as the open raised them."""
    rst = os.fstat(root_fd)
    shared = fswrite.group_shared(rst)
    trusted = trusted_root(root)
    where = os.path.join(root, STATE_DIR)
    made = create and not fswrite.lexists_at(root_fd, STATE_DIR)
    fd = _open_level(root_fd, STATE_DIR, where, create)
    try:
        for level in [""] + [p for p in sub.split("/") if p]:
            if level:
                nxt = _open_level(fd, level, f"{where}/{level}", create)
                os.close(fd)
                fd, where = nxt, f"{where}/{level}"
            why = None if trusted else state_problem(os.fstat(fd), rst, where, root)
            if why:
                raise UntrustedState(errno.EPERM, why, where)
            if create and shared:
                fswrite.share_with_group(fd, rst.st_gid)  # one this user made (now or earlier) the group can use
            fswrite.give_back_state(fd, rst)  # root's, in a user's cache: the user's again
            if made and not level:
                write_gitignore(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


GITIGNORE = ".gitignore"
_GITIGNORE_TEXT = b"# Created by kcache: its own state (locks, trash, stamps, index), never to commit.\n*\n"


def write_gitignore(state_fd: int) -> None:
    """.kcache/.gitignore holding `*`, written when kcache makes its .kcache/ (as pytest, ruff and mypy do for
    their caches): a cache root inside a git work tree (`--cache-dir .`) shows nothing of kcache's in `git
    status`. Never through a link, never over a file there (one the user wrote stays); in a group-shared
    .kcache/ the group's, as all kcache makes there; never fails (the state works without it)."""
    try:
        fd = fswrite.create_excl(state_fd, GITIGNORE)
    except OSError:
        return
    try:
        fswrite.write_all(fd, _GITIGNORE_TEXT)
        fswrite.share_like_dir(fd, state_fd)
    except OSError:
        fswrite.unlink_at(state_fd, GITIGNORE)
    finally:
        os.close(fd)


def remove_made_state(root_fd: int) -> None:
    """rmdir the .kcache/ a failed command made, with the .gitignore it wrote there; one holding anything
    else stays."""
    try:
        fd = fswrite.open_dir(root_fd, STATE_DIR)
    except OSError:
        return
    try:
        if set(os.listdir(fd)) <= {GITIGNORE}:
            fswrite.unlink_at(fd, GITIGNORE)
    except OSError:
        pass
    finally:
        os.close(fd)
    fswrite.rmdir_at(root_fd, STATE_DIR)


def state_problem(st: os.stat_result, rst: os.stat_result, where: str, root: str | os.PathLike) -> str | None:
    """Why the directory of kcache's state at `where` (its fstat `st`) may not be used in the cache whose
    root's fstat is `rst`, as the one line to say, or None (fswrite.owner_problem: yours, root's, the root
    owner's, or, in a group-shared root only, its group's). The line says the two ways out (a member's
    directory of their own group in a group-shared cache blocks every prune until one is taken). The
    caller asks trusted_root first."""
    why = fswrite.owner_problem(st, where, group=rst.st_gid if fswrite.group_shared(rst) else None,
                                owner=rst.st_uid)
    if why is None:
        return None
    return (f"{why}: kcache leaves it alone (move it aside, e.g. `mv {shlex.quote(where)} "
            f"{shlex.quote(where + '.untrusted')}`, and kcache makes its own; or, to trust it, set "
            f"{SAFE_ENV}={os.path.realpath(root)})")


def shared_group(root_fd: int) -> int | None:
    """The group of a group-shared root (setgid, group-writable), or None for any other root."""
    st = os.fstat(root_fd)
    return st.st_gid if fswrite.group_shared(st) else None


def _open_level(dir_fd: int, name: str, where: str, create: bool) -> int:
    """One directory of the state, its errors naming its whole path `where`."""
    try:
        return fswrite.open_dir(dir_fd, name, create=create)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, where) from None


INDEX_KINDS = ("scan", "texts", "names")  # the index's files (catalog/index.py, fs/dirnames.py)


def index_name(kind: str = "scan") -> str:
    """This user's file of the scan index (`kind` "scan" or "texts") in .kcache/index/: each user keeps
    their own (kcache_cli/catalog/index.py)."""
    return f"{kind}.{os.geteuid()}"


def open_index_dir(root: str, create: bool) -> int | None:
    """A descriptor of the directory that holds this user's index files: <root>/.kcache/index, opened
    beneath the root without following a link, each level owned as open_state requires; in a group-shared
    root, this user's own directory in it (_own_index_dir). None: no index is read or written there."""
    got = _index_dir(root, create)
    return got[0] if got is not None else None


def _index_dir(root: str, create: bool) -> tuple[int, str] | None:
    """open_index_dir's descriptor, and its path relative to the root."""
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return None
    try:
        fd = open_state(rfd, root, INDEX_DIR, create=create)
        shared = fswrite.group_shared(os.fstat(rfd))
    except OSError:
        return None
    finally:
        os.close(rfd)
    if not shared:
        return fd, os.path.join(STATE_DIR, INDEX_DIR)
    try:
        return _own_index_dir(fd, create), os.path.join(STATE_DIR, INDEX_DIR, str(os.geteuid()))
    except OSError:
        return None
    finally:
        os.close(fd)


def _own_index_dir(index_fd: int, create: bool) -> int:
    """This user's directory in a group-shared .kcache/index/ (named by the euid, made 0700: never shared
    nor given away, and the names an index holds, of other members' private entries too, are its user's
    to read), which no one else may write. Every member may rename into .kcache/index/ itself, a file of
    root's too (one root's import or build made of a member's bytes): read_index_file's owner check cannot
    tell that from root's own index. OSError when it is not this user's alone. Made, it takes the place
    of this user's files an older kcache left in .kcache/index/ itself (never read there again)."""
    name = str(os.geteuid())
    if create and fswrite.mkdir_at(index_fd, name, 0o700, exist_ok=True):
        _drop_own_files(index_fd)
    fd = os.open(name, fsread.DIR_FLAGS, dir_fd=index_fd)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(errno.EPERM, "not this user's own directory", name)
    return fd


def _drop_own_files(index_fd: int) -> None:
    """Unlink this user's own index files (regular files of theirs) from the directory `index_fd`."""
    for kind in INDEX_KINDS:
        try:
            st = os.stat(index_name(kind), dir_fd=index_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                fswrite.unlink_at(index_fd, index_name(kind))
        except OSError:
            continue


def odd_index_files(root: str) -> list[tuple[str, bool]]:
    """The index files of `root` (this user's) that are there but not regular files: a FIFO, device,
    socket, directory or link planted where kcache keeps its state, each with whether it was removed
    now. They are never opened for reading (the index skips them); what is not a directory is unlinked
    (the name alone, this user's own index name), so that the scan warns once, not at every command of
    a cache too small to keep an index over it (a cron job's nightly mail)."""
    got = _index_dir(root, create=False)
    if got is None:
        return []
    dfd, rel = got
    odd = []
    try:
        for kind in INDEX_KINDS:
            try:
                st = os.stat(index_name(kind), dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                path = os.path.join(root, rel, index_name(kind))
                odd.append((path, not stat.S_ISDIR(st.st_mode) and _unlinked(dfd, index_name(kind))))
    finally:
        os.close(dfd)
    return odd


def _unlinked(dir_fd: int, name: str) -> bool:
    """Whether the file or link `name` was unlinked from `dir_fd` (not when this user may not)."""
    try:
        return fswrite.unlink_at(dir_fd, name)
    except OSError:
        return False


# An index file is opened without blocking (a FIFO planted there must not hang every command), never
# through a link, never as a controlling terminal; it must then be a regular file (fstat).
_INDEX_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_STALE_TEMP = 3600.0  # temp files of killed index writers are removed after an hour


def read_index_file(root: str, kind: str, limit: int) -> bytes | None:
    """This user's index file `kind` of `root` (index_name), read whole; None when it is missing, not a
    regular file, not this user's, writable by others or over `limit` bytes."""
    dfd = open_index_dir(root, create=False)
    if dfd is None:
        return None
    try:
        fd = os.open(index_name(kind), _INDEX_READ_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022
                or st.st_size > limit):
            return None
        # One read of the size fstat saw, and one more that finds the end: no 16 MiB buffer asked for each
        # read, no join copying a 26 MB index (half its read time). A file that grew is read on.
        chunks = [os.read(fd, st.st_size + 1)]
        got = len(chunks[0])
        while chunks[-1] and got <= limit:
            chunks.append(os.read(fd, max(st.st_size, 1 << 16)))
            got += len(chunks[-1])
    except OSError:
        return None
    finally:
        os.close(fd)
    if got > limit:
        return None
    return chunks[0] if len(chunks) <= 2 and not chunks[-1] else b"".join(chunks)


def start_index_write(root: str) -> tuple[int, int, str, int] | None:
    """A new temp file in <root>/.kcache/index/ for an index file to be written through: (the index
    directory's fd, the temp file's fd, its name, its ctime in ns: the file system's own "now"). None when
    the cache is not writable."""
    dfd = open_index_dir(root, create=True)
    if dfd is None:
        return None
    tmp = f".tmp-{os.getpid()}-{fswrite.token(4)}"
    try:
        # Never shared with the group nor given away (share_like_dir): read_index_file trusts only the
        # reader's own file that no one else may write, in a group-shared cache too.
        fd = fswrite.create_excl(dfd, tmp, 0o644)
        try:
            now = os.fstat(fd).st_ctime_ns
        except OSError:
            os.close(fd)
            raise
    except OSError:
        os.close(dfd)
        return None
    return dfd, fd, tmp, now  # the temp file stays open: finish_index_write writes through this fd


def finish_index_write(dfd: int, fd: int, tmp: str, data: bytes | None, kind: str) -> None:
    """Write `data` (None: nothing) through the temp file `fd` of start_index_write, never reopened by its
    name `tmp` (whoever may write the index directory can swap that name for a link to another file), and
    rename it over this user's `kind` file (readers see the old file or the new one), then close `fd` and
    `dfd`. The temp file never stays; never raises."""
    try:
        if data is not None:
            fswrite.write_all(fd, data)
            fswrite.rename_at(dfd, tmp, dfd, index_name(kind))
            tmp = ""
            _remove_stale_temps(dfd)
    except OSError:
        pass
    finally:
        os.close(fd)
        if tmp:
            try:
                fswrite.unlink_at(dfd, tmp)
            except OSError:
                pass
        os.close(dfd)


def _remove_stale_temps(dfd: int) -> None:
    """Temp files of index writers killed an hour ago or more (a live writer renames or removes its own)."""
    limit = time.time() - _STALE_TEMP
    try:
        names = [n for n in os.listdir(dfd) if n.startswith(".tmp-")]
    except OSError:
        return
    for name in names:
        try:
            if os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime < limit:
                fswrite.unlink_at(dfd, name)
        except OSError:
            pass


def read_own_file(root: Path, name: str, limit: int) -> bytes | None:
    """The bytes of .kcache/`name`, a file kcache keeps for itself, or None when it is missing, too big,
    not a regular file, in an untrusted state dir, or not this user's (nor root's): another member's
    file is not trusted, and this user's next write replaces it."""
    return _read_state_file(root, name, limit)


def _read_state_file(root: str | os.PathLike, name: str, limit: int) -> bytes | None:
    """.kcache/`name` read through the root's and the state dir's fds, if it is this user's or root's and at
    most `limit` bytes; else None."""
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return None
    try:
        sfd = open_state(rfd, root)
    except OSError:
        return None
    finally:
        os.close(rfd)
    try:
        got = _read_trusted(sfd, name, limit, None, False)
    finally:
        os.close(sfd)
    return got[0] if got is not None else None


def _read_trusted(sfd: int, name: str, limit: int, group: int | None,
                  shared: bool) -> tuple[bytes, os.stat_result] | None:
    """_read_state_file's read of `name` in the state dir open as `sfd`: (its bytes, its fstat), or None."""
    try:
        fd, st = fsread.open_regular(name, dir_fd=sfd)
    except OSError:
        return None
    try:
        trusted = st.st_uid in (os.geteuid(), 0) or (group is not None and st.st_gid == group)
        if not trusted or (shared and st.st_mode & 0o002) or st.st_size > limit:
            return None
        return os.read(fd, limit + 1)[:limit], st
    except OSError:
        return None
    finally:
        os.close(fd)


# A uid in a file's name, as str(uid) writes it (ASCII digits: util.units is not loaded at start-up):
# `reads.01000` is no user's, so that each user keeps one file, not ten.
_UID = re.compile(r"0|[1-9][0-9]{0,9}")


class UserFile(NamedTuple):
    """One user's file of a kind in .kcache/ (`<prefix><uid>`), as read_user_files found it."""

    uid: int  # who wrote it: its owner, whose uid its name holds
    data: bytes
    member: int | None  # the cache's group when the writer could only have made it as a member of it, else None


def read_user_files(root: str | os.PathLike, prefix: str, limit: int, only: int | None = None) -> list[UserFile]:
    """Each .kcache/`<prefix><uid>` a user keeps for themself in the cache (this user's, root's, or of the
    group of a group-shared cache; never one anyone may write), that its owner wrote: one named for another
    user is not read (a member may replace another's file, never write one in their name). [] when there
    is none, or no state dir kcache may trust. In a state dir anyone may write, only this user's and
    root's. `only`: that user's file alone."""
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return []
    try:
        group = shared_group(rfd)
        sfd = open_state(rfd, root)
    except OSError:
        return []
    finally:
        os.close(rfd)
    try:
        open_to_all = bool(os.fstat(sfd).st_mode & 0o002)
        names = [f"{prefix}{only}"] if only is not None else \
            [n for n in os.listdir(sfd) if n.startswith(prefix) and _UID.fullmatch(n, len(prefix))]
        out = []
        for name in names:
            uid = int(name[len(prefix):])
            got = _read_trusted(sfd, name, limit, group, True)
            if got is None or got[1].st_uid != uid or (open_to_all and uid not in (os.geteuid(), 0)):
                continue
            out.append(UserFile(uid, got[0], group if got[1].st_gid == group else None))
        return out
    except OSError:
        return []
    finally:
        os.close(sfd)


# ---- cache directory tag (https://bford.info/cachedir/) ---------------------------------------
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
_TAG_TEXT = (CACHEDIR_SIGNATURE + b"\n# This file is a cache directory tag created by kcache.\n"
             b"# For information about cache directory tags, see https://bford.info/cachedir/\n")


def has_cachedir_tag(root: Path) -> bool:
    """A regular CACHEDIR.TAG starting with the standard signature: evidence that `root` is a cache."""
    return fsread.read_head(os.path.join(root, CACHEDIR_TAG), len(CACHEDIR_SIGNATURE)) == CACHEDIR_SIGNATURE


def write_cachedir_tag(root: Path) -> None:
    """Tag a root kcache created (backup tools skip it; kcache takes it as evidence). Never fails."""
    try:
        rfd = fswrite.open_root(root)
    except OSError:
        return
    try:
        fswrite.write_file(rfd, CACHEDIR_TAG, _TAG_TEXT)
    except OSError:
        pass
    finally:
        os.close(rfd)


def make_root(root: Path) -> bool:
    """Create `root` (and its missing parents) when it does not exist, tagged; True if it was created."""
    if os.path.lexists(root):
        return False
    try:
        fswrite.make_dirs(root)
    except FileExistsError:
        return False
    write_cachedir_tag(root)
    return True


def linked_state_dir(root: Path, subdirs: tuple[str, ...] = ("locks", "used")) -> str | None:
    """.kcache or one of its `subdirs` that exists as something other than a real directory (a
    symlink above all), or None. kcache never writes through such a link."""
    for rel in (STATE_DIR, *(f"{STATE_DIR}/{s}" for s in subdirs)):
        try:
            st = os.lstat(os.path.join(root, rel))
        except FileNotFoundError:
            if rel == STATE_DIR:
                return None
            continue
        except PermissionError:  # a .kcache/ that may not be searched: no link; its open says why
            return None
        except OSError:
            return rel
        if not stat.S_ISDIR(st.st_mode):
            return rel
    return None


# ---- leftovers of killed imports and exports -----------------------------------------------------
IMPORT_STAGING = re.compile(r"^import-(\d+)-[0-9a-f]+$")  # <root>/.kcache/import-<pid>-<random>/
EXPORT_TEMP = re.compile(r"^\..+\.kcache-tmp$")  # .<archive name>.<random>.kcache-tmp beside the archive
STALE_STAGING = 24 * 3600.0  # an unlocked staging dir whose pid is alive is left this long


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, ValueError, OverflowError):
        return True  # another user's process (EPERM): alive
    return True


EXPORT_GRACE = 60.0  # an unlocked export temp file this fresh may be one whose writer has not locked it yet


def leftover_live_held(name: str, st: os.stat_result, now: float | None = None) -> str | None:
    """With the leftover's flock held by the caller (so no kcache writer holds it): why it may still be
    in use, or None. An import staging dir of an older kcache (no flock) is live while its pid runs,
    for a day; an export temp file for a minute after its last write."""
    now = time.time() if now is None else now
    staging = IMPORT_STAGING.match(name)
    if staging is not None:
        pid, age = int(staging.group(1)), now - st.st_mtime
        if pid_alive(pid) and age < STALE_STAGING:
            return f"its import (pid {pid}) may still be running"
        return None
    if now - st.st_mtime < EXPORT_GRACE:
        return "written to less than a minute ago"
    return None
