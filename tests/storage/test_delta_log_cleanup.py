"""``TableStore.clean_log_below`` (local store): a Delta log loses the commits below its newest
readable Delta checkpoint at or before the oldest version still needed; every version from that
checkpoint on still loads, and a damaged checkpoint is never started from."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from dbsp_pipeline.storage.table_store import open_table_store


def clean_log_below(uri: str, version: int) -> int:
    return open_table_store(uri, pa.schema([("v", pa.int64())])).clean_log_below(version)


def make_table(uri: str, commits: int) -> None:
    """A table with ``commits`` appends after its creation (a Delta checkpoint every 50)."""
    write_deltalake(uri, pa.table({"v": [0]}),
                    configuration={"delta.checkpointInterval": "50"})
    for v in range(1, commits + 1):
        write_deltalake(uri, pa.table({"v": [v]}), mode="append")


def entries(uri: str) -> list[str]:
    return sorted(os.listdir(os.path.join(uri, "_delta_log")))


def test_commits_below_the_checkpoint_before_the_needed_version_go(tmp_path):
    uri = str(tmp_path / "t")
    make_table(uri, 120)
    checkpoints = [n for n in entries(uri) if ".checkpoint." in n]
    assert [int(n[:20]) for n in checkpoints] == [49, 99]  # delta-rs: after 50 commits
    assert clean_log_below(uri, 48) == 0  # no checkpoint at or before 48: nothing goes
    assert clean_log_below(uri, 98) == 49  # commits 0..48 (the checkpoint at 49 stays)
    assert int(entries(uri)[0][:20]) == 49
    assert DeltaTable(uri).version() == 120
    assert DeltaTable(uri, version=60).to_pyarrow_table().num_rows == 61
    assert clean_log_below(uri, 120) == 51  # commits 49..98 and the checkpoint at 49
    assert len(entries(uri)) == 22 + 2  # commits 99..120, the checkpoint, _last_checkpoint
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("v").to_pylist()) == \
        list(range(121))


def test_a_damaged_checkpoint_is_not_started_from(tmp_path):
    uri = str(tmp_path / "t")
    make_table(uri, 105)
    store = open_table_store(uri, pa.schema([("v", pa.int64())]))  # the engine's open handle
    with open(os.path.join(uri, "_delta_log", f"{99:020d}.checkpoint.parquet"), "wb") as fh:
        fh.write(b"not parquet")
    store.clean_log_below(105)  # starts from the checkpoint at 49, the newest readable one
    assert int(entries(uri)[0][:20]) == 49
    assert DeltaTable(uri, version=80).version() == 80


def test_a_checkpoint_of_an_engine_table_carries_no_tombstones(tmp_path):
    """A table the engine creates replaces files at every step (folds, merges): its Delta
    checkpoints keep no ``remove`` actions, so their size (read by every open and status read)
    follows the table's live files, not the number of steps ever run; every version before the
    checkpoint still loads from the commits."""
    uri = str(tmp_path / "t")
    open_table_store(uri, pa.schema([("v", pa.int64())]))  # created with the engine's config
    for v in range(60):
        write_deltalake(uri, pa.table({"v": [v]}), mode="overwrite")
    checkpoint = pq.read_table(os.path.join(uri, "_delta_log", f"{49:020d}.checkpoint.parquet"))
    assert checkpoint.column("add").drop_null().to_pylist()[0]["path"]  # the one live file
    assert len(checkpoint.column("add").drop_null()) == 1
    assert len(checkpoint.column("remove").drop_null()) == 0  # 7-day default: 50 tombstones
    assert DeltaTable(uri, version=30).to_pyarrow_table().column("v").to_pylist() == [29]
    assert DeltaTable(uri).to_pyarrow_table().column("v").to_pylist() == [59]


def test_setting_the_properties_of_an_old_table_drops_its_tombstones_from_then_on(tmp_path):
    """A table created before the engine's configuration (7-day tombstones) gets it as one
    metadata-only commit (files unchanged, the action count verify reads): the next
    checkpoint carries no tombstones, older versions still load, and setting it again commits
    nothing."""
    import json

    from dbsp_pipeline.storage.delta_store import ACTIONS_KEY, DEFAULT_CONFIGURATION

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"v": [0]}), configuration={"delta.checkpointInterval": "50"})
    for v in range(1, 30):
        write_deltalake(uri, pa.table({"v": [v]}), mode="overwrite")
    store = open_table_store(uri, pa.schema([("v", pa.int64())]))
    assert "delta.deletedFileRetentionDuration" not in store.properties()
    files = [f.path for f in store.files()]
    assert store.set_properties(DEFAULT_CONFIGURATION) is True
    assert store.version() == 30 and [f.path for f in store.files()] == files
    assert store.properties()["delta.deletedFileRetentionDuration"] == "interval 0 seconds"
    with open(os.path.join(uri, "_delta_log", f"{30:020d}.json")) as fh:
        actions = [json.loads(line) for line in fh if line.strip()]
    assert sorted(k for a in actions for k in a) == ["commitInfo", "metaData"]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert int(info[ACTIONS_KEY]) == 1
    assert store.set_properties(DEFAULT_CONFIGURATION) is False and store.version() == 30
    for v in range(30, 60):
        write_deltalake(uri, pa.table({"v": [v]}), mode="overwrite")
    checkpoint = pq.read_table(os.path.join(uri, "_delta_log", f"{49:020d}.checkpoint.parquet"))
    assert len(checkpoint.column("remove").drop_null()) == 0
    assert DeltaTable(uri, version=20).to_pyarrow_table().column("v").to_pylist() == [20]
