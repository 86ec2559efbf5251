"""Attachments and admission (issue 9, "Naming, binding, the signed unit", "Admission lifecycle",
"Retrieval"): completed tus uploads bound to a claim as one signed unit, served to a reviewer
before a verdict counts, released from quarantine to the bodies bucket byte for byte on
promotion, and crypto-shredded on erasure (src/admission/attachments.h, sql/0013).

Buckets are local directories: $OML_HOME/objects/oml-quarantine and oml-bodies."""
import base64
import hashlib
import json
import os
import time

import pytest
import requests

from test_uploads import new_upload, upload_all

AWS_KEY = "AKIA" + "IOSFODNN7EXAMPLE"  # AWS's documented example key id: matches the built-in pattern
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000") + bytes(64)


def problem(r, status, slug):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["type"] == f"urn:oml:problem:{slug}", r.text
    return r.json()


def upload(d, token, data, **kv):
    uid = new_upload(d, token, data, **kv)
    assert upload_all(d, token, uid, data, chunk=7000) == len(data)
    return uid


def events(d, types=None):
    """(seq, type, payload) of the tenant's journal, in seq order."""
    with d.su() as c:
        rows = c.execute("SELECT seq, signed_bytes FROM oml.journal WHERE tenant_id = %s ORDER BY seq",
                         (d.tenant_id,)).fetchall()
    out = []
    for seq, sb in rows:
        env = json.loads(bytes(sb))
        if types is None or env["type"] in types:
            out.append((seq, env["type"], env["payload"]))
    return out


def bucket(d, name):
    return d.home / "objects" / name / d.tenant_id


def objects(d, name):
    root = bucket(d, name)
    if not root.exists():
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.iterdir() if p.is_file()}


def get_att(d, token, art, n, **headers):
    h = {"Authorization": f"Bearer {token}"}
    h.update(headers)
    return requests.get(f"{d.base}/v1/claims/{art}/attachments/{n}", headers=h, timeout=60)


def verdict(d, token, art, v):
    return d.post(f"/v1/claims/{art}/verdict", token, json={"verdict": v})


def head_seq(d):
    with d.su() as c:
        return c.execute("SELECT coalesce(max(seq), 0) FROM oml.journal WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0]


def serve_with(d, env):
    """`deployment` with tenant acme, a writer (alice) and a reviewer (rita), served with `env`."""
    d.tenant_id = d.tenant("acme")
    d.writer = d.api_key("acme", "writer", "alice")
    d.reviewer = d.api_key("acme", "reviewer", "rita")
    d.serve(env=env)
    return d


def test_three_attachments_end_to_end(served):
    d = served
    files = [("notes.txt", "text/plain", f"deploy with {AWS_KEY} today\n".encode() * 3),
             ("data.json", "application/json", json.dumps({"k": "zebrafish", "n": [1, 2, 3]}).encode()),
             ("pixel.png", "image/png", PNG)]
    uids = [upload(d, d.writer, data, filename=name, **{"content-type": mt}) for name, mt, data in files]
    with d.su() as c:
        sessions = {str(u): (bytes(p).hex(), bytes(ct).hex(), key) for u, p, ct, key in c.execute(
            "SELECT upload_id, plaintext_sha256, ciphertext_sha256, object_key FROM oml.upload_sessions "
            "WHERE state = 'complete'").fetchall()}
    assert set(sessions) == set(uids)

    r = d.submit(d.writer, body="three files", attachments=uids)
    assert r.status_code == 201, r.text
    art, seq = r.json()["artifact_id"], r.json()["receipt"]["seq"]

    # One signed unit: claim.submitted binds every digest; then one submission.attach per file,
    # at the next seqs, with the same digests and each file's review.
    evs = events(d)
    sub = [e for e in evs if e[0] == seq][0]
    assert sub[1] == "claim.submitted"
    assert [(a["ordinal"], a["plaintext_sha256"], a["ciphertext_sha256"], a["size"]) for a in sub[2]["attachments"]] == \
        [(i + 1, hashlib.sha256(files[i][2]).hexdigest(), sessions[uids[i]][1], len(files[i][2])) for i in range(3)]
    attach = [e for e in evs if e[1] == "submission.attach"]
    assert [e[0] for e in attach] == [seq + 1, seq + 2, seq + 3]
    assert [(e[2]["ordinal"], e[2]["upload_id"], e[2]["plaintext_sha256"], e[2]["ciphertext_sha256"]) for e in attach] == \
        [(i + 1, uids[i], sessions[uids[i]][0], sessions[uids[i]][1]) for i in range(3)]
    assert [e[2]["flagged"] for e in attach] == [True, False, False]
    assert attach[0][2]["review"]["flags"] == ["deny-list"]
    assert attach[0][2]["review"]["deny_list_hits"][0]["pattern"].startswith("aws-access-key")
    assert AWS_KEY not in json.dumps(attach[0][2])  # the hit is named, never copied
    assert attach[2][2]["review"]["review"] == "opaque"
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.upload_sessions").fetchone()[0] == 0  # moved, not copied
        assert c.execute("SELECT count(*) FROM oml.attachment_keys").fetchone()[0] == 3
        assert c.execute("SELECT array_agg(location ORDER BY ordinal) FROM oml.attachments").fetchone()[0] == \
            ["quarantine"] * 3
    quarantined = {s[1] for s in sessions.values()}
    assert set(objects(d, "oml-quarantine")) == quarantined

    assert d.get("/v1/search?q=zebrafish", d.reviewer).json()["claims"] == []  # held: not indexed
    # The claim document lists the attachments (no bytes) for the author.
    doc = d.get(f"/v1/claims/{art}", d.writer).json()
    assert [a["ordinal"] for a in doc["attachments"]] == [1, 2, 3]
    assert [a["flagged"] for a in doc["attachments"]] == [True, False, False]

    # A verdict before the files are served is refused, naming what is missing; nothing journalled.
    before = head_seq(d)
    assert "1, 2, 3" in problem(verdict(d, d.reviewer, art, "accept"), 409, "attachments-not-served")["detail"]
    assert head_seq(d) == before
    # The author's reads journal nothing (only a reviewer's serve counts).
    assert get_att(d, d.writer, art, 1).content == files[0][2]
    assert head_seq(d) == before
    for n in (1, 2):
        g = get_att(d, d.reviewer, art, n)
        assert g.status_code == 200 and g.content == files[n - 1][2]
        assert g.headers["Repr-Digest"] == "sha-256=:" + base64.b64encode(hashlib.sha256(files[n - 1][2]).digest()).decode() + ":"
        assert g.headers["Content-Type"] == files[n - 1][1]
    assert get_att(d, d.reviewer, art, 1).status_code == 200  # a second serve journals nothing new
    served_evs = [e for e in events(d, {"review.served"})]
    assert [(e[2]["item"], e[2]["ciphertext_sha256"]) for e in served_evs] == [(1, sessions[uids[0]][1]), (2, sessions[uids[1]][1])]
    assert "not served: 3" in problem(verdict(d, d.reviewer, art, "accept"), 409, "attachments-not-served")["detail"]
    g = get_att(d, d.reviewer, art, 3, Range="bytes=8-15")
    assert g.status_code == 206 and g.content == PNG[8:16]
    assert g.headers["Content-Range"] == f"bytes 8-15/{len(PNG)}"
    # A part of a file is not a serve of it.
    assert "not served: 3" in problem(verdict(d, d.reviewer, art, "accept"), 409, "attachments-not-served")["detail"]
    assert get_att(d, d.reviewer, art, 3).content == PNG

    # Accept: the same ciphertext bytes move to the bodies bucket; the verdict records the flags.
    r = verdict(d, d.reviewer, art, "accept")
    assert r.status_code == 200, r.text
    promoted = events(d, {"claim.promoted"})[-1][2]
    assert promoted["flags"] == ["attachment 1:deny-list"] and promoted["attachments_served"] == 3
    assert objects(d, "oml-quarantine") == {}
    assert objects(d, "oml-bodies") == {ct: ct for ct in quarantined}  # name = digest of the bytes
    with d.su() as c:
        assert c.execute("SELECT array_agg(location ORDER BY ordinal) FROM oml.attachments").fetchone()[0] == ["bodies"] * 3
    # Promoted: any caller of the tenant reads it, decrypted from the bodies bucket.
    assert get_att(d, d.writer2, art, 2).content == files[1][2]
    # The files' extracted text is searchable with the body (a word only data.json holds), once
    # the indexer has built it after the accept (sql/0028).
    d.wait_indexed()
    found = d.get("/v1/search?q=zebrafish", d.writer2).json()["claims"]
    assert [c["artifact_id"] for c in found] == [art]

    assert d.post(f"/v1/claims/{art}/demote", d.reviewer, json={"reason": "superseded"}).status_code == 200
    assert d.get("/v1/search?q=zebrafish", d.reviewer).json()["claims"] == []
    r = d.post(f"/v1/claims/{art}/erase", d.admin, json={"reason": "gdpr"})
    assert r.status_code == 200, r.text
    erased = events(d, {"artifact.erased"})[-1][2]
    assert sorted(erased["attachments_ciphertext_sha256"]) == sorted(quarantined)
    problem(get_att(d, d.writer, art, 1), 410, "erased")
    assert objects(d, "oml-bodies") == {}
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.attachment_keys").fetchone()[0] == 0
        assert c.execute("SELECT array_agg(location) FROM oml.attachments").fetchone()[0] == ["none"] * 3
    assert d.run("verify").stdout.startswith("OK")


def test_the_same_file_in_two_claims_shares_no_name_and_erasing_one_keeps_the_other(served):
    d = served
    data = b"the same bytes in two claims\n" * 100
    a = d.submit(d.writer, attachments=[upload(d, d.writer, data)]).json()["artifact_id"]
    b = d.submit(d.writer, attachments=[upload(d, d.writer, data)]).json()["artifact_id"]
    with d.su() as c:
        rows = c.execute("SELECT artifact_id::text, plaintext_sha256, ciphertext_sha256, object_key, upload_id "
                         "FROM oml.attachments ORDER BY attach_seq").fetchall()
    assert [r[0] for r in rows] == [a, b]
    assert rows[0][1] == rows[1][1]              # one plaintext digest (the signed identity)
    assert rows[0][2] != rows[1][2]              # two ciphertexts, two DEKs
    assert rows[0][3] != rows[1][3]              # two object names
    assert len(objects(d, "oml-quarantine")) == 2
    assert d.post(f"/v1/claims/{a}/erase", d.writer, json={}).status_code == 200
    problem(get_att(d, d.writer, a, 1), 410, "erased")
    assert get_att(d, d.writer, b, 1).content == data  # the other claim's file is untouched
    assert list(objects(d, "oml-quarantine")) == [bytes(rows[1][2]).hex()]
    with d.su() as c:
        assert [str(x[0]) for x in c.execute("SELECT upload_id FROM oml.attachment_keys").fetchall()] == [str(rows[1][4])]


def test_an_upload_attaches_once_and_only_by_its_own_key(served):
    d = served
    uid = upload(d, d.writer, b"once")
    before = head_seq(d)
    problem(d.submit(d.writer2, attachments=[uid]), 404, "upload-not-found")  # another key's upload
    problem(d.submit(d.writer, attachments=[uid, uid]), 400, "invalid-field")
    problem(d.submit(d.writer, attachments=["not-a-uuid"]), 400, "invalid-field")
    problem(d.submit(d.writer, attachments=uid), 400, "invalid-field")
    assert head_seq(d) == before
    assert d.submit(d.writer, attachments=[uid]).status_code == 201
    after = head_seq(d)
    problem(d.submit(d.writer, attachments=[uid]), 404, "upload-not-found")  # attached already
    assert head_seq(d) == after
    # An upload that is not complete cannot be attached either.
    partial = new_upload(d, d.writer, b"0123456789")
    problem(d.submit(d.writer, attachments=[partial]), 404, "upload-not-found")
    assert head_seq(d) == after


def test_ranges_and_visibility(served):
    d = served
    data = bytes(range(256)) * 1000  # 256,000 bytes: several 64 KiB AEAD segments
    art = d.submit(d.writer, attachments=[upload(d, d.writer, data)]).json()["artifact_id"]
    for rng, first, last in [("bytes=0-0", 0, 0), ("bytes=65530-65545", 65530, 65545), ("bytes=-10", len(data) - 10, len(data) - 1),
                             ("bytes=255990-", 255990, len(data) - 1), ("bytes=255990-999999", 255990, len(data) - 1)]:
        g = get_att(d, d.writer, art, 1, Range=rng)
        assert g.status_code == 206, (rng, g.text)
        assert g.content == data[first:last + 1], rng
        assert g.headers["Content-Range"] == f"bytes {first}-{last}/{len(data)}"
    # Every 416 names the size (RFC 9110 §15.5.17).
    for rng in ["bytes=256000-", "bytes=5-1", "bytes=-0", "bytes=x-1"]:
        g = get_att(d, d.writer, art, 1, Range=rng)
        problem(g, 416, "range-not-satisfiable")
        assert g.headers["Content-Range"] == f"bytes */{len(data)}", rng
    # An unknown unit is ignored, and several ranges get the whole file (RFC 9110 §14.2): 200.
    for rng in ["items=0-1", "bytes=0-1,5-6"]:
        g = get_att(d, d.writer, art, 1, Range=rng)
        assert (g.status_code, g.content) == (200, data), rng
        assert "Content-Range" not in g.headers
    # HEAD: the header a GET gets, no body; a reviewer's HEAD serves (and journals) nothing.
    h = requests.head(f"{d.base}/v1/claims/{art}/attachments/1", headers={"Authorization": f"Bearer {d.reviewer}"},
                      timeout=30)
    assert (h.status_code, h.headers["Content-Length"], h.content) == (200, str(len(data)), b"")
    assert h.headers["Repr-Digest"] == "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"
    h = requests.head(f"{d.base}/v1/claims/{art}/attachments/1", timeout=30,
                      headers={"Authorization": f"Bearer {d.reviewer}", "Range": "bytes=10-19"})
    assert (h.status_code, h.headers["Content-Length"], h.headers["Content-Range"]) == (206, "10", f"bytes 10-19/{len(data)}")
    h = requests.head(f"{d.base}/v1/claims/{art}", headers={"Authorization": f"Bearer {d.reviewer}"}, timeout=30)
    assert h.status_code == 200 and int(h.headers["Content-Length"]) > 0 and h.content == b""
    assert events(d, {"review.served"}) == []
    problem(get_att(d, d.writer, art, 2), 404, "attachment-not-found")
    # Held: another writer does not see it; a reviewer does.
    problem(get_att(d, d.writer2, art, 1), 404, "claim-not-found")
    assert get_att(d, d.reviewer, art, 1).content == data


def test_the_body_gate_flags_a_secret_in_the_body_and_no_body_or_file_reaches_the_outbox(served):
    d = served
    secret_file = b"-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n"
    body = f"key id {AWS_KEY} in a body"
    r = d.submit(d.writer, body=body, attachments=[upload(d, d.writer, secret_file, **{"content-type": "text/plain"})])
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["review"]["flags"] == ["deny-list"]
    assert doc["review"]["deny_list_hits"][0]["offset"] == body.index(AWS_KEY)
    sub = events(d, {"claim.submitted"})[-1][2]
    assert sub["review"] == doc["review"]
    clean = d.submit(d.writer, body="nothing to see").json()
    assert clean["review"]["flags"] == [] and clean["review"]["deny_list_hits"] == []
    # Containment: no outbox row holds a body or a file, in any encoding.
    needles = [body.encode(), secret_file, AWS_KEY.encode(), b"MIIEowIBAAKCAQEA"]
    with d.su() as c:
        rows = [bytes(r[0], "utf-8") for r in c.execute("SELECT row_data::text FROM oml.outbox").fetchall()]
    assert rows
    for text in rows:
        for n in needles:
            assert n not in text
            assert base64.b64encode(n) not in text
    # Nor the lake: drain everything into the Delta tables and scan every file under the lake
    # root (Parquet pages are snappy-compressed, so read them back with pyarrow as well).
    import pyarrow.parquet as pq
    from test_lakewriter import lakewriter
    lakewriter(d)
    files = [p for p in (d.home / "lake").rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files)
    for p in files:
        raw = p.read_bytes()
        texts = [raw] + ([repr(pq.read_table(p).to_pylist()).encode()] if p.suffix == ".parquet" else [])
        for text in texts:
            for n in needles:
                assert n not in text, p
                assert base64.b64encode(n) not in text, p


def test_a_large_body_lives_in_quarantine_and_follows_an_attachments_lifecycle(served):
    """One placement rule (sql/0015): a body whose ciphertext is above inline_body_max_bytes
    (64 KiB) is an object named by its ciphertext digest; a smaller one stays in PostgreSQL."""
    d = served
    small = d.submit(d.writer, body="s" * 1000).json()
    large_body = "".join(f"line {i}: the quick brown fox\n" for i in range(4000))  # ~124 KiB
    large = d.submit(d.writer, body=large_body).json()
    with d.su() as c:
        rows = dict((str(a), (loc, key, ct is None)) for a, loc, key, ct in c.execute(
            "SELECT artifact_id, location, object_key, ciphertext FROM oml.artifact_bodies").fetchall())
    assert rows[small["artifact_id"]] == ("postgres", None, False)
    key = f"{d.tenant_id}/{large['ciphertext_sha256']}"
    assert rows[large["artifact_id"]] == ("quarantine", key, True)
    assert objects(d, "oml-quarantine") == {large["ciphertext_sha256"]: large["ciphertext_sha256"]}
    # Read back through the object, digests checked.
    assert d.get(f"/v1/claims/{large['artifact_id']}", d.writer).json()["body"] == large_body
    # Promotion copies the same bytes to the bodies bucket; silver's body_location names it.
    assert d.get(f"/v1/claims/{large['artifact_id']}", d.reviewer).status_code == 200
    assert verdict(d, d.reviewer, large["artifact_id"], "accept").status_code == 200
    assert objects(d, "oml-quarantine") == {}
    assert objects(d, "oml-bodies") == {large["ciphertext_sha256"]: large["ciphertext_sha256"]}
    with d.su() as c:
        silver = c.execute("SELECT row_data FROM oml.outbox WHERE target_table = 'silver/claims' ORDER BY seq").fetchall()
    assert [r[0]["body_location"] for r in silver] == [f"bodies:{key}"]
    assert d.get(f"/v1/claims/{large['artifact_id']}", d.writer2).json()["body"] == large_body
    # Erasure by the operator's CLI (`oml erase`) shreds the key and deletes the object too.
    d.run("erase", "--tenant", "acme", large["artifact_id"], "--reason", "gdpr")
    assert objects(d, "oml-bodies") == {}
    problem(d.get(f"/v1/claims/{large['artifact_id']}", d.writer), 410, "erased")
    with d.su() as c:
        assert c.execute("SELECT location FROM oml.artifact_bodies WHERE artifact_id = %s",
                         (large["artifact_id"],)).fetchone()[0] == "none"
        silver = c.execute("SELECT row_data FROM oml.outbox WHERE target_table = 'silver/claims' ORDER BY seq").fetchall()
    # Silver's retract names where the body was, and that it is gone (docs/data/delta-tables.md).
    assert [(r[0]["body_location"], r[0]["state"]) for r in silver] == [(f"bodies:{key}", "promoted"),
                                                                       (f"none:{key}", "erased")]
    assert d.run("verify").stdout.startswith("OK")


def test_oml_erase_shreds_the_attachments_too(served):
    d = served
    data = b"attached and erased by the operator\n"
    art = d.submit(d.writer, attachments=[upload(d, d.writer, data)]).json()["artifact_id"]
    stored = list(objects(d, "oml-quarantine"))
    assert len(stored) == 1
    d.run("erase", "--tenant", "acme", art, "--reason", "operator")
    assert objects(d, "oml-quarantine") == {}
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.attachment_keys").fetchone()[0] == 0
    erased = events(d, {"artifact.erased"})[-1]
    assert (erased[1], erased[2]["attachments_ciphertext_sha256"]) == ("artifact.erased", stored)
    problem(get_att(d, d.writer, art, 1), 410, "erased")


def test_a_rejected_claim_is_erased_when_its_retention_ends(deployment):
    d = serve_with(deployment, {"OML_REJECTED_RETENTION_S": "3"})
    kept = d.submit(d.writer, body="held, never rejected").json()
    art = d.submit(d.writer, body="to be rejected", attachments=[upload(d, d.writer, b"rejected file")]).json()["artifact_id"]
    assert get_att(d, d.reviewer, art, 1).status_code == 200
    assert verdict(d, d.reviewer, art, "reject").status_code == 200
    assert len(objects(d, "oml-quarantine")) == 1  # kept in quarantine during the retention
    rejected_seq = events(d, {"claim.rejected"})[-1][0]
    deadline = time.time() + 15
    while time.time() < deadline and not events(d, {"artifact.erased"}):
        time.sleep(0.2)
    erased = events(d, {"artifact.erased"})
    assert len(erased) == 1
    seq, _, payload = erased[0]
    assert seq > rejected_seq and payload["artifact_id"] == art
    assert payload["reason"] == "retention: rejected, kept 3 s"
    with d.su() as c:
        principal = json.loads(bytes(c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                                               (d.tenant_id, seq)).fetchone()[0]))["principal"]
        assert c.execute("SELECT count(*) FROM oml.attachment_keys").fetchone()[0] == 0
    assert principal == "oml-retention"
    assert objects(d, "oml-quarantine") == {}
    problem(get_att(d, d.writer, art, 1), 410, "erased")
    # The held claim is untouched, and nothing is erased twice.
    time.sleep(3.5)
    assert len(events(d, {"artifact.erased"})) == 1
    assert d.get(f"/v1/claims/{kept['artifact_id']}", d.writer).status_code == 200
    assert d.run("verify").stdout.startswith("OK")


def restart(d, env=None):
    if d.server is not None and d.server.poll() is None:
        d.stop_server()
    else:
        d.server = None
        d.server_log.close()
    d.serve(env=env or {})


def test_any_size_is_served_whole_and_only_a_gapless_read_of_every_byte_counts_as_served(served):
    """No size needs Range any more (issue 19: responses are streamed; the 64 MiB
    attachment_serve_max_bytes cap is gone), a range is served whole, and a reviewer's range
    reads count as a serve only once they covered the file from byte 0 to its end without a gap:
    one byte per file is not a review."""
    d = served
    data = bytes(range(256)) * 800  # 204,800 bytes
    small = b"small enough to read whole"
    art = d.submit(d.writer, attachments=[upload(d, d.writer, data), upload(d, d.writer, small)]).json()["artifact_id"]
    g = get_att(d, d.writer, art, 1)
    assert (g.status_code, g.content) == (200, data)
    assert g.headers["Repr-Digest"] == "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"
    g = get_att(d, d.writer, art, 1, Range="bytes=0-")
    assert (g.status_code, g.headers["Content-Range"], g.content) == (206, f"bytes 0-204799/{len(data)}", data)
    g = get_att(d, d.writer, art, 1, Range="bytes=150000-")  # starts mid-file: decrypted from its segment
    assert (g.headers["Content-Range"], g.content) == (f"bytes 150000-204799/{len(data)}", data[150000:])
    # The reviewer: the last byte of each file, then a gap: no serve of file 1 is recorded.
    assert get_att(d, d.reviewer, art, 2).content == small  # whole read: served
    assert get_att(d, d.reviewer, art, 1, Range="bytes=-1").content == data[-1:]
    assert get_att(d, d.reviewer, art, 1, Range="bytes=0-99").content == data[:100]
    assert get_att(d, d.reviewer, art, 1, Range="bytes=200-300").status_code == 206  # a gap at 100..199
    assert [e[2]["item"] for e in events(d, {"review.served"})] == [2]
    assert "not served: 1" in problem(verdict(d, d.reviewer, art, "accept"), 409, "attachments-not-served")["detail"]
    # Reading on from the covered prefix, in ranges of 65536, serves it at the last byte.
    off = 100
    while off < len(data):
        g = get_att(d, d.reviewer, art, 1, Range=f"bytes={off}-{off + 65535}")
        assert g.status_code == 206 and g.content == data[off:off + 65536]
        off += len(g.content)
        served = [e[2]["item"] for e in events(d, {"review.served"})]
        assert served == ([2, 1] if off == len(data) else [2])
    assert verdict(d, d.reviewer, art, "accept").status_code == 200
    # In any order: 0-99, 200-end, 100-199 cover every byte: served at the third read.
    art = d.submit(d.writer, attachments=[upload(d, d.writer, data)]).json()["artifact_id"]
    for rng, served_after in (("0-99", False), ("200-", False), ("100-199", True)):
        assert get_att(d, d.reviewer, art, 1, Range=f"bytes={rng}").status_code == 206
        served = [e for e in events(d, {"review.served"}) if e[2].get("artifact_id") == art]
        assert len(served) == (1 if served_after else 0), rng
    assert verdict(d, d.reviewer, art, "accept").status_code == 200


def idle_readers(d, path, n, rcvbuf=4096):
    """n sockets that each send a GET of `path` (as the writer) and never read the answer."""
    import socket
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.writer}\r\n\r\n".encode())
        out.append(s)
    return out


def vm_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def server_held_connections(pid, port, client_ports):
    """Which of `client_ports` process `pid` still holds a connection from, on its `port`: the
    sockets in /proc/net/tcp from those ports to `port` whose inode is one of pid's descriptors
    (a socket the server closed has no descriptor; the kernel may still be sending its tail)."""
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                local, remote, inode = cols[1], cols[2], int(cols[9])
                if int(local.rsplit(":", 1)[1], 16) == port and int(remote.rsplit(":", 1)[1], 16) in client_ports:
                    if inode:
                        inodes[inode] = int(remote.rsplit(":", 1)[1], 16)
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
            held.add(inodes[int(link[8:-1])])
    return held


def test_idle_readers_hold_one_piece_each_and_a_large_file_reads_back_exact(served):
    """Issue 19: each GET of a 64 MiB attachment held ~76 MiB until the client read it; 24
    sockets that never read took the server from 105 MiB to 1.9 GiB. Responses are streamed: 24
    idle readers of a 64 MiB file grow VmHWM and VmRSS by at most 64 MiB while held, and the
    server cuts each at the request deadline (http_request_timeout_ms, also the limit of one
    write): not before it, within a margin after it, and the reader then gets EOF or a reset, not
    a read of its own that times out. A 1 GiB file reads back exact, with its Repr-Digest."""
    import socket
    deadline_s = 3.0
    d = served
    d.stop_server()
    d.serve(env={"OML_HTTP_REQUEST_TIMEOUT_MS": str(int(deadline_s * 1000))})
    data = os.urandom(64 << 20)
    uid = new_upload(d, d.writer, data)
    assert upload_all(d, d.writer, uid, data, chunk=6 << 20) == len(data)
    art = d.submit(d.writer, body="big", attachments=[uid]).json()["artifact_id"]
    del data
    time.sleep(0.5)
    pid = d.server.pid
    before_hwm, before_rss = vm_hwm_kib(pid), vm_kib(pid, "VmRSS")
    t0 = time.monotonic()  # no reader's write deadline can pass before t0 + deadline_s
    # A 256 KiB receive buffer: with 4 KiB, loopback segments overflow it, and the tail of a cut
    # connection reaches the reader only at the sender's backed-off retransmissions (~100 s).
    idle = idle_readers(d, f"/v1/claims/{art}/attachments/1", 24, rcvbuf=256 << 10)
    ports = {s.getsockname()[1] for s in idle}
    assert len(ports) == 24
    time.sleep(1.5)  # every response started and filled its socket buffers; none is due yet
    assert server_held_connections(pid, d.port, ports) == ports
    grown_hwm = (vm_hwm_kib(pid) - before_hwm) / 1024
    held_rss = (vm_kib(pid, "VmRSS") - before_rss) / 1024
    print(f"24 idle readers of a 64 MiB file: VmHWM +{grown_hwm:.1f} MiB, VmRSS +{held_rss:.1f} MiB while held")
    assert grown_hwm <= 64, grown_hwm
    assert held_rss <= 64, held_rss
    # The server cuts each idle reader at the deadline: none before it, all within 3 s after.
    cut_at = {}
    while len(cut_at) < len(ports):
        now = time.monotonic() - t0
        held = server_held_connections(pid, d.port, ports)
        for p in ports - held - set(cut_at):
            cut_at[p] = now
        assert now < deadline_s + 3.0, f"still held {now:.1f} s after the readers came: {sorted(held)}"
        time.sleep(0.05)
    print(f"cut {min(cut_at.values()):.2f}..{max(cut_at.values()):.2f} s after the readers came")
    assert min(cut_at.values()) >= deadline_s, sorted(cut_at.values())
    # Each reader then reads what the kernel still had for it and meets the end the server made
    # (EOF, or a reset) within the margin: its own read never times out, and it never gets the
    # whole file.
    for s in idle:
        s.settimeout(10)
        total = 0
        ended = None
        try:
            while True:
                b = s.recv(1 << 20)
                if not b:
                    ended = "eof"
                    break
                total += len(b)
        except ConnectionResetError:
            ended = "reset"
        except socket.timeout:
            raise AssertionError(f"the reader timed out after {total} bytes: the server never ended it")
        finally:
            s.close()
        assert ended in ("eof", "reset")
        assert total < (64 << 20), total
        assert time.monotonic() - t0 < deadline_s + 4.0
    # A large file reads back exact, streamed.
    big = os.urandom(1 << 30)
    uid = new_upload(d, d.writer, big)
    assert upload_all(d, d.writer, uid, big, chunk=6 << 20) == len(big)
    art = d.submit(d.writer, body="bigger", attachments=[uid]).json()["artifact_id"]
    h = hashlib.sha256()
    n = 0
    with requests.get(f"{d.base}/v1/claims/{art}/attachments/1", stream=True, timeout=120,
                      headers={"Authorization": f"Bearer {d.writer}"}) as r:
        assert r.status_code == 200
        assert r.headers["Content-Length"] == str(len(big))
        for chunk in r.iter_content(1 << 20):
            h.update(chunk)
            n += len(chunk)
        digest = r.headers["Repr-Digest"]
    assert n == len(big)
    assert h.digest() == hashlib.sha256(big).digest()
    assert digest == "sha-256=:" + base64.b64encode(h.digest()).decode() + ":"


def test_a_large_body_is_streamed_to_idle_readers_in_constant_memory_and_reads_back_exact(served):
    """Issue 19: bodies too. A 32 MiB body (kept as an object, sql/0015) is sent piece by piece:
    24 sockets that never read grow VmHWM by at most 64 MiB (it was ~32 MiB each, plus its
    escaped JSON); the JSON reads back equal to the body, with an exact Content-Length, "body" its
    last key; HEAD has the same length; a damaged object is 500 integrity before any header."""
    d = served
    d.stop_server()
    d.serve(env={"OML_HTTP_REQUEST_TIMEOUT_MS": "5000", "OML_MAX_BODY_BYTES": str(40 << 20)})
    line = 'line "quoted" \\ back\ttab é€ 😀\n'
    body = (line * ((32 << 20) // len(line.encode())))
    r = d.submit(d.writer, body=body)
    assert r.status_code == 201, r.text[:500]
    doc = r.json()
    art = doc["artifact_id"]
    obj = quarantine_object(d, doc["ciphertext_sha256"])
    assert obj.stat().st_size > (32 << 20) - 4096  # kept as an object, not in PostgreSQL
    time.sleep(0.5)
    # The submission's own peak (the request and its ciphertext) sets VmHWM above what the readers
    # need; the resident size they add while held is what a non-streamed body would show (24 x
    # the body and its escaped JSON, about 1.5 GiB).
    before_hwm, before_rss = vm_hwm_kib(d.server.pid), vm_kib(d.server.pid, "VmRSS")
    idle = idle_readers(d, f"/v1/claims/{art}", 24)
    time.sleep(4)  # every response made its first pass, started, and filled its socket buffers
    grown_hwm = (vm_hwm_kib(d.server.pid) - before_hwm) / 1024
    held_rss = (vm_kib(d.server.pid, "VmRSS") - before_rss) / 1024
    for s in idle:
        s.close()
    print(f"24 idle readers of a 32 MiB body: VmHWM +{grown_hwm:.1f} MiB, VmRSS +{held_rss:.1f} MiB while held")
    assert grown_hwm <= 64, grown_hwm
    assert held_rss <= 64, held_rss
    with requests.get(f"{d.base}/v1/claims/{art}", timeout=120, headers={"Authorization": f"Bearer {d.writer}"}) as g:
        assert g.status_code == 200
        assert g.headers["Content-Type"] == "application/json"
        assert int(g.headers["Content-Length"]) == len(g.content)
        got = g.json()
    assert got["body"] == body
    assert list(got)[-1] == "body"
    assert (got["artifact_id"], got["plaintext_sha256"], got["attachments"]) == (art, doc["plaintext_sha256"], [])
    h = requests.head(f"{d.base}/v1/claims/{art}", timeout=120, headers={"Authorization": f"Bearer {d.writer}"})
    assert h.status_code == 200 and h.content == b""
    assert h.headers["Content-Length"] == g.headers["Content-Length"]
    # A byte flipped in the object's last segment: the first pass finds it, nothing is sent but a problem.
    raw = bytearray(obj.read_bytes())
    raw[-5] ^= 0x01
    obj.write_bytes(bytes(raw))
    problem(requests.get(f"{d.base}/v1/claims/{art}", timeout=120, headers={"Authorization": f"Bearer {d.writer}"}),
            500, "integrity")


def quarantine_object(d, ciphertext_sha256_hex):
    return d.home / "objects" / "oml-quarantine" / d.tenant_id / ciphertext_sha256_hex


def test_a_served_row_without_its_signed_event_does_not_count(served):
    d = served
    art = d.submit(d.writer, attachments=[upload(d, d.writer, b"forged serve")]).json()["artifact_id"]
    problem(verdict(d, d.reviewer, art, "accept"), 409, "attachments-not-served")
    with d.app() as c:  # the application's role, as a compromised server or operator would write
        c.execute("SELECT set_config('oml.tenant_id', %s, false)", (d.tenant_id,))
        c.execute("INSERT INTO oml.review_served VALUES (%s, %s, 1, 1, 'rita', 1)", (d.tenant_id, art))
    problem(verdict(d, d.reviewer, art, "accept"), 409, "attachments-not-served")
    assert events(d, {"review.served"}) == []
    # The real serve is journalled all the same (the forged row does not pass for it), and counts.
    assert get_att(d, d.reviewer, art, 1).status_code == 200
    served = events(d, {"review.served"})
    assert [(e[2]["artifact_id"], e[2]["item"]) for e in served] == [(art, 1)]
    with d.su() as c:
        assert c.execute("SELECT served_seq FROM oml.review_served").fetchone()[0] == served[0][0]
    assert verdict(d, d.reviewer, art, "accept").status_code == 200


def test_a_crashed_accept_leaves_no_copy_in_bodies_after_the_claim_is_erased(deployment):
    d = serve_with(deployment, {"OML_REJECTED_RETENTION_S": "1"})
    art = d.submit(d.writer, attachments=[upload(d, d.writer, os.urandom(100000))]).json()["artifact_id"]
    assert get_att(d, d.reviewer, art, 1).status_code == 200
    restart(d, {"OML_FAULT": "journal.after_journal_insert:kill", "OML_REJECTED_RETENTION_S": "1"})
    with pytest.raises(requests.ConnectionError):
        verdict(d, d.reviewer, art, "accept")
    d.server.wait(timeout=10)
    restart(d, {"OML_REJECTED_RETENTION_S": "1"})
    assert d.get(f"/v1/claims/{art}", d.reviewer).json()["state"] == "held"
    assert len(objects(d, "oml-bodies")) == 1  # the crash came between the copy and the commit
    assert verdict(d, d.reviewer, art, "reject").status_code == 200
    deadline = time.time() + 15
    while time.time() < deadline and not events(d, {"artifact.erased"}):
        time.sleep(0.2)
    assert events(d, {"artifact.erased"})
    assert objects(d, "oml-quarantine") == {} and objects(d, "oml-bodies") == {}


def wait_healthy(port, proc, name, timeout=30):
    """Waits until a second `oml serve` (process `proc`) answers /v1/health on `port`."""
    deadline = time.time() + timeout
    while True:
        try:
            requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=1)
            return
        except requests.ConnectionError:
            assert proc.poll() is None and time.time() < deadline, f"{name} did not come up"
            time.sleep(0.05)


@pytest.mark.parametrize("what", ["attachment", "large-body"])
def test_two_accepts_of_one_claim_never_lose_its_files(served, what):
    """Issue 19: two accepts of one held claim (a double click, two servers). Server B's accept is
    held between its journal insert and its commit (OML_FAULT=journal.after_journal_insert:stop,
    holding the chain lock); server A's accept copies to the same content-addressed bodies keys
    and then waits for the lock. B commits and drops the quarantine copies; A loses the state
    change (409). Before the fix A then deleted the bodies copies on its stale view: B's only
    copies, so the promoted claim's file was gone (500 "object ... is missing").
    SIGSTOP lands a moment after the point: when B's COMMIT slipped through before it (the claim
    is promoted already), the attempt is made again on a new claim."""
    import signal
    import subprocess
    import threading
    from conftest import OML_BIN, free_port
    from test_uploads import wait_stopped
    d = served
    for attempt in range(5):
        if what == "attachment":
            data = os.urandom(300_000)
            art = d.submit(d.writer, body=f"with a file {attempt}", attachments=[upload(d, d.writer, data)]).json()
            assert get_att(d, d.reviewer, art["artifact_id"], 1).content == data
        else:
            body = f"attempt {attempt}\n" + "".join(f"line {i}: the quick brown fox\n" for i in range(4000))
            art = d.submit(d.writer, body=body).json()  # ~124 KiB: an object
            assert d.get(f"/v1/claims/{art['artifact_id']}", d.reviewer).json()["body"] == body
        aid = art["artifact_id"]
        held = {k: v for k, v in objects(d, "oml-quarantine").items()}
        assert len(held) == 1
        bodies_before = dict(objects(d, "oml-bodies"))
        pb = free_port()
        env_b = dict(d.env, OML_LISTEN=f"127.0.0.1:{pb}", OML_METRICS_LISTEN=f"127.0.0.1:{free_port()}",
                     OML_FAULT="journal.after_journal_insert:stop")
        b = subprocess.Popen([OML_BIN, "serve"], env=env_b, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        answers = {}
        reproduced = False
        try:
            wait_healthy(pb, b, "server B")
            tb = threading.Thread(target=lambda: answers.__setitem__("b", requests.post(
                f"http://127.0.0.1:{pb}/v1/claims/{aid}/verdict", json={"verdict": "accept"}, timeout=60,
                headers={"Authorization": f"Bearer {d.reviewer}"})), daemon=True)
            tb.start()
            wait_stopped(b.pid)
            with d.su() as c:
                state = c.execute("SELECT state FROM oml.artifacts WHERE artifact_id = %s", (aid,)).fetchone()[0]
            if state == "held":
                reproduced = True
                ta = threading.Thread(target=lambda: answers.__setitem__("a", verdict(d, d.reviewer, aid, "accept")),
                                      daemon=True)
                ta.start()
                # A copied to bodies and now waits for the chain lock B holds.
                deadline = time.time() + 30
                with d.su() as c:
                    while c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND wait_event = 'advisory'").fetchone()[0] == 0:
                        if "a" in answers:
                            # A answered without waiting. Only one cause is not a defect: B's whole
                            # transaction was on the wire when the stop landed (another of B's threads
                            # reached the point first), so B's promotion committed while B is stopped.
                            now = c.execute("SELECT state FROM oml.artifacts WHERE artifact_id = %s",
                                            (aid,)).fetchone()[0]
                            assert now == "promoted" and answers["a"].status_code == 409, \
                                f"server A answered {answers['a'].status_code} {answers['a'].text} with the claim {now}"
                            reproduced = False
                            break
                        assert time.time() < deadline, f"server A's accept never waited for the chain lock: {answers}"
                        time.sleep(0.05)
            os.kill(b.pid, signal.SIGCONT)
            tb.join(timeout=60)
            if reproduced:
                ta.join(timeout=60)
        finally:
            os.kill(b.pid, signal.SIGCONT)
            b.terminate()
            b.wait()
        if reproduced:
            break
    else:
        raise AssertionError("server B's accept committed before its stop in every attempt")
    assert answers["b"].status_code == 200, answers["b"].text
    problem(answers["a"], 409, "claim-not-held")
    # The winner's copies are where the committed state says, whole.
    assert objects(d, "oml-quarantine") == {}
    assert objects(d, "oml-bodies") == {**bodies_before, **held}
    if what == "attachment":
        r = get_att(d, d.writer2, aid, 1)
        assert r.status_code == 200, r.text
        assert r.content == data
    else:
        r = d.get(f"/v1/claims/{aid}", d.writer2)
        assert r.status_code == 200, r.text
        assert r.json()["body"] == body
    with d.su() as c:
        n = c.execute("SELECT count(*) FROM oml.journal j WHERE tenant_id = %s AND event_type = 'claim.promoted' "
                      "AND convert_from(signed_bytes, 'UTF8')::jsonb->'payload'->>'artifact_id' = %s",
                      (d.tenant_id, aid)).fetchone()[0]
    assert n == 1


@pytest.mark.parametrize("what", ["attachment", "large-body"])
def test_an_accept_whose_copy_finds_the_quarantine_copy_gone_answers_409_and_loses_nothing(served, what):
    """Issue 19, two accepts of one claim, the other ordering: server A's accept has read the
    claim (held, its file in quarantine) and is stopped before it copies the file to the bodies
    bucket (OML_FAULT=claims.accept.before_copy:stop). Server B's accept of the same claim runs
    whole meanwhile: it copies, commits and drops the quarantine copy. A goes on; its copy finds
    the quarantine object gone, and A answers as the act that came second (409 claim-not-held)
    and deletes nothing: the file reads back exact, through either server.
    SIGSTOP lands a moment after the point (kill(getpid()) wakes another thread to stop the
    process). The file is 20 MiB, so A's copy writes an 8 MiB part to its staging file before it
    reads past the first range: a staging file still empty when A is stopped proves A has more of
    the quarantine object to read. Otherwise the attempt is made again on a new claim."""
    import signal
    import subprocess
    import threading
    from conftest import OML_BIN, free_port
    from test_uploads import staging_files, wait_stopped
    d = served
    big_env = {"OML_MAX_BODY_BYTES": str(24 << 20)}
    d.stop_server()
    d.serve(env=big_env)
    for attempt in range(3):
        q_before = dict(objects(d, "oml-quarantine"))
        if what == "attachment":
            data = os.urandom(20 << 20)
            uid = new_upload(d, d.writer, data)
            assert upload_all(d, d.writer, uid, data, chunk=6 << 20) == len(data)
            aid = d.submit(d.writer, body=f"with a file {attempt}", attachments=[uid]).json()["artifact_id"]
            assert get_att(d, d.reviewer, aid, 1).content == data
        else:
            body = f"attempt {attempt}\n" + "".join(f"line {i}: the quick brown fox\n" for i in range(20 << 15))
            r = d.submit(d.writer, body=body)
            assert r.status_code == 201, r.text[:300]
            aid = r.json()["artifact_id"]
            assert d.get(f"/v1/claims/{aid}", d.reviewer).json()["body"] == body
        held = {k: v for k, v in objects(d, "oml-quarantine").items() if k not in q_before}
        assert len(held) == 1
        (key,) = held
        bodies_before = dict(objects(d, "oml-bodies"))
        before = head_seq(d)
        pa = free_port()
        env_a = dict(d.env, **big_env, OML_LISTEN=f"127.0.0.1:{pa}", OML_METRICS_LISTEN=f"127.0.0.1:{free_port()}",
                     OML_FAULT="claims.accept.before_copy:stop")
        a = subprocess.Popen([OML_BIN, "serve"], env=env_a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        answers = {}
        try:
            wait_healthy(pa, a, "server A")
            ta = threading.Thread(target=lambda: answers.__setitem__("a", requests.post(
                f"http://127.0.0.1:{pa}/v1/claims/{aid}/verdict", json={"verdict": "accept"}, timeout=60,
                headers={"Authorization": f"Bearer {d.reviewer}"})), daemon=True)
            ta.start()
            wait_stopped(a.pid)
            staging = [p for p in staging_files(bucket(d, "oml-bodies")) if p.name.startswith(key + "#")]
            reproduced = key not in objects(d, "oml-bodies") and all(p.stat().st_size == 0 for p in staging)
            if reproduced:
                assert objects(d, "oml-quarantine") == {**q_before, **held}
                # B (the fixture's server) accepts the same claim meanwhile, whole.
                b = verdict(d, d.reviewer, aid, "accept")
                assert b.status_code == 200, b.text
                assert objects(d, "oml-quarantine") == q_before
                settled = {k: v for k, v in objects(d, "oml-bodies").items() if k not in {p.name for p in staging}}
                assert settled == {**bodies_before, **held}
            os.kill(a.pid, signal.SIGCONT)
            ta.join(timeout=60)
            assert not ta.is_alive(), "server A never answered"
            if reproduced:
                problem(answers["a"], 409, "claim-not-held")
                # The file is where the committed state says, whole, read through either server.
                assert objects(d, "oml-quarantine") == q_before
                assert objects(d, "oml-bodies") == {**bodies_before, **held}
                # A's aborted copy left no staging file (in the buckets it wrote: the heads
                # publisher's own staging file may be caught mid-rename in oml-heads).
                assert staging_files(bucket(d, "oml-bodies").parent) + staging_files(bucket(d, "oml-quarantine").parent) == []
                for base in (d.base, f"http://127.0.0.1:{pa}"):
                    h = {"Authorization": f"Bearer {d.writer2}"}
                    if what == "attachment":
                        r = requests.get(f"{base}/v1/claims/{aid}/attachments/1", timeout=60, headers=h)
                        assert (r.status_code, r.content == data) == (200, True), (base, r.status_code, r.text[:300])
                    else:
                        r = requests.get(f"{base}/v1/claims/{aid}", timeout=60, headers=h)
                        assert r.status_code == 200, (base, r.text[:300])
                        assert (r.json()["state"], r.json()["body"] == body) == ("promoted", True)
        finally:
            if a.poll() is None:
                os.kill(a.pid, signal.SIGCONT)
                a.terminate()
                a.wait(timeout=20)
        if reproduced:
            break
    else:
        raise AssertionError("server A's copy had started before its stop in every attempt")
    # One act was signed for the two accepts: B's claim.promoted, the only event after `before`.
    assert [(t, p["artifact_id"]) for seq, t, p in events(d) if seq > before] == [("claim.promoted", aid)]


def make_pdf(pages, shared_stream=None):
    """A minimal PDF 1.4: each entry of `pages` is a list of lines drawn in Helvetica. With
    `shared_stream` (bytes, FlateDecode'd here), every page's /Contents is that one stream."""
    import zlib
    objs = ["<< /Type /Catalog /Pages 2 0 R >>"]
    n = len(pages)
    font = 3 + 2 * n + (1 if shared_stream is not None else 0)
    shared = 3 + 2 * n
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>")
    for i, lines in enumerate(pages):
        contents = shared if shared_stream is not None else 4 + 2 * i
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 {font} 0 R >> >> "
                    f"/Contents {contents} 0 R >>")
        text = "BT /F1 12 Tf 14 TL 72 720 Td " + " ".join(f"({ln}) Tj T*" for ln in lines) + " ET"
        objs.append(f"<< /Length {len(text)} >>\nstream\n{text}\nendstream".encode("latin-1"))
    if shared_stream is not None:
        z = zlib.compress(shared_stream, 9)
        objs.append(f"<< /Length {len(z)} /Filter /FlateDecode >>\nstream\n".encode() + z + b"\nendstream")
    objs.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objs):
        offsets.append(len(out))
        out += f"{i + 1} 0 obj\n".encode() + (body if isinstance(body, bytes) else body.encode("latin-1")) + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def test_a_pdf_bomb_hits_its_limits_in_a_child_and_never_stalls_another_tenant(served):
    """Issue 19: a small PDF whose 30 pages share one ~80 MB content stream took 70 s in the
    server, behind a process-wide poppler mutex that another tenant's 3-line PDF waited on. Now
    each PDF is extracted in a child process with CPU, memory and wall-clock limits and a bound per
    tenant: the bomb's review says not-extracted (limit: cpu), flagged for the reviewer, and the
    other tenant's small PDF, submitted while the bomb is being extracted, answers within a
    second with its text reviewed."""
    import threading
    d = served
    d.stop_server()
    d.serve(env={"OML_PDF_EXTRACT_CPU_S": "2", "OML_PDF_EXTRACT_TIMEOUT_S": "8"})
    d.tenant("beta")
    beta = d.api_key("beta", "writer", "bob")
    stream = b"BT /F1 12 Tf 72 720 Td (bomb bomb bomb bomb) Tj ET\n" * 1_600_000  # ~80 MB
    bomb = make_pdf([["page"]] * 30, shared_stream=stream)
    assert len(bomb) < 400_000
    small = make_pdf([["first line of a small pdf", "second line", "third line"]])
    bomb_upload = upload(d, d.writer, bomb, **{"content-type": "application/pdf"})
    small_upload = upload(d, beta, small, **{"content-type": "application/pdf"})
    answers = {}
    t = threading.Thread(target=lambda: answers.__setitem__("bomb", d.submit(d.writer, body="a bomb",
                                                                            attachments=[bomb_upload])))
    t0 = time.time()
    t.start()
    # The bomb's child is running (its CPU clock is ticking) when the other tenant submits.
    def extractors():
        out = []
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and b"__extract-pdf" in open(f"/proc/{p}/cmdline", "rb").read():
                    out.append(int(p))
            except OSError:
                pass
        return out
    deadline = time.time() + 10
    while not extractors():
        assert time.time() < deadline, "the bomb's extractor never started"
        time.sleep(0.02)
    # The child holds none of the server's sockets and no environment (no secrets, no tokens).
    child = extractors()[0]
    try:
        links = [os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")]
        assert not [x for x in links if x.startswith("socket:")], links
        assert open(f"/proc/{child}/environ", "rb").read() == b""
    except FileNotFoundError:
        pass  # it ended meanwhile
    s0 = time.time()
    r = d.submit(beta, body="a small pdf", attachments=[small_upload])
    small_secs = time.time() - s0
    assert r.status_code == 201, r.text
    assert small_secs < 1.0, small_secs
    t.join(timeout=60)
    assert answers["bomb"].status_code == 201, answers["bomb"].text
    assert not t.is_alive() and time.time() - t0 < 15
    attach = {e[2]["upload_id"]: e[2] for e in events_all(d) if e[1] == "submission.attach"}
    small_review = attach[small_upload]["review"]
    assert (small_review["method"], small_review["flags"]) == ("pdf", [])
    bomb_review = attach[bomb_upload]["review"]
    assert bomb_review["method"] == "pdf-limit"
    assert bomb_review["flags"] == ["not-extracted"]
    assert "not-extracted: limit: cpu 2 s" in bomb_review["notes"]
    # The reviewer sees it on the claim, and a verdict records it ("attachment 1:not-extracted").
    art = answers["bomb"].json()["artifact_id"]
    shown = d.get(f"/v1/claims/{art}", d.reviewer).json()
    assert shown["attachments"][0]["review"]["flags"] == ["not-extracted"], shown


def test_a_tenants_pdfs_beyond_its_bound_are_503_busy_while_another_tenant_goes_on(served):
    """Issue 19: at most pdf_extract_per_tenant of one tenant's PDFs are extracted at once. A
    second PDF of that tenant, while its first is extracted, gets no slot within half a second:
    503 pdf-extraction-busy with Retry-After, nothing journalled, its upload still attachable;
    another tenant's PDF at the same moment is answered within a second. The retry succeeds."""
    import threading
    d = served
    d.stop_server()
    d.serve(env={"OML_PDF_EXTRACT_CPU_S": "3", "OML_PDF_EXTRACT_TIMEOUT_S": "10", "OML_PDF_EXTRACT_PER_TENANT": "1"})
    d.tenant("beta")
    beta = d.api_key("beta", "writer", "bob")
    stream = b"BT /F1 12 Tf 72 720 Td (bomb bomb bomb bomb) Tj ET\n" * 1_600_000
    bomb = make_pdf([["page"]] * 30, shared_stream=stream)
    second = make_pdf([["the same tenant's second pdf"]])
    small = make_pdf([["another tenant's pdf"]])
    bomb_upload = upload(d, d.writer, bomb, **{"content-type": "application/pdf"})
    second_upload = upload(d, d.writer, second, **{"content-type": "application/pdf"})
    small_upload = upload(d, beta, small, **{"content-type": "application/pdf"})
    answers = {}
    t = threading.Thread(target=lambda: answers.__setitem__("bomb", d.submit(d.writer, body="a bomb",
                                                                            attachments=[bomb_upload])))
    t.start()
    deadline = time.time() + 10
    while not any(p.isdigit() and b"__extract-pdf" in _cmdline(p) for p in os.listdir("/proc")):
        assert time.time() < deadline, "the bomb's extractor never started"
        time.sleep(0.02)
    before = head_seq(d)
    s0 = time.time()
    busy = d.submit(d.writer, body="the second pdf", attachments=[second_upload])
    busy_secs = time.time() - s0
    problem(busy, 503, "pdf-extraction-busy")
    assert busy.headers["Retry-After"] == "1"
    assert 0.4 < busy_secs < 2.0, busy_secs
    s0 = time.time()
    r = d.submit(beta, body="beta's pdf", attachments=[small_upload])
    assert r.status_code == 201, r.text
    assert time.time() - s0 < 1.0
    t.join(timeout=60)
    assert answers["bomb"].status_code == 201, answers["bomb"].text
    # Nothing of the refused submission was journalled in acme's chain but the bomb's claim.
    types = [e[1] for e in events(d) if e[0] > before]
    assert types.count("claim.submitted") == 1 and types.count("submission.attach") == 1, types
    # The retry, now that acme's slot is free, takes the same upload.
    r = d.submit(d.writer, body="the second pdf", attachments=[second_upload])
    assert r.status_code == 201, r.text
    attach = {e[2]["upload_id"]: e[2] for e in events_all(d) if e[1] == "submission.attach"}
    assert attach[second_upload]["review"]["method"] == "pdf"
    assert attach[bomb_upload]["review"]["method"] == "pdf-limit"


def pdf_extractors(server_pid):
    """The pids of `oml __extract-pdf` children of the server `server_pid`."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or b"__extract-pdf" not in _cmdline(p):
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == server_pid:
                    out.append(int(p))
        except OSError:
            pass
    return out


def pdf_bomb():
    """30 pages sharing one ~80 MB content stream, ~200 KB on disk (issue 19): minutes of CPU."""
    stream = b"BT /F1 12 Tf 72 720 Td (bomb bomb bomb bomb) Tj ET\n" * 1_600_000
    return make_pdf([["page"]] * 30, shared_stream=stream)


def attach_reviews(d):
    """upload_id -> the review signed in its submission.attach event, every tenant."""
    return {e[2]["upload_id"]: e[2]["review"] for e in events_all(d) if e[1] == "submission.attach"}


def test_a_pdf_that_outgrows_its_address_space_is_reviewed_as_the_memory_limit(served):
    """Issue 19: the memory limit of an extraction (pdf_extract_memory_mb, RLIMIT_AS of the
    child), with CPU and wall clock to spare. The bomb's text layout grows until poppler's
    allocator fails and aborts: pdf-limit, not-extracted, "not-extracted: limit: memory 224 MiB
    (the extractor aborted)". Under the same limit another tenant's small PDF is extracted (the
    extractor itself needs ~151 MiB of address space, so the limit is the bomb's, not a floor)."""
    d = served
    d.stop_server()
    d.serve(env={"OML_PDF_EXTRACT_MEMORY_MB": "224", "OML_PDF_EXTRACT_CPU_S": "600", "OML_PDF_EXTRACT_TIMEOUT_S": "60"})
    d.tenant("beta")
    beta = d.api_key("beta", "writer", "bob")
    bomb_upload = upload(d, d.writer, pdf_bomb(), **{"content-type": "application/pdf"})
    small_upload = upload(d, beta, make_pdf([["beta's small pdf"]]), **{"content-type": "application/pdf"})
    t0 = time.monotonic()
    r = d.submit(d.writer, body="a bomb", attachments=[bomb_upload])
    secs = time.monotonic() - t0
    assert r.status_code == 201, r.text
    assert secs < 30, secs  # the memory limit, long before the wall clock
    assert d.submit(beta, body="beta's pdf", attachments=[small_upload]).status_code == 201
    reviews = attach_reviews(d)
    review = reviews[bomb_upload]
    assert (review["method"], review["review"], review["flags"]) == ("pdf-limit", "opaque", ["not-extracted"]), review
    assert review["notes"] == ["not-extracted: limit: memory 224 MiB (the extractor aborted)"], review
    small = reviews[small_upload]
    assert (small["method"], small["flags"], small["notes"]) == ("pdf", [], []), small


def test_a_pdf_whose_parse_throws_bad_alloc_under_the_memory_limit_is_reviewed_as_the_memory_limit(served):
    """Issue 19: the other way the memory limit shows. One 300 MB string in a content stream
    (~300 KB deflated) makes poppler's lexer grow a std::string until the allocation throws
    std::bad_alloc under RLIMIT_AS. That is the memory limit too, and the review must say so
    (pdf-limit, "not-extracted: limit: memory 224 MiB"), not pdf-unreadable."""
    d = served
    d.stop_server()
    d.serve(env={"OML_PDF_EXTRACT_MEMORY_MB": "224", "OML_PDF_EXTRACT_CPU_S": "600", "OML_PDF_EXTRACT_TIMEOUT_S": "60"})
    bomb = make_pdf([["page"]], shared_stream=b"BT /F1 12 Tf 72 720 Td (" + b"a" * (300 << 20) + b") Tj ET\n")
    assert len(bomb) < 400_000
    bomb_upload = upload(d, d.writer, bomb, **{"content-type": "application/pdf"})
    r = d.submit(d.writer, body="a string bomb", attachments=[bomb_upload])
    assert r.status_code == 201, r.text
    review = attach_reviews(d)[bomb_upload]
    assert (review["method"], review["flags"]) == ("pdf-limit", ["not-extracted"]), review
    assert review["notes"][0].startswith("not-extracted: limit: memory 224 MiB"), review


def test_a_pdf_that_outlasts_its_wall_clock_is_killed_at_it_and_reviewed_as_a_time_limit(served):
    """Issue 19: the wall-clock limit of an extraction (pdf_extract_timeout_s), with CPU and memory
    to spare: the parent kills the child at the deadline and reaps it, and the review says so
    (pdf-limit, not-extracted, "not-extracted: limit: time 2 s"). The claim is answered a moment
    after the deadline, not when the bomb would have ended (minutes of CPU)."""
    d = served
    d.stop_server()
    d.serve(env={"OML_PDF_EXTRACT_CPU_S": "600", "OML_PDF_EXTRACT_TIMEOUT_S": "2"})
    bomb_upload = upload(d, d.writer, pdf_bomb(), **{"content-type": "application/pdf"})
    t0 = time.monotonic()
    r = d.submit(d.writer, body="a bomb", attachments=[bomb_upload])
    secs = time.monotonic() - t0
    assert r.status_code == 201, r.text
    assert 2.0 <= secs < 4.0, secs
    assert pdf_extractors(d.server.pid) == []  # killed and reaped
    review = attach_reviews(d)[bomb_upload]
    assert (review["method"], review["review"], review["flags"]) == ("pdf-limit", "opaque", ["not-extracted"]), review
    assert review["notes"] == ["not-extracted: limit: time 2 s"], review
    art = r.json()["artifact_id"]
    assert d.get(f"/v1/claims/{art}", d.reviewer).json()["attachments"][0]["review"]["flags"] == ["not-extracted"]


def test_pdfs_beyond_the_global_bound_are_503_busy_for_every_tenant(served):
    """Issue 19: at most pdf_extract_max PDFs are extracted at once, all tenants together. With
    one slot, taken by acme's bomb, another tenant's small PDF (none of its own running) gets no
    slot within half a second: 503 pdf-extraction-busy with Retry-After: 1, nothing journalled in
    its chain. Once the bomb's extraction ended (at its wall clock), the retry is extracted."""
    import threading
    d = served
    d.stop_server()
    d.serve(env={"OML_PDF_EXTRACT_MAX": "1", "OML_PDF_EXTRACT_PER_TENANT": "1", "OML_PDF_EXTRACT_CPU_S": "600",
                 "OML_PDF_EXTRACT_TIMEOUT_S": "4"})
    beta_id = d.tenant("beta")
    beta = d.api_key("beta", "writer", "bob")
    bomb_upload = upload(d, d.writer, pdf_bomb(), **{"content-type": "application/pdf"})
    small_upload = upload(d, beta, make_pdf([["beta's small pdf"]]), **{"content-type": "application/pdf"})
    with d.su() as c:
        beta_head = c.execute("SELECT max(seq) FROM oml.journal WHERE tenant_id = %s", (beta_id,)).fetchone()[0]
    answers = {}
    t = threading.Thread(target=lambda: answers.__setitem__("bomb", d.submit(d.writer, body="a bomb",
                                                                            attachments=[bomb_upload])))
    t.start()
    deadline = time.time() + 10
    while not pdf_extractors(d.server.pid):
        assert time.time() < deadline, "the bomb's extractor never started"
        time.sleep(0.02)
    s0 = time.monotonic()
    busy = d.submit(beta, body="beta's pdf", attachments=[small_upload])
    busy_secs = time.monotonic() - s0
    problem(busy, 503, "pdf-extraction-busy")
    assert busy.headers["Retry-After"] == "1"
    assert 0.4 < busy_secs < 2.0, busy_secs
    assert t.is_alive()  # the slot was the bomb's all along
    with d.su() as c:
        assert c.execute("SELECT max(seq) FROM oml.journal WHERE tenant_id = %s", (beta_id,)).fetchone()[0] == beta_head
    t.join(timeout=60)
    assert answers["bomb"].status_code == 201, answers["bomb"].text
    r = d.submit(beta, body="beta's pdf", attachments=[small_upload])
    assert r.status_code == 201, r.text
    reviews = attach_reviews(d)
    assert (reviews[small_upload]["method"], reviews[small_upload]["flags"]) == ("pdf", [])
    assert reviews[bomb_upload]["notes"] == ["not-extracted: limit: time 4 s"], reviews[bomb_upload]


def _cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def events_all(d):
    """(seq, type, payload) of every tenant's events, in seq order per tenant."""
    with d.su() as c:
        rows = c.execute("SELECT tenant_id, seq, signed_bytes FROM oml.journal ORDER BY tenant_id, seq").fetchall()
    out = []
    for _, seq, sb in rows:
        env = json.loads(bytes(sb))
        out.append((seq, env["type"], env["payload"]))
    return out


def test_keys_created_without_a_principal_each_have_their_own(served):
    """Issue 19: `oml key create --role writer` without --principal gave every such key the
    principal "writer", so two default keys shared own work (one read the other's held
    attachment) and two default reviewer keys shared "served". Now each key is its own principal,
    "<role>:<key id>"."""
    d = served

    def key(role):
        r = d.run("key", "create", "--tenant", "acme", "--role", role)
        key_id = r.stderr.split("key id ")[1].split(",")[0]
        return r.stdout.strip(), key_id

    (w1, w1_id), (w2, _) = key("writer"), key("writer")
    (r1, _), (r2, r2_id) = key("reviewer"), key("reviewer")
    created = {e[2]["key_id"]: e[2]["principal"] for e in events(d, {"api_key.created"})}
    assert created[w1_id] == f"writer:{w1_id}" and created[r2_id] == f"reviewer:{r2_id}"
    data = b"held file of the first default writer"
    art = d.submit(w1, body="mine", attachments=[upload(d, w1, data)]).json()["artifact_id"]
    assert get_att(d, w1, art, 1).content == data
    problem(get_att(d, w2, art, 1), 404, "claim-not-found")
    assert get_att(d, r1, art, 1).content == data  # served to r1 only
    assert "not served: 1" in problem(verdict(d, r2, art, "accept"), 409, "attachments-not-served")["detail"]
    assert verdict(d, r1, art, "accept").status_code == 200


class FakeClamd:
    """clamd's side of INSTREAM on loopback TCP (review.md "ClamAV"): records each stream's byte
    count, SHA-256 and chunk sizes, answers "stream: OK"."""

    def __init__(self):
        import socket
        import threading
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.sessions = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _read(self, c, n):
        buf = bytearray()
        while len(buf) < n:
            got = c.recv(n - len(buf))
            if not got:
                raise EOFError
            buf += got
        return bytes(buf)

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                try:
                    assert self._read(c, 10) == b"zINSTREAM\0"
                    h, size, biggest = hashlib.sha256(), 0, 0
                    while True:
                        n = int.from_bytes(self._read(c, 4), "big")
                        if n == 0:
                            break
                        h.update(self._read(c, n))
                        size += n
                        biggest = max(biggest, n)
                    self.sessions.append({"size": size, "sha256": h.hexdigest(), "biggest_chunk": biggest})
                    c.sendall(b"stream: OK\0")
                except (EOFError, OSError, AssertionError):
                    self.sessions.append({"broken": True})


def test_a_secret_past_the_64_mib_mark_is_found_and_clamd_scans_every_byte(deployment):
    """Issue 22, "Review of large files": a 70 MiB text attachment is reviewed like a small one.
    Its whole text goes through the deny-list (a key 12,345 bytes past 64 MiB is found at its
    offset) and every byte goes to clamd in 64 KiB INSTREAM chunks; the review says so
    (text_bytes is all of it, nothing truncated) and flags the claim. It used to be reviewed as
    opaque "too-large" from its first 64 KiB."""
    clamd = FakeClamd()
    d = serve_with(deployment, {"OML_CLAMD_ADDRESS": f"127.0.0.1:{clamd.port}"})
    data = bytearray(b"x" * 99 + b"\n") * ((70 << 20) // 100)
    late = (64 << 20) + 12345
    data[late - 1:late + len(AWS_KEY) + 1] = b" " + AWS_KEY.encode() + b" "
    data = bytes(data)
    uid = new_upload(d, d.writer, data, **{"content-type": "text/plain"})
    assert upload_all(d, d.writer, uid, data, chunk=6 << 20) == len(data)
    r = d.submit(d.writer, body="a large log", attachments=[uid])
    assert r.status_code == 201, r.text
    [(_, _, attach)] = events(d, {"submission.attach"})
    review = attach["review"]
    assert (review["review"], review["method"]) == ("text-extraction", "text"), review
    assert review["deny_list_hits"] == [{"pattern": "aws-access-key-id", "offset": late}], review
    assert (review["text_bytes"], review["text_truncated"], review["size"]) == (len(data), False, len(data))
    assert review["flags"] == ["deny-list"] and attach["flagged"] is True
    assert review["scan"] == "clean"
    assert clamd.sessions == [{"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "biggest_chunk": 65536}]


def test_a_pdfs_text_past_the_kept_text_is_still_scanned(deployment):
    """The PDF extractor's child streams all of its text to the server (pdf_sandbox.h frames),
    not only the kept part: with review_max_text_bytes at its minimum (1024), a key on the
    third page, past 2,900 bytes of text, is still found at its offset."""
    d = serve_with(deployment, {"OML_REVIEW_MAX_TEXT_BYTES": "1024"})
    filler = ["line %02d of filler text for the page" % i for i in range(40)]
    pdf = make_pdf([filler, filler, filler[:3] + [f"key {AWS_KEY} here"]])
    uid = upload(d, d.writer, pdf, **{"content-type": "application/pdf"})
    r = d.submit(d.writer, body="a pdf", attachments=[uid])
    assert r.status_code == 201, r.text
    [(_, _, attach)] = events(d, {"submission.attach"})
    review = attach["review"]
    assert (review["method"], review["pdf_pages"], review["flags"]) == ("pdf", 3, ["deny-list"]), review
    [hit] = review["deny_list_hits"]
    assert hit["pattern"] == "aws-access-key-id" and hit["offset"] > 2 * 1024, review
    assert review["text_bytes"] > hit["offset"] and review["text_truncated"] is False
