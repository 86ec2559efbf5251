// The bronze/events row of one journal event: what the commit point enqueues in the outbox
// (target 'bronze/events', row_data) and what `oml verify --from-lake` recomputes from the
// signed bytes to check the lake's columns (docs/data/delta-tables.md, "bronze/events").
//
// Keys are the Delta column names of bronze/events (lake/delta_tables.cc kBronzeEvents), except
// outbox_seq, which the lake writer adds from the outbox row. Binary values (signed_bytes,
// signature) are base64 here; the lake writer turns them into hex for the Delta adapter.
//
//   column             from                         null when
//   tenant_id          envelope tenant              never
//   seq                envelope seq                 never
//   prev_hash          envelope prev (hex)          never
//   event_hash         SHA-256(signed_bytes) (hex)  never
//   event_type         envelope type                never
//   key_id             envelope key_id              never
//   principal          envelope principal           never (empty string stays "")
//   occurred_at        envelope time                never
//   artifact_id        payload.artifact_id          the payload has no string member of that name
//   version            payload.version              ... no integer member of that name
//   workarea_id        payload.workarea_id          ... no string member
//   path               payload.path                 ... no string member
//   provenance         payload.provenance           ... no string member
//   simulation_id      payload.simulation_id        ... no string member (null in the payload too)
//   plaintext_sha256   payload.plaintext_sha256     ... no string member (lower hex)
//   ciphertext_sha256  payload.ciphertext_sha256    ... no string member (lower hex)
//   signed_bytes       the signed bytes (base64)    never
//   signature          the signature (base64)       never
//
// The payload columns follow the payload by member name, whatever the event type: today
// claim.submitted carries all eight, artifact.erased artifact_id and both digests, and every
// other event none. An event type added later that names an artifact the same way fills them
// without a change here.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "journal/event.h"

namespace oml::journal {

// The payload-derived columns (artifact_id .. ciphertext_sha256 above), every key present, null
// where the payload has none.
nlohmann::json BronzePayloadColumns(const Envelope& e);

// The whole outbox row_data of event e (every column above). event_hash, signed_bytes and
// signature are raw bytes.
nlohmann::json BronzeRow(const Envelope& e, const std::string& event_hash, const std::string& signed_bytes,
                         const std::string& signature);

}  // namespace oml::journal
