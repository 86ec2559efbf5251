#include "journal/event.h"

#include <chrono>
#include <ctime>
#include <iterator>

#include <simdjson.h>

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

namespace {
struct UnknownElement {};

// A simdjson DOM element as nlohmann::json, typed as nlohmann::json::parse types the same text:
// a non-negative integer is number_unsigned, a negative one number_integer, anything with a
// fraction or an exponent number_float; of duplicate object members the last wins.
nlohmann::json ToNlohmann(simdjson::dom::element e) {
  switch (e.type()) {
    case simdjson::dom::element_type::OBJECT: {
      nlohmann::json j = nlohmann::json::object();
      auto& o = j.get_ref<nlohmann::json::object_t&>();
      for (auto [k, v] : simdjson::dom::object(e)) {
        // Members usually come sorted (canonical JSON): appended at the end without a search.
        if (o.empty() || std::prev(o.end())->first < k)
          o.emplace_hint(o.end(), std::string(k), ToNlohmann(v));
        else
          o[std::string(k)] = ToNlohmann(v);
      }
      return j;
    }
    case simdjson::dom::element_type::ARRAY: {
      nlohmann::json j = nlohmann::json::array();
      auto& a = j.get_ref<nlohmann::json::array_t&>();
      for (simdjson::dom::element v : simdjson::dom::array(e)) a.push_back(ToNlohmann(v));
      return j;
    }
    case simdjson::dom::element_type::STRING:
      return std::string(std::string_view(e));
    case simdjson::dom::element_type::INT64: {
      const int64_t i = int64_t(e);
      if (i >= 0) return static_cast<uint64_t>(i);
      return i;
    }
    case simdjson::dom::element_type::UINT64:
      return uint64_t(e);
    case simdjson::dom::element_type::DOUBLE:
      return double(e);
    case simdjson::dom::element_type::BOOL:
      return bool(e);
    case simdjson::dom::element_type::NULL_VALUE:
      return nullptr;
  }
  // A type this code does not know (a newer simdjson's): nlohmann parses the document instead.
  throw UnknownElement{};
}

// Whether `text` may hold the integer -0 outside a string: a "-0" after a structural character or
// whitespace and not followed by a fraction, an exponent or a digit (a string may match too: the
// check only has to miss none). nlohmann reads it as number_integer, simdjson as the INT64 0
// that ToNlohmann makes number_unsigned.
bool MayHoldNegativeZero(std::string_view text) {
  for (size_t at = text.find("-0"); at != std::string_view::npos; at = text.find("-0", at + 1)) {
    const char before = at == 0 ? ' ' : text[at - 1];
    const char after = at + 2 < text.size() ? text[at + 2] : ' ';
    const bool token_start = before == ':' || before == ',' || before == '[' || before == ' ' || before == '\n' ||
                             before == '\t' || before == '\r';
    const bool integer_end = !(after == '.' || after == 'e' || after == 'E' || (after >= '0' && after <= '9'));
    if (token_start && integer_end) return true;
  }
  return false;
}
}  // namespace

Result<nlohmann::json> ParseJsonFast(const std::string& text) {
  // One parser per thread: its buffers are reused from document to document.
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (!MayHoldNegativeZero(text) && parser.parse(text).get(root) == simdjson::SUCCESS) {
    try {
      return ToNlohmann(root);
    } catch (const UnknownElement&) {
    }
  }
  // What simdjson refuses (an integer beyond 64 bits, which nlohmann reads as a double; bad
  // JSON) is left to nlohmann, so that the result is always nlohmann's.
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss("not valid JSON");
  return j;
}

Result<Envelope> Envelope::FromVerifiedSignedBytes(const std::string& bytes) {
  Result<nlohmann::json> j = ParseJsonFast(bytes);
  if (!j.ok()) return DataLoss("signed bytes are not valid JSON");
  return EnvelopeOf(std::move(*j));
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
