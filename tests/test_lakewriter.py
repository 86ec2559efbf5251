"""`oml lakewriter`: the outbox drained into bronze/events exactly once (issue 8, the D2 protocol).

Real PostgreSQL, the real binary, and the lake read back by readers that did not write it: the
`deltalake` package, pyarrow over the Parquet files named in the Delta log, and the JSON log
itself (txn actions and the commit metadata "oml.batch_start" / "oml.batch_end"). Everything is
compared with the journal and the outbox as the superuser sees them.

Fault points (src/lake/lakewriter.h) are armed with OML_FAULT=<point>:kill (the process kills
itself with SIGKILL there) or :stop (SIGSTOP, resumed by the test with SIGCONT).
"""
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import OML_BIN

APP = "oml-lakewriter"
BRONZE = "bronze/events"
FAULT_POINTS = [
    "lakewriter.after_cut",
    "lakewriter.before_commit.bronze/events",
    "lakewriter.after_commit.bronze/events",
    "lakewriter.after_commit.gold/daily_activity",
    "lakewriter.before_frontier_advance",
]
INFO = {"OML_LOG_LEVEL": "info"}


# --- vocabulary ------------------------------------------------------------------------------
def add_events(d, prefix, tenants=3, keys=2):
    """tenants x (tenant.created + genesis + `keys` api_key.created) journal events."""
    for i in range(tenants):
        name = f"{prefix}-{i}"
        d.tenant(name)
        for k in range(keys):
            d.api_key(name, "writer", f"w{k}")


def lakewriter(d, *args, env=None, check=True):
    return d.run("lakewriter", "--once", *args, env={**INFO, **(env or {})}, check=check, timeout=120)


def log_lines(text):
    """The JSON log lines of a run (every stderr line but the OML_FAULT notice is one)."""
    out = []
    for line in text.splitlines():
        if line.startswith("OML_FAULT:") or not line.strip():
            continue
        out.append(json.loads(line))
    return out


def table_path(d):
    return d.home / "lake" / BRONZE


def bronze_rows(d):
    from deltalake import DeltaTable
    return DeltaTable(str(table_path(d))).to_pyarrow_table().to_pylist()


def writer_commit(version, text):
    """(version, txn_version, batch_start, batch_end, stream) of one commit file's text, asserting
    it carries exactly one txn of the writer's appId; None for a compaction (OPTIMIZE, no txn)."""
    actions = [json.loads(line) for line in text.splitlines() if line.strip()]
    txns = [a["txn"] for a in actions if "txn" in a]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    if info.get("operation") == "OPTIMIZE" and not txns:
        return None
    assert [t["appId"] for t in txns] == [APP], actions
    return (version, txns[0]["version"], info["oml.batch_start"], info["oml.batch_end"], info["oml.stream"])


def commits(d):
    """[(version, txn_version, batch_start, batch_end, stream)] of every writer commit after creation."""
    out = []
    for f in sorted((table_path(d) / "_delta_log").glob("*.json")):
        version = int(f.stem)
        if version > 0 and (c := writer_commit(version, f.read_text())) is not None:
            out.append(c)
    return out


def outbox_seqs(d):
    with d.su() as c:
        return [r[0] for r in c.execute(
            "SELECT seq FROM oml.outbox WHERE target_table = 'bronze/events' ORDER BY seq").fetchall()]


def last_outbox_seq(d):
    with d.su() as c:
        return c.execute("SELECT coalesce(max(seq), 0) FROM oml.outbox").fetchone()[0]


def frontier(d):
    with d.su() as c:
        return c.execute("SELECT frontier_seq FROM oml.lake_frontier WHERE stream = 'default'").fetchone()[0]


def lease(d):
    with d.su() as c:
        return c.execute("SELECT lease_holder, lease_epoch FROM oml.lake_frontier WHERE stream = 'default'").fetchone()


def assert_exactly_once(d):
    """Every journal event is in bronze once, as signed; the batches are contiguous from 0, each
    commit's txn version is its batch_end, and frontier == txn version == the last outbox seq."""
    rows = bronze_rows(d)
    with d.su() as c:
        journal = {(str(t), s): (bytes(sb), bytes(sig), et) for t, s, sb, sig, et in c.execute(
            "SELECT tenant_id, seq, signed_bytes, signature, event_type FROM oml.journal").fetchall()}
    keys = [(r["tenant_id"], r["seq"]) for r in rows]
    assert len(keys) == len(set(keys)), "a journal event is in bronze twice"
    assert set(keys) == set(journal)
    for r in rows:
        assert (r["signed_bytes"], r["signature"], r["event_type"]) == journal[(r["tenant_id"], r["seq"])]
    per_tenant = {}
    for t, s in keys:
        per_tenant.setdefault(t, []).append(s)
    for t, seqs in per_tenant.items():
        assert sorted(seqs) == list(range(1, len(seqs) + 1)), t
    assert sorted(r["outbox_seq"] for r in rows) == outbox_seqs(d)
    cs = commits(d)
    assert cs
    prev = 0
    for version, txn, start, end, stream in cs:
        assert (start, txn, stream) == (prev, end, "default"), cs
        assert start < end
        prev = end
    last = last_outbox_seq(d)
    assert prev == last
    assert frontier(d) == last
    from deltalake import DeltaTable
    assert DeltaTable(str(table_path(d))).transaction_version(APP) == last
    # gold/daily_activity counts every bronze row once (an increment applied twice shows here).
    want = {}
    for r in rows:
        k = (r["tenant_id"], r["occurred_at"].date(), r["workarea_id"] or "", r["event_type"])
        want[k] = want.get(k, 0) + 1
    gold = DeltaTable(str(d.home / "lake" / "gold" / "daily_activity")).to_pyarrow_table().to_pylist()
    assert {(g["tenant_id"], g["day"], g["workarea_id"], g["event_type"]): g["events"] for g in gold} == want
    assert len(gold) == len(want)
    return cs


def wait_for(pred, what, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"not reached within {timeout} s: {what}")


def proc_state(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


# --- tests -----------------------------------------------------------------------------------
def test_drain_puts_every_event_in_bronze_exactly_once(deployment):
    d = deployment
    add_events(d, "drain")
    want = outbox_seqs(d)
    assert len(want) == 2 + 3 * (2 + 2)  # provider genesis, key.issued; 3 tenants
    p = lakewriter(d, "--max-rows", "4")
    logs = log_lines(p.stderr)  # JSON lines only
    applied = [l for l in logs if l["msg"] == "lake writer: batch applied"]
    assert len(applied) == (len(want) + 3) // 4
    assert all(l["rows"] <= 4 for l in applied)
    cs = assert_exactly_once(d)
    assert [(c[2], c[3]) for c in cs] == [(l["batch_start"], l["batch_end"]) for l in applied]
    # pyarrow over the Parquet files the log names: the same rows, file statistics on.
    import pyarrow as pa
    import pyarrow.parquet as pq
    live = {}
    for f in sorted((table_path(d) / "_delta_log").glob("*.json")):
        for a in (json.loads(x) for x in f.read_text().splitlines() if x.strip()):
            if "add" in a:
                live[a["add"]["path"]] = a["add"]
            elif "remove" in a:
                live.pop(a["remove"]["path"], None)
    tables = []
    for path, add in live.items():
        t = pq.read_table(table_path(d) / unquote(path))
        assert t.num_rows == json.loads(add["stats"])["numRecords"]
        tables.append(t)
    assert sorted(pa.concat_tables(tables).column("outbox_seq").to_pylist()) == want
    # Run again with nothing new: no commit. New events: drained from the frontier on.
    lakewriter(d)
    assert len(commits(d)) == len(cs)
    add_events(d, "drain-more", tenants=1)
    lakewriter(d)
    assert len(assert_exactly_once(d)) == len(cs) + 1


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_kill_9_at_every_step_then_restart_applies_every_event_once_with_the_recorded_bounds(deployment, point):
    d = deployment
    add_events(d, "before", tenants=1)
    lakewriter(d, "--max-rows", "4")  # a frontier above 0 before the crash
    before = commits(d)
    add_events(d, "crash")
    first = lakewriter(d, "--max-rows", "4", env={"OML_FAULT": f"{point}:kill"}, check=False)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert f"OML_FAULT: SIGKILL at {point}" in first.stderr
    cut = [l for l in log_lines(first.stderr) if l["msg"] == "lake writer: batch cut"][-1]
    first_bounds = (cut["batch_start"], cut["batch_end"])
    assert first_bounds[0] == before[-1][3]  # the first batch after the old frontier
    crashed = commits(d)
    committed = point in ("lakewriter.after_commit.bronze/events", "lakewriter.after_commit.gold/daily_activity",
                          "lakewriter.before_frontier_advance")
    assert crashed[:len(before)] == before
    assert [(c[2], c[3]) for c in crashed[len(before):]] == ([first_bounds] if committed else [])
    assert frontier(d) == before[-1][3]  # the crash came before the frontier advance

    # The restart uses other batch sizes where the batch reached the table: a new cut would then
    # end elsewhere, so the recorded bounds can only come back through the rebuild from the
    # Delta log. Where nothing was recorded the same sizes cut the same batch again.
    second = lakewriter(d, "--max-rows", "100" if committed else "4")
    logs = log_lines(second.stderr)
    recovered = [l for l in logs if l["msg"] == "lake writer: recovering a batch from the Delta log"]
    assert [(l["batch_start"], l["batch_end"]) for l in recovered] == ([first_bounds] if committed else [])
    cs = assert_exactly_once(d)
    assert cs[:len(crashed)] == crashed  # nothing written before the crash was rewritten
    bounds = [(c[2], c[3]) for c in cs]
    assert bounds.count(first_bounds) == 1  # the batch of the first attempt, recorded once, same bounds


def test_two_writers_at_once_the_delta_conflict_fences_the_second(deployment, tmp_path):
    """The lease bypassed on purpose (--test-bypass-lease): A stops right before its commit, B
    drains everything, A resumes, loses the commit race on the Delta log and writes nothing."""
    two_writers_race(deployment, tmp_path)


def two_writers_race(d, tmp_path, commits_of=None, exactly_once=None):
    """A (lease bypassed) stops right before its commit; B drains everything; A resumes and must
    fail with lake-commit-conflict, commit nothing, and leave every event exactly once. Shared
    with tests/test_lake_s3.py, which passes its S3 readers of the commits and the rows."""
    commits = commits_of or globals()["commits"]
    assert_exactly_once = exactly_once or globals()["assert_exactly_once"]
    add_events(d, "race")
    a_log = open(tmp_path / "a.log", "w")
    env = {**d.env, **INFO, "OML_FAULT": "lakewriter.before_commit.bronze/events:stop"}
    a = subprocess.Popen([OML_BIN, "lakewriter", "--once", "--test-bypass-lease"], env=env, stderr=a_log,
                         stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: a.poll() is None and proc_state(a.pid) == "T", "writer A stopped before its commit")
        b = lakewriter(d, "--test-bypass-lease", "--max-rows", "5")
        assert any(l["msg"] == "lake writer: batch applied" for l in log_lines(b.stderr))
        b_commits = commits(d)
        assert len(b_commits) >= 2
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=60) == 0
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        a_log.close()
    a_text = (tmp_path / "a.log").read_text()
    a_logs = log_lines(a_text)
    failed = [l for l in a_logs if l["msg"] == "lake writer: batch failed"]
    assert len(failed) == 1 and "lake-commit-conflict" in failed[0]["error"], a_text
    assert not [l for l in a_logs if l["msg"] == "lake writer: batch applied" and l["committed"]], a_text
    assert commits(d) == b_commits  # A committed nothing
    assert_exactly_once(d)


def test_a_standby_takes_over_within_seconds_of_a_kill_9(deployment, tmp_path):
    d = deployment
    add_events(d, "lease", tenants=1)
    env = {**d.env, **INFO}
    logs = {n: open(tmp_path / f"{n}.log", "w") for n in ("a", "b")}
    procs = {}
    try:
        procs["a"] = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"], env=env, stderr=logs["a"],
                                      stdout=subprocess.DEVNULL)
        wait_for(lambda: frontier(d) == last_outbox_seq(d), "A drains the backlog")
        holder_a, epoch_a = lease(d)
        assert holder_a.split(":")[1] == str(procs["a"].pid)
        procs["b"] = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"], env=env, stderr=logs["b"],
                                      stdout=subprocess.DEVNULL)
        wait_for(lambda: "standby, another writer holds the lease" in (tmp_path / "b.log").read_text(), "B is standby")
        add_events(d, "lease-a", tenants=1, keys=1)
        wait_for(lambda: frontier(d) == last_outbox_seq(d), "A drains while B waits")
        assert lease(d) == (holder_a, epoch_a)

        procs["a"].kill()  # SIGKILL: no cleanup, the lease goes with its PostgreSQL session
        assert procs["a"].wait(timeout=10) == -signal.SIGKILL
        t0 = time.time()
        add_events(d, "lease-b", tenants=1, keys=1)
        wait_for(lambda: frontier(d) == last_outbox_seq(d), "B takes over and drains", timeout=30)
        took = time.time() - t0
        assert took < 5.0, f"takeover took {took:.1f} s"
        holder_b, epoch_b = lease(d)
        assert holder_b.split(":")[1] == str(procs["b"].pid)
        assert epoch_b == epoch_a + 1
        assert "lake writer: lease acquired" in (tmp_path / "b.log").read_text()
        procs["b"].send_signal(signal.SIGTERM)
        assert procs["b"].wait(timeout=20) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()
    assert_exactly_once(d)


def test_the_lakewriter_url_comes_from_the_environment_or_the_local_cluster(deployment):
    d = deployment
    url_file = d.home / "pg" / "lakewriter.url"
    url = url_file.read_text().strip()
    url_file.rename(url_file.with_suffix(".moved"))
    try:
        missing = lakewriter(d, check=False)
        assert missing.returncode == 4
        assert "no lake writer database: set OML_LAKEWRITER_DATABASE_URL" in missing.stderr
        lakewriter(d, env={"OML_LAKEWRITER_DATABASE_URL": url})
        # The application role is not the lake writer's: it cannot read the frontier.
        wrong = lakewriter(d, env={"OML_LAKEWRITER_DATABASE_URL": d.app_url()}, check=False)
        assert wrong.returncode == 1, wrong.stderr
        assert "database-permission-denied" in wrong.stderr
    finally:
        url_file.with_suffix(".moved").rename(url_file)
    assert_exactly_once(d)


def thread_nice(pid):
    """{thread name: [nice, ...]} of a running process (/proc/<pid>/task/*/stat field 19)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
        except FileNotFoundError:
            continue  # the thread exited meanwhile
        fields = stat[stat.rindex(")") + 2:].split()
        out.setdefault(name, []).append(int(fields[16]))  # fields[0] is field 3
    return out


def test_the_writer_runs_at_a_lower_cpu_priority_than_the_commit_point(deployment, tmp_path):
    """`oml lakewriter` lowers every thread's priority by --nice (default 5), the Delta adapter's
    threads included (they start after, and inherit it): when the CPU is short the commit point
    keeps it (issue 22). --nice 0 leaves it; a value outside 0..19 is a usage error."""
    d = deployment
    log = open(tmp_path / "nice.log", "w")
    for args, want in (([], 5), (["--nice", "0"], 0), (["--nice", "12"], 12)):
        add_events(d, f"nice-{want}", tenants=1, keys=1)
        p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50", *args], env={**d.env, **INFO},
                             stderr=log, stdout=subprocess.DEVNULL)
        try:
            wait_for(lambda: frontier(d) == last_outbox_seq(d), "the writer drains")
            nice = thread_nice(p.pid)
            assert nice["oml"] == [want] * len(nice["oml"]), (args, nice)
            others = {n: v for n, v in nice.items() if n != "oml" and not n.startswith("oml-compaction")}
            assert others, nice  # the Delta adapter's runtime threads
            for name, values in others.items():
                assert values == [want] * len(values), (args, name, nice)
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=20) == 0
    log.close()
    bad = lakewriter(d, "--nice", "20", check=False)
    assert bad.returncode == 2, bad.stderr
    assert "--nice: Value 20 not in range 0 to 19" in bad.stderr
    assert_exactly_once(d)


# --- gold trails the frontier while the writer is busy (issue 22) ------------------------------
GOLD = "gold/daily_activity"


def gold_state(d):
    """(gold's txn version of the writer's appId or None, {key: events}) as deltalake reads it."""
    from deltalake import DeltaTable
    t = DeltaTable(str(d.home / "lake" / GOLD))
    got = {(g["tenant_id"], g["day"], g["workarea_id"], g["event_type"]): g["events"]
           for g in t.to_pyarrow_table().to_pylist()}
    return t.transaction_version(APP), got


def bronze_counts(d, through=None):
    """gold's counts recomputed from bronze's rows (those with outbox_seq <= through)."""
    want = {}
    for r in bronze_rows(d):
        if through is not None and r["outbox_seq"] > through:
            continue
        k = (r["tenant_id"], r["occurred_at"].date(), r["workarea_id"] or "", r["event_type"])
        want[k] = want.get(k, 0) + 1
    return want


def gold_commits(d):
    """commitInfo of each of gold's commits that carries the writer's txn, oldest first."""
    out = []
    for f in sorted((d.home / "lake" / GOLD / "_delta_log").glob("*.json")):
        actions = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if any("txn" in a for a in actions):
            out.append(next(a["commitInfo"] for a in actions if "commitInfo" in a))
    return out


def applied_lines(path):
    return [l for l in log_lines(Path(path).read_text()) if l["msg"] == "lake writer: batch applied"]


@contextlib.contextmanager
def service_writer(d, log, gold_every_ms, fault=None):
    """`oml lakewriter` in service mode (--max-rows 4, --poll-ms 50), its log in `log`; killed
    on the way out if it still runs."""
    env = {**d.env, **INFO, **({"OML_FAULT": fault} if fault else {})}
    with open(log, "w") as f:
        p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50", "--max-rows", "4",
                              "--gold-every-ms", str(gold_every_ms)], env=env, stderr=f, stdout=subprocess.DEVNULL)
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_gold_trails_the_frontier_while_busy_and_holds_every_row_once_after_idle_stop_or_kill(deployment, tmp_path):
    """Service mode lets gold/daily_activity trail the frontier (--gold-every-ms): a batch keeps
    gold's counts in memory and advances the frontier without gold's MERGE. Gold then holds every
    bronze row exactly once after each way the trailing ends: the writer going idle (the counts
    committed alone, txn = the frontier), a graceful stop in the middle of a drain, and a kill -9
    with counts kept (recovery makes them again from the outbox)."""
    d = deployment
    add_events(d, "trail-a", tenants=3, keys=2)
    last_a = last_outbox_seq(d)

    # 1. Idle: the drain's batches all trail (600 s), then the idle writer brings gold to the
    #    frontier; stopped (SIGSTOP) just before that commit, gold holds nothing yet.
    log_a = tmp_path / "a.log"
    with service_writer(d, log_a, 600000, "lakewriter.gold_flush.before_commit:stop") as a:
        wait_for(lambda: proc_state(a.pid) == "T", "A stops before gold's catch-up commit")
        assert frontier(d) == last_a
        assert bronze_counts(d) == bronze_counts(d, last_a) and sum(bronze_counts(d).values()) == len(outbox_seqs(d))
        assert gold_state(d) == (None, {})  # every batch left gold's part for later
        applied = applied_lines(log_a)
        assert len(applied) == (len(outbox_seqs(d)) + 3) // 4 >= 3
        assert all([t["table"] for t in l["trailed"]] == [GOLD] for l in applied), applied
        assert all(GOLD not in [c["table"] for c in l["committed"]] for l in applied)
        a.send_signal(signal.SIGCONT)
        wait_for(lambda: gold_state(d)[0] == last_a, "gold reaches the frontier")
        assert gold_state(d)[1] == bronze_counts(d)
        info = gold_commits(d)[-1]
        assert (info["oml.batch_start"], info["oml.batch_end"], info["oml.gold_trailed_from"]) == (last_a, last_a, -1)
        assert "lake writer: gold brought to the frontier" in log_a.read_text()
        # More events: drained, trailed, caught up again when idle.
        add_events(d, "trail-b", tenants=1, keys=2)
        wait_for(lambda: frontier(d) == last_outbox_seq(d) and gold_state(d)[0] == last_outbox_seq(d),
                 "A drains and gold catches up")
        assert gold_state(d)[1] == bronze_counts(d)
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=20) == 0
    assert_exactly_once(d)

    # 2. A graceful stop in the middle of a drain: the first batch trails, SIGTERM arrives while
    #    the writer is stopped after the second cut; it applies that batch, then commits gold's
    #    kept counts before it exits 0.
    add_events(d, "trail-c", tenants=3, keys=2)
    log_c = tmp_path / "c.log"
    with service_writer(d, log_c, 600000, "lakewriter.after_cut:stop") as c:
        wait_for(lambda: proc_state(c.pid) == "T", "C stops after its first cut")
        c.send_signal(signal.SIGTERM)
        c.send_signal(signal.SIGCONT)
        assert c.wait(timeout=20) == 0
    applied = applied_lines(log_c)
    assert len(applied) == 1 and [t["table"] for t in applied[0]["trailed"]] == [GOLD]
    f_c = frontier(d)
    assert f_c == applied[0]["batch_end"] < last_outbox_seq(d)
    txn, got = gold_state(d)
    assert txn == f_c and got == bronze_counts(d) == bronze_counts(d, f_c)
    assert "lake writer: gold brought to the frontier" in log_c.read_text()

    # 3. kill -9 with counts kept: the writer drains the rest (trailing) and dies where it would
    #    have committed them; gold is below the frontier. The next writer refills it from the
    #    outbox, and every row is in gold exactly once.
    with service_writer(d, tmp_path / "k.log", 600000, "lakewriter.gold_flush.before_commit:kill") as k:
        assert k.wait(timeout=60) == -signal.SIGKILL
    assert frontier(d) == last_outbox_seq(d)
    assert gold_state(d)[0] == f_c
    assert gold_state(d)[1] != bronze_counts(d)
    p = lakewriter(d)
    assert "a derived table is below the frontier (it may have trailed it); refilling it from the outbox" in p.stderr
    assert gold_state(d) == (last_outbox_seq(d), bronze_counts(d))
    assert_exactly_once(d)


def test_gold_counts_due_are_committed_right_after_a_batchs_frontier_advance(deployment, tmp_path):
    """--gold-every-ms 1: once kept counts are due, they are committed alone right after the next
    batch's frontier advance (no batch commits gold itself); each such commit carries gold's
    txn from the one before and the frontier it brings gold to."""
    d = deployment
    add_events(d, "due", tenants=3, keys=2)
    log = tmp_path / "due.log"
    with service_writer(d, log, 1) as p:
        wait_for(lambda: frontier(d) == last_outbox_seq(d) and gold_state(d)[0] == last_outbox_seq(d),
                 "the writer drains and gold catches up")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    lines = [l for l in log_lines(log.read_text())
             if l["msg"] in ("lake writer: batch applied", "lake writer: gold brought to the frontier")]
    batches = [l for l in lines if l["msg"] == "lake writer: batch applied"]
    flushes = [l for l in lines if l["msg"] != "lake writer: batch applied"]
    assert len(batches) == (len(outbox_seqs(d)) + 3) // 4 >= 3
    assert all(GOLD not in [c["table"] for c in l["committed"]] for l in batches)
    # A batch's counts are kept fresh, so they are due at the batch after (not at its own).
    assert len(batches) // 2 <= len(flushes) <= len(batches)
    prev_through = -1
    for i, l in enumerate(lines):
        if l["msg"] == "lake writer: batch applied":
            continue
        assert lines[i - 1]["msg"] == "lake writer: batch applied"  # right after a batch
        assert (l["from"], l["through"]) == (prev_through, lines[i - 1]["batch_end"])
        prev_through = l["through"]
    assert prev_through == last_outbox_seq(d)
    assert gold_state(d)[1] == bronze_counts(d)
    assert [(c["oml.batch_end"], c["oml.gold_trailed_from"]) for c in gold_commits(d)] == \
        [(f["through"], f["from"]) for f in flushes]
    assert_exactly_once(d)


def test_gold_every_0_commits_gold_with_every_batch_in_service_mode(deployment, tmp_path):
    """--gold-every-ms 0: no batch leaves gold's part for later (the --once behaviour), and a
    value outside 0..600000 is a usage error."""
    d = deployment
    add_events(d, "every", tenants=2, keys=2)
    log = tmp_path / "w.log"
    with service_writer(d, log, 0) as p:
        wait_for(lambda: frontier(d) == last_outbox_seq(d), "the writer drains")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    applied = applied_lines(log)
    assert len(applied) == (len(outbox_seqs(d)) + 3) // 4
    assert all(l["trailed"] == [] and GOLD in [c["table"] for c in l["committed"]] for l in applied)
    assert "gold brought to the frontier" not in log.read_text()
    assert_exactly_once(d)
    bad = lakewriter(d, "--gold-every-ms", "600001", check=False)
    assert bad.returncode == 2, bad.stderr
    assert "--gold-every-ms: Value 600001 not in range 0 to 600000" in bad.stderr


def test_gold_catch_up_merges_again_over_an_outside_optimize_of_gold(deployment, tmp_path):
    """An operator's OPTIMIZE of gold (the deltalake package) lands while the writer is about to
    commit gold's kept counts: the commit loses the race, and is made again on a fresh snapshot
    (no recovery, no refill); gold holds every row once."""
    d = deployment
    from deltalake import DeltaTable
    add_events(d, "opt-a", tenants=3, keys=2)
    lakewriter(d, "--max-rows", "2")  # --once: one gold commit (and file) per batch
    assert len(DeltaTable(str(d.home / "lake" / GOLD)).file_uris()) >= 4
    add_events(d, "opt-b", tenants=2, keys=2)
    log = tmp_path / "opt.log"
    with service_writer(d, log, 600000, "lakewriter.gold_flush.before_commit:stop") as p:
        wait_for(lambda: proc_state(p.pid) == "T", "the writer stops before gold's catch-up commit")
        metrics = DeltaTable(str(d.home / "lake" / GOLD)).optimize.compact()
        assert metrics["numFilesRemoved"] >= 4
        p.send_signal(signal.SIGCONT)
        wait_for(lambda: gold_state(d)[0] == last_outbox_seq(d), "gold reaches the frontier")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    text = log.read_text()
    again = [l for l in log_lines(text) if l["msg"] == "lake writer: a commit without this stream's txn landed first; "
                                                        "committing again"]
    assert [(l["table"], l["attempt"]) for l in again] == [(GOLD, 1)]
    assert "batch failed" not in text and "a derived table is below the frontier" not in text
    assert gold_state(d)[1] == bronze_counts(d)
    assert_exactly_once(d)
