"""In-memory replicas of small traces (``storage/trace_replica.py``): a lookup through one equals
the same lookup in the trace's files, after appends, merges with and without their rows, piece
merges, and lookups of the files before an append; a replica that is not of the trace's files is
never read; big traces keep none (and Spark tasks none: ``test_task_table.py``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.spark_session import LazySession
from dbsp_pipeline.storage import data_files, trace_replica
from dbsp_pipeline.storage import trace as trace_module
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.storage.trace_replica import TraceReplica
from dbsp_pipeline.zset import WEIGHT

SCHEMA = StructType([StructField("k", LongType()), StructField("v", StringType())])


def _consolidated(sql: LocalSQL, rows: pa.Table) -> list[tuple]:
    live = sql.consolidate(rows.select(["k", "v", WEIGHT]), ["k", "v"])
    return sorted(((r["k"], r["v"], r[WEIGHT]) for r in live.to_pylist()), key=repr)


def _in_files(sql: LocalSQL, trace: Trace, keys: list[int | None], files=None) -> list[tuple]:
    """What the lookup must give: the files' rows of ``keys``, consolidated."""
    rows = trace.table.read_arrow(trace.files() if files is None else files)
    wanted = rows.filter(pc.is_in(rows.column("k"), value_set=pa.array(keys, pa.int64()),
                                  skip_nulls=False))
    return _consolidated(sql, wanted)


def _change(rng: np.random.Generator, live: dict[int | None, str], n: int) -> pa.Table:
    """``n`` keys changed in place (an aggregate's groups): -old/+new for a live key, +new for
    a new one, -old for some (deleted); NULL is a key too."""
    ks, vs, ws = [], [], []
    for k in rng.choice(np.arange(-1, 300), n, replace=False).tolist():
        key = None if k == -1 else k
        if key in live:
            ks.append(key), vs.append(live[key]), ws.append(-1)
        if key not in live or rng.random() < 0.8:
            value = f"v{rng.integers(1_000_000)}"
            ks.append(key), vs.append(value), ws.append(1)
            live[key] = value
        else:
            del live[key]
    return pa.table({"k": pa.array(ks, pa.int64()), "v": pa.array(vs, pa.string()),
                     WEIGHT: pa.array(ws, pa.int64())})


@pytest.fixture
def trace(tmp_path):
    db = StateDatabase(LazySession(), str(tmp_path), "replica-test")  # never starts Spark
    db.open()
    return Trace(db, "t", SCHEMA, ["k"], updated_in_place=True)


@pytest.mark.parametrize("seed,small_rows", [(1, 65_536), (2, 65_536), (3, 0), (4, 0)])
def test_lookups_through_the_replica_equal_the_files(trace, monkeypatch, seed, small_rows):
    """Steps that change keys in place, merges now and then (their rows handed over, or not:
    the pieces are joined), pieces joined when small or too many, and lookups of the whole
    trace and of the files before the step's append: each equals the files' rows of the keys,
    consolidated, and the replica is read."""
    monkeypatch.setattr(trace_replica, "MAX_PIECES", 6)
    monkeypatch.setattr(trace_replica, "SMALL_ROWS", small_rows)
    reads = []
    real_lookup = TraceReplica.lookup
    monkeypatch.setattr(TraceReplica, "lookup", lambda self, hashes, without_newest=False: (
        reads.append(without_newest) or real_lookup(self, hashes, without_newest)))
    sql = LocalSQL()
    rng = np.random.default_rng(seed)
    live: dict[int | None, str] = {}
    trace.append_arrow(sql, _change(rng, live, 200))
    read_replica = 0
    for step in range(40):
        keys = [None if k == -1 else k for k in rng.choice(np.arange(-1, 320), 40).tolist()]
        before = trace.files()
        trace.append_arrow(sql, _change(rng, live, int(rng.integers(1, 60))))
        got_old = trace.lookup_arrow(sql, pa.table({"k": pa.array(keys, pa.int64())}), before)
        assert _consolidated(sql, got_old) == _in_files(sql, trace, keys, before)
        got = trace.lookup_arrow(sql, pa.table({"k": pa.array(keys, pa.int64())}))
        assert _consolidated(sql, got) == _in_files(sql, trace, keys)
        read_replica += trace._replica is not None
        if step % 7 == 3:  # a merge of some files, with its rows for the replica or without
            files = trace.files()[-int(rng.integers(2, 5)):]
            adds = trace.merge(files, sql)
            if step % 14 == 3:
                trace._merged_pieces.clear()
            assert trace.apply_merge(files, adds)
    assert read_replica >= 37  # built at the fourth lookup, then followed every change
    assert reads.count(True) >= 37 and reads.count(False) >= 37  # both ways read it
    assert trace._replica is not None and trace._replica.pieces <= 6
    everything = sorted(live.items(), key=repr)
    got = trace.lookup_arrow(sql, pa.table({"k": pa.array([k for k, _ in everything],
                                                          pa.int64())}))
    assert _consolidated(sql, got) == sorted(((k, v, 1) for k, v in everything), key=repr)


def test_a_replica_not_of_the_trace_files_is_never_read(trace, monkeypatch):
    """Changes a replica does not follow (files swapped, the trace replaced, the file list
    reloaded after a rollback) drop it: the next lookup reads the files, and one later builds a
    new replica from them. A replica made stale by hand is not read either."""
    sql = LocalSQL()
    rng = np.random.default_rng(5)
    live: dict[int | None, str] = {}
    trace.append_arrow(sql, _change(rng, live, 200))
    keys = pa.table({"k": pa.array(list(range(0, 300, 3)), pa.int64())})
    expected = lambda: _in_files(sql, trace, keys.column("k").to_pylist())  # noqa: E731
    for _ in range(trace_module.REPLICA_AFTER_LOOKUPS):
        assert _consolidated(sql, trace.lookup_arrow(sql, keys)) == expected()
    first = trace._replica
    assert first is not None

    files = trace.files()  # the same rows in other files (a layout change's swap)
    trace.swap_files(files, trace.table.write_arrow(trace.table.read_arrow(files)))
    assert trace._replica is None  # dropped at once
    for _ in range(trace_module.REPLICA_AFTER_LOOKUPS):
        assert _consolidated(sql, trace.lookup_arrow(sql, keys)) == expected()
    assert trace._replica is not None and trace._replica is not first

    # a replica whose files are the trace's but whose rows are not is what "never a second
    # source of truth" forbids; one whose files are not the trace's must not be read
    trace._replica.files = trace._replica.files | {"/elsewhere/x.parquet"}
    opened = []
    real_read = data_files.DataFiles.read_arrow
    monkeypatch.setattr(data_files.DataFiles, "read_arrow",
                        lambda self, paths, *a, **k: opened.append(paths) or real_read(
                            self, paths, *a, **k))
    assert _consolidated(sql, trace.lookup_arrow(sql, keys)) == expected()
    assert trace._replica is None and opened  # read the files

    for _ in range(trace_module.REPLICA_AFTER_LOOKUPS):
        assert _consolidated(sql, trace.lookup_arrow(sql, keys)) == expected()
    assert trace._replica is not None
    trace.replace_arrow(sql.consolidate(trace.read_arrow().select(["k", "v", WEIGHT]),
                                        ["k", "v"]).slice(0, 50))
    assert trace._replica is None
    for _ in range(trace_module.REPLICA_AFTER_LOOKUPS):
        assert _consolidated(sql, trace.lookup_arrow(sql, keys)) == expected()
    assert trace._replica is not None
    trace.reset_cache()
    assert trace._replica is None


def test_a_trace_changed_otherwise_between_lookups_builds_none(trace):
    """A trace whose files change between its lookups in ways a replica does not follow (a
    Spark step's append, a swap) is not read whole for a replica at each lookup."""
    sql = LocalSQL()
    rng = np.random.default_rng(6)
    live: dict[int | None, str] = {}
    trace.append_arrow(sql, _change(rng, live, 100))
    keys = pa.table({"k": pa.array([1, 2, 3], pa.int64())})
    built = 0
    for _ in range(6):
        files = trace.files()
        trace.swap_files(files, trace.table.write_arrow(trace.table.read_arrow(files)))
        trace.lookup_arrow(sql, keys)
        built += trace._replica is not None
    assert built == 0
    for _ in range(trace_module.REPLICA_AFTER_LOOKUPS - 1):  # no change between: built
        trace.lookup_arrow(sql, keys)
    assert trace._replica is not None


def test_replicas_stay_within_their_bounds(trace, monkeypatch):
    """A trace of more than half ``MAX_ROWS`` builds none, and one that would grow beyond
    ``MAX_ROWS`` drops its own; a trace whose replica would take the process beyond
    ``BUDGET_BYTES`` keeps none; one appended to ``UNREAD_APPENDS`` times without a lookup
    reading it is dropped; a trace with ``replicated`` off (a Spark task's) builds none."""
    sql = LocalSQL()
    rng = np.random.default_rng(8)
    live: dict[int | None, str] = {}
    keys = pa.table({"k": pa.array([1, 2, 3], pa.int64())})
    lookups = trace_module.REPLICA_AFTER_LOOKUPS
    trace.append_arrow(sql, _change(rng, live, 100))
    monkeypatch.setattr(trace_replica, "MAX_ROWS", 199)  # the trace holds 100: over half
    for _ in range(lookups):
        trace.lookup_arrow(sql, keys)
    assert trace._replica is None
    monkeypatch.setattr(trace_replica, "MAX_ROWS", 300)
    trace.lookup_arrow(sql, keys)
    assert trace._replica is not None
    trace.append_arrow(sql, _change(rng, live, 250))  # beyond 300 rows: dropped
    assert trace._replica is None

    monkeypatch.setattr(trace_replica, "MAX_ROWS", 100_000)
    for _ in range(lookups):
        trace.lookup_arrow(sql, keys)
    assert trace._replica is not None
    for _ in range(trace_replica.UNREAD_APPENDS):
        trace.append_arrow(sql, _change(rng, live, 5))
    assert trace._replica is None  # appended to, never read

    alive = sum(r.nbytes for r in list(trace_replica._LIVE))  # others not yet collected
    monkeypatch.setattr(trace_replica, "BUDGET_BYTES", alive + 100)
    for _ in range(lookups):
        trace.lookup_arrow(sql, keys)
    assert trace._replica is None and not trace.replicated  # it did not fit: none for it
    monkeypatch.setattr(trace_replica, "BUDGET_BYTES", alive + (10 << 20))
    for _ in range(lookups):
        trace.lookup_arrow(sql, keys)
    assert trace._replica is None  # (a Spark task's traces are made so)


def test_a_keyless_trace_is_looked_up_whole(tmp_path):
    """A trace without key (a global aggregate's one group) has every row under the one key
    there is: a lookup of any key finds them all, through the files and through a replica."""
    db = StateDatabase(LazySession(), str(tmp_path), "keyless")
    db.open()
    trace = Trace(db, "t", StructType([StructField("n", LongType())]), [],
                  updated_in_place=True)
    sql = LocalSQL()
    trace.append_arrow(sql, pa.table({"n": pa.array([5, 6], pa.int64()),
                                      WEIGHT: pa.array([1, 2], pa.int64())}))
    for _ in range(trace_module.REPLICA_AFTER_LOOKUPS + 1):
        got = trace.lookup_arrow(sql, pa.table({"x": [1]}))
        assert sorted(zip(got.column("n").to_pylist(), got.column(WEIGHT).to_pylist())) == [
            (5, 1), (6, 2)]
    assert trace._replica is not None
