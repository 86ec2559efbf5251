"""Compaction never doubles rows (issue 18, "Compaction doubles rows").

Two OPTIMIZEs that read the same files both used to commit: deltalake-core 1.1's conflict
checker lets a rewrite rebase over a commit whose `remove` actions carry dataChange = false
(delta-rs PR 3982), so the second rewrite kept a second copy of every row the first one had
compacted. The adapter now checks the commits it would rebase over itself and refuses to land
over one that removed a file it read (`lake-rewrite-stale`, log line `compaction refused`).

The other direction holds too: the adapter writes its rewrites with dataChange = true, so a
rewrite by another delta-rs based tool planned before ours landed is refused by that tool's own
conflict checker (ConcurrentDeleteRead) instead of storing the rows a second time.

The other OPTIMIZE here is the `deltalake` package's own `optimize.compact()`, run while the
writer is held at a fault point (OML_FAULT=<point>:stop: SIGSTOP there, SIGCONT from the test).
Every table is read back with `deltalake` and with pyarrow over the Parquet files its JSON log
names, and `oml verify --from-lake` must pass.
"""
import itertools
import os
import re
import signal
import subprocess
import threading
import time

from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest

from conftest import OML_BIN
from test_lake_tables import both_readers, demote, deltalake_rows, log_actions, pyarrow_rows, silver_key, verdict
from test_lake_s3 import TABLE_URI as S3_BRONZE, moto, s3_lake  # noqa: F401 (fixtures)
from test_lakewriter import INFO, add_events, frontier, last_outbox_seq, lakewriter, log_lines, proc_state, wait_for

BRONZE = "bronze/events"
SILVER = "silver/claims"
GOLD = "gold/daily_activity"


# --- vocabulary ------------------------------------------------------------------------------
def outside_compact(d, table):
    """An operator's OPTIMIZE through the `deltalake` package; returns its files removed."""
    from deltalake import DeltaTable
    return DeltaTable(str(d.home / "lake" / table)).optimize.compact()["numFilesRemoved"]


def journal_keys(d):
    with d.su() as c:
        return sorted((str(t), s) for t, s in c.execute("SELECT tenant_id, seq FROM oml.journal").fetchall())


def assert_bronze_once(d):
    """bronze holds exactly one row per journal event, for both readers; returns the row count."""
    want = journal_keys(d)
    for rows in (deltalake_rows(d, BRONZE), pyarrow_rows(d, BRONZE)):
        assert sorted((r["tenant_id"], r["seq"]) for r in rows) == want
    return len(want)


def assert_every_table_once(d, accepted):
    """bronze holds each event once, silver one row per accepted claim, gold counts every event
    once under one row per key; returns the event count."""
    events = assert_bronze_once(d)
    silver = both_readers(d, SILVER, silver_key)
    assert sorted(r["artifact_id"] for r in silver) == sorted(accepted)
    gold = deltalake_rows(d, GOLD)
    assert sum(r["events"] for r in gold) == events
    assert len({(r["tenant_id"], r["day"], r["workarea_id"], r["event_type"]) for r in gold}) == len(gold)
    return events


def assert_verify_from_lake(d):
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "FAIL" not in v.stdout


def optimizes(d, table):
    return sum(1 for _, a in log_actions(d, table)
               if "commitInfo" in a and a["commitInfo"].get("operation") == "OPTIMIZE")


def rewrites_over_rewrites(d, table):
    """[(version, engine)] of every OPTIMIZE commit that landed over a commit (between the
    version it read and its own) that removed a file it removes too: each one doubled rows."""
    removed, info = {}, {}
    for v, a in log_actions(d, table):
        if "remove" in a:
            removed.setdefault(v, set()).add(unquote(a["remove"]["path"]))
        if "commitInfo" in a:
            info[v] = a["commitInfo"]
    out = []
    for v, ci in sorted(info.items()):
        if ci.get("operation") != "OPTIMIZE":
            continue
        mine = removed.get(v, set())
        if any(removed.get(w, set()) & mine for w in range(ci["readVersion"] + 1, v)):
            out.append((v, ci.get("clientVersion") or ci.get("engineInfo")))
    return out


def held_writer(d, tmp_path, point, *args):
    """`oml lakewriter --once ARGS` started with OML_FAULT=<point>:stop; returns it stopped there."""
    log = open(tmp_path / "writer.log", "w")
    env = {**d.env, **INFO, "OML_FAULT": f"{point}:stop"}
    w = subprocess.Popen([OML_BIN, "lakewriter", "--once", *args], env=env, stderr=log, stdout=subprocess.DEVNULL)
    w.log_file = log
    wait_for(lambda: w.poll() is None and proc_state(w.pid) == "T", f"the writer stopped at {point}")
    return w


def finish(w, log, timeout=120):
    """Waits for the writer to exit 0 (it was resumed or sent SIGTERM); kills it otherwise."""
    try:
        assert w.wait(timeout=timeout) == 0
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
        log.close()


def resume(w, tmp_path):
    os.kill(w.pid, signal.SIGCONT)
    finish(w, w.log_file)
    return log_lines((tmp_path / "writer.log").read_text())


def refusals(logs):
    return [l for l in logs if l["msg"].startswith("lake writer: compaction refused")]


# --- bronze: the compactor thread --------------------------------------------------------------
def test_the_writers_compaction_yields_to_an_outside_optimize_of_the_files_it_read(deployment, tmp_path):
    """The compactor has read its snapshot (the after_snapshot point) when an operator compacts
    the same files. Released, it must not land its own rewrite of them: before the fix it did,
    and bronze held every compacted row twice."""
    d = deployment
    add_events(d, "cmp-a")
    lakewriter(d, "--max-rows", "3", "--compact-every", "0")  # several small bronze files
    add_events(d, "cmp-b", tenants=1)
    w = held_writer(d, tmp_path, "lakewriter.compaction.after_snapshot.bronze/events",
                    "--max-rows", "3", "--compact-every", "1")
    assert outside_compact(d, BRONZE) >= 6  # every file, among them all those the compactor read
    logs = resume(w, tmp_path)
    assert assert_bronze_once(d) == 2 + 3 * 4 + 4  # provider (2), 3 + 1 tenants x 4 events
    refused = refusals(logs)
    assert len(refused) == 1, refused
    assert "lake-rewrite-stale" in refused[0]["error"] and "(OPTIMIZE) removed" in refused[0]["error"]
    assert frontier(d) == last_outbox_seq(d)
    assert_verify_from_lake(d)


def test_the_writers_compaction_writes_zstd_level_1_files_that_both_readers_read(deployment):
    """The compactor's files carry the adapter's own Parquet settings (zstd level 1, created_by
    "oml-storage version <v> (build compaction)", a form parquet-java parses), not delta-rs's
    OPTIMIZE default (level 4, about 4x slower: docs/performance.md); the batches' own files stay
    Snappy. The level itself is not in a Parquet footer: created_by is what shows the settings
    are the adapter's. Both readers read the compacted table back whole."""
    d = deployment
    add_events(d, "zst-a")
    lakewriter(d, "--max-rows", "3", "--compact-every", "0")  # several small bronze files
    add_events(d, "zst-b", tenants=1)
    lakewriter(d, "--max-rows", "3", "--compact-every", "1")
    compacted, appended = set(), set()
    info = {v: a["commitInfo"] for v, a in log_actions(d, BRONZE) if "commitInfo" in a}
    for v, a in log_actions(d, BRONZE):
        if "add" in a:
            (compacted if info[v].get("operation") == "OPTIMIZE" else appended).add(unquote(a["add"]["path"]))
    assert compacted and appended
    for paths, ours, codec in ((compacted, True, "ZSTD"), (appended, False, "SNAPPY")):
        for p in paths:
            meta = pq.ParquetFile(d.home / "lake" / BRONZE / p).metadata
            if ours:  # "<app> version <v> (build <b>)": the form parquet-java parses
                assert re.fullmatch(r"oml-storage version \d+\.\d+\.\d+ \(build compaction\)", meta.created_by), p
            assert {meta.row_group(g).column(c).compression for g in range(meta.num_row_groups)
                    for c in range(meta.num_columns)} == {codec}, p
    assert assert_bronze_once(d) == 2 + 3 * 4 + 4
    assert frontier(d) == last_outbox_seq(d)
    assert_verify_from_lake(d)


def test_on_s3_the_writers_compaction_yields_to_an_outside_optimize_too(s3_lake, tmp_path):
    """The same on an S3 lake (moto, commits by If-None-Match): the adapter's check reads the
    winners' commit objects there."""
    from deltalake import DeltaTable
    d = s3_lake
    add_events(d, "s3c-a")
    lakewriter(d, "--max-rows", "3", "--compact-every", "0")
    add_events(d, "s3c-b", tenants=1)
    w = held_writer(d, tmp_path, "lakewriter.compaction.after_snapshot.bronze/events",
                    "--max-rows", "3", "--compact-every", "1")
    outside = DeltaTable(S3_BRONZE, storage_options={**d.storage_options, "conditional_put": "etag"})
    assert outside.optimize.compact()["numFilesRemoved"] >= 6
    logs = resume(w, tmp_path)
    rows = DeltaTable(S3_BRONZE, storage_options=d.storage_options).to_pyarrow_table().to_pylist()
    assert sorted((r["tenant_id"], r["seq"]) for r in rows) == journal_keys(d)
    assert len(journal_keys(d)) == 2 + 3 * 4 + 4
    assert len(refusals(logs)) == 1
    assert_verify_from_lake(d)


def test_an_outside_optimize_planned_before_the_writers_compaction_landed_is_refused(deployment, tmp_path):
    """The other direction: the `deltalake` package holds a snapshot of bronze (a stale handle,
    or an OPTIMIZE still running) when the writer's compaction lands. Its OPTIMIZE must not land
    over ours: the adapter writes its rewrites with dataChange = true, which delta-rs's conflict
    checker refuses to rebase over. Before, deltalake rebased over our dataChange = false removes
    and bronze held every compacted row twice (verify --from-lake exit 3)."""
    from deltalake import DeltaTable
    d = deployment
    add_events(d, "stale-a")
    lakewriter(d, "--max-rows", "3", "--compact-every", "0")  # several small bronze files
    stale = DeltaTable(str(d.home / "lake" / BRONZE))
    files_seen = len(stale.file_uris())
    assert files_seen >= 4
    add_events(d, "stale-b", tenants=1)
    lakewriter(d, "--max-rows", "3", "--compact-every", "1")  # ours: every file, those seen too
    rewrites = [v for v, a in log_actions(d, BRONZE)
                if "commitInfo" in a and a["commitInfo"].get("operation") == "OPTIMIZE"]
    assert rewrites  # after every commit: one or more
    seen = {unquote(u.split("/")[-1]) for u in stale.file_uris()}
    for v in rewrites:
        rewrite = [a for w, a in log_actions(d, BRONZE) if w == v and ("add" in a or "remove" in a)]
        assert {(k, a[k]["dataChange"]) for a in rewrite for k in a} == {("add", True), ("remove", True)}
    first = {unquote(a["remove"]["path"]) for w, a in log_actions(d, BRONZE) if w == rewrites[0] and "remove" in a}
    assert seen <= first  # ours removed every file the stale handle would compact
    with pytest.raises(Exception) as refused:
        stale.optimize.compact()
    # delta-rs's ConcurrentDeleteRead: our removes carry dataChange = true.
    assert "a concurrent transaction deleted data this operation read" in str(refused.value), repr(refused.value)
    assert optimizes(d, BRONZE) == len(rewrites)  # nothing of theirs landed
    assert assert_bronze_once(d) == 2 + 3 * 4 + 4
    assert_verify_from_lake(d)


# --- silver: the MERGE tables' compaction on the batch path ------------------------------------
@pytest.mark.parametrize("point", ["lakewriter.before_frontier_advance",
                                   "lakewriter.compaction.after_snapshot.silver/claims"])
def test_silver_keeps_one_row_per_key_when_an_operator_compacts_it_under_the_writer(served, tmp_path, point):
    """silver/claims is compacted by the writer after its frontier advance. An operator compacts
    it while the writer is held (before the advance: the writer's handle is still at its own
    MERGE; or after the writer read its snapshot for the compaction). Before the fix the writer's
    OPTIMIZE landed over the operator's and silver held every claim twice; a later demotion then
    updated both copies."""
    d = served
    arts = []
    for i in range(3):
        arts.append(d.submit(d.writer, body=f"first {i}").json()["artifact_id"])
        verdict(d, d.reviewer, arts[-1], "accept")
    lakewriter(d, "--compact-every", "0")  # silver: one file
    for i in range(3):
        arts.append(d.submit(d.writer, body=f"second {i}").json()["artifact_id"])
        verdict(d, d.reviewer, arts[-1], "accept")
    w = held_writer(d, tmp_path, point, "--compact-every", "1")  # silver: two files at the stop
    assert outside_compact(d, SILVER) == 2
    logs = resume(w, tmp_path)
    rows = both_readers(d, SILVER, silver_key)
    assert sorted(r["artifact_id"] for r in rows) == sorted(arts)  # six keys, six rows
    assert [r["state"] for r in rows] == ["promoted"] * 6
    # Held before the advance, the writer plans its compaction from the latest version and finds
    # one file; held after its snapshot, its OPTIMIZE is refused. Neither writes an OPTIMIZE.
    assert len(refusals(logs)) == (1 if "after_snapshot" in point else 0)
    assert optimizes(d, SILVER) == 1  # the operator's
    da_seq = demote(d, d.reviewer, arts[0])
    lakewriter(d, "--compact-every", "0")
    rows = both_readers(d, SILVER, silver_key)
    assert len(rows) == 6
    assert [(r["state"], r["last_event_seq"]) for r in rows if r["artifact_id"] == arts[0]] == [("demoted", da_seq)]
    assert_bronze_once(d)
    assert_verify_from_lake(d)


# --- races: an outside OPTIMIZE loop beside the writer's batches (and compactions) --------------
def race(d, tmp_path, compact_every, seconds=12):
    """For `seconds` claims are submitted (every other one accepted) while `oml lakewriter`
    (service mode, compaction after every `compact_every` commits, 0: never) drains them and a
    loop compacts bronze, silver and gold in turn through the `deltalake` package. Returns the
    accepted artifact ids, the loop's outcome and the writer's log lines."""
    from deltalake import DeltaTable
    log = open(tmp_path / "writer.log", "w")
    w = subprocess.Popen([OML_BIN, "lakewriter", "--compact-every", str(compact_every), "--max-rows", "50",
                          "--poll-ms", "50"], env={**d.env, **INFO}, stderr=log, stdout=subprocess.DEVNULL)
    stop = threading.Event()
    outcome = {"compacted": 0, "lost": 0, "errors": []}

    def outside_loop():
        for i in itertools.count():
            if stop.is_set():
                return
            try:
                m = DeltaTable(str(d.home / "lake" / [BRONZE, SILVER, GOLD][i % 3])).optimize.compact()
                outcome["compacted"] += m["numFilesRemoved"] > 0
            except Exception as e:  # lost to a MERGE that rewrote its files: nothing committed
                if "conflict" not in str(e).lower() and "commit" not in str(e).lower():
                    outcome["errors"].append(repr(e))
                outcome["lost"] += 1
            time.sleep(0.1)

    loop = threading.Thread(target=outside_loop)
    loop.start()
    accepted = []
    try:
        t0 = time.time()
        for n in itertools.count():
            if time.time() - t0 > seconds:
                break
            art = d.submit(d.writer, body=f"race {n}").json()["artifact_id"]
            if n % 2 == 0:
                verdict(d, d.reviewer, art, "accept")
                accepted.append(art)
        try:
            wait_for(lambda: frontier(d) == last_outbox_seq(d), "the writer drains every event", timeout=40)
        except AssertionError as e:
            raise AssertionError(f"{e} (frontier {frontier(d)}, last seq {last_outbox_seq(d)})") from None
    finally:
        stop.set()
        loop.join()
        w.send_signal(signal.SIGTERM)
        finish(w, log)
    assert outcome["errors"] == []
    return accepted, outcome, log_lines((tmp_path / "writer.log").read_text())


def test_an_outside_optimize_loop_racing_the_writers_batches_and_compactions_for_a_minute_doubles_no_row(served, tmp_path):
    """Issue 18's test as written: the `deltalake` package's OPTIMIZE in a loop beside the
    writer's batches and compactions (after every commit) for a minute. No rewrite lands over
    another in either direction: the writer's is refused by its own check (`compaction refused`),
    the package's by delta-rs's conflict checker, since the writer marks its rewrites as data
    changes. Every event is in bronze once, one silver row per accepted claim, gold counts every
    event once, and `oml verify --from-lake` passes. (Before: 721 events + 1,877 rows doubled by 3
    outside commits in one 12 s run.)"""
    d = served
    accepted, outcome, logs = race(d, tmp_path, compact_every=1, seconds=60)
    ours = [l for l in logs if l["msg"] == "lake writer: table compacted" and l["files_removed"] > 0]
    assert ours and outcome["compacted"] > 0  # both sides compacted
    for table in (BRONZE, SILVER, GOLD):
        assert rewrites_over_rewrites(d, table) == []
    events = assert_every_table_once(d, accepted)
    print(f"race with the writer's compactions for 60 s: events {events}, claims accepted {len(accepted)}, outside "
          f"compactions {outcome['compacted']} (lost {outcome['lost']}), writer compactions {len(ours)}, writer "
          f"refusals {len(refusals(logs))}")
    assert_verify_from_lake(d)


def test_an_outside_optimize_loop_with_the_writers_compaction_off_doubles_no_row(served, tmp_path):
    """The procedure docs/data/delta-tables.md gives an operator who compacts with another tool:
    the writer's compaction off (`--compact-every 0`) while it runs. The `deltalake` package's
    OPTIMIZE loop then races only the writer's batches: its rewrites rebase over the writer's
    appends and lose to a MERGE that rewrote their files, and a MERGE of the writer that loses to
    one of them is made again on a fresh snapshot. Every event is in bronze exactly once, one silver row per accepted claim,
    gold counts every event once, and `oml verify --from-lake` passes."""
    d = served
    accepted, outcome, logs = race(d, tmp_path, compact_every=0)
    assert outcome["compacted"] > 0
    assert not [l for l in logs if l["msg"] == "lake writer: table compacted"]
    events = assert_every_table_once(d, accepted)
    for table in (BRONZE, SILVER, GOLD):
        assert rewrites_over_rewrites(d, table) == []
    print(f"race with the writer's compaction off: events {events}, claims accepted {len(accepted)}, outside "
          f"compactions {outcome['compacted']} (lost {outcome['lost']})")
    assert_verify_from_lake(d)
