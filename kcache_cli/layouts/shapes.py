"""Where each layout keeps its entries, as plain data: the path shape of every kind.

This module is light on purpose (only `re`, not even `dataclasses`): shell completion (kcache_cli/catalog/names.py)
and option parsing (kcache_cli/model/terms.py) read these shapes without importing the layouts' code. The
layout modules (hidet.py, tilus.py, tilelang.py) take their shapes from here, and the archive checks an
entry path against them, so a shape is written exactly once.

Registering a layout is adding its `LayoutShape` to `SHAPES`; its code is the module
`kcache_cli/layouts/<name>.py`, which defines `LAYOUT`, an instance of `layouts.base.Layout`.

A template names the directories from the cache root down to an entry, one segment per directory.
`{field}` parts match a name (by default any visible name: not empty, not starting with '.'):
`hash` is the entry's own directory name, `op` its op name, `target` its target; a kind's `space` is a
template over the fields. Fixed text matches itself.
"""

from __future__ import annotations

import itertools
import os
import re
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

from kcache_cli.fs import dirnames
from kcache_cli.fs import read as fsread

VISIBLE = r"[^/.][^/]*"  # a name that is not hidden (temp, staging and state directories are)
_FIELD = re.compile(r"\{(\w+)\}")


def _segment_regex(segment: str, patterns: dict[str, str]) -> re.Pattern[str]:
    out, pos = [], 0
    for m in _FIELD.finditer(segment):
        out.append(re.escape(segment[pos:m.start()]))
        out.append(f"(?P<{m.group(1)}>{patterns.get(m.group(1), VISIBLE)})")
        pos = m.end()
    out.append(re.escape(segment[pos:]))
    return re.compile("^" + "".join(out) + "$")  # anchored: .match() takes whole names only


class KindShape:
    """The path of one kind of entry, relative to the cache root."""

    __slots__ = ("kind", "template", "space", "target", "_patterns", "_segments", "parts", "space_depth", "op_depth",
                 "from_files", "space_in_files", "derived")

    def __init__(self, kind: str, template: str, space: str | None = None, target: str | None = None,
                 patterns: tuple[tuple[str, str], ...] = (),
                 from_files: Callable[[list[str]], tuple[bool, str | None]] | None = None,
                 space_in_files: Callable[[str, str, list[str]], str | None] | None = None,
                 derived: tuple[tuple[str, Callable[[str], str | None]], ...] = ()) -> None:
        self.kind = kind  # "op", "program", "kernel"...
        self.template = template  # "ops/{target}_space_{level}/{op}/{hash}"
        self.space = space  # "{target}_space_{level}"; None: entries of this kind have no space
        self.target = target  # a fixed target ("cuda"); None: the {target} field, or no target
        # `patterns`: (field, regex) for the fields that are not just any visible name
        self.parts = tuple(template.split("/"))
        self._patterns = dict(patterns)
        self._segments: list[re.Pattern[str] | None] = [None] * len(self.parts)  # each compiled when first asked
        space_fields = set(_FIELD.findall(space or ""))
        # The segment that completes the space (-1: no space) and the segment holding the op (-1: no op).
        self.space_depth = max((i for i, p in enumerate(self.parts) if space_fields & set(_FIELD.findall(p))),
                               default=-1)
        self.op_depth = next((i for i, p in enumerate(self.parts) if "{op}" in p), -1)
        # For a kind whose path does not tell everything: from the names of the files in an entry's
        # directory, (whether it is an entry of this kind, its op name or None). Completion lists the
        # entry directory to call it; keep it light (names only, no reads).
        self.from_files = from_files
        # For a kind whose space is in an entry's files, not its path (Triton's arch, in its metadata): called
        # with the root, the entry's path and the names in it, the space read from one small file, or None.
        # For questions that do not scan (completion, hints), on a bounded number of entries (catalog/names.py).
        self.space_in_files = space_in_files
        # (field, f): a field that is a function of the entry's hash (Inductor's fx graph shard, the key's
        # second and third characters): f(a hash prefix) is the only value the field can take for hashes
        # starting with it, or None when the prefix is too short to tell. A lookup by prefix then looks
        # into that one directory instead of listing every one (catalog/names.py).
        self.derived = dict(derived)

    def __repr__(self) -> str:
        return f"KindShape({self.kind!r}, {self.template!r})"

    @property
    def any_visible_first(self) -> bool:
        """Whether the first segment is one field taking any visible name (VISIBLE): a root's
        CUDA JIT, JAX or Numba cache is any directory in it."""
        field = _FIELD.fullmatch(self.parts[0])
        return field is not None and self._patterns.get(field.group(1), VISIBLE) == VISIBLE

    @property
    def segments(self) -> tuple[re.Pattern[str], ...]:
        """One anchored regex per directory level (`segment`)."""
        return tuple(self.segment(i) for i in range(len(self.parts)))

    def segment(self, i: int) -> re.Pattern[str]:
        """The anchored regex of directory level `i`, compiled the first time it is asked for (start-up
        compiles none, and detection only the first level's: most commands match one or two layouts)."""
        got = self._segments[i]
        if got is None:
            got = self._segments[i] = _segment_regex(self.parts[i], self._patterns)
        return got

    @property
    def depth(self) -> int:
        return len(self.parts)

    def fields_in(self, i: int) -> tuple[str, ...]:
        """The fields segment `i` of the template names."""
        return tuple(_FIELD.findall(self.parts[i]))

    @property
    def has_op(self) -> bool:
        """Whether entries of this kind have an op name that directory names tell (so --op applies)."""
        return self.op_depth >= 0 or self.from_files is not None

    def match_segment(self, i: int, name: str) -> dict[str, str] | None:
        m = self.segment(i).fullmatch(name)
        return m.groupdict() if m else None

    def match(self, relpath: str) -> dict[str, str | None] | None:
        """The entry's key fields (hash, op, space, target) if `relpath` is where such an entry lives."""
        parts = relpath.split("/")
        if len(parts) != self.depth:
            return None
        found: dict[str, str] = {}
        for i, part in enumerate(parts):
            got = self.match_segment(i, part)
            if got is None:
                return None
            found.update(got)
        return self.key(found)

    def fits(self, relpath: str) -> bool:
        """Whether `relpath` is where such an entry lives (match, without making its key)."""
        parts = relpath.split("/")
        return len(parts) == self.depth and all(self.segment(i).fullmatch(p) for i, p in enumerate(parts))

    def key(self, found: dict[str, str]) -> dict[str, str | None]:
        """hash, op, space and target from the template's fields."""
        return {"hash": found.get("hash"), "op": found.get("op"), "space": self.space_of(found),
                "target": self.target or found.get("target")}

    def space_of(self, found: dict[str, str]) -> str | None:
        if self.space is None:
            return None
        return _FIELD.sub(lambda m: found.get(m.group(1), ""), self.space)

    def relpath(self, **values: str) -> str:
        """The template filled in: `relpath(target="cuda", level="0", op="matmul", hash="ab12")`."""
        return _FIELD.sub(lambda m: values[m.group(1)], self.template)


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")
_ANY_OF: dict[tuple[re.Pattern[str], ...], re.Pattern[str]] = {}


def _any_of(patterns: tuple[re.Pattern[str], ...]) -> re.Pattern[str]:
    """One regex matching what any of the anchored `patterns` matches (their group names dropped)."""
    got = _ANY_OF.get(patterns)
    if got is None:
        alternatives = dict.fromkeys(_NAMED_GROUP.sub("(?:", p.pattern) for p in patterns)
        got = _ANY_OF[patterns] = re.compile("|".join(f"(?:{a})" for a in alternatives))
    return got


def _widths(regex: re.Pattern[str]) -> tuple[int, int | float]:
    """The shortest and longest string `regex` matches (a name of another length is not asked: a Triton
    root's 10^5 keys are none of Inductor's or vLLM's names); (0, inf) where the parser cannot say."""
    got = _WIDTHS.get(regex)
    if got is None:
        try:
            from re import _parser  # type: ignore[attr-defined]  # the regex compiler's own parser (3.11+)
        except ImportError:  # Python 3.10
            import sre_parse as _parser
        try:
            low, high = _parser.parse(regex.pattern).getwidth()
            got = (low, high if high < _parser.MAXREPEAT else float("inf"))
        except Exception:  # noqa: BLE001 - a private API: without it every name is matched
            got = (0, float("inf"))
        _WIDTHS[regex] = got
    return got


_WIDTHS: dict[re.Pattern[str], tuple[int, int | float]] = {}
_FEW = 256  # a listing this short is matched kind by kind (a hidet root holds two or three names)


class LayoutShape:
    """A layout's name and the shapes of its kinds."""

    __slots__ = ("name", "kinds", "summary", "build_kind", "confirm", "own_detect", "keeps")

    def __init__(self, name: str, kinds: tuple[KindShape, ...], summary: str, build_kind: str | None = None,
                 confirm: Callable[[str, list[str], list[str]], bool] | None = None, own_detect: bool = False,
                 keeps: tuple[str, ...] = ()) -> None:
        self.name = name
        # Names the compiler keeps at the root besides its entries (Inductor's locks/): a root holding only
        # those and entries' folders is this layout's, if an empty one (import takes an archive into it).
        self.keeps = keeps
        self.kinds = kinds
        self.summary = summary  # one line for help texts: where its entries are
        self.build_kind = build_kind  # the kind `kcache build` writes into this layout (one layout has one)
        # When top-level names alone could mislead: called with the root, the first _LOOKS of its top-level
        # directory names that start one of this layout's paths, and all its top-level directory names;
        # True when the layout is really there (it may list a few of those directories, nothing more).
        self.confirm = confirm
        # Whether the layout's module has a detect of its own (evidence read from files), asked only where
        # `held_by` says it may be there; else detection is `held_by`, answered here without importing the
        # module (tests/test_layouts.py holds both true).
        self.own_detect = own_detect

    def __repr__(self) -> str:
        return f"LayoutShape({self.name!r})"

    def kind(self, kind: str) -> KindShape | None:
        return next((k for k in self.kinds if k.kind == kind), None)

    def tops(self, names, limit: int | None = None) -> list[str]:
        """The names among `names` (a root's top-level directories) that start one of this layout's paths,
        in their order; with `limit`, the first `limit` of them (a Triton root has 10^5 names)."""
        firsts = {k.parts[0] for k in self.kinds}
        if not any("{" in f for f in firsts):  # fixed names (ops/, programs/...): no regex per name
            if firsts.isdisjoint(names):  # the usual answer, found in C (a Triton root: 10^5 names)
                return []
            found: Iterable[str] = (n for n in names if n in firsts)
        elif all(k.any_visible_first for k in self.kinds):  # any visible name (a listing's names hold no "/")
            found = (n for n in names if n and not n.startswith("."))
        elif len(names) <= _FEW:  # kind by kind: the joined regex and its widths cost more than they save
            matches = [k.segment(0).match for k in self.kinds]
            found = (n for n in names if any(match(n) for match in matches))
        else:
            regex = _any_of(tuple(k.segment(0) for k in self.kinds))  # one regex for every kind
            match, (shortest, longest) = regex.match, _widths(regex)
            if longest == float("inf"):  # (a version, a module name) no length to skip by: match each in C
                found = filter(match, names)
            elif not any(shortest <= n <= longest for n in set(map(len, names))):
                return []  # no name of a length it may have, found in C (vLLM's 10 digits on a Triton root)
            else:
                found = (n for n in names if shortest <= len(n) <= longest and match(n))
        return list(found if limit is None else itertools.islice(found, limit))

    def held_by(self, root: str, names: list[str]) -> bool:
        """Whether the root whose top-level directory names are `names` holds this layout; for a layout with
        a detect of its own (`own_detect`), whether it may (its detect then looks at the files). A confirm
        gets the first _LOOKS of the layout's names (all it looks into) and the whole listing."""
        tops = self.tops(names, _LOOKS)
        return bool(tops) and (self.confirm is None or self.confirm(root, tops, names))

    def locate(self, relpath: str) -> tuple[str, dict[str, str | None]] | None:
        """(kind, key fields) of the entry that lives at `relpath`, or None."""
        for k in self.kinds:
            got = k.match(relpath)
            if got is not None:
                return k.kind, got
        return None


HIDET = LayoutShape("hidet", (
    KindShape("op", "ops/{target}_space_{level}/{op}/{hash}", space="{target}_space_{level}",
              patterns=(("target", r"[a-z0-9]+"), ("level", r"\d+"))),
    KindShape("graph", "graphs/{hash}"),
    KindShape("ir_module", "ir_modules/{hash}"),
), "ops/<space>/<op>/<hash>, graphs/, ir_modules/", build_kind="op", own_detect=True)

TILUS = LayoutShape("tilus", (
    KindShape("program", "programs/{hash}", target="cuda"),
    KindShape("script", "scripts/{op}/{hash}", target="cuda"),
), "programs/, scripts/", own_detect=True)

_TILELANG_VERSION = (("version", r"\d+\.\d+(?:\.\d+)?[.+\-\w]*"), ("platform", r"(?!cuda-binaries$)[^/.][^/]*"))
TILELANG = LayoutShape("tilelang", (
    KindShape("kernel", "{version}/{platform}/kernels/{hash}", space="{version}/{platform}", target="cuda",
              patterns=_TILELANG_VERSION),
    # {bins} is fixed text, as a field so that listings find it (a space exists when its directory does)
    KindShape("binary", "{version}/{bins}/{hash}", space="{version}/{bins}", target="cuda",
              patterns=(*_TILELANG_VERSION, ("bins", "cuda-binaries"))),
), "<version>/<platform>/kernels/, cuda-binaries/", own_detect=True)

# Triton: <root>/<key>/, the key the base32 of a sha256 (Triton >= 3.2) or its hex (before). The target
# and arch (the entries' space) are in the kernel's metadata file, not in the path; the kernel's name is
# in its file names. What follows is the light part of layouts/triton.py (names only, no reads).
_TRITON_KEY = (("hash", r"[A-Z2-7]{52}|[0-9a-f]{64}|[A-Za-z0-9_-]{43}"),)
TRITON_GROUP, TRITON_TMP = "__grp__", "tmp.pid_"
# The compile stages Triton writes beside a kernel (its name is read from them); those only Triton's compiler
# writes are positive evidence that a key directory is Triton's (a .cubin, .ptx or .hsaco is not).
TRITON_STAGES = (".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".cubin", ".hsaco", ".source")
_TRITON_ONLY = (".ttir", ".ttgir", ".llir", ".amdgcn", ".source")
_LOOKS = 64  # directories looked into, at most, to recognise a root


def triton_module(names: list[str]) -> bool:
    """A key dir holding only the driver's compiled launcher/utils module (`cuda_utils...so`)."""
    return len(names) == 1 and names[0].endswith(".so")


def triton_kernel_name(names: list[str]) -> str | None:
    """A Triton kernel's name from its directory listing: `__grp__<name>.json`, else a compile stage,
    else the one file of a group-less key dir (`<fn>.autotune.json`, `cuda_utils.<abi>.so`)."""
    ordered = sorted(names)
    for n in ordered:
        if n.startswith(TRITON_GROUP) and n.endswith(".json"):
            return n[len(TRITON_GROUP):-len(".json")]
    for n in ordered:
        if n.endswith(TRITON_STAGES):
            return n.rsplit(".", 1)[0]
    if len(names) == 1 and names[0].endswith((".so", ".autotune.json")):
        return names[0].split(".", 1)[0]
    return None


def triton_evidence(names: list[str]) -> bool:
    """Whether a key directory's listing is Triton's: a group file, a temp dir or a stage only Triton's
    compiler writes (not a .cubin, .ptx or .hsaco: tilelang's cuda-binaries hold a kernel.cubin under a hex
    key too)."""
    return any(n.startswith((TRITON_GROUP, TRITON_TMP)) or n.endswith(_TRITON_ONLY) for n in names)


def triton_target_arch(meta: dict | None) -> tuple[str | None, str | None]:
    """(target, arch) from a Triton kernel's metadata (`<name>.json`): ("cuda", "sm_90a"), ("hip", "gfx942").
    Triton's CUDA backend compiles capability >= 90 for the arch-specific "a" variant
    (sm_arch_from_capability). Here because Inductor's nested Triton caches are named by it too."""
    target = (meta or {}).get("target")
    if not isinstance(target, dict):
        return None, None
    backend = target.get("backend") if isinstance(target.get("backend"), str) else None
    arch = target.get("arch")
    if isinstance(arch, int) and not isinstance(arch, bool):
        return backend, f"sm_{arch}{'a' if arch >= 90 else ''}"
    return backend, arch if isinstance(arch, str) and arch else None


_TRITON_META_MAX = 1 << 20  # as layouts/triton.py reads a metadata file: a few kB


def triton_arch_in_files(root: str, path: str, names: list[str]) -> str | None:
    """A Triton kernel's arch (its space, as the scan tells it) from its metadata `<name>.json`, `names` the
    kernel directory's listing. A file this user cannot read without moving its access time (another
    user's, in a shared cache) is not read: kcache's reads are never a use (fs/readmarks.py)."""
    op = triton_kernel_name(names)
    if not op or f"{op}.json" not in names or triton_module(names):
        return None
    meta = os.path.join(path, f"{op}.json")
    try:
        owner = os.lstat(meta).st_uid
    except OSError:
        return None
    if owner != os.geteuid() and os.geteuid() != 0:  # O_NOATIME is the owner's and root's alone
        return None
    return triton_target_arch(fsread.json_object(meta, _TRITON_META_MAX, base=root))[1]


def _triton_confirm(root: str, tops: list[str], names: list[str]) -> bool:
    """Key-named directories alone are no evidence: one of the first few must hold Triton's files, or
    (a root whose key directories all deny reading) none could be read, which `ls` then says."""
    denied = 0
    for name in tops:
        try:
            if triton_evidence(_names_in(root, name)):
                return True
        except PermissionError:
            denied += 1
        except OSError:
            pass
    return bool(tops) and denied == len(tops)


TRITON = LayoutShape("triton", (
    KindShape("kernel", "{hash}", patterns=_TRITON_KEY,
              from_files=lambda names: (not triton_module(names), triton_kernel_name(names)),
              space_in_files=triton_arch_in_files),
    KindShape("binary", "{hash}", patterns=_TRITON_KEY,  # the driver's compiled launcher module
              from_files=lambda names: (triton_module(names), triton_kernel_name(names))),
), "<base32 key>/ per kernel", confirm=_triton_confirm)

# TorchInductor (torch 2.5+): every file is named by a base32 sha256 (51 characters, lower case) behind a
# one-letter prefix: f (fx graph), a (aotautograd), c (code); the code cache's 2-character shard directory
# is the key's [1:3]. A Triton cache lies under triton/<device>/ unless TRITON_CACHE_DIR is set.
INDUCTOR_B32 = r"[a-z2-7]{51}"
INDUCTOR_CODE = re.compile(r"^c[a-z2-7]{51}\.")  # a code cache file: c<key>.py, .cpp, .so, .main.so...
_INDUCTOR_EVIDENCE = ("fxgraph", "aotautograd")


def _inductor_confirm(root: str, tops: list[str], names: list[str]) -> bool:
    """fxgraph/ or aotautograd/, or a shard directory holding code cache files (c<key>.py...)."""
    if not set(_INDUCTOR_EVIDENCE).isdisjoint(names):
        return True
    for name in tops:
        try:
            if any(INDUCTOR_CODE.match(n) for n in _names_in(root, name)):
                return True
        except OSError:
            pass
    return False


def inductor_graph_shard(prefix: str) -> str | None:
    """The fx graph shard of the keys starting with `prefix` (graph keys are "f" and 51 more, their shard
    the second and third characters): "" when no key starts so (a prefix not starting with "f": a code
    shard's `2a` looks in none of the 1,024 shards), None when it is too short to tell."""
    if prefix[:1] not in ("", "f"):
        return ""
    return prefix[1:3] if len(prefix) >= 3 else None


INDUCTOR = LayoutShape("inductor", (
    KindShape("graph", "fxgraph/{shard}/{hash}", patterns=(("shard", r"[a-z2-7]{2}"), ("hash", "f" + INDUCTOR_B32)),
              derived=(("shard", inductor_graph_shard),)),
    KindShape("autograd", "aotautograd/{hash}", patterns=(("hash", "a" + INDUCTOR_B32),)),
    KindShape("code", "{hash}", patterns=(("hash", r"[a-z2-7]{2}"),)),
    KindShape("autotune", "{hash}", patterns=(("hash", "cache"),)),
    # space "triton/<device>": a bare number would read as a hidet level (--space 2)
    KindShape("triton", "{tri}/{device}/{hash}", space="{tri}/{device}",
              patterns=(("tri", "triton"), ("device", r"\d+"), *_TRITON_KEY)),
), "fxgraph/, aotautograd/, <2>/ code, cache/, triton/<device>/", confirm=_inductor_confirm, keeps=("locks",))

def inductor_graph_relpath(key: str) -> str:
    """Where the fx graph `key` lies under an Inductor root (vLLM's nested Inductor caches too)."""
    return INDUCTOR.kinds[0].relpath(shard=key[1:3], hash=key)


# The CUDA driver's JIT cache (CUDA_CACHE_PATH, else ~/.nv/ComputeCache): one opaque entry, the cache
# directory itself, listed from its parent (the layout's root). Its format is undocumented; it is known by
# its name (ComputeCache, or the last part of CUDA_CACHE_PATH) and, before anything is removed, by the
# driver's `index` file beside hex-named directories.
def cudajit_names() -> tuple[str, ...]:
    env = os.environ.get("CUDA_CACHE_PATH", "").rstrip("/")
    return ("ComputeCache", os.path.basename(env)) if env else ("ComputeCache",)


def _cudajit_confirm(root: str, tops: list[str], names: list[str]) -> bool:
    wanted = {n for n in cudajit_names() if n and not n.startswith(".")}  # the layout's names are visible ones
    return not wanted.isdisjoint(names)  # names only: completion reads no file


def cudajit_evidence(path: str) -> bool:
    try:
        names = fsread.listdir(path)
    except OSError:
        return False
    return "index" in names and any(re.fullmatch(r"[0-9a-f]", n) for n in names)


CUDAJIT = LayoutShape("cudajit", (
    KindShape("jit", "{hash}", target="cuda", patterns=(("hash", r"[^/.][^/]*"),)),
), "<CUDA_CACHE_PATH>/ as one entry", confirm=_cudajit_confirm, own_detect=True)

# vLLM's torch_compile_cache: one entry per <h10>/ (a hash of the config, code and compiler), and
# torch_aot_compile/<sha256>/.
VLLM = LayoutShape("vllm", (
    KindShape("compile", "{hash}", patterns=(("hash", r"[0-9a-f]{10}"),)),
    KindShape("aot", "torch_aot_compile/{hash}", patterns=(("hash", r"[0-9a-f]{64}"),)),
), "<h10>/rank_<r>_<d>/<prefix>/, torch_aot_compile/<sha256>/", own_detect=True)

# torch's JIT-built C++/CUDA extensions (torch.utils.cpp_extension): one build directory per extension
# name, a Python identifier, holding torch's build.ninja, or the sources load_inline writes first
# (layouts/torchext.py).
TORCHEXT_EVIDENCE = frozenset({"build.ninja", "main.cpp", "cuda.cu"})


def _torchext_confirm(root: str, tops: list[str], names: list[str]) -> bool:
    """One of the first few directories lists torch's build.ninja or load_inline's sources (names only,
    searched in C: a tilus root's programs/ holds 10^5 names)."""
    for name in tops:
        try:
            if not TORCHEXT_EVIDENCE.isdisjoint(_names_in(root, name)):
                return True
        except OSError:
            pass
    return False


TORCHEXT = LayoutShape("torchext", (
    KindShape("extension", "{hash}", patterns=(("hash", r"[A-Za-z_][A-Za-z0-9_]*"),)),
), "<extension name>/ build directories", confirm=_torchext_confirm)

# JAX's persistent compilation cache (jax_compilation_cache_dir): flat <name>-<sha256>-cache files with
# -atime sidecars, one opaque entry listed from its parent, as the CUDA JIT cache is (layouts/jax.py).
JAX_FILE = re.compile(r"^[\w.-]+-[0-9a-f]{64}-(?:cache|atime)\Z")  # jax's names keep \w . - (sanitize_name)


def _jax_confirm(root: str, tops: list[str], names: list[str]) -> bool:
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR", "").rstrip("/")
    for name in tops:
        if env and os.path.join(os.path.abspath(root), name) == os.path.abspath(os.path.expanduser(env)):
            return True
        try:
            if any(JAX_FILE.match(n) for n in _names_in(root, name)[:_LOOKS]):
                return True
        except OSError:
            pass
    return False


JAX = LayoutShape("jax", (
    KindShape("compile_cache", "{hash}", patterns=(("hash", r"[^/.][^/]*"),)),
), "<JAX_COMPILATION_CACHE_DIR>/ as one entry", confirm=_jax_confirm)

# Numba's cache of @jit(cache=True) functions: one directory per source directory (NUMBA_CACHE_DIR's
# <dir name>_<sha1>/, or __pycache__/ beside the sources) holding .nbi indexes and .nbc overloads.
NUMBA_FILES = (".nbi", ".nbc")


def _numba_confirm(root: str, tops: list[str], names: list[str]) -> bool:
    for name in tops:
        try:  # each name's end tested in C (a tilus root's programs/ holds 10^5 names)
            if any(map(str.endswith, _names_in(root, name), itertools.repeat(NUMBA_FILES))):
                return True
        except OSError:
            pass
    return False


NUMBA = LayoutShape("numba", (
    # a hidden source directory's (`.venv_<sha1>`, numba names it by the directory) is one too; no other
    # hidden name is (`.kcache`)
    KindShape("functions", "{hash}", patterns=(("hash", r"[^/.][^/]*|\.[^/]+_[0-9a-f]{40}"),)),
), "<source dir>_<sha1>/ or __pycache__/ with .nbi and .nbc files", confirm=_numba_confirm)

# The registry: one shape per layout, in the order layouts are scanned and listed.
SHAPES: tuple[LayoutShape, ...] = (HIDET, TILUS, TILELANG, TRITON, INDUCTOR, CUDAJIT, VLLM, TORCHEXT, JAX, NUMBA)
BY_NAME = {s.name: s for s in SHAPES}
BUILD_SHAPE = next(s for s in SHAPES if s.build_kind)  # where `kcache build` publishes


# While `layouts.detect` asks every layout: each root's top-level directories, listed once (a Triton root
# has 10^5 of them, and seven layouts detect by them). None at any other time: never stale.
_listed: dict[str, tuple[list[str], frozenset[str]]] | None = None
_looked: dict[str, list[str]] | None = None  # ... and the names in the directories confirms look into


@contextmanager
def listing_roots_once() -> Iterator[None]:
    """Within the block, `top_dirs` lists each root once (layouts.detect asks every layout in turn), and
    each directory a confirm looks into is listed once (on a Triton root, torchext's, JAX's and Numba's
    confirms all look into the same 64 key directories)."""
    global _listed, _looked
    outer = _listed, _looked
    _listed, _looked = ({} if _listed is None else _listed), ({} if _looked is None else _looked)
    try:
        yield
    finally:
        _listed, _looked = outer


def _names_in(root: str, name: str) -> list[str]:
    """fsread.listdir of `name` in `root` (OSError as it raises), listed once within listing_roots_once."""
    path = os.path.join(root, name)
    got = _looked.get(path) if _looked is not None else None
    if got is None:
        got = fsread.listdir(path)
        if _looked is not None:
            _looked[path] = got
    return got


def top_dirs(root: str | os.PathLike, links: bool = True) -> list[str]:
    """The names of `root`'s top-level directories, in listing order: with `links`, a link to one counts
    (as is_dir() says); without, only real directories. OSError when it cannot be listed. A listing made
    here is kept only by a scan of `root` (fs/dirnames.py): detection writes nothing."""
    key = os.fspath(root)
    got = _listed.get(key) if _listed is not None else None
    if got is None:  # from its held root; the listing a scan kept while the root is unchanged
        got = dirnames.of(key).dirs_and_links(key)
        if _listed is not None:
            _listed[key] = got
    names, linked = got
    return list(names) if links or not linked else [name for name in names if name not in linked]
