"""Deployments: where a code location's pipelines run and keep their data, as one named value.

A code location builds one ``Deployment`` (usually chosen by name from a few, by one variable
or by its workspace) and hands it to ``build_definitions``; nothing is read from the environment
when definitions are built. What differs between machines and what is secret (a Connect
server's URL and token, a master's URL, Kafka credentials) is given as ``dg.EnvVar``: Dagster
reads it in the process that uses the resource, masks it in the UI, and fails the run naming
the variable when it is not set.

* ``Deployment.local(data)``: embedded defaults, a local-mode Spark started in the run process
  only when a step needs it.
* ``Deployment.connect(data)``: every run is a client of a long-lived Spark Connect server
  (``DBSP_SPARK_CONNECT_URL``, token ``DBSP_SPARK_CONNECT_TOKEN``, unless given otherwise).
* ``Deployment.standalone(data)``: runs drive a Spark standalone cluster
  (``DBSP_SPARK_MASTER`` unless given otherwise).

``data`` is the folder of the pipelines: pipeline ``<name>`` at ``<data>/<name>`` and its inbox
at ``<data>/inbox`` (unless its ``PipelineSpec`` says otherwise). ``data`` may be
``s3://bucket/prefix`` (README, 'Where a root can live'): the pipelines' roots are then in the
object store and have no inbox unless their specs name a local one.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from dbsp_pipeline import DRIVER_STEP_ROWS, UsageError
from dbsp_pipeline.dagster.kafka import KafkaResource
from dbsp_pipeline.dagster.spark import SPARK_MODES, SparkResource


@dataclass(frozen=True)
class Deployment:
    """A named set of resources for the pipelines of a code location.

    ``spark`` is every pipeline's ``spark`` resource; ``kafka`` the ``kafka`` resource (None:
    no broker, so no pipeline may bind Kafka topics); ``driver_step_rows`` the store option of
    every pipeline (None: each step where its estimated work fits, ``runtime/path_choice.py``;
    N: steps changing more input rows run on Spark; 0: every step)."""

    name: str
    data: str
    spark: SparkResource
    kafka: KafkaResource | None = None
    driver_step_rows: int | None = DRIVER_STEP_ROWS

    @classmethod
    def local(cls, data: str = "var/dagster", *, cores: int = 2,
              kafka: KafkaResource | None = None,
              driver_step_rows: int | None = DRIVER_STEP_ROWS) -> Deployment:
        """Embedded defaults: local-mode Spark with ``cores`` cores in the run process."""
        return cls("local", data, SparkResource(mode="local", cores=cores), kafka,
                   driver_step_rows)

    @classmethod
    def connect(cls, data: str, *, url: str = dg.EnvVar("DBSP_SPARK_CONNECT_URL"),
                token: str = dg.EnvVar("DBSP_SPARK_CONNECT_TOKEN"),
                kafka: KafkaResource | None = None,
                driver_step_rows: int | None = DRIVER_STEP_ROWS) -> Deployment:
        """A long-lived Spark Connect server at ``url`` holding ``token`` ("" for a server
        that asks for none)."""
        return cls("connect", data, SparkResource(mode="connect", connect_url=url,
                                                  connect_token=token), kafka, driver_step_rows)

    @classmethod
    def standalone(cls, data: str, *, master: str = dg.EnvVar("DBSP_SPARK_MASTER"),
                   kafka: KafkaResource | None = None,
                   driver_step_rows: int | None = DRIVER_STEP_ROWS) -> Deployment:
        """A Spark standalone cluster whose master is ``master`` (``spark://host:port``)."""
        return cls("standalone", data, SparkResource(mode="standalone", master=master), kafka,
                   driver_step_rows)

    @classmethod
    def named(cls, name: str, data: str, *, kafka: KafkaResource | None = None,
              driver_step_rows: int | None = DRIVER_STEP_ROWS) -> Deployment:
        """The deployment called ``name`` (``local``, ``connect`` or ``standalone``) with its
        default settings; any other name is refused, naming the ones there are."""
        if name == "local":
            return cls.local(data, kafka=kafka, driver_step_rows=driver_step_rows)
        if name == "connect":
            return cls.connect(data, kafka=kafka, driver_step_rows=driver_step_rows)
        if name == "standalone":
            return cls.standalone(data, kafka=kafka, driver_step_rows=driver_step_rows)
        raise UsageError(f"deployment {name!r}: no such deployment; expected one of "
                         f"{', '.join(SPARK_MODES)}")
