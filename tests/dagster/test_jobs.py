"""Each job executed in process against a real pipeline (real Spark, Delta tables on disk)."""

from __future__ import annotations

import glob
import os

import dagster as dg
import pytest

from dbsp_pipeline import CorruptStateError, Pipeline, read_status
from dbsp_pipeline.dagster import (
    PipelineRef,
    PipelineSpec,
    PipelineStore,
    SparkResource,
    build_definitions,
    view_checks,
    views_asset,
)
from dbsp_pipeline.examples.shop import shop_circuit
from tests.conftest import view_counter
from tests.dagster.conftest import drop


def metadata_of(result, node: str) -> dict:
    mats = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"
            and e.step_key.startswith(node)]
    return {k: v.value for k, v in mats[0].event_specific_data.metadata.items()}


def test_step_ingests_steps_and_materializes_every_view(defs, root, instance, spark):
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north"), (2, "south")])
        p.push("orders", [(10, 1, 25.0), (11, 2, 5.0)])
    inbox = os.path.join(os.path.dirname(root), "inbox")
    drop(inbox, "orders", "b1.jsonl", [{"order_id": 12, "customer_id": 2, "amount": 40},
                                       {"order_id": 10, "customer_id": 1, "amount": 25.0,
                                        "_weight": -1}])
    result = defs.resolve_job_def("shop_step").execute_in_process(
        instance=instance, run_config={"ops": {"shop_views": {"config": {"max_steps": 5}}}})
    assert result.success
    mats = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    assert set(mats) == {"shop/revenue_by_region", "shop/regions", "shop/idle_customers"}
    m = {k: v.value for k, v in mats["shop/revenue_by_region"].items()}
    # the pushes and the inbox file were ingested before the first step: one step ran
    assert m["steps_executed"] == 1 and m["step"] == 0 and m["input_rows"] == 6
    assert m["rows"] == 1 and m["rows_changed"] == 1 and m["state_version"] >= 1
    assert m["lag_seconds"] > 0 and m["seconds_per_step"] > 0
    phases = [part.split()[0] for part in m["step_phases"].split(", ")]
    assert phases == ["divide", "read", "operators", "outputs", "commit", "upkeep"]
    slowest = [part.split()[0] for part in m["slowest_operators"].split(", ")]
    assert len(slowest) == 3 and all(name.startswith("n") for name in slowest)
    assert m["steps_on_driver"] == 1 and m["last_step_path"].startswith("driver")
    assert m["spark_jobs_on_driver"] == "none"  # the shop's expressions run in DuckDB
    columns = [(c.name, c.type) for c in m["dagster/column_schema"].columns]
    assert columns == [("region", "string"), ("total", "double"), ("n", "bigint"),
                       ("top", "double")]
    checks = {(c.asset_key.to_user_string(), c.check_name): c.passed
              for c in result.get_asset_check_evaluations()}
    assert len(checks) == 6 and all(checks.values())
    # the inputs are observed: what the steps read of each (reading no input whole)
    observed = {e.asset_key.to_user_string(): {k: v.value for k, v in
                                               e.asset_observation_data.asset_observation
                                               .metadata.items()}
                for e in result.get_asset_observation_events()}
    assert set(observed) == {"shop/inputs/orders", "shop/inputs/customers"}
    orders, customers = observed["shop/inputs/orders"], observed["shop/inputs/customers"]
    assert orders["step"] == 0 and orders["rows_read"] == 4 and customers["rows_read"] == 2
    assert orders["log_version"] >= 2 and customers["log_version"] >= 1
    assert os.listdir(os.path.join(inbox, "orders", "done")) == ["b1.jsonl"]
    with Pipeline(shop_circuit(), root, spark) as p:
        assert view_counter(p.view("revenue_by_region")) == {("south", 40.0, 1, 40.0): 1}


def test_a_bad_inbox_file_is_rejected_by_name_and_the_good_ones_land(defs, root, instance,
                                                                     spark):
    inbox = os.path.join(os.path.dirname(root), "inbox")
    drop(inbox, "customers", "c.jsonl", [{"customer_id": 1, "region": "north"}])
    drop(inbox, "orders", "bad.jsonl", [{"order_id": 1, "customer_id": 1, "amount": 30.0},
                                        {"order_id": "two", "customer_id": 1, "amount": 5.0}])
    result = defs.resolve_job_def("shop_step").execute_in_process(instance=instance,
                                                                 raise_on_error=False)
    assert not result.success
    failure = result.failure_data_for_node("shop_views").error.message
    assert "bad.jsonl" in failure and "input 'orders'" in failure
    error = open(os.path.join(inbox, "orders", "rejected", "bad.jsonl.error.txt")).read()
    assert "file bad.jsonl, line 2: input 'orders', record 1" in error and "order_id" in error
    with Pipeline(shop_circuit(), root, spark) as p:  # the good file was stepped
        assert view_counter(p.view("regions")) == {("north",): 1}
        assert p.next_step == 1


def test_checkpoint_recover_and_restore(root, deployment, instance, spark):
    defs = build_definitions(PipelineSpec(shop_circuit(), retain_checkpoints=3), deployment)
    with Pipeline(shop_circuit(), root, spark, retain_checkpoints=3) as p:
        for i in range(4):
            p.push("orders", [(i, 1, 20.0 + i)])
            p.step()
    checkpoint = defs.resolve_job_def("shop_checkpoint").execute_in_process(instance=instance)
    assert checkpoint.success
    m = metadata_of(checkpoint, "shop_checkpoint_op")
    assert m["next_step"] == 4 and [c["step"] for c in m["checkpoints"]] == [4, 3, 2]

    recover = defs.resolve_job_def("shop_recover").execute_in_process(instance=instance)
    assert metadata_of(recover, "shop_recover_op")["replayed_steps"] == []

    restore_job = defs.resolve_job_def("shop_restore")
    refused = restore_job.execute_in_process(
        instance=instance, raise_on_error=False,
        run_config={"ops": {"shop_restore_op": {"config": {"version": 4}}}})
    assert not refused.success
    assert "confirm: true" in refused.failure_data_for_node("shop_restore_op").error.message
    previous = m["checkpoints"][1]["version"]
    restored = restore_job.execute_in_process(instance=instance, run_config={
        "ops": {"shop_restore_op": {"config": {"version": previous, "confirm": True}}}})
    r = metadata_of(restored, "shop_restore_op")
    assert r["restored_version"] == previous and r["replayed_steps"] == [3]
    assert read_status(root, ["orders", "customers"]).divided_steps == 4


def test_resources_can_be_overridden_in_materialize(root, spark, tmp_path):
    ref = PipelineRef(shop_circuit())
    elsewhere = str(tmp_path / "elsewhere")
    with Pipeline(shop_circuit(), elsewhere, spark) as p:
        p.push("customers", [(5, "west")])
    result = dg.materialize(
        [views_asset(ref), view_checks(ref)],
        # a driver budget of one byte: the step runs on Spark, and the metadata says why
        resources={"spark": SparkResource(),
                   "shop_pipeline": PipelineStore(root=elsewhere, driver_memory=1)})
    assert result.success and not os.path.exists(root)
    assert all(c.passed for c in result.get_asset_check_evaluations())
    m = {k: v.value for e in result.get_asset_materialization_events()
         for k, v in e.step_materialization_data.materialization.metadata.items()}
    assert m["steps_on_driver"] == 0 and "over the budget of 1 B" in m["last_step_path"]


def test_a_drifted_view_fails_its_check(root, instance, spark):
    import pyarrow as pa

    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north")])
        p.step()
        log = p.engine.outputs["regions"]
        log.table.commit(log.table.write_arrow(pa.table(
            {"region": ["north"], "_step": [0], "_weight": [-2]}, schema=log.table.arrow_schema)))
    ref = PipelineRef(shop_circuit())
    result = dg.materialize(
        [views_asset(ref), view_checks(ref)], instance=instance,
        resources={"spark": SparkResource(), "shop_pipeline": PipelineStore(root=root)},
        selection=dg.AssetSelection.checks_for_assets(dg.AssetKey(["shop", "regions"])),
        raise_on_error=False)
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()
              if c.asset_key == dg.AssetKey(["shop", "regions"])}
    assert not checks["positive_multiplicities"].passed
    assert not checks["matches_recomputation"].passed


def test_rescale_job_changes_the_layout_between_steps(defs, root, instance, spark):
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(i, f"r{i % 3}") for i in range(50)])
        p.push("orders", [(i, i % 50, 20.0 + i) for i in range(200)])
        p.step()
    result = defs.resolve_job_def("shop_rescale").execute_in_process(
        instance=instance, run_config={"ops": {"shop_rescale_op": {"config": {"workers": 3}}}})
    m = metadata_of(result, "shop_rescale_op")
    assert m["old_layout"]["workers"] == 1 and m["new_layout"]["workers"] == 3
    assert m["stopped_at_step"] == 1 and m["state_rows"] > 0
    assert m["moved_rows"] > 0 and m["rewritten_rows"] > 0
    with Pipeline(shop_circuit(), root, spark) as p:
        assert p.layout.workers == 3


def test_hot_rescale_job_executes_pending_steps_while_it_copies(defs, root, instance, spark):
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(i, f"r{i % 3}") for i in range(50)])
        p.push("orders", [(i, i % 50, 20.0 + i) for i in range(200)])
        p.step()
        p.push("orders", [(1000 + i, i % 50, 5.0) for i in range(20)])  # pending
    result = defs.resolve_job_def("shop_rescale").execute_in_process(
        instance=instance,
        run_config={"ops": {"shop_rescale_op": {"config": {"workers": 2, "hot": True}}}})
    m = metadata_of(result, "shop_rescale_op")
    assert m["hot"] and m["new_layout"]["workers"] == 2 and m["state_rows"] > 0
    with Pipeline(shop_circuit(), root, spark) as p:
        assert p.layout.workers == 2
        assert p.next_step == 2  # the pending input was stepped by the job
        assert not p.input_pending()


def test_upgrade_job_reports_versions_and_refuses_a_changed_circuit(defs, root, deployment,
                                                                    instance, spark):
    from dbsp_pipeline.storage.state_db import ENGINE_VERSION, STATE_FORMAT

    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north")])
        p.step()
    result = defs.resolve_job_def("shop_upgrade").execute_in_process(instance=instance)
    m = metadata_of(result, "shop_upgrade_op")
    assert (m["to_engine"], m["to_format"], m["migrations"]) == (ENGINE_VERSION, STATE_FORMAT, [])
    assert m["replayed_steps"] == [] and m["next_step"] == 1

    changed = build_definitions(shop_circuit(extra_views=False), deployment)
    failed = changed.resolve_job_def("shop_upgrade").execute_in_process(
        instance=instance, raise_on_error=False)
    assert not failed.success
    error = failed.failure_data_for_node("shop_upgrade_op").error
    assert error.cause.cls_name == "CircuitChangedError"
    assert "different circuit" in error.cause.message and "allow_circuit_change" in \
        error.cause.message

    # with allow_circuit_change the views change without starting over
    upgraded = changed.resolve_job_def("shop_upgrade").execute_in_process(
        instance=instance,
        run_config={"ops": {"shop_upgrade_op": {"config": {"allow_circuit_change": True}}}})
    change = metadata_of(upgraded, "shop_upgrade_op")["circuit_change"]
    assert change["step"] == 1 and change["views"]["removed"]
    assert not change["backfilled"] and not change["views"]["added"]
    with Pipeline(shop_circuit(extra_views=False), root, spark) as p:
        assert p.checkpoints()[0].circuit_change == change


def test_a_failed_step_is_reported_quarantined_and_reinjected_by_jobs(defs, root, instance,
                                                                     spark, tmp_path):
    """Three orders of weight 2**31 - 1 joined with a customer of that weight: the group's
    count overflows 64 bits, every time. The recover job names the step; the quarantine job
    moves its records to the errors table; the pipeline goes on."""
    w = 2**31 - 1
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north")], weight=w)
        p.push("orders", [(i, 1, 50.0) for i in range(3)], weight=w)
    step = defs.resolve_job_def("shop_step").execute_in_process(instance=instance,
                                                               raise_on_error=False)
    assert not step.success
    assert "step 0 of pipeline 'shop' failed" in \
        step.failure_data_for_node("shop_views").error.to_string()
    recover = defs.resolve_job_def("shop_recover").execute_in_process(instance=instance)
    failed = metadata_of(recover, "shop_recover_op")["failed_step"]
    assert failed["step"] == 0 and failed["error"]
    quarantine = defs.resolve_job_def("shop_quarantine")
    refused = quarantine.execute_in_process(
        instance=instance, raise_on_error=False,
        run_config={"ops": {"shop_quarantine_op": {"config": {"step": 0}}}})
    assert "confirm: true" in refused.failure_data_for_node("shop_quarantine_op").error.message
    done = quarantine.execute_in_process(instance=instance, run_config={
        "ops": {"shop_quarantine_op": {"config": {"step": 0, "confirm": True}}}})
    m = metadata_of(done, "shop_quarantine_op")
    assert m["quarantined_step"] == 0 and m["records_moved_to_errors"] == {
        "orders": 3, "customers": 1} and m["next_step"] == 1
    with Pipeline(shop_circuit(), root, spark) as p:
        assert p.failed_step is None
        p.push("customers", [(2, "south")])
        p.push("orders", [(9, 2, 5.0)])
        ids = sorted(e["id"] for e in p.errors().to_pylist())
    assert ids == ["customers@step 0/-/0", *(f"orders@step 0/-/{i}" for i in range(3))]
    assert defs.resolve_job_def("shop_step").execute_in_process(instance=instance).success
    with Pipeline(shop_circuit(), root, spark) as p:
        assert view_counter(p.view("regions")) == {("south",): 1}

    # The customer, fixed (weight 1), re-injected from a file by the reinject job, twice.
    fixes = tmp_path / "fixes.jsonl"
    fixes.write_text('{"id": "customers@step 0/-/0", "row": {"customer_id": 1, '
                     '"region": "north"}}\n')
    reinject = defs.resolve_job_def("shop_reinject")
    config = {"ops": {"shop_reinject_op": {"config": {"file": str(fixes)}}}}
    first = metadata_of(reinject.execute_in_process(instance=instance, run_config=config),
                        "shop_reinject_op")
    assert first["rows_appended"] == {"customers@step 0/-/0": 1} and first["input_pending"]
    again = metadata_of(reinject.execute_in_process(instance=instance, run_config=config),
                        "shop_reinject_op")
    assert again["rows_appended"] == {} and again["reinjected_before"] == [
        "customers@step 0/-/0"]
    (tmp_path / "bad.jsonl").write_text('{"id": "customers@step 0/-/0"}\n')
    refused = reinject.execute_in_process(instance=instance, raise_on_error=False, run_config={
        "ops": {"shop_reinject_op": {"config": {"file": str(tmp_path / "bad.jsonl")}}}})
    assert "bad.jsonl, line 1" in refused.failure_data_for_node("shop_reinject_op").error.message
    assert defs.resolve_job_def("shop_step").execute_in_process(instance=instance).success
    with Pipeline(shop_circuit(), root, spark) as p:
        assert view_counter(p.view("regions")) == {("south",): 1, ("north",): 1}
        assert [e["resolved"] for e in p.errors().to_pylist()
                if e["input"] == "customers"] == [True]


def test_verify_names_damage_and_restore_gets_past_it(defs, root, instance, spark):
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north")])
        p.step()
        p.push("orders", [(10, 1, 25.0)])
        p.step()
    verify_job = defs.resolve_job_def("shop_verify")
    m = metadata_of(verify_job.execute_in_process(instance=instance), "shop_verify_op")
    assert m["ok"] and m["newest_intact_checkpoint"] == 2 and m["damage"] == []
    assert set(m["tables"]) >= {"_manifest", "_divisions", "inputs/orders", "outputs/regions"}
    assert set(m["tables"].values()) == {"ok"}

    # The newest checkpoint's manifest entry is lost: the root no longer opens ...
    entry = max(glob.glob(os.path.join(root, "_manifest", "_delta_log", "*.json")))
    open(entry, "w").close()
    failed = verify_job.execute_in_process(instance=instance, raise_on_error=False)
    assert not failed.success
    failure = failed.failure_data_for_node("shop_verify_op").user_failure_data
    assert "_manifest" in failure.description and entry in failure.description
    failed_meta = {k: v.value for k, v in failure.metadata.items()}
    assert failed_meta["newest_intact_checkpoint"] == 1 and not failed_meta["ok"]
    with pytest.raises(CorruptStateError):
        Pipeline(shop_circuit(), root, spark)

    # ... and the restore job goes back to the intact one past the damage.
    restored = defs.resolve_job_def("shop_restore").execute_in_process(instance=instance,
        run_config={"ops": {"shop_restore_op": {"config": {"version": 1, "confirm": True}}}})
    r = metadata_of(restored, "shop_restore_op")
    assert r["restored_version"] == 1 and r["replayed_steps"] == [1]
    assert metadata_of(verify_job.execute_in_process(instance=instance), "shop_verify_op")["ok"]
    with Pipeline(shop_circuit(), root, spark) as p:
        assert view_counter(p.view("revenue_by_region")) == {("north", 25.0, 1, 25.0): 1}
