"""Lost or replaced lake commits are refilled, never skipped (issue 18, "Lost or damaged commits").

An OS crash can lose a table's newest commit files while the frontier in PostgreSQL, committed
after them, survives; an operator can replace a table by an empty one. Before sql/0018 the writer
only looked at tables ahead of the frontier: a table behind it stayed behind for ever, the next
batch committed above the hole, `verify --from-lake` said OK and `oml status` said lag 0. Now each
frontier advance records what every committed table must hold (oml.lake_table_txn), and every
start refills a table found below it from the outbox, exactly once. Read back with the
`deltalake` package and pyarrow over the log (test_lake_tables' readers).
"""
import json
from collections import Counter

from test_lake_tables import BRONZE, GOLD, both_readers, deltalake_rows, gold_key, verdict
from test_lakewriter import last_outbox_seq, lakewriter, log_lines


def journal_keys(d):
    with d.su() as c:
        return Counter((str(t), s) for t, s in c.execute("SELECT tenant_id, seq FROM oml.journal").fetchall())


def bronze_keys(d):
    return Counter((r["tenant_id"], r["seq"]) for r in both_readers(d, BRONZE, lambda r: r["outbox_seq"]))


def status(d):
    return json.loads(d.run("status", "--json").stdout)


def drop_newest_commit(d, table):
    """What an OS crash does to a commit file that was never synced: it is gone."""
    log = d.home / "lake" / table / "_delta_log"
    newest = sorted(log.glob("*.json"))[-1]
    assert not list(log.glob(f"{newest.stem}.checkpoint*")), "a checkpoint at the dropped version"
    newest.unlink()
    return int(newest.stem)


def test_lost_newest_commits_are_refilled_exactly_once_and_reported_until_then(served):
    d = served
    for i in range(3):
        d.submit(d.writer, body=f"first {i}")
    lakewriter(d)
    c = d.submit(d.writer, body="second").json()
    verdict(d, d.reviewer, c["artifact_id"], "accept")
    lakewriter(d)
    frontier = last_outbox_seq(d)
    assert bronze_keys(d) == journal_keys(d)
    for t in (BRONZE, GOLD):
        drop_newest_commit(d, t)
    missing = journal_keys(d) - bronze_keys(d)
    assert sum(missing.values()) == 2  # claim.submitted and claim.promoted of the second run
    # Reported before any writer runs: each table behind what it committed, and its rows as lag.
    s = status(d)
    tables = {t["name"]: t for t in s["tables"]}
    for t in (BRONZE, GOLD):
        assert (tables[t]["behind"], tables[t]["recorded_txn_version"]) == (True, frontier), tables[t]
        assert tables[t]["txn_version"] < frontier
    with d.su() as cn:
        above = cn.execute("SELECT count(*) FROM oml.outbox WHERE seq > %s",
                           (tables[BRONZE]["txn_version"],)).fetchone()[0]
    assert above >= 2
    assert s["frontier"] == frontier and s["lag"]["rows"] == above
    assert "BEHIND: it committed up to" in d.run("status").stdout
    # The writer refills them, once; a second run changes nothing.
    out = lakewriter(d)
    refills = [ln for ln in log_lines(out.stderr) if ln["msg"].startswith("lake writer: a table is behind")]
    assert sorted(ln["table"] for ln in refills) == [BRONZE, GOLD]
    lakewriter(d)
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    gold = both_readers(d, GOLD, gold_key)
    assert sum(r["events"] for r in gold) == sum(journal_keys(d).values())
    s = status(d)
    assert [t["behind"] for t in s["tables"]] == [False, False, False] and s["lag"]["rows"] == 0
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_table_replaced_by_an_empty_one_is_refilled_from_the_outbox(served):
    """The rebuild procedure: stop the writer, move the table aside, `oml init`, start the writer.
    Before sql/0018 the new table held only what came after the frontier."""
    import shutil
    d = served
    for i in range(5):
        d.submit(d.writer, body=f"event {i}")
    lakewriter(d, "--max-rows", "4")  # several batches
    shutil.rmtree(d.home / "lake" / BRONZE)
    d.init()
    assert deltalake_rows(d, BRONZE) == []
    d.submit(d.writer, body="after")
    lakewriter(d, "--max-rows", "4")  # refill in batches of 4, then the new row
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    assert d.run("verify", "--from-lake", check=False).returncode == 0


def test_a_commit_file_left_at_zero_bytes_is_refilled_not_built_upon(served):
    """A torn write of the newest commit (0 bytes on disk) reads as an empty version: the table's
    txn falls back below what it committed, and the refill restores its rows before any batch
    commits above it."""
    d = served
    d.submit(d.writer, body="first")
    lakewriter(d)
    d.submit(d.writer, body="second")
    lakewriter(d)
    newest = sorted((d.home / "lake" / BRONZE / "_delta_log").glob("*.json"))[-1]
    newest.write_bytes(b"")
    d.submit(d.writer, body="third")
    lakewriter(d)
    lakewriter(d)
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    assert d.run("verify", "--from-lake", check=False).returncode == 0
