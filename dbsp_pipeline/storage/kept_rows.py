"""The rows of small data files this process wrote, kept in memory so that reading them again
(the step that consumes a push, the next steps' trace lookups, a merge) opens no Parquet file.

Data files are immutable and their names are never reused, so rows kept under a file's path are
that file's content for as long as anyone reads the file: the caller keeps exactly what reading
the file gives (its table's schema). The rows kept are bounded: up to ``limit`` rows in all (and
``limit_bytes`` bytes of Arrow buffers, when given), the oldest file dropped first; a file over
the bound on its own is not kept. Thread-safe: pushes come from a Kafka runner's source threads,
merges run in the background.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa


class KeptRows:
    """Rows of data files by absolute path, up to a bound given at each ``keep``."""

    def __init__(self) -> None:
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()
        self._rows = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def keep(self, path: str, rows: pa.Table, limit: int, limit_bytes: int | None = None
             ) -> None:
        """Keep ``rows`` as the content of the file ``path``, then drop the oldest files until
        at most ``limit`` rows (and ``limit_bytes`` bytes) are kept (``rows`` alone over a
        bound: not kept)."""
        nbytes = rows.get_total_buffer_size()
        if rows.num_rows > limit or (limit_bytes is not None and nbytes > limit_bytes):
            return
        with self._lock:
            self._forget(path)
            self._tables[path] = rows
            self._rows += rows.num_rows
            self._bytes += nbytes
            while self._rows > limit or (limit_bytes is not None and self._bytes > limit_bytes):
                self._forget(next(iter(self._tables)))

    def _forget(self, path: str) -> None:
        """Drop the rows kept for ``path`` (none: nothing), with the lock held."""
        old = self._tables.pop(path, None)
        if old is not None:
            self._rows -= old.num_rows
            self._bytes -= old.get_total_buffer_size()

    def get(self, path: str) -> pa.Table | None:
        """The rows kept for the file ``path`` (None: not kept)."""
        with self._lock:
            return self._tables.get(path)

    def __contains__(self, path: object) -> bool:
        with self._lock:
            return path in self._tables

    def __len__(self) -> int:
        with self._lock:
            return len(self._tables)
