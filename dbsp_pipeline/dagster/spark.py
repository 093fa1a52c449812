"""The Spark session as a Dagster resource: one session per run process.

Three modes (a ``Deployment`` picks one, ``deployment.py``):

* ``local`` (the default): a local-mode JVM in the run process, started only when a step needs
  Spark (a step small enough for the driver never starts it; see ``Pipeline``).
* ``connect``: a client of a long-lived Spark Connect server (``connect_url``, e.g.
  ``sc://127.0.0.1:15002``; ``infra/spark_connect.sh`` starts one): no JVM in the run process.
  ``connect_token`` is the server's authentication token; give it as ``dg.EnvVar("NAME")`` (read
  in the run process, masked in the UI), never as text.
* ``standalone``: a driver in the run process attached to a Spark standalone master
  (``master``, e.g. ``spark://127.0.0.1:7077``).
"""

from __future__ import annotations

from typing import Literal

import dagster as dg
from pyspark.sql import SparkSession

from dbsp_pipeline.spark_session import LazySession, cluster_session, connect_session

#: the names of the modes, in the order the module docstring describes them
SPARK_MODES = ("local", "connect", "standalone")


class SparkResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # its value is itself
    """Where the engine's Spark work runs. See the module docstring."""

    mode: Literal["local", "connect", "standalone"] = "local"
    #: local mode: how many cores (``local[N]``)
    cores: int = 2
    #: connect mode: the server's URL
    connect_url: str = "sc://127.0.0.1:15002"
    #: connect mode: the server's authentication token ("": the server asks for none)
    connect_token: str = ""
    #: standalone mode: the master's URL
    master: str = "spark://127.0.0.1:7077"
    shuffle_partitions: int = 4

    def session(self) -> SparkSession | LazySession:
        """The session for the engine; in local mode a ``LazySession`` (started on first use)."""
        if self.mode == "local":
            return LazySession(app_name="dbsp-dagster", cores=self.cores,
                               shuffle_partitions=self.shuffle_partitions)
        if self.mode == "connect":
            return connect_session(self.connect_url, self.connect_token or None)
        return cluster_session(self.master, "dbsp-dagster", self.shuffle_partitions)
