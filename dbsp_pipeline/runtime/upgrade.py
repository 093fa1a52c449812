"""Upgrades: a newer engine opening state written by an older one.

Every checkpoint records the engine version, the state format and the circuit fingerprint
(``storage/state_db.py``). Opening a pipeline:

* refuses a different circuit (``CircuitChangedError``: changing the computation is not an
  upgrade) and state written in a newer format than this engine reads (``StateFormatError``);
* migrates older state formats, one format at a time through ``MIGRATIONS``, before anything
  reads the state, and commits the result at once as a checkpoint in the current format. A
  crash before that commit leaves the old checkpoint, and the next open migrates again (every
  migration is a function of the old checkpoint alone).

No input is processed again: migrations change how state is recorded, not what it holds.

Tables an older engine created lack Delta properties the engine now creates its tables with
(``storage/delta_store.py``'s ``DEFAULT_CONFIGURATION``: no tombstones in Delta checkpoints,
without which a checkpoint grows with every step ever run; a Delta checkpoint every 10 commits,
not 50, which makes each commit cheaper). They are set once: on the manifest
before the open's fence (``StateDatabase.set_manifest_properties``), then, once the open fenced
the root, by ``set_table_properties`` on the state tables the circuit opened (a manifest commit
records their new versions), the division log, the input and output logs and the errors table.
Each setting is a metadata-only Delta commit that readers skip (a log's readers like a fence;
the manifest's take it for the entry below it); a crash between them leaves some tables done,
and the next open does the rest. Restoring a checkpoint from before the upgrade restores the
state tables' old properties with their old versions: the next open sets them again.

Output logs an older engine typed NOT NULL where the view's column may hold NULLs (a union or
an outer join's padding) are made nullable at open (``relax_view_columns``), so that readers
of the tables do not take the column for one without NULLs.

Formats: 1, the first; 2, every checkpoint records its layout (``runtime/layout.py``); 3, sums
of floating-point values are kept exactly (``dbsp_pipeline/exact_sum.py``) in an aggregate's
``<name>_groups_exact`` trace instead of a DOUBLE column of ``<name>_groups``; 4, a checkpoint
records per state table the actions staged since its Delta version (``storage/staged_table.py``);
5, a step's record may be carried by the checkpoint (``runtime/step_protocol.py``); 6, an
aggregate keeps the sum of a decimal average in Spark's ``AVG`` sum type, ``DECIMAL(min(38,
p + 10), s)`` for a ``DECIMAL(p, s)`` column, in ``<name>_groups_wide`` (or
``<name>_groups_exact_wide``), not in the average's own type ``DECIMAL(p + 4, s + 4)``,
whose up to 10 integer digits fewer made a step fail where Spark's ``AVG`` does not
(``widen_decimal_average_sums``: at open, and when a checkpoint from before is restored).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql.pandas.types import from_arrow_schema

from dbsp_pipeline import exact_sum
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.errors import StateFormatError
from dbsp_pipeline.runtime.layout import LAYOUT_KEY, Layout
from dbsp_pipeline.storage.delta_store import DEFAULT_CONFIGURATION
from dbsp_pipeline.storage.delta_table import SparkDeltaTable, delta_log
from dbsp_pipeline.storage.state_db import ENGINE_VERSION, STATE_FORMAT, StateDatabase
from dbsp_pipeline.zset import SHARD

if TYPE_CHECKING:
    from dbsp_pipeline.driver.sql import LocalSQL
    from dbsp_pipeline.runtime.engine_state import EngineState
    from dbsp_pipeline.runtime.plan import Plan


def _record_layout(db: StateDatabase) -> None:
    """1 -> 2: state from before layouts were recorded had one worker owning every shard."""
    if db.get(LAYOUT_KEY) is None:
        db.put(LAYOUT_KEY, Layout().to_json())


_FLOAT_SUM = re.compile(r"_s\d+")


def _exact_float_sums(db: StateDatabase) -> None:
    """2 -> 3: every aggregate trace ``X_groups`` with DOUBLE sums (``_s<i>``) is copied to
    ``X_groups_exact`` with each sum as the exact sum of the one value recorded (its rounding
    by the old engine stays; everything added or removed from now on is exact). The old trace
    stays as it was; a crash before the commit leaves the copy uncommitted, so it is rolled back
    and made again."""
    for name, version in db.recorded_traces().items():
        if not name.endswith("_groups") or f"{name}_exact" in db.recorded_traces():
            continue
        old, schema = _recorded_table(db, name, version)
        sums = [f.name for f in schema if _FLOAT_SUM.fullmatch(f.name)
                and pa.types.is_floating(f.type)]
        if not sums:
            continue
        new_schema = pa.schema([pa.field(f.name, pa.string()) if f.name in sums else f
                                for f in schema])
        table = db.table(f"{name}_exact", from_arrow_schema(new_schema))
        rows = old.to_pyarrow_table() if old.file_uris() else schema.empty_table()
        for column in sums:
            encoded = [exact_sum.encode(exact_sum.of_pairs([v], [1]))
                       for v in rows.column(column).to_pylist()]
            rows = rows.set_column(rows.schema.get_field_index(column), column,
                                   pa.array(encoded, pa.string()))
        table.stage(table.write_arrow(rows.select(new_schema.names)))


def _recorded_table(db: StateDatabase, name: str, version: int) -> tuple[DeltaTable, pa.Schema]:
    """The Delta table of trace ``name`` at the recorded ``version``, and its Arrow schema;
    ``StateFormatError`` when the table is not there."""
    uri = root_layout.state_table(db.root, name)
    table = delta_log(uri, version)
    if table is None:
        raise StateFormatError(f"the pipeline at {db.root} records trace {name} at version "
                               f"{version}, but there is no table at {uri}")
    schema = table.schema().to_arrow()
    return table, pa.schema(schema) if not isinstance(schema, pa.Schema) else schema


def _staged_state_changes(db: StateDatabase) -> None:
    """3 -> 4: entries may record staged actions per state table (``storage/staged_table.py``);
    a format 3 entry stages none, which is what reading it without the key gives: nothing to
    change but the recorded format (an engine that reads only format 3 refuses the new
    entries instead of ignoring their staged files)."""


def _step_records(db: StateDatabase) -> None:
    """4 -> 5: a step's record (its division and output) may be carried by the checkpoint's
    entry instead of the division log, and the output logs may hold steps not folded into their
    Delta tables yet (``runtime/step_protocol.py``). A format 4 root holds every step in its
    logs, which is what reading it without carried records gives: nothing to change but the
    recorded format (an engine that reads only format 4 refuses the new entries instead of
    ignoring the steps they carry)."""


def _wide_decimal_average_sums(db: StateDatabase) -> None:
    """5 -> 6: the sums of decimal averages move to a wider type in a trace of another name.
    Which of an aggregate's sums are averages only its circuit says, so the copy is made once
    the plan is compiled (``widen_decimal_average_sums``); here nothing changes but the
    recorded format (an engine that reads only format 5 refuses the new entries instead of
    starting an empty ``<name>_groups``)."""


#: MIGRATIONS[n] brings the opened state from format n to n + 1
MIGRATIONS: dict[int, Callable[[StateDatabase], None]] = {1: _record_layout,
                                                          2: _exact_float_sums,
                                                          3: _staged_state_changes,
                                                          4: _step_records,
                                                          5: _wide_decimal_average_sums}


def widen_decimal_average_sums(db: StateDatabase, plan: Plan, sql: LocalSQL) -> list[str]:
    """Format 6's copy, for every aggregate of ``plan`` with a decimal average whose groups
    trace (``Aggregate.groups``, ``<name>_groups[_exact]_wide``) the open version does not
    record while it records the trace an older engine kept (``narrow_groups_name``): that
    trace's rows, each decimal average's ``_s<i>`` cast to its new type (exact: a sum of
    values of scale ``s`` has no digit beyond ``s``), are appended to the new trace, and the
    old one is retired (``StateDatabase.retire_tables``: garbage collection deletes it once no
    retained checkpoint records it). Returns the traces copied, by name; the caller commits
    them as a checkpoint. A crash before that commit leaves the old trace recorded and the
    new one not: the next open copies again. Reads each old trace whole on the driver, once."""
    from dbsp_pipeline.operators.aggregate import Aggregate

    recorded = db.recorded_traces()
    copied = []
    for op in plan.operators.values():
        if not isinstance(op, Aggregate):
            continue
        old, new = op.narrow_groups_name, op.groups.name
        if new == old or new in recorded or old not in recorded:
            continue
        _, schema = _recorded_table(db, old, recorded[old])
        rows = db.read_recorded(old, from_arrow_schema(schema))
        for column, t in op.decimal_average_sums().items():
            try:
                wide = rows.column(column).cast(pa.decimal128(t.precision, t.scale))
            except pa.ArrowInvalid as e:
                raise StateFormatError(f"trace {old} of the pipeline at {db.root}: a sum in "
                                       f"{column} does not fit {t.simpleString()} ({e})") from e
            rows = rows.set_column(rows.schema.get_field_index(column), column, wide)
        op.groups.append_arrow(sql, rows.drop_columns([SHARD]))
        db.retire_tables([old])
        copied.append(new)
    return copied


@dataclass
class UpgradeInfo:
    """What opening did about versions: the engine and format the state was written with, the
    ones it is in now, and the migrations applied (``[(from, to), ...]``)."""

    from_engine: str | None
    to_engine: str
    from_format: int
    to_format: int
    migrations: list[tuple[int, int]] = field(default_factory=list)
    #: the tables given the engine's Delta properties by this open (``set_table_properties``)
    table_properties: list[str] = field(default_factory=list)
    #: the traces format 6's copy made at this open (``widen_decimal_average_sums``)
    widened: list[str] = field(default_factory=list)
    #: the output logs whose Delta schema this open made nullable where the view's columns are
    #: (``relax_view_columns``)
    relaxed: list[str] = field(default_factory=list)

    @property
    def upgraded(self) -> bool:
        return (bool(self.migrations) or bool(self.table_properties) or bool(self.widened)
                or bool(self.relaxed) or self.from_engine not in (None, self.to_engine))


def migrate(db: StateDatabase) -> UpgradeInfo:
    """Bring the opened state to ``STATE_FORMAT``; the caller commits if migrations ran."""
    fmt = db.recorded_format
    info = UpgradeInfo(db.recorded_engine, ENGINE_VERSION, fmt, STATE_FORMAT)
    if fmt > STATE_FORMAT:
        raise StateFormatError(
            f"the pipeline at {db.root} was written by engine {db.recorded_engine} in state "
            f"format {fmt}; this engine ({ENGINE_VERSION}) reads formats up to {STATE_FORMAT}: "
            "run a newer engine (downgrades are not supported)")
    while fmt < STATE_FORMAT:
        if fmt not in MIGRATIONS:
            raise StateFormatError(f"no migration from state format {fmt} (at {db.root})")
        MIGRATIONS[fmt](db)
        info.migrations.append((fmt, fmt + 1))
        fmt += 1
    return info


def engine_table_properties() -> dict[str, str]:
    """The Delta table properties every engine table has (``DEFAULT_CONFIGURATION``, as it is
    now: an older engine set no tombstone retention and checkpointed every 50 commits)."""
    return dict(DEFAULT_CONFIGURATION)


def set_table_properties(state: EngineState) -> list[str]:
    """Give every table of the opened root but the manifest that lacks them
    ``engine_table_properties()`` (see the module docstring); returns the tables changed, by path
    under the root. Called by the owner after the open's fences; commits the state tables' new
    versions as a checkpoint of the same step (nothing else changes)."""
    changed = [_under(state.root, root_layout.state_table(state.root, name))
               for name in state.db.set_table_properties(engine_table_properties())]
    if changed:
        state.db.commit()
    tables: list[SparkDeltaTable] = [state.divisions.table]
    tables += [log.table for log in state.inputs.values()]
    tables += [log.table for log in state.outputs.values()]
    if delta_log(root_layout.errors(state.root)) is not None:
        tables.append(ErrorsSink(state.spark, state.root).table)
    changed += [_under(state.root, t.uri) for t in tables
                if t.set_properties(engine_table_properties())]
    return changed


def relax_view_columns(state: EngineState) -> list[str]:
    """Make each output log's Delta schema nullable where its view's columns are but the log
    records NOT NULL; returns the logs changed, by path under the root.

    An older engine typed a column NOT NULL where a union or an outer join's padding made it
    nullable (a ``LEFT JOIN``'s right-side key): its steps failed on the first NULL there, and
    a log written before that holds none, but readers of the table (Spark, DuckDB) would take
    the column for one that never holds NULL once later steps write some. A metadata-only
    commit per column; a crash leaves the rest to the next open. State tables keep their
    metadata: only the engine reads them, with the columns the circuit's analysis gives."""
    changed = []
    for log in state.outputs.values():
        stored = log.table.store.stored_schema()
        loose = [f.name for f in log.table.arrow_schema
                 if f.nullable and f.name in stored.names and not stored.field(f.name).nullable]
        if loose and log.table.drop_not_null(loose):
            changed.append(_under(state.root, log.table.uri))
    return changed


def _under(root: str, uri: str) -> str:
    """``uri``'s path under ``root`` (``inputs/orders``)."""
    return uri[len(root):].strip("/") if uri.startswith(root) else uri


def manifest_path(root: str) -> str:
    """The manifest's path under ``root``, as ``set_table_properties`` names tables."""
    return _under(root, root_layout.manifest(root))
