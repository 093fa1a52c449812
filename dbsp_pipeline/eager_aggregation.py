"""Eager aggregation: a grouped aggregate over a join is planned as an aggregate per join key
on the side it aggregates, joined with the other side, then merged per group.

``SELECT region, sum(amount), count(*), max(amount) FROM orders JOIN customers USING
(customer_id) GROUP BY region``, as declared, keeps every order in the join's trace; a step that
moves one customer to another region must read all that customer's orders, join them and take
them out of one region and into another: its cost follows the customer's orders, which grow with
the data, not the change. Planned eagerly (Yan and Larson's eager group-by; the view trees of
F-IVM and DBToaster's higher-order maintenance push aggregates below joins the same way):

* ``P``: ``orders`` grouped by ``customer_id``: ``count(*)`` and each aggregate's partial
  (``count(x)``, ``sum(x)`` of integers, ``sum_state(x)``: the exact sum of doubles as text,
  ``min``/``max``);
* ``J'``: ``P`` joined with ``customers`` on ``customer_id``: one row per customer;
* ``A'``: ``J'`` grouped by ``region``, merging the partials (``sum`` of counts and integer
  sums, ``sum_of_states`` of exact sums, ``min``/``max`` of extremes), then a projection that
  divides an ``avg``'s merged sum by its merged count.

Moving a customer now reads one row of ``P``'s output; a new order updates its customer's row of
``P`` and that row's region. Every value is what the plan as declared gives, bit for bit: counts
and integer sums add up the same, extremes of extremes are extremes, and an exact sum of exact
partial sums is the exact sum (``exact_sum.fold_arrow``, ``merge``), rounded once, on output.

When (``planned``): an ``aggregate`` whose input is an inner ``join`` that nothing else reads,
whose group columns all come from one side (or are join keys) and whose aggregates read only the
other side's columns, and whose ``sum``/``avg`` read integers or floating-point numbers (a sum of
decimals would change type). Column names and types are read from the circuit's description
(inputs' DDL, selects of plain columns); where they are not known the aggregate stays as declared.

Chosen per circuit (``Circuit(..., eager_aggregation=True)``, off by default): it is a trade.
A step that changes the aggregated side maintains ``P`` too (one more aggregate, whose groups
are the join keys), so new orders cost about three times as much at 1M orders; moving customers
costs what the change costs at any size (README.md has the figures). The plan is part of a
root's circuit: a root keeps the plan it was created with, whichever the circuit asks for now
(``circuit_upgrade.planned_circuit``), so its state is read as it was written; an upgrade
(``Pipeline(..., upgrade=True)``) takes the plan the circuit asks for. Pure: reads and builds
circuits, touches no storage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dbsp_pipeline.circuit import Circuit, Node, fresh_name
from dbsp_pipeline.column_types import Columns, known_columns
from dbsp_pipeline.runtime.circuit_diff import NODE_REFERENCES
from dbsp_pipeline.zset import quote

#: the parameter that marks an aggregate planned by this module (never planned again)
MERGES_PARTIALS = "merges_partials"
#: Spark's types (as ``ddl_column_types`` writes them) whose sums are integer or exact sums
_INTEGERS = {"tinyint", "smallint", "int", "bigint"}
_FLOATS = {"float", "double"}


@dataclass(frozen=True)
class _Rewrite:
    """How one aggregate is planned: ``side`` (the join input it aggregates) grouped by the
    join keys, joined with ``other`` (the join input its group columns come from)."""

    aggregate: Node
    side: int
    other: int
    on: list[str]
    side_columns: Columns
    other_columns: Columns


def planned(circuit: Circuit) -> Circuit:
    """``circuit`` with every aggregate it can plan eagerly so planned (see the module
    docstring); ``circuit`` itself when there is none. (Whatever ``circuit.eager_aggregation``
    says: ``circuit_upgrade.planned_circuit`` decides which plan a root runs.)"""
    while True:  # to a fixpoint (an aggregate's partial may itself be over a join): so
        planned_once = _planned_once(circuit)  # planning a planned circuit changes nothing
        if planned_once is circuit:
            return circuit
        circuit = planned_once


def _planned_once(circuit: Circuit) -> Circuit:
    """``circuit`` with the aggregates it can plan eagerly, as it declares them, so planned."""
    columns = known_columns(circuit)
    readers = _readers(circuit)
    rewrites: dict[int, _Rewrite] = {}
    for node in circuit.nodes:
        rewrite = _rewrite_of(circuit, node, columns, readers)
        if rewrite is not None:
            rewrites[node.id] = rewrite
    if not rewrites:
        return circuit
    joins = {circuit.nodes[a].inputs[0] for a in rewrites}
    out = Circuit(circuit.name, eager_aggregation=True)
    out.sql_views = dict(circuit.sql_views)
    out.sql_texts = dict(circuit.sql_texts)
    new_id: dict[int, int] = {}

    def add(op: str, inputs: Sequence[int], params: dict[str, Any]) -> int:
        node = Node(len(out.nodes), op, tuple(inputs), params)
        out.nodes.append(node)
        return node.id

    for node in circuit.nodes:
        if node.id in joins:
            continue
        if node.id in rewrites:
            new_id[node.id] = _plan(rewrites[node.id], new_id, add)
            continue
        params = dict(node.params)
        for reference in NODE_REFERENCES.get(node.op, ()):
            params[reference] = new_id[params[reference]]
        new_id[node.id] = add(node.op, [new_id[i] for i in node.inputs], params)
    out.inputs = {name: new_id[i] for name, i in circuit.inputs.items()}
    out.input_schemas = dict(circuit.input_schemas)
    out.outputs = {name: new_id[i] for name, i in circuit.outputs.items()}
    return out


def _plan(r: _Rewrite, new_id: dict[int, int],
          add: Callable[[str, Sequence[int], dict[str, Any]], int]) -> int:
    """Add ``P``, ``J'``, ``A'`` (and the projection of an ``avg``) for rewrite ``r``; the id of
    the node that stands for the aggregate."""
    keys: list[str] = r.aggregate.params["keys"]
    aggregates: list[dict[str, Any]] = r.aggregate.params["aggregates"]
    taken = [c for c, _ in r.side_columns] + [c for c, _ in r.other_columns] + keys + [
        a["name"] for a in aggregates]

    def fresh(base: str) -> str:
        name = fresh_name(base, taken)
        taken.append(name)
        return name

    side_types = dict(r.side_columns)
    partials: list[dict[str, Any]] = []
    named: dict[tuple[str, str | None], str] = {}

    def partial(fn: str, arg: str | None, base: str) -> str:
        """The column of ``P`` holding ``fn(arg)`` per join key (one per distinct call)."""
        if (fn, arg) not in named:
            named[fn, arg] = fresh(base)
            partials.append({"name": named[fn, arg], "fn": fn, "arg": arg})
        return named[fn, arg]

    rows = partial("count", None, "eager_rows")  # first: a key's row count, ``P``'s ``_n``
    merged: list[dict[str, Any]] = []
    shown: list[str] = [quote(k) for k in keys]
    for a in aggregates:
        fn, arg, name = a["fn"], a["arg"], a["name"]
        if fn == "count" and arg is None:
            merged.append({"name": name, "fn": "sum", "arg": rows})
        elif fn == "count" or (fn == "sum" and side_types.get(arg) in _INTEGERS):
            merged.append({"name": name, "fn": "sum", "arg": partial(fn, arg, f"eager_{name}")})
        elif fn in ("min", "max"):
            merged.append({"name": name, "fn": fn, "arg": partial(fn, arg, f"eager_{name}")})
        elif fn == "sum":
            merged.append({"name": name, "fn": "sum_of_states",
                           "arg": partial("sum_state", arg, f"eager_{name}")})
        else:  # avg: the merged exact sum over the merged count
            total, n = fresh(f"eager_{name}_sum"), fresh(f"eager_{name}_n")
            merged += [{"name": total, "fn": "sum_of_states",
                        "arg": partial("sum_state", arg, f"eager_{name}")},
                       {"name": n, "fn": "sum",
                        "arg": partial("count", arg, f"eager_{name}_count")}]
            shown.append(f"CASE WHEN {quote(n)} > 0 THEN {quote(total)} / "
                         f"CAST({quote(n)} AS DOUBLE) END AS {quote(name)}")
            continue
        shown.append(quote(name))
    p = add("aggregate", [new_id[r.side]], {"keys": list(r.on), "aggregates": partials})
    j = add("join", [p, new_id[r.other]], {"on": list(r.on)})
    merge = add("aggregate", [j], {"keys": list(keys), "aggregates": merged,
                                   MERGES_PARTIALS: True})
    if all(a["fn"] != "avg" for a in aggregates):  # its columns are the aggregate's
        return merge
    return add("select", [merge], {"exprs": shown})


def _rewrite_of(circuit: Circuit, node: Node, columns: list[Columns | None],
                readers: dict[int, list[int]]) -> _Rewrite | None:
    """How ``node`` is planned eagerly, or None if it is not (see the module docstring)."""
    if node.op != "aggregate" or node.params.get(MERGES_PARTIALS):
        return None
    join = circuit.nodes[node.inputs[0]]
    if join.op != "join" or readers[join.id] != [node.id]:
        return None
    on: list[str] = join.params["on"]
    keys: list[str] = node.params["keys"]
    aggregates: list[dict[str, Any]] = node.params["aggregates"]
    for side, other in (join.inputs, join.inputs[::-1]):
        side_columns, other_columns = columns[side], columns[other]
        if side_columns is None or other_columns is None:
            return None
        side_types, other_names = dict(side_columns), {c for c, _ in other_columns}
        if not all(k in other_names for k in keys):
            continue
        args = [a["arg"] for a in aggregates if a["arg"] is not None]
        if not all(arg in side_types for arg in args):
            continue
        if all(a["fn"] not in ("sum", "avg") or side_types[a["arg"]] in _INTEGERS | _FLOATS
               for a in aggregates):
            return _Rewrite(node, side, other, on, side_columns, other_columns)
    return None


def _readers(circuit: Circuit) -> dict[int, list[int]]:
    """Each node's readers: the nodes that take it as an input or name it in a parameter
    (``circuit_diff.NODE_REFERENCES``: a ``conform`` takes its columns), and -1 for a view."""
    readers = circuit.consumers()
    for node in circuit.nodes:
        for reference in NODE_REFERENCES.get(node.op, ()):
            readers[node.params[reference]].append(node.id)
    for node_id in circuit.outputs.values():
        readers[node_id].append(-1)
    return readers
