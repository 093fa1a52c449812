"""A Delta table in an S3-compatible object store: the ``TableStore`` of ``s3://`` roots.

Where and who come from the root's storage options, else from the environment:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``), ``AWS_REGION`` (or
``AWS_DEFAULT_REGION``) and, for a store other than AWS, ``AWS_ENDPOINT_URL`` (an ``http://``
endpoint is allowed when it is the one given). Options use delta-rs's names in lower case
(``aws_access_key_id``, ``aws_endpoint_url``, ...). The bucket must exist.

Fencing rests on the store's conditional put: delta-rs creates a version's commit file with
``If-None-Match: *`` (``aws_conditional_put=etag``, set here), so of two writers racing for one
version the store lets exactly one create it. A store that ignores the header would let both
"win"; the conformance suite's race test is the check a store must pass. Commits through an
unsafe rename (``AWS_S3_ALLOW_UNSAFE_RENAME``) have no such guarantee and are refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage.delta_store import DeltaTableStore

#: option name -> environment variable it defaults from
_FROM_ENV = {
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "aws_region": "AWS_REGION",
    "aws_endpoint_url": "AWS_ENDPOINT_URL",
}
_UNSAFE_RENAME = "aws_s3_allow_unsafe_rename"


def s3_options(uri: str, given: Mapping[str, str] | None = None) -> dict[str, str]:
    """The S3 options of the table at ``uri``: ``given`` (keys in any case) over the ``AWS_*``
    environment, with the conditional put that fences commits. Refuses an unsafe rename."""
    options = {k.lower(): v for k, v in (given or {}).items()}
    if "aws_endpoint" in options:
        options.setdefault("aws_endpoint_url", options.pop("aws_endpoint"))
    for key, env in _FROM_ENV.items():
        if key not in options and os.environ.get(env):
            options[key] = os.environ[env]
    if "aws_region" not in options:
        options["aws_region"] = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    unsafe = options.get(_UNSAFE_RENAME, os.environ.get(_UNSAFE_RENAME.upper(), ""))
    if unsafe.strip().lower() in ("1", "true", "yes"):
        raise StorageError(
            f"table {uri}: AWS_S3_ALLOW_UNSAFE_RENAME is set, but commits to an object store "
            "are fenced by its conditional put (If-None-Match); an unsafe rename would let two "
            "writers both commit one version. Unset it (the store must support conditional "
            "puts)", definitely_failed=True)
    options.pop(_UNSAFE_RENAME, None)
    options["aws_conditional_put"] = "etag"
    endpoint = options.get("aws_endpoint_url", "")
    if endpoint.startswith("http://"):
        options.setdefault("aws_allow_http", "true")
    return options


def s3_filesystem(options: Mapping[str, str]) -> pafs.S3FileSystem:
    """A pyarrow filesystem on the store ``options`` (from ``s3_options``) name."""
    endpoint = options.get("aws_endpoint_url")
    scheme, host = "https", None
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        scheme, host = parts.scheme, parts.netloc
    return pafs.S3FileSystem(
        access_key=options.get("aws_access_key_id"),
        secret_key=options.get("aws_secret_access_key"),
        session_token=options.get("aws_session_token"),
        region=options.get("aws_region"), endpoint_override=host, scheme=scheme)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``(bucket, key prefix)`` of ``s3://bucket/prefix`` (or ``s3a://``); a ``StorageError``
    naming the URI if it has no bucket."""
    parts = urlsplit(uri)
    if parts.scheme not in ("s3", "s3a") or not parts.netloc:
        raise StorageError(f"table URI {uri!r} is not s3://bucket/prefix",
                           definitely_failed=True)
    return parts.netloc, parts.path.strip("/")


class S3TableStore(DeltaTableStore):
    """The Delta table at ``s3://bucket/prefix``. See the module docstring."""

    def __init__(self, uri: str, schema: pa.Schema,
                 configuration: Mapping[str, str] | None = None, *,
                 storage_options: Mapping[str, str] | None = None) -> None:
        bucket, key = split_s3_uri(uri)
        normalized = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
        options = s3_options(normalized, storage_options)
        super().__init__(normalized, schema, configuration, filesystem=s3_filesystem(options),
                         storage_options=options)
