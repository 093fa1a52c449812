"""Garbage collection deletes only files no retained state version refers to."""

from __future__ import annotations

import glob
import os
import time
import types

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.runtime import upkeep
from dbsp_pipeline.storage.state_db import StateDatabase
from tests.conftest import view_counter


def circuit() -> Circuit:
    c = Circuit("gc")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("g", x.group_by("k").agg(hi="max(v)", n="count(*)"))
    return c


def data_files(root: str) -> set[str]:
    """The data files under ``root`` (not the Delta checkpoints in the logs, which log cleanup
    deletes, not garbage collection)."""
    return {f for f in glob.glob(os.path.join(root, "**", "*.parquet"), recursive=True)
            if f"{os.sep}_delta_log{os.sep}" not in f}


def test_gc_keeps_the_retained_versions_and_deletes_the_rest(spark, tmp_path):
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark, compact_threshold=2) as p:
        for i in range(10):
            p.push("x", [(i % 3, i), (5, i)])
            p.push("x", [(5, i)], weight=-1)
            p.step()
            p.engine.compactor.apply_finished(wait=True)
        p.commit()
        # an orphan: written by a write that never committed
        orphan = os.path.join(root, "state", os.listdir(os.path.join(root, "state"))[0],
                              "data", "deadbeef", "part-00000.parquet")
        os.makedirs(os.path.dirname(orphan))
        with open(orphan, "wb") as fh:
            fh.write(b"not committed")
        upkeep.fold(p.engine)  # (garbage collection folds first: its files are not garbage)
        before = data_files(root)
        expected = view_counter(p.view("g"))
        pushed_files = len(p.engine.inputs["x"].table.files())
        deleted = p.collect_garbage(grace_seconds=0)
        assert deleted > 0 and not os.path.exists(orphan)
        after = data_files(root)
        assert len(before - after) == deleted
        # the only new files: the consolidated input and the compacted division record
        assert all("/inputs/x/" in f or "/_divisions/" in f for f in after - before)
        assert view_counter(p.view("g")) == expected
        # consumed input is consolidated: the log holds the integrated input (size-tiered,
        # a few files), plus what the step before the oldest retained version did not consume
        assert pushed_files == 20 and len(p.engine.inputs["x"].table.files()) <= 4
        assert view_counter(p.input_view("x")) == {(i % 3, i): 1 for i in range(10)}

    # The retained state versions (of the two newest steps: the last step's, and the step
    # before; the commit after the last step had nothing to record, and wrote no checkpoint)
    # can still be opened: the oldest's files are all there.
    db = StateDatabase(spark, root, circuit().fingerprint())
    newest = db.open()
    versions = list(db.versions())
    assert versions == [newest - 1, newest], versions
    db.open(versions[0])  # the oldest (opening it discards the newer ones)
    for table in db._tables.values():
        assert all(os.path.exists(f.path) for f in table.files())
    with Pipeline(circuit(), root, spark) as p:
        p.push("x", [(0, 100)])
        p.step()
        assert view_counter(p.view("g"))[(0, 100, 5)] == 1


def test_consolidating_consumed_input_is_not_new_input(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        for i in range(6):
            p.push("x", [(1, i), (2, i)])
            p.push("x", [(2, i)], weight=-1)
            p.step()
        p.push("x", [(3, 0)])  # pushed, not stepped: not in the input view yet
        p.collect_garbage(grace_seconds=0)
        assert view_counter(p.input_view("x")) == {(1, i): 1 for i in range(6)}
        assert {tuple(r.values())[:-1]: r["_weight"] for r in p.input_view_arrow("x").to_pylist()
                } == {(1, i): 1 for i in range(6)}
        assert [r.inputs for r in p.run()] == [{"x": 1}]


def test_files_this_process_committed_need_no_grace(spark, tmp_path, monkeypatch):
    """A file that a commit of this process made part of a table, and that no version to keep
    refers to any more, is deleted once it is a minute old, though younger than the grace
    period: its write is over. A young file no commit of this process made (an orphan, whose
    write may still be going, or another process's file) waits out the grace period."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    from dbsp_pipeline.storage import garbage
    from dbsp_pipeline.storage.delta_table import SparkDeltaTable

    schema = StructType([StructField("k", LongType())])
    uri = str(tmp_path / "t")
    table = SparkDeltaTable(spark, uri, schema)
    [first] = table.write_arrow(pa.table({"k": [1]}))
    table.commit([first])
    [second] = table.write_arrow(pa.table({"k": [2]}))
    table.commit([second], [table.store.path(first.path)])  # the first file is replaced
    table.write_arrow(pa.table({"k": [3]}))  # an orphan: written, never committed
    assert garbage.collect(table, table.version()) == 0  # all written a moment ago
    two_minutes_on = time.time() + 120  # (files keep their times: the clock moves)
    monkeypatch.setattr(garbage, "time", types.SimpleNamespace(time=lambda: two_minutes_on))
    other = SparkDeltaTable(spark, uri, schema)  # another process: it committed nothing
    assert garbage.collect(other, other.version()) == 0
    on_disk = {f.path for f in table.store.stored_data_files()}
    assert len(on_disk) == 3
    assert garbage.collect(table, table.version()) == 1  # the default grace: an hour
    assert {f.path for f in table.store.stored_data_files()} == on_disk - {
        table.store.path(first.path)}
    assert table.committed_files == {table.store.path(second.path)}


def test_a_long_run_of_small_steps_keeps_few_files(spark, tmp_path, monkeypatch):
    """Files a step writes and a merge or fold soon replaces do not pile up for the grace
    period: after 64 steps (each taken as a minute apart) and a collection, the state tables,
    the manifest, the input and the division log hold about the files the retained state refers
    to, not one per step each (the output log keeps its history: a file per step)."""
    from dbsp_pipeline.storage import garbage

    monkeypatch.setattr(garbage, "COMMITTED_GRACE_SECONDS", 0.0)
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark, compact_threshold=2) as p:
        for i in range(64):
            p.push("x", [(i % 5, i)])
            p.step()
        p.collect_garbage()  # the default grace
        history = {f.path for f in p.engine.outputs["g"].table.files()}
        assert {f for f in data_files(root) if f"{os.sep}outputs{os.sep}" in f} == history
        # (a state table keeps the files its staged removes name until they are folded, every
        # FOLD_ACTIONS actions: 21 files here at 32, 15 at 8; one per step would be 64 a table)
        assert len([f for f in data_files(root) if f not in history]) <= 24


def _small_table(spark, tmp_path):
    from pyspark.sql.types import LongType, StructField, StructType

    from dbsp_pipeline.storage.delta_table import SparkDeltaTable

    return SparkDeltaTable(spark, str(tmp_path / "t"),
                           StructType([StructField("k", LongType())]))


def test_collections_between_listings_delete_what_a_listing_would(spark, tmp_path,
                                                                   monkeypatch):
    """Random commits (adds, replacements, restores that add removed files back), some files
    only staged, and collections keeping a random recent version: a collection that reads the
    commits since the last one deletes exactly the files a listing would (no orphans here: a
    listing finds those), and never a file a version from ``keep_version`` on refers to."""
    import numpy as np
    import pyarrow as pa

    from dbsp_pipeline.storage import garbage

    monkeypatch.setattr(garbage, "COMMITTED_GRACE_SECONDS", 0.0)
    monkeypatch.setattr(garbage, "LISTING_EVERY", 10**6)
    rng = np.random.default_rng(5)
    table = _small_table(spark, tmp_path)
    staged: set[str] = set()  # written, protected as a retained entry's staged adds would be
    listings = 0
    real_listing = garbage._delete_listed

    def counted(*args, **kwargs):
        nonlocal listings
        listings += 1
        return real_listing(*args, **kwargs)

    monkeypatch.setattr(garbage, "_delete_listed", counted)
    keep_floor, restores, deleted_between_listings = 0, 0, 0
    for round_ in range(60):
        current = {f.path for f in table.files()}
        action = rng.integers(0, 4)
        if action == 0 or not current:  # add files
            table.commit([a for i in range(int(rng.integers(1, 3)))
                          for a in table.write_arrow(pa.table({"k": [round_ * 10 + i]}))])
        elif action == 1:  # replace some files by one (a merge)
            gone = [p for p in current if rng.random() < 0.5]
            table.commit(table.write_arrow(pa.table({"k": [round_]})), gone)
        elif action == 2 and table.version() > max(1, keep_floor) + 1:
            # a restore to a retained version: files it removed come back
            table.store.restore(int(rng.integers(max(1, keep_floor), table.version())))
            restores += 1
        else:  # a staged file, later dropped from staging without a commit
            [add] = table.write_arrow(pa.table({"k": [-round_]}))
            path = table.store.path(add.path)
            staged.add(path)
            table.committed_files.add(path)
            if len(staged) > 2:
                dropped = sorted(staged)[0]
                staged.discard(dropped)
                garbage.note_never_committed(table, [dropped])
        version = table.version()
        keep = max(keep_floor, version - int(rng.integers(0, 5)))
        keep_floor = keep
        before = {f.path for f in table.store.stored_data_files()}
        listed_before = listings
        deleted = garbage.collect(table, keep, also_referenced=frozenset(staged))
        if listings == listed_before:
            deleted_between_listings += deleted
        after = {f.path for f in table.store.stored_data_files()}
        assert len(before - after) == deleted
        for v in range(keep, version + 1):  # every version from keep on can still be read
            assert {f.path for f in table.files(v)} <= after
        assert staged <= after
        # what a listing would delete now: nothing, since every file left is read by a version
        # from keep on or staged (all are past their grace: committed here, grace 0). Checked
        # without collecting, so what the collections know carries on across the rounds.
        readable = set().union(*({f.path for f in table.files(v)}
                                 for v in range(keep, version + 1)))
        assert after <= readable | staged
        table.garbage = None if round_ % 7 == 6 else table.garbage  # as a new process
    assert restores >= 2 and deleted_between_listings >= 20, (restores, deleted_between_listings)


def test_a_collection_between_listings_lists_nothing(spark, tmp_path, monkeypatch):
    """The first collection lists the data folder; the next ``LISTING_EVERY - 1`` read only
    the commits since; then one lists again (orphans are found only so). A collection that
    keeps a version below the one the last listing kept, or finds a commit file of its range
    cleaned up, lists too."""
    import pyarrow as pa

    from dbsp_pipeline.storage import garbage

    monkeypatch.setattr(garbage, "COMMITTED_GRACE_SECONDS", 0.0)
    table = _small_table(spark, tmp_path)
    listed: list[int] = []
    real = table.store.stored_data_files
    monkeypatch.setattr(table.store, "stored_data_files",
                        lambda: listed.append(table.version()) or real())

    def step() -> None:
        old = table.files()
        table.commit(table.write_arrow(pa.table({"k": [table.version()]})),
                     [f.path for f in old])

    step()
    orphan = table.write_arrow(pa.table({"k": [-1]}))  # never committed
    old = time.time() - 2 * garbage.ORPHAN_GRACE_SECONDS
    os.utime(table.store.path(orphan[0].path), (old, old))
    for _ in range(garbage.LISTING_EVERY):
        step()
        garbage.collect(table, table.version())
    assert listed == [2]  # the first collection only; the orphan was deleted then
    assert len(table.store.stored_data_files()) == 1
    listed.clear()
    step()
    garbage.collect(table, table.version())
    assert len(listed) == 1  # the LISTING_EVERY-th after a listing
    step()
    listed.clear()
    garbage.collect(table, table.version() - 3)  # below what the last listing kept
    assert len(listed) == 1
    for _ in range(3):
        step()
    garbage.collect(table, table.version())  # (keeps the newest: reads on from here)
    listed.clear()
    for _ in range(12):
        step()
    table.store.delete_log_files([f"{table.version() - 5:020d}.json"])  # a commit cleaned up
    garbage.collect(table, table.version())
    assert len(listed) == 1 and len(real()) == 1


def test_a_young_file_is_statted_once_until_its_age_allows_deleting_it(spark, tmp_path,
                                                                        monkeypatch):
    """Between listings a collection looks at the files commits removed; one too young to
    delete is not statted again at every collection (files are never rewritten, so the time it
    was statted with stands) but once the clock says it may be old enough: then it is statted
    and deleted."""
    import pyarrow as pa

    from dbsp_pipeline.storage import garbage

    table = _small_table(spark, tmp_path)
    statted: list[str] = []
    real = table.store.stat_data_files
    monkeypatch.setattr(table.store, "stat_data_files",
                        lambda paths: statted.extend(paths) or real(paths))

    def step() -> None:
        old = table.files()
        table.commit(table.write_arrow(pa.table({"k": [table.version()]})),
                     [f.path for f in old])

    step()
    garbage.collect(table, table.version())  # the first collection lists
    removed = []
    for _ in range(5):
        removed.append(table.files()[0].path)
        step()
        garbage.collect(table, table.version())
    assert sorted(statted) == sorted(removed)  # each once, though kept by every collection
    assert {f.path for f in table.store.stored_data_files()} >= set(removed)
    statted.clear()
    later = time.time() + 2 * garbage.COMMITTED_GRACE_SECONDS
    monkeypatch.setattr(garbage, "time", types.SimpleNamespace(time=lambda: later))
    step()
    assert garbage.collect(table, table.version()) == len(removed) + 1  # and the newest removed
    assert set(removed) <= set(statted)
    assert not set(removed) & {f.path for f in table.store.stored_data_files()}
