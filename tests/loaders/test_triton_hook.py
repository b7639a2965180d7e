"""kcache_cli.triton_hook with the real Triton 3.9 (its loader venv; no GPU needed): Triton picks the class
from TRITON_CACHE_MANAGER, compiles hit exactly as with its own FileCacheManager, and every hit leaves
kcache's last-used stamp for the kernel's key directory. On a `noatime` mount (a real tmpfs, as root)
that stamp is the only trace of the hit: `kcache ls` shows it as the last use, where without the hook
the kernels keep the time they were written."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from loaders.venvs import python_for

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HOOK = "kcache_cli.triton_hook:KcacheCacheManager"
T = 1_700_000_000


def triton(script: str, *args: str, home: Path, **env: str) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(python_for("triton39")), str(HERE / script), *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home), PYTHONDONTWRITEBYTECODE="1", **env), timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def last_used(root: Path) -> dict[str, float]:
    code = "from kcache_cli.cli.app import main; main()"
    done = subprocess.run([sys.executable, "-c", code, "--cache-dir", str(root), "ls", "--json"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, NO_COLOR="1"))
    assert done.returncode == 0, done.stderr
    return {os.path.basename(e["path"]): datetime.fromisoformat(e["last_used"]).timestamp()
            for e in json.loads(done.stdout)["entries"]}


def same_times(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (T, T), follow_symlinks=False)


@contextlib.contextmanager
def noatime_mount(where: Path):
    where.mkdir(parents=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "noatime,size=256m", "tmpfs",
                                            str(where)], capture_output=True).returncode != 0:
        yield False  # an ordinary directory: the stamps are still checked, the noatime part is not
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow
def test_the_hook_stamps_every_hit_and_changes_nothing_else(tmp_path):
    with noatime_mount(tmp_path / "mnt") as noatime:
        hooked, plain = tmp_path / "mnt" / "hooked", tmp_path / "mnt" / "plain"
        made = {}
        for root in (hooked, plain):
            made[root] = triton("probe_triton.py", "make", str(root), home=tmp_path / "home")["kernels"]
            assert all(not k["detail"] for k in made[root].values())
            same_times(root)
        env = {"TRITON_CACHE_MANAGER": HOOK, "PYTHONPATH": str(REPO)}
        started = time.time() - 1
        again = triton("probe_triton_rerun.py", str(hooked), home=tmp_path / "home", **env)["kernels"]
        assert {k: v["verdict"] for k, v in again.items()} == {k: "hit" for k in made[hooked]}, again
        stamps = {p.name: p.stat().st_mtime for p in (hooked / ".kcache" / "used").iterdir()}
        assert set(made[hooked]) <= set(stamps), "every kernel hit is stamped"
        assert all(stamps[k] >= started for k in made[hooked])
        control = triton("probe_triton_rerun.py", str(plain), home=tmp_path / "home")["kernels"]
        assert {v["verdict"] for v in control.values()} == {"hit"}
        assert not (plain / ".kcache").exists(), "Triton's own manager writes no stamp"
        used = last_used(hooked)
        assert all(used[k] >= started for k in made[hooked])
        if noatime:  # the hits left no atime: without the hook the kernels were last used when written
            assert all(abs(t - T) < 2 for k, t in last_used(plain).items() if k in made[plain])


def test_importing_the_hook_needs_no_triton():
    import kcache_cli.triton_hook as hook

    with pytest.raises(AttributeError):
        hook.NoSuchThing  # noqa: B018
    assert "triton" not in sys.modules


def test_record_hit_stamps_once_an_hour_and_never_raises(tmp_path):
    from kcache_cli.fs import state
    from kcache_cli.triton_hook import record_hit

    root = tmp_path / "cache"
    (root / "KEY").mkdir(parents=True)
    record_hit(str(root / "KEY"), now=T)
    stamp = root / ".kcache" / "used" / "KEY"
    assert stamp.stat().st_mtime == T
    record_hit(str(root / "KEY"), now=T + 60)
    assert stamp.stat().st_mtime == T  # within the hour: not rewritten
    record_hit(str(root / "KEY"), now=T + 2 * state.STAMP_REFRESH)
    assert stamp.stat().st_mtime == T + 2 * state.STAMP_REFRESH
    record_hit(str(tmp_path / "gone" / "KEY"))  # no root: nothing, no exception
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / ".kcache").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    record_hit(str(tmp_path / "linked" / "KEY"))
    assert list((tmp_path / "elsewhere").iterdir()) == []  # never written through a link
