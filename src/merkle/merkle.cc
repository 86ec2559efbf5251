#include "merkle/merkle.h"

#include <bit>

#include "crypto/crypto.h"

namespace oml::merkle {
namespace {

// The largest power of two below n (n >= 2): the RFC's split point k.
uint64_t Split(uint64_t n) { return std::bit_floor(n - 1); }

Status BadProof(const std::string& why) { return InvalidArgument(why, "invalid-proof"); }

Status CheckHash(std::string_view h, const char* what) {
  if (h.size() != kHashSize)
    return BadProof(std::string(what) + " is " + std::to_string(h.size()) + " bytes, not " + std::to_string(kHashSize));
  return Status::Ok();
}

Status Path(NodeReader& nodes, uint64_t m, uint64_t b, uint64_t e, std::vector<std::string>* out) {
  const uint64_t n = e - b;
  if (n == 1) return Status::Ok();
  const uint64_t k = Split(n);
  if (m < k) {
    OML_RETURN_IF_ERROR(Path(nodes, m, b, b + k, out));
    OML_ASSIGN_OR_RETURN(std::string h, RangeHash(nodes, b + k, e));
    out->push_back(std::move(h));
  } else {
    OML_RETURN_IF_ERROR(Path(nodes, m - k, b + k, e, out));
    OML_ASSIGN_OR_RETURN(std::string h, RangeHash(nodes, b, b + k));
    out->push_back(std::move(h));
  }
  return Status::Ok();
}

// SUBPROOF(m, D[b:e], start) of RFC 9162 2.1.4.1.
Status SubProof(NodeReader& nodes, uint64_t m, uint64_t b, uint64_t e, bool start, std::vector<std::string>* out) {
  const uint64_t n = e - b;
  if (m == n) {
    if (start) return Status::Ok();
    OML_ASSIGN_OR_RETURN(std::string h, RangeHash(nodes, b, e));
    out->push_back(std::move(h));
    return Status::Ok();
  }
  const uint64_t k = Split(n);
  if (m <= k) {
    OML_RETURN_IF_ERROR(SubProof(nodes, m, b, b + k, start, out));
    OML_ASSIGN_OR_RETURN(std::string h, RangeHash(nodes, b + k, e));
    out->push_back(std::move(h));
  } else {
    OML_RETURN_IF_ERROR(SubProof(nodes, m - k, b + k, e, false, out));
    OML_ASSIGN_OR_RETURN(std::string h, RangeHash(nodes, b, b + k));
    out->push_back(std::move(h));
  }
  return Status::Ok();
}

std::string Short(std::string_view h) { return crypto::Hex(h).substr(0, 16); }

// RFC 9162 2.1.3.2 / 2.1.4.2: "if LSB(fn) is not set, right-shift both fn and sn equally until
// either LSB(fn) is set or fn is 0" (the two verifiers share this step).
void ShiftToOddOrZero(uint64_t* fn, uint64_t* sn) {
  while (*fn != 0 && !(*fn & 1)) {
    *fn >>= 1;
    *sn >>= 1;
  }
}

}  // namespace

std::string HashLeaf(std::string_view entry) {
  std::string in;
  in.reserve(entry.size() + 1);
  in.push_back('\0');
  in.append(entry);
  return crypto::Sha256(in);
}

std::string HashChildren(std::string_view left, std::string_view right) {
  std::string in;
  in.reserve(1 + left.size() + right.size());
  in.push_back('\1');
  in.append(left);
  in.append(right);
  return crypto::Sha256(in);
}

std::string EmptyRoot() { return crypto::Sha256(""); }

Result<CompactRange> CompactRange::Decode(uint64_t size, std::string_view encoded) {
  const size_t want = static_cast<size_t>(std::popcount(size)) * kHashSize;
  if (encoded.size() != want)
    return InvalidArgument("a compact range of " + std::to_string(size) + " leaves is " + std::to_string(want) +
                               " bytes, not " + std::to_string(encoded.size()),
                           "invalid-compact-range");
  CompactRange r;
  r.size_ = size;
  for (size_t at = 0; at < encoded.size(); at += kHashSize) r.hashes_.emplace_back(encoded.substr(at, kHashSize));
  return r;
}

void CompactRange::Append(std::string_view leaf_hash) {
  // A binary counter: each trailing 1 bit of the old size is a perfect subtree that the new
  // leaf's subtree completes into one twice its size.
  std::string h(leaf_hash);
  for (uint64_t s = size_; s & 1; s >>= 1) {
    h = HashChildren(hashes_.back(), h);
    hashes_.pop_back();
  }
  hashes_.push_back(std::move(h));
  ++size_;
}

std::string CompactRange::Root() const {
  if (hashes_.empty()) return EmptyRoot();
  std::string r = hashes_.back();
  for (size_t i = hashes_.size() - 1; i-- > 0;) r = HashChildren(hashes_[i], r);
  return r;
}

std::string CompactRange::Encode() const {
  std::string out;
  out.reserve(hashes_.size() * kHashSize);
  for (const auto& h : hashes_) out += h;
  return out;
}

Result<std::string> RangeHash(NodeReader& nodes, uint64_t begin, uint64_t end) {
  if (begin >= end) return Internal("RangeHash of an empty range");
  const uint64_t n = end - begin;
  if (std::has_single_bit(n)) {
    if (begin % n != 0) return Internal("RangeHash of an unaligned perfect range");
    return nodes.Node(std::countr_zero(n), begin / n);
  }
  const uint64_t k = Split(n);
  OML_ASSIGN_OR_RETURN(std::string left, RangeHash(nodes, begin, begin + k));
  OML_ASSIGN_OR_RETURN(std::string right, RangeHash(nodes, begin + k, end));
  return HashChildren(left, right);
}

Result<std::string> RootAt(NodeReader& nodes, uint64_t size) {
  if (size == 0) return EmptyRoot();
  return RangeHash(nodes, 0, size);
}

Result<std::vector<std::string>> InclusionProof(NodeReader& nodes, uint64_t index, uint64_t size) {
  if (index >= size)
    return InvalidArgument("no leaf " + std::to_string(index) + " in a tree of " + std::to_string(size),
                           "invalid-proof-request");
  std::vector<std::string> out;
  OML_RETURN_IF_ERROR(Path(nodes, index, 0, size, &out));
  return out;
}

Result<std::vector<std::string>> ConsistencyProof(NodeReader& nodes, uint64_t m, uint64_t n) {
  if (m > n)
    return InvalidArgument("no consistency proof from " + std::to_string(m) + " to the smaller " + std::to_string(n),
                           "invalid-proof-request");
  std::vector<std::string> out;
  if (m == 0 || m == n) return out;
  OML_RETURN_IF_ERROR(SubProof(nodes, m, 0, n, true, &out));
  return out;
}

Result<std::string> RootFromInclusion(uint64_t index, uint64_t size, std::string_view leaf_hash,
                                      const std::vector<std::string>& proof) {
  if (index >= size) return BadProof("leaf " + std::to_string(index) + " is not in a tree of " + std::to_string(size));
  OML_RETURN_IF_ERROR(CheckHash(leaf_hash, "the leaf hash"));
  uint64_t fn = index, sn = size - 1;
  std::string r(leaf_hash);
  for (size_t i = 0; i < proof.size(); ++i) {
    OML_RETURN_IF_ERROR(CheckHash(proof[i], "a proof hash"));
    if (sn == 0) return BadProof("the proof has " + std::to_string(proof.size()) + " hashes, more than the tree needs");
    if ((fn & 1) || fn == sn) {
      r = HashChildren(proof[i], r);
      ShiftToOddOrZero(&fn, &sn);
    } else {
      r = HashChildren(r, proof[i]);
    }
    fn >>= 1;
    sn >>= 1;
  }
  if (sn != 0) return BadProof("the proof has " + std::to_string(proof.size()) + " hashes, fewer than the tree needs");
  return r;
}

Status VerifyInclusion(uint64_t index, uint64_t size, std::string_view leaf_hash, const std::vector<std::string>& proof,
                       std::string_view root) {
  OML_RETURN_IF_ERROR(CheckHash(root, "the root"));
  OML_ASSIGN_OR_RETURN(std::string got, RootFromInclusion(index, size, leaf_hash, proof));
  if (!crypto::ConstantTimeEquals(got, root))
    return BadProof("the inclusion proof of leaf " + std::to_string(index) + " leads to root " + Short(got) +
                    "..., not " + Short(root) + "...");
  return Status::Ok();
}

Status VerifyConsistency(uint64_t m, uint64_t n, const std::vector<std::string>& proof, std::string_view root_m,
                         std::string_view root_n) {
  if (m > n) return BadProof("size " + std::to_string(m) + " is larger than size " + std::to_string(n));
  if (m == n) {
    if (!proof.empty()) return BadProof("equal sizes take an empty proof");
    if (root_m != root_n) return BadProof("two trees of size " + std::to_string(m) + " with different roots");
    return Status::Ok();
  }
  if (m == 0) {
    if (!proof.empty()) return BadProof("a proof from the empty tree is empty");
    return Status::Ok();
  }
  OML_RETURN_IF_ERROR(CheckHash(root_m, "the first root"));
  OML_RETURN_IF_ERROR(CheckHash(root_n, "the second root"));
  if (proof.empty()) return BadProof("an empty proof between sizes " + std::to_string(m) + " and " + std::to_string(n));
  for (const auto& h : proof) OML_RETURN_IF_ERROR(CheckHash(h, "a proof hash"));
  // RFC 9162 2.1.4.2, step by step.
  std::vector<std::string_view> path;
  if (std::has_single_bit(m)) path.push_back(root_m);
  for (const auto& h : proof) path.push_back(h);
  uint64_t fn = m - 1, sn = n - 1;
  while (fn & 1) {
    fn >>= 1;
    sn >>= 1;
  }
  std::string fr(path[0]), sr(path[0]);
  for (size_t i = 1; i < path.size(); ++i) {
    if (sn == 0) return BadProof("the proof has more hashes than sizes " + std::to_string(m) + " and " +
                                 std::to_string(n) + " need");
    if ((fn & 1) || fn == sn) {
      fr = HashChildren(path[i], fr);
      sr = HashChildren(path[i], sr);
      ShiftToOddOrZero(&fn, &sn);
    } else {
      sr = HashChildren(sr, path[i]);
    }
    fn >>= 1;
    sn >>= 1;
  }
  if (sn != 0)
    return BadProof("the proof has fewer hashes than sizes " + std::to_string(m) + " and " + std::to_string(n) + " need");
  if (!crypto::ConstantTimeEquals(fr, root_m))
    return BadProof("the consistency proof leads to a first root " + Short(fr) + "..., not " + Short(root_m) + "...");
  if (!crypto::ConstantTimeEquals(sr, root_n))
    return BadProof("the consistency proof leads to a second root " + Short(sr) + "..., not " + Short(root_n) + "...");
  return Status::Ok();
}

void MemoryTree::Append(std::string_view leaf_hash) {
  if (levels_.empty()) levels_.emplace_back();
  levels_[0].emplace_back(leaf_hash);
  // Complete every perfect subtree this leaf closes.
  for (size_t l = 0; levels_[l].size() % 2 == 0; ++l) {
    if (levels_.size() == l + 1) levels_.emplace_back();
    const auto& lower = levels_[l];
    levels_[l + 1].push_back(HashChildren(lower[lower.size() - 2], lower.back()));
  }
}

Result<std::string> MemoryTree::Node(int level, uint64_t index) {
  if (level < 0 || static_cast<size_t>(level) >= levels_.size() || index >= levels_[level].size())
    return Status(Code::kNotFound, "no complete node (" + std::to_string(level) + ", " + std::to_string(index) + ")",
                  "no-node");
  return levels_[level][index];
}

}  // namespace oml::merkle
