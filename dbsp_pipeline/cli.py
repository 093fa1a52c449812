"""Command line: ``python -m dbsp_pipeline demo`` runs the shop demo on embedded defaults;
``python -m dbsp_pipeline status --root ROOT`` says what a root holds, read without opening it;
``python -m dbsp_pipeline verify --root ROOT`` checks a pipeline root's storage (every table,
every retained checkpoint; ``storage/verify.py``) and exits 1 when it is damaged. ROOT is a
local folder or ``s3://bucket/prefix`` (the store the ``AWS_*`` environment names)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import pyarrow as pa

from dbsp_pipeline.errors import RootInUseError, StorageError
from dbsp_pipeline.root import ROOT_ENTRIES, circuit_description, exists
from dbsp_pipeline.storage import small_files
from dbsp_pipeline.storage.small_files import remove_folder


def demo(root: str, steps: int, batch: int, fresh: bool) -> int:
    """Run the shop demo at ``root`` (afresh unless ``fresh`` is False); 2 when ``root`` holds
    something else than the demo's pipeline, which it never deletes."""
    from dbsp_pipeline import Pipeline
    from dbsp_pipeline.examples.shop import ShopData, shop_circuit
    from dbsp_pipeline.runtime.results import operator_summary, phase_summary

    if fresh and small_files.exists(root):
        recorded = small_files.exists(circuit_description(root, shop_circuit().fingerprint()))
        if not recorded and (small_files.is_remote(root) or os.listdir(root)):
            print(f"dbsp-pipeline demo: {root} holds something else than the demo's pipeline "
                  "(the demo starts afresh by deleting its root): give another --root",
                  file=sys.stderr)
            return 2
        foreign = [n for n in os.listdir(root) if n not in ROOT_ENTRIES] \
            if not small_files.is_remote(root) else []
        if foreign:
            print(f"dbsp-pipeline demo: {root} holds the demo's pipeline and other files "
                  f"({', '.join(sorted(foreign)[:5])}): the demo deletes its root to start "
                  "afresh, so it leaves this one; give another --root", file=sys.stderr)
            return 2
        remove_folder(root)
    data = ShopData(customers=200)
    print(f"dbsp-pipeline demo: the shop circuit at {root} (local Spark, Delta tables at the "
          "root)")
    started = time.monotonic()
    with Pipeline(shop_circuit(), root=root) as p:
        print(f"opened in {time.monotonic() - started:.1f}s at state version {p.state_version}, "
              f"next step {p.next_step}")
        if p.next_step == 0:
            p.push("customers", data.customers())
        results = []
        for _ in range(steps):
            inserts, deletes = data.order_batch(batch)
            p.push("orders", inserts)
            if deletes:
                p.push("orders", deletes, weight=-1)
            r = p.step()
            results.append(r)
            print(f"step {r.step}: in {r.inputs} -> changed {r.outputs} ({r.seconds:.1f}s; "
                  f"{r.path_reason or ('driver' if r.on_driver else 'Spark')})")
        if results:  # where the steps' time went (StepResult.phase_seconds, operator_seconds)
            print(f"a step on average: {phase_summary(results)}; slowest operators: "
                  f"{operator_summary(results)}")
        # read on the driver (no Spark read: a root in an object store needs no Hadoop S3A)
        print("\nrevenue_by_region:")
        _show(p.view_arrow("revenue_by_region").sort_by("region"))
        if p.next_step > 0:
            print("changes of revenue_by_region in the last step:")
            _show(p.step_changes_arrow("revenue_by_region", p.next_step - 1)
                  .sort_by([("region", "ascending"), ("_weight", "ascending")]))
    return 0


def _show(table: pa.Table) -> None:
    """Print ``table`` as aligned columns, one line a row."""
    rows = [table.column_names] + [[str(v) for v in r.values()] for r in table.to_pylist()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(table.column_names))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


def status(root: str, retained: int, as_json: bool) -> int:
    """Print what the pipeline root ``root`` holds, read without opening it (a pipeline running
    it goes on undisturbed): its circuit's inputs and views, the next step, per input the pushes
    not yet in a step, and the retained checkpoints. 0, or 2 when there is no pipeline root
    there or the store cannot be reached (said on stderr)."""
    from dbsp_pipeline.root import newest_entry, read_status
    from dbsp_pipeline.storage.verify import retained_checkpoints

    try:
        if not exists(root):
            print(f"dbsp-pipeline status: no pipeline root at {root}", file=sys.stderr)
            return 2
        entry = newest_entry(root) or {}
        described = small_files.read_text(circuit_description(root, entry.get("fingerprint", "")))
        circuit = json.loads(described) if described else {}
        inputs, views = sorted(circuit.get("inputs", {})), sorted(circuit.get("outputs", {}))
        current = read_status(root, inputs)
        checkpoints = retained_checkpoints(root, retained)
    except (StorageError, OSError, ValueError) as e:
        print(f"dbsp-pipeline status: {e}", file=sys.stderr)
        return 2
    now = time.time()
    report: dict[str, Any] = {
        "root": root, "pipeline_id": current.pipeline_id, "circuit": circuit.get("name"),
        "state_version": entry.get("version"), "next_step": entry.get("step"),
        "divided_steps": current.divided_steps, "views": views,
        "inputs": {n: {"log_version": current.versions[n], "pending_pushes": current.pending[n]}
                   for n in inputs},
        "oldest_pending_seconds": (None if current.oldest_pending is None
                                   else round(now - current.oldest_pending, 1)),
        "checkpoints": [{"version": v, "after_step": s - 1} for v, s in checkpoints]}
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"pipeline root {root}: circuit '{report['circuit']}', state version "
          f"{report['state_version']} (taken before step {report['next_step']}), "
          f"{current.divided_steps} steps divided (id {current.pipeline_id[:8]})")
    for name, info in report["inputs"].items():
        waiting = info["pending_pushes"]
        print(f"  input {name}: log version {info['log_version']}, "
              + (f"{waiting} pushes not yet in a step" if waiting else "nothing waits"))
    if report["oldest_pending_seconds"] is not None:
        print(f"  the oldest waiting push is {report['oldest_pending_seconds']} s old")
    print(f"  views: {', '.join(views)}")
    print("  checkpoints (newest first): " + ", ".join(
        f"{c['version']} (after step {c['after_step']})" if c["after_step"] >= 0 else
        f"{c['version']} (before any step)" for c in report["checkpoints"]))
    return 0


def verify(root: str, retained: int, as_json: bool) -> int:
    """Print the verification report of ``root``; 0 when it is intact, 1 when damaged, 2 when
    there is no pipeline root there (no manifest: a local path or ``s3://bucket/prefix``
    where no pipeline was opened), the store cannot be reached, or a pipeline running the root
    kept moving it while it was checked (said on stderr)."""
    from dbsp_pipeline.storage.verify import verify_root

    try:
        if not exists(root):
            print(f"dbsp-pipeline verify: no pipeline root at {root}", file=sys.stderr)
            return 2
        report = verify_root(root, retained)
    except (StorageError, RootInUseError) as e:  # an s3:// root with wrong AWS_* settings; a
        print(f"dbsp-pipeline verify: {e}", file=sys.stderr)  # root a pipeline is running
        return 2
    print(json.dumps(report.to_dict(), indent=2) if as_json else report.describe())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbsp-pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run the shop demo pipeline on embedded defaults")
    d.add_argument("--steps", type=int, default=5)
    d.add_argument("--batch", type=int, default=500)
    d.add_argument("--root", default="var/demo",
                   help="the demo's pipeline root (deleted first unless --keep; a folder "
                   "holding anything else is refused)")
    d.add_argument("--keep", action="store_true", help="continue the pipeline at --root")
    for name, what in (("status", "what a pipeline root holds (read without opening it: a "
                                  "running pipeline goes on)"),
                       ("verify", "check a pipeline root's tables and checkpoints for damaged "
                                  "storage (exit 1 if damaged)")):
        reader = sub.add_parser(name, help=what)
        reader.add_argument("--root", required=True)
        reader.add_argument("--retained", type=int, default=2,
                            help="of how many steps the pipeline retains checkpoints "
                            "(retain_checkpoints)")
        reader.add_argument("--json", action="store_true", help="print it as JSON")
    args = parser.parse_args(argv)
    if args.command == "verify":
        return verify(args.root, args.retained, args.json)
    if args.command == "status":
        return status(args.root, args.retained, args.json)
    if args.command == "demo":
        return demo(args.root, args.steps, args.batch, fresh=not args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
