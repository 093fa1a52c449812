"""Layouts: the three sharding functions, their balance, how few keys change owner when the
number of workers changes, and the record kept with each checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from dbsp_pipeline import UsageError
from dbsp_pipeline.runtime.layout import SHARDINGS, Layout
from dbsp_pipeline.zset import SHARD_BITS, SHARD_COUNT

RNG = np.random.default_rng(7)
HASHES = RNG.integers(0, 2**63, size=200_000, dtype=np.int64).astype(np.uint64) * np.uint64(2) \
    + RNG.integers(0, 2, size=200_000).astype(np.uint64)
SHARDS = (HASHES >> np.uint64(64 - SHARD_BITS)).astype(np.int64)


def moved(a: Layout, b: Layout) -> float:
    return float(np.mean(a.owners(SHARDS, HASHES) != b.owners(SHARDS, HASHES)))


def test_the_default_layout_is_one_worker_owning_every_shard():
    layout = Layout()
    assert layout.shard_ranges() == [[(0, SHARD_COUNT)]]
    assert layout.owner(0) == layout.owner(SHARD_COUNT - 1) == 0
    assert Layout.from_json(None) == layout


@pytest.mark.parametrize("sharding", SHARDINGS)
@pytest.mark.parametrize("workers", [1, 2, 3, 7, 16])
def test_every_sharding_balances_the_keys(sharding, workers):
    layout = Layout.initial(workers, sharding)
    counts = np.bincount(layout.owners(SHARDS, HASHES), minlength=workers)
    assert len(counts) == workers
    # within 15% of even (dynamic sharding's k = 0.1, plus sampling noise)
    assert counts.max() / counts.min() < 1.15 + (0.2 if sharding == "dynamic" else 0)


@pytest.mark.parametrize("sharding", ["fixed", "dynamic"])
@pytest.mark.parametrize("w, w2", [(4, 5), (5, 4), (4, 8), (8, 4), (1, 4), (4, 1), (3, 7)])
def test_fixed_and_dynamic_move_about_the_ideal_fraction(sharding, w, w2):
    a = Layout.initial(w, sharding)
    b = a.rescaled(w2)
    # ideal: a key changes owner only if it must; |w2 - w| / max(w, w2) of the keys
    ideal = abs(w2 - w) / max(w, w2)
    assert moved(a, b) == pytest.approx(ideal, abs=0.03)
    counts = np.bincount(b.owners(SHARDS, HASHES), minlength=w2)
    assert len(counts) == w2 and counts.min() > 0
    assert b.version == a.version + 1


def test_modulo_moves_almost_everything():
    a = Layout.initial(4, "modulo")
    assert moved(a, a.rescaled(5)) == pytest.approx(4 / 5, abs=0.02)


def test_fixed_scale_out_takes_a_slice_off_each_worker():
    a = Layout.initial(3, "fixed")
    b = a.rescaled(4)
    ranges = b.shard_ranges()
    assert len(ranges[3]) == 3  # the new worker's slices come from the three old workers
    sizes = [sum(hi - lo for lo, hi in r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == SHARD_COUNT


def test_dynamic_shards_follow_w_over_k():
    assert Layout.initial(4, "dynamic").shards == 64
    layout = Layout.initial(4, "dynamic").rescaled(7)
    assert layout.shards == 128  # doubled: owners of the halves are the old owner's
    assert layout.rescaled(3).shards == 32


@pytest.mark.parametrize("sharding", SHARDINGS)
def test_json_round_trip_keeps_the_assignment(sharding):
    layout = Layout.initial(3, sharding).rescaled(5).rescaled(4)
    back = Layout.from_json(layout.to_json())
    assert back == layout
    assert np.array_equal(back.owners(SHARDS, HASHES), layout.owners(SHARDS, HASHES))


def test_impossible_layouts_are_usage_errors():
    with pytest.raises(UsageError):
        Layout(workers=0)
    with pytest.raises(UsageError):
        Layout(workers=5, shards=4)
    with pytest.raises(UsageError):
        Layout(sharding="random")
    with pytest.raises(UsageError):
        Layout().owner(SHARD_COUNT)
    with pytest.raises(UsageError):
        Layout.initial(2, "modulo").owners(SHARDS)  # modulo needs the full hashes


# -- the owner column (Spark) equals the owners of the rows' hashes --------------------------
OWNER_LAYOUTS = [Layout.initial(w, s) for s in SHARDINGS for w in range(1, 6)] + [
    Layout.initial(3, "fixed").rescaled(5), Layout.initial(2, "dynamic").rescaled(5),
    Layout.initial(4, "dynamic").rescaled(3), Layout.initial(2, "modulo").rescaled(5)]


def test_owner_column_equals_the_owners_of_every_layout(spark):
    """Spark's owner of a key equals ``Layout.owners`` of the Arrow hash of the same key (what
    ``Trace.owners`` computes), for negative hashes, NULLs, one and several key columns and no
    key, under every sharding and W in 1..5 (also rescaled, non-contiguous assignments)."""
    from dbsp_pipeline.driver import hashing

    rng = np.random.default_rng(11)
    n = 600
    ints = [None if i % 17 == 0 else int(v) for i, v in enumerate(rng.integers(-2**31, 2**31, n))]
    strs = [None if i % 13 == 0 else f"k{v}" for i, v in enumerate(rng.integers(0, 10**9, n))]
    longs = [int(v) for v in rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)]
    df = spark.createDataFrame(list(zip(ints, strs, longs)), "`a.b` int, c string, d long")
    keysets = [["a.b"], ["c", "d"], []]
    cols = [layout.owner_column(keys).alias(f"o{i}_{j}")
            for i, layout in enumerate(OWNER_LAYOUTS) for j, keys in enumerate(keysets)]
    got = df.select("`a.b`", "c", "d", *cols).toArrow()  # one job
    signs = hashing.xxhash64_arrow(got, ["c", "d"])
    assert (signs < 0).any() and (signs > 0).any()
    for i, layout in enumerate(OWNER_LAYOUTS):
        for j, keys in enumerate(keysets):
            shards = hashing.shard_arrow(got, keys).to_numpy()
            hashes = hashing.xxhash64_arrow(got, keys).astype(np.uint64)
            expected = layout.owners(shards, hashes)
            actual = got.column(f"o{i}_{j}").to_numpy()
            assert (actual == expected).all(), (layout, keys)
            if keys and layout.workers > 1:
                assert len(set(actual)) == layout.workers  # every worker owns some key


def test_partitions_are_read_by_p_mod_w():
    layout = Layout.initial(3, "dynamic")
    assert [layout.partition_owner(p) for p in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(UsageError, match="partition -1"):
        layout.partition_owner(-1)
