#include "journal/folds.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "common/sync_point.h"
#include "crypto/crypto.h"
#include "journal/chain_fold.h"
#include "journal/event.h"
#include "journal/provider.h"

namespace oml::journal {
namespace {

constexpr int kDefaultPage = 4096;

std::string SeqText(int64_t seq) { return seq > 0 ? std::to_string(seq) : "NULL"; }
std::string SetText(bool set) { return set ? "non-NULL" : "NULL"; }
std::string OptText(const std::optional<std::string>& v) { return v ? *v : "NULL"; }
// A jsonb column's text as nlohmann::json::dump() writes it (the expected side is the signed
// member, dumped): key order and spacing are PostgreSQL's, not the signer's.
std::string JsonText(const std::string& jsonb) {
  nlohmann::json j = nlohmann::json::parse(jsonb, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? jsonb : j.dump();
}
std::string AttachmentKeyText(const AttachmentKey& k) {
  return std::get<0>(k) + " v" + std::to_string(std::get<1>(k)) + " attachment " + std::to_string(std::get<2>(k));
}
std::string ServedKeyText(const ServedKey& k) {
  return std::get<0>(k) + " v" + std::to_string(std::get<1>(k)) + " item " + std::to_string(std::get<2>(k)) +
         " reviewer " + std::get<3>(k);
}

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
      // review_progress before attachments: it is checked against fold.attachments, which
      // CompareAttachments consumes.
      OML_RETURN_IF_ERROR(CompareReviewProgress(*c, t, fold, &diffs, &rows));
      OML_RETURN_IF_ERROR(CompareAttachments(*c, t, fold, &diffs, &rows));
      OML_RETURN_IF_ERROR(CompareReviewServed(*c, t, fold, &diffs, &rows));
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
                       "demoted_seq, retracted_seq, reassigned_seq, body_review::text "
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
        auto review = fold.body_reviews.find(after);
        d.Compare(key, "body_review", review == fold.body_reviews.end() ? "NULL" : OptText(review->second),
                  r.IsNull(i, 20) ? "NULL" : JsonText(r.Get(i, 20)), s);
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

  Status CompareAttachments(db::Conn& c, const TenantRef& t, ChainFold& fold, std::vector<FoldDiff>* diffs,
                            int64_t* rows) {
    Differ d(diffs, "attachments", t);
    AttachmentKey after{"00000000-0000-0000-0000-000000000000", 0, 0};
    for (;;) {
      OML_ASSIGN_OR_RETURN(
          auto page,
          c.Pipeline({{"SELECT artifact_id::text, version, ordinal, upload_id::text, encode(plaintext_sha256, 'hex'), "
                       "encode(ciphertext_sha256, 'hex'), size_bytes, ciphertext_size, media_type, filename, object_key, "
                       "location, review::text, flagged::text, attach_seq FROM oml.attachments WHERE tenant_id = $1 AND "
                       "(artifact_id, version, ordinal) > ($2::uuid, $3::integer, $4::smallint) "
                       "ORDER BY artifact_id, version, ordinal LIMIT $5",
                       {db::Text(t.id), db::Text(std::get<0>(after)), db::Int(std::get<1>(after)),
                        db::Int(std::get<2>(after)), db::Int(page_)},
                       "folds_attachments", true}}));
      const db::Rows& r = page[0];
      for (int i = 0; i < r.size(); ++i) {
        ++*rows;
        after = {r.Get(i, 0), r.GetInt(i, 1), r.GetInt(i, 2)};
        const std::string key = AttachmentKeyText(after);
        auto it = fold.attachments.find(after);
        if (it == fold.attachments.end()) {
          d.Extra(key);
          continue;
        }
        const AttachmentRow& x = it->second;
        const int64_t s = x.attach_seq;
        d.Compare(key, "upload_id", x.upload_id, r.Get(i, 3), s);
        d.Compare(key, "plaintext_sha256", x.plaintext_sha256, r.Get(i, 4), s);
        d.Compare(key, "ciphertext_sha256", x.ciphertext_sha256, r.Get(i, 5), s);
        d.Compare(key, "size_bytes", std::to_string(x.size_bytes), std::to_string(r.GetInt(i, 6)), s);
        d.Compare(key, "ciphertext_size", std::to_string(x.ciphertext_size), std::to_string(r.GetInt(i, 7)), s);
        d.Compare(key, "media_type", x.media_type, r.Get(i, 8), s);
        d.Compare(key, "filename", OptText(x.filename), r.IsNull(i, 9) ? "NULL" : r.Get(i, 9), s);
        d.Compare(key, "object_key", x.object_key, r.Get(i, 10), s);
        d.Compare(key, "location", x.location, r.Get(i, 11), x.location_seq);
        d.Compare(key, "review", x.review, JsonText(r.Get(i, 12)), s);
        d.Compare(key, "flagged", x.flagged ? "true" : "false", r.Get(i, 13), s);
        d.Compare(key, "attach_seq", SeqText(x.attach_seq), SeqText(r.GetInt(i, 14)), s);
        fold.attachments.erase(it);
      }
      if (r.size() < page_) break;
    }
    for (const auto& [k, x] : fold.attachments) d.Missing(AttachmentKeyText(k), x.attach_seq);
    return Status::Ok();
  }

  Status CompareReviewServed(db::Conn& c, const TenantRef& t, ChainFold& fold, std::vector<FoldDiff>* diffs,
                             int64_t* rows) {
    Differ d(diffs, "review_served", t);
    ServedKey after{"00000000-0000-0000-0000-000000000000", 0, 0, ""};
    for (;;) {
      OML_ASSIGN_OR_RETURN(
          auto page,
          c.Pipeline({{"SELECT artifact_id::text, version, item, reviewer, served_seq FROM oml.review_served "
                       "WHERE tenant_id = $1 AND (artifact_id, version, item, reviewer) > "
                       "($2::uuid, $3::integer, $4::smallint, $5::text) ORDER BY artifact_id, version, item, reviewer "
                       "LIMIT $6",
                       {db::Text(t.id), db::Text(std::get<0>(after)), db::Int(std::get<1>(after)),
                        db::Int(std::get<2>(after)), db::Text(std::get<3>(after)), db::Int(page_)},
                       "folds_review_served", true}}));
      const db::Rows& r = page[0];
      for (int i = 0; i < r.size(); ++i) {
        ++*rows;
        after = {r.Get(i, 0), r.GetInt(i, 1), r.GetInt(i, 2), r.Get(i, 3)};
        const std::string key = ServedKeyText(after);
        auto it = fold.review_served.find(after);
        if (it == fold.review_served.end()) {
          d.Extra(key);
          continue;
        }
        d.Compare(key, "served_seq", SeqText(it->second), SeqText(r.GetInt(i, 4)), it->second);
        fold.review_served.erase(it);
      }
      if (r.size() < page_) break;
    }
    for (const auto& [k, seq] : fold.review_served) d.Missing(ServedKeyText(k), seq);
    return Status::Ok();
  }

  // review_progress is written by a reviewer's Range reads (Attachments::AdvanceProgress), with no
  // event: no event defines a row or its values (served_upto, covered). What the events do
  // determine is that a row names an attachment (its item is the ordinal of a submission.attach
  // of that claim version; the foreign key reaches only `artifacts`): any other row is extra.
  // Call before CompareAttachments, which consumes fold.attachments.
  Status CompareReviewProgress(db::Conn& c, const TenantRef& t, const ChainFold& fold, std::vector<FoldDiff>* diffs,
                               int64_t* rows) {
    Differ d(diffs, "review_progress", t);
    ServedKey after{"00000000-0000-0000-0000-000000000000", 0, 0, ""};
    for (;;) {
      OML_ASSIGN_OR_RETURN(
          auto page,
          c.Pipeline({{"SELECT artifact_id::text, version, item, reviewer FROM oml.review_progress "
                       "WHERE tenant_id = $1 AND (artifact_id, version, item, reviewer) > "
                       "($2::uuid, $3::integer, $4::smallint, $5::text) ORDER BY artifact_id, version, item, reviewer "
                       "LIMIT $6",
                       {db::Text(t.id), db::Text(std::get<0>(after)), db::Int(std::get<1>(after)),
                        db::Int(std::get<2>(after)), db::Text(std::get<3>(after)), db::Int(page_)},
                       "folds_review_progress", true}}));
      const db::Rows& r = page[0];
      for (int i = 0; i < r.size(); ++i) {
        ++*rows;
        after = {r.Get(i, 0), r.GetInt(i, 1), r.GetInt(i, 2), r.Get(i, 3)};
        if (!fold.attachments.count({std::get<0>(after), std::get<1>(after), std::get<2>(after)}))
          d.Extra(ServedKeyText(after));
      }
      if (r.size() < page_) break;
    }
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
