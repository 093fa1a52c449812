"""The shop's demo data, dropped into the pipeline's inbox as a real source would.

An online shop: customers sign up, place orders, and some orders are cancelled (a cancellation
deletes the order: a record with ``_weight: -1``). Each batch is one ``.jsonl`` file per input,
written under a hidden name and renamed when complete (the inbox's rule), so a sensor or a step
never reads half a file.

    python infra/demo_data.py --inbox var/dagster/inbox --batches 5 --batch 200 --interval 0
"""

from __future__ import annotations

import argparse
import json
import os
import time

from dbsp_pipeline.examples.shop import REGIONS, ShopData


def write_batch(inbox: str, input_name: str, name: str, records: list[dict]) -> str:
    folder = os.path.join(inbox, input_name)
    os.makedirs(folder, exist_ok=True)
    tmp, final = os.path.join(folder, f".{name}.jsonl"), os.path.join(folder, f"{name}.jsonl")
    with open(tmp, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, final)
    return final


class ShopFeed:
    """Batches of shop changes; the state (next order, live orders) survives across batches by
    a small JSON file in the inbox, so repeated runs continue the same shop."""

    def __init__(self, inbox: str, customers: int = 200, seed: int = 7) -> None:
        self.inbox = inbox
        self.state_file = os.path.join(inbox, ".feed.json")
        self.data = ShopData(seed=seed, customers=customers)
        self.batch_no = 0
        if os.path.exists(self.state_file):
            with open(self.state_file) as fh:
                saved = json.load(fh)
            self.batch_no = saved["batch"]
            self.data.next_order = saved["next_order"]
            self.data.live_orders = [tuple(o) for o in saved["live_orders"]]
            self.data.rng.seed(seed + self.batch_no)

    def next_batch(self, orders: int, kafka: dict | None = None) -> list[str]:
        """One batch: the customers first (once), into the inbox; the orders into the inbox
        too, or, with ``kafka`` (client config), to the topic ``shop.orders`` as JSON records
        with an insert/delete envelope. Returns where each part went."""
        files = []
        tag = f"batch-{self.batch_no:06d}"
        if self.batch_no == 0:
            customers = [{"customer_id": c, "region": r} for c, r in self.data.customers()]
            files.append(write_batch(self.inbox, "customers", tag, customers))
        inserts, deletes = self.data.order_batch(orders)
        rows = [{"order_id": o, "customer_id": c, "amount": a} for o, c, a in inserts]
        gone = [{"order_id": o, "customer_id": c, "amount": a} for o, c, a in deletes]
        if kafka is None:
            files.append(write_batch(self.inbox, "orders", tag, rows + [
                {**r, "_weight": -1} for r in gone]))
        else:
            from confluent_kafka import Producer

            producer = Producer(kafka)
            for record in [{"insert": r} for r in rows] + [{"delete": r} for r in gone]:
                producer.produce("shop.orders", json.dumps(record).encode(),
                                 key=str(record.get("insert", record.get("delete"))
                                         ["order_id"]).encode())
            producer.flush(30)
            files.append(f"kafka topic shop.orders ({len(rows)} inserts, {len(gone)} deletes)")
        self.batch_no += 1
        os.makedirs(self.inbox, exist_ok=True)
        with open(self.state_file, "w") as fh:
            json.dump({"batch": self.batch_no, "next_order": self.data.next_order,
                       "live_orders": self.data.live_orders}, fh)
        return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inbox", default="var/dagster/inbox")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--batch", type=int, default=200, help="order changes per batch")
    parser.add_argument("--interval", type=float, default=0.0, help="seconds between batches")
    args = parser.parse_args()
    feed = ShopFeed(args.inbox)
    for i in range(args.batches):
        if i and args.interval:
            time.sleep(args.interval)
        for f in feed.next_batch(args.batch):
            print(f"wrote {f}")
    print(f"regions: {', '.join(REGIONS)}")


if __name__ == "__main__":
    main()
