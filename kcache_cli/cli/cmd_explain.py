"""`kcache explain`: will the consumer here use these entries (or a Mega-Cache blob's artifacts)?"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o
from kcache_cli.cli.cmd_mega import is_blob
from kcache_cli.cli.table import Column
from kcache_cli.model.records import ScanFilter
from kcache_cli.util.lazy import lazy_module

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use
    from kcache_cli.archive import manifest
    from kcache_cli.cli import cmd_oci
    from kcache_cli.ops import explain
    from kcache_cli.remote import oci, oci_ops
else:
    manifest = lazy_module("kcache_cli.archive.manifest")
    explain = lazy_module("kcache_cli.ops.explain")
    cmd_oci = lazy_module("kcache_cli.cli.cmd_oci")
    oci = lazy_module("kcache_cli.remote.oci")
    oci_ops = lazy_module("kcache_cli.remote.oci_ops")


def register(app: typer.Typer) -> None:
    app.command("explain")(explain_command)


def explain_command(
    ctx: typer.Context,
    targets: Annotated[Optional[List[str]], typer.Argument(
        metavar="[ENTRY|ARCHIVE|IMAGE|BLOB]...", help="Entries (hash prefix or path), archives kcache exported, "
        "oci:// images kcache pushed, or Mega-Cache blobs. Default: every entry of the cache.")] = None,
    python: Annotated[Optional[str], typer.Option(
        "--python", metavar="PY", help="The Python that will run the model: its installed compiler versions "
        "are read through importlib.metadata (nothing is imported). Default: python3 on PATH.")] = None,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", metavar="ARCH", help="The GPU arch that will run it (sm_90a, sm_80). Default: nvidia-smi's "
        "first GPU.")] = None,
    cache: c.CacheOpt = None,
    cache_dir: o.CacheDirOpt = None,
    as_json: o.JsonOpt = False,
) -> None:
    """Will the consumer here use each entry? hit, miss or unknown.

    Per entry: hit, miss (the factor, its recorded value and the value here) or unknown (why).

    "Here" is --python's environment (its torch, Triton... versions), the GPU arch (--gpu, else
    nvidia-smi) and the compilers' environment switches set in this shell. Triton: its version (recorded,
    or by the key's shape), target backend, arch and warp size, the entry's status. Inductor: torch's
    presence, the entry's status and the variables that turn torch's caches off (its keys hash what only
    its pickles record: never a guessed hit). Numba: its version and the Python each index was written
    for, the entry's status, NUMBA_CPU_NAME and NUMBA_CPU_FEATURES against the CPU in its keys (never a
    hit: kcache does not ask the CPU here). JAX: its presence and the cache's status (moved: every key
    misses; never a hit). A blob: the torch version its kcache sidecar records, and Inductor's variables.
    An archive or an oci:// image: each entry's manifest record (the compiler and
    arch export found); with a trust list set, what import or pull would refuse is a miss. An image's
    verdicts are for its entries as kcache pull writes them: pull rewrites the paths Triton and vLLM
    entries record, which a mount of the image as it is (KServe, GKM) keeps. Exit 0 whatever the verdicts.

    Example: kcache explain --python ~/venvs/serve/bin/python --gpu sm_90a
    """
    opts = o.use(ctx, cache_dir, as_json)
    images = _images(targets or [])
    here = explain.probe(python, gpu=gpu)
    result = explain.ExplainResult(here)
    for url in images:  # the image's manifest records, read from its layer (nothing written)
        with cmd_oci.opened(oci.parse_ref(url), 2.0, None, None) as reg:
            image = oci_ops.read_image(reg, reg.ref.reference)
            result.items += explain.explain_image(oci_ops.image_records(reg, image), here, image.ref.url)
    targets = [t for t in targets or [] if t not in images]
    blobs = [t for t in targets or [] if is_blob(t)]
    archives = [t for t in targets or [] if t not in blobs and os.path.isfile(t)
                and t.endswith(tuple(s for s, _ in manifest.COMPRESSION_BY_SUFFIX))]
    refs = [t for t in targets or [] if t not in blobs and t not in archives]
    for b in blobs:
        result.items += explain.explain_blob(b, here)
    for a in archives:
        result.items += explain.explain_archive(a, here)
    if refs or not (blobs or archives or images):
        result.items += _in_caches(opts, cache, refs, here)
    out = c.Output(opts)
    out.result(result, lambda: _human(out, result))


def _in_caches(opts: o.GlobalOptions, cache: Optional[str], refs: list[str], here) -> list:
    """The verdicts on every entry of the scope's caches, or on the entries `refs` name: each found in
    whichever cache holds it, as inspect finds one (in none or in several: a usage error naming them)."""
    locs = c.cache_locations(opts, False, cache, refs or None)
    if not refs:
        return [item for loc in locs for item in explain.explain_root(loc.path, here)]
    out = []
    for ref in refs:  # explain has no --space/--op: an ambiguous prefix asks for the entry's path
        loc, entry = c.resolve_in_scope(opts, ref, cache, lambda root: ScanFilter(), selectors=False, locs=locs)
        out += explain.explain_root(loc.path, here, [entry])
    return out


def _images(targets: list[str]) -> list[str]:
    """The oci:// images among `targets`; another remote's URL is a usage error (pull it first)."""
    images = [t for t in targets if oci.is_oci(t)]
    remote = next((t for t in targets if "://" in t and t not in images and not os.path.exists(t)), None)
    if remote is not None:
        raise c.UsageError(f"explain judges entries, archives, images and blobs, not a {remote.partition(':')[0]} "
                           f"remote ({c.printable_line(remote)}): pull it into a cache (kcache pull --remote URL "
                           "--cache-dir DIR) and explain that")
    return images


def _human(out: c.Output, result) -> None:
    h = result.here
    versions = ", ".join(f"{k} {v}" for k, v in sorted(h.versions.items()) if v) or "none of the compilers"
    gpu = f"{h.gpu} ({h.gpu_source})" if h.gpu else "none found (nvidia-smi names none; --gpu ARCH gives one)"
    out.info(f"here: {h.executable or 'no python'} ({versions}); GPU {gpu}"
             + (f"; {h.problem}" if h.problem else ""))
    rows = []
    one_layout = len({i.layout for i in result.items}) == 1  # then its name tells no row from another
    for i in result.items:
        v = i.verdict
        detail = (f"{v.factor}: {_said(v.recorded)} -> {_said(v.here)}" if v.verdict == "miss" and v.factor
                  else v.why)
        rows.append([v.verdict, i.layout or "-", i.kind, i.space or "-", i.op or "-", i.hash or i.what, detail])
    if rows:  # as ls narrows: kind, space and layout go first, the op late, the hash never (its prefix)
        c.print_table([Column("verdict"), Column("layout", drop=0 if one_layout else 3), Column("kind", drop=1),
                       Column("space", drop=2), Column("op", drop=9), Column("hash", spill=True),
                       Column("why", wrap=True)], rows)
    out.info(f"{result.count('hit')} hit, {result.count('miss')} miss, {result.count('unknown')} unknown")


def _said(value: object) -> str:
    """A recorded or found value as the table says it: nothing known is "not recorded", never None."""
    return "not recorded" if value is None else str(value)
