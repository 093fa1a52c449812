"""Keyed runs: a local, memory-mapped copy of a trace's big data files, sorted by key hash, so a
lookup of K keys costs about K x log(rows) plus the rows it finds, not a scan.

A trace's Delta data files (``trace.py``) are Parquet, sorted by ``(_shard, key)``, and a reader
can skip only whole files and row groups by their ``_shard`` range: a change touching more than a
few hundred keys of a big trace reads nearly all of it. Each big data file therefore gets a
*run*: the same rows, plus their key's full 64-bit hash (``_hash``, Spark's ``xxhash64`` as an
unsigned number, whose top bits are the ``_shard``), sorted by it, in an uncompressed Arrow IPC
file on local disk. A lookup memory-maps the run, finds each wanted hash by binary search
(``numpy.searchsorted`` touches about log(rows) pages) and takes the rows in the ranges found;
only those pages are read from disk.

Never a second source of truth. A run is a pure function of one immutable data file: it is named
by the data file's path (a hash of it) and checked against the file's row count and the trace's
schema every time it is opened. A run that is missing, cut short, of another schema or otherwise
unreadable is rebuilt from the data file, never trusted; deleting the whole folder loses nothing
but the time to rebuild. Runs are written to a temporary file, flushed to disk (``fsync``) and
renamed into place, so a crash or a power loss leaves the old state (no run) or a whole run.
Which files a lookup reads is decided by the trace's Delta version, as before, so crash
rollback, restore and time travel need nothing from here.

Small files (under ``MIN_ROWS``) get no run: reading them whole costs less than keeping a copy,
and the trace's compaction merges them into big ones soon.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa

from dbsp_pipeline.storage.table_store import DataFile

#: the column of a run holding the key's 64-bit hash, as an unsigned number, sorted
HASH = "_hash"
#: data files with fewer rows than this get no run (they are read whole)
MIN_ROWS = 16_384
#: rows per record batch of a run (each batch is searched on its own; fewer, bigger batches
#: mean fewer searches per lookup)
BATCH_ROWS = 1 << 20


class KeyedRuns:
    """The runs of one trace, in the local folder ``folder``, for rows of Arrow schema
    ``schema`` (the trace's table schema); ``hash_of`` computes the key hash of rows of that
    schema (``uint64``)."""

    def __init__(self, folder: str, schema: pa.Schema,
                 hash_of: Callable[[pa.Table], np.ndarray]) -> None:
        self.folder = folder
        self.schema = schema
        self.run_schema = schema.append(pa.field(HASH, pa.uint64(), False))
        self._hash_of = hash_of
        #: runs opened by this process, by data file path (memory maps; the files never change)
        self._open: dict[str, pa.ipc.RecordBatchFileReader] = {}
        #: how many runs this process built from their data files (for tests and figures)
        self.built = 0

    # -- building -----------------------------------------------------------------------------
    def add(self, data_file: DataFile, rows: pa.Table) -> None:
        """Write the run of ``data_file``, whose rows (in any order) are ``rows``, if it is big
        enough to get one and has none yet. For the writer of a data file, which has its rows
        in hand: the run then costs no read."""
        if data_file.rows >= MIN_ROWS and not os.path.exists(self._path(data_file)):
            self._write(data_file, rows)

    def _write(self, data_file: DataFile, rows: pa.Table) -> None:
        hashes = self._hash_of(rows)
        order = np.argsort(hashes, kind="stable")
        run = rows.select(self.schema.names).cast(self.schema).take(pa.array(order))
        run = run.append_column(self.run_schema.field(HASH), pa.array(hashes[order]))
        os.makedirs(self.folder, exist_ok=True)
        path = self._path(data_file)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            with pa.ipc.new_file(fh, self.run_schema) as writer:
                writer.write_table(run, max_chunksize=BATCH_ROWS)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    # -- reading ------------------------------------------------------------------------------
    def covers(self, data_file: DataFile) -> bool:
        """Whether lookups in ``data_file`` go through its run (it is big enough to have one)."""
        return data_file.rows >= MIN_ROWS

    def lookup(self, data_file: DataFile, hashes: np.ndarray,
               read_file: Callable[[DataFile], pa.Table]) -> pa.Table:
        """The rows of ``data_file`` (in trace schema) whose key hash is one of ``hashes``
        (sorted, unique ``uint64``). Uses the file's run, built first from ``read_file(
        data_file)`` (its rows) when there is none or the one there is not whole."""
        reader = self._reader(data_file, read_file)
        parts: list[pa.RecordBatch] = []
        for b in range(reader.num_record_batches):
            batch = reader.get_batch(b)
            column = batch.column(HASH).to_numpy()
            lo = np.searchsorted(column, hashes, "left")
            hi = np.searchsorted(column, hashes, "right")
            found = hi - lo
            total = int(found.sum())
            if total == 0:
                continue
            starts = np.repeat(lo - (np.cumsum(found) - found), found)
            parts.append(batch.take(pa.array(starts + np.arange(total))))
        if not parts:
            return self.schema.empty_table()
        return pa.Table.from_batches(parts, self.run_schema).drop_columns([HASH])

    def _reader(self, data_file: DataFile,
                read_file: Callable[[DataFile], pa.Table]) -> pa.ipc.RecordBatchFileReader:
        reader = self._open.get(data_file.path)
        if reader is not None:
            return reader
        reader = self._checked(data_file)
        if reader is None:
            self._write(data_file, read_file(data_file))
            self.built += 1
            reader = self._checked(data_file)
            if reader is None:  # written just now: only a failing disk gets here
                raise OSError(f"the keyed run {self._path(data_file)} of {data_file.path} "
                              "cannot be read back")
        self._open[data_file.path] = reader
        return reader

    def _checked(self, data_file: DataFile) -> pa.ipc.RecordBatchFileReader | None:
        """The run of ``data_file`` if it is there and whole (readable, of the run schema, with
        the file's row count); None otherwise."""
        try:
            reader = pa.ipc.open_file(pa.memory_map(self._path(data_file)))
            if not reader.schema.equals(self.run_schema):
                return None
            rows = sum(reader.get_batch(b).num_rows for b in range(reader.num_record_batches))
        except (OSError, pa.ArrowInvalid):
            return None
        return reader if rows == data_file.rows else None

    # -- upkeep -------------------------------------------------------------------------------
    def retain(self, data_files: Iterable[DataFile | str]) -> int:
        """Delete the runs of every data file but ``data_files`` (and temporary files left by a
        crash); returns how many files went."""
        keep = {os.path.basename(self._path(f)) for f in data_files}
        self._open = {p: r for p, r in self._open.items()
                      if os.path.basename(self._path(p)) in keep}
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        gone = 0
        for name in names:
            if name not in keep:
                try:
                    os.remove(os.path.join(self.folder, name))
                    gone += 1
                except FileNotFoundError:
                    pass
        return gone

    def _path(self, data_file: DataFile | str) -> str:
        path = data_file if isinstance(data_file, str) else data_file.path
        return os.path.join(self.folder, hashlib.sha1(path.encode()).hexdigest()[:32] + ".arrow")
