"""Inner equi-join, incrementally: ``d(A ⋈ B) = dA ⋈ (B + dB) + A ⋈ dB``.

Both sides keep a trace keyed (sharded) by the join key. A step appends each side's change to its
trace first; the appended files are the materialized change, so ``dA ⋈ (B + dB)`` reads the B
trace through the new files and ``A ⋈ dB`` reads the A trace as it was before the step. A side
with no change contributes no term, so a step that changes only one input never reads that
input's own trace. The change side is broadcast when small, so the trace is scanned once without
a shuffle.

SQL semantics: NULL keys never match. Output columns: the keys (once), then the left side's
other columns, then the right side's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dbsp_pipeline.driver.sql import conform, empty_zset, ident, idents
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.storage.delta_table import DataFile
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import WEIGHT, quote

_LW, _RW = "_wl", "_wr"


class Join(Operator):
    def __init__(self, db: StateDatabase, name: str, on: Sequence[str], left: StructType,
                 right: StructType, schema: StructType) -> None:
        self.on = list(on)
        self.left = Trace(db, f"{name}_left", left, self.on)
        self.right = Trace(db, f"{name}_right", right, self.on)
        self.left_rest = [c for c in left.fieldNames() if c not in self.on]
        self.right_rest = [c for c in right.fieldNames() if c not in self.on]
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        d_left, d_right = changes
        if d_left is None and d_right is None:
            return None
        old_left, old_right = self.left.files(), self.right.files()
        new_left = self.left.append(d_left) if d_left is not None else []
        new_right = self.right.append(d_right) if d_right is not None else []
        terms = []
        if new_left:
            terms.append(self._join(ctx, new_left, old_right + new_right, small="left"))
        if new_right and old_left:
            terms.append(self._join(ctx, old_left, new_right, small="right"))
        if not terms:
            return None
        return reduce(lambda a, b: a.unionByName(b), terms)

    def _join(self, ctx: StepContext, left_files: list[DataFile], right_files: list[DataFile],
              small: str) -> DataFrame:
        left = self.left.read(left_files).select(
            *[quote(c) for c in self.on + self.left_rest], F.col(WEIGHT).alias(_LW))
        right = self.right.read(right_files).select(
            *[quote(c) for c in self.on + self.right_rest], F.col(WEIGHT).alias(_RW))
        small_rows = sum(f.rows for f in (left_files if small == "left" else right_files))
        if small_rows <= ctx.broadcast_rows:
            if small == "left":
                left = F.broadcast(left)
            else:
                right = F.broadcast(right)
        joined = left.join(right, on=self.on, how="inner")
        return joined.select(*[quote(c) for c in self.schema.fieldNames()],
                             (F.col(_LW) * F.col(_RW)).alias(WEIGHT))

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        d_left, d_right = changes
        if d_left is None and d_right is None:
            return None
        old_left = self.left.files()
        new_left = self.left.append_arrow(ctx.local, d_left) if d_left is not None else None
        new_right = self.right.append_arrow(ctx.local, d_right) if d_right is not None else None
        terms = []
        if new_left is not None:
            # dA ⋈ (B + dB): the right trace now includes dB.
            right = self.right.lookup_arrow(ctx.local, new_left)
            terms.append(self._join_local(ctx, new_left, right))
        if new_right is not None and old_left:
            # A ⋈ dB, with A as before the step.
            left = self.left.lookup_arrow(ctx.local, new_right, old_left)
            terms.append(self._join_local(ctx, left, new_right))
        terms = [t for t in terms if t.num_rows]
        return pa.concat_tables(terms) if terms else None

    def _join_local(self, ctx: StepContext, left: pa.Table, right: pa.Table) -> pa.Table:
        if left.num_rows == 0 or right.num_rows == 0:
            return empty_zset(self.schema)
        on = " AND ".join(f"l.{ident(k)} = r.{ident(k)}" for k in self.on)
        out = ctx.local.query(
            f"SELECT {idents(self.on, 'l.')}"
            f"{', ' + idents(self.left_rest, 'l.') if self.left_rest else ''}"
            f"{', ' + idents(self.right_rest, 'r.') if self.right_rest else ''}, "
            f"l.{ident(WEIGHT)} * r.{ident(WEIGHT)} AS {ident(WEIGHT)} "
            f"FROM l JOIN r ON {on}", l=left, r=right)
        return conform(out, self.schema)

    def owner_keys(self) -> list[list[str]] | None:
        return [self.on, self.on]

    def traces(self) -> list[Trace]:
        return [self.left, self.right]
