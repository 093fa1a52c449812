"""Layouts: which worker owns which part of the state, and how that changes with scale.

Every row of a trace carries its key's stable shard (``_shard``, the 10 most significant bits of
``xxhash64(key)``, see ``dbsp_pipeline.zset``). A layout maps each key to a worker by one of three
sharding functions (``docs/rescaling.md``, section 2):

* ``modulo``: ``xxhash64(key) mod W``. The worst case, kept as a baseline: from ``W`` to
  ``W+1`` workers, ``W/(W+1)`` of the state changes owner.
* ``fixed``: ``S`` shards (default 1024, the full ``_shard``), assigned to workers as contiguous
  slices. A change of ``W`` reassigns only the surplus of each worker (contiguous-range
  reassignment: a new worker takes a slice off each existing one), so the fewest shards change
  owner, and every worker holds ``S/W`` shards (within one).
* ``dynamic``: ``S = (W/k).next_power_of_two()`` shards for an inaccuracy ``k`` (default 0.1),
  keyed by the ``log2(S)`` most significant bits of the hash. When ``W`` changes, ``S`` is
  recomputed first: doubled, each shard's slice splits in two in place (``333..416`` becomes
  ``666..832``), owners unchanged; halved, pairs merge (a pair split between owners goes to one
  of them). Then the surplus is reassigned as for fixed sharding.

A layout is part of every checkpoint: the state database records it with each committed
version (``to_json``/``from_json``), and ``version`` counts the changes. A root written before
layouts were recorded reads back as one worker owning everything under fixed sharding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

from dbsp_pipeline.driver.hashing import SEED
from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.zset import SHARD_BITS, SHARD_COUNT, quote, shard_of

#: The key under which the state database's metadata records the layout.
LAYOUT_KEY = "layout"
SHARDINGS = ("modulo", "fixed", "dynamic")
#: dynamic sharding's default maximum inaccuracy ``k``
DEFAULT_INACCURACY = 0.1


@dataclass(frozen=True)
class Layout:
    """``workers`` workers; ``sharding`` one of ``SHARDINGS``; for ``fixed`` and ``dynamic``,
    ``assignment[s]`` is the worker owning shard ``s`` of ``shards`` (a power of two, at most
    ``SHARD_COUNT``; empty means the initial contiguous slices)."""

    workers: int = 1
    shards: int = SHARD_COUNT
    sharding: str = "fixed"
    version: int = 0
    inaccuracy: float = DEFAULT_INACCURACY
    assignment: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.sharding not in SHARDINGS:
            raise UsageError(f"sharding must be one of {SHARDINGS}, not '{self.sharding}'")
        if self.workers < 1:
            raise UsageError(f"a layout needs at least one worker, not {self.workers}")
        if self.sharding != "modulo":
            if self.shards & (self.shards - 1) or not 1 <= self.shards <= SHARD_COUNT:
                raise UsageError(f"shards must be a power of two up to {SHARD_COUNT}, "
                                 f"not {self.shards}")
            if self.shards < self.workers:
                raise UsageError(f"{self.shards} shards cannot be spread over "
                                 f"{self.workers} workers")
            if not self.assignment:
                object.__setattr__(self, "assignment", _contiguous(self.shards, self.workers))
            if len(self.assignment) != self.shards:
                raise UsageError("a layout's assignment must name an owner for every shard")

    @classmethod
    def initial(cls, workers: int = 1, sharding: str = "fixed", shards: int = SHARD_COUNT,
                inaccuracy: float = DEFAULT_INACCURACY) -> Layout:
        """A first layout: contiguous, even slices."""
        if sharding == "dynamic":
            shards = _dynamic_shards(workers, inaccuracy)
        return cls(workers=workers, shards=shards if sharding != "modulo" else 0,
                   sharding=sharding, inaccuracy=inaccuracy)

    # -- owners ----------------------------------------------------------------------------
    @property
    def keyed(self) -> bool:
        """Whether a row's owner depends on its key's full hash (``modulo`` sharding), not on
        its shard alone: ``owners`` then needs the hashes, and a shard range does not decide
        the owner of a file's rows."""
        return self.sharding == "modulo"

    def owners(self, shard: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """The owning worker of each row, from its ``_shard`` (and, for ``modulo``, its full
        ``xxhash64`` as returned by ``driver.hashing.xxhash64_arrow``)."""
        if self.sharding == "modulo":
            if hashes is None:
                raise UsageError("modulo sharding needs the keys' full hashes")
            return (hashes.astype(np.uint64) % np.uint64(self.workers)).astype(np.int64)
        table = np.asarray(self.assignment, dtype=np.int64)
        owners: np.ndarray = table[np.asarray(shard, dtype=np.int64) >> (SHARD_BITS - self._bits())]
        return owners

    def owner_column(self, keys: Sequence[str]) -> Column:
        """A Spark column holding the owning worker (int) of the row's key ``keys``: the same
        worker as ``owners`` gives for the row's ``_shard`` and full hash (``Trace.owners``),
        so a row is grouped to exactly the worker whose part of a trace holds its key. With no
        keys (a global aggregate) every row has the owner of the hash of no columns: shard 0,
        or, under ``modulo``, the seed."""
        if self.sharding == "modulo":
            w = self.workers
            if not keys:
                return F.lit(SEED % w).cast("int")
            # ``owners`` takes the unsigned hash mod W; Spark's xxhash64 is signed, so a
            # negative hash h stands for h + 2**64.
            h = F.xxhash64(*[F.col(quote(k)) for k in keys])
            wrapped = F.pmod(h, F.lit(w)) + F.when(h < 0, F.lit(2**64 % w)).otherwise(F.lit(0))
            return F.pmod(wrapped, F.lit(w)).cast("int")
        if self.workers == 1:
            return F.lit(0).cast("int")
        # one SQL literal (a column per element would be one JVM call each: seconds for 1,024)
        table = F.expr(f"array({', '.join(str(int(w)) for w in self.assignment)})")
        index = F.shiftright(shard_of(list(keys)), SHARD_BITS - self._bits()) + 1
        return F.element_at(table, index).cast("int")

    def partition_owner(self, partition: int) -> int:
        """The worker that reads input partition ``partition`` (a Kafka partition): ``p mod W``,
        stable while W is, and needing no record."""
        if partition < 0:
            raise UsageError(f"partition {partition} is negative")
        return partition % self.workers

    def owners_of_range(self, lo: int, hi: int) -> set[int]:
        """The workers owning some ``_shard`` in ``lo..hi`` (inclusive); None-free only for
        ``fixed`` and ``dynamic`` (under ``modulo`` any worker may own any shard)."""
        if self.sharding == "modulo":
            return set(range(self.workers))
        shift = SHARD_BITS - self._bits()
        return set(self.assignment[lo >> shift:(hi >> shift) + 1])

    def shard_ranges(self) -> list[list[tuple[int, int]]]:
        """Per worker, the ``_shard`` ranges ``[lo, hi)`` it owns (fixed and dynamic)."""
        if self.sharding == "modulo":
            raise UsageError("under modulo sharding a worker owns no shard range")
        width = 1 << (SHARD_BITS - self._bits())
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.workers)]
        for s, w in enumerate(self.assignment):
            lo = s * width
            ranges = out[w]
            if ranges and ranges[-1][1] == lo:
                ranges[-1] = (ranges[-1][0], lo + width)
            else:
                ranges.append((lo, lo + width))
        return out

    def owner(self, shard: int) -> int:
        """The worker owning ``_shard`` value ``shard`` (fixed and dynamic)."""
        if not 0 <= shard < SHARD_COUNT:
            raise UsageError(f"shard {shard} is outside 0..{SHARD_COUNT - 1}")
        return int(self.owners(np.array([shard]))[0])

    # -- changes ---------------------------------------------------------------------------
    def rescaled(self, workers: int) -> Layout:
        """The layout for ``workers`` workers that changes the fewest owners from this one."""
        if workers < 1:
            raise UsageError(f"a layout needs at least one worker, not {workers}")
        if self.sharding == "modulo":
            return replace(self, workers=workers, version=self.version + 1)
        assignment, shards = list(self.assignment), self.shards
        if self.sharding == "dynamic":
            target = _dynamic_shards(workers, self.inaccuracy)
            while shards < target:  # double: each slice's bounds double, owners unchanged
                assignment = [w for w in assignment for _ in (0, 1)]
                shards *= 2
            while shards > target:  # halve: pairs merge; a split pair goes to a staying owner
                assignment = [a if a < workers or b >= workers else b
                              for a, b in zip(assignment[0::2], assignment[1::2])]
                shards //= 2
        if shards < workers:
            raise UsageError(f"{shards} shards cannot be spread over {workers} workers")
        return Layout(workers=workers, shards=shards, sharding=self.sharding,
                      version=self.version + 1, inaccuracy=self.inaccuracy,
                      assignment=tuple(_rebalance(assignment, workers)))

    # -- records ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"workers": self.workers, "shards": self.shards,
                                "sharding": self.sharding, "version": self.version}
        if self.sharding == "dynamic":
            data["inaccuracy"] = self.inaccuracy
        if self.sharding != "modulo" and self.assignment != _contiguous(self.shards,
                                                                        self.workers):
            data["slices"] = _slices(self.assignment)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Layout:
        """The recorded layout; a state version written before layouts were recorded (``None``)
        had the single-worker layout."""
        if not data:
            return cls()
        assignment: tuple[int, ...] = ()
        if data.get("slices"):
            assignment = tuple(w for lo, hi, w in data["slices"] for _ in range(lo, hi))
        return cls(workers=int(data["workers"]), shards=int(data["shards"]),
                   sharding=str(data["sharding"]), version=int(data["version"]),
                   inaccuracy=float(data.get("inaccuracy", DEFAULT_INACCURACY)),
                   assignment=assignment)

    def _bits(self) -> int:
        return self.shards.bit_length() - 1


def _dynamic_shards(workers: int, inaccuracy: float) -> int:
    if not 0 < inaccuracy < 1:
        raise UsageError(f"the inaccuracy k must be in (0, 1), not {inaccuracy}")
    wanted = 1 << max(0, math.ceil(workers / inaccuracy) - 1).bit_length()
    return min(max(wanted, 1), SHARD_COUNT)


def _contiguous(shards: int, workers: int) -> tuple[int, ...]:
    return tuple(min(s * workers // shards, workers - 1) for s in range(shards))


def _rebalance(assignment: list[int], workers: int) -> list[int]:
    """Give every worker ``S/W`` shards (within one) by moving only each worker's surplus:
    a worker above its target releases shards from the end of its last slices, and workers
    below theirs take the released shards in order (so they form few slices)."""
    shards = len(assignment)
    target = [shards // workers + (1 if w < shards % workers else 0) for w in range(workers)]
    owned: dict[int, list[int]] = {}
    for s, w in enumerate(assignment):
        owned.setdefault(w, []).append(s)
    released = []
    for w, mine in owned.items():
        keep = target[w] if w < workers else 0
        if len(mine) > keep:
            released.extend(mine[keep:])
    released.sort()
    out = list(assignment)
    i = 0
    for w in range(workers):
        need = target[w] - min(len(owned.get(w, [])), target[w])
        for s in released[i:i + need]:
            out[s] = w
        i += need
    return out


def _slices(assignment: tuple[int, ...]) -> list[list[int]]:
    """Run-length form of an assignment: ``[lo, hi, worker]`` covering every shard in order."""
    out: list[list[int]] = []
    for s, w in enumerate(assignment):
        if out and out[-1][2] == w and out[-1][1] == s:
            out[-1][1] = s + 1
        else:
            out.append([s, s + 1, w])
    return out
