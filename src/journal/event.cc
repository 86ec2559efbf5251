#include "journal/event.h"

#include <chrono>
#include <ctime>

#include "crypto/crypto.h"
#include "journal/canonical_json.h"

namespace oml::journal {

nlohmann::json Envelope::ToJson() const {
  return nlohmann::json{{"v", kEnvelopeVersion}, {"tenant", tenant},   {"seq", seq},
                        {"prev", crypto::Hex(prev_hash)}, {"type", type}, {"time", time},
                        {"key_id", key_id}, {"principal", principal}, {"payload", payload},
                        {"refs", refs}};
}

Result<std::string> Envelope::SignedBytes() const { return Canonicalize(ToJson()); }

namespace {
Result<Envelope> EnvelopeOf(nlohmann::json j);
}  // namespace

Result<Envelope> Envelope::FromSignedBytes(const std::string& bytes) {
  OML_ASSIGN_OR_RETURN(nlohmann::json j, ParseCanonical(bytes));
  return EnvelopeOf(std::move(j));
}

Result<Envelope> Envelope::FromVerifiedSignedBytes(const std::string& bytes) {
  nlohmann::json j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss("signed bytes are not valid JSON");
  return EnvelopeOf(std::move(j));
}

namespace {
Result<Envelope> EnvelopeOf(nlohmann::json j) {
  static const char* kFields[] = {"v", "tenant", "seq", "prev", "type", "time", "key_id", "principal", "payload", "refs"};
  if (!j.is_object() || j.size() != std::size(kFields)) return DataLoss("envelope does not have exactly the v1 members");
  for (const char* f : kFields)
    if (!j.contains(f)) return DataLoss(std::string("envelope lacks member ") + f);
  if (j["v"] != kEnvelopeVersion) return DataLoss("unknown envelope version");
  Envelope e;
  try {
    e.tenant = j["tenant"].get<std::string>();
    e.seq = j["seq"].get<int64_t>();
    auto prev = crypto::FromHex(j["prev"].get<std::string>());
    if (!prev.ok() || prev->size() != 32) return DataLoss("envelope prev is not a 32-byte hex hash");
    e.prev_hash = *prev;
    e.type = j["type"].get<std::string>();
    e.time = j["time"].get<std::string>();
    e.key_id = j["key_id"].get<std::string>();
    e.principal = j["principal"].get<std::string>();
    e.payload = std::move(j["payload"]);
    e.refs = std::move(j["refs"]);
  } catch (const nlohmann::json::exception& ex) {
    return DataLoss(std::string("envelope member has the wrong type: ") + ex.what());
  }
  return e;
}
}  // namespace

nlohmann::json Receipt::ToJson() const {
  return {{"tenant", tenant},
          {"seq", seq},
          {"event_hash", crypto::Hex(event_hash)},
          {"prev_hash", crypto::Hex(prev_hash)},
          {"signature", crypto::Base64(signature)},
          {"key_id", key_id},
          {"signed_bytes", crypto::Base64(signed_bytes)}};
}

Result<Receipt> Receipt::FromJson(const nlohmann::json& j) {
  Receipt r;
  try {
    r.tenant = j.at("tenant").get<std::string>();
    r.seq = j.at("seq").get<int64_t>();
    OML_ASSIGN_OR_RETURN(r.event_hash, crypto::FromHex(j.at("event_hash").get<std::string>()));
    OML_ASSIGN_OR_RETURN(r.prev_hash, crypto::FromHex(j.at("prev_hash").get<std::string>()));
    OML_ASSIGN_OR_RETURN(r.signature, crypto::FromBase64(j.at("signature").get<std::string>()));
    r.key_id = j.at("key_id").get<std::string>();
    OML_ASSIGN_OR_RETURN(r.signed_bytes, crypto::FromBase64(j.at("signed_bytes").get<std::string>()));
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("malformed receipt: ") + e.what());
  }
  return r;
}

Result<Receipt> SignEnvelope(const Envelope& e, const crypto::SigningKey& key) {
  Receipt r;
  OML_ASSIGN_OR_RETURN(r.signed_bytes, e.SignedBytes());
  r.tenant = e.tenant;
  r.seq = e.seq;
  r.prev_hash = e.prev_hash;
  r.event_hash = crypto::Sha256(r.signed_bytes);
  r.signature = key.Sign(r.signed_bytes);
  r.key_id = e.key_id;
  return r;
}

Status VerifyReceipt(const Receipt& r, const std::string& public_key_raw) {
  if (crypto::KeyIdFor(public_key_raw) != r.key_id)
    return DataLoss("receipt key_id " + r.key_id + " is not the given public key (" + crypto::KeyIdFor(public_key_raw) + ")");
  if (!crypto::ConstantTimeEquals(crypto::Sha256(r.signed_bytes), r.event_hash))
    return DataLoss("event_hash is not SHA-256 of signed_bytes");
  if (!crypto::Ed25519Verify(public_key_raw, r.signed_bytes, r.signature))
    return DataLoss("signature does not verify under key " + r.key_id);
  OML_ASSIGN_OR_RETURN(Envelope e, Envelope::FromSignedBytes(r.signed_bytes));
  if (e.tenant != r.tenant) return DataLoss("receipt tenant differs from the signed envelope");
  if (e.seq != r.seq) return DataLoss("receipt seq differs from the signed envelope");
  if (e.prev_hash != r.prev_hash) return DataLoss("receipt prev_hash differs from the signed envelope");
  if (e.key_id != r.key_id) return DataLoss("receipt key_id differs from the signed envelope");
  return Status::Ok();
}

std::string NowTimestamp() { return TimestampFromNow(0); }

std::string TimestampFromNow(int64_t offset_seconds) {
  auto now = std::chrono::system_clock::now() + std::chrono::seconds(offset_seconds);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  std::time_t secs = us / 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%s.%06lldZ", buf, static_cast<long long>(us % 1000000));
  return out;
}

}  // namespace oml::journal
