"""`kcache explain` against a made-up "here" (a stand-in python that answers importlib.metadata's question
with fixed versions): Triton's factors (version, key era, target arch/backend, status, switches), Inductor's
and a blob's. The real Triton agreeing with each verdict is tests/loaders/test_oracle_explain.py."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import copy_tree

from kcache_cli.formats import megacache

FIXTURES = Path(__file__).parent / "fixtures" / "real"
SM80 = {"22DX5RUZ7YPKNU74O7GAUCGIGIPAEV2FCKTGJU2B2LNOL5MZNINQ", "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA",
        "LOZKL4OW66ML5G7PWO4EI23LW6FIRVU24FT4ZLGIYGLVKG65YUFQ"}


def fake_python(tmp_path: Path, versions: dict, name: str = "python") -> str:
    """An executable that answers explain's question as a Python with `versions` installed would."""
    exe = tmp_path / name
    doc = {"python": "3.11.7", "executable": str(exe), "versions": versions}
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(doc)}\nEOF\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.fixture
def triton39(tmp_path, kcache) -> Path:
    root = tmp_path / "triton"
    shutil.copytree(FIXTURES / "triton" / "cache", root)
    assert kcache("--cache-dir", root, "verify", "--fix").exit_code == 0  # paths made to point here
    return root


@pytest.fixture
def home_caches() -> dict[str, Path]:
    """hidet, tilus, tilelang and Triton caches where their compilers keep them under HOME (the test's own):
    the default scope, every cache `kcache dir --all` finds."""
    home = Path(os.environ["HOME"])
    roots = {"hidet": home / ".cache" / "hidet", "tilus": home / ".cache" / "tilus",
             "tilelang": home / ".tilelang" / "cache", "triton": home / ".triton" / "cache"}
    for name in ("hidet", "tilus", "tilelang"):
        copy_tree(FIXTURES / name, roots[name])
    copy_tree(FIXTURES / "triton" / "cache", roots["triton"])
    return roots


def explain(kcache, root, *args, env=None) -> dict:
    r = kcache("--cache-dir", root, "--json", "explain", *args, env=env)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def by_what(doc: dict) -> dict[str, dict]:
    return {i["what"]: i for i in doc["items"]}


def test_triton_hits_exactly_the_complete_kernels_of_the_arch(triton39, tmp_path, kcache):
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    doc = explain(kcache, triton39, "--python", py, "--gpu", "sm_90a")
    items = by_what(doc)
    assert {k for k, v in items.items() if v["verdict"] == "hit"} == set(items) - SM80
    for k in SM80:
        assert items[k]["verdict"] == "miss" and (items[k]["factor"], items[k]["recorded"], items[k]["here"]) == (
            "target arch", "sm_80", "sm_90a")
    assert doc["here"]["gpu_source"] == "--gpu" and doc["hit"] == 3 and doc["miss"] == 3
    on80 = by_what(explain(kcache, triton39, "--python", py, "--gpu", "sm_80"))
    assert {k for k, v in on80.items() if v["verdict"] == "hit"} == SM80


def test_another_triton_version_is_a_miss_naming_both(triton39, tmp_path, kcache):
    for have in ("3.2.0", "3.8.1"):
        items = by_what(explain(kcache, triton39, "--python", fake_python(tmp_path, {"triton": have}),
                                "--gpu", "sm_90a"))
        assert all(v["verdict"] == "miss" and v["factor"] == "triton version" and v["recorded"] == "3.9.0"
                   and v["here"] == have for v in items.values())
    items = by_what(explain(kcache, triton39, "--python", fake_python(tmp_path, {"triton": None}), "--gpu", "sm_90a"))
    assert all(v["verdict"] == "miss" and v["here"] == "not installed" for v in items.values())


def test_an_incomplete_or_moved_kernel_is_a_miss_on_its_status(triton39, tmp_path, kcache):
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    key = "QKJDT6YVJBF6PBUBRY6ITHX2267DQCKVQW4DRRFH5NS63H4H25FA"
    for cubin in (triton39 / key).glob("*.cubin"):
        cubin.unlink()
    moved = tmp_path / "moved"
    shutil.copytree(FIXTURES / "triton" / "cache", moved)  # its group files name /home/kc/...: Triton misses
    items = by_what(explain(kcache, triton39, "--python", py, "--gpu", "sm_90a"))
    assert items[key]["verdict"] == "miss" and items[key]["factor"] == "status"
    assert all(v["verdict"] == "miss" for v in by_what(explain(kcache, moved, "--python", py, "--gpu", "sm_90a")
                                                         ).values())
    # Without a GPU to compare with: what Triton does not use on any GPU is still a miss, not unknown.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "cat").symlink_to(shutil.which("cat") or "/bin/cat")  # the stand-in python's one tool
    no_gpu = {"PATH": str(tmp_path / "bin")}  # no nvidia-smi to ask
    items = by_what(explain(kcache, triton39, "--python", py, env=no_gpu))
    assert items[key]["verdict"] == "miss" and items[key]["factor"] == "status", items[key]
    assert all(v["verdict"] == "miss" and v["factor"] == "status"
               for v in by_what(explain(kcache, moved, "--python", py, env=no_gpu)).values())


def test_autotuner_results_triton_fails_on_are_a_miss_on_their_status(triton39, tmp_path, kcache):
    """A key directory of autotuner results records no target: kcache cannot tell what a complete one is keyed
    for (unknown), but results Triton's autotuner fails on are never used, whatever the GPU (miss)."""
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    tune = triton39 / ("T" * 52)
    tune.mkdir()
    (tune / "matmul_kernel.autotune.json").write_text('{"key": [1]}')  # no configs_timings: Triton raises
    items = by_what(explain(kcache, triton39, "--python", py, "--gpu", "sm_90a"))
    assert items[tune.name]["verdict"] == "miss" and items[tune.name]["factor"] == "status", items[tune.name]


def test_what_kcache_cannot_know_is_unknown_never_hit(triton39, tmp_path, kcache):
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    no_gpu = explain(kcache, triton39, "--python", py, env={"PATH": str(tmp_path)})  # no nvidia-smi to ask
    assert no_gpu["here"]["gpu"] is None and {i["verdict"] for i in no_gpu["items"]} <= {"unknown", "miss"}
    assert no_gpu["hit"] == 0
    switched = explain(kcache, triton39, "--python", py, "--gpu", "sm_90a", env={"TRITON_F32_DEFAULT": "ieee"})
    assert switched["hit"] == 0 and switched["unknown"] == 3
    always = explain(kcache, triton39, "--python", py, "--gpu", "sm_90a", env={"TRITON_ALWAYS_COMPILE": "1"})
    assert always["hit"] == 0 and any(i["factor"] == "TRITON_ALWAYS_COMPILE" for i in always["items"])
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    doc = explain(kcache, triton39, "--python", broken, "--gpu", "sm_90a")
    assert doc["here"]["problem"] and doc["unknown"] == 6


def test_a_bad_gpu_or_python_is_a_usage_error(triton39, kcache, tmp_path):
    assert kcache("--cache-dir", triton39, "explain", "--gpu", "volta").exit_code == 2
    (tmp_path / "not-executable").write_text("x")
    for python in (tmp_path / "missing", tmp_path / "not-executable"):
        r = kcache("--cache-dir", triton39, "explain", "--python", python)
        assert r.exit_code == 2 and "no such executable" in r.stderr and len(r.stderr.splitlines()) == 1


def test_inductor_entries_are_a_miss_without_torch_and_unknown_with_it(tmp_path, kcache):
    root = tmp_path / "ind"
    assert kcache("--cache-dir", root, "import", FIXTURES / "torch-mega" / "sin_cos_cpu.bin").exit_code == 0
    without = explain(kcache, root, "--python", fake_python(tmp_path, {"torch": None}))
    assert without["miss"] == 3 and all(i["here"] == "not installed" for i in without["items"])
    with_torch = explain(kcache, root, "--python", fake_python(tmp_path, {"torch": "2.13.0"}))
    assert with_torch["unknown"] == 3 and with_torch["hit"] == 0


def test_a_blob_is_judged_by_the_torch_version_its_sidecar_records(tmp_path, kcache):
    src = tmp_path / "ind"
    kcache("--cache-dir", src, "import", FIXTURES / "torch-mega" / "sin_cos_cpu.bin")
    blob = tmp_path / "out.bin"
    made = fake_python(tmp_path, {"torch": "2.12.0"}, "made")
    assert kcache("--cache-dir", src, "export", blob, "--format", "torch-mega", "--python", made).exit_code == 0
    doc = explain(kcache, src, str(blob), "--python", fake_python(tmp_path, {"torch": "2.13.0"}))
    assert doc["miss"] == 3 and all((i["factor"], i["recorded"], i["here"]) == ("torch version", "2.12.0", "2.13.0")
                                    for i in doc["items"])
    same = explain(kcache, src, str(blob), "--python", made)
    assert same["unknown"] == 3
    data = bytearray(blob.read_bytes())
    data[100] ^= 1
    blob.write_bytes(bytes(data))
    assert megacache.parse(bytes(data)).state == megacache.CORRUPT
    damaged = explain(kcache, src, str(blob), "--python", made)
    assert damaged["miss"] == 3 and all(i["factor"] == "blob" for i in damaged["items"])


def test_tilelang_misses_another_version_and_never_guesses_a_hit(tmp_path, kcache):
    root = tmp_path / "tl"
    shutil.copytree(FIXTURES / "tilelang", root)
    other = explain(kcache, root, "--python", fake_python(tmp_path, {"tilelang": "0.1.16"}))
    assert other["items"] and all((i["verdict"], i["factor"], i["recorded"], i["here"]) ==
                                  ("miss", "tilelang version", "0.1.15", "0.1.16") for i in other["items"])
    same = explain(kcache, root, "--python", fake_python(tmp_path, {"tilelang": "0.1.15"}))
    assert same["hit"] == 0 and same["unknown"] == len(same["items"])


def test_an_archive_is_judged_from_its_manifest_records(triton39, tmp_path, kcache):
    archive = tmp_path / "kernels.tar.gz"
    assert kcache("--cache-dir", triton39, "export", archive).exit_code == 0
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    items = by_what(explain(kcache, tmp_path / "none", str(archive), "--python", py, "--gpu", "sm_90a"))
    assert {k for k, v in items.items() if v["verdict"] == "hit"} == set(items) - SM80 and len(items) == 6
    assert all(items[k]["factor"] == "target arch" for k in SM80)
    old = by_what(explain(kcache, tmp_path / "none", str(archive), "--python",
                          fake_python(tmp_path, {"triton": "3.2.0"}), "--gpu", "sm_90a"))
    assert all(v["verdict"] == "miss" and v["factor"] == "triton version" for v in old.values())
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar" * 100)
    r = kcache("explain", str(junk), "--python", py, "--gpu", "sm_90a")
    assert r.exit_code == 1 and r.stderr.startswith("Error:") and "Traceback" not in r.stderr


def test_hidet_judges_its_version_and_the_binary_s_arch(tmp_path, kcache):
    root = tmp_path / "hidet"
    shutil.copytree(FIXTURES / "hidet", root, symlinks=True)
    same = by_what(explain(kcache, root, "--python", fake_python(tmp_path, {"hidet": "0.6.1"}), "--gpu", "sm_90a"))
    assert len(same) == 5 and all(v["verdict"] == "hit" for v in same.values())
    on80 = by_what(explain(kcache, root, "--python", fake_python(tmp_path, {"hidet": "0.6.1"}), "--gpu", "sm_80"))
    cuda = {k for k in on80 if "/cuda_space_0/" in k}
    assert all((on80[k]["verdict"], on80[k]["factor"], on80[k]["recorded"]) == ("miss", "arch", "sm_90a")
               for k in cuda) and all(on80[k]["verdict"] == "hit" for k in set(on80) - cuda)
    other = explain(kcache, root, "--python", fake_python(tmp_path, {"hidet": "0.6.2"}), "--gpu", "sm_90a")
    assert other["hit"] == 0 and other["unknown"] == 5
    none = explain(kcache, root, "--python", fake_python(tmp_path, {"hidet": None}), "--gpu", "sm_90a")
    assert none["miss"] == 5


def test_hidet_not_installed_names_the_version_the_entry_records(tmp_path, kcache):
    """No hidet here: the miss still says which hidet wrote the entry (its version.txt), as tilelang's,
    Triton's and numba's do, never "not recorded"."""
    root = tmp_path / "hidet"
    shutil.copytree(FIXTURES / "hidet", root, symlinks=True)
    py = fake_python(tmp_path, {"hidet": None})
    doc = explain(kcache, root, "--python", py, "--gpu", "sm_90a")
    assert len(doc["items"]) == 5 and all((i["verdict"], i["factor"], i["recorded"], i["here"]) ==
                                          ("miss", "hidet version", "0.6.1", "not installed") for i in doc["items"])
    r = kcache("--cache-dir", root, "explain", "--python", py, "--gpu", "sm_90a", env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.stdout.count("hidet version: 0.6.1 -> not installed") == 5, r.stdout
    assert "not recorded" not in r.stdout


# torch 2.13's switches, and which kinds torch then does not read (tests/loaders/test_mega_torch.py runs torch)
SWITCHES = [({"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}, {"graph", "autograd"}),
            ({"TORCH_COMPILE_FORCE_DISABLE_CACHES": "yes"}, {"graph", "autograd"}),  # any text but "0" is true
            ({"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0", "TORCH_COMPILE_FORCE_DISABLE_CACHES": "1"}, set()),
            ({"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, {"graph", "autograd"}),  # AOTAutograd bypasses its cache too
            ({"TORCHINDUCTOR_FX_GRAPH_CACHE": ""}, {"graph", "autograd"}),  # "" is false to torch
            ({"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1"}, {"graph"}),
            ({"TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}, {"autograd"}),  # the fx graphs still hit
            ({"TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}, set())]


@pytest.mark.parametrize("env,off", SWITCHES)
def test_a_switch_that_turns_torch_s_cache_off_is_one_rule_for_blob_and_cache(tmp_path, kcache, env, off):
    """A blob's artifacts and the cache's entries they become are judged by the same switches: a miss naming
    the variable where torch does not read that kind, unknown where it still may."""
    blob, root = FIXTURES / "torch-mega" / "sin_cos_cpu.bin", tmp_path / "ind"
    assert kcache("--cache-dir", root, "import", blob).exit_code == 0
    py = fake_python(tmp_path, {"torch": "2.13.0"})
    kind = {"inductor": "graph", "aot_autograd": "autograd"}
    in_blob = explain(kcache, root, str(blob), "--python", py, env=env)["items"]
    in_cache = explain(kcache, root, "--python", py, env=env)["items"]
    seen = sorted((kind[i["kind"]], i["verdict"], i["factor"]) for i in in_blob)
    assert seen == sorted((i["kind"], i["verdict"], i["factor"]) for i in in_cache)
    assert {k for k, _, _ in seen} == {"graph", "autograd"}
    for k, verdict, factor in seen:
        assert (verdict, factor in env) == (("miss", True) if k in off else ("unknown", False)), (k, verdict, factor)


def test_a_blob_without_its_sidecar_says_not_recorded_never_none(tmp_path, kcache):
    """A blob kcache did not export records no torch version: the table says so in words."""
    blob = tmp_path / "sin_cos_cpu.bin"
    shutil.copy(FIXTURES / "torch-mega" / "sin_cos_cpu.bin", blob)
    r = kcache("explain", str(blob), "--python", fake_python(tmp_path, {"torch": None}), env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.stderr
    assert "None" not in r.stdout and "torch version: not recorded -> not installed" in r.stdout


def test_a_sidecar_left_beside_another_blob_records_nothing_for_it(tmp_path, kcache):
    """`<blob>.kcache.json` names the blob it describes by sha256: beside another blob (copied over the one
    kcache exported) its torch version is not that blob's, so nothing is judged by it."""
    src = tmp_path / "ind"
    kcache("--cache-dir", src, "import", FIXTURES / "torch-mega" / "sin_cos_cpu.bin")
    blob = tmp_path / "out.bin"
    made = fake_python(tmp_path, {"torch": "2.12.0"}, "made")
    assert kcache("--cache-dir", src, "export", blob, "--format", "torch-mega", "--python", made).exit_code == 0
    less = shutil.copytree(src, tmp_path / "less")  # another valid blob: the cache less its autograd entry
    assert kcache("--cache-dir", less, "clear", "--kind", "autograd", "--yes").exit_code == 0
    assert kcache("--cache-dir", less, "export", tmp_path / "less.bin", "--format", "torch-mega").exit_code == 0
    shutil.copy(tmp_path / "less.bin", blob)
    doc = explain(kcache, src, str(blob), "--python", fake_python(tmp_path, {"torch": "2.13.0"}))
    assert doc["items"] and doc["hit"] == 0
    judged = [i for i in doc["items"] if i["factor"] not in ("blob", "group")]
    assert judged and all(i["verdict"] == "unknown" and "describes another blob" in i["why"] for i in judged)
    assert "2.12.0" not in json.dumps(doc)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:9/0", "file:///srv/kc", "Redis://127.0.0.1:9/0"])
def test_a_remote_is_no_entry_to_look_for(triton39, kcache, tmp_path, url):
    """A Redis or file remote named to explain: say what explain takes (exit 2), never "no entry matches URL
    in <some other cache>" (and nothing is fetched). oci:// images are explained (test_remote_oci_qa)."""
    r = kcache("--cache-dir", triton39, "explain", url, "--python", fake_python(tmp_path, {}), "--gpu", "sm_90a")
    assert r.exit_code == 2 and "remote" in r.stderr and "kcache pull" in r.stderr, r.stderr
    assert "no entry matches" not in r.stderr


@pytest.mark.parametrize("scheme", ["oci+http", "OCI+HTTP"])
def test_an_image_no_registry_answers_for_is_one_line(kcache, tmp_path, scheme):
    """An image (its scheme in any case: RFC 3986) whose registry does not answer: one line, exit 1."""
    r = kcache("explain", f"{scheme}://127.0.0.1:9/team/triton:v1", "--python", fake_python(tmp_path, {}), "--gpu",
               "sm_90a")
    assert r.exit_code == 1 and r.stderr.startswith("Error: remote oci+http://127.0.0.1:9/team/triton:v1")
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_prefix_is_found_in_whichever_cache_holds_it(home_caches, tmp_path, kcache):
    """Without --cache-dir the scope is every cache found: a hash prefix names the entry of whichever cache
    holds it (as inspect and verify find it), never "no entry matches" in the first cache looked at."""
    py = fake_python(tmp_path, {})
    r = kcache("--json", "explain", "8d1f7691", "f006237c", "ILJQFT5R", "--python", py, "--gpu", "sm_90a")
    assert r.exit_code == 0, r.stderr
    items = json.loads(r.stdout)["items"]
    assert [(i["layout"], i["what"]) for i in items] == [
        ("hidet", "ops/cuda_space_0/add/8d1f7691cdf75e90"), ("tilus", "programs/f006237ca7a5"),
        ("triton", "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA")]
    assert items[0]["path"] == str(home_caches["hidet"] / items[0]["what"])
    missing = kcache("explain", "8d1f769x", "--python", py, "--gpu", "sm_90a")
    assert missing.exit_code == 2 and "no entry matches '8d1f769x' in 4 caches" in missing.stderr, missing.stderr
    assert "did you mean 8d1f7691" in missing.stderr
    ambiguous = kcache("explain", "a", "--python", py, "--gpu", "sm_90a")  # hidet's af30... and ad25...
    assert ambiguous.exit_code == 2 and "ambiguous" in ambiguous.stderr and "--space" not in ambiguous.stderr


def test_every_cache_s_table_at_80_columns_tells_the_rows_apart(home_caches, tmp_path, kcache):
    """At 80 columns the table keeps what tells one entry from another, as ls does: each row's op and a
    prefix of its hash (kind, space and layout go first), never `ops/cpu_space_0…` three times over."""
    py = fake_python(tmp_path, {})
    entries = kcache("ls", "--json").json()["entries"]
    r = kcache("explain", "--python", py, "--gpu", "sm_90a", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "\u2026" not in r.stdout, r.stdout
    rows = [ln for ln in lines if ln.split()[0] in ("hit", "miss", "unknown")]
    assert len(rows) == len(entries) == 15
    for e in entries:  # one row per entry, naming its op (if any) and its hash, at least 8 characters of it
        mine = [ln for ln in rows if re.search(rf"(^|\s){re.escape(e['hash'][:8])}", ln)]
        assert len(mine) == 1 and (e["op"] is None or f" {e['op']} " in mine[0]), (e["relpath"], r.stdout)
    idents = [" ".join(ln.split()[:4]) for ln in rows]  # verdict, layout, op, hash: no two alike
    assert len(set(idents)) == len(idents), r.stdout


def test_the_here_line_says_how_a_gpu_is_given_when_none_is_found(triton39, tmp_path, kcache, monkeypatch):
    """`kcache explain` on a machine without nvidia-smi said `GPU none (none)` on its first line: the
    second `none` the source of no GPU. It says where it looked and how to give one."""
    monkeypatch.setattr("kcache_cli.ops.explain.local_gpu_arch", lambda: None)
    py = fake_python(tmp_path, {"triton": "3.9.0"})
    here = kcache("--cache-dir", triton39, "explain", "--python", py).stderr.splitlines()[0]
    assert "(none)" not in here and "GPU none found (nvidia-smi names none; --gpu ARCH gives one)" in here, here
    given = kcache("--cache-dir", triton39, "explain", "--python", py, "--gpu", "sm_80").stderr.splitlines()[0]
    assert "GPU sm_80 (--gpu)" in given, given
