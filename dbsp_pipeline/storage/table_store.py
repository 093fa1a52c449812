"""The storage seam: what the engine needs of a store that keeps one Delta table.

A ``TableStore`` owns one Delta table at one URI: its data files and its ``_delta_log``. Every
read of the log and every durable action on the table goes through it, so a second backend (an
object store) or a wrapper (``dbsp_pipeline.testing.FaultInjectingTableStore``) fills the same
seam. ``open_table_store`` picks the implementation from the URI:

* a local path or ``file://`` URI: ``storage/local_store.py::LocalTableStore``;
* ``s3://bucket/prefix``: ``storage/s3_store.py::S3TableStore`` (any S3-compatible store that
  honours conditional puts; see that module).

Every implementation passes the one conformance suite, ``tests/storage/
test_table_store_conformance.py``; a backend is done when it does.

Contracts every implementation keeps:

* Data files written by ``write_arrow`` (or by Spark into ``path(folder)`` and described by
  ``describe_folder``) are invisible to every Delta reader until ``commit`` returns with them.
* ``commit`` is atomic: when it returns, the new version is durable; when it raises
  ``ConcurrentWriterError``, nothing of it is. With ``expected_version``, the commit lands at
  exactly that version or not at all (compare-and-append): of two writers racing for one version,
  exactly one wins, whatever the backend, because the version's commit file is created with
  put-if-absent. A ``StorageError`` with ``definitely_failed=False`` means the outcome is unknown:
  reload and look (``transaction_version`` of the commit's app id) before retrying.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction

#: the folder of a table that holds its data files: ``data/<uuid>.parquet`` written on the
#: driver or in a task (``data_files.py``), ``data/<uuid>/part-*.parquet`` written by Spark
DATA_DIR = "data"
#: commit metadata of every commit the engine makes: how many actions (adds, removes and the
#: app transaction) follow the commit information in the commit file
ACTIONS_KEY = "dbsp.actions"


@dataclass(frozen=True)
class DataFile:
    """One committed Parquet file: its absolute path (or object URI), row count, and (for traces)
    its shard range or (for output logs) its step range, and the range of its weights, from the
    file's statistics (None where they hold none)."""

    path: str
    rows: int
    shard_min: int | None = None
    shard_max: int | None = None
    step_min: int | None = None
    step_max: int | None = None
    weight_min: int | None = None
    weight_max: int | None = None

    @property
    def weight_sum(self) -> int | None:
        """The sum of the file's weights, when its statistics alone say it (every row has the
        same weight, as in a consolidated set); None: read them."""
        if self.weight_min is None or self.weight_min != self.weight_max:
            return None
        return self.weight_min * self.rows

    @classmethod
    def from_stats(cls, path: str, stats: str) -> DataFile:
        s = json.loads(stats)
        lo, hi = s.get("minValues", {}), s.get("maxValues", {})
        return cls(path, int(s.get("numRecords", 0)), lo.get("_shard"), hi.get("_shard"),
                   lo.get("_step"), hi.get("_step"), lo.get("_weight"), hi.get("_weight"))

    @classmethod
    def from_rows(cls, path: str, rows: pa.Table) -> DataFile:
        """The ``DataFile`` of a file at ``path`` holding exactly ``rows``: what ``from_stats``
        gives for it once written (for a file written in the background,
        ``storage/write_behind.py``)."""
        ranges: dict[str, tuple[int | None, int | None]] = {}
        for column in ("_shard", "_step", "_weight"):
            if column in rows.column_names and rows.num_rows:
                bounds = pc.min_max(rows.column(column))
                ranges[column] = (bounds["min"].as_py(), bounds["max"].as_py())
            else:
                ranges[column] = (None, None)
        return cls(path, rows.num_rows, *ranges["_shard"], *ranges["_step"], *ranges["_weight"])


@dataclass(frozen=True)
class StoredFile:
    """A data file as the store holds it, committed or not: its path and when it was last
    written (seconds since the epoch). What garbage collection looks at."""

    path: str
    modified: float


@dataclass(frozen=True)
class FileChange:
    """What one commit did to a table's files: the absolute paths it added and removed."""

    version: int
    added: tuple[str, ...]
    removed: tuple[str, ...]


@runtime_checkable
class TableStore(Protocol):
    """One Delta table in a store. See the module docstring for the contracts."""

    #: where the table is: an absolute local path or ``s3://bucket/prefix``
    uri: str
    #: the table's Arrow schema (what ``write_arrow`` writes and ``read_arrow`` returns)
    schema: pa.Schema

    # -- versions and the log ----------------------------------------------------------------
    def version(self, *, refresh: bool = True) -> int:
        """The newest committed version; with ``refresh=False`` the one this handle last loaded
        or committed, without looking for other writers' commits."""
        ...

    def files(self, version: int | None = None, *, refresh: bool = True) -> list[DataFile]:
        """The data files of ``version`` (default: the newest; with ``refresh=False`` the one
        this handle last loaded or committed)."""
        ...

    def added_files(self, lower: int, upper: int, data_only: bool = False) -> list[DataFile]:
        """The files added by versions ``lower+1 .. upper``, in commit order; with
        ``data_only``, only files of data changes (not rewrites). Raises ``StorageError`` when
        ``data_only`` and a commit of the range was cleaned up."""
        ...

    def file_changes(self, lower: int, upper: int) -> list[FileChange] | None:
        """What each of the versions ``lower+1 .. upper`` did to the table's files, in commit
        order; None when a commit file of the range was cleaned up. Reads those commits only:
        the cost follows the number of commits, not the table's history."""
        ...

    def commit_infos(self, lower: int, upper: int) -> list[dict[str, Any]]:
        """The commit information (with custom metadata) of the versions ``lower+1 .. upper``
        whose commit files are still there."""
        ...

    def commit_metadata(self, key: str, value: object) -> dict[str, Any] | None:
        """The commit information of the newest retained commit whose custom metadata has
        ``key`` equal to ``value`` (None if none has)."""
        ...

    def transaction_version(self, app_id: str, *, refresh: bool = True) -> int | None:
        """The newest app-transaction version committed under ``app_id`` (None if none); with
        ``refresh`` False, as of the version loaded last (no read of the log)."""
        ...

    # -- data files --------------------------------------------------------------------------
    def path(self, relative: str) -> str:
        """The absolute path (or object URI) of ``relative`` inside the table."""
        ...

    def write_arrow(self, table: pa.Table, run: str | None = None, *,
                    relative: str | None = None,
                    compression: str | None = None) -> list[AddAction]:
        """Write ``table`` (in table schema) as one new, uncommitted data file, a piece of
        ``run`` if given (``data_files.sorted_run_of``), at ``relative`` if given (a fresh path
        from ``data_files.new_file_path``), with the Parquet codec ``compression`` (default
        ``data_files.COMPRESSION``); returns its add action (none for an empty table)."""
        ...

    def describe_folder(self, relative: str) -> list[AddAction]:
        """The add actions of the Parquet files another writer (Spark) put in the folder
        ``relative``; empty files are deleted and left out."""
        ...

    def read_arrow(self, paths: Sequence[str], where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of the data files ``paths`` that satisfy ``where`` (only ``columns``)."""
        ...

    def stored_data_files(self) -> list[StoredFile]:
        """Every Parquet file under the table's data folder, committed or not."""
        ...

    def stat_data_files(self, paths: Sequence[str]) -> list[StoredFile]:
        """The data files among ``paths`` (absolute) that the store holds, as
        ``stored_data_files`` describes them (a path it does not hold is left out)."""
        ...

    def delete_data_files(self, paths: Sequence[str]) -> None:
        """Delete the data files ``paths`` (the caller made sure no retained version needs
        them) and the data folders left empty."""
        ...

    # -- durable actions ---------------------------------------------------------------------
    def commit(self, adds: Sequence[AddAction] = (), removes: Sequence[str] = (), *,
               app_id: str | None = None, app_version: int | None = None,
               metadata: Mapping[str, object] | None = None, data_change: bool = True,
               expected_version: int | None = None) -> int:
        """Commit ``adds`` and the removal of the data files at the paths ``removes``; with
        ``app_id``/``app_version`` an app transaction; ``metadata`` as custom commit metadata.
        With ``expected_version`` the commit lands at exactly that version or raises
        ``ConcurrentWriterError``; without, it lands after whatever others committed (an app
        transaction committed concurrently under the same id is ``ConcurrentWriterError``).
        Returns the new version. Durable when it returns."""
        ...

    def restore(self, version: int, *, expected_version: int | None = None) -> None:
        """Roll the table back to ``version`` (a new commit whose files are those of
        ``version``). With ``expected_version`` the rollback commit lands at exactly that version
        or raises ``ConcurrentWriterError``. Durable when it returns."""
        ...

    def set_properties(self, properties: Mapping[str, str], *,
                       expected_version: int | None = None) -> bool:
        """Set Delta table ``properties`` (a metadata-only commit: the files stay) unless the
        loaded version has them all already; returns whether a commit was made. With
        ``expected_version`` the commit lands at exactly that version or raises
        ``ConcurrentWriterError``. Durable when it returns."""
        ...

    def properties(self) -> dict[str, str]:
        """The Delta table properties of the loaded version."""
        ...

    def drop_not_null(self, columns: Sequence[str], *,
                      expected_version: int | None = None) -> bool:
        """Make ``columns`` nullable in the table's Delta schema (``ALTER COLUMN ... DROP NOT
        NULL``: a metadata-only commit, the files stay), those the loaded version records NOT
        NULL; returns whether a commit was made. With ``expected_version`` the (first) commit
        lands at exactly that version or raises ``ConcurrentWriterError``. Durable when it
        returns."""
        ...

    def stored_schema(self) -> pa.Schema:
        """The schema the table's Delta metadata records (the loaded version's), which may
        differ from ``schema``, the one this handle was opened with."""
        ...

    def table_id(self) -> str:
        """The table's id (its Delta metadata's): a table deleted and created again has
        another."""
        ...

    def clean_log_below(self, version: int) -> int:
        """Delete the commit files (and older Delta checkpoints) of the table's log below its
        newest readable Delta checkpoint at or before ``version``; returns how many went.

        Afterwards every version from that checkpoint on still loads (delta-rs starts from the
        checkpoint) and the log's listing is bounded by the checkpoint interval plus the commits
        after ``version``; versions below the checkpoint no longer load, so ``version`` must be
        the oldest version any reader still needs. Files go oldest first: a crash leaves a log
        that starts later, which loads the same, and the next call deletes the rest. It is
        ``delete_log_files(log_files_below(version))``."""
        ...

    def log_files_below(self, version: int) -> list[str]:
        """The names (in ``_delta_log``) of the files ``clean_log_below(version)`` deletes,
        oldest version first; empty when no readable Delta checkpoint is at or before
        ``version``. Reads only."""
        ...

    def delete_log_files(self, names: Sequence[str]) -> None:
        """Delete the log files ``names`` (from ``log_files_below``), in the order given."""
        ...


def root_uri(root: str) -> str:
    """The one spelling of a root (or table) location: an absolute local path, or an object
    URI as given without a trailing slash (``s3://bucket/prefix``)."""
    if "://" in root and not root.startswith("file://"):
        return root.rstrip("/")
    return os.path.abspath(root.removeprefix("file://"))


def open_table_store(uri: str, schema: pa.Schema,
                     configuration: Mapping[str, str] | None = None, *,
                     storage_options: Mapping[str, str] | None = None) -> TableStore:
    """The store of the Delta table at ``uri`` (created, empty, with ``schema`` and the Delta
    ``configuration`` if there is none), by the URI's scheme: a local path or ``file://`` is
    local, ``s3://bucket/prefix`` is S3 (``storage_options`` or the ``AWS_*`` environment say
    where and who). Any other scheme is a ``StorageError`` naming the URI."""
    from dbsp_pipeline.errors import StorageError

    scheme, sep, _ = uri.partition("://")
    if not sep or scheme == "file":
        from dbsp_pipeline.storage.local_store import LocalTableStore

        return LocalTableStore(uri, schema, configuration)
    if scheme in ("s3", "s3a"):
        from dbsp_pipeline.storage.s3_store import S3TableStore

        return S3TableStore(uri, schema, configuration, storage_options=storage_options)
    raise StorageError(f"table URI {uri!r}: unsupported scheme '{scheme}://' (a local path, "
                       "file:// or s3://bucket/prefix)", definitely_failed=True)
