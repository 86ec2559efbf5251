"""The local profile on a shared host (issue 7 §6): the PostgreSQL socket directory is private and
checked, the files under $OML_HOME get their modes from the start, and key files with loose modes
or another owner are refused at load unless the documented override is set."""
import os
import pwd
import re
import shutil
import stat
import uuid
from pathlib import Path

import pytest

from conftest import Deployment, dev_profile

IS_ROOT = os.geteuid() == 0
# The user PostgreSQL runs as: `postgres` when oml runs as root, else oml's own user.
PG_UID = pwd.getpwnam("postgres").pw_uid if IS_ROOT else os.geteuid()
NOBODY = 65534
REFUSE = "; refusing to use it for PostgreSQL (remove it and start again)"


def mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def socket_dir_of(home):
    return re.search(r"host=([^&]+)", (home / "pg" / "superuser.url").read_text()).group(1)


@pytest.fixture
def fresh_home():
    """An OML_HOME path that does not exist yet (oml creates it), removed afterwards with its cluster."""
    home = Path("/tmp") / f"oml-lph-{uuid.uuid4().hex[:8]}"
    d = Deployment(home)
    yield d
    d.close()
    shutil.rmtree(home, ignore_errors=True)


def not_started(home):
    """No server was started: no initdb, no postmaster.pid."""
    return not (home / "pg" / "data" / "postmaster.pid").exists() and not (home / "pg" / "data").exists()


def test_cluster_start_makes_home_pg_and_socket_dir_private(fresh_home):
    d = fresh_home
    old = os.umask(0)  # the most permissive umask: the modes must not depend on it
    try:
        d.start_cluster()
    finally:
        os.umask(old)
    home = d.home
    sock = home / "pg" / "sock"
    assert socket_dir_of(home) == str(sock)
    assert d.superuser_url == f"postgresql:///oml?host={sock}&user=postgres"
    st = os.lstat(sock)
    assert stat.S_ISDIR(st.st_mode) and mode(sock) == 0o700 and st.st_uid == PG_UID
    assert mode(home / "pg") == 0o700
    if IS_ROOT:  # traversable by the postgres group only
        assert mode(home) == 0o710
        assert os.stat(home).st_gid == pwd.getpwnam("postgres").pw_gid
    else:
        assert mode(home) == 0o700
    for f in ("superuser.url", "app.url"):
        assert mode(home / "pg" / f) == 0o600, f
    assert not [p.name for p in (home / "pg").iterdir() if ".tmp-" in p.name]
    # A second start finds the running server's socket (postmaster.pid) and reports the same URL.
    assert d.run("cluster", "start").stdout.strip().splitlines()[-1] == d.superuser_url
    d.stop_cluster()
    assert not sock.exists()  # removed with the server


@pytest.mark.parametrize("how", ["other-owner", "mode-0777", "symlink"])
def test_precreated_socket_dir_is_refused_and_postgres_not_started(fresh_home, how):
    if how == "other-owner" and not IS_ROOT:
        pytest.skip("gives the directory to another uid")
    d = fresh_home
    pg = d.home / "pg"
    pg.mkdir(parents=True)
    sock = pg / "sock"
    elsewhere = Path("/tmp") / f"oml-lph-target-{uuid.uuid4().hex[:8]}"
    try:
        if how == "other-owner":
            sock.mkdir()
            os.chmod(sock, 0o700)
            os.chown(sock, NOBODY, NOBODY)
            want = f"socket directory {sock} is owned by uid {NOBODY}, not by the uid PostgreSQL runs as ({PG_UID})"
        elif how == "mode-0777":
            sock.mkdir()
            os.chmod(sock, 0o777)
            os.chown(sock, PG_UID, -1)
            want = f"socket directory {sock} has mode 0777, not 0700"
        else:
            elsewhere.mkdir()
            os.chmod(elsewhere, 0o700)
            os.chown(elsewhere, PG_UID, -1)
            sock.symlink_to(elsewhere)
            want = f"socket directory {sock} is a symbolic link"
        p = d.run("cluster", "start", check=False)
        assert p.returncode == 4, p.stdout + p.stderr
        assert p.stderr.strip().splitlines()[-1] == f"oml: failed-precondition: {want}{REFUSE}"
        assert p.stdout == ""
        assert not_started(d.home)
        if how == "symlink":
            assert list(elsewhere.iterdir()) == []  # no socket put where the link points
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@pytest.mark.skipif(not IS_ROOT, reason="gives the directory to another uid")
def test_oml_dev_refuses_a_socket_dir_owned_by_another_user():
    """The same through `oml dev`: exit 4, the message, and no PostgreSQL behind it."""
    name = f"oml-lph-dev-{uuid.uuid4().hex[:6]}"
    home = Path("/tmp") / f"{name}-{os.getpid()}"
    sock = home / "pg" / "sock"
    sock.mkdir(parents=True)
    os.chmod(sock, 0o777)
    os.chown(sock, NOBODY, NOBODY)
    with dev_profile(name) as dev:
        assert dev.p.wait(timeout=60) == 4
        err = dev.p.stderr.read()
        assert f"oml: failed-precondition: socket directory {sock} is owned by uid {NOBODY}, not by the uid " \
               f"PostgreSQL runs as ({PG_UID}){REFUSE}" in err, err
        assert "Press Ctrl-C" not in dev.banner
        assert not_started(home)
        assert not (home / "dev-writer.token").exists()


def test_a_running_servers_socket_dir_is_checked_too(fresh_home):
    d = fresh_home
    d.start_cluster()
    sock = d.home / "pg" / "sock"
    os.chmod(sock, 0o777)
    try:
        p = d.run("cluster", "start", check=False)
        assert p.returncode == 4, p.stdout + p.stderr
        assert p.stderr.strip().splitlines()[-1] == \
            f"oml: failed-precondition: socket directory {sock} has mode 0777, not 0700{REFUSE}"
    finally:
        os.chmod(sock, 0o700)


def test_long_home_gets_a_private_random_socket_dir_in_tmp():
    """$OML_HOME/pg/sock/.s.PGSQL.<port> longer than a unix socket path: mkdtemp in /tmp, a new name
    per start, removed at stop."""
    home = Path("/tmp") / ("oml-lph-long-" + uuid.uuid4().hex + "-" + "x" * 60)
    assert len(str(home / "pg" / "sock" / ".s.PGSQL.65535")) > 107
    d = Deployment(home)
    try:
        d.start_cluster()
        first = socket_dir_of(home)
        assert re.fullmatch(r"/tmp/oml-pg-[A-Za-z0-9]{6}", first), first
        st = os.lstat(first)
        assert stat.S_ISDIR(st.st_mode) and mode(first) == 0o700 and st.st_uid == PG_UID
        assert not (home / "pg" / "sock").exists()
        d.init()  # app.url points at the same directory: the application role connects there
        assert d.run("tenant", "create", "acme").returncode == 0
        d.stop_cluster()
        assert not os.path.exists(first)
        d.start_cluster()
        second = socket_dir_of(home)
        assert re.fullmatch(r"/tmp/oml-pg-[A-Za-z0-9]{6}", second) and second != first
        d.stop_cluster()
        assert not os.path.exists(second)
    finally:
        d.close()
        shutil.rmtree(home, ignore_errors=True)


KEY_FIX = "` (where a container mount cannot set modes, set allow_insecure_key_files = true in oml.toml or " \
          "OML_ALLOW_INSECURE_KEY_FILES=1)"


def test_key_file_with_group_or_other_bits_is_refused_unless_overridden(deployment):
    d = deployment
    key = d.home / "keys" / "signing.key"
    assert d.run("key", "public").returncode == 0
    os.chmod(key, 0o644)
    p = d.run("key", "public", check=False)
    assert p.returncode == 4
    assert p.stderr.strip() == f"oml: failed-precondition(insecure-key-file): key file {key} has mode 0644 " \
                               f"(group or others may use it); run `chmod 600 {key}{KEY_FIX}"
    assert p.stdout == ""
    # A command that signs refuses too, before it writes anything.
    before = d.counts()["journal"]
    t = d.run("tenant", "create", "acme", check=False)
    assert t.returncode == 4 and "has mode 0644" in t.stderr
    assert d.counts()["journal"] == before
    # The documented override: loads, with a warning naming the file.
    ok = d.run("key", "public", check=False, env={"OML_ALLOW_INSECURE_KEY_FILES": "1"})
    assert ok.returncode == 0, ok.stderr
    assert '"msg":"insecure key file accepted (allow_insecure_key_files)"' in ok.stderr
    assert f'"file":"{key}"' in ok.stderr and '"mode":"0644"' in ok.stderr
    (d.home / "oml.toml").write_text("allow_insecure_key_files = true\n")
    assert d.run("key", "public", check=False).returncode == 0
    (d.home / "oml.toml").unlink()
    os.chmod(key, 0o400)  # read-only for the owner is fine
    assert d.run("key", "public").returncode == 0


def test_kek_file_with_loose_mode_is_refused_by_serve(deployment):
    d = deployment
    kek = d.home / "keys" / "kek.key"
    os.chmod(kek, 0o640)
    p = d.run("serve", check=False, timeout=60)
    assert p.returncode == 4, p.stderr
    assert p.stderr.strip().splitlines()[-1] == \
        f"oml: failed-precondition(insecure-key-file): key file {kek} has mode 0640 (group or others may use it); " \
        f"run `chmod 600 {kek}{KEY_FIX}"


@pytest.mark.skipif(not IS_ROOT, reason="gives the file to another uid")
def test_key_file_owned_by_another_user_is_refused(deployment):
    d = deployment
    key = d.home / "keys" / "signing.key"
    os.chown(key, NOBODY, NOBODY)
    p = d.run("key", "public", check=False)
    assert p.returncode == 4
    assert p.stderr.strip() == f"oml: failed-precondition(insecure-key-file): key file {key} is owned by uid " \
                               f"{NOBODY}, not by this process (uid 0); run `chown 0 {key}{KEY_FIX}"
    assert d.run("key", "public", check=False, env={"OML_ALLOW_INSECURE_KEY_FILES": "true"}).returncode == 0


def test_dev_profile_files_have_their_modes_from_the_start():
    with dev_profile("oml-lph-modes") as dev:
        home = dev.home
        assert "Press Ctrl-C" in dev.banner, dev.banner + (dev.p.stderr.read() if dev.p.poll() is not None else "")
        assert mode(home) == (0o710 if IS_ROOT else 0o700)
        for p in ("pg", "pg/sock", "keys"):
            assert mode(home / p) == 0o700, p
        for p in ("pg/superuser.url", "pg/app.url", "dev-writer.token", "keys/signing.key", "keys/kek.key",
                  "keys/cursor.key"):
            assert mode(home / p) == 0o600, p
            assert os.lstat(home / p).st_uid == os.geteuid(), p
        for p in ("keys/signing.key.pub", "keys/signing.key.root.pub"):
            assert mode(home / p) == 0o644, p
        assert socket_dir_of(home) == str(home / "pg" / "sock")
        leftovers = [str(p) for p in home.rglob("*.tmp-*") if "pg/data" not in str(p)]
        assert leftovers == []
        assert len((home / "dev-writer.token").read_text().strip()) > 20
