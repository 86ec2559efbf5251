#include "journal/heads.h"

#include "common/log.h"
#include "journal/canonical_json.h"
#include "journal/provider.h"

namespace oml::journal {

std::string HeadKey(const std::string& tenant) { return "oml-heads/" + tenant; }

Result<std::string> EncodeSignedHead(const SignedHead& h, const crypto::SigningKey& key) {
  nlohmann::json head = {{"v", 1},         {"tenant", h.tenant}, {"seq", h.seq}, {"event_hash", crypto::Hex(h.event_hash)},
                         {"key_id", key.key_id()}, {"published_at", h.published_at}};
  OML_ASSIGN_OR_RETURN(std::string bytes, Canonicalize(head));
  nlohmann::json doc = {{"head", head}, {"signature", crypto::Base64(key.Sign(bytes))}};
  return doc.dump();
}

Result<SignedHead> DecodeSignedHead(const std::string& bytes, const std::map<std::string, std::string>& keys) {
  auto doc = nlohmann::json::parse(bytes, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("head") || !doc.contains("signature"))
    return DataLoss("published head is not a signed head document");
  SignedHead h;
  try {
    const auto& head = doc["head"];
    h.tenant = head.at("tenant").get<std::string>();
    h.seq = head.at("seq").get<int64_t>();
    OML_ASSIGN_OR_RETURN(h.event_hash, crypto::FromHex(head.at("event_hash").get<std::string>()));
    h.key_id = head.at("key_id").get<std::string>();
    h.published_at = head.at("published_at").get<std::string>();
    OML_ASSIGN_OR_RETURN(std::string canon, Canonicalize(head));
    OML_ASSIGN_OR_RETURN(std::string sig, crypto::FromBase64(doc["signature"].get<std::string>()));
    auto it = keys.find(h.key_id);
    if (it == keys.end()) return DataLoss("published head is signed by unknown key " + h.key_id);
    if (!crypto::Ed25519Verify(it->second, canon, sig)) return DataLoss("published head signature does not verify");
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(std::string("published head is malformed: ") + e.what());
  }
  return h;
}

HeadPublisher::HeadPublisher(blob::ObjectStore* store, const crypto::SigningKey* key, int interval_ms)
    : store_(store), key_(key), interval_ms_(interval_ms) {}

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

Status HeadPublisher::Flush() {
  std::lock_guard<std::mutex> fl(flush_mu_);
  std::map<std::string, std::pair<int64_t, std::string>> batch;
  {
    std::lock_guard<std::mutex> l(mu_);
    batch.swap(pending_);
  }
  Status first;
  for (const auto& [tenant, head] : batch) {
    if (published_[tenant] >= head.first) continue;
    // Never regress a head another replica published.
    std::map<std::string, std::string> no_keys;
    auto existing = store_->Get(HeadKey(tenant));
    if (existing.ok() && existing->has_value()) {
      auto j = nlohmann::json::parse(**existing, nullptr, false);
      // A malformed existing object is treated as absent (and overwritten); never throw here.
      if (!j.is_discarded() && j.is_object() && j.contains("head") && j["head"].is_object() &&
          j["head"].contains("seq") && j["head"]["seq"].is_number_integer() &&
          j["head"]["seq"].get<int64_t>() >= head.first) {
        published_[tenant] = j["head"]["seq"].get<int64_t>();
        continue;
      }
    }
    SignedHead h{tenant, head.first, head.second, key_->key_id(), NowTimestamp()};
    auto bytes = EncodeSignedHead(h, *key_);
    Status st = bytes.ok() ? store_->Put(HeadKey(tenant), *bytes) : bytes.status();
    if (st.ok()) {
      published_[tenant] = head.first;
    } else {
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
    l.unlock();
    (void)Flush();
    l.lock();
  }
}

Result<std::vector<ForkFinding>> CheckForks(db::Pool& pool, blob::ObjectStore& store,
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
  std::map<std::string, std::string> keys;
  {
    OML_ASSIGN_OR_RETURN(db::Rows kr, c->Query("SELECT key_id, public_key FROM oml.signing_keys"));
    for (int i = 0; i < kr.size(); ++i) keys[kr.Get(i, 0)] = kr.GetBytes(i, 1);
  }
  std::vector<std::string> published;
  if (only.empty()) {
    OML_ASSIGN_OR_RETURN(published, store.List("oml-heads/"));
  } else {
    for (const auto& t : only) published.push_back(HeadKey(t));
  }
  std::vector<ForkFinding> out;
  for (const auto& key : published) {
    std::string tenant = key.substr(std::string("oml-heads/").size());
    OML_ASSIGN_OR_RETURN(auto bytes, store.Get(key));
    if (!bytes) continue;
    auto h = DecodeSignedHead(*bytes, keys);
    if (!h.ok()) {
      out.push_back({tenant, 0, 0, h.status().message()});
      continue;
    }
    if (h->tenant != tenant) {
      out.push_back({tenant, h->seq, 0, "published head names tenant " + h->tenant});
      continue;
    }
    if (!known.count(tenant)) {
      out.push_back({tenant, h->seq, 0, "a head is published for a tenant the database does not have"});
      continue;
    }
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(tenant, {"SELECT coalesce((SELECT seq FROM oml.chain_heads WHERE tenant_id = $1), 0), "
                                                        "(SELECT event_hash FROM oml.journal WHERE tenant_id = $1 AND seq = $2)",
                                                        {db::Text(tenant), db::Int(h->seq)}}));
    int64_t stored = r.GetInt(0, 0);
    if (stored < h->seq) {
      out.push_back({tenant, h->seq, stored,
                     "stored head seq " + std::to_string(stored) + " is behind the published head seq " + std::to_string(h->seq)});
    } else if (r.IsNull(0, 1) || r.GetBytes(0, 1) != h->event_hash) {
      out.push_back({tenant, h->seq, stored, "stored event at the published seq " + std::to_string(h->seq) + " has a different hash"});
    }
  }
  return out;
}

}  // namespace oml::journal
