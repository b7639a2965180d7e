"""What an outside red team found in the oci:// remote, against a real registry (Debian's docker-registry):
one tag with a label that is not a number leaves the other tags listed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from kcache_cli.remote import oci_image as img

pytestmark = pytest.mark.oci

TIB = 1 << 40


class _Zeros(io.RawIOBase):
    """`n` zero bytes, read as a file (a bomb's member, never held whole in memory)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def _layer_of(members: list[tuple[str, bytes | int]]) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = data if isinstance(data, int) else len(data)
            tar.addfile(info, _Zeros(data) if isinstance(data, int) else io.BytesIO(data))
    return raw.getvalue()


def _put_with_layer(reg, image, layer: bytes, tag: str, labels: dict[str, str] | None = None) -> None:
    """The image again under `tag`, with another layer (and labels changed): its config and manifest made anew."""
    from kcache_cli.remote.oci import MAX_CONFIG

    (config_d, config_n), = [(d["digest"], d["size"]) for d in [json.loads(reg.get_manifest("v1")[0])["config"]]]
    config = json.loads(reg.get_blob(config_d, config_n, MAX_CONFIG))
    config["config"]["Labels"].update(labels or {})
    raw = json.dumps(config).encode()
    ld, cd = ("sha256:" + hashlib.sha256(x).hexdigest() for x in (layer, raw))
    reg.put_blob(ld, len(layer), layer)
    reg.put_blob(cd, len(raw), raw)
    reg.put_manifest(tag, img.manifest_json((cd, len(raw)), (ld, len(layer)), {}), img.OCI_MANIFEST)


def test_one_tag_with_a_label_that_is_no_number_leaves_the_others_listed(kcache, fixture_copy, oci_registry):
    """A superscript two is a digit to str.isdigit, not to int(): one tag's label of it is that tag's warning."""
    from kcache_cli.remote.oci import Registry, parse_ref
    from kcache_cli.remote.oci_ops import read_image

    root = fixture_copy("triton") / "cache"
    url = oci_registry.url("team/labels:v1")
    assert kcache("push", "--remote", url, "--cache-dir", root).exit_code == 0
    reg = Registry(parse_ref(url))
    image = read_image(reg, "v1")
    layer = reg.get_blob(image.layer[0], image.layer[1], 1 << 30)
    _put_with_layer(reg, image, layer, "count", {"cache.triton.image/entry-count": "\u00b2"})
    _put_with_layer(reg, image, layer, "arch", {"cache.triton.image/summary": json.dumps(
        {"targets": [{"backend": "cuda", "arch": "\u00b2"}]})})
    repo = oci_registry.url("team/labels")
    for cmd in (("remote", "ls"), ("remote", "stats")):
        run = kcache(*cmd, "--remote", repo, "--json")
        assert run.exit_code == 0, run.stderr
        assert "tag count:" in run.stderr and "tag arch:" in run.stderr and "invalid literal" not in run.stderr
    listed = kcache("remote", "ls", "--remote", repo, "--json").json()
    assert [i["tag"] for i in listed["images"]] == ["v1"], listed
    assert kcache("remote", "stats", "--remote", repo, "--json").json()["tags"] == 1


def test_an_ascii_digit_rule_everywhere_a_label_becomes_a_number():
    assert img.target_arch("cuda", "\u00b2") == "\u00b2"  # not a capability: its word as it is
    assert img.target_arch("cuda", "90") == "sm_90a" and img.target_arch("cuda", 80) == "sm_80"
