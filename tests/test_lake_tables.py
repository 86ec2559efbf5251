"""silver/claims, gold/daily_activity, dead letters and the lake writer's /metrics (issue 8).

One batch touches three tables: bronze/events (append), silver/claims (MERGE on tenant_id,
artifact_id, version: promotion inserts, demotion and erasure set the state, in outbox seq order)
and gold/daily_activity (derived by the writer from the batch's bronze rows, MERGE with the count
added). Tables are read back by readers that did not write them: the `deltalake` package and
pyarrow over the Parquet files that the JSON log names (adds minus removes), and compared with the
journal as the superuser sees it.

Poison rows (src/lake/dead_letter.h): a row the tables refuse three times is moved to
oml.dead_letter with a signed materialize-skipped event, and the frontier passes it; `oml
dead-letter requeue ID` re-enqueues it through a signed materialize-requeued event.
"""
import datetime
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests

from conftest import OML_BIN
from test_lakewriter import frontier, lakewriter, last_outbox_seq, log_lines

APP = "oml-lakewriter"
SILVER = "silver/claims"
GOLD = "gold/daily_activity"
BRONZE = "bronze/events"


# --- vocabulary ------------------------------------------------------------------------------
def deltalake_rows(d, table):
    from deltalake import DeltaTable
    return DeltaTable(str(d.home / "lake" / table)).to_pyarrow_table().to_pylist()


def log_actions(d, table):
    """Every action of every commit file, in version order: [(version, action)]."""
    out = []
    for f in sorted((d.home / "lake" / table / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            if line.strip():
                out.append((int(f.stem), json.loads(line)))
    return out


def pyarrow_rows(d, table):
    """The table's live rows read by pyarrow alone: the Parquet files added and not removed."""
    live = {}
    for _, a in log_actions(d, table):
        if "add" in a:
            live[a["add"]["path"]] = True
        if "remove" in a:
            live.pop(a["remove"]["path"], None)
    rows = []
    for path in live:
        rows += pq.read_table(d.home / "lake" / table / unquote(path)).to_pylist()
    return rows


def both_readers(d, table, key):
    """The rows by `key`, asserting deltalake and pyarrow-over-the-log read the same table."""
    a = sorted(deltalake_rows(d, table), key=key)
    b = sorted(pyarrow_rows(d, table), key=key)
    assert a == b
    return a


def silver_key(r):
    return (r["tenant_id"], r["artifact_id"], r["version"])


def gold_key(r):
    return (r["tenant_id"], r["day"], r["workarea_id"], r["event_type"])


def txn_version(d, table):
    from deltalake import DeltaTable
    return DeltaTable(str(d.home / "lake" / table)).transaction_version(APP)


def event_time(d, tenant, seq):
    with d.su() as c:
        sb = c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                       (tenant, seq)).fetchone()[0]
    return datetime.datetime.strptime(json.loads(bytes(sb))["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)


def verdict(d, token, art, v):
    r = d.post(f"/v1/claims/{art}/verdict", token, json={"verdict": v})
    assert r.status_code == 200, r.text
    return r.json()["receipt"]["seq"]


def demote(d, token, art):
    r = d.post(f"/v1/claims/{art}/demote", token, json={"reason": "outdated"})
    assert r.status_code == 200, r.text
    return r.json()["receipt"]["seq"]


def erase(d, token, art):
    r = d.post(f"/v1/claims/{art}/erase", token, json={"reason": "asked"})
    assert r.status_code == 200, r.text
    return r.json()["receipt"]["seq"]


def batches(log):
    return [line for line in log_lines(log) if line["msg"] == "lake writer: batch applied"]


def poison(d, tenant, target, row):
    """Enqueues an outbox row as the superuser, through oml.enqueue_outbox in the tenant's scope."""
    with d.su() as c:
        with c.transaction():
            c.execute("SELECT set_config('oml.tenant_id', %s, true)", (tenant,))
            return c.execute("SELECT oml.enqueue_outbox(%s, %s, 1, %s::jsonb)",
                             (tenant, target, json.dumps(row))).fetchone()[0]


def journal_types(d, tenant):
    with d.su() as c:
        return [r[0] for r in c.execute("SELECT event_type FROM oml.journal WHERE tenant_id = %s ORDER BY seq",
                                        (tenant,)).fetchall()]


# --- silver: promotion, retracts in stream order ---------------------------------------------
def test_promotion_and_demotion_in_one_batch_leave_the_row_demoted(served):
    d = served
    a = d.submit(d.writer, body="claim a", workarea_id="wa-a", path="a.md").json()
    assert d.post("/v1/simulations", d.admin, json={"simulation_id": "sim-1"}).status_code == 201
    b = d.submit(d.writer, body="claim b", workarea_id="wa-b", path="b.md", simulation_id="sim-1").json()
    held = d.submit(d.writer, body="never reviewed").json()
    rejected = d.submit(d.writer, body="rejected").json()
    pa_seq = verdict(d, d.reviewer, a["artifact_id"], "accept")
    da_seq = demote(d, d.reviewer, a["artifact_id"])
    pb_seq = verdict(d, d.reviewer, b["artifact_id"], "accept")
    verdict(d, d.reviewer, rejected["artifact_id"], "reject")

    out = lakewriter(d)
    applied = batches(out.stderr)
    assert len(applied) == 1  # promotion (seq pa) and demotion (seq da) in ONE batch
    assert sorted(c["table"] for c in applied[0]["committed"]) == [BRONZE, GOLD, SILVER]

    rows = both_readers(d, SILVER, silver_key)
    assert [r["artifact_id"] for r in rows] == sorted([a["artifact_id"], b["artifact_id"]])
    by_id = {r["artifact_id"]: r for r in rows}
    ra, rb = by_id[a["artifact_id"]], by_id[b["artifact_id"]]
    # The demotion (later seq) wins; promotion's columns stay.
    assert (ra["state"], ra["last_event_seq"]) == ("demoted", da_seq)
    assert ra["promoted_at"] == event_time(d, d.tenant_id, pa_seq)
    assert ra["state_changed_at"] == event_time(d, d.tenant_id, da_seq)
    assert ra["submitted_at"] == event_time(d, d.tenant_id, a["submitted_seq"] if "submitted_seq" in a
                                            else a["receipt"]["seq"])
    assert (ra["workarea_id"], ra["path"], ra["simulation_id"]) == ("wa-a", "a.md", None)
    assert (ra["plaintext_sha256"], ra["ciphertext_sha256"]) == (a["plaintext_sha256"], a["ciphertext_sha256"])
    assert ra["body_location"] == "postgres:oml.artifact_bodies"
    assert (rb["state"], rb["last_event_seq"], rb["simulation_id"]) == ("promoted", pb_seq, "sim-1")
    # Never plaintext, never a held body: no column holds the bodies, and held/rejected claims
    # have no row.
    for r in rows:
        assert b"claim a" not in json.dumps(r, default=str).encode()
    assert held["artifact_id"] not in by_id and rejected["artifact_id"] not in by_id
    # The silver commit is one MERGE with the batch's txn and bounds.
    merges = [(v, a) for v, a in log_actions(d, SILVER) if "commitInfo" in a and a["commitInfo"].get("oml.batch_end")]
    assert len(merges) == 1
    assert merges[0][1]["commitInfo"]["operation"] == "MERGE"
    assert txn_version(d, SILVER) == txn_version(d, BRONZE) == last_outbox_seq(d) == frontier(d)


def test_promotion_and_demotion_in_separate_batches_give_the_same_row(served):
    d = served
    a = d.submit(d.writer, body="claim a").json()
    verdict(d, d.reviewer, a["artifact_id"], "accept")
    lakewriter(d)
    assert [r["state"] for r in both_readers(d, SILVER, silver_key)] == ["promoted"]
    da_seq = demote(d, d.reviewer, a["artifact_id"])
    lakewriter(d)
    rows = both_readers(d, SILVER, silver_key)
    assert [(r["state"], r["last_event_seq"]) for r in rows] == [("demoted", da_seq)]


def test_erase_after_promotion_leaves_the_row_erased_and_verify_from_lake_passes(served):
    d = served
    a = d.submit(d.writer, body="to be erased").json()
    held = d.submit(d.writer, body="held, then erased").json()
    verdict(d, d.reviewer, a["artifact_id"], "accept")
    lakewriter(d)
    e_seq = erase(d, d.admin, a["artifact_id"])
    erase(d, d.admin, held["artifact_id"])
    lakewriter(d)
    rows = both_readers(d, SILVER, silver_key)
    assert [(r["artifact_id"], r["state"], r["last_event_seq"]) for r in rows] == [(a["artifact_id"], "erased", e_seq)]
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "FAIL" not in v.stdout


# --- gold: counts per tenant, day, workarea, type, exactly once --------------------------------
def test_gold_counts_every_bronze_row_once(served):
    d = served
    for i in range(3):
        c = d.submit(d.writer, body=f"g{i}", workarea_id=f"wa-{i % 2}").json()
        verdict(d, d.reviewer, c["artifact_id"], "accept")
    lakewriter(d, "--max-rows", "4")  # several batches, each MERGEd into gold with events added
    d.submit(d.writer, body="late", workarea_id="wa-0")
    lakewriter(d, "--max-rows", "4")
    bronze = both_readers(d, BRONZE, lambda r: r["outbox_seq"])
    want = {}
    for r in bronze:
        k = (r["tenant_id"], r["occurred_at"].astimezone(datetime.timezone.utc).date(), r["workarea_id"] or "",
             r["event_type"])
        n, last = want.get(k, (0, 0))
        want[k] = (n + 1, max(last, r["outbox_seq"]))
    gold = both_readers(d, GOLD, gold_key)
    assert {gold_key(r): (r["events"], r["last_outbox_seq"]) for r in gold} == want
    assert len(gold) == len(want)
    # claim.submitted rows count under their workarea; tenant-level events under "".
    assert want[(d.tenant_id, datetime.datetime.now(datetime.timezone.utc).date(), "wa-0", "claim.submitted")][0] == 3
    assert txn_version(d, GOLD) == last_outbox_seq(d)
    # With the journal too: every event of every chain is counted once.
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.journal").fetchone()[0] == sum(r["events"] for r in gold)


# --- dead letters ------------------------------------------------------------------------------
def test_a_row_for_an_unknown_table_is_dead_lettered_with_a_signed_event(served):
    d = served
    d.submit(d.writer, body="before")
    bad = poison(d, d.tenant_id, "silver/unknown", {"x": 1})
    d.submit(d.writer, body="after")
    head_before = len(journal_types(d, d.tenant_id))

    out = lakewriter(d)
    lines = log_lines(out.stderr)
    refused = [ln for ln in lines if ln["msg"] == "lake writer: a row is refused"]
    assert [(ln["outbox_seq"], ln["attempt"]) for ln in refused] == [(bad, 1), (bad, 2), (bad, 3)]
    moved = [ln for ln in lines if ln["msg"] == "lake writer: row dead-lettered"]
    assert [(ln["outbox_seq"], ln["dead_letter_id"], ln["attempts"]) for ln in moved] == [(bad, 1, 3)]

    with d.su() as c:
        dl = c.execute("SELECT id, outbox_seq, tenant_id::text, target_table, journal_seq, attempts, skipped_seq, "
                       "payload_ref, requeued_at FROM oml.dead_letter").fetchall()
        assert len(dl) == 1
        assert dl[0][:7] == (1, bad, d.tenant_id, "silver/unknown", 1, 3, head_before + 1)
        assert dl[0][7] == {"x": 1} and dl[0][8] is None
        sb = c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                       (d.tenant_id, head_before + 1)).fetchone()[0]
    env = json.loads(bytes(sb))
    assert (env["type"], env["principal"]) == ("materialize-skipped", "system:lakewriter")
    assert {k: env["payload"][k] for k in ("stream", "outbox_seq", "target_table", "journal_seq", "attempts")} == \
        {"stream": "default", "outbox_seq": bad, "target_table": "silver/unknown", "journal_seq": 1, "attempts": 3}
    assert "unknown-target-table" in env["payload"]["error"]
    # The frontier passed the poison row; the rows around it landed; the skip event lands next.
    assert frontier(d) >= bad + 1
    lakewriter(d)
    bronze_types = [r["event_type"] for r in deltalake_rows(d, BRONZE) if r["tenant_id"] == d.tenant_id]
    assert bronze_types.count("materialize-skipped") == 1
    assert bad not in [r["outbox_seq"] for r in deltalake_rows(d, BRONZE)]
    assert frontier(d) == last_outbox_seq(d)
    assert d.run("verify", check=False).returncode == 0
    assert d.run("verify", "--from-lake", check=False).returncode == 0
    listed = [json.loads(x) for x in d.run("dead-letter", "list", "--json").stdout.splitlines()]
    assert [(x["id"], x["outbox_seq"], x["target_table"], x["attempts"], x["skipped_seq"], x["requeued_at"])
            for x in listed] == [(1, bad, "silver/unknown", 3, head_before + 1, None)]


def test_a_poison_row_is_requeued_after_the_cause_is_fixed_and_applied_once(served):
    d = served
    from deltalake import DeltaTable, write_deltalake
    # The cause: silver/claims replaced by a table of an older schema (no media_type column), so
    # promotion's silver row does not fit it.
    silver = d.home / "lake" / SILVER
    good = DeltaTable(str(silver)).to_pyarrow_table().schema
    old = pa.schema([f for f in good if f.name != "media_type"])
    shutil.rmtree(silver)
    write_deltalake(str(silver), old.empty_table(), mode="overwrite")

    c = d.submit(d.writer, body="promote me").json()
    p_seq = verdict(d, d.reviewer, c["artifact_id"], "accept")
    out = lakewriter(d)
    moved = [ln for ln in log_lines(out.stderr) if ln["msg"] == "lake writer: row dead-lettered"]
    assert len(moved) == 1
    with d.su() as cn:
        (dl_id, dl_seq, target, jseq, err) = cn.execute(
            "SELECT id, outbox_seq, target_table, journal_seq, error FROM oml.dead_letter").fetchone()
    assert (target, jseq) == (SILVER, p_seq)
    assert "media_type" in err
    # Bronze and gold have the batch; silver does not.
    assert "claim.promoted" in [r["event_type"] for r in deltalake_rows(d, BRONZE)]
    assert deltalake_rows(d, SILVER) == []

    # Fix: the old table moved aside, `oml init` creates the right one; then requeue.
    shutil.rmtree(silver)
    d.init()
    r = d.run("dead-letter", "requeue", str(dl_id))
    doc = json.loads(r.stdout)
    new_seq = doc["outbox_seq"]
    assert new_seq > dl_seq
    env = json.loads(__import__("base64").b64decode(doc["receipt"]["signed_bytes"]))
    assert (env["type"], env["payload"]["dead_letter_id"], env["payload"]["outbox_seq"]) == \
        ("materialize-requeued", dl_id, dl_seq)
    # Once only: a second requeue is refused (exit 4, dead-letter-requeued) and journals nothing.
    n_events = len(journal_types(d, d.tenant_id))
    again = d.run("dead-letter", "requeue", str(dl_id), check=False)
    assert again.returncode == 4, again.stderr
    assert "dead-letter-requeued" in again.stderr
    assert len(journal_types(d, d.tenant_id)) == n_events

    lakewriter(d)
    lakewriter(d)  # a second run applies nothing twice
    rows = both_readers(d, SILVER, silver_key)
    assert [(r["artifact_id"], r["state"], r["last_event_seq"], r["outbox_seq"]) for r in rows] == \
        [(c["artifact_id"], "promoted", p_seq, new_seq)]
    assert rows[0]["media_type"] == "text/plain"
    with d.su() as cn:
        assert cn.execute("SELECT requeued_outbox_seq FROM oml.dead_letter WHERE id = %s", (dl_id,)).fetchone()[0] \
            == new_seq
    types = journal_types(d, d.tenant_id)
    assert types.count("materialize-skipped") == 1 and types.count("materialize-requeued") == 1
    assert d.run("verify", check=False).returncode == 0
    assert d.run("verify", "--from-lake", check=False).returncode == 0


ORDERS = [["requeue"], ["demote", "requeue"], ["requeue", "demote"], ["erase", "requeue"],
          ["demote", "erase", "requeue"], ["demote", "requeue", "erase"], ["requeue", "erase"]]


@pytest.mark.parametrize("acts", ORDERS, ids=["-".join(o) for o in ORDERS])
def test_a_requeued_promotion_never_puts_an_older_state_back(served, acts):
    """Issue 18: the promotion's silver row is dead-lettered (silver has an older schema); the
    table is fixed; then demote, erase and the promotion's requeue come in every order, with the
    lake writer run after each. Silver applies a row only when it is newer by chain seq, so after
    every step it equals the journal's fold: the state PostgreSQL holds, set by the newest act."""
    d = served
    from deltalake import DeltaTable, write_deltalake
    silver = d.home / "lake" / SILVER
    good = DeltaTable(str(silver)).to_pyarrow_table().schema
    shutil.rmtree(silver)
    write_deltalake(str(silver), pa.schema([f for f in good if f.name != "media_type"]).empty_table(), mode="overwrite")
    c = d.submit(d.writer, body="promote me").json()
    art = c["artifact_id"]
    newest = verdict(d, d.reviewer, art, "accept")
    lakewriter(d)
    with d.su() as cn:
        (dl_id,) = cn.execute("SELECT id FROM oml.dead_letter").fetchone()
    shutil.rmtree(silver)
    d.init()
    for act in acts:
        if act == "requeue":
            d.run("dead-letter", "requeue", str(dl_id))
        elif act == "demote":
            newest = demote(d, d.admin, art)
        else:
            newest = erase(d, d.admin, art)
        lakewriter(d)
        with d.su() as cn:
            state = cn.execute("SELECT state FROM oml.artifacts WHERE tenant_id = %s AND artifact_id = %s",
                               (d.tenant_id, art)).fetchone()[0]
        rows = both_readers(d, SILVER, silver_key)
        assert [(r["artifact_id"], r["state"], r["last_event_seq"]) for r in rows] == [(art, state, newest)], \
            (acts, act)
    assert d.run("verify", "--from-lake", check=False).returncode == 0


def bronze_copies(d, tenant, seq):
    return sum(1 for r in deltalake_rows(d, BRONZE) if (r["tenant_id"], r["seq"]) == (tenant, seq))


def gold_events(d, tenant, event_type):
    return sum(r["events"] for r in deltalake_rows(d, GOLD) if (r["tenant_id"], r["event_type"]) == (tenant, event_type))


def test_a_row_bronze_holds_is_requeued_only_to_the_tables_that_lack_it(served):
    """Issue 18: gold refuses a row that bronze already committed in the same batch; the dead letter
    records applied_tables ["bronze/events"] (in its signed event too), and each requeue goes to gold
    only. Before sql/0019 every requeue appended another bronze copy (three after two requeues)."""
    d = served
    r = d.submit(d.writer, body="counted late")
    assert r.status_code == 201, r.text
    seq = r.json()["receipt"]["seq"]
    with d.su() as c:
        (o1,) = c.execute("SELECT seq FROM oml.outbox WHERE tenant_id = %s AND journal_seq = %s AND "
                          "target_table = %s", (d.tenant_id, seq, BRONZE)).fetchone()
    out = lakewriter(d, env={"OML_FAULT": f"lakewriter.gold.count.{o1}"})
    moved = [ln for ln in log_lines(out.stderr) if ln["msg"] == "lake writer: row dead-lettered"]
    assert [ln["outbox_seq"] for ln in moved] == [o1]
    with d.su() as c:
        (dl1, applied, skipped) = c.execute("SELECT id, applied_tables, skipped_seq FROM oml.dead_letter "
                                           "WHERE outbox_seq = %s", (o1,)).fetchone()
        sb = c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                       (d.tenant_id, skipped)).fetchone()[0]
    assert applied == [BRONZE]
    assert json.loads(bytes(sb))["payload"]["applied_tables"] == [BRONZE]
    listed = [json.loads(x) for x in d.run("dead-letter", "list", "--json").stdout.splitlines()]
    assert [(x["id"], x["applied_tables"]) for x in listed] == [(dl1, [BRONZE])]
    assert bronze_copies(d, d.tenant_id, seq) == 1
    assert gold_events(d, d.tenant_id, "claim.submitted") == 0
    # Bronze committed the batch in the attempt that the poison row stopped; the attempt that
    # advanced the frontier skipped it, and still recorded what it holds (sql/0018).
    with d.su() as c:
        recorded = dict(c.execute("SELECT table_name, txn_version FROM oml.lake_table_txn").fetchall())
    assert recorded[BRONZE] == recorded[GOLD] == frontier(d)

    # The first requeue: the new row skips bronze; gold's fault is armed at the new seq, so it is
    # dead-lettered again, and that dead letter names bronze too (its row skipped it).
    o2 = json.loads(d.run("dead-letter", "requeue", str(dl1)).stdout)["outbox_seq"]
    with d.su() as c:
        assert c.execute("SELECT skip_tables FROM oml.outbox WHERE seq = %s", (o2,)).fetchone()[0] == [BRONZE]
    lakewriter(d, env={"OML_FAULT": f"lakewriter.gold.count.{o2}"})
    with d.su() as c:
        (dl2, applied2) = c.execute("SELECT id, applied_tables FROM oml.dead_letter WHERE outbox_seq = %s",
                                    (o2,)).fetchone()
    assert applied2 == [BRONZE]
    assert bronze_copies(d, d.tenant_id, seq) == 1
    assert gold_events(d, d.tenant_id, "claim.submitted") == 0

    # The second requeue, with nothing refusing it: gold counts the event once; bronze still once.
    d.run("dead-letter", "requeue", str(dl2))
    lakewriter(d)
    lakewriter(d)
    assert bronze_copies(d, d.tenant_id, seq) == 1
    assert gold_events(d, d.tenant_id, "claim.submitted") == 1
    with d.su() as c:
        # Every journal event is in bronze once, and counted in gold once.
        n = c.execute("SELECT count(*) FROM oml.journal").fetchone()[0]
    bronze = deltalake_rows(d, BRONZE)
    assert len(bronze) == n == len({(x["tenant_id"], x["seq"]) for x in bronze})
    assert sum(x["events"] for x in deltalake_rows(d, GOLD)) == n
    assert d.run("verify", "--from-lake", check=False).returncode == 0


def test_the_lakewriter_role_cannot_dead_letter_without_the_lease_or_forge_the_event(served):
    d = served
    bad = poison(d, d.tenant_id, "silver/unknown", {"x": 2})
    lw_url = (d.home / "pg" / "lakewriter.url").read_text().strip()
    import psycopg
    with psycopg.connect(lw_url) as c:
        # Wrong epoch: refused (the lease is at epoch 0, nobody holds it).
        try:
            c.execute("SELECT * FROM oml.lake_dead_letter_begin('default', 7, %s)", (bad,))
            raise AssertionError("a wrong lease epoch was accepted")
        except psycopg.errors.InsufficientPrivilege as e:
            assert "lease" in str(e)
        c.rollback()
        # The right epoch, but a forged event (another type) is refused, and nothing is written.
        epoch = c.execute("SELECT lease_epoch FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]
        head = c.execute("SELECT tenant_id, head_seq, head_hash FROM oml.lake_dead_letter_begin('default', %s, %s)",
                         (epoch, bad)).fetchone()
        forged = json.dumps({"type": "claim.promoted", "tenant": str(head[0]), "seq": head[1] + 1}).encode()
        try:
            c.execute("SELECT oml.lake_dead_letter_commit('default', %s, %s, %s, %s, sha256(%s), %s, %s, %s::jsonb, "
                      "'x', 1, '{}')", (epoch, bad, head[1] + 1, head[2], forged, forged, b"\0" * 64, "{}"))
            raise AssertionError("a forged event was accepted")
        except psycopg.errors.InsufficientPrivilege as e:
            assert "not a materialize-skipped event" in str(e)
        c.rollback()
        # No direct writes to dead_letter or the journal.
        for sql in ("INSERT INTO oml.dead_letter (stream, outbox_seq, tenant_id, target_table, journal_seq, "
                    "payload_ref, error, attempts) VALUES ('default', 1, gen_random_uuid(), 'x', 1, '{}', 'e', 1)",
                    "UPDATE oml.dead_letter SET requeued_at = now()",
                    "SELECT oml.requeue_dead_letter(1, 1)"):
            try:
                c.execute(sql)
                raise AssertionError(f"{sql} was allowed")
            except psycopg.errors.InsufficientPrivilege:
                c.rollback()
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.dead_letter").fetchone()[0] == 0
        assert "materialize-skipped" not in journal_types(d, d.tenant_id)


# --- the lake writer's /metrics ------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text, name, labels=""):
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_lake_writer_serves_metrics_lag_batches_commits_retries(served):
    d = served
    for i in range(4):
        d.submit(d.writer, body=f"m{i}")
    bad = poison(d, d.tenant_id, "silver/unknown", {"x": 3})
    port = free_port()
    p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"],
                         env={**d.env, "OML_LAKEWRITER_METRICS_LISTEN": f"127.0.0.1:{port}"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    def gold_source_rows():
        return sum(a["commitInfo"]["operationMetrics"]["num_source_rows"] for _, a in log_actions(d, GOLD)
                   if "commitInfo" in a and "oml.batch_end" in a["commitInfo"])

    try:
        text = ""
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except requests.ConnectionError:
                text = ""
            # Gold trails the frontier until the writer is idle (--gold-every-ms): caught up means
            # its catch-up commit is in the metrics too.
            if metric(text, "oml_lake_position", 'what="frontier_seq"') == last_outbox_seq(d) and \
                    metric(text, "oml_lake_position", 'what="lag_rows"') == 0 and \
                    metric(text, "oml_lake_rows_total", 'table="gold/daily_activity"') == gold_source_rows():
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the writer's metrics never showed it caught up:\n" + text)
        bronze = deltalake_rows(d, BRONZE)
        assert metric(text, "oml_lake_rows_total", 'table="bronze/events"') == len(bronze)
        assert metric(text, "oml_lake_rows_total", 'table="gold/daily_activity"') == gold_source_rows() > 0
        n_bronze_commits = sum(1 for _, a in log_actions(d, BRONZE)
                               if "commitInfo" in a and "oml.batch_end" in a["commitInfo"])
        assert metric(text, "oml_lake_commit_seconds_count", 'table="bronze/events"') == n_bronze_commits
        assert metric(text, "oml_lake_batch_rows_count") == n_bronze_commits
        # The poison row: two refused attempts retried, the third moved it aside.
        assert metric(text, "oml_lake_retries_total", 'kind="row-refused"') == 2
        assert metric(text, "oml_lake_dead_letters_total") == 1
        assert metric(text, "oml_lake_position", 'what="lag_seconds"') == 0
        assert bad not in [r["outbox_seq"] for r in bronze]
    finally:
        p.terminate()
        p.wait(timeout=20)
    # JSON log lines, one object each.
    assert all(json.loads(line)["msg"] for line in p.stderr.read().splitlines() if line.strip())


@pytest.mark.parametrize("failing", [BRONZE, SILVER, GOLD])
def test_a_batch_whose_table_commit_fails_beside_the_others_then_restart_applies_it_once(served, failing):
    """A batch's tables are committed at once: one table's commit fails (on its own thread)
    while the other two land, and the writer gives up (each of its attempts fails there). The
    restart rebuilds the batch from the bounds a table ahead recorded, skips the two, commits
    the failing one, and nothing is applied twice: bronze holds each event once, the demoted
    row is merged once (one MERGE commit for the batch), gold counts each event once."""
    d = served
    a = d.submit(d.writer, body="crash a").json()
    verdict(d, d.reviewer, a["artifact_id"], "accept")
    da_seq = demote(d, d.reviewer, a["artifact_id"])
    first = lakewriter(d, env={"OML_FAULT": f"lakewriter.commit.{failing}"}, check=False)
    assert first.returncode == 1, first.stderr
    lines = first.stderr.splitlines()
    assert lines[-1] == f"oml: internal(injected-fault): injected fault at lakewriter.commit.{failing}"
    failed = [ln for ln in log_lines("\n".join(lines[:-1])) if ln["msg"] == "lake writer: batch failed"]
    assert len(failed) == 5 and all("injected" in ln["error"] for ln in failed), failed
    last = last_outbox_seq(d)
    tables = [BRONZE, SILVER, GOLD]
    # Sequential commits would have stopped at the failing table: the ones after it would be empty.
    assert [txn_version(d, t) for t in tables] == [None if t == failing else last for t in tables]
    assert frontier(d) == 0
    second = lakewriter(d)
    recovered = [ln for ln in log_lines(second.stderr) if ln["msg"] == "lake writer: recovering a batch from the Delta log"]
    assert [(ln["batch_start"], ln["batch_end"]) for ln in recovered] == [(0, last)]
    applied = batches(second.stderr)
    assert [sorted(applied[0]["skipped"]), [c["table"] for c in applied[0]["committed"]]] == \
        [sorted(t for t in tables if t != failing), [failing]]
    assert [txn_version(d, t) for t in tables] == [last] * 3
    with d.su() as c:
        journal = sorted((str(t), s) for t, s in c.execute("SELECT tenant_id, seq FROM oml.journal").fetchall())
    assert sorted((r["tenant_id"], r["seq"]) for r in deltalake_rows(d, BRONZE)) == journal
    rows = both_readers(d, SILVER, silver_key)
    assert [(r["state"], r["last_event_seq"]) for r in rows] == [("demoted", da_seq)]
    merges = [a for _, a in log_actions(d, SILVER) if "commitInfo" in a and "oml.batch_end" in a["commitInfo"]]
    assert len(merges) == 1
    assert txn_version(d, GOLD) == last == frontier(d)
    gold = both_readers(d, GOLD, gold_key)
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.journal").fetchone()[0] == sum(r["events"] for r in gold)
