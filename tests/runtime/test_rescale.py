"""Cold layout changes: after rescaling (W to W+1, W to W-1, W to 2W, 1 to 4 and back, and a
change of sharding function) the outputs and the state equal the never-rescaled run exactly;
every state file then belongs to one worker; a crash in the middle of a rescale recovers to the
old or the new layout, never a mix."""

from __future__ import annotations

import numpy as np
import pytest

from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash
from tests.runtime import workload
from tests.runtime.conftest import RESCALE_ROUNDS as ROUNDS


def owner_pure(p) -> bool:
    for trace in p.engine.plan.state_traces():
        for f in trace.files():
            rows = trace.read_arrow([f])
            if len(np.unique(trace.owners(p.layout, rows))) > 1:
                return False
    return True


@pytest.mark.parametrize("sharding, plan", [
    ("fixed", [4, 5]),     # W -> W+1
    ("fixed", [4, 3]),     # W -> W-1
    ("fixed", [3, 6]),     # W -> 2W
    ("fixed", [1, 4, 1]),  # 1 -> 4 and back
    ("dynamic", [4, 5, 3]),
    ("modulo", [4, 5]),
])
def test_outputs_after_rescales_equal_the_never_rescaled_run(spark, tmp_path, never_rescaled,
                                                             sharding, plan):
    root = str(tmp_path)
    first, *rest = plan
    with workload.open_pipeline(root, spark) as p:
        r0 = p.rescale(first, sharding=sharding)
        assert r0.new.workers == first and r0.new.sharding == sharding
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
            if r in (1, 3) and rest:
                target = rest.pop(0)
                result = p.rescale(target)
                assert result.new.workers == target and result.step == r + 1
                assert result.rows > 0 and 0 <= result.moved_rows <= result.rows
                assert owner_pure(p)
        final = p.layout
    with workload.open_pipeline(root, spark) as p:
        assert p.layout == final  # recorded with the checkpoint
        assert p.checkpoints()[0].layout == final
    assert workload.consumer_view(spark, root) == never_rescaled


def test_fixed_sharding_rewrites_less_than_modulo(spark, tmp_path):
    moved = {}
    for sharding in ("fixed", "modulo"):
        root = str(tmp_path / sharding)
        with workload.open_pipeline(root, spark) as p:
            p.rescale(4, sharding=sharding)
            for r, pushes in enumerate(ROUNDS):
                workload.play_round(p, r, pushes)
            p.compact(threshold=0)
            p.rescale(4)  # makes every file single-owner
            result = p.rescale(5)
            moved[sharding] = result.moved_rows / result.rows
    assert moved["fixed"] < moved["modulo"]


@pytest.mark.parametrize("point", ["trace.commit.before", "trace.commit.after",
                                   "rescale.before_commit", "manifest.commit.before",
                                   "manifest.commit.after"])
def test_a_crash_during_a_rescale_recovers_to_one_layout(spark, tmp_path, never_rescaled,
                                                        point):
    root = str(tmp_path)
    p = workload.open_pipeline(root, spark)
    for r, pushes in enumerate(ROUNDS[:3]):
        workload.play_round(p, r, pushes)
    old = p.layout
    p.commit()  # so the rescale's own commit is the one a manifest crash point hits
    crash_points.reset()
    crash_points.arm(point)
    with pytest.raises(InjectedCrash):
        p.rescale(3)
    crash_points.reset()
    del p  # abandoned, as by a crash: no close, no commit
    with workload.open_pipeline(root, spark) as p:
        assert p.layout in (old, old.rescaled(3))
        assert p.layout == (old if point in ("trace.commit.before", "trace.commit.after",
                                             "rescale.before_commit", "manifest.commit.before")
                            else old.rescaled(3))
        if p.layout.workers == 3:
            assert owner_pure(p)
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
    assert workload.consumer_view(spark, root) == never_rescaled
    assert Layout.from_json(old.to_json()) == old
