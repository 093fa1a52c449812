"""A child process that plays the crash workload at ROOT until it is killed or done.

    python -m tests.runtime.kill_child ROOT ROUNDS

Prints ``open`` once the pipeline is open (recovery done), then plays the rounds from the one
the pipeline is at, and prints ``done`` after closing. Killed with SIGKILL at any moment, it is
restarted by the test and picks up where the durable state says it is.
"""

from __future__ import annotations

import sys

from tests.runtime.workload import open_pipeline, play_round, rounds


def main(root: str, n: int) -> int:
    p = open_pipeline(root)
    print("open", p.next_step, flush=True)
    work = rounds(n)
    for r in range(p.next_step, n):
        play_round(p, r, work[r])
    p.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
