"""The relations a SQL text can name: a circuit's inputs (tables) and its SQL views.

A ``Relation`` is a collection of the circuit with the names of its columns, in order (the
compiler needs them before Spark analyses the circuit: to expand ``*``, to tell which table a
column belongs to, to rename columns before a join). Names are case-insensitive, as in Spark.

A SELECT with a ``ROW_NUMBER() OVER (...)`` column is a ``Relation`` whose collection is not
built yet (a ``Ranking``): numbering every row of a partition makes each change renumber all the
rows after it, so the query that reads it first says how many places it keeps (``WHERE rn <=
k``: a ``top_k`` of k places). Read without such a bound, every row is numbered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from dbsp_pipeline.circuit import Circuit, Collection, node_collection
from dbsp_pipeline.errors import CircuitError
from dbsp_pipeline.zset import quote

#: the places of a ROW_NUMBER() no query bounds (Spark numbers rows with an INT)
EVERY_PLACE = 2**31 - 1


@dataclass(frozen=True)
class Ranking:
    """``ROW_NUMBER() OVER (PARTITION BY partition ORDER BY order) AS column`` (or ``RANK()``,
    ``DENSE_RANK()``, as ``numbering`` says): ``base`` holds
    the SELECT's other columns and the partition and order keys (``top_k``'s arguments)."""

    base: Collection
    column: str
    order: tuple[str, ...]
    partition: tuple[str, ...]
    numbering: str = "row_number"  # or "rank", "dense_rank": RANK() / DENSE_RANK()


class Relation:
    """A collection and its column names. ``not_null`` holds the columns known never to be NULL
    (declared ``NOT NULL`` in ``CREATE TABLE``). Built on a ``Ranking``, the collection is a
    ``top_k`` of the places ``bounded`` keeps (every place when read as ``collection``)."""

    def __init__(self, collection: Collection | Ranking, columns: tuple[str, ...],
                 not_null: frozenset[str] = frozenset()) -> None:
        self.columns = columns
        self.not_null = not_null
        self.ranking = collection if isinstance(collection, Ranking) else None
        self._collections: dict[int, Collection] = (
            {} if isinstance(collection, Ranking) else {EVERY_PLACE: collection})

    @property
    def collection(self) -> Collection:
        return self._places(EVERY_PLACE)

    def bounded(self, k: int) -> Collection:
        """The collection when only the rows numbered 1 to ``k`` are read (all rows unless the
        relation is ranked)."""
        return self._places(k if self.ranking is not None else EVERY_PLACE)

    def _places(self, k: int) -> Collection:
        if k not in self._collections:
            r = self.ranking
            assert r is not None
            ranked = r.base.top_k(k, list(r.order), list(r.partition) or None, rank=r.column,
                                  numbering=r.numbering)
            self._collections[k] = ranked.select(*[quote(c) for c in self.columns])
        return self._collections[k]


@dataclass
class Catalog:
    """Relations by lower-cased name: the circuit's inputs and the views SQL declared on it."""

    circuit: Circuit
    relations: dict[str, Relation] = field(default_factory=dict)

    def lookup(self, name: str) -> Relation | None:
        return self.relations.get(name.lower())

    def add(self, name: str, relation: Relation) -> None:
        self.relations[name.lower()] = relation

    @classmethod
    def of(cls, circuit: Circuit) -> Catalog:
        """The catalog of ``circuit`` as declared so far: every input (columns parsed from its
        DDL schema) and every output declared from SQL."""
        catalog = cls(circuit)
        for name, node_id in circuit.inputs.items():
            columns, not_null = ddl_columns(circuit.input_schemas[name])
            catalog.add(name, Relation(node_collection(circuit, node_id), columns, not_null))
        for name, columns in circuit.sql_views.items():
            catalog.add(name, Relation(node_collection(circuit, circuit.outputs[name]),
                                       tuple(columns)))
        return catalog


def ddl_columns(ddl: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """The column names of a Spark DDL schema (``"id BIGINT NOT NULL, name STRING"``) and those
    declared NOT NULL."""
    try:
        create = sqlglot.parse_one(f"CREATE TABLE t ({ddl})", read="spark")
    except sqlglot.errors.ParseError as e:
        raise CircuitError(f"schema '{ddl}' is not a Spark DDL column list: {e}") from None
    schema = create.this
    if not isinstance(schema, exp.Schema):
        raise CircuitError(f"schema '{ddl}' is not a Spark DDL column list")
    return column_defs(schema.expressions)


def ddl_column_types(ddl: str) -> list[tuple[str, str, bool]]:
    """Per column of a Spark DDL schema: its name, its type as Spark writes it
    (``decimal(12,2)``, ``timestamp``), and whether it may be NULL. Read without a JVM."""
    create = sqlglot.parse_one(f"CREATE TABLE t ({ddl})", read="spark")
    schema = create.this
    out = []
    for d in schema.expressions if isinstance(schema, exp.Schema) else []:
        if not isinstance(d, exp.ColumnDef):
            continue
        kind = d.args.get("kind")
        text = kind.sql(dialect="spark").lower().replace(", ", ",") if kind else "string"
        not_null = any(isinstance(c.args.get("kind"), exp.NotNullColumnConstraint)
                       for c in d.args.get("constraints") or [])
        out.append((d.name, text, not not_null))
    return out


def column_defs(defs: Sequence[exp.Expr]) -> tuple[tuple[str, ...], frozenset[str]]:
    """Names of ``ColumnDef`` nodes, and those with a NOT NULL constraint."""
    names: list[str] = []
    not_null: set[str] = set()
    for d in defs:
        if not isinstance(d, exp.ColumnDef):
            continue
        names.append(d.name)
        if any(isinstance(c.args.get("kind"), exp.NotNullColumnConstraint)
               for c in d.args.get("constraints") or []):
            not_null.add(d.name.lower())
    return tuple(names), frozenset(not_null)
