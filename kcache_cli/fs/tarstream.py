"""A small tar writer and a bounded tar reader, with gzip and zstd streams, for kcache archives.

Why not `tarfile`: its reader loads a pax or GNU long-name header of whatever size the archive
declares into memory (a hostile archive can ask for gigabytes), and its per-member cost is
several times this module's, which matters for archives of 100,000 files. The writer emits
POSIX ustar headers, with a pax header when a name, link or size does not fit; the reader
accepts what it writes (ustar and per-member pax headers: what GNU tar --format=posix, bsdtar and
Python's tarfile write too) and reports every other member type (GNU long names, global pax
headers...) to the caller, which refuses them.

Compressed streams are written in frames: concatenated gzip members and zstd frames are valid
streams, which lets an archive start with a manifest that is only known at the end.
"""

from __future__ import annotations

import os
import queue
import threading
import zlib
from typing import BinaryIO, Callable, Iterator, Protocol

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
ZERO_BLOCK = bytes(BLOCK)
CHUNK = 1 << 20
GZIP_LEVEL = 6  # gzip's and GNU tar's default
ZSTD_LEVEL = 3  # zstd's and GNU tar --zstd's default

REGULAR, DIRECTORY, SYMLINK, HARDLINK = "file", "dir", "symlink", "hardlink"
_TYPES = {b"0": REGULAR, b"\0": REGULAR, b"7": REGULAR, b"5": DIRECTORY, b"2": SYMLINK, b"1": HARDLINK,
          b"3": "character device", b"4": "block device", b"6": "fifo", b"S": "sparse file",
          b"V": "volume label", b"M": "multi-volume continuation", b"N": "GNU names record",
          b"L": "GNU long name record", b"K": "GNU long link record", b"g": "global pax header"}
_MAX_OCTAL = {8: 8 ** 7 - 1, 12: 8 ** 11 - 1}
_NUL = b"\0"
# The fixed parts of every header kcache writes (uid, gid, magic, version, devices).
_IDS = b"0000000\0" * 2
_MAGIC = b"ustar\x0000"
_NAMES_DEVS = _NUL * 64 + b"0000000\0" * 2


class Readable(Protocol):
    """Where bytes come from: a file, a slice of one, a decompressor."""

    def read(self, n: int, /) -> bytes: ...


class TarFormatError(Exception):
    """The bytes are not a tar stream this reader accepts (one line, for the user)."""


class _Truncated(TarFormatError):
    """The stream ended in the middle of something."""


def padding(size: int) -> bytes:
    return _NUL * (-size % BLOCK)


# ---- writing -----------------------------------------------------------------------------------

def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_record(key: str, value: str) -> bytes:
    kv = f" {key}={value}\n".encode("utf-8")
    n = len(kv)
    while True:  # the length prefix counts its own digits
        total = len(kv) + len(str(n))
        if total == n:
            return str(n).encode() + kv
        n = total


def _split_ustar(name: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) so that prefix + '/' + name == name, within ustar's 155 + 100 bytes."""
    if len(name) > 256:
        return None
    i = name.find(b"/", max(0, len(name) - 101))
    while i != -1:
        if i <= 155 and len(name) - i - 1 <= 100 and i > 0:
            return name[:i], name[i + 1:]
        i = name.find(b"/", i + 1)
    return None


def header(name: str, typeflag: bytes, size: int = 0, mode: int = 0o644, mtime: int = 0,
           linkname: str = "") -> bytes:
    """The header block(s) of one member: ustar, preceded by a pax header when needed."""
    pax: dict[str, str] = {}
    nb = name.encode("utf-8")
    prefix = b""
    if len(nb) > 100 or not nb.isascii():
        split = _split_ustar(nb) if nb.isascii() else None
        if split:
            prefix, nb = split
        else:
            pax["path"] = name
            nb = nb[:100].decode("utf-8", "ignore").encode("ascii", "replace")
    lb = linkname.encode("utf-8")
    if len(lb) > 100 or not lb.isascii():
        pax["linkpath"] = linkname
        lb = b""
    if size > _MAX_OCTAL[12]:
        pax["size"] = str(size)
        size = 0
    mtime = min(max(int(mtime), 0), _MAX_OCTAL[12])
    block = b"".join((nb.ljust(100, _NUL), _octal(mode & 0o7777, 8), _IDS, _octal(size, 12), _octal(mtime, 12),
                      b"        ", typeflag, lb.ljust(100, _NUL), _MAGIC, _NAMES_DEVS, prefix.ljust(155, _NUL),
                      _NUL * 12))
    block = b"%s%06o\0 %s" % (block[:148], sum(block), block[156:])
    if not pax:
        return block
    data = b"".join(_pax_record(k, v) for k, v in sorted(pax.items()))
    return header("././@PaxHeader", b"x", len(data)) + data + padding(len(data)) + block


_TAIL = _NUL * 100 + _MAGIC + _NAMES_DEVS + _NUL * 155 + _NUL * 12  # no link, no prefix
_FIXED_SUM = 256 + sum(_TAIL)  # the checksum field counts as 8 spaces
_fields_cache: dict[tuple[int, int, bytes], tuple[bytes, bytes, int]] = {}


def _plain_header(name: str, typeflag: bytes, size: int, mode: int, mtime: float) -> bytes:
    """A member's header, without a link name. The common case (a short ASCII name) is built in one
    step, with the checksum summed from its parts (mode and mtime fields cached: files of an entry
    share them); anything else goes through `header`."""
    nb = name.encode("utf-8")
    if len(nb) > 100 or size > 0o77777777777 or not nb.isascii():
        return header(name, typeflag, size, mode, int(mtime))
    key = (mode, int(mtime), typeflag)
    cached = _fields_cache.get(key)
    if cached is None:
        if len(_fields_cache) > 4096:
            _fields_cache.clear()
        head = _octal(mode & 0o7777, 8) + _IDS
        t = _octal(min(max(key[1], 0), _MAX_OCTAL[12]), 12)
        cached = _fields_cache[key] = (head, t, _FIXED_SUM + sum(head) + sum(t) + typeflag[0])
    head, t, fixed = cached
    z = b"%011o\0" % size
    return b"%s%s%s%s%06o\0 %s%s" % (nb.ljust(100, _NUL), head, z, t, fixed + sum(nb) + sum(z), typeflag, _TAIL)


def file_header(name: str, size: int, mode: int, mtime: float) -> bytes:
    """A regular file's header."""
    return _plain_header(name, b"0", size, mode, mtime)


def dir_header(name: str, mtime: float = 0) -> bytes:
    return _plain_header(name.rstrip("/") + "/", b"5", 0, 0o755, mtime)


def symlink_header(name: str, target: str, mtime: float = 0) -> bytes:
    return header(name, b"2", 0, 0o777, int(mtime), target)


class FrameWriter:
    """Compresses a byte stream into `out` (gzip, zstd or nothing), in a background thread so that
    compression overlaps with reading the files. `end_part()` ends the current gzip member / zstd
    frame and returns the bytes written so far: the concatenation of frames is one valid stream,
    and each part can also be decompressed on its own."""

    def __init__(self, out: BinaryIO, compression: str, threads: int = 0) -> None:
        self._out = out
        self._compression = compression
        self._threads = threads
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._written = 0
        self._thread = threading.Thread(target=self._run, name="kcache-compress", daemon=True)
        self._thread.start()

    def _new(self):
        if self._compression == "gz":
            return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31, 8)  # gzip -6: level 6, memLevel 8
        if self._compression == "zst":
            import zstandard

            return zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=self._threads).compressobj()
        return None

    def _emit(self, data: bytes) -> None:
        if data:
            self._out.write(data)
            self._written += len(data)

    def _run(self) -> None:
        comp = self._new()
        fed = False  # a frame is only written for data: an empty one would fall outside every part
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    if comp is not None and fed and self._error is None:
                        self._emit(comp.flush())
                    return
                if self._error is not None:
                    continue
                if item is _FRAME:
                    if comp is not None and fed:
                        self._emit(comp.flush())
                        comp = self._new()
                    fed = False
                    continue
                fed = True
                self._emit(comp.compress(item) if comp is not None else item)
            except BaseException as exc:  # handed to the writer's thread by the next call
                self._error = exc
            finally:
                self._queue.task_done()

    def write(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= CHUNK:
            self._flush_pending()

    def _flush_pending(self) -> None:
        if self._error is not None:
            raise self._error
        if self._pending:
            self._queue.put(b"".join(self._pending))
            self._pending = []
            self._pending_size = 0

    def end_part(self) -> int:
        """End the current frame; wait until it is written; the total bytes written to `out`."""
        self._flush_pending()
        self._queue.put(_FRAME)
        self._queue.join()
        if self._error is not None:
            raise self._error
        self._out.flush()
        return self._written

    def close(self) -> int:
        try:
            self._flush_pending()
        finally:
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error
        self._out.flush()
        return self._written


_FRAME = object()


# ---- reading -----------------------------------------------------------------------------------

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _zstd_start(head: bytes) -> bool:
    """Whether `head` starts a zstd stream: a frame, or a skippable frame (magic 0x184D2A50 to 0x184D2A5F,
    RFC 8878 3.1.2), which decoders pass over and pzstd puts before each of its frames."""
    return head.startswith(ZSTD_MAGIC) or (len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] >> 4 == 5)


def sniff(head: bytes) -> str | None:
    """'gz', 'zst' or 'tar' from the first bytes of a file (at least 512 for tar), else None."""
    if head.startswith(GZIP_MAGIC):
        return "gz"
    if _zstd_start(head):
        return "zst"
    if len(head) >= BLOCK and (head[257:262] == b"ustar" or head == ZERO_BLOCK):
        return "tar"
    return None


class _GzipSource:
    """Decompressed bytes of a (multi-member) gzip file, at most `n` at a time (bomb-safe)."""

    def __init__(self, raw: Readable, counted: Callable[[int], None]) -> None:
        self._raw = raw
        self._counted = counted
        self._d = zlib.decompressobj(31)
        self._input = b""
        self._in_member = False
        self._done = False

    def read(self, n: int) -> bytes:
        while True:
            if not self._input:
                if self._done:
                    return b""
                self._input = self._raw.read(CHUNK // 4)
                self._counted(len(self._input))
                if not self._input:
                    self._done = True
                    if self._in_member:
                        raise TarFormatError("the gzip stream is truncated")
                    return b""
            self._in_member = True
            try:
                out = self._d.decompress(self._input, n)
            except zlib.error as exc:
                raise TarFormatError(f"the gzip stream is corrupt ({exc})") from None
            self._input = self._d.unconsumed_tail
            if self._d.eof:  # the next gzip member, if any, starts in unused_data
                self._input = self._d.unused_data + self._input
                self._d = zlib.decompressobj(31)
                self._in_member = False
            if out:
                return out


class _ZstdSource:
    def __init__(self, raw: Readable, counted: Callable[[int], None]) -> None:
        import zstandard

        self._counted = counted
        self._raw = raw
        self._reader = zstandard.ZstdDecompressor().stream_reader(_Counting(raw, counted),  # type: ignore[arg-type]
                                                                  read_size=CHUNK // 4,
                                                                  read_across_frames=True, closefd=False)

    def read(self, n: int) -> bytes:
        try:
            return self._reader.read(n)
        except Exception as exc:  # zstandard.ZstdError
            raise TarFormatError(f"the zstd stream is corrupt ({exc})") from None


class _Counting:
    def __init__(self, raw: Readable, counted: Callable[[int], None]) -> None:
        self._raw = raw
        self._counted = counted

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._counted(len(data))
        return data


class _PlainSource(_Counting):
    pass


class _ThreadedSource:
    """Runs a source in a background thread (decompression overlaps with writing files)."""

    def __init__(self, source) -> None:
        self._source = source
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._stop = False
        self._eof = False
        self._thread = threading.Thread(target=self._run, name="kcache-decompress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop:
                data = self._source.read(CHUNK)
                self._queue.put(data)
                if not data:
                    return
        except BaseException as exc:
            self._queue.put(exc)

    def read(self, n: int) -> bytes:
        if self._eof:
            return b""
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._eof = True
            raise item
        if not item:
            self._eof = True
        return item

    def close(self) -> None:
        self._stop = True
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()


class _Slice:
    """`length` bytes of a file from `start`, read with pread (workers share the descriptor)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        self._fd = fd
        self._pos = start
        self._left = length

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = os.pread(self._fd, n, self._pos)
        self._pos += len(data)
        self._left -= len(data)
        if not data:
            self._left = 0
        return data


def region_source(fd: int, kind: str, start: int, length: int, counted: Callable[[int], None] = lambda n: None,
                  threaded: bool = True):
    """A source of tar bytes for one independently compressed part of an archive file."""
    head = os.pread(fd, 4, start) if length else b""
    if length and ((kind == "gz" and not head.startswith(GZIP_MAGIC))
                   or (kind == "zst" and not head.startswith(ZSTD_MAGIC))):
        raise TarFormatError(f"no {kind} stream starts at offset {start}")
    src = _decompressed(_Slice(fd, start, length), kind, counted)
    return _ThreadedSource(src) if threaded else src


def _decompressed(raw: Readable, kind: str, counted: Callable[[int], None]) -> Readable:
    if kind == "gz":
        return _GzipSource(raw, counted)
    if kind == "zst":
        return _ZstdSource(raw, counted)
    return _PlainSource(raw, counted)


def open_source(raw: BinaryIO, counted: Callable[[int], None] = lambda n: None, threaded: bool = True):
    """A `read(n)` source of tar bytes from an archive file, whatever its compression."""
    head = raw.read(BLOCK)
    raw.seek(0)
    kind = sniff(head)
    if kind is None:
        raise TarFormatError("not a tar, tar.gz or tar.zst archive")
    src = _decompressed(raw, kind, counted)
    return (_ThreadedSource(src) if threaded else src), kind


class Member:
    """One member's header: name (trailing '/' removed), type (REGULAR, DIRECTORY, SYMLINK, HARDLINK
    or a description of another type), size, mode, mtime, linkname."""

    __slots__ = ("name", "type", "size", "mode", "mtime", "linkname")

    def __init__(self, name: str, type: str, size: int, mode: int, mtime: int, linkname: str) -> None:
        self.name, self.type, self.size, self.mode, self.mtime, self.linkname = name, type, size, mode, mtime, linkname

    def __repr__(self) -> str:
        return f"Member({self.name!r}, {self.type}, {self.size})"


def _number(field: bytes, what: str) -> int:
    """An octal header field (sizes past 8 GiB come in a pax header, never as GNU base-256)."""
    text = field.split(_NUL, 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise TarFormatError(f"bad {what} field in a tar header") from None


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TarFormatError(f"a member's {what} is not UTF-8") from None


_SIMPLE_TYPES = (b"0", b"5")


class TarReader:
    """Members of a tar stream, one at a time; the caller reads or skips each file's data.

    `max_extension` bounds the pax headers of one member, all together (read into memory)."""

    def __init__(self, source, max_extension: int = 1 << 20) -> None:
        self._src = source
        self._buf = b""
        self._off = 0
        self._left = 0  # unread data + padding of the current member
        self._max_ext = max_extension
        self.end_marker = False  # the stream ended with zero blocks (not just with its bytes)

    # -- bytes --
    def _read(self, n: int) -> bytes:
        buf, off = self._buf, self._off
        if len(buf) - off >= n:
            self._off = off + n
            return buf[off:off + n]
        parts = [buf[off:]]
        have = len(parts[0])
        while have < n:
            chunk = self._src.read(max(CHUNK, n - have))
            if not chunk:
                self._buf, self._off = b"".join(parts), 0
                raise _Truncated("the archive is truncated")
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self._buf, self._off = data, n
        return data[:n]

    def _skip(self, n: int) -> None:
        for _ in self._chunks(n):
            pass

    def _chunks(self, n: int) -> Iterator[bytes]:
        buf, off = self._buf, self._off
        avail = len(buf) - off
        if avail >= n:
            self._off = off + n
            yield buf[off:off + n]
            return
        if avail:
            yield buf[off:]
            n -= avail
        self._buf, self._off = b"", 0
        while n > 0:
            chunk = self._src.read(CHUNK)
            if not chunk:
                raise TarFormatError("the archive is truncated")
            if len(chunk) > n:
                self._buf, self._off = chunk, n
                yield chunk[:n]
                return
            n -= len(chunk)
            yield chunk

    # -- members --
    def next(self) -> Member | None:
        if self._left:
            self._skip(self._left)
            self._left = 0
        pax: dict[str, str] = {}
        extension = 0  # bytes of pax headers before this member, all together
        while True:
            block = self._header_block(pax)
            if block is None:
                return None
            typeflag = block[156:157]
            if typeflag in _SIMPLE_TYPES and not pax and block[257:263] == b"ustar\0" and not block[345]:
                member = self._simple(block, typeflag)  # the common case: plain ustar, no prefix
                if member is not None:
                    return member
            stored = _number(block[148:156], "checksum")
            if stored != sum(block[:148]) + 256 + sum(block[156:]):
                raise TarFormatError("bad tar header checksum (not a tar archive, or a damaged one)")
            size = _number(block[124:136], "size")
            if typeflag == b"x":
                extension += size
                if extension > self._max_ext:
                    raise TarFormatError(f"tar extension headers of {extension} bytes for one member "
                                          f"(limit {self._max_ext})")
                pax.update(_parse_pax(self._read(size + (-size % BLOCK))[:size]))
                continue
            return self._general(block, typeflag, size, pax)

    def _header_block(self, pax: dict[str, str]) -> bytes | None:
        """The next 512-byte header block; None at the end of the archive (end-of-archive blocks, or
        a clean end of data between members, tolerated like GNU tar)."""
        try:
            block = self._read(BLOCK)
        except _Truncated:
            if not self._buf[self._off:] and not pax:
                return None
            raise
        if block == ZERO_BLOCK:
            self.end_marker = True
            return None
        return block

    def _general(self, block: bytes, typeflag: bytes, size: int, pax: dict[str, str]) -> Member:
        """The member a checked header describes, its pax extensions applied (the general path)."""
        if any(k.startswith("GNU.sparse") for k in pax):
            raise TarFormatError("sparse files are not supported")
        name = pax["path"] if "path" in pax else _header_name(block)
        if "linkpath" in pax:
            linkname = pax["linkpath"]
        else:
            linkname = _decode(block[157:257].split(_NUL, 1)[0], "link")
        if "size" in pax:
            size = _pax_size(pax["size"])
        kind = _TYPES.get(typeflag) or f"member of unknown type {typeflag!r}"
        mtime = _number(block[136:148], "mtime")
        if "mtime" in pax:
            try:
                mtime = int(float(pax["mtime"]))
            except ValueError:
                pass
        self._left = size + (-size % BLOCK)
        return Member(name[:-1] if name.endswith("/") and len(name) > 1 else name, kind, size,
                      _number(block[100:108], "mode"), mtime, linkname)

    def _simple(self, block: bytes, typeflag: bytes) -> Member | None:
        """A ustar header with fixed-format octal fields (what kcache, GNU tar and Python write);
        None sends anything unusual down the general path."""
        try:
            size = int(block[124:135], 8)
            # The checksum is the byte sum with its own field as spaces. adler32's low half is
            # 1 + that sum mod 65521: a check as good for catching damage, at a tenth of the cost.
            if (int(block[148:154], 8) - 255 + sum(block[148:156])) % 65521 != zlib.adler32(block) & 0xFFFF:
                return None
            mode = int(block[100:107], 8)
            mtime = int(block[136:147], 8)
        except ValueError:
            return None
        raw = block[:100]
        end = raw.find(0)
        raw = raw if end < 0 else raw[:end]
        if block[157] or not raw.isascii():  # a link name or a non-ASCII name: the general path
            return None
        name = raw.decode("ascii")
        if name.endswith("/") and len(name) > 1:
            name = name[:-1]
        self._left = size + (-size % BLOCK)
        return Member(name, _TYPES[typeflag], size, mode, mtime, "")

    def small_data(self, member: Member) -> bytes | None:
        """The member's data in one piece when it is in the buffer already (the common case for
        small files), consuming it and its padding; None otherwise (use `data`)."""
        left = self._left
        off = self._off
        if len(self._buf) - off < left:
            return None
        self._left = 0
        self._off = off + left
        return self._buf[off:off + member.size]

    def data(self, member: Member) -> Iterator[bytes]:
        """The member's data, in chunks; consumes it (and its padding)."""
        size = member.size
        left = self._left
        self._left = 0
        off = self._off
        if len(self._buf) - off >= left:  # all of it is in the buffer already
            self._off = off + left
            if size:
                yield self._buf[off:off + size]
            return
        yield from self._chunks(size)
        if left > size:
            self._skip(left - size)

    def close(self) -> None:
        close = getattr(self._src, "close", None)
        if close is not None:
            close()


def _parse_pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos:pos + 1] == _NUL:
            break
        sp = data.find(b" ", pos)
        if sp == -1:
            raise TarFormatError("malformed pax header")
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise TarFormatError("malformed pax header") from None
        if length <= sp - pos or pos + length > len(data):
            raise TarFormatError("malformed pax header")
        record = data[sp + 1:pos + length]
        if not record.endswith(b"\n") or b"=" not in record:
            raise TarFormatError("malformed pax header")
        key, _, value = record[:-1].partition(b"=")
        out[_decode(key, "pax key")] = _decode(value, "pax value")
        pos += length
    return out


def _header_name(block: bytes) -> str:
    """A header's member name: its name field, behind its ustar prefix if it has one."""
    raw = block[:100].split(_NUL, 1)[0]
    if block[257:262] == b"ustar":
        prefix = block[345:500].split(_NUL, 1)[0]
        if prefix:
            raw = prefix + b"/" + raw
    return _decode(raw, "name")


def _pax_size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise TarFormatError("bad size in a pax header") from None
    if size < 0:
        raise TarFormatError("negative size in a pax header")
    return size
