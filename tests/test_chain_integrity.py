"""Chain integrity, end to end: a database restored under a running server, and what `oml
verify` catches that a consistent-looking database hides (a deleted tenant, a cut tail, a
retired key's backdated event, a broken provider chain seen from one tenant)."""
import base64
import datetime
import hashlib
import json
import subprocess
import time

import psycopg
from cryptography.hazmat.primitives import serialization

PROVIDER = "00000000-0000-0000-0000-000000000000"


def _restore(d, dump):
    """Drops the database under whoever is connected and restores `dump` (a failover to a
    standby that missed the last commits looks the same to the server)."""
    admin = d.superuser_url.replace("/oml?", "/postgres?")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("DROP DATABASE oml WITH (FORCE)")
        c.execute("CREATE DATABASE oml")
    subprocess.run(["pg_restore", "-d", d.superuser_url, str(dump)], check=True)


def test_restore_under_a_running_server_never_acknowledges_a_seq_twice(served, tmp_path):
    d = served
    dump = tmp_path / "before.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), "-d", d.superuser_url], check=True)
    acked = {}
    for i in range(3):
        r = d.submit(d.writer, body=f"acknowledged {i}")
        assert r.status_code == 201
        rc = r.json()["receipt"]
        acked[rc["seq"]] = rc["event_hash"]
    seqs = sorted(acked)
    assert seqs == [6, 7, 8]
    d.wait_published(d.tenant_id, 8)
    _restore(d, dump)  # the server keeps running

    w = d.submit(d.writer, body="onto the restored chain")
    assert w.status_code == 503, w.text
    assert w.json()["type"] == "urn:oml:problem:chain-fork"
    assert "the stored chain head is at seq 5, behind seq 8" in w.json()["detail"]
    for i in range(5):  # more attempts: still refused, nothing written
        again = d.submit(d.writer, body=f"retry {i}")
        assert again.status_code == 503 and again.json()["type"] == "urn:oml:problem:chain-fork"
        assert "receipt" not in again.json()
    with d.su() as c:
        assert c.execute("SELECT max(seq) FROM oml.journal WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0] == 5
    health = d.get("/v1/health").json()
    assert health["forked_tenants"] == 1 and health["writes"] == "refused for forked tenants"
    metrics = d.metrics()
    assert 'oml_chain_integrity_events_total{kind="fork-refused"} 1' in metrics
    assert "chain fork detected" in d.log_text()
    # Reads are still served; another tenant still writes.
    assert d.get("/v1/chain/head", d.writer).json()["seq"] == 5
    d.tenant("other")
    other = d.api_key("other", "writer", "olga")
    ow = d.submit(other, body="other tenant")
    assert ow.status_code == 201, ow.text
    # The published head was never overwritten ...
    doc = json.loads((d.home / "objects" / "oml-heads" / d.tenant_id).read_text())
    assert doc["head"]["seq"] == 8 and doc["head"]["event_hash"] == acked[8]
    # ... so after a restart the fork is still seen.
    d.stop_server()
    d.serve()
    w = d.submit(d.writer, body="after restart")
    assert w.status_code == 503 and w.json()["type"] == "urn:oml:problem:chain-fork"
    doctor = d.run("doctor", check=False)
    assert doctor.returncode == 3
    assert f"FORK tenant {d.tenant_id}: stored head seq 5 is behind the published head seq 8" in doctor.stdout
    verify = d.run("verify", check=False)
    assert verify.returncode == 3
    assert (f"FAIL tenant acme ({d.tenant_id}) seq 6: the chain ends at seq 5 but its published head is at seq 8: "
            "the database lost committed events") in verify.stdout


def test_idle_pooled_connections_to_a_restarted_database_are_not_handed_out(served, tmp_path):
    """After the restore, the very first write reaches the database (and is refused as a fork)
    rather than failing on a pooled connection whose server end is gone."""
    d = served
    for _ in range(4):  # warm several pooled connections
        assert d.get("/v1/chain/head", d.writer).status_code == 200
    dump = tmp_path / "same.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), "-d", d.superuser_url], check=True)
    _restore(d, dump)
    r = d.submit(d.writer, body="first write after the restore")
    assert r.status_code == 201, r.text
    assert r.json()["receipt"]["seq"] == 6


def test_verify_names_a_tenant_whose_rows_were_all_deleted(deployment):
    d = deployment
    gone = d.tenant("gone")
    d.api_key("gone", "writer", "ghost")
    d.tenant("stays")
    assert d.run("verify").returncode == 0
    with d.su() as c:
        c.execute("SET session_replication_role = replica")  # triggers off: guard and foreign keys
        for (table,) in c.execute("SELECT table_name FROM information_schema.columns WHERE table_schema = 'oml' "
                                  "AND column_name = 'tenant_id' AND table_name IN "
                                  "(SELECT tablename FROM pg_tables WHERE schemaname = 'oml')").fetchall():
            c.execute(f"DELETE FROM oml.{table} WHERE tenant_id = %s", (gone,))
    out = d.run("verify", check=False)
    assert out.returncode == 3, out.stdout
    assert (f"FAIL tenant gone ({gone}) seq 1: chain has no genesis event (no chain head), and its tenants row is "
            "missing: the tenant was deleted") in out.stdout
    assert out.stdout.count("FAIL tenant") == 1


def test_verify_catches_a_cut_tail_and_rows_above_the_head(served):
    d = served
    last = None
    for i in range(3):
        last = d.submit(d.writer, body=f"tail {i}").json()["receipt"]
    d.wait_published(d.tenant_id, last["seq"])
    d.stop_server()
    assert d.run("verify").returncode == 0
    with d.su() as c:
        c.execute("ALTER TABLE oml.journal DISABLE TRIGGER USER")
        c.execute("DELETE FROM oml.journal WHERE tenant_id = %s AND seq > %s", (d.tenant_id, last["seq"] - 2))
        c.execute("UPDATE oml.chain_heads h SET tree_size = NULL, tree_edge = NULL, seq = j.seq, event_hash = j.event_hash FROM oml.journal j "
                  "WHERE h.tenant_id = %s AND j.tenant_id = h.tenant_id AND j.seq = %s", (d.tenant_id, last["seq"] - 2))
        c.execute("ALTER TABLE oml.journal ENABLE TRIGGER USER")
    out = d.run("verify", check=False)
    assert out.returncode == 3
    assert (f"FAIL tenant acme ({d.tenant_id}) seq {last['seq'] - 1}: the chain ends at seq {last['seq'] - 2} but its "
            f"published head is at seq {last['seq']}: the database lost committed events") in out.stdout


def test_verify_reports_rows_above_the_chain_head(served):
    d = served
    last = d.submit(d.writer, body="x").json()["receipt"]
    d.stop_server()
    with d.su() as c:
        c.execute("UPDATE oml.chain_heads h SET tree_size = NULL, tree_edge = NULL, seq = j.seq, event_hash = j.event_hash FROM oml.journal j "
                  "WHERE h.tenant_id = %s AND j.tenant_id = h.tenant_id AND j.seq = %s", (d.tenant_id, last["seq"] - 1))
    # The published head (seq last) is ahead of chain_heads, but the rows are there: the first
    # finding is the row above the head.
    out = d.run("verify", check=False)
    assert out.returncode == 3
    assert (f"FAIL tenant acme ({d.tenant_id}) seq {last['seq']}: journal row at seq {last['seq']} is above the chain "
            f"head (seq {last['seq'] - 1})") in out.stdout


def _canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_a_retired_key_cannot_append_a_backdated_event(deployment):
    d = deployment
    quiet = d.tenant("quiet")  # its chain does not move after the rotation
    stolen = (d.home / "keys" / "signing.key").read_bytes()  # an attacker's copy, taken before
    with d.su() as c:
        last_time = json.loads(bytes(c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = 1",
                                               (quiet,)).fetchone()[0]))["time"]
    time.sleep(0.01)
    backdated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert backdated > last_time
    time.sleep(0.1)
    out = d.run("key", "rotate")
    assert "key.issued at provider seq" in out.stdout
    # The retired private key is not kept beside the server.
    keys_dir = d.home / "keys"
    assert not list(keys_dir.glob("*.retired"))
    for f in d.home.rglob("*"):
        if f.is_file() and f.stat().st_size < 1 << 20:
            assert stolen not in f.read_bytes(), f"retired private key still on disk at {f}"
    assert d.run("verify").returncode == 0

    old = serialization.load_pem_private_key(stolen, password=None)
    old_pub = old.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    with d.su() as c:
        old_id = c.execute("SELECT key_id FROM oml.signing_keys WHERE public_key = %s", (old_pub,)).fetchone()[0]
        seq, prev = c.execute("SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = %s", (quiet,)).fetchone()
        env = {"v": 1, "tenant": quiet, "seq": seq + 1, "prev": bytes(prev).hex(), "type": "claim.submitted",
               "time": backdated, "key_id": old_id, "principal": "mallory", "payload": {"note": "backdated"},
               "refs": {}}
        signed = _canonical(env)
        h = hashlib.sha256(signed).digest()
        c.execute("ALTER TABLE oml.journal DISABLE TRIGGER USER")
        c.execute("INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, signed_bytes, "
                  "signature) VALUES (%s, %s, %s, %s, 'claim.submitted', %s, %s, %s)",
                  (quiet, seq + 1, bytes(prev), h, old_id, signed, old.sign(signed)))
        c.execute("UPDATE oml.chain_heads SET tree_size = NULL, tree_edge = NULL, seq = %s, event_hash = %s WHERE tenant_id = %s", (seq + 1, h, quiet))
        c.execute("ALTER TABLE oml.journal ENABLE TRIGGER USER")
        rotation_seq = c.execute("SELECT max(seq) FROM oml.journal WHERE tenant_id = %s AND event_type = 'key.issued'",
                                 (PROVIDER,)).fetchone()[0]
    out = d.run("verify", check=False)
    assert out.returncode == 3
    assert (f"FAIL tenant quiet ({quiet}) seq {seq + 1}: signed by {old_id} after that key was retired: the rotation "
            f"at provider seq {rotation_seq} recorded this chain's head at seq {seq}") in out.stdout


def test_a_retired_key_cannot_raise_the_retired_heads_of_its_rotation(deployment):
    """Issue 17: the rotation is the provider chain's last event, so whoever kept the retired key
    and holds the database superuser signs its key.issued again with a higher retired head for a
    quiet chain, then an event there. The new key's binding, which the retired key cannot make,
    refuses the rotation at its provider seq."""
    d = deployment
    quiet = d.tenant("quiet")
    stolen = (d.home / "keys" / "signing.key").read_bytes()  # an attacker's copy, taken before
    assert "key.issued at provider seq" in d.run("key", "rotate").stdout
    assert d.run("verify").returncode == 0
    old = serialization.load_pem_private_key(stolen, password=None)
    with d.su() as c:
        rot_seq, signed = c.execute("SELECT seq, signed_bytes FROM oml.journal WHERE tenant_id = %s AND "
                                    "event_type = 'key.issued' ORDER BY seq DESC LIMIT 1", (PROVIDER,)).fetchone()
        assert c.execute("SELECT seq FROM oml.chain_heads WHERE tenant_id = %s", (PROVIDER,)).fetchone()[0] == rot_seq
        rot = json.loads(bytes(signed))
        head, prev = c.execute("SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = %s", (quiet,)).fetchone()
        assert rot["payload"]["retired_heads"][quiet] == head
        rot["payload"]["retired_heads"][quiet] = head + 1
        forged = _canonical(rot)
        forged_hash = hashlib.sha256(forged).digest()
        env = {"v": 1, "tenant": quiet, "seq": head + 1, "prev": bytes(prev).hex(), "type": "claim.submitted",
               "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
               "key_id": rot["key_id"], "principal": "mallory", "payload": {"note": "above the rotation"}, "refs": {}}
        planted = _canonical(env)
        planted_hash = hashlib.sha256(planted).digest()
        c.execute("ALTER TABLE oml.journal DISABLE TRIGGER USER")
        c.execute("UPDATE oml.journal SET signed_bytes = %s, event_hash = %s, signature = %s WHERE tenant_id = %s "
                  "AND seq = %s", (forged, forged_hash, old.sign(forged), PROVIDER, rot_seq))
        c.execute("UPDATE oml.chain_heads SET event_hash = %s WHERE tenant_id = %s", (forged_hash, PROVIDER))
        c.execute("INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, signed_bytes, "
                  "signature) VALUES (%s, %s, %s, %s, 'claim.submitted', %s, %s, %s)",
                  (quiet, head + 1, bytes(prev), planted_hash, rot["key_id"], planted, old.sign(planted)))
        c.execute("UPDATE oml.chain_heads SET tree_size = NULL, tree_edge = NULL, seq = %s, event_hash = %s WHERE tenant_id = %s",
                  (head + 1, planted_hash, quiet))
        c.execute("ALTER TABLE oml.journal ENABLE TRIGGER USER")
    out = d.run("verify", "--tenant", "quiet", check=False)
    assert out.returncode == 3, out.stdout
    assert (f"FAIL tenant provider ({PROVIDER}) seq {rot_seq}: key.issued binding does not verify under the key it "
            f"issues ({rot['payload']['key_id']}): its supersedes, retired_heads or place on the provider chain are "
            f"not what that key signed") in out.stdout, out.stdout
    assert "FAIL tenant quiet" not in out.stdout  # the retired key is still the last key verify can trust


def test_verify_of_one_tenant_still_reports_a_broken_provider_chain_and_root_key(deployment, tmp_path):
    d = deployment
    d.tenant("acme")
    d.tenant("other")
    assert d.run("verify", "--tenant", "acme").returncode == 0
    with d.su() as c:
        c.execute("ALTER TABLE oml.journal DISABLE TRIGGER USER")
        # Break the provider chain at the tenant.created of "other" (not acme's).
        seq = c.execute("SELECT seq FROM oml.journal WHERE tenant_id = %s AND event_type = 'tenant.created' "
                        "ORDER BY seq DESC LIMIT 1", (PROVIDER,)).fetchone()[0]
        c.execute("UPDATE oml.journal SET signature = decode(repeat('00', 64), 'hex') WHERE tenant_id = %s AND seq = %s",
                  (PROVIDER, seq))
        c.execute("ALTER TABLE oml.journal ENABLE TRIGGER USER")
    out = d.run("verify", "--tenant", "acme", check=False)
    assert out.returncode == 3
    assert f"FAIL tenant provider ({PROVIDER}) seq {seq}: signature does not verify under key" in out.stdout
    # A root key that is not the deployment's: reported too, from one tenant's verify.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    other = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                     serialization.PublicFormat.Raw)
    root = tmp_path / "root.pub"
    root.write_text(base64.b64encode(other).decode())
    out = d.run("verify", "--tenant", "acme", "--root-key", str(root), check=False)
    assert out.returncode == 3
    assert f"FAIL tenant provider ({PROVIDER}) seq 2: the first key.issued is not the deployment's root key" in out.stdout


def test_planted_head_documents_are_reported_then_repaired_at_startup(served):
    d = served
    r = d.submit(d.writer, body="x").json()["receipt"]
    d.wait_published(d.tenant_id, r["seq"])
    d.stop_server()
    head = d.home / "objects" / "oml-heads" / d.tenant_id
    good = json.loads(head.read_text())
    planted = {
        "deep": "[" * 5000 + "]" * 5000,
        "huge seq, bad signature": json.dumps({"head": dict(good["head"], seq=10 ** 30), "signature": good["signature"]}),
        "bad signature": json.dumps({"head": dict(good["head"], seq=r["seq"] + 1000), "signature": good["signature"]}),
    }
    for what, doc in planted.items():
        head.write_text(doc)
        doctor = d.run("doctor", check=False)
        assert doctor.returncode == 3, what
        assert f"INVALID HEAD tenant {d.tenant_id}: " in doctor.stdout, what
        d.serve()  # starts, repairs the document, accepts writes
        assert d.get("/v1/health").json()["forked_tenants"] == 0, what
        w = d.submit(d.writer, body=f"after {what}")
        assert w.status_code == 201, (what, w.text)
        d.wait_published(d.tenant_id, w.json()["receipt"]["seq"])
        assert "published head is invalid" in d.log_text()
        d.stop_server()
        # Repaired, but not forgotten: the replaced document is kept and reported until removed.
        kept = list((d.home / "objects" / "oml-heads-invalid" / d.tenant_id).iterdir())
        assert len(kept) == 1 and kept[0].read_text() == doc, what
        doctor = d.run("doctor", check=False)
        assert doctor.returncode == 3, what
        assert f"REPLACED HEAD oml-heads-invalid/{d.tenant_id}/{kept[0].name}" in doctor.stdout, what
        verify = d.run("verify", check=False)
        assert verify.returncode == 3, what
        assert f"FAIL tenant acme ({d.tenant_id}) seq 0: a published head that did not verify was replaced" in verify.stdout
        kept[0].unlink()
        assert d.run("doctor").returncode == 0, what
        assert d.run("verify").returncode == 0, what
