"""oml init's lake table, read by readers that did not write it; migrations; tenants; keys."""
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from conftest import OML_BIN, dev_profile


def test_bronze_events_table_reads_back_with_deltalake_and_pyarrow(deployment):
    from deltalake import DeltaTable
    import pyarrow as pa
    path = deployment.home / "lake" / "bronze" / "events"
    t = DeltaTable(str(path))
    assert t.version() == 0
    schema = pa.schema(t.schema().to_arrow())  # arro3 -> pyarrow through the Arrow C interface
    want = [("tenant_id", pa.string(), False), ("seq", pa.int64(), False), ("prev_hash", pa.string(), False),
            ("event_hash", pa.string(), False), ("event_type", pa.string(), False), ("key_id", pa.string(), False),
            ("principal", pa.string(), True), ("occurred_at", pa.timestamp("us", tz="UTC"), False),
            ("artifact_id", pa.string(), True), ("version", pa.int64(), True), ("workarea_id", pa.string(), True),
            ("path", pa.string(), True), ("provenance", pa.string(), True), ("simulation_id", pa.string(), True),
            ("plaintext_sha256", pa.string(), True), ("ciphertext_sha256", pa.string(), True),
            ("signed_bytes", pa.binary(), False), ("signature", pa.binary(), False), ("outbox_seq", pa.int64(), False)]
    got = [(f.name, f.type, f.nullable) for f in schema]
    assert [g[0] for g in got] == [w[0] for w in want]
    for (n, ty, nl), (wn, wty, wnl) in zip(got, want):
        assert nl == wnl, n
        assert str(ty).replace("large_", "") == str(wty).replace("large_", ""), (n, ty, wty)
    assert t.to_pyarrow_table().num_rows == 0
    # The JSON log directly: one commit, with protocol, metaData naming the table.
    log = sorted((path / "_delta_log").glob("*.json"))
    assert [p.name for p in log] == ["00000000000000000000.json"]
    actions = [json.loads(line) for line in log[0].read_text().splitlines()]
    meta = next(a["metaData"] for a in actions if "metaData" in a)
    assert meta["name"] == "bronze.events"
    assert meta["partitionColumns"] == []
    # init is idempotent: the table is not recreated.
    deployment.run("init")
    assert DeltaTable(str(path)).version() == 0


def test_migrate_is_idempotent_and_refuses_newer_schema(deployment):
    d = deployment
    out = d.run("migrate", "--admin-url", d.superuser_url)
    assert "schema is up to date (version 31)" in out.stdout
    with d.su() as c:
        assert c.execute("SELECT version, name FROM oml.schema_migrations ORDER BY version").fetchall() == [
            (1, "0001_commit_point"), (2, "0002_api_key_events"), (3, "0003_chain_integrity"),
            (4, "0004_durability"), (5, "0005_idempotency_keys"), (6, "0006_kek_id"),
            (7, "0007_events_visibility"), (8, "0008_lakewriter"), (9, "0009_review"),
            (10, "0010_dead_letter"), (11, "0011_uploads"), (12, "0012_recall"), (13, "0013_attachments"),
            (14, "0014_lifecycle"), (15, "0015_body_objects"), (16, "0016_outbox_json"),
            (17, "0017_pinned_search_path"), (18, "0018_lake_table_txn"),
            (19, "0019_dead_letter_applied_tables"), (20, "0020_review_ranges"),
            (21, "0021_upload_metadata"), (22, "0022_key_residue"),
            (23, "0023_reconciler"), (24, "0024_reconcile_runs"),
            (25, "0025_outbox_prune"), (26, "0026_sync_standbys"), (27, "0027_upload_direct"),
            (28, "0028_search_queue"), (29, "0029_merkle_edge"), (30, "0030_tlog_tiles"),
            (31, "0031_tlog_witnessed")]
        # 0016: the outbox row is the text as written (json), not jsonb.
        assert c.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                         "WHERE attrelid = 'oml.outbox'::regclass AND attname = 'row_data'").fetchone()[0] == "json"
        c.execute("INSERT INTO oml.schema_migrations (version, name, sha256) VALUES (99, '0099_future', 'x')")
    m = d.run("migrate", "--admin-url", d.superuser_url, check=False)
    assert m.returncode == 4
    assert "database schema version 99 is newer than this binary's 31" in m.stderr
    s = d.run("serve", check=False, timeout=30)
    assert s.returncode == 4
    assert "schema-newer" in s.stderr


def test_migrate_takes_the_lakewriter_password_from_a_file_or_the_environment_and_writes_its_url(deployment, tmp_path):
    """oml_lakewriter (sql/0008) gets its password like oml_app: first line of a file, else the env."""
    import base64
    import hashlib
    import hmac
    import stat
    d = deployment

    def matches(password):
        with d.su() as c:
            v = c.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'oml_lakewriter'").fetchone()[0]
        if v is None:
            return None
        iter_salt, keys = v.split("$", 1)[1].split("$")
        iterations, salt = iter_salt.split(":")
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        return hashlib.sha256(client_key).digest() == base64.b64decode(keys.split(":")[0])

    assert matches("x") is None  # the local profile sets none (trust on the private socket)
    f = tmp_path / "lw-pw"
    f.write_text("lake-from-file\n")
    d.run("migrate", "--admin-url", d.superuser_url, "--lakewriter-password-file", str(f),
          env={"OML_LAKEWRITER_PASSWORD": "ignored"})
    assert matches("lake-from-file") is True
    d.run("migrate", "--admin-url", d.superuser_url, env={"OML_LAKEWRITER_PASSWORD": "lake-from-env"})
    assert matches("lake-from-env") is True
    empty = tmp_path / "empty"
    empty.write_text("")
    bad = d.run("migrate", "--admin-url", d.superuser_url, "--lakewriter-password-file", str(empty), check=False)
    assert bad.returncode == 2
    assert "the lakewriter password file" in bad.stderr and "is empty" in bad.stderr
    missing = d.run("migrate", "--admin-url", d.superuser_url, "--lakewriter-password-file", str(tmp_path / "nope"),
                    check=False)
    assert missing.returncode == 6
    assert matches("lake-from-env") is True
    # The local profile's URL of the role, 0600, beside app.url; it connects as oml_lakewriter
    # and reads the outbox (every tenant's) but not the journal.
    url_file = d.home / "pg" / "lakewriter.url"
    assert stat.S_IMODE(os.stat(url_file).st_mode) == 0o600
    url = url_file.read_text().strip()
    assert url.endswith("&user=oml_lakewriter")
    import psycopg
    with psycopg.connect(url, autocommit=True) as c:
        assert c.execute("SELECT current_user").fetchone()[0] == "oml_lakewriter"
        assert c.execute("SELECT count(*) FROM oml.outbox").fetchone()[0] >= 2  # provider genesis, key.issued
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT count(*) FROM oml.journal")


def test_signing_key_file_is_0600_and_tenant_names_unique(deployment):
    d = deployment
    assert oct((d.home / "keys" / "signing.key").stat().st_mode & 0o777) == "0o600"
    assert oct((d.home / "keys" / "kek.key").stat().st_mode & 0o777) == "0o600"
    assert oct((d.home / "keys" / "cursor.key").stat().st_mode & 0o777) == "0o600"
    d.tenant("acme")
    dup = d.run("tenant", "create", "acme", check=False)
    assert dup.returncode == 4
    assert "tenant 'acme' exists already" in dup.stderr
    bad = d.run("tenant", "create", "Bad Name", check=False)
    assert bad.returncode == 2
    role = d.run("key", "create", "--tenant", "acme", "--role", "owner", check=False)
    assert role.returncode == 2


def test_tenant_genesis_references_provider_event(deployment):
    d = deployment
    tid = d.tenant("acme")
    with d.su() as c:
        created = c.execute("SELECT seq, encode(event_hash, 'hex') FROM oml.journal WHERE tenant_id = "
                            "'00000000-0000-0000-0000-000000000000' AND event_type = 'tenant.created'").fetchone()
        genesis = json.loads(bytes(c.execute("SELECT signed_bytes FROM oml.journal WHERE tenant_id = %s AND seq = 1",
                                             (tid,)).fetchone()[0]))
        types = [r[0] for r in c.execute("SELECT event_type FROM oml.journal WHERE tenant_id = "
                                         "'00000000-0000-0000-0000-000000000000' ORDER BY seq").fetchall()]
    assert types == ["chain.genesis", "key.issued", "tenant.created"]
    assert genesis["type"] == "chain.genesis"
    assert genesis["refs"]["provider"] == {"tenant": "00000000-0000-0000-0000-000000000000",
                                           "seq": created[0], "event_hash": created[1]}
    assert d.run("verify").returncode == 0


def test_key_rotation_keeps_chain_verifiable(served, tmp_path):
    d = served
    old = d.submit(d.writer, body="old key").json()["receipt"]
    old_pub = tmp_path / "old.pub"
    old_pub.write_text((d.home / "keys" / "signing.key.pub").read_text())
    out = d.run("key", "rotate")
    assert "key.issued at provider seq 4" in out.stdout
    # The running server still holds the retired key: it stops signing at once.
    stale = d.submit(d.writer, body="stale key")
    assert stale.status_code == 503
    assert stale.json()["type"] == "urn:oml:problem:signing-key-not-in-force"
    d.stop_server()
    d.serve()
    new = d.submit(d.writer, body="new key").json()["receipt"]
    assert new["key_id"] != old["key_id"]
    assert d.run("verify").returncode == 0
    f = tmp_path / "r.json"
    f.write_text(json.dumps(old))
    assert d.run("verify-receipt", str(f), "--public-key", str(old_pub)).returncode == 0
    wrong = d.run("verify-receipt", str(f), check=False)  # default: the new public key
    assert wrong.returncode == 3


def test_dev_profile_starts_everything_and_ctrl_c_stops_postgres(tmp_path):
    with dev_profile("oml-dev") as dev:
        p, home, text = dev.p, dev.home, dev.banner
        assert "curl -sS -X POST" in text, text + p.stderr.read() if p.poll() is not None else text
        token = (home / "dev-writer.token").read_text().strip()
        r = requests.post(f"{dev.base}/v1/claims", headers={"Authorization": f"Bearer {token}"},
                          json={"body": "hello, oml", "workarea_id": "wa-1", "path": "notes/hello.md", "provenance": "human"})
        assert r.status_code == 201
        assert (home / "pg" / "superuser.url").exists()
        assert oct((home / "keys" / "signing.key").stat().st_mode & 0o777) == "0o600"
        assert oct((home / "dev-writer.token").stat().st_mode & 0o777) == "0o600"
        socket_dir = re.search(r"host=([^&]+)", (home / "pg" / "superuser.url").read_text()).group(1)
        assert os.path.isdir(socket_dir)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
        pid_file = home / "pg" / "data" / "postmaster.pid"
        assert not pid_file.exists()
        assert not os.path.exists(socket_dir)  # removed with the cluster, not left in /tmp


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the non-root case by switching from root to the postgres user")
def test_local_profile_works_for_a_non_root_user():
    """The same commands as an unprivileged user: the cluster then runs as that user itself."""
    import shutil
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="oml-nonroot-", dir="/tmp"))
    home = base / "home"

    def run(*args):
        return subprocess.run(["runuser", "-u", "postgres", "--", "env", f"OML_HOME={home}", "OML_LOG_LEVEL=warn",
                               str(base / "oml"), *args], capture_output=True, text=True, timeout=120)
    try:
        shutil.copy(OML_BIN, base / "oml")
        home.mkdir()
        subprocess.run(["chown", "-R", "postgres:postgres", str(base)], check=True)
        os.chmod(base, 0o755)
        start = run("cluster", "start")
        assert start.returncode == 0, start.stderr
        assert run("init").returncode == 0
        assert run("tenant", "create", "acme").returncode == 0
        v = run("verify")
        assert v.returncode == 0 and v.stdout.startswith("OK: 2 tenants"), v.stdout + v.stderr
        owner = subprocess.run(["stat", "-c", "%U", str(home / "pg" / "data")], capture_output=True, text=True).stdout.strip()
        assert owner == "postgres"
    finally:
        run("cluster", "stop")
        shutil.rmtree(base, ignore_errors=True)


def test_the_binary_allocates_with_jemalloc():
    """src/cli/CMakeLists.txt links jemalloc as the binary's malloc (docs/performance.md: glibc's
    malloc was a third of a reconcile). Loaded is not enough (its stats print whenever the library
    is loaded, even if libc's malloc won the symbol): the stats it prints at exit on request must
    count the allocations of parsing a document of 20,000 members."""
    doc = "{" + ",".join(f'"k{i:05d}":{i}' for i in range(20_000)) + "}\n"
    r = subprocess.run([OML_BIN, "canonicalize"], input=doc, capture_output=True, text=True,
                       env={**os.environ, "MALLOC_CONF": "stats_print:true"}, timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == doc.strip().encode().hex() + "\n"
    assert "___ Begin jemalloc statistics ___" in r.stderr
    m = re.search(r'^Version: "(\d+)\.(\d+)\.', r.stderr, re.M)
    assert m and (int(m[1]), int(m[2])) >= (5, 3), r.stderr[:300]
    # "total:" allocated nmalloc (#/sec) ndalloc (#/sec) nrequests ...: every malloc it served.
    total = re.search(r"^total:\s+(\d+)\s+(\d+)\s+\d+\s+(\d+)\s+\d+\s+(\d+)", r.stderr, re.M)
    assert total, r.stderr[:3000]
    assert int(total[4]) >= 20_000, total[0]  # a map node per member, at least
