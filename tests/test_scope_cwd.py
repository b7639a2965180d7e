"""Scope you can predict (issue 36): a current directory holding caches one level down is said so, as
--cache-dir says it, and never means every cache of the machine (HOME's); an empty variable is unset;
the CUDA JIT cache's row in `dir --all` is the cache directory itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree

HIDET_HASH = "8d1f7691cdf75e90"


@pytest.fixture
def machine(tmp_path) -> dict:
    """A HOME whose hidet cache holds the shipped entries; the other caches absent."""
    home = tmp_path / "home"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    return {"HOME": str(home), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "KCACHE_DIR": None,
            "CUDA_CACHE_PATH": None, "VLLM_CACHE_ROOT": None, "TRITON_CACHE_DIR": None, "XDG_CACHE_HOME": None,
            "TILELANG_CACHE_DIR": None, "TRITON_HOME": None, "COLUMNS": "200"}


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """A copy of the shipped example, the current directory: caches one level down (hidet, tilus, tilelang)."""
    ws = tmp_path / "ws"
    for name in ("hidet", "tilus", "tilelang"):
        copy_tree(FIXTURES / name, ws / name)
    monkeypatch.chdir(ws)
    return ws


@pytest.mark.parametrize("args", [("ls",), ("stats",), ("verify",), ("clear", "--all", "--yes"),
                                  ("prune", "--broken")])
def test_a_folder_of_caches_is_said_so_and_home_is_never_used(kcache, machine, workspace, args):
    before = sorted(p.name for p in (Path(machine["HOME"]) / ".cache/hidet/ops/cuda_space_0/add").iterdir())
    r = kcache(*args, env=machine)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"Error: no cache at {workspace} (the current directory); {workspace / 'hidet'}")
    assert "--cache-dir " in r.stderr and "--all-caches" in r.stderr and len(r.stderr.splitlines()) == 1
    assert HIDET_HASH not in r.stdout
    assert sorted(p.name for p in (Path(machine["HOME"]) / ".cache/hidet/ops/cuda_space_0/add").iterdir()) == before
    assert (workspace / "hidet" / "ops").is_dir()


def test_dir_says_that_the_other_commands_refuse_a_folder_of_caches(kcache, machine, workspace):
    """`kcache dir` names build's root there (build writes into it wherever it runs), and says, in its reason,
    what ls, stats, prune... do here: refuse, naming the cache below. It never names a root they then refuse
    without saying so."""
    home_hidet = str(Path(machine["HOME"]) / ".cache" / "hidet")
    r = kcache("dir", env=machine)
    assert r.exit_code == 0 and r.stdout.strip() == home_hidet, r
    said = " ".join(r.stderr.split())
    assert "ls, stats, prune... refuse here: no cache at" in said and str(workspace / "hidet") in said, said
    doc = kcache("--json", "dir", env=machine).json()
    assert doc["path"] == home_hidet and f"--cache-dir {workspace / 'hidet'}" in doc["reason"]
    os.chdir(workspace / "hidet")  # in a cache: that cache, nothing refused
    inside = kcache("dir", env=machine)
    assert inside.stdout.strip() == str(workspace / "hidet") and "refuse" not in inside.stderr, inside


HINTED = [("ls",), ("stats",), ("verify",), ("clear", "--all", "--yes"), ("prune", "--broken"),
          ("inspect", HIDET_HASH), ("explain", HIDET_HASH), ("export", "out.tar"), ("log", HIDET_HASH),
          ("diff", HIDET_HASH, HIDET_HASH)]


@pytest.mark.parametrize("args", HINTED, ids=[a[0] for a in HINTED])
def test_the_hint_offers_only_options_the_command_accepts(kcache, machine, workspace, args):
    """`inspect` has no --all-caches: its hint offers --cache NAME instead, and every command's hint names
    only options that command takes."""
    import re

    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    r = kcache(*args, env=machine)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert f"(the current directory); {workspace / 'hidet'}" in r.stderr, r.stderr
    hint = r.stderr[r.stderr.index(": --cache-dir "):]
    offered = set(re.findall(r"--[a-z][a-z-]*", hint))
    accepted = {opt for p in get_command(full_app()).commands[args[0]].params for opt in p.opts}
    assert offered and offered <= accepted, (hint, offered - accepted)
    assert ("--all-caches" in offered) == ("--all-caches" in accepted)
    assert "--cache-dir" in offered and ("--cache" in offered) != ("--all-caches" in offered)


@pytest.mark.parametrize("args", [("inspect",), ("ls",), ("log",), ("clear", "--dry-run")])
def test_an_entry_named_by_its_absolute_path_is_found_from_a_folder_of_caches(kcache, machine, workspace, args):
    """An absolute path says which cache it lies in: the folder of copies around it changes nothing."""
    path = workspace / "hidet" / "ops" / "cuda_space_0" / "add" / HIDET_HASH
    r = kcache(*args, str(path), env=machine)
    assert r.exit_code == 0, r.stderr
    assert HIDET_HASH in r.stdout or "compile" in r.stdout


def test_another_users_cache_below_the_cwd_is_no_copy_of_ours(kcache, machine, workspace):
    """A cache another user made in a shared directory (/tmp) does not stop this user's commands there:
    they go on as anywhere else (here, HOME's cache)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to give the copies to another user")
    for name in ("hidet", "tilus", "tilelang"):
        for dirpath, dirnames, filenames in os.walk(workspace / name):
            for n in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, n), 65534, 65534)
        os.lchown(workspace / name, 65534, 65534)
    r = kcache("ls", "--json", env=machine)
    assert r.exit_code == 0, r.stderr
    assert {e["root"] for e in r.json()["entries"]} == {str(Path(machine["HOME"]) / ".cache/hidet")}


def test_all_caches_still_means_this_machines_caches(kcache, machine, workspace):
    r = kcache("ls", "--all-caches", "--json", env=machine)
    assert r.exit_code == 0, r.stderr
    assert {e["root"] for e in r.json()["entries"]} == {str(Path(machine["HOME"]) / ".cache/hidet")}


def test_inside_one_of_them_that_cache_alone(kcache, machine, workspace, monkeypatch):
    monkeypatch.chdir(workspace / "tilus")
    r = kcache("ls", "--json", env=machine)
    assert r.exit_code == 0, r.stderr
    assert {e["layout"] for e in r.json()["entries"]} == {"tilus"}


def test_a_tool_cache_with_a_cachedir_tag_is_no_kernel_cache(kcache, machine, tmp_path, monkeypatch):
    """mypy's and ruff's caches carry a CACHEDIR.TAG beside version directories: no entries, no refusal."""
    project = tmp_path / "project"
    (project / ".mypy_cache" / "3.11").mkdir(parents=True)
    (project / ".mypy_cache" / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    monkeypatch.chdir(project)
    r = kcache("ls", "--json", env=machine)
    assert r.exit_code == 0, r.stderr
    assert any(e["hash"] == HIDET_HASH for e in r.json()["entries"])


def test_the_machines_own_caches_below_the_cwd_are_no_surprise(kcache, machine, monkeypatch):
    monkeypatch.chdir(Path(machine["HOME"]) / ".cache")  # hidet's own cache lies one level down
    r = kcache("ls", "--json", env=machine)
    assert r.exit_code == 0, r.stderr
    assert any(e["hash"] == HIDET_HASH for e in r.json()["entries"])


def test_an_empty_inductor_variable_is_unset(kcache, machine, workspace):
    env = {**machine, "TORCHINDUCTOR_CACHE_DIR": ""}
    rows = kcache("dir", "--all", "--json", env=env).json()["caches"]
    inductor = next(r for r in rows if r["cache"] == "inductor")
    assert inductor["path"] != str(workspace) and Path(inductor["path"]).name.startswith("torchinductor_")


@pytest.mark.parametrize("var", ["TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "CUDA_CACHE_PATH", "VLLM_CACHE_ROOT"])
def test_other_empty_variables_are_unset(kcache, machine, workspace, var):
    rows = kcache("dir", "--all", "--json", env={**machine, var: ""}).json()["caches"]
    assert all(not r["path"].startswith(str(workspace)) for r in rows), rows


def test_the_cuda_jit_row_is_the_cache_directory(kcache, machine, tmp_path):
    jit = tmp_path / "jitcache"
    (jit / "3").mkdir(parents=True)
    (jit / "index").write_bytes(b"x")
    env = {**machine, "CUDA_CACHE_PATH": str(jit)}
    r = kcache("dir", "--all", env=env)
    row = next(line for line in r.stdout.splitlines() if line.startswith("cudajit"))
    assert row.split()[-1] == str(jit), row
    default = kcache("dir", "--all", env=machine).stdout
    assert next(ln for ln in default.splitlines() if ln.startswith("cudajit")).split()[-1] == "~/.nv/ComputeCache"
    # --json keeps the root that --cache-dir takes (the directory holding it), as before
    assert next(c for c in kcache("dir", "--all", "--json", env=env).json()["caches"]
                if c["cache"] == "cudajit")["path"] == str(tmp_path)


def test_dir_prints_the_cache_the_commands_use_here(kcache, machine, workspace, monkeypatch):
    """Inside a cache, `kcache dir` printed build's root (hidet's) and said on stderr that ls, stats,
    prune... work on another: `cd "$(kcache dir)"` left the cache the commands read. It prints that cache
    now, and says where build writes; in build's own root, and outside every cache, hidet's root as before."""
    home_hidet = Path(machine["HOME"]) / ".cache" / "hidet"
    for inside in (workspace / "tilus" / "programs", workspace / "hidet"):
        monkeypatch.chdir(inside)
        r = kcache("dir", env=machine)
        assert r.exit_code == 0, r.stderr
        root = workspace / inside.relative_to(workspace).parts[0]
        assert r.stdout.strip() == str(root), r.stdout
        assert "the current directory lies in" in r.stderr and f"build writes into {home_hidet}" in r.stderr
        doc = kcache("dir", "--json", env=machine).json()
        assert doc["path"] == str(root) and f"build writes into {home_hidet}" in doc["reason"]
        assert doc["layouts"] == [root.name] and doc["exists"] is True
        ls = kcache("ls", "--json", env=machine).json()["entries"]  # what ls reads here: that cache
        assert ls and all(e["path"].startswith(r.stdout.strip() + "/") for e in ls), ls
        explicit = kcache("--cache-dir", str(home_hidet), "dir", env=machine)
        assert explicit.stdout.strip() == str(home_hidet) and "current directory" not in explicit.stderr
    monkeypatch.chdir(home_hidet / "ops")
    r = kcache("dir", env=machine)
    assert r.stdout.strip() == str(home_hidet) and "build writes" not in r.stderr, r.stderr
