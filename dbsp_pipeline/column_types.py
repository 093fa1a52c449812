"""The columns of a circuit's nodes, and their types where the circuit's description says them,
read without Spark; and the type two join keys of different numeric types are compared as.

``known_columns``: an input's columns and types are its DDL's; filters, unions, joins and the
like pass them on; a select of plain columns passes on their types (a computed column's type is
not known: ``None``); an aggregate's group columns keep theirs. A node whose column names are
not known without Spark's analysis is ``None``. Eager aggregation plans with them
(``eager_aggregation.py``), and a join widens its keys by them (``widened_sides``).

``join_key_type``: Spark compares keys of different numeric types as the type both widen to
(``INT = BIGINT`` as BIGINT, ``DECIMAL(10,2) = DECIMAL(12,0)`` as DECIMAL(14,2)); a join here
does the same where every value of both types converts to it exactly (INT and smaller into
DOUBLE, FLOAT into DOUBLE, integers and decimals into a decimal of at most 38 digits). BIGINT
and DOUBLE, or DECIMAL and DOUBLE, would round: those keys stay as they are, and Spark's
analysis refuses the join, asking for a cast.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp

from dbsp_pipeline.zset import quote

if TYPE_CHECKING:
    from dbsp_pipeline.circuit import Circuit, Collection, Node

#: one node's columns: name and type as Spark writes it (``bigint``, ``decimal(12,2)``), None
#: where a select computes it
Columns = list[tuple[str, str | None]]

#: the digits of the integer types before the point (a decimal holding every value)
_INTEGER_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 19}
_INTEGER_DECIMAL = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 20}  # Spark's decimal(p,0)
_DECIMAL_RE = re.compile(r"decimal(?:\((\d+)(?:,(\d+))?\))?")
_MAX_PRECISION = 38

#: per circuit, the nodes whose columns were computed so far and their columns (a failed SQL
#: view removes the nodes it added: an entry counts only while its node is still there)
_MEMO: weakref.WeakKeyDictionary[Circuit, list[tuple[Node, Columns | None]]] = \
    weakref.WeakKeyDictionary()


def known_columns(circuit: Circuit) -> list[Columns | None]:
    """Each node's columns (indexed by node id) and the types of those an input declares and
    selects pass on; None for a node whose columns are not known without Spark's analysis."""
    from dbsp_pipeline.sql.catalog import ddl_column_types

    memo = _MEMO.setdefault(circuit, [])
    # nodes are appended, and removed only from the end: the entries still valid are those up
    # to the last one whose node is still in its place (usually all: one comparison)
    kept = min(len(memo), len(circuit.nodes))
    while kept and memo[kept - 1][0] is not circuit.nodes[kept - 1]:
        kept -= 1
    del memo[kept:]
    out = [columns for _, columns in memo]
    for node in circuit.nodes[len(out):]:
        src = out[node.inputs[0]] if node.inputs else None
        columns: Columns | None = None
        if node.op in ("input", "constant"):
            try:
                columns = [(n, t) for n, t, _ in ddl_column_types(node.params["schema"])]
            except sqlglot.errors.SqlglotError:  # not DDL sqlglot reads: not known
                columns = None
        elif node.op in ("filter", "negate", "distinct", "integrate", "delay",
                         "differentiate"):
            columns = src
        elif node.op == "repeat":  # drops its count column
            columns = None if src is None else [c for c in src if c[0] != node.params["count"]]
        elif node.op == "union":  # a column of different types widens: its type is Spark's
            others = [dict(out[i] or []) for i in node.inputs[1:]]
            columns = None if src is None else [
                (n, t if all(o.get(n) == t for o in others) else None) for n, t in src]
        elif node.op == "conform":
            columns = out[node.params["like"]]
        elif node.op == "select":
            columns = None if src is None else _selected(node.params["exprs"], src)
        elif node.op == "join":
            right = out[node.inputs[1]]
            on = node.params["on"]
            columns = None if src is None or right is None else (
                [c for c in src if c[0] in on] + [c for c in src if c[0] not in on]
                + [c for c in right if c[0] not in on])
        elif node.op == "aggregate" and src is not None:
            types = dict(src)
            columns = [(k, types.get(k)) for k in node.params["keys"]] + [
                (a["name"], None) for a in node.params["aggregates"]]
        out.append(columns)
        memo.append((node, columns))
    return out


def _selected(exprs: Sequence[str], src: Columns) -> Columns | None:
    """The columns a select of ``exprs`` makes of ``src``'s: each expression's alias or plain
    column name (None if an expression has neither), with the type of a plain column."""
    types = dict(src)
    out: Columns = []
    for text in exprs:
        try:
            e = sqlglot.parse_one(text, read="spark")
        except sqlglot.errors.SqlglotError:
            return None
        inner = e.this if isinstance(e, exp.Alias) else e
        if isinstance(e, exp.Alias):
            name = e.alias
        elif isinstance(e, exp.Column) and not e.table:
            name = e.name
        else:
            return None
        column_type = types.get(inner.name) if (
            isinstance(inner, exp.Column) and not inner.table) else None
        out.append((name, column_type))
    return out


def _decimal(t: str) -> tuple[int, int] | None:
    """A decimal's precision and scale (an integer type's as Spark casts it), or None."""
    if t in _INTEGER_DECIMAL:
        return _INTEGER_DECIMAL[t], 0
    m = _DECIMAL_RE.fullmatch(t)
    if m is None:
        return None
    return int(m.group(1) or 10), int(m.group(2) or 0)


def join_key_type(left: str, right: str) -> str | None:
    """The type (as Spark writes it) join keys of types ``left`` and ``right`` are compared as,
    when every value of both converts to it exactly; None when they are the same type or no
    such type exists (see the module docstring)."""
    if left == right:
        return None
    if left in _INTEGER_DIGITS and right in _INTEGER_DIGITS:
        return max(left, right, key=_INTEGER_DIGITS.__getitem__)
    pair = {left, right}
    if pair == {"float", "double"}:
        return "double"
    if "double" in pair and pair - {"double"} <= {"tinyint", "smallint", "int"}:
        return "double"
    a, b = _decimal(left), _decimal(right)
    if a is None or b is None:
        return None
    scale = max(a[1], b[1])
    digits = max(a[0] - a[1], b[0] - b[1])
    if digits + scale > _MAX_PRECISION:
        return None
    return f"decimal({digits + scale},{scale})"


def widened_sides(left: Collection, right: Collection, on: Sequence[str]
                  ) -> tuple[Collection, Collection]:
    """``left`` and ``right`` with each key of ``on`` cast to ``join_key_type`` where their
    known types differ (a select of every column, the key cast in place); as they are
    elsewhere."""
    columns = known_columns(left.circuit)
    left_columns, right_columns = columns[left.node_id], columns[right.node_id]
    if left_columns is None or right_columns is None:
        return left, right
    left_types, right_types = dict(left_columns), dict(right_columns)
    casts: tuple[dict[str, str], dict[str, str]] = ({}, {})
    for key in on:
        lt, rt = left_types.get(key), right_types.get(key)
        wide = join_key_type(lt, rt) if lt is not None and rt is not None else None
        if wide is None:
            continue
        for side, given in enumerate((lt, rt)):
            if given != wide:
                casts[side][key] = wide
    return (_cast(left, left_columns, casts[0]), _cast(right, right_columns, casts[1]))


def _cast(collection: Collection, columns: Columns, casts: dict[str, str]) -> Collection:
    if not casts:
        return collection
    return collection.select(*[
        f"CAST({quote(name)} AS {casts[name].upper()}) AS {quote(name)}" if name in casts
        else quote(name) for name, _ in columns])
