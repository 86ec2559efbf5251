"""`oml reconcile`: the key-less audit of the lake and the buckets against the journal (issue 20).

Each test damages the lake or a bucket the way it really goes wrong (a Parquet file deleted or
rewritten, a duplicate commit appended with the `deltalake` package, a table's newest commit lost,
a row updated or deleted behind the writer's back, a held file copied into the bodies bucket, a
flipped byte, an orphan) and asserts the exact finding: class, table, tenant, seq or key, column.
The run connects as oml_reconciler, with the key directory emptied: it never loads a key, and
OML_FAULT=crypto.key_material:kill would kill it if it tried.
"""
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import OML_BIN
from test_attachments import bucket, upload
from test_lake_refill import drop_newest_commit
from test_lake_tables import BRONZE, GOLD, SILVER, demote, erase, log_actions, poison, verdict
from test_lakewriter import lakewriter

KEYLESS = {"OML_FAULT": "crypto.key_material:kill"}


@contextmanager
def no_keys(d):
    """The deployment's key directory replaced by an empty one for the duration."""
    keys = d.home / "keys"
    away = d.home / "keys.away"
    keys.rename(away)
    keys.mkdir(mode=0o700)
    try:
        yield
    finally:
        shutil.rmtree(keys)
        away.rename(keys)


def reconcile(d, *args, code=None):
    """`oml reconcile --json` with no key anywhere; returns (exit code, report)."""
    with no_keys(d):
        r = d.run("reconcile", "--json", "--object-grace", "0", *args, env=KEYLESS, check=False)
    assert r.returncode in (0, 3), (r.returncode, r.stderr)
    rep = json.loads(r.stdout)
    assert rep["summary"]["key_material_uses"] == 0
    assert rep["summary"]["findings"] == len(rep["findings"])
    assert r.returncode == (3 if rep["findings"] else 0), r.stderr
    if code is not None:
        assert r.returncode == code, rep["findings"]
    return r.returncode, rep


def repair(d, code=0):
    """`oml reconcile --repair --json` with the signing key but no KEK; returns the report."""
    r = d.run("reconcile", "--json", "--object-grace", "0", "--repair",
              env={"OML_KEK_FILE": str(d.home / "no-such-kek")}, check=False)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)


def repair_events(d):
    """The lake.repair events' payloads, in journal order (all chains)."""
    with d.su() as c:
        rows = c.execute("SELECT signed_bytes FROM oml.journal WHERE event_type = 'lake.repair' "
                         "ORDER BY tenant_id, seq").fetchall()
    return [json.loads(bytes(r[0]))["payload"] for r in rows]


def assert_clean_after_refill(d):
    """After the lake writer ran: nothing found, verify --from-lake passes, bronze exactly once."""
    lakewriter(d)
    reconcile(d, code=0)
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    with d.su() as c:
        journal = sorted((str(t), s) for t, s in c.execute("SELECT tenant_id, seq FROM oml.journal").fetchall())
    from deltalake import DeltaTable
    bronze = sorted((r["tenant_id"], r["seq"]) for r in DeltaTable(str(d.home / "lake" / BRONZE)).to_pyarrow_table()
                    .select(["tenant_id", "seq"]).to_pylist())
    assert bronze == journal


def brief(rep):
    """The findings as (class, table, tenant, seq, key, column) tuples."""
    return sorted((f["class"], f["table"], f["tenant"], f["seq"], f["key"], f["column"]) for f in rep["findings"])


def populated(d):
    """Claims in every state the buckets and silver distinguish, drained into the lake:
    held (an attachment), promoted (a large body kept as an object and an attachment), demoted,
    rejected (an attachment), erased (an attachment). Returns the artifact ids by name."""
    big = "x" * 100_000  # above inline_body_max_bytes (64 KiB): an object
    ids = {}
    ids["held"] = d.submit(d.writer, body="held one", attachments=[upload(d, d.writer, os.urandom(5000))]).json()["artifact_id"]
    ids["promoted"] = d.submit(d.writer, body=big, attachments=[upload(d, d.writer, os.urandom(6000))]).json()["artifact_id"]
    ids["demoted"] = d.submit(d.writer, body="to demote").json()["artifact_id"]
    ids["rejected"] = d.submit(d.writer, body="to reject", attachments=[upload(d, d.writer, os.urandom(4000))]).json()["artifact_id"]
    ids["erased"] = d.submit(d.writer, body="to erase", attachments=[upload(d, d.writer, os.urandom(7000))]).json()["artifact_id"]
    ids["erased_big"] = d.submit(d.writer, body="y" * 100_000).json()["artifact_id"]  # a body object, erased
    for name in ("promoted", "demoted", "erased", "erased_big"):
        # A verdict needs every file served to the reviewer first.
        claim = d.get(f"/v1/claims/{ids[name]}", d.reviewer)
        assert claim.status_code == 200, claim.text
        if name in ("promoted", "erased"):
            assert d.get(f"/v1/claims/{ids[name]}/attachments/1", d.reviewer).status_code == 200
        verdict(d, d.reviewer, ids[name], "accept")
    assert d.get(f"/v1/claims/{ids['rejected']}", d.reviewer).status_code == 200
    assert d.get(f"/v1/claims/{ids['rejected']}/attachments/1", d.reviewer).status_code == 200
    r = d.post(f"/v1/claims/{ids['rejected']}/verdict", d.reviewer, json={"verdict": "reject"})
    assert r.status_code == 200, r.text
    demote(d, d.reviewer, ids["demoted"])
    erase(d, d.admin, ids["erased"])
    erase(d, d.admin, ids["erased_big"])
    lakewriter(d)
    return ids


def head(d):
    with d.su() as c:
        return c.execute("SELECT seq FROM oml.chain_heads WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0]


def data_files(d, table):
    live = {}
    for _, a in log_actions(d, table):
        if "add" in a:
            live[a["add"]["path"]] = a["add"]
        if "remove" in a:
            live.pop(a["remove"]["path"], None)
    return live


def test_a_clean_deployment_reconciles_to_nothing_and_touches_no_key(served):
    d = served
    ids = populated(d)
    code, rep = reconcile(d, code=0)
    s = rep["summary"]
    assert rep["findings"] == []
    with d.su() as c:
        events = c.execute("SELECT count(*) FROM oml.journal").fetchone()[0]
    assert s["events"] == events
    assert s["tenants"] == 2  # the provider and acme
    assert s["rows"]["bronze/events"] == events  # all delivered
    assert s["rows"]["silver/claims"] == 4  # promoted, demoted, erased, erased_big
    # The erased body object's row says so (the MERGE updates body_location since issue 20).
    from deltalake import DeltaTable
    big = [r for r in DeltaTable(str(d.home / "lake" / SILVER)).to_pyarrow_table().to_pylist()
           if r["artifact_id"] == ids["erased_big"]]
    assert [r["body_location"].split(":")[0] for r in big] == ["none"]
    assert [r["state"] for r in big] == ["erased"]
    # Read and hashed: the held, rejected and promoted attachments and the promoted body object;
    # the erased claim's file is gone, inline bodies are hashed by PostgreSQL.
    assert s["objects_read"] == 4
    # Recorded for `oml doctor`, and as Prometheus text for a textfile collector.
    with d.su() as c:
        runs = c.execute("SELECT findings, classes, events, objects, repaired, checkpoint FROM oml.reconcile_runs "
                         "ORDER BY id").fetchall()
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in runs] == [(0, {}, events, True, 0)]
    assert runs[0][5]["heads"][d.tenant_id] == head(d)
    assert set(runs[0][5]["txn"]) == {BRONZE, SILVER, GOLD}
    doc = d.run("doctor", check=False)
    assert "reconcile: last run " in doc.stdout and " 0 finding(s)" in doc.stdout, doc.stdout
    prom = d.home / "reconcile.prom"
    with no_keys(d):
        d.run("reconcile", "--no-objects", "--full", "--metrics-file", str(prom), env=KEYLESS)
    text = prom.read_text()
    assert 'oml_reconcile_findings{class="missing-in-lake"} 0\n' in text
    assert 'oml_reconcile_findings{class="dead-lettered"} 0\n' in text
    assert f"oml_reconcile_events_audited {events}\n" in text
    assert "oml_reconcile_last_run_timestamp_seconds " in text
    # The fault would have killed it on a key: prove the point fires on a path that loads one.
    r = subprocess.run([OML_BIN, "key", "public"], env={**d.env, **KEYLESS}, capture_output=True, text=True)
    assert r.returncode == -9, (r.returncode, r.stderr)
    # And as text: one summary line, exit 0.
    with no_keys(d):
        t = d.run("reconcile", "--object-grace", "0", env=KEYLESS, check=False)
    assert t.returncode == 0, t.stderr
    assert t.stdout.startswith("reconcile: 0 finding(s); ")
    assert "no key loaded" in t.stdout


def test_bronze_damage_is_named_by_seq_and_column(served):
    d = served
    populated(d)
    from deltalake import DeltaTable, write_deltalake
    # 1. A duplicate commit through the deltalake package: two of the tenant's rows again.
    t = DeltaTable(str(d.home / "lake" / BRONZE))
    whole = t.to_pyarrow_table()
    rows = [r for r in whole.to_pylist() if r["tenant_id"] == d.tenant_id]
    rows.sort(key=lambda r: r["seq"])
    dup = [rows[2], rows[3]]
    write_deltalake(str(d.home / "lake" / BRONZE), pa.Table.from_pylist(dup, schema=whole.schema),
                    mode="append")
    # 2. A row of an event the journal never had (a forged seq beyond the head).
    forged = dict(rows[4], seq=head(d) + 5)
    write_deltalake(str(d.home / "lake" / BRONZE), pa.Table.from_pylist([forged], schema=whole.schema),
                    mode="append")
    code, rep = reconcile(d, "--no-objects", code=3)
    assert brief(rep) == sorted([
        ("duplicate-in-lake", BRONZE, d.tenant_id, dup[0]["seq"], None, None),
        ("duplicate-in-lake", BRONZE, d.tenant_id, dup[1]["seq"], None, None),
        ("extra-in-lake", BRONZE, d.tenant_id, forged["seq"], None, None),
    ])
    dupf = [f for f in rep["findings"] if f["class"] == "duplicate-in-lake"][0]
    assert (dupf["expected"], dupf["found"]) == ("1", "2")
    # One rebuild of bronze for both groups, each group journalled first.
    out = repair(d)
    acts = [(a["class"], a["table"], a["action"], a["seqs"], a["ok"]) for a in out["repair"]["actions"]]
    assert acts == [("duplicate-in-lake", BRONZE, "rebuild", [dup[0]["seq"], dup[1]["seq"]], True),
                    ("extra-in-lake", BRONZE, "rebuild", [forged["seq"]], True)]
    assert out["repair"]["left"] == []
    assert [(e["class"], e["action"], e["seqs"]) for e in repair_events(d)] == [
        ("duplicate-in-lake", "rebuild", [dup[0]["seq"], dup[1]["seq"]]), ("extra-in-lake", "rebuild", [forged["seq"]])]
    # Right after (the writer has not refilled yet): nothing to repair, bronze is being refilled.
    again = repair(d, code=3)
    assert again["repair"]["actions"] == []
    assert [f["class"] for f in again["repair"]["left"]] == ["uncovered-outbox"]
    assert_clean_after_refill(d)


def test_the_journal_read_in_pages_of_any_size_gives_the_same_report(served):
    """The journal is read in a pipeline (a page replayed, the next parsed on two threads, the one
    after it fetched): pages of one event, two, three and the default 4,096 find the same rows,
    across three chains; a chain that stops at its first event (its pages in flight dropped) leaves
    the chains after it audited."""
    d = served
    populated(d)
    beta = d.tenant("beta")
    beta_writer = d.api_key("beta", "writer", "w-beta").strip()
    for i in range(3):
        assert d.submit(beta_writer, body=f"beta {i}").status_code == 201
    lakewriter(d)
    from deltalake import DeltaTable, write_deltalake
    t = DeltaTable(str(d.home / "lake" / BRONZE))
    whole = t.to_pyarrow_table()
    rows = sorted((r for r in whole.to_pylist() if r["tenant_id"] == d.tenant_id), key=lambda r: r["seq"])
    beta_rows = sorted((r for r in whole.to_pylist() if r["tenant_id"] == beta), key=lambda r: r["seq"])
    forged = dict(beta_rows[-1], seq=beta_rows[-1]["seq"] + 3)
    write_deltalake(str(d.home / "lake" / BRONZE),
                    pa.Table.from_pylist([rows[2], rows[5], forged], schema=whole.schema), mode="append")
    want = sorted([
        ("duplicate-in-lake", BRONZE, d.tenant_id, rows[2]["seq"], None, None),
        ("duplicate-in-lake", BRONZE, d.tenant_id, rows[5]["seq"], None, None),
        ("extra-in-lake", BRONZE, beta, forged["seq"], None, None),
    ])
    with d.su() as c:
        events = c.execute("SELECT count(*) FROM oml.journal").fetchone()[0]
    for rows_per_page in ("1", "2", "3", "4096"):
        code, rep = reconcile(d, "--no-objects", "--page-rows", rows_per_page, code=3)
        assert brief(rep) == want, rows_per_page
        assert rep["summary"]["events"] == events, rows_per_page
        assert rep["summary"]["tenants"] == 3
    # acme's first event does not parse: nothing more about acme; the other chains are read whole.
    with d.su() as c:
        c.execute("SET session_replication_role = replica")  # the journal's guard trigger off
        c.execute("UPDATE oml.journal SET signed_bytes = 'not json'::bytea WHERE tenant_id = %s AND seq = 1",
                  (d.tenant_id,))
    for rows_per_page in ("1", "2", "4096"):
        code, rep = reconcile(d, "--no-objects", "--page-rows", rows_per_page, code=3)
        assert brief(rep) == sorted([("journal-unreadable", "journal", d.tenant_id, 1, None, None),
                                     ("extra-in-lake", BRONZE, beta, forged["seq"], None, None)]), rows_per_page
    r = d.run("reconcile", "--page-rows", "0", check=False)
    assert r.returncode == 2 and "--page-rows" in r.stderr, (r.returncode, r.stderr)  # CLI11: a bad flag


def test_a_parquet_file_rewritten_with_a_changed_column_is_a_row_mismatch(served):
    d = served
    populated(d)
    files = data_files(d, BRONZE)
    # The file holding the tenant's claim.submitted rows: rewrite one row's principal.
    for path, add in files.items():
        f = d.home / "lake" / BRONZE / path
        tab = pq.read_table(f)
        rows = tab.to_pylist()
        hit = [i for i, r in enumerate(rows) if r["tenant_id"] == d.tenant_id and r["event_type"] == "claim.submitted"]
        if hit:
            break
    else:
        raise AssertionError("no file holds a claim.submitted row")
    i = hit[0]
    seq = rows[i]["seq"]
    rows[i]["principal"] = "mallory"
    pq.write_table(pa.Table.from_pylist(rows, schema=tab.schema), f)
    # A writer bug, not a torn file: the log's size names the new bytes.
    size = f.stat().st_size
    for logf in sorted((d.home / "lake" / BRONZE / "_delta_log").glob("*.json")):
        lines = logf.read_text().splitlines()
        out = []
        for line in lines:
            a = json.loads(line) if line.strip() else None
            if a and "add" in a and a["add"]["path"] == path:
                a["add"]["size"] = size
                a["add"].pop("stats", None)
                line = json.dumps(a)
            out.append(line)
        logf.write_text("\n".join(out) + "\n")
    code, rep = reconcile(d, "--no-objects", code=3)
    assert brief(rep) == [("row-mismatch", BRONZE, d.tenant_id, seq, None, "principal")]
    f = rep["findings"][0]
    assert (f["expected"], f["found"]) == ("alice", "mallory")
    out = repair(d)
    assert [(a["class"], a["action"], a["seqs"]) for a in out["repair"]["actions"]] == [("row-mismatch", "rebuild", [seq])]
    assert_clean_after_refill(d)


def test_a_deleted_parquet_file_makes_the_table_unreadable_by_name(served):
    d = served
    populated(d)
    files = data_files(d, BRONZE)
    victim = sorted(files)[0]
    (d.home / "lake" / BRONZE / victim).unlink()
    code, rep = reconcile(d, "--no-objects", code=3)
    assert brief(rep) == [("table-unreadable", BRONZE, None, None, victim, None)]
    out = repair(d)
    assert [(a["tenant"], a["class"], a["action"], a["keys"]) for a in out["repair"]["actions"]] == [
        (None, "table-unreadable", "rebuild", [victim])]
    assert_clean_after_refill(d)


def test_a_damaged_parquet_file_makes_the_table_unreadable_by_name(served):
    """A data file that is still there but no longer Parquet (a torn write, an operator's edit):
    the column scan names it instead of failing the run, and the repair rebuilds the table."""
    d = served
    populated(d)
    files = data_files(d, BRONZE)
    victim = sorted(files)[-1]
    f = d.home / "lake" / BRONZE / victim
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # truncated: no footer
    code, rep = reconcile(d, "--no-objects", code=3)
    assert brief(rep) == [("table-unreadable", BRONZE, None, None, victim, None)]
    found = rep["findings"][0]
    assert (found["expected"], found["found"]) == ("readable", "damaged")
    assert "lake-file-damaged" in found["detail"]
    out = repair(d)
    assert [(a["tenant"], a["class"], a["action"], a["keys"]) for a in out["repair"]["actions"]] == [
        (None, "table-unreadable", "rebuild", [victim])]
    assert_clean_after_refill(d)


def test_a_lost_commit_is_uncovered_outbox(served):
    d = served
    populated(d)
    d.submit(d.writer, body="one more")
    lakewriter(d)
    lost = drop_newest_commit(d, GOLD)
    code, rep = reconcile(d, "--no-objects", code=3)
    assert brief(rep) == [("uncovered-outbox", GOLD, None, None, GOLD, "txn_version")]
    assert lost > 0
    out = repair(d, code=3)  # nothing to do but let the lake writer refill it
    assert out["repair"]["actions"] == []
    assert repair_events(d) == []
    assert_clean_after_refill(d)


def test_silver_and_gold_damage_behind_the_writer(served):
    d = served
    ids = populated(d)
    from deltalake import DeltaTable, write_deltalake
    silver = DeltaTable(str(d.home / "lake" / SILVER))
    # A demoted claim put back to promoted; a promoted one deleted; a held one's metadata released.
    silver.update(predicate=f"artifact_id = '{ids['demoted']}'", updates={"state": "'promoted'"})
    silver = DeltaTable(str(d.home / "lake" / SILVER))
    silver.delete(predicate=f"artifact_id = '{ids['promoted']}'")
    silver = DeltaTable(str(d.home / "lake" / SILVER))
    whole = silver.to_pyarrow_table()
    some = whole.to_pylist()[0]
    breach = dict(some, artifact_id=ids["held"], version=1, state="promoted")
    write_deltalake(str(d.home / "lake" / SILVER), pa.Table.from_pylist([breach], schema=whole.schema),
                    mode="append")
    gold = DeltaTable(str(d.home / "lake" / GOLD))
    g = [r for r in gold.to_pyarrow_table().to_pylist() if r["event_type"] == "claim.promoted"][0]
    gold.update(predicate="event_type = 'claim.promoted'", updates={"events": "events + 1"})
    code, rep = reconcile(d, "--no-objects", code=3)
    with d.su() as c:
        seqs = {name: c.execute("SELECT coalesce(demoted_seq, promoted_seq) FROM oml.artifacts WHERE artifact_id = %s",
                                (ids[name],)).fetchone()[0] for name in ("demoted", "promoted")}
    gold_key = f"{g['day']} {g['workarea_id'] or '-'} claim.promoted"
    assert brief(rep) == sorted([
        ("containment-breach", SILVER, d.tenant_id, None, f"{ids['held']} v1", None),
        ("count-mismatch", GOLD, d.tenant_id, None, gold_key, "events"),
        ("missing-in-lake", SILVER, d.tenant_id, seqs["promoted"], f"{ids['promoted']} v1", None),
        ("state-mismatch", SILVER, d.tenant_id, seqs["demoted"], f"{ids['demoted']} v1", "state"),
    ])
    f = {x["class"]: x for x in rep["findings"]}
    assert (f["state-mismatch"]["expected"], f["state-mismatch"]["found"]) == ("demoted", "promoted")
    assert (f["count-mismatch"]["expected"], f["count-mismatch"]["found"]) == (str(g["events"]), str(g["events"] + 1))
    out = repair(d)
    assert sorted((a["class"], a["table"], a["action"]) for a in out["repair"]["actions"]) == [
        ("containment-breach", SILVER, "rebuild"), ("count-mismatch", GOLD, "rebuild"),
        ("missing-in-lake", SILVER, "rebuild"), ("state-mismatch", SILVER, "rebuild")]
    assert_clean_after_refill(d)


def test_objects_are_audited_against_the_signed_digests(served):
    d = served
    ids = populated(d)
    with d.su() as c:
        rows = c.execute("SELECT a.artifact_id::text, encode(a.ciphertext_sha256, 'hex'), a.attach_seq "
                         "FROM oml.attachments a ORDER BY attach_seq").fetchall()
        body = c.execute("SELECT object_key FROM oml.artifact_bodies WHERE artifact_id = %s",
                         (ids["promoted"],)).fetchone()[0]
    att = {a: (h, s) for a, h, s in rows}
    q, b = bucket(d, "oml-quarantine"), bucket(d, "oml-bodies")
    held_digest, held_seq = att[ids["held"]]
    prom_digest, prom_seq = att[ids["promoted"]]
    er_digest, er_seq = att[ids["erased"]]
    rej_digest, rej_seq = att[ids["rejected"]]
    # A flipped byte in the held file (same size).
    p = q / held_digest
    raw = bytearray(p.read_bytes())
    raw[100] ^= 0x01
    p.write_bytes(bytes(raw))
    # The rejected claim's file copied into the bodies bucket: a containment breach.
    shutil.copy(q / rej_digest, b / rej_digest)
    # The promoted claim's body object lost from bodies, while a copy its promotion failed to
    # drop is still in quarantine.
    body_digest = body.split("/")[1]
    shutil.copy(b / body_digest, q / body_digest)
    (b / body_digest).unlink()
    # The erased claim's file put back.
    (b / er_digest).write_bytes(b"ciphertext whose key is gone")
    # An orphan, and a part of an upload session that never existed.
    orphan = hashlib.sha256(b"orphan").hexdigest()
    (q / orphan).write_bytes(b"left by a failed submit")
    ghost = str(uuid.uuid4())
    (q / "uploads" / ghost).mkdir(parents=True)
    (q / "uploads" / ghost / "00000001").write_bytes(b"part")
    code, rep = reconcile(d, code=3)
    with d.su() as c:
        prom_submitted = c.execute("SELECT submitted_seq FROM oml.artifacts WHERE artifact_id = %s",
                                   (ids["promoted"],)).fetchone()[0]
    t = d.tenant_id
    assert brief(rep) == sorted([
        ("erased-object-present", "bodies", t, er_seq, f"{t}/{er_digest}", None),
        ("misplaced-object", "bodies", t, rej_seq, f"{t}/{rej_digest}", "containment-breach"),
        ("misplaced-object", "quarantine", t, prom_submitted, f"{t}/{body_digest}", None),
        ("missing-object", "bodies", t, prom_submitted, f"{t}/{body_digest}", None),
        ("object-digest-mismatch", "quarantine", t, held_seq, f"{t}/{held_digest}", "ciphertext_sha256"),
        ("orphan-object", "quarantine", t, None, f"{t}/{orphan}", None),
        ("stale-upload", "quarantine", t, None, f"{t}/uploads/{ghost}/00000001", None),
    ])
    mism = [f for f in rep["findings"] if f["class"] == "object-digest-mismatch"][0]
    assert mism["expected"] == held_digest
    assert mism["found"] == hashlib.sha256(bytes(raw)).hexdigest()
    assert prom_digest  # the promoted attachment is intact: no finding names it
    body_bytes = (q / body_digest).read_bytes()
    # Repair: the body copied back from quarantine, then the leftover, the breach copy, the erased
    # file, the orphan and the stale part deleted. The flipped byte has no good copy left anywhere.
    out = repair(d, code=3)
    acts = {(a["class"], a["table"], a["action"]): a for a in out["repair"]["actions"]}
    assert sorted(acts) == sorted([
        ("erased-object-present", "bodies", "delete"), ("misplaced-object", "bodies", "delete"),
        ("misplaced-object", "quarantine", "delete"), ("missing-object", "bodies", "copy"),
        ("object-digest-mismatch", "quarantine", "copy"), ("orphan-object", "quarantine", "delete"),
        ("stale-upload", "quarantine", "delete")])
    assert not acts[("object-digest-mismatch", "quarantine", "copy")]["ok"]
    assert "no copy with the signed digest" in acts[("object-digest-mismatch", "quarantine", "copy")]["outcome"]
    assert all(a["ok"] for k, a in acts.items() if k[0] != "object-digest-mismatch")
    assert (b / body_digest).read_bytes() == body_bytes
    assert hashlib.sha256(body_bytes).hexdigest() == body_digest
    assert (q / rej_digest).exists()  # the breach's bodies copy went, the quarantine one stays
    for gone in (q / body_digest, b / rej_digest, b / er_digest, q / orphan, q / "uploads" / ghost / "00000001"):
        assert not gone.exists(), gone
    assert len(repair_events(d)) == 7
    code, rep = reconcile(d, code=3)
    assert brief(rep) == [("object-digest-mismatch", "quarantine", t, held_seq, f"{t}/{held_digest}", "ciphertext_sha256")]


def test_dead_letters_and_a_stale_frontier_are_reported(served):
    d = served
    populated(d)
    bad = poison(d, d.tenant_id, "gold/unknown", {"x": 1})
    lakewriter(d)
    with d.su() as c:
        dl = c.execute("SELECT id, journal_seq, skipped_seq FROM oml.dead_letter WHERE outbox_seq = %s",
                       (bad,)).fetchone()
    assert dl is not None
    d.submit(d.writer, body="not yet in the lake")
    code, rep = reconcile(d, "--no-objects", "--stale-after", "0", code=3)
    assert brief(rep) == sorted([
        ("dead-lettered", "gold/unknown", d.tenant_id, dl[1], f"dead letter {dl[0]}", None),
        ("stale-frontier", "outbox", None, None, "default", "lag_seconds"),
    ])
    f = [x for x in rep["findings"] if x["class"] == "dead-lettered"][0]
    assert f"materialize-skipped at seq {dl[2]}" in f["detail"]
    # The undelivered claim is lag, not a missing row; with a generous bound it is not stale either.
    code, rep = reconcile(d, "--no-objects", code=3)
    assert [x["class"] for x in rep["findings"]] == ["dead-lettered"]
    doc = d.run("doctor", check=False)
    assert doc.returncode == 3, doc.stdout
    assert 'RECONCILE: last run ' in doc.stdout and '1 finding(s) {"dead-lettered": 1}' in doc.stdout, doc.stdout
    prom = d.home / "reconcile.prom"
    with no_keys(d):
        r = d.run("reconcile", "--no-objects", "--metrics-file", str(prom), env=KEYLESS, check=False)
    assert r.returncode == 3
    assert 'oml_reconcile_findings{class="dead-lettered"} 1\n' in prom.read_text()


def test_tenant_scope_and_access_errors(served):
    d = served
    populated(d)
    code, rep = reconcile(d, "--tenant", d.tenant_id, code=0)
    assert rep["summary"]["tenants"] == 1
    with no_keys(d):
        r = d.run("reconcile", "--tenant", str(uuid.uuid4()), env=KEYLESS, check=False)
    assert r.returncode == 4, r.stderr
    assert "tenant-not-found" in r.stderr
    with no_keys(d):
        r = d.run("reconcile", "--stream", "nope", env=KEYLESS, check=False)
    assert r.returncode == 4, r.stderr


def test_a_chain_that_cannot_be_replayed_blocks_every_repair(served):
    """One event whose signed bytes do not parse: the audit names it and reports nothing else about
    its tenant's objects and rows (their claims are unknown past it, so every object would look
    orphaned), and --repair touches nothing, saying why."""
    d = served
    ids = populated(d)
    with d.su() as c:
        seq = c.execute("SELECT submitted_seq FROM oml.artifacts WHERE artifact_id = %s", (ids["held"],)).fetchone()[0]
        c.execute("SET session_replication_role = replica")  # the journal's guard trigger off
        c.execute("UPDATE oml.journal SET signed_bytes = 'not json'::bytea WHERE tenant_id = %s AND seq = %s",
                  (d.tenant_id, seq))
    q = bucket(d, "oml-quarantine")
    before = sorted(p.name for p in q.iterdir() if p.is_file())
    code, rep = reconcile(d, code=3)
    assert brief(rep) == [("journal-unreadable", "journal", d.tenant_id, seq, None, None)]
    out = repair(d, code=3)
    assert out["repair"]["actions"] == []
    assert out["repair"]["refused"].startswith(f"tenant {d.tenant_id}'s chain could not be replayed past seq {seq}")
    assert repair_events(d) == []
    assert sorted(p.name for p in q.iterdir() if p.is_file()) == before


def test_a_running_lake_writer_and_arriving_claims_are_never_findings(served):
    """Two actors on the same tables: claims keep arriving and a lake writer keeps draining them
    while the audit reads the lake and the journal. Lag (rows not yet delivered) and a table read
    ahead of the frontier are never findings: every run is clean."""
    import threading
    d = served
    populated(d)
    stop = threading.Event()
    errors = []

    def submit():
        i = 0
        while not stop.is_set():
            r = d.submit(d.writer, body=f"arriving {i}")
            if r.status_code != 201:
                errors.append(r.text)
            i += 1

    p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "20", "--max-rows", "7"], env=d.env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = threading.Thread(target=submit, daemon=True)
    t.start()
    try:
        for i in range(4):
            code, rep = reconcile(d, code=0)
            assert rep["findings"] == []
            # The first run is the baseline; the others start from the run before them, read
            # while the writer drains (and compacts) and claims arrive.
            assert rep["summary"]["mode"] == ("full" if i == 0 else "incremental"), rep["summary"]["full_reason"]
    finally:
        stop.set()
        t.join(timeout=30)
        p.terminate()
        p.wait(timeout=30)
    assert errors == []
    assert_clean_after_refill(d)
