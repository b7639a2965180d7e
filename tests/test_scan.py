"""The core scan on the real hidet, tilus and tilelang caches, intact and damaged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from kcache_cli.catalog.scan import resolve_entry, scan_cache
from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs.locking import entry_lock
from kcache_cli.util import parallel
from kcache_cli.layouts import LAYOUTS
from kcache_cli.model.records import JSON_KEYS, ScanFilter, iso
from kcache_cli.ops.delete import plan_prune
from kcache_cli.util.errors import UsageError

HIDET = {
    ("cpu_space_0", "fused", "af3046266c6abdd1"),
    ("cpu_space_0", "matmul", "064b4a6c035246e8"),
    ("cpu_space_0", "relu", "31857fe085635b31"),
    ("cuda_space_0", "add", "8d1f7691cdf75e90"),
    ("cuda_space_0", "softmax", "ad252b064b266eea"),
}
SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"
TILELANG_KERNEL = "0.1.15/linux-x86_64/kernels/cb68ca6910905a22415eeff34244c6b161f51a79389abd03689b1d0f2155a46e"
TILELANG_BINARY = "0.1.15/cuda-binaries/4bc9129df33af894bfd1791f214310dc6766749861079ac4b7eafa97e565e687"


def by_rel(result):
    return {e.relpath: e for e in result.entries}


def test_hidet_fixture_entries(fixture_copy):
    root = fixture_copy("hidet")
    res = scan_cache(root)
    assert res.layouts == ("hidet",)
    assert {(e.space, e.op, e.hash) for e in res.entries} == HIDET
    for e in res.entries:
        assert e.status == "complete" and e.reason is None, e
        assert e.kind == "op" and e.layout == "hidet"
        assert e.target == e.space.split("_")[0]
        assert e.path == str(root / e.relpath)
        assert e.files >= 12 and e.size > 20_000
        doc = e.to_json()
        assert list(doc) == list(JSON_KEYS)  # in the schema's order
        assert (doc["file_count"], doc["size"], doc["path"], doc["reason"]) == (e.files, e.size, e.path, None)
        assert doc["modified"] == iso(e.modified) and doc["last_used"] == iso(e.last_used)


def test_entry_size_counts_every_file(fixture_copy):
    root = fixture_copy("hidet")
    e = by_rel(scan_cache(root))[SOFTMAX]
    on_disk = [os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(root / SOFTMAX) for f in fs]
    assert e.apparent_size == sum(on_disk) and e.files == len(on_disk)
    # size is disk usage, as du counts it (issue 32): every file's and directory's blocks
    du = subprocess.run(["du", "-sB1", str(root / SOFTMAX)], capture_output=True, text=True, check=True)
    assert e.size == int(du.stdout.split()[0]) > e.apparent_size


@pytest.mark.parametrize("installed", [True, False])
def test_op_filter_reads_only_that_op(fixture_copy, monkeypatch, installed):
    """Installed hidet or not, each entry is judged against it alone (issue 22): nothing of another op
    is listed or opened."""
    from kcache_cli.layouts import hidet

    root = fixture_copy("hidet")
    (root / "ops/cpu_space_0/relu/31857fe085635b31/version.txt").write_text("0.7.0")  # changes nothing
    monkeypatch.setattr(hidet, "installed_version", lambda: "0.6.1" if installed else "")
    seen = []
    real_scandir = os.scandir

    real_open = os.open

    def spy(path="."):
        if not isinstance(path, int):
            seen.append(os.fspath(path))
        return real_scandir(path)

    def spy_open(path, *args, **kwargs):
        if not isinstance(path, int) and kwargs.get("dir_fd") is None:
            seen.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", spy)
    monkeypatch.setattr(os, "open", spy_open)
    res = scan_cache(root, ScanFilter(ops=("matmul",)))
    assert [(e.op, e.hash) for e in res.entries] == [("matmul", "064b4a6c035246e8")]
    ops = str(root / "ops")
    for p in seen:
        if p.startswith(ops + "/"):
            rel = p[len(ops) + 1:].split("/")
            assert len(rel) == 1 or rel[1] == "matmul", f"ls --op matmul read {p}"


def test_space_and_target_filters(fixture_copy):
    root = fixture_copy("hidet")
    cuda = scan_cache(root, ScanFilter(spaces=("cuda_space_0",)))
    assert {e.op for e in cuda.entries} == {"add", "softmax"}
    cpu = scan_cache(root, ScanFilter(targets=("cpu",)))
    assert {e.op for e in cpu.entries} == {"fused", "matmul", "relu"}
    assert scan_cache(root, ScanFilter(spaces=("cuda_space_2",))).entries == ()
    assert [e.hash for e in scan_cache(root, ScanFilter(hash_prefixes=("8d1f",))).entries] == ["8d1f7691cdf75e90"]


def test_tilus_fixture_entries(fixture_copy):
    root = fixture_copy("tilus")
    res = scan_cache(root)
    assert res.layouts == ("tilus",)
    got = {(e.kind, e.op, e.hash, e.status) for e in res.entries}
    assert got == {("program", "add_one", "f006237ca7a5", "complete"),
                   ("script", "add_one", "1-845a0ed6", "complete")}
    assert os.path.islink(root / "scripts/add_one/1-845a0ed6/programs/0")


def test_tilus_flattened_links_as_shared(fixture_copy):
    """The samples as shared hold each link as a small file with the link text: still links to kcache."""
    root = fixture_copy("tilus", shared=True)
    link = root / "scripts/add_one/1-845a0ed6/programs/0"
    if link.is_symlink():
        pytest.skip("shared fixture keeps real symlinks")
    statuses = {e.kind: e.status for e in scan_cache(root).entries}
    assert statuses == {"program": "complete", "script": "complete"}
    shutil.rmtree(root / "programs/f006237ca7a5")
    script = [e for e in scan_cache(root).entries if e.kind == "script"][0]
    assert script.status == "partial"  # tilus never reads the link: it compiles the program again
    assert script.reason == "its program f006237ca7a5 is gone (programs/0): tilus compiles it again"


def test_tilus_op_filter_follows_script_links(fixture_copy):
    root = fixture_copy("tilus")
    got = {(e.kind, e.hash) for e in scan_cache(root, ScanFilter(ops=("add_one",))).entries}
    assert got == {("script", "1-845a0ed6"), ("program", "f006237ca7a5")}
    assert scan_cache(root, ScanFilter(ops=("matmul",))).entries == ()


def test_tilelang_fixture_entries(fixture_copy):
    root = fixture_copy("tilelang")
    res = by_rel(scan_cache(root))
    assert set(res) == {TILELANG_KERNEL, TILELANG_BINARY}
    assert res[TILELANG_KERNEL].kind == "kernel" and res[TILELANG_KERNEL].space == "0.1.15/linux-x86_64"
    assert res[TILELANG_BINARY].kind == "binary" and res[TILELANG_BINARY].space == "0.1.15/cuda-binaries"
    assert all(e.status == "complete" for e in res.values())


# ---- damage ----------------------------------------------------------------------------------------

def test_truncated_lib_so_is_corrupt(fixture_copy):
    root = fixture_copy("hidet")
    lib = root / SOFTMAX / "lib.so"
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 2])
    e = by_rel(scan_cache(root))[SOFTMAX]
    assert e.status == "corrupt" and "truncated" in e.reason


def test_empty_lib_so_is_partial_a_one_byte_one_corrupt(fixture_copy):
    """hidet's verify_disk_cache takes an empty lib.so for none and compiles again; a one-byte lib.so
    passes it, and hidet fails loading it on every call."""
    root = fixture_copy("hidet")
    (root / SOFTMAX / "lib.so").write_bytes(b"")
    e = by_rel(scan_cache(root))[SOFTMAX]
    assert e.status == "partial" and "lib.so is empty" in e.reason
    (root / SOFTMAX / "lib.so").write_bytes(b"\x7f")
    e = by_rel(scan_cache(root))[SOFTMAX]
    assert e.status == "corrupt" and "lib.so is truncated" in e.reason
    (root / SOFTMAX / "func_types.pickle").unlink()
    assert by_rel(scan_cache(root))[SOFTMAX].status == "partial"  # the compile never finished


def test_missing_func_types_is_partial(fixture_copy):
    root = fixture_copy("hidet")
    (root / MATMUL / "func_types.pickle").unlink()
    e = by_rel(scan_cache(root))[MATMUL]
    assert e.status == "partial" and "func_types.pickle" in e.reason
    others = [x for x in scan_cache(root).entries if x.relpath != MATMUL]
    assert all(x.status == "complete" for x in others)


def test_compiler_output_without_binary_is_partial(fixture_copy):
    """lib.so deleted after a good compile: hidet compiles the entry again (issue 22), nothing is lost."""
    root = fixture_copy("hidet")
    (root / MATMUL / "lib.so").unlink()
    e = by_rel(scan_cache(root))[MATMUL]
    assert e.status == "partial" and "compiles it again" in e.reason


def test_tilelang_manifest_mismatch_is_partial(fixture_copy):
    """tilelang removes an entry whose sizes disagree with its manifest and compiles it again."""
    root = fixture_copy("tilelang")
    with open(root / TILELANG_KERNEL / "host_kernel.cu", "ab") as f:
        f.write(b"// edited\n")
    e = by_rel(scan_cache(root))[TILELANG_KERNEL]
    assert e.status == "partial" and "host_kernel.cu" in e.reason and "manifest.json" in e.reason


def test_tilelang_cubin_size_disagrees_with_metadata(fixture_copy):
    root = fixture_copy("tilelang")
    with open(root / TILELANG_BINARY / "kernel.cubin", "ab") as f:
        f.write(b"\0")
    e = by_rel(scan_cache(root))[TILELANG_BINARY]
    assert e.status == "corrupt" and "metadata.json" in e.reason


def test_tilelang_same_size_source_edit_is_a_hit(fixture_copy):
    """tilelang checks sources by size only (its sha256 only for the executable and params.json)."""
    root = fixture_copy("tilelang")
    p = root / TILELANG_KERNEL / "device_kernel.cu"
    data = bytearray(p.read_bytes())
    data[-2] ^= 0x20
    p.write_bytes(bytes(data))
    e = by_rel(scan_cache(root))[TILELANG_KERNEL]
    assert e.status == "complete"
    d = LAYOUTS["tilelang"].describe(root, e)
    assert d.status == "complete" and not d.problems


def test_tilus_script_whose_program_is_gone_is_partial(fixture_copy):
    """tilus recomputes a script's programs and compiles a missing one again (issue 22)."""
    root = fixture_copy("tilus")
    shutil.rmtree(root / "programs/f006237ca7a5")
    (script,) = scan_cache(root).entries
    assert script.kind == "script" and script.status == "partial"
    assert script.reason == "its program f006237ca7a5 is gone (programs/0): tilus compiles it again"


def test_a_dangling_link_tilus_never_reads_is_ignored(fixture_copy):
    root = fixture_copy("tilus")
    link = root / "scripts/add_one/1-845a0ed6/programs/0"
    link.unlink()
    link.symlink_to("nowhere")
    (program, script) = sorted(scan_cache(root).entries, key=lambda e: e.kind)
    assert script.kind == "script" and script.status == "complete" == program.status


def test_unreadable_directory_is_warning_not_exception(fixture_copy, monkeypatch):
    root = fixture_copy("hidet")
    target = str(root / SOFTMAX)
    real_open, real_scandir = os.open, os.scandir

    def deny(path, *args, **kwargs):
        if not isinstance(path, int) and os.fspath(path) == target:
            raise PermissionError(13, "Permission denied", target)
        return (real_scandir if not args and not kwargs else real_open)(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    monkeypatch.setattr(os, "scandir", lambda path=".": deny(path))
    real_open_dir = fsread.Anchor.open_dir  # the entry's EntryDir (openat2 from the root) is denied alike

    def deny_dir(self, path):
        if os.fspath(path).rstrip("/") == target:
            raise PermissionError(13, "Permission denied", target)
        return real_open_dir(self, path)

    monkeypatch.setattr(fsread.Anchor, "open_dir", deny_dir)
    warnings = []
    res = scan_cache(root, warn=warnings.append)
    e = by_rel(res)[SOFTMAX]
    assert e.status == "unreadable" and "unreadable" in e.reason
    assert any(target in w and "Permission denied" in w for w in warnings)
    assert len(res.entries) == 5



def test_an_op_directory_that_cannot_be_listed_is_one_unreadable_entry(fixture_copy, monkeypatch):
    """The op directory's entries are not counted one by one: one `unreadable` entry stands for them,
    whether its listing would come from disk or from the listing a scan kept (fs/dirnames.py)."""
    root = fixture_copy("hidet")
    op_dir = str(root / os.path.dirname(SOFTMAX))
    whole = {e.relpath for e in scan_cache(root).entries}
    real = fsread.open_path

    def deny(path, *args, **kwargs):
        if os.fspath(path).rstrip("/") == op_dir:
            raise PermissionError(13, "Permission denied", op_dir)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fsread, "open_path", deny)
    warnings: list[str] = []
    res = scan_cache(root, warn=warnings.append)
    got = by_rel(res)
    stand_in = got[os.path.dirname(SOFTMAX)]
    assert stand_in.status == "unreadable" and stand_in.hash == "" and "not counted one by one" in stand_in.reason
    assert SOFTMAX not in got and set(got) == whole - {SOFTMAX} | {os.path.dirname(SOFTMAX)}
    assert any(op_dir in w and "Permission denied" in w for w in warnings)

def _nobody_can_run() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.mark.skipif(not _nobody_can_run(), reason="needs root and setpriv to test mode 000 as another user")
def test_mode_000_directory_as_unprivileged_user(tmp_path):
    """Root reads mode 000 directories anyway: run kcache as `nobody` to see what a user sees."""
    import tempfile

    from conftest import FIXTURES, copy_tree

    shared_tmp = tempfile.mkdtemp(prefix="kcache-nobody-", dir="/tmp")  # pytest's tmp_path is 0700
    os.chmod(shared_tmp, 0o755)
    root = copy_tree(FIXTURES / "hidet", __import__("pathlib").Path(shared_tmp) / "cache")
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    os.chmod(root / SOFTMAX, 0)
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        from kcache_cli.cli.app import main
        main(["--cache-dir", {str(root)!r}, "ls", "--json"])
    """)
    proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c",
                           code], capture_output=True, text=True, env={**os.environ, "HOME": shared_tmp},
                          cwd=shared_tmp)
    if proc.returncode != 0 and not proc.stderr.startswith(("Error:", "warning:")):
        # Python or the package is not readable by `nobody` here (e.g. a venv under /root).
        pytest.skip(f"nobody cannot run kcache from here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    import json

    rows = {r["hash"]: r for r in json.loads(proc.stdout)["entries"]}
    assert rows["ad252b064b266eea"]["status"] == "unreadable"
    assert "unreadable" in rows["ad252b064b266eea"]["reason"]
    assert rows["8d1f7691cdf75e90"]["status"] == "complete"
    assert "cannot read" in proc.stderr
    os.chmod(root / SOFTMAX, 0o755)
    shutil.rmtree(shared_tmp)


def test_kcache_temp_dir_is_partial_or_building(fixture_copy):
    root = fixture_copy("hidet")
    tmp = root / "ops/cuda_space_0/add" / f"{state.TEMP_PREFIX}0123456789abcdef-a1b2"
    tmp.mkdir()
    (tmp / "source.cu").write_text("// half written")
    e = by_rel(scan_cache(root))[os.path.relpath(tmp, root)]
    assert e.status == "partial" and "interrupted kcache build" in e.reason
    assert e.op == "add" and e.space == "cuda_space_0"
    with entry_lock(root, "ops/cuda_space_0/add/0123456789abcdef"):
        assert by_rel(scan_cache(root))[os.path.relpath(tmp, root)].status == "building"
    # a name kcache never gives one (build's random part is hex) is no temp of its: ls says what prune does
    odd = root / "ops/cuda_space_0/add" / f"{state.TEMP_PREFIX}0123456789abcdef-x"
    odd.mkdir()
    e = by_rel(scan_cache(root))[os.path.relpath(odd, root)]
    assert e.status == "partial" and e.reason == "hidden directory (not a hidet entry)", e.reason
    kept = {s.entry.relpath: s.why for s in plan_prune(root, broken=True).skipped}
    assert "not shaped like a hidet op entry" in kept[os.path.relpath(odd, root)]


def test_hidet_lock_held_marks_partial_entry_building(fixture_copy):
    root = fixture_copy("hidet")
    (root / MATMUL / "func_types.pickle").unlink()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        f = open({str(root / MATMUL / '.lock')!r}, 'r+')
        fcntl.flock(f, fcntl.LOCK_EX)
        print('locked', flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert by_rel(scan_cache(root))[MATMUL].status == "building"
    finally:
        holder.kill()
        holder.wait()
    assert by_rel(scan_cache(root))[MATMUL].status == "partial"


def test_seed_layout_entries(tmp_path):
    """The layout of the seed documentation, which `kcache build` writes: nvcc_log.txt, no hidet markers."""
    root = tmp_path / "seed"
    good = root / "ops/cuda_space_2/batch_matmul/2e4ce0f773c8d25c"
    bad = root / "ops/cuda_space_2/batch_matmul/3b8442fa440916f7"
    for d in (good, bad):
        d.mkdir(parents=True)
        (d / "source.cu").write_text("__global__ void k() {}\n")
        (d / "nvcc_log.txt").write_text("nvcc -shared ...\n")
    shutil.copy(os.path.join(os.path.dirname(__file__), "fixtures/real/hidet", SOFTMAX, "lib.so"), good / "lib.so")
    (good / "summary.txt").write_text("summary")
    res = by_rel(scan_cache(root))
    assert res[os.path.relpath(good, root)].status == "complete"
    assert res[os.path.relpath(bad, root)].status == "failed"
    assert res[os.path.relpath(good, root)].space == "cuda_space_2"


def test_graphs_and_ir_modules_are_their_own_kinds(fixture_copy):
    root = fixture_copy("hidet")
    (root / "graphs/0f0f0f0f/kernels/0").mkdir(parents=True)
    (root / "graphs/0f0f0f0f/kernels/0/lib.so").write_bytes(b"x" * 100)
    (root / "ir_modules/abcd").mkdir(parents=True)
    (root / "ir_modules/abcd/module.txt").write_text("ir")
    res = scan_cache(root)
    kinds = {e.hash: e.kind for e in res.entries}
    assert kinds["0f0f0f0f"] == "graph" and kinds["abcd"] == "ir_module"
    assert sum(1 for e in res.entries if e.kind == "op") == 5
    assert by_rel(res)["graphs/0f0f0f0f"].apparent_size == 100
    assert all(e.kind == "op" for e in scan_cache(root, ScanFilter(ops=("add",))).entries)


def test_missing_root_is_empty(tmp_path):
    res = scan_cache(tmp_path / "nope")
    assert res.exists is False and res.entries == ()


def test_stray_files_and_unknown_dirs_are_ignored(fixture_copy):
    root = fixture_copy("hidet")
    (root / "ops/README").write_text("x")
    (root / "ops/not-a-space").mkdir()
    (root / "ops/cuda_space_0/add/stray.txt").write_text("x")
    assert {(e.space, e.op, e.hash) for e in scan_cache(root).entries} == HIDET


# ---- resolving and deep checks ---------------------------------------------------------------------

def test_resolve_unique_ambiguous_unknown(fixture_copy):
    root = fixture_copy("hidet")
    assert resolve_entry(root, "ad25").relpath == SOFTMAX
    assert resolve_entry(root, SOFTMAX).relpath == SOFTMAX
    # The same task in two spaces shares a hash: the prefix is ambiguous, the path is not.
    shutil.copytree(root / SOFTMAX, root / "ops/cuda_space_2/softmax/ad252b064b266eea")
    with pytest.raises(UsageError) as exc:
        resolve_entry(root, "ad25")
    msg = str(exc.value)
    assert "ambiguous" in msg and "cuda_space_0" in msg and "cuda_space_2" in msg and "\n" not in msg
    with pytest.raises(UsageError, match="no entry matches 'ffff'"):
        resolve_entry(root, "ffff")


def test_edited_task_changes_nothing(fixture_copy):
    """hidet hashes the task in memory and never reads task.txt on load (issue 22)."""
    root = fixture_copy("hidet")
    task = root / MATMUL / "task.txt"
    task.write_bytes(task.read_bytes().replace(b"[4, 8]", b"[4, 9]"))
    e = resolve_entry(root, "064b")
    assert e.status == "complete"
    assert LAYOUTS["hidet"].describe(root, e).status == "complete"


def test_describe_hidet_task_summary(fixture_copy):
    root = fixture_copy("hidet")
    d = LAYOUTS["hidet"].describe(root, resolve_entry(root, "064b"))
    assert d.problems == () and d.status == "complete"
    assert d.task_op == "matmul"
    assert [(t.name, t.dtype, tuple(t.shape)) for t in d.inputs][0] == ("a", "float32", (4, 8))
    assert d.compile_command.startswith("/usr/bin/g++") and "-shared" in d.compile_command
    assert "elapsed time" in d.compiler_output


def test_describe_tilus_program_hash_and_users(fixture_copy):
    root = fixture_copy("tilus")
    d = LAYOUTS["tilus"].describe(root, resolve_entry(root, "f006"))
    assert d.problems == ()
    facts = dict(d.facts)
    assert facts["used by scripts"] == "scripts/add_one/1-845a0ed6"
    assert facts["options arch"] == "sm90a"
    (root / "programs/f006237ca7a5/program.txt").write_text("def edited(): pass\n")
    d = LAYOUTS["tilus"].describe(root, resolve_entry(root, "f006"))
    assert d.status == "corrupt" and "tilus fails on every call" in d.reason


def test_parallel_scan_matches_serial(fixture_copy, monkeypatch):
    """Big caches are read by forked workers; the result must be the same, in the same order."""
    import kcache_cli.catalog.scan_context as scan_mod

    root = fixture_copy("hidet")
    for i in range(40):
        shutil.copytree(root / SOFTMAX, root / f"ops/cuda_space_1/softmax/{i:016x}")
    (root / "ops/cuda_space_1/softmax/0000000000000007/func_types.pickle").unlink()
    serial = scan_cache(root)
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 2)
    warnings = []
    parallel = scan_cache(root, warn=warnings.append)
    assert parallel.entries == serial.entries and len(parallel.entries) == 45
    (root / "ops/cuda_space_1/softmax/0000000000000009/meta.json").write_text("{")
    parallel = scan_cache(root, warn=warnings.append)
    monkeypatch.setattr(scan_mod, "PARALLEL_MIN_JOBS", 10**9)
    assert parallel.entries == scan_cache(root).entries
    assert {e.status for e in parallel.entries} == {"complete", "partial", "corrupt"}


def test_ls_reads_contents_only_of_entries_changed_after_completion(fixture_copy, monkeypatch):
    """A cold cache costs one disk read per entry whose contents ls opens: entries untouched since
    their completion marker (func_types.pickle, a manifest) are judged by metadata alone."""
    import kcache_cli.layouts.hidet as hidet_mod

    root = fixture_copy("hidet")
    for e in scan_cache(root).entries:  # as hidet writes them: func_types.pickle last (dispatch tables at run time)
        for f in os.listdir(e.path):
            if not f.startswith(("func_types.pickle", "dispatch_table")):
                os.utime(os.path.join(e.path, f), (1_000_000, 1_000_000))
        os.utime(os.path.join(e.path, "func_types.pickle"), (1_000_001, 1_000_001))  # moments after
    opened = []
    real = hidet_mod._read
    monkeypatch.setattr(hidet_mod, "_read", lambda p, seen, n: opened.append(p.join(seen.name))
                        or real(p, seen, n))
    assert all(e.status == "complete" for e in scan_cache(root).entries)
    # only the dispatch tables hidet wrote when the ops ran (after the entry was finished) are read
    assert {os.path.basename(p) for p in opened} <= {"dispatch_table.txt"}
    opened.clear()
    lib = root / SOFTMAX / "lib.so"
    data = lib.read_bytes()
    lib.write_bytes(data[:4096])  # truncated now: newer than its marker
    e = by_rel(scan_cache(root))[SOFTMAX]
    assert e.status == "corrupt" and "truncated" in e.reason
    assert [p for p in opened if not p.endswith("dispatch_table.txt")] == [str(root / SOFTMAX / "lib.so")]
    # Same timestamp as the marker (a coarse clock, a copy and a truncate in one tick): still read.
    os.utime(lib, (1_000_001, 1_000_001))
    assert by_rel(scan_cache(root))[SOFTMAX].status == "corrupt"


def test_prefix_prefers_the_entry_over_its_temp_dir(fixture_copy):
    root = fixture_copy("hidet")
    tmp = root / "ops/cuda_space_0/softmax" / f"{state.TEMP_PREFIX}ad252b064b266eea-0a1b2c3d"
    tmp.mkdir()
    assert resolve_entry(root, "ad25").relpath == SOFTMAX
    assert resolve_entry(root, "ad252b064b266eea-0a1b").relpath == os.path.relpath(tmp, root)


class _VirtualClock:
    """Time that passes only when a job says it waited: the thread heuristic judged without wall clocks."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


_CLOCK = _VirtualClock()


def _thread_job(ctx, job):
    import threading

    _CLOCK.now += job[1]  # a read that waited job[1] seconds on the disk
    if job[0] == "boom":
        raise OSError(5, "Input/output error")
    return job[0], threading.get_ident()


@pytest.mark.parametrize("delay, threaded", [(0.0, False), (0.001, True)])
def test_a_worker_starts_threads_only_when_reads_wait(tmp_path, delay, threaded, monkeypatch):
    from kcache_cli.catalog import scan_context as scan

    monkeypatch.setattr(scan, "clock", _CLOCK)
    jobs = [(i, delay) for i in range(scan.PROBE * 6)]
    claims = parallel.Claims(len(jobs), scan.PROBE * 2)
    try:
        starts, out, warned = scan._scan_part((tmp_path, {}, _thread_job, jobs), claims.share(0, 1))
    finally:
        claims.close()
    assert starts == [0, scan.PROBE * 2, scan.PROBE * 4]
    assert [o[0] for o in out] == list(range(len(jobs))) and warned == []  # every job once, in order
    threads = {o[1] for o in out}
    assert (len(threads) > 1) is threaded


def test_a_failure_in_a_worker_thread_is_raised(tmp_path, monkeypatch):
    from kcache_cli.catalog import scan_context as scan

    monkeypatch.setattr(scan, "clock", _CLOCK)
    jobs = [(i, 0.001) for i in range(scan.PROBE * 4)] + [("boom", 0.0)] + [(i, 0.0) for i in range(100)]
    claims = parallel.Claims(len(jobs), 256)
    with pytest.raises(OSError, match="Input/output"):
        scan._scan_part((tmp_path, {}, _thread_job, jobs), claims.share(0, 1))
    claims.close()


def test_seed_layout_task_txt_is_never_read_for_a_status(tmp_path, monkeypatch, kcache):
    """The seed layout: hidet never reads task.txt on load, so neither ls nor inspect judges by it
    (issue 22); inspect shows the task as a fact."""
    from kcache_cli.formats.taskfile import task_hash

    task = b"Task(\n  name: add\n  parameters: \n)\n"
    d = tmp_path / "c" / "ops" / "cuda_space_0" / "add" / task_hash(task)
    d.mkdir(parents=True)
    (d / "task.txt").write_bytes(task)
    (d / "lib.so").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57)  # no section table: looks whole
    (d / "nvcc_log.txt").write_text("nvcc -shared source.cu -o lib.so\n")
    os.utime(d / "task.txt", (1_700_000_000, 1_700_000_000))
    read: list[str] = []
    real = fsread.read_bytes
    monkeypatch.setattr(fsread, "read_bytes", lambda p, *a, **k: read.append(str(p)) or real(p, *a, **k))
    assert [e.status for e in scan_cache(tmp_path / "c").entries] == ["complete"]
    assert not any(p.endswith("task.txt") for p in read)
    (d / "task.txt").write_bytes(task.replace(b"add", b"sub"))  # edited after the build
    assert [e.status for e in scan_cache(tmp_path / "c").entries] == ["complete"]
    assert not any(p.endswith("task.txt") for p in read)
    r = kcache("--cache-dir", tmp_path / "c", "inspect", d.name[:8], "--json")
    assert r.json()["status"] == "complete" and "task_txt_note" in r.json()["facts"]


def test_leftover_names_are_filtered_by_the_patterns_fixed_start():
    """leftover_entries looks only at names starting with what its patterns begin with."""
    from kcache_cli.fs import state

    assert state.EXPORT_TEMP.pattern.startswith(r"^\.") and state.IMPORT_STAGING.pattern.startswith("^import-")
    assert state.EXPORT_TEMP.match(".a.tar.gz.1a2b.kcache-tmp") and state.IMPORT_STAGING.match("import-12-ab")


def test_an_export_temp_file_made_after_the_roots_listing_was_kept_is_found(tmp_path):
    """The root's dot names come from the listing the scan kept (fs/dirnames.py): a temp file an export
    left there since, in a root whose listing had been kept unchanged, is still seen (and one removed is
    no longer)."""
    import time

    from kcache_cli.catalog.scan import leftover_entries
    from kcache_cli.fs import dirnames

    root = tmp_path / "c"
    root.mkdir()
    for i in range(300):
        (root / f"{i:064x}").mkdir()
    old = time.time() - 60
    os.utime(root, (old, old))
    kept = dirnames.of(root)
    assert kept.starting(str(root), ".") == []
    kept.save()
    temp = root / ".x.tar.zst.1a2b.kcache-tmp"
    temp.write_bytes(b"partial")
    assert [e.hash for e in leftover_entries(root, print)] == [temp.name]
    temp.unlink()
    assert leftover_entries(root, print) == []


def test_subdirs_by_a_dot_prefix_come_from_the_kept_listing_and_stay_exact(tmp_path):
    """ScanContext.subdirs with a prefix starting with a dot answers as with any other prefix: from the
    listing kept while the directory is unchanged (hidden names are kept too), real directories only."""
    import time

    from kcache_cli.catalog.scan_context import ScanContext
    from kcache_cli.fs import dirnames

    root = tmp_path / "c"
    (root / ".hidden").mkdir(parents=True)
    (root / ".hfile").write_text("x")
    (root / ".hlink").symlink_to(root / ".hidden")
    for i in range(300):
        (root / f"{i:064x}").mkdir()
    old = time.time() - 60
    os.utime(root, (old, old))
    ctx = ScanContext(root, print, {})
    assert ctx.subdirs(root, (".h",)) == [".hidden"]
    dirnames.of(root).save()
    (root / ".hnew").mkdir()  # the directory changed since: listed again
    assert ctx.subdirs(root, (".h",)) == [".hidden", ".hnew"]
    assert ctx.subdirs(root, (".x",)) == []
