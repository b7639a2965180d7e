"""Shell completion: the shipped scripts, the values completed from the cache, and real bash, zsh and fish
running the shipped scripts against this environment's kcache."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, copy_tree

from kcache_cli.catalog import names
from kcache_cli.catalog.scan import scan_cache
from kcache_cli.cli import complete
from kcache_cli.fs import read as fsread
from kcache_cli.model.terms import LAYOUT_NAMES

SCRIPTS = REPO / "completions"
HIDET = FIXTURES / "hidet"
TILUS = FIXTURES / "tilus"
TILELANG = FIXTURES / "tilelang"
HIDET_OPS = ["add", "fused", "matmul", "relu", "softmax"]
HIDET_HASHES = {"064b4a6c035246e8": "matmul (cpu_space_0)", "31857fe085635b31": "relu (cpu_space_0)",
                "8d1f7691cdf75e90": "add (cuda_space_0)", "ad252b064b266eea": "softmax (cuda_space_0)",
                "af3046266c6abdd1": "fused (cpu_space_0)"}


# ---- helpers ---------------------------------------------------------------------------------------
def _complete(kcache, line: str, env: dict | None = None) -> list[tuple[str, str]]:
    """Complete `line` (the text before the cursor) through the real entry point, in-process, as fish
    asks for it (values with descriptions)."""
    run = kcache(env={"_KCACHE_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                      "_TYPER_COMPLETE_ARGS": line, **(env or {})})
    assert run.exit_code == 0, run.stderr
    assert run.stderr == ""
    out = []
    for ln in run.stdout.splitlines():
        if ln:
            value, _, help = ln.partition("\t")
            out.append((value, help))
    return out


def _values(kcache, line: str, env: dict | None = None) -> list[str]:
    return [v for v, _ in _complete(kcache, line, env)]


@pytest.fixture
def shim(tmp_path) -> Path:
    """A bin directory whose `kcache` runs this environment's kcache (CI's fresh venv is not on PATH)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "kcache"
    exe.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m kcache_cli \"$@\"\n")
    exe.chmod(0o755)
    return bindir


def _shell_env(shim: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_KCACHE", "_TYPER", "COMP_", "KCACHE_"))}
    env.update(PATH=f"{shim}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}", NO_COLOR="1", **extra)
    return env


def _need(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"!!! {shell} is NOT INSTALLED: the shipped {shell} completion script was NOT tested in a real "
                    f"{shell} (apt-get install {shell}; .ci/run installs it)")
    return path


@pytest.fixture
def mixed(tmp_path) -> Path:
    """One root holding all three layouts, plus hidden, temp and stray entries that completion must skip."""
    root = tmp_path / "mixed"
    root.mkdir()
    for src in (HIDET, TILUS, TILELANG):
        for child in src.iterdir():
            copy_tree(child, root / child.name)
    (root / "graphs" / "9f86d081884c7d65").mkdir(parents=True)
    (root / "ir_modules" / "2c26b46b68ffc68f").mkdir(parents=True)
    (root / "ops" / "cuda_space_0" / "add" / ".kcache-tmp-8d1f7691cdf75e90-x1").mkdir()
    (root / "ops" / "cuda_space_0" / "add" / "stray.lock").write_text("")
    (root / ".kcache" / "locks").mkdir(parents=True)
    return root


# ---- the shipped scripts -------------------------------------------------------------------------
def test_shipped_scripts_are_up_to_date():
    stale = complete.regenerate(check=True)
    assert stale == [], (f"out of date: {[p.name for p in stale]}; "
                         "regenerate with: python -m kcache_cli.cli.complete")


def test_regenerate_check_reports_a_stale_script(tmp_path, monkeypatch):
    monkeypatch.setattr(complete, "COMPLETIONS_DIR", tmp_path / "completions")
    assert complete.regenerate(check=True) == [tmp_path / "completions" / f"kcache.{s}" for s in complete.SHELLS]
    assert not (tmp_path / "completions").exists()  # --check writes nothing
    assert len(complete.regenerate()) == 3
    assert complete.regenerate(check=True) == []
    (tmp_path / "completions" / "kcache.fish").write_text("# edited by hand\n")
    assert complete.regenerate(check=True) == [tmp_path / "completions" / "kcache.fish"]


def test_zsh_script_completes_on_the_first_tab_when_autoloaded():
    text = (SCRIPTS / "kcache.zsh").read_text()
    assert text.startswith("#compdef kcache\n")  # compinit only picks up files whose first line says so
    assert "loadautofunc" in text and "compdef _kcache_completion kcache" in text


@pytest.mark.parametrize("shell,installed", [
    ("bash", ".bash_completions/kcache.sh"), ("zsh", ".zfunc/_kcache"),
    ("fish", ".config/fish/completions/kcache.fish"),
])
def test_install_completion_writes_the_shipped_script(tmp_path, shell, installed):
    home = tmp_path / "home"
    env = dict(os.environ, HOME=str(home), _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    proc = subprocess.run([sys.executable, "-m", "kcache_cli", "--install-completion", shell], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"{shell} completion installed in" in proc.stdout
    assert (home / installed).read_text().strip() == (SCRIPTS / f"kcache.{shell}").read_text().strip()
    if shell == "bash":
        assert f"source '{home / installed}'" in (home / ".bashrc").read_text()


def test_show_completion_prints_the_shipped_script():
    env = dict(os.environ, _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    proc = subprocess.run([sys.executable, "-m", "kcache_cli", "--show-completion", "bash"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == (SCRIPTS / "kcache.bash").read_text()


# ---- the core: names only --------------------------------------------------------------------------
def test_names_agree_with_the_scan(mixed):
    scanned = [e for e in scan_cache(mixed).entries if not os.path.basename(e.path).startswith(".")]
    listed = list(names.entries(mixed))
    assert sorted((e.layout, e.kind, e.hash) for e in listed) == sorted((e.layout, e.kind, e.hash) for e in scanned)
    assert set(names.op_places(mixed)) == {e.op for e in scanned if e.op and e.kind in ("op", "script")}
    assert set(names.space_layouts(mixed)) == {e.space for e in scanned if e.space}
    assert names.layouts_of(mixed) == ("hidet", "tilus", "tilelang")


def test_names_filters(mixed):
    assert names.op_places(mixed, spaces=["cuda_space_0"]) == {"add": ("cuda_space_0",),
                                                               "softmax": ("cuda_space_0",)}
    assert names.op_places(mixed)["add_one"] == ("tilus",)
    assert list(names.space_layouts(mixed, ops=["matmul"])) == ["cpu_space_0"]
    assert [e.hash for e in names.entries(mixed, ops=["softmax"])] == ["ad252b064b266eea"]
    assert {e.layout for e in names.entries(mixed, spaces=["0.1.15/linux-x86_64"])} == {"tilelang"}
    assert [e.hash for e in names.entries(mixed, prefix="8d")] == ["8d1f7691cdf75e90"]
    assert all(e.layout == "tilus" for e in names.entries(mixed, layouts=["tilus"]))
    # a typed name that is not in the cache never takes a listing outside it
    assert list(names.entries(mixed, ops=["../../.."])) == []
    assert names.op_places(mixed, spaces=["../.."]) == {}


def test_names_read_directory_names_only(mixed, monkeypatch):
    """No stat of files, no file contents: os.stat/lstat and open are off limits."""

    def forbidden(*a, **k):
        raise AssertionError(f"names touched a file: {a}")

    for name in ("stat", "lstat"):
        monkeypatch.setattr(os, name, forbidden)
    monkeypatch.setattr("builtins.open", forbidden)
    assert len(list(names.entries(mixed))) == 11
    assert names.op_places(mixed) and names.space_layouts(mixed)


def test_names_of_a_missing_or_unreadable_root(tmp_path):
    assert list(names.entries(tmp_path / "nope")) == [] and names.op_places(tmp_path / "nope") == {}
    (tmp_path / "file").write_text("x")
    assert list(names.entries(tmp_path / "file")) == [] and names.space_layouts(tmp_path / "file") == {}


# ---- the callbacks, through the real entry point ------------------------------------------------------
def test_op_completes_the_ops_present(kcache):
    assert _values(kcache, f"kcache --cache-dir {HIDET} ls --op ") == HIDET_OPS
    assert _complete(kcache, f"kcache --cache-dir {HIDET} ls --op ma") == [("matmul", "cpu_space_0")]


def test_cache_dir_after_the_subcommand_and_kcache_dir(kcache, tmp_path):
    assert _values(kcache, f"kcache ls --cache-dir {HIDET} --op ") == HIDET_OPS
    assert _values(kcache, "kcache ls --op ", env={"KCACHE_DIR": str(TILUS)}) == ["add_one"]
    # --cache-dir wins over KCACHE_DIR, before or after the subcommand
    assert _values(kcache, f"kcache ls --cache-dir {HIDET} --op ", env={"KCACHE_DIR": str(TILUS)}) == HIDET_OPS
    assert _values(kcache, f"kcache --cache-dir {HIDET} ls --op ", env={"KCACHE_DIR": str(TILUS)}) == HIDET_OPS
    # a root that does not exist completes nothing, quietly
    assert _complete(kcache, f"kcache --cache-dir {tmp_path / 'nope'} ls --op ") == []


def test_cache_dir_after_a_command_that_does_not_declare_it(kcache):
    """log has no --cache-dir of its own: the hidden global copy is honoured when completing too."""
    assert _values(kcache, f"kcache log --cache-dir {HIDET} a") == ["ad252b064b266eea", "af3046266c6abdd1"]


def test_space_completes_the_spaces_present(kcache, mixed):
    assert _complete(kcache, f"kcache --cache-dir {mixed} ls --space ") == [
        ("0.1.15/cuda-binaries", "tilelang"), ("0.1.15/linux-x86_64", "tilelang"), ("cpu_space_0", "hidet"),
        ("cuda_space_0", "hidet")]
    assert _values(kcache, f"kcache --cache-dir {mixed} ls --space cu") == ["cuda_space_0"]
    assert _values(kcache, f"kcache --cache-dir {mixed} ls --op add --space ") == ["cuda_space_0"]


def test_triton_archs_complete_as_spaces(kcache, fixture_copy):
    """A Triton kernel's space is its arch (`ls --space sm_90a`), kept in its metadata, not in its path:
    TAB offers the archs of the kernels present, narrowed by the --op given, as for hidet's spaces."""
    cache = fixture_copy("triton") / "cache"
    assert _complete(kcache, f"kcache --cache-dir {cache} ls --space ") == [("sm_80", "triton"), ("sm_90a", "triton")]
    assert _values(kcache, f"kcache --cache-dir {cache} ls --op matmul_kernel --space ") == ["sm_90a"]
    assert _values(kcache, f"kcache --cache-dir {cache} clear --space sm_9") == ["sm_90a"]
    assert _values(kcache, f"kcache --cache-dir {cache} inspect --space ") == ["sm_80", "sm_90a"]


def test_a_tab_reads_a_bounded_number_of_kernels(kcache, fixture_copy, monkeypatch):
    """Never a scan of every kernel on TAB: at most names.READS kernels' metadata is read (every kernel
    of a cache up to that size; the first READS listed of a bigger one)."""
    cache = fixture_copy("triton") / "cache"
    read = _calls(monkeypatch, "json_object")
    monkeypatch.setattr(names, "READS", 2)
    offered = _values(kcache, f"kcache --cache-dir {cache} ls --space ")
    assert len(read) == 2 and all(n.endswith("_kernel.json") for n in read), read
    assert offered and set(offered) <= {"sm_80", "sm_90a"}


TRITON_OPS = ["add_kernel", "matmul_kernel", "softmax_kernel"]


def _calls(monkeypatch, reader: str) -> list[str]:
    """The last parts of the paths fsread's `reader` is asked for from now on."""
    asked: list[str] = []
    real = getattr(fsread, reader)

    def spy(path, *a, **k):
        asked.append(os.path.basename(os.fspath(path)))
        return real(path, *a, **k)

    monkeypatch.setattr(fsread, reader, spy)
    return asked


def _kernel_listings(monkeypatch) -> list[str]:
    """The kernel directories listed (fsread.names: how names.py tells a Triton kernel's name) from now on."""
    return _calls(monkeypatch, "names")


def _indexed(kcache, cache: Path, monkeypatch) -> None:
    """The scan index and the root's kept listing written for a cache of a few kernels, as for a big one (no
    minimum; entries and listings just made count as settled), its kernels' group paths made its own."""
    from kcache_cli.catalog import index
    from kcache_cli.fs import dirnames

    for module, name, value in ((index, "MIN_ENTRIES", 1), (index, "RACY_SECONDS", -60.0),
                                (dirnames, "MIN_BYTES", 0), (dirnames, "RACY_SECONDS", -60.0)):
        monkeypatch.setattr(module, name, value)
    assert kcache("--cache-dir", cache, "verify", "--fix").exit_code == 0  # (complete: the index keeps it)
    assert kcache("--cache-dir", cache, "ls").exit_code == 0
    assert sorted(os.listdir(cache / ".kcache" / "index")) == [f"names.{os.geteuid()}", f"scan.{os.geteuid()}"]


def test_triton_ops_complete_to_the_kernel_names(kcache, fixture_copy, monkeypatch):
    """A Triton kernel's op is its name, in its file names: every kernel's of a small cache, with no index
    and with one."""
    cache = fixture_copy("triton") / "cache"
    assert _complete(kcache, f"kcache --cache-dir {cache} ls --op ") == [(op, "triton") for op in TRITON_OPS]
    _indexed(kcache, cache, monkeypatch)
    assert _values(kcache, f"kcache --cache-dir {cache} ls --op ") == TRITON_OPS
    assert _values(kcache, f"kcache --cache-dir {cache} clear --op ma") == ["matmul_kernel"]


def test_a_triton_op_tab_lists_no_kernel_the_index_holds(kcache, fixture_copy, monkeypatch):
    """`ls --op <TAB>` listed every kernel directory of a Triton root to name its kernel (seconds at 10^5):
    on a root of more than names.READS kernels the names come from the scan index now, and only the kernels
    it does not hold (new since the last scan) are listed, at most READS of them; without an index, READS."""
    cache = fixture_copy("triton") / "cache"
    listed = _kernel_listings(monkeypatch)
    monkeypatch.setattr(names, "READS", 2)
    offered = _values(kcache, f"kcache --cache-dir {cache} ls --op ")
    assert len(listed) == 2 and offered and set(offered) <= set(TRITON_OPS), (listed, offered)

    monkeypatch.setattr(names, "READS", 5)  # the root holds 6 kernels: more than a sample covers
    _indexed(kcache, cache, monkeypatch)
    listed.clear()
    assert _values(kcache, f"kcache --cache-dir {cache} ls --op ") == TRITON_OPS
    assert listed == []
    new = cache / ("N" * 52)  # a kernel compiled since the scan
    shutil.copytree(cache / "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA", new)
    (new / "__grp__add_kernel.json").rename(new / "__grp__new_kernel.json")
    assert _values(kcache, f"kcache --cache-dir {cache} ls --op ") == ["add_kernel", "matmul_kernel", "new_kernel",
                                                                         "softmax_kernel"]
    assert listed == [new.name]
    listed.clear()  # more new kernels than names.READS: a sample of them, and every name the index holds
    shutil.copytree(new, cache / ("M" * 52))
    monkeypatch.setattr(names, "READS", 1)
    assert set(_values(kcache, f"kcache --cache-dir {cache} ls --op ")) >= set(TRITON_OPS)
    assert len(listed) == 1 and listed[0] in (new.name, "M" * 52)


def test_completion_detects_the_layout_from_the_kept_listing(kcache, fixture_copy, monkeypatch):
    """A TAB (and a hint) told the layouts from a fresh listing of the root: 10^5 names on a Triton root that
    a scan had kept (fs/dirnames.py)."""
    from kcache_cli.fs import dirnames

    cache = fixture_copy("triton") / "cache"
    _indexed(kcache, cache, monkeypatch)
    monkeypatch.setattr(names, "READS", 5)  # (the names from the index: no sample's listing of the root)
    listings: list[str] = []
    real_read, real_scandir = dirnames._read, fsread.scandir_list
    monkeypatch.setattr(dirnames, "_read", lambda fd: listings.append("fd") or real_read(fd))
    monkeypatch.setattr(fsread, "scandir_list", lambda p, *a, **k: listings.append(p) or real_scandir(p, *a, **k))
    assert names.layouts_of(cache) == ("triton",)
    assert _values(kcache, f"kcache --cache-dir {cache} ls --op ") == TRITON_OPS
    assert listings == []


def test_another_user_s_metadata_is_not_read(fixture_copy, monkeypatch):
    """Reading without O_NOATIME (another user's file) would move its access time, which says when Triton
    last used the kernel: completion leaves such a file alone."""
    from kcache_cli.layouts import shapes

    cache = fixture_copy("triton") / "cache"
    key = cache / "22DX5RUZ7YPKNU74O7GAUCGIGIPAEV2FCKTGJU2B2LNOL5MZNINQ"
    listed = os.listdir(key)
    assert shapes.triton_arch_in_files(str(cache), str(key), listed) == "sm_80"
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(key).st_uid + 1)
    assert shapes.triton_arch_in_files(str(cache), str(key), listed) is None


def _inductor_with_triton(tmp_path: Path) -> Path:
    from loaders import recorded

    root = recorded.extract_tree("inductor", tmp_path / "inductor")
    copy_tree(FIXTURES / "triton" / "cache", root / "triton" / "0")
    return root


def _vllm(tmp_path: Path) -> Path:
    from loaders import recorded

    return recorded.extract_tree("vllm", tmp_path / "vllm" / "root")


@pytest.mark.parametrize("layout", ["hidet", "tilus", "tilelang", "triton", "inductor", "vllm"])
def test_spaces_offered_are_the_spaces_ls_lists(kcache, fixture_copy, tmp_path, layout):
    """Every layout's spaces complete to what its scan lists: hidet's <target>_space_<level>, tilelang's
    <version>/<platform>, Triton's arch, Inductor's triton/<device>; tilus and vLLM have none."""
    root = {"triton": lambda: fixture_copy("triton") / "cache", "inductor": lambda: _inductor_with_triton(tmp_path),
            "vllm": lambda: _vllm(tmp_path)}.get(layout, lambda: fixture_copy(layout))()
    scanned = {e.space for e in scan_cache(root).entries if e.space}
    assert scanned or layout in ("tilus", "vllm")
    assert _values(kcache, f"kcache --cache-dir {root} ls --space ") == sorted(scanned)


def test_completion_narrows_by_what_is_already_given(kcache, mixed):
    assert _values(kcache, f"kcache --cache-dir {mixed} ls --space cpu_space_0 --op ") == ["fused", "matmul", "relu"]
    assert _values(kcache, f"kcache --cache-dir {mixed} ls --op matmul --op ") == [
        "add", "add_one", "fused", "relu", "softmax"]
    assert _values(kcache, f"kcache --cache-dir {mixed} ls --op add ") == ["8d1f7691cdf75e90"]
    assert _values(kcache, f"kcache --cache-dir {mixed} ls --layout tilus ") == ["1-845a0ed6", "f006237ca7a5"]


def test_hashes_complete_with_the_op_as_description(kcache, mixed):
    got = dict(_complete(kcache, f"kcache --cache-dir {HIDET} inspect "))
    assert got == HIDET_HASHES
    got = dict(_complete(kcache, f"kcache --cache-dir {mixed} ls "))
    assert got["1-845a0ed6"] == "add_one" and got["f006237ca7a5"] == "tilus program"
    assert got["9f86d081884c7d65"] == "hidet graph" and got["2c26b46b68ffc68f"] == "hidet ir_module"
    assert got["cb68ca6910905a22415eeff34244c6b161f51a79389abd03689b1d0f2155a46e"] == \
        "tilelang kernel (0.1.15/linux-x86_64)"
    assert not any(h.startswith(".") for h in got) and "stray.lock" not in got
    assert _values(kcache, f"kcache --cache-dir {mixed} log 8") == ["8d1f7691cdf75e90"]
    # hashes already on the line are not offered again
    assert "8d1f7691cdf75e90" not in _values(kcache, f"kcache --cache-dir {mixed} ls 8d1f7691cdf75e90 ")


def test_a_hidden_numba_entry_completes_once_a_dot_is_typed(kcache, tmp_path):
    """numba names the cache of a hidden directory's sources `.venv_<sha1>/`, and ls shows it by that hash:
    a typed "." completes it, as a shell offers dotfiles; nothing typed offers only the visible ones."""
    root = tmp_path / "numba"
    shutil.copytree(Path(__file__).parent / "fixtures" / "real" / "numba", root)
    name = next(root.iterdir()).name
    shutil.copytree(root / name, root / f".venv{name[name.index('_'):]}")
    assert _values(kcache, f"kcache --cache-dir {root} inspect .v") == [f".venv{name[name.index('_'):]}"]
    assert _values(kcache, f"kcache --cache-dir {root} inspect ") == [name]


def test_the_same_hash_in_two_spaces_is_one_value(kcache, tmp_path):
    root = copy_tree(HIDET, tmp_path / "c")
    shutil.copytree(root / "ops" / "cuda_space_0" / "add", root / "ops" / "cuda_space_2" / "add")
    assert _complete(kcache, f"kcache --cache-dir {root} inspect 8d") == [
        ("8d1f7691cdf75e90", "add (cuda_space_0), add (cuda_space_2)")]


def test_static_values(kcache):
    assert _values(kcache, "kcache ls --status ") == ["complete", "partial", "failed", "corrupt", "building", "stale",
                                                     "unreadable", "moved", "broken"]
    assert _values(kcache, "kcache ls --status complete,p") == ["complete,partial"]
    assert _values(kcache, "kcache ls --layout ti") == ["tilus", "tilelang"]
    assert _values(kcache, "kcache ls --target c") == ["cuda", "cpu"]
    assert _values(kcache, "kcache ls --kind ") == ["op", "graph", "ir_module", "program", "script", "kernel",
                                                    "binary", "autograd", "code", "autotune", "triton", "jit",
                                                    "compile", "aot", "extension", "compile_cache", "functions"]


_HOMES_ENV = ("KCACHE_DIR", "TILELANG_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME", "TORCHINDUCTOR_CACHE_DIR",
              "CUDA_CACHE_PATH", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR",
              "JAX_COMPILATION_CACHE_DIR", "NUMBA_CACHE_DIR")


def _homes_env(home: Path, **extra: str) -> dict:
    """HOME at `home`, and none of the variables that move a compiler's cache set (but `extra`)."""
    return {**{k: None for k in _HOMES_ENV}, "HOME": str(home), **extra}


def test_every_closed_option_completes_its_values(kcache):
    """`ls --sort <TAB>` completed nothing: every option that takes a fixed set of values completes it."""
    assert _complete(kcache, "kcache ls --sort ") == [("op", "by layout, op and space (the default)"),
                                                      ("size", "biggest first"), ("age", "least recently used first")]
    assert _values(kcache, "kcache ls --sort s") == ["size"]
    assert _values(kcache, "kcache export --format ") == ["tar", "torch-mega"]
    assert _values(kcache, "kcache export --status b") == ["building", "broken"]
    assert _values(kcache, "kcache build --target ") == ["cuda", "cpu"]
    assert _values(kcache, "kcache build --target cpu --space ") == ["0", "1", "2", "cpu_space_0", "cpu_space_1",
                                                                    "cpu_space_2"]
    assert _values(kcache, "kcache config set ") == ["max-size", "max-age"]
    assert _values(kcache, "kcache config unset max-age --cache ") == [*LAYOUT_NAMES, "all"]


def test_completed_values_are_the_accepted_ones(kcache, tmp_path):
    """Each value completed is one the option takes, and a value it refuses is not completed."""
    root = copy_tree(HIDET, tmp_path / "c")
    for option in ("--sort", "--status", "--layout", "--kind"):
        values = _values(kcache, f"kcache ls --cache-dir {root} {option} ")
        assert values, option
        for value in values:
            run = kcache("--cache-dir", str(root), "ls", option, value)
            assert run.exit_code == 0, (option, value, run.stderr)
        refused = kcache("--cache-dir", str(root), "ls", option, "nonesuch")
        assert refused.exit_code == 2 and "choose from" in refused.stderr, option
    env = {"KCACHE_CONFIG": str(tmp_path / "config.toml")}
    for section in _values(kcache, "kcache config set --cache "):
        for key in _values(kcache, "kcache config set "):
            run = kcache("config", "set", key, "1G" if key == "max-size" else "1d", "--cache", section, env=env)
            assert run.exit_code == 0, (section, key, run.stderr)


@pytest.mark.parametrize("jax", [False, True])
def test_cache_completes_the_names_cache_takes(kcache, tmp_path, jax):
    """`--cache <TAB>` offered jax when `--cache jax` was refused, or the other way round: both, and the names
    `kcache dir --all` shows, come from one list (jax only where JAX_COMPILATION_CACHE_DIR names its cache)."""
    extra = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax" / "cache")} if jax else {}
    env = _homes_env(tmp_path / "home", **extra)
    offered = _values(kcache, "kcache ls --cache ", env)
    assert ("jax" in offered) is jax
    listed = json.loads(kcache("dir", "--all", "--json", env=env).stdout)
    assert offered == [c["cache"] for c in listed["caches"]]
    for name in offered:
        run = kcache("ls", "--cache", name, "--json", env=env)
        assert run.exit_code == 0, (name, run.stderr)
    refused = kcache("ls", "--cache", "jax", env=env)
    assert (refused.exit_code == 2) is not jax, refused.stderr
    if not jax:  # a cache kcache knows that has no place here, not an "unknown cache"
        assert "JAX_COMPILATION_CACHE_DIR" in refused.stderr and "unknown" not in refused.stderr, refused.stderr


def test_a_closed_option_offers_no_file_names(kcache, tmp_path):
    """Nothing matching `--op` (an empty cache), `--sort x`...: the shells fell back to the current directory's
    file names. Now they are told to offer nothing: bash by exit status 3, zsh by `return 1`, fish by is-args
    holding. A path (--cache-dir) or an ENTRY (which may be a path) still falls back to file names."""
    empty = tmp_path / "empty"
    empty.mkdir()

    def ask(shell: str, line: str):
        words = line.split(" ")
        env = {"KCACHE_DIR": str(empty), "_KCACHE_COMPLETE": f"complete_{shell}", "_TYPER_COMPLETE_ARGS": line,
               "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1), "_TYPER_COMPLETE_FISH_ACTION": "is-args"}
        return kcache(env=env)

    for line in ("kcache ls --op ", "kcache ls --sort x", "kcache ls --space ", "kcache ls --cache x",
                 "kcache config set x", "kcache export --format x"):
        assert ask("bash", line).exit_code == 3, line
        zsh = ask("zsh", line)
        assert (zsh.exit_code, zsh.stdout.strip()) == (0, "return 1"), line
        assert ask("fish", line).exit_code == 0, line  # is-args holds: no file names
    for line in ("kcache ls --cache-dir ", "kcache inspect /tm"):
        bash = ask("bash", line)
        assert (bash.exit_code, bash.stdout.strip()) == (0, ""), line
        assert ask("zsh", line).stdout.strip() == "_files", line
        assert ask("fish", line).exit_code == 1, line  # is-args fails: fish completes file names


def test_every_option_with_a_value_completes_or_is_free_text():
    """An option added with a closed set of values and no completion would fall back to file names: each
    option or argument taking a value completes, or its metavar says it is free text (a path, a size...)."""
    free = {"PATH", "DIR", "TASK...", "ARCHIVE", "SIZE", "AGE", "SECONDS", "N", "URL", "USER", "ARCH", "PY",
            "VALUE", "[ENTRY|ARCHIVE|IMAGE|BLOB]..."}

    def walk(cmd, path):
        for p in cmd.params:
            if getattr(p, "is_flag", False) or getattr(p, "hidden", False) or p.name == "cache_dir":
                continue
            if p._custom_shell_complete is None:
                assert p.metavar in free, f"kcache {path} {p.opts}: no completion for {p.metavar}"
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    walk(get_command(full_app()), "")


def test_commands_and_options_complete(kcache):
    values = _values(kcache, "kcache ")
    assert {"dir", "ls", "inspect", "log", "stats"} <= set(values)
    opts = _values(kcache, "kcache ls --")
    assert {"--op", "--space", "--status", "--json", "--cache-dir"} <= set(opts)
    assert "--debug" not in opts  # the hidden global copies stay out of the way


def test_version_flag_does_not_leak_into_completions(kcache):
    assert _values(kcache, f"kcache --version --cache-dir {HIDET} ls --op ma") == ["matmul"]


# ---- real shells ---------------------------------------------------------------------------------------
def test_bash_sources_the_shipped_script_and_completes(shim, mixed):
    bash = _need("bash")
    script = SCRIPTS / "kcache.bash"
    cases = [
        (["kcache", "--cache-dir", str(mixed), "ls", "--op", "ma"], ["matmul"]),
        (["kcache", "ls", "--cache-dir", str(mixed), "--space", "cu"], ["cuda_space_0"]),
        (["kcache", "ls", "--op", ""], ["add", "add_one", "fused", "matmul", "relu", "softmax"]),  # KCACHE_DIR
        (["kcache", "inspect", "8"], ["8d1f7691cdf75e90"]),
        (["kcache", "--cache-dir", str(mixed), "log", "f0"], ["f006237ca7a5"]),
        (["kcache", "ls", "--status", "co"], ["complete", "corrupt"]),
        (["kcache", "st"], ["stats"]),
    ]
    lines = [f"source {shlex.quote(str(script))}", "complete -p kcache"]
    for words, _ in cases:
        lines += [f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}",
                  "COMPREPLY=(); _kcache_completion kcache", 'echo "reply:${COMPREPLY[*]}"']
    proc = subprocess.run([bash, "--norc", "--noprofile", "-c", "\n".join(lines)],
                          env=_shell_env(shim, KCACHE_DIR=str(mixed)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "complete -o default -F _kcache_completion kcache"
    replies = [ln[len("reply:"):].split() for ln in out if ln.startswith("reply:")]
    assert replies == [expected for _, expected in cases]
    assert proc.stderr == ""


def test_fish_runs_the_shipped_script(shim, mixed):
    fish = _need("fish")
    script = SCRIPTS / "kcache.fish"
    cmd = (f"source {shlex.quote(str(script))}; "
           f"complete -C {shlex.quote(f'kcache --cache-dir {mixed} ls --op ma')}; echo ---; "
           f"complete -C {shlex.quote(f'kcache --cache-dir {mixed} inspect 8d')}; echo ---; "
           f"complete -C {shlex.quote('kcache ls --space 0.')}")
    proc = subprocess.run([fish, "--no-config", "-c", cmd], env=_shell_env(shim, KCACHE_DIR=str(mixed)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ops, hashes, spaces = proc.stdout.split("---\n")
    assert ops.splitlines() == ["matmul\tcpu_space_0"]
    assert hashes.splitlines() == ["8d1f7691cdf75e90\tadd (cuda_space_0)"]
    assert [ln.split("\t")[0] for ln in spaces.splitlines()] == ["0.1.15/cuda-binaries", "0.1.15/linux-x86_64"]


def _workdir(tmp_path: Path) -> Path:
    """A current directory holding a file a shell would offer if it fell back to file names."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "zz_marker_file").write_text("")
    return work


def test_bash_completes_closed_values_and_never_file_names(shim, tmp_path):
    """bash: `ls --sort ""` completed nothing, `ls --cache ""` left jax out where `--cache jax` works, and an
    option value nothing matched fell back to file names (`complete -o default`). compopt is stubbed to say
    what the script asks of it (outside a TAB bash refuses it)."""
    bash = _need("bash")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["kcache", "ls", "--sort", ""], "op size age"),
        (["kcache", "ls", "--cache", "j"], "jax"),
        (["kcache", "export", "--format", ""], "tar torch-mega"),
        (["kcache", "--cache-dir", str(empty), "ls", "--op", ""], " compopt +o default"),
        (["kcache", "ls", "--sort", "x"], " compopt +o default"),
        (["kcache", "ls", "--cache-dir", ""], ""),  # a path: bash's own file names, as before
    ]
    lines = [f"source {shlex.quote(str(SCRIPTS / 'kcache.bash'))}", 'compopt() { local IFS=" "; said+=" compopt $*"; }']
    for words, _ in cases:
        lines += [f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}",
                  'said=""; COMPREPLY=(); _kcache_completion kcache; echo "reply:${COMPREPLY[*]}$said"']
    env = _shell_env(shim, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax" / "cache"))
    proc = subprocess.run([bash, "--norc", "--noprofile", "-c", "\n".join(lines)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=_workdir(tmp_path))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert [ln[len("reply:"):] for ln in proc.stdout.splitlines()] == [expected for _, expected in cases]


def test_fish_completes_closed_values_and_never_file_names(shim, tmp_path):
    """fish: --op, --sort... fell back to the current directory's file names when nothing matched."""
    fish = _need("fish")
    empty = tmp_path / "empty"
    empty.mkdir()
    lines = [f"kcache --cache-dir {empty} ls --op ", "kcache ls --sort ", "kcache ls --sort x",
             "kcache config set --cache ", "kcache ls --cache-dir "]
    cmd = f"source {shlex.quote(str(SCRIPTS / 'kcache.fish'))}; " + "; echo ---; ".join(
        f"complete -C {shlex.quote(line)}" for line in lines)
    proc = subprocess.run([fish, "--no-config", "-c", cmd], env=_shell_env(shim, KCACHE_DIR=str(empty)),
                          capture_output=True, text=True, timeout=120, cwd=_workdir(tmp_path))
    assert proc.returncode == 0, proc.stderr
    got = [[ln.split("\t")[0] for ln in part.splitlines()] for part in proc.stdout.split("---\n")]
    assert got == [[], ["age", "op", "size"], [], sorted([*LAYOUT_NAMES, "all"]), ["zz_marker_file"]]


def _zsh_run(zsh: str, shim: Path, body: str, root: Path) -> list[str]:
    # _arguments is stubbed to print what the script hands it: the completion system proper needs a terminal.
    prog = ("_arguments() { print -r -- \"ARGS:$*\" }\n"
            "_files() { print -r -- FILES }\n" + body)
    proc = subprocess.run([zsh, "-f", "-c", prog], env=_shell_env(shim, KCACHE_DIR=str(root)), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_zsh_sourced_script_completes(shim, mixed, tmp_path):
    zsh = _need("zsh")
    body = (f"autoload -Uz compinit; compinit -u -d {tmp_path}/zcd\n"
            f"source {shlex.quote(str(SCRIPTS / 'kcache.zsh'))}\n"
            "print -r -- \"registered:$_comps[kcache]\"\n"
            "words=(kcache ls --op ma); CURRENT=4; _kcache_completion\n"
            "words=(kcache inspect 8d); CURRENT=3; _kcache_completion\n")
    out = _zsh_run(zsh, shim, body, mixed)
    assert out[0] == "registered:_kcache_completion"
    assert out[1] == "ARGS:*: :((\"matmul\":\"cpu_space_0\"))"
    assert out[2] == "ARGS:*: :((\"8d1f7691cdf75e90\":\"add (cuda_space_0)\"))"


def test_zsh_completes_closed_values_and_never_file_names(shim, tmp_path):
    """zsh: an option value nothing matched got `_files` (the current directory's names)."""
    zsh = _need("zsh")
    empty = tmp_path / "empty"
    empty.mkdir()
    body = (f"autoload -Uz compinit; compinit -u -d {tmp_path}/zcd\n"
            f"source {shlex.quote(str(SCRIPTS / 'kcache.zsh'))}\n"
            "words=(kcache ls --sort s); CURRENT=4; _kcache_completion; print -r -- rc=$?\n"
            "words=(kcache ls --op ''); CURRENT=4; _kcache_completion; print -r -- rc=$?\n"
            "words=(kcache ls --cache-dir ''); CURRENT=4; _kcache_completion; print -r -- rc=$?\n")
    out = _zsh_run(zsh, shim, body, empty)
    assert out == ["ARGS:*: :((\"size\":\"biggest first\"))", "rc=0", "rc=1", "FILES", "rc=0"]


def test_zsh_autoloaded_script_completes_on_the_first_call(shim, mixed, tmp_path):
    """Installed in fpath (as --install-completion does), the first TAB of a shell must complete too."""
    zsh = _need("zsh")
    fdir = tmp_path / "zfunc"
    fdir.mkdir()
    shutil.copy(SCRIPTS / "kcache.zsh", fdir / "_kcache")
    body = (f"fpath=({fdir} $fpath); autoload -Uz compinit; compinit -u -d {tmp_path}/zcd\n"
            "print -r -- \"registered:$_comps[kcache]\"\n"
            "words=(kcache ls --op ma); CURRENT=4\n"
            "$_comps[kcache]\n"  # what the first TAB calls: the autoloaded _kcache
            "words=(kcache ls --status co); CURRENT=4\n"
            "$_comps[kcache]\n")  # the second TAB
    out = _zsh_run(zsh, shim, body, mixed)
    assert out[0] == "registered:_kcache"
    assert out[1] == "ARGS:*: :((\"matmul\":\"cpu_space_0\"))"
    assert out[2].startswith("ARGS:*: :((\"complete\":") and "\"corrupt\":" in out[2]


# ---- a real TAB in a real terminal (tmux) ------------------------------------------------------------------
def _tmux_tab(shell_cmd: list[str], env: dict, typed: str, expect: str, tmp_path: Path) -> str:
    """Type `typed` into an interactive shell in tmux, press TAB, and return the screen once `expect` shows
    (or after 30 s without it)."""
    tmux = _need("tmux")
    base = [tmux, "-S", str(tmp_path / "tmux.sock")]

    def screen_once(cond: str) -> str:
        deadline = time.monotonic() + 30
        while True:  # waiting for the screen, not a timed assertion
            text = subprocess.run(base + ["capture-pane", "-p"], capture_output=True, text=True, timeout=30).stdout
            if cond in text or time.monotonic() > deadline:
                return text
            time.sleep(0.2)

    subprocess.run(base + ["new-session", "-d", "-x", "200", "-y", "40", *shell_cmd], env=env, check=True,
                   timeout=30)
    try:
        screen_once("$" if "bash" in shell_cmd[0] else "%")
        subprocess.run(base + ["send-keys", "-l", typed], check=True, timeout=30)
        screen_once(typed)
        subprocess.run(base + ["send-keys", "Tab"], check=True, timeout=30)
        return screen_once(expect)
    finally:
        subprocess.run(base + ["kill-server"], capture_output=True, timeout=30)


def test_a_real_tab_in_interactive_bash(shim, mixed, tmp_path):
    bash = _need("bash")
    rc = tmp_path / "bashrc"
    rc.write_text(f"PS1='$ '\nsource {shlex.quote(str(SCRIPTS / 'kcache.bash'))}\n")
    env = _shell_env(shim, KCACHE_DIR=str(mixed), HOME=str(tmp_path))
    screen = _tmux_tab([bash, "--noprofile", "--rcfile", str(rc), "-i"], env, "kcache ls --op matm",
                       "--op matmul", tmp_path)
    assert "kcache ls --op matmul" in screen, screen


def test_a_real_tab_in_interactive_zsh_with_fpath(shim, mixed, tmp_path):
    zsh = _need("zsh")
    fdir = tmp_path / "zfunc"
    fdir.mkdir()
    shutil.copy(SCRIPTS / "kcache.zsh", fdir / "_kcache")
    (tmp_path / ".zshrc").write_text(f"PS1='%% '\nfpath=({fdir} $fpath)\nautoload -Uz compinit\n"
                                     f"compinit -u -d {tmp_path}/zcd\n")
    env = _shell_env(shim, KCACHE_DIR=str(mixed), ZDOTDIR=str(tmp_path), HOME=str(tmp_path))
    screen = _tmux_tab([zsh, "-i"], env, "kcache inspect 8d", "8d1f7691cdf75e90", tmp_path)
    assert "kcache inspect 8d1f7691cdf75e90" in screen, screen


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_a_real_tab_offers_no_file_names_for_a_closed_option(shim, tmp_path, shell):
    """Two TABs after `--op ` in an empty cache, in an interactive shell in tmux: nothing is offered (the
    current directory's zz_marker_file was)."""
    path = _need(shell)
    tmux = _need("tmux")
    empty = tmp_path / "empty"
    empty.mkdir()
    if shell == "bash":
        (tmp_path / "bashrc").write_text(f"PS1='$ '\nsource {shlex.quote(str(SCRIPTS / 'kcache.bash'))}\n")
        cmd = [path, "--noprofile", "--rcfile", str(tmp_path / "bashrc"), "-i"]
    else:
        fdir = tmp_path / "zfunc"
        fdir.mkdir()
        shutil.copy(SCRIPTS / "kcache.zsh", fdir / "_kcache")
        (tmp_path / ".zshrc").write_text(f"PS1='%% '\nfpath=({fdir} $fpath)\nautoload -Uz compinit\n"
                                         f"compinit -u -d {tmp_path}/zcd\n")
        cmd = [path, "-i"]
    env = _shell_env(shim, KCACHE_DIR=str(empty), HOME=str(tmp_path), ZDOTDIR=str(tmp_path))
    base = [tmux, "-S", str(tmp_path / "tmux.sock")]
    subprocess.run(base + ["new-session", "-d", "-x", "200", "-y", "40", "-c", str(_workdir(tmp_path)), *cmd],
                   env=env, check=True, timeout=30)
    try:
        screen = ""
        steps = ((["-l", "kcache ls --sort a"], "--sort a"), (["Tab"], "--sort age"),
                 (["-l", "--", "--op "], "age --op"), (["Tab", "Tab"], None), (["-l", "ENDMARK"], "ENDMARK"))
        for keys, expect in steps:
            subprocess.run(base + ["send-keys", *keys], check=True, timeout=30)
            deadline = time.monotonic() + 30
            while expect is not None:  # waiting for the screen, not a timed assertion
                screen = subprocess.run(base + ["capture-pane", "-p"], capture_output=True, text=True,
                                        timeout=30).stdout
                if expect in screen or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert expect is None or expect in screen, screen
    finally:
        subprocess.run(base + ["kill-server"], capture_output=True, timeout=30)
    assert "zz_marker_file" not in screen and "--op ENDMARK" in screen, screen


# ---- every command, including the ones added later ----------------------------------------------------
def _commands():
    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    app = full_app()

    return get_command(app).commands


def _completing_params(cmd):
    """--op, --space (names, not build's level), and HASH arguments: the ones that must complete from the cache."""
    out = []
    for p in cmd.params:
        opts = set(getattr(p, "opts", ()))
        if (opts & {"--op"}) or ("--space" in opts and p.multiple):
            out.append((p, sorted(opts & {"--op", "--space"})[0]))
        elif p.param_type_name == "argument" and "HASH" in (p.metavar or ""):
            out.append((p, "HASH"))
    return out


# clear declares its own [HASH]... argument instead of common.HashesArg, so it has no completion (yet).
_KNOWN_GAPS: set = set()


@pytest.mark.parametrize("name,what", [(n, w) for n, cmd in sorted(_commands().items())
                                       for _, w in _completing_params(cmd)])
def test_every_command_completes_ops_spaces_and_hashes(kcache, name, what, mixed):
    if (name, what) in _KNOWN_GAPS:
        pytest.xfail(f"{name}'s {what} argument is declared without completion (use common.HashesArg)")
    cmd = _commands()[name]
    if what == "--op":
        assert _values(kcache, f"kcache --cache-dir {mixed} {name} --op ma") == ["matmul"]
    elif what == "--space":
        assert _values(kcache, f"kcache {name} --cache-dir {mixed} --space cu") == ["cuda_space_0"]
    else:
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        index = next(i for i, a in enumerate(args) if "HASH" in (a.metavar or ""))
        line = f"kcache --cache-dir {mixed} {name} {'x ' * index}8d"  # e.g. export's ARCHIVE comes first
        assert _complete(kcache, line) == [("8d1f7691cdf75e90", "add (cuda_space_0)")], line


def test_the_cache_dir_given_last_wins_as_when_running(kcache, tmp_path):
    odd = copy_tree(TILUS, tmp_path / "a,b")  # a comma in the path is not a list separator here
    assert _values(kcache, f"kcache --cache-dir {HIDET} log --cache-dir {odd} ") == ["1-845a0ed6", "f006237ca7a5"]
    assert _values(kcache, f"kcache --cache-dir {odd} ls --cache-dir {HIDET} --op ") == HIDET_OPS
    run = kcache("--cache-dir", str(HIDET), "log", "--cache-dir", str(odd), "1-845a0ed6", "--raw")
    assert run.exit_code == 0 and "nvcc" in run.stdout  # the same root when running


def test_a_prefix_lookup_stats_only_the_names_that_match(mixed, monkeypatch):
    seen: list[str] = []
    real_lstat, real_stat = os.lstat, os.stat

    def spy(path, *a, **k):
        seen.append(os.path.basename(os.fspath(path)))
        return real_lstat(path, *a, **k)

    def stat_spy(path, *a, dir_fd=None, follow_symlinks=True):  # an lstat from a held root's fd
        if not follow_symlinks:
            seen.append(os.path.basename(os.fspath(path)))
        return real_stat(path, *a, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "lstat", spy)
    monkeypatch.setattr(os, "stat", stat_spy)
    assert [e.hash for e in names.entries(mixed, prefix="8d")] == ["8d1f7691cdf75e90"]
    assert seen and all(n.startswith("8d") for n in seen)
    os.symlink("/etc", mixed / "ops/cuda_space_0/softmax/8d00000000000000")  # a link is no entry
    assert [e.hash for e in names.entries(mixed, prefix="8d")] == ["8d1f7691cdf75e90"]


@pytest.mark.parametrize("shell", ["fish", "zsh"])
def test_a_description_past_80_columns_stays_on_its_candidates_line(tmp_path, monkeypatch, shell):
    """Typer renders descriptions in an 80-column Rich console: a cache's long path was wrapped onto a line
    of its own (another candidate to the shell) and `[x]` in it was eaten as markup."""
    from conftest import run_kcache

    home = tmp_path / ("h" * 60) / "[x]"
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    monkeypatch.setenv("HOME", str(home))
    run = run_kcache(env={"_KCACHE_COMPLETE": f"complete_{shell}", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                          "_TYPER_COMPLETE_ARGS": "kcache clear --cache hi"})
    assert run.exit_code == 0, run.stderr
    lines = [ln for ln in run.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and "hidet" in lines[0], lines
    assert str(home / ".cache" / "hidet") in lines[0], lines


@pytest.mark.parametrize("args, shell", [(("--show-completion", "zsh"), "zsh"), (("--show-completion=fish",), "fish"),
                                         (("--show-completion", "bash"), "bash")])
def test_show_completion_prints_the_shell_named(args, shell):
    """`kcache --show-completion zsh` printed bash's script (the shell detected, the word ignored), exit 0:
    a zsh user pasting it got a bash function. The shell named is the one printed, the shipped script."""
    run = subprocess.run([sys.executable, "-m", "kcache_cli", *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip("\n") == (SCRIPTS / f"kcache.{shell}").read_text().rstrip("\n")


def test_show_completion_of_a_shell_typer_has_no_script_for_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "kcache_cli", "--show-completion", "tcsh"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "'tcsh' is not one of" in run.stderr and not run.stdout


@pytest.mark.parametrize("option", ["--install-completion", "--show-completion"])
def test_completion_from_a_shell_without_a_script_says_to_name_one(tmp_path, option):
    """Run from sh, `kcache --install-completion` printed Typer's "Shell sh is not supported." on stdout, exit
    1, and --show-completion "Shell sh not supported.": no `Error:`, nothing said of what to do. Now one
    `Error:` line on stderr naming the shell and how to name one, exit 2, nothing written; so for no shell
    detected at all."""
    from kcache_cli.cli import typer_compat
    from kcache_cli.util.errors import UsageError

    home = tmp_path / "empty-home"
    home.mkdir()
    line = f"{shlex.quote(sys.executable)} -m kcache_cli {option}; exit $?"  # sh stays the parent
    run = subprocess.run(["sh", "-c", line], env=dict(os.environ, HOME=str(home)), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and run.stdout == "" and list(home.iterdir()) == [], run
    assert run.stderr == f"Error: kcache has no completion for sh: name yours: kcache {option} bash (or zsh, fish)\n"
    with pytest.raises(UsageError, match=f"^kcache could not tell which shell runs it: name yours: kcache {option} "):
        typer_compat._with_script(None, option)
