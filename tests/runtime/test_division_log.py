"""The division log refuses to change a recorded division, with a named error."""

from __future__ import annotations

import pytest

from dbsp_pipeline.errors import DivisionRecordError, UsageError
from dbsp_pipeline.runtime.division_log import DivisionLog


def test_a_division_is_recorded_once_and_only_a_divided_step_is_quarantined(spark, tmp_path):
    divisions = DivisionLog(spark, str(tmp_path))
    divisions.record(0, {"x": 1})
    with pytest.raises(DivisionRecordError, match="division of step 0 is already recorded"):
        divisions.record(0, {"x": 2})
    with pytest.raises(DivisionRecordError, match="step 1 is not divided") as raised:
        divisions.quarantine(1, "a reason")
    assert isinstance(raised.value, UsageError) and str(tmp_path) in str(raised.value)
    assert DivisionLog(spark, str(tmp_path)).get(0) == {"x": 1}  # the record stands
