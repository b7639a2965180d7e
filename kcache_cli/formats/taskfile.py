"""hidet's task.txt: the task string whose sha256 names an operator entry."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from kcache_cli.fs.read import read_bytes
from kcache_cli.util.errors import KcacheError

HASH_LEN = 16
_TENSOR = re.compile(r"^\s+(\w+): tensor\((\w+), \[([^\]]*)\]\)\s*$")
_FIELD = re.compile(r"^  (\w+):\s?(.*)$")


class TaskFormatError(KcacheError):
    pass


class TensorSpec(NamedTuple):  # NamedTuples, not frozen dataclasses: a tenth of the cost to define
    """One tensor of a task.txt: its name, dtype and shape."""

    name: str
    dtype: str
    shape: tuple[str, ...]  # strings: symbolic dims such as `n` stay as they are


class TaskInfo(NamedTuple):
    """A hidet task.txt read: the task's name, its inputs and outputs, its attributes."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attributes: str | None


def task_hash(data: bytes) -> str:
    """hidet's entry name: the first 16 hex digits of sha256 over the exact bytes of task.txt."""
    return sha256_hex(data)[:HASH_LEN]


def sha256_hex(data: bytes) -> str:
    """sha256 of small data through Python's built-in module: no OpenSSL to load (about 4 ms),
    which matters on `kcache build`'s cache-hit path."""
    return (_SHA256 or _load_sha256())(data).hexdigest()


_SHA256: Any = None


def _load_sha256() -> Any:
    # Found once: a failed import is not cached by Python, and searching sys.path for the module name
    # on every call cost a scan of 20,000 hidet entries a second.
    global _SHA256
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]  # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found]
        except ImportError:
            from hashlib import sha256
    _SHA256 = sha256
    return sha256


def _names(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_task(data: bytes, source: str = "task.txt") -> TaskInfo:
    """Parse a task string; a task without a `name:` field is a TaskFormatError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskFormatError(f"{source} is not UTF-8 text") from None
    fields: dict[str, str] = {}
    tensors: dict[str, TensorSpec] = {}
    section = None
    for line in text.splitlines():
        m = _FIELD.match(line)
        if m:
            section = m.group(1)
            fields.setdefault(section, m.group(2).strip())
            continue
        if section == "parameters":
            t = _TENSOR.match(line)
            if t:
                shape = tuple(s.strip() for s in t.group(3).split(",") if s.strip())
                tensors[t.group(1)] = TensorSpec(t.group(1), t.group(2), shape)
    name = fields.get("name", "")
    if not name or not re.fullmatch(r"[\w.\-]+", name):
        raise TaskFormatError(f"{source} has no valid `name:` field (is it a hidet task string?)")

    def specs(key: str) -> tuple[TensorSpec, ...]:
        return tuple(tensors.get(n, TensorSpec(n, "?", ())) for n in _names(fields.get(key, "")))

    return TaskInfo(name, specs("inputs"), specs("outputs"), fields.get("attributes"))


MAX_TASK_BYTES = 1 << 20  # hidet's task strings are a few KB


def read_task_file(path: str, base: str | None = None) -> bytes:
    """The exact bytes of a task file: a regular file of at most MAX_TASK_BYTES (fsread: a FIFO or
    a device such as /dev/zero is refused). Inside a cache entry (`base`) a symlink is refused too;
    a task file the user names may be a link. OSError says why it cannot be read."""
    return read_bytes(path, MAX_TASK_BYTES, base=base, follow=base is None)
