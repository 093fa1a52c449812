"""A Delta table kept by delta-rs, its files reached through a pyarrow filesystem.

The part of a ``TableStore`` (``storage/table_store.py``) every backend shares: delta-rs commits,
restores and answers snapshot questions (files of a version, app transactions); the commit files
of ``_delta_log`` are read directly (``<version>.json``, one action a line), so asking about a
range of versions costs one read a commit, not a replay of the table's history. A backend
(``LocalTableStore``, ``S3TableStore``) says how to reach its files: the pyarrow filesystem, the
delta-rs storage options, and how a table URI maps to a filesystem path.

Durability: a version exists once ``commit`` (or ``restore``) returns. delta-rs creates the
version's commit file with put-if-absent (a hard link on a local disk, a conditional put on an
object store), so of two writers racing for one version exactly one wins; with
``expected_version`` the loser gets ``ConcurrentWriterError`` and nothing of its commit is
visible. Data files written but not committed are invisible to every Delta reader and are removed
by garbage collection (``storage/garbage.py``).

After a commit bound to a version (``expected_version``, every commit of the engine's own
tables), the handle reloads the version it committed in the background thread of
``storage/write_behind.py`` (delta-rs's handle does not keep the snapshot its commit built, and
replaying the commit again costs about a millisecond): the committing step goes on, and whatever
uses the handle next waits for the reload (``_table``). The commit is durable before the reload
starts; a reload that fails is run again by the next user of the handle, whose call raises its
``StorageError`` if it fails again.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import time
from collections.abc import Mapping, Sequence, Set
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction

from dbsp_pipeline.errors import ConcurrentWriterError, StorageError
from dbsp_pipeline.storage import write_behind
from dbsp_pipeline.storage.data_files import DataFiles, millis
from dbsp_pipeline.storage.set_aside import LAST_CHECKPOINT, checkpoint_hint_version
from dbsp_pipeline.storage.table_store import (
    ACTIONS_KEY,
    DATA_DIR,
    DataFile,
    FileChange,
    StoredFile,
)

LOG_DIR = "_delta_log"
#: Delta configuration of every table the engine creates (a caller's configuration wins):
#: a Delta checkpoint every 10 commits, and no tombstones in it. delta-rs replays every commit
#: since the newest checkpoint at each commit and log read: in 100-row steps, where the manifest
#: and an input log take a commit each step, a manifest commit plus the read after it cost 8.7 ms
#: at an interval of 50 and 6.8 ms at 10, an input log's 12.7 and 9.6 ms (a checkpoint is one
#: Parquet file listing the table's live files). A checkpoint keeps a ``remove`` action for
#: every file removed within ``deletedFileRetentionDuration`` (7 days by default)
#: for VACUUM's sake; the engine never runs VACUUM (``storage/garbage.py`` decides by the
#: versions it retains), and a table that replaces files at every step (a log folded, a trace
#: merged) would carry one tombstone per step: after 100,000 steps, a 6 MB checkpoint read by
#: every open and status read. Snapshots at any version are rebuilt from adds and removes of
#: the commits, which stay until ``clean_log_below``; only checkpoints leave tombstones out.
#: Tables an older engine created get these properties at open (``runtime/upgrade.py``'s
#: ``set_table_properties``).
DEFAULT_CONFIGURATION = {"delta.checkpointInterval": "10",
                         "delta.deletedFileRetentionDuration": "interval 0 seconds"}

#: What delta-rs does after a commit: it writes the checkpoint every ``checkpointInterval``
#: versions, but does not look for expired log files. Its cleanup lists ``_delta_log`` at every
#: commit (a third of a small commit's time) to delete files older than the 30-day log
#: retention, and the pipeline deletes the log files it no longer reads itself, much earlier
#: (``clean_log_below``, from the versions its checkpoints and readers hold).
COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


#: how delta-rs names the conflict of an append with a concurrent metadata change
_METADATA_CHANGED = re.compile(r"[Mm]etadata changed")

#: the operation delta-rs records for ``set_properties``'s commit (only a ``metaData`` action)
PROPERTIES_OPERATION = "SET TBLPROPERTIES"


def has_properties(current: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Whether table properties ``current`` hold every one of ``wanted`` (``set_properties``
    then commits nothing)."""
    return all(current.get(k) == v for k, v in wanted.items())


def is_properties_commit(actions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the actions of one commit file are a ``set_properties`` commit: table
    properties changed, no file added or removed, no app transaction."""
    kinds = {k for a in actions for k in a}
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
    return (kinds == {"commitInfo", "metaData"} and isinstance(info, Mapping)
            and info.get("operation") == PROPERTIES_OPERATION)


class DeltaTableStore:
    """A Delta table at ``uri`` reached through ``filesystem``. Subclasses choose the filesystem
    and the mapping from URIs to its paths; see the module docstring for the contracts."""

    def __init__(self, uri: str, schema: pa.Schema, configuration: Mapping[str, str] | None,
                 *, filesystem: pafs.FileSystem,
                 storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.schema = schema
        self._fs = filesystem
        self._options: dict[str, str] | None = dict(storage_options) if storage_options else None
        #: the table's data files (written and read without the log)
        self.data = DataFiles(uri, schema, filesystem)
        #: the delta-rs handle; read it through ``_table``, which waits for a reload behind
        self._loaded = self._open_or_create(configuration)
        #: the reload running behind the last commit (``_refresh_behind``)
        self._loading: Future[None] | None = None

    @property
    def _table(self) -> DeltaTable:
        """The delta-rs handle, once the reload running behind a commit (if any) has ended."""
        loading = self._loading
        if loading is not None:
            failed = loading.exception() is not None  # (waits)
            self._loading = None
            if failed:
                self._update()  # once more, here: raises StorageError if it fails again
        return self._loaded

    # -- what a backend says -----------------------------------------------------------------
    def fs_path(self, path: str) -> str:
        """The filesystem path of ``path`` (an absolute path or object URI of this store)."""
        return self.data.fs_path(path)

    def _make_folder(self, fs_path: str) -> None:
        """Make the folder ``fs_path`` exist before files are written into it."""
        self.data.make_folder(fs_path)

    def _remove_empty_folders(self, folders: Set[str]) -> None:
        """Remove those of ``folders`` (filesystem paths of folders inside the data folder,
        whose files garbage collection just deleted) that hold no file now."""

    # -- versions and the log ----------------------------------------------------------------
    def version(self, *, refresh: bool = True) -> int:
        if refresh:
            self._refresh()
        return self._table.version()

    def files(self, version: int | None = None, *, refresh: bool = True) -> list[DataFile]:
        if version is None:
            table = self._table
            if refresh:
                self._refresh()
        elif version == self._table.version():  # the loaded version: no need to open it again
            table = self._table
        else:
            table = self._delta(version)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
        paths = actions.get("path", [])
        none = [None] * len(paths)
        rows = actions.get("num_records", none)
        lo, hi = actions.get("min._shard", none), actions.get("max._shard", none)
        slo, shi = actions.get("min._step", none), actions.get("max._step", none)
        wlo, whi = actions.get("min._weight", none), actions.get("max._weight", none)
        return [DataFile(self.path(p), int(n or 0), a, b, c, d, e, f)
                for p, n, a, b, c, d, e, f in zip(paths, rows, lo, hi, slo, shi, wlo, whi)]

    def added_files(self, lower: int, upper: int, data_only: bool = False) -> list[DataFile]:
        if upper <= lower:
            return []
        out = []
        for v in range(lower + 1, upper + 1):
            actions = self._commit_actions(v)
            if actions is None:
                if data_only:
                    raise StorageError(f"commit {v} of {self.uri} was cleaned up: the data "
                                       "changes it made cannot be told apart from rewrites",
                                       definitely_failed=True)
                before = {f.path for f in self.files(lower)}
                return [f for f in self.files(upper) if f.path not in before]
            for action in actions:
                add = action.get("add")
                if add is not None and (add.get("dataChange", True) or not data_only):
                    out.append(DataFile.from_stats(self.path(add["path"]),
                                                   add.get("stats") or "{}"))
        return out

    def file_changes(self, lower: int, upper: int) -> list[FileChange] | None:
        out = []
        for v in range(lower + 1, upper + 1):
            actions = self._commit_actions(v)
            if actions is None:
                return None
            added = tuple(self.path(a["add"]["path"]) for a in actions if a.get("add"))
            removed = tuple(self.path(a["remove"]["path"]) for a in actions if a.get("remove"))
            out.append(FileChange(v, added, removed))
        return out

    def commit_infos(self, lower: int, upper: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for v in range(lower + 1, upper + 1):
            actions = self._commit_actions(v)
            if actions is not None:
                out.extend(a["commitInfo"] for a in actions if a.get("commitInfo") is not None)
        return out

    def commit_metadata(self, key: str, value: object) -> dict[str, Any] | None:
        for v in range(self.version(), 0, -1):
            actions = self._commit_actions(v)
            if actions is None:
                return None
            for action in actions:
                info: dict[str, Any] | None = action.get("commitInfo")
                if info is not None and info.get(key) == value:
                    return info
        return None

    def transaction_version(self, app_id: str, *, refresh: bool = True) -> int | None:
        if refresh:
            self._refresh()
        return self._table.transaction_version(app_id)

    # -- data files (``storage/data_files.py``) ---------------------------------------------
    def path(self, relative: str) -> str:
        return self.data.path(relative)

    def write_arrow(self, table: pa.Table, run: str | None = None, *,
                    relative: str | None = None,
                    compression: str | None = None) -> list[AddAction]:
        return self.data.write_arrow(table, run, relative=relative, compression=compression)

    def describe_folder(self, relative: str) -> list[AddAction]:
        return self.data.describe_folder(relative)

    def read_arrow(self, paths: Sequence[str], where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        return self.data.read_arrow(paths, where, columns)

    def stored_data_files(self) -> list[StoredFile]:
        selector = pafs.FileSelector(self.fs_path(self.path(DATA_DIR)), recursive=True,
                                     allow_not_found=True)
        prefix = self.fs_path(self.path(""))
        return [StoredFile(self.path(info.path[len(prefix):]), millis(info) / 1000)
                for info in self._fs.get_file_info(selector)
                if info.type == pafs.FileType.File and info.base_name.endswith(".parquet")]

    def stat_data_files(self, paths: Sequence[str]) -> list[StoredFile]:
        infos = self._fs.get_file_info([self.fs_path(p) for p in paths]) if paths else []
        return [StoredFile(p, millis(info) / 1000) for p, info in zip(paths, infos)
                if info.type == pafs.FileType.File]

    def delete_data_files(self, paths: Sequence[str]) -> None:
        for p in paths:
            self._fs.delete_file(self.fs_path(p))
        self._remove_empty_folders({posixpath.dirname(self.fs_path(p)) for p in paths})

    # -- durable actions ---------------------------------------------------------------------
    def commit(self, adds: Sequence[AddAction] = (), removes: Sequence[str] = (), *,
               app_id: str | None = None, app_version: int | None = None,
               metadata: Mapping[str, object] | None = None, data_change: bool = True,
               expected_version: int | None = None) -> int:
        from deltalake._internal import RemoveAction  # re-exported privately in deltalake 1.x

        now = int(time.time() * 1000)
        actions: list[Any] = list(adds) if data_change else [
            dataclasses.replace(a, data_change=False) for a in adds]
        actions.extend(RemoveAction(self._relative(p), data_change, now) for p in removes)
        # How many actions besides the commit information this commit holds: a reader of the
        # log (``storage/verify.py``) tells a commit file cut at a line end by it.
        custom = {**(metadata or {}), ACTIONS_KEY: len(actions) + (1 if app_id else 0)}
        transactions = None
        if app_id:
            if app_version is None:
                raise StorageError(f"commit to {self.uri}: app transaction '{app_id}' without "
                                   "a version", definitely_failed=True)
            transactions = [Transaction(app_id, app_version, now)]
        props = CommitProperties(
            custom_metadata=custom,
            app_transactions=transactions,
            max_commit_retries=0 if expected_version is not None else None)
        if expected_version is not None:
            self._base_on(expected_version)
        try:
            try:
                self._table.create_write_transaction(
                    actions, mode="append", schema=self.schema, commit_properties=props,
                    post_commithook_properties=COMMIT_HOOKS)
            except CommitFailedError as e:
                # delta-rs does not rebase an append over another writer's metadata change (a
                # ``set_properties`` by the pipeline opening the root): load it and append once
                # more, where the commit was not bound to a version
                if expected_version is not None or not _METADATA_CHANGED.search(str(e)):
                    raise
                self._refresh()
                self._table.create_write_transaction(
                    actions, mode="append", schema=self.schema, commit_properties=props,
                    post_commithook_properties=COMMIT_HOOKS)
        except CommitFailedError as e:
            if expected_version is not None:
                raise ConcurrentWriterError(
                    f"another writer committed version {expected_version} of {self.uri} "
                    "first") from e
            if app_id is not None:  # the same app transaction twice at once: two writers
                raise ConcurrentWriterError(
                    f"another writer committed as '{app_id}' to {self.uri} at the same "
                    "time") from e
            raise StorageError(f"commit to {self.uri} failed: {e}", definitely_failed=True) from e
        except (DeltaError, OSError) as e:
            raise StorageError(f"commit to {self.uri} failed: {e}", definitely_failed=False) from e
        if expected_version is not None:  # landed at that version (no retries), or raised
            self._refresh_behind()
            return expected_version
        self._refresh()
        return self._table.version()

    def restore(self, version: int, *, expected_version: int | None = None) -> None:
        props = CommitProperties(max_commit_retries=0) if expected_version is not None else None
        if expected_version is not None:
            self._base_on(expected_version)
        try:
            self._table.restore(version, commit_properties=props)
        except CommitFailedError as e:
            if expected_version is not None:
                raise ConcurrentWriterError(
                    f"another writer committed to {self.uri} during its rollback") from e
            raise StorageError(f"rollback of {self.uri} failed: {e}",
                               definitely_failed=True) from e
        except (DeltaError, OSError) as e:
            raise StorageError(f"rollback of {self.uri} failed: {e}",
                               definitely_failed=False) from e
        self._refresh()

    def set_properties(self, properties: Mapping[str, str], *,
                       expected_version: int | None = None) -> bool:
        if has_properties(self.properties(), properties):
            return False
        # one metaData action besides the commit information (``ACTIONS_KEY``: verify counts)
        props = CommitProperties(custom_metadata={ACTIONS_KEY: 1},
                                 max_commit_retries=0 if expected_version is not None else None)
        if expected_version is not None:
            self._base_on(expected_version)
        try:
            # the engine's own properties (``dbsp.*``) are not Delta's: not refused as unknown
            self._table.alter.set_table_properties(dict(properties), raise_if_not_exists=False,
                                                   commit_properties=props)
        except CommitFailedError as e:
            if expected_version is not None:
                raise ConcurrentWriterError(
                    f"another writer committed version {expected_version} of {self.uri} "
                    "first") from e
            raise StorageError(f"setting properties of {self.uri} failed: {e}",
                               definitely_failed=True) from e
        except (DeltaError, OSError) as e:
            raise StorageError(f"setting properties of {self.uri} failed: {e}",
                               definitely_failed=False) from e
        self._refresh()
        self._require_landed_at(expected_version)
        return True

    def properties(self) -> dict[str, str]:
        return dict(self._table.metadata().configuration)

    def stored_schema(self) -> pa.Schema:
        return pa.schema(self._table.schema().to_arrow())

    def drop_not_null(self, columns: Sequence[str], *,
                      expected_version: int | None = None) -> bool:
        stored = self.stored_schema()
        strict = [c for c in columns if c in stored.names and not stored.field(c).nullable]
        for i, column in enumerate(strict):
            # one metaData action besides the commit information (``ACTIONS_KEY``: verify counts)
            bound = expected_version is not None and i == 0
            props = CommitProperties(custom_metadata={ACTIONS_KEY: 1},
                                     max_commit_retries=0 if bound else None)
            if bound:
                assert expected_version is not None
                self._base_on(expected_version)
            try:
                self._table.alter.drop_column_not_null(column, commit_properties=props)
            except CommitFailedError as e:
                if bound:
                    raise ConcurrentWriterError(
                        f"another writer committed version {expected_version} of {self.uri} "
                        "first") from e
                raise StorageError(f"making column '{column}' of {self.uri} nullable failed: "
                                   f"{e}", definitely_failed=True) from e
            except (DeltaError, OSError) as e:
                raise StorageError(f"making column '{column}' of {self.uri} nullable failed: "
                                   f"{e}", definitely_failed=False) from e
            self._refresh()
        return bool(strict)

    def table_id(self) -> str:
        return str(self._table.metadata().id)

    def clean_log_below(self, version: int) -> int:
        names = self.log_files_below(version)
        self.delete_log_files(names)
        return len(names)

    def log_files_below(self, version: int) -> list[str]:
        log = self.fs_path(self.path(LOG_DIR))
        names = sorted(info.base_name for info in self._fs.get_file_info(
            pafs.FileSelector(log, allow_not_found=True)) if info.type == pafs.FileType.File)
        checkpoints = sorted({int(m[1]) for n in names if (m := _CHECKPOINT_LOG_FILE.match(n))
                              and int(m[1]) <= version}, reverse=True)
        keep: int | None = None
        for candidate in checkpoints:
            parts = [n for n in names if n.startswith(f"{candidate:020d}.checkpoint")]
            try:
                for part in parts:
                    with self._fs.open_input_file(f"{log}/{part}") as fh:
                        pq.read_metadata(fh)
            except Exception:  # noqa: BLE001 - an unreadable checkpoint is not one to start from
                continue
            keep = candidate
            break
        if keep is None:
            return []
        below = [(int(m[1]), name) for name in names
                 if (m := _VERSIONED_LOG_FILE.match(name)) is not None and int(m[1]) < keep]
        return [name for _, name in sorted(below)]  # oldest first

    def delete_log_files(self, names: Sequence[str]) -> None:
        log = self.fs_path(self.path(LOG_DIR))
        for name in names:
            self._fs.delete_file(f"{log}/{name}")

    # -- internals ---------------------------------------------------------------------------
    def _open_or_create(self, configuration: Mapping[str, str] | None) -> DeltaTable:
        try:
            if DeltaTable.is_deltatable(self.uri, storage_options=self._options):
                return DeltaTable(self.uri, storage_options=self._options)
            self._make_folder(self.fs_path(self.uri))
            return DeltaTable.create(
                self.uri, self.schema, mode="ignore",
                configuration={**DEFAULT_CONFIGURATION, **(configuration or {})},
                storage_options=self._options)
        except (DeltaError, OSError) as e:
            raise StorageError(f"cannot open or create the Delta table {self.uri}: {e}",
                               definitely_failed=False) from e

    def _delta(self, version: int) -> DeltaTable:
        return DeltaTable(self.uri, version=version, storage_options=self._options)

    def _refresh(self) -> None:
        """Load the newest version, if there is one newer than the loaded version."""
        if self._newer_version_may_exist():
            self._update()

    def _update(self) -> None:
        """Load the newest version."""
        try:
            self._table.update_incremental()
        except (DeltaError, OSError) as e:
            raise StorageError(f"reading the log of {self.uri} failed: {e}",
                               definitely_failed=True) from e

    def _refresh_behind(self) -> None:
        """Load the newest version (the one just committed) in the background thread; the next
        use of the handle waits for it (``_table``)."""
        handle = self._table
        self._loading = write_behind.run_behind(handle.update_incremental)

    def _newer_version_may_exist(self) -> bool:
        """Whether a version newer than the loaded one may exist: the next version's commit
        file exists, or the newest checkpoint is newer (a writer cleaned the log below it,
        ``clean_log_below``, which needs a checkpoint). One or two small reads instead of
        delta-rs's listing of the log, for the common answer "nothing new"."""
        loaded = self._table.version()
        log = self.fs_path(self.path(LOG_DIR))
        try:
            if self._fs.get_file_info(f"{log}/{loaded + 1:020d}.json").type \
                    != pafs.FileType.NotFound:
                return True
            with self._fs.open_input_stream(f"{log}/{LAST_CHECKPOINT}") as fh:
                hint = checkpoint_hint_version(fh.read().decode(errors="replace"))
        except FileNotFoundError:
            return False  # no checkpoint: no log file was cleaned
        except OSError:
            return True  # unreadable: let delta-rs list the log
        return hint is None or hint > loaded

    def _require_landed_at(self, expected_version: int | None) -> None:
        """After a commit bound to ``expected_version`` (and a refresh): another writer's commit
        after it means this writer is fenced."""
        if expected_version is not None and self._table.version() != expected_version:
            raise ConcurrentWriterError(f"another writer committed to {self.uri} after version "
                                        f"{expected_version}")

    def _base_on(self, expected_version: int) -> None:
        """Load the version before ``expected_version``, so the next commit (with no retries)
        lands at ``expected_version`` or fails."""
        loaded = self._table.version()
        if loaded >= expected_version:
            raise ConcurrentWriterError(f"version {expected_version} of {self.uri} is already "
                                        f"committed (this handle has loaded {loaded})")
        if loaded != expected_version - 1:
            self._table.load_as_version(expected_version - 1)

    def _commit_actions(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of the commit file of ``version`` (None if it was cleaned up)."""
        log = self.fs_path(self.path(f"{LOG_DIR}/{version:020d}.json"))
        try:
            with self._fs.open_input_stream(log) as fh:
                text = fh.read().decode()
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _relative(self, path: str) -> str:
        prefix = self.uri + "/"
        if not path.startswith(prefix):
            raise StorageError(f"file {path!r} is not inside the table {self.uri}",
                               definitely_failed=True)
        return path[len(prefix):]


_VERSIONED_LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint(\.\d+\.\d+)?\.parquet)$")
_CHECKPOINT_LOG_FILE = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")
