"""A pipeline run in a child process, for the multi-process tests.

    python -m tests.runtime.pipeline_process ROOT BARRIER NAME STEPS

Opens the pipeline of ``circuit()`` at ROOT, announces itself in the folder BARRIER and waits
until a second process did too, then pushes and steps STEPS times. Exit status: 0 when every
step ran, 3 when the pipeline was fenced (the message is printed).
"""

from __future__ import annotations

import os
import sys
import time

from dbsp_pipeline import Circuit, Pipeline, PipelineFencedError


def circuit() -> Circuit:
    c = Circuit("fence")
    x = c.input("x", "k BIGINT, who STRING")
    c.output("counts", x.group_by("who").agg(n="count(*)"))
    return c


def main(root: str, barrier: str, name: str, steps: int) -> int:
    try:
        try:  # opening fences the pipeline's tables: of two at once, one may lose here
            p = Pipeline(circuit(), root)
        finally:
            open(os.path.join(barrier, name), "w").close()
        deadline = time.monotonic() + 120
        while len(os.listdir(barrier)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(steps):
            p.push("x", [(i, name)])
            p.step()
    except PipelineFencedError as e:
        print(f"FENCED: {e}", flush=True)
        return 3
    p.close()
    print("RAN", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
