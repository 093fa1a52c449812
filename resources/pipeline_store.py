"""Where pipelines live, as a Dagster resource: opens the pipeline of a circuit at its root."""

from __future__ import annotations

import dagster as dg
from pyspark.sql import SparkSession

from dbsp_pipeline import Circuit, Pipeline


class PipelineStore(dg.ConfigurableResource):
    """The root folder of a pipeline's tables (created on first use)."""

    root: str = "var/dagster/shop"

    def open(self, circuit: Circuit, spark: SparkSession) -> Pipeline:
        """Open (or create, or recover) the pipeline of ``circuit`` at ``root``."""
        return Pipeline(circuit, root=self.root, spark=spark)
