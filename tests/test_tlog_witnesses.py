"""Witnesses in `oml serve` (issue 23): each checkpoint is published only with a quorum of C2SP
tlog-witness cosignatures (`oml witness` processes, configured with the deployment's verifier
key), and the fork checks name a restored database, a rolled-back object store, and both at
once (only the witnesses can tell then). The cosignatures are verified by
transparency-dev/formats (tests/tlogcheck), not by oml."""
import base64
import hashlib
import json
import shutil
import subprocess
import time

import pytest

from conftest import OML_BIN, free_port
from test_chain_integrity import _restore
from test_tlog import body_of, check, deployment_key, head, note_vkey, tlogcheck  # noqa: F401 (fixture)


class Witness:
    """One `oml witness` process with its own key and durable state, on a fixed port."""

    def __init__(self, d, name, deployment_vkey):
        self.d, self.name, self.vkey_in = d, name, deployment_vkey
        self.port = free_port()
        self.dir = d.home / name.replace("/", "_")
        self.proc = None
        self.vkey = None

    def start(self):
        argv = [OML_BIN, "witness", "--listen", f"127.0.0.1:{self.port}", "--key", str(self.dir / "key"),
                "--name", self.name, "--deployment", self.vkey_in, "--state", str(self.dir / "state")]
        self.dir.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(self.dir / "log", "ab"), text=True,
                                     env=self.d.env)
        self.vkey = self.proc.stdout.readline().strip()
        assert self.vkey.startswith(self.name + "+"), self.vkey
        return self

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            assert self.proc.wait(10) == 0
            self.proc = None

    def entry(self):
        return f"http://127.0.0.1:{self.port} {self.vkey}"


ORIGIN = "oml.test/log"  # witnesses need a deployment's own tlog_origin, not the default


@pytest.fixture
def witnessed(served):
    """`served` restarted with its own tlog_origin and two witnesses (quorum: a majority of 2, i.e.
    both)."""
    d = served
    d.env["OML_TLOG_ORIGIN"] = ORIGIN
    # The verifier key `oml key public --witness-vkey` prints is the deployment key under tlog_origin.
    vkey = d.run("key", "public", "--witness-vkey").stdout.strip()
    assert vkey == note_vkey(ORIGIN, deployment_key(d))
    d.witnesses = [Witness(d, f"witness.test/w{i}", vkey).start() for i in (1, 2)]
    entries = ",".join(w.entry() for w in d.witnesses)
    # The default origin is every deployment's: refused with witnesses, naming the setting.
    bad = d.run("doctor", check=False, env={"OML_TLOG_ORIGIN": "oml.local", "OML_TLOG_WITNESSES": entries})
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "setting tlog_witnesses: set tlog_origin to this deployment's own name first" in bad.stderr
    d.env["OML_TLOG_WITNESSES"] = entries  # `oml doctor` and the CLI read the same settings
    d.stop_server()
    d.serve()
    yield d
    d.stop_server()
    for w in d.witnesses:
        w.stop()


def published_path(d, t=None):
    return d.home / "objects" / "oml-tlog" / (t or d.tenant_id) / "checkpoint"


def signature_lines(note):
    return [l for l in note.split("\n\n", 1)[1].splitlines() if l]


def wait_witnessed(d, n, timeout=30):
    """The published checkpoint once it covers `n` events and carries both cosignatures."""
    p = published_path(d)
    deadline = time.time() + timeout
    while True:
        if p.exists():
            note = p.read_text()
            if int(body_of(note)[1]) >= n and len(signature_lines(note)) == 3:
                return note
        assert time.time() < deadline, (p.read_text() if p.exists() else "no checkpoint") + d.log_text()[-3000:]
        time.sleep(0.2)


def stored_checkpoint_size(d):
    with d.su() as c:
        return c.execute("SELECT checkpoint_size FROM oml.tlog_state WHERE tenant_id = %s", (d.tenant_id,)).fetchone()[0]


def snapshot_then_advance(d, where, writes):
    """One event, witnessed and published; then, with the server stopped, a snapshot of the
    database (pg_dump) and of the object store (a copy) in `where`; then `writes` more events,
    witnessed and published. The server is left stopped. Returns the two head seqs."""
    r = d.submit(d.writer, body="then")
    assert r.status_code == 201
    d.then_artifact = r.json()["artifact_id"]
    then = head(d)
    wait_witnessed(d, then)
    d.stop_server()
    where.mkdir()
    subprocess.run(["pg_dump", "-Fc", "-f", str(where / "oml.dump"), "-d", d.superuser_url], check=True)
    shutil.copytree(d.home / "objects", where / "objects")
    d.serve()
    for i in range(writes):
        assert d.submit(d.writer, body=f"later {i}", path=f"notes/later{i}.md").status_code == 201
    later = head(d)
    wait_witnessed(d, later)
    d.stop_server()
    return then, later


def roll_back_objects(d, where):
    shutil.rmtree(d.home / "objects")
    shutil.copytree(where / "objects", d.home / "objects")


def test_checkpoints_are_published_with_a_quorum_of_cosignatures_that_formats_verifies(witnessed, tlogcheck):
    d = witnessed
    t = d.tenant_id
    origin = f"{ORIGIN}/{t}"
    vkey = note_vkey(origin, deployment_key(d))
    assert d.submit(d.writer, body="witnessed 1").status_code == 201
    n1 = head(d)
    cp = wait_witnessed(d, n1)
    assert int(body_of(cp)[1]) == n1
    names = [l.split(" ")[1] for l in signature_lines(cp)]
    assert names == [origin, "witness.test/w1", "witness.test/w2"]
    ok = check(tlogcheck, {"vkey": vkey, "origin": origin, "cosigned": cp, "cosigner_vkeys": [w.vkey for w in d.witnesses]})
    assert ok["cosigned"] == "ok", ok
    # One witness down: below the quorum, nothing newer is published (the proof API still answers
    # from the stored checkpoint), and the log says why.
    d.witnesses[1].stop()
    assert d.submit(d.writer, body="witnessed 2", path="notes/2.md").status_code == 201
    n2 = head(d)
    deadline = time.time() + 30
    while (stored_checkpoint_size(d) or 0) < n2:
        assert time.time() < deadline
        time.sleep(0.2)
    time.sleep(2.5)  # two more publisher rounds
    assert int(body_of(published_path(d).read_text())[1]) == n1
    assert d.get(f"/v1/proofs/inclusion?seq={n2}", d.writer).status_code == 200
    log = d.log_text()
    assert f"chain {t}: 1 of 2 witnesses cosigned the checkpoint at size {n2} (quorum 2): witness.test/w2: unreachable" in log
    # Back (same key, same state): it is shown the consistency proof from n1 and cosigns.
    d.witnesses[1].start()
    cp2 = wait_witnessed(d, n2)
    assert int(body_of(cp2)[1]) == n2
    ok = check(tlogcheck, {"vkey": vkey, "origin": origin, "cosigned": cp2, "cosigner_vkeys": [w.vkey for w in d.witnesses]})
    assert ok["cosigned"] == "ok", ok
    # An auditor holding the first checkpoint checks offline, in O(log n), that the newer one
    # (cosigned by both witnesses) extends it.
    (d.home / "old.cp").write_text(cp)
    answer = d.get(f"/v1/proofs/consistency?from={n1}", d.writer).json()
    assert answer["checkpoint"] == cp2
    (d.home / "proof.json").write_text(json.dumps(answer))
    witness_args = [a for w in d.witnesses for a in ("--witness", w.vkey)]
    v = d.run("verify-consistency", str(d.home / "old.cp"), "--proof", str(d.home / "proof.json"), *witness_args)
    root = base64.b64decode(body_of(cp2)[2]).hex()
    assert v.stdout == f"consistency OK: {origin} size {n1} -> {n2} ({len(answer['hashes'])} hashes) root {root}\n"
    bad = dict(answer, hashes=[base64.b64encode(bytes(32)).decode()] + answer["hashes"][1:])
    (d.home / "bad.json").write_text(json.dumps(bad))
    v = d.run("verify-consistency", str(d.home / "old.cp"), "--proof", str(d.home / "bad.json"), check=False)
    assert v.returncode == 3 and v.stdout.startswith("consistency INVALID: "), v.stdout
    (d.home / "bad.json").write_text(json.dumps(dict(answer, **{"from": n1 - 1})))
    v = d.run("verify-consistency", str(d.home / "old.cp"), "--proof", str(d.home / "bad.json"), check=False)
    assert (v.returncode, v.stdout) == (3, f"consistency INVALID: the proof is from size {n1 - 1}, the old checkpoint's is {n1}\n")
    # A witness that did not cosign it (a key made here, not by oml).
    typed = b"\x04" + bytes(range(32))
    w9_hash = hashlib.sha256(b"witness.test/w9\n" + typed).digest()[:4].hex()
    w9 = f"witness.test/w9+{w9_hash}+{base64.b64encode(typed).decode()}"
    v = d.run("verify-consistency", str(d.home / "old.cp"), "--proof", str(d.home / "proof.json"), "--witness", w9,
              check=False)
    assert (v.returncode, v.stdout) == (3, "consistency INVALID: the new checkpoint has no cosignature by witness.test/w9\n")
    doc = d.run("doctor", check=False)
    assert doc.returncode == 0, doc.stdout + doc.stderr
    assert "witnesses: 2 configured (quorum 2); every chain's newest checkpoint is consistent with what they cosigned" in doc.stdout
    # A quorum larger than the witnesses configured: refused at start, with the setting named.
    bad = d.run("doctor", check=False, env={**d.env, "OML_TLOG_WITNESS_QUORUM": "3"})
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "setting tlog_witness_quorum: 3 is more than the 2 witnesses configured" in bad.stderr


def test_a_restored_database_is_named_by_the_witnessed_checkpoint_and_by_the_witnesses(witnessed, tmp_path):
    d = witnessed
    t = d.tenant_id
    early, late = snapshot_then_advance(d, tmp_path / "then", 1)
    _restore(d, tmp_path / "then" / "oml.dump")
    doc = d.run("doctor", check=False)
    assert doc.returncode == 3, doc.stdout + doc.stderr
    assert f"FORK tenant {t}: stored chain size {early} is behind the witnessed checkpoint size {late}" in doc.stdout
    assert (f"FORK tenant {t}: chain {t}: witness witness.test/w1 has cosigned a tree of size {late} of this log, "
            f"larger than the chain's {early} events (the database lost the chain's tail)") in doc.stdout
    d.serve()
    w = d.submit(d.writer, body="onto a fork", path="notes/fork.md")
    assert w.status_code == 503
    assert w.json()["type"] == "urn:oml:problem:chain-fork"


def test_a_rolled_back_object_store_is_named_and_published_again(witnessed, tmp_path, tlogcheck):
    d = witnessed
    t = d.tenant_id
    before, after = snapshot_then_advance(d, tmp_path / "then", 3)
    roll_back_objects(d, tmp_path / "then")
    assert int(body_of(published_path(d).read_text())[1]) == before
    doc = d.run("doctor", check=False)
    assert doc.returncode == 3, doc.stdout + doc.stderr
    assert (f"INVALID CHECKPOINT tenant {t}: published checkpoint: its size {before} is behind the size {after} "
            "this deployment published (the object store was rolled back)") in doc.stdout
    assert "FORK" not in doc.stdout  # the chain itself is whole
    # `oml serve` names it, publishes the whole log again, and takes writes.
    d.serve()
    cp = wait_witnessed(d, after)
    assert int(body_of(cp)[1]) == after
    assert "the object store was rolled back" in d.log_text()
    ok = check(tlogcheck, {"vkey": note_vkey(f"{ORIGIN}/{t}", deployment_key(d)), "origin": f"{ORIGIN}/{t}",
                           "cosigned": cp, "cosigner_vkeys": [w.vkey for w in d.witnesses],
                           "tiles_dir": str(d.home / "objects" / "oml-tlog" / t), "checkpoint": cp})
    assert (ok["cosigned"], ok["checkpoint"], ok["tiles"]) == ("ok", "ok", "ok"), ok
    assert d.submit(d.writer, body="goes on", path="notes/on.md").status_code == 201


def test_a_database_and_object_store_rolled_back_together_are_caught_by_the_witnesses(witnessed, tmp_path):
    d = witnessed
    t = d.tenant_id
    then, lost = snapshot_then_advance(d, tmp_path / "then", 2)
    _restore(d, tmp_path / "then" / "oml.dump")
    roll_back_objects(d, tmp_path / "then")
    # The heads and checkpoints published agree with the restored database: only the witnesses
    # remember the lost tail.
    doc = d.run("doctor", check=False)
    assert doc.returncode == 3, doc.stdout + doc.stderr
    what = (f"chain {t}: witness witness.test/w1 has cosigned a tree of size {lost} of this log, larger than the "
            f"chain's {then} events (the database lost the chain's tail)")
    assert f"FORK tenant {t}: {what}" in doc.stdout
    assert "fork check: every stored chain head agrees with its published signed head and checkpoint" in doc.stdout
    d.serve()
    w = d.submit(d.writer, body="onto a fork", path="notes/fork.md")
    assert w.status_code == 503
    assert w.json()["type"] == "urn:oml:problem:chain-fork"
    assert what in w.json()["detail"]
    # A CLI write to the chain asks the witnesses too: refused, naming the fork.
    e = d.run("erase", "--tenant", "acme", d.then_artifact, check=False)
    assert e.returncode == 5 and what in e.stderr, e.stderr
    # Another tenant's chain is whole: it takes writes.
    d.tenant("other")
    tok = d.api_key("other", "writer", "olga")
    assert d.submit(tok, body="elsewhere").status_code == 201


def test_a_replica_with_tlog_publish_ms_0_signs_and_publishes_nothing(served):
    d = served
    d.stop_server()
    d.serve(env={"OML_TLOG_PUBLISH_MS": "0"})
    assert d.submit(d.writer, body="unpublished").status_code == 201
    n = head(d)
    time.sleep(2.5)  # two rounds of a default publisher
    r = d.get(f"/v1/proofs/inclusion?seq={n}", d.writer)
    assert r.status_code == 409 and r.json()["type"] == "urn:oml:problem:not-checkpointed", r.text
    assert "tlog_publish_ms is 0: this replica signs and publishes no checkpoint" in d.log_text()
    # The default publisher (another replica, here the same one restarted) catches up.
    d.stop_server()
    d.serve()
    deadline = time.time() + 30
    while d.get(f"/v1/proofs/inclusion?seq={n}", d.writer).status_code != 200:
        assert time.time() < deadline
        time.sleep(0.2)
