"""Sensors evaluated with Dagster's test contexts: cursors, an active run, a failed run."""

from __future__ import annotations

import os
import time

import dagster as dg
import pytest

from dbsp_pipeline import Pipeline, UsageError, read_status
from dbsp_pipeline.dagster import Deployment, PipelineStore, build_definitions
from dbsp_pipeline.examples.shop import shop_circuit
from tests.dagster.conftest import drop
from tests.object_store_helpers import new_bucket


def sensor_named(defs, name):
    return next(s for s in defs.sensors if s.name == name)


def evaluate(defs, instance, name, cursor=None):
    sensor = sensor_named(defs, name)
    context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                      resources=defs.resources)
    return sensor.evaluate_tick(context), context


def test_input_arrival_launches_one_step_run_per_step_range(defs, root, instance, spark):
    result, _ = evaluate(defs, instance, "shop_input_arrival")
    assert not result.run_requests and "no input waits" in result.skip_message

    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north")])
    result, ctx = evaluate(defs, instance, "shop_input_arrival")
    (request,) = result.run_requests
    pipeline_id = read_status(root, ["orders"]).pipeline_id
    assert len(pipeline_id) > 8
    assert request.run_key == f"shop@{pipeline_id[:8]}:from-step-0:customers=1,orders=0"
    assert request.tags["dbsp/pipeline"] == "shop" and request.tags["dbsp/pending_pushes"] == "1"
    assert result.cursor == request.run_key

    # The same pending input with the cursor of the last tick: not launched again.
    again, _ = evaluate(defs, instance, "shop_input_arrival", cursor=result.cursor)
    assert not again.run_requests and "already launched" in again.skip_message

    # More input: a new step range, a new key.
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("orders", [(1, 1, 20.0)])
    more, _ = evaluate(defs, instance, "shop_input_arrival", cursor=result.cursor)
    assert more.run_requests[0].run_key == (
        f"shop@{pipeline_id[:8]}:from-step-0:customers=1,orders=1")

    # Once stepped, nothing waits.
    with Pipeline(shop_circuit(), root, spark) as p:
        p.run()
    done, _ = evaluate(defs, instance, "shop_input_arrival", cursor=more.cursor)
    assert not done.run_requests and "no input waits" in done.skip_message


def test_no_step_is_launched_while_a_run_of_the_pipeline_is_active(defs, root, instance, spark):
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north")])
    job = defs.resolve_job_def("shop_checkpoint")
    run = instance.create_run_for_job(job, tags={"dbsp/pipeline": "shop"},
                                      status=dg.DagsterRunStatus.STARTED)
    result, _ = evaluate(defs, instance, "shop_input_arrival")
    assert not result.run_requests and run.run_id in result.skip_message
    instance.report_run_canceled(run)
    result, _ = evaluate(defs, instance, "shop_input_arrival")
    assert len(result.run_requests) == 1


def test_inbox_files_launch_a_step_keyed_by_the_files(defs, root, instance):
    inbox = os.path.join(os.path.dirname(root), "inbox")
    drop(inbox, "customers", "c1.jsonl", [{"customer_id": 1, "region": "north"}])
    with open(os.path.join(inbox, "customers", ".c2.jsonl"), "w") as fh:  # still being written
        fh.write('{"customer_id": 2')
    result, _ = evaluate(defs, instance, "shop_input_arrival")
    (request,) = result.run_requests
    assert ":inbox-" in request.run_key and request.tags["dbsp/inbox_files"] == "1"


def test_an_inbox_file_launches_a_step_only_once_it_settled(defs, root, instance):
    inbox = os.path.join(os.path.dirname(root), "inbox")
    path = drop(inbox, "customers", "c1.jsonl", [{"customer_id": 1, "region": "north"}], age=0)
    result, _ = evaluate(defs, instance, "shop_input_arrival")  # may still be being written
    assert not result.run_requests and "no input waits" in result.skip_message
    then = time.time() - 60
    os.utime(path, (then, then))
    result, _ = evaluate(defs, instance, "shop_input_arrival")
    (request,) = result.run_requests
    assert ":inbox-" in request.run_key and request.tags["dbsp/inbox_files"] == "1"


def test_a_failed_run_launches_recover(defs, root, instance):
    inbox = os.path.join(os.path.dirname(root), "inbox")
    drop(inbox, "orders", "bad.jsonl", [{"order_id": "x", "customer_id": 1, "amount": 1.0}])
    failed = defs.resolve_job_def("shop_step").execute_in_process(instance=instance,
                                                                 raise_on_error=False)
    assert not failed.success
    (failure,) = instance.all_logs(failed.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    failure_event = failure.dagster_event
    sensor = sensor_named(defs, "shop_recover_on_failure")
    context = dg.build_run_status_sensor_context(
        sensor_name=sensor.name, dagster_instance=instance, dagster_run=failed.dagster_run,
        dagster_event=failure_event).for_run_failure()
    (request,) = list(sensor._run_status_sensor_fn(context))
    assert request.run_key == f"recover-after-{failed.run_id}"
    assert request.tags["dbsp/failed_run"] == failed.run_id
    assert sensor.job_name == "shop_recover"


def test_input_arrival_reads_an_s3_root(spark, instance, object_store, monkeypatch):
    """A deployment whose data is in an object store: the sensor reads the root's status
    through the store (no inbox beside an s3:// root) and keys the run like a local root."""
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    data = f"s3://{new_bucket(object_store, 'dagster')}/pipelines"
    defs = build_definitions(shop_circuit(), Deployment.local(data))
    store = defs.resources["shop_pipeline"]
    assert store.root == f"{data}/shop" and store.inbox_folder is None
    result, _ = evaluate(defs, instance, "shop_input_arrival")
    assert not result.run_requests and "no input waits" in result.skip_message

    with Pipeline(shop_circuit(), store.root, spark) as p:
        p.push("customers", [(1, "north")])
        pipeline_id = p.pipeline_id
    result, _ = evaluate(defs, instance, "shop_input_arrival")
    (request,) = result.run_requests
    assert request.run_key == f"shop@{pipeline_id[:8]}:from-step-0:customers=1,orders=0"
    assert request.tags["dbsp/pending_pushes"] == "1" and request.tags["dbsp/inbox_files"] == "0"

    with pytest.raises(UsageError, match="the inbox is a local folder"):
        _ = PipelineStore(root=store.root, inbox=f"{data}/inbox").inbox_folder
