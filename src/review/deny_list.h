// The deny-list: patterns whose presence in reviewed text flags a claim (it never refuses one).
//
// One gate for every text: inline body text and the text extracted from an attachment are
// scanned by the same DenyList::Scan. A hit names the pattern and the byte offset where the
// match starts; the matched bytes themselves are never reported, logged or stored.
//
// Patterns are RE2 (https://github.com/google/re2/wiki/Syntax): matching is linear in the text
// and uses no recursion, so a hostile text cannot make a scan explode. The whole list is first
// run as one RE2::Set (one pass: which patterns occur at all); only the patterns that occur are
// then run again to find each match's offset.
//
// File format (config `deny_list_file`, TOML; docs/operations/review.md):
//
//   builtin = true                  # optional, default true: keep the built-in patterns
//   disable = ["aws-secret-access-key"]   # optional: built-in ids to leave out
//   [[pattern]]
//   id = "acme-deploy-token"        # [a-z0-9][a-z0-9._-]{0,63}, unique across the list
//   regex = '''acme_[0-9a-f]{32}''' # RE2 syntax; a literal string needs no escaping
//   fallback = false                # optional, see DenyPattern::fallback
//
// Thread safety: a DenyList is immutable once built; Scan may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "review/extract.h"

namespace oml::review {

struct DenyPattern {
  std::string id;
  std::string regex;
  // A catch-all: its hit is dropped when a non-fallback pattern's hit starts at the same offset
  // (so "-----BEGIN RSA PRIVATE KEY-----" reports private-key-rsa, not also
  // private-key-generic).
  bool fallback = false;
};

struct DenyHit {
  std::string pattern_id;
  uint64_t offset = 0;  // byte offset of the match's first byte in the scanned text
  bool operator==(const DenyHit&) const = default;
};

struct ScanHits {
  // Ordered by offset, then by pattern id; matches of one pattern never overlap (leftmost
  // first, then the scan resumes after the match).
  std::vector<DenyHit> hits;
  bool truncated = false;  // more than max_hits: only the first max_hits are listed
};

class DenyList {
 public:
  // The built-in patterns, in this order (docs/operations/review.md lists them):
  //   private-key-rsa, private-key-ec, private-key-openssh, private-key-pgp, private-key-pkcs8,
  //   private-key-generic (fallback), aws-access-key-id, aws-secret-access-key, github-token,
  //   github-fine-grained-pat, slack-token, google-api-key.
  static const std::vector<DenyPattern>& BuiltinPatterns();

  // Compiles `patterns`. kInvalidArgument naming the id when an id is malformed or repeated, a
  // regex does not compile, or a regex matches the empty string (it would hit everywhere).
  static Result<std::shared_ptr<const DenyList>> Compile(std::vector<DenyPattern> patterns);
  // The built-ins, compiled once per process.
  static std::shared_ptr<const DenyList> Builtin();
  // Parses the TOML file format above (`source` names it in errors) into the full pattern list
  // (built-ins first, unless builtin = false). kInvalidArgument on any malformed entry, an
  // unknown key, or a `disable` id that is no built-in.
  static Result<std::vector<DenyPattern>> Parse(std::string_view toml_text, std::string_view source);
  // "" -> Builtin(); else reads, parses and compiles the file (kNotFound when it is missing).
  static Result<std::shared_ptr<const DenyList>> Load(const std::string& path);

  ~DenyList();
  DenyList(const DenyList&) = delete;
  DenyList& operator=(const DenyList&) = delete;

  const std::vector<DenyPattern>& patterns() const { return patterns_; }

  // Every hit in `text`, at most `max_hits` of them (ScanHits::truncated says when more).
  ScanHits Scan(std::string_view text, size_t max_hits = 1000) const;

 private:
  friend class DenyScanner;
  DenyList() = default;
  struct Found {
    uint64_t offset;
    size_t pattern;
  };
  // The one matching loop behind Scan and DenyScanner. `text` starts at absolute offset `base`;
  // matches end within its first `len` bytes (the rest is context for $, \z and \b only).
  // Finds each pattern's matches that start in [from, until), each pattern's
  // search resuming at max(from, (*resume)[p]) (the end of its previous match: matches of one
  // pattern never overlap) and moving it past every match found; at most cap + 1 matches per
  // pattern in all ((*count)[p] carries the count across calls).
  void Find(std::string_view text, size_t len, uint64_t base, uint64_t from, uint64_t until, size_t cap,
            std::vector<uint64_t>* resume, std::vector<size_t>* count, std::vector<Found>* found) const;
  // Drops fallback hits shadowed by a specific one at the same offset, orders, cuts at max_hits.
  ScanHits Resolve(const std::vector<Found>& found, size_t max_hits) const;
  struct Compiled;  // the RE2 objects (deny_list.cc)
  std::vector<DenyPattern> patterns_;
  std::unique_ptr<Compiled> re_;
};

// The deny-list over a text that arrives in pieces (a TextSink's tap), of any length, in bounded
// memory: the text is scanned in windows of `window` bytes, each with `overlap` bytes of the
// text before and after it as context. The hits are exactly those of DenyList::Scan on the whole
// text for every match at most `overlap` bytes long (the built-in patterns' matches are under
// 200 bytes); a longer match that crosses a window's end may be reported cut short (same
// offset) or not at all. Memory: about window + 2 x overlap bytes of text.
class DenyScanner : public TextTap {
 public:
  static constexpr size_t kWindow = size_t{4} << 20;
  static constexpr size_t kOverlap = size_t{64} << 10;

  // window and overlap are at least 1.
  explicit DenyScanner(std::shared_ptr<const DenyList> list, size_t max_hits = 1000, size_t window = kWindow,
                       size_t overlap = kOverlap);
  ~DenyScanner() override;  // wipes the text it holds
  void Text(std::string_view piece) override;
  // Scans what is left; the hits, offsets into the whole text. Call once, after the last piece.
  ScanHits Finish();
  // Bytes of text received.
  uint64_t bytes() const { return base_ + buf_.size(); }

 private:
  void ScanWindow(bool final);
  std::shared_ptr<const DenyList> list_;
  size_t max_hits_, window_, overlap_;
  std::string buf_;    // the text from base_ on: context before next_, then what is undecided
  uint64_t base_ = 0;  // absolute offset of buf_[0]
  uint64_t next_ = 0;  // matches starting before next_ are decided
  std::vector<uint64_t> resume_;
  std::vector<size_t> count_;
  std::vector<DenyList::Found> found_;
};

}  // namespace oml::review
