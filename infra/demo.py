"""The demo, end to end through Dagster on embedded defaults (``make demo``).

A local Kafka broker is started (``infra/kafka_broker.sh``, stopped at the end). The shop's
data feed drops the customers into the inbox and sends each batch of orders (inserts and
cancellations) to the Kafka topic ``shop.orders``; for each batch the pipeline's
``shop_input_arrival`` sensor is evaluated against the Dagster instance in ``$DAGSTER_HOME``
(default ``var/dagster/home``), and the step run it requests is executed (in this process, so
no servers are needed) with the sensor's run key and tags; then the checkpoint job runs. Every
run, materialization and check lands in the instance, so ``make ui`` shows them afterwards (on
the Runs page and in the assets' events; a job's own page lists only runs a code location
launched, as the console's are, and these ran in this process).
The views go to Kafka too (``shop.<view>``, in transactions); the demo reads one back with
``read_committed`` at the end. ``--no-kafka`` feeds everything through the inbox instead.

The demo's code location is the repository's (``definitions.shop_definitions``) in a local
deployment it builds itself. It prints its own table; Dagster's run logs (and anything else
written to standard error while the runs execute) go to ``var/dagster/demo.log``, named at the
end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@contextlib.contextmanager
def stderr_to(path: str) -> Iterator[None]:
    """Standard error (file descriptor 2: Dagster's console logger, the JVM, warnings) appended
    to ``path`` inside the block, restored after it, also when the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def prepare_instance(home: str) -> None:
    os.makedirs(home, exist_ok=True)
    shutil.copy(os.path.join(HERE, "dagster.yaml"), os.path.join(home, "dagster.yaml"))
    os.environ["DAGSTER_HOME"] = os.path.abspath(home)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=300, help="order changes per batch")
    parser.add_argument("--fresh", action="store_true", help="start from an empty pipeline")
    parser.add_argument("--no-kafka", action="store_true", help="no broker: inbox files only")
    args = parser.parse_args()

    os.chdir(REPO)
    sys.path[:0] = [REPO, HERE]
    var = os.path.join(REPO, "var", "dagster")
    if args.fresh:
        shutil.rmtree(var, ignore_errors=True)
    prepare_instance(os.path.join(var, "home"))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log = os.path.join(var, "demo.log")
    if args.no_kafka:
        return run_demo(args, var, log, kafka=None)
    broker_env = {**os.environ, "DBSP_VAR": os.path.join(var, "kafka"),
                  "VENV": os.path.dirname(os.path.dirname(sys.executable))}
    from infra.console import free_port

    port = free_port()
    subprocess.run(["bash", "infra/kafka_broker.sh", "start", str(port)], env=broker_env,
                   check=True)
    try:
        return run_demo(args, var, log, kafka={"bootstrap.servers": f"127.0.0.1:{port}"})
    finally:
        subprocess.run(["bash", "infra/kafka_broker.sh", "stop"], env=broker_env, check=True)


def run_demo(args: argparse.Namespace, var: str, log: str, kafka: dict[str, str] | None) -> int:
    """Feed, sense, step, check, checkpoint in the pipeline under ``var``; print what happened,
    Dagster's logs to ``log``."""
    import dagster as dg
    from demo_data import ShopFeed

    from dbsp_pipeline.dagster import Deployment, KafkaResource
    from definitions import shop_definitions

    broker = None if kafka is None else KafkaResource(bootstrap_servers=kafka["bootstrap.servers"])
    defs = shop_definitions(Deployment.local(var, kafka=broker))
    instance = dg.DagsterInstance.get()
    store = defs.resources["shop_pipeline"]
    feed = ShopFeed(store.inbox_folder)
    sensor = next(s for s in defs.sensors if s.name == "shop_input_arrival")
    step_job = defs.resolve_job_def("shop_step")
    cursor = None
    print(f"dbsp-pipeline demo through Dagster: pipeline at {store.root}, inbox "
          f"{store.inbox_folder}, instance {os.environ['DAGSTER_HOME']}\n")
    print(f"{'batch':>5} | {'steps':>5} | {'in rows':>7} | {'s/step':>6} | {'lag s':>6} | "
          f"{'checks':<10} | run key (pipeline@state:from-step-N:input versions)")
    for _ in range(args.batches):
        feed.next_batch(args.batch, kafka=kafka)
        context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                          resources=defs.resources)
        with stderr_to(log):
            tick = sensor.evaluate_tick(context)
        cursor = tick.cursor or cursor
        for request in tick.run_requests:
            with stderr_to(log):
                result = step_job.execute_in_process(instance=instance, tags={
                    **request.tags, "dagster/run_key": request.run_key,
                    "dagster/sensor_name": sensor.name})
            mats = {e.asset_key.to_user_string(): e.step_materialization_data.materialization
                    for e in result.get_asset_materialization_events()}
            m = {k: v.value for k, v in mats["shop/revenue_by_region"].metadata.items()}
            checks = result.get_asset_check_evaluations()
            passed = sum(c.passed for c in checks)
            print(f"{feed.batch_no - 1:>5} | {m['steps_executed']:>5} | "
                  f"{m['input_rows']:>7} | {m['seconds_per_step']:>6.3f} | "
                  f"{m['lag_seconds']:>6.2f} | {f'{passed}/{len(checks)} passed':<10} | "
                  f"{request.run_key}")
    with stderr_to(log):
        checkpoint = defs.resolve_job_def("shop_checkpoint").execute_in_process(
            instance=instance)
    print(f"\ncheckpoint run {checkpoint.run_id}: {'ok' if checkpoint.success else 'FAILED'}")

    from dbsp_pipeline.examples.shop import shop_circuit

    with stderr_to(log), store.open(shop_circuit(), defs.resources["spark"]) as p:
        view = p.view_arrow("revenue_by_region").sort_by("region").to_pylist()
    print("\nrevenue_by_region (region, total, n, top):")
    for row in view:
        print(f"  {row['region']:<8} {row['total']:>12.2f} {row['n']:>6} {row['top']:>8.2f}")
    if kafka is not None:
        print_topic(kafka, "shop.revenue_by_region")
    print(f"\nDagster's logs of these runs: {log}")
    print("Open the operator's console on this instance: make ui  "
          "(dagster dev, http://127.0.0.1:3000)")
    return 0


def print_topic(kafka: dict, topic: str) -> None:
    """What a read_committed consumer sees on ``topic``: records per step."""
    from collections import Counter

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**kafka, "group.id": "demo-reader", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    per_step: Counter = Counter()
    while True:
        batch = c.consume(1000, 2.0)
        if not batch:
            break
        for m in batch:
            if not m.error():
                per_step[int(dict(m.headers())["dbsp.step"])] += 1
    c.close()
    print(f"\nKafka topic {topic} (read_committed): records per step "
          f"{dict(sorted(per_step.items()))}")


if __name__ == "__main__":
    sys.exit(main())
