"""The loader oracle for torch extensions (torch 2.13.0+cpu, g++): torch's own `load_inline`
(tests/loaders/probe_torchext.py) on one build directory damaged case after case, and kcache's status
of it must say what torch does: complete is reused (no rebuild), partial is built again (a missing
object or module), corrupt fails torch's import (the module cut short) or, with a `lock` left by a
killed build, waits for ever until `verify --fix` removes the lock, after which torch finishes. A build
directory a process built under a version name (load_inline again with a changed source: kc_add_one_v1)
is partial: a new process builds kc_add_one there again, whatever the source; so is one whose .ninja_log or
.ninja_deps is gone or empty (ninja finds no record and builds it all again).

One build directory in place for the damage: build.ninja names its sources by absolute path, so a copy
is rebuilt whatever else it holds. That is the last case: a copy (`cp -a`) and an import under another
path are moved, and torch builds each again there, while the original stays a hit. Each build takes g++
tens of seconds: the cases are ordered so that torch builds five times for them (three times each for
the version name and the ninja logs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_kcache
from loaders.venvs import python_for

PROBE = Path(__file__).with_name("probe_torchext.py")
EXT = "kc_add_one"
HANG = 60  # seconds torch gets to finish when kcache says it would not
LOCK_AGE = 6  # seconds: past torchext.LOCK_GRACE, a lock kcache may call stale
pytestmark = pytest.mark.slow


def load(python: Path, root: Path, *sources: str, timeout: float = 600) -> dict:
    """What torch's load_inline did (of each of `sources` in turn, in one process: the last one's): its JSON
    line, {"crash": exit status} when the process died (a module cut short makes dlopen die of SIGBUS), or
    {"hang": True} past `timeout`."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), "MAX_JOBS": "1"}
    try:
        done = subprocess.run([str(python), str(PROBE), *sources], capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"hang": True}
    if done.returncode != 0:
        return {"crash": done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


def status(root: Path) -> str:
    [row] = run_kcache("--cache-dir", root, "ls", "--json").json()["entries"]
    return row["status"]


def verify_code(root: Path) -> int:
    return run_kcache("--cache-dir", root, "verify").exit_code


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    python = python_for("torch")
    root = tmp_path_factory.mktemp("oracle-torchext") / "py311_cpu"
    root.mkdir()
    first = load(python, root)
    assert first == {"value": 42, "rebuilt": True}, first
    return python, root


def test_complete_is_reused_and_a_left_lock_hangs_until_verify_fix(built):
    python, root = built
    assert status(root) == "complete" and verify_code(root) == 0
    assert load(python, root) == {"value": 42, "rebuilt": False}  # reused
    lock = root / EXT / "lock"
    lock.touch()
    then = time.time() - 60
    os.utime(lock, (then, then))
    assert status(root) == "corrupt" and verify_code(root) == 1
    assert load(python, root, timeout=HANG) == {"hang": True}  # torch's FileBaton.wait, for ever
    fixed = run_kcache("--cache-dir", root, "verify", "--fix", "--json")
    assert fixed.exit_code == 0 and not lock.exists(), fixed.stdout
    assert status(root) == "complete"
    assert load(python, root) == {"value": 42, "rebuilt": False}  # finishes, and reuses


def test_a_missing_object_is_partial_and_rebuilt(built):
    python, root = built
    (root / EXT / "main.o").unlink()
    assert status(root) == "partial" and verify_code(root) == 1
    assert load(python, root) == {"value": 42, "rebuilt": True}
    assert status(root) == "complete"


def test_a_cut_module_is_corrupt_and_a_missing_one_partial(built):
    python, root = built
    module = root / EXT / f"{EXT}.so"
    st = module.stat()
    module.write_bytes(module.read_bytes()[:st.st_size // 2])
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))  # cut in half, its mtime kept
    assert status(root) == "corrupt"  # ls reads the ELF header too
    assert verify_code(root) == 1
    assert run_kcache("--cache-dir", root, "verify", "--json").json()["problems"][0]["status"] == "corrupt"
    got = load(python, root)
    # ninja takes it as up to date; torch's import fails (an ImportError, or dlopen dies of SIGBUS)
    assert "crash" in got or ("error" in got and got["rebuilt"] is False), got
    module.unlink()
    assert status(root) == "partial"
    assert load(python, root) == {"value": 42, "rebuilt": True}
    assert status(root) == "complete" and verify_code(root) == 0


def test_a_copy_or_an_import_elsewhere_is_moved_and_torch_builds_it_again(built, tmp_path):
    python, root = built
    assert status(root) == "complete"
    copy = tmp_path / "copied" / "py311_cpu"
    shutil.copytree(root, copy, symlinks=True)  # cp -a
    assert status(copy) == "moved" and verify_code(copy) == 1
    fixed = run_kcache("--cache-dir", copy, "verify", "--fix")
    assert fixed.exit_code == 1 and "--fix changed nothing" in fixed.stderr, fixed.stderr
    assert load(python, copy) == {"value": 42, "rebuilt": True}  # ninja: "command line changed"
    assert status(copy) == "complete"  # torch built it here: its build.ninja names this place now
    assert load(python, root) == {"value": 42, "rebuilt": False}  # the original is still a hit

    archive = tmp_path / "tx.tar"
    assert run_kcache("--cache-dir", root, "export", archive).exit_code == 0
    other = tmp_path / "imported" / "py311_cpu"
    run = run_kcache("--cache-dir", other, "import", archive, "--json")
    assert run.exit_code == 0 and "torch builds it again here" in run.json()["entries"][0]["reason"], run.stdout
    assert status(other) == "moved"
    assert load(python, other) == {"value": 42, "rebuilt": True}
    assert status(other) == "complete"


def test_a_module_built_under_a_version_name_is_partial_and_a_new_process_builds_it_again(tmp_path):
    """torch names a second build with changed sources in one process <name>_v1 (its versioner lives in the
    process), in the same build directory; a new process starts at version 0, so ninja's compile command
    (-DTORCH_EXTENSION_NAME) and target change and it builds <name>.so again, even from the same source."""
    python, root = python_for("torch"), tmp_path / "py311_cpu"
    root.mkdir()
    assert load(python, root, "0", "1") == {"value": 43, "rebuilt": True}  # built as kc_add_one_v1.so
    assert status(root) == "partial" and verify_code(root) == 1
    (root / EXT / "build.ninja").unlink()  # torch writes it again: .ninja_log says v1 was built last
    assert status(root) == "partial"
    assert load(python, root, "1") == {"value": 43, "rebuilt": True}  # kc_add_one.so built again
    assert status(root) == "complete"
    assert load(python, root, "1") == {"value": 43, "rebuilt": False}


def test_a_ninja_log_or_deps_log_gone_or_emptied_is_partial_and_built_again(tmp_path):
    """ninja decides what is up to date from .ninja_log (each output's command) and .ninja_deps (the headers
    a `deps = gcc` edge read): with either gone or empty it finds no record and builds everything again."""
    python, root = python_for("torch"), tmp_path / "py311_cpu"
    root.mkdir()
    assert load(python, root) == {"value": 42, "rebuilt": True}
    for name, damage in ((".ninja_log", Path.unlink), (".ninja_deps", lambda p: p.write_bytes(b""))):
        damage(root / EXT / name)
        assert status(root) == "partial" and verify_code(root) == 1, name
        assert load(python, root) == {"value": 42, "rebuilt": True}, name
        assert status(root) == "complete", name


def test_a_build_ninja_gone_or_not_torchs_is_written_again_and_the_build_reused(tmp_path):
    """torch writes build.ninja again on every load (_write_ninja_file, before ninja runs): one deleted,
    emptied or edited is rewritten, and ninja, finding each output and its command in .ninja_log, builds
    nothing. What the logs record is what counts: an object they name gone is built again, and a copy
    elsewhere (the source path in .ninja_deps) is built again from scratch."""
    python, root = python_for("torch"), tmp_path / "py311_cpu"
    root.mkdir()
    assert load(python, root) == {"value": 42, "rebuilt": True}
    ninja = root / EXT / "build.ninja"
    written = ninja.read_text()
    for damage in (Path.unlink, lambda p: p.write_text(""),
                   lambda p: p.write_text(written.replace(f"default {EXT}.so", ""))):
        damage(ninja)
        assert status(root) == "complete" and verify_code(root) == 0, ninja.exists() and ninja.read_text()
        assert load(python, root) == {"value": 42, "rebuilt": False}
        assert ninja.read_text() == written  # torch wrote it again
    ninja.unlink()
    copy = tmp_path / "copied" / "py311_cpu"
    shutil.copytree(root, copy, symlinks=True)
    (root / EXT / "main.o").unlink()
    assert status(root) == "partial" and status(copy) == "moved"
    assert load(python, root) == {"value": 42, "rebuilt": True}
    assert load(python, copy) == {"value": 42, "rebuilt": True}


def test_a_lock_whose_torch_was_killed_while_ninja_builds_is_left_alone_until_ninja_ends(tmp_path):
    """torch runs ninja (and ninja the compiler) in the build directory, without the lock's descriptor
    (os.open's are not inherited): torch killed alone leaves them building there. Until they end the entry
    is building, and neither verify --fix nor prune --broken touches it; after, the lock is stale (every
    load waits for ever) and verify --fix removes it: the next load builds what ninja left unbuilt."""
    python, root = python_for("torch"), tmp_path / "py311_cpu"
    root.mkdir()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), "MAX_JOBS": "1"}
    torch = subprocess.Popen([str(python), str(PROBE)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    building = root / EXT / "build.ninja"
    for _ in range(600):
        if building.exists() or torch.poll() is not None:
            break
        time.sleep(0.1)
    time.sleep(1)
    torch.kill()  # SIGKILL to torch's process only: ninja and g++ go on
    torch.wait()
    time.sleep(LOCK_AGE)
    assert status(root) == "building" and verify_code(root) == 0
    assert run_kcache("--cache-dir", root, "verify", "--fix").exit_code == 0 and (root / EXT / "lock").exists()
    assert run_kcache("--cache-dir", root, "prune", "--broken").exit_code == 0 and (root / EXT / "lock").exists()
    for _ in range(1200):
        if status(root) != "building":
            break
        time.sleep(0.5)
    assert status(root) == "corrupt"
    run_kcache("--cache-dir", root, "verify", "--fix")
    assert not (root / EXT / "lock").exists() and status(root) == "partial"
    assert load(python, root) == {"value": 42, "rebuilt": True}  # ninja died of SIGPIPE (torch held its pipe)
