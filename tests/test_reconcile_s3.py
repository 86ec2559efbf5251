"""`oml reconcile` with everything on the S3 protocol (issue 20: "One test runs the whole suite on
S3"): the quarantine and bodies buckets and the lake are buckets on moto's server (real HTTP on
loopback). The damage is done with boto3, a client that did not write the objects: a held file
copied into the bodies bucket, a flipped byte, an orphan, a bronze data file deleted. The audit
names each; --repair journals and repairs them; after the lake writer refills, a second audit is
clean and `oml verify --from-lake` passes."""
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import Deployment, start_moto
from test_lakewriter import lakewriter
from test_reconcile import KEYLESS, brief, populated, reconcile, repair, repair_events

BUCKETS = ("oml-objects", "oml-quarantine", "oml-bodies", "oml-lake")


@pytest.fixture
def s3_everything():
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
               "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true", "OML_OBJECT_STORE_URL": "s3://oml-objects",
               "OML_LAKE_ROOT": "s3://oml-lake/lake"}
        d = Deployment(home, extra_env=env)
        d.s3 = client
        d.start_cluster()
        d.init()
        d.tenant_id = d.tenant("acme")
        d.writer = d.api_key("acme", "writer", "alice")
        d.writer2 = d.api_key("acme", "writer", "bob")
        d.reviewer = d.api_key("acme", "reviewer", "rita")
        d.admin = d.api_key("acme", "admin", "ada")
        d.serve()
        yield d
        d.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)
        p.terminate()
        p.wait()


def keys(d, bucket, prefix=""):
    out = []
    for page in d.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


def test_the_audit_and_its_repair_on_s3(s3_everything):
    d = s3_everything
    ids = populated(d)
    reconcile(d, code=0)
    # Incremental on S3: nothing new, every object listed as the clean run hashed it.
    _, rep = reconcile(d, code=0)
    s = rep["summary"]
    assert (s["mode"], s["events"], s["objects_read"], s["objects_unchanged"]) == ("incremental", 0, 0, 4)
    t = d.tenant_id
    with d.su() as c:
        held_digest, held_seq = c.execute(
            "SELECT encode(ciphertext_sha256, 'hex'), attach_seq FROM oml.attachments WHERE artifact_id = %s",
            (ids["held"],)).fetchone()
    held = f"{t}/{held_digest}"
    # The held file copied into the bodies bucket (a containment breach), an orphan, and a
    # bronze data file deleted behind the lake's back.
    body = d.s3.get_object(Bucket="oml-quarantine", Key=held)["Body"].read()
    d.s3.put_object(Bucket="oml-bodies", Key=held, Body=body)
    orphan = f"{t}/{hashlib.sha256(b'orphan').hexdigest()}"
    d.s3.put_object(Bucket="oml-quarantine", Key=orphan, Body=b"left by a failed submit")
    parquet = sorted(k for k in keys(d, "oml-lake", "lake/bronze/events/") if k.endswith(".parquet"))
    assert parquet
    d.s3.delete_object(Bucket="oml-lake", Key=parquet[0])
    victim = parquet[0][len("lake/bronze/events/"):]
    code, rep = reconcile(d, code=3)
    assert (rep["summary"]["mode"], rep["summary"]["full_reason"]) == ("full", "bronze/events cannot be compared whole")
    assert brief(rep) == sorted([
        ("misplaced-object", "bodies", t, held_seq, held, "containment-breach"),
        ("orphan-object", "quarantine", t, None, orphan, None),
        ("table-unreadable", "bronze/events", None, None, victim, None),
    ])
    # A held claim may still be accepted (its accept copies to that very key, then drops
    # quarantine): its breach copy is left, with the reason, until the claim is decided.
    out = repair(d, code=3)
    acts = {a["class"]: a for a in out["repair"]["actions"]}
    assert sorted((a["class"], a["action"], a["ok"]) for a in out["repair"]["actions"]) == [
        ("misplaced-object", "delete", False), ("orphan-object", "delete", True), ("table-unreadable", "rebuild", True)]
    assert "the claim is held and may still be accepted" in acts["misplaced-object"]["outcome"]
    assert held in keys(d, "oml-bodies")
    lakewriter(d)  # refills the rebuilt bronze
    assert d.get(f"/v1/claims/{ids['held']}", d.reviewer).status_code == 200
    assert d.get(f"/v1/claims/{ids['held']}/attachments/1", d.reviewer).status_code == 200
    r = d.post(f"/v1/claims/{ids['held']}/verdict", d.reviewer, json={"verdict": "reject"})
    assert r.status_code == 200, r.text
    lakewriter(d)
    out = repair(d)
    assert [(a["class"], a["action"], a["ok"]) for a in out["repair"]["actions"]] == [("misplaced-object", "delete", True)]
    # The provider's chain (the table's finding names no tenant) sorts first, then acme's.
    assert [e["class"] for e in repair_events(d)] == ["table-unreadable", "misplaced-object", "orphan-object",
                                                      "misplaced-object"]
    assert held not in keys(d, "oml-bodies")
    assert orphan not in keys(d, "oml-quarantine")
    assert held in keys(d, "oml-quarantine")  # the held file itself is untouched
    lakewriter(d)
    reconcile(d, code=0)
    v = d.run("verify", "--from-lake", check=False)
    assert v.returncode == 0, v.stdout + v.stderr


def test_the_audit_reads_with_read_only_s3_credentials_of_its_own(s3_everything):
    """Issue 20: "it reads the buckets and the lake with read-only credentials of its own". From
    here on moto enforces IAM: the deployment's AWS_* keys are replaced by a user with no
    permission, and the reconciler's (OML_RECONCILER_AWS_ACCESS_KEY_ID / _SECRET_ACCESS_KEY) belong
    to a user that may only read (s3:GetObject, s3:ListBucket). The audit of everything is clean
    with them; the same keys cannot write; without them the audit cannot read the buckets and
    says so; --repair keeps the deployment's keys (it writes)."""
    import json
    import boto3
    import requests
    from botocore.exceptions import ClientError
    d = s3_everything
    populated(d)
    url = d.env["AWS_ENDPOINT_URL"]
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")

    def user(name, actions):
        iam.create_user(UserName=name)
        if actions:
            iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
        k = iam.create_access_key(UserName=name)["AccessKey"]
        return k["AccessKeyId"], k["SecretAccessKey"]

    read_only = user("reconciler", ["s3:GetObject", "s3:ListBucket"])
    nobody = user("nobody", [])
    d.stop_server()  # its sweeps would use the deployment's keys
    requests.post(f"{url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    try:
        deployment_keys = {"AWS_ACCESS_KEY_ID": nobody[0], "AWS_SECRET_ACCESS_KEY": nobody[1], "OML_LOG_LEVEL": "info"}
        own = {"OML_RECONCILER_AWS_ACCESS_KEY_ID": read_only[0], "OML_RECONCILER_AWS_SECRET_ACCESS_KEY": read_only[1]}
        r = d.run("reconcile", "--json", "--object-grace", "0", env={**KEYLESS, **deployment_keys, **own}, check=False)
        assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
        rep = json.loads(r.stdout)
        assert rep["findings"] == [] and rep["summary"]["objects_read"] > 0 and rep["summary"]["rows"]["bronze/events"] > 0
        assert '"credentials":"reconciler"' in r.stderr.replace(" ", "")
        # The reconciler's keys read, and only read.
        ro = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id=read_only[0], aws_secret_access_key=read_only[1])
        assert ro.list_objects_v2(Bucket="oml-lake", Prefix="lake/bronze/events/_delta_log/")["KeyCount"] > 0
        with pytest.raises(ClientError) as denied:
            ro.put_object(Bucket="oml-quarantine", Key="x", Body=b"x")
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
        # Without them the deployment's keys (no permission here) are what it has: it cannot read.
        r = d.run("reconcile", "--json", "--object-grace", "0", env={**KEYLESS, **deployment_keys}, check=False)
        assert r.returncode == 4, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])  # an access error
        assert "unavailable(storage-permission): open Delta table s3://oml-lake/lake/" in r.stderr, r.stderr[-2000:]
        assert "403 Forbidden" in r.stderr
        # --repair writes: it keeps the deployment's keys even when the reconciler's are set.
        r = d.run("reconcile", "--json", "--repair", env={**deployment_keys, **own}, check=False)
        assert r.returncode == 4, (r.returncode, r.stderr[-2000:])
        assert '"credentials":"deployment"' in r.stderr.replace(" ", "") and "403 Forbidden" in r.stderr
        # Half of a pair is a usage error.
        r = d.run("reconcile", "--json", env={**KEYLESS, "OML_RECONCILER_AWS_ACCESS_KEY_ID": read_only[0]}, check=False)
        assert r.returncode == 4
        assert "OML_RECONCILER_AWS_SECRET_ACCESS_KEY" in r.stderr
    finally:
        requests.post(f"{url}/moto-api/reset-auth", data=b"inf", timeout=10)
