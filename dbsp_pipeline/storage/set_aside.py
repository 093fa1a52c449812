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

Where: a local table or one in an object store (``s3://``); every file is reached through
``small_files.py``.

Durability: the hint ``_last_checkpoint`` and Delta checkpoints after the version go first,
then the commits from the newest down, so a crash in between leaves a log that ends at some
version between the two, readable; doing it again finishes the job. Locally each file goes by
one rename. On S3, which has no rename, each goes by a copy into the folder and then a delete
from the log, in that order: a crash between the two leaves the file in both places, the log
still whole and contiguous (nothing was taken out of it yet), and the next restore sets the
file aside again (into a new folder; the copy in the old one is a spare).
"""

from __future__ import annotations

import json
import os
import re
import time

from dbsp_pipeline.storage.small_files import (
    list_names,
    make_folder,
    move,
    read_text,
    write_atomically,
)

SET_ASIDE_DIR = "_dbsp_set_aside"
_VERSIONED = re.compile(r"^(\d{20})\.(json|checkpoint(\.\d+\.\d+)?\.parquet|crc)$")
#: the file in ``_delta_log`` naming the newest checkpoint
LAST_CHECKPOINT = "_last_checkpoint"


def set_aside_after(uri: str, version: int, reason: str) -> str:
    """Move every commit of the Delta table at ``uri`` (a local path or ``s3://``) after
    ``version`` (and the Delta checkpoints after it) into a new folder under
    ``<uri>/_dbsp_set_aside/``, with a note holding ``reason``; returns the folder. Afterwards
    the table's newest version is ``version``."""
    log = os.path.join(uri, "_delta_log")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = os.path.join(uri, SET_ASIDE_DIR, f"{stamp}-after-{version}")
    make_folder(folder)
    note = os.path.join(folder, "REASON.txt")
    write_atomically(note, (read_text(note) or "")
                     + f"commits after version {version} of {uri}, set aside: {reason}\n")
    names = list_names(log)
    if LAST_CHECKPOINT in names:
        try:
            pointed = checkpoint_hint_version(read_text(os.path.join(log, LAST_CHECKPOINT)))
        except OSError:
            pointed = None
        if pointed is None or pointed > version:  # delta-rs lists the log without it
            move(os.path.join(log, LAST_CHECKPOINT), os.path.join(folder, LAST_CHECKPOINT))
    later = sorted(((int(m[1]), name) for name in names
                    if (m := _VERSIONED.match(name)) and int(m[1]) > version),
                   key=lambda vn: (vn[0], not vn[1].endswith(".json")), reverse=True)
    # Checkpoints first (a checkpoint left behind would still be read as the newest version),
    # then the commits from the newest down, so the log stays contiguous at every moment.
    for _, name in [vn for vn in later if not vn[1].endswith(".json")] + \
            [vn for vn in later if vn[1].endswith(".json")]:
        move(os.path.join(log, name), os.path.join(folder, name))
    return folder


def checkpoint_hint_version(text: str | None) -> int | None:
    """The version the ``_last_checkpoint`` hint ``text`` points at (None if it cannot be
    read)."""
    try:
        value = json.loads(text).get("version") if text is not None else None
        return value if isinstance(value, int) else None
    except (ValueError, AttributeError):
        return None
