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
`.kcache/reads` (JSON, merged under `.kcache/locks/.reads.lock`, shared with the cache's group) at the
end of a scan, of each worker, and of the command; a file kcache read before keeps the atime before
that first read. A scan reads a file's atime through `atime()`: an atime that is still exactly the one
kcache's read left is taken as the one before it. A compiler's later read moves the
atime past the note, and the note no longer applies. (On a relatime mount a compiler's read within a
day of kcache's may not move it: that use is seen up to a day late, never invented.)

A user who may read the cache but not write it (neither its owner nor a member of its group) can keep
no note: what such a reader's reads moved is counted in UNNOTED, and the command says so at its end."""

from __future__ import annotations

import json
import os
import stat

from kcache_cli.fs import locking, state
from kcache_cli.fs import read as fsread
from kcache_cli.fs import write as fswrite
from kcache_cli.util.errors import LockTimeout

FILE = "reads"  # in .kcache/
LOCK = ".reads.lock"  # in .kcache/locks/
MAX_NOTES = 200_000  # oldest dropped beyond this (a note is about 40 bytes)

# inode -> (atime_ns kcache's read left, atime_ns before it): loaded by a scan, inherited by its workers
MARKS: dict[int, tuple[int, int]] = {}
# root -> files whose atime this process's reads moved where no note could be kept (a cache it cannot write)
UNNOTED: dict[str, int] = {}


def atime(st: os.stat_result) -> float:
    """The file's last use: its atime, or the atime before kcache's own read when it is still the one that
    read left."""
    mark = MARKS.get(st.st_ino)
    if mark is not None and mark[0] == st.st_atime_ns:
        return mark[1] / 1e9
    return st.st_atime


def newest_atime(sts: list[os.stat_result]) -> float:
    """The newest last use (atime()) of the regular files among `sts`, 0.0 when there is none: a
    directory's atime is any listing's."""
    if not MARKS:  # no read of kcache's noted: the atimes as they are
        return max([st.st_atime for st in sts if stat.S_ISREG(st.st_mode)], default=0.0)
    return max((atime(st) for st in sts if stat.S_ISREG(st.st_mode)), default=0.0)


def note(dir_fd: int, listing: dict[str, os.stat_result]) -> None:
    """After judging the entry held as `dir_fd` (its files as listed before, `listing`): note each file of
    another user whose atime kcache's reads moved (root and owners read with O_NOATIME: nothing moves).
    Reads through fsread.open_quietly note themselves when closed (fsread.close_read); this catches the
    rest (a file opened as a compiler opens it)."""
    me = os.geteuid()
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
    fsread.READING = os.path.join(os.path.abspath(root), "")


def _take_moved(root: str) -> dict[int, tuple[int, int]]:
    """The atimes this process's reads in the cache `root` ("<root>/") moved (fsread.MOVED), as notes:
    inode -> (atime after, atime before)."""
    return {key[1]: fsread.MOVED.pop(key) for key in [k for k in fsread.MOVED if k[0] == root]}


def _before(notes: dict[int, tuple[int, int]], ino: int, before: int) -> int:
    """The atime before kcache's reads of the file `ino` when its atime was `before` as they began: where
    `before` is what an earlier read of kcache's left (its note), the atime that read found."""
    note = notes.get(ino)
    return note[1] if note is not None and note[0] == before else before


def load(root: str | os.PathLike) -> None:
    """MARKS from the cache's notes (none when missing, malformed or not trusted); this process reads the
    cache's entries from now on (reading)."""
    MARKS.clear()
    reading(root)
    raw = state.read_shared_file(root, FILE, 64 << 20)
    if raw is None:
        return
    try:
        doc = fsread.parse_json(raw, FILE, 3)
        MARKS.update({int(k): (int(v[0]), int(v[1])) for k, v in doc.items()})
    except (ValueError, TypeError, IndexError, AttributeError):
        MARKS.clear()


def save(root: str | os.PathLike) -> None:
    """Merge this process's notes of its reads in the cache `root` into `.kcache/reads` (under its lock).
    Never fails the caller."""
    key = os.path.join(os.path.abspath(root), "")
    new = _take_moved(key)
    if not new:
        return

    try:
        rfd = fswrite.open_root(root)
    except OSError:
        count_unnoted({key: len(new)})
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
        count_unnoted({key: len(new)})
    except LockTimeout:
        pass  # a writer held the lock for 10 s: these reads stay unnoted
    finally:
        os.close(rfd)


def take_unnoted() -> dict[str, int]:
    """UNNOTED, emptied: what a worker process hands back to the command (count_unnoted there)."""
    got = dict(UNNOTED)
    UNNOTED.clear()
    return got


def count_unnoted(counts: dict[str, int]) -> None:
    """Counts of unnoted reads (a worker's take_unnoted, or this process's own), added to this process's."""
    for root, n in counts.items():
        UNNOTED[root] = UNNOTED.get(root, 0) + n


def save_all() -> None:
    """At a command's end: what its reads moved, noted in each cache they were of (commands that read
    entries after their scan: verify, inspect, log, prune --broken...)."""
    for root in sorted({k[0] for k in fsread.MOVED}):
        save(root)


def _merge(root: str | os.PathLike, sfd: int, new: dict[int, tuple[int, int]]) -> None:
    raw = state.read_shared_file(root, FILE, 64 << 20)
    try:
        notes = {int(k): (int(v[0]), int(v[1])) for k, v in fsread.parse_json(raw, FILE, 3).items()} if raw else {}
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):  # not ours: started again
        notes = {}
    for ino, (after, before) in new.items():  # a file another process of kcache read before (and noted)
        notes[ino] = (after, _before(notes, ino, _before(MARKS, ino, before)))
    MARKS.update({ino: notes[ino] for ino in new})  # this process's next reads of them chain on
    kept = list(notes.items())[-MAX_NOTES:]
    data = json.dumps({str(k): list(v) for k, v in kept}, separators=(",", ":")).encode()
    fswrite.replace_file_shared(sfd, FILE, data)
