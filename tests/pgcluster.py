"""A replicated PostgreSQL cluster on loopback, for failover tests and benches (issue 21).

One primary and standbys made by pg_basebackup, streaming replication over 127.0.0.1, each node
its own data directory and port. The primary runs

    synchronous_commit = on
    synchronous_standby_names = 'ANY 1 (s1, s2)'

so a COMMIT returns only once s1 or s2 has flushed its WAL. A third standby, "a1", streams
asynchronously (its name is not in the list): promoting it after the primary died is how a
failover loses an acknowledged tail.

The cluster can stop (fast or immediate), kill -9 (the postmaster and every child, as a machine
crash would), start, promote, re-point a standby at a new primary, and pg_rewind a former primary
into a standby of the new one.

`ReplicatedDeployment` is conftest's Deployment over such a cluster: every oml command and the
test's superuser connections use libpq multi-host URLs
(`host=127.0.0.1,127.0.0.1,... port=p0,p1,... target_session_attrs=read-write`), so they follow
the primary wherever it is.

Run as root, the nodes run as the `postgres` system user (like `oml cluster start`).
"""
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from conftest import Deployment, free_port

PG_BIN = Path(os.environ.get("OML_PG_BIN", "/usr/lib/postgresql/15/bin"))
AS_ROOT = os.geteuid() == 0


def _pg(*argv, check=True, timeout=120):
    """Runs a PostgreSQL program (as postgres when root); returns the CompletedProcess."""
    cmd = [str(PG_BIN / argv[0]), *argv[1:]]
    if AS_ROOT:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}")
    return p


class Node:
    def __init__(self, cluster, name, port):
        self.cluster = cluster
        self.name = name
        self.port = port
        self.data = cluster.base / name
        self.log = cluster.base / f"{name}.log"

    def url(self, user="postgres", dbname="oml"):
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user} connect_timeout=5"

    def conn(self, dbname="oml"):
        return psycopg.connect(self.url(dbname=dbname), autocommit=True)

    def pid(self):
        pidfile = self.data / "postmaster.pid"
        try:
            return int(pidfile.read_text().splitlines()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def running(self):
        return _pg("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def start(self):
        p = _pg("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start", check=False)
        if p.returncode != 0:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise AssertionError(f"{self.name} did not start ({p.returncode}): {p.stderr}\n{tail}")

    def stop(self, mode="fast"):
        if self.running():
            _pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def kill9(self):
        """SIGKILL to the postmaster and all of its children at once (a machine crash)."""
        pid = self.pid()
        if pid is None:
            return
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        for p in [pid, *map(int, kids)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.time() + 30
        while time.time() < deadline:
            alive = [p for p in [pid, *map(int, kids)] if _alive(p)]
            if not alive:
                # A postmaster left a zombie (nobody reaps it in a container without an init)
                # still answers kill(pid, 0), and PostgreSQL would take its pid file for a live
                # server. After a real crash no process is left: neither is the file.
                with contextlib.suppress(FileNotFoundError):
                    (self.data / "postmaster.pid").unlink()
                # The unix socket's lock file names the same pid: a zombie postmaster made the
                # restart fail with "lock file .s.PGSQL.<port>.lock already exists" (seen once).
                with contextlib.suppress(FileNotFoundError):
                    (self.cluster.base / f".s.PGSQL.{self.port}.lock").unlink()
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: processes survived SIGKILL: {alive}")

    def promote(self):
        _pg("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")
        deadline = time.time() + 30
        while time.time() < deadline:
            with self.conn() as c:
                if not c.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                    # The control file names the new timeline only after a checkpoint (promotion
                    # requests one, asynchronously); pg_rewind reads it there, and would otherwise
                    # see "the same timeline" and rewind nothing.
                    c.execute("CHECKPOINT")
                    return
            time.sleep(0.05)
        raise AssertionError(f"{self.name} did not leave recovery")

    def write_standby_conf(self, primary):
        """Makes this node a standby of `primary` at its next start (standby.signal, conninfo)."""
        (self.data / "standby.signal").touch()
        if AS_ROOT:
            shutil.chown(self.data / "standby.signal", "postgres", "postgres")
        _append(self.data / "postgresql.auto.conf",
                f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres application_name={self.name}'\n"
                f"port = {self.port}\n")

    def follow(self, primary):
        """Re-points a running standby at `primary` (primary_conninfo reloads without a restart)."""
        with self.conn(dbname="postgres") as c:
            c.execute(f"ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
                      f"application_name={self.name}'")
            c.execute("SELECT pg_reload_conf()")

    def in_recovery(self):
        with self.conn(dbname="postgres") as c:
            return c.execute("SELECT pg_is_in_recovery()").fetchone()[0]

    def replay_lsn(self):
        with self.conn(dbname="postgres") as c:
            return c.execute("SELECT pg_last_wal_replay_lsn()").fetchone()[0]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of someone else counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _lsn(text):
    """A pg_lsn's text ('16/B374D848') as an int, for comparison."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _append(path, text):
    with open(path, "a") as f:
        f.write(text)


class ReplicatedCluster:
    """primary "p", synchronous standbys "s1", "s2" (ANY 1), asynchronous standby "a1"."""

    def __init__(self, sync_names=("s1", "s2"), async_names=("a1",), num_sync=1, synchronous_commit="on"):
        self.base = Path(tempfile.mkdtemp(prefix="oml-rc-", dir="/tmp"))
        os.chmod(self.base, 0o755)
        if AS_ROOT:
            shutil.chown(self.base, "postgres", "postgres")
        self.sync_names = list(sync_names)
        self.num_sync = num_sync
        self.synchronous_commit = synchronous_commit
        self.nodes = {"p": Node(self, "p", free_port())}
        for n in [*sync_names, *async_names]:
            self.nodes[n] = Node(self, n, free_port())
        self.primary = self.nodes["p"]

    # --- lifecycle ------------------------------------------------------------------------
    def start(self):
        p = self.primary
        _pg("initdb", "-D", str(p.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C")
        _append(p.data / "postgresql.conf", "\n".join([
            "listen_addresses = '127.0.0.1'",
            f"port = {p.port}",
            f"unix_socket_directories = '{self.base}'",
            "wal_level = replica",
            "max_wal_senders = 16",
            "wal_keep_size = '1GB'",
            "hot_standby = on",
            "wal_log_hints = on",              # pg_rewind needs it (or data checksums)
            "fsync = off",                     # kill -9 loses no page cache; only speed matters
            "max_connections = 300",
            "shared_buffers = '64MB'",
            "wal_receiver_status_interval = '1s'",
            "wal_sender_timeout = '5s'",
            "wal_receiver_timeout = '5s'",
            "log_line_prefix = '%m [%p] '",
        ]) + "\n")
        (p.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "host all all 127.0.0.1/32 trust\n"
            "host replication all 127.0.0.1/32 trust\n")
        p.start()
        with p.conn(dbname="postgres") as c:
            c.execute("CREATE DATABASE oml")
        for name, node in self.nodes.items():
            if node is not p:
                self._clone(name)
        # Quorum only once the standbys stream: otherwise the first commits would wait for them.
        self.set_sync(self.sync_for("p"), self.synchronous_commit)
        self.wait_streaming([n for n in self.nodes if n != "p"])
        return self

    def close(self):
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.stop("immediate")
            with contextlib.suppress(Exception):
                node.kill9()
        shutil.rmtree(self.base, ignore_errors=True)

    # --- settings and state ---------------------------------------------------------------
    def sync_for(self, name):
        """synchronous_standby_names of node `name` as a primary: ANY k of the other synchronous-
        eligible nodes ("p" and the synchronous standbys). The primary's is 'ANY 1 (s1, s2)'."""
        others = [n for n in ["p", *self.sync_names] if n != name]
        return f"ANY {self.num_sync} ({', '.join(others)})" if self.sync_names else ""

    def set_sync(self, names, commit="on"):
        """ALTER SYSTEM the two settings on the primary and reload."""
        with self.primary.conn(dbname="postgres") as c:
            c.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            c.execute(f"ALTER SYSTEM SET synchronous_commit = '{commit}'")
            c.execute("SELECT pg_reload_conf()")

    def streaming(self):
        """{application_name: sync_state} of the standbys streaming from the primary now."""
        with self.primary.conn(dbname="postgres") as c:
            return dict(c.execute("SELECT application_name, sync_state FROM pg_stat_replication "
                                  "WHERE state = 'streaming'").fetchall())

    def wait_streaming(self, names, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self.streaming()
            if all(n in got for n in names):
                return got
            time.sleep(0.1)
        logs = {n: self.nodes[n].log.read_text(errors="replace")[-1500:] for n in names
                if n not in got and self.nodes[n].log.exists()}
        raise AssertionError(f"standbys {names} not streaming from {self.primary.name}: {got}; logs: {logs}")

    def wait_replayed(self, names, timeout=60):
        """Waits until each named standby has replayed everything the primary has written now."""
        with self.primary.conn(dbname="postgres") as c:
            target = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        deadline = time.time() + timeout
        for n in names:
            node = self.nodes[n]
            while True:
                with node.conn(dbname="postgres") as c:
                    if c.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:
                        break
                if time.time() > deadline:
                    raise AssertionError(f"{n} did not replay up to {target}: "
                                         f"{node.log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.05)

    # --- failover -------------------------------------------------------------------------
    def received_lsn(self, name, settle=1.0):
        """The end of the WAL standby `name` holds: what its walreceiver wrote, or (after a restart,
        before it streams again) what it replayed from its own pg_wal; polled until it stops moving
        for `settle` seconds (a walreceiver still writing what the dead primary sent)."""
        q = ("SELECT greatest(coalesce(w.written_lsn, '0/0'::pg_lsn), coalesce(pg_last_wal_receive_lsn(), '0/0'), "
             "coalesce(pg_last_wal_replay_lsn(), '0/0'))::text FROM (SELECT 1) x "
             "LEFT JOIN pg_stat_wal_receiver w ON true")
        last, since = None, time.time()
        while True:
            with self.nodes[name].conn(dbname="postgres") as c:
                got = c.execute(q).fetchone()[0]
            if got != last:
                last, since = got, time.time()
            elif time.time() - since >= settle:
                return _lsn(got)
            time.sleep(0.1)

    def most_advanced(self, names=None):
        """Of the running synchronous standbys (or `names`), the one holding the most WAL.

        With `ANY k (...)`, each acknowledged commit is on k of them, not on every one: only the
        most advanced holds all of them (WAL is one stream: the longest holds every shorter), and
        the others can follow it once it is promoted (a standby AHEAD of the new primary cannot:
        its timeline forked off before its own end, and the quorum then waits for it forever)."""
        names = [n for n in (names or self.sync_names) if self.nodes[n].running()]
        return max(names, key=lambda n: (self.received_lsn(n), n))

    def failover(self, to=None, old_primary_down=True):
        """Promotes standby `to` (default: the most advanced synchronous standby, as the operator
        must); every other running standby follows it. Returns the new primary."""
        node = self.nodes[to or self.most_advanced()]
        node.promote()
        old = self.primary
        self.primary = node
        for name, other in self.nodes.items():
            if other is node or other is old or not other.running():
                continue
            other.follow(node)
        return node

    def rewind(self, name, source=None):
        """pg_rewind a stopped former primary (or diverged node) onto `source` (default: the
        current primary), then start it as that primary's standby."""
        node = self.nodes[name]
        source = source or self.primary
        node.stop("fast")
        # A target that crashed is first run through crash recovery by pg_rewind itself (single-user
        # mode; PostgreSQL 13+ unless --no-ensure-shutdown).
        _pg("pg_rewind", "-D", str(node.data), f"--source-server=host=127.0.0.1 port={source.port} user=postgres dbname=postgres")
        node.write_standby_conf(source)
        node.start()
        return node

    def reclone(self, name):
        """Replaces node `name` by a fresh pg_basebackup of the current primary, streaming from it.
        For a node that was promoted on its own (a fork): its timeline may carry the same ID as the
        new primary's (each promotion picks the next ID it knows of), and pg_rewind then sees
        "the same timeline" and does nothing."""
        node = self.nodes[name]
        node.stop("fast")
        shutil.rmtree(node.data)
        return self._clone(name)

    def _clone(self, name):
        """pg_basebackup of the primary into node `name`'s (absent) data directory; starts it as a
        standby streaming from the primary."""
        node, p = self.nodes[name], self.primary
        _pg("pg_basebackup", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres", "-D", str(node.data),
            "-X", "stream", "-c", "fast", "-R")
        node.write_standby_conf(p)
        # Ignored while a standby; in force once promoted: every node is configured the way the
        # primary is, naming the other synchronous-eligible nodes (as an operator, or
        # CloudNativePG, configures a replicated cluster).
        _append(node.data / "postgresql.auto.conf",
                f"synchronous_standby_names = '{self.sync_for(name)}'\n"
                f"synchronous_commit = '{self.synchronous_commit}'\n")
        node.start()
        return node

    # --- URLs -----------------------------------------------------------------------------
    def multi_host(self, user, names=None, dbname="oml"):
        """A libpq keyword/value URL naming every node (or `names`), read-write only."""
        nodes = [self.nodes[n] for n in (names or self.nodes)]
        return (f"host={','.join('127.0.0.1' for _ in nodes)} port={','.join(str(n.port) for n in nodes)} "
                f"dbname={dbname} user={user} target_session_attrs=read-write connect_timeout=3")


class ReplicatedDeployment(Deployment):
    """conftest's Deployment whose database is a ReplicatedCluster (production profile: oml
    migrate as the administrator, then every role through multi-host URLs)."""

    def __init__(self, home, cluster, extra_env=None):
        super().__init__(home, extra_env)
        self.cluster = cluster
        self.env.update({
            "OML_DATABASE_URL": cluster.multi_host("oml_app"),
            "OML_LAKEWRITER_DATABASE_URL": cluster.multi_host("oml_lakewriter"),
            "OML_RECONCILER_DATABASE_URL": cluster.multi_host("oml_reconciler"),
        })

    def start_cluster(self):
        self.superuser_url = self.cluster.multi_host("postgres")
        self.run("migrate", "--admin-url", self.superuser_url)
        return self.superuser_url

    def stop_cluster(self):
        pass  # the cluster belongs to the test

    def app_url(self):
        return self.cluster.multi_host("oml_app")
