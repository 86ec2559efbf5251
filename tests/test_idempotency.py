"""Idempotency-Key on the write routes (issue 6 section 1; sql/0005_idempotency_keys.sql).

A retry with the same key and the same request answers the first response again (same status,
same bytes, header `Idempotent-Replayed: true`) instead of journalling a second event.
"""
import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import requests

DOC = {"body": "pay 10 EUR", "workarea_id": "wa-1", "path": "notes/pay.md", "provenance": "human"}


def submit(d, token, key, doc=DOC):
    """POST /v1/claims with the exact same body bytes every time for one `doc`."""
    return d.post("/v1/claims", token, data=json.dumps(doc), headers={
        "Content-Type": "application/json", "Idempotency-Key": key})


def journal_count(d, event_type):
    with d.su() as c:
        return c.execute("SELECT count(*) FROM oml.journal WHERE tenant_id = %s AND event_type = %s",
                         (d.tenant_id, event_type)).fetchone()[0]


def test_same_key_same_body_replays_the_first_receipt(served):
    d = served
    before = journal_count(d, "claim.submitted")
    first = submit(d, d.writer, '"order-1"')
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    again = submit(d, d.writer, '"order-1"')
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content  # receipt, artifact_id, seqs: byte for byte
    assert again.json()["artifact_id"] == first.json()["artifact_id"]
    assert again.json()["receipt"] == first.json()["receipt"]
    assert again.headers["Location"] == first.headers["Location"] == f"/v1/claims/{first.json()['artifact_id']}"
    assert journal_count(d, "claim.submitted") == before + 1
    with d.su() as c:
        row = c.execute("SELECT response_status, journal_seq, expires_at - created_at = interval '86400 s' "
                        "FROM oml.idempotency_keys WHERE tenant_id = %s AND idem_key = 'order-1'",
                        (d.tenant_id,)).fetchone()
    assert row == (201, first.json()["receipt"]["seq"], True)
    # A replayed receipt is a real one: it verifies offline.
    assert d.run("verify").returncode == 0


def test_same_key_other_body_is_422_and_writes_nothing(served):
    d = served
    assert submit(d, d.writer, '"order-2"').status_code == 201
    before = d.counts()
    r = submit(d, d.writer, '"order-2"', dict(DOC, body="pay 1000 EUR"))
    assert r.status_code == 422, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["type"] == "urn:oml:problem:idempotency-key-reused"
    assert r.json()["status"] == 422
    assert d.counts() == before
    # Another route is another request too: erasing with the key of the submission is refused.
    art = submit(d, d.writer, '"order-2"').json()["artifact_id"]
    e = d.post(f"/v1/claims/{art}/erase", d.writer, headers={"Idempotency-Key": '"order-2"'})
    assert e.status_code == 422, e.text
    assert e.json()["type"] == "urn:oml:problem:idempotency-key-reused"
    after = d.counts()
    # The replay in between committed its fence row (the durability check before a replay); no
    # other table changed.
    assert after.pop("idempotency_fence") == 1
    before.pop("idempotency_fence")
    assert after == before


def test_same_key_from_another_api_key_is_another_key(served):
    d = served
    a = submit(d, d.writer, '"shared"')
    b = submit(d, d.writer2, '"shared"')
    assert (a.status_code, b.status_code) == (201, 201)
    assert "Idempotent-Replayed" not in b.headers
    assert b.json()["artifact_id"] != a.json()["artifact_id"]
    assert b.json()["receipt"]["seq"] == a.json()["receipt"]["seq"] + 1
    assert journal_count(d, "claim.submitted") == 2


def test_twenty_concurrent_identical_requests_write_one_event(served):
    d = served
    before = d.counts()["journal"]

    def one(_):
        with requests.Session() as s:
            return s.post(d.base + "/v1/claims", data=json.dumps(DOC), timeout=60, headers={
                "Authorization": f"Bearer {d.writer}", "Content-Type": "application/json",
                "Idempotency-Key": '"race-1"'})

    with ThreadPoolExecutor(max_workers=20) as pool:
        rs = list(pool.map(one, range(20)))
    assert [r.status_code for r in rs] == [201] * 20, [r.text for r in rs if r.status_code != 201]
    assert len({r.json()["receipt"]["seq"] for r in rs}) == 1
    assert len({r.content for r in rs}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in rs) == 19
    assert d.counts()["journal"] == before + 1
    assert journal_count(d, "claim.submitted") == 1


def test_an_expired_key_writes_again(served):
    d = served
    d.stop_server()
    d.serve(env={"OML_IDEMPOTENCY_TTL_S": "1"})
    first = submit(d, d.writer, '"short-lived"')
    assert first.status_code == 201
    assert submit(d, d.writer, '"short-lived"').headers.get("Idempotent-Replayed") == "true"
    time.sleep(2)
    second = submit(d, d.writer, '"short-lived"')
    assert second.status_code == 201, second.text
    assert "Idempotent-Replayed" not in second.headers
    assert second.json()["receipt"]["seq"] == first.json()["receipt"]["seq"] + 1
    assert second.json()["artifact_id"] != first.json()["artifact_id"]
    assert journal_count(d, "claim.submitted") == 2
    with d.su() as c:  # the expired row was replaced, not kept beside the new one
        rows = c.execute("SELECT journal_seq FROM oml.idempotency_keys WHERE idem_key = 'short-lived'").fetchall()
    assert rows == [(second.json()["receipt"]["seq"],)]


def test_malformed_keys_are_400_and_write_nothing(served):
    d = served
    before = d.counts()
    for key in ['""', '"" ', '"' + "k" * 300 + '"', '"' + "k" * 256 + '"', "order-3", '"a\tb"',
                '"order-3";p=1', '"order-3" "x"', '"unterminated', '"bad\\escape"', '"\u00e9"'.encode().decode("latin-1")]:
        r = submit(d, d.writer, key)
        assert r.status_code == 400, (key, r.text)
        assert r.json()["type"] == "urn:oml:problem:invalid-idempotency-key", (key, r.text)
    # A control character other than HTAB is not allowed in any field value (RFC 9110 section
    # 5.5): the HTTP layer refuses the request before any handler sees it.
    for key in ['"a\x01b"', '"a\x7fb"']:
        r = submit(d, d.writer, key)
        assert r.status_code == 400, (key, r.text)
        assert r.json()["type"] == "urn:oml:problem:malformed-request", (key, r.text)
    # Two field lines.
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    body = json.dumps(DOC)
    c.putrequest("POST", "/v1/claims")
    for name, value in [("Authorization", f"Bearer {d.writer}"), ("Content-Type", "application/json"),
                        ("Content-Length", str(len(body))), ("Idempotency-Key", '"a"'), ("Idempotency-Key", '"a"')]:
        c.putheader(name, value)
    c.endheaders(body.encode())
    r = c.getresponse()
    assert r.status == 400
    assert json.loads(r.read())["type"] == "urn:oml:problem:invalid-idempotency-key"
    c.close()
    assert d.counts() == before
    # An empty field line is a key of zero characters: 400 too.
    empty = submit(d, d.writer, "")
    assert empty.status_code == 400, empty.text
    assert empty.json()["type"] == "urn:oml:problem:invalid-idempotency-key"
    assert d.counts() == before
    assert d.counts()["idempotency_keys"] == 0
    # The longest key and escapes are fine: 255 characters once unescaped.
    ok = submit(d, d.writer, '"' + "k" * 253 + '\\"\\\\"')
    assert ok.status_code == 201, ok.text
    with d.su() as c2:
        assert c2.execute("SELECT idem_key FROM oml.idempotency_keys").fetchone()[0] == "k" * 253 + '"\\'


def test_erase_with_a_key_replays(served):
    d = served
    art = d.submit(d.writer, body="forget me").json()["artifact_id"]
    hdr = {"Idempotency-Key": '"erase-1"', "Content-Type": "application/json"}
    first = d.post(f"/v1/claims/{art}/erase", d.admin, data='{"reason": "gdpr"}', headers=hdr)
    assert first.status_code == 200, first.text
    again = d.post(f"/v1/claims/{art}/erase", d.admin, data='{"reason": "gdpr"}', headers=hdr)
    assert again.status_code == 200, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert again.json()["erased_seq"] == first.json()["receipt"]["seq"]
    # Without the key the retry is what it always was.
    assert d.post(f"/v1/claims/{art}/erase", d.admin).status_code == 410
    # Another reason is another request.
    other = d.post(f"/v1/claims/{art}/erase", d.admin, data='{"reason": "other"}', headers=hdr)
    assert other.status_code == 422
    assert journal_count(d, "artifact.erased") == 1
