"""Every lake table read by Apache Spark 4.0 with delta-spark 4.0 (issue 8: "readable by delta-rs,
pyarrow and Spark 4.0 with delta-spark 4.0; use no table feature those readers lack").

One real deployment makes a lake with real events (three tenants, claims in each, one of them
simulated, two erasures (HTTP and CLI), a signing-key rotation between them), drained by
`oml lakewriter --once` in several commits. Then one local Spark session (module-scoped: it starts once, about 10 s) reads
every table directory under the lake root that has a `_delta_log` (so tables added later are
covered without editing this file; `bronze/events` must be among them) and checks, per table:
- rows: Spark's rows equal the `deltalake` package's rows of the same table, every column
  exactly (binary as bytes, timestamps as UTC microseconds), and bronze equals the journal;
- schema: the columns Spark reports (name, type, nullability, order) are the Delta log's
  `metaData.schemaString`;
- history: `DESCRIBE HISTORY` ends at the log's last version with that commit's operation,
  operationParameters and userMetadata; the txn version Spark's snapshot holds for
  `oml-lakewriter` is the one delta-rs reads (for bronze: the frontier, the last outbox seq);
- protocol: `DESCRIBE DETAIL` reports reader 1 / writer 2 and only the features a legacy
  (1, 2) protocol implies, and the log's protocol action names no table features;
- time travel: `versionAsOf` 0 is the empty table, and a middle version equals delta-rs's read
  of that version.

Prerequisites, all installed by `make test`: pyspark and delta-spark from tests/requirements.txt,
a Java 17 or 21 runtime (scripts/install-deps.sh), and the delta-spark jars, which Spark resolves
from Maven through Ivy (`spark.jars.packages`, set by `configure_spark_with_delta_pip`) into
$OML_CACHE/ivy (default ~/.cache/oml/ivy), so only the first run downloads them (about 8 MB).
Nothing here skips: a missing piece fails the module with the reason.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import Deployment

APP = "oml-lakewriter"
BRONZE = "bronze/events"
CACHE = Path(os.environ.get("OML_CACHE") or Path.home() / ".cache" / "oml")
IVY_DIR = CACHE / "ivy"
# A (1, 2) protocol without table features: Spark lists the legacy features it implies.
LEGACY_1_2_FEATURES = {"appendOnly", "invariants"}


# --- the lake ---------------------------------------------------------------------------------
def lakewriter(d, *args):
    return d.run("lakewriter", "--once", *args, timeout=120)


@pytest.fixture(scope="module")
def lake():
    """A deployment whose lake holds real events, drained in several commits. Yields it with
    `.root` (the lake root) and `.bronze_mid_version` (a version between 0 and the last)."""
    home = Path(tempfile.mkdtemp(prefix="oml-spark-", dir="/tmp"))
    os.chmod(home, 0o755)
    d = Deployment(home)
    try:
        d.start_cluster()
        d.init()
        writers, admins = {}, {}
        for name in ("spark-a", "spark-b", "spark-c"):
            d.tenant(name)
            writers[name] = d.api_key(name, "writer", "w")
            admins[name] = d.api_key(name, "admin", "adm")
        d.serve()
        ids = []
        for i, body in enumerate(["alpha", "é unicode ✓", "", "x" * 5000]):
            r = d.submit(writers["spark-a"], body=body, path=f"notes/{i}.md", provenance="agent")
            assert r.status_code == 201, r.text
            ids.append(r.json()["artifact_id"])
        r = d.post("/v1/simulations", admins["spark-b"], json={"simulation_id": "sim-1"})
        assert r.status_code == 201, r.text
        r = d.submit(writers["spark-b"], body="simulated", workarea_id="wa-sim", simulation_id="sim-1")
        assert r.status_code == 201, r.text
        r = d.post(f"/v1/claims/{ids[1]}/erase", admins["spark-a"], json={"reason": "spark test"})
        assert r.status_code == 200, r.text
        lakewriter(d, "--max-rows", "5")  # several commits
        from deltalake import DeltaTable
        d.bronze_mid_version = DeltaTable(str(home / "lake" / BRONZE)).version()
        assert d.bronze_mid_version >= 3
        # A signing-key rotation: later events are signed under the new key.
        d.stop_server()
        assert "key.issued at provider seq" in d.run("key", "rotate").stdout
        d.serve()
        r = d.submit(writers["spark-c"], body="after the rotation", provenance="tool")
        assert r.status_code == 201, r.text
        d.stop_server()
        d.run("erase", "--tenant", "spark-a", ids[0], "--reason", "spark test")  # the CLI, new key
        lakewriter(d)
        d.root = home / "lake"
        yield d
    finally:
        d.close()
        shutil.rmtree(home, ignore_errors=True)


def tables(root: Path):
    """Every Delta table under the lake root, as its path relative to the root ("bronze/events")."""
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("_delta_log") if p.is_dir())


def log_actions(table: Path):
    """[(version, [action, ...])] of every JSON commit, in version order. Every JSON file is still
    there: the log is younger than its retention, and no checkpoint replaced any of it."""
    out = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        out.append((int(f.stem), [json.loads(x) for x in f.read_text().splitlines() if x.strip()]))
    assert [v for v, _ in out] == list(range(len(out))), f"{table}: the log is not complete from version 0"
    return out


def log_metadata(table: Path):
    meta = [a["metaData"] for _, acts in log_actions(table) for a in acts if "metaData" in a]
    assert meta, table
    return meta[-1]


def log_protocol(table: Path):
    proto = [a["protocol"] for _, acts in log_actions(table) for a in acts if "protocol" in a]
    assert proto, table
    return proto[-1]


# --- Spark ------------------------------------------------------------------------------------
def java_home():
    """A Java 17 or 21 for Spark 4.0, the first of: $JAVA_HOME, `java` on PATH, /usr/lib/jvm/*.
    Fails (never skips) naming what it found."""
    candidates = [Path(os.environ["JAVA_HOME"])] if os.environ.get("JAVA_HOME") else []
    if shutil.which("java"):
        candidates.append(Path(os.path.realpath(shutil.which("java"))).parent.parent)
    if Path("/usr/lib/jvm").is_dir():
        candidates += sorted(Path("/usr/lib/jvm").iterdir())
    seen = []
    for home in candidates:
        exe = home / "bin" / "java"
        if not exe.is_file():
            continue
        p = subprocess.run([str(exe), "-version"], capture_output=True, text=True)
        first = (p.stderr.splitlines() or [""])[0]
        seen.append(f"{home}: {first}")
        if re.search(r'"(17|21)[."]', first):
            return str(home)
    pytest.fail("Spark 4.0 needs Java 17 or 21 (scripts/install-deps.sh installs openjdk-17-jre-headless); "
                f"found: {seen or 'no java'}")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One local Spark session with Delta for the whole module: local[1], 512 MB, no UI, bound to
    loopback, UTC session time zone, in-memory catalog, the delta-spark jars from the Ivy cache.
    Tuned for tiny tables on 2 cores (measured: the module's Spark part 3x faster): one partition
    for Delta's log replay (default 50) and for shuffles, and a JVM that compiles with C1 only."""
    saved_java_home = os.environ.get("JAVA_HOME")
    os.environ["JAVA_HOME"] = java_home()  # read once, when pyspark launches the JVM below
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession
    work = tmp_path_factory.mktemp("spark")
    builder = (SparkSession.builder.master("local[1]").appName("oml-test-lake-spark")
               .config("spark.driver.memory", "512m")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.default.parallelism", "1")
               .config("spark.databricks.delta.snapshotPartitions", "1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.catalogImplementation", "in-memory")
               .config("spark.sql.warehouse.dir", str(work / "warehouse"))
               .config("spark.local.dir", str(work / "local"))
               .config("spark.jars.ivy", str(IVY_DIR))
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    try:
        session = configure_spark_with_delta_pip(builder).getOrCreate()
    finally:
        if saved_java_home is None:
            del os.environ["JAVA_HOME"]
        else:
            os.environ["JAVA_HOME"] = saved_java_home
    session.sparkContext.setLogLevel("ERROR")
    try:
        assert session.version.startswith("4.0."), session.version
        assert session.conf.get("spark.jars.packages").startswith("io.delta:delta-spark_2.13:4.0."), \
            session.conf.get("spark.jars.packages")
        yield session
    finally:
        session.stop()


def spark_rows(spark, path: Path, version=None):
    """The table's rows as Spark reads them, one tuple per row in column order: timestamps as UTC
    microseconds (unix_micros), binary as bytes. Returns (columns, rows)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(str(path))
    cols = []
    for f in df.schema.fields:
        c = F.col(f"`{f.name}`")
        if isinstance(f.dataType, T.TimestampType):
            c = F.unix_micros(c)
        elif isinstance(f.dataType, T.TimestampNTZType):
            c = F.unix_micros(c.cast("timestamp"))  # the session time zone is UTC
        elif not isinstance(f.dataType, (T.StringType, T.LongType, T.IntegerType, T.ShortType, T.ByteType,
                                         T.BooleanType, T.DoubleType, T.FloatType, T.BinaryType, T.DateType,
                                         T.DecimalType)):
            pytest.fail(f"{path}: column {f.name} has type {f.dataType}, which this comparison does not cover yet")
        cols.append(c.alias(f.name))
    rows = [tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r) for r in df.select(cols).collect()]
    return [f.name for f in df.schema.fields], rows


def deltalake_rows(path: Path, version=None):
    """The same table as the `deltalake` package (delta-rs) reads it, in the same form."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    t = DeltaTable(str(path), version=version).to_pyarrow_table()
    columns = []
    for name, col in zip(t.column_names, t.columns):
        if pa.types.is_timestamp(col.type):
            col = pc.cast(pc.cast(col, pa.timestamp("us", tz=col.type.tz)), pa.int64())
        columns.append(col.to_pylist())
    return t.column_names, list(zip(*columns)) if columns else []


def canonical(rows):
    return sorted(rows, key=repr)


def micros(rfc3339: str) -> int:
    """UTC microseconds since the epoch of an envelope time such as 2026-11-30T02:34:00.123456Z."""
    from datetime import datetime, timedelta, timezone
    t = datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return (t - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


# --- tests ------------------------------------------------------------------------------------
def test_spark_reads_every_table_row_for_row_as_deltalake_does(lake, spark):
    found = tables(lake.root)
    assert BRONZE in found, found
    for name in found:
        path = lake.root / name
        s_cols, s_rows = spark_rows(spark, path)
        d_cols, d_rows = deltalake_rows(path)
        assert s_cols == d_cols, name
        assert len(s_rows) == len(d_rows), name
        assert canonical(s_rows) == canonical(d_rows), name
        assert spark.read.format("delta").load(str(path)).count() == len(d_rows), name
    assert len(deltalake_rows(lake.root / BRONZE)[1]) > 0


def test_bronze_in_spark_holds_every_journal_event_once_as_signed(lake, spark):
    cols, rows = spark_rows(spark, lake.root / BRONZE)
    got = [dict(zip(cols, r)) for r in rows]
    with lake.su() as c:
        journal = {(str(t), s): (bytes(sb), bytes(sig), et, kid, bytes(ph).hex(), bytes(eh).hex())
                   for t, s, sb, sig, et, kid, ph, eh in c.execute(
                       "SELECT tenant_id, seq, signed_bytes, signature, event_type, key_id, prev_hash, event_hash "
                       "FROM oml.journal").fetchall()}
        outbox = [r[0] for r in c.execute(
            "SELECT seq FROM oml.outbox WHERE target_table = 'bronze/events' ORDER BY seq").fetchall()]
    keys = [(r["tenant_id"], r["seq"]) for r in got]
    assert len(keys) == len(set(keys)), "an event is in bronze twice"
    assert set(keys) == set(journal)
    for r in got:
        want = journal[(r["tenant_id"], r["seq"])]
        assert (r["signed_bytes"], r["signature"], r["event_type"], r["key_id"], r["prev_hash"],
                r["event_hash"]) == want, r
        envelope = json.loads(r["signed_bytes"])
        assert r["occurred_at"] == micros(envelope["time"]), (r["occurred_at"], envelope["time"])
    assert sorted(r["outbox_seq"] for r in got) == outbox
    types = {r["event_type"] for r in got}
    assert {"claim.submitted", "artifact.erased", "key.issued", "tenant.created"} <= types, types
    assert len({r["key_id"] for r in got}) == 2  # events under the old and the rotated signing key
    assert any(r["simulation_id"] == "sim-1" for r in got)


def test_spark_reports_the_schema_of_the_delta_log(lake, spark):
    for name in tables(lake.root):
        path = lake.root / name
        want = json.loads(log_metadata(path)["schemaString"])
        got = spark.read.format("delta").load(str(path)).schema.jsonValue()
        assert [(f["name"], f["type"], f["nullable"]) for f in got["fields"]] == \
            [(f["name"], f["type"], f["nullable"]) for f in want["fields"]], name
        assert not [f for f in got["fields"] if not isinstance(f["type"], str)], name  # no nested types
    bronze = spark.read.format("delta").load(str(lake.root / BRONZE)).schema
    assert (bronze["signed_bytes"].dataType.typeName(), bronze["signed_bytes"].nullable) == ("binary", False)
    assert (bronze["occurred_at"].dataType.typeName(), bronze["occurred_at"].nullable) == ("timestamp", False)
    assert (bronze["principal"].dataType.typeName(), bronze["principal"].nullable) == ("string", True)


def test_spark_sees_the_history_the_txn_version_and_a_legacy_protocol(lake, spark):
    from deltalake import DeltaTable
    with lake.su() as c:
        frontier = c.execute("SELECT frontier_seq FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]
        last_outbox = c.execute("SELECT max(seq) FROM oml.outbox").fetchone()[0]
    assert frontier == last_outbox
    jvm = spark._jvm
    for name in tables(lake.root):
        path = lake.root / name
        log = log_actions(path)
        last_version, last_actions = log[-1]
        info = next(a["commitInfo"] for a in last_actions if "commitInfo" in a)

        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
        assert [h["version"] for h in history] == [v for v, _ in log], name
        last = history[-1].asDict()
        assert last["operation"] == info["operation"], (name, last, info)
        params = {k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
                  for k, v in (info.get("operationParameters") or {}).items()}
        assert dict(last["operationParameters"] or {}) == params, (name, last["operationParameters"], params)
        assert last["userMetadata"] == info.get("userMetadata"), name

        # The txn action, as Spark's snapshot of the table holds it.
        snapshot = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path)).update(
            False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
        assert snapshot.version() == last_version, name
        txn = snapshot.transactions().get(APP)
        spark_txn = txn.get() if txn.isDefined() else None
        assert spark_txn == DeltaTable(str(path)).transaction_version(APP), name
        if name == BRONZE:
            assert spark_txn == frontier
            assert (info["oml.batch_end"], info["oml.stream"]) == (frontier, "default")

        detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0].asDict()
        assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (1, 2), (name, detail)
        assert set(detail["tableFeatures"] or []) <= LEGACY_1_2_FEATURES, (name, detail["tableFeatures"])
        assert list(detail["partitionColumns"]) == log_metadata(path)["partitionColumns"], name
        proto = log_protocol(path)
        assert (proto["minReaderVersion"], proto["minWriterVersion"]) == (1, 2), (name, proto)
        assert not proto.get("readerFeatures") and not proto.get("writerFeatures"), (name, proto)


def test_time_travel_version_0_is_empty_and_a_middle_version_matches_deltalake(lake, spark):
    for name in tables(lake.root):
        path = lake.root / name
        _, rows0 = spark_rows(spark, path, version=0)
        assert rows0 == [], name  # every lake table is created empty (oml init)
    path = lake.root / BRONZE
    mid = lake.bronze_mid_version
    assert 0 < mid < log_actions(path)[-1][0]
    _, s_rows = spark_rows(spark, path, version=mid)
    _, d_rows = deltalake_rows(path, version=mid)
    assert 0 < len(s_rows) < len(spark_rows(spark, path)[1])
    assert canonical(s_rows) == canonical(d_rows)
