"""Recall (GET /v1/claims) and full-text search (GET /v1/search) through the HTTP API (issue 9,
"Retrieval"; src/admission/recall.h, sql/0012_recall.sql): exact keyset pages, every filter,
the own-work rule, cursors, and the search index's lifecycle across promotion, demotion, erasure
and tenants. PostgreSQL only: nothing here touches the lake."""
import base64
import datetime
import hashlib
import json
import os

import pytest
import requests

from conftest import dev_profile


def problem(r, status, slug):
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["type"] == f"urn:oml:problem:{slug}", r.text
    return r.json()


def page(d, token, path="/v1/claims", **params):
    r = d.get(path, token, params=params)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert set(doc) == {"claims", "next_cursor"}
    for c in doc["claims"]:
        assert "body" not in c  # metadata and digests only
    return doc


def every_page(d, token, path="/v1/claims", limit=4, **params):
    """All pages from the first: the ids in order. Every page but the last is full."""
    ids, cursor = [], None
    while True:
        p = dict(params, limit=limit)
        if cursor:
            p["cursor"] = cursor
        doc = page(d, token, path, **p)
        ids += [c["artifact_id"] for c in doc["claims"]]
        cursor = doc["next_cursor"]
        if cursor is None:
            assert len(doc["claims"]) <= limit
            return ids
        assert len(doc["claims"]) == limit


def verdict(d, token, art, v):
    r = d.post(f"/v1/claims/{art}/verdict", token, json={"verdict": v})
    assert r.status_code == 200, r.text


def demote(d, token, art):
    r = d.post(f"/v1/claims/{art}/demote", token)
    assert r.status_code == 200, r.text


def erase(d, token, art):
    r = d.post(f"/v1/claims/{art}/erase", token)
    assert r.status_code == 200, r.text


def test_120_claims_page_as_50_50_20_in_order_and_stay_put_while_claims_arrive(served):
    d = served
    made = []
    for i in range(120):
        r = d.submit(d.writer if i % 2 else d.writer2, body=f"claim {i}")
        assert r.status_code == 201, r.text
        made.append(r.json())
    newest_first = [c["artifact_id"] for c in reversed(made)]

    p1 = page(d, d.admin)  # default limit: 50
    assert [c["artifact_id"] for c in p1["claims"]] == newest_first[:50]
    assert p1["next_cursor"]
    late = [d.submit(d.writer, body=f"late {i}").json()["artifact_id"] for i in range(3)]
    p2 = page(d, d.admin, limit=50, cursor=p1["next_cursor"])
    assert [c["artifact_id"] for c in p2["claims"]] == newest_first[50:100]
    p3 = page(d, d.admin, limit=50, cursor=p2["next_cursor"])
    assert [c["artifact_id"] for c in p3["claims"]] == newest_first[100:]
    assert p3["next_cursor"] is None
    ids = [c["artifact_id"] for p in (p1, p2, p3) for c in p["claims"]]
    assert len(ids) == len(set(ids)) == 120
    seqs = [c["submitted_seq"] for p in (p1, p2, p3) for c in p["claims"]]
    assert seqs == sorted(seqs, reverse=True)
    # The late claims head a new first page.
    assert [c["artifact_id"] for c in page(d, d.admin, limit=4)["claims"]] == late[::-1] + newest_first[:1]

    # A listed claim is the claim document without its body and attachments, plus the signed
    # submission time.
    oldest = p3["claims"][-1]
    got = d.get(f"/v1/claims/{made[0]['artifact_id']}", d.admin).json()
    del got["body"]
    got.pop("attachments", None)
    submitted_at = oldest.pop("submitted_at")
    assert oldest == got
    with d.su() as c:
        signed = c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                           (d.tenant_id, made[0]["submitted_seq"])).fetchone()[0]
    assert submitted_at == json.loads(bytes(signed))["time"]

    problem(d.get("/v1/claims", d.admin, params={"limit": 501}), 400, "invalid-parameter")
    problem(d.get("/v1/claims", d.admin, params={"limit": 0}), 400, "invalid-parameter")
    problem(d.get("/v1/claims", d.admin, params={"limit": "ten"}), 400, "invalid-parameter")
    assert len(page(d, d.admin, limit=500)["claims"]) == 123


def shifted(t, hours):
    """`t` (…Z) written with a +HH:00 offset: the same instant."""
    dt = datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    return dt.astimezone(datetime.timezone(datetime.timedelta(hours=hours))).isoformat()


def test_every_filter_and_role_select_exactly_the_model(served):
    d = served
    authors = {"alice": d.writer, "bob": d.writer2}
    assert d.post("/v1/simulations", d.admin, json={"simulation_id": "sim-x"}).status_code == 201
    model = []
    for i in range(18):
        who = "alice" if i % 2 else "bob"
        fields = {"workarea_id": f"wa-{i % 3}", "provenance": ["human", "agent", "tool", "import"][i % 4]}
        if i % 4 == 1:
            fields["simulation_id"] = "sim-x"
        c = d.submit(authors[who], body=f"b{i}", **fields).json()
        state = ["held", "promoted", "rejected", "demoted", "erased", "held"][i % 6]
        if state in ("promoted", "demoted", "erased"):
            verdict(d, d.reviewer, c["artifact_id"], "accept")
        if state == "rejected":
            verdict(d, d.reviewer, c["artifact_id"], "reject")
        if state == "demoted":
            demote(d, d.reviewer, c["artifact_id"])
        if state == "erased":
            erase(d, d.admin, c["artifact_id"])
        model.append(dict(c, state=state, author=who))
    times = {c["artifact_id"]: c["submitted_at"] for c in page(d, d.admin, limit=500)["claims"]}
    times.update({c["artifact_id"]: c["submitted_at"]
                  for c in page(d, d.admin, limit=500, state="erased")["claims"]})
    for m in model:
        m["submitted_at"] = times[m["artifact_id"]]
    t6, t12 = model[6]["submitted_at"], model[12]["submitted_at"]

    filters = [{}, {"workarea_id": "wa-0"}, {"workarea_id": "wa-2"}, {"provenance": "tool"},
               {"provenance": "human"}, {"simulation_id": "sim-x"}, {"simulation_id": "sim-none"},
               {"state": "held"}, {"state": "promoted"}, {"state": "rejected"}, {"state": "demoted"},
               {"state": "erased"}, {"submitted_after": t6}, {"submitted_before": t12},
               {"submitted_after": shifted(t6, 1), "submitted_before": shifted(t12, -3)},
               {"workarea_id": "wa-1", "state": "promoted"}, {"provenance": "agent", "submitted_after": t6}]

    def matches(m, f):
        return ((m["state"] == f["state"]) if "state" in f else m["state"] != "erased") and \
            all(m.get(k) == f[k] for k in ("workarea_id", "provenance", "simulation_id") if k in f) and \
            ("submitted_after" not in f or m["submitted_at"] > t6) and \
            ("submitted_before" not in f or m["submitted_at"] < t12)

    def visible(m, principal, role):
        return m["state"] == "promoted" or m["author"] == principal or role in ("reviewer", "admin")

    callers = [("alice", "writer", d.writer), ("bob", "writer", d.writer2), ("rita", "reviewer", d.reviewer),
               ("ada", "admin", d.admin)]
    nonempty = 0
    for principal, role, token in callers:
        for f in filters:
            expected = [m["artifact_id"] for m in reversed(model) if visible(m, principal, role) and matches(m, f)]
            nonempty += bool(expected)
            assert every_page(d, token, limit=3, **f) == expected, (principal, f)
    assert nonempty >= 45
    # bob never sees alice's held claim; the reviewer does.
    alices_held = next(m["artifact_id"] for m in model if m["author"] == "alice" and m["state"] == "held")
    assert alices_held not in every_page(d, d.writer2, state="held")
    assert alices_held in every_page(d, d.reviewer, state="held")

    # Parameters are checked by name and value; a typo never widens a list.
    problem(d.get("/v1/claims", d.admin, params={"workarea": "wa-0"}), 400, "invalid-parameter")
    problem(d.get("/v1/claims?state=held&state=promoted", d.admin), 400, "invalid-parameter")
    problem(d.get("/v1/claims", d.admin, params={"state": "lost"}), 400, "invalid-parameter")
    problem(d.get("/v1/claims", d.admin, params={"provenance": "robot"}), 400, "invalid-parameter")
    problem(d.get("/v1/claims", d.admin, params={"submitted_after": "2025-02-30T00:00:00Z"}), 400, "invalid-parameter")
    problem(d.get("/v1/claims", d.admin, params={"submitted_after": "2025-01-01"}), 400, "invalid-parameter")
    # An unencoded '+' arrives as a space and is read as '+'.
    assert every_page(d, d.admin, submitted_after=shifted(t6, 2).replace("+", " ")) == \
        every_page(d, d.admin, submitted_after=t6)


def test_cursors_are_opaque_bound_to_their_query_and_refuse_tampering(served):
    d = served
    for i in range(5):
        d.submit(d.writer, body=f"c{i}", workarea_id="wa-c")
    cursor = page(d, d.writer, limit=2)["next_cursor"]
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    # Change one digit of the document (a plausible forgery) or one byte anywhere: refused.
    forged = raw.replace(b'"s":', b'"s":1', 1)
    for bad in [base64.urlsafe_b64encode(forged).decode().rstrip("="), cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB"),
                cursor[:10], "not a cursor", "e30"]:
        problem(d.get("/v1/claims", d.writer, params={"limit": 2, "cursor": bad}), 400, "invalid-cursor")
    # Another query's cursor: other filters, or the search endpoint.
    problem(d.get("/v1/claims", d.writer, params={"limit": 2, "cursor": cursor, "workarea_id": "wa-c"}), 400,
            "invalid-cursor")
    problem(d.get("/v1/search", d.writer, params={"q": "c1", "cursor": cursor}), 400, "invalid-cursor")
    assert len(page(d, d.writer, limit=10, cursor=cursor)["claims"]) == 3


def test_search_finds_promoted_text_only_and_never_another_tenants(served):
    d = served
    def sub(token, body):
        r = d.submit(token, body=body)
        assert r.status_code == 201, r.text
        return r.json()["artifact_id"]
    a = sub(d.writer, "Photosynthesis happens in the chloroplast")
    held = sub(d.writer, "chloroplast notes still held")
    dem = sub(d.writer2, "chloroplast claim to demote")
    era = sub(d.writer2, "chloroplast claim to erase")
    for art in (a, dem, era):
        verdict(d, d.reviewer, art, "accept")
    d.wait_indexed()

    def hits(token, q, **kw):
        return every_page(d, token, "/v1/search", q=q, **kw)
    assert hits(d.writer2, "chloroplast") == [era, dem, a]  # equal ranks: newest first
    assert hits(d.writer2, "photosynthesis") == [a]  # a word of the body, any case
    assert hits(d.reviewer, "held") == []
    doc = page(d, d.writer2, "/v1/search", q="photosynthesis")
    assert doc["claims"][0]["rank"] > 0 and doc["claims"][0]["state"] == "promoted"
    assert "Photosynthesis" not in json.dumps(doc)  # metadata only
    demote(d, d.reviewer, dem)
    assert hits(d.writer2, "chloroplast") == [era, a]
    erase(d, d.writer2, era)
    assert hits(d.writer2, "chloroplast") == [a]
    with d.su() as c:
        rows = dict(c.execute("SELECT artifact_id::text, count(*) FROM oml.claim_text GROUP BY 1").fetchall())
    assert rows == {a: 1}  # held never indexed; demotion and erasure removed theirs

    # A second tenant: its promoted text is its own.
    other = d.tenant("globex")
    ow, orv = d.api_key("globex", "writer", "olga"), d.api_key("globex", "reviewer", "oscar")
    o = sub(ow, "chloroplast of another tenant")
    verdict(d, orv, o, "accept")
    d.wait_indexed()
    assert hits(d.writer, "chloroplast") == [a]
    assert hits(ow, "chloroplast") == [o]
    assert hits(ow, "photosynthesis") == []
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.claim_text WHERE tenant_id = %s", (other,)).fetchone()[0] == 1

    problem(d.get("/v1/search", d.writer), 400, "invalid-parameter")
    problem(d.get("/v1/search", d.writer, params={"q": ""}), 400, "invalid-parameter")
    problem(d.get("/v1/search", d.writer, params={"q": "x" * 1001}), 400, "invalid-parameter")
    problem(d.get("/v1/search", d.writer, params={"q": "x", "state": "held"}), 400, "invalid-parameter")
    problem(d.get("/v1/search", d.writer, params={"q": "x", "limit": 501}), 400, "invalid-parameter")
    assert d.get("/v1/search", params={"q": "x"}).status_code == 401
    assert d.run("verify").stdout.startswith("OK")


# ---- Cursor authentication (issue 17): HMAC-SHA-256 under the cursor secret -------------------

def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def b64url(raw):
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_parts(cursor):
    """(key id, JSON document, tag) of a v2 cursor: 0x02, id length, id, doc, 32-byte HMAC
    (src/admission/cursor.h)."""
    raw = b64url_decode(cursor)
    assert raw[0] == 2, raw[:4]
    n = raw[1]
    return raw[2:2 + n].decode(), json.loads(raw[2 + n:-32]), raw[-32:]


def cursor_doc(cursor):
    return cursor_parts(cursor)[1]


def cursor_key_id(cursor):
    return cursor_parts(cursor)[0]


def test_the_reviews_forged_cursor_is_refused_and_a_real_one_pages(served):
    """The forgery of the review: decode the base64url, change the position in the JSON,
    recompute SHA-256("oml-cursor/v1" NUL doc)[0..8) and re-encode. Before cursors were MACed it
    answered 200 with the forged position's page."""
    d = served
    made = [d.submit(d.writer, body=f"f{i}").json()["artifact_id"] for i in range(7)]
    newest_first = made[::-1]
    first = page(d, d.writer, limit=2)
    assert [c["artifact_id"] for c in first["claims"]] == newest_first[:2]
    real = first["next_cursor"]
    doc = cursor_doc(real)
    assert doc["a"] == newest_first[1]

    # A position of the forger's choosing: just after the newest claim (its page would start at
    # the second newest, a page the real cursor does not give).
    newest = d.get(f"/v1/claims/{newest_first[0]}", d.writer).json()
    forged_doc = dict(doc, v=1, s=newest["submitted_seq"], a=newest["artifact_id"])
    text = json.dumps(forged_doc, separators=(",", ":"), sort_keys=True).encode()
    v1 = b64url(text + hashlib.sha256(b"oml-cursor/v1\0" + text).digest()[:8])
    # The same recomputation on the v2 layout: the real header (version, key id), the forged
    # document, and an unkeyed SHA-256 in place of the HMAC (whole, and cut to 8 bytes).
    raw = b64url_decode(real)
    header = raw[:2 + raw[1]]
    text2 = json.dumps(dict(doc, s=newest["submitted_seq"], a=newest["artifact_id"]), separators=(",", ":"),
                       sort_keys=True).encode()
    v2_sha = b64url(header + text2 + hashlib.sha256(b"oml-cursor/v2\0" + header + text2).digest())
    v2_sha8 = b64url(header + text2 + hashlib.sha256(b"oml-cursor/v2\0" + header + text2).digest()[:8])
    for forged, detail in [(v1, "cursor is not one this server issued (unknown format)"),
                           (v2_sha, "cursor was altered"), (v2_sha8, "cursor was altered")]:
        r = d.get("/v1/claims", d.writer, params={"limit": 2, "cursor": forged})
        p = problem(r, 400, "invalid-cursor")
        assert p["detail"] == detail, p
        assert p["status"] == 400 and p["title"] == "invalid-cursor"
    r = d.get("/v1/search", d.writer, params={"q": "f1", "cursor": v1})
    problem(r, 400, "invalid-cursor")

    # The real cursor still pages, exactly.
    second = page(d, d.writer, limit=2, cursor=real)
    assert [c["artifact_id"] for c in second["claims"]] == newest_first[2:4]
    assert every_page(d, d.writer, limit=2) == newest_first
    # A real cursor of a second tenant is not a cursor of this one.
    d.tenant("initech")
    other = d.api_key("initech", "writer", "ivan")
    for i in range(3):
        assert d.submit(other, body=f"o{i}").status_code == 201
    theirs = page(d, other, limit=1)["next_cursor"]
    problem(d.get("/v1/claims", d.writer, params={"limit": 1, "cursor": theirs}), 400, "invalid-cursor")


def write_secret(path, *lines):
    path.write_text("".join(f"{k} {v}\n" for k, v in lines))
    os.chmod(path, 0o600)


def test_a_rotated_cursor_secret_keeps_cursors_in_flight_until_the_old_key_is_removed(served):
    d = served
    secret = d.home / "keys" / "cursor.key"
    (old_id, old_hex), = [l.split() for l in secret.read_text().splitlines() if l and not l.startswith("#")]
    made = [d.submit(d.writer, body=f"r{i}").json()["artifact_id"] for i in range(6)]
    newest_first = made[::-1]
    before = page(d, d.writer, limit=2)["next_cursor"]
    assert cursor_key_id(before) == old_id

    # Rotation: a new key first (it signs), the old one below it (it still verifies).
    new_hex = os.urandom(32).hex()
    write_secret(secret, ("k-new", new_hex), (old_id, old_hex))
    d.stop_server()
    d.serve()
    p = page(d, d.writer, limit=2, cursor=before)
    assert [c["artifact_id"] for c in p["claims"]] == newest_first[2:4]
    assert cursor_key_id(p["next_cursor"]) == "k-new"
    after = p["next_cursor"]
    assert [c["artifact_id"] for c in page(d, d.writer, limit=2, cursor=after)["claims"]] == newest_first[4:6]

    # The old key removed: its cursors are refused by key id; the new key's still page.
    write_secret(secret, ("k-new", new_hex))
    d.stop_server()
    d.serve()
    p = problem(d.get("/v1/claims", d.writer, params={"limit": 2, "cursor": before}), 400, "invalid-cursor")
    assert p["detail"] == "cursor was issued under a key this server does not hold"
    assert [c["artifact_id"] for c in page(d, d.writer, limit=2, cursor=after)["claims"]] == newest_first[4:6]

    # Another secret under the same key id (a replica with another file): refused as altered.
    write_secret(secret, ("k-new", os.urandom(32).hex()))
    d.stop_server()
    d.serve()
    p = problem(d.get("/v1/claims", d.writer, params={"limit": 2, "cursor": after}), 400, "invalid-cursor")
    assert p["detail"] == "cursor was altered"


def test_serve_refuses_to_start_without_a_usable_cursor_secret(deployment):
    d = deployment
    secret = d.home / "keys" / "cursor.key"
    assert oct(secret.stat().st_mode & 0o777) == "0o600"  # `oml init` generated it
    elsewhere = d.home / "nowhere" / "cursor.key"
    p = d.run("serve", check=False, timeout=60, env={"OML_CURSOR_SECRET_FILE": str(elsewhere)})
    assert p.returncode == 6, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        f"oml: not-found: cursor secret file {elsewhere} does not exist (setting cursor_secret_file, env "
        f"OML_CURSOR_SECRET_FILE). Every replica needs the same file: copy the deployment's, or create the first one "
        f"with `oml cursor-secret generate {elsewhere}` (or `oml init`) and copy it to every replica "
        f"(docs/operations/deployment.md, \"Cursor secret\")")
    assert not elsewhere.exists()  # never made up by serve
    # Malformed: exit 2, naming the line, never the secret.
    write_secret(secret, ("k1", "ab" * 31 + "zz"))
    p = d.run("serve", check=False, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1] == \
        f"oml: invalid-argument: {secret} line 1: the secret of key k1 must be hex digits, an even number of them"
    # Readable by others: exit 4, as the KEK.
    write_secret(secret, ("k1", "ab" * 32))
    os.chmod(secret, 0o644)
    p = d.run("serve", check=False, timeout=60)
    assert p.returncode == 4, p.stderr
    assert f"key file {secret} has mode 0644" in p.stderr
    # `oml cursor-secret generate` makes a file serve accepts (and never overwrites one).
    fresh = d.home / "fresh" / "cursor.key"
    g = d.run("cursor-secret", "generate", str(fresh))
    out = json.loads(g.stdout)
    assert out["file"] == str(fresh) and out["key_id"].startswith("k") and len(out["key_id"]) == 9
    assert oct(fresh.stat().st_mode & 0o777) == "0o600"
    assert d.run("cursor-secret", "generate", str(fresh), check=False).returncode == 4
    d.tenant("acme")
    token = d.api_key("acme", "writer", "alice")
    d.serve(env={"OML_CURSOR_SECRET_FILE": str(fresh)})
    for i in range(3):
        assert d.submit(token, body=f"g{i}").status_code == 201
    c = page(d, token, limit=2)["next_cursor"]
    assert cursor_key_id(c) == out["key_id"]
    assert len(page(d, token, limit=2, cursor=c)["claims"]) == 1


def test_the_local_profile_generates_its_cursor_secret_and_pages_with_no_flags():
    with dev_profile("oml-recall-dev") as dev:
        assert "Press Ctrl-C" in dev.banner, dev.banner
        secret = dev.home / "keys" / "cursor.key"
        assert oct(secret.stat().st_mode & 0o777) == "0o600"
        token = (dev.home / "dev-writer.token").read_text().strip()
        h = {"Authorization": f"Bearer {token}"}
        for i in range(3):
            r = requests.post(dev.base + "/v1/claims", headers=h, timeout=30,
                              json={"body": f"d{i}", "workarea_id": "wa-1", "path": "n.md", "provenance": "human"})
            assert r.status_code == 201, r.text
        r = requests.get(dev.base + "/v1/claims", headers=h, params={"limit": 2}, timeout=30)
        assert r.status_code == 200, r.text
        cursor = r.json()["next_cursor"]
        r2 = requests.get(dev.base + "/v1/claims", headers=h, params={"limit": 2, "cursor": cursor}, timeout=30)
        assert r2.status_code == 200, r2.text
        assert len(r2.json()["claims"]) == 1 and r2.json()["next_cursor"] is None
        assert cursor_key_id(cursor) in secret.read_text()


def test_time_filters_take_any_rfc3339_offset(served):
    """RFC 3339 offsets reach +-23:59; PostgreSQL's timestamptz input stops at +-15:59, which made
    +16:00 a 500 (found by tests/test_openapi_conformance.py). The server hands PostgreSQL the
    instant in UTC."""
    d = served
    c = d.submit(d.writer, body="timed").json()
    listed = page(d, d.writer)["claims"]
    assert [x["artifact_id"] for x in listed] == [c["artifact_id"]]
    at = datetime.datetime.fromisoformat(listed[0]["submitted_at"].replace("Z", "+00:00"))
    ids = lambda r: [x["artifact_id"] for x in r["claims"]]  # noqa: E731
    for hours, minutes in ((16, 0), (23, 59), (-23, -59), (-16, 0), (0, 0)):
        tz = datetime.timezone(datetime.timedelta(hours=hours, minutes=minutes))
        before = (at - datetime.timedelta(seconds=1)).astimezone(tz).isoformat()
        after = (at + datetime.timedelta(seconds=1)).astimezone(tz).isoformat()
        assert ids(page(d, d.writer, submitted_after=before)) == [c["artifact_id"]], before
        assert ids(page(d, d.writer, submitted_before=before)) == [], before
        assert ids(page(d, d.writer, submitted_after=after)) == [], after
    # The edges of the calendar with the widest offsets are still times (the first is in 1 BC in UTC).
    assert ids(page(d, d.writer, submitted_after="0001-01-01T00:00:00+23:59")) == [c["artifact_id"]]
    assert ids(page(d, d.writer, submitted_before="9999-12-31T23:59:59.999999-23:59")) == [c["artifact_id"]]
    problem(requests.get(f"{d.base}/v1/claims", params={"submitted_after": "2025-01-01T00:00:00+24:00"},
                         headers={"Authorization": f"Bearer {d.writer}"}, timeout=30), 400, "invalid-parameter")


def test_an_unknown_parameter_name_of_any_bytes_is_400(served):
    """An unknown query parameter is 400 naming it; a name that is not UTF-8, or whose first 64
    bytes end inside a character, made the problem detail unserialisable (500)."""
    d = served
    h = {"Authorization": f"Bearer {d.writer}"}
    for path in ("/v1/claims", "/v1/search"):
        r = requests.get(f"{d.base}{path}?%FF%FE=1", headers=h, timeout=30)
        body = problem(r, 400, "invalid-parameter")
        assert body["detail"].startswith("unknown query parameter '%FF%FE' (this endpoint takes "), body
        name = "a" * 63 + "é"  # its 64th byte is the first of é's two
        r = requests.get(f"{d.base}{path}", params={name: "1"}, headers=h, timeout=30)
        body = problem(r, 400, "invalid-parameter")
        assert body["detail"].startswith("unknown query parameter '" + "a" * 63 + "%C3...'"), body
