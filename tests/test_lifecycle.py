"""Later acts of the admission lifecycle over HTTP (issue 9; admission/lifecycle.h, sql/0014):
POST /v1/claims/{id}/reassign, POST /v1/simulations, GET /v1/simulations/{sim},
POST /v1/simulations/{sim}/end. Exact statuses and problem slugs, the signed events, the lake's
silver/claims row after a reassignment (workarea new, path old) and after a simulation's end
(state retracted), and `oml verify --folds` over the new fold rows. The race of an end against a
submission under it is forced with sync points in src/admission/lifecycle_pg_test.cc."""
import base64
import json

from test_lake_tables import SILVER, both_readers, event_time, lakewriter, silver_key


def problem(r, status, slug):
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["type"] == f"urn:oml:problem:{slug}", r.text
    return r.json()


def envelope(doc):
    return json.loads(base64.b64decode(doc["receipt"]["signed_bytes"]))


def reassign(d, token, art, **body):
    return d.post(f"/v1/claims/{art}/reassign", token, json=body)


def start(d, token, sim, **body):
    return d.post("/v1/simulations", token, json={"simulation_id": sim, **body})


def end(d, token, sim, **body):
    return d.post(f"/v1/simulations/{sim}/end", token, json=body)


def head(d):
    with d.su() as c:
        return c.execute("SELECT seq FROM oml.chain_heads WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0]


def fold_lines(out):
    return [line for line in out.splitlines() if line.startswith("FOLD ")]


def test_reassign_statuses_rules_and_event(served):
    d = served
    claim = d.submit(d.writer, workarea_id="wa-a", path="notes/a.md").json()  # seq 6
    art = claim["artifact_id"]
    before = head(d)
    problem(reassign(d, d.writer, art), 400, "missing-field")
    problem(reassign(d, d.writer, art, workarea_id="wa-b", extra=1), 400, "unknown-field")
    problem(reassign(d, d.writer, art, workarea_id=""), 400, "invalid-field")
    problem(reassign(d, d.writer, art, workarea_id=7), 400, "invalid-field")
    problem(reassign(d, d.writer, art, workarea_id="wa-b", reason="x" * 1025), 400, "invalid-field")
    problem(reassign(d, d.writer2, art, workarea_id="wa-b"), 404, "claim-not-found")  # held: hidden from bob
    problem(reassign(d, d.reviewer, "not-a-uuid", workarea_id="wa-b"), 404, "claim-not-found")
    same = problem(reassign(d, d.reviewer, art, workarea_id="wa-a"), 409, "workarea-unchanged")
    assert same["detail"] == f"claim {art} is already in that workarea"
    problem(d.post(f"/v1/claims/{art}/reassign", None, json={"workarea_id": "wa-b"}), 401, "unauthenticated")
    assert head(d) == before  # no refusal journals anything

    # The author moves its own held claim.
    r = reassign(d, d.writer, art, workarea_id="wa-b", reason="wrong shelf")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["workarea_id"], doc["path"], doc["state"], doc["receipt"]["seq"]) == ("wa-b", "notes/a.md", "held", 7)
    env = envelope(doc)
    assert (env["type"], env["principal"]) == ("claim.reassigned", "alice")
    assert env["payload"] == {"artifact_id": art, "versions": [1], "from_workarea_id": "wa-a",
                              "to_workarea_id": "wa-b", "reason": "wrong shelf"}
    got = d.get(f"/v1/claims/{art}", d.writer).json()
    assert (got["workarea_id"], got["path"]) == ("wa-b", "notes/a.md")
    # After review the author may not; reviewers and admins may.
    assert d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": "accept"}).status_code == 200
    problem(reassign(d, d.writer, art, workarea_id="wa-c"), 403, "forbidden-role")
    problem(reassign(d, d.writer2, art, workarea_id="wa-c"), 403, "forbidden-role")
    assert reassign(d, d.admin, art, workarea_id="wa-c").status_code == 200
    # Recall finds it under the new workarea only.
    listed = d.get("/v1/claims", d.reviewer, params={"workarea_id": "wa-c"}).json()["claims"]
    assert [c["artifact_id"] for c in listed] == [art]
    assert d.get("/v1/claims", d.reviewer, params={"workarea_id": "wa-a"}).json()["claims"] == []
    assert d.post(f"/v1/claims/{art}/erase", d.admin, json={}).status_code == 200
    problem(reassign(d, d.admin, art, workarea_id="wa-d"), 410, "erased")
    assert d.run("verify").stdout.startswith("OK")


def test_reassigned_promoted_claim_moves_in_the_lake_and_keeps_its_path(served):
    d = served
    claim = d.submit(d.writer, workarea_id="wa-old", path="facts/kept.md").json()
    art = claim["artifact_id"]
    p = d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": "accept"})
    assert p.status_code == 200, p.text
    pseq = p.json()["receipt"]["seq"]
    lakewriter(d)
    [row] = both_readers(d, SILVER, silver_key)
    assert (row["workarea_id"], row["path"], row["state"]) == ("wa-old", "facts/kept.md", "promoted")

    r = reassign(d, d.reviewer, art, workarea_id="wa-new")
    assert r.status_code == 200, r.text
    rseq = r.json()["receipt"]["seq"]
    lakewriter(d)
    [row] = both_readers(d, SILVER, silver_key)
    assert (row["workarea_id"], row["path"], row["state"]) == ("wa-new", "facts/kept.md", "promoted")
    assert row["last_event_seq"] == rseq
    # The state did not change: state_changed_at is still the promotion's time.
    assert row["state_changed_at"] == row["promoted_at"] == event_time(d, d.tenant_id, pseq)
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_simulation_statuses_and_submissions_under_it(served):
    d = served
    before = head(d)
    problem(start(d, d.writer, "sim-a"), 403, "forbidden-role")
    problem(d.post("/v1/simulations", d.admin, json={}), 400, "missing-field")
    problem(start(d, d.admin, ""), 400, "invalid-field")
    problem(start(d, d.admin, "sim-a", description="a\nb"), 400, "invalid-field")
    problem(start(d, d.admin, "sim-a", extra=True), 400, "unknown-field")
    # A claim naming a simulation that was never started: 409, nothing written.
    counts = d.counts()
    problem(d.submit(d.writer, simulation_id="sim-a"), 409, "simulation-not-running")
    assert d.counts() == counts
    assert head(d) == before

    s = start(d, d.reviewer, "sim-a", description="what if")
    assert s.status_code == 201, s.text
    assert s.headers["Location"] == "/v1/simulations/sim-a"
    doc = s.json()
    assert {k: doc[k] for k in ("simulation_id", "description", "state", "started_seq", "ended_seq")} == \
        {"simulation_id": "sim-a", "description": "what if", "state": "running", "started_seq": 6, "ended_seq": None}
    env = envelope(doc)
    assert (env["type"], env["principal"], env["payload"]) == \
        ("simulation.started", "rita", {"simulation_id": "sim-a", "description": "what if"})
    problem(start(d, d.admin, "sim-a"), 409, "simulation-exists")
    # An id with a slash: the path segment is percent-encoded.
    s2 = start(d, d.admin, "team/b")
    assert s2.status_code == 201 and s2.headers["Location"] == "/v1/simulations/team%2Fb", s2.text
    g = d.get("/v1/simulations/team%2Fb", d.writer)
    assert g.status_code == 200 and g.json()["simulation_id"] == "team/b", g.text
    problem(d.get("/v1/simulations/none", d.writer), 404, "simulation-not-found")

    held = d.submit(d.writer, body="simulated", simulation_id="sim-a", provenance="agent")
    assert held.status_code == 201, held.text
    hdoc = held.json()
    assert (hdoc["simulation_id"], hdoc["provenance"], hdoc["provenance_class"]) == ("sim-a", "agent", "simulation")
    plain = d.submit(d.writer, body="real").json()
    assert (plain["provenance"], plain["provenance_class"]) == ("human", "human")
    promoted = d.submit(d.writer2, body="simulated and promoted", simulation_id="sim-a").json()
    assert d.post(f"/v1/claims/{promoted['artifact_id']}/verdict", d.reviewer,
                  json={"verdict": "accept"}).status_code == 200
    assert d.get(f"/v1/claims/{promoted['artifact_id']}", d.writer).status_code == 200  # promoted: tenant-wide

    problem(end(d, d.writer, "sim-a"), 403, "forbidden-role")
    problem(end(d, d.admin, "nope"), 404, "simulation-not-found")
    e = end(d, d.admin, "sim-a", reason="over")
    assert e.status_code == 200, e.text
    edoc = e.json()
    eseq = edoc["receipt"]["seq"]
    assert (edoc["state"], edoc["ended_seq"], edoc["retracted"]) == ("ended", eseq, 2)
    env = envelope(edoc)
    assert (env["type"], env["payload"]) == ("simulation.ended", {"simulation_id": "sim-a", "reason": "over"})
    for art in (hdoc["artifact_id"], promoted["artifact_id"]):
        got = d.get(f"/v1/claims/{art}", d.admin).json()
        assert (got["state"], got["simulation_id"], got["provenance_class"]) == ("retracted", "sim-a", "simulation")
    # Retracted: private again, and no review act applies.
    problem(d.get(f"/v1/claims/{promoted['artifact_id']}", d.writer), 404, "claim-not-found")
    problem(d.post(f"/v1/claims/{hdoc['artifact_id']}/verdict", d.reviewer, json={"verdict": "accept"}),
            409, "claim-not-held")
    assert d.get(f"/v1/claims/{plain['artifact_id']}", d.writer).json()["state"] == "held"
    # Recall: the author lists its retracted claim; state=retracted filters.
    mine = d.get("/v1/claims", d.writer, params={"state": "retracted"}).json()["claims"]
    assert [c["artifact_id"] for c in mine] == [hdoc["artifact_id"]]
    # Ended: end again and submit under it are 409, nothing written.
    before = head(d)
    again = problem(end(d, d.reviewer, "sim-a"), 409, "simulation-not-running")
    assert again["detail"] == f"the simulation ended at seq {eseq}"
    late = problem(d.submit(d.writer, simulation_id="sim-a"), 409, "simulation-not-running")
    assert late["detail"] == f"the claim names a simulation that ended at seq {eseq}"
    assert head(d) == before
    g = d.get("/v1/simulations/sim-a", d.writer).json()
    assert (g["state"], g["ended_seq"]) == ("ended", eseq)
    assert d.run("verify").stdout.startswith("OK")


def test_simulation_end_retracts_the_promoted_claim_in_the_lake(served):
    d = served
    assert start(d, d.admin, "sim-lake").status_code == 201
    claim = d.submit(d.writer, body="simulated fact", simulation_id="sim-lake", provenance="tool").json()
    art = claim["artifact_id"]
    assert d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": "accept"}).status_code == 200
    lakewriter(d)
    [row] = both_readers(d, SILVER, silver_key)
    assert (row["state"], row["provenance"], row["simulation_id"]) == ("promoted", "simulation", "sim-lake")
    e = end(d, d.reviewer, "sim-lake")
    assert e.status_code == 200, e.text
    eseq = e.json()["receipt"]["seq"]
    lakewriter(d)
    [row] = both_readers(d, SILVER, silver_key)
    assert (row["state"], row["last_event_seq"], row["provenance"]) == ("retracted", eseq, "simulation")
    assert row["state_changed_at"] == event_time(d, d.tenant_id, eseq)
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_verify_folds_replays_every_act_and_finds_a_tampered_row(served):
    d = served
    assert start(d, d.admin, "sim-v").status_code == 201                            # seq 6
    sim_claim = d.submit(d.writer, simulation_id="sim-v").json()["artifact_id"]     # seq 7
    moved = d.submit(d.writer, workarea_id="wa-1").json()["artifact_id"]            # seq 8
    assert reassign(d, d.reviewer, moved, workarea_id="wa-2").status_code == 200    # seq 9
    e = end(d, d.admin, "sim-v")                                                     # seq 10
    assert e.status_code == 200 and e.json()["receipt"]["seq"] == 10, e.text
    d.stop_server()
    v = d.run("verify", "--folds", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    assert fold_lines(v.stdout) == []

    with d.su() as c:
        c.execute("UPDATE oml.artifacts SET workarea_id = 'wa-1' WHERE artifact_id = %s", (moved,))
    v = d.run("verify", "--folds", check=False)
    assert v.returncode == 3, v.stdout + v.stderr
    assert fold_lines(v.stdout) == [
        f"FOLD artifacts tenant acme {moved} v1: workarea_id expected wa-2, found wa-1 (seq 9)"], v.stdout

    with d.su() as c:
        c.execute("UPDATE oml.artifacts SET workarea_id = 'wa-2' WHERE artifact_id = %s", (moved,))
        c.execute("UPDATE oml.simulations SET state = 'running', ended_seq = NULL WHERE simulation_id = 'sim-v'")
    v = d.run("verify", "--folds", check=False)
    assert v.returncode == 3, v.stdout + v.stderr
    assert fold_lines(v.stdout) == [
        "FOLD simulations tenant acme sim-v: ended_seq expected 10, found NULL (seq 10)",
        "FOLD simulations tenant acme sim-v: state expected ended, found running (seq 10)"], v.stdout

    with d.su() as c:
        c.execute("UPDATE oml.simulations SET state = 'ended', ended_seq = 10 WHERE simulation_id = 'sim-v'")
        c.execute("UPDATE oml.artifacts SET state = 'held', retracted_seq = NULL WHERE artifact_id = %s", (sim_claim,))
    v = d.run("verify", "--folds", check=False)
    assert v.returncode == 3, v.stdout + v.stderr
    assert fold_lines(v.stdout) == [
        f"FOLD artifacts tenant acme {sim_claim} v1: retracted_seq expected 10, found NULL (seq 10)",
        f"FOLD artifacts tenant acme {sim_claim} v1: state expected retracted, found held (seq 10)"], v.stdout
    # The chain itself is intact all along.
    assert d.run("verify").stdout.startswith("OK")
