#include "journal/bronze_row.h"

#include "crypto/crypto.h"

namespace oml::journal {

nlohmann::json BronzePayloadColumns(const Envelope& e) {
  static const char* const kStrings[] = {"artifact_id", "workarea_id",      "path",
                                         "provenance",  "simulation_id",    "plaintext_sha256",
                                         "ciphertext_sha256"};
  nlohmann::json out = nlohmann::json::object();
  const bool obj = e.payload.is_object();
  for (const char* k : kStrings) {
    auto it = obj ? e.payload.find(k) : e.payload.end();
    out[k] = obj && it != e.payload.end() && it->is_string() ? *it : nlohmann::json(nullptr);
  }
  auto v = obj ? e.payload.find("version") : e.payload.end();
  out["version"] = obj && v != e.payload.end() && v->is_number_integer() ? *v : nlohmann::json(nullptr);
  return out;
}

nlohmann::json BronzeRow(const Envelope& e, const std::string& event_hash, const std::string& signed_bytes,
                         const std::string& signature) {
  nlohmann::json row = {{"tenant_id", e.tenant},
                        {"seq", e.seq},
                        {"prev_hash", crypto::Hex(e.prev_hash)},
                        {"event_hash", crypto::Hex(event_hash)},
                        {"event_type", e.type},
                        {"key_id", e.key_id},
                        {"principal", e.principal},
                        {"occurred_at", e.time},
                        {"signed_bytes", crypto::Base64(signed_bytes)},
                        {"signature", crypto::Base64(signature)}};
  row.update(BronzePayloadColumns(e));
  return row;
}

}  // namespace oml::journal
