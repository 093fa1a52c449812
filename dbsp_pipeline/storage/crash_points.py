"""Named crash points at every durable action, for fault-injection tests.

Every Delta commit the engine makes (and every rollback of a state table) passes two points
(passed by ``dbsp_pipeline.testing.FaultInjectingTableStore``, which wraps every table store;
``dbsp_pipeline.testing`` is the public face of this module),
``<role>.<action>.before`` and ``<role>.<action>.after``, where ``role`` names the table's part in
the protocol (``input``, ``division``, ``trace``, ``output``, ``manifest``) and ``action`` is
``commit`` (a data change), ``rewrite`` (a compaction: same content, other files) or ``restore``
(a rollback to the recorded state version). Deleting Delta log files below a Delta checkpoint
(``clean_log_below``) passes ``<role>.cleanup.before``, ``<role>.cleanup.between`` between two
deleted files and ``<role>.cleanup.after``. A test arms a point to crash at its n-th pass:

* in-process, ``arm(name, n)`` makes the pass raise ``InjectedCrash`` (a ``BaseException``, so no
  engine code can swallow it); the test then abandons the pipeline object, as a dead process
  would, and reopens the root;
* in a child process, the environment variable ``DBSP_CRASH_AT=name:n`` makes the pass end the
  process at once with ``os._exit(CRASH_EXIT_CODE)``, like ``kill -9``.

``passes()`` counts the passes of every point since the last ``reset()``, which is how a test
enumerates the crash points a workload goes through. Unarmed, a pass costs a dict lookup.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

CRASH_EXIT_CODE = 77
_ENV = "DBSP_CRASH_AT"


class InjectedCrash(BaseException):
    """The crash a test asked for at a named point."""


_armed: dict[str, int] = {}
_passes: Counter[str] = Counter()
#: pushes a step carries pass their points in a background thread (``input_log.py``)
_lock = threading.Lock()


def arm(name: str, at_pass: int = 1) -> None:
    """Crash at the ``at_pass``-th pass (from now on) of the point ``name``."""
    _armed[name] = _passes[name] + at_pass


def reset() -> None:
    """Disarm every point and forget the pass counts."""
    _armed.clear()
    _passes.clear()


def passes() -> Counter[str]:
    """How often each point was passed since the last ``reset``."""
    return Counter(_passes)


def hit(name: str) -> None:
    """Pass the point ``name``: crash here if a test armed it for this pass."""
    with _lock:
        _passes[name] += 1
        count = _passes[name]
        crash = _armed.get(name) == count
        if crash:
            del _armed[name]
    if crash:
        raise InjectedCrash(name)
    spec = os.environ.get(_ENV)
    if spec:
        point, _, n = spec.rpartition(":")
        if point == name and int(n) == count:
            os._exit(CRASH_EXIT_CODE)
