"""`oml status`: the lake writer's frontier, stable horizon, lag, the transactions holding the
horizon back, each table's txn version and the dead letters (issue 8), on a real cluster and lake.

Every number is compared with what the superuser reads from PostgreSQL and with `oml lakewriter
--once`'s effect; the long transaction is a real superuser transaction that took an xid.
"""
import json
import subprocess
import time

import psycopg

from conftest import OML_BIN

APP = "oml-lakewriter"


def status(d, *args):
    p = d.run("status", "--json", *args)
    return json.loads(p.stdout)


def status_text(d):
    return d.run("status").stdout


def add_events(d, prefix, tenants=2):
    for i in range(tenants):
        name = f"{prefix}-{i}"
        d.tenant(name)
        d.api_key(name, "writer", "w")


def sequence_last(d):
    with d.su() as c:
        return c.execute("SELECT coalesce(pg_sequence_last_value('oml.outbox_seq'), 0)").fetchone()[0]


def rows_above(d, seq):
    with d.su() as c:
        return c.execute("SELECT count(*) FROM oml.outbox WHERE seq > %s", (seq,)).fetchone()[0]


def drain(d):
    d.run("lakewriter", "--once", timeout=120)


def bronze_seqs(d):
    from deltalake import DeltaTable
    t = DeltaTable(str(d.home / "lake" / "bronze" / "events")).to_pyarrow_table()
    return sorted(t.column("outbox_seq").to_pylist())


def test_status_reports_frontier_lag_and_txn_versions_before_and_after_a_drain(deployment):
    d = deployment
    add_events(d, "st")
    last = sequence_last(d)
    pending = rows_above(d, 0)
    assert last >= 8 and pending >= 8

    s = status(d)
    assert s["stream"] == "default" and s["app_id"] == APP
    assert s["frontier"] == 0
    assert s["horizon"] == {"candidate": last, "stable": True, "stable_horizon": last}
    assert s["lag"]["rows"] == pending
    assert s["lag"]["seconds"] is not None and 0 <= s["lag"]["seconds"] < 300
    assert s["holders"] == []
    assert [(t["name"], t["exists"], t["table_version"], t["txn_version"]) for t in s["tables"]] == \
        [("bronze/events", True, 0, None), ("silver/claims", True, 0, None), ("gold/daily_activity", True, 0, None)]
    assert s["dead_letters"] == 0
    text = status_text(d)
    assert "frontier:        0\n" in text
    assert f"stable horizon:  {last}\n" in text
    assert f"lag:             {pending} rows, oldest enqueued " in text
    assert "bronze/events: txn none, table version 0\n" in text

    drain(d)
    s = status(d)
    assert s["frontier"] == last
    assert s["horizon"]["stable_horizon"] == last
    assert s["lag"] == {"rows": 0, "seconds": None}
    # No promotion yet: silver has no commit; gold counts the bronze rows in the same batch.
    assert [(t["table_version"], t["txn_version"]) for t in s["tables"]] == [(1, last), (0, None), (1, last)]
    assert s["lease"]["epoch"] == 1
    assert f"bronze/events: txn {last}, table version 1\n" in status_text(d)
    # The --once writer has exited: nobody holds the lease, whatever lake_frontier still names.
    with d.su() as c:
        recorded = c.execute("SELECT lease_holder FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]
    assert recorded
    assert s["lease"] == {"held": False, "holder": None, "last_holder": recorded, "epoch": 1}
    assert f"lease:           not held: no lake writer is running (last holder {recorded}) (epoch 1)\n" \
        in status_text(d)

    # New writes: lag above the unchanged frontier; the tables keep their txn version.
    add_events(d, "st2", tenants=1)
    s = status(d)
    assert s["frontier"] == last
    assert s["lag"]["rows"] == rows_above(d, last) == 3  # tenant.created, genesis, api_key.created
    assert s["horizon"]["candidate"] == sequence_last(d)
    assert s["tables"][0]["txn_version"] == last

    # Dead letters not yet requeued are counted; a requeued one is not.
    with d.su() as c:
        tid = c.execute("SELECT tenant_id FROM oml.tenants LIMIT 1").fetchone()[0]
        for seq in (100001, 100002):
            c.execute("INSERT INTO oml.dead_letter (stream, outbox_seq, tenant_id, target_table, journal_seq, "
                      "payload_ref, error, attempts) VALUES ('default', %s, %s, 'bronze/events', 1, '{}', 'x', 3)",
                      (seq, tid))
        assert status(d)["dead_letters"] == 2
        c.execute("UPDATE oml.dead_letter SET requeued_at = now() WHERE outbox_seq = 100002")
    assert status(d)["dead_letters"] == 1
    assert "dead letters:    1\n" in status_text(d)


def test_an_open_transaction_holds_the_horizon_and_status_names_it(deployment):
    d = deployment
    add_events(d, "lt", tenants=1)
    drain(d)
    frontier = sequence_last(d)
    assert status(d)["frontier"] == frontier

    held = psycopg.connect(d.superuser_url)  # not autocommit: BEGIN at the first statement
    try:
        pid = held.execute("SELECT pg_backend_pid()").fetchone()[0]
        xid = int(held.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        add_events(d, "lt2", tenants=2)  # committed after the held xid was assigned
        candidate = sequence_last(d)
        assert candidate > frontier

        s = status(d)
        assert s["frontier"] == frontier
        assert s["horizon"] == {"candidate": candidate, "stable": False, "stable_horizon": None}
        assert s["lag"]["rows"] == rows_above(d, frontier) == 6
        assert [(h["pid"], int(h["xid"])) for h in s["holders"]] == [(pid, xid)]
        h = s["holders"][0]
        assert h["state"] == "idle in transaction"
        with d.su() as c:
            assert h["role"] == c.execute("SELECT current_user").fetchone()[0]
        assert h["xact_start"] is not None and h["query_start"] is not None
        assert h["xact_age_seconds"] is not None and h["xact_age_seconds"] >= 0
        text = status_text(d)
        assert f"stable horizon:  not yet: candidate {candidate} is held back by 1 transaction(s)\n" in text
        assert f"held by:       pid {pid} (role " in text
        assert f"lag:             6 rows" in text
    finally:
        held.commit()
        held.close()

    # The holder gone: the same candidate is stable, and a drain loses nothing.
    s = status(d)
    assert s["horizon"]["stable"] is True and s["holders"] == []
    drain(d)
    s = status(d)
    assert s["frontier"] == s["tables"][0]["txn_version"] == candidate
    assert s["lag"]["rows"] == 0
    with d.su() as c:
        want = [r[0] for r in c.execute(
            "SELECT seq FROM oml.outbox WHERE target_table = 'bronze/events' ORDER BY seq").fetchall()]
    assert bronze_seqs(d) == want


def test_status_of_an_unknown_stream_is_not_found_and_of_a_malformed_one_a_usage_error(deployment):
    p = deployment.run("status", "--stream", "nope", check=False)
    assert (p.returncode, p.stdout) == (6, ""), p.stderr  # kExitNotFound: unknown-stream
    assert "nope" in p.stderr
    p = deployment.run("status", "--stream", "Bad Name", check=False)
    assert (p.returncode, p.stdout) == (2, ""), p.stderr  # kExitUsage: invalid-field


def test_status_names_the_lease_holder_only_while_a_writer_holds_it(deployment):
    """Issue 18: `oml status` showed the last writer as the holder after it had stopped."""
    d = deployment
    w = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"], env=d.env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not status(d)["lease"]["held"]:
            time.sleep(0.1)
        s = status(d)
        with d.su() as c:
            holder = c.execute("SELECT lease_holder FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]
        assert s["lease"] == {"held": True, "holder": holder, "last_holder": holder, "epoch": 1}
        assert f"lease:           held by {holder} (epoch 1)\n" in status_text(d)
    finally:
        w.kill()
        w.wait()
    deadline = time.time() + 30
    while time.time() < deadline and status(d)["lease"]["held"]:
        time.sleep(0.1)
    assert status(d)["lease"] == {"held": False, "holder": None, "last_holder": holder, "epoch": 1}
