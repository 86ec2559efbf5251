// The Merkle tree against RFC 9162's reference tree (the 8-leaf vectors Certificate
// Transparency implementations publish: transparency-dev/merkle testonly/constants.go and
// proof/verify_test.go, used as data), and against the RFC's recursive definitions written out
// naively here, for every tree size 1..300 and every pair of sizes; every tampered proof fails.
#include "merkle/merkle.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "crypto/crypto.h"

namespace oml::merkle {
namespace {

std::string Unhex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}
std::vector<std::string> Unhexes(std::initializer_list<const char*> hs) {
  std::vector<std::string> out;
  for (const char* h : hs) out.push_back(Unhex(h));
  return out;
}

const std::vector<std::string>& ReferenceLeaves() {
  static const auto* leaves = new std::vector<std::string>{
      Unhex(""), Unhex("00"), Unhex("10"), Unhex("2021"), Unhex("3031"), Unhex("40414243"),
      Unhex("5051525354555657"), Unhex("606162636465666768696a6b6c6d6e6f")};
  return *leaves;
}
const char* kReferenceRoots[] = {
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
};

MemoryTree ReferenceTree() {
  MemoryTree t;
  for (const auto& e : ReferenceLeaves()) t.Append(HashLeaf(e));
  return t;
}

TEST(MerkleTest, RootsOfTheReferenceTreeForEverySize) {
  MemoryTree t;
  CompactRange c;
  EXPECT_EQ(crypto::Hex(EmptyRoot()), kReferenceRoots[0]);
  EXPECT_EQ(crypto::Hex(c.Root()), kReferenceRoots[0]);
  for (size_t n = 1; n <= 8; ++n) {
    t.Append(HashLeaf(ReferenceLeaves()[n - 1]));
    c.Append(HashLeaf(ReferenceLeaves()[n - 1]));
    EXPECT_EQ(crypto::Hex(c.Root()), kReferenceRoots[n]) << n;
    EXPECT_EQ(crypto::Hex(RootAt(t, n).value()), kReferenceRoots[n]) << n;
  }
}

TEST(MerkleTest, NodeHashesAndCompactRangesOfTheReferenceTree) {
  MemoryTree t = ReferenceTree();
  const std::vector<std::vector<const char*>> nodes = {
      {"6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
       "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
       "0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7",
       "07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7",
       "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
       "4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658",
       "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
       "46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1"},
      {"fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
       "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
       "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
       "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"},
      {"d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
       "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"},
      {"5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"}};
  for (size_t l = 0; l < nodes.size(); ++l)
    for (size_t i = 0; i < nodes[l].size(); ++i)
      EXPECT_EQ(crypto::Hex(t.Node(static_cast<int>(l), i).value()), nodes[l][i]) << l << "," << i;
  EXPECT_EQ(t.Node(4, 0).status().type(), "no-node");
  // The compact range of each size: the perfect subtrees of its set bits, largest first.
  const std::vector<std::vector<std::pair<int, int>>> compact = {
      {}, {{0, 0}}, {{1, 0}}, {{1, 0}, {0, 2}}, {{2, 0}}, {{2, 0}, {0, 4}}, {{2, 0}, {1, 2}},
      {{2, 0}, {1, 2}, {0, 6}}, {{3, 0}}};
  CompactRange c;
  for (size_t n = 0; n <= 8; ++n) {
    if (n > 0) c.Append(HashLeaf(ReferenceLeaves()[n - 1]));
    std::vector<std::string> want;
    for (auto [l, i] : compact[n]) want.push_back(Unhex(nodes[l][i]));
    EXPECT_EQ(c.hashes(), want) << n;
    auto back = CompactRange::Decode(n, c.Encode());
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->Root(), c.Root());
    EXPECT_EQ(back->size(), n);
  }
  EXPECT_EQ(CompactRange::Decode(7, std::string(64, 'x')).status().type(), "invalid-compact-range");
  // Appending to a decoded range continues the tree.
  auto six = CompactRange::Decode(6, Unhex(std::string(nodes[2][0]) + nodes[1][2]));
  ASSERT_TRUE(six.ok());
  six->Append(HashLeaf(ReferenceLeaves()[6]));
  six->Append(HashLeaf(ReferenceLeaves()[7]));
  EXPECT_EQ(crypto::Hex(six->Root()), kReferenceRoots[8]);
}

// The published vectors (leaf indexes 0-based here; the Go tests number leaves from 1).
TEST(MerkleTest, PublishedInclusionAndConsistencyProofs) {
  MemoryTree t = ReferenceTree();
  struct Inclusion {
    uint64_t index, size;
    std::vector<std::string> proof;
  };
  const std::vector<Inclusion> inclusion = {
      {0, 1, {}},
      {0, 8, Unhexes({"96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                      "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                      "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"})},
      {5, 8, Unhexes({"bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                      "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                      "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"})},
      {2, 3, Unhexes({"fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"})},
      {1, 5, Unhexes({"6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
                      "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                      "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"})},
  };
  for (const auto& v : inclusion) {
    EXPECT_EQ(InclusionProof(t, v.index, v.size).value(), v.proof) << v.index << "/" << v.size;
    const std::string leaf = HashLeaf(ReferenceLeaves()[v.index]), root = Unhex(kReferenceRoots[v.size]);
    EXPECT_TRUE(VerifyInclusion(v.index, v.size, leaf, v.proof, root).ok());
    // The probes of transparency-dev/merkle's verifierCheck: wrong index, size, leaf, root.
    if (v.size == 1) continue;
    EXPECT_FALSE(VerifyInclusion(v.index - 1, v.size, leaf, v.proof, root).ok());
    EXPECT_FALSE(VerifyInclusion(v.index + 1, v.size, leaf, v.proof, root).ok());
    EXPECT_FALSE(VerifyInclusion(v.index ^ 2, v.size, leaf, v.proof, root).ok());
    EXPECT_FALSE(VerifyInclusion(v.index, v.size * 2, leaf, v.proof, root).ok());
    EXPECT_FALSE(VerifyInclusion(v.index, v.size / 2, leaf, v.proof, root).ok());
    EXPECT_FALSE(VerifyInclusion(v.index, v.size, HashLeaf("WrongLeaf"), v.proof, root).ok());
    EXPECT_FALSE(VerifyInclusion(v.index, v.size, leaf, v.proof, EmptyRoot()).ok());
  }
  struct Consistency {
    uint64_t m, n;
    std::vector<std::string> proof;
  };
  const std::vector<Consistency> consistency = {
      {1, 1, {}},
      {1, 8, Unhexes({"96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                      "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                      "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"})},
      {6, 8, Unhexes({"0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                      "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                      "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"})},
      {2, 5, Unhexes({"5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                      "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"})},
      {6, 7, Unhexes({"0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                      "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
                      "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"})},
  };
  for (const auto& v : consistency) {
    EXPECT_EQ(ConsistencyProof(t, v.m, v.n).value(), v.proof) << v.m << "->" << v.n;
    EXPECT_TRUE(VerifyConsistency(v.m, v.n, v.proof, Unhex(kReferenceRoots[v.m]), Unhex(kReferenceRoots[v.n])).ok())
        << v.m << "->" << v.n;
  }
}

// The corner cases a verifier must refuse (transparency-dev/merkle's TestVerifyConsistency and
// TestVerifyInclusion probes, as data).
TEST(MerkleTest, DegenerateProofsAreRefused) {
  const std::string some = Unhex("abacaba000000000000000000000000000000000000000000060061e00123456");
  const std::string empty = EmptyRoot();
  const std::string r1 = crypto::Sha256("don't care 1"), r2 = crypto::Sha256("don't care 2");
  EXPECT_FALSE(VerifyConsistency(0, 0, {}, r1, r2).ok());
  EXPECT_FALSE(VerifyConsistency(1, 1, {}, r1, r2).ok());
  EXPECT_TRUE(VerifyConsistency(0, 0, {}, r1, r1).ok());
  EXPECT_TRUE(VerifyConsistency(0, 1, {}, r1, r2).ok());
  EXPECT_TRUE(VerifyConsistency(1, 1, {}, r2, r2).ok());
  EXPECT_FALSE(VerifyConsistency(1, 0, {}, r1, r2).ok());
  EXPECT_FALSE(VerifyConsistency(2, 1, {}, r1, r2).ok());
  EXPECT_FALSE(VerifyConsistency(1, 2, {}, r1, r2).ok());
  EXPECT_FALSE(VerifyConsistency(0, 0, {empty}, empty, empty).ok());
  EXPECT_FALSE(VerifyConsistency(0, 1, {empty}, empty, empty).ok());
  EXPECT_FALSE(VerifyConsistency(1, 1, {empty}, empty, empty).ok());
  for (auto [index, size] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 0}, {1, 0}, {2, 1}}) {
    EXPECT_EQ(VerifyInclusion(index, size, some, {}, empty).type(), "invalid-proof");
  }
  EXPECT_TRUE(VerifyInclusion(0, 1, HashLeaf("data"), {}, HashLeaf("data")).ok());
  EXPECT_FALSE(VerifyInclusion(0, 1, "", {}, HashLeaf("data")).ok());
  EXPECT_FALSE(VerifyInclusion(0, 1, HashLeaf("data"), {}, "").ok());
  EXPECT_EQ(InclusionProof(*new MemoryTree(), 0, 0).status().type(), "invalid-proof-request");
}

// The RFC's definitions, written out naively over the leaf hashes (no nodes, no shortcuts).
// (Memoized per range, or the all-pairs test would take seconds; the value is the definition's.)
std::string NaiveMth(const std::vector<std::string>& d, size_t b, size_t e) {
  if (e - b == 0) return EmptyRoot();
  if (e - b == 1) return d[b];
  static std::map<std::tuple<const void*, size_t, size_t>, std::string> memo;
  auto key = std::make_tuple(static_cast<const void*>(&d), b, e);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  size_t k = 1;
  while (k * 2 < e - b) k *= 2;
  return memo[key] = HashChildren(NaiveMth(d, b, b + k), NaiveMth(d, b + k, e));
}
void NaivePath(const std::vector<std::string>& d, size_t m, size_t b, size_t e, std::vector<std::string>* out) {
  if (e - b <= 1) return;
  size_t k = 1;
  while (k * 2 < e - b) k *= 2;
  if (m < k) {
    NaivePath(d, m, b, b + k, out);
    out->push_back(NaiveMth(d, b + k, e));
  } else {
    NaivePath(d, m - k, b + k, e, out);
    out->push_back(NaiveMth(d, b, b + k));
  }
}
void NaiveSub(const std::vector<std::string>& d, size_t m, size_t b, size_t e, bool start, std::vector<std::string>* out) {
  if (m == e - b) {
    if (!start) out->push_back(NaiveMth(d, b, e));
    return;
  }
  size_t k = 1;
  while (k * 2 < e - b) k *= 2;
  if (m <= k) {
    NaiveSub(d, m, b, b + k, start, out);
    out->push_back(NaiveMth(d, b + k, e));
  } else {
    NaiveSub(d, m - k, b + k, e, false, out);
    out->push_back(NaiveMth(d, b, b + k));
  }
}

// Every tree of 1..300 leaves: roots, every leaf's inclusion proof and every pair's consistency
// proof equal the naive definitions and verify; a wrong sibling, index or size fails each.
TEST(MerkleTest, EverySizeUpTo300AndEveryPair) {
  constexpr size_t kMax = 300;
  std::vector<std::string> leaves;
  MemoryTree t;
  CompactRange c;
  std::vector<std::string> roots = {EmptyRoot()};
  for (size_t i = 0; i < kMax; ++i) {
    leaves.push_back(HashLeaf("entry " + std::to_string(i)));
    t.Append(leaves.back());
    c.Append(leaves.back());
    roots.push_back(c.Root());
  }
  size_t checked = 0;
  for (size_t n = 1; n <= kMax; ++n) {
    ASSERT_EQ(roots[n], NaiveMth(leaves, 0, n)) << n;
    ASSERT_EQ(RootAt(t, n).value(), roots[n]);
    for (size_t i = 0; i < n; ++i) {
      auto p = InclusionProof(t, i, n);
      ASSERT_TRUE(p.ok());
      std::vector<std::string> naive;
      NaivePath(leaves, i, 0, n, &naive);
      ASSERT_EQ(*p, naive) << i << "/" << n;
      ASSERT_TRUE(VerifyInclusion(i, n, leaves[i], *p, roots[n]).ok()) << i << "/" << n;
      // Tampered: each sibling, the index, the size, one hash more or less.
      for (size_t k = 0; k < p->size(); ++k) {
        auto bad = *p;
        bad[k][0] ^= 1;
        ASSERT_FALSE(VerifyInclusion(i, n, leaves[i], bad, roots[n]).ok());
      }
      if (n > 1) ASSERT_FALSE(VerifyInclusion((i + 1) % n, n, leaves[i], *p, roots[n]).ok());
      // Another size, with that size's root (a proof is checked against a checkpoint: its size
      // and root come together). Against the same root a size can coincide: leaf 0's path in a
      // tree of 3 also folds to the 3-leaf root when read as a tree of 4.
      if (n < kMax) ASSERT_FALSE(VerifyInclusion(i, n + 1, leaves[i], *p, roots[n + 1]).ok()) << i << "/" << n;
      if (i < n - 1) ASSERT_FALSE(VerifyInclusion(i, n - 1, leaves[i], *p, roots[n - 1]).ok()) << i << "/" << n;
      if (!p->empty()) {
        auto shorter = *p;
        shorter.pop_back();
        ASSERT_FALSE(VerifyInclusion(i, n, leaves[i], shorter, roots[n]).ok());
      }
      auto longer = *p;
      longer.push_back(roots[n]);
      ASSERT_FALSE(VerifyInclusion(i, n, leaves[i], longer, roots[n]).ok());
      ++checked;
    }
    for (size_t m = 1; m < n; ++m) {
      auto p = ConsistencyProof(t, m, n);
      ASSERT_TRUE(p.ok());
      std::vector<std::string> naive;
      NaiveSub(leaves, m, 0, n, true, &naive);
      ASSERT_EQ(*p, naive) << m << "->" << n;
      ASSERT_TRUE(VerifyConsistency(m, n, *p, roots[m], roots[n]).ok()) << m << "->" << n;
      for (size_t k = 0; k < p->size(); ++k) {
        auto bad = *p;
        bad[k][0] ^= 1;
        ASSERT_FALSE(VerifyConsistency(m, n, bad, roots[m], roots[n]).ok()) << m << "->" << n << " at " << k;
      }
      ASSERT_FALSE(VerifyConsistency(m, n, *p, roots[m - 1], roots[n]).ok());
      ASSERT_FALSE(VerifyConsistency(m, n, *p, roots[m], roots[n - 1]).ok());
      if (m + 1 < n) ASSERT_FALSE(VerifyConsistency(m + 1, n, *p, roots[m + 1], roots[n]).ok()) << m << "->" << n;
      if (m > 1) ASSERT_FALSE(VerifyConsistency(m - 1, n, *p, roots[m - 1], roots[n]).ok()) << m << "->" << n;
      auto shorter = *p;
      shorter.pop_back();
      ASSERT_FALSE(VerifyConsistency(m, n, shorter, roots[m], roots[n]).ok());
      ++checked;
    }
  }
  EXPECT_EQ(checked, kMax * (kMax + 1) / 2 + kMax * (kMax - 1) / 2);
}

}  // namespace
}  // namespace oml::merkle
