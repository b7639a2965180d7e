"""`kcache export -` and `kcache import -`: an archive through a pipe (archive/stdio.py), with real
processes and real pipes and terminals: what crosses, what is refused at once, and that no temp is left."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from archive_helpers import snapshot

KCACHE = [sys.executable, "-m", "kcache_cli"]


def _env(tmp_path: Path) -> dict:
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "NO_COLOR": "1", "HOME": str(tmp_path / "home")}


def _temps(env: dict) -> list[str]:
    return sorted(os.listdir(env["TMPDIR"]))


def _kept(env: dict) -> bool:
    """Whether import - has its private directory in TMPDIR, the input kept in it."""
    return any(n.startswith("kcache-stdin-") and os.path.exists(os.path.join(env["TMPDIR"], n, "archive"))
               for n in _temps(env))


def _listing(root: Path, env: dict) -> list[tuple]:
    r = subprocess.run([*KCACHE, "--cache-dir", str(root), "ls", "--json"], capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return sorted((e["layout"], e["space"], e["op"], e["hash"], e["status"], e["file_count"])
                  for e in json.loads(r.stdout)["entries"])


def test_export_then_import_through_a_pipe(fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    dst = tmp_path / "copy"
    env = _env(tmp_path)
    export = subprocess.Popen([*KCACHE, "--cache-dir", str(src), "export", "-"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    imp = subprocess.run([*KCACHE, "--cache-dir", str(dst), "import", "-", "--json"], stdin=export.stdout,
                         capture_output=True, env=env, timeout=120)
    export.stdout.close()
    err = export.stderr.read().decode()
    assert export.wait(timeout=120) == 0, err
    assert imp.returncode == 0, imp.stderr
    doc = json.loads(imp.stdout)
    assert doc["archive"] == "-"  # what the user named, not the temp file it was kept in
    assert "standard output" in err and "exported" in err  # the summary on stderr: stdout was the archive
    assert _listing(dst, env) == _listing(src, env) != []
    assert _temps(env) == []  # neither side leaves its temp behind


def test_export_to_a_file_on_stdout_is_the_archive_a_named_export_makes(fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    env = _env(tmp_path)
    with open(tmp_path / "piped.tar.zst", "wb") as out:
        r = subprocess.run([*KCACHE, "--cache-dir", str(src), "export", "-"], stdout=out, stderr=subprocess.PIPE,
                           env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    dry = subprocess.run([*KCACHE, "--cache-dir", str(tmp_path / "new"), "import", str(tmp_path / "piped.tar.zst"),
                          "--dry-run", "--json"], capture_output=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert len(json.loads(dry.stdout)["entries"]) == len(_listing(src, env))
    assert (tmp_path / "piped.tar.zst").read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # zstd


def _on_terminal(args: list[str], env: dict, fd: int) -> tuple[int, str]:
    """Run kcache with a pseudo-terminal as its stdin (fd 0) or stdout (fd 1); (exit code, stderr)."""
    master, slave = pty.openpty()
    try:
        io = {"stdin": slave} if fd == 0 else {"stdout": slave}
        r = subprocess.run(args, stderr=subprocess.PIPE, env=env, timeout=60, **io)
    finally:
        os.close(slave)
        os.close(master)
    return r.returncode, r.stderr.decode()


@pytest.mark.parametrize("command, fd", [("export", 1), ("import", 0)])
def test_a_terminal_is_refused_at_once(fixture_copy, tmp_path, command, fd):
    cache = fixture_copy("hidet")
    env = _env(tmp_path)
    before = snapshot(cache)
    code, err = _on_terminal([*KCACHE, "--cache-dir", str(cache), command, "-"], env, fd)
    assert code == 2, err
    assert "is a terminal" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert snapshot(cache) == before and _temps(env) == []


@pytest.mark.parametrize("data, said", [
    (b"", "is empty"),
    (b"not an archive\n" * 100, "is not a tar, tar.gz or tar.zst archive"),
    (b"\x1f\x8b" + b"\0" * 20, "gzip stream is corrupt"),  # gzip's magic, then junk: import's own check
])
def test_import_of_what_is_no_archive_fails_in_one_line(fixture_copy, tmp_path, data, said):
    cache = fixture_copy("hidet")
    env = _env(tmp_path)
    before = snapshot(cache)
    r = subprocess.run([*KCACHE, "--cache-dir", str(cache), "import", "-"], input=data, capture_output=True,
                       env=env, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(env["TMPDIR"]) not in err  # the temp it was kept in is never named
    assert snapshot(cache) == before and _temps(env) == []


def test_an_endless_stream_stops_at_the_bound_and_leaves_nothing(fixture_copy, tmp_path):
    """A tar stream longer than twice --max-total-size is cut off while it is read, not kept to the end."""
    cache = fixture_copy("hidet")
    env = _env(tmp_path)
    header = bytearray(512)
    header[257:262] = b"ustar"  # a tar's first block: the stream is taken, and read on
    (tmp_path / "head").write_bytes(bytes(header))
    feed = subprocess.Popen(["sh", "-c", f"cat '{tmp_path / 'head'}'; exec cat /dev/zero"], stdout=subprocess.PIPE)
    try:
        r = subprocess.run([*KCACHE, "--cache-dir", str(cache), "import", "-", "--max-total-size", "1MB"],
                           stdin=feed.stdout, capture_output=True, env=env, timeout=60)
    finally:
        feed.kill()
        feed.wait()
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "longer than" in err and "Traceback" not in err
    assert _temps(env) == []



def test_a_stream_of_zeros_is_refused_at_its_first_block(fixture_copy, tmp_path):
    """`kcache import - < /dev/zero`: a zero block is tar's end-of-archive marker, so the stream sniffs as
    a tar, but no kcache archive starts with it (its first member is manifest.json). Refused from that
    block, not kept up to twice --max-total-size (128 GiB by default) in TMPDIR first."""
    cache = fixture_copy("hidet")
    env = _env(tmp_path)
    with open("/dev/zero", "rb") as zeros:
        r = subprocess.run([*KCACHE, "--cache-dir", str(cache), "import", "-", "--max-total-size", "1MB"],
                           stdin=zeros, capture_output=True, env=env, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "starts with an empty block" in err and len(err.strip().splitlines()) == 1, err
    assert _temps(env) == []


def test_export_to_a_reader_that_stops_fails_and_leaves_nothing(fixture_copy, tmp_path):
    """The reader goes away after one byte: the export says so (exit 1), and leaves no temp."""
    src = fixture_copy("hidet")
    for n in range(40):  # an archive bigger than a pipe's buffer: the write meets the closed end
        (src / "ops" / "cuda_space_0" / "add").joinpath(f"{n:016x}").mkdir()
    big = os.urandom(1 << 20)
    for n in range(4):
        (src / "ops" / "cuda_space_0" / "add" / f"{n:016x}" / "source.cu").write_bytes(big)
    env = _env(tmp_path)
    export = subprocess.Popen([*KCACHE, "--cache-dir", str(src), "export", "-", "--status", "partial",
                               "--status", "complete"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert export.stdout is not None
    export.stdout.read(1)
    export.stdout.close()
    err = export.stderr.read().decode()
    assert export.wait(timeout=120) == 1, err
    assert "standard output was closed" in err and "Traceback" not in err
    assert _temps(env) == []


@pytest.mark.parametrize("extra", [["--json"], ["--format", "torch-mega"]])
def test_export_dash_refuses_what_has_no_room_on_stdout(fixture_copy, tmp_path, extra):
    cache = fixture_copy("hidet")
    env = _env(tmp_path)
    r = subprocess.run([*KCACHE, "--cache-dir", str(cache), "export", "-", *extra], capture_output=True, env=env,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert b"Traceback" not in r.stderr
    if r.stdout:  # under --json the error is a JSON document there: no archive
        assert json.loads(r.stdout)["exit"] == 2


def test_sigterm_while_stdin_is_kept_removes_the_temp(fixture_copy, tmp_path):
    """Killed (SIGTERM) while it waits for more of the stream: one line, and the temp file is gone."""
    import signal
    import time

    cache = fixture_copy("hidet")
    env = _env(tmp_path)
    header = bytearray(512)
    header[257:262] = b"ustar"
    read_end, write_end = os.pipe()
    os.write(write_end, bytes(header))  # a tar's first block, then nothing yet: the import waits for more
    proc = subprocess.Popen([*KCACHE, "--cache-dir", str(cache), "import", "-"], stdin=read_end,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    os.close(read_end)
    try:
        deadline = time.monotonic() + 60
        while not _kept(env) and time.monotonic() < deadline:  # not Python's own probe of TMPDIR (gettempdir)
            time.sleep(0.05)
        assert _kept(env), "the import never kept its input"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(write_end)
        proc.kill()
    assert proc.returncode != 0 and b"Traceback" not in err, err
    assert _temps(env) == []


def test_export_appended_to_a_file_is_whole(fixture_copy, tmp_path):
    """stdout opened O_APPEND (`>> file`), where sendfile is refused: the archive is copied by reads and
    writes, and a verified import takes it."""
    src = fixture_copy("hidet")
    env = _env(tmp_path)
    target = tmp_path / "appended.tar.zst"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        r = subprocess.run([*KCACHE, "--cache-dir", str(src), "export", "-"], stdout=fd, stderr=subprocess.PIPE,
                           env=env, timeout=120)
    finally:
        os.close(fd)
    assert r.returncode == 0, r.stderr
    dry = subprocess.run([*KCACHE, "--cache-dir", str(tmp_path / "new"), "import", str(target), "--dry-run",
                          "--json"], capture_output=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert len(json.loads(dry.stdout)["entries"]) == len(_listing(src, env))


def _swap_in_theirs(tmpdir: Path, prefix: str) -> list[str]:
    """What a user who may write in TMPDIR (theirs, or a link to theirs) can do to the directory kcache made
    there: move it aside and put their own under its name, holding an archive of theirs."""
    swapped = []
    for name in os.listdir(tmpdir):
        if name.startswith(prefix) and not name.endswith(".aside"):
            os.rename(tmpdir / name, tmpdir / f"{name}.aside")
            (tmpdir / name).mkdir()
            for archive in ("archive", "archive.tar.zst"):
                (tmpdir / name / archive).write_bytes(b"theirs")
            swapped.append(name)
    return swapped


def test_a_temp_directory_swapped_in_tmpdir_is_never_read(fixture_copy, tmp_path, monkeypatch):
    """kcache reaches its temp directory only through the descriptor it holds on it: a user who swaps
    another under its name (root's cron with a TMPDIR in their directory) gets neither side to take their
    archive. import - imports what came on stdin, export - sends the archive it made; what they put there
    is left alone."""
    import tempfile

    from kcache_cli.archive import export, stdio
    from kcache_cli.model.records import ScanFilter

    tmpdir = tmp_path / "theirs"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    came = b"\x28\xb5\x2f\xfd" + os.urandom(4096)  # what stdin brings (a zstd stream's magic, then bytes)
    read_end, write_end = os.pipe()
    os.write(write_end, came)
    os.close(write_end)
    try:
        with stdio.spooled_stdin(1 << 20, fd=read_end) as kept:
            assert _swap_in_theirs(tmpdir, "kcache-stdin-")
            assert Path(kept).read_bytes() == came
    finally:
        os.close(read_end)

    src = fixture_copy("hidet")
    real_export = export.export_archive

    def then_swapped(*args, **kwargs):
        made = real_export(*args, **kwargs)
        assert _swap_in_theirs(tmpdir, "kcache-export-")
        return made

    monkeypatch.setattr(export, "export_archive", then_swapped)
    sent = tmp_path / "sent.tar.zst"
    with open(sent, "wb") as out:
        export.export_to_stream(export.plan_export(src, ScanFilter()), out.fileno())
    assert sent.read_bytes()[:4] == b"\x28\xb5\x2f\xfd" and sent.stat().st_size > 1000
    theirs = [p for p in tmpdir.rglob("*") if p.is_file()]
    assert theirs and all(p.read_bytes() == b"theirs" for p in theirs)  # theirs left alone


def test_export_with_no_room_in_tmpdir_says_to_set_tmpdir(fixture_copy, tmp_path, monkeypatch):
    """The archive is made under TMPDIR first: a full TMPDIR (a small /tmp beside a roomy cache disk) is
    said to be that, with the next step, not "free space" on a disk the user cannot tell."""
    import errno
    import tempfile

    from kcache_cli.archive import export
    from kcache_cli.model.records import ScanFilter
    from kcache_cli.util.errors import KcacheError

    tmpdir = tmp_path / "small"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))

    def full(plan, archive, **_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), archive)

    monkeypatch.setattr(export, "export_archive", full)
    with open(tmp_path / "out", "wb") as out, pytest.raises(KcacheError) as exc:
        export.export_to_stream(export.plan_export(fixture_copy("hidet"), ScanFilter()), out.fileno())
    assert f"in {tmpdir} " in str(exc.value) and "set TMPDIR" in str(exc.value)
    assert (tmp_path / "out").stat().st_size == 0 and os.listdir(tmpdir) == []
