"""A co-user's attacks on what root runs over a group-shared cache that the older attack tests
(test_shared_attacks.py, test_shared_cron.py) leave out: the torch Mega-Cache export, the budget kept in
the cache. The attacker is uid 65534 in the cache's group, as there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES
from test_shared_attacks import PY, SWAPPER, TIMEOUT, as_attacker, attacker, entry_dirs, kcache, shared_dir

pytestmark = [pytest.mark.second_user]

BLOB = Path(__file__).parent / "fixtures" / "real" / "torch-mega" / "sin_cos_cpu.bin"
SECRET = b"ROOT-ONLY-SECRET-7f3a"


def _secret_twin(area: Path, root: Path) -> Path:
    """A root-only directory holding, under each fxgraph shard's name, the same key and variant names as the
    cache, each variant file holding SECRET (a file no member may read)."""
    twin = area / "secret"
    for variant in (root / "fxgraph").glob("*/*/*"):
        f = twin / variant.relative_to(root / "fxgraph")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(SECRET)
    os.chmod(twin, 0o700)
    return twin


def test_a_torch_mega_export_never_reads_through_a_shard_swapped_for_a_link(area):
    """Root exports a shared inductor cache as a Mega-Cache blob while a member flips its fxgraph shard
    directories for links to a root-only directory with the same names: the variants were read by path
    after the listing, so the blob (and its signed sidecar) carried root's file. No race puts it in now."""
    import subprocess

    root = shared_dir(area / "cache")
    assert kcache("--cache-dir", root, "import", BLOB).returncode == 0
    twin = _secret_twin(area, root)
    stop = area / "stop"
    specs = [f"cache/fxgraph/{d.name}|{d}" for d in twin.iterdir()]
    swapper = subprocess.Popen([PY, "-c", SWAPPER, area, stop, "7", *specs], preexec_fn=as_attacker,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    runs = []
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        for i in range(15):
            out = area / f"out-{i}.bin"
            runs.append((kcache("--cache-dir", root, "export", out, "--format", "torch-mega", "--python", "/bin/false"),
                         out))
    finally:
        stop.touch()
        flips = swapper.communicate(timeout=TIMEOUT)[0]
    assert int(flips.strip() or 0) > 0, "the swapper never flipped anything: the race proved nothing"
    for run, out in runs:
        assert "Traceback" not in run.stderr and run.returncode in (0, 1), run.stderr
        assert not out.exists() or SECRET not in out.read_bytes(), run.stderr
        assert run.returncode == 1 or out.exists()
    shutil.rmtree(twin)


def test_a_budget_whose_kcache_dir_a_member_swapped_for_a_link_is_not_read_as_none(area):
    """Root keeps max-size in a shared cache's .kcache/budget/config.toml; a member renames .kcache/ aside and puts
    a link to it there. Root's cron `prune` said "Nothing to remove", exit 0: the budget silently bound
    nothing. A budget that cannot be read fails the prune,
    one line naming the file, as a FIFO or a link in the file's own place does; nothing is removed."""
    root = shared_dir(area / "cache", FIXTURES / "hidet")
    assert kcache("--cache-dir", root, "config", "set", "max-size", "100K", umask=0o022).returncode == 0
    before = entry_dirs(root)
    attacker("import os, sys\nr = sys.argv[1]\nos.rename(r + '/.kcache', r + '/.kcache-old')\n"
             "os.symlink('.kcache-old', r + '/.kcache')", root)
    for args in (("prune", "--dry-run"), ("prune", "--yes")):
        run = kcache("--cache-dir", root, *args, umask=0o022)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 1 and len(lines) == 1, (args, run.returncode, run.stderr)
        assert lines[0].startswith(f"Error: cannot read {root}/.kcache/budget"), lines
    assert entry_dirs(root) == before


def test_explain_never_runs_a_module_a_member_left_in_the_current_directory(area):
    """`kcache explain` asks the Python here for its versions with `python3 -c`, which puts the current
    directory first on sys.path: root running it from inside a shared cache ran a member's json.py as root.
    The probe drops that entry before it imports anything: the planted modules never run."""
    import subprocess
    import sys

    root = shared_dir(area / "cache", FIXTURES / "hidet")
    marker = area / "ran"
    plant = f"import os\nopen({str(marker)!r}, 'a').write(__name__ + ' ' + str(os.getuid()) + '\\n')\n"
    attacker("import sys\nfor m in ('json', 'csv', 'email', 'zipfile'):\n"
             "    open(sys.argv[1] + '/' + m + '.py', 'w').write(sys.argv[2])", root, plant)
    console_script = "import sys; del sys.path[0]; from kcache_cli.cli.entry import run; run()"  # no cwd on its path
    run = subprocess.run([sys.executable, "-c", console_script, "--cache-dir", ".", "explain",
                          "--python", PY], cwd=root, capture_output=True, text=True, timeout=TIMEOUT)
    assert "Traceback" not in run.stderr and run.returncode in (0, 1), run.stderr
    assert not marker.exists(), f"ran as root: {marker.read_text()}"
    assert "could not be asked" not in run.stdout + run.stderr, run.stdout + run.stderr


_FORGE = """import json, os, sys
root, name = sys.argv[1], sys.argv[2]
notes = {}
for d, _, files in os.walk(root):
    if '/.kcache' not in d:
        for f in files:
            st = os.stat(os.path.join(d, f))
            notes[str(st.st_ino)] = [st.st_atime_ns, 1_000_000_000_000_000_000]  # "last used in 2001"
open(os.path.join(root, '.kcache', name), 'w').write(json.dumps(notes))
"""


def test_a_members_forged_read_notes_never_make_entries_in_use_look_unused(area):
    """A member may write the group's `.kcache/`, where kcache keeps the notes of the atimes its own reads
    moved (a member's reads of another member's files, which the kernel does not let it read with
    O_NOATIME). Notes that said "read by kcache, last used in 2001" of every file of entries a compiler had
    just read made root's `prune --older-than 1d` remove them all, entries the member may not remove
    (another member's, umask 022). A note now counts only where its writer could write the file anyway."""
    import json
    import subprocess

    root = shared_dir(area / "cache", FIXTURES / "hidet")
    assert kcache("--cache-dir", root, "config", "set", "max-age", "300d").returncode == 0  # .kcache/ is there
    for d, dirs, files in os.walk(root, topdown=False):  # another member's entries, written with umask 022
        if ".kcache" not in d:
            for n in files:
                os.chown(os.path.join(d, n), 4242, -1)
                os.chmod(os.path.join(d, n), 0o644)
            for n in [*files, *dirs]:
                os.utime(os.path.join(d, n), (1_600_000_000, 1_600_000_000))  # written in 2020
    for lib in root.glob("ops/*/*/*/lib.so"):
        subprocess.run(["cat", str(lib)], check=True, stdout=subprocess.DEVNULL)  # a compiler's hits: used now
    before = entry_dirs(root)
    for name in ("reads.65534", "reads.0", "reads"):  # its own, one in root's name, an older kcache's
        attacker(_FORGE, root, name)
    listed = json.loads(kcache("--cache-dir", root, "ls", "--json").stdout)["entries"]
    used = [e["path"] for e in listed if e["last_used"] > "2026"]
    assert len(used) == len(before), listed
    run = kcache("--cache-dir", root, "prune", "--older-than", "1d", "--yes")
    assert run.returncode == 0 and entry_dirs(root) == before, run.stderr


def test_a_members_notes_file_holding_infinity_stops_no_command_of_roots(area):
    """A member's `.kcache/reads.<uid>` is read by every other user's scan. A note whose atime is a number
    no integer holds (JSON's Infinity, which Python's json takes) made int() raise OverflowError, which no
    rule caught: root's ls and prune ended in "unexpected OverflowError", exit 1, for as long as the member
    left the file there. Such a file is malformed, as any other: its notes are not taken."""
    import json

    root = shared_dir(area / "cache", FIXTURES / "hidet")
    assert kcache("--cache-dir", root, "config", "set", "max-age", "300d").returncode == 0  # .kcache/ is there
    attacker("import sys\nopen(sys.argv[1] + '/.kcache/reads.65534', 'w').write('{\"1\": [Infinity, 0]}')\n",
             root)
    before = entry_dirs(root)
    run = kcache("--cache-dir", root, "ls", "--json")
    assert run.returncode == 0 and "OverflowError" not in run.stderr, run.stderr
    assert len(json.loads(run.stdout)["entries"]) == len(before)
    run = kcache("--cache-dir", root, "prune", "--older-than", "1000d", "--yes")
    assert run.returncode == 0 and "OverflowError" not in run.stderr and entry_dirs(root) == before, run.stderr


def test_a_users_notes_are_one_file_whose_name_writes_the_uid_as_str_does(fixture_copy):
    """`.kcache/reads.<uid>` names its writer; `reads.00`, `reads.0000000000` were read as uid 0's too, so
    that a user could keep ten files of 64 MiB each where one was meant (and only `reads.<uid>` is ever
    rewritten, the rest never cleaned). Only the name str(uid) writes is a user's."""
    from kcache_cli.fs import state

    root = fixture_copy("hidet")
    assert kcache("--cache-dir", root, "config", "set", "max-age", "300d").returncode == 0  # .kcache/ is there
    for name in ("reads.0", "reads.00", "reads.0000000000", "reads.+0", "reads. 0"):
        (root / ".kcache" / name).write_text("{}")
    read = state.read_user_files(root, "reads.", 1 << 20)
    assert [f.uid for f in read] == [0]


def _forged_index(root: Path, relpath: str) -> bytes:
    """Root's scan index of `root` as a member can make it (the context is root's uid and groups, the root's
    path and stat, kcache's code files' stats; each key is lstats of the entry), with `relpath` said corrupt."""
    import pickle

    from test_index import index_object

    from kcache_cli.catalog import index
    from kcache_cli.catalog.scan import scan_cache
    from kcache_cli.fs import state

    saved = index.MIN_ENTRIES, index.RACY_SECONDS
    index.MIN_ENTRIES, index.RACY_SECONDS = 0, -1e9
    try:
        scan_cache(root, use_index=True)
    finally:
        index.MIN_ENTRIES, index.RACY_SECONDS = saved
    made = next((root / ".kcache" / "index").rglob(state.index_name()))
    data = made.read_bytes()
    made.unlink()
    obj = index_object(data)
    status, reason = index.FIELDS.index("status"), index.FIELDS.index("reason")
    for path, rec in obj["records"].items():
        if path.endswith(relpath):
            values = list(rec[3])
            values[status], values[reason] = "corrupt", "forged by a member"
            obj["records"][path] = (*rec[:3], tuple(values), rec[4])
    return index.framed([pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)])


def test_a_roots_file_a_member_moves_into_the_index_directory_is_never_roots_index(area):
    """Root's import (or build) of a member's files leaves root-owned 0644 files of the member's making in
    group-writable entry directories; a member renames one into .kcache/index/ as root's scan.0, holding an
    index forged for root's context: root's ls must still say what a scan says, not the forged status."""
    import json
    import time

    root = shared_dir(area / "cache", FIXTURES / "hidet")
    old = time.time() - 7200
    for p in (root, *root.rglob("*")):
        os.utime(p, (old, old), follow_symlinks=False)
    victim = "ops/cuda_space_0/softmax/ad252b064b266eea"
    planted = root / "ops" / "imported.txt"
    planted.write_bytes(_forged_index(root, victim))  # as root's import writes it: root's, 0644
    os.chmod(planted, 0o644)
    kcache("--cache-dir", root, "ls", "--json")  # root's index directory is there, as after any cron run
    attacker("import os, sys\nfor d, _, _ in os.walk(sys.argv[2]):\n"
             "    try: os.rename(sys.argv[1], os.path.join(d, 'scan.0'))\n    except OSError: pass",
             planted, root / ".kcache" / "index")
    served = kcache("--cache-dir", root, "ls", "--json")
    real = kcache("--cache-dir", root, "ls", "--json", "--no-index")
    status = {e["path"]: (e["status"], e["reason"]) for e in json.loads(served.stdout)["entries"]}
    assert status[str(root / victim)] == ("complete", None), status[str(root / victim)]
    assert json.loads(served.stdout)["entries"] == json.loads(real.stdout)["entries"]


def _status(root: Path, key: str) -> tuple[str, str]:
    import json

    run = kcache("--cache-dir", root, "--json", "ls", "--no-index", umask=0o022)
    assert run.returncode == 0, run.stderr
    got = next(e for e in json.loads(run.stdout)["entries"] if e["hash"] == key)
    return got["status"], got["reason"] or ""


@pytest.mark.parametrize("contents", ["good", "garbage"])
def test_root_reads_nothing_through_a_members_link_the_member_may_not_read(area, contents):
    """A member makes an entry's meta.json a link to a root-only file: root's ls read it (an open with no
    O_NOFOLLOW) and its status told whether the file was JSON. Root follows a link only to what the link's
    maker may read: the entry is unreadable whatever the file holds, and nothing of it is shown."""
    root = shared_dir(area / "cache", FIXTURES / "hidet")
    entry = root / "ops" / "cuda_space_0" / "add" / "8d1f7691cdf75e90"
    secret = area / "secret"
    secret.mkdir(mode=0o700)
    target = secret / "meta.json"
    target.write_bytes((entry / "meta.json").read_bytes() if contents == "good" else SECRET)
    os.chmod(target, 0o600)
    (entry / "meta.json").unlink()
    (entry / "meta.json").symlink_to(target)
    os.lchown(entry / "meta.json", 65534, -1)
    status, reason = _status(root, "8d1f7691cdf75e90")
    assert status == "unreadable" and "meta.json is unreadable (permission denied)" in reason, (status, reason)
    run = kcache("--cache-dir", root, "verify", "8d1f", umask=0o022)
    assert SECRET.decode() not in run.stdout + run.stderr and "not valid JSON" not in run.stdout + run.stderr


@pytest.mark.parametrize("contents", ["good", "garbage"])
def test_root_reads_no_file_a_members_triton_group_names_that_the_member_may_not_read(area, contents):
    """A member's Triton group file names, as a child path, a root-only file outside the cache: root's ls
    read it (Triton, run by the member, cannot). What it holds changes nothing root says."""
    import json

    root = shared_dir(area / "cache", FIXTURES / "triton" / "cache")
    assert kcache("--cache-dir", root, "verify", "--fix", umask=0o022).returncode == 0  # paths into this copy
    key = next(p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith("."))
    assert _status(root, key.name)[0] == "complete"
    group = next(key.glob("__grp__*.json"))
    doc = json.loads(group.read_text())
    meta = next(n for n in doc["child_paths"] if n.endswith(".json") and not n.startswith("__grp__"))
    secret = area / "secret"
    secret.mkdir(mode=0o700)
    target = secret / meta
    target.write_bytes((key / meta).read_bytes() if contents == "good" else SECRET)
    os.chmod(target, 0o600)
    doc["child_paths"][meta] = str(target)
    group.write_text(json.dumps(doc))
    os.chown(group, 65534, -1)
    status, reason = _status(root, key.name)
    assert status != "complete" and SECRET.decode() not in reason, (status, reason)
    assert "not valid JSON" not in reason and "permission denied" in reason.lower(), reason
