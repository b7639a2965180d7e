"""Where a remote cache keeps its keys: a Redis server, or a shared directory (NFS) for sites without one.

A Store is a small key-value interface, Redis-flavoured, that push and pull need and no more:
values by key, new values with a time to live (data not yet published expires if its pusher dies),
one atomic publish (SET NX of the record that makes an entry visible, together with its index
field, the PERSIST of its data and the keys a layout wants written last), hashes for the index and
the last-pulled times, and key listing by pattern (for entries a foreign tool such as Triton pushed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kcache_cli.errors import KcacheError, UsageError

CONNECT_TIMEOUT = 2.0  # seconds: a remote that does not answer this fast is down, for a build
IO_TIMEOUT = 30.0  # seconds for one command (big values travel in one)
PENDING_TTL = 24 * 3600  # data written before its record expires after this, unless published


class RemoteError(KcacheError):
    """The remote is down, slow, refused us, or holds something unreadable (exit 1)."""


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


class Store(Protocol):
    url: str  # without any password

    def get(self, keys: Sequence[str]) -> list[bytes | None]: ...

    def put(self, items: Mapping[str, bytes], ttl: int | None = None, only_new: bool = False) -> None: ...

    def publish(self, p: Publish) -> bool: ...

    def publish_many(self, ps: Sequence[Publish]) -> list[bool]: ...

    def delete(self, keys: Sequence[str]) -> None: ...

    def hash_get(self, name: str) -> dict[str, bytes]: ...

    def hash_set(self, name: str, mapping: Mapping[str, bytes]) -> None: ...

    def hash_delete(self, name: str, fields: Sequence[str]) -> None: ...

    def keys(self, pattern: str) -> Iterator[str]: ...

    def close(self) -> None: ...


def redact(url: str) -> str:
    """`url` without its password (it goes into messages and JSON)."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def open_store(url: str, connect_timeout: float = CONNECT_TIMEOUT, io_timeout: float = IO_TIMEOUT) -> Store:
    """The store at `url`: redis://[user:password@]host:port/db, rediss://... (TLS), or file:///path."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url, connect_timeout, io_timeout)
    if url.startswith("file://"):
        path = url[len("file://"):]
        if not path.startswith("/"):
            raise UsageError(f"remote {url!r}: a file:// remote needs an absolute path (file:///shared/kcache)")
        return FileStore(path)
    raise UsageError(f"remote {redact(url)!r}: use redis://host:port/db, rediss://... or file:///path")


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
_BATCH = 256  # keys per round trip


class RedisStore:
    """A Redis server through redis-py (imported here only)."""

    def __init__(self, url: str, connect_timeout: float = CONNECT_TIMEOUT, io_timeout: float = IO_TIMEOUT) -> None:
        try:
            import redis
        except ImportError:
            raise KcacheError("the redis client is not installed (pip install redis)") from None
        self.url = redact(url)
        self._errors = redis.exceptions.RedisError
        try:
            self._r = redis.Redis.from_url(url, socket_connect_timeout=connect_timeout, socket_timeout=io_timeout)
        except ValueError as exc:
            raise UsageError(f"remote {self.url!r}: {exc}") from None
        self._script: Any = None

    def _fail(self, exc: Exception) -> RemoteError:
        text = " ".join(str(exc).split()) or type(exc).__name__
        return RemoteError(f"remote {self.url}: {text}")

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        try:
            out: list[bytes | None] = []
            for i in range(0, len(keys), _BATCH):
                out.extend(self._r.mget(keys[i:i + _BATCH]))  # type: ignore[arg-type]
            return out
        except self._errors as exc:
            raise self._fail(exc) from None

    def put(self, items: Mapping[str, bytes], ttl: int | None = None, only_new: bool = False) -> None:
        try:
            pipe = self._r.pipeline(transaction=False)
            for n, (k, v) in enumerate(items.items(), 1):
                pipe.set(k, v, ex=ttl, nx=only_new)
                if n % _BATCH == 0:
                    pipe.execute()
            pipe.execute()
        except self._errors as exc:
            raise self._fail(exc) from None

    def publish(self, p: Publish) -> bool:
        return self.publish_many([p])[0]

    def publish_many(self, ps: Sequence[Publish]) -> list[bool]:
        """Each publish atomic (one script run), all of them in one round trip."""
        try:
            if self._script is None:
                self._script = self._r.register_script(_PUBLISH)
            pipe = self._r.pipeline(transaction=False)
            for p in ps:
                keys = [p.key, p.index, *p.persist, *(k for k, _ in p.last)]
                args = [p.value, p.index_field, p.index_value, len(p.persist), *(v for _, v in p.last)]
                self._script(keys=keys, args=args, client=pipe)
            return [bool(r) for r in pipe.execute()]
        except self._errors as exc:
            raise self._fail(exc) from None

    def delete(self, keys: Sequence[str]) -> None:
        try:
            for i in range(0, len(keys), _BATCH):
                if keys[i:i + _BATCH]:
                    self._r.delete(*keys[i:i + _BATCH])
        except self._errors as exc:
            raise self._fail(exc) from None

    def hash_get(self, name: str) -> dict[str, bytes]:
        try:
            return {k.decode("utf-8", "replace"): v for k, v in self._r.hscan_iter(name, count=1000)}
        except self._errors as exc:
            raise self._fail(exc) from None

    def hash_set(self, name: str, mapping: Mapping[str, bytes]) -> None:
        try:
            if mapping:
                self._r.hset(name, mapping=dict(mapping))  # type: ignore[arg-type]
        except self._errors as exc:
            raise self._fail(exc) from None

    def hash_delete(self, name: str, fields: Sequence[str]) -> None:
        try:
            if fields:
                self._r.hdel(name, *fields)
        except self._errors as exc:
            raise self._fail(exc) from None

    def keys(self, pattern: str) -> Iterator[str]:
        try:
            for k in self._r.scan_iter(match=pattern, count=1000):
                yield k.decode("utf-8", "replace")
        except self._errors as exc:
            raise self._fail(exc) from None

    def close(self) -> None:
        try:
            self._r.close()
        except self._errors:
            pass


# ---- a shared directory --------------------------------------------------------------------------

_PENDING = ".pending-"  # data not yet published; removed by prune when older than PENDING_TTL


def _file_name(key: str) -> str:
    name = key.replace("%", "%25").replace("/", "%2F")
    if len(name.encode()) > 200:  # a file name holds 255 bytes (with .pending- before it)
        import hashlib

        name = name.encode()[:120].decode("utf-8", "ignore") + "~" + hashlib.sha256(name.encode()).hexdigest()
    return name


def _key_of(name: str) -> str:
    return name.replace("%2F", "/").replace("%25", "%")


class FileStore:
    """Keys as files in one directory (NFS-safe: new files are written aside and linked into place,
    which fails if the name exists, so publishing is atomic and no-replace).

    Every read, write, rename and unlink goes through a descriptor of the store's directory held from
    the start (fswrite): the hash directories (`kcache:v1:index.d`, `pulled.d`) are opened beneath it
    without following a link, so a member who plants a link there makes the command fail with one
    line, never read, write or unlink where it points."""

    def __init__(self, path: str) -> None:
        from kcache_cli import fswrite

        self.path = os.path.realpath(path)
        self.url = "file://" + self.path
        try:
            self.fd = fswrite.open_root(self.path)
        except OSError:
            raise RemoteError(f"remote {self.url}: no such directory") from None

    def _fail(self, what: str, name: str, exc: OSError) -> RemoteError:
        import errno

        why = ("a symlink or not a directory (kcache never follows one in a remote)"
               if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV) else exc.strerror or str(exc))
        return RemoteError(f"remote {self.url}: cannot {what} {name}: {why}")

    def _read(self, name: str, dir_fd: int | None = None) -> bytes | None:
        from kcache_cli.fsread import read_bytes

        try:  # a shared directory may hold anything: never a FIFO or a link, never unbounded
            return read_bytes(name, 1 << 30, dir_fd=self.fd if dir_fd is None else dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read", name, exc) from None

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self._read(_file_name(k)) for k in keys]

    def _write(self, dir_fd: int, final: str, data: bytes, replace: bool = True) -> bool:
        from kcache_cli import fswrite

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
        from kcache_cli import fswrite

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
        from kcache_cli import fswrite

        for k in keys:
            for name in (_file_name(k), _PENDING + _file_name(k)):
                try:
                    fswrite.unlink_at(self.fd, name)
                except OSError as exc:
                    raise self._fail("remove", name, exc) from None

    def _hdir(self, name: str, create: bool = False) -> int | None:
        """A descriptor of the hash `name`'s directory, beneath the store, no link followed (None: none yet)."""
        from kcache_cli import fswrite

        d = _file_name(name) + ".d"
        try:
            return fswrite.open_dir(self.fd, d, create=create)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("open", d, exc) from None

    def hash_get(self, name: str) -> dict[str, bytes]:
        d = self._hdir(name)
        if d is None:
            return {}
        out = {}
        try:
            for n in os.listdir(d):
                if not n.startswith("."):
                    v = self._read(n, d)
                    if v is not None:
                        out[_key_of(n)] = v
        finally:
            os.close(d)
        return out

    def hash_set(self, name: str, mapping: Mapping[str, bytes]) -> None:
        d = self._hdir(name, create=True)
        assert d is not None
        try:
            for f, v in mapping.items():
                self._write(d, _file_name(f), v)
        finally:
            os.close(d)

    def hash_delete(self, name: str, fields: Sequence[str]) -> None:
        from kcache_cli import fswrite

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
        import fnmatch

        for n in os.listdir(self.fd):
            if not n.startswith(".") and not n.endswith(".d"):
                key = _key_of(n)
                if fnmatch.fnmatchcase(key, pattern):
                    yield key

    def remove_stale_pending(self, older_than: float = PENDING_TTL) -> int:
        """Remove the data files of pushes that never published (their pusher died), as Redis
        expires them; returns how many. Only kcache's own pending and temp names are touched."""
        import time

        from kcache_cli import fswrite

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

