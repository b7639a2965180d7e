"""A registry is untrusted input, as a Redis remote is: a tiny in-test HTTP server that lies about sizes,
redirects elsewhere, trickles, sends bytes that are not what their digest says, or echoes our password
back. kcache refuses each before reading more than its limits, within one deadline, in one line."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kcache_cli.remote.oci import MAX_JSON, Registry, parse_ref
from kcache_cli.remote.store import RemoteError

Answer = Callable[[BaseHTTPRequestHandler], None]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _any(self) -> None:
        self.server.seen.append((self.command, self.path, dict(self.headers)))  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        try:
            self.server.answer(self)  # type: ignore[attr-defined]
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _any

    def log_message(self, *args) -> None:
        pass


class Hostile:
    """A loopback HTTP server answering every request with `answer(handler)`; `seen` lists the requests."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.seen = []  # type: ignore[attr-defined]
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def seen(self) -> list:
        return self.server.seen  # type: ignore[attr-defined]

    def answer(self, fn: Answer) -> None:
        self.server.answer = fn  # type: ignore[attr-defined]

    def registry(self, repo_tag: str = "team/k:v1", deadline: float | None = None) -> Registry:
        reg = Registry(parse_ref(f"oci+http://{self.host}/{repo_tag}"), io_timeout=5.0)
        reg.set_deadline(deadline)
        return reg

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    h = Hostile()
    yield h
    h.close()


def send(h: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict | None = None,
         length: int | None = None) -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    if length is not False:  # type: ignore[comparison-overlap]
        h.send_header("Content-Length", str(len(body) if length is None else length))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


def test_a_manifest_announced_over_the_limit_is_refused_unread(hostile):
    hostile.answer(lambda h: send(h, 200, b"{}", length=10**9))
    with pytest.raises(RemoteError, match="announces 1000000000 bytes, over the limit of 4194304"):
        hostile.registry().get_manifest("v1")


def test_a_body_that_runs_past_the_limit_is_cut_off(hostile):
    def endless(h):
        h.send_response(200)
        h.end_headers()  # no Content-Length: the body ends when the connection does (never)
        chunk = b"x" * 65536
        for _ in range(MAX_JSON // len(chunk) + 64):
            h.wfile.write(chunk)

    hostile.answer(endless)
    with pytest.raises(RemoteError, match=f"sent more than the limit of {MAX_JSON} bytes"):
        list(hostile.registry().tags())


def test_a_body_shorter_than_announced_is_refused(hostile):
    hostile.answer(lambda h: send(h, 200, b'{"tags": []}', length=5000))
    with pytest.raises(RemoteError, match="the tag list"):
        list(hostile.registry().tags())


def test_redirects_are_followed_only_on_the_same_registry(hostile):
    def answer(h):
        if h.path.startswith("/v2/team/k/manifests/v1"):
            send(h, 307, headers={"Location": f"http://{hostile.host}/elsewhere/manifest"})
        elif h.path == "/elsewhere/manifest":
            send(h, 200, b'{"schemaVersion": 2}', {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        else:
            send(h, 307, headers={"Location": "http://evil.example:1/steal"})

    hostile.answer(answer)
    body, media, _ = hostile.registry().get_manifest("v1")
    assert body == b'{"schemaVersion": 2}' and media == "application/vnd.oci.image.manifest.v1+json"
    with pytest.raises(RemoteError, match="another host .'evil.example:1'.; kcache follows redirects only on the same"):
        list(hostile.registry().tags())
    assert not any("steal" in path for _, path, _ in hostile.seen)


def test_a_redirect_loop_ends(hostile):
    hostile.answer(lambda h: send(h, 302, headers={"Location": h.path}))
    with pytest.raises(RemoteError, match="more than 5 redirects"):
        hostile.registry().get_manifest("v1")
    assert len(hostile.seen) == 6


def test_a_blob_that_is_not_what_its_digest_says_is_refused(hostile):
    good = b"the config"
    digest = "sha256:" + hashlib.sha256(good).hexdigest()
    hostile.answer(lambda h: send(h, 200, b"the CONFIG"))
    with pytest.raises(RemoteError, match="does not have its digest"):
        hostile.registry().get_blob(digest, len(good), 1 << 20)
    hostile.answer(lambda h: send(h, 200, good + b"and more"))
    with pytest.raises(RemoteError, match="announces 18 bytes, over the limit of 10"):
        hostile.registry().get_blob(digest, len(good), 1 << 20)


def _image_answer(hostile, layer_size: int) -> None:
    """A registry serving an image kcache pushed (by its labels) whose layer claims `layer_size` bytes."""
    config = json.dumps({"config": {"Labels": {"io.kcache.image/layout": "triton"}}}).encode()
    cd = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd,
                                      "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "digest": "sha256:" + "0" * 64, "size": layer_size}]}).encode()

    def answer(h):
        if "/manifests/" in h.path:
            send(h, 200, manifest, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        elif h.path.endswith(cd):
            send(h, 200, config)
        else:
            send(h, 200, b"\0" * 1024)

    hostile.answer(answer)


def test_a_layer_claiming_more_than_import_takes_is_never_fetched(hostile, tmp_path):
    from kcache_cli.remote.oci_ops import pull_image, read_image

    _image_answer(hostile, 1 << 50)
    reg = hostile.registry()
    image = read_image(reg, "v1")
    with pytest.raises(RemoteError, match=f"its layer is {1 << 50} bytes, over the limit"):
        pull_image(tmp_path / "dest", reg, image, None)
    assert not any("0" * 64 in path for _, path, _ in hostile.seen)
    assert not (tmp_path / "dest").exists()


def test_one_deadline_ends_a_server_that_trickles(hostile, kcache):
    def trickle(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(200):  # a header a byte at a time: each byte alone would keep a read timeout waiting
            h.wfile.write(b"X")
            h.wfile.flush()
            time.sleep(0.05)

    hostile.answer(trickle)
    start = time.monotonic()
    run = kcache("remote", "ls", "--remote", f"oci+http://{hostile.host}/team/k", "--remote-timeout", "0.5")
    assert run.exit_code == 1 and run.stderr.count("\n") == 1
    assert "no answer within --remote-timeout (0.5s in all)" in run.stderr
    assert time.monotonic() - start < 3



def test_one_deadline_ends_a_token_realm_that_trickles(hostile, kcache):
    """The registry asks for a token from a realm on its own host, which trickles its headers: the
    command's deadline ends that call too (it ran the whole 10 s trickle before)."""
    def answer(h):
        if h.path.startswith("/token"):
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(100):
                h.wfile.write(b"X")
                h.wfile.flush()
                time.sleep(0.1)
        else:
            send(h, 401, headers={"WWW-Authenticate": f'Bearer realm="http://{hostile.host}/token",service="reg"'})

    hostile.answer(answer)
    start = time.monotonic()
    run = kcache("remote", "ls", "--remote", f"oci+http://{hostile.host}/team/k", "--remote-timeout", "0.5")
    assert run.exit_code == 1 and run.stderr.count("\n") == 1, run.stderr
    assert "no answer within --remote-timeout (0.5s in all)" in run.stderr
    assert time.monotonic() - start < 3

def test_credentials_go_where_asked_and_never_into_a_message(hostile, monkeypatch, tmp_path):
    import os
    from pathlib import Path

    docker = Path(os.environ["HOME"]) / ".docker"
    docker.mkdir()
    token = base64.b64encode(b"alice:s3cret-pw").decode()
    (docker / "config.json").write_text(json.dumps({"auths": {hostile.host: {"auth": token}}}))

    def answer(h):
        auth = h.headers.get("Authorization")
        if not auth:
            send(h, 401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        else:  # a hostile registry echoes what it got
            send(h, 403, json.dumps({"errors": [{"code": "DENIED", "message": f"no {auth} / s3cret-pw"}]}).encode())

    hostile.answer(answer)
    with pytest.raises(RemoteError) as info:
        hostile.registry().get_manifest("v1")
    assert "HTTP 403" in str(info.value) and "s3cret-pw" not in str(info.value) and token not in str(info.value)
    assert [hdrs.get("Authorization") for _, _, hdrs in hostile.seen] == [None, f"Basic {token}"]


def test_a_bearer_challenge_is_answered_with_a_token_from_its_realm(hostile):
    def answer(h):
        if h.path.startswith("/token"):
            assert "scope=repository%3Ateam%2Fk%3Apull" in h.path
            send(h, 200, b'{"token": "T0KEN"}')
        elif h.headers.get("Authorization") == "Bearer T0KEN":
            send(h, 200, b'{"tags": ["v1", "v2"]}')
        else:
            send(h, 401, headers={"WWW-Authenticate": f'Bearer realm="http://{hostile.host}/token",service="reg",'
                                                     'scope="repository:team/k:pull"'})

    hostile.answer(answer)
    assert list(hostile.registry().tags()) == ["v1", "v2"]


def test_a_bearer_realm_on_another_plain_http_host_is_not_asked(hostile):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        other = s.getsockname()[1]
    hostile.answer(lambda h: send(h, 401, headers={"WWW-Authenticate": f'Bearer realm="http://127.0.0.2:{other}/t"'}))
    with pytest.raises(RemoteError, match="HTTP 401: credentials needed"):
        hostile.registry().get_manifest("v1")


def test_a_blob_redirect_to_storage_elsewhere_needs_https_and_an_allowed_host(hostile, monkeypatch):
    hostile.answer(lambda h: send(h, 307, headers={"Location": "http://blobs.example/x?sig=1"}))
    monkeypatch.setenv("KCACHE_REMOTE_REDIRECTS", "blobs.example")
    with pytest.raises(RemoteError, match="unless KCACHE_REMOTE_REDIRECTS allows the host"):
        hostile.registry().get_blob("sha256:" + "0" * 64, 10, 100)  # plain HTTP elsewhere: never
    reg = hostile.registry()
    here = reg._follow("/v2/team/k/blobs/x", reg._follow(f"http://{hostile.host}/a", _home(reg), "GET"), "GET")
    assert (here.host, here.target) == (hostile.host, "/v2/team/k/blobs/x")
    there = reg._follow("https://blobs.example/x?sig=1", here, "GET")
    assert (there.scheme, there.host, there.target) == ("https", "blobs.example", "/x?sig=1")
    with pytest.raises(RemoteError, match="another host"):
        reg._follow("https://blobs.example/x", here, "PUT")  # an upload never leaves the registry
    with pytest.raises(RemoteError, match="another host"):
        reg._follow("https://evil.example/x", here, "GET")


def _home(reg):
    from kcache_cli.remote.oci import _Where

    return _Where(reg.ref.scheme, reg.ref.host, "/")
