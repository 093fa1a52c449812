"""An output log's row count (``OutputLog.view_rows``): the sum of the view's weights, read
from file statistics where every row of a file has one weight, never from the view's rows."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc

from dbsp_pipeline import Circuit, Pipeline


def circuit() -> Circuit:
    c = Circuit("counted")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("keys", x.select("k"))  # a bag: a key pushed twice is a row of weight 2
    c.output("sums", x.group_by("k").agg(s="sum(v)"))  # a set
    return c


def weights(p: Pipeline, view: str) -> int:
    return int(pc.sum(p.view_arrow(view).column("_weight")).as_py() or 0)


def test_view_rows_is_the_sum_of_the_views_weights_after_every_step(spark, tmp_path):
    rng = random.Random(7)
    held: list[tuple[int, int]] = []
    with Pipeline(circuit(), str(tmp_path), spark, retain_steps=3) as p:
        for step in range(40):
            rows = [(rng.randrange(6), rng.randrange(100)) for _ in range(rng.randrange(1, 6))]
            gone = rng.sample(held, min(len(held), rng.randrange(4)))
            for r in gone:
                held.remove(r)
            held.extend(rows)
            change = pa.table({"k": [k for k, _ in rows + gone], "v": [v for _, v in rows + gone],
                               "_weight": [1] * len(rows) + [-1] * len(gone)})
            p.driver_step_rows = 0 if step % 7 == 3 else 200_000  # some steps on Spark
            p.step({"x": change})
            if step % 5 == 4:
                p.compact_history()
            assert p.view_rows("keys") == weights(p, "keys") == len(held), step
            assert p.view_rows("sums") == weights(p, "sums") == len({k for k, _ in held}), step


def test_a_compacted_set_is_counted_from_statistics(spark, tmp_path, monkeypatch):
    with Pipeline(circuit(), str(tmp_path), spark, retain_steps=1) as p:
        for i in range(40):  # 80 groups, in steps of inserts only (one weight a file)
            p.push("x", [(i, i), (i + 100, i)])
            p.step()
        p.push("x", [(1, 5)])  # group 1's sum moves: a change of -1 and +1
        p.step()
        p.compact_history()  # all steps but the newest collapse into one file of weights 1
        log = p.engine.output("sums")
        files = log._files()
        compacted = [f for f in files if f.step_max == log.compacted_through()]
        assert len(compacted) == 1 and compacted[0].weight_sum == compacted[0].rows > 30
        mixed = [f.path for f in files if f.weight_sum is None]
        assert len(mixed) == 1  # the newest step's
        read: list[list[str]] = []
        real = log.table.read_arrow

        def recording(files, where=None, columns=None):
            read.append([f if isinstance(f, str) else f.path for f in files])
            return real(files, where, columns)

        monkeypatch.setattr(log.table, "read_arrow", recording)
        assert p.view_rows("sums") == 80
        assert read == [mixed]  # not the compacted rows, nor the inserts since
