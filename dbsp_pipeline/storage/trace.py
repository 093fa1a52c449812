"""Traces: the integrated state of a stateful operator, kept as a Z-set in a Delta table.

A trace table holds the operator's payload columns, ``_weight`` and ``_shard`` (the stable shard of
the operator's key, see ``dbsp_pipeline.zset``). The trace's value is the sum of all its rows;
it is not necessarily consolidated (each step appends its consolidated change as new files, like
a batch in a spine), and ``compact`` merges files in the background of the step path.

Files are sorted by ``_shard`` (Spark's writers sort by key within a shard too) and carry min/max
statistics, so a reader that only needs
some keys can skip files (``files_for_shards``), and a layout change (which moves whole shards
between workers) rewrites only the files whose shard range crosses an owner boundary. A lookup by
key (``lookup_arrow``) reads a big file through its keyed run (``keyed_runs.py``: a local,
memory-mapped copy sorted by the key's hash), so its cost follows the keys looked up and the
rows found, not the file's size; the writer of a file on the driver hands its run to a
background writer (the step does not wait for it; lookups read the file until it is there). A
small trace looked up on the driver keeps an in-memory replica of its rows, sorted by key hash
(``trace_replica.py``), read while it is of exactly the trace's files.

Durability: every change (``append``, ``replace``, a merge's or a layout change's file swap)
writes its data files at once and *stages* its add and remove actions on the state table
(``staged_table.py``); it becomes part of the pipeline's state only when the state database
commits a manifest entry recording them (``state_db.py``). Until then a crash rolls the trace
back.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.driver import hashing
from dbsp_pipeline.driver import sql as local_sql
from dbsp_pipeline.driver.sql import (
    LocalSQL,
    arrow_groups_like_duckdb,
    idents,
    null_safe_ids,
    null_safe_on,
)
from dbsp_pipeline.storage import trace_replica
from dbsp_pipeline.storage.data_files import new_sorted_run, sorted_run_of
from dbsp_pipeline.storage.delta_table import DataFile
from dbsp_pipeline.storage.kept_rows import KeptRows
from dbsp_pipeline.storage.keyed_runs import KeyedRuns
from dbsp_pipeline.storage.run_search import (
    CLOSED,
    CUT,
    HASH,
    RangeValues,
    beyond_bound,
    concat_ranges,
    orderable,
    orderable_numpy,
    tie_closed_ends,
    value_order,
)
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace_replica import Piece, TraceReplica, within_budget
from dbsp_pipeline.zset import SHARD, SHARD_BITS, WEIGHT, consolidate, shard_of


class OwnerLayout(Protocol):
    """What a trace needs of a layout (``runtime/layout.py``'s ``Layout`` is one) to tell which
    worker owns each of its rows."""

    @property
    def workers(self) -> int: ...

    @property
    def keyed(self) -> bool:
        """Whether the owner of a row depends on its key's full hash, not on its shard alone."""
        ...

    def owners(self, shard: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray: ...

    def owners_of_range(self, lo: int, hi: int) -> set[int]: ...


@dataclass
class RelayoutStats:
    """What a layout change did to one trace: rows in it, rows whose owner changed, and rows
    rewritten (the rows of the files split by owner)."""

    rows: int = 0
    moved: int = 0
    rewritten: int = 0


#: A worker's part of a split file is cut, at shard-block boundaries, into files of about this
#: many rows, so a later layout change finds narrow files and splits only those on a boundary.
SPLIT_FILE_ROWS = 131_072
#: shard blocks: the ``_shard`` values ``[b * 16, (b + 1) * 16)`` (64 blocks)
BLOCK_SHIFT = 4


def _shard_chunks(rows: pa.Table, min_rows: int = SPLIT_FILE_ROWS) -> list[pa.Table]:
    """``rows`` (sorted by ``_shard``) cut at shard-block boundaries into pieces of at least
    ``min_rows`` rows (the last may be smaller); one piece if it is small."""
    if rows.num_rows <= min_rows:
        return [rows]
    blocks = rows.column(SHARD).to_numpy(zero_copy_only=False) >> BLOCK_SHIFT
    edges = np.flatnonzero(np.diff(blocks)) + 1  # first row of each new block
    pieces, start = [], 0
    for edge in edges:
        if edge - start >= min_rows:
            pieces.append(rows.slice(start, edge - start))
            start = edge
    pieces.append(rows.slice(start))
    return pieces


def _by_shard(rows: pa.Table) -> pa.Table:
    """``rows`` ordered by ``_shard`` (stable: a shard's rows keep their order). All a file
    written on the driver needs: its row groups' ``_shard`` ranges are narrow, a shard block is
    contiguous (``_shard_chunks``), so each key is in one piece, and a lookup by key reads the
    file's keyed run, sorted by the key's hash. Sorting by ``(_shard, key)`` instead cost 50 ms
    for 475k rows (a 1M-change step's append on one of two owners), this 1 ms."""
    if rows.num_rows < 2:
        return rows
    return rows.take(pc.sort_indices(rows.column(SHARD)))


def _beyond_every_cut(hashes: np.ndarray, values: pa.ChunkedArray, is_cut: np.ndarray,
                      cut_hashes: np.ndarray, largest: bool,
                      closed: np.ndarray | None = None) -> np.ndarray | None:
    """Per row (of key hash ``hashes``, value ``values``, ``is_cut`` on a file's cut row;
    ``cut_hashes`` the distinct hashes of the cut rows, ascending): is its value strictly
    beyond (above for ``largest``, else below) every cut value of its hash, or (``closed``,
    per row: True on a tie-closed cut, ``run_search.tie_closed_counts``) at or beyond it when
    every cut of its hash is tie-closed? (Every file then gave all its rows of the hash at or
    beyond its own cut, so all the rows at or beyond the most extreme cut are in hand.) The
    rows ``_beyond_every_cut_sorted`` keeps (strictly beyond), for numbers, dates and
    timestamps without NULL or NaN only (None for others): a hash's bound is its cuts' most
    extreme value (``np.maximum.at`` or ``np.minimum.at``), with no sort of the rows."""
    if not orderable(values.type) or values.null_count:
        return None
    v = orderable_numpy(values)
    if v.dtype.kind == "f" and np.isnan(v).any():
        return None  # NaN is above every number in the runs' (Arrow's) order
    cuts = np.flatnonzero(is_cut)
    if len(cuts) == 0:
        return np.ones(len(hashes), dtype=bool)
    at = np.minimum(np.searchsorted(cut_hashes, hashes), len(cut_hashes) - 1)
    has_cut = cut_hashes[at] == hashes
    bound = np.zeros(len(cut_hashes), dtype=v.dtype)
    if largest:
        bound[:] = v[cuts].min()
        np.maximum.at(bound, at[cuts], v[cuts])
        keep: np.ndarray = ~has_cut | (v > bound[at])
    else:
        bound[:] = v[cuts].max()
        np.minimum.at(bound, at[cuts], v[cuts])
        keep = ~has_cut | (v < bound[at])
    if closed is not None:
        open_cut = np.zeros(len(cut_hashes), dtype=bool)
        np.logical_or.at(open_cut, at[cuts], ~closed[cuts])
        keep |= has_cut & ~open_cut[at] & (v == bound[at])
    return keep


def _beyond_every_cut_sorted(rows: pa.Table, order_by: str, largest: bool,
                             nulls_first: bool = False) -> np.ndarray:
    """``_beyond_every_cut`` for any value type, in the runs' order (``value_order``: Arrow's,
    NULLs last or ``nulls_first``): with ``rows`` sorted by (hash, value, cut), a cut row comes
    after the rows of its value (``largest``) or before them (smallest), so the rows kept are
    those past the hash's last cut row (before its first): their values are strictly beyond
    every cut of the hash. The mask is in ``rows``' own order."""
    order = value_order(rows.column(HASH), rows.column(order_by), nulls_first,
                        (rows.column(CUT), "ascending" if largest else "descending"))
    h = rows.column(HASH).to_numpy()[order]
    is_cut = rows.column(CUT).to_numpy(zero_copy_only=False)[order]
    group = np.concatenate(([0], np.cumsum(h[1:] != h[:-1])))
    position = np.arange(len(order))
    if largest:
        bound = np.full(group[-1] + 1, -1)
        np.maximum.at(bound, group[is_cut], position[is_cut])
        keep_sorted = position > bound[group]
    else:
        bound = np.full(group[-1] + 1, len(order))
        np.minimum.at(bound, group[is_cut], position[is_cut])
        keep_sorted = position < bound[group]
    keep = np.empty(len(order), dtype=bool)
    keep[order] = keep_sorted
    return keep


def _distinct_hashes(hashes: np.ndarray) -> np.ndarray:
    """The distinct values of ``hashes`` (64-bit key hashes), ascending: ``np.unique`` by
    sorting. numpy 2.3's ``np.unique`` collects the values in a hash set first, which for
    random 64-bit values costs 0.47 ms for 10k of them against 0.03 ms sorted, and 286 ms for
    1M against 5 ms."""
    ordered = np.sort(hashes)
    if len(ordered) < 2:
        return ordered
    distinct: np.ndarray = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    return distinct


def _small_keyed(table: pa.Table, key: Sequence[str]) -> bool:
    """Whether pyarrow may match ``table``'s rows on ``key`` in place of a DuckDB query (the
    driver's fast path, ``driver/sql.py``)."""
    return table.num_rows <= local_sql.FAST_PATH_ROWS and arrow_groups_like_duckdb(table, key)


def _null_safe_semi_join(rows: pa.Table, keys: pa.Table, key: Sequence[str],
                         negate: bool = False) -> pa.Table:
    """The rows of ``rows`` whose ``key`` equals a row of ``keys`` (NULL equals NULL); with
    ``negate``, those whose ``key`` equals none."""
    row_ids, key_ids = null_safe_ids(rows, keys, key)
    ids = [f"_id{j}" for j in range(len(key))]
    left = pa.table({**dict(zip(ids, row_ids)),
                     "_row": np.arange(rows.num_rows, dtype=np.int64)})
    hits = left.join(pa.table(dict(zip(ids, key_ids))), keys=ids,
                     join_type="left anti" if negate else "left semi", use_threads=False)
    found = hits.column("_row")
    return rows.take(pc.take(found, pc.sort_indices(found)))


#: The small files a trace wrote on the driver in this process (a step's append, a driver merge
#: once it is applied) keep their rows in memory, up to this many rows in all (the oldest go
#: first), so the next steps' lookups and the background merges read them without opening a
#: Parquet file. Data files are immutable: the kept rows are the file's content for as long as
#: the file is part of the trace (a lookup only reads the trace's current files). As many rows
#: as the small files a trace holds before a merge (``COMPACT_FILE_THRESHOLD`` files under
#: ``keyed_runs.MIN_ROWS`` rows, which a lookup reads whole, having no keyed run): with 65,536,
#: eager (b)'s per-customer max re-read opened 4 of its 10 small files from disk each step
#: (4 ms of its 85 ms at 1M orders).
RECENT_FILE_ROWS = 262_144
#: ...and at most this many bytes of Arrow buffers (a trace of wide rows keeps fewer)
RECENT_FILE_BYTES = 32 << 20

#: rows a min/max re-read takes per group from each big file at first, besides one per
#: retraction of the group found in the files read before it (``Trace.lookup_extreme_rows``);
#: a group whose rows taken hold no live value is read again with ``EXTREME_GROWTH`` times as
#: many. Two rows beyond the deleted ones resolve a group: its live extreme, and a cut below it
EXTREME_ROWS = 3
EXTREME_GROWTH = 8
#: at most this many of a group's retractions deepen a file's read: retractions of values far
#: from the extreme do not (the shop query's max per region under moves of 1M orders a step
#: retracted 100k values a region, and each region was read 100k rows deep)
EXTREME_RETRACTED_ROWS = EXTREME_ROWS * EXTREME_GROWTH

#: A small trace builds its in-memory replica (``trace_replica.py``) at this many lookups with
#: no change of its files between them but those a replica follows: a trace whose files Spark
#: steps change every few steps is not read whole after each
REPLICA_AFTER_LOOKUPS = 4

#: Compact a trace once it has more sorted runs than this (size-tiered merge of the smallest).
COMPACT_FILE_THRESHOLD = 16
#: A trace updated in place is merged whole once the runs beside its largest hold this many
#: times the largest's rows (a bound on size amplification, as RocksDB's universal compaction
#: bounds it against its oldest run). Each step adds a retraction and an insertion per changed
#: key, and until a merge cancels them a lookup of those keys reads every version ((c) on
#: Spark, all 100k groups changed a step: 1.6M rows read a step before, 1.3M after). A step's
#: run can be bigger than the merged base (two rows per changed key), so the bound is against
#: the largest run. Only for such traces: a trace appended to by big steps would be merged
#: whole every step or two (1M-row steps on Spark onto 1M orders: 0.75 s a step, 0.93 s so)...
MAX_SIZE_AMPLIFICATION = 1.0
#: ...once those runs hold at least this many rows: fewer cost less to read than to merge.
AMPLIFIED_MIN_ROWS = 131_072
#: A merge on the driver writes at most about this many files (besides one per owner): a
#: merge's files cut into ``SPLIT_FILE_ROWS`` pieces made a merge of 6.6M rows 36 files, more
#: than ``COMPACT_FILE_THRESHOLD``, so the trace was due for a merge of all of it again at once.
MERGE_FILES = COMPACT_FILE_THRESHOLD // 2
#: Merges of at most this many rows run on the driver (when it offers a ``LocalSQL``), unless
#: the caller allows more (the background compactor: as many as the driver's memory holds).
DRIVER_MERGE_ROWS = 2_000_000


class Trace:
    """The trace ``name`` of one operator: payload ``schema`` keyed (sharded) by ``key``; with
    ``order_by`` (a payload column), its keyed runs are sorted by that column within a key
    (NULLs last, or first with ``nulls_first``), for ``lookup_extreme_rows`` (a min/max
    aggregate's values) and ``lookup_leading_rows`` (a top-k's rows). ``updated_in_place``:
    its keys' rows are replaced, a retraction and an insertion per changed key a step (an
    aggregate's groups), so its compaction also bounds size amplification
    (``MAX_SIZE_AMPLIFICATION``)."""

    updated_in_place = False
    retraction_reads = 0

    def __init__(self, db: StateDatabase, name: str, schema: StructType,
                 key: Sequence[str], order_by: str | None = None,
                 updated_in_place: bool = False, nulls_first: bool = False) -> None:
        self.name = name
        self.updated_in_place = updated_in_place
        self.key = list(key)
        self.payload = [f.name for f in schema.fields]
        full = StructType([*schema.fields, StructField(WEIGHT, LongType(), False),
                           StructField(SHARD, IntegerType(), False)])
        self.table = db.table(name, full)
        self.spark: SparkSession = db.spark
        self._files: list[DataFile] | None = None
        #: the keyed runs of the trace's big files, for lookups by key
        self.runs = KeyedRuns(root_layout.keyed_runs(db.root, name), self.table.arrow_schema,
                              self.key, self._key_hashes,
                              read_data_file=lambda f: self.table.read_arrow([f]),
                              order_by=order_by, nulls_first=nulls_first)
        #: the rows of small files written by ``append_arrow`` or an applied driver merge, by
        #: path (``RECENT_FILE_ROWS``)
        self._recent = KeptRows()
        #: for an ordered trace, the rows of its small files (no keyed run) sorted as a run
        #: (with ``_hash``), by path: ``_small_run``
        self._small_runs = KeptRows()
        #: the rows of small files a background merge wrote, by path, until the merge is
        #: applied (``apply_merge``, on the step's thread, moves them to ``_recent``)
        self._merged: dict[str, pa.Table] = {}
        #: a background merge's rows as a replica's piece, by the merge's files, until the
        #: merge is applied (``apply_merge`` hands it to the replica): only while the trace
        #: has a replica
        self._merged_pieces: dict[frozenset[str], Piece] = {}
        #: rows read from the trace by ``read``, ``read_arrow`` and ``lookup_arrow`` since the
        #: last ``reset_rows_read`` (what steps read from state; merges are not counted)
        self.rows_read = 0
        #: about the rows ``lookup_extreme_rows`` read only because values were deleted (deeper
        #: into a file past the key's retractions found before it, and its later rounds) since
        #: the trace's largest file was last merged: retractions cancel only in a merge with the
        #: rows they delete, so a trace whose groups lose their extremes step after step reads
        #: deeper at every step, and is merged whole once this reaches its rows
        #: (``compaction_candidates``). In memory only: a new process starts from 0.
        self.retraction_reads = 0
        #: whether lookups may keep an in-memory replica of a small trace (``trace_replica.py``;
        #: not in a Spark task, which opens its traces anew every step)
        self.replicated = order_by is None
        self._replica: TraceReplica | None = None
        #: lookups without a replica since the trace's files last changed other than by a
        #: change a replica follows (``_followable``: the files after the last lookup or
        #: followed change): the replica is built at the ``REPLICA_AFTER_LOOKUPS``-th, so a
        #: trace whose files change otherwise every few steps (Spark steps) is not read whole
        #: for each
        self._unreplicated_lookups = 0
        self._followable: frozenset[str] | None = None

    def reset_rows_read(self) -> None:
        """Start counting ``rows_read`` from zero (at the start of a step)."""
        self.rows_read = 0

    def files(self) -> list[DataFile]:
        """The trace's files as of now (the open version plus this run's appends)."""
        if self._files is None:
            self._files = self.table.files()
        return list(self._files)

    def rows(self) -> int:
        return sum(f.rows for f in self.files())

    def read(self, files: Sequence[DataFile] | None = None) -> DataFrame:
        """The trace (payload, ``_weight``, ``_shard``) over ``files`` (default: all of them).
        Counts the files' rows in ``rows_read`` (what a Spark job reading them reads)."""
        chosen = self.files() if files is None else list(files)
        self.rows_read += sum(f.rows for f in chosen)
        return self.table.read(chosen)

    def files_for_shards(self, shards: Sequence[int]) -> list[DataFile]:
        """The files that may hold rows of the given shards (by their min/max ``_shard`` stats)."""
        wanted = sorted(set(shards))
        if not wanted:
            return []
        out = []
        for f in self.files():
            if f.shard_min is None or f.shard_max is None:
                out.append(f)
                continue
            i = bisect.bisect_left(wanted, f.shard_min)
            if i < len(wanted) and wanted[i] <= f.shard_max:
                out.append(f)
        return out

    def replace(self, delta: DataFrame | None) -> list[DataFile]:
        """Make the trace's value exactly ``delta`` (used for one-step memories); returns the new
        files."""
        old = self.files()
        adds = [] if delta is None else self.table.write_files(
            consolidate(delta, self.payload).withColumn(SHARD, shard_of(self.key)),
            sort_by=[SHARD, *self.key])
        if adds or old:
            self.table.stage(adds, [f.path for f in old])
        new = [self.table.data_file(a) for a in adds]
        self._files = new
        self.drop_replica()  # (a change a replica does not follow)
        return new

    def append(self, delta: DataFrame) -> list[DataFile]:
        """Append a change (payload + ``_weight``) and stage it; returns the new files.

        The change is consolidated first; the returned files hold exactly the appended rows
        (and can be read back as the materialized change).
        """
        before = self.files()
        change = consolidate(delta, self.payload).withColumn(SHARD, shard_of(self.key))
        adds = self.table.write_files(change, sort_by=[SHARD, *self.key])
        if not adds:
            return []
        self.table.stage(adds)
        new = [self.table.data_file(a) for a in adds]
        self._files = before + new
        self.drop_replica()  # (a change a replica does not follow)
        return new

    # -- driver-side (Arrow) access, for small steps ----------------------------------------
    def append_arrow(self, sql: LocalSQL, delta: pa.Table) -> pa.Table | None:
        """``append`` on the driver: consolidate, shard, sort, write one file and stage it (a
        state table writes it behind the step's computation, ``storage/write_behind.py``).

        Returns the appended rows (payload, ``_weight``, ``_shard``), or None when the change
        consolidates to nothing.
        """
        change = sql.consolidate(delta, self.payload)
        if change.num_rows == 0:
            return None
        change = _by_shard(self._with_shard(change))
        before = self.files()
        new = self.table.stage_new_file(change)  # (a state table writes it in the background)
        self._files = before + new
        for f in new:  # one file: the whole change
            self.runs.add(f, change)
            self._remember(f, change)
        replica = self._replica
        if replica is not None:  # the replica follows, if it was of the files before
            rows = self._in_row_schema(change)
            if (len(new) == 1 and replica.covers(f.path for f in before)
                    and replica.unread_appends + 1 < trace_replica.UNREAD_APPENDS
                    and within_budget(replica.rows + rows.num_rows,
                                        rows.get_total_buffer_size())):
                replica.add(new[0].path, rows, self._key_hashes(rows), self._consolidator(sql),
                            self._key_hashes)
            else:  # not of the files before, unread for long, or grown beyond the bounds
                self.drop_replica()
        self._followed(before, self._files)
        return change

    def _remember(self, f: DataFile, rows: pa.Table) -> None:
        """Keep ``rows`` (the whole content of the new file ``f``) for lookups."""
        if rows.num_rows <= RECENT_FILE_ROWS:
            self._recent.keep(f.path, self._in_row_schema(rows), RECENT_FILE_ROWS,
                              RECENT_FILE_BYTES)

    def _in_row_schema(self, rows: pa.Table) -> pa.Table:
        """``rows`` (payload, ``_weight``, ``_shard``) in the trace table's row schema: its
        column order and types (rows already in it, as an append's are, as they are)."""
        schema = self.table.arrow_schema
        return rows if rows.schema.equals(schema) else rows.select(schema.names).cast(schema)

    def replace_arrow(self, delta: pa.Table | None) -> None:
        """``replace`` on the driver (``delta`` is already consolidated)."""
        old = self.files()
        adds = []
        if delta is not None and delta.num_rows:
            adds = self.table.write_arrow(self._with_shard(delta))
        if adds or old:
            self.table.stage(adds, [f.path for f in old])
        self._files = [self.table.data_file(a) for a in adds]
        self.drop_replica()  # (a change a replica does not follow)

    def read_arrow(self, files: Sequence[DataFile] | None = None) -> pa.Table:
        """The trace's rows (payload, ``_weight``, ``_shard``) in ``files`` (default: all);
        counted in ``rows_read``."""
        rows = self.table.read_arrow(self.files() if files is None else files)
        self.rows_read += rows.num_rows
        return rows

    def lookup_arrow(self, sql: LocalSQL, keys: pa.Table,
                     files: Sequence[DataFile] | None = None) -> pa.Table:
        """The trace's rows whose key equals a key in ``keys`` (a table holding the key columns;
        NULL equals NULL), read from ``files`` (default: all), and of those only the files and
        row groups whose ``_shard`` range holds a wanted key's shard; a big file is read through
        its keyed run (built first if it has none), so only the rows of the wanted keys' hashes
        are read from it. The rows read (before the exact key match) count in ``rows_read``.

        A small trace is looked up in its in-memory replica instead (``trace_replica.py``),
        while the replica is of exactly the trace's files (or of ``files`` and the step's
        append after them): the rows then are a Z-set equal to the files' rows of the keys
        (the same sum), consolidated where the replica merged pieces."""
        if keys.num_rows == 0:
            return self.table.arrow_schema.empty_table()
        wanted_keys = self._wanted(sql, keys)
        replica, without_newest = self._replica_for(sql, files)
        if replica is not None:
            rows = replica.lookup(_distinct_hashes(self._key_hashes(wanted_keys)),
                                  without_newest)
            self.rows_read += rows.num_rows
            return self._matching(sql, rows, wanted_keys)
        hashes, shards, candidates = self._candidates(wanted_keys, files)
        if not candidates:
            return self.table.arrow_schema.empty_table()
        parts, unread = [], [f for f in candidates if not self.runs.covers(f)]
        if len(unread) < len(candidates):
            for f in candidates:
                if self.runs.covers(f):
                    found = self.runs.lookup(f, hashes[self._hashes_of(hashes, f)],
                                             self._read_to_build_run)
                    if found is None:  # no usable run: read the file as a small one
                        unread.append(f)
                    else:
                        parts.append(found)
        parts += self._read_shards(unread, shards)
        rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        self.rows_read += rows.num_rows  # the rows of small files and of the runs' hash ranges
        return self._matching(sql, rows, wanted_keys)

    def _replica_for(self, sql: LocalSQL, files: Sequence[DataFile] | None
                     ) -> tuple[TraceReplica | None, bool]:
        """The replica a lookup in ``files`` (default: all) reads, and whether without its
        newest piece; None when there is none to read (``trace_replica.py``). A replica that is
        not of the trace's files now is dropped, never read; one is built (reading every file)
        at the ``REPLICA_AFTER_LOOKUPS``-th lookup since the trace's files changed in a way a
        replica does not follow, if the trace holds at most half of ``trace_replica.MAX_ROWS``
        and the replica fits the process's ``BUDGET_BYTES`` (else this trace keeps none)."""
        if not self.replicated:
            return None, False
        current = self.files()
        if self._replica is not None and not self._replica.covers(f.path for f in current):
            self.drop_replica()
        if self._replica is None:
            paths = frozenset(f.path for f in current)
            self._unreplicated_lookups = (self._unreplicated_lookups + 1
                                          if paths == self._followable else 1)
            self._followable = paths
            if (self._unreplicated_lookups < REPLICA_AFTER_LOOKUPS
                    or not within_budget(2 * sum(f.rows for f in current))):
                return None, False
            replica = self._build_replica(sql, current)
            if not within_budget():  # beyond the process's bytes: this trace keeps none
                self.replicated = False
                return None, False
            self._replica = replica
        how = self._replica.readable(f.path for f in (current if files is None else files))
        return (None, False) if how is None else (self._replica, how)

    def _build_replica(self, sql: LocalSQL, files: Sequence[DataFile]) -> TraceReplica:
        """The replica of ``files`` (all the trace's), from their rows (kept ones from
        memory; the others read, counted in ``rows_read``)."""
        kept = [self._recent.get(f.path) for f in files]
        unread = [f for f, t in zip(files, kept) if t is None]
        parts = [t for t in kept if t is not None]
        if unread:
            read = self.table.read_arrow(unread)
            self.rows_read += read.num_rows
            parts.append(read)
        rows = (pa.concat_tables([self._in_row_schema(p) for p in parts])
                if parts else self.table.arrow_schema.empty_table())
        return TraceReplica.build([f.path for f in files], rows, self._key_hashes(rows),
                                  self._consolidator(sql), self._key_hashes)

    def _consolidator(self, sql: LocalSQL) -> Callable[[pa.Table], pa.Table]:
        """A consolidation of the trace's rows (``_shard`` with the payload), in its row
        schema: what a merge does to the files it reads."""
        def consolidate_rows(rows: pa.Table) -> pa.Table:
            return self._in_row_schema(sql.consolidate(rows, [*self.payload, SHARD]))
        return consolidate_rows

    def drop_replica(self) -> None:
        """Forget the replica (the trace's files changed in a way it does not follow)."""
        self._replica = None
        self._unreplicated_lookups = 0
        self._followable = None

    def _followed(self, before: Sequence[DataFile], after: Sequence[DataFile]) -> None:
        """Without a replica: the files changed from ``before`` to ``after`` by a change a
        replica would have followed (lookups before it count towards building one)."""
        if self._replica is None and frozenset(f.path for f in before) == self._followable:
            self._followable = frozenset(f.path for f in after)

    def lookup_extreme_rows(self, sql: LocalSQL, keys: pa.Table, largest: bool,
                            bound: str | None = None) -> pa.Table:
        """For a trace ordered by a value (``order_by``: a min/max aggregate's (group, value)
        multiset): live rows of the keys in ``keys`` (consolidated, every weight above zero)
        whose most extreme value per key, largest (``largest``) or smallest, is the key's live
        extreme. For each key, the rows (from every file) whose value is strictly beyond some
        cut (or at or beyond it: ``lookup_leading_rows``), consolidated: the extreme value
        whose weights sum above zero over these rows is the one over all the key's rows, and a
        key with no live value at all gets none.

        ``bound`` names a column of ``keys`` holding, per key, a value beyond which the caller
        holds the key's live values itself (a min/max aggregate: its old extreme, beyond which
        every value was dead before the step, so only the step's inserts can be live there).
        The rows strictly beyond it are then left out of every file alike (``_bounds``) and the
        extreme given is the key's live one among the rest: a re-read under a stream of deletes
        of each group's extreme reads past none of the values deleted before, so its cost stays
        that of one delete between two merges, not of all of them (in a run, the rows beyond
        are found by a gallop from its end and skipped unread). A bound is used for numbers,
        dates and timestamps; for other value types, or a NULL bound, all rows count.

        Reads the small files (no keyed run) first, each sorted once as a run in memory
        (``_small_run``) and read by its ends as a run is, about ``EXTREME_ROWS`` rows per key
        (a step's lookup reads up to ``COMPACT_FILE_THRESHOLD`` small files, again each round:
        a top-k over one partition took all their rows when they were read whole), then the
        big files smallest first
        (``KeyedRuns.lookup_ends``), about ``EXTREME_ROWS`` rows per key from each plus one per
        retraction of the key found in the files read before it (up to
        ``EXTREME_RETRACTED_ROWS``): the values those deleted may be a bigger file's most
        extreme, the base run's under a steady stream of deletes of the current maximum. A key
        whose rows taken hold no live value (its extremes deleted by files read after, or more
        of them than counted) is read again with ``EXTREME_GROWTH`` times as many, until a live
        value or all its rows are in hand. So a min/max re-read costs about the rows deleted
        beyond the new extreme, not the group's size. The rows read count in ``rows_read``."""
        def live(rows: pa.Table) -> pa.Table:
            return local_sql.filtered(rows, pc.greater(rows.column(WEIGHT), 0))

        def unsettled(rows: pa.Table, cut_keys: pa.Table) -> pa.Table:
            return self._matching(sql, cut_keys, live(rows).select(self.key), negate=True)

        return live(self.lookup_leading_rows(sql, keys, largest, unsettled, bound=bound))

    def lookup_leading_rows(self, sql: LocalSQL, keys: pa.Table, largest: bool,
                            unsettled: Callable[[pa.Table, pa.Table], pa.Table],
                            count: int = EXTREME_ROWS,
                            files: Sequence[DataFile] | None = None,
                            bound: str | None = None) -> pa.Table:
        """For a trace ordered by a value (``order_by``): per key of ``keys``, the rows
        (consolidated: each once, its weight not zero) of its leading values, in ``files``
        (default: all): either all the key's rows, or (a key cut) every row of the key whose
        value is strictly beyond some value (or at or beyond it, where every file's cut took
        its ties: a top-k's rows of numbers, dates or timestamps, ``_beyond_cuts``), largest
        (``largest``) or smallest first in the runs' order, and none other. So the rows given
        lead all the key's other rows, and a key's rows whose value ties with or is beyond a
        row given are all given.

        Rounds as ``lookup_extreme_rows`` describes, starting at ``count`` rows a key from each
        file: after each, ``unsettled(rows, cut_keys)`` (the round's rows, the keys of the
        round that were cut, in the key types) names the cut keys whose rows do not
        settle the caller (a subset of ``cut_keys``, in its schema); those are read again with
        ``EXTREME_GROWTH`` times as many rows, their rows of this round dropped. ``bound`` as
        for ``lookup_extreme_rows``."""
        if self.runs.order_by is None:
            raise ValueError(f"trace {self.name} is not ordered by a value")
        empty = self.table.arrow_schema.empty_table().select([*self.payload, WEIGHT])
        if keys.num_rows == 0:
            return empty
        wanted = self._wanted(sql, keys)
        bounds = self._bounds(keys, bound, largest) if bound is not None else None
        first_count, found = count, []
        while wanted.num_rows:
            read_before = self.rows_read
            rows, cut = self._beyond_cuts(sql, wanted, count, largest, bounds, files)
            if count > first_count:  # a round after the first: its leading rows were deleted
                self.retraction_reads += self.rows_read - read_before
            held = sql.consolidate(rows, self.payload)
            if cut.size == 0:
                found.append(held)
                break
            cut_keys = wanted.filter(pa.array(np.isin(self._key_hashes(wanted), cut)))
            again = unsettled(held, cut_keys)
            if again.num_rows and held.num_rows:  # their rows are read again, deeper
                held = self._matching(sql, held, again, negate=True)
            found.append(held)
            wanted, count = again, count * EXTREME_GROWTH
        found = [t for t in found if t.num_rows]
        return pa.concat_tables(found) if len(found) > 1 else (found[0] if found else empty)

    def _bounds(self, keys: pa.Table, bound: str, largest: bool
                ) -> tuple[np.ndarray, np.ndarray] | None:
        """The bounds of ``lookup_extreme_rows``: the distinct key hashes of ``keys`` (sorted)
        and per hash the bound of its keys (the least tight one, where two keys' hashes are
        equal), in the numpy type of the trace's ``order_by`` column; None (no bound) for a
        value type numpy does not order as Arrow does, or a NULL bound. Dates and timestamps
        are bounded as the integers they are stored as (``run_search.orderable_numpy``)."""
        value_type = self.table.arrow_schema.field(cast(str, self.runs.order_by)).type
        if not orderable(value_type):
            return None
        column = keys.column(bound)
        if column.null_count:
            return None
        values = orderable_numpy(column.cast(value_type))
        h = self._key_hashes(self._cast(keys, self.key))  # (hashed in the trace's key types)
        order = np.argsort(h, kind="stable")
        h, values = h[order], values[order]
        starts = np.flatnonzero(np.concatenate(([True], h[1:] != h[:-1])))
        # the least tight: the largest bound for a max (a NaN, above every number, bounds
        # nothing), the smallest for a min (a NaN only where every bound of the hash is one)
        loosest = np.maximum if largest else np.fmin
        return h[starts], loosest.reduceat(values, starts)

    def _beyond_cuts(self, sql: LocalSQL, wanted_keys: pa.Table, count: int, largest: bool,
                     bounds: tuple[np.ndarray, np.ndarray] | None = None,
                     files: Sequence[DataFile] | None = None) -> tuple[pa.Table, np.ndarray]:
        """One round of ``lookup_leading_rows``: the rows of ``wanted_keys`` (distinct, in the
        key types) in ``files`` (default: all) strictly beyond every cut of their hash (at or
        beyond, for a hash whose every cut took its ties), and the hashes cut (uint64); with
        ``bounds`` (``_bounds``), of the rows not strictly beyond their hash's bound."""
        hashes, shards, candidates = self._candidates(wanted_keys, files)
        if not candidates:
            return self.table.arrow_schema.empty_table(), np.zeros(0, dtype=np.uint64)
        order_by = cast(str, self.runs.order_by)  # (checked by lookup_leading_rows)
        # a cut takes the rows that tie with it too (``run_search.tie_closed_counts``) where
        # the values are numbers, dates or timestamps (and a file's have no NULL), and the rows
        # hold more than key and value (a top-k's): a file's rows of a (key, value) multiset
        # (a min/max aggregate's) are consolidated, so no two of a key tie
        close_ties = (orderable(self.table.arrow_schema.field(order_by).type)
                      and len(self.payload) > len(self.key) + 1)
        # per wanted hash, its bound (every wanted hash is one of the bounds' hashes)
        bound = None if bounds is None else bounds[1][np.searchsorted(bounds[0], hashes)]
        # per wanted hash, the retractions found so far: a bigger file may hold their values
        # among its most extreme, so it is read that much deeper
        retracted = np.zeros(len(hashes), dtype=np.int64)
        parts: list[pa.Table] = []

        def take_ends(run: pa.Table) -> None:  # a run's rows of the wanted hashes, its ends
            sorted_h = run.column(HASH).to_numpy()
            lo = np.searchsorted(sorted_h, hashes, "left")
            hi = np.searchsorted(sorted_h, hashes, "right")
            at = np.flatnonzero(hi > lo)
            if len(at) == 0:
                return
            lo, hi = lo[at], hi[at]
            if bound is not None:  # the rows beyond their hash's bound (at one end) left out
                values = orderable_numpy(run.column(order_by).take(
                    pa.array(concat_ranges(lo, hi - lo))))
                over = beyond_bound(values, np.repeat(bound[at], hi - lo), largest)
                skipped = np.bincount(np.repeat(np.arange(len(at)), hi - lo), weights=over,
                                      minlength=len(at)).astype(np.int64)
                hi, lo = (hi - skipped, lo) if largest else (hi, lo + skipped)
            retractions = run.column(WEIGHT).to_numpy()[concat_ranges(lo, hi - lo)] < 0
            retracted[at] += np.bincount(np.repeat(np.arange(len(at)), hi - lo),
                                         weights=retractions, minlength=len(at)).astype(np.int64)
            ties: RangeValues | None = None
            if close_ties and run.column(order_by).null_count == 0 \
                    and bool((hi - lo > count).any()):  # (else no cut: nothing to close)
                column = orderable_numpy(run.column(order_by))
                ties = (lambda rows: column[rows], lambda a, b: column[a:b])
            part = tie_closed_ends(lo, hi, count, largest, ties,
                                   lambda rows: run.take(pa.array(rows)))
            parts.append(part if close_ties else part.drop_columns([CLOSED]))

        def read_whole(files: list[DataFile]) -> None:  # big files without a usable run
            for rows in self._read_shards(files, shards):
                take_ends(self._as_run(rows))

        for f in candidates:  # the small files, each sorted once as a run in memory
            if not self.runs.covers(f):
                take_ends(self._small_run(f))
        for f in sorted((f for f in candidates if self.runs.covers(f)), key=lambda f: f.rows):
            part = self._hashes_of(hashes, f)
            deeper = np.minimum(retracted[part], EXTREME_RETRACTED_ROWS)
            found = self.runs.lookup_ends(f, hashes[part], count + deeper, largest,
                                          self._read_to_build_run,
                                          None if bound is None else bound[part],
                                          close_ties=close_ties)
            if found is None:  # no usable run: read the file as a small one
                read_whole([f])
                continue
            self.retraction_reads += int(deeper.sum())
            parts.append(found)
            # (the hashes of the retractions, by numpy mask: filtering the table costs a copy of
            # every column)
            negative = found.column(HASH).to_numpy()[found.column(WEIGHT).to_numpy() < 0]
            np.add.at(retracted, np.searchsorted(hashes, negative), 1)
        if not parts:  # (small files whose shard range holds a wanted hash, but not the hash)
            return self.table.arrow_schema.empty_table(), np.zeros(0, dtype=np.uint64)
        rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        self.rows_read += rows.num_rows
        if rows.num_rows == 0:
            return rows.drop_columns([HASH, CUT, CLOSED] if close_ties else [HASH, CUT]), \
                np.zeros(0, dtype=np.uint64)
        h = rows.column(HASH).to_numpy()
        is_cut = rows.column(CUT).to_numpy(zero_copy_only=False)
        cut = _distinct_hashes(h[is_cut])
        closed = rows.column(CLOSED).to_numpy(zero_copy_only=False) if close_ties else None
        keep = _beyond_every_cut(h, rows.column(order_by), is_cut, cut, largest, closed)
        if keep is None:  # (strictly beyond: right whether the cuts are tie-closed or not)
            keep = _beyond_every_cut_sorted(rows, order_by, largest, self.runs.nulls_first)
        rows = rows.filter(pa.array(keep)).drop_columns(
            [HASH, CUT, CLOSED] if close_ties else [HASH, CUT])
        return self._matching(sql, rows, wanted_keys), cut

    def _small_run(self, f: DataFile) -> pa.Table:
        """The rows of the small file ``f`` of an ordered trace sorted as a run, with their
        ``_hash`` (``run_search.value_order``), sorted once and kept (``RECENT_FILE_ROWS``):
        from the rows kept of a file this process wrote, else read whole (counted in
        ``rows_read``, as are the rows a lookup then takes). Data files are immutable, so the
        rows kept are the file's. (Kept beside ``_recent``, up to as many rows again, for
        ordered traces only: a top-k's, a min/max aggregate's values.)"""
        run = self._small_runs.get(f.path)
        if run is None:
            rows = self._recent.get(f.path)
            if rows is None:
                rows = self.table.read_arrow([f])
                self.rows_read += rows.num_rows
            run = self._as_run(rows)
            self._small_runs.keep(f.path, run, RECENT_FILE_ROWS, RECENT_FILE_BYTES)
        return run

    def _as_run(self, rows: pa.Table) -> pa.Table:
        """``rows`` (of an ordered trace, in its row schema) sorted as a run
        (``run_search.value_order``), with their ``_hash``."""
        h = self._key_hashes(rows)
        order = value_order(pa.array(h, pa.uint64()), rows.column(cast(str, self.runs.order_by)),
                            self.runs.nulls_first)
        return rows.take(pa.array(order)).append_column(self.runs.run_schema.field(HASH),
                                                        pa.array(h[order], pa.uint64()))

    def _wanted(self, sql: LocalSQL, keys: pa.Table) -> pa.Table:
        """The distinct keys of ``keys`` (a table holding the key columns), in the key types."""
        if len(self.key) == 1:
            wanted_keys = pa.table({self.key[0]: pc.unique(keys.column(self.key[0]))})
        elif self.key and _small_keyed(keys, self.key):
            wanted_keys = keys.select(self.key).group_by(self.key, use_threads=False).aggregate(
                [])
        elif self.key:
            wanted_keys = sql.query(f"SELECT DISTINCT {idents(self.key)} FROM k",
                                    k=keys.select(self.key))
        else:
            wanted_keys = keys.slice(0, 1).select([])
        return self._cast(wanted_keys, self.key)

    def _candidates(self, wanted_keys: pa.Table, files: Sequence[DataFile] | None
                    ) -> tuple[np.ndarray, list[int], list[DataFile]]:
        """The distinct hashes of ``wanted_keys`` (sorted, uint64), their shards (the hashes'
        top bits, as ``hashing.shard_arrow``; 0 for a trace without key) and the files of
        ``files`` (default: all) whose ``_shard`` range holds one."""
        hashes = _distinct_hashes(self._key_hashes(wanted_keys))
        top = np.right_shift(hashes, np.uint64(64 - SHARD_BITS))
        shards = _distinct_hashes(top).astype(np.int64).tolist() if self.key else [0]
        candidates = self.files() if files is None else list(files)
        hit = set(self.files_for_shards(shards))
        return hashes, shards, [f for f in candidates if f in hit]

    def _hashes_of(self, hashes: np.ndarray, f: DataFile) -> slice:
        """The part of ``hashes`` (sorted key hashes) that file ``f`` may hold: those whose shard
        (the top bits) is within its ``_shard`` range; all of them for a file without the range
        or a trace without key. A sorted run cut into many files (a big trace's base) is then
        searched for each hash in one file, not for every hash in each."""
        if not self.key or f.shard_min is None or f.shard_max is None:
            return slice(0, len(hashes))
        shift = np.uint64(64 - SHARD_BITS)
        lo = np.searchsorted(hashes, np.uint64(f.shard_min) << shift, "left")
        if f.shard_max >= (1 << SHARD_BITS) - 1:
            return slice(int(lo), len(hashes))
        hi = np.searchsorted(hashes, np.uint64(f.shard_max + 1) << shift, "left")
        return slice(int(lo), int(hi))

    def _read_shards(self, files: Sequence[DataFile], shards: list[int]) -> list[pa.Table]:
        """The rows of ``files`` in ``shards``: from the rows kept of a file this process
        wrote, else from the row groups whose ``_shard`` range holds one."""
        if not files:
            return []
        parts = []
        found = [(f, self._recent.get(f.path)) for f in files]
        kept = [t for _, t in found if t is not None]
        if kept:  # one mask over them all (a filter by expression costs a plan per table)
            recent = pa.concat_tables(kept) if len(kept) > 1 else kept[0]
            wanted = pa.array(shards, recent.schema.field(SHARD).type)
            parts.append(recent.filter(pc.is_in(recent.column(SHARD), value_set=wanted)))
        unread = [f for f, t in found if t is None]
        if unread:
            field = pc.field(SHARD)
            where = (field >= min(shards)) & (field <= max(shards)) & field.isin(shards)
            parts.append(self.table.read_arrow(unread, where))
        return parts

    def _matching(self, sql: LocalSQL, rows: pa.Table, keys: pa.Table,
                  negate: bool = False) -> pa.Table:
        """The rows of ``rows`` whose key equals a row of ``keys`` (distinct, in the key types;
        NULL equals NULL), or with ``negate`` those whose key equals none."""
        if not self.key:  # every row has the one key there is
            return rows if (keys.num_rows > 0) != negate else rows.slice(0, 0)
        if rows.num_rows == 0:
            return rows
        if len(self.key) == 1:  # is_in matches NULL with NULL, as the lookup must
            key = self.key[0]
            mask = pc.is_in(rows.column(key), value_set=keys.column(key), skip_nulls=False)
            # (rows found by their keys' hashes nearly always all match: only a collision of
            # two keys' 64-bit hashes does not)
            return local_sql.filtered(rows, pc.invert(mask) if negate else mask)
        if _small_keyed(rows, self.key) and _small_keyed(keys, self.key):
            return _null_safe_semi_join(rows, keys, self.key, negate)
        join = "ANTI" if negate else "SEMI"
        return sql.query(f"SELECT r.* FROM r {join} JOIN k ON {null_safe_on('r', 'k', self.key)}",
                         r=rows, k=keys).cast(rows.schema)

    def _cast(self, table: pa.Table, columns: Sequence[str]) -> pa.Table:
        """``columns`` of ``table``, cast to this trace's types (no column: as many rows)."""
        if not columns:
            return table.select([])
        schema = self.table.arrow_schema
        fields = [schema.field(c) for c in columns]
        return pa.Table.from_arrays([table.column(c).cast(f.type) for c, f in zip(columns, fields)],
                                    schema=pa.schema(fields))

    def _read_to_build_run(self, f: DataFile) -> pa.Table:
        """The rows of ``f``, read whole to build its keyed run (counted in ``rows_read``)."""
        rows = self.table.read_arrow([f])
        self.rows_read += rows.num_rows
        return rows

    def _key_hashes(self, rows: pa.Table) -> np.ndarray:
        """The 64-bit hash of the key of each row of ``rows``, unsigned (its top bits are the
        row's ``_shard``)."""
        return hashing.xxhash64_arrow(rows, self.key).astype(np.uint64)

    def _with_shard(self, rows: pa.Table) -> pa.Table:
        """Payload and ``_weight`` of ``rows`` in the table's types, plus their ``_shard``."""
        cast = self._cast(rows, [*self.payload, WEIGHT])
        return cast.append_column(self.table.arrow_schema.field(SHARD),
                                  hashing.shard_arrow(cast, self.key))

    # -- compaction --------------------------------------------------------------------------
    def compaction_candidates(self, threshold: int = COMPACT_FILE_THRESHOLD) -> list[DataFile]:
        """The files to merge next, size-tiered like a spine, counted in *runs*: the files one
        write produced (a step's append, split by owner or not; the pieces of one merge;
        ``data_files.sorted_run_of``). Their rows are sorted and, within the run, each key is in one
        file, so a lookup reads one file a run. Once the trace has more than ``threshold`` runs:
        the smallest runs, taken in order of size while the next one is no bigger than all
        taken together (so a row is rewritten about log(n) times, and a big base run is not
        rewritten for a few small ones) or while more than half of ``threshold`` runs would
        remain, at least two; all their files. A trace ``updated_in_place`` is merged whole,
        whatever its run count, once the runs beside its largest hold ``MAX_SIZE_AMPLIFICATION``
        times its rows and at least ``AMPLIFIED_MIN_ROWS``; a trace ordered by a value (a
        min/max aggregate's values) once its ``retraction_reads`` reach its rows (and
        ``AMPLIFIED_MIN_ROWS``): the rows its re-reads read past deleted extremes since its
        largest file was merged, which would otherwise grow at every step that deletes the
        same groups' extremes again ((c) on Spark, every group's maximum deleted a step: 1.0M
        rows read the first step at 4M orders, 15M the thirtieth), come to about what merging
        it reads (a ski-rental rule: the reads a merge would have saved never grow much beyond
        the merge's own cost). Empty when no compaction is due.

        Counting files instead, a merge cut into more pieces than ``threshold`` (one or more
        per owner: with 16 workers or more) left the trace due again at once, and it was merged
        whole for ever. Merging down to half the threshold, not to the threshold, a trace that
        a small step a time keeps at the threshold merges every ``threshold / 2`` steps instead
        of rewriting its newest run at every step (300 100-row steps at 1M orders: 65 merges of
        374k rows in all, not 190 of 515k)."""
        by_run: dict[str, list[DataFile]] = {}
        for f in self.files():
            by_run.setdefault(sorted_run_of(f.path), []).append(f)
        runs = sorted(by_run.values(), key=lambda fs: sum(f.rows for f in fs))
        if self.updated_in_place and len(runs) > 1:
            largest = sum(f.rows for f in runs[-1])
            beside = sum(f.rows for run in runs[:-1] for f in run)
            if beside >= max(MAX_SIZE_AMPLIFICATION * largest, AMPLIFIED_MIN_ROWS):
                return [f for run in runs for f in run]
        if self.retraction_reads and len(runs) > 1 and self.retraction_reads >= max(
                sum(f.rows for run in runs for f in run), AMPLIFIED_MIN_ROWS):
            return [f for run in runs for f in run]  # reading past deletes cost a merge
        if len(runs) <= max(threshold, 1):
            return []
        chosen = [*runs[0], *runs[1]]
        rows, taken = sum(f.rows for f in chosen), 2
        for run in runs[2:]:
            # Stop before a run bigger than all chosen together, unless leaving it (and the
            # larger ones) out would still leave too many runs.
            run_rows = sum(f.rows for f in run)
            if run_rows > rows and len(runs) - taken + 1 <= max(threshold // 2, 1):
                break
            chosen += run
            rows += run_rows
            taken += 1
        return chosen

    def merge(self, files: Sequence[DataFile], sql: LocalSQL | None = None,
              layout: OwnerLayout | None = None,
              driver_rows: int = DRIVER_MERGE_ROWS) -> list[AddAction]:
        """Write the consolidated content of ``files`` as new, uncommitted, shard-sorted files.

        Pure: reads only the given (immutable) files and commits nothing, so it may run in the
        background while steps append to the trace. Merges of at most ``driver_rows`` rows run
        on the driver with ``sql`` (when given), larger ones as a Spark job. With ``layout``, a
        driver merge writes files of one owner each (cut at shard-block boundaries, as
        ``split_by_owner`` cuts, into about ``MERGE_FILES`` files in all), so the files an
        owner task reads hold only its rows.
        """
        rows = sum(f.rows for f in files)
        if sql is not None and rows <= driver_rows:
            # files whose rows are kept are not opened, if that is all of them
            kept = [self._recent.get(f.path) for f in files]
            whole = (pa.concat_tables([t for t in kept if t is not None])
                     if all(t is not None for t in kept) else self.table.read_arrow(files))
            merged = sql.consolidate(whole, [*self.payload, SHARD])
            merged = _by_shard(merged.select(self.table.arrow_schema.names))
            pieces = [merged]
            if layout is not None and layout.workers > 1 and merged.num_rows:
                owner = self.owners(layout, merged)
                piece_rows = max(SPLIT_FILE_ROWS, -(-merged.num_rows // MERGE_FILES))
                pieces = [chunk for w in np.unique(owner) for chunk in
                          _shard_chunks(merged.filter(pa.array(owner == w)), piece_rows)]
            adds = []
            run = new_sorted_run() if len(pieces) > 1 else None  # the pieces are one sorted run
            for part in pieces:  # one file a piece (its keyed run is of use once it commits)
                for a in self.table.write_arrow(part, run):
                    adds.append(a)
                    f = self.table.data_file(a)
                    self.runs.add(f, part)
                    if part.num_rows <= RECENT_FILE_ROWS:
                        self._merged[f.path] = part
            if self._replica is not None:  # its piece, sorted here, off the step's thread
                paths = frozenset(self.table.data_file(a).path for a in adds)
                rows = self._in_row_schema(merged)
                # (one merge of a trace at a time: a piece of an earlier one never applied,
                # its merge having failed, goes)
                self._merged_pieces = {paths: Piece.sorted_from(paths, rows,
                                                                self._key_hashes(rows))}
            return adds
        merged = consolidate(self.table.read(files), [*self.payload, SHARD])
        parts = max(1, min(64, rows // 2_000_000 + 1))
        merged = merged.repartitionByRange(parts, F.col(SHARD)) if parts > 1 else merged.coalesce(1)
        return self.table.write_files(merged, sort_by=[SHARD, *self.key])

    def apply_merge(self, files: Sequence[DataFile], adds: Sequence[AddAction]) -> bool:
        """Swap ``files`` for their merge ``adds`` (one staged swap: the trace's value is the
        same). Returns False, staging nothing, if any of ``files`` is no longer
        part of the trace (it was rolled back or replaced meanwhile)."""
        current = self.files()
        gone = set(files)
        new = [self.table.data_file(a) for a in adds]
        merged = [self._merged.pop(f.path, None) for f in new]
        piece = self._merged_pieces.pop(frozenset(f.path for f in new), None)
        if not gone <= set(current):
            return False
        self.table.stage(adds, [f.path for f in files])
        if max(current, key=lambda f: f.rows) in gone:  # the retractions met their rows
            self.retraction_reads = 0
        self._files = [f for f in current if f not in gone] + new
        for f, rows in zip(new, merged):
            if rows is not None:
                self._remember(f, rows)
        if self._replica is not None and not self._replica.merged(
                (f.path for f in files), [f.path for f in new], piece):
            self.drop_replica()
        self._followed(current, self._files)
        return True

    def compact(self, threshold: int = COMPACT_FILE_THRESHOLD, sql: LocalSQL | None = None) -> bool:
        """Merge the compaction candidates now (plan, merge, apply); returns whether it did."""
        files = self.compaction_candidates(threshold)
        return bool(files) and self.apply_merge(files, self.merge(files, sql))

    # -- layouts ---------------------------------------------------------------------------
    def owners(self, layout: OwnerLayout, table: pa.Table) -> np.ndarray:
        """The worker owning each row of ``table`` (rows of this trace) under ``layout``."""
        hashes = (hashing.xxhash64_arrow(table, self.key).astype(np.uint64)
                  if layout.keyed else None)
        return layout.owners(table.column(SHARD).to_numpy(zero_copy_only=False), hashes)

    def needs_split(self, f: DataFile, layout: OwnerLayout) -> bool:
        """Whether file ``f`` holds rows of several workers under ``layout``. Under ``fixed``
        and ``dynamic`` sharding the file's ``_shard`` statistics decide it; when they cannot,
        the owners of its rows do (its ``_shard`` and, for a keyed layout (``modulo``), key
        columns are read)."""
        if layout.workers == 1 or f.rows == 0:
            return False
        if not layout.keyed and f.shard_min is not None and f.shard_max is not None:
            if len(layout.owners_of_range(f.shard_min, f.shard_max)) == 1:
                return False
        keys = self.table.read_arrow([f], columns=self._owner_columns(layout))
        return len(np.unique(self.owners(layout, keys))) > 1

    def split_by_owner(self, files: Sequence[DataFile], layout: OwnerLayout) -> list[AddAction]:
        """Write the rows of ``files`` again as new, uncommitted files that each hold rows of
        one worker under ``layout`` (cut at shard-block boundaries into files of about
        ``SPLIT_FILE_ROWS`` rows). Pure, like ``merge``: reads only the given immutable files
        and commits nothing, so it may run while steps append to the trace (a hot layout
        change, ``runtime/migration.py``); the caller swaps ``files`` for the result in one
        staged swap."""
        adds: list[AddAction] = []
        runs: dict[str, str] = {}  # the pieces of a run's files are one run again
        for f in files:
            rows = self.table.read_arrow([f])
            owner = self.owners(layout, rows)
            run = runs.setdefault(sorted_run_of(f.path), new_sorted_run())
            for w in np.unique(owner):
                for chunk in _shard_chunks(rows.filter(pa.array(owner == w))):
                    for a in self.table.write_arrow(chunk, run):
                        adds.append(a)
                        # its run from the file (a layout change may split hundreds of
                        # files: their rows are not kept until the writer gets to them)
                        self.runs.build_later(self.table.data_file(a))
        return adds

    def moved_rows(self, files: Sequence[DataFile], old: OwnerLayout, new: OwnerLayout) -> int:
        """How many rows of ``files`` change owner from layout ``old`` to ``new``."""
        columns = sorted({*self._owner_columns(old), *self._owner_columns(new)})
        moved = 0
        for f in files:
            if f.rows:
                keys = self.table.read_arrow([f], columns=columns)
                moved += int(np.count_nonzero(self.owners(old, keys) != self.owners(new, keys)))
        return moved

    def swap_files(self, files: Sequence[DataFile], adds: Sequence[AddAction]) -> None:
        """Replace ``files`` by ``adds`` (the same rows, other files) in one staged swap."""
        if files:
            self.table.stage(adds, [f.path for f in files])
            self._files = None
            self.drop_replica()  # (a change a replica does not follow)

    def relayout(self, old: OwnerLayout, new: OwnerLayout) -> RelayoutStats:
        """Make every file hold rows of one worker under layout ``new``: a file whose rows
        belong to several workers is split into one file per worker (one staged swap; the
        trace's value is unchanged). Files owned by one worker are not touched: under ``fixed``
        and ``dynamic`` sharding that is decided from the file's ``_shard`` statistics alone.
        Returns the rows in the trace, the rows whose owner changes, and the rows rewritten."""
        files = self.files()
        split = [f for f in files if self.needs_split(f, new)]
        self.swap_files(split, self.split_by_owner(split, new))
        return RelayoutStats(rows=sum(f.rows for f in files),
                             moved=self.moved_rows(files, old, new),
                             rewritten=sum(f.rows for f in split))

    def _owner_columns(self, layout: OwnerLayout) -> list[str]:
        return [SHARD, *self.key] if layout.keyed else [SHARD]

    def collect_runs(self) -> int:
        """Delete the keyed runs of data files the trace no longer holds (a merge replaced
        them; garbage collection deletes them once no retained version reads them); returns how
        many files went. Runs are a cache (``keyed_runs.py``): a lookup in a file of an older
        version (after a restore) builds its run again. Lists only the runs' folder, not the
        table's data files."""
        return self.runs.retain(f.path for f in self.files())

    def reset_cache(self) -> None:
        """Forget the cached file list (after the state database rolled the table back) and
        the replica."""
        self._files = None
        self.drop_replica()

