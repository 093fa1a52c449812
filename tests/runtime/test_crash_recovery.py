"""Crash injection at every durable action of the push, step and commit protocol.

A workload of rounds (idempotent pushes, then a step) runs once without a crash; then, for every
crash point the workload passes (and several passes of each), it runs again with a crash there:
the pipeline object is abandoned as a dead process would leave it, the root is reopened (which
re-executes the divided but uncommitted steps), the producer re-pushes the round it was in
(its sequence numbers make that exactly-once) and the workload goes on. Afterwards a consumer
of the output logs must see exactly the no-crash output, step by step, and every trace must
hold exactly the no-crash state.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pytest

from dbsp_pipeline import Circuit, NonDeterminismError, Pipeline
from dbsp_pipeline.storage import crash_points, delta_store, state_db
from dbsp_pipeline.storage.crash_points import InjectedCrash
from dbsp_pipeline.storage.verify import verify_root
from tests.runtime.workload import (
    circuit,
    consumer_view,
    open_pipeline,
    play_round,
    play_round_carried,
    rounds,
)


@pytest.fixture(scope="module", autouse=True)
def fold_often():
    """State tables fold their staged actions at every other checkpoint, so the workload passes
    fold commits (``trace.commit.*``) and checkpoints that record staged actions alike."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(state_db, "FOLD_ACTIONS", 2)
        yield


def run_workload(spark, root: str, crash: tuple[str, int] | None = None,
                 then: tuple[tuple[str, int], ...] = (), *, collect_garbage: bool = False,
                 also: tuple[tuple[str, int], ...] = (),
                 after_crash: Callable[[], None] | None = None,
                 opener: Callable[[str, object], Pipeline] = open_pipeline,
                 play: Callable[..., object] = play_round) -> int:
    """Run the rounds, crashing at ``crash`` and, after each crash, at the next point of
    ``then`` (so a crash can hit the recovery itself); returns how many crashes happened.
    ``also``: more points armed from the start, each counting its passes from there.
    ``collect_garbage``: garbage is collected after every round (division compaction and Delta
    log cleanup included). ``after_crash`` looks at the root as each crash left it. ``opener``
    opens the root (at first and after each crash); ``play`` plays a round."""
    crash_points.reset()
    pending = ([crash] if crash is not None else []) + list(then)
    if pending:
        crash_points.arm(*pending.pop(0))
    for point in also:
        crash_points.arm(*point)
    crashes = 0
    p = None
    r = 0
    work = rounds()
    while r < len(work):
        try:
            if p is None:
                p = opener(root, spark)
            play(p, r, work[r])
            if collect_garbage:
                p.collect_garbage()
            r += 1
        except InjectedCrash:
            crashes, p = crashes + 1, None  # abandoned: no close, no commit
            if after_crash is not None:
                after_crash()
            if pending:
                crash_points.arm(*pending.pop(0))
    while True:
        try:
            p = opener(root, spark) if p is None else p
            p.close()
            return crashes
        except InjectedCrash:
            crashes, p = crashes + 1, None
            if after_crash is not None:
                after_crash()


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("no-crash"))
    assert not run_workload(spark, root)
    passes = crash_points.passes()  # of the workload (the consumer view recomputes: more)
    return consumer_view(spark, root), passes




def test_every_crash_point_recovers_to_the_no_crash_output_and_state(spark, tmp_path, reference):
    expected, passes = reference
    points = sorted(passes)
    # The protocol's durable actions all appear in the workload.
    for required in ("input.commit.before", "input.commit.after", "division.commit.before",
                     "division.commit.after", "trace.commit.before", "trace.commit.after",
                     "output.commit.before", "output.commit.after", "manifest.commit.before",
                     "manifest.commit.after"):
        assert required in points, required
    cases = []
    for point in points:
        n = passes[point]
        cases += [(point, k) for k in sorted({1, (n + 1) // 2, n})]
    failures = []
    for i, (point, k) in enumerate(cases):
        root = str(tmp_path / f"case{i}")
        crashed = run_workload(spark, root, (point, k))
        assert crashed, f"{point} pass {k} was not reached"
        got = consumer_view(spark, root)
        if got != expected:
            failures.append((point, k))
    assert not failures, f"recovery differs from the no-crash run after crashes at {failures}"
    assert len(cases) >= 25


def test_every_crash_point_of_steps_carrying_their_pushes_recovers(spark, tmp_path, reference):
    """Rounds played as steps that carry their pushes (committed in a background thread while
    the step computes): a crash at every durable action they pass, at its first and its middle
    pass, recovers to exactly the output and state of the no-crash run of push-then-step
    rounds (the producer's numbers make the repeated round push nothing twice)."""
    expected, _ = reference
    assert not run_workload(spark, str(tmp_path / "no-crash"), play=play_round_carried)
    passes = crash_points.passes()
    assert consumer_view(spark, str(tmp_path / "no-crash")) == expected
    assert {"input.commit.before", "input.commit.after", "manifest.commit.after"} <= set(passes)
    cases = [(point, k) for point in sorted(passes)
             for k in sorted({1, (passes[point] + 1) // 2})]
    failures = []
    for i, (point, k) in enumerate(cases):
        root = str(tmp_path / f"case{i}")
        assert run_workload(spark, root, (point, k), play=play_round_carried), (point, k)
        if consumer_view(spark, root) != expected:
            failures.append((point, k))
    assert not failures, f"recovery differs from the no-crash run after crashes at {failures}"


def open_on_spark(root: str, spark) -> Pipeline:
    """The workload's pipeline with every step forced onto Spark: at the root's W=2, its
    stateful operators run as one Spark task per owner, steps replayed at open too."""
    return Pipeline(circuit(), root, spark, checkpoint_every=2, compact_threshold=3,
                    driver_step_rows=0)


def test_every_step_crash_point_recovers_at_two_workers_with_per_owner_tasks(
        spark, tmp_path, reference):
    """At W=2, every step on Spark with one task per owner (tasks add no durable action, so
    the step's durable actions are the driver path's): a crash at every durable action of the
    step and its commit recovers, through steps per owner again (replays included), to exactly
    the output and state of the no-crash run at W=1 on the driver. Lean: two runs, one with a
    crash before each action and one after, each crash at a pass in the middle of the workload
    (the driver path enumerates every point at several passes above)."""
    expected, passes = reference
    points = sorted(p for p in passes if not p.startswith("input."))  # pushes: no Spark
    assert {"division.commit.after", "trace.commit.after", "manifest.commit.after"} <= set(points)
    failures = []
    for when in ("before", "after"):
        armed = tuple((p, (passes[p] + 1) // 2) for p in points if p.endswith(when))
        root = str(tmp_path / when)
        with open_pipeline(root, spark) as p:
            p.rescale(2)
        reasons: list[str] = []

        def opener(root: str, spark, reasons: list[str] = reasons) -> Pipeline:
            p = open_on_spark(root, spark)
            reasons.extend(r.path_reason for r in p.recovered_steps)
            return p

        crashed = run_workload(spark, root, also=armed, opener=opener)
        assert crashed == len(armed), f"only {crashed} of the crashes {armed} happened"
        assert reasons and all("per owner (W=2)" in r for r in reasons), reasons
        if consumer_view(spark, root) != expected:
            failures.append(armed)
    assert not failures, f"recovery differs from the no-crash run after crashes at {failures}"


# -- Delta log cleanup ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cleanup_reference(spark, tmp_path_factory):
    """The workload with garbage collected after every round and a Delta checkpoint every 3
    commits of every table (the tables' configuration, set when the workload creates them), so
    that every role's log is cleaned up, several files at a time, while steps go on."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(delta_store.DEFAULT_CONFIGURATION, "delta.checkpointInterval", "3")
        root = str(tmp_path_factory.mktemp("no-crash-cleanup"))
        assert not run_workload(spark, root, collect_garbage=True)
        passes = crash_points.passes()
    return consumer_view(spark, root), passes


_LOG_FILE = re.compile(r"^(\d{20})\.")


def log_problems(root: str) -> list[str]:
    """What is wrong with the Delta logs under ``root`` as a crash left them: damage verify
    finds, and a log whose versions do not form one run up to its newest commit (a cleanup
    must delete oldest first, so that a crash leaves a log that merely starts later)."""
    report = verify_root(root)
    problems = [str(d) for d in report.damage]
    if len(report.checkpoints) != 2:  # retain_checkpoints: the older one is still readable
        problems.append(f"retained checkpoints {[c.version for c in report.checkpoints]}")
    for folder, _, names in os.walk(root):
        if os.path.basename(folder) == "_delta_log":
            commits = sorted({int(m[1]) for n in names if (m := _LOG_FILE.match(n))
                              and n.endswith(".json")})
            if commits and commits != list(range(commits[0], commits[-1] + 1)):
                problems.append(f"{folder}: commits {commits}")
    return problems


def test_a_crash_at_every_delta_log_cleanup_point_recovers(spark, tmp_path, cleanup_reference):
    """Crash before, between the deletions of and after every role's log cleanup: the root as
    each crash left it is undamaged and its logs have no hole, and reopening recovers to the
    no-crash output and state. One run per place in the cleanup (lean): it crashes in every
    role's cleanup, at the cleanup halfway through the workload (counting the cleanups again
    after each crash)."""
    expected, passes = cleanup_reference
    roles = ("input", "division", "output", "manifest", "trace")  # the order GC cleans them
    failures = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(delta_store.DEFAULT_CONFIGURATION, "delta.checkpointInterval", "3")
        for when in ("before", "between", "after"):
            points = [f"{role}.cleanup.{when}" for role in roles]
            assert all(passes[p] for p in points), passes  # every role's log is cleaned up
            armed = tuple((p, (passes[p] + 1) // 2) for p in points)
            root = str(tmp_path / when)
            seen: list[str] = []

            def look(root: str = root, seen: list[str] = seen) -> None:
                seen.extend(log_problems(root))

            crashed = run_workload(spark, root, also=armed, collect_garbage=True,
                                   after_crash=look)
            assert crashed == len(armed), f"only {crashed} of the crashes {armed} happened"
            if seen or consumer_view(spark, root) != expected:
                failures.append((armed, seen))
    assert not failures, f"recovery differs from the no-crash run after crashes at {failures}"


@pytest.mark.parametrize("first, second", [
    (("trace.commit.after", 5), ("trace.restore.after", 1)),
    (("trace.commit.after", 2), ("trace.restore.before", 1)),  # a fold before its checkpoint
    (("division.commit.after", 2), ("manifest.commit.before", 1)),  # in the replay at open
    (("trace.commit.after", 8), ("division.commit.before", 1)),
])
def test_a_crash_during_recovery_recovers_too(spark, tmp_path, reference, first, second):
    expected, _ = reference
    root = str(tmp_path)
    assert run_workload(spark, root, first, then=(second,)) == 2
    assert consumer_view(spark, root) == expected


def test_a_replay_that_differs_from_the_written_output_is_a_loud_error(spark, tmp_path,
                                                                       monkeypatch):
    """A non-deterministic circuit: the step replayed after a crash gives other rows than the
    ones written before the crash; reopening reports it instead of silently diverging. (The
    analysis refuses ``rand()``: here it is let through, as an older engine did, to stand for
    what no analysis sees, such as a changed library under the same expression.)"""
    from dbsp_pipeline.runtime import plan

    c = Circuit("random")
    x = c.input("x", "k BIGINT")
    c.output("noisy", x.select("k", "cast(rand() * 1000000 AS BIGINT) AS r"))
    root = str(tmp_path)
    crash_points.reset()
    with monkeypatch.context() as m:
        m.setattr(plan, "_changing_function", lambda df: None)
        p = Pipeline(c, root, spark, checkpoint_every=2)  # (its schemas cached: not again)
    p.push("x", [(i,) for i in range(20)])
    crash_points.arm("division.commit.after")  # step 0's record written, state not committed
    with pytest.raises(InjectedCrash):
        p.step()
    with pytest.raises(NonDeterminismError, match="replaying step 0"):
        Pipeline(c, root, spark)


def test_a_deterministic_replay_verifies_silently(spark, tmp_path):
    c = Circuit("steady")
    x = c.input("x", "k BIGINT, v DOUBLE")
    c.output("sums", x.group_by("k").agg(s="sum(v)", n="count(*)"))
    crash_points.reset()
    p = Pipeline(c, str(tmp_path), spark, checkpoint_every=2)
    p.push("x", [(i % 3, i / 7) for i in range(30)])
    crash_points.arm("division.commit.after")  # step 0's record written, state not committed
    with pytest.raises(InjectedCrash):
        p.step()
    q = Pipeline(c, str(tmp_path), spark)
    assert [r.step for r in q.recovered_steps] == [0]
    assert q.recovered_steps[0].outputs == {"sums": None}  # discarded after verification
    q.close()
