"""Verifying a pipeline root: damaged storage is detected before anything uses it.

Why damage is not a crash. delta-rs commits a version by writing the whole commit file and
then linking it into place, if absent; Parquet data files are written in full before the commit
that names them. A process that dies therefore never leaves a partial commit: it loses at most
what it had not committed, which recovery executes again. An empty, cut-off or missing commit
file, or a data file that is missing or not what its commit records, is damage to the storage
itself: a power loss before the operating system wrote the file out (the local object store
does not ``fsync``), a disk fault, a hand edit. Delta readers do not notice most of it: an empty
commit reads as a commit that changed nothing, so the table silently loses the files of that
version (a division lost makes the next step read consumed input again; a trace commit lost
leaves wrong state). So opening a root checks what it is about to read (``prepare_open``), and
``verify_root`` checks a whole root the same way and reports per table and per checkpoint.

What is checked, for a *snapshot* (one version) of a table:

1. its log: the commit files a reader replays to build the version (from the newest Delta
   checkpoint at or before it, whose Parquet footer must be readable) exist, are not empty, hold
   one Delta action per line, and hold as many actions as the engine recorded in the commit's
   information (``ACTIONS_KEY``), so a file cut at a line end is noticed too;
2. its data files: each exists, has the size its add action records, and its Parquet footer
   counts the rows the add action's statistics record.

Which snapshots a checkpoint (a state version, ``state_db.py``) reads:

* the state tables (``state/<trace>``) at the versions its manifest entry records, the data
  files it stages on top of them (``staged_table.py``: each exists, of the recorded size and
  row count), and the commits after those versions, which opening it rolls back (``tail``:
  readable, or rolling back fails);
* the manifest entry itself (the commit that added it and its one-row data file);
* the logs, which are never rolled back, at their newest version: the division log, every input
  log (and its commits after the input the checkpoint consumed, which steps read one by one),
  every output log (and its commits of the steps from the checkpoint's on, which a replay
  verifies against), the errors sink; and that they agree with the checkpoint: the division of
  every step before it is recorded, its outputs are written, the inputs hold the versions the
  divisions name.

Damage in what a checkpoint reads makes it *not intact*. Damage after it in the state tables and
the manifest (newer state, which restoring the checkpoint discards) does not: an explicit restore
(``Pipeline(..., checkpoint=v)``, ``Pipeline.restore(v)``) sets those commits aside
(``set_aside.py``) and rolls back as usual. A normal open refuses any damage it would read with
``CorruptStateError``, which names the table, the version, the file and the problem, and the
newest retained checkpoint that is intact, if one is.

Cost: per table, the commit files since its newest Delta checkpoint (written every 10 commits),
one ``stat`` and one Parquet footer per data file of the snapshots checked; no data is scanned
(the division log's step numbers come from its files' statistics).

Where: a local root or an object-store root (``s3://bucket/prefix``, the store the ``AWS_*``
environment names), the same checks either way: every file is read through ``small_files.py``
(pyarrow's local or S3 filesystem) and every version through delta-rs with the root's S3
options. On S3 the ``stat`` is a HEAD request and a footer one or two ranged GETs.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.errors import CorruptStateError, RootInUseError
from dbsp_pipeline.runtime import division_log
from dbsp_pipeline.runtime.plan import SCHEMA_CACHE_FILE, read_schema_cache
from dbsp_pipeline.storage import set_aside
from dbsp_pipeline.storage.data_files import CHECKSUMS_READ
from dbsp_pipeline.storage.delta_store import is_properties_commit
from dbsp_pipeline.storage.delta_table import ACTIONS_KEY, storage_options
from dbsp_pipeline.storage.small_files import (
    file_size,
    filesystem,
    list_folders,
    list_names,
    read_bytes,
    read_text,
)
from dbsp_pipeline.storage.staged_table import STAGED_KEY
from dbsp_pipeline.storage.state_db import (
    MANIFEST_DIR,
    RETIRED_TABLES_KEY,
    checkpoint_place,
    retains,
)
from dbsp_pipeline.storage.table_store import root_uri

#: the tables of a pipeline root, by kind: (folder, kind, one table or a folder of tables)
ROOT_TABLES = ((root_layout.MANIFEST, "manifest", True),
               (root_layout.DIVISIONS, "divisions", True),
               (root_layout.ERRORS, "errors", True), (root_layout.INPUTS, "input", False),
               (root_layout.OUTPUTS, "output", False), (root_layout.STATE, "state", False))
#: side files an output log keeps beside its Delta log (``runtime/output_log.py``)
OUTPUT_MARKERS = ("_dbsp_compacted_through",)
_OUTPUT_APP_ID = "dbsp-output"  # runtime/output_log.py APP_ID
_STEP_KEY = "dbsp.step"  # runtime/output_log.py STEP_KEY
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")
_MISSING = "the data file is missing"
_ACTIONS = {"commitInfo", "add", "remove", "metaData", "protocol", "txn", "cdc",
            "domainMetadata", "checkpointMetadata", "sidecar"}


@dataclass(frozen=True)
class Damage:
    """One problem: the table (its folder relative to the root, or a side file's name), the
    version checked (None for a side file), the file at fault and what is wrong with it."""

    table: str
    version: int | None
    file: str
    problem: str

    def __str__(self) -> str:
        version = "" if self.version is None else f", version {self.version}"
        return f"{self.table}{version}, file {self.file}: {self.problem}"


@dataclass(frozen=True)
class TableReport:
    """What verifying one table found: its kind (``manifest``, ``divisions``, ``errors``,
    ``input``, ``output``, ``state``), its newest version, the versions checked, the data files
    and rows of the newest version checked, and the damage. A state table's changes since its
    Delta version are staged in the manifest's entries (``staged_table.py``): for one, the data
    files and rows the newest checkpoint stages on top of its Delta version (``staged_files``,
    ``staged_rows``) and how many files it stages as removed (``staged_removes``; their rows
    are not counted, so files and rows plus the staged ones are not the table's rows)."""

    table: str
    kind: str
    newest: int | None
    versions: tuple[int, ...]
    files: int
    rows: int
    damage: tuple[Damage, ...]
    staged_files: int = 0
    staged_rows: int = 0
    staged_removes: int = 0

    @property
    def ok(self) -> bool:
        return not self.damage


@dataclass(frozen=True)
class CheckpointReport:
    """A retained checkpoint: ``damage`` in what it reads (it is ``intact`` without any), and
    ``set_aside``: damage after it in the state tables and the manifest, which restoring it
    sets aside."""

    version: int
    step: int
    damage: tuple[Damage, ...]
    set_aside: tuple[Damage, ...]

    @property
    def intact(self) -> bool:
        return not self.damage


@dataclass(frozen=True)
class VerifyReport:
    """Every table of a root and every retained checkpoint, checked. ``lost_checkpoints``:
    damage in the newest manifest commits, whose checkpoints cannot be read at all;
    ``side_files``: damage the next open repairs by itself (the schema cache)."""

    root: str
    tables: tuple[TableReport, ...]
    checkpoints: tuple[CheckpointReport, ...]
    lost_checkpoints: tuple[Damage, ...] = ()
    side_files: tuple[Damage, ...] = ()

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables) and not self.side_files \
            and not self.lost_checkpoints and all(c.intact and not c.set_aside
                                                  for c in self.checkpoints)

    @property
    def damage(self) -> list[Damage]:
        """Every problem found, once."""
        out: dict[Damage, None] = {}
        for d in [*self.lost_checkpoints, *(d for t in self.tables for d in t.damage),
                  *(d for c in self.checkpoints for d in (*c.damage, *c.set_aside)),
                  *self.side_files]:
            out[d] = None
        return list(out)

    @property
    def newest_intact(self) -> int | None:
        """The newest retained checkpoint that is intact (None if none is)."""
        return next((c.version for c in self.checkpoints if c.intact), None)

    def describe(self) -> str:
        """The report as text: one line per table, then the checkpoints, then side files."""
        lines = [f"pipeline root {self.root}: {'ok' if self.ok else 'DAMAGED'}"]
        for t in self.tables:
            versions = ",".join(str(v) for v in t.versions)
            staged = (f"  + staged files {t.staged_files:>5}  rows {t.staged_rows:>9}"
                      f"  removed {t.staged_removes:>4}"
                      if t.staged_files or t.staged_removes else "")
            lines.append(f"  {t.table:<40} {t.kind:<9} newest {_text(t.newest):>5}  checked "
                         f"{versions or '-':<9} files {t.files:>5}  rows {t.rows:>9}  "
                         f"{'ok' if t.ok else 'DAMAGED'}{staged}")
            lines += [f"      {d.problem} (version {_text(d.version)}, {d.file})"
                      for d in t.damage]
        for d in self.lost_checkpoints:
            lines.append(f"  a newer checkpoint is unreadable: {d}")
        for c in self.checkpoints:
            state = "intact" if c.intact else "DAMAGED"
            lines.append(f"  checkpoint {c.version} ({checkpoint_place(c.step)}): {state}")
            lines += [f"      {d}" for d in c.damage]
            lines += [f"      restoring it sets aside: {d}" for d in c.set_aside]
        lines += [f"  {d} (rebuilt at the next open)" for d in self.side_files]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        def damage(ds: Sequence[Damage]) -> list[dict[str, Any]]:
            return [{"table": d.table, "version": d.version, "file": d.file,
                     "problem": d.problem} for d in ds]
        return {
            "root": self.root, "ok": self.ok, "newest_intact": self.newest_intact,
            "tables": [{"table": t.table, "kind": t.kind, "newest": t.newest,
                        "versions": list(t.versions), "files": t.files, "rows": t.rows,
                        "staged_files": t.staged_files, "staged_rows": t.staged_rows,
                        "staged_removes": t.staged_removes,
                        "ok": t.ok, "damage": damage(t.damage)} for t in self.tables],
            "checkpoints": [{"version": c.version, "step": c.step, "intact": c.intact,
                             "damage": damage(c.damage), "set_aside": damage(c.set_aside)}
                            for c in self.checkpoints],
            "lost_checkpoints": damage(self.lost_checkpoints),
            "side_files": damage(self.side_files)}


#: how often a check of a root starts again when a running pipeline moved the root while it
#: read (``_heads``) and it found damage or could not read a file, before ``RootInUseError``
STABLE_SCAN_ATTEMPTS = 5


def _tables(root: str) -> dict[str, tuple[str, int]]:
    """Every table of the root ``root`` (by folder under it) with a commit: its kind and the
    newest commit version of its log, one listing a table (what a check starts from)."""
    out: dict[str, tuple[str, int]] = {}
    for folder, kind, single in ROOT_TABLES:
        for name in [""] if single else list_folders(os.path.join(root, folder)):
            table = os.path.join(folder, name) if name else folder
            names = list_names(os.path.join(root, table, "_delta_log"))
            versions = [int(m[1]) for n in names if (m := _COMMIT_FILE.match(n))]
            if versions:
                out[table] = (kind, max(versions))
    return out


def _heads(root: str) -> dict[str, int]:
    """The newest commit version of every table's log at ``root``. A running pipeline moves
    the manifest at every step, and other tables' logs between (an output log's fold, an input
    log's consolidation, a Delta log cleaned below a new checkpoint); a check reads the tables
    one by one, so a change in between shows a mix of versions that looks like damage (outputs
    past the recorded divisions) or removes a file it was about to read. Listed again only
    when a check found something, to compare with what the check listed when it began
    (``_RootScan.heads``)."""
    return {table: newest for table, (_, newest) in _tables(root).items()}


class _RootMoved(Exception):
    """A check found the root moved before it changed anything (``_prepare_open_once``)."""


def _root_in_use(root: str, what: str) -> RootInUseError:
    return RootInUseError(f"pipeline root {root}: {what}: another process wrote it while it was "
                          f"read, {STABLE_SCAN_ATTEMPTS} times (its manifest moves at every "
                          "step): stop the process running it first; a root is run by one "
                          "process at a time")


def retained_checkpoints(root: str, retained: int = 2) -> list[tuple[int, int]]:
    """The retained checkpoints of ``root`` as (state version, next step), newest first, read
    from the manifest's log alone (nothing is checked; ``verify_root`` checks them)."""
    return [(c.version, c.step) for c in _RootScan(root, retained).checkpoints()]


def verify_root(root: str, retained: int = 2) -> VerifyReport:
    """Check every table of the pipeline root ``root`` and each of its newest ``retained``
    checkpoints (see the module docstring). Reads only; needs neither Spark nor the circuit.
    ``root`` is a local path or ``s3://bucket/prefix``.

    Meant for a root no process runs. One a pipeline steps meanwhile moves under the check: a
    check that finds damage, or cannot read a file, while the root moved (``_heads``) starts
    again, and after ``STABLE_SCAN_ATTEMPTS`` raises ``RootInUseError`` rather than report
    damage that is a running step's."""
    uri = root_uri(root)
    for _ in range(STABLE_SCAN_ATTEMPTS):
        scan = _RootScan(root, retained)
        try:
            report = _report(scan)
        except (OSError, DeltaError):
            if _heads(uri) == scan.heads:
                raise
            continue
        if report.ok or _heads(uri) == scan.heads:
            return report
    raise _root_in_use(uri, "cannot be verified")


def _report(scan: _RootScan) -> VerifyReport:
    checkpoints = scan.checkpoints()
    reports = [CheckpointReport(c.version, c.step, tuple(scan.checkpoint_damage(c)),
                                tuple(d for ds in scan.tail_damage(c).values() for d in ds))
               for c in checkpoints]
    return VerifyReport(scan.root, tuple(scan.table_reports()), tuple(reports),
                        tuple(scan.lost + scan.broken), tuple(scan.side_file_damage()))


def prepare_open(root: str, checkpoint: int | None = None, retained: int = 2) -> bool:
    """Check what opening ``root`` at ``checkpoint`` (default: the newest checkpoint) reads,
    before anything reads it; raise ``CorruptStateError`` on damage. With an explicit
    ``checkpoint``, damaged commits after it in the state tables and the manifest (state newer
    than it, which opening it discards) are set aside first (``set_aside.py``); returns whether
    anything was. A root without a manifest yet (new) passes.

    Nothing may write the root meanwhile (as for opening it at all). Damage found, or a file
    that cannot be read, while another process moved the root (``_heads``: a pipeline still
    running it) is checked again, up to ``STABLE_SCAN_ATTEMPTS`` times, then ``RootInUseError``;
    nothing is set aside while the root moves. A local root and an object-store root (``s3://``)
    are checked alike."""
    uri = root_uri(root)
    for _ in range(STABLE_SCAN_ATTEMPTS):
        scan = _RootScan(root, retained)
        try:
            return _prepare_open_once(scan, checkpoint)
        except _RootMoved:
            continue
        except (CorruptStateError, OSError, DeltaError):
            if _heads(uri) == scan.heads:
                raise
    raise _root_in_use(uri, "cannot be opened")


def _prepare_open_once(scan: _RootScan, checkpoint: int | None) -> bool:
    if scan.manifest is None:
        return False
    checkpoints = scan.checkpoints()
    if checkpoint is None:
        if not checkpoints:
            raise scan.error(scan.lost or [Damage(MANIFEST_DIR, scan.manifest.newest,
                                                  scan.manifest.dir, "no entry is readable")],
                             "no checkpoint can be read")
        newest = checkpoints[0]
        read = scan.checkpoint_damage(newest)
        later = [d for ds in scan.tail_damage(newest).values() for d in ds]
        if read:
            raise scan.error(_unique(read + later),
                             f"its newest checkpoint {newest.version} reads damaged storage")
        if scan.lost:
            raise scan.error(_unique(later), "its newest checkpoint cannot be read")
        if later:
            raise scan.error(later, f"the state written after its newest checkpoint "
                             f"{newest.version} (by steps not yet committed) is damaged")
        return False
    target = next((c for c in checkpoints if c.version == checkpoint), None)
    if target is None:
        return False  # not retained: the state database refuses it by name
    damage = scan.checkpoint_damage(target)
    if damage:
        raise scan.error(damage, f"checkpoint {checkpoint} cannot be restored: it reads "
                         "damaged storage", target=checkpoint)
    tails = scan.tail_damage(target)
    if tails and _heads(scan.root) != scan.heads:  # a running pipeline's: never set aside
        raise _RootMoved()
    for table, problems in tails.items():
        keep = target.manifest_version if table == MANIFEST_DIR else target.version_of(table)
        set_aside.set_aside_after(os.path.join(scan.root, table), keep,
                                  f"restoring checkpoint {checkpoint} of {scan.root}: "
                                  + "; ".join(str(d) for d in problems))
    return bool(tails)


# -- one table's log ------------------------------------------------------------------------

class _Log:
    """The ``_delta_log`` of one table as it is stored: its commit files and Delta
    checkpoints, each commit read (and judged) at most once."""

    def __init__(self, table: str, uri: str) -> None:
        self.table = table
        self.uri = uri
        self.dir = os.path.join(uri, "_delta_log")
        self.commits: dict[int, str] = {}
        self.checkpoints: dict[int, list[str]] = {}
        for name in list_names(self.dir):
            path = os.path.join(self.dir, name)
            if m := _COMMIT_FILE.match(name):
                self.commits[int(m[1])] = path
            elif m := _CHECKPOINT_FILE.match(name):
                self.checkpoints.setdefault(int(m[1]), []).append(path)
        self.newest = max([*self.commits, *self.checkpoints], default=None)
        self._read: dict[int, tuple[list[dict[str, Any]], Damage | None]] = {}

    def path(self, version: int) -> str:
        return self.commits.get(version, os.path.join(self.dir, f"{version:020d}.json"))

    def commit(self, version: int) -> tuple[list[dict[str, Any]], Damage | None]:
        """The actions of commit ``version``, or the damage that keeps them from being read."""
        if version not in self._read:
            self._read[version] = self._parse(version)
        return self._read[version]

    def _parse(self, version: int) -> tuple[list[dict[str, Any]], Damage | None]:
        path = self.path(version)

        def damaged(problem: str) -> tuple[list[dict[str, Any]], Damage | None]:
            return [], Damage(self.table, version, path, problem)

        if version not in self.commits:
            return damaged(f"the commit file is missing (the log holds versions up to "
                           f"{self.newest})")
        try:
            data = read_bytes(path)
        except OSError as e:
            return damaged(f"the commit file cannot be read ({e})")
        if data is None:
            return damaged("the commit file cannot be read (it is gone)")
        if not data.strip():
            return damaged(f"the commit file is empty ({len(data)} bytes): the version's "
                           "actions are lost")
        actions = []
        for i, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                action = json.loads(line)
            except ValueError as e:
                return damaged(f"line {i} is not valid JSON ({e}): the file is cut off or "
                               "damaged")
            if not isinstance(action, dict) or len(action) != 1 or not _ACTIONS >= set(action):
                return damaged(f"line {i} is not a Delta action")
            actions.append(action)
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
        recorded = info.get(ACTIONS_KEY) if isinstance(info, dict) else None
        held = sum(1 for a in actions if "commitInfo" not in a)
        if isinstance(recorded, int) and recorded != held:
            return damaged(f"the commit holds {held} actions but {recorded} were written: "
                           "the file is cut off")
        if version == 0 and not {"protocol", "metaData"} <= {k for a in actions for k in a}:
            return damaged("the table's first commit lacks its protocol or schema")
        return actions, None

    def damage(self, lower: int, upper: int) -> list[Damage]:
        """The damage in commits ``lower .. upper``."""
        return [d for v in range(max(lower, 0), upper + 1)
                if (d := self.commit(v)[1]) is not None]

    def segment_damage(self, version: int) -> list[Damage]:
        """The damage in what a reader replays to build ``version``: the newest Delta
        checkpoint at or before it, and the commits after that checkpoint up to ``version``."""
        start = max((v for v in self.checkpoints if v <= version), default=-1)
        out = []
        for path in self.checkpoints.get(start, []):
            try:
                _parquet_metadata(path)
            except Exception as e:  # noqa: BLE001 - any unreadable footer is damage
                out.append(Damage(self.table, start, path,
                                  f"the Delta checkpoint is unreadable ({_first_line(e)})"))
        return out + self.damage(start + 1, version)


@dataclass
class _Snapshot:
    """One version of a table as delta-rs reads it, with its data files checked."""

    files: int = 0
    rows: int = 0
    damage: list[Damage] = field(default_factory=list)
    #: per data file (path relative to the table), its columns' minimum and maximum values
    bounds: dict[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)
    table: DeltaTable | None = None


@dataclass(frozen=True)
class _Checkpoint:
    """A manifest entry read from the manifest's log: the state version, its next step, the
    manifest version holding it, and the entry itself."""

    version: int
    step: int
    manifest_version: int
    entry: dict[str, Any]

    def version_of(self, table: str) -> int:
        """The version of state table ``state/<name>`` this checkpoint records (0: none)."""
        return int(self.entry.get("traces", {}).get(table.split("/", 1)[1], 0))

    def staged_record(self, table: str) -> object:
        """What this checkpoint stages on state table ``state/<name>``: ``staged_table.py``'s
        record (a dict) as the entry holds it, ``{}`` for nothing."""
        return self.entry.get(STAGED_KEY, {}).get(table.split("/", 1)[1], {})

    def staged_adds(self, table: str) -> list[dict[str, Any]] | None:
        """The add records this checkpoint stages on state table ``table``; None when they
        cannot be read (not a list of records with a path: damage)."""
        record = self.staged_record(table)
        adds = record.get("adds", []) if isinstance(record, dict) else None
        if not isinstance(adds, list) or not all(isinstance(a, dict) and "path" in a
                                                 for a in adds):
            return None
        return adds


# -- a whole root ---------------------------------------------------------------------------

class _RootScan:
    """The tables of one root, discovered from its folders, and the checks on them (each
    computed once)."""

    def __init__(self, root: str, retained: int) -> None:
        self.root = root_uri(root)
        self.retained = max(1, retained)
        listed = _tables(self.root)
        self.kinds: dict[str, str] = {table: kind for table, (kind, _) in listed.items()}
        #: the newest commit of each table's log when the scan began (``_heads``)
        self.heads: dict[str, int] = {table: newest for table, (_, newest) in listed.items()}
        self._logs: dict[str, _Log] = {}
        self._snapshots: dict[tuple[str, int], _Snapshot] = {}
        self._checked: dict[str, set[int]] = {}
        self._checkpoints: list[_Checkpoint] | None = None
        self._log_damage: list[Damage] | None = None
        #: step -> record text of the step records carried by the entries being checked
        self._carried: dict[int, str] = {}
        #: damage in the newest manifest commits, whose checkpoints cannot be read
        self.lost: list[Damage] = []
        #: damage in an older manifest entry, where the chain of retained checkpoints ends
        self.broken: list[Damage] = []
        self.manifest = self.log(MANIFEST_DIR) if MANIFEST_DIR in self.kinds else None

    def log(self, table: str) -> _Log:
        if table not in self._logs:
            self._logs[table] = _Log(table, os.path.join(self.root, table))
        return self._logs[table]

    def tables(self, kind: str) -> list[str]:
        return [t for t, k in self.kinds.items() if k == kind]

    # -- snapshots --------------------------------------------------------------------------
    def snapshot(self, table: str, version: int) -> _Snapshot:
        """Version ``version`` of ``table`` with its log and data files checked."""
        key = (table, version)
        if key in self._snapshots:
            return self._snapshots[key]
        self._checked.setdefault(table, set()).add(version)
        log = self.log(table)
        snap = _Snapshot(damage=log.segment_damage(version))
        self._snapshots[key] = snap
        if snap.damage:
            return snap  # delta-rs would misread or refuse it
        try:
            snap.table = DeltaTable(log.uri, version=version,
                                    storage_options=storage_options(log.uri))
            adds = pa.table(snap.table.get_add_actions(flatten=False)).to_pydict()
        except Exception as e:  # noqa: BLE001 - whatever delta-rs refuses is damage
            snap.damage.append(Damage(table, version, log.dir,
                                      f"delta-rs cannot read the version ({_first_line(e)})"))
            return snap
        paths = adds.get("path", [])
        none = [None] * len(paths)
        for rel, size, rows, lo, hi in zip(paths, adds.get("size_bytes", none),
                                           adds.get("num_records", none),
                                           adds.get("min", none), adds.get("max", none)):
            snap.files += 1
            snap.rows += int(rows or 0)
            snap.bounds[rel] = (lo or {}, hi or {})
            problem = _data_file_problem(os.path.join(log.uri, rel), size, rows)
            if problem is not None:
                snap.damage.append(Damage(table, version, os.path.join(log.uri, rel), problem))
        return snap

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoints(self) -> list[_Checkpoint]:
        """The newest ``retained`` checkpoints, newest first, read from the manifest's log.
        Damaged newest manifest commits are skipped (and kept in ``lost``): the chain starts at
        the newest readable entry. It ends before a checkpoint whose step is below the division
        log's ``compacted_below`` (not restorable, as ``state_db.retained_entries`` says)."""
        if self._checkpoints is not None:
            return self._checkpoints
        out: list[_Checkpoint] = []
        self._checkpoints = out
        if self.manifest is None or self.manifest.newest is None:
            return out
        head = self.manifest.newest
        while head >= 0:
            cp, damage, _ = self._entry_at(head)
            if cp is not None:
                break
            self.lost += damage
            head -= 1
        else:
            return out
        m: int | None = head
        floor = self._compacted_below()  # read after the manifest, as the logs are
        while m is not None:
            cp, damage, collected = self._entry_at(m)
            if cp is not None and out and cp.step < floor:
                break
            if cp is not None and not retains([c.step for c in out], cp.step, self.retained):
                break
            if cp is None:
                # The end of the chain: an older entry collected as garbage (the retention was
                # smaller once), or damaged (a checkpoint lost).
                if not collected:
                    self.broken += damage
                break
            out.append(cp)
            base = cp.entry.get("manifest_base")
            m = int(base) if isinstance(base, int) else None
        return out

    def _compacted_below(self) -> int:
        """The division log's ``compacted_below`` (0: nothing compacted, or no readable log)."""
        steps = self._divided_steps()
        text = self._division_record(min(steps), carried=False) if steps else None
        return (division_log.compacted_below(text) or 0) if text is not None else 0

    def _entry_at(self, m: int) -> tuple[_Checkpoint | None, list[Damage], bool]:
        """The checkpoint manifest version ``m`` added, read from its commit and data file;
        else the damage, and whether it is only that the entry's data file is gone."""
        if m == 0:
            return _Checkpoint(0, 0, 0, {"version": 0, "step": 0, "traces": {}}), [], False
        assert self.manifest is not None
        if m not in self.manifest.commits and m < min(self.manifest.commits, default=m + 1):
            return None, [], True  # below the log's start: cleaned up with collected history
        actions, damage = self.manifest.commit(m)
        if damage is not None:
            return None, [damage], False
        if is_properties_commit(actions):  # adds no entry: the version holds the one below
            return self._entry_at(m - 1)
        adds = [a["add"] for a in actions if "add" in a]
        commit = self.manifest.path(m)
        if len(adds) != 1 or not isinstance(adds[0], dict) or "path" not in adds[0]:
            return None, [Damage(MANIFEST_DIR, m, commit, f"the commit adds {len(adds)} files; "
                                 "a manifest commit adds one entry")], False
        add = adds[0]
        path = os.path.join(self.manifest.uri, add["path"])
        problem = _data_file_problem(path, add.get("size"), _num_records(add.get("stats")))
        if problem is not None:
            return None, [Damage(MANIFEST_DIR, m, path, f"the checkpoint's entry: {problem}")], \
                problem == _MISSING
        try:
            rows = _parquet_table(path).to_pylist()
            entry = json.loads(rows[0]["entry"])
            cp = _Checkpoint(int(entry["version"]), int(entry.get("step", 0)), m, entry)
            if not isinstance(entry.get("traces", {}), dict):
                raise ValueError("'traces' is not an object")
            if not isinstance(entry.get(STAGED_KEY, {}), dict):
                raise ValueError(f"'{STAGED_KEY}' is not an object")
        except Exception as e:  # noqa: BLE001 - an entry that cannot be read is damage
            return None, [Damage(MANIFEST_DIR, m, path, f"the entry cannot be read "
                                 f"({type(e).__name__}: {_first_line(e)})")], False
        return cp, [], False

    def checkpoint_damage(self, cp: _Checkpoint) -> list[Damage]:
        """The damage in what checkpoint ``cp`` reads (see the module docstring)."""
        damage = [] if self.manifest is None else \
            self.manifest.segment_damage(cp.manifest_version)
        for table in self._state_tables(cp):
            recorded = cp.version_of(table)
            if table not in self.kinds:
                damage.append(Damage(table, recorded, os.path.join(self.root, table),
                                     f"the table is missing; checkpoint {cp.version} records "
                                     f"its version {recorded}"))
                continue
            newest = self.log(table).newest
            if newest is None or recorded > newest:
                damage.append(Damage(table, recorded, self.log(table).path(recorded),
                                     f"checkpoint {cp.version} records version {recorded} but "
                                     f"the log ends at version {newest}"))
                continue
            damage += self.snapshot(table, recorded).damage
            damage += self._staged_damage(cp, table)
        for name in set(cp.entry.get(STAGED_KEY, {})) - set(cp.entry.get("traces", {})):
            damage.append(Damage(MANIFEST_DIR, cp.manifest_version,
                                 self.manifest.path(cp.manifest_version) if self.manifest
                                 else MANIFEST_DIR,
                                 f"checkpoint {cp.version} stages actions on '{name}', a state "
                                 "table it does not record"))
        damage += self._log_tables_damage()
        damage += self._consistency_damage(cp)
        return _unique(damage)

    def _staged_damage(self, cp: _Checkpoint, table: str) -> list[Damage]:
        """The damage in the data files checkpoint ``cp`` stages on state table ``table``."""
        adds = cp.staged_adds(table)
        if adds is None:
            return [Damage(table, cp.version_of(table), self.manifest.path(cp.manifest_version)
                           if self.manifest is not None else table,
                           f"checkpoint {cp.version} records unreadable staged actions")]
        out = []
        for add in adds:
            path = os.path.join(self.root, table, str(add["path"]))
            problem = _data_file_problem(path, add.get("size"), _num_records(add.get("stats")))
            if problem is not None:
                out.append(Damage(table, cp.version_of(table), path,
                                  f"a data file checkpoint {cp.version} stages: {problem}"))
        return out

    def tail_damage(self, cp: _Checkpoint) -> dict[str, list[Damage]]:
        """Per state table (and the manifest), the damage in its commits after the version
        checkpoint ``cp`` records: state that opening ``cp`` discards."""
        out = {}
        for table in self._state_tables(cp):
            if table in self.kinds:
                log = self.log(table)
                newest = log.newest if log.newest is not None else -1
                damage = log.damage(cp.version_of(table) + 1, newest)
                if damage:
                    out[table] = damage
        if self.manifest is not None and self.manifest.newest is not None:
            newer = self.manifest.damage(cp.manifest_version + 1, self.manifest.newest)
            newer += [d for d in self.lost if d not in newer]
            if newer:
                out[MANIFEST_DIR] = newer
        return out

    def _state_tables(self, cp: _Checkpoint) -> list[str]:
        """The state tables opening ``cp`` may read: every one on disk or recorded, but those
        an upgrade retired (``state_db.RETIRED_TABLES_KEY``: no plan opens them again, and
        garbage collection deletes them, perhaps half-way when a crash cuts it short)."""
        recorded = [os.path.join(root_layout.STATE, name) for name in cp.entry.get("traces", {})]
        retired = {os.path.join(root_layout.STATE, name)
                   for name in cp.entry.get(RETIRED_TABLES_KEY, [])}
        return sorted({*self.tables("state"), *recorded} - retired)

    # -- the logs -----------------------------------------------------------------------------
    def _log_tables_damage(self) -> list[Damage]:
        """The damage in the newest version of every log (divisions, inputs, outputs, errors),
        which every checkpoint reads; output logs also their compaction marker.

        Read in the order the step protocol writes them backwards (outputs, then divisions,
        then inputs), after the manifest: a step committing meanwhile (another process, which
        then loses the race for the root) cannot make them look inconsistent."""
        if self._log_damage is None:
            self._log_damage = []
            for kind in ("output", "errors", "divisions", "input"):
                for table in self.tables(kind):
                    newest = self.log(table).newest
                    assert newest is not None
                    self._log_damage += self.snapshot(table, newest).damage
                    if kind == "output":
                        self._log_damage += _marker_damage(table,
                                                           os.path.join(self.root, table))
        return self._log_damage

    def _consistency_damage(self, cp: _Checkpoint) -> list[Damage]:
        """Whether the logs agree with checkpoint ``cp``, and the damage in the log commits its
        replays and next steps read one by one."""
        damage: list[Damage] = []
        steps = self._divided_steps()
        # Step records not folded into the division log yet are carried by entries
        # (``runtime/step_protocol.py``): every one not folded is in the newest entry, and
        # ``cp``'s own are what a restore of ``cp`` reads first.
        newest = self._checkpoints[0] if self._checkpoints else cp
        self._carried = {**_carried_records(newest.entry), **_carried_records(cp.entry)}
        carried = {step: division_log.recorded_outputs(text) is not None
                   for step, text in self._carried.items()}
        first = 0
        if steps is not None:  # those the log compacted away since are not missing
            first = self._first_kept_step(steps)
            steps = [*steps, *(s for s in carried if s not in steps and s >= first)]
        if steps is None:
            if cp.step > 0:
                damage.append(Damage(root_layout.DIVISIONS, None,
                                     os.path.join(self.root, root_layout.DIVISIONS),
                                     f"the division log is missing; checkpoint {cp.version} "
                                     f"executed steps up to {cp.step - 1}"))
            return damage
        divisions = os.path.join(self.root, root_layout.DIVISIONS)
        divided = max(steps, default=-1)
        missing = sorted(set(range(first, divided + 1)) - set(steps))
        if missing or len(steps) != len(set(steps)):
            damage.append(Damage(root_layout.DIVISIONS, self.log(root_layout.DIVISIONS).newest,
                                 divisions,
                                 f"the divisions of steps {missing[:10]} are missing"
                                 if missing else "a step's division is recorded twice"))
        if cp.step - 1 > divided:
            damage.append(Damage(root_layout.DIVISIONS, self.log(root_layout.DIVISIONS).newest,
                                 divisions,
                                 f"checkpoint {cp.version} executed steps up to {cp.step - 1} "
                                 f"but divisions are recorded up to step {divided}"))
        lower = self._division(cp.step - 1) if cp.step > 0 else {}
        newest_uppers = self._division(divided) if divided >= 0 else {}
        for table in self.tables("input"):
            name = table.split("/", 1)[1]
            log = self.log(table)
            assert log.newest is not None
            damage += log.damage(int((lower or {}).get(name, 0)) + 1, log.newest)
            wanted = int((newest_uppers or {}).get(name, 0))
            if wanted > log.newest:
                damage.append(Damage(table, log.newest, log.path(wanted),
                                     f"the division of step {divided} read it up to version "
                                     f"{wanted} but the log ends at version {log.newest}"))
        for table in self.tables("output"):
            log = self.log(table)
            assert log.newest is not None
            snap = self.snapshot(table, log.newest)
            if snap.table is None:
                continue
            written = snap.table.transaction_version(_OUTPUT_APP_ID)
            last = 0 if written is None else written + 1
            # steps whose output a record holds, not folded into the log yet
            last = max(last, max((s + 1 for s, has in carried.items() if has), default=0),
                       self._newest_recorded_output() + 1)
            if last < cp.step:
                damage.append(Damage(table, log.newest, log.path(log.newest),
                                     f"checkpoint {cp.version} executed steps up to "
                                     f"{cp.step - 1} but the log holds steps up to {last - 1}"))
            if last > divided + 1:
                damage.append(Damage(table, log.newest, log.path(log.newest),
                                     f"the log holds steps up to {last - 1} but divisions are "
                                     f"recorded up to step {divided}"))
            damage += self._output_commits_damage(log, cp.step)
            damage += self._pending_output_damage(table, 0 if written is None else written + 1)
        return damage

    def _pending_output_damage(self, table: str, folded: int) -> list[Damage]:
        """The damage in the data files of output ``table``'s writes that step records hold
        and its Delta table does not yet (steps from ``folded`` on): they must be there, as
        recorded (``runtime/output_log.py``), or a reader and the next fold lose the step."""
        view = table.split("/", 1)[1]
        out = []
        for step, outputs in sorted(self._recorded_outputs().items()):
            if step < folded or not isinstance(outputs.get(view), dict):
                continue
            for add in outputs[view].get("adds", []):
                path = os.path.join(self.root, table, str(add.get("path")))
                problem = _data_file_problem(path, add.get("size"), _num_records(add.get("stats")))
                if problem is not None:
                    out.append(Damage(table, None, path, f"step {step}'s change, recorded but "
                                                         f"not folded yet: {problem}"))
        return out

    def _recorded_outputs(self) -> dict[int, dict[str, Any]]:
        """Per step, the outputs its record holds: in the division log or carried by the
        entries being checked."""
        out: dict[int, dict[str, Any]] = {}
        log = self.log(root_layout.DIVISIONS) if root_layout.DIVISIONS in self.kinds else None
        if log is not None and log.newest is not None:
            snap = self.snapshot(root_layout.DIVISIONS, log.newest)
            for rel in snap.bounds:
                try:
                    rows = _parquet_table(os.path.join(log.uri, rel)).to_pylist()
                except Exception:  # noqa: BLE001 - a damaged file was reported by its check
                    continue
                for row in rows:
                    outputs = division_log.recorded_outputs(str(row["uppers"]))
                    if outputs is not None:
                        out[int(row["step"])] = outputs
        for step, text in self._carried.items():
            outputs = division_log.recorded_outputs(text)
            if outputs is not None:
                out[step] = outputs
        return out

    def _output_commits_damage(self, log: _Log, step: int) -> list[Damage]:
        """The damage in an output log's commits of steps ``step ..`` (which a replay verifies
        against), read from the newest back."""
        assert log.newest is not None
        out = []
        for v in range(log.newest, 0, -1):
            if v not in log.commits:
                break  # cleaned up with the log's history: nothing reads it
            actions, damage = log.commit(v)
            if damage is not None:
                out.append(damage)
                continue
            info: object = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
            written = info.get(_STEP_KEY) if isinstance(info, dict) else None
            if isinstance(written, int) and written < step:
                break
        return out

    def _divided_steps(self) -> list[int] | None:
        """The steps the division log holds (from its files' statistics), None without one. A
        quarantined step's second record (``runtime/division_log.py``) is not a second
        division when it repeats the step's versions."""
        if root_layout.DIVISIONS not in self.kinds:
            return None
        log = self.log(root_layout.DIVISIONS)
        assert log.newest is not None
        snap = self.snapshot(root_layout.DIVISIONS, log.newest)
        by_file: dict[str, list[int]] = {}
        for rel, (lo, hi) in snap.bounds.items():
            first, last = lo.get("step"), hi.get("step")
            if isinstance(first, int) and first == last:
                by_file[rel] = [first]
            else:  # folded or compacted records (steps need not follow), or no statistics
                # (Delta's): its step column
                try:
                    by_file[rel] = _parquet_table(os.path.join(log.uri, rel),
                                                  columns=["step"]).column(0).to_pylist()
                except Exception:  # noqa: BLE001 - a damaged file was reported by its check
                    continue
        steps = [step for found in by_file.values() for step in found]
        if len(steps) == len(set(steps)):
            return steps
        twice = {step for step, n in Counter(steps).items() if n > 1}
        records: dict[int, list[str]] = {}
        for rel, found in by_file.items():
            if twice.intersection(found):
                try:
                    for row in _parquet_table(os.path.join(log.uri, rel)).to_pylist():
                        records.setdefault(row["step"], []).append(row["uppers"])
                except Exception:  # noqa: BLE001 - a damaged file was reported by its check
                    continue
        for step in twice:
            # a divided step's later records repeat its division: the quarantine mark, and the
            # output of a failed step that succeeded (at most one of each)
            texts = records.get(step, [])
            marks = [t for t in texts if division_log.quarantine_reason(t)]
            written = [t for t in texts if division_log.recorded_outputs(t) is not None]
            if len(marks) <= 1 and len(written) <= 1 and len(texts) <= 3 and all(
                    division_log.parse(t) == division_log.parse(texts[0]) for t in texts):
                for _ in texts[1:]:
                    steps.remove(step)
        return steps

    def _first_kept_step(self, steps: list[int]) -> int:
        """The first step whose division the log must hold: 0, or the step of the compacted
        record (``DivisionLog.compact_below``) when the lowest recorded step is one; the steps
        below it were collapsed on purpose and are not missing."""
        if not steps or min(steps) == 0:
            return 0
        first = min(steps)
        text = self._division_record(first, carried=False)
        return first if text is not None and division_log.compacted_below(text) else 0

    def _newest_recorded_output(self) -> int:
        """The newest step whose record in the division log holds its output (-1: none)."""
        log = self.log(root_layout.DIVISIONS)
        if log.newest is None:
            return -1
        snap = self.snapshot(root_layout.DIVISIONS, log.newest)
        newest = -1
        for rel in sorted(snap.bounds, key=lambda r: -int(snap.bounds[r][1].get("step", -1))):
            try:
                rows = _parquet_table(os.path.join(log.uri, rel)).to_pylist()
            except Exception:  # noqa: BLE001 - a damaged file was reported by its check
                continue
            for row in rows:
                if division_log.recorded_outputs(str(row["uppers"])) is not None:
                    newest = max(newest, int(row["step"]))
            if newest >= 0:
                return newest
        return newest

    def _division(self, step: int) -> dict[str, Any] | None:
        """The uppers recorded for ``step`` (read from its one file), None if not found."""
        text = self._division_record(step)
        if text is None:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return None
        uppers = data.get("uppers", data) if isinstance(data, dict) else None
        return uppers if isinstance(uppers, dict) else None

    def _division_record(self, step: int, carried: bool = True) -> str | None:
        """The text recorded for ``step`` (its plain record, read from its file or, with
        ``carried``, carried by an entry), None if not found."""
        if carried and step in self._carried:
            return self._carried[step]
        log = self.log(root_layout.DIVISIONS)
        snap = self.snapshot(root_layout.DIVISIONS, log.newest or 0)
        for rel, (lo, hi) in snap.bounds.items():
            if lo.get("step") is not None and lo["step"] <= step <= hi.get("step", step):
                path = os.path.join(log.uri, rel)
                try:
                    for row in _parquet_table(path).to_pylist():
                        if row["step"] == step and \
                                division_log.quarantine_reason(row["uppers"]) is None:
                            return str(row["uppers"])
                except Exception:  # noqa: BLE001 - a damaged file was reported by its check
                    return None
        return None

    # -- reports ------------------------------------------------------------------------------
    def table_reports(self) -> list[TableReport]:
        """One report per table, after the checkpoints were checked (whose damage it holds);
        none for a state table an upgrade retired that no retained checkpoint records (no
        open reads it again: garbage collection deletes it, perhaps half-way when a crash
        cuts it short)."""
        dead = self._retired_tables()
        for table in self.kinds:  # every table at least at its newest version
            newest = self.log(table).newest
            if newest is not None and not self._checked.get(table) and table not in dead:
                self.snapshot(table, newest)
        reports = []
        for table, kind in self.kinds.items():
            if table in dead:
                continue
            log = self.log(table)
            versions = tuple(sorted(self._checked.get(table, ())))
            damage: list[Damage] = []
            for v in versions:
                damage += self._snapshots[(table, v)].damage
            if log.newest is not None:
                damage += log.damage(max(versions, default=-1) + 1, log.newest)
            damage += [d for d in self.lost + self.broken if d.table == table]
            damage += [d for d in self._log_damage or [] if d.table == table]
            for c in self.checkpoints():
                damage += [d for d in self.checkpoint_damage(c) if d.table == table]
            last = self._snapshots[(table, versions[-1])] if versions else _Snapshot()
            adds, removes = self._staged_on(table) if kind == "state" else ([], [])
            reports.append(TableReport(
                table, kind, log.newest, versions, last.files, last.rows, tuple(_unique(damage)),
                staged_files=len(adds),
                staged_rows=sum(_num_records(a.get("stats")) or 0 for a in adds),
                staged_removes=len(removes)))
        return reports

    def _staged_on(self, table: str) -> tuple[list[dict[str, Any]], list[object]]:
        """The add records and removed paths the newest readable checkpoint stages on state
        table ``table`` (none when it stages nothing there, or records it unreadably: that is
        damage, reported with the checkpoint)."""
        checkpoints = self.checkpoints()
        if not checkpoints:
            return [], []
        newest = checkpoints[0]
        record = newest.staged_record(table)
        removes = record.get("removes", []) if isinstance(record, dict) else []
        if not isinstance(removes, list) or not all(isinstance(r, str) for r in removes):
            removes = []
        return newest.staged_adds(table) or [], removes

    def _retired_tables(self) -> set[str]:
        """The state tables the newest checkpoint lists as retired and no retained checkpoint
        records."""
        checkpoints = self.checkpoints()
        if not checkpoints:
            return set()
        listed = checkpoints[0].entry.get(RETIRED_TABLES_KEY, [])
        recorded = {name for cp in checkpoints for name in cp.entry.get("traces", {})}
        return {os.path.join(root_layout.STATE, name) for name in listed
                if name not in recorded}

    def side_file_damage(self) -> list[Damage]:
        path = root_layout.plan_schemas(self.root)
        if file_size(path) is None:
            return []
        try:
            read_schema_cache(path)
        except (OSError, ValueError) as e:
            return [Damage(SCHEMA_CACHE_FILE, None, path, f"the schema cache is damaged: {e}")]
        return []

    def error(self, damage: list[Damage], what: str,
              target: int | None = None) -> CorruptStateError:
        """The error for ``damage`` (the first is named) found doing ``what``, saying which
        retained checkpoint is intact; ``target``: the checkpoint a restore asked for."""
        first = damage[0]
        intact = None
        for c in self.checkpoints():
            if c.version != target and not self.checkpoint_damage(c):
                intact = c
                break
        more = f" (and {len(damage) - 1} more problems)" if len(damage) > 1 else ""
        if intact is not None:
            remedy = (f"checkpoint {intact.version} ({checkpoint_place(intact.step)}) is "
                      f"intact: restore it with Pipeline(..., checkpoint={intact.version}) or "
                      "the restore job; "
                      "the damaged newer state is set aside and the steps since are executed "
                      "again from their recorded input")
        else:
            checked = ", ".join(str(c.version) for c in self.checkpoints()) or "none readable"
            remedy = (f"no retained checkpoint is intact (checked: {checked}); repair the "
                      "table from a copy, or start a new root")
        return CorruptStateError(self.root, first.table, first.version, first.file,
                                 first.problem + more, what=what, remedy=remedy,
                                 intact_checkpoint=None if intact is None else intact.version)


# -- helpers -------------------------------------------------------------------------------

def _data_file_problem(path: str, size: int | None, rows: int | None) -> str | None:
    """What is wrong with the data file at ``path`` that its add action records with ``size``
    bytes and ``rows`` rows, or None."""
    try:
        actual = file_size(path)
    except OSError as e:
        return f"the data file cannot be read ({e})"
    if actual is None:
        return _MISSING
    if size is not None and actual != size:
        return f"the data file has {actual} bytes but its commit records {size}"
    try:
        meta = _parquet_metadata(path)
    except Exception as e:  # noqa: BLE001 - any unreadable footer is damage
        return f"the data file's Parquet footer is unreadable ({_first_line(e)})"
    if rows is not None and meta.num_rows != rows:
        return f"the data file holds {meta.num_rows} rows but its commit records {rows}"
    return None


def _num_records(stats: object) -> int | None:
    try:
        value = json.loads(stats).get("numRecords") if isinstance(stats, str) else None
    except ValueError:
        return None
    return value if isinstance(value, int) else None


def _marker_damage(table: str, uri: str) -> list[Damage]:
    out = []
    for name in OUTPUT_MARKERS:
        path = os.path.join(uri, name)
        try:
            text = read_text(path)
            if text is None:
                continue
            int(text.strip())
        except (OSError, ValueError) as e:
            out.append(Damage(table, None, path, f"the history-compaction marker is not a "
                              f"step number ({_first_line(e)})"))
    return out


def _parquet_metadata(path: str) -> pq.FileMetaData:
    """The footer of the Parquet file ``path`` (local or on S3)."""
    fs, name = filesystem(path)
    return pq.read_metadata(name, filesystem=fs)


def _parquet_table(path: str, columns: list[str] | None = None) -> pa.Table:
    """The Parquet file ``path`` (local or on S3), or its ``columns``."""
    fs, name = filesystem(path)
    return pq.read_table(name, columns=columns, filesystem=fs, **CHECKSUMS_READ)


def _unique(damage: list[Damage]) -> list[Damage]:
    return list(dict.fromkeys(damage))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _carried_records(entry: dict[str, Any]) -> dict[int, str]:
    """The step records a manifest entry carries (``runtime/step_protocol.py``): step -> the
    record's text."""
    records = entry.get("meta", {}).get(division_log.CARRIED_RECORDS_KEY)
    out: dict[int, str] = {}
    if isinstance(records, list):
        for item in records:
            try:
                text = str(item[1])
                division_log.parse(text)
                out[int(item[0])] = text
            except (TypeError, ValueError, IndexError, KeyError):
                continue
    return out
