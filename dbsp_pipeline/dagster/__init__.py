"""The Dagster integration of dbsp-pipeline (``pip install dbsp-pipeline[dagster]``).

A code location of your own is a few lines::

    from dbsp_pipeline.dagster import Deployment, PipelineSpec, build_definitions

    defs = build_definitions([PipelineSpec(my_circuit())], Deployment.local("/data/pipelines"))

``build_definitions`` (``definitions.py``) gives each pipeline its assets, checks, jobs,
sensors and schedule; a ``Deployment`` (``deployment.py``) names where they run. The builders
(``assets.py``, ``checks.py``, ``jobs.py``, ``sensors.py``, ``schedules.py``) and resources
(``SparkResource``, ``PipelineStore``, ``KafkaResource``) are here for code locations that
compose their own. Importing ``dbsp_pipeline`` alone never imports Dagster; this package uses
only the engine's public names.
"""

from dbsp_pipeline.dagster.assets import StepConfig, input_assets, views_asset
from dbsp_pipeline.dagster.checks import MATCHES, POSITIVE, view_checks
from dbsp_pipeline.dagster.definitions import PipelineSpec, build_definitions
from dbsp_pipeline.dagster.deployment import Deployment
from dbsp_pipeline.dagster.jobs import (
    QuarantineConfig,
    ReinjectConfig,
    RescaleConfig,
    RestoreConfig,
    operation_jobs,
    step_job,
)
from dbsp_pipeline.dagster.kafka import KafkaResource
from dbsp_pipeline.dagster.ref import RUN_TAG, PipelineRef
from dbsp_pipeline.dagster.schedules import checkpoint_schedule
from dbsp_pipeline.dagster.sensors import input_arrival_sensor, recover_on_failure_sensor
from dbsp_pipeline.dagster.spark import SPARK_MODES, SparkResource
from dbsp_pipeline.dagster.store import PipelineStore

__all__ = [
    "build_definitions", "PipelineSpec", "Deployment",
    "SparkResource", "SPARK_MODES", "PipelineStore", "KafkaResource", "PipelineRef", "RUN_TAG",
    "input_assets", "views_asset", "StepConfig", "view_checks", "MATCHES", "POSITIVE",
    "step_job", "operation_jobs", "RescaleConfig", "RestoreConfig", "QuarantineConfig",
    "ReinjectConfig",
    "input_arrival_sensor", "recover_on_failure_sensor", "checkpoint_schedule",
]
