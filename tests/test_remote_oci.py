"""oci:// against a real registry (Debian's docker-registry), checked with skopeo as a client that is not
kcache: push gives MCV's compat image (labels, one gzip layer with io.triton.cache/ and
io.triton.manifest/), pull imports it whole after the GPU preflight, remote ls lists the tags and
remote prune keeps the repository to a budget without touching a tag it did not select."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from oci_registry import skopeo, skopeo_inspect

pytestmark = pytest.mark.oci

SM80 = {"22DX5RUZ7YPKNU74O7GAUCGIGIPAEV2FCKTGJU2B2LNOL5MZNINQ", "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA",
        "LOZKL4OW66ML5G7PWO4EI23LW6FIRVU24FT4ZLGIYGLVKG65YUFQ"}


@pytest.fixture
def triton(fixture_copy) -> Path:
    return fixture_copy("triton") / "cache"


def files_of(root: Path) -> dict[str, bytes]:
    """The cache's entries' files (not kcache's .kcache/ nor the CACHEDIR.TAG a new root gets)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith((".kcache", "CACHEDIR.TAG"))}


def push(kcache, root: Path, url: str, *args: str):
    run = kcache("push", "--remote", url, "--cache-dir", root, "--json", *args)
    assert run.exit_code == 0, run.stderr
    return run.json()


def test_push_gives_mcv_compat_image_that_skopeo_reads(kcache, triton, oci_registry, tmp_path):
    doc = push(kcache, triton, oci_registry.url("team/triton:v1"))
    assert doc["schema"] == "kcache/push-oci/1" and doc["pushed"] == 6 and doc["digest"].startswith("sha256:")
    info = skopeo_inspect(oci_registry.host, "team/triton:v1")
    labels = info["Labels"]
    originals = files_of(triton)
    assert labels["cache.triton.image/entry-count"] == "6"
    assert labels["cache.triton.image/cache-size-bytes"] == str(sum(len(b) for b in originals.values()))
    summary = json.loads(labels["cache.triton.image/summary"])
    assert summary == {"targets": [{"backend": "cuda", "arch": "80", "warp_size": 32},
                                   {"backend": "cuda", "arch": "90", "warp_size": 32}]}
    assert labels["org.opencontainers.image.title"] == "triton"
    assert info["Digest"] == doc["digest"] and len(info["Layers"]) == 1
    raw = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{oci_registry.host}/team/triton:v1"))
    assert [layer["mediaType"] for layer in raw["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"]

    out = tmp_path / "copied"
    skopeo("copy", "--src-tls-verify=false", f"docker://{oci_registry.host}/team/triton:v1", f"dir:{out}")
    manifest = json.loads((out / "manifest.json").read_text())
    layer = out / manifest["layers"][0]["digest"].split(":")[1]
    with tarfile.open(layer, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        layer_files = {n[len("io.triton.cache/"):]: tar.extractfile(m).read()  # type: ignore[union-attr]
                       for n, m in members.items() if m.isfile() and n.startswith("io.triton.cache/")}
        mcv = json.loads(tar.extractfile("io.triton.manifest/manifest.json").read())  # type: ignore[union-attr]
    assert layer_files == originals  # the cache tree, byte for byte, under io.triton.cache/
    assert set(members) <= {"io.kcache.manifest/manifest.json", "io.triton.manifest/manifest.json"} | {
        n for n in members if n.startswith("io.triton.cache/")}
    assert sorted(m["hash"] for m in mcv["triton"]) == sorted(
        json.loads(b)["hash"] for n, b in originals.items() if n.endswith(".json") and "__grp__" not in n)
    targets = {(m["backend"], m["arch"], m["warp_size"]) for m in mcv["triton"]}
    assert targets == {("cuda", "80", 32), ("cuda", "90", 32)}


def test_pull_into_an_empty_root_gives_the_same_complete_entries(kcache, triton, oci_registry, tmp_path):
    push(kcache, triton, oci_registry.url("team/pull:v1"))
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/pull:v1"), "--cache-dir", dest, "--gpu", "sm_80,sm_90a",
                 "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["imported"] == 6 and run.json()["skipped_other_arch"] == 0
    before = kcache("ls", "--cache-dir", triton, "--json").json()["entries"]
    after = kcache("ls", "--cache-dir", dest, "--json").json()["entries"]
    assert [e["hash"] for e in after] == [e["hash"] for e in before]
    assert {e["status"] for e in before} == {"moved"}  # the fixture's group files name another machine's paths
    assert {e["status"] for e in after} == {"complete"}  # import's relocation made them this root's
    old, new = files_of(triton), files_of(dest)
    assert set(new) == set(old)
    assert all(new[n] == old[n] for n in old if "__grp__" not in n)
    group = next(n for n in new if "__grp__" in n)
    assert all(p.startswith(str(dest)) for p in json.loads(new[group])["child_paths"].values())  # relocated


def test_an_image_keeps_the_last_uses_an_export_records(kcache, triton, oci_registry, tmp_path):
    """An image's layer is an archive: pulled, each entry has the last use it had where it was pushed (and
    its files their mtimes, the group files that import relocated too), not the pull's time."""
    from datetime import datetime

    for p in [triton, *triton.rglob("*")]:
        os.utime(p, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
    push(kcache, triton, oci_registry.url("team/used:v1"))
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/used:v1"), "--cache-dir", dest, "--gpu", "sm_80,sm_90a")
    assert run.exit_code == 0, run.stderr
    after = kcache("ls", "--cache-dir", dest, "--json").json()["entries"]
    assert len(after) == 6 and {datetime.fromisoformat(e["last_used"]).timestamp() for e in after} == {1_700_000_000}
    assert {e["status"] for e in after} == {"complete"}
    assert {p.lstat().st_mtime for p in dest.rglob("*")
            if ".kcache" not in p.parts and p.name != "CACHEDIR.TAG"} == {1_700_000_000}


def test_an_sm90a_only_image_is_refused_on_sm80_before_any_write(kcache, triton, oci_registry, tmp_path):
    push(kcache, triton, oci_registry.url("team/hopper:v1"), "--space", "sm_90a")
    labels = skopeo_inspect(oci_registry.host, "team/hopper:v1")["Labels"]
    assert json.loads(labels["cache.triton.image/summary"])["targets"] == [
        {"backend": "cuda", "arch": "90", "warp_size": 32}]
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/hopper:v1"), "--cache-dir", dest, "--gpu", "sm_80")
    assert run.exit_code == 1
    assert run.stderr.count("\n") == 1 and "built for sm_90a; this node runs sm_80" in run.stderr
    assert not dest.exists() and run.stdout == ""


def test_a_mixed_image_skips_and_counts_the_entries_of_other_archs(kcache, triton, oci_registry, tmp_path):
    push(kcache, triton, oci_registry.url("team/mixed:v1"))
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/mixed:v1"), "--cache-dir", dest, "--gpu", "sm_80",
                 "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["skipped_other_arch"] == 3 and doc["imported"] == 3
    assert {e["relpath"] for e in doc["entries"]} == SM80  # Triton's sm_80 kernels; sm_90a does not run on 8.0
    assert {p.name for p in dest.iterdir() if p.is_dir() and not p.name.startswith(".")} == SM80


def test_without_a_gpu_pull_says_so_and_wants_no_gpu_check(kcache, triton, oci_registry, tmp_path, monkeypatch):
    push(kcache, triton, oci_registry.url("team/nogpu:v1"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/nogpu:v1"), "--cache-dir", dest)
    assert run.exit_code == 2 and "no GPU found" in run.stderr and "--no-gpu-check" in run.stderr
    assert not dest.exists()
    run = kcache("pull", "--remote", oci_registry.url("team/nogpu:v1"), "--cache-dir", dest, "--no-gpu-check",
                 "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["imported"] == 6 and run.json()["gpu"] is None


def test_remote_ls_lists_tags_and_prune_keep_1_leaves_only_the_newest(kcache, triton, oci_registry):
    for tag in ("a", "b", "c"):
        push(kcache, triton, oci_registry.url(f"team/prune:{tag}"), "--op", "add_kernel" if tag != "b" else "*")
    run = kcache("remote", "ls", "--remote", oci_registry.url("team/prune"), "--json")
    assert run.exit_code == 0, run.stderr
    images = run.json()["images"]
    assert [i["tag"] for i in images] == ["c", "b", "a"]  # newest first
    assert [i["entry_count"] for i in images] == [4, 6, 4]
    assert all(i["targets"] == ["sm_80", "sm_90a"] and i["size"] > 0 for i in images)
    human = kcache("remote", "ls", "--remote", oci_registry.url("team/prune"))
    assert human.stdout.split("\n")[0].split() == ["tag", "layout", "entries", "size", "targets", "age", "digest"]

    dry = kcache("remote", "prune", "--keep", "1", "--dry-run", "--remote", oci_registry.url("team/prune"), "--json")
    assert dry.exit_code == 0 and [r["tag"] for r in dry.json()["removed"]] == ["a", "b"]
    assert len(kcache("remote", "ls", "--remote", oci_registry.url("team/prune"), "--json").json()["images"]) == 3
    run = kcache("remote", "prune", "--keep", "1", "--remote", oci_registry.url("team/prune"))
    assert run.exit_code == 0, run.stderr
    assert "removed 2 tags" in run.stderr
    left = kcache("remote", "ls", "--remote", oci_registry.url("team/prune"), "--json").json()["images"]
    assert [i["tag"] for i in left] == ["c"]
    assert skopeo_inspect(oci_registry.host, "team/prune:c")["Labels"]["cache.triton.image/entry-count"] == "4"


def test_prune_never_removes_a_tag_it_did_not_select(kcache, triton, oci_registry):
    push(kcache, triton, oci_registry.url("team/shared:x"))
    skopeo("copy", "--src-tls-verify=false", "--dest-tls-verify=false", f"docker://{oci_registry.host}/team/shared:x",
           f"docker://{oci_registry.host}/team/shared:y")  # the same manifest: one digest, two tags
    run = kcache("remote", "prune", "--keep", "1", "--remote", oci_registry.url("team/shared"), "--json")
    assert run.exit_code == 0, run.stderr
    (removal,) = run.json()["removed"]
    assert removal["done"] is False and "another tag kept" in removal["skipped"]
    tags = [i["tag"] for i in kcache("remote", "ls", "--remote", oci_registry.url("team/shared"), "--json").json()[
        "images"]]
    assert tags == ["x", "y"]


def test_prune_never_deletes_an_image_a_multi_arch_tag_lists(kcache, triton, oci_registry):
    """A tag kcache cannot read as a cache image (an index: a multi-arch tag) may list an image a prune
    selects: deleting it would leave that tag naming nothing. The tags not read are read again for what
    they name, and such an image stays."""
    from kcache_cli.remote.oci import Registry, parse_ref

    for tag in ("old", "new"):
        push(kcache, triton, oci_registry.url(f"team/multi:{tag}"), "--op", "add_kernel" if tag == "old" else "*")
    reg = Registry(parse_ref(oci_registry.url("team/multi:old")))
    raw, media, digest = reg.get_manifest("old")
    platform = {"architecture": "amd64", "os": "linux"}
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": media, "digest": digest, "size": len(raw), "platform": platform}]})
    reg.put_manifest("all", index.encode(), "application/vnd.oci.image.index.v1+json")
    run = kcache("remote", "prune", "--keep", "1", "--remote", oci_registry.url("team/multi"), "--json")
    assert run.exit_code == 0, run.stderr
    (removal,) = run.json()["removed"]
    assert removal["tag"] == "old" and removal["done"] is False and "another tag kept" in removal["skipped"], removal
    assert reg.manifest_digest("old") == digest  # the index still names an image that is there


def test_remote_stats_totals_the_repository(kcache, triton, oci_registry):
    push(kcache, triton, oci_registry.url("team/stats:one"))
    push(kcache, triton, oci_registry.url("team/stats:two"), "--space", "sm_80")
    run = kcache("remote", "stats", "--remote", oci_registry.url("team/stats"), "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["tags"] == 2 and doc["entry_count"] == 9
    assert doc["by_target"]["sm_80"]["tags"] == 2 and doc["by_target"]["sm_90a"]["tags"] == 1


def test_remote_stats_of_one_entry_says_1_entry(kcache, triton, oci_registry):
    """"1 tag (1 image), 1 entries": each count takes its noun's number."""
    push(kcache, triton, oci_registry.url("team/one:v1"), "22DX5RUZ")
    run = kcache("remote", "stats", "--remote", oci_registry.url("team/one"))
    assert run.exit_code == 0, run.stderr
    assert "1 tag (1 image), 1 entry, " in run.stdout + run.stderr and "1 entries" not in run.stdout + run.stderr


def test_remote_stats_counts_an_image_under_two_tags_once(kcache, triton, oci_registry):
    """One image tagged x and y holds its entries and bytes once: each row (and the totals) counted them per
    tag. Two images (x and z) that hold some of the same entries are two images: both count."""
    push(kcache, triton, oci_registry.url("team/twice:x"))
    skopeo("copy", "--src-tls-verify=false", "--dest-tls-verify=false", f"docker://{oci_registry.host}/team/twice:x",
           f"docker://{oci_registry.host}/team/twice:y")  # the same manifest: one digest, two tags
    push(kcache, triton, oci_registry.url("team/twice:z"), "--space", "sm_80")
    repo = oci_registry.url("team/twice")
    size = {i["tag"]: i["size"] for i in kcache("remote", "ls", "--remote", repo, "--json").json()["images"]}
    run = kcache("remote", "stats", "--remote", repo, "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert size["x"] == size["y"] and doc["tags"] == 3 and doc["images"] == 2
    assert doc["size"] == size["x"] + size["z"] and doc["entry_count"] == 6 + 3
    assert doc["by_layout"]["triton"] == {"tags": 3, "entry_count": 6 + 3, "size": size["x"] + size["z"]}
    assert doc["by_target"]["sm_80"]["tags"] == 3 and doc["by_target"]["sm_80"]["entry_count"] == 3 + 3
    assert doc["by_target"]["sm_90a"]["tags"] == 2 and doc["by_target"]["sm_90a"]["entry_count"] == 3


def test_signed_images_pull_only_on_nodes_that_trust_the_key(kcache, triton, oci_registry, tmp_path, monkeypatch):
    pytest.importorskip("cryptography")
    from test_remote_trust import keygen, node

    a, b, mallory = node(tmp_path, "a"), node(tmp_path, "b"), node(tmp_path, "m")
    a_key = keygen(kcache, a)
    m_key = keygen(kcache, mallory)
    run = kcache("push", "--remote", oci_registry.url("team/signed:v1"), "--cache-dir", triton, env=a)
    assert run.exit_code == 0, run.stderr
    manifest = json.loads(skopeo("inspect", "--raw", "--tls-verify=false",
                                 f"docker://{oci_registry.host}/team/signed:v1"))
    assert manifest["annotations"]["io.kcache.image/signed-by"] == a_key
    refused = tmp_path / "refused"
    run = kcache("pull", "--remote", oci_registry.url("team/signed:v1"), "--cache-dir", refused, "--gpu", "sm_80",
                 env={**b, "KCACHE_TRUSTED_KEYS": m_key})
    assert run.exit_code == 1 and "a key not in the trust list" in run.stderr
    assert not any(p for p in refused.glob("*") if not p.name.startswith("."))
    ok = tmp_path / "ok"
    run = kcache("pull", "--remote", oci_registry.url("team/signed:v1"), "--cache-dir", ok, "--gpu", "sm_80", "--json",
                 env={**b, "KCACHE_TRUSTED_KEYS": a_key})
    assert run.exit_code == 0, run.stderr
    assert run.json()["imported"] == 3


def _raw_image(registry, layer_files: dict[str, bytes], labels: dict[str, str]) -> None:
    """An image kcache did not make, put up with kcache's own client: one gzip layer, these labels."""
    from kcache_cli.remote.oci import Registry, parse_ref
    from kcache_cli.remote.oci_image import OCI_CONFIG, OCI_LAYER, manifest_json

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in layer_files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(buf.getvalue())
    config = json.dumps({"config": {"Labels": labels}, "rootfs": {"type": "layers", "diff_ids": [
        "sha256:" + hashlib.sha256(buf.getvalue()).hexdigest()]}}).encode()
    reg = Registry(parse_ref(registry.url("team/foreign:v1")))
    ld, cd = ("sha256:" + hashlib.sha256(x).hexdigest() for x in (layer, config))
    reg.put_blob(ld, len(layer), layer)
    reg.put_blob(cd, len(config), config)
    body = manifest_json((cd, len(config)), (ld, len(layer)), {})
    assert OCI_CONFIG in body.decode() and OCI_LAYER in body.decode()
    reg.put_manifest("v1", body, "application/vnd.oci.image.manifest.v1+json")


def test_an_image_kcache_did_not_push_is_refused_unread(kcache, oci_registry, tmp_path):
    _raw_image(oci_registry, {"io.triton.cache/K/evil.so": b"\x7fELF", "io.triton.manifest/manifest.json": b"{}"},
               {"cache.triton.image/entry-count": "1",
                "cache.triton.image/summary": '{"targets":[{"backend":"cuda","arch":"80","warp_size":32}]}'})
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/foreign:v1"), "--cache-dir", dest, "--gpu", "sm_80")
    assert run.exit_code == 1 and "not an image kcache pushed" in run.stderr
    assert not dest.exists()


def test_a_layer_with_files_its_manifest_does_not_list_is_rejected(kcache, triton, oci_registry, tmp_path):
    """A kcache manifest naming one entry, a layer carrying another file besides: import's rules refuse it."""
    from kcache_cli import __version__

    data = b"#!/bin/sh\n"
    rec = {"layout": "triton", "kind": "kernel", "relpath": "K" * 52, "status": "complete", "hash": "K" * 52,
           "files": {"a.json": [len(data), hashlib.sha256(data).hexdigest()]}, "links": {}, "dirs": [], "locks": []}
    manifest = json.dumps({"format": "kcache-archive", "format_version": 1, "kcache_version": __version__,
                           "entries": [rec]}).encode()
    _raw_image(oci_registry, {"io.kcache.manifest/manifest.json": manifest, f"io.triton.cache/{'K' * 52}/a.json": data,
                              f"io.triton.cache/{'K' * 52}/b.so": b""},
               {"io.kcache.image/layout": "triton"})
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/foreign:v1"), "--cache-dir", dest, "--no-gpu-check")
    assert run.exit_code == 1 and "archive rejected" in run.stderr and "b.so" in run.stderr
    assert not any(p for p in dest.glob("*") if not p.name.startswith("."))


def test_build_remote_says_an_oci_remote_is_not_for_builds():
    from kcache_cli.remote.store import open_store
    from kcache_cli.util.errors import UsageError

    with pytest.raises(UsageError, match="build --remote needs a redis:// or file://"):
        open_store("oci://registry.example/team/k:v1")


def test_credentials_come_from_the_auth_file_and_never_from_the_url(tmp_path, monkeypatch):
    import base64

    from kcache_cli.remote.oci import find_credentials, parse_ref
    from kcache_cli.util.errors import UsageError

    docker = Path(os.environ["HOME"]) / ".docker"
    docker.mkdir()
    token = base64.b64encode(b"alice:s3cret").decode()
    (docker / "config.json").write_text(json.dumps({"auths": {"reg.example:5000": {"auth": token}}}))
    monkeypatch.delenv("KCACHE_REMOTE_USER", raising=False)
    assert find_credentials("reg.example:5000") == ("alice", "s3cret")
    assert find_credentials("other.example") is None
    monkeypatch.setenv("KCACHE_REMOTE_PASSWORD", "pw")
    assert find_credentials("reg.example:5000", "bob") == ("bob", "pw")
    with pytest.raises(UsageError, match="no credentials, query or fragment in its URL"):
        parse_ref("oci://alice:s3cret@reg.example/team/k:v1")
    for url in ("oci+http://reg.example:5000/team/k:v1?password=S3cretPW", "oci://reg.example/team/k?token=S3cretPW",
                "oci://reg.example/team/k@sha256:abc?password=S3cretPW", "oci://reg.example/team/k:v1#S3cretPW"):
        with pytest.raises(UsageError) as caught:  # refused before the tag or repository is quoted back
            parse_ref(url)
        assert "S3cretPW" not in str(caught.value), caught.value
    assert parse_ref("oci+http://127.0.0.1:5000/team/k:v1").url == "oci+http://127.0.0.1:5000/team/k:v1"


@pytest.mark.parametrize("echo", ["{pw}", "{pw_upper}", "{pw_quoted}", "{pw_twice}", "{pw_plus}"])
def test_a_registry_echoing_the_password_in_any_encoding_never_gets_it_printed(echo):
    """A hostile registry quoting the password back URL-encoded (once or twice) or in another case: the
    error line shows none of it (the exact form alone was hidden)."""
    from urllib.parse import quote, quote_plus

    from kcache_cli.remote.oci import Registry, parse_ref

    pw = "Pw%2F:s3cr3t! xyz"
    reg = Registry(parse_ref("oci+http://127.0.0.1:5000/team/k:v1"))
    reg._creds = ("alice", pw)
    said = echo.format(pw=pw, pw_upper=pw.upper(), pw_quoted=quote(pw, safe=""), pw_twice=quote(quote(pw, safe=""),
                       safe=""), pw_plus=quote_plus(pw))
    shown = reg._scrub(f"HTTP 403: bad {said} for alice")
    assert shown == "HTTP 403: bad *** for alice", shown


def _layer_names(registry, repo_tag: str, tmp_path: Path) -> dict[str, bytes]:
    """The files of the image's one layer, as skopeo copies it."""
    out = tmp_path / f"copied-{repo_tag.replace('/', '-').replace(':', '-')}"
    skopeo("copy", "--src-tls-verify=false", f"docker://{registry.host}/{repo_tag}", f"dir:{out}")
    manifest = json.loads((out / "manifest.json").read_text())
    (layer,) = manifest["layers"]
    with tarfile.open(out / layer["digest"].split(":")[1], "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_a_vllm_cache_is_mcvs_vllm_image_with_kserve_mount_labels(kcache, oci_registry, tmp_path):
    unit = tmp_path / "vllm" / "torch_compile_cache" / "0123456789" / "rank_0_0" / "backbone"
    unit.mkdir(parents=True)
    (unit / "vllm_compile_cache.py").write_text("{}\n")
    (unit / "cache_key_factors.json").write_text('{"code_hash": "a", "compiler_hash": "b", "config_hash": "c"}')
    root = tmp_path / "vllm" / "torch_compile_cache"
    push(kcache, root, oci_registry.url("team/vllm:v1"))
    labels = skopeo_inspect(oci_registry.host, "team/vllm:v1")["Labels"]
    assert labels["cache.vllm.image/entry-count"] == "1" and labels["cache.vllm.image/format"] == "unpacked"
    assert labels["cache.vllm.image/cache-size-bytes"] == str(sum(len(b) for b in files_of(root).values()))
    assert labels["io.kserve.km/framework"] == "vllm" and labels["io.kserve.km/cache-type"] == "torch-compile"
    assert labels["io.kserve.km/cache-hash"] == "0123456789"
    assert labels["io.kserve.km/cache-mount-subpath"] == "torch_compile_cache"
    names = _layer_names(oci_registry, "team/vllm:v1", tmp_path)
    assert "io.vllm.cache/torch_compile_cache/0123456789/rank_0_0/backbone/vllm_compile_cache.py" in names
    assert json.loads(names["io.vllm.manifest/manifest.json"])["vllm"][0]["vllm_hash"] == "0123456789"
    dest = tmp_path / "dest" / "torch_compile_cache"
    run = kcache("pull", "--remote", oci_registry.url("team/vllm:v1"), "--cache-dir", dest, "--no-gpu-check", "--json")
    assert run.exit_code == 0, run.stderr
    assert files_of(dest) == files_of(root)


def test_other_layouts_go_in_the_same_shape_with_kcaches_manifest(kcache, fixture_copy, oci_registry, tmp_path):
    hidet = fixture_copy("hidet")
    push(kcache, hidet, oci_registry.url("team/hidet:v1"))
    labels = skopeo_inspect(oci_registry.host, "team/hidet:v1")["Labels"]
    assert labels["cache.hidet.image/entry-count"] == "5"
    assert json.loads(labels["cache.hidet.image/summary"])["targets"] == [
        {"backend": "cpu", "arch": "cpu", "warp_size": 1}, {"backend": "cuda", "arch": "sm_90a", "warp_size": 32}]
    names = _layer_names(oci_registry, "team/hidet:v1", tmp_path)
    assert names["io.hidet.manifest/manifest.json"] == names["io.kcache.manifest/manifest.json"]
    assert json.loads(names["io.hidet.manifest/manifest.json"])["format"] == "kcache-archive"
    assert all(n.startswith(("io.hidet.cache/ops/", "io.hidet.manifest/", "io.kcache.manifest/")) for n in names)
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", oci_registry.url("team/hidet:v1"), "--cache-dir", dest, "--gpu", "sm_80", "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["imported"] == 3 and doc["skipped_other_arch"] == 2  # the CPU ops run anywhere; sm_90a not on 8.0
    assert sorted(p.parent.name for p in (dest / "ops").glob("cpu_space_0/*/*")) == ["fused", "matmul", "relu"]
    assert not (dest / "ops" / "cuda_space_0").exists()


def test_a_pull_that_skips_a_locked_entry_is_exit_3(kcache, fixture_copy, oci_registry, tmp_path):
    """A build holding an entry's lock past --lock-timeout: the image's other entries come in, then pull exits
    3, as import does (it said "skip ... its lock was held" and exited 0, so a CI step went on without it)."""
    pytest.importorskip("jsonschema")
    from test_json_schemas import check
    from test_locks import entry_lock_held

    url, dest, add = oci_registry.url("team/locked:v1"), tmp_path / "dest", "ops/cuda_space_0/add/8d1f7691cdf75e90"
    push(kcache, fixture_copy("hidet"), url)
    pull = ("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_90a")
    with entry_lock_held(dest, add):
        r = kcache("-q", *pull, "--lock-timeout", "0.5")
        j = kcache("--json", *pull, "--lock-timeout", "0.5")
    assert r.exit_code == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: 1 entry not pulled: its lock was held"), r.stderr
    assert not (dest / add).exists() and len(list(dest.glob("ops/*/*/*"))) == 4  # the rest came in
    doc = j.json()
    assert j.exit_code == 3 and doc["lock_timeouts"] == 1 and doc["skipped"] == 5 and doc["imported"] == 0, j.stdout
    check(doc, "pull-oci")
    again = kcache("--json", *pull)  # the build gone: it comes in
    assert again.exit_code == 0 and again.json()["imported"] == 1 and again.json()["lock_timeouts"] == 0
    assert (dest / add).is_dir()


def test_source_date_epoch_makes_two_pushes_of_an_unchanged_cache_one_image(kcache, triton, oci_registry,
                                                                            monkeypatch):
    """Two pushes of an unchanged cache made two manifests (the config's `created`, its history's and the
    manifest's created annotation were the clock's), so an image could not be compared by digest. With
    SOURCE_DATE_EPOCH set they are that time, as export's are: one digest. Age goes by it: prune
    --older-than takes an image of an old SOURCE_DATE_EPOCH (a commit's time) as old as that."""
    url = oci_registry.url("team/repro")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first, second = (push(kcache, triton, f"{url}:{tag}")["digest"] for tag in ("a", "b"))
    assert first == second
    raw = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{oci_registry.host}/team/repro:a"))
    assert raw["annotations"]["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"
    assert skopeo_inspect(oci_registry.host, "team/repro:a")["Created"] == "2023-11-14T22:13:20Z"
    listed = kcache("remote", "ls", "--remote", url, "--json").json()
    assert {i["created"] for i in listed["images"]} == {"2023-11-14T22:13:20+00:00"}, listed
    plan = kcache("remote", "prune", "--older-than", "30d", "--dry-run", "--remote", url, "--json").json()
    assert sorted(r["tag"] for r in plan["removed"]) == ["a", "b"]
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")  # the epoch itself is a time, not "none"
    assert push(kcache, triton, f"{url}:c")["digest"] != first
    listed = kcache("remote", "ls", "--remote", url, "--json").json()
    assert {i["tag"]: i["created"] for i in listed["images"]}["c"] == "1970-01-01T00:00:00+00:00", listed
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert push(kcache, triton, f"{url}:d")["digest"] != first  # the clock's time again


def test_a_malformed_source_date_epoch_pushes_nothing(kcache, triton, oci_registry, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    run = kcache("push", "--remote", oci_registry.url("team/badepoch:v1"), "--cache-dir", triton)
    assert run.exit_code == 2 and "SOURCE_DATE_EPOCH='yesterday'" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert kcache("remote", "ls", "--remote", oci_registry.url("team/badepoch"), "--json").json()["images"] == []


def _image(tag: str, created: float, size: int, digest: str | None = None):
    from kcache_cli.remote.oci import parse_ref
    from kcache_cli.remote.oci_ops import Image

    return Image(parse_ref(f"oci://r.example/team/k:{tag}"), digest or "sha256:" + tag * 64, ("", 0), size, {},
                 created, "triton")


def test_plan_prune_by_count_age_and_size_never_touches_the_kept():
    from kcache_cli.remote.oci_ops import plan_prune

    now = 1_000_000.0
    images = [_image("a", now - 9000, 100), _image("b", now - 5000, 100), _image("c", now - 100, 100),
              _image("d", now - 10, 100)]
    assert [r.image.ref.tag for r in plan_prune(images, 2, None, None, now)] == ["a", "b"]
    assert [r.image.ref.tag for r in plan_prune(images, None, 3600, None, now)] == ["a", "b"]
    assert [r.image.ref.tag for r in plan_prune(images, 3, 3600, None, now)] == ["a"]  # b is one of the 3 newest
    assert [r.image.ref.tag for r in plan_prune(images, None, None, 250, now)] == ["a", "b"]  # oldest first
    assert [r.image.ref.tag for r in plan_prune(images, 3, None, 0, now)] == ["a"]  # --keep wins over --max-size
    assert plan_prune(images, None, None, None, now) == []
    shared = [_image("x", now, 100, "sha256:" + "e" * 64), _image("y", now - 1, 100, "sha256:" + "e" * 64)]
    assert [r.image.ref.tag for r in plan_prune(shared, None, None, 50, now)] == ["y", "x"]


def test_the_json_of_every_oci_command_matches_its_schema(kcache, triton, oci_registry, tmp_path):
    pytest.importorskip("jsonschema")
    from test_json_schemas import check

    url = oci_registry.url("team/schemas")
    doc = push(kcache, triton, f"{url}:v1")
    check(doc, "push-oci")
    assert {"name": "cache.triton.image/entry-count", "value": "6"} in doc["labels"]
    pulled = kcache("pull", "--remote", f"{url}:v1", "--cache-dir", tmp_path / "d", "--gpu", "sm_80", "--json")
    runs = {"pull-oci": pulled,
            "remote-ls-oci": kcache("remote", "ls", "--remote", url, "--json"),
            "remote-stats-oci": kcache("remote", "stats", "--remote", url, "--json"),
            "remote-prune-oci": kcache("remote", "prune", "--keep", "0", "--dry-run", "--remote", url, "--json")}
    for command, run in runs.items():
        assert run.exit_code == 0, (command, run.stderr)
        check(run.json(), command)
    assert [r["tag"] for r in runs["remote-prune-oci"].json()["removed"]] == ["v1"]
