"""Command line: ``python -m dbsp_pipeline demo`` runs the shop demo on embedded defaults;
``python -m dbsp_pipeline verify --root ROOT`` checks a pipeline root's storage (every table,
every retained checkpoint; ``storage/verify.py``) and exits 1 when it is damaged."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time


def demo(root: str, steps: int, batch: int, fresh: bool) -> None:
    from dbsp_pipeline import Pipeline
    from dbsp_pipeline.examples.shop import ShopData, shop_circuit

    if fresh:
        shutil.rmtree(root, ignore_errors=True)
    data = ShopData(customers=200)
    print(f"dbsp-pipeline demo: the shop circuit at {root} (local Spark, Delta tables on disk)")
    started = time.monotonic()
    with Pipeline(shop_circuit(), root=root) as p:
        print(f"opened in {time.monotonic() - started:.1f}s at state version {p.state_version}, "
              f"next step {p.next_step}")
        if p.next_step == 0:
            p.push("customers", data.customers())
        for _ in range(steps):
            inserts, deletes = data.order_batch(batch)
            p.push("orders", inserts)
            if deletes:
                p.push("orders", deletes, weight=-1)
            r = p.step()
            print(f"step {r.step}: in {r.inputs} -> changed {r.outputs} ({r.seconds:.1f}s)")
        print("\nrevenue_by_region:")
        p.view("revenue_by_region").orderBy("region").show(truncate=False)
        print("changes of revenue_by_region in the last step:")
        p.changes("revenue_by_region", since=p.next_step - 1).orderBy("region", "_weight").show(
            truncate=False)


def verify(root: str, retained: int, as_json: bool) -> int:
    """Print the verification report of ``root``; 0 when it is intact, 1 when damaged, 2 when
    there is no pipeline root there (a local path or ``s3://bucket/prefix``)."""
    from dbsp_pipeline.storage.small_files import is_remote, list_folders, list_names
    from dbsp_pipeline.storage.verify import verify_root

    if not (list_folders(root) or list_names(root) if is_remote(root) else os.path.isdir(root)):
        print(f"dbsp-pipeline verify: no pipeline root at {root}", file=sys.stderr)
        return 2
    report = verify_root(root, retained)
    print(json.dumps(report.to_dict(), indent=2) if as_json else report.describe())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbsp-pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run the shop demo pipeline on embedded defaults")
    d.add_argument("--root", default="var/demo")
    d.add_argument("--steps", type=int, default=5)
    d.add_argument("--batch", type=int, default=500)
    d.add_argument("--keep", action="store_true", help="continue the pipeline at --root")
    v = sub.add_parser("verify", help="check a pipeline root's tables and checkpoints for "
                       "damaged storage (exit 1 if damaged)")
    v.add_argument("--root", required=True)
    v.add_argument("--retained", type=int, default=2,
                   help="how many checkpoints the pipeline retains (retain_checkpoints)")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.command == "verify":
        return verify(args.root, args.retained, args.json)
    if args.command == "demo":
        demo(args.root, args.steps, args.batch, fresh=not args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
