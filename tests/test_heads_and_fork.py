"""Signed heads published outside the database, and the startup fork check."""
import base64
import json
import subprocess
import time

import pytest

from conftest import start_moto


def test_head_is_published_about_one_interval_after_commit(served):
    d = served
    r = d.submit(d.writer, body="h").json()["receipt"]
    t0 = time.time()
    doc = d.wait_published(d.tenant_id, r["seq"])
    assert time.time() - t0 < 1.0
    assert doc["head"]["event_hash"] == r["event_hash"]
    assert doc["head"]["tenant"] == d.tenant_id
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    pub = json.loads((d.home / "keys" / "signing.key.pub").read_text())
    canon = json.dumps(doc["head"], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    Ed25519PublicKey.from_public_bytes(base64.b64decode(pub["public_key"])).verify(base64.b64decode(doc["signature"]), canon)


def test_fork_after_restore_refuses_writes_serves_reads(served, tmp_path):
    d = served
    early = d.submit(d.writer, body="early").json()
    d.stop_server()
    dump = tmp_path / "oml.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), "-d", d.superuser_url], check=True)
    d.serve()
    late = d.submit(d.writer, body="late").json()["receipt"]
    d.wait_published(d.tenant_id, late["seq"])
    d.stop_server()
    # Restore the database to the point before "late": the published head is now ahead.
    with d.su() as c:
        pass
    admin = d.superuser_url.replace("/oml?", "/postgres?")
    import psycopg
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("DROP DATABASE oml")
        c.execute("CREATE DATABASE oml")
    subprocess.run(["pg_restore", "-d", d.superuser_url, str(dump)], check=True)
    d.serve()
    w = d.submit(d.writer, body="onto a fork")
    assert w.status_code == 503
    assert w.json()["type"] == "urn:oml:problem:chain-fork"
    assert f"stored head seq {late['seq'] - 1} is behind the published head seq {late['seq']}" in w.json()["detail"]
    r = d.get(f"/v1/claims/{early['artifact_id']}", d.writer)
    assert r.status_code == 200 and r.json()["body"] == "early"
    health = d.get("/v1/health").json()
    assert health["writes"] == "refused for forked tenants"
    assert health["forked_tenants"] == 1
    assert d.tenant_id not in json.dumps(health)  # unauthenticated: no tenant ids

    doc = d.run("doctor", check=False)
    assert doc.returncode == 3
    assert f"FORK tenant {d.tenant_id}: stored head seq {late['seq'] - 1} is behind the published head seq {late['seq']}" in doc.stdout
    # CLI writes check the chain they extend: acme is refused, the provider chain is fine.
    e = d.run("erase", "--tenant", "acme", early["artifact_id"], check=False)
    assert e.returncode == 5
    assert "chain-fork" in e.stderr
    d.tenant("other")


def test_fork_with_divergent_hash(served):
    d = served
    r = d.submit(d.writer, body="one").json()["receipt"]
    d.wait_published(d.tenant_id, r["seq"])
    # The published checkpoint covers it too (its head, from the stored hash, must not be what
    # closes the chain: the finding is).
    cp = d.home / "objects" / "oml-tlog" / d.tenant_id / "checkpoint"
    deadline = time.time() + 30
    while not cp.exists() or int(cp.read_text().split("\n")[1]) < r["seq"]:
        assert time.time() < deadline
        time.sleep(0.1)
    d.stop_server()
    with d.su() as c:
        c.execute("ALTER TABLE oml.journal DISABLE TRIGGER USER")
        c.execute("UPDATE oml.journal SET event_hash = sha256(event_hash) WHERE tenant_id = %s AND seq = %s",
                  (d.tenant_id, r["seq"]))
        c.execute("ALTER TABLE oml.journal ENABLE TRIGGER USER")
    d.serve()
    w = d.submit(d.writer, body="two")
    assert w.status_code == 503
    assert f"stored event at the published seq {r['seq']} has a different hash" in w.json()["detail"]


@pytest.fixture
def s3():
    """moto's S3 server on loopback (real HTTP, S3 protocol)."""
    import boto3
    p, url = start_moto()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true"}
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="oml-test")
    yield env, client
    p.terminate()
    p.wait()


def test_heads_over_s3(deployment, s3):
    env, client = s3
    d = deployment
    d.env.update(env)
    d.env["OML_OBJECT_STORE_URL"] = "s3://oml-test/deploy1"
    tenant = d.tenant("acme")
    tok = d.api_key("acme", "writer", "alice")
    d.serve()
    r = d.submit(tok, body="to s3").json()["receipt"]
    deadline = time.time() + 5
    doc = None
    while time.time() < deadline:
        try:
            doc = json.loads(client.get_object(Bucket="oml-test", Key=f"deploy1/oml-heads/{tenant}")["Body"].read())
            if doc["head"]["seq"] == r["seq"]:
                break
        except client.exceptions.NoSuchKey:
            pass
        time.sleep(0.05)
    assert doc and doc["head"]["seq"] == r["seq"] and doc["head"]["event_hash"] == r["event_hash"]
    d.stop_server()
    # The fork check reads the heads back through s3://: consistent now ...
    assert d.run("doctor").returncode == 0
    # ... and a head published ahead of the database is caught.
    with d.su() as c:
        c.execute("ALTER TABLE oml.journal DISABLE TRIGGER USER")
        c.execute("DELETE FROM oml.journal WHERE tenant_id = %s AND seq = %s", (tenant, r["seq"]))
        c.execute("UPDATE oml.chain_heads SET tree_size = NULL, tree_edge = NULL, seq = seq - 1 WHERE tenant_id = %s", (tenant,))
        c.execute("ALTER TABLE oml.journal ENABLE TRIGGER USER")
    doc = d.run("doctor", check=False)
    assert doc.returncode == 3
    assert f"FORK tenant {tenant}: stored head seq {r['seq'] - 1} is behind the published head seq {r['seq']}" in doc.stdout
