"""The documentation a newcomer reads: the README's size and its two commands, the links of its index,
and docs/commands.md, generated from the CLI's own help, kept current."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from kcache_cli.cli import docgen
from kcache_cli.cli.table import HASH_MIN

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# docs/ files other branches add (the README links them ahead of their arrival)
PENDING: set[str] = set()  # docs linked before they are written (none now)


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_command_reference_is_current():
    text = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    assert text == docgen.reference(), "docs/commands.md is stale: run python -m kcache_cli.cli.docgen"


def test_command_reference_names_every_command_and_fits_80_columns():
    text = docgen.reference()
    for cmd in ("ls", "inspect", "diff", "prune", "clear", "push", "pull", "remote prune", "config set"):
        assert f"## `kcache {cmd}`" in text
    blocks = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    wide = [line for b in blocks for line in b.splitlines() if len(line) > docgen.WIDTH]
    assert not wide, wide


def test_docgen_check_says_when_the_reference_is_stale(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "commands.md"
    stale.write_text("old\n")
    monkeypatch.setattr(docgen, "target", lambda: stale)
    assert docgen.main(["--check"]) == 1
    assert "not current" in capsys.readouterr().err
    assert docgen.main([]) == 0 and docgen.main(["--check"]) == 0
    assert stale.read_text() == docgen.reference()


def test_readme_is_short_and_says_what_kcache_is_first():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    first_screen = "\n".join(lines[:24])
    assert "kernel" in first_screen and "caches" in first_screen
    blocks = _bash_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 2


def test_readme_first_commands_are_safe_and_show_every_shipped_cache():
    demo, tests_cmd = _bash_blocks(README.read_text(encoding="utf-8"))[:2]
    assert "mktemp -d" in demo and "rm -rf" not in demo and "/tmp/" not in demo
    real = REPO / "tests" / "fixtures" / "real"
    shipped = sorted(p.name for p in real.iterdir() if p.is_dir() and p.name != "make")  # make/: the scripts
    assert {"hidet", "tilelang", "tilus", "triton"} <= set(shipped)
    for name in shipped:
        assert re.search(rf"\b{name}\b", demo), name
    assert "pip install -q ." in demo and "[test]" not in demo  # a user's install, not the toolchain
    assert shlex.split(tests_cmd.strip())[-3:] == [".venv/bin/python", "-m", "pytest"]


def test_readme_links_lead_to_files():
    text = README.read_text(encoding="utf-8")
    links = set(re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", text))
    assert {"docs/commands.md", "docs/statuses.md"} <= links
    missing = sorted(p for p in links - PENDING if not (REPO / p).is_file())
    assert not missing, missing


def test_the_oracle_table_markers_moved_with_the_table():
    from loaders import report

    doc = report.DOC.read_text(encoding="utf-8")
    assert report.BEGIN in doc and report.END in doc
    assert report.BEGIN not in README.read_text(encoding="utf-8")


def test_readme_demo_runs_and_lists_every_shipped_cache(tmp_path):
    """The README's first command past its install, with this checkout's kcache: every cache lists entries."""
    import subprocess
    import sys

    demo = _bash_blocks(README.read_text(encoding="utf-8"))[0].strip()
    run = demo.split("&& d=$(mktemp -d)", 1)[1]  # what follows the venv and its install
    kcache = f"{sys.executable} -m kcache_cli"
    script = "d=$(mktemp -d)" + run.replace(".venv/bin/kcache", kcache)
    done = subprocess.run(["bash", "-c", "set -e\n" + script], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**__import__("os").environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "no entries" not in said, said
    for cache in re.search(r"for c in ([^;]+);", demo).group(1).split():
        assert re.search(rf"\d entr(y|ies), .* in \S*/{re.escape(cache)}\n", said), (cache, said)
    assert "crc32" in done.stdout  # the blob inspected


def test_readme_says_how_tables_cut_a_hash_as_they_do():
    """The README said tables show `the shortest unique` hash prefix; at 80 columns `kcache ls` shows
    `8d1f7691cdf7` (12 characters) where `8d` is unique: the longest prefix that fits, at least HASH_MIN
    characters and unique among the rows (table.py, docs/listing.md)."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "shortest unique" not in text
    assert f"the longest prefix that fits, at least {HASH_MIN} characters and unique among the rows" in text
