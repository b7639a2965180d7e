"""JAX's persistent compilation cache and Numba's cache, from the real caches jax 0.10.2 and numba 0.68.1
made here (tests/fixtures/real/jax/cache, tests/fixtures/real/numba), judged by the packages' loader rules
(layouts/jax.py, layouts/numba.py). The real packages agree in tests/loaders/test_oracle_jax_numba.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import pytest
from conftest import run_kcache

REAL = Path(__file__).parent / "fixtures" / "real"
AFFINE = "jit_kc_affine-f0809f3dade0e0f7f7489683ea2a6b878f782cf0bb97c33203f4eaf72bf6c8b5"
NUMBA_DIR = "nsrc_35252f178833f8ad666a4a80374c652e0b1062c6"
INDEX = "kc_numba.kc_add-3.py311.nbi"
BUILT_IN = "built in /tmp/wt37fx/jax_cache"


@pytest.fixture
def jax_root(tmp_path: Path) -> Path:
    root = tmp_path / "caches"
    shutil.copytree(REAL / "jax" / "cache", root / "jaxcache")
    return root


@pytest.fixture
def numba_root(tmp_path: Path) -> Path:
    root = tmp_path / "numba"
    shutil.copytree(REAL / "numba", root)
    return root


def entries(root: Path) -> list[dict]:
    return run_kcache("--cache-dir", root, "ls", "--json").json()["entries"]


def problem(root: Path) -> dict | None:
    run = run_kcache("--cache-dir", root, "verify", "--json")
    found = run.json()["problems"]
    assert run.exit_code == (1 if found else 0)
    return found[0] if found else None


# ---- JAX ---------------------------------------------------------------------------------------------
def test_the_real_jax_cache_is_one_entry_moved_from_where_it_was_built(jax_root, monkeypatch):
    """Its executables were compiled for /tmp/wt37fx/jax_cache: jax hashes that path (compiler.py's
    xla_gpu_per_fusion_autotune_cache_dir, kept in the compile options cache_key.py hashes) into every
    key, so a copy anywhere else misses every key (measured with the real jax: a cp -a copy compiles all
    again under new keys): moved, and import says so."""
    [row] = entries(jax_root)
    assert (row["layout"], row["kind"], row["hash"], row["status"], row["file_count"]) == (
        "jax", "compile_cache", "jaxcache", "moved", 5)
    assert BUILT_IN in row["reason"] and "misses every one" in row["reason"]
    facts = run_kcache("--cache-dir", jax_root, "inspect", "jaxcache", "--json").json()["facts"]
    assert facts["executables"] == "2" and facts["size_cap"].startswith("in use")
    assert problem(jax_root)["status"] == "moved"
    archive = jax_root.parent / "jax.tar"
    assert run_kcache("--cache-dir", jax_root, "export", archive, "--status", "moved").exit_code == 0
    other = jax_root.parent / "other"
    run = run_kcache("--cache-dir", other, "import", archive, "--json")
    assert run.exit_code == 0, run.stderr
    assert any(BUILT_IN in (r.get("reason") or "") for r in run.json()["entries"]), run.stdout
    assert "jax" not in {r["cache"] for r in run_kcache("dir", "--all", "--json").json()["caches"]}
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(jax_root / "jaxcache"))
    row = next(r for r in run_kcache("dir", "--all", "--json").json()["caches"] if r["cache"] == "jax")
    assert row["path"] == str(jax_root) and row["entry_count"] == 1


def compiled_for(path: Path, where: Path) -> None:
    """Rewrite the fixture's `-cache` file `path` as jax compiles it for the cache directory `where`: the
    autotune dir its compile options name (with the string's varint length; kcache reads no other)."""
    import zlib

    tail = b"/xla_gpu_per_fusion_autotune_cache_dir"

    def string(cache_dir: bytes) -> bytes:
        n = len(cache_dir) + len(tail)
        return (bytes([n]) if n < 128 else bytes([n & 0x7F | 0x80, n >> 7])) + cache_dir + tail

    raw = zlib.decompress(path.read_bytes())
    old = string(b"/tmp/wt37fx/jax_cache")
    assert old in raw
    path.write_bytes(zlib.compress(raw.replace(old, string(str(where).encode()))))


def test_a_jax_cache_jax_wrote_new_keys_in_after_a_copy_is_complete(jax_root):
    """A copied cache jax has since run in holds keys for its new path beside the copied ones: jax hits
    those, so it is complete however small the copied files are (the smallest, jit_iota's, is one), and
    inspect counts the executables jax never uses here. Every file is read, not the smallest alone."""
    cache = jax_root / "jaxcache"
    compiled_for(cache / f"{AFFINE}-cache", cache)
    assert min(cache.glob("*-cache"), key=lambda p: p.stat().st_size).name.startswith("jit_iota")
    [row] = entries(jax_root)
    assert (row["status"], row["reason"]) == ("complete", None)
    assert problem(jax_root) is None
    facts = run_kcache("--cache-dir", jax_root, "inspect", "jaxcache", "--json").json()["facts"]
    assert facts["built_elsewhere"].startswith("1 of 2 executables, compiled for /tmp/wt37fx/jax_cache:")
    run = run_kcache("--cache-dir", jax_root, "export", jax_root.parent / "jax.tar", "--json")
    assert run.exit_code == 0 and [r["relpath"] for r in run.json()["exported"]] == ["jaxcache"], run.stdout


def test_a_jax_cache_is_moved_only_when_no_executable_was_compiled_for_it(jax_root):
    """Each executable compiled for another path than the cache's (two others here): moved, named by
    one of them; inspect counts every one."""
    cache = jax_root / "jaxcache"
    compiled_for(cache / f"{AFFINE}-cache", jax_root / "elsewhere")
    [row] = entries(jax_root)
    assert row["status"] == "moved" and "built in /tmp/" in row["reason"]
    facts = run_kcache("--cache-dir", jax_root, "inspect", "jaxcache", "--json").json()["facts"]
    assert facts["built_elsewhere"].startswith("2 of 2 executables") and "and 1 other paths" in facts[
        "built_elsewhere"]


def test_explain_of_a_jax_cache_agrees_with_ls_and_reads_jax_s_version(jax_root, tmp_path):
    """explain reads jax's version from --python as it reads the other compilers' ("here" names it), and
    a cache ls calls moved is a miss (jax misses every key at another path than the one compiled for);
    one whose executables were compiled for its path stays unknown (the key hashes more than a file
    records), and without jax it is a miss."""
    import sys

    from conftest import fake_python

    info = tmp_path / "site" / "jax-0.10.2.dist-info"  # what importlib.metadata finds of an installed jax
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.10.2\n")
    jax = tmp_path / "python-with-jax"
    jax.write_text(f'#!/bin/sh\nPYTHONPATH={info.parent} exec {sys.executable} "$@"\n')
    jax.chmod(0o755)
    run = run_kcache("--cache-dir", jax_root, "--json", "explain", "--python", jax)
    [item] = run.json()["items"]
    assert run.json()["here"]["versions"]["jax"] == "0.10.2"
    assert (item["verdict"], item["factor"], item["recorded"], item["here"]) == (
        "miss", "cache directory", "/tmp/wt37fx/jax_cache", str(jax_root / "jaxcache"))
    assert "misses every one here" in item["why"]
    human = run_kcache("--cache-dir", jax_root, "explain", "--python", jax)
    assert "jax 0.10.2" in human.stderr + human.stdout and "miss" in human.stdout
    compiled_for(jax_root / "jaxcache" / f"{AFFINE}-cache", jax_root / "jaxcache")
    [item] = run_kcache("--cache-dir", jax_root, "--json", "explain", "--python", jax).json()["items"]
    assert item["verdict"] == "unknown" and "jax 0.10.2 here" in item["why"]
    none = fake_python(tmp_path, "jax", None)
    [item] = run_kcache("--cache-dir", jax_root, "--json", "explain", "--python", none).json()["items"]
    assert (item["verdict"], item["factor"], item["here"]) == ("miss", "jax version", "not installed")


@pytest.mark.parametrize(("damage", "status", "words"), [
    ("rm:-atime", "partial", "has no -atime sidecar"),
    ("empty:-cache", "corrupt", "holds no executable"),
    ("cut:-cache", "corrupt", "cut short"),
    ("rm:-cache", "moved", BUILT_IN),  # an orphan -atime: jax ignores it (the rest was built elsewhere)
    ("dir:-cache", "corrupt", "is a directory: jax's read of that key fails"),
    ("dir:-atime", "corrupt", "its eviction fails on it"),
])
def test_jax_damage(jax_root, damage, status, words):
    how, suffix = damage.split(":")
    target = jax_root / "jaxcache" / f"{AFFINE}{suffix}"
    if how in ("rm", "dir"):
        target.unlink()
        if how == "dir":
            target.mkdir()
    else:
        target.write_bytes(b"" if how == "empty" else target.read_bytes()[:1000])
    found = problem(jax_root)
    assert (found and (found["status"], words in found["reason"])) == ((status, True) if status else None)
    if status == "moved":
        facts = run_kcache("--cache-dir", jax_root, "inspect", "jaxcache", "--json").json()["facts"]
        assert facts["orphan_atime_files"].startswith("1:")


def test_verify_fix_on_a_damaged_jax_cache_says_it_changed_nothing(jax_root):
    """--fix mends moved paths and left locks; a JAX cache has neither: its summary says --fix changed
    nothing, never that it rewrote the paths of 0 (Triton's words), and the file stays as it was."""
    target = jax_root / "jaxcache" / f"{AFFINE}-cache"
    target.write_bytes(target.read_bytes()[:1000])
    run = run_kcache("--cache-dir", jax_root, "verify", "--fix")
    assert run.exit_code == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.endswith("0 ok, 1 with problems, --fix changed nothing"), run.stderr
    assert "rewrote" not in run.stderr and "lock" not in run.stderr
    assert target.stat().st_size == 1000


def test_clear_all_leaves_no_cache_nor_atime_file(jax_root):
    (jax_root / "keep.txt").write_text("not jax's\n")
    run = run_kcache("--cache-dir", jax_root, "clear", "--all", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    left = [p.name for p in jax_root.rglob("*")]
    assert not [n for n in left if n.endswith(("-cache", "-atime"))]
    assert [n for n in os.listdir(jax_root) if not n.startswith(".")] == ["keep.txt"]  # .kcache/: kcache's state


def test_a_function_name_with_a_dash_or_dot_is_jax_s_key_too(tmp_path):
    """jax keeps "-" and "." of a function's name in its keys (mlir.sanitize_name: `jit_kc_step-v2-<sha256>`,
    tests/fixtures/real/jax-names, made by jax 0.10.2): such a cache is jax's, listed and judged by its
    keys (a -cache without its -atime in a capped cache is partial), and `clear --all` removes it."""
    root = tmp_path / "caches"
    shutil.copytree(REAL / "jax-names" / "cache", root / "jaxcache")
    [step] = [p for p in (root / "jaxcache").iterdir() if p.name.startswith("jit_kc_step-v2-")
              and p.name.endswith("-atime")]
    [entry] = entries(root)
    assert (entry["layout"], entry["hash"], entry["status"]) == ("jax", "jaxcache", "moved")  # built elsewhere
    step.unlink()
    assert problem(root)["status"] == "partial" and step.name[:-len("-atime")] in problem(root)["reason"]
    assert run_kcache("--cache-dir", root, "clear", "--all", "--yes").exit_code == 0
    assert not (root / "jaxcache").exists()



def test_a_key_name_ending_in_a_newline_is_not_jax_s(tmp_path):
    """jax finds its keys by the glob `*-cache` (lru_cache.py), which a name ending in a newline after
    "-cache" does not match: jax never evicts nor reads it. Such a name is no key to kcache either (a
    regex `$` matches before a final newline; the keys' patterns end at the name's end): the directory
    then holds a name that is not jax's, so it is no jax cache kcache would call partial and remove."""
    root = tmp_path / "caches"
    shutil.copytree(REAL / "jax-names" / "cache", root / "jaxcache")
    key = next(p for p in (root / "jaxcache").iterdir() if p.name.endswith("-cache"))
    shutil.copy(key, root / "jaxcache" / ("zz" + key.name[key.name.index("-"):] + "\n"))
    assert entries(root) == []
    plan = run_kcache("--cache-dir", root, "prune", "--broken", "--dry-run", "--json")
    assert plan.exit_code == 0 and plan.json()["removed"] == []


def test_a_directory_with_other_files_is_not_a_jax_cache(jax_root):
    (jax_root / "jaxcache" / "notes.txt").write_text("mine\n")
    assert entries(jax_root) == []
    assert run_kcache("--cache-dir", jax_root, "clear", "--all", "--yes").exit_code == 0
    assert (jax_root / "jaxcache" / f"{AFFINE}-cache").exists()


def tree(where: Path) -> dict[str, tuple]:
    """Every path under `where` with its inode, mtime and, for a file, its bytes."""
    return {str(p.relative_to(where)): (p.lstat().st_ino, p.lstat().st_mtime_ns,
                                        p.read_bytes() if p.is_file() else None) for p in sorted(where.rglob("*"))}


def test_a_jax_cache_right_in_home_has_no_root_and_nothing_there_is_touched(monkeypatch):
    """JAX_COMPILATION_CACHE_DIR=$HOME/jaxcc: kcache lists the cache as the one entry of the directory
    holding it, and $HOME is never a root. `--cache-dir $HOME/jaxcc` says so (exit 2) instead of "no
    entries" (a script read an empty cache, prune freed nothing and said nothing), and no command
    touches a file in $HOME: not the cache's, not one beside it named like jax's, no .kcache/ made."""
    home = Path(os.environ["HOME"])
    cache = home / "jaxcc"
    shutil.copytree(REAL / "jax" / "cache", cache)
    (home / ".bashrc").write_text("export PATH\n")
    (home / f"{AFFINE}-cache").write_bytes((cache / f"{AFFINE}-cache").read_bytes())  # jax's name, not jax's
    (home / "notes").mkdir()
    (home / "notes" / "todo.txt").write_text("mine\n")
    before = tree(home)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(cache))
    for args in (("ls",), ("verify", "--fix"), ("prune", "--broken", "--stale"), ("prune", "--max-size", "1B"),
                 ("clear", "--all", "--yes")):
        run = run_kcache("--cache-dir", cache, *args)
        assert run.exit_code == 2, (args, run.stdout, run.stderr)
        assert "it is a jax cache itself" in run.stderr and "(it is the home directory)" in run.stderr, run.stderr
    run = run_kcache("clear", "--cache", "jax", "--all", "--yes")
    assert run.exit_code == 2 and "it is the home directory" in run.stderr, run.stderr
    run = run_kcache("clear", "--all-caches", "--all", "--yes")  # the default scope: skipped, with a warning
    assert "skipping the jax cache" in run.stderr and "it is the home directory" in run.stderr, run.stderr
    assert tree(home) == before


# ---- Numba -------------------------------------------------------------------------------------------
def test_the_real_numba_cache_is_one_complete_entry(numba_root, monkeypatch):
    [row] = entries(numba_root)
    assert (row["layout"], row["kind"], row["hash"], row["status"], row["file_count"]) == (
        "numba", "functions", NUMBA_DIR, "complete", 3)
    facts = run_kcache("--cache-dir", numba_root, "inspect", NUMBA_DIR[:8], "--json").json()["facts"]
    assert (facts["indexes"], facts["overloads"], facts["numba_version"]) == ("1", "2", "0.68.1")
    assert facts["reused"].startswith("only beside a source file of the same bytes (the index holds their sha256")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(numba_root))
    row = next(r for r in run_kcache("dir", "--all", "--json").json()["caches"] if r["cache"] == "numba")
    assert row["path"] == str(numba_root) and row["entry_count"] == 1


@pytest.mark.parametrize(("damage", "status", "words"), [
    ("rm:kc_numba.kc_add-3.py311.1.nbc", "partial", "which is gone"),
    ("cut:kc_numba.kc_add-3.py311.2.nbc", "corrupt", "not a whole pickle"),
    ("cut:kc_numba.kc_add-3.py311.nbi", "corrupt", "not a whole index"),
])
def test_numba_damage(numba_root, damage, status, words):
    how, name = damage.split(":")
    target = numba_root / NUMBA_DIR / name
    if how in ("rm", "dir"):
        target.unlink()
        if how == "dir":
            target.mkdir()
    else:
        target.write_bytes(target.read_bytes()[:200])
    found = problem(numba_root)
    assert found is not None and found["status"] == status and words in found["reason"]


def in_tree(tmp_path: Path) -> Path:
    """A project whose `__pycache__/` holds the real cache beside the source it was compiled from (numba's
    in-tree locator: the index's stamp is the sha256 of `kc_numba.py`)."""
    project = tmp_path / "project"
    shutil.copytree(REAL / "numba" / NUMBA_DIR, project / "__pycache__")
    shutil.copy(REAL / "make" / "kc_numba.py", project / "kc_numba.py")
    return project


def test_a_pycache_with_python_files_is_listed_but_never_removed(tmp_path):
    project = in_tree(tmp_path)
    (project / "__pycache__" / "kc_numba.cpython-311.pyc").write_bytes(b"\x00" * 16)
    [row] = entries(project)
    assert (row["layout"], row["hash"], row["status"]) == ("numba", "__pycache__", "complete")
    assert run_kcache("--cache-dir", project, "clear", "--all", "--yes").exit_code in (0, 1)
    assert sorted(os.listdir(project / "__pycache__"))[0] == "kc_numba.cpython-311.pyc"
    assert (project / "__pycache__" / INDEX).exists()


def test_an_index_of_another_numba_is_stale_where_numba_is_installed(numba_root):
    from kcache_cli.fs.entrydir import EntryDir
    from kcache_cli.layouts import get
    from kcache_cli.layouts.base import Judging

    layout = get("numba")
    with EntryDir.open(numba_root / NUMBA_DIR) as d:
        assert layout.judge(d, "functions", Judging(version="0.68.1")).status == "complete"
        other = layout.judge(d, "functions", Judging(version="0.69.0"))
        assert other.status == "stale" and "numba 0.68.1" in (other.reason or "")
        assert layout.judge(d, "functions", Judging(version="")).status == "complete"  # no numba here: not judged


def test_a_pycache_is_judged_by_its_source_as_numba_stamps_it(tmp_path):
    project = in_tree(tmp_path)
    src = project / "kc_numba.py"
    os.utime(src, (1e9, 1e9))  # touched: numba 0.68 compares the bytes, not the mtime
    assert problem(project) is None
    src.write_bytes(src.read_bytes() + b"# edited\n")
    found = problem(project)
    assert found is not None and found["status"] == "stale"
    assert found["reason"].startswith("kc_numba.py beside __pycache__/ changed since " + INDEX)
    [row] = entries(project)
    assert row["status"] == "stale"  # ls too, not only verify
    src.rename(project / "renamed.py")
    found = problem(project)
    assert found is not None and found["status"] == "stale" and "kc_numba.py beside __pycache__/ is gone" in (
        found["reason"])


def test_a_source_that_is_a_link_or_too_big_is_not_read(tmp_path, monkeypatch):
    """The source beside __pycache__/ as a co-user may plant it for root's cron ls: a link (to
    /proc/self/pagemap, read without end, or to /proc/kmsg, whose reads take the kernel's messages) is never
    opened, and a file is read no further than MAX_SOURCE bytes: neither is judged."""
    from kcache_cli.layouts import numba

    project = in_tree(tmp_path)
    src = project / "kc_numba.py"
    body = src.read_bytes()
    src.write_bytes(body + b"# edited\n")
    assert problem(project)["status"] == "stale"
    monkeypatch.setattr(numba, "MAX_SOURCE", len(body))
    assert problem(project) is None  # 10 bytes over: not read to the end, not judged
    src.unlink()
    src.symlink_to("/proc/self/pagemap")
    assert problem(project) is None


def test_a_script_without_py_is_its_source_too(tmp_path):
    """numba's modname is the file's name less its extension: a script `kc_numba` (no .py) stamps the
    same index name, and is found and judged as kc_numba.py would be (not "gone")."""
    project = in_tree(tmp_path)
    (project / "kc_numba.py").rename(project / "kc_numba")
    assert problem(project) is None
    (project / "kc_numba").write_text("# another script\n")
    found = problem(project)
    assert found["status"] == "stale" and found["reason"].startswith("kc_numba beside __pycache__/ changed")


def test_every_index_is_judged_and_stale_needs_them_all(tmp_path):
    """Two modules' indexes in one __pycache__/: the edited module's stale index hides neither a corrupt
    index of the other (numba raises on it), nor is the whole directory stale while the other still hits."""
    project = in_tree(tmp_path)
    cache = project / "__pycache__"
    (project / "other.py").write_text("# other module\n")
    for p in list(cache.iterdir()):
        shutil.copy(p, cache / p.name.replace("kc_numba.", "other.", 1))
    stamp = __import__("hashlib").sha256((project / "kc_numba.py").read_bytes()).digest()
    other = cache / INDEX.replace("kc_numba.", "other.", 1)
    other.write_bytes(other.read_bytes().replace(stamp, __import__("hashlib").sha256(b"# other module\n").digest()))
    assert problem(project) is None
    (project / "kc_numba.py").write_text("# edited\n")
    assert problem(project) is None and entries(project)[0]["status"] == "complete"  # other.* still hits
    other.write_bytes(other.read_bytes()[:40])
    assert problem(project)["status"] == "corrupt"


def test_an_index_a_moved_function_left_is_named_in_inspect(tmp_path):
    """A line added above the function: numba (measured with 0.68.1) writes kc_add-4's index beside
    kc_add-3's and never reads that one again. The directory stays complete (kc_add-4 hits) and prune
    --stale keeps it whole; inspect names the stale index, which ls's status cannot."""
    import hashlib

    project = in_tree(tmp_path)
    cache, src = project / "__pycache__", project / "kc_numba.py"
    facts = run_kcache("--cache-dir", project, "inspect", "__pycache__", "--json").json()["facts"]
    assert "stale_indexes" not in facts
    old = hashlib.sha256(src.read_bytes()).digest()
    src.write_bytes(b"import math\n" + src.read_bytes())
    for p in list(cache.iterdir()):
        shutil.copy(p, cache / p.name.replace("-3.py", "-4.py", 1))
    moved = cache / INDEX.replace("-3.py", "-4.py")
    moved.write_bytes(moved.read_bytes().replace(old, hashlib.sha256(src.read_bytes()).digest()))
    assert problem(project) is None and entries(project)[0]["status"] == "complete"
    facts = run_kcache("--cache-dir", project, "inspect", "__pycache__", "--json").json()["facts"]
    assert facts["indexes"] == "2"
    assert facts["stale_indexes"].startswith(f"1: kc_numba.py beside __pycache__/ changed since {INDEX} was"), facts
    assert run_kcache("--cache-dir", project, "prune", "--stale").exit_code == 0
    assert (cache / INDEX).exists() and moved.exists()


def test_the_cache_of_a_hidden_source_directory_is_an_entry_that_travels(numba_root, tmp_path):
    """numba names a NUMBA_CACHE_DIR entry after the source's directory: `.venv_<sha1>/` for a source in
    `.venv/`. Listed, cleared and shipped as any other (an archive takes no other hidden name)."""
    hidden = "." + NUMBA_DIR
    shutil.copytree(numba_root / NUMBA_DIR, numba_root / hidden)
    (numba_root / ".notes").mkdir()
    (numba_root / ".notes" / INDEX).write_bytes((numba_root / NUMBA_DIR / INDEX).read_bytes())  # no sha1
    assert sorted(e["hash"] for e in entries(numba_root)) == sorted([hidden, NUMBA_DIR])
    arc = tmp_path / "n.tar.zst"
    assert run_kcache("--cache-dir", numba_root, "export", arc).exit_code == 0
    back = run_kcache("--cache-dir", tmp_path / "back", "import", arc)
    assert back.exit_code == 0, back.stderr
    assert sorted(e["hash"] for e in entries(tmp_path / "back")) == sorted([hidden, NUMBA_DIR])
    data = next((numba_root / hidden).glob("*.nbc"))
    data.write_bytes(data.read_bytes()[:20])  # not a whole pickle: numba's call raises (deep)
    again = run_kcache("--cache-dir", numba_root, "export", tmp_path / "again.tar.zst", "--json")
    assert again.exit_code == 0 and [e["hash"] for e in again.json()["exported"]] == [NUMBA_DIR], again.stdout
    gone = run_kcache("--cache-dir", numba_root, "clear", "--all", "--yes")
    assert gone.exit_code == 0 and not (numba_root / hidden).exists() and (numba_root / ".notes").is_dir()


def test_a_numba_cache_dir_entry_is_not_judged_by_a_source_it_cannot_find(numba_root):
    (numba_root / "kc_numba.py").write_text("something else\n")  # no locator puts a source there
    assert problem(numba_root) is None


def old_index(mtime: float, size: int) -> bytes:
    """An index as numba releases before the content hash wrote it: the stamp is (st_mtime, st_size)."""
    import pickle

    from kcache_cli.layouts.numba import installed_version

    key = (("int64", "int64"), ("x86_64-unknown-linux-gnu", "skylake", "+avx"), ("00", "11"))
    overloads = {key: "m.f-3.py311.1.nbc"}
    return pickle.dumps(installed_version() or "0.58.1", protocol=-1) + pickle.dumps(((mtime, size), overloads),
                                                                                      protocol=-1)


def test_an_old_numbas_mtime_and_size_stamp_is_compared_with_the_sources_stat(tmp_path):
    project = tmp_path / "project"
    (project / "__pycache__").mkdir(parents=True)
    src = project / "m.py"
    src.write_text("def f(a, b):\n    return a + b\n")
    os.utime(src, (1.7e9 + 0.25, 1.7e9 + 0.25))
    st = src.stat()
    (project / "__pycache__" / "m.f-3.py311.1.nbc").write_bytes(b"\x80\x05K\x01.")
    index = project / "__pycache__" / "m.f-3.py311.nbi"
    index.write_bytes(old_index(st.st_mtime, st.st_size))
    assert problem(project) is None
    os.utime(src, (1.7e9 + 1, 1.7e9 + 1))  # touched: that numba compares the mtime
    found = problem(project)
    assert found is not None and found["status"] == "stale" and "another mtime or size" in found["reason"]


# ---- kcache explain ------------------------------------------------------------------------------------
def here_python(tmp_path: Path, numba: str | None, python: str = "3.11.7") -> str:
    """explain's --python as a Python `python` with numba `numba`."""
    from conftest import fake_python

    return fake_python(tmp_path, "numba", numba, python)


def explained(root: Path, python: str, env: dict | None = None) -> tuple[dict, dict]:
    """(what `explain --json` says of the one numba entry under `root`, its "here")."""
    run = run_kcache("--cache-dir", root, "--json", "explain", "--python", python, env=env)
    assert run.exit_code == 0, run.stderr
    [item] = run.json()["items"]
    return item, run.json()["here"]


def test_explain_names_what_numba_compares_and_never_guesses_a_hit(numba_root, tmp_path):
    item, here = explained(numba_root, here_python(tmp_path, "0.68.1"))
    assert here["versions"]["numba"] == "0.68.1"
    assert item["verdict"] == "unknown" and "x86_64-unknown-linux-gnu rocketlake" in item["why"]
    assert "which kcache does not ask here" in item["why"]
    for python, factor, recorded, said in [
        (here_python(tmp_path, None), "numba version", "0.68.1", "not installed"),
        (here_python(tmp_path, "0.67.0"), "numba version", "0.68.1", "0.67.0"),
        (here_python(tmp_path, "0.68.1", "3.12.1"), "python version", "3.11", "3.12"),
    ]:
        item, _ = explained(numba_root, python)
        assert (item["verdict"], item["factor"], item["recorded"], item["here"]) == ("miss", factor, recorded, said)


def test_explain_compares_the_cpu_numba_is_told_to_compile_for(numba_root, tmp_path):
    py = here_python(tmp_path, "0.68.1")
    item, here = explained(numba_root, py, env={"NUMBA_CPU_NAME": "generic"})
    assert here["env"] == {"NUMBA_CPU_NAME": "generic"}
    assert (item["verdict"], item["factor"], item["recorded"], item["here"]) == (
        "miss", "CPU name", "rocketlake", "generic")
    item, _ = explained(numba_root, py, env={"NUMBA_CPU_NAME": "rocketlake", "NUMBA_CPU_FEATURES": "+avx"})
    assert (item["verdict"], item["factor"], item["here"]) == ("miss", "CPU features", "+avx")
    item, _ = explained(numba_root, py, env={"NUMBA_DISABLE_JIT": "1"})
    assert (item["verdict"], item["factor"]) == ("miss", "NUMBA_DISABLE_JIT")


def test_explain_misses_a_pycache_whose_source_changed(tmp_path):
    project = in_tree(tmp_path)
    (project / "kc_numba.py").write_text("# another source\n")
    item, _ = explained(project, here_python(tmp_path, "0.68.1"))
    assert (item["verdict"], item["factor"], item["recorded"]) == ("miss", "status", "stale")
    assert "kc_numba.py beside __pycache__/ changed" in item["why"]


def test_numbas_temp_files_of_a_killed_write_are_its_leftovers(numba_root):
    """numba writes `<file>.tmp.<uuid hex[:16]>` and renames it (caching.py _open_for_write): a killed write
    leaves it. The entry is still numba's (prune --broken and clear take it), prune removes an old temp file
    from an entry that stays, and a directory holding only one is a leftover prune removes."""
    entry = numba_root / NUMBA_DIR
    temp = entry / "kc_numba.kc_add-3.py311.2.nbc.tmp.0123456789abcdef"
    temp.write_bytes(b"\x80\x04")
    (entry / "kc_numba.kc_add-3.py311.1.nbc").unlink()
    only = numba_root / "other_0123456789abcdef0123456789abcdef01234567"
    only.mkdir()
    (only / f"{INDEX}.tmp.fedcba9876543210").write_bytes(b"\x80")
    old = 1_000_000_000
    for p in (temp, only / f"{INDEX}.tmp.fedcba9876543210", only):
        os.utime(p, (old, old))
    listed = {r["hash"]: r for r in entries(numba_root)}
    assert listed[NUMBA_DIR]["status"] == "partial" and only.name in listed
    run = run_kcache("--cache-dir", numba_root, "prune", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert not temp.exists() and not only.exists() and (entry / INDEX).exists()
    temp.write_bytes(b"\x80\x04")
    run = run_kcache("--cache-dir", numba_root, "prune", "--broken", "--yes", "--json")
    assert run.exit_code == 0, run.stderr
    assert not entry.exists()
    mine = numba_root / "mine_0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(REAL / "numba" / NUMBA_DIR, mine)
    (mine / f"{INDEX}.tmp.notes").write_text("a user's file\n")
    assert run_kcache("--cache-dir", numba_root, "clear", "--all", "--yes").exit_code in (0, 1)
    assert (mine / INDEX).exists()


def test_a_jax_cache_whose_lockfile_jax_holds_is_building(jax_root):
    """jax holds .lockfile around a write, which puts the -cache before its -atime: ls says building (as
    prune keeps it in use), not partial."""
    from test_delete import hold_flock

    cache = jax_root / "jaxcache"
    (cache / ".lockfile").write_bytes(b"")
    (cache / f"{AFFINE}-atime").unlink()
    with hold_flock(cache / ".lockfile"):
        [row] = entries(jax_root)
        assert row["status"] == "building" and ".lockfile" in row["reason"]
        run = run_kcache("--cache-dir", jax_root, "prune", "--broken", "--yes")
        assert run.exit_code == 0 and (cache / f"{AFFINE}-cache").exists()
    assert entries(jax_root)[0]["status"] == "partial"


def test_where_a_jax_executable_was_built_is_looked_for_in_its_first_mebibyte_only():
    """`ls` inflates one executable to read the cache directory it was compiled for: a zlib or zstd bomb
    (300 MiB of zeros in a few hundred kB) is inflated no further than that first MiB."""
    import zlib

    from kcache_cli.layouts import jax

    bombs = [zlib.compress(b"\0" * (300 << 20))]
    try:
        import zstandard

        bombs.append(zstandard.ZstdCompressor().compress(b"\0" * (300 << 20)))
    except ImportError:  # zstd executables are then not read at all
        pass
    for bomb in bombs:
        out = jax._inflated(bomb)
        assert out is not None and len(out) == 1 << 20


def _status_where(jax_root: Path, place: Callable[[Path], tuple[Path, Path]]) -> tuple:
    """ls's status and reason of the JAX cache compiled for, and copied to, the directory `place(top)` names
    below a new short temp directory `top` (with the cache root above it: (root, cache))."""
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # short, whatever the length of pytest's own (xdist's is longer)
    try:
        root, cache = place(top)
        root.mkdir(exist_ok=True)
        shutil.copytree(jax_root / "jaxcache", cache)
        compiled_for(cache / f"{AFFINE}-cache", cache)
        [row] = entries(root)
    finally:
        shutil.rmtree(top)
    return row["status"], row["reason"]


def test_a_slash_after_a_tag_like_byte_and_a_length_like_byte_is_not_where_the_path_starts(jax_root):
    """<tmp>/zb/<59 c's>: "z" has a one-byte tag's wire type (2) and "b" (98) is the length of the rest of
    the string from the "/" after it, as a one-byte tag and a length would be: only the two-byte tag of the
    autotune dir's field (310) starts the path. (A temp directory's random name made this once in 150.)"""

    def place(top: Path) -> tuple[Path, Path]:
        return top / "zb", top / "zb" / ("c" * (ord("b") - 1 - len("/xla_gpu_per_fusion_autotune_cache_dir")))

    assert _status_where(jax_root, place) == ("complete", None)


def test_a_slash_in_the_path_that_follows_a_length_like_byte_is_not_where_the_path_starts(jax_root):
    """/tmp/<...>/jaxcache of 78 bytes: "p" (112) before /tmp's "/" equals the length of the rest of the
    option's string, as a varint length would; the tag before the real length is what tells them apart."""

    def place(top: Path) -> tuple[Path, Path]:
        root = top / "r"
        slash = str(root).index("/", 1)
        pad = slash + str(root)[slash - 1].encode()[0] - len("/xla_gpu_per_fusion_autotune_cache_dir")
        return root, root / ("c" * (pad - len(str(root)) - 1))

    assert _status_where(jax_root, place) == ("complete", None)


def test_the_cache_of_a_hidden_source_directory_is_named_by_the_hash_ls_shows(numba_root):
    """ls shows a hidden source directory's cache by its name, `.venv_<sha1>`: inspect, explain, ls and clear
    take that hash (or a prefix of it) back, as they take any other entry's."""
    hidden = "." + NUMBA_DIR
    shutil.copytree(numba_root / NUMBA_DIR, numba_root / hidden)
    shown = [e["hash"] for e in entries(numba_root)]
    assert hidden in shown
    for args in (("inspect", hidden), ("explain", hidden), ("ls", hidden[:5])):
        run = run_kcache("--cache-dir", numba_root, *args)
        assert run.exit_code == 0 and "bad hash prefix" not in run.stderr, (args, run.stderr)
    assert run.stdout.count("_35252f1788") == 1 and hidden in run.stdout  # ls .venv: that entry alone
    gone = run_kcache("--cache-dir", numba_root, "clear", hidden, "--yes")
    assert gone.exit_code == 0, gone.stderr
    assert not (numba_root / hidden).exists() and (numba_root / NUMBA_DIR).is_dir()
