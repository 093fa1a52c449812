"""Crash injection at every durable action of the push, step and commit protocol.

A workload of rounds (idempotent pushes, then a step) runs once without a crash; then, for every
crash point the workload passes (and several passes of each), it runs again with a crash there:
the pipeline object is abandoned as a dead process would leave it, the root is reopened (which
re-executes the divided but uncommitted steps), the producer re-pushes the round it was in
(its sequence numbers make that exactly-once) and the workload goes on. Afterwards a consumer
of the output logs must see exactly the no-crash output, step by step, and every trace must
hold exactly the no-crash state.
"""

from __future__ import annotations

from collections import Counter

import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash


def circuit() -> Circuit:
    c = Circuit("crash")
    o = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    cu = c.input("customers", "customer_id BIGINT, region STRING")
    joined = o.join(cu, on="customer_id")
    c.output("by_region", joined.group_by("region").agg(n="count(*)", hi="max(amount)",
                                                        s="sum(amount)"))
    c.output("regions", joined.select("region").distinct())
    return c


def rounds() -> list[list[tuple]]:
    """(input, rows, weight) pushes per round; the round ends with a step."""
    out = []
    for r in range(6):
        pushes = [("orders", [(r * 10 + i, i % 4, float(r + i)) for i in range(5)], 1)]
        if r % 2 == 0:
            pushes.append(("customers", [(r // 2, f"region-{r % 3}")], 1))
        if r >= 2:
            pushes.append(("orders", [((r - 2) * 10 + 4, 4 % 4, float(r - 2 + 4))], -1))
        out.append(pushes)
    return out


def run_workload(spark, root: str, crash: tuple[str, int] | None = None) -> bool:
    """Run the rounds, crashing once at ``crash``; returns whether the crash happened."""
    crash_points.reset()
    if crash is not None:
        crash_points.arm(*crash)
    crashed = False
    p = None
    r = 0
    work = rounds()
    while r < len(work):
        try:
            if p is None:
                p = Pipeline(circuit(), root, spark, checkpoint_every=2, compact_threshold=3)
            if p.next_step == r:  # the round's step has not run yet (maybe replayed at open)
                for i, (name, rows, weight) in enumerate(work[r]):
                    p.push(name, rows, weight=weight, producer="loader", seq=r * 10 + i)
                p.step()
            r += 1
        except InjectedCrash:
            assert not crashed, "crashed twice"
            crashed, p = True, None  # abandoned: no close, no commit
    try:
        p.close()
    except InjectedCrash:
        crashed = True
        Pipeline(circuit(), root, spark).close()
    return crashed


def consumer_view(spark, root: str) -> dict[str, dict[int, Counter]]:
    """What a consumer of the output logs sees: per view, per step, the changed rows."""
    out: dict[str, dict[int, Counter]] = {}
    with Pipeline(circuit(), root, spark) as p:
        for view in p.circuit.outputs:
            steps: dict[int, Counter] = {}
            for row in p.changes(view).collect():
                d = row.asDict()
                steps.setdefault(d.pop("_step"), Counter())[tuple(sorted(d.items()))] += 1
            out[view] = steps
        state = {t.name: Counter({tuple(r[:-1]): r[-1] for r in _consolidated(p, t)})
                 for t in p._plan.traces()}
    return {"outputs": out, "state": state}


def _consolidated(p: Pipeline, trace) -> list[tuple]:
    rows = p._sql.consolidate(trace.read_arrow(), trace.payload)
    return [tuple(r.values()) for r in rows.to_pylist()]


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("no-crash"))
    assert not run_workload(spark, root)
    return consumer_view(spark, root), crash_points.passes()




def test_every_crash_point_recovers_to_the_no_crash_output_and_state(spark, tmp_path, reference):
    expected, passes = reference
    points = sorted(passes)
    # The protocol's durable actions all appear in the workload.
    for required in ("input.commit.before", "input.commit.after", "division.commit.before",
                     "division.commit.after", "trace.commit.before", "trace.commit.after",
                     "output.commit.before", "output.commit.after", "manifest.commit.before",
                     "manifest.commit.after"):
        assert required in points, required
    cases = []
    for point in points:
        n = passes[point]
        cases += [(point, k) for k in sorted({1, (n + 1) // 2, n})]
    failures = []
    for i, (point, k) in enumerate(cases):
        root = str(tmp_path / f"case{i}")
        crashed = run_workload(spark, root, (point, k))
        assert crashed, f"{point} pass {k} was not reached"
        got = consumer_view(spark, root)
        if got != expected:
            failures.append((point, k))
    assert not failures, f"recovery differs from the no-crash run after crashes at {failures}"
    assert len(cases) >= 25
