"""Export and import of cache entries as one verified archive (docs/archives.md).

An archive is a tar stream (plain, gzip or zstd). Its first member is `manifest.json`: the kcache
version and, per entry, its layout, kind, key fields (space, op, hash, path in the cache), each
file's size and sha256, each symlink's target, the empty lock files it had, and the compiler, arch
and platform where known. Then come the entries' directories, files and symlinks, named by their
path relative to the cache root (so `tar -tzf` shows where each lands).

Import is all or nothing for the archive: every member is checked against the manifest and its
sha256 while it is extracted into a staging directory inside the root (`.kcache/import-*`); only
when the whole archive has been read and found valid is anything published, entry by entry, each
with one rename under the entry's lock. A rejected archive leaves the cache as it was.

Links: a symlink must stay inside its own entry, except that a tilus script's `programs/<i>` and
`latency/<key>/<i>` links may point at `programs/<h12>` when that program is in the archive or
already in the cache. Lock files (`.lock`, `*.lock`, `*.t_lock`) are machine-local: they travel
as names in the manifest and come back as new empty files; a lock-file member is rejected.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# The names the package hands on (`from kcache_cli import archive; archive.plan_export`), each imported from its
# module when first asked for (PEP 562). Importing the package imports none of its modules: one loaded lazily
# (util/lazy.py) that imports a sibling makes Python run this file first, which must not import that module
# again half loaded. kcache's own code imports from the modules.
_FROM = {
    "kcache_cli.archive.export": (
        "ENTRIES_PER_PART", "ENTRY_BUDGET", "MAX_PARTS", "PARALLEL_MIN_ENTRIES", "EntryFiles", "ExportedEntry",
        "ExportPlan", "ExportResult", "entry_records", "export_archive", "plan_export",
    ),
    "kcache_cli.archive.importer": (
        "ImportedEntry", "Importer", "ImportResult", "ImportStaging", "PlannedEntry", "check_total",
        "held_locks", "import_archive", "is_provider", "other_layout_problem", "plan_records", "publish_staged",
        "remove_stale_staging",
    ),
    "kcache_cli.archive.manifest": (
        "BIG_FILE", "BINARY_SUFFIXES", "COMPRESSION_BY_SUFFIX", "FORMAT", "FORMAT_VERSION", "MANIFEST_NAME",
        "MAX_NAME_DEPTH", "PATH_MAX", "ArchiveRejected", "EntryRecord", "FileInfo", "ImportLimits", "Manifest",
        "compression_for", "entry_path_problem", "is_binary_name", "is_lock_name", "link_problem", "path_problem",
        "records_from_json", "rejection_reason",
    ),
    "kcache_cli.formats.gpu": (
        "arch_runs_on", "archs_from_command", "cuda_archs", "local_compute_caps",
    ),
    "kcache_cli.util.progress": (
        "Progress",
    ),
}
_MODULE_OF = {name: module for module, names in _FROM.items() for name in names}
_MODULES = ("export", "importer", "manifest", "mega")  # archive.export: the module, once asked for


def __getattr__(name: str) -> Any:
    """`name` from the module that defines it (or the module `name`), imported the first time it is asked
    for."""
    if name in _MODULES:
        return import_module(f"{__name__}.{name}")
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(module), name)
    return value
