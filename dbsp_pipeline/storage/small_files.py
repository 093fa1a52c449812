"""Small side files of a pipeline root (schema cache, leases, markers), replaced atomically."""

from __future__ import annotations

import os


def write_atomically(path: str, text: str) -> None:
    """Replace ``path`` with ``text``: a reader (or a crash) sees the old file or the new one,
    never a partial one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
