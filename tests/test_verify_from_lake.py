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


def test_a_lake_cut_short_of_a_published_head_is_named(served):
    """verify --from-lake compares each chain's last lake row with its published signed head
    (issue 20): a lake whose tail was cut (its newest rows deleted behind the writer's back) is a
    finding once the head is older than --lag-grace, naming the missing seqs."""
    from deltalake import DeltaTable
    from test_lakewriter import lakewriter
    d = served
    for i in range(3):
        assert d.submit(d.writer, body=f"c{i}").status_code == 201
    with d.su() as c:
        head = c.execute("SELECT seq FROM oml.chain_heads WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0]
    d.wait_published(d.tenant_id, head)
    lakewriter(d)
    ok = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    DeltaTable(str(d.home / "lake" / "bronze" / "events")).delete(f"tenant_id = '{d.tenant_id}' AND seq > {head - 2}")
    cut = d.run("verify", "--from-lake", "--lag-grace", "0", check=False)
    assert cut.returncode == 3, cut.stdout + cut.stderr
    line = [x for x in cut.stdout.splitlines() if x.startswith(f"FAIL tenant acme ({d.tenant_id})")]
    assert len(line) == 1, cut.stdout
    assert f"seq {head - 1}: the lake's chain ends at seq {head - 2} but its head was published at seq {head}" in line[0]
    assert f"the lake lacks seq {head - 1} to {head}" in line[0]
    # Within the grace it is lag, not a finding.
    lag = d.run("verify", "--from-lake", "--lag-grace", "3600", check=False)
    assert lag.returncode == 0, lag.stdout + lag.stderr
