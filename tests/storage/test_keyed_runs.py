"""Keyed runs: lookups through a trace's runs return exactly what a scan returns, and a run
that is missing, cut short or of another file is rebuilt from the Delta data file, never
trusted."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.storage import keyed_runs, run_search, trace_replica
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace

SCHEMA = StructType([StructField("c", LongType()), StructField("tag", StringType()),
                     StructField("o", LongType())])
ROWS = 40_000


def _rows(rng: np.random.Generator, n: int, first: int) -> pa.Table:
    c = rng.integers(0, 2_000, n).astype(object)
    c[rng.random(n) < 0.01] = None  # NULL keys are keys too
    tags = np.array(["x", "y", None], dtype=object)[rng.integers(0, 3, n)]
    return pa.table({"c": pa.array(c, pa.int64()), "tag": pa.array(tags, pa.string()),
                     "o": pa.array(np.arange(first, first + n), pa.int64()),
                     "_weight": pa.array(rng.integers(1, 3, n), pa.int64())})


def _scan(trace: Trace, keys: pa.Table) -> list[tuple]:
    """The oracle: the whole trace read and filtered by key (NULL equals NULL)."""
    rows = trace.read_arrow()
    mask = np.zeros(rows.num_rows, dtype=bool)
    for k in keys.to_pylist():
        m = np.ones(rows.num_rows, dtype=bool)
        for col, v in k.items():
            column = rows.column(col)
            m &= (pc.is_null(column) if v is None else pc.fill_null(pc.equal(column, v), False)
                  ).to_numpy(zero_copy_only=False)
        mask |= m
    return sorted(rows.filter(pa.array(mask)).to_pylist(), key=repr)


@pytest.fixture(autouse=True)
def _no_replicas(monkeypatch):
    """Lookups here go through the files and their runs: no trace keeps an in-memory replica
    (``storage/trace_replica.py``, tested in ``test_trace_replica.py``)."""
    monkeypatch.setattr(trace_replica, "MAX_ROWS", 0)


@pytest.fixture
def big_trace(spark, tmp_path):
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql = LocalSQL()
    trace = Trace(db, "t", SCHEMA, ["c", "tag"])
    rng = np.random.default_rng(7)
    trace.append_arrow(sql, _rows(rng, ROWS, 0))  # one big file: gets a run in the background
    trace.append_arrow(sql, _rows(rng, 500, ROWS))  # one small file: read whole
    keyed_runs.wait_for_writes()
    return trace, sql, rng, db


def _keys(rng: np.random.Generator, n: int) -> pa.Table:
    c = rng.integers(0, 2_100, n).astype(object)  # some keys are not in the trace
    c[:2] = None
    tags = np.array(["x", "y", None], dtype=object)[rng.integers(0, 3, n)]
    return pa.table({"c": pa.array(c, pa.int64()), "tag": pa.array(tags, pa.string())})


def test_lookups_through_runs_equal_a_scan(big_trace):
    trace, sql, rng, db = big_trace
    assert [f.rows >= keyed_runs.MIN_ROWS for f in trace.files()] == [True, False]
    assert len(os.listdir(trace.runs.folder)) == 1 and trace.runs.built == 0
    for n in (1, 30, 1_000):
        keys = _keys(rng, n)
        got = sorted(trace.lookup_arrow(sql, keys).to_pylist(), key=repr)
        assert got == _scan(trace, keys) and got
    assert trace.runs.built == 0  # the writer's run served every lookup


@pytest.mark.parametrize("fence", [False, True], ids=["searched", "fenced"])
@pytest.mark.parametrize("batch_rows", [7, 997])
def test_lookups_in_runs_of_many_batches_equal_a_scan(spark, tmp_path, monkeypatch, batch_rows,
                                                      fence):
    """A run of many record batches: a lookup visits only the batches whose hash range holds a
    wanted hash, and a key whose rows straddle batches (7-row batches, about 7 rows a key) is
    found whole; also when every batch is searched through a fence (of every 4th hash)."""
    monkeypatch.setattr(keyed_runs, "BATCH_ROWS", batch_rows)
    if fence:
        monkeypatch.setattr(run_search, "FENCE_STRIDE", 4)
        monkeypatch.setattr(run_search, "FENCE_MIN_HASHES", 1)
        monkeypatch.setattr(run_search, "FENCE_ROWS_PER_HASH", 0)
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql = LocalSQL()
    trace = Trace(db, "t", SCHEMA, ["c", "tag"])
    rng = np.random.default_rng(11)
    trace.append_arrow(sql, _rows(rng, ROWS, 0))
    keyed_runs.wait_for_writes()
    (run,) = os.listdir(trace.runs.folder)
    with pa.memory_map(os.path.join(trace.runs.folder, run)) as source:
        assert pa.ipc.open_file(source).num_record_batches == -(-ROWS // batch_rows)
    for n in (1, 30, 1_000, 3_000):
        keys = _keys(rng, n)
        got = sorted(trace.lookup_arrow(sql, keys).to_pylist(), key=repr)
        assert got == _scan(trace, keys) and got
    assert trace.runs.built == 0
    sql.close()


def test_a_missing_run_is_rebuilt_from_the_data_file(big_trace, spark):
    trace, sql, rng, db = big_trace
    for name in os.listdir(trace.runs.folder):
        os.remove(os.path.join(trace.runs.folder, name))
    again = Trace(db, "t", SCHEMA, ["c", "tag"])  # another process: nothing open
    keys = _keys(rng, 200)
    assert sorted(again.lookup_arrow(sql, keys).to_pylist(), key=repr) == _scan(trace, keys)
    assert again.runs.built == 1 and len(os.listdir(again.runs.folder)) == 1


def test_a_run_checked_in_this_process_is_checked_again_only_when_its_file_changes(
        big_trace, monkeypatch):
    """A trace opened anew in the same process that shares checked runs (a Spark task's, each
    task) takes the run another opened and checked; a run file replaced since (a rebuild, or
    here garbage renamed into its place) or removed is opened and checked again, never trusted;
    ``retain`` and ``forget_changed_runs`` forget the runs whose files went. A driver's trace
    (not sharing) checks what it opens."""
    trace, sql, rng, db = big_trace

    def opened() -> Trace:
        t = Trace(db, "t", SCHEMA, ["c", "tag"])
        t.runs.share_checked = True
        return t

    keys = _keys(rng, 100)
    expected = _scan(trace, keys)
    opened().lookup_arrow(sql, keys)  # opened and checked here
    checks: list[str] = []
    checked = keyed_runs.KeyedRuns._checked
    monkeypatch.setattr(keyed_runs.KeyedRuns, "_checked",
                        lambda self, f: checks.append(f.path) or checked(self, f))
    again = opened()
    assert sorted(again.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert checks == [] and again.runs.built == 0
    driver = Trace(db, "t", SCHEMA, ["c", "tag"])
    assert sorted(driver.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert len(checks) == 1
    (name,) = os.listdir(trace.runs.folder)
    path = os.path.join(trace.runs.folder, name)
    size = os.path.getsize(path)
    with open(path + ".garbage", "wb") as fh:
        fh.write(b"ARROW1" + os.urandom(size - 6))
    os.replace(path + ".garbage", path)  # same size, another file
    third = opened()
    assert sorted(third.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert len(checks) == 3 and third.runs.built == 1  # found damaged, rebuilt, checked
    os.remove(path)
    assert path in keyed_runs._CHECKED._runs
    assert keyed_runs.forget_changed_runs() >= 1 and path not in keyed_runs._CHECKED._runs
    fourth = opened()
    assert sorted(fourth.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert fourth.runs.built == 1
    assert path in keyed_runs._CHECKED._runs
    fourth.runs.retain([])  # a removed run is not kept open (its map holds the disk space)
    assert path not in keyed_runs._CHECKED._runs


@pytest.mark.parametrize("damage", ["cut", "empty", "other file", "other format", "garbage",
                                    "changed bytes", "no checksums"])
def test_a_damaged_run_is_never_trusted(big_trace, damage):
    trace, sql, rng, db = big_trace
    (name,) = os.listdir(trace.runs.folder)
    path = os.path.join(trace.runs.folder, name)
    data = open(path, "rb").read()
    if damage == "changed bytes":  # whole and readable, 8 bytes of its rows changed
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 8]) + \
            data[middle + 8:]
    elif damage == "no checksums":  # the same batches, without their checksums
        run = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, run.schema) as w:
            w.write_table(run)
        data = sink.getvalue().to_pybytes()
    elif damage == "cut":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    elif damage == "garbage":
        data = b"ARROW1" + os.urandom(len(data) - 6)
    elif damage == "other format":  # the same rows, sorted by another engine's hash
        run = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        meta = {**run.schema.metadata, b"dbsp.run_format": b"0:another-hash"}
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, run.schema.with_metadata(meta)) as w:
            w.write_table(run.replace_schema_metadata(meta))
        data = sink.getvalue().to_pybytes()
    else:  # a whole, readable run, but of other rows (not the data file's row count)
        other = pa.ipc.open_file(pa.py_buffer(data)).read_all().slice(0, 100)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, other.schema) as w:
            w.write_table(other)
        data = sink.getvalue().to_pybytes()
    open(path + ".damaged", "wb").write(data)
    os.replace(path + ".damaged", path)  # (another file: what this process wrote is not it)
    again = Trace(db, "t", SCHEMA, ["c", "tag"])
    keys = _keys(rng, 300)
    assert sorted(again.lookup_arrow(sql, keys).to_pylist(), key=repr) == _scan(trace, keys)
    assert again.runs.built == 1


@pytest.mark.parametrize("damage", ["changed bytes", "cut"])
def test_a_damaged_run_a_task_finds_is_built_again_in_the_background(big_trace, damage):
    """A Spark task's lookup (``build_on_miss`` off) that finds a damaged run reads the data
    file, removes the run and has it built again in the background: the next lookup goes
    through a run that passes its checks."""
    trace, sql, rng, db = big_trace
    (name,) = os.listdir(trace.runs.folder)
    path = os.path.join(trace.runs.folder, name)
    data = open(path, "rb").read()
    middle = len(data) // 2
    data = (data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 8])
            + data[middle + 8:]) if damage == "changed bytes" else data[:middle]
    open(path + ".damaged", "wb").write(data)
    os.replace(path + ".damaged", path)
    task = Trace(db, "t", SCHEMA, ["c", "tag"])
    task.runs.build_on_miss = False
    task.replicated = False  # (as ``owner_exec.task_operator`` makes a task's traces)
    keys = _keys(rng, 100)
    expected = _scan(trace, keys)
    with keyed_runs.held_writes():
        assert sorted(task.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
        assert not os.path.exists(path)  # the damaged run went
    keyed_runs.wait_for_writes()
    assert os.path.exists(path) and open(path, "rb").read() != data
    again = Trace(db, "t", SCHEMA, ["c", "tag"])
    again.runs.build_on_miss = False
    again.reset_rows_read()
    assert sorted(again.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert again.rows_read < ROWS // 10 and again.runs.built == 0  # through the new run


def test_a_run_is_read_through_for_its_checksums_once_unless_this_process_wrote_it(
        big_trace, monkeypatch):
    """A run this process wrote, its file unchanged, is opened without reading its bytes
    through; one another process wrote (here: forgotten as written) is checked batch by batch
    against the checksums it carries, then used, and opened again without reading it through
    while its file is unchanged."""
    trace, sql, rng, db = big_trace
    sums: list[int] = []
    checksum = keyed_runs._batch_checksum
    monkeypatch.setattr(keyed_runs, "_batch_checksum",
                        lambda batch: sums.append(batch.num_rows) or checksum(batch))
    keys = _keys(rng, 200)
    expected = _scan(trace, keys)
    mine = Trace(db, "t", SCHEMA, ["c", "tag"])
    assert sorted(mine.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert sums == [] and mine.runs.built == 0
    (name,) = os.listdir(trace.runs.folder)
    keyed_runs._TRUSTED.discard(os.path.join(trace.runs.folder, name))
    other = Trace(db, "t", SCHEMA, ["c", "tag"])
    assert sorted(other.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert sum(sums) == ROWS and other.runs.built == 0  # every row's bytes, once
    third = Trace(db, "t", SCHEMA, ["c", "tag"])  # read through once: trusted as written
    assert sorted(third.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert sum(sums) == ROWS and third.runs.built == 0


def test_runs_of_files_the_trace_no_longer_holds_are_collected(big_trace):
    trace, sql, rng, db = big_trace
    trace.replace_arrow(None)  # the trace's files go (as a merge replaces them)
    crashed = os.path.join(trace.runs.folder, "x.arrow.1-1.tmp")  # a write a crash left
    open(crashed, "wb").close()
    old = time.time() - keyed_runs.TMP_GRACE_SECONDS - 1
    os.utime(crashed, (old, old))
    writing = os.path.join(trace.runs.folder, "y.arrow.2-2.tmp")  # a write going on
    open(writing, "wb").close()
    assert trace.collect_runs() == 2
    assert os.listdir(trace.runs.folder) == [os.path.basename(writing)]


def test_a_local_disk_that_cannot_hold_runs_slows_lookups_and_stops_nothing(spark, tmp_path):
    """``_local`` unusable (here a file in its place): appends commit, runs are skipped with a
    warning, and lookups read the data files instead, with the same rows."""
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    open(os.path.join(str(tmp_path), "_local"), "w").close()
    sql, rng = LocalSQL(), np.random.default_rng(11)
    trace = Trace(db, "t", SCHEMA, ["c", "tag"])
    trace.append_arrow(sql, _rows(rng, ROWS, 0))
    assert trace.files()[0].rows >= keyed_runs.MIN_ROWS
    keys = _keys(rng, 500)
    assert sorted(trace.lookup_arrow(sql, keys).to_pylist(), key=repr) == _scan(trace, keys)


def test_the_local_folder_of_a_root(monkeypatch, tmp_path):
    from dbsp_pipeline import root as root_layout

    assert root_layout.local_folder(str(tmp_path)) == os.path.join(str(tmp_path), "_local")
    monkeypatch.setenv(root_layout.LOCAL_DIR_VARIABLE, str(tmp_path / "cache"))
    one, two = (root_layout.local_folder(r) for r in ("s3://b/a+b", "s3://b/a/b"))
    assert one != two and all(f.startswith(str(tmp_path / "cache")) for f in (one, two))
    assert root_layout.local_folder("s3://b/a/b/") == two  # one spelling of a root
    assert root_layout.keyed_runs("s3://b/a/b", "t") == os.path.join(two, "keyed_runs", "t")


def test_garbage_collection_keeps_live_runs_and_drops_other_traces(spark, tmp_path):
    from dbsp_pipeline import Circuit, Pipeline
    from dbsp_pipeline import root as root_layout

    c = Circuit("runs")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("m", x.group_by("k").agg(top="max(v)"))
    root = str(tmp_path)
    with Pipeline(c, root, spark, driver_step_rows=10**9) as p:
        p.push("x", [(i % 5_000, i) for i in range(keyed_runs.MIN_ROWS + 1_000)])
        p.step()
        p.push("x", [(7, -1)], weight=1)
        p.step()
        keyed_runs.wait_for_writes()
        folder = root_layout.keyed_runs(root)
        live = {t.name for t in p.engine.plan.state_traces()
                if any(f.rows >= keyed_runs.MIN_ROWS for f in t.files())}
        assert live and set(os.listdir(folder)) == live
        os.makedirs(os.path.join(folder, "a_trace_gone"))
        p.collect_garbage(grace_seconds=0)
        assert set(os.listdir(folder)) == live
        assert all(os.listdir(os.path.join(folder, name)) for name in live)


def test_a_lookup_of_few_keys_counts_only_the_rows_it_read(big_trace):
    trace, sql, rng, db = big_trace
    keys = pa.table({"c": pa.array([5, 17, 1_234], pa.int64()),
                     "tag": pa.array(["x", "y", None], pa.string())})
    trace.reset_rows_read()
    found = trace.lookup_arrow(sql, keys)
    # the keys' rows from the big file's run plus at most the small file's 500 rows, not 40k
    assert found.num_rows <= trace.rows_read <= found.num_rows + 500
    assert trace.rows_read < trace.rows() // 50
    trace.reset_rows_read()
    assert trace.read_arrow().num_rows == trace.rows_read == trace.rows()


def test_a_step_does_not_wait_for_its_run_and_lookups_meanwhile_read_the_data_file(spark,
                                                                                   tmp_path):
    """An append hands its run to the background writer and returns; until the run is in
    place, lookups read the data file (same rows, no run built on the step path); then the run
    serves them."""
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql, rng = LocalSQL(), np.random.default_rng(5)
    trace = Trace(db, "t", SCHEMA, ["c", "tag"])
    keys = _keys(rng, 20)
    with keyed_runs.held_writes():
        trace.append_arrow(sql, _rows(rng, ROWS, 0))
        (big,) = trace.files()
        assert trace.runs.pending(big) and not os.path.exists(trace.runs.run_path(big))
        trace.reset_rows_read()
        got = sorted(trace.lookup_arrow(sql, keys).to_pylist(), key=repr)
        assert got == _scan(trace, keys) and got
        assert trace.runs.built == 0 and not os.path.exists(trace.runs.run_path(big))
    keyed_runs.wait_for_writes()
    assert not trace.runs.pending(big) and os.path.exists(trace.runs.run_path(big))
    trace.reset_rows_read()
    assert sorted(trace.lookup_arrow(sql, keys).to_pylist(), key=repr) == got
    assert trace.rows_read < ROWS // 10 and trace.runs.built == 0  # through the run now


def test_runs_beyond_the_pending_bound_are_built_at_first_lookup(spark, tmp_path):
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    sql, rng = LocalSQL(), np.random.default_rng(6)
    traces = [Trace(db, f"t{i}", SCHEMA, ["c", "tag"])
              for i in range(keyed_runs.PENDING_WRITES + 1)]
    with keyed_runs.held_writes():
        for i, trace in enumerate(traces):
            trace.append_arrow(sql, _rows(rng, keyed_runs.MIN_ROWS, i * keyed_runs.MIN_ROWS))
        *waiting, last = traces
        assert all(t.runs.pending(t.files()[0]) for t in waiting)
        assert not last.runs.pending(last.files()[0])  # dropped: the writer holds enough
    keyed_runs.wait_for_writes()
    assert all(os.path.exists(t.runs.run_path(t.files()[0])) for t in waiting)
    assert not os.path.exists(last.runs.run_path(last.files()[0]))
    keys = _keys(rng, 50)
    assert sorted(last.lookup_arrow(sql, keys).to_pylist(), key=repr) == _scan(last, keys)
    assert last.runs.built == 1 and os.path.exists(last.runs.run_path(last.files()[0]))


def test_a_lookup_that_may_not_build_a_run_has_it_built_in_the_background(big_trace):
    """A Spark task's lookup (``build_on_miss`` off) in a big file without a run reads the data
    file, and hands the run to the background writer, which builds it from the file: the next
    lookup goes through the run, and no run was built on the lookup's path."""
    trace, sql, rng, db = big_trace
    task = Trace(db, "t", SCHEMA, ["c", "tag"])  # another process's view of the trace
    big = max(task.files(), key=lambda f: f.rows)
    os.remove(task.runs.run_path(big))
    task.runs.build_on_miss = False
    task.replicated = False  # (as ``owner_exec.task_operator`` makes a task's traces)
    keys = _keys(rng, 100)
    with keyed_runs.held_writes():
        task.reset_rows_read()
        assert sorted(task.lookup_arrow(sql, keys).to_pylist(), key=repr) == _scan(trace, keys)
        from_file = task.rows_read  # the data file's row groups of the wanted shards
        assert task.runs.pending(big) and not os.path.exists(task.runs.run_path(big))
    keyed_runs.wait_for_writes()
    assert os.path.exists(task.runs.run_path(big)) and task.runs.built == 0
    task.reset_rows_read()
    assert sorted(task.lookup_arrow(sql, keys).to_pylist(), key=repr) == _scan(trace, keys)
    assert task.rows_read < from_file / 3  # through the run: the wanted keys' rows


@pytest.mark.parametrize("workers", [2, 4])
def test_the_files_a_layout_change_writes_get_runs(big_trace, monkeypatch, workers):
    """``split_by_owner`` writes files it holds no rows of afterwards: their runs are built
    from the files in the background, so the steps after a rescale look up through runs (each
    file's run searched only for the wanted hashes in its shard range)."""
    from dbsp_pipeline.runtime.layout import Layout

    trace, sql, rng, db = big_trace
    monkeypatch.setattr(keyed_runs, "MIN_ROWS", 1_000)  # every owner's piece gets a run
    files = trace.files()
    adds = trace.split_by_owner(files, Layout.initial(workers))
    trace.swap_files(files, adds)
    keyed_runs.wait_for_writes()
    big = [f for f in trace.files() if trace.runs.covers(f)]
    assert big and all(os.path.exists(trace.runs.run_path(f)) for f in big)
    keys = _keys(rng, 100)
    trace.reset_rows_read()
    got = trace.lookup_arrow(sql, keys)
    assert trace.rows_read < ROWS // 5 and trace.runs.built == 0  # through the runs
    assert sorted(got.to_pylist(), key=repr) == _scan(trace, keys)


_EXIT_RIGHT_AFTER_A_RUN = """
import sys, time
import numpy as np, pyarrow as pa
from dbsp_pipeline.storage import keyed_runs
from dbsp_pipeline.storage.table_store import DataFile

write = keyed_runs.KeyedRuns.write_now
def slow(self, data_file, rows):  # (the run is still being written when the process exits)
    time.sleep(0.5)
    write(self, data_file, rows)
keyed_runs.KeyedRuns.write_now = slow
schema = pa.schema([("k", pa.int64()), ("_weight", pa.int64())])
runs = keyed_runs.KeyedRuns(sys.argv[1], schema, ["k"],
                            lambda t: t.column("k").to_numpy().astype(np.uint64))
n = keyed_runs.MIN_ROWS
rows = pa.table({"k": np.arange(n), "_weight": np.ones(n, dtype=np.int64)})
runs.add(DataFile(sys.argv[2], n), rows)
"""


def test_the_run_writer_waits_for_the_next_run_and_a_process_writes_its_runs_before_it_exits(
        tmp_path):
    """The writer's thread outlives a flush (the next run finds it running: a stream of steps
    starts it once), and it is a daemon, yet a process that exits right after handing a run
    over writes the run first (``_flush_at_exit``)."""
    import subprocess
    import sys

    from dbsp_pipeline.storage.table_store import DataFile

    schema = pa.schema([("k", pa.int64()), ("_weight", pa.int64())])
    runs = keyed_runs.KeyedRuns(str(tmp_path / "here"), schema, ["k"],
                                lambda t: t.column("k").to_numpy().astype(np.uint64))
    n = keyed_runs.MIN_ROWS
    rows = pa.table({"k": np.arange(n), "_weight": np.ones(n, dtype=np.int64)})
    threads = []
    for i in range(2):
        runs.add(DataFile(str(tmp_path / f"data-{i}.parquet"), n), rows)
        keyed_runs.wait_for_writes()
        threads.append(keyed_runs._WRITER._thread)
        assert runs.exists(DataFile(str(tmp_path / f"data-{i}.parquet"), n))
    assert threads[0] is not None and threads[0] is threads[1] and threads[0].daemon

    folder, data = str(tmp_path / "child"), str(tmp_path / "child-data.parquet")
    subprocess.run([sys.executable, "-c", _EXIT_RIGHT_AFTER_A_RUN, folder, data], check=True,
                   timeout=120)
    child = keyed_runs.KeyedRuns(folder, schema, ["k"],
                                 lambda t: t.column("k").to_numpy().astype(np.uint64))
    assert child.exists(DataFile(data, n))
