"""The Dagster layer over Kafka (real local broker): the input sensor sees topic lag, the step
job polls, steps and sends the views in transactions, and reports rejected records."""

from __future__ import annotations

import dagster as dg

from dbsp_pipeline import Pipeline
from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput
from dbsp_pipeline.dagster import Deployment, KafkaResource, PipelineSpec, build_definitions
from dbsp_pipeline.examples.shop import shop_circuit
from tests.kafka_helpers import consume_all, new_topic, produce


def test_kafka_lag_starts_a_step_that_sends_the_views(root, deployment, instance, spark, broker):
    orders, customers = new_topic(broker, 2, "dorders"), new_topic(broker, 1, "dcust")
    out = f"dout-{orders}"
    spec = PipelineSpec(
        shop_circuit(),
        kafka_inputs=[KafkaInput("orders", orders), KafkaInput("customers", customers)],
        kafka_outputs=[KafkaOutput("regions", out)])
    with_broker = Deployment.local(
        deployment.data, kafka=KafkaResource(bootstrap_servers=broker["bootstrap.servers"]))
    defs = build_definitions(spec, with_broker)
    sensor = next(s for s in defs.sensors if s.name == "shop_input_arrival")

    def tick(cursor=None):
        return sensor.evaluate_tick(dg.build_sensor_context(
            instance=instance, cursor=cursor, definitions=defs, resources=defs.resources))

    assert "no input waits" in tick().skip_message
    produce(broker, customers, [{"customer_id": 1, "region": "north"},
                                {"customer_id": 2, "region": "south"}, b"not json"])
    produce(broker, orders, [{"order_id": 1, "customer_id": 1, "amount": 30.0}],
            partition_of=lambda i, v: 1)
    (request,) = tick().run_requests
    assert ":kafka-" in request.run_key and request.tags["dbsp/kafka_lag"] == "4"

    result = defs.resolve_job_def("shop_step").execute_in_process(instance=instance,
                                                                 tags=request.tags)
    assert result.success
    mats = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    meta = {k: v.value for k, v in mats["shop/regions"].items()}
    assert meta["rejected_records"] == 1 and meta["input_rows"] == 3
    sent = sorted(v for *_, v in consume_all(broker, out))
    assert sent == [b'{"insert": {"region": "north"}}', b'{"insert": {"region": "south"}}']
    assert "no input waits" in tick().skip_message  # everything consumed
    with Pipeline(shop_circuit(), root, spark) as p:
        assert p.next_step == 1
