"""Each tenant's chain as a transparency log (issue 23), checked by implementations no one here
wrote: tests/tlogcheck (Go) opens oml's checkpoints with golang.org/x/mod/sumdb/note and
transparency-dev/formats' log.ParseCheckpoint, checks inclusion proofs (C2SP tlog-proof, parsed
by formats) and consistency proofs with x/mod/sumdb/tlog, and reads the published tiles through
x/mod's TileHashReader, which verifies every tile against the checkpoint's root. Each tampered
variant must be refused by those modules.

The Go tool is built from tests/tlogcheck (go.mod pins golang.org/x/mod v0.43.0 and
transparency-dev/formats v0.1.1) into $OML_CACHE/bin the first time; the modules come from the
Go module proxy into $OML_CACHE/gomod.
"""
import base64
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("OML_CACHE", Path.home() / ".cache" / "oml"))


@pytest.fixture(scope="session")
def tlogcheck():
    go = shutil.which("go")
    if go is None:
        pytest.skip("`go` is not on PATH: tests/tlogcheck (the cross-check with x/mod and formats) cannot be built")
    out = CACHE / "bin" / "tlogcheck"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOMODCACHE=str(CACHE / "gomod"), GOCACHE=str(CACHE / "go-build"), GOFLAGS="-buildvcs=false")
    r = subprocess.run([go, "build", "-o", str(out), "."], cwd=ROOT / "tests" / "tlogcheck", env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


def check(tool, job):
    r = subprocess.run([str(tool)], input=json.dumps(job), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def note_vkey(name, public_key):
    """The C2SP verifier key of an Ed25519 key under `name`, computed here (not by oml)."""
    typed = b"\x01" + public_key
    h = hashlib.sha256(name.encode() + b"\n" + typed).digest()[:4]
    return f"{name}+{h.hex()}+{base64.b64encode(typed).decode()}"


def deployment_key(d):
    pub = json.loads((d.home / "keys" / "signing.key.pub").read_text())
    return base64.b64decode(pub["public_key"])


def head(d):
    r = d.get("/v1/chain/head", d.admin)
    assert r.status_code == 200, r.text
    return r.json()["seq"]


def inclusion(d, token, seq, timeout=30):
    """GET /v1/proofs/inclusion, waiting out 409 not-checkpointed (the publisher runs each second)."""
    deadline = time.time() + timeout
    while True:
        r = d.get(f"/v1/proofs/inclusion?seq={seq}", token)
        if r.status_code != 409 or time.time() > deadline:
            return r
        assert r.json()["type"] == "urn:oml:problem:not-checkpointed", r.text
        assert r.headers["Retry-After"] == "1"
        time.sleep(0.2)


def events(d, token):
    r = d.get("/v1/events?limit=1000", token)
    assert r.status_code == 200, r.text
    return {e["seq"]: e for e in r.json()["events"]}


def checkpoint_of(proof_text):
    return proof_text.split("\n\n", 1)[1]


def body_of(note):
    return note.split("\n\n", 1)[0].split("\n")


def test_checkpoints_proofs_and_tiles_verify_with_x_mod_and_formats_and_tampering_is_refused(served, tlogcheck):
    d = served
    t = d.tenant_id
    origin = f"oml.local/{t}"
    vkey = note_vkey(origin, deployment_key(d))
    for i in range(5):
        r = d.submit(d.writer, body=f"first {i}", path=f"notes/{i}.md")
        assert r.status_code == 201
    receipt = d.home / "receipt.json"
    receipt.write_text(r.text)  # the last one's 201 response, receipt inside
    first_head = head(d)
    r = inclusion(d, d.admin, first_head)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "text/plain; charset=utf-8"
    old_checkpoint = checkpoint_of(r.text)
    lines = body_of(old_checkpoint)
    assert lines[0] == origin
    old_size = int(lines[1])
    assert old_size >= first_head
    # More events, past a tile boundary (256 leaves): a full tile, an entry bundle, a level-1 entry.
    for i in range(300):
        assert d.submit(d.writer, body=f"more {i}", path=f"notes/m{i}.md").status_code == 201
    last = head(d)
    r = inclusion(d, d.writer, last)
    assert r.status_code == 200, r.text
    new_checkpoint = checkpoint_of(r.text)
    new_size = int(body_of(new_checkpoint)[1])
    assert new_size == last  # nothing was written since
    ev = events(d, d.writer)  # the writer's own claim.submitted events
    mine = sorted(s for s, e in ev.items() if e["type"] == "claim.submitted")
    assert len(mine) == 305
    picks = [mine[0], mine[4], mine[200], mine[-1]]
    proofs = {}
    for s in picks:
        r = inclusion(d, d.writer, s)
        assert r.status_code == 200, r.text
        assert r.text.startswith(f"c2sp.org/tlog-proof@v1\nindex {s - 1}\n")
        proofs[s] = r.text
    c = d.get(f"/v1/proofs/consistency?from={old_size}&to={new_size}", d.writer)
    assert c.status_code == 200, c.text
    cons = c.json()
    assert (cons["from"], cons["to"]) == (old_size, new_size)
    tiles_dir = d.home / "objects" / "oml-tlog" / t
    deadline = time.time() + 30
    while int(body_of((tiles_dir / "checkpoint").read_text())[1]) < new_size:
        assert time.time() < deadline, "the published checkpoint did not reach the newest size"
        time.sleep(0.2)
    assert (tiles_dir / "tile" / "0" / "000").exists()  # the first full tile
    assert (tiles_dir / "tile" / "entries" / "000").exists()
    job = {"vkey": vkey, "origin": origin, "checkpoint": new_checkpoint,
           "inclusion": [{"proof": proofs[s], "entry": ev[s]["signed_bytes"]} for s in picks],
           "consistency": [{"old": old_checkpoint, "new": cons["checkpoint"], "hashes": cons["hashes"]}],
           "tiles_dir": str(tiles_dir)}
    ok = check(tlogcheck, job)
    assert ok == {"checkpoint": "ok", "inclusion": ["ok"] * 4, "consistency": ["ok"], "tiles": "ok", "cosigned": ""}, ok

    # Tampered variants, each refused by the modules.
    def flip_b64(line):
        raw = bytearray(base64.b64decode(line))
        raw[0] ^= 1
        return base64.b64encode(bytes(raw)).decode()
    p = proofs[picks[2]].split("\n")
    p[2] = flip_b64(p[2])  # the first sibling hash
    bad_sibling = "\n".join(p)
    p = proofs[picks[2]].split("\n")
    p[1] = f"index {picks[2]}"  # the next leaf's index
    bad_index = "\n".join(p)
    cp = new_checkpoint.split("\n")
    cp[1] = str(new_size - 1)  # another size under the same signature
    bad_size = "\n".join(cp)
    bad = check(tlogcheck, {
        "vkey": vkey, "origin": origin, "checkpoint": bad_size,
        "inclusion": [{"proof": bad_sibling, "entry": ev[picks[2]]["signed_bytes"]},
                      {"proof": bad_index, "entry": ev[picks[2]]["signed_bytes"]},
                      {"proof": proofs[picks[0]], "entry": ev[picks[1]]["signed_bytes"]},
                      {"proof": proofs[picks[0]].replace(new_checkpoint, bad_size), "entry": ev[picks[0]]["signed_bytes"]}],
        "consistency": [{"old": old_checkpoint, "new": cons["checkpoint"], "hashes": [flip_b64(cons["hashes"][0])] + cons["hashes"][1:]},
                        {"old": old_checkpoint, "new": cons["checkpoint"], "hashes": cons["hashes"][:-1]}],
    })
    assert bad["checkpoint"].startswith("note.Open: invalid signature for key " + origin), bad
    assert bad["inclusion"][:3] == ["invalid transparency proof"] * 3, bad
    assert bad["inclusion"][3].startswith("note.Open: invalid signature"), bad
    assert bad["consistency"] == ["invalid transparency proof"] * 2, bad
    # Another deployment's key (or origin) does not open the checkpoint.
    other = check(tlogcheck, {"vkey": note_vkey(origin, os.urandom(32)), "origin": origin, "checkpoint": new_checkpoint})
    assert other["checkpoint"] == "note.Open: note has no verifiable signatures", other
    # A changed tile: x/mod's TileHashReader refuses it against the checkpoint's root.
    tile = tiles_dir / "tile" / "0" / "000"
    data = bytearray(tile.read_bytes())
    data[33] ^= 1
    tile.write_bytes(bytes(data))
    bad_tiles = check(tlogcheck, {"vkey": vkey, "origin": origin, "tiles_dir": str(tiles_dir)})
    # (The root is folded from the level-1 tile; the changed level-0 tile is caught when its
    # leaf hashes are read and checked against the verified level above.)
    assert bad_tiles["tiles"] == "leaf hashes 0..: downloaded inconsistent tile", bad_tiles


def test_proof_requests_get_precise_errors(served):
    d = served
    assert d.submit(d.writer, body="mine").status_code == 201
    assert d.submit(d.writer2, body="bob's").status_code == 201
    n = head(d)
    assert inclusion(d, d.admin, n).status_code == 200  # checkpointed
    ev = events(d, d.admin)
    bobs = max(s for s, e in ev.items() if e["type"] == "claim.submitted")
    cases = [
        ("/v1/proofs/inclusion", d.writer, 400, "invalid-parameter", "query parameter 'seq' is required"),
        ("/v1/proofs/inclusion?seq=0", d.writer, 400, "invalid-parameter", "query parameter 'seq' must be an integer in [1, 9223372036854775807]"),
        ("/v1/proofs/inclusion?seq=x", d.writer, 400, "invalid-parameter", "query parameter 'seq' must be an integer in [1, 9223372036854775807]"),
        (f"/v1/proofs/inclusion?seq={n + 1}", d.admin, 404, "not-found", f"no event at seq {n + 1} that this key may read"),
        # Bob's claim is held: Alice may not read its event, so she gets no proof of it either.
        (f"/v1/proofs/inclusion?seq={bobs}", d.writer, 404, "not-found", f"no event at seq {bobs} that this key may read"),
        ("/v1/proofs/inclusion?seq=1", d.writer, 404, "not-found", "no event at seq 1 that this key may read"),
        ("/v1/proofs/consistency", d.writer, 400, "invalid-parameter", "query parameter 'from' is required"),
        (f"/v1/proofs/consistency?from=3&to=2", d.writer, 400, "invalid-parameter", "'from' (3) is past 'to' (2)"),
        (f"/v1/proofs/consistency?from=1&to={n + 5}", d.writer, 409, "not-checkpointed",
         f"size {n + 5} is past the newest checkpoint (size {n})"),
        (f"/v1/proofs/consistency?from={n + 1}", d.writer, 409, "not-checkpointed",
         f"size {n + 1} is past the newest checkpoint (size {n})"),
    ]
    for path, token, status, ptype, detail in cases:
        r = d.get(path, token)
        assert r.status_code == status, (path, r.status_code, r.text)
        assert r.json()["type"] == f"urn:oml:problem:{ptype}", (path, r.text)
        assert r.json()["detail"] == detail, (path, r.text)
    assert d.get(f"/v1/proofs/inclusion?seq={bobs}", d.writer2).status_code == 200  # Bob's own
    assert d.get("/v1/proofs/inclusion?seq=1").status_code == 401


def test_verify_receipt_checks_the_inclusion_proof_offline(served):
    d = served
    r = d.submit(d.writer, body="a receipt to prove")
    assert r.status_code == 201, r.text
    seq = r.json()["receipt"]["seq"]
    (d.home / "receipt.json").write_text(r.text)
    p = inclusion(d, d.writer, seq)
    assert p.status_code == 200, p.text
    proof = d.home / "proof.txt"
    proof.write_text(p.text)
    size = int(body_of(checkpoint_of(p.text))[1])
    ok = d.run("verify-receipt", str(d.home / "receipt.json"), "--proof", str(proof), check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    root = base64.b64decode(body_of(checkpoint_of(p.text))[2]).hex()
    assert ok.stdout.splitlines()[-1] == (f"inclusion OK: seq {seq} is leaf {seq - 1} of the checkpoint "
                                          f"oml.local/{d.tenant_id} size {size} root {root}")
    # Each tampered proof: exit 3 and the reason.
    lines = p.text.split("\n")
    flipped = bytearray(base64.b64decode(lines[2]))
    flipped[0] ^= 1
    variants = {
        "sibling": ("\n".join(lines[:2] + [base64.b64encode(bytes(flipped)).decode()] + lines[3:]),
                    f"proof INVALID: the inclusion proof of leaf {seq - 1} leads to root "),
        "index": ("\n".join([lines[0], f"index {seq}"] + lines[2:]),
                  f"proof INVALID: the proof is for leaf {seq}, not {seq - 1}"),
        "size": (p.text.replace(f"\n{size}\n", f"\n{size + 1}\n", 1),
                 f"proof INVALID: invalid signature for key oml.local/{d.tenant_id}+"),
        "truncated": (p.text[:-1], "proof INVALID: malformed note: "),
    }
    for name, (text, want) in variants.items():
        proof.write_text(text)
        bad = d.run("verify-receipt", str(d.home / "receipt.json"), "--proof", str(proof), check=False)
        assert bad.returncode == 3, (name, bad.stdout, bad.stderr)
        assert bad.stdout.splitlines()[-1].startswith(want), (name, bad.stdout)
    # Another origin: the note key differs, the checkpoint does not open.
    proof.write_text(p.text)
    other = d.run("verify-receipt", str(d.home / "receipt.json"), "--proof", str(proof), "--origin", "elsewhere.example",
                  check=False)
    assert other.returncode == 3
    assert other.stdout.splitlines()[-1] == "proof INVALID: note has no verifiable signatures", other.stdout


def sign_checkpoint(d, origin, size, root):
    """A checkpoint note signed here with the deployment's key (Python's `cryptography`)."""
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_private_key((d.home / "keys" / "signing.key").read_bytes(), None)
    text = f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"
    typed = b"\x01" + deployment_key(d)
    h = hashlib.sha256(origin.encode() + b"\n" + typed).digest()[:4]
    sig = base64.b64encode(h + key.sign(text.encode())).decode()
    return f"{text}\n\u2014 {origin} {sig}\n"


def test_verify_checks_the_published_checkpoint_and_every_one_it_saw_before(served):
    d = served
    t = d.tenant_id
    origin = f"oml.local/{t}"
    for i in range(3):
        assert d.submit(d.writer, body=f"c {i}", path=f"notes/{i}.md").status_code == 201
    n = head(d)
    assert inclusion(d, d.admin, n).status_code == 200
    published = d.home / "objects" / "oml-tlog" / t / "checkpoint"
    deadline = time.time() + 30
    while int(body_of(published.read_text())[1]) < n:
        assert time.time() < deadline
        time.sleep(0.2)
    earlier = published.read_text()
    n_earlier = n
    root_pub = base64.b64decode(json.loads((d.home / "keys" / "signing.key.root.pub").read_text())["public_key"])
    seen = d.home / "verify" / "checkpoints" / hashlib.sha256(root_pub).hexdigest()[:16] / t
    r = d.run("verify", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert seen.read_text() == earlier  # recorded for the next run
    for i in range(2):
        assert d.submit(d.writer, body=f"d {i}", path=f"notes/d{i}.md").status_code == 201
    n = head(d)
    assert inclusion(d, d.admin, n).status_code == 200
    deadline = time.time() + 30
    while int(body_of(published.read_text())[1]) < n:
        assert time.time() < deadline
        time.sleep(0.2)
    d.stop_server()  # nothing publishes over what the test writes
    good = published.read_text()
    root = base64.b64decode(body_of(good)[2])
    r = d.run("verify", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert seen.read_text() == good  # the newer one
    # A rolled-back object store: the published checkpoint behind the one seen before.
    published.write_text(earlier)
    r = d.run("verify", check=False)
    assert r.returncode == 3
    fails = [l for l in r.stdout.splitlines() if l.startswith("FAIL tenant")]
    assert fails == [f"FAIL tenant acme ({t}) seq 0: the published checkpoint (size {n_earlier}) is behind the one an "
                     f"earlier `oml verify` saw (size {n}): the published log was rolled back"], r.stdout
    assert seen.read_text() == good  # never moved back
    published.write_text(good)
    # A checkpoint signed here, byte-compatible with oml's: the same note verifies.
    assert sign_checkpoint(d, origin, n, root) == good
    flipped = bytes([root[0] ^ 1]) + root[1:]
    other = t[:-1] + ("1" if t[-1] != "1" else "2")  # another tenant's id

    cases = [
        (sign_checkpoint(d, origin, n, flipped),
         f"seq {n}: the published checkpoint at size {n} is not the chain's tree at that size "
         "(the chain diverged from what was signed)"),
        (sign_checkpoint(d, origin, n + 10, root),
         f"seq {n + 1}: the published checkpoint covers {n + 10} events but the chain ends at seq {n}: "
         "the database lost committed events"),
        (sign_checkpoint(d, f"oml.local/{other}", n, root),
         f"seq 0: the published checkpoint's origin oml.local/{other} is not this chain's (<tlog_origin>/{t})"),
        (good.replace(f"\n{n}\n", f"\n{n - 1}\n"),
         f"seq 0: the published checkpoint does not verify: invalid signature for key {origin}+"),
    ]
    for doc, what in cases:
        published.write_text(doc)
        r = d.run("verify", check=False)
        assert r.returncode == 3, r.stdout + r.stderr
        fails = [l for l in r.stdout.splitlines() if l.startswith("FAIL tenant")]
        assert len(fails) == 1 and fails[0].startswith(f"FAIL tenant acme ({t}) {what}"), (what, r.stdout)
    assert seen.read_text() == good  # a failing run records nothing
    # What an earlier run saw must still be the chain's tree: a seen checkpoint with another
    # root at a smaller size names the pair it forms with the published one.
    published.write_text(good)
    seen.write_text(sign_checkpoint(d, origin, n - 1, flipped))
    r = d.run("verify", check=False)
    assert r.returncode == 3
    fails = [l for l in r.stdout.splitlines() if l.startswith("FAIL tenant")]
    assert fails == [f"FAIL tenant acme ({t}) seq {n - 1}: the seen checkpoint at size {n - 1} is not the chain's tree "
                     f"at that size (the chain diverged from what was signed) (the first inconsistent pair: the "
                     f"checkpoint an earlier `oml verify` saw, size {n - 1}, and the published one, size {n})"], r.stdout
    seen.write_text(good)
    assert d.run("verify", check=False).returncode == 0


def test_oml_witness_cosigns_only_consistent_checkpoints_and_x_mod_verifies_its_cosignatures(served, tlogcheck):
    import requests
    from conftest import OML_BIN, free_port
    d = served
    t = d.tenant_id
    origin = f"oml.local/{t}"
    vkey = note_vkey(origin, deployment_key(d))
    published = d.home / "objects" / "oml-tlog" / t / "checkpoint"

    def newest():
        n = head(d)
        assert inclusion(d, d.admin, n).status_code == 200
        deadline = time.time() + 30
        while not published.exists() or int(body_of(published.read_text())[1]) < n:
            assert time.time() < deadline
            time.sleep(0.2)
        return published.read_text()

    port = free_port()
    argv = [OML_BIN, "witness", "--listen", f"127.0.0.1:{port}", "--key", str(d.home / "witness.key"),
            "--name", "witness.test/w1", "--log", vkey, "--state", str(d.home / "witness-state")]

    def start():
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(d.home / "witness.log", "ab"), text=True, env=d.env)
        return p, p.stdout.readline().strip()
    witness, wkey = start()
    try:
        assert wkey.startswith("witness.test/w1+") and base64.b64decode(wkey.split("+", 2)[2])[0] == 4  # (the key's base64 may hold a '+')
        url = f"http://127.0.0.1:{port}/add-checkpoint"
        assert d.submit(d.writer, body="w1").status_code == 201
        cp1 = newest()
        n1 = int(body_of(cp1)[1])
        r = requests.post(url, data=("old 0\n\n" + cp1).encode(), timeout=10)
        assert r.status_code == 200, r.text
        assert r.text.startswith("\u2014 witness.test/w1 ") and r.text.endswith("\n")
        ok = check(tlogcheck, {"vkey": vkey, "origin": origin, "cosigned": cp1 + r.text, "cosigner_vkeys": [wkey]})
        assert ok["cosigned"] == "ok", ok
        # Tampered cosignature: refused by formats' cosignature/v1 verifier.
        sig = r.text.rsplit(" ", 1)[1].strip()
        raw = bytearray(base64.b64decode(sig))
        raw[20] ^= 1
        bad = check(tlogcheck, {"vkey": vkey, "origin": origin, "cosigned": cp1 + r.text.replace(sig, base64.b64encode(bytes(raw)).decode()),
                                "cosigner_vkeys": [wkey]})
        assert bad["cosigned"] == "invalid signature for key " + "+".join(wkey.split("+", 2)[:2]), bad
        # More events: old 0 again is a conflict naming the size it cosigned.
        for i in range(3):
            assert d.submit(d.writer, body=f"w2 {i}", path=f"notes/w{i}.md").status_code == 201
        cp2 = newest()
        n2 = int(body_of(cp2)[1])
        r = requests.post(url, data=("old 0\n\n" + cp2).encode(), timeout=10)
        assert (r.status_code, r.text, r.headers["Content-Type"]) == (409, f"{n1}\n", "text/x.tlog.size")
        # With the log's consistency proof from n1: cosigned.
        c = d.get(f"/v1/proofs/consistency?from={n1}&to={n2}", d.writer).json()
        assert c["checkpoint"] == cp2
        body = f"old {n1}\n" + "".join(h + "\n" for h in c["hashes"]) + "\n" + cp2
        r = requests.post(url, data=body.encode(), timeout=10)
        assert r.status_code == 200, r.text
        # A restored database's history, signed by the log's own key: a checkpoint of the same size
        # with another root, or a shorter one, is refused by the witness.
        root = base64.b64decode(body_of(cp2)[2])
        forked = sign_checkpoint(d, origin, n2, bytes([root[0] ^ 1]) + root[1:])
        r = requests.post(url, data=(f"old {n2}\n\n" + forked).encode(), timeout=10)
        assert (r.status_code, r.text) == (409, f"{n2}\n")
        shorter = sign_checkpoint(d, origin, n1, base64.b64decode(body_of(cp1)[2]))
        r = requests.post(url, data=(f"old {n1}\n\n" + shorter).encode(), timeout=10)
        assert (r.status_code, r.text) == (409, f"{n2}\n")
        r = requests.post(url, data=(f"old {n2}\n\n" + shorter).encode(), timeout=10)
        assert r.status_code == 400
        # Another log, another key, a body that is not the protocol's.
        r = requests.post(url, data=("old 0\n\n" + sign_checkpoint(d, f"elsewhere/{t}", n2, root)).encode(), timeout=10)
        assert (r.status_code, r.text) == (404, f"unknown log origin elsewhere/{t}\n")
        stranger = cp2.split("\n\u2014 ")[0] + "\n\u2014 " + origin + " " + base64.b64encode(bytes(68)).decode() + "\n"
        assert requests.post(url, data=("old 0\n\n" + stranger).encode(), timeout=10).status_code == 403
        assert requests.post(url, data=b"old x\n\n", timeout=10).status_code == 400
        # Restarted, it still holds n2.
        witness.terminate()
        assert witness.wait(10) == 0
        witness, again = start()
        assert again == wkey
        r = requests.post(url, data=("old 0\n\n" + cp2).encode(), timeout=10)
        assert (r.status_code, r.text) == (409, f"{n2}\n")
    finally:
        witness.terminate()
        witness.wait(10)
