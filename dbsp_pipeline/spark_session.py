"""The SparkSession the engine uses when the caller does not bring one.

A JVM session takes 6-20 s to start, so there is one per process: ``local_session()`` returns the
active session if there is one. The settings the engine relies on are applied to any session it is
given (``configure``): Parquet timestamps as TIMESTAMP_MICROS (what Delta readers expect), no
``_SUCCESS`` markers or ``.crc`` side files in table folders, UTC session time zone, Parquet
pages written with their CRC-32 and checked when read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

from pyspark.errors import PythonException
from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from dbsp_pipeline.errors import ComputationError
from dbsp_pipeline.worker_memory import keep_freed_memory

#: Settings every session used by the engine must have (safe to set on a running session).
RUNTIME_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    # every Parquet page Spark writes carries its CRC-32, and Spark's reads check the pages
    # that carry one, as the engine's pyarrow reads do (``storage/data_files.py``): bytes
    # changed on disk fail a read instead of being read as other values
    "parquet.page.write-checksum.enabled": "true",
    "parquet.page.verify-checksum.enabled": "true",
}


#: The JVM talks to its Python workers, and the driver's Python to the JVM for a job's results,
#: over Unix domain sockets instead of TCP on loopback (SPARK-51688, Spark 4.1+; a
#: launch-time setting, so it takes only in a session created here): an empty job of two
#: Python tasks took 0.086-0.099 s over TCP and 0.050-0.054 s this way, measured here (the
#: difference is about a 40 ms delayed-ACK stall per job), and a step forced onto Spark runs
#: two such jobs or more.
PYTHON_UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"


def local_session(app_name: str = "dbsp-pipeline", cores: int | str = "*",
                  shuffle_partitions: int = 4, ui: bool = False) -> SparkSession:
    """The process's local-mode session, created with the engine's defaults if none is active."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return configure(active)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _python_workers_run_this_interpreter()
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.driver.memory", os.environ.get("DBSP_DRIVER_MEMORY", "4g"))
        .config("spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .config("spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
        .config("spark.hadoop.fs.file.impl.disable.cache", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(PYTHON_UNIX_SOCKETS, "true")
        # no "[Stage 3:>  (0 + 1) / 1]" bars in the user's terminal at every Spark step: a
        # step's result says where its time went (``StepResult.phase_seconds``)
        .config("spark.ui.showConsoleProgress", "false")
    )
    for k, v in RUNTIME_CONF.items():
        if k.startswith("spark."):  # (the launcher ignores others, with a warning)
            builder = builder.config(k, v)
    spark = configure(builder.getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def cluster_session(master: str, app_name: str = "dbsp-pipeline",
                    shuffle_partitions: int = 4) -> SparkSession:
    """The process's session as a driver of the Spark standalone cluster at ``master``
    (``spark://host:port``), bound to 127.0.0.1. Executors lost with a worker are replaced on
    the workers left, and their tasks retried (``spark.task.maxFailures``)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _python_workers_run_this_interpreter()
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.driver.memory", os.environ.get("DBSP_DRIVER_MEMORY", "2g"))
        .config("spark.executor.memory", os.environ.get("DBSP_EXECUTOR_MEMORY", "1g"))
        .config("spark.task.maxFailures", "8")
        .config("spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .config("spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
        .config("spark.hadoop.fs.file.impl.disable.cache", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(PYTHON_UNIX_SOCKETS, "true")
        # no "[Stage 3:>  (0 + 1) / 1]" bars in the user's terminal at every Spark step: a
        # step's result says where its time went (``StepResult.phase_seconds``)
        .config("spark.ui.showConsoleProgress", "false")
    )
    for k, v in RUNTIME_CONF.items():
        if k.startswith("spark."):  # (the launcher ignores others, with a warning)
            builder = builder.config(k, v)
    spark = configure(builder.getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def connect_session(url: str, token: str | None = None) -> SparkSession:
    """The process's client of the Spark Connect server at ``url`` (``sc://host:port``),
    configured for the engine.

    ``token``: the server's pre-shared authentication token (``spark.connect.authenticate.token``;
    ``infra/spark_connect.sh`` makes one per start), sent as a bearer token with every call. A
    server that has a token refuses a client without it, or with another, as UNAUTHENTICATED.
    The token goes to the gRPC channel, never into the URL (which shows in logs and the UI).
    PySpark sends a token over plain TCP only to a host spelled ``localhost`` (gRPC local
    credentials: the peer must be on this machine) and otherwise over TLS; so a loopback address
    in ``url`` is spelled ``localhost`` here, and a remote server needs TLS (``;use_ssl=true``).
    """
    if token:
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        # What ``SparkSession.builder.remote()`` does first: from now on this process speaks
        # Spark Connect (``StructType.fromDDL`` and the functions then use the remote session).
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        channel = DefaultChannelBuilder(_LOOPBACK_HOST.sub("sc://localhost", url))
        channel.set(DefaultChannelBuilder.PARAM_TOKEN, token)
        session = ConnectSession.builder.channelBuilder(channel).getOrCreate()
    else:
        session = SparkSession.builder.remote(url).getOrCreate()  # type: ignore[assignment]
    try:
        return configure(session)  # type: ignore[arg-type]  # the Connect flavour of SparkSession
    except Exception:
        session.stop()  # a refused client must not stay the process's session
        raise


#: ``sc://`` followed by a loopback address (see ``connect_session``)
_LOOPBACK_HOST = re.compile(r"\Asc://(?:127\.0\.0\.1|\[::1\])(?=[:/]|\Z)")


def _python_workers_run_this_interpreter() -> None:
    """Python tasks (exact sums fold in ``mapInArrow``) run this interpreter, which has the
    engine and its pinned packages installed (PySpark reads the variable when the context
    starts; a cluster's workers run on hosts with the same installation)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def configure(spark: SparkSession) -> SparkSession:
    """Apply the engine's runtime settings to ``spark`` and return it."""
    for k, v in RUNTIME_CONF.items():
        spark.conf.set(k, v)
    return spark


def conf_value(spark: SparkSession, key: str, default: str) -> str:
    """The value of Spark setting ``key`` (``default`` when unset), read in a way both a classic
    session and a Spark Connect client can (a Connect client has no ``sparkContext``)."""
    try:
        value = spark.conf.get(key, default)
    except Exception:  # a setting the server will not show to a client
        return default
    return default if value is None else str(value)


def task_slots(spark: SparkSession) -> int:
    """How many tasks run at once in local mode: the ``N`` of ``local[N]`` (``*``: this
    machine's cores); 1 when the master does not say."""
    master = conf_value(spark, "spark.master", "")
    m = re.match(r"local\[(\d+|\*)", master)
    if m is None:
        return 1
    return (os.cpu_count() or 1) if m[1] == "*" else int(m[1])


def run_tasks(spark: SparkSession, count: int, task: Callable[[int], str]) -> list[str]:
    """Run ``task(i)`` for ``i`` in ``0..count-1``, one Spark task each, side by side as the
    task slots allow; their results in index order. One plain RDD job: about half the fixed
    cost of a DataFrame ``mapInArrow`` job over ``range`` (no query planning, no Arrow batches),
    for the engine's stages whose tasks find their input themselves (owner and scatter
    stages); through Spark Connect, which has no RDDs, that ``mapInArrow`` job. A task that
    fails fails the job (Spark retries it as it retries any task). Each task first has its
    Python worker keep the memory it frees (``worker_memory.keep_freed_memory``)."""
    if count == 0:
        return []
    task = partial(_in_worker, task)
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        with _task_errors():
            results: list[str] = spark.sparkContext.parallelize(range(count), count).map(
                task).collect()
        return results
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    arrow = pa.schema([("index", pa.int64()), ("result", pa.string())])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pylist(
                    [{"index": int(index), "result": task(int(index))}], schema=arrow)

    rows = spark.range(0, count, 1, count).mapInArrow(run, StructType(
        [StructField("index", LongType()), StructField("result", StringType())])).collect()
    return [str(r["result"]) for r in sorted(rows, key=lambda r: int(r["index"]))]


def gang_slots(spark: SparkSession) -> int:
    """How many tasks ``run_gang_tasks`` can start together on ``spark``: the local mode's task
    slots (``task_slots`` over ``spark.task.cpus``: a barrier job asking for more slots than
    there are waits minutes before it fails); 0 through Spark Connect (no RDDs) and on a
    cluster, where the executors a barrier job needs may be lost mid-step (Spark then waits
    for slots for minutes, ``spark.scheduler.barrier.maxConcurrentTasksCheck.*``, instead of
    failing the task)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return 0
    if not conf_value(spark, "spark.master", "").startswith("local"):
        return 0
    try:
        cpus = max(1, int(conf_value(spark, "spark.task.cpus", "1")))
    except ValueError:
        return 0
    return task_slots(spark) // cpus


def run_gang_tasks(spark: SparkSession, count: int, task: Callable[[int], str]) -> list[str]:
    """Run ``task(i)`` for ``i`` in ``0..count-1`` as one job whose tasks all start together
    (Spark's barrier mode; at most ``gang_slots`` tasks), so a task may wait for what the
    others write; their results in index order. No ``barrier()`` call is made (each costs
    about a second here): the tasks meet through files (``runtime/rendezvous.py``). A task that
    fails fails the job: Spark kills the other tasks and does not run a failed barrier result
    stage again ("Could not recover from a failed barrier ResultStage"), so the tasks of one
    call meet once."""
    if count == 0:
        return []
    if count > gang_slots(spark):
        raise ValueError(f"{count} gang tasks need {count} task slots at once: "
                         f"{gang_slots(spark)} here")
    task = partial(_in_worker, task)
    with _task_errors():
        results: list[str] = spark.sparkContext.parallelize(range(count), count).barrier() \
            .mapPartitions(partial(_each, task)).collect()
    return results


#: a traceback's line naming the exception raised (``OverflowError: ...``,
#: ``_duckdb.ConversionException: ...``), which a message's own lines may follow
_RAISED = re.compile(r"^[A-Za-z_][\w.]*: ")


@contextlib.contextmanager
def _task_errors() -> Iterator[None]:
    """A task's Python error as a ``ComputationError`` saying what it was (the last line of
    its traceback: an operator's own message names the operator), not Spark's kilobytes of
    the worker's and the JVM's frames."""
    try:
        yield
    except PythonException as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        cause = next((line for line in reversed(lines) if _RAISED.match(line)),
                     next((line for line in reversed(lines) if not line[0].isspace()), str(e)))
        raise ComputationError(f"a Spark task of the step failed: {cause}") from e


def _each(task: Callable[[int], str], indexes: Iterator[int]) -> Iterator[str]:
    for index in indexes:
        yield task(index)


def _in_worker(task: Callable[[int], str], index: int) -> str:
    """``task(index)`` in a Python worker whose allocator keeps freed memory for reuse."""
    keep_freed_memory()
    return task(index)


class LazySession:
    """Stands for the process's local session (``local_session(**options)``), started on first
    use: a pipeline whose steps all run on the driver never pays the JVM's start."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._session: SparkSession | None = None

    def get(self) -> SparkSession:
        if self._session is None:
            self._session = local_session(**self._options)
        return self._session

    @property
    def started(self) -> bool:
        return self._session is not None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


def as_session(spark: SparkSession | LazySession) -> SparkSession:
    """``spark`` as the engine's handles take it: a ``LazySession`` forwards every attribute to
    the session it starts on first use, so it stands for that session (and starts nothing until
    a handle actually asks Spark for something)."""
    return cast(SparkSession, spark)


#: the loggers PySpark logs an analysis error to, with its Java stack trace, when the error is
#: raised (``PySparkException._log_exception``, in the raising thread), whoever catches it
_QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
#: per thread: whether its query errors' logs are dropped (``quiet_query_context_logs``)
_QUIET = threading.local()
_FILTER_LOCK = threading.Lock()
_filter_added = False


class _NotWhileQuiet(logging.Filter):
    """Drops the records a thread logs inside ``quiet_query_context_logs``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_QUIET, "on", False)


@contextlib.contextmanager
def quiet_query_context_logs() -> Iterator[None]:
    """PySpark's logs of query errors dropped in this thread inside the block: where an error
    is raised again with its context (a circuit's analysis, ``CircuitError``; a step's
    computation, ``StepFailedError``: the operator, its views, the expression), the same error
    logged before it (tens of KB of JSON and Java frames on stderr) only buries it. Other
    threads' logs, and this thread's outside, go on as before (a filter on the two loggers,
    added once, reads a per-thread flag)."""
    global _filter_added
    with _FILTER_LOCK:
        if not _filter_added:
            # (made as PySpark makes them: a plain logger made first would be the one PySpark
            # takes, and it refuses the fields PySpark logs with)
            for name in _QUERY_CONTEXT_LOGGERS:
                PySparkLogger.getLogger(name).addFilter(_NotWhileQuiet())
            _filter_added = True
    before = getattr(_QUIET, "on", False)
    _QUIET.on = True
    try:
        yield
    finally:
        _QUIET.on = before
