"""Child processes for the kill tests, forked from one fork server that imported the package once.

A child started with ``subprocess`` spends 1.5-3 s importing pyarrow, DuckDB, Delta and the
package before it does anything; the kill tests start about 80 of them. ``PROCESSES`` forks each
from a server process (started at the first child, without the JVM the test process holds) that
imported the children's modules, so a child starts in milliseconds. Each is still a process of
its own: it opens (recovers) its pipeline itself and is killed with SIGKILL or ends at a crash
point with ``os._exit``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

PROCESSES = multiprocessing.get_context("forkserver")
PROCESSES.set_forkserver_preload(["tests.runtime.kill_child", "tests.connectors.kafka_child"])


def start(target: Callable[..., None], *args: Any) -> tuple[BaseProcess, Connection]:
    """``target(report, *args)`` in a child forked from the server; returns the child and the
    end of the pipe it reports on with ``report.send``. The child holds the other end alone,
    so once it has ended, reading past what it sent raises ``EOFError``."""
    reports, report = PROCESSES.Pipe(duplex=False)
    child = PROCESSES.Process(target=target, args=(report, *args))
    child.start()
    report.close()
    return child, reports


def kill(child: BaseProcess) -> None:
    """SIGKILL ``child`` if it still runs, and wait for it."""
    if child.is_alive():
        child.kill()
        child.join()
