// RFC 9162 (Certificate Transparency 2.0, section 2.1; the same tree as RFC 6962) Merkle trees:
// the hashes, the right edge of a growing tree (CompactRange), and inclusion and consistency
// proofs with their verification. Issue 23: every tenant's chain is also such a tree, whose
// entries are the events' signed_bytes in seq order, so that tools no one here wrote (a CT or
// C2SP tlog verifier) can check oml's proofs.
//
//   leaf hash      SHA-256(0x00 || entry)
//   interior hash  SHA-256(0x01 || left || right)
//   empty tree     SHA-256("")
//   MTH(D[n]), n > 1: k = the largest power of two < n; HashChildren(MTH(D[0:k]), MTH(D[k:n]))
//
// Every hash here is a 32-byte std::string. A node is named (level, index): the root of the
// perfect subtree of the 2^level leaves [index << level, (index + 1) << level). Proofs are made
// from node hashes (NodeReader): only perfect subtrees are stored anywhere, and any other
// subtree's hash is folded from them (O(log n) nodes per proof hash).
//
// Thread safety: the functions are pure; a CompactRange or MemoryTree is used by one thread at
// a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace oml::merkle {

inline constexpr size_t kHashSize = 32;

std::string HashLeaf(std::string_view entry);
std::string HashChildren(std::string_view left, std::string_view right);
std::string EmptyRoot();

// The right edge of a tree of size() leaves: the roots of its perfect subtrees, one per set bit
// of size(), largest (leftmost) first. Enough to append and to give the root of the tree, in
// O(log n) space: the commit point keeps it beside the chain head.
class CompactRange {
 public:
  CompactRange() = default;
  // The range Encode() wrote for `size` leaves: popcount(size) hashes. kInvalidArgument
  // "invalid-compact-range" if the length does not fit the size.
  static Result<CompactRange> Decode(uint64_t size, std::string_view encoded);

  uint64_t size() const { return size_; }
  // Appends one leaf (its HashLeaf). REQUIRES: leaf_hash is kHashSize bytes.
  void Append(std::string_view leaf_hash);
  // MTH of the size() leaves (EmptyRoot() for none).
  std::string Root() const;
  // The hashes, concatenated (popcount(size()) * kHashSize bytes).
  std::string Encode() const;
  const std::vector<std::string>& hashes() const { return hashes_; }

 private:
  uint64_t size_ = 0;
  std::vector<std::string> hashes_;
};

// Hashes of perfect subtrees. Errors (a store's) are returned by the proof functions as they are.
class NodeReader {
 public:
  virtual ~NodeReader() = default;
  // The root of leaves [index << level, (index + 1) << level). REQUIRES: they all exist.
  virtual Result<std::string> Node(int level, uint64_t index) = 0;
};

// MTH of leaves [begin, end), any range the RFC's recursion names (begin a multiple of the
// largest power of two <= end - begin). REQUIRES: begin < end.
Result<std::string> RangeHash(NodeReader& nodes, uint64_t begin, uint64_t end);
// MTH of the first `size` leaves.
Result<std::string> RootAt(NodeReader& nodes, uint64_t size);
// PATH(index, D[size]) (RFC 9162 2.1.3.1): the audit path, leaf side first. kInvalidArgument
// "invalid-proof-request" unless index < size.
Result<std::vector<std::string>> InclusionProof(NodeReader& nodes, uint64_t index, uint64_t size);
// PROOF(m, D[n]) (RFC 9162 2.1.4.1). Empty for m == 0 or m == n. kInvalidArgument
// "invalid-proof-request" unless m <= n.
Result<std::vector<std::string>> ConsistencyProof(NodeReader& nodes, uint64_t m, uint64_t n);

// RFC 9162 2.1.3.2: the root the proof leads to from leaf `index` of a tree of `size`.
// kInvalidArgument "invalid-proof" when the proof's shape does not fit (index >= size, a hash not
// 32 bytes, too many or too few hashes).
Result<std::string> RootFromInclusion(uint64_t index, uint64_t size, std::string_view leaf_hash,
                                      const std::vector<std::string>& proof);
// OK iff the proof shows leaf_hash at `index` of the tree of `size` whose root is `root`;
// else kInvalidArgument "invalid-proof" saying why (the shape, or "the proof leads to root <x>").
Status VerifyInclusion(uint64_t index, uint64_t size, std::string_view leaf_hash,
                       const std::vector<std::string>& proof, std::string_view root);
// RFC 9162 2.1.4.2: OK iff the tree of size m with root root_m is a prefix of the tree of size
// n with root root_n. m == n: the proof must be empty and the roots equal; m == 0: the proof
// must be empty. Else kInvalidArgument "invalid-proof".
Status VerifyConsistency(uint64_t m, uint64_t n, const std::vector<std::string>& proof, std::string_view root_m,
                         std::string_view root_n);

// All node hashes of a tree in memory (level 0: the leaf hashes): for tests, tools and the
// publisher's tiles. Node() of a subtree that is not complete is kNotFound "no-node".
class MemoryTree : public NodeReader {
 public:
  void Append(std::string_view leaf_hash);
  uint64_t size() const { return levels_.empty() ? 0 : levels_[0].size(); }
  Result<std::string> Node(int level, uint64_t index) override;

 private:
  std::vector<std::vector<std::string>> levels_;  // levels_[l][i]: Node(l, i), complete ones only
};

}  // namespace oml::merkle
