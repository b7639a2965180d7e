"""kcache_cli/cli/typer_compat.py: the tested Typer range is pyproject's, an untested Typer is named in
one warning line, and no other module reaches into Typer's private modules."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kcache_cli.cli import typer_compat

REPO = Path(__file__).resolve().parents[1]


def test_the_tested_range_is_pyprojects():
    text = (REPO / "pyproject.toml").read_text()
    declared = re.findall(r'"typer(>=[^"]+)"', text)
    assert declared == [typer_compat.TESTED_RANGE]


def test_the_installed_typer_is_in_the_tested_range():
    assert typer_compat.version_problem(typer.__version__) is None


@pytest.mark.parametrize("version", ["0.27.0", "0.28.0", "0.28.9rc1"])
def test_versions_in_range(version):
    assert typer_compat.version_problem(version) is None


@pytest.mark.parametrize("version", ["0.26.9", "0.29.0", "1.0.0", "0.9.0", "0.290.0", "", "dev"])
def test_versions_out_of_range(version):
    problem = typer_compat.version_problem(version)
    assert problem is not None and "typer>=0.27,<0.29" in problem and "\n" not in problem


_WITH_TYPER = """import sys
import typer
typer.__version__ = sys.argv[1]
from kcache_cli.cli.app import main
main(sys.argv[2:])
"""


def _kcache_with_typer(version: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", _WITH_TYPER, version, *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_an_untested_typer_is_one_warning_line_and_kcache_still_runs():
    run = _kcache_with_typer("0.31.2", "--version")
    assert run.returncode == 0 and run.stdout.startswith("kcache ")
    assert run.stderr.splitlines() == ["warning: Typer 0.31.2 is outside the releases kcache is tested with "
                                       "(typer>=0.27,<0.29); if a command misbehaves: pip install "
                                       "'typer>=0.27,<0.29'"]


def test_a_tested_typer_and_quiet_say_nothing():
    assert _kcache_with_typer(typer.__version__, "--version").stderr == ""
    assert _kcache_with_typer("0.31.2", "-q", "--version").stderr == ""


def test_no_other_module_reaches_into_typer_privately():
    """Typer's private modules (typer._click, typer._completion_*) are named only in typer_compat."""
    found = []
    for path in sorted((REPO / "kcache_cli").rglob("*.py")):
        if path.name == "typer_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("typer", "click"):
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.split(".")[0] == "click" or any(p.startswith("_") for p in n.split(".")[1:2])
                   for n in names if n.split(".")[0] in ("typer", "click")):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, "Typer internals outside kcache_cli/cli/typer_compat.py:\n" + "\n".join(found)
