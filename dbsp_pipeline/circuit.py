"""Declaring a circuit: inputs, relational operators, output views.

A ``Circuit`` is a pure declaration (no Spark needed): a DAG of ``Node``s, each a primitive
operator over the collections named by its inputs. ``Collection`` is the user's handle on a node
and offers the relational operators. Composite operators (``minus``, ``left_join``, ``semijoin``,
``antijoin``) are expanded here into primitives, so every incremental rule lives in exactly one
place (``dbsp_pipeline.operators``).

Semantics: every collection is a relation that changes from step to step. An operator's output at
step *t* is the operator applied to its inputs' values at step *t* (``integrate``, ``differentiate``
and ``delay`` are the exceptions: they relate a collection's values across steps, as in DBSP).

Schemas and SQL expressions are checked when a ``Pipeline`` opens the circuit against Spark
(``dbsp_pipeline.runtime.plan``); names are checked here, as they are declared.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from dbsp_pipeline.errors import CircuitError, UnknownNameError
from dbsp_pipeline.zset import quote

#: Primitive operators. Linear ones work on the change alone; the others keep traces.
LINEAR_OPS = frozenset({"select", "filter", "union", "negate", "repeat", "conform"})
#: Sources inside the circuit: a ``constant`` has no inputs and the same value at every step.
SOURCE_OPS = frozenset({"constant"})
STATEFUL_OPS = frozenset({"distinct", "join", "aggregate", "top_k", "integrate", "differentiate",
                          "delay"})
#: Operators whose output depends on the history of their input, not only on its sum: a view
#: over one cannot be computed from the integrated input (``recompute``, an upgrade's backfill).
STREAM_OPS = frozenset({"integrate", "differentiate", "delay"})

AGGREGATE_FUNCTIONS = ("count", "sum", "avg", "min", "max")
#: ``fn(arg)``: arg is ``*``, a plain name, or a backticked name (a backtick inside doubled, as
#: in Spark SQL). Used with ``fullmatch`` (``$`` would accept a final newline).
_AGG_RE = re.compile(
    r"\s*(?P<fn>[A-Za-z]+)\s*\(\s*(?P<arg>\*|[A-Za-z][A-Za-z0-9_]*|`(?:[^`]|``)+`)\s*\)\s*")
#: one ORDER BY key of ``top_k``: a column (plain or backticked), a direction, where NULLs go
_ORDER_RE = re.compile(
    r"\s*(?P<col>[A-Za-z][A-Za-z0-9_]*|`(?:[^`]|``)+`)(?:\s+(?P<dir>ASC|DESC))?"
    r"(?:\s+NULLS\s+(?P<nulls>FIRST|LAST))?\s*", re.IGNORECASE)
#: circuit, input, output and aggregate names (input and output names also name folders)
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Node:
    """One primitive operator. ``params`` is JSON-serializable; ``inputs`` are node ids."""

    id: int
    op: str
    inputs: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "op": self.op, "inputs": list(self.inputs), "params": self.params}


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of a ``group_by(...).agg(...)``: ``name = fn(arg)``; arg is a column or
    ``*``."""

    name: str
    fn: str
    arg: str | None  # None for count(*)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "fn": self.fn, "arg": self.arg}


class Circuit:
    """A named DAG of inputs, operators and outputs. See the module docstring."""

    def __init__(self, name: str, eager_aggregation: bool = False) -> None:
        """An empty circuit ``name``. ``eager_aggregation``: whether a new pipeline root plans
        each grouped aggregate over a join as partial aggregates per join key, joined and
        merged (``dbsp_pipeline/eager_aggregation.py``): a step that changes the side holding
        the group columns (customers moving between regions) then costs what the change costs,
        not what the other side holds for the changed keys, but a step that changes the
        aggregated side (new orders) maintains one more aggregate (measured in README.md). A
        root keeps the plan it was created with; an upgrade plans anew."""
        _check_name(name, "circuit")
        self.name = name
        self.eager_aggregation = eager_aggregation
        self.nodes: list[Node] = []
        self.inputs: dict[str, int] = {}
        self.input_schemas: dict[str, str] = {}
        self.outputs: dict[str, int] = {}
        #: the column names of the outputs declared from SQL (``view``), which later SQL reads
        self.sql_views: dict[str, tuple[str, ...]] = {}
        #: the query of each output declared from SQL, as Spark SQL text (shown by the console)
        self.sql_texts: dict[str, str] = {}

    @classmethod
    def from_sql(cls, text: str, name: str = "sql", eager_aggregation: bool = False
                 ) -> Circuit:
        """A circuit declared by a SQL script (Spark SQL): ``CREATE TABLE t (columns)`` declares
        an input, ``CREATE [MATERIALIZED] VIEW v AS SELECT ...`` an output view, which may read
        the tables and views before it. See ``docs/sql.md`` for what compiles;
        anything else is a ``SqlError`` naming the view, the line and column, and a hint.
        ``eager_aggregation``: as ``Circuit``'s."""
        from dbsp_pipeline.sql.script import declare_script

        circuit = cls(name, eager_aggregation)
        declare_script(circuit, text)
        return circuit

    @classmethod
    def from_sql_file(cls, path: str, name: str | None = None,
                      eager_aggregation: bool = False) -> Circuit:
        """``from_sql`` of the script in file ``path`` (UTF-8); the circuit is named ``name``,
        by default the file's name without its extension (``shop.sql``: ``shop``)."""
        import os

        with open(path, encoding="utf-8") as f:
            text = f.read()
        return cls.from_sql(text, name or os.path.splitext(os.path.basename(path))[0],
                            eager_aggregation)

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> Circuit:
        """The circuit ``describe()`` returned (a root records its circuit's description, so an
        upgrade can open the root with the circuit it ran before): the same nodes, inputs and
        outputs, so the same ``fingerprint()``. Its SQL texts are not part of a description."""
        circuit = cls(description["name"])
        for n in description["nodes"]:
            node = Node(int(n["id"]), n["op"], tuple(int(i) for i in n["inputs"]),
                        dict(n["params"]))
            if node.id != len(circuit.nodes):
                raise CircuitError(f"circuit description '{circuit.name}': node {node.id} "
                                   f"is not declared in order")
            circuit.nodes.append(node)
        circuit.inputs = {k: int(v) for k, v in description["inputs"].items()}
        circuit.input_schemas = {k: circuit.nodes[v].params["schema"]
                                 for k, v in circuit.inputs.items()}
        circuit.outputs = {k: int(v) for k, v in description["outputs"].items()}
        return circuit

    def view(self, name: str, query: str) -> Collection:
        """Compile the Spark SQL ``query`` (one SELECT over this circuit's inputs and SQL views)
        and declare it as output view ``name``; returns its collection."""
        from dbsp_pipeline.sql.script import declare_view

        declare_view(self, name, query)
        return node_collection(self, self.outputs[name])

    # -- declaration -----------------------------------------------------------------------
    def input(self, name: str, schema: str) -> Collection:
        """Declare an input collection with a Spark DDL schema (``"id BIGINT, name STRING"``)."""
        _check_name(name, "input")
        if name in self.inputs:
            raise CircuitError(f"input '{name}' is declared twice in circuit '{self.name}'")
        if not isinstance(schema, str) or not schema.strip():
            raise CircuitError(f"input '{name}': schema must be a non-empty Spark DDL string")
        node = self._add("input", (), {"name": name, "schema": schema})
        self.inputs[name] = node.id
        self.input_schemas[name] = schema
        return node_collection(self, node.id)

    def constant(self, schema: str, rows: list[list[Any]]) -> Collection:
        """A collection whose value is ``rows`` at every step (SQL's ``VALUES``): its change
        is the rows at step 0 and nothing after. ``schema`` is Spark DDL; each row is a list
        of JSON values (numbers, strings, booleans, None) in the schema's column order, checked
        against the schema when a pipeline opens the circuit."""
        if not isinstance(schema, str) or not schema.strip():
            raise CircuitError("constant: schema must be a non-empty Spark DDL string")
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise CircuitError(f"constant: rows must be a list of lists, got {rows!r}")
        for row in rows:
            for value in row:
                if value is not None and not isinstance(value, (bool, int, float, str)):
                    raise CircuitError(f"constant: value {value!r} of row {row!r} is not a "
                                       "number, string, boolean or None")
        node = self._add("constant", (), {"schema": schema, "rows": [list(r) for r in rows]})
        return node_collection(self, node.id)

    def output(self, name: str, collection: Collection) -> None:
        """Declare ``collection`` as the output view ``name``."""
        _check_name(name, "output")
        if name in self.outputs:
            raise CircuitError(f"output '{name}' is declared twice in circuit '{self.name}'")
        self._own(collection)
        self.outputs[name] = collection.node_id

    # -- inspection ------------------------------------------------------------------------
    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def consumers(self) -> dict[int, list[int]]:
        """For each node id, the ids of the nodes that read it."""
        result: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                result[i].append(n.id)
        return result

    def inputs_of(self, output: str) -> list[str]:
        """The inputs output view ``output`` is computed from (its lineage), in declaration
        order."""
        if output not in self.outputs:
            raise UnknownNameError(f"circuit '{self.name}' has no output '{output}'")
        seen: set[int] = set()
        todo = [self.outputs[output]]
        while todo:
            node = self.nodes[todo.pop()]
            if node.id not in seen:
                seen.add(node.id)
                todo.extend(node.inputs)
        return [name for name, node_id in self.inputs.items() if node_id in seen]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": [n.describe() for n in self.nodes],
            "inputs": self.inputs,
            "outputs": self.outputs,
        }

    def fingerprint(self) -> str:
        """A stable digest of the computation: equal iff the circuits compute the same thing."""
        text = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    # -- internals -------------------------------------------------------------------------
    def _add(self, op: str, inputs: tuple[int, ...], params: dict[str, Any] | None = None) -> Node:
        node = Node(len(self.nodes), op, inputs, params or {})
        self.nodes.append(node)
        return node

    def _own(self, collection: Collection) -> None:
        if not isinstance(collection, Collection):
            raise CircuitError(f"expected a Collection, got {type(collection).__name__}")
        if collection.circuit is not self:
            raise CircuitError(
                f"collection belongs to circuit '{collection.circuit.name}', not '{self.name}'")


class Collection:
    """A relation in a circuit. Every method returns a new ``Collection``."""

    def __init__(self, circuit: Circuit, node_id: int) -> None:
        self.circuit = circuit
        self.node_id = node_id

    def __repr__(self) -> str:
        node = self.circuit.node(self.node_id)
        return f"Collection({self.circuit.name}#{node.id} {node.op})"

    def _derive(self, op: str, others: tuple[Collection, ...] = (), **params: Any) -> Collection:
        for o in others:
            self.circuit._own(o)
        node = self.circuit._add(op, (self.node_id, *(o.node_id for o in others)), params)
        return node_collection(self.circuit, node.id)

    # -- linear operators ------------------------------------------------------------------
    def select(self, *exprs: str) -> Collection:
        """Project with Spark SQL expressions, e.g. ``select("id", "amount * 2 AS double")``."""
        if not exprs or not all(isinstance(e, str) and e.strip() for e in exprs):
            raise CircuitError("select needs one or more Spark SQL expression strings")
        return self._derive("select", exprs=list(exprs))

    def map(self, *exprs: str) -> Collection:
        """Alias of ``select``."""
        return self.select(*exprs)

    def filter(self, predicate: str) -> Collection:
        """Keep the rows for which the Spark SQL ``predicate`` is true (NULL counts as false)."""
        if not isinstance(predicate, str) or not predicate.strip():
            raise CircuitError("filter needs a Spark SQL predicate string")
        return self._derive("filter", predicate=predicate)

    def where(self, predicate: str) -> Collection:
        """Alias of ``filter``."""
        return self.filter(predicate)

    def union(self, *others: Collection) -> Collection:
        """Z-set sum (``UNION ALL``): multiplicities add. Schemas must match by name and type."""
        if not others:
            raise CircuitError("union needs at least one other collection")
        return self._derive("union", others)

    def negate(self) -> Collection:
        """The collection with every multiplicity negated."""
        return self._derive("negate")

    def minus(self, other: Collection) -> Collection:
        """Z-set subtraction: multiplicities subtract (``self + (-other)``)."""
        self.circuit._own(other)
        return self.union(other.negate())

    def repeat(self, count: str) -> Collection:
        """Each row as many times as its integer column ``count`` says (its multiplicity times
        ``count``), without that column; rows whose ``count`` is NULL or not positive are
        dropped. Linear: it turns a count computed by an aggregate back into rows (SQL's
        ``INTERSECT ALL`` keeps a row ``min(m, n)`` times)."""
        if not isinstance(count, str) or not count:
            raise CircuitError(f"repeat: count must name an integer column, got {count!r}")
        return self._derive("repeat", count=count)

    def conform_to(self, other: Collection) -> Collection:
        """This collection with ``other``'s columns, in its order and types: a column this one
        lacks is NULL (so the two can be unioned)."""
        self.circuit._own(other)
        return self._derive("conform", (), like=other.node_id)

    # -- stateful operators ----------------------------------------------------------------
    def distinct(self) -> Collection:
        """Each row with positive multiplicity, once."""
        return self._derive("distinct")

    def join(self, other: Collection, on: str | list[str]) -> Collection:
        """Inner equi-join on the named columns (``USING`` semantics: the key columns appear once,
        first, then this side's other columns, then the other side's). NULL keys never match.
        Keys of different numeric types are compared as the type both convert to exactly
        (``column_types.join_key_type``: INT and BIGINT as BIGINT), which the key column then
        has, where the circuit's description says their types (inputs' DDL, selects of plain
        columns); elsewhere, or where no such type exists, keys of different types are a
        ``CircuitError`` when the pipeline opens, asking for a cast."""
        from dbsp_pipeline.column_types import widened_sides

        keys = _keys(on, "join")
        self.circuit._own(other)
        left, right = widened_sides(self, other, keys)
        return left._derive("join", (right,), on=keys)

    def left_join(self, other: Collection, on: str | list[str]) -> Collection:
        """Left outer equi-join: the inner join plus this side's unmatched rows padded with
        NULLs."""
        keys = _keys(on, "left_join")
        inner = self.join(other, keys)
        unmatched = self.antijoin(other, keys)
        return inner.union(unmatched._derive("conform", (), like=inner.node_id))

    def right_join(self, other: Collection, on: str | list[str]) -> Collection:
        """Right outer equi-join: the inner join plus ``other``'s unmatched rows with this
        side's columns NULL (columns as ``join``'s: keys, this side's, the other's)."""
        keys = _keys(on, "right_join")
        inner = self.join(other, keys)
        unmatched = other.antijoin(self, keys)
        return inner.union(unmatched.conform_to(inner))

    def full_join(self, other: Collection, on: str | list[str]) -> Collection:
        """Full outer equi-join: the inner join plus each side's unmatched rows with the other
        side's columns NULL (columns as ``join``'s). A row with a NULL key matches nothing, so
        it is an unmatched row of its side."""
        keys = _keys(on, "full_join")
        inner = self.join(other, keys)
        left = self.antijoin(other, keys).conform_to(inner)
        right = other.antijoin(self, keys).conform_to(inner)
        return inner.union(left, right)

    def semijoin(self, other: Collection, on: str | list[str]) -> Collection:
        """The rows of this collection whose key has a match in ``other`` (multiplicity kept)."""
        keys = _keys(on, "semijoin")
        other_keys = other.select(*[quote(k) for k in keys]).distinct()
        joined = self.join(other_keys, keys)
        return joined._derive("conform", (), like=self.node_id)

    def antijoin(self, other: Collection, on: str | list[str]) -> Collection:
        """The rows of this collection whose key has no match in ``other`` (NULL keys never match,
        so rows with a NULL key are kept)."""
        keys = _keys(on, "antijoin")
        return self.minus(self.semijoin(other, keys))

    def top_k(self, k: int, order_by: list[str], partition_by: list[str] | None = None,
              rank: str | None = None, numbering: str = "row_number") -> Collection:
        """The first ``k`` rows in ``order_by`` order (SQL's ``ORDER BY ... LIMIT k``), per
        partition of the ``partition_by`` columns if given (``ROW_NUMBER() OVER (PARTITION BY
        ... ORDER BY ...) <= k``). ``order_by`` items are ``"col"``, ``"col DESC"``, ``"col ASC
        NULLS LAST"`` (NULLs come first ascending and last descending unless said, as in Spark).
        A row of multiplicity m takes m places; rows that tie on ``order_by`` are ordered by all
        their columns, so the result never depends on how the input arrived. ``rank`` names a
        column (INT, added last) holding each row's place, 1 to k (SQL's ``ROW_NUMBER()``): a row
        of multiplicity m is then m rows numbered in turn. ``numbering="rank"`` or
        ``"dense_rank"`` places rows as SQL's ``RANK()`` / ``DENSE_RANK()`` do instead: rows that
        tie on ``order_by`` share a place (after the places of the rows before them, or after
        the distinct ``order_by`` values before them), a row keeps all its copies, and every row
        placed at most k is kept, ties at place k included."""
        if numbering not in ("row_number", "rank", "dense_rank"):
            raise CircuitError(f"top_k: numbering must be 'row_number', 'rank' or 'dense_rank', "
                               f"got {numbering!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise CircuitError(f"top_k: k must be a positive integer, got {k!r}")
        if not isinstance(order_by, list) or not order_by:
            raise CircuitError("top_k: order_by must list one or more columns, e.g. "
                               "['revenue DESC']")
        order = []
        for item in order_by:
            m = _ORDER_RE.fullmatch(item) if isinstance(item, str) else None
            if m is None:
                raise CircuitError(f"top_k: order_by item {item!r} is not 'column [ASC|DESC] "
                                   "[NULLS FIRST|LAST]'")
            col = m["col"]
            if col.startswith("`"):
                col = col[1:-1].replace("``", "`")
            nulls = m["nulls"]
            order.append({"column": col, "descending": (m["dir"] or "").upper() == "DESC",
                          "nulls_first": None if nulls is None else nulls.upper() == "FIRST"})
        partition = [] if partition_by is None else _keys(partition_by, "top_k partition_by")
        params: dict[str, Any] = {"k": k, "order": order, "partition": partition}
        if rank is not None:
            if not isinstance(rank, str) or not rank or rank.startswith("_"):
                raise CircuitError(f"top_k: rank must name a new column, got {rank!r}")
            params["rank"] = rank
        if numbering != "row_number":  # absent by default: earlier circuits keep their print
            params["numbering"] = numbering
        return self._derive("top_k", **params)

    def group_by(self, *keys: str) -> GroupedCollection:
        """Group by the named columns; finish with ``.agg(name="fn(col)", ...)``."""
        flat: list[str] = []
        for k in keys:
            flat.extend([k] if isinstance(k, str) else list(k))
        if not flat:
            raise CircuitError("group_by needs at least one key column")
        for k in flat:
            if not isinstance(k, str) or not k:
                raise CircuitError(f"group_by key must be a column name, got {k!r}")
        if len(set(flat)) != len(flat):
            raise CircuitError(f"group_by keys repeat a column: {flat}")
        return GroupedCollection(self, flat)

    def agg(self, **aggregates: str) -> Collection:
        """Aggregates over the whole collection (SQL's aggregates without GROUP BY), e.g.
        ``agg(n="count(*)", total="sum(amount)")``: always exactly one row, also while the
        collection is empty, when ``count`` is 0 and ``sum``/``avg``/``min``/``max`` are NULL.

        Composed of primitives: the aggregates grouped by a constant key (one group, which
        exists while the collection has rows), plus a constant row of the empty values while
        that group does not exist (a ``constant`` anti-joined with the group)."""
        if not aggregates:
            raise CircuitError("agg needs at least one aggregate, e.g. agg(n='count(*)')")
        parsed = []
        for name, text in aggregates.items():
            _check_name(name, "aggregate column")
            parsed.append(_parse_aggregate(name, text))
        args = list(dict.fromkeys(a.arg for a in parsed if a.arg is not None))
        key = fresh_name("global_key", [*args, *aggregates])
        keyed = self.select(*[quote(a) for a in args], f"0 AS {quote(key)}")
        grouped = keyed.group_by(key).agg(**aggregates)
        unit = self.circuit.constant(f"{quote(key)} INT", [[0]])
        empty_values = unit.select(
            quote(key), *[f"CAST(0 AS BIGINT) AS {quote(a.name)}" for a in parsed
                          if a.fn == "count"])._derive("conform", (), like=grouped.node_id)
        when_empty = empty_values.antijoin(grouped, key)
        return grouped.union(when_empty).select(*[quote(name) for name in aggregates])

    def integrate(self) -> Collection:
        """DBSP integration: at step t, the sum of this collection's values at steps 0..t."""
        return self._derive("integrate")

    def differentiate(self) -> Collection:
        """DBSP differentiation: at step t, this collection's value at t minus its value at t-1."""
        return self._derive("differentiate")

    def delay(self) -> Collection:
        """DBSP delay (z^-1): at step t, this collection's value at step t-1 (empty at step 0)."""
        return self._derive("delay")


class GroupedCollection:
    """The result of ``group_by``; ``agg`` turns it back into a ``Collection``."""

    def __init__(self, source: Collection, keys: list[str]) -> None:
        self.source = source
        self.keys = keys

    def agg(self, **aggregates: str) -> Collection:
        """Aggregates per group, e.g. ``agg(total="sum(amount)", n="count(*)")``.

        Supported: ``count(*)``, ``count(col)``, ``sum(col)``, ``avg(col)``, ``min(col)``,
        ``max(col)``, with SQL semantics (NULLs ignored; ``sum``/``avg``/``min``/``max`` of no
        non-NULL value is NULL). A group exists while it has at least one row.
        """
        if not aggregates:
            raise CircuitError("agg needs at least one aggregate, e.g. agg(n='count(*)')")
        parsed = []
        for name, text in aggregates.items():
            _check_name(name, "aggregate column")
            if name in self.keys:
                raise CircuitError(f"aggregate '{name}' has the name of a group_by key")
            parsed.append(_parse_aggregate(name, text).describe())
        return self.source._derive("aggregate", keys=self.keys, aggregates=parsed)


def node_collection(circuit: Circuit, node_id: int) -> Collection:
    return Collection(circuit, node_id)


def _parse_aggregate(name: str, text: str) -> Aggregate:
    if not isinstance(text, str):
        raise CircuitError(
            f"aggregate '{name}': expected a string like 'sum(amount)', got {text!r}")
    m = _AGG_RE.fullmatch(text)
    if not m or m.group("fn").lower() not in AGGREGATE_FUNCTIONS:
        raise CircuitError(
            f"aggregate '{name}': '{text}' is not one of "
            "count(*), count(col), sum(col), avg(col), min(col), max(col)")
    fn = m.group("fn").lower()
    arg = m.group("arg")
    if arg == "*":
        if fn != "count":
            raise CircuitError(f"aggregate '{name}': only count takes '*', got '{text}'")
        return Aggregate(name, fn, None)
    if arg.startswith("`"):
        arg = arg[1:-1].replace("``", "`")
    return Aggregate(name, fn, arg)


def fresh_name(base: str, taken: list[str]) -> str:
    """``base``, or ``base_2``, ``base_3``... the first not in ``taken`` (case-insensitively,
    as Spark resolves names)."""
    used = {t.lower() for t in taken}
    name, n = base, 1
    while name.lower() in used:
        n += 1
        name = f"{base}_{n}"
    return name


def _keys(on: str | list[str], op: str) -> list[str]:
    keys = [on] if isinstance(on, str) else list(on or [])
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise CircuitError(f"{op}: 'on' must name one or more key columns, got {on!r}")
    if len(set(keys)) != len(keys):
        raise CircuitError(f"{op}: 'on' repeats a column: {keys}")
    return keys


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise CircuitError(f"{what} name must be a non-empty string, got {name!r}")
    if name.startswith("_"):
        raise CircuitError(
            f"{what} name '{name}' is reserved: names starting with '_' belong to the engine")
    if not _NAME_RE.fullmatch(name):
        raise CircuitError(
            f"{what} name '{name}' must start with a letter and use only letters, digits and '_'")

