"""Size-tiered compaction candidates of a trace, and the size-amplification bound of a trace
updated in place."""

from __future__ import annotations

import numpy as np

from dbsp_pipeline.storage.delta_table import DataFile
from dbsp_pipeline.storage.trace import Trace, _distinct_hashes


class FileList(Trace):
    """A trace reduced to its file list (the candidate choice reads nothing else); ``runs``
    makes files pieces of one sorted run: ``runs[i]`` names file i's run."""

    def __init__(self, rows: list[int], runs: list[str] | None = None,
                 updated_in_place: bool = False) -> None:
        self.updated_in_place = updated_in_place
        self._list = [DataFile(f"/t/data/{run}-{i:032x}.parquet" if run else f"/t/data/f{i}",
                               n)
                      for i, (n, run) in enumerate(zip(rows, runs or [""] * len(rows)))]

    def files(self) -> list[DataFile]:
        return list(self._list)


def rows_of(files: list[DataFile]) -> list[int]:
    return sorted(f.rows for f in files)


def test_no_compaction_at_or_under_the_threshold():
    assert FileList([10] * 16).compaction_candidates(16) == []


def test_small_files_merge_without_rewriting_a_big_base():
    chosen = FileList([250_000] * 4 + [100] * 50).compaction_candidates(16)
    assert rows_of(chosen) == [100] * 50


def test_files_of_similar_size_merge_together():
    assert len(FileList([1_000_000] * 20).compaction_candidates(16)) == 20


def test_the_pieces_of_one_write_count_as_one_run():
    """A merge cut into one piece per owner or more (more pieces than the threshold, with 16
    workers or more) is one sorted run: counted as files, the trace was due again at once, and
    merged whole for ever."""
    a, b = "a" * 32, "b" * 32
    pieces = FileList([10_000] * 40, [a] * 40)
    assert pieces.compaction_candidates(16) == []
    # with a step's small files beside it, the small ones merge; the run is not rewritten
    trace = FileList([10_000] * 40 + [100] * 17, [a] * 40 + [""] * 17)
    assert rows_of(trace.compaction_candidates(16)) == [100] * 17
    # a run of pieces merges whole (all its files) when it is chosen: 15 rows of small
    # files, then the run of 10 pieces of 1 row (10 rows, no bigger than those 15)
    chosen = FileList([10] * 40 + [1] * 10 + [1] * 15, [a] * 40 + [b] * 10 + [""] * 15
                      ).compaction_candidates(16)
    assert {f.path for f in chosen} == {f"/t/data/f{i}" for i in range(50, 65)} | {
        f"/t/data/{b}-{i:032x}.parquet" for i in range(40, 50)}


def test_a_bigger_file_joins_when_too_many_would_remain():
    # 20 files of growing size: the small ones alone do not bring the count under the threshold
    sizes = [2 ** i for i in range(20)]
    chosen = FileList(sizes).compaction_candidates(4)
    assert len(sizes) - len(chosen) + 1 <= 4


def test_a_due_merge_leaves_half_the_threshold():
    """At the threshold, one more small run does not make a merge of two at every step: the
    merge brings the trace down to half the threshold, so the next is due that many steps on."""
    sizes = [100_000 * (i + 1) for i in range(16)]
    assert FileList(sizes).compaction_candidates(16) == []
    chosen = FileList([*sizes, 100]).compaction_candidates(16)
    assert 17 - len(chosen) + 1 <= 8
    assert rows_of(chosen) == sorted([100, *sizes])[:len(chosen)]  # the smallest


def test_a_trace_updated_in_place_merges_whole_once_amplified():
    """A trace whose keys are updated in place (an aggregate's groups: a retraction and an
    insertion per changed group a step) merges whole, however few runs it has, once the runs
    beside its largest hold ``MAX_SIZE_AMPLIFICATION`` times the largest's rows: until then a
    lookup of those keys reads every version of them. A trace appended to does not."""
    from dbsp_pipeline.storage.trace import AMPLIFIED_MIN_ROWS, MAX_SIZE_AMPLIFICATION

    def due(rows: list[int], runs: list[str] | None = None) -> list[int]:
        return rows_of(FileList(rows, runs, updated_in_place=True).compaction_candidates(16))

    assert MAX_SIZE_AMPLIFICATION == 1.0 and AMPLIFIED_MIN_ROWS == 131_072
    # a base of 100k groups, then steps that change every group (200k rows each)
    assert due([100_000, 200_000]) == []
    assert due([100_000, 200_000, 200_000]) == [100_000, 200_000, 200_000]
    assert FileList([100_000, 200_000, 200_000]).compaction_candidates(16) == []  # appended
    assert due([150_000, 150_000]) == [150_000, 150_000]
    # a small trace is not merged for it: reading a few extra rows costs less than a merge
    assert due([1_000, 5_000, 5_000]) == []
    assert due([60_000] * 2) == []
    assert due([70_000] * 3) == [70_000] * 3  # 140k beside 70k
    # the largest is a run, not a file: its pieces count together
    a = "a" * 32
    pieces, runs = [50_000] * 4 + [60_000] * 3, [a] * 4 + [""] * 3
    assert due(pieces, runs) == []  # 180k beside 200k
    assert len(due([*pieces, 30_000], [*runs, ""])) == 8


def test_an_aggregate_like_trace_stays_within_the_bound(tmp_path):
    """Steps that each retract and insert every key of a real trace updated in place: merged as
    the rule says, the trace never holds more than the bound allows, and its rows after the
    merges are the live ones."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    from dbsp_pipeline.driver.sql import LocalSQL
    from dbsp_pipeline.spark_session import LazySession
    from dbsp_pipeline.storage import trace as trace_module
    from dbsp_pipeline.storage.state_db import StateDatabase

    db = StateDatabase(LazySession(), str(tmp_path), "amplified")  # never starts Spark
    db.open()
    trace = Trace(db, "t", StructType([StructField("k", LongType()), StructField("v", LongType())]),
                  ["k"], updated_in_place=True)
    sql = LocalSQL()
    groups = 50_000
    keys = pa.array(range(groups), pa.int64())
    trace.append_arrow(sql, pa.table({"k": keys, "v": pa.array([0] * groups, pa.int64()),
                                      "_weight": [1] * groups}))
    merges = 0
    for step in range(1, 8):
        old = pa.table({"k": keys, "v": pa.array([step - 1] * groups, pa.int64()),
                        "_weight": [-1] * groups})
        new = pa.table({"k": keys, "v": pa.array([step] * groups, pa.int64()),
                        "_weight": [1] * groups})
        trace.append_arrow(sql, pa.concat_tables([old, new]))
        # before this step's run: under the bound against a step's run (2 rows a group)
        held = sum(f.rows for f in trace.files())
        assert held < (2 + trace_module.MAX_SIZE_AMPLIFICATION) * 2 * groups
        if files := trace.compaction_candidates():
            assert len(files) == len(trace.files())  # the whole trace
            assert trace.apply_merge(files, trace.merge(files, sql))
            merges += 1
    assert merges >= 2
    live = sql.consolidate(trace.read_arrow(), trace.payload).to_pylist()
    assert sorted((r["k"], r["v"], r["_weight"]) for r in live) == [
        (k, 7, 1) for k in range(groups)]


def test_split_parts_are_cut_at_shard_block_boundaries(monkeypatch):
    import numpy as np
    import pyarrow as pa

    from dbsp_pipeline.storage import trace as trace_module

    monkeypatch.setattr(trace_module, "SPLIT_FILE_ROWS", 10)
    shards = np.sort(np.random.default_rng(3).integers(0, 1024, size=200)).astype(np.int32)
    rows = pa.table({"k": np.arange(200), "_shard": shards})
    pieces = trace_module._shard_chunks(rows)
    assert pa.concat_tables(pieces).equals(rows)
    assert all(p.num_rows >= 10 for p in pieces[:-1])
    for a, b in zip(pieces, pieces[1:]):  # no block is split between two pieces
        assert a.column("_shard")[-1].as_py() >> 4 < b.column("_shard")[0].as_py() >> 4


def test_a_merge_given_a_layout_writes_one_owners_rows_a_file(tmp_path):
    """Merged files feed owner tasks: with a layout, a driver merge cuts its output by owner
    (same rows); without, it writes one file."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from dbsp_pipeline.driver.sql import LocalSQL
    from dbsp_pipeline.runtime.layout import Layout
    from dbsp_pipeline.spark_session import LazySession
    from dbsp_pipeline.storage.state_db import StateDatabase

    db = StateDatabase(LazySession(), str(tmp_path), "merge-test")  # never starts Spark
    db.open()
    schema = StructType([StructField("k", LongType()), StructField("v", StringType())])
    trace = Trace(db, "t", schema, ["k"])
    sql = LocalSQL()
    for step in range(3):
        keys = list(range(step * 500, step * 500 + 800))
        trace.append_arrow(sql, pa.table({"k": keys, "v": [f"v{k % 7}" for k in keys],
                                          "_weight": [1] * len(keys)}))
    files = trace.files()
    whole = sorted(sql.consolidate(trace.read_arrow(files), trace.payload).to_pylist(),
                   key=repr)
    assert len(trace.merge(files, sql)) == 1
    for layout in (Layout.initial(3, "fixed"), Layout.initial(2, "modulo")):
        adds = trace.merge(files, sql, layout)
        merged = [trace.table.data_file(a) for a in adds]
        assert len(merged) == layout.workers
        owners = [set(trace.owners(layout, trace.table.read_arrow([f])).tolist())
                  for f in merged]
        assert all(len(o) == 1 for o in owners) and set().union(*owners) == set(
            range(layout.workers))
        assert sorted(sql.consolidate(trace.table.read_arrow(merged), trace.payload).to_pylist(),
                      key=repr) == whole


def test_a_big_merge_given_a_layout_leaves_the_trace_under_the_threshold(tmp_path,
                                                                          monkeypatch):
    """A driver merge cuts each owner's rows at shard-block boundaries, into about
    ``MERGE_FILES`` files in all, not into ``SPLIT_FILE_ROWS`` pieces: cut that small, a big
    merge wrote more files than the compaction threshold, and the trace was due for a merge of
    all of it again at once (here: 20 pieces of 1,000 rows before)."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    from dbsp_pipeline.driver.sql import LocalSQL
    from dbsp_pipeline.runtime.layout import Layout
    from dbsp_pipeline.spark_session import LazySession
    from dbsp_pipeline.storage import trace as trace_module
    from dbsp_pipeline.storage.state_db import StateDatabase

    monkeypatch.setattr(trace_module, "SPLIT_FILE_ROWS", 1_000)
    db = StateDatabase(LazySession(), str(tmp_path), "merge-files")  # never starts Spark
    db.open()
    trace = Trace(db, "t", StructType([StructField("k", LongType())]), ["k"])
    sql = LocalSQL()
    for step in range(trace_module.COMPACT_FILE_THRESHOLD + 1):
        keys = list(range(step * 1_200, (step + 1) * 1_200))
        trace.append_arrow(sql, pa.table({"k": keys, "_weight": [1] * len(keys)}))
    files = trace.compaction_candidates()
    assert len(files) == trace_module.COMPACT_FILE_THRESHOLD + 1  # 20,400 rows: all of them
    layout = Layout.initial(2, "fixed")
    assert trace.apply_merge(files, trace.merge(files, sql, layout))
    assert len(trace.files()) <= trace_module.MERGE_FILES + layout.workers
    assert all(f.rows >= 1_000 for f in trace.files())
    assert trace.compaction_candidates() == []
    assert sum(f.rows for f in trace.files()) == 20_400
    # with more workers than the threshold, the merge writes a piece per owner or more: one
    # sorted run, so the trace is not due again
    wide = Layout.initial(2 * trace_module.COMPACT_FILE_THRESHOLD, "fixed")
    files = trace.files()
    assert trace.apply_merge(files, trace.merge(files, sql, wide))
    assert len(trace.files()) >= wide.workers
    assert trace.compaction_candidates() == []
    assert sum(f.rows for f in trace.files()) == 20_400


def test_lookups_after_a_driver_merge_read_its_rows_from_memory(tmp_path, monkeypatch):
    """A small trace keeps the rows of the files it wrote, and of a driver merge once applied,
    so a lookup after the merge opens no Parquet file and finds what reading the files finds
    (a merge not applied, as when the trace moved on, keeps nothing)."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    from dbsp_pipeline.driver.sql import LocalSQL
    from dbsp_pipeline.spark_session import LazySession
    from dbsp_pipeline.storage import data_files
    from dbsp_pipeline.storage.state_db import StateDatabase

    db = StateDatabase(LazySession(), str(tmp_path), "merge-memory-test")
    db.open()
    schema = StructType([StructField("k", LongType()), StructField("v", LongType())])
    trace = Trace(db, "t", schema, ["k"])
    sql = LocalSQL()
    for step in range(4):
        trace.append_arrow(sql, pa.table({"k": [1, 2, step + 3], "v": [step, step, step],
                                          "_weight": [1, 1, 1]}))
    files = trace.files()
    assert trace.apply_merge(files, trace.merge(files, sql))
    keys = pa.table({"k": [2, 4, 99]})
    expected = sorted(trace.table.read_arrow(trace.files()).filter(
        pa.compute.is_in(pa.compute.field("k"), pa.array([2, 4, 99]))).to_pylist(), key=repr)
    opened = []
    real_read = data_files.DataFiles.read_arrow
    monkeypatch.setattr(data_files.DataFiles, "read_arrow",
                        lambda self, paths, *a, **k: opened.append(paths) or real_read(
                            self, paths, *a, **k))
    assert sorted(trace.lookup_arrow(sql, keys).to_pylist(), key=repr) == expected
    assert opened == [] and len(expected) == 5  # k=2 four times, k=4 once
    trace.append_arrow(sql, pa.table({"k": [7], "v": [7], "_weight": [1]}))
    files = trace.files()
    stale = trace.merge(files, sql)  # written, then not applied: the files are gone meanwhile
    trace.swap_files(files, [])
    assert not trace.apply_merge(files, stale)
    assert trace._merged == {} and trace.files() == []


def test_distinct_hashes_are_numpy_unique():
    rng = np.random.default_rng(3)
    drawn = rng.integers(0, 2**63, 5000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    for hashes in (drawn, np.concatenate([drawn, drawn[:700], drawn[::-3]]),
                   np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64),
                   drawn[:1], drawn[:0]):
        got = _distinct_hashes(hashes)
        assert got.dtype == np.uint64 and np.array_equal(got, np.unique(hashes))
