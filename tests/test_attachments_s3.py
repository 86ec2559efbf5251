"""Uploads and attachments over the S3 protocol (issue 9, Tests: "the S3 suite on moto's server
mode as today"): the quarantine and bodies buckets are S3 buckets on moto (real HTTP on loopback),
so composition (multipart), range reads, put-if-absent, the cross-bucket copy on promotion and
the deletes after erasure run against an S3 implementation, and the stored objects are read back
with boto3, a client that did not write them."""
import hashlib
import os
import shutil
import time
import tempfile
from pathlib import Path

import pytest
import requests

from conftest import Deployment, start_moto
from test_attachments import get_att, verdict
from test_uploads import new_upload, patch, row, upload_all

MIB = 1 << 20
BUCKETS = ("oml-objects", "oml-quarantine", "oml-bodies")


@pytest.fixture
def s3_served():
    import boto3
    p, url = start_moto()
    home = Path(tempfile.mkdtemp(prefix="oml-t-", dir="/tmp"))
    os.chmod(home, 0o755)
    try:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        for b in BUCKETS:
            client.create_bucket(Bucket=b)
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true", "OML_OBJECT_STORE_URL": "s3://oml-objects"}
        d = Deployment(home, extra_env=env)
        d.s3 = client
        d.start_cluster()
        d.init()
        d.tenant_id = d.tenant("acme")
        d.writer = d.api_key("acme", "writer", "alice")
        d.writer2 = d.api_key("acme", "writer", "bob")
        d.reviewer = d.api_key("acme", "reviewer", "rita")
        d.serve()
        yield d
        d.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)
        p.terminate()
        p.wait()


def s3_objects(d, bucket):
    """{key: sha256 hex} of every object in the bucket, read with boto3."""
    out = {}
    for page in d.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            out[o["Key"]] = hashlib.sha256(d.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()).hexdigest()
    return out


def test_upload_attach_serve_promote_and_erase_on_s3(s3_served):
    d = s3_served
    big = os.urandom(13 * MIB + 12345)  # three parts of one multipart upload
    small = b"a small text file\n" * 50
    uids = [new_upload(d, d.writer, big), new_upload(d, d.writer, small)]
    assert upload_all(d, d.writer, uids[0], big, chunk=5 * MIB) == len(big)
    assert upload_all(d, d.writer, uids[1], small) == len(small)
    with d.su() as c:
        cts = {str(u): bytes(ct).hex() for u, ct in c.execute(
            "SELECT upload_id, ciphertext_sha256 FROM oml.upload_sessions WHERE state = 'complete'").fetchall()}
    q = s3_objects(d, "oml-quarantine")
    assert q == {f"{d.tenant_id}/{ct}": ct for ct in cts.values()}  # no part left, names = digests
    # The chunks were parts of one multipart upload, completed and copied to the digest's name.
    assert d.s3.list_multipart_uploads(Bucket="oml-quarantine").get("Uploads", []) == []

    r = d.submit(d.writer, body="two files on s3", attachments=uids)
    assert r.status_code == 201, r.text
    art = r.json()["artifact_id"]
    g = get_att(d, d.reviewer, art, 1, Range=f"bytes={9 * MIB}-{9 * MIB + 99}")  # inside the second part
    assert g.status_code == 206 and g.content == big[9 * MIB:9 * MIB + 100]
    off = 0
    while off < len(big):  # a gapless read in ranges serves the file
        g = get_att(d, d.reviewer, art, 1, Range=f"bytes={off}-{off + 4 * MIB - 1}")
        assert g.status_code == 206 and g.content == big[off:off + len(g.content)]
        off += len(g.content)
    assert get_att(d, d.reviewer, art, 2).content == small
    assert verdict(d, d.reviewer, art, "accept").status_code == 200
    assert s3_objects(d, "oml-quarantine") == {}
    assert s3_objects(d, "oml-bodies") == q  # the same bytes under the same names
    assert get_att(d, d.writer2, art, 2).content == small

    r = d.post(f"/v1/claims/{art}/erase", d.writer, json={"reason": "done"})
    assert r.status_code == 200, r.text
    assert s3_objects(d, "oml-bodies") == {} and s3_objects(d, "oml-quarantine") == {}
    assert get_att(d, d.writer, art, 1).status_code == 410
    assert d.run("verify").stdout.startswith("OK")


def test_a_large_body_is_an_s3_object(s3_served):
    d = s3_served
    body = "".join(f"{i:08d} lorem ipsum dolor sit amet\n" for i in range(4000))
    doc = d.submit(d.writer, body=body).json()
    key = f"{d.tenant_id}/{doc['ciphertext_sha256']}"
    assert s3_objects(d, "oml-quarantine") == {key: doc["ciphertext_sha256"]}
    assert d.get(f"/v1/claims/{doc['artifact_id']}", d.writer).json()["body"] == body
    r = requests.post(f"{d.base}/v1/claims/{doc['artifact_id']}/erase", json={},
                      headers={"Authorization": f"Bearer {d.writer}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert s3_objects(d, "oml-quarantine") == {}


def multipart_uploads(d):
    return [(u["Key"], u["UploadId"]) for u in d.s3.list_multipart_uploads(Bucket="oml-quarantine").get("Uploads", [])]


def parts_of(d, key, upload_id):
    return [(p["PartNumber"], p["ETag"], p["Size"])
            for p in d.s3.list_parts(Bucket="oml-quarantine", Key=key, UploadId=upload_id).get("Parts", [])]


def killed_at(d, point, uid, off, chunk):
    """Restarts the server with OML_FAULT=<point>:kill and sends one PATCH, which kills it there."""
    d.stop_server()
    d.serve(env={"OML_FAULT": f"{point}:kill"})
    with pytest.raises(requests.ConnectionError):
        patch(d, d.writer, uid, off, chunk)
    assert d.server.wait(timeout=30) == -9
    d.server = None
    d.server_log.close()


def attached_file(d, uid):
    """The upload's file as a reviewer reads it back through a claim that attaches it."""
    r = d.submit(d.writer, body="an s3 upload", attachments=[uid])
    assert r.status_code == 201, r.text
    return get_att(d, d.reviewer, r.json()["artifact_id"], 1).content


def test_chunks_go_into_one_multipart_upload_that_a_resume_after_kill_9_continues(s3_served):
    """Issue 22, "Uploads": each chunk's ciphertext is the next part of one multipart upload at the
    session's staging key, its UploadId and every part's ETag recorded with the offset; nothing is
    visible in the bucket while it is received. kill -9 between a part and its commit, and again
    after the last part before the write is finished: the resume continues that same multipart
    upload. The staging sweep (moto reports every upload as initiated in 2010, older than any
    grace) leaves a session's write alone and aborts a leftover of oml's. The last PATCH completes
    it: one object named by its digest, no incomplete multipart upload, and the file reads back."""
    d = s3_served
    data = os.urandom(3 * 6 * MIB + 5)
    uid = new_upload(d, d.writer, data)
    key = f"{d.tenant_id}/uploads/{uid}/object"
    assert upload_all(d, d.writer, uid, data[:6 * MIB], chunk=6 * MIB) == 6 * MIB
    s = row(d, uid)
    mp = s["store_upload"]
    assert multipart_uploads(d) == [(key, mp)]
    assert [(n, e) for n, e, _ in parts_of(d, key, mp)] == [(1, s["store_parts"][0])]
    assert parts_of(d, key, mp)[0][2] == s["ciphertext_offset"] and s["carry_bytes"] == 0
    assert s3_objects(d, "oml-quarantine") == {}
    # 1. Killed after the second part was put, before its commit: the part is in the upload, the
    # offset is not.
    killed_at(d, "uploads.append.after_part", uid, 6 * MIB, data[6 * MIB:12 * MIB])
    assert row(d, uid)["upload_offset"] == 6 * MIB and row(d, uid)["store_parts"] == s["store_parts"]
    assert len(parts_of(d, key, mp)) == 2
    # A leftover of oml's (as a killed copy into the bucket would leave): the sweep aborts it.
    stale = d.s3.create_multipart_upload(Bucket="oml-quarantine", Key=f"{d.tenant_id}/{'0' * 64}")["UploadId"]
    d.serve(env={"OML_STAGING_GRACE_S": "600"})
    deadline = time.time() + 20
    while len(multipart_uploads(d)) > 1 and time.time() < deadline:
        time.sleep(0.2)
    assert multipart_uploads(d) == [(key, mp)], stale
    # The resume sends part 2 again (the same bytes: the same ETag) and part 3 in the same upload.
    assert upload_all(d, d.writer, uid, data[:18 * MIB], chunk=6 * MIB, start=6 * MIB) == 18 * MIB
    s = row(d, uid)
    assert s["store_upload"] == mp and len(s["store_parts"]) == 3
    assert [(n, e) for n, e, _ in parts_of(d, key, mp)] == [(i + 1, e) for i, e in enumerate(s["store_parts"])]
    # 2. Killed after the last part was put, before the write was finished.
    killed_at(d, "uploads.complete.before_finish", uid, 18 * MIB, data[18 * MIB:])
    assert row(d, uid)["state"] == "receiving" and multipart_uploads(d) == [(key, mp)]
    assert len(parts_of(d, key, mp)) == 4
    d.serve()
    r = patch(d, d.writer, uid, 18 * MIB, data[18 * MIB:])
    assert r.status_code == 204, r.text
    assert r.headers["Upload-Offset"] == str(len(data))
    s = row(d, uid)
    assert s["state"] == "complete" and s["store_upload"] is None
    ct = bytes(s["ciphertext_sha256"]).hex()
    assert multipart_uploads(d) == []
    assert s3_objects(d, "oml-quarantine") == {f"{d.tenant_id}/{ct}": ct}
    assert attached_file(d, uid) == data


def test_chunks_under_5_mib_are_carried_and_an_ended_session_leaves_no_multipart_upload(s3_served):
    """Issue 22, "Uploads": S3 parts but the last must hold 5 MiB (moto refuses the completion
    otherwise). 1 MiB chunks are carried in a carry object until they fill a part, which never
    holds more than a chunk and 5 MiB. A session cancelled or expired aborts its multipart upload:
    no incomplete multipart upload and no carry is left."""
    d = s3_served
    data = os.urandom(12 * MIB + 7)
    uid = new_upload(d, d.writer, data)
    key = f"{d.tenant_id}/uploads/{uid}/object"
    off = 0
    while off < 11 * MIB:
        assert patch(d, d.writer, uid, off, data[off:off + MIB]).status_code == 204
        off += MIB
        s = row(d, uid)
        carry = s["carry_bytes"]
        assert carry < 5 * MIB
        held = {k for k in s3_objects(d, "oml-quarantine")}
        assert held == ({f"{d.tenant_id}/uploads/{uid}/carry-{s['ciphertext_offset']:016d}"} if carry else set())
        parts = parts_of(d, key, s["store_upload"]) if s["store_upload"] else []
        assert sum(p[2] for p in parts) + carry == s["ciphertext_offset"]
        assert all(5 * MIB <= p[2] < 6 * MIB for p in parts), parts
    assert len(row(d, uid)["store_parts"]) == 2
    assert upload_all(d, d.writer, uid, data, chunk=MIB, start=off) == len(data)
    s = row(d, uid)
    ct = bytes(s["ciphertext_sha256"]).hex()
    assert multipart_uploads(d) == []
    assert s3_objects(d, "oml-quarantine") == {f"{d.tenant_id}/{ct}": ct}
    assert attached_file(d, uid) == data
    # Cancelled, and expired, mid-way: a part and a carry each; nothing left after.
    for end in ("cancel", "expire"):
        other = new_upload(d, d.writer, data)
        assert upload_all(d, d.writer, other, data[:7 * MIB], chunk=MIB) == 7 * MIB
        assert len(multipart_uploads(d)) == 1 and row(d, other)["carry_bytes"] > 0
        if end == "cancel":
            r = requests.delete(f"{d.base}/v1/uploads/{other}", timeout=30,
                                headers={"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {d.writer}"})
            assert r.status_code == 204, r.text
        else:
            with d.su() as c:
                c.execute("UPDATE oml.upload_sessions SET expires_at = now() - interval '1 second' "
                          "WHERE upload_id = %s", (other,))
            r = requests.head(f"{d.base}/v1/uploads/{other}", timeout=30,
                              headers={"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {d.writer}"})
            assert r.status_code == 410
        assert row(d, other)["store_upload"] is None and row(d, other)["parts_left"] is False
        assert multipart_uploads(d) == []
        assert s3_objects(d, "oml-quarantine") == {f"{d.tenant_id}/{ct}": ct}  # the attached file's only
