"""Recall (GET /v1/claims) and full-text search (GET /v1/search) through the HTTP API (issue 9,
"Retrieval"; src/admission/recall.h, sql/0012_recall.sql): exact keyset pages, every filter,
the own-work rule, cursors, and the search index's lifecycle across promotion, demotion, erasure
and tenants. PostgreSQL only: nothing here touches the lake."""
import base64
import datetime
import json

import pytest


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
