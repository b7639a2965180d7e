"""Signed entries: who may publish the binaries a fleet loads (docs/remote.md).

Anyone who can write the remote can publish a `lib.so` or `.cubin` that every node pulling from it
then loads: without a trust list, write access to the remote is code execution on the fleet. With
one, `pull`, `build --remote` and `import` take only records signed by a listed key.

- The node's key: an Ed25519 private key made by `kcache remote keygen`, at
  `$XDG_CONFIG_HOME/kcache/signing.key` (~/.config/kcache/...; KCACHE_SIGNING_KEY names another
  file), mode 0600 and owned by the user, as ssh wants its keys. `push` (and `build --remote`) and
  `export` sign every record with it when it exists.
- The trust list: public keys (`ed25519:<base64>`, one per line, `#` comments) in
  `KCACHE_TRUSTED_KEYS` (separated by commas or blanks) or else in `$XDG_CONFIG_HOME/kcache/trusted_keys`,
  which must not be writable by others. Set, it makes every unsigned, foreign-signed or altered
  record a refusal. A trust file that exists trusts only the keys it lists: one whose keys were all
  revoked (commented out) or removed refuses every record, and says so in one line (fail closed).
- What is signed: the record as pushed (JSON, keys sorted, compact), without its "signature"
  field. The record names every file's size and sha256, which pull checks, so the signature covers
  the bytes too.

`cryptography` is imported only here, and only by the commands that sign or verify."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path
from typing import Any

from kcache_cli.util.errors import KcacheError, UsageError

PREFIX = "ed25519:"
SIGNATURE = "signature"  # the record's field: {"key": "ed25519:...", "sig": "<base64>"}
KEY_FILE = "signing.key"
TRUST_FILE = "trusted_keys"
MAX_CONFIG = 1 << 20


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "kcache"


def key_path() -> Path:
    return Path(os.environ.get("KCACHE_SIGNING_KEY") or config_dir() / KEY_FILE)


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise KcacheError("signed entries need the cryptography package (pip install cryptography)") from None
    return ed25519


def public_text(raw: bytes) -> str:
    return PREFIX + base64.b64encode(raw).decode()


def make_key(path: Path | None = None) -> tuple[Path, str]:
    """Make the node's signing key (never over an existing file); (its path, its public key)."""
    from cryptography.hazmat.primitives import serialization

    path = path or key_path()
    key = _crypto().Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise KcacheError(f"{path} exists already: kcache never replaces a signing key "
                          f"(its public key: {public_text(_public_raw(load_key(path)))})") from None
    try:
        from kcache_cli.fs.write import write_all

        write_all(fd, pem)  # os.write may write less than asked
        os.fsync(fd)
    finally:
        os.close(fd)
    return path, public_text(_public_raw(key))


def _public_raw(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _read_own(path: Path, what: str, secret: bool) -> bytes | None:
    """A config file of the user's own, never a link or a FIFO; None when there is none. A secret
    must not be readable, and no file writable, by anyone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KcacheError(f"cannot read the {what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        bad = 0o077 if secret else 0o022
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & bad or st.st_size > MAX_CONFIG:
            raise KcacheError(f"the {what} {path} must be a regular file of yours that no one else can "
                              f"{'read or write' if secret else 'write'} (chmod {'600' if secret else '644'})")
        return os.read(fd, MAX_CONFIG)
    finally:
        os.close(fd)


def load_key(path: Path | None = None):
    """The node's private key, or None when it has none."""
    from cryptography.hazmat.primitives import serialization

    path = path or key_path()
    pem = _read_own(path, "signing key", secret=True)
    if pem is None:
        return None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise KcacheError(f"the signing key {path} is not a PEM private key") from None
    if not isinstance(key, _crypto().Ed25519PrivateKey):
        raise KcacheError(f"the signing key {path} is not an Ed25519 key")
    return key


def canonical(record: dict) -> bytes:
    """What a signature covers: the record without its signature, keys sorted, compact."""
    return json.dumps({k: v for k, v in record.items() if k != SIGNATURE}, sort_keys=True,
                      separators=(",", ":")).encode()


class Signer:
    """Signs records with the node's key (push)."""

    def __init__(self, key) -> None:
        self.key = key
        self.public = public_text(_public_raw(key))

    def sign(self, record: dict) -> dict:
        sig = self.key.sign(canonical(record))
        return {**record, SIGNATURE: {"key": self.public, "sig": base64.b64encode(sig).decode()}}


def signer() -> Signer | None:
    """The node's signer, or None when it has no key (push then sends records unsigned). A key named by
    KCACHE_SIGNING_KEY that is not there is an error: a mistyped path must not turn signing off unseen."""
    named = os.environ.get("KCACHE_SIGNING_KEY")
    if not key_path().exists() and not key_path().is_symlink():
        if named:
            raise UsageError(f"KCACHE_SIGNING_KEY names {named}, which does not exist: nothing was done (kcache "
                             "remote keygen makes a key; unset the variable to sign nothing)")
        return None
    return Signer(load_key())


def _parse_keys(text: str, where: str) -> dict[bytes, str]:
    out: dict[bytes, str] = {}
    for line in text.splitlines():
        for item in line.split("#", 1)[0].replace(",", " ").split():
            raw = None
            if item.startswith(PREFIX):
                try:
                    raw = base64.b64decode(item[len(PREFIX):], validate=True)
                except ValueError:
                    raw = None
            if raw is None or len(raw) != 32:
                raise UsageError(f"{where}: {item[:60]!r} is not a public key (ed25519:<base64 of 32 bytes>, "
                                 "as `kcache remote keygen` prints)")
            out[raw] = item
    return out


def trusted_keys() -> dict[bytes, str] | None:
    """The trust list (raw public key -> as written), or None when none is set. A trust file that
    exists is a trust list even when it lists no key (then {}: nothing is trusted)."""
    env = os.environ.get("KCACHE_TRUSTED_KEYS", "")
    if env.strip():
        return _parse_keys(env, "KCACHE_TRUSTED_KEYS")
    path = config_dir() / TRUST_FILE
    text = _read_own(path, "trust list", secret=False)
    if text is None:
        return None
    return _parse_keys(text.decode("utf-8", "replace"), str(path))


def no_key_problem() -> str:
    if os.environ.get("KCACHE_TRUSTED_KEYS", "").strip():
        return ("KCACHE_TRUSTED_KEYS lists no key (all commented out or empty): every record is refused; list a "
                "key (kcache remote keygen prints one) or unset the variable")
    return (f"the trust list ({config_dir() / TRUST_FILE}) lists no key (all revoked or removed): every record "
            "is refused; add a key (kcache remote keygen prints one) or remove the file to trust all")


class Verifier:
    """Checks records against the trust list (pull, build --remote)."""

    def __init__(self, keys: dict[bytes, str]) -> None:
        if not keys:
            raise KcacheError(no_key_problem())
        ed25519 = _crypto()
        self.keys = {raw: ed25519.Ed25519PublicKey.from_public_bytes(raw) for raw in keys}

    def problem(self, record: dict) -> str | None:
        """Why `record` is not to be taken, or None when a trusted key signed it as it is."""
        from cryptography.exceptions import InvalidSignature

        sig = record.get(SIGNATURE)
        if not isinstance(sig, dict) or not isinstance(sig.get("key"), str) or not isinstance(sig.get("sig"), str):
            return "not signed, and a trust list is set (KCACHE_TRUSTED_KEYS or trusted_keys)"
        try:
            raw = base64.b64decode(sig["key"].removeprefix(PREFIX), validate=True)
            blob = base64.b64decode(sig["sig"], validate=True)
        except ValueError:
            return "its signature is malformed"
        key = self.keys.get(raw)
        if key is None:
            return f"signed by {sig['key'][:24]}..., a key not in the trust list"
        try:
            key.verify(blob, canonical(record))
        except InvalidSignature:
            return "its signature does not match the record (altered after signing)"
        return None


def verifier() -> Verifier | None:
    """The trust list's verifier, or None when no trust list is set (every record is taken). A trust
    list with no key stops the command with one line: nothing it brings could be taken."""
    keys = trusted_keys()
    return Verifier(keys) if keys is not None else None
