"""Fixtures shared by the layout-change tests."""

from __future__ import annotations

import pytest

from tests.runtime import workload

#: the rounds the rescale tests play (each ends with a step)
RESCALE_ROUNDS = workload.rounds(6)


@pytest.fixture(scope="session")
def never_rescaled(spark, tmp_path_factory):
    """What a consumer sees after ``RESCALE_ROUNDS`` on a pipeline never rescaled."""
    root = str(tmp_path_factory.mktemp("never-rescaled"))
    with workload.open_pipeline(root, spark) as p:
        for r, pushes in enumerate(RESCALE_ROUNDS):
            workload.play_round(p, r, pushes)
    return workload.consumer_view(spark, root)
