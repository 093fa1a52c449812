"""The code location of the shop demo (``workspace.yaml``), built on ``dbsp_pipeline.dagster``
as a project of your own would be: one pipeline (``assets/shop.py``) in one of a few named
deployments (``resources/deployments.py``).

``DBSP_DEPLOYMENT`` names the deployment (default ``local``: local Spark, embedded defaults;
``connect``, ``standalone``, each optionally ``+kafka`` or ``+kafka-sasl``). ``DBSP_VAR`` is the
folder of the pipeline (``<DBSP_VAR>/shop``) and its inbox (``<DBSP_VAR>/inbox``), default
``var/dagster``, the folder ``infra/dagster.sh`` keeps the Dagster instance in too.
"""

from __future__ import annotations

import os

import dagster as dg

from assets.shop import shop_pipeline
from dbsp_pipeline.dagster import Deployment, build_definitions
from resources.deployments import shop_deployment


def shop_definitions(deployment: Deployment) -> dg.Definitions:
    """The shop demo's definitions in ``deployment``."""
    return build_definitions([shop_pipeline(deployment)], deployment)


defs = shop_definitions(shop_deployment(os.environ.get("DBSP_DEPLOYMENT", "local"),
                                        os.environ.get("DBSP_VAR", "var/dagster")))
