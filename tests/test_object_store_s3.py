"""The object store's D3 operations over the S3 protocol (issue 9, "Object store"): moto's server
mode (tests/requirements.txt pins the version), real HTTP on loopback, two buckets standing for
quarantine and bodies.

No CLI command reaches these operations on their own, so the C++ contract suite drives them: the
`/s3` instances of Backends/ObjectStoreContractTest in src/blob/object_store_test.cc (the same
tests the `/local` instances run on a directory) run against moto with OML_TEST_S3_BUCKET(_B)
set. Each test works under the prefix <test name>. Afterwards boto3, a client that did not write
the objects, reads what the suite left behind:
  bucket A  MultipartTwelveMiB/obj             pattern(12 MiB), written by the streaming writer
            PutIfAbsent/k                      b"first" (a second put-if-absent answered false)
            CopyBetweenStoresKeepsTheBytes/src pattern(2 * 8 MiB + 12345, seed 7)
  bucket B  CopyBetweenStoresKeepsTheBytes/dst the same bytes, streamed across buckets
"""
import hashlib
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import OML_BIN, start_moto

BLOB_TEST = Path(OML_BIN).resolve().parent / "src" / "blob" / "blob_test"
BUCKET_A = "oml-test-quarantine"
BUCKET_B = "oml-test-bodies"
FILTER = "Backends/ObjectStoreContractTest.*/s3"
MIB = 1 << 20
PART = 8 * MIB  # blob::kWriterPartBytes


def pattern(n, seed=0):
    """blob_test's Pattern(n, seed): byte i is (i + seed) % 251."""
    period = bytes((i + seed) % 251 for i in range(251))
    return (period * (n // 251 + 1))[:n]


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def s3_client(url):
    import boto3
    return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Runs the contract suite against a fresh moto; yields (gtest XML root, boto3 client, the
    test names gtest lists for FILTER)."""
    assert BLOB_TEST.is_file(), f"build the C++ tests first: {BLOB_TEST} is missing"
    proc, url = start_moto()
    try:
        client = s3_client(url)
        client.create_bucket(Bucket=BUCKET_A)
        client.create_bucket(Bucket=BUCKET_B)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true",
               "OML_TEST_S3_BUCKET": BUCKET_A, "OML_TEST_S3_BUCKET_B": BUCKET_B}
        listed = subprocess.run([str(BLOB_TEST), f"--gtest_filter={FILTER}", "--gtest_list_tests"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        names = {line.split("#")[0].strip() for line in listed.stdout.splitlines() if line.startswith("  ")}
        xml = tmp_path_factory.mktemp("blob-s3") / "blob_test.xml"
        run = subprocess.run([str(BLOB_TEST), f"--gtest_filter={FILTER}", f"--gtest_output=xml:{xml}"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        yield ET.parse(xml).getroot(), client, names
    finally:
        proc.terminate()
        proc.wait()


def test_every_contract_test_ran_on_s3_and_passed(suite):
    root, _, names = suite
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == names
    # The ones whose leftovers the tests below inspect, and the rest of the D3 operations.
    assert {"GetRangeEdges/s3", "SizeIsTheObjectLength/s3", "PutIfAbsent/s3", "CopyWithinTheStore/s3",
            "WriterAbortLeavesNothing/s3", "UnfinishedWriterLeavesNoVisibleObject/s3",
            "MultipartTwentyMiBReadsBackIdentical/s3", "MultipartTwelveMiB/s3",
            "CopyBetweenStoresKeepsTheBytes/s3", "OpenBucketReachesTheNamedBucket/s3"} <= names
    for name, case in cases.items():
        # Not skipped (OML_TEST_S3_BUCKET reached the binary) and no failure.
        assert (case.get("status"), case.get("result")) == ("run", "completed"), name
        assert case.find("failure") is None, (name, case.find("failure").get("message"))


def test_streamed_multipart_object_has_the_right_size_digest_and_parts(suite):
    _, s3, _ = suite
    key = "MultipartTwelveMiB/obj"
    head = s3.head_object(Bucket=BUCKET_A, Key=key)
    assert head["ContentLength"] == 12 * MIB
    # A multipart object's ETag ends in -<parts>: 12 MiB in 8 MiB parts is two.
    assert head["ETag"].strip('"').endswith("-2"), head["ETag"]
    assert s3.head_object(Bucket=BUCKET_A, Key=key, PartNumber=1)["ContentLength"] == PART
    assert s3.head_object(Bucket=BUCKET_A, Key=key, PartNumber=2)["ContentLength"] == 12 * MIB - PART
    body = s3.get_object(Bucket=BUCKET_A, Key=key)["Body"].read()
    assert len(body) == 12 * MIB
    assert sha256(body) == sha256(pattern(12 * MIB))


def test_put_if_absent_kept_the_first_bytes(suite):
    _, s3, _ = suite
    assert s3.get_object(Bucket=BUCKET_A, Key="PutIfAbsent/k")["Body"].read() == b"first"
    # The store itself refuses a conditional PUT of a taken key: the suite's `false` came from S3.
    from botocore.exceptions import ClientError
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=BUCKET_A, Key="PutIfAbsent/k", Body=b"third", IfNoneMatch="*")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert s3.get_object(Bucket=BUCKET_A, Key="PutIfAbsent/k")["Body"].read() == b"first"


def test_copy_between_buckets_kept_the_sha256(suite):
    _, s3, _ = suite
    want = pattern(2 * PART + 12345, seed=7)
    src = s3.get_object(Bucket=BUCKET_A, Key="CopyBetweenStoresKeepsTheBytes/src")["Body"].read()
    dst = s3.get_object(Bucket=BUCKET_B, Key="CopyBetweenStoresKeepsTheBytes/dst")["Body"].read()
    assert len(dst) == len(want)
    assert sha256(src) == sha256(dst) == sha256(want)


def test_aborted_and_unfinished_writers_left_no_object_and_no_upload(suite):
    _, s3, _ = suite

    def keys(bucket, prefix):
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]

    assert keys(BUCKET_A, "WriterAbortLeavesNothing/") == []
    assert keys(BUCKET_A, "UnfinishedWriterLeavesNoVisibleObject/") == ["UnfinishedWriterLeavesNoVisibleObject/k"]
    assert s3.get_object(Bucket=BUCKET_A, Key="UnfinishedWriterLeavesNoVisibleObject/k")["Body"].read() == b"old"
    # Abort, and destroying an open writer, abort the multipart upload: no parts left on S3.
    for bucket in (BUCKET_A, BUCKET_B):
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == [], bucket
