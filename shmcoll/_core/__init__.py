"""Internals of the library: the shared segment's lifecycle (segment), every
SHMCOLL_* setting (settings), the CPU topology and CPU counts (topology), per-user
paths (paths) and size notation (sizes).  Not a public API."""
