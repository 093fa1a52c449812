"""The child process of ``test_kill_recovery``: it plays the crash workload at a root until it is
killed or done.

The test starts each child from a fork server that has imported this module (and so the whole
package) once, so a child starts in milliseconds rather than the seconds an import takes; each
child is still its own process, killed with SIGKILL at any moment, and opens (recovers) the
pipeline itself. It sends ``("open", step)`` once the pipeline is open (recovery done), then
plays the rounds from the one the pipeline is at, and sends ``("done", step)`` after closing
(an error: ``("error", traceback)``).
Restarted by the test, it picks up where the durable state says it is.
"""

from __future__ import annotations

import traceback
from multiprocessing.connection import Connection

from tests.runtime.workload import open_pipeline, play_round, rounds


def main(report: Connection, root: str, n: int) -> None:
    try:
        p = open_pipeline(root)
        report.send(("open", p.next_step))
        work = rounds(n)
        for r in range(p.next_step, n):
            play_round(p, r, work[r])
        p.close()
        report.send(("done", n))
    except BaseException:
        report.send(("error", traceback.format_exc()))
        raise
