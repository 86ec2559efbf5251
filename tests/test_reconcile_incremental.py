"""`oml reconcile` incremental (issue 20): a run starts from the newest clean run's checkpoint and
re-reads only what changed since (the new journal events and bronze files, the claims they name,
the objects whose listing changed), finds what a full run finds, and falls back to a full run,
saying why, when what it would trust has changed under it."""
import os

import pyarrow as pa

from test_attachments import bucket, upload
from test_lake_tables import BRONZE, GOLD, SILVER, erase, verdict
from test_lakewriter import lakewriter
from test_reconcile import brief, head, populated, reconcile


def runs(d):
    """(id, findings, has an incremental checkpoint) of every recorded run, oldest first."""
    with d.su() as c:
        return c.execute("SELECT id, findings, checkpoint ? 'incremental' FROM oml.reconcile_runs ORDER BY id").fetchall()


def journal_count(d):
    with d.su() as c:
        return c.execute("SELECT count(*) FROM oml.journal").fetchone()[0]


def test_an_incremental_run_reads_only_what_changed_and_finds_what_a_full_run_finds(served):
    d = served
    ids = populated(d)
    t = d.tenant_id
    # 1. No baseline yet: a full run, which records one.
    _, rep = reconcile(d, code=0)
    s = rep["summary"]
    assert (s["mode"], s["baseline_run"], s["checkpoint"]) == ("full", None, "recorded")
    assert s["full_reason"].startswith("no baseline"), s["full_reason"]
    assert s["objects_read"] == 4
    first = runs(d)[-1]
    assert first[1:] == (0, True)
    # 2. Nothing changed: nothing of the journal, bronze or the buckets is read again.
    _, rep = reconcile(d, code=0)
    s = rep["summary"]
    assert (s["mode"], s["baseline_run"], s["full_reason"]) == ("incremental", first[0], None)
    assert (s["events"], s["rows"]["bronze/events"], s["events_seeded"]) == (0, 0, 0)
    assert (s["objects_read"], s["objects_unchanged"]) == (0, 4)
    assert s["rows"]["silver/claims"] == 4  # silver is read whole, rows compared with their digests
    second = runs(d)[-1]
    # 3. New events: a new claim with a file, the held claim promoted (its file moves to bodies),
    # the demoted claim erased.
    n0 = journal_count(d)
    h0 = head(d)
    new = d.submit(d.writer, body="a new one", attachments=[upload(d, d.writer, os.urandom(3000))]).json()["artifact_id"]
    assert d.get(f"/v1/claims/{ids['held']}", d.reviewer).status_code == 200
    assert d.get(f"/v1/claims/{ids['held']}/attachments/1", d.reviewer).status_code == 200
    verdict(d, d.reviewer, ids["held"], "accept")
    erase(d, d.admin, ids["demoted"])
    lakewriter(d)
    _, rep = reconcile(d, code=0)
    s = rep["summary"]
    assert (s["mode"], s["baseline_run"]) == ("incremental", second[0])
    assert journal_count(d) - n0 == head(d) - h0  # every new event is the tenant's
    assert s["events"] == head(d) - h0
    assert s["rows"]["bronze/events"] == head(d) - h0  # only the files the lake writer added
    # The held claim's submission and attach, the demoted claim's submission, promotion and
    # demotion: replayed from the journal so that the two claims' rows and files are judged whole.
    assert s["events_seeded"] == 5
    # Read: the new file (quarantine) and the held claim's file (now in bodies); the promoted
    # claim's body and file and the rejected claim's file are listed as they were.
    assert (s["objects_read"], s["objects_unchanged"]) == (2, 3)
    assert s["rows"]["silver/claims"] == 5
    third = runs(d)[-1]
    _, full = reconcile(d, "--full", code=0)
    assert (full["summary"]["mode"], full["summary"]["full_reason"]) == ("full", "--full")
    assert full["summary"]["events"] == journal_count(d)
    # 4. Damage an incremental run must find without reading what it trusts.
    from deltalake import DeltaTable, write_deltalake
    with d.su() as c:
        att = dict(c.execute("SELECT artifact_id::text, encode(ciphertext_sha256, 'hex') FROM oml.attachments").fetchall())
    q, b = bucket(d, "oml-quarantine"), bucket(d, "oml-bodies")
    p = q / att[ids["rejected"]]  # a flipped byte, same size: its time changed, so it is read again
    raw = bytearray(p.read_bytes())
    raw[10] ^= 0x01
    p.write_bytes(bytes(raw))
    (b / att[new]).write_bytes((q / att[new]).read_bytes())  # the new held claim's file released
    silver = DeltaTable(str(d.home / "lake" / SILVER))  # an untouched claim's row changed
    silver.update(predicate=f"artifact_id = '{ids['promoted']}'", updates={"path": "'elsewhere'"})
    bronze = DeltaTable(str(d.home / "lake" / BRONZE))  # a duplicate commit of a row the baseline saw
    whole = bronze.to_pyarrow_table()
    row = sorted((r for r in whole.to_pylist() if r["tenant_id"] == t), key=lambda r: r["seq"])[3]
    write_deltalake(str(d.home / "lake" / BRONZE), pa.Table.from_pylist([row], schema=whole.schema), mode="append")
    gold = DeltaTable(str(d.home / "lake" / GOLD))
    g = [r for r in gold.to_pyarrow_table().to_pylist() if r["event_type"] == "claim.rejected"][0]
    gold.update(predicate="event_type = 'claim.rejected'", updates={"events": "events + 1"})
    gold_key = f"{g['day']} {g['workarea_id'] or '-'} claim.rejected"
    with d.su() as c:
        seq = dict(c.execute("SELECT artifact_id::text, attach_seq FROM oml.attachments").fetchall())
    _, rep = reconcile(d, code=3)
    s = rep["summary"]
    assert (s["mode"], s["baseline_run"]) == ("incremental", third[0] + 1)  # the --full run, clean
    assert s["events"] == 0 and s["rows"]["bronze/events"] == 1
    assert brief(rep) == sorted([
        ("count-mismatch", GOLD, t, None, gold_key, "events"),
        ("duplicate-in-lake", BRONZE, t, row["seq"], None, None),
        ("misplaced-object", "bodies", t, seq[new], f"{t}/{att[new]}", "containment-breach"),
        ("object-digest-mismatch", "quarantine", t, seq[ids["rejected"]], f"{t}/{att[ids['rejected']]}",
         "ciphertext_sha256"),
        ("state-mismatch", SILVER, t, None, f"{ids['promoted']} v1", None),
    ])
    assert s["checkpoint"] == "a run with findings is no baseline" and runs(d)[-1][1:] == (5, False)
    # A full run names the silver column.
    _, rep = reconcile(d, "--full", code=3)
    named = [f for f in rep["findings"] if f["class"] == "state-mismatch"]
    assert [(f["column"], f["expected"], f["found"]) for f in named] == [("path", named[0]["expected"], "elsewhere")]
    assert len(rep["findings"]) == 5


def test_a_changed_baseline_file_or_chain_makes_the_run_full_and_says_why(served):
    d = served
    populated(d)
    reconcile(d, "--no-objects", code=0)
    _, rep = reconcile(d, "--no-objects", code=0)
    assert rep["summary"]["mode"] == "incremental"
    # A baseline run with the buckets is needed for a run with them.
    _, rep = reconcile(d, code=0)
    assert rep["summary"]["mode"] == "full"
    assert rep["summary"]["full_reason"].startswith("no baseline: no earlier run of this stream over every tenant and "
                                                    "both buckets"), rep["summary"]["full_reason"]
    _, rep = reconcile(d, code=0)
    assert rep["summary"]["mode"] == "incremental"
    # A baseline data file of bronze rewritten (same rows, a new file written over it): full.
    from test_reconcile import data_files
    path = sorted(data_files(d, BRONZE))[0]
    f = d.home / "lake" / BRONZE / path
    data = f.read_bytes()
    f.write_bytes(data)
    os.utime(f, (1, 1))
    _, rep = reconcile(d, code=0)
    assert rep["summary"]["mode"] == "full"
    assert rep["summary"]["full_reason"] == (f"bronze/events data file {path} was rewritten in place since baseline "
                                             f"run {runs(d)[-2][0]} (damage)")
    # A --tenant run reads incrementally too, but records no checkpoint.
    _, rep = reconcile(d, "--tenant", d.tenant_id, code=0)
    assert rep["summary"]["mode"] == "incremental"
    assert rep["summary"]["checkpoint"] == "a --tenant run records no checkpoint"
    assert runs(d)[-1][2] is False
    # The chain the baseline ended at, as if restored from an older backup and written again:
    # simulated by pointing the baseline's head hash elsewhere.
    with d.su() as c:
        c.execute("UPDATE oml.reconcile_runs SET checkpoint = jsonb_set(checkpoint, "
                  "ARRAY['incremental', 'chains', %s, '1'], to_jsonb(repeat('0', 64))) "
                  "WHERE id = (SELECT max(id) FROM oml.reconcile_runs WHERE tenant_id IS NULL)", (d.tenant_id,))
        base = c.execute("SELECT max(id) FROM oml.reconcile_runs WHERE tenant_id IS NULL").fetchone()[0]
        h = c.execute("SELECT checkpoint->'incremental'->'chains'->%s->>0 FROM oml.reconcile_runs WHERE id = %s",
                      (d.tenant_id, base)).fetchone()[0]
    _, rep = reconcile(d, code=0)
    assert rep["summary"]["mode"] == "full"
    assert rep["summary"]["full_reason"] == (f"the chain of tenant {d.tenant_id} no longer has the event at seq {h} that "
                                             f"baseline run {base} ended at (restored or forked: run `oml verify`)")


def test_since_compares_only_what_the_events_since_then_left(served):
    d = served
    ids = populated(d)
    t = d.tenant_id
    from datetime import datetime, timedelta, timezone
    from deltalake import DeltaTable
    # Damage: a bronze row deleted, a silver row's state changed.
    bronze = DeltaTable(str(d.home / "lake" / BRONZE))
    lost = head(d) - 2
    bronze.delete(predicate=f"tenant_id = '{t}' AND seq = {lost}")
    silver = DeltaTable(str(d.home / "lake" / SILVER))
    silver.update(predicate=f"artifact_id = '{ids['demoted']}'", updates={"state": "'promoted'"})
    with d.su() as c:
        demoted_seq = c.execute("SELECT demoted_seq FROM oml.artifacts WHERE artifact_id = %s",
                                (ids["demoted"],)).fetchone()[0]
    want = sorted([("missing-in-lake", BRONZE, t, lost, None, None),
                   ("state-mismatch", SILVER, t, demoted_seq, f"{ids['demoted']} v1", "state")])
    # Since a day ago: every event is in the window, found as a full run finds it.
    _, rep = reconcile(d, "--since", "1d", code=3)
    s = rep["summary"]
    assert (s["mode"], s["checkpoint"], s["baseline_run"]) == ("since", "a --since run records no checkpoint", None)
    assert s["events"] == journal_count(d)
    assert brief(rep) == want
    _, rep = reconcile(d, "--full", code=3)
    assert brief(rep) == want
    # Since the day after tomorrow: no event is in the window, and nothing before it is judged.
    # (The window opens an hour before the start of --since's UTC day, so "tomorrow" would still
    # hold this hour's events when the test runs between 23:00 and midnight UTC.)
    later = (datetime.now(timezone.utc) + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    _, rep = reconcile(d, "--since", later, code=0)
    assert (rep["summary"]["mode"], rep["summary"]["events"]) == ("since", 0)
    # Usage errors: exit 4, nothing recorded.
    n = len(runs(d))
    for args, msg in ((["--since", "yesterday"], "--since yesterday: give an RFC 3339 time"),
                      (["--since", "1d", "--full"], "--since compares part of the lake and --full all of it")):
        r = d.run("reconcile", *args, check=False)
        assert r.returncode == 4, (r.returncode, r.stderr)
        assert msg in r.stderr, r.stderr
    assert len(runs(d)) == n


def test_a_compaction_since_the_baseline_is_accounted_for_and_a_row_it_lost_is_found(served):
    d = served
    populated(d)
    t = d.tenant_id
    from deltalake import DeltaTable
    from test_lake_compaction import outside_compact
    for i in range(2):  # more small bronze files, one per drain
        assert d.submit(d.writer, body=f"more {i}").status_code == 201
        lakewriter(d)
    reconcile(d, "--no-objects", code=0)
    base = runs(d)[-1][0]
    # An OPTIMIZE (the deltalake package's) rewrites the baseline's files: their rows are read
    # again from the compacted file and found to be the same set.
    assert outside_compact(d, BRONZE) > 1
    _, rep = reconcile(d, "--no-objects", code=0)
    s = rep["summary"]
    assert (s["mode"], s["baseline_run"], s["events"]) == ("incremental", base, 0)
    assert s["rows"]["bronze/events"] == journal_count(d)  # every row was in a compacted file
    # A rewrite that drops a row: the set differs, so the run is done again in full, which names it.
    lost = head(d) - 3
    DeltaTable(str(d.home / "lake" / BRONZE)).delete(predicate=f"tenant_id = '{t}' AND seq = {lost}")
    _, rep = reconcile(d, "--no-objects", code=3)
    s = rep["summary"]
    assert s["mode"] == "full"
    assert s["full_reason"].startswith(
        f"incremental run abandoned: the rows of the 1 bronze/events data file(s) removed since baseline run "
        f"{runs(d)[-2][0]} ({journal_count(d)} rows) are not the rows of those events in the files added since "
        f"({journal_count(d) - 1})"), s["full_reason"]
    assert brief(rep) == [("missing-in-lake", BRONZE, t, lost, None, None)]


def test_a_claim_reassigned_again_while_the_lake_lags_is_replayed_from_its_earlier_reassignment(served):
    d = served
    from test_lifecycle import reassign
    art = d.submit(d.writer, workarea_id="wa-0", path="facts/moved.md").json()["artifact_id"]
    assert d.get(f"/v1/claims/{art}", d.reviewer).status_code == 200
    verdict(d, d.reviewer, art, "accept")
    assert reassign(d, d.reviewer, art, workarea_id="wa-1").status_code == 200
    lakewriter(d)
    reconcile(d, "--no-objects", code=0)  # the baseline: silver's row as of the first reassignment
    assert reassign(d, d.reviewer, art, workarea_id="wa-2").status_code == 200
    # oml.artifacts now names the second reassignment only; silver still holds the first (the lake
    # writer has not run): the row is judged as of the first, which is replayed too.
    _, rep = reconcile(d, "--no-objects", code=0)
    s = rep["summary"]
    assert (s["mode"], s["events"], s["events_seeded"]) == ("incremental", 1, 3)  # submitted, promoted, reassigned
    lakewriter(d)
    _, rep = reconcile(d, "--no-objects", code=0)
    assert rep["summary"]["mode"] == "incremental"
    from deltalake import DeltaTable
    [row] = [r for r in DeltaTable(str(d.home / "lake" / SILVER)).to_pyarrow_table().to_pylist() if r["artifact_id"] == art]
    assert row["workarea_id"] == "wa-2"
