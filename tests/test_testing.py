"""``dbsp_pipeline.testing``: the fault-injecting store crashes at the named points around each
durable action, and what a crash leaves durable is what the point's name says."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dbsp_pipeline import testing
from dbsp_pipeline.storage.table_store import open_table_store

SCHEMA = pa.schema([("key", pa.string())])


@pytest.fixture(autouse=True)
def disarmed():
    testing.reset()
    yield
    testing.reset()


def store(path: str) -> testing.FaultInjectingTableStore:
    return testing.FaultInjectingTableStore(open_table_store(path, SCHEMA), "output")


def test_a_crash_before_a_commit_leaves_nothing_and_after_leaves_all(tmp_path) -> None:
    uri = str(tmp_path / "t")
    s = store(uri)
    testing.arm("output.commit.before")
    with pytest.raises(testing.InjectedCrash, match="output.commit.before"):
        s.commit(s.write_arrow(pa.table({"key": ["a"]}, schema=SCHEMA)), app_id="w",
                 app_version=1)
    reopened = store(uri)
    assert reopened.version() == 0 and reopened.transaction_version("w") is None
    testing.arm("output.commit.after")
    with pytest.raises(testing.InjectedCrash, match="output.commit.after"):
        reopened.commit(reopened.write_arrow(pa.table({"key": ["b"]}, schema=SCHEMA)),
                        app_id="w", app_version=1)
    assert store(uri).version() == 1 and store(uri).transaction_version("w") == 1


def test_points_are_named_by_role_and_action_and_counted(tmp_path) -> None:
    s = store(str(tmp_path / "t"))
    adds = s.write_arrow(pa.table({"key": ["a"]}, schema=SCHEMA))
    s.commit(adds)
    s.commit([], [s.path(adds[0].path)], data_change=False)
    testing.arm("output.restore.after", 1)
    with pytest.raises(testing.InjectedCrash):
        s.restore(1)
    assert s.version() == 3  # the rollback was durable before the crash
    assert testing.passes() == {
        "output.commit.before": 1, "output.commit.after": 1,
        "output.rewrite.before": 1, "output.rewrite.after": 1,
        "output.restore.before": 1, "output.restore.after": 1}


def test_the_second_pass_crashes_when_armed_for_it(tmp_path) -> None:
    s = store(str(tmp_path / "t"))
    testing.arm("output.commit.before", 2)
    s.commit()
    with pytest.raises(testing.InjectedCrash):
        s.commit()
    assert s.version() == 1


def test_a_log_cleanup_passes_points_around_and_between_its_deletions(tmp_path) -> None:
    """Cleanup deletes one log file at a time, oldest first: a crash between two deletions
    leaves a log that starts later and loads every version from the Delta checkpoint on."""
    uri = str(tmp_path / "t")
    s = testing.FaultInjectingTableStore(
        open_table_store(uri, SCHEMA, {"delta.checkpointInterval": "3"}), "trace")
    for key in "abcdefg":
        s.commit(s.write_arrow(pa.table({"key": [key]}, schema=SCHEMA)))
    testing.reset()
    below = s.log_files_below(s.version())  # below the Delta checkpoint at version 5
    assert below == sorted(below) and len(below) >= 6  # zero-padded versions: oldest first
    assert s.clean_log_below(1) == 0 and not testing.passes()  # no deletion: no point
    testing.arm("trace.cleanup.between", 2)
    with pytest.raises(testing.InjectedCrash):
        s.clean_log_below(s.version())
    left = sorted((tmp_path / "t" / "_delta_log").iterdir())
    assert left[0].name == below[2]  # the two oldest went, and nothing else
    assert testing.passes() == {"trace.cleanup.before": 1, "trace.cleanup.between": 2}
    reopened = store(uri)
    assert sorted(r["key"] for r in reopened.read_arrow(
        [f.path for f in reopened.files()]).to_pylist()) == list("abcdefg")
    assert reopened.clean_log_below(reopened.version()) == len(below) - 2
    assert testing.passes()["output.cleanup.after"] == 1
