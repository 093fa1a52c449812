"""Real ``kill -9`` of a child process in the middle of the push/step/commit protocol, at random
moments, at least 50 times: after each kill the child is restarted on the same root and goes on;
in the end a consumer of the output logs sees exactly the no-kill output and every trace holds
exactly the no-kill state.

The children never start a JVM: the root is created here (which caches the circuit's analysed
schemas in it) and every step of the workload is small enough to run on the driver. They are
forked from a fork server that imported the package once (``tests/forked_children.py``), so the
test's time goes to the workload and its recoveries, not to 60 imports of pyarrow, DuckDB and
Delta.
"""

from __future__ import annotations

import random
import time

from tests import forked_children
from tests.runtime import kill_child
from tests.runtime.workload import consumer_view, open_pipeline, play_round, rounds

ROUNDS = 24
KILLS = 50
#: seconds a child may take to open (recover) or to finish its rounds
PATIENCE = 120


def test_kill_9_at_random_moments(spark, tmp_path):
    reference_root = str(tmp_path / "reference")
    with open_pipeline(reference_root, spark) as p:
        for r, pushes in enumerate(rounds(ROUNDS)):
            play_round(p, r, pushes)
    expected = consumer_view(spark, reference_root)

    rng = random.Random(1234)
    kills, runs, roots = 0, 0, 0
    while kills < KILLS:
        root = str(tmp_path / f"killed{roots}")
        roots += 1
        open_pipeline(root, spark).close()  # created here: the schema cache spares the JVM
        done = False
        while not done:
            child, reports = forked_children.start(kill_child.main, root, ROUNDS)
            runs += 1
            try:
                assert reports.poll(PATIENCE), "child did not open"
                said = reports.recv()  # ("open", step): opened and recovered
                assert said[0] == "open", said
                finishing = said[1] >= ROUNDS  # only the close is left: let it be
                time.sleep(rng.uniform(0.0, 0.4))
                if child.is_alive() and not finishing:
                    forked_children.kill(child)
                    kills += 1
                else:
                    child.join(PATIENCE)
                    assert child.exitcode == 0, child.exitcode
                    assert reports.recv() == ("done", ROUNDS)
                    done = True
            except EOFError:  # it ended without a word more
                raise AssertionError(f"child ended early (exit code {child.exitcode})") from None
            finally:
                forked_children.kill(child)  # (a failed assertion: leave no child on the root)
                reports.close()
        assert consumer_view(spark, root) == expected, f"root {root} differs after kills"
    assert kills >= KILLS and runs > kills
