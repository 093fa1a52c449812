"""Real ``kill -9`` of a child process in the middle of the push/step/commit protocol, at random
moments, at least 50 times: after each kill the child is restarted on the same root and goes on;
in the end a consumer of the output logs sees exactly the no-kill output and every trace holds
exactly the no-kill state.

The children never start a JVM: the root is created here (which caches the circuit's analysed
schemas in it) and every step of the workload is small enough to run on the driver.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from tests.runtime.workload import consumer_view, open_pipeline, play_round, rounds

ROUNDS = 24
KILLS = 50


def test_kill_9_at_random_moments(spark, tmp_path):
    reference_root = str(tmp_path / "reference")
    with open_pipeline(reference_root, spark) as p:
        for r, pushes in enumerate(rounds(ROUNDS)):
            play_round(p, r, pushes)
    expected = consumer_view(spark, reference_root)

    env = {**os.environ, "PYTHONPATH": os.getcwd(), "SPARK_LOCAL_IP": "127.0.0.1"}
    rng = random.Random(1234)
    kills, runs, roots = 0, 0, 0
    while kills < KILLS:
        root = str(tmp_path / f"killed{roots}")
        roots += 1
        open_pipeline(root, spark).close()  # created here: the schema cache spares the JVM
        done = False
        while not done:
            child = subprocess.Popen([sys.executable, "-m", "tests.runtime.kill_child", root,
                                      str(ROUNDS)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
            runs += 1
            line = child.stdout.readline()  # "open <step>": opened and recovered
            assert line.startswith("open"), f"child did not open: {line!r}"
            finishing = int(line.split()[1]) >= ROUNDS  # only the close is left: let it be
            time.sleep(rng.uniform(0.0, 0.4))
            if child.poll() is None and not finishing:
                child.send_signal(signal.SIGKILL)
                child.wait()
                kills += 1
                continue
            out = child.stdout.read()
            child.wait()
            assert child.returncode == 0 and "done" in out, (child.returncode, out)
            done = True
        assert consumer_view(spark, root) == expected, f"root {root} differs after kills"
    assert kills >= KILLS and runs > kills
