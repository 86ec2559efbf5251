// Versioned schema migrations (sql/NNNN_name.sql, embedded into the binary at build time).
//
// Contract:
//  - Each migration runs in its own transaction together with its schema_migrations row, so a
//    failed migration leaves nothing behind.
//  - Applying twice does nothing (applied versions are recorded with a SHA-256 of their text;
//    an applied migration whose text changed is reported as kFailedPrecondition).
//  - A database whose highest applied version is newer than the binary's is refused with
//    kFailedPrecondition, type "schema-newer".
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "db/conn.h"

namespace oml::db {

struct Migration {
  int version;
  std::string name;
  std::string sql;
};

// All migrations compiled into this binary, ascending by version.
const std::vector<Migration>& EmbeddedMigrations();
int LatestSchemaVersion();

struct MigrateOptions {
  // Password for the oml_app login role; empty leaves it unset (trust/peer/cert auth).
  std::string app_password;
  // Password for the oml_lakewriter login role (`oml lakewriter`); empty leaves it unset.
  std::string lakewriter_password;
  // Password for the oml_reconciler login role (`oml reconcile`); empty leaves it unset.
  std::string reconciler_password;
};

// Runs as an administrator (a superuser or a role with CREATEROLE and CREATE on the database).
// Creates roles oml_owner (NOLOGIN, owns all objects), oml_app, oml_lakewriter and
// oml_reconciler (LOGIN, NOBYPASSRLS; sql/0008_lakewriter.sql and sql/0023_reconciler.sql grant
// the latter two their few privileges) if missing, then applies pending migrations as oml_owner. Returns the versions applied now (empty when
// up to date).
Result<std::vector<int>> Migrate(Conn& admin, const MigrateOptions& opts);

// The highest applied version (0 if none). Works as oml_app.
Result<int> AppliedSchemaVersion(Conn& c);

// For `oml serve`: OK iff the applied version equals the binary's. Newer -> kFailedPrecondition
// "schema-newer"; older -> kFailedPrecondition "schema-older" (run oml migrate).
Status CheckSchemaVersion(Conn& c);

}  // namespace oml::db
