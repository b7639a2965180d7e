"""The real compilers in cached virtual environments, for the loader oracle (DESIGN.md section 10).

Each name below is one venv holding pinned releases, installed CPU-only (torch's CPU build is the one
pip takes here for torch==2.13.0). A venv is built once under $KCACHE_ORACLE_VENVS (default
~/.cache/kcache-oracle) in a directory named by its pins, and reused while its pins are unchanged.
`.ci/run` builds them all first (python tests/loaders/venvs.py --all); a test that needs one and cannot
have it skips through `python_for`, and the run's summary says so loudly (tests/conftest.py). Only the slow
tier (`pytest -m slow`) uses them: `python_for` fails a fast-tier test that asks for one.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
import sys
import venv
from pathlib import Path

# name -> pip requirements. Keep every release pinned: the oracle proves kcache against these exact loaders.
SPECS: dict[str, tuple[str, ...]] = {
    "hidet": ("hidet==0.6.1", "torch==2.13.0"),
    "tilus": ("tilus==0.2.0", "torch==2.13.0", "cuda-python==13.4.4"),  # tilus imports cuda.bindings
    "tilelang": ("tilelang==0.1.15", "torch==2.13.0"),
    "triton31": ("triton==3.1.0",),
    "triton32": ("triton==3.2.0",),
    "triton39": ("triton==3.9.0",),
    "torch": ("torch==2.13.0",),  # TorchInductor: torch.compile on CPU, C++ kernels via g++
    "jax": ("jax==0.10.2", "jaxlib==0.10.2", "filelock==4.3.1"),  # jax.jit on CPU; filelock: a size cap
    "numba": ("numba==0.68.1",),  # @njit(cache=True): .nbi index plus .nbc per overload
}

# The real home, not $HOME: the tests give every test a fresh HOME of its own.
_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)
ROOT = Path(os.environ.get("KCACHE_ORACLE_VENVS") or _HOME / ".cache" / "kcache-oracle")
# False while a fast-tier test runs (tests/conftest.py): the fast tier builds and runs no loader venv.
SLOW_TIER = [True]


def venv_dir(name: str) -> Path:
    pins = "\n".join(SPECS[name]) + f"\npython {sys.version_info[0]}.{sys.version_info[1]}"
    return ROOT / f"{name}-{hashlib.sha256(pins.encode()).hexdigest()[:12]}"


def ensure(name: str) -> tuple[Path | None, str]:
    """The venv's python, built if missing, or None and why it could not be built."""
    where = venv_dir(name)
    python = where / "bin" / "python"
    if (where / ".complete").exists():
        return python, ""
    tmp = where.with_name(where.name + f".tmp{os.getpid()}")
    venv.EnvBuilder(with_pip=True, clear=True).create(tmp)
    pip = [str(tmp / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(pip + list(SPECS[name]), capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"pip install {' '.join(SPECS[name])} failed: {done.stderr.strip()[-400:]}"
    (tmp / ".complete").write_text("\n".join(SPECS[name]) + "\n")
    try:
        os.rename(tmp, where)  # not under a root: the oracle's own venv cache
    except OSError:  # another process built it first
        pass
    return python, ""


def python_for(name: str) -> Path:
    """The python of venv `name` for a test, or a loud skip (the summary lists every one)."""
    import pytest

    if not SLOW_TIER[0]:
        pytest.fail(f"a fast-tier test asked for the loader venv {name!r}: mark it slow (pytest.mark.slow), or "
                    "replay what the loader recorded (tests/loaders/recorded.py)", pytrace=False)
    python, why = ensure(name)
    if python is None:
        pytest.skip(f"loader oracle venv {name!r} unavailable: {name}: {why}")
    return python


if __name__ == "__main__":
    names = list(SPECS) if sys.argv[1:] in (["--all"], []) else sys.argv[1:]
    failed = 0
    for n in names:
        py, why = ensure(n)
        print(f"{n}: {py if py else 'FAILED: ' + why}", file=sys.stderr)
        failed += py is None
    sys.exit(1 if failed else 0)
