"""One judgement per entry (issues 10 and 22): copies of the real caches, damaged in each way a real
compiler cares about (and the mirror image of each damage), must get the status the compiler's own loader
gives them, and `ls`, `verify`, `inspect --json`, `prune --broken --dry-run` and `import` must agree. The
statuses here are the ones the loader oracle measured with the real packages (tests/test_oracle_hidet.py,
tests/test_oracle_tilus.py); these cases run without them, where kcache finds no hidet installed."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import FIXTURES, copy_tree, run_kcache

BROKEN = ("partial", "failed", "corrupt")  # what prune --broken removes: never stale, never unreadable
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"
RELU = "ops/cpu_space_0/relu/31857fe085635b31"
FUSED = "ops/cpu_space_0/fused/af3046266c6abdd1"
SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
GRAPH = "graphs/0123456789abcdef"
IR_MODULE = "ir_modules/fedcba9876543210"
PROGRAM = "programs/f006237ca7a5"
SCRIPT = "scripts/add_one/1-845a0ed6"
FAILED_PROGRAM = "programs/0badc0de0bad"
KERNEL = "0.1.15/linux-x86_64/kernels/cb68ca6910905a22415eeff34244c6b161f51a79389abd03689b1d0f2155a46e"
MARKERS = ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle")


def add_graph_and_ir_module(root: Path) -> None:
    """A compiled graph and an IR module as hidet 0.6.1 lays them out (graphs/<hash>/{meta.json,
    graph_module/, kernels/<i>/, graph_string.txt}; ir_modules/<hash>/), made of real cpu builds."""
    graph = root / GRAPH
    shutil.copytree(root / MATMUL, graph / "graph_module")
    for name in ("task.txt", "task.pickle", "candidates.txt", "candidates.json", "dispatch_table.txt"):
        (graph / "graph_module" / name).unlink(missing_ok=True)
    shutil.copytree(root / RELU, graph / "kernels/0")
    shutil.copytree(root / FUSED, graph / "kernels/1")
    meta = {"inputs": [{"device": "cpu", "dtype": "float32", "shape": [4, 8]}],
            "outputs": [{"device": "cpu", "dtype": "float32", "shape": [4, "n"]}],
            "hidet_version": "0.6.1", "num_kernels": 2, "graph_hash": GRAPH.split("/")[1]}
    (graph / "meta.json").write_text(json.dumps(meta))
    (graph / "graph_execution.json").write_text("{}")
    (graph / "graph_string.txt").write_text("Graph(x){...}")
    shutil.copytree(graph / "graph_module", root / IR_MODULE)
    (root / IR_MODULE / "meta.json").unlink()


def hidet_root(base: Path) -> Path:
    root = copy_tree(FIXTURES / "hidet", base)
    add_graph_and_ir_module(root)
    return root


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


def truncate_old(root: Path, rel: str) -> None:
    """lib.so cut in half, then its mtime put back before func_types.pickle: only every byte tells."""
    lib = root / rel / "lib.so"
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    age(lib, 10 * 86400)


def rebuilt_by_hidet(root: Path, rel: str) -> None:
    """kcache built it (kcache.json), hidet rebuilt it in place: sizes differ from kcache.json."""
    files = {n: {"size": 1, "sha256": "0" * 64} for n in ("lib.so", "source.cc")}
    (root / rel / "kcache.json").write_text(json.dumps({"files": files}))


def kcache_built_damaged(root: Path, rel: str) -> None:
    """An entry only kcache built, whose files changed after kcache.json recorded them."""
    rebuilt_by_hidet(root, rel)
    for m in MARKERS:
        (root / rel / m).unlink(missing_ok=True)
    age(root / rel / "kcache.json", 86400)
    for name in ("lib.so", "source.cc"):  # changed since: newer than kcache.json whenever the clone was made
        os.utime(root / rel / name)


def set_version(root: Path, rel: str, version: str) -> None:
    (root / rel / "version.txt").write_text(version)


def all_versions(root: Path, version: str) -> None:
    for f in root.glob("ops/*/*/*/version.txt"):
        f.write_text(version)
    for f in root.glob("graphs/*/kernels/*/version.txt"):
        f.write_text(version)
    for f in root.glob("*/*/version.txt"):
        f.write_text(version)
    meta = root / GRAPH / "meta.json"
    meta.write_text(meta.read_text().replace('"0.6.1"', f'"{version}"'))


def edit_task(root: Path, rel: str) -> None:
    task = root / rel / "task.txt"
    task.write_bytes(task.read_bytes().replace(b"[4, 8]", b"[4, 9]"))


def tilus_failure(root: Path, after_success: bool) -> None:
    """tilus records a failed build under the script's failed/building/<N>: <N>.txt holds the command
    and the compiler's error; the program it was building has no module/lib.so."""
    prog = root / FAILED_PROGRAM
    shutil.copytree(root / PROGRAM, prog)
    for n in ("lib.so", "nvcc_output.txt", "func_types.pickle"):
        (prog / "module" / n).unlink()
    record = root / SCRIPT / "failed/building"
    (record / "0").mkdir(parents=True)
    shutil.copy(prog / "module/source.cu", record / "0/source.cu")
    (record / "0.txt").write_text(
        f"/usr/local/bin/nvcc --shared {root}/{FAILED_PROGRAM}/module/source.cu"
        f" -o {root}/{FAILED_PROGRAM}/module/lib.so\n"
        f"{root}/{FAILED_PROGRAM}/module/source.cu(42): error: identifier \"tile_k\" is undefined\n"
        "1 error detected in the compilation of \"source.cu\".\n")
    links = [p for p in (root / SCRIPT).rglob("*") if p.is_symlink()] + [root / SCRIPT / "dispatch_table.txt"]
    for p in links:  # the script's last success: an hour after (or before) the failure
        age(p, -3600 if after_success else 3600)


def chmod_000(path: Path) -> None:
    os.chmod(path, 0)


@dataclass(frozen=True)
class Case:
    id: str
    layout: str
    rel: str  # the entry judged
    status: str  # what the compiler's loader implies
    damage: Callable[[Path], None]
    cheap: str | None = None  # ls's status where only reading every byte can tell (None: the same)
    reason: str = ""  # a word the reason must hold


CASES = [
    Case("pristine", "hidet", MATMUL, "complete", lambda r: None),
    # hidet rewrites version.txt and meta.json and reuses lib.so: a version is a note, never a status
    Case("other_hidet_version", "hidet", MATMUL, "complete", lambda r: set_version(r, MATMUL, "0.5.0")),
    Case("every_entry_older_version", "hidet", MATMUL, "complete", lambda r: all_versions(r, "0.5.0")),
    Case("newer_version_elsewhere", "hidet", MATMUL, "complete", lambda r: set_version(r, SOFTMAX, "0.7.0")),
    Case("no_version_txt", "hidet", MATMUL, "complete", lambda r: (r / MATMUL / "version.txt").unlink()),
    Case("truncated_lib_old_mtime", "hidet", SOFTMAX, "corrupt", lambda r: truncate_old(r, SOFTMAX),
         cheap="complete", reason="truncated"),
    Case("truncated_lib_new_mtime", "hidet", SOFTMAX, "corrupt", lambda r: (r / SOFTMAX / "lib.so").write_bytes(
        (r / SOFTMAX / "lib.so").read_bytes()[:4000]), reason="truncated"),
    Case("emptied_lib", "hidet", SOFTMAX, "partial", lambda r: (r / SOFTMAX / "lib.so").write_bytes(b""),
         reason="empty"),  # verify_disk_cache takes an empty lib.so for none: hidet compiles again
    Case("empty_lib_unfinished", "hidet", SOFTMAX, "partial", lambda r: (
        (r / SOFTMAX / "lib.so").write_bytes(b""), (r / SOFTMAX / "func_types.pickle").unlink()), reason="empty"),
    Case("lib_deleted_after_good_compile", "hidet", SOFTMAX, "partial", lambda r: (r / SOFTMAX / "lib.so").unlink(),
         reason="compiles it again"),
    Case("interrupted_before_compiler_output", "hidet", SOFTMAX, "partial", lambda r: (
        (r / SOFTMAX / "lib.so").unlink(), (r / SOFTMAX / "nvcc_output.txt").unlink(),
        (r / SOFTMAX / "func_types.pickle").unlink()), reason="interrupted"),
    Case("no_func_types", "hidet", MATMUL, "partial", lambda r: (r / MATMUL / "func_types.pickle").unlink(),
         reason="func_types.pickle"),
    Case("lib_mode_000", "hidet", MATMUL, "unreadable", lambda r: chmod_000(r / MATMUL / "lib.so"),
         reason="permission denied"),
    Case("edited_task", "hidet", MATMUL, "complete", lambda r: edit_task(r, MATMUL)),  # hidet never reads it
    Case("kcache_built_rebuilt_by_hidet", "hidet", MATMUL, "complete", lambda r: rebuilt_by_hidet(r, MATMUL)),
    Case("kcache_built_disagrees_with_kcache_json", "hidet", MATMUL, "corrupt",
         lambda r: kcache_built_damaged(r, MATMUL), reason="kcache.json"),
    Case("graph_pristine", "hidet", GRAPH, "complete", lambda r: None),
    Case("graph_module_lib_empty", "hidet", GRAPH, "corrupt",
         lambda r: (r / GRAPH / "graph_module/lib.so").write_bytes(b""), reason="graph_module/lib.so"),
    Case("graph_module_lib_missing", "hidet", GRAPH, "corrupt", lambda r: (r / GRAPH / "graph_module/lib.so").unlink(),
         reason="graph_module/lib.so"),
    # load_compiled_graph never compiles and checks no version: what it needs missing is corrupt
    Case("graph_kernel_without_func_types", "hidet", GRAPH, "corrupt",
         lambda r: (r / GRAPH / "kernels/1/func_types.pickle").unlink(), reason="kernels/1/func_types.pickle"),
    Case("graph_kernel_missing", "hidet", GRAPH, "corrupt", lambda r: shutil.rmtree(r / GRAPH / "kernels/1"),
         reason="kernels/1"),
    Case("graph_of_older_hidet", "hidet", GRAPH, "complete", lambda r: set_version(r, GRAPH + "/kernels/0", "0.5.0")),
    Case("graph_without_graph_execution", "hidet", GRAPH, "corrupt",
         lambda r: (r / GRAPH / "graph_execution.json").unlink(), reason="graph_execution.json"),
    Case("ir_module_pristine", "hidet", IR_MODULE, "complete", lambda r: None),
    Case("ir_module_lib_empty", "hidet", IR_MODULE, "partial", lambda r: (r / IR_MODULE / "lib.so").write_bytes(b""),
         reason="empty"),
    Case("tilus_pristine_script", "tilus", SCRIPT, "complete", lambda r: None),
    Case("tilus_last_build_failed", "tilus", SCRIPT, "failed", lambda r: tilus_failure(r, after_success=False),
         reason="tile_k"),
    Case("tilus_failure_then_success", "tilus", SCRIPT, "complete", lambda r: tilus_failure(r, after_success=True)),
    Case("tilus_failed_program", "tilus", FAILED_PROGRAM, "failed", lambda r: tilus_failure(r, after_success=True),
         reason="tile_k"),
    Case("tilus_program_lib_deleted", "tilus", PROGRAM, "partial", lambda r: (r / PROGRAM / "module/lib.so").unlink(),
         reason="compiles it again"),
    Case("tilus_program_lib_mode_000", "tilus", PROGRAM, "unreadable",
         lambda r: chmod_000(r / PROGRAM / "module/lib.so"), reason="permission denied"),
    Case("tilelang_pristine", "tilelang", KERNEL, "complete", lambda r: None),
    # tilelang checks params.json by sha256 and compiles the kernel again when it differs (the loader
    # oracle: tests/loaders/test_oracle_tilelang.py); ls reads it because it changed after the manifest
    Case("tilelang_same_size_other_bytes", "tilelang", KERNEL, "partial",
         lambda r: (r / KERNEL / "params.json").write_bytes(
             (r / KERNEL / "params.json").read_bytes().replace(b"a", b"b", 1)),
         reason="sha256"),
    Case("tilelang_binary_mode_000", "tilelang", KERNEL, "unreadable",
         lambda r: chmod_000(r / KERNEL / "executable.so"), reason="permission denied"),
]
COMMANDS = ("ls", "verify", "inspect", "prune", "prune --deep", "import")


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """One archive per layout, exported from an undamaged copy: what import compares against."""
    base = tmp_path_factory.mktemp("fidelity-archives")
    out = {}
    for layout in ("hidet", "tilus", "tilelang"):
        root = hidet_root(base / layout) if layout == "hidet" else copy_tree(FIXTURES / layout, base / layout)
        out[layout] = base / f"{layout}.tar"
        r = run_kcache("--cache-dir", root, "export", out[layout], "--json")
        assert r.exit_code == 0, r.stderr
    return out


def status_by(command: str, root: Path, case: Case, archive: Path) -> str | None:
    """The status `command` gives the case's entry (prune and import: what they decide from it)."""
    h = case.rel.rsplit("/", 1)[-1]
    if command == "ls":
        rows = [r for r in run_kcache("--cache-dir", root, "ls", "--json").json()["entries"] if r["path"]
                == str(root / case.rel)]
        assert len(rows) == 1
        return rows[0]["status"]
    if command == "verify":
        r = run_kcache("--cache-dir", root, "verify", "--json")
        found = [p for p in r.json()["problems"] if p["path"] == str(root / case.rel)]
        assert r.exit_code == (1 if r.json()["problems"] else 0)
        return found[0]["status"] if found else "complete"
    if command == "inspect":
        r = run_kcache("--cache-dir", root, "inspect", case.rel, "--json")
        data = r.json()
        assert data["hash"] == h
        assert r.exit_code == (0 if data["status"] == "complete" else 1), r.stderr  # inspect's exit says complete
        return data["status"]
    if command.startswith("prune"):
        r = run_kcache("--cache-dir", root, "prune", "--broken", *command.split()[1:], "--dry-run", "--json")
        assert r.exit_code == 0, r.stderr
        removed = [x for x in r.json()["removed"] if x["path"] == str(root / case.rel)]
        return removed[0]["status"] if removed else "kept"
    r = run_kcache("--cache-dir", root, "import", archive, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    decided = [e for e in r.json()["entries"] if e["relpath"] == case.rel]
    if not decided:
        return None  # the archive does not hold this entry
    reason = decided[0]["reason"] or ""
    if reason == "already present (complete)":
        return "complete"
    assert reason.startswith("replaces a "), reason
    return reason.removeprefix("replaces a ").split(" ", 1)[0]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_command_judges_the_entry_alike(case, command, tmp_path, archives):
    root = hidet_root(tmp_path / "c") if case.layout == "hidet" else copy_tree(FIXTURES / case.layout, tmp_path / "c")
    case.damage(root)
    try:
        got = status_by(command, root, case, archives[case.layout])
        want = case.status
        if command == "ls" and case.cheap:
            want = case.cheap  # ls reads no byte of an untouched file: verify and the others do
        if command.startswith("prune"):  # --broken judges as ls does, --deep as verify does
            judged = case.status if command == "prune --deep" else case.cheap or case.status
            want = judged if judged in BROKEN else "kept"
        if command == "import" and got is None:
            assert case.rel == FAILED_PROGRAM  # built only here, so not in the archive
            return
        assert got == want, f"{command}: {got}, the loader's rule says {want}"
        if command == "inspect" and case.reason:
            data = run_kcache("--cache-dir", root, "inspect", case.rel, "--json").json()
            assert case.reason.lower() in data["reason"].lower(), data["reason"]
    finally:
        for dirpath, _, files in os.walk(root):
            for f in files:
                p = os.path.join(dirpath, f)
                if not os.path.islink(p):
                    os.chmod(p, 0o644)


# ---- what inspect and log show, beyond the status ----------------------------------------------------

def test_inspect_and_log_cover_graphs_and_ir_modules(kcache, tmp_path):
    root = hidet_root(tmp_path / "c")
    rows = {r["hash"]: r for r in kcache("--cache-dir", root, "ls", "--json").json()["entries"]}
    assert rows["0123456789abcdef"]["kind"] == "graph" and rows["0123456789abcdef"]["target"] == "cpu"
    assert rows["fedcba9876543210"]["kind"] == "ir_module" and rows["fedcba9876543210"]["target"] == "cpu"
    graph = kcache("--cache-dir", root, "inspect", "0123456789abcdef", "--json").json()
    assert graph["inputs"] == [{"name": None, "dtype": "float32", "shape": [4, 8]}]
    assert graph["outputs"][0]["shape"] == [4, "n"]
    assert len(graph["binaries"]) == 3  # the graph module and both kernels
    assert "g++" in graph["compile_command"]
    ir = kcache("--cache-dir", root, "inspect", "fedcba9876543210", "--json").json()
    assert ir["status"] == "complete" and "g++" in ir["compile_command"] and len(ir["binaries"]) == 1
    log = kcache("--cache-dir", root, "log", "fedcba9876543210", "--raw")
    assert log.exit_code == 0 and "g++" in log.stdout
    glog = kcache("--cache-dir", root, "log", "0123456789abcdef", "--raw")
    # the graph module's command (built from matmul's copy here), then each kernel's
    assert glog.exit_code == 0 and "matmul/064b4a6c035246e8/source.cc" in glog.stdout and "fused/" in glog.stdout


def test_shapes_are_integers_from_task_txt_and_meta_json(kcache, tmp_path):
    root = hidet_root(tmp_path / "c")
    with_meta = kcache("--cache-dir", root, "inspect", "064b", "--json").json()
    (root / MATMUL / "meta.json").unlink()
    from_task = kcache("--cache-dir", root, "inspect", "064b", "--json").json()
    for data in (with_meta, from_task):
        assert [t["shape"] for t in data["inputs"]] == [[4, 8], [8, 16]]
        assert all(isinstance(d, int) for t in data["inputs"] + data["outputs"] for d in t["shape"])


def test_tilus_log_shows_the_recorded_failure_and_params_are_not_tensors(kcache, tmp_path):
    root = copy_tree(FIXTURES / "tilus", tmp_path / "c")
    tilus_failure(root, after_success=False)
    for target in ("1-845a0ed6", "0badc0de0bad"):
        r = kcache("--cache-dir", root, "log", target, "--raw")
        assert r.exit_code == 0, r.stderr
        assert 'identifier "tile_k" is undefined' in r.stdout and "nvcc" in r.stdout
    script = kcache("--cache-dir", root, "inspect", "1-845a0ed6", "--json").json()
    assert script["status"] == "failed" and "tile_k" in script["reason"]
    assert script["inputs"] == []  # n is an int32 scalar, x_ptr and y_ptr pointers: none is a tensor
    text = kcache("--cache-dir", root, "inspect", "1-845a0ed6").stdout
    assert "int32 (scalar)" in text and "void* (pointer)" in text


def test_tilelang_kernel_shows_its_params(kcache, fixture_copy):
    root = fixture_copy("tilelang")
    text = kcache("--cache-dir", root, "inspect", "cb68").stdout
    assert text.count("float32[256, 256]") == 3


def test_a_hidet_version_is_a_note_never_a_status(kcache, tmp_path):
    """No stale hidet entry, whatever the versions: hidet reuses lib.so. inspect says what hidet will do."""
    root = hidet_root(tmp_path / "c")
    set_version(root, MATMUL, "0.5.0")
    set_version(root, SOFTMAX, "0.7.0")
    assert kcache("--cache-dir", root, "ls", "--status", "stale", "--json").json()["entries"] == []
    assert kcache("--cache-dir", root, "ls", "--status", "unreadable", "--json").json()["entries"] == []
    facts = kcache("--cache-dir", root, "inspect", MATMUL, "--json").json()["facts"]
    assert facts["version_txt"] == "0.5.0"
    assert facts["hidet_installed"].startswith("not found")
    assert "reuses lib.so" not in str(facts)  # judged as by the hidet that wrote it: nothing to bridge


def _nobody_can_run() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.mark.skipif(not _nobody_can_run(), reason="needs root and setpriv to make a directory unreadable")
def test_unreadable_op_directory_is_counted_and_never_pruned():
    """As `nobody`: an op directory mode 000 is one `unreadable` row (its entries are not dropped from
    the counts), and prune --broken leaves it alone."""
    import subprocess
    import sys
    import tempfile

    from conftest import REPO

    base = Path(tempfile.mkdtemp(prefix="kcache-nobody-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        root = copy_tree(FIXTURES / "hidet", base / "cache")
        subprocess.run(["chown", "-R", "nobody:nogroup", str(root)], check=True)
        (root / "ops/cpu_space_0/matmul").chmod(0)

        def run(*args: str):
            code = textwrap.dedent(f"""
                import sys; sys.path.insert(0, {str(REPO)!r})
                from kcache_cli.cli.app import main
                main(['--cache-dir', {str(root)!r}, *{list(args)!r}])
            """)
            return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                                   "-c", code], check=False, capture_output=True, text=True, cwd=base,
                                  env={**os.environ, "HOME": str(base)})

        proc = run("ls", "--json")
        if proc.returncode != 0 and not proc.stderr.startswith(("Error:", "warning:")):
            pytest.skip(f"nobody cannot run kcache from here: {proc.stderr.strip()[-200:]}")
        rows = json.loads(proc.stdout)["entries"]
        blocked = [r for r in rows if r["status"] == "unreadable"]
        assert len(rows) == 5 and len(blocked) == 1
        assert blocked[0]["op"] == "matmul" and "Permission denied" in blocked[0]["reason"]
        pruned = run("prune", "--broken", "--json")
        assert pruned.returncode == 0, pruned.stderr
        assert json.loads(pruned.stdout)["removed"] == []
        (root / "ops/cpu_space_0/matmul").chmod(0o755)
        assert (root / MATMUL / "lib.so").is_file()
    finally:
        for dirpath, _, _ in os.walk(base):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_prune_broken_keeps_stale_entries_and_prune_stale_removes_them(kcache, tmp_path, monkeypatch):
    """DESIGN 2.8: `stale` (a key space the loader never looks up again) may still serve another
    environment, so --broken never removes it; --stale does. No hidet entry is stale any more (versions
    are notes): the judgement is made to say so for one entry."""
    from kcache_cli.layouts import hidet
    from kcache_cli.model.records import Judgement

    root = hidet_root(tmp_path / "c")
    real = hidet._judge_module

    def judge(d, *args, **kwargs):
        if d.path.endswith(MATMUL):
            return Judgement.of("stale", "built for another compiler's key space")
        return real(d, *args, **kwargs)

    monkeypatch.setattr(hidet, "_judge_module", judge)
    (root / RELU / "func_types.pickle").unlink()  # partial: --broken takes it
    assert [r["hash"] for r in kcache("--cache-dir", root, "ls", "--status", "stale", "--json").json()["entries"]] == [
        MATMUL.rsplit("/", 1)[1]]
    r = kcache("--cache-dir", root, "prune", "--broken", "--json")
    assert r.exit_code == 0 and [x["path"] for x in r.json()["removed"]] == [str(root / RELU)], r.stderr
    assert (root / MATMUL).is_dir()
    dry = kcache("--cache-dir", root, "prune", "--stale", "--dry-run", "--json").json()
    assert [x["path"] for x in dry["removed"]] == [str(root / MATMUL)] and (root / MATMUL).is_dir()
    r = kcache("--cache-dir", root, "prune", "--stale", "--json")
    assert r.exit_code == 0 and [x["path"] for x in r.json()["removed"]] == [str(root / MATMUL)]
    assert not (root / MATMUL).exists() and (root / SOFTMAX).is_dir()


@pytest.mark.skipif(shutil.which("g++") is None, reason="compiles with g++")
def test_kcache_built_entry_says_what_an_installed_hidet_does(kcache, tmp_path, monkeypatch):
    """hidet 0.6 finds no version.txt, meta.json or func_types.pickle in an entry kcache built, and compiles
    over it (the oracle measures it): partial where such a hidet is installed, and `kcache build` still
    takes it as its own cache hit. Without hidet installed, kcache's own rule: complete, with a note."""
    from kcache_cli.layouts import hidet

    (tmp_path / "in").mkdir()
    shutil.copy(FIXTURES / "hidet" / RELU / "task.txt", tmp_path / "in" / "task.txt")
    (tmp_path / "in" / "source.cc").write_text('extern "C" int hidet_launch() { return 0; }\n')
    root = tmp_path / "c"
    root.mkdir()
    src = tmp_path / "in"
    args = ("--cache-dir", root, "--json", "build", src / "task.txt", "--source", src / "source.cc")
    assert kcache(*args).json()["built"] == 1
    (row,) = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert row["status"] == "complete"
    assert "compile it again" in kcache("--cache-dir", root, "inspect", RELU, "--json").json()["facts"]["hidet_will"]
    monkeypatch.setattr(hidet, "installed_version", lambda: "0.6.1")
    (row,) = kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    assert row["status"] == "partial" and "made by kcache build: hidet 0.6.1 compiles it again" in row["reason"]
    assert kcache(*args).json()["hits"] == 1
