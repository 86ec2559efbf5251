"""Issue 19, "Leftovers": what a killed write leaves on a local store (staging files
`<key>#<digits>`, which List hides) is swept by a StagingSweeper (blob/object_store.h) at start
and every min(staging_grace_s / 2, 15 min). `oml serve` sweeps the quarantine and bodies buckets
(tests/test_uploads.py); `oml lakewriter` sweeps the lake, here.

The periodic pass itself is tested on the class (src/blob/object_store_test.cc,
StagingSweeperSweepsAtStartAndThenEveryInterval): staging_grace_s is at least 600 s, so the shortest
interval a process can be given is 300 s."""
import json
import os
import signal
import subprocess
import time

from conftest import OML_BIN
from test_uploads import staging_files


def test_the_lake_writer_sweeps_a_killed_writers_staging_files_from_the_lake(deployment):
    """Staging files of a Parquet file and of a commit file (as a lake writer killed mid-write
    leaves them) older than staging_grace_s are removed by `oml lakewriter` at start, and logged;
    a younger one (a write in progress) and every file of the tables stay."""
    d = deployment
    d.tenant("acme")
    d.run("lakewriter", "--once", timeout=120)  # the tables exist, with their first commits
    table = d.home / "lake" / "bronze" / "events"
    assert (table / "_delta_log").is_dir()
    files_before = {p for p in (d.home / "lake").rglob("*") if p.is_file()}
    assert staging_files(d.home / "lake") == []
    old = [table / ("part-00000-" + "a" * 36 + "-c000.snappy.parquet#12"),
           table / "_delta_log" / "00000000000000000099.json#90000000010000000002"]
    for p in old:
        p.write_bytes(b"partial")
        os.utime(p, (time.time() - 7200, time.time() - 7200))
    young = table / "_delta_log" / "00000000000000000100.json#7"
    young.write_bytes(b"a write in progress")
    log = open(d.home / "lakewriter.log", "wb")
    w = subprocess.Popen([OML_BIN, "lakewriter", "--poll-ms", "50"], env={**d.env, "OML_LOG_LEVEL": "info",
                         "OML_STAGING_GRACE_S": "3600"}, stderr=log, stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while any(p.exists() for p in old):
            assert w.poll() is None, f"the lake writer exited {w.returncode}"
            assert time.time() < deadline, "the lake writer's sweep never removed the old staging files"
            time.sleep(0.05)
        assert staging_files(d.home / "lake") == [young]
    finally:
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0
        log.close()
    lines = [json.loads(l) for l in (d.home / "lakewriter.log").read_text().splitlines() if l.startswith("{")]
    swept = [l for l in lines if l["msg"] == "staging sweep removed what interrupted writes left"]
    assert [(l["store"], l["removed"], l["grace_s"]) for l in swept] == [("lake", "2", "3600")], swept
    assert files_before <= {p for p in (d.home / "lake").rglob("*") if p.is_file()}
