// The C2SP tlog-witness's add-checkpoint, answer by answer, over a durable state directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "crypto/crypto.h"
#include "merkle/merkle.h"
#include "tlog/checkpoint.h"
#include "tlog/note.h"
#include "tlog/witness.h"

namespace oml::tlog {
namespace {

class WitnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("witness-" + crypto::NewUuidV4());
    for (int i = 0; i < 20; ++i) tree_.Append(merkle::HashLeaf("entry " + std::to_string(i)));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Checkpoint(uint64_t size, std::string root = "") {
    if (root.empty()) root = merkle::RootAt(tree_, size).value();
    return SignNote(EncodeCheckpoint({kOrigin, size, root, {}}), kOrigin, *log_key_).value();
  }
  std::string Body(uint64_t old, const std::vector<std::string>& proof, const std::string& note) {
    std::string b = "old " + std::to_string(old) + "\n";
    for (const auto& h : proof) b += crypto::Base64(h) + "\n";
    return b + "\n" + note;
  }
  std::unique_ptr<Witness> Make(DirWitnessState* state) {
    return std::make_unique<Witness>(std::map<std::string, std::vector<NoteKey>>{
                                         {kOrigin, {MakeNoteKey(kOrigin, log_key_->public_key())}}},
                                     "witness.test/w1", &*witness_key_, state);
  }

  static constexpr const char* kOrigin = "oml.test/log1";
  std::filesystem::path dir_;
  merkle::MemoryTree tree_;
  Result<crypto::SigningKey> log_key_ = crypto::SigningKey::Generate();
  Result<crypto::SigningKey> witness_key_ = crypto::SigningKey::Generate();
};

TEST_F(WitnessTest, CosignsOnlyWhatExtendsWhatItCosignedAndRemembersItAcrossRestarts) {
  auto state = DirWitnessState::Open(dir_.string());
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  auto w = Make(state->get());
  const NoteKey cosig = MakeNoteKey("witness.test/w1", witness_key_->public_key(), kAlgCosignatureV1);
  EXPECT_EQ(ParseVerifierKey(w->VerifierKey())->hash, cosig.hash);
  // First contact: old 0.
  const std::string cp5 = Checkpoint(5);
  auto a = w->AddCheckpoint(Body(0, {}, cp5), 1700000000);
  ASSERT_EQ(a.status, 200) << a.body;
  auto opened = OpenNote(cp5 + a.body, {cosig});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(opened->cosigned_at, std::vector<uint64_t>{1700000000});
  // A client that does not know the recorded size: 409 with it.
  const std::string cp9 = Checkpoint(9);
  a = w->AddCheckpoint(Body(0, {}, cp9), 1700000001);
  EXPECT_EQ(a.status, 409);
  EXPECT_EQ(a.body, "5\n");
  EXPECT_EQ(a.content_type, "text/x.tlog.size");
  // With the consistency proof from 5: cosigned.
  a = w->AddCheckpoint(Body(5, merkle::ConsistencyProof(tree_, 5, 9).value(), cp9), 1700000002);
  ASSERT_EQ(a.status, 200) << a.body;
  // The same size with another root (a fork): 409, nothing recorded.
  std::string other = merkle::RootAt(tree_, 9).value();
  other[0] ^= 1;
  a = w->AddCheckpoint(Body(9, {}, Checkpoint(9, other)), 1700000003);
  EXPECT_EQ(a.status, 409);
  EXPECT_EQ(a.body, "9\n");
  // A wrong proof: 422; a rolled-back size: 409 (old is not the recorded one) or 400 (old above).
  auto bad = merkle::ConsistencyProof(tree_, 9, 12).value();
  bad[0][3] ^= 1;
  EXPECT_EQ(w->AddCheckpoint(Body(9, bad, Checkpoint(12)), 1).status, 422);
  EXPECT_EQ(w->AddCheckpoint(Body(9, merkle::ConsistencyProof(tree_, 9, 12).value(), Checkpoint(11)), 1).status, 422);
  EXPECT_EQ(w->AddCheckpoint(Body(5, merkle::ConsistencyProof(tree_, 5, 7).value(), Checkpoint(7)), 1).status, 409);
  EXPECT_EQ(w->AddCheckpoint(Body(12, {}, Checkpoint(9)), 1).status, 400);
  // Restarted (a new process over the same directory): it still holds 9.
  w.reset();
  state->reset();
  auto again = DirWitnessState::Open(dir_.string());
  ASSERT_TRUE(again.ok());
  w = Make(again->get());
  a = w->AddCheckpoint(Body(0, {}, Checkpoint(12)), 1);
  EXPECT_EQ(a.status, 409);
  EXPECT_EQ(a.body, "9\n");
  EXPECT_EQ(w->AddCheckpoint(Body(9, merkle::ConsistencyProof(tree_, 9, 12).value(), Checkpoint(12)), 1).status, 200);
}

// Two witness processes over one state directory (two instances, each with its own state
// handle): each decides from the record on disk under the lock, never from what it saw before.
TEST_F(WitnessTest, TwoProcessesOverOneStateDirectoryNeverRollTheLogBack) {
  auto sa = DirWitnessState::Open(dir_.string()), sb = DirWitnessState::Open(dir_.string());
  ASSERT_TRUE(sa.ok() && sb.ok());
  auto a = Make(sa->get()), b = Make(sb->get());
  ASSERT_EQ(a->AddCheckpoint(Body(0, {}, Checkpoint(5)), 1).status, 200);
  auto r = b->AddCheckpoint(Body(0, {}, Checkpoint(9)), 1);  // B never saw 5 itself
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.body, "5\n");
  ASSERT_EQ(b->AddCheckpoint(Body(5, merkle::ConsistencyProof(tree_, 5, 9).value(), Checkpoint(9)), 1).status, 200);
  // A, behind, cannot record 7 over B's 9 (the spec's rollback race).
  r = a->AddCheckpoint(Body(5, merkle::ConsistencyProof(tree_, 5, 7).value(), Checkpoint(7)), 1);
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.body, "9\n");
}

TEST_F(WitnessTest, RefusesUnknownLogsBadSignaturesAndMalformedBodies) {
  auto state = DirWitnessState::Open(dir_.string());
  ASSERT_TRUE(state.ok());
  auto w = Make(state->get());
  auto stranger = crypto::SigningKey::Generate();
  const std::string text = EncodeCheckpoint({kOrigin, 5, merkle::RootAt(tree_, 5).value(), {}});
  EXPECT_EQ(w->AddCheckpoint(Body(0, {}, SignNote(text, kOrigin, *stranger).value()), 1).status, 403);
  const std::string elsewhere = SignNote(EncodeCheckpoint({"elsewhere/log", 5, merkle::RootAt(tree_, 5).value(), {}}),
                                         "elsewhere/log", *log_key_).value();
  auto a = w->AddCheckpoint(Body(0, {}, elsewhere), 1);
  EXPECT_EQ(a.status, 404);
  EXPECT_EQ(a.body, "unknown log origin elsewhere/log\n");
  for (const std::string& bad : {std::string(""), std::string("old x\n\n") + Checkpoint(5), std::string("old 01\n\n") + Checkpoint(5),
                                 std::string("new 0\n\n") + Checkpoint(5), std::string("old 0\nAQE=\n\n") + Checkpoint(5),
                                 std::string("old 0\n") + Checkpoint(5), std::string("old 0\n\nnot a note\n")})
    EXPECT_EQ(w->AddCheckpoint(bad, 1).status, 400) << bad;
  std::string many = "old 0\n";
  for (int i = 0; i < 64; ++i) many += crypto::Base64(std::string(32, 'h')) + "\n";
  EXPECT_EQ(w->AddCheckpoint(many + "\n" + Checkpoint(5), 1).status, 400);
  // Nothing was recorded by any of them.
  EXPECT_EQ(w->AddCheckpoint(Body(0, {}, Checkpoint(5)), 1).status, 200);
}

TEST_F(WitnessTest, ADeploymentKeyWitnessesEveryLogUnderItsOriginAndNoOther) {
  auto state = DirWitnessState::Open(dir_.string());
  ASSERT_TRUE(state.ok());
  Witness w({}, "witness.test/w1", &*witness_key_, state->get(), {{"oml.test", {log_key_->public_key()}}});
  const NoteKey cosig = MakeNoteKey("witness.test/w1", witness_key_->public_key(), kAlgCosignatureV1);
  auto note = [&](const std::string& origin) {
    return SignNote(EncodeCheckpoint({origin, 3, merkle::RootAt(tree_, 3).value(), {}}), origin, *log_key_).value();
  };
  // Two chains of the deployment, each its own log (its own recorded size).
  for (const std::string origin : {"oml.test/tenant-a", "oml.test/tenant-b"}) {
    const std::string cp = note(origin);
    auto a = w.AddCheckpoint(Body(0, {}, cp), 1700000000);
    ASSERT_EQ(a.status, 200) << origin << ": " << a.body;
    EXPECT_TRUE(OpenNote(cp + a.body, {cosig}).ok());
    EXPECT_EQ(state->get()->Get(origin).value()->size, 3u);
  }
  // Not under the deployment's origin, or deeper than one name under it: unknown logs.
  for (const std::string origin : {"oml.other/tenant-a", "oml.test/a/b", "oml.testx/a"}) {
    auto a = w.AddCheckpoint(Body(0, {}, note(origin)), 1700000000);
    EXPECT_EQ(a.status, 404) << origin;
    EXPECT_EQ(a.body, "unknown log origin " + origin + "\n");
  }
  // Signed under the right name by another key: 403.
  auto stranger = crypto::SigningKey::Generate();
  const std::string origin = "oml.test/tenant-c";
  const std::string forged =
      SignNote(EncodeCheckpoint({origin, 3, merkle::RootAt(tree_, 3).value(), {}}), origin, *stranger).value();
  EXPECT_EQ(w.AddCheckpoint(Body(0, {}, forged), 1700000000).status, 403);
  EXPECT_FALSE(state->get()->Get(origin).value().has_value());
}

}  // namespace
}  // namespace oml::tlog
