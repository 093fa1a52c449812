"""A real S3-compatible object store (SeaweedFS) for tests: started once per test session by
``infra/object_store.sh`` on 127.0.0.1, stopped (only the process it started) at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

from pyarrow import fs

from infra.console import REPO, free_port


def start_object_store(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The store's ``AWS_*`` settings (credentials, endpoint, region), as environment variables
    and storage options take them (a generator: the store stops when it is closed)."""
    var = str(tmp_path_factory.mktemp("object-store"))
    env = {**os.environ, "DBSP_VAR": var,
           "VENV": os.path.dirname(os.path.dirname(sys.executable))}
    subprocess.run(["bash", "infra/object_store.sh", "start", str(free_port())], cwd=REPO,
                   env=env, check=True, timeout=120, stdout=subprocess.DEVNULL)
    try:
        with open(os.path.join(var, "object-store.env")) as fh:
            yield dict(line.strip().split("=", 1) for line in fh if "=" in line)
    finally:
        # its data is thrown away: no need to wait for the filer's graceful stop
        subprocess.run(["bash", "infra/object_store.sh", "stop", "now"], cwd=REPO, env=env,
                       check=True, timeout=120)


def new_bucket(settings: dict[str, str], prefix: str = "t") -> str:
    """A fresh, empty bucket in the store ``settings`` name; returns its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    s3 = fs.S3FileSystem(access_key=settings["AWS_ACCESS_KEY_ID"],
                         secret_key=settings["AWS_SECRET_ACCESS_KEY"],
                         endpoint_override=settings["AWS_ENDPOINT_URL"].removeprefix("http://"),
                         scheme="http", region=settings["AWS_REGION"],
                         allow_bucket_creation=True)
    s3.create_dir(name)
    return name
