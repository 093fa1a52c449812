"""The summaries of step results the operator's console shows (``runtime/results.py``)."""

from __future__ import annotations

from dbsp_pipeline.runtime.results import StepResult, operator_summary, phase_summary


def test_phase_summary_is_each_phases_mean_in_step_order():
    a = StepResult(step=0, phase_seconds={"divide": 0.001, "operators": 0.010, "commit": 0.003})
    b = StepResult(step=1, phase_seconds={"push": 0.002, "divide": 0.003, "operators": 0.020,
                                          "commit": 0.005})
    assert phase_summary([a, b]) == "push 1.0 ms, divide 2.0 ms, operators 15.0 ms, commit 4.0 ms"
    assert phase_summary([]) == ""


def test_operator_summary_is_the_slowest_operators_mean_most_first():
    a = StepResult(step=0, operator_seconds={"n1_join": 0.004, "n2_aggregate": 0.010,
                                             "n3_select": 0.0})
    b = StepResult(step=1, operator_seconds={"n1_join": 0.006, "n2_aggregate": 0.030,
                                             "n4_distinct": 0.002})
    assert operator_summary([a, b]) == "n2_aggregate 20.0 ms, n1_join 5.0 ms, n4_distinct 1.0 ms"
    assert operator_summary([a, b], top=1) == "n2_aggregate 20.0 ms"
    assert operator_summary([]) == ""
