// C2SP signed notes, checkpoints and tlog-proofs against the vectors golang.org/x/mod/sumdb/note
// (v0.43.0, note_test.go) and transparency-dev/formats (v0.1.1) publish: the same keys must give
// the same key hashes and the same signed bytes, and every malformed note they refuse is refused
// here with the same reason. (tests/test_tlog_crosscheck.py then runs those modules themselves
// over what oml writes.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "crypto/crypto.h"
#include "merkle/merkle.h"
#include "tlog/checkpoint.h"
#include "tlog/note.h"

namespace oml::tlog {
namespace {

const std::string kPeterVkey = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
const std::string kPeterSeedB64 = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";  // type byte 0x01 + seed
const std::string kEnochVkey = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop";
const std::string kText =
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n";
const std::string kPeterSig =
    "\xE2\x80\x94 PeterNeumann "
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
const std::string kEnochSig =
    "\xE2\x80\x94 EnochRoot "
    "rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n";

NoteKey Key(const std::string& vkey) {
  auto k = ParseVerifierKey(vkey);
  EXPECT_TRUE(k.ok()) << vkey << ": " << k.status().ToString();
  return k.ok() ? *k : NoteKey{};
}

crypto::SigningKey PeterKey() {
  auto seed = crypto::FromBase64(kPeterSeedB64);
  EXPECT_TRUE(seed.ok());
  auto k = crypto::SigningKey::FromSeed(seed->substr(1));
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  return std::move(*k);
}

TEST(NoteKeyTest, VerifierKeysParseAndEveryManglingIsRefused) {
  NoteKey peter = Key(kPeterVkey);
  EXPECT_EQ(peter.name, "PeterNeumann");
  EXPECT_EQ(peter.hash, 0xc74f20a3u);
  EXPECT_EQ(peter.alg, kAlgEd25519);
  EXPECT_EQ(EncodeVerifierKey(peter), kPeterVkey);
  // The private key's public half is the verifier key's.
  EXPECT_EQ(EncodeVerifierKey(MakeNoteKey("PeterNeumann", PeterKey().public_key())), kPeterVkey);
  // A cosignature/v1 key (type 0x04) from transparency-dev/formats' tests.
  NoteKey remora = Key("remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2");
  EXPECT_EQ(remora.alg, kAlgCosignatureV1);
  EXPECT_EQ(remora.hash, 0xda77ade7u);

  // x/mod's TestNewVerifier: every proper substring and every byte + 1.
  for (size_t i = 0; i <= kPeterVkey.size(); ++i)
    for (size_t j = i + 1; j <= kPeterVkey.size(); ++j) {
      if (i == 0 && j == kPeterVkey.size()) continue;
      auto k = ParseVerifierKey(kPeterVkey.substr(i, j - i));
      EXPECT_FALSE(k.ok()) << kPeterVkey.substr(i, j - i);
      if (!k.ok()) {
        EXPECT_EQ(k.status().type(), "invalid-verifier-key");
      }
    }
  for (size_t i = 0; i < kPeterVkey.size(); ++i) {
    std::string b = kPeterVkey;
    ++b[i];
    EXPECT_FALSE(ParseVerifierKey(b).ok()) << b;
  }
  // Wrong length key and unknown type, each with the hash adjusted to match.
  EXPECT_FALSE(ParseVerifierKey("PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==").ok());
  EXPECT_FALSE(ParseVerifierKey("PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW").ok());
}

TEST(NoteKeyTest, KeyNamesFollowGosRule) {
  EXPECT_TRUE(IsValidKeyName("PeterNeumann"));
  EXPECT_TRUE(IsValidKeyName("oml.example.com/tenant/0b0c"));
  EXPECT_TRUE(IsValidKeyName("\xC3\xA9t\xC3\xA9"));  // "été"
  for (std::string bad : {std::string(), std::string("a b"), std::string("a+b"), std::string("a\tb"),
                          std::string("a\xC2\xA0" "b"),       // U+00A0
                          std::string("a\xE2\x80\x83" "b"),   // U+2003
                          std::string("a\xE3\x80\x80" "b"),   // U+3000
                          std::string("a\xC2\x85" "b"),       // U+0085
                          std::string("a\xFF" "b"), std::string("a\xC0\xAF" "b"),  // not UTF-8, overlong
                          std::string("a\xED\xA0\x80" "b")})  // a surrogate
    EXPECT_FALSE(IsValidKeyName(bad)) << crypto::Hex(bad);
}

TEST(NoteTest, SignGivesXModsBytes) {
  auto msg = SignNote(kText, "PeterNeumann", PeterKey());
  ASSERT_TRUE(msg.ok()) << msg.status().ToString();
  EXPECT_EQ(*msg, kText + "\n" + kPeterSig);
  EXPECT_EQ(SignNote("no newline", "PeterNeumann", PeterKey()).status().type(), "malformed-note");
  EXPECT_EQ(SignNote(kText, "Peter Neumann", PeterKey()).status().type(), "invalid-key-name");
}

TEST(NoteTest, OpenFollowsXModsOpen) {
  const NoteKey peter = Key(kPeterVkey), enoch = Key(kEnochVkey);
  // One verified, one not.
  auto n = OpenNote(kText + "\n" + kPeterSig + kEnochSig, {peter});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->text, kText);
  ASSERT_EQ(n->verified.size(), 1u);
  EXPECT_EQ(n->verified[0].name, "PeterNeumann");
  EXPECT_EQ(n->verified[0].hash, 0xc74f20a3u);
  ASSERT_EQ(n->unverified.size(), 1u);
  EXPECT_EQ(n->unverified[0].name, "EnochRoot");
  EXPECT_EQ(n->unverified[0].hash, 0xaf0cfe78u);
  // Both verified.
  n = OpenNote(kText + "\n" + kPeterSig + kEnochSig, {peter, enoch});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->verified.size(), 2u);
  EXPECT_TRUE(n->unverified.empty());
  // Neither.
  auto none = OpenNote(kText + "\n" + kPeterSig + kEnochSig, {});
  EXPECT_EQ(none.status().type(), "unverified-note");
  EXPECT_EQ(none.status().message(), "note has no verifiable signatures");
  // A duplicated key, used and unused.
  auto amb = OpenNote(kText + "\n" + kEnochSig, {enoch, peter, enoch});
  EXPECT_EQ(amb.status().type(), "ambiguous-key");
  EXPECT_EQ(amb.status().message(), "ambiguous key EnochRoot+af0cfe78");
  EXPECT_TRUE(OpenNote(kText + "\n" + kPeterSig, {enoch, peter, enoch}).ok());
  // Too many signatures, known or not.
  std::string many;
  for (int i = 0; i < 101; ++i) many += kPeterSig;
  EXPECT_EQ(OpenNote(kText + "\n" + many, {peter}).status().type(), "malformed-note");
  EXPECT_EQ(OpenNote(kText + "\n" + many, {}).status().type(), "malformed-note");
  // A known key's bad signature fails the note.
  auto inv = OpenNote(kText + "\n" + kPeterSig.substr(0, 60) + "ABCD" + kPeterSig.substr(60), {peter});
  EXPECT_EQ(inv.status().type(), "invalid-signature");
  EXPECT_EQ(inv.status().message(), "invalid signature for key PeterNeumann+c74f20a3");
  // Duplicates: each verified key once, each unverified line once.
  n = OpenNote(kText + "\n" + kPeterSig + kPeterSig + kEnochSig + kEnochSig + kEnochSig.substr(0, 60) + "ABCD" +
                   kEnochSig.substr(60),
               {peter});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->verified.size(), 1u);
  ASSERT_EQ(n->unverified.size(), 2u);
  EXPECT_EQ(n->unverified[1].base64,
            "rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5nABCD2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=");
  // x/mod's malformed messages.
  for (const std::string& bad :
       {kText, kText + "\n", kText + "\n" + kPeterSig.substr(0, kPeterSig.size() - 1), "\x01" + kText + "\n" + kPeterSig,
        "\xff" + kText + "\n" + kPeterSig,
        kText + "\n" + "\xE2\x80\x94 Bad Name x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=",
        kText + "\n" + kPeterSig + "Unexpected line.\n"}) {
    auto r = OpenNote(bad, {peter});
    EXPECT_EQ(r.status().type(), "malformed-note") << bad;
  }
  EXPECT_EQ(OpenNote(std::string(kMaxNoteBytes + 1, 'a'), {peter}).status().type(), "malformed-note");
  // Base64 as Go reads it (not strict): padding bits that are not zero give the same bytes, so
  // x/mod verifies "...nAN=" as it does "...nAM=", and so does OpenNote.
  std::string loose = kPeterSig;
  loose.replace(loose.find("nAM="), 4, "nAN=");
  n = OpenNote(kText + "\n" + loose, {peter});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->verified.size(), 1u);
  // Go parses the key hash with ParseUint(.., 16, ..): upper case is the same key.
  EXPECT_TRUE(ParseVerifierKey("PeterNeumann+C74F20A3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW").ok());
}

TEST(NoteTest, CosignaturesVerifyOnlyAsCosignaturesAndCarryTheirTime) {
  auto signer = crypto::SigningKey::Generate();
  ASSERT_TRUE(signer.ok());
  const std::string body = "example.com/log\n42\n" + crypto::Base64(std::string(32, '\x07')) + "\n";
  auto line = CosignatureLine(body, "witness.example", *signer, 1700000000);
  ASSERT_TRUE(line.ok());
  const NoteKey cosig = MakeNoteKey("witness.example", signer->public_key(), kAlgCosignatureV1);
  const NoteKey plain = MakeNoteKey("witness.example", signer->public_key(), kAlgEd25519);
  EXPECT_NE(cosig.hash, plain.hash);  // the type byte is in the key hash
  auto n = OpenNote(body + "\n" + *line, {cosig});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_EQ(n->cosigned_at.size(), 1u);
  EXPECT_EQ(n->cosigned_at[0], 1700000000u);
  // Under the plain key it is someone else's signature; a changed time does not verify.
  EXPECT_EQ(OpenNote(body + "\n" + *line, {plain}).status().type(), "unverified-note");
  auto raw = crypto::FromBase64(line->substr(line->rfind(' ') + 1, line->size() - line->rfind(' ') - 2));
  ASSERT_TRUE(raw.ok());
  std::string moved = *raw;
  moved[4 + 7] ^= 1;
  EXPECT_EQ(OpenNote(body + "\n" + SignatureLine("witness.example", cosig.hash, moved.substr(4)), {cosig}).status().type(),
            "invalid-signature");
  EXPECT_EQ(CosignedMessage(body, 1700000000), "cosignature/v1\ntime 1700000000\n" + body);
  // formats' rule: a cosigned text has at least three lines; fewer is neither signed nor accepted.
  EXPECT_EQ(CosignatureLine("a\nb", "witness.example", *signer, 1).status().type(), "malformed-note");
  EXPECT_EQ(CosignatureLine("a\n", "witness.example", *signer, 1).status().type(), "malformed-note");
  const std::string two = "a\n";
  const std::string forged = std::string(8, '\0') + signer->Sign(CosignedMessage(two, 0));
  EXPECT_EQ(OpenNote(two + "\n" + SignatureLine("witness.example", cosig.hash, forged), {cosig}).status().type(),
            "invalid-signature");
}

TEST(CheckpointTest, BodiesRoundTripAndMalformedOnesAreNamed) {
  Checkpoint c{"oml.example/0b0c", 12345, std::string(32, '\x01'), {"ext one", "ext two"}};
  const std::string body = EncodeCheckpoint(c);
  EXPECT_EQ(body, "oml.example/0b0c\n12345\nAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\next one\next two\n");
  auto back = ParseCheckpoint(body);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->origin, c.origin);
  EXPECT_EQ(back->size, c.size);
  EXPECT_EQ(back->root, c.root);
  EXPECT_EQ(back->extensions, c.extensions);
  const std::string root = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
  for (const std::string& bad : {std::string("o\n1\n") + root, std::string("\n1\n") + root + "\n",
                                 std::string("o\n01\n") + root + "\n", std::string("o\n-1\n") + root + "\n",
                                 std::string("o\n18446744073709551616\n") + root + "\n",
                                 std::string("o\n1\nAQE=\n"), std::string("o\n1\n") + root + "\n\n",
                                 std::string("o\n1 \n") + root + "\n"})
    EXPECT_EQ(ParseCheckpoint(bad).status().type(), "malformed-checkpoint") << bad;
  EXPECT_TRUE(ParseCheckpoint("o\n0\n" + crypto::Base64(merkle::EmptyRoot()) + "\n").ok());
  EXPECT_TRUE(ParseCheckpoint("o\n18446744073709551615\n" + root + "\n").ok());
}

TEST(TlogProofTest, RoundTripAndMalformedOnesAreNamed) {
  TlogProof p;
  p.index = 7;
  p.hashes = {std::string(32, 'a'), std::string(32, 'b')};
  p.checkpoint = "o\n8\n" + crypto::Base64(std::string(32, 'r')) + "\n\n" + kPeterSig;
  const std::string text = EncodeTlogProof(p);
  EXPECT_EQ(text.substr(0, 31), "c2sp.org/tlog-proof@v1\nindex 7\n");
  auto back = ParseTlogProof(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->index, 7u);
  EXPECT_EQ(back->hashes, p.hashes);
  EXPECT_EQ(back->checkpoint, p.checkpoint);
  EXPECT_FALSE(back->extra.has_value());
  p.extra = "extra bytes";
  p.hashes.clear();  // index 0 of a one-leaf tree: an empty path
  back = ParseTlogProof(EncodeTlogProof(p));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->extra, "extra bytes");
  EXPECT_TRUE(back->hashes.empty());
  for (const std::string& bad : {std::string("c2sp.org/tlog-proof@v2\nindex 1\n\nx"), std::string("c2sp.org/tlog-proof@v1\n"),
                                 std::string("c2sp.org/tlog-proof@v1\nindex x\n\nx"),
                                 std::string("c2sp.org/tlog-proof@v1\nindex 1\nAQE=\n\nx"),
                                 std::string("c2sp.org/tlog-proof@v1\nindex 1\n"),
                                 std::string("c2sp.org/tlog-proof@v1\nindex 1\n\n")})
    EXPECT_EQ(ParseTlogProof(bad).status().type(), "malformed-proof") << bad;
}

TEST(VerifyTlogProofTest, AcceptsTheProofAndNamesEachWrongPart) {
  auto key = crypto::SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  merkle::MemoryTree tree;
  std::vector<std::string> entries;
  for (int i = 0; i < 13; ++i) {
    entries.push_back("entry " + std::to_string(i));
    tree.Append(merkle::HashLeaf(entries.back()));
  }
  const std::string origin = "oml.test/t1";
  auto note = SignNote(EncodeCheckpoint({origin, 13, merkle::RootAt(tree, 13).value(), {}}), origin, *key);
  ASSERT_TRUE(note.ok());
  TlogProof p;
  p.index = 6;
  p.hashes = merkle::InclusionProof(tree, 6, 13).value();
  p.checkpoint = *note;
  const NoteKey nk = MakeNoteKey(origin, key->public_key());
  auto ok = VerifyTlogProof(EncodeTlogProof(p), entries[6], 6, nk, origin);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size, 13u);
  EXPECT_EQ(VerifyTlogProof(EncodeTlogProof(p), entries[6], 7, nk, origin).status().type(), "wrong-index");
  EXPECT_EQ(VerifyTlogProof(EncodeTlogProof(p), entries[7], 6, nk, origin).status().type(), "invalid-proof");
  EXPECT_EQ(VerifyTlogProof(EncodeTlogProof(p), entries[6], 6, nk, "oml.test/t2").status().type(), "wrong-origin");
  EXPECT_EQ(VerifyTlogProof(EncodeTlogProof(p), entries[6], 6, MakeNoteKey("oml.test/t2", key->public_key()), origin)
                .status()
                .type(),
            "unverified-note");
  TlogProof short_path = p;
  short_path.hashes.pop_back();
  EXPECT_EQ(VerifyTlogProof(EncodeTlogProof(short_path), entries[6], 6, nk, origin).status().type(), "invalid-proof");
  EXPECT_EQ(VerifyTlogProof("garbage", entries[6], 6, nk, origin).status().type(), "malformed-proof");
}

TEST(VerifyCheckpointConsistencyTest, EveryPairOfSizesAndEachWrongPartNamed) {
  auto key = crypto::SigningKey::Generate().value();
  auto wkey = crypto::SigningKey::Generate().value();
  merkle::MemoryTree tree;
  for (int i = 0; i < 40; ++i) tree.Append(merkle::HashLeaf("entry " + std::to_string(i)));
  const std::string origin = "oml.test/t1";
  auto note = [&](uint64_t size, const std::string& o = "oml.test/t1") {
    return SignNote(EncodeCheckpoint({o, size, merkle::RootAt(tree, size).value(), {}}), o, key).value();
  };
  for (uint64_t m = 0; m <= 40; ++m) {
    for (uint64_t n = m; n <= 40; ++n) {
      const auto proof = merkle::ConsistencyProof(tree, m, n).value();
      auto ok = VerifyCheckpointConsistency(note(m), note(n), proof, key.public_key());
      ASSERT_TRUE(ok.ok()) << m << " -> " << n << ": " << ok.status().ToString();
      EXPECT_EQ(ok->size, n);
    }
  }
  const auto proof = merkle::ConsistencyProof(tree, 13, 29).value();
  auto wrong = proof;
  wrong[0][3] ^= 1;
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), note(29), wrong, key.public_key()).status().type(), "invalid-proof");
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), note(30), proof, key.public_key()).status().type(), "invalid-proof");
  EXPECT_EQ(VerifyCheckpointConsistency(note(29), note(13), proof, key.public_key()).status().message(),
            "the new checkpoint's size 13 is below the old one's 29");
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), note(29, "oml.test/t2"), proof, key.public_key()).status().message(),
            "the new checkpoint's origin is oml.test/t2, not oml.test/t1");
  auto stranger = crypto::SigningKey::Generate().value();
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), note(29), proof, stranger.public_key()).status().type(), "unverified-note");
  // Another tree at the new size, signed by the log's own key: the proof does not lead to it.
  const std::string forked =
      SignNote(EncodeCheckpoint({origin, 29, merkle::HashLeaf("x"), {}}), origin, key).value();
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), forked, proof, key.public_key()).status().type(), "invalid-proof");
  // Cosigners: each one given must have cosigned the new checkpoint.
  const NoteKey w = MakeNoteKey("witness.test/w1", wkey.public_key(), kAlgCosignatureV1);
  const std::string n29 = note(29);
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), n29, proof, key.public_key(), {w}).status().message(),
            "the new checkpoint has no cosignature by witness.test/w1");
  const std::string cosigned = n29 + CosignatureLine(NoteText(n29), "witness.test/w1", wkey, 1700000000).value();
  EXPECT_TRUE(VerifyCheckpointConsistency(note(13), cosigned, proof, key.public_key(), {w}).ok());
  // Under the witness's name by another key (another key hash): not its cosignature.
  const std::string by_other = n29 + CosignatureLine(NoteText(n29), "witness.test/w1", stranger, 1700000000).value();
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), by_other, proof, key.public_key(), {w}).status().type(),
            "missing-cosignature");
  // Its key hash with a signature that does not verify: the note is refused.
  std::string line = CosignatureLine(NoteText(n29), "witness.test/w1", wkey, 1700000000).value();
  const size_t b64 = line.rfind(' ') + 1;
  std::string raw = crypto::FromBase64(line.substr(b64, line.size() - b64 - 1)).value();
  raw[20] ^= 1;
  line = line.substr(0, b64) + crypto::Base64(raw) + "\n";
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), n29 + line, proof, key.public_key(), {w}).status().type(),
            "invalid-signature");
  EXPECT_EQ(VerifyCheckpointConsistency("junk", n29, proof, key.public_key()).status().type(), "malformed-checkpoint");
  // A cosigner's key named as the origin does not stand in for the log's signature.
  const NoteKey impostor = MakeNoteKey(origin, wkey.public_key(), kAlgCosignatureV1);
  const std::string text29 = std::string(NoteText(n29));
  const std::string only_cosigned = text29 + "\n" + CosignatureLine(text29, origin, wkey, 1700000000).value();
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), only_cosigned, proof, key.public_key(), {impostor}).status().message(),
            "the checkpoint is not signed by the log's key under oml.test/t1");
  // Across a key rotation: the older checkpoint under the older key.
  auto rotated = crypto::SigningKey::Generate().value();
  const std::string n29_new = SignNote(text29, origin, rotated).value();
  EXPECT_EQ(VerifyCheckpointConsistency(note(13), n29_new, proof, rotated.public_key()).status().type(), "unverified-note");
  auto across = VerifyCheckpointConsistency(note(13), n29_new, proof, rotated.public_key(), {}, key.public_key());
  ASSERT_TRUE(across.ok()) << across.status().ToString();
  EXPECT_EQ(across->size, 29u);
}

}  // namespace
}  // namespace oml::tlog
