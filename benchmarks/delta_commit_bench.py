"""Delta commit floor: what one delta-rs commit, and the log read after it, cost here.

Every durable action of a push or a step is a Delta commit made by delta-rs, followed by a read
of the log so the handle sees its own commit (delta-rs does not advance a handle past the
commits it makes). This measures both on an empty table of the engine's configuration
(``delta_store.DEFAULT_CONFIGURATION``), one add action per commit, in a local folder, so the
per-step cost of the engine's commits can be told apart from its computing: a step that makes
``n`` commits costs at least ``n`` times (commit + refresh). Also the cost of opening a handle
(what a fresh handle would cost instead of a refresh), and how a handle that is never refreshed
slows down (delta-rs checks each commit against every commit since the handle's version).
The engine commits without delta-rs's expired-log cleanup (``delta_store.COMMIT_HOOKS``; the
default hooks, timed here too, list ``_delta_log`` at every commit), and asks for a newer
version by looking for the next commit file before it lets delta-rs read the log: both are
timed through the engine's own store (``open_table_store``), whose log is cleaned as the
pipeline cleans it (``clean_log_below``).

    python benchmarks/delta_commit_bench.py [--commits 200] [--dir DIR]

Prints one JSON line per figure and a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction

from dbsp_pipeline.storage.delta_store import COMMIT_HOOKS, DEFAULT_CONFIGURATION
from dbsp_pipeline.storage.table_store import open_table_store

SCHEMA = pa.schema([("k", pa.int64())])


def commit(table: DeltaTable, i: int, default_hooks: bool = False) -> None:
    table.create_write_transaction(
        [AddAction(f"part-{i}.parquet", 100, {}, int(time.time() * 1000), True, None)],
        mode="append", schema=SCHEMA, commit_properties=CommitProperties(
            custom_metadata={"bench": str(i)}),
        post_commithook_properties=None if default_hooks else COMMIT_HOOKS)


def median_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--dir", default=None, help="where the tables go (default: a temp folder)")
    args = ap.parse_args()
    rows = []

    def emit(figure: str, value: float, **extra: object) -> None:
        row = {"figure": figure, "ms": value, **extra}
        print(json.dumps(row), flush=True)
        rows.append(row)

    folder = tempfile.mkdtemp(prefix="dbsp-commit-", dir=args.dir)
    table = DeltaTable.create(f"{folder}/refreshed", SCHEMA, configuration=DEFAULT_CONFIGURATION)
    commits, refreshes, opens = [], [], []
    for i in range(args.commits):
        t0 = time.perf_counter()
        commit(table, i)
        t1 = time.perf_counter()
        table.update_incremental()
        t2 = time.perf_counter()
        commits.append(t1 - t0)
        refreshes.append(t2 - t1)
        if i % 10 == 0:
            t3 = time.perf_counter()
            DeltaTable(f"{folder}/refreshed")
            opens.append(time.perf_counter() - t3)
    emit("commit", median_ms(commits), commits=args.commits)
    emit("refresh_after_commit", median_ms(refreshes), commits=args.commits)
    emit("open_handle", median_ms(opens), versions=args.commits)

    table = DeltaTable.create(f"{folder}/default_hooks", SCHEMA,
                              configuration=DEFAULT_CONFIGURATION)
    seconds = []
    for i in range(args.commits):
        t0 = time.perf_counter()
        commit(table, i, default_hooks=True)
        seconds.append(time.perf_counter() - t0)
        table.update_incremental()
    emit("commit_with_expired_log_cleanup", median_ms(seconds), commits=args.commits)
    seconds = []
    for _ in range(50):
        t0 = time.perf_counter()
        table.update_incremental()
        seconds.append(time.perf_counter() - t0)
    emit("delta_rs_refresh_nothing_new", median_ms(seconds), versions=args.commits)

    store = open_table_store(f"{folder}/engine", SCHEMA)
    commits, checks = [], []
    for i in range(args.commits):
        adds = store.write_arrow(pa.table({"k": [i]}, schema=SCHEMA))
        t0 = time.perf_counter()
        store.commit(adds)
        t1 = time.perf_counter()
        store.version()  # nothing new
        checks.append(time.perf_counter() - t1)
        commits.append(t1 - t0)
        if i % 16 == 15:  # as the pipeline's garbage collection does
            store.clean_log_below(i)
    emit("engine_commit_and_refresh", median_ms(commits), commits=args.commits)
    emit("engine_newer_version_check_nothing_new", median_ms(checks), commits=args.commits)

    stale = DeltaTable.create(f"{folder}/never_refreshed", SCHEMA,
                              configuration=DEFAULT_CONFIGURATION)
    seconds = []
    for i in range(args.commits):
        t0 = time.perf_counter()
        commit(stale, i)
        seconds.append(time.perf_counter() - t0)
    tenth = max(1, args.commits // 10)
    emit("commit_never_refreshed_first_tenth", median_ms(seconds[:tenth]))
    emit("commit_never_refreshed_last_tenth", median_ms(seconds[-tenth:]),
         commits_since_load=args.commits)

    print()
    print(f"{'figure':>40} {'ms':>9}")
    for r in rows:
        print(f"{r['figure']:>40} {r['ms']:>9.3f}")


if __name__ == "__main__":
    main()
