"""The tasks of one gang job (``spark_session.run_gang_tasks``) meeting through files: each task
posts a text, then waits until every task of the job has posted its own, and reads them all.

Spark's own meeting point in barrier mode (``BarrierTaskContext.barrier``/``allGather``) costs
about a second a call here (a 2-task job with one ``barrier()`` took 1.03 s, the same job
without it 0.04-0.07 s), more than the job it would save. Files in the step's scratch cost a
write and a few polls: the tasks of a gang job run at once, so each waits only for the slowest
task's first part.

A meeting is a folder where task ``i`` writes ``<i>.json`` (``small_files.write_atomically``: a
task reads it whole or not at all, on a local disk or an object store); the texts are the tasks'
records: small. The tasks of a gang job meet once: Spark never runs a failed barrier job's tasks
again (the job fails), so no text of an earlier attempt is ever in the folder.

Durability: none, and none is needed. The folder is under a stage's exchange folder, scratch of
the step, removed with it (``StepContext.release``, ``exchange.remove_all``).
"""

from __future__ import annotations

import time

from dbsp_pipeline.storage import small_files

#: how long a task waits for the others before failing (they start together, so this is only
#: reached when one hangs: Spark kills the waiting tasks itself when one fails)
WAIT_SECONDS = 900.0
#: the first and the longest pause between two looks at the folder: a look at a local folder
#: costs a few file opens, so a task looks every 5 ms at most (a 20-ms pause kept a task of a
#: 0.4-s step waiting 10 ms past the last post on average); at an object store, a few requests
#: a look, every 20 ms at most
FIRST_PAUSE_SECONDS = 0.0005
LONGEST_PAUSE_SECONDS = 0.005
LONGEST_REMOTE_PAUSE_SECONDS = 0.02


def post(folder: str, index: int, text: str) -> None:
    """Task ``index`` posts ``text`` in meeting ``folder``."""
    small_files.make_folder(folder)
    small_files.write_atomically(f"{folder}/{index}.json", text, durable=False)


def gather(folder: str, count: int, wait_seconds: float = WAIT_SECONDS) -> list[str]:
    """The texts tasks ``0..count-1`` posted in meeting ``folder``, in index order, once all
    have. ``TimeoutError`` naming the tasks still missing after ``wait_seconds``."""
    texts: dict[int, str] = {}
    pause, deadline = FIRST_PAUSE_SECONDS, time.monotonic() + wait_seconds
    longest = LONGEST_REMOTE_PAUSE_SECONDS if small_files.is_remote(folder) \
        else LONGEST_PAUSE_SECONDS
    while True:
        for i in range(count):
            if i not in texts and (text := small_files.read_text(f"{folder}/{i}.json")) \
                    is not None:
                texts[i] = text
        if len(texts) == count:
            return [texts[i] for i in range(count)]
        if time.monotonic() > deadline:
            raise TimeoutError(f"meeting {folder}: tasks {sorted(set(range(count)) - set(texts))}"
                               f" of {count} posted nothing in {wait_seconds:.0f} s")
        time.sleep(pause)
        pause = min(pause * 2, longest)
