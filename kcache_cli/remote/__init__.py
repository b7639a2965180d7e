"""A cache shared by a fleet (docs/remote.md): push, pull, remote ls/stats/prune, build --remote.

`store` holds the Store interface and its backends (Redis, a shared directory); `formats` how an
entry's record and files map to keys (kcache's own, or a layout's, such as Triton's); `push`, `pull`
and `manage` the operations; `build` the build that consults the remote. The redis client is
imported only when a redis:// store is opened."""
