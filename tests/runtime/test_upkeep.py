"""Upkeep after commits: a garbage collection does not wait for a background merge whose
files are younger than its grace (the step that triggered it would), leaves the running merge's
files and keyed runs alone, and the merge applies afterwards; a collection with a shorter grace
waits for it."""

from __future__ import annotations

import threading
from typing import Any

from dbsp_pipeline.circuit import Circuit
from dbsp_pipeline.runtime import upkeep
from dbsp_pipeline.runtime.pipeline import Pipeline
from dbsp_pipeline.storage import garbage
from dbsp_pipeline.storage.trace import Trace


def circuit() -> Circuit:
    c = Circuit("upkeep")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("g", x.group_by("k").agg(hi="max(v)", n="count(*)"))
    return c


def test_a_collection_does_not_wait_for_a_young_background_merge(spark, tmp_path,
                                                                   monkeypatch) -> None:
    release = threading.Event()
    merging = threading.Event()
    merge = Trace.merge

    def blocked_merge(self: Trace, *args: Any, **kwargs: Any) -> Any:
        merging.set()
        assert release.wait(60), "the test never released the merge"
        return merge(self, *args, **kwargs)

    swept: list[bool] = []
    collect_runs = Trace.collect_runs

    def recording_collect_runs(self: Trace) -> int:
        swept.append(True)
        return collect_runs(self)

    monkeypatch.setattr(Trace, "merge", blocked_merge)
    monkeypatch.setattr(Trace, "collect_runs", recording_collect_runs)
    with Pipeline(circuit(), root=str(tmp_path / "root"), spark=spark, compact_threshold=2,
                  driver_step_rows=10**9) as p:
        pushed: list[tuple[int, int]] = []
        for i in range(4):
            pushed += [(i % 2, i), (5, i)]
            p.push("x", pushed[-2:])
            p.step()
            if merging.is_set():
                break
        assert merging.wait(30) and p.engine.compactor.running_for() is not None

        def collect(grace: float, done: threading.Event) -> None:
            with p._lock:
                upkeep.collect_garbage(p.engine, grace)
            done.set()

        quick = threading.Event()
        threading.Thread(target=collect, args=(garbage.ORPHAN_GRACE_SECONDS, quick)).start()
        assert quick.wait(60)  # returned while the merge is still blocked
        assert p.engine.compactor.running_for() is not None and not swept

        slow = threading.Event()
        threading.Thread(target=collect, args=(0.0, slow)).start()
        assert not slow.wait(2)  # a grace of 0 could take the merge's files: it waits
        release.set()
        assert slow.wait(60)
        assert p.engine.compactor.running_for() is None and swept  # applied, then swept
        pushed.append((0, 100))
        p.push("x", pushed[-1:])
        p.step()
        expected = {k: (max(v for kk, v in pushed if kk == k), sum(kk == k for kk, _ in pushed))
                    for k in {k for k, _ in pushed}}
        assert {r["k"]: (r["hi"], r["n"]) for r in p.view_arrow("g").to_pylist()} == expected
        assert p.verify().ok


def test_consumed_input_is_consolidated_beside_the_steps(spark, tmp_path, monkeypatch) -> None:
    """The collection after a commit starts consolidating consumed input in the background and
    returns; a later commit applies it (one rewrite of the log, the integrated input
    unchanged); a collection with a short grace consolidates in the foreground."""
    from dbsp_pipeline.runtime.input_log import InputLog

    release = threading.Event()
    started = threading.Event()
    consolidated = InputLog._consolidated

    def blocked(self: InputLog, files: Any, sql: Any, *args: Any) -> Any:
        if sql is None:  # the background thread's
            started.set()
            assert release.wait(60), "the test never released the consolidation"
        return consolidated(self, files, sql, *args)

    monkeypatch.setattr(InputLog, "_consolidated", blocked)
    with Pipeline(circuit(), root=str(tmp_path / "root"), spark=spark,
                  driver_step_rows=10**9) as p:
        pushed: list[tuple[int, int]] = []
        log = p.engine.inputs["x"]
        for i in range(5):
            pushed += [(i % 2, i), (5, i)]
            p.push("x", pushed[-2:])
            p.step()

        def integrated() -> list[tuple[int, int]]:
            rows = log.table.read_arrow(log.table.files()).to_pylist()
            return sorted((r["k"], r["v"]) for r in rows for _ in range(r["_weight"]))

        files_before = len(log.table.files())
        done = threading.Event()

        def collect() -> None:
            with p._lock:
                upkeep.collect_garbage(p.engine, garbage.ORPHAN_GRACE_SECONDS)
            done.set()

        threading.Thread(target=collect).start()
        assert done.wait(60) and started.wait(30)  # returned while the consolidation runs
        assert log.consolidation_running_for() is not None
        assert len(log.table.files()) == files_before
        release.set()
        for i in range(5, 7):
            pushed += [(i % 2, i)]
            p.push("x", pushed[-1:])
            p.step()  # its commit applies the finished consolidation
            if log.consolidation_running_for() is None:
                break
        assert log.consolidation_running_for() is None
        assert len(log.table.files()) < files_before
        assert integrated() == sorted(pushed)
        assert p.verify().ok
        started.clear()
        p.collect_garbage(0)  # a short grace: in the foreground
        assert not started.is_set() and log.consolidation_running_for() is None
        assert integrated() == sorted(pushed)


def test_garbage_is_collected_as_the_steps_rows_call_for(spark, tmp_path, monkeypatch) -> None:
    """Small steps: a collection after ``GC_MAX_COMMITS`` commits, not after
    ``GC_EVERY_COMMITS``; steps of ``GC_ROWS`` rows between them, or ``GC_MAX_STEPS`` steps
    (several a commit): after ``GC_EVERY_COMMITS``; an explicit collection starts the count
    again."""
    collections: list[int] = []
    collect = upkeep.collect_garbage

    def counted(state: Any, grace: float) -> int:
        collections.append(state.commits)
        return collect(state, grace)

    monkeypatch.setattr(upkeep, "collect_garbage", counted)
    monkeypatch.setattr(upkeep, "GC_EVERY_COMMITS", 3)
    monkeypatch.setattr(upkeep, "GC_MAX_COMMITS", 7)
    monkeypatch.setattr(upkeep, "GC_ROWS", 12)
    monkeypatch.setattr(upkeep, "GC_MAX_STEPS", 9)
    with Pipeline(circuit(), root=str(tmp_path / "root"), spark=spark,
                  driver_step_rows=10**9) as p:
        first = p.engine.commits

        def steps(count: int, rows: int) -> list[int]:
            for _ in range(count):
                p.push("x", [(i % 3, i) for i in range(rows)])
                p.step()
            return [c - first for c in collections]

        assert steps(6, 1) == []  # 6 commits, 6 rows: not due
        assert steps(1, 1) == [7]  # GC_MAX_COMMITS
        assert steps(3, 4) == [7, 10]  # 3 commits, 12 rows: due
        assert steps(2, 10) == [7, 10]  # 2 commits: not yet, however many rows
        p.collect_garbage()
        assert steps(2, 10) == [7, 10, 12]  # (the explicit one) and a fresh count
        assert steps(1, 10) == [7, 10, 12, 15]
        p.checkpoint_every = 3  # 3 commits of 9 steps: due
        assert steps(8, 1) == [7, 10, 12, 15]
        assert steps(1, 1) == [7, 10, 12, 15, 18]
