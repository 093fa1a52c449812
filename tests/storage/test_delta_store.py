"""A Delta table store reloads the version it committed behind the commit: a commit bound to a
version returns at once, the next use of the handle waits for the reload, and a reload that
failed is run again there (raising if it fails again). The conformance suite
(``test_table_store_conformance.py``) runs every contract of the store over it as well."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from dbsp_pipeline.errors import ConcurrentWriterError, StorageError
from dbsp_pipeline.storage import write_behind
from dbsp_pipeline.storage.delta_store import DeltaTableStore
from dbsp_pipeline.storage.table_store import open_table_store

SCHEMA = pa.schema([("key", pa.string()), ("_step", pa.int64())])


def store_at(tmp_path) -> DeltaTableStore:
    store = open_table_store(str(tmp_path / "t"), SCHEMA)
    assert isinstance(store, DeltaTableStore)
    return store


def add(store: DeltaTableStore, key: str) -> int:
    adds = store.write_arrow(pa.table({"key": [key], "_step": [1]}, schema=SCHEMA))
    return store.commit(adds, expected_version=store.version() + 1)


def keys(store: DeltaTableStore) -> list[str]:
    files = store.files(refresh=False)
    return sorted(store.read_arrow([f.path for f in files]).column("key").to_pylist())


def hold_background() -> threading.Event:
    """Occupy the background thread until the returned event is set."""
    release = threading.Event()
    write_behind.run_behind(lambda: release.wait(30))
    return release


def test_the_next_use_of_the_handle_waits_for_the_reload_behind_a_commit(tmp_path):
    store = store_at(tmp_path)
    assert add(store, "a") == 1
    release = hold_background()
    try:
        assert add(store, "b") == 2  # returns while its reload waits behind the held thread
        loading = store._loading
        assert loading is not None and not loading.done()
        threading.Timer(0.2, release.set).start()
        # without a refresh of its own: the handle is at the committed version once used
        assert store.version(refresh=False) == 2
        assert loading.done() and keys(store) == ["a", "b"]
    finally:
        release.set()
    assert add(store, "c") == 3 and keys(store) == ["a", "b", "c"]


def test_a_reload_that_failed_behind_is_run_again_by_the_next_use(tmp_path):
    store = store_at(tmp_path)
    add(store, "a")
    handle = store._loaded
    update = handle.update_incremental
    calls = []

    def failing() -> None:
        calls.append(threading.current_thread().name)
        raise OSError("the log is unreadable")

    handle.update_incremental = failing  # type: ignore[method-assign]
    try:
        assert add(store, "b") == 2
        with pytest.raises(StorageError, match="reading the log of .* failed"):
            store.version(refresh=False)  # run again here, and it fails again
        assert calls[0].startswith("dbsp-write-behind") and len(calls) == 2
    finally:
        handle.update_incremental = update  # type: ignore[method-assign]
    assert store.version(refresh=False) == 1  # still the version loaded before
    assert store.version() == 2 and keys(store) == ["a", "b"]


def test_a_reload_that_failed_once_is_not_noticed(tmp_path):
    store = store_at(tmp_path)
    add(store, "a")
    handle = store._loaded
    update = handle.update_incremental

    def fails_once() -> None:
        handle.update_incremental = update  # type: ignore[method-assign]
        raise OSError("a passing error")

    handle.update_incremental = fails_once  # type: ignore[method-assign]
    assert add(store, "b") == 2
    assert store.version(refresh=False) == 2 and keys(store) == ["a", "b"]


def test_a_writer_that_lost_the_next_version_learns_it_at_its_next_commit(tmp_path):
    mine, theirs = store_at(tmp_path), store_at(tmp_path)
    assert add(mine, "a") == 1
    theirs.version()
    adds = theirs.write_arrow(pa.table({"key": ["x"], "_step": [1]}, schema=SCHEMA))
    assert theirs.commit(adds, expected_version=2) == 2
    adds = mine.write_arrow(pa.table({"key": ["b"], "_step": [1]}, schema=SCHEMA))
    with pytest.raises(ConcurrentWriterError):
        mine.commit(adds, expected_version=2)
    assert keys(theirs) == ["a", "x"]

