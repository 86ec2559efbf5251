"""tus 1.0 uploads under /v1/uploads (issue 9, "Uploads speak tus 1.0"): a real server on real
PostgreSQL with a local quarantine bucket ($OML_HOME/objects/oml-quarantine).

Every fault is answered with its exact status and leaves no part, no object and no key behind:
a session that ends without completing keeps only a key-less row (state, digests), which the
sweep deletes after its retention. Stored objects are checked by decrypting them here, from the
KEK file, the session row and the documented framing (src/crypto/crypto.h, src/uploads/uploads.h).
"""
import base64
import datetime
import hashlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from conftest import OML_BIN, free_port
from test_hostile_clients import proc_status

MIB = 1 << 20
TUS = {"Tus-Resumable": "1.0.0"}
OCTETS = "application/offset+octet-stream"


# --- helpers -----------------------------------------------------------------------------------

def hdr(token=None, **extra):
    h = dict(TUS)
    if token:
        h["Authorization"] = f"Bearer {token}"
    h.update(extra)
    return h


def b64(b):
    return base64.b64encode(b).decode()


def metadata(sha256_bytes, **kv):
    items = [f"sha256 {b64(sha256_bytes)}"] + [f"{k} {b64(v.encode())}" for k, v in kv.items()]
    return ",".join(items)


def create(d, token, data=None, length=None, sha=None, **kv):
    length = len(data) if length is None else length
    sha = hashlib.sha256(data).digest() if sha is None else sha
    return requests.post(d.base + "/v1/uploads", headers=hdr(token, **{"Upload-Length": str(length),
                                                                      "Upload-Metadata": metadata(sha, **kv)}), timeout=30)


def new_upload(d, token, data, **kv):
    r = create(d, token, data, **kv)
    assert r.status_code == 201, r.text
    assert r.headers["Location"].startswith("/v1/uploads/")
    return r.headers["Location"].rsplit("/", 1)[1]


def patch(d, token, uid, offset, chunk, checksum=None, content_type=OCTETS):
    h = hdr(token, **{"Upload-Offset": str(offset), "Content-Type": content_type})
    if checksum:
        h["Upload-Checksum"] = checksum
    return requests.patch(f"{d.base}/v1/uploads/{uid}", data=chunk, headers=h, timeout=120)


def head(d, token, uid):
    return requests.head(f"{d.base}/v1/uploads/{uid}", headers=hdr(token), timeout=30)


def delete(d, token, uid):
    return requests.delete(f"{d.base}/v1/uploads/{uid}", headers=hdr(token), timeout=30)


def upload_all(d, token, uid, data, chunk=MIB, start=0):
    off = start
    while off < len(data):
        r = patch(d, token, uid, off, data[off:off + chunk])
        assert r.status_code == 204, r.text
        off = int(r.headers["Upload-Offset"])
    return off


def problem(r, status, slug):
    assert r.status_code == status, (r.status_code, r.headers, r.text)
    assert r.headers.get("Tus-Resumable") == "1.0.0", r.headers
    if r.request.method != "HEAD":
        assert r.headers["Content-Type"] == "application/problem+json"
        assert r.json()["type"] == f"urn:oml:problem:{slug}", r.text


def quarantine(d):
    return d.home / "objects" / "oml-quarantine"


def parts(d, tenant, uid):
    p = quarantine(d) / tenant / "uploads" / uid
    return sorted(x.name for x in p.iterdir()) if p.exists() else []


def staged(d, uid):
    """Bytes in the session's staging file (its object so far, sql/0027; 0 if none), after checking
    that nothing else is stored under the session's prefix: no part objects, no composition."""
    names = parts(d, d.tenant_id, uid)
    assert names in ([], ["object"]), names
    return (quarantine(d) / d.tenant_id / "uploads" / uid / "object").stat().st_size if names else 0


def objects(d, tenant):
    """Every object of the tenant in the quarantine bucket that is not a part."""
    root = quarantine(d) / tenant
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != "uploads")


def row(d, uid):
    with d.su() as c:
        cur = c.execute("SELECT * FROM oml.upload_sessions WHERE upload_id = %s", (uid,))
        r = cur.fetchone()
        return None if r is None else dict(zip([x.name for x in cur.description], r))


def decrypted_blocks(d, uid, kek_file=None):
    """Yields the plaintext of the completed upload's object, segment by segment, after checking
    its ciphertext digest and size against the session row."""
    s = row(d, uid)
    assert s["state"] == "complete", s["state"]
    tenant = str(s["tenant_id"])
    kek = bytes.fromhex((kek_file or d.home / "keys" / "kek.key").read_text().strip())
    w = bytes(s["wrapped_dek"])
    dek = AESGCM(kek).decrypt(w[:12], w[12:], f"oml-upload-dek|{tenant}|{uid}".encode())
    assert s["object_key"] == f"{tenant}/{bytes(s['ciphertext_sha256']).hex()}"
    path = quarantine(d) / s["object_key"]
    size = path.stat().st_size
    assert size == s["ciphertext_size"]
    aad = f"oml-attachment|{tenant}|{uid}".encode()
    gcm = AESGCM(dek)
    ct_sha = hashlib.sha256()
    with open(path, "rb") as f:
        h = f.read(16)
        ct_sha.update(h)
        assert h[:5] == b"OMLE\x01"
        seg = int.from_bytes(h[5:9], "big")
        prefix = h[9:16]
        pos, i = 16, 0
        while True:
            last = size - pos <= seg + 16
            rec = f.read(size - pos if last else seg + 16)
            ct_sha.update(rec)
            pos += len(rec)
            nonce = prefix + i.to_bytes(4, "big") + (b"\x01" if last else b"\x00")
            yield gcm.decrypt(nonce, rec, aad)
            i += 1
            if last:
                break
    assert ct_sha.digest() == bytes(s["ciphertext_sha256"])


def decrypted(d, uid, kek_file=None):
    return b"".join(decrypted_blocks(d, uid, kek_file))


def assert_gone(d, tenant, uid, state):
    """A session that ended without completing: key-less row, no part, no object."""
    s = row(d, uid)
    assert s["state"] == state
    for col in ("wrapped_dek", "kek_id", "stream_sealed", "plaintext_sha_sealed", "ciphertext_sha_state", "object_key"):
        assert s[col] is None, col
    assert s["parts_left"] is False
    assert parts(d, tenant, uid) == []


def raw_patch(d, token, uid, offset, length):
    """A PATCH whose body is sent by hand: returns the connected socket after the header."""
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall((f"PATCH /v1/uploads/{uid} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
               f"Authorization: Bearer {token}\r\nContent-Type: {OCTETS}\r\nUpload-Offset: {offset}\r\n"
               f"Content-Length: {length}\r\n\r\n").encode())
    return s


# --- the protocol ------------------------------------------------------------------------------

def test_options_versions_and_refusals_before_any_write(served):
    d = served
    o = requests.options(d.base + "/v1/uploads", timeout=30)  # no token, no Tus-Resumable needed
    assert o.status_code == 204
    assert o.headers["Tus-Resumable"] == "1.0.0"
    assert o.headers["Tus-Version"] == "1.0.0"
    assert o.headers["Tus-Extension"] == "creation,expiration,termination,checksum"
    assert o.headers["Tus-Max-Size"] == str(8 << 30)
    assert o.headers["Tus-Checksum-Algorithm"] == "sha1,sha256"
    before = d.counts()
    data = b"x" * 10
    sha = hashlib.sha256(data).digest()
    # Tus-Resumable missing or another version: 412 with Tus-Version, before authentication.
    for h in ({}, {"Tus-Resumable": "0.2.2"}):
        r = requests.post(d.base + "/v1/uploads", headers={**h, "Upload-Length": "10", "Upload-Metadata": metadata(sha)},
                          timeout=30)
        problem(r, 412, "tus-version-unsupported")
        assert r.headers["Tus-Version"] == "1.0.0"
    r = requests.head(d.base + "/v1/uploads/00000000-0000-4000-8000-000000000000", timeout=30)
    problem(r, 412, "tus-version-unsupported")
    problem(requests.post(d.base + "/v1/uploads", headers=hdr(), timeout=30), 401, "unauthenticated")
    problem(create(d, d.reviewer, data), 403, "forbidden-role")
    r = requests.post(d.base + "/v1/uploads", headers=hdr(d.writer, **{"Upload-Metadata": metadata(sha)}), timeout=30)
    problem(r, 400, "invalid-upload-length")  # no Upload-Length
    r = requests.post(d.base + "/v1/uploads", headers=hdr(d.writer, **{"Upload-Length": "-1", "Upload-Metadata": metadata(sha)}),
                      timeout=30)
    problem(r, 400, "invalid-upload-length")
    r = requests.post(d.base + "/v1/uploads", headers=hdr(d.writer, **{"Upload-Defer-Length": "1", "Upload-Metadata": metadata(sha)}),
                      timeout=30)
    problem(r, 400, "invalid-upload-length")
    r = requests.post(d.base + "/v1/uploads", headers=hdr(d.writer, **{"Upload-Length": "10", "Upload-Metadata": "filename eA=="}),
                      timeout=30)
    problem(r, 400, "invalid-upload-metadata")  # sha256 is required
    problem(create(d, d.writer, data, sha=sha[:31]), 400, "invalid-upload-metadata")
    problem(create(d, d.writer, data, filetype="not a type"), 400, "invalid-upload-metadata")
    problem(create(d, d.writer, length=(8 << 30) + 1, sha=sha), 413, "upload-too-large")
    assert d.counts() == before
    # Upload ids that are not ours, or not ids at all.
    problem(head(d, d.writer, "not-a-uuid"), 404, "upload-not-found")
    problem(patch(d, d.writer, "00000000-0000-4000-8000-000000000000", 0, b"x"), 404, "upload-not-found")
    # The transport's own refusals under /v1/uploads carry Tus-Resumable too.
    r = requests.request("TRACE", d.base + "/v1/uploads", timeout=30)
    assert r.status_code == 405 and r.headers["Tus-Resumable"] == "1.0.0"


def test_chunks_with_checksums_make_one_object_that_decrypts_to_the_file(served):
    d = served
    data = os.urandom(3 * MIB + 12345)
    uid = new_upload(d, d.writer, data, filename="résumé.pdf", filetype="application/pdf")
    h = head(d, d.writer, uid)
    assert h.status_code == 200
    assert h.headers["Upload-Offset"] == "0" and h.headers["Upload-Length"] == str(len(data))
    assert h.headers["Cache-Control"] == "no-store"
    assert h.headers["Tus-Resumable"] == "1.0.0"
    assert h.headers["Upload-Expires"].endswith(" GMT")
    # tus creation: HEAD answers Upload-Metadata exactly as it was sent (the client's key names).
    assert h.headers["Upload-Metadata"] == metadata(hashlib.sha256(data).digest(), filename="résumé.pdf",
                                                    filetype="application/pdf")
    off, n = 0, 0
    for size in (1, 65535, 65536, MIB, 777777):
        chunk = data[off:off + size]
        algo = "sha1" if n % 2 else "sha256"
        r = patch(d, d.writer, uid, off, chunk, checksum=f"{algo} {b64(hashlib.new(algo, chunk).digest())}")
        assert r.status_code == 204, r.text
        assert r.headers["Tus-Resumable"] == "1.0.0"
        off += size
        n += 1
        assert r.headers["Upload-Offset"] == str(off)
        assert head(d, d.writer, uid).headers["Upload-Offset"] == str(off)
        assert row(d, uid)["state"] == "receiving"
    # Every chunk went straight into the object's staging file: it holds the committed ciphertext.
    assert staged(d, uid) == row(d, uid)["ciphertext_offset"] > 0 and row(d, uid)["store_upload"] == "local"
    r = patch(d, d.writer, uid, off, data[off:])
    assert r.status_code == 204, r.text
    assert r.headers["Upload-Offset"] == str(len(data))
    s = row(d, uid)
    # Complete, it can still expire (unless a claim attaches it): Upload-Expires says when.
    assert r.headers["Upload-Expires"] == s["expires_at"].astimezone(datetime.timezone.utc).strftime(
        "%a, %d %b %Y %H:%M:%S GMT")
    assert head(d, d.writer, uid).headers["Upload-Expires"] == r.headers["Upload-Expires"]
    assert s["state"] == "complete"
    # A complete upload waits upload_complete_ttl_s (default: upload_expiry_s) for a claim.
    assert (s["expires_at"] - s["completed_at"]).total_seconds() == 86400
    assert bytes(s["plaintext_sha256"]) == hashlib.sha256(data).digest()
    assert s["filename"] == "résumé.pdf" and s["media_type"] == "application/pdf"
    assert parts(d, d.tenant_id, uid) == [] and s["parts_left"] is False
    assert objects(d, d.tenant_id) == [bytes(s["ciphertext_sha256"]).hex()]
    assert decrypted(d, uid) == data
    h = head(d, d.writer, uid)
    assert h.headers["Upload-Offset"] == h.headers["Upload-Length"] == str(len(data))
    # Complete: an empty PATCH at the end is fine, anything else is refused.
    assert patch(d, d.writer, uid, len(data), b"").status_code == 204
    problem(patch(d, d.writer, uid, len(data), b"x"), 413, "upload-length-exceeded")
    # A zero-length file is complete at creation.
    r = create(d, d.writer, b"")
    assert r.status_code == 201, r.text
    empty = r.headers["Location"].rsplit("/", 1)[1]
    assert row(d, empty)["state"] == "complete"
    assert decrypted(d, empty) == b""


def test_client_disconnect_mid_patch_keeps_the_last_whole_chunk(served):
    d = served
    data = os.urandom(2 * MIB)
    uid = new_upload(d, d.writer, data)
    off = 0
    for committed, cut in ((0, 0), (0, 1), (0, 70000), (300000, 1), (300000, 299999), (1000000, 500000)):
        if committed > off:
            r = patch(d, d.writer, uid, off, data[off:committed])
            assert r.status_code == 204
            off = committed
        s = raw_patch(d, d.writer, uid, off, 600000)
        s.sendall(data[off:off + cut])
        time.sleep(0.05)
        s.close()  # the client goes away mid-body
        time.sleep(0.1)
        h = head(d, d.writer, uid)
        assert h.headers["Upload-Offset"] == str(off), (committed, cut)
        assert row(d, uid)["upload_offset"] == off
        assert staged(d, uid) == row(d, uid)["ciphertext_offset"]
    upload_all(d, d.writer, uid, data, chunk=600000, start=off)
    assert decrypted(d, uid) == data
    assert parts(d, d.tenant_id, uid) == []


def test_kill_9_mid_chunk_then_resume_with_head_and_patch(served):
    d = served
    data = os.urandom(3 * MIB)
    uid = new_upload(d, d.writer, data)
    assert patch(d, d.writer, uid, 0, data[:MIB]).status_code == 204
    # 1. Killed while the body arrives.
    s = raw_patch(d, d.writer, uid, MIB, MIB)
    s.sendall(data[MIB:MIB + 400000])
    time.sleep(0.1)
    os.kill(d.server.pid, signal.SIGKILL)
    d.server.wait()
    s.close()
    d.server = None
    d.server_log.close()
    d.serve()
    assert head(d, d.writer, uid).headers["Upload-Offset"] == str(MIB)
    # 2. Killed after the chunk's part was put, before its commit (OML_FAULT ...:kill).
    d.stop_server()
    d.serve(env={"OML_FAULT": "uploads.append.after_part:kill"})
    with pytest.raises(requests.ConnectionError):
        patch(d, d.writer, uid, MIB, data[MIB:2 * MIB])
    assert d.server.wait(timeout=10) == -signal.SIGKILL
    d.server = None
    d.server_log.close()
    assert staged(d, uid) > row(d, uid)["ciphertext_offset"]  # the uncommitted part, past the commit
    d.serve()
    h = head(d, d.writer, uid)
    assert h.status_code == 200 and h.headers["Upload-Offset"] == str(MIB)
    # The client resumes from the offset HEAD gave, in other chunk sizes.
    assert patch(d, d.writer, uid, MIB, data[MIB:MIB + 100000]).status_code == 204
    # 3. Killed after the object was composed, before the completion's commit.
    d.stop_server()
    d.serve(env={"OML_FAULT": "uploads.complete.after_object:kill"})
    with pytest.raises(requests.ConnectionError):
        patch(d, d.writer, uid, MIB + 100000, data[MIB + 100000:])
    assert d.server.wait(timeout=10) == -signal.SIGKILL
    d.server = None
    d.server_log.close()
    d.serve()
    assert head(d, d.writer, uid).headers["Upload-Offset"] == str(MIB + 100000)
    s = row(d, uid)
    assert s["state"] == "receiving"
    # The object that appeared is named by the row (recorded before it was composed).
    assert s["object_key"] is not None and objects(d, d.tenant_id) == [s["object_key"].split("/", 1)[1]]
    r = patch(d, d.writer, uid, MIB + 100000, data[MIB + 100000:])
    assert r.status_code == 204, r.text
    assert decrypted(d, uid) == data
    assert parts(d, d.tenant_id, uid) == []
    # The same bytes gave the same ciphertext: one object, not two.
    assert objects(d, d.tenant_id) == [bytes(row(d, uid)["ciphertext_sha256"]).hex()]


def test_restart_from_zero_delete_then_a_new_session(served):
    d = served
    data = os.urandom(MIB + 5)
    uid = new_upload(d, d.writer, data)
    assert patch(d, d.writer, uid, 0, data[:700000]).status_code == 204
    assert parts(d, d.tenant_id, uid) != []
    r = delete(d, d.writer, uid)
    assert r.status_code == 204 and r.headers["Tus-Resumable"] == "1.0.0"
    assert_gone(d, d.tenant_id, uid, "cancelled")
    problem(head(d, d.writer, uid), 404, "upload-not-found")
    problem(patch(d, d.writer, uid, 700000, data[700000:]), 404, "upload-not-found")
    problem(delete(d, d.writer, uid), 404, "upload-not-found")
    assert objects(d, d.tenant_id) == []
    again = new_upload(d, d.writer, data)
    upload_all(d, d.writer, again, data, chunk=400000)
    assert decrypted(d, again) == data


def test_wrong_offset_is_409_with_the_current_offset(served):
    d = served
    data = os.urandom(200000)
    uid = new_upload(d, d.writer, data)
    assert patch(d, d.writer, uid, 0, data[:100000]).status_code == 204
    for wrong in (0, 99999, 100001, 200000):
        r = patch(d, d.writer, uid, wrong, data[wrong:wrong + 10])
        problem(r, 409, "upload-offset-mismatch")
        assert r.headers["Upload-Offset"] == "100000"
    problem(patch(d, d.writer, uid, 100000, data[100000:], content_type="application/octet-stream"), 415,
            "unsupported-media-type")
    r = requests.patch(f"{d.base}/v1/uploads/{uid}", data=b"x", headers=hdr(d.writer, **{"Content-Type": OCTETS}), timeout=30)
    problem(r, 400, "invalid-upload-offset")
    assert row(d, uid)["upload_offset"] == 100000
    upload_all(d, d.writer, uid, data, start=100000)
    assert decrypted(d, uid) == data


def test_wrong_chunk_checksum_is_460_and_the_chunk_is_discarded(served):
    d = served
    data = os.urandom(300000)
    uid = new_upload(d, d.writer, data)
    chunk = data[:150000]
    wrong256 = f"sha256 {b64(hashlib.sha256(chunk[:-1]).digest())}"
    wrong1 = f"sha1 {b64(hashlib.sha1(b'other').digest())}"
    for c in (wrong256, wrong1):
        r = patch(d, d.writer, uid, 0, chunk, checksum=c)
        problem(r, 460, "checksum-mismatch")
    problem(patch(d, d.writer, uid, 0, chunk, checksum=f"md5 {b64(hashlib.md5(chunk).digest())}"), 400,
            "unsupported-checksum-algorithm")
    problem(patch(d, d.writer, uid, 0, chunk, checksum="sha256 AAAA"), 400, "invalid-upload-checksum")
    assert row(d, uid)["upload_offset"] == 0 and row(d, uid)["part_count"] == 0
    assert parts(d, d.tenant_id, uid) == []
    assert head(d, d.writer, uid).headers["Upload-Offset"] == "0"
    r = patch(d, d.writer, uid, 0, chunk, checksum=f"sha256 {b64(hashlib.sha256(chunk).digest())}")
    assert r.status_code == 204
    upload_all(d, d.writer, uid, data, start=150000)
    assert decrypted(d, uid) == data


def test_wrong_whole_file_digest_is_422_and_the_session_fails_leaving_nothing(served):
    d = served
    data = os.urandom(MIB + 3)
    uid = new_upload(d, d.writer, data, sha=hashlib.sha256(b"another file").digest())
    assert patch(d, d.writer, uid, 0, data[:600000]).status_code == 204
    assert parts(d, d.tenant_id, uid) != []
    r = patch(d, d.writer, uid, 600000, data[600000:])
    problem(r, 422, "digest-mismatch")
    assert_gone(d, d.tenant_id, uid, "failed")
    assert row(d, uid)["plaintext_sha256"] is None and row(d, uid)["ciphertext_sha256"] is None
    assert objects(d, d.tenant_id) == []
    problem(head(d, d.writer, uid), 410, "upload-failed")
    problem(patch(d, d.writer, uid, 600000, data[600000:]), 410, "upload-failed")


def test_oversize_chunks_are_413_and_change_nothing(served):
    d = served
    data = os.urandom(100000)
    uid = new_upload(d, d.writer, data)
    assert patch(d, d.writer, uid, 0, data[:50000]).status_code == 204
    problem(patch(d, d.writer, uid, 50000, data[50000:] + b"!"), 413, "upload-length-exceeded")
    # A chunk above the HTTP body limit is refused by the transport, before it is read.
    big = 6 * MIB + 64 * 1024 + 1
    s = raw_patch(d, d.writer, uid, 50000, big)
    answer = s.recv(65536).decode(errors="replace")
    s.close()
    assert answer.startswith("HTTP/1.1 413"), answer
    # Refused while the header is parsed, and still a tus answer (the path is named).
    assert "\r\nTus-Resumable: 1.0.0\r\n" in answer, answer
    assert "urn:oml:problem:body-too-large" in answer
    assert f'"instance":"/v1/uploads/{uid}"' in answer, answer
    assert row(d, uid)["upload_offset"] == 50000
    assert staged(d, uid) == row(d, uid)["ciphertext_offset"]
    upload_all(d, d.writer, uid, data, start=50000)
    assert decrypted(d, uid) == data


def test_another_key_gets_404_on_every_method(served):
    d = served
    other_tenant = d.tenant("globex")
    gus = d.api_key("globex", "writer", "gus")
    data = os.urandom(100000)
    uid = new_upload(d, d.writer, data)
    assert patch(d, d.writer, uid, 0, data[:40000]).status_code == 204
    for token in (d.writer2, d.admin, gus):  # same tenant (even an admin) or another tenant
        problem(head(d, token, uid), 404, "upload-not-found")
        problem(patch(d, token, uid, 40000, data[40000:]), 404, "upload-not-found")
        problem(delete(d, token, uid), 404, "upload-not-found")
    s = row(d, uid)
    assert s["state"] == "receiving" and s["upload_offset"] == 40000
    assert objects(d, other_tenant) == []
    upload_all(d, d.writer, uid, data, start=40000)
    assert decrypted(d, uid) == data


def test_two_patches_racing_one_wins_the_other_is_409(served):
    d = served
    data = os.urandom(4 * 4 * MIB)
    uid = new_upload(d, d.writer, data)
    off = 0
    for _ in range(4):
        chunk = data[off:off + 4 * MIB]
        results = []
        go = threading.Barrier(2)

        def send():
            go.wait()
            results.append(patch(d, d.writer, uid, off, chunk))
        ts = [threading.Thread(target=send) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        codes = sorted(r.status_code for r in results)
        assert codes == [204, 409], [(r.status_code, r.text) for r in results]
        loser = next(r for r in results if r.status_code == 409)
        assert loser.json()["type"] in ("urn:oml:problem:upload-busy", "urn:oml:problem:upload-offset-mismatch")
        assert loser.headers["Upload-Offset"] in (str(off), str(off + len(chunk)))
        off += len(chunk)
        assert row(d, uid)["upload_offset"] == off
        assert staged(d, uid) == row(d, uid)["ciphertext_offset"] or off == len(data)
    assert row(d, uid)["state"] == "complete"
    assert decrypted(d, uid) == data


def test_expired_sessions_answer_410_and_lose_their_parts(deployment):
    d = deployment
    d.env["OML_UPLOAD_EXPIRY_S"] = "2"  # the sweep then runs every second; tombstones live 2 s
    d.env["OML_UPLOAD_COMPLETE_TTL_S"] = "3600"  # complete uploads wait an hour for a claim
    d.tenant_id = d.tenant("acme")
    d.writer = d.api_key("acme", "writer", "alice")
    d.serve()
    data = os.urandom(300000)
    a = new_upload(d, d.writer, data)
    b = new_upload(d, d.writer, data)
    done = new_upload(d, d.writer, data[:10])
    assert patch(d, d.writer, done, 0, data[:10]).status_code == 204
    for uid in (a, b):
        assert patch(d, d.writer, uid, 0, data[:200000]).status_code == 204
        assert parts(d, d.tenant_id, uid) != []
    # a is touched right after its expiry: 410 there and then, its parts removed.
    deadline = time.time() + 10
    while row(d, a)["state"] != "expired" and time.time() < deadline:
        r = head(d, d.writer, a)
        if r.status_code == 410:
            problem(r, 410, "upload-expired")
            break
        time.sleep(0.2)
    assert_gone(d, d.tenant_id, a, "expired")
    problem(patch(d, d.writer, a, 200000, data[200000:]), 410, "upload-expired")
    # b is never touched: the sweep expires it and removes its parts.
    deadline = time.time() + 10
    while row(d, b)["state"] != "expired" and time.time() < deadline:
        time.sleep(0.2)
    assert_gone(d, d.tenant_id, b, "expired")
    assert objects(d, d.tenant_id) == [bytes(row(d, done)["ciphertext_sha256"]).hex()]
    # Complete sessions within their upload_complete_ttl_s do not expire; the tombstones go after
    # their retention.
    deadline = time.time() + 15
    while (row(d, a) or row(d, b)) and time.time() < deadline:
        time.sleep(0.3)
    assert row(d, a) is None and row(d, b) is None
    problem(head(d, d.writer, a), 404, "upload-not-found")
    assert row(d, done)["state"] == "complete"
    assert decrypted(d, done) == data[:10]


def test_a_stock_tus_client_uploads_in_chunks_is_interrupted_and_resumes(served, tmp_path):
    from tusclient import client as tus_client
    from tusclient.storage import filestorage
    d = served
    data = os.urandom(5 * MIB + 321)
    path = tmp_path / "file.bin"
    path.write_bytes(data)
    storage = filestorage.FileStorage(str(tmp_path / "tus-urls.json"))
    meta = {"sha256": hashlib.sha256(data).hexdigest(), "filename": "file.bin", "filetype": "application/octet-stream"}

    def uploader():
        c = tus_client.TusClient(d.base + "/v1/uploads", headers={"Authorization": f"Bearer {d.writer}"})
        return c.uploader(file_path=str(path), chunk_size=MIB, metadata=meta, upload_checksum=True,
                          store_url=True, url_storage=storage)
    first = uploader()
    first.upload(stop_at=2 * MIB + 5)  # interrupted after three chunks
    uid = first.url.rsplit("/", 1)[1]
    assert row(d, uid)["upload_offset"] == 2 * MIB + 5
    # The server restarts; a new client process finds the upload by its fingerprint and resumes.
    d.stop_server()
    d.serve()
    second = uploader()
    assert second.url == first.url
    assert second.offset == 2 * MIB + 5  # from HEAD
    second.upload()
    assert row(d, uid)["state"] == "complete"
    assert decrypted(d, uid) == data
    storage.close()


def test_kek_rotate_rewraps_upload_deks(served):
    d = served
    data = os.urandom(300000)
    complete = new_upload(d, d.writer, data)
    upload_all(d, d.writer, complete, data)
    active = new_upload(d, d.writer, data)
    assert patch(d, d.writer, active, 0, data[:100000]).status_code == 204
    cancelled = new_upload(d, d.writer, data)
    assert delete(d, d.writer, cancelled).status_code == 204
    d.stop_server()
    old_file = d.home / "keys" / "kek.key"
    new_file = d.home / "keys" / "kek-2.key"
    d.run("kek", "generate", str(new_file))
    out = json.loads(d.run("kek", "rotate", "--new-kek-file", str(new_file)).stdout)
    assert out["rewrapped"] == 2 and out["keys"] == 2  # no claims: the two upload DEKs
    new_kek = bytes.fromhex(new_file.read_text().strip())
    old_kek = bytes.fromhex(old_file.read_text().strip())
    for uid in (complete, active):
        s = row(d, uid)
        assert s["kek_id"] == out["kek_id"]
        aad = f"oml-upload-dek|{d.tenant_id}|{uid}".encode()
        w = bytes(s["wrapped_dek"])
        AESGCM(new_kek).decrypt(w[:12], w[12:], aad)
        with pytest.raises(Exception):
            AESGCM(old_kek).decrypt(w[:12], w[12:], aad)
    assert row(d, cancelled)["wrapped_dek"] is None
    # A server with the new KEK alone finishes the active upload; both decrypt.
    d.env["OML_KEK_FILE"] = str(new_file)
    d.serve()
    upload_all(d, d.writer, active, data, start=100000)
    assert decrypted(d, complete, kek_file=new_file) == data
    assert decrypted(d, active, kek_file=new_file) == data


# --- no transaction during object-store I/O (uploads.h "Mutual exclusion") ----------------------

LOCK_CLASS = 0x6f6d6c75  # "omlu": the first key of every session's advisory lock


def wait_stopped(pid, timeout=15):
    """Waits until process `pid` is stopped (OML_FAULT=<point>:stop sent it SIGSTOP)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split()[2] == "T":
                return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not stop at the fault point")


def test_a_patch_holds_no_transaction_while_it_waits_on_the_object_store(served):
    """A PATCH held between its part put and its commit (server A, stopped there) holds the
    session's advisory lock on an idle connection: no transaction id, no snapshot, no row lock.
    So a second PATCH is still refused at once, and another tenant's write through server B is
    at once below the lake writer's outbox cut (pg_snapshot_xmin, docs/data/postgres-schema.md)."""
    d = served
    other = d.tenant("beta")
    beta = d.api_key("beta", "writer", "bob")
    data = os.urandom(8 * MIB)
    uid = new_upload(d, d.writer, data)
    pb = free_port()
    env_b = dict(d.env, OML_LISTEN=f"127.0.0.1:{pb}", OML_METRICS_LISTEN=f"127.0.0.1:{free_port()}")
    b = subprocess.Popen([OML_BIN, "serve"], env=env_b, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_b = f"http://127.0.0.1:{pb}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                requests.get(base_b + "/v1/health", timeout=1)
                break
            except requests.ConnectionError:
                assert time.time() < deadline, "server B did not come up"
                time.sleep(0.05)
        # OML_FAULT=...:stop raises SIGSTOP in the thread at the point, which stops there (and
        # then the whole process); should a chunk's commit still slip in before (another
        # request's, a background one), it is let through and the next chunk is held on a new
        # server A.
        off = 0
        for _ in range(5):
            d.stop_server()
            d.serve(env={"OML_FAULT": "uploads.append.after_part:stop"})
            answers = []
            t = threading.Thread(target=lambda o=off: answers.append(patch(d, d.writer, uid, o, data[o:o + MIB])),
                                 daemon=True)
            t.start()
            wait_stopped(d.server.pid)
            # A COMMIT sent just before the stop may still be running in PostgreSQL (its backend
            # is active, with a snapshot before its xid, until it ends): let it finish before
            # reading the offset, or a chunk that did commit would pass for a held one.
            settle = time.time() + 10
            with d.su() as c:
                while c.execute("SELECT count(*) FROM pg_stat_activity WHERE (backend_xid IS NOT NULL OR "
                                "backend_xmin IS NOT NULL OR state = 'active') AND backend_type = 'client backend' "
                                "AND usename <> current_user").fetchone()[0] and time.time() < settle:
                    time.sleep(0.05)
            with d.su() as c:  # a background transaction of server A (the tlog publisher's, say)
                background = c.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
                                       "AND usename <> current_user").fetchone()[0]  # caught by the stop: again
            if row(d, uid)["upload_offset"] == off and background == 0:
                break
            os.kill(d.server.pid, signal.SIGCONT)
            t.join(timeout=60)
            assert [a.status_code for a in answers] == [204]
            off += MIB
        else:
            raise AssertionError("no PATCH was held before its commit")
        # The held chunk is in the staging file, past the committed ciphertext.
        assert staged(d, uid) > row(d, uid)["ciphertext_offset"]
        with d.su() as c:
            xids = c.execute("SELECT pid, backend_xid, state FROM pg_stat_activity "
                             "WHERE backend_xid IS NOT NULL AND usename <> current_user").fetchall()
            assert xids == [], xids
            # The held PATCH's backend: it holds the session's lock, idle, with no xid and no snapshot.
            held = c.execute("SELECT a.backend_xid, a.backend_xmin, a.state FROM pg_locks l JOIN pg_stat_activity a "
                             "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.classid::bigint = %s AND l.granted",
                             (LOCK_CLASS,)).fetchall()
            assert held == [(None, None, "idle")], held
            c.execute("SELECT 1 FROM oml.upload_sessions WHERE upload_id = %s FOR UPDATE NOWAIT", (uid,))  # no row lock
        # Still one chunk at a time: the same chunk through B is refused at once, with the offset.
        r = requests.patch(f"{base_b}/v1/uploads/{uid}", data=data[off:off + MIB], timeout=30,
                           headers=hdr(d.writer, **{"Upload-Offset": str(off), "Content-Type": OCTETS}))
        problem(r, 409, "upload-busy")
        assert r.headers["Upload-Offset"] == str(off)
        r = requests.post(base_b + "/v1/claims", headers={"Authorization": f"Bearer {beta}"}, timeout=30,
                          json={"body": "tenant beta", "workarea_id": "wa-1", "path": "a.md", "provenance": "human"})
        assert r.status_code == 201, r.text
        with d.su() as c:
            n, stable = c.execute("SELECT count(*), bool_and(pg_snapshot_xmin(pg_current_snapshot()) > xid) "
                                  "FROM oml.outbox WHERE tenant_id = %s", (other,)).fetchone()
        assert n > 0 and stable is True
    finally:
        if d.server is not None:
            os.kill(d.server.pid, signal.SIGCONT)
        b.terminate()
        b.wait()
    t.join(timeout=60)
    assert [a.status_code for a in answers] == [204], [a.text for a in answers]
    assert row(d, uid)["upload_offset"] == off + MIB
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = %s",
                         (LOCK_CLASS,)).fetchone()[0] == 0
    upload_all(d, d.writer, uid, data, start=off + MIB)
    assert decrypted(d, uid) == data


# --- the sealed stream state -------------------------------------------------------------------

def seal_all(key, aad, plaintext, seg=64 * 1024):
    """crypto::EncryptAll (src/crypto/crypto.h framing) in Python."""
    prefix = os.urandom(7)
    out = b"OMLE\x01" + seg.to_bytes(4, "big") + prefix
    n = max(1, -(-len(plaintext) // seg))
    for i in range(n):
        nonce = prefix + i.to_bytes(4, "big") + (b"\x01" if i == n - 1 else b"\x00")
        out += AESGCM(key).encrypt(nonce, plaintext[i * seg:(i + 1) * seg], aad)
    return out


def open_all(key, aad, ct):
    """crypto::DecryptAll in Python."""
    assert ct[:5] == b"OMLE\x01"
    seg, prefix = int.from_bytes(ct[5:9], "big"), ct[9:16]
    out, pos, i = b"", 16, 0
    while True:
        last = len(ct) - pos <= seg + 16
        rec = ct[pos:] if last else ct[pos:pos + seg + 16]
        out += AESGCM(key).decrypt(prefix + i.to_bytes(4, "big") + (b"\x01" if last else b"\x00"), rec, aad)
        pos += len(rec)
        i += 1
        if last:
            return out


def test_a_rewound_stream_state_is_refused_and_seals_nothing(served):
    """The audit rewound next_segment in the row (with the database role, no KEK) and the server
    sealed new plaintext under nonces already used. The whole stream state is now sealed under the
    DEK with the offset in its AAD, and must stand where that offset puts it: every rewind is
    500 integrity, and no part is written."""
    d = served
    seg = 64 * 1024
    a = os.urandom(2 * seg + 100)
    b = os.urandom(seg)
    data = a + b + os.urandom(10)
    uid = new_upload(d, d.writer, data)
    at_zero = bytes(row(d, uid)["stream_sealed"])
    assert patch(d, d.writer, uid, 0, a).status_code == 204
    s = row(d, uid)
    assert (s["upload_offset"], s["part_count"]) == (len(a), 1)
    good = bytes(s["stream_sealed"])
    for col in ("next_segment", "header_sent", "pending_sealed"):
        assert col not in s, col  # nothing of the stream's position is in the clear

    def set_stream(v):
        with d.su() as c:
            c.execute("UPDATE oml.upload_sessions SET stream_sealed = %s WHERE upload_id = %s", (v, uid))

    def refused():
        problem(patch(d, d.writer, uid, len(a), b), 500, "integrity")
        assert staged(d, uid) == 16 + 2 * (seg + 16)  # nothing written past the committed ciphertext
        assert row(d, uid)["upload_offset"] == len(a)

    # 1. Without the DEK: the state sealed at offset 0 (next segment 0) put back.
    set_stream(at_zero)
    refused()
    # 2. With the DEK (from the KEK file): a rewound state sealed correctly under this offset.
    kek = bytes.fromhex((d.home / "keys" / "kek.key").read_text().strip())
    w = bytes(s["wrapped_dek"])
    dek = AESGCM(kek).decrypt(w[:12], w[12:], f"oml-upload-dek|{d.tenant_id}|{uid}".encode())
    aad = f"oml-upload-stream|{d.tenant_id}|{uid}|{len(a)}".encode()
    plain = open_all(dek, aad, good)
    assert plain[0] == 1 and int.from_bytes(plain[1:5], "big") == seg
    assert int.from_bytes(plain[12:20], "big") == 2 and plain[20] == 1 and plain[21:] == a[2 * seg:]
    set_stream(seal_all(dek, aad, plain[:12] + (0).to_bytes(8, "big") + plain[20:]))
    refused()
    # Sealed correctly and not rewound: taken (the check is the position, not the seal's bytes).
    set_stream(seal_all(dek, aad, plain))
    upload_all(d, d.writer, uid, data, start=len(a))
    assert decrypted(d, uid) == data


# --- complete uploads: DELETE, time to live, crash before the completion's commit ---------------

def test_a_complete_upload_is_deleted_by_delete_and_expires_unless_attached(deployment):
    d = deployment
    d.tenant_id = d.tenant("acme")
    d.writer = d.api_key("acme", "writer", "alice")
    d.serve(env={"OML_UPLOAD_COMPLETE_TTL_S": "2"})  # the sweep then runs every second
    data = os.urandom(5000)
    # DELETE of a complete upload: 204, its DEK shredded, its object deleted.
    uid = new_upload(d, d.writer, data)
    upload_all(d, d.writer, uid, data)
    assert len(objects(d, d.tenant_id)) == 1
    r = delete(d, d.writer, uid)
    assert r.status_code == 204 and r.headers["Tus-Resumable"] == "1.0.0"
    assert_gone(d, d.tenant_id, uid, "cancelled")
    assert objects(d, d.tenant_id) == []
    problem(head(d, d.writer, uid), 404, "upload-not-found")
    problem(delete(d, d.writer, uid), 404, "upload-not-found")
    # Complete, never attached, its key revoked: it expires upload_complete_ttl_s after completion.
    uid = new_upload(d, d.writer, data)
    upload_all(d, d.writer, uid, data)
    s = row(d, uid)
    assert s["state"] == "complete" and 1.5 <= (s["expires_at"] - s["completed_at"]).total_seconds() <= 2.5
    assert len(objects(d, d.tenant_id)) == 1
    d.run("key", "revoke", "--tenant", "acme", s["api_key_id"], "--reason", "left")
    deadline = time.time() + 15
    while row(d, uid)["state"] == "complete" and time.time() < deadline:
        time.sleep(0.2)
    assert_gone(d, d.tenant_id, uid, "expired")
    assert objects(d, d.tenant_id) == []
    # A live key's claim cannot attach an expired upload.
    bob = d.api_key("acme", "writer", "bob")
    late = new_upload(d, bob, data)
    upload_all(d, bob, late, data)
    deadline = time.time() + 15
    while row(d, late)["state"] == "complete" and time.time() < deadline:
        time.sleep(0.2)
    assert row(d, late)["state"] == "expired"
    r = d.submit(bob, attachments=[late])
    assert r.status_code == 404 and r.json()["type"] == "urn:oml:problem:upload-not-found", r.text
    problem(head(d, bob, late), 410, "upload-expired")


def test_an_object_composed_before_a_crash_is_deleted_with_its_session(served):
    """Killed after the object appeared, before the completion's commit: the row (still
    receiving) names the object, and DELETE removes it (the audit found it left behind)."""
    d = served
    data = os.urandom(MIB + 1000)
    uid = new_upload(d, d.writer, data)
    assert patch(d, d.writer, uid, 0, data[:MIB]).status_code == 204
    d.stop_server()
    d.serve(env={"OML_FAULT": "uploads.complete.after_object:kill"})
    with pytest.raises(requests.ConnectionError):
        patch(d, d.writer, uid, MIB, data[MIB:])
    assert d.server.wait(timeout=10) == -signal.SIGKILL
    d.server = None
    d.server_log.close()
    d.serve()
    s = row(d, uid)
    assert s["state"] == "receiving" and s["object_key"] is not None
    assert objects(d, d.tenant_id) == [s["object_key"].split("/", 1)[1]]
    r = delete(d, d.writer, uid)
    assert r.status_code == 204
    assert_gone(d, d.tenant_id, uid, "cancelled")
    assert objects(d, d.tenant_id) == []


# --- memory ------------------------------------------------------------------------------------

def stream(seed, total, chunk):
    rng = random.Random(seed)
    left = total
    while left:
        n = min(chunk, left)
        yield rng.randbytes(n)
        left -= n


def test_a_1_gib_upload_keeps_the_servers_rss_growth_under_64_mib(served):
    d = served
    total, chunk = 1 << 30, 6 * MIB
    sha = hashlib.sha256()
    for b in stream(7, total, chunk):
        sha.update(b)
    # Warm up with a small upload of two chunks: the steady state holds one chunk.
    warm = os.urandom(2 * chunk)
    upload_all(d, d.writer, new_upload(d, d.writer, warm), warm, chunk=chunk)
    baseline = proc_status(d.server.pid)["VmHWM"]
    r = create(d, d.writer, length=total, sha=sha.digest())
    assert r.status_code == 201
    uid = r.headers["Location"].rsplit("/", 1)[1]
    off = 0
    session = requests.Session()
    for b in stream(7, total, chunk):
        rr = session.patch(f"{d.base}/v1/uploads/{uid}", data=b, timeout=120,
                           headers=hdr(d.writer, **{"Upload-Offset": str(off), "Content-Type": OCTETS}))
        assert rr.status_code == 204, rr.text
        off += len(b)
    assert off == total
    growth = proc_status(d.server.pid)["VmHWM"] - baseline
    assert growth <= 64 * MIB, f"server peak RSS grew by {growth / MIB:.1f} MiB"
    assert row(d, uid)["state"] == "complete"
    check = hashlib.sha256()
    for block in decrypted_blocks(d, uid):
        check.update(block)
    assert check.digest() == sha.digest()


def staging_files(root):
    """Files named <name>#<digits> below root: what a killed write leaves on a local store."""
    import re
    return sorted(p for p in root.rglob("*") if p.is_file() and re.search(r"#[0-9]+$", p.name))


def test_the_staging_sweep_removes_what_killed_writes_left_and_never_a_sessions_write(served):
    """Issue 19, "Leftovers": a kill -9 mid-write leaves a staging file (<key>#<digits>), which
    List hides; `oml serve` removes the ones older than staging_grace_s at start and then
    periodically, and never a young one. An upload session's own write (sql/0027: the staging file
    its chunks go into, here killed after its last part, before it was finished) is not such a
    leftover, however old: it stays, and the resumed last PATCH finishes it."""
    d = served
    data = os.urandom(9 * MIB + 7)
    uid = new_upload(d, d.writer, data)
    assert upload_all(d, d.writer, uid, data[:8 * MIB], chunk=4 * MIB) == 8 * MIB
    d.stop_server()
    d.serve(env={"OML_FAULT": "uploads.complete.before_finish:kill"})
    with pytest.raises(requests.ConnectionError):
        patch(d, d.writer, uid, 8 * MIB, data[8 * MIB:])
    assert d.server.wait(timeout=30) == -9
    d.server = None
    d.server_log.close()
    seg = 64 * 1024
    assert staged(d, uid) == 16 + len(data) + 16 * -(-len(data) // seg)  # every byte, the last part too
    assert staging_files(d.home / "objects") == []
    # What killed writes leave: a put into the quarantine bucket, a promotion's copy into the
    # bodies bucket, a head being published into the heads store (object_store_url).
    (quarantine(d) / d.tenant_id / ("2" * 64 + "#9000000002")).write_bytes(b"partial")
    bodies = d.home / "objects" / "oml-bodies" / d.tenant_id
    bodies.mkdir(parents=True, exist_ok=True)
    (bodies / ("0" * 64 + "#12")).write_bytes(b"partial")
    heads = d.home / "objects" / "oml-heads"
    assert (heads / d.tenant_id).is_file()
    (heads / (d.tenant_id + "#55")).write_bytes(b"partial head")
    # Younger than the grace: kept.
    d.serve(env={"OML_STAGING_GRACE_S": "3600"})
    time.sleep(2)
    assert len(staging_files(d.home / "objects")) == 3
    d.stop_server()
    # Older (mtime two hours back), the session's write too: the leftovers are removed at start;
    # a young one beside them and the session's write stay.
    session_write = quarantine(d) / d.tenant_id / "uploads" / uid / "object"
    for p in staging_files(d.home / "objects") + [session_write]:
        os.utime(p, (time.time() - 7200, time.time() - 7200))
    young = quarantine(d) / d.tenant_id / ("1" * 64 + "#9000001")
    young.write_bytes(b"a write in progress")
    d.serve(env={"OML_STAGING_GRACE_S": "3600"})
    deadline = time.time() + 20
    while len(staging_files(d.home / "objects")) > 1 and time.time() < deadline:
        time.sleep(0.1)
    assert staging_files(d.home / "objects") == [young]
    assert session_write.is_file()
    young.unlink()
    # The upload resumes: the retried last chunk finishes the session's write into the object.
    r = patch(d, d.writer, uid, 8 * MIB, data[8 * MIB:])
    assert r.status_code == 204, r.text
    assert r.headers["Upload-Offset"] == str(len(data))
    assert b"".join(decrypted_blocks(d, uid)) == data
    assert parts(d, d.tenant_id, uid) == []
