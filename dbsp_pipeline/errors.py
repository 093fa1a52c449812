"""Exception types of dbsp-pipeline.

Two families, as in persist's error tiers:

* ``UsageError`` and its subclasses: the caller asked for something that cannot be done (a bad
  circuit, bad input, a closed pipeline). Retrying the same call fails the same way. Nothing
  already accepted is affected.
* ``StorageError``: the storage location failed. ``definitely_failed`` says whether the write
  certainly did not happen (safe to retry as-is) or may have happened (the caller must find out,
  e.g. by reopening the pipeline, before retrying).

And ``CorruptStateError``: what the storage holds is damaged (not by a crash); nothing was read
from it. Restoring an intact checkpoint it names goes on; retrying does not.
"""

from __future__ import annotations


class DbspError(Exception):
    """Base of every error this package raises on purpose."""


class UsageError(DbspError):
    """The call itself is wrong; retrying it unchanged fails the same way."""


class CircuitError(UsageError):
    """The circuit declaration is invalid (bad name, bad expression, schema mismatch)."""


class InputError(UsageError):
    """Pushed input was rejected. Names the input, the record and the problem.

    Attributes:
        input_name: the circuit input the records were pushed to.
        record_index: index of the offending record in the pushed batch, if one record is at fault.
        column: the offending column, if one column is at fault.
    """

    def __init__(self, input_name: str, problem: str, *, record_index: int | None = None,
                 column: str | None = None, record: object = None) -> None:
        self.input_name = input_name
        self.record_index = record_index
        self.column = column
        self.problem = problem
        where = f"input '{input_name}'"
        if record_index is not None:
            where += f", record {record_index}"
            if record is not None:
                where += f" {_short(record)}"
        if column is not None:
            where += f", column '{column}'"
        super().__init__(f"{where}: {problem}")


class UnknownNameError(UsageError):
    """An input or output name that the circuit does not declare."""


class PipelineClosedError(UsageError):
    """The pipeline was closed; open it again to continue."""


class LeaseExpiredError(UsageError):
    """A reader's lease expired (``runtime/readers.py``); the history it held may be gone.
    Open a new reader."""


class DivisionRecordError(UsageError):
    """The division log was asked to change a step's division (``runtime/division_log.py``):
    to record a step already divided, or to quarantine a step not divided. A division is
    written once, before the step's output, and never changed; the caller is at fault."""


class StateFormatError(UsageError):
    """The state was written in a format this engine does not read (a newer engine's)."""


class CircuitChangedError(UsageError):
    """The pipeline root holds state of a different circuit (changing the computation is out of
    scope)."""


class StorageError(DbspError):
    """The storage location failed.

    Attributes:
        definitely_failed: True when the write certainly did not take effect; False when it may
            have.
    """

    def __init__(self, message: str, *, definitely_failed: bool) -> None:
        self.definitely_failed = definitely_failed
        suffix = "the write did not happen" if definitely_failed else "the write may have happened"
        super().__init__(f"{message} ({suffix})")


class ConcurrentWriterError(StorageError):
    """Another writer committed to a table that only this pipeline may write (a compare-and-
    append lost its race), or committed the same app transaction (producer, step) at the same
    time: two processes are doing one writer's work, and this one lost."""

    def __init__(self, message: str) -> None:
        super().__init__(message, definitely_failed=True)


class PipelineFencedError(UsageError):
    """Another process runs the same pipeline root and won the race for the next step; this
    pipeline object is closed. Only one process may run a pipeline at a time."""


class ComputationError(DbspError):
    """Computing a step's rows failed (an overflow, a value that does not cast, an operator's
    own code): not the storage. Names what was being computed and the cause; the step fails
    (``StepFailedError``) and nothing of it is committed."""


class StepFailedError(DbspError):
    """A step's computation failed after its input was divided (an overflow, an expression
    error, a failed task). Nothing of the step is committed: the state is that of the step
    before, and the step keeps its recorded input, so it is still the next step. Stepping
    again tries it again (a transient cause heals); a deterministic cause fails every time,
    until the engine is fixed or the operator quarantines the step's input
    (``Pipeline.quarantine_step``: the records go to the errors table).

    Attributes:
        step: the step that failed.
        error: what failed (the cause's type and message).
    """

    def __init__(self, pipeline: str, step: int, error: str) -> None:
        self.step = step
        self.error = error
        super().__init__(
            f"step {step} of pipeline '{pipeline}' failed: {error}. Nothing of it was "
            f"committed and it stays the next step: step again to retry, or quarantine its "
            f"input (Pipeline.quarantine_step({step}), the Dagster quarantine job) to move its "
            "records to the errors table and go on")


class CorruptStateError(DbspError):
    """The stored state of a pipeline root is damaged: a table's commit file is empty, cut off
    or missing, or a data file is missing or not what its commit records (``storage/verify.py``).
    A crash never does this (commits are written whole); the storage lost or changed data.
    Nothing was read from the damage. Opening again fails the same way; restoring an intact
    older checkpoint, if there is one, goes on from it.

    Attributes:
        root: the pipeline root.
        table: the damaged table (its folder relative to the root), version: the version
            checked (None for a side file), file: the file at fault, problem: what is wrong.
        intact_checkpoint: the newest retained checkpoint that is intact (None if none is).
    """

    def __init__(self, root: str, table: str, version: int | None, file: str, problem: str, *,
                 what: str, remedy: str, intact_checkpoint: int | None) -> None:
        self.root = root
        self.table = table
        self.version = version
        self.file = file
        self.problem = problem
        self.intact_checkpoint = intact_checkpoint
        where = f"table '{table}'" + ("" if version is None else f", version {version}")
        super().__init__(f"pipeline root {root}: {what}: {where}, file {file}: {problem}; "
                         f"{remedy}")


class RootInUseError(DbspError):
    """A check of a pipeline root (``verify``, opening) found it inconsistent while another
    process kept writing it: what it read mixed versions a running pipeline moved table by table
    meanwhile, so no damage can be told from the moves. Nothing was written. Stop the other
    process first: a root is run by one process at a time."""


class NonDeterminismError(DbspError):
    """Replaying a step after a crash gave another output than the one written the first time.
    The written output stands; the circuit (or its input) is not deterministic."""


def _short(record: object, limit: int = 120) -> str:
    text = repr(record)
    return text if len(text) <= limit else text[: limit - 3] + "..."
