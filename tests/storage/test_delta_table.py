"""``SparkDeltaTable``: the Spark handle over a table store."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage.delta_table import SparkDeltaTable
from tests.object_store_helpers import new_bucket

SCHEMA = StructType([StructField("key", StringType()), StructField("_step", LongType())])


def test_spark_on_an_s3_table_without_hadoop_aws_names_the_jars(spark, object_store) -> None:
    """This machine's Spark has no S3A filesystem: writing or reading an s3:// table's files on
    Spark is a StorageError naming the jars, not a JVM stack trace. The driver still can."""
    uri = f"s3://{new_bucket(object_store, 'spark')}/root/t"
    table = SparkDeltaTable(spark, uri, SCHEMA, storage_options=object_store)
    df = spark.createDataFrame([("a", 1)], SCHEMA)
    with pytest.raises(StorageError, match=f"Spark cannot reach {uri}/data/.*hadoop-aws") as e:
        table.write_files(df)
    assert "\tat " not in str(e.value) and e.value.definitely_failed
    adds = table.write_arrow(pa.table({"key": ["a"], "_step": [1]}, schema=table.arrow_schema))
    table.commit(adds)
    with pytest.raises(StorageError, match=f"Spark cannot reach {uri}: .*hadoop-aws"):
        table.read_version().collect()
    assert table.read_arrow(table.files()).to_pylist() == [{"key": "a", "_step": 1}]
