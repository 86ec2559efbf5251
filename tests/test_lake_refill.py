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
import subprocess
import time
from collections import Counter
from urllib.parse import unquote

import pytest
import requests

from conftest import OML_BIN

from test_lake_tables import (BRONZE, GOLD, SILVER, both_readers, deltalake_rows, free_port, gold_key, log_actions,
                              metric, silver_key, verdict)
from test_lakewriter import INFO, last_outbox_seq, lakewriter, log_lines


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


def metrics_lag_while_refill_fails(d):
    """oml_lake_position{what="lag_rows"} of a lake writer whose every bronze commit fails."""
    port = free_port()
    p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"],
                         env={**d.env, "OML_LAKEWRITER_METRICS_LISTEN": f"127.0.0.1:{port}",
                              "OML_FAULT": f"lakewriter.before_commit.{BRONZE}"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except requests.ConnectionError:
                text = ""
            # The second refill attempt: the first one's lag was published before it failed.
            if (metric(text, "oml_lake_retries_total", 'kind="refill"') or 0) >= 2:
                return metric(text, "oml_lake_position", 'what="lag_rows"')
            time.sleep(0.1)
        raise AssertionError("the writer never reported the refill")
    finally:
        p.terminate()
        p.wait(timeout=20)


def test_lost_newest_commits_are_refilled_exactly_once_and_reported_until_then(served):
    d = served
    for i in range(3):
        d.submit(d.writer, body=f"first {i}")
    lakewriter(d)
    c = d.submit(d.writer, body="second").json()
    promoted = verdict(d, d.reviewer, c["artifact_id"], "accept")
    d.wait_published(d.tenant_id, promoted)
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
    # verify --from-lake: the lake's chain stops short of its published head. Within the grace
    # (default 60 s) that is the writer's lag; past it, a finding naming the first missing seq.
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 3, v.stdout + v.stderr
    assert (f"FAIL tenant acme ({d.tenant_id}) seq {c['receipt']['seq']}: the lake's chain ends at seq "
            f"{c['receipt']['seq'] - 1} but its head was published at seq {promoted}") in v.stdout, v.stdout
    assert f"the lake lacks seq {c['receipt']['seq']} to {promoted}" in v.stdout
    # The writer's /metrics count them as lag too, while its refill cannot commit (a fault fails
    # every bronze commit, so the refill is retried, and the hole stays).
    assert metrics_lag_while_refill_fails(d) == above
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


def commit_files(d, table):
    return sorted((d.home / "lake" / table / "_delta_log").glob("*.json"))


def set_aside_lines(out):
    return [ln for ln in log_lines(out.stderr)
            if ln["msg"] == "lake writer: damaged commits set aside (moved to _oml_damaged/); the table is refilled"]


@pytest.mark.parametrize("damage", [b"", b"\n", b'{"add": {"path": "part-0', b"[1, 2]\n"],
                         ids=["zero-bytes", "blank", "torn-json", "not-an-action"])
def test_a_damaged_newest_commit_is_set_aside_and_refilled_not_read_as_empty(served, damage):
    """A torn write of the newest commit (what an OS crash leaves of a commit that was not yet
    durable) is never read as an empty version (deltalake-core reads a 0-byte commit so, and the
    next batch used to commit above the hole): the adapter refuses the log
    ("lake-commit-damaged"), recovery moves the damaged file to _oml_damaged/ under the lease, and
    the refill restores its rows exactly once."""
    d = served
    d.submit(d.writer, body="first")
    lakewriter(d)
    d.submit(d.writer, body="second")
    lakewriter(d)
    newest = commit_files(d, BRONZE)[-1]
    version = int(newest.stem)
    newest.write_bytes(damage)
    d.submit(d.writer, body="third")
    out = lakewriter(d)
    lines = set_aside_lines(out)
    assert [(ln["table"], ln["commits"], ln["from_version"]) for ln in lines] == [(BRONZE, 1, version)]
    assert f"lake-commit-damaged: commit {version} of" in lines[0]["error"]
    aside = list((d.home / "lake" / BRONZE / "_oml_damaged").iterdir())
    assert [p.name.split(".json.")[0] for p in aside] == [newest.stem]
    assert aside[0].read_bytes() == damage
    # No empty commit is left in the log; the version was written again by the refill.
    assert all(f.stat().st_size > 0 for f in commit_files(d, BRONZE))
    lakewriter(d)
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    assert d.run("verify", "--from-lake", check=False).returncode == 0


def test_a_damaged_commit_below_an_intact_one_stops_the_writer_until_a_rebuild(served):
    """A damaged commit that a later commit built on cannot be set aside: the writer refuses the
    table ("lake-commit-damaged", naming the version) and commits nothing above it, `oml status`
    names it, and `oml lake rebuild` repairs the table."""
    d = served
    for body in ("first", "second", "third"):
        d.submit(d.writer, body=body)
        lakewriter(d)
    files = commit_files(d, BRONZE)
    damaged = files[-2]
    damaged.write_bytes(b"")
    newest_before = int(files[-1].stem)
    d.submit(d.writer, body="fourth")
    out = lakewriter(d, check=False)
    assert out.returncode == 3, out.stderr  # kDataLoss
    assert f"lake-commit-damaged: commit {int(damaged.stem)} of" in out.stderr
    assert "rebuild the table" in out.stderr
    assert int(commit_files(d, BRONZE)[-1].stem) == newest_before
    assert not (d.home / "lake" / BRONZE / "_oml_damaged").exists()
    # `oml status` names it, and `oml lake rebuild` repairs the table: emptied as deltalake-core
    # reads it, checkpointed above the damage, refilled once by the writer.
    tables = {t["name"]: t for t in status(d)["tables"]}
    assert f"lake-commit-damaged: commit {int(damaged.stem)} of" in tables[BRONZE]["unreadable"]
    assert tables[GOLD]["unreadable"] is None
    d.run("lake", "rebuild", "--table", BRONZE)
    lakewriter(d)
    tables = {t["name"]: t for t in status(d)["tables"]}
    assert tables[BRONZE]["unreadable"] is None and not tables[BRONZE]["behind"]
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr




# --- oml lake rebuild --------------------------------------------------------------------------
def gold_from_bronze(d):
    """gold/daily_activity as the writer derives it, recomputed here from bronze's rows."""
    want = Counter()
    for r in deltalake_rows(d, BRONZE):
        want[(r["tenant_id"], r["occurred_at"].date(), r["workarea_id"] or "", r["event_type"])] += 1
    return want


def gold_counts(d):
    return Counter({(r["tenant_id"], r["day"], r["workarea_id"], r["event_type"]): r["events"]
                    for r in both_readers(d, GOLD, gold_key)})


def wait_drained(d, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = status(d)
        if s["frontier"] == last_outbox_seq(d) and not any(t["behind"] for t in s["tables"]):
            return s
        time.sleep(0.2)
    raise AssertionError(f"the lake writer did not drain: {status(d)}")


@pytest.mark.parametrize("table", [BRONZE, SILVER, GOLD])
def test_oml_lake_rebuild_refills_a_table_exactly_once_while_the_writer_runs(served, table):
    """Issue 18: `oml lake rebuild --table T` empties T in one commit that resets the stream's txn;
    the running writer refills it from the outbox exactly once while claims keep arriving. A dead
    letter that bronze held (gold refused it) and its requeue keep their places: bronze holds the
    event once, gold counts it once. The old procedure (move aside, `oml init`) kept only what came
    after the frontier."""
    d = served
    arts = [d.submit(d.writer, body=f"before {i}").json() for i in range(4)]
    verdict(d, d.reviewer, arts[0]["artifact_id"], "accept")
    verdict(d, d.reviewer, arts[1]["artifact_id"], "accept")
    r = d.post(f"/v1/claims/{arts[1]['artifact_id']}/demote", d.admin, json={"reason": "outdated"})
    assert r.status_code == 200, r.text
    late = d.submit(d.writer, body="counted late").json()
    with d.su() as c:
        (o1,) = c.execute("SELECT seq FROM oml.outbox WHERE tenant_id = %s AND journal_seq = %s AND target_table = %s",
                          (d.tenant_id, late["receipt"]["seq"], BRONZE)).fetchone()
    lakewriter(d, env={"OML_FAULT": f"lakewriter.gold.count.{o1}"})
    with d.su() as c:
        (dl,) = c.execute("SELECT id FROM oml.dead_letter WHERE outbox_seq = %s", (o1,)).fetchone()
    d.run("dead-letter", "requeue", str(dl))
    lakewriter(d)
    silver_before = both_readers(d, SILVER, silver_key)
    assert [(x["artifact_id"], x["state"]) for x in silver_before] == sorted(
        [(arts[0]["artifact_id"], "promoted"), (arts[1]["artifact_id"], "demoted")])

    p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"],
                         env={**d.env, **INFO, "OML_LAKEWRITER_METRICS_LISTEN": "off"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_drained(d)
        for i in range(3):
            d.submit(d.writer, body=f"during {i}")
        out = d.run("lake", "rebuild", "--table", table, "--wait", "60", check=False)
        if out.returncode == 0:
            for i in range(3):
                d.submit(d.writer, body=f"after {i}")
            wait_drained(d)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    lines = log_lines(err)
    assert out.returncode == 0, out.stdout + out.stderr + "\n".join(
        json.dumps(ln) for ln in lines[-40:])
    doc = json.loads(out.stdout)
    assert (doc["table"], doc["lease_held"]) == (table, True), doc
    assert doc["refill_to"] >= o1
    refills = [ln for ln in lines if ln["msg"].startswith("lake writer: a table is behind")]
    assert [ln["table"] for ln in refills] == [table], [ln["msg"] for ln in lines][-20:]
    # The emptying commit: every file removed, the stream's txn set to 0, marked as a rebuild.
    emptied = [a["commitInfo"] for _, a in log_actions(d, table)
               if "commitInfo" in a and a["commitInfo"].get("oml.rebuild")]
    assert len(emptied) == 1 and emptied[0]["oml.rebuild_frontier"] == doc["refill_to"]
    # Every table equals the journal, each row once.
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    assert both_readers(d, SILVER, silver_key) == silver_before
    assert gold_counts(d) == gold_from_bronze(d)
    assert sum(gold_counts(d).values()) == sum(journal_keys(d).values())
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_oml_lake_rebuild_refuses_an_unknown_table_and_says_when_no_writer_runs(served):
    d = served
    d.submit(d.writer, body="one")
    lakewriter(d)
    bad = d.run("lake", "rebuild", "--table", "silver/nope", check=False)
    assert bad.returncode == 2, bad.stderr
    assert "unknown-lake-table" in bad.stderr and "bronze/events, silver/claims, gold/daily_activity" in bad.stderr
    # No writer runs: the table is emptied, the command says who refills it, and --wait times out.
    out = d.run("lake", "rebuild", "--table", BRONZE, "--wait", "1", check=False)
    assert out.returncode == 5, out.stderr
    assert "lake-rebuild-waiting" in out.stderr
    assert "no lake writer holds the lease" in out.stderr
    assert json.loads(out.stdout)["lease_held"] is False
    assert deltalake_rows(d, BRONZE) == []
    assert [t["behind"] for t in status(d)["tables"] if t["name"] == BRONZE] == [True]
    lakewriter(d)
    assert bronze_keys(d) == journal_keys(d)
    assert [t["behind"] for t in status(d)["tables"]] == [False, False, False]


def test_a_removed_data_file_is_reported_and_a_rebuild_repairs_the_table(served):
    """Issue 18: a data file the log names and the store lost (an operator, a bucket rule) made
    every read fail with no word from `oml status`. Now status names it (`missing_files`,
    DAMAGED), `verify --from-lake` exits 3 naming it, and `oml lake rebuild` restores the table."""
    d = served
    for i in range(3):
        d.submit(d.writer, body=f"row {i}")
        lakewriter(d)
    live = {}
    for _, a in log_actions(d, BRONZE):
        if "add" in a:
            live[a["add"]["path"]] = True
        if "remove" in a:
            live.pop(a["remove"]["path"], None)
    lost = sorted(live)[0]
    (d.home / "lake" / BRONZE / unquote(lost)).unlink()
    s = status(d)
    tables = {t["name"]: t for t in s["tables"]}
    assert tables[BRONZE]["missing_files"] == [lost]
    assert tables[SILVER]["missing_files"] == [] and tables[GOLD]["missing_files"] == []
    assert f"DAMAGED: 1 data file(s) missing ({lost}): run `oml lake rebuild --table {BRONZE}`" in d.run("status").stdout
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 3, v.stdout + v.stderr
    assert "lake-file-missing" in v.stderr and lost in v.stderr
    d.run("lake", "rebuild", "--table", BRONZE)
    lakewriter(d)
    assert status(d)["tables"][0]["missing_files"] == []
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_rebuild_refills_across_batches_that_hold_none_of_the_tables_rows(served):
    """The refill of a rebuilt silver runs in batches of --max-rows 2; most hold no silver row (only
    submissions), so silver's txn stays below the batch starts. The writer's lake-table-behind
    check (a batch may not commit above a hole) must not stop its own refill there: it is off
    while refilling, and afterwards silver's record follows the txn it holds."""
    d = served
    a = d.submit(d.writer, body="promoted early").json()
    verdict(d, d.reviewer, a["artifact_id"], "accept")
    for i in range(6):
        d.submit(d.writer, body=f"bronze only {i}")
    b = d.submit(d.writer, body="promoted late").json()
    verdict(d, d.reviewer, b["artifact_id"], "accept")
    for i in range(4):
        d.submit(d.writer, body=f"tail {i}")
    lakewriter(d)
    before = both_readers(d, SILVER, silver_key)
    assert len(before) == 2
    d.run("lake", "rebuild", "--table", SILVER)
    out = lakewriter(d, "--max-rows", "2")
    assert not [ln for ln in log_lines(out.stderr) if ln["msg"] == "lake writer: batch failed"]
    assert both_readers(d, SILVER, silver_key) == before
    s = status(d)
    silver = next(t for t in s["tables"] if t["name"] == SILVER)
    assert not silver["behind"] and silver["recorded_txn_version"] == silver["txn_version"] < s["frontier"]


@pytest.mark.parametrize("fault", ["lakewriter.after_commit.{table}", "lakewriter.before_frontier_advance"])
@pytest.mark.parametrize("table", [BRONZE, SILVER])
def test_a_lake_writer_killed_mid_refill_finishes_it_exactly_once_on_restart(served, table, fault):
    """Issue 18 (left open last time): kill -9 while a rebuilt table is refilled, after its first
    refill commit or before the frontier advance that follows; the next writer finds the table
    still behind and completes it, each row once, the other tables untouched."""
    d = served
    arts = [d.submit(d.writer, body=f"refill {i}").json() for i in range(6)]
    for a in arts[:3]:
        verdict(d, d.reviewer, a["artifact_id"], "accept")
    lakewriter(d)
    silver_before = both_readers(d, SILVER, silver_key)
    gold_before = gold_counts(d)
    out = d.run("lake", "rebuild", "--table", table, "--wait", "1", check=False)
    assert out.returncode == 5, out.stderr  # no writer runs: emptied, waiting
    # The first commit this writer makes is the refill's (nothing new is in the outbox).
    killed = d.run("lakewriter", "--once", "--max-rows", "4",
                   env={**INFO, "OML_FAULT": fault.format(table=table) + ":kill"}, check=False, timeout=120)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    lakewriter(d)
    assert [t["behind"] for t in status(d)["tables"]] == [False, False, False]
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    assert both_readers(d, SILVER, silver_key) == silver_before
    assert gold_counts(d) == gold_before == gold_from_bronze(d)
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_two_concurrent_rebuilds_of_a_table_leave_it_exact(served):
    """Issue 18 (left open last time): two operators rebuild the same table at once while the
    writer runs and claims arrive: whatever order their emptying commits land in, the table ends
    equal to the journal, each row once."""
    import threading
    d = served
    for i in range(5):
        d.submit(d.writer, body=f"before {i}")
    p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"],
                         env={**d.env, **INFO, "OML_LAKEWRITER_METRICS_LISTEN": "off"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    outs = []
    try:
        wait_drained(d)
        ts = [threading.Thread(target=lambda: outs.append(
            d.run("lake", "rebuild", "--table", BRONZE, "--wait", "60", check=False))) for _ in range(2)]
        for t in ts:
            t.start()
        for i in range(3):
            d.submit(d.writer, body=f"during {i}")
        for t in ts:
            t.join(timeout=120)
        wait_drained(d)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert [o.returncode for o in outs] == [0, 0], [o.stdout + o.stderr for o in outs]
    assert bronze_keys(d) == journal_keys(d)
    assert max(bronze_keys(d).values()) == 1
    assert gold_counts(d) == gold_from_bronze(d)
    v = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
