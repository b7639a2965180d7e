"""Helpers more than one layout module uses, so that no layout imports another (tests/test_imports.py):
reading a compile script (hidet, tilus). Replacing one file of an entry in place (Triton's group files,
vLLM's indexes) is fswrite.replace_file_via_dir."""

from __future__ import annotations


def command_from_script(text: str) -> str:
    """The command lines of a compile.sh, without the shebang and blank lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#!")).strip()

