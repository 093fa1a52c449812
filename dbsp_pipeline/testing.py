"""Tools to test recovery: crash a pipeline at any durable action, in process or for real.

Every durable action on a table goes through a ``FaultInjectingTableStore``: it wraps the
table's store (``storage/table_store.py``) and passes two named crash points around each
commit and rollback, ``<role>.<action>.before`` and ``<role>.<action>.after``, where ``role``
names the table's part in the step protocol (``input``, ``division``, ``trace``, ``output``,
``manifest``, ``errors``) and ``action`` is ``commit`` (a data change), ``rewrite`` (a
compaction: same content, other files) or ``restore`` (a rollback). A Delta log cleanup
(``TableStore.clean_log_below``) that deletes files passes ``<role>.cleanup.before``,
``<role>.cleanup.between`` after each deleted file but the last (the files go one at a time,
oldest first) and ``<role>.cleanup.after``; one that deletes nothing passes none. Setting
table properties (``TableStore.set_properties``, a metadata-only commit) passes
``<role>.properties.before`` and ``.after`` when it commits; making columns nullable
(``TableStore.drop_not_null``, metadata-only too) ``<role>.schema.before`` and ``.after``. The
engine
passes a few more points outside storage (``rescale.*``, ``kafka.transaction.*``). A test:

* arms a point in process with ``arm(name, n)``: its n-th pass raises ``InjectedCrash`` (a
  ``BaseException``, so no engine code can swallow it); the test abandons the pipeline object,
  as a dead process would, and reopens the root;
* or runs a child process with ``DBSP_CRASH_AT=name:n`` in its environment: the n-th pass ends
  the process at once (``os._exit(CRASH_EXIT_CODE)``), like ``kill -9``;
* enumerates the points a workload passes with ``passes()`` (counted since ``reset()``), to
  crash at every one of them in turn.

A ``.before`` crash leaves nothing of the action durable; an ``.after`` crash leaves all of it.
Unarmed, a pass costs a dict lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction

from dbsp_pipeline.storage.crash_points import (
    CRASH_EXIT_CODE,
    InjectedCrash,
    arm,
    hit,
    passes,
    reset,
)
from dbsp_pipeline.storage.delta_store import has_properties
from dbsp_pipeline.storage.table_store import DataFile, FileChange, StoredFile, TableStore

__all__ = ["CRASH_EXIT_CODE", "FaultInjectingTableStore", "InjectedCrash", "arm", "passes",
           "reset"]


class FaultInjectingTableStore:
    """A ``TableStore`` that passes named crash points around every durable action of
    ``inner`` (see the module docstring); otherwise exactly ``inner``."""

    def __init__(self, inner: TableStore, role: str) -> None:
        self.inner = inner
        #: the table's part in the step protocol, which names its crash points
        self.role = role
        self.uri = inner.uri
        self.schema = inner.schema

    # -- durable actions: crash points around them -------------------------------------------
    def commit(self, adds: Sequence[AddAction] = (), removes: Sequence[str] = (), *,
               app_id: str | None = None, app_version: int | None = None,
               metadata: Mapping[str, object] | None = None, data_change: bool = True,
               expected_version: int | None = None) -> int:
        point = f"{self.role}.{'commit' if data_change else 'rewrite'}"
        hit(point + ".before")
        version = self.inner.commit(adds, removes, app_id=app_id, app_version=app_version,
                                    metadata=metadata, data_change=data_change,
                                    expected_version=expected_version)
        hit(point + ".after")
        return version

    def restore(self, version: int, *, expected_version: int | None = None) -> None:
        hit(f"{self.role}.restore.before")
        self.inner.restore(version, expected_version=expected_version)
        hit(f"{self.role}.restore.after")

    def set_properties(self, properties: Mapping[str, str], *,
                       expected_version: int | None = None) -> bool:
        if has_properties(self.inner.properties(), properties):
            return False  # nothing durable happens: no crash point
        hit(f"{self.role}.properties.before")
        changed = self.inner.set_properties(properties, expected_version=expected_version)
        hit(f"{self.role}.properties.after")
        return changed

    def properties(self) -> dict[str, str]:
        return self.inner.properties()

    def drop_not_null(self, columns: Sequence[str], *,
                      expected_version: int | None = None) -> bool:
        stored = self.inner.stored_schema()
        if all(c not in stored.names or stored.field(c).nullable for c in columns):
            return False  # nothing durable happens: no crash point
        hit(f"{self.role}.schema.before")
        changed = self.inner.drop_not_null(columns, expected_version=expected_version)
        hit(f"{self.role}.schema.after")
        return changed

    def stored_schema(self) -> pa.Schema:
        return self.inner.stored_schema()

    def clean_log_below(self, version: int) -> int:
        names = self.inner.log_files_below(version)
        if not names:
            return 0  # nothing durable happens: no crash point
        hit(f"{self.role}.cleanup.before")
        for i, name in enumerate(names):  # oldest first, one at a time
            if i:
                hit(f"{self.role}.cleanup.between")
            self.inner.delete_log_files([name])
        hit(f"{self.role}.cleanup.after")
        return len(names)

    # -- everything else: the inner store's ----------------------------------------------------
    def table_id(self) -> str:
        return self.inner.table_id()

    def log_files_below(self, version: int) -> list[str]:
        return self.inner.log_files_below(version)

    def delete_log_files(self, names: Sequence[str]) -> None:
        self.inner.delete_log_files(names)

    def version(self, *, refresh: bool = True) -> int:
        return self.inner.version(refresh=refresh)

    def files(self, version: int | None = None, *, refresh: bool = True) -> list[DataFile]:
        return self.inner.files(version, refresh=refresh)

    def added_files(self, lower: int, upper: int, data_only: bool = False) -> list[DataFile]:
        return self.inner.added_files(lower, upper, data_only)

    def file_changes(self, lower: int, upper: int) -> list[FileChange] | None:
        return self.inner.file_changes(lower, upper)

    def commit_infos(self, lower: int, upper: int) -> list[dict[str, Any]]:
        return self.inner.commit_infos(lower, upper)

    def commit_metadata(self, key: str, value: object) -> dict[str, Any] | None:
        return self.inner.commit_metadata(key, value)

    def transaction_version(self, app_id: str, *, refresh: bool = True) -> int | None:
        return self.inner.transaction_version(app_id, refresh=refresh)

    def path(self, relative: str) -> str:
        return self.inner.path(relative)

    def write_arrow(self, table: pa.Table, run: str | None = None, *,
                    relative: str | None = None,
                    compression: str | None = None) -> list[AddAction]:
        return self.inner.write_arrow(table, run, relative=relative, compression=compression)

    def describe_folder(self, relative: str) -> list[AddAction]:
        return self.inner.describe_folder(relative)

    def read_arrow(self, paths: Sequence[str], where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        return self.inner.read_arrow(paths, where, columns)

    def stored_data_files(self) -> list[StoredFile]:
        return self.inner.stored_data_files()

    def stat_data_files(self, paths: Sequence[str]) -> list[StoredFile]:
        return self.inner.stat_data_files(paths)

    def delete_data_files(self, paths: Sequence[str]) -> None:
        self.inner.delete_data_files(paths)
