"""`oml serve` under hostile clients (issue 7): bounded memory per request, no starvation,
precise refusals, and no row written by any refused request.

Every attack runs against a real server on real PostgreSQL. Memory is read from
/proc/<pid>/status: VmHWM is the server's peak resident set, so a request that was buffered or
inflated even for a moment shows up in it. The stated bound is HWM_GROWTH_BOUND over the peak
measured after a warm-up, for a request body limit of 6 MiB + 64 KiB (max_body_bytes 1 MiB).
"""
import base64
import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
import zlib
from pathlib import Path

import psycopg
import pytest
import requests

from conftest import Deployment

MIB = 1 << 20
MAX_REQUEST = 6 * MIB + 64 * 1024          # http_max_request_bytes for max_body_bytes = 1 MiB
HWM_GROWTH_BOUND = 48 * MIB                 # the body limit, its JSON copy, buffers and slack
REQUEST_TIMEOUT_S = 3                       # OML_HTTP_REQUEST_TIMEOUT_MS below
PAGE_BYTES = 64 * 1024                      # OML_EVENTS_PAGE_MAX_BYTES below (its minimum)


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.strip().endswith("kB"):
                out[k] = int(v.split()[0]) * 1024
    return out


class Raw:
    """One TCP connection speaking raw HTTP/1.1, for requests no HTTP library would send."""

    def __init__(self, port, timeout=10):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes):
        self.s.sendall(data)

    def response(self):
        """(status, headers with lower-case names, body). Raises on a connection closed first."""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before a response; got {self.buf!r}")
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        while len(rest) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                break
            rest += chunk
        self.buf = rest[n:]
        body = rest[:n]
        return status, headers, (json.loads(body) if body and headers.get("content-type", "").endswith("json") else body)

    def closed_by_server(self, timeout=5):
        self.s.settimeout(timeout)
        try:
            while True:
                chunk = self.s.recv(65536)
                if not chunk:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.s.close()


def problem_type(body):
    return body["type"].removeprefix("urn:oml:problem:")


def fresh_home():
    home = Path(tempfile.mkdtemp(prefix="oml-hostile-", dir="/tmp"))
    os.chmod(home, 0o755)  # the postgres system user traverses it to reach pg/
    return home


@pytest.fixture(scope="module")
def hostile():
    home = fresh_home()
    d = Deployment(home, extra_env={
        "OML_MAX_BODY_BYTES": str(MIB),
        "OML_HTTP_REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_S * 1000),
        "OML_EVENTS_PAGE_MAX_BYTES": str(PAGE_BYTES),
        "OML_DB_POOL_SIZE": "8",
        "OML_DB_ACQUIRE_TIMEOUT_MS": "1000",
    })
    d.start_cluster()
    d.init()
    d.tenant_a = d.tenant("acme")
    d.tenant_b = d.tenant("globex")
    d.writer = d.api_key("acme", "writer", "alice")
    d.writer2 = d.api_key("acme", "writer", "bob")
    d.reviewer = d.api_key("acme", "reviewer", "rita")
    d.other_writer = d.api_key("globex", "writer", "gus")
    d.serve()
    # Warm up every path once so that the peak below includes the steady state.
    for _ in range(3):
        assert d.submit(d.writer).status_code == 201
        assert d.get("/v1/events?limit=1000", d.writer).status_code == 200
    d.baseline_hwm = proc_status(d.server.pid)["VmHWM"]
    yield d
    d.close()
    shutil.rmtree(home, ignore_errors=True)


def assert_memory_bounded(d):
    hwm = proc_status(d.server.pid)["VmHWM"]
    growth = hwm - d.baseline_hwm
    assert growth < HWM_GROWTH_BOUND, f"server peak RSS grew by {growth / MIB:.1f} MiB"


def post_head(path, headers, token=None):
    lines = [f"POST {path} HTTP/1.1", "Host: x"] + headers
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# --- 1. Request bodies are bounded before any handler runs ----------------------------------

def test_a_chunked_stream_from_dev_zero_is_cut_at_the_limit_with_413(hostile):
    d = hostile
    before = d.counts()
    c = Raw(d.port)
    c.send(post_head("/v1/claims", ["Transfer-Encoding: chunked", "Content-Type: application/json"]))
    sent = [0]

    def stream():
        chunk = b"%x\r\n" % (64 * 1024) + bytes(64 * 1024) + b"\r\n"
        with open("/dev/zero", "rb") as zero:
            try:
                while sent[0] < 64 * MIB:
                    zero.read(64 * 1024)
                    c.s.sendall(chunk)
                    sent[0] += 64 * 1024
            except OSError:
                pass

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    status, headers, body = c.response()
    assert status == 413
    assert problem_type(body) == "body-too-large"
    assert str(MAX_REQUEST) in body["detail"]
    assert headers["connection"] == "close"
    assert c.closed_by_server()
    t.join(10)
    assert sent[0] < 64 * MIB, "the server kept reading the stream"
    c.close()
    assert d.counts() == before
    assert_memory_bounded(d)


def test_a_gzip_bomb_is_refused_with_415_before_it_is_read(hostile):
    d = hostile
    before = d.counts()
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    zeros = bytes(4 * MIB)
    bomb = b"".join(comp.compress(zeros) for _ in range(256)) + comp.flush()  # 1 GiB of zeros
    assert len(bomb) < 2 * MIB
    for encoding in ("gzip", "deflate", "br", "GZIP"):
        r = requests.post(d.base + "/v1/claims", data=bomb,
                          headers={"Content-Encoding": encoding, "Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 415, (encoding, r.text)
        assert problem_type(r.json()) == "unsupported-content-encoding"
        assert r.headers["Accept-Encoding"] == "identity"
    # Before authentication too: the refusal does not depend on who asks.
    r = requests.post(d.base + "/v1/claims", data=bomb, headers={
        "Content-Encoding": "gzip", "Authorization": f"Bearer {d.writer}"}, timeout=30)
    assert r.status_code == 415
    # identity is no coding at all and is accepted.
    r = requests.post(d.base + "/v1/claims", json={"body": "x", "workarea_id": "wa-1", "path": "a.md",
                                                   "provenance": "human"},
                      headers={"Content-Encoding": "identity", "Authorization": f"Bearer {d.writer}"}, timeout=30)
    assert r.status_code == 201, r.text
    after = d.counts()
    assert after["journal"] == before["journal"] + 1
    assert_memory_bounded(d)


def test_a_post_without_a_length_is_411_where_a_body_is_needed_and_empty_where_it_is_optional(hostile):
    d = hostile
    before = d.counts()
    c = Raw(d.port)
    c.send(post_head("/v1/claims", [], token=d.writer))
    status, headers, body = c.response()
    assert status == 411
    assert problem_type(body) == "length-required"
    c.close()
    assert d.counts() == before
    # Erase takes an optional body: no Content-Length and no Transfer-Encoding is an empty body
    # (RFC 9112 section 6.3), i.e. an erase without a reason.
    art = d.submit(d.writer).json()["artifact_id"]
    c = Raw(d.port)
    c.send(post_head(f"/v1/claims/{art}/erase", [], token=d.writer))
    status, headers, body = c.response()
    assert status == 200, body
    assert body["erased_seq"] is not None
    c.close()


def test_ten_thousand_headers_get_431(hostile):
    d = hostile
    before = d.counts()
    c = Raw(d.port)
    many = [f"X-H{i}: v" for i in range(10000)]
    try:
        c.send(post_head("/v1/claims", many + ["Content-Length: 2"], token=d.writer) + b"{}")
    except OSError:
        pass  # the server may answer and stop reading before all of it is sent
    status, headers, body = c.response()
    assert status == 431
    assert problem_type(body) == "headers-too-large"
    c.close()
    # Few bytes but too many fields, and one long line: 431 as well.
    for hdrs in ([f"X-H{i}: v" for i in range(101)], ["X-Long: " + "a" * (20 * 1024)]):
        c = Raw(d.port)
        c.send(("GET /v1/chain/head HTTP/1.1\r\nHost: x\r\n" + "\r\n".join(hdrs) + "\r\n\r\n").encode())
        status, _, body = c.response()
        assert status == 431, hdrs[0]
        assert problem_type(body) == "headers-too-large"
        c.close()
    assert d.counts() == before
    assert_memory_bounded(d)


def test_a_declared_length_above_the_limit_is_refused_before_the_body_is_sent(hostile):
    d = hostile
    c = Raw(d.port)
    c.send(post_head("/v1/claims", [f"Content-Length: {MAX_REQUEST + 1}"], token=d.writer))
    status, _, body = c.response()  # answered without a byte of the body
    assert status == 413
    assert problem_type(body) == "body-too-large"
    c.close()
    # With Expect: 100-continue the client learns it before sending, and gets no 100.
    c = Raw(d.port)
    c.send(post_head("/v1/claims", [f"Content-Length: {10 * MAX_REQUEST}", "Expect: 100-continue"]))
    status, _, body = c.response()
    assert status == 413
    c.close()


def test_framing_that_could_smuggle_a_request_is_refused(hostile):
    d = hostile
    before = d.counts()
    cases = [
        (["Content-Length: 2", "Transfer-Encoding: chunked"], 400, "malformed-request"),
        (["Transfer-Encoding: gzip, chunked"], 501, "unsupported-transfer-encoding"),
        (["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], 400, "malformed-request"),
        (["Transfer-Encoding: chunked, chunked"], 400, "malformed-request"),
        (["Content-Length: 2", "Content-Length: 3"], 400, "malformed-request"),
        (["Content-Length: -1"], 400, "malformed-request"),
    ]
    for hdrs, status, ptype in cases:
        c = Raw(d.port)
        c.send(post_head("/v1/claims", hdrs, token=d.writer) + b"0\r\n\r\n")
        got, _, body = c.response()
        assert (got, problem_type(body)) == (status, ptype), hdrs
        c.close()
    assert d.counts() == before


def test_a_long_target_is_414_and_trailers_never_become_headers(hostile):
    d = hostile
    # A 16,000-byte path fits the header limit but is refused before routing (whose regex
    # matcher recurses per character).
    c = Raw(d.port)
    c.send(f"GET /v1/claims/{'a' * 16000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, _, body = c.response()
    assert status == 414 and problem_type(body) == "uri-too-long"
    c.close()
    # An Authorization sent as a chunked trailer must not authenticate the request.
    before = d.counts()
    doc = json.dumps({"body": "t", "workarea_id": "wa-1", "path": "a.md", "provenance": "human"}).encode()
    c = Raw(d.port)
    c.send(post_head("/v1/claims", ["Transfer-Encoding: chunked", "Trailer: Authorization"]) +
           b"%x\r\n" % len(doc) + doc + b"\r\n0\r\n" + f"Authorization: Bearer {d.writer}\r\n\r\n".encode())
    status, _, body = c.response()
    assert status == 400 and problem_type(body) == "malformed-request", body
    assert "trailer" in body["detail"]
    c.close()
    assert d.counts() == before


def test_a_method_a_path_does_not_take_is_405_with_allow(hostile):
    d = hostile
    # HEAD goes wherever GET goes (RFC 9110 §9.3.2), so Allow names it with GET.
    for method, path, allow in [("TRACE", "/v1/claims", "GET, HEAD, POST"), ("DELETE", "/v1/chain/head", "GET, HEAD"),
                                ("PUT", "/v1/claims/abc", "GET, HEAD"), ("GET", "/v1/claims/abc/erase", "POST"),
                                ("OPTIONS", "/v1/events", "GET, HEAD")]:
        r = requests.request(method, d.base + path, timeout=10)
        assert r.status_code == 405, (method, path, r.text)
        assert r.headers["Allow"] == allow
        assert problem_type(r.json()) == "method-not-allowed"
    r = requests.get(d.base + "/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and problem_type(r.json()) == "no-route"
    # The metrics are not on the API listener.
    r = requests.get(d.base + "/metrics", timeout=10)
    assert r.status_code == 404 and problem_type(r.json()) == "no-route"


# --- 4. JSON nesting -------------------------------------------------------------------------

def test_deeply_nested_json_is_refused_before_it_is_built(hostile):
    d = hostile
    before = d.counts()
    r = d.post("/v1/claims", d.writer, data=b"[" * (6 * MIB), headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert problem_type(r.json()) == "json-too-deep"
    deep = {"body": "x", "workarea_id": "wa-1", "path": "a.md", "provenance": "human"}
    inner = "x"
    for _ in range(40):
        inner = [inner]
    deep["extra"] = inner
    r = d.post("/v1/claims", d.writer, json=deep)
    assert r.status_code == 400 and problem_type(r.json()) == "json-too-deep"
    # By any role, on the other body-taking route too.
    r = d.post("/v1/claims/x/erase", d.reviewer, data=b"{\"reason\":" + b"[" * MIB, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and problem_type(r.json()) == "json-too-deep"
    assert d.counts() == before
    assert_memory_bounded(d)


# --- 3. Fields that end up signed for ever ---------------------------------------------------

def test_five_megabyte_fields_are_refused(hostile):
    d = hostile
    before = d.counts()
    r = d.submit(d.writer, media_type="text/" + "a" * (5 * 1000 * 1000))
    assert r.status_code == 400, r.text[:300]
    assert problem_type(r.json()) == "invalid-field"
    assert "media_type" in r.json()["detail"]
    art = d.submit(d.writer).json()["artifact_id"]
    mid = d.counts()
    r = d.post(f"/v1/claims/{art}/erase", d.writer, json={"reason": "r" * (5 * 1000 * 1000)})
    assert r.status_code == 400, r.text[:300]
    assert problem_type(r.json()) == "invalid-field"
    assert "reason" in r.json()["detail"]
    assert d.counts() == mid
    assert mid["journal"] == before["journal"] + 1


def test_an_events_page_stays_under_its_byte_bound(hostile):
    d = hostile
    for _ in range(150):
        assert d.submit(d.writer).status_code == 201
    seen, after, pages = [], 0, 0
    while True:
        r = d.get(f"/v1/events?after={after}&limit=1000", d.reviewer)
        assert r.status_code == 200
        page = r.json()
        signed = sum(len(base64.b64decode(e["signed_bytes"])) + len(base64.b64decode(e["signature"]))
                     for e in page["events"])
        assert len(r.content) < 2 * PAGE_BYTES, len(r.content)
        if not page["events"]:
            break
        assert signed <= PAGE_BYTES or len(page["events"]) == 1
        seen += [e["seq"] for e in page["events"]]
        after = page["next_after"]
        pages += 1
    assert pages >= 2, "the byte bound never cut a page"
    assert seen == list(range(1, len(seen) + 1))  # no event lost between pages
    assert len(seen) >= 150


# --- 2. Starvation ---------------------------------------------------------------------------

def test_slow_clients_do_not_starve_others_and_are_cut_at_the_request_deadline(hostile):
    d = hostile
    slow = []
    for _ in range(64):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
        s.sendall(b"G")
        slow.append(s)
    stop = threading.Event()

    def drip():
        while not stop.wait(3):
            for s in slow:
                try:
                    s.sendall(b"E")
                except OSError:
                    pass

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        r = requests.get(d.base + "/v1/chain/head", headers={"Authorization": f"Bearer {d.writer}"}, timeout=5)
        elapsed = time.monotonic() - t0
        assert r.status_code == 200
        assert elapsed < 1.0, f"an authenticated request waited {elapsed:.2f} s behind 64 slow clients"
        # The whole request must arrive within the deadline, however slowly it trickles: each
        # slow client gets 408 and a closed connection, within the deadline plus a second.
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 1.5
        for s in slow:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            data = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except ConnectionResetError:
                pass
            assert data.startswith(b"HTTP/1.1 408 "), data[:80]
            assert b"request-timeout" in data
    finally:
        stop.set()
        for s in slow:
            s.close()


def read_responses(s, n, timeout=10):
    """Reads n HTTP/1.1 responses with Content-Length bodies from s: [(status, body bytes)]."""
    s.settimeout(timeout)
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, f"connection closed after {len(out)} responses: {data[:200]!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = 0
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while len(rest) < length:
            chunk = s.recv(65536)
            assert chunk, "connection closed mid-body"
            rest += chunk
        out.append((int(lines[0].split()[1]), rest[:length]))
        data = rest[length:]
    return out


def claim_request(token, body_text):
    doc = json.dumps({"body": body_text, "workarea_id": "wa-1", "path": "notes/p.md",
                      "provenance": "human"}).encode()
    head = post_head("/v1/claims", ["Content-Type: application/json", f"Content-Length: {len(doc)}"], token)
    return head, doc


# --- Bodies with a Content-Length are read straight into the request (http.cc ReadSizedBody) ---
def test_sized_bodies_pipelined_split_or_trickled_arrive_whole_and_in_order(hostile):
    """Three requests in one send (the second's body begins in the read buffer that held the
    first's header; nothing of the third is read as the second's body); then a body sent a byte
    at a time; then a 200 KiB body split at odd places: each claim is stored with exactly its
    text, in the order sent, on one keep-alive connection."""
    d = hostile
    texts = [f"pipelined {i} " + secrets.token_hex(8) for i in range(3)]
    texts.append("trickled " + secrets.token_hex(8))
    texts.append("large " + "x" * (200 * 1024))
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(b"".join(h + b for h, b in (claim_request(d.writer, t) for t in texts[:3])))
        got = read_responses(s, 3)
        head, body = claim_request(d.writer, texts[3])
        s.sendall(head)
        for i in range(len(body)):
            s.sendall(body[i:i + 1])
            if i % 16 == 0:
                time.sleep(0.001)
        got += read_responses(s, 1)
        head, body = claim_request(d.writer, texts[4])
        for cut in (head + body[:1], body[1:70001], body[70001:70002], body[70002:]):
            s.sendall(cut)
            time.sleep(0.01)
        got += read_responses(s, 1)
    assert [st for st, _ in got] == [201] * 5, got
    for (_, answer), text in zip(got, texts):
        artifact = json.loads(answer)["artifact_id"]
        assert d.get(f"/v1/claims/{artifact}", d.writer).json()["body"] == text, artifact


def test_a_sized_body_that_stops_is_408_at_the_deadline_and_one_cut_off_is_dropped(hostile):
    """Half a declared body, then silence: 408 request-timeout within the deadline plus a
    second, and no claim. A client that closes mid-body: nothing stored, and the server goes on."""
    d = hostile
    before = d.counts()
    head, body = claim_request(d.writer, "never finished " + "y" * 5000)
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(head + body[:len(body) // 2])
        status, problem = read_responses(s, 1, timeout=REQUEST_TIMEOUT_S + 2)[0]
        elapsed = time.monotonic() - t0
    assert status == 408 and json.loads(problem)["type"].endswith("request-timeout"), (status, problem)
    assert REQUEST_TIMEOUT_S - 0.5 < elapsed < REQUEST_TIMEOUT_S + 1.0, elapsed
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(head + body[:100])
    assert d.submit(d.writer).status_code == 201
    after = d.counts()
    assert after["journal"] == before["journal"] + 1, (before["journal"], after["journal"])


def test_declared_lengths_that_never_arrive_hold_no_memory(hostile):
    """64 connections each declare the largest body the transport takes and send 10 bytes of it:
    the server's peak RSS stays within the bound (the body's string grows with what arrived, never
    to the declared length up front: 64 x 6 MiB would be 390 MiB), and each gets 408 at the deadline."""
    d = hostile
    conns = []
    try:
        for _ in range(64):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            s.sendall(post_head("/v1/claims", ["Content-Type: application/json",
                                               f"Content-Length: {MAX_REQUEST}"], d.writer) + b'{"body": "')
            conns.append(s)
        time.sleep(1.0)
        assert_memory_bounded(d)
        for s in conns:
            status, _ = read_responses(s, 1, timeout=REQUEST_TIMEOUT_S + 2)[0]
            assert status == 408
    finally:
        for s in conns:
            s.close()
    assert d.submit(d.writer).status_code == 201


def test_an_idle_keep_alive_connection_is_closed_at_the_request_deadline(hostile):
    d = hostile
    c = Raw(d.port)
    get = f"GET /v1/chain/head HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.writer}\r\n\r\n".encode()
    c.send(get)
    assert c.response()[0] == 200
    t0 = time.monotonic()
    assert c.closed_by_server(timeout=REQUEST_TIMEOUT_S + 2)  # idle: closed, no 408 for nothing
    assert REQUEST_TIMEOUT_S - 0.5 < time.monotonic() - t0 < REQUEST_TIMEOUT_S + 2
    assert c.buf == b""
    c.close()


def test_connections_and_keep_alive_are_capped():
    home = fresh_home()
    d = Deployment(home, extra_env={
        "OML_HTTP_MAX_CONNECTIONS": "8", "OML_HTTP_KEEPALIVE_REQUESTS": "3"})
    try:
        d.start_cluster()
        d.init()
        d.tenant("acme")
        token = d.api_key("acme")
        d.serve()
        time.sleep(0.3)  # the readiness probe's connection has gone
        held = [Raw(d.port) for _ in range(8)]
        time.sleep(0.2)
        extra = Raw(d.port)
        extra.send(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = extra.response()
        assert status == 503 and problem_type(body) == "too-many-connections"
        assert headers["retry-after"] == "1"
        extra.close()
        for h in held:
            h.close()
        time.sleep(0.3)
        c = Raw(d.port)
        get = f"GET /v1/chain/head HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
        for i in range(3):
            c.send(get)
            status, headers, _ = c.response()
            assert status == 200
            assert headers.get("connection", "keep-alive") == ("close" if i == 2 else "keep-alive"), (i, headers)
        assert c.closed_by_server()
        c.close()
    finally:
        d.close()
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def slow_authenticate(d, seconds):
    """Makes every oml.authenticate call sleep `seconds` first (as a superuser could, or as a
    loaded database would), and restores the function afterwards."""
    su = d.su()
    su.execute(f"""
        ALTER FUNCTION oml.authenticate(bytea) RENAME TO authenticate_fast;
        CREATE FUNCTION oml.authenticate(p_hash bytea, OUT tenant_id uuid, OUT principal text, OUT role text)
          LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
          SELECT a.tenant_id, a.principal, a.role FROM pg_sleep({seconds}) s, oml.authenticate_fast(p_hash) a $$;
        GRANT EXECUTE ON FUNCTION oml.authenticate(bytea) TO oml_app;
    """)
    try:
        yield
    finally:
        su.execute("""
            DROP FUNCTION oml.authenticate(bytea);
            ALTER FUNCTION oml.authenticate_fast(bytea) RENAME TO authenticate;
        """)
        su.close()


def test_random_token_floods_do_not_hang_another_tenants_writes(hostile):
    """200 concurrent requests with random tokens while each token lookup takes 2 s: the other
    tenant's writes each end in 201 or 503 database-busy (with Retry-After) within
    WRITE_DEADLINE_S, and the flood's requests end in 401 or 503 database-busy, none hanging.
    (Before the pool had shares and a deadline, the flood held every connection and a write
    waited behind 200 x 2 s / 8 connections.)"""
    WRITE_DEADLINE_S = 5.0
    d = hostile
    assert d.submit(d.other_writer).status_code == 201  # its token is now cached
    results, writes = [], []
    with slow_authenticate(d, 2):
        def flood():
            t0 = time.monotonic()
            try:
                r = requests.get(d.base + "/v1/chain/head",
                                 headers={"Authorization": f"Bearer oml_{secrets.token_urlsafe(32)}"}, timeout=60)
                results.append((r.status_code, r.json().get("type"), time.monotonic() - t0))
            except requests.RequestException as e:
                results.append((None, repr(e), time.monotonic() - t0))

        threads = [threading.Thread(target=flood) for _ in range(200)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        for _ in range(10):
            t0 = time.monotonic()
            r = d.submit(d.other_writer)
            writes.append((r.status_code, r.headers.get("Retry-After"), r.json().get("type"), time.monotonic() - t0))
        for t in threads:
            t.join(60)
    for status, retry, ptype, took in writes:
        assert took < WRITE_DEADLINE_S, writes
        assert status in (201, 503), writes
        if status == 503:
            assert ptype == "urn:oml:problem:database-busy" and retry == "1", writes
    assert sum(1 for w in writes if w[0] == 201) >= 8, writes
    assert len(results) == 200
    assert all(s in (401, 503) for s, _, _ in results), [r for r in results if r[0] not in (401, 503)][:5]
    assert any(s == 503 and t == "urn:oml:problem:database-busy" for s, t, _ in results)
    assert max(took for _, _, took in results) < 30


def test_an_unknown_token_is_answered_from_the_cache_the_second_time(hostile):
    d = hostile
    token = "oml_" + secrets.token_urlsafe(32)
    with slow_authenticate(d, 1):
        t0 = time.monotonic()
        r1 = d.get("/v1/chain/head", token)
        first = time.monotonic() - t0
        t0 = time.monotonic()
        r2 = d.get("/v1/chain/head", token)
        second = time.monotonic() - t0
    assert (r1.status_code, r2.status_code) == (401, 401)
    assert problem_type(r2.json()) == "unauthenticated"
    assert first >= 1.0  # went to the database
    assert second < 0.3, second  # did not


# --- 5. Who may read what --------------------------------------------------------------------

def test_writer_b_learns_nothing_about_writer_a_s_held_claim(hostile):
    d = hostile
    secret_path = "secret/" + secrets.token_hex(8) + ".md"
    secret_wa = "wa-" + secrets.token_hex(6)
    a = d.submit(d.writer, body="alice's draft", path=secret_path, workarea_id=secret_wa)
    assert a.status_code == 201
    art = a.json()["artifact_id"]
    digest = a.json()["plaintext_sha256"]
    missing = "0" * len(art) if len(art) != 36 else "00000000-0000-4000-8000-000000000000"
    before = d.counts()

    def same_as_missing(r, r_missing):
        assert r.status_code == r_missing.status_code == 404
        ra, rb = r.json(), r_missing.json()
        assert (ra["type"], ra["title"], ra["status"]) == (rb["type"], rb["title"], rb["status"])
        # The detail echoes only the id the caller sent, exactly as for an id that never existed.
        assert ra["detail"].replace(art, "<id>") == rb["detail"].replace(missing, "<id>")
        assert secret_path not in ra["detail"] and "alice" not in ra["detail"]

    same_as_missing(d.get(f"/v1/claims/{art}", d.writer2), d.get(f"/v1/claims/{missing}", d.writer2))
    same_as_missing(d.post(f"/v1/claims/{art}/erase", d.writer2, json={"reason": "x"}),
                    d.post(f"/v1/claims/{missing}/erase", d.writer2, json={"reason": "x"}))
    assert d.counts() == before

    def page_bytes(token):
        out, after = [], 0
        while True:
            r = d.get(f"/v1/events?after={after}&limit=1000", token)
            assert r.status_code == 200
            page = r.json()
            out += [base64.b64decode(e["signed_bytes"]) for e in page["events"]]
            if not page["events"] or page["next_after"] == after:
                return out
            after = page["next_after"]

    bob = b"".join(page_bytes(d.writer2))
    for secret in (art, secret_path, secret_wa, digest, "alice"):
        assert secret.encode() not in bob, secret
    # The author and a reviewer do see it.
    for token in (d.writer, d.reviewer):
        seen = b"".join(page_bytes(token))
        assert art.encode() in seen and secret_path.encode() in seen
