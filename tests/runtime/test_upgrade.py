"""Upgrades: state written by an older engine in an older format is migrated at open, committed
as a checkpoint in the current format, and runs on with nothing reprocessed; a newer format and
a changed circuit are refused with clear errors."""

from __future__ import annotations

from collections import Counter

import pytest

from dbsp_pipeline import CircuitChangedError, Pipeline, StateFormatError, UsageError
from dbsp_pipeline.circuit import node_collection
from dbsp_pipeline.runtime.layout import LAYOUT_KEY, Layout
from dbsp_pipeline.storage import state_db
from tests.runtime import workload

ROUNDS = workload.rounds(5)


def rewrite_newest_entry(root: str, spark, **changes) -> None:
    """Make the newest checkpoint look as another engine wrote it."""
    db = state_db.StateDatabase(spark, root, workload.circuit().fingerprint())
    db.open()
    entry = dict(db._base, **{k: v for k, v in changes.items() if k != "drop_meta"})
    entry["meta"] = {k: v for k, v in entry["meta"].items()
                     if k not in changes.get("drop_meta", ())}
    db._write_entry(entry)


def _reference_view(spark, tmp_path) -> dict:
    """The consumer view of every round played by an engine of this version."""
    reference = str(tmp_path / "reference")
    with workload.open_pipeline(reference, spark) as p:
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
    return workload.consumer_view(spark, reference)


def _first_rounds(spark, tmp_path) -> str:
    """A root that played the first 3 rounds (closed: committed); the root's path."""
    root = str(tmp_path / "old")
    with workload.open_pipeline(root, spark) as p:
        for r, pushes in enumerate(ROUNDS[:3]):
            workload.play_round(p, r, pushes)
    return root


def test_format_1_state_is_migrated_and_runs_on(spark, tmp_path):
    expected = _reference_view(spark, tmp_path)
    root = _first_rounds(spark, tmp_path)
    # as the previous engine wrote it: format 1, no layout record
    rewrite_newest_entry(root, spark, state_format=1, engine_version="0.0.9",
                         drop_meta=(LAYOUT_KEY,))
    with workload.open_pipeline(root, spark) as p:
        info = p.upgrade_info
        assert (info.from_engine, info.from_format) == ("0.0.9", 1)
        assert info.migrations == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6)] and info.upgraded
        assert p.recovered_steps == []  # nothing processed again
        assert p.layout == Layout()
        newest = p.checkpoints()[0]
        assert newest.state_format == state_db.STATE_FORMAT
        assert newest.engine_version == state_db.ENGINE_VERSION
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
    assert workload.consumer_view(spark, root) == expected
    with workload.open_pipeline(root, spark) as p:
        assert p.upgrade_info.migrations == [] and not p.upgrade_info.upgraded


def test_a_newer_state_format_is_refused(spark, tmp_path):
    root = str(tmp_path)
    with workload.open_pipeline(root, spark) as p:
        workload.play_round(p, 0, ROUNDS[0])
    rewrite_newest_entry(root, spark, state_format=state_db.STATE_FORMAT + 1,
                         engine_version="9.0.0")
    with pytest.raises(StateFormatError, match=r"written by engine 9\.0\.0 .*reads formats up to"):
        workload.open_pipeline(root, spark)


def test_a_changed_circuit_is_not_an_upgrade(spark, tmp_path):
    root = str(tmp_path)
    with workload.open_pipeline(root, spark) as p:
        workload.play_round(p, 0, ROUNDS[0])
    changed = workload.circuit()
    changed.output("extra", node_collection(changed, changed.inputs["orders"]).distinct())
    with pytest.raises(CircuitChangedError, match="different circuit"):
        Pipeline(changed, root, spark)


def _as_format_2(root: str, spark) -> None:
    """Make the newest checkpoint look as the format-2 engine wrote it: each exact-sum trace
    ``X_groups_exact`` becomes ``X_groups`` with the sums as DOUBLE columns."""
    import json
    import math
    import os

    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from dbsp_pipeline import exact_sum
    from dbsp_pipeline.storage.delta_table import SparkDeltaTable

    db = state_db.StateDatabase(spark, root, workload.circuit().fingerprint())
    db.open()
    for name in db._base["traces"]:  # format 2 staged nothing: fold it all into Delta first
        db.table(name, _spark_schema(root, name))
    db.commit(fold_all=True)
    traces = dict(db._base["traces"])
    for name in [n for n in traces if n.endswith("_groups_exact")]:
        exact = SparkDeltaTable(spark, os.path.join(root, "state", name),
                                db.table(name, _spark_schema(root, name)).schema)
        rows = exact.read_arrow(exact.files(traces[name]))
        fields = []
        for f in rows.schema:
            if f.name.startswith("_s") and pa.types.is_string(f.type):
                values = [exact_sum.decode(v).value() for v in rows.column(f.name).to_pylist()]
                rows = rows.set_column(rows.schema.get_field_index(f.name), f.name,
                                       pa.array(values, pa.float64()))
                fields.append(pa.field(f.name, pa.float64()))
            else:
                fields.append(f)
        old_name = name[: -len("_exact")]
        old = SparkDeltaTable(spark, os.path.join(root, "state", old_name),
                              from_arrow_schema(pa.schema(fields)))
        version = old.commit(old.write_arrow(rows))
        traces[old_name] = version
        del traces[name]
        assert not any(math.isnan(v) for v in rows.column("_s2").to_pylist() if v is not None)
    entry = dict(db._base, traces=traces, state_format=2, engine_version="0.1.0-format2")
    entry.pop(state_db.STAGED_KEY, None)
    db._write_entry(json.loads(json.dumps(entry)))


def _spark_schema(root: str, name: str):
    import os

    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema

    from dbsp_pipeline.storage.s3_store import s3_options

    uri = os.path.join(root, "state", name)
    options = s3_options(uri) if uri.startswith("s3://") else None
    return from_arrow_schema(pa.schema(DeltaTable(uri, storage_options=options)
                                       .schema().to_arrow()))


def test_format_2_double_sums_are_migrated_to_exact_sums(spark, tmp_path):
    """State of the engine that kept sums as DOUBLE: opened, migrated once to exact sums (the
    old sums as they were) and runs on to the same output as a run that never was format 2."""
    expected = _reference_view(spark, tmp_path)
    root = _first_rounds(spark, tmp_path)
    _as_format_2(root, spark)
    with workload.open_pipeline(root, spark) as p:
        assert p.upgrade_info.migrations == [(2, 3), (3, 4), (4, 5), (5, 6)]
        assert p.recovered_steps == []
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
    # the old sums carry the old engine's rounding, so the last bits may differ after it
    assert _rounded(workload.consumer_view(spark, root)["outputs"]) == _rounded(
        expected["outputs"])
    with workload.open_pipeline(root, spark) as p:
        assert p.upgrade_info.migrations == []


def _rounded(outputs: dict) -> dict:
    return {view: {step: Counter({tuple((k, round(v, 6) if isinstance(v, float) else v)
                                        for k, v in row): m for row, m in rows.items()})
                   for step, rows in steps.items()} for view, steps in outputs.items()}


def test_format_2_state_of_an_s3_root_is_migrated_like_a_local_one(spark, tmp_path,
                                                                    object_store, monkeypatch):
    """The migration reads the old traces through the root's store: an object-store root's
    format-2 state becomes the same views as a local root's."""
    from tests.object_store_helpers import new_bucket

    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    views = []
    for root in (str(tmp_path / "local"), f"s3://{new_bucket(object_store, 'upgrade')}/old"):
        with workload.open_pipeline(root, spark) as p:
            for r, pushes in enumerate(ROUNDS[:2]):
                workload.play_round(p, r, pushes)
        _as_format_2(root, spark)
        with workload.open_pipeline(root, spark) as p:
            assert p.upgrade_info.migrations == [(2, 3), (3, 4), (4, 5), (5, 6)]
            workload.play_round(p, 2, ROUNDS[2])
            views.append({v: sorted(map(str, p.view_arrow(v).to_pylist()))
                          for v in ("by_region", "regions")})
    assert views[0] == views[1] and views[0]["by_region"]


def test_format_3_state_is_opened_as_staging_nothing(spark, tmp_path):
    """A format 3 checkpoint records no staged actions (its traces' Delta versions hold all of
    the state): the new engine opens it, records format 4 and runs on to the same output."""
    expected = _reference_view(spark, tmp_path)
    root = _first_rounds(spark, tmp_path)
    db = state_db.StateDatabase(spark, root, workload.circuit().fingerprint())
    db.open()
    for name in db._base["traces"]:
        db.table(name, _spark_schema(root, name))
    db.commit(fold_all=True)  # as format 3 left it: everything in the Delta versions
    entry = dict(db._base, state_format=3, engine_version="0.1.0-format3")
    entry.pop(state_db.STAGED_KEY, None)
    db._write_entry(entry)
    with workload.open_pipeline(root, spark) as p:
        assert p.upgrade_info.migrations == [(3, 4), (4, 5), (5, 6)]
        assert p.checkpoints()[0].state_format == state_db.STATE_FORMAT
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
    assert workload.consumer_view(spark, root) == expected


RETENTION = "delta.deletedFileRetentionDuration"


def _delta_tables(root: str) -> dict[str, dict[str, str]]:
    """Every Delta table under ``root`` (by path under it) with its table properties."""
    import os

    from deltalake import DeltaTable

    found = {}
    for folder, dirs, _ in os.walk(root):
        if "_delta_log" in dirs:
            found[os.path.relpath(folder, root)] = dict(DeltaTable(folder).metadata()
                                                        .configuration)
    return found


def _old_engine_root(spark, tmp_path, monkeypatch, name: str = "old") -> str:
    """A root of 3 rounds whose tables were created as before the engine set tombstone
    retention (``delta_store.DEFAULT_CONFIGURATION`` without it)."""
    from dbsp_pipeline.runtime import upgrade
    from dbsp_pipeline.storage import delta_store

    with monkeypatch.context() as m:
        m.setattr(delta_store, "DEFAULT_CONFIGURATION", {"delta.checkpointInterval": "50"})
        m.setattr(upgrade, "engine_table_properties", dict)  # that engine set none
        root = str(tmp_path / name)
        with workload.open_pipeline(root, spark) as p:
            for r, pushes in enumerate(ROUNDS[:3]):
                workload.play_round(p, r, pushes)
    assert all(RETENTION not in props for props in _delta_tables(root).values())
    return root


def test_an_old_engines_tables_get_the_engine_properties_once(spark, tmp_path, monkeypatch):
    """Opening a root whose tables lack the engine's Delta properties sets them on every table
    (state tables recorded by a checkpoint of the same step), processes nothing again,
    verifies clean (the manifest's property commit is no entry, and no damage), keeps its
    checkpoints, runs on to the same views, and the next open sets nothing."""
    from dbsp_pipeline.storage.verify import verify_root

    expected = _reference_view(spark, tmp_path)
    root = _old_engine_root(spark, tmp_path, monkeypatch)
    with workload.open_pipeline(root, spark) as p:
        info = p.upgrade_info
        changed = set(info.table_properties)
        assert info.upgraded and p.recovered_steps == []
        for r, pushes in enumerate(ROUNDS[3:], start=3):
            workload.play_round(p, r, pushes)
    tables = _delta_tables(root)
    assert all(RETENTION in props for props in tables.values())
    assert changed == set(tables)
    assert verify_root(root).ok, verify_root(root)
    assert len({c.step for c in verify_root(root).checkpoints}) == 2  # of two steps
    assert workload.consumer_view(spark, root) == expected
    with workload.open_pipeline(root, spark) as p:
        assert p.upgrade_info.table_properties == []


def test_a_crash_anywhere_in_setting_the_properties_recovers(spark, tmp_path, monkeypatch):
    """Crash before and after every property commit and the checkpoint that records the state
    tables': the root verifies, the next open finishes the job, and the views run on equal."""
    import shutil

    from dbsp_pipeline.storage import crash_points
    from dbsp_pipeline.storage.crash_points import InjectedCrash
    from dbsp_pipeline.storage.verify import verify_root

    expected = _reference_view(spark, tmp_path)
    old = _old_engine_root(spark, tmp_path, monkeypatch)
    probe = str(tmp_path / "probe")
    shutil.copytree(old, probe)
    crash_points.reset()
    with workload.open_pipeline(probe, spark):
        passes = crash_points.passes()
    points = sorted(p for p in passes
                    if ".properties." in p or p.startswith("manifest.commit."))
    assert any(p.startswith("trace.properties") for p in points)
    for role in ("division", "input", "output", "manifest"):
        assert f"{role}.properties.before" in points, points
    assert "manifest.commit.before" in points
    for point in points:
        for n in sorted({1, passes[point]}):  # the first and the last pass of each
            root = str(tmp_path / f"crash-{point}-{n}")
            shutil.copytree(old, root)
            crash_points.reset()
            crash_points.arm(point, n)
            with pytest.raises(InjectedCrash):
                workload.open_pipeline(root, spark)
            crash_points.reset()
            assert verify_root(root).ok, (point, n, verify_root(root))
            with workload.open_pipeline(root, spark) as p:
                assert p.recovered_steps == []
            assert all(RETENTION in props for props in _delta_tables(root).values()), \
                (point, n)
            assert verify_root(root).ok, (point, n, verify_root(root))
    # one of them runs on to the reference views
    with workload.open_pipeline(root, spark) as p:
        for r, pushes in enumerate(ROUNDS[3:], start=3):
            workload.play_round(p, r, pushes)
    assert workload.consumer_view(spark, root) == expected


AVERAGES = "k BIGINT, m DECIMAL(15,2), f DOUBLE"


def _averages_circuit():
    from dbsp_pipeline import Circuit

    c = Circuit("averages")
    c.output("totals", c.input("t", AVERAGES).group_by("k").agg(
        a="avg(m)", s="sum(m)", af="avg(f)", n="count(*)"))
    return c


def _average_rows(r: int) -> list[tuple]:
    from decimal import Decimal

    return [(i % 3, Decimal(r * 7_919 + i * 104_729).scaleb(-2), (r * 31 + i) / 7)
            for i in range(6)]


def _play_averages(p: Pipeline, r: int) -> list:
    p.push("t", _average_rows(r))
    if r >= 2:
        p.push("t", _average_rows(r - 2)[:2], weight=-1)
    p.step()
    return sorted(map(str, p.view_arrow("totals").to_pylist()))


def _as_older_format(root: str, spark, fmt: int) -> tuple[str, str]:
    """Make the newest checkpoint look as the format-``fmt`` engine (5 or 2) wrote it: the
    groups trace ``X_groups_exact_wide`` becomes ``X_groups_exact`` (format 2: ``X_groups``,
    its exact sums as DOUBLE columns) with the decimal average's sum ``_s0`` in the average's
    own type, DECIMAL(19,6). Returns (the narrow trace the new engine copies, the new one)."""
    import json
    import os

    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from dbsp_pipeline import exact_sum
    from dbsp_pipeline.storage.delta_table import SparkDeltaTable

    db = state_db.StateDatabase(spark, root, _averages_circuit().fingerprint())
    db.open()
    for name in db._base["traces"]:
        db.table(name, _spark_schema(root, name))
    db.commit(fold_all=True)
    traces = dict(db._base["traces"])
    (wide,) = [n for n in traces if n.endswith("_groups_exact_wide")]
    table = SparkDeltaTable(spark, os.path.join(root, "state", wide), _spark_schema(root, wide))
    rows = table.read_arrow(table.files(traces[wide]))
    assert str(rows.schema.field("_s0").type) == "decimal128(25, 2)"
    rows = rows.set_column(rows.schema.get_field_index("_s0"), "_s0",
                           rows.column("_s0").cast(pa.decimal128(19, 6)))
    narrow = wide[: -len("_wide")]
    stored = narrow
    if fmt == 2:  # the exact sum of the DOUBLE average as the DOUBLE it was
        stored = narrow[: -len("_exact")]
        values = [exact_sum.decode(v).value() for v in rows.column("_s2").to_pylist()]
        rows = rows.set_column(rows.schema.get_field_index("_s2"), "_s2",
                               pa.array(values, pa.float64()))
    old = SparkDeltaTable(spark, os.path.join(root, "state", stored),
                          from_arrow_schema(rows.schema))
    traces[stored] = old.commit(old.write_arrow(rows))
    del traces[wide]
    entry = dict(db._base, traces=traces, state_format=fmt, engine_version=f"0.1.0-format{fmt}")
    entry.pop(state_db.STAGED_KEY, None)
    db._write_entry(json.loads(json.dumps(entry)))
    return narrow, wide


@pytest.mark.parametrize("fmt, crash", [(5, None), (5, "before"), (5, "after"), (5, "restore"),
                                        (2, None), (2, "restore")])
def test_older_decimal_average_sums_are_widened_once_and_run_on(spark, tmp_path, monkeypatch,
                                                                 fmt, crash):
    """State of an engine that kept a decimal average's sum in the average's type (format 5,
    and format 2, whose DOUBLE sums are migrated to exact ones first): opening copies its
    groups trace to ``..._wide`` with the sum in Spark's ``AVG`` sum type, commits the copy as
    a checkpoint (a crash just before that commit copies again at the next open; one after it
    does not; restoring the older engine's checkpoint migrates and copies again), retires the
    old trace,
    and runs on to the very views of a root that never was older (format 2: but for the
    DOUBLE average's last digits)."""
    from dbsp_pipeline.runtime import upgrade as engine_upgrade
    from dbsp_pipeline.testing import InjectedCrash, arm, reset

    with Pipeline(_averages_circuit(), str(tmp_path / "reference"), spark) as p:
        expected = [_play_averages(p, r) for r in range(6)]
    root = str(tmp_path / "old")
    with Pipeline(_averages_circuit(), root, spark) as p:
        assert [_play_averages(p, r) for r in range(3)] == expected[:3]
    narrow, wide = _as_older_format(root, spark, fmt)
    if crash in ("before", "after"):
        copy = engine_upgrade.widen_decimal_average_sums

        def copy_then_crash(*args):
            copied = copy(*args)
            arm(f"manifest.commit.{crash}", 1)  # the commit of the copy
            return copied
        monkeypatch.setattr(engine_upgrade, "widen_decimal_average_sums", copy_then_crash)
        with pytest.raises(InjectedCrash):
            Pipeline(_averages_circuit(), root, spark)
        reset()
        monkeypatch.undo()
    with Pipeline(_averages_circuit(), root, spark, retain_checkpoints=3) as p:
        info = p.upgrade_info
        assert info.migrations == ([] if crash in ("before", "after") else
                                   [(k, k + 1) for k in range(fmt, state_db.STATE_FORMAT)])
        assert info.widened == ([] if crash == "after" else [wide])
        if crash == "restore":  # the older engine's checkpoint, before the migration
            oldest = next(c for c in p.checkpoints() if c.state_format == fmt)
            assert oldest.state_format == fmt
            if fmt < 3:  # its migration rewrites traces: only an open does it
                with pytest.raises(UsageError, match=f"state format {fmt}.*checkpoint="):
                    p.restore(oldest.version)
            else:
                p.restore(oldest.version)
                assert p.checkpoints()[0].state_format == state_db.STATE_FORMAT
        recorded = p.engine.db.recorded_traces()
        assert wide in recorded and narrow not in recorded
        assert narrow in p.engine.db._base.get(state_db.RETIRED_TABLES_KEY, [])
        assert p.recovered_steps == []
        views = [_play_averages(p, r) for r in range(3, 6)]
    if fmt == 2:  # the DOUBLE average carries the old engine's rounding: compare the rest
        views, expected = ([[row.split("'af'")[0] for row in v] for v in vs]
                           for vs in (views, expected))
    assert views == expected[3:]
    with Pipeline(_averages_circuit(), root, spark) as p:
        assert p.upgrade_info.migrations == [] and p.upgrade_info.widened == []


NOT_NULL_SCRIPT = """
CREATE TABLE orders (order_id BIGINT NOT NULL, customer_id BIGINT);
CREATE TABLE customers (customer_id BIGINT NOT NULL, region STRING);
CREATE VIEW v AS SELECT o.order_id, c.customer_id AS cid FROM orders o
    LEFT JOIN customers c ON o.customer_id = c.customer_id;
"""


def _not_null_circuit():
    from dbsp_pipeline import Circuit

    return Circuit.from_sql(NOT_NULL_SCRIPT, name="padded")


def _strict_engine_root(spark, root: str, monkeypatch) -> str:
    """A root written by an engine that typed a LEFT JOIN's padded key NOT NULL (as the other
    side's column is): its one step had every order matched, so no NULL reached the view."""
    from dbsp_pipeline.runtime import plan

    with monkeypatch.context() as m:
        m.setattr(plan, "_nullable_where_any", lambda schema, inputs, padded=(): schema)
        m.setattr(plan, "SCHEMA_RULES", 1)
        with Pipeline(_not_null_circuit(), root, spark) as p:
            assert not p.view_schema("v")["cid"].nullable
            p.push("customers", [(7, "north")])
            p.push("orders", [(1, 7)])
            p.step()
    return root


def _nullable_columns(table: str) -> dict[str, bool]:
    from deltalake import DeltaTable

    return {f.name: f.nullable for f in DeltaTable(table).schema().fields}


def test_an_old_engines_not_null_view_column_is_made_nullable_once(spark, tmp_path,
                                                                   monkeypatch):
    from dbsp_pipeline.storage.verify import verify_root

    root = _strict_engine_root(spark, str(tmp_path / "old"), monkeypatch)
    assert _nullable_columns(f"{root}/outputs/v")["cid"] is False
    with Pipeline(_not_null_circuit(), root, spark) as p:
        assert p.upgrade_info.relaxed == ["outputs/v"] and p.upgrade_info.upgraded
        p.push("orders", [(2, 8)])  # no such customer: cid is NULL
        p.step()
        rows = sorted((r["order_id"], r["cid"]) for r in p.view_arrow("v").to_pylist())
        assert rows == [(1, 7), (2, None)]
    columns = _nullable_columns(f"{root}/outputs/v")
    assert columns["cid"] is True and columns["order_id"] is False
    assert verify_root(root).ok, verify_root(root)
    with Pipeline(_not_null_circuit(), root, spark) as p:
        assert p.upgrade_info.relaxed == []


@pytest.mark.parametrize("point", ["output.schema.before", "output.schema.after"])
def test_a_crash_in_making_a_view_column_nullable_recovers(spark, tmp_path, monkeypatch,
                                                           point):
    from dbsp_pipeline.storage import crash_points
    from dbsp_pipeline.storage.crash_points import InjectedCrash
    from dbsp_pipeline.storage.verify import verify_root

    root = _strict_engine_root(spark, str(tmp_path / "old"), monkeypatch)
    crash_points.reset()
    crash_points.arm(point)
    with pytest.raises(InjectedCrash):
        Pipeline(_not_null_circuit(), root, spark)
    crash_points.reset()
    assert verify_root(root).ok, verify_root(root)
    with Pipeline(_not_null_circuit(), root, spark) as p:
        assert p.upgrade_info.relaxed == ([] if point.endswith("after") else ["outputs/v"])
        p.push("orders", [(2, 8)])
        p.step()
        assert sorted((r["order_id"], r["cid"]) for r in p.view_arrow("v").to_pylist()) \
            == [(1, 7), (2, None)]
    assert _nullable_columns(f"{root}/outputs/v")["cid"] is True
