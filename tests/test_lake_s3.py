"""The lake over the S3 protocol (issue 8, Tests "S3"): moto's server mode (tests/requirements.txt
pins the version), real HTTP on loopback, lake_root = s3://oml-lake/lake.

A Delta commit on S3 is fenced twice. delta-rs first reads the latest log version and, with
max_retries = 0 (the adapter's setting), fails if it moved past the writer's snapshot; then it
writes `_delta_log/<N>.json` as a PUT with `If-None-Match: *` (object_store, `aws_conditional_put
= etag`, pinned by rust/oml-storage), which closes the window between that read and the PUT. The
first test asserts that this moto refuses a second such PUT of the same key with 412, so the
second fence is real on the pinned version. The plain two-writers test (a writer stopped before
its commit) is caught by the first fence. The race inside the window is driven through the
binary with a proxy (StaleLogProxy) that hides the winner's commits from the loser's version
read: the loser's conditional PUT is refused; with If-None-Match stripped (the negative control)
it overwrites the winner's commit.

Everything is read back by readers that did not write it: the `deltalake` package with
storage_options pointing at moto, and the Delta log's JSON objects fetched with boto3.
"""
import json
import os
import signal
import subprocess
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import OML_BIN, Deployment, start_moto
from test_lakewriter import (APP, INFO, add_events, lakewriter, log_lines, proc_state, two_writers_race, wait_for,
                             writer_commit)

BUCKET = "oml-lake"
PREFIX = "lake"
LOG_PREFIX = f"{PREFIX}/bronze/events/_delta_log/"
TABLE_URI = f"s3://{BUCKET}/{PREFIX}/bronze/events"


def s3_client(url):
    import boto3
    return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def moto():
    p, url = start_moto()
    try:
        yield url, s3_client(url)
    finally:
        p.terminate()
        p.wait()


@pytest.fixture
def s3_lake(moto):
    """A fresh deployment whose lake_root is s3://oml-lake/lake on moto; `oml init` ran with it."""
    url, client = moto
    client.create_bucket(Bucket=BUCKET)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true", "OML_LAKE_ROOT": f"s3://{BUCKET}/{PREFIX}"}
    home = Path(tempfile.mkdtemp(prefix="oml-t-", dir="/tmp"))
    os.chmod(home, 0o755)
    d = Deployment(home, extra_env=env)
    d.s3 = client
    d.storage_options = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
                         "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                         "AWS_ALLOW_HTTP": "true"}
    try:
        d.start_cluster()
        init = d.init()
        assert f"lake: s3://{BUCKET}/{PREFIX} (bronze/events, silver/claims, gold/daily_activity)" in init.stdout, \
            init.stdout
        yield d
    finally:
        d.close()
        shutil.rmtree(home, ignore_errors=True)


# --- readers ----------------------------------------------------------------------------------
def log_keys(d):
    keys = []
    for page in d.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=LOG_PREFIX):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return sorted(keys)


def commits(d):
    """[(version, txn_version, batch_start, batch_end, stream)] of every commit after creation,
    from the JSON log objects on S3."""
    out = []
    for key in log_keys(d):
        name = key[len(LOG_PREFIX):]
        if not name.endswith(".json") or "/" in name:
            continue
        version = int(name[:-len(".json")])
        if version == 0:
            continue
        c = writer_commit(version, d.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode())
        if c is not None:
            out.append(c)
    return out


def delta_table(d):
    from deltalake import DeltaTable
    return DeltaTable(TABLE_URI, storage_options=d.storage_options)


def assert_exactly_once(d):
    """Every journal event is in the S3 bronze table once, as signed; the batches are contiguous
    from 0, each commit's txn version is its batch_end, and frontier == txn version == last seq."""
    rows = delta_table(d).to_pyarrow_table().to_pylist()
    with d.su() as c:
        journal = {(str(t), s): (bytes(sb), bytes(sig), et) for t, s, sb, sig, et in c.execute(
            "SELECT tenant_id, seq, signed_bytes, signature, event_type FROM oml.journal").fetchall()}
        outbox = [r[0] for r in c.execute(
            "SELECT seq FROM oml.outbox WHERE target_table = 'bronze/events' ORDER BY seq").fetchall()]
        last = c.execute("SELECT coalesce(max(seq), 0) FROM oml.outbox").fetchone()[0]
        frontier = c.execute("SELECT frontier_seq FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]
    keys = [(r["tenant_id"], r["seq"]) for r in rows]
    assert len(keys) == len(set(keys)), "a journal event is in bronze twice"
    assert set(keys) == set(journal)
    for r in rows:
        assert (r["signed_bytes"], r["signature"], r["event_type"]) == journal[(r["tenant_id"], r["seq"])]
    assert sorted(r["outbox_seq"] for r in rows) == outbox
    cs = commits(d)
    assert cs
    prev = 0
    for version, txn, start, end, stream in cs:
        assert (start, txn, stream) == (prev, end, "default"), cs
        assert start < end
        prev = end
    assert prev == last
    assert frontier == last
    assert delta_table(d).transaction_version(APP) == last
    return cs


# --- tests ------------------------------------------------------------------------------------
def test_moto_answers_412_to_a_second_if_none_match_put(moto):
    """The fence is real: a second PutObject with If-None-Match: * of an existing key is refused
    with 412 and the first object stays; without the header the PUT overwrites (so the 412 is
    the condition's doing)."""
    _, client = moto
    client.create_bucket(Bucket="fence-check")
    key = "t/_delta_log/00000000000000000001.json"
    first = client.put_object(Bucket="fence-check", Key=key, Body=b"first", IfNoneMatch="*")
    assert first["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(client.exceptions.ClientError) as e:
        client.put_object(Bucket="fence-check", Key=key, Body=b"second", IfNoneMatch="*")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket="fence-check", Key=key)["Body"].read() == b"first"
    plain = client.put_object(Bucket="fence-check", Key=key, Body=b"third")
    assert plain["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert client.get_object(Bucket="fence-check", Key=key)["Body"].read() == b"third"


def test_init_serve_and_lakewriter_drain_into_an_s3_table_exactly_once(s3_lake):
    d = s3_lake
    # `oml init` created bronze/events on S3 (version 0 only), nothing under the local lake.
    assert log_keys(d) == [LOG_PREFIX + "00000000000000000000.json"]
    assert not (d.home / "lake" / "bronze").exists()
    assert delta_table(d).version() == 0
    assert delta_table(d).transaction_version(APP) is None

    # Writes through the CLI and through `oml serve`.
    tenant = d.tenant("acme")
    tok = d.api_key("acme", "writer", "alice")
    add_events(d, "s3", tenants=2)
    d.serve()
    receipts = []
    for i in range(3):
        r = d.submit(tok, body=f"claim {i}", path=f"notes/{i}.md")
        assert r.status_code == 201, r.text
        receipts.append(r.json()["receipt"])
    d.stop_server()

    p = lakewriter(d, "--max-rows", "4")
    assert f'"lake_root":"s3://{BUCKET}/{PREFIX}"' in p.stderr.replace(" ", ""), p.stderr
    applied = [l for l in log_lines(p.stderr) if l["msg"] == "lake writer: batch applied"]
    cs = assert_exactly_once(d)
    assert [(c[2], c[3]) for c in cs] == [(l["batch_start"], l["batch_end"]) for l in applied]
    assert len(cs) >= 3 and all(end - start <= 4 for _, _, start, end, _ in cs)
    rows = {(r["tenant_id"], r["seq"]): r for r in delta_table(d).to_pyarrow_table().to_pylist()}
    for rc in receipts:
        assert (tenant, rc["seq"]) in rows

    # pyarrow over the Parquet objects the log names, read from moto: the same rows.
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow.fs import S3FileSystem
    fs = S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1",
                      endpoint_override=d.storage_options["AWS_ENDPOINT_URL"], scheme="http")
    live = {}
    for key in log_keys(d):
        if not key.endswith(".json"):
            continue
        for a in (json.loads(x) for x in d.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode().splitlines() if x.strip()):
            if "add" in a:
                live[a["add"]["path"]] = a["add"]
            elif "remove" in a:
                live.pop(a["remove"]["path"], None)
    tables = []
    for path, add in live.items():
        t = pq.read_table(f"{BUCKET}/{PREFIX}/bronze/events/{unquote(path)}", filesystem=fs)
        assert t.num_rows == json.loads(add["stats"])["numRecords"]
        tables.append(t)
    assert sorted(pa.concat_tables(tables).column("outbox_seq").to_pylist()) == sorted(r[1]["outbox_seq"] for r in rows.items())

    # `oml verify --from-lake` reads the chains from the S3 table.
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    assert f"lake: {TABLE_URI} version {cs[-1][0]}, {len(rows)} rows" in v.stdout, v.stdout

    # Nothing new: no commit. New events: drained from the frontier on, one more commit.
    lakewriter(d)
    assert commits(d) == cs
    add_events(d, "s3-more", tenants=1)
    lakewriter(d)
    assert len(assert_exactly_once(d)) == len(cs) + 1


def test_two_writers_at_once_on_s3_the_delta_conflict_fences_the_second(s3_lake, tmp_path):
    """As tests/test_lakewriter.py's two-writers test, on S3: A stops right before its commit,
    B drains everything, A resumes; A's commit finds the log past its snapshot (delta-rs reads
    the latest version before its conditional PUT), so A fails with lake-commit-conflict,
    commits nothing, and no row doubles."""
    two_writers_race(s3_lake, tmp_path, commits_of=commits, exactly_once=assert_exactly_once)


class StaleLogProxy:
    """A loopback HTTP proxy in front of moto for one writer. While `hide` is set it drops the
    log's commit JSON objects past version 0 from LIST answers and answers 404 to GETs of them,
    so the writer's pre-commit version read sees the table as it was at its snapshot: exactly
    the state of two writers that both passed that read. The first PUT of a log object turns
    hiding off (the writer's recovery then sees the real log). `strip` drops If-None-Match from
    every request: a store without conditional put (the negative control)."""

    def __init__(self, upstream, strip=False):
        import http.server
        import re
        import threading
        import requests
        self.hide = False
        self.strip = strip
        self.log_puts = []
        proxy = self
        commit = re.compile(r"_delta_log/0*([1-9][0-9]*)\.json")

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _go(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                path = self.path.split("?")[0]
                if "_delta_log/" in path and self.command == "PUT":
                    # (path, If-None-Match as forwarded to moto)
                    proxy.log_puts.append((path, None if proxy.strip else self.headers.get("If-None-Match")))
                    proxy.hide = False
                if proxy.hide and self.command in ("GET", "HEAD") and commit.search(path):
                    return self._send(404, {}, b"")
                drop = {"host"} | ({"if-none-match"} if proxy.strip else set())
                h = {k: v for k, v in self.headers.items() if k.lower() not in drop}
                r = requests.request(self.command, upstream + self.path, headers=h, data=body,
                                     allow_redirects=False, timeout=30)
                content = r.content
                if proxy.hide and self.command == "GET" and "list-type=2" in self.path:
                    content = re.sub(rb"<Contents>(?:(?!</Contents>).)*?_delta_log/0*[1-9][0-9]*\.json<.*?</Contents>",
                                     b"", content, flags=re.S)
                self._send(r.status_code, r.headers, content)

            def _send(self, status, headers, content):
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(content)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _go

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def race_in_the_window(d, tmp_path, strip):
    """A (through the proxy) stops before its commit; B drains; the proxy hides B's commits from
    A; A resumes, passes delta-rs's version read and PUTs version 1 over B's."""
    add_events(d, "window")
    proxy = StaleLogProxy(d.env["AWS_ENDPOINT_URL"], strip=strip)
    a_log = open(tmp_path / "a.log", "w")
    env = {**d.env, **INFO, "OML_FAULT": "lakewriter.before_commit.bronze/events:stop",
           "AWS_ENDPOINT_URL": proxy.url}
    a = subprocess.Popen([OML_BIN, "lakewriter", "--once", "--test-bypass-lease"], env=env, stderr=a_log,
                         stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: a.poll() is None and proc_state(a.pid) == "T", "writer A stopped before its commit")
        lakewriter(d, "--test-bypass-lease", "--max-rows", "5")
        b_commits = commits(d)
        assert len(b_commits) >= 2
        proxy.hide = True
        os.kill(a.pid, signal.SIGCONT)
        a.wait(timeout=60)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        a_log.close()
        proxy.close()
    return b_commits, proxy, (tmp_path / "a.log").read_text()


def test_two_writers_past_the_version_read_the_if_none_match_put_fences_the_second(s3_lake, tmp_path):
    d = s3_lake
    b_commits, proxy, a_text = race_in_the_window(d, tmp_path, strip=False)
    # A did try to create version 1, conditionally, and moto refused it.
    assert proxy.log_puts[0] == (f"/{BUCKET}/{LOG_PREFIX}00000000000000000001.json", "*"), proxy.log_puts
    failed = [l for l in log_lines(a_text) if l["msg"] == "lake writer: batch failed"]
    assert len(failed) == 1 and "lake-commit-conflict" in failed[0]["error"], a_text
    assert not [l for l in log_lines(a_text) if l["msg"] == "lake writer: batch applied" and l["committed"]], a_text
    assert commits(d) == b_commits  # A committed nothing, B's version 1 is intact
    assert_exactly_once(d)


def test_without_if_none_match_the_second_writer_overwrites_a_commit(s3_lake, tmp_path):
    """The negative control: the same race through a proxy that strips If-None-Match. A's PUT
    replaces B's version 1, so the table no longer holds B's first batch as committed: what the
    conditional PUT prevents."""
    d = s3_lake
    b_commits, proxy, a_text = race_in_the_window(d, tmp_path, strip=True)
    assert proxy.log_puts[0] == (f"/{BUCKET}/{LOG_PREFIX}00000000000000000001.json", None), proxy.log_puts
    after = commits(d)
    assert after[0] != b_commits[0], a_text
    # Version 1 is now A's whole batch (0, last], over B's (0, 5]: B's first commit is gone.
    assert after[0][0] == 1 and after[0][2] == 0 and after[0][3] > b_commits[0][3], (after, b_commits)
    with pytest.raises(AssertionError):
        assert_exactly_once(d)
