"""Layouts: which worker owns which shards of the state.

Every row of a trace carries its key's stable shard (``_shard``, ``0..SHARD_COUNT``, see
``dbsp_pipeline.zset``). A layout assigns the shards to workers as contiguous ranges (the seed's
fixed sharding with contiguous-range reassignment), so a worker's state is a range of
``(_shard, key)``-sorted files. The layout is part of every checkpoint: the state database records
it with each committed version, and reopening a pipeline opens the layout its checkpoint recorded.

A pipeline created today has one layout: one worker (the step's driver, which runs small steps
itself and large ones as Spark jobs over all shards) owning every shard. Layout changes (more or
fewer workers, other sharding functions) are the elastic-scale work that builds on this record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.zset import SHARD_COUNT

#: The key under which the state database's metadata records the layout.
LAYOUT_KEY = "layout"


@dataclass(frozen=True)
class Layout:
    """``workers`` workers owning ``shards`` shards split by ``sharding``; ``version`` counts
    layout changes (0 for the layout a pipeline was created with)."""

    workers: int = 1
    shards: int = SHARD_COUNT
    sharding: str = "fixed"
    version: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UsageError(f"a layout needs at least one worker, not {self.workers}")
        if self.shards < self.workers:
            raise UsageError(f"{self.shards} shards cannot be spread over {self.workers} workers")

    def shard_ranges(self) -> list[tuple[int, int]]:
        """Per worker, the half-open shard range ``[lo, hi)`` it owns (contiguous, in order)."""
        bounds = [w * self.shards // self.workers for w in range(self.workers + 1)]
        return list(zip(bounds[:-1], bounds[1:]))

    def owner(self, shard: int) -> int:
        """The worker owning ``shard``."""
        if not 0 <= shard < self.shards:
            raise UsageError(f"shard {shard} is outside 0..{self.shards - 1}")
        return min(w for w, (lo, hi) in enumerate(self.shard_ranges()) if lo <= shard < hi)

    def to_json(self) -> dict[str, Any]:
        return {"workers": self.workers, "shards": self.shards, "sharding": self.sharding,
                "version": self.version}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Layout:
        """The recorded layout; a state version written before layouts were recorded (``None``)
        had the single-worker layout."""
        if not data:
            return cls()
        return cls(workers=int(data["workers"]), shards=int(data["shards"]),
                   sharding=str(data["sharding"]), version=int(data["version"]))
