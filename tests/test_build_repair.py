"""`kcache build --repair`: a real hidet entry's lib.so rebuilt in place from its own source.cc and the
command in its compile.sh (real g++, real hidet 0.6.1 in the oracle venv as the judge), and a hostile
compile.sh refused before anything runs (fake programs on PATH and at the named paths leave a marker if
they ever run)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from loaders.matrix import run_probe
from loaders.venvs import python_for

from kcache_cli.ops import repair

HERE = Path(__file__).resolve().parent
MATMUL = "ops/cpu_space_0/matmul/064b4a6c035246e8"  # what make_hidet.py compiles with hidet 0.6.1
SOFTMAX = "ops/cuda_space_0/softmax/ad252b064b266eea"  # the real fixture's cuda entry (nvcc, sm_90a)
RELU = "ops/cpu_space_0/relu/31857fe085635b31"  # the real fixture's cpu entry


@pytest.fixture(scope="module")
def hidet_made(tmp_path_factory):
    """A cache real hidet made (g++), its task pickles, and the hidet venv's python."""
    python = python_for("hidet")
    base = tmp_path_factory.mktemp("repair-src")
    done = subprocess.run([str(python), str(HERE / "loaders" / "make_hidet.py"), str(base / "cache"),
                           str(base / "tasks")], capture_output=True, text=True, env=dict(os.environ, HOME=str(base)),
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (base / "cache" / MATMUL / "lib.so").is_file()
    return base / "cache", python


def _snapshot(entry: Path) -> dict[str, str]:
    """sha256 of every file in the entry but lib.so (hidet's metadata must come out byte-identical)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(entry.iterdir())
            if p.name != "lib.so"}


def _damage(lib: Path, how: str) -> None:
    if how == "missing":
        lib.unlink()
    elif how == "truncated":
        os.truncate(lib, lib.stat().st_size // 3)
    elif how == "empty":
        os.truncate(lib, 0)


def _output(python: Path, root: Path, entry: str) -> dict:
    done = subprocess.run([str(python), str(HERE / "loaders" / "hidet_output.py"), str(root), entry],
                          capture_output=True, text=True, env=dict(os.environ, HOME=str(root.parent)), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # hidet's venv: its headers and loader
@pytest.mark.parametrize("how", ["missing", "truncated", "empty"])
def test_repair_makes_a_damaged_entry_a_hidet_hit(hidet_made, tmp_path, kcache, how):
    source, python = hidet_made
    root = tmp_path / "cache"
    shutil.copytree(source, root, symlinks=True)
    entry = root / MATMUL
    before = _snapshot(entry)
    _damage(entry / "lib.so", how)
    # first what hidet does without the repair (in a directory of its own: the probe's events file sits beside)
    assert run_probe("hidet", python, _copy(root, tmp_path / "before" / "cache"), MATMUL, source).verdict != "hit"

    r = kcache("--cache-dir", root, "--json", "build", "--repair", "064b4a6c")
    assert r.exit_code == 0, r.stdout + r.stderr
    (done,) = r.json()["entries"]
    assert done["status"] == "repaired" and done["relpath"] == MATMUL, done
    assert _snapshot(entry) == before  # task.txt, version.txt, meta.json, func_types.pickle, compile.sh...
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # the temp dir is gone
    verdict = run_probe("hidet", python, root, MATMUL, source)
    assert verdict.verdict == "hit" and "loaded and ran" in verdict.detail, verdict
    got, want = _output(python, root, MATMUL), _output(python, source, MATMUL)
    assert not got["compiled"]
    assert got["out"] == pytest.approx(want["out"]) and got["out"] == pytest.approx(got["ref"], rel=1e-4, abs=1e-4)


def _copy(root: Path, dest: Path) -> Path:
    shutil.copytree(root, dest, symlinks=True)
    return dest


@pytest.mark.slow  # hidet's venv: its headers and loader
def test_a_whole_lib_so_is_left_alone_unless_forced(hidet_made, tmp_path, kcache):
    source, _ = hidet_made
    root = _copy(source, tmp_path / "cache")
    lib = root / MATMUL / "lib.so"
    ino = lib.stat().st_ino
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "064b")
    assert r.exit_code == 0 and r.json()["entries"][0]["status"] == "fine"
    assert lib.stat().st_ino == ino
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "064b", "--force")
    assert r.exit_code == 0 and r.json()["entries"][0]["status"] == "repaired", r.stdout + r.stderr
    assert lib.stat().st_ino != ino and lib.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.slow  # hidet's venv: its headers and loader
def test_an_output_named_outside_goes_to_the_temp_dir(hidet_made, tmp_path, kcache):
    """compile.sh's `-o` is never used: the compiler writes the temp directory's lib.so."""
    source, _ = hidet_made
    root = _copy(source, tmp_path / "cache")
    script = root / MATMUL / "compile.sh"
    outside = tmp_path / "outside.so"
    script.write_text(script.read_text().replace(f"-o {source / MATMUL / 'lib.so'}", f"-o {outside}"))
    (root / MATMUL / "lib.so").unlink()
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "064b")
    assert r.exit_code == 0 and r.json()["entries"][0]["status"] == "repaired", r.stdout + r.stderr
    assert not outside.exists() and (root / MATMUL / "lib.so").stat().st_size > 1000


# ---- hostile compile.sh: refused, and nothing runs ---------------------------------------------------

def _fakes(tmp_path: Path, marker: Path) -> Path:
    """A bin/ of fake programs, each of which leaves `marker` if it ever runs."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("rm", "sh", "bash", "python3", "env", "ccache", "cc1plus", "touch", "curl", "g++", "nvcc"):
        fake = bin_dir / name
        fake.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 0\n")
        fake.chmod(0o755)
    return bin_dir


HOSTILE = {
    "rm -rf": "rm -rf /",
    "sh -c": "sh -c 'g++ -shared {src} -o {lib}; touch {marker}'",
    "bash script": "bash {marker}.sh",
    "a program outside the allow-list": "python3 -c 'import os' {src}",
    "env wrapper": "/usr/bin/env g++ -shared {src} -o {lib}",
    "ccache wrapper": "ccache g++ -shared {src} -o {lib}",
    "an input outside the entry": "g++ -shared /etc/passwd -o {lib}",
    "another entry's source": "g++ -shared {other} -o {lib}",
    "two inputs": "g++ -shared {src} {src} -o {lib}",
    "a chained command": "g++ -shared {src} -o {lib} ; touch {marker}",
    "command substitution": "g++ -shared $(touch {marker}) {src} -o {lib}",
    "two lines": "g++ -shared {src} -o {lib}\ntouch {marker}",
    "-wrapper": "g++ -wrapper {fakebin}/touch,{marker} -shared {src} -o {lib}",
    "-B": "g++ -B{fakebin} -shared {src} -o {lib}",
    "-fplugin": "g++ -fplugin={marker}.so -shared {src} -o {lib}",
    "-specs": "g++ -specs={marker}.specs -shared {src} -o {lib}",
    "a response file": "g++ @{marker}.rsp {src} -o {lib}",
    "-Xcompiler -wrapper": "nvcc -Xcompiler -wrapper,{fakebin}/touch -shared {src} -o {lib}",
    "-ccbin": "nvcc -ccbin {fakebin}/g++ --shared {src} -o {lib}",
    "-Wl,--plugin": "g++ -Wl,--plugin={marker}.so -shared {src} -o {lib}",
    "-fuse-ld": "g++ -fuse-ld={fakebin}/touch -shared {src} -o {lib}",
    "-Xlinker": "g++ -Xlinker -Map={marker} -shared {src} -o {lib}",
    "-MF": "g++ -MD -MF {marker} -shared {src} -o {lib}",
    "--run": "nvcc --run {src}",
    "unbalanced quote": "g++ -shared '{src} -o {lib}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_compile_sh_is_refused_and_nothing_runs(fixture_copy, tmp_path, kcache, name):
    root = fixture_copy("hidet")
    marker = tmp_path / "ran"
    fakebin = _fakes(tmp_path, marker)
    entry = root / RELU
    (entry / "lib.so").unlink()
    command = HOSTILE[name].format(src=entry / "source.cc", lib=entry / "lib.so", marker=marker, fakebin=fakebin,
                                   other=root / "ops/cpu_space_0/matmul/064b4a6c035246e8/source.cc")
    (entry / "compile.sh").write_text(f"#!/bin/bash\n\n{command}\n")
    before = _snapshot(entry)
    env = {"PATH": f"{fakebin}:{os.environ['PATH']}"}
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "3185", env=env)
    assert r.exit_code == 1, r.stdout + r.stderr
    (done,) = r.json()["entries"]
    assert done["status"] == "failed" and done["error"].startswith("refused, nothing ran:"), done
    assert "Traceback" not in r.stderr and len(done["error"].splitlines()) == 1
    assert not marker.exists(), marker.read_text()
    assert not (entry / "lib.so").exists() and _snapshot(entry) == before
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temp dir was even made


def test_the_program_compile_sh_names_never_runs(fixture_copy, tmp_path, kcache):
    """`/somewhere/g++` passes by its basename, but the g++ on PATH (or --cxx) runs, never that file."""
    root = fixture_copy("hidet")
    marker = tmp_path / "ran"
    fakebin = _fakes(tmp_path, marker)
    entry = root / RELU
    (entry / "lib.so").unlink()
    script = entry / "compile.sh"
    script.write_text(script.read_text().replace("/usr/bin/g++", f"{fakebin}/g++"))
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "3185")
    (done,) = r.json()["entries"]
    assert not marker.exists(), marker.read_text()
    assert done["command"].startswith(shutil.which("g++") or "g++"), done  # the real one: it fails on the
    assert done["status"] == "failed" and "exit status" in done["error"]  # fixture's /opt include paths


def test_hidets_own_commands_are_accepted(fixture_copy):
    root = fixture_copy("hidet")
    for rel, src, target in ((RELU, "source.cc", "cpu"), (SOFTMAX, "source.cu", "cuda")):
        argv, got = repair.parse_script((root / rel / "compile.sh").read_text(), rel, src)
        assert got == target and os.path.basename(argv[0]) in ("g++", "nvcc")
        assert "-o" not in argv and not any(a.endswith(src) for a in argv)


def test_usage_errors(fixture_copy, kcache):
    root = fixture_copy("hidet")
    for args in (["--repair", "zz"], ["--repair", "ffff0000"], ["--repair", "3185", "--", "-O0"]):
        r = kcache("--cache-dir", root, "build", *args)
        assert r.exit_code == 2 and "Traceback" not in r.stderr, (args, r.stdout, r.stderr)


@pytest.mark.slow  # hidet's venv: its headers and loader
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_cuda_entry_that_lacks_an_arch_is_rebuilt_for_it(fixture_copy, tmp_path, kcache):
    """The real softmax entry holds sm_90a; `--arch sm_80` rebuilds it with nvcc, adding that arch. Its
    compile.sh is pointed at the hidet venv's headers and a stub libcuda (no driver here)."""
    from kcache_cli.formats.binary import read_binary

    python = python_for("hidet")
    hidet_dir = Path(subprocess.run([str(python), "-c", "import hidet, os; print(os.path.dirname(hidet.__file__))"],
                                    capture_output=True, text=True, check=True).stdout.strip())
    stub = tmp_path / "stub"
    stub.mkdir()
    src = stub / "cuda.c"
    src.write_text("int cuda_stub;\n")
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(stub / "libcuda.so")], check=True)
    root = fixture_copy("hidet")
    entry = root / SOFTMAX
    script = entry / "compile.sh"
    script.write_text(script.read_text().replace("/opt/kernels/hidet/venv/lib/python3.11/site-packages/hidet",
                                                 str(hidet_dir)).replace(" -lcuda ", f" -L{stub} -lcuda "))
    before = _snapshot(entry)
    assert read_binary(entry / "lib.so").archs == ("sm_90a",)
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "ad25", "--arch", "sm_80")
    (done,) = r.json()["entries"]
    assert r.exit_code == 0 and done["status"] == "repaired", done
    assert "lacks sm_80" in done["reason"]
    assert set(read_binary(entry / "lib.so").archs) == {"sm_80", "sm_90a"}
    assert _snapshot(entry) == before
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "ad25", "--arch", "sm_80")
    assert r.json()["entries"][0]["status"] == "fine"


# ---- links, FIFOs and locks ---------------------------------------------------------------------------

@pytest.mark.slow  # hidet's venv: its headers and loader
def test_a_lib_so_link_is_replaced_never_written_through(hidet_made, tmp_path, kcache):
    source, _ = hidet_made
    root = _copy(source, tmp_path / "cache")
    outside = tmp_path / "outside.so"
    outside.write_bytes(b"not mine")
    lib = root / MATMUL / "lib.so"
    lib.unlink()
    lib.symlink_to(outside)
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "064b")
    (done,) = r.json()["entries"]
    assert r.exit_code == 0 and done["status"] == "repaired" and "not a regular file" in done["reason"], done
    assert outside.read_bytes() == b"not mine"
    assert not lib.is_symlink() and lib.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_source_that_is_not_a_regular_file_is_refused(fixture_copy, tmp_path, kcache, kind):
    root = fixture_copy("hidet")
    entry = root / RELU
    (entry / "lib.so").unlink()
    secret = tmp_path / "secret.cc"
    secret.write_text("int leaked = 1;\n")
    (entry / "source.cc").unlink()
    if kind == "link":
        (entry / "source.cc").symlink_to(secret)
    else:
        os.mkfifo(entry / "source.cc")
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "3185")
    (done,) = r.json()["entries"]
    assert r.exit_code == 1 and done["status"] == "failed" and done["error"].startswith("refused"), done
    assert not (entry / "lib.so").exists()
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # its temp dir was removed


@pytest.mark.parametrize("name", ["source.cc", "compile.sh"])
def test_another_users_source_is_never_compiled(fixture_copy, tmp_path, kcache, name):
    """The compiler runs with the rights of whoever repairs: a member's source.cc with `.incbin "/etc/shadow"`
    (or a compile.sh with -I/root), repaired by root's cron in a shared cache, put root's files into a lib.so
    the group reads. Only your own or root's sources are compiled; nothing runs for another's."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    root = fixture_copy("hidet")
    marker = tmp_path / "ran"
    fakebin = _fakes(tmp_path, marker)
    entry = root / RELU
    (entry / "lib.so").unlink()
    os.chown(entry / name, 4242, -1)
    r = kcache("--cache-dir", root, "--json", "build", "--repair", "3185", "--cxx", f"{fakebin}/g++")
    (done,) = r.json()["entries"]
    assert r.exit_code == 1 and done["status"] == "failed", done
    assert done["error"].startswith(f"refused, nothing ran: {RELU}/{name} is uid 4242's"), done
    assert not marker.exists() and not (entry / "lib.so").exists()


def test_repair_waits_for_the_entrys_build_lock(fixture_copy, kcache):
    from kcache_cli.fs.locking import EntryFlock

    root = fixture_copy("hidet")
    (root / RELU / "lib.so").unlink()
    lock = EntryFlock(root, RELU)
    assert lock.acquire(timeout=0)
    try:
        r = kcache("--cache-dir", root, "--json", "build", "--repair", "3185", "--lock-timeout", "0.3")
    finally:
        lock.release()
    (done,) = r.json()["entries"]
    assert r.exit_code == 1 and done["status"] == "failed" and "holds its lock" in done["error"], done
    assert not (root / RELU / "lib.so").exists()
