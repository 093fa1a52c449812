"""A shop pipeline's definitions at a fresh root per test, and helpers to feed it."""

from __future__ import annotations

import json
import os
import time

import dagster as dg
import pytest

from dbsp_pipeline.dagster import Deployment, build_definitions
from dbsp_pipeline.examples.shop import shop_circuit


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "shop")


@pytest.fixture
def deployment(root):
    """A local deployment whose data folder holds the shop pipeline at ``root``."""
    return Deployment.local(os.path.dirname(root))


@pytest.fixture
def defs(deployment, spark):  # spark: the test session, which the local SparkResource then uses
    return build_definitions(shop_circuit(), deployment)


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def drop(inbox: str, input_name: str, file: str, records: list[dict],
         age: float = 60.0) -> str:
    """Write an inbox file the way a producer must: under a hidden name, then renamed; dated
    ``age`` seconds ago (past the settle interval, as a file that arrived a while ago)."""
    folder = os.path.join(inbox, input_name)
    os.makedirs(folder, exist_ok=True)
    tmp, path = os.path.join(folder, "." + file), os.path.join(folder, file)
    with open(tmp, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, path)
    then = time.time() - age
    os.utime(path, (then, then))
    return path
