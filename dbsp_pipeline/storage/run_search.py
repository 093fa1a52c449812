"""Searching a sorted run in memory: where the rows of given key hashes are, and a key's
leading rows by a value, at about K x log(rows) for K hashes.

A run (``keyed_runs.py``: a trace's data file as an Arrow IPC file on local disk, memory-mapped)
holds its rows sorted by their key's 64-bit hash (``_hash``), and, in an ordered run (a min/max
aggregate's or a top-k's values), by the value within each hash. ``OpenRun`` is such a run
opened: ``ranges`` finds each wanted hash's rows by binary search (through a *fence* or a merge
when many hashes are wanted at once) in the record batches that may hold it, ``take`` gets
them. The functions after it work on ranges of rows sorted by value, of a run or of a small
file sorted in memory alike (``Trace._beyond_cuts``): a range's most extreme ``count`` rows
(``ends_of_ranges``), with the rows that tie with the last one taken (``tie_closed_counts``),
and how many rows at a range's end lie beyond a bound (``rows_at_end``).

Pure: reads the arrays it is given, writes no file, keeps no state but an ``OpenRun``'s views.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the column of a run holding the key's 64-bit hash, as an unsigned number, sorted
HASH = "_hash"
#: the column ``lookup_ends`` adds: the least extreme row taken of a hash with more rows
CUT = "_cut"
#: the column ``lookup_ends(..., close_ties=True)`` adds: whether its cuts are tie-closed (every
#: row of the hash that ties with the cut row was taken too), the same on every row
CLOSED = "_closed"
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


@dataclass(frozen=True)
class OpenRun:
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
    def of(cls, file: pa.ipc.RecordBatchFileReader,
           batches: Sequence[pa.RecordBatch] | None = None) -> OpenRun:
        """The run ``file`` opened; ``batches``: its record batches, when the caller got them
        already (all of them, in order)."""
        if batches is None:
            batches = [file.get_batch(b) for b in range(file.num_record_batches)]
        batches = [batch for batch in batches if batch.num_rows]
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
    rows beyond are one piece at that end (``OpenRun.beyond_at_ends``)."""
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
    it: "left"; last, those at or below it: "right"). ``OpenRun.ranges`` of 1M hashes in a
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
