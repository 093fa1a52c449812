"""Damaged storage is detected when a root is opened and never read: the newest commit of every
table kind emptied or cut off, a data file deleted, a Delta checkpoint cut off. Opening refuses
with ``CorruptStateError`` naming the table, version and file, and whether an older retained
checkpoint is intact; restoring that one gives the view an undamaged root gives. A damaged
schema cache is rebuilt. ``verify`` reports a root per table and checkpoint."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from dbsp_pipeline import Circuit, CorruptStateError, Pipeline, verify
from dbsp_pipeline.runtime.plan import SCHEMA_CACHE_FILE, read_schema_cache
from dbsp_pipeline.storage import crash_points, state_db
from dbsp_pipeline.storage.crash_points import InjectedCrash
from dbsp_pipeline.storage.set_aside import SET_ASIDE_DIR

TRACE = "state/n1_aggregate_groups"
#: the view after the three built steps and ``step_once_more``
EXPECTED = [{"r": "a", "n": 10, "_weight": 1}]
#: per table, the checkpoint still intact when its newest commit is damaged: every checkpoint
#: reads the logs; only the newest (3) reads the newest trace commit and manifest entry
INTACT_WITHOUT_NEWEST = {"inputs/x": None, "_divisions": None, "outputs/n": None, TRACE: 2,
                         "_manifest": 2}


def circuit() -> Circuit:
    c = Circuit("v")
    x = c.input("x", "k BIGINT, r STRING")
    c.output("n", x.group_by("r").agg(n="count(*)"))
    return c


@pytest.fixture(scope="module", autouse=True)
def fold_at_every_checkpoint():
    """Every checkpoint folds the traces' staged actions into their Delta logs, so each
    checkpoint reads its own newest trace commit (what the damage cases below are about); the
    staged files a checkpoint reads are damaged in ``test_a_missing_staged_file_is_named``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(state_db, "FOLD_ACTIONS", 1)
        yield


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory) -> str:
    """A root after three steps of three rows each (region ``a`` counts 9), checkpoints 3 and 2
    retained."""
    root = str(tmp_path_factory.mktemp("verify") / "root")
    with Pipeline(circuit(), root, spark) as p:
        for i in range(3):
            p.push("x", [(i * 10 + j, "a") for j in range(3)])
            p.step()
    return root


def copy_of(built: str, tmp_path) -> str:
    root = str(tmp_path / "root")
    shutil.copytree(built, root)
    return root


def newest_commit(root: str, table: str) -> str:
    return max(glob.glob(os.path.join(root, table, "_delta_log", "*.json")))


def newest_added_file(root: str, table: str) -> str:
    """The data file the table's newest commit that adds one added."""
    for commit in sorted(glob.glob(os.path.join(root, table, "_delta_log", "*.json")),
                         reverse=True):
        adds = [json.loads(line)["add"] for line in open(commit) if '"add"' in line[:8]]
        if adds:
            return os.path.join(root, table, adds[0]["path"])
    raise AssertionError(f"no commit of {table} adds a file")


def damage(path: str, how: str) -> None:
    data = open(path, "rb").read()
    kept = {"empty": b"", "cut": data[:len(data) // 2],
            "cut_at_line": data[:data.index(b"\n") + 1]}[how]  # only the commit information
    with open(path, "wb") as fh:
        fh.write(kept)


def step_once_more(root: str, spark, **options) -> list[dict]:
    with Pipeline(circuit(), root, spark, **options) as p:
        p.push("x", [(99, "a")])
        p.step()
        return p.view_arrow("n").to_pylist()


@pytest.mark.parametrize("how", ["empty", "cut", "cut_at_line"])
@pytest.mark.parametrize("table", list(INTACT_WITHOUT_NEWEST))
def test_a_damaged_newest_commit_is_named_and_never_read(spark, built, tmp_path, table, how):
    root = copy_of(built, tmp_path)
    commit = newest_commit(root, table)
    damage(commit, how)
    with pytest.raises(CorruptStateError) as e:
        Pipeline(circuit(), root, spark)
    error, version = e.value, int(os.path.basename(commit)[:20])
    assert (error.table, error.version, error.file) == (table, version, commit)
    assert f"table '{table}', version {version}, file {commit}" in str(error)
    intact = INTACT_WITHOUT_NEWEST[table]
    assert error.intact_checkpoint == intact
    if intact is None:  # a log: every checkpoint reads it, so restoring none helps
        assert "no retained checkpoint is intact (checked: 3, 2)" in str(error)
        with pytest.raises(CorruptStateError, match="checkpoint 2 cannot be restored"):
            Pipeline(circuit(), root, spark, checkpoint=2)
        return
    assert f"checkpoint {intact} (after step 1) is intact" in str(error)
    # Restoring it sets the damaged newer state aside and executes step 2 again.
    assert step_once_more(root, spark, checkpoint=intact) == EXPECTED
    assert os.listdir(os.path.join(root, table, SET_ASIDE_DIR))
    assert verify(root).ok
    assert step_once_more(root, spark)[0]["n"] == 11  # and it opens as usual again


@pytest.mark.parametrize("table", ["_manifest", TRACE, "inputs/x"])
def test_a_missing_data_file_is_named(spark, built, tmp_path, table):
    root = copy_of(built, tmp_path)
    path = newest_added_file(root, table)
    os.remove(path)
    with pytest.raises(CorruptStateError, match="data file is missing") as e:
        Pipeline(circuit(), root, spark)
    assert (e.value.table, e.value.file) == (table, path)
    intact = INTACT_WITHOUT_NEWEST[table]
    assert e.value.intact_checkpoint == intact
    if intact is not None:
        assert step_once_more(root, spark, checkpoint=intact) == EXPECTED


def test_a_data_file_that_is_not_what_its_commit_records_is_named(spark, built, tmp_path):
    root = copy_of(built, tmp_path)
    path = newest_added_file(root, "outputs/n")
    damage(path, "cut")
    with pytest.raises(CorruptStateError, match="bytes but its commit records") as e:
        Pipeline(circuit(), root, spark)
    assert (e.value.table, e.value.file) == ("outputs/n", path)


def test_a_damaged_delta_checkpoint_is_named(spark, tmp_path):
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        for i in range(9):  # the 9th push is version 9, whose commit writes a Delta checkpoint
            p.push("x", [(i, "b")])
    [checkpoint] = glob.glob(os.path.join(root, "inputs", "x", "_delta_log", "*.parquet"))
    damage(checkpoint, "cut")
    with pytest.raises(CorruptStateError, match="the Delta checkpoint is unreadable") as e:
        Pipeline(circuit(), root, spark)
    assert (e.value.table, e.value.file) == ("inputs/x", checkpoint)


def test_damage_to_a_step_not_yet_committed_is_set_aside_by_restoring_the_newest_checkpoint(
        spark, built, tmp_path):
    root = copy_of(built, tmp_path)
    crash_points.reset()
    p = Pipeline(circuit(), root, spark)
    p.push("x", [(99, "a")])
    crash_points.arm("manifest.commit.before")  # step 3 wrote its trace, not its checkpoint
    with pytest.raises(InjectedCrash):
        p.step()
    commit = newest_commit(root, TRACE)
    damage(commit, "empty")
    with pytest.raises(CorruptStateError) as e:
        Pipeline(circuit(), root, spark)
    assert (e.value.file, e.value.intact_checkpoint) == (commit, 3)
    with Pipeline(circuit(), root, spark, checkpoint=3) as q:
        assert q.recovered_steps == [] and q.next_step == 3  # step 3 was never recorded
        q.step()  # its input is still pending
        assert q.view_arrow("n").to_pylist() == EXPECTED
    [folder] = os.listdir(os.path.join(root, TRACE, SET_ASIDE_DIR))
    assert os.path.basename(commit) in os.listdir(os.path.join(root, TRACE, SET_ASIDE_DIR,
                                                               folder))


def test_restore_of_an_open_pipeline_sets_damaged_newer_state_aside(spark, built, tmp_path):
    root = copy_of(built, tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        damage(newest_commit(root, TRACE), "cut")
        report = p.verify()
        assert [(c.version, c.intact) for c in report.checkpoints] == [(3, False), (2, True)]
        assert [r.step for r in p.restore(2)] == [2]
        p.push("x", [(99, "a")])
        p.step()
        assert p.view_arrow("n").to_pylist() == EXPECTED
    assert verify(root).ok


@pytest.mark.parametrize("content", ["[]", "schemas of the right key"])
def test_a_damaged_schema_cache_is_rebuilt(spark, built, tmp_path, content):
    root = copy_of(built, tmp_path)
    path = os.path.join(root, SCHEMA_CACHE_FILE)
    if content != "[]":
        key, _ = read_schema_cache(path)
        content = json.dumps({"key": key, "schemas": {"0": "not a schema", "1": []}})
    with open(path, "w") as fh:
        fh.write(content)
    [problem] = verify(root).side_files
    assert problem.file == path and "schema cache" in problem.problem
    assert step_once_more(root, spark) == EXPECTED
    read_schema_cache(path)  # written anew
    assert verify(root).ok


def test_verify_reports_every_table_and_checkpoint(built, tmp_path):
    root = copy_of(built, tmp_path)
    report = verify(root)
    assert report.ok and report.newest_intact == 3
    assert {t.table: t.kind for t in report.tables} == {
        "_manifest": "manifest", "_divisions": "divisions", "inputs/x": "input",
        "outputs/n": "output", TRACE: "state"}
    assert [(c.version, c.step, c.intact) for c in report.checkpoints] == [(3, 3, True),
                                                                           (2, 2, True)]
    commit = newest_commit(root, TRACE)
    damage(commit, "empty")
    report = verify(root)
    assert not report.ok and report.newest_intact == 2
    tables = {t.table: t for t in report.tables}
    assert [d.file for d in tables[TRACE].damage] == [commit]
    assert all(t.ok for name, t in tables.items() if name != TRACE)
    assert f"{TRACE}" in report.describe() and "DAMAGED" in report.describe()
    assert report.to_dict()["checkpoints"][0]["damage"][0]["file"] == commit


def test_the_report_counts_what_a_checkpoint_stages_on_a_state_table(spark, tmp_path,
                                                                     monkeypatch):
    """Between folds a state table's changes are staged in the manifest's entries, not in its
    Delta log: the report counts them beside the Delta version's files (an operator reading
    only those would think the state empty), and names each checkpoint by the step after which
    it was taken."""
    monkeypatch.setattr(state_db, "FOLD_ACTIONS", 32)  # (the module folds at every checkpoint)
    root = str(tmp_path / "root")
    with Pipeline(circuit(), root, spark) as p:
        for i in range(3):
            p.push("x", [(i * 10 + j, r) for j, r in enumerate("abc")])
            p.step()
    report = verify(root)
    assert report.ok
    groups = next(t for t in report.tables if t.table == TRACE)
    assert groups.staged_files >= 3  # (one file a step: no merge yet)
    assert groups.staged_rows > 0
    line = next(line for line in report.describe().splitlines() if TRACE in line)
    assert f"+ staged files {groups.staged_files:>5}  rows {groups.staged_rows:>9}" in line
    assert "checkpoint 3 (after step 2): intact" in report.describe()
    assert report.to_dict()["tables"][[t.table for t in report.tables].index(TRACE)][
        "staged_files"] == groups.staged_files


STEPPING = """
import sys, time
from dbsp_pipeline import Circuit, Pipeline
c = Circuit("v")
x = c.input("x", "k BIGINT, r STRING")
c.output("n", x.group_by("r").agg(n="count(*)"))
c.output("all", x.distinct())
with Pipeline(c, sys.argv[1], checkpoint_every=1) as p:
    for i in range(int(sys.argv[2])):
        p.push("x", [(i, "ab"[i % 2]), (i + 1, "c")])
        p.step()
        if i == 5:
            open(sys.argv[1] + ".ready", "w").close()
"""


def test_a_root_a_pipeline_is_stepping_is_never_reported_damaged(tmp_path):
    """A check reads the tables one by one while a running pipeline moves them at every step:
    what it reads may mix versions (the outputs past the divisions it read, a Delta log file
    cleaned away). Neither ``verify`` nor the check opening makes is ever damage then: each
    starts again, and a root that keeps moving is ``RootInUseError``."""
    import subprocess
    import sys
    import time

    from dbsp_pipeline import RootInUseError
    from dbsp_pipeline.storage.verify import prepare_open

    root = str(tmp_path / "running")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    child = subprocess.Popen([sys.executable, "-c", STEPPING, root, "400"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(root + ".ready") and child.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(root + ".ready"), child.communicate()[0][-3000:]
        checks = {"ok": 0, "in use": 0}
        while child.poll() is None:
            try:
                report = verify(root)
                assert report.ok, report.describe()
                prepare_open(root)
                checks["ok"] += 1
            except RootInUseError as e:
                assert "another process wrote it while it was read" in str(e)
                checks["in use"] += 1
        assert child.returncode == 0, child.communicate()[0][-3000:]
        assert checks["ok"] + checks["in use"] >= 5, checks
    finally:
        if child.poll() is None:
            child.kill()
    assert verify(root).ok
