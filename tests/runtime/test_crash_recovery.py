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

import pytest

from dbsp_pipeline import Circuit, NonDeterminismError, Pipeline
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash
from tests.runtime.workload import consumer_view, open_pipeline, play_round, rounds


def run_workload(spark, root: str, crash: tuple[str, int] | None = None,
                 then: tuple[tuple[str, int], ...] = ()) -> int:
    """Run the rounds, crashing at ``crash`` and, after each crash, at the next point of
    ``then`` (so a crash can hit the recovery itself); returns how many crashes happened."""
    crash_points.reset()
    pending = ([crash] if crash is not None else []) + list(then)
    if pending:
        crash_points.arm(*pending.pop(0))
    crashes = 0
    p = None
    r = 0
    work = rounds()
    while r < len(work):
        try:
            if p is None:
                p = open_pipeline(root, spark)
            play_round(p, r, work[r])
            r += 1
        except InjectedCrash:
            crashes, p = crashes + 1, None  # abandoned: no close, no commit
            if pending:
                crash_points.arm(*pending.pop(0))
    while True:
        try:
            p = open_pipeline(root, spark) if p is None else p
            p.close()
            return crashes
        except InjectedCrash:
            crashes, p = crashes + 1, None


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


@pytest.mark.parametrize("first, second", [
    (("trace.commit.after", 5), ("trace.restore.after", 1)),
    (("output.commit.after", 3), ("trace.restore.before", 2)),
    (("output.commit.before", 4), ("output.commit.after", 1)),  # in the replay at open
    (("trace.commit.after", 8), ("division.commit.before", 1)),
])
def test_a_crash_during_recovery_recovers_too(spark, tmp_path, reference, first, second):
    expected, _ = reference
    root = str(tmp_path)
    assert run_workload(spark, root, first, then=(second,)) == 2
    assert consumer_view(spark, root) == expected


def test_a_replay_that_differs_from_the_written_output_is_a_loud_error(spark, tmp_path):
    """A non-deterministic circuit: the step replayed after a crash gives other rows than the
    ones written before the crash; reopening reports it instead of silently diverging."""
    c = Circuit("random")
    x = c.input("x", "k BIGINT")
    c.output("noisy", x.select("k", "cast(rand() * 1000000 AS BIGINT) AS r"))
    root = str(tmp_path)
    crash_points.reset()
    p = Pipeline(c, root, spark)
    p.push("x", [(i,) for i in range(20)])
    crash_points.arm("manifest.commit.before")  # output of step 0 written, state not committed
    with pytest.raises(InjectedCrash):
        p.step()
    with pytest.raises(NonDeterminismError, match="replaying step 0"):
        Pipeline(c, root, spark)


def test_a_deterministic_replay_verifies_silently(spark, tmp_path):
    c = Circuit("steady")
    x = c.input("x", "k BIGINT, v DOUBLE")
    c.output("sums", x.group_by("k").agg(s="sum(v)", n="count(*)"))
    crash_points.reset()
    p = Pipeline(c, str(tmp_path), spark)
    p.push("x", [(i % 3, i / 7) for i in range(30)])
    crash_points.arm("manifest.commit.before")
    with pytest.raises(InjectedCrash):
        p.step()
    q = Pipeline(c, str(tmp_path), spark)
    assert [r.step for r in q.recovered_steps] == [0]
    assert q.recovered_steps[0].outputs == {"sums": None}  # discarded after verification
    q.close()
