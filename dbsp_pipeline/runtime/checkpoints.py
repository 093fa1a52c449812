"""Checkpoints: the retained state versions, and going back to one (``restore``).

A checkpoint is a committed state version (``state_db.py``); the newest
``retain_checkpoints`` stay readable. The retained chain ends at the division log's
``compacted_below`` (``division_log.py``): a checkpoint whose step is below it cannot be
restored (the divisions a restore would replay are gone), so it is not listed, restoring it is
``UsageError``, verify does not check it and garbage collection deletes it, even when a raised
``retain_checkpoints`` would reach its manifest entry, still on disk.

Restoring rebuilds the state from the input divisions and output logs, which are the source of
truth: the state is rolled back to the checkpoint and the steps divided since are executed again
from their recorded divisions (the step protocol's replay, ``step_protocol.recover``). Their
output was written before; the output logs verify it and discard it, so consumers see nothing
change.
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.runtime import step_protocol, upkeep
from dbsp_pipeline.runtime import upgrade as engine_upgrade
from dbsp_pipeline.runtime.division_log import CARRIED_RECORDS_KEY, DivisionLog
from dbsp_pipeline.runtime.engine_state import EngineState
from dbsp_pipeline.runtime.layout import LAYOUT_KEY, Layout
from dbsp_pipeline.runtime.results import Checkpoint, StepResult
from dbsp_pipeline.storage.state_db import (
    CIRCUIT_CHANGE_KEY,
    STATE_FORMAT,
    StateDatabase,
    state_format_of,
)
from dbsp_pipeline.storage.verify import prepare_open

log = logging.getLogger(__name__)


def retained(state: EngineState) -> list[Checkpoint]:
    """The retained checkpoints (``retain_checkpoints`` of them at most, none below the division
    log's ``compacted_below``), newest first."""
    return [Checkpoint(version=int(e["version"]), step=int(e.get("step", 0)),
                       layout=Layout.from_json(e.get("meta", {}).get(LAYOUT_KEY)),
                       fingerprint=e.get("fingerprint"),
                       engine_version=e.get("engine_version"),
                       state_format=e.get("state_format"),
                       circuit_change=e.get(CIRCUIT_CHANGE_KEY))
            for e in state.db.checkpoints(state.retain_checkpoints,
                                          state.divisions.compacted_below)]


def restore(state: EngineState, version: int) -> list[StepResult]:
    """Go back to the retained checkpoint ``version`` and execute again the steps divided
    since; returns them. The caller holds the pipeline's lock. Executed steps are committed
    first (so their outputs are verified too); damaged commits after ``version`` are set aside
    (``storage/set_aside.py``). Durable when it returns: the replayed steps are committed."""
    state.require_no_migration("restore")
    written = {int(e["version"]): state_format_of(e) for e in state.db.checkpoints(
        state.retain_checkpoints, state.divisions.compacted_below)}
    if written.get(version, STATE_FORMAT) < 3:  # (its migration rewrites traces in place)
        raise UsageError(
            f"checkpoint {version} of the pipeline at {state.root} was written by an engine "
            f"of state format {written[version]}: close the pipeline and open it at that "
            f"checkpoint (Pipeline(..., checkpoint={version})), which migrates it")
    # A commit of the executed steps first adds a checkpoint, which would push the oldest
    # retained one out of the count (its files stay until a collection): it is still one of
    # the checkpoints the caller was offered.
    retained = state.retain_checkpoints
    if state.uncommitted_steps:
        step_protocol.commit(state, compact=False)
        retained += 1
    state.compactor.apply_finished(wait=True)
    upkeep.fold(state)  # the entries about to be discarded carry step records
    if prepare_open(state.root, version, retained):  # set damage aside
        state.db = StateDatabase(state.spark, state.root, state.circuit.fingerprint())
    state.db.open(version, retained=retained,
                  from_step=state.divisions.compacted_below)  # else UsageError, by name
    try:  # a checkpoint an older engine wrote (format 3 or later: nothing rewritten before
        # the plan opens its tables), migrated as an open migrates it, in one commit
        migrated = engine_upgrade.migrate(state.db).migrations
        state.load_opened()  # operators over the rolled-back traces
        if engine_upgrade.widen_decimal_average_sums(state.db, state.plan, state.sql) \
                or migrated:
            state.db.wait_for_writes()
            state.db.commit()  # the copies, as a checkpoint of the same step
    except BaseException:  # half migrated: reopening the root starts over
        state.abandon()
        raise
    step_protocol.load_pending(state)
    replayed = step_protocol.recover(state)
    if state.uncommitted_steps:
        step_protocol.commit(state, compact=False)
    return replayed


def fold_carried_records(spark: SparkSession, root: str) -> int:
    """Fold the step records the newest manifest entry carries into the division log, before
    an older checkpoint is opened (which discards that entry and may set it aside as damage
    after the checkpoint); returns how many. The records are the steps' only durable home
    until then: their outputs were seen. A division log that cannot be read is left to the
    damage check that follows."""
    try:
        records = root_layout.newest_entry_meta(root, CARRIED_RECORDS_KEY)
        if not records:
            return 0
        divisions = DivisionLog(spark, root_layout.divisions(root))
    except Exception as e:  # noqa: BLE001 - damage: the check that follows names it
        log.warning("the step records carried by the newest checkpoint of %s were not folded "
                    "(%s); the damage check follows", root, e)
        return 0
    divisions.load_pending(records)
    return divisions.fold()
