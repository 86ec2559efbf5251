"""The local profile runs the lake writer (issue 8): `oml dev` drains the outbox into
$OML_HOME/lake in-process, its banner prints a command that shows the claim's bronze row, and
Ctrl-C stops the API, then the lake writer, then PostgreSQL."""
import json
import signal
import subprocess
import time

import requests

from conftest import dev_profile


def bronze(home):
    from deltalake import DeltaTable
    return DeltaTable(str(home / "lake" / "bronze" / "events")).to_pyarrow_table().to_pylist()


def test_oml_dev_writes_a_submitted_claim_to_bronze_within_seconds_and_its_banner_shows_it():
    with dev_profile("oml-devlake") as dev:
        assert "Press Ctrl-C" in dev.banner, dev.banner
        lines = dev.banner.splitlines()
        i = lines.index("Two seconds later, its row in the lake (bronze/events, written by the lake writer):")
        cmd = lines[i + 1].strip()
        assert cmd.startswith("sleep 2; OML_HOME=" + str(dev.home) + " ") and cmd.endswith(" lake tail -n 1"), cmd

        token = (dev.home / "dev-writer.token").read_text().strip()
        r = requests.post(dev.base + "/v1/claims", headers={"Authorization": f"Bearer {token}"}, timeout=30,
                          json={"body": "hello, oml", "workarea_id": "wa-1", "path": "notes/hello.md",
                                "provenance": "human"})
        assert r.status_code == 201, r.text
        artifact_id = r.json()["artifact_id"]

        # The banner's own command, as a newcomer runs it. On a loaded machine (CI runs this beside
        # other clusters on two cores) the first batches may take longer than the banner's two
        # seconds: a newcomer who sees no row or the previous one runs it again, and so does the
        # test, for at most fifteen seconds in all.
        deadline = time.time() + 15
        while True:
            p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            out = [json.loads(line) for line in p.stdout.splitlines()]
            assert len(out) <= 1, p.stdout
            if (out and out[0]["artifact_id"] == artifact_id) or time.time() > deadline:
                break
        assert len(out) == 1, p.stdout
        assert out[0]["artifact_id"] == artifact_id and out[0]["version"] == 1
        assert out[0]["workarea_id"] == "wa-1" and out[0]["path"] == "notes/hello.md"
        assert "signed_bytes" not in out[0] and "signature" not in out[0]

        # Read back with the deltalake package: exactly one row for the claim.
        rows = [row for row in bronze(dev.home) if row["artifact_id"] == artifact_id]
        assert len(rows) == 1, rows
        assert rows[0]["outbox_seq"] == out[0]["outbox_seq"]

        # Ctrl-C: API, lake writer, PostgreSQL, and exit 0.
        assert (dev.home / "pg" / "data" / "postmaster.pid").exists()
        dev.p.send_signal(signal.SIGINT)
        assert dev.p.wait(timeout=60) == 0, dev.p.stderr.read()
        err = dev.p.stderr.read()
        assert "lake writer stopped" not in err, err
        assert not (dev.home / "pg" / "data" / "postmaster.pid").exists()
