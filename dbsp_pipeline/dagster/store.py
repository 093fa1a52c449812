"""Where a pipeline lives, as a Dagster resource: opens the pipeline of a circuit at its root,
reads its status without opening it, and names the inbox folder whose files the step job
ingests."""

from __future__ import annotations

import os

import dagster as dg

from dbsp_pipeline import (
    DRIVER_STEP_ROWS,
    Circuit,
    Pipeline,
    PipelineStatus,
    UsageError,
    read_status,
)
from dbsp_pipeline.connectors.inbox import SETTLE_SECONDS
from dbsp_pipeline.dagster.spark import SparkResource
from dbsp_pipeline.storage.small_files import is_remote


class PipelineStore(dg.ConfigurableResource):  # type: ignore[type-arg]  # its value is itself
    """The root of a pipeline's tables (created on first use; a local folder or
    ``s3://bucket/prefix``) and its inbox.

    ``inbox`` (a local folder; default ``<root>/../inbox``, i.e. beside a local root, and none
    for an ``s3://`` root) holds one folder per input;
    files dropped there (``.jsonl``, ``.csv``, ``.parquet``; a ``_weight`` column for deletes)
    are pushed by the next step run once unchanged for ``inbox_settle_seconds`` (the input
    sensor waits as long before it launches a run for them)."""

    root: str
    inbox: str = ""
    #: an inbox file is read once unchanged for this long (0: every writer renames)
    inbox_settle_seconds: float = SETTLE_SECONDS
    retain_checkpoints: int = 2
    checkpoint_every: int = 1
    #: steps changing at most this many input rows run on the driver, bigger ones on Spark
    #: (None: each step where its estimated work fits the driver's memory)
    driver_step_rows: int | None = DRIVER_STEP_ROWS
    #: the most memory (bytes) one step on the driver may take when ``driver_step_rows`` is
    #: None (None: half the memory available to the process)
    driver_memory: int | None = None

    def open(self, circuit: Circuit, spark: SparkResource,
             checkpoint: int | None = None, upgrade: bool = False) -> Pipeline:
        """Open (or create, or recover) the pipeline of ``circuit`` at ``root``; with
        ``checkpoint``, at that retained checkpoint instead of the newest (a restore); with
        ``upgrade``, change a root built by another circuit to this one (``Pipeline``)."""
        return Pipeline(circuit, root=self.root, spark=spark.session(),
                        checkpoint_every=self.checkpoint_every,
                        retain_checkpoints=self.retain_checkpoints,
                        driver_step_rows=self.driver_step_rows,
                        driver_memory=self.driver_memory, checkpoint=checkpoint,
                        upgrade=upgrade)

    def status(self, circuit: Circuit) -> PipelineStatus:
        """What the pipeline has pending, read without opening it (no Spark, no writes)."""
        return read_status(self.root, list(circuit.inputs))

    @property
    def inbox_folder(self) -> str | None:
        """The inbox, a local folder: ``inbox`` if set, else the folder ``inbox`` beside a
        local root; None (no inbox) beside an object-store root. An object-store ``inbox`` is
        a ``UsageError`` (its files would never be listed)."""
        if is_remote(self.inbox):
            raise UsageError(f"inbox {self.inbox}: the inbox is a local folder (files in an "
                             "object store are not read); give a local path, or none")
        if self.inbox:
            return self.inbox
        if is_remote(self.root):
            return None
        return os.path.join(os.path.dirname(os.path.abspath(self.root)), "inbox")
