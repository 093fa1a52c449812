"""Data files written, and Delta tables refreshed, behind a driver step's computation.

A driver step appends to several traces (a join's two sides, an aggregate's state and values),
and each append writes one small Parquet file: about a millisecond each, mostly the file's
creation and encoding, during which the step's thread waited. A ``StagedTable`` that writes
behind (``StagedTable.stage_new_file``) hands the write to this module's one background thread
and goes on at once with a ``PendingFile``: the file's path is chosen first
(``data_files.new_file_path``), and what the trace needs of the file (its ``DataFile``: path,
rows, ``_shard`` and ``_step`` ranges) is read off the rows in hand, equal to what the written
file's statistics give (``DataFile.from_rows``). Encoding and writing Parquet release the GIL,
so the write runs beside the step's next operators.

Contract (what makes a pending file safe):

* a ``StagedTable`` waits for its pending files before anything reads one through it
  (``read``/``read_arrow``), before it records or folds its staged actions, before it unstages
  one, and before it is rolled back (``load``);
* the step protocol waits for every pending file at the end of a step's computation, before
  anything of the step is recorded (``StateDatabase.wait_for_writes``,
  ``runtime/step_protocol.py``): outside a step's computation no file is pending, so the
  compactor, garbage collection, a Spark step and a reader of the root see only written files.

The same thread runs other work a step need not wait for (``run_behind``): a Delta table's
reload of the version it has just committed (``storage/delta_store.py``'s ``_refresh_behind``),
which whoever uses the table next waits for.

Durability: none of its own. A pending file is an uncommitted data file like any other: until a
checkpoint records it, a crash leaves it an orphan (or leaves it unwritten), and garbage
collection deletes orphans (``storage/garbage.py``). A write that fails raises its
``StorageError`` (definitely failed) from the wait, inside the step's computation, so the step
fails and is rolled back exactly as when the write failed on the step's thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from deltalake.transaction import AddAction

from dbsp_pipeline.storage.table_store import DataFile

T = TypeVar("T")


@dataclass(frozen=True)
class PendingFile:
    """A data file being written in the background: its ``DataFile`` (known from its rows) and
    the future of its add action."""

    data_file: DataFile
    future: Future[list[AddAction]]

    def add_action(self) -> AddAction:
        """The file's add action, once written (waits; raises the write's error)."""
        adds = self.future.result()
        if len(adds) != 1:
            raise AssertionError(f"a write behind gave {len(adds)} files for "
                                 f"{self.data_file.path}")
        return adds[0]

    def wait(self) -> None:
        """Wait until the write ended, failed or not (nothing raised)."""
        self.future.exception()


_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def submit(data_file: DataFile, write: Callable[[], list[AddAction]]) -> PendingFile:
    """Run ``write`` (which writes the file ``data_file`` describes and returns its add action)
    in the background writer, after the work submitted before it."""
    return PendingFile(data_file, run_behind(write))


def run_behind(work: Callable[[], T]) -> Future[T]:
    """Run ``work`` in the background thread, after the work submitted before it. ``work``
    must not wait for other work of this thread (it would wait for ever)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dbsp-write-behind")
        return _executor.submit(work)


def _forget_after_fork() -> None:
    """A forked child has no writer thread: it starts its own at its first write."""
    global _executor, _lock
    _executor = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
