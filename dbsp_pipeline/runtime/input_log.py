"""The durable log of one circuit input.

Every ``push`` is one committed Delta version of the log table ``inputs/<name>`` (payload +
``_weight``); once ``append`` returns, the records are durable and will be part of the next step
whose division covers that version. A push may carry a producer name and sequence number, which
the same commit records (a Delta app transaction), so a producer that crashed mid-push can ask
which of its batches were recorded (``pushed``) and a repeated batch is recognised. A step's
input is "the log versions ``(lower, upper]``", where the division log (``division_log.py``)
fixes ``upper`` for each step before the step's output.

Input every retained checkpoint has consumed is consolidated (``consolidate_consumed``, at
garbage collection, in a background thread whose rewrite a later commit applies), so the log's
current version holds the integrated input: it is also the input's table, which
``Pipeline.input_view`` reads and a recomputation from scratch starts from.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.errors import ConcurrentWriterError
from dbsp_pipeline.runtime.scatter import PushedChange
from dbsp_pipeline.storage.delta_table import DataFile, SparkDeltaTable
from dbsp_pipeline.storage.kept_rows import KeptRows
from dbsp_pipeline.storage.trace import DRIVER_MERGE_ROWS
from dbsp_pipeline.zset import WEIGHT, canonical_floats, canonical_floats_arrow, consolidate

log = logging.getLogger(__name__)

#: Delta app-transaction id of a producer's sequence numbers: ``producer/<name>``.
PRODUCER_APP_PREFIX = "producer/"
#: commit metadata: how many records of the pushed batch were rejected (errors sink)
REJECTED_KEY = "dbsp.rejected"
#: how often a producer's push retries after other pushes took the version it aimed at
_PRODUCER_COMMIT_ATTEMPTS = 50
#: The pushes this process committed keep their rows in memory, up to this many rows in all
#: (the oldest go first), so the step that consumes them reads no Parquet file. Data files are
#: immutable: the kept rows are exactly what reading the file gives.
PUSHED_ROWS_KEPT = 65_536


#: the thread that consolidates consumed input in the background, for every log of the process
_CONSOLIDATOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dbsp-input-consolidate")
_SQL: LocalSQL | None = None
#: the thread that commits the pushes a step carries while it computes (``land_in_background``):
#: one, so a step's pushes land one after another in the order given
_LANDER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dbsp-input-land")


def _background_sql() -> LocalSQL:
    """The consolidation thread's own DuckDB (one core: the steps keep the others)."""
    global _SQL
    if _SQL is None:
        _SQL = LocalSQL(threads=1)
    return _SQL


@dataclass(frozen=True)
class WrittenPush:
    """A push whose data file is written and not committed (``InputLog.write_push``): its add
    actions (none for no rows), its rows (the file holds them cast to the log's schema), and
    what its commit records."""

    adds: list[AddAction]
    rows: pa.Table
    producer: str | None
    seq: int | None
    rejected: int


@dataclass(frozen=True)
class LandingPush:
    """A push being committed in the background at exactly the log version it was given
    (``InputLog.land_in_background``); ``files`` are the files it adds."""

    input: str
    push: WrittenPush
    files: list[DataFile]
    future: Future[int]

    def wait(self) -> None:
        """Return once the push is committed at its version; else raise what its commit raised:
        ``ConcurrentWriterError`` when another push took that version first (nothing of this
        one is committed), ``StorageError`` or anything else as a push's commit would."""
        self.future.result()


@dataclass
class _Consolidation:
    """A background consolidation of ``files``, started at ``started`` (``time.monotonic``)."""

    files: list[DataFile]
    future: Future[list[AddAction]]
    started: float


class InputLog:
    def __init__(self, spark: SparkSession, root: str, name: str, schema: StructType) -> None:
        self.name = name
        self.schema = schema
        full = StructType([*schema.fields, StructField(WEIGHT, LongType(), False)])
        self.table = SparkDeltaTable(spark, root_layout.input_log(root, name), full,
                                     role="input")
        #: the rows of pushes this process committed, by file path (``PUSHED_ROWS_KEPT``)
        self._pushed = KeptRows()
        #: the background consolidation not yet applied (``consolidate_consumed``)
        self._consolidation: _Consolidation | None = None

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.table.arrow_schema

    def append_arrow(self, table: pa.Table, producer: str | None = None,
                     seq: int | None = None, rejected: int = 0) -> int:
        """Durably append (payload + ``_weight``) rows; returns how many (0: the producer's
        batch ``seq`` was recorded already, by this or another process).

        With ``producer``/``seq`` the commit also records ``seq`` as the producer's newest
        sequence number (a Delta app transaction), atomically with the rows: a batch is either
        recorded with its number or not at all, and at most once however many processes push it
        at the same time (``_commit``). ``rejected`` counts records of the batch that were not
        valid (sent to the errors sink); the commit records it for the step's result.
        """
        return self.append_written(self.write_push(table, producer, seq, rejected))

    def write_push(self, table: pa.Table, producer: str | None = None, seq: int | None = None,
                   rejected: int = 0) -> WrittenPush:
        """The first half of ``append_arrow``: the push's data file written, nothing committed
        (a file no commit names is garbage for ``storage/garbage.py``)."""
        rows = canonical_floats_arrow(table)
        return WrittenPush(self.table.write_arrow(rows), rows, producer, seq, rejected)

    def append_written(self, push: WrittenPush) -> int:
        """The second half of ``append_arrow``: commit ``push`` at the log's next version
        (a producer's at the first version its number is not recorded at); returns how many
        rows were appended (0: the producer's batch was recorded already)."""
        if push.adds or push.producer is not None:
            metadata = {REJECTED_KEY: push.rejected} if push.rejected else None
            if not self._commit(push.adds, push.producer, push.seq, metadata):
                return 0
        self._keep(push)
        return int(push.rows.num_rows)

    def land_in_background(self, push: WrittenPush, version: int) -> LandingPush:
        """Commit ``push`` at exactly log version ``version`` (compare-and-append), in the
        background: the step that carries the push computes meanwhile, and waits for it before
        its record names ``version`` (``step_protocol.execute_step``). Until it is waited for,
        nothing else may use this log's table. Its rows are kept at once (the step reads them;
        rows of a file no commit names are never read by anyone else)."""
        self._keep(push)
        metadata = {REJECTED_KEY: push.rejected} if push.rejected else None
        app_id = None if push.producer is None else PRODUCER_APP_PREFIX + push.producer
        future = _LANDER.submit(self.table.commit, push.adds, app_id=app_id,
                                app_version=push.seq, metadata=metadata,
                                expected_version=version)
        return LandingPush(self.name, push, [self.table.data_file(a) for a in push.adds],
                           future)

    def _keep(self, push: WrittenPush) -> None:
        for add in push.adds:  # (one file: the whole push, kept as the file reads)
            if push.rows.num_rows <= PUSHED_ROWS_KEPT:
                self._pushed.keep(self.table.data_file(add).path,
                                  push.rows.cast(self.table.arrow_schema), PUSHED_ROWS_KEPT)

    def append_spark(self, df: DataFrame, producer: str | None = None,
                     seq: int | None = None) -> int:
        """Durably append a Spark DataFrame of (payload + ``_weight``); returns the rows
        appended (0: the producer's batch was recorded already, as for ``append_arrow``)."""
        adds = self.table.write_files(canonical_floats(df))
        if adds or producer is not None:
            if not self._commit(adds, producer, seq):
                return 0
        return sum(self.table.data_file(a).rows for a in adds)

    def consolidate_consumed(self, upper: int, sql: LocalSQL, *, background: bool = False,
                             driver_rows: int = DRIVER_MERGE_ROWS) -> bool:
        """Replace records of log versions ``.. upper`` (input every retained state version has
        consumed: no replay reads them push by push any more) by their consolidated sum, in one
        rewrite commit, which steps never read as new input (``data_change=False``). The log so
        stays the size of the live input plus the pushes not yet consumed, not of every push
        ever made. Size-tiered: a consumed file bigger than all the others together (an earlier
        sum) is left alone. Returns whether it committed a rewrite.

        With ``background``, the sum is read, consolidated and written in the process's input
        consolidation thread (reading only immutable files, committing nothing: at 4M orders
        after 1M-change steps, 8 s that a step used to wait for), and its rewrite is committed
        by a later ``apply_consolidated`` (or call of this), unless a file it replaces left the
        log meanwhile (its files are then orphans for garbage collection). One consolidation
        per log at a time. A sum of at most ``driver_rows`` rows is consolidated on the driver
        (DuckDB on one core, beside the steps), a bigger one with Spark (whose jobs would take
        the steps' task slots).

        The log's commits below its newest Delta checkpoint at or before ``upper`` are deleted
        too (``clean_log_below``): no replay, status read or check reads a version before the
        consumed one, and the log opening lists stays bounded."""
        committed = self.apply_consolidated(wait=not background)
        if upper <= 0:
            return committed
        self.table.clean_log_below(upper)
        if self._consolidation is not None:  # still running: one at a time
            return committed
        consumed = {f.path for f in self.table.files(upper)}
        files = sorted((f for f in self.table.files() if f.path in consumed),
                       key=lambda f: f.rows, reverse=True)
        while len(files) > 1 and files[0].rows > sum(f.rows for f in files[1:]):
            files = files[1:]
        if len(files) < 2:
            return committed
        if background:
            self._consolidation = _Consolidation(
                files, _CONSOLIDATOR.submit(self._consolidated, files, None, driver_rows),
                time.monotonic())
            return committed
        self.table.commit(self._consolidated(files, sql, driver_rows),
                          [f.path for f in files], data_change=False)
        return True

    def apply_consolidated(self, wait: bool = False) -> bool:
        """Commit the background consolidation's rewrite if it finished (with ``wait``: once it
        has); returns whether it committed one. A failed consolidation only wasted work."""
        job = self._consolidation
        if job is None or (not wait and not job.future.done()):
            return False
        self._consolidation = None
        try:
            adds = job.future.result()
        except Exception:
            log.warning("consolidating input '%s' failed; its log stays as it is", self.name,
                        exc_info=True)
            return False
        current = {f.path for f in self.table.files()}
        if not all(f.path in current for f in job.files):
            return False
        self.table.commit(adds, [f.path for f in job.files], data_change=False)
        return True

    def consolidation_running_for(self) -> float | None:
        """Seconds since the background consolidation not yet applied started (None: none);
        its files are at most that old."""
        job = self._consolidation
        return None if job is None else time.monotonic() - job.started

    def _consolidated(self, files: list[DataFile], sql: LocalSQL | None,
                      driver_rows: int = DRIVER_MERGE_ROWS) -> list[AddAction]:
        """The consolidated sum of ``files`` written as new files (not committed); on the
        driver (``sql``, or the consolidation thread's own DuckDB) up to ``driver_rows`` rows,
        else with Spark."""
        cols = self.schema.fieldNames()
        if sum(f.rows for f in files) <= driver_rows:
            merged = (sql or _background_sql()).consolidate(self._read_arrow(files), cols)
            return self.table.write_arrow(merged) if merged.num_rows else []
        return self.table.write_files(consolidate(self.table.read(files), cols))

    def remove(self, files: list[DataFile]) -> int:
        """Take the records of ``files`` (from ``files_between``: a quarantined step's input,
        already copied to the errors table) out of the log, in one commit: the integrated input
        no longer holds them. Files already taken out are skipped, so a repeat after a crash is
        a no-op. Returns how many files were taken out."""
        if not files:
            return 0
        current = {f.path for f in self.table.files()}
        gone = [f.path for f in files if f.path in current]
        if gone:
            self.table.commit([], gone)
        return len(gone)

    def integrated_files(self, upper: int) -> list[DataFile]:
        """The files whose sum is the input integrated through log version ``upper``, which must
        be at least the ``upper`` of every ``consolidate_consumed`` so far (the division of
        the newest executed step always is): the current files minus the pushes after it."""
        later = {f.path for f in self.table.added_files(upper, self.table.version(),
                                                        data_only=True)}
        return [f for f in self.table.files() if f.path not in later]

    def pushed(self, producer: str) -> int | None:
        """The newest sequence number recorded for ``producer`` (None if none)."""
        return self.table.transaction_version(PRODUCER_APP_PREFIX + producer)

    def pushed_all(self, producers: list[str]) -> dict[str, int | None]:
        """``pushed`` of each of ``producers``, as of one read of the log."""
        self.table.version()  # loads the newest version
        return {p: self.table.transaction_version(PRODUCER_APP_PREFIX + p, refresh=False)
                for p in producers}

    def _commit(self, adds: list[AddAction], producer: str | None, seq: int | None,
                metadata: dict[str, Any] | None = None) -> bool:
        """Commit a push; returns False when it was not committed because ``producer`` has
        recorded ``seq`` already (its files are then garbage for ``storage/garbage.py``).

        A producer's push is a compare-and-append: it commits at the version after the one at
        which the producer's newest number was read, so two processes pushing the same batch at
        once (a restarted Kafka source beside the old one, not yet fenced) cannot both commit
        it — Delta's conflict check lets two blind appends with the same app id through. The
        loser reads the number again: its batch recorded, it stops; else it tries again."""
        if producer is None:
            self.table.commit(adds, metadata=metadata)
            return True
        assert seq is not None
        app_id = PRODUCER_APP_PREFIX + producer
        for _ in range(_PRODUCER_COMMIT_ATTEMPTS):
            base = self.table.version()  # looks for other writers' commits
            last = self.table.transaction_version(app_id, refresh=False)  # as of ``base``
            if last is not None and seq <= last:
                return False
            try:
                self.table.commit(adds, app_id=app_id, app_version=seq, metadata=metadata,
                                  expected_version=base + 1)
                return True
            except ConcurrentWriterError:
                continue  # another push landed first: look again
        raise ConcurrentWriterError(
            f"input '{self.name}': {_PRODUCER_COMMIT_ATTEMPTS} pushes of producer "
            f"'{producer}' lost the race for the log's next version; nothing was appended")

    def rejected_between(self, lower: int, upper: int) -> int:
        """How many invalid records the pushes of versions ``lower+1 .. upper`` left out."""
        return sum(int(info.get(REJECTED_KEY, 0))
                   for info in self.table.commit_infos(lower, upper))

    def version(self) -> int:
        return self.table.version()

    def files_between(self, lower: int, upper: int) -> list[DataFile]:
        """The files appended by log versions ``lower+1 .. upper``."""
        return self.table.added_files(lower, upper, data_only=True)

    def change(self, files: list[DataFile], *, consolidated: bool = True) -> DataFrame | None:
        """The change held by ``files`` (from ``files_between``), for Spark: consolidated, or
        with ``consolidated=False`` the rows as pushed (for readers that consolidate it
        themselves: ``Plan.read_by_owner_stages``)."""
        if not files:
            return None
        rows = self.table.read(files)
        return consolidate(rows, self.schema.fieldNames()) if consolidated else rows

    def pushed_files(self, files: list[DataFile], *,
                     consolidated: bool = True) -> PushedChange | None:
        """The change held by ``files`` as the files themselves, for a scatter stage
        (``runtime/scatter.py``; None for no files); its ``frame`` is
        ``change(files, consolidated=...)``."""
        if not files:
            return None
        return PushedChange(self.table.uri, self.table.arrow_schema,
                            tuple(f.path for f in files), sum(f.rows for f in files),
                            lambda: self.change(files, consolidated=consolidated))

    def change_arrow(self, sql: LocalSQL, files: list[DataFile]) -> pa.Table | None:
        """The consolidated change held by ``files``, read on the driver."""
        if not files:
            return None
        change = sql.consolidate(self._read_arrow(files), self.schema.fieldNames())
        return change if change.num_rows else None

    def _read_arrow(self, files: list[DataFile]) -> pa.Table:
        """The rows of ``files``: the kept rows when this process pushed them all, else read."""
        kept = [self._pushed.get(f.path) for f in files]
        if kept and all(t is not None for t in kept):  # no file to open
            return pa.concat_tables([t for t in kept if t is not None])
        return self.table.read_arrow(files)
