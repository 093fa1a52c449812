"""Garbage collection deletes only files no retained state version refers to."""

from __future__ import annotations

import glob
import os

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

    # Both retained state versions can still be opened (their files are all there).
    db = StateDatabase(spark, root, circuit().fingerprint())
    newest = db.open()
    assert list(db.versions()) == [newest - 1, newest]
    db.open(newest - 1)
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
