"""Layouts: contiguous shard ranges per worker, round-tripped through the manifest record."""

from __future__ import annotations

import pytest

from dbsp_pipeline import UsageError
from dbsp_pipeline.runtime.layout import Layout
from dbsp_pipeline.zset import SHARD_COUNT


def test_the_default_layout_is_one_worker_owning_every_shard():
    layout = Layout()
    assert layout.shard_ranges() == [(0, SHARD_COUNT)]
    assert layout.owner(0) == layout.owner(SHARD_COUNT - 1) == 0


@pytest.mark.parametrize("workers", [1, 2, 3, 7, 1024])
def test_ranges_cover_every_shard_once_in_order(workers):
    layout = Layout(workers=workers)
    ranges = layout.shard_ranges()
    assert ranges[0][0] == 0 and ranges[-1][1] == SHARD_COUNT
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1
    assert [layout.owner(lo) for lo, _ in ranges] == list(range(workers))


def test_json_round_trip_and_the_unrecorded_default():
    layout = Layout(workers=3, version=2)
    assert Layout.from_json(layout.to_json()) == layout
    assert Layout.from_json(None) == Layout()


def test_impossible_layouts_are_usage_errors():
    with pytest.raises(UsageError):
        Layout(workers=0)
    with pytest.raises(UsageError):
        Layout(workers=5, shards=4)
    with pytest.raises(UsageError):
        Layout().owner(SHARD_COUNT)
