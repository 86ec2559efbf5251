"""`oml verify --folds`: the fold tables (artifacts, api_keys, tenants, signing_keys, attachments,
review_served, review_progress) recomputed from the chains. Tampering as the superuser with a fold
table leaves the chain intact (the chain pass says OK) and must come back as exactly one FOLD line
naming table, key, column and seq, exit 3."""
import hashlib
import json
import re

import pytest

from test_attachments import events, get_att, upload, verdict


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


# --- attachments, review_served, review_progress, artifacts.body_review -------------------------

FILES = {"p1": b"first file of the promoted claim\n", "p2": b"second file, read by two ranges\n",
         "e1": b"the erased claim's file\n", "h1": b"the held claim's file, read in part\n"}


def _signed(value):
    """A signed JSON member as the report prints it (nlohmann::json::dump(): keys sorted, compact)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@pytest.fixture
def attached(served):
    """acme (keys alice 2, bob 3, rita 4, ada 5) with three claims by alice, with the review gate
    on: P (seq 6; files 1 "p1.txt" and 2 unnamed, seqs 7 and 8), E (9; file 10), H (11; file 12).
    rita is served P's body (review.served 13), P's file 1 whole (14), P's file 2 by two ranges
    (review_progress, then review.served 15), E's file 1 whole (16) and one range of H's file 1
    (review_progress only); she accepts P (claim.promoted 17); E is erased by `oml erase` (18).
    The server is stopped."""
    d = served
    uploads = {k: upload(d, d.writer, v, filename=f"{k}.txt") if k == "p1" else upload(d, d.writer, v)
               for k, v in FILES.items()}
    d.claims = {}
    for name, files in (("P", ["p1", "p2"]), ("E", ["e1"]), ("H", ["h1"])):
        r = d.submit(d.writer, body=f"claim {name}", attachments=[uploads[f] for f in files])
        assert r.status_code == 201, r.text
        d.claims[name] = r.json()["artifact_id"]
    P, E, H = d.claims["P"], d.claims["E"], d.claims["H"]
    assert d.get(f"/v1/claims/{P}", d.reviewer).status_code == 200  # the body: item 0
    assert get_att(d, d.reviewer, P, 1).content == FILES["p1"]
    n = len(FILES["p2"])
    assert get_att(d, d.reviewer, P, 2, Range="bytes=0-9").content == FILES["p2"][:10]
    assert get_att(d, d.reviewer, P, 2, Range=f"bytes=10-{n - 1}").content == FILES["p2"][10:]
    assert get_att(d, d.reviewer, E, 1).content == FILES["e1"]
    assert get_att(d, d.reviewer, H, 1, Range="bytes=0-4").content == FILES["h1"][:5]
    r = verdict(d, d.reviewer, P, "accept")
    assert r.status_code == 200, r.text
    d.stop_server()
    assert json.loads(d.run("erase", "--tenant", "acme", E).stdout)["erased_seq"] == 18
    d.events = events(d)
    assert [(seq, t) for seq, t, _ in d.events if seq >= 6] == [
        (6, "claim.submitted"), (7, "submission.attach"), (8, "submission.attach"), (9, "claim.submitted"),
        (10, "submission.attach"), (11, "claim.submitted"), (12, "submission.attach"), (13, "review.served"),
        (14, "review.served"), (15, "review.served"), (16, "review.served"), (17, "claim.promoted"),
        (18, "artifact.erased")]
    with d.su() as c:
        assert c.execute("SELECT artifact_id::text, ordinal, location FROM oml.attachments ORDER BY attach_seq").fetchall() == [
            (P, 1, "bodies"), (P, 2, "bodies"), (E, 1, "none"), (H, 1, "quarantine")]
        assert c.execute("SELECT artifact_id::text, item, reviewer, served_seq FROM oml.review_served "
                         "ORDER BY served_seq").fetchall() == [(P, 0, "rita", 13), (P, 1, "rita", 14), (P, 2, "rita", 15),
                                                               (E, 1, "rita", 16)]
        assert sorted(c.execute("SELECT artifact_id::text, item, reviewer, served_upto FROM oml.review_progress").fetchall()) == \
            sorted([(P, 2, "rita", n), (H, 1, "rita", 5)])
    return d


def _expect(d, lines):
    v = _verify_folds(d)
    assert v.returncode == 3, v.stdout + v.stderr
    assert _fold_lines(v.stdout) == lines, v.stdout
    assert f"FOLDS FAILED: {len(lines)} differences; 2 tenants, " in v.stdout, v.stdout
    assert re.search(r"^OK: 2 tenants, ", v.stdout, re.M), v.stdout  # the chain itself is intact
    return v


def _payload(d, seq):
    return next(p for s, _, p in d.events if s == seq)


def test_untouched_deployment_with_attachments_served_items_and_a_promotion_has_no_fold_findings(attached):
    d = attached
    v = _verify_folds(d)
    assert v.returncode == 0, v.stdout + v.stderr
    assert _fold_lines(v.stdout) == []
    with d.su() as c:
        events_n = c.execute("SELECT count(*) FROM oml.journal").fetchone()[0]
        counts = c.execute("SELECT (SELECT count(*) FROM oml.tenants), (SELECT count(*) FROM oml.signing_keys), "
                           "(SELECT count(*) FROM oml.api_keys), (SELECT count(*) FROM oml.artifacts), "
                           "(SELECT count(*) FROM oml.attachments), (SELECT count(*) FROM oml.review_served), "
                           "(SELECT count(*) FROM oml.review_progress)").fetchone()
        body_reviews = c.execute("SELECT count(*) FROM oml.artifacts WHERE body_review IS NOT NULL").fetchone()[0]
    assert counts == (2, 1, 4, 3, 4, 4, 2)
    assert body_reviews == 3  # the gate's record of every body, compared with claim.submitted's `review`
    m = re.search(r"^FOLDS OK: 0 differences; 2 tenants, (\d+) events replayed, (\d+) rows compared in ", v.stdout, re.M)
    assert m, v.stdout
    assert (int(m.group(1)), int(m.group(2))) == (events_n, sum(counts))
    one = _verify_folds(d, "--tenant", "acme")
    assert one.returncode == 0, one.stdout + one.stderr
    assert re.search(r"^FOLDS OK: 0 differences; 2 tenants, \d+ events replayed, 17 rows compared", one.stdout, re.M), \
        one.stdout  # 4 keys, 3 claims, 4 attachments, 4 served rows, 2 progress rows


def test_attachment_locations_put_back(attached):
    """location is set by the attach (quarantine), the claim.promoted of its version (bodies) and
    artifact.erased (none); a hand-set location is named with the event that set the expected one."""
    d = attached
    P, E, H = d.claims["P"], d.claims["E"], d.claims["H"]
    for art, ordinal, bad, line in (
            (P, 1, "quarantine", f"FOLD attachments tenant acme {P} v1 attachment 1: location expected bodies, found quarantine (seq 17)"),
            (E, 1, "bodies", f"FOLD attachments tenant acme {E} v1 attachment 1: location expected none, found bodies (seq 18)"),
            (H, 1, "none", f"FOLD attachments tenant acme {H} v1 attachment 1: location expected quarantine, found none (seq 12)")):
        with d.su() as c:
            good = c.execute("SELECT location FROM oml.attachments WHERE artifact_id = %s AND ordinal = %s",
                             (art, ordinal)).fetchone()[0]
            c.execute("UPDATE oml.attachments SET location = %s WHERE artifact_id = %s AND ordinal = %s", (bad, art, ordinal))
        _expect(d, [line])
        with d.su() as c:
            c.execute("UPDATE oml.attachments SET location = %s WHERE artifact_id = %s AND ordinal = %s", (good, art, ordinal))
    assert _verify_folds(d).returncode == 0


def test_every_signed_attachment_column_changed(attached):
    d = attached
    P = d.claims["P"]
    signed = _payload(d, 7)
    assert (signed["ordinal"], signed["filename"], signed["flagged"]) == (1, "p1.txt", False)
    with d.su() as c:
        c.execute("UPDATE oml.attachments SET upload_id = '11111111-2222-4333-8444-555555555555', "
                  "plaintext_sha256 = sha256('a'), ciphertext_sha256 = sha256('b'), size_bytes = 1, ciphertext_size = 2, "
                  "media_type = 'image/png', filename = NULL, object_key = 'elsewhere', review = '{\"flags\": []}', "
                  "flagged = true, attach_seq = 8 WHERE artifact_id = %s AND ordinal = 1", (P,))
    key = f"FOLD attachments tenant acme {P} v1 attachment 1: "
    _expect(d, [  # one line per column, in column order
        key + "attach_seq expected 7, found 8 (seq 7)",
        key + f"ciphertext_sha256 expected {signed['ciphertext_sha256']}, found {hashlib.sha256(b'b').hexdigest()} (seq 7)",
        key + f"ciphertext_size expected {signed['ciphertext_size']}, found 2 (seq 7)",
        key + "filename expected p1.txt, found NULL (seq 7)",
        key + "flagged expected false, found true (seq 7)",
        key + f"media_type expected {signed['media_type']}, found image/png (seq 7)",
        key + f"object_key expected {d.tenant_id}/{signed['ciphertext_sha256']}, found elsewhere (seq 7)",
        key + f"plaintext_sha256 expected {hashlib.sha256(FILES['p1']).hexdigest()}, found {hashlib.sha256(b'a').hexdigest()} (seq 7)",
        key + f"review expected {_signed(signed['review'])}, found {{\"flags\":[]}} (seq 7)",
        key + f"size_bytes expected {len(FILES['p1'])}, found 1 (seq 7)",
        key + f"upload_id expected {signed['upload_id']}, found 11111111-2222-4333-8444-555555555555 (seq 7)",
    ])


def test_deleted_and_planted_attachment_rows(attached):
    d = attached
    H = d.claims["H"]
    with d.su() as c:
        c.execute("DELETE FROM oml.attachments WHERE artifact_id = %s AND ordinal = 1", (H,))
        c.execute("INSERT INTO oml.attachments (tenant_id, artifact_id, version, ordinal, upload_id, plaintext_sha256, "
                  "ciphertext_sha256, size_bytes, ciphertext_size, media_type, object_key, location, review, flagged, "
                  "attach_seq) VALUES (%s, %s, 1, 2, gen_random_uuid(), sha256('x'), sha256('y'), 1, 1, 'text/plain', "
                  "'k', 'quarantine', '{}', false, 12)", (d.tenant_id, H))
    _expect(d, [f"FOLD attachments tenant acme {H} v1 attachment 1: missing row (seq 12)",
                f"FOLD attachments tenant acme {H} v1 attachment 2: extra row (no event)"])


def test_review_served_rows_changed_deleted_and_planted(attached):
    """review_served: one row per (claim version, item, reviewer) a review.served names, served_seq
    the latest such event."""
    d = attached
    P, E, H = d.claims["P"], d.claims["E"], d.claims["H"]
    with d.su() as c:
        c.execute("UPDATE oml.review_served SET served_seq = 13 WHERE artifact_id = %s AND item = 1", (P,))
        c.execute("DELETE FROM oml.review_served WHERE artifact_id = %s", (E,))
        c.execute("INSERT INTO oml.review_served VALUES (%s, %s, 1, 1, 'rita', 12)", (d.tenant_id, H))
    _expect(d, sorted([
        f"FOLD review_served tenant acme {P} v1 item 1 reviewer rita: served_seq expected 14, found 13 (seq 14)",
        f"FOLD review_served tenant acme {E} v1 item 1 reviewer rita: missing row (seq 16)",
        f"FOLD review_served tenant acme {H} v1 item 1 reviewer rita: extra row (no event)",
    ]))


def test_review_progress_is_checked_only_for_naming_an_attachment(attached):
    """No event writes review_progress (a reviewer's Range reads do): its served_upto and covered
    are not compared, but a row whose item is no attachment of that claim version is extra."""
    d = attached
    P, H = d.claims["P"], d.claims["H"]
    with d.su() as c:
        c.execute("UPDATE oml.review_progress SET served_upto = 1, covered = '{[0,1)}' WHERE artifact_id = %s", (H,))
    v = _verify_folds(d)
    assert v.returncode == 0, v.stdout + v.stderr
    assert _fold_lines(v.stdout) == []
    with d.su() as c:
        c.execute("INSERT INTO oml.review_progress (tenant_id, artifact_id, version, item, reviewer, served_upto) "
                  "VALUES (%s, %s, 1, 3, 'rita', 0)", (d.tenant_id, P))
    _expect(d, [f"FOLD review_progress tenant acme {P} v1 item 3 reviewer rita: extra row (no event)"])


def test_hand_edited_body_review(attached):
    """artifacts.body_review is claim.submitted's `review` as signed."""
    d = attached
    P = d.claims["P"]
    signed = _payload(d, 6)["review"]
    assert (signed["review"], signed["flags"]) == ("text-extraction", [])
    with d.su() as c:
        c.execute("UPDATE oml.artifacts SET body_review = NULL WHERE artifact_id = %s", (P,))
    _expect(d, [f"FOLD artifacts tenant acme {P} v1: body_review expected {_signed(signed)}, found NULL (seq 6)"])
