"""Upgrades: state written by an older engine in an older format is migrated at open, committed
as a checkpoint in the current format, and runs on with nothing reprocessed; a newer format and
a changed circuit are refused with clear errors."""

from __future__ import annotations

import pytest

from dbsp_pipeline import CircuitChangedError, Pipeline, StateFormatError
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
    entry["meta"] = {k: v for k, v in entry["meta"].items() if k not in changes.get("drop_meta", ())}
    db._write_entry(entry)


def test_format_1_state_is_migrated_and_runs_on(spark, tmp_path):
    reference = str(tmp_path / "reference")
    with workload.open_pipeline(reference, spark) as p:
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
    expected = workload.consumer_view(spark, reference)

    root = str(tmp_path / "old")
    with workload.open_pipeline(root, spark) as p:
        for r, pushes in enumerate(ROUNDS[:3]):
            workload.play_round(p, r, pushes)
    # as the previous engine wrote it: format 1, no layout record
    rewrite_newest_entry(root, spark, state_format=1, engine_version="0.0.9",
                         drop_meta=(LAYOUT_KEY,))
    with workload.open_pipeline(root, spark) as p:
        info = p.upgrade_info
        assert (info.from_engine, info.from_format) == ("0.0.9", 1)
        assert info.migrations == [(1, state_db.STATE_FORMAT)] and info.upgraded
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
