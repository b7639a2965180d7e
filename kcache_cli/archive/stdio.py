"""An archive through a pipe: `kcache export - | ssh host kcache import -`.

kcache's archive cannot be written or read as one pass over a stream: its first member, the manifest,
lists every file's sha256 (known only once every entry is read), and import reads it before the entries
and sends each worker to its own part. So `export -` makes the archive in a private temp directory
($TMPDIR) and then copies it to standard output; `import -` keeps standard input in a private temp file
first, then imports that file as any other (everything verified before anything is published). Either
temp goes when the command ends, and is reached only through a descriptor held on the directory kcache
made (private_dir): a TMPDIR another user may write in cannot swap the archive. A terminal is refused at
once on either side (no archive is typed or shown), and so is input that is not a tar, tar.gz or tar.zst
stream, from its first block: neither `yes | kcache import -` nor `kcache import - < /dev/zero` fills a
disk."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from kcache_cli.fs import tarstream as ts
from kcache_cli.fs import write as fswrite
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.progress import NO_PROGRESS, Progress

STDIO = "-"  # the ARCHIVE that names standard input (import) or standard output (export)
SHOWN = "standard input"
_CHUNK = 1 << 20


def refuse_terminal(fd: int, what: str) -> None:
    """A usage error when `fd` (0 or 1) is a terminal: an archive is neither typed nor shown."""
    if os.isatty(fd):
        if fd == 0:
            raise UsageError(f"{what}: standard input is a terminal; pipe an archive in "
                             "(kcache export - | kcache import -) or name a file")
        raise UsageError(f"{what}: standard output is a terminal; redirect it to a file or pipe it "
                         "(kcache export - | ssh HOST kcache import -)")


@contextmanager
def private_dir(prefix: str) -> Iterator[str]:
    """A new directory of ours under $TMPDIR (mkdtemp: 0700), yielded as a path through a descriptor held on
    it (/proc/self/fd/N). Whoever may write in TMPDIR (another user's directory there, or a link to one) can
    move it away or put their own under its name between two uses of that name; a path through the
    descriptor still leads into ours, which only we can write. Emptied through it on the way out."""
    made = tempfile.mkdtemp(prefix=prefix)
    fd, st = _held(made)
    try:
        yield _through(fd, st, made)
    finally:
        _empty(fd, made, st)


def _through(fd: int, st: os.stat_result, made: str) -> str:
    """The path of the directory held as `fd` through that descriptor; without /proc, the name it was made
    under."""
    held = f"/proc/self/fd/{fd}"
    try:
        return held if os.path.samestat(st, os.stat(held)) else made
    except OSError:
        return made


def _held(made: str) -> tuple[int, os.stat_result]:
    """A descriptor of the directory mkdtemp just made as `made`, and its stat: KcacheError when what is
    there now is not it (ours, 0700), which is then left alone."""
    where = os.path.dirname(made)
    try:
        fd = os.open(made, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise KcacheError(f"cannot use a temp directory in {where}: {exc.strerror} (another user may write "
                          "there: set TMPDIR to a directory of yours)") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        os.close(fd)
        raise KcacheError(f"the temp directory kcache made in {where} was replaced: another user may write "
                          "there (set TMPDIR to a directory of yours)")
    return fd, st


def _empty(fd: int, made: str, st: os.stat_result) -> None:
    """Remove what kcache wrote in the directory held as `fd` (files only), then the directory where it is
    still named `made` (elsewhere, it stays: empty, and only ours to read)."""
    try:
        for name in os.listdir(fd):
            try:
                fswrite.unlink_at(fd, name)
            except OSError:
                pass
        if os.path.samestat(st, os.lstat(made)):
            os.rmdir(made)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def spooled_stdin(max_bytes: int, progress: Progress = NO_PROGRESS, fd: int = 0) -> Iterator[str]:
    """The archive on `fd` (standard input) kept in a private temp file, whose path is yielded (through
    private_dir); the file and its directory go on the way out. KcacheError when the input is empty, is not
    an archive (judged from its first block, before the rest is read), or is longer than `max_bytes`.
    `progress` advances by the bytes kept (their total is not known)."""
    refuse_terminal(fd, "import -")
    with private_dir("kcache-stdin-") as where:
        path = os.path.join(where, "archive")
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _spool(fd, out, max_bytes, progress)
        finally:
            os.close(out)
        yield path


def _spool(src: int, out: int, max_bytes: int, progress: Progress) -> None:
    """Copy `src` to `out` (see spooled_stdin): its first block judged before anything else is read."""
    data = _read(src, ts.BLOCK)
    while len(data) < ts.BLOCK:  # a pipe may hand out less than asked
        more = _read(src, ts.BLOCK - len(data))
        if not more:
            break
        data += more
    if not data:
        raise KcacheError(f"{SHOWN} is empty: no archive came")
    if ts.sniff(data) is None:
        raise KcacheError(f"{SHOWN} is not a tar, tar.gz or tar.zst archive")
    if data == ts.ZERO_BLOCK:  # tar's end-of-archive marker first (`< /dev/zero`): no kcache archive follows
        raise KcacheError(f"{SHOWN} starts with an empty block (tar's end of archive): not a kcache archive, "
                          "whose first member is manifest.json")
    total = 0
    while data:
        total += len(data)
        if total > max_bytes:
            raise KcacheError(f"{SHOWN} is longer than {max_bytes:,} bytes (--max-total-size): not imported")
        try:
            _write_all(out, data)
        except OSError as exc:
            raise KcacheError(f"cannot keep {SHOWN} in {tempfile.gettempdir()}: {exc.strerror} (set TMPDIR "
                              "to a roomier disk)") from None
        progress.advance(len(data))
        data = _read(src, _CHUNK)


def _read(fd: int, n: int) -> bytes:
    try:
        return os.read(fd, n)
    except OSError as exc:
        raise KcacheError(f"cannot read {SHOWN}: {exc.strerror}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def copy_out(path: str, fd: int = 1) -> int:
    """Copy the finished archive at `path` to `fd` (standard output); the bytes copied. KcacheError when
    the reader goes away first (what it got is no archive: import refuses it)."""
    with open(path, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        done = 0
        try:
            while done < size:
                done += _send(src.fileno(), fd, done, size - done)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise KcacheError(f"standard output was closed after {done:,} of {size:,} bytes: the reader "
                                  "stopped, and what it got is no archive") from None
            raise KcacheError(f"cannot write the archive to standard output: {exc.strerror}") from None
    return done


def _send(src: int, out: int, offset: int, count: int) -> int:
    """Bytes of `src` from `offset` written to `out` (sendfile, or a read and a write where it is refused)."""
    try:
        n = os.sendfile(out, src, offset, min(count, 1 << 30))
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        data = os.pread(src, min(count, _CHUNK), offset)
        _write_all(out, data)
        n = len(data)
    if n == 0:
        raise OSError(errno.EIO, "the archive shrank while it was copied")
    return n
