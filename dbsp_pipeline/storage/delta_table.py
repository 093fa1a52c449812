"""A Delta Lake table written by Spark and committed by delta-rs.

Spark cannot load the Delta Spark jars here (they come from Maven at run time), so the engine
splits the work: Spark writes plain Parquet files into a fresh folder inside the table
(``data/<uuid>/``), and the driver commits them with delta-rs as add actions (with ``numRecords``
and per-column min/max stats, so any Delta reader can skip files). Reads go the other way: the
driver asks delta-rs for the files of a version and hands them to ``spark.read.parquet``.

Durability: a version exists once ``commit`` returns; files written but not committed are
invisible to every Delta reader (and are removed by garbage collection). Commits are atomic
(delta-rs writes ``_delta_log/N.json`` with put-if-absent), so two writers racing for the same
version cannot both win.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from dbsp_pipeline.errors import ConcurrentWriterError, StorageError
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.zset import quote

DATA_DIR = "data"
#: commit metadata of every commit the engine makes: how many actions (adds, removes and the
#: app transaction) follow the commit information in the commit file
ACTIONS_KEY = "dbsp.actions"
_STATS_STRING_LIMIT = 32


@dataclass(frozen=True)
class DataFile:
    """One committed Parquet file: its absolute path, row count, and (for traces) its shard
    range or (for output logs) its step range, from the file's statistics."""

    path: str
    rows: int
    shard_min: int | None = None
    shard_max: int | None = None
    step_min: int | None = None
    step_max: int | None = None

    @classmethod
    def from_stats(cls, path: str, stats: str) -> DataFile:
        s = json.loads(stats)
        lo, hi = s.get("minValues", {}), s.get("maxValues", {})
        return cls(path, int(s.get("numRecords", 0)), lo.get("_shard"), hi.get("_shard"),
                   lo.get("_step"), hi.get("_step"))


class SparkDeltaTable:
    """A Delta table at ``uri`` with a fixed Spark schema. See the module docstring."""

    def __init__(self, spark: SparkSession, uri: str, schema: StructType,
                 configuration: dict[str, str] | None = None, *, role: str = "table",
                 single_writer: bool = False) -> None:
        self.spark = spark
        #: the table's part in the step protocol, which names its crash points
        self.role = role
        #: only this handle may write: every commit is a compare-and-append at the version
        #: after the one this handle last saw, and losing that race is ``ConcurrentWriterError``
        self.single_writer = single_writer
        self.uri = os.path.abspath(uri)
        self.schema = schema
        self.arrow_schema = spark_to_arrow_schema(schema)
        if DeltaTable.is_deltatable(self.uri):
            self._table = DeltaTable(self.uri)
        else:
            os.makedirs(self.uri, exist_ok=True)
            try:
                self._table = DeltaTable.create(
                    self.uri, self.arrow_schema, mode="ignore",
                    configuration={"delta.checkpointInterval": "50", **(configuration or {})})
            except DeltaError as e:  # pragma: no cover - storage failure
                raise StorageError(f"cannot create Delta table {self.uri}: {e}",
                                   definitely_failed=False) from e

    # -- versions --------------------------------------------------------------------------
    def version(self) -> int:
        """The newest committed version (0 for a freshly created table). A single-writer table
        does not look for other writers' commits: its newest version is its own last one."""
        if not self.single_writer:
            self._table.update_incremental()
        return self._table.version()

    def loaded_version(self) -> int:
        """The version this handle last loaded or committed, without looking for newer commits
        (exact for tables only this handle writes, such as a pipeline's state tables)."""
        return self._table.version()

    def data_file(self, add: AddAction) -> DataFile:
        """The ``DataFile`` an add action (from ``write_files``/``write_arrow``) commits."""
        return DataFile.from_stats(os.path.join(self.uri, add.path), add.stats)

    def files(self, version: int | None = None) -> list[DataFile]:
        """The data files of ``version`` (default: the newest)."""
        table = self._table if version is None else DeltaTable(self.uri, version=version)
        if version is None and not self.single_writer:
            table.update_incremental()
        actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
        paths = actions.get("path", [])
        none = [None] * len(paths)
        rows = actions.get("num_records", none)
        lo, hi = actions.get("min._shard", none), actions.get("max._shard", none)
        slo, shi = actions.get("min._step", none), actions.get("max._step", none)
        return [DataFile(os.path.join(self.uri, p), int(n or 0), a, b, c, d)
                for p, n, a, b, c, d in zip(paths, rows, lo, hi, slo, shi)]

    def added_files(self, lower: int, upper: int, data_only: bool = False) -> list[DataFile]:
        """The files added by versions ``lower+1 .. upper``, in commit order; with
        ``data_only``, only files of data changes (not rewrites: ``commit(data_change=False)``).

        Reads the commits themselves (``_delta_log/<version>.json``), so the cost follows the
        number of commits in the range, not the table's history; falls back to comparing the two
        snapshots when a commit file was already cleaned up.
        """
        if upper <= lower:
            return []
        out = []
        for v in range(lower + 1, upper + 1):
            commit = os.path.join(self.uri, "_delta_log", f"{v:020d}.json")
            try:
                with open(commit) as fh:
                    lines = fh.read().splitlines()
            except FileNotFoundError:
                if data_only:
                    raise StorageError(f"commit {v} of {self.uri} was cleaned up: the data "
                                       "changes it made cannot be told apart from rewrites",
                                       definitely_failed=True)
                before = {f.path for f in self.files(lower)}
                return [f for f in self.files(upper) if f.path not in before]
            for line in lines:
                add = json.loads(line).get("add") if line.strip() else None
                if add is not None and (add.get("dataChange", True) or not data_only):
                    out.append(DataFile.from_stats(os.path.join(self.uri, add["path"]),
                                                   add.get("stats") or "{}"))
        return out

    def commit_infos(self, lower: int, upper: int) -> list[dict]:
        """The commit information (with custom metadata) of versions ``lower+1 .. upper`` that
        are still on disk."""
        out = []
        for v in range(lower + 1, upper + 1):
            try:
                with open(os.path.join(self.uri, "_delta_log", f"{v:020d}.json")) as fh:
                    lines = fh.read().splitlines()
            except FileNotFoundError:
                continue
            out.extend(info for info in (json.loads(line).get("commitInfo") for line in lines
                                         if line.strip()) if info is not None)
        return out

    def commit_metadata(self, key: str, value: object) -> dict | None:
        """The commit information of the newest commit whose custom metadata has ``key`` equal
        to ``value`` (None if no retained commit has), searching from the newest commit back."""
        for v in range(self.version(), 0, -1):
            try:
                with open(os.path.join(self.uri, "_delta_log", f"{v:020d}.json")) as fh:
                    lines = fh.read().splitlines()
            except FileNotFoundError:
                return None
            for line in lines:
                info = json.loads(line).get("commitInfo") if line.strip() else None
                if info is not None and info.get(key) == value:
                    return info
        return None

    def transaction_version(self, app_id: str) -> int | None:
        """The newest app-transaction version committed under ``app_id`` (None if none)."""
        self._table.update_incremental()
        return self._table.transaction_version(app_id)

    # -- writing ---------------------------------------------------------------------------
    def write_files(self, df: DataFrame, *, sort_by: Sequence[str] = ()) -> list[AddAction]:
        """Write ``df`` (columns in table order) as new, uncommitted Parquet files.

        Returns the add actions to ``commit``. Empty files are not returned.
        """
        folder_rel = f"{DATA_DIR}/{uuid.uuid4().hex}"
        folder = os.path.join(self.uri, folder_rel)
        ordered = df.select(*[quote(f.name) for f in self.schema.fields])
        if sort_by:
            ordered = ordered.sortWithinPartitions(*[quote(c) for c in sort_by])
        try:
            ordered.write.parquet(folder)  # the default mode: fail if the folder exists
        except Exception as e:
            raise StorageError(f"writing data files to {folder} failed: {e}",
                               definitely_failed=True) from e
        return self._adds_for_folder(folder, folder_rel)

    def write_arrow(self, table: pa.Table) -> list[AddAction]:
        """Write a small Arrow table (already in table schema) as one new, uncommitted file."""
        if table.num_rows == 0:
            return []
        folder_rel = f"{DATA_DIR}/{uuid.uuid4().hex}"
        folder = os.path.join(self.uri, folder_rel)
        os.makedirs(folder, exist_ok=True)
        pq.write_table(table.cast(self.arrow_schema), os.path.join(folder, "part-00000.parquet"))
        return self._adds_for_folder(folder, folder_rel)

    def commit(self, adds: Sequence[AddAction] = (), removes: Sequence[str] = (), *,
               app_id: str | None = None, app_version: int | None = None,
               metadata: dict | None = None, data_change: bool = True) -> int:
        """Commit add actions (and removal of the files at the absolute paths ``removes``).

        With ``app_id``/``app_version`` the commit records an app transaction (idempotent writes:
        a reader can ask ``transaction_version(app_id)``). Returns the new version.
        """
        from deltalake._internal import RemoveAction  # re-exported privately in deltalake 1.x

        now = int(time.time() * 1000)
        actions: list = list(adds) if data_change else [
            dataclasses.replace(a, data_change=False) for a in adds]
        for p in removes:
            rel = os.path.relpath(p, self.uri)
            actions.append(RemoveAction(rel, data_change, now))
        # How many actions besides the commit information this commit holds: a reader of the
        # log (``storage/verify.py``) tells a commit file cut at a line end by it.
        metadata = {**(metadata or {}), ACTIONS_KEY: len(actions) + (1 if app_id else 0)}
        props = CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(app_id, app_version, now)] if app_id else None,
            max_commit_retries=0 if self.single_writer else None)
        point = f"{self.role}.{'commit' if data_change else 'rewrite'}"
        expected = self._table.version() + 1
        crash_points.hit(point + ".before")
        try:
            self._table.create_write_transaction(
                actions, mode="append", schema=self.arrow_schema, commit_properties=props)
        except CommitFailedError as e:
            if self.single_writer:
                raise ConcurrentWriterError(
                    f"another writer committed version {expected} of {self.uri} first") from e
            if app_id is not None:  # the same app transaction twice at once: two writers
                raise ConcurrentWriterError(
                    f"another writer committed as '{app_id}' to {self.uri} at the same "
                    "time") from e
            raise StorageError(f"commit to {self.uri} failed: {e}", definitely_failed=True) from e
        except DeltaError as e:
            raise StorageError(f"commit to {self.uri} failed: {e}", definitely_failed=False) from e
        crash_points.hit(point + ".after")
        self._table.update_incremental()
        if self.single_writer and self._table.version() != expected:
            raise ConcurrentWriterError(f"another writer committed to {self.uri} after version "
                                        f"{expected}")
        return self._table.version()

    def restore(self, version: int) -> None:
        """Roll the table back to ``version`` (a new commit whose files are those of ``version``)."""
        crash_points.hit(f"{self.role}.restore.before")
        try:
            self._table.restore(version)
        except CommitFailedError as e:
            if self.single_writer:
                raise ConcurrentWriterError(
                    f"another writer committed to {self.uri} during its rollback") from e
            raise StorageError(f"rollback of {self.uri} failed: {e}",
                               definitely_failed=True) from e
        except DeltaError as e:
            raise StorageError(f"rollback of {self.uri} failed: {e}",
                               definitely_failed=False) from e
        crash_points.hit(f"{self.role}.restore.after")
        self._table.update_incremental()

    # -- reading ---------------------------------------------------------------------------
    def read(self, files: Sequence[DataFile] | Sequence[str]) -> DataFrame:
        """A DataFrame over the given data files (an empty one for no files)."""
        paths = [f.path if isinstance(f, DataFile) else f for f in files]
        if not paths:
            return self.spark.createDataFrame([], self.schema)
        return self.spark.read.schema(self.schema).parquet(*paths)

    def read_arrow(self, files: Sequence[DataFile] | Sequence[str],
                   where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of the given data files, read on the driver, that satisfy ``where`` (only
        ``columns``, if given). Row groups whose statistics exclude ``where`` are skipped."""
        paths = [f.path if isinstance(f, DataFile) else f for f in files]
        if not paths:
            empty = self.arrow_schema.empty_table()
            return empty.select(list(columns)) if columns is not None else empty
        dataset = ds.dataset(paths, schema=self.arrow_schema, format="parquet")
        return dataset.to_table(filter=where, columns=list(columns) if columns else None)

    def read_version(self, version: int | None = None) -> DataFrame:
        return self.read(self.files(version))

    # -- internals -------------------------------------------------------------------------
    def _adds_for_folder(self, folder: str, folder_rel: str) -> list[AddAction]:
        adds = []
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".parquet"):
                continue
            path = os.path.join(folder, name)
            meta = pq.read_metadata(path)
            if meta.num_rows == 0:
                os.remove(path)
                continue
            adds.append(AddAction(
                path=f"{folder_rel}/{name}", size=os.path.getsize(path), partition_values={},
                modification_time=int(os.path.getmtime(path) * 1000), data_change=True,
                stats=json.dumps(_file_stats(meta))))
        return adds


def spark_to_arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Delta records for a Spark schema (timestamps in UTC microseconds)."""
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def _file_stats(meta: pq.FileMetaData) -> dict:
    """Delta per-file statistics (numRecords, minValues, maxValues, nullCount) from a footer."""
    mins: dict = {}
    maxs: dict = {}
    nulls: dict = {}
    schema = meta.schema.to_arrow_schema()
    for ci, field in enumerate(schema):
        lo = hi = None
        null_count = 0
        ok = True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(ci).statistics
            if st is None:
                ok = False
                break
            null_count += st.null_count or 0
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if not ok:
            continue
        nulls[field.name] = null_count
        lo, hi = _json_stat(lo), _json_stat(hi)
        if lo is not None and hi is not None:
            mins[field.name] = lo
            maxs[field.name] = hi
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _json_stat(v: object) -> object:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, str):
        return v if len(v) <= _STATS_STRING_LIMIT else None
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, _dt.date):
        return v.isoformat()
    return None



# -- reading a table's log without a handle (no Spark): for readers of a root that is not open --

def table_version(uri: str) -> int:
    """The newest version of the Delta table at ``uri`` (0 when there is no table yet). Loads
    the table from its newest Delta checkpoint on."""
    return DeltaTable(uri).version() if DeltaTable.is_deltatable(uri) else 0


def table_id(uri: str) -> str:
    """The id of the Delta table at ``uri`` (its metadata's; "" when there is no table yet)."""
    return DeltaTable(uri).metadata().id if DeltaTable.is_deltatable(uri) else ""


def data_commit_times(uri: str, lower: int, upper: int) -> list[float]:
    """The commit times (seconds since the epoch) of the versions ``lower+1 .. upper`` of the
    table at ``uri`` that added data (a push; not a rewrite), in version order. Reads those
    commit files alone, so the cost follows ``upper - lower``; a commit no longer on disk (its
    log was cleaned up) is left out."""
    out: list[float] = []
    for version in range(lower + 1, upper + 1):
        try:
            with open(os.path.join(uri, "_delta_log", f"{version:020d}.json")) as fh:
                actions = [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            continue
        if not any(a.get("add", {}).get("dataChange", False) for a in actions):
            continue
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        out.append(info.get("timestamp", 0) / 1000.0)
    return out


_VERSIONED_LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint(\.\d+\.\d+)?\.parquet)$")
_CHECKPOINT_LOG_FILE = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")


def clean_log_below(uri: str, version: int) -> int:
    """Delete the commit files (and older Delta checkpoints) of the table at ``uri`` below its
    newest readable Delta checkpoint at or before ``version``; returns how many files went.

    Afterwards every version from that checkpoint on still loads (delta-rs starts from the
    checkpoint), and the log's listing is bounded by the checkpoint interval plus the commits
    after ``version``; versions below the checkpoint can no longer be loaded, so ``version`` must
    be the oldest version any reader still needs. Files are deleted oldest first: a crash leaves
    a log that starts later, which loads the same, and the next call deletes the rest."""
    log = os.path.join(uri, "_delta_log")
    names = sorted(os.listdir(log))
    checkpoints = sorted({int(m[1]) for n in names if (m := _CHECKPOINT_LOG_FILE.match(n))
                          and int(m[1]) <= version}, reverse=True)
    keep: int | None = None
    for candidate in checkpoints:
        parts = [n for n in names if n.startswith(f"{candidate:020d}.checkpoint")]
        try:
            for part in parts:
                pq.read_metadata(os.path.join(log, part))
        except Exception:  # noqa: BLE001 - an unreadable checkpoint is not one to start from
            continue
        keep = candidate
        break
    if keep is None:
        return 0
    deleted = 0
    for name in names:
        m = _VERSIONED_LOG_FILE.match(name)
        if m is not None and int(m[1]) < keep:
            os.remove(os.path.join(log, name))
            deleted += 1
    return deleted
