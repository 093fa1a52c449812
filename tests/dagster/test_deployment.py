"""Named deployments: the Spark resource each gives, and settings read by Dagster in the process
that uses them (``dg.EnvVar``), never when the definitions are built."""

from __future__ import annotations

import dagster as dg
import pytest

from dbsp_pipeline import UsageError
from dbsp_pipeline.dagster import Deployment, build_definitions
from dbsp_pipeline.examples.shop import shop_circuit


def test_each_name_gives_its_spark_mode(tmp_path):
    for name in ["local", "connect", "standalone"]:
        d = Deployment.named(name, str(tmp_path), driver_step_rows=3)
        assert (d.name, d.spark.mode, d.driver_step_rows, d.kafka) == (name, name, 3, None)
    with pytest.raises(UsageError, match=r"deployment 'cluster': no such deployment; expected "
                                         r"one of local, connect, standalone"):
        Deployment.named("cluster", str(tmp_path))


def test_connect_settings_are_read_when_a_run_uses_them(tmp_path, monkeypatch):
    monkeypatch.delenv("DBSP_SPARK_CONNECT_URL", raising=False)
    monkeypatch.delenv("DBSP_SPARK_CONNECT_TOKEN", raising=False)
    deployment = Deployment.connect(str(tmp_path))
    defs = build_definitions(shop_circuit(), deployment)  # builds without the variables
    dg.Definitions.validate_loadable(defs)
    with pytest.raises(Exception, match="DBSP_SPARK_CONNECT_URL"):
        deployment.spark.process_config_and_initialize()
    monkeypatch.setenv("DBSP_SPARK_CONNECT_URL", "sc://127.0.0.1:1")
    monkeypatch.setenv("DBSP_SPARK_CONNECT_TOKEN", "t0ken")
    spark = deployment.spark.process_config_and_initialize()
    assert (spark.mode, spark.connect_url, spark.connect_token) == (
        "connect", "sc://127.0.0.1:1", "t0ken")
    assert deployment.spark.connect_token == "DBSP_SPARK_CONNECT_TOKEN"  # a name, not the token


def test_standalone_master_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DBSP_SPARK_MASTER", "spark://127.0.0.1:7")
    spark = Deployment.standalone(str(tmp_path)).spark.process_config_and_initialize()
    assert spark.master == "spark://127.0.0.1:7"
