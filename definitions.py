"""The Dagster definitions of dbsp-pipeline: one ``Definitions`` for the code location.

Resources are chosen per deployment through environment variables (``DBSP_ROOT`` for where the
pipeline's tables live, ``DBSP_SPARK_MASTER`` for the Spark master); the defaults are the
embedded ones: local Spark and Delta tables under ``var/dagster``.
"""

from __future__ import annotations

import os

import dagster as dg

from assets.views import shop_views
from resources.pipeline_store import PipelineStore
from resources.spark import SparkResource

defs = dg.Definitions(
    assets=[shop_views],
    resources={
        "spark": SparkResource(master=os.environ.get("DBSP_SPARK_MASTER", "local[2]")),
        "pipeline_store": PipelineStore(root=os.environ.get("DBSP_ROOT", "var/dagster/shop")),
    },
)
