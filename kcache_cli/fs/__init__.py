"""File-system primitives: reading and writing under a cache root through held directory descriptors,
removal, the root's `.kcache/` state, locks, read-marks, mounts and tar streams (the lowest floor)."""
