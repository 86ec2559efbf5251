"""Outbox pruning, and tables refilled from the journal below what was pruned (issue 20, "Outbox
pruning"; issue 18, "where the outbox no longer has the rows, from rows re-derived from the
journal").

The lake writer, holding the lease, deletes outbox rows at or below the frontier older than a
retention through oml.prune_outbox (sql/0025), which records pruned_through and each tenant's mark.
A table later found behind below pruned_through (`oml lake rebuild`, lost commits) is emptied and
re-derived from the journal (lake/rederive.h) up to the mark, then refilled from the outbox above
it. Tables are read back with the `deltalake` package and pyarrow over the log; `oml verify
--from-lake` and `oml reconcile` must agree.
"""
import json
from collections import Counter

import psycopg
import pytest

from test_lake_refill import gold_counts, gold_from_bronze, journal_keys, status
from test_lake_tables import BRONZE, GOLD, SILVER, both_readers, demote, erase, silver_key, verdict
from test_lakewriter import INFO, add_events, frontier, lakewriter, log_lines


LEASE_CLASS = 0x6f6d6c77  # lake/lakewriter.h kLeaseClassId


def prune_state(d):
    """(pruned_through, rows_pruned, {tenant: (bronze mark, silver mark)})."""
    with d.su() as c:
        p = c.execute("SELECT pruned_through, rows_pruned FROM oml.outbox_prune WHERE stream = 'default'").fetchone()
        marks = dict((str(t), (b, s)) for t, b, s in c.execute(
            "SELECT tenant_id, bronze_through, silver_through FROM oml.outbox_prune_tenant "
            "WHERE stream = 'default'").fetchall())
    return p[0], p[1], marks


def expected_marks(d, through):
    """The marks a prune through `through` must record, from the outbox rows it deletes."""
    with d.su() as c:
        return dict((str(t), (b, s)) for t, b, s in c.execute(
            "SELECT tenant_id, coalesce(max(journal_seq) FILTER (WHERE target_table = 'bronze/events'), 0), "
            "coalesce(max(journal_seq) FILTER (WHERE target_table = 'silver/claims'), 0) "
            "FROM oml.outbox WHERE seq <= %s GROUP BY tenant_id", (through,)).fetchall())


def as_lease_holder(d):
    """A lakewriter-role session that holds a lake-writer lease lock, and the stream's epoch (taken
    over with a new one, as a writer does)."""
    lw = lw_conn(d)
    assert lw.execute("SELECT pg_try_advisory_lock(%s, 4242)", (LEASE_CLASS,)).fetchone()[0]
    epoch = lw.execute("UPDATE oml.lake_frontier SET lease_holder = 'test', lease_epoch = lease_epoch + 1 "
                       "WHERE stream = 'default' RETURNING lease_epoch").fetchone()[0]
    return lw, epoch


def outbox_seqs(d):
    with d.su() as c:
        return [s for (s,) in c.execute("SELECT seq FROM oml.outbox ORDER BY seq").fetchall()]


def lw_conn(d):
    return psycopg.connect((d.home / "pg" / "lakewriter.url").read_text().strip(), autocommit=True)


def bronze_keys(d):
    """(tenant, seq) -> copies in bronze, both readers agreeing (re-derived rows share outbox_seq 0,
    so rows are ordered by the chain's own key)."""
    return Counter((r["tenant_id"], r["seq"])
                   for r in both_readers(d, BRONZE, lambda r: (r["tenant_id"], r["seq"], r["outbox_seq"])))


def without_outbox_seq(rows):
    return [{k: v for k, v in r.items() if k != "outbox_seq"} for r in rows]


def test_prune_deletes_the_prefix_the_lake_holds_past_the_retention_and_records_each_tenants_mark(deployment):
    d = deployment
    add_events(d, "pr-a")
    out = lakewriter(d, "--outbox-retention-hours", "168")  # every row is younger: nothing pruned
    assert not [ln for ln in log_lines(out.stderr) if ln["msg"] == "lake writer: outbox pruned"]
    held = outbox_seqs(d)
    assert prune_state(d) == (0, 0, {})
    f = frontier(d)
    assert held and held[-1] == f
    assert held and held[-1] == f
    add_events(d, "pr-b", tenants=1)  # above the frontier: never pruned
    above = [s for s in outbox_seqs(d) if s > f]
    want_marks = expected_marks(d, f)
    # Direct calls, as the lake writer role: the outbox is not deletable, the prune needs the
    # lease (its epoch and the session's lease lock).
    with lw_conn(d) as other:
        (epoch,) = other.execute("SELECT lease_epoch FROM oml.lake_frontier WHERE stream = 'default'").fetchone()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            other.execute("DELETE FROM oml.outbox WHERE seq = %s", (held[0],))
    lw, epoch = as_lease_holder(d)
    with lw:
        with lw_conn(d) as other:  # the epoch alone is not the lease
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                other.execute("SELECT * FROM oml.prune_outbox('default', %s, 0, 10)", (epoch,))
            assert "lease" in str(e.value)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            lw.execute("SELECT * FROM oml.prune_outbox('default', %s, 0, 10)", (epoch - 1,))
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            lw.execute("SELECT * FROM oml.prune_outbox('default', %s, 0, 0)", (epoch,))
        # A bounded prefix per call: 5 rows, then the rest.
        assert lw.execute("SELECT * FROM oml.prune_outbox('default', %s, 0, 5)", (epoch,)).fetchone() == (5, held[4])
        assert outbox_seqs(d) == held[5:] + above
        n = len(held) - 5
        assert lw.execute("SELECT * FROM oml.prune_outbox('default', %s, 0, 100000)", (epoch,)).fetchone() == (n, f)
        assert lw.execute("SELECT * FROM oml.prune_outbox('default', %s, 0, 100000)", (epoch,)).fetchone() == (0, f)
        # The journal feed gives pruned events only (up to the tenant's higher mark), never more.
        tenant, (mb, ms) = next(iter(want_marks.items()))
        got = lw.execute("SELECT seq FROM oml.lake_journal_feed('default', %s, %s, 0, 1000)", (epoch, tenant)).fetchall()
        assert [s for (s,) in got] == list(range(1, max(mb, ms) + 1))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            lw.execute("SELECT * FROM oml.lake_journal_feed('default', %s, %s, 0, 10)", (epoch + 1, tenant))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            lw.execute("SELECT seq FROM oml.journal LIMIT 1")
    assert outbox_seqs(d) == above
    assert prune_state(d) == (f, len(held), want_marks)


def test_the_writer_prunes_after_it_drained_and_the_outbox_stays_bounded(deployment):
    """Rounds of events, each drained by `lakewriter --once --outbox-retention-hours 0`: the
    outbox never holds more than one round, and the lake holds every event once."""
    d = deployment
    sizes = []
    for r in range(4):
        add_events(d, f"round{r}", tenants=2, keys=3)
        out = lakewriter(d, "--outbox-retention-hours", "0", "--prune-batch", "4")
        pruned = [ln for ln in log_lines(out.stderr) if ln["msg"] == "lake writer: outbox pruned"]
        assert len(pruned) == 1 and pruned[0]["pruned_through"] == frontier(d)
        sizes.append(len(outbox_seqs(d)))
    assert sizes == [0, 0, 0, 0]
    through, rows, _ = prune_state(d)
    assert through == frontier(d) and rows == sum(journal_keys(d).values())
    assert bronze_keys(d) == journal_keys(d)


def claims_in_every_state(d):
    """Claims promoted, demoted, erased after promotion, rejected and held, and two whose body is
    an object (promoted: body_location bodies:<key>; promoted then erased: none:<key>); returns
    their ids."""
    arts = [d.submit(d.writer, body=f"state {i}").json()["artifact_id"] for i in range(6)]
    large = "".join(f"line {i}: the quick brown fox\n" for i in range(4000))  # ~124 KiB: an object
    arts += [d.submit(d.writer, body=large + str(i)).json()["artifact_id"] for i in range(2)]
    for a in arts[:4] + arts[6:]:
        verdict(d, d.reviewer, a, "accept")
    demote(d, d.reviewer, arts[1])
    erase(d, d.admin, arts[2])
    erase(d, d.admin, arts[7])
    verdict(d, d.reviewer, arts[4], "reject")
    return arts


@pytest.mark.parametrize("table", [BRONZE, SILVER, GOLD])
def test_a_table_rebuilt_after_pruning_is_re_derived_from_the_journal_each_row_once(served, table):
    d = served
    claims_in_every_state(d)
    lakewriter(d, "--outbox-retention-hours", "0")
    assert outbox_seqs(d) == []
    before = {t: both_readers(d, t, k) for t, k in ((BRONZE, lambda r: (r["tenant_id"], r["seq"])),
                                                     (SILVER, silver_key))}
    assert sorted(r["body_location"].split(":")[0] for r in before[SILVER]) == \
        ["bodies", "none", "postgres", "postgres", "postgres", "postgres"]
    gold_before = gold_counts(d)
    # Later events stay in the outbox (no writer ran since): the refill above the mark needs them.
    late = d.submit(d.writer, body="after the prune").json()["artifact_id"]
    verdict(d, d.reviewer, late, "accept")
    out = d.run("lake", "rebuild", "--table", table, "--wait", "1", check=False)
    assert out.returncode == 5, out.stderr  # emptied; no writer runs
    run = lakewriter(d, "--prune-every", "0")
    lines = log_lines(run.stderr)
    rederived = [ln for ln in lines if ln["msg"].startswith("lake writer: table re-derived")]
    assert [ln["table"] for ln in rederived] == [table]
    assert [t["behind"] for t in status(d)["tables"]] == [False, False, False]
    # Every table equals the journal, each row once; the re-derived rows carry outbox_seq 0.
    assert bronze_keys(d) == journal_keys(d) and max(bronze_keys(d).values()) == 1
    silver = both_readers(d, SILVER, silver_key)
    assert without_outbox_seq([r for r in silver if r["artifact_id"] != late]) == without_outbox_seq(before[SILVER])
    assert [r["state"] for r in silver if r["artifact_id"] == late] == ["promoted"]
    assert gold_counts(d) == gold_from_bronze(d)
    assert sum(gold_counts(d).values()) == sum(journal_keys(d).values())
    if table == BRONZE:
        zero = [r for r in both_readers(d, BRONZE, lambda r: (r["tenant_id"], r["seq"])) if r["outbox_seq"] == 0]
        assert len(zero) == len(before[BRONZE])
        assert without_outbox_seq(zero) == without_outbox_seq(before[BRONZE])
    else:
        assert {k: v for k, v in gold_counts(d).items()} != {} and gold_before
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    rec = d.run("reconcile", "--json", "--no-objects", check=False)
    assert rec.returncode == 0, rec.stdout[-3000:] + rec.stderr[-2000:]


def test_a_writer_killed_while_re_deriving_empties_and_re_derives_again_each_row_once(served):
    d = served
    claims_in_every_state(d)
    add_events(d, "kill", tenants=2)
    lakewriter(d, "--outbox-retention-hours", "0")
    assert outbox_seqs(d) == []
    silver_before = both_readers(d, SILVER, silver_key)
    for table in (BRONZE, SILVER, GOLD):
        assert d.run("lake", "rebuild", "--table", table, "--wait", "1", check=False).returncode == 5
    killed = d.run("lakewriter", "--once", "--max-rows", "3",
                   env={**INFO, "OML_FAULT": "lakewriter.rederive.after_chunk:kill"}, check=False, timeout=120)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    # One chunk of bronze landed (txn 1): the table is behind, and partly filled.
    assert 0 < sum(bronze_keys(d).values()) < sum(journal_keys(d).values())
    run = lakewriter(d, "--max-rows", "3", "--prune-every", "0")
    rederived = [ln["table"] for ln in log_lines(run.stderr) if ln["msg"].startswith("lake writer: table re-derived")]
    assert rederived == [BRONZE, SILVER, GOLD]
    assert bronze_keys(d) == journal_keys(d) and max(bronze_keys(d).values()) == 1
    assert without_outbox_seq(both_readers(d, SILVER, silver_key)) == without_outbox_seq(silver_before)
    assert gold_counts(d) == gold_from_bronze(d)
    assert sum(gold_counts(d).values()) == sum(journal_keys(d).values())
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_crash_between_table_commits_after_pruning_recovers_from_the_outbox_above_the_frontier(served):
    """Pruning never touches rows above the frontier: a writer killed between its bronze and
    silver commits (the batch half applied) is finished by the next one from the outbox."""
    d = served
    claims_in_every_state(d)
    lakewriter(d, "--outbox-retention-hours", "0")
    arts = [d.submit(d.writer, body=f"late {i}").json()["artifact_id"] for i in range(3)]
    for a in arts:
        verdict(d, d.reviewer, a, "accept")
    killed = d.run("lakewriter", "--once", "--outbox-retention-hours", "0",
                   env={**INFO, "OML_FAULT": f"lakewriter.after_commit.{BRONZE}:kill"}, check=False, timeout=120)
    assert killed.returncode == -9
    held = outbox_seqs(d)
    assert held and held[0] > prune_state(d)[0]
    run = lakewriter(d, "--outbox-retention-hours", "0")
    assert [ln for ln in log_lines(run.stderr) if ln["msg"] == "lake writer: recovering a batch from the Delta log"]
    assert not [ln for ln in log_lines(run.stderr) if ln["msg"].startswith("lake writer: table re-derived")]
    assert outbox_seqs(d) == []
    assert bronze_keys(d) == journal_keys(d) and max(bronze_keys(d).values()) == 1
    assert {r["artifact_id"] for r in both_readers(d, SILVER, silver_key) if r["state"] == "promoted"} >= set(arts)
    assert gold_counts(d) == gold_from_bronze(d)
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_lost_commits_below_the_pruned_mark_are_re_derived_and_a_dead_letter_keeps_its_place(served):
    """gold refused one row (dead-lettered, bronze holds it), then everything was pruned, then
    bronze and gold lost their newest commits (an OS crash): both are re-derived from the journal,
    bronze with the event, gold without it, as the outbox history left them."""
    d = served
    late = d.submit(d.writer, body="counted late").json()
    with d.su() as c:
        (o1,) = c.execute("SELECT seq FROM oml.outbox WHERE tenant_id = %s AND journal_seq = %s AND target_table = %s",
                          (d.tenant_id, late["receipt"]["seq"], BRONZE)).fetchone()
    lakewriter(d, env={"OML_FAULT": f"lakewriter.gold.count.{o1}"})
    for i in range(3):
        d.submit(d.writer, body=f"more {i}")
    lakewriter(d, "--outbox-retention-hours", "0")
    assert outbox_seqs(d) == []
    gold_before = gold_counts(d)
    assert sum(gold_before.values()) == sum(journal_keys(d).values()) - 1  # the dead letter
    for table in (BRONZE, GOLD):
        log = d.home / "lake" / table / "_delta_log"
        for f in sorted(log.glob("*.json"))[1:]:  # every commit but the table's creation
            f.unlink()
        for f in log.glob("*.checkpoint*"):
            f.unlink()
        (log / "_last_checkpoint").unlink(missing_ok=True)
    run = lakewriter(d)
    rederived = [ln["table"] for ln in log_lines(run.stderr) if ln["msg"].startswith("lake writer: table re-derived")]
    assert rederived == [BRONZE, GOLD]
    assert bronze_keys(d) == journal_keys(d) and max(bronze_keys(d).values()) == 1
    assert gold_counts(d) == gold_before
    rec = d.run("reconcile", "--json", "--no-objects", check=False)
    doc = json.loads(rec.stdout)
    assert Counter(f["class"] for f in doc["findings"]) == Counter({"dead-lettered": 1}), doc["findings"]


def test_a_prune_that_splits_an_event_re_derives_each_row_once(served):
    """P can fall inside one event: a promotion enqueues its silver row, then its bronze row, and a
    prune bounded by its batch size (or a frontier inside a transaction) stops between the two.
    The bronze mark then stays below that event (its bronze row is still in the outbox) while the
    silver mark reaches it: a rebuilt bronze gets the event once (from the outbox), silver its row
    once, gold counts it once. (Before: one mark per tenant, and bronze held the event twice.)"""
    d = served
    arts = [d.submit(d.writer, body=f"split {i}").json()["artifact_id"] for i in range(3)]
    for a in arts[:2]:
        verdict(d, d.reviewer, a, "accept")
    seq = verdict(d, d.reviewer, arts[2], "accept")
    lakewriter(d, "--prune-every", "0")
    silver_before = both_readers(d, SILVER, silver_key)
    gold_before = gold_counts(d)
    with d.su() as c:
        rows = dict(c.execute("SELECT target_table, seq FROM oml.outbox WHERE tenant_id = %s AND journal_seq = %s",
                              (d.tenant_id, seq)).fetchall())
        (below,) = c.execute("SELECT count(*) FROM oml.outbox WHERE seq <= %s", (rows[SILVER],)).fetchone()
    assert rows[SILVER] < rows[BRONZE]  # the silver row first, in the same transaction
    lw, epoch = as_lease_holder(d)
    with lw:
        assert lw.execute("SELECT * FROM oml.prune_outbox('default', %s, 0, %s)",
                          (epoch, below)).fetchone() == (below, rows[SILVER])
    assert prune_state(d)[2][d.tenant_id] == (seq - 1, seq)
    assert outbox_seqs(d)[0] == rows[BRONZE]
    for table in (BRONZE, SILVER, GOLD):
        assert d.run("lake", "rebuild", "--table", table, "--wait", "1", check=False).returncode == 5
    run = lakewriter(d, "--prune-every", "0")
    rederived = [ln["table"] for ln in log_lines(run.stderr) if ln["msg"].startswith("lake writer: table re-derived")]
    assert rederived == [BRONZE, SILVER, GOLD]
    assert bronze_keys(d) == journal_keys(d) and max(bronze_keys(d).values()) == 1
    assert without_outbox_seq(both_readers(d, SILVER, silver_key)) == without_outbox_seq(silver_before)
    assert gold_counts(d) == gold_before == gold_from_bronze(d)
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_frontier_moved_below_what_was_pruned_stops_the_writer(served):
    """Only an owner who disables lake_frontier_guard can move a frontier back; a lake rebuilt
    from scratch that way would miss the pruned rows for good. The writer refuses to start."""
    d = served
    d.submit(d.writer, body="one")
    lakewriter(d, "--outbox-retention-hours", "0")
    through = prune_state(d)[0]
    assert through > 0
    with d.su() as c:
        c.execute("ALTER TABLE oml.lake_frontier DISABLE TRIGGER lake_frontier_guard")
        c.execute("UPDATE oml.lake_frontier SET frontier_seq = 0")
        c.execute("ALTER TABLE oml.lake_frontier ENABLE TRIGGER lake_frontier_guard")
    run = lakewriter(d, check=False)
    assert run.returncode == 4, run.stderr[-2000:]
    assert f"is below what was pruned from the outbox ({through})" in run.stderr


def test_a_rebuild_while_the_writer_prunes_and_claims_arrive_leaves_every_table_exact(served):
    """Three actors at once: the API (claims submitted and accepted), the lake writer in service
    mode pruning everything it holds every second, and an operator's `oml lake rebuild` of each
    table in turn. Each rebuilt table is re-derived from the journal below what was pruned and
    refilled above it; in the end every table equals the journal, each row once."""
    import subprocess
    import threading
    import time
    from conftest import OML_BIN
    d = served
    claims_in_every_state(d)
    log = open(d.home / "writer.log", "w")
    w = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50", "--prune-every", "1",
                          "--outbox-retention-hours", "0", "--max-rows", "5"],
                         env={**d.env, **INFO, "OML_LAKEWRITER_METRICS_LISTEN": "off"},
                         stdout=subprocess.DEVNULL, stderr=log)
    stop = threading.Event()
    accepted = []

    def load():
        n = 0
        while not stop.is_set():
            a = d.submit(d.writer, body=f"during {n}").json()["artifact_id"]
            if n % 2 == 0:
                verdict(d, d.reviewer, a, "accept")
                accepted.append(a)
            n += 1
            time.sleep(0.05)

    def drained():
        with d.su() as c:
            last = c.execute("SELECT pg_sequence_last_value('oml.outbox_seq')").fetchone()[0]
            f, p = c.execute("SELECT f.frontier_seq, p.pruned_through FROM oml.lake_frontier f "
                             "JOIN oml.outbox_prune p USING (stream)").fetchone()
        return f == last and p == last and not any(t["behind"] for t in status(d)["tables"])

    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(3)
        for table in (BRONZE, SILVER, GOLD):
            out = d.run("lake", "rebuild", "--table", table, "--wait", "90", check=False)
            assert out.returncode == 0, out.stdout + out.stderr
        time.sleep(2)
    finally:
        stop.set()
        loader.join()
    try:
        deadline = time.time() + 90
        while not drained():
            assert w.poll() is None and time.time() < deadline, "the writer did not drain and prune"
            time.sleep(0.2)
    finally:
        w.terminate()
        w.wait(timeout=30)
        log.close()
    lines = log_lines((d.home / "writer.log").read_text())
    rederived = [ln["table"] for ln in lines if ln["msg"].startswith("lake writer: table re-derived")]
    assert rederived == [BRONZE, SILVER, GOLD], [ln["msg"] for ln in lines][-30:]
    assert outbox_seqs(d) == []
    assert bronze_keys(d) == journal_keys(d) and max(bronze_keys(d).values()) == 1
    silver = both_readers(d, SILVER, silver_key)
    assert set(accepted) <= {r["artifact_id"] for r in silver if r["state"] == "promoted"}
    assert len({(r["tenant_id"], r["artifact_id"], r["version"]) for r in silver}) == len(silver)
    assert gold_counts(d) == gold_from_bronze(d)
    assert sum(gold_counts(d).values()) == sum(journal_keys(d).values())
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    rec = d.run("reconcile", "--json", "--no-objects", check=False)
    assert rec.returncode == 0, rec.stdout[-3000:] + rec.stderr[-2000:]


def test_a_gold_below_the_frontier_that_lost_nothing_is_not_re_derived_after_a_prune(served):
    """Gold's txn below the frontier need not mean lost rows: the stream's last rows may have had
    nothing to count (a silver-only row here). After a prune past gold's txn, the next writer
    refills gold from the pruned mark on (nothing), and never empties and re-derives it from the
    journal (issue 22: gold trails the frontier, and recovery refills a gold below it)."""
    d = served
    from deltalake import DeltaTable
    c = d.submit(d.writer, body="counted").json()
    verdict(d, d.reviewer, c["artifact_id"], "accept")
    with d.su() as cn:
        row = cn.execute("SELECT row_data FROM oml.outbox WHERE target_table = %s ORDER BY seq DESC LIMIT 1",
                         (SILVER,)).fetchone()[0]
    lakewriter(d, "--outbox-retention-hours", "0")
    gold_txn = frontier(d)
    assert DeltaTable(str(d.home / "lake" / GOLD)).transaction_version("oml-lakewriter") == gold_txn
    # A silver-only row: the same claim version's row again (a MERGE of what silver holds).
    with d.su() as cn:
        with cn.transaction():
            cn.execute("SELECT set_config('oml.tenant_id', %s, true)", (d.tenant_id,))
            silver_only = cn.execute("SELECT oml.enqueue_outbox(%s, %s, 1, %s::jsonb)",
                                     (d.tenant_id, SILVER, json.dumps(row))).fetchone()[0]
    lakewriter(d, "--outbox-retention-hours", "0")
    assert frontier(d) == silver_only and prune_state(d)[0] == silver_only
    gold = DeltaTable(str(d.home / "lake" / GOLD))
    assert gold.transaction_version("oml-lakewriter") == gold_txn < silver_only
    version = gold.version()
    out = lakewriter(d)
    msgs = [ln["msg"] for ln in log_lines(out.stderr)]
    assert "lake writer: a derived table is below the frontier (it may have trailed it); refilling it from the outbox" \
        in msgs
    assert not [m for m in msgs if "re-deriv" in m], out.stderr
    assert DeltaTable(str(d.home / "lake" / GOLD)).version() == version
    assert gold_counts(d) == gold_from_bronze(d)
