"""kcache export / import: round trips of the real caches, selection, skips, replacement, dry runs,
the parallel (multi-part) path, GNU tar compatibility and the arch check."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kcache_cli import archive

LAYOUTS = ("hidet", "tilus", "tilelang")
FORMATS = (".tar", ".tar.gz", ".tar.zst")


def tree(root: Path) -> dict[str, tuple]:
    """Everything under `root` except kcache's own .kcache/: path -> (type, sha256 or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir.split(os.sep)[0] == ".kcache":
            continue
        for n in dirnames + filenames:
            full = os.path.join(dirpath, n)
            rel = os.path.normpath(os.path.join(rel_dir, n))
            if rel.split(os.sep)[0] == ".kcache" or rel == "CACHEDIR.TAG":  # kcache's own, not cache content
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", hashlib.sha256(Path(full).read_bytes()).hexdigest())
    return out


def ls_json(kcache, root: Path) -> list[dict]:
    r = kcache("--cache-dir", root, "ls", "--json")
    assert r.exit_code == 0, r.stderr
    rows = r.json()["entries"]
    for row in rows:
        row.pop("modified")
        row.pop("last_used")
        row["path"] = os.path.relpath(row["path"], root)
    return sorted(rows, key=lambda d: d["path"])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("suffix", FORMATS)
def test_round_trip_real_caches(kcache, fixture_copy, tmp_path, layout, suffix):
    src = fixture_copy(layout)
    dst = tmp_path / "imported" / layout
    arc = tmp_path / f"{layout}{suffix}"
    r = kcache("--cache-dir", src, "export", arc)
    assert r.exit_code == 0, r.stderr
    assert arc.is_file() and not [p for p in arc.parent.iterdir() if "kcache-tmp" in p.name]
    r = kcache("--cache-dir", dst, "import", arc, "--json")
    assert r.exit_code == 0, r.stderr
    summary = r.json()
    assert summary["skipped"] == 0 and summary["imported"] == len(summary["entries"]) > 0
    assert all(e["done"] and e["action"] == "import" for e in summary["entries"])
    assert ls_json(kcache, dst) == ls_json(kcache, src)
    assert tree(dst) == tree(src)  # every file's sha256, every link's target, every directory
    if layout == "tilus":
        links = [p for p in dst.rglob("*") if p.is_symlink()]
        assert len(links) == 4
        for link in links:
            assert os.readlink(link).startswith("../") and link.resolve().is_dir()
            assert link.resolve().parent == (dst / "programs").resolve()
    r = kcache("--cache-dir", dst, "verify")
    assert r.exit_code == 0, r.stdout + r.stderr


def test_manifest_describes_entries(kcache, fixture_copy, tmp_path):
    import tarfile

    src = fixture_copy("hidet")
    arc = tmp_path / "h.tar.gz"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    with tarfile.open(arc) as tf:
        names = tf.getnames()
        assert names[0] == "manifest.json"
        manifest = json.load(tf.extractfile("manifest.json"))
    assert manifest["format"] == "kcache-archive" and manifest["kcache_version"]
    by_hash = {e["hash"]: e for e in manifest["entries"]}
    add = by_hash["8d1f7691cdf75e90"]
    assert (add["layout"], add["kind"], add["space"], add["op"]) == ("hidet", "op", "cuda_space_0", "add")
    assert add["relpath"] == "ops/cuda_space_0/add/8d1f7691cdf75e90"
    assert add["compiler"] == "nvcc" and add["arch"] == "sm_90a"
    lib = (src / add["relpath"] / "lib.so").read_bytes()
    assert add["files"]["lib.so"] == [len(lib), hashlib.sha256(lib).hexdigest()]
    assert add["locks"] == [".lock"] and ".lock" not in add["files"]  # lock files travel as names only
    assert not [n for n in names if n.endswith(".lock")]
    assert by_hash["064b4a6c035246e8"]["compiler"] == "g++"
    assert sum(p["entries"] for p in manifest["parts"]) == len(manifest["entries"]) == 5


@pytest.mark.parametrize("suffix", FORMATS)
def test_source_date_epoch_makes_exports_byte_identical(kcache, fixture_copy, tmp_path, monkeypatch, suffix):
    """Two exports of an unchanged cache differed (the manifest's `created` and its tar header's mtime
    were the clock's), so an archive could not be compared by hash. With SOURCE_DATE_EPOCH set they are
    that time and the archives are the same bytes, whatever the clock says (here it moves a day)."""
    import types

    from kcache_cli.archive import export
    from kcache_cli.fs import tarstream as ts

    src = fixture_copy("tilus")
    clock = iter(range(1_800_000_000, 1_800_000_000 + 10 * 86400, 86400))
    monkeypatch.setattr(export, "time", types.SimpleNamespace(time=lambda: float(next(clock))))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    for arc in (first, second):
        assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    assert first.read_bytes() == second.read_bytes()
    with open(first, "rb") as raw:
        reader = ts.TarReader(ts.open_source(raw)[0])
        head = reader.next()
        manifest = json.loads(b"".join(reader.data(head)))
        reader.close()
    assert head.name == "manifest.json" and head.mtime == 1700000000
    assert manifest["created"] == "2023-11-14T22:13:20+00:00"


@pytest.mark.parametrize("value", ["yesterday", "253402300800", "99999999999999999999", "9" * 5000])
def test_a_malformed_source_date_epoch_is_a_usage_error(kcache, fixture_copy, tmp_path, monkeypatch, value):
    """Not a number, or past 9999-12-31 (an OverflowError, exit 1, or a year of five digits in `created`)."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    r = kcache("--cache-dir", fixture_copy("hidet"), "export", tmp_path / "a.tar")
    assert r.exit_code == 2 and f"SOURCE_DATE_EPOCH={value[:40]!r}" in r.stderr and len(r.stderr) < 400, r.stderr
    assert not (tmp_path / "a.tar").exists()


def test_the_last_source_date_epoch_is_the_last_second_of_9999(kcache, fixture_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "253402300799")
    assert kcache("--cache-dir", fixture_copy("hidet"), "export", tmp_path / "a.tar").exit_code == 0
    with tarfile.open(tmp_path / "a.tar") as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest["created"] == "9999-12-31T23:59:59+00:00"


def test_gnu_tar_reads_our_archives(kcache, fixture_copy, tmp_path):
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("no tar")
    src = fixture_copy("tilus")
    for suffix, flags in ((".tar.gz", ["-xzf"]), (".tar", ["-xf"])):
        arc = tmp_path / f"t{suffix}"
        assert kcache("--cache-dir", src, "export", arc).exit_code == 0
        out = tmp_path / f"x{suffix}"
        out.mkdir()
        subprocess.run([tar, *flags, str(arc), "-C", str(out)], check=True)
        assert (out / "manifest.json").is_file()
        (out / "manifest.json").unlink()
        expected = {k: v for k, v in tree(src).items() if not k.endswith(".lock")}
        assert tree(out) == expected


def test_selectors_and_statuses(kcache, fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    # a partial entry: exported only when asked for by status
    partial = src / "ops/cpu_space_0/relu/31857fe085635b31/func_types.pickle"
    partial.unlink()
    arc = tmp_path / "a.tar.zst"
    r = kcache("--cache-dir", src, "export", arc, "--op", "relu", "--op", "add", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert [e["op"] for e in data["exported"]] == ["add"]
    assert [e["relpath"] for e in data["left_out"]] == ["ops/cpu_space_0/relu/31857fe085635b31"]
    r = kcache("--cache-dir", src, "export", arc, "--status", "partial", "--json")
    assert [e["op"] for e in r.json()["exported"]] == ["relu"]
    r = kcache("--cache-dir", src, "export", arc, "--space", "cpu_space_0", "--json")
    assert sorted(e["op"] for e in r.json()["exported"]) == ["fused", "matmul"]
    r = kcache("--cache-dir", src, "export", arc, "ad252b", "--json")
    assert [e["hash"] for e in r.json()["exported"]] == ["ad252b064b266eea"]


def test_export_status_matches_ls(kcache, fixture_copy, tmp_path):
    """export decides hidet statuses while reading (one pass); they must be ls's."""
    src = fixture_copy("hidet")
    (src / "ops/cpu_space_0/relu/31857fe085635b31/func_types.pickle").unlink()
    lib = src / "ops/cuda_space_0/add/8d1f7691cdf75e90/lib.so"
    lib.write_bytes(lib.read_bytes()[:100])  # truncated ELF: corrupt
    (src / "ops/cuda_space_0/softmax/ad252b064b266eea/lib.so").unlink()  # corrupt: compiler output, no lib.so
    for status in ("complete", "partial", "corrupt"):
        listed = sorted(e["hash"] for e in kcache("--cache-dir", src, "ls", "--status", status,
                                                  "--json").json()["entries"])
        r = kcache("--cache-dir", src, "export", tmp_path / "s.tar", "--status", status, "--json")
        assert r.exit_code == 0, r.stderr
        assert sorted(e["hash"] for e in r.json()["exported"]) == listed, status
        assert listed


def test_sources_only(kcache, fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    arc = tmp_path / "s.tgz"
    r = kcache("--cache-dir", src, "export", arc, "--sources-only", "--json")
    assert r.exit_code == 0, r.stderr
    assert all(e["omitted"] == ["lib.so"] for e in r.json()["exported"])
    dst = tmp_path / "dst"
    assert kcache("--cache-dir", dst, "import", arc).exit_code == 0
    assert not list(dst.rglob("*.so"))
    assert len(list(dst.rglob("source.c*"))) == 5
    statuses = {e["status"] for e in kcache("--cache-dir", dst, "ls", "--json").json()["entries"]}
    assert "complete" not in statuses  # to be rebuilt


def test_dry_run_writes_nothing(kcache, fixture_copy, tmp_path):
    src = fixture_copy("tilelang")
    arc = tmp_path / "t.tar.zst"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", arc, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["dry_run"] and data["imported"] == 2 and not any(e["done"] for e in data["entries"])
    assert not dst.exists()
    r = kcache("--cache-dir", dst, "import", arc, "--dry-run")
    assert "import" in r.stdout and "would import 2 entries" in r.stderr


def test_skips_present_and_replaces_incomplete(kcache, fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    arc = tmp_path / "h.tar.gz"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    dst = fixture_copy("hidet", dest="dst")
    broken = dst / "ops/cpu_space_0/matmul/064b4a6c035246e8"
    (broken / "func_types.pickle").unlink()  # partial: the archive's complete copy replaces it
    marker = broken / "stale-marker"
    marker.write_text("x")
    r = kcache("--cache-dir", dst, "import", arc, "--json")
    assert r.exit_code == 0, r.stderr
    actions = {e["hash"]: (e["action"], e["done"], e["reason"]) for e in r.json()["entries"]}
    assert actions["064b4a6c035246e8"][:2] == ("replace", True)
    assert sum(1 for a in actions.values() if a[0] == "skip" and "already present" in a[2]) == 4
    assert not marker.exists() and (broken / "func_types.pickle").is_file()
    assert tree(dst) == tree(src)
    assert not list((dst / ".kcache" / "trash").iterdir()) if (dst / ".kcache" / "trash").exists() else True
    r = kcache("--cache-dir", dst, "import", arc)  # a second time: everything is there
    assert r.exit_code == 0 and "skipped 5" in r.stderr


@pytest.mark.parametrize("blocker", ["link", "file"])
def test_an_entry_with_something_in_the_way_fails_the_import_under_quiet_too(kcache, fixture_copy, tmp_path, blocker):
    """A link on an entry's path (never written through) or a file where the entry goes: the rest is imported,
    the entry is skipped "in the way", and the import exits 1 with a one-line error that -q does not hide: a CI
    step whose import brought nothing of them must not pass, and importing again would mend nothing."""
    src = fixture_copy("hidet")
    arc = tmp_path / "h.tar"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    dst, victim = tmp_path / "dst", tmp_path / "victim"
    victim.mkdir()
    add = dst / "ops" / "cuda_space_0" / "add"
    add.parent.mkdir(parents=True)
    if blocker == "link":
        add.symlink_to(victim)
    else:
        add.mkdir()
        (add / "8d1f7691cdf75e90").write_text("not an entry")
    r = kcache("-q", "--cache-dir", dst, "import", arc)
    assert r.exit_code == 1 and r.stdout == "", r
    assert r.stderr.startswith("Error: 1 entry not imported, something in ") and len(r.stderr.splitlines()) == 1
    assert "ops/cuda_space_0/add/8d1f7691cdf75e90" in r.stderr
    assert not list(victim.iterdir())
    doc = kcache("--json", "--cache-dir", dst, "import", arc).json()
    assert doc["imported"] == 0 and doc["skipped"] == 5  # the other 4 came in the first time
    blocked = [e for e in doc["entries"] if e["reason"].startswith("in the way: ")]
    assert [e["hash"] for e in blocked] == ["8d1f7691cdf75e90"] and not blocked[0]["done"]
    assert len([p for p in dst.glob("ops/*/*/*") if p.is_dir()]) == 4  # each but the one in the way


def test_tilus_scripts_bring_their_programs(kcache, fixture_copy, tmp_path):
    src = fixture_copy("tilus")
    arc = tmp_path / "s.tar"
    r = kcache("--cache-dir", src, "export", arc, "--kind", "script", "--json")
    assert r.exit_code == 0, r.stderr
    assert sorted(e["kind"] for e in r.json()["exported"]) == ["program", "script"]
    # a script alone may come into a cache that has its program already
    dst = fixture_copy("tilus", dest="dst")
    shutil.rmtree(dst / "scripts")
    manifest_only_script = tmp_path / "script-only.tar"
    from archive_helpers import build_archive, entry_from_dir

    entry = entry_from_dir(src, "scripts/add_one/1-845a0ed6", "tilus", "script", op="add_one")
    build_archive(manifest_only_script, [entry])
    r = kcache("--cache-dir", dst, "import", manifest_only_script)
    assert r.exit_code == 0, r.stderr
    assert (dst / "scripts/add_one/1-845a0ed6/programs/0/module/lib.so").is_file()


def test_export_failure_leaves_nothing(kcache, fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    r = kcache("--cache-dir", src, "export", tmp_path / "nodir" / "a.tar")
    assert r.exit_code == 2 and r.stderr.startswith("Error:") and len(r.stderr.splitlines()) == 1  # usage (#36)
    r = kcache("--cache-dir", src, "export", tmp_path / "a.zip")
    assert r.exit_code == 2 and "tar.zst" in r.stderr
    r = kcache("--cache-dir", tmp_path / "missing", "export", tmp_path / "a.tar")
    assert r.exit_code == 2 and "does not exist" in r.stderr  # an explicit --cache-dir must exist
    r = kcache("export", tmp_path / "a.tar", env={"KCACHE_DIR": str(tmp_path / "missing")})
    assert r.exit_code == 1 and "no cache" in r.stderr
    assert not list(tmp_path.glob("*.tar*")) and not list(tmp_path.glob(".*kcache-tmp*"))


def test_an_archive_inside_the_cache_it_exports_is_refused(kcache, fixture_copy, tmp_path):
    """Written into an entry, the archive's temp files were read into the archive itself and the entry gained
    a foreign file that verify passed; written at the root, a stray file sat among the cache's own. Both
    refused, whichever way the path is spelt (a link to the cache too), nothing written."""
    src = fixture_copy("hidet")
    entry = next(src.glob("ops/*/*/*"))
    (tmp_path / "link").symlink_to(src)
    before = sorted(str(p) for p in src.rglob("*"))
    inside = (entry / "x.tar", src / "top.tar.zst", tmp_path / "link" / "ops" / "a.tar",
              src / ".." / src.name / "b.tgz")
    for where in inside:
        r = kcache("--cache-dir", src, "export", where)
        assert r.exit_code == 2 and "it lies inside the cache it exports" in r.stderr, (where, r)
        assert len(r.stderr.splitlines()) == 1
    assert sorted(str(p) for p in src.rglob("*")) == before
    assert kcache("--cache-dir", src, "export", tmp_path / "out.tar").exit_code == 0


def test_export_interrupted_leaves_no_archive(fixture_copy, tmp_path, monkeypatch):
    from kcache_cli.model.records import ScanFilter

    src = fixture_copy("hidet")
    plan = archive.plan_export(src, ScanFilter())

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(archive.export, "_entry_facts", boom)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        archive.export_archive(plan, str(out / "a.tar.gz"))
    assert list(out.iterdir()) == []


def _fake_nvidia_smi(tmp_path: Path, output: str | None) -> dict:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    if output is not None:
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\necho '{output}'\n")
        script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_arch_warnings(kcache, fixture_copy, tmp_path):
    src = fixture_copy("tilelang")
    arc = tmp_path / "t.tar.gz"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    r = kcache("--cache-dir", tmp_path / "a", "import", arc, env=_fake_nvidia_smi(tmp_path, "8.0"))
    assert r.exit_code == 0
    assert r.stderr.count("does not run on this machine's GPU") == 2 and "sm_90a" in r.stderr
    r = kcache("--cache-dir", tmp_path / "b", "import", arc, "--json", env=_fake_nvidia_smi(tmp_path, "9.0"))
    assert "does not run" not in r.stderr and r.json()["gpu"] == ["9.0"]
    assert all(e["arch_ok"] for e in r.json()["entries"])
    shutil.rmtree(tmp_path / "fakebin")
    r = kcache("--cache-dir", tmp_path / "c", "import", arc, env=_fake_nvidia_smi(tmp_path, None))
    assert r.stderr.count("archs were not checked") == 1 and "warning:" not in r.stderr, r.stderr


def test_quiet_import_and_export_print_nothing_when_they_work(kcache, fixture_copy, tmp_path):
    """-q is for cron and CI: silent on success. import printed a row per entry (skips too) and a note that
    no GPU was found on every CPU runner; export printed "exported ...". A real warning still shows."""
    src, arc, dest = fixture_copy("tilelang"), tmp_path / "t.tar.gz", tmp_path / "d"
    r = kcache("-q", "--cache-dir", src, "export", arc)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "") and arc.is_file()
    no_gpu = _fake_nvidia_smi(tmp_path, None)
    for _ in range(2):  # imported, then every entry skipped as present
        r = kcache("-q", "--cache-dir", dest, "import", arc, env=no_gpu)
        assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    assert len(kcache("--cache-dir", dest, "ls", "--json").json()["entries"]) == 2
    r = kcache("--cache-dir", dest, "import", arc, env=no_gpu)  # not quiet: the rows and the totals
    assert r.stdout.count("already present") == 2 and "skipped 2" in r.stderr
    r = kcache("-q", "--json", "--cache-dir", tmp_path / "f", "import", arc, env=no_gpu)
    assert r.json()["imported"] == 2 and r.stderr == ""
    (tmp_path / "gpu").mkdir()
    r = kcache("-q", "--cache-dir", tmp_path / "e", "import", arc, env=_fake_nvidia_smi(tmp_path / "gpu", "8.0"))
    assert r.stdout == "" and r.stderr.count("warning: ") == 2 and "does not run on this machine" in r.stderr


def test_the_import_arch_warning_goes_by_the_layouts_rule(kcache, fixture_copy, tmp_path):
    """Triton looks a kernel up only on a GPU of its exact capability (its Layout.runs_on): its sm_80 kernels
    imported on an 8.6 GPU are never used, though the driver would load them. Import judged by the driver's
    rule: it warned of the sm_90a kernels only and said arch_ok for the sm_80 ones."""
    arc = tmp_path / "t.tar.gz"
    assert kcache("--cache-dir", fixture_copy("triton") / "cache", "export", arc).exit_code == 0
    r = kcache("--cache-dir", tmp_path / "a", "import", arc, "--json", env=_fake_nvidia_smi(tmp_path, "8.6"))
    assert r.exit_code == 0, r.stderr
    entries = r.json()["entries"]
    assert sorted(e["arch"] for e in entries) == ["sm_80"] * 3 + ["sm_90a"] * 3
    assert all(e["arch_ok"] is False for e in entries)
    assert r.stderr.count("is built for sm_80, which does not run on this machine's GPU") == 3
    r = kcache("--cache-dir", tmp_path / "b", "import", arc, "--json", env=_fake_nvidia_smi(tmp_path, "8.0"))
    assert {e["arch"]: e["arch_ok"] for e in r.json()["entries"]} == {"sm_80": True, "sm_90a": False}


def test_arch_rules():
    assert archive.arch_runs_on("sm_90a", [(9, 0)]) is True
    assert archive.arch_runs_on("sm_90a", [(10, 0)]) is False
    assert archive.arch_runs_on("sm_80", [(8, 6)]) is True
    assert archive.arch_runs_on("sm_86", [(8, 0)]) is False
    assert archive.arch_runs_on("sm_80,compute_80", [(9, 0)]) is True  # PTX JIT
    assert archive.arch_runs_on("x86-64", [(9, 0)]) is None
    assert archive.archs_from_command("nvcc -gencode arch=compute_90a,code=sm_90a x.cu") == "sm_90a"
    assert archive.archs_from_command("nvcc -arch=sm_80 x.cu") == "sm_80,compute_80"
    assert archive.archs_from_command("g++ -O3 x.cc") is None


@pytest.fixture
def many_parts(monkeypatch):
    """Make the multi-part, forked-worker path run on a small cache."""
    from kcache_cli.util import parallel

    for module in (archive.export, archive.importer):
        monkeypatch.setattr(module, "PARALLEL_MIN_ENTRIES", 4)
    monkeypatch.setattr(parallel, "cpus", lambda: 2)
    monkeypatch.setattr(archive.export, "ENTRIES_PER_PART", 3)


def _generated(tmp_path: Path, n: int) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_cache import generate

    root = tmp_path / "gen"
    generate(str(root), n)  # lib.so files carry a whole ELF header: the entries are complete
    return root


@pytest.mark.parametrize("suffix", FORMATS)
def test_parallel_parts_round_trip(kcache, tmp_path, many_parts, suffix):
    src = _generated(tmp_path, 40)
    arc = tmp_path / f"g{suffix}"
    r = kcache("--cache-dir", src, "export", arc, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["entry_count"] == 40
    import tarfile

    mode = "r:*" if suffix != ".tar.zst" else None
    if mode:
        with tarfile.open(arc, mode) as tf:
            manifest = json.load(tf.extractfile("manifest.json"))
        assert len(manifest["parts"]) > 2
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", arc, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["imported"] == 40
    assert tree(dst) == tree(src)
    assert ls_json(kcache, dst) == ls_json(kcache, src)


def test_parallel_rejection_leaves_cache_unchanged(kcache, tmp_path, many_parts):
    """A damaged byte in a late part: workers abort, nothing is published."""
    src = _generated(tmp_path, 40)
    arc = tmp_path / "g.tar"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    data = bytearray(arc.read_bytes())
    i = data.rfind(b"elapsed time: 1.0 seconds")  # a file in the last part
    data[i] ^= 1
    arc.write_bytes(bytes(data))
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", arc)
    assert r.exit_code == 1 and "sha256" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not dst.exists()


def test_import_refuses_an_archive_of_another_layout(kcache, fixture_copy, tmp_path):
    """Each layout's archive goes into a new root, which takes its layout; a tilus archive into that hidet
    root is refused (tilus never looks there), naming where tilus's cache is. A root that already holds
    both layouts takes either."""
    roots = {}
    for layout in LAYOUTS:
        arc = tmp_path / f"{layout}.tar.zst"
        assert kcache("--cache-dir", fixture_copy(layout), "export", arc).exit_code == 0
        roots[layout] = tmp_path / f"new-{layout}"
        assert kcache("--cache-dir", roots[layout], "import", arc).exit_code == 0
        rows = kcache("--cache-dir", roots[layout], "ls", "--json").json()["entries"]
        assert {r["layout"] for r in rows} == {layout} and all(r["status"] == "complete" for r in rows)
        assert kcache("--cache-dir", roots[layout], "verify").exit_code == 0
    before = sorted(p.name for p in roots["hidet"].iterdir())
    r = kcache("--cache-dir", roots["hidet"], "import", tmp_path / "tilus.tar.zst")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "tilus" in r.stderr and "kcache dir --all" in r.stderr and ".cache/tilus" in r.stderr
    assert sorted(p.name for p in roots["hidet"].iterdir()) == before
    mixed = fixture_copy("hidet", dest="mixed")
    shutil.copytree(fixture_copy("tilus", dest="t2") / "programs", mixed / "programs", symlinks=True)
    assert kcache("--cache-dir", mixed, "import", tmp_path / "tilus.tar.zst").exit_code == 0


def test_a_folder_that_holds_no_cache_takes_no_archive(kcache, fixture_copy, tmp_path):
    """A root that is not empty and holds no cache (a project's folder, a KCACHE_DIR set to /dev) takes
    nothing: one line naming what is there, nothing written. An empty root, or one holding only kcache's
    own .kcache/, takes the archive's layout as a new one does."""
    arc = tmp_path / "h.tar"
    assert kcache("--cache-dir", fixture_copy("hidet"), "export", arc).exit_code == 0
    folder = tmp_path / "project"
    (folder / "src").mkdir(parents=True)
    (folder / "README").write_text("hi\n")
    r = kcache("--cache-dir", folder, "import", arc)
    assert (r.exit_code, r.stdout) == (1, "") and len(r.stderr.splitlines()) == 1, r.stderr
    assert "holds no kernel cache, yet is not empty ('README' and 1 more)" in r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["README", "src"]
    for empty in (tmp_path / "empty", tmp_path / "state-only" / ".kcache"):
        empty.mkdir(parents=True)
        where = empty if empty.name == "empty" else empty.parent
        assert kcache("--cache-dir", where, "import", arc).exit_code == 0
        assert {e["status"] for e in kcache("--cache-dir", where, "ls", "--json").json()["entries"]} == {"complete"}


def test_a_fifo_named_as_the_archive_is_refused_at_once(tmp_path):
    """open() of a FIFO nobody writes blocks for ever: import refuses it (and a device) before opening it."""
    fifo = tmp_path / "a.tar"
    os.mkfifo(fifo)
    for arc in (fifo, "/dev/zero"):
        for where in (("--cache-dir", str(tmp_path / "new")), ()):  # a process of its own: a hang fails
            r = subprocess.run([sys.executable, "-m", "kcache_cli", *where, "import", str(arc)], timeout=60,
                               capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
            assert r.returncode == 2 and "not a regular file" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "new").exists()


def test_an_unknown_layout_is_refused_as_such_before_any_message_names_it(kcache, fixture_copy, tmp_path):
    """A manifest whose layout is no layout ("../../etc") was taken for another layout's archive: "the
    archive holds ../../etc entries but ... is a hidet cache, where ../../etc never looks; import it into
    the ../../etc cache with --cache-dir (see; ...)". It is refused as unknown, whatever the root; and a
    layout with no default cache (jax) no longer reads "(see; `kcache dir --all` lists them)"."""
    from archive_helpers import build_archive, entry, hidet_entry

    root = fixture_copy("hidet")
    rec, members = hidet_entry()
    rec["layout"] = "../../etc"
    arc = build_archive(tmp_path / "a.tar", [(rec, members)])
    for where in (root, tmp_path / "new"):
        r = kcache("--cache-dir", where, "import", arc)
        assert (r.exit_code, r.stdout) == (1, "")
        assert r.stderr == "Error: archive rejected: manifest entry 0: unknown layout '../../etc'\n"
    assert not (tmp_path / "new").exists()
    item = kcache("explain", arc, "--json").json()["items"][0]
    assert item["why"] == "unknown layout '../../etc': this kcache does not know it"  # as pull says of a remote's
    assert item["layout"] is None  # (explain.json: null, no layout kcache knows; it was the raw name)
    jax = build_archive(tmp_path / "jax.tar", [entry("jax_cache/abc", {"f": b"x"}, layout="jax", kind="executable")])
    r = kcache("--cache-dir", root, "import", jax)
    assert r.exit_code == 1 and "(see;" not in r.stderr and r.stderr.endswith(
        "import it into the jax cache with --cache-dir (`kcache dir --all` lists them)\n"), r.stderr


def test_export_skips_entry_with_outward_link(kcache, fixture_copy, tmp_path):
    src = fixture_copy("hidet")
    entry = src / "ops/cpu_space_0/fused/af3046266c6abdd1"
    os.symlink("/etc/hostname", entry / "escape")
    r = kcache("--cache-dir", src, "export", tmp_path / "a.tar", "--json")
    assert r.exit_code == 0
    data = r.json()
    assert "af3046266c6abdd1" not in {e["hash"] for e in data["exported"]}
    assert any("escape" in e["reason"] and "absolute" in e["reason"] for e in data["left_out"])


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kcache_cli", *args]


def test_concurrent_imports_of_one_archive(tmp_path):
    src = _generated(tmp_path, 60)
    arc = tmp_path / "g.tar.zst"
    subprocess.run(_cli("-q", "--cache-dir", str(src), "export", str(arc)), check=True, capture_output=True)
    dst = tmp_path / "dst"
    procs = [subprocess.Popen(_cli("--cache-dir", str(dst), "import", str(arc), "--json"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    done = [sum(e["done"] for e in json.loads(o[0])["entries"]) for o in outs]
    assert sum(done) == 60  # each entry published exactly once, the others skipped it
    assert tree(dst) == tree(src)
    assert not [p for p in (dst / ".kcache").iterdir() if p.name.startswith("import-")]


def test_killed_import_leaves_only_whole_entries(tmp_path):
    """Killed at whatever moment: each entry is there whole or not at all; only the staging
    directory (under .kcache/, listed by ls as a partial `kcache` leftover that prune removes) is left
    behind."""
    import signal
    import time

    src = _generated(tmp_path, 1500)
    arc = tmp_path / "g.tar"
    subprocess.run(_cli("-q", "--cache-dir", str(src), "export", str(arc)), check=True, capture_output=True)
    dst = tmp_path / "dst"
    proc = subprocess.Popen(_cli("-q", "--cache-dir", str(dst), "import", str(arc)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30  # kill it once it has started publishing (or at the latest moment)
    while time.monotonic() < deadline and proc.poll() is None and not (dst / "ops").exists():
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    want = tree(src)
    got = tree(dst) if dst.exists() else {}
    entries = {os.path.dirname(k) for k, v in got.items() if v[0] == "file"}
    for e in entries:
        mine = {k: v for k, v in got.items() if k.startswith(e + os.sep)}
        assert mine == {k: v for k, v in want.items() if k.startswith(e + os.sep)}, e
    if dst.exists():
        rows = subprocess.run(_cli("--cache-dir", str(dst), "ls", "--json"), capture_output=True, text=True).stdout
        assert all(r["status"] == "complete" for r in json.loads(rows)["entries"] if r["layout"] != "kcache")
        assert all(r["kind"] == "import" and r["status"] == "partial" for r in json.loads(rows)["entries"]
                   if r["layout"] == "kcache")


def test_stale_staging_is_removed_after_a_good_import(kcache, fixture_copy, tmp_path):
    src = fixture_copy("tilus")
    arc = tmp_path / "t.tar"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    dst = tmp_path / "dst"
    stale = dst / ".kcache" / "import-999999999-abcd"
    (stale / "programs").mkdir(parents=True)
    fresh = dst / ".kcache" / f"import-{os.getpid()}-abcd"  # a live pid: may be an import in progress
    fresh.mkdir()
    old = 1_000_000_000
    os.utime(stale, (old, old))
    assert kcache("--cache-dir", dst, "import", arc).exit_code == 0
    assert not stale.exists() and fresh.exists()  # a young one may belong to an import in progress


def test_rename_noreplace_never_replaces(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.mkdir()
    dst.mkdir()  # a plain rename would silently replace this empty directory
    from kcache_cli.fs import write as fswrite

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(FileExistsError):
            fswrite.rename_noreplace_at(fd, "a", fd, "b")
        dst.rmdir()
        fswrite.rename_noreplace_at(fd, "a", fd, "b")
    finally:
        os.close(fd)
    assert dst.is_dir() and not src.exists()


def test_publish_across_filesystems_copies_then_renames(kcache, fixture_copy, tmp_path, monkeypatch):
    """When the staging directory and the entry's place are on different filesystems (a mount inside
    the cache), the entry is copied next to its place and renamed there."""
    import errno

    real = archive.importer.rename_noreplace_at

    def cross_device(src_fd, src, dst_fd, dst):
        if src_fd != dst_fd:  # from the staging directory into the cache
            raise OSError(errno.EXDEV, "Invalid cross-device link", dst)
        return real(src_fd, src, dst_fd, dst)

    monkeypatch.setattr(archive.importer, "rename_noreplace_at", cross_device)
    src = fixture_copy("tilus")
    for p in [src, *src.rglob("*")]:
        os.utime(p, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
    arc = tmp_path / "t.tar"
    assert kcache("--cache-dir", src, "export", arc).exit_code == 0
    dst = tmp_path / "dst"
    r = kcache("--cache-dir", dst, "import", arc)
    assert r.exit_code == 0, r.stderr
    # the copy keeps the archive's times, as the rename would: the entries' last uses are the exported ones
    # (asked before tree() reads the files, which is a use where the mount records reads)
    used = {e["last_used"] for e in kcache("--cache-dir", dst, "ls", "--json").json()["entries"]}
    assert used == {"2023-11-14T22:13:20+00:00"}
    assert tree(dst) == tree(src)
    assert not list(dst.rglob(".kcache-tmp-*"))


def test_export_judges_a_misshapen_directory_as_ls_and_verify_do(kcache, fixture_copy, tmp_path):
    """A directory where a hidet entry lives under a name hidet never makes (not 16 hex digits) is corrupt
    to ls, verify and inspect ("hidet never looks it up"); export said "partial: no lib.so ... (select it
    with --status partial)", and `export --status partial` shipped it while `ls --status partial` lists
    nothing. Export goes by the same status."""
    root = fixture_copy("hidet")
    (root / "ops/cpu_space_0/matmul/deadbeefzz").mkdir()
    assert [e["hash"] for e in kcache("--cache-dir", root, "ls", "--status", "corrupt", "--json").json()["entries"]] \
        == ["deadbeefzz"]
    r = kcache("--cache-dir", root, "export", tmp_path / "a.tar")
    assert r.exit_code == 0 and "left out ops/cpu_space_0/matmul/deadbeefzz: corrupt: not shaped like" in r.stderr
    r = kcache("--cache-dir", root, "export", tmp_path / "b.tar", "--status", "partial", "--json")
    assert r.exit_code == 0 and r.json()["archive"] is None, r.stdout


def test_size_and_age_selectors_work_on_export_verify_and_push(kcache, fixture_copy, tmp_path):
    """The README's promise: --min-size, --max-size, --older-than and --newer-than select on ls, export,
    verify and push alike (one ScanFilter), and export ships what ls lists."""
    from typer.main import get_command

    from kcache_cli.cli.app import full_app

    commands = get_command(full_app()).commands
    for name in ("ls", "export", "verify", "push"):
        opts = {o for p in commands[name].params for o in p.opts}
        assert {"--min-size", "--max-size", "--older-than", "--newer-than"} <= opts, name
    src = fixture_copy("hidet")
    listed = {e["hash"] for e in kcache("--cache-dir", src, "--json", "ls", "--min-size", "80k").json()["entries"]}
    assert 0 < len(listed) < 5
    doc = kcache("--cache-dir", src, "--json", "export", "--min-size", "80k", tmp_path / "big.tar").json()
    assert {e["hash"] for e in doc["exported"]} == listed
    checked = kcache("--cache-dir", src, "--json", "verify", "--max-size", "80k").json()
    assert checked["checked"] == 5 - len(listed) and checked["ok"] == checked["checked"]
    none = kcache("--cache-dir", src, "export", "--newer-than", "1d", "--older-than", "2d", tmp_path / "n.tar")
    assert none.exit_code == 0 and "nothing to export" in none.stderr and not (tmp_path / "n.tar").exists()


def test_an_empty_archive_name_is_a_usage_error(kcache, fixture_copy, tmp_path, monkeypatch):
    """`kcache import "$ARCHIVE"` with the variable unset: said so (exit 2), not "cannot read <cwd>"."""
    monkeypatch.chdir(tmp_path)
    r = kcache("--cache-dir", fixture_copy("hidet"), "import", "")
    assert r.exit_code == 2 and r.stderr == ("Error: ARCHIVE is empty (an unset shell variable?): name the archive, "
                                             "or - for a pipe\n"), r.stderr
