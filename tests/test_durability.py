"""The production profile requires synchronous quorum replication (issue 6 section 6).

`oml serve` refuses writes (503 durability-reduced) unless the database runs synchronous_commit
in (remote_write, remote_apply, on) with synchronous_standby_names = 'ANY k (...)', or it runs
with reduced durability (--reduced-durability, OML_REDUCED_DURABILITY, reduced_durability in
oml.toml; `oml dev` is reduced by definition). conftest's deployments run with
OML_REDUCED_DURABILITY=1; these tests set it to 0 ("ENFORCED") to exercise the gate.

The private cluster has no standbys. A write under quorum settings therefore waits in COMMIT
for a standby that never comes: the positive case shows that wait, then cancels it.
"""
import json
import re
import signal
import threading
import time

import psycopg
import pytest
import requests
from psycopg import sql

from conftest import dev_profile

ENFORCED = {"OML_REDUCED_DURABILITY": "0"}
REFUSED = "urn:oml:problem:durability-reduced"


def set_sync(d, commit=None, names=None):
    """ALTER SYSTEM the two settings (None: RESET), reload, and wait until new sessions see them."""
    with d.su() as c:
        for name, value in (("synchronous_commit", commit), ("synchronous_standby_names", names)):
            if value is None:
                c.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))
            else:
                c.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        c.execute("SELECT pg_reload_conf()")
    want = (commit or "on", names or "")
    deadline = time.time() + 10
    while time.time() < deadline:
        with d.su() as c:
            got = c.execute("SELECT current_setting('synchronous_commit'), "
                            "current_setting('synchronous_standby_names')").fetchone()
        if got == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"settings not in effect: {got} != {want}")


def metric(d, name):
    m = re.search(rf"^{name} (\S+)$", d.metrics(), re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def serve(d, env, args=()):
    """d.serve, remembering where this server's log starts (serve.log is appended to)."""
    d.log_start = len(d.log_text())
    d.serve(env=env, args=args)


def log_lines(d):
    """This server's JSON log lines."""
    out = []
    for line in d.log_text()[getattr(d, "log_start", 0):].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def health(d):
    r = d.get("/v1/health")
    assert r.status_code == 200, r.text
    return r.json()


def wait_health(d, durability, within):
    t0 = time.time()
    while time.time() - t0 < within:
        h = health(d)
        if h["durability"] == durability:
            return time.time() - t0
        time.sleep(0.05)
    raise AssertionError(f"/v1/health durability still {health(d)['durability']!r} after {within} s, want {durability!r}")


@pytest.fixture
def acme(deployment):
    """A deployment with tenant acme, a writer key and one claim (written with reduced durability)."""
    d = deployment
    d.tenant_id = d.tenant("acme")
    d.writer = d.api_key("acme", "writer", "alice")
    d.serve()  # conftest: OML_REDUCED_DURABILITY=1
    r = d.submit(d.writer, body="before")
    assert r.status_code == 201, r.text
    d.claim = r.json()
    d.stop_server()
    yield d


# (1) No quorum settings (the cluster's defaults), no flag: writes refused, reads served.
def test_serve_without_quorum_refuses_writes_and_serves_reads(acme):
    d = acme
    before = d.counts()
    serve(d, env=ENFORCED)
    w = d.submit(d.writer, body="refused")
    assert w.status_code == 503
    assert w.json()["type"] == REFUSED
    assert ("synchronous_commit=on; synchronous_standby_names is empty: no synchronous standbys"
            in w.json()["detail"])
    e = d.post(f"/v1/claims/{d.claim['artifact_id']}/erase", d.writer, json={"reason": "x"})
    assert e.status_code == 503
    assert e.json()["type"] == REFUSED
    g = d.get(f"/v1/claims/{d.claim['artifact_id']}", d.writer)
    assert g.status_code == 200 and g.json()["body"] == "before"
    ev = d.get("/v1/events", d.writer)
    assert ev.status_code == 200 and [e["type"] for e in ev.json()["events"]] == ["api_key.created", "claim.submitted"]  # a writer sees its own events
    assert d.get("/v1/chain/head", d.writer).status_code == 200
    h = health(d)
    assert (h["status"], h["writes"], h["durability"]) == ("degraded", "refused", "insufficient")
    assert metric(d, "oml_durability_reduced") == 0
    assert metric(d, "oml_durability_quorum") == 0
    assert d.counts() == before  # nothing written: no journal, outbox or claim row
    startup = [l for l in log_lines(d) if l["msg"].startswith("durability requirement not met")]
    assert len(startup) == 1 and startup[0]["durability"] == "insufficient", log_lines(d)


def _cancel_sync_rep_wait(d):
    with d.su() as c:
        waiting = []
        deadline = time.time() + 20
        while not waiting and time.time() < deadline:
            waiting = c.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchall()
            time.sleep(0.02)
        assert waiting, "no COMMIT waiting for the standby quorum"
        c.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")


# (2) Quorum settings open the gate. The write then passes it and waits in COMMIT for the standby
# quorum (s1 does not exist): that wait is observed, then cancelled, which must not be acknowledged.
def test_quorum_settings_open_the_gate(acme):
    d = acme
    set_sync(d, "remote_apply", "ANY 1 (s1)")
    doctor = d.run("doctor", check=False)
    assert ("durability: synchronous_commit=remote_apply synchronous_standby_names='ANY 1 (s1)' -> "
            "synchronous quorum replication: the production requirement holds") in doctor.stdout
    # ... but s1 does not exist: the settings hold, the standby does not (issue 21).
    assert doctor.returncode == 3, doctor.stdout
    assert "REPLICATION: below the quorum: 0 of 0 streaming standbys synchronous; 1 needed." in doctor.stdout
    before = d.counts()["journal"]
    serve(d, env=ENFORCED)
    h = health(d)
    assert (h["status"], h["writes"], h["durability"]) == ("degraded", "accepting", "ok")
    assert (h["replication"], h["replication_detail"]) == (
        "below-quorum", "0 of 0 streaming standbys synchronous; 1 needed")
    assert h["durability_detail"] == ("synchronous_commit=remote_apply; synchronous_standby_names is a quorum "
                                      "(ANY 1 of 1 standby)")
    assert metric(d, "oml_durability_reduced") == 0
    assert metric(d, "oml_durability_quorum") == 1
    out = {}
    writer = threading.Thread(target=lambda: out.update(r=d.submit(d.writer, body="waits for s1")))
    writer.start()
    _cancel_sync_rep_wait(d)  # the write reached a COMMIT waiting for the standby quorum
    writer.join(30)
    r = out["r"]
    assert r.status_code == 503, r.text
    assert r.json()["type"] == "urn:oml:problem:commit-not-replicated"
    assert d.counts()["journal"] == before + 1  # committed locally, never acknowledged


# (3) Reduced durability, by each of its three spellings: writes accepted, and reported.
@pytest.mark.parametrize("how", ["flag", "env", "toml"])
def test_reduced_durability_accepts_writes_and_says_so(acme, how):
    d = acme
    if how == "flag":
        serve(d, ENFORCED, args=["--reduced-durability"])
    elif how == "env":
        serve(d, env={"OML_REDUCED_DURABILITY": "true"})
    else:
        (d.home / "oml.toml").write_text("reduced_durability = true\n")
        serve(d, env={"OML_REDUCED_DURABILITY": ""})  # empty counts as unset: the file decides
    w = d.submit(d.writer, body="accepted")
    assert w.status_code == 201, w.text
    assert w.json()["receipt"]["seq"] == 4
    h = health(d)
    assert (h["status"], h["writes"], h["durability"]) == ("ok", "accepting", "reduced")
    assert h["durability_detail"] == "synchronous_commit=on; synchronous_standby_names is empty: no synchronous standbys"
    assert metric(d, "oml_durability_reduced") == 1
    assert metric(d, "oml_durability_quorum") == 0
    startup = [l for l in log_lines(d) if l["msg"].startswith("durability reduced (--reduced-durability)")]
    assert len(startup) == 1, log_lines(d)
    assert startup[0]["level"] == "warn" and startup[0]["durability"] == "reduced"


# (4) Re-checked while serving: quorum -> none closes the gate within one interval, and back.
def test_settings_are_rechecked_while_serving(acme):
    d = acme
    set_sync(d, "on", "ANY 1 (s1)")
    serve(d, env=dict(ENFORCED, OML_DURABILITY_CHECK_MS="500", OML_LOG_LEVEL="info"))
    assert health(d)["durability"] == "ok"
    before = d.counts()
    set_sync(d, "on", None)
    assert wait_health(d, "insufficient", within=0.5 + 2.0) <= 2.5
    w = d.submit(d.writer, body="refused")
    assert w.status_code == 503 and w.json()["type"] == REFUSED
    assert metric(d, "oml_durability_quorum") == 0
    assert d.counts() == before
    set_sync(d, "remote_write", "ANY 1 (s1)")
    assert wait_health(d, "ok", within=0.5 + 2.0) <= 2.5
    assert health(d)["writes"] == "accepting"
    assert metric(d, "oml_durability_quorum") == 1
    msgs = [(l["msg"], l.get("durability")) for l in log_lines(d) if l["msg"].startswith("durability")]
    assert msgs == [("durability: synchronous quorum replication; writes accepted", "ok"),
                    ("durability requirement not met: writes refused (503 durability-reduced)", "insufficient"),
                    ("durability requirement met: writes accepted", "ok")], msgs


# (5) Priority replication is not a quorum: FIRST k, and a plain list (FIRST 1).
@pytest.mark.parametrize("names,described", [("FIRST 1 (s1)", "FIRST 1 of 1 standby"), ("s1, s2", "FIRST 1 of 2 standbys")])
def test_priority_sync_is_not_quorum(acme, names, described):
    d = acme
    set_sync(d, "remote_apply", names)
    serve(d, env=ENFORCED)
    w = d.submit(d.writer, body="refused")
    assert w.status_code == 503
    assert w.json()["type"] == REFUSED
    assert f"synchronous_standby_names is priority-based ({described}), not a quorum (ANY k)" in w.json()["detail"]
    h = health(d)
    assert (h["writes"], h["durability"]) == ("refused", "insufficient")
    doctor = d.run("doctor").stdout
    assert f"-> NOT the production requirement (synchronous_commit=remote_apply; synchronous_standby_names is " \
           f"priority-based ({described}), not a quorum (ANY k))" in doctor


# The local profile is reduced by definition, whatever reduced_durability says.
def test_dev_profile_is_reduced_by_definition():
    with dev_profile("oml-dev-dur", OML_REDUCED_DURABILITY="0") as dev:
        p, home, text = dev.p, dev.home, dev.banner
        assert "oml dev is running (local profile; durability: reduced (local profile), this one disk)." in text, text
        h = requests.get(f"{dev.base}/v1/health", timeout=10).json()
        assert (h["writes"], h["durability"]) == ("accepting", "reduced (local profile)")
        token = (home / "dev-writer.token").read_text().strip()
        r = requests.post(f"{dev.base}/v1/claims", headers={"Authorization": f"Bearer {token}"},
                          json={"body": "hi", "workarea_id": "wa-1", "path": "a.md", "provenance": "human"}, timeout=30)
        assert r.status_code == 201, r.text
        m = re.search(r"^oml_durability_reduced (\S+)$", requests.get(f"{dev.metrics_base}/metrics").text, re.M)
        assert m and float(m.group(1)) == 1
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
        logs = [json.loads(l) for l in p.stderr.read().splitlines() if l.startswith("{")]
        assert any(l["msg"].startswith("durability reduced (local profile)") and
                   l["durability"] == "reduced (local profile)" for l in logs), logs


# (7) An Idempotency-Key never turns an unreplicated commit into a 201: neither the request
# whose wait was cancelled, nor a retry with the same key while the standbys still have not
# confirmed (the retry's own fence commit waits for them too).
def test_a_keyed_write_whose_commit_was_not_replicated_is_not_replayed_as_a_success(acme):
    d = acme
    set_sync(d, "remote_apply", "ANY 1 (s1)")
    before = d.counts()["journal"]
    serve(d, env=ENFORCED)
    key = {"Idempotency-Key": '"not-replicated-1"'}
    for attempt in ("first", "retry"):
        out = {}
        doc = {"body": "keyed", "workarea_id": "wa-1", "path": "notes/k.md", "provenance": "human"}
        writer = threading.Thread(target=lambda: out.update(r=d.post("/v1/claims", d.writer, json=doc, headers=dict(key))))
        writer.start()
        _cancel_sync_rep_wait(d)
        writer.join(30)
        r = out["r"]
        assert r.status_code == 503, (attempt, r.text)
        assert r.json()["type"] == "urn:oml:problem:commit-not-replicated", attempt
        assert "Idempotent-Replayed" not in r.headers, attempt
    # One event, committed locally by the first attempt; the retry wrote nothing of its own.
    assert d.counts()["journal"] == before + 1


# (8) CLI commands that append follow the same rule against a configured database.
def test_cli_writes_to_a_configured_database_need_quorum_or_reduced_durability(acme):
    d = acme
    d.stop_server()
    before = d.counts()
    env = dict(ENFORCED, OML_DATABASE_URL=d.app_url())
    refused = d.run("tenant", "create", "needs-quorum", check=False, env=env)
    assert refused.returncode == 5, refused.stderr
    assert "durability-reduced" in refused.stderr
    assert "synchronous_standby_names is empty" in refused.stderr
    assert d.counts() == before
    accepted = d.run("tenant", "create", "accepted-reduced", env=dict(env, OML_REDUCED_DURABILITY="1"))
    assert json.loads(accepted.stdout)["name"] == "accepted-reduced"
