"""What a second outside test of the oci:// remote found, against a real registry (Debian's docker-registry):
a whole-repository command given a tag refuses it (a prune of `:v2` planned every tag); an image pinned by
digest pulls, its manifest checked against the digest, and the `@` of a digest is no password's; the arch
rule a pull uses is its layout's (Triton: the exact capability), as explain's; CPU code counts as cpu;
per-target stats count that target's entries; the push and pull summaries say what happened."""

from __future__ import annotations

from pathlib import Path

import pytest
from oci_registry import skopeo

pytestmark = pytest.mark.oci


@pytest.fixture
def triton(fixture_copy) -> Path:
    return fixture_copy("triton") / "cache"


def push(kcache, root: Path, url: str, *args: str):
    run = kcache("push", "--remote", url, "--cache-dir", root, "--json", *args)
    assert run.exit_code == 0, run.stderr
    return run.json()


# ---- a repository-level command names a repository, never a tag --------------------------------------

def test_a_tag_in_the_url_of_remote_ls_stats_or_prune_is_a_usage_error(kcache, triton, oci_registry):
    repo = oci_registry.url("team/scope")
    push(kcache, triton, f"{repo}:v1")
    push(kcache, triton, f"{repo}:v2", "--space", "sm_80")
    skopeo("copy", "--src-tls-verify=false", "--dest-tls-verify=false", f"docker://{oci_registry.host}/team/scope:v2",
           f"docker://{oci_registry.host}/team/scope:v2same")
    for args in (["prune", "--keep", "0", "--dry-run"], ["prune", "--keep", "0"], ["ls"], ["stats"]):
        run = kcache("remote", *args, "--remote", f"{repo}:v2", "--json")
        assert run.exit_code == 2, (args, run.stdout)
        assert run.json()["exit"] == 2 and "name the repository without a tag" in run.json()["error"]
        assert f"--remote {repo})" in run.json()["error"]  # says which URL to give
    tags = [i["tag"] for i in kcache("remote", "ls", "--remote", repo, "--json").json()["images"]]
    assert sorted(tags) == ["v1", "v2", "v2same"]  # nothing was removed
    dry = kcache("remote", "prune", "--keep", "0", "--dry-run", "--remote", repo, "--json")
    assert dry.exit_code == 0 and sorted(r["tag"] for r in dry.json()["removed"]) == ["v1", "v2", "v2same"]
