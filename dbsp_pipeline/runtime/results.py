"""What the engine's actions return: the results of steps, quarantines and layout changes, and
the description of a step's input and of a retained checkpoint. Plain values: holding one
keeps nothing open and nothing of the pipeline changes when one is dropped."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dbsp_pipeline.runtime.layout import Layout


@dataclass(frozen=True)
class StepInfo:
    """The input a step consumed: per input, the log versions ``(lower, upper]`` (the step
    read the pushes committed as versions ``lower+1 .. upper`` of ``inputs/<name>``)."""

    step: int
    inputs: dict[str, tuple[int, int]]
    #: per input, per tracked producer (``track_producers``), the sequence numbers (offsets)
    #: ``(after, upto]`` the step consumed; ``after`` is None when the step before did not track
    #: it (then everything up to ``upto`` not consumed before)
    offsets: dict[str, dict[str, tuple[int | None, int | None]]] = field(default_factory=dict)


#: The phases of a step, in order, as ``StepResult.phase_seconds`` names them:
#: ``push``: the pushes ``step(changes)`` carries checked and their files written;
#: ``divide``: the division of input (a finished background merge applied first; a quarantined
#: step's records moved to the errors table; a step divided before: the pushes it was given
#: appended for the next step); ``read``: the engine path chosen and each input's change read
#: from its log; ``operators``: the circuit evaluated (the traces' lookups, the operators' work,
#: their appends staged); ``outputs``: every view's change written, the trace files written
#: behind the operators waited for and the step's scratch files removed; ``commit``: the
#: carried pushes landed and the step's one durable commit (its record, or the checkpoint);
#: ``upkeep``: what runs after it (output folds, garbage collection, merges started). On Spark
#: a phase holds the jobs it runs: the input is read where the operators' jobs read it, and an
#: operator Spark evaluates lazily runs in the phase of the job that needs its change.
STEP_PHASES = ("push", "divide", "read", "operators", "outputs", "commit", "upkeep")


@dataclass
class StepResult:
    """What one step did."""

    step: int
    #: raw rows read from each input's log for this step
    inputs: dict[str, int] = field(default_factory=dict)
    #: rows of each output's change (after consolidation); None when a replayed step was discarded
    outputs: dict[str, int | None] = field(default_factory=dict)
    #: the step's wall-clock seconds: from its division to the end of its upkeep, and with
    #: ``step(changes)`` from the check of the pushes it carries (the wait for the pipeline's
    #: lock not counted). A step undone and executed again (a push it carried lost its log
    #: version to another writer) tells its second execution only, as its phases do.
    seconds: float = 0.0
    #: ``seconds`` by phase (``STEP_PHASES``; a phase the step did not go through is absent):
    #: where a step's time goes, the fixed part (a durable commit) beside the part that grows
    #: with the change and the state (the operators' lookups)
    phase_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    #: the ``operators`` phase by operator: the seconds each took, by its state tables' name
    #: (``n<id>_<op>``, as under ``state/``; ``Plan.operator_label``). On Spark, the jobs each
    #: ran (an operator Spark plans lazily counts little here, its job where it runs), and
    #: the stages one job ran together as one (their names joined by ``+``); an input whose
    #: pushed files the tasks split themselves (``runtime/scatter.py``) as ``input:<name>``,
    #: with the row-wise operators after it counted in their reader's
    operator_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    #: the state version committed after this step, if the step ended with a commit
    committed_version: int | None = None
    #: whether the step ran on the driver (small change) rather than as Spark jobs
    on_driver: bool = False
    #: on a driver step, the operators (labelled as in ``operator_seconds``) whose change ran
    #: as a Spark job all the same: an expression outside the driver's translation
    #: (``Pipeline.spark_operators`` lists those), or rows where DuckDB's value would differ
    #: from Spark's. Each costs a job a step, and the JVM's start in a new process.
    spark_jobs: list[str] = field(default_factory=list)
    #: why the step ran where it did (``runtime/path_choice.py``): the rule and its figures
    path_reason: str = ""
    #: per input fed by a tracked source, invalid records left out of the step's pushes (they
    #: are in the errors sink); empty for inputs fed by ``push`` alone
    rejected: dict[str, int] = field(default_factory=dict)
    #: why the step's input was quarantined (``quarantine_step``): it executed with no input
    quarantined: str | None = None
    #: rows the step read from its operators' traces (whole files read, rows of small files
    #: and keyed runs' hash ranges looked up; a Spark read counts its files' rows)
    state_rows_read: int = 0


def add_seconds(seconds: dict[str, float], name: str, since: float) -> float:
    """Add the seconds from ``since`` (``time.monotonic``) to now to ``seconds[name]``
    (``StepResult.phase_seconds``, ``operator_seconds``); returns now, where the next part
    starts."""
    now = time.monotonic()
    seconds[name] = seconds.get(name, 0.0) + now - since
    return now


def phase_summary(results: Sequence[StepResult]) -> str:
    """The mean milliseconds a step of ``results`` spent in each phase, in ``STEP_PHASES``
    order (those any step went through): ``"push 1.2 ms, divide 0.3 ms, ..."``; empty for no
    results."""
    def mean_ms(phase: str) -> float:
        return 1000 * sum(r.phase_seconds.get(phase, 0.0) for r in results) / len(results)

    return ", ".join(f"{phase} {mean_ms(phase):.1f} ms" for phase in STEP_PHASES
                     if any(phase in r.phase_seconds for r in results))


def operator_summary(results: Sequence[StepResult], top: int = 3) -> str:
    """The ``top`` operators that took the most milliseconds a step of ``results``, on average,
    most first (``StepResult.operator_seconds``): ``"n3_aggregate 21.9 ms, n4_join 5.5 ms"``;
    empty for no results."""
    if not results:
        return ""
    totals: dict[str, float] = {}
    for r in results:
        for name, seconds in r.operator_seconds.items():
            totals[name] = totals.get(name, 0.0) + seconds
    slowest = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return ", ".join(f"{name} {1000 * seconds / len(results):.1f} ms" for name, seconds in slowest)


@dataclass(frozen=True)
class FailedStep:
    """The next step, divided, whose execution failed: ``error`` says how (the exception's
    type and message)."""

    step: int
    error: str


@dataclass
class QuarantineResult:
    """What ``quarantine_step`` did: the reason recorded, per input the records moved to the
    errors table, and the step's execution with no input."""

    step: int
    reason: str
    moved: dict[str, int]
    result: StepResult


@dataclass
class RescaleResult:
    """What a layout change did: the layouts, the step the pipeline stopped at, the state rows,
    the rows whose owner changed, the rows rewritten, and the seconds it took."""

    old: Layout
    new: Layout
    step: int
    rows: int = 0
    moved_rows: int = 0
    rewritten_rows: int = 0
    seconds: float = 0.0
    state_version: int | None = None
    #: a hot change (``rescale(hot=True)``): steps ran while the state was copied
    hot: bool = False
    #: hot: seconds copying (steps running), seconds steps were paused for the hand-over of
    #: what they changed meanwhile, steps executed during the copy, rows handed over
    copy_seconds: float = 0.0
    pause_seconds: float = 0.0
    steps_during_copy: int = 0
    caught_up_rows: int = 0


@dataclass(frozen=True)
class Checkpoint:
    """A retained, consistent state version: what ``restore`` can go back to."""

    version: int
    #: the next step to execute from this checkpoint (steps ``..step-1`` are in its state)
    step: int
    layout: Layout
    fingerprint: str | None
    engine_version: str | None
    state_format: int | None
    #: the circuit change this checkpoint committed (an upgrade: ``CircuitChange.describe``),
    #: None for any other checkpoint
    circuit_change: dict[str, Any] | None = None


@dataclass(frozen=True)
class CircuitChange:
    """What an upgrade to a changed circuit did (``runtime/circuit_upgrade.py``), as the
    checkpoint it committed records it (``Checkpoint.circuit_change``)."""

    #: the fingerprints of the circuit before and after
    old_fingerprint: str
    new_fingerprint: str
    #: the upgrade step: the first step of the new circuit, whose output is each view's
    #: difference between its old and new contents (0: the root had executed no step, and
    #: takes the new circuit without an upgrade step)
    step: int
    #: the state version the upgrade committed
    state_version: int
    #: the new circuit's stateful operators that kept their state untouched (by state name),
    #: those backfilled from the inputs, and the old circuit's whose state was retired
    kept: list[str]
    backfilled: list[str]
    retired: list[str]
    #: views by what happened to them
    views_unchanged: list[str]
    views_changed: list[str]
    views_added: list[str]
    views_removed: list[str]
    #: rows of each view's change at the upgrade step (0 for an unchanged view)
    outputs: dict[str, int]
    #: whether the backfill ran on the driver, and the figures of why
    on_driver: bool
    path_reason: str
    seconds: float

    def describe(self) -> dict[str, Any]:
        """The change as the checkpoint's entry records it (JSON)."""
        return {"from": self.old_fingerprint, "to": self.new_fingerprint, "step": self.step,
                "kept": self.kept, "backfilled": self.backfilled, "retired": self.retired,
                "views": {"unchanged": self.views_unchanged, "changed": self.views_changed,
                          "added": self.views_added, "removed": self.views_removed},
                "outputs": self.outputs}
