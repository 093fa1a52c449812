"""``dbsp_pipeline.root``: every folder of a root is named there alone, and a root is read
without opening it (status, lag, pipeline id)."""

from __future__ import annotations

import pathlib
import re
import time

import pytest

from dbsp_pipeline import Circuit, Pipeline, PipelineStatus, read_status
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.root import read_lag, read_pipeline_id

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


@pytest.mark.parametrize("read", [
    lambda root: read_status(root, ["x"]),
    lambda root: read_lag(root, ["x"], 0.0),
    read_pipeline_id,
])
def test_readers_of_local_roots_refuse_an_object_store_root(read):
    """An s3:// root is refused by name, never answered from an empty local folder."""
    with pytest.raises(UsageError, match="local roots only, not s3://bucket/shop"):
        read("s3://bucket/shop")
