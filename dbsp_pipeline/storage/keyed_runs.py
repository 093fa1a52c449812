"""Keyed runs: a local, memory-mapped copy of a trace's big data files, sorted by key hash, so a
lookup of K keys costs about K x log(rows) plus the rows it finds, not a scan.

A trace's Delta data files (``trace.py``) are Parquet, sorted by ``_shard``, and a reader
can skip only whole files and row groups by their ``_shard`` range: a change touching more than a
few hundred keys of a big trace reads nearly all of it. Each big data file therefore gets a
*run*: the same rows, plus their key's full 64-bit hash (``_hash``, Spark's ``xxhash64`` as an
unsigned number, whose top bits are the ``_shard``), sorted by it, in an uncompressed Arrow IPC
file on local disk. A lookup memory-maps the run, finds each wanted hash by binary search
(``numpy.searchsorted`` touches about log(rows) pages) and takes the rows in the ranges found;
only those pages are read from disk. The searches are ``run_search.py``'s (an ``OpenRun``); this
module keeps the run files: builds, checks, opens, trusts and removes them.

Ordered runs, for min/max. The runs of a trace of (group, value) rows (``order_by``: a min/max
aggregate's values) are sorted by the value too within each hash, in Arrow's order (NaN above
every number, ``-0.0`` equal to ``0.0``: DuckDB's, which decides min/max). ``lookup_ends`` then
takes only the ``count`` largest (or smallest) rows of each wanted hash and marks the last row
taken of a hash that has more (``_cut``): every row of that hash beyond the cut's value was
taken, so a group's live extreme is found from a few rows a file instead of all its values
(``Trace.lookup_extreme_rows``). Asked to (``close_ties``: a top-k's rows, whose values tie
many ways), it takes the rows that tie with the cut row too (``run_search.tie_closed_counts``),
so the rows at the cut's value are all in hand as well and a tie group is read in one round.

Never a second source of truth. A run is a pure function of one immutable data file: it is named
by the data file's path (a hash of it) and, every time a process opens it, checked against
what it must be: the trace's schema, the data file's row count and size, the key columns and
the hash function it was sorted by (``RUN_FORMAT``, in the schema's metadata), and its first
and last hash against the file's ``_shard`` range; and its bytes against the checksum each
record batch carries (XXH3-64) (``_batch_checksum``, in the batch's metadata): bytes changed on the
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
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import xxhash

from dbsp_pipeline.storage.run_search import (
    CLOSED,
    HASH,
    OpenRun,
    RangeValues,
    concat_ranges,
    tie_closed_ends,
    value_order,
)
from dbsp_pipeline.storage.table_store import DataFile

#: data files with fewer rows than this get no run (they are read whole)
MIN_ROWS = 16_384
#: rows per record batch of a run (each batch is searched on its own; fewer, bigger batches
#: mean fewer searches per lookup)
BATCH_ROWS = 1 << 20
#: what a run is sorted by, recorded in its schema's metadata: a run of another format (an
#: engine whose hash differs; format 1's runs, whose batches carry no checksum; format 2's,
#: whose batches carry a CRC-32, five times slower to check) is rebuilt; an ordered run's adds
#: ``;then:<column>``
RUN_FORMAT = "3:xxhash64-spark-seed42"
#: a run's record batch's metadata: the XXH3-64 of the batch's buffers (``_batch_checksum``)
CHECKSUM_KEY = b"dbsp.xxh3"
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

#: the top bits of a key hash that are its ``_shard`` (``zset.SHARD_BITS``)
_SHARD_SHIFT = np.uint64(64 - 10)

log = logging.getLogger(__name__)


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
        self._runs: OrderedDict[str, tuple[str, tuple[int, int, int, int], OpenRun]] = \
            OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def identity(path: str) -> tuple[int, int, int, int] | None:
        """The identity of the file at ``path`` now; None when there is none."""
        try:
            return _identity_of(os.stat(path))
        except OSError:
            return None

    def get(self, path: str, owner: str) -> OpenRun | None:
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
            run: OpenRun) -> None:
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
    """The XXH3-64 of a run's record batch: of its columns' buffers one after the other
    (validity, offsets, values, children's), as a reader of the run file gets them (``_write``
    checksums the batch read back from its serialized form, which holds the same buffers).
    About 20 GB/s here, where CRC-32 (format 2) took 4 GB/s: a Spark task that opened a
    worker's new runs spent up to 33 ms of a 400 ms step checking them."""
    digest = xxhash.xxh3_64()
    for column in batch.columns:
        for buffer in column.buffers():
            if buffer is not None:
                digest.update(buffer)
    return digest.intdigest()


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
        self._open: OrderedDict[str, OpenRun] = OrderedDict()
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
        ``run_search.orderable_numpy`` gives the ``order_by`` column), only the hash's rows not
        strictly beyond its bound count (``OpenRun.beyond_at_ends``): those beyond are skipped,
        not read. With ``close_ties``, a cut takes the rows that tie with it too where the
        run's ``order_by`` values allow (``OpenRun.closable``, ``tie_closed_ends``), and a
        column ``_closed`` says whether it did (a tie group beyond
        ``run_search.TIE_ROWS_PER_COUNT`` times the count stays cut). None as for
        ``lookup``."""
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
                read_file: Callable[[DataFile], pa.Table]) -> OpenRun | None:
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
                read_file: Callable[[DataFile], pa.Table]) -> OpenRun | None:
        opened = self._open.get(data_file.path)
        if opened is not None:
            self._open.move_to_end(data_file.path)
            return opened
        path, owner = self._path(data_file), self._owner_of(data_file)
        opened = _CHECKED.get(path, owner) if self.share_checked else None
        if opened is None:
            identity = _CHECKED.identity(path)
            opened = self._checked(data_file)
            if opened is None and not self.build_on_miss:
                self.build_later(data_file)  # for the next lookups; this one reads the file
                return None
            if opened is None:
                self._write(data_file, read_file(data_file))
                self.built += 1
                identity = _CHECKED.identity(path)
                opened = self._checked(data_file)
                if opened is None:  # written just now: only a failing disk gets here
                    raise OSError(f"the keyed run {path} of {data_file.path} "
                                  "cannot be read back")
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

    def _checked(self, data_file: DataFile) -> OpenRun | None:
        """The run of ``data_file``, opened, if it is there, whole and of this file and format
        (see the module docstring); None otherwise. A run file that fails its checks is removed
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
            batches = self._batches_if_whole(reader, data_file, _TRUSTED.holds(path, identity))
        except (OSError, MemoryError):
            return None  # (a read that failed, not a run found damaged)
        except (ValueError, pa.ArrowException):  # not an Arrow file, or a checksum's text
            batches = None
        if batches is None:
            _reject(path, identity)
            return None
        _TRUSTED.put(path, identity)
        return OpenRun.of(reader, batches)

    def _batches_if_whole(self, reader: pa.ipc.RecordBatchFileReader, data_file: DataFile,
                          trusted: bool) -> list[pa.RecordBatch] | None:
        """The record batches of the run ``reader`` opened, if it is the run of ``data_file``
        (else None): this trace's schema and format, the file's row count and ``_shard`` range,
        and every batch's checksum (only its presence when the run is ``trusted``:
        ``_TrustedRuns``). The batches are got once, for the checks and the open run alike."""
        if not reader.schema.equals(self.run_schema.with_metadata(
                self._metadata(data_file)), check_metadata=True):
            return None
        batches = [reader.get_batch_with_custom_metadata(b)
                   for b in range(reader.num_record_batches)]
        if sum(batch.num_rows for batch, _ in batches) != data_file.rows:
            return None
        for batch, metadata in batches:
            recorded = None if metadata is None else metadata.get(CHECKSUM_KEY)
            if recorded is None or (not trusted and int(recorded) != _batch_checksum(batch)):
                return None  # a run of format 1, or bytes changed since it was written
        if batches and data_file.shard_min is not None and data_file.shard_max is not None:
            first = int(np.uint64(batches[0][0].column(HASH)[0].as_py()) >> _SHARD_SHIFT)
            last = int(np.uint64(batches[-1][0].column(HASH)[-1].as_py()) >> _SHARD_SHIFT)
            if first != data_file.shard_min or last != data_file.shard_max:
                return None
        return [batch for batch, _ in batches]

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
