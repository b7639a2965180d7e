"""prune and clear: the exact entries each selector removes, on copies of the real caches and on
generated trees; dry runs that change nothing; links, locks, read-only parts and interrupted runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import state
from kcache_cli.fs.locking import EntryFlock
from kcache_cli.model.records import ScanFilter
from kcache_cli.ops import delete
from kcache_cli.ops.delete import parse_age, parse_size, plan_clear, plan_prune
from kcache_cli.util.errors import UsageError
from kcache_cli.util.units import format_size as human

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from gen_cache import generate  # noqa: E402

HIDET = {
    "softmax": "ops/cuda_space_0/softmax/ad252b064b266eea",
    "add": "ops/cuda_space_0/add/8d1f7691cdf75e90",
    "fused": "ops/cpu_space_0/fused/af3046266c6abdd1",
    "matmul": "ops/cpu_space_0/matmul/064b4a6c035246e8",
    "relu": "ops/cpu_space_0/relu/31857fe085635b31",
}
PROGRAM = "programs/f006237ca7a5"
SCRIPT = "scripts/add_one/1-845a0ed6"
KERNEL = "0.1.15/linux-x86_64/kernels/cb68ca6910905a22415eeff34244c6b161f51a79389abd03689b1d0f2155a46e"
BINARY = "0.1.15/cuda-binaries/4bc9129df33af894bfd1791f214310dc6766749861079ac4b7eafa97e565e687"
HOUR = 3600.0


# ---- helpers -------------------------------------------------------------------------------------
def listing(root: Path) -> dict:
    """Everything under root: type, size, mtime (ns), mode and link target. What a dry run must not change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_mode,
                                            os.readlink(p) if stat.S_ISLNK(st.st_mode) else None)
    return out


def entries(root: Path) -> set[str]:
    return {e.relpath for e in scan_cache(root).entries}


def removed_paths(run) -> set[str]:
    data = run.json()
    return {os.path.relpath(r["removed_path"], data["root"]) for r in data["removed"]}


def set_mtime(path: Path, ts: float) -> None:
    """Age a whole entry: every file, link and directory in it."""
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (ts, ts), follow_symlinks=False)
        os.utime(dirpath, (ts, ts))


ELF_HEAD = b"\x7fELF\x02\x01\x01" + b"\0" * 57  # a 64-bit ELF header with no section table: looks whole


def gen(tmp_path: Path, n: int, name: str = "gen") -> Path:
    """n generated hidet entries (bench/gen_cache.py), each complete (lib.so starts like an ELF file)."""
    root = tmp_path / name
    generate(str(root), n)
    for lib in root.glob("ops/*/*/*/lib.so"):
        data = lib.read_bytes()
        if not data.startswith(b"\x7fELF"):
            lib.write_bytes(ELF_HEAD + data[len(ELF_HEAD):])
    return root


@contextlib.contextmanager
def held_by_other_process(code: str, *args: str):
    """Run `code` (which takes a lock) in another process; it holds it until the block ends."""
    script = code + "\nprint('held', flush=True)\nsys.stdin.read()\n"
    p = subprocess.Popen([sys.executable, "-c", "import sys\n" + script, *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        assert p.stdout.readline().strip() == "held"
        yield p
    finally:
        p.stdin.close()
        p.wait(20)


def hold_kcache_lock(root: Path, relpath: str):
    return held_by_other_process("from kcache_cli.fs.locking import entry_lock\n"
                                 "lock = entry_lock(sys.argv[1], sys.argv[2]); lock.acquire()", str(root), relpath)


def hold_flock(path: Path):
    return held_by_other_process("import fcntl, os\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
                                 "fcntl.flock(fd, fcntl.LOCK_EX)", str(path))


@contextlib.contextmanager
def read_only(path: Path):
    """A directory nothing can be renamed out of: chmod for users, the immutable flag for root."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
            pytest.skip("running as root without chattr +i: cannot make a directory read-only")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)])
    else:
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)


# ---- parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [("10GB", 10 * 10**9), ("500M", 500 * 10**6), ("2GiB", 2 * 2**30),
                                        ("1.5k", 1500), ("4096B", 4096), ("0", 0), ("7 mb", 7 * 10**6),
                                        ("3Ti", 3 * 2**40), ("12b", 12)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "ten", "10XB", "-5G", "1e9", "10 G B", "4096"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


@pytest.mark.parametrize("text,value", [("30d", 30 * 86400), ("12h", 12 * 3600), ("90m", 5400), ("45s", 45),
                                        ("2w", 14 * 86400), ("1d12h", 36 * 3600), ("0s", 0)])
def test_parse_age(text, value):
    assert parse_age(text) == value


@pytest.mark.parametrize("text", ["", "30", "d", "3M", "1d-2h", "soon"])
def test_parse_age_rejects(text):
    with pytest.raises(UsageError):
        parse_age(text)


def test_bad_sizes_and_ages_are_usage_errors(kcache, fixture_copy):
    root = fixture_copy("hidet")
    for args in (["--max-size", "lots"], ["--older-than", "a while"]):
        r = kcache("--cache-dir", root, "prune", "--yes", *args)
        assert r.exit_code == 2 and r.stderr.startswith("Error: bad ") and "Traceback" not in r.stderr


# ---- clear on the real hidet cache ---------------------------------------------------------------
@pytest.mark.parametrize("args,gone", [
    (["--op", "softmax"], {"softmax"}),
    (["--op", "matmul", "--op", "relu"], {"matmul", "relu"}),
    (["--space", "cpu_space_0"], {"fused", "matmul", "relu"}),
    (["--target", "cuda"], {"softmax", "add"}),
    (["8d1f", "af30"], {"add", "fused"}),
    (["--space", "cuda_space_0", "--op", "add"], {"add"}),
    (["--layout", "hidet"], set(HIDET)),
    (["--all"], set(HIDET)),
    (["--layout", "tilus"], set()),
    (["--op", "nosuchop"], set()),
])
def test_clear_removes_exactly_the_selection(kcache, fixture_copy, args, gone):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "clear", *args, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == {HIDET[o] for o in gone}
    assert entries(root) == {HIDET[o] for o in set(HIDET) - gone}
    data = r.json()
    assert data["entry_count"] == len(gone) and data["dry_run"] is False
    assert data["freed"] == sum(x["size"] for x in data["removed"]) > 0 or not gone
    for o in gone:  # empty op directories go; a space keeps its other ops
        assert not (root / HIDET[o]).parent.exists()
    spaces = {HIDET[o].split("/")[1] for o in set(HIDET) - gone}
    assert {p.name for p in (root / "ops").iterdir()} == spaces
    assert not list((root / ".kcache" / "trash").iterdir()) if (root / ".kcache").exists() else True


def test_clear_needs_a_selection(kcache, fixture_copy):
    root = fixture_copy("hidet")
    before = listing(root)
    r = kcache("--cache-dir", root, "clear", "--yes")
    assert r.exit_code == 2 and "--all" in r.stderr
    assert listing(root) == before
    with pytest.raises(UsageError):
        plan_clear(root, ScanFilter())


def test_clear_without_a_terminal_refuses_unless_yes(kcache, fixture_copy):
    root = fixture_copy("hidet")
    before = listing(root)
    r = kcache("--cache-dir", root, "clear", "--op", "softmax", input="y\n")  # stdin is a pipe, not a terminal
    on_disk = subprocess.run(["du", "-sB1", str(root / HIDET["softmax"])], capture_output=True, text=True)
    assert r.exit_code == 2 and "--yes" in r.stderr and f"({int(on_disk.stdout.split()[0]):,} bytes)" in r.stderr
    assert listing(root) == before


def test_clear_asks_on_a_terminal(kcache, fixture_copy, monkeypatch):
    from kcache_cli.cli import cmd_delete

    root = fixture_copy("hidet")
    monkeypatch.setattr(cmd_delete, "_stdin_is_terminal", lambda: True)
    before = listing(root)
    r = kcache("--cache-dir", root, "clear", "--space", "cuda_space_0", input="n\n")
    assert r.exit_code == 1 and "nothing was removed" in r.stderr
    assert "ad252b064b266eea" in r.stderr and "2 entries" in r.stderr  # what would go is shown first
    assert listing(root) == before
    r = kcache("--cache-dir", root, "clear", "--space", "cuda_space_0", input="y\n")
    assert r.exit_code == 0, r.stderr
    assert entries(root) == {HIDET["fused"], HIDET["matmul"], HIDET["relu"]}
    assert "Removed 2 entries" in r.stdout and "bytes" in r.stdout


@pytest.mark.parametrize("layout", ["hidet", "tilus", "tilelang"])
@pytest.mark.parametrize("command", [["clear", "--all"], ["prune", "--yes", "--max-size", "0", "--older-than", "0s",
                                                          "--broken"]])
def test_dry_run_changes_nothing(kcache, fixture_copy, layout, command):
    root = fixture_copy(layout)
    # something for every rule: a stale temp dir, candidates/, a stale staging dir, a stamp
    if layout == "hidet":
        tmp = root / "ops/cuda_space_0/add/.kcache-tmp-8d1f7691cdf75e90-dead"
        tmp.mkdir()
        (tmp / "lib.so").write_bytes(b"x")
        (root / HIDET["relu"] / "candidates" / "0").mkdir(parents=True)
        (root / HIDET["relu"] / "candidates" / "0" / "lib.so").write_bytes(b"y" * 100)
        set_mtime(tmp, time.time() - 2 * HOUR)
    elif layout == "tilelang":
        st = root / "0.1.15/.staging/cuda-binaries/abc.1.ff"
        st.mkdir(parents=True)
        (st / "kernel.cubin").write_bytes(b"z")
        set_mtime(st, time.time() - 2 * HOUR)
    before = listing(root)
    r = kcache("--cache-dir", root, *command, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["dry_run"] is True and data["removed"] and data["freed"] > 0
    assert listing(root) == before  # not a byte, not an mtime; no .kcache/ either
    r = kcache("--cache-dir", root, *command, "--dry-run")
    assert r.exit_code == 0 and "Would remove" in r.stdout and "Nothing was changed" in r.stdout
    assert listing(root) == before


# ---- tilus: programs and the scripts that link to them ------------------------------------------
def test_tilus_program_linked_from_a_kept_script_is_kept(kcache, fixture_copy):
    root = fixture_copy("tilus")
    r = kcache("--cache-dir", root, "clear", "f006", "--yes", "--json")
    assert r.exit_code == 0
    assert removed_paths(r) == set()
    assert [s["relpath"] if "relpath" in s else os.path.relpath(s["path"], root) for s in r.json()["skipped"]] \
        == [PROGRAM]
    assert "kept script scripts/add_one/1-845a0ed6" in r.json()["skipped"][0]["why"]
    assert entries(root) == {PROGRAM, SCRIPT}


def test_tilus_script_and_its_programs_go_together(kcache, fixture_copy):
    root = fixture_copy("tilus")
    r = kcache("--cache-dir", root, "clear", "--op", "add_one", "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == {PROGRAM, SCRIPT}
    order = [os.path.relpath(x["removed_path"], root) for x in r.json()["removed"]]
    assert order.index(SCRIPT) < order.index(PROGRAM)  # no moment where a script links to nothing
    assert entries(root) == set()
    assert not (root / "scripts" / "add_one").exists() and (root / "scripts").is_dir()


def test_tilus_script_alone_leaves_its_program(kcache, fixture_copy):
    root = fixture_copy("tilus")
    r = kcache("--cache-dir", root, "clear", "1-845a", "--yes", "--json")
    assert removed_paths(r) == {SCRIPT}
    assert entries(root) == {PROGRAM}
    # the program, used by nothing now, can go on its own
    r = kcache("--cache-dir", root, "clear", "f006", "--yes", "--json")
    assert removed_paths(r) == {PROGRAM}


def test_tilus_broken_program_takes_its_scripts_along(kcache, fixture_copy):
    root = fixture_copy("tilus")
    (root / PROGRAM / "module" / "lib.so").unlink()
    r = kcache("--cache-dir", root, "prune", "--yes", "--broken", "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == {PROGRAM, SCRIPT}
    whys = {os.path.relpath(x["removed_path"], root): x["why"] for x in r.json()["removed"]}
    assert "f006237ca7a5" in whys[SCRIPT]  # its program is compiled again: so is the script (issue 22)


def test_broken_tilus_programs_walk_the_scripts_once(kcache, fixture_copy, monkeypatch):
    """Which scripts use each program is learnt once for every program selected (one walk of scripts/),
    not once for each broken one: 20,000 of them made `stats` 3.7 s where `ls` took 0.5."""
    from kcache_cli.layouts import tilus

    root = fixture_copy("tilus")
    for i in range(5):  # more broken programs (no lib.so), linked from nothing
        copy = root / "programs" / f"0000000000{i:02x}"
        shutil.copytree(root / PROGRAM, copy)
        (copy / "module" / "lib.so").unlink()
    (root / PROGRAM / "module" / "lib.so").unlink()
    walks: list[str] = []
    real = tilus.link_map
    monkeypatch.setattr(tilus, "link_map", lambda r: walks.append(str(r)) or real(r))
    r = kcache("--cache-dir", root, "prune", "--dry-run", "--broken", "--json")
    assert r.exit_code == 0, r.stderr
    assert len(r.json()["removed"]) == 7 and SCRIPT in {os.path.relpath(x["removed_path"], root) for x in
                                                       r.json()["removed"]}
    assert len(walks) == 1, walks


def test_tilus_program_lives_as_long_as_its_script_is_used(kcache, fixture_copy):
    root = fixture_copy("tilus")
    now = time.time()
    set_mtime(root / PROGRAM, now - 60 * 86400)
    set_mtime(root / SCRIPT, now - 3600)
    r = kcache("--cache-dir", root, "prune", "--yes", "--older-than", "30d", "--json")
    assert removed_paths(r) == set()
    set_mtime(root / SCRIPT, now - 40 * 86400)
    r = kcache("--cache-dir", root, "prune", "--yes", "--older-than", "30d", "--json")
    assert removed_paths(r) == {PROGRAM, SCRIPT}


def test_tilus_links_are_removed_as_links(kcache, fixture_copy, tmp_path):
    root = fixture_copy("tilus")
    outside = tmp_path / "outside-program"
    shutil.copytree(root / PROGRAM, outside)
    before = listing(outside)
    link = root / SCRIPT / "programs" / "1"
    os.symlink(outside, link)
    r = kcache("--cache-dir", root, "clear", "--all", "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert entries(root) == set() and not os.path.lexists(link)
    assert listing(outside) == before


# ---- tilelang: binaries the kernels embed --------------------------------------------------------
def test_tilelang_binary_embedded_in_a_kept_kernel_is_kept(kcache, fixture_copy):
    root = fixture_copy("tilelang")
    r = kcache("--cache-dir", root, "clear", "--space", "0.1.15/cuda-binaries", "--yes", "--json")
    assert r.exit_code == 0
    assert removed_paths(r) == set()
    assert "embedded in the kept kernel" in r.json()["skipped"][0]["why"]
    assert entries(root) == {KERNEL, BINARY}
    # the kernel goes first; then nothing holds the binary
    r = kcache("--cache-dir", root, "clear", "--space", "0.1.15/linux-x86_64", "--yes", "--json")
    assert removed_paths(r) == {KERNEL}
    r = kcache("--cache-dir", root, "clear", "--space", "0.1.15/cuda-binaries", "--yes", "--json")
    assert removed_paths(r) == {BINARY}
    assert (root / "0.1.15" / "cuda-binaries").is_dir()  # tilelang's own container stays


def test_tilelang_clear_all_removes_kernel_before_binary(kcache, fixture_copy):
    root = fixture_copy("tilelang")
    r = kcache("--cache-dir", root, "clear", "--all", "--yes", "--json")
    order = [os.path.relpath(x["removed_path"], root) for x in r.json()["removed"]]
    assert order == [KERNEL, BINARY]
    assert entries(root) == set()


def test_tilelang_binary_no_kernel_embeds_can_go(kcache, fixture_copy):
    from kcache_cli.layouts.tilelang import binary_users

    root = fixture_copy("tilelang")
    other = root / "0.1.15/cuda-binaries" / ("ab" * 32)
    other.mkdir()
    cubin = bytearray((root / BINARY / "kernel.cubin").read_bytes())
    cubin[200] ^= 0xFF  # same ELF header, different body: not the kernel's
    (other / "kernel.cubin").write_bytes(bytes(cubin))
    meta = json.loads((root / BINARY / "metadata.json").read_text())
    import hashlib

    meta.update(size=len(cubin), sha256=hashlib.sha256(cubin).hexdigest())
    (other / "metadata.json").write_text(json.dumps(meta))
    users = binary_users(root, [str(root / BINARY), str(other)])
    assert users == {str(root / BINARY): [str(root / KERNEL)], str(other): []}
    r = kcache("--cache-dir", root, "clear", "--space", "0.1.15/cuda-binaries", "--yes", "--json")
    assert removed_paths(r) == {str(other.relative_to(root))}


def test_tilelang_copies_of_one_binary_each_have_every_kernel_that_embeds_it(fixture_copy):
    """Binaries with the same bytes under several keys, kernels embedding them: each binary is used by every
    such kernel, listed once (the bytes are searched for once, not once per copy)."""
    from kcache_cli.layouts.tilelang import binary_users

    root = fixture_copy("tilelang")
    binaries = [root / BINARY] + [root / "0.1.15/cuda-binaries" / (c * 64) for c in "abc"]
    kernels = [root / KERNEL] + [(root / KERNEL).with_name(f"{c * 2}{(root / KERNEL).name[2:]}") for c in "de"]
    for copy in binaries[1:]:
        shutil.copytree(binaries[0], copy)
    for copy in kernels[1:]:
        shutil.copytree(kernels[0], copy)
    users = binary_users(root, [str(b) for b in binaries])
    assert users == {str(b): sorted(str(k) for k in kernels) for b in binaries}


def test_providers_sharing_one_list_of_users_each_keep_their_own_last_use(tmp_path):
    """Copies of one tilelang binary share one list of users (binary_users): the users' newest use counts
    for each of them, each provider's own use still its own (the list's newest is found once)."""
    from kcache_cli.model.records import Entry
    from kcache_cli.ops.delete import _Planner

    def entry(name: str, kind: str, used: float) -> Entry:
        return Entry("tilelang", kind, "cuda", None, None, name, str(tmp_path / name), name, 1, 1, "complete",
                     None, used, used, 1)

    old, mid, new = 1000.0, 2000.0, 3000.0
    kernel, gone = entry("k", "kernel", mid), str(tmp_path / "gone")
    binaries = [entry("a", "binary", old), entry("b", "binary", new), entry("c", "binary", old),
                entry("d", "binary", new)]
    p = _Planner(tmp_path, lambda m: None, new)
    used, unknown = [kernel.path], [gone]  # users a scan found, and one it did not
    p._users.update({binaries[0].path: used, binaries[1].path: used, binaries[2].path: unknown,
                     binaries[3].path: unknown})
    by_path = {e.path: e for e in (kernel, *binaries)}
    assert [p.effective_last_used(e, by_path) for e in binaries] == [mid, new, old, new]
    assert [p.effective_last_used(e, by_path) for e in reversed(binaries)] == [new, old, new, mid]


def test_a_cache_within_its_budget_weighs_no_users(fixture_copy, monkeypatch):
    """prune --max-size of a cache that fits (the usual cron run) removes nothing by age or size: it looks
    for no entry's users (reading every tilelang kernel's compiled files) and sorts nothing."""
    from kcache_cli.layouts import tilelang
    from kcache_cli.ops.delete import plan_prune

    root = fixture_copy("tilelang")
    asked: list[list[str]] = []
    real = tilelang.binary_users
    monkeypatch.setattr(tilelang, "binary_users", lambda r, paths: asked.append(paths) or real(r, paths))
    size = plan_prune(root).scanned_size
    assert not plan_prune(root, max_size=size).removals and asked == []
    over = plan_prune(root, max_size=0)
    assert asked == [[str(root / BINARY)]] and [r.relpath for r in over.removals] == [KERNEL, BINARY]


def test_tilelang_stale_staging_goes_fresh_stays(kcache, fixture_copy):
    root = fixture_copy("tilelang")
    staging = root / "0.1.15/.staging/cuda-binaries"
    old, new = staging / "k1.100.aa", staging / "k2.200.bb"
    for d in (old, new):
        d.mkdir(parents=True)
        (d / "kernel.cubin").write_bytes(b"\x7fELF" + b"0" * 100)
    set_mtime(old, time.time() - 2 * HOUR)
    kstage = root / "0.1.15/linux-x86_64/.staging/tmpkernel"
    kstage.mkdir(parents=True)
    (kstage / "executable.so").write_bytes(b"1" * 10)
    set_mtime(kstage, time.time() - 3 * HOUR)
    r = kcache("--cache-dir", root, "prune", "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == {str(old.relative_to(root)), str(kstage.relative_to(root))}
    assert new.is_dir() and staging.is_dir()  # a write in flight, and tilelang's container
    assert {x["what"] for x in r.json()["removed"]} == {"staging"}
    assert entries(root) >= {KERNEL, BINARY}


# ---- hidet: temp dirs, candidates/, broken entries -----------------------------------------------
def test_prune_always_removes_stale_temp_dirs_and_keeps_candidates(kcache, fixture_copy):
    """candidates/ stays: hidet keeps it on purpose under debug_cache_tuning, and removes it itself
    otherwise (issue 22)."""
    root = fixture_copy("hidet")
    op_dir = root / "ops/cuda_space_0/add"
    stale = op_dir / ".kcache-tmp-8d1f7691cdf75e90-0001"
    fresh = op_dir / ".kcache-tmp-1111222233334444-0002"  # a build in flight: its lock is held
    for d in (stale, fresh):
        d.mkdir()
        (d / "source.cu").write_text("// half a build")
    set_mtime(stale, time.time() - 2 * HOUR)
    cand = root / HIDET["relu"] / "candidates"
    (cand / "0").mkdir(parents=True)
    (cand / "0" / "lib.so").write_bytes(b"\0" * 5000)
    (cand / "1").mkdir()
    (cand / "1" / "lib.so").write_bytes(b"\0" * 3000)
    before_relu = scan_cache(root, ScanFilter(ops=("relu",))).entries[0]
    with EntryFlock(root, "ops/cuda_space_0/add/1111222233334444"):
        r = kcache("--cache-dir", root, "prune", "--yes", "--json")
        assert r.exit_code == 0, r.stderr
        assert removed_paths(r) == {str(stale.relative_to(root))}
        data = r.json()
        assert {x["what"] for x in data["removed"]} == {"temp"}
        # freed is disk usage (issue 32): the temp dir's own block and its file's
        assert data["freed"] >= len("// half a build") and data["freed"] % 512 == 0 and data["entry_count"] == 1
        assert fresh.is_dir() and (cand / "0" / "lib.so").is_file()
        assert data["skipped"] == []  # a write in flight is no candidate: never "kept" (cron mails nothing)
        quiet = kcache("--cache-dir", root, "-q", "prune", "--yes")
        assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "") and fresh.is_dir()
    after_relu = scan_cache(root, ScanFilter(ops=("relu",))).entries[0]
    assert after_relu.status == "complete" and after_relu.size == before_relu.size
    assert entries(root) - {str(fresh.relative_to(root))} == set(HIDET.values())


def _fresh_temp(root: Path, h: str = "1111222233334444", tag: str = "dead") -> tuple[Path, str]:
    """A kcache build temp dir just written to, in the add op directory; (it, its entry's relpath)."""
    tmp = root / f"ops/cuda_space_0/add/{state.TEMP_PREFIX}{h}-{tag}"
    tmp.mkdir()
    (tmp / "source.cu").write_text("// half a build")
    return tmp, f"ops/cuda_space_0/add/{h}"


@pytest.mark.parametrize("lock_file", [True, False])
@pytest.mark.parametrize("command", [["prune"], ["prune", "--broken"], ["clear", "--status", "partial", "--yes"]])
def test_a_killed_builds_temp_dir_goes_as_soon_as_its_lock_is_free(kcache, fixture_copy, command, lock_file):
    """A build killed a minute ago left its temp dir: ls and verify call it broken, and prune and clear kept
    it for an hour ("in flight"). A build makes its temp dir only once it holds the entry's lock and holds
    the lock until it publishes: a free lock (or none) means its build is gone, so it goes now."""
    root = fixture_copy("hidet")
    tmp, rel = _fresh_temp(root)
    if lock_file:  # the lock a killed build held: there, and free
        with EntryFlock(root, rel):
            pass
    assert [e["status"] for e in kcache("--cache-dir", root, "ls", "--status", "broken", "--json").json()["entries"]
            ] == ["partial"]
    assert kcache("--cache-dir", root, "verify").exit_code == 1
    r = kcache("--cache-dir", root, *command, "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == {str(tmp.relative_to(root))} and not tmp.exists(), r.stderr
    assert kcache("--cache-dir", root, "verify").exit_code == 0


@pytest.mark.parametrize("command", [["prune"], ["prune", "--broken"], ["clear", "--status", "building", "--yes"]])
def test_a_temp_dir_whose_build_holds_its_lock_is_kept_however_fresh(kcache, fixture_copy, command):
    root = fixture_copy("hidet")
    tmp, rel = _fresh_temp(root)
    with EntryFlock(root, rel):
        assert kcache("--cache-dir", root, "ls", "--json").json()["entries"][0]["status"] == "building"
        r = kcache("--cache-dir", root, *command, "--json")
        assert r.exit_code == 0 and removed_paths(r) == set() and tmp.is_dir(), r.stderr


def test_a_build_that_takes_the_lock_after_the_plan_keeps_its_temp_dirs(fixture_copy):
    """The race: prune planned a dead build's temp dir (its lock free), then a new build of the same entry
    took the lock and made its own temp dir. The executor holds the lock while it removes: both stay,
    the planned one kept with a word, the new one never a candidate."""
    root = fixture_copy("hidet")
    dead, rel = _fresh_temp(root)
    plan = plan_prune(root)
    assert [r.relpath for r in plan.removals] == [str(dead.relative_to(root))]
    with EntryFlock(root, rel):
        new, _ = _fresh_temp(root, tag="live")
        result = plan.execute()
    assert dead.is_dir() and new.is_dir() and not result.removed
    assert [s.why for s in result.skipped] == ["a kcache build holds its lock (in progress)"]


def test_prune_broken_says_what_it_keeps_that_ls_calls_broken(kcache, fixture_copy):
    """A write in flight (tilelang's fresh staging dir) shows as partial in `ls --status broken`, the list of
    what prune --broken removes: prune --broken kept it without a word. It says so; a bare prune (cron) does
    not."""
    root = fixture_copy("tilelang")
    st = root / "0.1.15/.staging/cuda-binaries/k2.200.bb"
    st.mkdir(parents=True)
    (st / "kernel.cubin").write_bytes(b"z")
    assert kcache("--cache-dir", root, "ls", "--status", "broken", "--json").json()["entry_count"] == 1
    r = kcache("--cache-dir", root, "prune", "--broken")
    assert r.exit_code == 0 and st.is_dir()
    assert [line for line in r.stderr.splitlines() if line.startswith("warning: kept")] == [
        f"warning: kept {st.relative_to(root)}: in flight: written to less than an hour ago"], r.stderr
    bare = kcache("--cache-dir", root, "-q", "prune")
    assert (bare.exit_code, bare.stderr) == (0, "") and st.is_dir()


def test_an_unreadable_entry_is_never_removed_by_prune_or_clear(kcache, fixture_copy):
    """docs/listing.md: `unreadable` (a permission problem, not damage) is never removed, by any prune
    or clear; a budget prune goes on to the next entry. (A lib.so of mode 000 is unreadable to the
    loader run as its owner, whoever runs kcache.)"""
    root = fixture_copy("hidet")
    lib = root / HIDET["relu"] / "lib.so"
    os.chmod(lib, 0)
    try:
        assert kcache("--cache-dir", root, "ls", "--json", "--op", "relu").json()["entries"][0]["status"] == \
            "unreadable"
        for args in (("clear", "--op", "relu", "--yes"), ("clear", "--all", "--yes"),
                     ("prune", "--max-size", "1B", "--yes")):
            r = kcache("--cache-dir", root, *args, "--json")
            assert r.exit_code == 0, (args, r.stderr)
            skipped = [s for s in r.json()["skipped"] if s["op"] == "relu"]
            assert [s["why"] for s in skipped] == [
                "lib.so is unreadable (mode 000: permission denied): never removed (fix its permissions first)"]
            assert lib.exists()
        assert entries(root) == {HIDET["relu"]}  # every other entry went
    finally:
        os.chmod(lib, 0o644)


def test_prune_skips_a_temp_dir_whose_build_holds_the_lock(kcache, fixture_copy):
    root = fixture_copy("hidet")
    tmp = root / "ops/cuda_space_0/add/.kcache-tmp-1111222233334444-abcd"
    tmp.mkdir()
    (tmp / "source.cu").write_text("//")
    set_mtime(tmp, time.time() - 5 * HOUR)  # old, but a build is still on it
    with hold_kcache_lock(root, "ops/cuda_space_0/add/1111222233334444"):
        r = kcache("--cache-dir", root, "prune", "--yes", "--json")
        assert r.exit_code == 0
        assert removed_paths(r) == set() and tmp.is_dir()
        assert r.json()["skipped"] == []  # a build in flight is no candidate: not said to be kept
        quiet = kcache("--cache-dir", root, "-q", "prune", "--yes")
        assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")  # cron mails nothing
        r = kcache("--cache-dir", root, "clear", str(tmp), "--yes", "--json")  # asked for by name: said
        assert tmp.is_dir() and "in progress" in r.json()["skipped"][0]["why"], r.stdout
    r = kcache("--cache-dir", root, "prune", "--yes", "--json")
    assert removed_paths(r) == {str(tmp.relative_to(root))}


def test_prune_broken_removes_partial_failed_and_corrupt(kcache, tmp_path):
    root = gen(tmp_path, 40)
    rels = sorted(entries(root))
    partial, failed, corrupt, empty = (root / rels[i] for i in (3, 7, 11, 15))
    (partial / "lib.so").unlink()
    (partial / "nvcc_output.txt").unlink()
    (failed / "lib.so").unlink()  # deleted after a good compile: hidet compiles it again (issue 22)
    for marker in ("version.txt", "compile.sh", "meta.json", "task.pickle", "func_types.pickle"):
        (corrupt / marker).unlink(missing_ok=True)  # kcache.json rules only while hidet's own files are absent
    (corrupt / "kcache.json").write_text(json.dumps({"files": {"lib.so": {"size": 1, "sha256": "0" * 64}}}))
    os.utime(corrupt / "kcache.json", (1_000_000, 1_000_000))  # lib.so changed after its manifest
    (empty / "lib.so").write_bytes(b"")
    statuses = {e.relpath: e.status for e in scan_cache(root).entries}
    assert [statuses[str(p.relative_to(root))] for p in (partial, failed, corrupt, empty)] == \
        ["partial", "partial", "corrupt", "partial"]  # hidet takes an emptied lib.so for none: compiles again
    r = kcache("--cache-dir", root, "prune", "--yes", "--broken", "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == {str(p.relative_to(root)) for p in (partial, failed, corrupt, empty)}
    assert all(x["why"].startswith("broken: ") for x in r.json()["removed"])
    assert {e.status for e in scan_cache(root).entries} == {"complete"}
    assert len(entries(root)) == 36


# ---- prune by age and by size on generated trees -------------------------------------------------
def test_prune_older_than_uses_last_used_stamps(kcache, tmp_path):
    root = gen(tmp_path, 24)
    now = time.time()
    rels = sorted(entries(root))
    old = set(rels[:10])
    for rel in rels:
        set_mtime(root / rel, now - (40 * 86400 if rel in old else 86400))
    stamped = rels[0]  # built long ago, but kcache resolved it an hour ago
    state.mark_used(root, stamped, now - HOUR)
    r = kcache("--cache-dir", root, "prune", "--yes", "--older-than", "30d", "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == old - {stamped}
    assert all(x["why"].startswith("unused for 40d") for x in r.json()["removed"])
    assert entries(root) == set(rels) - old | {stamped}
    # the stamps of removed entries go with them
    assert set(state.load_last_used(root)) == {stamped}


def test_prune_max_size_removes_least_recently_used_first(kcache, tmp_path):
    root = gen(tmp_path, 30)
    now = time.time()
    res = scan_cache(root)
    rels = sorted(e.relpath for e in res.entries)
    import random

    random.Random(7).shuffle(rels)
    for i, rel in enumerate(rels):  # rels[0] is the least recently used
        set_mtime(root / rel, now - (100 - i) * HOUR)
    state.mark_used(root, rels[1], now)  # used just now: it goes last
    sizes = {e.relpath: e.size for e in scan_cache(root).entries}
    total = sum(sizes.values())
    limit = total // 2
    order = [rels[0]] + rels[2:] + [rels[1]]
    expected, left = [], total
    for rel in order:
        if left <= limit:
            break
        expected.append(rel)
        left -= sizes[rel]
    r = kcache("--cache-dir", root, "prune", "--yes", "--max-size", f"{limit}B", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert [os.path.relpath(x["removed_path"], root) for x in data["removed"]] == expected
    assert data["size_after"] == left <= limit < left + sizes[expected[-1]]
    assert data["size_before"] == total and data["max_size"] == limit
    assert sum(e.size for e in scan_cache(root).entries) == left
    assert rels[1] not in expected


def test_prune_max_size_zero_empties_the_cache_but_not_builds(kcache, tmp_path):
    root = gen(tmp_path, 12)
    busy = sorted(entries(root))[5]
    with hold_kcache_lock(root, busy):
        r = kcache("--cache-dir", root, "prune", "--yes", "--max-size", "0", "--json")
    assert r.exit_code == 0, r.stderr
    assert entries(root) == {busy}
    assert [s["why"] for s in r.json()["skipped"]] == ["a kcache build holds its lock (in progress)"]
    r = kcache("--cache-dir", root, "prune", "--yes", "--max-size", "0", "--json")
    assert entries(root) == set() and {p.name for p in root.iterdir()} == {"ops", ".kcache"}
    assert list((root / "ops").iterdir()) == []  # empty op and space directories went too


def test_prune_prints_what_it_removed(kcache, tmp_path):
    root = gen(tmp_path, 6)
    r = kcache("--cache-dir", root, "prune", "--yes", "--max-size", "0")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["what", "layout", "space", "op", "hash", "size", "last", "used", "why"]
    assert all(line.split()[:2] == ["op", "hidet"] for line in lines[1:-1])
    assert len(lines) == 1 + 6 + 1
    assert lines[-1].startswith("Removed 6 entries, freed ") and "bytes" in lines[-1] and "limit 0 B" in lines[-1]


# ---- locks ---------------------------------------------------------------------------------------
def test_entry_whose_kcache_lock_is_held_is_not_removed(kcache, fixture_copy):
    root = fixture_copy("hidet")
    with hold_kcache_lock(root, HIDET["add"]):
        r = kcache("--cache-dir", root, "clear", "--all", "--yes", "--json")
    assert r.exit_code == 0
    assert removed_paths(r) == set(HIDET.values()) - {HIDET["add"]}
    assert entries(root) == {HIDET["add"]}
    assert r.json()["skipped"][0]["path"].endswith(HIDET["add"])


def test_entry_whose_hidet_lock_is_held_is_not_removed(kcache, fixture_copy):
    root = fixture_copy("hidet")
    with hold_flock(root / HIDET["matmul"] / ".lock"):
        r = kcache("--cache-dir", root, "clear", "--space", "cpu_space_0", "--yes", "--json")
    assert removed_paths(r) == {HIDET["fused"], HIDET["relu"]}
    assert "hidet holds the entry's .lock" in r.json()["skipped"][0]["why"]
    assert (root / HIDET["matmul"] / "lib.so").is_file()


def test_tilus_lock_held_keeps_script_and_so_its_program(kcache, fixture_copy):
    root = fixture_copy("tilus")
    with hold_flock(root / SCRIPT / ".lock"):
        r = kcache("--cache-dir", root, "clear", "--all", "--yes", "--json")
    assert removed_paths(r) == set()
    whys = sorted(s["why"] for s in r.json()["skipped"])
    assert whys == ["still used by scripts/add_one/1-845a0ed6, which was not removed",
                    "tilus holds the entry's .lock (in use)"]
    assert entries(root) == {PROGRAM, SCRIPT}


def test_held_lock_files_are_never_deleted(kcache, tmp_path):
    root = gen(tmp_path, 3)
    locks = state.locks_dir(root)
    locks.mkdir(parents=True)
    old = time.time() - 2 * HOUR
    held, idle, fresh = (locks / f"ops%2Fcpu_space_0%2Fgone{i}%2F00{i}.lock" for i in range(3))
    for p in (held, idle, fresh):
        p.touch()
    for p in (held, idle):
        os.utime(p, (old, old))
    with hold_flock(held):
        r = kcache("--cache-dir", root, "prune")
        assert r.exit_code == 0
        assert held.exists() and fresh.exists() and not idle.exists()


# ---- links and the edges of the cache ------------------------------------------------------------
def test_symlinks_inside_entries_are_removed_as_links(kcache, fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    outside = tmp_path / "precious"
    (outside / "sub").mkdir(parents=True)
    (outside / "data.bin").write_bytes(b"keep me" * 100)
    (outside / "sub" / "more.txt").write_text("and me")
    before = listing(outside)
    entry = root / HIDET["softmax"]
    os.symlink(outside, entry / "linked_dir")
    os.symlink(outside / "data.bin", entry / "linked_file")
    os.symlink(outside, entry / "candidates")  # not a real candidates/ dir: never followed, never pruned alone
    r = kcache("--cache-dir", root, "prune", "--yes", "--json")
    assert removed_paths(r) == set()
    r = kcache("--cache-dir", root, "clear", "--op", "softmax", "--yes")
    assert r.exit_code == 0, r.stderr
    assert not entry.exists()
    assert listing(outside) == before


def test_stray_symlinks_where_entries_belong(kcache, fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    outside = tmp_path / "elsewhere"
    gen(tmp_path, 4, "elsewhere")  # a whole cache outside, reachable only through links
    before = listing(outside)
    os.symlink(outside / "ops" / "cuda_space_1", root / "ops" / "cuda_space_1")  # a space that is a link
    some = next((outside / "ops" / "cuda_space_0").iterdir())
    os.symlink(some, root / "ops" / "cuda_space_0" / "linked_op")  # an op that is a link
    os.symlink(next(some.iterdir()), root / HIDET["add"].rsplit("/", 1)[0] / "0123456789abcdef")  # an entry
    # clear by space: the linked space is a link to remove, not a directory to empty
    r = kcache("--cache-dir", root, "clear", "--space", "cuda_space_1", "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert removed_paths(r) == {"ops/cuda_space_1"}
    assert [x["what"] for x in r.json()["removed"]] == ["link"]
    assert not os.path.lexists(root / "ops" / "cuda_space_1")
    assert listing(outside) == before
    # prune --broken removes the other links as links
    r = kcache("--cache-dir", root, "prune", "--yes", "--broken", "--json")
    assert removed_paths(r) == {"ops/cuda_space_0/linked_op", "ops/cuda_space_0/add/0123456789abcdef"}
    assert listing(outside) == before
    assert entries(root) == set(HIDET.values())


def test_entries_reached_through_a_link_are_never_followed(tmp_path, fixture_copy):
    """A plan made against entries reached through a symlinked directory refuses to act on them."""
    root = fixture_copy("hidet")
    outside = gen(tmp_path, 3, "elsewhere")
    before = listing(outside)
    os.symlink(outside / "ops" / "cuda_space_0", root / "ops" / "cuda_space_7")
    plan = plan_clear(root, ScanFilter(spaces=("cuda_space_7",)))
    links = [r for r in plan.removals if r.what == "link"]
    assert [r.relpath for r in links] == ["ops/cuda_space_7"] and len(plan.removals) == 1
    # even a plan that names them (built by hand) never reaches through the link
    from dataclasses import replace

    assert scan_cache(root, ScanFilter(spaces=("cuda_space_7",))).entries == ()  # never listed through it
    from kcache_cli.model.records import entry_with

    there = scan_cache(outside, ScanFilter(spaces=("cuda_space_0",))).entries
    assert len(there) == 3
    through = [entry_with(e, relpath=e.relpath.replace("cuda_space_0", "cuda_space_7"),
                          path=str(root / e.relpath.replace("cuda_space_0", "cuda_space_7"))) for e in there]
    forged = replace(plan, removals=tuple(
        __import__("kcache_cli.ops.delete", fromlist=["Removal"]).Removal(e, e.path, e.relpath, e.size, "entry", "x",
                                                                      lock=e.relpath) for e in through))
    result = forged.execute()
    assert result.removed == () and len(result.skipped) == 3
    assert all("symlink" in s.why for s in result.skipped)
    assert listing(outside) == before


def test_missing_cache_is_success(kcache, tmp_path):
    # A cache not made yet (KCACHE_DIR, or the default) is nothing to do; an explicit --cache-dir that is
    # missing is a typo (exit 2: tests/test_cli_terminal.py).
    missing = tmp_path / "nope"
    env = {"KCACHE_DIR": str(missing)}
    for args in (["prune", "--max-size", "1G"], ["clear", "--all", "--yes"], ["prune", "--dry-run"]):
        r = kcache(*args, "--json", env=env)
        assert r.exit_code == 0, r.stderr
        assert r.json()["exists"] is False and r.json()["removed"] == []
    r = kcache("prune", "--yes", env=env)
    assert r.exit_code == 0 and "nothing to remove" in r.stderr
    quiet = kcache("-q", "prune", "--max-size", "1G", env=env)  # cron: a mistyped variable is still said
    assert quiet.exit_code == 0 and quiet.stderr.startswith(f"warning: no cache at {missing}"), quiet
    assert not missing.exists()


def test_read_only_parts_are_reported_not_raised(kcache, fixture_copy):
    root = fixture_copy("hidet")
    op_dir = root / "ops/cpu_space_0/matmul"
    with read_only(op_dir):
        r = kcache("--cache-dir", root, "clear", "--all", "--yes", "--json")
        assert r.exit_code == 1
        assert "Traceback" not in r.stderr and "cannot remove" in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("Error: 1 item could not be removed")
        assert removed_paths(r) == set(HIDET.values()) - {HIDET["matmul"]}
        assert r.json()["errors"] and HIDET["matmul"] in r.json()["errors"][0]
    assert entries(root) == {HIDET["matmul"]}


def test_root_is_not_told_that_root_may_remove_it(kcache, fixture_copy):
    """An entry root's cron cannot remove (an immutable op directory): the error says why, and does not
    send root to its owner or root, the hint a member gets for another member's entry."""
    if os.geteuid() != 0:
        pytest.skip("root's message")
    root = fixture_copy("hidet")
    with read_only(root / "ops/cpu_space_0/matmul"):
        r = kcache("--cache-dir", root, "prune", "--max-size", "0B", "--yes")
    assert r.exit_code == 1 and f"cannot remove {root / HIDET['matmul']}: Operation not permitted" in r.stderr
    assert "its owner or root may remove it" not in r.stderr, r.stderr


def test_read_only_cache_is_one_error_line(kcache, fixture_copy):
    root = fixture_copy("hidet")
    with read_only(root):
        r = kcache("--cache-dir", root, "clear", "--all", "--yes")
        assert r.exit_code == 1 and "Traceback" not in r.stderr
        assert r.stderr.startswith("Error: cannot write to ") and len(r.stderr.strip().splitlines()) == 1
        r = kcache("--cache-dir", root, "prune")  # nothing to do: no need to write
        assert r.exit_code == 0, r.stderr
    assert entries(root) == set(HIDET.values())


def test_a_read_only_mount_with_nothing_to_remove_is_exit_0(kcache, fixture_copy, tmp_path):
    """A cache whose .kcache/ exists (a budget was set) mounted read-only: a prune that finds nothing to
    remove has nothing to write either, exit 0 as where no .kcache/ exists (a nightly cron prune of it
    mails nothing); one that would remove something is still exit 1, one line."""
    root = fixture_copy("hidet")
    assert kcache("--cache-dir", root, "config", "set", "max-age", "300d").exit_code == 0
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-o", "bind,ro", root, ro], capture_output=True).returncode:
        pytest.skip("needs root and a read-only bind mount")
    try:
        for args in (("prune",), ("prune", "--broken"), ("prune", "--stale")):
            r = kcache("--cache-dir", ro, "-q", *args)
            assert (r.exit_code, r.stdout, r.stderr) == (0, "", ""), (args, r.stderr)
        r = kcache("--cache-dir", ro, "prune", "--max-size", "0B", "--yes")
        assert r.exit_code == 1 and "Read-only file system" in r.stderr and len(r.stderr.splitlines()) == 1
    finally:
        subprocess.run(["umount", ro], check=True)
    assert entries(root) == set(HIDET.values())


def test_unreadable_parts_are_warnings(kcache, fixture_copy):
    if os.geteuid() == 0:
        pytest.skip("root reads every directory")
    root = fixture_copy("hidet")
    (root / "ops/cpu_space_0").chmod(0)
    try:
        r = kcache("--cache-dir", root, "prune", "--yes", "--max-size", "0", "--json")
    finally:
        (root / "ops/cpu_space_0").chmod(0o755)
    assert r.exit_code == 0 and "cannot read" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_unreadable_parts_are_warnings_for_a_user():
    """As root, run prune as `nobody` on a cache `nobody` owns, with one space directory mode 000: what it can
    read goes, what it cannot is a warning and listed as `unreadable`, and the prune to a size exits 1 (it
    cannot tell that the cache fits)."""
    import json
    import subprocess
    import sys
    import tempfile

    from conftest import FIXTURES, REPO, copy_tree

    base = Path(tempfile.mkdtemp(prefix="kcache-nobody-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        root = copy_tree(FIXTURES / "hidet", base / "cache")
        subprocess.run(["chown", "-R", "nobody:nogroup", str(root)], check=True)
        (root / "ops/cpu_space_0").chmod(0)
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from kcache_cli.cli.app import main; "
                f"main(['--cache-dir', {str(root)!r}, 'prune', '--yes', '--max-size', '0', '--json'])")
        proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                               "-c", code], capture_output=True, text=True, cwd=base,
                              env={**os.environ, "HOME": str(base)})
        if proc.returncode != 0 and not proc.stderr.startswith(("Error:", "warning:")):
            pytest.skip(f"nobody cannot run kcache from here: {proc.stderr.strip()[-200:]}")
        assert proc.returncode == 1, proc.stderr
        assert "cannot read" in proc.stderr and "Traceback" not in proc.stderr
        assert "Error: 1 directory of" in proc.stderr and "may still be over its max-size" in proc.stderr
        assert json.loads(proc.stdout)["unreadable"] == ["ops/cpu_space_0"]
        removed = {x["hash"] for x in json.loads(proc.stdout)["removed"]}
        assert removed == {"8d1f7691cdf75e90", "ad252b064b266eea"}  # the readable cuda space only
        (root / "ops/cpu_space_0").chmod(0o755)
        assert len(list((root / "ops/cpu_space_0").iterdir())) == 3
    finally:
        for dirpath, _, _ in os.walk(base):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(base, ignore_errors=True)


# ---- interrupted runs ----------------------------------------------------------------------------
def test_leftover_trash_is_emptied_by_the_next_prune(kcache, fixture_copy):
    root = fixture_copy("hidet")
    trash = state.trash_dir(root)
    left = trash / "4242-1" / "0-deadbeefdeadbeef"
    (left / "sub").mkdir(parents=True)
    (left / "lib.so").write_bytes(b"x" * 1000)
    os.symlink("/etc/passwd", left / "sub" / "link")
    build_fresh = trash / "build-0123-abcd"  # a rebuild replacing an entry right now
    build_fresh.mkdir()
    r = kcache("--cache-dir", root, "prune")
    assert r.exit_code == 0
    assert [p.name for p in trash.iterdir()] == ["build-0123-abcd"]
    assert os.path.exists("/etc/passwd")


def test_leftover_trash_is_counted_where_it_will_be_freed(kcache, fixture_copy):
    """A clear killed between moving entries to the trash and removing them left bytes that no entry holds:
    stats counts them reclaimable, prune --dry-run says it would empty them, prune says it did (apart from
    `freed`, the entries' bytes); a build's own fresh batch and what a link in the trash points at are not
    counted, nor removed."""
    root = fixture_copy("hidet")
    trash = state.trash_dir(root)
    left = trash / "4242-1" / "0-deadbeefdeadbeef"
    left.mkdir(parents=True)
    (left / "lib.so").write_bytes(os.urandom(300_000))
    os.symlink("/etc", left / "etc")
    (trash / "build-0123-abcd").mkdir()  # a rebuild replacing an entry right now
    (trash / "build-0123-abcd" / "big").write_bytes(os.urandom(500_000))
    du = subprocess.run(["du", "-sB1", str(trash / "4242-1")], capture_output=True, text=True, check=True)
    expected = int(du.stdout.split()[0])
    stats = kcache("--cache-dir", root, "--json", "stats").json()
    assert stats["reclaimable"]["trash"] == expected and stats["reclaimable"]["bytes"] >= expected
    assert "left in the trash by an interrupted run" in kcache("--cache-dir", root, "stats").stdout
    plan = kcache("--cache-dir", root, "--json", "prune", "--dry-run").json()
    assert plan["trash"] == expected and plan["freed"] == 0 and (left / "lib.so").exists()
    said = " ".join(kcache("--cache-dir", root, "prune").stdout.split())
    assert f"emptied {human(expected)} left in the trash by an interrupted prune or clear" in said, said
    assert [p.name for p in trash.iterdir()] == ["build-0123-abcd"] and os.path.isdir("/etc")
    assert kcache("--cache-dir", root, "--json", "prune", "--dry-run").json()["trash"] == 0


def test_killed_prune_leaves_whole_entries_and_the_next_one_finishes(tmp_path):
    root = gen(tmp_path, 150)
    cmd = [sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "prune", "--yes", "--max-size", "0", "-q"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=str(tmp_path))
    deadline = time.time() + 60
    trash = state.trash_dir(root)
    while time.time() < deadline and p.poll() is None:  # kill it once it has started removing
        if trash.is_dir() and any(trash.iterdir()):
            break
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    required = {"task.txt", "lib.so", "compile.sh", "func_types.pickle", "meta.json", "version.txt"}
    for e in scan_cache(root).entries:  # what is still in the cache is whole
        assert required <= set(os.listdir(e.path)), e.path
        assert e.status == "complete"
    r = subprocess.run(cmd[:-1] + ["--json"], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert entries(root) == set()
    assert list(trash.iterdir()) == []


# ---- the core without the CLI --------------------------------------------------------------------
def test_plan_is_frozen_and_is_the_dry_run(fixture_copy):
    root = fixture_copy("hidet")
    before = listing(root)
    plan = plan_prune(root, max_size=0)
    assert listing(root) == before
    assert plan.expected_freed_size == plan.scanned_size == sum(e.size for e in scan_cache(root).entries)
    assert plan.size_after == 0 and plan.entries == 5
    with pytest.raises(AttributeError):  # frozen (dataclasses.FrozenInstanceError)
        plan.removals = ()  # type: ignore[misc]
    result = plan.execute()
    assert result.freed == plan.expected_freed_size and result.entries == 5 and not result.errors
    assert entries(root) == set()


def test_clear_json_shape(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "clear", "--op", "add", "--yes", "--json")
    data = r.json()
    assert set(data) >= {"root", "exists", "dry_run", "removed", "skipped", "errors", "entry_count", "freed",
                         "size_before", "size_after", "warnings"}
    item = data["removed"][0]
    assert set(item) >= {"layout", "kind", "space", "op", "hash", "path", "removed_path", "size", "what", "why",
                         "status", "last_used"}
    assert item["what"] == "entry" and item["op"] == "add" and isinstance(item["size"], int)


def test_emptied_op_dir_stays_while_a_build_in_it_holds_its_lock(kcache, fixture_copy):
    root = fixture_copy("hidet")
    starting = "ops/cpu_space_0/relu/ffffffffffffffff"  # a build that has its lock and is about to mkdir
    with hold_kcache_lock(root, starting):
        r = kcache("--cache-dir", root, "clear", "--op", "relu", "--op", "softmax", "--yes", "--json")
    assert removed_paths(r) == {HIDET["relu"], HIDET["softmax"]}
    assert (root / "ops/cpu_space_0/relu").is_dir()
    assert not (root / "ops/cuda_space_0/softmax").exists()
    assert r.json()["removed_dirs"] == [str(root / "ops/cuda_space_0/softmax")]


def test_entry_changed_since_the_scan_is_kept(fixture_copy):
    root = fixture_copy("hidet")
    plan = plan_clear(root, ScanFilter(ops=("add", "relu")))
    (root / HIDET["add"] / "dispatch_table.txt").write_text("used just now")  # hidet using the entry
    result = plan.execute()
    assert [r.relpath for r in result.removed] == [HIDET["relu"]]
    assert [(s.entry.relpath, s.why) for s in result.skipped] == \
        [(HIDET["add"], "changed since the scan (in use, or rebuilt)")]


def test_broken_is_checked_again_before_removing(tmp_path):
    root = gen(tmp_path, 4)
    victim = root / sorted(entries(root))[0]
    lib = (victim / "lib.so").read_bytes()
    (victim / "lib.so").unlink()
    plan = plan_prune(root, broken=True)
    assert [r.relpath for r in plan.removals] == [str(victim.relative_to(root))]
    (victim / "lib.so").write_bytes(lib)  # the build finished after the scan
    os.utime(victim, (0, 0))  # (and did not touch the directory's own mtime)
    result = plan.execute()
    assert result.removed == () and [s.why for s in result.skipped] == ["complete by now (finished after the scan)"]
    assert victim.is_dir()


def test_a_second_prune_waits_for_the_first(fixture_copy, tmp_path):
    root = fixture_copy("hidet")
    locks = state.locks_dir(root)
    locks.mkdir(parents=True)
    (locks / ".gc.lock").touch()
    with hold_flock(locks / ".gc.lock"):
        p = subprocess.Popen([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "clear", "--op", "add",
                              "--yes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
        line = p.stderr.readline()
        assert "waiting for another prune or clear" in line
        assert p.poll() is None and (root / HIDET["add"]).is_dir()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert not (root / HIDET["add"]).exists() and "Removed 1 entry" in out


@pytest.mark.parametrize("where", ["ops/cuda_space_0/nl\nop/0123456789abcdef", "ops/cuda_space_0/add/zzz"])
def test_an_entry_kcache_never_removes_is_never_listed_complete(kcache, fixture_copy, where):
    """A copy of a whole entry under a name hidet never makes (an op name with a newline, a hash that is
    not 16 hex digits): ls and verify called it complete, while prune and clear left it alone as not
    hidet-shaped. One verdict everywhere: corrupt, saying kcache never removes it."""
    root = fixture_copy("hidet")
    src = next(root.glob("ops/cuda_space_0/add/*"))
    shutil.copytree(src, root / where)
    [row] = [e for e in kcache("--cache-dir", root, "ls", "--json").json()["entries"] if e["path"] == str(root / where)]
    assert row["status"] == "corrupt" and "never removes it" in row["reason"], row
    verify = kcache("--cache-dir", root, "verify")
    assert verify.exit_code == 1 and "never removes it" in verify.stdout + verify.stderr
    plan = kcache("--cache-dir", root, "prune", "--broken", "--dry-run", "--json").json()
    assert str(root / where) not in {r["path"] for r in plan["removed"]}
    assert (root / where).is_dir()


def test_hard_linked_files_count_once_as_du_counts_them(kcache, tmp_path):
    """Ten entries whose lib.so are one 2 MB file under ten names: the cache's size is what du counts (each
    inode once), not ten times it, and a budget above it removes nothing (it removed 9 entries, "freeing"
    18 MB of which 0.3 MB were real)."""
    root = gen(tmp_path, 10)
    big = tmp_path / "big.so"
    big.write_bytes(ELF_HEAD + os.urandom(2 << 20))
    for lib in root.glob("ops/*/*/*/lib.so"):
        lib.unlink()
        os.link(big, lib)
    big.unlink()
    entry_dirs = [str(p) for p in root.glob("ops/*/*/*")]
    du = int(subprocess.run(["du", "-sc", "--block-size=1", *entry_dirs], capture_output=True, text=True,
                            check=True).stdout.split()[-2])
    listed = kcache("--cache-dir", root, "ls", "--json", "--no-index").json()["entries"]
    total = sum(e["size"] for e in listed)
    assert abs(total - du) < 100, (total, du)
    stats = kcache("--cache-dir", root, "stats", "--json", "--no-index").json()
    assert abs(stats["size"] - du) < 100 + 64 * 1024, (stats["size"], du)  # (plus the op and space directories)
    run = kcache("--cache-dir", root, "prune", "--max-size", f"{total + 4096}B", "--yes", "--json")
    assert run.exit_code == 0 and run.json()["removed"] == [], run.stdout


def test_a_prune_that_waited_plans_again_under_the_lock(fixture_copy, tmp_path):
    """A budget prune planned, then waited for another prune or clear, which meanwhile brought the cache
    under the budget: it plans again holding the lock and removes nothing (it removed what it had planned,
    and said the cache went from the old size to the limit)."""
    root = fixture_copy("hidet")
    plan = plan_prune(root, max_size=1)
    sizes = {r.relpath: r.size for r in plan.removals}
    budget = plan.scanned_size - min(sizes.values()) // 2  # one entry has to go
    first = plan_prune(root, max_size=budget).removals[0].relpath
    locks = state.locks_dir(root)
    locks.mkdir(parents=True)
    (locks / ".gc.lock").touch()
    with hold_flock(locks / ".gc.lock"):
        p = subprocess.Popen([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "prune", "--max-size",
                              f"{budget}B", "--yes", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=str(tmp_path))
        assert "waiting for another prune or clear" in p.stderr.readline()
        other = next(r for r in sorted(sizes) if r != first)
        shutil.rmtree(root / other)  # the other run's work, done under its lock
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["removed"] == [] and (root / first).is_dir(), doc
    assert doc["size_before"] == plan.scanned_size - sizes[other] and doc["size_after"] <= budget
    assert any("planned again under the gc lock, 1 of the 1 removals planned are no longer needed" in w
               for w in doc["warnings"]), doc["warnings"]


def test_an_entry_removed_while_the_scan_runs_is_gone_not_unreadable(fixture_copy, monkeypatch):
    """Another prune removed an entry between the listing and its judgement: it is no entry (no warning,
    not counted as a directory the prune could not read, so a budget prune does not fail for it)."""
    from kcache_cli.catalog.scan_context import ScanContext

    root = fixture_copy("hidet")
    victim = str(sorted(root.glob("ops/*/*/*"))[0])
    opened = ScanContext.open_entry

    def removed_first(self, path):
        if path == victim:
            shutil.rmtree(path)
        return opened(self, path)

    monkeypatch.setattr(ScanContext, "open_entry", removed_first)
    warned: list[str] = []
    plan = plan_prune(root, max_size=1 << 40, warn=warned.append)
    assert plan.unreadable == () and warned == [], (plan.unreadable, warned)
    assert victim not in {r.path for r in plan.removals}


def test_a_prune_plans_again_when_another_ran_since_it_planned(fixture_copy):
    """The other prune ran and finished while this one was still scanning or asking (no wait for the lock):
    what it removed is seen under the lock all the same, and what the budget no longer needs stays."""
    root = fixture_copy("hidet")
    sizes = {r.relpath: r.size for r in plan_prune(root, max_size=1).removals}
    budget = plan_prune(root, max_size=1).scanned_size - min(sizes.values()) // 2  # one entry has to go
    plan = plan_prune(root, max_size=budget)
    [first] = [r.relpath for r in plan.removals]
    other = next(r for r in sorted(sizes) if r != first)
    done = plan_clear(root, ScanFilter(paths=(other,))).execute()
    assert [r.relpath for r in done.removed] == [other]
    result = plan.execute()
    assert result.removed == () and (root / first).is_dir() and result.planned is not None
    assert any("planned again under the gc lock" in w for w in result.warnings)


def test_a_prune_that_had_to_keep_entries_in_use_says_it_is_still_over(kcache, fixture_copy):
    """An entry held by its writer (hidet's .lock) is kept; the prune then ends over its limit, and says so."""
    import fcntl

    root = fixture_copy("hidet")
    held = sorted(root.glob("ops/*/*/*"))[0]
    fd = os.open(held / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = kcache("--cache-dir", root, "prune", "--max-size", "100K", "--yes")
    finally:
        os.close(fd)
    assert r.exit_code == 0, r.stderr
    assert held.is_dir() and "still" in r.stderr and "over its limit: 1 entry planned to go was kept" in r.stderr


def test_entries_another_prune_removed_meanwhile_are_no_warning(fixture_copy, capsys):
    """Two prunes at once: what the other one removed first is "already gone", said once as news, not as
    a warning per entry that was "kept" (cron mails every warning)."""
    from kcache_cli.cli import cmd_delete
    from kcache_cli.cli.options import GlobalOptions

    root = fixture_copy("hidet")
    plan = plan_clear(root, ScanFilter(ops=("add", "relu")))
    assert len(plan.removals) == 2
    shutil.rmtree(plan.removals[0].entry.path)  # the other prune was first
    result = plan.execute()
    assert [s.why for s in result.skipped] == [delete.ALREADY_GONE] and len(result.removed) == 1
    capsys.readouterr()
    cmd_delete._result_human(cmd_delete._Out(GlobalOptions(), False), plan, result, {"max_size": None}, [])
    err = capsys.readouterr().err
    assert "warning" not in err and "1 entry planned to go was already gone" in err, err


def test_the_last_line_groups_the_digits_of_its_count(kcache, tmp_path):
    """"Removed 1,000 entries", as verify says "checked 1,000 entries" and the docs say counts read."""
    root = gen(tmp_path, 1000)
    dry = kcache("--cache-dir", root, "clear", "--all", "--dry-run")
    assert dry.stdout.splitlines()[-1].startswith("Would remove 1,000 entries and free "), dry.stdout
    done = kcache("--cache-dir", root, "clear", "--all", "--yes")
    assert done.exit_code == 0 and done.stdout.splitlines()[-1].startswith("Removed 1,000 entries, freed ")


_NO_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_an_unreadable_op_directory_is_said_once_and_for_what_it_is(fixture_copy, tmp_path):
    """Root without its DAC capabilities, as a user meets a mode-000 op directory: prune --broken says it
    cannot read it once (its passes each met it), and export leaves it out as unreadable, not as a stray."""
    root = fixture_copy("hidet")
    op = root / "ops" / "cuda_space_0" / "softmax"
    op.chmod(0)
    try:
        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*_NO_DAC, sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), *args],
                                  capture_output=True, text=True, timeout=120)

        probe = run("ls")
        if "cannot read" not in probe.stderr:
            pytest.skip(f"DAC capabilities not dropped here: {probe.stderr[-200:]}")
        prune = run("prune", "--broken", "--dry-run")
        assert prune.returncode == 0 and prune.stderr.count(f"cannot read {op}") == 1, prune.stderr
        export = run("export", str(tmp_path / "a.tar"))
        assert export.returncode == 0, export.stderr
        assert "left out ops/cuda_space_0/softmax: cannot read the directory" in export.stderr
        assert "none of them is exported" in export.stderr and "stray" not in export.stderr
    finally:
        op.chmod(0o755)
