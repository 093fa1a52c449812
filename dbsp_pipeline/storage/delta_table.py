"""A Delta Lake table written by Spark (or the driver) and kept by a ``TableStore``.

Spark cannot load the Delta Spark jars here (they come from Maven at run time), so the engine
splits the work: Spark writes plain Parquet files into a fresh folder inside the table
(``data/<uuid>/``), and the driver commits them with delta-rs as add actions (with ``numRecords``
and per-column min/max stats, so any Delta reader can skip files). Reads go the other way: the
driver asks the store for the files of a version and hands them to ``spark.read.parquet``.

``SparkDeltaTable`` is the handle: it holds the Spark schema and the single-writer rule and
delegates every read of the log and every durable action to its store
(``storage/table_store.py``), chosen from the URI (a local path, ``file://``, or
``s3://bucket/prefix``) and wrapped in ``dbsp_pipeline.testing.FaultInjectingTableStore``, which
passes the named crash points of the table's role around each durable action.

Durability: a version exists once ``commit`` returns; files written but not committed are
invisible to every Delta reader (and are removed by garbage collection). Commits are atomic
(the store creates ``_delta_log/N.json`` with put-if-absent), so two writers racing for the same
version cannot both win.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction
from pyspark.errors import (
    ArithmeticException,
    ArrayIndexOutOfBoundsException,
    DateTimeException,
    IllegalArgumentException,
    NumberFormatException,
    PythonException,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from dbsp_pipeline.errors import ComputationError, ConcurrentWriterError, StorageError
from dbsp_pipeline.storage.data_files import CHECKSUMS_READ
from dbsp_pipeline.storage.delta_store import LOG_DIR
from dbsp_pipeline.storage.s3_store import s3_options
from dbsp_pipeline.storage.small_files import is_remote, read_bytes, read_text
from dbsp_pipeline.storage.table_store import (
    ACTIONS_KEY,
    DATA_DIR,
    DataFile,
    TableStore,
    open_table_store,
)
from dbsp_pipeline.zset import quote, spark_to_arrow_schema

if TYPE_CHECKING:
    from dbsp_pipeline.storage.garbage import RemovedFiles

__all__ = ["ACTIONS_KEY", "DATA_DIR", "DataFile", "SparkDeltaTable", "spark_to_arrow_schema"]

#: what Spark needs to read and write the files of an ``s3://`` table (as ``s3a://``)
SPARK_S3_NEEDS = (
    "Spark reaches s3:// tables through Hadoop's S3A filesystem, which is not on its classpath: "
    "start Spark with the jars org.apache.hadoop:hadoop-aws (the version of Spark's Hadoop, "
    "3.5.0 for pyspark 4.3) and the AWS SDK v2 bundle it depends on "
    "(software.amazon.awssdk:bundle), e.g. spark.jars.packages="
    "org.apache.hadoop:hadoop-aws:3.5.0, and set spark.hadoop.fs.s3a.endpoint, "
    "fs.s3a.access.key, fs.s3a.secret.key and fs.s3a.path.style.access=true for a store other "
    "than AWS; or run the steps on the driver (the driver path needs no jars)")
_NO_S3A = ("S3AFileSystem", "No FileSystem for scheme \"s3a\"", "No FileSystem for scheme s3a")


class SparkDeltaTable:
    """A Delta table at ``uri`` with a fixed Spark schema. See the module docstring."""

    def __init__(self, spark: SparkSession, uri: str, schema: StructType,
                 configuration: dict[str, str] | None = None, *, role: str = "table",
                 single_writer: bool = False,
                 storage_options: Mapping[str, str] | None = None,
                 compression: str | None = None) -> None:
        from dbsp_pipeline.testing import FaultInjectingTableStore

        self.spark = spark
        #: the Parquet codec of the files ``write_arrow`` writes (default
        #: ``data_files.COMPRESSION``; a table users read with any reader: ``PORTABLE_COMPRESSION``)
        self.compression = compression
        #: the table's part in the step protocol, which names its crash points
        self.role = role
        #: only this handle may write: every commit is a compare-and-append at the version
        #: after the one this handle last saw, and losing that race is ``ConcurrentWriterError``
        self.single_writer = single_writer
        self.schema = schema
        self.arrow_schema = spark_to_arrow_schema(schema)
        self.store: TableStore = FaultInjectingTableStore(
            open_table_store(uri, self.arrow_schema, configuration,
                             storage_options=storage_options), role)
        self.uri = self.store.uri
        #: the absolute paths of data files a commit of this process made part of the table
        #: (``commit``, or a state database's checkpoint recording them staged): their writes
        #: are over, so once no retained version refers to them garbage collection deletes
        #: them a minute after they were written, not after the hour of grace that protects
        #: writes still on their way to a commit (``storage/garbage.py``)
        self.committed_files: set[str] = set()
        #: what garbage collection learnt of this table's removed files since it last listed
        #: the data folder (``storage/garbage.py``; None: the next collection lists it)
        self.garbage: RemovedFiles | None = None

    # -- versions --------------------------------------------------------------------------
    def version(self) -> int:
        """The newest committed version (0 for a freshly created table). A single-writer table
        does not look for other writers' commits: its newest version is its own last one."""
        return self.store.version(refresh=not self.single_writer)

    def loaded_version(self) -> int:
        """The version this handle last loaded or committed, without looking for newer commits
        (exact for tables only this handle writes, such as a pipeline's state tables)."""
        return self.store.version(refresh=False)

    def data_file(self, add: AddAction) -> DataFile:
        """The ``DataFile`` an add action (from ``write_files``/``write_arrow``) commits."""
        return DataFile.from_stats(self.store.path(add.path), add.stats)

    def files(self, version: int | None = None) -> list[DataFile]:
        """The data files of ``version`` (default: the newest)."""
        return self.store.files(version, refresh=not self.single_writer)

    def added_files(self, lower: int, upper: int, data_only: bool = False) -> list[DataFile]:
        """The files added by versions ``lower+1 .. upper``, in commit order; with
        ``data_only``, only files of data changes (not rewrites: ``commit(data_change=False)``).

        Reads the commits themselves, so the cost follows the number of commits in the range,
        not the table's history; falls back to comparing the two snapshots when a commit file
        was already cleaned up.
        """
        return self.store.added_files(lower, upper, data_only)

    def commit_infos(self, lower: int, upper: int) -> list[dict[str, Any]]:
        """The commit information (with custom metadata) of versions ``lower+1 .. upper`` that
        are still on disk."""
        return self.store.commit_infos(lower, upper)

    def commit_metadata(self, key: str, value: object) -> dict[str, Any] | None:
        """The commit information of the newest commit whose custom metadata has ``key`` equal
        to ``value`` (None if no retained commit has), searching from the newest commit back."""
        return self.store.commit_metadata(key, value)

    def transaction_version(self, app_id: str, *, refresh: bool = True) -> int | None:
        """The newest app-transaction version committed under ``app_id`` (None if none); with
        ``refresh`` False, as of the version loaded last (``version()`` loads the newest)."""
        return self.store.transaction_version(app_id, refresh=refresh)

    # -- writing ---------------------------------------------------------------------------
    def write_files(self, df: DataFrame, *, sort_by: Sequence[str] = ()) -> list[AddAction]:
        """Write ``df`` (columns in table order) as new, uncommitted Parquet files.

        Returns the add actions to ``commit``. Empty files are not returned.
        """
        folder_rel = f"{DATA_DIR}/{uuid.uuid4().hex}"
        folder = self.store.path(folder_rel)
        ordered = df.select(*[quote(f.name) for f in self.schema.fields])
        if sort_by:
            ordered = ordered.sortWithinPartitions(*[quote(c) for c in sort_by])
        try:
            # the default mode: fail if the folder exists
            ordered.write.parquet(spark_path(folder))
        except _COMPUTATION_ERRORS as e:  # Spark computes the rows as it writes them
            raise ComputationError(f"computing the rows of {self.uri} failed: "
                                   f"{type(e).__name__}: {e}") from e
        except Exception as e:
            self._raise_if_spark_lacks_s3(folder, e)
            raise StorageError(f"writing data files to {folder} failed: {e}",
                               definitely_failed=True) from e
        return self.store.describe_folder(folder_rel)

    def write_arrow(self, table: pa.Table, run: str | None = None, *,
                    relative: str | None = None) -> list[AddAction]:
        """Write a small Arrow table (already in table schema) as one new, uncommitted file (a
        piece of ``run``, if given: ``data_files.sorted_run_of``; at ``relative``, a fresh path
        from ``data_files.new_file_path``, if given), with the table's codec (``compression``)."""
        return self.store.write_arrow(table, run, relative=relative,
                                      compression=self.compression)

    def commit(self, adds: Sequence[AddAction] = (), removes: Sequence[str] = (), *,
               app_id: str | None = None, app_version: int | None = None,
               metadata: dict[str, Any] | None = None, data_change: bool = True,
               expected_version: int | None = None) -> int:
        """Commit add actions (and removal of the files at the absolute paths ``removes``).

        With ``app_id``/``app_version`` the commit records an app transaction (idempotent writes:
        a reader can ask ``transaction_version(app_id)``). A single-writer table commits at the
        version after the one it last saw, and any table given ``expected_version`` commits at
        that version, or raises ``ConcurrentWriterError`` (nothing of the commit is visible).
        Returns the new version.

        A commit at a known version that adds files and fails with an unknown outcome (a
        ``StorageError`` that "may have happened") is resolved before raising: when that
        version is on the log and adds these files (their names are unique) the commit
        happened and its version is returned; when it holds another writer's commit, or (a
        single writer's table) another writer committed after it, ``ConcurrentWriterError``
        (this writer is fenced). Only when the version is not on the log (the commit may
        still land, or not) does the doubt reach the caller.
        """
        expected = expected_version
        if expected is None and self.single_writer:
            expected = self.store.version(refresh=False) + 1
        try:
            version = self.store.commit(adds, removes, app_id=app_id, app_version=app_version,
                                        metadata=metadata, data_change=data_change,
                                        expected_version=expected)
        except StorageError as e:
            if e.definitely_failed or expected is None or not adds:
                raise
            if not self._landed(expected, adds, e):
                raise
            version = expected
        self.committed_files.update(self.store.path(a.path) for a in adds)
        return version

    def _landed(self, version: int, adds: Sequence[AddAction], error: StorageError) -> bool:
        """Whether the commit of ``adds`` at ``version``, which failed with the unknown outcome
        ``error``, is on the log (False: not known yet); ``ConcurrentWriterError`` when the
        version holds another commit."""
        try:
            newest = self.store.version(refresh=True)
            if newest < version:
                return False
            landed = {f.path for f in self.store.added_files(version - 1, version)}
        except StorageError:
            return False  # the store cannot tell yet: the doubt stays
        if not {self.store.path(a.path) for a in adds} <= landed:
            raise ConcurrentWriterError(f"another writer committed version {version} of "
                                        f"{self.uri} first") from error
        if newest > version and self.single_writer:
            # ours landed, but a single writer's next commit must not be based past another
            # writer's: that writer fenced this one
            raise ConcurrentWriterError(f"version {version} of {self.uri} holds this commit, "
                                        "and another writer committed after it") from error
        return True

    def restore(self, version: int) -> None:
        """Roll the table back to ``version`` (a new commit whose files are those of
        ``version``)."""
        expected = self.store.version(refresh=False) + 1 if self.single_writer else None
        self.store.restore(version, expected_version=expected)

    def set_properties(self, properties: Mapping[str, str]) -> bool:
        """Set Delta table ``properties`` unless they are set (``TableStore.set_properties``); a
        single-writer table sets them at the version after the one it last saw, or raises
        ``ConcurrentWriterError``. Returns whether a commit was made."""
        expected = self.store.version(refresh=False) + 1 if self.single_writer else None
        return self.store.set_properties(properties, expected_version=expected)

    def drop_not_null(self, columns: Sequence[str]) -> bool:
        """Make ``columns`` nullable in the table's Delta schema where it records them NOT NULL
        (``TableStore.drop_not_null``); a single-writer table commits at the version after the
        one it last saw, or raises ``ConcurrentWriterError``. Returns whether it committed."""
        expected = self.store.version(refresh=False) + 1 if self.single_writer else None
        return self.store.drop_not_null(columns, expected_version=expected)

    def table_id(self) -> str:
        """The table's id (its Delta metadata's)."""
        return self.store.table_id()

    def clean_log_below(self, version: int) -> int:
        """Delete the log below the newest Delta checkpoint at or before ``version``, the
        oldest version any reader still needs (``TableStore.clean_log_below``)."""
        return self.store.clean_log_below(version)

    # -- reading ---------------------------------------------------------------------------
    def read(self, files: Sequence[DataFile] | Sequence[str]) -> DataFrame:
        """A DataFrame over the given data files (an empty one for no files)."""
        paths = [spark_path(f.path if isinstance(f, DataFile) else f) for f in files]
        if not paths:
            return self.spark.createDataFrame([], self.schema)
        try:
            return self.spark.read.schema(self.schema).parquet(*paths)
        except Exception as e:
            self._raise_if_spark_lacks_s3(self.uri, e)
            raise

    def read_arrow(self, files: Sequence[DataFile] | Sequence[str],
                   where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of the given data files, read on the driver, that satisfy ``where`` (only
        ``columns``, if given). Row groups whose statistics exclude ``where`` are skipped."""
        paths = [f.path if isinstance(f, DataFile) else f for f in files]
        return self.store.read_arrow(paths, where, columns)

    def read_version(self, version: int | None = None) -> DataFrame:
        return self.read(self.files(version))

    def _raise_if_spark_lacks_s3(self, where: str, error: Exception) -> None:
        """A ``StorageError`` saying what Spark needs, if ``error`` is Spark not knowing s3a."""
        if where.startswith(("s3://", "s3a://")) and any(m in str(error) for m in _NO_S3A):
            raise StorageError(f"Spark cannot reach {where}: {SPARK_S3_NEEDS}",
                               definitely_failed=True) from None


def spark_path(path: str) -> str:
    """The path Spark (Hadoop) knows a table file by: ``s3a://`` for ``s3://``."""
    return "s3a://" + path[len("s3://"):] if path.startswith("s3://") else path




# -- reading a table's log without a handle (no Spark, no writes): for readers of a root that
# is not open. Any store: a local path, or an object URI whose store the ``AWS_*`` environment
# names (``storage/s3_store.py``), reached through delta-rs and ``storage/small_files.py``.

def storage_options(uri: str) -> dict[str, str] | None:
    """The storage options delta-rs reads the table at ``uri`` with (None: a local table)."""
    return s3_options(uri) if is_remote(uri) else None


#: what Spark raises when computing rows fails (an overflow, a bad cast, an operator's Python
#: code in a task), as opposed to the storage failing: ``write_files`` computes as it writes
_COMPUTATION_ERRORS = (ArithmeticException, NumberFormatException, DateTimeException,
                       PythonException, IllegalArgumentException, ArrayIndexOutOfBoundsException)


def delta_log(uri: str, version: int | None = None) -> DeltaTable | None:
    """The delta-rs table at ``uri`` (at ``version``, default the newest), read-only; None when
    there is no Delta table there yet. Never creates one."""
    options = storage_options(uri)
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return None
    return DeltaTable(uri, version=version, storage_options=options)


def newest_rows(uri: str, attempts: int = 5) -> list[dict[str, Any]] | None:
    """The rows of the data files of the newest version of the small table at ``uri`` (the
    division log, the manifest), read without Spark; None when there is no table there. A file
    that is gone because the table moved on meanwhile (the writer replaced it, and its garbage
    collection deleted it) is read again from the new version; a file missing from the version
    that is still the newest is damage, a ``StorageError`` naming it."""
    for _ in range(attempts):
        log = delta_log(uri)
        if log is None:
            return None
        rows: list[dict[str, Any]] = []
        for path in log.file_uris():
            data = read_bytes(path.removeprefix("file://"))
            if data is None:
                break
            rows.extend(pq.read_table(pa.BufferReader(data), **CHECKSUMS_READ).to_pylist())
        else:
            return rows
        if table_version(uri) == log.version():
            raise StorageError(f"{uri}: its data file {path} is missing",
                               definitely_failed=True)
    raise StorageError(f"{uri}: moved on {attempts} times while it was read",
                       definitely_failed=False)


def table_version(uri: str) -> int:
    """The newest version of the Delta table at ``uri`` (0 when there is no table yet). Loads
    the table from its newest Delta checkpoint on."""
    table = delta_log(uri)
    return 0 if table is None else table.version()


def table_id(uri: str) -> str:
    """The id of the Delta table at ``uri`` (its metadata's; "" when there is no table yet)."""
    table = delta_log(uri)
    return "" if table is None else str(table.metadata().id)


def data_commit_times(uri: str, lower: int, upper: int) -> list[float]:
    """The commit times (seconds since the epoch) of the versions ``lower+1 .. upper`` of the
    table at ``uri`` that added data (a push; not a rewrite), in version order. Reads those
    commit files alone, so the cost follows ``upper - lower``; a commit no longer there (its
    log was cleaned up) is left out."""
    out: list[float] = []
    for version in range(lower + 1, upper + 1):
        text = read_text(f"{uri.rstrip('/')}/{LOG_DIR}/{version:020d}.json")
        if text is None:
            continue
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        if not any(a.get("add", {}).get("dataChange", False) for a in actions):
            continue
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        out.append(info.get("timestamp", 0) / 1000.0)
    return out
