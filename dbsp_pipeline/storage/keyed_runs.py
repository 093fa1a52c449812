"""Keyed runs: a local, memory-mapped copy of a trace's big data files, sorted by key hash, so a
lookup of K keys costs about K x log(rows) plus the rows it finds, not a scan.

A trace's Delta data files (``trace.py``) are Parquet, sorted by ``_shard``, and a reader
can skip only whole files and row groups by their ``_shard`` range: a change touching more than a
few hundred keys of a big trace reads nearly all of it. Each big data file therefore gets a
*run*: the same rows, plus their key's full 64-bit hash (``_hash``, Spark's ``xxhash64`` as an
unsigned number, whose top bits are the ``_shard``), sorted by it, in an uncompressed Arrow IPC
file on local disk. A lookup memory-maps the run, finds each wanted hash by binary search
(``numpy.searchsorted`` touches about log(rows) pages) and takes the rows in the ranges found;
only those pages are read from disk.

Ordered runs, for min/max. The runs of a trace of (group, value) rows (``order_by``: a min/max
aggregate's values) are sorted by the value too within each hash, in Arrow's order (NaN above
every number, ``-0.0`` equal to ``0.0``: DuckDB's, which decides min/max). ``lookup_ends`` then
takes only the ``count`` largest (or smallest) rows of each wanted hash and marks the last row
taken of a hash that has more (``_cut``): every row of that hash beyond the cut's value was
taken, so a group's live extreme is found from a few rows a file instead of all its values
(``Trace.lookup_extreme_rows``). Asked to (``close_ties``: a top-k's rows, whose values tie
many ways), it takes the rows that tie with the cut row too (``tie_closed_counts``), so the
rows at the cut's value are all in hand as well and a tie group is read in one round.

Never a second source of truth. A run is a pure function of one immutable data file: it is named
by the data file's path (a hash of it) and, every time a process opens it, checked against
what it must be: the trace's schema, the data file's row count and size, the key columns and
the hash function it was sorted by (``RUN_FORMAT``, in the schema's metadata), and its first
and last hash against the file's ``_shard`` range; and its bytes against the CRC-32 each
record batch carries (``_batch_checksum``, in the batch's metadata): bytes changed on the
local disk since the run was written are found before a lookup uses them (reading a run of 16M
rows through once, about 0.1-0.2 s from the page cache, the first time a process opens it).
A run this process wrote, or read through once, is trusted while its file's identity (device,
inode, size, modification time) is the one written or read (``_TRUSTED``), and is not read
through again. (A Spark worker
keeps the runs its tasks checked open, and takes one again only while its file is the very
file checked: ``_CheckedRuns``.) A run that is missing, cut short, of another file or format,
whose bytes changed, or otherwise unreadable is removed and rebuilt from the data file (on the
driver at once, in a Spark task by the background writer, ``build_later``), never trusted;
deleting the whole folder loses nothing but the time to rebuild.
Runs are written to a temporary file, flushed to disk (``fsync``) and renamed into place, so a
crash or a power loss leaves the old state (no run) or a whole run. Which files a lookup reads
is decided by the trace's Delta version, as before, so crash rollback, restore and time travel
need nothing from here.

Off the step path. The writer of a data file (``add``: a driver step's append, a driver merge)
hands the rows to one background thread per process (``_RunWriter``), which sorts, writes and
``fsync``s the run, one run at a time; ``add`` returns at once and a step never waits for, nor
fails by, a run write (its errors are logged). Until the run is in place, a lookup in that
file reads the data file (as for a small file) and gets the same rows; at most
``PENDING_WRITES`` runs wait, and a run given beyond that is built at its file's first
lookup instead, as the run of a file Spark wrote is. A file whose rows are not in hand (the
pieces of a layout change, a file a lookup in a Spark task found without a run) gets its run
built the same way from the data file (``build_later``: the thread reads the file; up to
``PENDING_BUILDS`` wait, holding no rows). ``flush`` waits until the runs handed over are
written (tests, benchmarks, closing). The thread lives while it has work and ``IDLE_SECONDS``
after (a stream of steps starts it once); it is a daemon, and a process that exits first
writes the runs handed over (``_flush_at_exit``, unless writes are held; a killed one leaves a
temporary file that ``retain`` removes).

A cache must not stop the engine: a run that cannot be written (a full or read-only local disk)
is skipped with a warning, and a lookup in a file whose run cannot be built or read reads the
data file instead (as for small files). Runs are uncompressed, so they take more local disk than
the Parquet files they copy.

Threads: ``add`` may run on the background compactor's thread (a merge writes the run of its
output) while steps look up; ``retain`` runs only while no merge does (garbage collection waits
for it). Each writer writes its own temporary file (process and thread in its name).

Small files (under ``MIN_ROWS``) get no run: reading them whole costs less than keeping a copy,
and the trace's compaction merges them into big ones soon.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dbsp_pipeline.storage.table_store import DataFile

#: the column of a run holding the key's 64-bit hash, as an unsigned number, sorted
HASH = "_hash"
#: data files with fewer rows than this get no run (they are read whole)
MIN_ROWS = 16_384
#: rows per record batch of a run (each batch is searched on its own; fewer, bigger batches
#: mean fewer searches per lookup)
BATCH_ROWS = 1 << 20
#: what a run is sorted by, recorded in its schema's metadata: a run of another format (an
#: engine whose hash differs, or format 1's runs, whose batches carry no checksum) is rebuilt;
#: an ordered run's adds ``;then:<column>``
RUN_FORMAT = "2:xxhash64-spark-seed42"
#: a run's record batch's metadata: the CRC-32 of the batch's buffers (``_batch_checksum``)
CHECKSUM_KEY = b"dbsp.crc32"
#: the column ``lookup_ends`` adds: the least extreme row taken of a hash with more rows
CUT = "_cut"
#: the column ``lookup_ends(..., close_ties=True)`` adds: whether its cuts are tie-closed (every
#: row of the hash that ties with the cut row was taken too), the same on every row
CLOSED = "_closed"
#: runs kept open (memory-mapped, one file descriptor each) per trace, least recently used out
OPEN_RUNS = 32
#: runs kept open and checked per process (``_CheckedRuns``), least recently used out
PROCESS_OPEN_RUNS = 256
#: runs this process wrote or read through, opened again without reading their bytes through
#: (``_TrustedRuns``)
PROCESS_TRUSTED_RUNS = 4096
#: temporary files younger than this are another writer's run in progress, not crash leftovers
TMP_GRACE_SECONDS = 3600.0
#: runs handed to the background writer with their rows and not yet written, per process
PENDING_WRITES = 4
#: runs the background writer is to build from their data files (holding no rows), per process
PENDING_BUILDS = 256
#: the background writer waits this long for another run before its thread ends
IDLE_SECONDS = 5.0
#: A batch searched for at least ``FENCE_MIN_HASHES`` hashes at once, and at most one per
#: ``FENCE_ROWS_PER_HASH`` of its rows, is searched through a *fence*: every
#: ``FENCE_STRIDE``-th hash of it, built at the first such search and kept while the run is
#: open. A hash's block of ``FENCE_STRIDE`` rows is found in the fence (small, in cache) and
#: only that block (2 KB) is searched, where a binary search over a whole batch of 1M hashes
#: (8 MB) misses the cache at nearly every step when the hashes wanted are far apart. A lookup
#: of 9k keys in a run of 16M rows (16 batches): 5.1 ms plain, 3.4 ms fenced; in a run of 1M
#: rows (one batch, 116 rows a hash) a plain search is faster: 1.1 ms, fenced 1.6 ms.
FENCE_STRIDE = 256
FENCE_MIN_HASHES = 64
FENCE_ROWS_PER_HASH = 1024
#: A batch searched for at least one hash a ``MERGE_ROWS_PER_HASH`` rows (and at least
#: ``FENCE_MIN_HASHES``) is merged with the hashes instead (``_merged_positions``): a step's file
#: of one row a changed group, looked up for every group the step changed
MERGE_ROWS_PER_HASH = 8
#: a hash's last row is found by stepping past its rows from the first, for up to this many
#: rows (a key has one row, or a few, in most traces), then by a binary search
END_STEPS = 4

#: the top bits of a key hash that are its ``_shard`` (``zset.SHARD_BITS``)
_SHARD_SHIFT = np.uint64(64 - 10)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _OpenRun:
    """A run opened by this process: its memory-mapped ``file``, its non-empty record
    ``batches`` (zero-copy views of the mapping, got once: getting a batch from the file costs
    about 0.1 ms, a lookup in a run of 16 batches got each twice) with their hashes
    (``hashes``, numpy views) and the first and last hash of each (``first``, ``last``), so a
    lookup visits only the batches that may hold a hash."""

    file: pa.ipc.RecordBatchFileReader
    batches: list[pa.RecordBatch]
    hashes: list[np.ndarray]
    first: np.ndarray
    last: np.ndarray
    #: the row of the run (counted over these batches) each batch starts at
    offsets: np.ndarray
    #: the fences of the batches searched for many hashes (``FENCE_STRIDE``), by batch
    fences: dict[int, np.ndarray] = field(default_factory=dict)
    #: the numpy views of a column's batches (``values_at``), by column name
    columns: dict[str, list[np.ndarray]] = field(default_factory=dict)
    #: whether a column's ties can be closed (``closable``), by column name
    closable_columns: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, file: pa.ipc.RecordBatchFileReader) -> _OpenRun:
        batches = [batch for batch in (file.get_batch(b) for b in range(file.num_record_batches))
                   if batch.num_rows]
        hashes = [batch.column(HASH).to_numpy() for batch in batches]
        lengths = np.array([len(h) for h in hashes], dtype=np.int64)
        return cls(file, batches, hashes,
                   np.array([h[0] for h in hashes], dtype=np.uint64),
                   np.array([h[-1] for h in hashes], dtype=np.uint64),
                   np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64))

    def ranges(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where each of ``hashes`` (sorted, unique) is: per hash found, its index in
        ``hashes`` and its rows ``[lo, hi)`` in run rows (``offsets``). Only the batches whose
        hash range holds a wanted hash are searched, each for those hashes only: about
        K x log(rows) in all."""
        # per hash: the first batch ending at or after it, and past the last starting at or
        # before it (a hash's rows may straddle batches)
        if len(self.hashes) == 1:  # one batch (a run under ``BATCH_ROWS``): searched at once
            first, end = self._positions(0, hashes)
            hit = np.flatnonzero(end > first)
            return hit, first[hit], end[hit]
        lo_batch = np.searchsorted(self.last, hashes, "left")
        hi_batch = np.searchsorted(self.first, hashes, "right")
        spans = np.maximum(hi_batch - lo_batch, 0)
        total = int(spans.sum())
        none = np.zeros(0, dtype=np.int64)
        if total == 0:
            return none, none, none
        which = np.repeat(np.arange(len(hashes)), spans)
        batch_of = concat_ranges(lo_batch, spans)
        order = np.argsort(batch_of, kind="stable")  # by batch; hashes stay ascending
        batch_of, which = batch_of[order], which[order]
        cuts = np.flatnonzero(np.diff(batch_of)) + 1
        starts, ends = np.concatenate(([0], cuts)), np.append(cuts, total)
        los, his = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
        for start, end, b in zip(starts.tolist(), ends.tolist(), batch_of[starts].tolist()):
            first, past = self._positions(b, hashes[which[start:end]])
            los[start:end] = first + self.offsets[b]
            his[start:end] = past + self.offsets[b]
        found = his > los
        which, los, his = which[found], los[found], his[found]
        # a hash's pieces in consecutive batches are one range of run rows
        lo = np.full(len(hashes), np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.zeros(len(hashes), dtype=np.int64)
        np.minimum.at(lo, which, los)
        np.maximum.at(hi, which, his)
        hit = np.flatnonzero(hi > 0)
        return hit, lo[hit], hi[hit]

    def _positions(self, b: int, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``np.searchsorted(column, wanted, "left")`` and ``"right"`` for batch ``b``'s hashes
        ``column`` and ``wanted`` (sorted): two binary searches for a few hashes (a lookup of
        100 groups in a run of 16 batches spends its time in the calls, not the searches:
        0.27 ms against 0.55 through the paths below), else through the fence or a merge
        (``_first_at_or_after``) and past the rows equal to each (``_past_equal``)."""
        column = self.hashes[b]
        if len(wanted) < FENCE_MIN_HASHES:
            return (np.searchsorted(column, wanted, "left"),
                    np.searchsorted(column, wanted, "right"))
        first = self._first_at_or_after(b, column, wanted)
        return first, self._past_equal(b, column, wanted, first)

    def _first_at_or_after(self, b: int, column: np.ndarray, wanted: np.ndarray
                           ) -> np.ndarray:
        """``np.searchsorted(column, wanted, "left")`` for batch ``b``'s hashes ``column``,
        through the batch's fence when ``wanted`` are enough and far enough apart, by a merge
        of the two when they are about as many as the batch's rows (``_merged_positions``)."""
        if len(wanted) >= FENCE_MIN_HASHES and len(wanted) * MERGE_ROWS_PER_HASH >= len(column):
            return _merged_positions(column, wanted, "left")
        if len(wanted) < FENCE_MIN_HASHES or len(wanted) * FENCE_ROWS_PER_HASH > len(column):
            return np.searchsorted(column, wanted, "left")
        fence = self.fences.get(b)
        if fence is None:
            fence = self.fences[b] = column[::FENCE_STRIDE].copy()
        # the first fence entry at or above a hash ends the block holding its first row at or
        # after it: rows (block - 1) * STRIDE + 1 .. block * STRIDE (the fence's own row)
        block = np.searchsorted(fence, wanted, "left")
        lo = np.maximum(block - 1, 0) * FENCE_STRIDE
        hi = np.minimum(block * FENCE_STRIDE, len(column))
        while True:  # each block searched, all at once: column[lo - 1] < h <= column[hi]
            active = lo < hi
            if not active.any():
                return lo
            mid = (lo + hi) >> 1
            below = column[np.minimum(mid, len(column) - 1)] < wanted
            lo = np.where(active & below, mid + 1, lo)
            hi = np.where(active & ~below, mid, hi)

    def _past_equal(self, b: int, column: np.ndarray, wanted: np.ndarray, first: np.ndarray
                    ) -> np.ndarray:
        """``np.searchsorted(column, wanted, "right")`` for batch ``b``, given ``first`` (the
        "left" positions): steps past up to ``END_STEPS`` rows equal to each hash (cache-hot,
        beside its first row), then finds the end of the hashes that have more as the first
        row at or after the next hash, through the fence (a min/max trace holds a group's
        values under its hash: many rows a hash)."""
        end = first.copy()
        going = np.arange(len(wanted))
        for _ in range(END_STEPS):
            at = end[going]
            going = going[(at < len(column)) & (column[np.minimum(at, len(column) - 1)]
                                                == wanted[going])]
            if len(going) == 0:
                return end
            end[going] += 1
        top = wanted[going] == np.iinfo(np.uint64).max  # no next hash: its rows end the batch
        end[going[top]] = len(column)
        going = going[~top]
        end[going] = self._first_at_or_after(b, column, wanted[going] + np.uint64(1))
        return end

    def values_at(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Column ``name``'s values at ``rows`` (ascending run rows), as ``orderable_numpy``
        gives them, from views of its batches (numbers, dates, timestamps; no NULL)."""
        columns = self._views(name)
        out = np.empty(len(rows), dtype=columns[0].dtype)
        starts = np.searchsorted(rows, self.offsets, "left")
        ends = np.append(starts[1:], len(rows))
        for b in np.flatnonzero(ends > starts):
            out[starts[b]:ends[b]] = columns[b][rows[starts[b]:ends[b]] - self.offsets[b]]
        return out

    def beyond_at_ends(self, name: str, lo: np.ndarray, hi: np.ndarray, bounds: np.ndarray,
                       largest: bool) -> np.ndarray:
        """Per range ``[lo, hi)`` of run rows sorted by ``name`` (disjoint, ascending), how
        many rows at its top (``largest``) or bottom are strictly beyond its bound in
        ``bounds``: above it (a NaN above every number, none above a NaN bound), or below it
        (``rows_at_end``: about log(rows beyond) values read a range)."""
        return rows_at_end(lambda rows: self.values_at(name, rows), lo, hi,
                           lambda values, which: beyond_bound(values, bounds[which], largest),
                           largest)

    def values_between(self, name: str, lo: int, hi: int) -> np.ndarray | None:
        """Column ``name``'s values at run rows ``[lo, hi)``, as ``values_at`` gives them: a
        view of one batch's values; None when the rows straddle batches."""
        b = int(np.searchsorted(self.offsets, lo, "right")) - 1
        if b + 1 < len(self.offsets) and hi > self.offsets[b + 1]:
            return None
        view: np.ndarray = self._views(name)[b][lo - self.offsets[b]:hi - self.offsets[b]]
        return view

    def _views(self, name: str) -> list[np.ndarray]:
        """The numpy views of column ``name``'s batches (``orderable_numpy``), made once."""
        columns = self.columns.get(name)
        if columns is None:
            columns = self.columns[name] = [orderable_numpy(batch.column(name))
                                            for batch in self.batches]
        return columns

    def closable(self, name: str) -> bool:
        """Whether the run's ties in column ``name`` can be closed (``tie_closed_counts``): a
        number, date or timestamp column without NULLs (its values are ``orderable_numpy``'s)."""
        closable = self.closable_columns.get(name)
        if closable is None:
            kind = self.batches[0].schema.field(name).type if self.batches else pa.null()
            closable = self.closable_columns[name] = bool(self.batches) and orderable(kind) \
                and not any(batch.column(name).null_count for batch in self.batches)
        return closable

    def take(self, rows: np.ndarray) -> pa.Table:
        """The run's rows at ``rows`` (ascending run rows), with ``_hash``."""
        batch = np.searchsorted(self.offsets, rows, "right") - 1
        cuts = np.flatnonzero(np.diff(batch)) + 1
        parts = [self.batches[b].take(pa.array(part - self.offsets[b]))
                 for part, b in zip(np.split(rows, cuts), batch[np.concatenate(([0], cuts))])]
        return pa.Table.from_batches(parts, parts[0].schema)


def orderable_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``values`` (numbers, dates or timestamps, no NULL) as numpy values that compare as the
    runs order them (Arrow's order, NaN above every number): numbers as they are, dates and
    timestamps as the integers they are stored as (a view, no copy, for an ``Array``; numpy
    takes no date32 without a copy)."""
    kind = values.type
    out: np.ndarray
    if not (pa.types.is_date(kind) or pa.types.is_timestamp(kind)):
        out = values.to_numpy()
        return out
    as_int = pa.int32() if pa.types.is_date32(kind) else pa.int64()
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    parts = [chunk.view(as_int).to_numpy() for chunk in chunks]
    if len(parts) == 1:
        out = parts[0]
    else:
        out = np.concatenate(parts) if parts else np.zeros(0, dtype=as_int.to_pandas_dtype())
    return out


def value_order(hashes: pa.Array | pa.ChunkedArray, values: pa.Array | pa.ChunkedArray,
                nulls_first: bool, then: tuple[pa.Array, str] | None = None) -> np.ndarray:
    """The indices that sort rows by key hash, then by value in a run's order (Arrow's: NaN
    above every number, ``-0.0`` equal to ``0.0``), NULL values last (above NaN) or, with
    ``nulls_first``, first (below every value: Arrow's own ``null_placement`` would move NaN
    with them), then by ``then`` (a column and its direction), if given."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {"h": hashes}
    keys = [("h", "ascending")]
    if nulls_first:
        columns["n"] = pc.is_valid(values)  # (False, a NULL, sorts first)
        keys.append(("n", "ascending"))
    columns["v"] = values
    keys.append(("v", "ascending"))
    if then is not None:
        columns["t"] = then[0]
        keys.append(("t", then[1]))
    order: np.ndarray = pc.sort_indices(pa.table(columns), sort_keys=keys).to_numpy()
    return order


def beyond_bound(values: np.ndarray, bounds: np.ndarray, largest: bool) -> np.ndarray:
    """Per value (``orderable_numpy``'s), whether it is strictly beyond its bound as the runs
    order values: above it (``largest``; NaN above every number, nothing above a NaN bound),
    else below it (NaN below nothing). True on the end of a hash's sorted rows only, so the
    rows beyond are one piece at that end (``_OpenRun.beyond_at_ends``)."""
    if not largest:
        return np.asarray(values < bounds)
    if values.dtype.kind == "f":
        return np.asarray(~(values <= bounds) & ~np.isnan(bounds))
    return np.asarray(values > bounds)


def at_or_beyond(values: np.ndarray, bounds: np.ndarray, largest: bool) -> np.ndarray:
    """Per value (``orderable_numpy``'s), whether it ties with its bound or is beyond it as the
    runs order values: at or above it (``largest``; NaN at or above every value, nothing but a
    NaN at or above a NaN bound), else at or below it (every value at or below a NaN bound).
    True on a piece at the end of a hash's sorted rows, as ``beyond_bound`` is."""
    if not largest:
        return np.asarray(~beyond_bound(values, bounds, True))
    if values.dtype.kind == "f":
        return np.asarray(~(values < bounds) & (~np.isnan(bounds) | np.isnan(values)))
    return np.asarray(values >= bounds)


def orderable(kind: pa.DataType) -> bool:
    """Whether values of type ``kind`` have an ``orderable_numpy`` form: numbers, dates and
    timestamps."""
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_date(kind) or pa.types.is_timestamp(kind))


def rows_at_end(values_at: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray,
                holds: Callable[[np.ndarray, np.ndarray], np.ndarray], largest: bool,
                known: np.ndarray | None = None) -> np.ndarray:
    """Per range ``[lo, hi)`` of rows sorted by value (disjoint, ascending), how many rows at
    its top (``largest``) or bottom satisfy ``holds(values, ranges)`` (the values at some rows,
    ``values_at(rows)`` of ascending rows, and the index of each one's range), which is true on
    a piece at that end and false on the rest. ``known``: per range, rows at that end known to
    satisfy it (default none). Galloping from that end (past ``known``), then a binary search:
    about log(rows found) values read a range."""
    n = hi - lo
    known = np.zeros(len(lo), dtype=np.int64) if known is None \
        else np.minimum(known, n).astype(np.int64)  # rows satisfying it: at least ``known``...
    least = known.copy()
    most = n.copy()  # ...and at most ``most``

    def test(which: np.ndarray, depth: np.ndarray) -> np.ndarray:  # depth >= 1 from the end
        at: np.ndarray = hi[which] - depth if largest else lo[which] + depth - 1
        return holds(values_at(at), which)

    going, step = np.flatnonzero(known < n), 1
    while len(going):
        depth = np.minimum(least[going] + step, n[going])
        out = test(going, depth)
        known[going[out]] = depth[out]
        most[going[~out]] = depth[~out] - 1
        going = going[out & (depth < n[going])]
        step *= 2
    going = np.flatnonzero(known < most)
    while len(going):
        depth = (known[going] + most[going] + 1) >> 1
        out = test(going, depth)
        known[going[out]] = depth[out]
        most[going[~out]] = depth[~out] - 1
        going = going[known[going] < most[going]]
    return known


#: ``tie_closed_counts`` searches each range's values on its own (a binary search of a slice)
#: for up to this many ranges to close, and gallops over all of them at once beyond
SEARCHED_RANGES = 16
#: a cut's ties are taken only while they are at most this many times the rows it was to take:
#: a bigger tie group is left cut (its rows read round by round, 8x a round), so a file whose
#: cut value ties with a whole block of its rows, and whose rows another file's more extreme
#: values then outrank, costs at most this many times the rows the round asked of it
TIE_ROWS_PER_COUNT = 64


def tie_closed_counts(values_at: Callable[[np.ndarray], np.ndarray], lo: np.ndarray,
                      hi: np.ndarray, count: int | np.ndarray, largest: bool,
                      values_between: Callable[[int, int], np.ndarray | None] | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per range ``[lo, hi)`` of rows sorted by value (disjoint, ascending; values as
    ``values_at(rows)`` gives them for ascending rows), how many rows ``ends_of_ranges`` is to
    take from its top (``largest``) or bottom so that its cut is *tie-closed*: ``count`` (one
    for all, or one per range), or more, up to every row of the range that ties with the
    ``count``-th row from that end; and per range whether it is (True also for a range of
    ``count`` rows or fewer, which is not cut). A range whose ties number more than
    ``TIE_ROWS_PER_COUNT`` times its count keeps its count, not closed. Taking a group's
    leading values with their ties settles a group whose top values tie many ways (integer
    amounts, dates, prices: a top-k's) in one read instead of reads ever deeper. Found by a
    binary search of the range's values (``values_between(lo, hi)``: a numpy view of them, or
    None where there is none) for up to ``SEARCHED_RANGES`` ranges, else by a gallop from the
    cut row (``rows_at_end``) over at most the rows the cap allows."""
    counts = count.astype(np.int64) if isinstance(count, np.ndarray) \
        else np.full(len(lo), count, dtype=np.int64)
    closed = np.ones(len(lo), dtype=bool)
    more = np.flatnonzero(hi - lo > counts)
    if len(more) == 0:
        return counts, closed
    lo_m, hi_m, c_m = lo[more], hi[more], counts[more]
    cap = c_m * TIE_ROWS_PER_COUNT
    cut_values = values_at(hi_m - c_m if largest else lo_m + c_m - 1)
    found: np.ndarray | None = None
    if values_between is not None and len(more) <= SEARCHED_RANGES:
        views = [values_between(int(a), int(b)) for a, b in zip(lo_m, hi_m)]
        if all(v is not None for v in views):
            # numpy's searches order NaN above every number, as the runs do
            found = np.array([len(v) - np.searchsorted(v, c, "left") if largest
                              else np.searchsorted(v, c, "right")
                              for v, c in zip(cast("list[np.ndarray]", views), cut_values)],
                             dtype=np.int64)
    if found is None:  # a gallop over at most cap + 1 rows from the range's end
        lo_g, hi_g = (np.maximum(lo_m, hi_m - cap - 1), hi_m) if largest \
            else (lo_m, np.minimum(hi_m, lo_m + cap + 1))
        found = rows_at_end(
            values_at, lo_g, hi_g,
            lambda values, which: at_or_beyond(values, cut_values[which], largest), largest,
            known=c_m)
    within = found <= cap
    counts[more] = np.where(within, found, c_m)
    closed[more] = within
    return counts, closed


def _merged_positions(column: np.ndarray, wanted: np.ndarray, side: str) -> np.ndarray:
    """``np.searchsorted(column, wanted, side)`` for ``wanted`` sorted too, by merging the two:
    a stable sort of the two sorted arrays one after the other is a merge (numpy's timsort
    finds the two runs), and a wanted hash's place among the merged ones, less the wanted ones
    before it, is how many of ``column`` precede it (with the wanted ones first, those below
    it: "left"; last, those at or below it: "right"). ``_OpenRun.ranges`` of 1M hashes in a
    run of 1M rows: 46 ms against 74 searched; 50k in 50k: 1.3 against 1.8; about even at one
    hash in 4 to 8 rows."""
    n = len(wanted)
    if side == "left":
        order = np.argsort(np.concatenate((wanted, column)), kind="stable")
        places = np.flatnonzero(order < n)
    else:
        order = np.argsort(np.concatenate((column, wanted)), kind="stable")
        places = np.flatnonzero(order >= len(column))
    positions: np.ndarray = places - np.arange(n)
    return positions


def ends_of_ranges(lo: np.ndarray, hi: np.ndarray, count: int | np.ndarray, largest: bool
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per range ``[lo, hi)`` of rows sorted by value (disjoint, ascending), its ``count``
    (one count for all, or one per range) last rows (``largest``) or first ones: their
    positions, one range after another, and a mask over them that is True on the least extreme
    row taken of each range that has more rows than its count (its cut: every row of the range
    strictly beyond the cut row's value is taken; ties with it may not all be)."""
    first = np.maximum(lo, hi - count) if largest else lo
    last = hi if largest else np.minimum(hi, lo + count)
    taken = last - first
    rows = concat_ranges(first, taken)
    cut = np.zeros(len(rows), dtype=bool)
    more = np.flatnonzero(hi - lo > count)
    ends = np.cumsum(taken)
    cut[(ends - taken)[more] if largest else ends[more] - 1] = True
    return rows, cut


#: a sorted range's values, for ``tie_closed_ends``: ``values_at(rows)`` (ascending rows) and
#: ``values_between(lo, hi)`` (a numpy view, or None), as ``tie_closed_counts`` takes them
RangeValues = tuple[Callable[[np.ndarray], np.ndarray],
                    Callable[[int, int], np.ndarray | None]]


def tie_closed_ends(lo: np.ndarray, hi: np.ndarray, count: int | np.ndarray, largest: bool,
                    ties: RangeValues | None, columns: Callable[[np.ndarray], pa.Table]
                    ) -> pa.Table:
    """``ends_of_ranges``' rows of the ranges as ``columns(rows)`` gives them, with ``_cut``
    and ``_closed``: with ``ties`` (the ranges' values), each cut taking the rows that tie
    with it too (``tie_closed_counts``) and ``_closed`` True on the rows of a range that did;
    without, the cuts as they fall and ``_closed`` False (``lookup_ends`` and the in-memory
    runs of ``Trace._beyond_cuts`` alike)."""
    closed = np.full(len(lo), ties is not None)
    if ties is not None:
        count, closed = tie_closed_counts(ties[0], lo, hi, count, largest, ties[1])
    rows, cut = ends_of_ranges(lo, hi, count, largest)
    return columns(rows).append_column(pa.field(CUT, pa.bool_(), False), pa.array(cut)) \
        .append_column(pa.field(CLOSED, pa.bool_(), False),
                       pa.array(np.repeat(closed, np.minimum(count, hi - lo))))


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The integers ``starts[i] .. starts[i] + lengths[i] - 1`` for each i, one after another."""
    ranges: np.ndarray = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    ranges += np.arange(len(ranges))
    return ranges


def _identity_of(st: os.stat_result) -> tuple[int, int, int, int]:
    """A file's identity: device, inode, size and modification time (a rebuild is a new inode)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _CheckedRuns:
    """The runs this process opened and checked (``KeyedRuns._checked``) for ``KeyedRuns`` that
    share them (``share_checked``), by run path, with the run file's identity when checked
    (device, inode, size, modification time) and what it was checked against, so another
    ``KeyedRuns`` of the same trace in this process (a Spark task's: each task opens the traces
    anew) takes the open run instead of opening and checking it again. A run file is replaced
    only by a rebuild (a new inode) and removed only by ``retain``: a run whose file's identity
    is no longer the one checked, or that is gone, is opened and checked again, never trusted.
    At most ``PROCESS_OPEN_RUNS``, the least recently used out; a task first forgets those
    whose files changed (``forget_changed_runs``), so a worker does not hold removed runs'
    disk space. Thread-safe."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[str, tuple[int, int, int, int], _OpenRun]] = \
            OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def identity(path: str) -> tuple[int, int, int, int] | None:
        """The identity of the file at ``path`` now; None when there is none."""
        try:
            return _identity_of(os.stat(path))
        except OSError:
            return None

    def get(self, path: str, owner: str) -> _OpenRun | None:
        """The open run at ``path`` if it was checked against ``owner`` and its file is still
        the one checked."""
        with self._lock:
            entry = self._runs.get(path)
        if entry is None or entry[0] != owner:
            return None
        if self.identity(path) != entry[1]:
            with self._lock:
                if self._runs.get(path) is entry:
                    del self._runs[path]
            return None
        with self._lock:
            if path in self._runs:
                self._runs.move_to_end(path)
        return entry[2]

    def put(self, path: str, owner: str, identity: tuple[int, int, int, int],
            run: _OpenRun) -> None:
        """Keep ``run``, opened from the file of ``identity`` at ``path`` (taken before it
        was opened) and checked against ``owner``."""
        with self._lock:
            self._runs[path] = (owner, identity, run)
            self._runs.move_to_end(path)
            while len(self._runs) > PROCESS_OPEN_RUNS:
                self._runs.popitem(last=False)

    def discard(self, path: str) -> None:
        """Forget the run at ``path`` (removed: its map closes once no batch uses it)."""
        with self._lock:
            self._runs.pop(path, None)

    def forget_changed(self) -> int:
        """Forget every run whose file is gone or is no longer the file checked (the driver's
        garbage collection removed it, a rebuild replaced it): their maps would hold the
        removed files' disk space. Returns how many went."""
        with self._lock:
            entries = list(self._runs.items())
        gone = [path for path, (_, identity, _) in entries if self.identity(path) != identity]
        with self._lock:
            for path in gone:
                self._runs.pop(path, None)
        return len(gone)


_CHECKED = _CheckedRuns()


def _batch_checksum(batch: pa.RecordBatch) -> int:
    """The CRC-32 of a run's record batch: of its columns' buffers in order (validity, offsets,
    values, children's), as a reader of the run file gets them (``_write`` checksums the batch
    read back from its serialized form, which holds the same buffers)."""
    crc = 0
    for column in batch.columns:
        for buffer in column.buffers():
            if buffer is not None:
                crc = zlib.crc32(buffer, crc)
    return crc


class _TrustedRuns:
    """The runs this process wrote (``KeyedRuns._write``) or read through and found whole
    (``KeyedRuns._checked``), by path, with their files' identities then: such a run, while its
    file is still that one, is opened again without reading its bytes through for their
    checksums (a trace opened anew, a run its trace's open runs had let go). At most
    ``PROCESS_TRUSTED_RUNS``, the oldest out (its run is then checked as any other's).
    Thread-safe."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[int, int, int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, path: str, identity: tuple[int, int, int, int]) -> None:
        with self._lock:
            self._runs[path] = identity
            self._runs.move_to_end(path)
            while len(self._runs) > PROCESS_TRUSTED_RUNS:
                self._runs.popitem(last=False)

    def holds(self, path: str, identity: tuple[int, int, int, int]) -> bool:
        with self._lock:
            return self._runs.get(path) == identity

    def discard(self, path: str) -> None:
        with self._lock:
            self._runs.pop(path, None)


_TRUSTED = _TrustedRuns()


def _reject(path: str, identity: tuple[int, int, int, int]) -> None:
    """Remove the run file at ``path`` that failed its checks (``KeyedRuns._checked``), if it
    is still the file of ``identity`` (not a run renamed into place since), so it is built
    again; nothing if it cannot be removed (the lookup reads the data file either way)."""
    if _CheckedRuns.identity(path) == identity:
        with contextlib.suppress(OSError):
            os.remove(path)
        _CHECKED.discard(path)
        _TRUSTED.discard(path)


def forget_changed_runs() -> int:
    """Have this process forget the checked runs whose files are gone or replaced
    (``_CheckedRuns.forget_changed``); for a Spark task, before it opens its traces."""
    return _CHECKED.forget_changed()


class KeyedRuns:
    """The runs of one trace, in the local folder ``folder``, for rows of Arrow schema
    ``schema`` (the trace's table schema); ``hash_of`` computes the key hash of rows of that
    schema (``uint64``)."""

    def __init__(self, folder: str, schema: pa.Schema, key: Sequence[str],
                 hash_of: Callable[[pa.Table], np.ndarray], *, build_on_miss: bool = True,
                 read_data_file: Callable[[DataFile], pa.Table] | None = None,
                 order_by: str | None = None, nulls_first: bool = False) -> None:
        self.folder = folder
        #: the column a run's rows of one hash are sorted by, if any (``lookup_ends``)
        self.order_by = order_by
        #: whether that column's NULLs come first in a run, below every value (else last, above
        #: NaN): ``value_order``
        self.nulls_first = nulls_first
        self._format = (RUN_FORMAT if order_by is None else
                        f"{RUN_FORMAT};then:{order_by}{';nulls_first' if nulls_first else ''}")
        #: whether a lookup builds a missing run from its data file first; off in a Spark task
        #: (``runtime/owner_exec.py``), which reads the file's rows it needs instead and has the
        #: run built in the background (``build_later``), so the next step finds it
        self.build_on_miss = build_on_miss
        #: reads a data file whole for a run built in the background (no step's counters)
        self._read_data_file = read_data_file
        self.schema = schema
        self.run_schema = schema.append(pa.field(HASH, pa.uint64(), False))
        self._key = ",".join(key)
        self._hash_of = hash_of
        #: runs opened by this process, by data file path (memory maps; the files never
        #: change), the least recently used first
        self._open: OrderedDict[str, _OpenRun] = OrderedDict()
        #: whether runs are taken from, and given to, the runs this process checked for other
        #: ``KeyedRuns`` (``_CheckedRuns``): on in a Spark task (``runtime/owner_exec.py``),
        #: which opens its traces anew each task; off on the driver, whose traces live as long
        #: as the pipeline and keep their runs open themselves
        self.share_checked = False
        #: what a run checked by another ``KeyedRuns`` of this process must have been checked
        #: against to serve this one: the format and run schema
        self._checked_as = f"{self._format}|{self.run_schema}"
        #: how many runs this process built from their data files (for tests and figures)
        self.built = 0

    # -- building -----------------------------------------------------------------------------
    def add(self, data_file: DataFile, rows: pa.Table) -> None:
        """Have the run of ``data_file``, whose rows (in any order) are ``rows``, written in the
        background if it is big enough to get one and has none yet. For the writer of a data
        file, which has its rows in hand: the run then costs no read. Returns at once; never
        raises for the run (see the module docstring)."""
        if self.covers(data_file) and not self.exists(data_file):
            _WRITER.submit(self, data_file, rows)

    def build_later(self, data_file: DataFile,
                    read_file: Callable[[DataFile], pa.Table] | None = None) -> bool:
        """Have the run of ``data_file`` built in the background from the data file itself
        (``read_file``, default the reader given at construction), if it is big enough to get
        one and has none yet: for a writer without the rows in hand, and for a lookup that
        found no run and must not build one on the step's path. Returns whether it was handed
        over (not when it needs none, has one, waits already, or too many wait)."""
        read = read_file or self._read_data_file
        if read is None or not self.covers(data_file) or self.exists(data_file):
            return False
        return _WRITER.submit(self, data_file, read)

    def write_now(self, data_file: DataFile, rows: pa.Table) -> None:
        """Write the run of ``data_file`` from ``rows`` in this thread (the background writer's
        job); an unwritable local disk is logged, not raised."""
        try:
            self._write(data_file, rows)
        except (OSError, pa.ArrowException) as e:  # a cache: lookups read the data file
            log.warning("keyed run of %s not written to %s: %s", data_file.path,
                        self.folder, e)

    def pending(self, data_file: DataFile) -> bool:
        """Whether the run of ``data_file`` is handed to the background writer and not yet
        written."""
        return _WRITER.pending(self.run_path(data_file))

    def flush(self) -> None:
        """Wait until every run handed to the background writer is written (or given up)."""
        wait_for_writes()

    def run_path(self, data_file: DataFile) -> str:
        """Where the run of ``data_file`` is (or goes)."""
        return self._path(data_file)

    def _metadata(self, data_file: DataFile) -> dict[bytes, bytes]:
        return {b"dbsp.run_format": self._format.encode(), b"dbsp.key": self._key.encode(),
                b"dbsp.data_file": data_file.path.encode(),
                b"dbsp.rows": str(data_file.rows).encode()}

    def _write(self, data_file: DataFile, rows: pa.Table) -> None:
        """Write the run of ``data_file`` from its ``rows``: sorted, with its hashes, each
        batch with its checksum (``_batch_checksum`` of the batch as a reader of the file gets
        it), to a temporary file that is synced and renamed into place."""
        run = rows.select(self.schema.names).cast(self.schema)
        hashes = self._hash_of(run)  # of the values as the trace types them
        if self.order_by is None:
            order = np.argsort(hashes, kind="stable")
        else:  # Arrow's order of the values: NaN above every number, as DuckDB's min/max
            order = value_order(pa.array(hashes, pa.uint64()), run.column(self.order_by),
                                self.nulls_first)
        run = run.take(pa.array(order)).append_column(
            self.run_schema.field(HASH), pa.array(hashes[order], pa.uint64()))
        schema = self.run_schema.with_metadata(self._metadata(data_file))
        os.makedirs(self.folder, exist_ok=True)
        path = self._path(data_file)
        tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                with pa.ipc.new_file(fh, schema) as writer:
                    for batch in run.replace_schema_metadata(schema.metadata).to_batches(
                            max_chunksize=BATCH_ROWS):
                        # (the checksum of the batch as read back: a slice's buffers are not
                        # the ones the file holds)
                        read_back = pa.ipc.read_record_batch(batch.serialize(), schema)
                        writer.write_batch(batch, custom_metadata={
                            CHECKSUM_KEY: str(_batch_checksum(read_back)).encode()})
                fh.flush()
                os.fsync(fh.fileno())
                written = _identity_of(os.fstat(fh.fileno()))  # (a rename keeps it)
            os.replace(tmp, path)
            _TRUSTED.put(path, written)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    # -- reading ------------------------------------------------------------------------------
    def exists(self, data_file: DataFile) -> bool:
        """Whether a file is in place as the run of ``data_file`` (not checked: ``lookup``
        checks it when it opens it)."""
        return os.path.exists(self._path(data_file))

    def covers(self, data_file: DataFile) -> bool:
        """Whether lookups in ``data_file`` go through its run (it is big enough to have one)."""
        return data_file.rows >= MIN_ROWS

    def lookup(self, data_file: DataFile, hashes: np.ndarray,
               read_file: Callable[[DataFile], pa.Table]) -> pa.Table | None:
        """The rows of ``data_file`` (in trace schema) whose key hash is one of ``hashes``
        (sorted, unique ``uint64``). Uses the file's run, built first from ``read_file(
        data_file)`` (its rows) when there is none or the one there is not whole; without a
        usable run (a local disk that cannot hold one), while the background writer has its
        run in hand, or with no run in place and ``build_on_miss`` off, ``None``: the caller
        reads the data file."""
        reader = self._usable(data_file, read_file)
        if reader is None:
            return None
        _, lo, hi = reader.ranges(hashes)
        count = hi - lo
        total = int(count.sum())
        if total == 0:
            return self.schema.empty_table()
        return reader.take(concat_ranges(lo, count)).drop_columns([HASH])

    def lookup_ends(self, data_file: DataFile, hashes: np.ndarray, count: int | np.ndarray,
                    largest: bool, read_file: Callable[[DataFile], pa.Table],
                    bounds: np.ndarray | None = None,
                    close_ties: bool = False) -> pa.Table | None:
        """For a run ordered by ``order_by``: per hash of ``hashes`` (sorted, unique
        ``uint64``), the ``count`` rows (one count for all, or one per hash) of ``data_file``
        of that hash with the largest (``largest``) or smallest ``order_by`` values, with their
        ``_hash`` and ``_cut``: True on the least extreme row taken of a hash that has more
        rows than its count (so every row of that hash whose value is strictly beyond the cut
        row's was taken; ties with it may not all be). With ``bounds`` (one value a hash, as
        ``orderable_numpy`` gives the ``order_by`` column), only the hash's rows not strictly
        beyond its bound count (``_OpenRun.beyond_at_ends``): those beyond are skipped, not
        read. With ``close_ties``, a cut takes the rows that tie with it too where the run's
        ``order_by`` values allow (``_OpenRun.closable``, ``tie_closed_ends``), and a column
        ``_closed`` says whether it did (a tie group beyond ``TIE_ROWS_PER_COUNT`` times the
        count stays cut). None as for ``lookup``."""
        if self.order_by is None or np.min(count) < 1:
            raise ValueError("lookup_ends needs a run ordered by a column and a count")
        reader = self._usable(data_file, read_file)
        if reader is None:
            return None
        hit, lo, hi = reader.ranges(hashes)
        if bounds is not None and len(hit):
            skipped = reader.beyond_at_ends(self.order_by, lo, hi, bounds[hit], largest)
            if largest:
                hi = hi - skipped
            else:
                lo = lo + skipped
        wanted = count[hit] if isinstance(count, np.ndarray) else count
        name = self.order_by
        ties: RangeValues | None = (
            (lambda rows: reader.values_at(name, rows),
             lambda a, b: reader.values_between(name, a, b))
            if close_ties and reader.closable(name) else None)
        taken = tie_closed_ends(lo, hi, wanted, largest, ties, lambda rows: reader.take(rows)
                                if len(rows) else self.run_schema.empty_table())
        return taken if close_ties else taken.drop_columns([CLOSED])

    def _usable(self, data_file: DataFile,
                read_file: Callable[[DataFile], pa.Table]) -> _OpenRun | None:
        """The open run of ``data_file`` for a lookup, or None when the caller is to read the
        data file (the run is being written, is missing and not built here, or unusable)."""
        if data_file.path not in self._open and self.pending(data_file):
            return None  # its run is being written: read the data file meanwhile
        try:
            return self._reader(data_file, read_file)  # None: missing and not built here
        except (OSError, pa.ArrowException) as e:
            log.warning("keyed run of %s unusable in %s (%s): reading the data file",
                        data_file.path, self.folder, e)
            return None

    def _reader(self, data_file: DataFile,
                read_file: Callable[[DataFile], pa.Table]) -> _OpenRun | None:
        opened = self._open.get(data_file.path)
        if opened is not None:
            self._open.move_to_end(data_file.path)
            return opened
        path, owner = self._path(data_file), self._owner_of(data_file)
        opened = _CHECKED.get(path, owner) if self.share_checked else None
        if opened is None:
            identity = _CHECKED.identity(path)
            reader = self._checked(data_file)
            if reader is None and not self.build_on_miss:
                self.build_later(data_file)  # for the next lookups; this one reads the file
                return None
            if reader is None:
                self._write(data_file, read_file(data_file))
                self.built += 1
                identity = _CHECKED.identity(path)
                reader = self._checked(data_file)
                if reader is None:  # written just now: only a failing disk gets here
                    raise OSError(f"the keyed run {path} of {data_file.path} "
                                  "cannot be read back")
            opened = _OpenRun.of(reader)
            if identity is not None and self.share_checked:
                _CHECKED.put(path, owner, identity, opened)
        self._open[data_file.path] = opened
        while len(self._open) > OPEN_RUNS:
            self._open.popitem(last=False)  # its memory map closes when no batch uses it
        return opened

    def _owner_of(self, data_file: DataFile) -> str:
        """What the run of ``data_file`` is checked against: this trace's run format and schema,
        and the data file's path, rows and ``_shard`` range."""
        return (f"{self._checked_as}|{data_file.path}|{data_file.rows}|"
                f"{data_file.shard_min}|{data_file.shard_max}")

    def _checked(self, data_file: DataFile) -> pa.ipc.RecordBatchFileReader | None:
        """The run of ``data_file`` if it is there, whole and of this file and format (see the
        module docstring); None otherwise. A run file that fails its checks is removed
        (``_reject``), so it is built again (``build_later`` builds only missing runs); one that
        cannot be opened or read now (a missing file, no file descriptor left, a read error)
        is left as it is."""
        path = self._path(data_file)
        try:
            mapped = pa.memory_map(path)
            identity = _identity_of(os.fstat(mapped.fileno()))  # (of the file opened)
        except OSError:
            return None
        try:
            reader = pa.ipc.open_file(mapped)
            whole = self._holds(reader, data_file, _TRUSTED.holds(path, identity))
        except (OSError, MemoryError):
            return None  # (a read that failed, not a run found damaged)
        except (ValueError, pa.ArrowException):  # not an Arrow file, or a checksum's text
            whole = False
        if not whole:
            _reject(path, identity)
            return None
        _TRUSTED.put(path, identity)
        return reader

    def _holds(self, reader: pa.ipc.RecordBatchFileReader, data_file: DataFile,
                trusted: bool) -> bool:
        """Whether the run ``reader`` opened is the run of ``data_file``: this trace's schema
        and format, the file's row count and ``_shard`` range, and every batch's checksum
        (only its presence when the run is ``trusted``: ``_TrustedRuns``)."""
        if not reader.schema.equals(self.run_schema.with_metadata(
                self._metadata(data_file)), check_metadata=True):
            return False
        batches = [reader.get_batch_with_custom_metadata(b)
                   for b in range(reader.num_record_batches)]
        if sum(batch.num_rows for batch, _ in batches) != data_file.rows:
            return False
        for batch, metadata in batches:
            recorded = None if metadata is None else metadata.get(CHECKSUM_KEY)
            if recorded is None or (not trusted and int(recorded) != _batch_checksum(batch)):
                return False  # a run of format 1, or bytes changed since it was written
        if batches and data_file.shard_min is not None and data_file.shard_max is not None:
            first = int(np.uint64(batches[0][0].column(HASH)[0].as_py()) >> _SHARD_SHIFT)
            last = int(np.uint64(batches[-1][0].column(HASH)[-1].as_py()) >> _SHARD_SHIFT)
            if first != data_file.shard_min or last != data_file.shard_max:
                return False
        return True

    # -- upkeep -------------------------------------------------------------------------------
    def retain(self, data_files: Iterable[DataFile | str]) -> int:
        """Delete the runs of every data file but ``data_files`` (and temporary files a crash
        left, older than ``TMP_GRACE_SECONDS``); returns how many files went."""
        keep = {os.path.basename(self._path(f)) for f in data_files}
        for path in [p for p in self._open if os.path.basename(self._path(p)) not in keep]:
            del self._open[path]
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        gone = 0
        stale = time.time() - TMP_GRACE_SECONDS
        for name in names:
            if name in keep:
                continue
            path = os.path.join(self.folder, name)
            try:
                if name.endswith(".tmp") and os.path.getmtime(path) > stale:
                    continue  # a run being written right now
                os.remove(path)
                gone += 1
            except FileNotFoundError:
                pass  # renamed into place or removed meanwhile
            _CHECKED.discard(path)  # its memory map holds the removed file's disk space
            _TRUSTED.discard(path)
        return gone

    def _path(self, data_file: DataFile | str) -> str:
        path = data_file if isinstance(data_file, str) else data_file.path
        return os.path.join(self.folder, hashlib.sha1(path.encode()).hexdigest()[:32] + ".arrow")


class _RunWriter:
    """The process's background writer of runs: one thread at a time, started when a run is
    handed over and ending when none has waited for ``IDLE_SECONDS`` (so a stream of steps,
    each handing over a run or two, starts it once, not a step); at most ``PENDING_WRITES``
    runs wait (more are dropped: built at first lookup). The thread is a daemon: the process
    waits at exit for the runs handed over (``_flush_at_exit``), not for the idle time."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        #: by the run's path
        self._jobs: OrderedDict[str, tuple[KeyedRuns, DataFile,
                                           pa.Table | Callable[[DataFile], pa.Table]]] = \
            OrderedDict()
        self._thread: threading.Thread | None = None
        #: runs dropped because too many waited (for tests and figures)
        self.dropped = 0
        #: while positive, the thread writes nothing (``held_writes``)
        self.held = 0

    def submit(self, runs: KeyedRuns, data_file: DataFile,
               rows: pa.Table | Callable[[DataFile], pa.Table]) -> bool:
        """Queue the run of ``data_file`` from ``rows``, or from the data file read by ``rows``
        when it is a reader; whether it was queued."""
        with self._lock:
            key = runs.run_path(data_file)
            if key in self._jobs:
                return False
            from_file = callable(rows)
            waiting = sum(callable(job[2]) == from_file for job in self._jobs.values())
            if waiting >= (PENDING_BUILDS if from_file else PENDING_WRITES):
                self.dropped += 1
                log.info("keyed run of %s left to its first lookup: %d runs wait",
                         data_file.path, waiting)
                return False
            self._jobs[key] = (runs, data_file, rows)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="keyed-run-writer",
                                                daemon=True)
                self._thread.start()
            self._lock.notify_all()
            return True

    def pending(self, run_path: str) -> bool:
        with self._lock:
            return run_path in self._jobs

    def flush(self) -> None:
        with self._lock:
            if self.held:
                raise RuntimeError("keyed runs: waiting for writes while they are held")
            while self._jobs:
                self._lock.wait()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._lock:
            self.held += 1
        try:
            yield
        finally:
            with self._lock:
                self.held -= 1
                self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while self.held and self._jobs:
                    self._lock.wait()
                if not self._jobs:
                    self._lock.wait_for(lambda: bool(self._jobs), IDLE_SECONDS)
                if not self._jobs:  # none came: the thread ends
                    self._thread = None
                    self._lock.notify_all()
                    return
                if self.held:
                    continue
                key, (runs, data_file, rows) = next(iter(self._jobs.items()))
            try:
                if not callable(rows):
                    runs.write_now(data_file, rows)
                elif not runs.exists(data_file):  # else built meanwhile (a lookup, a process)
                    runs.write_now(data_file, rows(data_file))
            except FileNotFoundError:  # the data file left the trace and was collected
                log.info("keyed run of %s not built: the data file is gone", data_file.path)
            except Exception:  # a cache: never let a run stop the engine
                log.exception("keyed run of %s not written to %s", data_file.path, runs.folder)
            with self._lock:
                del self._jobs[key]  # only after the rename: a lookup then finds the run
                self._lock.notify_all()


_WRITER = _RunWriter()


def _flush_at_exit() -> None:
    """At exit, the runs handed over are written first (the thread is a daemon); a process
    that holds writes leaves them."""
    if not _WRITER.held:
        _WRITER.flush()


def _forget_after_fork() -> None:
    """A forked child has no writer thread (nor the parent's runs to write): it starts its
    own at its first run."""
    global _WRITER
    _WRITER = _RunWriter()


atexit.register(_flush_at_exit)
os.register_at_fork(after_in_child=_forget_after_fork)


def held_writes() -> contextlib.AbstractContextManager[None]:
    """A context in which the background writer writes no run (runs handed over wait, up to
    ``PENDING_WRITES``): to see what lookups do while a run is not there yet."""
    return _WRITER.hold()


def wait_for_writes() -> None:
    """Wait until every run handed to this process's background writer is written (or given
    up): before measuring, in tests, before a process hands its local folder over."""
    _WRITER.flush()


def remove_other_traces(folder: str, traces: Iterable[str]) -> int:
    """Delete the runs of every trace in ``folder`` (``root.keyed_runs(root)``) but ``traces``
    (a trace no longer in the circuit's plan, e.g. one a state migration replaced); returns
    how many traces' runs went."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    live = set(traces)
    gone = [n for n in names if n not in live
            and os.path.isdir(os.path.join(folder, n))]
    for name in gone:
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    return len(gone)
