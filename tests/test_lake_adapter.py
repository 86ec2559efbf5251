"""The lake writer's storage adapter (rust/oml-storage), read back by readers that did not write it.

The table is written by the C++ test DeltaAdapterTest.WritesTableForPythonReaders
(src/lake/delta_tables_test.cc) into $OML_LAKE_TEST_OUT/claims:
  version 1  append a/1, b/1             txn (oml-lakewriter, 5), bounds 0..5
  version 2  merge: a/1 demoted, c/1 new  txn (oml-lakewriter, 9), bounds 5..9
"""
import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import OML_BIN

LAKE_TEST = Path(OML_BIN).resolve().parent / "src" / "lake" / "lake_test"
APP = "oml-lakewriter"
WANT = [  # (artifact_id, version, state, path, seq), sorted by key
    ("a", 1, "demoted", "/a", 8),
    ("b", 1, "promoted", "/b", 5),
    ("c", 1, "promoted", "/c", 9),
]


@pytest.fixture(scope="module")
def claims(tmp_path_factory):
    assert LAKE_TEST.is_file(), f"build the C++ tests first: {LAKE_TEST} is missing"
    out = tmp_path_factory.mktemp("lake-adapter")
    p = subprocess.run([str(LAKE_TEST), "--gtest_filter=DeltaAdapterTest.WritesTableForPythonReaders"],
                       env={**os.environ, "OML_LAKE_TEST_OUT": str(out)},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[  PASSED  ] 1 test." in p.stdout, p.stdout
    return out / "claims"


def log_actions(table: Path, version: int):
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def rows_of(pylist):
    return sorted((r["artifact_id"], r["version"], r["state"], r["path"], r["seq"]) for r in pylist)


def test_deltalake_reads_the_rows_and_the_txn(claims):
    from deltalake import DeltaTable
    t = DeltaTable(str(claims))
    assert t.version() == 2
    pylist = t.to_pyarrow_table().to_pylist()
    assert rows_of(pylist) == WANT
    a = next(r for r in pylist if r["artifact_id"] == "a")
    assert a["digest"] == bytes.fromhex("00ff10")  # base64 in the JSON rows, bytes in the table
    assert a["at"] == datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)
    assert t.transaction_version(APP) == 9
    assert t.transaction_version("another-app") is None
    # Readable by every reader we promise (delta-rs, pyarrow, Spark 4.0): no table features.
    proto = t.protocol()
    assert (proto.min_reader_version, proto.min_writer_version) == (1, 2)
    assert not proto.reader_features and not proto.writer_features


def test_each_commit_carries_its_txn_and_bounds(claims):
    for version, start, end, operation in [(1, 0, 5, "WRITE"), (2, 5, 9, "MERGE")]:
        actions = log_actions(claims, version)
        assert [a["txn"] for a in actions if "txn" in a] == [{"appId": APP, "version": end}]
        infos = [a["commitInfo"] for a in actions if "commitInfo" in a]
        assert len(infos) == 1
        info = infos[0]
        assert info["operation"] == operation
        assert (info["oml.batch_start"], info["oml.batch_end"], info["oml.stream"]) == (start, end, "main")
        assert any("add" in a for a in actions), actions
    meta = next(a["metaData"] for a in log_actions(claims, 0) if "metaData" in a)
    assert "delta.setTransactionRetentionDuration" not in meta.get("configuration", {})
    # A checkpoint every 10 commits (commit cost grows with the log since the last checkpoint).
    assert meta["configuration"]["delta.checkpointInterval"] == "10"


def test_pyarrow_reads_the_parquet_files_named_in_the_log(claims):
    import pyarrow as pa
    import pyarrow.parquet as pq
    live = {}
    for version in range(0, 3):
        for a in log_actions(claims, version):
            if "add" in a:
                live[a["add"]["path"]] = a["add"]
            elif "remove" in a:
                live.pop(a["remove"]["path"], None)
    assert live
    tables = []
    for path, add in live.items():
        f = claims / unquote(path)
        assert f.is_file(), path
        tbl = pq.read_table(f)
        assert tbl.num_rows == json.loads(add["stats"])["numRecords"]  # file statistics are on
        tables.append(tbl)
    assert rows_of(pa.concat_tables(tables).to_pylist()) == WANT
