// Test-only: one private PostgreSQL cluster per test binary (initdb in a temp dir, run as the
// `postgres` system user when the tests run as root), migrated, stopped at exit.
#pragma once

#include <string>

namespace oml::db::testing {

// Starts the cluster on first use. Aborts the test binary if it cannot start.
const std::string& SuperuserUrl();
const std::string& AppUrl();
const std::string& LakewriterUrl();  // the oml_lakewriter role (sql/0008_lakewriter.sql)
const std::string& ReconcilerUrl();  // the oml_reconciler role (sql/0023_reconciler.sql)

}  // namespace oml::db::testing
