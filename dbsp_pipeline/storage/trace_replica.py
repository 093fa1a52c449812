"""An in-memory replica of a small trace: its rows sorted by key hash, for lookups by key.

A driver step looks up the keys it touches in every small trace it reads: an aggregate's
groups, a dimension joined with a stream of facts. Through the trace's files that is a search
in each keyed run, a filter of each small file kept in memory, and what they give is joined:
a lookup of 100 groups in 100k cost 1.6 ms, of 9.5k groups 10.6 ms (``make bench-lookup``'s
(c) and eager (b) at 1M orders). A replica holds the same rows in a few *pieces*, each sorted
by the key's 64-bit hash (the keyed runs' hash), so a lookup is a binary search and a take per
piece: 1.1 ms and 6.3 ms.

Never a second source of truth. A replica is the content of an exact set of immutable data
files (``files``, their paths), and the trace reads it only while that set is the trace's own
(``Trace.lookup_arrow``); any other change of the trace's files drops it (at once where the
trace makes the change, else at its next lookup, which finds the sets differ). It follows a
change only where the rows are in hand and the same: the trace's own append adds the appended
file's rows as a piece (``add``), and a merge, whose files hold the consolidated rows of the
files it replaces, either hands those rows over as a piece, sorted on the merge's thread, which
replaces the pieces of the merged files, or the pieces holding them are joined into one under
the new names (``merged``). It is built from the files themselves (the trace reads them all).
Nothing of it is written anywhere: a crash, a rollback, a restore or a layout change opens
traces anew, with no replica.

What a lookup returns is a Z-set equal to the rows of the wanted keys in the files (the same
sum), not always the same rows: the replica consolidates the rows of hashes that have several
when it is built and when it joins pieces (``_settle``), and a merge's piece is consolidated,
where the files may still hold a retraction and the row it cancels.

Pieces hold the rows of disjoint sets of files. A lookup may leave out the newest piece
(``lookup(..., without_newest=True)``: "the trace before this step's append", a join's lookup
of the other side's old rows). Pieces are joined into one when there are ``MAX_PIECES``, or the
small ones beside the biggest when they are ``SMALL_PIECES`` (see there).

Memory: a trace of at most ``MAX_ROWS`` rows gets a replica, and the replicas of a process hold
at most ``BUDGET_BYTES``; a replica that would grow beyond either is dropped, as is one its
trace appended to ``UNREAD_APPENDS`` times without a lookup reading it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

#: a replica holds at most this many rows; one is built only for a trace of at most half as
#: many (in its files), so a trace near the bound is not built and dropped again and again
MAX_ROWS = 1_000_000
#: the replicas of a process hold at most this many bytes (of Arrow buffers) in all
BUDGET_BYTES = 512 << 20
#: a replica its trace appended to this many times with no lookup reading it is dropped
UNREAD_APPENDS = 8
#: pieces before they are all merged into one, on the step's thread. A trace's merges (on the
#: driver, in the background) hand the replica their rows sorted (``merged``), so its pieces
#: rarely get there: an aggregate's 100k groups, 9.5k changed a step, are merged whole about
#: every seventh step (``trace.MAX_SIZE_AMPLIFICATION``), and merging them here each eighth
#: step cost more (12 ms a step) than the replica saved
MAX_PIECES = 32
#: the pieces beside the biggest (the appends and small merges since a merge of the biggest)
#: are merged into one when there are this many and they hold at most ``SMALL_ROWS`` rows: a
#: lookup's cost per piece (two searches and a take) is then not paid for each small append
SMALL_PIECES = 4
SMALL_ROWS = 65_536

#: a consolidation of a piece's rows (all payload columns and ``_shard``, weights summed, zero
#: weights dropped), in the trace's row schema
Consolidate = Callable[[pa.Table], pa.Table]
#: the key hash of each row of a table of the trace's rows (uint64)
KeyHashes = Callable[[pa.Table], np.ndarray]


@dataclass(frozen=True)
class Piece:
    """Rows sorted by their key's hash, with the hashes (``hashes[i]`` is row i's), and the
    data files whose rows they are (``paths``: the rows of exactly those files, consolidated
    or not)."""

    paths: frozenset[str]
    hashes: np.ndarray
    rows: pa.Table

    @classmethod
    def sorted_from(cls, paths: Iterable[str], rows: pa.Table, hashes: np.ndarray) -> Piece:
        """The piece of ``rows`` (key hashes ``hashes``), the rows of the files ``paths``."""
        order = np.argsort(hashes, kind="stable")
        return cls(frozenset(paths), hashes[order], rows.take(pa.array(order)))

    @cached_property
    def nbytes(self) -> int:
        """The bytes of its rows' Arrow buffers (whole buffers, even where the rows are a
        slice of one) and of its hashes, counted once."""
        return int(self.rows.get_total_buffer_size() + self.hashes.nbytes)

    @cached_property
    def distinct(self) -> bool:
        """Whether no two rows share a hash (a settled piece of an aggregate's groups, one
        row a key): then one search finds a hash's row."""
        return not bool((self.hashes[1:] == self.hashes[:-1]).any())

    def take(self, wanted: np.ndarray) -> pa.Table:
        """The rows whose hash is one of ``wanted`` (sorted, distinct)."""
        if len(self.hashes) == 0:
            return self.rows
        lo = np.searchsorted(self.hashes, wanted, "left")
        if self.distinct:  # a hash's row, if any, is at lo
            found = self.hashes[np.minimum(lo, len(self.hashes) - 1)] == wanted
            return self.rows.take(pa.array(lo[found]))
        hi = np.searchsorted(self.hashes, wanted, "right")
        count = hi - lo
        found = count > 0
        lo, count = lo[found], count[found]
        total = int(count.sum())
        if total == 0:
            return self.rows.slice(0, 0)
        rows = np.repeat(lo - (np.cumsum(count) - count), count) + np.arange(total)
        return self.rows.take(pa.array(rows))


class TraceReplica:
    """The rows of the data files ``files`` (paths) of one trace, in memory, sorted by key hash
    in pieces (see the module docstring). Used and changed on one thread (the step's)."""

    def __init__(self, pieces: list[Piece]) -> None:
        self._pieces = pieces
        self.files = frozenset().union(*(p.paths for p in pieces))
        #: whether the newest piece holds exactly the rows of its one file and no other piece
        #: holds any of them (``readable``)
        self._newest_alone = False
        #: appends since a lookup last read the replica
        self.unread_appends = 0
        with _LIVE_LOCK:
            _LIVE.add(self)

    @classmethod
    def build(cls, files: Iterable[str], rows: pa.Table, hashes: np.ndarray,
              consolidate: Consolidate, key_hashes: KeyHashes) -> TraceReplica:
        """The replica of ``files``, whose rows (all of them) are ``rows`` with key hashes
        ``hashes``."""
        return cls([_settle(Piece.sorted_from(files, rows, hashes), consolidate, key_hashes)])

    @property
    def rows(self) -> int:
        return sum(p.rows.num_rows for p in self._pieces)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._pieces)

    @property
    def pieces(self) -> int:
        return len(self._pieces)

    def covers(self, files: Iterable[str]) -> bool:
        """Whether the replica is of exactly the data files ``files``."""
        return self.files == frozenset(files)

    def readable(self, files: Iterable[str]) -> bool | None:
        """How a lookup in exactly ``files`` reads the replica: False for all of it, True for
        all but the newest piece (``files`` are the replica's files but the newest piece's
        one file), None if it cannot."""
        wanted = frozenset(files)
        if wanted == self.files:
            return False
        if self._newest_alone and wanted == self.files - self._pieces[-1].paths:
            return True
        return None

    def lookup(self, hashes: np.ndarray, without_newest: bool = False) -> pa.Table:
        """The rows whose key hash is one of ``hashes`` (sorted, distinct): a Z-set equal to
        those rows in the files; with ``without_newest``, leaving out the newest piece's."""
        self.unread_appends = 0
        pieces = self._pieces[:-1] if without_newest else self._pieces
        parts = [p.take(hashes) for p in pieces]
        parts = [t for t in parts if t.num_rows] or parts[:1]
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def add(self, path: str, rows: pa.Table, hashes: np.ndarray, consolidate: Consolidate,
            key_hashes: KeyHashes) -> None:
        """The trace appended the data file ``path``, holding exactly ``rows`` (key hashes
        ``hashes``). Before the piece would be the ``MAX_PIECES``-th, the others are merged
        into one; before it would be the ``SMALL_PIECES + 1``-th beside the biggest, those are,
        if small."""
        biggest = max(self._pieces, key=lambda p: p.rows.num_rows)
        others = [p for p in self._pieces if p is not biggest]
        if len(self._pieces) >= MAX_PIECES:
            self._pieces = [_joined(self._pieces, consolidate, key_hashes)]
        elif len(others) >= SMALL_PIECES and sum(p.rows.num_rows for p in others) <= SMALL_ROWS:
            self._pieces = [biggest, _joined(others, consolidate, key_hashes)]
        self._pieces.append(Piece.sorted_from([path], rows, hashes))
        self.files = self.files | {path}
        self._newest_alone = True
        self.unread_appends += 1

    def merged(self, gone: Iterable[str], new: Sequence[str], piece: Piece | None) -> bool:
        """A merge replaced the data files ``gone`` by ``new``, which hold their rows
        consolidated: the same content under other names. Given the merge's rows as a
        ``piece`` (of ``new``), and if ``gone`` are the files of whole pieces, those pieces
        are replaced by it (consolidated, and one piece for many); otherwise the pieces stay,
        joined into one, of their other files and ``new``. Each piece holds the rows of
        exactly its ``paths``, no two pieces the same file's. False (nothing changed) when
        ``gone`` are not all the replica's."""
        gone = frozenset(gone)
        if not gone <= self.files:
            return False
        touched = [p for p in self._pieces if p.paths & gone]
        newest = self._pieces[-1]
        if piece is not None and piece.paths == frozenset(new) and all(
                p.paths <= gone for p in touched) and frozenset().union(
                *(p.paths for p in touched)) == gone:
            self._pieces = [piece, *(p for p in self._pieces if not p.paths & gone)]
        elif touched:  # the pieces holding them become one, of their other files and ``new``
            joined = _concatenated(touched)
            joined = Piece(joined.paths - gone | frozenset(new), joined.hashes, joined.rows)
            self._pieces = [joined, *(p for p in self._pieces if not p.paths & gone)]
        self.files = (self.files - gone) | frozenset(new)
        self._newest_alone = self._newest_alone and self._pieces[-1] is newest
        return True


def within_budget(rows: int = 0, nbytes: int = 0) -> bool:
    """Whether ``rows`` more rows of ``nbytes`` more bytes fit: in a replica (``MAX_ROWS``) and
    beside the replicas alive in this process (``BUDGET_BYTES``)."""
    with _LIVE_LOCK:
        held = sum(r.nbytes for r in list(_LIVE))
    return rows <= MAX_ROWS and held + nbytes <= BUDGET_BYTES


def _concatenated(pieces: Sequence[Piece]) -> Piece:
    """One piece of the rows of ``pieces`` (of all their files), as they are."""
    return Piece.sorted_from(frozenset().union(*(p.paths for p in pieces)),
                             pa.concat_tables([p.rows for p in pieces]),
                             np.concatenate([p.hashes for p in pieces]))


def _joined(pieces: Sequence[Piece], consolidate: Consolidate, key_hashes: KeyHashes) -> Piece:
    """One piece of the rows of ``pieces`` (of all their files), settled (``_settle``)."""
    return _settle(_concatenated(pieces), consolidate, key_hashes)


def _settle(piece: Piece, consolidate: Consolidate, key_hashes: KeyHashes) -> Piece:
    """``piece`` with the rows of each hash that has several consolidated (a retraction and
    the row it cancels go; rows of one hash are one key, or a few colliding ones, whose rows
    the consolidation keeps apart)."""
    h = piece.hashes
    if len(h) < 2:
        return piece
    repeated = np.zeros(len(h), dtype=bool)
    same = h[1:] == h[:-1]
    repeated[1:] |= same
    repeated[:-1] |= same
    if not repeated.any():
        return piece
    settled = consolidate(piece.rows.filter(pa.array(repeated)))
    single = piece.rows.filter(pa.array(~repeated))
    return Piece.sorted_from(piece.paths, pa.concat_tables([single, settled]),
                             np.concatenate([h[~repeated], key_hashes(settled)]))


#: the replicas alive in this process (for ``within_budget``), and the lock of the set
_LIVE: weakref.WeakSet[TraceReplica] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
