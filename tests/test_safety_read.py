"""Reading a hostile cache (issue 9, the reading side): FIFOs and devices where files belong, escape
sequences in logs and names, trees and JSON nested absurdly deep, manifest bombs. Every command runs
as a real process under a timeout and a memory limit: it must finish, print no traceback, and the
cache must lose nothing."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import resource
import select
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from archive_helpers import build_archive, hidet_entry

SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"
ADD = "ops/cuda_space_0/add/8d1f7691cdf75e90"
TIMEOUT = 120  # seconds: a hang is a failure, not a stuck suite
MEMORY = 2 << 30  # address space per command: a read that grows without bound dies, and the test sees it


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KCACHE_DIR"}
    env.update(NO_COLOR="1", **extra)
    return env


def kc(*args, input_bytes: bytes | None = None) -> subprocess.CompletedProcess:
    """The real kcache in a process of its own, bounded in time and memory."""
    try:
        proc = subprocess.run([sys.executable, "-m", "kcache_cli", *map(str, args)], capture_output=True,
                              timeout=TIMEOUT, env=_env(), preexec_fn=_limit_memory, input=input_bytes,
                              check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"kcache {' '.join(map(str, args))} hung for {TIMEOUT}s") from None
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "RecursionError" not in err and "MemoryError" not in err, err
    return proc


def _cache_state(root: Path) -> dict:
    """Everything in the cache but kcache's own bookkeeping (.kcache/: stamps and locks may change):
    path -> (type, mode, size, digest or link target). Iterative; a file over 1 MiB (a sparse one) is
    known by size and mtime; the test's own 10,000-deep `deep/` is known by its top."""
    out: dict[str, tuple] = {}
    todo = [""]
    while todo:
        rel = todo.pop()
        for de in os.scandir(root / rel if rel else root):
            name = f"{rel}{de.name}"
            if name == ".kcache":
                continue
            st = de.stat(follow_symlinks=False)
            if de.is_symlink():
                out[name] = ("link", os.readlink(de.path))
            elif de.is_dir(follow_symlinks=False):
                out[name] = ("dir", st.st_mode)
                if de.name != "deep":
                    todo.append(name + "/")
            elif not de.is_file(follow_symlinks=False):
                out[name] = ("other", st.st_mode)
            elif st.st_size > 1 << 20:
                out[name] = ("file", st.st_mode, st.st_size, st.st_mtime)
            else:
                out[name] = ("file", st.st_mode, hashlib.sha256(Path(de.path).read_bytes()).hexdigest())
    return out


def _newer(path: Path) -> None:
    """Make ls read the file: newer than the entry's completion marker."""
    os.utime(path, (2_000_000_000, 2_000_000_000), follow_symlinks=False)


def _ls(root: Path) -> dict:
    proc = kc("--cache-dir", root, "ls", "--json")
    assert proc.returncode == 0, proc.stderr
    return {e["path"].split(str(root) + "/", 1)[1]: e for e in json.loads(proc.stdout)["entries"]}


# ---- FIFOs, devices and links where files belong ----------------------------------------------------

@pytest.mark.parametrize("where", ["fifo", "link-inside", "link-outside"])
def test_fifo_lib_so_blocks_nothing(fixture_copy, tmp_path, where):
    """hidet dlopens lib.so through a link: a FIFO there, or a link to one, blocks it; kcache never opens
    it, so the entry is unreadable (never removed), and nothing kcache does blocks on it."""
    root = fixture_copy("hidet")
    entry = root / SOFTMAX
    lib = entry / "lib.so"
    lib.unlink()
    if where == "fifo":
        os.mkfifo(lib)
    elif where == "link-inside":
        os.mkfifo(entry / "pipe")
        lib.symlink_to("pipe")
    else:
        os.mkfifo(tmp_path / "outside.fifo")
        lib.symlink_to(tmp_path / "outside.fifo")
    _newer(lib)
    before = _cache_state(root)

    e = _ls(root)[SOFTMAX]
    what = "a FIFO" if where == "fifo" else "a symlink to a FIFO"  # stat through the link, never read
    assert e["status"] == "unreadable" and f"lib.so is {what}, not a regular file (hidet opens it" in e["reason"], e
    assert _ls(root)[ADD]["status"] == "complete"
    assert kc("--cache-dir", root, "stats").returncode == 0
    assert kc("--cache-dir", root, "prune", "--dry-run").returncode == 0
    assert kc("--cache-dir", root, "prune").returncode == 0
    export = kc("--cache-dir", root, "export", tmp_path / "all.tar.gz", "--status", "complete,partial,unreadable")
    assert export.returncode == 0, export.stderr
    assert b"ad252b064b266eea" in export.stderr  # selected, left out, and said so
    ins = kc("--cache-dir", root, "inspect", "ad252b06")
    assert ins.returncode == 1 and b"never read" in ins.stdout, ins.stdout
    ver = kc("--cache-dir", root, "verify", "ad252b06")
    assert ver.returncode == 1 and b"lib.so" in ver.stdout
    assert _cache_state(root) == before


def test_fifo_task_txt_and_log(fixture_copy):
    root = fixture_copy("hidet")
    entry = root / SOFTMAX
    (entry / "task.txt").unlink()
    os.mkfifo(entry / "task.txt")
    (entry / "nvcc_output.txt").unlink()
    os.mkfifo(entry / "nvcc_output.txt")
    before = _cache_state(root)
    ins = kc("--cache-dir", root, "inspect", "ad252b06", "--json")
    assert ins.returncode == 0  # hidet never reads task.txt on load (issue 22): a note, never read
    facts = json.loads(ins.stdout)["facts"]
    assert "FIFO" in facts["task_txt_note"], facts
    ver = kc("--cache-dir", root, "verify", "ad252b06")
    assert ver.returncode == 0
    log = kc("--cache-dir", root, "log", "ad252b06")
    assert log.returncode == 1 and log.stderr.startswith(b"Error: cannot read nvcc_output.txt: a FIFO")
    assert kc("--cache-dir", root, "ls").returncode == 0
    assert _cache_state(root) == before


@pytest.mark.parametrize("kind", ["dev-zero", "sparse"])
def test_endless_task_txt(fixture_copy, kind):
    """task.txt -> /dev/zero (never ends) or a 64 GiB sparse file: inspect and verify stay small."""
    root = fixture_copy("hidet")
    task = root / SOFTMAX / "task.txt"
    task.unlink()
    if kind == "dev-zero":
        task.symlink_to("/dev/zero")
    else:
        with open(task, "wb") as f:
            f.truncate(64 << 30)
    before = _cache_state(root)
    ins = kc("--cache-dir", root, "inspect", "ad252b06", "--json")
    assert ins.returncode == 0  # hidet never reads task.txt on load (issue 22): a note, read bounded
    facts = json.loads(ins.stdout)["facts"]
    want = "symlink" if kind == "dev-zero" else "over 1048576 bytes"
    assert want in facts["task_txt_note"], facts
    assert kc("--cache-dir", root, "verify").returncode == 0
    assert _cache_state(root) == before


def test_fifo_lock_file_does_not_hang_ls(fixture_copy):
    root = fixture_copy("hidet")
    entry = root / SOFTMAX
    (entry / "func_types.pickle").unlink()  # partial: ls then probes hidet's .lock
    (entry / ".lock").unlink(missing_ok=True)
    os.mkfifo(entry / ".lock")
    assert _ls(root)[SOFTMAX]["status"] == "partial"


def test_fifo_in_tilus_and_tilelang_entries(fixture_copy, tmp_path):
    """A FIFO among a tilus script's links (read as a flattened link before) and a tilelang kernel's
    executable.so (read whole to find the binaries it embeds, before a clear of cuda-binaries)."""
    tilus = fixture_copy("tilus")
    os.mkfifo(tilus / "scripts/add_one/1-845a0ed6/programs/1")
    tilelang = fixture_copy("tilelang")
    kernel = next(tilelang.glob("0.1.15/linux-x86_64/kernels/*"))
    (kernel / "executable.so").unlink()
    os.mkfifo(kernel / "executable.so")
    before = (_cache_state(tilus), _cache_state(tilelang))
    for root in (tilus, tilelang):
        for args in (["ls"], ["stats"], ["-q", "verify"], ["prune", "--dry-run"],
                     ["export", tmp_path / f"{root.name}.tar", "--status", "complete,partial,corrupt"]):
            run = kc("--cache-dir", root, *args)
            assert run.returncode in (0, 1), (args, run.stderr)
    assert kc("--cache-dir", tilus, "inspect", "1-845a0ed6").returncode in (0, 1)  # 1: not complete
    assert kc("--cache-dir", tilus, "log", "1-845a0ed6").returncode == 0
    clear = kc("--cache-dir", tilelang, "clear", "--space", "0.1.15/cuda-binaries", "--dry-run")
    assert clear.returncode == 0, clear.stderr
    ver = kc("--cache-dir", tilelang, "verify", "--json")
    # reported (its listed size already fails it), never read: the command did not block
    assert any("executable.so" in p for e in json.loads(ver.stdout)["problems"] for p in e["problems"])
    assert (_cache_state(tilus), _cache_state(tilelang)) == before



NON_REGULAR = ["fifo", pytest.param("device", marks=pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")),
               "link"]
WHAT = {"fifo": "a FIFO", "device": "a character device", "link": "a symlink"}


def _plant(path: Path, how: str, outside: Path) -> None:
    """The file `path` (a kernel file its consumer opens) replaced by a FIFO, a character device (/dev/zero's
    numbers) or a link to a copy of it outside the cache."""
    data = path.read_bytes() if path.exists() else b"x" * 64
    path.unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "device":
        os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    else:
        outside.mkdir(exist_ok=True)
        (outside / path.name).write_bytes(data)
        path.symlink_to(outside / path.name)


def _never_judged(root: Path, planted: dict[str, str], how: str) -> None:
    """Each entry (relpath -> the name planted in it) is unreadable, its reason naming the file, in ls, verify
    and inspect alike; `prune --broken` removes nothing of the cache; no command blocked (kc's timeout)."""
    before = _cache_state(root)
    listed = _ls(root)
    for rel, name in planted.items():
        e = listed[rel]
        assert e["status"] == "unreadable" and f"{name} is {WHAT[how]}" in e["reason"], (rel, e)
    ver = kc("--cache-dir", root, "verify", "--json")
    assert ver.returncode == 1, ver.stderr
    problems = {os.path.relpath(p["path"], root): p for p in json.loads(ver.stdout)["problems"]}
    for rel, name in planted.items():
        assert problems[rel]["status"] == "unreadable" and any(name in p for p in problems[rel]["problems"]), rel
        ins = kc("--cache-dir", root, "inspect", listed[rel]["hash"], "--json")
        assert json.loads(ins.stdout)["status"] == "unreadable" and name in json.loads(ins.stdout)["reason"], rel
    plan = kc("--cache-dir", root, "prune", "--broken", "--dry-run", "--json")
    assert plan.returncode == 0 and not {os.path.relpath(r["path"], root) for r in json.loads(plan.stdout)["removed"]
                                         } & set(planted), plan.stdout
    assert kc("--cache-dir", root, "prune", "--broken").returncode == 0
    assert _cache_state(root) == before


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_in_an_inductor_entry_leaves_it_unjudged(tmp_path, how):
    """A FIFO, device or link where torch opens a file of a code shard, an fx graph variant or an
    aotautograd variant: torch would open it (a FIFO blocks it), kcache never does, so the entry is
    unreadable (DESIGN 2.8: never complete, never removed)."""
    from loaders import recorded

    root = recorded.extract_tree("inductor", tmp_path / "recorded")
    files = [sorted(root.glob(glob))[0] for glob in ("[0-9a-z][0-9a-z]/c*.so", "fxgraph/*/*/*", "aotautograd/*/*")]
    for f in files:  # the shard's .so keeps its .cpp beside it
        _plant(f, how, tmp_path / "outside")
    _never_judged(root, {os.path.relpath(f.parent, root): f.name for f in files}, how)


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_in_a_jax_cache_leaves_it_unjudged(tmp_path, how):
    """A `-cache` file (with its `-atime` sidecar) that is a FIFO, device or link: jax would open it (a FIFO
    blocks it), kcache never does; the one entry that is the whole cache is unreadable, never corrupt (prune
    --broken would take every executable with it) nor complete."""
    root = tmp_path / "caches"
    shutil.copytree(Path(__file__).parent / "fixtures" / "real" / "jax" / "cache", root / "jaxcache")
    key = "jit_planted-" + "a" * 64
    atime = next((root / "jaxcache").glob("*-atime"))
    (root / "jaxcache" / f"{key}-atime").write_bytes(atime.read_bytes())
    _plant(root / "jaxcache" / f"{key}-cache", how, tmp_path / "outside")
    _never_judged(root, {"jaxcache": f"{key}-cache"}, how)


REAL = Path(__file__).parent / "fixtures" / "real"


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_in_a_numba_entry_leaves_it_unjudged(tmp_path, how):
    """A `.nbc` an index names as a FIFO, device or link: numba would open it (a FIFO blocks it), kcache
    never does; ls said complete while verify said corrupt ("not a whole pickle"), naming nothing."""
    root = tmp_path / "numba"
    shutil.copytree(REAL / "numba", root)
    entry = next(root.iterdir())
    data = sorted(entry.glob("*.nbc"))[0]
    _plant(data, how, tmp_path / "outside")
    _never_judged(root, {entry.name: data.name}, how)


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_in_a_tilelang_entry_leaves_it_unjudged(tmp_path, how):
    """A kernel's executable.so and a cuda-binaries' kernel.cubin as a FIFO, device or link to a FIFO:
    tilelang opens them (a FIFO blocks it), kcache never does; they were judged by their 0 bytes (partial,
    corrupt). A link to a good copy stays judged through it: tilelang's loader hits it (loaders oracle)."""
    root = tmp_path / "tilelang"
    shutil.copytree(REAL / "tilelang", root)
    files = [next(root.glob("0.1.15/linux-x86_64/kernels/*/executable.so")),
             next(root.glob("0.1.15/cuda-binaries/*/kernel.cubin"))]
    for i, f in enumerate(files):
        if how == "link":
            f.unlink()
            os.mkfifo(tmp_path / f"outside-{i}.fifo")
            f.symlink_to(tmp_path / f"outside-{i}.fifo")
        else:
            _plant(f, how, tmp_path / "outside")
    _never_judged(root, {os.path.relpath(f.parent, root): f.name for f in files}, how)


def _plant_followed(path: Path, how: str, outside: Path) -> None:
    """_plant, for a loader that follows links (hidet, tilus, Triton): a link leads to a FIFO outside the
    cache (one to a good copy is judged through it, as the loader hits it: the loader oracle)."""
    if how != "link":
        _plant(path, how, outside)
        return
    outside.mkdir(exist_ok=True)
    fifo = outside / f"{len(os.listdir(outside))}.fifo"
    os.mkfifo(fifo)
    path.unlink(missing_ok=True)
    path.symlink_to(fifo)


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_hidet_opens_leaves_the_entry_unjudged(tmp_path, how):
    """Each file hidet opens when it loads an op, an IR module or a graph's kernel (lib.so,
    func_types.pickle, version.txt, meta.json, dispatch_table.txt), or the lib.so of an entry `kcache build`
    made, as a FIFO, device or link to a FIFO: hidet opens it (a FIFO blocks it), kcache never does. They
    were corrupt ("hidet fails on it") or partial (a FIFO's 0 bytes), and prune --broken removed them."""
    from test_fidelity import FUSED, GRAPH, IR_MODULE, MATMUL, RELU, hidet_root

    root = hidet_root(tmp_path / "c")
    seed = "ops/cuda_space_0/add/00000000000000aa"  # as `kcache build` makes one (no hidet marker): lib.so
    (root / seed).mkdir()
    for name in ("task.txt", "source.cu", "lib.so"):
        shutil.copy(root / ADD / name, root / seed / name)
    planted = {SOFTMAX: "lib.so", ADD: "func_types.pickle", FUSED: "version.txt", MATMUL: "meta.json",
               RELU: "dispatch_table.txt", GRAPH: "kernels/0/lib.so", IR_MODULE: "func_types.pickle",
               seed: "lib.so"}
    for rel, name in planted.items():
        _plant_followed(root / rel / name, how, tmp_path / "outside")
    _never_judged(root, planted, how)


def test_a_fifo_hidet_rewrites_leaves_the_entry_unjudged(kcache, fixture_copy, monkeypatch):
    """Another installed hidet rewrites task.txt, version.txt and meta.json before it reuses lib.so: a
    FIFO there blocks its open for writing, so the entry is unjudged (it was complete); the hidet that
    wrote the entry never opens task.txt (complete). ls and verify agree."""
    from kcache_cli.layouts import hidet

    root = fixture_copy("hidet")
    task = root / SOFTMAX / "task.txt"
    task.unlink()
    os.mkfifo(task)
    for running, status in (("0.6.1", "complete"), ("0.7.0", "unreadable")):
        monkeypatch.setattr(hidet, "installed_version", lambda running=running: running)
        (row,) = kcache("--cache-dir", root, "ls", "--json", "ad252b06").json()["entries"]
        assert row["status"] == status, (running, row)
        checked = kcache("--cache-dir", root, "verify", "--json", "ad252b06").json()
        assert [p["status"] for p in checked["problems"]] == ([status] if status != "complete" else []), checked
    assert row["reason"] == "task.txt is a FIFO, not a regular file (hidet opens it; kcache never does)"
    assert stat.S_ISFIFO(os.lstat(task).st_mode)


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_tilus_opens_leaves_the_entry_unjudged(tmp_path, how):
    """A program's module/lib.so or program.txt, a script's dispatch_table.pickle as a FIFO, device or link to a
    FIFO: tilus opens it (a FIFO blocks it), kcache never does. They were corrupt, and prune --broken removed
    them; a script whose program is unjudged is unjudged too (its verdict goes by its programs)."""
    program, script = "programs/f006237ca7a5", "scripts/add_one/1-845a0ed6"
    for i, planted in enumerate(({program: "module/lib.so", script: "dispatch_table.pickle"},
                                 {program: "program.txt", script: "program.txt"})):
        root = tmp_path / f"tilus-{i}"
        shutil.copytree(REAL / "tilus", root, symlinks=True)
        _plant_followed(root / program / planted[program], how, tmp_path / "outside")
        if planted[script] != planted[program]:
            _plant_followed(root / script / planted[script], how, tmp_path / "outside")
        _never_judged(root, planted, how)


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_triton_opens_leaves_the_kernel_unjudged(tmp_path, how):
    """A kernel's cubin, its metadata or its group file as a FIFO, device or link to a FIFO: Triton opens it (a
    FIFO blocks it), kcache never does. They were corrupt (prune --broken removed them), and a FIFO cubin older
    than its group file was complete in ls (never read there) but corrupt in verify."""
    from test_triton import ADD_90, MATMUL, SOFTMAX as TRITON_SOFTMAX

    root = tmp_path / "triton"
    shutil.copytree(REAL / "triton" / "cache", root)
    assert kc("--cache-dir", root, "verify", "--fix").returncode == 0  # its group paths lead into this copy
    planted = {TRITON_SOFTMAX: "softmax_kernel.cubin", ADD_90: "add_kernel.json", MATMUL: "__grp__matmul_kernel.json"}
    for key, name in planted.items():
        _plant_followed(root / key / name, how, tmp_path / "outside")
        os.utime(root / key / name, (1_000_000_000, 1_000_000_000), follow_symlinks=False)  # older than the group
    _never_judged(root, planted, how)


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_module_in_a_torch_extension_leaves_it_unjudged(tmp_path, how):
    """The module `<name>.so` torch imports as a FIFO, device or link: a FIFO or device was corrupt ("is
    empty": prune --broken removed the build), a link complete without being read."""
    from test_torchext import EXT, built_here

    root = built_here(tmp_path / "torch_extensions" / "py311_cpu")
    module = root / EXT / f"{EXT}.so"
    _plant(module, how, tmp_path / "outside")
    _never_judged(root, {EXT: module.name}, how)


@pytest.mark.parametrize("how", NON_REGULAR)
def test_a_non_regular_file_in_the_cuda_jit_cache_leaves_it_unjudged(tmp_path, how):
    """A cached binary deep in the driver's JIT cache as a FIFO, device or link: the driver opens it, kcache
    never does; ls said complete while verify and inspect said unreadable."""
    root = tmp_path / "nv"
    cache = root / "ComputeCache"
    (cache / "a" / "11").mkdir(parents=True)
    (cache / "index").write_bytes(os.urandom(256))
    (cache / "a" / "11" / "0000000bdeadbeef").write_bytes(os.urandom(1000))
    _plant(cache / "a" / "11" / "0000000bdeadbeef", how, tmp_path / "outside")
    _never_judged(root, {"ComputeCache": "a/11/0000000bdeadbeef"}, how)


# ---- nothing raw reaches a terminal -----------------------------------------------------------------

NASTY = ("\x1b]0;pwned-title\x07\x1b[2J\x1b[?1049h\x1b]52;c;cHduZWQ=\x07"  # title, clear, alt screen, clipboard
         "\u009b31m\u009d0;c1\u009c"  # C1 CSI and OSC
         "\u202eevil\u202c\u2066iso\u2069\u200f\r")  # bidi override, isolate, mark; carriage return
EVIL_OP = "ev\x1b[2Jil\u202e\u009b"


def _unsafe_chars(text: str) -> list[str]:
    bad = [ch for ch in text if (ord(ch) < 0x20 and ch not in "\r\n\t") or 0x7f <= ord(ch) <= 0x9f
           or 0xdc80 <= ord(ch) <= 0xdcff]  # a raw undecodable byte
    return bad + [ch for ch in text if ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"]


def _in_a_terminal(args: list) -> str:
    """kcache with stdin, stdout and stderr on a pseudo-terminal: everything the terminal got."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kcache_cli", *map(str, args)], stdin=slave, stdout=slave,
                                stderr=slave, env=_env(COLUMNS="200", TERM="xterm-256color"), close_fds=True,
                                preexec_fn=_limit_memory)  # noqa: PLW1509 - the test runs no threads
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], TIMEOUT)
            if not ready:
                proc.kill()
                raise AssertionError(f"kcache {args} printed nothing for {TIMEOUT}s")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=TIMEOUT)
        return b"".join(chunks).decode("utf-8", "surrogateescape")
    finally:
        os.close(master)


def _hostile_cache(fixture_copy) -> Path:
    root = fixture_copy("hidet")
    log = root / SOFTMAX / "nvcc_output.txt"
    log.write_bytes(log.read_bytes() + f"error: {NASTY}\nwarning: {NASTY}\n".encode() + b"\xff\xfe raw bytes\n")
    evil = root / "ops/cuda_space_0" / EVIL_OP / "8d1f7691cdf75e90"
    evil.parent.mkdir()
    os.rename(root / ADD, evil)
    (evil / "nvcc_output.txt").write_text(f"{NASTY}\n")
    return root


def test_escapes_never_reach_the_terminal(fixture_copy):
    root = _hostile_cache(fixture_copy)
    runs = {}
    for args in (["log", "ad252b06"], ["log", "--raw", "ad252b06"], ["log", "8d1f76"], ["inspect", "8d1f76"],
                 ["inspect", "ad252b06"], ["ls"], ["stats"], ["-q", "verify"], ["-q", "prune", "--dry-run"],
                 ["--cache-dir", f"{root}/no\x1b[2Jsuch\u202e", "inspect", "abc"]):
        full = args if args[0] == "--cache-dir" else ["--cache-dir", root, *args]
        out = _in_a_terminal(full)
        assert "Traceback" not in out, out
        assert not _unsafe_chars(out.replace("\r\n", "\n")), (args, out)
        runs[" ".join(args[:2])] = out
    assert "\\x1b]0;pwned-title\\x07" in runs["log ad252b06"]  # shown, as an escape
    assert "\\u202eevil" in runs["log --raw"] and "\\xff\\xfe raw bytes" in runs["log --raw"]
    assert "ev\\x1b[2Jil\\u202e\\x9b" in runs["ls"] and "ev\\x1b[2Jil" in runs["inspect 8d1f76"]
    assert "Error: " in runs[f"--cache-dir {root}/no\x1b[2Jsuch\u202e"]


def test_log_raw_into_a_pipe_is_byte_exact(fixture_copy):
    root = _hostile_cache(fixture_copy)
    raw = kc("--cache-dir", root, "log", "--raw", "ad252b06")
    assert raw.returncode == 0
    entry = root / SOFTMAX
    want = (entry / "compile.sh").read_bytes()
    want = (want if want.endswith(b"\n") else want + b"\n") + (entry / "nvcc_output.txt").read_bytes()
    assert raw.stdout == want
    piped = subprocess.run(f"{sys.executable} -m kcache_cli --cache-dir '{root}' log --raw ad252b06 | cat",
                           shell=True, capture_output=True, timeout=TIMEOUT, env=_env(), check=False)
    assert piped.stdout == want


def test_warnings_and_completion_are_escaped(fixture_copy, kcache):
    root = _hostile_cache(fixture_copy)
    from kcache_cli.cli.complete import _matching

    assert _matching([(EVIL_OP, "x"), ("matmul", "a\x1bb")], "") == [("matmul", "a\\x1bb")]
    run = kcache("--cache-dir", str(root), "ls")
    assert run.exit_code == 0 and not _unsafe_chars(run.stdout + run.stderr)


def test_export_leaves_out_what_import_would_refuse(fixture_copy, tmp_path, kcache):
    root = fixture_copy("hidet")
    (root / SOFTMAX / "notes\u202etxt.sh").write_bytes(b"x")
    run = kcache("--cache-dir", str(root), "export", str(tmp_path / "a.tar"))
    assert run.exit_code == 0 and "holds control characters" in run.stderr
    assert "\\u202e" in run.stderr and not _unsafe_chars(run.stderr)
    assert run.stderr.count(str(SOFTMAX)) == 1, run.stderr  # its warning, not also a "left out" note
    back = kcache("--cache-dir", str(tmp_path / "other"), "import", str(tmp_path / "a.tar"))
    assert back.exit_code == 0, back.stderr
    assert (tmp_path / "other" / ADD).is_dir() and not (tmp_path / "other" / SOFTMAX).exists()


def test_import_rejects_c1_and_bidi_names(tmp_path, kcache):
    root = tmp_path / "cache"
    for name in ("lib\u202e.so", "lib\u009b.so", "x\u2066y"):
        arch = build_archive(tmp_path / "a.tar", [hidet_entry(files={name: b"x", "task.txt": b"t"})])
        for dry in ([], ["--dry-run"]):
            run = kcache("--cache-dir", str(root), "import", str(arch), *dry)
            assert run.exit_code == 1 and "control characters" in run.stderr, run.stderr
            assert not _unsafe_chars(run.stderr)
    assert not root.exists()


# ---- no recursion limits ----------------------------------------------------------------------------

def _deep_dirs(base: Path, depth: int) -> None:
    """`base/d/d/d/...` `depth` levels deep, made relative to directory fds (no path is ever that long)."""
    base.mkdir()
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


def _remove_deep(base: Path) -> None:
    """The test's own clean-up of the chain (pytest's rmtree recurses)."""
    fds = [os.open(base, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        while True:
            try:
                fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        for name in os.listdir(fds[-1]):
            os.unlink(name, dir_fd=fds[-1])
        while len(fds) > 1:
            os.close(fds.pop())
            os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)
    base.rmdir()


# Past the recursion limit and PATH_MAX (see test_safety_delete.DEPTHS); the slow tier also runs 10,000.
@pytest.mark.parametrize("depth", [2_500, pytest.param(10_000, marks=pytest.mark.slow)])
def test_ten_thousand_deep_directory(fixture_copy, tmp_path, depth):
    root = fixture_copy("hidet")
    deep = root / SOFTMAX / "deep"
    _deep_dirs(deep, depth)
    try:
        before = _cache_state(root)
        ins = kc("--cache-dir", root, "inspect", "ad252b06", "--json")
        assert ins.returncode == 1
        assert any("nested more than" in p for p in json.loads(ins.stdout)["problems"])
        ver = kc("--cache-dir", root, "verify")
        assert ver.returncode == 1 and b"nested more than" in ver.stdout
        export = kc("--cache-dir", root, "export", tmp_path / "a.tar.zst")
        assert export.returncode == 0 and b"nested more than" in export.stderr, export.stderr
        ls = kc("--cache-dir", root, "ls")
        assert ls.returncode == 0 and b"nested more than" in ls.stderr
        assert kc("--cache-dir", root, "stats").returncode == 0
        imported = kc("--cache-dir", tmp_path / "other", "import", tmp_path / "a.tar.zst")
        assert imported.returncode == 0, imported.stderr  # the other entries travel
        assert (tmp_path / "other" / ADD / "lib.so").is_file()
        assert not (tmp_path / "other" / SOFTMAX).exists()
        assert _cache_state(root) == before
    finally:
        _remove_deep(deep)


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("name", ["kcache.json", "meta.json"])
def test_deep_json_in_an_entry(fixture_copy, tmp_path, name):
    root = fixture_copy("hidet")
    if name == "kcache.json":  # a kcache-built entry: judged by kcache.json while hidet's own files are absent
        for marker in ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle"):
            (root / SOFTMAX / marker).unlink(missing_ok=True)
    (root / SOFTMAX / name).write_bytes(b'{"files": ' + DEEP + b"}")
    _newer(root / SOFTMAX / "lib.so")  # so that ls reads kcache.json
    before = _cache_state(root)
    e = _ls(root)[SOFTMAX]
    if name == "kcache.json":
        assert e["status"] == "corrupt" and "nested more than" in e["reason"]
    ins = kc("--cache-dir", root, "inspect", "ad252b06", "--json")
    assert ins.returncode == 1
    assert any(f"{name} is nested more than 64 levels deep" in p for p in json.loads(ins.stdout)["problems"])
    assert kc("--cache-dir", root, "verify").returncode == 1
    export = kc("--cache-dir", root, "export", tmp_path / "a.tar", "--status", "complete,corrupt")
    assert export.returncode == 0, export.stderr
    assert _cache_state(root) == before


def test_deep_json_in_tilelang_manifest(fixture_copy):
    root = fixture_copy("tilelang")
    kernel = next(p for p in root.glob("*/*/kernels/*") if (p / "manifest.json").exists())
    (kernel / "manifest.json").write_bytes(DEEP)
    _newer(next(p for p in kernel.iterdir() if p.name != "manifest.json"))  # so that ls reads the manifest
    ls = kc("--cache-dir", root, "ls", "--json")
    assert ls.returncode == 0
    e = next(x for x in json.loads(ls.stdout)["entries"] if x["path"] == str(kernel))
    assert e["status"] == "corrupt" and "nested more than" in e["reason"]  # tilelang: RecursionError
    assert kc("--cache-dir", root, "verify").returncode == 1


def test_deep_json_in_an_archive_manifest(tmp_path):
    rec = hidet_entry()[0]
    rec["platform"] = "PLACEHOLDER"
    manifest = json.dumps({"format": "kcache-archive", "format_version": 1, "entries": [rec]}).encode()
    manifest = manifest.replace(b'"PLACEHOLDER"', DEEP)
    arch = _raw_archive(tmp_path / "deep.tar.gz", manifest)
    for dry in ([], ["--dry-run"]):
        run = kc("--cache-dir", tmp_path / "cache", "import", arch, *dry)
        assert run.returncode == 1
        assert run.stderr == b"Error: archive rejected: manifest.json is nested more than 64 levels deep\n"
    assert not (tmp_path / "cache").exists()


# ---- import stays bounded ---------------------------------------------------------------------------

def _raw_archive(path: Path, manifest: bytes | None, manifest_chunks=None, size: int | None = None) -> Path:
    """A .tar.gz whose first member is manifest.json, written as a stream (the manifest need not fit
    in memory): `manifest`, or `size` bytes from `manifest_chunks`."""
    from kcache_cli.fs import tarstream as ts

    size = len(manifest) if manifest is not None else size
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(ts.file_header("manifest.json", size, 0o644, 0))
        if manifest is not None:
            out.write(manifest)
        else:
            for chunk in manifest_chunks:
                out.write(chunk)
        out.write(ts.padding(size))
        out.write(bytes(1024))
    return path


def test_millions_of_records_in_a_small_archive(tmp_path):
    """2,000,000 records (190 MB of manifest JSON, under the fixed 256 MiB limit) in a gzip of well
    under a megabyte: refused from the manifest's size, before it is read."""
    record = b'{"layout":"hidet","kind":"op","relpath":"ops/cuda_space_0/a/0123456789abcdef","files":{}},'
    n = 2_000_000
    head = b'{"format": "kcache-archive", "format_version": 1, "entries": ['
    tail = b'{"x": 1}]}'
    size = len(head) + n * len(record) + len(tail)
    chunks = [head, *([record * 10_000] * (n // 10_000)), tail]
    arch = _raw_archive(tmp_path / "bomb.tar.gz", None, chunks, size)
    assert arch.stat().st_size < 4 << 20
    for dry in ([], ["--dry-run"]):
        run = kc("--cache-dir", tmp_path / "cache", "import", arch, *dry)
        assert run.returncode == 1
        assert b"out of proportion" in run.stderr, run.stderr
    assert not (tmp_path / "cache").exists()


def test_many_values_in_a_small_manifest(tmp_path):
    """Under the size floor, but five million JSON values: refused before json.loads builds them."""
    manifest = b'{"format": "kcache-archive", "format_version": 1, "entries": [' + b"1," * 5_000_000 + b"1]}"
    arch = _raw_archive(tmp_path / "values.tar.gz", manifest)
    for dry in ([], ["--dry-run"]):
        run = kc("--cache-dir", tmp_path / "cache", "import", arch, *dry)
        assert run.returncode == 1 and b"values, out of proportion" in run.stderr, run.stderr


def test_thousand_component_name(tmp_path):
    rec, members = hidet_entry()
    deep = "/".join(["a"] * 1000)
    rec["dirs"] = [deep]
    arch = build_archive(tmp_path / "a.tar", [(rec, members)])
    verdicts = []
    for dry in (["--dry-run"], []):
        run = kc("--cache-dir", tmp_path / "cache", "import", arch, *dry)
        verdicts.append((run.returncode, run.stderr))
    assert verdicts[0] == verdicts[1]
    assert verdicts[0][0] == 1 and b"nested more than 64 directories deep" in verdicts[0][1]
    assert not (tmp_path / "cache").exists()


def test_name_too_long_for_the_root_same_verdict(tmp_path):
    """Under the depth limit, but longer than PATH_MAX once under the cache root: the dry run says so too."""
    rec, members = hidet_entry()
    rec["dirs"] = ["/".join(["b" * 200] * 20)]
    arch = build_archive(tmp_path / "a.tar", [(rec, members)])
    verdicts = [kc("--cache-dir", tmp_path / "cache", "import", arch, *dry) for dry in (["--dry-run"], [])]
    assert [v.returncode for v in verdicts] == [1, 1]
    assert verdicts[0].stderr == verdicts[1].stderr and b"path limit" in verdicts[0].stderr
    assert not (tmp_path / "cache").exists()


# ---- the helpers themselves -------------------------------------------------------------------------

def test_fsread_refuses_what_is_not_a_regular_file(tmp_path):
    from kcache_cli.fs import read as fsread

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to("/etc/hostname")
    (tmp_path / "big").write_bytes(b"x" * 100)
    for name, kind in (("fifo", "a FIFO"), ("link", "a symlink")):
        with pytest.raises(fsread.NotRegularFile) as info:
            fsread.read_bytes(str(tmp_path / name), 10)
        assert info.value.kind == kind
    with pytest.raises(fsread.TooLarge):
        fsread.read_bytes(str(tmp_path / "big"), 10)
    assert fsread.read_bytes(str(tmp_path / "big"), 10, strict=False) == b"x" * 10
    assert fsread.sha256_file(str(tmp_path / "big")) == hashlib.sha256(b"x" * 100).hexdigest()
    (tmp_path / "sub").symlink_to(tmp_path)
    with pytest.raises(fsread.NotRegularFile):  # a directory link below the base is not followed
        fsread.read_bytes(str(tmp_path / "sub" / "big"), 1000, base=str(tmp_path))
    with pytest.raises(OSError) as info:
        fsread.read_bytes("/dev/null", 10, follow=True)
    assert info.value.errno == errno.EINVAL


def test_json_depth_counts_only_structure():
    from kcache_cli.fs.read import JsonTooDeep, json_depth, parse_json

    assert json_depth(b'{"a": "[[[[[[", "b": ["\\\\", {"c": "\\"]]]"}]}', 0) == 1
    assert json_depth(b'{"a": "[[[[[[", "b": ["\\\\", {"c": "\\"]]]"}]}', 10) <= 10
    doc = b'{"a": "[[[[[[[[", "b": [1, {"c": [2]}]}'
    assert json_depth(doc, 2) > 2
    assert json_depth(doc, 4) == 4
    assert parse_json(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(JsonTooDeep):
        parse_json(b"[" * 65 + b"]" * 65)
    with pytest.raises(JsonTooDeep):
        parse_json(b'{"a":' * 40 + b'[' * 40 + b'1' + b']' * 40 + b'}' * 40)


JSON_EDGES = [
    b'{"a": 1, "a": 2}', b"18446744073709551615", b"18446744073709551616", b"-9223372036854775808",
    b"-9223372036854775809", b"123456789012345678901234567890", b'{"n": 1234567890123456789012}',
    b'{"s": "1234567890123456789012"}', b"NaN", b"[Infinity, -Infinity]", b"1e400", b"-0.0", b"-0",
    b"2.2250738585072011e-308", b"0.1e1", b'"\\ud800"', b'"\xed\xa0\x80"', b"\xef\xbb\xbf{}",
    '{"a": 1}'.encode("utf-16"), b'"\\uD834\\uDD1E"', b'"a\x01b"', b'"\xff"', b"01", b"[1,]", b"{1: 2}",
    b"", b" \t\r\n[] ", b"\x0c[]", b"[]\x00", b'"\\x"', b'{"a": {"b": [true, false, null, 1.5]}}',
]


@pytest.mark.parametrize("text", JSON_EDGES)
def test_parse_json_gives_what_json_loads_gives(text):
    """parse_json's fast parse (orjson) may never answer otherwise than json.loads: the same value (floats
    and integers alike, NaN as NaN) or a ValueError where json.loads raises one."""
    import math

    from kcache_cli.fs.read import parse_json

    for data in (text, text.decode("utf-8", "surrogatepass")) if b"\xff" not in text and b"\x00" not in text[:2] \
            else (text,):
        try:
            want = json.loads(data)
        except ValueError:
            with pytest.raises(ValueError):
                parse_json(data)
            continue
        got = parse_json(data)
        assert repr(got) == repr(want) and type(got) is type(want)
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(got)


def test_printable():
    from kcache_cli.util.textsafe import printable, printable_line

    assert printable("plain\ttext\n") == "plain\ttext\n"
    assert printable("a\x1b[2Jb\x07\x7f\x9b\u202e\u2066\u200e\u061c\udcff") == \
        "a\\x1b[2Jb\\x07\\x7f\\x9b\\u202e\\u2066\\u200e\\u061c\\xff"
    assert printable_line("a\tb\nc\rd") == "a\\x09b\\x0ac\\x0dd"
    assert printable("héllo wörld ✓") == "héllo wörld ✓"


def test_a_directory_swapped_for_a_link_mid_run_is_not_read_through(fixture_copy, tmp_path):
    """Between the scan and the judgement (prune --broken judges again at delete time) `ops/cuda_space_0`
    becomes a link to a look-alike tree whose task.txt would not hash to the entry's name. The reads
    resolve from the root and refuse the link: the entry is never judged by the look-alike's files, so
    it cannot be called corrupt (and pruned) on their word."""
    from kcache_cli.catalog.scan import scan_cache
    from kcache_cli.ops.verify import judge_entry

    root = fixture_copy("hidet")
    entry = next(e for e in scan_cache(root).entries if e.relpath == ADD)
    assert judge_entry(root, entry).status == "complete"
    look_alike = tmp_path / "look-alike"
    (look_alike / "add/8d1f7691cdf75e90").mkdir(parents=True)
    for f in (root / ADD).iterdir():
        if f.is_file():
            (look_alike / "add/8d1f7691cdf75e90" / f.name).write_bytes(f.read_bytes())
    (look_alike / "add/8d1f7691cdf75e90/task.txt").write_text("precious")
    space = root / "ops/cuda_space_0"
    space.rename(tmp_path / "aside")
    space.symlink_to(look_alike)
    verdict = judge_entry(root, entry)
    assert "hashes to" not in (verdict.reason or "")
    assert verdict.status == "unreadable"  # never a status prune --broken deletes
    space.unlink()
    (tmp_path / "aside").rename(space)
    assert judge_entry(root, entry).status == "complete"


def test_a_space_or_op_named_by_selector_is_never_listed_through_a_link(fixture_copy, tmp_path):
    """ops/cuda_space_0 (and an op directory) swapped for links to a directory outside the cache: a
    selection naming them (--space, --op) lists nothing through them; no name from outside is shown."""
    root = fixture_copy("hidet")
    outside = tmp_path / "outside"
    (outside / "add" / "secret_name_outside").mkdir(parents=True)
    (root / "ops" / "cuda_space_0").rename(tmp_path / "moved")
    os.symlink(outside, root / "ops" / "cuda_space_0")
    os.symlink(outside, root / "ops" / "cpu_space_0" / "linked_op")
    for args in (["clear", "--space", "cuda_space_0", "--dry-run"], ["ls", "--space", "cuda_space_0"],
                 ["ls", "--op", "add"], ["ls", "--op", "linked_op", "--space", "cpu_space_0"],
                 ["clear", "--op", "linked_op", "--dry-run"], ["verify", "--op", "add"]):
        run = kc("--cache-dir", root, *args)
        assert b"Traceback" not in run.stderr, (args, run.stderr)
        assert b"secret_name_outside" not in run.stdout + run.stderr, (args, run.stdout, run.stderr)
    assert (outside / "add" / "secret_name_outside").is_dir()
    tilus = fixture_copy("tilus")
    os.symlink(outside, tilus / "scripts" / "linked_op")
    for args in (["ls", "--op", "linked_op"], ["clear", "--op", "linked_op", "--dry-run"]):
        run = kc("--cache-dir", tilus, *args)
        assert b"Traceback" not in run.stderr and b"secret_name_outside" not in run.stdout + run.stderr, args
