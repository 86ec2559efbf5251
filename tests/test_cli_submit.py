"""`oml claim submit` (src/cli/claim_submit.h), the CLI client of attachments (issue 9): the real
binary against a real `oml serve` on real PostgreSQL.

What the server took is read from the server, never from the client's own words: HEAD of each
session, the session rows, the stored object decrypted from the KEK file (test_uploads), and the
server's request counter (oml_http_requests_total), which says exactly how many chunks were
sent and how each was answered. A chunk sent twice would show as a 409 or an extra 204.
"""
import hashlib
import json
import os
import pty
import re
import select
import subprocess
import time

import pytest
import requests

from conftest import OML_BIN, free_port
from test_uploads import decrypted, row

KIB = 1024
TUS = {"Tus-Resumable": "1.0.0"}


def data_file(tmp_path, name, size, seed):
    """A file of `size` pseudo-random bytes (deterministic by seed); returns (path, bytes)."""
    out, block = bytearray(), hashlib.sha256(f"seed-{seed}".encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    data = bytes(out[:size])
    p = tmp_path / name
    p.write_bytes(data)
    return p, data


def submit(d, *args, token=None, timeout=120, env=None):
    e = {"OML_API_KEY": d.writer if token is None else token}
    e.update(env or {})
    return d.run("claim", "submit", *args, check=False, env=e, timeout=timeout)


def patch_statuses(d):
    """{status: count} of PATCH requests since the server started."""
    out = {}
    for line in d.metrics().splitlines():
        if line.startswith("oml_http_requests_total{") and 'method="PATCH"' in line:
            status = re.search(r'status="(\d+)"', line).group(1)
            out[int(status)] = out.get(int(status), 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def answered(d, status):
    """Requests of any method and route answered with `status` since the server started (a
    request refused from its header alone, e.g. 413 for its Content-Length, is counted before its
    method and route are known)."""
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in d.metrics().splitlines()
               if line.startswith("oml_http_requests_total{") and f'status="{status}"' in line)


def head(d, location, token=None):
    return requests.head(d.base + location, headers={**TUS, "Authorization": f"Bearer {token or d.writer}"}, timeout=30)


def state_files(d):
    p = d.home / "uploads"
    return sorted(p.iterdir()) if p.exists() else []


def chunks(size, chunk):
    return -(-size // chunk)


def only_uploads(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["uploads"]


# --- uploads --------------------------------------------------------------------------------

def test_uploads_two_files_in_small_chunks(served, tmp_path):
    d = served
    a, a_data = data_file(tmp_path, "a.bin", 300_000, 1)
    b, b_data = data_file(tmp_path, "notes.md", 70_000, 2)
    p = submit(d, "--upload-only", "--chunk-size", "64KiB", "--file", str(a), "--file", str(b))
    ups = only_uploads(p)
    assert [u["filename"] for u in ups] == ["a.bin", "notes.md"]
    assert [u["size"] for u in ups] == [300_000, 70_000]
    assert [u["sha256"] for u in ups] == [hashlib.sha256(a_data).hexdigest(), hashlib.sha256(b_data).hexdigest()]
    assert [u["media_type"] for u in ups] == ["application/octet-stream", "text/markdown"]
    for u, data in zip(ups, (a_data, b_data)):
        assert u["location"] == "/v1/uploads/" + u["upload_id"]
        h = head(d, u["location"])
        assert h.status_code == 200
        assert h.headers["Upload-Offset"] == h.headers["Upload-Length"] == str(len(data))
        r = row(d, u["upload_id"])
        assert r["state"] == "complete"
        assert bytes(r["declared_sha256"]) == hashlib.sha256(data).digest()
        assert decrypted(d, u["upload_id"]) == data
    # Exactly one PATCH per chunk, each taken.
    assert patch_statuses(d) == {204: chunks(300_000, 64 * KIB) + chunks(70_000, 64 * KIB)}
    # Plain progress lines (stderr is not a terminal), and what was uploaded.
    assert f"uploading a.bin (300000 bytes) as upload {ups[0]['upload_id']}" in p.stderr
    assert f"uploaded notes.md: upload {ups[1]['upload_id']}, 70000 bytes, sha256 {ups[1]['sha256']}" in p.stderr
    assert "a.bin: 300000/300000 bytes (100%)" in p.stderr
    assert "\r" not in p.stderr
    # One private state file per upload; the token is in none of them.
    files = state_files(d)
    assert len(files) == 2
    assert oct((d.home / "uploads").stat().st_mode & 0o777) == "0o700"
    for f in files:
        assert oct(f.stat().st_mode & 0o777) == "0o600"
        assert d.writer not in f.read_text()

    # A second run finds both uploads complete: nothing is sent again.
    again = only_uploads(submit(d, "--upload-only", "--chunk-size", "64KiB", "--file", str(a), "--file", str(b)))
    assert [u["upload_id"] for u in again] == [u["upload_id"] for u in ups]
    assert "a.bin: already uploaded" in submit(d, "--upload-only", "--file", str(a)).stderr
    assert patch_statuses(d) == {204: 7}


def test_interrupted_upload_resumes_at_the_servers_offset(served, tmp_path):
    d = served
    size, chunk = 1024 * KIB + 123, 64 * KIB
    f, data = data_file(tmp_path, "big.bin", size, 3)
    args = ("--upload-only", "--chunk-size", str(chunk), "--file", str(f))
    first = submit(d, *args, "--test-kill-after-chunks", "5")
    assert first.returncode == -9, first.stderr  # SIGKILL: nothing ran after the fifth chunk
    [state] = state_files(d)
    location = json.loads(state.read_text())["location"]
    h = head(d, location)
    assert h.status_code == 200
    assert h.headers["Upload-Offset"] == str(5 * chunk)
    assert patch_statuses(d) == {204: 5}

    second = submit(d, *args)
    [u] = only_uploads(second)
    assert u["location"] == location  # the same session, continued
    assert f"resuming big.bin at byte {5 * chunk} of {size} (upload {u['upload_id']})" in second.stderr
    # 17 chunks in all: the first five were not sent again (no 409, no extra 204).
    assert patch_statuses(d) == {204: chunks(size, chunk)}
    assert decrypted(d, u["upload_id"]) == data


def test_resume_after_server_restart_retries_until_it_is_back(served, tmp_path):
    d = served
    size, chunk = 600_000, 64 * KIB
    f, data = data_file(tmp_path, "r.bin", size, 4)
    args = ("--upload-only", "--chunk-size", str(chunk), "--file", str(f), "--retries", "10")
    assert submit(d, *args, "--test-kill-after-chunks", "3").returncode == -9
    d.stop_server()
    # The client starts while the server is down: it retries (backoff) until the server is back.
    env = dict(d.env, OML_API_KEY=d.writer)
    proc = subprocess.Popen([OML_BIN, "claim", "submit", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert proc.poll() is None
    d.serve()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    [u] = json.loads(out)["uploads"]
    assert re.search(r"retrying in \d+ ms \(1/10\): cannot reach the server at http://127\.0\.0\.1:\d+: connect", err), err
    assert f"resuming r.bin at byte {3 * chunk} of {size}" in err
    # The restarted server counted only the chunks after the third.
    assert patch_statuses(d) == {204: chunks(size, chunk) - 3}
    assert decrypted(d, u["upload_id"]) == data


def test_a_session_that_is_gone_starts_over(served, tmp_path):
    d = served
    size, chunk = 400_000, 64 * KIB
    f, data = data_file(tmp_path, "g.bin", size, 5)
    args = ("--upload-only", "--chunk-size", str(chunk), "--file", str(f))
    assert submit(d, *args, "--test-kill-after-chunks", "2").returncode == -9
    [state] = state_files(d)
    old = json.loads(state.read_text())["location"]
    r = requests.delete(d.base + old, headers={**TUS, "Authorization": f"Bearer {d.writer}"}, timeout=30)
    assert r.status_code == 204  # tus termination: the session answers 404 from now on
    p = submit(d, *args)
    [u] = only_uploads(p)
    assert u["location"] != old
    assert f"g.bin: upload {old.rsplit('/', 1)[1]} cannot be continued, starting over: HTTP 404 (HEAD {old})" in p.stderr
    assert patch_statuses(d) == {204: 2 + chunks(size, chunk)}
    assert decrypted(d, u["upload_id"]) == data
    # Another key's state is its own: the same file with another key is a new session.
    other = only_uploads(submit(d, *args, token=d.writer2))
    assert other[0]["upload_id"] != u["upload_id"]


def test_a_chunk_above_the_servers_limit_is_halved(served, tmp_path):
    d = served
    d.stop_server()
    d.serve(env={"OML_HTTP_MAX_REQUEST_BYTES": "150000"})
    size = 600_000
    f, data = data_file(tmp_path, "h.bin", size, 6)
    p = submit(d, "--upload-only", "--chunk-size", "512KiB", "--file", str(f))
    [u] = only_uploads(p)
    assert "h.bin: the server refused a 524288-byte chunk (413 body-too-large): sending 262144-byte chunks" in p.stderr
    assert "h.bin: the server refused a 262144-byte chunk (413 body-too-large): sending 131072-byte chunks" in p.stderr
    assert answered(d, 413) == 2
    assert patch_statuses(d) == {204: chunks(size, 131072)}
    assert decrypted(d, u["upload_id"]) == data


def test_progress_bar_on_a_terminal(served, tmp_path):
    d = served
    f, _ = data_file(tmp_path, "t.bin", 200_000, 7)
    master, slave = pty.openpty()
    env = dict(d.env, OML_API_KEY=d.writer)
    proc = subprocess.Popen([OML_BIN, "claim", "submit", "--upload-only", "--chunk-size", "64KiB", "--file", str(f)],
                            env=env, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0
    err = b""
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    text = err.decode(errors="replace")
    assert json.loads(out)["uploads"][0]["size"] == 200_000
    # Redrawn in place: bytes/total and a rate.
    assert re.search(r"\r\x1b\[Kuploading t\.bin +\[#+ *\] 100% 195\.3 KiB/195\.3 KiB [0-9.]+ [KMG]?i?B/s", text), text
    assert "uploaded t.bin: upload" in text


# --- refusals -------------------------------------------------------------------------------

def test_refusals_and_their_exit_codes(served, tmp_path):
    d = served
    f, _ = data_file(tmp_path, "x.bin", 1000, 8)
    wa = ("--workarea", "wa-1", "--path", "notes/x.md")
    # A revoked or unknown key: 401, exit 7.
    p = submit(d, "--file", str(f), *wa, token="oml_" + "0" * 40)
    assert p.returncode == 7, p.stderr
    assert "oml: unauthenticated(unauthenticated):" in p.stderr
    # A reviewer may not upload: 403 forbidden-role, exit 7.
    p = submit(d, "--file", str(f), *wa, token=d.reviewer)
    assert p.returncode == 7, p.stderr
    assert "(forbidden-role)" in p.stderr and "POST /v1/uploads" in p.stderr
    # A missing file: exit 6, before anything is sent.
    p = submit(d, "--file", str(tmp_path / "nope.bin"), *wa)
    assert p.returncode == 6, p.stderr
    # No API key anywhere: exit 2.
    p = submit(d, "--file", str(f), *wa, env={"OML_API_KEY": ""})
    assert p.returncode == 2 and "no API key" in p.stderr, p.stderr
    # https is not spoken (TLS ends at the proxy): exit 2 with the advice.
    p = submit(d, "--file", str(f), *wa, "--server", "https://oml.example.com")
    assert p.returncode == 2 and "plain HTTP" in p.stderr, p.stderr
    # Chunks below 64 KiB, missing --workarea: usage, exit 2.
    assert submit(d, "--file", str(f), *wa, "--chunk-size", "1000").returncode == 2
    assert submit(d, "--file", str(f), "--path", "p").returncode == 2
    assert patch_statuses(d) == {}


def test_an_unreachable_server_is_given_up_after_the_retries(deployment, tmp_path):
    d = deployment
    f, _ = data_file(tmp_path, "u.bin", 1000, 9)
    t0 = time.time()
    p = d.run("claim", "submit", "--file", str(f), "--workarea", "w", "--path", "p", "--retries", "2",
              "--server", f"http://127.0.0.1:{free_port()}", check=False, env={"OML_API_KEY": "k"})
    assert p.returncode == 5, p.stderr
    assert "(server-unreachable)" in p.stderr
    assert p.stderr.count("retrying in") == 2
    assert time.time() - t0 < 10  # 0.5 s + 1 s of backoff


# --- the claim ------------------------------------------------------------------------------

def test_submit_a_body_only_claim(served, tmp_path):
    d = served
    body = tmp_path / "body.md"
    body.write_text("hello from the CLI\n")
    p = submit(d, "--body-file", str(body), "--workarea", "wa-1", "--path", "notes/cli.md", "--provenance", "agent",
               "--body-media-type", "text/markdown")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["state"], out["workarea_id"], out["path"], out["provenance"], out["media_type"]) == \
        ("held", "wa-1", "notes/cli.md", "agent", "text/markdown")
    assert out["plaintext_sha256"] == hashlib.sha256(b"hello from the CLI\n").hexdigest()
    rf = tmp_path / "receipt.json"
    rf.write_text(p.stdout)
    assert d.run("verify-receipt", str(rf)).stdout.startswith("receipt OK")


def test_submit_a_claim_with_two_attachments(served, tmp_path):
    d = served
    a, a_data = data_file(tmp_path, "a.bin", 200_000, 10)
    b, b_data = data_file(tmp_path, "b.json", 5_000, 11)
    p = submit(d, "--file", str(a), "--file", str(b), "--body", "see the attached files", "--workarea", "wa-2",
               "--path", "reports/r1.md", "--chunk-size", "64KiB")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["state"], out["workarea_id"], out["path"], out["provenance"]) == ("held", "wa-2", "reports/r1.md", "human")
    assert isinstance(out["receipt"]["seq"], int)
    # Both files are attached, in order, with their plaintext digests (the author sees them).
    got = d.get(f"/v1/claims/{out['artifact_id']}", d.writer)
    assert got.status_code == 200, got.text
    atts = sorted(got.json()["attachments"], key=lambda x: x["ordinal"])
    assert [(x["filename"], x["media_type"], x["size"], x["plaintext_sha256"]) for x in atts] == [
        ("a.bin", "application/octet-stream", 200_000, hashlib.sha256(a_data).hexdigest()),
        ("b.json", "application/json", 5_000, hashlib.sha256(b_data).hexdigest()),
    ]
    rf = tmp_path / "receipt.json"
    rf.write_text(p.stdout)
    assert d.run("verify-receipt", str(rf)).stdout.startswith("receipt OK")
    # Attached: their sessions are not remembered any more.
    assert state_files(d) == []
    assert patch_statuses(d) == {204: chunks(200_000, 64 * KIB) + 1}


def test_the_same_bytes_twice_get_a_session_each(served, tmp_path):
    d = served
    a, data = data_file(tmp_path, "one.txt", 100_000, 12)
    b = tmp_path / "two.txt"
    b.write_bytes(data)
    ups = only_uploads(submit(d, "--upload-only", "--chunk-size", "64KiB", "--file", str(a), "--file", str(b)))
    assert len({u["upload_id"] for u in ups}) == 2
    assert {u["sha256"] for u in ups} == {hashlib.sha256(data).hexdigest()}
    assert patch_statuses(d) == {204: 2 * chunks(100_000, 64 * KIB)}
    for u in ups:
        assert decrypted(d, u["upload_id"]) == data


def test_a_rerun_after_a_lost_answer_gets_the_same_receipt(served, tmp_path):
    """The claim is committed but its answer is lost (the client dies before reading it: hidden
    --test-kill-after-claim). The re-run asks again with the remembered Idempotency-Key and upload
    ids; the server replays the first receipt instead of committing a second claim."""
    d = served
    f, _ = data_file(tmp_path, "c.csv", 90_000, 13)
    args = ("--file", str(f), "--body", "figures", "--workarea", "wa-3", "--path", "data/c.md", "--chunk-size", "64KiB")
    first = submit(d, *args, "--test-kill-after-claim")
    assert first.returncode == -9, first.stderr
    assert first.stdout == ""
    claim_states = [p for p in state_files(d) if p.name.endswith(".claim.json")]
    assert len(claim_states) == 1 and len(state_files(d)) == 2
    remembered = json.loads(claim_states[0].read_text())
    assert set(remembered) == {"idempotency_key", "attachments"}  # never the body or the token
    second = submit(d, *args)
    assert second.returncode == 0, second.stderr
    assert "an earlier run submitted this claim without getting its answer: asking again" in second.stderr
    assert "the server replayed the receipt of this claim's earlier submission" in second.stderr
    out = json.loads(second.stdout)
    assert out["workarea_id"] == "wa-3"
    assert patch_statuses(d) == {204: 2}  # nothing uploaded again
    assert state_files(d) == []
    with d.su() as c:
        assert c.execute("SELECT count(*) FROM oml.artifacts WHERE workarea_id = 'wa-3'").fetchone()[0] == 1
    # A third run is a new claim (its own uploads).
    third = submit(d, *args)
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["artifact_id"] != out["artifact_id"]
