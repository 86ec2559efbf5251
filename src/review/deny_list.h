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
  DenyList() = default;
  struct Compiled;  // the RE2 objects (deny_list.cc)
  std::vector<DenyPattern> patterns_;
  std::unique_ptr<Compiled> re_;
};

}  // namespace oml::review
