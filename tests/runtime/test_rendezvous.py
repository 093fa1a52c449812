"""The meeting of a gang job's tasks through files: every task gets every text in index order
once all are posted, a file still being written is read again, and a task that never posts
is named when the wait ends."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from dbsp_pipeline.runtime import rendezvous


def test_each_task_gets_every_text_once_all_are_posted(tmp_path: Path) -> None:
    folder = str(tmp_path / "meet")
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


def test_a_text_still_being_written_is_read_again(tmp_path: Path) -> None:
    folder = tmp_path / "meet"
    folder.mkdir()
    whole = json.dumps({"text": "the record"})
    (folder / "0.json").write_text(whole[:7])  # a write under way
    (folder / "1.json").write_text(json.dumps({"text": "other"}))

    def finish() -> None:
        time.sleep(0.1)
        (folder / "0.json").write_text(whole)

    writer = threading.Thread(target=finish)
    writer.start()
    assert rendezvous.gather(str(folder), 2, wait_seconds=30) == ["the record", "other"]
    writer.join()


def test_a_task_that_never_posts_is_named(tmp_path: Path) -> None:
    folder = str(tmp_path / "meet")
    rendezvous.post(folder, 0, "here")
    rendezvous.post(folder, 2, "here")
    with pytest.raises(TimeoutError, match=r"tasks \[1, 3\] of 4 posted nothing"):
        rendezvous.gather(folder, 4, wait_seconds=0.2)
