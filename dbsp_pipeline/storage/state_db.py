"""The two-version state database (``docs/recovery.md``, section 5).

State is the set of operator traces (Delta tables, see ``trace.py``) plus small metadata. A
**manifest** (a tiny Delta table holding one entry per database version) ties them together:
entry ``v`` records, for every trace table, the Delta version that belongs to database version
``v``, plus the step, the metadata written with ``put``, and the circuit fingerprint.

Contract (DBSP's two-version database interface):

* A new database has one version, 0, which is empty.
* ``open(v)`` makes ``v`` the base: every trace is rolled back to the Delta version entry ``v``
  records (newer trace versions, written after the last commit, are discarded by a Delta
  ``restore``), and later database versions are discarded. Reads and writes then go to ``v + 1``.
* ``commit()`` appends manifest entry ``v + 1``; after it returns, ``v`` and ``v + 1`` can be
  opened. The manifest commit is the single atomic commit point: a crash before it leaves ``v``
  intact, a crash after it leaves ``v + 1``.
* ``get``/``put`` store small JSON values; ``get_step``/``set_step`` the next step to execute.
* The retained versions (``retained_entries``) are the chain of entries from the newest back,
  each naming its base (``manifest_base``). The chain holds the entries of the ``retained``
  newest steps (``retains``: a checkpoint with no step since the one below it, as a close or a
  merge's commit makes, does not push a step's out), and ends at an entry garbage collection
  deleted, and at an entry whose step is below ``from_step``: the
  caller's first step it can still execute again (the pipeline passes its division log's
  ``compacted_below``; a version below it is not restorable, even after the retention was
  raised and its entry is still on disk).

Durability: a state table's changes are staged (``staged_table.py``): its data files are
written as a step makes them, and the entry of the next commit records, per table, its Delta
version *and the actions staged since* (``"staged"``), so a step commits nothing to the state
tables and the manifest commit stays the one atomic commit point. When a table has staged
``FOLD_ACTIONS`` actions or more, ``commit`` first folds them into its Delta log (one commit)
and records the new version with nothing staged; a crash between the fold and the manifest
commit is rolled back at open like any trace commit after a checkpoint. Delta time travel keeps
the recorded version readable, which is what makes rollback possible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.errors import CircuitChangedError, UsageError
from dbsp_pipeline.storage import garbage
from dbsp_pipeline.storage.data_files import CHECKSUMS_READ
from dbsp_pipeline.storage.delta_store import PROPERTIES_OPERATION
from dbsp_pipeline.storage.delta_table import SparkDeltaTable
from dbsp_pipeline.storage.small_files import count_files, remove_folder
from dbsp_pipeline.storage.staged_table import STAGED_KEY, StagedTable, add_from_record
from dbsp_pipeline.storage.table_store import root_uri

MANIFEST_DIR = root_layout.MANIFEST
STATE_FORMAT = 6  # see runtime/upgrade.py for what each format adds
#: a state table with this many staged actions or more, or whose staged actions this many
#: checkpoints have recorded, is folded into its Delta log at the next commit (bounds the size
#: of a manifest entry and what opening re-stages; a one-step memory, which stages about two
#: actions for ever, still folds, so its old files become garbage). Each fold is a delta-rs commit
#: and log read (3.5-4.5 ms): at 8, folds were about one commit in four of a small step's; at
#: 32, 100-row steps at 1M orders ran 10% faster (three interleaved pairs: 42.1, 40.8, 39.9
#: steps/s at 8; 44.6, 45.8, 46.6 at 32; 64 gained nothing more beyond the noise)
FOLD_ACTIONS = 32
ENGINE_VERSION = "0.1.0"
#: the key of an upgrade's entry recording the circuit change (``runtime/circuit_upgrade.py``)
CIRCUIT_CHANGE_KEY = "circuit_change"
#: the key of the state tables an upgrade retired and garbage collection has not deleted yet
#: (``retire_tables``; ``storage/verify.py`` does not check them)
RETIRED_TABLES_KEY = "retired_tables"
_MANIFEST_SCHEMA = StructType([
    StructField("version", LongType(), False),
    StructField("entry", StringType(), False),
])


def checkpoint_place(step: int) -> str:
    """Where a checkpoint stands among the steps, from the next step its entry records: how
    reports and errors name it ("after step 4", "before any step")."""
    return f"after step {step - 1}" if step > 0 else "before any step"


class StateDatabase:
    """Versioned operator state under ``root``. See the module docstring for the contract."""

    def __init__(self, spark: SparkSession, root: str, fingerprint: str) -> None:
        self.spark = spark
        self.root = root_uri(root)
        self.fingerprint = fingerprint
        self._manifest = SparkDeltaTable(spark, root_layout.manifest(self.root),
                                         _MANIFEST_SCHEMA, role="manifest",
                                         single_writer=True)
        self._tables: dict[str, StagedTable] = {}
        self._manifest_files: list[str] | None = None  # the files of the newest entry
        self._base: dict[str, Any] | None = None  # the opened entry
        self._meta: dict[str, Any] = {}
        self._step = 0
        self._state_id: str | None = None
        #: tables the next commit no longer records (``retire_tables``)
        self._retired: set[str] = set()
        #: retired tables garbage collection deleted: the next commit no longer lists them
        self._removed: set[str] = set()

    # -- the two-version interface -------------------------------------------------------
    def versions(self, retained: int = 2, from_step: int = 0) -> range:
        """The versions ``open`` accepts: the newest ``retained`` committed versions (DBSP's
        two by default; a pipeline that keeps more checkpoints passes its retention), none with
        a step below ``from_step`` (see the module docstring)."""
        entries = self.retained_entries(max(1, retained), from_step)
        return range(entries[-1][1]["version"], entries[0][1]["version"] + 1)

    def open(self, version: int | None = None, retained: int = 2, from_step: int = 0, *,
             circuit_change: bool = False) -> int:
        """Open ``version`` (default: the newest; any of the newest ``retained`` whose step is
        not below ``from_step``) as the base; returns it. Opening an older version discards the
        newer ones: their trace versions are rolled back and the next commit is
        ``version + 1``. A version below ``from_step`` is ``UsageError``, saying so. A version
        another circuit recorded is ``CircuitChangedError``, unless ``circuit_change`` (an
        upgrade, ``runtime/circuit_upgrade.py``: ``recorded_fingerprint`` then says which)."""
        entries = self.retained_entries(max(1, retained), from_step)
        latest = entries[0][1]
        if version is None:
            version = latest["version"]
        by_version = {entry["version"]: entry for _, entry in entries}
        if version not in by_version:
            raise UsageError(self._not_retained(version, retained, from_step, sorted(by_version)))
        entry = by_version[version]
        recorded_fp = entry.get("fingerprint")
        if recorded_fp and recorded_fp != self.fingerprint and not circuit_change:
            if version != latest["version"]:  # a checkpoint from before an upgrade
                remedy = ("a checkpoint from before an upgrade is not restored (the views' logs "
                          "hold what the upgrade and the steps since wrote); restore one taken "
                          "since (Pipeline.checkpoints() lists them)")
            else:
                remedy = ("to change the views of a running pipeline, open the newest state "
                          "with Pipeline(..., upgrade=True) (Dagster: the upgrade job with "
                          "allow_circuit_change: true)")
            raise CircuitChangedError(
                f"state version {version} of the pipeline at {self.root} was recorded by a "
                f"different circuit (fingerprint {recorded_fp[:12]}, this circuit "
                f"{self.fingerprint[:12]}); {remedy}")
        upgrade = next((e for _, e in reversed(entries) if e["version"] > version and (
            CIRCUIT_CHANGE_KEY in e
            or (recorded_fp and e.get("fingerprint") not in (None, recorded_fp)))), None)
        if upgrade is not None:  # (refused before anything is rolled back)
            raise CircuitChangedError(
                f"state version {version} of the pipeline at {self.root} is from before the "
                f"upgrade its version {upgrade['version']} recorded (step "
                f"{upgrade.get('step', '?')}): a pipeline is not taken back past an upgrade, "
                "with either circuit (the views' logs hold what the upgrade and the steps since "
                "wrote); open the newest state, or restore a checkpoint taken since "
                "(Pipeline.checkpoints() lists them)")
        if version != latest["version"]:
            # Discard the newer versions: a new manifest commit whose entry is a copy of
            # ``version`` (so the next commit's base chain leads back through ``version``).
            self._write_entry(dict(entry))
        self._base = entry
        self._meta = dict(entry.get("meta", {}))
        self._step = int(entry.get("step", 0))
        self._retired = set()
        for table in self._tables.values():
            self._roll_back(table)
        return version

    def commit(self, fold_all: bool = False, *,
               circuit_change: Mapping[str, Any] | None = None) -> int:
        """Record the current state as version ``base + 1``; returns the new version. Tables
        with ``FOLD_ACTIONS`` staged actions or more (with ``fold_all``, every table) are
        folded into their Delta logs first. With ``circuit_change`` (an upgrade: the entry's
        circuit is ``fingerprint``, another than its base's), the entry records it, folds no
        table (a kept operator's table stays at the very version and staged actions it had)
        and no longer records the tables ``retire_tables`` named."""
        base = self._require_open()
        for table in self._tables.values() if circuit_change is None else ():
            if table.staged_actions and (fold_all or table.staged_actions >= FOLD_ACTIONS
                                         or table.checkpoints_since_fold >= FOLD_ACTIONS):
                table.fold()
            elif table.staged_actions:
                table.checkpoints_since_fold += 1
        # tables not opened in this process keep the version and staged actions the base
        # recorded
        staged = {**base.get(STAGED_KEY, {}),
                  **{name: t.record() for name, t in self._tables.items()}}
        traces = {**base.get("traces", {}), **{
            name: t.delta.loaded_version() for name, t in self._tables.items()}}
        retired = (set(base.get(RETIRED_TABLES_KEY, [])) | self._retired) - self._removed
        entry = {
            "version": base["version"] + 1,
            "step": self._step,
            "meta": self._meta,
            "traces": dict(sorted((n, v) for n, v in traces.items() if n not in self._retired)),
            STAGED_KEY: {name: record for name, record in sorted(staged.items())
                         if record and name not in self._retired},
            "fingerprint": self.fingerprint,
            "engine_version": ENGINE_VERSION,
            "state_format": STATE_FORMAT,
            "manifest_base": self._manifest.version(),
            **({RETIRED_TABLES_KEY: sorted(retired)} if retired else {}),
            **({} if circuit_change is None else {CIRCUIT_CHANGE_KEY: dict(circuit_change)}),
        }
        self._write_entry(entry)
        for table in self._tables.values():  # the entry records them: their writes are over
            table.delta.committed_files.update(table.staged_paths())
        self._base = entry
        self._retired = set()
        return int(entry["version"])

    def retire_tables(self, names: Iterable[str]) -> None:
        """Leave the state tables ``names`` out of the entries from the next commit on: an
        upgrade retires its retired operators' tables, a state migration the tables it copied.
        A table opened in this process is closed, if the open version records all of it (else
        ``UsageError``: it is in use). The tables stay on disk, as the older entries that
        record them left them, and the entries list them (``RETIRED_TABLES_KEY``: what
        ``verify`` does not check, since no plan opens them again) until garbage collection
        has deleted them, once no retained entry records them."""
        opened = set(names) & set(self._tables)
        in_use = sorted(n for n in opened
                        if self._tables[n].record() != self.recorded_staged(n)
                        or self._tables[n].delta.loaded_version() != self.recorded_version(n))
        if in_use:
            raise UsageError(f"state tables {in_use} are in use: they cannot be retired")
        for name in opened:
            del self._tables[name]
        self._retired |= set(names)

    @property
    def recorded_fingerprint(self) -> str | None:
        """The fingerprint of the circuit that recorded the open version (None: version 0)."""
        fingerprint = self._require_open().get("fingerprint")
        return None if fingerprint is None else str(fingerprint)

    def newest_fingerprint(self) -> str | None:
        """The fingerprint of the circuit that recorded the newest committed entry, whichever
        version is open (or none is yet); None for a new database."""
        fingerprint = self._latest_entry().get("fingerprint")
        return None if fingerprint is None else str(fingerprint)

    def newest_meta(self, key: str, default: Any = None) -> Any:
        """The metadata ``key`` of the newest committed entry, whichever version is open (or
        none is yet)."""
        return self._latest_entry().get("meta", {}).get(key, default)

    def fence(self) -> None:
        """Commit the open entry again, unchanged (the same state version), at the manifest's
        next version (compare-and-append): from here on a commit by a process that opened the
        manifest before fails."""
        self._write_entry(dict(self._require_open()))

    def get(self, key: str, default: Any = None) -> Any:
        self._require_open()
        return self._meta.get(key, default)

    def put(self, key: str, value: Any) -> None:
        self._require_open()
        json.dumps(value)  # must be JSON-serializable: fail here, not at commit
        self._meta[key] = value

    def get_step(self) -> int:
        self._require_open()
        return self._step

    def set_step(self, step: int) -> None:
        self._require_open()
        self._step = int(step)

    def retained_entries(self, count: int,
                         from_step: int = 0) -> list[tuple[int, dict[str, Any]]]:
        """The newest ``count`` committed entries as (manifest version, entry), newest first:
        the state versions garbage collection keeps readable. The chain ends before an entry
        whose step is below ``from_step`` (see the module docstring); the newest entry, the
        state itself, is always there."""
        out: list[tuple[int, dict[str, Any]]] = []
        manifest_version: int | None = self._manifest.version()
        while manifest_version is not None:
            manifest_version, entry = self._entry_of(manifest_version)
            if entry is None or (out and int(entry.get("step", 0)) < from_step):
                break
            if not retains([int(e.get("step", 0)) for _, e in out], int(entry.get("step", 0)),
                           count):
                break
            out.append((manifest_version, entry))
            manifest_version = entry.get("manifest_base")
        return out

    def checkpoints(self, count: int, from_step: int = 0) -> list[dict[str, Any]]:
        """The newest ``count`` committed entries (newest first) whose step is not below
        ``from_step``: version, step, metadata, fingerprint, engine version and state format of
        each retained checkpoint."""
        return [entry for _, entry in self.retained_entries(count, from_step)]

    def collect_garbage(self, retain_versions: int, grace_seconds: float,
                        from_step: int = 0) -> int:
        """Delete the files of the manifest and of every state table that none of the newest
        ``retain_versions`` state versions whose step is not below ``from_step`` (nor anything
        newer) refers to; returns how many.
        Their Delta logs lose the commits below the newest Delta checkpoint at or before the
        oldest version a retained state version reads (``clean_log_below``), so opening lists
        a log bounded by the retained history, not by every commit ever made."""
        retained = self.retained_entries(max(1, retain_versions), from_step)
        oldest_manifest = min(v for v, _ in retained)
        deleted = garbage.collect(self._manifest, oldest_manifest, grace_seconds)
        self._manifest.clean_log_below(oldest_manifest)
        for name, table in self._tables.items():
            keep = min(entry.get("traces", {}).get(name, 0) for _, entry in retained)
            staged = table.staged_paths() | {  # files no Delta version refers to yet
                table.store.path(add["path"]) for _, entry in retained
                for add in entry.get(STAGED_KEY, {}).get(name, {}).get("adds", [])}
            deleted += garbage.collect(table.delta, keep, grace_seconds, also_referenced=staged)
            table.delta.clean_log_below(keep)
        return deleted + self._remove_retired_tables(retained)

    def _remove_retired_tables(self, retained: list[tuple[int, dict[str, Any]]]) -> int:
        """Delete the retired state tables (``retire_tables``) that no retained entry records
        and this process did not open: once the last checkpoint that read them is no longer
        retained. Returns how many files went with them. A deletion a crash cuts short is
        done again by the next collection (the entries list the table until then)."""
        referenced = set(self._tables) | {
            name for _, entry in retained for name in entry.get("traces", {})}
        deleted = 0
        for name in self._require_open().get(RETIRED_TABLES_KEY, []):
            if name in referenced or name in self._removed:
                continue
            folder = root_layout.state_table(self.root, name)
            files = count_files(folder)
            if files:  # (an object store may go on listing a folder it holds nothing in)
                remove_folder(folder)
                deleted += files
            self._removed.add(name)
        return deleted

    # -- tables ----------------------------------------------------------------------------
    def table(self, name: str, schema: StructType) -> StagedTable:
        """The state table ``name`` (created empty if new), rolled back to the open version
        with the actions that version stages."""
        if name not in self._tables:
            table = StagedTable(SparkDeltaTable(
                self.spark, root_layout.state_table(self.root, name), schema, role="trace",
                single_writer=True), writes_behind=True)
            self._tables[name] = table
            if self._base is not None:
                self._roll_back(table)
        return self._tables[name]

    def wait_for_writes(self) -> None:
        """Wait for every data file the tables write behind the step's computation
        (``storage/write_behind.py``); raises the first failed write's ``StorageError`` once
        all ended. The step protocol calls it before it records anything of a step."""
        failure: BaseException | None = None
        for table in self._tables.values():
            try:
                table.wait_for_writes()
            except BaseException as e:  # noqa: BLE001 (raised below, once all ended)
                failure = failure or e
        if failure is not None:
            raise failure

    @property
    def version(self) -> int:
        return int(self._require_open()["version"])

    @property
    def state_id(self) -> str:
        """The id of this state: its manifest table's Delta metadata id, fixed when the root's
        state was created (what ``read_status(root).pipeline_id`` reports). A root deleted and
        created again has another id; opening, committing and restoring never change it."""
        if self._state_id is None:
            self._state_id = self._manifest.table_id()
        return self._state_id

    @property
    def recorded_format(self) -> int:
        """The state format the opened version was written in (the empty version 0 counts as
        the current format)."""
        return state_format_of(self._require_open())

    @property
    def recorded_engine(self) -> str | None:
        """The engine version that wrote the opened version (None for the empty version 0)."""
        return self._require_open().get("engine_version")

    def open_tables(self) -> list[str]:
        """The state tables this process opened (``table``), by name."""
        return sorted(self._tables)

    def recorded_traces(self) -> dict[str, int]:
        """Every state table the open version records, with its Delta version."""
        return dict(self._require_open().get("traces", {}))

    def recorded_version(self, name: str) -> int | None:
        """The Delta version of table ``name`` recorded by the open state version."""
        version = self._require_open().get("traces", {}).get(name)
        return None if version is None else int(version)

    def read_recorded(self, name: str, schema: StructType) -> pa.Table:
        """The rows (``schema``: the table's own, with ``_weight`` and ``_shard``) of state
        table ``name`` as the open version records it: its Delta version's files less the
        staged removes, plus the staged adds. Read without opening the table in this database,
        so that it can still be retired (``retire_tables``): a migration's source."""
        version = self.recorded_version(name)
        if version is None:
            raise UsageError(f"state version {self._require_open()['version']} of the "
                             f"pipeline at {self.root} records no table {name}")
        table = SparkDeltaTable(self.spark, root_layout.state_table(self.root, name), schema,
                                role="trace", single_writer=True)
        staged = self.recorded_staged(name)
        removes = {table.store.path(str(p)) for p in staged.get("removes", [])}
        paths = [f.path for f in table.files(version) if f.path not in removes]
        paths += [table.data_file(add_from_record(a)).path for a in staged.get("adds", [])]
        return table.read_arrow(paths) if paths else table.arrow_schema.empty_table()

    # -- internals -------------------------------------------------------------------------
    def recorded_staged(self, name: str) -> dict[str, Any]:
        """The actions the open version stages for table ``name`` (``staged_table.py``; none
        for a table the version does not record)."""
        entry = self._require_open()
        if name not in entry.get("traces", {}):
            return {}
        return dict(entry.get(STAGED_KEY, {}).get(name, {}))

    def set_table_properties(self, properties: Mapping[str, str]) -> list[str]:
        """Set Delta table ``properties`` on every state table this process opened that lacks
        them (a metadata-only commit each, at the version after the loaded one); returns their
        names. The caller commits, which records the new versions; until then the open version
        records the old ones, so after a crash the next open rolls the tables back (the
        rollback restores their old metadata too) and sets the properties again."""
        return sorted(name for name, t in self._tables.items()
                      if t.delta.set_properties(properties))

    def set_manifest_properties(self, properties: Mapping[str, str]) -> bool:
        """Set Delta table ``properties`` on the manifest unless it has them; returns whether
        it committed. The commit adds no entry: every reader of the manifest takes it for the
        entry below it (``_entry_of``; ``verify.py`` alike). Called before the open's fence,
        whose entry copies the open one's ``manifest_base``: the commit is then neither the head
        nor any entry's base (so an older engine's readers never meet it), but after a crash
        between the two."""
        return self._manifest.set_properties(properties)

    def changed(self, meta: Mapping[str, Any] | None = None) -> bool:
        """Whether a commit now would record anything the open version does not: a state table
        staged or loaded at another version (``dirty``), a table retired, another step or other
        metadata (with ``meta``'s keys put first)."""
        base = self._require_open()
        recorded = base.get("meta", {})
        return (self.dirty or bool(self._retired)
                or self._step != int(base.get("step", 0))
                or any(t.delta.loaded_version() != self.recorded_version(n)
                       for n, t in self._tables.items())
                or {**self._meta, **(meta or {})} != recorded)

    @property
    def dirty(self) -> bool:
        """Whether a state table stages other actions than the open version records (a
        compaction or a layout change staged since; uncommitted steps are counted apart)."""
        return any(t.record() != self.recorded_staged(name) for name, t in self._tables.items())

    def _roll_back(self, table: StagedTable) -> None:
        name = os.path.basename(table.uri)
        recorded = self.recorded_version(name)
        target = 0 if recorded is None else recorded
        if table.delta.version() != target:
            table.delta.restore(target)
        table.load(self.recorded_staged(name))

    def _require_open(self) -> dict[str, Any]:
        if self._base is None:
            raise UsageError("the state database is not open")
        return self._base

    def _not_retained(self, version: int, retained: int, from_step: int,
                      available: list[int]) -> str:
        """Why ``open`` refuses ``version``: below ``from_step``, or not retained at all."""
        for _, entry in self.retained_entries(max(1, retained)):
            step = int(entry.get("step", 0))
            if entry["version"] == version and step < from_step:
                return (f"checkpoint {version} ({checkpoint_place(step)}) of the state at "
                        f"{self.root} cannot "
                        f"be restored: it was compacted, the division log keeps the divisions "
                        f"from step {from_step} on (compacted_below) and restoring it would "
                        f"execute steps {step}..{from_step - 1} again; retained checkpoints: "
                        f"{available}")
        return (f"state version {version} cannot be opened: it is not among the "
                f"{max(1, retained)} newest checkpoints this pipeline retains "
                f"(retain_checkpoints), whose files garbage collection keeps; available: "
                f"{available}")

    def _latest_entry(self) -> dict[str, Any]:
        entry = self._entry_of(self._manifest.version())[1]
        return entry if entry is not None else _empty_entry()

    def _entry_of(self, manifest_version: int) -> tuple[int, dict[str, Any] | None]:
        """The entry manifest version ``manifest_version`` holds, with the version that added
        it: itself, or for a commit that only set table properties (``runtime/upgrade.py``;
        it adds no entry) the entry below it. None where there is no readable entry."""
        while True:
            entry = self._entry_at_manifest(manifest_version)
            if entry is not None or manifest_version <= 0 \
                    or not self._is_properties_commit(manifest_version):
                return manifest_version, entry
            manifest_version -= 1

    def _is_properties_commit(self, manifest_version: int) -> bool:
        try:
            infos = self._manifest.commit_infos(manifest_version - 1, manifest_version)
        except (FileNotFoundError, DeltaError, OSError, ValueError):
            return False  # not readable: damage or collected history, not a properties commit
        return [i.get("operation") for i in infos] == [PROPERTIES_OPERATION]

    def _entry_at_manifest(self, manifest_version: int | None) -> dict[str, Any] | None:
        if manifest_version is None:
            return None
        if manifest_version == 0:
            return _empty_entry()
        # The entry commit ``manifest_version`` added (not the version's files: were that commit
        # damaged, they would be an older entry's). Damage ends the chain, as garbage does;
        # opening checks the newest entry first (``verify.py``).
        try:
            files = self._manifest.added_files(manifest_version - 1, manifest_version)
            if len(files) != 1:
                return None
            row = pq.read_table(files[0].path, **CHECKSUMS_READ).to_pylist()[0]
            entry: dict[str, Any] = json.loads(row["entry"])
            return entry
        except (FileNotFoundError, DeltaError):
            return None  # beyond the retained versions: garbage-collected (or its log cleaned)
        except (ValueError, OSError, IndexError, KeyError, pa.ArrowException):
            return None  # damaged

    def _write_entry(self, entry: dict[str, Any]) -> None:
        if self._manifest_files is None:
            self._manifest_files = [f.path for f in self._manifest.files()]
        data = pa.table({"version": [entry["version"]], "entry": [json.dumps(entry)]},
                        schema=self._manifest.arrow_schema)
        adds = self._manifest.write_arrow(data)
        self._manifest.commit(adds, self._manifest_files)
        self._manifest_files = [os.path.join(self._manifest.uri, a.path) for a in adds]


#: how many checkpoints beyond ``count`` retention keeps, at most, per retained step counted
#: (``retains``): the bound is ``count * (1 + SAME_STEP_EXTRA)`` checkpoints in all
SAME_STEP_EXTRA = 4


def retains(kept_steps: list[int], step: int, count: int) -> bool:
    """Whether retention keeping ``count`` checkpoints keeps the next older one, at ``step``,
    after ``kept_steps`` (newest first). It keeps the checkpoints of the ``count`` newest steps:
    a checkpoint committed with no step since the one below it (a close, a merge's, a
    rescale's or an upgrade's commit) would otherwise push the previous step's out, leaving
    nothing to go back to. The chain holds at most ``count * (1 + SAME_STEP_EXTRA)``
    checkpoints in all (each is walked by every collection and open), so a longer run of
    checkpoints at one step (an idle pipeline's scheduled checkpoints) does push the older
    steps' out."""
    steps = set(kept_steps)
    if len(steps) < count:
        return len(kept_steps) < count * (1 + SAME_STEP_EXTRA)
    return step in steps and len(kept_steps) < count * (1 + SAME_STEP_EXTRA)


def state_format_of(entry: Mapping[str, Any]) -> int:
    """The state format a manifest entry was written in (the empty version 0, which records
    none, counts as the current format; any other entry without one is format 1)."""
    return int(entry.get("state_format", STATE_FORMAT if entry["version"] == 0 else 1))


def _empty_entry() -> dict[str, Any]:
    """Database version 0: no state, step 0."""
    return {"version": 0, "step": 0, "meta": {}, "traces": {}, "manifest_base": None}
