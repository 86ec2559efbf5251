#include "journal/heads.h"

#include <optional>

#include "common/log.h"
#include "common/metrics.h"
#include "journal/canonical_json.h"
#include "journal/provider.h"

namespace oml::journal {
namespace {

// Refuses bytes that are too large or nested too deep before any parser sees them. Brackets
// inside strings do not count.
Status CheckHeadShape(const std::string& bytes) {
  if (bytes.size() > kMaxHeadBytes)
    return DataLoss("published head is " + std::to_string(bytes.size()) + " bytes; a head is at most " +
                    std::to_string(kMaxHeadBytes));
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : bytes) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    else if (ch == '{' || ch == '[') {
      if (++depth > kMaxHeadDepth) return DataLoss("published head is nested deeper than a head document");
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  return Status::Ok();
}

}  // namespace

Result<TrustedKeys> LoadTrustedKeys(db::Pool& pool, const std::string& root_public_key) {
  // Every provider row, not only those whose (unsigned) event_type column says key.issued: the
  // rows are linked by hash first, so a key.issued cannot be hidden by relabelling or rewriting a
  // row without breaking the links or a later key.issued's signature.
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(kProviderTenant,
                                             {"SELECT seq, prev_hash, event_hash, signed_bytes, signature FROM oml.journal "
                                              "WHERE tenant_id = $1 ORDER BY seq",
                                              {db::Text(kProviderTenant)}, "", true}));
  TrustedKeys keys;
  std::string prev_id, prev_hash = kZeroHash;
  crypto::PublicKey prev_key;
  for (int i = 0; i < r.size(); ++i) {
    const int64_t seq = r.GetInt(i, 0);
    const std::string row_prev = r.GetBytes(i, 1), hash = r.GetBytes(i, 2), bytes = r.GetBytes(i, 3),
                      sig = r.GetBytes(i, 4);
    auto fail = [&](const std::string& what) -> Status {
      return DataLoss("key chain: provider seq " + std::to_string(seq) + " " + what + " (run `oml verify`)");
    };
    if (seq != i + 1) return fail("is out of place (seq " + std::to_string(i + 1) + " is missing)");
    if (crypto::Sha256(bytes) != hash) return fail("does not hash to its event_hash");
    if (row_prev != prev_hash) return fail("does not link to the previous event");
    prev_hash = hash;
    auto env = Envelope::FromSignedBytes(bytes);
    if (!env.ok()) return fail("is not a canonical envelope");
    if (env->tenant != kProviderTenant || env->seq != seq || env->prev_hash != row_prev)
      return fail("does not match its row");
    if (env->type != "key.issued") continue;
    // The signature under the key in force (the first key: under itself), then the key-chain rule
    // every reader applies (provider.h): supersedes, retired_heads, the new key's binding.
    auto parsed = ParseKeyIssued(*env);
    if (!parsed.ok()) return fail("carries a malformed key");
    if (keys.empty() && !root_public_key.empty() && parsed->raw != root_public_key)
      return DataLoss("key chain: the provider chain's first key.issued (seq " + std::to_string(seq) +
                      ") is not the deployment's root key");
    if (!(keys.empty() ? parsed->key : prev_key).Verify(bytes, sig))
      return fail(keys.empty() ? "is not signed by the key it issues" : "is not signed by the key it supersedes (" + prev_id + ")");
    auto issued = CheckKeyIssued(*env, prev_id, [&keys](const std::string& id) { return keys.count(id) > 0; });
    if (!issued.ok())
      return DataLoss("key chain: provider seq " + std::to_string(seq) + ": " + issued.status().message() +
                      " (run `oml verify`)");
    const std::string& raw = issued->raw;
    const std::string& kid = issued->key_id;
    keys[kid] = raw;
    prev_id = kid;
    prev_key = issued->key;
  }
  if (r.size() > 0 && keys.empty()) return DataLoss("key chain: the provider chain has no key.issued (run `oml verify`)");
  return keys;
}

std::string HeadKey(const std::string& tenant) { return "oml-heads/" + tenant; }
std::string InvalidHeadKey(const std::string& tenant, const std::string& at) { return "oml-heads-invalid/" + tenant + "/" + at; }

Result<std::string> EncodeSignedHead(const SignedHead& h, const crypto::SigningKey& key) {
  nlohmann::json head = {{"v", 1},         {"tenant", h.tenant}, {"seq", h.seq}, {"event_hash", crypto::Hex(h.event_hash)},
                         {"key_id", key.key_id()}, {"published_at", h.published_at}};
  OML_ASSIGN_OR_RETURN(std::string bytes, Canonicalize(head));
  nlohmann::json doc = {{"head", head}, {"signature", crypto::Base64(key.Sign(bytes))}};
  return doc.dump();
}

Result<SignedHead> DecodeSignedHead(const std::string& bytes, const TrustedKeys& keys) {
  return DecodeSignedHeadWith(bytes, [&keys](const std::string& key_id, const std::string& msg, const std::string& sig) {
    auto it = keys.find(key_id);
    if (it == keys.end()) return HeadKeyVerdict::kUnknownKey;
    return crypto::Ed25519Verify(it->second, msg, sig) ? HeadKeyVerdict::kValid : HeadKeyVerdict::kBadSignature;
  });
}

Result<SignedHead> DecodeSignedHeadWith(const std::string& bytes, const HeadSignatureCheck& check) {
  OML_RETURN_IF_ERROR(CheckHeadShape(bytes));
  auto doc = nlohmann::json::parse(bytes, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("head") || !doc["head"].is_object() ||
      !doc.contains("signature") || !doc["signature"].is_string())
    return DataLoss("published head is not a signed head document");
  SignedHead h;
  try {
    const auto& head = doc["head"];
    if (head.size() != 6 || head.value("v", nlohmann::json()) != 1) return DataLoss("published head is not a v1 head");
    const auto& seq = head.at("seq");
    if (!seq.is_number_integer() || seq.get<int64_t>() < 1 || seq.get<int64_t>() > (int64_t{1} << 53))
      return DataLoss("published head has an invalid seq");
    h.tenant = head.at("tenant").get<std::string>();
    h.seq = seq.get<int64_t>();
    OML_ASSIGN_OR_RETURN(h.event_hash, crypto::FromHex(head.at("event_hash").get<std::string>()));
    if (h.event_hash.size() != 32) return DataLoss("published head has an invalid event_hash");
    h.key_id = head.at("key_id").get<std::string>();
    h.published_at = head.at("published_at").get<std::string>();
    OML_ASSIGN_OR_RETURN(std::string canon, Canonicalize(head));
    OML_ASSIGN_OR_RETURN(std::string sig, crypto::FromBase64(doc["signature"].get<std::string>()));
    switch (check(h.key_id, canon, sig)) {
      case HeadKeyVerdict::kValid: break;
      case HeadKeyVerdict::kUnknownKey:
        return DataLoss("published head is signed by " + h.key_id + ", which the key chain does not hold");
      case HeadKeyVerdict::kBadSignature: return DataLoss("published head signature does not verify");
    }
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(std::string("published head is malformed: ") + e.what());
  }
  return h;
}

HeadPublisher::HeadPublisher(blob::ObjectStore* store, const crypto::SigningKey* key, int interval_ms, db::Pool* pool,
                             ChainGuard* guard, TrustedKeys keys, std::string root_public_key)
    : store_(store),
      key_(key),
      interval_ms_(interval_ms),
      pool_(pool),
      guard_(guard),
      keys_(std::move(keys)),
      root_(std::move(root_public_key)) {}

HeadPublisher::~HeadPublisher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  (void)Flush();
}

void HeadPublisher::Start() { thread_ = std::thread([this] { Loop(); }); }

void HeadPublisher::OnCommit(const Receipt& r) {
  std::lock_guard<std::mutex> l(mu_);
  auto& p = pending_[r.tenant];
  if (r.seq > p.first) p = {r.seq, r.event_hash};
}

void HeadPublisher::RequestRefresh(const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  refresh_wanted_.push_back(tenant);
}

void HeadPublisher::RefreshGuard(const std::string& tenant) {
  if (!guard_) return;
  auto bytes = store_->Get(HeadKey(tenant));
  if (!bytes.ok() || !bytes->has_value()) return;
  std::optional<SignedHead> h;
  {
    std::lock_guard<std::mutex> l(keys_mu_);
    auto& last = refreshed_docs_[tenant];
    if (last == **bytes) return;  // unchanged since the last refresh: already observed
    auto decoded = DecodeSignedHead(**bytes, keys_);
    if (!decoded.ok()) return;
    h = *decoded;
    last = **bytes;
  }
  if (h && h->tenant == tenant) guard_->Observe(tenant, h->seq, h->event_hash);
}

Result<SignedHead> HeadPublisher::Decode(const std::string& bytes) {
  std::lock_guard<std::mutex> l(keys_mu_);
  auto h = DecodeSignedHead(bytes, keys_);
  // A key issued after this process loaded the key chain (a rotation by another replica or the
  // CLI): reload (at most once per flush) before calling the document invalid, so a valid head
  // signed by a newer key is never "repaired" with an older one.
  if (!h.ok() && h.status().message().find("which the key chain does not hold") != std::string::npos &&
      !reloaded_this_flush_) {
    reloaded_this_flush_ = true;
    OML_ASSIGN_OR_RETURN(TrustedKeys reloaded, LoadTrustedKeys(*pool_, root_));
    keys_ = std::move(reloaded);
    keys_[key_->key_id()] = key_->public_key();
    h = DecodeSignedHead(bytes, keys_);
  }
  return h;
}

Result<std::string> HeadPublisher::StoredHash(const std::string& tenant, int64_t seq) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(tenant, {"SELECT event_hash FROM oml.journal WHERE tenant_id = $1 AND seq = $2",
                                                      {db::Text(tenant), db::Int(seq)}}));
  return r.size() == 0 ? std::string() : r.GetBytes(0, 0);
}

Status HeadPublisher::Put(const std::string& tenant, int64_t seq, const std::string& hash) {
  SignedHead h{tenant, seq, hash, key_->key_id(), NowTimestamp()};
  OML_ASSIGN_OR_RETURN(std::string bytes, EncodeSignedHead(h, *key_));
  OML_RETURN_IF_ERROR(store_->Put(HeadKey(tenant), bytes));
  published_[tenant] = seq;
  if (guard_) guard_->Observe(tenant, seq, hash);
  own_docs_[tenant] = {bytes, seq};
  std::lock_guard<std::mutex> l(keys_mu_);
  refreshed_docs_[tenant] = std::move(bytes);  // our own document: a refresh need not verify it
  return Status::Ok();
}

Status HeadPublisher::Quarantine(const std::string& tenant, const std::string& bytes) {
  const std::string key = InvalidHeadKey(tenant, NowTimestamp());
  OML_RETURN_IF_ERROR(store_->Put(key, bytes));
  log::Error("invalid published head kept for inspection", {{"tenant", tenant}, {"object", key}});
  return Status::Ok();
}

Status HeadPublisher::PublishOne(const std::string& tenant, int64_t seq, const std::string& hash) {
  OML_ASSIGN_OR_RETURN(auto existing, store_->Get(HeadKey(tenant)));
  if (!existing.has_value()) return Put(tenant, seq, hash);
  // Still the document this process put last: nothing to decode, and the new head extends it
  // already. It comes from a commit that passed lock_head's check against the guard's known head,
  // which is at or past that document (Put observes it) and whose hash fixes every seq below.
  if (auto own = own_docs_.find(tenant); own != own_docs_.end() && own->second.first == *existing) {
    if (seq <= own->second.second) return Status::Ok();
    return Put(tenant, seq, hash);
  }
  auto pub = Decode(*existing);
  if (!pub.ok() && pub.status().code() != Code::kDataLoss) return pub.status();  // key chain unreadable: retry
  if (!pub.ok() || pub->tenant != tenant) {
    const std::string why = pub.ok() ? "published head names tenant " + pub->tenant : pub.status().message();
    Metrics::Get().ChainIntegrity("head-invalid");
    log::Error("published head is invalid; repairing it with the current head",
               {{"tenant", tenant}, {"error", why}, {"seq", seq}});
    // The damaged document is kept, and reported by `oml verify` and `oml doctor` until an
    // operator removes it: it may have been damaged to hide a cut tail.
    OML_RETURN_IF_ERROR(Quarantine(tenant, *existing));
    return Put(tenant, seq, hash);
  }
  if (guard_ && !guard_->Observe(tenant, pub->seq, pub->event_hash)) return Status::Ok();
  auto refuse = [&](const std::string& what) {
    Metrics::Get().ChainIntegrity("publish-refused");
    log::Error("head publication refused: the new head does not extend the published one",
               {{"tenant", tenant}, {"published_seq", pub->seq}, {"new_seq", seq}, {"what", what}});
    if (guard_) guard_->Close(tenant, what);
    published_[tenant] = pub->seq;  // do not retry this head; a later commit is checked again
    return Status::Ok();
  };
  if (pub->seq == seq) {
    if (pub->event_hash != hash)
      return refuse("seq " + std::to_string(seq) + " is published with another hash (the chain diverged)");
    published_[tenant] = seq;
    return Status::Ok();
  }
  // Either way the published event must still be in the chain at its seq.
  OML_ASSIGN_OR_RETURN(std::string stored, StoredHash(tenant, pub->seq));
  if (stored.empty())
    return refuse("the chain no longer holds published seq " + std::to_string(pub->seq) + " (the database lost committed events)");
  if (stored != pub->event_hash)
    return refuse("the stored event at published seq " + std::to_string(pub->seq) + " has another hash (the chain diverged)");
  if (pub->seq > seq) {  // another replica published further along the same chain
    published_[tenant] = pub->seq;
    return Status::Ok();
  }
  return Put(tenant, seq, hash);
}

Status HeadPublisher::Repair(const std::string& tenant, int64_t seq, const std::string& event_hash) {
  std::lock_guard<std::mutex> fl(flush_mu_);
  OML_ASSIGN_OR_RETURN(auto existing, store_->Get(HeadKey(tenant)));
  if (existing.has_value()) OML_RETURN_IF_ERROR(Quarantine(tenant, *existing));
  return Put(tenant, seq, event_hash);
}

Status HeadPublisher::Flush() {
  std::lock_guard<std::mutex> fl(flush_mu_);
  std::map<std::string, std::pair<int64_t, std::string>> batch;
  {
    std::lock_guard<std::mutex> l(mu_);
    batch.swap(pending_);
  }
  reloaded_this_flush_ = false;
  Status first;
  for (const auto& [tenant, head] : batch) {
    if (published_[tenant] >= head.first) continue;
    Status st = PublishOne(tenant, head.first, head.second);
    if (!st.ok()) {
      log::Warn("head publish failed; will retry", {{"tenant", tenant}, {"error", st.ToString()}});
      std::lock_guard<std::mutex> l(mu_);
      auto& p = pending_[tenant];
      if (head.first > p.first) p = head;
      if (first.ok()) first = st;
    }
  }
  return first;
}

void HeadPublisher::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, std::chrono::milliseconds(interval_ms_));
    if (stop_) break;
    std::vector<std::string> refresh;
    refresh.swap(refresh_wanted_);
    l.unlock();
    for (const auto& t : refresh) RefreshGuard(t);
    (void)Flush();
    l.lock();
  }
}

Result<ForkCheck> CheckForks(db::Pool& pool, blob::ObjectStore& store, const TrustedKeys& keys,
                             const std::vector<std::string>& only) {
  // Tenants the database has. With `only`, the caller resolved those tenants already.
  std::map<std::string, bool> known;
  if (only.empty()) {
    OML_ASSIGN_OR_RETURN(auto tenants, ListTenants(pool));
    for (const auto& t : tenants) known[t.tenant_id] = true;
  } else {
    for (const auto& t : only) known[t] = true;
  }
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
  std::vector<std::string> published;
  if (only.empty()) {
    OML_ASSIGN_OR_RETURN(published, store.List("oml-heads/"));
  } else {
    for (const auto& t : only) published.push_back(HeadKey(t));
  }
  ForkCheck out;
  for (const auto& key : published) {
    std::string tenant = key.substr(std::string("oml-heads/").size());
    OML_ASSIGN_OR_RETURN(auto bytes, store.Get(key));
    if (!bytes) continue;
    auto h = DecodeSignedHead(*bytes, keys);
    if (!h.ok()) {
      out.findings.push_back({tenant, 0, 0, h.status().message(), true});
      continue;
    }
    if (h->tenant != tenant) {
      out.findings.push_back({tenant, h->seq, 0, "published head names tenant " + h->tenant, true});
      continue;
    }
    out.heads.push_back(*h);
    if (!known.count(tenant)) {
      out.findings.push_back({tenant, h->seq, 0, "a head is published for a tenant the database does not have"});
      continue;
    }
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(tenant, {"SELECT coalesce((SELECT seq FROM oml.chain_heads WHERE tenant_id = $1), 0), "
                                                        "(SELECT event_hash FROM oml.journal WHERE tenant_id = $1 AND seq = $2)",
                                                        {db::Text(tenant), db::Int(h->seq)}}));
    int64_t stored = r.GetInt(0, 0);
    if (stored < h->seq) {
      out.findings.push_back({tenant, h->seq, stored,
                              "stored head seq " + std::to_string(stored) + " is behind the published head seq " +
                                  std::to_string(h->seq)});
    } else if (r.IsNull(0, 1) || r.GetBytes(0, 1) != h->event_hash) {
      out.findings.push_back({tenant, h->seq, stored,
                              "stored event at the published seq " + std::to_string(h->seq) + " has a different hash"});
    }
  }
  return out;
}

}  // namespace oml::journal
