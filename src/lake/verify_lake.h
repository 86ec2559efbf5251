// `oml verify --from-lake`: the chain checks of `oml verify` (journal/verify.h) over the lake's
// bronze/events table, reading nothing from PostgreSQL.
//
// The table is read whole, at its latest version, into memory (DeltaTable::ReadRowsJsonl): one
// snapshot, so every chain is checked as of one table version. Rows are grouped by tenant_id
// and walked by seq exactly as `oml verify` walks oml.journal; the head of a chain is its last
// row. On top of `oml verify`'s checks, each row's own columns must agree with its signed
// bytes: principal, occurred_at and the payload columns artifact_id .. ciphertext_sha256 (as
// journal/bronze_row.h derives them), and a (tenant_id, seq) stored twice is reported ("seq N is
// stored more than once"): exactly-once is what the lake writer promises.
//
// The lake is a prefix of the journal (the writer's lag): a chain that ends before a head
// published less than VerifyOptions::prefix_lag_grace ago, and a tenant.created that is the
// provider chain's last event in the lake with no genesis yet, are not findings. A chain short of
// an older published head is (the lake lost its tail, or its writer stopped).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "journal/verify.h"

namespace oml::lake {

struct LakeVerifyReport {
  journal::VerifyReport chains;
  std::string table_uri;      // <lake_root>/bronze/events
  int64_t table_version = 0;  // the version read
  int64_t rows = 0;           // rows in that version
};

// Verifies every chain in <lake_root>/bronze/events with opts (heads: the published heads are
// compared where the lake holds their seq). kFailedPrecondition "lake-table-missing" if there is
// no table, "lake-schema-mismatch" if it lacks a chain column; a row whose chain columns do not
// decode is a finding at its seq, not an error.
// RFC 3339 UTC text ("...T...[.fraction](Z|+00:00)", as arrow-json writes a UTC timestamp and
// envelopes carry `time`) or integer microseconds -> microseconds since the epoch; nullopt for
// anything else (another offset, a malformed text).
std::optional<int64_t> UtcMicros(const nlohmann::json& v);

Result<LakeVerifyReport> VerifyChainsFromLake(const std::string& lake_root, const journal::VerifyOptions& opts);

}  // namespace oml::lake
