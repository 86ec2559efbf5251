"""`oml verify --from-lake`: the chains verified from bronze/events alone, PostgreSQL stopped.

The lake is filled here with the `deltalake` package from the outbox rows, converted as the lake
writer converts them (base64 -> binary, + outbox_seq), so this test does not depend on the writer."""
import base64
import datetime

from conftest import OML_BIN  # noqa: F401  (the binary under test)


def _bronze_rows(d):
    with d.su() as c:
        rows = c.execute("SELECT seq, row_data FROM oml.outbox WHERE target_table = 'bronze/events' "
                         "ORDER BY seq").fetchall()
    out = []
    for seq, data in rows:
        r = dict(data)
        r["signed_bytes"] = base64.b64decode(r["signed_bytes"])
        r["signature"] = base64.b64decode(r["signature"])
        r["occurred_at"] = datetime.datetime.strptime(r["occurred_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc)
        r["outbox_seq"] = seq
        out.append(r)
    return out


def _write_lake(root, rows):
    """oml init's empty bronze table at root (copied schema), then one append of rows."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    path = root / "bronze" / "events"
    schema = pa.schema(DeltaTable(str(path)).schema().to_arrow())
    table = pa.Table.from_pylist(rows, schema=schema)
    write_deltalake(str(path), table, mode="append")


def test_verify_from_lake_passes_then_names_the_tampered_seq_without_postgres(served):
    d = served
    for i in range(2):
        assert d.submit(d.writer, body=f"b{i}", path=f"notes/{i}.md").status_code == 201
    rows = _bronze_rows(d)
    n = len(rows)  # provider 3 (genesis, key.issued, tenant.created) + acme (genesis, 4 keys, 2 claims)
    assert n == 10
    _write_lake(d.home / "lake", rows)

    # A second lake, one byte of acme seq 7's signed bytes flipped.
    other = d.home / "lake-tampered"
    d.run("init", env={"OML_LAKE_ROOT": str(other)})
    tampered = [dict(r) for r in rows]
    i = next(k for k, r in enumerate(tampered) if r["tenant_id"] == d.tenant_id and r["seq"] == 7)
    b = bytearray(tampered[i]["signed_bytes"])
    b[10] ^= 1
    tampered[i]["signed_bytes"] = bytes(b)
    _write_lake(other, tampered)

    # Nothing from PostgreSQL: the server and the cluster are stopped.
    d.stop_server()
    d.run("cluster", "stop")
    ok = d.run("verify", "--from-lake", check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"lake: {d.home / 'lake'}/bronze/events version 1, {n} rows" in ok.stdout
    assert f"OK: 2 tenants, {n} events verified" in ok.stdout

    bad = d.run("verify", "--from-lake", env={"OML_LAKE_ROOT": str(other)}, check=False)
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert (f"FAIL tenant acme ({d.tenant_id}) seq 7: event_hash is not SHA-256 of the signed bytes"
            in bad.stdout), bad.stdout
    assert "FAILED: 2 tenants" in bad.stdout

    usage = d.run("verify", "--from-lake", "--folds", check=False)
    assert usage.returncode == 2

    missing = d.run("verify", "--from-lake", env={"OML_LAKE_ROOT": str(d.home / "no-lake")}, check=False)
    assert missing.returncode == 4
    assert "lake-table-missing" in missing.stderr or "no Delta table" in missing.stderr
