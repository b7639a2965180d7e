"""What an outside red team found in the oci:// remote, against a real registry (Debian's docker-registry):
a gzip bomb in a layer (a manifest declaring any size, a member it does not list) is refused before the
expansion writes it; one tag with a label that is not a number leaves the other tags listed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile

import pytest

from kcache_cli.archive.manifest import ImportLimits
from kcache_cli.remote import oci_image as img
from kcache_cli.util.errors import KcacheError

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


class _Counting(io.RawIOBase):
    """Where the expanded archive goes: only counted."""

    def __init__(self) -> None:
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.n += len(b)
        return len(b)


def _layer(manifest: dict, members: list[tuple[str, bytes | int]]) -> bytes:
    """A gzip tar layer: kcache's manifest first, then each (name, bytes or a count of zeros)."""
    return _layer_of([(img.KCACHE_MANIFEST, json.dumps(manifest).encode()), *members])


def _manifest(files: dict[str, list]) -> dict:
    from kcache_cli import __version__

    rec = {"layout": "triton", "kind": "kernel", "relpath": "K" * 52, "status": "complete", "hash": "K" * 52,
           "files": files, "links": {}, "dirs": [], "locks": []}
    return {"format": "kcache-archive", "format_version": 1, "kcache_version": __version__, "entries": [rec]}


def _expand(layer: bytes, **room) -> _Counting:
    out = _Counting()
    with pytest.raises(KcacheError) as caught:
        img.layer_to_archive(io.BytesIO(layer), out, img.image_format("triton"), lambda rec: None,  # type: ignore[arg-type]
                             ImportLimits(), **room)
    out.error = str(caught.value)  # type: ignore[attr-defined]
    return out


def test_a_declared_size_over_the_limits_is_refused_before_a_byte_is_written():
    junk = 64 << 20
    layer = _layer(_manifest({"big": [TIB, "0" * 64]}), [(f"io.triton.cache/{'K' * 52}/junk", junk)])
    assert len(layer) < junk // 100  # a bomb: small compressed
    out = _expand(layer)
    assert out.n == 0, out.n  # the manifest's sizes are import's limits' first: nothing expanded
    assert f"/big is {TIB} bytes, over the limit of {4 << 30} per file" in out.error  # type: ignore[attr-defined]
    many = {f"f{i}": [3 << 30, "0" * 64] for i in range(22)}  # each within the file limit, 66 GiB in all
    out = _expand(_layer(_manifest(many), []))
    assert out.n == 0 and f"over the limit of {64 << 30}" in out.error  # type: ignore[attr-defined]
    # the same entry for another arch is skipped, never written: the total limit is for what is kept
    kept = img.layer_to_archive(io.BytesIO(_layer(_manifest(many), [])), _Counting(), img.image_format("triton"),
                                lambda rec: "built for sm_90a", ImportLimits())
    assert kept.reasons == {"K" * 52: "built for sm_90a"}


def test_a_member_the_manifest_does_not_list_or_lists_smaller_is_never_expanded():
    data = b"{}"
    listed = {"a.json": [len(data), hashlib.sha256(data).hexdigest()], "big": [1 << 30, "0" * 64]}
    rel = f"io.triton.cache/{'K' * 52}"
    junk = 64 << 20
    for members, said in (([(f"{rel}/a.json", data), (f"{rel}/junk", junk)], "is not a file its manifest lists"),
                          ([(f"{rel}/a.json", junk)], f"is {junk} bytes, its manifest lists 2"),
                          ([(f"{rel}/a.json", data), (f"{rel}/a.json", data)], "comes twice")):
        out = _expand(_layer(_manifest(listed), members))
        assert said in out.error and out.n < 1 << 20, (out.error, out.n)  # type: ignore[attr-defined]


def test_the_expanded_size_is_asked_of_the_temp_file_system_before_a_write():
    asked = []

    def room(n: int) -> None:
        asked.append(n)
        raise KcacheError("no room")

    out = _expand(_layer(_manifest({"big": [1 << 30, "0" * 64]}), [(f"io.triton.cache/{'K' * 52}/big", 1 << 20)]),
                  room=room)
    assert out.error == "no room" and out.n == 0 and asked and asked[0] > 1 << 30


@pytest.mark.parametrize("arch", ("sm_90a", "sm_80"))  # the bomb in an entry the pull keeps, or one it skips
def test_a_bomb_image_pulled_from_a_registry_is_refused_before_temp_fills(kcache, fixture_copy, oci_registry,
                                                                        tmp_path, monkeypatch, arch):
    """The red team's image: kcache's own push, its manifest rewritten to declare a 1 TiB file in one entry and a
    member of zeros it does not list appended. Refused in one line, nothing expanded into the temp directory."""
    import tempfile

    from kcache_cli.remote import oci_ops
    from kcache_cli.remote.oci import Registry, parse_ref

    root = fixture_copy("triton") / "cache"
    url = oci_registry.url(f"team/bomb-{arch}:v1")
    assert kcache("push", "--remote", url, "--cache-dir", root).exit_code == 0
    reg = Registry(parse_ref(url))
    image = oci_ops.read_image(reg, "v1")
    with tarfile.open(fileobj=io.BytesIO(reg.get_blob(image.layer[0], image.layer[1], 1 << 30)), mode="r:gz") as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]  # type: ignore[union-attr]
    doc = json.loads(members[0][1])
    rec = next(r for r in doc["entries"] if r["arch"] == arch)
    rec["files"]["big"] = [TIB, "0" * 64]
    members[0] = (members[0][0], json.dumps(doc).encode())
    members.append((f"io.triton.cache/{rec['relpath']}/junk", 64 << 20))
    _put_with_layer(reg, image, _layer_of(members), "bomb")
    tmpx = tmp_path / "tmpx"
    tmpx.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpx))
    expanded = []
    real = oci_ops.import_archive

    def measured(root, archive, **kw):
        expanded.append(os.path.getsize(archive))
        return real(root, archive, **kw)

    monkeypatch.setattr(oci_ops, "import_archive", measured)
    run = kcache("pull", "--remote", oci_registry.url(f"team/bomb-{arch}:bomb"), "--cache-dir", tmp_path / "c",
                 "--gpu", "sm_90a")
    assert run.exit_code == 1 and f"/big is {TIB} bytes, over the limit of {4 << 30} per file" in run.stderr
    assert expanded == [] and not list(tmpx.iterdir())


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
