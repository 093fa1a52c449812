"""dbsp-pipeline: incremental view maintenance (DBSP) on Spark, with state in Delta Lake.

Declare a ``Circuit``; run it with a ``Pipeline``; push changes; each ``step`` turns them into
the changes of every output view at a cost that follows the size of the change.
"""

from dbsp_pipeline.circuit import STREAM_OPS, Circuit, Collection, GroupedCollection
from dbsp_pipeline.errors import (
    CircuitChangedError,
    CircuitError,
    ConcurrentWriterError,
    CorruptStateError,
    DbspError,
    DivisionRecordError,
    InputError,
    LeaseExpiredError,
    NonDeterminismError,
    PipelineClosedError,
    PipelineFencedError,
    RootInUseError,
    StateFormatError,
    StepFailedError,
    StorageError,
    UnknownNameError,
    UsageError,
)
from dbsp_pipeline.root import PipelineStatus, read_status
from dbsp_pipeline.runtime.pipeline import DRIVER_STEP_ROWS, Pipeline
from dbsp_pipeline.runtime.readers import Reader
from dbsp_pipeline.runtime.recompute import ViewCheck, check_views
from dbsp_pipeline.runtime.results import (
    Checkpoint,
    CircuitChange,
    FailedStep,
    QuarantineResult,
    RescaleResult,
    StepInfo,
    StepResult,
)
from dbsp_pipeline.storage.verify import VerifyReport
from dbsp_pipeline.storage.verify import verify_root as verify

__version__ = "0.1.0"

__all__ = [
    "Circuit", "Collection", "GroupedCollection", "Pipeline", "StepInfo", "StepResult",
    "FailedStep", "QuarantineResult", "RescaleResult", "Checkpoint", "CircuitChange", "Reader",
    "StepFailedError",
    "DbspError", "UsageError", "CircuitError", "InputError", "UnknownNameError",
    "PipelineClosedError", "PipelineFencedError", "CircuitChangedError", "StateFormatError",
    "StorageError", "ConcurrentWriterError", "NonDeterminismError", "CorruptStateError",
    "LeaseExpiredError", "DivisionRecordError", "RootInUseError",
    "verify", "VerifyReport",
    "DRIVER_STEP_ROWS", "check_views", "ViewCheck", "STREAM_OPS",
    "read_status", "PipelineStatus",
]
