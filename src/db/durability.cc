#include "db/durability.h"

#include <climits>

#include "common/log.h"
#include "common/metrics.h"

namespace oml::db {
namespace {

// Tokens of PostgreSQL's syncrep_scanner.l.
enum class Tok { kAny, kFirst, kName, kNum, kComma, kOpen, kClose };
struct Token {
  Tok tok;
  std::string text;
};

bool IsSpace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IdentStart(unsigned char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c >= 0x80 || c == '_'; }
bool IdentCont(unsigned char c) { return IdentStart(c) || IsDigit(c) || c == '$'; }

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    unsigned char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x += 'a' - 'A';
    if (y >= 'A' && y <= 'Z') y += 'a' - 'A';
    if (x != y) return false;
  }
  return true;
}

Status SyntaxError(const std::string& what) {
  return InvalidArgument("synchronous_standby_names: " + what, "invalid-sync-standby-names");
}

Result<std::vector<Token>> Lex(std::string_view s) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    if (IsSpace(c)) {
      ++i;
    } else if (c == '"') {  // "quoted name", "" is a quote
      std::string name;
      for (++i;; ++i) {
        if (i >= s.size()) return SyntaxError("unterminated quoted name");
        if (s[i] == '"') {
          if (i + 1 < s.size() && s[i + 1] == '"') {
            name.push_back('"');
            ++i;
            continue;
          }
          ++i;
          break;
        }
        name.push_back(s[i]);
      }
      out.push_back({Tok::kName, std::move(name)});
    } else if (IdentStart(c)) {  // the whole identifier, then keywords: "anyone" is a name
      size_t j = i;
      while (j < s.size() && IdentCont(s[j])) ++j;
      std::string word(s.substr(i, j - i));
      i = j;
      Tok t = EqualsNoCase(word, "any") ? Tok::kAny : EqualsNoCase(word, "first") ? Tok::kFirst : Tok::kName;
      out.push_back({t, std::move(word)});
    } else if (IsDigit(c)) {
      size_t j = i;
      while (j < s.size() && IsDigit(s[j])) ++j;
      out.push_back({Tok::kNum, std::string(s.substr(i, j - i))});
      i = j;
    } else if (c == '*') {
      out.push_back({Tok::kName, "*"});
      ++i;
    } else if (c == ',' || c == '(' || c == ')') {
      out.push_back({c == ',' ? Tok::kComma : c == '(' ? Tok::kOpen : Tok::kClose, std::string(1, c)});
      ++i;
    } else {
      return SyntaxError("unexpected character at offset " + std::to_string(i));
    }
  }
  return out;
}

std::string Plural(size_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

}  // namespace

std::string SyncStandbys::Describe() const {
  if (method == Method::kNone) return "none";
  bool any_name = false;
  for (const auto& n : names) any_name = any_name || n == "*";
  std::string of = any_name ? "any standby (*)" : Plural(names.size(), "standby");
  if (method == Method::kQuorum) return "ANY " + std::to_string(num_sync) + " of " + of;
  return "FIRST " + std::to_string(num_sync) + " of " + of;
}

Result<SyncStandbys> ParseSyncStandbyNames(std::string_view value) {
  OML_ASSIGN_OR_RETURN(std::vector<Token> t, Lex(value));
  SyncStandbys out;
  if (t.empty()) return out;  // no synchronous standbys
  size_t i = 0;
  auto at = [&](Tok k) { return i < t.size() && t[i].tok == k; };
  auto expect = [&](Tok k, const char* what) -> Status {
    if (!at(k)) return SyntaxError(std::string("expected ") + what);
    ++i;
    return Status::Ok();
  };
  // standby_config: standby_list | NUM '(' list ')' | ANY NUM '(' list ')' | FIRST NUM '(' list ')'
  bool with_count = false;
  out.method = SyncStandbys::Method::kPriority;
  out.num_sync = 1;
  if (at(Tok::kAny) || at(Tok::kFirst)) {
    out.method = at(Tok::kAny) ? SyncStandbys::Method::kQuorum : SyncStandbys::Method::kPriority;
    ++i;
    if (!at(Tok::kNum)) return SyntaxError("expected the number of synchronous standbys after ANY/FIRST");
    with_count = true;
  } else if (at(Tok::kNum) && i + 1 < t.size() && t[i + 1].tok == Tok::kOpen) {
    with_count = true;  // the pre-9.6 spelling of FIRST k
  }
  if (with_count) {
    const std::string& digits = t[i].text;
    if (digits.size() > 9 || std::stoll(digits) > INT_MAX)
      return SyntaxError("number of synchronous standbys is out of range");
    out.num_sync = static_cast<int>(std::stoll(digits));
    ++i;
    OML_RETURN_IF_ERROR(expect(Tok::kOpen, "'('"));
  }
  // standby_list: standby_name [',' standby_name ...]; a standby_name is a NAME or a NUM.
  for (;;) {
    if (!at(Tok::kName) && !at(Tok::kNum)) return SyntaxError("expected a standby name");
    out.names.push_back(t[i].text);
    ++i;
    if (!at(Tok::kComma)) break;
    ++i;
  }
  if (with_count) OML_RETURN_IF_ERROR(expect(Tok::kClose, "')'"));
  if (i != t.size()) return SyntaxError("unexpected text after the standby list");
  if (out.num_sync < 1)
    return SyntaxError("number of synchronous standbys (" + std::to_string(out.num_sync) +
                       ") must be greater than zero");
  return out;
}

DurabilityVerdict EvaluateDurability(const DurabilitySettings& s) {
  DurabilityVerdict v;
  const std::string& sc = s.synchronous_commit;
  const bool waits = sc == "on" || sc == "remote_write" || sc == "remote_apply";
  auto names = ParseSyncStandbyNames(s.synchronous_standby_names);
  std::string standbys;
  bool quorum = false;
  if (!names.ok()) {
    standbys = "synchronous_standby_names cannot be parsed (" + names.status().message() + ")";
  } else if (names->method == SyncStandbys::Method::kNone) {
    standbys = "synchronous_standby_names is empty: no synchronous standbys";
  } else if (!names->IsQuorum()) {
    standbys = "synchronous_standby_names is priority-based (" + names->Describe() + "), not a quorum (ANY k)";
  } else {
    quorum = true;
    standbys = "synchronous_standby_names is a quorum (" + names->Describe() + ")";
  }
  v.quorum = quorum && waits;
  if (!waits) {
    v.detail = "synchronous_commit=" + sc + " does not wait for standbys (needs remote_write, remote_apply or on); " +
               standbys;
  } else {
    v.detail = "synchronous_commit=" + sc + "; " + standbys;
  }
  return v;
}

Result<DurabilitySettings> ReadDurabilitySettings(Conn& c) {
  OML_ASSIGN_OR_RETURN(Rows r, c.Query("SELECT current_setting('synchronous_commit'), "
                                       "current_setting('synchronous_standby_names')"));
  return DurabilitySettings{r.Get(0, 0), r.Get(0, 1)};
}

std::string StandbyCount::HealthValue() const {
  if (!known) return "unknown";
  if (required == 0) return "none";
  return BelowQuorum() ? "below-quorum" : "ok";
}

std::string StandbyCount::Describe() const {
  if (!known) return "the synchronous standbys streaming cannot be counted (oml_owner lacks pg_read_all_stats, or "
                     "this is not the primary)";
  std::string out = std::to_string(sync_streaming) + " of " + std::to_string(streaming) + " streaming standby" +
                    (streaming == 1 ? "" : "s") + " synchronous";
  if (required > 0) out += "; " + std::to_string(required) + " needed";
  return out;
}

StandbyCount ReadStandbyCount(Conn& c, const DurabilitySettings& settings) {
  StandbyCount out;
  auto names = ParseSyncStandbyNames(settings.synchronous_standby_names);
  out.required = names.ok() ? names->num_sync : 0;
  auto r = c.Query("SELECT sync_streaming, streaming FROM oml.sync_standbys()");
  if (!r.ok() || r->IsNull(0, 0) || r->IsNull(0, 1)) return out;
  out.known = true;
  out.sync_streaming = static_cast<int>(r->GetInt(0, 0));
  out.streaming = static_cast<int>(r->GetInt(0, 1));
  return out;
}

DurabilityMonitor::DurabilityMonitor(std::string url, DurabilityMode mode, std::chrono::milliseconds interval)
    : url_(std::move(url)), mode_(mode), interval_(interval) {
  state_.mode = mode;
}

DurabilityMonitor::~DurabilityMonitor() { Stop(); }

std::string DurabilityMonitor::HealthValue(const State& s) {
  switch (s.mode) {
    case DurabilityMode::kReduced: return "reduced";
    case DurabilityMode::kReducedLocal: return "reduced (local profile)";
    case DurabilityMode::kEnforced: break;
  }
  return s.quorum ? "ok" : "insufficient";
}

Status DurabilityMonitor::CheckNow() {
  std::lock_guard<std::mutex> one_check(check_mu_);
  DurabilityVerdict v;
  Status err;
  // A fresh session every check: ALTER ROLE / ALTER DATABASE ... SET synchronous_commit apply to
  // new sessions only (the pool opens new ones), and a session left from before a restart or
  // failover would fail the check for nothing.
  conn_.reset();
  {
    auto c = Conn::Connect(url_);
    if (c.ok()) conn_ = std::make_unique<Conn>(std::move(c).value());
    else err = c.status();
  }
  StandbyCount standbys;
  if (err.ok()) {
    auto s = ReadDurabilitySettings(*conn_);
    if (s.ok()) {
      v = EvaluateDurability(*s);
      standbys = ReadStandbyCount(*conn_, *s);
    } else {
      err = s.status();
    }
  }
  if (!err.ok()) {
    v.quorum = false;  // not verified: the gate stays closed until a check succeeds
    // Clients see the detail (503 body, /v1/health): no SQL, hosts or role names in it.
    v.detail = "the durability settings could not be read (the server log has the error)";
  }
  State before;
  {
    std::lock_guard<std::mutex> l(mu_);
    before = state_;
    state_.checked = true;
    state_.quorum = v.quorum;
    state_.detail = v.detail;
    state_.standbys = standbys;
  }
  Metrics::Get().Durability(mode_ != DurabilityMode::kEnforced, v.quorum);
  Metrics::Get().SyncStandbys(standbys.known ? standbys.sync_streaming : -1, standbys.required);
  if (before.checked && before.standbys.BelowQuorum() != standbys.BelowQuorum()) {
    nlohmann::json f = {{"replication", standbys.HealthValue()}, {"detail", standbys.Describe()}};
    if (standbys.BelowQuorum())
      log::Error("synchronous standbys below the quorum: every commit waits for one to return (up to "
                 "commit_replication_timeout_ms, then 503 commit-not-replicated)",
                 f);
    else
      log::Info("synchronous standbys back at the quorum", f);
  }
  if (before.checked && (before.quorum != v.quorum || before.detail != v.detail)) {
    State now = Get();
    nlohmann::json f = {{"durability", HealthValue(now)}, {"was", HealthValue(before)}, {"detail", v.detail}};
    if (!err.ok()) f["error"] = err.ToString();
    if (mode_ != DurabilityMode::kEnforced) log::Info("durability settings changed", f);
    else if (v.quorum) log::Info("durability requirement met: writes accepted", f);
    else log::Error("durability requirement not met: writes refused (503 durability-reduced)", f);
  }
  return err;
}

Status DurabilityMonitor::Start() {
  OML_RETURN_IF_ERROR(CheckNow());
  const State s = Get();
  nlohmann::json f = {{"durability", HealthValue(s)},
                      {"detail", s.detail},
                      {"replication", s.standbys.HealthValue()},
                      {"replication_detail", s.standbys.Describe()},
                      {"check_interval_ms", interval_.count()}};
  switch (mode_) {
    case DurabilityMode::kEnforced:
      if (s.quorum) log::Info("durability: synchronous quorum replication; writes accepted", f);
      else log::Error("durability requirement not met: writes refused (503 durability-reduced) until it is", f);
      break;
    case DurabilityMode::kReduced:
      log::Warn("durability reduced (--reduced-durability): writes are acknowledged without synchronous quorum "
                "replication",
                f);
      break;
    case DurabilityMode::kReducedLocal:
      log::Warn("durability reduced (local profile): durability is this one machine's disk", f);
      break;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void DurabilityMonitor::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DurabilityMonitor::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    if (cv_.wait_for(l, interval_, [this] { return stop_; })) break;
    l.unlock();
    (void)CheckNow();  // an error is recorded in the state (gate closed) and logged on change
    l.lock();
  }
}

Status DurabilityMonitor::Gate() const {
  if (mode_ != DurabilityMode::kEnforced) return Status::Ok();
  std::lock_guard<std::mutex> l(mu_);
  if (state_.quorum) return Status::Ok();
  return Unavailable("writes are refused: the database does not provide the durability the production profile "
                     "requires (synchronous quorum replication): " +
                         state_.detail +
                         ". Set synchronous_standby_names = 'ANY k (...)' with synchronous_commit remote_write, "
                         "remote_apply or on, or run oml serve with --reduced-durability",
                     "durability-reduced");
}

DurabilityMonitor::State DurabilityMonitor::Get() const {
  std::lock_guard<std::mutex> l(mu_);
  return state_;
}

}  // namespace oml::db
