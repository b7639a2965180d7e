"""Where each layout's compiler keeps its cache when nothing says otherwise (`kcache dir --all`), and
so kcache's own default root: the cache of the layout `kcache build` publishes into (hidet's rule).

Light on purpose (os, re, pathlib; tomllib only when a config file exists): every command resolves
its root through here at start-up. A new layout adds its rule to RULES.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple

from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real import, for mypy; at run time it loads at its first use
    import tempfile
else:
    tempfile = lazy_module("tempfile")


class Home(NamedTuple):
    path: Path
    reason: str  # which rule chose it, for `kcache dir`


def hidet_config_file() -> Path:
    return Path.home() / ".config" / "hidet" / "hidet.toml"


def _cache_dir_from_toml(path: Path) -> str | None:
    """The `cache_dir` of hidet.toml, or None. Only a top-level key counts, as in hidet."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    try:
        import tomllib  # type: ignore[import-not-found, unused-ignore]  # Python 3.11+

        value = tomllib.loads(text).get("cache_dir")
        return value if isinstance(value, str) and value else None
    except ImportError:  # pragma: no cover - Python 3.10
        pass
    except Exception:  # a malformed toml: hidet would fail too; fall through to a line scan
        pass
    for line in text.splitlines():
        if line.lstrip().startswith("["):
            break
        m = re.match(r"""\s*cache_dir\s*=\s*(['"])(.*)\1\s*(#.*)?$""", line)
        if m and m.group(2):
            return m.group(2)
    return None


def git_root(start: Path) -> Path | None:
    """The nearest ancestor holding `.git` (a directory, or a file for worktrees)."""
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def hidet_package_dir() -> Path | None:
    """Where the hidet package is installed, found without importing it (importing hidet pulls in
    torch and takes seconds). None when hidet is not installed."""
    return _package_dir("hidet")


def _package_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return Path(spec.origin).absolute().parent
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]).absolute() if locations else None


def hidet(package_dir: Path | None = None) -> Home:
    """hidet's own rule: hidet.toml's cache_dir; else, when the hidet package lies in a
    git work tree (a source checkout installed for development), <that repo>/.hidet_cache; else
    ~/.cache/hidet. The current directory plays no part: hidet looks for the repository from its own
    package's location. `package_dir` overrides where hidet is found (tests)."""
    config = hidet_config_file()
    from_config = _cache_dir_from_toml(config) if config.is_file() else None
    if from_config:
        return Home(Path(from_config).expanduser().absolute(), f"cache_dir in {config}")
    package = package_dir if package_dir is not None else hidet_package_dir()
    repo = git_root(package) if package is not None else None
    if repo is not None:
        return Home(repo / ".hidet_cache",
                             f"hidet is installed from the git work tree {repo} (hidet's rule: <repo>/.hidet_cache)")
    if package is not None:
        why = f"default (~/.cache/hidet): hidet at {package} is not in a git work tree, no cache_dir in {config}"
    else:
        why = f"default (~/.cache/hidet): hidet is not installed here, no cache_dir in {config}"
    return Home(Path.home() / ".cache" / "hidet", why)


def tilus(package_dir: Path | None = None) -> Home:
    return Home(Path.home() / ".cache" / "tilus", "tilus's default (~/.cache/tilus)")


def tilelang(package_dir: Path | None = None) -> Home:
    env = os.environ.get("TILELANG_CACHE_DIR")
    if env:
        return Home(Path(env).expanduser(), "TILELANG_CACHE_DIR environment variable")
    return Home(Path.home() / ".tilelang" / "cache", "tilelang's default (~/.tilelang/cache)")


def triton(package_dir: Path | None = None) -> Home:
    """Triton's own rule (triton/knobs.py): TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else
    ~/.triton/cache."""
    env = os.environ.get("TRITON_CACHE_DIR")
    if env:
        return Home(Path(env).expanduser(), "TRITON_CACHE_DIR environment variable")
    home = os.environ.get("TRITON_HOME")
    if home:
        return Home(Path(home).expanduser() / ".triton" / "cache", "$TRITON_HOME/.triton/cache")
    return Home(Path.home() / ".triton" / "cache", "default (~/.triton/cache)")


def inductor(package_dir: Path | None = None) -> Home:
    """torch's rule (torch/_inductor/runtime/cache_dir_utils.py): TORCHINDUCTOR_CACHE_DIR (made absolute),
    else <tempfile.gettempdir()>/torchinductor_<user>, the user name with \\/:*?"<>| made "_" (and
    uid_<uid> when there is no user name). An empty variable counts as unset, as every other variable
    here (torch would take "" as the current directory: a place no one means as a cache)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        return Home(Path(os.path.abspath(env)), "TORCHINDUCTOR_CACHE_DIR environment variable")

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Home(Path(tempfile.gettempdir()) / f"torchinductor_{user}",
                "torch's default (<tempdir>/torchinductor_<user>)")


def cudajit(package_dir: Path | None = None) -> Home:
    """The CUDA driver's rule: CUDA_CACHE_PATH, else ~/.nv/ComputeCache. kcache's root is the directory
    holding it: the JIT cache is one entry, listed from its parent."""
    env = os.environ.get("CUDA_CACHE_PATH")
    if env:
        where = Path(os.path.abspath(os.path.expanduser(env)))
        return Home(where.parent, f"CUDA_CACHE_PATH environment variable ({where.name}/ is the entry)")
    return Home(Path.home() / ".nv", "the CUDA driver's default (~/.nv/ComputeCache is the entry)")


def vllm(package_dir: Path | None = None) -> Home:
    """vLLM's rule (vllm/envs.py): VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm; its
    compile cache is the torch_compile_cache/ inside."""
    env = os.environ.get("VLLM_CACHE_ROOT")
    if env:
        return Home(Path(os.path.abspath(os.path.expanduser(env))) / "torch_compile_cache",
                    "VLLM_CACHE_ROOT environment variable (its torch_compile_cache/)")
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Home(Path(xdg).expanduser() / "vllm" / "torch_compile_cache", "$XDG_CACHE_HOME/vllm/torch_compile_cache")
    return Home(Path.home() / ".cache" / "vllm" / "torch_compile_cache",
                "vLLM's default (~/.cache/vllm/torch_compile_cache)")


def _torch_accelerator(package: Path | None) -> str | None:
    """cpu, cu<NNN> or rocm<NNN> from torch/version.py (read, not imported: torch takes seconds)."""
    if package is None:
        return None
    try:
        text = (package / "version.py").read_text(encoding="utf-8", errors="replace")[:65536]
    except OSError:
        return None
    got = {k: v for k, v in re.findall(r"^(cuda|hip)\s*[:=][^=\n]*?=?\s*['\"]([\w.]+)['\"]", text, re.M)}
    if got.get("hip"):
        return f"rocm{got['hip'].replace('.', '')}"
    return f"cu{got['cuda'].replace('.', '')}" if got.get("cuda") else "cpu"


def torchext(package_dir: Path | None = None) -> Home:
    """torch's rule (torch/utils/cpp_extension.py, _get_build_directory): TORCH_EXTENSIONS_DIR, else
    <user cache dir>/torch_extensions/py<XY><abiflags>_<cpu|cuNNN|rocmNNN>, the accelerator that of the
    torch installed for this Python (cpu when none is) and the Python the one kcache runs on."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Home(Path(env).expanduser(), "TORCH_EXTENSIONS_DIR environment variable")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    accel = _torch_accelerator(package_dir if package_dir is not None else _package_dir("torch"))
    py = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    why = "torch's default (<user cache>/torch_extensions/py<XY>_<accelerator>" + (
        ")" if accel else ": torch is not installed here, cpu assumed)")
    return Home(Path(os.path.realpath(base / "torch_extensions")) / f"{py}_{accel or 'cpu'}", why)


# torch's build folder under <user cache>/torch_extensions: py<XY><abiflags>_<cpu|cuNNN|rocmNNN>
_TORCHEXT_FOLDER = re.compile(r"py\d+[a-z]*_[a-z]+\d*")


def torchext_roots(package_dir: Path | None = None) -> list[Home]:
    """Every torch extensions root on this machine: TORCH_EXTENSIONS_DIR alone when it is set (torch
    builds right in it), else each py<XY>_<accelerator> folder under <user cache>/torch_extensions (one
    per Python and torch build that ever loaded an extension: a CUDA torch's py312_cu128 beside a CPU
    one's py311_cpu), the folder torch here would use (torchext's rule) first; that one, while missing,
    only when there is no other (`dir --all` says where torch here would build)."""
    own = torchext(package_dir)
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return [own]
    try:
        with os.scandir(own.path.parent) as it:
            names = sorted(e.name for e in it if _TORCHEXT_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False))
    except OSError:
        names = []
    others = [Home(own.path.parent / n, f"a torch extensions folder ({n}: another Python's or torch build's)")
              for n in names if n != own.path.name]
    return [own] + others if own.path.name in names or not others else others


def jax(package_dir: Path | None = None) -> Home | None:
    """jax keeps no persistent compilation cache unless one is configured (jax_compilation_cache_dir,
    or JAX_COMPILATION_CACHE_DIR): only the variable is seen from outside the process. kcache's root is
    the directory holding it: the cache is one entry, listed from its parent."""
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not env:
        return None
    where = Path(os.path.abspath(os.path.expanduser(env)))
    return Home(where.parent, f"JAX_COMPILATION_CACHE_DIR environment variable ({where.name}/ is the entry)")


def numba(package_dir: Path | None = None) -> Home:
    """numba's rule (numba/core/caching.py): NUMBA_CACHE_DIR, else __pycache__/ beside each source file
    (one per project: no machine-wide place), else the user-wide <user cache dir>/numba, which is the
    default root here: the one place every project's functions may share."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return Home(Path(os.path.abspath(os.path.expanduser(env))), "NUMBA_CACHE_DIR environment variable")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return Home(base / "numba", "numba's user-wide cache (<user cache>/numba; a project's own caches are "
                                "its __pycache__/ directories: kcache --cache-dir <project>)")


# layout name -> its rule; `package_dir` says where the compiler's Python package lies (None: find it)
RULES: dict[str, Callable[..., Home | None]] = {"hidet": hidet, "tilus": tilus, "tilelang": tilelang, "triton": triton,
                                       "inductor": inductor, "cudajit": cudajit, "vllm": vllm, "torchext": torchext,
                                              "jax": jax, "numba": numba}


def default_root(layout: str, package_dir: Path | None = None) -> Home | None:
    """Where `layout`'s compiler keeps its cache by default, or None when kcache knows no rule for it."""
    rule = RULES.get(layout)
    return rule(package_dir) if rule is not None else None


# Layouts whose compiler keeps several caches on one machine (one per Python and torch build), each a root.
ROOTS: dict[str, Callable[..., list[Home]]] = {"torchext": torchext_roots}


def default_roots(layout: str, package_dir: Path | None = None) -> list[Home]:
    """Every place `layout`'s compiler keeps a cache by default (`dir --all`, the default scope): its
    default_root, or each of several (torch's one folder per Python and accelerator)."""
    many = ROOTS.get(layout)
    if many is not None:
        return many(package_dir)
    home = default_root(layout, package_dir)
    return [home] if home is not None else []


# Why a layout has no place now (default_root None): what would give it one.
NO_DEFAULT = {"jax": "JAX keeps its cache only where JAX_COMPILATION_CACHE_DIR names one: set it"}


def named_caches(layouts: Iterable[str]) -> dict[str, Home]:
    """The caches `--cache NAME` takes, by name, with their place: each of `layouts` whose compiler keeps
    a cache in a place known now (jax only when JAX_COMPILATION_CACHE_DIR names one). What `--cache`
    accepts and what completes for it."""
    return {name: roots[0] for name in layouts if (roots := default_roots(name))}  # torch's: one that is there
