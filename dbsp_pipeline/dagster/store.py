"""Where a pipeline lives, as a Dagster resource: opens the pipeline of a circuit at its root,
reads its status without opening it, and names the inbox folder whose files the step job
ingests."""

from __future__ import annotations

import os

import dagster as dg

from dbsp_pipeline import DRIVER_STEP_ROWS, Circuit, Pipeline, PipelineStatus, read_status
from dbsp_pipeline.connectors.inbox import SETTLE_SECONDS
from dbsp_pipeline.dagster.spark import SparkResource


class PipelineStore(dg.ConfigurableResource):  # type: ignore[type-arg]  # its value is itself
    """The root folder of a pipeline's tables (created on first use) and its inbox.

    ``inbox`` (default ``<root>/../inbox``, i.e. beside the root) holds one folder per input;
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
    driver_step_rows: int = DRIVER_STEP_ROWS

    def open(self, circuit: Circuit, spark: SparkResource,
             checkpoint: int | None = None) -> Pipeline:
        """Open (or create, or recover) the pipeline of ``circuit`` at ``root``; with
        ``checkpoint``, at that retained checkpoint instead of the newest (a restore)."""
        return Pipeline(circuit, root=self.root, spark=spark.session(),
                        checkpoint_every=self.checkpoint_every,
                        retain_checkpoints=self.retain_checkpoints,
                        driver_step_rows=self.driver_step_rows, checkpoint=checkpoint)

    def status(self, circuit: Circuit) -> PipelineStatus:
        """What the pipeline has pending, read without opening it (no Spark, no writes)."""
        return read_status(self.root, list(circuit.inputs))

    @property
    def inbox_folder(self) -> str:
        """The inbox: ``inbox`` if set, else the folder ``inbox`` beside the root."""
        return self.inbox or os.path.join(os.path.dirname(os.path.abspath(self.root)), "inbox")
