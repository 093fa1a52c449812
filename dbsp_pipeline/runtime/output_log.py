"""The output log of one view: its change of every step, in the Delta table ``outputs/<name>``.

Rows are the view's payload, ``_step`` and ``_weight``. ``write(step, change)`` follows the write
rules (``docs/recovery.md``, section 6), with ``last`` the next step the log expects:

* ``step < last``: the step was written before (recovery replayed it): discard it, after
  verifying it against the write's record (row count and content digest, kept in the commit's
  metadata): a difference is a ``NonDeterminismError``.
* ``step == last``: append, in one Delta commit whose app transaction (``dbsp-output``, step)
  records the step, so a re-write after a crash is recognised; ``last`` becomes ``step + 1``.
* ``step > last``: an error (a step would be missing).

Every step is written, even with no change, so ``last`` always follows the executed steps.

A step's write is not a commit of this log: its files are written (``prepare``), and the step's
one durable commit, its record (``runtime/division_log.py``, in the division log or carried by
the checkpoint's manifest entry), holds their add actions, row count and digest. The log then
holds the write *pending* (``stage``) and serves it to every reader of this object (``changes``,
``view``, ``step_arrow``, ``view_arrow`` read the Delta version plus the pending writes), and
*folds* the pending writes into its Delta table now and then (``fold``: one commit for all of
them, whose app transaction records the newest step). A reader of the Delta table itself (Spark,
DuckDB) sees the steps folded so far: at most ``FOLD_STEPS`` behind. After a crash the records
say which steps are written (``load_pending``), and a fold repeated after a crash is recognised
by its app transaction.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, FloatType, LongType, StructField, StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.driver import hashing
from dbsp_pipeline.driver.sql import LocalSQL, zset_arrow_schema
from dbsp_pipeline.errors import (
    ComputationError,
    ConcurrentWriterError,
    NonDeterminismError,
    UsageError,
)
from dbsp_pipeline.storage.data_files import PORTABLE_COMPRESSION, DataFiles, new_file_path
from dbsp_pipeline.storage.delta_table import DataFile, SparkDeltaTable
from dbsp_pipeline.storage.small_files import read_text, write_atomically
from dbsp_pipeline.storage.staged_table import add_from_record, add_record
from dbsp_pipeline.zset import STEP, WEIGHT, consolidate, quote

APP_ID = "dbsp-output"
#: commit metadata of a step's write: the step, its row count and its content digest (of every
#: column; ``LEGACY_DIGEST_KEY``: the digest, without floating-point columns, that steps written
#: before aggregates were exact recorded)
STEP_KEY, ROWS_KEY, DIGEST_KEY = "dbsp.step", "dbsp.rows", "dbsp.digest.all"
#: commit metadata of a fold of several steps: the first of them (``STEP_KEY``: the newest)
FIRST_STEP_KEY = "dbsp.first_step"
LEGACY_DIGEST_KEY = "dbsp.digest"
#: the table property of a log whose view an upgrade removed: the step from which the view is
#: no longer computed (the log stays readable; ``runtime/circuit_upgrade.py``)
RETIRED_PROPERTY = "dbsp.retiredAtStep"


def content_digest(rows: pa.Table | None, schema: StructType, *, floats: bool = True) -> str:
    """An order-independent digest of a consolidated change: the sum (mod 2**64) of Spark's
    ``xxhash64`` of every row's payload columns and weight (floating-point values by their bits,
    -0.0 as 0.0 and every NaN as one). Every step is a function of its input and state bit for
    bit (aggregates sum floats exactly, ``dbsp_pipeline.exact_sum``), so a replay whose floats
    differ in the last bit is non-determinism too. ``floats=False`` is the digest of steps
    written before that, which left floating-point columns out."""
    if rows is None or rows.num_rows == 0:
        return "0" * 16
    columns = [f.name for f in schema.fields
               if (floats or not isinstance(f.dataType, (DoubleType, FloatType)))
               and hashing.supports(f.dataType)] + [WEIGHT]
    hashes = hashing.xxhash64_arrow(rows, columns)
    total = int(hashes.astype(np.uint64).sum(dtype=np.uint64))  # wraps mod 2**64
    return f"{total:016x}"


#: the pending writes are folded into the Delta table once this many steps are pending
FOLD_STEPS = 16
_FOLD_ATTEMPTS = 20


@dataclass(frozen=True)
class PreparedWrite:
    """A step's change of one view, written as data files that no commit refers to yet (a
    crash before the step's record is committed leaves them to garbage collection)."""

    step: int
    adds: list[AddAction]
    rows: int
    digest: str

    def record(self) -> dict[str, Any]:
        """The write as the step's record holds it (JSON)."""
        return {"adds": [add_record(a) for a in self.adds], "rows": self.rows,
                "digest": self.digest}

    @staticmethod
    def from_record(step: int, record: dict[str, Any]) -> PreparedWrite:
        """The write ``record`` (from ``record``) describes."""
        return PreparedWrite(step, [add_from_record(a) for a in record.get("adds", [])],
                             int(record["rows"]), str(record["digest"]))


@dataclass(frozen=True)
class ViewFiles:
    """Where Spark tasks may write their parts of one step's change of a view themselves
    (``OutputLog.files_for_tasks``; the owner stages of ``runtime/owner_exec.py``): the log's
    table (``uri``, its ``arrow_schema``: payload, ``_step``, ``_weight``) and the view's
    payload ``schema`` (its digest's columns). Holds no handle or credentials (pickled into
    tasks)."""

    uri: str
    arrow_schema: pa.Schema
    schema: StructType


def write_part(target: ViewFiles, step: int, rows: pa.Table | None, run: str) -> dict[str, Any]:
    """In a task: write ``rows`` (payload + ``_weight``), one task's part of step ``step``'s
    change of a view, as a data file of the view's log named for ``run`` (nothing committed);
    returns the part's record: ``adds``, ``rows`` and ``digest``. The parts must be
    consolidated and hold no row in common (an aggregate's tasks' outputs: their groups
    differ), so that their union is the step's consolidated change (``joined_parts``)."""
    if rows is None or rows.num_rows == 0:
        return {"adds": [], "rows": 0, "digest": content_digest(None, target.schema)}
    stored = _stamped(rows, step, target.arrow_schema)
    files = DataFiles.for_uri(target.uri, target.arrow_schema)
    adds = files.write_arrow(stored, relative=new_file_path(run),
                             compression=PORTABLE_COMPRESSION)
    return {"adds": [add_record(a) for a in adds], "rows": int(rows.num_rows),
            "digest": content_digest(stored, target.schema)}


def _stamped(rows: pa.Table, step: int, schema: pa.Schema) -> pa.Table:
    """``rows`` (payload + ``_weight``) stamped ``_step`` = ``step``, in the log table's row
    ``schema`` (its column order and types)."""
    rows = rows.append_column(STEP, pa.array(np.full(rows.num_rows, step, np.int64)))
    return rows.select(schema.names).cast(schema)


def joined_parts(step: int, parts: Sequence[dict[str, Any]]) -> PreparedWrite:
    """The step's write of a view whose change is the union of ``parts`` (``write_part``'s
    records, in owner order): their files, their rows, and the sum of their digests (a digest
    is a sum over rows, mod 2**64: ``content_digest``)."""
    digest = sum(int(str(p["digest"]), 16) for p in parts) % (1 << 64)
    return PreparedWrite(step, [add_from_record(a) for p in parts for a in p["adds"]],
                         sum(int(p["rows"]) for p in parts), f"{digest:016x}")


class OutputLog:
    def __init__(self, spark: SparkSession, root: str, name: str, schema: StructType) -> None:
        self.name = name
        self.schema = schema
        full = StructType([*schema.fields, StructField(STEP, LongType(), False),
                           StructField(WEIGHT, LongType(), False)])
        self.table = SparkDeltaTable(spark, root_layout.output_log(root, name), full,
                                     role="output", compression=PORTABLE_COMPRESSION)
        self.spark = spark
        #: writes whose step record is durable but which are not folded yet, by step
        self._pending: dict[int, PreparedWrite] = {}
        #: ``folded_last`` as of this object's last look at the table or its own last fold;
        #: None: read it from the table next time
        self._folded: int | None = None
        #: the step an upgrade added the view at (``start_at``); 0: it was always there
        self._first = 0

    def last(self) -> int:
        """The next step this log expects (every step before it is written)."""
        return max(self.folded_last(), max(self._pending, default=-1) + 1, self._first)

    def start_at(self, step: int) -> None:
        """The view is added at ``step`` (by an upgrade): the log's next write is ``step``'s,
        and no earlier step has a change (nothing is written for them). Held by this object
        until that write's record is durable, which then says where the log goes on."""
        self._first = max(self._first, step)

    def stored_columns(self) -> pa.Schema:
        """The columns the log's table holds (payload, ``_step``, ``_weight``), as its Delta
        metadata records them: those of the view that wrote it, which an upgrade compares with
        the view's new columns."""
        return self.table.store.stored_schema()

    def retired_at(self) -> int | None:
        """The step from which an upgrade stopped computing this view (None: it is computed)."""
        value = self.table.store.properties().get(RETIRED_PROPERTY, "")
        return int(value) if value.isdigit() else None

    def mark_retired(self, step: int | None) -> bool:
        """Record in the log's table properties that the view is no longer computed from
        ``step`` on (None: it is computed again); returns whether it committed (once)."""
        return self.table.set_properties({RETIRED_PROPERTY: "" if step is None else str(step)})

    def folded_last(self) -> int:
        """The next step the Delta table itself expects (the steps before it are folded).

        Cached: read from the table once, then moved by this object's own folds. That is exact
        because only the pipeline that owns the root folds (it holds the root's lock; this
        object exists only in it, ``runtime/pipeline.py``): no other process moves the table's
        app transaction while this one owns the root. A process that lost the root (fenced by a
        later opener, which may fold) may see a stale value here, but its next step record is
        refused (``ConcurrentWriterError``), and ``fold`` reads the table, not this cache (a fold
        is a compare-and-append on the output table, not fenced). ``load_pending`` (opening,
        roll-back) forgets the cached value."""
        if self._folded is None:
            written = self.table.transaction_version(APP_ID)
            self._folded = 0 if written is None else written + 1
        return self._folded

    # -- pending writes ------------------------------------------------------------------------
    def stage(self, write: PreparedWrite) -> None:
        """Hold ``write`` pending: its step's record was committed (the caller's duty)."""
        self._pending[write.step] = write

    def load_pending(self, records: dict[int, dict[str, Any]]) -> None:
        """Hold pending exactly the recorded writes (step -> this view's record) of the steps
        the Delta table does not hold yet (after opening or a roll-back)."""
        self._folded = None
        folded = self.folded_last()
        self._pending = {step: PreparedWrite.from_record(step, record)
                         for step, record in sorted(records.items()) if step >= folded}

    @property
    def pending_steps(self) -> int:
        return len(self._pending)

    def pending_paths(self) -> set[str]:
        """The absolute paths of the pending writes' files (no Delta version refers to them
        yet; garbage collection keeps them)."""
        return {self.table.store.path(a.path) for w in self._pending.values() for a in w.adds}

    def fold(self) -> bool:
        """Commit the pending writes to the Delta table in one commit (crash points
        ``output.commit.*``) whose app transaction records the newest step; returns whether it
        committed. Writes of steps the table holds already (a fold before a crash) are
        dropped, not committed twice."""
        for _ in range(_FOLD_ATTEMPTS):
            base = self.table.version()  # first: a commit after it makes ours fail
            # read from the table, never the cache: a process fenced by a later opener that
            # folded these steps must find them folded (the fold itself is not fenced)
            self._folded = None
            folded = self.folded_last()
            writes = [w for step, w in sorted(self._pending.items()) if step >= folded]
            if not writes:
                break
            self._folded = None  # until the commit is known to have landed
            try:  # a compare-and-append: two processes folding one step commit it once
                self.table.commit(
                    [a for w in writes for a in w.adds], app_id=APP_ID,
                    app_version=writes[-1].step, expected_version=base + 1,
                    metadata={STEP_KEY: writes[-1].step, FIRST_STEP_KEY: writes[0].step,
                              ROWS_KEY: sum(w.rows for w in writes),
                              **({DIGEST_KEY: writes[0].digest} if len(writes) == 1 else {})})
            except ConcurrentWriterError:
                continue  # another commit landed first (a compaction, another process)
            self._pending = {}
            self._folded = writes[-1].step + 1
            return True
        else:
            raise ConcurrentWriterError(f"output '{self.name}': {_FOLD_ATTEMPTS} folds lost "
                                        "the race for the log's next version")
        self._pending = {}
        return False

    def _files(self) -> list[DataFile]:
        """The files of every written step: the Delta table's and the pending writes'."""
        return [*self.table.files(), *(self.table.data_file(a)
                                       for _, w in sorted(self._pending.items()) for a in w.adds)]

    def files_for_tasks(self, step: int) -> ViewFiles | None:
        """Where tasks may write step ``step``'s change themselves (``write_part``), when it is
        this log's next write; None for a replay (``prepare`` verifies those on the driver)."""
        if step != self.last():
            return None
        return ViewFiles(self.table.uri, self.table.arrow_schema, self.schema)

    def prepare(self, step: int, change: DataFrame | pa.Table | PreparedWrite | None,
                sql: LocalSQL | None = None,
                recorded: dict[str, Any] | None = None) -> PreparedWrite | None:
        """Everything of a step's write but its commit: consolidate the change and write its
        data files (not yet part of the log), or, for a step written before (a replay), verify
        it and return None. A step computes every view's write this way first, so an error in
        any view's change (an overflow, a failed task) leaves no view with the step committed.

        ``change`` is a Spark DataFrame, or an Arrow table consolidated with ``sql`` on the
        driver, or the write tasks made already (``joined_parts``; only for the step this log
        asked them for, ``files_for_tasks``). ``recorded``: this view's part of the step's
        record, when the step was written (what a replay is verified against; else the
        commit that wrote the step). Raises ``NonDeterminismError`` when a replayed step
        differs from the written one.
        """
        last = self.last()
        if step > last:
            raise UsageError(f"output '{self.name}': step {step} written before step {last}")
        if isinstance(change, PreparedWrite):
            if change.step != step or step != last:
                raise AssertionError(f"output '{self.name}': tasks wrote step {change.step}'s "
                                     f"change, but step {step} is written (next: {last})")
            return change
        rows = self._consolidated(step, change, sql)
        if step < last:
            self._verify(step, rows, recorded)
            return None
        adds = []
        if isinstance(rows, pa.Table):
            adds = self.table.write_arrow(rows) if rows.num_rows else []
            digest = content_digest(rows, self.schema)
        elif rows is not None:
            try:  # (Spark computes the view's change, all its operators, as it writes it)
                adds = self.table.write_files(rows)
            except ComputationError as e:
                raise ComputationError(f"view '{self.name}': {e}") from e
            digest = content_digest(self.table.read_arrow(
                [os.path.join(self.table.uri, a.path) for a in adds]), self.schema)
        else:
            digest = content_digest(None, self.schema)
        count = sum(self.table.data_file(a).rows for a in adds)
        return PreparedWrite(step, adds, count, digest)

    def _consolidated(self, step: int, change: pa.Table | DataFrame | None,
                      sql: LocalSQL | None) -> pa.Table | DataFrame | None:
        """The change as the log stores it: consolidated, with ``_step``, in table order."""
        cols = self.schema.fieldNames()
        if isinstance(change, pa.Table):
            assert sql is not None, "a change computed on the driver is written on the driver"
            return _stamped(sql.consolidate(change, cols), step, self.table.arrow_schema)
        if change is not None:
            return consolidate(change, cols).withColumn(STEP, F.lit(step).cast("long"))
        return None

    def _verify(self, step: int, rows: pa.Table | DataFrame | None,
                recorded: dict[str, Any] | None) -> None:
        """Compare a replayed step with the record of its first write (rows and digest)."""
        if recorded is not None:
            recorded = {ROWS_KEY: recorded["rows"], DIGEST_KEY: recorded["digest"]}
        else:
            recorded = self.table.commit_metadata(STEP_KEY, step)
        if recorded is None or not ({DIGEST_KEY, LEGACY_DIGEST_KEY} & set(recorded)):
            return  # written before digests were recorded, or its commit was cleaned up
        if rows is not None and not isinstance(rows, pa.Table):
            rows = rows.select(*[quote(f.name) for f in self.table.schema.fields]).toArrow()
        count = 0 if rows is None else rows.num_rows
        key = DIGEST_KEY if DIGEST_KEY in recorded else LEGACY_DIGEST_KEY
        digest = content_digest(rows, self.schema, floats=key == DIGEST_KEY)
        if (count, digest) != (recorded[ROWS_KEY], recorded[key]):
            raise NonDeterminismError(
                f"output '{self.name}': replaying step {step} gave {count} rows (digest "
                f"{digest}) but {recorded[ROWS_KEY]} rows (digest {recorded[key]}) were "
                "written: the circuit is not deterministic (e.g. rand(), current_timestamp()) "
                "or its input changed; the written output stands")

    # -- history -----------------------------------------------------------------------------
    def compacted_through(self) -> int:
        """The step through which history is collapsed (-1: none): the log's rows of steps up to
        it are consolidated into rows stamped with this step, so the view is exact as of any
        step from it on, and the changes of single steps exist only after it."""
        text = read_text(os.path.join(self.table.uri, COMPACTED_MARKER))
        return -1 if text is None else int(text.strip())

    def compact_history(self, through: int, sql: LocalSQL) -> bool:
        """Collapse the changes of steps ``.. through`` into their consolidated sum, stamped
        ``through`` (one rewrite commit; the view as of ``through`` and later is unchanged).
        Returns whether anything was rewritten.

        The marker that refuses reads below ``through`` is written before the commit, so a
        crash in between only refuses reads that could still have been served."""
        through = min(through, self.folded_last() - 1)  # pending writes are not rewritten
        if through <= self.compacted_through():
            return False
        files = [f for f in self.table.files()
                 if f.step_max is not None and f.step_max <= through]
        write_atomically(os.path.join(self.table.uri, COMPACTED_MARKER), str(through))
        if len(files) <= 1 and all(f.step_min == through for f in files):
            return False
        merged = sql.consolidate(self.table.read_arrow(files), self.schema.fieldNames())
        adds = self.table.write_arrow(_stamped(merged, through, self.table.arrow_schema))
        self.table.commit(adds, [f.path for f in files], data_change=False)
        return True

    def clean_log_before(self, step: int) -> int:
        """Delete the log's commits below its newest Delta checkpoint at or before the commit
        that wrote the newest step below ``step`` (the oldest retained checkpoint's step):
        replays of steps from ``step`` on still find the record of their first write
        (``_verify``), and the log opening lists stays bounded. Reads the commits of the steps
        from ``step`` on, newest first. Returns how many files went."""
        for version in range(self.table.version(), 0, -1):
            infos = self.table.commit_infos(version - 1, version)
            if not infos:
                return 0  # cleaned up already below here
            written = infos[0].get(STEP_KEY)
            if isinstance(written, int) and written < step:
                return self.table.clean_log_below(version)
        return 0

    def _check_retained(self, step: int, what: str, exact_from: int | None = None) -> None:
        """``UsageError`` unless the log still holds ``what`` (named by ``step``): history
        compacted through step T holds the view as of T and later, and the changes of the
        steps after T; ``exact_from`` is the step from which the view must be exact (default
        ``step``)."""
        through = self.compacted_through()
        if (step if exact_from is None else exact_from) < through:
            raise UsageError(f"output '{self.name}': {what} {step} is no longer retained: "
                             f"history through step {through} was compacted (hold a reader "
                             "to keep the steps it needs)")

    def _check_written(self, step: int, what: str) -> None:
        """``UsageError`` when ``step`` is not a step this log holds yet (or is negative)."""
        if step < 0 or step >= self.last():
            raise UsageError(f"output '{self.name}': {what} {step}: no such step is written "
                             f"(steps 0 to {self.last() - 1} are)")

    def changes(self, since: int = 0, until: int | None = None) -> DataFrame:
        """Every change of steps ``since..until`` (inclusive): payload, ``_step``, ``_weight``.

        After history compaction, ``since`` must be above the compacted step (a row stamped
        with the compacted step holds the sum of all steps up to it)."""
        if since > 0:
            self._check_retained(since, "changes since step", exact_from=since - 1)
        df = self.table.read(self._files())
        df = df.where(F.col(STEP) >= since)
        if until is not None:
            df = df.where(F.col(STEP) <= until)
        return df

    def view(self, as_of: int | None = None) -> DataFrame:
        """The view's value after step ``as_of`` (default: the newest): payload + ``_weight``."""
        df = self.table.read(self._files())
        if as_of is not None:
            self._check_retained(as_of, "the view as of step")
            df = df.where(F.col(STEP) <= as_of)
        return consolidate(df, self.schema.fieldNames()).select(
            *[quote(c) for c in self.schema.fieldNames()], WEIGHT)

    def step_arrow(self, step: int) -> pa.Table:
        """The change written for ``step`` (payload + ``_weight``), read on the driver; only
        files whose ``_step`` range holds ``step`` are opened."""
        self._check_written(step, "the change of step")
        self._check_retained(step, "the change of step", exact_from=step - 1)
        files = [f for f in self._files()
                 if f.step_min is not None and f.step_max is not None
                 and f.step_min <= step <= f.step_max]
        rows = self.table.read_arrow(files, where=pc.field(STEP) == step)
        return rows.select([*self.schema.fieldNames(), WEIGHT])

    def view_rows(self) -> int:
        """How many rows the view's newest value has, as SQL counts them (a row held twice
        counts twice; the sum of the weights of every written step's change).

        A file whose rows all have one weight (a consolidated set, as history compaction
        leaves the view; a change of inserts only) is counted from its statistics, and only
        the ``_weight`` column of the others is read: the cost follows the changes with
        retractions the log still holds one by one, not the view's rows (``view_arrow`` reads
        and consolidates every row of every step)."""
        total, unread = 0, []
        for f in self._files():
            known = f.weight_sum
            if known is None:
                unread.append(f)
            else:
                total += known
        if unread:
            weights = self.table.read_arrow(unread, columns=[WEIGHT]).column(WEIGHT)
            total += int(pc.sum(weights).as_py() or 0)
        return total

    def view_arrow(self, sql: LocalSQL) -> pa.Table:
        """The view's newest value read on the driver: payload + ``_weight``, consolidated."""
        files = self._files()
        if not files:
            return zset_arrow_schema(self.schema).empty_table()
        return sql.consolidate(self.table.read_arrow(files), self.schema.fieldNames())


#: file in an output table (hidden from Delta readers and vacuum) naming the compacted step
COMPACTED_MARKER = "_dbsp_compacted_through"
