"""``worker_memory.keep_freed_memory``: once set, a process reuses the blocks it frees (a
numpy temporary of a few megabytes no longer faults in fresh pages each time); it is done once
per process and ``DBSP_WORKER_MALLOC=0`` turns it off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dbsp_pipeline import worker_memory

#: allocates, touches and frees an 8 MB array 50 times after the setting (or not), and prints
#: whether the setting took and the page faults per allocation
_PROBE = """
import resource, sys
import numpy as np
from dbsp_pipeline import worker_memory
took = worker_memory.keep_freed_memory() if sys.argv[1] == "tune" else False
a = np.arange(1_000_000, dtype=np.int64)
(a & 31).astype(np.uint64)  # the first one may fault in fresh pages either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    b = (a & 31).astype(np.uint64)
    del b
print(took, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def _probe(mode: str, **env: str) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], check=True, capture_output=True,
                         text=True, env={**os.environ, **env}).stdout.split()
    return out[0] == "True", float(out[1])


@glibc
def test_a_tuned_process_reuses_the_memory_it_frees() -> None:
    took, faults = _probe("tune")
    assert took
    pages = 8_000_000 // 4096
    assert faults < pages / 10, f"{faults} page faults per 8 MB array: its blocks are not reused"


@glibc
def test_the_switch_turns_it_off() -> None:
    took, _ = _probe("tune", **{worker_memory.SWITCH: "0"})
    assert not took


@glibc
def test_it_is_done_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_memory, "_tuned_pid", None)
    assert worker_memory.keep_freed_memory()
    assert worker_memory._tuned_pid == os.getpid()
    monkeypatch.setenv(worker_memory.SWITCH, "0")  # already done here: stays done
    assert worker_memory.keep_freed_memory()
