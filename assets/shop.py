"""The shop demo's pipeline: the shop circuit (``dbsp_pipeline.examples.shop``), fed by its inbox
and, when the deployment has a Kafka broker, by the topics ``shop.orders`` and
``shop.customers`` (JSON); its views then go to ``shop.<view>`` (with ``shop.<view>.steps``)."""

from __future__ import annotations

from dbsp_pipeline.dagster import Deployment, PipelineSpec
from dbsp_pipeline.examples.shop import shop_circuit


def shop_pipeline(deployment: Deployment) -> PipelineSpec:
    """The shop pipeline in ``deployment``: through Kafka too if it has a broker."""
    circuit = shop_circuit()
    if deployment.kafka is None:
        return PipelineSpec(circuit)
    from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput

    return PipelineSpec(circuit,
                        kafka_inputs=[KafkaInput(name, f"shop.{name}") for name in circuit.inputs],
                        kafka_outputs=[KafkaOutput(view, f"shop.{view}")
                                       for view in circuit.outputs])
