"""``dbsp_pipeline.root``: every folder of a root is named there alone, and a root is read
without opening it (status, lag, pipeline id)."""

from __future__ import annotations

import os
import pathlib
import re
import time

from deltalake import DeltaTable

from dbsp_pipeline import Circuit, Pipeline, PipelineStatus, read_status
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.root import read_lag, read_pipeline_id
from dbsp_pipeline.storage.s3_store import s3_options
from tests.object_store_helpers import new_bucket

PACKAGE = pathlib.Path(root_layout.__file__).parent
#: a folder name of a root spelled as a string literal in a path
SPELLED = re.compile(r'"(_divisions|_manifest|_errors|_readers|_plan_schemas\.json)"'
                     r'|os\.path\.join\([^)]*"(inputs|outputs|state)"')


def test_every_folder_of_a_root_is_spelled_only_in_the_root_module():
    spelled = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
               for path in PACKAGE.rglob("*.py") if path.name != "root.py"
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if SPELLED.search(line)]
    assert spelled == []


def circuit() -> Circuit:
    c = Circuit("status")
    x = c.input("x", "k BIGINT")
    c.output("n", x.group_by("k").agg(n="count(*)"))
    return c


def test_status_lag_and_pipeline_id_are_read_without_opening(spark, tmp_path):
    root = str(tmp_path / "root")
    assert read_status(root, ["x"]) == PipelineStatus(
        str(tmp_path / "root"), "", 0, {"x": 0}, {"x": 0}, {"x": 0}, None)
    assert root_layout.read_lag(root, ["x"], time.time()) == {"x": 0.0}
    with Pipeline(circuit(), root, spark) as p:
        p.push("x", [(1,)])
        p.step()
        pushed_at = time.time()
        p.push("x", [(2,)])
        p.push("x", [(3,)])
        status = read_status(root, ["x"])
        assert status.pipeline_id == p.pipeline_id == root_layout.read_pipeline_id(root) != ""
        assert status.divided_steps == 1 and status.pending == {"x": 2}
        assert status.versions["x"] == status.divided["x"] + 2
        assert status.oldest_pending is not None and status.oldest_pending <= time.time()
        lag = root_layout.read_lag(root, ["x"], pushed_at + 60)
        assert 55 < lag["x"] <= 61
        p.step()
        assert not read_status(root, ["x"]).has_pending_input
        assert root_layout.read_lag(root, ["x"], time.time()) == {"x": 0.0}


def _figures(status: PipelineStatus) -> tuple:
    """What a status says of the work, whichever root it was read from."""
    return (status.divided_steps, status.versions, status.divided, status.pending,
            status.oldest_pending is not None)


def _play_and_read(spark, root: str) -> list:
    """Pushes and steps at ``root``, with what the readers say of it after each."""
    seen: list = [_figures(read_status(root, ["x"])), read_lag(root, ["x"], 0.0),
                  read_pipeline_id(root), root_layout.exists(root)]
    with Pipeline(circuit(), root, spark) as p:
        p.push("x", [(1,)])
        p.step()
        p.push("x", [(2,)])
        p.push("x", [(3,)])
        status = read_status(root, ["x"])
        assert status.root == root.rstrip("/")
        assert status.pipeline_id == p.pipeline_id == read_pipeline_id(root) != ""
        assert status.oldest_pending is not None
        lag = read_lag(root, ["x"], status.oldest_pending + 60)
        seen += [_figures(status), lag, root_layout.exists(root)]
        p.step()
        seen += [_figures(read_status(root, ["x"])), read_lag(root, ["x"], time.time())]
    return seen


def test_status_lag_and_pipeline_id_of_an_s3_root_agree_with_a_local_root(
        spark, object_store, tmp_path, monkeypatch):
    """The readers read an object-store root through its store: the same figures as for the
    same pushes and steps at a local root, and nothing of the s3:// root on the local disk."""
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    local = _play_and_read(spark, str(tmp_path / "root"))
    remote = _play_and_read(spark, f"s3://{new_bucket(object_store, 'status')}/shop/")
    assert remote == local
    assert local[:4] == [(0, {"x": 0}, {"x": 0}, {"x": 0}, False), {"x": 0.0}, "", False]
    assert local[4][3] == {"x": 2} and local[5] == {"x": 60.0} and local[6] is True
    assert local[7][3] == {"x": 0} and local[8] == {"x": 0.0}
    assert os.listdir(tmp_path) == ["root"]


def division_files(root: str) -> int:
    """How many data files the division log's newest version holds (what status reads)."""
    uri = root_layout.divisions(root)
    return len(DeltaTable(uri, storage_options=s3_options(uri)).file_uris())


def test_division_compaction_bounds_what_status_reads_on_an_s3_root(
        spark, object_store, monkeypatch):
    """``read_status`` reads the division log's newest files: on s3 too, compaction keeps
    them few however many steps ran."""
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    root = f"s3://{new_bucket(object_store, 'compact')}/shop"
    steps = 8
    with Pipeline(circuit(), root, spark, checkpoint_every=2) as p:  # half in _divisions
        for s in range(steps):
            p.push("x", [(s,)])
            p.step()
        assert division_files(root) == steps // 2  # no collection yet
        assert read_status(root, ["x"]).divided_steps == steps  # the rest carried by entries
    # closing collected garbage: the steps below the oldest retained checkpoint collapsed
    assert division_files(root) <= 3
    status = read_status(root, ["x"])
    assert status.divided_steps == steps and not status.has_pending_input
    assert status.pending == {"x": 0} and status.divided["x"] <= status.versions["x"]


def test_a_run_key_names_the_pipeline_the_step_and_the_input_versions():
    status = PipelineStatus(root="r", pipeline_id="cf647a50-1234", divided_steps=3,
                            versions={"orders": 7, "customers": 2}, divided={}, pending={},
                            oldest_pending=None)
    assert status.run_key("shop") == "shop@cf647a50:from-step-3:customers=2,orders=7"
    before_the_first_open = PipelineStatus(root="r", pipeline_id="", divided_steps=0,
                                           versions={"orders": 0}, divided={}, pending={},
                                           oldest_pending=None)
    assert before_the_first_open.run_key("shop") == "shop@new:from-step-0:orders=0"
