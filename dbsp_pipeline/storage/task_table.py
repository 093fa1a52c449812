"""One owner's view of the state, for a Spark task that runs a stateful operator's step for the
keys one worker owns (``runtime/owner_exec.py``).

A task rebuilds its operator against a ``TaskStateDb`` instead of the driver's
``StateDatabase``. Operators reach state only through ``Trace(db, name, schema, key)``, which
uses ``db.table``, ``db.spark`` and ``db.root``; so ``TaskStateDb`` offers those three, and its
tables (``TaskTable``) offer what a trace uses of a ``StagedTable`` on the driver path
(``append_arrow``, ``lookup_arrow``, ``read_arrow``): the table's files, reading and writing
data files, and staging.

* **Files**: the owner's files, which the driver chose from the trace's files by their
  ``_shard`` range (``owner_files``), plus what the task staged. A file whose rows belong to
  several owners (it *straddles* them) is allowed: reads of it keep only the owner's rows (a
  ``_shard`` filter, or under ``modulo`` sharding the owners of the rows' key hashes), so the
  task's trace has exactly the owner's part of the value.
* **Writes**: through ``DataFiles`` (a fresh ``data/<run>-<uuid4>.parquet`` per file: the
  files every owner's task writes to a table in one stage are one sorted run, as one driver
  append is, ``data_files.sorted_run_of``), which reaches the table's files from its URI
  without the Delta log. Only appends happen in tasks: removes are the driver's (merges,
  swaps, layout changes).
* **No durable action.** ``stage`` keeps the actions in memory; ``record`` gives them as a
  manifest entry records them (``staged_table.add_record``), for the driver to stage on its
  ``StagedTable`` once it has collected exactly one record per owner. A task whose record is
  not collected (failed, retried, speculative) leaves orphan files that garbage collection
  deletes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql.types import StructType

from dbsp_pipeline.driver import hashing
from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage.data_files import DataFiles
from dbsp_pipeline.storage.staged_table import add_record
from dbsp_pipeline.storage.table_store import DataFile
from dbsp_pipeline.storage.trace import OwnerLayout
from dbsp_pipeline.zset import SHARD, SHARD_COUNT, spark_to_arrow_schema


def owner_files(files: Iterable[DataFile], layout: OwnerLayout) -> dict[int, tuple[DataFile, ...]]:
    """Per worker, the files that may hold rows of its keys: by the files' ``_shard`` range
    under ``fixed``/``dynamic`` sharding; a file without shard statistics, and every file under
    ``modulo`` sharding, goes to every worker."""
    out: dict[int, list[DataFile]] = {w: [] for w in range(layout.workers)}
    for f in files:
        if layout.keyed or f.shard_min is None or f.shard_max is None:
            owners: Iterable[int] = range(layout.workers)
        else:
            owners = layout.owners_of_range(f.shard_min, f.shard_max)
        for w in owners:
            out[w].append(f)
    return {w: tuple(fs) for w, fs in out.items()}


@dataclass(frozen=True)
class TaskTableSpec:
    """What a task needs to know of one trace's table: its ``name`` (as the operator asks
    ``db.table`` for it), ``uri``, Arrow schema (payload, ``_weight``, ``_shard``), the trace's
    ``key``, per worker the files it may read (``owner_files``), and the sorted run the
    stage's files of this table belong to (``data_files.new_sorted_run``)."""

    name: str
    uri: str
    arrow_schema: pa.Schema
    key: tuple[str, ...]
    files_by_owner: Mapping[int, tuple[DataFile, ...]]
    sorted_run: str | None = None


class TaskTable:
    """The table of one trace as owner ``owner`` sees it in a task. See the module docstring."""

    def __init__(self, spec: TaskTableSpec, owner: int, layout: OwnerLayout) -> None:
        self.spec = spec
        self.owner = owner
        self.layout = layout
        self.uri = spec.uri
        self.arrow_schema = spec.arrow_schema
        self._data: DataFiles | None = None
        self._files = list(spec.files_by_owner.get(owner, ()))
        self._adds: dict[str, AddAction] = {}
        self._removes: dict[str, None] = {}
        #: the ``_shard`` values this owner owns (``fixed``/``dynamic``)
        self._shards: list[int] | None = None if layout.keyed else [
            int(s) for s in np.flatnonzero(
                layout.owners(np.arange(SHARD_COUNT, dtype=np.int64)) == owner)]

    @property
    def data(self) -> DataFiles:
        if self._data is None:
            self._data = DataFiles.for_uri(self.uri, self.arrow_schema)
        return self._data

    def data_file(self, add: AddAction) -> DataFile:
        return DataFile.from_stats(self.data.path(add.path), add.stats)

    def files(self) -> list[DataFile]:
        """The owner's files, less the staged removes, plus the staged adds."""
        return [f for f in self._files if f.path not in self._removes] + [
            self.data_file(a) for a in self._adds.values()]

    def write_arrow(self, table: pa.Table, run: str | None = None) -> list[AddAction]:
        return self.data.write_arrow(table, run or self.spec.sorted_run)

    def stage_new_file(self, rows: pa.Table) -> list[DataFile]:
        """Write ``rows`` as one new file of the task's sorted run and stage its add
        (``StagedTable.stage_new_file``; a task writes at once)."""
        adds = self.write_arrow(rows)
        self.stage(adds)
        return [self.data_file(a) for a in adds]

    def read_arrow(self, files: Sequence[DataFile] | Sequence[str],
                   where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """The owner's rows of the given files that satisfy ``where`` (only ``columns``, if
        given): rows of other owners in a straddling file are left out."""
        chosen = [f if isinstance(f, DataFile) else DataFile(f, 0) for f in files]
        paths = [f.path for f in chosen]
        if not any(self._straddles(f) for f in chosen):
            return self.data.read_arrow(paths, where, columns)
        if self._shards is not None:
            mine = pc.field(SHARD).isin(self._shards)
            return self.data.read_arrow(paths, mine if where is None else where & mine, columns)
        wanted = list(columns) if columns is not None else list(self.arrow_schema.names)
        needed = list(dict.fromkeys([*wanted, SHARD, *self.spec.key]))
        rows = self.data.read_arrow(paths, where, needed)
        hashes = hashing.xxhash64_arrow(rows, self.spec.key).astype(np.uint64)
        owners = self.layout.owners(rows.column(SHARD).to_numpy(zero_copy_only=False), hashes)
        return rows.filter(pa.array(owners == self.owner)).select(wanted)

    def _straddles(self, f: DataFile) -> bool:
        """Whether ``f`` may hold rows of other owners."""
        if self.layout.workers == 1 or f.path in self._adds:
            return False
        if self.layout.keyed or f.shard_min is None or f.shard_max is None:
            return True
        return self.layout.owners_of_range(f.shard_min, f.shard_max) != {self.owner}

    # -- staging -----------------------------------------------------------------------------
    def stage(self, adds: Sequence[AddAction] = (), removes: Sequence[str] = ()) -> None:
        """Keep the actions for ``record`` (as ``StagedTable.stage``; nothing is durable)."""
        for path in removes:
            if path in self._adds:
                del self._adds[path]
            else:
                self._removes[path] = None
        for add in adds:
            self._adds[self.data.path(add.path)] = add

    def record(self) -> dict[str, Any]:
        """The staged actions as a manifest entry records them (paths relative to the table);
        the driver stages them with ``StagedTable.load``-compatible ``add_from_record``."""
        prefix = self.uri.rstrip("/") + "/"
        return {"adds": [add_record(a) for a in self._adds.values()],
                "removes": [p[len(prefix):] if p.startswith(prefix) else p
                            for p in self._removes]}


@dataclass
class TaskStateDb:
    """The state database of a task: the tables ``tables`` (by trace name) of the state at
    ``root``, as owner ``owner`` under ``layout`` sees them. No Spark session, no Delta log."""

    root: str
    tables: Mapping[str, TaskTableSpec]
    owner: int
    layout: OwnerLayout
    spark: None = None
    opened: dict[str, TaskTable] = field(default_factory=dict)

    def table(self, name: str, schema: StructType) -> TaskTable:
        """The table of trace ``name``; its schema must be the one the driver sent (the task
        runs the operator the driver compiled)."""
        spec = self.tables.get(name)
        if spec is None:
            raise StorageError(f"task of owner {self.owner}: the operator asks for state table "
                               f"'{name}', which the driver did not send (it sent "
                               f"{sorted(self.tables)})", definitely_failed=True)
        if not spark_to_arrow_schema(schema).equals(spec.arrow_schema):
            raise StorageError(f"task of owner {self.owner}: state table '{name}' has schema "
                               f"{spec.arrow_schema} on the driver but {schema.simpleString()} "
                               "here", definitely_failed=True)
        if name not in self.opened:
            self.opened[name] = TaskTable(spec, self.owner, self.layout)
        return self.opened[name]
