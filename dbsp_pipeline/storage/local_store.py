"""A Delta table on a local (or mounted) filesystem: the ``TableStore`` of local roots.

delta-rs creates each commit file with a hard link that fails if the file exists, so commits
are atomic and two writers racing for one version cannot both win (see
``storage/delta_store.py`` for the contracts every store keeps).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Set

import pyarrow as pa
import pyarrow.fs as pafs

from dbsp_pipeline.storage.delta_store import DeltaTableStore
from dbsp_pipeline.storage.table_store import DATA_DIR


def local_path(uri: str) -> str:
    """The absolute local path of ``uri`` (a path, relative or absolute, or ``file://``)."""
    return os.path.abspath(uri.removeprefix("file://"))


class LocalTableStore(DeltaTableStore):
    """The Delta table at the local path (or ``file://`` URI) ``uri``."""

    def __init__(self, uri: str, schema: pa.Schema,
                 configuration: Mapping[str, str] | None = None) -> None:
        super().__init__(local_path(uri), schema, configuration,
                         filesystem=pafs.LocalFileSystem())

    def _remove_empty_folders(self, folders: Set[str]) -> None:
        data_root = os.path.join(self.uri, DATA_DIR)
        for folder in sorted(folders, key=len, reverse=True):  # a sub-folder before its parent
            # and up: a folder holding only folders that were just removed goes with them
            while folder.startswith(data_root + os.sep) and os.path.isdir(folder) \
                    and not os.listdir(folder):
                os.rmdir(folder)
                folder = os.path.dirname(folder)
