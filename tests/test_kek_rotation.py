"""KEK rotation and secrets off the command line (issue 7 section 7).

`oml kek rotate --new-kek-file F` re-wraps every DEK under a new KEK in batches (one transaction
each), records the KEK id with every wrapped DEK (sql/0006_kek_id.sql), and journals kek.rotated on
the provider chain. Servers read DEKs under either KEK during the rotation (kek_file = new,
previous_kek_file = old). `oml migrate` takes the oml_app password from a file or the
environment, never argv.
"""
import base64
import hashlib
import hmac
import json

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PROVIDER = "00000000-0000-0000-0000-000000000000"


def kek_bytes(path):
    return bytes.fromhex(path.read_text().strip())


def kek_id(path):
    """The documented derivation: "file:" + 16 hex of SHA-256("oml-kek-id/v1" || 0x00 || KEK)."""
    return "file:" + hashlib.sha256(b"oml-kek-id/v1\x00" + kek_bytes(path)).hexdigest()[:16]


def key_rows(d):
    with d.su() as c:
        return c.execute("SELECT tenant_id::text, artifact_id::text, kek_id, wrapped_dek FROM oml.artifact_keys "
                         "ORDER BY artifact_id").fetchall()


def unwraps(kek, tenant, artifact, wrapped):
    """True iff `kek` opens the 60-byte wrap nonce(12) || AES-256-GCM(dek) || tag(16)."""
    try:
        AESGCM(kek).decrypt(bytes(wrapped[:12]), bytes(wrapped[12:]), f"oml-dek|{tenant}|{artifact}".encode())
        return True
    except InvalidTag:
        return False


def rotated_events(d):
    with d.su() as c:
        rows = c.execute("SELECT seq, signed_bytes FROM oml.journal WHERE tenant_id = %s AND event_type = 'kek.rotated' "
                         "ORDER BY seq", (PROVIDER,)).fetchall()
    return [(seq, json.loads(bytes(b))["payload"]) for seq, b in rows]


def test_rotation_resumes_keeps_every_claim_and_leaves_erased_ones_destroyed(deployment):
    d = deployment
    d.tenant_id = d.tenant("acme")
    writer = d.api_key("acme", "writer", "alice")
    admin = d.api_key("acme", "admin", "ada")
    old_file = d.home / "keys" / "kek.key"
    old_kek, old_id = kek_bytes(old_file), kek_id(old_file)
    d.serve()

    bodies = {}
    for i, body in enumerate(["short", "x" * 200_000, "é unicode ✓", "", "fourth claim body", "sixth"]):
        r = d.submit(writer, body=body, path=f"notes/{i}.md")
        assert r.status_code == 201, r.text
        bodies[r.json()["artifact_id"]] = body
    ids = list(bodies)
    erased = [ids[1], ids[4]]
    assert d.post(f"/v1/claims/{erased[0]}/erase", admin, json={"reason": "test"}).status_code == 200
    d.run("erase", "--tenant", "acme", erased[1], "--reason", "test")
    live = [a for a in ids if a not in erased]
    rows = key_rows(d)
    assert {r[1] for r in rows} == set(live)          # erasure deleted the erased DEKs
    assert {r[2] for r in rows} == {old_id}           # recorded under the documented id
    before = {r[1]: bytes(r[3]) for r in rows}
    d.stop_server()

    # A new KEK; servers wrap under it and still read DEKs under the old one.
    new_file = d.home / "keys" / "kek-2.key"
    gen = json.loads(d.run("kek", "generate", str(new_file)).stdout)
    new_id = kek_id(new_file)
    assert gen == {"file": str(new_file), "kek_id": new_id}
    assert oct(new_file.stat().st_mode & 0o777) == "0o600"
    assert new_id != old_id
    assert d.run("kek", "generate", str(new_file), check=False).returncode == 4  # never overwritten
    both = {"OML_KEK_FILE": str(new_file), "OML_PREVIOUS_KEK_FILE": str(old_file)}
    d.env.update(both)
    d.serve()
    r = d.submit(writer, body="written during the rotation", path="notes/new.md")
    assert r.status_code == 201
    bodies[r.json()["artifact_id"]] = "written during the rotation"
    live.append(r.json()["artifact_id"])
    assert {r[2] for r in key_rows(d) if r[1] == live[-1]} == {new_id}

    # Interrupted after the first batch (2 DEKs): each DEK is under exactly one KEK, and readable.
    cut = d.run("kek", "rotate", "--new-kek-file", str(new_file), "--batch-size", "2",
                env={"OML_FAULT": "kek.rotate.after_batch"}, check=False)
    assert cut.returncode == 1, cut.stderr
    assert "injected fault at kek.rotate.after_batch" in cut.stderr
    mid = key_rows(d)
    assert sorted(r[2] for r in mid) == sorted([old_id] * 2 + [new_id] * 3)
    for t, a, k, w in mid:
        assert unwraps(kek_bytes(new_file) if k == new_id else old_kek, t, a, bytes(w)), (a, k)
    assert rotated_events(d) == []
    for a in live:
        got = d.get(f"/v1/claims/{a}", writer)
        assert got.status_code == 200, got.text
        assert got.json()["body"] == bodies[a]

    # The re-run finishes: the 2 DEKs left, then kek.rotated.
    done = d.run("kek", "rotate", "--new-kek-file", str(new_file), "--batch-size", "2")
    out = json.loads(done.stdout)
    assert out["kek_id"] == new_id
    assert out["rewrapped"] == 2
    assert out["rewrapped_from"] == {old_id: 2}
    assert out["keys"] == 5
    assert out["batches"] == 1
    after = key_rows(d)
    assert len(after) == 5
    assert {r[2] for r in after} == {new_id}
    for t, a, k, w in after:
        assert not unwraps(old_kek, t, a, bytes(w)), f"the old KEK still opens the DEK of {a}"
        assert unwraps(kek_bytes(new_file), t, a, bytes(w))
        if a in before:
            assert bytes(w) != before[a]
    assert {r[1] for r in after} == set(live)  # erased DEKs were not brought back
    events = rotated_events(d)
    assert len(events) == 1
    seq, payload = events[0]
    assert seq == out["kek_rotated_seq"]
    assert payload == {"kek_id": new_id, "rewrapped_from": {old_id: 2}, "rewrapped": 2, "keys": 5}

    # Every claim reads back byte for byte; the erased ones stay gone.
    def check_reads():
        for a in live:
            got = d.get(f"/v1/claims/{a}", writer)
            assert got.status_code == 200, got.text
            assert got.json()["body"] == bodies[a]
        for a in erased:
            got = d.get(f"/v1/claims/{a}", admin)
            assert got.status_code == 410
            assert got.json()["type"] == "urn:oml:problem:erased"
    check_reads()

    # The old KEK is no longer needed: a server with the new one alone reads everything...
    d.stop_server()
    d.env.pop("OML_PREVIOUS_KEK_FILE")
    d.serve()
    check_reads()
    d.stop_server()
    # ...and one with the old one alone reads nothing (503 kek-unavailable, not a decryption).
    d.env["OML_KEK_FILE"] = str(old_file)
    d.serve()
    for a in live:
        got = d.get(f"/v1/claims/{a}", writer)
        assert got.status_code == 503, got.text
        assert got.json()["type"] == "urn:oml:problem:kek-unavailable"
    d.stop_server()
    d.env["OML_KEK_FILE"] = str(new_file)

    # A repeated rotation finds nothing to do and journals nothing.
    again = json.loads(d.run("kek", "rotate", "--new-kek-file", str(new_file)).stdout)
    assert again["rewrapped"] == 0 and again["keys"] == 5 and again["kek_rotated_seq"] is None
    assert len(rotated_events(d)) == 1

    v = d.run("verify", "--folds")
    assert "OK:" in v.stdout and "FOLDS OK" in v.stdout


def test_rotation_refuses_deks_under_a_kek_it_does_not_hold(deployment):
    d = deployment
    d.tenant("acme")
    writer = d.api_key("acme", "writer", "alice")
    d.serve()
    assert d.submit(writer, body="one").status_code == 201
    d.stop_server()
    new_file = d.home / "keys" / "kek-2.key"
    d.run("kek", "generate", str(new_file))
    # kek_file is the new KEK and the old one is given nowhere: nothing can be re-wrapped.
    r = d.run("kek", "rotate", "--new-kek-file", str(new_file), check=False, env={"OML_KEK_FILE": str(new_file)})
    assert r.returncode == 4, r.stderr
    assert "kek-unavailable" in r.stderr
    old_id = kek_id(d.home / "keys" / "kek.key")
    assert f"{old_id} (1)" in r.stderr
    assert {row[2] for row in key_rows(d)} == {old_id}
    assert rotated_events(d) == []
    # Given with --old-kek-file, it is.
    ok = d.run("kek", "rotate", "--new-kek-file", str(new_file), "--old-kek-file", str(d.home / "keys" / "kek.key"),
               env={"OML_KEK_FILE": str(new_file)})
    assert json.loads(ok.stdout)["rewrapped"] == 1
    assert {row[2] for row in key_rows(d)} == {kek_id(new_file)}


def scram_matches(verifier, password):
    """True iff a PostgreSQL SCRAM-SHA-256 verifier was made from `password`."""
    mech, rest = verifier.split("$", 1)
    assert mech == "SCRAM-SHA-256"
    iter_salt, keys = rest.split("$")
    iterations, salt = iter_salt.split(":")
    stored_key = base64.b64decode(keys.split(":")[0])
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest() == stored_key


def test_migrate_takes_the_app_password_from_a_file_or_the_environment_never_argv(deployment, tmp_path):
    d = deployment

    def verifier():
        with d.su() as c:
            return c.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'oml_app'").fetchone()[0]

    refused = d.run("migrate", "--admin-url", d.superuser_url, "--app-password", "s3cret", check=False)
    assert refused.returncode == 2
    assert "--app-password is no longer accepted" in refused.stderr
    assert "--app-password-file" in refused.stderr and "OML_APP_PASSWORD" in refused.stderr
    assert verifier() is None  # nothing was set

    f = tmp_path / "pw"
    f.write_text("from-the-file\n")
    d.run("migrate", "--admin-url", d.superuser_url, "--app-password-file", str(f))
    assert scram_matches(verifier(), "from-the-file")  # the first line, without its newline

    d.run("migrate", "--admin-url", d.superuser_url, env={"OML_APP_PASSWORD": "from-the-env"})
    assert scram_matches(verifier(), "from-the-env")

    # The file wins over the environment; an empty file is refused.
    d.run("migrate", "--admin-url", d.superuser_url, "--app-password-file", str(f), env={"OML_APP_PASSWORD": "x"})
    assert scram_matches(verifier(), "from-the-file")
    empty = tmp_path / "empty"
    empty.write_text("")
    bad = d.run("migrate", "--admin-url", d.superuser_url, "--app-password-file", str(empty), check=False)
    assert bad.returncode == 2
    assert "is empty" in bad.stderr
    missing = d.run("migrate", "--admin-url", d.superuser_url, "--app-password-file", str(tmp_path / "nope"),
                    check=False)
    assert missing.returncode == 6
    assert scram_matches(verifier(), "from-the-file")
