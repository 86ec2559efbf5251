// Settings: $OML_HOME/oml.toml, overridden by environment variables.
//
// Precedence (highest first): environment, oml.toml, built-in defaults. OML_HOME itself comes
// only from the environment (default ".oml"). Every path default is relative to OML_HOME.
//
//   key in oml.toml       environment            default
//   database_url          OML_DATABASE_URL       "" (oml dev: start the private cluster)
//   listen                OML_LISTEN             127.0.0.1:8470
//   signing_key_file      OML_SIGNING_KEY        $OML_HOME/keys/signing.key
//   kek_file              OML_KEK_FILE           $OML_HOME/keys/kek.key
//   object_store_url      OML_OBJECT_STORE_URL   file://$OML_HOME/objects (absolute)
//   lake_root             OML_LAKE_ROOT          $OML_HOME/lake
//   max_body_bytes        OML_MAX_BODY_BYTES     1048576
//   db_pool_size          OML_DB_POOL_SIZE       16
//   http_threads          OML_HTTP_THREADS       32
//   head_publish_ms       OML_HEAD_PUBLISH_MS    200
//   idempotency_ttl_s     OML_IDEMPOTENCY_TTL_S  86400 (1..2592000 s; how long an Idempotency-Key is honoured)
//   log_level             OML_LOG_LEVEL          info
//   reduced_durability    OML_REDUCED_DURABILITY false  (true/false, 1/0, yes/no, on/off; toml bool ok)
//   durability_check_ms   OML_DURABILITY_CHECK_MS 5000  (at least 100)
//
// reduced_durability: `oml serve` acknowledges writes although the database does not run
// synchronous quorum replication (db/durability.h); the --reduced-durability flag sets it too.
// Without it, such a database gets every write refused (503 durability-reduced). The settings
// are re-checked every durability_check_ms.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace oml {

struct Config {
  std::string home = ".oml";
  std::string database_url;
  std::string listen = "127.0.0.1:8470";
  std::string signing_key_file;
  std::string kek_file;
  std::string object_store_url;
  std::string lake_root;
  uint64_t max_body_bytes = 1 << 20;
  int db_pool_size = 16;
  int http_threads = 32;
  int head_publish_ms = 200;
  int64_t idempotency_ttl_s = 86400;
  std::string log_level = "info";
  bool reduced_durability = false;
  int durability_check_ms = 5000;

  std::string ListenHost() const;
  int ListenPort() const;
};

// Loads the configuration as described above. Fails with kInvalidArgument on a malformed
// oml.toml or an unparsable numeric value, naming the key.
Result<Config> LoadConfig();

}  // namespace oml
