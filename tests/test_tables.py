"""Tables at 80 columns keep op and size (issue 25): on every real fixture, `ls` and `stats` show each
entry's op and size whole and a hash prefix of at least 8 characters that names it; `ls --limit` says
how many of how many; `ls --min-size/--max-size/--older-than/--newer-than` select."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, SHARED_FIXTURES, copy_tree

from kcache_cli.cli.table import HASH_MIN, Column, hash_floor, render
from kcache_cli.util.units import format_size

ROOTS = [(where, name) for where in ("repo", "shared") for name in ("hidet", "tilus", "tilelang", "triton/cache")]


@pytest.fixture(params=ROOTS, ids=[f"{w}-{n.split('/')[0]}" for w, n in ROOTS])
def real_root(request, tmp_path) -> Path:
    where, name = request.param
    src = (FIXTURES if where == "repo" else SHARED_FIXTURES) / name
    if not src.is_dir():
        pytest.skip(f"fixture {src} not found (set KCACHE_SHARED_FIXTURES)")
    return copy_tree(src, tmp_path / name.split("/")[0])


def entries_of(kcache, root: Path) -> list[dict]:
    r = kcache("--cache-dir", root, "ls", "--json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    return doc["entries"] if isinstance(doc, dict) else doc


def row_of(lines: list[str], e: dict) -> list[str]:
    """The table rows (lines not indented) that show a prefix of `e`'s hash of at least 8 characters."""
    return [ln for ln in lines if ln and not ln.startswith(" ")
            and any(len(w) >= min(HASH_MIN, len(e["hash"])) and e["hash"].startswith(w) for w in ln.split())]


def test_ls_at_80_columns_keeps_op_and_size_whole(kcache, real_root):
    entries = entries_of(kcache, real_root)
    assert entries
    r = kcache("--cache-dir", real_root, "ls", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(ln) <= 80 for ln in lines), lines
    header = lines[0].split()
    assert {"hash", "size", "status"} <= set(header), lines[0]
    # op and space show, unless no entry has one (a column of `-` only goes first when the row is too wide)
    assert "op" in header or not any(e["op"] for e in entries), lines[0]
    for e in entries:
        rows = row_of(lines[1:], e)
        assert rows, f"no row shows {e['hash']}:\n{r.stdout}"
        row = next((ln for ln in rows if "space" not in header or (e["space"] or "-") in ln.split()), None)
        assert row is not None, f"{e['hash']} in {e['space']}: space shown as {rows}"
        assert "op" not in header or (e["op"] or "-") in row.split(), f"op of {e['hash']} cut: {row!r}"
        assert format_size(e["size"]) in row, f"size of {e['hash']} cut: {row!r}"
        assert e["status"] in row.split()


def test_stats_biggest_keeps_its_size_column(kcache, real_root):
    entries = entries_of(kcache, real_root)
    r = kcache("--cache-dir", real_root, "stats", "--top", "100", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(ln) <= 80 for ln in lines), lines
    head = next(i for i, ln in enumerate(lines) if ln.startswith("biggest"))
    blank = not any(e.get("op") for e in entries)  # (tilelang's: a column of `-` is the first to go)
    assert {"size", "status"} | (set() if blank else {"op"}) <= set(lines[head].split())
    for e in entries:
        rows = row_of(lines[head + 1:], e)
        assert rows and any(format_size(e["size"]) in ln for ln in rows), f"{e['hash']}:\n{r.stdout}"


def test_no_space_is_a_dash_not_the_target(kcache, fixture_copy):
    root = fixture_copy("tilus")
    lines = kcache("--cache-dir", root, "ls", env={"COLUMNS": "200"}).stdout.splitlines()
    col = lines[0].split().index("space")
    assert {ln.split()[col] for ln in lines[1:]} == {"-"}


def test_hidet_graphs_keep_their_kind_at_80_columns(kcache, tmp_path):
    root = copy_tree(FIXTURES / "hidet", tmp_path / "hidet")
    graph = root / "graphs" / "0123456789abcdef"  # hidet's graph cache: a graph.hidet file per hash
    graph.mkdir(parents=True)
    (graph / "graph.hidet").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: hidet's format
    kinds = {e["kind"] for e in entries_of(kcache, root)}
    if kinds == {"op"}:
        pytest.skip("this build's hidet layout lists no graph entries")
    lines = kcache("--cache-dir", root, "ls", env={"COLUMNS": "80"}).stdout.splitlines()
    assert "kind" in lines[0].split()


def test_numbers_are_right_aligned(kcache, fixture_copy):
    root = fixture_copy("hidet")
    lines = kcache("--cache-dir", root, "ls", env={"COLUMNS": "200"}).stdout.splitlines()
    end = lines[0].index("size") + len("size")
    assert all(ln[end - 2:end] == "kB" for ln in lines[1:])


def test_a_right_aligned_column_stays_aligned_when_the_path_goes_below(kcache, tmp_path):
    """`COLUMNS=50 kcache dir --all` put each path on its own line, and the size column, last in the row
    then, was left unpadded: `376.8 kB` above `86.0 kB`, flush left. A number is right-aligned wherever
    its column stands."""
    home = Path(os.environ["HOME"])
    copy_tree(FIXTURES / "hidet", home / ".cache" / "hidet")
    copy_tree(FIXTURES / "tilelang", home / ".tilelang" / "cache")
    lines = kcache("dir", "--all", env={"COLUMNS": "50"}).stdout.splitlines()
    assert lines[0].split()[-1] == "size" and lines[1].startswith("hidet"), lines  # the path went below
    end = len(lines[0])
    rows = [ln for ln in lines[1:] if not ln.startswith(" ")]
    assert all(len(ln) == end and ln.endswith(("B", "-")) for ln in rows), lines
    cols = [Column("cache"), Column("size", right=True), Column("path", wrap=True)]
    table = render(cols, [["hidet", "376.8 kB", "~/" + "p" * 60], ["tilelang", "86.0 kB", "~/q"]], 40)
    assert [ln[-8:] for ln in table if not ln.startswith(" ")] == ["    size", "376.8 kB", " 86.0 kB"], table

def test_hash_floor_is_the_shortest_unique_prefix():
    assert hash_floor(["8d1f7691cdf75e90", "af3046266c6abdd1"]) == HASH_MIN
    assert hash_floor(["abcdef0123456789", "abcdef0123999999"]) == 11
    assert hash_floor(["abcdef0123456789", "abcdef0123456789"]) == HASH_MIN  # one hash in two spaces
    assert hash_floor(["1-845a0e"]) == 8 and hash_floor(["abc"]) == 3 and hash_floor([]) == 0


def test_render_cuts_the_hash_never_op_or_size():
    cols = [Column("space", drop=8), Column("op", drop=7), Column("hash", spill=True),
            Column("size", right=True, drop=5), Column("last used", drop=4)]
    rows = [["sm_90a", "matmul_kernel_with_a_long_name", "A" * 52, "1.2 MB", "3 days ago"],
            ["sm_80", "add_kernel", "B" * 52, "40.0 kB", "2 minutes ago"]]
    lines = render(cols, rows, 80)
    assert all(len(ln) <= 80 for ln in lines)
    assert "matmul_kernel_with_a_long_name" in lines[1] and "1.2 MB" in lines[1] and "last used" in lines[0]
    assert "A" * 8 in lines[1] and "A" * 52 not in lines[1]


# ---- nothing lost without a sign: blank columns first, cut names marked ---------------------------------
def test_a_blank_column_goes_before_a_value_is_cut(kcache, tmp_path):
    """`COLUMNS=40 kcache ls` of a torch extensions cache showed `kc_add_on` (the name cut, no mark) beside
    `space` and `op` columns holding only `-`: those go first now, and the name shows whole."""
    root = copy_tree(FIXTURES / "torch_ext", tmp_path / "ext")
    for p in [root, *root.rglob("*")]:  # used just now, whenever the checkout was made ("now", not "3 hours ago")
        os.utime(p, follow_symlinks=False)
    for width in (40, 50):
        r = kcache("--cache-dir", root, "ls", env={"COLUMNS": str(width)})
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        assert all(len(ln) <= width for ln in lines), lines
        header = lines[0].split()
        assert "space" not in header and "op" not in header and "status" in header, lines
        assert lines[1].split()[header.index("hash")] == "kc_add_one", lines


def _long_named_extension(src: Path, dst: Path, name: str) -> None:
    """A copy of the kc_add_one extension built under another name: its directory, module and build.ninja."""
    copy_tree(src, dst)
    ninja = dst / "build.ninja"
    ninja.write_text(ninja.read_text().replace("kc_add_one", name))
    (dst / "kc_add_one.so").rename(dst / f"{name}.so")


def test_a_name_cut_short_ends_in_an_ellipsis(kcache, tmp_path):
    """A value too long for its column is marked where it is cut (`…`), and what stands before the mark
    still names one entry; a hash is cut to a prefix without a mark, as ls documents."""
    from test_torchext import built_here

    root = built_here(tmp_path / "ext")  # as torch builds it there: complete, not a copy (moved)
    long = "kc_add_one_with_a_rather_long_name"
    _long_named_extension(root / "kc_add_one", root / long, long)
    listed = {e["hash"]: e["status"] for e in entries_of(kcache, root)}
    assert listed == {"kc_add_one": "complete", long: "complete"}
    r = kcache("--cache-dir", root, "ls", env={"COLUMNS": "30"})
    lines = r.stdout.splitlines()
    assert all(len(ln) <= 30 for ln in lines), lines
    shown = [ln.split()[0] for ln in lines[1:]]
    assert shown[0] == "kc_add_one" and shown[1].endswith("\u2026") and len(shown[1]) < len(long), lines
    prefix = shown[1][:-1]
    assert long.startswith(prefix) and not "kc_add_one".startswith(prefix), shown
    assert kcache("--cache-dir", root, "ls", "--json", prefix).json()["entries"][0]["hash"] == long


def test_render_marks_a_cut_name_but_not_a_cut_hash():
    cols = [Column("hash", spill=True), Column("status")]
    hashes = [["8d1f7691cdf75e90", "complete"], ["ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA", "complete"],
              ["fos42gzgpwdtw65e5yozpzjsibj5qjnauu3rcq2uypagpsvl63l6", "complete"]]
    lines = render(cols, hashes, 20)
    assert [ln.split()[0] for ln in lines[1:]] == [h[:10] for h, _ in hashes]  # the room left: 10 characters
    names = [["kc_add_one_with_a_rather_long_name", "complete"], ["kc_add_two_with_a_rather_long_name", "partial"]]
    lines = render(cols, names, 20)
    assert [ln.split()[0] for ln in lines[1:]] == ["kc_add_on\u2026", "kc_add_tw\u2026"]  # 8 tell them apart
    assert all(len(ln) <= 20 for ln in lines)


def test_a_name_stays_whole_before_free_text_gets_a_column():
    """`COLUMNS=80 kcache ls` of a torch extensions cache cut the name to `kc_add_o…` to give the reason its
    28-column minimum: a name cut short names nothing whole, so the free text goes on its own line (or
    pushes out a minor column) first. A hash is still cut to its unique prefix to keep the text inline."""
    cols = [Column("layout", drop=1), Column("kind", drop=2), Column("space", drop=8), Column("op", drop=9),
            Column("hash", spill=True), Column("size", right=True, drop=10), Column("files", right=True, drop=3),
            Column("status"), Column("last used", drop=4), Column("reason", wrap=True)]
    reason = ("build.ninja records its build directory as /tmp/wt37fx/torch_ext/kc_add_one (moved or copied): "
              "torch builds it again here on the next load")
    row = ["torchext", "extension", "-", "-", "kc_add_one", "532.5 kB", "6", "moved", "10 minutes ago", reason]
    for width in (70, 80, 90):
        lines = render(cols, [row], width)
        assert all(len(ln) <= width for ln in lines), lines
        assert lines[1].split()[lines[0].split().index("hash")] == "kc_add_one", lines
        assert "\u2026" not in "".join(lines), lines
    hashed = [*row[:4], "ad252b064b266eea", *row[5:]]  # a hash may be cut: its prefix is what tables show
    lines = render(cols, [hashed], 80)
    assert lines[0].split()[-1] == "reason" and "ad252b06" in lines[1] and "ad252b064b266eea" not in lines[1]


def test_render_drops_blank_columns_first_whatever_their_priority():
    cols = [Column("kind", drop=1), Column("space", drop=8), Column("op", drop=9), Column("hash", spill=True),
            Column("status"), Column("reason", wrap=True)]
    rows = [["extension", "-", "-", "0123456789abcdef", "complete", ""],
            ["extension", "", "-", "fedcba9876543210", "complete", "-"]]
    lines = render(cols, rows, 44)
    assert lines[0].split() == ["kind", "hash", "status"], lines
    assert "0123456789abcdef" in lines[1] and all(len(ln) <= 44 for ln in lines)
    assert render(cols, rows, 80)[0].split() == ["kind", "space", "op", "hash", "status", "reason"]  # it fits


# ---- ls --limit and the size/age selectors -------------------------------------------------------
def test_ls_limit_says_n_of_m(kcache, fixture_copy):
    root = fixture_copy("hidet")
    r = kcache("--cache-dir", root, "ls", "--limit", "2")
    assert r.exit_code == 0
    assert "2 of 5 entries" in r.stderr, r.stderr
    whole = kcache("--cache-dir", root, "ls")
    assert "5 entries" in whole.stderr and " of " not in whole.stderr.split(" in ")[0]


def test_ls_selects_on_size(kcache, fixture_copy):
    root = fixture_copy("hidet")
    entries = entries_of(kcache, root)
    big = kcache("--cache-dir", root, "ls", "--min-size", "40k", "--json")
    assert big.exit_code == 0
    got = entries_of(kcache, root) and (big.json()["entries"] if isinstance(big.json(), dict) else big.json())
    assert {e["hash"] for e in got} == {e["hash"] for e in entries if e["size"] >= 40_000}
    one = next(e["size"] for e in entries if e["hash"] == "064b4a6c035246e8")  # bytes on disk
    small = kcache("--cache-dir", root, "ls", "--max-size", f"{one}B", "--min-size", f"{one}B", "--json").json()
    assert {e["hash"] for e in small["entries"]} == {e["hash"] for e in entries if e["size"] == one}
    assert "064b4a6c035246e8" in {e["hash"] for e in small["entries"]}
    for bad in (["--min-size", "10"], ["--max-size", "lots"], ["--min-size", "2M", "--max-size", "1M"]):
        r = kcache("--cache-dir", root, "ls", *bad)
        assert r.exit_code == 2 and r.stdout == "", (bad, r.stdout, r.stderr)


def test_ls_selects_on_age(kcache, fixture_copy):
    root = fixture_copy("hidet")
    old = root / "ops/cpu_space_0/relu/31857fe085635b31"
    then = time.time() - 40 * 86400
    for dirpath, dirnames, filenames in os.walk(old):
        for n in dirnames + filenames + ["."]:
            os.utime(os.path.join(dirpath, n), (then, then), follow_symlinks=False)
    older = kcache("--cache-dir", root, "ls", "--older-than", "30d", "-q")
    assert older.exit_code == 0 and older.stdout.split() == [str(old)], older.stdout
    newer = kcache("--cache-dir", root, "ls", "--newer-than", "1d", "-q").stdout.split()
    assert len(newer) == 4 and str(old) not in newer
    assert kcache("--cache-dir", root, "ls", "--older-than", "30").exit_code == 2


def test_wide_and_combining_characters_are_measured_in_terminal_cells():
    """An op named in CJK (two columns a character) or with combining marks (none) keeps the columns
    after it aligned and the row within the width."""
    from kcache_cli.cli.table import cells

    cols = [Column("op"), Column("hash", spill=True), Column("status"), Column("reason", wrap=True)]
    rows = [["行列積演算子", "8d1f7691cdf75e90aa", "complete", ""],
            ["cafe\u0301", "ad252b064b266eea00", "corrupt", "lib.so is empty"],
            ["matmul", "064b4a6c035246e800", "complete", ""]]
    assert cells("行列積") == 6 and cells("cafe\u0301") == 4 and cells("ascii") == 5
    for width in (None, 80, 40):
        lines = render(cols, rows, width)
        status_at = set()
        for line in lines[1:]:
            assert width is None or cells(line) <= width, line
            col = next((i for i in range(len(line)) if line[i:].startswith(("complete", "corrupt"))), None)
            if col is not None:  # (a reason on its own line below its row has none)
                status_at.add(cells(line[:col]))
        assert len(status_at) == 1, lines


def test_a_name_with_a_digit_is_no_hash_and_a_cut_prints_in_any_encoding(kcache, tmp_path):
    """`conv2d`, `matmul4bit`: words with a base32 digit are names (marked where cut), not hashes; a
    stdout that cannot encode `…` (PYTHONIOENCODING=latin-1) still gets its table, cut with `~`."""
    from kcache_cli.cli.table import reads_as_hash
    from test_torchext import built_here

    assert not any(map(reads_as_hash, ["conv2d", "matmul4bit", "fused7x", "add"]))
    assert all(map(reads_as_hash, ["8d1f7691cdf75e90", "ILJQFT5RG2RWWIO5L4MSATVM4ZTRBTX4C4K5ZIQES4NTW2I54EFA",
                                   "fos42gzgpwdtw65e5yozpzjsibj5qjnauu3rcq2uypagpsvl63l6"]))
    root = built_here(tmp_path / "ext")
    long = "kc_add_one_with_a_rather_long_name"
    _long_named_extension(root / "kc_add_one", root / long, long)
    r = subprocess.run([sys.executable, "-m", "kcache_cli", "--cache-dir", str(root), "ls"], capture_output=True,
                       env={**os.environ, "COLUMNS": "30", "PYTHONIOENCODING": "latin-1"})
    assert r.returncode == 0 and b"~" in r.stdout and b"\xe2\x80\xa6" not in r.stdout, r.stderr


def test_a_blank_column_goes_before_any_value_is_cut():
    """numba's ls at 80 columns kept a column of `-` (op) and cut the entry's name: the blank column goes
    first, and the room it leaves goes to the name."""
    cols = [Column("hash", spill=True), Column("op", drop=7), Column("status")]
    rows = [["nsrc_35252f178833f8ad666a4a80374c652e0b1", "-", "complete"]]
    wide = render(cols, rows, None)[1]
    lines = render(cols, rows, len(wide) - 2)  # two columns short: without `op` (5 wide) it fits
    assert lines[0].split() == ["hash", "status"] and rows[0][0] in lines[1], lines
