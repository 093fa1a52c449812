"""The Spark session as a Dagster resource (one session per run process)."""

from __future__ import annotations

import dagster as dg
from pyspark.sql import SparkSession

from dbsp_pipeline.spark_session import local_session


class SparkResource(dg.ConfigurableResource):
    """A Spark session for the engine. ``master`` is ``local[N]`` (embedded, the default)."""

    master: str = "local[2]"
    shuffle_partitions: int = 4

    def session(self) -> SparkSession:
        cores = self.master.removeprefix("local[").removesuffix("]") if self.master.startswith(
            "local[") else None
        if cores is None:
            raise dg.DagsterInvalidConfigError(
                f"unsupported Spark master '{self.master}': only local[N] for now", [], None)
        return local_session("dbsp-dagster", cores=cores,
                             shuffle_partitions=self.shuffle_partitions)
