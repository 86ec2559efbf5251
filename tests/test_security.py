"""Append-only journal, tamper detection, row-level security, bad input, API keys."""
import base64
import hashlib
import json
import re

import psycopg
import pytest


def test_append_only_for_app_role_and_owner(served):
    d = served
    d.submit(d.writer, body="x")
    with d.app() as c:
        for sql in ["UPDATE oml.journal SET event_type = 'x'", "DELETE FROM oml.journal", "TRUNCATE oml.journal"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                c.execute(sql)
            assert "permission denied for table journal" in str(e.value)
    with d.su() as c:
        c.execute("SET ROLE oml_owner")
        for sql, op in [("UPDATE oml.journal SET event_type = 'x'", "UPDATE"), ("DELETE FROM oml.journal", "DELETE"),
                        ("TRUNCATE oml.journal", "TRUNCATE")]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                c.execute(sql)
            assert f"journal is append-only: {op} refused" in str(e.value)
        c.execute("RESET ROLE")
        # the superuser too hits the guard trigger
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("DELETE FROM oml.journal")


def test_app_role_is_not_superuser_nor_bypassrls(deployment):
    with deployment.su() as c:
        row = c.execute("SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = 'oml_app'").fetchone()
        assert row == (False, False, True)
        owner = c.execute("SELECT tableowner FROM pg_tables WHERE schemaname = 'oml' AND tablename = 'journal'").fetchone()
        assert owner == ("oml_owner",)


def _tamper(d, sql, params=()):
    with d.su() as c:
        c.execute("ALTER TABLE oml.journal DISABLE TRIGGER USER")
        c.execute(sql, params)
        c.execute("ALTER TABLE oml.journal ENABLE TRIGGER USER")


@pytest.fixture
def chain(served):
    d = served
    for i in range(6):
        assert d.submit(d.writer, body=f"claim {i}").status_code == 201
    d.stop_server()
    assert d.run("verify").returncode == 0
    return d


def _expect_verify_fails(d, seq, what):
    v = d.run("verify", check=False)
    assert v.returncode == 3, v.stdout + v.stderr
    assert f"FAIL tenant acme ({d.tenant_id}) seq {seq}: {what}" in v.stdout, v.stdout


def test_tamper_flipped_byte_in_signed_bytes(chain):
    _tamper(chain, "UPDATE oml.journal SET signed_bytes = set_byte(signed_bytes, 40, get_byte(signed_bytes, 40) # 1) "
                   "WHERE tenant_id = %s AND seq = 4", (chain.tenant_id,))
    _expect_verify_fails(chain, 4, "event_hash is not SHA-256 of the signed bytes")


def test_tamper_deleted_middle_row(chain):
    _tamper(chain, "DELETE FROM oml.journal WHERE tenant_id = %s AND seq = 3", (chain.tenant_id,))
    _expect_verify_fails(chain, 3, "seq 3 is missing (next stored seq is 4)")


def test_tamper_resigned_with_foreign_key(chain):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    foreign = Ed25519PrivateKey.generate()
    with chain.su() as c:
        signed = c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = 5",
                           (chain.tenant_id,)).fetchone()[0]
    sig = foreign.sign(bytes(signed))
    _tamper(chain, "UPDATE oml.journal SET signature = %s WHERE tenant_id = %s AND seq = 5", (sig, chain.tenant_id))
    v = chain.run("verify", check=False)
    assert v.returncode == 3
    assert f"FAIL tenant acme ({chain.tenant_id}) seq 5: signature does not verify under key ed25519:" in v.stdout


def test_verify_requires_the_root_key(chain, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives import serialization
    other = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    f = tmp_path / "root.pub"
    f.write_text(json.dumps({"public_key": base64.b64encode(other).decode()}))
    v = chain.run("verify", "--root-key", str(f), check=False)
    assert v.returncode == 3
    assert "FAIL tenant provider (00000000-0000-0000-0000-000000000000) seq 2: the first key.issued is not the deployment's root key" in v.stdout
    assert chain.run("verify", "--root-key", str(chain.home / "keys" / "signing.key.root.pub")).returncode == 0


def test_verify_single_tenant_and_unknown_tenant(chain):
    assert chain.run("verify", "--tenant", "acme").returncode == 0
    v = chain.run("verify", "--tenant", "nope", check=False)
    assert v.returncode == 6


def test_rls_blocks_cross_tenant_reads_and_writes(served):
    d = served
    other = d.tenant("globex")
    other_writer = d.api_key("globex", "writer", "gary")
    theirs = d.submit(other_writer, body="globex secret").json()["artifact_id"]
    mine = d.submit(d.writer, body="acme note").json()["artifact_id"]
    # Through the API: another tenant's id is 404, not 403.
    r = d.get(f"/v1/claims/{theirs}", d.admin)
    assert r.status_code == 404
    assert r.json()["type"] == "urn:oml:problem:claim-not-found"
    assert d.post(f"/v1/claims/{theirs}/erase", d.admin).status_code == 404
    # At the database: a session scoped to acme sees none of globex's rows, even by id.
    with d.app() as c:
        with c.transaction():
            c.execute("SELECT set_config('oml.tenant_id', %s, true)", (d.tenant_id,))
            for t in ["journal", "artifacts", "artifact_bodies", "artifact_keys", "outbox", "chain_heads", "api_keys"]:
                n = c.execute(f"SELECT count(*) FROM oml.{t} WHERE tenant_id = %s", (other,)).fetchone()[0]
                assert n == 0, t
            assert c.execute("SELECT count(*) FROM oml.artifacts WHERE artifact_id = %s", (theirs,)).fetchone()[0] == 0
            assert c.execute("SELECT count(*) FROM oml.artifacts WHERE artifact_id = %s", (mine,)).fetchone()[0] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            with c.transaction():
                c.execute("SELECT set_config('oml.tenant_id', %s, true)", (d.tenant_id,))
                c.execute("INSERT INTO oml.artifact_keys (tenant_id, artifact_id, kek_id, wrapped_dek) "
                          "VALUES (%s, %s, 'k', '\\x00')", (other, theirs))
        assert "row-level security" in str(e.value)
        with c.transaction():
            c.execute("SELECT set_config('oml.tenant_id', %s, true)", (d.tenant_id,))
            cur = c.execute("UPDATE oml.artifacts SET state = 'erased' WHERE artifact_id = %s", (theirs,))
            assert cur.rowcount == 0  # invisible rows cannot be updated
    with d.su() as c:
        assert c.execute("SELECT state FROM oml.artifacts WHERE artifact_id = %s", (theirs,)).fetchone() == ("held",)
    # An unscoped session sees nothing at all.
    with d.app() as c:
        assert c.execute("SELECT count(*) FROM oml.journal").fetchone()[0] == 0


def _problem(r, status, slug):
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert r.json()["type"] == f"urn:oml:problem:{slug}", r.text
    assert r.json()["status"] == status


def test_bad_input_gets_exact_problem_and_writes_nothing(served):
    d = served
    art = d.submit(d.writer, body="ok").json()["artifact_id"]
    other = d.tenant("initech")
    other_art = d.submit(d.api_key("initech", "writer", "ivan"), body="theirs").json()["artifact_id"]
    before = d.counts()
    good = {"body": "b", "workarea_id": "w", "path": "p", "provenance": "human"}
    cases = [
        (lambda: d.post("/v1/claims", d.writer, data="{not json", headers={"Content-Type": "application/json"}), 400, "malformed-json"),
        (lambda: d.post("/v1/claims", d.writer, json=[1, 2]), 400, "malformed-json"),
        (lambda: d.post("/v1/claims", d.writer, json={**good, "color": "red"}), 400, "unknown-field"),
        (lambda: d.post("/v1/claims", d.writer, json={k: v for k, v in good.items() if k != "path"}), 400, "missing-field"),
        (lambda: d.post("/v1/claims", d.writer, json={**good, "body": 7}), 400, "invalid-field"),
        (lambda: d.post("/v1/claims", d.writer, json={**good, "provenance": "rumor"}), 400, "invalid-field"),
        (lambda: d.post("/v1/claims", d.writer, json={**good, "path": "a\u0000b"}), 400, "invalid-field"),
        (lambda: d.post("/v1/claims", d.writer, json={**good, "body": "x" * (1024 * 1024 + 1)}), 413, "body-too-large"),
        (lambda: d.post("/v1/claims", d.writer, data="x" * (7 * 1024 * 1024), headers={"Content-Type": "application/json"}), 413, "body-too-large"),
        (lambda: d.post("/v1/claims", None, json=good), 401, "unauthenticated"),
        (lambda: d.post("/v1/claims", "oml_notakey", json=good), 401, "unauthenticated"),
        (lambda: d.post("/v1/claims", d.reviewer, json=good), 403, "forbidden-role"),
        (lambda: d.post(f"/v1/claims/{art}/erase", d.reviewer), 403, "forbidden-role"),
        (lambda: d.post(f"/v1/claims/{art}/erase", d.writer2), 404, "claim-not-found"),
        (lambda: d.get(f"/v1/claims/{other_art}", d.writer), 404, "claim-not-found"),
        (lambda: d.get("/v1/claims/not-a-uuid", d.writer), 404, "claim-not-found"),
        (lambda: d.post(f"/v1/claims/{other_art}/erase", d.admin), 404, "claim-not-found"),
        (lambda: d.get("/v1/events?after=-1", d.writer), 400, "invalid-parameter"),
        (lambda: d.get("/v1/events?limit=5000", d.writer), 400, "invalid-parameter"),
        (lambda: d.get("/v1/events?after=abc", d.writer), 400, "invalid-parameter"),
        (lambda: d.get("/v1/nowhere", d.writer), 404, "no-route"),
    ]
    for call, status, slug in cases:
        _problem(call(), status, slug)
    assert d.counts() == before
    assert other  # tenant created before the snapshot


def test_api_keys_are_journalled_listed_and_revoked(served):
    d = served
    created = d.run("key", "create", "--tenant", "acme", "--role", "writer", "--principal", "carol")
    token = created.stdout.strip()
    key_id = re.search(r"key id (ak_[0-9a-f]{16}), principal carol \(api_key.created at seq (\d+)\)", created.stderr)
    assert key_id, created.stderr
    key_id, created_seq = key_id.group(1), int(key_id.group(2))
    assert created_seq == 6  # genesis, the fixture's four keys, this one
    keys = [json.loads(line) for line in d.run("key", "list", "--tenant", "acme").stdout.splitlines()]
    assert [(k["principal"], k["role"]) for k in keys] == [
        ("alice", "writer"), ("bob", "writer"), ("rita", "reviewer"), ("ada", "admin"), ("carol", "writer")]
    mine = keys[-1]
    assert mine["key_id"] == key_id and mine["created_seq"] == 6 and mine["revoked_at"] is None
    assert token not in json.dumps(keys)
    r = d.submit(token, body="while valid")  # seq 7; the server now caches the key
    assert r.status_code == 201
    artifact = r.json()["artifact_id"]

    r = d.run("key", "revoke", "--tenant", "acme", key_id, "--reason", "laptop lost")
    out = json.loads(r.stdout)
    assert out["key_id"] == key_id and out["revoked_seq"] == 8
    ev = json.loads(base64.b64decode(out["receipt"]["signed_bytes"]))
    assert ev["type"] == "api_key.revoked" and ev["principal"] == "operator"
    assert ev["payload"] == {"key_id": key_id, "principal": "carol", "role": "writer", "reason": "laptop lost"}
    # The server still has the key cached (10 s) and would serve a read with it ...
    assert d.get(f"/v1/claims/{artifact}", token).status_code == 200
    # ... but a write is refused at once by its own transaction, and that evicts the cached key.
    before = d.counts()
    r = d.submit(token, body="after revoke")
    assert r.status_code == 401 and r.json()["type"] == "urn:oml:problem:unauthenticated"
    assert r.json()["detail"] == f"API key {key_id} is revoked"
    assert d.counts() == before
    r = d.get(f"/v1/claims/{artifact}", token)
    assert r.status_code == 401 and r.json()["detail"] == "unknown or revoked API key"
    listed = [json.loads(line) for line in d.run("key", "list", "--tenant", "acme").stdout.splitlines()][-1]
    assert listed["revoked_seq"] == 8 and listed["revoked_at"] is not None
    types = [e["type"] for e in d.get("/v1/events?after=5&limit=10", d.admin).json()["events"]]
    assert types[:3] == ["api_key.created", "claim.submitted", "api_key.revoked"]
    assert d.run("verify").returncode == 0

    # Exact refusals, each writing nothing. Another tenant cannot revoke acme's live key.
    d.tenant("other")
    before = d.counts()
    again = d.run("key", "revoke", "--tenant", "acme", key_id, check=False)
    assert again.returncode == 4 and "api-key-revoked" in again.stderr and "seq 8" in again.stderr
    unknown = d.run("key", "revoke", "--tenant", "acme", "ak_0123456789abcdef", check=False)
    assert unknown.returncode == 6 and "api-key-not-found" in unknown.stderr
    malformed = d.run("key", "revoke", "--tenant", "acme", "carol", check=False)
    assert malformed.returncode == 2
    foreign = d.run("key", "revoke", "--tenant", "other", keys[0]["key_id"], check=False)
    assert foreign.returncode == 6 and "api-key-not-found" in foreign.stderr
    assert d.counts() == before
    assert d.submit(d.writer, body="alice still works").status_code == 201


def test_the_provider_tenant_gets_no_api_keys(served):
    """`oml key create` refuses the provider tenant (exit 7, nothing journalled); the database
    refuses such a row whoever inserts it; and a provider key made before the rule authenticates
    nobody."""
    d = served
    provider = "00000000-0000-0000-0000-000000000000"
    before = d.counts()
    for name in ("provider", provider):
        r = d.run("key", "create", "--tenant", name, "--role", "admin", check=False)
        assert r.returncode == 7, r.stdout + r.stderr
        assert r.stdout == ""
        assert "permission-denied(provider-tenant): the provider tenant cannot have API keys" in r.stderr, r.stderr
    assert d.counts() == before
    token_hash = bytes(range(32))
    insert = ("INSERT INTO oml.api_keys (key_hash, tenant_id, principal, role) VALUES (%s, %s, 'mallory', 'admin')")
    with d.app() as c:
        with c.transaction():
            c.execute("SELECT set_config('oml.tenant_id', %s, true)", (provider,))
            with pytest.raises(psycopg.errors.CheckViolation) as e:
                c.execute(insert, (token_hash, provider))
            assert e.value.diag.constraint_name == "api_keys_not_provider"
    with d.su() as c:  # the superuser too
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute(insert, (token_hash, provider))
        # A key left from before the rule (the trigger bypassed here) authenticates nobody.
        c.execute("ALTER TABLE oml.api_keys DISABLE TRIGGER api_keys_not_provider")
        c.execute(insert, (hashlib.sha256(b"oml_provider-legacy").digest(), provider))
        c.execute("ALTER TABLE oml.api_keys ENABLE TRIGGER api_keys_not_provider")
    r = d.get("/v1/chain/head", "oml_provider-legacy")
    assert r.status_code == 401 and r.json()["type"] == "urn:oml:problem:unauthenticated"
    # Other tenants are unaffected.
    assert d.api_key("acme", "writer", "zed").startswith("oml_")


def test_a_duplicate_tenant_is_named_as_such_not_by_the_database(deployment):
    d = deployment
    d.tenant("twice")
    before = d.counts()
    r = d.run("tenant", "create", "twice", check=False)
    assert r.returncode == 4, r.stderr
    assert "failed-precondition(tenant-exists): tenant 'twice' exists already" in r.stderr, r.stderr
    assert d.counts() == before
