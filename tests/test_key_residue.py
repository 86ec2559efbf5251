"""What a crypto-shred leaves in PostgreSQL, and `oml kek purge-residue` (issue 19,
"Crypto-shredding residue").

An erasure deletes the key rows and an ended upload sets its wrapped DEK to NULL; under MVCC the
old row versions keep the wrapped DEKs in the tables' files (VACUUM frees their space but does
not overwrite it). With the KEK such a DEK opens a copy of the object taken before. The test
finds each wrapped DEK in the files after the erasure (the residue is real), then runs the
command and finds none of them. WAL and backups are out of its reach (documented).
"""
from pathlib import Path

from test_attachments import upload
from test_uploads import delete, new_upload, row

KEY_TABLES = ("oml.artifact_keys", "oml.attachment_keys", "oml.upload_sessions")


def table_bytes(d, table):
    """Every byte of the table's heap and TOAST files (all segments), after a CHECKPOINT."""
    with d.su() as c:
        c.execute("CHECKPOINT")
        datadir = Path(c.execute("SHOW data_directory").fetchone()[0])
        rels = [table]
        toast = c.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = %s::regclass "
                          "AND reltoastrelid <> 0", (table,)).fetchone()
        if toast:
            rels.append(toast[0])
        out = b""
        for rel in rels:
            base = datadir / c.execute("SELECT pg_relation_filepath(%s)", (rel,)).fetchone()[0]
            for f in [base] + sorted(base.parent.glob(base.name + ".[0-9]*")):
                out += f.read_bytes()
        return out


def test_shredded_keys_stay_in_the_files_until_purge_residue_rewrites_them(served):
    d = served
    # Keys that will be shredded: a claim's DEK and its attachment's, and a cancelled upload's.
    att = upload(d, d.writer, b"an attachment whose key is shredded\n")
    art = d.submit(d.writer, attachments=[att]).json()["artifact_id"]
    cancelled = new_upload(d, d.writer, b"z" * 5000)
    with d.su() as c:
        claim_dek = c.execute("SELECT wrapped_dek FROM oml.artifact_keys WHERE artifact_id = %s", (art,)).fetchone()[0]
        att_dek = c.execute("SELECT wrapped_dek FROM oml.attachment_keys WHERE upload_id = %s", (att,)).fetchone()[0]
    upload_dek = row(d, cancelled)["wrapped_dek"]
    assert len(claim_dek) == len(att_dek) == len(upload_dek) == 60
    # A key that stays: a live upload's.
    kept = new_upload(d, d.writer, b"k" * 5000)
    kept_dek = row(d, kept)["wrapped_dek"]

    d.run("erase", "--tenant", "acme", art, "--reason", "residue test")
    assert delete(d, d.writer, cancelled).status_code == 204
    assert row(d, cancelled)["wrapped_dek"] is None
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.artifact_keys WHERE artifact_id = %s", (art,)).fetchone()[0] == 0
        assert c.execute("SELECT count(*) FROM oml.attachment_keys").fetchone()[0] == 0
        # 0022: autovacuum visits these tables after their first dead row.
        for t in KEY_TABLES:
            opts = c.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (t,)).fetchone()[0]
            assert {"autovacuum_vacuum_threshold=0", "autovacuum_vacuum_scale_factor=0"} <= set(opts), (t, opts)
    # The residue: each shredded key is still in its table's files.
    assert claim_dek in table_bytes(d, "oml.artifact_keys")
    assert att_dek in table_bytes(d, "oml.attachment_keys")
    assert upload_dek in table_bytes(d, "oml.upload_sessions")

    p = d.run("kek", "purge-residue", "--admin-url", d.superuser_url)
    lines = p.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:3]] == list(KEY_TABLES), p.stdout
    assert all(": rewritten, " in ln and ln.endswith(" bytes") for ln in lines[:3]), p.stdout
    assert lines[3] == "checkpoint done; WAL segments and backups older than now may still hold shredded keys"

    assert claim_dek not in table_bytes(d, "oml.artifact_keys")
    assert att_dek not in table_bytes(d, "oml.attachment_keys")
    assert upload_dek not in table_bytes(d, "oml.upload_sessions")
    # What is live stays, and the server goes on using it.
    assert kept_dek in table_bytes(d, "oml.upload_sessions")
    assert row(d, kept)["wrapped_dek"] == kept_dek
    from test_uploads import upload_all
    assert upload_all(d, d.writer, kept, b"k" * 5000) == 5000
    assert row(d, kept)["state"] == "complete"


def test_purge_residue_without_an_admin_url_outside_the_local_profile_is_a_usage_error(served, tmp_path):
    d = served
    p = d.run("kek", "purge-residue", check=False, env={"OML_HOME": str(tmp_path)})
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"give --admin-url (no local profile superuser.url under {tmp_path}/pg)" in p.stderr


def test_purge_residue_names_a_snapshot_that_kept_old_row_versions_and_exits_4(served):
    """A transaction whose snapshot is older than the purge keeps VACUUM FULL from dropping rows
    deleted after it: the command says who, and fails, instead of reporting a clean purge."""
    import psycopg
    d = served
    uid = new_upload(d, d.writer, b"q" * 4000)
    holder = psycopg.connect(d.superuser_url, application_name="old-report")
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1").fetchone()  # the snapshot is taken (and no lock on a key table)
        upload_dek = row(d, uid)["wrapped_dek"]
        assert delete(d, d.writer, uid).status_code == 204
        p = d.run("kek", "purge-residue", "--admin-url", d.superuser_url, check=False)
        assert p.returncode == 4, (p.returncode, p.stdout, p.stderr)
        assert "purge-incomplete" in p.stderr and "(old-report, idle in transaction)" in p.stderr, p.stderr
        assert upload_dek in table_bytes(d, "oml.upload_sessions")  # what the snapshot kept
    finally:
        holder.close()
    p = d.run("kek", "purge-residue", "--admin-url", d.superuser_url)
    assert upload_dek not in table_bytes(d, "oml.upload_sessions")
