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

#: start children with ``PROCESSES.Process``; talk to them over ``PROCESSES.Pipe``
PROCESSES = multiprocessing.get_context("forkserver")
PROCESSES.set_forkserver_preload(["tests.runtime.kill_child", "tests.connectors.kafka_child"])
