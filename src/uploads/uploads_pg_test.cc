// Upload sessions on a real PostgreSQL cluster and a local-directory quarantine bucket: resume
// from the row alone, the stored object decrypts to the file, every fault leaves the offset where
// it was and no part or object behind, races, expiry, the sweep.
#include "uploads/uploads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "blob/object_store_testing.h"
#include "common/sync_point_testing.h"
#include "common/temp_dir_testing.h"
#include "crypto/crypto.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::uploads {
namespace {

class UploadsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static auto* tj = new journal::testing::TestJournal(8);
    pool_ = &tj->pool;
    journal_ = &tj->journal;
    static auto* dir = new oml::testing::ScopedTempDir("oml-uploads-test");
    const std::string kek_file = (dir->path() / "kek.key").string();
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    store_ = blob::OpenObjectStore("file://" + (dir->path() / "quarantine").string()).value().release();
    tenant_ = journal::CreateTenant(*journal_, "uploads").value().tenant_id;
    alice_ = NewOwner("alice");
    bob_ = NewOwner("bob");
  }
  static Owner NewOwner(const std::string& principal) {
    auto k = journal::CreateApiKey(*journal_, tenant_, principal, "writer");
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return Owner{tenant_, k->key_id, crypto::Sha256(k->token), principal};
  }
  // A fresh Uploads over the same database and store, as after a restart: nothing in memory.
  static Uploads Fresh(Options o = Options()) {
    o.segment_size = 1024;  // small segments: chunks end mid-segment and on boundaries
    return Uploads(pool_, kek_, store_, o);
  }
  static NewUpload Declare(const std::string& data) {
    NewUpload n;
    n.length = data.size();
    n.plaintext_sha256 = crypto::Sha256(data);
    n.filename = "data.bin";
    return n;
  }
  static db::Conn Su() { return std::move(db::Conn::Connect(db::testing::SuperuserUrl())).value(); }
  static std::string Column(const std::string& id, const std::string& col) {
    db::Conn su = Su();
    auto r = su.Query("SELECT " + col + " FROM oml.upload_sessions WHERE upload_id = $1", {db::Text(id)});
    EXPECT_TRUE(r.ok() && r->size() == 1) << id;
    return r->IsNull(0, 0) ? "<null>" : r->Get(0, 0);
  }
  static size_t Parts(const std::string& id) { return store_->List(PartPrefix(tenant_, id))->size(); }
  // Bytes in a direct session's staging file (0 when there is none).
  static uint64_t StagingSize(const std::string& id) { return store_->Size(StagingKey(tenant_, id))->value_or(0); }
  // The stored object, decrypted with the session's own DEK; verifies both digests.
  static std::string Decrypted(const CompletedUpload& u) {
    auto ct = store_->Get(u.object_key);
    EXPECT_TRUE(ct.ok() && ct->has_value()) << u.object_key;
    EXPECT_EQ(crypto::Sha256(**ct), u.ciphertext_sha256);
    EXPECT_EQ((*ct)->size(), u.ciphertext_size);
    auto dek = kek_->UnwrapFrom(u.kek_id, u.wrapped_dek, UploadDekAad(u.tenant_id, u.upload_id));
    EXPECT_TRUE(dek.ok());
    auto pt = crypto::DecryptAll(dek->view(), AttachmentAad(u.tenant_id, u.upload_id), **ct);
    EXPECT_TRUE(pt.ok()) << pt.status().ToString();
    EXPECT_EQ(crypto::Sha256(*pt), u.plaintext_sha256);
    return *pt;
  }

  static db::Pool* pool_;
  static journal::Journal* journal_;
  static crypto::FileKekProvider* kek_;
  static blob::ObjectStore* store_;
  static std::string tenant_;
  static Owner alice_, bob_;
};
db::Pool* UploadsTest::pool_;
journal::Journal* UploadsTest::journal_;
crypto::FileKekProvider* UploadsTest::kek_;
blob::ObjectStore* UploadsTest::store_;
std::string UploadsTest::tenant_;
Owner UploadsTest::alice_, UploadsTest::bob_;

// Chunks of every kind of boundary, each taken by a fresh Uploads (state from the row only):
// the object is named by its ciphertext digest, decrypts to the file, and the parts are gone.
TEST_F(UploadsTest, ResumedChunkByChunkTheObjectDecryptsToTheFile) {
  const std::string data = crypto::RandomBytes(10 * 1024 + 77);
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->state, State::kCreated);
  EXPECT_EQ(Column(s->upload_id, "state"), "created");
  uint64_t off = 0;
  for (size_t n : {size_t{1}, size_t{1023}, size_t{1024}, size_t{3000}, size_t{0}, size_t{2048}, size_t{100}}) {
    auto r = Fresh().Append(alice_, s->upload_id, off, std::string_view(data).substr(off, n), std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    off += n;
    EXPECT_EQ(r->offset, off);
    EXPECT_EQ(r->state, off == 0 ? State::kCreated : State::kReceiving);
    EXPECT_EQ(Fresh().Head(alice_, s->upload_id)->offset, off);
    // The tail of the plaintext waits sealed: no byte of it is in the row in the clear.
    db::Conn su = Su();
    auto row = su.Query("SELECT stream_sealed, plaintext_sha_sealed FROM oml.upload_sessions WHERE upload_id = $1",
                        {db::Text(s->upload_id)});
    ASSERT_TRUE(row.ok());
    const std::string tail = data.substr(off - std::min<uint64_t>(off, 16), std::min<uint64_t>(off, 16));
    if (tail.size() == 16) {
      EXPECT_EQ(row->GetBytes(0, 0).find(tail), std::string::npos);
      EXPECT_EQ(row->GetBytes(0, 1).find(tail), std::string::npos);
    }
  }
  EXPECT_GT(Parts(s->upload_id), 0u);
  auto done = Fresh().Append(alice_, s->upload_id, off, std::string_view(data).substr(off), std::nullopt);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->state, State::kComplete);
  EXPECT_EQ(done->offset, data.size());
  EXPECT_EQ(Parts(s->upload_id), 0u);
  EXPECT_EQ(Column(s->upload_id, "parts_left"), "f");
  auto u = Fresh().LookupCompleted(alice_, s->upload_id);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->object_key, tenant_ + "/" + crypto::Hex(u->ciphertext_sha256));
  EXPECT_EQ(u->size, data.size());
  EXPECT_EQ(u->media_type, "application/octet-stream");
  EXPECT_EQ(u->filename, "data.bin");
  EXPECT_EQ(u->principal, "alice");
  EXPECT_EQ(u->kek_id, kek_->kek_id());
  EXPECT_TRUE(Decrypted(*u) == data);
  // An empty chunk at the end is answered with the session; anything else is refused.
  EXPECT_EQ(Fresh().Append(alice_, s->upload_id, data.size(), "", std::nullopt)->state, State::kComplete);
  EXPECT_EQ(Fresh().Append(alice_, s->upload_id, data.size(), "x", std::nullopt).status().type(), "upload-length-exceeded");
  EXPECT_EQ(Fresh().Append(alice_, s->upload_id, 0, "x", std::nullopt).status().type(), "upload-offset-mismatch");
  // Same file again: another DEK and nonce prefix, so another object name.
  auto again = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(Fresh().Append(alice_, again->upload_id, 0, data, std::nullopt).ok());
  auto u2 = Fresh().LookupCompleted(alice_, again->upload_id);
  ASSERT_TRUE(u2.ok());
  EXPECT_NE(u2->object_key, u->object_key);
  EXPECT_TRUE(Decrypted(*u2) == data);
}

TEST_F(UploadsTest, ZeroLengthUploadCompletesAtCreation) {
  auto s = Fresh().Create(alice_, "writer", Declare(""));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->state, State::kComplete);
  auto u = Fresh().LookupCompleted(alice_, s->upload_id);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->ciphertext_size, crypto::kAeadHeaderSize + crypto::kAeadTagSize);
  EXPECT_EQ(Decrypted(*u), "");
  NewUpload bad = Declare("");
  bad.plaintext_sha256 = crypto::Sha256("not empty");
  EXPECT_EQ(Fresh().Create(alice_, "writer", bad).status().type(), "digest-mismatch");
}

TEST_F(UploadsTest, RefusalsLeaveTheOffsetAndNothingBehind) {
  const std::string data = crypto::RandomBytes(5000);
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  const std::string id = s->upload_id;
  ASSERT_TRUE(Fresh().Append(alice_, id, 0, data.substr(0, 2000), std::nullopt).ok());
  const size_t parts = Parts(id);
  uint64_t cur = 0;
  // Wrong offset: 409 with the offset.
  auto r = Fresh().Append(alice_, id, 1999, data.substr(1999, 10), std::nullopt, &cur);
  EXPECT_EQ(r.status().type(), "upload-offset-mismatch");
  EXPECT_EQ(cur, 2000u);
  // Wrong per-chunk checksum (sha1 and sha256): 460, discarded.
  Checksum sum{ChecksumAlgorithm::kSha256, crypto::Sha256("something else")};
  EXPECT_EQ(Fresh().Append(alice_, id, 2000, data.substr(2000, 1000), sum).status().type(), "checksum-mismatch");
  Checksum sha1{ChecksumAlgorithm::kSha1, std::string(20, '\0')};
  EXPECT_EQ(Fresh().Append(alice_, id, 2000, data.substr(2000, 1000), sha1).status().type(), "checksum-mismatch");
  // Past the declared length: 413.
  EXPECT_EQ(Fresh().Append(alice_, id, 2000, data.substr(2000) + "x", std::nullopt).status().type(), "upload-length-exceeded");
  // Another key, even of the same tenant: 404 everywhere.
  EXPECT_EQ(Fresh().Head(bob_, id).status().type(), "upload-not-found");
  EXPECT_EQ(Fresh().Append(bob_, id, 2000, data.substr(2000, 10), std::nullopt).status().type(), "upload-not-found");
  EXPECT_EQ(Fresh().Cancel(bob_, id).type(), "upload-not-found");
  EXPECT_EQ(Fresh().LookupCompleted(bob_, id).status().type(), "upload-not-found");
  EXPECT_EQ(Fresh().Head(alice_, "not-a-uuid").status().type(), "upload-not-found");
  // A reviewer may not upload; too large is 413.
  EXPECT_EQ(Fresh().Create(alice_, "reviewer", Declare(data)).status().type(), "forbidden-role");
  Options small;
  small.max_length = 4999;
  EXPECT_EQ(Fresh(small).Create(alice_, "writer", Declare(data)).status().type(), "upload-too-large");
  EXPECT_EQ(Fresh().Head(alice_, id)->offset, 2000u);
  EXPECT_EQ(Parts(id), parts);
  // A correct checksum is taken.
  Checksum good{ChecksumAlgorithm::kSha256, crypto::Sha256(data.substr(2000, 1000))};
  EXPECT_EQ(Fresh().Append(alice_, id, 2000, data.substr(2000, 1000), good)->offset, 3000u);
  // Not complete yet: no lookup.
  EXPECT_EQ(Fresh().LookupCompleted(alice_, id).status().code(), Code::kNotFound);

  // The whole file differs from the declared digest: 422, failed, every part and no object.
  std::string wrong = data.substr(3000);
  wrong[0] ^= 1;
  const size_t objects_before = store_->List(tenant_ + "/")->size() - Parts(id);
  auto f = Fresh().Append(alice_, id, 3000, wrong, std::nullopt);
  EXPECT_EQ(f.status().type(), "digest-mismatch");
  EXPECT_EQ(Column(id, "state"), "failed");
  EXPECT_EQ(Column(id, "wrapped_dek"), "<null>");
  EXPECT_EQ(Column(id, "plaintext_sha_sealed"), "<null>");
  EXPECT_EQ(Column(id, "object_key"), "<null>");
  EXPECT_EQ(Parts(id), 0u);
  EXPECT_EQ(store_->List(tenant_ + "/")->size(), objects_before);
  EXPECT_EQ(Fresh().Head(alice_, id).status().type(), "upload-failed");
  EXPECT_EQ(Fresh().Append(alice_, id, 3000, data.substr(3000), std::nullopt).status().type(), "upload-failed");
}

TEST_F(UploadsTest, CancelRemovesPartsAndTheSessionIsGone) {
  const std::string data = crypto::RandomBytes(3000);
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(Fresh().Append(alice_, s->upload_id, 0, data.substr(0, 2500), std::nullopt).ok());
  EXPECT_GT(Parts(s->upload_id), 0u);
  ASSERT_TRUE(Fresh().Cancel(alice_, s->upload_id).ok());
  EXPECT_EQ(Parts(s->upload_id), 0u);
  EXPECT_EQ(Column(s->upload_id, "state"), "cancelled");
  EXPECT_EQ(Column(s->upload_id, "wrapped_dek"), "<null>");
  EXPECT_EQ(Column(s->upload_id, "stream_sealed"), "<null>");
  EXPECT_EQ(Fresh().Head(alice_, s->upload_id).status().type(), "upload-not-found");
  EXPECT_EQ(Fresh().Cancel(alice_, s->upload_id).type(), "upload-not-found");
  EXPECT_EQ(Fresh().Append(alice_, s->upload_id, 2500, data.substr(2500), std::nullopt).status().type(), "upload-not-found");
}

// A crash between the part put and the commit (the fault point fails the chunk there): the
// offset stays, the part left behind is overwritten by the retried chunk, the file is whole.
TEST_F(UploadsTest, ChunkFailingBeforeItsCommitIsRetriedWhole) {
  const std::string data = crypto::RandomBytes(6000);
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(Fresh().Append(alice_, s->upload_id, 0, data.substr(0, 1500), std::nullopt).ok());
  SyncPoints::Set("uploads.append.after_part", [] { return Internal("injected", "injected-fault"); });
  auto failed = Fresh().Append(alice_, s->upload_id, 1500, data.substr(1500, 2500), std::nullopt);
  SyncPoints::Clear("uploads.append.after_part");
  EXPECT_EQ(failed.status().type(), "injected-fault");
  EXPECT_EQ(Fresh().Head(alice_, s->upload_id)->offset, 1500u);
  EXPECT_EQ(Column(s->upload_id, "part_count"), "1");
  // The uncommitted part is in the staging file, past the committed ciphertext.
  EXPECT_EQ(Parts(s->upload_id), 1u);
  EXPECT_GT(StagingSize(s->upload_id), std::stoull(Column(s->upload_id, "ciphertext_offset")));
  // The client resends from 1500 in other chunk sizes.
  ASSERT_TRUE(Fresh().Append(alice_, s->upload_id, 1500, data.substr(1500, 700), std::nullopt).ok());
  // The retry's write cut the uncommitted bytes off: the file holds exactly what is committed.
  EXPECT_EQ(StagingSize(s->upload_id), std::stoull(Column(s->upload_id, "ciphertext_offset")));
  // The last chunk failing after its last part was written, before the write was finished.
  SyncPoints::Set("uploads.complete.before_finish", [] { return Internal("injected", "injected-fault"); });
  EXPECT_EQ(Fresh().Append(alice_, s->upload_id, 2200, data.substr(2200), std::nullopt).status().type(),
            "injected-fault");
  SyncPoints::Clear("uploads.complete.before_finish");
  EXPECT_EQ(Column(s->upload_id, "state"), "receiving");
  ASSERT_TRUE(Fresh().Append(alice_, s->upload_id, 2200, data.substr(2200), std::nullopt).ok());
  auto u = Fresh().LookupCompleted(alice_, s->upload_id);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_TRUE(Decrypted(*u) == data);
  EXPECT_EQ(Parts(s->upload_id), 0u);
  // The last chunk failing after its object was written: the retry rewrites the same object.
  auto t = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(Fresh().Append(alice_, t->upload_id, 0, data.substr(0, 4000), std::nullopt).ok());
  SyncPoints::Set("uploads.complete.after_object", [] { return Internal("injected", "injected-fault"); });
  EXPECT_EQ(Fresh().Append(alice_, t->upload_id, 4000, data.substr(4000), std::nullopt).status().type(), "injected-fault");
  SyncPoints::Clear("uploads.complete.after_object");
  EXPECT_EQ(Column(t->upload_id, "state"), "receiving");
  ASSERT_TRUE(Fresh().Append(alice_, t->upload_id, 4000, data.substr(4000), std::nullopt).ok());
  auto v = Fresh().LookupCompleted(alice_, t->upload_id);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(Decrypted(*v) == data);
}

// A session created before sql/0027 (not direct) still finishes the old way: part objects,
// composed at the last byte. A part changed in the store between its chunk and the last byte:
// the composed bytes do not hash to what was put, no object appears, the session stays receiving.
TEST_F(UploadsTest, TamperedPartIsCaughtWhenComposing) {
  const std::string data = crypto::RandomBytes(4000);
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  {
    db::Conn su = Su();
    ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET direct = false WHERE upload_id = $1", {db::Text(s->upload_id)}).ok());
  }
  ASSERT_TRUE(Fresh().Append(alice_, s->upload_id, 0, data.substr(0, 3000), std::nullopt).ok());
  auto part = store_->Get(PartKey(tenant_, s->upload_id, 1));
  ASSERT_TRUE(part.ok() && part->has_value());
  std::string bad = **part;
  bad[100] ^= 1;
  ASSERT_TRUE(store_->Put(PartKey(tenant_, s->upload_id, 1), bad).ok());
  const size_t objects = store_->List(tenant_ + "/")->size();
  auto r = Fresh().Append(alice_, s->upload_id, 3000, data.substr(3000), std::nullopt);
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_EQ(r.status().type(), "integrity");
  EXPECT_EQ(store_->List(tenant_ + "/")->size(), objects);
  EXPECT_EQ(Column(s->upload_id, "state"), "receiving");
  // Put back, the legacy session composes an object that decrypts to the file.
  ASSERT_TRUE(store_->Put(PartKey(tenant_, s->upload_id, 1), **part).ok());
  ASSERT_TRUE(Fresh().Append(alice_, s->upload_id, 3000, data.substr(3000), std::nullopt).ok());
  EXPECT_TRUE(Decrypted(*Fresh().LookupCompleted(alice_, s->upload_id)) == data);
  EXPECT_EQ(Parts(s->upload_id), 0u);
}

// Sessions since sql/0027 write each chunk's ciphertext straight into their object: on a local
// store one staging file at StagingKey that holds exactly the committed ciphertext after every
// chunk (no part objects, no composition), renamed into the object's key by the last chunk.
TEST_F(UploadsTest, ChunksGoStraightIntoTheObject) {
  const std::string data = crypto::RandomBytes(9000 + (5 << 19) + 7);  // one chunk of three 1 MiB slices
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  const std::string id = s->upload_id;
  EXPECT_EQ(Column(id, "direct"), "t");
  EXPECT_EQ(Column(id, "store_upload"), "<null>");
  uint64_t off = 0;
  for (size_t n : {size_t{500}, size_t{2000}, size_t{1024}, size_t{3000}, size_t{(5 << 19) + 7}}) {
    ASSERT_TRUE(Fresh().Append(alice_, id, off, std::string_view(data).substr(off, n), std::nullopt).ok());
    off += n;
    EXPECT_EQ(Column(id, "store_upload"), "local") << off;  // started by the first bytes out (the header)
    EXPECT_EQ(StagingSize(id), std::stoull(Column(id, "ciphertext_offset"))) << off;
    EXPECT_EQ(Parts(id), 1u) << off;  // the staging file, nothing else
    EXPECT_EQ(Column(id, "carry_bytes"), "0");
    EXPECT_EQ(Column(id, "store_parts"), "{}");
  }
  ASSERT_TRUE(Fresh().Append(alice_, id, off, std::string_view(data).substr(off), std::nullopt).ok());
  EXPECT_EQ(Parts(id), 0u);
  EXPECT_EQ(Column(id, "store_upload"), "<null>");
  auto u = Fresh().LookupCompleted(alice_, id);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_TRUE(Decrypted(*u) == data);
  // The staging file went away when its session ended: cancelled mid-way, nothing is left.
  auto c = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(Fresh().Append(alice_, c->upload_id, 0, data.substr(0, 5000), std::nullopt).ok());
  EXPECT_GT(StagingSize(c->upload_id), 0u);
  ASSERT_TRUE(Fresh().Cancel(alice_, c->upload_id).ok());
  EXPECT_EQ(Parts(c->upload_id), 0u);
  EXPECT_FALSE(store_->Size(StagingKey(tenant_, c->upload_id))->has_value());
}

// A write the store lost (an operator removed the staging file, or cut it short): the next chunk
// is refused as integrity and nothing is padded or committed.
TEST_F(UploadsTest, AStagingWriteTheStoreLostIsIntegrity) {
  const std::string data = crypto::RandomBytes(6000);
  for (const bool remove : {true, false}) {
    auto s = Fresh().Create(alice_, "writer", Declare(data));
    ASSERT_TRUE(s.ok());
    const std::string id = s->upload_id;
    ASSERT_TRUE(Fresh().Append(alice_, id, 0, data.substr(0, 3000), std::nullopt).ok());
    if (remove) {
      ASSERT_TRUE(store_->Delete(StagingKey(tenant_, id)).ok());
    } else {
      ASSERT_TRUE(store_->Put(StagingKey(tenant_, id), "short").ok());
    }
    for (const size_t n : {size_t{1000}, data.size() - 3000}) {  // a middle chunk, the last chunk
      auto r = Fresh().Append(alice_, id, 3000, data.substr(3000, n), std::nullopt);
      EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().ToString();
      EXPECT_EQ(r.status().type(), "integrity");
      EXPECT_EQ(Column(id, "upload_offset"), "3000");
      EXPECT_EQ(StagingSize(id), remove ? 0u : 5u);
    }
    ASSERT_TRUE(Fresh().Cancel(alice_, id).ok());
    EXPECT_EQ(Parts(id), 0u);
  }
}

// A store whose parts must hold `min` bytes but the last (as S3's 5 MiB), over the local store:
// smaller pieces are carried in a carry object, sent with the next chunk, and a carry never
// reaches `min`. The parts land at the right offsets: the object decrypts to the file.
class MinPartStore : public blob::testing::ForwardingStore {
 public:
  MinPartStore(blob::ObjectStore* s, uint64_t min) : ForwardingStore(s), min_(min) {}
  uint64_t ResumableMinPart() const override { return min_; }
  Result<std::string> ResumablePut(const std::string& k, const std::string& h, uint32_t n, uint64_t o,
                                   std::string_view b, bool sync) override {
    EXPECT_TRUE(sync);
    parts_.push_back(b.size());
    ++n_;
    EXPECT_EQ(n, n_) << "parts are numbered 1, 2, ...";
    auto r = ForwardingStore::ResumablePut(k, h, n, o, b, sync);
    if (!r.ok()) return r.status();
    return "etag-" + std::to_string(n);
  }
  Status ResumableFinish(const std::string& k, const std::string& h, const std::vector<std::string>& t, uint64_t n,
                         const std::string& f) override {
    tags_ = t;
    return ForwardingStore::ResumableFinish(k, h, t, n, f);
  }
  std::vector<size_t> parts_;
  std::vector<std::string> tags_;
  uint32_t n_ = 0;

 private:
  uint64_t min_;
};

// During a rolling upgrade a server of the previous version may take a chunk of a direct session
// (it writes a part object and advances the offset). The next chunk here finds ciphertext that is
// neither in the session's write nor in its carry: refused as integrity, on either store, and no
// object is made from the last chunk alone.
TEST_F(UploadsTest, ADirectSessionAnotherVersionAdvancedIsRefused) {
  const std::string data = crypto::RandomBytes(6000);
  MinPartStore s3_like(store_, 4000);
  Options o;
  o.segment_size = 1024;
  for (blob::ObjectStore* store : {static_cast<blob::ObjectStore*>(&s3_like), store_}) {
    auto s = Uploads(pool_, kek_, store, o).Create(alice_, "writer", Declare(data));
    ASSERT_TRUE(s.ok());
    const std::string id = s->upload_id;
    db::Conn su = Su();
    auto set_direct = [&](bool on) {
      ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET direct = $2 WHERE upload_id = $1",
                           {db::Text(id), db::Text(on ? "true" : "false")})
                      .ok());
    };
    set_direct(false);  // the previous version's chunk: a part object
    ASSERT_TRUE(Uploads(pool_, kek_, store, o).Append(alice_, id, 0, data.substr(0, 3000), std::nullopt).ok());
    ASSERT_EQ(Column(id, "part_count"), "1");
    set_direct(true);
    const size_t objects = store_->List(tenant_ + "/")->size();
    auto r = Uploads(pool_, kek_, store, o).Append(alice_, id, 3000, data.substr(3000), std::nullopt);
    EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().ToString();
    EXPECT_EQ(r.status().type(), "integrity");
    EXPECT_EQ(Column(id, "state"), "receiving");
    EXPECT_EQ(Column(id, "object_key"), "<null>");
    EXPECT_EQ(store_->List(tenant_ + "/")->size(), objects);
    ASSERT_TRUE(Fresh().Cancel(alice_, id).ok());
    EXPECT_EQ(Parts(id), 0u);
  }
  // The previous version took a chunk after this version's write had started (S3): the next chunk
  // finds a part count its part tags do not match, and is refused before it puts anything.
  {
    const std::string big = crypto::RandomBytes(12000);
    auto s = Uploads(pool_, kek_, &s3_like, o).Create(alice_, "writer", Declare(big));
    ASSERT_TRUE(s.ok());
    const std::string id = s->upload_id;
    db::Conn su = Su();
    ASSERT_TRUE(Uploads(pool_, kek_, &s3_like, o).Append(alice_, id, 0, big.substr(0, 5000), std::nullopt).ok());
    ASSERT_EQ(Column(id, "part_count"), "1");
    ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET direct = false WHERE upload_id = $1", {db::Text(id)}).ok());
    ASSERT_TRUE(Uploads(pool_, kek_, &s3_like, o).Append(alice_, id, 5000, big.substr(5000, 3000), std::nullopt).ok());
    ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET direct = true WHERE upload_id = $1", {db::Text(id)}).ok());
    const size_t puts = s3_like.parts_.size();
    auto r = Uploads(pool_, kek_, &s3_like, o).Append(alice_, id, 8000, big.substr(8000), std::nullopt);
    EXPECT_EQ(r.status().type(), "integrity") << r.status().ToString();
    EXPECT_EQ(s3_like.parts_.size(), puts) << "nothing put";
    EXPECT_EQ(Column(id, "state"), "receiving");
    ASSERT_TRUE(Fresh().Cancel(alice_, id).ok());
    EXPECT_EQ(Parts(id), 0u);
  }
  // A session this version creates says so itself (the column's default is the old way).
  auto fresh = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(Column(fresh->upload_id, "direct"), "t");
  db::Conn su = Su();
  auto def = su.Query("SELECT column_default FROM information_schema.columns WHERE table_schema = 'oml' "
                      "AND table_name = 'upload_sessions' AND column_name = 'direct'");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->Get(0, 0), "false");
}

TEST_F(UploadsTest, PiecesBelowTheStoresMinimumPartAreCarried) {
  const std::string data = crypto::RandomBytes(20000);
  MinPartStore store(store_, 4000);
  Options o;
  o.segment_size = 1024;
  auto s = Uploads(pool_, kek_, &store, o).Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  const std::string id = s->upload_id;
  uint64_t off = 0;
  for (size_t n : {size_t{1500}, size_t{1500}, size_t{1500}, size_t{6000}, size_t{100}, size_t{2000}}) {
    auto r = Uploads(pool_, kek_, &store, o).Append(alice_, id, off, std::string_view(data).substr(off, n), std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    off += n;
    const uint64_t carry = std::stoull(Column(id, "carry_bytes"));
    EXPECT_LT(carry, 4000u) << off;
    const uint64_t ct_off = std::stoull(Column(id, "ciphertext_offset"));
    // The parts hold the ciphertext up to the carry; the carry object holds the rest.
    EXPECT_EQ(StagingSize(id), ct_off - carry) << off;
    auto held = store_->Get(CarryKey(tenant_, id, ct_off));
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(held->has_value() ? (*held)->size() : 0u, carry) << off;
    EXPECT_EQ(Parts(id), (StagingSize(id) > 0 ? 1u : 0u) + (carry > 0 ? 1u : 0u)) << off << ": consumed carries deleted";
    EXPECT_EQ(Column(id, "part_count"), std::to_string(store.parts_.size()));
  }
  // Every part but the last reached the minimum; the tags went with the session.
  for (size_t p : store.parts_) EXPECT_GE(p, 4000u);
  EXPECT_EQ(Column(id, "store_parts"), "{etag-1,etag-2}");
  ASSERT_TRUE(Uploads(pool_, kek_, &store, o).Append(alice_, id, off, std::string_view(data).substr(off), std::nullopt).ok());
  EXPECT_EQ(store.tags_, (std::vector<std::string>{"etag-1", "etag-2", "etag-3"}));
  EXPECT_EQ(Parts(id), 0u);
  EXPECT_TRUE(Decrypted(*Fresh().LookupCompleted(alice_, id)) == data);
  // A file that never fills a part is put whole at its key by its last chunk.
  const std::string small = crypto::RandomBytes(3000);
  auto t = Uploads(pool_, kek_, &store, o).Create(alice_, "writer", Declare(small));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(Uploads(pool_, kek_, &store, o).Append(alice_, t->upload_id, 0, small.substr(0, 2000), std::nullopt).ok());
  EXPECT_EQ(Column(t->upload_id, "store_upload"), "<null>");
  ASSERT_TRUE(Uploads(pool_, kek_, &store, o).Append(alice_, t->upload_id, 2000, small.substr(2000), std::nullopt).ok());
  EXPECT_EQ(store.tags_.size(), 3u) << "no write finished for it";
  EXPECT_TRUE(Decrypted(*Fresh().LookupCompleted(alice_, t->upload_id)) == small);
  EXPECT_EQ(Parts(t->upload_id), 0u);
}

// Two chunks at the same offset at once: the first holds the row (paused after its part put);
// the second is refused at once with the offset, never queued; the file is whole.
TEST_F(UploadsTest, TwoChunksRacingOneWinsTheOtherIs409) {
  const std::string data = crypto::RandomBytes(4000);
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  Uploads up = Fresh();
  Result<Session> first = Status(Code::kInternal, "unset");
  {
    oml::testing::HoldFirst hold("uploads.append.after_part");
    std::thread a([&] { first = up.Append(alice_, s->upload_id, 0, data.substr(0, 2000), std::nullopt); });
    hold.WaitUntilHeld();
    uint64_t cur = 99;
    auto second = up.Append(alice_, s->upload_id, 0, data.substr(0, 2000), std::nullopt, &cur);
    EXPECT_EQ(second.status().type(), "upload-busy");
    EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(cur, 0u);
    EXPECT_EQ(up.Cancel(alice_, s->upload_id).type(), "upload-busy");
    hold.Release();
    a.join();
  }
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->offset, 2000u);
  // Now the loser's retry at 0 is a plain offset mismatch.
  EXPECT_EQ(up.Append(alice_, s->upload_id, 0, data.substr(0, 2000), std::nullopt).status().type(), "upload-offset-mismatch");
  ASSERT_TRUE(up.Append(alice_, s->upload_id, 2000, data.substr(2000), std::nullopt).ok());
  EXPECT_TRUE(Decrypted(*up.LookupCompleted(alice_, s->upload_id)) == data);
}

TEST_F(UploadsTest, ExpiryOnAccessAndByTheSweep) {
  const std::string data = crypto::RandomBytes(4000);
  auto a = Fresh().Create(alice_, "writer", Declare(data));
  auto b = Fresh().Create(alice_, "writer", Declare(data));
  auto done = Fresh().Create(alice_, "writer", Declare("x"));
  ASSERT_TRUE(a.ok() && b.ok() && done.ok());
  ASSERT_TRUE(Fresh().Append(alice_, done->upload_id, 0, "x", std::nullopt).ok());
  for (const auto& s : {*a, *b}) ASSERT_TRUE(Fresh().Append(alice_, s.upload_id, 0, data.substr(0, 3000), std::nullopt).ok());
  EXPECT_GT(Parts(a->upload_id), 0u);
  // Both pass their expiry (as if upload_expiry_s had gone by).
  db::Conn su = Su();
  ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET expires_at = now() - interval '1 second' WHERE upload_id IN ($1, $2)",
                       {db::Text(a->upload_id), db::Text(b->upload_id)})
                  .ok());
  // a: on access (HEAD), 410 and its parts removed.
  EXPECT_EQ(Fresh().Head(alice_, a->upload_id).status().type(), "upload-expired");
  EXPECT_EQ(Column(a->upload_id, "state"), "expired");
  EXPECT_EQ(Column(a->upload_id, "wrapped_dek"), "<null>");
  EXPECT_EQ(Parts(a->upload_id), 0u);
  EXPECT_EQ(Fresh().Append(alice_, a->upload_id, 3000, data.substr(3000), std::nullopt).status().type(), "upload-expired");
  // b: by the sweep, untouched by any request.
  auto rep = Fresh().Sweep();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->expired, 1);
  EXPECT_GT(rep->parts_removed, 0);
  EXPECT_EQ(Column(b->upload_id, "state"), "expired");
  EXPECT_EQ(Parts(b->upload_id), 0u);
  // A complete session within its complete_ttl does not expire.
  EXPECT_EQ(Column(done->upload_id, "state"), "complete");
  EXPECT_TRUE(Fresh().LookupCompleted(alice_, done->upload_id).ok());
  // Tombstones go after their retention.
  ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET updated_at = now() - interval '2 days' WHERE upload_id IN ($1, $2)",
                       {db::Text(a->upload_id), db::Text(b->upload_id)})
                  .ok());
  auto rep2 = Fresh().Sweep();
  ASSERT_TRUE(rep2.ok());
  EXPECT_EQ(rep2->rows_deleted, 2);
  auto left = su.Query("SELECT count(*) FROM oml.upload_sessions WHERE upload_id IN ($1, $2)",
                       {db::Text(a->upload_id), db::Text(b->upload_id)});
  EXPECT_EQ(left->GetInt(0, 0), 0);
  EXPECT_EQ(Fresh().Head(alice_, a->upload_id).status().type(), "upload-not-found");
  auto rep3 = Fresh().Sweep();
  ASSERT_TRUE(rep3.ok());
  EXPECT_EQ(rep3->expired + rep3->parts_removed + rep3->rows_deleted, 0);
}

TEST_F(UploadsTest, RevokedKeyWritesNothing) {
  Owner carol = NewOwner("carol");
  auto s = Fresh().Create(carol, "writer", Declare("abc"));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(journal::RevokeApiKey(*journal_, tenant_, carol.api_key_id, "lost").ok());
  EXPECT_EQ(Fresh().Append(carol, s->upload_id, 0, "abc", std::nullopt).status().code(), Code::kUnauthenticated);
  EXPECT_EQ(Fresh().Create(carol, "writer", Declare("abc")).status().code(), Code::kUnauthenticated);
  EXPECT_EQ(Column(s->upload_id, "upload_offset"), "0");
}

// While a chunk's part is put, and while the object is composed, the request holds the session's
// advisory lock on an idle connection: no transaction, so no transaction id and no snapshot that
// would hold back the lake writer's outbox cut (docs/data/postgres-schema.md), and no row lock.
TEST_F(UploadsTest, NoTransactionIsOpenDuringObjectStoreIo) {
  const std::string data = crypto::RandomBytes(4000);
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  const std::string id = s->upload_id;
  Uploads up = Fresh();
  auto check_idle = [&](const char* where) {
    db::Conn su = Su();
    auto r = su.Query(
        "SELECT a.backend_xid IS NULL, a.backend_xmin IS NULL, a.state FROM pg_locks l JOIN pg_stat_activity a "
        "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.classid::bigint = 1869442165 AND l.objsubid = 2 "
        "AND l.granted AND l.objid::bigint = (hashtext($1::text || '/' || $2::text)::bigint & 4294967295)",
        {db::Text(tenant_), db::Text(id)});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 1) << where << ": the session's lock is held by one backend";
    EXPECT_EQ(r->Get(0, 0), "t") << where << ": no transaction id";
    EXPECT_EQ(r->Get(0, 1), "t") << where << ": no snapshot";
    EXPECT_EQ(r->Get(0, 2), "idle") << where;
    // No row lock either: anyone may lock the row at once.
    auto row = su.Query("SELECT 1 FROM oml.upload_sessions WHERE upload_id = $1 FOR UPDATE NOWAIT", {db::Text(id)});
    EXPECT_TRUE(row.ok() && row->size() == 1) << where << ": " << row.status().ToString();
  };
  for (const char* point : {"uploads.append.after_part", "uploads.complete.after_object"}) {
    const bool last = std::string(point) == "uploads.complete.after_object";
    const uint64_t from = last ? 2000 : 0;
    Result<Session> got = Status(Code::kInternal, "unset");
    {
      oml::testing::HoldFirst hold(point);
      std::thread a([&] { got = up.Append(alice_, id, from, last ? data.substr(2000) : data.substr(0, 2000), std::nullopt); });
      hold.WaitUntilHeld();
      check_idle(point);
      // Still one request at a time: the others are refused at once.
      uint64_t cur = 99;
      EXPECT_EQ(up.Append(alice_, id, from, "x", std::nullopt, &cur).status().type(), "upload-busy");
      EXPECT_EQ(cur, from);
      EXPECT_EQ(up.Cancel(alice_, id).type(), "upload-busy");
      EXPECT_EQ(Fresh().Head(alice_, id)->offset, from);
      hold.Release();
      a.join();
    }
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->offset, last ? data.size() : 2000u);
  }
  // Every lock was released: the pool's connections hold none.
  db::Conn su = Su();
  auto locks = su.Query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = 1869442165");
  ASSERT_TRUE(locks.ok());
  EXPECT_EQ(locks->GetInt(0, 0), 0);
  EXPECT_TRUE(Decrypted(*up.LookupCompleted(alice_, id)) == data);
}

// The stream state is sealed under the DEK with the offset in its AAD and must stand where the
// offset puts it: a database writer without the DEK cannot rewind it into nonce reuse (nor can
// one with a correctly sealed but rewound state). Refused as integrity, nothing written.
TEST_F(UploadsTest, RewoundStreamStateIsRefusedAndSealsNothing) {
  const std::string data = crypto::RandomBytes(5000);  // segments of 1024
  auto s = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(s.ok());
  const std::string id = s->upload_id;
  db::Conn su = Su();
  auto bytes_of = [&](const char* col) {
    auto r = su.Query(std::string("SELECT ") + col + " FROM oml.upload_sessions WHERE upload_id = $1", {db::Text(id)});
    EXPECT_TRUE(r.ok() && r->size() == 1);
    return r->GetBytes(0, 0);
  };
  auto set_bytes = [&](const char* col, const std::string& v) {
    ASSERT_TRUE(su.Query(std::string("UPDATE oml.upload_sessions SET ") + col + " = $2 WHERE upload_id = $1",
                         {db::Text(id), db::Bytes(v)})
                    .ok());
  };
  const std::string at_zero = bytes_of("stream_sealed");
  ASSERT_TRUE(Fresh().Append(alice_, id, 0, data.substr(0, 2500), std::nullopt).ok());
  const std::string good = bytes_of("stream_sealed");
  const size_t parts = Parts(id);
  ASSERT_EQ(parts, 1u);
  auto refused = [&](const char* what) {
    auto r = Fresh().Append(alice_, id, 2500, data.substr(2500, 1500), std::nullopt);
    EXPECT_EQ(r.status().code(), Code::kDataLoss) << what << ": " << r.status().ToString();
    EXPECT_EQ(r.status().type(), "integrity") << what;
    EXPECT_EQ(Parts(id), parts) << what << ": no part written";
    EXPECT_EQ(StagingSize(id), 16u + 2 * (1024 + 16)) << what << ": nothing written";
    EXPECT_EQ(Column(id, "upload_offset"), "2500") << what;
  };
  // 1. The state sealed at offset 0 (next segment 0, no header) under the row's offset 2500.
  set_bytes("stream_sealed", at_zero);
  refused("a state sealed at another offset");
  // 2. A rewound state correctly sealed under offset 2500 (needs the DEK: the position check).
  auto dek = kek_->UnwrapFrom(Column(id, "kek_id"), bytes_of("wrapped_dek"), UploadDekAad(tenant_, id));
  ASSERT_TRUE(dek.ok());
  auto plain = crypto::DecryptAll(dek->view(), StreamAad(tenant_, id, 2500), good);
  ASSERT_TRUE(plain.ok());
  auto st = DecodeStreamState(*plain);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->next_segment, 2u);
  EXPECT_TRUE(st->header_sent);
  EXPECT_EQ(st->pending.size(), 2500u - 2048u);
  EXPECT_TRUE(StreamPositionMatches(*st, 2500));
  st->next_segment = 0;
  EXPECT_FALSE(StreamPositionMatches(*st, 2500));
  set_bytes("stream_sealed", *crypto::EncryptAll(dek->view(), StreamAad(tenant_, id, 2500), EncodeStreamState(*st)));
  refused("next_segment rewound to 0");
  // 3. The ciphertext length the parts hold does not match the stream.
  set_bytes("stream_sealed", good);
  ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET ciphertext_offset = 16 WHERE upload_id = $1", {db::Text(id)}).ok());
  refused("ciphertext_offset rewound");
  ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET ciphertext_offset = $2 WHERE upload_id = $1",
                       {db::Text(id), db::Int(16 + 2 * (1024 + 16))})
                  .ok());
  // Restored: the upload goes on and decrypts to the file.
  ASSERT_TRUE(Fresh().Append(alice_, id, 2500, data.substr(2500), std::nullopt).ok());
  EXPECT_TRUE(Decrypted(*Fresh().LookupCompleted(alice_, id)) == data);
  // The encoding itself: malformed bytes are integrity errors.
  EXPECT_EQ(DecodeStreamState("").status().type(), "integrity");
  EXPECT_EQ(DecodeStreamState(std::string(21, '\x02')).status().type(), "integrity");
}

// A complete session is deleted by DELETE (204: DEK shredded, object deleted) and expires
// complete_ttl after its completion unless attached (LookupCompleted refuses it from then on,
// and HEAD or the sweep expire it).
TEST_F(UploadsTest, CompleteSessionsCanBeDeletedAndExpire) {
  Options o;
  o.complete_ttl = std::chrono::seconds(3600);
  auto complete = [&](const std::string& data) {
    auto s = Fresh(o).Create(alice_, "writer", Declare(data));
    EXPECT_TRUE(s.ok());
    auto r = Fresh(o).Append(alice_, s->upload_id, 0, data, std::nullopt);
    EXPECT_TRUE(r.ok() && r->state == State::kComplete) << r.status().ToString();
    auto u = Fresh(o).LookupCompleted(alice_, s->upload_id);
    EXPECT_TRUE(u.ok());
    EXPECT_TRUE(store_->Get(u->object_key)->has_value());
    return *u;
  };
  auto gone = [&](const CompletedUpload& u, const char* state) {
    EXPECT_EQ(Column(u.upload_id, "state"), state);
    EXPECT_EQ(Column(u.upload_id, "wrapped_dek"), "<null>");
    EXPECT_EQ(Column(u.upload_id, "kek_id"), "<null>");
    EXPECT_EQ(Column(u.upload_id, "object_key"), "<null>");
    EXPECT_EQ(Column(u.upload_id, "parts_left"), "f");
    EXPECT_FALSE(store_->Get(u.object_key)->has_value()) << u.object_key;
    EXPECT_EQ(Fresh(o).LookupCompleted(alice_, u.upload_id).status().type(), "upload-not-found");
  };
  // Its expiry is complete_ttl from completion.
  const CompletedUpload a = complete(crypto::RandomBytes(3000));
  db::Conn su = Su();
  auto ttl = su.Query("SELECT expires_at BETWEEN now() + interval '3590 seconds' AND now() + interval '3610 seconds' "
                      "FROM oml.upload_sessions WHERE upload_id = $1",
                      {db::Text(a.upload_id)});
  ASSERT_TRUE(ttl.ok());
  EXPECT_EQ(ttl->Get(0, 0), "t");
  // DELETE.
  EXPECT_EQ(Fresh(o).Cancel(bob_, a.upload_id).type(), "upload-not-found");
  ASSERT_TRUE(Fresh(o).Cancel(alice_, a.upload_id).ok());
  gone(a, "cancelled");
  EXPECT_EQ(Fresh(o).Head(alice_, a.upload_id).status().type(), "upload-not-found");
  EXPECT_EQ(Fresh(o).Cancel(alice_, a.upload_id).type(), "upload-not-found");
  // Past its expiry: refused for attaching at once, expired by HEAD or by the sweep.
  const CompletedUpload b = complete(crypto::RandomBytes(100));
  const CompletedUpload c = complete(crypto::RandomBytes(5000));
  ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET expires_at = now() - interval '1 second' WHERE upload_id IN ($1, $2)",
                       {db::Text(b.upload_id), db::Text(c.upload_id)})
                  .ok());
  EXPECT_EQ(Fresh(o).LookupCompleted(alice_, b.upload_id).status().type(), "upload-not-found");
  EXPECT_EQ(Fresh(o).Head(alice_, b.upload_id).status().type(), "upload-expired");
  gone(b, "expired");
  auto rep = Fresh(o).Sweep();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_GE(rep->expired, 1);
  EXPECT_GE(rep->objects_removed, 1);
  gone(c, "expired");
  EXPECT_EQ(Fresh(o).Append(alice_, c.upload_id, 5000, "", std::nullopt).status().type(), "upload-expired");
}

// A crash after the object was composed, before the completion's commit: the row (still
// receiving) names the object, so DELETE, expiry and a failing retry all delete it.
TEST_F(UploadsTest, ObjectComposedBeforeACrashIsNamedAndRemoved) {
  const std::string data = crypto::RandomBytes(4000);
  auto crash_after_object = [&](const std::string& id) {
    ASSERT_TRUE(Fresh().Append(alice_, id, 0, data.substr(0, 3000), std::nullopt).ok());
    SyncPoints::Set("uploads.complete.after_object", [] { return Internal("injected", "injected-fault"); });
    auto r = Fresh().Append(alice_, id, 3000, data.substr(3000), std::nullopt);
    SyncPoints::Clear("uploads.complete.after_object");
    ASSERT_EQ(r.status().type(), "injected-fault");
    EXPECT_EQ(Column(id, "state"), "receiving");
    const std::string key = Column(id, "object_key");
    ASSERT_NE(key, "<null>");
    EXPECT_TRUE(store_->Get(key)->has_value()) << key;
  };
  auto all_gone = [&](const std::string& id, const std::string& key, const char* state) {
    EXPECT_EQ(Column(id, "state"), state);
    EXPECT_EQ(Column(id, "object_key"), "<null>");
    EXPECT_EQ(Column(id, "parts_left"), "f");
    EXPECT_EQ(Parts(id), 0u);
    EXPECT_FALSE(store_->Get(key)->has_value()) << key;
  };
  // DELETE.
  auto a = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(a.ok());
  crash_after_object(a->upload_id);
  const std::string ka = Column(a->upload_id, "object_key");
  ASSERT_TRUE(Fresh().Cancel(alice_, a->upload_id).ok());
  all_gone(a->upload_id, ka, "cancelled");
  // Expiry by the sweep.
  auto b = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(b.ok());
  crash_after_object(b->upload_id);
  const std::string kb = Column(b->upload_id, "object_key");
  db::Conn su = Su();
  ASSERT_TRUE(su.Query("UPDATE oml.upload_sessions SET expires_at = now() - interval '1 second' WHERE upload_id = $1",
                       {db::Text(b->upload_id)})
                  .ok());
  auto rep = Fresh().Sweep();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  all_gone(b->upload_id, kb, "expired");
  // A retry with other bytes fails the digest: the session fails and the object goes too.
  auto c = Fresh().Create(alice_, "writer", Declare(data));
  ASSERT_TRUE(c.ok());
  crash_after_object(c->upload_id);
  const std::string kc = Column(c->upload_id, "object_key");
  std::string wrong = data.substr(3000);
  wrong[0] ^= 1;
  EXPECT_EQ(Fresh().Append(alice_, c->upload_id, 3000, wrong, std::nullopt).status().type(), "digest-mismatch");
  all_gone(c->upload_id, kc, "failed");
}

}  // namespace
}  // namespace oml::uploads
