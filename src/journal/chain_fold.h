// The fold state of one chain, replayed from its events in seq order: what the fold statements
// of each event type write to tenants, signing_keys, api_keys, artifacts, simulations,
// attachments and review_served, as far as the signed events determine it. Shared by `oml verify
// --folds` (folds.h), which compares it with the tables, and `oml reconcile`
// (reconcile/reconcile.h), which derives the lake's silver/claims rows and the objects' expected
// places from it.
//
// Not thread-safe; one replay per object. Apply must see a chain's events in seq order.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "journal/event.h"
#include "journal/provider.h"

namespace oml::journal {

// The rows the fold statements write, as far as the events determine them. A seq of 0 is NULL.
struct TenantRow {
  std::string name;
  int64_t created_seq = 0;
};
struct SigningKeyRow {
  std::string public_key;  // raw 32 bytes
  int64_t issued_seq = 0;
  int64_t retired_by = 0;  // seq of the key.issued that retired it; 0 while in force
};
struct ApiKeyRow {
  std::string principal, role;
  int64_t created_seq = 0, revoked_seq = 0;
};
struct ArtifactRow {
  std::string workarea_id, path, principal, writer_key_id, provenance, media_type;
  std::optional<std::string> simulation_id;
  int64_t size_bytes = 0;
  std::string plaintext_sha256, ciphertext_sha256;  // lowercase hex
  std::string state;
  int64_t submitted_seq = 0, erased_seq = 0;
  int64_t promoted_seq = 0, rejected_seq = 0, demoted_seq = 0;  // review acts (sql/0009)
  int64_t retracted_seq = 0, reassigned_seq = 0;                 // lifecycle acts (sql/0014)
  int64_t state_seq = 0;     // the event that last set `state`
  int64_t workarea_seq = 0;  // the event that last set `workarea_id` (submission or reassignment)
  // Signed times (envelope `time`) of claim.submitted, claim.promoted and the event at state_seq:
  // not fold-table columns, but the lake's silver/claims row carries them.
  std::string submitted_at, promoted_at, state_at;
};
struct SimulationRow {
  std::string description, state;
  int64_t started_seq = 0, ended_seq = 0;
};
using ArtifactKey = std::pair<std::string, int64_t>;  // (artifact_id, version)
struct AttachmentRow {  // sql/0013 attachments
  std::string upload_id;
  std::string plaintext_sha256, ciphertext_sha256;  // lowercase hex
  int64_t size_bytes = 0, ciphertext_size = 0;
  std::string media_type;
  std::optional<std::string> filename;
  std::string object_key;  // <tenant>/<ciphertext_sha256 hex>
  std::string location;    // quarantine | bodies | none
  std::string review;      // the signed `review` object, serialized by nlohmann::json::dump()
  bool flagged = false;
  int64_t attach_seq = 0;
  int64_t location_seq = 0;  // the event that last set `location`: the attach, claim.promoted or artifact.erased
};
using AttachmentKey = std::tuple<std::string, int64_t, int64_t>;          // (artifact_id, version, ordinal)
using ServedKey = std::tuple<std::string, int64_t, int64_t, std::string>;  // (artifact_id, version, item, reviewer)

// One chain's fold state, replayed in seq order. Mirrors the fold statements of provider.cc
// (tenant.created, key.issued, api_key.created, api_key.revoked), admission/claims.cc
// (claim.submitted, claim.promoted, claim.rejected, claim.demoted, artifact.erased),
// admission/lifecycle.cc with sql/0014 (claim.reassigned, simulation.started, simulation.ended)
// and admission/attachments.cc (submission.attach, review.served, and the attachment statements
// of claim.promoted and artifact.erased: PromoteFold, EraseFold). Any other event type has no
// fold on these tables.
class ChainFold {
 public:
  // `body_reviews`: whether to keep `body_reviews` (verify --folds compares it; the reconciler
  // has no use for it and leaves it empty).
  explicit ChainFold(bool provider, bool body_reviews = true) : provider_(provider), keep_reviews_(body_reviews) {}

  // kDataLoss if a folded event's payload lacks a member or has one of the wrong type.
  Status Apply(int64_t seq, const Envelope& e) { return ApplyCatching(seq, e); }
  // The same, taking the payload's strings instead of copying them: `e.payload` is left with
  // moved-from strings (e.type and e.time stay as they were).
  Status Apply(int64_t seq, Envelope&& e) {
    struct Taking {  // take_ is reset however ApplyCatching ends (bad_alloc included)
      bool& t;
      ~Taking() { t = false; }
    } taking{take_ = true};
    return ApplyCatching(seq, e);
  }

  std::map<std::string, TenantRow> tenants;           // provider chain only
  std::map<std::string, SigningKeyRow> signing_keys;  // provider chain only
  std::map<std::string, ApiKeyRow> api_keys;          // by key id, ak_ + 16 hex
  std::map<ArtifactKey, ArtifactRow> artifacts;
  std::map<std::string, SimulationRow> simulations;  // by simulation_id
  // artifacts.body_review: claim.submitted's `review` member as signed (dumped), nullopt (NULL)
  // when it has none. One entry per entry of `artifacts`.
  std::map<ArtifactKey, std::optional<std::string>> body_reviews;  // empty if not kept
  std::map<AttachmentKey, AttachmentRow> attachments;
  std::map<ServedKey, int64_t> review_served;  // served_seq

 private:
  // Member k of p as a string: copied, or moved out when Apply was given the envelope (take_: p
  // is then not const, whatever the reference says).
  std::string Str(const nlohmann::json& p, const char* k) const {
    const std::string& v = Ref(p, k);
    return take_ ? std::move(const_cast<std::string&>(v)) : v;
  }

  // Member k of p as a string, for a lookup (never moved). A member of another type throws
  // what get<std::string>() throws ("type must be string, but is number"), not get_ref's
  // less telling type_error.303.
  static const std::string& Ref(const nlohmann::json& p, const char* k) {
    const nlohmann::json& v = p.at(k);
    if (!v.is_string()) (void)v.get<std::string>();
    return v.get_ref<const std::string&>();
  }

  Status ApplyCatching(int64_t seq, const Envelope& e) {
    try {
      return ApplyOrThrow(seq, e);
    } catch (const nlohmann::json::exception& ex) {
      return DataLoss(e.type + " payload is malformed: " + ex.what());
    }
  }

  // Throws nlohmann::json::exception for a missing member or one of the wrong type. A member Str
  // reads (it may be moved out) is read by nothing after it; lookups use Ref.
  Status ApplyOrThrow(int64_t seq, const Envelope& e) {
    const nlohmann::json& p = e.payload;
    if (e.type == "tenant.created" && provider_) {
      // INSERT tenants (tenant_id, name, created_seq): a second one with the same id or name
      // would have failed on the key, so the first one stands.
      tenants.emplace(Str(p, "tenant_id"), TenantRow{Str(p, "name"), seq});
    } else if (e.type == "key.issued" && provider_) {
      OML_ASSIGN_OR_RETURN(IssuedKey issued, ParseKeyIssued(e));
      // A rotation (with `supersedes`) first retires every key in force, then inserts.
      if (!issued.supersedes.empty())
        for (auto& [id, k] : signing_keys)
          if (k.retired_by == 0) k.retired_by = seq;
      signing_keys.emplace(issued.key_id, SigningKeyRow{issued.raw, seq, 0});
    } else if (e.type == "api_key.created") {
      api_keys.emplace(Str(p, "key_id"), ApiKeyRow{Str(p, "principal"), Str(p, "role"), seq, 0});
    } else if (e.type == "api_key.revoked") {
      // UPDATE … WHERE key_hash AND revoked_at IS NULL. A key no api_key.created made (inserted
      // outside oml) gets no expected row: its row is extra whether or not it was revoked.
      auto it = api_keys.find(Ref(p, "key_id"));
      if (it != api_keys.end() && it->second.revoked_seq == 0) it->second.revoked_seq = seq;
    } else if (e.type == "claim.submitted") {
      ArtifactRow a;
      a.workarea_id = Str(p, "workarea_id");
      a.path = Str(p, "path");
      a.principal = Str(p, "principal");
      a.writer_key_id = Str(p, "writer_key_id");
      a.provenance = Str(p, "provenance");
      if (!p.at("simulation_id").is_null()) a.simulation_id = Str(p, "simulation_id");
      a.media_type = Str(p, "media_type");
      a.size_bytes = p.at("size").get<int64_t>();
      a.plaintext_sha256 = Str(p, "plaintext_sha256");
      a.ciphertext_sha256 = Str(p, "ciphertext_sha256");
      a.state = "held";
      a.submitted_seq = seq;
      a.state_seq = seq;
      a.submitted_at = a.state_at = e.time;
      a.workarea_seq = seq;
      ArtifactKey key{Str(p, "artifact_id"), p.at("version").get<int64_t>()};
      if (!keep_reviews_) {
        artifacts.emplace(std::move(key), std::move(a));
        return Status::Ok();
      }
      // INSERT … body_review = the payload's `review` (absent: NULL).
      std::optional<std::string> review;
      if (p.contains("review") && !p.at("review").is_null()) review = p.at("review").dump();
      if (artifacts.emplace(key, std::move(a)).second) body_reviews.emplace(key, std::move(review));
    } else if (e.type == "submission.attach") {
      // INSERT oml.attachments (… location 'quarantine', attach_seq = seq): a second one with the
      // same (artifact_id, version, ordinal) would have failed on the key.
      AttachmentRow a;
      a.upload_id = Str(p, "upload_id");
      a.plaintext_sha256 = Str(p, "plaintext_sha256");
      a.ciphertext_sha256 = Str(p, "ciphertext_sha256");
      a.size_bytes = p.at("size").get<int64_t>();
      a.ciphertext_size = p.at("ciphertext_size").get<int64_t>();
      a.media_type = Str(p, "media_type");
      if (!p.at("filename").is_null()) a.filename = Str(p, "filename");
      a.object_key = e.tenant + "/" + a.ciphertext_sha256;  // uploads::ObjectKey
      a.location = "quarantine";
      a.review = p.at("review").dump();
      a.flagged = p.at("flagged").get<bool>();
      a.attach_seq = a.location_seq = seq;
      attachments.emplace(
          AttachmentKey{Str(p, "artifact_id"), p.at("version").get<int64_t>(), p.at("ordinal").get<int64_t>()},
          std::move(a));
    } else if (e.type == "review.served") {
      // INSERT … ON CONFLICT (key) DO UPDATE SET served_seq: the latest serve names the row.
      review_served[ServedKey{Str(p, "artifact_id"), p.at("version").get<int64_t>(), p.at("item").get<int64_t>(),
                              e.principal}] = seq;
    } else if (e.type == "claim.promoted" || e.type == "claim.rejected" || e.type == "claim.demoted") {
      // UPDATE … SET state, <act>_seq = seq WHERE (artifact_id, version) AND state = <from>: the
      // fold refuses (the transaction fails) when the state is not the act's starting state, so a
      // journalled act always found it.
      const ArtifactKey key{Ref(p, "artifact_id"), p.at("version").get<int64_t>()};
      auto it = artifacts.find(key);
      if (it != artifacts.end()) {
        ArtifactRow& a = it->second;
        if (e.type == "claim.promoted") {
          a.state = "promoted";
          a.promoted_seq = seq;
          a.promoted_at = e.time;
        } else if (e.type == "claim.rejected") {
          a.state = "rejected";
          a.rejected_seq = seq;
        } else {
          a.state = "demoted";
          a.demoted_seq = seq;
        }
        a.state_seq = seq;
        a.state_at = e.time;
      }
      // Attachments::PromoteFold (UPDATE … SET location = 'bodies' WHERE (artifact_id, version) AND
      // location = 'quarantine') runs when the server had attachments to list, and the payload
      // then carries `attachments_served` (a server without the review gate writes neither).
      if (e.type == "claim.promoted" && p.contains("attachments_served")) {
        const auto& [id, version] = key;
        for (auto at = attachments.lower_bound({id, version, std::numeric_limits<int64_t>::min()});
             at != attachments.end() && std::get<0>(at->first) == id && std::get<1>(at->first) == version; ++at) {
          if (at->second.location != "quarantine") continue;
          at->second.location = "bodies";
          at->second.location_seq = seq;
        }
      }
    } else if (e.type == "artifact.erased") {
      // UPDATE … SET state = 'erased', erased_seq = seq WHERE artifact_id AND erased_seq IS NULL
      // (every version).
      const std::string& id = Ref(p, "artifact_id");
      for (auto it = artifacts.lower_bound({id, std::numeric_limits<int64_t>::min()});
           it != artifacts.end() && it->first.first == id; ++it) {
        if (it->second.erased_seq != 0) continue;
        it->second.state = "erased";
        it->second.erased_seq = seq;
        it->second.state_seq = seq;
        it->second.state_at = e.time;
      }
      // Attachments::EraseFold (UPDATE … SET location = 'none' WHERE artifact_id, every version)
      // runs when the erasure found attachments, and the payload then lists their digests in
      // `attachments_ciphertext_sha256`.
      constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
      if (p.contains("attachments_ciphertext_sha256"))
        for (auto at = attachments.lower_bound({id, kMin, kMin});
             at != attachments.end() && std::get<0>(at->first) == id; ++at) {
          at->second.location = "none";
          at->second.location_seq = seq;
        }
    } else if (e.type == "claim.reassigned") {
      // UPDATE … SET workarea_id = to, reassigned_seq = seq WHERE artifact_id AND version IN
      // versions AND workarea_id = from AND erased_seq IS NULL, refused unless every listed
      // version matched: a journalled reassignment moved them all.
      const std::string& id = Ref(p, "artifact_id");
      const std::string to = Str(p, "to_workarea_id");
      for (const auto& v : p.at("versions")) {
        auto it = artifacts.find(ArtifactKey{id, v.get<int64_t>()});
        if (it == artifacts.end() || it->second.erased_seq != 0) continue;
        it->second.workarea_id = to;
        it->second.reassigned_seq = seq;
        it->second.workarea_seq = seq;
      }
    } else if (e.type == "simulation.started") {
      // INSERT … ON CONFLICT DO NOTHING, refused when nothing was inserted: the first one stands.
      simulations.emplace(Str(p, "simulation_id"), SimulationRow{Str(p, "description"), "running", seq, 0});
    } else if (e.type == "simulation.ended") {
      // oml.end_simulation: ends it (refused unless running), then retracts every version of the
      // simulation that is not erased.
      const std::string& sim = Ref(p, "simulation_id");
      auto it = simulations.find(sim);
      if (it != simulations.end() && it->second.ended_seq == 0) {
        it->second.state = "ended";
        it->second.ended_seq = seq;
      }
      for (auto& [k, a] : artifacts) {
        if (a.simulation_id != sim || a.erased_seq != 0) continue;
        a.state = "retracted";
        a.retracted_seq = seq;
        a.state_seq = seq;
        a.state_at = e.time;
      }
    }
    return Status::Ok();
  }

  bool provider_;
  bool keep_reviews_;
  bool take_ = false;  // Apply(Envelope&&) is running
};

}  // namespace oml::journal
