"""kcache: manage the on-disk caches of compiled GPU and CPU kernels."""

__version__ = "0.1.0"
