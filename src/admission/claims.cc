#include "admission/claims.h"

#include "admission/attachments.h"
#include "review/review.h"

#include <regex>

#include "common/log.h"
#include "common/sync_point.h"
#include "fields/fields.h"
#include "admission/lifecycle.h"
#include "admission/recall.h"

namespace oml::admission {
namespace {

// Own-work rule: a claim that is not promoted exists only for its author, reviewers and admins
// (404 for anyone else, so ids cannot be probed): a held claim awaits review, a rejected one was
// never released, a demoted one was withdrawn. An erased claim stays as private: its erasure seq
// is only revealed to those who could read it. (admission/events.h applies the same rule.)
bool HiddenFrom(const ClaimMeta& m, const Caller& c) {
  return m.state != "promoted" && m.principal != c.principal && c.role != "reviewer" && c.role != "admin";
}

// One row per ReviewAct (claims.h). `seq_column` is spliced into the fold's SQL: a constant here.
struct ReviewRule {
  const char* from;        // the state the act starts from
  const char* to;          // the state it sets
  const char* seq_column;  // artifacts column that records the event's seq
  const char* wrong_state; // problem type when the claim is not in `from`
  const char* verdict;     // payload member "verdict"; nullptr: none
  bool silver;             // enqueues the claim's silver/claims row
  const char* fold_name;   // prepared-statement name of the fold's UPDATE
};
const ReviewRule& RuleOf(ReviewAct act) {
  static const ReviewRule kAccept{"held", "promoted", "promoted_seq", "claim-not-held", "accept", true, "oml_review_promote"};
  static const ReviewRule kReject{"held", "rejected", "rejected_seq", "claim-not-held", "reject", false, "oml_review_reject"};
  static const ReviewRule kDemote{"promoted", "demoted", "demoted_seq", "claim-not-promoted", nullptr, true,
                                  "oml_review_demote"};
  switch (act) {
    case ReviewAct::kAccept: return kAccept;
    case ReviewAct::kReject: return kReject;
    case ReviewAct::kDemote: return kDemote;
  }
  return kAccept;  // unreachable
}

// The event of a review act. Types spelled out one per act: docs/data/event-catalog.md lists them.
journal::EventSpec ReviewEvent(ReviewAct act, const std::string& principal, nlohmann::json payload) {
  if (act == ReviewAct::kAccept) {
    journal::EventSpec ev{"claim.promoted", principal, std::move(payload)};
    return ev;
  }
  if (act == ReviewAct::kReject) {
    journal::EventSpec ev{"claim.rejected", principal, std::move(payload)};
    return ev;
  }
  journal::EventSpec ev{"claim.demoted", principal, std::move(payload)};
  return ev;
}

// Enqueues the silver/claims rows of a claim for the event at $4 (sql/0009): $3 NULL = every
// version that was ever promoted.
const char* kEnqueueSilver = "SELECT oml.enqueue_silver_claims($1, $2, $3, $4)";

std::string BodyAad(const std::string& t, const std::string& a, int v) {
  return "oml-body|" + t + "|" + a + "|" + std::to_string(v);
}
bool ValidUtf8(const std::string& s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    for (int k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += len;
  }
  return true;
}

constexpr size_t kMaxIdempotencyKey = 255;
// Expired idempotency rows of the tenant each idempotent write deletes besides its own key's.
constexpr int kIdempotencyPurgeBatch = 8;

const char* kSelectMeta =
    "SELECT artifact_id, version, workarea_id, path, principal, writer_key_id, provenance, simulation_id, "
    "media_type, size_bytes, plaintext_sha256, ciphertext_sha256, state, submitted_seq, erased_seq, "
    "promoted_seq, rejected_seq, demoted_seq, body_review::text "
    "FROM oml.artifacts WHERE tenant_id = $1 AND artifact_id = $2 ORDER BY version DESC LIMIT 1";

}  // namespace

std::string DekAad(const std::string& tenant, const std::string& artifact_id) {
  return "oml-dek|" + tenant + "|" + artifact_id;
}

bool Claims::ValidUuid(const std::string& s) {
  static const std::regex kUuid("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$");
  return std::regex_match(s, kUuid);
}

Status Claims::CheckSubmit(const Caller& c, const SubmitRequest& req) const {
  if (c.role == "reviewer") return PermissionDenied("role reviewer may not submit claims", "forbidden-role");
  if (req.body.size() > max_body_)
    return Status(Code::kPayloadTooLarge,
                  "body is " + std::to_string(req.body.size()) + " bytes; the limit is " + std::to_string(max_body_),
                  "body-too-large");
  if (!ValidUtf8(req.body)) return InvalidArgument("body must be UTF-8 text", "invalid-field");
  // Every metadata field is signed into claim.submitted: fields/fields.h holds their rules.
  OML_RETURN_IF_ERROR(fields::CheckWorkareaId(req.workarea_id));
  OML_RETURN_IF_ERROR(fields::CheckPath(req.path));
  OML_RETURN_IF_ERROR(fields::CheckProvenance(req.provenance));
  if (req.simulation_id) OML_RETURN_IF_ERROR(fields::CheckSimulationId(*req.simulation_id));
  OML_RETURN_IF_ERROR(fields::CheckMediaType(req.media_type));
  return Status::Ok();
}

namespace {

// Hits listed in a signed body review at most (the rest is counted in hits_truncated).
constexpr size_t kMaxSignedHits = 100;

// The deny-list gate's record of an inline body, as claim.submitted signs it: never the matched
// text, only pattern ids and offsets.
nlohmann::json BodyReview(const review::Options& opts, const std::string& body) {
  review::ScanHits h = review::GateText(opts, body);
  nlohmann::json hits = nlohmann::json::array();
  for (size_t i = 0; i < h.hits.size() && i < kMaxSignedHits; ++i)
    hits.push_back({{"pattern", h.hits[i].pattern_id}, {"offset", h.hits[i].offset}});
  return {{"review", "text-extraction"},
          {"method", "text"},
          {"deny_list_hits", hits},
          {"hits_truncated", h.truncated || h.hits.size() > kMaxSignedHits},
          {"flags", h.hits.empty() ? nlohmann::json::array() : nlohmann::json::array({"deny-list"})}};
}

}  // namespace

Result<SubmitResult> Claims::Submit(const Caller& c, const SubmitRequest& req) {
  OML_RETURN_IF_ERROR(CheckSubmit(c, req));
  return DoSubmit(c, req, nullptr);
}

Result<SubmitResult> Claims::DoSubmit(const Caller& c, const SubmitRequest& req, const ExtraFold* extra) {
  ClaimMeta m;
  m.artifact_id = crypto::NewUuidV4();
  m.version = 1;
  m.workarea_id = req.workarea_id;
  m.path = req.path;
  m.principal = c.principal;
  m.writer_key_id = c.api_key_id;
  m.provenance = req.provenance;
  m.simulation_id = req.simulation_id;
  m.media_type = req.media_type;
  m.size = static_cast<int64_t>(req.body.size());
  m.state = "held";
  // A claim under a simulation needs it running (admission/lifecycle.h); the fold checks again.
  if (m.simulation_id) OML_RETURN_IF_ERROR(CheckSimulationRunning(*pool_, c.tenant_id, *m.simulation_id));

  // Attachments are read, checked and reviewed before anything is signed (attachments.h).
  std::vector<PreparedAttachment> prepared;
  if (!req.attachments.empty()) {
    if (attachments_ == nullptr)
      return FailedPrecondition("this server does not take attachments", "attachments-unavailable");
    OML_ASSIGN_OR_RETURN(prepared, attachments_->Prepare(c, req.attachments));
  }
  if (attachments_ != nullptr) m.body_review = BodyReview(attachments_->review_options(), req.body);

  // Encrypt before signing: both digests exist when the event is signed.
  const crypto::SecureBytes dek(crypto::RandomBytes(32));  // wiped on every return
  OML_ASSIGN_OR_RETURN(std::string ct,
                       crypto::EncryptAll(dek.view(), BodyAad(c.tenant_id, m.artifact_id, m.version), req.body));
  OML_ASSIGN_OR_RETURN(std::string wrapped, kek_->Wrap(dek.view(), DekAad(c.tenant_id, m.artifact_id)));
  m.plaintext_sha256 = crypto::Sha256(req.body);
  m.ciphertext_sha256 = crypto::Sha256(ct);
  // The placement rule (sql/0015, attachments.h): a large body's ciphertext is an object in
  // quarantine, put before anything is signed; a small one stays in artifact_bodies.
  std::optional<std::string> body_object;
  if (attachments_ != nullptr && attachments_->BodyAsObject(ct.size())) {
    OML_ASSIGN_OR_RETURN(std::string key, attachments_->PutBodyObject(c.tenant_id, ct, m.ciphertext_sha256));
    body_object = std::move(key);
  }

  nlohmann::json payload = {{"artifact_id", m.artifact_id},
                            {"version", m.version},
                            {"workarea_id", m.workarea_id},
                            {"path", m.path},
                            {"writer_key_id", m.writer_key_id},
                            {"principal", m.principal},
                            {"provenance", m.provenance},
                            {"simulation_id", m.simulation_id ? nlohmann::json(*m.simulation_id) : nlohmann::json(nullptr)},
                            {"media_type", m.media_type},
                            {"size", m.size},
                            {"plaintext_sha256", crypto::Hex(m.plaintext_sha256)},
                            {"ciphertext_sha256", crypto::Hex(m.ciphertext_sha256)}};
  if (!m.body_review.is_null()) payload["review"] = m.body_review;
  if (!prepared.empty()) payload["attachments"] = Attachments::Binding(prepared);
  journal::EventSpec ev{"claim.submitted", c.principal, payload, nlohmann::json::object(), nullptr};
  const std::string tenant = c.tenant_id, kek_id = kek_->kek_id();
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    std::vector<db::Stmt> stmts = {
            {"INSERT INTO oml.artifacts (tenant_id, artifact_id, version, workarea_id, path, principal, writer_key_id, "
             "provenance, simulation_id, media_type, size_bytes, plaintext_sha256, ciphertext_sha256, state, submitted_seq, "
             "body_review) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,'held',$14,$15::jsonb)",
             {db::Text(tenant), db::Text(m.artifact_id), db::Int(m.version), db::Text(m.workarea_id), db::Text(m.path),
              db::Text(m.principal), db::Text(m.writer_key_id), db::Text(m.provenance),
              m.simulation_id ? db::Text(*m.simulation_id) : db::Null(), db::Text(m.media_type), db::Int(m.size),
              db::Bytes(m.plaintext_sha256), db::Bytes(m.ciphertext_sha256), db::Int(seq),
              m.body_review.is_null() ? db::Null() : db::Text(m.body_review.dump())},
             "oml_claim_insert"},
            body_object
                ? db::Stmt{"INSERT INTO oml.artifact_bodies (tenant_id, artifact_id, version, location, object_key) "
                           "VALUES ($1,$2,$3,'quarantine',$4)",
                           {db::Text(tenant), db::Text(m.artifact_id), db::Int(m.version), db::Text(*body_object)},
                           "oml_claim_body_object_insert"}
                : db::Stmt{"INSERT INTO oml.artifact_bodies (tenant_id, artifact_id, version, ciphertext) VALUES ($1,$2,$3,$4)",
                           {db::Text(tenant), db::Text(m.artifact_id), db::Int(m.version), db::Bytes(ct)},
                           "oml_claim_body_insert"},
            {"INSERT INTO oml.artifact_keys (tenant_id, artifact_id, kek_id, wrapped_dek) VALUES ($1,$2,$3,$4)",
             {db::Text(tenant), db::Text(m.artifact_id), db::Text(kek_id), db::Bytes(wrapped)},
             "oml_claim_key_insert"}};
    if (m.simulation_id) stmts.push_back(SimulationRunningGuard(tenant, *m.simulation_id));
    if (extra != nullptr) {
      ClaimMeta at = m;
      at.submitted_seq = seq;
      for (auto& st : (*extra)(at, seq)) stmts.push_back(std::move(st));
    }
    return stmts;
  };
  ev.api_key_hash = c.api_key_hash;  // refused (401) if the key was revoked meanwhile
  if (prepared.empty()) {
    auto appended = journal_->Append(c.tenant_id, ev);
    if (!appended.ok()) OML_RETURN_IF_ERROR(SimulationRefusal(*pool_, c.tenant_id, m.simulation_id, appended.status()));
    OML_ASSIGN_OR_RETURN(journal::Receipt rc, std::move(appended));
    m.submitted_seq = rc.seq;
    return SubmitResult{m, rc};
  }
  // claim.submitted and its submission.attach events: consecutive seqs, one transaction.
  std::vector<journal::EventSpec> attach = attachments_->AttachEvents(c, m.artifact_id, m.version, prepared);
  std::vector<const journal::EventSpec*> all = {&ev};
  for (const auto& e : attach) all.push_back(&e);
  OML_ASSIGN_OR_RETURN(journal::Journal::Txn tx, journal_->Begin());
  auto rcs = tx.AppendMany(c.tenant_id, all, /*commit_now=*/true);
  if (!rcs.ok()) {
    OML_RETURN_IF_ERROR(SimulationRefusal(*pool_, c.tenant_id, m.simulation_id, rcs.status()));
    if (rcs.status().type() == db::kZeroRowsGuard)
      return NotFound("an attached upload was attached by another claim, cancelled or expired meanwhile",
                      "upload-not-found");
    return rcs.status();
  }
  attachments_->DropLeftoverParts(c.tenant_id, prepared);
  m.submitted_seq = rcs->front().seq;
  return SubmitResult{m, rcs->front()};
}

Result<std::optional<ClaimMeta>> Claims::Load(db::Conn& conn, const std::string& tenant, const std::string& artifact_id) {
  OML_ASSIGN_OR_RETURN(db::Rows r, conn.Query(kSelectMeta, {db::Text(tenant), db::Text(artifact_id)}));
  if (r.size() == 0) return std::optional<ClaimMeta>();
  ClaimMeta m;
  m.artifact_id = r.Get(0, 0);
  m.version = static_cast<int>(r.GetInt(0, 1));
  m.workarea_id = r.Get(0, 2);
  m.path = r.Get(0, 3);
  m.principal = r.Get(0, 4);
  m.writer_key_id = r.Get(0, 5);
  m.provenance = r.Get(0, 6);
  if (!r.IsNull(0, 7)) m.simulation_id = r.Get(0, 7);
  m.media_type = r.Get(0, 8);
  m.size = r.GetInt(0, 9);
  m.plaintext_sha256 = r.GetBytes(0, 10);
  m.ciphertext_sha256 = r.GetBytes(0, 11);
  m.state = r.Get(0, 12);
  m.submitted_seq = r.GetInt(0, 13);
  if (!r.IsNull(0, 14)) m.erased_seq = r.GetInt(0, 14);
  if (!r.IsNull(0, 15)) m.promoted_seq = r.GetInt(0, 15);
  if (!r.IsNull(0, 16)) m.rejected_seq = r.GetInt(0, 16);
  if (!r.IsNull(0, 17)) m.demoted_seq = r.GetInt(0, 17);
  if (!r.IsNull(0, 18)) m.body_review = nlohmann::json::parse(r.Get(0, 18), nullptr, /*allow_exceptions=*/false);
  return std::optional<ClaimMeta>(m);
}

// What Fetch and FetchStreamed read first, in one read-only snapshot: the claim as the caller may
// see it, where its ciphertext is, and its DEK unwrapped.
struct Claims::BodyAt {
  ClaimMeta meta;
  std::string ciphertext;  // inline (location "postgres"); "" for an object
  std::string location, object_key;
  crypto::SecureBytes dek;
};

Result<Claims::BodyAt> Claims::LocateBody(const Caller& c, const std::string& artifact_id) {
  if (!ValidUuid(artifact_id)) return NotFound("no claim " + artifact_id, "claim-not-found");
  BodyAt out;
  std::string kek_id, wrapped;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
    OML_RETURN_IF_ERROR(conn->Exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").status());
    struct Done {
      db::Conn& c;
      ~Done() { (void)c.Exec("COMMIT"); }
    } done{*conn};
    OML_RETURN_IF_ERROR(conn->Pipeline({db::ScopeTo(c.tenant_id)}).status());
    OML_ASSIGN_OR_RETURN(auto meta, Load(*conn, c.tenant_id, artifact_id));
    if (!meta) return NotFound("no claim " + artifact_id, "claim-not-found");
    if (HiddenFrom(*meta, c)) return NotFound("no claim " + artifact_id, "claim-not-found");
    if (meta->erased_seq)
      return Status(Code::kGone, "claim " + artifact_id + " was erased at seq " + std::to_string(*meta->erased_seq), "erased");
    OML_ASSIGN_OR_RETURN(db::Rows b, conn->Query("SELECT b.ciphertext, k.wrapped_dek, k.kek_id, b.location, b.object_key "
                                                 "FROM oml.artifact_bodies b "
                                                 "LEFT JOIN oml.artifact_keys k USING (tenant_id, artifact_id) "
                                                 "WHERE b.tenant_id = $1 AND b.artifact_id = $2 AND b.version = $3",
                                                 {db::Text(c.tenant_id), db::Text(artifact_id), db::Int(meta->version)}));
    if (b.size() == 0 || b.IsNull(0, 1))
      return DataLoss("claim " + artifact_id + " has no stored body or key", "integrity");
    out.meta = std::move(*meta);
    out.location = b.Get(0, 3);
    if (out.location == "postgres") out.ciphertext = b.GetBytes(0, 0);
    else out.object_key = b.Get(0, 4);
    wrapped = b.GetBytes(0, 1);
    kek_id = b.Get(0, 2);
  }
  if (out.location != "postgres" && attachments_ == nullptr)
    return DataLoss("claim " + artifact_id + "'s body is an object and this process has no object store", "integrity");
  // Unwrapped under the KEK the row names (during a KEK rotation, the new or the previous one).
  auto dek = kek_->UnwrapFrom(kek_id, wrapped, DekAad(c.tenant_id, artifact_id));
  if (!dek.ok() && dek.status().type() == "kek-unavailable") return dek.status();
  if (!dek.ok()) return DataLoss("DEK of claim " + artifact_id + " does not unwrap", "integrity");
  out.dek = std::move(dek).value();
  return out;
}

Result<FetchResult> Claims::Fetch(const Caller& c, const std::string& artifact_id) {
  OML_ASSIGN_OR_RETURN(BodyAt at, LocateBody(c, artifact_id));
  return DecryptWhole(c, artifact_id, std::move(at));
}

Result<FetchResult> Claims::DecryptWhole(const Caller& c, const std::string& artifact_id, BodyAt at) {
  std::string ct = std::move(at.ciphertext);
  if (at.location != "postgres") {  // a body kept as an object (sql/0015)
    OML_ASSIGN_OR_RETURN(ct, attachments_->ReadBodyObject(at.location, at.object_key));
  }
  if (!crypto::ConstantTimeEquals(crypto::Sha256(ct), at.meta.ciphertext_sha256))
    return DataLoss("ciphertext of claim " + artifact_id + " does not match its journalled digest", "integrity");
  auto pt = crypto::DecryptAll(at.dek.view(), BodyAad(c.tenant_id, artifact_id, at.meta.version), ct);
  if (!pt.ok()) return DataLoss("body of claim " + artifact_id + " does not decrypt", "integrity");
  if (!crypto::ConstantTimeEquals(crypto::Sha256(*pt), at.meta.plaintext_sha256)) {
    crypto::Wipe(&*pt);
    return DataLoss("plaintext of claim " + artifact_id + " does not match its journalled digest", "integrity");
  }
  return FetchResult{std::move(at.meta), std::move(pt).value()};
}

Result<StreamedFetch> Claims::FetchStreamed(const Caller& c, const std::string& artifact_id) {
  OML_ASSIGN_OR_RETURN(BodyAt at, LocateBody(c, artifact_id));
  StreamedFetch out;
  if (at.location == "postgres") {  // small: decrypted and checked here, as Fetch does
    OML_ASSIGN_OR_RETURN(FetchResult whole, DecryptWhole(c, artifact_id, std::move(at)));
    out.meta = std::move(whole.meta);
    out.body = std::move(whole.body);
    return out;
  }
  out.meta = at.meta;
  out.streamed = true;
  // Each pass opens its own reader over the object; the DEK lives as long as the last pass can.
  auto dek = std::make_shared<crypto::SecureBytes>(std::move(at.dek));
  admission::Attachments* atts = attachments_;
  const std::string aad = BodyAad(c.tenant_id, artifact_id, at.meta.version);
  out.open = [atts, dek, aad, location = at.location, key = at.object_key, size = static_cast<uint64_t>(at.meta.size),
              pt_digest = at.meta.plaintext_sha256, ct_digest = at.meta.ciphertext_sha256]() {
    return atts->OpenBodyObject(location, key, dek->view(), aad, size, pt_digest, ct_digest);
  };
  return out;
}

Result<std::pair<ClaimMeta, journal::Receipt>> Claims::Erase(const Caller& c, const std::string& artifact_id,
                                                             const std::string& reason) {
  OML_RETURN_IF_ERROR(fields::CheckReason(reason));
  return DoErase(c, artifact_id, reason, nullptr);
}

Result<std::pair<ClaimMeta, journal::Receipt>> Claims::DoErase(const Caller& c, const std::string& artifact_id,
                                                               const std::string& reason, const ExtraFold* extra) {
  if (!ValidUuid(artifact_id)) return NotFound("no claim " + artifact_id, "claim-not-found");
  OML_ASSIGN_OR_RETURN(ClaimMeta meta, LoadNewest(c, artifact_id));
  if (HiddenFrom(meta, c)) return NotFound("no claim " + artifact_id, "claim-not-found");
  if (c.role != "admin" && meta.principal != c.principal)
    return PermissionDenied("only an admin or the author may erase a claim", "forbidden-role");
  if (meta.erased_seq)
    return Status(Code::kGone, "claim " + artifact_id + " was erased at seq " + std::to_string(*meta.erased_seq), "erased");
  nlohmann::json payload = {{"artifact_id", artifact_id},
                            {"plaintext_sha256", crypto::Hex(meta.plaintext_sha256)},
                            {"ciphertext_sha256", crypto::Hex(meta.ciphertext_sha256)},
                            {"reason", reason}};
  // Attachments of every version: their keys are destroyed with the artifact's, then the objects
  // are deleted (attachments.h). The event lists the ciphertext digests it shreds.
  std::vector<Attachment> atts;
  std::vector<BodyObject> body_objects;
  if (attachments_ != nullptr) {
    OML_ASSIGN_OR_RETURN(body_objects, attachments_->BodyObjects(c.tenant_id, artifact_id, std::nullopt));
    OML_ASSIGN_OR_RETURN(atts, attachments_->ListAllVersions(c.tenant_id, artifact_id));
    if (!atts.empty()) {
      nlohmann::json shredded = nlohmann::json::array();
      for (const auto& a : atts) shredded.push_back(crypto::Hex(a.ciphertext_sha256));
      payload["attachments_ciphertext_sha256"] = shredded;
    }
  }
  journal::EventSpec ev{"artifact.erased", c.principal, payload, nlohmann::json::object(), nullptr};
  const std::string tenant = c.tenant_id;
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    // The guarded UPDATE makes a concurrent double erase fail instead of journalling twice.
    std::vector<db::Stmt> stmts = {
            {"WITH u AS (UPDATE oml.artifacts SET state = 'erased', erased_seq = $3 "
             "WHERE tenant_id = $1 AND artifact_id = $2 AND erased_seq IS NULL RETURNING 1) SELECT 1/count(*) FROM u",
             {db::Text(tenant), db::Text(artifact_id), db::Int(seq)}},
            {"DELETE FROM oml.artifact_keys WHERE tenant_id = $1 AND artifact_id = $2",
             {db::Text(tenant), db::Text(artifact_id)}},
            // Body objects (sql/0015): location 'none' before the silver rows are built from it.
            Attachments::EraseBodyFold(tenant, artifact_id),
            // Retracts every version that was ever promoted from silver/claims (state "erased").
            {kEnqueueSilver, {db::Text(tenant), db::Text(artifact_id), db::Null(), db::Int(seq)}, "oml_silver_enqueue"}};
    if (!atts.empty())
      for (auto& st : Attachments::EraseFold(tenant, artifact_id)) stmts.push_back(std::move(st));
    if (extra != nullptr) {
      ClaimMeta at = meta;
      at.state = "erased";
      at.erased_seq = seq;
      for (auto& st : (*extra)(at, seq)) stmts.push_back(std::move(st));
    }
    return stmts;
  };
  ev.api_key_hash = c.api_key_hash;  // refused (401) if the key was revoked meanwhile
  auto rc = journal_->Append(c.tenant_id, ev);
  if (!rc.ok()) {
    if (rc.status().type() == db::kZeroRowsGuard)
      return Status(Code::kGone, "claim " + artifact_id + " was erased concurrently", "erased");
    return rc.status();
  }
  if (!atts.empty()) attachments_->DeleteObjects(atts);
  if (!body_objects.empty()) attachments_->DeleteBodyObjects(body_objects);
  meta.state = "erased";
  meta.erased_seq = rc->seq;
  return std::make_pair(meta, *rc);
}

// ---- Review (sql/0009_review.sql) ----------------------------------------------------------------

Result<ReviewAct> ParseVerdict(const std::string& verdict) {
  if (verdict == "accept") return ReviewAct::kAccept;
  if (verdict == "reject") return ReviewAct::kReject;
  return InvalidArgument("verdict must be \"accept\" or \"reject\"", "invalid-field");
}

Result<ClaimMeta> Claims::LoadNewest(const Caller& c, const std::string& artifact_id) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_RETURN_IF_ERROR(conn->Pipeline({{"BEGIN", {}}, db::ScopeTo(c.tenant_id)}).status());
  auto m = Load(*conn, c.tenant_id, artifact_id);
  (void)conn->Exec("COMMIT");
  if (!m.ok()) return m.status();
  if (!*m) return NotFound("no claim " + artifact_id, "claim-not-found");
  return **m;
}

Result<std::pair<ClaimMeta, journal::Receipt>> Claims::Review(const Caller& c, const std::string& artifact_id,
                                                              ReviewAct act, const std::string& reason) {
  OML_RETURN_IF_ERROR(fields::CheckReason(reason));
  return DoReview(c, artifact_id, act, reason, nullptr);
}

Result<std::pair<ClaimMeta, journal::Receipt>> Claims::DoReview(const Caller& c, const std::string& artifact_id,
                                                                ReviewAct act, const std::string& reason,
                                                                const ExtraFold* extra) {
  const ReviewRule& rule = RuleOf(act);
  if (c.role != "reviewer" && c.role != "admin")
    return PermissionDenied("role " + c.role + " may not review claims", "forbidden-role");
  if (!ValidUuid(artifact_id)) return NotFound("no claim " + artifact_id, "claim-not-found");
  // The refusal of a claim in `m`'s state; OK if the act may start from it.
  auto refusal = [&](const ClaimMeta& m) -> Status {
    if (HiddenFrom(m, c)) return NotFound("no claim " + artifact_id, "claim-not-found");
    if (m.erased_seq)
      return Status(Code::kGone, "claim " + artifact_id + " was erased at seq " + std::to_string(*m.erased_seq), "erased");
    if (m.state != rule.from)
      return FailedPrecondition("claim " + artifact_id + " is " + m.state + ", not " + rule.from, rule.wrong_state);
    return Status::Ok();
  };
  OML_ASSIGN_OR_RETURN(ClaimMeta meta, LoadNewest(c, artifact_id));
  OML_RETURN_IF_ERROR(refusal(meta));
  // Promotion queues the claim's text for the search index (sql/0028; IndexSearchQueue builds it
  // after the commit). Leaving 'promoted' later removes the text in that event's transaction
  // (sql/0012 trigger).
  // Attachments (attachments.h): a verdict needs every attachment served to this reviewer; it
  // records the claim's flags; an accept copies the ciphertext to the bodies bucket first.
  std::vector<Attachment> atts;
  if (attachments_ != nullptr && act != ReviewAct::kDemote) {
    OML_RETURN_IF_ERROR(attachments_->CheckAllServed(c, meta));
    OML_ASSIGN_OR_RETURN(atts, attachments_->List(c.tenant_id, artifact_id, meta.version));
  }
  // An accept reads the body as Fetch serves it first (digests verified): kek-unavailable or
  // integrity refuse the promotion. Its text (and the attachments') is indexed for search after
  // the commit (IndexSearchQueue, sql/0028): the fold only queues the version.
  if (act == ReviewAct::kAccept) {
    OML_ASSIGN_OR_RETURN(FetchResult body, Fetch(c, artifact_id));
    const bool same = body.meta.version == meta.version && body.meta.plaintext_sha256 == meta.plaintext_sha256;
    crypto::Wipe(&body.body);
    if (!same) return Status(Code::kAborted, "claim " + artifact_id + " changed concurrently; retry", "transaction-conflict");
  }

  nlohmann::json payload = {{"artifact_id", artifact_id},
                            {"version", meta.version},
                            {"workarea_id", meta.workarea_id},
                            {"plaintext_sha256", crypto::Hex(meta.plaintext_sha256)},
                            {"ciphertext_sha256", crypto::Hex(meta.ciphertext_sha256)},
                            {"reason", reason}};
  if (rule.verdict != nullptr) payload["verdict"] = rule.verdict;
  if (attachments_ != nullptr && act != ReviewAct::kDemote) {
    payload["flags"] = Attachments::VerdictFlags(meta.body_review, atts);
    payload["attachments_served"] = atts.size();
  }
  std::vector<BodyObject> body_objects;  // a large body kept as an object (sql/0015): promoted likewise
  if (act == ReviewAct::kAccept && attachments_ != nullptr) {
    OML_ASSIGN_OR_RETURN(body_objects, attachments_->BodyObjects(c.tenant_id, artifact_id, meta.version));
    OML_RETURN_IF_ERROR(OML_SYNC_POINT("claims.accept.before_copy"));  // tests: a concurrent accept wins here
    // Copies into bodies (content-addressed: a concurrent accept of the same claim copies to the
    // same keys). A copy that fails because a concurrent accept won and dropped the quarantine
    // copy answers as the act that came second.
    Status copied = Status::Ok();
    for (const auto& bo : body_objects)
      if (copied.ok()) copied = attachments_->CopyBodyToBodies(bo);
    if (copied.ok() && !atts.empty()) copied = attachments_->CopyToBodies(atts);
    if (!copied.ok()) {
      OML_ASSIGN_OR_RETURN(ClaimMeta now, LoadNewest(c, artifact_id));
      if (now.version != meta.version || now.state != meta.state) {
        if (Status s = refusal(now); !s.ok()) return s;
        return Status(Code::kAborted, "claim " + artifact_id + " changed concurrently; retry", "transaction-conflict");
      }
      return copied;
    }
  }
  journal::EventSpec ev = ReviewEvent(act, c.principal, std::move(payload));
  const std::string tenant = c.tenant_id;
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    // Guarded by the starting state: an act that lost a race (the state moved on, or the claim
    // was erased, after the check above) divides by zero and its transaction leaves nothing.
    std::vector<db::Stmt> stmts = {
        {std::string("WITH u AS (UPDATE oml.artifacts SET state = $4, ") + rule.seq_column +
             " = $5 WHERE tenant_id = $1 AND artifact_id = $2 AND version = $3 AND state = $6 RETURNING 1) "
             "SELECT 1/count(*) FROM u",
         {db::Text(tenant), db::Text(artifact_id), db::Int(meta.version), db::Text(rule.to), db::Int(seq),
          db::Text(rule.from)},
         rule.fold_name}};
    if (act == ReviewAct::kAccept)
      stmts.push_back({"INSERT INTO oml.search_queue (tenant_id, artifact_id, version, promoted_seq) "
                       "VALUES ($1, $2, $3, $4)",
                       {db::Text(tenant), db::Text(artifact_id), db::Int(meta.version), db::Int(seq)},
                       "oml_search_enqueue"});
    if (act == ReviewAct::kAccept && !atts.empty())
      stmts.push_back(Attachments::PromoteFold(tenant, artifact_id, meta.version));
    if (!body_objects.empty()) stmts.push_back(Attachments::PromoteBodyFold(tenant, artifact_id, meta.version));
    if (rule.silver)
      stmts.push_back({kEnqueueSilver, {db::Text(tenant), db::Text(artifact_id), db::Int(meta.version), db::Int(seq)},
                       "oml_silver_enqueue"});
    if (extra != nullptr) {
      ClaimMeta at = meta;
      at.state = rule.to;
      if (act == ReviewAct::kAccept) at.promoted_seq = seq;
      if (act == ReviewAct::kReject) at.rejected_seq = seq;
      if (act == ReviewAct::kDemote) at.demoted_seq = seq;
      for (auto& st : (*extra)(at, seq)) stmts.push_back(std::move(st));
    }
    return stmts;
  };
  ev.api_key_hash = c.api_key_hash;  // refused (401) if the key was revoked meanwhile
  auto rc = journal_->Append(c.tenant_id, ev);
  // Only the act that won the state change deletes anything (issue 19). An accept that did not
  // commit leaves its copies in bodies: their keys are the ciphertext digests, so a concurrent
  // accept of the same claim (a double click) copied to the very same keys, and deleting them
  // here, on a view read before the winner committed, deleted the winner's only copy (the
  // winner had already dropped quarantine). A copy left by a promotion that nobody won is
  // ciphertext no served path names (reads go by the committed location), and the claim's
  // erasure (or a rejected claim's retention) deletes it from both buckets.
  if (!rc.ok()) {
    if (rc.status().type() != db::kZeroRowsGuard) return rc.status();
    // Lost a race: answer as the act that came second would have been answered.
    OML_ASSIGN_OR_RETURN(ClaimMeta now, LoadNewest(c, artifact_id));
    if (Status s = refusal(now); !s.ok()) return s;
    return Status(Code::kAborted, "claim " + artifact_id + " changed concurrently; retry", "transaction-conflict");
  }
  if (act == ReviewAct::kAccept && !atts.empty()) attachments_->DropQuarantineCopies(atts);
  for (const auto& bo : body_objects) attachments_->DropQuarantineBody(bo);
  meta.state = rule.to;
  if (act == ReviewAct::kAccept) meta.promoted_seq = rc->seq;
  if (act == ReviewAct::kReject) meta.rejected_seq = rc->seq;
  if (act == ReviewAct::kDemote) meta.demoted_seq = rc->seq;
  return std::make_pair(meta, *rc);
}

// ---- The search index, after the promotion (sql/0028_search_queue.sql) -----------------------

namespace {

// How long a server holds a queued version it started on (not_before moves this far ahead): other
// servers skip it meanwhile; if this one dies, the version is due again after it.
constexpr int64_t kIndexLeaseSeconds = 300;

// What last_error keeps of a failure: the code, type and message (not the database's detail,
// which is for the log), as printable ASCII, at most 500 bytes.
std::string IndexError(const Status& st) {
  std::string s = std::string(CodeName(st.code())) + " " + st.type() + ": " + st.message();
  for (char& ch : s)
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e) ch = '?';
  if (s.size() > 500) s.resize(500);
  return s;
}

}  // namespace

Result<Claims::IndexReport> Claims::IndexSearchQueue(int max_items, const std::atomic<bool>* stop) {
  IndexReport rep;
  std::vector<std::string> tenants;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, conn->Query("SELECT t::text FROM oml.search_queue_tenants() t"));
    for (int i = 0; i < r.size(); ++i) tenants.push_back(r.Get(i, 0));
  }
  // Each tenant gets a share of the round: one tenant's backlog never holds back the others.
  const int share = tenants.empty() ? 0 : std::max<int>(1, max_items / static_cast<int>(tenants.size()));
  auto handled = [&] { return rep.indexed + rep.dropped + rep.failed; };
  for (const std::string& t : tenants) {
    if (handled() >= max_items) break;
    db::Rows due;
    {
      OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
      OML_ASSIGN_OR_RETURN(due, conn->Scoped(t, {"SELECT artifact_id::text, version FROM oml.search_queue "
                                                 "WHERE tenant_id = $1 AND not_before <= now() ORDER BY promoted_seq LIMIT $2",
                                                 {db::Text(t), db::Int(share)},
                                                 "oml_search_queue_due"}));
    }
    for (int i = 0; i < due.size() && handled() < max_items; ++i) {
      if (stop != nullptr && stop->load()) return rep;
      const std::string artifact_id = due.Get(i, 0);
      const int version = static_cast<int>(due.GetInt(i, 1));
      // Lease it first: another server that found it due skips it instead of reading it too.
      int64_t attempts = 0;
      {
        OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
        OML_ASSIGN_OR_RETURN(db::Rows leased,
                             conn->Scoped(t, {"UPDATE oml.search_queue SET not_before = now() + make_interval(secs => $4) "
                                              "WHERE tenant_id = $1 AND artifact_id = $2 AND version = $3 "
                                              "AND not_before <= now() RETURNING attempts",
                                              {db::Text(t), db::Text(artifact_id), db::Int(version),
                                               db::Int(kIndexLeaseSeconds)},
                                              "oml_search_queue_lease"}));
        if (leased.size() == 0) continue;  // another server's now, or done
        attempts = leased.GetInt(0, 0);
      }
      Status st = IndexOne(t, artifact_id, version, &rep);
      if (st.ok()) continue;
      // The text could not be read (kek-unavailable, a database error): the row stays, tried
      // again after a backoff of 2^attempts seconds (at most 10 minutes). If even that cannot
      // be recorded, the round ends here (it would otherwise come round again at once).
      ++rep.failed;
      log::Warn("search index: a promoted version could not be indexed (retried later)",
                {{"tenant", t}, {"artifact_id", artifact_id}, {"version", version}, {"error", st.ToString()}});
      const int64_t backoff = std::min<int64_t>(int64_t{1} << std::min<int64_t>(attempts, 10), 600);
      OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
      OML_RETURN_IF_ERROR(conn->Scoped(t, {"UPDATE oml.search_queue SET attempts = attempts + 1, last_error = $4, "
                                           "not_before = now() + make_interval(secs => $5) "
                                           "WHERE tenant_id = $1 AND artifact_id = $2 AND version = $3",
                                           {db::Text(t), db::Text(artifact_id), db::Int(version), db::Text(IndexError(st)),
                                            db::Int(backoff)},
                                           "oml_search_queue_retry"})
                              .status());
    }
  }
  return rep;
}

Status Claims::IndexOne(const std::string& tenant, const std::string& artifact_id, int version, IndexReport* rep) {
  // The indexer reads as an admin of the tenant would (Fetch's checks and digests), outside any
  // transaction: the text of a large claim takes a while and locks nothing meanwhile.
  const Caller indexer{tenant, "oml-indexer", "admin", "indexer", ""};
  std::vector<db::Stmt> parts;
  bool drop = false;  // gone, erased, or no longer the newest version: nothing to index
  Result<FetchResult> body = Fetch(indexer, artifact_id);
  if (!body.ok()) {
    if (body.status().code() != Code::kGone && body.status().code() != Code::kNotFound) return body.status();
    drop = true;
  } else if (body->meta.version != version || body->meta.state != "promoted") {
    drop = true;
  } else {
    parts.push_back(SearchTextFold(tenant, artifact_id, version, body->body));
  }
  if (body.ok()) crypto::Wipe(&body->body);
  if (!drop && attachments_ != nullptr) {
    OML_ASSIGN_OR_RETURN(std::vector<Attachment> atts, attachments_->List(tenant, artifact_id, version));
    for (const Attachment& a : atts) {
      Result<std::optional<std::string>> text = attachments_->SearchText(tenant, a);
      if (!text.ok()) {
        // A file that cannot be read as it was reviewed (missing, or not its digests: the
        // reconciler reports it) is left out of the index; the rest of the claim is indexed.
        // Anything else (a KEK away, a store down) may pass: the version is tried again.
        if (text.status().code() != Code::kDataLoss) return text.status();
        log::Warn("search index: an attachment is left out (it does not read back as reviewed)",
                  {{"tenant", tenant}, {"artifact_id", artifact_id}, {"ordinal", a.ordinal},
                   {"error", text.status().ToString()}});
        continue;
      }
      if (!*text) continue;
      parts.push_back(SearchTextFold(tenant, artifact_id, version, **text, "attachment:" + std::to_string(a.ordinal)));
      crypto::Wipe(&**text);
    }
  }
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("search_index.before_commit"));  // tests: a demotion commits here

  // One transaction: take the queue row (another indexer that took it first leaves zero rows:
  // nothing to do), insert the text, and last lock the artifact row FOR SHARE and check it is
  // still promoted (rolled back otherwise). The row lock is held only from there to the commit:
  // a demotion waiting for it holds its tenant's chain lock. A demotion that committed before
  // that check is seen by it (a fresh snapshot after the lock); one that comes after waits for
  // this commit, and its trigger then removes the text.
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  struct Rollback {
    db::Conn& c;
    bool open = false;
    ~Rollback() {
      if (open) (void)c.Exec("ROLLBACK");
    }
  } rollback{*conn};
  auto begin = [&]() -> Result<bool> {  // true: the queue row is ours
    OML_RETURN_IF_ERROR(conn->Exec("BEGIN ISOLATION LEVEL READ COMMITTED").status());
    rollback.open = true;
    OML_ASSIGN_OR_RETURN(std::vector<db::Rows> taken,
                         conn->Pipeline({db::ScopeTo(tenant),
                                         {"DELETE FROM oml.search_queue WHERE tenant_id = $1 AND artifact_id = $2 "
                                          "AND version = $3 RETURNING 1",
                                          {db::Text(tenant), db::Text(artifact_id), db::Int(version)},
                                          "oml_search_queue_take"}}));
    return taken[1].size() == 1;
  };
  auto commit = [&]() -> Status {
    OML_RETURN_IF_ERROR(conn->Exec("COMMIT").status());
    rollback.open = false;
    return Status::Ok();
  };
  auto drop_it = [&]() -> Status {  // takes the row off the queue, nothing indexed
    OML_ASSIGN_OR_RETURN(bool ours, begin());
    if (ours) {
      OML_RETURN_IF_ERROR(commit());
      ++rep->dropped;
    }
    return Status::Ok();
  };
  if (drop) return drop_it();
  OML_ASSIGN_OR_RETURN(bool ours, begin());
  if (!ours) return Status::Ok();  // another indexer took it: rolled back
  Result<std::vector<db::Rows>> inserted = conn->Pipeline(parts);
  if (!inserted.ok()) {
    // The inserts are guarded by state = 'promoted' (22012 when not): no longer promoted.
    if (inserted.status().type() != db::kZeroRowsGuard) return inserted.status();
    (void)conn->Exec("ROLLBACK");
    rollback.open = false;
    return drop_it();
  }
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("search_index.before_state_lock"));  // tests: a demotion commits here
  OML_ASSIGN_OR_RETURN(db::Rows state, conn->Query("SELECT state FROM oml.artifacts WHERE tenant_id = $1 AND "
                                                   "artifact_id = $2 AND version = $3 FOR SHARE",
                                                   {db::Text(tenant), db::Text(artifact_id), db::Int(version)}));
  if (state.size() != 1 || state.Get(0, 0) != "promoted") {
    (void)conn->Exec("ROLLBACK");
    rollback.open = false;
    return drop_it();
  }
  OML_RETURN_IF_ERROR(commit());
  ++rep->indexed;
  return Status::Ok();
}

SearchIndexer::SearchIndexer(Claims* claims, std::chrono::milliseconds interval)
    : claims_(claims), thread_(interval, [this] { IndexOnce(); }, /*run_at_start=*/true) {}

SearchIndexer::~SearchIndexer() { stop_ = true; }  // then thread_ joins: the round ends at the next item

void SearchIndexer::IndexOnce() {
  // Drains what is due, in rounds of 100 versions, while rounds make progress.
  while (!stop_) {
    auto r = claims_->IndexSearchQueue(100, &stop_);
    if (!r.ok()) {
      log::Warn("search index: the queue could not be worked (retried next interval)", {{"error", r.status().ToString()}});
      return;
    }
    if (r->indexed + r->dropped > 0) log::Debug("search index", {{"indexed", r->indexed}, {"dropped", r->dropped}});
    if (r->indexed + r->dropped == 0 || r->indexed + r->dropped + r->failed < 100) return;
  }
}

// ---- Idempotent writes (sql/0005_idempotency_keys.sql) ----------------------------------------

Status Claims::CheckIdempotencyKey(const std::string& key) {
  if (key.empty() || key.size() > kMaxIdempotencyKey)
    return InvalidArgument("Idempotency-Key must be 1.." + std::to_string(kMaxIdempotencyKey) + " characters, not " +
                               std::to_string(key.size()),
                           "invalid-idempotency-key");
  for (unsigned char ch : key)
    if (ch < 0x20 || ch > 0x7e)
      return InvalidArgument("Idempotency-Key may hold printable ASCII only", "invalid-idempotency-key");
  return Status::Ok();
}

Result<WriteResponse> Claims::SubmitOnce(const Caller& c, const SubmitRequest& req, const IdempotencyKey& idem,
                                         const RenderResponse& render) {
  OML_RETURN_IF_ERROR(CheckSubmit(c, req));  // before the key is looked up
  return Once(c, idem, render, [&](const ExtraFold& extra) -> Result<std::pair<ClaimMeta, journal::Receipt>> {
    OML_ASSIGN_OR_RETURN(SubmitResult r, DoSubmit(c, req, &extra));
    return std::make_pair(std::move(r.meta), std::move(r.receipt));
  });
}

Result<WriteResponse> Claims::EraseOnce(const Caller& c, const std::string& artifact_id, const std::string& reason,
                                        const IdempotencyKey& idem, const RenderResponse& render) {
  OML_RETURN_IF_ERROR(fields::CheckReason(reason));  // before the key is looked up
  return Once(c, idem, render, [&](const ExtraFold& extra) { return DoErase(c, artifact_id, reason, &extra); });
}

Result<WriteResponse> Claims::ReviewOnce(const Caller& c, const std::string& artifact_id, ReviewAct act,
                                         const std::string& reason, const IdempotencyKey& idem,
                                         const RenderResponse& render) {
  OML_RETURN_IF_ERROR(fields::CheckReason(reason));  // before the key is looked up
  return Once(c, idem, render,
              [&](const ExtraFold& extra) { return DoReview(c, artifact_id, act, reason, &extra); });
}

Result<WriteResponse> Claims::Once(const Caller& c, const IdempotencyKey& idem, const RenderResponse& render,
                                   const Write& write) {
  OML_RETURN_IF_ERROR(CheckIdempotencyKey(idem.key));
  if (c.api_key_hash.empty())
    return InvalidArgument("an Idempotency-Key needs an API key to be scoped to", "invalid-idempotency-key");
  if (idem.request_sha256.size() != 32 || idem.ttl_s < 1)
    return Internal("idempotent write without a request fingerprint or with a TTL below 1 s");
  OML_ASSIGN_OR_RETURN(std::optional<WriteResponse> prior, Recorded(c, idem));
  if (prior) return std::move(*prior);

  // Fold statements recording the response (after the event's own fold, in its transaction):
  // drop this key's row if it expired and a few other expired rows of the tenant, then insert.
  const ExtraFold record = [&](const ClaimMeta& at, int64_t seq) -> std::vector<db::Stmt> {
    const auto [status, body] = render(at);
    return {{"DELETE FROM oml.idempotency_keys d WHERE d.tenant_id = $1 AND d.expires_at <= now() AND "
             "((d.api_key_hash = $2 AND d.idem_key = $3) OR (d.api_key_hash, d.idem_key) IN "
             "(SELECT o.api_key_hash, o.idem_key FROM oml.idempotency_keys o WHERE o.tenant_id = $1 "
             "AND o.expires_at <= now() ORDER BY o.expires_at LIMIT " + std::to_string(kIdempotencyPurgeBatch) + "))",
             {db::Text(c.tenant_id), db::Bytes(c.api_key_hash), db::Text(idem.key)},
             "oml_idem_purge"},
            {"INSERT INTO oml.idempotency_keys (tenant_id, api_key_hash, idem_key, request_sha256, response_status, "
             "response_body, journal_seq, expires_at) "
             "VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, now() + make_interval(secs => $8))",
             {db::Text(c.tenant_id), db::Bytes(c.api_key_hash), db::Text(idem.key), db::Bytes(idem.request_sha256),
              db::Int(status), db::Text(body.dump()), db::Int(seq), db::Int(idem.ttl_s)},
             "oml_idem_record"}};
  };
  auto out = write(record);
  if (out.ok()) {
    auto [status, body] = render(out->first);
    body["receipt"] = out->second.ToJson();
    return WriteResponse{status, std::move(body), std::move(out->second), false};
  }
  // kUnavailable: the outcome is unknown (connection lost) or the COMMIT was not confirmed by the
  // standbys; its record may exist locally, so it must not be replayed as a success now. The
  // client retries with the same key; Recorded() confirms durability before replaying.
  if (out.status().code() == Code::kUnavailable) return out.status();
  // The write failed before COMMIT and its transaction left nothing. If a request with the same
  // key committed meanwhile (its row is what failed ours, or it erased the claim first), answer
  // from its record.
  auto again = Recorded(c, idem);
  if (again.ok() && *again) return std::move(**again);
  if (!again.ok() && again.status().type() == "idempotency-key-reused") return again.status();
  if (db::IsViolationOf(out.status(), "idempotency_keys_pkey"))
    return FailedPrecondition("a request with this Idempotency-Key is still being processed; retry it later",
                              "idempotency-key-in-flight");
  return out.status();
}

Result<std::optional<WriteResponse>> Claims::Recorded(const Caller& c, const IdempotencyKey& idem) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      conn->Scoped(c.tenant_id,
                   {"SELECT i.request_sha256, i.response_status, i.response_body::text, i.journal_seq, j.prev_hash, "
                    "j.event_hash, j.key_id, j.signed_bytes, j.signature FROM oml.idempotency_keys i "
                    "JOIN oml.journal j ON j.tenant_id = i.tenant_id AND j.seq = i.journal_seq "
                    "WHERE i.api_key_hash = $1 AND i.idem_key = $2 AND i.expires_at > now() "
                    // A revoked key replays nothing (its write is then refused by the live-key check).
                    "AND EXISTS (SELECT 1 FROM oml.api_keys k WHERE k.key_hash = i.api_key_hash AND k.revoked_at IS NULL)",
                    {db::Bytes(c.api_key_hash), db::Text(idem.key)},
                    "oml_idem_lookup"}));
  if (r.size() == 0) return std::optional<WriteResponse>();
  if (r.GetBytes(0, 0) != idem.request_sha256)
    return InvalidArgument("this Idempotency-Key was already used for a different request (method, path or body)",
                           "idempotency-key-reused");
  WriteResponse w;
  w.status = static_cast<int>(r.GetInt(0, 1));
  w.body = nlohmann::json::parse(r.Get(0, 2), nullptr, false);
  if (!w.body.is_object()) return Internal("recorded response of an Idempotency-Key is not a JSON object");
  w.receipt.tenant = c.tenant_id;
  w.receipt.seq = r.GetInt(0, 3);
  w.receipt.prev_hash = r.GetBytes(0, 4);
  w.receipt.event_hash = r.GetBytes(0, 5);
  w.receipt.key_id = r.Get(0, 6);
  w.receipt.signed_bytes = r.GetBytes(0, 7);
  w.receipt.signature = r.GetBytes(0, 8);
  w.body["receipt"] = w.receipt.ToJson();
  w.replayed = true;
  // The recorded event may have committed without the standbys' confirmation (its request then
  // answered 503 commit-not-replicated). Before acknowledging it now, commit a transaction of our
  // own: it is later in the WAL, so its confirmation covers the recorded event too.
  OML_ASSIGN_OR_RETURN(auto fence,
                       conn->Pipeline({{"BEGIN", {}},
                                       db::ScopeTo(c.tenant_id),
                                       {"INSERT INTO oml.idempotency_fence (tenant_id, fenced_at) VALUES ($1, now()) "
                                        "ON CONFLICT (tenant_id) DO UPDATE SET fenced_at = excluded.fenced_at",
                                        {db::Text(c.tenant_id)}, "oml_idem_fence"},
                                       {"COMMIT", {}}}));
  if (Status fenced = conn->CommitVerdict(fence.back()); !fenced.ok())
    return Unavailable("the recorded response's event is not confirmed by the synchronous standbys yet; retry later",
                       "commit-not-replicated");
  if (journal::ChainGuard* guard = journal_->chain_guard()) guard->Observe(c.tenant_id, w.receipt.seq, w.receipt.event_hash);
  return std::optional<WriteResponse>(std::move(w));
}

}  // namespace oml::admission
