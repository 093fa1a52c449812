"""One conformance suite for every ``TableStore``: local disk, S3 (a real SeaweedFS server) and
the fault-injecting wrapper (unarmed, it must be its inner store exactly).

A backend is done when these pass against it. The race tests are the proof of fencing: two
handles loaded at the same version commit at the next one; exactly one wins, the other gets
``ConcurrentWriterError`` and nothing of its commit is visible. On S3 that rests on the store's
conditional put alone.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake.exceptions import DeltaError

from dbsp_pipeline.errors import ConcurrentWriterError, StorageError
from dbsp_pipeline.storage.table_store import ACTIONS_KEY, TableStore, open_table_store
from dbsp_pipeline.testing import FaultInjectingTableStore
from tests.object_store_helpers import new_bucket

SCHEMA = pa.schema([("key", pa.string()), ("_step", pa.int64())])
Opener = Callable[[], TableStore]


@pytest.fixture(scope="module")
def s3_bucket(object_store: dict[str, str]) -> str:
    return new_bucket(object_store, "conformance")


@pytest.fixture(params=["local", "s3", "fault_injecting"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens (a new handle on) one fresh table in the backend under test."""
    if request.param == "s3":
        settings = request.getfixturevalue("object_store")
        bucket = request.getfixturevalue("s3_bucket")
        uri = f"s3://{bucket}/{uuid.uuid4().hex[:8]}/table"
        return lambda: open_table_store(uri, SCHEMA, storage_options=settings)
    uri = str(tmp_path / "table")
    if request.param == "fault_injecting":
        return lambda: FaultInjectingTableStore(open_table_store(uri, SCHEMA), "conformance")
    return lambda: open_table_store(uri, SCHEMA)


def rows(keys: list[str], step: int = 1) -> pa.Table:
    return pa.table({"key": keys, "_step": [step] * len(keys)}, schema=SCHEMA)


def keys_of(store: TableStore, version: int | None = None) -> list[str]:
    files = store.files(version)
    return sorted(store.read_arrow([f.path for f in files]).column("key").to_pylist())


def test_create_then_reopen_sees_an_empty_table(open_store: Opener) -> None:
    store = open_store()
    assert isinstance(store, TableStore)
    assert store.version() == 0
    assert store.files() == []
    again = open_store()
    assert again.version() == 0 and again.schema == SCHEMA


def test_written_files_are_invisible_until_committed(open_store: Opener) -> None:
    store = open_store()
    adds = store.write_arrow(rows(["a", "b"], step=4))
    assert len(adds) == 1 and store.write_arrow(rows([])) == []
    assert store.files() == [] and store.version() == 0
    assert [f.path for f in store.stored_data_files()] == [store.path(adds[0].path)]
    assert store.commit(adds, expected_version=1) == 1
    (committed,) = store.files()
    assert (committed.path, committed.rows) == (store.path(adds[0].path), 2)
    assert (committed.step_min, committed.step_max) == (4, 4)
    assert keys_of(store) == ["a", "b"]
    where = pc.field("key") == "b"
    assert store.read_arrow([committed.path], where, ["key"]).to_pylist() == [{"key": "b"}]


def test_racing_writers_at_one_version_exactly_one_wins(open_store: Opener) -> None:
    store = open_store()
    store.commit(store.write_arrow(rows(["base"])), expected_version=1)
    first, second = open_store(), open_store()
    assert first.version() == second.version() == 1
    mine, theirs = first.write_arrow(rows(["first"])), second.write_arrow(rows(["second"]))
    assert first.commit(mine, expected_version=2) == 2
    with pytest.raises(ConcurrentWriterError):
        second.commit(theirs, app_id="second", app_version=1, expected_version=2)
    reader = open_store()
    assert reader.version() == 2
    assert keys_of(reader) == ["base", "first"]
    assert reader.transaction_version("second") is None


def test_concurrent_commits_for_one_version_exactly_one_wins(open_store: Opener) -> None:
    """Both handles commit at the same instant (threads behind a barrier), several rounds."""
    for round_ in range(1, 4):
        handles = [open_store(), open_store()]
        assert {h.version() for h in handles} == {round_ - 1}
        adds = [h.write_arrow(rows([f"r{round_}-{i}"])) for i, h in enumerate(handles)]
        barrier = threading.Barrier(2)
        outcomes: list[object] = [None, None]

        def race(i: int, barrier: threading.Barrier = barrier, outcomes: list[object] = outcomes,
                 handles: list = handles, adds: list = adds, round_: int = round_) -> None:
            barrier.wait()
            try:
                outcomes[i] = handles[i].commit(adds[i], expected_version=round_)
            except ConcurrentWriterError as e:
                outcomes[i] = e

        threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [o for o in outcomes if o == round_]
        losers = [o for o in outcomes if isinstance(o, ConcurrentWriterError)]
        assert (len(winners), len(losers)) == (1, 1), outcomes
        assert open_store().version() == round_
    assert len(open_store().files()) == 3


def test_app_transactions_are_recorded_per_app_id(open_store: Opener) -> None:
    store = open_store()
    assert store.transaction_version("source") is None
    store.commit(store.write_arrow(rows(["a"])), app_id="source", app_version=3)
    store.commit(store.write_arrow(rows(["b"])), app_id="other", app_version=9)
    store.commit(store.write_arrow(rows(["c"])), app_id="source", app_version=4)
    reader = open_store()
    assert (reader.transaction_version("source"), reader.transaction_version("other")) == (4, 9)
    assert reader.transaction_version("unknown") is None


def test_added_files_between_versions_in_commit_order(open_store: Opener) -> None:
    store = open_store()
    one = store.write_arrow(rows(["a"]))
    store.commit(one)                                                  # v1
    two = store.write_arrow(rows(["b"]))
    store.commit(two)                                                  # v2
    merged = store.write_arrow(rows(["a", "b"]))
    store.commit(merged, [store.path(one[0].path), store.path(two[0].path)],
                 data_change=False)                                   # v3: a rewrite
    three = store.write_arrow(rows(["c"]))
    store.commit(three)                                                # v4
    path = store.path
    assert [f.path for f in store.added_files(0, 4)] == [
        path(one[0].path), path(two[0].path), path(merged[0].path), path(three[0].path)]
    assert [f.path for f in store.added_files(1, 4, data_only=True)] == [
        path(two[0].path), path(three[0].path)]
    assert store.added_files(4, 4) == []
    assert keys_of(store) == ["a", "b", "c"]
    assert keys_of(store, 2) == ["a", "b"]


def test_commit_infos_and_metadata(open_store: Opener) -> None:
    store = open_store()
    store.commit(store.write_arrow(rows(["a"])), metadata={"dbsp.step": "1"})
    store.commit(store.write_arrow(rows(["b"])), app_id="x", app_version=1,
                 metadata={"dbsp.step": "2"})
    infos = store.commit_infos(0, 2)
    assert [i.get("dbsp.step") for i in infos] == ["1", "2"]
    assert [i[ACTIONS_KEY] for i in infos] == [1, 2]     # the add (and the app transaction)
    reader = open_store()
    assert reader.commit_metadata("dbsp.step", "1")["dbsp.step"] == "1"
    assert reader.commit_metadata("dbsp.step", "9") is None
    assert reader.commit_infos(2, 2) == []


def test_restore_rolls_back_and_is_fenced(open_store: Opener) -> None:
    store = open_store()
    store.commit(store.write_arrow(rows(["a"])), expected_version=1)
    store.commit(store.write_arrow(rows(["b"])), expected_version=2)
    stale = open_store()
    store.restore(1, expected_version=3)
    assert store.version() == 3 and keys_of(store) == ["a"]
    with pytest.raises(ConcurrentWriterError):
        stale.restore(1, expected_version=3)
    assert open_store().version() == 3 and keys_of(open_store()) == ["a"]


def test_setting_properties_is_a_fenced_metadata_commit(open_store: Opener) -> None:
    store = open_store()
    store.commit(store.write_arrow(rows(["a"])), expected_version=1)
    stale = open_store()
    wanted = {"delta.logRetentionDuration": "interval 60 days"}
    assert store.set_properties(wanted, expected_version=2) is True
    assert store.version() == 2 and keys_of(store) == ["a"]
    assert store.properties()["delta.logRetentionDuration"] == "interval 60 days"
    assert store.commit_infos(1, 2)[0][ACTIONS_KEY] == 1
    assert store.set_properties(wanted, expected_version=3) is False  # set: no commit
    with pytest.raises(ConcurrentWriterError):
        stale.set_properties({"delta.logRetentionDuration": "interval 9 days"},
                             expected_version=2)
    reopened = open_store()
    assert reopened.version() == 2 and reopened.properties() == store.properties()


def test_an_unbound_append_lands_after_another_handles_properties_commit(
        open_store: Opener) -> None:
    """A producer's push (no expected version) racing the opening pipeline's properties commit
    lands after it (delta-rs alone refuses: "Metadata changed since last commit")."""
    store, stale = open_store(), open_store()
    assert store.set_properties({"delta.logRetentionDuration": "interval 60 days"})
    assert stale.commit(stale.write_arrow(rows(["a"]))) == 2
    reopened = open_store()
    assert keys_of(reopened) == ["a"]
    assert reopened.properties()["delta.logRetentionDuration"] == "interval 60 days"


def test_reopen_sees_the_same_state(open_store: Opener) -> None:
    store = open_store()
    store.commit(store.write_arrow(rows(["a", "b"])), app_id="src", app_version=1)
    store.commit(store.write_arrow(rows(["c"])), app_id="src", app_version=2)
    again = open_store()
    assert again.version() == store.version() == 2
    assert again.files() == store.files()
    assert again.transaction_version("src") == 2
    assert keys_of(again) == ["a", "b", "c"]


def test_garbage_listing_and_deletion(open_store: Opener) -> None:
    store = open_store()
    kept = store.write_arrow(rows(["kept"]))
    store.commit(kept)
    orphan = store.write_arrow(rows(["orphan"]))
    stored = {f.path for f in store.stored_data_files()}
    assert stored == {store.path(kept[0].path), store.path(orphan[0].path)}
    listed = {f.path: f.modified for f in store.stored_data_files()}
    gone = store.path("data/never-written.parquet")
    statted = store.stat_data_files([store.path(orphan[0].path), gone])
    assert [(f.path, f.modified) for f in statted] == [
        (store.path(orphan[0].path), listed[store.path(orphan[0].path)])]
    store.delete_data_files([store.path(orphan[0].path)])
    assert [f.path for f in store.stored_data_files()] == [store.path(kept[0].path)]
    assert store.stat_data_files([store.path(orphan[0].path)]) == []
    assert keys_of(store) == ["kept"]


def test_file_changes_read_the_commits_of_a_range(open_store: Opener) -> None:
    store = open_store()
    first = store.write_arrow(rows(["a"]))
    store.commit(first)
    second = store.write_arrow(rows(["b"]))
    store.commit(second, [store.path(first[0].path)])
    store.restore(1)  # adds the first file back and removes the second
    changes = store.file_changes(0, store.version())
    assert changes is not None
    assert [(c.version, c.added, c.removed) for c in changes] == [
        (1, (store.path(first[0].path),), ()),
        (2, (store.path(second[0].path),), (store.path(first[0].path),)),
        (3, (store.path(first[0].path),), (store.path(second[0].path),))]
    assert store.file_changes(3, 3) == []


def test_removing_a_file_outside_the_table_is_refused(open_store: Opener) -> None:
    store = open_store()
    with pytest.raises(StorageError, match="not inside the table"):
        store.commit([], ["/elsewhere/part-0.parquet"])
    assert store.version() == 0


def test_the_log_cleaned_below_a_checkpoint_still_loads_every_later_version(
        open_store: Opener) -> None:
    """``clean_log_below``: the commits below the newest Delta checkpoint at or before the
    version still needed go (tables are checkpointed every 10 commits, at versions 9, 19, ...);
    that version and every later one still load, from a new handle too, and a version below
    the checkpoint no longer does."""
    store = open_store()
    for v in range(1, 61):
        store.commit(store.write_arrow(rows([f"k{v}"], step=v)), expected_version=v)
    assert store.clean_log_below(8) == 0  # no checkpoint at or before 8: nothing goes
    # commits 0..48 and the checkpoints at 9, 19, 29 and 39; the checkpoint at 49 stays
    assert store.clean_log_below(55) == 49 + 4
    assert store.clean_log_below(55) == 0  # done: a second call finds nothing more
    again = open_store()
    assert again.version() == 60
    assert keys_of(again, 52) == sorted(f"k{v}" for v in range(1, 53))
    assert keys_of(again) == sorted(f"k{v}" for v in range(1, 61))
    with pytest.raises(DeltaError):  # delta-rs: that version's log is gone
        again.files(30)
    assert again.commit(again.write_arrow(rows(["after"])), expected_version=61) == 61


def test_a_handle_sees_every_newer_version_and_only_when_there_is_one(
        open_store: Opener) -> None:
    """A handle asked for the newest version loads it only when one exists (the next commit
    file, or a newer checkpoint): it sees another handle's commit, and it also sees one when
    that writer went on and cleaned the log below a newer checkpoint, so the commit after the
    handle's version is gone."""
    reader, writer = open_store(), open_store()
    assert reader.version() == 0
    writer.commit(writer.write_arrow(rows(["one"])), expected_version=1)
    assert reader.version() == 1 and keys_of(reader) == ["one"]
    assert reader.version() == 1  # nothing new: unchanged
    for v in range(2, 25):
        writer.commit(writer.write_arrow(rows([f"k{v}"], step=v)), expected_version=v)
    assert writer.clean_log_below(24) > 0  # the commit files of versions 2..18 are gone
    assert reader.version() == 24
    assert keys_of(reader) == sorted(["one", *(f"k{v}" for v in range(2, 25))])
