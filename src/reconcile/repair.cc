#include "reconcile/repair.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "crypto/crypto.h"
#include "journal/event.h"
#include "lake/outbox_cut.h"
#include "lake/rebuild.h"

namespace oml::reconcile {
namespace {

using nlohmann::json;

bool IsTableClass(const std::string& c) {
  static const std::set<std::string> k = {"missing-in-lake", "duplicate-in-lake", "extra-in-lake", "row-mismatch",
                                          "state-mismatch", "containment-breach", "count-mismatch",
                                          "table-unreadable"};
  return k.count(c) > 0;
}

bool IsLakeTable(const std::string& t) {
  return t == "bronze/events" || t == "silver/claims" || t == "gold/daily_activity";
}

// The action a finding takes; "" when no repair applies.
std::string ActionOf(const Finding& f) {
  if (IsTableClass(f.cls) && IsLakeTable(f.table)) return "rebuild";
  if (f.table != "quarantine" && f.table != "bodies") return "";
  if (f.cls == "misplaced-object" || f.cls == "erased-object-present" || f.cls == "orphan-object" ||
      f.cls == "stale-upload")
    return "delete";
  if (f.cls == "missing-object" || (f.cls == "object-digest-mismatch" && f.column == "ciphertext_sha256") ||
      (f.cls == "object-digest-mismatch" && f.column == "size"))
    return "copy";
  return "";
}

std::string DigestOfKey(const std::string& key) {
  const size_t slash = key.rfind('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

class Repairer {
 public:
  Repairer(const Report& audit, const RepairDeps& d) : audit_(audit), d_(d) {}

  Result<RepairReport> Run() {
    // A chain the audit could not replay to its head leaves what its tenant's objects and rows
    // must be unknown: nothing is repaired until it is (`oml verify`, `oml verify --folds`).
    for (const Finding& f : audit_.findings) {
      if (f.cls != "journal-unreadable") continue;
      out_.refused = "tenant " + f.tenant + "'s chain could not be replayed past seq " + std::to_string(f.seq) +
                     ": nothing is repaired until `oml verify` and `oml verify --folds` pass";
      out_.left = audit_.findings;
      return std::move(out_);
    }
    // Groups, in a fixed order: copies, then deletes, then rebuilds.
    std::map<std::tuple<int, std::string, std::string, std::string>, std::vector<const Finding*>> groups;
    for (const Finding& f : audit_.findings) {
      const std::string action = ActionOf(f);
      if (action.empty()) {
        out_.left.push_back(f);
        continue;
      }
      const int order = action == "copy" ? 0 : action == "delete" ? 1 : 2;
      groups[{order, f.tenant, f.cls + "\n" + f.table, action}].push_back(&f);
    }
    std::set<std::string> rebuilt;
    Status stopped = Status::Ok();  // a lake.repair event that could not be journalled stops the rest
    for (const auto& [g, fs] : groups) {
      const auto& [order, tenant, cls_table, action] = g;
      RepairAction a;
      a.tenant = tenant;
      a.cls = cls_table.substr(0, cls_table.find('\n'));
      a.table = cls_table.substr(cls_table.find('\n') + 1);
      a.action = action;
      for (const Finding* f : fs) {
        if (f->seq > 0) a.seqs.push_back(f->seq);
        if (!f->key.empty()) a.keys.push_back(f->key);
      }
      std::sort(a.seqs.begin(), a.seqs.end());
      a.seqs.erase(std::unique(a.seqs.begin(), a.seqs.end()), a.seqs.end());
      if (stopped.ok()) stopped = Journal(&a, fs.size());
      if (!stopped.ok()) {
        a.outcome = "not attempted: a lake.repair event could not be journalled (" + stopped.ToString() + ")";
        out_.actions.push_back(std::move(a));
        continue;
      }
      if (action == "rebuild") {
        if (rebuilt.insert(a.table).second) {
          Rebuild(&a);
          rebuild_outcome_[a.table] = {a.ok, a.outcome};
        } else {
          std::tie(a.ok, a.outcome) = rebuild_outcome_[a.table];
        }
      } else {
        Status worst = Status::Ok();
        int done = 0;
        for (const Finding* f : fs) {
          Status s = action == "copy" ? Copy(*f) : Delete(*f);
          if (s.ok()) ++done;
          else if (worst.ok()) worst = s;
        }
        a.ok = worst.ok();
        a.outcome = worst.ok() ? "done" : std::to_string(done) + " of " + std::to_string(fs.size()) +
                                              " done; " + worst.ToString();
      }
      out_.actions.push_back(std::move(a));
    }
    return std::move(out_);
  }

 private:
  Status Journal(RepairAction* a, size_t findings) {
    json payload = {{"class", a->cls}, {"table", a->table}, {"action", a->action}, {"findings", findings},
                    {"seqs", a->seqs}, {"keys", a->keys}, {"stream", d_.stream}};
    journal::EventSpec ev{"lake.repair", d_.principal, std::move(payload), json::object(), nullptr};
    // The finding's tenant's chain; the provider's for a finding about no tenant, or about a key
    // whose first segment names no chain (junk in a bucket).
    std::string chain = a->tenant.empty() ? journal::kProviderTenant : a->tenant;
    if (chain != journal::kProviderTenant) {
      OML_ASSIGN_OR_RETURN(db::Rows known, d_.reader->Query("SELECT count(*) FROM oml.chain_heads WHERE tenant_id::text = $1",
                                                            {db::Text(chain)}));
      if (known.GetInt(0, 0) == 0) chain = journal::kProviderTenant;
    }
    OML_ASSIGN_OR_RETURN(journal::Receipt rc, d_.journal->Append(chain, ev));
    a->event_seq = rc.seq;
    return Status::Ok();
  }

  void Rebuild(RepairAction* a) {
    auto s = lake::ResolveStream(d_.stream);
    if (!s.ok()) {
      a->outcome = s.status().ToString();
      return;
    }
    auto r = lake::StartRebuild(*d_.lakewriter, *s, d_.lake_root, a->table);
    if (!r.ok()) {
      a->outcome = r.status().ToString();
      return;
    }
    a->ok = true;
    a->outcome = "rebuilding: emptied at version " + std::to_string(r->truncated_version) +
                 "; the lake writer refills it from the outbox up to " + std::to_string(r->frontier);
  }

  blob::ObjectStore* StoreOf(const std::string& bucket) const {
    return bucket == "bodies" ? d_.bodies : d_.quarantine;
  }
  blob::ObjectStore* OtherOf(const std::string& bucket) const {
    return bucket == "bodies" ? d_.quarantine : d_.bodies;
  }

  // Puts the signed bytes back where the state says, from the other bucket's copy.
  Status Copy(const Finding& f) {
    const std::string digest = DigestOfKey(f.key);
    blob::ObjectStore* from = OtherOf(f.table);
    OML_ASSIGN_OR_RETURN(std::optional<std::string> have, ObjectSha256(*from, f.key));
    if (!have || *have != digest)
      return Status(Code::kDataLoss,
                    f.key + ": no copy with the signed digest is left in either bucket (restore it from a backup)",
                    "unrepairable");
    return blob::CopyBetween(*from, f.key, *StoreOf(f.table), f.key);
  }

  Status Delete(const Finding& f) {
    blob::ObjectStore* store = StoreOf(f.table);
    if (f.cls == "misplaced-object" && f.column == "containment-breach") {
      // The claim's states now. A held claim can still be accepted: its accept copies to this
      // very key, commits and then drops the quarantine copy, and a delete between that copy and
      // the commit would leave the promoted claim with no ciphertext anywhere. So only a claim
      // that can no longer be promoted (rejected, retracted, erased) loses the copy here.
      OML_ASSIGN_OR_RETURN(
          db::Rows r,
          d_.reader->Query("SELECT coalesce(bool_or(a.promoted_seq IS NOT NULL), false), "
                           "coalesce(bool_or(a.state = 'held'), false) FROM oml.artifacts a WHERE a.tenant_id = "
                           "$1::uuid AND (a.ciphertext_sha256 = decode($2, 'hex') OR EXISTS (SELECT 1 FROM "
                           "oml.attachments t WHERE t.tenant_id = a.tenant_id AND t.artifact_id = a.artifact_id AND "
                           "t.version = a.version AND t.ciphertext_sha256 = decode($2, 'hex')))",
                           {db::Text(f.tenant), db::Text(DigestOfKey(f.key))}));
      if (r.Get(0, 0) == "t") return FailedPrecondition(f.key + ": promoted since the audit; left in place");
      if (r.Get(0, 1) == "t")
        return FailedPrecondition(f.key + ": the claim is held and may still be accepted; reject or accept it, "
                                          "then repair again");
      // And never the only copy: quarantine must hold the signed bytes.
      OML_ASSIGN_OR_RETURN(std::optional<std::string> kept, ObjectSha256(*d_.quarantine, f.key));
      if (!kept || *kept != DigestOfKey(f.key))
        return FailedPrecondition(f.key + ": quarantine has no copy with the signed digest; the bodies copy is kept");
    }
    if (f.cls == "orphan-object") {
      // Named since the audit (a submit or an upload that committed meanwhile)?
      OML_ASSIGN_OR_RETURN(
          db::Rows r,
          d_.reader->Query("SELECT (SELECT count(*) FROM oml.artifact_bodies WHERE object_key = $1) + (SELECT count(*) "
                           "FROM oml.attachments WHERE object_key = $1) + (SELECT count(*) FROM "
                           "oml.upload_sessions_audit WHERE object_key = $1)",
                           {db::Text(f.key)}));
      if (r.GetInt(0, 0) > 0) return FailedPrecondition(f.key + ": named since the audit; left in place");
    }
    if (f.cls == "stale-upload") {
      // Its session receiving again, or new since the audit?
      const size_t u = f.key.find("/uploads/");
      const std::string id = u == std::string::npos ? "" : f.key.substr(u + 9, f.key.find('/', u + 9) - (u + 9));
      OML_ASSIGN_OR_RETURN(db::Rows r, d_.reader->Query("SELECT count(*) FROM oml.upload_sessions_audit WHERE "
                                                         "upload_id::text = $1 AND state IN ('created', 'receiving')",
                                                         {db::Text(id)}));
      if (r.GetInt(0, 0) > 0) return FailedPrecondition(f.key + ": its upload session is receiving; left in place");
    }
    if (f.cls == "misplaced-object" && f.table == "quarantine") {
      // A promoted claim's leftover: deleted only once the bodies copy is whole.
      OML_ASSIGN_OR_RETURN(std::optional<std::string> good, ObjectSha256(*d_.bodies, f.key));
      if (!good || *good != DigestOfKey(f.key))
        return FailedPrecondition(f.key + ": the bodies copy is not whole; the quarantine copy is kept");
    }
    return store->Delete(f.key);
  }

  const Report& audit_;
  const RepairDeps& d_;
  RepairReport out_;
  std::map<std::string, std::pair<bool, std::string>> rebuild_outcome_;
};

}  // namespace

json RepairReport::ToJson() const {
  json acts = json::array();
  for (const auto& a : actions)
    acts.push_back({{"tenant", a.tenant.empty() ? json(nullptr) : json(a.tenant)},
                    {"class", a.cls},
                    {"table", a.table},
                    {"action", a.action},
                    {"seqs", a.seqs},
                    {"keys", a.keys},
                    {"event_seq", a.event_seq},
                    {"ok", a.ok},
                    {"outcome", a.outcome}});
  json left = json::array();
  for (const auto& f : this->left) left.push_back(f.ToJson());
  return {{"actions", acts}, {"left", left}, {"refused", refused.empty() ? json(nullptr) : json(refused)}};
}

std::string RepairReport::ToText() const {
  std::string s = refused.empty() ? "" : "repair refused: " + refused + "\n";
  for (const auto& a : actions) {
    s += "repair " + a.action + " " + a.table + " (" + a.cls + ")" + (a.tenant.empty() ? "" : " tenant " + a.tenant) +
         ": lake.repair seq " + std::to_string(a.event_seq) + "; " + a.outcome + "\n";
  }
  for (const auto& f : left) s += "not repaired: " + f.ToText() + "\n";
  return s;
}

Result<RepairReport> Repair(const Report& audit, const RepairDeps& d) {
  if (d.journal == nullptr || d.lakewriter == nullptr || d.reader == nullptr)
    return Internal("Repair needs the journal, the lake writer's and the reconciler's connections");
  Repairer r(audit, d);
  return r.Run();
}

}  // namespace oml::reconcile
