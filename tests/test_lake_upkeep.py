"""The lake writer's upkeep (issue 20, "VACUUM and checkpoints automated"): a writer holding the
lease VACUUMs every table each --vacuum-every seconds, deleting only files removed from the log
(or never in it) longer ago than --vacuum-retention-hours. A reader of a version within the
retention still finds every file it names; a file a killed writer left long ago is deleted.
Read back with the `deltalake` package (a reader that did not write the tables)."""
import json
import os
import subprocess
import time

from conftest import OML_BIN
from test_lake_tables import BRONZE, GOLD, SILVER, demote, verdict
from test_lakewriter import lakewriter

TABLES = (BRONZE, SILVER, GOLD)


def vacuum_lines(text):
    out = []
    for line in text.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("msg") == "lake writer: table vacuumed":
            out.append(j)
    return out


def test_vacuum_keeps_what_readers_of_the_retention_window_need(served):
    from deltalake import DeltaTable
    d = served
    a = d.submit(d.writer, body="promoted then demoted").json()["artifact_id"]
    d.get(f"/v1/claims/{a}", d.reviewer)
    verdict(d, d.reviewer, a, "accept")
    lakewriter(d)
    silver = d.home / "lake" / SILVER
    before = DeltaTable(str(silver))
    v_before = before.version()
    rows_before = before.to_pyarrow_table().to_pylist()
    assert [r["state"] for r in rows_before] == ["promoted"]
    demote(d, d.reviewer, a)
    lakewriter(d)  # the MERGE rewrites silver's file: the old one is now a tombstone
    live = set(DeltaTable(str(silver)).file_uris())
    tombstoned = [p for p in silver.glob("*.parquet") if str(p) not in live and p.as_uri() not in live]
    assert tombstoned, (live, list(silver.glob("*.parquet")))
    # The tombstoned file is old on disk too: only its tombstone's time may keep it.
    two_hours_ago = time.time() - 7200
    for t in tombstoned:
        os.utime(t, (two_hours_ago, two_hours_ago))
    # What a killed writer left: a data file no commit names, two hours old, and a fresh one.
    old = d.home / "lake" / BRONZE / "part-00000-left-by-a-killed-writer.parquet"
    old.write_bytes(b"PAR1 not really")
    os.utime(old, (two_hours_ago, two_hours_ago))
    fresh = d.home / "lake" / BRONZE / "part-00000-being-written-now.parquet"
    fresh.write_bytes(b"PAR1 not really")
    p = subprocess.Popen([OML_BIN, "lakewriter", "--vacuum-every", "1", "--vacuum-retention-hours", "1",
                          "--poll-ms", "50"], env={**d.env, "OML_LOG_LEVEL": "info"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and old.exists():
            time.sleep(0.2)
        time.sleep(1.5)  # the round that deleted it logs every table
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err[-2000:]
    lines = vacuum_lines(err)
    assert {x["table"] for x in lines} == set(TABLES), err[-2000:]
    assert all(x["retention_hours"] == 1 for x in lines)
    assert sum(x["files_deleted"] for x in lines if x["table"] == BRONZE) >= 1
    # Deleted: the old file no commit names. Kept: the fresh one (a write in progress) and the
    # silver file the demotion's MERGE removed a moment ago.
    assert not old.exists()
    assert fresh.exists()
    for t in tombstoned:
        assert t.exists(), t
    # So a reader of the version before the demotion still reads it whole.
    assert DeltaTable(str(silver), version=v_before).to_pyarrow_table().to_pylist() == rows_before
    assert [r["state"] for r in DeltaTable(str(silver)).to_pyarrow_table().to_pylist()] == ["demoted"]
    reconcile = d.run("reconcile", "--no-objects", check=False)
    assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr


def test_a_signing_key_rotation_reaches_a_running_lake_writer(served):
    """`oml key rotate` while the writer runs: its next dead letter is signed with the new key,
    read again from the key file, with no restart (before, the stream waited on the row until
    the writer was restarted: its key was no longer the key in force)."""
    from test_lake_tables import poison
    d = served
    d.submit(d.writer, body="before the rotation")
    p = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"], env={**d.env, "OML_LOG_LEVEL": "info"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        old = json.loads(d.run("key", "public").stdout)["key_id"]
        d.run("key", "rotate")
        new = json.loads(d.run("key", "public").stdout)["key_id"]
        assert new != old
        bad = poison(d, d.tenant_id, "gold/unknown", {"x": 1})
        deadline = time.time() + 60
        row = None
        while time.time() < deadline and row is None:
            with d.su() as c:
                row = c.execute("SELECT skipped_seq FROM oml.dead_letter WHERE outbox_seq = %s", (bad,)).fetchone()
            time.sleep(0.2)
        assert row is not None, "the running writer never dead-lettered the row"
        with d.su() as c:
            key_id, signed = c.execute("SELECT key_id, signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = %s",
                                       (d.tenant_id, row[0])).fetchone()
        assert key_id == new
        assert json.loads(bytes(signed))["type"] == "materialize-skipped"
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err[-2000:]
    reread = [json.loads(line) for line in err.splitlines()
              if line.startswith("{") and "signing key re-read after a rotation" in line]
    assert [(x["old_key_id"], x["key_id"]) for x in reread] == [(old, new)]
    v = d.run("verify", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
