"""Periodic maintenance of a pipeline: the checkpoint job (commit, compaction, garbage
collection) on a cron schedule."""

from __future__ import annotations

import dagster as dg

from dbsp_pipeline.dagster.ref import PipelineRef


def checkpoint_schedule(ref: PipelineRef, checkpoint_job: dg.JobDefinition,
                        cron: str) -> dg.ScheduleDefinition:
    """``<name>_checkpoint_schedule``: ``checkpoint_job`` on ``cron``, running by default."""
    return dg.ScheduleDefinition(name=ref.job_name("checkpoint_schedule"), job=checkpoint_job,
                                 cron_schedule=cron, tags=ref.tags,
                                 default_status=dg.DefaultScheduleStatus.RUNNING,
                                 description=f"checkpoint '{ref.name}' ({cron})")
