"""Kafka in and out, exactly once.

**In** (``KafkaSource``): each bound input reads one topic (any number of partitions). A
source reads the partitions of one worker (``worker``: the layout's ``partition_owner``, the
partition mod W) or, without one, all of them; ``KafkaRunner`` runs one source per worker of the
layout, each with its own consumer, polled in parallel, and follows a rescale (a partition whose
owner changed is given up by one source and taken by another at its recorded offset). A
partition's records are pushed into the input's durable log with the producer name
``kafka/<topic>/<partition>`` and, as sequence number, the offset of the batch's last record:
the records and the offset are committed together, so after a crash, or when the partition
moves to another worker, it is read again from the recorded offset + 1, and no record enters
twice or is lost (the exactly-once handshake is per partition, whichever worker reads it). The
pipeline tracks these producers, so every step's division records the offsets it reaches
(``Pipeline.step_info(s).offsets``; ``docs/recovery.md``, section 4), written before any output
of the step. Replay after a crash re-reads those records from the input log, where they are
durable whatever the topic's retention. Records are read with ``isolation.level=read_committed``.

Formats (``codec.py``): JSON with an ``insert``/``delete`` envelope (a plain row inserts), or
CSV. A record that cannot be decoded, or whose values do not fit the input, goes to the errors
sink (``errors_sink.py``: topic, partition, offset, reason, raw record) and the batch goes on;
the step that consumes the batch reports the count (``StepResult.rejected``).

**Out** (``KafkaSink``): each bound view writes its changes to a topic. One transactional
producer per pipeline and worker (``transactional.id`` = ``dbsp-<circuit>-<pipeline id>-w<n>``):
starting it fences any older producer with the same id, so a second process running as the same
pipeline stops the first one's output. Step ``s`` of every view is written in one transaction:
each changed row as one record ``{"insert": row}`` or ``{"delete": row}`` (with ``"weight": n``
when it changed by ``n > 1`` copies) (key: the
row), with headers ``dbsp.step``, ``dbsp.worker`` and ``dbsp.pipeline``, plus one record on the
side topic ``<topic>.steps`` (one partition): ``{"step": s, "rows": n, "offsets": {...}}``,
where ``offsets`` maps each input fed by Kafka to the partition offsets ``(after, upto]`` the
step consumed. That side topic is how a consumer maps output back to input, and how the sink
finds ``last`` at start: the step after the newest one committed there. The output write rules
follow: steps below ``last`` are already out and are skipped; ``last`` is appended. The changes
come from the view's durable output log (never recomputed), which a lease (``Pipeline.reader``)
keeps from being compacted before they are out. A consumer with ``isolation.level=
read_committed`` sees every step exactly once.

``KafkaRunner`` ties both to a pipeline: poll, step while input is pending, emit. Its step
carries the batches it polled (``Pipeline.step_carrying``): each partition batch's file is
written at the poll and its commit (records and offset together, as above) lands while the step
computes, at the log version the step's division names; a step that raises leaves each batch
recorded or not, and the sources read again from the recorded offsets.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.connectors.codec import FORMATS, Batch, encode_change, json_value
from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.errors import (
    ConcurrentWriterError,
    PipelineFencedError,
    StorageError,
    UsageError,
)
from dbsp_pipeline.spark_session import as_session
from dbsp_pipeline.storage import crash_points

if TYPE_CHECKING:
    from dbsp_pipeline.runtime.input_log import WrittenPush
    from dbsp_pipeline.runtime.pipeline import Pipeline
    from dbsp_pipeline.runtime.results import StepResult

#: suffix of the side topic that records, per step, what a view's output came from
STEPS_SUFFIX = ".steps"
HEADER_STEP, HEADER_WORKER, HEADER_PIPELINE = "dbsp.step", "dbsp.worker", "dbsp.pipeline"


@dataclass(frozen=True)
class KafkaInput:
    """Circuit input ``input`` is fed by ``topic`` in ``format`` (``json`` or ``csv``)."""

    input: str
    topic: str
    format: str = "json"


@dataclass(frozen=True)
class KafkaOutput:
    """View ``view`` is written to ``topic`` (created with ``partitions`` if missing)."""

    view: str
    topic: str
    partitions: int = 1


def producer_name(topic: str, partition: int) -> str:
    """The input-log producer whose sequence numbers are ``topic``/``partition``'s offsets."""
    return f"kafka/{topic}/{partition}"


@dataclass
class PollResult:
    """Per input: rows pushed and records rejected by one ``KafkaSource.poll``."""

    pushed: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    #: the oldest record's Kafka timestamp (seconds since the epoch; None: no record)
    oldest: float | None = None

    @property
    def records(self) -> int:
        return sum(self.pushed.values()) + sum(self.rejected.values())


class KafkaSource:
    """Reads the bound topics into the pipeline's input logs. See the module docstring."""

    def __init__(self, pipeline: Pipeline, config: dict[str, Any], inputs: Sequence[KafkaInput],
                 errors: ErrorsSink | None = None, *, worker: int | None = None) -> None:
        """``worker``: read only the partitions that worker owns in the pipeline's layout (the
        partition mod W, ``Layout.partition_owner``), following the layout as it changes; None:
        every partition. No two sources may read one partition at once: a runner's sources, one
        per worker, never do."""
        if worker is not None and not 0 <= worker < pipeline.layout.workers:
            raise UsageError(f"worker {worker} is not one of the layout's "
                             f"{pipeline.layout.workers} workers")
        self.worker = worker
        topics = [b.topic for b in inputs]
        if len(set(topics)) != len(topics):
            raise UsageError(f"a topic can feed one input only: {topics}")
        for b in inputs:
            if b.format not in FORMATS:
                raise UsageError(f"input '{b.input}': format must be one of {FORMATS}")
            pipeline.input_schema(b.input)  # an unknown input is an error here
        self.pipeline = pipeline
        self.bindings = {b.topic: b for b in inputs}
        self.errors = errors or ErrorsSink(as_session(pipeline.spark), pipeline.root)
        self.config = dict(config)
        self._consumer = Consumer({
            **self.config, "group.id": f"dbsp-{pipeline.circuit.name}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.partition.eof": False})
        self._assigned: set[tuple[str, int]] = set()
        self._admin = AdminClient(self.config)

    # -- reading ---------------------------------------------------------------------------
    def poll(self, max_records: int = 50_000, timeout: float = 0.5, *,
             follow_layout: bool = True,
             carry: list[tuple[str, WrittenPush]] | None = None) -> PollResult:
        """Read what the topics have (up to ``max_records``, waiting up to ``timeout`` for the
        first) and push it, one push per partition batch; returns the counts. First takes and
        gives up partitions as the layout says (``follow_layout``), unless told not to (the
        runner does that for all its sources before any reads). With ``carry``, each batch is
        written, not committed, and appended there as ``(input, push)`` for the next step to
        carry (``Pipeline.step_carrying``); if that step raises, ``rewind`` before reading
        on."""
        if follow_layout:
            self.follow_layout()
        result = PollResult()
        messages = self._consumer.consume(max_records, timeout)
        by_partition: dict[tuple[str, int], list[Message]] = defaultdict(list)
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise StorageError(f"reading Kafka failed: {error}", definitely_failed=True)
            topic, partition = m.topic(), m.partition()
            assert topic is not None and partition is not None  # a message, not an event
            by_partition[(topic, partition)].append(m)
            kind, stamp = m.timestamp()
            if kind != 0 and (result.oldest is None or stamp / 1000 < result.oldest):
                result.oldest = stamp / 1000
        try:
            for (topic, partition), batch in by_partition.items():
                pushed, rejected = self._push(topic, partition, batch, carry)
                name = self.bindings[topic].input
                result.pushed[name] = result.pushed.get(name, 0) + pushed
                result.rejected[name] = result.rejected.get(name, 0) + rejected
        except ConcurrentWriterError as e:
            raise PipelineFencedError(
                f"the Kafka input of pipeline '{self.pipeline.circuit.name}' is being read by "
                f"another process ({e}): this one is fenced") from e
        except BaseException:
            self.rewind()  # positions moved past records not recorded: read them again
            raise
        return result

    def _push(self, topic: str, partition: int, messages: list[Message],
              carry: list[tuple[str, WrittenPush]] | None = None) -> tuple[int, int]:
        binding = self.bindings[topic]
        log_schema = self.pipeline.input_schema(binding.input)
        batch = Batch(binding.input, log_schema.fieldNames(), binding.format)
        raw: dict[int, bytes | None] = {}
        for m in messages:
            offset = m.offset()
            assert offset is not None  # a consumed message has its offset
            batch.add(offset, m.value())
            raw[offset] = m.value()
        zset = batch.to_zset(log_schema, self.pipeline.input_arrow_schema(binding.input))
        producer = producer_name(topic, partition)
        upto = max(raw)
        if batch.bad:
            self.errors.record(producer, upto, [
                {"input": binding.input, "source": topic, "partition": partition,
                 "offset": offset, "reason": reason,
                 "record": _text(raw[offset])}
                for offset, reason in sorted(batch.bad)])
        if carry is None:
            self.pipeline.push_zset(binding.input, zset, producer=producer, seq=upto,
                                    rejected=len(batch.bad))
        else:
            push = self.pipeline.write_push(binding.input, zset, producer=producer, seq=upto,
                                            rejected=len(batch.bad))
            if push is not None:
                carry.append((binding.input, push))
        return zset.num_rows, len(batch.bad)

    def close(self) -> None:
        self._consumer.close()

    # -- assignment ------------------------------------------------------------------------
    def _next_offset(self, topic: str, partition: int) -> int:
        recorded = self.pipeline.pushed(self.bindings[topic].input,
                                        producer_name(topic, partition))
        return 0 if recorded is None else recorded + 1

    def _partitions(self) -> dict[str, list[int]]:
        meta = self._admin.list_topics(timeout=10)
        out = {}
        for topic in self.bindings:
            info = meta.topics.get(topic)
            out[topic] = sorted(info.partitions) if info is not None and not info.error else []
        return out

    @property
    def assigned(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this source reads now, sorted."""
        return sorted(self._assigned)

    def owns(self, partition: int) -> bool:
        """Whether this source reads ``partition`` (of any bound topic) under the layout now."""
        return (self.worker is None
                or self.pipeline.layout.partition_owner(partition) == self.worker)

    def follow_layout(self) -> None:
        """Take the partitions this source owns and does not read yet (new ones, or moved here
        by a rescale), each at its recorded offset + 1; give up those it no longer owns."""
        owned = {(topic, p) for topic, partitions in self._partitions().items()
                 for p in partitions if self.owns(p)}
        gone = sorted(self._assigned - owned)
        if gone:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in gone])
            self._assigned -= set(gone)
        fresh = sorted(owned - self._assigned)
        for topic, p in fresh:
            self.pipeline.track_producers(self.bindings[topic].input, [producer_name(topic, p)])
        if fresh:
            self._consumer.incremental_assign(
                [TopicPartition(t, p, self._next_offset(t, p)) for t, p in fresh])
            self._assigned |= set(fresh)

    def rewind(self) -> None:
        """Read again from the newest recorded offset of each assigned partition (after pushes
        that may not be recorded)."""
        for topic, partition in self._assigned:
            self._consumer.seek(TopicPartition(topic, partition,
                                               self._next_offset(topic, partition)))


def topic_lag(config: dict[str, Any], root: str, inputs: Sequence[KafkaInput]) -> dict[str, int]:
    """Per bound input, how many offsets its topic holds beyond what the pipeline at ``root``
    recorded, read without opening the pipeline (for a sensor; any root, local or ``s3://``):
    the partitions' high watermarks minus the offsets recorded in the input logs. (Transaction
    markers count as offsets, so a topic written transactionally may show a small lag with
    nothing to read.)"""
    from dbsp_pipeline.runtime.input_log import PRODUCER_APP_PREFIX
    from dbsp_pipeline.storage.delta_table import delta_log

    consumer = Consumer({**config, "group.id": "dbsp-lag", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(timeout=10)
        out = {}
        for b in inputs:
            uri = root_layout.input_log(root, b.input)
            log = delta_log(uri)  # any store: a local or an s3:// root
            info = meta.topics.get(b.topic)
            lag = 0
            for p in sorted(info.partitions) if info is not None and not info.error else []:
                _, high = consumer.get_watermark_offsets(TopicPartition(b.topic, p),
                                                         timeout=10, cached=False)
                recorded = (log.transaction_version(PRODUCER_APP_PREFIX +
                                                    producer_name(b.topic, p))
                            if log is not None else None)
                lag += max(0, high - (0 if recorded is None else recorded + 1))
            out[b.input] = lag
        return out
    finally:
        consumer.close()


class KafkaSink:
    """Writes the bound views' changes to their topics. See the module docstring."""

    def __init__(self, pipeline: Pipeline, config: dict[str, Any],
                 outputs: Sequence[KafkaOutput], *,
                 worker: int = 0, transactional_id: str | None = None,
                 transaction_timeout: float = 30.0) -> None:
        for b in outputs:
            pipeline.output_last(b.view)  # an unknown view is an error here
        self.pipeline = pipeline
        self.bindings = list(outputs)
        self.worker = worker
        self.config = dict(config)
        self.timeout = transaction_timeout
        self.transactional_id = transactional_id or (
            f"dbsp-{pipeline.circuit.name}-{pipeline.pipeline_id[:8]}-w{worker}")
        self._ensure_topics()
        #: the producer's fatal error, as librdkafka reports it (its original code, e.g.
        #: _FENCED), when one happened: an action then fails only with the code _FATAL
        self._fatal: KafkaError | None = None
        user_error_cb = self.config.get("error_cb")

        def on_error(err: KafkaError) -> None:
            if err.fatal():
                self._fatal = err
            if user_error_cb is not None:
                user_error_cb(err)

        self._producer = Producer({**self.config, "transactional.id": self.transactional_id,
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "error_cb": on_error})
        self._guard(lambda: self._producer.init_transactions(self.timeout))  # fences older ones
        self.last = {b.view: self._read_last(b.topic) for b in self.bindings}
        # Hold the changes not yet out: history compaction must not collapse them.
        self._leases = {b.view: pipeline.reader(b.view, since=max(self.last[b.view] - 1, 0))
                        for b in self.bindings}

    def emit(self) -> list[int]:
        """Write every step the views' output logs have and the topics do not yet; returns
        the steps written (one transaction each)."""
        written = []
        upto = min(self.pipeline.output_last(b.view) for b in self.bindings)
        for s in range(min(self.last.values(), default=upto), upto):
            due = [b for b in self.bindings if self.last[b.view] <= s]
            if due:
                self._write_step(s, due)
                written.append(s)
        for b in self.bindings:
            lease = self._leases[b.view]
            lease.renew()
            if self.last[b.view] - 1 > lease.since:
                lease.downgrade_since(self.last[b.view] - 1)
        return written

    def _write_step(self, step: int, bindings: list[KafkaOutput]) -> None:
        info = self.pipeline.step_info(step)
        offsets = {name: {producer.rsplit("/", 1)[1]: list(span)
                          for producer, span in spans.items()}
                   for name, spans in info.offsets.items()}
        headers: list[tuple[str, str | bytes | None]] = [
            (HEADER_STEP, str(step).encode()), (HEADER_WORKER, str(self.worker).encode()),
            (HEADER_PIPELINE, self.pipeline.circuit.name.encode())]

        def transaction() -> None:
            self._producer.begin_transaction()
            for b in bindings:
                rows = self.pipeline.step_changes_arrow(b.view, step).to_pylist()
                count = 0
                for row in rows:
                    weight = row.pop("_weight")
                    key = json.dumps(row, sort_keys=True, default=json_value).encode()
                    self._produce(b.topic, encode_change(row, weight), key, headers)
                    count += 1
                side = {"step": step, "view": b.view, "rows": count, "offsets": offsets}
                self._produce(b.topic + STEPS_SUFFIX, json.dumps(side).encode(), None, headers,
                              partition=0)
            crash_points.hit("kafka.transaction.before_commit")
            self._producer.commit_transaction(self.timeout)
            crash_points.hit("kafka.transaction.after_commit")

        self._guard(transaction)
        for b in bindings:
            self.last[b.view] = step + 1

    def _produce(self, topic: str, value: bytes, key: bytes | None,
                 headers: list[tuple[str, str | bytes | None]] | None,
                 partition: int | None = None) -> None:
        while True:
            try:
                if partition is None:
                    self._producer.produce(topic, value, key, headers=headers)
                else:
                    self._producer.produce(topic, value, key, headers=headers, partition=partition)
                return
            except BufferError:
                self._producer.poll(0.1)  # the local queue is full: let deliveries drain

    def _guard(self, action: Callable[[], object]) -> None:
        """Run a producer action; fencing becomes ``PipelineFencedError``; an abortable error
        aborts the transaction and is raised as a storage error that did not happen."""
        try:
            action()
        except KafkaException as e:
            err = e.args[0]
            if err.code() == KafkaError._FATAL:
                try:  # serve the error callback that names the cause (polling may raise it)
                    self._producer.poll(0)
                except KafkaException as cause:
                    self._fatal = cause.args[0]
                err = self._fatal or err
            if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                              KafkaError.INVALID_PRODUCER_EPOCH):
                raise PipelineFencedError(
                    f"output of pipeline '{self.pipeline.circuit.name}' to Kafka is being "
                    f"written by another process (transactional id {self.transactional_id}): "
                    "this one is fenced") from e
            if err.txn_requires_abort():
                self._producer.abort_transaction(self.timeout)
                raise StorageError(f"Kafka transaction aborted: {err}",
                                   definitely_failed=True) from e
            raise StorageError(f"Kafka producer failed: {err}",
                               definitely_failed=not err.retriable()) from e

    # -- where the topics are --------------------------------------------------------------
    def _ensure_topics(self) -> None:
        admin = AdminClient(self.config)
        meta = admin.list_topics(timeout=10)
        wanted = []
        for b in self.bindings:
            if b.topic not in meta.topics:
                wanted.append(NewTopic(b.topic, num_partitions=b.partitions,
                                       replication_factor=1))
            if b.topic + STEPS_SUFFIX not in meta.topics:
                wanted.append(NewTopic(b.topic + STEPS_SUFFIX, num_partitions=1,
                                       replication_factor=1))
        for topic, future in (admin.create_topics(wanted).items() if wanted else []):
            try:
                future.result()
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise StorageError(f"cannot create topic {topic}: {e}",
                                       definitely_failed=True) from e

    def _read_last(self, topic: str) -> int:
        """The step after the newest one committed on ``topic``'s side topic (0: none)."""
        side = TopicPartition(topic + STEPS_SUFFIX, 0)
        newest = read_newest(self.config, side)
        return 0 if newest is None else json.loads(newest)["step"] + 1

    def close(self) -> None:
        for lease in self._leases.values():
            lease.close()
        self._producer.flush(self.timeout)


def read_newest(config: dict[str, Any], tp: TopicPartition, timeout: float = 10.0) -> bytes | None:
    """The value of the newest committed record of one partition (None if it has none),
    read with ``read_committed``: transaction markers and aborted records are skipped."""
    consumer = Consumer({**config, "group.id": "dbsp-tail-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
        back = 4
        while True:
            start = max(low, high - back)
            consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
            newest, deadline = None, time.monotonic() + timeout
            while time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is None:
                    continue
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break
                    raise StorageError(f"reading {tp.topic} failed: {error}",
                                       definitely_failed=True)
                newest = m.value()
            if newest is not None or start == low:
                return newest
            back *= 4
    finally:
        consumer.close()


class KafkaRunner:
    """A pipeline fed and read through Kafka: ``run`` polls the sources, executes a step while
    input is pending, and writes the new output; ``close`` closes the clients (not the
    pipeline).

    The input is read by one ``KafkaSource`` per worker of the pipeline's layout (``sources``:
    worker ``w`` reads the partitions ``p`` with ``p mod W == w``, with its own consumer), polled
    in parallel threads; their pushes go through the pipeline one at a time. After a rescale the
    runner has one source per new worker, and each partition is read by its new owner from its
    recorded offset."""

    def __init__(self, pipeline: Pipeline, config: dict[str, Any],
                 inputs: Sequence[KafkaInput] = (), outputs: Sequence[KafkaOutput] = ()) -> None:
        self.pipeline = pipeline
        self._config = dict(config)
        self._inputs = list(inputs)
        self._errors = ErrorsSink(as_session(pipeline.spark), pipeline.root) if inputs else None
        #: one source per worker of the layout (none without inputs)
        self.sources: list[KafkaSource] = []
        self._pool: ThreadPoolExecutor | None = None  # polls the sources (W > 1)
        self._pool_size = 0
        self._one_source_per_worker()
        self.sink = KafkaSink(pipeline, config, outputs) if outputs else None
        #: the oldest Kafka timestamp among the records ``run`` read (None: none)
        self.oldest_arrival: float | None = None
        if self.sink is not None:
            self.sink.emit()  # steps whose output was written but not yet sent (a crash)

    def run(self, max_steps: int | None = None, max_seconds: float | None = None,
            idle_seconds: float = 1.0, poll_records: int = 50_000) -> list[StepResult]:
        """Steps while input arrives; stops after ``max_steps``, after ``max_seconds``, or
        when no record came for ``idle_seconds``. Returns the step results."""
        results: list[StepResult] = []
        started = idle_since = time.monotonic()
        while True:
            now = time.monotonic()
            if max_steps is not None and len(results) >= max_steps:
                break
            if max_seconds is not None and now - started >= max_seconds:
                break
            carried: list[tuple[str, WrittenPush]] = []
            polled = self.poll(poll_records, carry=carried)
            if polled.records:
                idle_since = now
                if polled.oldest is not None:
                    self.oldest_arrival = min(self.oldest_arrival or polled.oldest,
                                              polled.oldest)
            if carried or self.pipeline.input_pending():
                try:  # the polled batches land while the step computes
                    results.append(self.pipeline.step_carrying(carried))
                except BaseException:
                    # a batch may not be recorded: read again (not on a closed pipeline)
                    with contextlib.suppress(Exception):
                        for source in self.sources:
                            source.rewind()
                    raise
                if self.sink is not None:
                    self.sink.emit()
            elif now - idle_since >= idle_seconds:
                break
        if self.pipeline.uncommitted_steps:
            self.pipeline.commit()
        return results

    def poll(self, max_records: int = 50_000, timeout: float = 0.5, *,
             carry: list[tuple[str, WrittenPush]] | None = None) -> PollResult:
        """Poll every worker's source (in parallel when there are several; each reads up to
        ``max_records``) and add up what they pushed and rejected (with ``carry``: wrote, for
        the next step to carry, ``KafkaSource.poll``)."""
        self._one_source_per_worker()
        if not self.sources:
            return PollResult()
        for source in self.sources:  # all give up moved partitions before any reads
            source.follow_layout()
        if len(self.sources) == 1:
            return self.sources[0].poll(max_records, timeout, follow_layout=False,
                                        carry=carry)
        assert self._pool is not None
        out = PollResult()
        parts: list[list[tuple[str, WrittenPush]]] = [[] for _ in self.sources]
        try:
            polled = list(self._pool.map(
                lambda i: self.sources[i].poll(max_records, timeout, follow_layout=False,
                                               carry=None if carry is None else parts[i]),
                range(len(self.sources))))
        except BaseException:
            if carry is not None:  # the batches the others wrote will not land: read again
                with contextlib.suppress(Exception):
                    for source in self.sources:
                        source.rewind()
            raise
        for r in polled:
            for name, n in r.pushed.items():
                out.pushed[name] = out.pushed.get(name, 0) + n
            for name, n in r.rejected.items():
                out.rejected[name] = out.rejected.get(name, 0) + n
            if r.oldest is not None and (out.oldest is None or r.oldest < out.oldest):
                out.oldest = r.oldest
        if carry is not None:  # in the sources' order: a step's pushes land in a fixed order
            carry.extend(push for part in parts for push in part)
        return out

    def _one_source_per_worker(self) -> None:
        """One source per worker of the pipeline's layout (a rescale changes W): sources of
        workers gone are closed, new workers' sources made; each source follows the layout's
        partition owners at its next poll."""
        if not self._inputs:
            return
        workers = self.pipeline.layout.workers
        while len(self.sources) > workers:
            self.sources.pop().close()
        while len(self.sources) < workers:
            self.sources.append(KafkaSource(self.pipeline, self._config, self._inputs,
                                            self._errors, worker=len(self.sources)))
        if workers > 1 and self._pool_size != workers:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kafka-source")
            self._pool_size = workers

    def close(self) -> None:
        for source in self.sources:
            source.close()
        self.sources = []
        if self._pool is not None:
            self._pool.shutdown()
            self._pool, self._pool_size = None, 0
        if self.sink is not None:
            self.sink.close()


def _text(record: bytes | None) -> str | None:
    """A rejected record as text for the errors table (undecodable bytes replaced)."""
    return None if record is None else record.decode("utf-8", errors="replace")
