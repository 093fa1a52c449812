"""One SparkSession for the whole test session (a JVM start costs 6-20 s here)."""

from __future__ import annotations

import math
import os
from collections import Counter

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session", autouse=True)
def local_dir(tmp_path_factory):
    """Object-store roots keep their local caches (keyed runs) in a folder of the test session,
    not in the user's ``~/.cache``."""
    from dbsp_pipeline.root import LOCAL_DIR_VARIABLE

    folder = str(tmp_path_factory.mktemp("local-dir"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOCAL_DIR_VARIABLE, folder)
        yield folder


@pytest.fixture(autouse=True)
def no_armed_crash_points():
    """No test starts with a crash point another test armed and did not pass."""
    from dbsp_pipeline.storage import crash_points

    crash_points.reset()
    yield


@pytest.fixture(scope="session")
def spark():
    from dbsp_pipeline.spark_session import local_session

    session = local_session("dbsp-tests", cores=2, shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A real Kafka-protocol broker on 127.0.0.1 for the session (started on first use)."""
    from tests.kafka_helpers import start_broker

    yield from start_broker(tmp_path_factory)


@pytest.fixture(scope="session")
def object_store(tmp_path_factory):
    """A real S3-compatible object store on 127.0.0.1 for the session (started on first use):
    its ``AWS_*`` settings (credentials, endpoint, region)."""
    from tests.object_store_helpers import start_object_store

    yield from start_object_store(tmp_path_factory)


def view_counter(df) -> Counter:
    """A Z-set DataFrame (payload + ``_weight``) as ``Counter{payload tuple: weight}``."""
    cols = [c for c in df.columns if not c.startswith("_")]
    out: Counter = Counter()
    for row in df.collect():
        out[tuple(row[c] for c in cols)] += row["_weight"]
    return Counter({k: v for k, v in out.items() if v != 0})


def table_counter(table) -> Counter:
    """A Z-set Arrow table (payload + ``_weight``) as ``Counter{payload tuple: weight}``."""
    cols = [c for c in table.column_names if not c.startswith("_")]
    out: Counter = Counter()
    weights = table.column("_weight").to_pylist()
    rows = zip(*(table.column(c).to_pylist() for c in cols)) if cols else [()] * len(weights)
    for row, weight in zip(rows, weights):
        out[row] += weight
    return Counter({k: v for k, v in out.items() if v != 0})


def view_rows(p, name: str) -> Counter:
    """Output ``name`` of pipeline ``p`` read on the driver (``view_arrow``: a read through
    Spark costs about 0.4 s a view here) as ``Counter{payload tuple: weight}``."""
    return table_counter(p.view_arrow(name))


def rows_counter(df) -> Counter:
    """A plain DataFrame (a bag of rows) as ``Counter{row tuple: multiplicity}``."""
    return Counter(tuple(r) for r in df.collect())


def sql_sum(values: list[float]) -> float:
    """SQL's sum of ``values`` (the oracle of exact sums): NaN wins, then both infinities make
    NaN, then an infinity, then the correctly rounded finite sum (``math.fsum``)."""
    if any(math.isnan(v) for v in values) or (math.inf in values and -math.inf in values):
        return math.nan
    if math.inf in values:
        return math.inf
    if -math.inf in values:
        return -math.inf
    try:
        return math.fsum(values)
    except OverflowError:  # the exact sum is beyond the double range
        return math.copysign(math.inf, sum(math.copysign(1, v) * min(abs(v), 1e300)
                                           for v in values))
