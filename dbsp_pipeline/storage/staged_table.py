"""A state table whose changes are staged: recorded by the next manifest entry, not committed to
the table's Delta log one by one.

A trace changes at every step (an append, a one-step memory's replacement, a merge's swap). A
Delta commit per change made each step cost one commit per trace that changed, on top of the
commits the step protocol needs. So a state table *stages* its changes: the data files are
written at once (they are immutable), and the add and remove actions are kept in memory
(``stage``). The state database's next checkpoint (``state_db.py``) records them in its manifest
entry, beside the table's Delta version, so the checkpoint's commit is their atomic commit point:
the state of a table at a checkpoint is its Delta version *plus the staged actions the entry
records*. Now and then (``state_db.FOLD_ACTIONS``) the staged actions are *folded*: committed to
the table's Delta log in one commit, and the next entry records the new version with nothing
staged.

Durability, by cases:

* a crash before the checkpoint loses the staged actions with the rest of the uncommitted
  state; their files are orphans that garbage collection deletes (as before, when the commits
  after a checkpoint were rolled back);
* a crash after a fold but before the entry that records it: the entry still says (old
  version, staged actions); opening rolls the table back to the old version (a Delta restore)
  and stages the recorded actions again, which is the same state;
* files a retained entry stages are referenced: garbage collection keeps them
  (``referenced_paths``), as it keeps the files of retained Delta versions.

A table of the state database writes its appended files behind the step's computation
(``stage_new_file``, ``storage/write_behind.py``): such a file is staged while it is still being
written, and the table waits for it before anything reads, records, folds, unstages or rolls it
back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage import garbage, write_behind
from dbsp_pipeline.storage.data_files import new_file_path
from dbsp_pipeline.storage.delta_table import DataFile, SparkDeltaTable
from dbsp_pipeline.storage.table_store import TableStore

#: the key of a manifest entry that maps each state table to its staged actions
STAGED_KEY = "staged"


class StagedTable:
    """The state table ``table`` (its Delta handle) with its staged actions. See the module
    docstring for the contract."""

    def __init__(self, table: SparkDeltaTable, *, writes_behind: bool = False) -> None:
        self.delta = table
        #: whether ``stage_new_file`` writes in the background (``storage/write_behind.py``)
        self.writes_behind = writes_behind
        #: staged adds by absolute path, in order; a file written behind is pending until
        #: ``wait_for_writes``
        self._adds: dict[str, AddAction | write_behind.PendingFile] = {}
        self._removes: dict[str, None] = {}  # staged removes of committed files, in order
        #: checkpoints that recorded staged actions of this table since it was last folded
        self.checkpoints_since_fold = 0

    # -- what the trace code uses of a table ---------------------------------------------
    @property
    def uri(self) -> str:
        return self.delta.uri

    @property
    def schema(self) -> StructType:
        return self.delta.schema

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.delta.arrow_schema

    @property
    def spark(self) -> SparkSession:
        return self.delta.spark

    @property
    def store(self) -> TableStore:
        return self.delta.store

    def data_file(self, add: AddAction) -> DataFile:
        return self.delta.data_file(add)

    def write_files(self, df: DataFrame, *, sort_by: Sequence[str] = ()) -> list[AddAction]:
        return self.delta.write_files(df, sort_by=sort_by)

    def write_arrow(self, table: pa.Table, run: str | None = None) -> list[AddAction]:
        return self.delta.write_arrow(table, run)

    def read(self, files: Sequence[DataFile] | Sequence[str]) -> DataFrame:
        self._wait_for_files(files)
        return self.delta.read(files)

    def read_arrow(self, files: Sequence[DataFile] | Sequence[str],
                   where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        self._wait_for_files(files)
        return self.delta.read_arrow(files, where, columns)

    def files(self) -> list[DataFile]:
        """The table's files now: those of its Delta version (as this handle last loaded or
        committed it), less the staged removes, plus the staged adds (written or pending)."""
        committed = [f for f in self.delta.files() if f.path not in self._removes]
        return committed + [a.data_file if isinstance(a, write_behind.PendingFile)
                            else self.delta.data_file(a) for a in self._adds.values()]

    # -- files written behind the step (``storage/write_behind.py``) -------------------------
    def stage_new_file(self, rows: pa.Table) -> list[DataFile]:
        """Write ``rows`` (in table schema) as one new file and stage its add; returns its
        ``DataFile`` (none for no rows). A table that ``writes_behind`` returns at once and
        writes in the background: the file is pending until ``wait_for_writes``, and a failed
        write raises from there."""
        if rows.num_rows == 0:
            return []
        if not self.writes_behind:
            adds = self.delta.write_arrow(rows)
            self.stage(adds)
            return [self.delta.data_file(a) for a in adds]
        relative = new_file_path()
        data_file = DataFile.from_rows(self.delta.store.path(relative), rows)
        delta = self.delta
        pending = write_behind.submit(
            data_file, lambda: delta.write_arrow(rows, relative=relative))
        self._adds[data_file.path] = pending
        return [data_file]

    def wait_for_writes(self) -> None:
        """Wait for every file this table writes behind, each then staged as written; raises
        the first failed write's ``StorageError`` (after waiting for them all)."""
        failure: BaseException | None = None
        for path, add in list(self._adds.items()):
            if isinstance(add, write_behind.PendingFile):
                try:
                    self._adds[path] = add.add_action()
                except BaseException as e:  # noqa: BLE001 (raised below, once all ended)
                    failure = failure or e
        if failure is not None:
            raise failure

    def _written_adds(self) -> list[AddAction]:
        """The staged adds, in order, once every file written behind is written (raises the
        first failed write's error)."""
        self.wait_for_writes()
        written = [a for a in self._adds.values() if isinstance(a, AddAction)]
        if len(written) != len(self._adds):
            raise AssertionError(f"{self.uri}: a file written behind is still pending")
        return written

    def _wait_for_files(self, files: Sequence[DataFile] | Sequence[str]) -> None:
        """Wait for the files of ``files`` still being written (no staging changes: a reader
        may be another thread, a keyed run built in the background)."""
        for f in files:
            add = self._adds.get(f.path if isinstance(f, DataFile) else f)
            if isinstance(add, write_behind.PendingFile):
                add.add_action()

    def _discard_pending(self) -> None:
        """Wait for the files written behind to end, and forget them (a rollback: their files,
        if written, are orphans for garbage collection)."""
        for add in self._adds.values():
            if isinstance(add, write_behind.PendingFile):
                add.wait()

    # -- staging ---------------------------------------------------------------------------
    def stage(self, adds: Sequence[AddAction] = (), removes: Sequence[str] = ()) -> None:
        """Stage the adds ``adds`` (written, uncommitted files) and the removal of the files at
        the absolute paths ``removes``. A removed file that was only staged is unstaged (never
        committed, it is garbage once no retained checkpoint stages it: garbage collection is
        told, ``garbage.note_never_committed``). Nothing is durable until a checkpoint records
        the staged actions."""
        if removes:
            self.wait_for_writes()
        for path in removes:
            if path in self._adds:
                del self._adds[path]
                garbage.note_never_committed(self.delta, [path])
            else:
                self._removes[path] = None
        for add in adds:
            self._adds[self.delta.store.path(add.path)] = add

    @property
    def staged_actions(self) -> int:
        """How many actions are staged (adds and removes)."""
        return len(self._adds) + len(self._removes)

    def staged_paths(self) -> set[str]:
        """The absolute paths of the staged adds (files no Delta version refers to yet)."""
        return set(self._adds)

    def record(self) -> dict[str, Any]:
        """The staged actions as a manifest entry records them (paths relative to the table);
        empty when nothing is staged. Waits for the files written behind."""
        if not self._adds and not self._removes:
            return {}
        return {"adds": [add_record(a) for a in self._written_adds()],
                "removes": [self._relative(p) for p in self._removes]}

    def load(self, record: Mapping[str, Any] | None) -> None:
        """Stage exactly the actions ``record`` (from a manifest entry) holds, after the Delta
        table was rolled back to the version that entry records."""
        self._discard_pending()
        self._adds, self._removes = {}, {}
        if not record:
            return
        try:
            adds = [add_from_record(a) for a in record.get("adds", [])]
            removes = [self.delta.store.path(str(p)) for p in record.get("removes", [])]
        except (KeyError, TypeError, ValueError) as e:
            raise StorageError(f"the staged actions recorded for {self.uri} cannot be read "
                               f"({type(e).__name__}: {e}): {json.dumps(record)[:200]}",
                               definitely_failed=True) from e
        self.stage(adds, removes)

    def fold(self) -> int:
        """Commit the staged actions to the Delta table in one commit (durable when this
        returns) and stage nothing; returns the table's version. Not a checkpoint: the next
        manifest entry records the new version (until then a crash rolls the fold back)."""
        adds = self._written_adds()
        if adds or self._removes:
            self.delta.commit(adds, list(self._removes))
            self._adds, self._removes = {}, {}
        self.checkpoints_since_fold = 0
        return self.delta.loaded_version()

    def _relative(self, path: str) -> str:
        prefix = self.uri.rstrip("/") + "/"
        return path[len(prefix):] if path.startswith(prefix) else path


def add_record(add: AddAction) -> dict[str, Any]:
    """An add action as a manifest entry or a step record stores it (JSON)."""
    return {"path": add.path, "size": add.size, "modification_time": add.modification_time,
            "stats": add.stats}


def add_from_record(record: Mapping[str, Any]) -> AddAction:
    """The add action ``add_record`` stored (``KeyError``/``TypeError``/``ValueError`` when the
    record is not one)."""
    return AddAction(path=str(record["path"]), size=int(record["size"]), partition_values={},
                     modification_time=int(record["modification_time"]), data_change=True,
                     stats=str(record["stats"]))
