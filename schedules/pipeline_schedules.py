"""Periodic maintenance: the checkpoint job (commit, compaction, garbage collection)."""

import dagster as dg

from resources.pipeline_store import PipelineRef


def checkpoint_schedule(ref: PipelineRef, checkpoint_job, cron: str) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(name=ref.job_name("checkpoint_schedule"), job=checkpoint_job,
                                 cron_schedule=cron, tags=ref.tags,
                                 default_status=dg.DefaultScheduleStatus.RUNNING,
                                 description=f"checkpoint '{ref.name}' ({cron})")
