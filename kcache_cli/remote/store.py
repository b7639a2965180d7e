"""Where a remote cache keeps its keys: a Redis server, or a shared directory (NFS) for sites without one.

A Store is a small key-value interface, Redis-flavoured, that push and pull need and no more:
values by key, new values with a time to live (data not yet published expires if its pusher dies),
one atomic publish (SET NX of the record that makes an entry visible, together with its index
field, the PERSIST of its data and the keys a layout wants written last), hashes for the index and
the last-pulled times, and key listing by pattern (for entries a foreign tool such as Triton pushed).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import math
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol
from urllib.parse import parse_qsl, urlsplit

from kcache_cli.fs import write as fswrite
from kcache_cli.fs.read import NotRegularFile, TooLarge, kind_of, read_bytes
from kcache_cli.model.records import Warn
from kcache_cli.remote.redact import lower_scheme, redact_text, redact_url
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.units import is_digits

CONNECT_TIMEOUT = 2.0  # seconds: a remote that does not answer this fast is down, for a build
IO_TIMEOUT = 30.0  # seconds for one read from the remote (big values travel in one)
PENDING_TTL = 24 * 3600  # data written before its record expires after this, unless published
MAX_RECORD = 16 << 20  # bytes of one entry record or index summary: kcache's own are a few kB
MAX_TIMEOUT = 7 * 24 * 3600.0  # a timeout longer than a week is a typo


class RemoteError(KcacheError):
    """The remote is down, slow, refused us, or holds something unreadable (exit 1)."""


def check_timeout(value: float, option: str, minimum: float = 0.1) -> float:
    """A timeout option's value, or a usage error (nan, inf, negative, under `minimum`)."""
    if not math.isfinite(value) or not minimum <= value <= MAX_TIMEOUT:
        raise UsageError(f"{option} takes seconds from {minimum:g} to {MAX_TIMEOUT:g}, not {value!r}")
    return value


@dataclass(frozen=True)
class Publish:
    """What one atomic publish does: set `key` to `value` only if it does not exist; if it was set,
    also set `index_field` in the hash `index` to `index_value`, remove the time to live of
    `persist`, and set `last` (keys a layout wants written after the data, such as Triton's group
    file)."""

    key: str
    value: bytes
    index: str
    index_field: str
    index_value: bytes
    persist: tuple[str, ...] = ()
    last: tuple[tuple[str, bytes], ...] = ()


class NotAValue(NamedTuple):
    """A key that holds something other than a value (a Redis set or hash; in a shared directory a link, a
    FIFO, a folder): never read, and never taken for a key that is gone (a record there is refused)."""

    what: str  # "a Redis set", "a symlink"


# A value as a bounded read gives it: its bytes, its size when that is over the limit (not fetched),
# NotAValue for a key of another type, or None when there is no such key.
Value = bytes | int | NotAValue | None


class Store(Protocol):
    url: str  # without any password (redact.redact_url)

    def set_deadline(self, seconds: float | None) -> None: ...

    def get(self, keys: Sequence[str], limit: int | Sequence[int] = MAX_RECORD) -> list[Value]: ...

    def put(self, items: Mapping[str, bytes], ttl: int | None = None, only_new: bool = False) -> None: ...

    def publish(self, p: Publish) -> bool: ...

    def publish_many(self, ps: Sequence[Publish]) -> list[bool]: ...

    def delete(self, keys: Sequence[str]) -> None: ...

    def hash_scan(self, name: str, limit: int = MAX_RECORD) -> Iterator[list[tuple[str, Value]]]: ...

    def hash_values(self, name: str, fields: Sequence[str], limit: int = MAX_RECORD) -> list[Value]: ...

    def hash_set(self, name: str, mapping: Mapping[str, bytes]) -> None: ...

    def hash_delete(self, name: str, fields: Sequence[str]) -> None: ...

    def keys(self, pattern: str) -> Iterator[str]: ...

    def close(self) -> None: ...

    warn: Warn  # a damaged field the store skips in a hash (an index of many entries, one junk) is said here


def hash_fields(store: Store, name: str) -> set[str]:
    """The field names of a hash (their values are not kept)."""
    return {k for batch in store.hash_scan(name, limit=0) for k, _ in batch}


def redact(url: str) -> str:
    """`url` without its password (it goes into messages and JSON)."""
    return redact_url(url)


def open_store(url: str, connect_timeout: float = CONNECT_TIMEOUT, io_timeout: float = IO_TIMEOUT,
               deadline: float | None = None, warn: Warn | None = None) -> Store:
    """The store at `url`: redis://[user:password@]host:port/db, rediss://... (TLS), or file:///path.
    `deadline`: seconds the whole remote part of the command may take (None: no limit); `warn`: where the
    hash fields it skips are said, one line each."""
    store: Store
    url = lower_scheme(url)  # REDIS://h is redis://h, as redis-py reads it
    if url.startswith(("redis://", "rediss://", "unix://")):
        store = RedisStore(url, connect_timeout, io_timeout)
    elif url.startswith(("oci://", "oci+http://")):
        raise UsageError(f"remote {redact(url)!r}: an oci:// image moves whole, with push, pull and remote "
                         "ls|stats|prune; build --remote needs a redis:// or file:// remote")
    elif url.startswith("file://"):
        path = url[len("file://"):]
        if path.startswith("localhost/"):  # file://localhost/path (RFC 8089): this machine's /path
            path = path[len("localhost"):]
        if not path.startswith("/"):
            raise UsageError(f"remote {redact(url)!r}: a file:// remote needs an absolute path (file:///shared/kcache)")
        store = FileStore(path)
    else:
        raise UsageError(f"remote {redact(url)!r}: use redis://host:port/db, rediss://... or file:///path")
    store.set_deadline(deadline)
    store.warn = warn or (lambda m: None)
    return store


def skipped_field(store: Store, name: str, field: str, why: str) -> None:
    """Say that a field of the hash `name` was skipped, the rest going on (both stores' one line)."""
    store.warn(f"remote {store.url}: skipped {name} field {field[:200]!r}: {why}")


class Deadline:
    """The time the remote part of a command has left; `expire` runs when it is over."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seconds: float | None = None
        self.at: float | None = None
        self._timer: Any = None

    def set(self, seconds: float | None, expire=None) -> None:

        self.cancel()
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds
        if seconds is not None and expire is not None:
            self._timer = threading.Timer(max(seconds, 0.0), expire)
            self._timer.daemon = True
            self._timer.start()

    def left(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def check(self) -> None:
        left = self.left()
        if left is not None and left <= 0:
            raise self.error()

    def error(self) -> RemoteError:
        return RemoteError(f"remote {self.url}: no answer within --remote-timeout ({self.seconds:g}s in all)")

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# ---- Redis -------------------------------------------------------------------------------------

# Atomic publish. KEYS: record, index, persist..., last...; ARGV: record value, index field, index
# value, number of persist keys, values of the last keys.
_PUBLISH = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
local n = tonumber(ARGV[4])
for i = 3, 2 + n do redis.call('PERSIST', KEYS[i]) end
for i = 3 + n, #KEYS do redis.call('SET', KEYS[i], ARGV[i + 2 - n]) end
return 1
"""
# Bounded reads: the server measures each value and sends it only when it is within its limit (else
# its size, an integer); a key that is not there is false, one of another type its type, in a list.
# KEYS: keys; ARGV: limits.
_GET = """
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k).ok
  if t == 'none' then out[i] = false
  elseif t ~= 'string' then out[i] = {t}
  else
    local n = redis.call('STRLEN', k)
    if n > tonumber(ARGV[i]) then out[i] = n else out[i] = redis.call('GET', k) end
  end
end
return out
"""
# One HSCAN step, each value sent only within the limit (else its size), each name only within it too
# (else its first 64 bytes and its length, to be said). KEYS: hash; ARGV: cursor, count, limit.
_HSCAN = """
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local lim, kv, out, long = tonumber(ARGV[3]), r[2], {}, {}
for i = 1, #kv, 2 do
  if #kv[i] <= 4096 then
    out[#out + 1] = kv[i]
    if #kv[i + 1] > lim then out[#out + 1] = #kv[i + 1] else out[#out + 1] = kv[i + 1] end
  else
    long[#long + 1] = string.sub(kv[i], 1, 64)
    long[#long + 1] = #kv[i]
  end
end
return {r[1], out, long}
"""
# Bounded HMGET. KEYS: hash; ARGV: limit, fields...
_HMGET = """
local out, lim = {}, tonumber(ARGV[1])
for i = 2, #ARGV do
  local n = redis.call('HSTRLEN', KEYS[1], ARGV[i])
  if n > lim then out[i - 1] = n else out[i - 1] = redis.call('HGET', KEYS[1], ARGV[i]) end
end
return out
"""
_BATCH = 256  # keys per round trip
_REPLY_SLACK = 1 << 20  # bytes of a reply held past the largest value asked for (names, framing, one read)
SCAN_BATCH = 1000  # hash fields per step of a scan


def _check_user_part(url: str, shown: str) -> None:
    """A password holding `/`, `?` or `#` unencoded makes the URL mean another host (part of the
    password would then be printed as one): refused, with how to write it."""
    rest = url.partition("://")[2]
    user = rest[:rest.rfind("@")] if "@" in rest else ""
    if any(ch in user for ch in "/?#"):
        raise UsageError(f"remote {shown!r}: its user part holds '/', '?' or '#'; write them %-encoded "
                         "(%2F, %3F, %23) in a password")


def _check_redis_url(url: str, shown: str) -> None:
    """What redis-py would read otherwise than it is written is refused: no host (it would take
    localhost:6379), a database that is not a number (it would take 0), a query it would take for
    something else (`?db=3` over the path's database) or not at all."""
    if url.startswith("unix://"):
        return
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        raise UsageError(f"remote {shown!r} is not a URL (redis://host:port/db)") from None
    if not host:
        raise UsageError(f"remote {shown!r} names no host (redis://host:port/db)")
    db = parts.path[1:]
    if db and not is_digits(db):
        raise UsageError(f"remote {shown!r}: the database after the port is a number (redis://host:port/0)")
    asked = sorted({key for key, _ in parse_qsl(parts.query, keep_blank_values=True)} - _REDIS_QUERY)
    if asked:
        raise UsageError(f"remote {shown!r}: '{asked[0]}' in the URL is none kcache passes on (the database is "
                         "the path's, the timeouts are kcache's own options)")


# What a redis:// URL's query may say (redis-py reads it); the database and timeouts are kcache's to set.
_REDIS_QUERY = frozenset({"password", "username", "client_name", "protocol", "health_check_interval",
                          "socket_keepalive", "socket_read_size", "max_connections", "legacy_responses",
                          "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname",
                          "ssl_min_version", "ssl_include_verify_flags", "ssl_exclude_verify_flags"})


class _TooLong(Exception):
    """A reply far larger than what was asked for (raised inside redis-py, which then drops the connection)."""


def _bounded_parser(base: type, most: Callable[[], int]) -> type:
    """redis-py's reply parser `base` (hiredis's) holding at most most() bytes of a reply it has not finished:
    a server that announces a value larger than was asked for, or never ends a line, is cut off there
    instead of kept in memory (one 3 GB string once held 8.8 GB). A parser without hiredis's reader is
    `base` as it is."""

    class Bounded(base):
        def read_from_socket(self, *args, **kwargs):
            got = super().read_from_socket(*args, **kwargs)
            held = getattr(self, "_reader", None)
            if held is not None and held.len() > most():
                raise _TooLong(f"it sent more than {most() - _REPLY_SLACK} bytes, the most kcache asked for")
            return got

    return Bounded


def _value(v: object) -> Value:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], bytes):  # _GET's type of a key not a string
        return NotAValue("a Redis " + v[0].decode("ascii", "replace")[:20])
    return v if isinstance(v, (bytes, int)) and not isinstance(v, bool) else None


class RedisStore:
    """A Redis server through redis-py (imported here only). Every call is bounded twice: each read
    by the I/O timeout, and all of them together by the command's deadline, when one is set, after
    which the connections are shut down under any read still waiting."""

    def __init__(self, url: str, connect_timeout: float = CONNECT_TIMEOUT, io_timeout: float = IO_TIMEOUT) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise KcacheError("the redis client is not installed (pip install redis)") from None
        self.url = redact(url)
        self.warn: Warn = lambda m: None
        self._errors = redis.exceptions.RedisError
        self.deadline = Deadline(self.url)
        self._expired = False
        _check_user_part(url, self.url)
        _check_redis_url(url, self.url)
        self._asked = threading.local()  # .most: the largest value the call in this thread asked for
        parser = _bounded_parser(redis.connection.DefaultParser, self._reply_limit)
        try:  # no retries: a retry would start the wait over, past the deadline
            self._r = redis.Redis.from_url(url, socket_connect_timeout=connect_timeout, socket_timeout=io_timeout,
                                           retry=Retry(NoBackoff(), 0), parser_class=parser)
        except (ValueError, TypeError):  # redis-py's words may quote any part of the URL: not printed
            raise UsageError(f"remote {self.url!r} is not a URL redis-py reads (redis://host:port/db, a password "
                             "as :PASSWORD@ before the host)") from None
        self._scripts: dict[str, Any] = {}

    def set_deadline(self, seconds: float | None) -> None:
        self._expired = False
        self.deadline.set(seconds, self._expire)

    def _expire(self) -> None:
        """The deadline is over: shut every connection down, so that a read waiting on one ends now."""
        self._expired = True
        pool = self._r.connection_pool
        conns = [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]
        for conn in conns:
            sock = getattr(conn, "_sock", None)
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _reply_limit(self) -> int:
        """The most bytes of a reply kcache holds unfinished: the largest value the call asked for, and a chunk."""
        return max(getattr(self._asked, "most", 0), MAX_RECORD) + _REPLY_SLACK

    def _call(self, fn, *args, most: int = MAX_RECORD, **kwargs):
        """fn(*args) with every failure of the remote (an error, a reply redis-py cannot take, the
        deadline, a reply far larger than the largest value asked for, `most`) as one RemoteError."""
        self.deadline.check()
        self._asked.most = most
        try:
            return fn(*args, **kwargs)
        except KcacheError:
            raise
        except Exception as exc:  # noqa: BLE001 - a hostile server can make redis-py raise anything
            if self._expired:
                raise self.deadline.error() from None
            if isinstance(exc, (self._errors, _TooLong)):
                text = " ".join(str(exc).split()) or type(exc).__name__
            else:
                text = f"its answer is not one a Redis server gives ({type(exc).__name__})"
            raise RemoteError(f"remote {self.url}: {redact_text(text)}") from None

    def _script(self, name: str, text: str):
        if name not in self._scripts:
            self._scripts[name] = self._r.register_script(text)
        return self._scripts[name]

    def get(self, keys: Sequence[str], limit: int | Sequence[int] = MAX_RECORD) -> list[Value]:
        limits = [limit] * len(keys) if isinstance(limit, int) else list(limit)
        return self._call(self._get, list(keys), limits, most=max(limits, default=0))

    def _get(self, keys: list[str], limits: list[int]) -> list[Value]:
        script = self._script("get", _GET)
        out: list[Value] = []
        for i in range(0, len(keys), _BATCH):
            got = script(keys=keys[i:i + _BATCH], args=limits[i:i + _BATCH])
            if not isinstance(got, list) or len(got) != len(keys[i:i + _BATCH]):
                raise RemoteError(f"remote {self.url}: its answer to a read is not one value per key")
            out.extend(_value(v) for v in got)
        return out

    def put(self, items: Mapping[str, bytes], ttl: int | None = None, only_new: bool = False) -> None:
        def run() -> None:
            pipe = self._r.pipeline(transaction=False)
            for n, (k, v) in enumerate(items.items(), 1):
                pipe.set(k, v, ex=ttl, nx=only_new)
                if n % _BATCH == 0:
                    pipe.execute()
            pipe.execute()

        self._call(run)

    def publish(self, p: Publish) -> bool:
        return self.publish_many([p])[0]

    def publish_many(self, ps: Sequence[Publish]) -> list[bool]:
        """Each publish atomic (one script run), all of them in one round trip."""
        def run() -> list[bool]:
            script = self._script("publish", _PUBLISH)
            pipe = self._r.pipeline(transaction=False)
            for p in ps:
                keys = [p.key, p.index, *p.persist, *(k for k, _ in p.last)]
                args = [p.value, p.index_field, p.index_value, len(p.persist), *(v for _, v in p.last)]
                script(keys=keys, args=args, client=pipe)
            return [bool(r) for r in pipe.execute()]

        return self._call(run)

    def delete(self, keys: Sequence[str]) -> None:
        def run() -> None:
            for i in range(0, len(keys), _BATCH):
                if keys[i:i + _BATCH]:
                    self._r.delete(*keys[i:i + _BATCH])

        self._call(run)

    def hash_scan(self, name: str, limit: int = MAX_RECORD) -> Iterator[list[tuple[str, Value]]]:
        """The hash's fields and values a batch at a time (a value over `limit` as its size)."""
        script = self._script("hscan", _HSCAN)
        cursor: object = 0
        seen: set[object] = set()
        while True:
            reply = self._call(script, keys=[name], args=[cursor, SCAN_BATCH, limit], most=limit)
            if not (isinstance(reply, list) and len(reply) in (2, 3) and all(isinstance(x, list) for x in reply[1:])):
                raise RemoteError(f"remote {self.url}: its answer to a scan is not one")
            cursor, kv, long = (*reply, [])[:3]  # (the names left out: none from a server that says none)
            self._no_circle(cursor, seen)
            for head, n in zip(long[::2], long[1::2]):
                skipped_field(self, name, f"{bytes(head).decode('utf-8', 'replace')}...", f"a name of {n} bytes")
            yield [(k.decode("utf-8", "replace"), _value(v)) for k, v in zip(kv[::2], kv[1::2])
                   if isinstance(k, bytes)]
            if cursor in (0, b"0", "0"):
                return

    def hash_values(self, name: str, fields: Sequence[str], limit: int = MAX_RECORD) -> list[Value]:
        if not fields:
            return []
        got = self._call(self._script("hmget", _HMGET), keys=[name], args=[limit, *fields], most=limit)
        if not isinstance(got, list) or len(got) != len(fields):
            raise RemoteError(f"remote {self.url}: its answer to a read is not one value per field")
        return [_value(v) for v in got]

    def hash_set(self, name: str, mapping: Mapping[str, bytes]) -> None:
        if mapping:
            self._call(self._r.hset, name, mapping=dict(mapping))

    def hash_delete(self, name: str, fields: Sequence[str]) -> None:
        if fields:
            self._call(self._r.hdel, name, *fields)

    def keys(self, pattern: str) -> Iterator[str]:
        cursor: object = 0
        seen: set[object] = set()
        while True:
            cursor, found = self._call(self._r.scan, cursor=cursor, match=pattern, count=1000)
            self._no_circle(cursor, seen)
            for k in found:
                yield k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
            if cursor in (0, b"0", "0"):
                return

    def _no_circle(self, cursor: object, seen: set[object]) -> None:
        """A scan's cursor never comes back (Redis walks its table once): one that does is a server
        that would keep the scan going for ever."""
        if cursor in seen and cursor not in (0, b"0", "0"):
            raise RemoteError(f"remote {self.url}: its scan goes round in circles (cursor {str(cursor)[:20]})")
        seen.add(cursor)

    def close(self) -> None:
        self.deadline.cancel()
        try:
            self._r.close()
        except Exception:  # noqa: BLE001,S110 - closing a connection a hostile server broke
            pass


# ---- a shared directory --------------------------------------------------------------------------

_PENDING = ".pending-"  # data not yet published; removed by prune when older than PENDING_TTL


def _file_name(key: str) -> str:
    name = key.replace("%", "%25").replace("/", "%2F")
    if len(name.encode()) > 200:  # a file name holds 255 bytes (with .pending- before it)

        name = name.encode()[:120].decode("utf-8", "ignore") + "~" + hashlib.sha256(name.encode()).hexdigest()
    return name


def _key_of(name: str) -> str:
    return name.replace("%2F", "/").replace("%25", "%")


class FileStore:
    """Keys as files in one directory (NFS-safe: new files are written aside and linked into place,
    which fails if the name exists, so publishing is atomic and no-replace).

    Every read, write, rename and unlink goes through a descriptor of the store's directory held from
    the start (fswrite): the hash directories (`kcache:v1:index.d`, `pulled.d`) are opened beneath it
    without following a link, so a member who plants a link in their place makes the command fail with
    one line, never read, write or unlink where it points. A link, FIFO or folder where a value belongs is
    NotAValue, never read: a hash field is skipped with a warning, a record refused. Reads are bounded and
    checked against the command's deadline between files."""

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)
        self.url = "file://" + self.path
        self.warn: Warn = lambda m: None
        try:
            self.fd = fswrite.open_root(self.path)
        except OSError:
            raise RemoteError(f"remote {self.url}: no such directory") from None
        self.deadline = Deadline(self.url)

    def set_deadline(self, seconds: float | None) -> None:
        self.deadline.set(seconds)  # checked between files: a local file system answers each read

    def _fail(self, what: str, name: str, exc: OSError) -> RemoteError:
        why = ("a symlink or not a directory (kcache never follows one in a remote)"
               if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV) else exc.strerror or str(exc))
        return RemoteError(f"remote {self.url}: cannot {what} {name}: {why}")

    def _bounded(self, name: str, limit: int, dir_fd: int | None = None) -> Value:
        """The file's bytes, or its size when over `limit` (not read), or None when there is none."""
        self.deadline.check()
        fd = self.fd if dir_fd is None else dir_fd
        try:  # a shared directory may hold anything: never a FIFO or a link, never unbounded
            return read_bytes(name, limit, dir_fd=fd)
        except FileNotFoundError:
            return None
        except NotRegularFile as exc:
            return NotAValue(exc.kind)
        except TooLarge:
            try:
                return max(os.stat(name, dir_fd=fd, follow_symlinks=False).st_size, limit + 1)
            except OSError:
                return limit + 1
        except OSError as exc:
            raise self._fail("read", name, exc) from None

    def _present(self, name: str, dir_fd: int) -> Value:
        """0 for a regular file (not read), NotAValue for anything else, None when there is none."""
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("check", name, exc) from None
        return 0 if stat.S_ISREG(mode) else NotAValue(kind_of(mode))

    def get(self, keys: Sequence[str], limit: int | Sequence[int] = MAX_RECORD) -> list[Value]:
        limits = [limit] * len(keys) if isinstance(limit, int) else list(limit)
        return [self._bounded(_file_name(k), n) for k, n in zip(keys, limits)]

    def _write(self, dir_fd: int, final: str, data: bytes, replace: bool = True) -> bool:
        tmp = fswrite.temp_name(".tmp-")
        try:
            fswrite.write_file(dir_fd, tmp, data)
            if replace:
                fswrite.rename_at(dir_fd, tmp, dir_fd, final)
                return True
            try:
                fswrite.link_at(dir_fd, tmp, dir_fd, final)
                return True
            except FileExistsError:
                return False
        except OSError as exc:
            raise self._fail("write", final, exc) from None
        finally:
            if not replace:
                try:
                    fswrite.unlink_at(dir_fd, tmp)
                except OSError:
                    pass

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._fail("check", name, exc) from None

    def put(self, items: Mapping[str, bytes], ttl: int | None = None, only_new: bool = False) -> None:
        for k, v in items.items():
            name = _file_name(k)
            if only_new and self._exists(name):
                continue
            self._write(self.fd, (_PENDING if ttl else "") + name, v)

    def publish_many(self, ps: Sequence[Publish]) -> list[bool]:
        return [self.publish(p) for p in ps]

    def publish(self, p: Publish) -> bool:
        # The data first: a reader who sees the record must find it. Data keys hold their bytes'
        # sha256, so a pusher that then loses the race made permanent only bytes the winner has too,
        # or keys it removes itself (push does).
        for k in p.persist:
            name = _file_name(k)
            try:
                fswrite.rename_at(self.fd, _PENDING + name, self.fd, name)
            except FileNotFoundError:
                pass  # made permanent by an earlier publish of the same bytes
            except OSError as exc:
                raise self._fail("publish", name, exc) from None
        if not self._write(self.fd, _file_name(p.key), p.value, replace=False):
            return False
        for k, v in p.last:
            self._write(self.fd, _file_name(k), v)
        self.hash_set(p.index, {p.index_field: p.index_value})
        return True

    def delete(self, keys: Sequence[str]) -> None:
        for k in keys:
            for name in (_file_name(k), _PENDING + _file_name(k)):
                try:
                    fswrite.unlink_at(self.fd, name)
                except OSError as exc:
                    raise self._fail("remove", name, exc) from None

    def _hdir(self, name: str, create: bool = False) -> int | None:
        """A descriptor of the hash `name`'s directory, beneath the store, no link followed (None: none yet)."""
        d = _file_name(name) + ".d"
        try:
            return fswrite.open_dir(self.fd, d, create=create)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("open", d, exc) from None

    def hash_scan(self, name: str, limit: int = MAX_RECORD) -> Iterator[list[tuple[str, Value]]]:
        """The hash's fields and values a batch at a time (a value over `limit` as its size)."""
        d = self._hdir(name)
        if d is None:
            return
        try:
            batch: list[tuple[str, Value]] = []
            for n in os.listdir(d):
                if n.startswith("."):
                    continue
                v = self._bounded(n, limit, d) if limit else self._present(n, d)
                if isinstance(v, NotAValue):
                    skipped_field(self, name, _key_of(n), f"{v.what}, not a value")
                elif v is not None:
                    batch.append((_key_of(n), v))
                if len(batch) >= SCAN_BATCH:
                    yield batch
                    batch = []
            if batch:
                yield batch
        finally:
            os.close(d)

    def hash_values(self, name: str, fields: Sequence[str], limit: int = MAX_RECORD) -> list[Value]:
        d = self._hdir(name)
        if d is None:
            return [None] * len(fields)
        try:
            got = [self._bounded(_file_name(f), limit, d) for f in fields]
        finally:
            os.close(d)
        for f, v in zip(fields, got):
            if isinstance(v, NotAValue):
                skipped_field(self, name, f, f"{v.what}, not a value")
        return [None if isinstance(v, NotAValue) else v for v in got]

    def hash_set(self, name: str, mapping: Mapping[str, bytes]) -> None:
        d = self._hdir(name, create=True)
        assert d is not None
        try:
            for f, v in mapping.items():
                self._write(d, _file_name(f), v)
        finally:
            os.close(d)

    def hash_delete(self, name: str, fields: Sequence[str]) -> None:
        d = self._hdir(name)
        if d is None:
            return
        try:
            for f in fields:
                try:
                    fswrite.unlink_at(d, _file_name(f))
                except OSError as exc:
                    raise self._fail("remove", _file_name(f), exc) from None
        finally:
            os.close(d)

    def keys(self, pattern: str) -> Iterator[str]:
        for n in os.listdir(self.fd):
            if not n.startswith(".") and not n.endswith(".d"):
                key = _key_of(n)
                if fnmatch.fnmatchcase(key, pattern):
                    yield key

    def remove_stale_pending(self, older_than: float = PENDING_TTL) -> int:
        """Remove the data files of pushes that never published (their pusher died), as Redis
        expires them; returns how many. Only kcache's own pending and temp names are touched."""
        removed = 0
        now = time.time()
        for n in os.listdir(self.fd):
            if n.startswith((_PENDING, ".tmp-")):
                try:
                    if now - os.stat(n, dir_fd=self.fd, follow_symlinks=False).st_mtime > older_than:
                        removed += fswrite.unlink_at(self.fd, n)
                except OSError:
                    pass
        return removed

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

