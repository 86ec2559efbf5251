#include "review/deny_list.h"

#include <re2/re2.h>
#include <re2/set.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "crypto/crypto.h"

namespace oml::review {
namespace {

bool ValidId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
  }
  return true;
}

RE2::Options PatternOptions() {
  RE2::Options o;
  o.set_log_errors(false);
  return o;
}

}  // namespace

struct DenyList::Compiled {
  std::vector<std::unique_ptr<re2::RE2>> each;  // one per pattern, same order
  re2::RE2::Set set{PatternOptions(), RE2::UNANCHORED};
};

const std::vector<DenyPattern>& DenyList::BuiltinPatterns() {
  // Each regex is documented with its near misses in docs/operations/review.md; the tests
  // (deny_list_test.cc) pin the id and offset of a hit for each and the near misses.
  static const std::vector<DenyPattern> kBuiltins = {
      {"private-key-rsa", R"(-----BEGIN RSA PRIVATE KEY-----)"},
      {"private-key-ec", R"(-----BEGIN EC PRIVATE KEY-----)"},
      {"private-key-openssh", R"(-----BEGIN OPENSSH PRIVATE KEY-----)"},
      {"private-key-pgp", R"(-----BEGIN PGP PRIVATE KEY BLOCK-----)"},
      // PKCS #8, plain and encrypted (RFC 5958 / RFC 7468 §10, §11).
      {"private-key-pkcs8", R"(-----BEGIN (?:ENCRYPTED )?PRIVATE KEY-----)"},
      // Any other armoured private key (DSA, SSH2's "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----").
      {"private-key-generic", R"(-{4,5} ?BEGIN [A-Z0-9 ]{0,64}PRIVATE KEY(?: BLOCK)? ?-{4,5})", true},
      // Long-term (AKIA) and temporary (ASIA) access key ids: the prefix and 16 upper-case
      // letters or digits, as a whole word.
      {"aws-access-key-id", R"(\b(?:AKIA|ASIA)[A-Z0-9]{16}\b)"},
      // A 40-character secret access key assigned to a name that says so:
      // aws_secret_access_key = "...", AWS_SECRET_ACCESS_KEY: ..., "aws-secret-key" => '...'.
      {"aws-secret-access-key",
       R"((?i)aws[_\- ]?secret[_\- ]?(?:access[_\- ]?)?key["']?\s*(?::|=>|=)\s*["']?[A-Za-z0-9/+]{40}(?:[^A-Za-z0-9/+=]|\z))"},
      // Classic tokens: personal (ghp_), OAuth (gho_), user-to-server (ghu_), server-to-server
      // (ghs_), refresh (ghr_): the prefix and 36 letters or digits.
      {"github-token", R"(\bgh[pousr]_[A-Za-z0-9]{36}\b)"},
      {"github-fine-grained-pat", R"(\bgithub_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}\b)"},
      // Bot (xoxb-), user (xoxp-), app-level (xoxa-) and refresh (xoxr-) tokens.
      {"slack-token", R"(\bxox[abpr]-[0-9A-Za-z-]{10,})"},
      {"google-api-key", R"(\bAIza[0-9A-Za-z_\-]{35}(?:[^0-9A-Za-z_\-]|\z))"},
  };
  return kBuiltins;
}

DenyList::~DenyList() = default;

Result<std::shared_ptr<const DenyList>> DenyList::Compile(std::vector<DenyPattern> patterns) {
  std::shared_ptr<DenyList> list(new DenyList());
  list->re_ = std::make_unique<Compiled>();
  std::set<std::string> ids;
  for (const auto& p : patterns) {
    if (!ValidId(p.id))
      return InvalidArgument("deny-list pattern id '" + p.id + "': must match [a-z0-9][a-z0-9._-]{0,63}");
    if (!ids.insert(p.id).second) return InvalidArgument("deny-list pattern id '" + p.id + "' appears twice");
    auto re = std::make_unique<re2::RE2>(p.regex, PatternOptions());
    if (!re->ok()) return InvalidArgument("deny-list pattern '" + p.id + "': " + re->error());
    if (RE2::PartialMatch("", *re))
      return InvalidArgument("deny-list pattern '" + p.id + "' matches the empty string");
    std::string error;
    if (list->re_->set.Add(p.regex, &error) < 0)
      return InvalidArgument("deny-list pattern '" + p.id + "': " + error);
    list->re_->each.push_back(std::move(re));
  }
  if (!list->re_->set.Compile()) return InvalidArgument("deny-list: the patterns together exceed RE2's memory budget");
  list->patterns_ = std::move(patterns);
  return std::shared_ptr<const DenyList>(std::move(list));
}

std::shared_ptr<const DenyList> DenyList::Builtin() {
  static const std::shared_ptr<const DenyList> kList = [] {
    auto r = Compile(BuiltinPatterns());
    // The built-ins are constants checked by the tests; failing here is a bug in this file.
    if (!r.ok()) std::abort();
    return std::move(r).value();
  }();
  return kList;
}

Result<std::vector<DenyPattern>> DenyList::Parse(std::string_view toml_text, std::string_view source) {
  const std::string where(source);
  toml::table tbl;
  try {
    tbl = toml::parse(toml_text, where);
  } catch (const toml::parse_error& e) {
    return InvalidArgument(where + ": " + std::string(e.description()));
  }
  bool builtin = true;
  std::set<std::string> disabled;
  std::vector<DenyPattern> own;
  for (auto& [k, node] : tbl) {
    const std::string key(k.str());
    if (key == "builtin") {
      if (!node.is_boolean()) return InvalidArgument(where + ": builtin must be true or false");
      builtin = *node.value<bool>();
    } else if (key == "disable") {
      auto* arr = node.as_array();
      if (arr == nullptr) return InvalidArgument(where + ": disable must be an array of built-in pattern ids");
      for (auto& el : *arr) {
        auto s = el.is_string() ? el.value<std::string>() : std::nullopt;
        if (!s) return InvalidArgument(where + ": disable must be an array of built-in pattern ids");
        const auto& b = BuiltinPatterns();
        if (std::none_of(b.begin(), b.end(), [&](const DenyPattern& p) { return p.id == *s; }))
          return InvalidArgument(where + ": disable: '" + *s + "' is not a built-in pattern id");
        disabled.insert(*s);
      }
    } else if (key == "pattern") {
      auto* arr = node.as_array();
      if (arr == nullptr) return InvalidArgument(where + ": pattern must be an array of tables ([[pattern]])");
      for (auto& el : *arr) {
        auto* t = el.as_table();
        if (t == nullptr) return InvalidArgument(where + ": pattern must be an array of tables ([[pattern]])");
        DenyPattern p;
        bool has_id = false, has_regex = false;
        for (auto& [pk, pv] : *t) {
          const std::string f(pk.str());
          if (f == "id" && pv.is_string()) {
            p.id = *pv.value<std::string>();
            has_id = true;
          } else if (f == "regex" && pv.is_string()) {
            p.regex = *pv.value<std::string>();
            has_regex = true;
          } else if (f == "fallback" && pv.is_boolean()) {
            p.fallback = *pv.value<bool>();
          } else {
            return InvalidArgument(where + ": [[pattern]] " + f +
                                   ": unknown key or wrong type (id and regex are strings, fallback a boolean)");
          }
        }
        if (!has_id || !has_regex) return InvalidArgument(where + ": every [[pattern]] needs an id and a regex");
        own.push_back(std::move(p));
      }
    } else {
      return InvalidArgument(where + ": unknown key '" + key + "'");
    }
  }
  std::vector<DenyPattern> all;
  if (builtin) {
    for (const auto& p : BuiltinPatterns())
      if (!disabled.count(p.id)) all.push_back(p);
  } else if (!disabled.empty()) {
    return InvalidArgument(where + ": disable has no effect with builtin = false");
  }
  for (auto& p : own) all.push_back(std::move(p));
  return all;
}

Result<std::shared_ptr<const DenyList>> DenyList::Load(const std::string& path) {
  if (path.empty()) return Builtin();
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("deny_list_file " + path + ": cannot be opened");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Unavailable("deny_list_file " + path + ": read failed");
  OML_ASSIGN_OR_RETURN(auto patterns, Parse(buf.str(), path));
  return Compile(std::move(patterns));
}

void DenyList::Find(std::string_view text, size_t len, uint64_t base, uint64_t from, uint64_t until, size_t cap,
                    std::vector<uint64_t>* resume, std::vector<size_t>* count, std::vector<Found>* found) const {
  if (patterns_.empty() || from >= until) return;
  // Matches end at or before len; the bytes after it are context only (for $, \z and \b at
  // the window's end, which is not the text's end unless len == text.size()).
  const re2::StringPiece whole(text.data(), text.size());
  std::vector<int> which;
  re2::RE2::Set::ErrorInfo err{re2::RE2::Set::kNoError};
  if (!re_->set.Match(whole, &which, &err)) {
    if (err.kind == re2::RE2::Set::kNoError) return;
    // The set's DFA gave up (out of memory on a large text): run every pattern on its own.
    which.clear();
    for (size_t i = 0; i < patterns_.size(); ++i) which.push_back(static_cast<int>(i));
  }
  for (int idx : which) {
    const re2::RE2& re = *re_->each[idx];
    uint64_t& resume_at = (*resume)[idx];
    size_t& n = (*count)[idx];
    // Invariant: at most cap + 1 hits per pattern are kept; any later one sorts after the first
    // cap + 1 of its own pattern, so it could never be among the first cap.
    while (n <= cap) {
      const uint64_t at = std::max(from, resume_at);
      if (at < base || at - base > len) break;
      re2::StringPiece m;
      if (!re.Match(whole, static_cast<size_t>(at - base), len, RE2::UNANCHORED, &m, 1)) break;
      const uint64_t off = base + static_cast<uint64_t>(m.data() - text.data());
      if (off >= until) break;  // the next window decides it
      if (m.empty()) {          // a pattern that can match empty somewhere: skip the empty match
        resume_at = off + 1;
        continue;
      }
      found->push_back({off, static_cast<size_t>(idx)});
      ++n;
      resume_at = off + m.size();
    }
  }
}

ScanHits DenyList::Resolve(const std::vector<Found>& found, size_t max_hits) const {
  ScanHits out;
  std::set<uint64_t> specific;
  for (const auto& f : found)
    if (!patterns_[f.pattern].fallback) specific.insert(f.offset);
  std::vector<DenyHit> hits;
  for (const auto& f : found) {
    if (patterns_[f.pattern].fallback && specific.count(f.offset)) continue;
    hits.push_back({patterns_[f.pattern].id, f.offset});
  }
  std::sort(hits.begin(), hits.end(), [](const DenyHit& a, const DenyHit& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.pattern_id < b.pattern_id;
  });
  if (hits.size() > max_hits) {
    hits.resize(max_hits);
    out.truncated = true;
  }
  out.hits = std::move(hits);
  return out;
}

ScanHits DenyList::Scan(std::string_view text, size_t max_hits) const {
  std::vector<uint64_t> resume(patterns_.size(), 0);
  std::vector<size_t> count(patterns_.size(), 0);
  std::vector<Found> found;
  Find(text, text.size(), 0, 0, text.size() + 1, max_hits, &resume, &count, &found);
  return Resolve(found, max_hits);
}

DenyScanner::DenyScanner(std::shared_ptr<const DenyList> list, size_t max_hits, size_t window, size_t overlap)
    : list_(std::move(list)),
      max_hits_(max_hits),
      window_(std::max<size_t>(window, 1)),
      overlap_(std::max<size_t>(overlap, 1)),
      resume_(list_->patterns().size(), 0),
      count_(list_->patterns().size(), 0) {}

DenyScanner::~DenyScanner() { crypto::Wipe(&buf_); }

void DenyScanner::Text(std::string_view piece) {
  buf_.append(piece);
  // Strictly more than a window and its overlap: at least one byte after the view is context.
  while (base_ + buf_.size() - next_ > window_ + overlap_) ScanWindow(false);
}

void DenyScanner::ScanWindow(bool final) {
  const size_t ctx = static_cast<size_t>(next_ - base_);
  const size_t len = final ? buf_.size() : std::min(buf_.size(), ctx + window_ + overlap_);
  // The last window decides every start up to and including the end (Scan's bound: an empty
  // match at the end is skipped there too).
  const uint64_t until = final ? base_ + len + 1 : next_ + window_;
  list_->Find(buf_, len, base_, next_, until, max_hits_, &resume_, &count_, &found_);
  next_ = final ? base_ + len : until;
  // Keep `overlap_` bytes before next_ as the next window's left context.
  const size_t drop = next_ - base_ > overlap_ ? static_cast<size_t>(next_ - base_ - overlap_) : 0;
  buf_.erase(0, drop);
  base_ += drop;
}

ScanHits DenyScanner::Finish() {
  ScanWindow(true);
  return list_->Resolve(found_, max_hits_);
}

}  // namespace oml::review
