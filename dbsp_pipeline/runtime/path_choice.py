"""Where a step runs: on the driver (Arrow + DuckDB) or as Spark jobs, chosen per step from the
work the step implies and the memory the driver has, not from a fixed row count.

The driver path is the fast one whenever it fits: it has no per-job cost (Spark's is about
0.1 s a job), and it reads state by key through keyed runs, where the Spark path scans the
traces a change touches. What can stop a step from running on the driver is its memory: the
driver holds every operator's change of the step in memory at once (``Plan.evaluate`` keeps
them until the outputs are written), plus the state rows its lookups read. So the choice
(``choose``), in this order:

1. A circuit with an operator that has no driver implementation (``Plan.spark_only``) runs on
   Spark.
2. ``driver_step_rows=0``: every step runs on Spark.
3. ``driver_step_rows=N`` (the user's explicit threshold): a step whose inputs changed by at
   most N rows runs on the driver, a bigger one on Spark.
4. ``driver_step_rows=None`` (auto, the default): the step runs on the driver when the memory
   it is estimated to take there (``estimate``) is within the driver's budget (``budget``):
   the lesser of ``driver_memory`` (the user's cap, if set) and ``MEMORY_FRACTION`` of the
   memory available to the process when the step starts (``available_memory``).

The estimate (``estimate``) walks the circuit once, from the rows of the input change (the
statistics of the log files the step reads; nothing is read) and the row counts of the traces
(their files' statistics): each operator's change is estimated in rows, a join's change as each
side's change times the other side's rows per key (the ratio of the two traces, at least
``JOIN_EXPANSION`` when the other side is not empty), an aggregate's as two rows per changed
group; the state a stateful operator reads on the driver is the rows of the keys its change
looks up (at most the trace). Rows become bytes by the schema's Arrow widths (strings at
``STRING_BYTES``), and bytes become memory by ``DRIVER_OVERHEAD`` (the copies the driver makes:
the read and the consolidated change, the trace appends with their shard column, DuckDB's
working memory). It is an estimate, meant to be right within a small factor; the budget leaves
the other half of the memory as the margin.

A step chosen for Spark then runs its stateful operators that can (``Plan.owner_capable``) as
one task per owner (``runtime/owner_exec.py``; ``choose_spark_execution``) when the pipeline's
``spark_per_owner`` is on (the default) and a task's share of the step fits a task's budget: the
step's estimated driver memory over the W owners (a task holds its owner's change and the state
rows it looks up, as the driver would hold the whole step's; not divided when an operator has
no key, a global aggregate or a top-k over one partition, whose one task takes all of its),
within ``task_budget``. Otherwise
they run as DataFrame jobs, which spill and never hold a change in one process; so a step of W=1
too big for the driver is too big for its one task, and runs as DataFrame jobs.

The choice is recorded in ``StepResult.path_reason`` (a sentence with the figures), so a user
can see why a step ran where it did. Choosing reads only statistics already in memory and
``/proc/meminfo``; it never starts Spark.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    FloatType,
    IntegerType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from dbsp_pipeline.operators.aggregate import Aggregate
from dbsp_pipeline.operators.distinct import Distinct
from dbsp_pipeline.operators.integration import Delay, Integrate
from dbsp_pipeline.operators.join import Join
from dbsp_pipeline.operators.top_k import TopK
from dbsp_pipeline.runtime.owner_exec import memory_bytes
from dbsp_pipeline.runtime.plan import Plan
from dbsp_pipeline.spark_session import conf_value, task_slots
from dbsp_pipeline.storage.table_store import DataFile
from dbsp_pipeline.storage.trace import DRIVER_MERGE_ROWS, Trace

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The share of the memory available to the process that one step on the driver may take.
MEMORY_FRACTION = 0.5
#: The budget when the available memory cannot be read (no ``/proc/meminfo``): 1 GiB.
FALLBACK_BUDGET = 1 << 30
#: How long a reading of the available memory serves the budget (``budget``): reading it takes
#: five files, about 2 ms, which was 4% of a 100-row step that read it every time.
MEMORY_READING_SECONDS = 1.0
#: Assumed bytes of a string or binary value (its data plus its 4-byte offset).
STRING_BYTES = 36
#: Bytes of a nested value (array, map, struct field of unknown size).
NESTED_BYTES = 64
#: Bytes of the engine's columns on every change and trace row: ``_weight`` and ``_shard``.
ENGINE_COLUMN_BYTES = 12
#: Driver memory per byte of the step's estimated changes and state read (the copies the driver
#: makes of them). On the shop circuit's initial load of 1M orders the estimate is 300 MB, and
#: the step raised the process's peak memory by 350 MB (``benchmarks/initial_load_bench.py``):
#: 2 leaves a margin for circuits whose estimate is closer than the shop's aggregate.
DRIVER_OVERHEAD = 2.0
#: The least a join's change row is assumed to match when the other side is not empty.
JOIN_EXPANSION = 1.0
#: Driver memory per byte of a background merge's rows: the files read, DuckDB's grouping and
#: sort, the sorted copy and its pieces per owner.
MERGE_OVERHEAD = 5.0


class PathChoice(NamedTuple):
    """Where a step runs and why: ``on_driver``, a sentence with the figures it was chosen by
    (``StepResult.on_driver`` and ``StepResult.path_reason``), and for a Spark step whether its
    stateful operators run as one task per owner (``per_owner``, ``runtime/owner_exec.py``)."""

    on_driver: bool
    reason: str
    per_owner: bool = False


@dataclass(frozen=True)
class WorkEstimate:
    """The work a step implies, estimated before it runs (see the module docstring)."""

    #: rows of the input change (the log files' statistics)
    input_rows: int
    #: rows of every operator's change, summed (what the driver holds until the step ends)
    change_rows: int
    #: bytes of those changes (Arrow widths)
    change_bytes: int
    #: state rows the driver's lookups read (the keys the change looks up)
    lookup_rows: int
    #: bytes of those state rows
    lookup_bytes: int
    #: state rows the Spark path reads (the traces the change touches, whole)
    scan_rows: int

    @property
    def driver_bytes(self) -> int:
        """The memory the step is estimated to take on the driver."""
        return int((self.change_bytes + self.lookup_bytes) * DRIVER_OVERHEAD)


@dataclass(frozen=True)
class Budget:
    """The memory one step may take on the driver, and where the figure comes from."""

    bytes: int
    source: str


# -- the decision --------------------------------------------------------------------------
def choose(work: WorkEstimate, *, driver_step_rows: int | None, spark_only: str | None,
           budget: Budget) -> PathChoice:
    """Where a step implying ``work`` runs (the rules of the module docstring): ``spark_only``
    names the operator with no driver implementation (None: every one has one),
    ``driver_step_rows`` is the user's setting (None: auto)."""
    if spark_only is not None:
        return PathChoice(False, f"Spark: {spark_only} has no driver implementation")
    if driver_step_rows == 0:
        return PathChoice(False, "Spark: driver_step_rows=0 runs every step on Spark")
    rows = f"{work.input_rows:,} input rows"
    if driver_step_rows is not None:
        if work.input_rows <= driver_step_rows:
            return PathChoice(True, f"driver: {rows}, at most driver_step_rows="
                                    f"{driver_step_rows:,}")
        return PathChoice(False, f"Spark: {rows}, more than driver_step_rows="
                                 f"{driver_step_rows:,}")
    figures = (f"{rows}, about {_size(work.driver_bytes)} on the driver "
               f"({work.change_rows:,} change rows, {work.lookup_rows:,} state rows looked up; "
               f"Spark would scan {work.scan_rows:,})")
    if work.driver_bytes <= budget.bytes:
        return PathChoice(True, f"driver: {figures}, within the budget of "
                                f"{_size(budget.bytes)} ({budget.source})")
    return PathChoice(False, f"Spark: {figures}, over the budget of {_size(budget.bytes)} "
                             f"({budget.source})")


def choose_for_step(plan: Plan, files: Mapping[str, Sequence[DataFile]],
                    driver_step_rows: int | None, driver_memory: int | None) -> PathChoice:
    """Where the step reading ``files`` (per input, the log files of its change) runs, with the
    pipeline's settings ``driver_step_rows`` (None: auto) and ``driver_memory`` (the cap of the
    driver's budget in bytes; None: no cap). Estimates and reads the available memory only
    when the settings leave the choice to them."""
    input_rows = sum(f.rows for fs in files.values() for f in fs)
    if plan.spark_only is not None or driver_step_rows is not None:
        work = WorkEstimate(input_rows, 0, 0, 0, 0, 0)
        return choose(work, driver_step_rows=driver_step_rows, spark_only=plan.spark_only,
                      budget=Budget(0, "not used"))
    return choose(estimate(plan, files), driver_step_rows=None, spark_only=None,
                  budget=budget(driver_memory))


def choose_spark_execution(choice: PathChoice, plan: Plan,
                           files: Mapping[str, Sequence[DataFile]], *, per_owner: bool,
                           workers: int, task_budget: Callable[[], Budget]) -> PathChoice:
    """``choice`` (a step's path), with ``per_owner`` set when it is a Spark step whose stateful
    operators run as one task per owner: the pipeline's ``per_owner`` setting is on, ``plan``
    has an operator that can, and the step's estimated driver memory (``estimate``) over the
    ``workers`` owners is within ``task_budget()`` (called only then); not divided among them
    when an operator that runs per owner has no key (a global aggregate, a top-k over one
    partition): one task takes all its change and state. The reason gains a clause saying
    which, with the figures."""
    if choice.on_driver or not per_owner or not plan.owner_capable:
        return choice
    keyless = any(not any(plan.operators[n].owner_keys() or []) for n in plan.owner_capable)
    per_task = estimate(plan, files).driver_bytes / (1 if keyless else max(1, workers))
    limit = task_budget()
    operators = f"{len(plan.owner_capable)} stateful operator(s)"
    if per_task <= limit.bytes:
        return PathChoice(False, f"{choice.reason}; per owner (W={workers}): {operators} as one "
                                 f"task per owner, about {_size(per_task)} a task, within the "
                                 f"task budget of {_size(limit.bytes)} ({limit.source})", True)
    return PathChoice(False, f"{choice.reason}; {operators} as DataFrame jobs: about "
                             f"{_size(per_task)} a task (W={workers}) is over the task budget "
                             f"of {_size(limit.bytes)} ({limit.source})")


# -- the estimate --------------------------------------------------------------------------
def estimate(plan: Plan, files: Mapping[str, Sequence[DataFile]]) -> WorkEstimate:
    """The work of the step reading ``files`` (per input, the log files of its change) through
    ``plan`` (the rules of the module docstring). Reads only statistics: the log files' row
    counts and the traces' file lists."""
    rows: dict[int, int] = {}
    change_rows = change_bytes = lookup_rows = lookup_bytes = scan_rows = 0
    for node in plan.circuit.nodes:
        width = row_bytes(plan.schemas[node.id])
        if node.op == "input":
            out = sum(f.rows for f in files.get(node.params["name"], ()))
        else:
            ins = [rows[i] for i in node.inputs]
            out, looked_up, touched = _operator_work(plan.operators[node.id], ins)
            for trace, n in looked_up:
                lookup_rows += n
                lookup_bytes += n * row_bytes_of_trace(trace)
            scan_rows += touched
        rows[node.id] = out
        change_rows += out
        change_bytes += out * width
    input_rows = sum(f.rows for fs in files.values() for f in fs)
    return WorkEstimate(input_rows, change_rows, change_bytes, lookup_rows, lookup_bytes,
                        scan_rows)


def _operator_work(operator: object, ins: list[int]) -> tuple[int, list[tuple[Trace, int]], int]:
    """One operator's estimated change rows, the state rows its lookups read on the driver
    (per trace), and the trace rows the Spark path reads, given its inputs' change rows."""
    if isinstance(operator, Join):
        dl, dr = ins
        left, right = operator.left.rows(), operator.right.rows()
        out_l = int(dl * _fanout(right + dr, left + dl))  # dA ⋈ (B + dB)
        out_r = int(dr * _fanout(left, right + dr))  # A ⋈ dB
        looked_up = [(operator.right, min(right + dr, out_l)), (operator.left, min(left, out_r))]
        scanned = (right + dr if dl else 0) + (left if dr else 0)
        return out_l + out_r, looked_up, scanned
    d = sum(ins)
    if d == 0:
        return 0, [], 0
    if isinstance(operator, Aggregate):
        groups = operator.groups.rows()
        looked_up = [(operator.groups, min(groups, d))]
        for values in operator.values.values():  # a deleted extreme re-reads its group
            n = values.rows()
            looked_up.append((values, min(n, int(d * _fanout(n, groups)))))
        return 2 * d, looked_up, sum(t.rows() for t in operator.traces())
    if isinstance(operator, TopK):  # reads the touched partitions: at most the whole trace
        n = operator.trace.rows()
        return 2 * d, [(operator.trace, n)], n
    if isinstance(operator, Distinct):
        n = operator.trace.rows()
        return d, [(operator.trace, min(n, d))], n
    if isinstance(operator, Integrate):  # emits its whole value
        n = operator.trace.rows() + d
        return n, [(operator.trace, n)], n
    if isinstance(operator, Delay):  # emits the previous step's change (and the new one)
        n = operator.previous.rows()
        return d + n, [(operator.previous, n)], n
    return d, [], 0  # linear: select, filter, negate, union, repeat, conform


def _fanout(other: int, own: int) -> float:
    """A change row's matches on the other side: none if it is empty, else the ratio of the
    sides' rows (rows per key, assuming both sides have about as many keys), at least
    ``JOIN_EXPANSION``."""
    if other == 0:
        return 0.0
    return max(JOIN_EXPANSION, other / max(own, 1))


def row_bytes(schema: StructType) -> int:
    """The Arrow bytes of one change row of ``schema`` (with ``_weight`` and ``_shard``)."""
    return sum(_value_bytes(f.dataType) for f in schema.fields) + ENGINE_COLUMN_BYTES


def row_bytes_of_trace(trace: Trace) -> int:
    """The Arrow bytes of one row of ``trace`` (payload, ``_weight``, ``_shard``)."""
    return arrow_row_bytes(trace.table.arrow_schema)


def arrow_row_bytes(schema: pa.Schema) -> int:
    """The Arrow bytes of one row of Arrow ``schema``."""
    return sum(_arrow_value_bytes(str(t)) for t in schema.types)


def _value_bytes(t: DataType) -> int:
    if isinstance(t, (BooleanType, ByteType)):
        return 1
    if isinstance(t, ShortType):
        return 2
    if isinstance(t, (IntegerType, FloatType, DateType)):
        return 4
    if isinstance(t, DecimalType):
        return 16
    if isinstance(t, (StringType, BinaryType)):
        return STRING_BYTES
    if isinstance(t, StructType):
        return sum(_value_bytes(f.dataType) for f in t.fields)
    if isinstance(t, (ArrayType, MapType)):
        return NESTED_BYTES
    return 8  # long, double, timestamp


def _arrow_value_bytes(name: str) -> int:
    fixed = {"bool": 1, "int8": 1, "int16": 2, "int32": 4, "float": 4, "date32[day]": 4}
    if name in fixed:
        return fixed[name]
    if name.startswith("decimal"):
        return 16
    if name in ("string", "large_string", "binary", "large_binary"):
        return STRING_BYTES
    if name.startswith(("list", "large_list", "map", "struct")):
        return NESTED_BYTES
    return 8


def merge_rows_on_driver(trace: Trace, driver_memory: int | None) -> int:
    """The most rows a background merge of ``trace`` may have to run on the driver
    (``runtime/compactor.py``): those whose estimated memory (``MERGE_OVERHEAD`` times their
    Arrow bytes) fits half the driver's step budget (a step may run beside the merge), and
    never fewer than ``DRIVER_MERGE_ROWS``."""
    return rows_on_driver(trace.table.arrow_schema, driver_memory)


def rows_on_driver(schema: pa.Schema, driver_memory: int | None) -> int:
    """The most rows of Arrow ``schema`` a background rewrite (a trace merge, an input log's
    consolidation) may run on the driver: those whose estimated memory (``MERGE_OVERHEAD``
    times their Arrow bytes) fits half the driver's step budget, and never fewer than
    ``DRIVER_MERGE_ROWS``."""
    per_row = max(arrow_row_bytes(schema), 1) * MERGE_OVERHEAD
    return max(DRIVER_MERGE_ROWS, int(budget(driver_memory).bytes / 2 / per_row))


# -- the budget ----------------------------------------------------------------------------
def budget(driver_memory: int | None) -> Budget:
    """The memory one step may take on the driver: ``MEMORY_FRACTION`` of the memory available
    now (``available_memory``; ``FALLBACK_BUDGET`` when it cannot be read), capped at
    ``driver_memory`` bytes when that is set. The available memory is read at most once in
    ``MEMORY_READING_SECONDS``."""
    available = _recent_available_memory()
    if available is None:
        machine = Budget(FALLBACK_BUDGET, "available memory unknown")
    else:
        machine = Budget(int(available * MEMORY_FRACTION),
                         f"{MEMORY_FRACTION:g} of {_size(available)} available")
    if driver_memory is not None and driver_memory < machine.bytes:
        return Budget(driver_memory, f"driver_memory={driver_memory:,}")
    return machine


def task_budget(spark: SparkSession, workers: int, driver_memory: int | None) -> Budget:
    """The memory one owner task may take (its Python worker holds its owner's change and the
    state rows it looks up; its DuckDB spills). In local mode the tasks run in this machine's
    Python workers, at most ``min(workers, cores)`` at once: the driver's budget (``budget``)
    shared among them. On a cluster: ``spark.executor.pyspark.memory`` when set, else
    ``MEMORY_FRACTION`` of ``spark.executor.memory``, over the executor's cores."""
    if conf_value(spark, "spark.master", "").startswith("local"):
        machine = budget(driver_memory)
        at_once = max(1, min(workers, task_slots(spark)))
        return Budget(machine.bytes // at_once, f"{machine.source}, over {at_once} task(s) "
                                                f"at once")
    cores = int(conf_value(spark, "spark.executor.cores", "1"))
    python = conf_value(spark, "spark.executor.pyspark.memory", "")
    if python and (n := memory_bytes(python)) is not None:
        return Budget(n // max(1, cores), f"spark.executor.pyspark.memory={python} over "
                                          f"{cores} core(s)")
    executor = conf_value(spark, "spark.executor.memory", "1g")
    n = memory_bytes(executor) or FALLBACK_BUDGET
    return Budget(int(n * MEMORY_FRACTION) // max(1, cores),
                  f"{MEMORY_FRACTION:g} of spark.executor.memory={executor} over {cores} "
                  f"core(s)")


def available_memory() -> int | None:
    """Bytes of memory this process can still use: ``MemAvailable`` of ``/proc/meminfo``, or
    less when a cgroup (a container's limit) leaves less. None when neither can be read."""
    known = []
    meminfo = _read("/proc/meminfo")
    if meminfo is not None:
        for line in meminfo.splitlines():
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read(limit_file), _read(usage_file)
        if limit is not None and usage is not None and limit.strip().isdigit() \
                and usage.strip().isdigit() and int(limit) < 1 << 60:
            known.append(max(0, int(limit) - int(usage)))
    return min(known) if known else None


#: the last reading of ``available_memory``: (monotonic seconds when read, the reading)
_reading: tuple[float, int | None] | None = None


def _recent_available_memory() -> int | None:
    """``available_memory()``, read again once the last reading is
    ``MEMORY_READING_SECONDS`` old."""
    global _reading
    now = time.monotonic()
    last = _reading
    if last is None or now - last[0] >= MEMORY_READING_SECONDS:
        last = _reading = (now, available_memory())
    return last[1]


def _read(path: str) -> str | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
