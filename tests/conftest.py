"""Black-box test harness: real PostgreSQL (a private cluster started through `oml cluster
start`, run as the `postgres` system user when root), the real `oml` binary, real HTTP.

A `Deployment` is one OML_HOME with its own cluster, keys, object store and lake.
"""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
import requests

OML_BIN = os.environ.get("OML_BIN") or str(Path(__file__).resolve().parents[1] / "build" / "oml")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto():
    """moto's S3 server (real HTTP, S3 protocol) on a free loopback port; returns (process,
    endpoint URL) once it answers."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            # moto loads its backends on the first request: on a loaded machine that answer can
            # take seconds (a ReadTimeout, not a ConnectionError), so both are waited out.
            requests.get(url, timeout=5)
            return p, url
        except (requests.ConnectionError, requests.Timeout):
            if time.time() > deadline or p.poll() is not None:
                p.kill()
                raise
            time.sleep(0.1)


class Deployment:
    def __init__(self, home: Path, extra_env=None):
        self.home = home
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.metrics_port = free_port()
        self.metrics_base = f"http://127.0.0.1:{self.metrics_port}"
        self.env = dict(os.environ)
        self.env.update({
            "OML_HOME": str(home),
            "OML_LISTEN": f"127.0.0.1:{self.port}",
            "OML_METRICS_LISTEN": f"127.0.0.1:{self.metrics_port}",
            # Several lake writers run at once in some tests: each picks a free port and logs it.
            "OML_LAKEWRITER_METRICS_LISTEN": "127.0.0.1:0",
            "OML_HEAD_PUBLISH_MS": "50",
            "OML_LOG_LEVEL": "warn",
            # The private cluster has no standbys: servers in tests run with reduced durability
            # (tests/test_durability.py turns it off to test the production gate).
            "OML_REDUCED_DURABILITY": "1",
            # Tests upload in chunks of any size (segment edges: 1, 65535 bytes); the 1 MiB
            # default minimum of a chunk that does not end its upload is tested on its own
            # (tests/test_upload_quotas.py).
            "OML_UPLOAD_MIN_CHUNK_BYTES": "0",
        })
        self.env.pop("OML_DATABASE_URL", None)
        self.env.update(extra_env or {})
        self.server = None
        self.server_log = None

    # --- commands -------------------------------------------------------------------------
    def run(self, *args, check=True, env=None, timeout=300):
        e = dict(self.env)
        e.update(env or {})
        p = subprocess.run([OML_BIN, *args], env=e, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"oml {' '.join(args)} exited {p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}")
        return p

    def start_cluster(self):
        out = self.run("cluster", "start").stdout.strip()
        self.superuser_url = out.splitlines()[-1]
        return self.superuser_url

    def stop_cluster(self):
        self.run("cluster", "stop", check=False)

    def init(self):
        return self.run("init")

    def su(self):
        """A superuser connection (autocommit)."""
        return psycopg.connect(self.superuser_url, autocommit=True)

    def wait_indexed(self, timeout=30):
        """Waits until the server's search indexer has worked off every promotion queued so far
        (sql/0028: the index is built after the accept commits, within about 250 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.su() as c:
                left = c.execute("SELECT count(*) FROM oml.search_queue").fetchone()[0]
            if left == 0:
                return
            assert time.monotonic() < deadline, f"{left} promoted versions still not indexed after {timeout} s"
            time.sleep(0.05)

    def app_url(self):
        return (self.home / "pg" / "app.url").read_text().strip()

    def app(self):
        return psycopg.connect(self.app_url(), autocommit=True)

    def tenant(self, name):
        return json.loads(self.run("tenant", "create", name).stdout)["tenant_id"]

    def api_key(self, tenant, role="writer", principal=None):
        args = ["key", "create", "--tenant", tenant, "--role", role]
        if principal:
            args += ["--principal", principal]
        return self.run(*args).stdout.strip()

    # --- server ---------------------------------------------------------------------------
    def serve(self, env=None, args=()):
        assert self.server is None
        e = dict(self.env)
        e.update(env or {})
        self.server_log = open(self.home / "serve.log", "ab")
        self.server = subprocess.Popen([OML_BIN, "serve", *args], env=e, stdout=self.server_log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.server.poll() is not None:
                raise AssertionError(f"oml serve exited {self.server.returncode}: {self.log_text()}")
            try:
                requests.get(self.base + "/v1/health", timeout=1)
                return
            except requests.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("oml serve did not come up: " + self.log_text())

    def stop_server(self):
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None
            self.server_log.close()

    def log_text(self):
        p = self.home / "serve.log"
        return p.read_text(errors="replace") if p.exists() else ""

    # --- HTTP -----------------------------------------------------------------------------
    def post(self, path, token=None, **kw):
        h = kw.pop("headers", {})
        if token:
            h["Authorization"] = f"Bearer {token}"
        return requests.post(self.base + path, headers=h, timeout=30, **kw)

    def get(self, path, token=None, **kw):
        h = kw.pop("headers", {})
        if token:
            h["Authorization"] = f"Bearer {token}"
        return requests.get(self.base + path, headers=h, timeout=30, **kw)

    def metrics(self):
        """The Prometheus text of the server's metrics listener (metrics_listen)."""
        r = requests.get(self.metrics_base + "/metrics", timeout=30)
        assert r.status_code == 200, r.text
        return r.text

    def submit(self, token, body="hello", **fields):
        doc = {"body": body, "workarea_id": "wa-1", "path": "notes/a.md", "provenance": "human"}
        doc.update(fields)
        return self.post("/v1/claims", token, json=doc)

    def wait_published(self, tenant, seq, timeout=5.0):
        """Waits until the signed head of `tenant` in the local object store reaches `seq`."""
        path = self.home / "objects" / "oml-heads" / tenant
        deadline = time.time() + timeout
        while time.time() < deadline:
            if path.exists():
                doc = json.loads(path.read_text())
                if doc["head"]["seq"] >= seq:
                    return doc
            time.sleep(0.02)
        raise AssertionError(f"head {seq} of {tenant} not published at {path}")

    # Derived data `oml serve` writes on its own schedule, not in any request's transaction: the
    # transparency-log publisher extends each chain's tiles and signs its checkpoint about a second
    # after a commit (journal/tlog_store.h). A count taken before and after a refused request would
    # see that background work; tests of the tlog read these tables themselves.
    BACKGROUND_TABLES = ("merkle_tiles", "tlog_state")

    def counts(self):
        """Row count of every oml table but BACKGROUND_TABLES (superuser view, RLS does not apply)."""
        with self.su() as c:
            tables = [r[0] for r in c.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'oml' ORDER BY 1").fetchall()]
            return {t: c.execute(f"SELECT count(*) FROM oml.{t}").fetchone()[0] for t in tables
                    if t not in self.BACKGROUND_TABLES}

    def close(self):
        self.stop_server()
        self.stop_cluster()


class DevProfile:
    """`oml dev` running in its own OML_HOME: the process, its home, port, env and banner."""
    def __init__(self, p, home, port, env, banner, metrics_port):
        self.p, self.home, self.port, self.env, self.banner = p, home, port, env, banner
        self.base = f"http://127.0.0.1:{port}"
        self.metrics_base = f"http://127.0.0.1:{metrics_port}"


@contextlib.contextmanager
def dev_profile(name, **extra_env):
    """Starts `oml dev` under /tmp/<name>-<pid>, waits for its banner ("Press Ctrl-C"), and
    stops it, its cluster and its home afterwards, whatever the test did."""
    home = Path("/tmp") / f"{name}-{os.getpid()}"
    port, metrics_port = free_port(), free_port()
    env = dict(os.environ, OML_HOME=str(home), OML_LISTEN=f"127.0.0.1:{port}",
               OML_METRICS_LISTEN=f"127.0.0.1:{metrics_port}", OML_LOG_LEVEL="warn", **extra_env)
    env.pop("OML_DATABASE_URL", None)
    p = subprocess.Popen([OML_BIN, "dev"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        yield DevProfile(p, home, port, env, "".join(lines), metrics_port)
    finally:
        if p.poll() is None:
            p.kill()
        subprocess.run([OML_BIN, "cluster", "stop"], env=env, capture_output=True)
        subprocess.run(["rm", "-rf", str(home)])


@contextlib.contextmanager
def new_deployment(prefix="oml-t-"):
    """A fresh, initialized deployment with its cluster running (no server), removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(home, 0o755)
    d = Deployment(home)
    try:
        d.start_cluster()
        d.init()
        yield d
    finally:
        d.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def deployment(tmp_path_factory):
    """A fresh, initialized deployment with its cluster running (no server)."""
    with new_deployment() as d:
        yield d


@pytest.fixture
def served(deployment):
    """`deployment` plus a running `oml serve`, a tenant "acme" and keys for each role."""
    d = deployment
    d.tenant_id = d.tenant("acme")
    d.writer = d.api_key("acme", "writer", "alice")
    d.writer2 = d.api_key("acme", "writer", "bob")
    d.reviewer = d.api_key("acme", "reviewer", "rita")
    d.admin = d.api_key("acme", "admin", "ada")
    d.serve()
    yield d
