#include "lake/verify_lake.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "crypto/crypto.h"
#include "journal/bronze_row.h"
#include "journal/provider.h"
#include "lake/delta_tables.h"

namespace oml::lake {
namespace {

using journal::ChainRow;
using journal::ChainSource;
using nlohmann::json;

// The columns a chain needs; a table without one of them cannot be verified.
constexpr const char* kChainColumns[] = {"tenant_id", "seq", "prev_hash", "event_hash", "event_type",
                                         "key_id", "signed_bytes", "signature"};
// The columns compared with the signed event (journal/bronze_row.h), where the table has them.
constexpr const char* kPayloadColumns[] = {"artifact_id", "version", "workarea_id", "path", "provenance",
                                           "simulation_id", "plaintext_sha256", "ciphertext_sha256"};

std::string Show(const json& v) { return v.is_null() ? "null" : v.dump(); }

// bronze/events at one table version, held in memory, grouped by tenant and sorted by
// (seq, outbox_seq). Immutable after Open(): every read is thread-safe.
class BronzeChainSource final : public ChainSource {
 public:
  explicit BronzeChainSource(std::string uri) : uri_(std::move(uri)) {}

  Status Open() override {
    auto table = DeltaTable::Open(uri_);
    if (!table.ok()) {
      if (table.status().code() == Code::kNotFound)
        return FailedPrecondition("no Delta table at " + uri_ + ": run `oml init` (and the lake writer)",
                                  "lake-table-missing");
      return table.status();
    }
    OML_ASSIGN_OR_RETURN(version_, table->SnapshotVersion());
    OML_ASSIGN_OR_RETURN(json schema, table->Schema());
    std::map<std::string, bool> has;
    for (const auto& c : schema["columns"]) has[c.value("name", "")] = true;
    std::string missing;
    for (const char* c : kChainColumns)
      if (!has.count(c)) missing += std::string(missing.empty() ? "" : ", ") + c;
    if (!missing.empty())
      return FailedPrecondition("Delta table " + uri_ + " lacks the chain columns " + missing +
                                    ": it is not an oml bronze/events table",
                                "lake-schema-mismatch");
    // A data file the log names and the store lacks: every read fails on it. Named, with the fix.
    OML_ASSIGN_OR_RETURN(std::vector<std::string> lost, table->MissingFiles());
    if (!lost.empty())
      return DataLoss(uri_ + " version " + std::to_string(version_) + " names " + std::to_string(lost.size()) +
                          " data file(s) the store lacks (" + lost.front() +
                          (lost.size() > 1 ? ", ..." : "") + "): run `oml lake rebuild --table bronze/events`",
                      "lake-file-missing");
    OML_ASSIGN_OR_RETURN(std::string text, table->ReadRowsJsonl());
    std::istringstream in(text);
    struct Keyed {
      int64_t outbox_seq;
      ChainRow row;
    };
    std::map<std::string, std::vector<Keyed>> by_tenant;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (r.is_discarded() || !r.is_object() || !r["tenant_id"].is_string() || !r["seq"].is_number_integer())
        return Internal("bronze row of " + uri_ + " is not what the adapter writes: " + line.substr(0, 200));
      ++rows_;
      ChainRow row;
      row.seq = r["seq"].get<int64_t>();
      row.type = r.value("event_type", "");
      row.key_id = r.value("key_id", "");
      // Hex columns: the hashes as the table stores them, the binary ones as the adapter encodes them.
      for (auto [col, out] : {std::pair<const char*, std::string*>{"prev_hash", &row.prev_hash},
                              {"event_hash", &row.event_hash},
                              {"signed_bytes", &row.signed_bytes},
                              {"signature", &row.signature}}) {
        auto raw = r[col].is_string() ? crypto::FromHex(r[col].get<std::string>())
                                      : Result<std::string>(DataLoss("null"));
        if (raw.ok()) *out = std::move(*raw);
        else if (row.defect.empty()) row.defect = std::string("the bronze column ") + col + " is not hex";
      }
      row.columns = json::object();
      for (const char* c : {"principal", "occurred_at"})
        if (r.contains(c)) row.columns[c] = r[c];
      for (const char* c : kPayloadColumns)
        if (r.contains(c)) row.columns[c] = r[c];
      const int64_t outbox_seq = r.value("outbox_seq", int64_t{0});
      by_tenant[r["tenant_id"].get<std::string>()].push_back({outbox_seq, std::move(row)});
    }
    for (auto& [tenant, v] : by_tenant) {
      std::sort(v.begin(), v.end(), [](const Keyed& a, const Keyed& b) {
        return a.row.seq != b.row.seq ? a.row.seq < b.row.seq : a.outbox_seq < b.outbox_seq;
      });
      std::vector<ChainRow>& rows = chains_[tenant];
      rows.reserve(v.size());
      for (auto& k : v) rows.push_back(std::move(k.row));
    }
    return Status::Ok();
  }

  // Every tenant with a row: the provider first, then by id. Names are ids: the verifier names
  // each created tenant by its tenant.created.
  Result<std::vector<journal::TenantInfo>> Tenants() override {
    if (!chains_.count(journal::kProviderTenant))
      return FailedPrecondition("bronze/events (" + uri_ + " version " + std::to_string(version_) +
                                    ") holds no provider chain: the lake writer has not written yet",
                                "lake-empty");
    std::vector<journal::TenantInfo> out = {{journal::kProviderTenant, "provider"}};
    for (const auto& [id, rows] : chains_)
      if (id != journal::kProviderTenant) out.push_back({id, id});
    return out;
  }

  Result<ChainHead> Head(const std::string& tenant) override {
    const std::vector<ChainRow>* rows = Rows(tenant);
    if (rows == nullptr || rows->empty()) return ChainHead{};
    return ChainHead{rows->back().seq, rows->back().event_hash};
  }

  Result<FirstPage> HeadAndFirstPage(const std::string& tenant, int64_t hash_seq, int limit) override {
    FirstPage out;
    OML_ASSIGN_OR_RETURN(out.head, Head(tenant));
    out.rows = Slice(tenant, 0, out.head.seq, limit);
    if (const std::vector<ChainRow>* rows = Rows(tenant); rows != nullptr && hash_seq > 0) {
      auto it = std::lower_bound(rows->begin(), rows->end(), hash_seq,
                                 [](const ChainRow& r, int64_t s) { return r.seq < s; });
      if (it != rows->end() && it->seq == hash_seq) out.hash_at = it->event_hash;
    }
    return out;
  }

  Result<std::vector<ChainRow>> Page(const std::string& tenant, int64_t after, int64_t upto, int limit) override {
    return Slice(tenant, after, upto, limit);
  }

  Result<std::vector<ChainRow>> FirstKeyIssued(const std::string& tenant) override {
    if (const std::vector<ChainRow>* rows = Rows(tenant))
      for (const auto& r : *rows)
        if (r.type == "key.issued") return std::vector<ChainRow>{r};
    return std::vector<ChainRow>{};
  }

  // The row's own columns against its signed event.
  Status CheckRow(const std::string& tenant, const ChainRow& row, const journal::Envelope& env) const override {
    const json& c = row.columns;
    if (c.contains("principal") && c["principal"] != json(env.principal))
      return DataLoss("the bronze column principal (" + Show(c["principal"]) + ") differs from the signed event (" +
                      json(env.principal).dump() + ")");
    if (c.contains("occurred_at")) {
      auto at = UtcMicros(c["occurred_at"]);
      if (!at || at != UtcMicros(json(env.time)))
        return DataLoss("the bronze column occurred_at (" + Show(c["occurred_at"]) +
                        ") differs from the signed time " + env.time);
    }
    const json want = journal::BronzePayloadColumns(env);
    for (const char* k : kPayloadColumns) {
      if (!c.contains(k)) continue;  // a table without the payload columns: nothing to compare
      if (c[k] != want[k])
        return DataLoss(std::string("the bronze column ") + k + " (" + Show(c[k]) + ") differs from the signed event (" +
                        Show(want[k]) + ")");
    }
    return Status::Ok();
  }

  bool IsPrefix() const override { return true; }

  std::string MissingChain(bool registered) const override {
    return "chain has no rows in bronze/events, but its tenant.created is followed by later provider events there";
  }

  int64_t version() const { return version_; }
  int64_t rows() const { return rows_; }

 private:
  const std::vector<ChainRow>* Rows(const std::string& tenant) const {
    auto it = chains_.find(tenant);
    return it == chains_.end() ? nullptr : &it->second;
  }

  // Rows with after < seq <= upto, at most `limit`, plus any further rows of the last one's seq
  // (duplicates stay on one page, so the walk sees them side by side).
  std::vector<ChainRow> Slice(const std::string& tenant, int64_t after, int64_t upto, int limit) const {
    std::vector<ChainRow> out;
    const std::vector<ChainRow>* rows = Rows(tenant);
    if (rows == nullptr) return out;
    auto it = std::upper_bound(rows->begin(), rows->end(), after,
                               [](int64_t s, const ChainRow& r) { return s < r.seq; });
    for (; it != rows->end() && it->seq <= upto; ++it) {
      if (out.size() >= static_cast<size_t>(limit) && it->seq != out.back().seq) break;
      out.push_back(*it);
    }
    return out;
  }

  std::string uri_;
  int64_t version_ = 0;
  int64_t rows_ = 0;
  std::map<std::string, std::vector<ChainRow>> chains_;  // tenant -> rows by (seq, outbox_seq)
};

}  // namespace

// RFC 3339 UTC text ("...T...[.fraction](Z|+00:00)", as arrow-json writes a UTC timestamp and
// as envelopes carry `time`) or integer microseconds -> microseconds since the epoch.
std::optional<int64_t> UtcMicros(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (!v.is_string()) return std::nullopt;
  const std::string& s = v.get_ref<const std::string&>();
  // "YYYY-MM-DDTHH:MM:SS" exactly (digits where digits go), then the fraction and the zone.
  if (s.size() < 20) return std::nullopt;
  int f[6];
  static constexpr int kAt[6] = {0, 5, 8, 11, 14, 17}, kLen[6] = {4, 2, 2, 2, 2, 2};
  for (int k = 0; k < 6; ++k) {
    int x = 0;
    for (int j = kAt[k]; j < kAt[k] + kLen[k]; ++j) {
      if (s[j] < '0' || s[j] > '9') return std::nullopt;
      x = x * 10 + (s[j] - '0');
    }
    f[k] = x;
  }
  if (s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':') return std::nullopt;
  size_t i = 19;
  int64_t frac = 0;
  int digits = 0;
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++digits)
      if (digits < 6) frac = frac * 10 + (s[i] - '0');
    if (digits == 0) return std::nullopt;
    for (int d = std::min(digits, 6); d < 6; ++d) frac *= 10;
  }
  const std::string_view zone = std::string_view(s).substr(i);
  if (zone != "Z" && zone != "+00:00") return std::nullopt;
  // A month outside 1..12, a day outside 1..31, an hour past 23, a minute or second past 59 (60
  // for a leap second) is not a time; a day past its month's end carries over, as timegm does.
  if (f[1] < 1 || f[1] > 12 || f[2] < 1 || f[2] > 31 || f[3] > 23 || f[4] > 59 || f[5] > 60) return std::nullopt;
  using namespace std::chrono;
  const int64_t days_since_epoch =
      sys_days(year_month_day(year(f[0]), month(static_cast<unsigned>(f[1])), day(1))).time_since_epoch().count() +
      (f[2] - 1);
  return (days_since_epoch * 86400 + int64_t{f[3]} * 3600 + int64_t{f[4]} * 60 + f[5]) * 1000000 + frac;
}


Result<LakeVerifyReport> VerifyChainsFromLake(const std::string& lake_root, const journal::VerifyOptions& opts) {
  if (lake_root.empty()) return InvalidArgument("lake root is empty");
  BronzeChainSource source(TableUri(lake_root, "bronze/events"));
  OML_ASSIGN_OR_RETURN(journal::VerifyReport chains, journal::VerifyChains(source, opts));
  LakeVerifyReport out;
  out.chains = std::move(chains);
  out.table_uri = TableUri(lake_root, "bronze/events");
  out.table_version = source.version();
  out.rows = source.rows();
  return out;
}

}  // namespace oml::lake
