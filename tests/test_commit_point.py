"""The commit point (D1): claims, receipts, outbox, atomicity, erasure, verify."""
import base64
import hashlib
import json
import threading
import time

import psycopg
import pytest


def test_submit_fetch_and_receipt_verifies_offline(served, tmp_path):
    d = served
    # A claim under a simulation needs it running (admission/lifecycle.h): seq 6.
    assert d.post("/v1/simulations", d.admin, json={"simulation_id": "sim-1"}).status_code == 201
    r = d.submit(d.writer, body="the sky is blue", workarea_id="wa-7", path="facts/sky.md", simulation_id="sim-1")
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["state"] == "held"
    assert doc["version"] == 1
    assert doc["simulation_id"] == "sim-1"
    assert doc["plaintext_sha256"] == hashlib.sha256(b"the sky is blue").hexdigest()
    rc = doc["receipt"]
    assert rc["tenant"] == d.tenant_id
    assert rc["seq"] == 7  # seq 1 is the tenant's genesis, 2-5 the fixture's four api_key.created, 6 the simulation
    signed = base64.b64decode(rc["signed_bytes"])
    assert hashlib.sha256(signed).hexdigest() == rc["event_hash"]
    env = json.loads(signed)
    # Digest-only payload: no plaintext anywhere in the signed bytes.
    assert b"the sky is blue" not in signed
    assert env["payload"]["ciphertext_sha256"] == doc["ciphertext_sha256"]
    assert set(env["payload"]) == {"artifact_id", "version", "workarea_id", "path", "writer_key_id", "principal",
                                   "provenance", "simulation_id", "media_type", "size", "plaintext_sha256",
                                   "ciphertext_sha256", "review"}
    # The deny-list gate's record of the body: pattern ids and offsets only, nothing found here.
    assert env["payload"]["review"] == {"review": "text-extraction", "method": "text", "deny_list_hits": [],
                                        "hits_truncated": False, "flags": []}

    got = d.get(f"/v1/claims/{doc['artifact_id']}", d.writer)
    assert got.status_code == 200
    assert got.json()["body"] == "the sky is blue"

    f = tmp_path / "receipt.json"
    f.write_text(json.dumps(rc))
    ok = d.run("verify-receipt", str(f))
    assert "receipt OK" in ok.stdout
    rc["seq"] = 3
    f.write_text(json.dumps(rc))
    bad = d.run("verify-receipt", str(f), check=False)
    assert bad.returncode == 3
    assert "receipt seq differs from the signed envelope" in bad.stdout


BRONZE_ROW_KEYS = {"tenant_id", "seq", "prev_hash", "event_hash", "event_type", "key_id", "principal", "occurred_at",
                   "artifact_id", "version", "workarea_id", "path", "provenance", "simulation_id",
                   "plaintext_sha256", "ciphertext_sha256", "signed_bytes", "signature"}
PAYLOAD_COLUMNS = ["artifact_id", "version", "workarea_id", "path", "provenance", "simulation_id",
                   "plaintext_sha256", "ciphertext_sha256"]


def test_every_event_enqueues_one_bronze_outbox_row(served):
    d = served
    assert d.post("/v1/simulations", d.admin, json={"simulation_id": "sim-1"}).status_code == 201
    for i in range(3):
        extra = {"simulation_id": "sim-1"} if i == 1 else {}
        assert d.submit(d.writer, body=f"b{i}", **extra).status_code == 201
    with d.su() as c:
        journal = c.execute("SELECT tenant_id, seq FROM oml.journal ORDER BY 1, 2").fetchall()
        outbox = c.execute("SELECT tenant_id, journal_seq, target_table, xid IS NOT NULL FROM oml.outbox ORDER BY 1, 2").fetchall()
        assert [(t, s) for t, s, _, _ in outbox] == journal
        assert {(tt, x) for _, _, tt, x in outbox} == {("bronze/events", True)}
        # Sequential commits: outbox seq order is journal order (genesis, four api_key.created, the
        # simulation.started, three claims). This cannot see the order of the xid and the seq draw inside enqueue_outbox; the
        # two-connection tests below do.
        seqs = c.execute("SELECT journal_seq FROM oml.outbox WHERE tenant_id = %s ORDER BY seq", (d.tenant_id,)).fetchall()
        assert [s for (s,) in seqs] == list(range(1, 10))
        # the sequence has CACHE 1
        assert c.execute("SELECT cache_size FROM pg_sequences WHERE sequencename = 'outbox_seq'").fetchone()[0] == 1
        # row_data: the bronze/events columns but outbox_seq (journal/bronze_row.h); a claim's
        # payload columns equal its artifacts row, every other event has them null.
        rows = c.execute("SELECT o.row_data, j.event_type FROM oml.outbox o JOIN oml.journal j "
                         "ON j.tenant_id = o.tenant_id AND j.seq = o.journal_seq ORDER BY o.seq").fetchall()
        claims = 0
        for data, event_type in rows:
            assert set(data) == BRONZE_ROW_KEYS, data
            assert data["event_type"] == event_type
            if event_type == "simulation.started":  # names its simulation, nothing else
                assert [data[k] for k in PAYLOAD_COLUMNS] == [None] * 5 + ["sim-1"] + [None] * 2, data
                continue
            if event_type != "claim.submitted":
                assert [data[k] for k in PAYLOAD_COLUMNS] == [None] * 8, data
                continue
            claims += 1
            a = c.execute("SELECT artifact_id::text, version, workarea_id, path, provenance, simulation_id, "
                          "encode(plaintext_sha256, 'hex'), encode(ciphertext_sha256, 'hex') FROM oml.artifacts "
                          "WHERE tenant_id = %s AND submitted_seq = %s", (data["tenant_id"], data["seq"])).fetchone()
            assert [data[k] for k in PAYLOAD_COLUMNS] == list(a)
        assert claims == 3
        assert sum(1 for data, _ in rows if data["simulation_id"] == "sim-1") == 2  # its start and its claim


# --- enqueue_outbox takes the transaction's xid BEFORE it draws the outbox seq ----------------------
# (sql/0001_commit_point.sql; ARCHITECTURE.md "The outbox cut"). Deterministic, with three real
# connections: a superuser transaction holds a lock on oml.outbox_seq (ALTER SEQUENCE), so a second
# transaction calling the function blocks inside nextval(); a third reads the blocked backend's
# backend_xid from pg_stat_activity. Not NULL means the xid was taken before the seq draw.

SWAPPED_ENQUEUE = "oml.enqueue_outbox_xid_after_seq"


def _backend_xid_while_blocked_in_nextval(d, tenant, function, row_type="json"):
    """Calls `function(tenant, 'bronze/events', 1, '{}'::row_type)` while oml.outbox_seq is locked and returns
    (backend_xid of the caller while it waits for the sequence, the seq it drew once released).
    Both transactions are rolled back."""
    holder = psycopg.connect(d.superuser_url)  # not autocommit: each is one open transaction
    caller = psycopg.connect(d.superuser_url)
    watcher = d.su()
    try:
        holder.execute("ALTER SEQUENCE oml.outbox_seq CACHE 1")  # lock held until rollback
        caller.execute("SELECT set_config('oml.tenant_id', %s::text, true)", (tenant,))
        pid = caller.info.backend_pid
        activity = "SELECT wait_event_type, backend_xid::text FROM pg_stat_activity WHERE pid = %s"
        assert watcher.execute(activity, (pid,)).fetchone()[1] is None  # no xid yet in the caller
        outcome = {}

        def call():
            try:
                outcome["seq"] = caller.execute(f"SELECT {function}(%s::uuid, 'bronze/events', 1, '{{}}'::{row_type})",
                                                (tenant,)).fetchone()[0]
            except Exception as e:  # reported by the assertions below
                outcome["error"] = e

        t = threading.Thread(target=call)
        t.start()
        deadline = time.time() + 30
        while True:
            wait_type, xid = watcher.execute(activity, (pid,)).fetchone()
            waits_on_seq = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted AND relation = 'oml.outbox_seq'::regclass",
                (pid,)).fetchone()[0]
            if wait_type == "Lock" and waits_on_seq == 1:
                break
            assert "error" not in outcome, outcome
            assert time.time() < deadline, "the caller never blocked on oml.outbox_seq"
            time.sleep(0.01)
        holder.rollback()  # releases the sequence: the caller draws its seq and returns
        t.join(30)
        assert not t.is_alive()
        assert "error" not in outcome, outcome
        caller.rollback()
        return xid, outcome["seq"]
    finally:
        holder.close()
        caller.close()
        watcher.close()


@pytest.mark.parametrize("function,row_type", [("oml.enqueue_outbox_json", "json"), ("oml.enqueue_outbox", "jsonb")])
def test_outbox_xid_is_taken_before_the_seq_draw(deployment, function, row_type):
    """The commit point's enqueue_outbox_json (sql/0016), and the jsonb form that SQL-built rows use."""
    d = deployment
    tenant = d.tenant("acme")
    before = d.counts()["outbox"]
    xid, seq = _backend_xid_while_blocked_in_nextval(d, tenant, function, row_type)
    assert xid is not None, "enqueue_outbox drew the outbox seq before the transaction had an xid"
    assert int(xid) > 0
    assert isinstance(seq, int) and seq > 0
    assert d.counts()["outbox"] == before  # rolled back


def test_outbox_order_probe_detects_enqueue_outbox_with_the_steps_swapped(deployment):
    """The probe above can fail: the installed function with only its two steps swapped (seq drawn,
    then xid taken) is caught, its caller blocked in nextval() without an xid."""
    d = deployment
    tenant = d.tenant("acme")
    with d.su() as c:
        src = c.execute("SELECT pg_get_functiondef('oml.enqueue_outbox_json(uuid, text, bigint, json)'::regprocedure)").fetchone()[0]
        # sql/0017's fully qualified body (issue 17)
        take_xid = "v_xid pg_catalog.xid8 := pg_catalog.pg_current_xact_id();"
        draw_seq = "v_seq := pg_catalog.nextval('oml.outbox_seq'::pg_catalog.regclass);"
        assert src.count(take_xid) == 1 and src.count(draw_seq) == 1, src  # the shape this test swaps
        swapped = (src.replace(take_xid, "v_xid pg_catalog.xid8;")
                      .replace(draw_seq, draw_seq + "\n  v_xid := pg_catalog.pg_current_xact_id();")
                      .replace("oml.enqueue_outbox_json(", SWAPPED_ENQUEUE + "(", 1))
        assert SWAPPED_ENQUEUE in swapped
        c.execute(swapped)
    try:
        xid, seq = _backend_xid_while_blocked_in_nextval(d, tenant, SWAPPED_ENQUEUE)
        assert xid is None
        assert isinstance(seq, int) and seq > 0  # the swapped function works otherwise
    finally:
        with d.su() as c:
            c.execute(f"DROP FUNCTION {SWAPPED_ENQUEUE}(uuid, text, bigint, json)")


@pytest.mark.parametrize("point", ["journal.after_journal_insert", "journal.after_outbox_insert"])
def test_injected_fault_leaves_nothing_and_no_seq_gap(served, point):
    d = served
    assert d.submit(d.writer, body="before").status_code == 201
    before = d.counts()
    d.stop_server()
    d.serve(env={"OML_FAULT": point})
    r = d.submit(d.writer, body="doomed")
    assert r.status_code == 500
    assert r.json()["type"] == "urn:oml:problem:injected-fault"
    assert d.counts() == before
    d.stop_server()
    d.serve()
    r = d.submit(d.writer, body="after")
    assert r.status_code == 201
    assert r.json()["receipt"]["seq"] == 7  # genesis 1, keys 2-5, "before" 6, no gap left by the fault
    assert d.run("verify").returncode == 0


def test_erasure_shreds_dek_and_chain_still_verifies(served):
    d = served
    art = d.submit(d.writer, body="secret").json()["artifact_id"]
    r = d.post(f"/v1/claims/{art}/erase", d.admin, json={"reason": "gdpr request 42"})
    assert r.status_code == 200, r.text
    erased_seq = r.json()["receipt"]["seq"]
    assert r.json()["erased_seq"] == erased_seq
    got = d.get(f"/v1/claims/{art}", d.writer)
    assert got.status_code == 410
    assert got.json()["type"] == "urn:oml:problem:erased"
    assert f"erased at seq {erased_seq}" in got.json()["detail"]
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.artifact_keys WHERE artifact_id = %s", (art,)).fetchone()[0] == 0
        assert c.execute("SELECT event_type FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                         (d.tenant_id, erased_seq)).fetchone()[0] == "artifact.erased"
    again = d.post(f"/v1/claims/{art}/erase", d.admin)
    assert again.status_code == 410
    v = d.run("verify")
    assert v.stdout.startswith("OK")


def test_erase_from_cli(served):
    d = served
    art = d.submit(d.writer, body="cli secret").json()["artifact_id"]
    out = d.run("erase", "--tenant", "acme", art, "--reason", "operator")
    assert json.loads(out.stdout)["artifact_id"] == art
    assert d.get(f"/v1/claims/{art}", d.writer).status_code == 410
    missing = d.run("erase", "--tenant", "acme", "00000000-0000-4000-8000-000000000000", check=False)
    assert missing.returncode == 6


def test_own_work_rule_for_held_claims(served):
    d = served
    art = d.submit(d.writer, body="mine").json()["artifact_id"]
    assert d.get(f"/v1/claims/{art}", d.writer).status_code == 200      # author
    assert d.get(f"/v1/claims/{art}", d.reviewer).status_code == 200    # reviewer
    other = d.get(f"/v1/claims/{art}", d.writer2)                       # another writer
    assert other.status_code == 404
    assert other.json()["type"] == "urn:oml:problem:claim-not-found"


def test_fetch_refuses_body_whose_ciphertext_was_altered(served):
    d = served
    art = d.submit(d.writer, body="integrity matters").json()["artifact_id"]
    with d.su() as c:
        c.execute("UPDATE oml.artifact_bodies SET ciphertext = set_byte(ciphertext, 20, get_byte(ciphertext, 20) # 1) "
                  "WHERE artifact_id = %s", (art,))
    r = d.get(f"/v1/claims/{art}", d.writer)
    assert r.status_code == 500
    assert r.json()["type"] == "urn:oml:problem:integrity"
    assert "body" not in r.json()
    assert "integrity matters" not in r.text


def test_chain_head_and_events_are_externally_verifiable(served):
    d = served
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    for i in range(5):
        d.submit(d.writer, body=f"e{i}")
    head = d.get("/v1/chain/head", d.writer).json()
    assert head["seq"] == 10  # genesis, four api_key.created, five claims
    pub = json.loads((d.home / "keys" / "signing.key.pub").read_text())
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(pub["public_key"]))
    # The whole chain is for reviewers and admins (a writer sees only its own events).
    page1 = d.get("/v1/events?after=0&limit=4", d.admin).json()
    page2 = d.get(f"/v1/events?after={page1['next_after']}&limit=4", d.admin).json()
    page3 = d.get(f"/v1/events?after={page2['next_after']}&limit=4", d.admin).json()
    events = page1["events"] + page2["events"] + page3["events"]
    assert [e["seq"] for e in events] == list(range(1, 11))
    assert [e["type"] for e in events] == ["chain.genesis"] + ["api_key.created"] * 4 + ["claim.submitted"] * 5
    prev = "0" * 64
    for e in events:
        sb = base64.b64decode(e["signed_bytes"])
        assert hashlib.sha256(sb).hexdigest() == e["event_hash"]
        assert e["prev_hash"] == prev
        key.verify(base64.b64decode(e["signature"]), sb)  # raises on a bad signature
        prev = e["event_hash"]
    assert prev == head["event_hash"]


def test_metrics_cover_requests_commits_appends_and_lock_wait(served):
    d = served
    d.submit(d.writer, body="m")
    text = d.metrics()
    assert 'oml_http_requests_total{method="POST",route="/v1/claims",status="201"} 1' in text
    assert 'oml_commits_total{result="committed"} 1' in text
    assert "oml_chain_appends_total 1" in text.splitlines()
    assert "oml_advisory_lock_wait_seconds_count 1" in text


def test_no_metric_series_carries_a_tenant_label(served):
    """Series are labelled by bounded sets only (method, route, status, result, kind, and the lake
    writer's table and what): writes
    from three tenants add no series and name no tenant."""
    d = served
    tenants = {"acme": (d.tenant_id, d.writer)}
    for name in ("beta", "gamma"):
        tid = d.tenant(name)
        tenants[name] = (tid, d.api_key(name, "writer", "w"))
    for name, (tid, token) in tenants.items():
        for i in range(2):
            assert d.submit(token, body=f"{name} {i}").status_code == 201
    text = d.metrics()
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert series, text
    labels = set()
    for line in series:
        if "{" in line:
            labels |= {kv.split("=", 1)[0] for kv in line[line.index("{") + 1:line.rindex("}")].split(",") if kv}
    assert labels <= {"method", "route", "status", "result", "kind", "table", "what", "le", "quantile"}, labels
    for name, (tid, _) in tenants.items():
        assert tid not in text and name not in text
    assert "oml_chain_appends_total 6" in series  # two claims in each of three tenants, in one series


def test_logs_are_json_lines(served):
    d = served
    d.stop_server()
    d.serve(env={"OML_LOG_LEVEL": "info"})
    d.stop_server()
    records = [json.loads(line) for line in d.log_text().splitlines() if line.strip()]
    assert all({"ts", "level", "msg"} <= set(r) for r in records)
    assert any(r["msg"] == "listening" and r["address"] == f"127.0.0.1:{d.port}" for r in records)
