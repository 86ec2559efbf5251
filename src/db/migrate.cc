#include "db/migrate.h"

#include <openssl/evp.h>

#include "common/log.h"

namespace oml::db {
namespace {

std::string Sha256Hex(const std::string& s) {
  unsigned char md[32];
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), md, &n, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

}  // namespace

int LatestSchemaVersion() {
  const auto& all = EmbeddedMigrations();
  return all.empty() ? 0 : all.back().version;
}

Result<int> AppliedSchemaVersion(Conn& c) {
  OML_ASSIGN_OR_RETURN(Rows r, c.Query("SELECT to_regclass('oml.schema_migrations') IS NOT NULL"));
  if (r.Get(0, 0) != "t") return 0;
  OML_ASSIGN_OR_RETURN(Rows v, c.Query("SELECT coalesce(max(version), 0) FROM oml.schema_migrations"));
  return static_cast<int>(v.GetInt(0, 0));
}

Status CheckSchemaVersion(Conn& c) {
  OML_ASSIGN_OR_RETURN(int applied, AppliedSchemaVersion(c));
  int mine = LatestSchemaVersion();
  if (applied > mine) {
    return FailedPrecondition("database schema version " + std::to_string(applied) +
                                  " is newer than this binary's " + std::to_string(mine) + "; upgrade oml",
                              "schema-newer");
  }
  if (applied < mine) {
    return FailedPrecondition("database schema version " + std::to_string(applied) + " is older than " +
                                  std::to_string(mine) + "; run `oml migrate`",
                              "schema-older");
  }
  return Status::Ok();
}

Result<std::vector<int>> Migrate(Conn& admin, const MigrateOptions& opts) {
  // Roles are cluster-wide and cannot be created inside the migration transactions' owner role.
  std::string roles =
      "DO $$ BEGIN "
      "IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'oml_owner') THEN CREATE ROLE oml_owner NOLOGIN; END IF; "
      "IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'oml_app') THEN "
      "  CREATE ROLE oml_app LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE; END IF; "
      "IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'oml_lakewriter') THEN "
      "  CREATE ROLE oml_lakewriter LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE; END IF; "
      "IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'oml_reconciler') THEN "
      "  CREATE ROLE oml_reconciler LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE; END IF; "
      "END $$; "
      "ALTER ROLE oml_app NOBYPASSRLS NOSUPERUSER; "
      "ALTER ROLE oml_lakewriter NOBYPASSRLS NOSUPERUSER; "
      "ALTER ROLE oml_reconciler NOBYPASSRLS NOSUPERUSER; "
      "GRANT oml_owner TO CURRENT_USER;";
  OML_RETURN_IF_ERROR(admin.Exec(roles).status());
  // pg_read_all_stats (statistics only, no table data) for three roles; without it each still
  // works, with less to say:
  //   - oml_lakewriter names the backend holding its stable horizon back (lake/outbox_cut.h,
  //     HorizonHolders) with that backend's transaction and query start times (else NULL);
  //   - oml_reconciler (sql/0023_reconciler.sql) reads the outbox the same way;
  //   - oml_owner owns oml.sync_standbys() (sql/0026_sync_standbys.sql), which reads
  //     pg_stat_replication's state columns for `oml serve` and `oml doctor` (else unknown).
  struct StatsGrant {
    const char* role;
    const char* without;  // what the role cannot do without the grant, for the warning
  };
  for (const StatsGrant& g : {
           StatsGrant{"oml_lakewriter", "`oml status` will name the backend holding the lake horizon back without "
                                        "its transaction and query start times"},
           StatsGrant{"oml_reconciler", "`oml reconcile` will name the backend holding the outbox horizon back "
                                        "without its transaction and query start times"},
           StatsGrant{"oml_owner", "`oml serve` and `oml doctor` cannot tell how many synchronous standbys are "
                                   "streaming"},
       }) {
    if (!admin.Exec(std::string("GRANT pg_read_all_stats TO ") + g.role).ok())
      log::Warn(std::string("this administrator cannot grant pg_read_all_stats to ") + g.role + ": " + g.without);
  }
  // English server messages for oml_app (sql/0004_durability.sql says why they are here, not
  // in a migration): lc_messages is superuser-only, so oml_app may SET it only when granted,
  // and granting it takes a superuser (or a holder of SET WITH GRANT OPTION on it).
  OML_ASSIGN_OR_RETURN(Rows may_grant,
                       admin.Query("SELECT has_parameter_privilege('lc_messages', 'SET WITH GRANT OPTION')"));
  if (may_grant.Get(0, 0) == "t") {
    OML_RETURN_IF_ERROR(admin.Exec("GRANT SET ON PARAMETER lc_messages TO oml_app, oml_lakewriter, oml_reconciler; "
                                   "ALTER ROLE oml_app SET lc_messages = 'C'; "
                                   "ALTER ROLE oml_lakewriter SET lc_messages = 'C'; "
                                   "ALTER ROLE oml_reconciler SET lc_messages = 'C';")
                            .status());
  } else {
    log::Warn("this administrator cannot grant SET on lc_messages to oml_app: its server messages follow the "
              "server's language (oml does not depend on them; run oml migrate once as a superuser to fix)");
  }
  // The server receives the verifier (hashed on this side with the server's
  // password_encryption), never the cleartext, so no statement log holds the password.
  auto set_password = [&admin](const char* role, const std::string& password) -> Status {
    if (password.empty()) return Status::Ok();
    char* verifier = PQencryptPasswordConn(admin.raw(), password.c_str(), role, nullptr);
    if (verifier == nullptr)
      return Internal(std::string("cannot hash the ") + role + " password: " + PQerrorMessage(admin.raw()));
    const std::string lit = QuoteLiteral(admin, verifier);
    PQfreemem(verifier);
    return admin.Exec(std::string("ALTER ROLE ") + role + " PASSWORD " + lit).status();
  };
  OML_RETURN_IF_ERROR(set_password("oml_app", opts.app_password));
  OML_RETURN_IF_ERROR(set_password("oml_lakewriter", opts.lakewriter_password));
  OML_RETURN_IF_ERROR(set_password("oml_reconciler", opts.reconciler_password));
  OML_RETURN_IF_ERROR(admin.Exec(
      "DO $$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %I TO oml_app, oml_lakewriter, oml_reconciler', "
      "current_database()); END $$; "
      "CREATE SCHEMA IF NOT EXISTS oml AUTHORIZATION oml_owner; "
      "SET ROLE oml_owner; "
      "CREATE TABLE IF NOT EXISTS oml.schema_migrations ("
      "  version integer PRIMARY KEY, name text NOT NULL, sha256 text NOT NULL,"
      "  applied_at timestamptz NOT NULL DEFAULT now()); "
      "GRANT USAGE ON SCHEMA oml TO oml_app; "
      "GRANT SELECT ON oml.schema_migrations TO oml_app; "
      "GRANT USAGE ON SCHEMA oml TO oml_lakewriter; "
      "GRANT SELECT ON oml.schema_migrations TO oml_lakewriter; "
      "GRANT USAGE ON SCHEMA oml TO oml_reconciler; "
      "GRANT SELECT ON oml.schema_migrations TO oml_reconciler; "
      "RESET ROLE;").status());
  // No oml role needs temporary objects, and pg_temp is where a role would plant a type or a
  // relation to shadow one a function uses (sql/0017_pinned_search_path.sql). Every function
  // pins its path regardless; this takes the tool away as well. A database privilege: only the
  // database's owner (or a superuser) may revoke it, so an administrator who is neither is told.
  OML_RETURN_IF_ERROR(admin.Exec(
      "DO $$ BEGIN EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC, oml_app, oml_lakewriter, oml_reconciler', "
      "current_database()); END $$;").status());
  OML_ASSIGN_OR_RETURN(Rows temp, admin.Query(
      "SELECT string_agg(r, ', ' ORDER BY r) FROM unnest(ARRAY['oml_app', 'oml_lakewriter', 'oml_reconciler']) r "
      "WHERE has_database_privilege(r, current_database(), 'TEMPORARY')"));
  if (!temp.IsNull(0, 0)) {
    log::Warn("this administrator cannot revoke TEMPORARY on the database from PUBLIC (it is not the database's "
              "owner): " + temp.Get(0, 0) + " can still create temporary objects; every oml function pins its "
              "search_path, so this is defence in depth only. Run `oml migrate` once as the owner to close it");
  }

  OML_ASSIGN_OR_RETURN(Rows applied, admin.Query("SELECT version, sha256 FROM oml.schema_migrations ORDER BY version"));
  int max_applied = 0;
  for (int i = 0; i < applied.size(); ++i) max_applied = std::max<int>(max_applied, applied.GetInt(i, 0));
  if (max_applied > LatestSchemaVersion()) {
    return FailedPrecondition("database schema version " + std::to_string(max_applied) +
                                  " is newer than this binary's " + std::to_string(LatestSchemaVersion()) +
                                  "; refusing to migrate",
                              "schema-newer");
  }
  std::vector<int> done;
  for (const auto& m : EmbeddedMigrations()) {
    std::string digest = Sha256Hex(m.sql);
    bool already = false;
    for (int i = 0; i < applied.size(); ++i) {
      if (applied.GetInt(i, 0) != m.version) continue;
      already = true;
      if (applied.Get(i, 1) != digest) {
        return FailedPrecondition("migration " + m.name + " was applied with different text (sha256 " +
                                      applied.Get(i, 1) + ", binary has " + digest + ")",
                                  "migration-changed");
      }
    }
    if (already) continue;
    OML_RETURN_IF_ERROR(admin.Exec("BEGIN; SET LOCAL ROLE oml_owner;").status());
    auto r = admin.Exec(m.sql);
    if (r.ok()) {
      r = admin.Query("INSERT INTO oml.schema_migrations (version, name, sha256) VALUES ($1, $2, $3)",
                      {Int(m.version), Text(m.name), Text(digest)});
    }
    if (!r.ok()) {
      (void)admin.Exec("ROLLBACK");
      return Status(r.status().code(), "migration " + m.name + ": " + r.status().message(), r.status().type())
          .WithLogDetail(r.status().log_detail());
    }
    OML_RETURN_IF_ERROR(admin.Exec("COMMIT").status());
    log::Info("migration applied", {{"version", m.version}, {"name", m.name}});
    done.push_back(m.version);
  }
  return done;
}

}  // namespace oml::db
