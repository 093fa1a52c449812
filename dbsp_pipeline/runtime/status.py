"""Kept for imports written before ``dbsp_pipeline.root``: a pipeline's progress read from its
tables without opening it lives there now (``read_status``, ``PipelineStatus``; also exported by
``dbsp_pipeline``)."""

from __future__ import annotations

from dbsp_pipeline.root import PipelineStatus, read_lag, read_pipeline_id, read_status

__all__ = ["PipelineStatus", "read_status", "read_lag", "read_pipeline_id"]
