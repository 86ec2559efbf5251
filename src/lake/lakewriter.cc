#include "lake/lakewriter.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sync_point.h"
#include "crypto/crypto.h"
#include "db/migrate.h"
#include "lake/dead_letter.h"

namespace oml::lake {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kConflict[] = "lake-commit-conflict";
constexpr char kBronze[] = "bronze/events";
constexpr char kRowRefused[] = "lake-row-refused";
// Commits of one table's part per batch attempt, when the ones before lost to commits that carry
// no txn of this stream (compactions).
constexpr int kMaxCommitAttempts = 4;

// Milliseconds since `t0`, and t0 moved to now: consecutive phases of one batch.
double Lap(Clock::time_point* t0) {
  const auto now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - *t0).count();
  *t0 = now;
  return ms;
}

// The bytes the JSON lines of `rows` take, about (row_data plus outbox_seq).
size_t RowBytesHint(const std::vector<const OutboxRow*>& rows) {
  size_t n = 0;
  for (const OutboxRow* r : rows) n += r->row_data.size() + 32;
  return n;
}

std::string DefaultHolder() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::random_device rd;
  char rnd[17];
  std::snprintf(rnd, sizeof(rnd), "%08x%08x", rd(), rd());
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + rnd;
}

// A pending horizon probe is checked every LakeWriterOptions::horizon_poll for this long.
constexpr auto kHorizonFastPollFor = std::chrono::seconds(1);

bool Stopped(const std::atomic<bool>* stop) { return stop != nullptr && stop->load(); }

// Sleeps `d`, in short steps so that a stop request is seen within 50 ms.
void SleepUnlessStopped(std::chrono::milliseconds d, const std::atomic<bool>* stop) {
  const auto until = Clock::now() + d;
  while (!Stopped(stop)) {
    const auto now = Clock::now();
    if (now >= until) return;
    std::this_thread::sleep_for(std::min<Clock::duration>(until - now, std::chrono::milliseconds(50)));
  }
}

bool IsConflict(const Status& s) { return s.code() == Code::kAborted && s.type() == kConflict; }

const char* RetryKind(const Status& s) {
  if (IsConflict(s)) return "conflict";
  if (s.code() == Code::kAborted && s.type() == kRowRefused) return "row-refused";
  return "error";
}

bool Retryable(const Status& s) {
  return s.code() == Code::kAborted || s.code() == Code::kUnavailable || s.code() == Code::kInternal;
}

int64_t MetaInt(const std::optional<nlohmann::json>& meta, const char* key, int64_t fallback) {
  if (!meta || !meta->is_object()) return fallback;
  auto it = meta->find(key);
  if (it == meta->end() || !it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

// One member of a JSON object text: its key as written (between the quotes, escapes not
// decoded) and its value's bytes [vb, ve) (surrounding blanks excluded).
struct Member {
  std::string_view key;
  size_t vb = 0, ve = 0;
};

// The top-level members of the JSON object in `t`, in order, found by one byte scan that tracks
// strings (with escapes) and nesting; *close is the offset of the closing brace. false unless `t`
// is a well-nested object on one line (blanks around tokens allowed, trailing blanks too): the
// caller then parses the text properly. A string never holds a raw quote or line break in valid
// JSON, so nothing inside a string is taken for structure.
bool TopLevelMembers(std::string_view t, std::vector<Member>* out, size_t* close) {
  size_t end = t.size();
  while (end > 0 && (t[end - 1] == ' ' || t[end - 1] == '\t' || t[end - 1] == '\n' || t[end - 1] == '\r')) --end;
  if (end < 2 || t[0] != '{' || t[end - 1] != '}') return false;
  // Two memchr scans: find_first_of with a two-byte set calls memchr once per byte of `t`
  // (it was ~20% of the drain's CPU, docs/performance.md "Lake").
  if (std::memchr(t.data(), '\n', end) != nullptr || std::memchr(t.data(), '\r', end) != nullptr) return false;
  const size_t last = end - 1;  // the closing brace
  *close = last;
  auto skip_blanks = [&](size_t i) {
    while (i < last && (t[i] == ' ' || t[i] == '\t')) ++i;
    return i;
  };
  // t[i] == '"'; the offset of its closing quote, or npos. memchr finds each candidate quote; it
  // closes the string unless an odd run of backslashes (inside the string) precedes it.
  auto string_end = [&](size_t i) -> size_t {
    size_t j = i + 1;
    while (j < last) {
      const void* q = std::memchr(t.data() + j, '"', last - j);
      if (q == nullptr) return std::string_view::npos;
      const size_t k = static_cast<const char*>(q) - t.data();
      size_t slashes = 0;
      while (k - slashes > i + 1 && t[k - slashes - 1] == '\\') ++slashes;
      if (slashes % 2 == 0) return k;
      j = k + 1;
    }
    return std::string_view::npos;
  };
  size_t i = skip_blanks(1);
  if (i == last) return true;  // {}
  for (;;) {
    if (t[i] != '"') return false;
    const size_t k = string_end(i);
    if (k == std::string_view::npos) return false;
    Member m;
    m.key = t.substr(i + 1, k - i - 1);
    i = skip_blanks(k + 1);
    if (i >= last || t[i] != ':') return false;
    m.vb = i = skip_blanks(i + 1);
    int depth = 0;
    while (i < last) {
      const char c = t[i];
      if (c == '"') {
        const size_t q = string_end(i);
        if (q == std::string_view::npos) return false;
        i = q + 1;
        continue;
      }
      if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth < 0) return false;
      } else if (c == ',' && depth == 0) {
        break;
      }
      ++i;
    }
    if (depth != 0) return false;
    m.ve = i;
    while (m.ve > m.vb && (t[m.ve - 1] == ' ' || t[m.ve - 1] == '\t')) --m.ve;
    if (m.ve == m.vb) return false;
    out->push_back(m);
    if (i >= last) return true;
    i = skip_blanks(i + 1);  // past the comma
  }
}

// The contents of a member's value if it is a string without escapes; nullopt otherwise.
std::optional<std::string_view> PlainString(std::string_view t, const Member& m) {
  if (m.ve - m.vb < 2 || t[m.vb] != '"' || t[m.ve - 1] != '"') return std::nullopt;
  std::string_view v = t.substr(m.vb + 1, m.ve - m.vb - 2);
  if (v.find('\\') != std::string_view::npos) return std::nullopt;
  return v;
}

// The table an outbox row may target (derived tables are never an outbox target).
const TargetTable* FindOutboxTarget(const std::string& name) {
  for (const auto& t : TargetTables())
    if (t.name == name && !t.derived) return &t;
  return nullptr;
}

// "YYYY-MM-DD", the UTC day of microseconds since the epoch.
std::string UtcDayOfMicros(int64_t us) {
  const int64_t days = (us >= 0 ? us : us - 86'399'999'999) / 86'400'000'000;
  const std::chrono::sys_days d{std::chrono::days(days)};
  const std::chrono::year_month_day ymd{d};
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04d-%02u-%02u", static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()));
  return buf;
}

// The UTC day of an occurred_at text, by the one parser bronze's timestamp column uses
// (ParseRfc3339Micros: 'Z' or an offset), so that gold accepts exactly the rows bronze accepts;
// "" if it does not parse.
std::string UtcDayOfText(std::string_view s) {
  const std::optional<int64_t> us = ParseRfc3339Micros(s);
  return us ? UtcDayOfMicros(*us) : std::string();
}

// The same of a JSON occurred_at: RFC 3339 text or integer microseconds (bronze's two encodings).
std::string UtcDay(const nlohmann::json& v) {
  if (v.is_string()) return UtcDayOfText(v.get_ref<const std::string&>());
  if (v.is_number_integer()) return UtcDayOfMicros(v.get<int64_t>());
  return "";
}

}  // namespace

int32_t Fnv1a32(std::string_view s) {
  uint32_t h = 2166136261u;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 16777619u;
  }
  return static_cast<int32_t>(h);
}

const std::vector<TargetTable>& TargetTables() {
  static const auto* t = new std::vector<TargetTable>{
      {kBronze, {"signed_bytes", "signature"}, TableWrite::kAppend, {}, false},
      // Promotion inserts; demotion, erasure and a simulation's end (later rows of the same key)
      // set the state (an erasure also body_location: none:<key>), a reassignment the workarea
      // (admission/lifecycle.h). The identity and
      // provenance columns (path at write included) are the promotion's and never change.
      {"silver/claims",
       {},
       TableWrite::kMerge,
       // Applied only when newer by chain seq (issue 18): a requeued or replayed row of an earlier
       // event never puts an older state back.
       MergeSpec{{"tenant_id", "artifact_id", "version"},
                 std::vector<std::string>{"workarea_id", "promoted_at", "state", "state_changed_at", "body_location",
                                          "last_event_seq", "outbox_seq"},
                 {},
                 "last_event_seq"},
       false},
      {"gold/daily_activity",
       {},
       TableWrite::kMerge,
       MergeSpec{{"tenant_id", "day", "workarea_id", "event_type"}, std::vector<std::string>{"last_outbox_seq"},
                 {"events"},
                 ""},
       true},
  };
  return *t;
}

Result<std::string> DailyActivityRows(const std::vector<const OutboxRow*>& rows, int64_t above_seq,
                                      int64_t* bad_seq) {
  DailyActivityCounts counts;
  OML_RETURN_IF_ERROR(CountDailyActivity(rows, above_seq, &counts, bad_seq));
  return DailyActivityJson(counts);
}

Status CountDailyActivity(const std::vector<const OutboxRow*>& rows, int64_t above_seq, DailyActivityCounts* out,
                          int64_t* bad_seq) {
  DailyActivityCounts& counts = *out;
  for (const OutboxRow* row : rows) {
    if (row->target_table != kBronze || row->seq <= above_seq) continue;
#ifdef OML_SYNC_POINTS
    // Tests make gold alone refuse one row that bronze accepted (tests/test_lake_tables.py):
    // OML_FAULT=lakewriter.gold.count.<outbox seq>.
    if (!OML_SYNC_POINT(("lakewriter.gold.count." + std::to_string(row->seq)).c_str()).ok()) {
      if (bad_seq != nullptr) *bad_seq = row->seq;
      return InvalidArgument("outbox seq " + std::to_string(row->seq) + ": refused by gold/daily_activity (injected)",
                             "invalid-outbox-row");
    }
#endif
    // Fast path: the four members as plain strings, found by the byte scan.
    {
      std::vector<Member> members;
      size_t close = 0;
      std::optional<std::string_view> tenant, type, time, workarea;
      bool plain = TopLevelMembers(row->row_data, &members, &close);
      for (const Member& m : members) {
        if (m.key.find('\\') != std::string_view::npos) plain = false;
        std::optional<std::string_view>* slot = m.key == "tenant_id"     ? &tenant
                                                : m.key == "event_type"  ? &type
                                                : m.key == "occurred_at" ? &time
                                                : m.key == "workarea_id" ? &workarea
                                                                         : nullptr;
        if (slot == nullptr) continue;
        *slot = PlainString(row->row_data, m);
        if (!*slot && !(slot == &workarea && std::string_view(row->row_data).substr(m.vb, m.ve - m.vb) == "null"))
          plain = false;
      }
      const std::string day = plain && time ? UtcDayOfText(*time) : std::string();
      if (plain && tenant && type && !day.empty()) {
        DailyActivityCount& c = counts[{std::string(*tenant), day, workarea ? std::string(*workarea) : std::string(),
                                        std::string(*type)}];
        ++c.events;
        c.last_outbox_seq = std::max(c.last_outbox_seq, row->seq);
        continue;
      }
    }
    auto doc = nlohmann::json::parse(row->row_data, nullptr, /*allow_exceptions=*/false);
    std::string day;
    bool ok = doc.is_object() && doc.contains("tenant_id") && doc["tenant_id"].is_string() &&
              doc.contains("event_type") && doc["event_type"].is_string() && doc.contains("occurred_at");
    if (ok) day = UtcDay(doc["occurred_at"]);
    if (!ok || day.empty()) {
      if (bad_seq != nullptr) *bad_seq = row->seq;
      return InvalidArgument("outbox seq " + std::to_string(row->seq) +
                                 ": no tenant_id, event_type or occurred_at to count in gold/daily_activity",
                             "invalid-outbox-row");
    }
    std::string workarea;
    if (auto w = doc.find("workarea_id"); w != doc.end() && w->is_string()) workarea = w->get<std::string>();
    DailyActivityCount& c =
        counts[{doc["tenant_id"].get<std::string>(), day, workarea, doc["event_type"].get<std::string>()}];
    ++c.events;
    c.last_outbox_seq = std::max(c.last_outbox_seq, row->seq);
  }
  return Status::Ok();
}

std::string DailyActivityJson(const DailyActivityCounts& counts) {
  std::string out;
  for (const auto& [k, c] : counts) {
    out += nlohmann::json{{"tenant_id", std::get<0>(k)},
                          {"day", std::get<1>(k)},
                          {"workarea_id", std::get<2>(k)},
                          {"event_type", std::get<3>(k)},
                          {"events", c.events},
                          {"last_outbox_seq", c.last_outbox_seq}}
               .dump();
    out += '\n';
  }
  return out;
}

namespace {

// Standard base64 (RFC 4648 §4) as the adapter decodes it: length a multiple of 4, the
// alphabet A-Z a-z 0-9 + /, and at most two '=' at the end. A table lookup per byte, no
// allocation (the drain's hot loop). The adapter also refuses non-zero padding bits; such a row
// passes here and is located by the writer's row check instead (a row refusal, then a dead letter).
bool IsStandardBase64(std::string_view s) {
  static const auto* kAlphabet = [] {
    auto* t = new std::array<bool, 256>{};
    for (unsigned char c : std::string_view("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"))
      (*t)[c] = true;
    return t;
  }();
  if (s.size() % 4 != 0) return false;
  size_t n = s.size();
  if (n > 0 && s[n - 1] == '=') --n;
  if (n > 0 && s[n - 1] == '=' && n + 1 == s.size()) --n;
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok &= (*kAlphabet)[static_cast<unsigned char>(s[i])];
  return ok;
}

// The fast path of ToDeltaRow: one byte scan of the row_data text instead of a JSON parse and
// dump (the drain's hot loop, docs/performance.md "Lake"). The text is passed through byte for
// byte (binary columns stay base64, which the adapter decodes) and "outbox_seq" is appended
// before the closing brace. nullopt whenever the input is not the simple case (TopLevelMembers
// fails, a key with an escape, a top-level "outbox_seq" already there, a binary value that is
// neither null nor a plain string of standard base64): the slow path then decides, with its
// precise errors. Both paths give the same JSON value (ToDeltaRowTest).
std::optional<std::string> ToDeltaRowFast(const OutboxRow& row, const TargetTable& table) {
  const std::string_view t = row.row_data;
  std::vector<Member> members;
  size_t close = 0;
  if (!TopLevelMembers(t, &members, &close)) return std::nullopt;
  for (const Member& m : members) {
    if (m.key.find('\\') != std::string_view::npos || m.key == "outbox_seq") return std::nullopt;
    bool binary = false;
    for (const auto& col : table.binary_columns) binary = binary || m.key == col;
    if (!binary || t.substr(m.vb, m.ve - m.vb) == "null") continue;
    auto v = PlainString(t, m);
    if (!v || !IsStandardBase64(*v)) return std::nullopt;
  }
  std::string out;
  out.reserve(close + 32);
  out.append(t, 0, close);  // up to the closing brace
  out += members.empty() ? "\"outbox_seq\": " : ", \"outbox_seq\": ";
  out += std::to_string(row.seq);
  out += "}\n";
  return out;
}

}  // namespace

Result<std::string> ToDeltaRow(const OutboxRow& row, const TargetTable& table) {
  if (auto fast = ToDeltaRowFast(row, table)) return std::move(*fast);
  auto doc = nlohmann::json::parse(row.row_data, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidArgument("outbox seq " + std::to_string(row.seq) + ": row_data is not a JSON object",
                           "invalid-outbox-row");
  }
  for (const auto& col : table.binary_columns) {
    auto it = doc.find(col);
    if (it == doc.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return InvalidArgument("outbox seq " + std::to_string(row.seq) + ": " + col + " is not a base64 string",
                             "invalid-outbox-row");
    }
    if (!IsStandardBase64(it->get_ref<const std::string&>())) {
      return InvalidArgument("outbox seq " + std::to_string(row.seq) + ": " + col + " is not valid base64",
                             "invalid-outbox-row");
    }
  }
  doc["outbox_seq"] = row.seq;
  return doc.dump() + "\n";
}

namespace {

// The text of a JSON string value `v` (quotes included in v), unescaped: v's own bytes when it
// holds no escape, else decoded into *buf. nullopt if v is not exactly one JSON string.
std::optional<std::string_view> JsonStringValue(std::string_view v, std::string* buf) {
  if (v.size() < 2 || v.front() != '"' || v.back() != '"') return std::nullopt;
  const std::string_view inner = v.substr(1, v.size() - 2);
  if (std::memchr(inner.data(), '\\', inner.size()) == nullptr &&
      std::memchr(inner.data(), '"', inner.size()) == nullptr)
    return inner;
  auto j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
  if (!j.is_string()) return std::nullopt;
  *buf = j.get<std::string>();
  return std::string_view(*buf);
}

std::optional<int64_t> JsonInt64(std::string_view v) {
  int64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size()) return std::nullopt;
  return out;
}

}  // namespace

std::optional<int64_t> ParseRfc3339Micros(std::string_view s) {
  auto digits = [&](size_t at, size_t n, int* out) {
    if (at + n > s.size()) return false;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
  };
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!digits(0, 4, &year) || s.size() < 20 || s[4] != '-' || !digits(5, 2, &month) || s[7] != '-' ||
      !digits(8, 2, &day) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !digits(11, 2, &hour) ||
      s[13] != ':' || !digits(14, 2, &minute) || s[16] != ':' || !digits(17, 2, &second))
    return std::nullopt;
  size_t i = 19;
  int64_t micros = 0;
  if (i < s.size() && s[i] == '.') {
    const size_t start = ++i;
    int64_t scale = 100'000;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      micros += (s[i] - '0') * scale;  // digits past the sixth are cut off (scale 0)
      scale /= 10;
      ++i;
    }
    if (i == start || i - start > 9) return std::nullopt;
  }
  if (i >= s.size()) return std::nullopt;
  int64_t offset_seconds = 0;
  if (s[i] == 'Z' || s[i] == 'z') {
    ++i;
  } else if (s[i] == '+' || s[i] == '-') {
    int oh = 0, om = 0;
    if (!digits(i + 1, 2, &oh) || i + 3 >= s.size() || s[i + 3] != ':' || !digits(i + 4, 2, &om) || oh > 23 ||
        om > 59)
      return std::nullopt;
    offset_seconds = (s[i] == '-' ? -1 : 1) * (oh * 3600 + om * 60);
    i += 6;
  } else {
    return std::nullopt;
  }
  if (i != s.size() || hour > 23 || minute > 59 || second > 59) return std::nullopt;
  const std::chrono::year_month_day ymd{std::chrono::year{year}, std::chrono::month{static_cast<unsigned>(month)},
                                        std::chrono::day{static_cast<unsigned>(day)}};
  if (!ymd.ok()) return std::nullopt;
  const int64_t days = std::chrono::sys_days(ymd).time_since_epoch().count();
  return (days * 86'400 + hour * 3'600 + minute * 60 + second - offset_seconds) * 1'000'000 + micros;
}

namespace {

// AppendDeltaRow's values of one row, without EndRow; an error leaves the row partial (the
// caller rolls it back) and its message does not name the seq yet.
Status AppendRowValues(const OutboxRow& row, ArrowBatch* batch) {
  auto bad = [](const std::string& what) { return InvalidArgument(what); };
  std::string_view t = row.row_data;
  std::string compact;  // row_data re-serialized on one line, when the byte scan cannot take it as is
  std::vector<Member> members;
  size_t close = 0;
  if (!TopLevelMembers(t, &members, &close)) {
    auto doc = nlohmann::json::parse(t, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) return bad("row_data is not a JSON object");
    compact = doc.dump();
    t = compact;
    members.clear();
    if (!TopLevelMembers(t, &members, &close)) return bad("row_data is not a JSON object");
  }
  const int seq_col = batch->ColumnIndex("outbox_seq");
  if (seq_col < 0) return bad("the table has no outbox_seq column");
  std::string key_buf, value_buf;
  for (const Member& m : members) {
    std::string_view key = m.key;
    if (key.find('\\') != std::string_view::npos) {
      auto k = JsonStringValue(t.substr(m.key.data() - t.data() - 1, m.key.size() + 2), &key_buf);
      if (!k) return bad("a member name is not a JSON string");
      key = *k;
    }
    const int col = batch->ColumnIndex(key);
    if (col < 0) return bad("no column " + std::string(key) + " in the table");
    if (col == seq_col) continue;  // the row's own seq, whatever row_data says
    const std::string_view v = t.substr(m.vb, m.ve - m.vb);
    if (v == "null") {
      batch->AppendNull(col);
      continue;
    }
    const ArrowColumnSpec& spec = batch->columns()[static_cast<size_t>(col)];
    switch (spec.type) {
      case ArrowColumnType::kString: {
        auto s = JsonStringValue(v, &value_buf);
        if (!s) return bad(spec.name + " is not a string");
        OML_RETURN_IF_ERROR(batch->AppendBytes(col, *s));
        break;
      }
      case ArrowColumnType::kBinary: {
        auto s = JsonStringValue(v, &value_buf);
        if (!s) return bad(spec.name + " is not a base64 string");
        auto raw = crypto::FromBase64(*s);
        if (!raw.ok()) return bad(spec.name + " is not valid base64 (" + raw.status().message() + ")");
        OML_RETURN_IF_ERROR(batch->AppendBytes(col, *raw));
        break;
      }
      case ArrowColumnType::kLong: {
        auto n = JsonInt64(v);
        if (!n) return bad(spec.name + " is not a 64-bit integer");
        batch->AppendInt64(col, *n);
        break;
      }
      case ArrowColumnType::kTimestamp: {
        std::optional<int64_t> us;
        if (auto s = JsonStringValue(v, &value_buf)) {
          us = ParseRfc3339Micros(*s);
        } else {
          us = JsonInt64(v);
        }
        if (!us) return bad(spec.name + " is neither an RFC 3339 time nor integer microseconds");
        batch->AppendInt64(col, *us);
        break;
      }
    }
  }
  batch->AppendInt64(seq_col, row.seq);
  return Status::Ok();
}

}  // namespace

Status AppendDeltaRow(const OutboxRow& row, ArrowBatch* batch) {
  Status st = AppendRowValues(row, batch);
  if (st.ok()) st = batch->EndRow();  // rolls the row back itself when it refuses it
  if (st.ok()) return st;
  batch->RollbackRow();
  if (st.code() != Code::kInvalidArgument) return st;
  return InvalidArgument("outbox seq " + std::to_string(row.seq) + ": " + st.message(), "invalid-outbox-row");
}

LakeWriter::LakeWriter(LakeWriterOptions o)
    : opts_(std::move(o)), app_id_(AppIdFor(opts_.stream)), compaction_lease_(std::make_shared<CompactionLease>()) {
  if (opts_.holder.empty()) opts_.holder = DefaultHolder();
  compaction_lease_->database_url = opts_.database_url;
  compaction_lease_->stream = opts_.stream;
  if (opts_.max_rows < 1) opts_.max_rows = 1;
}

LakeWriter::~LakeWriter() = default;

void LakeWriter::Disconnect() {
  conn_.reset();  // closing the session releases the lease's advisory lock
  SetLeaseHeld(false);
}

Status LakeWriter::Connect() {
  Disconnect();
  OML_ASSIGN_OR_RETURN(stream_, ResolveStream(opts_.stream));
  OML_ASSIGN_OR_RETURN(db::Conn c, db::Conn::Connect(opts_.database_url));
  OML_RETURN_IF_ERROR(db::CheckSchemaVersion(c));
  conn_ = std::make_unique<db::Conn>(std::move(c));
  return Status::Ok();
}

Status LakeWriter::EnsureConnected() {
  if (conn_ && conn_->healthy()) return Status::Ok();
  if (conn_) log::Warn("lake writer: database connection lost; reconnecting", {{"stream", opts_.stream}});
  return Connect();
}

Result<DeltaTable*> LakeWriter::Table(const std::string& name) {
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    const std::string uri = TableUri(opts_.lake_root, name);
    auto t = DeltaTable::Open(uri);
    if (!t.ok()) {
      if (t.status().code() == Code::kNotFound)
        return FailedPrecondition("lake table " + name + " does not exist at " + uri + " (run `oml init`)",
                                  "lake-table-missing");
      return t.status();
    }
    it = tables_.emplace(name, std::move(*t)).first;
  }
  return &it->second;
}

void LakeWriter::SetLeaseHeld(bool held) {
  lease_held_ = held;
  compaction_lease_->epoch.store(held ? epoch_ : 0);
}

Status LakeWriter::CompactionLease::Check() {
  const int64_t e = epoch.load();
  if (e == 0) return Status(Code::kAborted, "the lake writer lease is not held", "lease-lost");
  // The writer's own session holds the lock; this connection (the compactor's thread only) sees
  // whether another process took the lease over since (a new epoch).
  if (!conn || !conn->healthy()) {
    conn.reset();
    OML_ASSIGN_OR_RETURN(db::Conn c, db::Conn::Connect(database_url));
    conn = std::make_unique<db::Conn>(std::move(c));
  }
  OML_ASSIGN_OR_RETURN(db::Rows r, conn->Query("SELECT lease_epoch FROM oml.lake_frontier WHERE stream = $1",
                                               {db::Text(stream)}));
  if (r.size() != 1 || r.GetInt(0, 0) != e || epoch.load() != e)
    return Status(Code::kAborted, "the lake writer lease was taken over (epoch " + std::to_string(e) + ")",
                  "lease-lost");
  return Status::Ok();
}

Result<bool> LakeWriter::TryAcquireLease() {
  OML_RETURN_IF_ERROR(EnsureConnected());
  if (lease_held_) return true;
  OML_ASSIGN_OR_RETURN(db::Rows got, conn_->Query("SELECT pg_try_advisory_lock($1::int4, $2::int4)",
                                                  {db::Int(kLeaseClassId), db::Int(Fnv1a32(app_id_))}));
  if (got.Get(0, 0) != "t") return false;
  // The lock is ours: record who holds it under a new epoch (lease_expires_at stays NULL: the
  // lease lasts as long as this session, there is nothing to renew).
  auto r = conn_->Query(
      "UPDATE oml.lake_frontier SET lease_holder = $2, lease_epoch = lease_epoch + 1, lease_expires_at = NULL, "
      "updated_at = now() WHERE stream = $1 RETURNING lease_epoch, frontier_seq",
      {db::Text(stream_.name), db::Text(opts_.holder)});
  if (!r.ok() || r->size() != 1) {
    (void)conn_->Query("SELECT pg_advisory_unlock($1::int4, $2::int4)", {db::Int(kLeaseClassId), db::Int(Fnv1a32(app_id_))});
    if (!r.ok()) return r.status();
    return NotFound("outbox stream " + stream_.name + " has no lake_frontier row", "unknown-stream");
  }
  epoch_ = r->GetInt(0, 0);
  SetLeaseHeld(true);
  ++stats_.lease_acquisitions;
  log::Info("lake writer: lease acquired",
            {{"stream", stream_.name}, {"app_id", app_id_}, {"epoch", epoch_}, {"holder", opts_.holder},
             {"frontier", r->GetInt(0, 1)}});
  return true;
}

Result<bool> LakeWriter::AcquireLease(const std::atomic<bool>* stop) {
  bool announced = false;
  for (;;) {
    OML_ASSIGN_OR_RETURN(bool got, TryAcquireLease());
    if (got) return true;
    if (!announced) {
      std::string holder;
      auto h = conn_->Query("SELECT coalesce(lease_holder, '') FROM oml.lake_frontier WHERE stream = $1",
                            {db::Text(stream_.name)});
      if (h.ok() && h->size() == 1) holder = h->Get(0, 0);
      log::Info("lake writer: standby, another writer holds the lease",
                {{"stream", stream_.name}, {"holder", holder}, {"poll_ms", opts_.standby_poll.count()}});
      announced = true;
    }
    if (Stopped(stop)) return false;
    SleepUnlessStopped(opts_.standby_poll, stop);
    if (Stopped(stop)) return false;
  }
}

Status LakeWriter::CheckLease() {
  if (opts_.bypass_lease) return Status::Ok();
  if (!lease_held_) return Status(Code::kAborted, "the lake writer lease is not held", "lease-lost");
  // Our session answering proves its advisory lock is still held; the epoch proves nobody took
  // the lease over in between (only possible if the lock was released).
  OML_ASSIGN_OR_RETURN(db::Rows r, conn_->Query("SELECT lease_epoch FROM oml.lake_frontier WHERE stream = $1",
                                                {db::Text(stream_.name)}));
  if (r.size() != 1 || r.GetInt(0, 0) != epoch_) {
    SetLeaseHeld(false);
    return Status(Code::kAborted, "the lake writer lease was taken over (epoch " + std::to_string(epoch_) + ")",
                  "lease-lost");
  }
  return Status::Ok();
}

Status LakeWriter::AdvanceFrontier(int64_t batch_end, const std::vector<std::string>& committed) {
  // greatest(): a frontier never moves back (the guard trigger would refuse it), and a writer
  // that finds it already further (a concurrent writer, tests only) leaves it there. In the same
  // statement, each table this batch committed to records batch_end as what it must hold
  // (sql/0018: Recover refills a table whose Delta txn is found below it).
  const std::string fence = opts_.bypass_lease ? "" : " AND lease_epoch = $4";
  std::vector<db::Param> params = {db::Text(stream_.name), db::Int(batch_end), db::TextArray(committed)};
  if (!opts_.bypass_lease) params.push_back(db::Int(epoch_));
  Result<db::Rows> r = conn_->Query(
      "WITH f AS (UPDATE oml.lake_frontier SET frontier_seq = greatest(frontier_seq, $2), updated_at = now() "
      "           WHERE stream = $1" + fence + " RETURNING frontier_seq), "
      "t AS (INSERT INTO oml.lake_table_txn (stream, table_name, txn_version) "
      "      SELECT $1, u, $2 FROM f, unnest($3::text[]) u "
      "      ON CONFLICT (stream, table_name) DO UPDATE "
      "      SET txn_version = greatest(lake_table_txn.txn_version, excluded.txn_version), updated_at = now()) "
      "SELECT frontier_seq FROM f",
      params);
  if (!r.ok()) return r.status();
  if (r->size() != 1) {
    SetLeaseHeld(false);
    return Status(Code::kAborted, "the lake writer lease was taken over before the frontier advance", "lease-lost");
  }
  frontier_ = r->GetInt(0, 0);
  for (const auto& t : committed) recorded_txn_[t] = std::max(recorded_txn_[t], batch_end);
  return Status::Ok();
}

bool LakeWriter::GoldMayTrail() const {
  return gold_may_trail_ && !refilling_ && opts_.gold_every.count() > 0;
}

bool LakeWriter::GoldDue() const {
  return gold_pending_ && !gold_pending_->counts.empty() && Clock::now() - gold_pending_->since >= opts_.gold_every;
}

Status LakeWriter::FlushGold() {
  if (!gold_pending_) return Status::Ok();
  GoldPending pending = std::move(*gold_pending_);
  gold_pending_.reset();  // on any failure below, the caller's error leads to Recover, which refills gold
  if (pending.counts.empty()) return Status::Ok();
  const auto t0 = Clock::now();
  const TargetTable* gold = nullptr;
  for (const auto& t : TargetTables())
    if (t.derived) gold = &t;
  if (gold == nullptr) return Status(Code::kInternal, "no derived lake table");
  OML_ASSIGN_OR_RETURN(DeltaTable * table, Table(gold->name));
  // The txn the counts sit on must still be gold's (only this writer commits to it).
  OML_ASSIGN_OR_RETURN(int64_t at, table->SnapshotVersion());
  auto& cached = txn_cache_[gold->name];
  if (cached.table_version != at || cached.table_version < 0) {
    OML_ASSIGN_OR_RETURN(at, table->Refresh());
    OML_ASSIGN_OR_RETURN(LastTxn last, table->ReadLastTxn(app_id_));
    cached = KnownTxn{at, last.version};
  }
  if (cached.txn != pending.above || pending.through != frontier_) {
    return Status(Code::kAborted,
                  "gold's kept counts (" + std::to_string(pending.above) + ", " + std::to_string(pending.through) +
                      "] no longer lead to the frontier (gold txn " + std::to_string(cached.txn) + ", frontier " +
                      std::to_string(frontier_) + "): recovery refills gold",
                  "lake-gold-moved");
  }
  OML_RETURN_IF_ERROR(CheckLease());
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("lakewriter.gold_flush.before_commit"));
  TxnCommit txn{app_id_, pending.through,
                {{"oml.batch_start", pending.through}, {"oml.batch_end", pending.through},
                 {"oml.stream", stream_.name}, {"oml.gold_trailed_from", pending.above}}};
  const std::string rows = DailyActivityJson(pending.counts);
  // A commit without this stream's txn that landed first (an operator's OPTIMIZE of gold) is
  // merged over again on a fresh snapshot, as the batch path does; one that moved the txn is
  // another writer (the error goes to recovery).
  Result<int64_t> merged = table->Merge(rows, gold->merge, txn);
  for (int attempt = 1; !merged.ok() && IsConflict(merged.status()) && attempt < kMaxCommitAttempts; ++attempt) {
    OML_ASSIGN_OR_RETURN(const int64_t at_now, table->Refresh());
    OML_ASSIGN_OR_RETURN(LastTxn now, table->ReadLastTxn(app_id_));
    txn_cache_[gold->name] = KnownTxn{at_now, now.version};
    if (now.version != pending.above) break;
    ++stats_.retried_commits;
    Metrics::Get().LakeRetry("rebase");
    log::Info("lake writer: a commit without this stream's txn landed first; committing again",
              {{"stream", stream_.name}, {"table", gold->name}, {"batch_end", pending.through}, {"attempt", attempt}});
    merged = table->Merge(rows, gold->merge, txn);
  }
  OML_ASSIGN_OR_RETURN(const int64_t version, std::move(merged));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  txn_cache_[gold->name] = KnownTxn{version, pending.through};
  SawTxn(gold->name, pending.through);
  const auto n = static_cast<int64_t>(pending.counts.size());
  Metrics::Get().LakeCommit(gold->name, n, secs);
  ++stats_.commits;
  ++stats_.gold_flushes;
  stats_.rows += n;
  stats_.rows_by_table[gold->name] += n;
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("lakewriter.gold_flush.after_commit"));
  // Recorded like a batch's commit (sql/0018); the frontier stays where it is.
  OML_RETURN_IF_ERROR(AdvanceFrontier(pending.through, {gold->name}));
  log::Info("lake writer: gold brought to the frontier",
            {{"stream", stream_.name}, {"table", gold->name}, {"version", version}, {"from", pending.above},
             {"through", pending.through}, {"rows", n},
             {"ms", std::chrono::duration<double, std::milli>(Clock::now() - t0).count()}});
  MaybeCompact(gold->name);
  return Status::Ok();
}

Status LakeWriter::ApplyBatch(const Batch& b) {
  // Rows dead-lettered earlier (by this writer or a previous one) are not part of any batch.
  OML_ASSIGN_OR_RETURN(DeadLetters dead, DeadLetteredSeqs(*conn_, stream_.name, b.start, b.end));
  for (;;) {
    std::optional<Poison> poison;
    OML_RETURN_IF_ERROR(ApplyParts(b, dead, &poison));
    if (!poison) return Status::Ok();
    std::vector<std::string> applied;
    OML_ASSIGN_OR_RETURN(bool moved, HandlePoison(*poison, &applied));
    if (!moved) {
      return Status(Code::kAborted, "outbox seq " + std::to_string(poison->row->seq) + " refused (attempt " +
                                        std::to_string(refusals_[poison->row->seq]) + " of " +
                                        std::to_string(opts_.dead_letter_after) + "): " + poison->error,
                    kRowRefused);
    }
    dead[poison->row->seq] = std::move(applied);  // and apply the batch again without it
  }
}

Result<bool> LakeWriter::HandlePoison(const Poison& p, std::vector<std::string>* applied) {
  const int attempts = ++refusals_[p.row->seq];
  ++stats_.refused_rows;
  log::Warn("lake writer: a row is refused", {{"stream", stream_.name}, {"outbox_seq", p.row->seq},
                                             {"target_table", p.row->target_table}, {"attempt", attempts},
                                             {"budget", opts_.dead_letter_after}, {"error", p.error}});
  if (attempts < opts_.dead_letter_after) return false;
  // The key in use: the one re-read from the key file after a rotation, else the one given.
  // A re-read key is held in a local first and replaces reloaded_key_ only at the end, so the
  // key being signed with is never destroyed under it.
  auto read_key_file = [&]() -> std::unique_ptr<crypto::SigningKey> {
    if (opts_.signing_key_file.empty()) return nullptr;
    auto k = crypto::SigningKey::LoadFile(opts_.signing_key_file, opts_.allow_insecure_key_files);
    if (!k.ok()) {
      log::Warn("lake writer: cannot re-read the signing key", {{"file", opts_.signing_key_file},
                                                               {"error", k.status().ToString()}});
      return nullptr;
    }
    return std::make_unique<crypto::SigningKey>(std::move(k).value());
  };
  std::unique_ptr<crypto::SigningKey> fresh;
  const crypto::SigningKey* key = reloaded_key_ ? reloaded_key_.get() : opts_.signing_key;
  if (key == nullptr) {  // the key file may have appeared since the start
    fresh = read_key_file();
    key = fresh.get();
  }
  if (key == nullptr) {
    log::Error("lake writer: a poison row cannot be dead-lettered without a signing key; the stream waits",
               {{"stream", stream_.name}, {"outbox_seq", p.row->seq}});
    return false;
  }
  if (opts_.bypass_lease) return FailedPrecondition("dead letters need the lease", "lease-bypassed");
  OML_RETURN_IF_ERROR(CheckLease());
  OML_ASSIGN_OR_RETURN(*applied, TablesHolding(*p.row));
  auto signed_dl = DeadLetterRow(*conn_, *key, stream_.name, epoch_, *p.row, p.error, attempts, *applied);
  if (!signed_dl.ok() && signed_dl.status().type() == "signing-key-not-in-force") {
    // Rotated since this key was read (`oml key rotate` installs the new key in the key file).
    std::unique_ptr<crypto::SigningKey> rotated = read_key_file();
    if (rotated != nullptr && rotated->key_id() != key->key_id()) {
      log::Info("lake writer: signing key re-read after a rotation",
                {{"stream", stream_.name}, {"old_key_id", key->key_id()}, {"key_id", rotated->key_id()}});
      signed_dl = DeadLetterRow(*conn_, *rotated, stream_.name, epoch_, *p.row, p.error, attempts, *applied);
      fresh = std::move(rotated);
    }
  }
  if (fresh) reloaded_key_ = std::move(fresh);  // `key` is not used after this
  OML_ASSIGN_OR_RETURN(DeadLetterResult dl, std::move(signed_dl));
  refusals_.erase(p.row->seq);
  ++stats_.dead_letters;
  Metrics::Get().LakeDeadLetter();
  log::Warn("lake writer: row dead-lettered",
            {{"stream", stream_.name}, {"outbox_seq", p.row->seq}, {"dead_letter_id", dl.id},
             {"tenant", dl.receipt.tenant}, {"skipped_seq", dl.receipt.seq}, {"attempts", attempts}});
  return true;
}

Result<std::vector<std::string>> LakeWriter::TablesHolding(const OutboxRow& row) {
  std::vector<std::string> out = row.skip_tables;  // a requeued row: those hold it already
  for (const auto& t : TargetTables()) {
    const bool feeds = t.derived ? row.target_table == kBronze : row.target_table == t.name;
    if (!feeds || row.Skips(t.name)) continue;
    // Read now, not from txn_cache_: the poison may have been found before this table was reached.
    OML_ASSIGN_OR_RETURN(DeltaTable * table, Table(t.name));
    OML_ASSIGN_OR_RETURN(const int64_t at, table->Refresh());
    OML_ASSIGN_OR_RETURN(LastTxn last, table->ReadLastTxn(app_id_));
    txn_cache_[t.name] = KnownTxn{at, last.version};
    if (last.version >= MustHold(t.name)) SawTxn(t.name, last.version);
    if (last.version >= row.seq) out.push_back(t.name);
  }
  return out;
}

// One table's part of a batch through steps 5 and 6 (ApplyParts).
struct LakeWriter::Part {
  const TargetTable* target = nullptr;
  DeltaTable* table = nullptr;
  std::vector<const OutboxRow*> source;  // its rows: dead-lettered and requeue-skipped ones left out
  int attempt = 1;
  // Made by the check and conversion of this attempt:
  int64_t n = 0;                         // rows to commit
  std::string jsonl;                     // MERGE tables (silver, gold) and JSON appends
  std::optional<ArrowBatch> arrow;       // an append's rows (bronze): no JSON on the adapter's side
  std::vector<const OutboxRow*> lines;   // the outbox row of each JSON line (not for derived)
  // gold in service mode (GoldMayTrail): this batch's counts, kept for a later commit.
  std::optional<DailyActivityCounts> trailed;
  // Made by the commit (on a thread of commit_pool_ or the writer's):
  std::optional<Result<int64_t>> version;
  double secs = 0;
};

void LakeWriter::CommitPart(const Batch& b, Part* p) {
  const TargetTable& target = *p->target;
  const auto c0 = Clock::now();
  // On the committing thread: tests fail one table's commit while the others of the round land.
  if (Status st = OML_SYNC_POINT(("lakewriter.commit." + target.name).c_str()); !st.ok()) {
    p->version = std::move(st);
    return;
  }
  TxnCommit txn{app_id_, b.end,
                {{"oml.batch_start", b.start}, {"oml.batch_end", b.end}, {"oml.stream", stream_.name}}};
  p->version = target.write == TableWrite::kMerge ? p->table->Merge(p->jsonl, target.merge, txn)
               : p->arrow                          ? p->table->AppendBatch(&*p->arrow, txn)
                                                   : p->table->Append(p->jsonl, txn);
  p->secs = std::chrono::duration<double>(Clock::now() - c0).count();
}

Status LakeWriter::ApplyParts(const Batch& b, const DeadLetters& dead, std::optional<Poison>* poison) {
  const auto t0 = Clock::now();
  // Where the batch's time went, for the log line: snapshot refreshes, txn checks, row
  // conversion (and gold's counts), lease checks, Delta commits, the frontier advance.
  double refresh_ms = 0, check_ms = 0, convert_ms = 0, lease_ms = 0, commit_ms = 0, advance_ms = 0;
  auto lap = Clock::now();
  // Group (step 4): each table's rows keep the batch's seq order. Derived tables (gold) are fed
  // from the bronze rows.
  std::map<std::string, std::vector<const OutboxRow*>> by_table;
  int64_t live_rows = 0;
  for (const auto& row : b.rows) {
    // A dead-lettered row stays only in the tables that held it (none: it is left out).
    if (auto d = dead.find(row.seq); d != dead.end() && d->second.empty()) continue;
    ++live_rows;
    if (FindOutboxTarget(row.target_table) == nullptr) {
      *poison = Poison{&row, "unknown-target-table: outbox seq " + std::to_string(row.seq) +
                                 " targets unknown lake table '" + row.target_table + "'"};
      return Status::Ok();
    }
    by_table[row.target_table].push_back(&row);
  }
  std::vector<Part> parts;
  parts.reserve(TargetTables().size());
  for (const auto& target : TargetTables()) {
    const auto& all = by_table[target.derived ? std::string(kBronze) : target.name];
    // A requeued row is not applied to the tables that already hold it, nor a dead-lettered row
    // to the tables that did not (sql/0019).
    auto skipped_here = [&](const OutboxRow* r) {
      if (r->Skips(target.name)) return true;
      auto d = dead.find(r->seq);
      return d != dead.end() && std::find(d->second.begin(), d->second.end(), target.name) == d->second.end();
    };
    Part part;
    for (const OutboxRow* r : all)
      if (!skipped_here(r)) part.source.push_back(r);
    if (part.source.empty()) continue;
    part.target = &target;
    OML_ASSIGN_OR_RETURN(part.table, Table(target.name));
    parts.push_back(std::move(part));
  }
  nlohmann::json committed = nlohmann::json::array(), skipped = nlohmann::json::array();
  int64_t rows_written = 0;
  // Rounds of check (step 5) and commit (step 6). A round checks and converts each table not
  // yet done, in registry order, on this thread; then commits them all at once, one per thread
  // (the tables are independent Delta logs, and a batch's commits are most of its time), and
  // goes through the results in registry order. A commit lost to one that carries no txn of this
  // appId (a compaction off the batch path, lake/compactor.h; another stream's rows) goes to the
  // next round, checked and committed again on the new snapshot; one lost to a commit that moved
  // this appId's txn (another writer of this stream) fails the batch, which recovery then
  // finishes. The tables of a batch thus land in any order (some may have landed when the batch
  // fails): recovery finishes whichever are behind (step 2).
  std::vector<Part*> round;
  for (Part& part : parts) round.push_back(&part);
  while (!round.empty()) {
    std::vector<Part*> ready;
    for (Part* p : round) {
      const TargetTable& target = *p->target;
      DeltaTable* table = p->table;
      // The snapshot the check reads: the handle's own while txn_cache_ knows this stream's txn
      // at its version (this writer's newest commit, or the txn read after a lost commit): no
      // listing or replay of the log. Else refreshed and read. A commit that landed since makes
      // the conditional commit lose, and the check is then made again.
      LastTxn last;
      OML_ASSIGN_OR_RETURN(int64_t at, table->SnapshotVersion());
      auto& cached = txn_cache_[target.name];  // {-1, -1} when new: never a snapshot version
      if (cached.table_version != at || cached.table_version < 0) {
        OML_ASSIGN_OR_RETURN(at, table->Refresh());
        refresh_ms += Lap(&lap);
        OML_ASSIGN_OR_RETURN(last, table->ReadLastTxn(app_id_));
        cached = KnownTxn{at, last.version};
      }
      last.version = cached.txn;
      check_ms += Lap(&lap);
      if (b.end <= last.version) {
        ++stats_.skipped_tables;
        skipped.push_back(target.name);
        continue;
      }
      // A table that lost commits (its txn below what it recorded, sql/0018) must be refilled
      // first: committing this batch over the hole would make it permanent.
      // (Not during a refill: that is what refills it, in order.)
      if (!refilling_ && std::max<int64_t>(last.version, 0) < b.start &&
          std::max<int64_t>(last.version, 0) < MustHold(target.name)) {
        return Status(Code::kAborted,
                      target.name + " is behind what it committed (txn " + std::to_string(last.version) +
                          ", it held " + std::to_string(MustHold(target.name)) + "): recovery refills it",
                      "lake-table-behind");
      }
      // Rows at or below the table's txn version are in it already (every commit covers its
      // whole range); only a rebuilt batch after a concurrent writer can start below it.
      p->n = 0;
      p->jsonl.clear();
      p->arrow.reset();
      p->lines.clear();
      if (target.write == TableWrite::kAppend && !target.derived) {
        OML_ASSIGN_OR_RETURN(std::vector<ArrowColumnSpec> columns, LakeTableColumns(target.name));
        p->arrow.emplace(std::move(columns));
        p->arrow->ReserveRows(static_cast<int64_t>(p->source.size()));
        for (const OutboxRow* row : p->source) {
          if (row->seq <= last.version) continue;
          if (Status st = AppendDeltaRow(*row, &*p->arrow); !st.ok()) {
            if (st.code() != Code::kInvalidArgument) return st;
            *poison = Poison{row, st.message()};
            break;
          }
          ++p->n;
        }
      } else if (target.derived) {
        // This batch's counts (rows above gold's txn). In service mode they are kept, added after
        // the frontier advance to those of the batches gold trails, which must lead here.
        const bool trail = GoldMayTrail();
        if (gold_pending_ && !gold_pending_->counts.empty() &&
            (!trail || gold_pending_->above != last.version || gold_pending_->through != b.start)) {
          return Status(Code::kAborted,
                        "gold's kept counts (" + std::to_string(gold_pending_->above) + ", " +
                            std::to_string(gold_pending_->through) + "] do not lead to this batch (gold txn " +
                            std::to_string(last.version) + ", batch start " + std::to_string(b.start) +
                            "): recovery refills gold",
                        "lake-gold-moved");
        }
        DailyActivityCounts counts;
        p->trailed.reset();
        int64_t bad = 0;
        if (Status st = CountDailyActivity(p->source, last.version, &counts, &bad); !st.ok()) {
          for (const OutboxRow* r : p->source)
            if (r->seq == bad) *poison = Poison{r, st.message()};
          if (!*poison) return st;
        } else if (trail) {
          p->trailed = std::move(counts);  // n stays 0: not committed in this batch
        } else {
          p->jsonl = DailyActivityJson(counts);
          p->n = static_cast<int64_t>(counts.size());
        }
      } else {
        p->jsonl.reserve(RowBytesHint(p->source));
        for (const OutboxRow* row : p->source) {
          if (row->seq <= last.version) continue;
          auto line = ToDeltaRow(*row, target);
          if (!line.ok()) {
            *poison = Poison{row, line.status().message()};
            break;
          }
          p->jsonl += *line;
          p->lines.push_back(row);
          ++p->n;
        }
      }
      // A poison row stops the batch before its table's commit; the tables before it in the
      // registry are still committed (a dead letter names the tables that hold its row).
      if (*poison) break;
      convert_ms += Lap(&lap);
      if (p->n > 0) ready.push_back(p);
    }
    if (ready.empty()) break;
    OML_RETURN_IF_ERROR(CheckLease());
    lease_ms += Lap(&lap);
    for (Part* p : ready) OML_RETURN_IF_ERROR(OML_SYNC_POINT(("lakewriter.before_commit." + p->target->name).c_str()));
    // Commit (step 6): each table's rows, txn (appId, batch_end) and bounds in one conditional
    // commit; the first on this thread, the others on commit_pool_ (made here, by this thread,
    // so its threads start at this thread's nice value).
    if (ready.size() == 1) {
      CommitPart(b, ready[0]);
    } else {
      if (!commit_pool_) commit_pool_ = std::make_unique<WorkPool>(static_cast<int>(TargetTables().size()) - 1);
      WorkPool::Group group(*commit_pool_);
      for (size_t i = 1; i < ready.size(); ++i) group.Add([this, &b, p = ready[i]] { CommitPart(b, p); });
      CommitPart(b, ready[0]);
      group.Wait();
    }
    commit_ms += Lap(&lap);
    // The results, in registry order. Every landed commit is recorded first, then the
    // after_commit points are reached. Then the failures, in this order: a commit lost to
    // another writer of this stream (its txn moved: recovery at once), any other error, the
    // first MERGE refusal in registry order as the poison (over one found converting a later
    // table), and last the commits lost to a commit without this stream's txn, which are
    // checked and committed again in the next round.
    std::vector<Part*> landed, lost;
    std::optional<Status> failed;
    std::optional<Poison> refused;
    for (Part* p : ready) {
      const TargetTable& target = *p->target;
      const Result<int64_t>& version = *p->version;
      if (version.ok()) {
        txn_cache_[target.name] = KnownTxn{*version, b.end};
        SawTxn(target.name, b.end);
        Metrics::Get().LakeCommit(target.name, p->n, p->secs);
        ++stats_.commits;
        stats_.rows += p->n;
        stats_.rows_by_table[target.name] += p->n;
        rows_written += p->n;
        committed.push_back({{"table", target.name}, {"version", *version}, {"rows", p->n}, {"ms", p->secs * 1000.0}});
        landed.push_back(p);
        continue;
      }
      if (IsConflict(version.status())) {
        ++stats_.conflicts;
        lost.push_back(p);
        continue;
      }
      // Rows that do not fit the table: find the first one; it is the poison (nothing of this
      // table committed). (An Arrow batch's rows were each checked by AppendDeltaRow: a refusal
      // there is the table's schema, not a row.)
      if (version.status().code() == Code::kInvalidArgument && !target.derived && !p->arrow) {
        auto check = p->table->CheckRows(p->jsonl);
        if (check.ok() && check->bad_line >= 0 && check->bad_line < static_cast<int64_t>(p->lines.size())) {
          if (!refused) refused = Poison{p->lines[check->bad_line], check->error};
          continue;
        }
      }
      if (!failed) failed = version.status();
    }
    for (Part* p : landed) OML_RETURN_IF_ERROR(OML_SYNC_POINT(("lakewriter.after_commit." + p->target->name).c_str()));
    // Each lost table's txn, read again (the next check reads against it). If it moved, the
    // winner was another writer of this stream.
    std::optional<Status> fenced;
    for (Part* p : lost) {
      const TargetTable& target = *p->target;
      OML_ASSIGN_OR_RETURN(const int64_t at_now, p->table->Refresh());
      OML_ASSIGN_OR_RETURN(LastTxn now, p->table->ReadLastTxn(app_id_));
      const int64_t before = txn_cache_[target.name].txn;
      txn_cache_[target.name] = KnownTxn{at_now, now.version};
      if (!fenced && (now.version != before || p->attempt >= kMaxCommitAttempts)) fenced = p->version->status();
    }
    if (fenced) return *fenced;
    if (failed) return *failed;
    if (refused) *poison = std::move(refused);
    if (*poison) return Status::Ok();
    std::vector<Part*> again;
    for (Part* p : lost) {
      ++p->attempt;
      ++stats_.retried_commits;
      Metrics::Get().LakeRetry("rebase");
      log::Info("lake writer: a commit without this stream's txn landed first; committing again",
                {{"stream", stream_.name}, {"table", p->target->name}, {"batch_end", b.end}, {"attempt", p->attempt - 1}});
      again.push_back(p);
    }
    round = std::move(again);
  }
  if (*poison) return Status::Ok();
  // Advance (step 7): every touched table holds the batch now.
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("lakewriter.before_frontier_advance"));
  lap = Clock::now();
  // What each table holds now (sql/0018): the tables this attempt committed to, and those it
  // skipped because their txn already covers the batch (an earlier attempt committed to them
  // before a poison row stopped it, or a writer before a crash).
  std::vector<std::string> committed_names;
  for (const auto& c : committed) committed_names.push_back(c["table"].get<std::string>());
  for (const auto& name : skipped) committed_names.push_back(name.get<std::string>());
  OML_RETURN_IF_ERROR(AdvanceFrontier(b.end, committed_names));
  advance_ms = Lap(&lap);
  // gold's kept counts follow the frontier: a batch without a gold part leaves them valid up to
  // its end (it had no bronze row gold lacks); one that left gold's part for later adds its
  // counts to them.
  nlohmann::json trailed = nlohmann::json::array();
  if (gold_pending_) gold_pending_->through = b.end;
  for (Part& part : parts) {
    if (!part.target->derived || !part.trailed) continue;
    if (!gold_pending_ || gold_pending_->counts.empty()) {
      gold_pending_ = GoldPending{{}, txn_cache_[part.target->name].txn, b.end, Clock::now()};
    }
    for (auto& [key, c] : *part.trailed) {
      DailyActivityCount& into = gold_pending_->counts[key];
      into.events += c.events;
      into.last_outbox_seq = std::max(into.last_outbox_seq, c.last_outbox_seq);
    }
    ++stats_.gold_trailed;
    trailed.push_back({{"table", part.target->name}, {"from", gold_pending_->above},
                       {"keys", static_cast<int64_t>(gold_pending_->counts.size())}});
  }
  ++stats_.batches;
  Metrics::Get().LakeBatch(live_rows, std::chrono::duration<double>(Clock::now() - t0).count());
  log::Info("lake writer: batch applied",
            {{"stream", stream_.name}, {"batch_start", b.start}, {"batch_end", b.end},
             {"rows", live_rows}, {"dead_lettered", static_cast<int64_t>(dead.size())},
             {"rows_written", rows_written}, {"committed", committed},
             {"skipped", skipped}, {"trailed", trailed}, {"frontier", frontier_},
             {"phases_ms", {{"refresh", refresh_ms}, {"check", check_ms}, {"convert", convert_ms}, {"lease", lease_ms},
                            {"commit", commit_ms}, {"advance", advance_ms}}},
             {"ms", std::chrono::duration<double, std::milli>(Clock::now() - t0).count()}});
  for (const auto& c : committed) MaybeCompact(c["table"].get<std::string>());
  return Status::Ok();
}

uint64_t LakeWriter::CompactorSmallTarget() const {
  return std::min(opts_.compact_target_bytes, std::max<uint64_t>(opts_.compact_target_bytes / 8, uint64_t{1} << 20));
}

void LakeWriter::MaybeCompact(const std::string& name) {
  if (opts_.compact_every <= 0) return;
  const TargetTable* target = nullptr;
  for (const auto& t : TargetTables())
    if (t.name == name) target = &t;
  const bool append_only = target != nullptr && target->write == TableWrite::kAppend && !target->derived;
  // The files a compaction would bin-pack: bronze's small tier (Compactor::Options), the whole
  // target for the MERGE tables.
  const uint64_t small_bytes = append_only ? CompactorSmallTarget() : opts_.compact_target_bytes;
  auto seen = commits_since_compaction_.find(name);
  if (seen == commits_since_compaction_.end()) {
    // This process's first commit to the table: the count starts from the table's snapshot (its
    // files below the compaction's target), not from zero, so that the small files a killed
    // predecessor left count towards compact_every. Otherwise a writer restarted more often than
    // compact_every commits never compacts (bench/soak: one file per batch).
    int pending = 1;
    if (auto table = Table(name); table.ok()) {
      if (auto files = (*table)->SnapshotFiles(); files.ok()) {
        pending = static_cast<int>(std::count_if(files->begin(), files->end(), [&](const DataFile& f) {
          return static_cast<uint64_t>(f.size) < small_bytes;
        }));
      }
    }
    seen = commits_since_compaction_.emplace(name, std::max(pending, 1)).first;
  } else {
    ++seen->second;
  }
  if (seen->second < opts_.compact_every) return;
  seen->second = 0;
  // Only the lease holder compacts (a writer with the lease bypassed, tests only, never does):
  // two processes' compactions of one table would race for the same files.
  if (!lease_held_) {
    if (!warned_no_lease_compaction_)
      log::Warn("lake writer: compaction off, this process does not hold the lease",
                {{"stream", stream_.name}, {"table", name}});
    warned_no_lease_compaction_ = true;
    return;
  }
  if (append_only) {
    // An append-only table (bronze) grows with every event: its compaction can take seconds, so
    // it runs on the compactor's thread, and an OPTIMIZE there never conflicts with an append.
    if (!compactor_) {
      compactor_ = std::make_unique<Compactor>(Compactor::Options{
          opts_.lake_root, stream_.name, opts_.compact_target_bytes, CompactorSmallTarget(), /*large_every=*/8,
          [lease = compaction_lease_] { return lease->Check(); }});
    }
    compactor_->Request(name);  // never waits for a compaction
    return;
  }
  // A MERGE table (silver, gold) is compacted here, between batches: each batch's MERGE rewrites
  // the files holding its keys, so an OPTIMIZE beside it would keep losing to it, and these
  // tables hold a row per key, not per event. It plans from the latest version (an operator may
  // have compacted the table since this writer's commit), and the adapter refuses it if another
  // rewrite of its files still lands first ("lake-rewrite-stale": nothing committed).
  auto table = Table(name);
  if (!table.ok()) return;
  const auto t0 = Clock::now();
  auto refreshed = (*table)->Refresh();
  Status ready = refreshed.ok() ? OML_SYNC_POINT(("lakewriter.compaction.after_snapshot." + name).c_str())
                                : refreshed.status();
  auto done = ready.ok() ? (*table)->Optimize(opts_.compact_target_bytes) : Result<std::pair<int64_t, int64_t>>(ready);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!done.ok() && done.status().code() == Code::kAborted && done.status().type() == "lake-rewrite-stale") {
    ++stats_.refused_compactions;
    Metrics::Get().LakeCompaction(name, "refused", secs);
    log::Warn("lake writer: compaction refused, a newer commit rewrote files it read; retried after the next commits",
              {{"stream", stream_.name}, {"table", name}, {"error", done.status().ToString()}});
    return;
  }
  if (!done.ok()) {
    Metrics::Get().LakeCompaction(name, "failed", secs);
    log::Warn("lake writer: compaction failed; retried after the next commits",
              {{"stream", stream_.name}, {"table", name}, {"error", done.status().ToString()}});
    return;
  }
  Metrics::Get().LakeCompaction(name, done->first > 0 ? "compacted" : "nothing", secs);
  if (done->first > 0) ++stats_.compactions;
  log::Info("lake writer: table compacted",
            {{"stream", stream_.name}, {"table", name}, {"files_removed", done->first}, {"files_added", done->second},
             {"ms", secs * 1000.0}});
}

LakeWriterStats LakeWriter::stats() const {
  LakeWriterStats s = stats_;
  if (compactor_) {
    const Compactor::Stats c = compactor_->stats();
    s.compactions += c.compactions;
    s.refused_compactions += c.refused;
    s.compactions_without_lease += c.no_lease;
  }
  return s;
}

Status LakeWriter::CheckTables() {
  for (const auto& target : TargetTables()) {
    OML_ASSIGN_OR_RETURN(DeltaTable * table, Table(target.name));
    OML_ASSIGN_OR_RETURN(const int64_t now, table->Refresh());
    // The txn is read whenever the version moved since the last check (another path may have
    // refreshed the snapshot meanwhile: the snapshot's own version says nothing).
    auto checked = checked_version_.find(target.name);
    if (checked != checked_version_.end() && checked->second == now) continue;
    checked_version_[target.name] = now;
    OML_ASSIGN_OR_RETURN(LastTxn last, table->ReadLastTxn(app_id_));
    txn_cache_[target.name] = KnownTxn{now, last.version};
    const int64_t held = MustHold(target.name);
    if (std::max<int64_t>(last.version, 0) < held) {
      return Status(Code::kAborted,
                    target.name + " moved back to txn " + std::to_string(last.version) + " (it held " +
                        std::to_string(held) + "; emptied by `oml lake rebuild`, or replaced): recovery refills it",
                    "lake-table-behind");
    }
    SawTxn(target.name, last.version);
  }
  return Status::Ok();
}

Result<DeltaTable*> LakeWriter::RecoverTable(const std::string& name) {
  auto refreshed = [&]() -> Result<DeltaTable*> {
    OML_ASSIGN_OR_RETURN(DeltaTable * table, Table(name));
    OML_RETURN_IF_ERROR(table->Refresh().status());
    return table;
  };
  auto table = refreshed();
  if (table.ok() || table.status().type() != "lake-commit-damaged") return table;
  // The newest commits are damaged (an OS crash before they were durable): move them out of the
  // log; the refill below then restores their rows (their batches are recorded in lake_table_txn).
  const std::string uri = TableUri(opts_.lake_root, name);
  OML_ASSIGN_OR_RETURN(SetAside aside, SetAsideDamagedHead(uri));
  log::Error("lake writer: damaged commits set aside (moved to _oml_damaged/); the table is refilled",
             {{"stream", stream_.name}, {"table", name}, {"commits", aside.count},
              {"from_version", aside.lowest_version}, {"error", table.status().message()}});
  Metrics::Get().LakeRetry("damaged-commit");
  tables_.erase(name);
  txn_cache_.erase(name);
  return refreshed();
}

Result<int64_t> LakeWriter::Recover() {
  // Counts kept in memory are not trusted past an error: gold's part is made again below from
  // the outbox (a gold txn below the frontier is refilled), and Loop lets gold trail again.
  gold_pending_.reset();
  gold_may_trail_ = false;
  OML_RETURN_IF_ERROR(EnsureConnected());
  OML_ASSIGN_OR_RETURN(int64_t f, ReadFrontier(*conn_, stream_));
  frontier_ = f;
  // What each table committed (sql/0018), to find the tables that lost commits.
  OML_ASSIGN_OR_RETURN(db::Rows rec, conn_->Query("SELECT table_name, txn_version FROM oml.lake_table_txn "
                                                   "WHERE stream = $1", {db::Text(stream_.name)}));
  recorded_txn_.clear();
  for (int i = 0; i < rec.size(); ++i) recorded_txn_[rec.Get(i, 0)] = rec.GetInt(i, 1);
  // The newest txn version of any target table, and the bounds its commit recorded; and the
  // lowest point a table that lost commits must be refilled from.
  int64_t end = -1;
  std::string lead;
  std::optional<nlohmann::json> lead_meta;
  std::optional<int64_t> refill_from;
  std::vector<std::string> behind;
  OML_ASSIGN_OR_RETURN(const PruneMarks marks, ReadPruneMarks(*conn_, stream_.name));
  if (frontier_ < marks.pruned_through) {
    // Only an owner who disabled lake_frontier_guard can move a frontier back: a lake rebuilt from
    // scratch that way would silently miss the pruned rows. `oml lake rebuild` re-derives them.
    return Status(Code::kFailedPrecondition,
                  "the frontier of stream " + stream_.name + " (" + std::to_string(frontier_) +
                      ") is below what was pruned from the outbox (" + std::to_string(marks.pruned_through) +
                      "): put it back, and rebuild tables with `oml lake rebuild --table T`",
                  "frontier-below-pruned");
  }
  for (const auto& target : TargetTables()) {
    OML_ASSIGN_OR_RETURN(DeltaTable * table, RecoverTable(target.name));
    OML_ASSIGN_OR_RETURN(LastTxn last, table->ReadLastTxn(app_id_));
    OML_ASSIGN_OR_RETURN(const int64_t at, table->SnapshotVersion());
    txn_cache_[target.name] = KnownTxn{at, last.version};
    checked_version_[target.name] = at;
    if (last.version > end) {
      end = last.version;
      lead = target.name;
      lead_meta = last.metadata;
    }
    const int64_t recorded = MustHold(target.name);
    const bool lost = std::max<int64_t>(last.version, 0) < recorded && last.version < frontier_;
    // A derived table (gold) below the frontier may have trailed it (LakeWriterOptions::gold_every)
    // when the last writer stopped: the counts it kept died with it. Its rows are made again from
    // the outbox above its txn (a range without bronze rows commits nothing).
    const bool trailed = !lost && target.derived && std::max<int64_t>(last.version, 0) < frontier_;
    if (lost || trailed) {
      if (lost) behind.push_back(target.name);
      int64_t from = std::max<int64_t>(last.version, 0);
      if (lost) {
        log::Warn("lake writer: a table is behind what it committed (lost commits, or replaced by an empty table); "
                  "refilling it from the outbox",
                  {{"stream", stream_.name}, {"table", target.name}, {"txn_version", last.version},
                   {"recorded_txn_version", recorded}, {"frontier", frontier_}});
        Metrics::Get().LakeRetry("refill");
      } else {
        log::Info("lake writer: a derived table is below the frontier (it may have trailed it); refilling it from "
                  "the outbox",
                  {{"stream", stream_.name}, {"table", target.name}, {"txn_version", last.version},
                   {"frontier", frontier_}});
      }
      if (from < marks.pruned_through && trailed) {
        // A gold that lost no commits held every row up to the frontier whenever the outbox was
        // pruned (MaybePrune brings it there first): what it may lack lies above the mark. (Its
        // txn below the mark means only that the rows above it had nothing to count.)
        from = marks.pruned_through;
      } else if (from < marks.pruned_through) {
        // Rows it lacks were pruned from the outbox: they come from the journal, up to the
        // pruned mark; the outbox refill below goes on from there.
        OML_RETURN_IF_ERROR(RederiveTable(target, marks));
        from = marks.pruned_through;
      }
      refill_from = std::min(refill_from.value_or(from), from);
    }
  }
  behind_from_ = refill_from;
  auto lag_at = Clock::now();
  if (refill_from) OML_RETURN_IF_ERROR(PublishLag());  // /metrics shows the hole while it is refilled
  refilling_ = true;
  struct Done {
    bool* flag;
    ~Done() { *flag = false; }
  } done{&refilling_};
  // Refill first (before any batch is applied above the hole): (from, frontier] again, in
  // batches of max_rows, each committed only to the tables whose txn is below its end (the txn
  // check skips the others), so every row lands in each table exactly once.
  for (int64_t from = refill_from.value_or(frontier_); from < frontier_;) {
    OML_ASSIGN_OR_RETURN(Cut cut, CutBatch(*conn_, stream_, from, frontier_, opts_.max_rows));
    Batch b;
    b.start = from;
    b.end = cut.batch_end;
    b.rows = std::move(cut.rows);
    OML_RETURN_IF_ERROR(ApplyBatch(b));
    ++stats_.refilled_batches;
    from = b.end;
    if (behind_from_) behind_from_ = from;
    if (Clock::now() - lag_at >= std::chrono::seconds(1)) {
      OML_RETURN_IF_ERROR(PublishLag());
      lag_at = Clock::now();
    }
  }
  refilling_ = false;
  behind_from_.reset();
  // Each refilled table now holds every row up to the frontier. One whose own rows ended before
  // the last refill batch kept a txn below its record (a rebuild records the frontier; a lost
  // batch its end): record the txn it holds, so it is not found behind again.
  for (const auto& name : behind) {
    OML_ASSIGN_OR_RETURN(DeltaTable * table, Table(name));
    OML_ASSIGN_OR_RETURN(LastTxn last, table->ReadLastTxn(app_id_));
    const int64_t holds = std::max<int64_t>(last.version, 0);
    txn_seen_[name] = last.version;  // it holds every row up to the frontier: its txn is all it must
    if (holds >= RecordedTxn(name)) continue;
    OML_ASSIGN_OR_RETURN(db::Rows u, conn_->Query("UPDATE oml.lake_table_txn SET txn_version = $3, updated_at = now() "
                                                  "WHERE stream = $1 AND table_name = $2 AND txn_version = $4 "
                                                  "RETURNING 1",
                                                  {db::Text(stream_.name), db::Text(name), db::Int(holds),
                                                   db::Int(RecordedTxn(name))}));
    if (u.size() == 1) recorded_txn_[name] = holds;
    log::Info("lake writer: a refilled table holds every row up to the frontier; its record follows its txn",
              {{"stream", stream_.name}, {"table", name}, {"txn_version", last.version}, {"frontier", frontier_}});
  }
  if (end <= frontier_) return frontier_;
  // A table is ahead of the frontier: a batch committed to it, and the writer stopped before the
  // frontier advance. Rebuild that batch by seq range (never a new cut) and finish it. The
  // rebuilt batch is (frontier, end]: in a single-writer history that is exactly the recorded
  // bounds, since a batch is only cut from an advanced frontier.
  const int64_t recorded_start = MetaInt(lead_meta, "oml.batch_start", frontier_);
  if (recorded_start != frontier_) {
    log::Warn("lake writer: a table's recorded batch does not start at the frontier; rebuilding from the frontier",
              {{"stream", stream_.name}, {"table", lead}, {"recorded_start", recorded_start},
               {"batch_end", end}, {"frontier", frontier_}});
  }
  log::Info("lake writer: recovering a batch from the Delta log",
            {{"stream", stream_.name}, {"table", lead}, {"batch_start", frontier_}, {"batch_end", end},
             {"recorded_start", recorded_start}});
  Batch b;
  b.start = frontier_;
  b.end = end;
  OML_ASSIGN_OR_RETURN(b.rows, ReadRange(*conn_, stream_, frontier_, end));
  OML_RETURN_IF_ERROR(ApplyBatch(b));
  ++stats_.recovered_batches;
  return frontier_;
}

Status LakeWriter::PublishLag() {
  // Lag counts from the frontier, or from the txn of a table behind what it committed (its lost
  // rows are lag until the refill restored them; as `oml status` counts it).
  const int64_t from = std::min(frontier_, behind_from_.value_or(frontier_));
  // One index probe: the oldest row past that point, and the sequence's last value.
  OML_ASSIGN_OR_RETURN(
      db::Rows r, conn_->Query("SELECT coalesce(pg_sequence_last_value($2::regclass), 0), "
                               "(SELECT extract(epoch FROM now() - enqueued_at)::float8 FROM " + stream_.table +
                                   " WHERE seq > $1 ORDER BY seq LIMIT 1)",
                               {db::Int(from), db::Text(stream_.sequence)}));
  const int64_t last = r.GetInt(0, 0);
  const double age = r.IsNull(0, 1) ? 0.0 : std::stod(r.Get(0, 1));
  Metrics::Get().LakeLag(frontier_, std::max<int64_t>(0, last - from), std::max(0.0, age));
  return Status::Ok();
}

Status LakeWriter::EnsureReader() {
  if (reader_ && reader_->healthy()) return Status::Ok();
  reader_.reset();
  OML_ASSIGN_OR_RETURN(db::Conn c, db::Conn::Connect(opts_.database_url));
  reader_ = std::make_unique<db::Conn>(std::move(c));
  return Status::Ok();
}

// Cuts and applies batches (steps 3 to 7) until the frontier reaches `horizon` (a stable horizon)
// or *stop. While a batch is applied, the next one, (batch_end, next_end], is cut on the reader
// connection: the rows of a stable prefix never change, so a cut read before the frontier
// advance is the cut the advance would have read. It is used only if that batch is applied and
// the frontier is where the cut starts; after a failure it is dropped and recovery re-reads.
Status LakeWriter::DrainTo(int64_t horizon, const std::atomic<bool>* stop) {
  std::future<Result<Cut>> next;  // its destructor waits for the read: never outlives reader_
  auto lag_at = Clock::now();
  while (frontier_ < horizon && !Stopped(stop)) {
    Result<Cut> got = Cut{};
    auto cut_t0 = Clock::now();  // "ms" of the batch cut line: the read, or the wait for the prefetch
    bool prefetched = false;
    if (next.valid()) {
      got = next.get();
      if (got.ok() && got->frontier != frontier_) got = Status(Code::kInternal, "stale prefetched cut");
      if (got.ok()) {
        ++stats_.prefetched_cuts;
        prefetched = true;
      }
      if (!got.ok()) {
        log::Warn("lake writer: the prefetched cut is not used; cutting again",
                  {{"stream", stream_.name}, {"error", got.status().ToString()}});
        reader_.reset();
        got = CutBatch(*conn_, stream_, frontier_, horizon, opts_.max_rows);
      }
    } else {
      got = CutBatch(*conn_, stream_, frontier_, horizon, opts_.max_rows);
    }
    if (!got.ok()) return got.status();
    Cut cut = std::move(*got);
    log::Info("lake writer: batch cut", {{"stream", stream_.name}, {"batch_start", cut.frontier},
                                        {"batch_end", cut.batch_end}, {"rows", static_cast<int64_t>(cut.rows.size())},
                                        {"prefetched", prefetched}, {"ms", Lap(&cut_t0)}});
    OML_RETURN_IF_ERROR(OML_SYNC_POINT("lakewriter.after_cut"));
    if (cut.batch_end < horizon && opts_.prefetch && EnsureReader().ok()) {
      next = std::async(std::launch::async, [this, from = cut.batch_end, horizon] {
        return CutBatch(*reader_, stream_, from, horizon, opts_.max_rows);
      });
    }
    OML_RETURN_IF_ERROR(ApplyBatch(Batch{cut.frontier, cut.batch_end, std::move(cut.rows)}));
    // gold's kept counts, once the oldest is gold_every old, commit right after the batch's
    // frontier advance: the batch's own lag never waits for gold's MERGE, and at a steady rate
    // the commit falls in the wait before the next drain (min_batch_interval).
    if (GoldDue()) OML_RETURN_IF_ERROR(FlushGold());
    if (Clock::now() - lag_at >= std::chrono::seconds(1)) {
      OML_RETURN_IF_ERROR(PublishLag());
      lag_at = Clock::now();
    }
  }
  return Status::Ok();
}

Status LakeWriter::Loop(const std::atomic<bool>* stop, bool once) {
  if (once) {
    if (!once_target_) {
      OML_ASSIGN_OR_RETURN(int64_t h, StableHorizon(*conn_, stream_, frontier_, opts_.once_horizon_wait));
      if (h <= frontier_) {
        OML_ASSIGN_OR_RETURN(int64_t last, LastSeq(*conn_, stream_));
        if (last > frontier_)
          log::Warn("lake writer: no newer stable horizon within the wait (a transaction holds it back)",
                    {{"stream", stream_.name}, {"frontier", frontier_}, {"candidate", last},
                     {"waited_ms", opts_.once_horizon_wait.count()}});
      }
      once_target_ = h;
      log::Info("lake writer: draining to the stable horizon",
                {{"stream", stream_.name}, {"frontier", frontier_}, {"horizon", h}});
    }
    OML_RETURN_IF_ERROR(DrainTo(*once_target_, stop));
    if (!Stopped(stop)) OML_RETURN_IF_ERROR(MaybePrune(/*now=*/true));
    return Status::Ok();
  }
  gold_may_trail_ = opts_.gold_every.count() > 0;
  // The horizon rule of outbox_cut.h, polled without blocking; an idle writer takes no xid.
  HorizonTracker tracker(stream_, frontier_);
  auto lag_at = Clock::now() - std::chrono::seconds(1);
  auto checked_at = Clock::now();
  std::optional<Clock::time_point> drained_at;  // when the last drain began
  while (!Stopped(stop)) {
    if (Clock::now() - lag_at >= std::chrono::seconds(1)) {
      OML_RETURN_IF_ERROR(PublishLag());
      lag_at = Clock::now();
    }
    if (opts_.table_check_every.count() > 0 && Clock::now() - checked_at >= opts_.table_check_every) {
      OML_RETURN_IF_ERROR(CheckTables());
      checked_at = Clock::now();
    }
    MaybeVacuum();
    OML_RETURN_IF_ERROR(MaybePrune(/*now=*/false));
    if (!tracker.pending() && drained_at) {
      const auto since = Clock::now() - *drained_at;
      if (since < opts_.min_batch_interval) {
        SleepUnlessStopped(std::chrono::ceil<std::chrono::milliseconds>(opts_.min_batch_interval - since), stop);
        continue;
      }
    }
    OML_ASSIGN_OR_RETURN(int64_t stable, tracker.Poll(*conn_));
    if (stable <= frontier_) {
      // Nothing new drawn (the writer is idle), or a probe held back past gold's interval (a long
      // transaction): gold catches up with the frontier now.
      if (gold_pending_ && (!tracker.pending() || GoldDue())) OML_RETURN_IF_ERROR(FlushGold());
      // A pending probe waits only for transactions that were running when it was taken: the
      // commit point's last a few ms, so it is checked again soon. Nothing drawn, or a probe
      // held back for long: the idle interval.
      const bool fresh = tracker.pending() && Clock::now() - tracker.pending_since() < kHorizonFastPollFor;
      const auto fast = std::max(std::chrono::milliseconds(1), std::min(opts_.horizon_poll, opts_.poll_every));
      SleepUnlessStopped(fresh ? fast : opts_.poll_every, stop);
      continue;
    }
    drained_at = Clock::now();
    OML_RETURN_IF_ERROR(DrainTo(stable, stop));
    lag_at = Clock::now();
  }
  // A graceful stop brings gold to the frontier (a failure is only logged: the next start's
  // recovery refills gold from the outbox).
  if (gold_pending_) {
    if (Status st = FlushGold(); !st.ok())
      log::Warn("lake writer: gold not brought to the frontier at stop; the next start refills it",
                {{"stream", stream_.name}, {"error", st.ToString()}});
  }
  return Status::Ok();
}

void LakeWriter::MaybeVacuum() {
  if (opts_.vacuum_every.count() <= 0) return;
  if (!vacuumed_at_) {
    const auto first = std::min<std::chrono::steady_clock::duration>(opts_.vacuum_every, std::chrono::seconds(60));
    vacuumed_at_ = Clock::now() - opts_.vacuum_every + first;
    return;
  }
  if (Clock::now() - *vacuumed_at_ < opts_.vacuum_every) return;
  vacuumed_at_ = Clock::now();
  if (!lease_held_ || opts_.bypass_lease) return;  // only the lease holder tends the tables
  const int64_t hours = std::clamp<int64_t>(opts_.vacuum_retention_hours, 1, 168);
  for (const auto& target : TargetTables()) {
    const auto t0 = Clock::now();
    auto table = DeltaTable::Open(TableUri(opts_.lake_root, target.name));
    auto deleted = table.ok() ? table->Vacuum(hours) : Result<int64_t>(table.status());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!deleted.ok()) {
      // Not fatal: the next round tries again; the files stay until then.
      log::Warn("lake writer: vacuum failed", {{"stream", stream_.name}, {"table", target.name},
                                               {"error", deleted.status().ToString()}});
      Metrics::Get().LakeVacuum(target.name, "failed", 0, ms / 1000.0);
      continue;
    }
    Metrics::Get().LakeVacuum(target.name, "ok", *deleted, ms / 1000.0);
    log::Info("lake writer: table vacuumed", {{"stream", stream_.name}, {"table", target.name},
                                              {"files_deleted", *deleted}, {"retention_hours", hours}, {"ms", ms}});
  }
}

Status LakeWriter::MaybePrune(bool now) {
  if (opts_.prune_every.count() <= 0 || !lease_held_ || opts_.bypass_lease) return Status::Ok();
  if (!now && pruned_at_ && Clock::now() - *pruned_at_ < opts_.prune_every) return Status::Ok();
  pruned_at_ = Clock::now();
  // Never while a table is behind what it committed: its refill may still need the rows (it is
  // re-derived from the journal otherwise, which is slower).
  if (behind_from_ || refilling_) return Status::Ok();
  // Nor over rows gold trails by: it holds every row up to the frontier first.
  OML_RETURN_IF_ERROR(FlushGold());
  const auto t0 = Clock::now();
  const int64_t retention_s = std::clamp<int64_t>(opts_.outbox_retention_hours, 0, 24 * 366) * 3600;
  int64_t pruned = 0, through = 0;
  for (int i = 0; i < std::max(1, opts_.prune_max_batches); ++i) {
    auto r = conn_->Query("SELECT rows_pruned, pruned_through FROM oml.prune_outbox($1, $2, $3, $4)",
                          {db::Text(stream_.name), db::Int(epoch_), db::Int(retention_s),
                           db::Int(std::clamp(opts_.prune_batch, 1, 1000000))});
    if (!r.ok() || r->size() != 1) {
      log::Warn("lake writer: outbox prune failed",
                {{"stream", stream_.name}, {"error", r.ok() ? "no row" : r.status().ToString()}});
      break;
    }
    const int64_t n = r->GetInt(0, 0);
    through = r->GetInt(0, 1);
    pruned += n;
    stats_.rows_pruned += n;
    Metrics::Get().LakeOutboxPruned(n);
    if (n < opts_.prune_batch) break;
    if (!OML_SYNC_POINT("lakewriter.prune.after_batch").ok()) break;
  }
  if (pruned > 0)
    log::Info("lake writer: outbox pruned",
              {{"stream", stream_.name}, {"rows", pruned}, {"pruned_through", through}, {"frontier", frontier_},
               {"retention_hours", opts_.outbox_retention_hours},
               {"ms", std::chrono::duration<double, std::milli>(Clock::now() - t0).count()}});
  return Status::Ok();
}

Status LakeWriter::RederiveTable(const TargetTable& target, const PruneMarks& marks) {
  const auto t0 = Clock::now();
  OML_ASSIGN_OR_RETURN(DeltaTable * table, Table(target.name));
  DeadLetterIndex dead;
  OML_RETURN_IF_ERROR(dead.Load(*conn_, stream_.name));
  log::Warn("lake writer: rows the table lacks were pruned from the outbox; re-deriving them from the journal",
            {{"stream", stream_.name}, {"table", target.name}, {"pruned_through", marks.pruned_through},
             {"tenants", static_cast<int64_t>(marks.tenants.size())}});
  const nlohmann::json meta = {{"oml.stream", stream_.name}, {"oml.rederived_through", marks.pruned_through}};
  // A compaction still running (of a session before) would make the commits below lose.
  if (compactor_) compactor_->Drain();
  // Each commit is conditional on the handle's snapshot. One that loses to a commit without this
  // stream's txn (an outside OPTIMIZE, say) is made again on a fresh snapshot; one that loses to
  // a commit that moved the txn (another writer, a rebuild) fails, and recovery starts over.
  auto commit = [&](const std::function<Result<int64_t>()>& attempt, int64_t expect_txn) -> Status {
    for (int n = 1;; ++n) {
      OML_RETURN_IF_ERROR(CheckLease());
      auto v = attempt();
      if (v.ok() || !IsConflict(v.status()) || n >= kMaxCommitAttempts) return v.status();
      OML_RETURN_IF_ERROR(table->Refresh().status());
      OML_ASSIGN_OR_RETURN(LastTxn now, table->ReadLastTxn(app_id_));
      if (now.version != expect_txn) return v.status();
      ++stats_.retried_commits;
      Metrics::Get().LakeRetry("rebase");
    }
  };
  // Empty it first (txn 0): what an earlier, unfinished re-derivation left is not known row by row.
  OML_RETURN_IF_ERROR(table->Refresh().status());
  OML_ASSIGN_OR_RETURN(LastTxn before, table->ReadLastTxn(app_id_));
  OML_RETURN_IF_ERROR(commit([&] { return table->Truncate(TxnCommit{app_id_, 0, meta}); }, before.version));
  JournalFeed feed = [&](const std::string& tenant, int64_t after, int limit) -> Result<std::vector<FeedEvent>> {
    OML_ASSIGN_OR_RETURN(db::Rows r, conn_->Query("SELECT seq, event_hash, signed_bytes, signature "
                                                  "FROM oml.lake_journal_feed($1, $2, $3::uuid, $4, $5)",
                                                  {db::Text(stream_.name), db::Int(epoch_), db::Text(tenant),
                                                   db::Int(after), db::Int(limit)}));
    std::vector<FeedEvent> out(static_cast<size_t>(r.size()));
    for (int i = 0; i < r.size(); ++i)
      out[i] = FeedEvent{r.GetInt(i, 0), r.GetBytes(i, 1), r.GetBytes(i, 2), r.GetBytes(i, 3)};
    return out;
  };
  BodyLocations bodies =
      [&](const std::string& tenant) -> Result<std::map<journal::ArtifactKey, std::pair<std::string, std::string>>> {
    OML_ASSIGN_OR_RETURN(db::Rows r, conn_->Query("SELECT artifact_id::text, version, location, object_key "
                                                  "FROM oml.lake_body_locations($1, $2, $3::uuid)",
                                                  {db::Text(stream_.name), db::Int(epoch_), db::Text(tenant)}));
    std::map<journal::ArtifactKey, std::pair<std::string, std::string>> out;
    for (int i = 0; i < r.size(); ++i) out[{r.Get(i, 0), r.GetInt(i, 1)}] = {r.Get(i, 2), r.Get(i, 3)};
    return out;
  };
  int64_t chunk = 0, rows = 0;
  RowSink sink = [&](std::vector<OutboxRow>&& part, bool last) -> Status {
    // Chunks before the last take txn 1, 2, ... (fewer than the pruned rows, so below P); the last
    // takes P: only then does the table hold the whole pruned prefix.
    const int64_t prev = chunk, txn = last ? marks.pruned_through : ++chunk;
    const TxnCommit c{app_id_, txn, meta};
    if (part.empty()) {  // no row at all: the txn alone
      return commit([&] { return table->Truncate(c); }, prev);
    }
    std::vector<const OutboxRow*> ptrs;
    for (const auto& r : part) ptrs.push_back(&r);
    if (target.write == TableWrite::kAppend && !target.derived) {
      OML_ASSIGN_OR_RETURN(std::vector<ArrowColumnSpec> columns, LakeTableColumns(target.name));
      OML_RETURN_IF_ERROR(commit(
          [&]() -> Result<int64_t> {
            ArrowBatch arrow(columns);
            arrow.ReserveRows(static_cast<int64_t>(part.size()));
            for (const OutboxRow* r : ptrs) OML_RETURN_IF_ERROR(AppendDeltaRow(*r, &arrow));
            return table->AppendBatch(&arrow, c);
          },
          prev));
    } else {
      std::string jsonl;
      if (target.derived) {
        int64_t bad = 0;
        OML_ASSIGN_OR_RETURN(jsonl, DailyActivityRows(ptrs, -1, &bad));
      } else {
        for (const OutboxRow* r : ptrs) {
          OML_ASSIGN_OR_RETURN(std::string line, ToDeltaRow(*r, target));
          jsonl += line;
        }
      }
      OML_RETURN_IF_ERROR(commit([&] { return table->Merge(jsonl, target.merge, c); }, prev));
    }
    rows += static_cast<int64_t>(part.size());
    Metrics::Get().LakeRederived(target.name, static_cast<int64_t>(part.size()));
    return OML_SYNC_POINT("lakewriter.rederive.after_chunk");
  };
  OML_RETURN_IF_ERROR(Rederive(target.name, marks, dead, feed, bodies, opts_.max_rows, sink));
  OML_ASSIGN_OR_RETURN(const int64_t at, table->Refresh());
  OML_ASSIGN_OR_RETURN(LastTxn last, table->ReadLastTxn(app_id_));
  txn_cache_[target.name] = KnownTxn{at, last.version};
  ++stats_.rederived_tables;
  stats_.rederived_rows += rows;
  log::Info("lake writer: table re-derived from the journal up to the pruned mark; the outbox refill goes on from there",
            {{"stream", stream_.name}, {"table", target.name}, {"rows", rows}, {"txn_version", last.version},
             {"ms", std::chrono::duration<double, std::milli>(Clock::now() - t0).count()}});
  return Status::Ok();
}

Status LakeWriter::Session(const std::atomic<bool>* stop, bool once) {
  OML_RETURN_IF_ERROR(EnsureConnected());
  if (!opts_.bypass_lease && !lease_held_) {
    OML_ASSIGN_OR_RETURN(bool got, AcquireLease(stop));
    if (!got) return Status::Ok();  // stopped while standby
  }
  OML_RETURN_IF_ERROR(Recover().status());
  return Loop(stop, once);
}

Status LakeWriter::Run(const std::atomic<bool>* stop) {
  if (opts_.bypass_lease) log::Warn("lake writer: running WITHOUT the lease (test only)", {{"stream", opts_.stream}});
  int failures = 0;
  while (!Stopped(stop)) {
    const int64_t batches_before = stats_.batches, dead_before = stats_.dead_letters;
    Status st = Session(stop, /*once=*/false);
    if (st.ok()) return st;
    // Progress (a batch applied, or a poison row moved aside) starts the count again.
    if (stats_.batches > batches_before || stats_.dead_letters > dead_before) failures = 0;
    ++failures;
    Metrics::Get().LakeRetry(RetryKind(st));
    log::Error("lake writer: batch failed; recovering", {{"stream", opts_.stream}, {"error", st.ToString()},
                                                        {"attempt", failures}});
    if (!conn_ || !conn_->healthy()) Disconnect();
    if (IsConflict(st) && failures <= 3) continue;  // another writer committed: recover at once
    const auto backoff = std::min(opts_.max_backoff, std::chrono::milliseconds(int64_t{250} << std::min(failures, 8)));
    SleepUnlessStopped(backoff, stop);
  }
  return Status::Ok();
}

Status LakeWriter::RunOnce(const std::atomic<bool>* stop) {
  if (opts_.bypass_lease) log::Warn("lake writer: running WITHOUT the lease (test only)", {{"stream", opts_.stream}});
  once_target_.reset();  // each call takes its own horizon; its retries keep it
  int failures = 0;
  for (;;) {
    const int64_t batches_before = stats_.batches, dead_before = stats_.dead_letters;
    Status st = Session(stop, /*once=*/true);
    if (st.ok()) {
      // The compactions the drain asked for finish before --once returns.
      if (compactor_) compactor_->Drain();
      log::Info("lake writer: drained", {{"stream", stream_.name}, {"frontier", frontier_},
                                         {"batches", stats_.batches}, {"rows", stats_.rows}});
      return st;
    }
    // Progress (a batch applied, or a poison row moved aside) starts the count again.
    if (stats_.batches > batches_before || stats_.dead_letters > dead_before) failures = 0;
    ++failures;
    Metrics::Get().LakeRetry(RetryKind(st));
    log::Error("lake writer: batch failed", {{"stream", opts_.stream}, {"error", st.ToString()}, {"attempt", failures}});
    if (!Retryable(st) || failures >= opts_.once_max_attempts || Stopped(stop)) return st;
    if (!conn_ || !conn_->healthy()) Disconnect();
    if (!IsConflict(st)) SleepUnlessStopped(std::chrono::milliseconds(200) * failures, stop);
  }
}

}  // namespace oml::lake
