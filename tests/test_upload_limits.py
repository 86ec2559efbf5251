"""Upload quotas, the minimum chunk and tus's method override (issue 19, "Leftovers, quotas and
amplification" and "tus 1.0 and HTTP conformance").

Quotas count open sessions (created or receiving, not past Upload-Expires) and their pending
bytes (declared length minus offset), per API key and per tenant; over one, creation is 429
upload-quota-exceeded with Retry-After and creates nothing. A chunk that does not end its upload
must hold upload_min_chunk_bytes (default 1 MiB): each chunk costs a commit and its WAL.
"""
import concurrent.futures
import hashlib
import os

import requests

from test_uploads import MIB, OCTETS, create, delete, hdr, head, new_upload, patch, problem, row, upload_all


def restart(d, **env):
    d.stop_server()
    d.serve(env=env)


def open_sessions(d, key_id=None):
    with d.su() as c:
        q = ("SELECT count(*) FROM oml.upload_sessions WHERE state IN ('created', 'receiving') "
             "AND expires_at > now()")
        args = ()
        if key_id:
            q += " AND api_key_id = %s"
            args = (key_id,)
        return c.execute(q, args).fetchone()[0]


def key_id_of(d, uid):
    return row(d, uid)["api_key_id"]


def quota_refused(r, detail_part):
    problem(r, 429, "upload-quota-exceeded")
    assert r.headers["Retry-After"] == "60"
    assert "Location" not in r.headers
    assert detail_part in r.json()["detail"], r.json()["detail"]


def test_open_sessions_are_limited_per_key_and_per_tenant(served):
    d = served
    restart(d, OML_UPLOAD_SESSIONS_PER_KEY="3", OML_UPLOAD_SESSIONS_PER_TENANT="5")
    data = b"x" * 1000
    mine = [new_upload(d, d.writer, data) for _ in range(3)]
    before = open_sessions(d)
    quota_refused(create(d, d.writer, data), "this API key has 3 open upload sessions")
    assert open_sessions(d) == before == 3  # nothing created
    # Another key of the tenant has its own three, up to the tenant's five.
    theirs = [new_upload(d, d.writer2, data) for _ in range(2)]
    quota_refused(create(d, d.writer2, data), "this tenant has 5 open upload sessions")
    # A complete session is not open: completing one frees a place for its key.
    assert upload_all(d, d.writer, mine[0], data) == len(data)
    assert row(d, mine[0])["state"] == "complete"
    mine.append(new_upload(d, d.writer, data))
    quota_refused(create(d, d.writer, data), "this API key has 3 open upload sessions")
    # So does a DELETE (tus termination).
    assert delete(d, d.writer2, theirs[0]).status_code == 204
    theirs.append(new_upload(d, d.writer2, data))
    # An expired session is not open, even before the sweep gets to it.
    with d.su() as c:
        c.execute("UPDATE oml.upload_sessions SET expires_at = now() - interval '1 second' WHERE upload_id = %s",
                  (mine[1],))
    mine.append(new_upload(d, d.writer, data))
    assert open_sessions(d) == 5


def test_pending_bytes_are_limited_per_key_and_the_length_counts_at_creation(served):
    d = served
    restart(d, OML_UPLOAD_PENDING_BYTES_PER_KEY=str(10 * MIB), OML_UPLOAD_PENDING_BYTES_PER_TENANT=str(16 * MIB))
    big = os.urandom(6 * MIB)
    uid = new_upload(d, d.writer, big)
    five = b"y" * (5 * MIB)
    quota_refused(create(d, d.writer, five),
                  f"this API key's open sessions await {6 * MIB} bytes; {5 * MIB} more would pass its limit of {10 * MIB}")
    # 2 MiB received: 4 MiB pending, and 5 MiB more fit under 10.
    assert patch(d, d.writer, uid, 0, big[:2 * MIB]).status_code == 204
    second = new_upload(d, d.writer, five)
    # The tenant: 4 + 5 pending; 8 MiB more would make 17 > 16.
    quota_refused(create(d, d.writer2, b"z" * (8 * MIB)),
                  f"this tenant's open sessions await {9 * MIB} bytes; {8 * MIB} more would pass its limit of {16 * MIB}")
    assert new_upload(d, d.writer2, b"z" * (7 * MIB))
    assert {row(d, uid)["state"], row(d, second)["state"]} == {"receiving", "created"}
    # A file larger than a quota could never fit: 413, not a 429 to retry for ever.
    r = create(d, d.writer, length=11 * MIB, sha=b"\0" * 32)
    problem(r, 413, "upload-too-large")
    assert "Retry-After" not in r.headers
    assert r.json()["detail"] == (f"Upload-Length {11 * MIB} exceeds an API key's quota of pending upload bytes "
                                  f"({10 * MIB})")


def test_concurrent_creations_never_overshoot_the_quota(served):
    d = served
    restart(d, OML_UPLOAD_SESSIONS_PER_KEY="4")
    data = b"q" * 100
    with concurrent.futures.ThreadPoolExecutor(24) as ex:
        rs = list(ex.map(lambda _: create(d, d.writer, data), range(24)))
    codes = sorted(r.status_code for r in rs)
    assert codes == [201] * 4 + [429] * 20, codes
    for r in rs:
        if r.status_code == 429:
            quota_refused(r, "this API key has 4 open upload sessions")
    created = [r.headers["Location"].rsplit("/", 1)[1] for r in rs if r.status_code == 201]
    assert open_sessions(d, key_id_of(d, created[0])) == 4


def test_a_chunk_that_does_not_end_the_upload_holds_at_least_a_mebibyte_by_default(served):
    d = served
    restart(d, OML_UPLOAD_MIN_CHUNK_BYTES="")  # unset: the built-in default
    data = os.urandom(2 * MIB + 10)
    uid = new_upload(d, d.writer, data)
    before = row(d, uid)
    for n in (1, 4096, MIB - 1):
        r = patch(d, d.writer, uid, 0, data[:n])
        problem(r, 400, "upload-chunk-too-small")
        assert r.json()["detail"] == ("a chunk that does not end the upload must hold at least 1048576 bytes; "
                                      f"this one holds {n}")
    after = row(d, uid)
    assert (after["upload_offset"], after["part_count"], after["updated_at"], after["state"]) == \
        (0, 0, before["updated_at"], "created")
    assert patch(d, d.writer, uid, 0, data[:MIB]).status_code == 204
    assert patch(d, d.writer, uid, MIB, data[MIB:2 * MIB]).status_code == 204
    # The last chunk may be of any size: 10 bytes end the upload.
    r = patch(d, d.writer, uid, 2 * MIB, data[2 * MIB:])
    assert r.status_code == 204 and r.headers["Upload-Offset"] == str(len(data))
    assert row(d, uid)["state"] == "complete"
    # An empty chunk changes nothing and is not refused.
    small = new_upload(d, d.writer, b"abc" * 1000)
    assert patch(d, d.writer, small, 0, b"").status_code == 204


def test_a_minimum_chunk_above_the_request_limit_is_refused_at_start(served):
    d = served
    d.stop_server()
    p = d.run("serve", check=False, env={"OML_UPLOAD_MIN_CHUNK_BYTES": str(8 * MIB),
                                         "OML_HTTP_MAX_REQUEST_BYTES": str(4 * MIB)}, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert ("setting upload_min_chunk_bytes: must be at most http_max_request_bytes (4194304), or no chunk but "
            "the last could pass") in p.stderr


def test_x_http_method_override_reaches_patch_head_and_delete(served):
    """tus 1.0 core: a POST with X-HTTP-Method-Override is the method it names."""
    d = served
    data = os.urandom(3000)
    uid = new_upload(d, d.writer, data)
    url = f"{d.base}/v1/uploads/{uid}"
    r = requests.post(url, data=data[:1000], timeout=30,
                      headers=hdr(d.writer, **{"X-HTTP-Method-Override": "PATCH", "Upload-Offset": "0",
                                               "Content-Type": OCTETS}))
    assert r.status_code == 204, r.text
    assert r.headers["Upload-Offset"] == "1000"
    r = requests.post(url, timeout=30, headers=hdr(d.writer, **{"X-HTTP-Method-Override": "HEAD"}))
    assert r.status_code == 200 and r.content == b"" and r.headers["Content-Length"] == "0"
    assert (r.headers["Upload-Offset"], r.headers["Upload-Length"]) == ("1000", "3000")
    # A HEAD's problem keeps its body when the request on the wire was a POST: the client reads
    # Content-Length bytes (a HEAD on the wire gets none), on a connection that stays usable.
    with requests.Session() as s:
        r = s.post(f"{d.base}/v1/uploads/{'0' * 8}-0000-4000-8000-{'0' * 12}", timeout=10,
                   headers=hdr(d.writer, **{"X-HTTP-Method-Override": "HEAD"}))
        assert r.status_code == 404 and int(r.headers["Content-Length"]) == len(r.content) > 0
        assert r.json()["type"] == "urn:oml:problem:upload-not-found"
        assert s.head(url, timeout=10, headers=hdr(d.writer)).headers["Upload-Offset"] == "1000"
    # The override is case-insensitive, as methods on the wire are not: tus-js-client sends it upper-case.
    r = requests.post(url, data=data[1000:], timeout=30,
                      headers=hdr(d.writer, **{"X-HTTP-Method-Override": "patch", "Upload-Offset": "1000",
                                               "Content-Type": OCTETS}))
    assert r.status_code == 204 and r.headers["Upload-Offset"] == "3000"
    assert row(d, uid)["state"] == "complete"
    r = requests.post(url, timeout=30, headers=hdr(d.writer, **{"X-HTTP-Method-Override": "DELETE"}))
    assert r.status_code == 204, r.text
    assert row(d, uid)["state"] == "cancelled"
    problem(head(d, d.writer, uid), 404, "upload-not-found")
    # Without it a POST to a session is 405, naming what is allowed.
    r = requests.post(url, timeout=30, headers=hdr(d.writer))
    assert r.status_code == 405 and r.headers["Allow"] == "DELETE, HEAD, PATCH"
    # A method no session route has is 405 too (the POST itself is not allowed there).
    r = requests.post(url, timeout=30, headers=hdr(d.writer, **{"X-HTTP-Method-Override": "PUT"}))
    assert r.status_code == 405
    # Routes outside tus ignore the header: a POST /v1/claims stays a submission.
    r = requests.post(d.base + "/v1/claims", data=b"{", timeout=30,
                      headers={"Authorization": f"Bearer {d.writer}", "Content-Type": "application/json",
                               "X-HTTP-Method-Override": "GET"})
    assert r.status_code == 400, r.text


def test_head_returns_upload_metadata_exactly_as_sent(served):
    d = served
    data = b"hello metadata"
    sha = hashlib.sha256(data).hexdigest().encode()
    import base64
    sent = (f"relativePath,  filetype {base64.b64encode(b'text/plain').decode()},"
            f"sha256 {base64.b64encode(sha).decode()} , name {base64.b64encode('ñ.txt'.encode()).decode()}")
    r = requests.post(d.base + "/v1/uploads", timeout=30,
                      headers=hdr(d.writer, **{"Upload-Length": str(len(data)), "Upload-Metadata": sent}))
    assert r.status_code == 201, r.text
    uid = r.headers["Location"].rsplit("/", 1)[1]
    h = head(d, d.writer, uid)
    assert h.headers["Upload-Metadata"] == sent
    s = row(d, uid)
    assert (s["filename"], s["media_type"], s["declared_sha256"]) == ("ñ.txt", "text/plain", hashlib.sha256(data).digest())
    # Longer than 8192 bytes: refused, nothing created.
    n = open_sessions(d)
    big = f"sha256 {base64.b64encode(sha).decode()},pad {base64.b64encode(b'p' * 7000).decode()}"
    r = requests.post(d.base + "/v1/uploads", timeout=30,
                      headers=hdr(d.writer, **{"Upload-Length": "10", "Upload-Metadata": big}))
    problem(r, 400, "invalid-upload-metadata")
    assert r.json()["detail"] == "Upload-Metadata exceeds 8192 bytes"
    assert open_sessions(d) == n
