"""`oml verify --folds`: the fold tables (artifacts, api_keys, tenants, signing_keys) recomputed from
the chains. Tampering as the superuser with a fold table leaves the chain intact (the chain pass
says OK) and must come back as exactly one FOLD line naming table, key, column and seq, exit 3."""
import hashlib
import json
import re

import pytest


def _fold_lines(out):
    return [l for l in out.splitlines() if l.startswith("FOLD ")]


def _verify_folds(d, *extra):
    return d.run("verify", "--folds", *extra, check=False)


@pytest.fixture
def folded(served):
    """acme: keys alice (seq 2), bob (3), rita (4), ada (5); claims by alice at seq 6 and 7, the
    second erased (seq 8); rita's key revoked (seq 9). The server is stopped."""
    d = served
    d.claims = []
    for i in range(2):
        r = d.submit(d.writer, body=f"claim {i}")
        assert r.status_code == 201, r.text
        d.claims.append(r.json()["artifact_id"])
    d.stop_server()
    erased = json.loads(d.run("erase", "--tenant", "acme", d.claims[1]).stdout)
    assert erased["erased_seq"] == 8
    d.keys = {k["principal"]: k for k in map(json.loads, d.run("key", "list", "--tenant", "acme").stdout.splitlines())}
    assert [d.keys[p]["created_seq"] for p in ("alice", "bob", "rita", "ada")] == [2, 3, 4, 5]
    revoked = json.loads(d.run("key", "revoke", "--tenant", "acme", d.keys["rita"]["key_id"]).stdout)
    assert revoked["revoked_seq"] == 9
    return d


def _expect_one(d, line):
    v = _verify_folds(d)
    assert v.returncode == 3, v.stdout + v.stderr
    assert _fold_lines(v.stdout) == [line], v.stdout
    assert "FOLDS FAILED: 1 differences; 2 tenants, " in v.stdout, v.stdout
    return v


def test_untouched_deployment_has_no_fold_findings(folded):
    d = folded
    v = _verify_folds(d)
    assert v.returncode == 0, v.stdout + v.stderr
    assert _fold_lines(v.stdout) == []
    with d.su() as c:
        events = c.execute("SELECT count(*) FROM oml.journal").fetchone()[0]
        rows = c.execute("SELECT (SELECT count(*) FROM oml.tenants) + (SELECT count(*) FROM oml.signing_keys) + "
                         "(SELECT count(*) FROM oml.api_keys) + (SELECT count(*) FROM oml.artifacts)").fetchone()[0]
    assert rows == 2 + 1 + 4 + 2
    m = re.search(r"^FOLDS OK: 0 differences; 2 tenants, (\d+) events replayed, (\d+) rows compared in [0-9.e-]+ s "
                  r"\((\d+) events/s\)$", v.stdout, re.M)
    assert m, v.stdout
    assert (int(m.group(1)), int(m.group(2))) == (events, rows)
    # The chain pass still reports first, with its own rate.
    assert re.search(r"^OK: 2 tenants, \d+ events verified in .* events/s\)$", v.stdout, re.M), v.stdout
    # Without --folds there is no folds pass.
    assert "FOLDS" not in d.run("verify").stdout
    # One tenant: only its rows (the provider's tables are left out).
    one = _verify_folds(d, "--tenant", "acme")
    assert one.returncode == 0, one.stdout + one.stderr
    assert re.search(r"^FOLDS OK: 0 differences; 2 tenants, \d+ events replayed, 6 rows compared", one.stdout, re.M), one.stdout


def test_hand_promoted_held_claim(folded):
    d = folded
    with d.su() as c:
        c.execute("UPDATE oml.artifacts SET state = 'promoted' WHERE artifact_id = %s", (d.claims[0],))
    v = _expect_one(d, f"FOLD artifacts tenant acme {d.claims[0]} v1: state expected held, found promoted (seq 6)")
    assert re.search(r"^OK: 2 tenants, ", v.stdout, re.M), v.stdout  # the chain itself is intact


def test_reowned_claim(folded):
    d = folded
    with d.su() as c:
        c.execute("UPDATE oml.artifacts SET principal = 'mallory' WHERE artifact_id = %s", (d.claims[0],))
    _expect_one(d, f"FOLD artifacts tenant acme {d.claims[0]} v1: principal expected alice, found mallory (seq 6)")


def test_deleted_api_key_row(folded):
    d = folded
    with d.su() as c:
        c.execute("DELETE FROM oml.api_keys WHERE principal = 'bob'")
    _expect_one(d, f"FOLD api_keys tenant acme {d.keys['bob']['key_id']}: missing row (seq 3)")


def test_planted_api_key_row(folded):
    d = folded
    with d.su() as c:
        c.execute("INSERT INTO oml.api_keys (key_hash, tenant_id, principal, role) VALUES (sha256('planted'), %s, "
                  "'mallory', 'admin')", (d.tenant_id,))
    key_id = "ak_" + hashlib.sha256(b"planted").hexdigest()[:16]
    _expect_one(d, f"FOLD api_keys tenant acme {key_id}: extra row (no event)")


def test_unrevoked_api_key(folded):
    d = folded
    with d.su() as c:
        c.execute("UPDATE oml.api_keys SET revoked_at = NULL, revoked_seq = NULL WHERE principal = 'rita'")
    v = _verify_folds(d)
    assert v.returncode == 3, v.stdout + v.stderr
    rita = d.keys["rita"]["key_id"]
    assert _fold_lines(v.stdout) == [f"FOLD api_keys tenant acme {rita}: revoked_at expected non-NULL, found NULL (seq 9)",
                                     f"FOLD api_keys tenant acme {rita}: revoked_seq expected 9, found NULL (seq 9)"], v.stdout


def test_unretired_signing_key_after_rotation(folded):
    d = folded
    old = json.loads(d.run("key", "public").stdout)["key_id"]
    out = d.run("key", "rotate").stdout
    seq = int(re.search(r"key\.issued at provider seq (\d+): ", out).group(1))
    assert _verify_folds(d).returncode == 0
    with d.su() as c:
        # The signing_keys guard trigger refuses to undo a retirement; replica mode skips triggers.
        c.execute("SET session_replication_role = replica")
        c.execute("UPDATE oml.signing_keys SET retired_at = NULL WHERE key_id = %s", (old,))
    _expect_one(d, f"FOLD signing_keys tenant provider {old}: retired_at expected non-NULL, found NULL (seq {seq})")


def test_deleted_tenant_row(folded):
    d = folded
    with d.su() as c:
        created_seq = c.execute("SELECT created_seq FROM oml.tenants WHERE name = 'acme'").fetchone()[0]
        # Every other table references tenants: skip the foreign-key triggers, as an attacker would.
        c.execute("SET session_replication_role = replica")
        c.execute("DELETE FROM oml.tenants WHERE name = 'acme'")
    v = _verify_folds(d)
    assert v.returncode == 3, v.stdout + v.stderr
    # acme's chain is still found (from tenant.created), and its own rows still agree.
    assert _fold_lines(v.stdout) == [f"FOLD tenants tenant acme {d.tenant_id}: missing row (seq {created_seq})"], v.stdout
    assert "FOLDS FAILED: 1 differences; 2 tenants, " in v.stdout, v.stdout


def test_review_acts_are_replayed_and_a_hand_edit_after_them_is_found(served):
    """claim.promoted / claim.rejected / claim.demoted are folds: after real review acts --folds
    finds nothing; a row changed by hand afterwards is named with the act's seq."""
    d = served
    ids = [d.submit(d.writer, body=f"reviewed {i}").json()["artifact_id"] for i in range(3)]  # seqs 6, 7, 8
    for art, v in ((ids[0], "accept"), (ids[1], "reject"), (ids[2], "accept")):
        r = d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": v})
        assert r.status_code == 200, r.text  # seqs 9, 10, 11
    r = d.post(f"/v1/claims/{ids[2]}/demote", d.reviewer, json={})
    assert r.status_code == 200 and r.json()["receipt"]["seq"] == 12, r.text
    d.stop_server()
    v = _verify_folds(d)
    assert v.returncode == 0, v.stdout + v.stderr
    assert _fold_lines(v.stdout) == []
    with d.su() as c:
        c.execute("UPDATE oml.artifacts SET state = 'promoted', demoted_seq = NULL WHERE artifact_id = %s", (ids[2],))
        c.execute("ALTER TABLE oml.artifacts DROP CONSTRAINT IF EXISTS artifacts_review_seqs")
        c.execute("UPDATE oml.artifacts SET promoted_seq = 10 WHERE artifact_id = %s", (ids[1],))
    v = _verify_folds(d)
    assert v.returncode == 3, v.stdout + v.stderr
    assert sorted(_fold_lines(v.stdout)) == sorted([
        f"FOLD artifacts tenant acme {ids[2]} v1: state expected demoted, found promoted (seq 12)",
        f"FOLD artifacts tenant acme {ids[2]} v1: demoted_seq expected 12, found NULL (seq 12)",
        f"FOLD artifacts tenant acme {ids[1]} v1: promoted_seq expected NULL, found 10 (seq 7)",
    ]), v.stdout
