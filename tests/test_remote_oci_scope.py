"""What a second outside test of the oci:// remote found, against a real registry (Debian's docker-registry):
a whole-repository command given a tag refuses it (a prune of `:v2` planned every tag); an image pinned by
digest pulls, its manifest checked against the digest, and the `@` of a digest is no password's; the arch
rule a pull uses is its layout's (Triton: the exact capability), as explain's; CPU code counts as cpu;
per-target stats count that target's entries; the push and pull summaries say what happened."""

from __future__ import annotations

from pathlib import Path

import pytest
from oci_registry import skopeo
from test_remote_oci import SM80

pytestmark = pytest.mark.oci


@pytest.fixture
def triton(fixture_copy) -> Path:
    return fixture_copy("triton") / "cache"


def push(kcache, root: Path, url: str, *args: str):
    run = kcache("push", "--remote", url, "--cache-dir", root, "--json", *args)
    assert run.exit_code == 0, run.stderr
    return run.json()


# ---- a repository-level command names a repository, never a tag --------------------------------------

def test_a_tag_in_the_url_of_remote_prune_is_a_usage_error_and_ls_stats_note_it(kcache, triton, oci_registry):
    """prune of `…:v2` planned every tag: refused (exit 2). ls and stats only read: a KCACHE_REMOTE set to
    an image, as push and pull take it, still lists its repository, with a note that the tag selects
    nothing."""
    repo = oci_registry.url("team/scope")
    push(kcache, triton, f"{repo}:v1")
    push(kcache, triton, f"{repo}:v2", "--space", "sm_80")
    skopeo("copy", "--src-tls-verify=false", "--dest-tls-verify=false", f"docker://{oci_registry.host}/team/scope:v2",
           f"docker://{oci_registry.host}/team/scope:v2same")
    for args in (["ls"], ["stats"]):
        run = kcache("remote", *args, "--remote", f"{repo}:v2", "--json")
        assert run.exit_code == 0 and "selects nothing" in run.stderr, (args, run.stderr)
    assert len(kcache("remote", "ls", "--json", env={"KCACHE_REMOTE": f"{repo}:v1"}).json()["images"]) == 3
    for args in (["prune", "--keep", "0", "--dry-run"], ["prune", "--keep", "0"]):
        run = kcache("remote", *args, "--remote", f"{repo}:v2", "--json")
        assert run.exit_code == 2, (args, run.stdout)
        assert run.json()["exit"] == 2 and "name the repository without a tag" in run.json()["error"]
        assert f"--remote {repo})" in run.json()["error"]  # says which URL to give
    tags = [i["tag"] for i in kcache("remote", "ls", "--remote", repo, "--json").json()["images"]]
    assert sorted(tags) == ["v1", "v2", "v2same"]  # nothing was removed
    dry = kcache("remote", "prune", "--keep", "0", "--dry-run", "--remote", repo, "--json")
    assert dry.exit_code == 0 and sorted(r["tag"] for r in dry.json()["removed"]) == ["v1", "v2", "v2same"]


# ---- an image pinned by digest ------------------------------------------------------------------------

DIGEST_URL = "oci+http://127.0.0.1:5000/kernels/tri@sha256:" + "65fb" * 16


def test_the_at_of_a_digest_is_no_password_and_a_password_before_it_still_is():
    from kcache_cli.remote.redact import redact_text, redact_url

    assert redact_url(DIGEST_URL) == DIGEST_URL  # host and repository stay readable
    assert redact_text(f"Error: remote '{DIGEST_URL}': refused") == f"Error: remote '{DIGEST_URL}': refused"
    hidden = redact_url("oci://al:hun/ter2@reg.example:5000/kernels/tri@sha256:" + "0" * 64)
    assert hidden == "oci://***@reg.example:5000/kernels/tri@sha256:" + "0" * 64
    assert redact_url("file:///mnt/a@b/cache") == "file:///mnt/a@b/cache"  # no authority: nothing of it hidden


def test_an_image_pinned_by_digest_pulls_and_explains(kcache, triton, oci_registry, tmp_path):
    repo = oci_registry.url("team/pinned")
    digest = push(kcache, triton, f"{repo}:v1")["digest"]
    push(kcache, triton, f"{repo}:v1", "--space", "sm_90a")  # the tag moves on; the digest still names v1's image
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", f"{repo}@{digest}", "--cache-dir", dest, "--gpu", "sm_80", "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["digest"] == digest and doc["remote"] == f"{repo}@{digest}"
    assert doc["imported"] == 3 and doc["skipped_other_arch"] == 3  # v1's sm_80 kernels: the moved tag has none
    explained = kcache("explain", f"{repo}@{digest}", "--gpu", "sm_80", "--json")
    assert explained.exit_code == 0, explained.stderr
    assert len(explained.json()["items"]) == 6
    assert all(e["path"] == f"{repo}@{digest}" for e in explained.json()["items"])


def test_a_digest_where_a_tag_belongs_or_a_bad_digest_is_a_clear_usage_error(kcache, triton, oci_registry):
    repo = oci_registry.url("team/pinned-bad")
    digest = push(kcache, triton, f"{repo}:v1")["digest"]
    run = kcache("push", "--remote", f"{repo}@{digest}", "--cache-dir", triton)
    assert run.exit_code == 2 and "name a tag, not a digest" in run.stderr and "***" not in run.stderr
    run = kcache("remote", "prune", "--keep", "0", "--remote", f"{repo}@{digest}")
    assert run.exit_code == 2 and "without a tag or digest" in run.stderr and f"--remote {repo})" in run.stderr
    run = kcache("pull", "--remote", f"{repo}@sha256:abc", "--gpu", "sm_80")
    assert run.exit_code == 2 and "'sha256:abc' is not a digest" in run.stderr
    assert f"{repo}@sha256:abc" in run.stderr and "***" not in run.stderr


def test_a_manifest_that_does_not_hash_to_the_pinned_digest_is_refused(kcache, tmp_path):
    import hashlib

    from test_remote_oci_hostile import Hostile, send

    h = Hostile()
    try:
        h.answer(lambda r: send(r, 200, b'{"schemaVersion": 2, "layers": []}',
                                {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}))
        pinned = "sha256:" + hashlib.sha256(b"another manifest").hexdigest()
        dest = tmp_path / "dest"
        run = kcache("pull", "--remote", f"oci+http://{h.host}/team/k@{pinned}", "--cache-dir", dest, "--gpu",
                     "sm_80")
    finally:
        h.close()
    assert run.exit_code == 1 and "has another digest" in run.stderr and not dest.exists()
    assert any(path == f"/v2/team/k/manifests/{pinned}" for _, path, _ in h.seen)


# ---- the arch rule a pull goes by is its layout's, as explain's --------------------------------------

def test_triton_kernels_built_for_sm_80_are_not_pulled_onto_sm_86(kcache, triton, oci_registry, tmp_path):
    url = oci_registry.url("team/ampere:v1")
    push(kcache, triton, url, "--space", "sm_80")
    dest = tmp_path / "dest"
    run = kcache("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_86")
    assert run.exit_code == 1 and "built for sm_80; this node runs sm_86" in run.stderr and not dest.exists()
    mixed = oci_registry.url("team/ampere:mixed")
    push(kcache, triton, mixed)
    run = kcache("pull", "--remote", mixed, "--cache-dir", dest, "--gpu", "sm_86,sm_90", "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()  # Triton looks an sm_80 kernel up on 8.0 only; sm_90a's on 9.0
    assert doc["imported"] == 3 and doc["skipped_other_arch"] == 3
    assert all(e["arch"] == "sm_90a" for e in doc["entries"])


def test_the_arch_rule_is_the_layouts_and_tritons_explain_goes_by_it():
    from kcache_cli import layouts
    from kcache_cli.layouts.base import Here

    triton, hidet, inductor = (layouts.get(n) for n in ("triton", "hidet", "inductor"))
    assert hidet.runs_on("sm_80", ["sm_86"]) and not hidet.runs_on("sm_86", ["sm_80"])  # the driver's rule
    assert hidet.runs_on("compute_80", ["sm_90"]) and not hidet.runs_on("sm_90a", ["sm_100"])
    assert not triton.runs_on("sm_80", ["sm_86"]) and triton.runs_on("sm_80", ["sm_86", "sm_80"])
    assert triton.runs_on("sm_90a", ["sm_90"]) and not triton.runs_on("sm_90a", ["sm_100"])
    assert not inductor.runs_on("sm_80", ["sm_86"])  # its GPU code is Triton kernels
    assert all(lay.runs_on("cpu", []) for lay in (triton, hidet, inductor))
    for arch in ("sm_80", "sm_86", "sm_90a"):
        for gpu in ("sm_80", "sm_86", "sm_90"):
            here = Here("3.11", None, {"triton": "3.9.0"}, gpu, "--gpu", {})
            verdict = triton.explain_record({"relpath": "K" * 52, "compiler": "triton 3.9.0", "arch": arch,
                                             "status": "complete"}, here)
            assert (verdict.factor != "target arch") == triton.runs_on(arch, [gpu]), (arch, gpu, verdict)


# ---- CPU code is the cpu target; an image of no GPU code pulls without a GPU -------------------------

@pytest.fixture
def no_gpu(tmp_path, monkeypatch) -> None:
    """A node without nvidia-smi on its PATH: no GPU found."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


@pytest.fixture
def inductor_cpu(tmp_path) -> Path:
    """The CPU Inductor cache torch.compile made (tests/loaders/recorded/inductor.tar.gz): C++ code shards
    (.cpp, .so), Python wrappers, fx graphs and autograd entries."""
    from loaders import recorded

    return recorded.extract_tree("inductor", tmp_path / "inductor")


def _cpp_shards(root: Path) -> set[str]:
    return {d.name for d in root.iterdir() if len(d.name) == 2 and d.name != "fx" and any(d.iterdir())
            and all(f.suffix in (".cpp", ".so") for f in d.iterdir())}


def test_inductors_cpp_code_is_a_cpu_target_in_ls_the_summary_and_a_pull(kcache, inductor_cpu, oci_registry,
                                                                         tmp_path, no_gpu):
    import json

    from oci_registry import skopeo_inspect

    cpp = _cpp_shards(inductor_cpu)
    assert len(cpp) >= 10
    listed = kcache("ls", "--cache-dir", inductor_cpu, "--target", "cpu", "--json").json()["entries"]
    assert {e["hash"] for e in listed} == cpp and {(e["kind"], e["target"]) for e in listed} == {("code", "cpu")}
    everything = kcache("ls", "--cache-dir", inductor_cpu, "--json").json()["entries"]
    assert {e["target"] for e in everything if e["hash"] not in cpp} == {None}  # graphs, wrappers: cannot tell
    url = oci_registry.url("team/inductor-cpu:v1")
    push(kcache, inductor_cpu, url)
    summary = json.loads(skopeo_inspect(oci_registry.host, "team/inductor-cpu:v1")["Labels"][
        "cache.inductor.image/summary"])
    assert summary == {"targets": [{"backend": "cpu", "arch": "cpu", "warp_size": 1}]}  # was: {"targets": []}
    run = kcache("pull", "--remote", url, "--cache-dir", tmp_path / "all", "--json")
    assert run.exit_code == 0, run.stderr  # was: exit 2, "no GPU found here"
    assert run.json()["imported"] == len(everything) and run.json()["gpu"] is None
    run = kcache("pull", "--remote", url, "--cache-dir", tmp_path / "cpu", "--target", "cpu", "--json")
    assert run.exit_code == 0, run.stderr
    assert {e["relpath"] for e in run.json()["entries"]} == cpp  # was: nothing selected


def test_a_vllm_image_whose_entries_name_no_gpu_arch_pulls_without_a_gpu(kcache, oci_registry, tmp_path, no_gpu):
    from loaders import recorded

    root = recorded.extract_tree("vllm", tmp_path / "vllm" / "root")
    assert kcache("--cache-dir", root, "verify", "--fix").exit_code == 0
    url = oci_registry.url("team/vllm-cpu:v1")
    assert all(e["arch"] is None for e in push(kcache, root, url)["entries"])
    run = kcache("pull", "--remote", url, "--cache-dir", tmp_path / "dest" / "torch_compile_cache", "--json")
    assert run.exit_code == 0, run.stderr  # was: exit 2, "no GPU found here"
    assert run.json()["imported"] == 2


# ---- what push and pull say ---------------------------------------------------------------------------

def test_a_push_whose_selection_matches_nothing_says_so(kcache, triton, oci_registry):
    url = oci_registry.url("team/none:v1")
    for dry in ([], ["--dry-run"]):
        run = kcache("--cache-dir", triton, "push", "--remote", url, "--op", "nosuch", *dry)
        assert run.exit_code == 2 and "one layout" not in run.stderr, run.stderr
        assert f"no entries in {triton} match the selection: nothing to push" in run.stderr
    assert kcache("remote", "ls", "--remote", oci_registry.url("team/none"), "--json").json()["images"] == []


def test_the_pull_summary_counts_the_bytes_of_what_was_pulled(kcache, triton, oci_registry, tmp_path):
    url = oci_registry.url("team/sizes:v1")
    push(kcache, triton, url)
    dest = tmp_path / "dest"
    dry = kcache("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_80", "--dry-run", "--json").json()
    first = kcache("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_80", "--json").json()
    assert first["size"] == sum(e["size"] for e in first["entries"]) > 0 and dry["size"] == first["size"]
    again = kcache("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_80")
    assert again.exit_code == 0, again.stderr
    assert "pulled 0 entries (0 B) from" in again.stderr and "skipped 3 present here" in again.stderr
    doc = kcache("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_80", "--json").json()
    assert doc["imported"] == 0 and doc["skipped"] == 3 and doc["size"] == 0  # was: the skipped entries' bytes


def test_an_oci_pull_names_its_actions_as_every_pull_does(kcache, triton, oci_registry, tmp_path):
    url = oci_registry.url("team/actions:v1")
    push(kcache, triton, url)
    dest = tmp_path / "dest"
    first = kcache("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_80", "--json").json()
    assert {e["action"] for e in first["entries"]} == {"pull"}  # was: "import"
    again = kcache("pull", "--remote", url, "--cache-dir", dest, "--gpu", "sm_80", "--json").json()
    assert {e["action"] for e in again["entries"]} == {"skip"}
    table = kcache("pull", "--remote", url, "--cache-dir", tmp_path / "other", "--gpu", "sm_80")
    actions = [line.split()[0] for line in table.stdout.splitlines()[1:]]
    assert sorted(set(actions)) == ["pull", "skip"] and actions.count("pull") == 3  # sm_90a ones: skip


# ---- remote stats per target counts that target's entries --------------------------------------------

def test_remote_stats_per_target_counts_that_targets_entries(kcache, triton, oci_registry):
    from test_remote_oci import files_of

    repo = oci_registry.url("team/per-target")
    push(kcache, triton, f"{repo}:both")
    push(kcache, triton, f"{repo}:ampere", "--space", "sm_80")
    doc = kcache("remote", "stats", "--remote", repo, "--json").json()
    sizes = {arch: sum(len(b) for n, b in files_of(triton).items() if n.split("/")[0] in keys)
             for arch, keys in (("sm_80", SM80), ("sm_90a", {n.split("/")[0] for n in files_of(triton)} - SM80))}
    assert doc["by_target"]["sm_80"] == {"tags": 2, "entry_count": 6, "size": 2 * sizes["sm_80"]}
    assert doc["by_target"]["sm_90a"] == {"tags": 1, "entry_count": 3, "size": sizes["sm_90a"]}  # was: 6, the image's
    assert sum(g["entry_count"] for g in doc["by_target"].values()) == doc["entry_count"] == 9


def test_remote_stats_says_when_the_labels_cannot_tell_targets_apart(kcache, oci_registry):
    from test_remote_oci import _raw_image

    _raw_image(oci_registry, {"io.triton.cache/K/a.json": b"{}"},  # as an older kcache labelled a two-target image
               {"io.kcache.image/layout": "triton", "cache.triton.image/entry-count": "2",
                "cache.triton.image/summary": '{"targets":[{"backend":"cuda","arch":"80","warp_size":32},'
                                              '{"backend":"cuda","arch":"90","warp_size":32}]}'})
    run = kcache("remote", "stats", "--remote", oci_registry.url("team/foreign"), "--json")
    assert run.exit_code == 0, run.stderr
    doc = run.json()
    assert doc["entry_count"] == 2
    assert doc["by_target"] == {t: {"tags": 1, "entry_count": None, "size": None} for t in ("sm_80", "sm_90a")}
    human = kcache("remote", "stats", "--remote", oci_registry.url("team/foreign"))
    assert "do not count them apart" in human.stderr
