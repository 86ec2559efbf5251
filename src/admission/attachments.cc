#include "admission/attachments.h"

#include <algorithm>
#include <array>
#include <memory>
#include <set>

#include "common/log.h"
#include "common/work_pool.h"
#include "review/media_type.h"
#include "uploads/running_sha256.h"

namespace oml::admission {
namespace {

constexpr uint64_t kReadChunk = uint64_t{8} << 20;  // object reads, in ranges of this size

const char* kSelectAttachments =
    "SELECT ordinal, upload_id::text, plaintext_sha256, ciphertext_sha256, size_bytes, ciphertext_size, media_type, "
    "coalesce(filename, ''), object_key, location, review::text, flagged, attach_seq, version "
    "FROM oml.attachments WHERE tenant_id = $1 AND artifact_id = $2";

Attachment FromRow(const db::Rows& r, int i) {
  Attachment a;
  a.ordinal = static_cast<int>(r.GetInt(i, 0));
  a.upload_id = r.Get(i, 1);
  a.plaintext_sha256 = r.GetBytes(i, 2);
  a.ciphertext_sha256 = r.GetBytes(i, 3);
  a.size = r.GetInt(i, 4);
  a.ciphertext_size = r.GetInt(i, 5);
  a.media_type = r.Get(i, 6);
  a.filename = r.Get(i, 7);
  a.object_key = r.Get(i, 8);
  a.location = r.Get(i, 9);
  a.review = nlohmann::json::parse(r.Get(i, 10), nullptr, false);
  a.flagged = r.Get(i, 11) == "t";
  a.attach_seq = r.GetInt(i, 12);
  return a;
}

bool Flagging(const nlohmann::json& flags) {
  if (!flags.is_array()) return false;
  for (const auto& f : flags)
    if (f == "deny-list" || f == "infected") return true;
  return false;
}

// Streams the object `key` of `store` through `fn` in kReadChunk ranges; kDataLoss "integrity" if
// it is missing or not `size` bytes long.
template <typename Fn>
Status ReadObject(blob::ObjectStore& store, const std::string& key, uint64_t size, Fn fn) {
  uint64_t at = 0;
  while (true) {
    OML_ASSIGN_OR_RETURN(std::optional<std::string> part, store.GetRange(key, at, kReadChunk));
    if (!part) return Status(Code::kDataLoss, "object " + key + " is missing", "integrity");
    if (part->empty()) break;
    at += part->size();
    if (at > size) break;
    OML_RETURN_IF_ERROR(fn(*part));
    if (part->size() < kReadChunk) break;
  }
  if (at != size)
    return Status(Code::kDataLoss,
                  "object " + key + " is " + std::to_string(at) + " bytes, not " + std::to_string(size), "integrity");
  return Status::Ok();
}

// The plaintext of an attachment's object for a review (review::ByteSource): read in kReadChunk
// ranges and decrypted as it is read, never whole. The first pass hashes the ciphertext and the
// plaintext and ends in kDataLoss "integrity" instead of its end when either digest, or the
// object's size, is not the recorded one: a review of other bytes is never signed. Restart reads
// again without hashing (the AEAD authenticates every segment under the artifact's key, and the
// first pass has checked the digests by then).
class ObjectPlaintext : public review::ByteSource {
 public:
  ObjectPlaintext(blob::ObjectStore* store, std::string key, uint64_t ciphertext_size, std::string_view dek,
                  std::string aad, std::string ciphertext_sha256, std::string plaintext_sha256)
      : store_(store),
        key_(std::move(key)),
        size_(ciphertext_size),
        dek_(dek),
        aad_(std::move(aad)),
        want_ct_(std::move(ciphertext_sha256)),
        want_pt_(std::move(plaintext_sha256)) {}
  ~ObjectPlaintext() override { crypto::Wipe(&pt_); }

  Result<std::string_view> Next() override {
    crypto::Wipe(&pt_);
    pt_.clear();
    if (dec_ == nullptr) {
      OML_ASSIGN_OR_RETURN(dec_, crypto::AeadStreamDecryptor::Create(dek_, aad_));
    }
    // The decryptor returns whole segments only: loop until it has some plaintext or the end.
    while (pt_.empty() && !done_) {
      if (at_ < size_) {
        OML_ASSIGN_OR_RETURN(bool found, store_->GetRangeInto(key_, at_, std::min(kReadChunk, size_ - at_), &ct_));
        if (!found) return Status(Code::kDataLoss, "object " + key_ + " is missing", "integrity");
        if (ct_.empty())
          return Status(Code::kDataLoss, "object " + key_ + " is " + std::to_string(at_) + " bytes, not " +
                                             std::to_string(size_), "integrity");
        at_ += ct_.size();
        if (first_) ct_hash_.Update(ct_);
        OML_RETURN_IF_ERROR(dec_->UpdateInto(ct_, &pt_));  // pt_'s and ct_'s memory reused
      } else {
        OML_ASSIGN_OR_RETURN(pt_, dec_->Finish());
        done_ = true;
        if (first_) {
          // Anything past the recorded size would be another object.
          OML_ASSIGN_OR_RETURN(std::optional<std::string> more, store_->GetRange(key_, size_, 1));
          pt_hash_.Update(pt_);
          if ((more && !more->empty()) || ct_hash_.Digest() != want_ct_ || pt_hash_.Digest() != want_pt_)
            return Status(Code::kDataLoss, "object " + key_ + ": the stored object does not match its digests",
                          "integrity");
          return std::string_view(pt_);
        }
      }
      if (first_) pt_hash_.Update(pt_);
    }
    return std::string_view(pt_);
  }

  Status Restart() override {
    dec_.reset();
    at_ = 0;
    done_ = false;
    first_ = false;
    return Status::Ok();
  }

 private:
  blob::ObjectStore* store_;
  std::string key_;
  uint64_t size_;
  std::string_view dek_;
  std::string aad_;
  std::string want_ct_, want_pt_;
  std::unique_ptr<crypto::AeadStreamDecryptor> dec_;
  uint64_t at_ = 0;
  bool done_ = false, first_ = true;
  std::string ct_, pt_;  // Next's buffers, reused
  uploads::RunningSha256 ct_hash_, pt_hash_;
};

}  // namespace

Attachments::Attachments(db::Pool* pool, journal::Journal* journal, const crypto::KekProvider* kek,
                         uploads::Uploads* uploads, blob::ObjectStore* quarantine, blob::ObjectStore* bodies,
                         review::Options review, AttachmentsOptions opts)
    : pool_(pool),
      journal_(journal),
      kek_(kek),
      uploads_(uploads),
      quarantine_(quarantine),
      bodies_(bodies),
      review_(std::move(review)),
      opts_(opts) {}

blob::ObjectStore* Attachments::StoreOf(const Attachment& a) const { return StoreAt(a.location); }

blob::ObjectStore* Attachments::StoreAt(const std::string& location) const {
  return location == "bodies" ? bodies_ : quarantine_;
}

Result<std::vector<PreparedAttachment>> Attachments::Prepare(const Caller& c, const std::vector<std::string>& ids) {
  if (ids.size() > static_cast<size_t>(kMaxAttachments))
    return InvalidArgument("a claim takes at most " + std::to_string(kMaxAttachments) + " attachments, not " +
                               std::to_string(ids.size()),
                           "invalid-field");
  std::set<std::string> seen;
  for (const auto& id : ids) {
    if (!Claims::ValidUuid(id)) return InvalidArgument("attachments: '" + id + "' is not an upload id", "invalid-field");
    if (!seen.insert(id).second) return InvalidArgument("attachments: upload " + id + " is named twice", "invalid-field");
  }
  const uploads::Owner owner{c.tenant_id, c.api_key_id, c.api_key_hash, c.principal};
  // Every id is looked up before any object is read: a bad id costs no decryption.
  std::vector<uploads::CompletedUpload> found;
  for (const auto& id : ids) {
    OML_ASSIGN_OR_RETURN(uploads::CompletedUpload u, uploads_->LookupCompleted(owner, id));
    found.push_back(std::move(u));
  }
  std::vector<PreparedAttachment> out;
  for (size_t i = 0; i < found.size(); ++i) {
    const uploads::CompletedUpload& u = found[i];
    PreparedAttachment p;
    Attachment& a = p.a;
    a.ordinal = static_cast<int>(i) + 1;
    a.upload_id = u.upload_id;
    a.plaintext_sha256 = u.plaintext_sha256;
    a.ciphertext_sha256 = u.ciphertext_sha256;
    a.size = static_cast<int64_t>(u.size);
    a.ciphertext_size = static_cast<int64_t>(u.ciphertext_size);
    a.media_type = u.media_type;
    a.filename = u.filename;
    a.object_key = u.object_key;
    a.location = "quarantine";
    // Reviewed as it is decrypted from quarantine, whatever its size (review::ReviewStream); both
    // digests are checked by the end of the read, before anything is signed.
    OML_ASSIGN_OR_RETURN(crypto::SecureBytes dek,
                         kek_->UnwrapFrom(u.kek_id, u.wrapped_dek, uploads::UploadDekAad(c.tenant_id, u.upload_id)));
    ObjectPlaintext plain(quarantine_, u.object_key, u.ciphertext_size, dek.view(),
                          uploads::AttachmentAad(c.tenant_id, u.upload_id), u.ciphertext_sha256, u.plaintext_sha256);
    OML_ASSIGN_OR_RETURN(review::Review r, review::ReviewStream(review_, u.media_type, u.size, &plain, c.tenant_id));
    crypto::Wipe(&r.text);
    a.review = review::ReviewToJson(r);
    a.flagged = Flagging(a.review.value("flags", nlohmann::json::array()));
    out.push_back(std::move(p));
  }
  return out;
}

nlohmann::json Attachments::Binding(const std::vector<PreparedAttachment>& prepared) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : prepared)
    out.push_back({{"ordinal", p.a.ordinal},
                   {"plaintext_sha256", crypto::Hex(p.a.plaintext_sha256)},
                   {"ciphertext_sha256", crypto::Hex(p.a.ciphertext_sha256)},
                   {"media_type", p.a.media_type},
                   {"size", p.a.size}});
  return out;
}

std::vector<journal::EventSpec> Attachments::AttachEvents(const Caller& c, const std::string& artifact_id, int version,
                                                          const std::vector<PreparedAttachment>& prepared) const {
  std::vector<journal::EventSpec> evs;
  for (const auto& p : prepared) {
    const Attachment a = p.a;
    nlohmann::json payload = {{"artifact_id", artifact_id},
                              {"version", version},
                              {"ordinal", a.ordinal},
                              {"upload_id", a.upload_id},
                              {"plaintext_sha256", crypto::Hex(a.plaintext_sha256)},
                              {"ciphertext_sha256", crypto::Hex(a.ciphertext_sha256)},
                              {"media_type", a.media_type},
                              {"size", a.size},
                              {"ciphertext_size", a.ciphertext_size},
                              {"filename", a.filename.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.filename)},
                              {"review", a.review},
                              {"flagged", a.flagged}};
    journal::EventSpec ev{"submission.attach", c.principal, payload, nlohmann::json::object(), nullptr};
    const std::string tenant = c.tenant_id;
    ev.fold = [tenant, artifact_id, version, a](int64_t seq) -> std::vector<db::Stmt> {
      return {
          // The upload must still be complete (not attached by a racing claim, not cancelled):
          // moving its key and deleting it is guarded; zero rows fails the whole submission.
          {"WITH k AS (INSERT INTO oml.attachment_keys (tenant_id, upload_id, kek_id, wrapped_dek) "
           "SELECT tenant_id, upload_id, kek_id, wrapped_dek FROM oml.upload_sessions "
           "WHERE tenant_id = $1 AND upload_id = $2 AND state = 'complete' AND ciphertext_sha256 = $3 RETURNING 1) "
           "SELECT 1/count(*) FROM k",
           {db::Text(tenant), db::Text(a.upload_id), db::Bytes(a.ciphertext_sha256)},
           "oml_attach_key_move"},
          {"WITH d AS (DELETE FROM oml.upload_sessions WHERE tenant_id = $1 AND upload_id = $2 AND state = 'complete' "
           "RETURNING 1) SELECT 1/count(*) FROM d",
           {db::Text(tenant), db::Text(a.upload_id)},
           "oml_attach_upload_delete"},
          {"INSERT INTO oml.attachments (tenant_id, artifact_id, version, ordinal, upload_id, plaintext_sha256, "
           "ciphertext_sha256, size_bytes, ciphertext_size, media_type, filename, object_key, location, review, "
           "flagged, attach_seq) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,'quarantine',$13::jsonb,$14,$15)",
           {db::Text(tenant), db::Text(artifact_id), db::Int(version), db::Int(a.ordinal), db::Text(a.upload_id),
            db::Bytes(a.plaintext_sha256), db::Bytes(a.ciphertext_sha256), db::Int(a.size), db::Int(a.ciphertext_size),
            db::Text(a.media_type), a.filename.empty() ? db::Null() : db::Text(a.filename), db::Text(a.object_key),
            db::Text(a.review.dump()), db::Text(a.flagged ? "true" : "false"), db::Int(seq)},
           "oml_attach_insert"},
      };
    };
    ev.api_key_hash = c.api_key_hash;
    evs.push_back(std::move(ev));
  }
  return evs;
}

void Attachments::DropLeftoverParts(const std::string& tenant, const std::vector<PreparedAttachment>& prepared) {
  for (const auto& p : prepared) {
    auto keys = quarantine_->List(uploads::PartPrefix(tenant, p.a.upload_id));
    Status st = keys.status();
    if (keys.ok())
      for (const auto& k : *keys)
        if (Status d = quarantine_->Delete(k); !d.ok()) st = d;
    if (!st.ok())
      log::Warn("attached upload: leftover parts not deleted", {{"upload", p.a.upload_id}, {"error", st.ToString()}});
  }
}

Result<std::vector<Attachment>> Attachments::List(const std::string& tenant, const std::string& artifact_id,
                                                  int version) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(tenant, {std::string(kSelectAttachments) +
                                                             " AND version = $3 ORDER BY ordinal",
                                                         {db::Text(tenant), db::Text(artifact_id), db::Int(version)},
                                                         "oml_attachments_list"}));
  std::vector<Attachment> out;
  for (int i = 0; i < r.size(); ++i) out.push_back(FromRow(r, i));
  return out;
}

Result<std::vector<Attachment>> Attachments::ListAllVersions(const std::string& tenant,
                                                             const std::string& artifact_id) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(tenant, {std::string(kSelectAttachments) + " ORDER BY version, ordinal",
                                                         {db::Text(tenant), db::Text(artifact_id)},
                                                         "oml_attachments_list_all"}));
  std::vector<Attachment> out;
  for (int i = 0; i < r.size(); ++i) out.push_back(FromRow(r, i));
  return out;
}

Status Attachments::RecordServed(const Caller& c, const ClaimMeta& m, int item, const std::string& plaintext_sha256,
                                 const std::string& ciphertext_sha256) {
  if (!ReviewerOfHeld(c, m)) return Status::Ok();
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
    // Served before: a row backed by its signed event (as CheckAllServed counts it).
    OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(c.tenant_id,
                                                  {"SELECT 1 FROM oml.review_served s JOIN oml.journal j ON j.tenant_id "
                                                   "= s.tenant_id AND j.seq = s.served_seq WHERE s.tenant_id = $1 AND "
                                                   "s.artifact_id = $2 AND s.version = $3 AND s.item = $4 AND "
                                                   "s.reviewer = $5 AND convert_from(j.signed_bytes, 'UTF8')::jsonb @> "
                                                   "jsonb_build_object('type', 'review.served', 'principal', $5::text, "
                                                   "'payload', jsonb_build_object('artifact_id', $2::text, 'version', "
                                                   "$3::integer, 'item', $4::integer))",
                                                   {db::Text(c.tenant_id), db::Text(m.artifact_id), db::Int(m.version),
                                                    db::Int(item), db::Text(c.principal)},
                                                   "oml_served_check"}));
    if (r.size() > 0) return Status::Ok();
  }
  nlohmann::json payload = {{"artifact_id", m.artifact_id},
                            {"version", m.version},
                            {"item", item},
                            {"plaintext_sha256", crypto::Hex(plaintext_sha256)},
                            {"ciphertext_sha256", crypto::Hex(ciphertext_sha256)}};
  journal::EventSpec ev{"review.served", c.principal, payload, nlohmann::json::object(), nullptr};
  const std::string tenant = c.tenant_id, artifact = m.artifact_id, reviewer = c.principal;
  const int version = m.version;
  ev.fold = [=](int64_t seq) -> std::vector<db::Stmt> {
    // The row names the latest serve event (two racing serves journal two events; either one
    // backs the row). A row whose seq names no such event (not written by a serve) is replaced.
    return {{"INSERT INTO oml.review_served (tenant_id, artifact_id, version, item, reviewer, served_seq) "
             "VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (tenant_id, artifact_id, version, item, reviewer) "
             "DO UPDATE SET served_seq = EXCLUDED.served_seq",
             {db::Text(tenant), db::Text(artifact), db::Int(version), db::Int(item), db::Text(reviewer), db::Int(seq)},
             "oml_served_insert"}};
  };
  ev.api_key_hash = c.api_key_hash;
  return journal_->Append(c.tenant_id, ev).status();
}

Result<crypto::SecureBytes> Attachments::Dek(const std::string& tenant, const Attachment& a) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(tenant, {"SELECT kek_id, wrapped_dek FROM oml.attachment_keys "
                                                         "WHERE tenant_id = $1 AND upload_id = $2",
                                                         {db::Text(tenant), db::Text(a.upload_id)},
                                                         "oml_attachment_key"}));
  if (r.size() == 0)
    return Status(Code::kGone, "attachment " + std::to_string(a.ordinal) + " was erased (its key is destroyed)",
                  "erased");
  return kek_->UnwrapFrom(r.Get(0, 0), r.GetBytes(0, 1), uploads::UploadDekAad(tenant, a.upload_id));
}

namespace {

// Plaintext bytes per piece of a streamed attachment: with the ciphertext read for it, what one
// response holds in memory whatever the file's size (issue 19).
constexpr uint64_t kServePiece = 256 * 1024;

// Reads [first, first + want) of an attachment's plaintext piece by piece: ciphertext ranges of
// `store` from the segment that holds `first`, each segment authenticated as it is decrypted. A
// whole read (`whole`) also checks, at its end, that the object is exactly its ciphertext size and
// the plaintext its digest. Not thread-safe: one caller at a time (the HTTP server calls Next
// once per piece, in order).
class AttachmentReader {
 public:
  static Result<std::shared_ptr<AttachmentReader>> Open(blob::ObjectStore* store, blob::ObjectStore* bodies,
                                                        const Attachment& a, std::string_view dek,
                                                        const std::string& aad, uint64_t first, uint64_t want,
                                                        bool whole) {
    auto r = std::shared_ptr<AttachmentReader>(new AttachmentReader());
    r->a_ = a;
    r->what_ = a.ordinal == 0 ? std::string("the body") : "attachment " + std::to_string(a.ordinal);
    r->first_ = first;
    r->want_ = want;
    r->whole_ = whole;
    r->store_ = store;
    r->bodies_ = bodies;
    // A promotion racing this read may have moved the object from quarantine to bodies since
    // the row was read: look there once before calling the object missing.
    OML_ASSIGN_OR_RETURN(std::optional<std::string> header, store->GetRange(a.object_key, 0, crypto::kAeadHeaderSize));
    if (!header && a.location == "quarantine") {
      r->store_ = bodies;
      OML_ASSIGN_OR_RETURN(header, bodies->GetRange(a.object_key, 0, crypto::kAeadHeaderSize));
    }
    if (!header) return Status(Code::kDataLoss, "object " + a.object_key + " is missing", "integrity");
    if (whole) r->ct_hash_.Update(*header);
    uint32_t segment = 0;
    OML_ASSIGN_OR_RETURN(r->dec_, crypto::AeadStreamDecryptor::CreateAt(dek, aad, *header, 0, &segment));
    const uint64_t first_segment = whole ? 0 : first / segment;
    if (first_segment > 0) {  // the segment size is in the header: only now can the start be placed
      OML_ASSIGN_OR_RETURN(r->dec_, crypto::AeadStreamDecryptor::CreateAt(dek, aad, *header, first_segment));
    }
    r->pos_ = first_segment * segment;
    r->at_ = crypto::kAeadHeaderSize + first_segment * (uint64_t{segment} + crypto::kAeadTagSize);
    return r;
  }

  // The next piece of the range ("" once it was all returned). kDataLoss "integrity" if the
  // object is missing, shorter than the range, fails a tag, or (whole) does not match its digests;
  // a whole read's digests (plaintext, and ciphertext as journalled) are checked before its last
  // piece is returned, so a mismatch cuts the response short of its length.
  Result<std::string> Next() {
    while (sent_ < want_) {
      if (!pending_.empty()) {
        if (whole_ && sent_ + pending_.size() == want_) OML_RETURN_IF_ERROR(CheckWhole());
        return Take();
      }
      if (ended_)
        return Status(Code::kDataLoss, what_ + " is shorter than its size", "integrity");
      OML_RETURN_IF_ERROR(Read());
      Keep(pt_);
    }
    if (whole_) OML_RETURN_IF_ERROR(CheckWhole());  // an empty file
    return std::string();
  }

  // Takes back a piece Next returned, so that the next piece reuses its memory (wiped then, on
  // the worker that makes it: this runs on the connection's I/O thread).
  void Recycle(std::string piece) { spare_ = std::move(piece); }

 private:
  // pt_ := the plaintext of the next ciphertext range (Finish's too at the object's end). ct_ and
  // pt_ keep their memory from piece to piece.
  // A whole read of more than one range hashes its ciphertext on a thread of its own (the ranges
  // alternate between two buffers: one hashed there while the next is read and decrypted here).
  Status Read() {
    std::string& ct = ct_[cur_];
    cur_ ^= 1;
    OML_ASSIGN_OR_RETURN(bool found, store_->GetRangeInto(a_.object_key, at_, kServePiece, &ct));
    if (!found && store_ != bodies_ && a_.location == "quarantine") {
      // Promoted while it was being read: the same bytes are in bodies now.
      store_ = bodies_;
      OML_ASSIGN_OR_RETURN(found, store_->GetRangeInto(a_.object_key, at_, kServePiece, &ct));
    }
    if (!found) return Status(Code::kDataLoss, "object " + a_.object_key + " is missing", "integrity");
    if (whole_ && hashing_ == nullptr && static_cast<uint64_t>(a_.ciphertext_size) > kServePiece) {
      helper_ = std::make_unique<WorkPool>(1);
      hashing_ = std::make_unique<WorkPool::Group>(*helper_);
    }
    if (hashing_) {
      hashing_->Wait();  // the range before (the other buffer): ct_hash_ sees the ranges in order
      hashing_->Add([this, &ct] { ct_hash_.Update(ct); });
    } else if (whole_) {
      ct_hash_.Update(ct);
    }
    if (!ct.empty()) {
      at_ += ct.size();
      OML_RETURN_IF_ERROR(dec_->UpdateInto(ct, &pt_));  // replaces pt_ (its memory kept, no fill)
    } else {
      pt_.clear();
    }
    if (ct.size() < kServePiece) {  // the object's end: only the last segment's tag can tell
      OML_ASSIGN_OR_RETURN(std::string tail, dec_->Finish());
      pt_ += tail;
      crypto::Wipe(&tail);
      ended_ = true;
    }
    return Status::Ok();
  }

  // A whole read: the object read to its end is its ciphertext size, its plaintext its digest.
  Status CheckWhole() {
    if (checked_) return Status::Ok();
    checked_ = true;
    while (!ended_) {  // the range ended with the file's last byte; the last tag closes the stream
      OML_RETURN_IF_ERROR(Read());
      hash_.Update(pt_);
      if (!pt_.empty())
        return Status(Code::kDataLoss, what_ + " is longer than its size", "integrity");
    }
    if (hashing_) hashing_->Wait();
    if (at_ != static_cast<uint64_t>(a_.ciphertext_size) || hash_.Digest() != a_.plaintext_sha256 ||
        (!a_.ciphertext_sha256.empty() && ct_hash_.Digest() != a_.ciphertext_sha256))
      return Status(Code::kDataLoss, what_ + " does not match its digests", "integrity");
    return Status::Ok();
  }

  AttachmentReader() = default;

 public:
  ~AttachmentReader() {
    crypto::Wipe(&pt_);
    crypto::Wipe(&pending_);
    crypto::Wipe(&spare_);
  }

 private:

  // Keeps the part of `pt` (plaintext at pos_) inside the range; hashes all of it (whole reads).
  void Keep(const std::string& pt) {
    if (whole_) hash_.Update(pt);
    const uint64_t b = pos_, e = pos_ + pt.size();
    pos_ = e;
    const uint64_t lo = std::max(b, first_ + sent_ + pending_.size()), hi = std::min(e, first_ + want_);
    if (lo < hi) pending_.append(pt, lo - b, hi - lo);
  }

  std::string Take() {
    std::string out = std::move(pending_);
    pending_ = std::move(spare_);  // a piece handed back (Recycle), or nothing
    crypto::Wipe(&pending_);
    sent_ += out.size();
    return out;
  }

  Attachment a_;      // ordinal 0: a claim's body object (OpenBodyObject)
  std::string what_;  // "attachment <n>" or "the body", in errors
  blob::ObjectStore* store_ = nullptr;
  blob::ObjectStore* bodies_ = nullptr;
  std::unique_ptr<crypto::AeadStreamDecryptor> dec_;
  uploads::RunningSha256 hash_;     // the plaintext (whole reads)
  uploads::RunningSha256 ct_hash_;  // the ciphertext as read, header included (whole reads)
  uint64_t first_ = 0, want_ = 0, sent_ = 0;
  uint64_t pos_ = 0;  // plaintext offset of the next byte the decryptor returns
  uint64_t at_ = 0;   // ciphertext offset of the next read
  std::string pending_;
  std::string spare_;                // a piece given back by Recycle, for the next one's memory
  std::array<std::string, 2> ct_;    // Read's ranges, alternating (see Read)
  size_t cur_ = 0;                   // the ct_ the next Read fills
  std::string pt_;                   // Read's plaintext, reused
  bool whole_ = false, ended_ = false, checked_ = false;
  // Last: destroyed first, after the hash in flight, while ct_ and ct_hash_ are still there.
  std::unique_ptr<WorkPool> helper_;
  std::unique_ptr<WorkPool::Group> hashing_;
};

}  // namespace

Result<ServedAttachment> Attachments::Describe(const Caller& c, const ClaimMeta& m, int ordinal,
                                               std::optional<ByteRange> range) {
  OML_ASSIGN_OR_RETURN(std::vector<Attachment> atts, List(c.tenant_id, m.artifact_id, m.version));
  auto it = std::find_if(atts.begin(), atts.end(), [&](const Attachment& a) { return a.ordinal == ordinal; });
  if (it == atts.end())
    return NotFound("claim " + m.artifact_id + " has no attachment " + std::to_string(ordinal), "attachment-not-found");
  const Attachment& a = *it;
  if (m.erased_seq || a.location == "none")
    return Status(Code::kGone, "claim " + m.artifact_id + " was erased", "erased");
  const uint64_t size = static_cast<uint64_t>(a.size);
  uint64_t first = 0, last = size == 0 ? 0 : size - 1;
  if (range && range->suffix_length > 0) {
    if (size == 0)
      return Status(Code::kInvalidArgument, "a suffix range of an empty attachment is not satisfiable",
                    "range-not-satisfiable");
    range = ByteRange{size - std::min(range->suffix_length, size), size - 1, 0};
  }
  if (range) {
    if (range->first >= size || range->last < range->first)
      return Status(Code::kInvalidArgument,
                    "range " + std::to_string(range->first) + "-" + std::to_string(range->last) +
                        " is not satisfiable for " + std::to_string(size) + " bytes",
                    "range-not-satisfiable");
    first = range->first;
    last = std::min(range->last, size - 1);
  }
  ServedAttachment out;
  out.meta = a;
  out.first = first;
  out.length = size == 0 ? 0 : last - first + 1;
  out.partial = range.has_value();
  out.next = [] { return Result<std::string>(std::string()); };  // nothing is read
  return out;
}

Result<ServedAttachment> Attachments::Serve(const Caller& c, const ClaimMeta& m, int ordinal,
                                            std::optional<ByteRange> range) {
  OML_ASSIGN_OR_RETURN(ServedAttachment out, Describe(c, m, ordinal, range));
  const Attachment& a = out.meta;
  const uint64_t size = static_cast<uint64_t>(a.size), first = out.first, want = out.length;
  OML_ASSIGN_OR_RETURN(crypto::SecureBytes dek, Dek(c.tenant_id, a));
  const std::string aad = uploads::AttachmentAad(c.tenant_id, a.upload_id);
  auto open = [&]() {
    return AttachmentReader::Open(StoreOf(a), bodies_, a, dek.view(), aad, first, want, /*whole=*/!range);
  };
  // What is journalled is journalled before a byte leaves: a reviewer's serve of a held claim
  // (review.served, or the range progress that leads to it) is recorded only after the bytes were
  // decrypted and checked, in a first pass that keeps nothing; the bytes are then read again as
  // they are sent. Any other read is one pass, each segment authenticated before it is sent (and
  // a whole read's digests checked at its end: a failure then cuts the response short).
  if (ReviewerOfHeld(c, m)) {
    OML_ASSIGN_OR_RETURN(auto check, open());
    for (;;) {
      OML_ASSIGN_OR_RETURN(std::string piece, check->Next());
      if (piece.empty()) break;
      check->Recycle(std::move(piece));  // the next piece's memory (wiped before it is reused)
    }
    // A whole read serves the file; ranges serve it once they have covered it from byte 0 to its
    // end without a gap (review_progress, sql/0015), so one byte per file never counts as a review.
    if (!range) {
      OML_RETURN_IF_ERROR(RecordServed(c, m, ordinal, a.plaintext_sha256, a.ciphertext_sha256));
    } else {
      OML_ASSIGN_OR_RETURN(uint64_t upto, AdvanceProgress(c, m, ordinal, first, first + want));
      if (upto >= size) OML_RETURN_IF_ERROR(RecordServed(c, m, ordinal, a.plaintext_sha256, a.ciphertext_sha256));
    }
  }
  OML_ASSIGN_OR_RETURN(auto reader, open());
  out.next = [reader]() { return reader->Next(); };
  out.recycle = [reader](std::string piece) { reader->Recycle(std::move(piece)); };
  return out;
}

bool Attachments::ReviewerOfHeld(const Caller& c, const ClaimMeta& m) {
  return (c.role == "reviewer" || c.role == "admin") && m.state == "held";
}

Result<uint64_t> Attachments::AdvanceProgress(const Caller& c, const ClaimMeta& m, int item, uint64_t from,
                                              uint64_t to) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  const std::vector<db::Param> key = {db::Text(c.tenant_id), db::Text(m.artifact_id), db::Int(m.version),
                                      db::Int(item), db::Text(c.principal)};
  auto params = key;
  params.push_back(db::Int(static_cast<int64_t>(from)));
  params.push_back(db::Int(static_cast<int64_t>(to)));
  // Adds [from, to) to the ranges covered so far, in any order (sql/0020: adjacent and
  // overlapping ranges merge), and returns the prefix [0, served_upto) they cover from byte 0.
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      conn->Scoped(c.tenant_id,
                   {"INSERT INTO oml.review_progress AS p (tenant_id, artifact_id, version, item, reviewer, served_upto, "
                    "covered) VALUES ($1, $2, $3, $4, $5, CASE WHEN $6::int8 = 0 THEN $7::int8 ELSE 0 END, "
                    "int8multirange(int8range($6::int8, $7::int8))) "
                    "ON CONFLICT (tenant_id, artifact_id, version, item, reviewer) DO UPDATE "
                    "SET covered = p.covered + EXCLUDED.covered, "
                    "served_upto = coalesce((SELECT upper(x) FROM unnest(p.covered + EXCLUDED.covered) x "
                    "WHERE lower(x) = 0), 0) "
                    "RETURNING served_upto",
                    params, "oml_review_progress_ranges"}));
  return r.size() == 0 ? uint64_t{0} : static_cast<uint64_t>(r.GetInt(0, 0));
}

Result<std::optional<std::string>> Attachments::SearchText(const std::string& tenant, const Attachment& a) {
  if (a.review.value("review", "") != "text-extraction") return std::optional<std::string>();
  OML_ASSIGN_OR_RETURN(crypto::SecureBytes dek, Dek(tenant, a));
  ObjectPlaintext plain(StoreOf(a), a.object_key, static_cast<uint64_t>(a.ciphertext_size), dek.view(),
                        uploads::AttachmentAad(tenant, a.upload_id), a.ciphertext_sha256, a.plaintext_sha256);
  OML_ASSIGN_OR_RETURN(review::Review r,
                       review::ExtractTextStream(review_, a.media_type, static_cast<uint64_t>(a.size), &plain,
                                                 a.review.value("method", ""), tenant));
  if (r.kind != review::ReviewKind::kTextExtraction) {
    crypto::Wipe(&r.text);
    return std::optional<std::string>();
  }
  return std::optional<std::string>(std::move(r.text));
}

Status Attachments::CheckAllServed(const Caller& c, const ClaimMeta& m) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(c.tenant_id,
                                                // A served row counts only with its signed review.served
                                                // event: same reviewer, claim, item and ciphertext digest
                                                // (a row inserted by hand is not a serve).
                                                {"SELECT a.ordinal FROM oml.attachments a WHERE a.tenant_id = $1 AND "
                                                 "a.artifact_id = $2 AND a.version = $3 AND NOT EXISTS (SELECT 1 FROM "
                                                 "oml.review_served s JOIN oml.journal j ON j.tenant_id = s.tenant_id "
                                                 "AND j.seq = s.served_seq WHERE s.tenant_id = a.tenant_id AND "
                                                 "s.artifact_id = a.artifact_id AND s.version = a.version AND s.item = "
                                                 "a.ordinal AND s.reviewer = $4 AND convert_from(j.signed_bytes, 'UTF8')"
                                                 "::jsonb @> jsonb_build_object('type', 'review.served', 'principal', "
                                                 "$4::text, 'payload', jsonb_build_object('artifact_id', a.artifact_id::"
                                                 "text, 'version', a.version, 'item', a.ordinal, 'ciphertext_sha256', "
                                                 "encode(a.ciphertext_sha256, 'hex')))) ORDER BY a.ordinal",
                                                 {db::Text(c.tenant_id), db::Text(m.artifact_id), db::Int(m.version),
                                                  db::Text(c.principal)},
                                                 "oml_served_missing"}));
  if (r.size() == 0) return Status::Ok();
  std::string list;
  for (int i = 0; i < r.size(); ++i) list += (i ? ", " : "") + r.Get(i, 0);
  return FailedPrecondition("a verdict needs every attachment served to " + c.principal + " first; not served: " + list,
                            "attachments-not-served");
}

Status Attachments::CopyVerified(const std::string& key, uint64_t size, const std::string& sha256,
                                 const std::string& what) {
  OML_ASSIGN_OR_RETURN(std::unique_ptr<blob::ObjectWriter> w, bodies_->OpenWriter(key));
  uploads::RunningSha256 h;
  Status st = ReadObject(*quarantine_, key, size, [&](const std::string& ct) -> Status {
    h.Update(ct);
    return w->Write(ct);
  });
  if (st.ok() && h.Digest() != sha256)
    st = Status(Code::kDataLoss, what + ": the quarantined object " + key + " does not match its ciphertext digest",
                "integrity");
  if (!st.ok()) {
    (void)w->Abort();
    return st;
  }
  return w->Finish();
}

Status Attachments::CopyToBodies(const std::vector<Attachment>& atts) {
  for (const Attachment& a : atts) {
    if (a.location != "quarantine") continue;
    OML_RETURN_IF_ERROR(CopyVerified(a.object_key, static_cast<uint64_t>(a.ciphertext_size), a.ciphertext_sha256,
                                     "attachment " + std::to_string(a.ordinal)));
  }
  return Status::Ok();
}

// ---- Inline bodies kept as objects (sql/0015) ----------------------------------------------------

Result<std::string> Attachments::PutBodyObject(const std::string& tenant, const std::string& ciphertext,
                                               const std::string& ciphertext_sha256) {
  const std::string key = uploads::ObjectKey(tenant, ciphertext_sha256);
  OML_ASSIGN_OR_RETURN(bool created, quarantine_->PutIfAbsent(key, ciphertext));
  (void)created;  // an existing object of this name holds exactly these bytes (its name is their digest)
  return key;
}

Result<std::string> Attachments::ReadBodyObject(const std::string& location, const std::string& object_key) {
  if (location == "none") return Status(Code::kGone, "the body object was deleted", "erased");
  OML_ASSIGN_OR_RETURN(std::optional<std::string> ct, StoreAt(location)->Get(object_key));
  // A promotion racing this read may have moved it from quarantine to bodies meanwhile.
  if (!ct && location == "quarantine") {
    OML_ASSIGN_OR_RETURN(ct, bodies_->Get(object_key));
  }
  if (!ct) return Status(Code::kDataLoss, "body object " + object_key + " is missing", "integrity");
  return std::move(*ct);
}

Result<std::function<Result<std::string>()>> Attachments::OpenBodyObject(const std::string& location,
                                                                         const std::string& object_key,
                                                                         std::string_view dek, const std::string& aad,
                                                                         uint64_t plaintext_size,
                                                                         const std::string& plaintext_sha256,
                                                                         const std::string& ciphertext_sha256) {
  if (location == "none") return Status(Code::kGone, "the body object was deleted", "erased");
  // The reader's view of a body object: ordinal 0, the journalled digests, and the size the
  // object has now (the ciphertext digest is what pins it).
  Attachment a;
  a.ordinal = 0;
  a.object_key = object_key;
  a.location = location;
  a.size = static_cast<int64_t>(plaintext_size);
  a.plaintext_sha256 = plaintext_sha256;
  a.ciphertext_sha256 = ciphertext_sha256;
  OML_ASSIGN_OR_RETURN(std::optional<uint64_t> ct_size, StoreAt(location)->Size(object_key));
  if (!ct_size && location == "quarantine") {
    OML_ASSIGN_OR_RETURN(ct_size, bodies_->Size(object_key));
  }
  if (!ct_size) return Status(Code::kDataLoss, "body object " + object_key + " is missing", "integrity");
  a.ciphertext_size = static_cast<int64_t>(*ct_size);
  OML_ASSIGN_OR_RETURN(auto reader, AttachmentReader::Open(StoreAt(location), bodies_, a, dek, aad, 0, plaintext_size,
                                                           /*whole=*/true));
  return std::function<Result<std::string>()>([reader] { return reader->Next(); });
}

Result<std::vector<BodyObject>> Attachments::BodyObjects(const std::string& tenant, const std::string& artifact_id,
                                                         std::optional<int> version) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      conn->Scoped(tenant, {"SELECT b.version, b.location, b.object_key, a.ciphertext_sha256 FROM oml.artifact_bodies b "
                            "JOIN oml.artifacts a USING (tenant_id, artifact_id, version) WHERE b.tenant_id = $1 AND "
                            "b.artifact_id = $2 AND b.object_key IS NOT NULL AND ($3::integer IS NULL OR b.version = $3) "
                            "ORDER BY b.version",
                            {db::Text(tenant), db::Text(artifact_id), version ? db::Int(*version) : db::Null()},
                            "oml_body_objects"}));
  std::vector<BodyObject> out;
  for (int i = 0; i < r.size(); ++i)
    out.push_back({static_cast<int>(r.GetInt(i, 0)), r.Get(i, 1), r.Get(i, 2), r.GetBytes(i, 3)});
  return out;
}

Status Attachments::CopyBodyToBodies(const BodyObject& b) {
  if (b.location != "quarantine") return Status::Ok();
  OML_ASSIGN_OR_RETURN(std::optional<uint64_t> size, quarantine_->Size(b.object_key));
  if (!size) return Status(Code::kDataLoss, "body object " + b.object_key + " is missing", "integrity");
  return CopyVerified(b.object_key, *size, b.ciphertext_sha256, "body");
}

db::Stmt Attachments::PromoteBodyFold(const std::string& tenant, const std::string& artifact_id, int version) {
  return {"UPDATE oml.artifact_bodies SET location = 'bodies' WHERE tenant_id = $1 AND artifact_id = $2 AND "
          "version = $3 AND location = 'quarantine'",
          {db::Text(tenant), db::Text(artifact_id), db::Int(version)},
          "oml_body_promote"};
}

void Attachments::DropQuarantineBody(const BodyObject& b) {
  if (b.location == "quarantine") DeleteLogged(*quarantine_, b.object_key, "promoted body: the quarantine copy");
}

db::Stmt Attachments::EraseBodyFold(const std::string& tenant, const std::string& artifact_id) {
  return {"UPDATE oml.artifact_bodies SET location = 'none' WHERE tenant_id = $1 AND artifact_id = $2 AND "
          "object_key IS NOT NULL",
          {db::Text(tenant), db::Text(artifact_id)},
          "oml_body_erase"};
}

void Attachments::DeleteBodyObjects(const std::vector<BodyObject>& bodies) {
  for (const BodyObject& b : bodies) {
    if (b.location == "none") continue;
    DeleteEverywhere(b.object_key, "erased body");
  }
}

db::Stmt Attachments::PromoteFold(const std::string& tenant, const std::string& artifact_id, int version) {
  return {"UPDATE oml.attachments SET location = 'bodies' WHERE tenant_id = $1 AND artifact_id = $2 AND version = $3 "
          "AND location = 'quarantine'",
          {db::Text(tenant), db::Text(artifact_id), db::Int(version)},
          "oml_attach_promote"};
}

void Attachments::DropQuarantineCopies(const std::vector<Attachment>& atts) {
  for (const Attachment& a : atts)
    if (a.location == "quarantine") DeleteLogged(*quarantine_, a.object_key, "promoted attachment: the quarantine copy");
}

std::vector<db::Stmt> Attachments::EraseFold(const std::string& tenant, const std::string& artifact_id) {
  return {{"DELETE FROM oml.attachment_keys k USING oml.attachments a WHERE k.tenant_id = $1 AND a.tenant_id = $1 "
           "AND a.artifact_id = $2 AND k.upload_id = a.upload_id",
           {db::Text(tenant), db::Text(artifact_id)},
           "oml_attach_erase_keys"},
          {"UPDATE oml.attachments SET location = 'none' WHERE tenant_id = $1 AND artifact_id = $2",
           {db::Text(tenant), db::Text(artifact_id)},
           "oml_attach_erase"}};
}

void Attachments::DeleteObjects(const std::vector<Attachment>& atts) {
  // From both buckets, whatever the row said when it was read: a promotion racing the erasure,
  // a copy left in bodies by a failed accept, or a quarantine copy a crash kept after promotion.
  for (const Attachment& a : atts) {
    if (a.location == "none") continue;
    DeleteEverywhere(a.object_key, "erased attachment");
  }
}

void Attachments::DeleteLogged(blob::ObjectStore& store, const std::string& key, const std::string& what) {
  if (Status st = store.Delete(key); !st.ok())
    log::Warn(what + " was not deleted", {{"object_key", key}, {"error", st.ToString()}});
}

void Attachments::DeleteEverywhere(const std::string& key, const char* what) {
  for (blob::ObjectStore* store : {quarantine_, bodies_})
    DeleteLogged(*store, key, std::string(what) + ": an object (its key is destroyed)");
}

nlohmann::json Attachments::VerdictFlags(const nlohmann::json& body_review, const std::vector<Attachment>& atts) {
  std::set<std::string> flags;
  if (body_review.is_object())
    for (const auto& f : body_review.value("flags", nlohmann::json::array())) flags.insert("body:" + f.get<std::string>());
  for (const Attachment& a : atts)
    for (const auto& f : a.review.value("flags", nlohmann::json::array()))
      flags.insert("attachment " + std::to_string(a.ordinal) + ":" + f.get<std::string>());
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : flags) out.push_back(f);
  return out;
}

}  // namespace oml::admission
