// `oml status`: where the lake writer of one outbox stream stands, read without disturbing it.
//
// One snapshot of: the frontier (lake_frontier), the horizon (a fresh probe, outbox_cut.h: the
// candidate L and whether it became stable within a short wait), the lag (outbox rows above the
// frontier, and the age of the oldest of them), the transactions holding the horizon back
// (HorizonHolders), each target table's txn version for the stream's appId, the lease and the
// dead letters not yet requeued.
//
// Roles: runs as oml_lakewriter (sql/0008_lakewriter.sql) or a superuser. Reads only, and takes
// no xid (ProbeHorizonWithoutXid): monitors may poll it. Each call lists every table once
// (TableStatus::missing_files): on S3, one LIST request per 1,000 objects of a table.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "db/conn.h"
#include "lake/outbox_cut.h"

namespace oml::lake {

struct TableStatus {
  std::string name;                     // "bronze/events"
  std::string uri;                      // <lake_root>/<name>
  bool exists = false;                  // false: no Delta table there (yet)
  std::optional<int64_t> table_version; // the table's latest version
  int64_t txn_version = -1;             // last txn version for the appId; -1: none
  // What the writer recorded the table must hold (oml.lake_table_txn, sql/0018); -1: nothing.
  // txn_version below it: the table lost commits (or was replaced), and the rows in between are
  // lag until the writer's recovery refills them.
  int64_t recorded_txn = -1;
  // Data files the table's newest version names that the store lacks (every read of the table
  // fails on them; `oml lake rebuild` repairs it), and why the table could not be read at all
  // (a damaged commit, "lake-commit-damaged: ..."); empty: neither.
  std::vector<std::string> missing_files;
  std::string unreadable;
  // A txn of -1 (no commit of the stream) holds what 0 holds: nothing.
  bool behind() const { return std::max<int64_t>(txn_version, 0) < recorded_txn; }
};

struct LakeStatus {
  std::string stream;
  std::string app_id;
  int64_t frontier = 0;
  int64_t candidate = 0;      // L of the probe taken for this status
  bool stable = false;        // L became stable within the wait
  int64_t lag_rows = 0;       // outbox rows of the stream with seq > frontier
  std::optional<double> lag_seconds;  // now() - the oldest such row's enqueued_at; nullopt: none
  std::vector<HorizonHolder> holders;  // empty when stable
  std::vector<TableStatus> tables;     // TargetTables(), in commit order
  int64_t dead_letters = 0;   // dead_letter rows of the stream not requeued
  // The lease is held iff a session holds its advisory lock (lakewriter.h, step 1); lease_holder
  // is then lake_frontier.lease_holder, and empty when no writer holds it (a writer that
  // stopped or died leaves its name behind: last_holder).
  bool lease_held = false;
  std::string lease_holder;   // empty: nobody holds the lease now
  std::string last_holder;    // lake_frontier.lease_holder as recorded; empty: nobody ever
  int64_t lease_epoch = 0;

  // The stable horizon: the candidate if it is stable, else unknown (a running transaction holds
  // it back; the frontier is then the newest horizon known to be stable).
  std::optional<int64_t> stable_horizon() const { return stable ? std::optional<int64_t>(candidate) : std::nullopt; }

  nlohmann::json ToJson() const;
  // Human-readable, several lines, each ending in '\n'.
  std::string ToText() const;
};

// Reads the status of stream `s` over `c` (not inside a transaction) and the lake at lake_root.
// `stable_wait`: how long to poll the probe for stability before naming the holders.
// kNotFound "unknown-stream" if the stream has no lake_frontier row.
Result<LakeStatus> ReadLakeStatus(db::Conn& c, const OutboxStream& s, const std::string& lake_root,
                                  std::chrono::milliseconds stable_wait = std::chrono::milliseconds(500));

}  // namespace oml::lake
