"""Compiling a circuit: schemas resolved and checked with Spark, one operator per node.

Every expression is analysed by Spark against an empty DataFrame of the input schema (no job
runs), so a bad column, a bad type or a reserved name is a ``CircuitError`` naming the operator,
before any state exists. The analysed schemas are cached in the pipeline root (keyed by the
circuit's fingerprint and the Spark version), so reopening a pipeline whose steps run on the
driver never has to start the JVM. The compiled plan evaluates nodes in declaration order, which
is a topological order (a node can only read nodes declared before it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyspark
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NumericType,
    ShortType,
    StringType,
    StructField,
    StructType,
    VarcharType,
)

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import Circuit, Node
from dbsp_pipeline.driver import hashing
from dbsp_pipeline.errors import CircuitError, ComputationError, DbspError
from dbsp_pipeline.operators.aggregate import Aggregate
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.operators.constant import Constant, constant_table
from dbsp_pipeline.operators.distinct import Distinct
from dbsp_pipeline.operators.integration import Delay, Differentiate, Integrate
from dbsp_pipeline.operators.join import Join
from dbsp_pipeline.operators.linear import (
    Conform,
    Filter,
    Negate,
    Repeat,
    Select,
    Union,
    UserSQL,
)
from dbsp_pipeline.operators.top_k import OrderKey, TopK, ranked_schema
from dbsp_pipeline.runtime import scatter
from dbsp_pipeline.runtime.circuit_diff import (
    NODE_REFERENCES,
    positional_state_name,
    positional_state_names,
)
from dbsp_pipeline.runtime.exchange import OwnedChange
from dbsp_pipeline.runtime.owner_exec import gang_stages, owner_stage
from dbsp_pipeline.runtime.results import add_seconds
from dbsp_pipeline.spark_session import LazySession, quiet_query_context_logs
from dbsp_pipeline.storage.small_files import read_text, write_atomically
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.task_table import TaskStateDb
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import quote

log = logging.getLogger(__name__)

#: The file in a pipeline root caching the schemas Spark analysed for its circuit.
SCHEMA_CACHE_FILE = root_layout.PLAN_SCHEMAS

class Plan:
    """A circuit compiled against Spark, with its operators bound to the state database."""

    def __init__(self, circuit: Circuit, spark: SparkSession, db: StateDatabase,
                 schema_cache: str | None = None,
                 state_names: Mapping[int, str] | None = None, strict: bool = True) -> None:
        self.circuit = circuit
        self.spark = spark
        #: whether an expression no step can compute as declared (a function whose value is
        #: not the row's, a constant that does not cast) refuses the circuit; not for the
        #: circuit a root's state was computed by (it opens, with a warning, so that it can be
        #: upgraded away from)
        self.strict = strict
        #: the root of the state the operators are bound to
        self.root = db.root
        #: the name of each stateful node's tables (their prefix): positional
        #: (``circuit_diff.positional_state_names``) until an upgrade named them otherwise
        self.state_names: dict[int, str] = dict(
            positional_state_names(circuit.describe()) if state_names is None else state_names)
        self.schemas: dict[int, StructType] = {}
        self.operators: dict[int, Operator] = {}
        cached = _load_schemas(schema_cache, circuit)
        if cached is not None:
            self.schemas = cached
        else:
            if isinstance(spark, LazySession):
                spark.get()  # parsing DDL needs an active session
            views = _views_fed(circuit)  # (named in an operator's errors)
            for node in circuit.nodes:
                self.schemas[node.id] = self._schema(node, views.get(node.id, []))
            _store_schemas(schema_cache, circuit, self.schemas)
        for node in circuit.nodes:
            if node.op != "input":
                self.operators[node.id] = make_operator(node, self.schemas, db,
                                                        self.state_names.get(node.id))
        #: the operator that has no driver implementation, described (None: every operator
        #: has one, so steps can run on the driver); decided once, from the compiled plan
        self.spark_only = self._spark_only()
        #: the nodes whose Spark steps can run as one task per owner (``runtime/owner_exec.py``):
        #: the operator names the keys its change is grouped by (``Operator.owner_keys``) and
        #: the driver hashes their types (the tasks shard and look up as the driver path does)
        self.owner_capable = self._owner_capable()
        #: each node's readers: the nodes that take its change as an input
        self.readers: dict[int, list[int]] = {
            n.id: [m.id for m in circuit.nodes if n.id in m.inputs] for n in circuit.nodes}
        #: the inputs only owner stages read (no other operator, not a view): on a per-owner
        #: Spark step their change is not consolidated in Spark (two shuffles) but by each task,
        #: over its owner's rows (equal rows have equal keys, so one owner)
        self.read_by_owner_stages = self._read_by_owner_stages()
        #: the owner-capable nodes whose change only owner stages read, all grouping it by the
        #: same columns (the value): on a per-owner Spark step their tasks hand it on as
        #: exchange files split by those columns' owners (``runtime/exchange.py``)
        self.exchange_keys = {n: keys for n in sorted(self.owner_capable)
                              if (keys := self.handoff_keys(n)) is not None}
        #: of those, the nodes whose readers together read fewer than all of its columns
        #: (``Operator.columns_read``; the value: those columns, in the schema's order): their
        #: tasks hand on only these columns
        self.exchange_columns = {n: columns for n in self.exchange_keys
                                 if (columns := self._columns_read(n)) is not None}
        #: per circuit input (node id), the chain of row-wise nodes after it that ends at a
        #: node whose change only owner stages read, and their columns: on a per-owner Spark
        #: step the input's pushed files are split by owner in tasks (``runtime/scatter.py``)
        self.scatter_chains = {n.id: chain for n in circuit.nodes if n.op == "input"
                               and (chain := scatter.chain_of(self, n)) is not None}
        #: an owner stage whose change goes as exchange files to exactly one owner stage (the
        #: value, which reads it as one of its inputs): on a per-owner Spark step a chain of
        #: such stages may run as one job (``gang_chain``, ``owner_exec.gang_stages``)
        self.gang_reader = {n: readers[0] for n in self.exchange_keys
                            if len(readers := self.readers[n]) == 1}

    @property
    def runs_on_driver(self) -> bool:
        """Whether steps can run on the driver (no operator is ``spark_only``)."""
        return self.spark_only is None

    def input_schema(self, name: str) -> StructType:
        return self.schemas[self.circuit.inputs[name]]

    def output_schema(self, name: str) -> StructType:
        return self.schemas[self.circuit.outputs[name]]

    def evaluate(self, ctx: StepContext,
                 input_changes: Mapping[str, Delta | LocalDelta | scatter.PushedChange]
                 ) -> dict[int, Delta | LocalDelta | OwnedChange | scatter.ScatterInReaders]:
        """Run every operator once for this step, as Spark jobs or on the driver
        (``ctx.on_driver``); returns each node's change (a node of a scattered chain,
        ``runtime/scatter.py``, has none but the chain's last). An input's change may come as
        its pushed files (``scatter.PushedChange``): on a per-owner step with a scatter chain
        they are split by owner in tasks (the readers' own, or a scatter stage's), else read
        into Spark."""
        changes: dict[int, Delta | LocalDelta | OwnedChange | scatter.ScatterInReaders] = {}
        done: set[int] = set()  # run already (in a scattered chain, or a gang job)
        for node in self.circuit.nodes:
            if node.id in done:
                continue
            started = time.monotonic()
            label = self.operator_label(node)
            if node.op == "input":
                change = input_changes.get(node.params["name"])
                if isinstance(change, scatter.PushedChange):
                    scattering = ctx.per_owner and node.id in self.scatter_chains
                    handed = ((scatter.in_readers(ctx, self, node, change)
                               or scatter.scatter_stage(ctx, self, node, change))
                              if scattering else scatter.FALLBACK)
                    if handed == scatter.FALLBACK:
                        change = change.frame()
                    else:
                        chain, _ = self.scatter_chains[node.id]
                        done.update(chain)
                        changes[chain[-1] if chain else node.id] = handed
                        add_seconds(ctx.operator_seconds, label, started)  # (its job, if any)
                        continue
                changes[node.id] = change
                continue
            operator = self.operators[node.id]
            inputs = [changes[i] for i in node.inputs]
            ctx.running = label
            if ctx.on_driver:
                try:
                    changes[node.id] = operator.step_local(ctx, inputs)
                except DbspError:
                    raise
                except Exception as e:  # the operator's computation: named, with its views
                    views = _views_fed(self.circuit).get(node.id, [])
                    raise ComputationError(f"{_described_in(node, views)}: "
                                           f"{type(e).__name__}: {e}") from e
            elif ctx.per_owner and node.id in self.owner_capable:
                stages = self.gang_chain(node, changes) if ctx.gang_stages else [node]
                made = gang_stages(ctx, self, stages, inputs) if len(stages) > 1 else None
                if made is None:
                    changes[node.id] = owner_stage(ctx, self, node, inputs)
                else:
                    changes.update({stage.id: change for stage, change in zip(stages, made)})
                    done.update(stage.id for stage in stages)
                    label = "+".join(self.operator_label(stage) for stage in stages)
            else:  # (an exchanged change goes only to owner stages: ``exchange_keys``)
                changes[node.id] = operator.step(ctx, [self._frame_of(ctx, c) for c in inputs])
            add_seconds(ctx.operator_seconds, label, started)
        return changes

    def spark_operators(self) -> list[SparkOperator]:
        """The operators a driver step runs as a Spark job over their change whatever it
        holds: their expressions are outside ``driver.expressions``' translation. Each costs a
        job a step, and the JVM's start in a new process."""
        fed = _views_fed(self.circuit)
        return [SparkOperator(self.operator_label(node), fed.get(node.id, []), expressions)
                for node in self.circuit.nodes
                if isinstance(op := self.operators.get(node.id), UserSQL)
                and (expressions := op.untranslated())]

    def operator_label(self, node: Node) -> str:
        """How ``StepResult.operator_seconds`` names node ``node``: its state tables' name
        (``state_names``: ``n<id>_<op>`` unless an upgrade kept another), or ``n<id>_<op>``
        for a node without state; an input as ``input:<name>`` (timed only where its pushed
        files are split by owner: a scatter stage's job, or the readers' tasks set up to)."""
        if node.op == "input":
            return f"input:{node.params['name']}"
        return self.state_names.get(node.id) or positional_state_name(node.id, node.op)

    def gang_chain(self, node: Node, changes: Mapping[int, object]) -> list[Node]:
        """``node`` and the owner stages after it that one gang job may run this step: each
        the one reader of the stage before (``gang_reader``) whose other inputs are computed
        (``changes``) and did not change."""
        chain = [node]
        while (reader := self.gang_reader.get(chain[-1].id)) is not None:
            following = self.circuit.nodes[reader]
            if any(i != chain[-1].id and (i not in changes or changes[i] is not None)
                   for i in following.inputs):
                break
            chain.append(following)
        return chain

    def _frame_of(self, ctx: StepContext,
                  change: Delta | LocalDelta | OwnedChange | scatter.ScatterInReaders
                  ) -> Delta:
        """A change as a Spark operator reads it (only owner stages read exchanged or
        to-be-split changes, but a change to split is made into one if asked)."""
        if isinstance(change, scatter.ScatterInReaders):
            change = scatter.materialize(ctx, self, change)
        if isinstance(change, OwnedChange):
            return change.to_frame(ctx.session)
        if isinstance(change, pa.Table):
            raise AssertionError("a driver-path change on a Spark step")
        return change

    def _owner_capable(self) -> set[int]:
        capable = set()
        for node in self.circuit.nodes:
            if node.op == "input":
                continue
            keys = self.operators[node.id].owner_keys()
            if keys is None:
                continue
            types = [self.schemas[i][k].dataType for i, side in zip(node.inputs, keys)
                     for k in side]
            if all(hashing.supports(t) for t in types):
                capable.add(node.id)
        return capable

    def _read_by_owner_stages(self) -> set[str]:
        views = set(self.circuit.outputs.values())
        return {name for name, input_id in self.circuit.inputs.items()
                if self.readers[input_id] and input_id not in views
                and set(self.readers[input_id]) <= self.owner_capable}

    def handoff_keys(self, node_id: int) -> tuple[str, ...] | None:
        """The columns every reader of node ``node_id`` groups its change by, when all its
        readers are owner stages grouping by the same columns and it is not a view (its change
        can then go to them as exchange files, ``runtime/exchange.py``); else None."""
        readers = self.readers[node_id]
        if node_id in self.circuit.outputs.values() or not readers:
            return None
        wanted: set[tuple[str, ...]] = set()
        for reader in readers:
            inputs = self.circuit.nodes[reader].inputs
            keys = self.operators[reader].owner_keys()
            if reader not in self.owner_capable or keys is None or inputs.count(node_id) != 1:
                return None
            wanted.add(tuple(keys[inputs.index(node_id)]))
        return wanted.pop() if len(wanted) == 1 else None

    def _columns_read(self, node_id: int) -> tuple[str, ...] | None:
        """The columns of node ``node_id``'s change that its readers read, in its schema's
        order, when that is fewer than all (every reader says which, ``Operator.columns_read``);
        else None."""
        read: set[str] = set()
        for reader in self.readers[node_id]:
            columns = self.operators[reader].columns_read()
            if columns is None:
                return None
            read.update(columns)
        names = self.schemas[node_id].fieldNames()
        kept = tuple(n for n in names if n in read)
        return kept if len(kept) < len(names) else None

    def _spark_only(self) -> str | None:
        """The first operator that keeps steps off the driver, described: a key a trace is
        sharded by whose type's Spark hash the driver does not reproduce. None when there is
        none."""
        for node in self.circuit.nodes:
            if not node.inputs:
                continue
            schema = self.schemas[node.inputs[0]]
            if node.op == "join":
                keys = [schema[k].dataType for k in node.params["on"]]
            elif node.op == "aggregate":
                keys = [schema[k].dataType for k in node.params["keys"]]
            elif node.op == "top_k":
                keys = [schema[k].dataType for k in node.params["partition"]]
            elif node.op in ("distinct", "integrate", "delay", "differentiate"):
                keys = [f.dataType for f in schema.fields]
            else:
                continue
            unhashable = [t.simpleString() for t in keys if not hashing.supports(t)]
            if unhashable:
                return f"{_describe(node)} (a key of type {', '.join(unhashable)})"
        return None

    def traces(self) -> list[Trace]:
        """Every growing trace of the circuit (the ones compaction keeps small)."""
        return [t for op in self.operators.values() for t in op.traces()]

    def state_traces(self) -> list[Trace]:
        """Every trace of the circuit's state (growing or not)."""
        return [t for op in self.operators.values() for t in op.state_traces()]

    # -- schemas ---------------------------------------------------------------------------
    def _schema(self, node: Node, views: Sequence[str]) -> StructType:
        """``node``'s columns as Spark analyses them, checked; a ``CircuitError`` naming the
        node and ``views``, the views it feeds."""
        what = _described_in(node, views)
        if node.op == "input":
            return self._ddl(what, node.params["schema"])
        if node.op == "constant":
            schema = self._ddl(what, node.params["schema"])
            try:
                constant_table(schema, node.params["rows"])
            except (ValueError, TypeError, pa.ArrowException) as e:
                raise CircuitError(f"{what}: its rows do not fit {schema.simpleString()}: "
                                   f"{_first_line(e)}") from None
            return schema
        inputs = [self.schemas[i] for i in node.inputs]
        src = inputs[0]
        if node.op == "select":
            schema = self._analyse(what, lambda: self._empty(src).select(
                *[F.expr(e) for e in node.params["exprs"]]), fold_constants=True)
            return _check_columns(schema, what)
        if node.op == "filter":
            pred = self._analyse(what, lambda: self._empty(src).select(
                F.expr(node.params["predicate"])), fold_constants=True)
            if not isinstance(pred.fields[0].dataType, BooleanType):
                raise CircuitError(f"{what}: predicate '{node.params['predicate']}' is "
                                   f"{pred.fields[0].dataType.simpleString()}, not boolean")
            return src
        if node.op == "union":
            for other in inputs[1:]:
                if set(_by_name(other)) != set(_by_name(src)):
                    raise CircuitError(f"{what}: schemas differ: {src.simpleString()} vs "
                                       f"{other.simpleString()}")
            if all(_by_name(other) == _by_name(src) for other in inputs[1:]):
                return _nullable_where_any(src, inputs)
            # the same columns of different types: each column of the type Spark's UNION
            # widens them to (INT and BIGINT to BIGINT, DECIMALs to one holding both), when
            # every value converts exactly (the driver path casts with Arrow, which refuses a
            # lossy conversion where Spark would round)
            try:
                with quiet_query_context_logs():
                    widened = self._empty(src)
                    for other in inputs[1:]:
                        widened = widened.unionByName(self._empty(other))
                    schema = widened.schema
            except PySparkException:
                raise CircuitError(f"{what}: schemas differ: {src.simpleString()} vs "
                                   f"{' vs '.join(o.simpleString() for o in inputs[1:])}: no type "
                                   "holds both of a column's types") from None
            for f in schema.fields:
                for given in inputs:
                    t = given[f.name].dataType
                    if not _widens_exactly(t, f.dataType):
                        raise CircuitError(
                            f"{what}: schemas differ: column '{f.name}' is {t.simpleString()} "
                            f"in one input and would become {f.dataType.simpleString()}, which "
                            "does not hold every value exactly: cast the inputs to one type "
                            f"(CAST(... AS {f.dataType.simpleString().upper()}))")
            return schema
        if node.op == "conform":  # ``like``'s columns; those ``src`` lacks are NULL
            like = self.schemas[node.params["like"]]
            padded = [f.name for f in like.fields if f.name not in src.fieldNames()]
            return _nullable_where_any(like, [src], padded)
        if node.op == "repeat":
            count = node.params["count"]
            if count not in src.fieldNames():
                raise CircuitError(f"{what}: column '{count}' not in "
                                   f"({', '.join(src.fieldNames())})")
            if not isinstance(src[count].dataType, (ByteType, ShortType, IntegerType, LongType)):
                raise CircuitError(f"{what}: column '{count}' is "
                                   f"{src[count].dataType.simpleString()}, not an integer count")
            return StructType([f for f in src.fields if f.name != count])
        if node.op == "join":
            return self._join_schema(what, node.params["on"], inputs[0], inputs[1])
        if node.op == "aggregate":
            return self._aggregate_schema(what, node, src)
        if node.op == "top_k":
            named = [o["column"] for o in node.params["order"]] + node.params["partition"]
            missing = [c for c in named if c not in src.fieldNames()]
            if missing:
                raise CircuitError(f"{what}: column(s) {missing} not in "
                                   f"({', '.join(src.fieldNames())})")
            rank = node.params.get("rank")
            if rank is not None and rank.lower() in {c.lower() for c in src.fieldNames()}:
                raise CircuitError(f"{what}: the rank column '{rank}' is already a column of "
                                   f"({', '.join(src.fieldNames())})")
            return ranked_schema(src, rank)
        # negate, distinct, integrate, differentiate, delay keep the schema
        return src

    def _join_schema(self, what: str, on: Sequence[str], left: StructType,
                     right: StructType) -> StructType:
        for side, schema in (("left", left), ("right", right)):
            missing = [k for k in on if k not in schema.fieldNames()]
            if missing:
                raise CircuitError(f"{what}: key column(s) {missing} not in the {side} side "
                                   f"({', '.join(schema.fieldNames())})")
        for k in on:
            if left[k].dataType != right[k].dataType:
                raise CircuitError(
                    f"{what}: key '{k}' is {left[k].dataType.simpleString()} on the left and "
                    f"{right[k].dataType.simpleString()} on the right; cast one side to the "
                    "other's type (a select, or CAST in SQL)")
        clash = (set(left.fieldNames()) & set(right.fieldNames())) - set(on)
        if clash:
            raise CircuitError(f"{what}: both sides have column(s) {sorted(clash)}; rename one "
                               "side with select before joining")
        return self._analyse(what, lambda: self._empty(left).join(
            self._empty(right), on=list(on), how="inner"))

    def _aggregate_schema(self, what: str, node: Node, src: StructType) -> StructType:
        keys = node.params["keys"]
        missing = [k for k in keys if k not in src.fieldNames()]
        if missing:
            raise CircuitError(f"{what}: group_by column(s) {missing} not in "
                               f"({', '.join(src.fieldNames())})")
        exprs = []
        for a in node.params["aggregates"]:
            if a["arg"] is None:
                exprs.append(F.count(F.lit(1)).alias(a["name"]))
                continue
            if a["arg"] not in src.fieldNames():
                raise CircuitError(f"{what}: aggregate '{a['name']}' reads column '{a['arg']}', "
                                   f"which is not in ({', '.join(src.fieldNames())})")
            dtype = src[a["arg"]].dataType
            if a["fn"] in ("sum", "avg") and not isinstance(dtype, NumericType):
                raise CircuitError(f"{what}: aggregate '{a['name']}' = {a['fn']}({a['arg']}) "
                                   f"needs a numeric column, '{a['arg']}' is "
                                   f"{dtype.simpleString()}")
            if a["fn"] == "sum_state":  # eager aggregation's partial sums (``eager_aggregation``)
                if not isinstance(dtype, NumericType) or isinstance(dtype, DecimalType):
                    raise CircuitError(f"{what}: aggregate '{a['name']}' = sum_state("
                                       f"{a['arg']}) needs a number that is not a decimal")
                exprs.append(F.max(F.col(quote(a["arg"])).cast("string")).alias(a["name"]))
                continue
            if a["fn"] == "sum_of_states":
                if not isinstance(dtype, StringType):
                    raise CircuitError(f"{what}: aggregate '{a['name']}' = sum_of_states("
                                       f"{a['arg']}) needs the text of partial sums")
                exprs.append(F.sum(F.col(quote(a["arg"])).cast("double")).alias(a["name"]))
                continue
            fn = {"count": F.count, "sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}
            exprs.append(fn[a["fn"]](F.col(quote(a["arg"]))).alias(a["name"]))
        return self._analyse(what, lambda: self._empty(src).groupBy(
            *[quote(k) for k in keys]).agg(*exprs))

    # -- helpers ---------------------------------------------------------------------------
    def _ddl(self, what: str, ddl: str) -> StructType:
        """The columns of Spark DDL ``ddl`` (an input's or a constant's schema), checked."""
        try:
            parsed = StructType.fromDDL(ddl)
        except Exception as e:
            raise CircuitError(f"{what}: schema '{ddl}' is not valid Spark DDL: "
                               f"{_first_line(e)}") from None
        if not isinstance(parsed, StructType):  # fromDDL of one bare type
            raise CircuitError(f"{what}: schema '{ddl}' is not a list of columns")
        return _check_columns(cast(StructType, _chars_as_strings(parsed)), what)

    def _empty(self, schema: StructType) -> DataFrame:
        return self.spark.createDataFrame([], schema)

    def _analyse(self, what: str, build: Callable[[], DataFrame],
                 fold_constants: bool = False) -> StructType:
        """The schema of the operator ``build`` gives, as Spark's analysis types it; a
        ``CircuitError`` naming the operator (``what``) when Spark refuses it, or when one of
        its expressions is not a function of its row (``_changing_function``). With
        ``fold_constants``, Spark's optimizer also evaluates the constant parts of the
        expressions, as every step would: ``id > 'abc'`` (the text cast to a number) is refused
        here, not by every step."""
        try:
            with quiet_query_context_logs():
                df = build()
                schema: StructType = df.schema
        except PySparkException as e:
            raise CircuitError(f"{what}: {_first_line(e)}") from None
        try:
            with quiet_query_context_logs():
                if fold_constants:
                    _optimize(df)
                changing = _changing_function(df)
        except (PySparkException, Py4JError) as e:  # (Java errors PySpark maps, and others)
            problem: str | None = f"{what}: {_first_line(e)}"
        else:
            problem = None if changing is None else (
                f"{what}: {changing[0]}() is the time a step computes it, not a value of the "
                "row: a view maintained step by step would keep each row as of the step that "
                "added it; push the time as a column of the input instead" if changing[1] else
                f"{what}: {changing[0]}() gives another value each time it is evaluated: a "
                "deleted row would not take back the value its insert added; remove it (a "
                "sample: filter on a hash of a key, e.g. xxhash64(id) % 10 = 0)")
        if problem is not None:
            if self.strict:
                raise CircuitError(problem)
            log.warning("%s (the root's state was computed by this circuit: it opens as "
                        "before; upgrade to a circuit without it)", problem)
        return schema


#: Spark's expressions of the time a query runs (``current_timestamp()`` and its kin): Spark
#: marks them deterministic (one value within a query), but each step is a query of its own
_TIME_OF_QUERY = frozenset({"CurrentTimestamp", "Now", "CurrentDate", "CurrentTime",
                            "LocalTimestamp", "CurrentBatchTimestamp"})
#: how an analysed plan prints them (a plan that prints none of these holds none)
_TIME_NAMES = re.compile(r"\b(current_timestamp|now|current_date|current_time|localtimestamp|"
                         r"current_batch_timestamp)\(", re.IGNORECASE)


#: Spark's functions whose value is not a function of their arguments, by the name a plan prints
#: (on Spark Connect, where the plan is only read as text: ``_changing_function``)
_CHANGING_NAMES = re.compile(
    r"\b(rand|randn|random|uuid|shuffle|monotonically_increasing_id|spark_partition_id|"
    r"input_file_name|input_file_block_start|input_file_block_length|randstr|uniform)\(",
    re.IGNORECASE)


def _is_connect(df: DataFrame) -> bool:
    """Whether ``df`` is a Spark Connect DataFrame (no JVM in this process)."""
    return type(df).__module__.startswith("pyspark.sql.connect")


def _optimize(df: DataFrame) -> None:
    """Run Spark's optimizer on ``df``'s plan (which folds its constant expressions, raising
    what evaluating them raises); on Spark Connect, by an explain request to the server."""
    if _is_connect(df):
        cast(Any, df)._explain_string(mode="extended")
    else:
        df._jdf.queryExecution().optimizedPlan()


def _changing_function(df: DataFrame) -> tuple[str, bool] | None:
    """The first function in the expressions of ``df``'s analysed plan whose value is not a
    function of its row (None if there is none), and whether it is the time of the query:
    Spark's non-deterministic expressions (``rand()``, ``uuid()``, ``shuffle()``, ...) and
    ``_TIME_OF_QUERY``. Two calls into the JVM for a plan that has none (the common answer);
    the expression trees are walked only to name the one found. On Spark Connect the analysed
    plan is read as the server explains it, by the functions' names (``_CHANGING_NAMES``,
    ``_TIME_NAMES``)."""
    if _is_connect(df):
        text = str(cast(Any, df)._explain_string(mode="extended"))
        analysed = text.split("== Analyzed Logical Plan ==")[-1].split("== Optimized")[0]
        for pattern, timed in ((_TIME_NAMES, True), (_CHANGING_NAMES, False)):
            m = pattern.search(analysed)
            if m:
                return m[1].lower(), timed
        return None
    root = df._jdf.queryExecution().analyzed()
    printed = str(root.toString())  # (a long list of columns is cut short: then walk it)
    if root.deterministic() and not _TIME_NAMES.search(printed) and "more fields" not in printed:
        return None
    plans = [root]
    while plans:
        plan = plans.pop()
        expressions = plan.expressions()
        exprs = [expressions.apply(i) for i in range(expressions.size())]
        while exprs:
            e = exprs.pop()
            children = e.children()
            kids = [children.apply(i) for i in range(children.size())]
            timed = str(e.getClass().getSimpleName()) in _TIME_OF_QUERY
            if timed or (not e.deterministic() and all(k.deterministic() for k in kids)):
                return str(e.prettyName()), timed
            exprs.extend(kids)
        children = plan.children()
        plans.extend(children.apply(i) for i in range(children.size()))
    return None


def make_operator(node: Node, schemas: Mapping[int, StructType],
                  db: StateDatabase | TaskStateDb, state_name: str | None = None) -> Operator:
    """The operator of ``node`` (not an input), its traces bound to ``db``: the driver's state
    database (``Plan``), or one owner's view of it in a Spark task (``runtime/owner_exec.py``).
    ``schemas`` are the analysed schemas of the circuit's nodes; ``state_name`` names the
    operator's tables (``Plan.state_names``; default: positional)."""
    # Operators reach state only through ``Trace``, which uses ``db.table``, ``db.spark`` and
    # ``db.root``; a ``TaskStateDb`` offers those three (``storage/task_table.py``).
    state = cast(StateDatabase, db)
    schema = schemas[node.id]
    if node.op == "constant":
        return Constant(schema, node.params["rows"])
    src = schemas[node.inputs[0]]
    name = state_name or positional_state_name(node.id, node.op)
    p = node.params
    if node.op == "select":
        return Select(p["exprs"], src, schema)
    if node.op == "filter":
        return Filter(p["predicate"], schema)
    if node.op == "union":
        return Union(schema)
    if node.op == "negate":
        return Negate(schema)
    if node.op == "conform":
        return Conform(src, schema)
    if node.op == "repeat":
        return Repeat(p["count"], schema)
    if node.op == "distinct":
        return Distinct(state, name, schema)
    if node.op == "join":
        return Join(state, name, p["on"], src, schemas[node.inputs[1]], schema)
    if node.op == "aggregate":
        return Aggregate(state, name, p["keys"], p["aggregates"], src, schema)
    if node.op == "top_k":
        return TopK(state, name, p["partition"], [OrderKey.of(o) for o in p["order"]], p["k"],
                    src, p.get("rank"), p.get("numbering", "row_number"))
    if node.op == "integrate":
        return Integrate(state, name, schema)
    if node.op == "delay":
        return Delay(state, name, schema)
    if node.op == "differentiate":
        return Differentiate(state, name, schema)
    raise CircuitError(f"{_describe(node)}: unknown operator")  # pragma: no cover


#: the version of this module's own schema rules (``_schema``), in the cache key: 2 since a
#: union and a conform's padding make a column nullable where an input's is
SCHEMA_RULES = 2


def _schema_cache_key(circuit: Circuit) -> str:
    """Analysed schemas depend on the circuit, on Spark's analyser (its version) and on this
    module's rules (``SCHEMA_RULES``)."""
    return f"{circuit.fingerprint()}/pyspark-{pyspark.__version__}/rules-{SCHEMA_RULES}"


def read_schema_cache(path: str) -> tuple[str, dict[int, StructType]]:
    """The key and the schemas of the schema cache at ``path``; ``ValueError`` saying what is
    wrong with it when it is not a cache this engine wrote (damaged, cut off, edited: its
    digest no longer matches). ``OSError`` when it cannot be read."""
    text = read_text(path)
    if text is None:
        raise FileNotFoundError(path)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("key"), str) \
            or not isinstance(data.get("schemas"), dict):
        raise ValueError(f"not a schema cache (a {type(data).__name__} without 'key' and "
                         "'schemas')")
    if "digest" in data and data["digest"] != _schemas_digest(data["schemas"]):
        raise ValueError("its digest does not match its schemas")
    try:
        schemas = {int(k): StructType.fromJson(v) for k, v in data["schemas"].items()}
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ValueError(f"a schema in it is not valid ({type(e).__name__}: {e})") from None
    return data["key"], schemas


def _load_schemas(path: str | None, circuit: Circuit) -> dict[int, StructType] | None:
    """The schemas Spark analysed for this circuit when it was first compiled here, if any. A
    cache that cannot be read or is damaged is a miss: the circuit is analysed again and the
    cache written anew (it holds nothing the circuit and Spark do not determine)."""
    if path is None:
        return None
    try:
        key, schemas = read_schema_cache(path)
    except (OSError, ValueError):
        return None
    if key != _schema_cache_key(circuit):
        return None
    return schemas if set(schemas) == {n.id for n in circuit.nodes} else None


def _store_schemas(path: str | None, circuit: Circuit, schemas: dict[int, StructType]) -> None:
    if path is None:
        return
    stored = {str(k): v.jsonValue() for k, v in schemas.items()}
    data = {"key": _schema_cache_key(circuit), "schemas": stored,
            "digest": _schemas_digest(stored)}
    write_atomically(path, json.dumps(data))


def _schemas_digest(schemas: object) -> str:
    return hashlib.sha256(json.dumps(schemas, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class SparkOperator:
    """An operator whose expressions only Spark evaluates (``Plan.spark_operators``)."""

    #: as ``StepResult.operator_seconds`` and ``spark_jobs`` name it
    label: str
    #: the views its change flows into
    views: list[str]
    #: its expressions outside the driver's translation
    expressions: list[str]


def _views_fed(circuit: Circuit) -> dict[int, list[str]]:
    """Per node, the output views its change flows into (sorted), through its readers' inputs
    and the nodes they take a schema from (``conform``'s ``like``): where a user finds it."""
    fed: dict[int, set[str]] = {}
    for view, node_id in circuit.outputs.items():
        stack = [node_id]
        while stack:
            n = stack.pop()
            if view in fed.setdefault(n, set()):
                continue
            fed[n].add(view)
            node = circuit.nodes[n]
            stack.extend(node.inputs)
            stack.extend(node.params[r] for r in NODE_REFERENCES.get(node.op, ()))
    return {n: sorted(views) for n, views in fed.items()}


#: an operator's error names at most this many of the views it feeds
_VIEWS_NAMED = 3


def _described_in(node: Node, views: Sequence[str]) -> str:
    """``node`` described, with the views it feeds (the first few, and how many more)."""
    what = _describe(node)
    if views and node.op != "input":
        named = ", ".join(repr(v) for v in views[:_VIEWS_NAMED])
        more = len(views) - _VIEWS_NAMED
        what += f" (in view{'s' if len(views) > 1 else ''} {named}" \
                f"{f' and {more} more' if more > 0 else ''})"
    return what


def _describe(node: Node) -> str:
    if node.op == "input":
        return f"input '{node.params['name']}'"
    detail = ""
    if node.op == "select":
        detail = f" {node.params['exprs']}"
    elif node.op == "filter":
        detail = f" '{node.params['predicate']}'"
    elif node.op == "join":
        detail = f" on {node.params['on']}"
    elif node.op == "aggregate":
        detail = f" by {node.params['keys']}"
    return f"operator #{node.id} {node.op}{detail}"


def _chars_as_strings(t: DataType) -> DataType:
    """``t`` with every ``CHAR(n)`` and ``VARCHAR(n)`` a STRING, at any depth: a table declared
    as a database's DDL usually has them, and Spark keeps them as strings in DataFrames too
    (its plans refuse them: "should not have output of char/varchar type"); their length is
    not checked (Spark's ``spark.sql.legacy.charVarcharAsString``)."""
    if isinstance(t, (CharType, VarcharType)):
        return StringType()
    if isinstance(t, StructType):
        return StructType([StructField(f.name, _chars_as_strings(f.dataType), f.nullable,
                                       f.metadata) for f in t.fields])
    if isinstance(t, ArrayType):
        return ArrayType(_chars_as_strings(t.elementType), t.containsNull)
    if isinstance(t, MapType):
        return MapType(_chars_as_strings(t.keyType), _chars_as_strings(t.valueType),
                       t.valueContainsNull)
    return t


def _check_columns(schema: StructType, what: str) -> StructType:
    names = schema.fieldNames()
    for n in names:
        if n.startswith("_"):
            raise CircuitError(f"{what}: column '{n}' is reserved: names starting with '_' "
                               "belong to the engine")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CircuitError(f"{what}: duplicate column name(s) {dup}")
    if not names:
        raise CircuitError(f"{what}: no columns")
    return schema


_INTEGRAL_DIGITS: dict[type[DataType], int] = {ByteType: 3, ShortType: 5, IntegerType: 10,
                                              LongType: 19}


def _widens_exactly(given: DataType, to: DataType) -> bool:
    """Whether every value of type ``given`` converts to type ``to`` exactly (a union's
    widening, on both engine paths): the same type, a wider integer, an integer or a float
    into a double only where exact (INT, FLOAT), an integer or a decimal into a decimal with at
    least its digits before and after the point."""
    if given == to:
        return True
    if type(given) in _INTEGRAL_DIGITS:
        if type(to) in _INTEGRAL_DIGITS:
            return _INTEGRAL_DIGITS[type(to)] >= _INTEGRAL_DIGITS[type(given)]
        if isinstance(to, DoubleType):
            return type(given) is not LongType  # a BIGINT past 2**53 is rounded
        if isinstance(to, DecimalType):
            return to.precision - to.scale >= _INTEGRAL_DIGITS[type(given)]
        return False
    if isinstance(given, FloatType):
        return isinstance(to, DoubleType)
    if isinstance(given, DecimalType) and isinstance(to, DecimalType):
        return (to.scale >= given.scale
                and to.precision - to.scale >= given.precision - given.scale)
    return False


def _nullable_where_any(schema: StructType, inputs: Sequence[StructType],
                        padded: Sequence[str] = ()) -> StructType:
    """``schema`` with a column nullable where it is in any of ``inputs`` (by name), or is one
    of ``padded`` (filled with NULLs): a union of a NOT NULL column with a nullable one, or an
    outer join's NULLs in a column NOT NULL on its side, may hold NULLs."""
    def nullable(name: str) -> bool:
        return name in padded or any(name in i.fieldNames() and i[name].nullable
                                     for i in inputs)
    return StructType([StructField(f.name, f.dataType, f.nullable or nullable(f.name),
                                   f.metadata) for f in schema.fields])


def _by_name(schema: StructType) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in schema.fields}


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
