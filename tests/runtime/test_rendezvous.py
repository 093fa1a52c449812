"""The meeting of a gang job's tasks through files, in a local folder and on a real object
store: every task gets every text in index order once all are posted (an empty text too), and
a task that never posts is named when the wait ends."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dbsp_pipeline.runtime import rendezvous
from tests.object_store_helpers import new_bucket


@pytest.fixture(params=["local", "s3"])
def folder(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        return str(tmp_path / "_exchange" / "3-x" / "_meet")
    settings = request.getfixturevalue("object_store")
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return f"s3://{new_bucket(settings, 'meet')}/root/_exchange/3-x/_meet"


def test_each_task_gets_every_text_once_all_are_posted(folder: str) -> None:
    got: dict[int, list[str]] = {}

    def task(i: int) -> None:
        time.sleep(0.05 * (3 - i))  # the last posts first
        rendezvous.post(folder, i, f"record {i}" if i != 1 else "")
        got[i] = rendezvous.gather(folder, 3, wait_seconds=30)

    threads = [threading.Thread(target=task, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {i: ["record 0", "", "record 2"] for i in range(3)}


def test_a_task_that_never_posts_is_named(folder: str) -> None:
    rendezvous.post(folder, 0, "here")
    rendezvous.post(folder, 2, "here")
    with pytest.raises(TimeoutError, match=r"tasks \[1, 3\] of 4 posted nothing"):
        rendezvous.gather(folder, 4, wait_seconds=0.2)
