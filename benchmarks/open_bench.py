"""Open and status benchmark: what opening a root and a status read cost after many steps.

One pipeline (one input, a grouped count) runs tiny steps (one row pushed per step, driver
path) with the settings a user of such a stream would pick: a checkpoint every 10 steps, two
retained checkpoints, 1,000 steps of output history. After 10, 1,000, 10,000 (and, if asked,
100,000) steps in all it measures the median seconds of opening the root (``Pipeline(...)``,
the JVM already up, the plan's schemas cached) and of a status read (``read_status``, what a
sensor calls every few seconds), and counts the data files of ``_divisions`` and the entries of
its ``_delta_log`` (what both read), and the largest ``_delta_log`` of the other tables. Prints
one JSON line per size and a table; also the step rate, to project the time of larger sizes.

    python benchmarks/open_bench.py [--sizes 10 1000 10000] [--root DIR]

With ``--root DIR`` the root is kept, and a later run with the same ``DIR`` goes on from the
steps already there (sizes already passed are not measured again): the 100,000-step row takes
hours of tiny steps, so it may be built over several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from deltalake import DeltaTable

from dbsp_pipeline import Circuit, Pipeline, read_status
from dbsp_pipeline import root as root_layout

CHECKPOINT_EVERY = 10
RETAIN_STEPS = 1000
REPEATS = 5


def circuit() -> Circuit:
    c = Circuit("open_bench")
    events = c.input("events", "id BIGINT, kind BIGINT")
    c.output("per_kind", events.group_by("kind").agg(n="count(*)"))
    return c


def open_pipeline(root: str) -> Pipeline:
    return Pipeline(circuit(), root, None, checkpoint_every=CHECKPOINT_EVERY,
                    retain_steps=RETAIN_STEPS)


def log_entries(table: str) -> int:
    log = os.path.join(table, "_delta_log")
    return len(os.listdir(log)) if os.path.isdir(log) else 0


def largest_other_log(root: str) -> tuple[str, int]:
    """The table (other than ``_divisions``) with the most ``_delta_log`` entries."""
    tables = [root_layout.manifest(root), root_layout.errors(root)]
    for folder in (root_layout.INPUTS, root_layout.OUTPUTS, root_layout.STATE):
        path = os.path.join(root, folder)
        tables += [os.path.join(path, n) for n in sorted(os.listdir(path))] \
            if os.path.isdir(path) else []
    sized = [(os.path.relpath(t, root), log_entries(t)) for t in tables]
    return max(sized, key=lambda x: x[1], default=("", 0))


def measure(root: str, steps: int, step_rate: float) -> dict[str, Any]:
    opens = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        p = open_pipeline(root)
        opens.append(time.perf_counter() - started)
        p.close()
    statuses = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        status = read_status(root, ["events"])
        statuses.append(time.perf_counter() - started)
    assert status.divided_steps == steps, (status, steps)
    divisions = root_layout.divisions(root)
    other, other_entries = largest_other_log(root)
    return {"steps": steps, "open_s": round(statistics.median(opens), 4),
            "status_s": round(statistics.median(statuses), 4),
            "division_files": len(DeltaTable(divisions).file_uris()),
            "division_log_entries": log_entries(divisions),
            "largest_other_log": other, "largest_other_log_entries": other_entries,
            "steps_per_s": round(step_rate, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000])
    ap.add_argument("--root", help="the pipeline root, kept and resumed (default: a temporary "
                    "folder, removed)")
    args = ap.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="dbsp-open-")
    rows = []
    try:
        done = read_status(root, ["events"]).divided_steps  # a kept root: go on from there
        for size in sorted(s for s in args.sizes if s >= done):
            p = open_pipeline(root)
            started, first = time.perf_counter(), done
            while done < size:
                p.push("events", [(done, done % 7)])
                p.step()
                done += 1
            rate = (done - first) / max(time.perf_counter() - started, 1e-9)
            p.close()
            row = measure(root, done, rate)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"{'steps':>8} {'open s':>8} {'status s':>9} {'_divisions files':>17} "
          f"{'its _delta_log':>15} {'largest other _delta_log':>34} {'steps/s':>8}")
    for r in rows:
        other = f"{r['largest_other_log']} {r['largest_other_log_entries']}"
        print(f"{r['steps']:>8} {r['open_s']:>8.3f} {r['status_s']:>9.4f} "
              f"{r['division_files']:>17} {r['division_log_entries']:>15} {other:>34} "
              f"{r['steps_per_s']:>8}")


if __name__ == "__main__":
    main()
