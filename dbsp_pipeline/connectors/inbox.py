"""The inbox: a folder per input where files dropped by anyone become pushes.

Layout: ``<inbox>/<input>/<file>`` with ``<file>`` one of ``.jsonl`` (one JSON object per line),
``.csv`` (with a header) or ``.parquet`` (in any case: ``.CSV`` too). Columns are the input's; an
optional ``_weight`` column (a nonzero integer per record; missing or null means 1) makes the
file a Z-set, so ``-1`` deletes a record. An empty ``.jsonl`` file and a ``.csv`` file of only
its header hold no records. What the inbox never reads is reported, not moved (``ignored``):
a file of another suffix in an input's folder, and a folder naming no input.

When a file is complete. A file is read once it has not changed for ``settle_seconds`` (its
modification time is at least that old; default ``SETTLE_SECONDS``), and only if its size and
modification time stay the same while it is read; otherwise it waits for a later ingest. Names
starting with ``.`` or ending with ``.tmp`` are never read, so the safe way to write a file is
under such a name, renamed when complete. The inbox cannot tell how a file arrived, so a
renamed file waits out the interval too; with ``settle_seconds=0`` the inbox trusts every
writer to rename. A writer that pauses longer than the interval in the middle of a file must
rename.

Only regular files are read. A symbolic link (followed never: not even its target's type is
looked at), a FIFO, a socket, a device or a directory whose name has an inbox suffix is moved
as it is (a link, not its target) to ``rejected/`` with an error file.

Exactly once. ``ingest(p, folder)`` pushes every complete file, oldest first, then moves it to
``done/``. A file's identity is its name and its content: it is read into memory once, and
pushed with the producer name ``inbox/<input>/<file>@<sha256 of those bytes>`` and sequence
number 0, parsed from the same bytes. So if the process dies after the push and before the
move, the next ingest pushes it again as a no-op; a new file under a name used before (new
content) is a new producer and is pushed; the same content under the same name again is not
pushed twice (it lands in ``done/`` with 0 rows). A move takes only the file that was read:
one renamed over it meanwhile stays for the next ingest.

Rejection. A file that cannot be read or does not match the input is moved to ``rejected/``
beside a ``<file>.error.txt`` (mode 0600) naming the file, the input, the record and the
problem, with at most the offending record or line quoted and the message bounded to
``MESSAGE_LIMIT`` characters; files already pushed are not affected. A file rejected for its
content is also recorded in the errors table (``record_rejected_file``), once per name and
content, so its error id can re-inject the corrected rows (``Pipeline.reinject``).

``done/`` and ``rejected/`` never overwrite a file: when the name is taken, the file lands as
``<stem>.<first 12 hex digits of its sha256><suffix>`` and, if that is taken too (or for a file
that was not read), ``<stem>[.<hash>].<n><suffix>`` with the smallest free ``n``.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import math
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DecimalType, StructType

from dbsp_pipeline.connectors import codec
from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.errors import InputError
from dbsp_pipeline.spark_session import as_session
from dbsp_pipeline.storage.data_files import CHECKSUMS_READ
from dbsp_pipeline.zset import WEIGHT

if TYPE_CHECKING:
    from dbsp_pipeline.runtime.pipeline import Pipeline

SUFFIXES = (".jsonl", ".csv", ".parquet")
DONE = "done"
REJECTED = "rejected"
ERROR_SUFFIX = ".error.txt"
#: how long a file must stay unchanged before it is read, by default (seconds)
SETTLE_SECONDS = 2.0
#: the longest problem text written to an error file or reported (characters)
MESSAGE_LIMIT = 500


@dataclass
class IngestResult:
    """Per input, the files pushed (file name → rows) and rejected (file name → problem)."""

    pushed: dict[str, dict[str, int]] = field(default_factory=dict)
    rejected: dict[str, dict[str, str]] = field(default_factory=dict)
    #: what the inbox never reads, by path under the inbox, with why (``ignored_entries``)
    ignored: dict[str, str] = field(default_factory=dict)
    #: when the oldest pushed file arrived (its modification time; None if none was pushed)
    oldest_arrival: float | None = None

    @property
    def rows(self) -> int:
        return sum(n for files in self.pushed.values() for n in files.values())


@dataclass(frozen=True)
class InboxFile:
    """One entry of an input's inbox folder, as ``lstat`` saw it (links are not followed)."""

    input: str
    name: str
    path: str
    mode: int
    size: int
    mtime: float
    inode: tuple[int, int]

    @property
    def regular(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def kind(self) -> str:
        """What the entry is, for error messages."""
        for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"),
                           (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                           (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                           (stat.S_ISBLK, "a block device")):
            if test(self.mode):
                return kind
        return "not a regular file"


def pending_files(folder: str, inputs: list[str], settle_seconds: float = SETTLE_SECONDS,
                  ) -> dict[str, list[InboxFile]]:
    """Per input, what the next ingest handles, oldest first (by mtime, then name): regular
    files unchanged for ``settle_seconds``, and any other entry with an inbox suffix (a link, a
    FIFO, a directory...), which it rejects."""
    now = time.time()
    out = {}
    for name in inputs:
        d = os.path.join(folder, name)
        try:
            entries = os.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        files = []
        for f in entries:
            if inbox_format(f) is None or f.startswith("."):
                continue
            path = os.path.join(d, f)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # moved away meanwhile
                continue
            entry = InboxFile(name, f, path, st.st_mode, st.st_size, st.st_mtime,
                              (st.st_dev, st.st_ino))
            if entry.regular and settle_seconds > 0 and now - entry.mtime < settle_seconds:
                continue  # may still be being written
            files.append(entry)
        if files:
            out[name] = sorted(files, key=lambda e: (e.mtime, e.name))
    return out


def inbox_format(name: str) -> str | None:
    """The format of the inbox file ``name`` by its suffix, in any case (``.CSV`` is CSV): one
    of ``SUFFIXES``, or None for a name the inbox does not read."""
    lowered = name.lower()
    return next((s for s in SUFFIXES if lowered.endswith(s)), None)


def ignored_entries(folder: str, inputs: list[str],
                    unknown_folders: bool = True) -> dict[str, str]:
    """What the inbox ``folder`` holds that no ingest ever reads, by path under it, with why:
    a folder (or file) beside the inputs' folders that names no input (unless not
    ``unknown_folders``: an inbox several pipelines share), and a file of another suffix in an
    input's folder (not a hidden or ``.tmp`` name, which a writer uses until it renames the
    file). Reported, never moved: the inbox cannot tell a misplaced file from one someone
    keeps there on purpose."""
    out: dict[str, str] = {}
    try:
        top = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return out
    known = ", ".join(inputs)
    for name in top:
        if name.startswith(".") or name in inputs or not unknown_folders:
            continue
        out[name] = f"names no input of the pipeline (its inputs: {known}); nothing in it is read"
    for name in inputs:
        try:
            entries = sorted(os.listdir(os.path.join(folder, name)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for f in entries:
            if f in (DONE, REJECTED) or f.startswith(".") or f.endswith(".tmp") \
                    or inbox_format(f) is not None:
                continue
            out[f"{name}/{f}"] = ("is not read: the inbox reads .jsonl, .csv and .parquet files "
                                  "(rename it to one of them)")
    return out


def ingest(pipeline: Pipeline, folder: str, settle_seconds: float = SETTLE_SECONDS, *,
           report_unknown_folders: bool = True) -> IngestResult:
    """Push every complete file of the inbox ``folder`` into ``pipeline``; see the module
    docstring for when a file is complete and for the exactly-once and rejection rules.
    ``report_unknown_folders``: report folders naming no input of this pipeline as ignored
    (not for an inbox several pipelines share, where they are the others' inputs).

    Durability: when a file is in ``done/``, its records are durable in the input's log (or
    were already, pushed by an earlier ingest of the same name and content); a file still in
    the inbox may or may not have been pushed, and the next ingest settles which, without
    pushing it twice."""
    result = IngestResult(ignored=ignored_entries(folder, list(pipeline.circuit.inputs),
                                                  report_unknown_folders))
    errors: ErrorsSink | None = None
    for name, files in pending_files(folder, list(pipeline.circuit.inputs),
                                     settle_seconds).items():
        for entry in files:
            file = entry.name
            if not entry.regular:
                _reject(result, entry, None, f"file {file}: input '{name}': is {entry.kind}, "
                        "not a regular file; the inbox never follows or opens it (drop regular "
                        "files only)")
                continue
            try:
                data = read_settled(entry)
            except InputError as e:
                _reject(result, entry, None, f"file {file}: {e}")
                continue
            if data is None:  # changed or gone since it was listed: a later ingest takes it
                continue
            digest = hashlib.sha256(data).hexdigest()
            try:
                table = parse_file(name, file, data, pipeline.input_schema(name))
                producer = f"inbox/{name}/{file}@{digest}"
                if WEIGHT in table.column_names:
                    i = table.schema.get_field_index(WEIGHT)
                    weights = table.column(i)
                    if pa.types.is_integer(weights.type):
                        table = table.set_column(i, WEIGHT, weights.fill_null(1))
                    rows = pipeline.push_zset(name, table, producer=producer, seq=0)
                else:
                    rows = pipeline.push(name, table, producer=producer, seq=0)
            except InputError as e:
                line = _line_of(file, data, e.record_index)
                problem = f"file {file}{'' if line is None else f', line {line}'}: {e}"
                if errors is None:
                    errors = ErrorsSink(as_session(pipeline.spark), pipeline.root)
                record_rejected_file(errors, entry, digest, data, e.record_index or 0, problem)
                _reject(result, entry, digest, problem)
                continue
            move_unique(entry, DONE, digest)  # None: replaced since; a later ingest takes it
            result.pushed.setdefault(name, {})[file] = rows
            if result.oldest_arrival is None or entry.mtime < result.oldest_arrival:
                result.oldest_arrival = entry.mtime
    return result


def read_settled(entry: InboxFile) -> bytes | None:
    """The bytes of the regular file ``entry``, read once without following a link, or None
    if it changed (size, modification time, identity) since ``entry`` was listed or while it
    was read, or is gone. Raises ``InputError`` if it cannot be opened or read."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(entry.path, flags)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a link: the next listing rejects it
            return None
        raise InputError(entry.input, f"cannot be opened: {e.strerror}") from None
    try:
        if not _unchanged(entry, os.fstat(fd)):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        data = b"".join(chunks)
        if len(data) != entry.size or not _unchanged(entry, os.fstat(fd)):
            return None
        return data
    except OSError as e:
        raise InputError(entry.input, f"cannot be read: {e.strerror}") from None
    finally:
        os.close(fd)


def parse_file(input_name: str, file: str, data: bytes, schema: StructType) -> pa.Table:
    """The records of the inbox file ``file`` (its bytes ``data``) as Arrow; the push that
    follows checks them against the input's ``schema``. In JSON lines and CSV, the values of
    DECIMAL columns are read exactly as written (numbers or strings; never through a float),
    and DATE and TIMESTAMP columns from text as Kafka records are (``codec.typed_value``)."""
    buffer = pa.BufferReader(data)
    decimals = {f.name: pa.decimal128(f.dataType.precision, f.dataType.scale)
                for f in schema.fields if isinstance(f.dataType, DecimalType)}
    texts = {f.name: pa.string() for f in schema.fields
             if isinstance(f.dataType, codec.TYPED) and f.name not in decimals}
    fmt = inbox_format(file)
    try:
        if fmt == ".jsonl" and not data.strip():  # no records (as a CSV file of its header)
            return to_arrow_schema(schema).empty_table()
        if fmt == ".jsonl":
            table = pa_json.read_json(buffer, parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema({**decimals, **texts})))
            # an explicitly typed column absent from the file reads as NULLs: refuse it as
            # an absent column of any other type is (``records``: missing column)
            absent = [c for c in [*decimals, *texts] if table.column(c).null_count
                      == table.num_rows and f'"{c}"'.encode() not in data]
            if absent and table.num_rows:
                raise InputError(input_name, f"missing column(s) {absent}")
        elif fmt == ".csv":
            table = pa_csv.read_csv(buffer, convert_options=pa_csv.ConvertOptions(
                column_types={**decimals, **texts}))
        else:
            return pq.read_table(buffer, **CHECKSUMS_READ)
    except (pa.ArrowException, OSError) as e:
        if "CRC checksum verification failed" in str(e):  # (``CHECKSUMS_READ``)
            raise InputError(input_name, f"is damaged: a page's bytes do not match the CRC-32 "
                             f"its writer recorded ({e})") from None
        if "magic bytes not found" in str(e) or "minimum file footer" in str(e):
            raise InputError(input_name, "is not a whole Parquet file: it does not end with "
                             "Parquet's footer (cut short while it was written or copied, or "
                             "not Parquet)") from None
        if fmt == ".jsonl" and "JSON parse error" in str(e):  # (a value's type, a bad line)
            _raise_for_json_record(input_name, data, schema)
        raise InputError(input_name, f"cannot be parsed as {(fmt or '.?')[1:]}: {e}") from None
    _refuse_overflow(input_name, table, data, fmt)
    return codec.typed_text_columns(input_name, table, schema, csv_nulls=fmt == ".csv")


#: how CSV writes an infinity on purpose (Arrow reads these, and numbers too large, as one)
_INFINITIES = {"inf", "infinity"}


def _refuse_overflow(input_name: str, table: pa.Table, data: bytes, fmt: str | None) -> None:
    """``InputError`` for a number too large for its floating-point column (``1e400``), which
    Arrow reads as an infinity: JSON has no infinity, and CSV's is spelled ``inf`` or
    ``infinity`` (signed, in any case), which stays one. Costs nothing without infinities."""
    for i, column in enumerate(table.schema):
        if not pa.types.is_floating(column.type):
            continue
        infinite = pc.fill_null(pc.is_inf(table.column(i)), False)
        if not pc.any(infinite).as_py():
            continue
        rows = pc.indices_nonzero(infinite).to_pylist()
        texts: list[str | None] = [None] * len(rows)
        if fmt == ".csv":  # the same file, the column as written
            written = pa_csv.read_csv(pa.BufferReader(data), convert_options=pa_csv.ConvertOptions(
                column_types={column.name: pa.string()})).column(column.name)
            texts = [written[r].as_py() for r in rows]
        for row, text in zip(rows, texts):
            if text is not None and text.strip().lstrip("+-").lower() in _INFINITIES:
                continue
            what = f"value {text}" if text is not None else "a number"
            raise InputError(input_name, f"{what} is too large for {column.type} (it would be "
                             "read as an infinity)", record_index=row, column=column.name)


def _raise_for_json_record(input_name: str, data: bytes, schema: StructType) -> None:
    """After Arrow's JSON reader refused a file (it names no record, and a type by its own
    names: "changed from number to string in row 1"): read it line by line as a user's push
    of records would be, and raise the ``InputError`` naming the first bad record and column
    (``records.to_arrow``), over the columns JSON gives their values (not DECIMAL, DATE or
    TIMESTAMP ones, whose text the reader converts: ``typed_text_columns``). Returns when
    every record passes (the reader's error stands)."""
    from dbsp_pipeline.runtime import records

    plain = StructType([f for f in schema.fields
                        if not isinstance(f.dataType, codec.TYPED)])
    rows: list[dict[str, object]] = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise InputError(input_name, f"is not valid JSON ({e})", record_index=len(rows),
                             record=line.decode("utf-8", errors="replace")) from None
        if not isinstance(row, dict):
            raise InputError(input_name, f"a record must be a JSON object, got "
                             f"{type(row).__name__}", record_index=len(rows), record=row)
        for key, value in row.items():  # (JSON has no infinity: a number too large)
            if isinstance(value, float) and math.isinf(value):
                raise InputError(input_name, "a number is too large for double (it would be "
                                 "read as an infinity)", record_index=len(rows), column=key)
        rows.append({name: row.get(name) for name in plain.fieldNames()})
    try:
        records.to_arrow(input_name, rows, plain, to_arrow_schema(plain), 1)  # InputError
    except (pa.ArrowException, ValueError, TypeError):
        pass  # nothing it can name: the reader's error stands


def _line_of(file: str, data: bytes, record: int | None) -> int | None:
    """The line of the file's text where record ``record`` (counted from 0) is: its non-blank
    line (after the header in CSV, where no quoted value may hold a line break: a file
    without quotes); None where that cannot be said (Parquet)."""
    fmt = inbox_format(file)
    if record is None or fmt not in (".jsonl", ".csv") or (fmt == ".csv" and b'"' in data):
        return None
    seen = -2 if fmt == ".csv" else -1  # (the header is no record)
    for number, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            seen += 1
            if seen == record:
                return number
    return None


def move_unique(entry: InboxFile, sub: str, digest: str | None, error: str | None = None,
                ) -> str | None:
    """Move ``entry`` (a link itself, not its target) into the folder ``sub`` beside it, under
    its name or the first free name of the module docstring's sequence, and return that name;
    never replaces a file there. With ``error``, first write it to ``<name>.error.txt``
    (created, never replaced, with mode 0600). Returns None, moving nothing, if the entry's
    name no longer holds the file listed (gone, or replaced by a new file, which a later
    ingest takes). A regular file or a link is moved by a hard link then an unlink: a crash in
    between leaves it in both places, and the next ingest moves the inbox copy beside the
    first (its push a no-op)."""
    target = os.path.join(os.path.dirname(entry.path), sub)
    os.makedirs(target, exist_ok=True)
    for name in _names(entry.name, digest):
        dst = os.path.join(target, name)
        if os.path.lexists(dst) or (error is not None and os.path.lexists(dst + ERROR_SUFFIX)):
            continue
        try:
            if error is not None:
                _write_private(dst + ERROR_SUFFIX, error + "\n")
        except FileExistsError:
            continue
        try:
            moved = _move_if_same(entry, dst)
        except FileExistsError:
            moved = None
        if moved:
            return name
        if error is not None:
            os.unlink(dst + ERROR_SUFFIX)
        if moved is False:
            return None
    raise AssertionError("unreachable: the names are endless")


def bounded(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` cut to ``limit`` characters, saying how much was left out."""
    if len(message) <= limit:
        return message
    return message[:limit] + f"... ({len(message) - limit} more characters not shown)"


def record_rejected_file(errors: ErrorsSink, entry: InboxFile, digest: str, data: bytes,
                         offset: int, problem: str) -> None:
    """Record a file rejected for its content in the errors table, once per name and content
    (before it is moved, so a crash in between records it at the next ingest, not twice): one
    row, source ``inbox/<file>@<first 12 hex digits of its sha256>``, as offset the offending
    record's index (0 for a problem of the whole file), the file's text as the record (None
    for Parquet). Its error id re-injects the file's corrected rows (``Pipeline.reinject``)."""
    text = None if inbox_format(entry.name) == ".parquet" else data.decode("utf-8",
                                                                             errors="replace")
    errors.record(f"inbox/{entry.input}/{entry.name}@{digest}", 0, [
        {"input": entry.input, "source": f"inbox/{entry.name}@{digest[:12]}", "partition": None,
         "offset": offset, "reason": bounded(problem), "record": text}])


def _reject(result: IngestResult, entry: InboxFile, digest: str | None, problem: str) -> None:
    problem = bounded(problem)
    move_unique(entry, REJECTED, digest, error=problem)
    result.rejected.setdefault(entry.input, {})[entry.name] = problem


def _unchanged(entry: InboxFile, st: os.stat_result) -> bool:
    return (stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == entry.inode
            and st.st_size == entry.size and st.st_mtime == entry.mtime)


def _names(file: str, digest: str | None) -> Iterator[str]:
    """``file``, then ``<stem>.<hash><suffix>`` (with a digest), then numbered variants."""
    suffix = file[len(file) - len(inbox_format(file) or ""):]  # as the file spells it
    stem = file[:len(file) - len(suffix)]
    yield file
    if digest is not None:
        stem = f"{stem}.{digest[:12]}"
        yield stem + suffix
    for n in itertools.count(1):
        yield f"{stem}.{n}{suffix}"


def _move_if_same(entry: InboxFile, dst: str) -> bool:
    """Rename ``entry`` (not following a link) to ``dst`` if its name still holds it; False if
    not (nothing moved); FileExistsError if ``dst`` exists."""
    try:
        os.link(entry.path, dst, follow_symlinks=False)  # atomic: fails if dst exists
    except FileExistsError:
        raise
    except FileNotFoundError:
        return False
    except OSError:  # directories, and file systems without hard links
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "exists", dst) from None
        if not _same(entry, entry.path):
            return False
        os.rename(entry.path, dst)
        return True
    if not _same(entry, dst):  # the name was given to a new file meanwhile
        os.unlink(dst)
        return False
    os.unlink(entry.path)
    return True


def _same(entry: InboxFile, path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == entry.inode


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


__all__ = ["SETTLE_SECONDS", "InboxFile", "IngestResult", "ignored_entries", "inbox_format",
           "ingest", "move_unique", "parse_file", "pending_files", "read_settled"]
