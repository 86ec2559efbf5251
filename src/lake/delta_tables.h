// Delta Lake tables of the lake (D2), created through rust/oml-storage (delta-rs).
// The lake writer that fills them comes later (ROADMAP.md); for now `oml init` creates
// the empty tables so their schema is fixed and documented (docs/data/delta-tables.md).
#pragma once

#include <string>

#include "common/status.h"

namespace oml::lake {

// Creates `<lake_root>/bronze/events` as an empty Delta table if it does not exist yet.
// lake_root: a local absolute path, file:// URL or s3://bucket/prefix URL.
// Idempotent: an existing table with the same schema is left alone (OK);
// an existing table with a different schema is kFailedPrecondition.
Status EnsureBronzeEvents(const std::string& lake_root);

// Version of the Delta table at uri (0 right after creation). kNotFound if no table is there.
Result<int64_t> TableVersion(const std::string& table_uri);

}  // namespace oml::lake
