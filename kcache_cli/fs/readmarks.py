"""kcache's own reads are never a use (issue 32): the atimes they move are put back, in the record.

Last use is the newest atime of an entry's files (a compiler's hit reads them and writes nothing). kcache
reads files to judge them with O_NOATIME (kcache_cli.fs.read.open_quietly), which the kernel grants to a
file's owner and to root only: a member of a group-shared cache reading another member's entries moves
their atime, and a nightly `prune --older-than` would then never remove anything.

Such a member cannot put the atime back either (setting an explicit time needs ownership). So kcache
remembers what it did, whichever command read: a file opened without O_NOATIME is fstat'ed before it is
read and again when it is closed (fsread.close_read), and an entry directory a judgement held is
checked when closed (EntryDir.close, for files opened as a compiler opens them); an atime that moved
is noted as (inode, atime after, atime before), under the cache being read (`reading`). The notes go to
`.kcache/reads.<uid>`, the reader's own (JSON, merged under `.kcache/locks/.reads.lock`, shared with the
cache's group) at the end of a scan and of the command (a worker process hands its notes back: take_moved);
a file kcache read before keeps the atime before that first read. A scan reads a file's atime through
`atime()`: an atime that is still exactly the one kcache's read left is taken as the one before it. A
compiler's later read moves the atime past the note, and the note no longer applies. (On a relatime mount
a compiler's read within a day of kcache's may not move it: that use is seen up to a day late, never
invented.)

A note can only make a file look less recently used, and a prune removes what looks unused: a member
could forge notes to have root's nightly prune remove entries in use that the member may not remove.
So a note counts only where its writer could do as much to the file anyway: it is the writer's own, or
root's, or the file's owner's, or the file may be written by anyone, or by the cache's group and the
writer made the note as a member of it (their file in the group's `.kcache/`). Whose a note is, its
file's owner says: each user writes their own file, and one named for another user is not read. A
member's reads of entries the group may not write (umask 022) are then a use, to root and everyone
else: that fails safe (prune keeps more), and reading as root or the owner moves nothing.

A user who may read the cache but not write it (neither its owner nor a member of its group) can keep
no note: what such a reader's reads moved is counted in UNNOTED, and the command says so at its end."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from typing import NamedTuple

from kcache_cli.fs import locking, state
from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.util.errors import LockTimeout

PREFIX = "reads."  # in .kcache/: reads.<uid>, each user's notes (an older kcache's one `reads` is not read)
LOCK = ".reads.lock"  # in .kcache/locks/
MAX_NOTES = 200_000  # oldest dropped beyond this (a note is about 40 bytes)


class Mark(NamedTuple):
    """A note as a scan goes by it."""

    after: int  # the atime (ns) kcache's read left
    before: int  # the atime (ns) before it
    uid: int  # who noted it
    member: int  # the cache's group when they wrote it as a member of it, else -1


# inode -> its note: loaded by a scan, inherited by its workers
MARKS: dict[int, Mark] = {}
# root -> files whose atime this process's reads moved where no note could be kept (a cache it cannot write)
UNNOTED: dict[str, int] = {}


def atime(st: os.stat_result) -> float:
    """The file's last use: its atime, or the atime before kcache's own reads when it is still the one they
    left: this process's (fsread.MOVED, not saved yet: a judgement may read an entry before its usage is
    measured) and earlier ones' (MARKS)."""
    ns = st.st_atime_ns
    own = fsread.MOVED.get((fsread.READING, st.st_ino)) if fsread.MOVED and fsread.READING else None
    if own is not None and own[0] == ns:
        ns = own[1]
    mark = MARKS.get(st.st_ino)
    if mark is not None and mark.after == ns and _may_write(mark, st):
        return mark.before / 1e9
    return st.st_atime if ns == st.st_atime_ns else ns / 1e9


def _may_write(mark: Mark, st: os.stat_result) -> bool:
    """Whether the writer of `mark` could write the file `st` themself (the module's rule)."""
    mode = st.st_mode
    return (mark.uid in (0, st.st_uid, os.geteuid()) or bool(mode & 0o002)
            or (bool(mode & 0o020) and st.st_gid == mark.member))


def newest_atime(sts: list[os.stat_result]) -> float:
    """The newest last use (atime()) of the regular files among `sts`, 0.0 when there is none: a
    directory's atime is any listing's."""
    if not MARKS and not fsread.MOVED:  # no read of kcache's noted: the atimes as they are
        return max([st.st_atime for st in sts if stat.S_ISREG(st.st_mode)], default=0.0)
    return max((atime(st) for st in sts if stat.S_ISREG(st.st_mode)), default=0.0)


def note(dir_fd: int, listing: dict[str, os.stat_result]) -> None:
    """After judging the entry held as `dir_fd` (its files as listed before, `listing`): note each file of
    another user whose atime kcache's reads moved (root and owners read with O_NOATIME: nothing moves).
    Reads through fsread.open_quietly note themselves when closed (fsread.close_read); this catches the
    rest (a file opened as a compiler opens it)."""
    me = fsread.EUID
    if me == 0:
        return
    for name, before in listing.items():
        if before.st_uid == me or not stat.S_ISREG(before.st_mode):
            continue
        try:
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if now.st_ino == before.st_ino and now.st_atime_ns != before.st_atime_ns and fsread.READING:
            fsread.moved(fsread.READING, now.st_ino, now.st_atime_ns, before.st_atime_ns)


def reading(root: str | os.PathLike) -> None:
    """From now on this process reads the entries of the cache `root`: what its reads move is noted there."""
    fsread.READING = _key(root)


def _key(root: str | os.PathLike) -> str:
    return os.path.join(os.path.abspath(root), "")


def in_worker(root: str | os.PathLike) -> None:
    """A worker process reads the cache `root` with the notes its command loaded (readmarks.load, before
    the scan): a forked one has them, a forkserver's, which inherits nothing, loads them."""
    if fsread.READING != _key(root):
        load(root)


def _take_moved(root: str) -> dict[int, tuple[int, int]]:
    """The atimes this process's reads in the cache `root` ("<root>/") moved (fsread.MOVED), as notes:
    inode -> (atime after, atime before)."""
    return {key[1]: fsread.MOVED.pop(key) for key in [k for k in fsread.MOVED if k[0] == root]}


def _before(notes: Mapping[int, tuple[int, ...]], ino: int, before: int) -> int:
    """The atime before kcache's reads of the file `ino` when its atime was `before` as they began: where
    `before` is what an earlier read of kcache's left (its note), the atime that read found."""
    note = notes.get(ino)
    return note[1] if note is not None and note[0] == before else before


def load(root: str | os.PathLike) -> None:
    """MARKS from the cache's notes (none when missing, malformed or not trusted); this process reads the
    cache's entries from now on (reading)."""
    MARKS.clear()
    reading(root)
    for f in state.read_user_files(root, PREFIX, 64 << 20):
        member = -1 if f.member is None else f.member
        for ino, (after, before) in _parsed(f.data).items():
            old = MARKS.get(ino)
            if old is None or old.after < after:  # two users' notes: the later read's
                MARKS[ino] = Mark(after, before, f.uid, member)


def _parsed(raw: bytes | None) -> dict[int, tuple[int, int]]:
    """A notes file's notes; none when it is missing or malformed (not ours: started again; an atime of
    Infinity, which json takes, is OverflowError to int())."""
    if not raw:
        return {}
    try:
        return {int(k): (int(v[0]), int(v[1])) for k, v in fsread.parse_json(raw, PREFIX, 3).items()}
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError):
        return {}


def save(root: str | os.PathLike) -> None:
    """Merge this process's notes of its reads in the cache `root` into `.kcache/reads` (under its lock).
    Never fails the caller."""
    key = _key(root)
    new = _take_moved(key)
    if not new:
        return

    try:
        rfd = fswrite.open_root(root)
    except OSError:
        _count_unnoted(key, len(new))
        return
    try:
        lfd = state.open_state(rfd, root, "locks", create=True)
        try:
            lock = locking.open_lock(LOCK, lfd, create=True)
        finally:
            os.close(lfd)
        try:
            locking.wait_flock(lock, 10.0, "the reads lock")
            sfd = state.open_state(rfd, root)
            try:
                _merge(root, sfd, new)
            finally:
                os.close(sfd)
        finally:
            os.close(lock)
    except OSError:  # a cache this user cannot write
        _count_unnoted(key, len(new))
    except LockTimeout:
        pass  # a writer held the lock for 10 s: these reads stay unnoted
    finally:
        os.close(rfd)


def take_moved() -> list[tuple[str, int, int, int]]:
    """fsread.MOVED, emptied, as (root, inode, atime after, atime before): what a worker process's reads
    moved, handed back to the command (put_moved there) rather than saved by the worker. The command and
    its workers read one file (a tilus program its scripts name) and save in no set order: a note of an
    earlier read saved after one of a later read replaced it, and the later read's atime counted as a use."""
    got = [(root, ino, after, before) for (root, ino), (after, before) in fsread.MOVED.items()]
    fsread.MOVED.clear()
    return got


def put_moved(moved: list[tuple[str, int, int, int]]) -> None:
    """All the workers' take_moved, at once, into this process's MOVED with its own, in the order the reads
    were made (by the atime each left): each chains on the read before it, whichever process made it
    (fsread.moved)."""
    for root, ino, after, before in sorted([*take_moved(), *moved], key=lambda m: m[2]):
        fsread.moved(root, ino, after, before)


def _count_unnoted(key: str, n: int) -> None:
    """`n` more reads in the cache `key` (_key) whose moves save could not note."""
    UNNOTED[key] = UNNOTED.get(key, 0) + n


def save_all() -> None:
    """At a command's end: what its reads moved, noted in each cache they were of (commands that read
    entries after their scan: verify, inspect, log, prune --broken...)."""
    for root in sorted({k[0] for k in fsread.MOVED}):
        save(root)


def _merge(root: str | os.PathLike, sfd: int, new: dict[int, tuple[int, int]]) -> None:
    """`new` notes into this user's notes file (its own name: read_user_files reads it as theirs)."""
    me = os.geteuid()
    mine = state.read_user_files(root, PREFIX, 64 << 20, only=me)
    notes = _parsed(mine[0].data if mine else None)
    for ino, (after, before) in new.items():  # a file another process of kcache read before (and noted)
        notes[ino] = (after, _before(notes, ino, _before(MARKS, ino, before)))
    MARKS.update({ino: Mark(*notes[ino], me, -1) for ino in new})  # this process's next reads chain on
    kept = list(notes.items())[-MAX_NOTES:]
    data = json.dumps({str(k): list(v) for k, v in kept}, separators=(",", ":")).encode()
    fswrite.replace_file_shared(sfd, f"{PREFIX}{me}", data)
