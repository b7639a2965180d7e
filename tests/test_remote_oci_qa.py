"""What an outside QA pass found in the oci:// remote, against a real registry (Debian's docker-registry):
a CPU-only image pulls on a node without a GPU; `push --dry-run` lists the entries the real push sends,
with the size it reports; `pull --json` names the GPU --gpu gave; push's and pull's tables fit the
terminal and the image reference stays whole on its line; `push --help` says once where the cache is."""

from __future__ import annotations

from pathlib import Path

import pytest
from oci_registry import skopeo_inspect
from test_remote_oci import SM80

pytestmark = pytest.mark.oci


@pytest.fixture
def triton(fixture_copy) -> Path:
    return fixture_copy("triton") / "cache"


@pytest.fixture
def no_gpu(tmp_path, monkeypatch) -> None:
    """A node without nvidia-smi on its PATH: no GPU found."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


def push(kcache, root: Path, url: str, *args: str, env: dict | None = None):
    run = kcache("push", "--remote", url, "--cache-dir", root, *args, env=env)
    assert run.exit_code == 0, run.stderr
    return run


def test_a_cpu_only_image_pulls_on_a_node_without_a_gpu(kcache, fixture_copy, oci_registry, tmp_path, no_gpu):
    url = oci_registry.url("team/numba:v1")
    push(kcache, fixture_copy("numba"), url)
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", url, "--cache-dir", dest, "--json")
    assert run.exit_code == 0, run.stderr  # was: exit 2, "no GPU found here"
    doc = run.json()
    assert doc["imported"] == 1 and doc["gpu"] is None and doc["skipped_other_arch"] == 0
    assert "no GPU" not in run.stderr


def test_without_a_gpu_only_the_selected_cpu_entries_of_a_mixed_image_pull(kcache, fixture_copy, oci_registry,
                                                                           tmp_path, no_gpu):
    url = oci_registry.url("team/hidet-mixed:v1")
    push(kcache, fixture_copy("hidet"), url)  # cpu and sm_90a targets
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", url, "--cache-dir", dest)  # GPU targets, no GPU: as before
    assert run.exit_code == 2 and "no GPU found" in run.stderr and "--no-gpu-check" in run.stderr
    assert not dest.exists()
    run = kcache("pull", "--remote", url, "--cache-dir", dest, "--op", "softmax")  # a CUDA op selected
    assert run.exit_code == 2 and "no GPU found" in run.stderr and not dest.exists()
    run = kcache("pull", "--remote", url, "--cache-dir", dest, "--target", "cpu", "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["imported"] == 3 and doc["skipped_other_arch"] == 0 and doc["gpu"] is None
    assert sorted(p.parent.name for p in (dest / "ops").glob("cpu_space_0/*/*")) == ["fused", "matmul", "relu"]
    assert not (dest / "ops" / "cuda_space_0").exists()


def test_an_oci_dry_run_lists_what_the_real_push_sends(kcache, triton, oci_registry, tmp_path):
    url = oci_registry.url("team/dry:v1")
    dry = push(kcache, triton, url, "-n", "--json").json()
    listed = kcache("remote", "ls", "--remote", oci_registry.url("team/dry"), "--json")
    assert listed.exit_code == 0 and listed.json()["images"] == []  # nothing pushed
    shared = tmp_path / "shared"
    shared.mkdir()
    to_dir = push(kcache, triton, f"file://{shared}", "-n", "--json").json()
    real = push(kcache, triton, url, "--json").json()

    def rows(doc):
        return sorted((e["relpath"], e["file_count"], e["size"]) for e in doc["entries"])

    assert len(rows(real)) == 6 and rows(dry) == rows(real) == rows(to_dir)
    assert dry["size"] == real["size"] == to_dir["size"] == sum(e["size"] for e in real["entries"])
    assert dry["planned"] == dry["pushed"] == to_dir["pushed"] == 6 and dry["dry_run"] is True  # what would go
    human = push(kcache, triton, url, "-n")
    assert all(h in human.stdout for h, _, _ in rows(real))  # a table of the entries, as file:// prints
    assert human.stdout.split("\n")[0].split()[:2] == ["action", "layout"]


def test_pull_json_names_the_gpu_the_text_names(kcache, triton, oci_registry, tmp_path):
    url = oci_registry.url("team/gpu:v1")
    push(kcache, triton, url)
    run = kcache("pull", "--remote", url, "--cache-dir", tmp_path / "d", "--gpu", "sm_90a", "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["gpu"] == ["sm_90a"]
    assert {r["reason"] for r in doc["left_out"]} == {"built for sm_80; this node runs sm_90a"}


def stderr_lines_fit(stderr: str, width: int, ref: str) -> None:
    """Every stderr line fits, but for the image reference alone on its line; the reference is never cut."""
    lines = stderr.splitlines()
    assert any(ref in line for line in lines), stderr
    wide = [ln for ln in lines if len(ln) > width and ln.strip() != ref]
    assert not wide, stderr


@pytest.mark.parametrize("width", (80, 40))
def test_push_and_pull_fit_the_terminal_and_keep_the_reference_whole(kcache, triton, oci_registry, tmp_path, width):
    url = oci_registry.url(f"team/triton-{width}:v1")
    env = {"COLUMNS": str(width)}
    run = push(kcache, triton, url, env=env)
    digest = skopeo_inspect(oci_registry.host, f"team/triton-{width}:v1")["Digest"]
    assert all(len(line) <= width for line in run.stdout.splitlines()), run.stdout
    assert all(h[:8] in run.stdout for h in SM80)
    stderr_lines_fit(run.stderr, width, f"{url}@{digest}")
    dry = push(kcache, triton, url, "-n", env=env)
    assert all(len(line) <= width for line in dry.stdout.splitlines()), dry.stdout
    stderr_lines_fit(dry.stderr, width, url)

    pulled = kcache("pull", "--remote", url, "--cache-dir", tmp_path / "p", "--gpu", "sm_80", env=env)
    assert pulled.exit_code == 0, pulled.stderr
    assert all(len(line) <= width for line in pulled.stdout.splitlines()), pulled.stdout
    assert sum(line.startswith("pull ") for line in pulled.stdout.splitlines()) == 3
    assert sum(line.startswith("skip") for line in pulled.stdout.splitlines()) == 3
    assert all(h[:8] in pulled.stdout for h in SM80)
    stderr_lines_fit(pulled.stderr, width, url + ";")


def test_push_help_says_once_where_the_local_cache_is(kcache):
    run = kcache("push", "--help", env={"COLUMNS": "200"})
    assert run.exit_code == 0
    assert "every cache found" not in run.stdout  # push works on one root, never on every cache
    text = " ".join(run.stdout.split())
    assert text.count("own cache") == 1  # said in one place: the --cache-dir option
    assert "--cache-dir PATH The local cache (default: KCACHE_DIR; else, with one --layout, that layout's own " \
        "cache; else hidet's)" in text


def test_what_push_help_says_of_the_local_cache_is_what_push_does(kcache, fixture_copy, tmp_path):
    home = tmp_path / "home"
    fixture_copy("hidet", str(home / ".cache" / "hidet"))
    triton = fixture_copy("triton", "t") / "cache"
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {"HOME": str(home), "KCACHE_DIR": None, "XDG_CACHE_HOME": None, "HIDET_CACHE_DIR": None,
           "TRITON_CACHE_DIR": str(triton)}
    plain = kcache("push", "-n", "--remote", f"file://{shared}", "--json", env=env)
    assert plain.exit_code == 0, plain.stderr
    assert plain.json()["root"] == str(home / ".cache" / "hidet")  # not every cache found: hidet's
    one = kcache("push", "-n", "--layout", "triton", "--remote", f"file://{shared}", "--json", env=env)
    assert one.exit_code == 0, one.stderr
    assert one.json()["root"] == str(triton)  # one --layout: that layout's own cache


def test_an_image_is_explained_as_the_archive_of_the_same_cache(kcache, triton, oci_registry, tmp_path):
    """DESIGN §9: explain compares what an entry, archive, image or blob records. An image was looked for as
    an entry ("no entry matches ... in <another cache>"); it is judged by its manifest records, as the
    archive exported from the same cache is, nothing written."""
    import json

    from test_explain import fake_python

    url = oci_registry.url("team/explain:v1")
    push(kcache, triton, url)
    archive = tmp_path / "same.tar.gz"
    assert kcache("--cache-dir", triton, "export", archive).exit_code == 0
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    here = tmp_path / "here"

    def verdicts(target: str) -> dict:
        run = kcache("--cache-dir", here, "--json", "explain", target, "--python", py, "--gpu", "sm_90a")
        assert run.exit_code == 0, run.stderr
        return {i["what"]: (i["verdict"], i["factor"], i["recorded"]) for i in json.loads(run.stdout)["items"]}

    from_image = verdicts(url)
    assert len(from_image) == 6 and from_image == verdicts(str(archive))
    assert {k for k, v in from_image.items() if v[0] == "hit"} == set(from_image) - SM80
    assert not here.exists()


def test_an_image_s_verdict_says_it_is_for_the_entries_kcache_pull_writes(kcache, triton, oci_registry, tmp_path):
    """The layer holds Triton's group files as they were on the pushing machine (absolute child paths);
    only kcache pull rewrites them, so a mount of the image as it is misses every kernel. Explain's hit on an
    image is a hit after kcache pull, and says so, in --json and in the table."""
    import io
    import json
    import os
    import tarfile

    from test_explain import fake_python

    from kcache_cli.remote.oci import Registry, parse_ref

    url = oci_registry.url("team/mounted:v1")
    push(kcache, triton, url)
    reg = Registry(parse_ref(url))
    layer = json.loads(reg.get_manifest("v1")[0])["layers"][0]
    tar = tarfile.open(fileobj=io.BytesIO(reg.get_blob(layer["digest"], layer["size"], 1 << 30)), mode="r:gz")
    groups = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar if "/__grp__" in m.name}  # type: ignore
    assert groups and all(data == (triton / rel).read_bytes() for rel, data in groups.items())  # byte for byte
    assert all(os.path.isabs(p) for data in groups.values() for p in json.loads(data)["child_paths"].values())
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    run = kcache("--json", "explain", url, "--python", py, "--gpu", "sm_90a")
    assert run.exit_code == 0, run.stderr
    hits = [i for i in json.loads(run.stdout)["items"] if i["verdict"] == "hit"]
    assert hits and all("kcache pull" in i["why"] and "mount" in i["why"] for i in hits)
    table = kcache("explain", url, "--python", py, "--gpu", "sm_90a", env={"COLUMNS": "400"})
    assert table.exit_code == 0 and table.stdout.count("kcache pull") >= len(hits), table.stdout


def test_explain_says_miss_where_pull_refuses_the_image_for_trust(kcache, triton, oci_registry, tmp_path):
    """With a trust list set, pull refuses an unsigned image (exit 1): nothing of it will arrive, so explain
    says miss for every entry, with pull's reason, not hit."""
    import json

    pytest.importorskip("cryptography")
    from test_explain import fake_python
    from test_remote_trust import keygen, node

    url = oci_registry.url("team/unsigned:v1")
    push(kcache, triton, url, env=node(tmp_path, "pusher"))  # no signing key: unsigned
    b = node(tmp_path, "b")
    env = {**b, "KCACHE_TRUSTED_KEYS": keygen(kcache, node(tmp_path, "a"))}
    assert kcache("pull", "--remote", url, "--cache-dir", tmp_path / "b", "--gpu", "sm_90a", env=env).exit_code == 1
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    run = kcache("--json", "explain", url, "--python", py, "--gpu", "sm_90a", env=env)
    assert run.exit_code == 0, run.stderr
    items = json.loads(run.stdout)["items"]
    assert items and all(i["verdict"] == "miss" and "not signed" in i["why"] and "pull" in i["why"] for i in items)
    trusting_none = kcache("--json", "explain", url, "--python", py, "--gpu", "sm_90a", env=b)
    assert json.loads(trusting_none.stdout)["hit"] > 0  # no trust list: as before
    archive = tmp_path / "unsigned.tar.gz"  # import refuses it as pull does: the same verdicts, import's words
    assert kcache("--cache-dir", triton, "export", archive, env=node(tmp_path, "exporter")).exit_code == 0
    assert kcache("--cache-dir", tmp_path / "c", "import", archive, env=env).exit_code == 1
    run = kcache("--json", "explain", archive, "--python", py, "--gpu", "sm_90a", env=env)
    items = json.loads(run.stdout)["items"]
    assert items and all(i["verdict"] == "miss" and i["why"].startswith("import refuses it: not signed")
                         for i in items)


def _unsigned_for_sm80(reg) -> None:
    """The image at tag v1 again under the tag `mixed`, its manifest's sm_80 records stripped of their signature."""
    import gzip
    import io
    import json
    import tarfile

    from test_remote_oci_redteam import _put_with_layer

    from kcache_cli.remote import oci_image as img
    from kcache_cli.remote.oci_ops import read_image

    image = read_image(reg, "v1")
    src = tarfile.open(fileobj=io.BytesIO(reg.get_blob(image.layer[0], image.layer[1], 1 << 30)), mode="r:gz")
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as out:
        for m in src:
            data = src.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            if m.name == img.KCACHE_MANIFEST:
                doc = json.loads(data)  # type: ignore[arg-type]
                for rec in doc["entries"]:
                    if rec["relpath"] in SM80:
                        rec.pop("signature")
                data = json.dumps(doc).encode()
                m.size = len(data)
            out.addfile(m, io.BytesIO(data) if data is not None else None)
    _put_with_layer(reg, image, raw.getvalue(), "mixed")


def test_explain_of_an_image_leaves_out_for_trust_what_pull_leaves_out_for_arch(kcache, triton, oci_registry,
                                                                               tmp_path):
    """Pull keeps the entries this GPU runs, then checks their signatures: an unsigned sm_80 entry does not
    stop an sm_90a pull. Explain said the whole image was refused for it; it now judges as pull takes."""
    import json

    pytest.importorskip("cryptography")
    from test_explain import fake_python
    from test_remote_trust import keygen, node

    from kcache_cli.remote.oci import Registry, parse_ref

    a = node(tmp_path, "a")
    env = {**node(tmp_path, "b"), "KCACHE_TRUSTED_KEYS": keygen(kcache, a)}
    push(kcache, triton, oci_registry.url("team/partly:v1"), env=a)  # signed by a
    _unsigned_for_sm80(Registry(parse_ref(oci_registry.url("team/partly:v1"))))
    url = oci_registry.url("team/partly:mixed")
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    for gpu, pulls in (("sm_90a", True), ("sm_80", False)):
        pull = kcache("pull", "--remote", url, "--cache-dir", tmp_path / gpu, "--gpu", gpu, env=env)
        assert pull.exit_code == (0 if pulls else 1), pull.stderr
        run = kcache("--json", "explain", url, "--python", py, "--gpu", gpu, env=env)
        assert run.exit_code == 0, run.stderr
        items = {i["what"]: i for i in json.loads(run.stdout)["items"]}
        assert len(items) == 6
        if pulls:  # what pull writes is a hit; the sm_80 entries a miss for their arch, not for trust
            assert {k for k, i in items.items() if i["verdict"] == "hit"} == set(items) - SM80
            assert all(items[k]["verdict"] == "miss" and "signed" not in items[k]["why"] for k in SM80)
        else:  # pull refuses the image for the sm_80 entries it keeps: every entry is a miss
            assert all(i["verdict"] == "miss" and "pull refuses" in i["why"] for i in items.values())


def test_explain_of_an_image_kcache_did_not_push_speaks_of_explaining(kcache, oci_registry, tmp_path):
    from test_remote_oci import _raw_image

    _raw_image(oci_registry, {"io.triton.cache/K/x.json": b"{}", "io.triton.manifest/manifest.json": b"{}"},
               {"cache.triton.image/entry-count": "1"})
    run = kcache("explain", oci_registry.url("team/foreign:v1"), "--gpu", "sm_80")
    line = run.stderr.strip()
    assert run.exit_code == 1 and "not an image kcache pushed" in line and len(line.splitlines()) == 1, run.stderr
    assert "pull" not in line and "explain" in line, line
