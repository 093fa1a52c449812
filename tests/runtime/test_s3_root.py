"""A pipeline whose root is ``s3://bucket/prefix`` (a real SeaweedFS server), on the driver
path: pushes, steps, a crash and its recovery, checkpoints, reader leases and garbage
collection all keep their state in the object store and give what a local root gives."""

from __future__ import annotations

import os

import pytest

from dbsp_pipeline import Circuit, Pipeline, testing
from dbsp_pipeline.storage.small_files import list_names
from tests.object_store_helpers import new_bucket


def circuit() -> Circuit:
    c = Circuit("s3shop")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("revenue", orders.group_by("customer_id").agg(total="sum(amount)", n="count(*)"))
    return c


ROUNDS = [[(1, 7, 12.5), (2, 8, 3.0)], [(3, 7, 1.5)], [(4, 9, 2.0), (5, 8, 1.0)]]


def play(spark, root: str, crash_at: str | None = None) -> list[tuple[list, list]]:
    """The rounds, each pushed and stepped; with ``crash_at``, the pipeline crashes there in
    the second round, is abandoned and reopened. Returns each step's changes and the view."""
    testing.reset()
    p = Pipeline(circuit(), root=root, spark=spark, checkpoint_every=2)
    for r, rows in enumerate(ROUNDS):
        p.push("orders", [{"order_id": o, "customer_id": c, "amount": a} for o, c, a in rows],
               producer="loader", seq=r)
        if r == 1 and crash_at:
            testing.arm(crash_at)
            with pytest.raises(testing.InjectedCrash):
                p.step()
            # the crashed one is abandoned
            p = Pipeline(circuit(), root=root, spark=spark, checkpoint_every=2)
            # step 1's record (division and output) was written, not its checkpoint:
            # reopening executes it again from its recorded input and verifies it
            assert [s.step for s in p.recovered_steps] == [1] and p.next_step == 2
        else:
            p.step()
        if r == 0:
            p.commit()
    out = [(sorted(map(str, p.step_changes_arrow("revenue", s).to_pylist())), [])
           for s in range(len(ROUNDS))]
    view = sorted(map(str, p.view_arrow("revenue").to_pylist()))
    p.close()
    return out + [([], view)]


def test_an_s3_root_runs_recovers_and_collects_like_a_local_root(
        spark, object_store, tmp_path, monkeypatch) -> None:
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # nothing of an s3:// root may land on the local disk
    local = play(spark, str(tmp_path / "local"))
    root = f"s3://{new_bucket(object_store, 'root')}/shop"
    assert play(spark, root, crash_at="division.commit.after") == local
    assert os.listdir(tmp_path) == ["local"]

    p = Pipeline(circuit(), root=root, spark=spark)
    reader = p.reader("revenue", since=0)  # its lease is a small object in the root
    assert len(list_names(f"{root}/_readers")) == 1
    p.commit()
    assert len({c.step for c in p.checkpoints()}) == 2  # of two steps (retain_checkpoints)
    assert p.collect_garbage(grace_seconds=0) > 0
    assert sorted(map(str, p.view_arrow("revenue").to_pylist())) == local[-1][1]
    reader.close()
    assert list_names(f"{root}/_readers") == []
    p.close()
    assert os.listdir(tmp_path) == ["local"]
