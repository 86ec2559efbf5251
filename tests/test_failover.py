"""The durability domain on a real replicated cluster (issue 21): a primary, two synchronous
standbys (`ANY 1 (s1, s2)`) and an asynchronous one (tests/pgcluster.py), with `oml serve` and
`oml lakewriter` on libpq multi-host URLs in the production profile (durability enforced).

What the seed promises: a COMMIT is acknowledged only once a quorum of synchronous standbys holds
it, so promoting the most advanced synchronous standby loses no acknowledged event; a failover
onto a node that lost the tail is caught by the fork check and nothing is signed onto the fork.
"""
import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor
import time
import uuid
from pathlib import Path

import pytest
import requests

from conftest import OML_BIN
from pgcluster import ReplicatedCluster, ReplicatedDeployment
from test_durability import metric
from test_lake_compaction import SILVER, assert_verify_from_lake
from test_lake_tables import both_readers, silver_key, verdict
from test_lakewriter import assert_exactly_once

ENFORCED = {
    "OML_REDUCED_DURABILITY": "0",
    "OML_DURABILITY_CHECK_MS": "200",
    "OML_COMMIT_REPLICATION_TIMEOUT_MS": "1500",
}
NOT_REPLICATED = "urn:oml:problem:commit-not-replicated"


@pytest.fixture
def rc(tmp_path):
    cluster = ReplicatedCluster().start()
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    d = ReplicatedDeployment(home, cluster)
    try:
        d.start_cluster()
        d.init()
        d.tenant_id = d.tenant("acme")
        d.writer = d.api_key("acme", "writer", "alice")
        yield d
    finally:
        d.stop_server()
        cluster.close()


def doc(i, **kw):
    out = {"body": f"claim {i}", "workarea_id": "wa-1", "path": f"notes/{i}.md", "provenance": "human"}
    out.update(kw)
    return out


def post_claim(d, i, key=None, timeout=30, token=None):
    h = {"Authorization": f"Bearer {token or d.writer}"}
    if key:
        h["Idempotency-Key"] = f'"{key}"'
    return requests.post(d.base + "/v1/claims", headers=h, json=doc(i), timeout=timeout)


def journal_row(node, tenant, seq):
    """(event_hash, signature) of one event, read on one node (a hot standby reads too)."""
    with node.conn() as c:
        r = c.execute("SELECT event_hash, signature FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                      (tenant, seq)).fetchone()
    return None if r is None else (bytes(r[0]).hex(), base64.b64encode(bytes(r[1])).decode())


def receipt_of(r):
    rec = r.json()["receipt"]
    return rec["tenant"], rec["seq"], rec["event_hash"], rec["signature"]


def health(d):
    r = requests.get(d.base + "/v1/health", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(pred, what, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"not reached within {timeout} s: {what}: {v}")


def journal_count(node):
    with node.conn() as c:
        return c.execute("SELECT count(*) FROM oml.journal").fetchone()[0]


# --- one standby down ---------------------------------------------------------------------

def test_one_standby_down_writes_go_on_and_every_receipt_is_on_the_survivor(rc):
    d, cluster = rc, rc.cluster
    d.serve(env=ENFORCED)
    h = health(d)
    assert (h["durability"], h["replication"]) == ("ok", "ok"), h
    assert h["replication_detail"] == "2 of 3 streaming standbys synchronous; 1 needed"
    cluster.nodes["s1"].stop()
    wait_for(lambda: health(d)["replication_detail"].startswith("1 of 2"), "s1 gone from the count")
    assert health(d)["replication"] == "ok"  # ANY 1 of (s1, s2): s2 alone is the quorum
    receipts = []
    for i in range(20):
        r = post_claim(d, i)
        assert r.status_code == 201, r.text
        receipts.append(receipt_of(r))
    # synchronous_commit = on: s2 flushed each commit before its 201; it replays them soon after.
    cluster.wait_replayed(["s2"])
    for tenant, seq, event_hash, signature in receipts:
        assert journal_row(cluster.nodes["s2"], tenant, seq) == (event_hash, signature), seq
    assert metric(d, "oml_durability_sync_standbys_streaming") == 1
    assert metric(d, "oml_durability_sync_standbys_required") == 1


# --- both standbys down -------------------------------------------------------------------

def test_both_standbys_down_a_write_answers_commit_not_replicated_within_the_bound_and_a_retry_commits_once(rc):
    d, cluster = rc, rc.cluster
    d.serve(env=ENFORCED)
    d.tenant("beta")  # (oml tenant and oml key commit without a bound: made while the quorum holds)
    beta = d.api_key("beta", "writer", "bob")
    before = journal_count(cluster.primary)
    for n in ("s1", "s2"):
        cluster.nodes[n].stop()
    # The running check notices the quorum is gone: /v1/health, metrics, doctor.
    h = wait_for(lambda: (lambda h: h if h["replication"] == "below-quorum" else None)(health(d)),
                 "below-quorum in /v1/health", timeout=10)
    assert h["status"] == "degraded"
    assert h["replication_detail"] == "0 of 1 streaming standby synchronous; 1 needed"  # a1 is async
    assert metric(d, "oml_durability_sync_standbys_streaming") == 0
    assert metric(d, "oml_durability_sync_standbys_required") == 1
    doctor = d.run("doctor", check=False)
    assert doctor.returncode == 3, doctor.stdout + doctor.stderr
    assert "REPLICATION: below the quorum: 0 of 1 streaming standby synchronous; 1 needed" in doctor.stdout
    below = [json.loads(l) for l in d.log_text().splitlines() if l.startswith("{")]
    assert any(l.get("msg", "").startswith("synchronous standbys below the quorum") for l in below), below[-5:]

    # A write waits for the bound (1.5 s), then 503: committed locally, never acknowledged.
    for attempt in ("first", "retry while still down"):
        t0 = time.time()
        r = post_claim(d, 1, key="both-down-1")
        took = time.time() - t0
        assert r.status_code == 503, (attempt, r.text)
        assert r.json()["type"] == NOT_REPLICATED, attempt
        assert "receipt" not in r.json()
        assert "Idempotent-Replayed" not in r.headers
        assert 1.4 <= took < 1.5 + 3.0, (attempt, took)
    assert journal_count(cluster.primary) == before + 1  # the first attempt's local commit only

    # Eight writes at once, four per tenant: the same tenant's wait behind the first one's
    # advisory lock (held while its commit waits for the quorum) counts against the bound too.
    # Every one answers 503 commit-not-replicated within the bound; none gets a receipt.
    tokens = {"acme": d.writer, "beta": beta}
    keys = [(t, f"both-down-{t}-{i}") for t in ("acme", "beta") for i in range(4)]

    def concurrent(t, key):
        t0 = time.time()
        r = post_claim(d, key, key=key, token=tokens[t])
        return r, time.time() - t0

    with ThreadPoolExecutor(len(keys)) as pool:
        answers = list(pool.map(lambda k: concurrent(*k), keys))
    for (t, key), (r, took) in zip(keys, answers):
        assert r.status_code == 503, (key, r.text)
        assert r.json()["type"] == NOT_REPLICATED, (key, r.text)
        assert "receipt" not in r.json(), key
        assert took < 1.5 + 3.0, (key, took)
    unacknowledged = journal_count(cluster.primary) - before - 1  # committed locally, never acknowledged
    assert 0 <= unacknowledged <= len(keys)

    # A standby returns; the same key now answers 201 with the one event, and it is on s1.
    cluster.nodes["s1"].start()
    cluster.wait_streaming(["s1"])
    r = post_claim(d, 1, key="both-down-1")
    assert r.status_code == 201, r.text
    tenant, seq, event_hash, signature = receipt_of(r)
    assert journal_count(cluster.primary) == before + 1 + unacknowledged
    cluster.wait_replayed(["s1"])
    assert journal_row(cluster.nodes["s1"], tenant, seq) == (event_hash, signature)
    # Each of the eight keys, retried, commits exactly once: a local commit the quorum never
    # confirmed is answered from the idempotency record, the others commit now.
    seqs = set()
    for t, key in keys:
        r, _ = concurrent(t, key)
        assert r.status_code == 201, (key, r.text)
        again, _ = concurrent(t, key)
        assert again.status_code == 201 and again.json()["receipt"] == r.json()["receipt"], key
        seqs.add((r.json()["receipt"]["tenant"], r.json()["receipt"]["seq"]))
    assert len(seqs) == len(keys)
    assert journal_count(cluster.primary) == before + 1 + len(keys)
    wait_for(lambda: health(d)["replication"] == "ok", "replication ok again")
    assert d.run("doctor", check=False).returncode == 0


# --- kill -9 of the primary under load, promote a synchronous standby ----------------------

class Load:
    """Clients writing claims with Idempotency-Keys: each key is retried (on 503, 5xx or a broken
    connection) until it answers 201, so every 201 a client holds is one it was promised."""

    def __init__(self, d, clients=3):
        self.d = d
        self.stop = threading.Event()
        self.receipts = {}  # key -> (tenant, seq, event_hash, signature)
        self.failures = {}  # what the retried attempts answered: status or exception name -> count
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(c,)) for c in range(clients)]

    def run(self, client):
        i = 0
        while not self.stop.is_set():
            key = f"load-{client}-{i}"
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    r = post_claim(self.d, i, key=key, timeout=15)
                    what = r.status_code
                    if r.status_code == 201:
                        with self.lock:
                            self.receipts[key] = receipt_of(r)
                        break
                    assert r.status_code in (503, 500), r.text
                    what = r.json().get("type", r.status_code)
                except (requests.ConnectionError, requests.Timeout) as e:
                    what = type(e).__name__
                with self.lock:
                    self.failures[what] = self.failures.get(what, 0) + 1
                time.sleep(0.05)
            else:
                raise AssertionError(f"{key} never committed")
            i += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(120)
            assert not t.is_alive()


def test_kill_9_of_the_primary_under_load_then_promote_a_synchronous_standby_loses_no_receipt(rc):
    d, cluster = rc, rc.cluster
    d.serve(env=ENFORCED)
    with Load(d) as load:
        wait_for(lambda: len(load.receipts) >= 30, "30 receipts before the crash")
        cluster.primary.kill9()
        at_crash = len(load.receipts)
        new = cluster.failover()  # the most advanced synchronous standby; the others follow it
        wait_for(lambda: len(load.receipts) >= at_crash + 30, "30 receipts after the failover", timeout=60)
    receipts = load.receipts
    seqs = [(t, s) for t, s, _, _ in receipts.values()]
    assert len(seqs) == len(set(seqs)), "a seq was acknowledged twice"
    for key, (tenant, seq, event_hash, signature) in receipts.items():
        assert journal_row(new, tenant, seq) == (event_hash, signature), key
    # The server followed the failover by itself: same process, new primary.
    assert d.server.poll() is None
    print(f"\nfailover under load: {len(receipts)} receipts ({at_crash} before the crash), "
          f"retried answers {load.failures}, journal {journal_count(new)} events")
    assert d.run("verify").returncode == 0
    d.run("lakewriter", "--once", timeout=120)
    assert_exactly_once(d)


# --- the asynchronous standby that lost the tail -------------------------------------------

def test_only_the_most_advanced_synchronous_standby_holds_every_receipt_and_is_the_one_promoted(rc):
    """`ANY 1 (s1, s2)` puts each acknowledged commit on s1 OR s2, not on both. s1 stops receiving
    while s2 acknowledges alone; after the primary's kill -9, s1 lacks the last receipts. The
    documented failover promotes the synchronous standby holding the most WAL (s2); s1, behind
    it, then follows it, and the quorum is whole again. (Promoting s1 instead would lose the
    receipts, and s2, ahead of s1's new timeline, could never follow it: every commit would wait
    for a quorum that never comes. A race of the two standbys did that to this file's other tests
    when they promoted s1 by name.)"""
    d, cluster = rc, rc.cluster
    d.serve(env=ENFORCED)
    nodes = cluster.nodes
    receipts = [receipt_of(post_claim(d, i)) for i in range(3)]
    cluster.wait_replayed(["s1", "s2"])
    with nodes["s1"].conn(dbname="postgres") as c:  # s1's walreceiver stops: s2 acknowledges alone
        c.execute("ALTER SYSTEM SET primary_conninfo = ''")
        c.execute("SELECT pg_reload_conf()")
    wait_for(lambda: "s1" not in cluster.streaming(), "s1 no longer streaming")
    for i in range(3, 8):
        r = post_claim(d, i)
        assert r.status_code == 201, r.text
        receipts.append(receipt_of(r))
    cluster.primary.kill9()
    tenant, last = receipts[-1][0], receipts[-1][1]
    assert journal_row(nodes["s1"], tenant, last) is None  # s1 is a synchronous standby, and lacks them
    assert journal_row(nodes["s1"], *receipts[2][:2]) == receipts[2][2:]
    assert cluster.received_lsn("s1") < cluster.received_lsn("s2")
    assert cluster.most_advanced() == "s2"
    new = cluster.failover()
    assert new is nodes["s2"]
    cluster.wait_streaming(["s1"])  # behind s2's new timeline: s1 follows it
    for t, seq, event_hash, signature in receipts:
        assert journal_row(new, t, seq) == (event_hash, signature), seq
    r = wait_for(lambda: [x for x in [post_claim(d, 100)] if x.status_code == 201],
                 "a write through the server on s2", timeout=60)[0]
    assert receipt_of(r)[1] == last + 1
    assert d.run("verify").returncode == 0


def test_promoting_the_asynchronous_standby_that_lost_the_tail_is_a_fork_and_the_documented_recovery_loses_nothing(rc):
    d, cluster = rc, rc.cluster
    d.serve(env=ENFORCED)
    nodes = cluster.nodes
    receipts = [receipt_of(r) for r in (post_claim(d, i) for i in range(3))]
    cluster.wait_replayed(["a1"])
    nodes["a1"].stop()  # a1 falls behind: the next events are acknowledged without it
    for i in range(3, 8):
        r = post_claim(d, i)
        assert r.status_code == 201, r.text
        receipts.append(receipt_of(r))
    last = receipts[-1][1]
    d.wait_published(d.tenant_id, last)
    # The primary dies; the operator promotes the wrong node.
    cluster.primary.kill9()
    nodes["s1"].stop()
    nodes["s2"].stop()
    nodes["a1"].start()
    nodes["a1"].promote()
    cluster.primary = nodes["a1"]
    forked_count = journal_count(nodes["a1"])
    with nodes["a1"].conn() as c:
        head = c.execute("SELECT max(seq) FROM oml.journal WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0]
    assert head == receipts[2][1], (head, receipts)  # a1 holds the first three events only

    # The running server reconnects to a1 and refuses to sign onto its chain.
    def refused():
        try:
            r = post_claim(d, 100, timeout=10)
        except requests.ConnectionError:
            return None
        seen.append((r.status_code, r.text[:300]))
        # (a Response of a 4xx/5xx is falsy: wait_for gets it in a list)
        return [r] if r.status_code == 503 and r.json()["type"] == "urn:oml:problem:chain-fork" else None
    seen = []
    try:
        r = wait_for(refused, "503 chain-fork from the server on a1", timeout=30)[0]
    except AssertionError:
        raise AssertionError(f"no 503 chain-fork from the server on a1; it answered {seen[-3:]}")
    assert "behind seq" in r.json()["detail"], r.json()
    # A restarted server refuses too (the startup fork check against the published heads).
    d.stop_server()
    d.serve(env=ENFORCED)
    r = post_claim(d, 101)
    assert r.status_code == 503 and r.json()["type"] == "urn:oml:problem:chain-fork", r.text
    assert health(d)["forked_tenants"] == 1
    doctor = d.run("doctor", check=False)
    assert doctor.returncode == 3, doctor.stdout
    assert d.tenant_id in doctor.stdout
    assert journal_count(nodes["a1"]) == forked_count  # nothing signed onto the fork

    # The documented recovery (docs/operations/deployment.md, "Failover"): stop the forked node,
    # promote a synchronous standby, restart the servers, pg_rewind the old primary onto it and
    # rebuild the forked node from it.
    d.stop_server()
    nodes["a1"].stop()
    nodes["s1"].start()
    nodes["s2"].start()
    new = cluster.failover()  # the most advanced of s1 and s2
    cluster.rewind("p")   # the old primary: pg_rewind onto the new timeline
    cluster.reclone("a1")  # the forked node: its timeline ID collides with s1's, so a fresh copy
    cluster.wait_streaming([n for n in ("s1", "s2", "p", "a1") if n != new.name])
    d.serve(env=ENFORCED)
    for tenant, seq, event_hash, signature in receipts:
        assert journal_row(new, tenant, seq) == (event_hash, signature), seq
    r = post_claim(d, 102)
    assert r.status_code == 201, r.text
    assert receipt_of(r)[1] == last + 1
    assert d.run("verify").returncode == 0
    cluster.wait_replayed(["p", "a1"])
    assert journal_row(nodes["p"], *receipt_of(r)[:2]) == receipt_of(r)[2:]
    assert d.run("doctor", check=False).returncode == 0


# --- the lake writer across the failover ---------------------------------------------------

def test_the_lake_writer_follows_a_failover_and_a_kill_9_and_the_lake_holds_each_event_once(rc):
    d, cluster = rc, rc.cluster
    reviewer = d.api_key("acme", "reviewer", "rita")
    d.serve(env=ENFORCED)
    promoted = []

    def promote(n):  # silver/claims holds promoted claims: n more, while the load runs
        with cluster.primary.conn() as c:
            arts = [str(a) for (a,) in c.execute(
                "SELECT artifact_id FROM oml.artifacts WHERE state = 'held' ORDER BY submitted_seq LIMIT %s",
                (n,)).fetchall()]
        for art in arts:
            verdict(d, reviewer, art, "accept")
        promoted.extend(arts)
    log = open(d.home / "lakewriter.log", "ab")
    env = dict(d.env, OML_LOG_LEVEL="info")
    start = lambda: __import__("subprocess").Popen([OML_BIN, "lakewriter"], env=env, stdout=log, stderr=log)
    writer = start()
    try:
        with Load(d, clients=2) as load:
            wait_for(lambda: lake_frontier(cluster) > 0 and len(load.receipts) >= 20, "the writer drains")
            promote(5)
            cluster.primary.kill9()  # mid-drain: the writer's session and lease die with it
            cluster.failover()
            # The same process reconnects to the new primary and takes the lease there (epoch 2).
            wait_for(lambda: lease_epoch(cluster) == 2, "the lease re-taken on the new primary", timeout=60)
            drained = lake_frontier(cluster)
            wait_for(lambda: lake_frontier(cluster) > drained and len(load.receipts) >= 50,
                     "the writer drains on the new primary", timeout=60)
            writer.kill()  # and the writer itself, mid-batch
            writer.wait()
            writer = start()
            promote(5)
            wait_for(lambda: len(load.receipts) >= 70, "more writes", timeout=60)
        wait_for(lambda: lake_frontier(cluster) == last_outbox(cluster), "the lake catches up", timeout=90)
    finally:
        writer.terminate()
        writer.wait(30)
        log.close()
    assert lease_epoch(cluster) == 3  # taken on p, re-taken on s1 by the same process, then by the new one
    lines = [json.loads(l) for l in (d.home / "lakewriter.log").read_text(errors="replace").splitlines()
             if l.startswith("{")]
    takes = [(l["epoch"], l["holder"]) for l in lines if l["msg"] == "lake writer: lease acquired"]
    assert [e for e, _ in takes] == [1, 2, 3], takes
    assert takes[0][1] == takes[1][1] != takes[2][1]  # epoch 2: the same process, reconnected
    assert_exactly_once(d)  # bronze: each event once, as signed; gold: each event counted once
    # silver: one row per promoted claim, read alike by deltalake and by pyarrow over the log.
    silver = both_readers(d, SILVER, silver_key)
    assert len(promoted) == 10
    assert sorted(r["artifact_id"] for r in silver) == sorted(promoted)
    assert_verify_from_lake(d)


def lease_epoch(cluster):
    with cluster.primary.conn() as c:
        return c.execute("SELECT lease_epoch FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]


def lake_frontier(cluster):
    with cluster.primary.conn() as c:
        return c.execute("SELECT frontier_seq FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]


def last_outbox(cluster):
    with cluster.primary.conn() as c:
        return c.execute("SELECT coalesce(max(seq), 0) FROM oml.outbox").fetchone()[0]
