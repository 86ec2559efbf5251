#include "reconcile/reconcile.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <future>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "crypto/crypto.h"
#include "journal/bronze_row.h"
#include "journal/chain_fold.h"
#include "journal/event.h"
#include "lake/delta_tables.h"
#include "lake/lake_status.h"
#include "lake/outbox_cut.h"
#include "lake/rederive.h"
#include "lake/verify_lake.h"

namespace oml::reconcile {
namespace {

using nlohmann::json;

constexpr char kBronze[] = "bronze/events";
constexpr char kSilver[] = "silver/claims";
constexpr char kGold[] = "gold/daily_activity";

// The bronze columns derived from the signed bytes (journal/bronze_row.h), compared one by one.
constexpr const char* kDerivedColumns[] = {"event_type", "key_id",      "principal",     "artifact_id",
                                           "version",    "workarea_id", "path",          "provenance",
                                           "simulation_id", "plaintext_sha256", "ciphertext_sha256"};
// The silver/claims columns compared one by one (docs/data/delta-tables.md): all but the key and
// outbox_seq (where the writer put the row); body_location from artifact_bodies and the state.
constexpr const char* kSilverColumns[] = {"workarea_id",      "path",          "writer_key_id",    "principal",
                                          "provenance",       "simulation_id", "plaintext_sha256", "ciphertext_sha256",
                                          "media_type",       "size_bytes",    "state",            "last_event_seq",
                                          "submitted_at",     "promoted_at",   "state_changed_at", "body_location"};
constexpr const char* kTimeColumns[] = {"submitted_at", "promoted_at", "state_changed_at"};

std::string Show(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

bool IsTimeColumn(const std::string& c) {
  return std::find_if(std::begin(kTimeColumns), std::end(kTimeColumns), [&](const char* t) { return c == t; }) !=
         std::end(kTimeColumns);
}

// Equal as the lake stores them: timestamps by instant, everything else by JSON value.
bool SameValue(const std::string& column, const json& want, const json& got) {
  if (IsTimeColumn(column) || column == "occurred_at") {
    auto a = lake::UtcMicros(want), b = lake::UtcMicros(got);
    return a && b && *a == *b;
  }
  return want == got;
}

// UTC day "YYYY-MM-DD" of an envelope time (as the lake writer derives gold's day); "" if the
// time does not parse.
// `us`: the time as lake::UtcMicros reads it (parsed once per event by the caller).
std::string DayOf(const std::optional<int64_t>& us) {
  if (!us) return "";
  using namespace std::chrono;
  const sys_days day = floor<days>(sys_time<microseconds>(microseconds(*us)));
  const year_month_day ymd(day);
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04d-%02u-%02u", static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()));
  return buf;
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---- the lake, read first ------------------------------------------------------------------------

// A bronze row decoded for naming the columns that differ (the second pass over rows whose
// digest differs from the journal's).
struct LakeBronzeRow {
  int64_t seq = 0;
  std::string prev_hash, event_hash;  // hex as stored
  std::string signed_sha256;          // raw SHA-256 of signed_bytes; "" if null
  std::string signature;              // raw; "" if null
  json columns;                       // occurred_at and kDerivedColumns
};

// ---- bronze rows as digests ----------------------------------------------------------------------
//
// bronze/events is compared without holding its rows: each row is reduced to (tenant, seq, a
// SHA-256 over every compared column), and each journal event to the same digest of what its row
// must hold. Equal digests mean equal columns; a row whose digest differs is read again
// (DetailBronze) to name the columns.

using Digest = std::array<unsigned char, 32>;

// The columns scanned, in order: the keys, then the digested ones.
enum BronzeCol : int { kTenantCol = 0, kSeqCol, kPrevCol, kHashCol, kSignedCol, kSignatureCol, kOccurredCol, kDerivedCol };

const std::vector<lake::ArrowColumnSpec>& BronzeScanColumns() {
  static const std::vector<lake::ArrowColumnSpec>* k = [] {
    using T = lake::ArrowColumnType;
    auto* v = new std::vector<lake::ArrowColumnSpec>{
        {"tenant_id", T::kString},    {"seq", T::kLong},         {"prev_hash", T::kString},
        {"event_hash", T::kString},   {"signed_bytes", T::kBinary}, {"signature", T::kBinary},
        {"occurred_at", T::kTimestamp}};
    for (const char* c : kDerivedColumns) v->push_back({c, std::string_view(c) == "version" ? T::kLong : T::kString});
    return v;
  }();
  return *k;
}

Digest Sha256Of(std::string_view bytes) {
  // Fetched once: an implicit fetch per call (EVP_sha256()) costs as much as hashing a row.
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  Digest d{};
  unsigned int n = 0;
  // A digest that silently stayed zero would make every row compare equal: never go on.
  if (md == nullptr || EVP_Digest(bytes.data(), bytes.size(), d.data(), &n, md, nullptr) != 1 || n != d.size()) {
    std::fprintf(stderr, "oml reconcile: OpenSSL SHA-256 failed\n");
    std::abort();
  }
  return d;
}

std::string_view View(const Digest& d) { return {reinterpret_cast<const char*>(d.data()), d.size()}; }

// Type-tagged, length-prefixed values, hashed at Finish. Reused across rows.
class RowDigest {
 public:
  void Null() { buf_.push_back('n'); }
  void Str(std::string_view v) {
    buf_.push_back('s');
    const uint32_t n = static_cast<uint32_t>(v.size());
    buf_.append(reinterpret_cast<const char*>(&n), sizeof n);
    buf_.append(v);
  }
  // The same as Str(crypto::Hex(raw)), without the temporary.
  void Hex(std::string_view raw) {
    static constexpr char kDigits[] = "0123456789abcdef";
    buf_.push_back('s');
    const uint32_t n = static_cast<uint32_t>(raw.size() * 2);
    buf_.append(reinterpret_cast<const char*>(&n), sizeof n);
    for (unsigned char c : raw) {
      buf_.push_back(kDigits[c >> 4]);
      buf_.push_back(kDigits[c & 15]);
    }
  }
  void Int(int64_t v) {
    buf_.push_back('i');
    buf_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  Digest Finish() {
    Digest d = Sha256Of(buf_);
    buf_.clear();
    return d;
  }

 private:
  std::string buf_;
};

// The digest of row i of a bronze scan batch.
Digest LakeRowDigest(const lake::ArrowBatchView& b, int64_t i, RowDigest& d) {
  const auto& cols = BronzeScanColumns();
  for (int c = kPrevCol; c < static_cast<int>(cols.size()); ++c) {
    if (b.IsNull(c, i)) {
      d.Null();
    } else if (c == kSignedCol) {
      d.Str(View(Sha256Of(b.Bytes(c, i))));
    } else if (cols[static_cast<size_t>(c)].type == lake::ArrowColumnType::kLong ||
               cols[static_cast<size_t>(c)].type == lake::ArrowColumnType::kTimestamp) {
      d.Int(b.Int64(c, i));
    } else {
      d.Str(b.Bytes(c, i));
    }
  }
  return d.Finish();
}

// The digest of the row the journal event must have (journal/bronze_row.h, the same columns in
// the same order as LakeRowDigest): prev and hash as the journal stores them (raw), hash being
// SHA-256(signed_bytes); time_us the envelope time as lake::UtcMicros reads it.
Digest JournalRowDigest(const journal::Envelope& e, const std::string& prev, const std::string& hash,
                        const std::string& signature, const std::optional<int64_t>& time_us, RowDigest& d) {
  d.Hex(prev);
  d.Hex(hash);
  d.Str(hash);
  d.Str(signature);
  if (time_us) {
    d.Int(*time_us);
  } else {
    d.Str(e.time);  // never equal to a timestamp
  }
  d.Str(e.type);
  d.Str(e.key_id);
  d.Str(e.principal);
  const bool obj = e.payload.is_object();
  for (size_t c = 3; c < std::size(kDerivedColumns); ++c) {
    const char* name = kDerivedColumns[c];
    auto it = obj ? e.payload.find(name) : e.payload.end();
    const bool has = obj && it != e.payload.end();
    if (std::string_view(name) == "version") {
      if (has && it->is_number_integer()) {
        d.Int(it->get<int64_t>());
      } else {
        d.Null();
      }
    } else if (has && it->is_string()) {
      d.Str(it->get_ref<const std::string&>());
    } else {
      d.Null();
    }
  }
  return d.Finish();
}

// RFC 3339 UTC with microseconds, for showing a lake timestamp.
std::string MicrosText(int64_t us) {
  using namespace std::chrono;
  const sys_time<microseconds> t{microseconds(us)};
  const sys_days day = floor<days>(t);
  const year_month_day ymd(day);
  const hh_mm_ss<microseconds> hms(t - day);
  char buf[48];
  const long long frac = static_cast<long long>(hms.subseconds().count());
  int n = std::snprintf(buf, sizeof(buf), "%04d-%02u-%02uT%02d:%02d:%02d", static_cast<int>(ymd.year()),
                        static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                        static_cast<int>(hms.hours().count()), static_cast<int>(hms.minutes().count()),
                        static_cast<int>(hms.seconds().count()));
  // As arrow-json shows one: no fraction, milliseconds or microseconds, whichever is exact.
  if (frac % 1000 != 0) {
    std::snprintf(buf + n, sizeof(buf) - static_cast<size_t>(n), ".%06lldZ", frac);
  } else if (frac != 0) {
    std::snprintf(buf + n, sizeof(buf) - static_cast<size_t>(n), ".%03lldZ", frac / 1000);
  } else {
    std::snprintf(buf + n, sizeof(buf) - static_cast<size_t>(n), "Z");
  }
  return buf;
}

// Row i of a bronze scan batch, decoded.
LakeBronzeRow LakeRowAt(const lake::ArrowBatchView& b, int64_t i) {
  const auto& cols = BronzeScanColumns();
  LakeBronzeRow r;
  r.seq = b.Int64(kSeqCol, i);
  r.prev_hash = std::string(b.Bytes(kPrevCol, i));
  r.event_hash = std::string(b.Bytes(kHashCol, i));
  if (!b.IsNull(kSignedCol, i)) r.signed_sha256 = std::string(View(Sha256Of(b.Bytes(kSignedCol, i))));
  if (!b.IsNull(kSignatureCol, i)) r.signature = std::string(b.Bytes(kSignatureCol, i));
  r.columns = json::object();
  r.columns["occurred_at"] = b.IsNull(kOccurredCol, i) ? json(nullptr) : json(MicrosText(b.Int64(kOccurredCol, i)));
  for (int c = kDerivedCol; c < static_cast<int>(cols.size()); ++c) {
    const std::string& name = cols[static_cast<size_t>(c)].name;
    if (b.IsNull(c, i)) {
      r.columns[name] = nullptr;
    } else if (cols[static_cast<size_t>(c)].type == lake::ArrowColumnType::kLong) {
      r.columns[name] = b.Int64(c, i);
    } else {
      r.columns[name] = std::string(b.Bytes(c, i));
    }
  }
  return r;
}

struct BronzeEntry {
  int64_t seq = 0;
  Digest digest{};
};

// A multiset of bronze rows (a data file's, or the rows of some files): how many, and the sum,
// lane by lane mod 2^64, of SHA-256(tenant_id, 0, seq, row digest) over them. Two sets with the
// same count and sum hold the same rows (short of a crafted collision); the sum does not depend
// on the order, so a compaction that moved rows between files keeps it.
struct RowSet {
  int64_t rows = 0;
  std::array<uint64_t, 4> sum{};

  // What Add sums for a row: SHA-256(tenant_id, 0, seq big-endian, row digest). (The bronze scan
  // calls it per row: no allocation for a tenant id of up to 64 bytes, a uuid's 36 included.)
  static Digest Element(std::string_view tenant, int64_t seq, const Digest& row) {
    std::array<char, 64 + 1 + 8 + 32> stack;
    std::string heap;
    char* buf = stack.data();
    if (tenant.size() > 64) {
      heap.resize(tenant.size() + 1 + 8 + 32);
      buf = heap.data();
    }
    char* at = std::copy(tenant.begin(), tenant.end(), buf);
    *at++ = '\0';
    for (int k = 7; k >= 0; --k) *at++ = static_cast<char>((static_cast<uint64_t>(seq) >> (8 * k)) & 0xff);
    at = std::copy(row.begin(), row.end(), at);
    return Sha256Of(std::string_view(buf, static_cast<size_t>(at - buf)));
  }
  void Add(const Digest& h) {
    ++rows;
    for (int lane = 0; lane < 4; ++lane) {
      uint64_t v = 0;
      for (int k = 0; k < 8; ++k) v = (v << 8) | h[static_cast<size_t>(lane * 8 + k)];
      sum[static_cast<size_t>(lane)] += v;
    }
  }
  void Merge(const RowSet& o) {
    rows += o.rows;
    for (size_t lane = 0; lane < 4; ++lane) sum[lane] += o.sum[lane];
  }
  bool operator==(const RowSet& o) const { return rows == o.rows && sum == o.sum; }
  std::string SumHex() const {
    char buf[65];
    std::snprintf(buf, sizeof(buf), "%016llx%016llx%016llx%016llx", static_cast<unsigned long long>(sum[0]),
                  static_cast<unsigned long long>(sum[1]), static_cast<unsigned long long>(sum[2]),
                  static_cast<unsigned long long>(sum[3]));
    return buf;
  }
  static std::optional<RowSet> Parse(int64_t rows, const std::string& hex) {
    Result<std::string> raw = crypto::FromHex(hex);
    if (!raw.ok() || raw->size() != 32) return std::nullopt;
    RowSet r;
    r.rows = rows;
    for (size_t lane = 0; lane < 4; ++lane)
      for (size_t k = 0; k < 8; ++k) r.sum[lane] = (r.sum[lane] << 8) | static_cast<unsigned char>((*raw)[lane * 8 + k]);
    return r;
  }
};

struct TableRead {
  std::string name;
  bool readable = false;  // rows were read; false: missing, unreadable or behind
  int64_t txn = -1;       // the stream's txn version at the version read
  int64_t version = -1;
  std::string rows_jsonl;  // silver and gold (small tables); bronze is scanned by columns
  std::optional<lake::DeltaTable> handle;  // at `version`: bronze is scanned through it
};

// Opens `name` under lake_root, reads its txn and rows at one version. Findings for a table that
// cannot be compared (missing data files, a damaged log) go to `out`.
Result<TableRead> ReadTable(const std::string& lake_root, const std::string& name, const std::string& app_id,
                            std::vector<Finding>* out) {
  TableRead t;
  t.name = name;
  auto table = lake::DeltaTable::Open(lake::TableUri(lake_root, name));
  if (!table.ok()) {
    if (table.status().code() == Code::kNotFound) {
      out->push_back({"table-unreadable", name, "", 0, lake::TableUri(lake_root, name), "", "a Delta table", "none",
                      "no table: run `oml init`"});
      return t;
    }
    if (table.status().code() == Code::kUnavailable) return table.status();
    out->push_back({"table-unreadable", name, "", 0, lake::TableUri(lake_root, name), "", "", "",
                    table.status().message() + ": run `oml lake rebuild --table " + name + "`"});
    return t;
  }
  OML_ASSIGN_OR_RETURN(t.version, table->SnapshotVersion());
  OML_ASSIGN_OR_RETURN(std::vector<std::string> lost, table->MissingFiles());
  if (!lost.empty()) {
    for (const auto& f : lost)
      out->push_back({"table-unreadable", name, "", 0, f, "", "present", "missing",
                      "a data file version " + std::to_string(t.version) +
                          " names is missing: its rows are lost to readers; run `oml lake rebuild --table " + name +
                          "` (or `oml reconcile --repair`)"});
    return t;
  }
  OML_ASSIGN_OR_RETURN(lake::LastTxn txn, table->ReadLastTxn(app_id));
  t.txn = txn.version;
  if (name != "bronze/events") {
    OML_ASSIGN_OR_RETURN(t.rows_jsonl, table->ReadRowsJsonl());
  }
  t.handle.emplace(std::move(*table));
  t.readable = true;
  return t;
}

// ---- delivery -------------------------------------------------------------------------------------

using lake::DeadLetterRecord;
using lake::RowKey;

class Delivery {
 public:
  // txn: each table's txn (-1: none), as read.
  explicit Delivery(std::map<std::string, int64_t> txn) : txn_(std::move(txn)) {}

  // Loads the dead letters (lake::DeadLetterIndex) and the outbox rows above what each target's
  // tables hold (the lag: normally small), a page at a time. Payload members are read only from
  // silver rows, and only when they have the right JSON type.
  // `delivered_through`: an outbox seq through which every row is known delivered to every
  // table (0: none known): the lag is read above it only.
  Status Load(db::Conn& c, const std::string& stream, const std::string& outbox_table, const std::string& only_tenant,
              int64_t delivered_through = 0) {
    OML_RETURN_IF_ERROR(dead_.Load(c, stream, only_tenant));
    // Silver rows above silver's txn; bronze rows above the lower of bronze's and gold's.
    const int64_t silver_floor = std::max<int64_t>(TxnOf(kSilver), delivered_through);
    const int64_t bronze_floor = std::max<int64_t>(std::min(TxnOf(kBronze), TxnOf(kGold)), delivered_through);
    for (int64_t after = std::min(silver_floor, bronze_floor);;) {
      OML_ASSIGN_OR_RETURN(
          db::Rows lag,
          c.Query("SELECT seq, tenant_id::text, target_table, journal_seq, "
                  "CASE WHEN target_table = 'silver/claims' AND json_typeof(row_data->'artifact_id') = 'string' "
                  "THEN row_data->>'artifact_id' ELSE '' END, "
                  "CASE WHEN target_table = 'silver/claims' AND json_typeof(row_data->'version') = 'number' "
                  "THEN (row_data->>'version')::numeric::bigint ELSE 0 END FROM " +
                      outbox_table +
                      " WHERE seq > $1 AND ((target_table = 'silver/claims' AND seq > $2) OR "
                      "(target_table <> 'silver/claims' AND seq > $3)) ORDER BY seq LIMIT 10000",
                  {db::Int(after), db::Int(silver_floor), db::Int(bronze_floor)}));
      if (lag.size() == 0) break;
      for (int i = 0; i < lag.size(); ++i) {
        const int64_t seq = lag.GetInt(i, 0);
        if (dead_.IsRequeueRow(seq)) continue;
        const std::string tenant = lag.Get(i, 1);
        if (!only_tenant.empty() && tenant != only_tenant) continue;
        lag_[{lag.Get(i, 2), RowKey{tenant, lag.GetInt(i, 3), lag.Get(i, 4), lag.GetInt(i, 5)}}] = seq;
      }
      after = lag.GetInt(lag.size() - 1, 0);
    }
    return Status::Ok();
  }

  // Whether the outbox row `k` of `target` has reached `table`: a dead-lettered row as
  // lake::DeadLetterIndex::DeliveredThrough says for the table's txn; any other once the table's
  // txn passed its outbox seq (a row at or below the floor, or pruned, has).
  bool Delivered(const std::string& target, const RowKey& k, const std::string& table) const {
    if (dead_.letters().empty() && lag_.empty()) return true;  // the usual case, without a lookup
    const int64_t txn = TxnOf(table);
    if (dead_.Find(target, k) != nullptr) return dead_.DeliveredThrough(target, k, table, txn);
    auto l = lag_.find({target, k});
    if (l == lag_.end()) return true;  // at or below the floor (or pruned below the frontier)
    return l->second <= txn;
  }
  const std::vector<DeadLetterRecord>& letters() const { return dead_.letters(); }
  int64_t TxnOf(const std::string& table) const {
    auto it = txn_.find(table);
    return it == txn_.end() ? -1 : it->second;
  }

 private:
  std::map<std::string, int64_t> txn_;
  lake::DeadLetterIndex dead_;
  std::map<std::pair<std::string, RowKey>, int64_t> lag_;
};

// ---- silver rows from the fold -----------------------------------------------------------------

struct SilverExpect {
  json row;          // as of the newest delivered event that enqueued it; null: none delivered
  int64_t seq = 0;   // that event
};

// ---- objects -----------------------------------------------------------------------------------

struct NamedObject {
  std::string tenant, artifact_id, what;  // what: "body" | "attachment <n>"
  int64_t version = 0, seq = 0;           // the event that names it
  std::string ciphertext_sha256;          // hex, from the signed event
  std::optional<uint64_t> size;           // attachments: the journalled ciphertext_size
  std::string place;                      // quarantine | bodies | none (erased)
  int64_t place_since_us = 0;             // signed time of the event that set `place` (0: submission)
  bool carried = false;                   // incremental: taken from the baseline, its claim not replayed
};

Result<std::string> HashObject(blob::ObjectStore& store, const std::string& key, uint64_t size, int64_t* read) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) return Internal("SHA-256 init failed");
  constexpr uint64_t kChunk = 8u << 20;
  for (uint64_t off = 0; off < size; off += kChunk) {
    OML_ASSIGN_OR_RETURN(std::optional<std::string> part, store.GetRange(key, off, kChunk));
    if (!part) return NotFound("object " + key + " vanished while it was read");
    if (part->empty()) break;
    if (EVP_DigestUpdate(ctx.get(), part->data(), part->size()) != 1) return Internal("SHA-256 update failed");
    *read += static_cast<int64_t>(part->size());
  }
  unsigned char md[32];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &n) != 1 || n != 32) return Internal("SHA-256 final failed");
  return crypto::Hex(std::string_view(reinterpret_cast<const char*>(md), 32));
}

}  // namespace

Result<std::optional<std::string>> ObjectSha256(blob::ObjectStore& store, const std::string& key) {
  OML_ASSIGN_OR_RETURN(std::optional<uint64_t> size, store.Size(key));
  if (!size) return std::optional<std::string>();
  int64_t read = 0;
  auto h = HashObject(store, key, *size, &read);
  if (!h.ok() && h.status().code() == Code::kNotFound) return std::optional<std::string>();
  if (!h.ok()) return h.status();
  return std::optional<std::string>(std::move(*h));
}

namespace {

// ---- the journal, a page at a time -------------------------------------------------------------

// The journal events of several chains in (chain, seq) order, a page at a time, in a pipeline:
// while the caller replays page k, page k+1's envelopes are parsed (on two threads) and page k+2
// is fetched (on the same connection). The caller must not use the connection between the first
// Next and the end (or the object's destruction).
class JournalPager {
 public:
  struct Page {
    size_t chain = 0;   // index into the chains given
    bool last = false;  // the chain's last page (it may be empty)
    db::Rows rows;      // seq, prev_hash, event_hash, signed_bytes, signature
    std::vector<Result<journal::Envelope>> envs;  // one per row
    // Of each row whose envelope parsed: its time as lake::UtcMicros reads it, and the digest of
    // the bronze row it must have (JournalRowDigest), worked out beside the replay.
    std::vector<std::optional<int64_t>> times;
    std::vector<Digest> digests;
  };

  // A chain: its events after `after` up to `head`.
  struct Span {
    std::string tenant;
    int64_t after = 0, head = 0;
  };

  JournalPager(db::Conn& c, std::vector<Span> chains, int page_rows)
      : c_(c), chains_(std::move(chains)), page_rows_(page_rows) {}
  ~JournalPager() {
    if (next_.valid()) next_.wait();
    if (raw_.valid()) raw_.wait();  // only the page task starts one, so after it
  }

  // The next chain's first page, dropping what chain i has left (its page in flight is awaited,
  // and the pages after it are never fetched); nullopt if no chain follows.
  Result<std::optional<Page>> SkipChain(size_t i) {
    if (!next_.valid()) return std::optional<Page>();
    Result<Page> in_flight = next_.get();  // the connection is free again
    if (in_flight.ok() && in_flight->chain != i) {
      Page page = std::move(*in_flight);
      page.last ? Prefetch(page.chain + 1, kStart) : Prefetch(page.chain, page.rows.GetInt(page.rows.size() - 1, 0));
      return std::optional<Page>(std::move(page));
    }
    if (!Prefetch(i + 1, kStart)) return std::optional<Page>();
    return Next();
  }

  // The next page; nullopt after the last chain's last page.
  Result<std::optional<Page>> Next() {
    if (!next_.valid()) {
      if (started_) return std::optional<Page>();
      started_ = true;
      if (!Prefetch(0, kStart)) return std::optional<Page>();
    }
    OML_ASSIGN_OR_RETURN(Page page, next_.get());
    if (!page.last) {
      Prefetch(page.chain, page.rows.GetInt(page.rows.size() - 1, 0));
    } else {
      Prefetch(page.chain + 1, kStart);
    }
    return std::optional<Page>(std::move(page));
  }

 private:
  // The first non-empty chain from i on (chains_.size() if none).
  size_t NonEmpty(size_t i) const {
    while (i < chains_.size() && chains_[i].head <= chains_[i].after) ++i;  // empty spans have no page
    return i;
  }

  Result<db::Rows> Fetch(size_t i, int64_t after) {
    const Span& span = chains_[i];
    OML_ASSIGN_OR_RETURN(std::vector<db::Rows> r,
                         c_.Pipeline({{"SELECT seq, prev_hash, event_hash, signed_bytes, signature FROM oml.journal "
                                       "WHERE tenant_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4",
                                       {db::Text(span.tenant), db::Int(after), db::Int(span.head), db::Int(page_rows_)},
                                       "reconcile_page", true}}));
    return std::move(r[0]);
  }

  // Starts building chain i's page after `after` (fetched, parsed); false if there is no chain i.
  // The task takes the fetch of the page started by the task before it (raw_) if that was this
  // page (a SkipChain makes it another), and starts the fetch of the page after it before parsing.
  // `after` kStart: the span's own start.
  bool Prefetch(size_t i, int64_t after) {
    const size_t asked = i;
    i = NonEmpty(i);
    if (i >= chains_.size()) return false;
    if (after == kStart || i != asked) after = chains_[i].after;
    next_ = std::async(std::launch::async, [this, i, after]() -> Result<Page> {
      std::optional<Result<db::Rows>> rows;
      if (raw_.valid()) {
        RawPage r = raw_.get();
        // A fetch that failed and is not this page (a SkipChain) still failed the transaction.
        if ((r.chain == i && r.after == after) || !r.rows.ok()) rows.emplace(std::move(r.rows));
      }
      if (!rows) rows.emplace(Fetch(i, after));
      if (!rows->ok()) return rows->status();
      const int64_t head = chains_[i].head;
      Page p{i, false, std::move(**rows), {}};
      const int n = p.rows.size();
      p.last = n == 0 || p.rows.GetInt(n - 1, 0) >= head;
      // The page after this one, fetched while this one is parsed.
      const size_t ni = p.last ? NonEmpty(i + 1) : i;
      const int64_t nafter = p.last ? (ni < chains_.size() ? chains_[ni].after : 0) : p.rows.GetInt(n - 1, 0);
      if (ni < chains_.size())
        raw_ = std::async(std::launch::async, [this, ni, nafter]() { return RawPage{ni, nafter, Fetch(ni, nafter)}; });
      // Parsed on two threads: the second half beside the first (read-only use of the result;
      // each writes its own rows of times and digests).
      p.times.resize(static_cast<size_t>(n));
      p.digests.resize(static_cast<size_t>(n));
      auto parse = [&p](int from, int to) {
        std::vector<Result<journal::Envelope>> v;
        v.reserve(static_cast<size_t>(to - from));
        RowDigest d;
        for (int k = from; k < to; ++k) {
          v.push_back(journal::Envelope::FromVerifiedSignedBytes(p.rows.GetBytes(k, 3)));
          if (!v.back().ok()) continue;
          const journal::Envelope& e = *v.back();
          const auto t = p.times[static_cast<size_t>(k)] = lake::UtcMicros(json(e.time));
          p.digests[static_cast<size_t>(k)] =
              JournalRowDigest(e, p.rows.GetBytes(k, 1), p.rows.GetBytes(k, 2), p.rows.GetBytes(k, 4), t, d);
        }
        return v;
      };
      const int half = n >= 256 ? n / 2 : n;
      std::future<std::vector<Result<journal::Envelope>>> second;
      if (half < n) second = std::async(std::launch::async, parse, half, n);
      p.envs = parse(0, half);
      p.envs.reserve(static_cast<size_t>(n));
      if (second.valid())
        for (auto& e : second.get()) p.envs.push_back(std::move(e));
      return p;
    });
    return true;
  }

  struct RawPage {
    size_t chain = 0;
    int64_t after = 0;
    Result<db::Rows> rows;
  };

  static constexpr int64_t kStart = -1;

  db::Conn& c_;
  const std::vector<Span> chains_;
  const int page_rows_;
  bool started_ = false;
  std::future<Result<Page>> next_;
  std::future<RawPage> raw_;  // the fetch of the page after next_'s, started by next_'s task
};

// ---- the audit ---------------------------------------------------------------------------------

class Auditor {
 public:
  Auditor(db::Conn& c, std::string lake_root, const Stores& stores, const Options& o)
      : c_(c), lake_root_(std::move(lake_root)), stores_(stores), o_(o) {}
  // A scan still running (the run failed early) stops at its next batch; bronze_scan_'s
  // destructor then waits for it, before the table it reads is destroyed.
  ~Auditor() { cancel_scan_ = true; }

  // Set after Run: the incremental run found what only a full run can name.
  const std::string& needs_full() const { return needs_full_; }

  Result<Report> Run() {
    const auto t0 = std::chrono::steady_clock::now();
    auto phase_t0 = t0;
    auto phase = [&](const char* name) {
      const auto now = std::chrono::steady_clock::now();
      report_.phase_seconds[name] = std::chrono::duration<double>(now - phase_t0).count();
      phase_t0 = now;
    };
    report_.started_unix_ms = NowMicros() / 1000;
    OML_ASSIGN_OR_RETURN(lake::OutboxStream stream, lake::ResolveStream(o_.stream));
    const std::string app_id = lake::AppIdFor(stream.name);
    // 1. The lake writer's position, outside any transaction (lake_status.h).
    OML_ASSIGN_OR_RETURN(lake::LakeStatus st, lake::ReadLakeStatus(c_, stream, lake_root_));
    WriterFindings(st);
    frontier_ = st.frontier;
    // The baseline is read from the database while the tables are read (they do not use it).
    std::future<Result<std::optional<Baseline>>> baseline;
    if (!o_.full && o_.since_us == 0) baseline = std::async(std::launch::async, [this] { return LoadBaseline(); });
    // 2. The tables, each at one version with its txn: before the database snapshot. Each is
    // parsed (and its text freed) before the next is read.
    std::map<std::string, int64_t> txns;
    for (const char* name : {kBronze, kSilver, kGold}) {
      OML_ASSIGN_OR_RETURN(TableRead t, ReadTable(lake_root_, name, app_id, &report_.findings));
      for (const auto& ts : st.tables)
        if (ts.name == name && ts.behind()) t.readable = false;  // being refilled: uncovered-outbox says so
      report_.txn[name] = t.txn;
      report_.table_version[name] = t.version;
      txns[name] = t.txn;
      tables_[name] = std::move(t);
      const std::string n = name;
      if (n != kBronze) OML_RETURN_IF_ERROR(n == kSilver ? ParseSilver() : ParseGold());
    }
    // Full or incremental (a baseline, and what changed since it), before bronze is scanned.
    phase("lake.tables");
    OML_RETURN_IF_ERROR(ChooseMode(baseline));
    phase("lake.mode");
    // bronze/events, the large table, is scanned on its own thread while the journal is replayed
    // (its files are fixed by the version read above); InSnapshot joins it before comparing.
    StartBronzeScan();
    phase("lake.scan_start");
    report_.phase_seconds["lake"] = report_.phase_seconds["lake.tables"] + report_.phase_seconds["lake.mode"] +
                                    report_.phase_seconds["lake.scan_start"];
    // 3. One snapshot of the database: the journal and what the buckets must hold.
    snapshot_us_ = NowMicros();  // an object written after this is unknown to the snapshot
    OML_RETURN_IF_ERROR(c_.Exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").status());
    Status s = InSnapshot(stream, txns);
    (void)c_.Exec(s.ok() ? "COMMIT" : "ROLLBACK");
    OML_RETURN_IF_ERROR(s);
    phase("journal");
    // 4. Outside it (no snapshot held through the bucket reads): the comparisons.
    OML_RETURN_IF_ERROR(DetailBronze());
    CompareSilver();
    CompareGold();
    phase("compare");
    if (o_.objects && stores_.quarantine != nullptr && stores_.bodies != nullptr) {
      OML_RETURN_IF_ERROR(Objects());
      phase("objects");
    }
    std::sort(report_.findings.begin(), report_.findings.end(), [](const Finding& a, const Finding& b) {
      return std::tie(a.cls, a.table, a.tenant, a.seq, a.key, a.column) <
             std::tie(b.cls, b.table, b.tenant, b.seq, b.key, b.column);
    });
    BuildCheckpoint();
    report_.key_material_uses = crypto::KeyMaterialUses();
    report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::move(report_);
  }

 private:
  using ArtKey = std::tuple<std::string, std::string, int64_t>;  // tenant, artifact, version
  using ArtKeyView = std::tuple<std::string_view, std::string_view, int64_t>;  // a lookup without copies
  using GoldKey = std::tuple<std::string, std::string, std::string, std::string>;
  // ---- incremental ----
  struct ChainMark {
    int64_t head = 0;
    std::string hash;                      // event_hash at head, hex
    int64_t bronze = 0, gold = 0, silver = 0;  // every event through this seq had reached the table
  };
  using ListingKey = std::pair<std::string, std::string>;  // (bucket, key)
  struct Baseline {
    int64_t run = 0;  // oml.reconcile_runs id
    struct File {
      int64_t size = 0, modified_ms = 0;  // as listed
      RowSet rows;                        // its rows
    };
    std::map<std::string, File> bronze_files;
    std::map<std::string, ChainMark> chains;
    std::map<GoldKey, int64_t> gold;           // expected counts
    std::map<ArtKey, std::string> silver;      // SilverRowDigest of each row
    std::map<std::string, int64_t> txn;
    std::vector<NamedObject> named;
    std::map<ListingKey, std::pair<int64_t, int64_t>> listing;  // hashed and right: (size, modified ms)
    bool since = false;       // not a run's checkpoint: the --since window (SinceWindow)
    int64_t frontier = 0;     // the lake writer's frontier when the run began
    bool caught_up = false;   // every chain had reached every table (each mark at its head)
  };
  // What this run saw of a chain, for the next checkpoint.
  struct Track {
    int64_t head = 0;
    std::string hash;
    std::optional<ChainMark> base;
    int64_t bronze_gap = 0, gold_gap = 0, silver_gap = 0;  // the first event not delivered (0: none)
    bool broken = false;  // an event delivered after one that was not: the marks are no prefix
    void Mark(int64_t* gap, bool delivered, int64_t seq) {
      if (!delivered) {
        if (*gap == 0) *gap = seq;
      } else if (*gap != 0) {
        broken = true;
      }
    }
  };

  void Add(Finding f) { report_.findings.push_back(std::move(f)); }
  bool InScope(const std::string& tenant) const { return o_.only_tenant.empty() || tenant == o_.only_tenant; }

  void WriterFindings(const lake::LakeStatus& st) {
    if (st.lag_seconds && *st.lag_seconds > static_cast<double>(o_.stale_after.count())) {
      std::string why;
      if (!st.lease_held) why = "no lake writer holds the lease";
      for (const auto& h : st.holders) {
        if (!why.empty()) why += "; ";
        why += "xid " + std::to_string(h.xid) + (h.pid ? " (pid " + std::to_string(*h.pid) + ")" : " (prepared " + h.gid + ")") +
               " of role " + h.role + (h.application_name.empty() ? "" : " app " + h.application_name) +
               (h.state.empty() ? "" : ", " + h.state) +
               (h.xact_age_s ? ", open " + std::to_string(static_cast<int64_t>(*h.xact_age_s)) + " s" : "") +
               " holds the horizon back";
      }
      if (why.empty()) why = "the lake writer is behind";
      Add({"stale-frontier", "outbox", "", 0, st.stream, "lag_seconds",
           "<= " + std::to_string(o_.stale_after.count()), std::to_string(static_cast<int64_t>(*st.lag_seconds)),
           std::to_string(st.lag_rows) + " outbox rows above frontier " + std::to_string(st.frontier) + ": " + why});
    }
    for (const auto& t : st.tables) {
      if (!t.behind()) continue;
      Add({"uncovered-outbox", t.name, "", 0, t.name, "txn_version", std::to_string(t.recorded_txn),
           std::to_string(std::max<int64_t>(t.txn_version, 0)),
           "outbox rows (" + std::to_string(std::max<int64_t>(t.txn_version, 0)) + ", " +
               std::to_string(t.recorded_txn) +
               "] are below the frontier but no commit of the table holds them (it lost commits or is being rebuilt; "
               "a lake writer refills it)"});
    }
  }

  // Calls `row` with each row of table `name` (parsed, with a string tenant_id, in scope) and
  // frees the text. `ok` decides whether a row has what the adapter writes.
  template <typename Ok, typename Row>
  Status ForEachRow(const char* name, int64_t* count, Ok ok, Row row) {
    TableRead& t = tables_[name];
    if (!t.readable) return Status::Ok();
    const std::string_view text(t.rows_jsonl);
    for (size_t at = 0; at < text.size();) {
      size_t nl = text.find('\n', at);
      if (nl == std::string_view::npos) nl = text.size();
      const std::string_view line = text.substr(at, nl - at);
      at = nl + 1;
      if (line.empty()) continue;
      json r = json::parse(line, nullptr, false);
      if (r.is_discarded() || !r.is_object() || !r["tenant_id"].is_string() || !ok(r))
        return Internal(std::string(name) + " row is not what the adapter writes: " + std::string(line.substr(0, 200)));
      ++*count;
      std::string tenant = r["tenant_id"].get<std::string>();
      if (InScope(tenant)) row(std::move(tenant), std::move(r));
    }
    t.rows_jsonl.clear();
    t.rows_jsonl.shrink_to_fit();
    return Status::Ok();
  }

  // What the bronze comparison needs of each replayed journal event, a chain at a time.
  struct ReplayedEvent {
    int64_t seq = 0;
    bool delivered = false;  // its bronze outbox row reached the table
    uint32_t type = 0;       // event_types_ index
    Digest digest{};         // JournalRowDigest
  };
  struct ReplayedChain {
    int64_t head = 0;
    int64_t covered = 0;  // incremental: events through this seq were in the baseline's files
    int64_t stopped_at = std::numeric_limits<int64_t>::max();  // journal-unreadable there
    std::vector<ReplayedEvent> events;                           // in seq order
  };

  // bronze/events reduced to digests (see "bronze rows as digests"): tenant -> its rows in seq
  // order (rows of one seq in scan order: DetailBronze reads the first again), and the rows read.
  struct BronzeScan {
    std::map<std::string, std::vector<BronzeEntry>> rows;
    int64_t count = 0;
    double seconds = 0;  // the scan's own wall time
    std::map<std::string, RowSet> files;  // each data file read, every tenant's rows
    // Incremental: the rows read (every tenant's) of events the baseline had already found in
    // bronze (seq at or below the chain's bronze mark).
    RowSet covered;
  };

  // Starts scanning bronze/events on another thread. The thread touches nothing of the auditor
  // but `table` (its handle alone) and `only_tenant`; its result is taken by JoinBronzeScan.
  void StartBronzeScan() {
    TableRead& t = tables_[kBronze];
    if (!t.readable) return;
    const bool only_new = base_ && !base_->since;
    if (only_new && new_bronze_files_.empty()) return;  // incremental, nothing added: no row to read
    std::vector<std::string> files = only_new ? new_bronze_files_ : std::vector<std::string>();
    if (!only_new)
      for (const auto& f : bronze_files_) files.push_back(f.path);
    std::map<std::string, int64_t> covered;  // tenant -> bronze mark of the baseline
    if (only_new)
      for (const auto& [tenant, m] : base_->chains) covered[tenant] = m.bronze;
    bronze_scan_ = std::async(std::launch::async, [&table = *t.handle, only = o_.only_tenant, files = std::move(files),
                                                   covered = std::move(covered), this]() {
      return ScanBronze(table, only, files, covered, cancel_scan_);
    });
  }

  // Waits for the scan. A data file that is gone or damaged makes the table unreadable (a
  // finding), not the run an error.
  Status JoinBronzeScan() {
    if (!bronze_scan_.valid()) return Status::Ok();
    Result<BronzeScan> r = bronze_scan_.get();
    if (!r.ok()) return UnreadableBronze(r.status());
    bronze_ = std::move(r->rows);
    report_.bronze_rows = r->count;
    scanned_files_ = std::move(r->files);
    // Incremental over baseline files a compaction (or anything else) removed: their rows must be
    // exactly the rows read again of events the baseline had found in bronze, else only a full
    // run can say which differ (Reconcile runs one).
    if (base_ && !base_->since && !removed_.empty() && !(r->covered == removed_rows_))
      needs_full_ = "the rows of the " + std::to_string(removed_.size()) + " bronze/events data file(s) removed since baseline run " +
                    std::to_string(base_->run) + " (" + std::to_string(removed_rows_.rows) +
                    " rows) are not the rows of those events in the files added since (" + std::to_string(r->covered.rows) +
                    ")";
    report_.phase_seconds["bronze_scan"] = r->seconds;
    return Status::Ok();
  }

  // `cancel`: set when the run ends early (~Auditor): the scan stops at its next batch.
  // `files`: the data files to read, one at a time (each file's RowSet is the checkpoint's).
  // `covered`: incremental, each chain's bronze mark at the baseline (BronzeScan::covered).
  static Result<BronzeScan> ScanBronze(const lake::DeltaTable& table, const std::string& only_tenant,
                                       const std::vector<std::string>& files,
                                       const std::map<std::string, int64_t>& covered,
                                       const std::atomic<bool>& cancel) {
    const auto t0 = std::chrono::steady_clock::now();
    BronzeScan out;
    lake::ArrowBatchView b;
    RowDigest d;
    std::string last_tenant;
    std::vector<BronzeEntry>* rows = nullptr;
    int64_t mark = 0;  // covered[last_tenant]
    for (const std::string& file : files) {
      const std::vector<std::string> one{file};
      OML_ASSIGN_OR_RETURN(lake::ColumnScan scan, table.Scan(BronzeScanColumns(), &one));
      RowSet& set = out.files[file];
      for (;;) {
        if (cancel.load(std::memory_order_relaxed))
          return Status(Code::kAborted, "the audit ended before the bronze scan", "");
        OML_ASSIGN_OR_RETURN(bool more, scan.Next(&b));
        if (!more) break;
        for (int64_t i = 0; i < b.num_rows(); ++i) {
          if (b.IsNull(kTenantCol, i) || b.IsNull(kSeqCol, i))
            return Internal("a bronze/events row is not what the adapter writes: null tenant_id or seq");
          ++out.count;
          const std::string_view tenant = b.Bytes(kTenantCol, i);
          const int64_t seq = b.Int64(kSeqCol, i);
          const Digest digest = LakeRowDigest(b, i, d);
          if (tenant != last_tenant || (rows == nullptr && last_tenant.empty())) {
            last_tenant = std::string(tenant);
            auto c = covered.find(last_tenant);
            mark = c == covered.end() ? 0 : c->second;
            rows = !only_tenant.empty() && tenant != only_tenant ? nullptr : &out.rows[last_tenant];
          }
          const Digest element = RowSet::Element(tenant, seq, digest);
          set.Add(element);
          if (seq <= mark) out.covered.Add(element);
          if (rows != nullptr) rows->push_back({seq, digest});
        }
      }
    }
    for (auto& [tenant, v] : out.rows)
      std::stable_sort(v.begin(), v.end(), [](const BronzeEntry& x, const BronzeEntry& y) { return x.seq < y.seq; });
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  Status UnreadableBronze(const Status& s) {
    if (s.code() != Code::kNotFound && s.type() != "lake-file-damaged") return s;
    bronze_.clear();
    report_.bronze_rows = 0;
    tables_[kBronze].readable = false;
    // The adapter names the file: "... data file <path>: why" or "... data file <path> is missing".
    std::string file = tables_[kBronze].handle->uri();
    if (size_t at = s.message().find("data file "); at != std::string::npos) {
      at += 10;
      file = s.message().substr(at, s.message().find_first_of(" :", at) - at);
    }
    Add({"table-unreadable", kBronze, "", 0, file, "", s.code() == Code::kNotFound ? "present" : "readable",
         s.code() == Code::kNotFound ? "missing" : "damaged",
         s.message() + ": its rows cannot be compared; run `oml lake rebuild --table bronze/events` (or `oml "
         "reconcile --repair`)"});
    return Status::Ok();
  }

  // The second pass: rows whose digest differs from the journal's, decoded to name the columns.
  // A second read that fails (the table vacuumed or damaged since, a store error) still reports
  // each row that differs, without naming its columns.
  // A row the second read did not meet again (the table was compacted or vacuumed in between: a
  // different version) is reported the same way.
  Status DetailBronze() {
    if (bronze_mismatch_.empty()) return Status::Ok();
    Status s = DetailBronzeScan();
    const std::string why = s.ok() ? "the second read did not meet the row again" : s.ToString();
    for (auto& [key, m] : bronze_mismatch_)
      if (!m.done)
        Add({"row-mismatch", kBronze, key.first, key.second, "", "", "", "",
             "the lake's row differs from the journal; its columns could not be read again (" +
                 (m.expect.is_null() ? std::string("the journal's event could not be read again") : why) + ")"});
    return Status::Ok();
  }

  Status DetailBronzeScan() {
    OML_ASSIGN_OR_RETURN(lake::ColumnScan scan,
                         tables_[kBronze].handle->Scan(BronzeScanColumns(),
                                                       base_ && !base_->since ? &new_bronze_files_ : nullptr));
    lake::ArrowBatchView b;
    RowDigest d;
    for (;;) {
      OML_ASSIGN_OR_RETURN(bool more, scan.Next(&b));
      if (!more) break;
      for (int64_t i = 0; i < b.num_rows(); ++i) {
        auto m = bronze_mismatch_.find({std::string(b.Bytes(kTenantCol, i)), b.Int64(kSeqCol, i)});
        if (m == bronze_mismatch_.end() || m->second.done || m->second.expect.is_null() ||
            LakeRowDigest(b, i, d) == m->second.want)
          continue;
        m->second.done = true;
        CompareBronze(m->first.first, m->first.second, m->second.prev, m->second.hash, m->second.signature,
                      m->second.expect, LakeRowAt(b, i));
      }
    }
    return Status::Ok();
  }

  Status ParseSilver() {
    return ForEachRow(
        kSilver, &report_.silver_rows,
        [](json& r) { return r["artifact_id"].is_string() && r["version"].is_number_integer(); },
        [this](std::string tenant, json r) {
          ArtKey k{std::move(tenant), r["artifact_id"].get<std::string>(), r["version"].get<int64_t>()};
          silver_[k].push_back(std::move(r));
        });
  }

  Status ParseGold() {
    return ForEachRow(
        kGold, &report_.gold_rows,
        [](json& r) { return r["day"].is_string() && r["event_type"].is_string() && r["events"].is_number_integer(); },
        [this](std::string tenant, json r) {
          GoldKey k{std::move(tenant), r["day"].get<std::string>(),
                    r["workarea_id"].is_string() ? r["workarea_id"].get<std::string>() : "",
                    r["event_type"].get<std::string>()};
          gold_found_[k].push_back(r["events"].get<int64_t>());
        });
  }

  Status InSnapshot(const lake::OutboxStream& stream, const std::map<std::string, int64_t>& txns) {
    auto step_t0 = std::chrono::steady_clock::now();
    // Within "journal": the wall seconds of its steps ("journal.delivery", ".seeds", ".replay",
    // ".places").
    auto step = [&](const char* name) {
      const auto now = std::chrono::steady_clock::now();
      report_.phase_seconds[std::string("journal.") + name] = std::chrono::duration<double>(now - step_t0).count();
      step_t0 = now;
    };
    delivery_ = std::make_unique<Delivery>(txns);
    // Incremental from a baseline at which every chain had reached every table: the outbox rows
    // through its frontier were all for events the baseline saw delivered (a row committed later
    // has a higher seq), so only the rows above it can be lag (an outbox that keeps a long
    // retention is not read whole).
    const int64_t known = base_ && base_->caught_up ? base_->frontier : 0;
    OML_RETURN_IF_ERROR(delivery_->Load(c_, stream.name, stream.table, o_.only_tenant, known));
    step("delivery");
    for (const DeadLetterRecord& d : delivery_->letters()) {
      if (d.requeued) continue;
      Add({"dead-lettered", d.target, d.tenant, d.journal_seq,
           "dead letter " + std::to_string(d.id) +
               (d.target == kSilver ? " (" + d.artifact_id + " v" + std::to_string(d.version) + ")" : ""),
           "", "", "",
           "outbox seq " + std::to_string(d.outbox_seq) + " was skipped (materialize-skipped at seq " +
               std::to_string(d.skipped_seq) + "): " + d.error + "; requeue it with `oml dead-letter requeue " +
               std::to_string(d.id) + "` once the cause is fixed"});
    }
    OML_ASSIGN_OR_RETURN(db::Rows heads,
                         c_.Query("SELECT tenant_id::text, seq, event_hash FROM oml.chain_heads ORDER BY tenant_id"));
    std::vector<JournalPager::Span> chains;
    for (int i = 0; i < heads.size(); ++i) {
      const std::string tenant = heads.Get(i, 0);
      if (!InScope(tenant)) continue;
      Track& tr = track_[tenant];
      tr.head = heads.GetInt(i, 1);
      tr.hash = crypto::Hex(heads.GetBytes(i, 2));
      int64_t after = 0;  // a full run, or a chain the baseline did not have: from its first event
      if (base_) {
        if (auto m = base_->chains.find(tenant); m != base_->chains.end()) {
          tr.base = m->second;
          after = std::min({m->second.bronze, m->second.gold, m->second.silver});
        }
      }
      chains.push_back({tenant, after, tr.head});
    }
    if (chains.empty() && !o_.only_tenant.empty())
      return NotFound("no chain for tenant " + o_.only_tenant, "tenant-not-found");
    step("heads");
    if (base_) {
      OML_RETURN_IF_ERROR(LoadSeeds(chains));
      for (const auto& [k, n] : base_->gold)
        if (InScope(std::get<0>(k))) gold_expected_[k] = n;
    }
    step("seeds");
    {
      JournalPager pager(c_, chains, o_.page_rows);
      OML_ASSIGN_OR_RETURN(std::optional<JournalPager::Page> page, pager.Next());
      for (size_t i = 0; i < chains.size(); ++i) {
        OML_RETURN_IF_ERROR(Chain(chains[i], i, pager, page));
        // Once the scan is done, each chain is compared as soon as it is replayed (its events
        // and rows freed): the two are held whole only for the chains replayed before that.
        OML_RETURN_IF_ERROR(CompareReplayedChains(/*wait=*/false));
      }
    }  // the pager is done with the connection
    OML_RETURN_IF_ERROR(CompareReplayedChains(/*wait=*/true));
    if (tables_[kBronze].readable) {
      // Rows of tenants with no chain.
      for (auto& [tenant, rows] : bronze_)
        for (const BronzeEntry& e : rows)
          Add({"extra-in-lake", kBronze, tenant, e.seq, "", "", "", "", "no chain of this tenant has the event"});
      OML_RETURN_IF_ERROR(ReadMismatchedEvents());
    }
    journal_rows_.clear();
    bronze_.clear();
    step("replay");
    Status places = ReadPlaces();
    step("places");
    return places;
  }

  // Compares the chains replayed so far with their bronze rows, if the scan is done (`wait`:
  // waits for it).
  Status CompareReplayedChains(bool wait) {
    if (bronze_scan_.valid()) {
      if (!wait && bronze_scan_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return Status::Ok();
      OML_RETURN_IF_ERROR(JoinBronzeScan());
    }
    if (tables_[kBronze].readable)
      for (auto& [tenant, replayed] : journal_rows_) CompareBronzeRows(tenant, replayed);
    journal_rows_.clear();
    return Status::Ok();
  }

  // One chain's replayed events against its bronze rows (both in seq order): the events the
  // lake writer delivered exactly once, each row equal to the journal's; rows the chain lacks.
  // Rows at or past the event the replay stopped at (journal-unreadable) are not judged.
  void CompareBronzeRows(const std::string& tenant, ReplayedChain& replayed) {
    std::vector<BronzeEntry> lake_rows;
    if (auto it = bronze_.find(tenant); it != bronze_.end()) {
      lake_rows = std::move(it->second);
      bronze_.erase(it);
    }
    auto extra = [&](int64_t seq) {
      Add({"extra-in-lake", kBronze, tenant, seq, "", "", "", "",
           seq > replayed.head ? "beyond the chain's head " + std::to_string(replayed.head)
                               : "the journal has no such event"});
    };
    size_t at = 0;  // the first lake row not yet matched with an event
    // Incremental: rows of events the baseline found in its files, read again from a file added
    // since (the rows of the baseline's files are not read).
    // (--since: rows of events before the window are not judged. Incremental after a compaction:
    // they are the removed files' rows, compared as a set in JoinBronzeScan.)
    if (base_ && (base_->since || !removed_.empty()))
      while (at < lake_rows.size() && lake_rows[at].seq <= replayed.covered) ++at;
    for (; at < lake_rows.size() && lake_rows[at].seq <= replayed.covered; ++at)
      Add({"duplicate-in-lake", kBronze, tenant, lake_rows[at].seq, "", "", "1", "2",
           "the event is in a data file added since the baseline run " + std::to_string(base_ ? base_->run : 0) +
               " and was already in the table then"});
    for (const ReplayedEvent& ev : replayed.events) {
      for (; at < lake_rows.size() && lake_rows[at].seq < ev.seq; ++at) extra(lake_rows[at].seq);
      const size_t first = at;
      while (at < lake_rows.size() && lake_rows[at].seq == ev.seq) ++at;
      const size_t n = at - first;
      if (ev.delivered && n == 0) {
        Add({"missing-in-lake", kBronze, tenant, ev.seq, "", "", event_types_[ev.type], "",
             "the event is not in the table"});
      } else if (!ev.delivered && n > 0) {
        Add({"extra-in-lake", kBronze, tenant, ev.seq, "", "", "", std::to_string(n) + " row(s)",
             "the lake writer has not delivered this event (its outbox row is above the table's txn " +
                 std::to_string(delivery_->TxnOf(kBronze)) + ")"});
      } else if (n > 1) {
        Add({"duplicate-in-lake", kBronze, tenant, ev.seq, "", "", "1", std::to_string(n),
             "the event is stored " + std::to_string(n) + " times"});
      }
      for (size_t k = first; k < at; ++k)
        if (lake_rows[k].digest != ev.digest) {  // the first of its rows that differs is named
          bronze_mismatch_[{tenant, ev.seq}].want = ev.digest;
          break;
        }
    }
    for (; at < lake_rows.size() && lake_rows[at].seq < replayed.stopped_at; ++at) extra(lake_rows[at].seq);
  }

  // The journal's side of each bronze row that differs (for DetailBronze), read again in the
  // snapshot: a handful of events, where the replay kept only digests.
  Status ReadMismatchedEvents() {
    std::map<std::string, std::string> seqs;  // tenant -> "{s1,s2,...}"
    for (const auto& [key, m] : bronze_mismatch_) {
      std::string& list = seqs[key.first];
      list += (list.empty() ? "{" : ",") + std::to_string(key.second);
    }
    for (auto& [tenant, list] : seqs) {
      list += "}";
      OML_ASSIGN_OR_RETURN(db::Rows r, c_.Query("SELECT seq, prev_hash, event_hash, signed_bytes, signature FROM "
                                                "oml.journal WHERE tenant_id = $1 AND seq = ANY($2::bigint[])",
                                                {db::Text(tenant), db::Text(list)}));
      for (int i = 0; i < r.size(); ++i) {
        BronzeMismatch& m = bronze_mismatch_[{tenant, r.GetInt(i, 0)}];
        m.prev = r.GetBytes(i, 1);
        m.hash = r.GetBytes(i, 2);
        m.signature = r.GetBytes(i, 4);
        const std::string signed_bytes = r.GetBytes(i, 3);
        Result<journal::Envelope> env = journal::Envelope::FromVerifiedSignedBytes(signed_bytes);
        if (env.ok()) m.expect = journal::BronzeRow(*env, m.hash, signed_bytes, m.signature);
      }
    }
    return Status::Ok();
  }

  // Replays one chain up to its head, comparing bronze row by row and collecting what silver,
  // gold and the buckets must hold.
  // `page`: the pager's current page (nullopt: none left); this chain's pages are consumed, and
  // `page` is left at the next chain's first page.
  // Incremental: the span starts after the baseline's marks, and the fold first replays the
  // seeds (LoadSeeds) of the claim versions the span names.
  Status Chain(const JournalPager::Span& span, size_t chain, JournalPager& pager,
               std::optional<JournalPager::Page>& page) {
    const std::string& tenant = span.tenant;
    const int64_t head = span.head;
    ++report_.tenants;
    report_.heads[tenant] = head;
    Track& tr = track_[tenant];
    const int64_t covered_bronze = tr.base ? tr.base->bronze : 0, covered_gold = tr.base ? tr.base->gold : 0;
    journal::ChainFold fold(tenant == journal::kProviderTenant, /*body_reviews=*/false);
    const bool bronze_ok = tables_[kBronze].readable, gold_ok = tables_[kGold].readable;
    ReplayedChain* replayed = nullptr;  // what CompareBronzeRows needs of each event
    if (bronze_ok) {
      replayed = &journal_rows_[tenant];
      replayed->head = head;
      replayed->covered = covered_bronze;
    }
    // The silver rows an event enqueues (`touched`, taken before it was folded), as the fold now
    // has them. `window`: an event of the span (a seed was delivered before the baseline).
    auto expect_silver = [&](const std::vector<journal::ArtifactKey>& touched, int64_t seq, bool window) {
      for (const auto& [artifact, version] : touched) {
        auto a = fold.artifacts.find({artifact, version});
        if (a == fold.artifacts.end() || a->second.promoted_seq == 0) continue;  // never promoted: no row
        SilverExpect& e = silver_expected_[{tenant, artifact, version}];
        const RowKey sk{tenant, seq, artifact, version};
        if (delivery_->Delivered(kSilver, sk, kSilver)) {
          e.row = lake::SilverClaimRow(tenant, {artifact, version}, a->second, seq);
          e.seq = seq;
        } else if (window && tr.silver_gap == 0) {
          tr.silver_gap = seq;
        }
      }
    };
    if (auto sd = seeds_.find(tenant); sd != seeds_.end()) {
      for (auto& [seq, env] : sd->second) {
        const std::vector<journal::ArtifactKey> touched = lake::SilverKeysTouched(fold, env);
        if (Status s = fold.Apply(seq, std::move(env)); !s.ok()) {
          Add({"journal-unreadable", "journal", tenant, seq, "", "", "", "",
               "the event's payload cannot be folded (" + s.message() + "): run `oml verify --folds`"});
          unaudited_.insert(tenant);
          break;
        }
        expect_silver(touched, seq, false);
      }
      seeds_.erase(sd);
    }
    RowKey bk{tenant, 0, "", 0};
    // This chain's pages; on return (whatever the path) `page` is the next chain's first page.
    auto skip_rest = [&]() -> Status {
      if (page && page->chain == chain && !page->last) {
        OML_ASSIGN_OR_RETURN(page, pager.SkipChain(chain));
      } else if (page && page->chain == chain) {
        OML_ASSIGN_OR_RETURN(page, pager.Next());
      }
      return Status::Ok();
    };
    for (; page && page->chain == chain; ) {
      const db::Rows& r = page->rows;
      for (int i = 0; i < r.size(); ++i) {
        const int64_t seq = r.GetInt(i, 0);
        ++report_.events;
        Result<journal::Envelope>& env = page->envs[static_cast<size_t>(i)];
        if (!env.ok()) {
          Add({"journal-unreadable", "journal", tenant, seq, "", "", "", "",
               "the event's signed bytes do not parse (" + env.status().message() + "): run `oml verify`"});
          unaudited_.insert(tenant);  // nothing after it can be replayed: no other finding about it
          if (replayed != nullptr) replayed->stopped_at = seq;
          return skip_rest();
        }
        std::get<1>(bk) = seq;
        const std::optional<int64_t>& time_us = page->times[static_cast<size_t>(i)];  // bronze and gold
        // Bronze: the digest of the row the event must have, compared once the scan is done
        // (incremental: an event the baseline found in the table is not looked for again).
        const bool to_bronze = seq > covered_bronze && delivery_->Delivered(kBronze, bk, kBronze);
        const bool to_gold = seq > covered_gold && delivery_->Delivered(kBronze, bk, kGold);
        if (seq > covered_bronze) {
          tr.Mark(&tr.bronze_gap, to_bronze, seq);
          if (replayed != nullptr)
            replayed->events.push_back({seq, to_bronze, TypeIndex(env->type), page->digests[static_cast<size_t>(i)]});
        }
        if (seq > covered_gold) tr.Mark(&tr.gold_gap, to_gold, seq);
        // Gold counts delivered bronze rows (incremental: added to the baseline's counts).
        if (gold_ok && to_gold) {
          const bool obj = env->payload.is_object();
          auto w = obj ? env->payload.find("workarea_id") : env->payload.end();
          static const std::string kNone;
          const std::string& workarea =
              obj && w != env->payload.end() && w->is_string() ? w->get_ref<const std::string&>() : kNone;
          // Neighbouring events mostly share a key: one map lookup (and no key built) per run of
          // them. (A day fits std::string's inline buffer: no allocation.)
          std::string day = DayOf(time_us);
          if (gold_last_ == nullptr || std::get<1>(gold_last_key_) != day || std::get<0>(gold_last_key_) != tenant ||
              std::get<2>(gold_last_key_) != workarea || std::get<3>(gold_last_key_) != env->type) {
            GoldKey key{tenant, std::move(day), workarea, env->type};
            gold_last_ = &gold_expected_[key];
            gold_last_key_ = std::move(key);
          }
          ++*gold_last_;
        }
        // Folds, then the silver rows this event enqueues.
        const std::vector<journal::ArtifactKey> touched = lake::SilverKeysTouched(fold, *env);
        // The fold takes the payload's strings (the envelope is not read after this).
        if (Status s = fold.Apply(seq, std::move(*env)); !s.ok()) {
          Add({"journal-unreadable", "journal", tenant, seq, "", "", "", "",
               "the event's payload cannot be folded (" + s.message() + "): run `oml verify --folds`"});
          unaudited_.insert(tenant);
          if (replayed != nullptr) replayed->stopped_at = seq + 1;  // its own row was judged
          return skip_rest();
        }
        expect_silver(touched, seq, true);
      }
      Dispose(std::exchange(page, std::nullopt));  // freed beside the replay
      OML_ASSIGN_OR_RETURN(page, pager.Next());
    }
    // What the buckets must hold, from the folded states (incremental: the claim versions
    // replayed, every other one as the baseline left it).
    for (const auto& [k, a] : fold.artifacts) {
      if (base_) touched_.insert({tenant, k.first, k.second});
      if (tenant == journal::kProviderTenant) break;
      // Without the buckets only a silver row's claim is looked up (CompareSilver's detail).
      if (!o_.objects && !silver_.count(ArtKeyView{tenant, k.first, k.second})) continue;
      const std::string place = a.erased_seq != 0 ? "none" : a.promoted_seq != 0 ? "bodies" : "quarantine";
      const std::string& since = a.erased_seq != 0 ? a.state_at : a.promoted_seq != 0 ? a.promoted_at : a.submitted_at;
      const int64_t since_us = lake::UtcMicros(json(since)).value_or(0);
      artifacts_[{tenant, k.first, k.second}] = {a.ciphertext_sha256, place, a.submitted_seq, since_us};
      // Its files, as submission.attach signed them (the fold keeps them: journal/chain_fold.h).
      for (auto at = fold.attachments.lower_bound({k.first, k.second, std::numeric_limits<int64_t>::min()});
           at != fold.attachments.end() && std::get<0>(at->first) == k.first && std::get<1>(at->first) == k.second;
           ++at) {
        const journal::AttachmentRow& x = at->second;
        named_.push_back({tenant, k.first, "attachment " + std::to_string(std::get<2>(at->first)), k.second,
                          x.attach_seq, x.ciphertext_sha256, static_cast<uint64_t>(x.ciphertext_size), place,
                          since_us});
      }
    }
    Dispose(std::move(fold));  // its maps are freed beside the next chain's replay
    return Status::Ok();
  }

  // Destroys `x` on another thread (the replay's thread is the audit's busiest: a page's parsed
  // envelopes and a chain's fold are many small blocks). One at a time: waits for the last.
  template <typename T>
  void Dispose(T&& x) {
    if (disposal_.valid()) disposal_.wait();
    auto owned = std::make_shared<std::decay_t<T>>(std::forward<T>(x));
    disposal_ = std::async(std::launch::async, [owned = std::move(owned)]() mutable { owned.reset(); });
  }

  void CompareBronze(const std::string& tenant, int64_t seq, const std::string& prev, const std::string& hash,
                     const std::string& signature, const json& expect, const LakeBronzeRow& b) {
    auto mismatch = [&](const std::string& column, const std::string& want, const std::string& got) {
      Add({"row-mismatch", kBronze, tenant, seq, "", column, want, got, "the lake's row differs from the journal"});
    };
    if (b.signed_sha256 != hash)
      mismatch("signed_bytes", "SHA-256 " + crypto::Hex(hash),
               b.signed_sha256.empty() ? "null" : "SHA-256 " + crypto::Hex(b.signed_sha256));
    if (b.signature != signature)
      mismatch("signature", crypto::Hex(signature), b.signature.empty() ? "null" : crypto::Hex(b.signature));
    if (b.event_hash != crypto::Hex(hash)) mismatch("event_hash", crypto::Hex(hash), b.event_hash);
    if (b.prev_hash != crypto::Hex(prev)) mismatch("prev_hash", crypto::Hex(prev), b.prev_hash);
    if (!SameValue("occurred_at", expect["occurred_at"], b.columns["occurred_at"]))
      mismatch("occurred_at", Show(expect["occurred_at"]), Show(b.columns["occurred_at"]));
    for (const char* col : kDerivedColumns) {
      const json want = expect.contains(col) ? expect[col] : json(nullptr);
      if (!SameValue(col, want, b.columns[col])) mismatch(col, Show(want), Show(b.columns[col]));
    }
  }

  void CompareSilver() {
    if (!tables_[kSilver].readable) return;
    for (auto& [key, rows] : silver_) {
      const auto& [tenant, artifact, version] = key;
      silver_digest_[key] = SilverRowDigest(rows.front());  // the next checkpoint's
      if (unaudited_.count(tenant)) continue;
      const std::string k = artifact + " v" + std::to_string(version);
      // Incremental: a claim version no event since the baseline named is as the baseline
      // found it (its row's digest).
      if (base_ && !touched_.count(key)) {
        if (base_->since) continue;  // --since: only the claims its events name
        auto d = base_->silver.find(key);
        if (d != base_->silver.end()) {
          if (rows.size() > 1)
            Add({"duplicate-in-lake", kSilver, tenant, 0, k, "", "1", std::to_string(rows.size()),
                 "the claim version has " + std::to_string(rows.size()) + " rows"});
          if (silver_digest_[key] != d->second)
            Add({"state-mismatch", kSilver, tenant, 0, k, "", "the row of baseline run " + std::to_string(base_->run),
                 "a different row",
                 "no event since the baseline changed this claim version, yet its row changed (run `oml reconcile "
                 "--full` to name the column)"});
          continue;
        }
      }
      auto e = silver_expected_.find(key);
      if (e == silver_expected_.end()) {
        auto a = artifacts_.find(key);
        Add({"containment-breach", kSilver, tenant, 0, k, "", "no row", Show(rows.front().value("state", json(nullptr))),
             base_ ? "the claim version had no row at baseline run " + std::to_string(base_->run) +
                         " and no event since promoted it: its metadata left quarantine"
             : a == artifacts_.end() ? "the journal has no such claim version"
                                     : "the journal never promoted this claim version: its metadata left quarantine"});
        continue;
      }
      if (e->second.row.is_null()) {
        Add({"extra-in-lake", kSilver, tenant, 0, k, "", "no row yet", Show(rows.front().value("state", json(nullptr))),
             "no event that enqueues this row has been delivered"});
        continue;
      }
      if (rows.size() > 1)
        Add({"duplicate-in-lake", kSilver, tenant, e->second.seq, k, "", "1", std::to_string(rows.size()),
             "the claim version has " + std::to_string(rows.size()) + " rows"});
      json want = e->second.row;
      // Where the ciphertext lives (silver_claim_row, sql/0015): an inline body in PostgreSQL; one
      // kept as an object in bodies from its promotion, and nowhere once erased.
      auto b = bodies_.find(key);
      want["body_location"] = b == bodies_.end() ? lake::BodyLocation("", "", "")
                                                 : lake::BodyLocation(b->second.location, b->second.object_key,
                                                                      want["state"].get<std::string>());
      const json& got = rows.front();
      for (const char* col : kSilverColumns) {
        const json g = got.contains(col) ? got[col] : json(nullptr);
        if (!SameValue(col, want[col], g))
          Add({"state-mismatch", kSilver, tenant, e->second.seq, k, col, Show(want[col]), Show(g),
               "silver differs from the journal replayed to seq " + std::to_string(e->second.seq)});
      }
    }
    for (const auto& [key, e] : silver_expected_) {
      if (e.row.is_null() || silver_.count(key)) continue;
      const auto& [tenant, artifact, version] = key;
      if (unaudited_.count(tenant)) continue;
      Add({"missing-in-lake", kSilver, tenant, e.seq, artifact + " v" + std::to_string(version), "",
           Show(e.row["state"]), "no row", "the promoted claim version has no row"});
    }
    if (!base_) return;
    for (const auto& [key, d] : base_->silver) {
      const auto& [tenant, artifact, version] = key;
      if (!InScope(tenant) || unaudited_.count(tenant) || touched_.count(key) || silver_.count(key)) continue;
      Add({"missing-in-lake", kSilver, tenant, 0, artifact + " v" + std::to_string(version), "",
           "the row of baseline run " + std::to_string(base_->run), "no row",
           "the promoted claim version had a row at the baseline and has none now"});
    }
  }

  // A SHA-256 (hex) of a silver row's compared columns as read (the checkpoint's per-row digest).
  static std::string SilverRowDigest(const json& row) {
    std::string text;
    for (const char* col : kSilverColumns) {
      text += col;
      text += '=';
      text += row.contains(col) ? row[col].dump() : "null";
      text += '\n';
    }
    const Digest d = Sha256Of(text);
    return crypto::Hex(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
  }

  void CompareGold() {
    if (!tables_[kGold].readable) return;
    auto name = [](const GoldKey& k) {
      return std::get<1>(k) + " " + (std::get<2>(k).empty() ? std::string("-") : std::get<2>(k)) + " " + std::get<3>(k);
    };
    // --since: the days before its own are not compared.
    auto before = [&](const GoldKey& k) { return !since_day_.empty() && std::get<1>(k) < since_day_; };
    for (const auto& [k, want] : gold_expected_) {
      if (unaudited_.count(std::get<0>(k)) || before(k)) continue;
      auto f = gold_found_.find(k);
      int64_t got = 0;
      if (f != gold_found_.end())
        for (int64_t n : f->second) got += n;
      if (f != gold_found_.end() && f->second.size() > 1)
        Add({"duplicate-in-lake", kGold, std::get<0>(k), 0, name(k), "", "1", std::to_string(f->second.size()),
             "the key has " + std::to_string(f->second.size()) + " rows"});
      if (got != want)
        Add({"count-mismatch", kGold, std::get<0>(k), 0, name(k), "events", std::to_string(want), std::to_string(got),
             "bronze's delivered events of this day, workarea and type"});
    }
    for (const auto& [k, v] : gold_found_) {
      if (unaudited_.count(std::get<0>(k)) || before(k)) continue;
      if (gold_expected_.count(k)) continue;
      int64_t got = 0;
      for (int64_t n : v) got += n;
      Add({"count-mismatch", kGold, std::get<0>(k), 0, name(k), "events", "0", std::to_string(got),
           "no delivered event has this day, workarea and type"});
    }
  }

  // ---- objects ----

  // In the snapshot: where each body lives (sql/0015) and the upload sessions (their objects
  // and parts may still be in use).
  Status ReadPlaces() {
    // Without the buckets, a body's place matters only to a silver row's body_location.
    if (!o_.objects && silver_.empty()) return Status::Ok();
    // Incremental: the claim versions replayed only (the others are not compared again).
    const char* kBodyCols =
        "b.tenant_id::text, b.artifact_id::text, b.version, b.location, coalesce(b.object_key, ''), "
        "CASE WHEN b.ciphertext IS NULL OR NOT $1 THEN '' ELSE encode(sha256(b.ciphertext), 'hex') END ";
    db::Rows bodies;
    if (base_) {
      json only = json::array();
      for (const auto& [t, a, v] : touched_) only.push_back({{"t", t}, {"a", a}, {"v", v}});
      if (!only.empty()) {
        OML_ASSIGN_OR_RETURN(bodies, c_.Query(std::string("SELECT ") + kBodyCols +
                                                  "FROM json_to_recordset($2::json) AS x(t uuid, a uuid, v integer), "
                                                  "LATERAL (SELECT * FROM oml.artifact_bodies b WHERE b.tenant_id = x.t "
                                                  "AND b.artifact_id = x.a AND b.version = x.v OFFSET 0) b",
                                              {db::Text(o_.objects ? "true" : "false"), db::Text(only.dump())}));
      }
    } else {
      OML_ASSIGN_OR_RETURN(bodies, c_.Query(std::string("SELECT ") + kBodyCols +
                                                "FROM oml.artifact_bodies b WHERE $2 = '' OR b.tenant_id::text = $2",
                                            {db::Text(o_.objects ? "true" : "false"), db::Text(o_.only_tenant)}));
    }
    for (int i = 0; i < bodies.size(); ++i)
      bodies_[{bodies.Get(i, 0), bodies.Get(i, 1), bodies.GetInt(i, 2)}] = {bodies.Get(i, 3), bodies.Get(i, 4),
                                                                           bodies.Get(i, 5)};
    if (!o_.objects) return Status::Ok();
    OML_ASSIGN_OR_RETURN(
        db::Rows sessions,
        c_.Query("SELECT tenant_id::text, upload_id::text, state, coalesce(object_key, ''), "
                 "greatest(updated_at, expires_at) > now() - make_interval(secs => $1), "
                 "state IN ('created', 'receiving') OR (state = 'complete' AND expires_at > now()) "
                 "FROM oml.upload_sessions_audit WHERE $2 = '' OR tenant_id::text = $2",
                 {db::Int(o_.object_grace.count()), db::Text(o_.only_tenant)}));
    for (int i = 0; i < sessions.size(); ++i) {
      sessions_[{sessions.Get(i, 0), sessions.Get(i, 1)}] = {sessions.Get(i, 2), sessions.Get(i, 4) == "t",
                                                            sessions.Get(i, 5) == "t"};
      if (!sessions.Get(i, 3).empty()) session_objects_[sessions.Get(i, 3)] = sessions.Get(i, 1);
    }
    return Status::Ok();
  }

  // The claim version's place now, outside the snapshot: a finding about an object whose claim
  // moved on since (promoted, erased) is not one. nullopt if the row is gone.
  Result<std::optional<std::string>> PlaceNow(const NamedObject& n) {
    OML_ASSIGN_OR_RETURN(db::Rows r, c_.Query("SELECT erased_seq IS NOT NULL, promoted_seq IS NOT NULL FROM oml.artifacts "
                                              "WHERE tenant_id = $1::uuid AND artifact_id = $2::uuid AND version = $3",
                                              {db::Text(n.tenant), db::Text(n.artifact_id), db::Int(n.version)}));
    if (r.size() == 0) return std::optional<std::string>();
    return std::optional<std::string>(r.Get(0, 0) == "t" ? "none" : r.Get(0, 1) == "t" ? "bodies" : "quarantine");
  }

  Status Objects() {
    const int64_t now_us = NowMicros();
    const int64_t grace_us = static_cast<int64_t>(o_.object_grace.count()) * 1000000;
    // Incremental: the objects of claim versions not replayed, as the baseline named them.
    if (base_)
      for (const NamedObject& n : base_->named)
        if (InScope(n.tenant) && !unaudited_.count(n.tenant) && !touched_.count(ArtKey{n.tenant, n.artifact_id, n.version}))
          named_.push_back(n), named_.back().carried = true;
    // Bodies: an inline one is hashed by PostgreSQL; one kept as an object is named like a file.
    for (const auto& [key, a] : artifacts_) {
      const auto& [tenant, artifact, version] = key;
      if (unaudited_.count(tenant)) continue;
      const std::string k = artifact + " v" + std::to_string(version);
      auto b = bodies_.find(key);
      if (b == bodies_.end()) {
        if (a.place != "none")
          Add({"missing-object", "postgres", tenant, a.seq, "artifact_bodies " + k, "", "present", "missing",
               "the claim version has no body row: its ciphertext is nowhere"});
        continue;
      }
      if (b->second.location == "postgres") {
        if (a.place != "none" && b->second.inline_sha256 != a.digest)
          Add({"object-digest-mismatch", "postgres", tenant, a.seq, "artifact_bodies " + k, "ciphertext_sha256",
               a.digest, b->second.inline_sha256, "the inline body's ciphertext is not what claim.submitted signed"});
        continue;
      }
      named_.push_back({tenant, artifact, "body", version, a.seq, a.digest, std::nullopt, a.place, a.since_us});
    }
    std::map<std::string, blob::ObjectStore::Meta> in_q, in_b;
    for (auto [store, out] : {std::pair{stores_.quarantine, &in_q}, std::pair{stores_.bodies, &in_b}}) {
      OML_ASSIGN_OR_RETURN(std::vector<blob::ObjectStore::Meta> listed, store->ListMeta(""));
      report_.objects_listed += static_cast<int64_t>(listed.size());
      for (auto& m : listed) (*out)[m.key] = std::move(m);
    }
    // Young: modified within the grace before the snapshot began, or since (a write the snapshot
    // cannot know of, however long the replay took).
    auto young = [&](const blob::ObjectStore::Meta& m) {
      return m.modified_ms != 0 && m.modified_ms >= (snapshot_us_ - grace_us) / 1000;
    };
    std::set<std::string> named_keys;
    for (const NamedObject& n : named_) {
      const std::string key = n.tenant + "/" + n.ciphertext_sha256;
      named_keys.insert(key);
      const std::string what = n.artifact_id + " v" + std::to_string(n.version) + " " + n.what;
      const bool settled = n.place_since_us == 0 || now_us - n.place_since_us >= grace_us;  // the follow-up ran
      auto q = in_q.find(key), b = in_b.find(key);
      const bool has_q = q != in_q.end(), has_b = b != in_b.end();
      // A finding only if the claim is still where the snapshot put it.
      auto still = [&]() -> Result<bool> {
        OML_ASSIGN_OR_RETURN(std::optional<std::string> now, PlaceNow(n));
        return now && *now == n.place;
      };
      if (n.place == "none") {
        if (!settled) continue;  // the erasure's deletes follow its commit
        for (auto [has, bucket] : {std::pair{has_q, "quarantine"}, std::pair{has_b, "bodies"}})
          if (has)
            Add({"erased-object-present", bucket, n.tenant, n.seq, key, "", "deleted", "present",
                 what + ": the claim was erased, its object remains (ciphertext whose key is destroyed)"});
        continue;
      }
      const bool promoted = n.place == "bodies";
      if (!promoted && has_b && !young(b->second)) {
        OML_ASSIGN_OR_RETURN(bool st, still());
        if (st)
          Add({"misplaced-object", "bodies", n.tenant, n.seq, key, "containment-breach", "quarantine", "bodies",
               what + ": the journal never promoted this claim, yet its object is in the bodies bucket"});
      }
      if (promoted && has_q && settled && !young(q->second))
        Add({"misplaced-object", "quarantine", n.tenant, n.seq, key, "", "bodies", "quarantine",
             what + ": promoted, yet a copy remains in quarantine"});
      auto& here = promoted ? in_b : in_q;
      auto it = promoted ? b : q;
      const char* bucket = promoted ? "bodies" : "quarantine";
      if (it == here.end()) {
        OML_ASSIGN_OR_RETURN(bool st, still());
        if (st)
          Add({"missing-object", bucket, n.tenant, n.seq, key, "", "present", "missing",
               what + ": the object its state places in " + bucket + " is not there"});
        continue;
      }
      if (n.size && it->second.size != *n.size) {
        Add({"object-digest-mismatch", bucket, n.tenant, n.seq, key, "size", std::to_string(*n.size),
             std::to_string(it->second.size), what + ": the object's size is not the journalled ciphertext_size"});
        continue;
      }
      // Listed as the baseline hashed it (same size and modification time), for a claim version
      // that has not moved since: not read again.
      const ListingKey lk{bucket, key};
      const std::pair<int64_t, int64_t> seen{static_cast<int64_t>(it->second.size), it->second.modified_ms};
      if (n.carried && it->second.modified_ms != 0) {
        auto was = base_->listing.find(lk);
        if (was != base_->listing.end() && was->second == seen) {
          ++report_.objects_unchanged;
          listing_[lk] = seen;
          continue;
        }
      }
      blob::ObjectStore* store = promoted ? stores_.bodies : stores_.quarantine;
      auto digest = HashObject(*store, key, it->second.size, &report_.bytes_hashed);
      if (!digest.ok()) {
        if (digest.status().code() != Code::kNotFound) return digest.status();
        OML_ASSIGN_OR_RETURN(bool st, still());
        if (st)
          Add({"missing-object", bucket, n.tenant, n.seq, key, "", "present", "missing", what + ": deleted while read"});
        continue;
      }
      ++report_.objects_read;
      if (*digest != n.ciphertext_sha256)
        Add({"object-digest-mismatch", bucket, n.tenant, n.seq, key, "ciphertext_sha256", n.ciphertext_sha256, *digest,
             what + ": the object's bytes are not what the signed event names"});
      else if (!young(it->second) && it->second.modified_ms != 0)
        listing_[lk] = seen;  // hashed and right: a later run need not read it again
    }
    // What nothing names (--since knows the names of the claims in its window only: not judged).
    for (auto [listing, bucket] : {std::pair{&in_q, "quarantine"}, std::pair{&in_b, "bodies"}}) {
      if (base_ && base_->since) break;
      for (const auto& [key, m] : *listing) {
        if (named_keys.count(key)) continue;
        const size_t slash = key.find('/');
        const std::string tenant = slash == std::string::npos ? "" : key.substr(0, slash);
        if (!tenant.empty() && !InScope(tenant)) continue;
        if (unaudited_.count(tenant)) continue;  // its claims are not all known
        if (young(m)) continue;
        const std::string rest = slash == std::string::npos ? key : key.substr(slash + 1);
        if (rest.rfind("uploads/", 0) == 0) {
          const size_t end = rest.find('/', 8);
          const std::string id = rest.substr(8, end == std::string::npos ? std::string::npos : end - 8);
          auto s = sessions_.find({tenant, id});
          if (s != sessions_.end() && (s->second.pending || s->second.recent)) continue;
          Add({"stale-upload", bucket, tenant, 0, key, "", "", s == sessions_.end() ? "no session" : s->second.state,
               "a part of an upload session that is no longer receiving"});
          continue;
        }
        if (auto so = session_objects_.find(key); so != session_objects_.end()) {
          auto s = sessions_.find({tenant, so->second});
          if (s != sessions_.end() && (s->second.pending || s->second.recent)) continue;  // not attached yet
        }
        Add({"orphan-object", bucket, tenant, 0, key, "", "", std::to_string(m.size) + " bytes",
             "no signed event or live upload session names this object"});
      }
    }
    return Status::Ok();
  }

  // ---- incremental ----

  // Decides, before bronze is scanned, whether this run is incremental (base_ set, report_.mode
  // "incremental", new_bronze_files_ what bronze gained since) or full (report_.full_reason).
  // `baseline`: LoadBaseline's (not valid with --full).
  Status ChooseMode(std::future<Result<std::optional<Baseline>>>& baseline) {
    TableRead& bronze = tables_[kBronze];
    if (bronze.readable) {
      OML_ASSIGN_OR_RETURN(bronze_files_, bronze.handle->Files());
    }
    auto full = [&](std::string why) {
      report_.full_reason = std::move(why);
      base_.reset();
      new_bronze_files_.clear();
      removed_.clear();
      removed_rows_ = RowSet();
      return Status::Ok();
    };
    if (o_.since_us > 0) return SinceWindow();
    if (o_.full) return full("--full");
    OML_ASSIGN_OR_RETURN(std::optional<Baseline> b, baseline.get());
    for (const char* name : {kBronze, kSilver, kGold})
      if (!tables_[name].readable) return full(std::string(name) + " cannot be compared whole");
    if (!b)
      return full(std::string("no baseline: no earlier run of this stream over every tenant") +
                  (WithObjects() ? " and both buckets" : "") + " without findings recorded a checkpoint");
    base_ = std::move(b);
    const std::string since = " since baseline run " + std::to_string(base_->run);
    for (const auto& [name, was] : base_->txn)
      if (report_.txn[name] < was)
        return full(name + "'s txn went back from " + std::to_string(was) + " to " + std::to_string(report_.txn[name]) +
                    since);
    std::map<std::string, const lake::DataFile*> now;
    for (const auto& f : bronze_files_) now[f.path] = &f;
    for (const auto& [path, seen] : base_->bronze_files) {
      auto it = now.find(path);
      if (it == now.end()) {  // removed: by a compaction, if its rows are in the files added since
        removed_.push_back(path);
        removed_rows_.Merge(seen.rows);
        continue;
      }
      if (!it->second->stored_size || !it->second->stored_modified_ms ||
          std::pair{*it->second->stored_size, *it->second->stored_modified_ms} != std::pair{seen.size, seen.modified_ms})
        return full("bronze/events data file " + path + " was rewritten in place" + since + " (damage)");
      now.erase(it);
    }
    if (!removed_.empty() && !o_.only_tenant.empty())
      return full(std::to_string(removed_.size()) + " bronze/events data file(s) were removed" + since +
                  " (a compaction): only a run over every tenant can account for their rows");
    for (const auto& [path, f] : now) new_bronze_files_.push_back(path);
    // Each chain still has the event the baseline ended at (append-only: nothing before it changed
    // unless the chain was restored or forked).
    json at = json::array();
    for (const auto& [tenant, m] : base_->chains)
      if (InScope(tenant)) at.push_back({{"t", tenant}, {"q", m.head}});
    // (Each json_to_recordset row an index lookup: LATERAL ... OFFSET 0 keeps the planner, which
    // cannot estimate the list, from hashing a scan of the whole table.)
    OML_ASSIGN_OR_RETURN(db::Rows r, c_.Query("SELECT x.t::text, j.event_hash FROM json_to_recordset($1::json) AS "
                                              "x(t uuid, q bigint), LATERAL (SELECT event_hash FROM oml.journal j "
                                              "WHERE j.tenant_id = x.t AND j.seq = x.q OFFSET 0) j",
                                              {db::Text(at.dump())}));
    std::map<std::string, std::string> found;
    for (int i = 0; i < r.size(); ++i) found[r.Get(i, 0)] = crypto::Hex(r.GetBytes(i, 1));
    for (const auto& [tenant, m] : base_->chains) {
      if (!InScope(tenant)) continue;
      auto f = found.find(tenant);
      if (f == found.end() || f->second != m.hash)
        return full("the chain of tenant " + tenant + " no longer has the event at seq " + std::to_string(m.head) +
                    " that baseline run " + std::to_string(base_->run) + " ended at (restored or forked: run `oml verify`)");
    }
    report_.mode = "incremental";
    report_.baseline_run = base_->run;
    return Status::Ok();
  }

  // The incremental checkpoint's format; a baseline of another is not used (the run is full).
  static constexpr int kCheckpointVersion = 3;

  // --since: a window with no baseline behind it: each chain from its first event committed since
  // the start of the UTC day of --since, less an hour (an envelope's time is taken after its
  // transaction's start, which committed_at records, and may follow a head up to a minute ahead;
  // an event too many only costs its bronze row's comparison). Bronze is scanned whole.
  Status SinceWindow() {
    report_.mode = "since";
    since_day_ = DayOf(o_.since_us);
    using namespace std::chrono;
    const int64_t day_start_us =
        duration_cast<microseconds>(floor<days>(sys_time<microseconds>(microseconds(o_.since_us))).time_since_epoch())
            .count();
    OML_ASSIGN_OR_RETURN(
        db::Rows r,
        c_.Query("SELECT h.tenant_id::text, coalesce((SELECT min(j.seq) FROM oml.journal j WHERE j.tenant_id = "
                 "h.tenant_id AND j.committed_at >= to_timestamp($1::double precision / 1e6) - interval '1 hour'), "
                 "h.seq + 1) FROM oml.chain_heads h",
                 {db::Text(std::to_string(day_start_us))}));
    Baseline b;
    b.since = true;
    for (int i = 0; i < r.size(); ++i) {
      const int64_t before = r.GetInt(i, 1) - 1;
      b.chains[r.Get(i, 0)] = {before, "", before, before, before};
    }
    base_ = std::move(b);
    return Status::Ok();
  }

  bool WithObjects() const { return o_.objects && stores_.quarantine != nullptr && stores_.bodies != nullptr; }

  // The newest run of this stream over every tenant without findings that recorded a checkpoint
  // (with the buckets, if this run compares them); nullopt if there is none or it cannot be read.
  Result<std::optional<Baseline>> LoadBaseline() {
    // The candidates first, then each one's checkpoint (a condition on the jsonb would read every
    // run's checkpoint).
    OML_ASSIGN_OR_RETURN(db::Rows ids, c_.Query("SELECT id FROM oml.reconcile_runs WHERE stream = $1 AND tenant_id IS NULL "
                                                "AND findings = 0 AND (objects OR NOT $2) ORDER BY id DESC LIMIT 16",
                                                {db::Text(o_.stream), db::Text(WithObjects() ? "true" : "false")}));
    for (int i = 0; i < ids.size(); ++i) {
      OML_ASSIGN_OR_RETURN(db::Rows r, c_.Query("SELECT checkpoint->'incremental' FROM oml.reconcile_runs WHERE id = $1",
                                                {db::Int(ids.GetInt(i, 0))}));
      if (r.size() == 0 || r.IsNull(0, 0)) continue;  // a run that recorded none
      OML_ASSIGN_OR_RETURN(std::optional<Baseline> b, ParseBaseline(ids.GetInt(i, 0), r.Get(0, 0)));
      if (b) return b;  // else one of another format (or without the buckets): an older one may do
    }
    return std::optional<Baseline>();
  }

  Result<std::optional<Baseline>> ParseBaseline(int64_t run, const std::string& text) {
    Baseline b;
    b.run = run;
    try {
      const json c = json::parse(text);
      if (c.at("v").get<int>() != kCheckpointVersion) return std::optional<Baseline>();
      if (WithObjects() && !c.at("objects").get<bool>()) return std::optional<Baseline>();
      for (const auto& f : c.at("bronze_files")) {
        std::optional<RowSet> rows = RowSet::Parse(f.at(3).get<int64_t>(), f.at(4).get<std::string>());
        if (!rows) return std::optional<Baseline>();
        b.bronze_files[f.at(0).get<std::string>()] = {f.at(1).get<int64_t>(), f.at(2).get<int64_t>(), *rows};
      }
      for (const auto& [tenant, m] : c.at("chains").items())
        b.chains[tenant] = {m.at(0).get<int64_t>(), m.at(1).get<std::string>(), m.at(2).get<int64_t>(),
                            m.at(3).get<int64_t>(), m.at(4).get<int64_t>()};
      for (const auto& g : c.at("gold"))
        b.gold[{g.at(0).get<std::string>(), g.at(1).get<std::string>(), g.at(2).get<std::string>(),
                g.at(3).get<std::string>()}] = g.at(4).get<int64_t>();
      for (const auto& [tenant, rows] : c.at("silver").items())
        for (const auto& x : rows)
          b.silver[{tenant, x.at(0).get<std::string>(), x.at(1).get<int64_t>()}] = x.at(2).get<std::string>();
      for (const auto& [name, v] : c.at("txn").items()) b.txn[name] = v.get<int64_t>();
      b.frontier = c.at("frontier").get<int64_t>();
      b.caught_up = c.at("caught_up").get<bool>();
      const json& named = c.value("named", json::object());
      if (!named.is_object() || !c.at("silver").is_object()) return std::optional<Baseline>();
      for (const auto& [tenant, objects] : named.items())
        for (const auto& n : objects) {
          NamedObject o;
          o.tenant = tenant;
          o.artifact_id = n.at(0).get<std::string>();
          o.version = n.at(1).get<int64_t>();
          o.what = n.at(2).get<std::string>();
          o.seq = n.at(3).get<int64_t>();
          o.ciphertext_sha256 = n.at(4).get<std::string>();
          if (!n.at(5).is_null()) o.size = n.at(5).get<uint64_t>();
          o.place = n.at(6).get<std::string>();
          o.place_since_us = n.at(7).get<int64_t>();
          if (!n.at(8).is_null())  // hashed and right in its place: (size, modified ms) as listed then
            b.listing[{o.place, tenant + "/" + o.ciphertext_sha256}] = {n.at(8).get<int64_t>(), n.at(9).get<int64_t>()};
          b.named.push_back(std::move(o));
        }
    } catch (const json::exception&) {
      return std::optional<Baseline>();  // a checkpoint this version cannot read: a full run
    }
    return std::optional<Baseline>(std::move(b));
  }

  static bool LooksLikeUuid(const std::string& s) {
    if (s.size() != 36) return false;
    for (size_t i = 0; i < s.size(); ++i) {
      const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash ? s[i] != '-' : !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    }
    return true;
  }

  // Incremental: the claim versions each span's events name (their artifact_id; a
  // simulation.ended names every claim of its simulation), and of those, the events at or below
  // the span's start that made their state: found through the seq columns of oml.artifacts and
  // oml.attachments (an index only), read from the journal into seeds_.
  Status LoadSeeds(const std::vector<JournalPager::Span>& chains) {
    json spans = json::array();
    for (const auto& sp : chains)
      if (sp.after > 0 && sp.head > sp.after) spans.push_back({{"t", sp.tenant}, {"a", sp.after}, {"h", sp.head}});
    if (spans.empty()) return Status::Ok();
    // The span's events that name a claim made earlier (journal.event_type, set with the signed
    // bytes by the append, is the index; the bytes say what they name). claim.submitted names
    // only a version whose history starts there; the usual span, new claims only, reads nothing.
    OML_ASSIGN_OR_RETURN(
        db::Rows w,
        c_.Query("SELECT w.t::text, j.signed_bytes FROM json_to_recordset($1::json) AS w(t uuid, a bigint, h bigint), "
                 "LATERAL (SELECT signed_bytes FROM oml.journal j WHERE j.tenant_id = w.t AND j.seq > w.a AND "
                 "j.seq <= w.h AND j.event_type IN ('submission.attach', 'review.served', 'claim.promoted', "
                 "'claim.rejected', 'claim.demoted', 'artifact.erased', 'claim.reassigned', 'simulation.ended') "
                 "OFFSET 0) j",
                 {db::Text(spans.dump())}));
    std::set<std::pair<std::string, std::string>> ids, sims;  // (tenant, artifact_id | simulation_id)
    for (int i = 0; i < w.size(); ++i) {
      Result<journal::Envelope> e = journal::Envelope::FromVerifiedSignedBytes(w.GetBytes(i, 1));
      if (!e.ok() || !e->payload.is_object()) continue;  // the replay reports it
      const json& p = e->payload;
      // (A version submitted within the span has no seq at or below its start: no seed.)
      auto a = p.find("artifact_id");
      if (a != p.end() && a->is_string() && LooksLikeUuid(a->get<std::string>()))
        ids.emplace(w.Get(i, 0), a->get<std::string>());
      auto sim = p.find("simulation_id");
      if (e->type == "simulation.ended" && sim != p.end() && sim->is_string())
        sims.emplace(w.Get(i, 0), sim->get<std::string>());
    }
    if (ids.empty() && sims.empty()) return Status::Ok();  // the usual case: new claims only
    std::map<std::string, int64_t> after;
    for (const auto& sp : chains) after[sp.tenant] = sp.after;
    std::set<std::pair<std::string, int64_t>> seqs;
    auto add = [&](const std::string& tenant, int64_t seq) {
      if (seq > 0 && seq <= after[tenant]) seqs.emplace(tenant, seq);
    };
    const char* kSeqCols =
        "a.tenant_id::text, a.artifact_id::text, a.submitted_seq, coalesce(a.promoted_seq, 0), "
        "coalesce(a.rejected_seq, 0), coalesce(a.demoted_seq, 0), coalesce(a.erased_seq, 0), "
        "coalesce(a.retracted_seq, 0), coalesce(a.reassigned_seq, 0)";
    // oml.artifacts keeps a version's last claim.reassigned only: if that one is in the span, the
    // ones before it (which set the workarea a delivered row may still show) are looked up.
    std::set<std::pair<std::string, std::string>> reassigned_again;
    auto take = [&](const db::Rows& r) {
      for (int i = 0; i < r.size(); ++i) {
        ids.emplace(r.Get(i, 0), r.Get(i, 1));
        for (int c = 2; c <= 8; ++c) add(r.Get(i, 0), r.GetInt(i, c));
        if (r.GetInt(i, 8) > after[r.Get(i, 0)]) reassigned_again.emplace(r.Get(i, 0), r.Get(i, 1));
      }
    };
    if (!sims.empty()) {
      json list = json::array();  // (a JOIN: each pair an index lookup, not a scan)
      for (const auto& [t, sim] : sims) list.push_back({{"t", t}, {"s", sim}});
      OML_ASSIGN_OR_RETURN(db::Rows r, c_.Query(std::string("SELECT ") + kSeqCols +
                                                    " FROM oml.artifacts a JOIN json_to_recordset($1::json) AS x(t uuid, "
                                                    "s text) ON a.tenant_id = x.t AND a.simulation_id = x.s",
                                                {db::Text(list.dump())}));
      take(r);
    }
    if (ids.empty()) return LoadSeedEvents(seqs);
    json list = json::array();
    for (const auto& [t, id] : ids) list.push_back({{"t", t}, {"a", id}});
    OML_ASSIGN_OR_RETURN(db::Rows r, c_.Query(std::string("SELECT ") + kSeqCols +
                                                  " FROM json_to_recordset($1::json) AS x(t uuid, a uuid), LATERAL "
                                                  "(SELECT * FROM oml.artifacts a WHERE a.tenant_id = x.t AND "
                                                  "a.artifact_id = x.a OFFSET 0) a",
                                              {db::Text(list.dump())}));
    take(r);
    OML_ASSIGN_OR_RETURN(db::Rows at, c_.Query("SELECT x.t::text, t.attach_seq FROM json_to_recordset($1::json) AS "
                                               "x(t uuid, a uuid), LATERAL (SELECT attach_seq FROM oml.attachments t "
                                               "WHERE t.tenant_id = x.t AND t.artifact_id = x.a OFFSET 0) t",
                                               {db::Text(list.dump())}));
    for (int i = 0; i < at.size(); ++i) add(at.Get(i, 0), at.GetInt(i, 1));
    if (!reassigned_again.empty()) {
      json tenants = json::array();
      std::set<std::string> seen;
      for (const auto& [t, id] : reassigned_again)
        if (seen.insert(t).second) tenants.push_back({{"t", t}, {"a", after[t]}});
      OML_ASSIGN_OR_RETURN(
          db::Rows re, c_.Query("SELECT x.t::text, j.seq, j.signed_bytes FROM json_to_recordset($1::json) AS "
                                "x(t uuid, a bigint), LATERAL (SELECT seq, signed_bytes FROM oml.journal j WHERE "
                                "j.tenant_id = x.t AND j.seq <= x.a AND j.event_type = 'claim.reassigned' OFFSET 0) j",
                                {db::Text(tenants.dump())}));
      for (int i = 0; i < re.size(); ++i) {
        Result<journal::Envelope> e = journal::Envelope::FromVerifiedSignedBytes(re.GetBytes(i, 2));
        if (!e.ok() || !e->payload.is_object()) continue;  // (a full run reports it)
        auto a = e->payload.find("artifact_id");
        if (a != e->payload.end() && a->is_string() && reassigned_again.count({re.Get(i, 0), a->get<std::string>()}))
          add(re.Get(i, 0), re.GetInt(i, 1));
      }
    }
    return LoadSeedEvents(seqs);
  }

  Status LoadSeedEvents(const std::set<std::pair<std::string, int64_t>>& seqs) {
    if (seqs.empty()) return Status::Ok();
    json want = json::array();
    for (const auto& [t, q] : seqs) want.push_back({{"t", t}, {"q", q}});
    OML_ASSIGN_OR_RETURN(db::Rows ev, c_.Query("SELECT x.t::text, x.q, j.signed_bytes FROM json_to_recordset($1::json) "
                                               "AS x(t uuid, q bigint), LATERAL (SELECT signed_bytes FROM oml.journal j "
                                               "WHERE j.tenant_id = x.t AND j.seq = x.q OFFSET 0) j ORDER BY 1, 2",
                                               {db::Text(want.dump())}));
    for (int i = 0; i < ev.size(); ++i) {
      const std::string tenant = ev.Get(i, 0);
      const int64_t seq = ev.GetInt(i, 1);
      Result<journal::Envelope> e = journal::Envelope::FromVerifiedSignedBytes(ev.GetBytes(i, 2));
      if (!e.ok()) {
        Add({"journal-unreadable", "journal", tenant, seq, "", "", "", "",
             "the event's signed bytes do not parse (" + e.status().message() + "): run `oml verify`"});
        unaudited_.insert(tenant);
        continue;
      }
      seeds_[tenant].emplace_back(seq, std::move(*e));
      ++report_.events_seeded;
    }
    return Status::Ok();
  }

  // The checkpoint a later run may start from (report_.incremental), or why there is none
  // (report_.checkpoint_note). Written whatever the findings; only a run without any is chosen.
  void BuildCheckpoint() {
    auto none = [&](std::string why) { report_.checkpoint_note = std::move(why); };
    if (!o_.only_tenant.empty()) return none("a --tenant run records no checkpoint");

    if (o_.since_us > 0) return none("a --since run records no checkpoint");
    if (!report_.findings.empty()) return none("a run with findings is no baseline");
    if (!needs_full_.empty()) return none(needs_full_);
    if (!unaudited_.empty()) return none("a chain could not be replayed to its head");
    for (const char* name : {kBronze, kSilver, kGold})
      if (!tables_[name].readable) return none(std::string(name) + " could not be compared");
    json files = json::array();  // [[path, size, modified ms, rows, RowSet sum], ...]
    for (const auto& f : bronze_files_) {
      if (!f.stored_size || !f.stored_modified_ms) return none("bronze/events data file " + f.path + " is not listed");
      const RowSet* rows = nullptr;  // read by this run, or as the baseline read it
      if (auto it = scanned_files_.find(f.path); it != scanned_files_.end()) rows = &it->second;
      if (rows == nullptr && base_ && !base_->since)
        if (auto it = base_->bronze_files.find(f.path); it != base_->bronze_files.end()) rows = &it->second.rows;
      if (rows == nullptr) return none("bronze/events data file " + f.path + " was not read");
      files.push_back({f.path, *f.stored_size, *f.stored_modified_ms, rows->rows, rows->SumHex()});
    }
    json chains = json::object();
    bool caught_up = true;
    for (const auto& [tenant, tr] : track_) {
      caught_up = caught_up && tr.bronze_gap == 0 && tr.gold_gap == 0 && tr.silver_gap == 0;
      if (tr.broken)
        return none("tenant " + tenant +
                    ": an event reached the lake after an earlier one that has not (a requeued dead letter); the next "
                    "run is full");
      auto mark = [&](int64_t gap) { return gap == 0 ? tr.head : gap - 1; };
      chains[tenant] = {tr.head, tr.hash, mark(tr.bronze_gap), mark(tr.gold_gap), mark(tr.silver_gap)};
    }
    json gold = json::array();
    for (const auto& [k, n] : gold_expected_)
      gold.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), n});
    json silver = json::object();  // tenant -> [[artifact_id, version, digest], ...]
    for (const auto& [k, d] : silver_digest_) silver[std::get<0>(k)].push_back({std::get<1>(k), std::get<2>(k), d});
    json c = {{"v", kCheckpointVersion},         {"bronze_files", std::move(files)}, {"chains", std::move(chains)},
              {"gold", std::move(gold)}, {"silver", std::move(silver)}, {"txn", report_.txn},
              {"objects", WithObjects()}, {"frontier", frontier_}, {"caught_up", caught_up}};
    if (WithObjects()) {
      // tenant -> [[artifact_id, version, what, seq, sha256, size, place, since_us, listed size,
      // listed modified ms (both null unless hashed and right in its place)], ...]
      json named = json::object();
      for (const NamedObject& n : named_) {
        auto l = listing_.find({n.place, n.tenant + "/" + n.ciphertext_sha256});
        const bool listed = l != listing_.end();
        named[n.tenant].push_back({n.artifact_id, n.version, n.what, n.seq, n.ciphertext_sha256,
                                   n.size ? json(*n.size) : json(nullptr), n.place, n.place_since_us,
                                   listed ? json(l->second.first) : json(nullptr),
                                   listed ? json(l->second.second) : json(nullptr)});
      }
      c["named"] = std::move(named);
    }
    report_.incremental = std::move(c);
  }

  struct ArtInfo {
    std::string digest, place;
    int64_t seq = 0;       // claim.submitted
    int64_t since_us = 0;  // when `place` was set
  };
  struct BodyRow {
    std::string location, object_key, inline_sha256;  // inline_sha256: SHA-256 of an inline ciphertext
  };
  struct SessionRow {
    std::string state;
    bool recent = false;   // changed or expired within the grace: the sweeper may not have run
    bool pending = false;  // its object may still be attached: receiving, or complete and not expired
  };

  db::Conn& c_;
  std::string lake_root_;
  Stores stores_;
  Options o_;
  Report report_;
  std::map<std::string, TableRead> tables_;
  std::unique_ptr<Delivery> delivery_;
  std::map<std::string, std::vector<BronzeEntry>> bronze_;  // tenant -> its rows in seq order
  std::future<void> disposal_;  // Dispose's last
  std::atomic<bool> cancel_scan_{false};
  std::future<Result<BronzeScan>> bronze_scan_;  // bronze_, being read (after tables_: destroyed first)
  std::map<std::string, ReplayedChain> journal_rows_;  // tenant -> its events, for bronze
  std::vector<std::string> event_types_;
  std::map<std::string, uint32_t, std::less<>> event_type_index_;
  uint32_t TypeIndex(const std::string& type) {
    auto it = event_type_index_.find(type);
    if (it != event_type_index_.end()) return it->second;
    event_types_.push_back(type);
    return event_type_index_[type] = static_cast<uint32_t>(event_types_.size() - 1);
  }
  struct BronzeMismatch {
    std::string prev, hash, signature;  // the journal's, raw
    json expect;                        // journal::BronzeRow of the event
    Digest want{};                      // the digest its row must have
    bool done = false;                  // DetailBronze named the first row that differs
  };
  std::map<std::pair<std::string, int64_t>, BronzeMismatch> bronze_mismatch_;  // (tenant, seq)
  std::map<ArtKey, std::vector<json>, std::less<>> silver_;
  std::map<ArtKey, SilverExpect> silver_expected_;
  std::map<GoldKey, std::vector<int64_t>> gold_found_;
  std::map<GoldKey, int64_t> gold_expected_;
  GoldKey gold_last_key_;              // the key of the last gold_expected_ entry counted
  int64_t* gold_last_ = nullptr;       // its count (std::map entries do not move)
  std::map<ArtKey, ArtInfo> artifacts_;
  std::vector<NamedObject> named_;
  std::set<std::string> unaudited_;  // tenants whose chain could not be replayed to its head
  int64_t snapshot_us_ = 0;
  std::map<ArtKey, BodyRow> bodies_;                                      // artifact_bodies, in scope
  std::map<std::pair<std::string, std::string>, SessionRow> sessions_;  // (tenant, upload_id)
  std::map<std::string, std::string> session_objects_;                  // object key -> upload_id

  std::optional<Baseline> base_;                 // set: an incremental run (or a --since window)
  std::string since_day_;                        // --since: its UTC day; gold is compared from it
  int64_t frontier_ = 0;                         // the lake writer's frontier as the run began
  std::vector<lake::DataFile> bronze_files_;     // bronze's data files at the version read
  std::vector<std::string> new_bronze_files_;    // incremental: added since the baseline
  std::vector<std::string> removed_;             // incremental: baseline files no longer in bronze
  RowSet removed_rows_;                          // their rows, as the baseline read them
  std::map<std::string, RowSet> scanned_files_;  // each data file this run read
  std::string needs_full_;                       // set: only a full run can judge (Reconcile runs one)
  std::map<std::string, Track> track_;           // tenant -> its chain as replayed
  std::set<ArtKey> touched_;                     // incremental: the claim versions replayed
  std::map<std::string, std::vector<std::pair<int64_t, journal::Envelope>>> seeds_;  // LoadSeeds
  std::map<ArtKey, std::string> silver_digest_;  // SilverRowDigest of each silver row read
  std::map<ListingKey, std::pair<int64_t, int64_t>> listing_;  // objects hashed (or unchanged) and right
};

}  // namespace

json Finding::ToJson() const {
  json j = {{"class", cls}, {"table", table}};
  j["tenant"] = tenant.empty() ? json(nullptr) : json(tenant);
  j["seq"] = seq > 0 ? json(seq) : json(nullptr);
  j["key"] = key.empty() ? json(nullptr) : json(key);
  j["column"] = column.empty() ? json(nullptr) : json(column);
  j["expected"] = expected.empty() ? json(nullptr) : json(expected);
  j["found"] = found.empty() ? json(nullptr) : json(found);
  j["detail"] = detail;
  return j;
}

std::string Finding::ToText() const {
  std::string s = cls + " " + table;
  if (!tenant.empty()) s += " tenant " + tenant;
  if (seq > 0) s += " seq " + std::to_string(seq);
  if (!key.empty()) s += " " + key;
  s += ":";
  if (!column.empty()) s += " " + column;
  if (!expected.empty() || !found.empty()) s += " expected " + expected + ", found " + found + ";";
  s += " " + detail;
  return s;
}

std::map<std::string, int64_t> Report::Counts() const {
  std::map<std::string, int64_t> out;
  for (const auto& f : findings) ++out[f.cls];
  return out;
}

json Report::ToJson() const {
  json f = json::array();
  for (const auto& x : findings) f.push_back(x.ToJson());
  return {{"findings", f},
          {"summary",
           {{"findings", findings.size()},
            {"classes", Counts()},
            {"tenants", tenants},
            {"events", events},
            {"rows", {{"bronze/events", bronze_rows}, {"silver/claims", silver_rows}, {"gold/daily_activity", gold_rows}}},
            {"txn", txn},
            {"objects_listed", objects_listed},
            {"objects_read", objects_read},
            {"bytes_hashed", bytes_hashed},
            {"key_material_uses", key_material_uses},
            {"mode", mode},
            {"full_reason", full_reason.empty() ? json(nullptr) : json(full_reason)},
            {"baseline_run", baseline_run > 0 ? json(baseline_run) : json(nullptr)},
            {"objects_unchanged", objects_unchanged},
            {"events_seeded", events_seeded},
            {"checkpoint", incremental.is_null() ? json(checkpoint_note) : json("recorded")},
            {"seconds", seconds},
            {"phase_seconds", phase_seconds}}}};
}

std::string Report::ToText() const {
  std::string s;
  for (const auto& f : findings) s += f.ToText() + "\n";
  s += "reconcile: " + std::to_string(findings.size()) + " finding(s)";
  if (!findings.empty()) {
    s += " (";
    bool first = true;
    for (const auto& [c, n] : Counts()) {
      s += (first ? "" : ", ") + c + " " + std::to_string(n);
      first = false;
    }
    s += ")";
  }
  s += "; " + std::to_string(events) + " events of " + std::to_string(tenants) + " chain(s), " +
       std::to_string(bronze_rows) + " bronze, " + std::to_string(silver_rows) + " silver and " +
       std::to_string(gold_rows) + " gold rows, " + std::to_string(objects_listed) + " objects listed, " +
       std::to_string(objects_read) + " read" +
       (objects_unchanged > 0 ? " (" + std::to_string(objects_unchanged) + " unchanged, not read)" : "") +
       "; " + (mode == "incremental" ? "incremental from run " + std::to_string(baseline_run)
               : mode == "since"     ? std::string("since the start of its day")
                                     : "full (" + full_reason + ")") +
       "; no key loaded\n";
  return s;
}

const std::vector<std::string>& FindingClasses() {
  static const std::vector<std::string> k = {
      "missing-in-lake",  "duplicate-in-lake",  "extra-in-lake",   "row-mismatch",       "state-mismatch",
      "containment-breach", "count-mismatch",   "missing-object",  "object-digest-mismatch", "misplaced-object",
      "erased-object-present", "orphan-object", "stale-upload",    "stale-frontier",     "dead-lettered",
      "uncovered-outbox", "table-unreadable",   "journal-unreadable"};
  return k;
}

std::string Report::PrometheusText() const {
  const auto counts = Counts();
  std::string s =
      "# HELP oml_reconcile_findings Findings of the last oml reconcile run, by class.\n"
      "# TYPE oml_reconcile_findings gauge\n";
  for (const auto& c : FindingClasses()) {
    auto it = counts.find(c);
    s += "oml_reconcile_findings{class=\"" + c + "\"} " + std::to_string(it == counts.end() ? 0 : it->second) + "\n";
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(started_unix_ms) / 1000.0 + seconds);
  s += "# HELP oml_reconcile_last_run_timestamp_seconds When the last oml reconcile run ended (Unix time).\n"
       "# TYPE oml_reconcile_last_run_timestamp_seconds gauge\n"
       "oml_reconcile_last_run_timestamp_seconds " + std::string(buf) + "\n";
  std::snprintf(buf, sizeof(buf), "%.3f", seconds);
  s += "# HELP oml_reconcile_last_run_duration_seconds How long the last oml reconcile run took.\n"
       "# TYPE oml_reconcile_last_run_duration_seconds gauge\n"
       "oml_reconcile_last_run_duration_seconds " + std::string(buf) + "\n"
       "# HELP oml_reconcile_events_audited Journal events the last oml reconcile run audited.\n"
       "# TYPE oml_reconcile_events_audited gauge\n"
       "oml_reconcile_events_audited " + std::to_string(events) + "\n";
  return s;
}

Status RecordRun(db::Conn& conn, const Report& r, const Options& o, int64_t repaired) {
  json checkpoint = {{"table_version", r.table_version}, {"txn", r.txn}, {"heads", r.heads}};
  if (!r.incremental.is_null()) checkpoint["incremental"] = r.incremental;
  return conn
      .Query("INSERT INTO oml.reconcile_runs (stream, tenant_id, started_at, findings, classes, events, objects, "
             "repaired, checkpoint) VALUES ($1, nullif($2, '')::uuid, now() - make_interval(secs => $3::double precision), $4, "
             "$5::jsonb, $6, $7, $8, $9::jsonb)",
             {db::Text(o.stream), db::Text(o.only_tenant), db::Text(std::to_string(r.seconds)),
              db::Int(static_cast<int64_t>(r.findings.size())), db::Text(json(r.Counts()).dump()), db::Int(r.events),
              db::Text(o.objects ? "true" : "false"), db::Int(repaired), db::Text(checkpoint.dump())})
      .status();
}

Result<Report> Reconcile(db::Conn& conn, const std::string& lake_root, const Stores& stores, const Options& o) {
  std::string why;
  {
    Auditor a(conn, lake_root, stores, o);
    OML_ASSIGN_OR_RETURN(Report r, a.Run());
    if (a.needs_full().empty()) return r;
    why = a.needs_full();
  }
  Options full = o;
  full.full = true;
  Auditor a(conn, lake_root, stores, full);
  OML_ASSIGN_OR_RETURN(Report r, a.Run());
  r.full_reason = "incremental run abandoned: " + why;
  return r;
}

}  // namespace oml::reconcile
