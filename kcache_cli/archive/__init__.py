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

from kcache_cli.archive.export import (  # noqa: F401
    ENTRIES_PER_PART,
    ENTRY_BUDGET,
    MAX_PARTS,
    PARALLEL_MIN_ENTRIES,
    EntryFiles,
    ExportedEntry,
    ExportPlan,
    ExportResult,
    entry_records,
    export_archive,
    plan_export,
)
from kcache_cli.archive.importer import (  # noqa: F401
    ImportedEntry,
    Importer,
    ImportResult,
    ImportStaging,
    PlannedEntry,
    check_total,
    import_archive,
    is_provider,
    other_layout_problem,
    plan_records,
    publish_staged,
    remove_stale_staging,
)
from kcache_cli.archive.manifest import (  # noqa: F401
    BIG_FILE,
    BINARY_SUFFIXES,
    COMPRESSION_BY_SUFFIX,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_NAME_DEPTH,
    PATH_MAX,
    ArchiveRejected,
    EntryRecord,
    FileInfo,
    ImportLimits,
    Manifest,
    compression_for,
    entry_path_problem,
    is_binary_name,
    is_lock_name,
    link_problem,
    path_problem,
    records_from_json,
    rejection_reason,
)
from kcache_cli.formats.gpu import arch_runs_on, archs_from_command, cuda_archs, local_compute_caps  # noqa: F401
from kcache_cli.util.progress import Progress  # noqa: F401
