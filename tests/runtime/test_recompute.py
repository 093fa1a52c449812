"""The recomputation oracle: a healthy pipeline's views equal their recomputation; a view whose
state drifted is caught, and so is a non-positive multiplicity."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

from dbsp_pipeline import Circuit, Pipeline, UsageError
from dbsp_pipeline.runtime.recompute import check_views, recompute
from infra.console import REPO
from tests.object_store_helpers import new_bucket
from tests.runtime import workload


def test_a_healthy_pipeline_matches_its_recomputation(spark, tmp_path):
    with workload.open_pipeline(str(tmp_path), spark) as p:
        for r, pushes in enumerate(workload.rounds(6)):
            workload.play_round(p, r, pushes)
        p.collect_garbage(grace_seconds=0)  # consolidates consumed input: still the same sum
        checks = check_views(p)
        assert set(checks) == {"by_region", "regions"}
        for c in checks.values():
            assert c.equal and c.nonpositive == 0 and c.rows > 0 and c.step == 5
        assert sorted(recompute(p, ["regions"])["regions"].column("region").to_pylist()) == \
            sorted(p.view_arrow("regions").column("region").to_pylist())


def test_drifted_state_and_bad_multiplicities_are_caught(spark, tmp_path):
    root = str(tmp_path)
    with workload.open_pipeline(root, spark) as p:
        for r, pushes in enumerate(workload.rounds(3)):
            workload.play_round(p, r, pushes)
        # Corrupt the output log as a lost or doubled update would: a row too many, a row
        # deleted, a row deleted that never was there (multiplicity -1).
        log = p.engine.outputs["regions"]
        bad = pa.table({"region": ["region-9", "region-0", "region-8"], "_step": [2, 2, 2],
                        "_weight": [1, -1, -1]}, schema=log.table.arrow_schema)
        log.table.commit(log.table.write_arrow(bad))
        checks = check_views(p)
    assert checks["by_region"].equal
    c = checks["regions"]
    assert (c.missing, c.extra, c.nonpositive) == (2, 1, 1)
    assert not c.equal


def test_stream_operators_cannot_be_recomputed_from_a_snapshot(spark, tmp_path):
    c = Circuit("stream")
    x = c.input("x", "k BIGINT")
    c.output("d", x.delay())
    with Pipeline(c, str(tmp_path), spark) as p:
        with pytest.raises(UsageError, match="delay"):
            recompute(p)
    assert os.path.isdir(tmp_path)


CHECK_WITHOUT_SPARK = """
import sys
from pyspark import SparkContext
from dbsp_pipeline.runtime.recompute import check_views
from tests.runtime import workload
with workload.open_pipeline(sys.argv[1]) as p:
    checks = check_views(p)
print(sorted(checks), all(c.equal for c in checks.values()),
      SparkContext._active_spark_context is not None)
"""


def test_recomputing_an_s3_root_compiles_from_its_schema_cache(spark, object_store,
                                                               monkeypatch):
    """The recomputation's scratch pipeline takes the analysed schemas from the root, an
    object-store root too: a driver-path process checks its views without starting a JVM."""
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    root = f"s3://{new_bucket(object_store, 'recompute')}/crash"
    with workload.open_pipeline(root, spark) as p:  # analyses the circuit, caches the schemas
        for r, pushes in enumerate(workload.rounds(2)):
            workload.play_round(p, r, pushes)
    done = subprocess.run(
        [sys.executable, "-c", CHECK_WITHOUT_SPARK, root], capture_output=True, text=True,
        timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "['by_region', 'regions'] True False"
