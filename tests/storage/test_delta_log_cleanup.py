"""``TableStore.clean_log_below`` (local store): a Delta log loses the commits below its newest
readable Delta checkpoint at or before the oldest version still needed; every version from that
checkpoint on still loads, and a damaged checkpoint is never started from."""

from __future__ import annotations

import os

import pyarrow as pa
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
