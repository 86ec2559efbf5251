"""CLI inputs that are signed into the journal obey the same field rules as the API
(src/fields/fields.h; docs/operations/deployment.md "Field limits"): a violation exits 2
with `invalid-argument(invalid-field)` and writes nothing."""
import json

USAGE = 2  # src/cli/exit_codes.h kExitUsage


def _refused(d, args, message):
    p = d.run(*args, check=False)
    assert p.returncode == USAGE, (args[:3], p.returncode, p.stderr)
    assert p.stderr.strip() == f"oml: invalid-argument(invalid-field): {message}", p.stderr
    return p


def test_cli_refuses_journalled_fields_that_break_their_rules_and_writes_nothing(deployment):
    d = deployment
    d.tenant("acme")
    d.api_key("acme", "writer", "alice")
    with d.su() as c:
        key_id = c.execute("SELECT 'ak_' || left(encode(key_hash, 'hex'), 16) FROM oml.api_keys").fetchone()[0]
    before = d.counts()

    big = "x" * 100_000  # below the kernel's 128 KiB limit on one argv string
    _refused(d, ["tenant", "create", "Acme"], "tenant name must match ^[a-z0-9][a-z0-9_-]{0,62}$")
    _refused(d, ["tenant", "create", big], "tenant name must match ^[a-z0-9][a-z0-9_-]{0,62}$")
    key = ["key", "create", "--tenant", "acme", "--role", "writer", "--principal"]
    _refused(d, key + ["a\nb"], "principal may not contain control characters (U+0000..U+001F, U+007F)")
    _refused(d, key + ["p" * 201], "principal must be 1..200 characters; it has more")
    _refused(d, key + ["a\udcffb"], "principal must be UTF-8")  # argv byte 0xFF (surrogateescape)
    revoke = ["key", "revoke", "--tenant", "acme", key_id, "--reason"]
    _refused(d, revoke + [big], "reason must be 0..1024 characters; it has more")
    _refused(d, revoke + ["tab\there"], "reason may not contain control characters (U+0000..U+001F, U+007F)")
    # Checked before the claim is looked up: an unknown id is refused for its reason, not 404.
    erase = ["erase", "--tenant", "acme", "00000000-0000-4000-8000-000000000000", "--reason"]
    _refused(d, erase + [big], "reason must be 0..1024 characters; it has more")
    _refused(d, erase + ["\x1b[31m"], "reason may not contain control characters (U+0000..U+001F, U+007F)")
    assert d.counts() == before

    # At the limits, and with non-ASCII text, the same commands work and the journal keeps the value.
    principal = "Zoë 😀" + "p" * 195  # 200 characters, 205 bytes
    assert len(principal) == 200 and len(principal.encode()) > 200
    d.api_key("acme", "writer", principal)
    reason = "ü" * 1024  # 1024 characters, 2048 bytes
    out = json.loads(d.run(*revoke[:-1], "--reason", reason).stdout)
    with d.su() as c:
        payloads = [r[0] for r in c.execute(
            "SELECT convert_from(signed_bytes, 'UTF8')::jsonb -> 'payload' FROM oml.journal j "
            "JOIN oml.tenants t USING (tenant_id) WHERE t.name = 'acme' AND seq >= %s - 1 ORDER BY seq",
            (out["revoked_seq"],)).fetchall()]
    assert payloads[0]["principal"] == principal
    assert payloads[1]["reason"] == reason
