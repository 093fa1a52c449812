"""Every view against an oracle at a scale where the lookup machinery's big-file paths run.

``test_oracle.py`` draws its workloads from small key domains, so its traces stay a few small
files: lookups read them whole, or read keyed runs only where a test lowers
``keyed_runs.MIN_ROWS``. Here the traces hold tens of thousands of rows, so their files get
keyed runs (read by hash, ordered runs cut per key for min/max re-reads and top-k), in-memory
replicas (or none, ``trace_replica.MAX_ROWS`` at 0), and background merges; on the driver
(the declared plan and eager aggregation) and per owner on Spark at W=2.

The workload mixes, step by step, order inserts and deletes, deletes of customers' current
maximum order (sometimes the two largest), duplicate rows, re-inserts of deleted orders and
moves of customers between regions. Amounts mix cents (many ties), full-precision doubles and
values a million times bigger or smaller, so the sums are compared exactly with ``math.fsum``
(the engine's exact sums round to it) and every other value exactly. Between some steps the
pipeline is closed, local runs are deleted, cut short or have bytes changed, and the root is
reopened: the views go on equal to the oracle (a damaged run is rebuilt, never trusted).
"""

from __future__ import annotations

import glob
import math
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.storage import trace_replica
from tests.conftest import view_rows

REGIONS = 7


def build_circuit(eager: bool) -> Circuit:
    c = Circuit("oracle_at_scale", eager_aggregation=eager)
    o = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    cu = c.input("customers", "customer_id BIGINT, region BIGINT")
    c.output("revenue", o.filter("amount > 10").join(cu, on="customer_id").group_by("region")
             .agg(total="sum(amount)", n="count(*)", top="max(amount)", low="min(amount)"))
    c.output("per_customer", o.group_by("customer_id").agg(
        top="max(amount)", low="min(amount)", n="count(*)", s="sum(amount)"))
    c.output("top", o.top_k(10, ["amount DESC"]))
    c.output("top3", o.top_k(3, ["amount DESC"], partition_by=["customer_id"]))
    return c


class Workload:
    """Orders (ids ``0..``, each with a multiplicity) and customers (a region each), changed
    at random; ``step`` returns the step's Z-sets, ``expected`` every view from scratch."""

    def __init__(self, seed: int, orders: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.customers = max(orders // 15, 100)
        capacity = orders * 3
        self.customer_of = self.rng.integers(1, self.customers + 1, capacity)
        self.amount = self._amounts(capacity)
        self.count = np.zeros(capacity, dtype=np.int64)
        self.count[:orders] = 1
        self.next = orders
        self.region = self.rng.integers(0, REGIONS, self.customers + 1)

    def _amounts(self, n: int) -> np.ndarray:
        roll = self.rng.random(n)
        cents = np.round(self.rng.gamma(2.0, 40.0, n), 2)
        full = self.rng.gamma(2.0, 40.0, n) * (1 + self.rng.random(n))
        out = np.where(roll < 0.5, cents, full)
        out = np.where(roll > 0.97, out * 1e6, out)
        return np.where((roll > 0.94) & (roll <= 0.97), out * 1e-6, out)

    def initial(self) -> dict[str, pa.Table]:
        live = np.flatnonzero(self.count)
        ids = np.arange(1, self.customers + 1)
        return {"orders": self._orders(live, self.count[live]),
                "customers": self._customers(ids, self.region[ids], np.ones(len(ids), int))}

    def _orders(self, ids: np.ndarray, weights: np.ndarray) -> pa.Table:
        return pa.table({"order_id": ids.astype(np.int64),
                         "customer_id": self.customer_of[ids].astype(np.int64),
                         "amount": self.amount[ids],
                         "_weight": pa.array(weights, pa.int64())})

    @staticmethod
    def _customers(ids: np.ndarray, regions: np.ndarray, weights: np.ndarray) -> pa.Table:
        return pa.table({"customer_id": ids.astype(np.int64),
                         "region": regions.astype(np.int64),
                         "_weight": pa.array(weights, pa.int64())})

    def step(self) -> tuple[str, dict[str, pa.Table]]:
        rng = self.rng
        kind = str(rng.choice(["orders", "maxima", "moves", "duplicates", "mixed", "reinserts"],
                              p=[.3, .2, .15, .1, .2, .05]))
        ids: list[np.ndarray] = []
        weights: list[np.ndarray] = []
        live = np.flatnonzero(self.count > 0)
        if kind in ("orders", "mixed"):
            n = int(rng.integers(100, 3000))
            ids.append(np.arange(self.next, self.next + n))
            weights.append(np.ones(n, dtype=np.int64))
            self.next += n
            gone = rng.choice(live, int(n * rng.uniform(0.05, 0.5)), replace=False)
            ids.append(gone)
            weights.append(-np.ones(len(gone), dtype=np.int64))
        if kind in ("maxima", "mixed"):  # each chosen customer's largest order (or two)
            chosen = rng.choice(np.arange(1, self.customers + 1), int(rng.integers(10, 300)),
                                replace=False)
            theirs = live[np.isin(self.customer_of[live], chosen)]
            theirs = theirs[np.lexsort((self.amount[theirs], self.customer_of[theirs]))]
            owner = self.customer_of[theirs]
            last = np.append(owner[1:] != owner[:-1], True)
            gone = theirs[last]
            if rng.random() < 0.3 and len(theirs) > 1:
                second = np.append(last[1:] & (owner[1:] == owner[:-1]), False)
                gone = np.concatenate([gone, theirs[second]])
            ids.append(gone)
            weights.append(-np.ones(len(gone), dtype=np.int64))
        if kind == "duplicates":
            again = rng.choice(live, int(rng.integers(10, 1500)), replace=False)
            ids.append(again)
            weights.append(np.full(len(again), int(rng.integers(1, 3)), dtype=np.int64))
        if kind == "reinserts":
            dead = np.flatnonzero(self.count[:self.next] == 0)
            back = rng.choice(dead, min(len(dead), int(rng.integers(10, 800))), replace=False)
            ids.append(back)
            weights.append(np.ones(len(back), dtype=np.int64))
        changes = {}
        if ids:
            unique, where = np.unique(np.concatenate(ids), return_inverse=True)
            net = np.bincount(where, weights=np.concatenate(weights)).astype(np.int64)
            keep = (net != 0) & (self.count[unique] + net >= 0)
            unique, net = unique[keep], net[keep]
            self.count[unique] += net
            changes["orders"] = self._orders(unique, net)
        if kind in ("moves", "mixed"):
            moved = rng.choice(np.arange(1, self.customers + 1), int(rng.integers(10, 600)),
                               replace=False)
            before = self.region[moved].copy()
            self.region[moved] = (before + rng.integers(1, REGIONS, len(moved))) % REGIONS
            ones = np.ones(len(moved), dtype=np.int64)
            changes["customers"] = self._customers(
                np.concatenate([moved, moved]), np.concatenate([self.region[moved], before]),
                np.concatenate([ones, -ones]))
        return kind, changes

    def expected(self) -> dict[str, Counter]:
        live = np.flatnonzero(self.count > 0)
        rows = np.repeat(live, self.count[live])
        customer, amount = self.customer_of[rows], self.amount[rows]
        order = np.lexsort((amount, customer))
        customer, amount = customer[order], amount[order]
        starts = np.flatnonzero(np.append(True, customer[1:] != customer[:-1]))
        ends = np.append(starts[1:], len(customer))
        per_customer, top3 = Counter(), Counter()
        for s, e in zip(starts.tolist(), ends.tolist()):
            values = amount[s:e].tolist()
            c = int(customer[s])
            per_customer[(c, values[-1], values[0], e - s, math.fsum(values))] += 1
            for v in values[-3:]:
                top3[(c, v)] += 1
        revenue = Counter()
        big = amount > 10
        region = self.region[customer[big]]
        for r in np.unique(region).tolist():
            values = amount[big][region == r]
            revenue[(r, math.fsum(values.tolist()), len(values), float(values.max()),
                     float(values.min()))] += 1
        top = Counter(sorted(amount.tolist(), reverse=True)[:10])
        return {"revenue": revenue, "per_customer": per_customer, "top": top, "top3": top3}


def views(p: Pipeline) -> dict[str, Counter]:
    """The views as the oracle states them (the top-k views by amounts: rows that tie on the
    amount are ordered by their other columns, which the oracle does not model)."""
    top3 = Counter()
    for (_, customer, amount), m in view_rows(p, "top3").items():
        top3[(customer, amount)] += m
    top = Counter()
    for (_, _, amount), m in view_rows(p, "top").items():
        top[amount] += m
    return {"revenue": view_rows(p, "revenue"), "per_customer": view_rows(p, "per_customer"),
            "top": top, "top3": top3}


def damage_runs(root: str, rng: np.random.Generator
                ) -> tuple[Counter, dict[str, bytes | None]]:
    """Of the root's local keyed runs (the pipeline closed), in a random order: delete the
    first, cut the second short, change 8 bytes of the third, and do one of those or nothing
    to each other; each damaged file written anew, as another process's would be. What was
    done, and per damaged run its changed bytes (None: deleted or cut short)."""
    done: Counter = Counter()
    changed: dict[str, bytes | None] = {}
    paths = sorted(glob.glob(os.path.join(root_layout.keyed_runs(root), "**", "*.arrow"),
                             recursive=True))
    kinds = ("deleted", "cut short", "changed", None, None)
    for i, j in enumerate(rng.permutation(len(paths))):
        path = paths[j]
        kind = kinds[i] if i < 3 else kinds[int(rng.integers(0, len(kinds)))]
        if kind is None:
            continue
        done[kind] += 1
        changed[path] = None
        if kind == "deleted":
            os.unlink(path)
            continue
        data = open(path, "rb").read()
        if kind == "cut short":
            data = data[:int(len(data) * rng.uniform(0.1, 0.9))]
        else:
            at = int(rng.integers(0, len(data) - 8))
            data = data[:at] + bytes(b ^ 0xFF for b in data[at:at + 8]) + data[at + 8:]
            changed[path] = data
        open(path + ".damaged", "wb").write(data)
        os.replace(path + ".damaged", path)
    return done, changed


def run_workload(spark, root: str, *, eager: bool, seed: int, orders: int, steps: int,
                 workers: int = 0, reopen_every: int = 0) -> None:
    w = Workload(seed, orders)
    damage_rng = np.random.default_rng(seed + 1)  # (the files damaged vary with timing)

    def opened() -> Pipeline:
        p = Pipeline(build_circuit(eager), root, spark,
                     driver_step_rows=0 if workers else 10**9)
        p.checkpoint_every = 1
        return p

    p = opened()
    try:
        p.step(w.initial())
        if workers:
            p.rescale(workers)
        damaged: Counter = Counter()
        changed: dict[str, bytes] = {}  # the runs whose bytes changed last, as changed
        for i in range(steps):
            kind, changes = w.step()
            result = p.step(changes)
            assert result.on_driver == (not workers)
            got, expected = views(p), w.expected()
            for name in expected:
                assert got[name] == expected[name], (
                    f"step {i} ({kind}), view {name}: missing "
                    f"{list((expected[name] - got[name]).items())[:4]}, extra "
                    f"{list((got[name] - expected[name]).items())[:4]}")
            if reopen_every and i % reopen_every == reopen_every - 1 and i < steps - 1:
                p.close()
                done, now_damaged = damage_runs(root, damage_rng)
                damaged += done
                for path, data in now_damaged.items():
                    changed.pop(path, None)
                    if data is not None:
                        changed[path] = data
                p = opened()
                assert views(p) == w.expected()
        if reopen_every:
            assert damaged["deleted"] and damaged["cut short"] and damaged["changed"]
            # runs whose bytes were changed were found so by later lookups and built again
            rebuilt = [path for path, data in changed.items()
                       if os.path.exists(path) and open(path, "rb").read() != data]
            assert rebuilt, "no run with changed bytes was looked up and built again"
    finally:
        p.close()


@pytest.mark.parametrize("plan", ["declared", "eager", "declared-no-replicas"])
def test_every_view_equals_the_oracle_at_scale_on_the_driver(spark, tmp_path, monkeypatch,
                                                              plan):
    """60k orders of 4k customers, 18 steps of every kind on the driver; without replicas
    every lookup reads the files' keyed runs, damaged between some steps (their bytes changed
    too: found by their checksums)."""
    if plan.endswith("no-replicas"):
        monkeypatch.setattr(trace_replica, "MAX_ROWS", 0)
    run_workload(spark, str(tmp_path), eager=plan.startswith("eager"), seed=11, orders=60_000,
                 steps=18, reopen_every=6 if plan.endswith("no-replicas") else 0)


@pytest.mark.parametrize("plan", ["declared", "eager"])
def test_every_view_equals_the_oracle_at_scale_per_owner_on_spark(spark, tmp_path, plan):
    """40k orders, 4 steps forced onto Spark at W=2 (each operator per owner in tasks)."""
    run_workload(spark, str(tmp_path), eager=plan == "eager", seed=12, orders=40_000, steps=4,
                 workers=2)
