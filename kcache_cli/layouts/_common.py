"""Helpers more than one layout module uses, so that no layout imports another (tests/test_imports.py):
reading a compile script (hidet, tilus) and replacing one file of an entry in place (Triton's group
files, vLLM's indexes)."""

from __future__ import annotations

import os


def command_from_script(text: str) -> str:
    """The command lines of a compile.sh, without the shebang and blank lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#!")).strip()


def replace_file(dfd: int, name: str, data: bytes, tmp_prefix: str) -> None:
    """Replace the file `name` in the directory `dfd` with `data`, atomically and durably, as Triton
    writes (a `<tmp_prefix><pid>_<random>` directory beside it), every step through descriptors (fswrite).
    fswrite and secrets are imported here, not above: loading a layout (every `ls`) does not need them."""
    import secrets

    from kcache_cli import fswrite

    tmp_name = f"{tmp_prefix}{os.getpid()}_{secrets.token_hex(16)}"
    fswrite.mkdir_at(dfd, tmp_name, 0o700)
    try:
        tfd = fswrite.open_dir(dfd, tmp_name)
        try:
            fswrite.write_file(tfd, name, data, 0o644, sync=True)
            fswrite.rename_at(tfd, name, dfd, name)
            os.fsync(dfd)
        finally:
            fswrite.unlink_at(tfd, name)
            os.close(tfd)
    finally:
        fswrite.rmdir_at(dfd, tmp_name)
