"""A pipeline's progress read from its tables without opening it: no Spark, no writes.

A sensor (or an operator's shell) asks ``read_status(root, inputs)`` how far input has been
divided into steps and how many pushes wait for the next step. Opening a ``Pipeline`` would
instead recover it, and could fence a running one; reading status never does either.

The figures are a snapshot: a push or a step may commit right after it is taken, so a caller
uses them to decide whether to start a step, never to decide what a step reads (the step's own
division, recorded durably, does that).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pyarrow.parquet as pq
from deltalake import DeltaTable

from dbsp_pipeline.runtime import division_log
from dbsp_pipeline.storage.state_db import MANIFEST_DIR


@dataclass(frozen=True)
class PipelineStatus:
    """``divided_steps`` steps have their input fixed (the next step to divide is that number);
    per input, ``versions`` is the log's newest version, ``divided`` the version the last
    division read up to, ``pending`` how many pushes since then, and ``oldest_pending`` the
    commit time (seconds since the epoch) of the oldest of them."""

    root: str
    #: the id of this pipeline's state (its manifest table's): a root deleted and created
    #: again is another pipeline, whose steps are other work ("" before the first open)
    pipeline_id: str
    divided_steps: int
    versions: dict[str, int]
    divided: dict[str, int]
    pending: dict[str, int]
    oldest_pending: float | None

    @property
    def has_pending_input(self) -> bool:
        return any(self.pending.values())

    def run_key(self, pipeline: str) -> str:
        """A key naming the step range a run would cover: the next step and the input versions
        it would read up to (equal keys: the same work)."""
        versions = ",".join(f"{n}={v}" for n, v in sorted(self.versions.items()))
        return f"{pipeline}@{self.pipeline_id[:8]}:from-step-{self.divided_steps}:{versions}"


def read_status(root: str, inputs: list[str]) -> PipelineStatus:
    """The status of the pipeline at ``root`` with inputs ``inputs`` (a root that does not exist
    yet has nothing divided and nothing pending)."""
    root = os.path.abspath(root)
    divided_steps, divided = _last_division(os.path.join(root, "_divisions"))
    versions, pending, oldest = {}, {}, None
    for name in inputs:
        uri = os.path.join(root, "inputs", name)
        version = DeltaTable(uri).version() if DeltaTable.is_deltatable(uri) else 0
        lower = divided.get(name, 0)
        pushes = [t for t in (_data_commit_time(uri, v) for v in range(lower + 1, version + 1))
                  if t is not None]
        versions[name], pending[name] = version, len(pushes)
        if pushes:
            oldest = min(pushes) if oldest is None else min(oldest, *pushes)
    manifest = os.path.join(root, MANIFEST_DIR)
    pipeline_id = (DeltaTable(manifest).metadata().id
                   if DeltaTable.is_deltatable(manifest) else "")
    return PipelineStatus(root, pipeline_id, divided_steps, versions,
                          {n: divided.get(n, 0) for n in inputs}, pending, oldest)


def _last_division(uri: str) -> tuple[int, dict[str, int]]:
    if not DeltaTable.is_deltatable(uri):
        return 0, {}
    last, uppers = -1, {}
    for path in DeltaTable(uri).file_uris():
        for row in pq.read_table(path.removeprefix("file://")).to_pylist():
            if row["step"] > last:
                last, uppers = row["step"], division_log.parse(row["uppers"])[0]
    return last + 1, uppers


def _data_commit_time(uri: str, version: int) -> float | None:
    """The commit time of ``version`` if it added data (a push), else None (a rewrite)."""
    try:
        with open(os.path.join(uri, "_delta_log", f"{version:020d}.json")) as fh:
            actions = [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return None
    if not any(a.get("add", {}).get("dataChange", False) for a in actions):
        return None
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    return info.get("timestamp", 0) / 1000.0
