"""The S3 store's settings: where and who from the environment, fencing by conditional put only,
clear errors for URIs and settings it cannot use. (Its behaviour as a store is the conformance
suite's: tests/storage/test_table_store_conformance.py.)"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage.s3_store import s3_options, split_s3_uri
from dbsp_pipeline.storage.table_store import open_table_store
from tests.object_store_helpers import new_bucket

SCHEMA = pa.schema([("key", pa.string())])


def test_credentials_and_endpoint_come_from_the_environment(object_store, monkeypatch) -> None:
    bucket = new_bucket(object_store, "env")
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    uri = f"s3://{bucket}/root/table/"
    store = open_table_store(uri, SCHEMA)
    assert store.uri == f"s3://{bucket}/root/table"
    store.commit(store.write_arrow(pa.table({"key": ["a"]}, schema=SCHEMA)), expected_version=1)
    assert open_table_store(store.uri, SCHEMA).version() == 1
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StorageError, match=f"(?s)s3://{bucket}/other: .*SignatureDoesNotMatch"):
        open_table_store(f"s3://{bucket}/other", SCHEMA)


def test_fencing_is_the_conditional_put_and_unsafe_rename_is_refused(monkeypatch) -> None:
    monkeypatch.delenv("AWS_S3_ALLOW_UNSAFE_RENAME", raising=False)
    options = s3_options("s3://b/t", {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"})
    assert options["aws_conditional_put"] == "etag"
    assert (options["aws_endpoint_url"], options["aws_allow_http"]) == ("http://127.0.0.1:1",
                                                                       "true")
    assert "aws_s3_allow_unsafe_rename" not in options
    with pytest.raises(StorageError, match="s3://b/t: AWS_S3_ALLOW_UNSAFE_RENAME"):
        s3_options("s3://b/t", {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    with pytest.raises(StorageError, match="conditional put"):
        open_table_store(f"s3://b-{uuid.uuid4().hex[:6]}/t", SCHEMA)


def test_uris_it_cannot_use_are_named_in_the_error() -> None:
    with pytest.raises(StorageError, match="'s3:///no-bucket' is not s3://bucket/prefix"):
        split_s3_uri("s3:///no-bucket")
    with pytest.raises(StorageError, match="'gs://b/t': unsupported scheme 'gs://'"):
        open_table_store("gs://b/t", SCHEMA)
    assert split_s3_uri("s3a://bucket/a/b/") == ("bucket", "a/b")
