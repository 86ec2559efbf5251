#include "journal/folds.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "common/sync_point.h"
#include "crypto/crypto.h"
#include "journal/event.h"
#include "journal/provider.h"

namespace oml::journal {
namespace {

constexpr int kDefaultPage = 4096;

std::string SeqText(int64_t seq) { return seq > 0 ? std::to_string(seq) : "NULL"; }
std::string SetText(bool set) { return set ? "non-NULL" : "NULL"; }
std::string OptText(const std::optional<std::string>& v) { return v ? *v : "NULL"; }

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
};
struct SimulationRow {
  std::string description, state;
  int64_t started_seq = 0, ended_seq = 0;
};
using ArtifactKey = std::pair<std::string, int64_t>;  // (artifact_id, version)

// One chain's fold state, replayed in seq order. Mirrors the fold statements of provider.cc
// (tenant.created, key.issued, api_key.created, api_key.revoked), admission/claims.cc
// (claim.submitted, claim.promoted, claim.rejected, claim.demoted, artifact.erased) and
// admission/lifecycle.cc with sql/0014 (claim.reassigned, simulation.started, simulation.ended).
// Any other event type has no fold on these tables.
class ChainFold {
 public:
  explicit ChainFold(bool provider) : provider_(provider) {}

  // kDataLoss if a folded event's payload lacks a member or has one of the wrong type.
  Status Apply(int64_t seq, const Envelope& e) {
    try {
      return ApplyOrThrow(seq, e);
    } catch (const nlohmann::json::exception& ex) {
      return DataLoss(e.type + " payload is malformed: " + ex.what());
    }
  }

  std::map<std::string, TenantRow> tenants;           // provider chain only
  std::map<std::string, SigningKeyRow> signing_keys;  // provider chain only
  std::map<std::string, ApiKeyRow> api_keys;          // by key id, ak_ + 16 hex
  std::map<ArtifactKey, ArtifactRow> artifacts;
  std::map<std::string, SimulationRow> simulations;  // by simulation_id

 private:
  static std::string Str(const nlohmann::json& p, const char* k) { return p.at(k).get<std::string>(); }

  // Throws nlohmann::json::exception for a missing member or one of the wrong type.
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
      auto it = api_keys.find(Str(p, "key_id"));
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
      a.workarea_seq = seq;
      artifacts.emplace(ArtifactKey{Str(p, "artifact_id"), p.at("version").get<int64_t>()}, std::move(a));
    } else if (e.type == "claim.promoted" || e.type == "claim.rejected" || e.type == "claim.demoted") {
      // UPDATE … SET state, <act>_seq = seq WHERE (artifact_id, version) AND state = <from>: the
      // fold refuses (the transaction fails) when the state is not the act's starting state, so a
      // journalled act always found it.
      auto it = artifacts.find(ArtifactKey{Str(p, "artifact_id"), p.at("version").get<int64_t>()});
      if (it != artifacts.end()) {
        ArtifactRow& a = it->second;
        if (e.type == "claim.promoted") {
          a.state = "promoted";
          a.promoted_seq = seq;
        } else if (e.type == "claim.rejected") {
          a.state = "rejected";
          a.rejected_seq = seq;
        } else {
          a.state = "demoted";
          a.demoted_seq = seq;
        }
        a.state_seq = seq;
      }
    } else if (e.type == "artifact.erased") {
      // UPDATE … SET state = 'erased', erased_seq = seq WHERE artifact_id AND erased_seq IS NULL
      // (every version).
      const std::string id = Str(p, "artifact_id");
      for (auto it = artifacts.lower_bound({id, std::numeric_limits<int64_t>::min()});
           it != artifacts.end() && it->first.first == id; ++it) {
        if (it->second.erased_seq != 0) continue;
        it->second.state = "erased";
        it->second.erased_seq = seq;
        it->second.state_seq = seq;
      }
    } else if (e.type == "claim.reassigned") {
      // UPDATE … SET workarea_id = to, reassigned_seq = seq WHERE artifact_id AND version IN
      // versions AND workarea_id = from AND erased_seq IS NULL, refused unless every listed
      // version matched: a journalled reassignment moved them all.
      const std::string id = Str(p, "artifact_id"), to = Str(p, "to_workarea_id");
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
      const std::string sim = Str(p, "simulation_id");
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
      }
    }
    return Status::Ok();
  }

  bool provider_;
};

struct TenantRef {
  std::string id, name;
  bool anchored = true;  // a tenant.created (or `oml init`, for the provider) defines it
};

// Collects one tenant's findings for one table.
class Differ {
 public:
  Differ(std::vector<FoldDiff>* out, std::string table, const TenantRef& t)
      : out_(out), table_(std::move(table)), tenant_id_(t.id), tenant_name_(t.name) {}
  void Compare(const std::string& key, const char* column, const std::string& expected, const std::string& actual,
               int64_t seq) {
    if (expected != actual) Add(key, column, expected, actual, FoldDiffKind::kChanged, seq);
  }
  void Missing(const std::string& key, int64_t seq) { Add(key, "", "", "", FoldDiffKind::kMissing, seq); }
  void Extra(const std::string& key) { Add(key, "", "", "", FoldDiffKind::kExtra, 0); }
  // For the tenants table, whose rows each name their own tenant.
  void For(const std::string& id, const std::string& name) {
    tenant_id_ = id;
    tenant_name_ = name;
  }

 private:
  void Add(const std::string& key, const char* column, const std::string& expected, const std::string& actual,
           FoldDiffKind kind, int64_t seq) {
    out_->push_back({table_, tenant_id_, tenant_name_, key, column, expected, actual, kind, seq});
  }
  std::vector<FoldDiff>* out_;
  std::string table_, tenant_id_, tenant_name_;
};

class FoldVerifier {
 public:
  FoldVerifier(db::Pool& pool, WorkPool& checks, const FoldOptions& opts)
      : pool_(pool), checks_(checks), opts_(opts), page_(opts.page_rows > 0 ? opts.page_rows : kDefaultPage) {}

  Result<FoldReport> Run() {
    const bool all = opts_.only_tenant.empty();
    const bool provider_selected = all || opts_.only_tenant == kProviderTenant || opts_.only_tenant == "provider";
    std::vector<TenantRef> customers;
    // The provider chain first: its tenant.created events name the chains to replay.
    OML_RETURN_IF_ERROR(RunTasks({TenantRef{kProviderTenant, "provider", true}}, provider_selected, &customers));
    std::vector<TenantRef> selected;
    for (const auto& t : customers)
      if (all || t.name == opts_.only_tenant || t.id == opts_.only_tenant) selected.push_back(t);
    if (!provider_selected && selected.empty())
      return NotFound("no tenant '" + opts_.only_tenant + "'", "tenant-not-found");
    OML_RETURN_IF_ERROR(RunTasks(selected, true, nullptr));
    std::sort(report_.diffs.begin(), report_.diffs.end(), [](const FoldDiff& a, const FoldDiff& b) {
      return std::make_tuple(a.tenant_id != kProviderTenant, a.tenant_name, a.tenant_id, a.table, a.key, a.column) <
             std::make_tuple(b.tenant_id != kProviderTenant, b.tenant_name, b.tenant_id, b.table, b.key, b.column);
    });
    return report_;
  }

 private:
  // Runs one task per tenant on the pool and waits for all of them.
  Status RunTasks(const std::vector<TenantRef>& tenants, bool compare, std::vector<TenantRef>* customers) {
    std::vector<Status> st(tenants.size());
    {
      WorkPool::Group group(checks_);  // destroyed (waited) before st
      for (size_t i = 0; i < tenants.size(); ++i)
        group.Add([&, i] { st[i] = RunChain(tenants[i], compare, customers); });
      try {
        group.Wait();
      } catch (const std::exception& e) {  // a malformed column (std::invalid_argument), out of memory
        return Internal(std::string("recomputing the folds: ") + e.what());
      }
    }
    for (const auto& s : st) OML_RETURN_IF_ERROR(s);
    return Status::Ok();
  }

  // Replays one chain and compares its tenant's rows, in one snapshot. For the provider chain,
  // `customers` receives the tenants to replay next: every tenant.created, then every `tenants`
  // row no tenant.created names (anchored = false: nothing defines its rows).
  Status RunChain(const TenantRef& t, bool compare, std::vector<TenantRef>* customers) {
    const bool provider = t.id == kProviderTenant;
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_.Acquire());
    OML_ASSIGN_OR_RETURN(
        auto rs, c->Pipeline({{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", {}},
                              db::ScopeTo(t.id),
                              {"SELECT coalesce((SELECT seq FROM oml.chain_heads WHERE tenant_id = $1), 0)",
                               {db::Text(t.id)}, "folds_head"}}));
    const int64_t head = rs[2].GetInt(0, 0);
    ChainFold fold(provider);
    std::vector<FoldDiff> diffs;
    int64_t events = 0, rows = 0;
    bool readable = true;
    for (int64_t after = 0; t.anchored && readable && after < head;) {
      OML_ASSIGN_OR_RETURN(
          auto page, c->Pipeline({{"SELECT seq, signed_bytes FROM oml.journal "
                                   "WHERE tenant_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4",
                                   {db::Text(t.id), db::Int(after), db::Int(head), db::Int(page_)}, "folds_page", true}}));
      const db::Rows& r = page[0];
      if (r.size() == 0) break;  // rows missing up to the head: the chain pass reports them
      for (int i = 0; i < r.size() && readable; ++i) {
        const int64_t seq = r.GetInt(i, 0);
        auto env = Envelope::FromSignedBytes(r.GetBytes(i, 1));
        Status s = env.ok() ? fold.Apply(seq, *env) : env.status();
        if (!s.ok()) {
          diffs.push_back({"journal", t.id, t.name, "seq " + std::to_string(seq), "", s.message(), "",
                           FoldDiffKind::kUnreadable, seq});
          readable = false;
        } else {
          ++events;
        }
      }
      after = r.GetInt(r.size() - 1, 0);
    }
    // Test hook: rows committed from here on are outside this chain's snapshot.
    OML_RETURN_IF_ERROR(OML_SYNC_POINT("folds.after_replay"));
    // A chain that cannot be replayed to its head has no expected rows to compare with.
    if (compare && readable) {
      OML_RETURN_IF_ERROR(CompareApiKeys(*c, t, fold, &diffs, &rows));
      OML_RETURN_IF_ERROR(CompareArtifacts(*c, t, fold, &diffs, &rows));
      OML_RETURN_IF_ERROR(CompareSimulations(*c, t, fold, &diffs, &rows));
    }
    if (provider) OML_RETURN_IF_ERROR(CompareProviderTables(*c, fold, compare && readable, readable, &diffs, &rows, customers));
    OML_RETURN_IF_ERROR(c->Pipeline({{"COMMIT", {}}}).status());
    std::lock_guard<std::mutex> l(mu_);
    report_.tenants += 1;
    report_.events += events;
    report_.rows += rows;
    for (auto& d : diffs) report_.diffs.push_back(std::move(d));
    return Status::Ok();
  }

  Status CompareApiKeys(db::Conn& c, const TenantRef& t, ChainFold& fold, std::vector<FoldDiff>* diffs, int64_t* rows) {
    Differ d(diffs, "api_keys", t);
    std::string after;  // key_hash of the last row read; '' sorts first
    for (;;) {
      OML_ASSIGN_OR_RETURN(
          auto page, c.Pipeline({{"SELECT key_hash, principal, role, created_seq, revoked_seq, (revoked_at IS NOT NULL)::int "
                                  "FROM oml.api_keys WHERE tenant_id = $1 AND key_hash > $2 ORDER BY key_hash LIMIT $3",
                                  {db::Text(t.id), db::Bytes(after), db::Int(page_)}, "folds_api_keys", true}}));
      const db::Rows& r = page[0];
      for (int i = 0; i < r.size(); ++i) {
        ++*rows;
        after = r.GetBytes(i, 0);
        const std::string key = ApiKeyId(after);
        auto it = fold.api_keys.find(key);
        if (it == fold.api_keys.end()) {  // also a second row with the same key id
          d.Extra(key);
          continue;
        }
        const ApiKeyRow& x = it->second;
        const int64_t rseq = x.revoked_seq ? x.revoked_seq : x.created_seq;
        d.Compare(key, "principal", x.principal, r.Get(i, 1), x.created_seq);
        d.Compare(key, "role", x.role, r.Get(i, 2), x.created_seq);
        d.Compare(key, "created_seq", SeqText(x.created_seq), r.IsNull(i, 3) ? "NULL" : SeqText(r.GetInt(i, 3)), x.created_seq);
        d.Compare(key, "revoked_seq", SeqText(x.revoked_seq), r.IsNull(i, 4) ? "NULL" : SeqText(r.GetInt(i, 4)), rseq);
        d.Compare(key, "revoked_at", SetText(x.revoked_seq != 0), SetText(r.GetInt(i, 5) != 0), rseq);
        fold.api_keys.erase(it);
      }
      if (r.size() < page_) break;
    }
    for (const auto& [key, x] : fold.api_keys) d.Missing(key, x.created_seq);
    return Status::Ok();
  }

  Status CompareArtifacts(db::Conn& c, const TenantRef& t, ChainFold& fold, std::vector<FoldDiff>* diffs,
                          int64_t* rows) {
    Differ d(diffs, "artifacts", t);
    ArtifactKey after{"00000000-0000-0000-0000-000000000000", 0};
    for (;;) {
      OML_ASSIGN_OR_RETURN(
          auto page,
          c.Pipeline({{"SELECT artifact_id::text, version, workarea_id, path, principal, writer_key_id, provenance, "
                       "simulation_id, media_type, size_bytes, encode(plaintext_sha256, 'hex'), "
                       "encode(ciphertext_sha256, 'hex'), state, submitted_seq, erased_seq, promoted_seq, rejected_seq, "
                       "demoted_seq, retracted_seq, reassigned_seq "
                       "FROM oml.artifacts WHERE tenant_id = $1 AND (artifact_id, version) > ($2::uuid, $3::integer) "
                       "ORDER BY artifact_id, version LIMIT $4",
                       {db::Text(t.id), db::Text(after.first), db::Int(after.second), db::Int(page_)},
                       "folds_artifacts", true}}));
      const db::Rows& r = page[0];
      for (int i = 0; i < r.size(); ++i) {
        ++*rows;
        after = {r.Get(i, 0), r.GetInt(i, 1)};
        const std::string key = after.first + " v" + std::to_string(after.second);
        auto it = fold.artifacts.find(after);
        if (it == fold.artifacts.end()) {
          d.Extra(key);
          continue;
        }
        const ArtifactRow& x = it->second;
        const int64_t s = x.submitted_seq, state_seq = x.state_seq;
        d.Compare(key, "workarea_id", x.workarea_id, r.Get(i, 2), x.workarea_seq);
        d.Compare(key, "path", x.path, r.Get(i, 3), s);
        d.Compare(key, "principal", x.principal, r.Get(i, 4), s);
        d.Compare(key, "writer_key_id", x.writer_key_id, r.Get(i, 5), s);
        d.Compare(key, "provenance", x.provenance, r.Get(i, 6), s);
        d.Compare(key, "simulation_id", OptText(x.simulation_id), r.IsNull(i, 7) ? "NULL" : r.Get(i, 7), s);
        d.Compare(key, "media_type", x.media_type, r.Get(i, 8), s);
        d.Compare(key, "size_bytes", std::to_string(x.size_bytes), std::to_string(r.GetInt(i, 9)), s);
        d.Compare(key, "plaintext_sha256", x.plaintext_sha256, r.Get(i, 10), s);
        d.Compare(key, "ciphertext_sha256", x.ciphertext_sha256, r.Get(i, 11), s);
        d.Compare(key, "state", x.state, r.Get(i, 12), state_seq);
        d.Compare(key, "submitted_seq", SeqText(x.submitted_seq), SeqText(r.GetInt(i, 13)), s);
        d.Compare(key, "erased_seq", SeqText(x.erased_seq), r.IsNull(i, 14) ? "NULL" : SeqText(r.GetInt(i, 14)), state_seq);
        d.Compare(key, "promoted_seq", SeqText(x.promoted_seq), r.IsNull(i, 15) ? "NULL" : SeqText(r.GetInt(i, 15)),
                  x.promoted_seq ? x.promoted_seq : s);
        d.Compare(key, "rejected_seq", SeqText(x.rejected_seq), r.IsNull(i, 16) ? "NULL" : SeqText(r.GetInt(i, 16)),
                  x.rejected_seq ? x.rejected_seq : s);
        d.Compare(key, "demoted_seq", SeqText(x.demoted_seq), r.IsNull(i, 17) ? "NULL" : SeqText(r.GetInt(i, 17)),
                  x.demoted_seq ? x.demoted_seq : s);
        d.Compare(key, "retracted_seq", SeqText(x.retracted_seq), r.IsNull(i, 18) ? "NULL" : SeqText(r.GetInt(i, 18)),
                  x.retracted_seq ? x.retracted_seq : s);
        d.Compare(key, "reassigned_seq", SeqText(x.reassigned_seq), r.IsNull(i, 19) ? "NULL" : SeqText(r.GetInt(i, 19)),
                  x.reassigned_seq ? x.reassigned_seq : s);
        fold.artifacts.erase(it);
      }
      if (r.size() < page_) break;
    }
    for (const auto& [k, x] : fold.artifacts) d.Missing(k.first + " v" + std::to_string(k.second), x.submitted_seq);
    return Status::Ok();
  }

  Status CompareSimulations(db::Conn& c, const TenantRef& t, ChainFold& fold, std::vector<FoldDiff>* diffs,
                            int64_t* rows) {
    Differ d(diffs, "simulations", t);
    std::string after;  // simulation_id of the last row read; '' sorts first
    for (;;) {
      OML_ASSIGN_OR_RETURN(
          auto page, c.Pipeline({{"SELECT simulation_id, description, state, started_seq, ended_seq FROM oml.simulations "
                                  "WHERE tenant_id = $1 AND simulation_id > $2 ORDER BY simulation_id LIMIT $3",
                                  {db::Text(t.id), db::Text(after), db::Int(page_)}, "folds_simulations"}}));
      const db::Rows& r = page[0];
      for (int i = 0; i < r.size(); ++i) {
        ++*rows;
        after = r.Get(i, 0);
        auto it = fold.simulations.find(after);
        if (it == fold.simulations.end()) {
          d.Extra(after);
          continue;
        }
        const SimulationRow& x = it->second;
        const int64_t s = x.started_seq, e = x.ended_seq ? x.ended_seq : x.started_seq;
        d.Compare(after, "description", x.description, r.Get(i, 1), s);
        d.Compare(after, "state", x.state, r.Get(i, 2), e);
        d.Compare(after, "started_seq", SeqText(x.started_seq), SeqText(r.GetInt(i, 3)), s);
        d.Compare(after, "ended_seq", SeqText(x.ended_seq), r.IsNull(i, 4) ? "NULL" : SeqText(r.GetInt(i, 4)), e);
        fold.simulations.erase(it);
      }
      if (r.size() < page_) break;
    }
    for (const auto& [id, x] : fold.simulations) d.Missing(id, x.started_seq);
    return Status::Ok();
  }

  // `tenants` and `signing_keys`, read in the provider's snapshot (the provider scope sees every
  // `tenants` row; `signing_keys` is readable in any scope). Fills `customers` even when it does
  // not compare (the only tenant selected may be a customer).
  Status CompareProviderTables(db::Conn& c, ChainFold& fold, bool compare, bool readable, std::vector<FoldDiff>* diffs,
                               int64_t* rows, std::vector<TenantRef>* customers) {
    OML_ASSIGN_OR_RETURN(
        auto rs, c.Pipeline({{"SELECT tenant_id::text, name, created_seq FROM oml.tenants ORDER BY tenant_id", {},
                              "folds_tenants", true},
                             {"SELECT key_id, public_key, issued_seq, (retired_at IS NOT NULL)::int FROM oml.signing_keys "
                              "ORDER BY key_id",
                              {}, "folds_signing_keys", true}}));
    const db::Rows& tr = rs[0];
    const db::Rows& kr = rs[1];
    for (const auto& [id, x] : fold.tenants) customers->push_back({id, x.name, true});
    // A provider chain not replayable to its head names only some tenants: trust the table for
    // the rest rather than call every later tenant's rows extra.
    for (int i = 0; i < tr.size(); ++i)
      if (tr.Get(i, 0) != kProviderTenant && !fold.tenants.count(tr.Get(i, 0)))
        customers->push_back({tr.Get(i, 0), tr.Get(i, 1), !readable});
    if (!compare) return Status::Ok();

    Differ d(diffs, "tenants", TenantRef{kProviderTenant, "provider"});
    std::map<std::string, TenantRow> expected = fold.tenants;
    expected[kProviderTenant] = TenantRow{"provider", 0};  // `oml init`, with the genesis at seq 1
    for (int i = 0; i < tr.size(); ++i) {
      ++*rows;
      const std::string id = tr.Get(i, 0);
      auto it = expected.find(id);
      if (it == expected.end()) {
        d.For(id, tr.Get(i, 1));
        d.Extra(id);
        continue;
      }
      const TenantRow& x = it->second;
      const int64_t seq = x.created_seq ? x.created_seq : 1;
      d.For(id, x.name);
      d.Compare(id, "name", x.name, tr.Get(i, 1), seq);
      d.Compare(id, "created_seq", SeqText(x.created_seq), tr.IsNull(i, 2) ? "NULL" : SeqText(tr.GetInt(i, 2)), seq);
      expected.erase(it);
    }
    for (const auto& [id, x] : expected) {
      d.For(id, x.name);
      d.Missing(id, x.created_seq ? x.created_seq : 1);
    }

    Differ k(diffs, "signing_keys", TenantRef{kProviderTenant, "provider"});
    for (int i = 0; i < kr.size(); ++i) {
      ++*rows;
      const std::string id = kr.Get(i, 0);
      auto it = fold.signing_keys.find(id);
      if (it == fold.signing_keys.end()) {
        k.Extra(id);
        continue;
      }
      const SigningKeyRow& x = it->second;
      const int64_t rseq = x.retired_by ? x.retired_by : x.issued_seq;
      k.Compare(id, "public_key", crypto::Base64(x.public_key), crypto::Base64(kr.GetBytes(i, 1)), x.issued_seq);
      k.Compare(id, "issued_seq", SeqText(x.issued_seq), SeqText(kr.GetInt(i, 2)), x.issued_seq);
      k.Compare(id, "retired_at", SetText(x.retired_by != 0), SetText(kr.GetInt(i, 3) != 0), rseq);
      fold.signing_keys.erase(it);
    }
    for (const auto& [id, x] : fold.signing_keys) k.Missing(id, x.issued_seq);
    return Status::Ok();
  }

  db::Pool& pool_;
  WorkPool& checks_;
  const FoldOptions opts_;
  const int page_;
  std::mutex mu_;       // guards report_ while tasks run
  FoldReport report_;
};

}  // namespace

std::string FormatFoldDiff(const FoldDiff& d) {
  std::string line = "FOLD " + d.table + " tenant " + d.tenant_name + " " + d.key + ": ";
  switch (d.kind) {
    case FoldDiffKind::kChanged:
      return line + d.column + " expected " + d.expected + ", found " + d.actual + " (seq " + std::to_string(d.seq) + ")";
    case FoldDiffKind::kMissing:
      return line + "missing row (seq " + std::to_string(d.seq) + ")";
    case FoldDiffKind::kExtra:
      return line + "extra row (no event)";
    case FoldDiffKind::kUnreadable:
      return line + "cannot recompute the folds: " + d.expected;
  }
  return line;
}

Result<FoldReport> VerifyFolds(db::Pool& pool, WorkPool& checks, const FoldOptions& opts) {
  FoldVerifier v(pool, checks, opts);
  return v.Run();
}

}  // namespace oml::journal
