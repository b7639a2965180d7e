"""An OCI Distribution client, spoken directly over the standard library's http.client.

Why not a client package: kcache needs eight calls (ping, manifest GET/PUT/DELETE, blob HEAD/GET,
upload POST+PUT, tags/list) and needs each of them bounded in ways the usual clients leave to the
caller: every size checked before a body is read (Content-Length, then the read itself capped), one
deadline for the whole command, redirects followed only to the same host, credentials never in an
error line. oras-py and docker-py pull in requests and more at start-up for less control.

`oci://HOST[:PORT]/REPO[:TAG]` is HTTPS; `oci+http://...` plain HTTP (a loopback registry, an
air-gapped lab). Credentials: `--remote-user USER` / KCACHE_REMOTE_USER with KCACHE_REMOTE_PASSWORD,
else the Docker/Podman auth files (`$REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`,
`~/.docker/config.json`, their `auths.<host>.auth`). Basic credentials go only over HTTPS or to a
loopback host; a `WWW-Authenticate: Bearer` challenge is answered with a token from its realm."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import http.client
import json
import os
import re
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.client import HTTPException
from typing import IO, Any, NamedTuple
from urllib.parse import quote, quote_plus, urlencode, urlsplit

from kcache_cli.fs.read import parse_json, read_bytes
from kcache_cli.remote.redact import lower_scheme, redact_text
from kcache_cli.remote.store import CONNECT_TIMEOUT, IO_TIMEOUT, Deadline, RemoteError
from kcache_cli.util.errors import UsageError
from kcache_cli.util.units import is_digits

MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",  # a multi-arch tag: manifests naming images
               "application/vnd.docker.distribution.manifest.list.v2+json")
MAX_MANIFEST = 4 << 20  # bytes of an image manifest (the registry's own limit is 4 MiB)
MAX_CONFIG = 4 << 20  # bytes of an image config
MAX_JSON = 16 << 20  # bytes of any other JSON answer (a tag list, a token)
MAX_ERROR = 64 << 10  # bytes of an error body read to say what went wrong
MAX_REDIRECTS = 5
MAX_TAG_PAGES = 1000
CHUNK = 1 << 20
_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


DEFAULT_TAG = "latest"  # the tag a URL that names none means, as docker's


class OciRef(NamedTuple):
    """Where an image lives: `scheme` https or http, `host` with its port, `repo`, `tag` (None: none given),
    `digest` (`sha256:<hex>`: the image pinned, whatever tag it has; None: none given)."""

    scheme: str
    host: str
    repo: str
    tag: str | None
    digest: str | None = None

    @property
    def url(self) -> str:
        return f"oci{'+http' if self.scheme == 'http' else ''}://{self.host}/{self.repo}" + (
            f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def reference(self) -> str:
        """What the registry's manifest API is asked for: the digest when pinned, else the tag (or latest)."""
        return self.digest or self.tag or DEFAULT_TAG

    def with_tag(self, tag: str) -> OciRef:
        return self._replace(tag=tag, digest=None)

    def with_reference(self, reference: str) -> OciRef:
        """This repository's image named by `reference`, a tag or a digest."""
        return self._replace(tag=None, digest=reference) if DIGEST.match(reference) else self.with_tag(reference)


def is_oci(url: str | None) -> bool:
    return bool(url) and lower_scheme(url).startswith(("oci://", "oci+http://"))  # type: ignore[arg-type]


def parse_ref(url: str) -> OciRef:
    """`oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX]` (or oci+http://, the scheme in any case); a usage error
    naming what is wrong."""
    url = lower_scheme(url)
    scheme = "http" if url.startswith("oci+http://") else "https"
    rest = url.partition("://")[2]
    if "@" in rest.partition("/")[0] or "?" in rest or "#" in rest:  # refused before any part is quoted back
        raise UsageError("an oci:// remote takes no credentials, query or fragment in its URL (oci://HOST[:PORT]/"
                         "REPO[:TAG][@sha256:HEX]): use --remote-user and KCACHE_REMOTE_PASSWORD, or docker/podman "
                         "login")
    host, _, path = rest.partition("/")
    path, at, digest = path.partition("@")
    repo, tag = path, None
    if ":" in path.rpartition("/")[2]:
        repo, _, tag = path.rpartition(":")
    if not host or not re.fullmatch(r"[A-Za-z0-9.-]+(:\d{1,5})?|\[[0-9A-Fa-f:.]+\](:\d{1,5})?", host):
        raise UsageError(f"remote {url!r}: no registry host (oci://HOST[:PORT]/REPO:TAG)")
    if not _NAME.match(repo):
        raise UsageError(f"remote {url!r}: {repo!r} is not a repository name (lower case, e.g. team/kernels)")
    if tag is not None and not _TAG.match(tag):
        raise UsageError(f"remote {url!r}: {tag!r} is not a tag (letters, digits, '_', '.', '-'; at most 128)")
    if at and not DIGEST.match(digest):
        raise UsageError(f"remote {url!r}: {digest[:80]!r} is not a digest kcache pins by (sha256: and 64 "
                         "lower-case hex digits)")
    return OciRef(scheme, host.lower(), repo, tag, digest if at else None)


def parse_repository(url: str, command: str, note: Callable[[str], None] | None = None) -> OciRef:
    """The repository a whole-repository command (`remote ls`, `stats`, `prune`) acts on. A URL naming a
    tag (or a digest) would claim a narrower scope than such a command has (a prune of `:v2` deleting every
    tag): a usage error; for one that only reads (`note` given: ls, stats), the tag is dropped with a note
    (a KCACHE_REMOTE set to an image, as push and pull take it, still lists its repository)."""
    ref = parse_ref(url)
    if ref.tag is None and ref.digest is None:
        return ref
    repo = ref._replace(tag=None, digest=None)
    if note is None:
        raise UsageError(f"remote {ref.url}: {command} acts on every tag of a repository: name the repository "
                         f"without a tag or digest (--remote {repo.url})")
    note(f"{command} reads every tag of {repo.url}: the tag or digest of {ref.url} selects nothing")
    return repo


def _loopback(host: str) -> bool:
    name = host.rpartition(":")[0] if host.count(":") == 1 or host.startswith("[") else host
    return name.strip("[]") in ("localhost", "127.0.0.1", "::1") or name.startswith("127.")


def _auth_files() -> list[str]:
    out = [os.environ.get("REGISTRY_AUTH_FILE", "")]
    if os.environ.get("XDG_RUNTIME_DIR"):
        out.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "containers", "auth.json"))
    out.append(os.path.join(os.path.expanduser("~"), ".docker", "config.json"))
    return [p for p in out if p]


def find_credentials(host: str, user: str | None = None) -> tuple[str, str] | None:
    """(user, password) for `host`: --remote-user/KCACHE_REMOTE_USER with KCACHE_REMOTE_PASSWORD,
    else the first auth file that names the host. Never printed."""
    user = user or os.environ.get("KCACHE_REMOTE_USER")
    if user:
        return user, os.environ.get("KCACHE_REMOTE_PASSWORD", "")
    for path in _auth_files():
        try:
            doc = parse_json(read_bytes(path, 1 << 20))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        auths = doc.get("auths") if isinstance(doc, dict) else None
        entry = auths.get(host) or auths.get(f"https://{host}") if isinstance(auths, dict) else None
        token = entry.get("auth") if isinstance(entry, dict) else None
        try:
            name, sep, password = base64.b64decode(str(token or ""), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            continue
        if sep and name:
            return name, password
    return None


@dataclass
class Answer:
    """A registry's HTTP answer: status, headers and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _Where(NamedTuple):
    scheme: str
    host: str
    target: str  # path and query


class _Open(NamedTuple):
    conn: http.client.HTTPConnection
    resp: http.client.HTTPResponse


class Registry:
    """One registry repository, every call under the command's deadline and the per-read timeout."""

    def __init__(self, ref: OciRef, connect_timeout: float = CONNECT_TIMEOUT, io_timeout: float = IO_TIMEOUT,
                 user: str | None = None) -> None:
        self.ref = ref
        self.url = ref.url
        self.connect_timeout, self.io_timeout = connect_timeout, io_timeout
        self.deadline = Deadline(self.url)
        self._creds = find_credentials(ref.host, user)
        self._auth: str | None = None  # the Authorization header that worked
        self._conn: Any = None  # the connection in use: shut down when the deadline passes
        self._expired = False

    def set_deadline(self, seconds: float | None) -> None:
        self._expired = False
        self.deadline.set(seconds, self._expire)

    def _expire(self) -> None:
        """The deadline is over: shut the connection down, so that a read waiting on it (a server
        trickling its headers a byte at a time) ends now."""
        self._expired = True
        sock = getattr(self._conn, "sock", None)
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.deadline.cancel()

    # -- HTTP ------------------------------------------------------------------------------------
    def _timeout(self) -> float:
        self.deadline.check()
        left = self.deadline.left()
        return self.io_timeout if left is None else max(min(self.io_timeout, left), 0.01)

    def _connect(self, method: str, where: _Where, headers: dict[str, str], body) -> _Open:
        timeout = self._timeout()
        cls = http.client.HTTPSConnection if where.scheme == "https" else http.client.HTTPConnection
        conn = cls(where.host, timeout=min(timeout, self.connect_timeout))
        self._conn = conn
        try:
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request(method, where.target, body=body, headers=headers)
            return _Open(conn, conn.getresponse())
        except BaseException:
            conn.close()
            raise

    def _fail(self, what: str, exc: BaseException) -> RemoteError:
        if self._expired or isinstance(exc, (socket.timeout, TimeoutError)) and (self.deadline.left() or 1) <= 0:
            return self.deadline.error()
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        return RemoteError(f"remote {self.url}: {what}: {text}")

    def _same_host(self, location: str) -> str:
        """The request target of a redirect or upload location: a path on this registry, never another host."""
        parts = urlsplit(location)
        if parts.scheme or parts.netloc:
            if parts.scheme != self.ref.scheme or parts.netloc.lower() != self.ref.host:
                raise RemoteError(f"remote {self.url}: it sent us to another host ({parts.netloc[:80]!r}); "
                                  "kcache follows redirects only on the same registry")
        if not parts.path.startswith("/"):
            raise RemoteError(f"remote {self.url}: it sent us to {location[:80]!r}, not a path")
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def _follow(self, location: str, here: _Where, method: str) -> _Where:
        """Where a redirect sends a request: this registry; or, for a GET (a blob a registry serves from
        its storage's own host), an HTTPS host KCACHE_REMOTE_REDIRECTS allows (glob patterns, commas)."""
        parts = urlsplit(location)
        if not (parts.scheme or parts.netloc):
            return here._replace(target=self._same_host(location))
        host = parts.netloc.lower()
        allowed = [p.strip().lower() for p in os.environ.get("KCACHE_REMOTE_REDIRECTS", "").split(",") if p.strip()]
        if (parts.scheme, host) == (self.ref.scheme, self.ref.host):
            return _Where(parts.scheme, host, self._same_host(location))
        if method == "GET" and parts.scheme == "https" and "@" not in host and any(
                fnmatch.fnmatchcase(host, p) for p in allowed):
            return _Where("https", host, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        raise RemoteError(f"remote {self.url}: it sent us to another host ({parts.netloc[:80]!r}); kcache follows "
                          "redirects only on the same registry unless KCACHE_REMOTE_REDIRECTS allows the host")

    def request(self, method: str, target: str, *, headers: dict[str, str] | None = None, body=None,
                limit: int = MAX_JSON, ok: tuple[int, ...] = (200,), sink: IO[bytes] | None = None,
                what: str = "") -> Answer:
        """One call: redirects followed on this registry (or to an allowed host, without our credentials),
        a 401 answered once with credentials or a token; the body read only when its announced size is
        within `limit` (into `sink` when given)."""
        where = _Where(self.ref.scheme, self.ref.host, target)
        tried_auth = False
        for _ in range(MAX_REDIRECTS + 1):
            home = (where.scheme, where.host) == (self.ref.scheme, self.ref.host)
            sent = {**(headers or {}), **({"Authorization": self._auth} if self._auth and home else {})}
            try:
                opened = self._connect(method, where, sent, body)
            except RemoteError:
                raise
            except (OSError, ValueError, HTTPException) as exc:
                raise self._fail(what or f"{method} {target}", exc) from None
            try:
                resp = opened.resp
                status = resp.status
                got = {k.lower(): v for k, v in resp.getheaders()}
                if status in (301, 302, 303, 307, 308) and "location" in got:
                    where = self._follow(got["location"], where, method)
                    if status == 303:
                        method, body = "GET", None
                    continue
                if status == 401 and home and not tried_auth and self._authorize(got.get("www-authenticate", "")):
                    tried_auth = True
                    continue
                if status not in ok:
                    raise self._status_error(status, resp, what or f"{method} {target}")
                data = self._read(resp, got, limit, sink, what or target) if method != "HEAD" else b""
                return Answer(status, got, data)
            except (OSError, ValueError, HTTPException) as exc:
                raise self._fail(what or f"{method} {target}", exc) from None
            finally:
                opened.conn.close()
        raise RemoteError(f"remote {self.url}: more than {MAX_REDIRECTS} redirects")

    def _status_error(self, status: int, resp, what: str) -> RemoteError:
        try:
            raw = resp.read(MAX_ERROR)
            errors = json.loads(raw).get("errors") or []
            detail = "; ".join(str(e.get("message") or e.get("code")) for e in errors[:3] if isinstance(e, dict))
        except (OSError, ValueError, AttributeError, HTTPException):
            detail = ""
        if status == 401:
            detail = detail or "credentials needed (--remote-user, KCACHE_REMOTE_PASSWORD, or docker login)"
        text = self._scrub(redact_text(" ".join(detail.split())[:200])) or "no reason given"
        return RemoteError(f"remote {self.url}: {what}: HTTP {status}: {text}")

    def _scrub(self, text: str) -> str:
        """`text` (a registry's words) without our password or the header that carries it, should it echo them:
        as sent, URL-encoded (once or twice, a space as + too) and in any case."""
        if self._creds is None:
            return text
        password = self._creds[1]
        forms = {password, base64.b64encode(":".join(self._creds).encode()).decode()}
        for _ in range(2):
            forms |= {quote(f, safe="") for f in forms} | {quote_plus(f) for f in forms}
        for secret in sorted((f for f in forms if f), key=len, reverse=True):  # the longest first: none left half
            text = re.sub(re.escape(secret), "***", text, flags=re.IGNORECASE)
        return text

    def _read(self, resp, headers: Mapping[str, str], limit: int, sink: IO[bytes] | None, what: str) -> bytes:
        """The body, at most `limit` bytes: a Content-Length over it is refused before reading, and a
        body that runs past it (whatever it announced) is cut off and refused."""
        length = headers.get("content-length")
        if length is not None:
            if not is_digits(length.strip()):
                raise RemoteError(f"remote {self.url}: {what}: a Content-Length that is not a number")
            if int(length) > limit:
                raise RemoteError(f"remote {self.url}: {what}: it announces {int(length)} bytes, over the "
                                  f"limit of {limit}")
        out = []
        got = 0
        while True:
            self._timeout()
            chunk = resp.read1(min(CHUNK, limit + 1 - got))  # what has come: the deadline is checked between
            if not chunk:
                break
            got += len(chunk)
            if got > limit:
                raise RemoteError(f"remote {self.url}: {what}: it sent more than the limit of {limit} bytes")
            (sink.write(chunk) if sink is not None else out.append(chunk))
            if got == limit and length is not None:
                break
        if length is not None and got != int(length):
            raise RemoteError(f"remote {self.url}: {what}: it sent {got} bytes of the {int(length)} it announced")
        return b"".join(out)

    # -- auth ------------------------------------------------------------------------------------
    def _authorize(self, challenge: str) -> bool:
        """Set the Authorization header a 401 asks for; False when there is nothing to answer it with."""
        scheme, _, params = challenge.strip().partition(" ")
        if scheme.lower() == "basic":
            if self._creds is None or not self._may_send_password():
                return False
            self._auth = "Basic " + base64.b64encode(":".join(self._creds).encode()).decode()
            return True
        if scheme.lower() == "bearer":
            fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
            token = self._token(fields)
            if token:
                self._auth = f"Bearer {token}"
                return True
        return False

    def _may_send_password(self) -> bool:
        return self.ref.scheme == "https" or _loopback(self.ref.host)

    def _token(self, fields: dict[str, str]) -> str | None:
        """A bearer token from the challenge's realm (HTTPS, or this registry's own host)."""
        realm = urlsplit(fields.get("realm", ""))
        if realm.scheme not in ("https", "http") or (realm.scheme == "http" and realm.netloc.lower() != self.ref.host):
            return None
        query = urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
        headers = {}
        if self._creds is not None and self._may_send_password():
            headers["Authorization"] = "Basic " + base64.b64encode(":".join(self._creds).encode()).decode()
        where = _Where(realm.scheme, realm.netloc, (realm.path or "/") + (f"?{query}" if query else ""))
        try:  # connected as every call is: the deadline shuts it down under a realm that trickles
            opened = self._connect("GET", where, headers, None)
        except (OSError, ValueError, HTTPException):
            return None
        try:
            resp = opened.resp
            if resp.status != 200:
                return None
            got = {k.lower(): v for k, v in resp.getheaders()}
            doc = json.loads(self._read(resp, got, MAX_JSON, None, "token"))
            token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
            return token if isinstance(token, str) and token and "\n" not in token else None
        except (OSError, ValueError, HTTPException):
            return None
        finally:
            opened.conn.close()

    # -- the Distribution API ----------------------------------------------------------------------
    def _v2(self, rest: str) -> str:
        return f"/v2/{self.ref.repo}/{rest}"

    def ping(self) -> None:
        self.request("GET", "/v2/", limit=MAX_ERROR, what="the registry API (/v2/)")

    def get_manifest(self, reference: str, accept: tuple[str, ...] = MANIFEST_TYPES) -> tuple[bytes, str, str]:
        """(bytes, media type, digest) of the manifest a tag or digest names; the digest checked when asked by one."""
        ans = self.request("GET", self._v2(f"manifests/{reference}"), limit=MAX_MANIFEST,
                           headers={"Accept": ", ".join(accept)}, what=f"the manifest of {reference}")
        digest = "sha256:" + hashlib.sha256(ans.body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RemoteError(f"remote {self.url}: the manifest it sent for {reference[:19]}… has another digest")
        return ans.body, ans.headers.get("content-type", "").split(";")[0].strip(), digest

    def manifest_digest(self, tag: str) -> str | None:
        """The digest a tag names now (HEAD), or None when there is no such tag."""
        ans = self.request("HEAD", self._v2(f"manifests/{tag}"), ok=(200, 404),
                           headers={"Accept": ", ".join(MANIFEST_TYPES)}, what=f"the manifest of {tag}")
        digest = ans.headers.get("docker-content-digest", "")
        return digest if ans.status == 200 and DIGEST.match(digest) else None

    def get_blob(self, digest: str, size: int, limit: int, sink: IO[bytes] | None = None) -> bytes:
        """A blob of the `size` its descriptor gives (refused unread when over `limit`), its sha256 checked."""
        if not DIGEST.match(digest):
            raise RemoteError(f"remote {self.url}: {digest[:80]!r} is not a sha256 digest")
        if size > limit:
            raise RemoteError(f"remote {self.url}: blob {digest[:19]}… is {size} bytes, over the limit of {limit}")
        h = hashlib.sha256()
        kept: list[bytes] = []

        class _Hashing:
            def write(self, data: bytes) -> None:
                h.update(data)
                (sink.write(data) if sink is not None else kept.append(data))

        self.request("GET", self._v2(f"blobs/{digest}"), limit=size, sink=_Hashing(),  # type: ignore[arg-type]
                     what=f"blob {digest[:19]}…")
        if "sha256:" + h.hexdigest() != digest:
            raise RemoteError(f"remote {self.url}: blob {digest[:19]}… does not have its digest (damaged or "
                              "tampered with)")
        return b"".join(kept)

    def has_blob(self, digest: str) -> bool:
        return self.request("HEAD", self._v2(f"blobs/{digest}"), ok=(200, 404), what="a blob").status == 200

    def put_blob(self, digest: str, size: int, body) -> None:
        """Upload a blob unless the registry has it: POST for an upload location, then one PUT with the digest."""
        if self.has_blob(digest):
            return
        ans = self.request("POST", self._v2("blobs/uploads/"), ok=(202,), limit=MAX_ERROR,
                           headers={"Content-Length": "0"}, what="starting an upload")
        where = self._same_host(ans.headers.get("location", ""))
        where += ("&" if "?" in where else "?") + f"digest={digest}"
        if hasattr(body, "seek"):
            body.seek(0)
        self.request("PUT", where, ok=(201,), limit=MAX_ERROR, body=body,
                     headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
                     what=f"uploading blob {digest[:19]}…")

    def put_manifest(self, reference: str, data: bytes, media_type: str) -> str:
        self.request("PUT", self._v2(f"manifests/{reference}"), ok=(201,), limit=MAX_ERROR, body=data,
                     headers={"Content-Type": media_type, "Content-Length": str(len(data))},
                     what=f"the manifest of {reference}")
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def delete_manifest(self, digest: str) -> None:
        if not DIGEST.match(digest):
            raise RemoteError(f"remote {self.url}: {digest[:80]!r} is not a sha256 digest")
        self.request("DELETE", self._v2(f"manifests/{digest}"), ok=(202, 200), limit=MAX_ERROR,
                     what=f"deleting {digest[:19]}…")

    def tags(self) -> Iterator[str]:
        """The repository's tags, page after page (Link headers, on this host); none when it has none."""
        target: str | None = self._v2("tags/list?n=1000")
        for _ in range(MAX_TAG_PAGES):
            if target is None:
                return
            ans = self.request("GET", target, ok=(200, 404), what="the tag list")
            if ans.status == 404:
                return
            try:
                doc = json.loads(ans.body)
                tags = doc.get("tags") or []
            except (ValueError, AttributeError):
                raise RemoteError(f"remote {self.url}: its tag list is not JSON") from None
            yield from (t for t in tags if isinstance(t, str) and _TAG.match(t))
            link = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', ans.headers.get("link", ""))
            target = self._same_host(link.group(1)) if link else None
        raise RemoteError(f"remote {self.url}: its tag list runs past {MAX_TAG_PAGES} pages")
