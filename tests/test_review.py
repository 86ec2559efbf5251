"""Review acts through the HTTP API (issue 8, "Promotion"): POST /v1/claims/{id}/verdict and
/demote, their events, and the silver/claims outbox rows that promotion, demotion and erasure
enqueue in the commit-point transaction (sql/0009_review.sql)."""
import base64
import hashlib
import json
import threading

SILVER_KEYS = {"tenant_id", "artifact_id", "version", "workarea_id", "path", "writer_key_id", "principal",
               "submitted_at", "promoted_at", "provenance", "simulation_id", "plaintext_sha256",
               "ciphertext_sha256", "media_type", "size_bytes", "body_location", "state", "state_changed_at",
               "last_event_seq"}


def problem(r, status, slug):
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["type"] == f"urn:oml:problem:{slug}", r.text
    return r.json()


def verdict(d, token, art, v, **kw):
    body = {"verdict": v}
    body.update(kw)
    return d.post(f"/v1/claims/{art}/verdict", token, json=body)


def event_time(c, tenant, seq):
    sb = c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = %s", (tenant, seq)).fetchone()[0]
    return json.loads(bytes(sb))["time"]


def silver_rows(d):
    """(journal_seq, row_data) of every silver/claims outbox row of the tenant, in outbox order."""
    with d.su() as c:
        return c.execute("SELECT journal_seq, row_data FROM oml.outbox WHERE tenant_id = %s "
                         "AND target_table = 'silver/claims' ORDER BY seq", (d.tenant_id,)).fetchall()


def expected_row(d, claim, promoted_seq, state, seq):
    """The row the lake writer's contract prescribes, from the artifacts row and the journal."""
    with d.su() as c:
        a = c.execute("SELECT workarea_id, path, writer_key_id, principal, provenance, simulation_id, "
                      "encode(plaintext_sha256, 'hex'), encode(ciphertext_sha256, 'hex'), media_type, size_bytes, "
                      "submitted_seq FROM oml.artifacts WHERE tenant_id = %s AND artifact_id = %s",
                      (d.tenant_id, claim["artifact_id"])).fetchone()
        row = {"tenant_id": d.tenant_id, "artifact_id": claim["artifact_id"], "version": 1,
               "workarea_id": a[0], "path": a[1], "writer_key_id": a[2], "principal": a[3],
               "submitted_at": event_time(c, d.tenant_id, a[10]),
               "promoted_at": event_time(c, d.tenant_id, promoted_seq),
               # The provenance class: "simulation" under a simulation (sql/0014).
               "provenance": "simulation" if a[5] else a[4], "simulation_id": a[5],
               "plaintext_sha256": a[6], "ciphertext_sha256": a[7],
               "media_type": a[8], "size_bytes": a[9], "body_location": "postgres:oml.artifact_bodies",
               "state": state, "state_changed_at": event_time(c, d.tenant_id, seq), "last_event_seq": seq}
    # The same values as the claim document the API answered (digests equal to the artifacts row).
    assert row["plaintext_sha256"] == claim["plaintext_sha256"]
    assert row["ciphertext_sha256"] == claim["ciphertext_sha256"]
    assert row["writer_key_id"] == claim["writer_key_id"]
    return row


def test_accept_promotes_and_enqueues_one_silver_row(served):
    d = served
    # A claim under a simulation needs it running (admission/lifecycle.h): seq 6.
    assert d.post("/v1/simulations", d.admin, json={"simulation_id": "sim-4"}).status_code == 201
    claim = d.submit(d.writer, body="the promoted body", workarea_id="wa-9", path="facts/p.md",
                     simulation_id="sim-4", media_type="text/markdown").json()
    art = claim["artifact_id"]
    assert silver_rows(d) == []  # held: nothing for silver
    r = verdict(d, d.reviewer, art, "accept", reason="checked twice")
    assert r.status_code == 200, r.text
    doc = r.json()
    seq = doc["receipt"]["seq"]
    assert seq == 8  # genesis 1, keys 2-5, simulation 6, claim 7
    assert (doc["state"], doc["promoted_seq"], doc["rejected_seq"], doc["demoted_seq"]) == ("promoted", seq, None, None)
    assert doc["plaintext_sha256"] == hashlib.sha256(b"the promoted body").hexdigest()
    signed = base64.b64decode(doc["receipt"]["signed_bytes"])
    env = json.loads(signed)
    assert (env["type"], env["principal"], env["seq"]) == ("claim.promoted", "rita", seq)
    assert env["payload"] == {"artifact_id": art, "version": 1, "workarea_id": "wa-9",
                              "plaintext_sha256": claim["plaintext_sha256"],
                              "ciphertext_sha256": claim["ciphertext_sha256"],
                              "reason": "checked twice", "verdict": "accept",
                              # The review gate's record (no attachments, nothing flagged).
                              "flags": [], "attachments_served": 0}
    assert b"the promoted body" not in signed

    rows = silver_rows(d)
    assert len(rows) == 1
    jseq, row = rows[0]
    assert jseq == seq
    assert set(row) == SILVER_KEYS
    assert row == expected_row(d, claim, seq, "promoted", seq)
    assert row["simulation_id"] == "sim-4"
    assert row["promoted_at"] == row["state_changed_at"] == env["time"]
    assert "the promoted body" not in json.dumps(row)
    # Promoted: every member of the tenant may read it now.
    got = d.get(f"/v1/claims/{art}", d.writer2)
    assert got.status_code == 200, got.text
    assert (got.json()["body"], got.json()["state"]) == ("the promoted body", "promoted")
    assert d.run("verify").stdout.startswith("OK")


def test_demote_then_erase_give_silver_rows_in_seq_order(served):
    d = served
    claim = d.submit(d.writer, body="short-lived").json()
    art = claim["artifact_id"]
    p = verdict(d, d.admin, art, "accept")
    assert p.status_code == 200, p.text
    pseq = p.json()["receipt"]["seq"]
    dm = d.post(f"/v1/claims/{art}/demote", d.reviewer, json={"reason": "superseded"})
    assert dm.status_code == 200, dm.text
    dseq = dm.json()["receipt"]["seq"]
    assert (dm.json()["state"], dm.json()["promoted_seq"], dm.json()["demoted_seq"]) == ("demoted", pseq, dseq)
    env = json.loads(base64.b64decode(dm.json()["receipt"]["signed_bytes"]))
    assert env["type"] == "claim.demoted"
    assert env["payload"] == {"artifact_id": art, "version": 1, "workarea_id": "wa-1",
                              "plaintext_sha256": claim["plaintext_sha256"],
                              "ciphertext_sha256": claim["ciphertext_sha256"], "reason": "superseded"}
    # Demoted: withdrawn from other writers again; a second demotion and a verdict are 409.
    assert d.get(f"/v1/claims/{art}", d.writer2).status_code == 404
    again = problem(d.post(f"/v1/claims/{art}/demote", d.admin), 409, "claim-not-promoted")
    assert again["detail"] == f"claim {art} is demoted, not promoted"
    problem(verdict(d, d.reviewer, art, "reject"), 409, "claim-not-held")

    e = d.post(f"/v1/claims/{art}/erase", d.writer, json={"reason": "mine"})
    assert e.status_code == 200, e.text
    eseq = e.json()["receipt"]["seq"]
    rows = silver_rows(d)
    assert [r[0] for r in rows] == [pseq, dseq, eseq]
    assert rows[0][1] == expected_row(d, claim, pseq, "promoted", pseq)
    assert rows[1][1] == expected_row(d, claim, pseq, "demoted", dseq)
    assert rows[2][1] == expected_row(d, claim, pseq, "erased", eseq)
    assert rows[1][1]["promoted_at"] == rows[0][1]["promoted_at"] != rows[1][1]["state_changed_at"]
    # Each silver row was enqueued in its event's transaction, just before that event's bronze row.
    with d.su() as c:
        order = c.execute("SELECT target_table, journal_seq FROM oml.outbox WHERE tenant_id = %s AND journal_seq >= %s "
                          "ORDER BY seq", (d.tenant_id, pseq)).fetchall()
    assert order == [("silver/claims", pseq), ("bronze/events", pseq), ("silver/claims", dseq), ("bronze/events", dseq),
                     ("silver/claims", eseq), ("bronze/events", eseq)]
    problem(d.post(f"/v1/claims/{art}/demote", d.admin), 410, "erased")
    problem(verdict(d, d.admin, art, "accept"), 410, "erased")
    assert d.run("verify").stdout.startswith("OK")


def test_reject_and_never_promoted_erasures_enqueue_no_silver_row(served):
    d = served
    rejected = d.submit(d.writer, body="not this").json()["artifact_id"]
    held = d.submit(d.writer, body="still waiting").json()["artifact_id"]
    r = verdict(d, d.reviewer, rejected, "reject", reason="unsupported")
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["rejected_seq"], r.json()["promoted_seq"]) == \
        ("rejected", r.json()["receipt"]["seq"], None)
    env = json.loads(base64.b64decode(r.json()["receipt"]["signed_bytes"]))
    assert (env["type"], env["payload"]["verdict"], env["payload"]["reason"]) == ("claim.rejected", "reject", "unsupported")
    again = problem(verdict(d, d.admin, rejected, "accept"), 409, "claim-not-held")
    assert again["detail"] == f"claim {rejected} is rejected, not held"
    problem(d.post(f"/v1/claims/{held}/demote", d.admin), 409, "claim-not-promoted")
    assert d.get(f"/v1/claims/{rejected}", d.writer2).status_code == 404  # rejected stays private
    assert d.get(f"/v1/claims/{rejected}", d.writer).status_code == 200   # to all but its author
    assert d.post(f"/v1/claims/{rejected}/erase", d.admin).status_code == 200
    assert d.post(f"/v1/claims/{held}/erase", d.writer).status_code == 200
    assert silver_rows(d) == []
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.outbox WHERE target_table <> 'bronze/events'").fetchone()[0] == 0
    assert d.run("verify").stdout.startswith("OK")


def test_roles_and_request_errors(served):
    d = served
    art = d.submit(d.writer, body="x").json()["artifact_id"]
    # Writers may not review, not even their own claim.
    assert problem(verdict(d, d.writer, art, "accept"), 403, "forbidden-role")["detail"] == \
        "role writer may not review claims"
    problem(d.post(f"/v1/claims/{art}/demote", d.writer), 403, "forbidden-role")
    problem(verdict(d, None, art, "accept"), 401, "unauthenticated")
    problem(verdict(d, d.reviewer, "0b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a", "accept"), 404, "claim-not-found")
    problem(verdict(d, d.reviewer, "nope", "accept"), 404, "claim-not-found")
    problem(d.post(f"/v1/claims/{art}/demote", d.reviewer, json={}), 409, "claim-not-promoted")
    # The body: the field rules of every write.
    problem(d.post(f"/v1/claims/{art}/verdict", d.reviewer, data=b"{not json"), 400, "malformed-json")
    problem(d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={}), 400, "missing-field")
    problem(d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": None}), 400, "missing-field")
    problem(verdict(d, d.reviewer, art, "promote"), 400, "invalid-field")
    problem(verdict(d, d.reviewer, art, 1), 400, "invalid-field")
    problem(verdict(d, d.reviewer, art, "accept", reason="r" * 1025), 400, "invalid-field")
    problem(verdict(d, d.reviewer, art, "accept", reason="a\nb"), 400, "invalid-field")
    problem(verdict(d, d.reviewer, art, "accept", tenant="x"), 400, "unknown-field")
    problem(d.post(f"/v1/claims/{art}/demote", d.reviewer, json={"verdict": "accept"}), 400, "unknown-field")
    # A writer's 400 comes before its 403 (body first, as for erase); none of this journalled anything.
    problem(verdict(d, d.writer, art, "maybe"), 400, "invalid-field")
    with d.su() as c:
        assert c.execute("SELECT max(seq) FROM oml.journal WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0] == 6
    assert d.get(f"/v1/claims/{art}", d.writer).json()["state"] == "held"


def test_idempotent_verdict_replays_and_journals_once(served):
    d = served
    art = d.submit(d.writer, body="idem").json()["artifact_id"]
    h = {"Idempotency-Key": '"verdict-7"'}
    one = d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": "accept"}, headers=dict(h))
    assert one.status_code == 200, one.text
    assert "Idempotent-Replayed" not in one.headers
    two = d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": "accept"}, headers=dict(h))
    assert two.status_code == 200, two.text
    assert two.headers["Idempotent-Replayed"] == "true"
    assert two.content == one.content
    problem(d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": "reject"}, headers=dict(h)),
            422, "idempotency-key-reused")
    with d.su() as c:
        n = c.execute("SELECT count(*) FROM oml.journal WHERE tenant_id = %s AND event_type = 'claim.promoted'",
                      (d.tenant_id,)).fetchone()[0]
    assert n == 1
    assert len(silver_rows(d)) == 1


def test_racing_verdicts_exactly_one_wins(served):
    """Two reviewers give verdicts on one claim at once, many times over: every time exactly one
    200 and one 409 claim-not-held, and exactly one verdict event per claim."""
    d = served
    arts = [d.submit(d.writer, body=f"race {i}").json()["artifact_id"] for i in range(10)]
    results = {}

    def go(art, token, v, barrier):
        barrier.wait()
        results[(art, v)] = verdict(d, token, art, v)

    for art in arts:
        barrier = threading.Barrier(2)
        ts = [threading.Thread(target=go, args=(art, d.reviewer, "accept", barrier)),
              threading.Thread(target=go, args=(art, d.admin, "reject", barrier))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    promoted = 0
    for art in arts:
        a, r = results[(art, "accept")], results[(art, "reject")]
        assert sorted([a.status_code, r.status_code]) == [200, 409], (a.text, r.text)
        loser = a if a.status_code == 409 else r
        winner = r if loser is a else a
        assert loser.json()["type"] == "urn:oml:problem:claim-not-held"
        assert loser.json()["detail"] == f"claim {art} is {winner.json()['state']}, not held"
        promoted += winner.json()["state"] == "promoted"
    with d.su() as c:
        per_claim = c.execute(
            "SELECT convert_from(signed_bytes, 'UTF8')::jsonb -> 'payload' ->> 'artifact_id', count(*) FROM oml.journal "
            "WHERE tenant_id = %s AND event_type IN ('claim.promoted', 'claim.rejected') GROUP BY 1",
            (d.tenant_id,)).fetchall()
    assert sorted(per_claim) == sorted((art, 1) for art in arts)
    assert len(silver_rows(d)) == promoted
    assert d.run("verify").stdout.startswith("OK")
