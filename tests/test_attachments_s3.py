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
from test_uploads import new_upload, upload_all

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
    big = os.urandom(13 * MIB + 12345)  # composed from two 8 MiB-part writes: an S3 multipart object
    small = b"a small text file\n" * 50
    uids = [new_upload(d, d.writer, big), new_upload(d, d.writer, small)]
    assert upload_all(d, d.writer, uids[0], big, chunk=5 * MIB) == len(big)
    assert upload_all(d, d.writer, uids[1], small) == len(small)
    with d.su() as c:
        cts = {str(u): bytes(ct).hex() for u, ct in c.execute(
            "SELECT upload_id, ciphertext_sha256 FROM oml.upload_sessions WHERE state = 'complete'").fetchall()}
    q = s3_objects(d, "oml-quarantine")
    assert q == {f"{d.tenant_id}/{ct}": ct for ct in cts.values()}  # no part left, names = digests
    head = d.s3.head_object(Bucket="oml-quarantine", Key=f"{d.tenant_id}/{cts[uids[0]]}")
    assert head["ETag"].strip('"').endswith("-2")  # multipart

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


def test_a_killed_composition_leaves_a_multipart_upload_that_the_staging_sweep_aborts(s3_served):
    """Issue 19, "Leftovers": kill -9 while an upload's object is being written leaves an
    incomplete multipart upload (its parts stored, no object), which no listing of keys shows.
    `oml serve` aborts those older than staging_grace_s at start and then periodically."""
    d = s3_served
    data = os.urandom(17 * MIB + 5)  # three writer parts: two uploaded, the last buffered
    uid = new_upload(d, d.writer, data)
    assert upload_all(d, d.writer, uid, data[:15 * MIB], chunk=5 * MIB) == 15 * MIB
    d.stop_server()
    d.serve(env={"OML_FAULT": "uploads.complete.before_finish:kill"})
    with pytest.raises(requests.ConnectionError):
        requests.patch(f"{d.base}/v1/uploads/{uid}", data=data[15 * MIB:], timeout=120,
                       headers={"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {d.writer}",
                                "Upload-Offset": str(15 * MIB), "Content-Type": "application/offset+octet-stream"})
    assert d.server.wait(timeout=30) == -9
    d.server = None
    d.server_log.close()
    left = d.s3.list_multipart_uploads(Bucket="oml-quarantine").get("Uploads", [])
    assert len(left) == 1 and left[0]["Key"].startswith(f"{d.tenant_id}/"), left
    assert len(d.s3.list_parts(Bucket="oml-quarantine", Key=left[0]["Key"], UploadId=left[0]["UploadId"])["Parts"]) == 2
    # moto reports a fixed Initiated (2010-11-10) for every multipart upload, so on moto each
    # looks older than any grace: that a young upload is left alone is shown on the local store
    # (tests/test_uploads.py), where the age is the staging file's mtime.
    assert left[0]["Initiated"].year == 2010
    # Another tool's upload in the same bucket (a backup, say): not oml's key, never aborted.
    foreign = d.s3.create_multipart_upload(Bucket="oml-quarantine", Key="backups/base.tar")["UploadId"]
    # Older than the grace: aborted at start, parts and all.
    d.serve(env={"OML_STAGING_GRACE_S": "600"})
    deadline = time.time() + 20
    while len(d.s3.list_multipart_uploads(Bucket="oml-quarantine").get("Uploads", [])) > 1 and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    assert [(u["Key"], u["UploadId"]) for u in d.s3.list_multipart_uploads(Bucket="oml-quarantine").get("Uploads", [])] \
        == [("backups/base.tar", foreign)]
    assert d.s3.list_multipart_uploads(Bucket="oml-bodies").get("Uploads", []) == []
    # The upload itself resumes: the last chunk composes the object again.
    r = requests.patch(f"{d.base}/v1/uploads/{uid}", data=data[15 * MIB:], timeout=120,
                       headers={"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {d.writer}",
                                "Upload-Offset": str(15 * MIB), "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 204, r.text
    assert r.headers["Upload-Offset"] == str(len(data))
    assert len(s3_objects(d, "oml-quarantine")) == 1
