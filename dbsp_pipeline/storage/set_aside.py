"""Setting a table's newest commits aside: how a restore gets past damaged newer state.

Restoring a checkpoint discards the state newer than it: each state table is rolled back to the
version the checkpoint records, and the manifest to the checkpoint's entry. A rollback is
normally a new Delta commit (``SparkDeltaTable.restore``), which needs the table's log to be
readable to its end. When a commit after the restored version is damaged (``verify.py``), the
restore instead moves the commits after that version out of the log, into
``<table>/_dbsp_set_aside/<time>/`` with a note saying why: the table then ends at the restored
version, and its next commit takes the number after it. Nothing is deleted; the data files the
moved commits added are no version's any more and go with the garbage (``garbage.py``).

Only for tables a single pipeline process writes and whose newer versions no retained
checkpoint reads: the state tables and the manifest. The root must not be open elsewhere.

Durability: the hint ``_last_checkpoint`` and Delta checkpoints after the version go first,
then the commits from the newest down, each by one rename, so a crash in between leaves a log
that ends at some version between the two, readable; doing it again finishes the job.
"""

from __future__ import annotations

import json
import os
import re
import time

SET_ASIDE_DIR = "_dbsp_set_aside"
_VERSIONED = re.compile(r"^(\d{20})\.(json|checkpoint(\.\d+\.\d+)?\.parquet|crc)$")


def set_aside_after(uri: str, version: int, reason: str) -> str:
    """Move every commit of the Delta table at ``uri`` after ``version`` (and the Delta
    checkpoints after it) into a new folder under ``<uri>/_dbsp_set_aside/``, with a note
    holding ``reason``; returns the folder. Afterwards the table's newest version is
    ``version``."""
    log = os.path.join(uri, "_delta_log")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = os.path.join(uri, SET_ASIDE_DIR, f"{stamp}-after-{version}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "REASON.txt"), "a") as fh:
        fh.write(f"commits after version {version} of {uri}, set aside: {reason}\n")
    hint = os.path.join(log, "_last_checkpoint")
    if os.path.exists(hint):
        pointed = _hint_version(hint)
        if pointed is None or pointed > version:  # delta-rs lists the log without it
            os.replace(hint, os.path.join(folder, "_last_checkpoint"))
    later = sorted(((int(m[1]), name) for name in os.listdir(log)
                    if (m := _VERSIONED.match(name)) and int(m[1]) > version),
                   key=lambda vn: (vn[0], not vn[1].endswith(".json")), reverse=True)
    # Checkpoints first (a checkpoint left behind would still be read as the newest version),
    # then the commits from the newest down, so the log stays contiguous at every moment.
    for _, name in [vn for vn in later if not vn[1].endswith(".json")] + \
            [vn for vn in later if vn[1].endswith(".json")]:
        os.replace(os.path.join(log, name), os.path.join(folder, name))
    return folder


def _hint_version(path: str) -> int | None:
    """The version the ``_last_checkpoint`` hint points at (None if it cannot be read)."""
    try:
        with open(path) as fh:
            value = json.load(fh).get("version")
        return value if isinstance(value, int) else None
    except (OSError, ValueError, AttributeError):
        return None
