"""Damaged storage is detected on an object-store root (``s3://``, a real SeaweedFS) as on a local
one: a torn (empty or cut) commit of a state table and a missing data file are named by
``verify`` and by opening the root, and restoring the older checkpoint sets the damaged commits
aside (copy, then delete: a crash between the two leaves both, and the next restore still
gets past it) and opens. Driver path, three small steps."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from pyarrow import fs

from dbsp_pipeline import CorruptStateError, Pipeline, verify
from dbsp_pipeline.storage.set_aside import SET_ASIDE_DIR
from dbsp_pipeline.storage.small_files import list_folders, list_names
from tests.object_store_helpers import new_bucket
from tests.storage.test_verify import (  # noqa: F401 - the fixture folds at every checkpoint
    EXPECTED,
    TRACE,
    circuit,
    fold_at_every_checkpoint,
    step_once_more,
)


def store(settings: dict[str, str]) -> fs.S3FileSystem:
    return fs.S3FileSystem(access_key=settings["AWS_ACCESS_KEY_ID"],
                           secret_key=settings["AWS_SECRET_ACCESS_KEY"],
                           endpoint_override=settings["AWS_ENDPOINT_URL"].removeprefix("http://"),
                           scheme="http", region=settings["AWS_REGION"])


@pytest.fixture(scope="module")
def s3(object_store: dict[str, str]) -> Iterator[fs.S3FileSystem]:
    """The store, named to every reader of the module by the ``AWS_*`` environment."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in object_store.items():
            mp.setenv(name, value)
        yield store(object_store)


@pytest.fixture(scope="module")
def built(spark, s3, object_store) -> str:
    """An s3:// root after three steps of three rows each; checkpoints 3 and 2 retained."""
    root = f"s3://{new_bucket(object_store, 'verify')}/built"
    with Pipeline(circuit(), root, spark) as p:
        for i in range(3):
            p.push("x", [(i * 10 + j, "a") for j in range(3)])
            p.step()
    return root


@pytest.fixture
def root(built: str, s3: fs.S3FileSystem) -> str:
    """A copy of the built root, object by object."""
    copy = f"{built.rsplit('/', 1)[0]}/{uuid.uuid4().hex[:8]}"
    src, dst = built.removeprefix("s3://"), copy.removeprefix("s3://")
    for info in s3.get_file_info(fs.FileSelector(src, recursive=True)):
        if info.type == fs.FileType.File:
            s3.copy_file(info.path, dst + info.path[len(src):])
    return copy


def key(path: str) -> str:
    return path.removeprefix("s3://")


def newest_commit(root: str, table: str) -> str:
    log = f"{root}/{table}/_delta_log"
    return f"{log}/{max(n for n in list_names(log) if n.endswith('.json'))}"


def newest_added_file(s3: fs.S3FileSystem, root: str, table: str) -> str:
    log = f"{root}/{table}/_delta_log"
    for name in sorted((n for n in list_names(log) if n.endswith(".json")), reverse=True):
        with s3.open_input_stream(key(f"{log}/{name}")) as src:
            adds = [json.loads(line)["add"] for line in src.read().decode().splitlines()
                    if line.startswith('{"add"')]
        if adds:
            return f"{root}/{table}/{adds[0]['path']}"
    raise AssertionError(f"no commit of {table} adds a file")


def tear(s3: fs.S3FileSystem, path: str, how: str) -> None:
    with s3.open_input_stream(key(path)) as src:
        data = src.read()
    with s3.open_output_stream(key(path)) as out:
        out.write(b"" if how == "empty" else data[:len(data) // 2])


@pytest.mark.parametrize("how", ["empty", "cut"])
def test_a_torn_state_commit_on_s3_is_named_and_restoring_sets_it_aside(spark, s3, root, how):
    commit = newest_commit(root, TRACE)
    version = int(commit.rsplit("/", 1)[1][:20])
    tear(s3, commit, how)

    report = verify(root)
    assert not report.ok and report.newest_intact == 2
    assert [d.file for d in {t.table: t for t in report.tables}[TRACE].damage] == [commit]
    with pytest.raises(CorruptStateError) as e:
        Pipeline(circuit(), root, spark)
    assert (e.value.table, e.value.version, e.value.file) == (TRACE, version, commit)
    assert f"table '{TRACE}', version {version}, file {commit}" in str(e.value)
    assert e.value.intact_checkpoint == 2

    assert step_once_more(root, spark, checkpoint=2) == EXPECTED
    [folder] = list_folders(f"{root}/{TRACE}/{SET_ASIDE_DIR}")
    assert commit.rsplit("/", 1)[1] in list_names(f"{root}/{TRACE}/{SET_ASIDE_DIR}/{folder}")
    assert verify(root).ok
    assert step_once_more(root, spark)[0]["n"] == 11  # and it opens as usual again


def test_a_missing_data_file_on_s3_is_named(spark, s3, root):
    path = newest_added_file(s3, root, TRACE)
    s3.delete_file(key(path))

    [problem] = {t.table: t for t in verify(root).tables}[TRACE].damage
    assert (problem.file, problem.problem) == (path, "the data file is missing")
    with pytest.raises(CorruptStateError, match="data file is missing") as e:
        Pipeline(circuit(), root, spark)
    assert (e.value.table, e.value.file, e.value.intact_checkpoint) == (TRACE, path, 2)
    assert step_once_more(root, spark, checkpoint=2) == EXPECTED


def test_a_set_aside_cut_between_copy_and_delete_is_finished_by_the_next_restore(
        spark, s3, root):
    """A crash after the copy of the damaged commit into the set-aside folder, before its
    delete from the log: both are there, the log is still whole, and restoring again works."""
    commit = newest_commit(root, TRACE)
    tear(s3, commit, "empty")
    name = commit.rsplit("/", 1)[1]
    s3.copy_file(key(commit), key(f"{root}/{TRACE}/{SET_ASIDE_DIR}/crashed-after-2/{name}"))

    with pytest.raises(CorruptStateError) as e:  # the original still in the log: still damage
        Pipeline(circuit(), root, spark)
    assert (e.value.file, e.value.intact_checkpoint) == (commit, 2)
    assert step_once_more(root, spark, checkpoint=2) == EXPECTED
    aside = f"{root}/{TRACE}/{SET_ASIDE_DIR}"
    [again] = [f for f in list_folders(aside) if f != "crashed-after-2"]
    assert name in list_names(f"{aside}/{again}")  # moved by the restore, this time whole
    assert verify(root).ok
