"""The demo, end to end through Dagster on embedded defaults (``make demo``).

The shop's data feed drops batches into the inbox; for each batch the pipeline's
``shop_input_arrival`` sensor is evaluated against the Dagster instance in ``$DAGSTER_HOME``
(default ``var/dagster/home``), and the step run it requests is executed (in this process, so
no servers are needed) with the sensor's run key and tags; then the checkpoint job runs. Every
run, materialization and check lands in the instance, so ``make ui`` shows them afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def prepare_instance(home: str) -> None:
    os.makedirs(home, exist_ok=True)
    shutil.copy(os.path.join(HERE, "dagster.yaml"), os.path.join(home, "dagster.yaml"))
    os.environ["DAGSTER_HOME"] = os.path.abspath(home)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=300, help="order changes per batch")
    parser.add_argument("--fresh", action="store_true", help="start from an empty pipeline")
    args = parser.parse_args()

    os.chdir(REPO)
    sys.path[:0] = [REPO, HERE]
    var = os.path.join(REPO, "var", "dagster")
    if args.fresh:
        shutil.rmtree(var, ignore_errors=True)
    prepare_instance(os.path.join(var, "home"))
    os.environ.setdefault("DBSP_ROOT", os.path.join(var, "shop"))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    import dagster as dg

    from definitions import defs
    from demo_data import ShopFeed

    instance = dg.DagsterInstance.get()
    store = defs.resources["shop_pipeline"]
    feed = ShopFeed(store.inbox_folder)
    sensor = next(s for s in defs.sensors if s.name == "shop_input_arrival")
    step_job = defs.resolve_job_def("shop_step")
    cursor = None
    print(f"dbsp-pipeline demo through Dagster: pipeline at {store.root}, inbox "
          f"{store.inbox_folder}, instance {os.environ['DAGSTER_HOME']}\n")
    print(f"{'batch':>5} | {'run key':<44} | {'steps':>5} | {'in rows':>7} | "
          f"{'s/step':>6} | {'lag s':>6} | checks")
    for _ in range(args.batches):
        feed.next_batch(args.batch)
        context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                          resources=defs.resources)
        tick = sensor.evaluate_tick(context)
        cursor = tick.cursor or cursor
        for request in tick.run_requests:
            result = step_job.execute_in_process(instance=instance, tags={
                **request.tags, "dagster/run_key": request.run_key,
                "dagster/sensor_name": sensor.name})
            mats = {e.asset_key.to_user_string(): e.step_materialization_data.materialization
                    for e in result.get_asset_materialization_events()}
            m = {k: v.value for k, v in mats["shop/revenue_by_region"].metadata.items()}
            checks = result.get_asset_check_evaluations()
            passed = sum(c.passed for c in checks)
            print(f"{feed.batch_no - 1:>5} | {request.run_key[:44]:<44} | "
                  f"{m['steps_executed']:>5} | {m['input_rows']:>7} | "
                  f"{m['seconds_per_step']:>6.3f} | {m['lag_seconds']:>6.2f} | "
                  f"{passed}/{len(checks)} passed")
    checkpoint = defs.resolve_job_def("shop_checkpoint").execute_in_process(instance=instance)
    print(f"\ncheckpoint run {checkpoint.run_id}: {'ok' if checkpoint.success else 'FAILED'}")

    from dbsp_pipeline.examples.shop import shop_circuit

    with store.open(shop_circuit(), defs.resources["spark"]) as p:
        view = p.view_arrow("revenue_by_region").sort_by("region").to_pylist()
    print("\nrevenue_by_region (region, total, orders, largest):")
    for row in view:
        print(f"  {row['region']:<8} {row['total']:>12.2f} {row['n']:>6} {row['top']:>8.2f}")
    print("\nOpen the operator's console on this instance: make ui  "
          "(dagster dev, http://127.0.0.1:3000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
