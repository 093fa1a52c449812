"""Exchange files: the owner a task gives a row (``exchange.owners_of``) is the owner Spark's
``Layout.owner_column`` gives it, for every sharding, several key types and NULL keys; a change
written by owner reads back whole, one owner per file, under the change's own names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType

from dbsp_pipeline.driver.sql import zset_arrow_schema
from dbsp_pipeline.runtime import exchange
from dbsp_pipeline.runtime.exchange import OwnedChange
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.zset import WEIGHT

SCHEMA = StructType([StructField("k.id", IntegerType()), StructField("name", StringType()),
                     StructField("amount", DoubleType())])


def rows(n: int = 2000) -> pa.Table:
    rng = np.random.default_rng(5)
    keys = [None if i % 37 == 0 else int(v) for i, v in enumerate(rng.integers(-500, 500, n))]
    names = [None if i % 41 == 0 else f"n{v}" for i, v in enumerate(rng.integers(0, 90, n))]
    return pa.table({"k.id": pa.array(keys, pa.int32()), "name": names,
                     "amount": rng.random(n), WEIGHT: rng.integers(-2, 3, n)}
                    ).cast(zset_arrow_schema(SCHEMA))


LAYOUTS = [Layout.initial(1), Layout.initial(3), Layout.initial(2, "modulo"),
           Layout.initial(5, "dynamic")]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["W1", "W3-fixed", "W2-modulo", "W5-dynamic"])
@pytest.mark.parametrize("keys", [["k.id"], ["name", "k.id"], []], ids=["int", "pair", "none"])
def test_a_task_gives_a_row_the_owner_spark_gives_it(spark, layout: Layout,
                                                      keys: list[str]) -> None:
    table = rows()
    expected = [r["o"] for r in spark.createDataFrame(table).select(
        layout.owner_column(keys).alias("o")).collect()]
    assert exchange.owners_of(layout, table, keys).tolist() == expected


def test_a_change_written_by_owner_reads_back_whole(spark, tmp_path: Path) -> None:
    layout = Layout.initial(3, "dynamic")
    table = rows()
    folder = exchange.new_folder(str(tmp_path), 4)
    files = exchange.write_by_owner(table, SCHEMA, ["k.id"], layout, folder)
    change = OwnedChange(SCHEMA, ("k.id",), layout.version, folder,
                         {w: tuple(p) for w, p in files.items()}, table.num_rows)
    assert change.owners() == [0, 1, 2]
    back = pa.concat_tables([change.read(w) for w in change.owners()])
    assert back.schema == table.schema
    assert sorted(back.to_pylist(), key=repr) == sorted(table.to_pylist(), key=repr)
    for w in change.owners():
        assert set(exchange.owners_of(layout, change.read(w), ["k.id"]).tolist()) == {w}
    frame = change.to_frame(spark)  # for a reader that needs Spark's
    assert frame.columns == ["k.id", "name", "amount", WEIGHT]
    assert sorted(frame.toArrow().to_pylist(), key=repr) == sorted(table.to_pylist(), key=repr)
    exchange.remove_all(str(tmp_path))
    assert not (tmp_path / "_exchange").exists()
    assert exchange.write_by_owner(table.slice(0, 0), SCHEMA, ["k.id"], layout, folder) == {}


def test_a_change_of_fewer_columns_reads_back_with_the_others_null(spark, tmp_path: Path
                                                                   ) -> None:
    """Files of only the columns the readers read (``columns``): the reader gets every column
    of the change, the others NULL, the same rows by ``read``, ``read_all`` and Spark's."""
    layout = Layout.initial(2)
    table = rows()
    folder = exchange.new_folder(str(tmp_path), 4)
    files = exchange.write_by_owner(table, SCHEMA, ["name"], layout, folder,
                                    columns=["name", "amount"])
    assert all(pa.ipc.open_file(p).schema.names == ["_c1", "_c2", WEIGHT]
               for paths in files.values() for p in paths)
    change = OwnedChange(SCHEMA, ("name",), layout.version, folder,
                         {w: tuple(p) for w, p in files.items()}, table.num_rows)
    expected = table.set_column(0, "k.id", pa.nulls(table.num_rows, pa.int32()))
    want = sorted(expected.to_pylist(), key=repr)
    back = pa.concat_tables([change.read(w) for w in change.owners()])
    assert back.schema == table.schema
    assert sorted(back.to_pylist(), key=repr) == want
    assert sorted(change.read_all().to_pylist(), key=repr) == want
    assert sorted(change.to_frame(spark).toArrow().to_pylist(), key=repr) == want
