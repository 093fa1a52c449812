"""Readers of output views, in the persist sense: leased handles whose ``since`` holds history.

A reader of view V holds a *lease* recorded in ``<root>/_readers/<id>.json`` (view, ``since``,
expiry). Its ``since`` is the oldest step whose exact view (``snapshot``) and later changes
(``listen``) it may still ask for; history compaction of V's output log never collapses steps at
or after the smallest ``since`` of V's live readers. A reader advances its ``since`` when it no
longer needs older steps (``downgrade_since``; it never moves back) and renews its lease while
it reads; a lease that expired (its process died, say) no longer holds compaction back, and the
handle fails on its next use. Lease files are replaced atomically, so a crash never leaves a
half-written one.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from pyspark.sql import DataFrame

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.errors import LeaseExpiredError, UsageError
from dbsp_pipeline.storage.small_files import (
    list_names,
    make_folder,
    read_text,
    remove,
    write_atomically,
)
from dbsp_pipeline.zset import STEP

READERS_DIR = root_layout.READERS
DEFAULT_LEASE_SECONDS = 300.0


class ViewSource(Protocol):
    """What a reader reads through: the pipeline's view reads (``Pipeline`` is one)."""

    def view(self, name: str, as_of: int | None = None) -> DataFrame: ...

    def changes(self, name: str, since: int = 0) -> DataFrame: ...

    def output_last(self, name: str) -> int: ...


@dataclass
class Lease:
    reader_id: str
    view: str
    since: int
    expires_at: float


class LeaseRegistry:
    """The leases of one pipeline root."""

    def __init__(self, root: str) -> None:
        self.folder = root_layout.readers(root)
        make_folder(self.folder)

    def write(self, lease: Lease) -> None:
        write_atomically(os.path.join(self.folder, f"{lease.reader_id}.json"),
                         json.dumps(asdict(lease)))

    def read(self, reader_id: str) -> Lease | None:
        text = read_text(os.path.join(self.folder, f"{reader_id}.json"))
        return None if text is None else Lease(**json.loads(text))

    def remove(self, reader_id: str) -> None:
        remove(os.path.join(self.folder, f"{reader_id}.json"))

    def live(self, view: str, now: float | None = None) -> list[Lease]:
        """The unexpired leases on ``view`` (expired ones are removed)."""
        now = time.time() if now is None else now
        out = []
        for name in list_names(self.folder):
            if not name.endswith(".json"):
                continue
            lease = self.read(name[:-5])
            if lease is None or lease.view != view:
                continue
            if lease.expires_at <= now:
                self.remove(lease.reader_id)
                continue
            out.append(lease)
        return out

    def since(self, view: str) -> int | None:
        """The smallest ``since`` of the live readers of ``view`` (None: no reader)."""
        leases = self.live(view)
        return min(lease.since for lease in leases) if leases else None


def open_reader(source: ViewSource, registry: LeaseRegistry, view: str, *, since: int | None,
                compacted_through: int, last: int, lease_seconds: float) -> Reader:
    """A leased reader of ``view``, whose output log collapsed its history through step
    ``compacted_through`` and has written every step before ``last``: ``since`` defaults to the
    newest written step; a ``since`` before ``compacted_through`` is ``UsageError``. The lease
    is durable (its file written) when this returns."""
    oldest = max(compacted_through, 0)
    since = max(last - 1, oldest) if since is None else since
    if since < compacted_through:
        raise UsageError(f"output '{view}': history before step {compacted_through} was "
                         f"compacted; a reader cannot start at step {since}")
    return Reader(source, registry, view, since, lease_seconds)


class Reader:
    """A leased reader of one view, reading through ``source`` and holding its lease in
    ``registry``. See the module docstring."""

    def __init__(self, source: ViewSource, registry: LeaseRegistry, view: str, since: int,
                 lease_seconds: float) -> None:
        self._source = source
        self._registry = registry
        self.view = view
        self.lease_seconds = lease_seconds
        self._lease = Lease(uuid.uuid4().hex, view, since, time.time() + lease_seconds)
        self._registry.write(self._lease)

    @property
    def since(self) -> int:
        return self._lease.since

    def snapshot(self, as_of: int | None = None) -> DataFrame:
        """The view's value after step ``as_of`` (default: the newest); ``as_of >= since``."""
        self._check()
        if as_of is not None and as_of < self.since:
            raise UsageError(f"reader of '{self.view}': step {as_of} is before its since "
                             f"({self.since})")
        return self._source.view(self.view, as_of=as_of)

    def listen(self, after: int) -> Iterator[tuple[int, DataFrame]]:
        """The changes of each written step after ``after`` (``after >= since``), in order:
        ``(step, changes)``. Yields the steps written so far and stops."""
        self._check()
        if after < self.since:
            raise UsageError(f"reader of '{self.view}': step {after} is before its since "
                             f"({self.since})")
        last = self._source.output_last(self.view)
        changes = self._source.changes(self.view, since=after + 1)
        for step in range(after + 1, last):
            yield step, changes.where(changes[STEP] == step)

    def downgrade_since(self, step: int) -> None:
        """Let history before ``step`` go (``since`` only moves forward)."""
        self._check()
        if step < self.since:
            raise UsageError(f"reader of '{self.view}': since can only advance "
                             f"({self.since} -> {step})")
        self._lease.since = step
        self.renew()

    def renew(self, lease_seconds: float | None = None) -> None:
        """Extend the lease by ``lease_seconds`` (default: the reader's) from now."""
        self._check()
        self._lease.expires_at = time.time() + (lease_seconds or self.lease_seconds)
        self._registry.write(self._lease)

    def close(self) -> None:
        """Give up the lease: the reader holds no history any more."""
        self._registry.remove(self._lease.reader_id)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check(self) -> None:
        stored = self._registry.read(self._lease.reader_id)
        if stored is None or stored.expires_at <= time.time():
            self._registry.remove(self._lease.reader_id)
            raise LeaseExpiredError(f"the lease of this reader of '{self.view}' expired; the "
                                    "history it held may have been compacted: open a new reader")
