"""One SparkSession factory for every ENS batch job.

Local mode is the default: the jobs must run on a laptop with `pip install`
and a JVM. Spark's defaults are tuned for clusters (200 shuffle partitions,
INFO logs on stderr), which makes small local jobs slow and noisy, so this
module sets local-friendly values once.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_MASTER = "local[2]"
JIT_ENV = "ENS_SPARK_JIT"
JIT_MODES = {  # the JVMs' JIT compilers (`get_spark`'s `jit`)
    "full": "",  # C1 then C2: the JVM's default; best code after minutes of warm-up
    # C1 only: a fraction of the compile CPU, somewhat slower code. On the stream's small
    # micro-batches C2 kept compiling for minutes: 1-6 of the JVM's 2-12 CPU-s per 20,000
    # events (docs/spark.md, "Where the CPU target stands")
    "c1": "-XX:TieredStopAtLevel=1",
}


def local_cores(master: str) -> int:
    """Cores a `local[N]` / `local[*]` master uses (cluster masters: 8, a guess for partitions)."""
    if master == "local":
        return 1
    if master.startswith("local-cluster["):  # local-cluster[executors,cores,memory MB]
        n, c = master[14:].split(",")[:2]
        return max(1, int(n) * int(c))
    if master.startswith("local["):
        n = master[6:].split(",")[0].rstrip("]")
        return (os.cpu_count() or 2) if n == "*" else max(1, int(n))
    return 8


def check_jit(jit: str) -> str:
    """`jit` if it names a `JIT_MODES` entry (ValueError naming the choices otherwise)."""
    if jit not in JIT_MODES:
        raise ValueError(f"jit must be one of {', '.join(JIT_MODES)}, not {jit!r}")
    return jit


def get_spark(
    master: str | None = None, app: str = "ens", memory: str = "4g", jit: str | None = None
) -> SparkSession:
    """Return the process's SparkSession, creating it on first use.

    Shuffle partitions = 2 x cores: enough to balance skewed keys, few enough
    that per-task overhead (a Python worker round trip) does not dominate.
    Python workers use this interpreter so the editable `ens` packages import.
    `jit` (`JIT_MODES`; default ``ENS_SPARK_JIT``, else full): the JVMs' JIT compilers, set
    when this process starts its JVM (a later session in the process keeps the first's).
    """
    from pyspark.sql import SparkSession

    jit_opts = JIT_MODES[check_jit(jit or os.environ.get(JIT_ENV) or "full")]
    master = master or os.environ.get("ENS_SPARK_MASTER") or DEFAULT_MASTER
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # workers import this checkout's packages first (the venv may hold another editable copy)
    root = str(Path(__file__).resolve().parents[2])
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, paths)])
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to loopback" warning
    warnings.filterwarnings("ignore", message=".*PySpark does not yet fully support pandas")
    log_conf = Path(__file__).with_name("log4j2.properties")
    java_opts = (  # -Xss16m: query.stop() of a transformWithState query overflowed the stack
        f"-Dlog4j2.configurationFile=file:{log_conf} -Dlog4j.configurationFile=file:{log_conf} "
        "-Xss16m"
    ) + (f" {jit_opts}" if jit_opts else "")
    parts = str(2 * local_cores(master))
    builder = SparkSession.builder
    if jit_opts:  # (executor JVMs of a cluster; in local mode the driver's JVM runs the tasks)
        builder = builder.config("spark.executor.extraJavaOptions", jit_opts)
    if master.startswith("local-cluster"):  # executor JVMs on this machine: same code, same venv
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"]).config(
            "spark.pyspark.python", sys.executable
        )
    spark = (
        builder.master(master)
        .appName(app)
        .config("spark.sql.shuffle.partitions", parts)
        .config("spark.default.parallelism", parts)
        .config("spark.sql.files.maxPartitionBytes", "32m")
        # tasks are CPU-bound Python: keep one per slot, never merge them into fewer
        .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
        .config("spark.driver.memory", memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", java_opts)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spread(df: DataFrame, path: str) -> DataFrame:
    """Round-robin a big input over all cores when it gave fewer partitions (one .gz file).

    Python work per row (parsing) dominates these jobs, so a one-partition
    input would leave every core but one idle; small inputs are not worth a shuffle.
    """
    p = Path(path)
    size = (
        p.stat().st_size
        if p.is_file()
        else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    )
    want = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 1)
    if size > 8 << 20 and df.rdd.getNumPartitions() < want:
        return df.repartition(want)
    return df


def ddl_fields(ddl: str) -> list[tuple[str, Any]]:
    """pyarrow fields of a flat DDL string ("a long, b string") — one schema text for both sides."""
    import pyarrow as pa

    types = {
        "long": pa.int64(),
        "int": pa.int32(),
        "double": pa.float64(),
        "string": pa.string(),
        "binary": pa.binary(),
        "boolean": pa.bool_(),
    }
    out = []
    for item in ddl.split(","):
        name, typ = item.split()
        out.append((name, types[typ]))
    return out
