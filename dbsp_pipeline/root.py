"""A pipeline root: every folder and file in it named once, and the root read without opening it.

Layout of a pipeline root (every name below is spelled only here)::

    _manifest/              the state database's manifest (one entry per state version)
    _divisions/             the division of input into steps (``runtime/division_log.py``)
    _errors/                records left out of the input (bad records, quarantined steps)
    _readers/               the leases of live readers (``runtime/readers.py``)
    _plan_schemas.json      the schemas Spark analysed for the circuit (``runtime/plan.py``)
    _circuits/<fp>.json     the description of every circuit that ran here, by fingerprint
                            (what an upgrade compares a new circuit with,
                            ``runtime/circuit_upgrade.py``)
    _upgrade_scratch/<id>/  an upgrade's throwaway state (``runtime/circuit_upgrade.py``)
    _exchange/<step>-<id>/  the changes a Spark step's owner stages hand each other as files
                            (``runtime/exchange.py``): a step's, removed when it ends (and
                            at open, after a crash)
    inputs/<name>/          the durable log of each input (one Delta version per push)
    state/<trace>/          the traces of the stateful operators
    outputs/<name>/         the change log of each output view (``_step`` and ``_weight``)
    _local/                 what this machine derived from the root and can rebuild: the keyed
                            runs of big trace files (``storage/keyed_runs.py``); an object-store
                            root keeps it on local disk instead (``local_folder``)

Inside every table are Delta's ``_delta_log/``, the engine's data files (``data/``, named in
``storage/delta_table.py``) and, after damage was set aside, ``_dbsp_set_aside/``
(``storage/set_aside.py``): those belong to the table code, which knows nothing of roots.

This module sits below storage, runtime and connectors as far as names go (each of them builds
its paths with the functions here); its readers use the table code and the division log's
read-only reader, neither of which imports this module.

The readers here (``read_status``, ``read_lag``, ``read_pipeline_id``, ``exists``) never open
the pipeline: no Spark, no writes, no fencing of a running process. They read any root, local
or ``s3://bucket/prefix`` (the store the ``AWS_*`` environment names), through delta-rs and
``storage/small_files.py``, never from the local disk alone. A sensor calls them every few
seconds, so their cost is bounded by what compaction keeps (``DivisionLog.compact_below``), not
by the number of steps ever run. Their figures are a snapshot: a push or a step may commit
right after, so a caller uses them to decide whether to start a step, never to decide what a
step reads (the step's own division, recorded durably, does that).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from dbsp_pipeline.runtime.division_log import CARRIED_RECORDS_KEY, read_last
from dbsp_pipeline.storage.delta_table import (
    data_commit_times,
    delta_log,
    newest_rows,
    table_id,
    table_version,
)
from dbsp_pipeline.storage.small_files import is_remote
from dbsp_pipeline.storage.table_store import root_uri

#: the state database's manifest table
MANIFEST = "_manifest"
#: the division log table
DIVISIONS = "_divisions"
#: the errors table
ERRORS = "_errors"
#: the folder of reader leases
READERS = "_readers"
#: the file caching the schemas Spark analysed for the circuit
PLAN_SCHEMAS = "_plan_schemas.json"
#: the folder of the descriptions of the circuits that ran at a root
CIRCUITS = "_circuits"
#: the folder of upgrades' throwaway state
UPGRADE_SCRATCH = "_upgrade_scratch"
#: the folder of the changes owner stages hand each other during a Spark step
EXCHANGE = "_exchange"
#: the folder of the input logs (one table per input)
INPUTS = "inputs"
#: the folder of the state tables (one table per trace)
STATE = "state"
#: the folder of the output logs (one table per output view)
OUTPUTS = "outputs"
#: the folder of what this machine derived from the root and can rebuild from it (keyed runs)
LOCAL = "_local"
#: every name a pipeline root holds at its top
ROOT_ENTRIES = frozenset({MANIFEST, DIVISIONS, ERRORS, READERS, PLAN_SCHEMAS, CIRCUITS,
                          UPGRADE_SCRATCH, EXCHANGE, INPUTS, STATE, OUTPUTS, LOCAL})
#: where an object-store root's local folder goes (default ``~/.cache/dbsp-pipeline``)
LOCAL_DIR_VARIABLE = "DBSP_LOCAL_DIR"


def manifest(root: str) -> str:
    """The manifest table of the root ``root``."""
    return os.path.join(root, MANIFEST)


def divisions(root: str) -> str:
    """The division log table of ``root``."""
    return os.path.join(root, DIVISIONS)


def errors(root: str) -> str:
    """The errors table of ``root``."""
    return os.path.join(root, ERRORS)


def readers(root: str) -> str:
    """The folder of reader leases of ``root``."""
    return os.path.join(root, READERS)


def plan_schemas(root: str) -> str:
    """The plan schema cache file of ``root``."""
    return os.path.join(root, PLAN_SCHEMAS)


def circuit_description(root: str, fingerprint: str) -> str:
    """The file holding the description of the circuit whose fingerprint is ``fingerprint``."""
    return os.path.join(root, CIRCUITS, f"{fingerprint}.json")


def upgrade_scratch(root: str, name: str | None = None) -> str:
    """The folder of upgrades' throwaway state (with ``name``: one upgrade's)."""
    folder = os.path.join(root, UPGRADE_SCRATCH)
    return folder if name is None else os.path.join(folder, name)


def exchange(root: str, name: str | None = None) -> str:
    """The folder of the changes a Spark step's owner stages hand each other (with ``name``:
    one step's)."""
    folder = os.path.join(root, EXCHANGE)
    return folder if name is None else os.path.join(folder, name)


def state_tables(root: str) -> str:
    """The folder of the state tables of ``root`` (one subfolder per table)."""
    return os.path.join(root, STATE)


def input_log(root: str, name: str) -> str:
    """The log table of input ``name``."""
    return os.path.join(root, INPUTS, name)


def output_log(root: str, name: str) -> str:
    """The change log table of output view ``name``."""
    return os.path.join(root, OUTPUTS, name)


def state_table(root: str, name: str) -> str:
    """The state table of trace ``name``."""
    return os.path.join(root, STATE, name)


def local_folder(root: str) -> str:
    """Where this machine keeps what it derives from ``root`` and can always rebuild from it
    (never state: deleting it costs time, not data). ``<root>/_local`` for a local root; for an
    object-store root, a folder named by the root's URI (readable part and a hash of it: two
    roots never share one) under ``$DBSP_LOCAL_DIR`` (default ``~/.cache/dbsp-pipeline``),
    since the store is not this machine's disk."""
    if not is_remote(root):
        return os.path.join(root, LOCAL)
    base = os.environ.get(LOCAL_DIR_VARIABLE) or os.path.join(
        os.path.expanduser("~"), ".cache", "dbsp-pipeline")
    uri = root_uri(root)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", uri.split("://", 1)[1])[-80:]
    return os.path.join(base, f"{readable}-{hashlib.sha1(uri.encode()).hexdigest()[:12]}")


def keyed_runs(root: str, trace: str | None = None) -> str:
    """The local folder of the keyed runs of trace ``trace`` (``storage/keyed_runs.py``); with
    no trace, the folder of every trace's."""
    folder = os.path.join(local_folder(root), "keyed_runs")
    return folder if trace is None else os.path.join(folder, trace)


# -- reading a root without opening it ------------------------------------------------------

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
        """A key naming the step range a run would cover: the pipeline (its id's first 8
        characters, ``new`` before its first open), the next step and the input versions it
        would read up to (equal keys: the same work)."""
        versions = ",".join(f"{n}={v}" for n, v in sorted(self.versions.items()))
        state = self.pipeline_id[:8] or "new"
        return f"{pipeline}@{state}:from-step-{self.divided_steps}:{versions}"


def exists(root: str) -> bool:
    """Whether a pipeline was ever opened at ``root`` (its manifest table is there), on any
    store."""
    return delta_log(manifest(root_uri(root))) is not None


def read_pipeline_id(root: str) -> str:
    """The id of the pipeline at ``root`` (its manifest table's id; "" before the first open).
    A root deleted and created again has another id."""
    return table_id(manifest(root_uri(root)))


def read_status(root: str, inputs: list[str]) -> PipelineStatus:
    """The status of the pipeline at ``root`` with inputs ``inputs`` (a root that does not exist
    yet has nothing divided and nothing pending). Reads the division log's newest records
    (bounded by its compaction) and, per input, the commits not yet divided."""
    root = root_uri(root)
    last = _last_divided(root)
    divided_steps, divided = (0, {}) if last is None else (last[0] + 1, last[1])
    versions: dict[str, int] = {}
    pending: dict[str, int] = {}
    oldest: float | None = None
    for name in inputs:
        uri = input_log(root, name)
        version = table_version(uri)
        lower = divided.get(name, 0)
        pushes = data_commit_times(uri, lower, version)
        versions[name], pending[name] = version, len(pushes)
        if pushes:
            oldest = min(pushes) if oldest is None else min(oldest, *pushes)
    return PipelineStatus(root, read_pipeline_id(root), divided_steps, versions,
                          {n: divided.get(n, 0) for n in inputs}, pending, oldest)


def read_lag(root: str, inputs: list[str], now: float) -> dict[str, float]:
    """Per input, how long (seconds before ``now``, since the epoch) its oldest push not yet
    divided into a step has waited (0.0: nothing waits)."""
    root = root_uri(root)
    last = _last_divided(root)
    divided = {} if last is None else last[1]
    out: dict[str, float] = {}
    for name in inputs:
        uri = input_log(root, name)
        pushes = data_commit_times(uri, divided.get(name, 0), table_version(uri))
        out[name] = max(0.0, now - min(pushes)) if pushes else 0.0
    return out


def _last_divided(root: str) -> tuple[int, dict[str, int]] | None:
    """The newest divided step and its uppers: in the division log, or carried by the newest
    state entry (``runtime/step_protocol.py``)."""
    return read_last(divisions(root), newest_entry_meta(root, CARRIED_RECORDS_KEY))


def newest_entry(root: str) -> dict[str, Any] | None:
    """The newest manifest entry of the root ``root`` (version, step, fingerprint, ...; None:
    no entry yet). Read-only, without Spark, on any store."""
    for row in newest_rows(manifest(root_uri(root))) or []:
        entry: dict[str, Any] = json.loads(row["entry"])
        return entry
    return None


def newest_entry_meta(root: str, key: str) -> object:
    """The metadata ``key`` of the newest manifest entry of the root ``root`` (None: no entry,
    or no such key): the one file of the manifest's newest version. Read-only, without Spark,
    on any store."""
    entry = newest_entry(root)
    return None if entry is None else entry.get("meta", {}).get(key)
