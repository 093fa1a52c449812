"""The crash-test workload: a circuit, rounds of idempotent pushes each ended by a step, a
driver that resumes where a crashed run left off, and what a consumer and the state look like.
Used in-process (crash points) and by the child processes that get killed."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from dbsp_pipeline import Circuit, Pipeline, StepResult
from dbsp_pipeline.runtime.recompute import check_views


def circuit() -> Circuit:
    c = Circuit("crash")
    o = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    cu = c.input("customers", "customer_id BIGINT, region STRING")
    joined = o.join(cu, on="customer_id")
    c.output("by_region", joined.group_by("region").agg(n="count(*)", hi="max(amount)",
                                                        s="sum(amount)", a="avg(amount)"))
    c.output("regions", joined.select("region").distinct())
    return c


def rounds(n: int = 6) -> list[list[tuple]]:
    """(input, rows, weight) pushes per round; each round ends with a step."""
    out = []
    for r in range(n):
        pushes = [("orders", [(r * 10 + i, i % 4, _cents(r, i)) for i in range(5)], 1)]
        if r % 2 == 0:
            pushes.append(("customers", [(r // 2 % 4, f"region-{r % 3}")], 1))
        if r >= 2:
            pushes.append(("orders", [((r - 2) * 10 + 4, 0, _cents(r - 2, 4))], -1))
        out.append(pushes)
    return out


def _cents(r: int, i: int) -> float:
    """An amount with cents: sums of such doubles depend on the order of additions unless the
    engine sums exactly, so every replay, restore and recovery must give the same bits."""
    return (r * 1_337 + i * 111 + 1) % 100_000 / 100


def open_pipeline(root: str, spark=None) -> Pipeline:
    return Pipeline(circuit(), root, spark, checkpoint_every=2, compact_threshold=3)


def play_round(p: Pipeline, r: int, pushes: list[tuple]) -> StepResult | None:
    """Round ``r``: its pushes (sequence numbers make a repeat exactly-once), then its step,
    whose result it returns; nothing if the step already ran (maybe replayed when the pipeline
    was reopened)."""
    if p.next_step != r:
        return None
    for i, (name, rows, weight) in enumerate(pushes):
        p.push(name, rows, weight=weight, producer="loader", seq=r * 10 + i)
    return p.step()


def play_round_carried(p: Pipeline, r: int, pushes: list[tuple]) -> StepResult | None:
    """Round ``r`` as one step that carries its pushes (``Pipeline.step(changes)``): per
    input, the round's pushes as one Z-set, recorded with the producer's number ``r`` (so a
    repeat after a crash pushes none twice); nothing if the step already ran."""
    if p.next_step != r:
        return None
    rows: dict[str, list[dict]] = {}
    for name, batch, weight in pushes:
        columns = p.input_arrow_schema(name).names
        rows.setdefault(name, []).extend(dict(zip(columns, (*row, weight))) for row in batch)
    changes = {name: pa.Table.from_pylist(batch, schema=p.input_arrow_schema(name))
               for name, batch in rows.items()}
    return p.step(changes, producer="loader", seq=r)


def consumer_view(spark, root: str) -> dict:
    """What a consumer of the output logs sees (per view, per step, the changed rows), and the
    consolidated content of every trace."""
    outputs: dict[str, dict[int, Counter]] = {}
    with open_pipeline(root, spark) as p:
        # The change log integrates to the view computed from scratch, floats bit for bit, with
        # no row of non-positive multiplicity (a replay that summed floats in another order
        # used to leave a +1/-1 pair whose totals differ in the last bits).
        for check in check_views(p).values():
            assert check.equal and check.nonpositive == 0, (root, check)
        for view in p.circuit.outputs:
            steps: dict[int, Counter] = {}
            for row in p.changes(view).collect():
                d = row.asDict()
                steps.setdefault(d.pop("_step"), Counter())[tuple(sorted(d.items()))] += 1
            outputs[view] = steps
        state = {}
        for t in p.engine.plan.traces():
            rows = p.engine.sql.consolidate(t.read_arrow(), t.payload).to_pylist()
            state[t.name] = Counter({tuple(r.values())[:-1]: r["_weight"] for r in rows})
    return {"outputs": outputs, "state": state}
