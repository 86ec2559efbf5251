#include "journal/verify.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "common/log.h"
#include "common/sync_point.h"
#include "common/work_pool.h"
#include "crypto/crypto.h"
#include "journal/event.h"
#include "journal/heads.h"
#include "journal/provider.h"
#include "journal/tlog_store.h"
#include "merkle/merkle.h"
#include "tlog/checkpoint.h"
#include "tlog/note.h"

namespace oml::journal {
namespace {

// Rows per fetch by default, and rows per task on the check pool (~4 ms of work: small enough
// that one long chain spreads over every core, large enough that queueing costs nothing).
constexpr int kDefaultPage = 4096;
constexpr size_t kChunk = 32;

// The journal columns a Row holds, in its order (the page statements ask for them in binary).
#define OML_VERIFY_ROW_COLUMNS "seq, prev_hash, event_hash, event_type, key_id, signed_bytes, signature"

using Row = ChainRow;

struct KeyInfo {
  crypto::PublicKey public_key;
  int64_t issued_seq = 0;
  int64_t issued_us = 0;
  int64_t retired_us = INT64_MAX;
  int64_t retired_seq = 0;                        // provider seq of the key.issued that retired it
  std::map<std::string, int64_t> retired_heads;   // tenant -> last seq this key may have signed
  std::map<std::string, int64_t> issued_heads;    // tenant -> last seq before this key may sign
};

struct Created {
  int64_t seq = 0;
  std::string event_hash;
  std::string name;
};

// "YYYY-MM-DDTHH:MM:SS.ffffffZ" -> microseconds since the epoch; -1 if malformed.
int64_t ParseTime(const std::string& s) {
  std::tm tm{};
  int us = 0;
  if (s.size() != 27 || s[26] != 'Z') return -1;
  if (sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%6d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
             &tm.tm_sec, &us) != 7)
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&tm)) * 1000000 + us;
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Per-row checks that need no neighbour: hash, and a canonical envelope agreeing with the row.
// Returns the parsed envelope through *env.
Status CheckRow(const std::string& tenant, const Row& r, Envelope* env) {
  if (crypto::Sha256(r.signed_bytes) != r.event_hash) return DataLoss("event_hash is not SHA-256 of the signed bytes");
  OML_ASSIGN_OR_RETURN(*env, Envelope::FromSignedBytes(r.signed_bytes));
  if (env->tenant != tenant) return DataLoss("signed envelope names tenant " + env->tenant);
  if (env->seq != r.seq) return DataLoss("signed envelope has seq " + std::to_string(env->seq));
  if (env->prev_hash != r.prev_hash) return DataLoss("signed prev differs from the row's prev_hash");
  if (env->type != r.type) return DataLoss("signed type differs from the row's event_type");
  if (env->key_id != r.key_id) return DataLoss("signed key_id differs from the row's key_id");
  return Status::Ok();
}

// The chains in PostgreSQL: oml.journal, oml.chain_heads and oml.tenants, all read in one
// exported REPEATABLE READ snapshot (held open until the source is destroyed).
class PgChainSource final : public ChainSource {
 public:
  explicit PgChainSource(db::Pool& pool) : pool_(pool) {}

  // Opens the transaction whose snapshot every read shares (held until the Verifier ends).
  Status Open() override {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_.Acquire());
    OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline({{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", {}},
                                               {"SELECT pg_export_snapshot()", {}}}));
    snapshot_id_ = rs[1].Get(0, 0);
    snapshot_conn_.emplace(std::move(c));
    return Status::Ok();
  }

  // Runs `stmts` scoped to `tenant` in the exported snapshot, in one round trip; their rows.
  Result<std::vector<db::Rows>> InSnapshot(const std::string& tenant, std::vector<db::Stmt> stmts) {
    std::vector<db::Stmt> all = {{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", {}},
                                 {"SET TRANSACTION SNAPSHOT '" + snapshot_id_ + "'", {}},
                                 db::ScopeTo(tenant)};
    for (auto& st : stmts) all.push_back(std::move(st));
    all.push_back({"COMMIT", {}});
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_.Acquire());
    OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline(all));
    return std::vector<db::Rows>(std::make_move_iterator(rs.begin() + 3), std::make_move_iterator(rs.end() - 1));
  }

  // The tenants table as ListTenants orders it (provider first), in the snapshot.
  Result<std::vector<TenantInfo>> Tenants() override {
    OML_ASSIGN_OR_RETURN(auto rs, InSnapshot(kProviderTenant, {{"SELECT tenant_id, name FROM oml.tenants "
                                                                "ORDER BY created_seq NULLS FIRST, name",
                                                                {}}}));
    std::vector<TenantInfo> out;
    for (int i = 0; i < rs[0].size(); ++i) out.push_back({rs[0].Get(i, 0), rs[0].Get(i, 1)});
    return out;
  }

  Result<ChainHead> Head(const std::string& tenant) override {
    OML_ASSIGN_OR_RETURN(auto rs, InSnapshot(tenant, {{"SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = $1",
                                                       {db::Text(tenant)}}}));
    const db::Rows& r = rs[0];
    if (r.size() == 0) return ChainHead{};
    return ChainHead{r.GetInt(0, 0), r.GetBytes(0, 1)};
  }

  // Page statements ask for binary results: bytea arrives raw instead of hex (half the bytes, and
  // neither side spends CPU on hex).
  static std::vector<Row> ToRows(const db::Rows& r) {
    std::vector<Row> rows;
    rows.reserve(r.size());
    for (int i = 0; i < r.size(); ++i)
      rows.push_back({r.GetInt(i, 0), r.GetBytes(i, 1), r.GetBytes(i, 2), r.Get(i, 3), r.Get(i, 4), r.GetBytes(i, 5), r.GetBytes(i, 6)});
    return rows;
  }

  // The head and the first page up to it, in one round trip (most chains fit in one page).
  // `hash_seq` > 0: also the stored event_hash at that seq (the published head's, read in the
  // same round trip).
  Result<FirstPage> HeadAndFirstPage(const std::string& tenant, int64_t hash_seq, int limit) override {
    OML_ASSIGN_OR_RETURN(
        auto rs, InSnapshot(tenant, {
                              {"SELECT (SELECT event_hash FROM oml.journal WHERE tenant_id = $1 AND seq = $2)",
                               {db::Text(tenant), db::Int(hash_seq)}, "verify_hash_at", true},
                              {"SELECT seq, event_hash, tree_size, tree_edge FROM oml.chain_heads WHERE tenant_id = $1",
                               {db::Text(tenant)}, "verify_head", true},
                              {"SELECT " OML_VERIFY_ROW_COLUMNS " "
                               "FROM oml.journal WHERE tenant_id = $1 AND seq <= "
                               "(SELECT seq FROM oml.chain_heads WHERE tenant_id = $1) ORDER BY seq LIMIT $2",
                               {db::Text(tenant), db::Int(limit)}, "verify_first_page", true},
                              // Rows above the head (same snapshot: a commit moves both at once).
                              {"SELECT coalesce(min(seq), 0) FROM oml.journal WHERE tenant_id = $1 AND seq > "
                               "coalesce((SELECT seq FROM oml.chain_heads WHERE tenant_id = $1), 0)",
                               {db::Text(tenant)}, "verify_above_head", true}}));
    ChainHead head;
    if (rs[1].size() > 0) {
      head.seq = rs[1].GetInt(0, 0);
      head.event_hash = rs[1].GetBytes(0, 1);
      if (!rs[1].IsNull(0, 2)) {
        head.tree_size = rs[1].GetInt(0, 2);
        head.tree_edge = rs[1].GetBytes(0, 3);
      }
    }
    FirstPage out;
    out.hash_at = rs[0].IsNull(0, 0) ? std::string() : rs[0].GetBytes(0, 0);
    out.head = head;
    out.rows = ToRows(rs[2]);
    out.above_head = rs[3].GetInt(0, 0);
    return out;
  }

  Result<std::vector<Row>> Page(const std::string& tenant, int64_t after, int64_t upto, int limit) override {
    OML_ASSIGN_OR_RETURN(
        auto rs, InSnapshot(tenant, {{"SELECT " OML_VERIFY_ROW_COLUMNS " "
                                      "FROM oml.journal WHERE tenant_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4",
                                      {db::Text(tenant), db::Int(after), db::Int(upto), db::Int(limit)}, "verify_page", true}}));
    return ToRows(rs[0]);
  }

  // The provider chain's first key.issued row (none if there is none).
  Result<std::vector<Row>> FirstKeyIssued(const std::string& tenant) override {
    OML_ASSIGN_OR_RETURN(
        auto rs, InSnapshot(tenant, {{"SELECT " OML_VERIFY_ROW_COLUMNS " "
                                      "FROM oml.journal WHERE tenant_id = $1 AND event_type = 'key.issued' ORDER BY seq LIMIT 1",
                                      {db::Text(tenant)}, "", true}}));
    return ToRows(rs[0]);
  }

  std::string MissingChain(bool registered) const override {
    return registered ? "chain has no genesis event (no chain head)"
                      : "chain has no genesis event (no chain head), and its tenants row is missing: the tenant was "
                        "deleted";
  }

 private:
  db::Pool& pool_;
  std::string snapshot_id_;                        // pg_export_snapshot() of snapshot_conn_
  std::optional<db::Pool::Handle> snapshot_conn_;  // holds the snapshot open (rolled back at the end)
};

class Verifier {
 public:
  Verifier(ChainSource& source, const VerifyOptions& opts) : src_(source), opts_(opts) {
    threads_ = opts.threads > 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
    page_ = opts.page_rows > 0 ? opts.page_rows : kDefaultPage;
  }

  Result<VerifyReport> Run() {
    if (opts_.checks != nullptr) {
      checks_ = opts_.checks;
    } else {
      owned_checks_ = std::make_unique<WorkPool>(threads_);
      checks_ = owned_checks_.get();
    }
    // The heads store is read first, then one snapshot is exported and every chain is read in
    // it: heads are published after their commit, so each one read here is covered by the
    // snapshot, and a tenant created or a key rotated while verify runs is simply not seen.
    if (opts_.heads) OML_RETURN_IF_ERROR(ReadHeadsStore());
    OML_RETURN_IF_ERROR(src_.Open());
    OML_ASSIGN_OR_RETURN(auto tenants, src_.Tenants());
    if (tenants.empty() || tenants[0].tenant_id != kProviderTenant)
      return FailedPrecondition("no provider chain: run `oml init` first");
    // The provider chain is always read first and always reported: it defines the keys and the
    // tenants every other chain hangs on.
    OML_RETURN_IF_ERROR(VerifyProvider(tenants[0]));
    OML_RETURN_IF_ERROR(OML_SYNC_POINT("verify.after_provider"));  // tests commit a rotation here
    // The chains to walk: every tenant.created (in provider seq order), then any tenants row
    // without one (its genesis check reports it).
    std::vector<TenantInfo> all;
    for (const auto& id : created_order_) all.push_back({id, created_[id].name});
    std::map<std::string, bool> in_table;
    for (const auto& t : tenants) {
      in_table[t.tenant_id] = true;
      if (t.tenant_id != kProviderTenant && !created_.count(t.tenant_id)) all.push_back(t);
    }
    for (const auto& t : all)
      if (!in_table.count(t.tenant_id)) missing_row_[t.tenant_id] = true;
    std::vector<TenantInfo> rest;
    for (const auto& t : all)
      if (opts_.only_tenant.empty() || t.name == opts_.only_tenant || t.tenant_id == opts_.only_tenant) rest.push_back(t);
    const bool provider_only = !opts_.only_tenant.empty() &&
                               (opts_.only_tenant == kProviderTenant || opts_.only_tenant == tenants[0].name);
    if (rest.empty() && !provider_only) return NotFound("no tenant '" + opts_.only_tenant + "'", "tenant-not-found");
    report_.tenants = static_cast<int64_t>(rest.size()) + 1;
    if (opts_.heads) OML_RETURN_IF_ERROR(CheckHeadsStore(all, rest));
    // Progress counts events when there are few chains (one head read each), tenants otherwise.
    by_tenants_ = rest.size() > 16;
    if (by_tenants_) {
      total_ = static_cast<int64_t>(rest.size());
    } else {
      for (const auto& t : rest) {
        OML_ASSIGN_OR_RETURN(auto h, src_.Head(t.tenant_id));
        total_ += h.seq;
      }
    }
    // Walkers fetch pages and link rows in seq order; the per-row checks (hash, canonical
    // envelope, signature), which are nearly all the CPU, go to one pool with a thread per core.
    // Walkers spend most of their time waiting on the database or on the pool, so twice as many
    // walkers as cores keep the pool's queue full, and a chain with most of the events is still
    // checked on every core.
    const int workers = std::max(1, std::min<int>(static_cast<int>(rest.size()), 2 * threads_));
    std::atomic<size_t> next{0};
    std::vector<Status> errors(workers);
    auto worker = [&](int w) {
      for (size_t i = next++; i < rest.size(); i = next++) {
        Status s = VerifyTenant(rest[i]);
        if (!s.ok()) {
          errors[w] = s;
          return;
        }
        if (by_tenants_) Progress(0, 1);
      }
    };
    std::vector<std::thread> ts;
    for (int w = 1; w < workers; ++w) ts.emplace_back(worker, w);
    worker(0);
    for (auto& t : ts) t.join();
    for (const auto& e : errors) OML_RETURN_IF_ERROR(e);
    std::sort(report_.problems.begin(), report_.problems.end(),
              [](const VerifyProblem& a, const VerifyProblem& b) { return a.tenant_name < b.tenant_name; });
    return report_;
  }

 private:
  // One GET per key: several in flight at once (the store is thread-safe, and the time is mostly
  // waiting), so a thousand chains cost about a tenth of the sequential time. The first error, or
  // each object (nullopt: absent), in the keys' order.
  Result<std::vector<std::optional<std::string>>> GetAll(const std::vector<std::string>& keys) {
    std::vector<Result<std::optional<std::string>>> got(keys.size(), std::optional<std::string>());
    std::atomic<size_t> next{0};
    auto fetch = [&] {
      for (size_t i = next++; i < keys.size(); i = next++) got[i] = opts_.heads->Get(keys[i]);
    };
    std::vector<std::thread> fetchers;
    for (int f = 1; f < std::min<int>(8, static_cast<int>(keys.size())); ++f) fetchers.emplace_back(fetch);
    fetch();
    for (auto& f : fetchers) f.join();
    std::vector<std::optional<std::string>> out;
    out.reserve(keys.size());
    for (auto& g : got) {
      if (!g.ok()) return g.status();
      out.push_back(std::move(*g));
    }
    return out;
  }

  // Every published head document and every replaced one, before the snapshot.
  Status ReadHeadsStore() {
    OML_ASSIGN_OR_RETURN(auto keys, opts_.heads->List("oml-heads/"));
    OML_ASSIGN_OR_RETURN(auto heads, GetAll(keys));
    for (size_t i = 0; i < keys.size(); ++i)
      if (heads[i]) published_[keys[i].substr(std::string("oml-heads/").size())] = std::move(*heads[i]);
    // Each chain's published checkpoint, also before the snapshot (it is put after its commit).
    if (opts_.checkpoints && !src_.IsPrefix()) {
      std::vector<std::string> tenants, cp_keys;
      for (const auto& [tenant, unused] : published_) {
        tenants.push_back(tenant);
        cp_keys.push_back(TlogPrefix(tenant) + "checkpoint");
      }
      OML_ASSIGN_OR_RETURN(auto cps, GetAll(cp_keys));
      for (size_t i = 0; i < tenants.size(); ++i)
        if (cps[i]) checkpoints_[tenants[i]] = std::move(*cps[i]);
    }
    OML_ASSIGN_OR_RETURN(replaced_, opts_.heads->List(kInvalidHeadsPrefix));
    return Status::Ok();
  }

  // The published head document of `tenant`, checked against the verified key chain: nullopt if
  // none is published, kDataLoss if the document does not verify. REQUIRES: keys_ holds every
  // key the document may be signed by (for the provider chain: after its walk).
  // A published head document parsed in full (size, shape, canonical form) with its signature
  // kept aside: the signature is checked only when the document would be a finding (verifying
  // a head that agrees with the chain proves nothing more, and costs a signature per chain).
  struct PublishedHead {
    Status parse = Status::Ok();  // the document's own defects
    std::optional<SignedHead> head;
    std::string signed_message, signature;
  };
  PublishedHead ParsePublished(const std::string& tenant, const std::optional<std::string>& bytes) {
    PublishedHead p;
    if (!bytes) return p;
    auto h = DecodeSignedHeadWith(*bytes, [&p](const std::string&, const std::string& msg, const std::string& sig) {
      p.signed_message = msg;
      p.signature = sig;
      return HeadKeyVerdict::kValid;
    });
    if (!h.ok()) p.parse = h.status();
    else if (h->tenant != tenant) p.parse = DataLoss("published head names tenant " + h->tenant);
    else p.head = *h;
    return p;
  }
  // The signature of a parsed head, under the key chain verified here (REQUIRES: keys_ complete).
  Status CheckPublishedSignature(const PublishedHead& p) {
    auto it = keys_.find(p.head->key_id);
    if (it == keys_.end())
      return DataLoss("published head is signed by " + p.head->key_id + ", which the key chain does not hold");
    if (!it->second.public_key.Verify(p.signed_message, p.signature)) return DataLoss("published head signature does not verify");
    return Status::Ok();
  }

  // The heads store beyond each chain's own head: heads published for tenants no tenant.created
  // names (unless one tenant is selected), and replaced head documents kept for inspection (of
  // the selected tenants).
  Status CheckHeadsStore(const std::vector<TenantInfo>& all, const std::vector<TenantInfo>& selected) {
    std::map<std::string, std::string> names;
    for (const auto& t : all) names[t.tenant_id] = t.name;
    names[kProviderTenant] = "provider";
    if (opts_.only_tenant.empty()) {
      for (const auto& [id, bytes] : published_)
        if (!names.count(id))
          Problem({id, "(unknown)"}, 0, "a head is published for a tenant that no tenant.created on the provider chain names");
    }
    std::map<std::string, bool> wanted;
    for (const auto& t : selected) wanted[t.tenant_id] = true;
    for (const auto& k : replaced_) {
      const std::string rest = k.substr(kInvalidHeadsPrefix.size());
      const std::string id = rest.substr(0, rest.find('/'));
      if (!opts_.only_tenant.empty() && !wanted.count(id)) continue;
      Problem({id, names.count(id) ? names[id] : "(unknown)"}, 0,
              "a published head that did not verify was replaced; it is kept at " + k +
                  ": it may have been damaged to hide a cut tail. Inspect it, then delete it");
    }
    return Status::Ok();
  }

  void Problem(const TenantInfo& t, int64_t seq, const std::string& what) {
    std::lock_guard<std::mutex> l(mu_);
    report_.problems.push_back({t.tenant_id, t.name, seq, what});
  }

  // Thread-safe. events: verified now; tenants: finished now.
  void Progress(int64_t events, int64_t tenants) {
    std::lock_guard<std::mutex> l(mu_);
    report_.events += events;
    tenants_done_ += tenants;
    if (opts_.progress) opts_.progress(by_tenants_ ? tenants_done_ : report_.events, total_);
  }

  // Walks one tenant's rows page by page. check_sig(row, env) returns the signature verdict for
  // rows whose individual checks passed; it runs on the pool's threads, concurrently, so it may
  // only read shared state (keys_ is complete before any customer chain is walked). seq_hook
  // runs on this thread, in seq order. Stops at the first bad seq.
  template <typename SigCheck>
  Result<bool> Walk(const TenantInfo& t, SigCheck check_sig, std::function<Status(const Row&, const Envelope&)> seq_hook) {
    // The published head was read before the snapshot: it was published after its commit, so the
    // snapshot holds it unless the database lost it.
    std::optional<std::string> published_bytes;
    if (auto it = published_.find(t.tenant_id); it != published_.end()) published_bytes = it->second;
    // The head is read first (same snapshot as the first page) and the walk stops there: events
    // committed meanwhile are beyond it.
    // The published seq, read without trusting the document yet (it is verified after the walk),
    // so the stored hash there comes in the first round trip.
    // Parsed now so the stored hash at its seq comes in the first round trip; its signature is
    // checked after the walk (the provider chain's walk is what completes keys_), and only if
    // the document disagrees with the chain.
    const PublishedHead published_doc = ParsePublished(t.tenant_id, published_bytes);
    const int64_t published_seq = published_doc.head ? published_doc.head->seq : 0;
    OML_ASSIGN_OR_RETURN(ChainSource::FirstPage first, src_.HeadAndFirstPage(t.tenant_id, published_seq, page_));
    const auto head = first.head;
    if (head.seq == 0) {
      // A source that is a prefix of the journal (the lake) may end between a tenant.created and
      // the genesis committed with it, but only if the tenant.created is the provider chain's
      // last event there: any later provider event committed after that genesis.
      if (src_.IsPrefix() && created_.count(t.tenant_id) && created_[t.tenant_id].seq == provider_last_seq_) return true;
      Problem(t, 1, src_.MissingChain(!missing_row_.count(t.tenant_id)));
      return false;
    }
    int64_t expect = 1;
    std::string prev = kZeroHash;
    std::string prev_time;
    // The chain's Merkle tree as the walk links it, and its edge at the size the stored one
    // covers (a writer of the previous version may have left it behind the head).
    merkle::CompactRange tree;
    std::optional<std::string> edge_at_stored_size;
    // The checkpoints to compare (published, seen by an earlier run): the chain's root at each size.
    std::vector<CheckpointDoc> cps;
    if (auto it = checkpoints_.find(t.tenant_id); it != checkpoints_.end()) cps.push_back(ParseCheckpointDoc("published", it->second));
    // The seen one for every chain walked (a chain whose published documents were deleted too is
    // still held to what an earlier run saw).
    if (opts_.checkpoints && !src_.IsPrefix() && !opts_.seen_checkpoints_dir.empty()) {
      std::ifstream in(SeenPath(t.tenant_id), std::ios::binary);
      if (in) cps.push_back(ParseCheckpointDoc("seen", std::string(std::istreambuf_iterator<char>(in), {})));
    }
    std::map<uint64_t, std::string> root_at;
    for (const auto& c : cps)
      if (c.body) root_at[c.body->size];
    auto note_edge = [&] {
      if (head.tree_size && static_cast<int64_t>(tree.size()) == *head.tree_size) edge_at_stored_size = tree.Encode();
      if (auto it = root_at.find(tree.size()); it != root_at.end()) it->second = tree.Root();
    };
    note_edge();
    std::vector<Row> rows = std::move(first.rows);
    while (!rows.empty()) {
      // Queue this page's row checks, fetch the next page meanwhile, then link this page.
      std::vector<Status> st(rows.size());
      std::vector<Envelope> env(rows.size());
      std::vector<std::string> leaf(rows.size());  // RFC 9162 leaf hashes, computed with the checks
      WorkPool::Group group(*checks_);  // declared after what its tasks touch: destroyed (waited) first
      for (size_t begin = 0; begin < rows.size(); begin += kChunk) {
        group.Add([&, begin] {
          for (size_t i = begin; i < std::min(begin + kChunk, rows.size()); ++i) {
            if (!rows[i].defect.empty()) continue;  // reported as it is
            leaf[i] = merkle::HashLeaf(rows[i].signed_bytes);
            st[i] = CheckRow(t.tenant_id, rows[i], &env[i]);
            if (st[i].ok()) st[i] = src_.CheckRow(t.tenant_id, rows[i], env[i]);
            if (st[i].ok()) st[i] = check_sig(rows[i], env[i]);
          }
        });
      }
      // A short page is the last one: the query returns every row up to the head, page_ at most
      // (more only when a source holds duplicates of its last seq: they stay on one page).
      Result<std::vector<Row>> next = std::vector<Row>{};
      if (rows.size() >= static_cast<size_t>(page_) && rows.back().seq < head.seq)
        next = src_.Page(t.tenant_id, rows.back().seq, head.seq, page_);
      try {
        group.Wait();
      } catch (const std::exception& e) {  // a check threw (out of memory, say): no verdict
        return Internal(std::string("checking rows of tenant ") + t.tenant_id + ": " + e.what());
      }
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        if (r.seq < expect) {  // PostgreSQL's primary key forbids it; a lake can hold it
          Problem(t, r.seq, "seq " + std::to_string(r.seq) + " is stored more than once");
          return false;
        }
        if (r.seq != expect) {
          Problem(t, expect, "seq " + std::to_string(expect) + " is missing (next stored seq is " + std::to_string(r.seq) + ")");
          return false;
        }
        if (!r.defect.empty()) {
          Problem(t, r.seq, r.defect);
          return false;
        }
        if (r.prev_hash != prev) {
          Problem(t, r.seq, "prev_hash does not link to the hash of seq " + std::to_string(r.seq - 1));
          return false;
        }
        if (!st[i].ok()) {
          Problem(t, r.seq, st[i].message());
          return false;
        }
        if (env[i].time < prev_time) {
          Problem(t, r.seq, "time " + env[i].time + " is before the previous event's time " + prev_time);
          return false;
        }
        prev_time = env[i].time;
        if (seq_hook) {
          Status s;
          try {
            s = seq_hook(r, env[i]);
          } catch (const nlohmann::json::exception& e) {
            s = DataLoss(std::string("malformed payload: ") + e.what());
          }
          if (!s.ok()) {
            Problem(t, r.seq, s.message());
            return false;
          }
        }
        prev = r.event_hash;
        tree.Append(leaf[i]);
        note_edge();
        ++expect;
      }
      Progress(static_cast<int64_t>(rows.size()), 0);
      if (!next.ok()) return next.status();
      rows = std::move(next).value();
    }
    if (expect - 1 < head.seq) {
      Problem(t, expect, "seq " + std::to_string(expect) + " is missing (the chain head is at seq " +
                             std::to_string(head.seq) + ")");
      return false;
    }
    if (head.event_hash != prev) {
      Problem(t, head.seq, "the chain head's hash differs from the hash of seq " + std::to_string(head.seq));
      return false;
    }
    if (first.above_head > 0) {
      Problem(t, first.above_head, "journal row at seq " + std::to_string(first.above_head) +
                                       " is above the chain head (seq " + std::to_string(head.seq) + ")");
      return false;
    }
    // Decoded only now: the provider chain's walk is what completes keys_.
    if (!published_doc.parse.ok()) {
      Problem(t, 0, "the published head does not verify: " + published_doc.parse.message());
      return false;
    }
    if (published_doc.head) {
      const SignedHead& published = *published_doc.head;
      std::string what;
      int64_t at = 0;
      const int64_t published_us = ParseTime(published.published_at);
      const int64_t age_us = NowMicros() - published_us;
      if (head.seq < published.seq && src_.IsPrefix() &&
          (published_us < 0 || age_us <= std::chrono::microseconds(opts_.prefix_lag_grace).count())) {
        // A prefix of the journal (the lake) may lag a head published within the grace.
      } else if (head.seq < published.seq && src_.IsPrefix()) {
        at = head.seq + 1;
        what = "the lake's chain ends at seq " + std::to_string(head.seq) + " but its head was published at seq " +
               std::to_string(published.seq) + " " + std::to_string(age_us / 1000000) +
               " s ago (" + published.published_at + "): the lake lacks seq " + std::to_string(head.seq + 1) +
               " to " + std::to_string(published.seq) +
               " (lost lake commits, or a lake writer that stopped: see `oml status`)";
      } else if (head.seq < published.seq) {
        at = head.seq + 1;
        what = "the chain ends at seq " + std::to_string(head.seq) + " but its published head is at seq " +
               std::to_string(published.seq) + ": the database lost committed events";
      } else if (first.hash_at != published.event_hash) {
        at = published.seq;
        what = "the event at seq " + std::to_string(published.seq) + " differs from the published head (the chain diverged)";
      }
      if (!what.empty()) {
        // A finding only if the deployment's key chain signed the document.
        if (Status sig = CheckPublishedSignature(published_doc); !sig.ok()) {
          Problem(t, 0, "the published head does not verify: " + sig.message());
        } else {
          Problem(t, at, what);
        }
        return false;
      }
    }
    // After the published-head check: a chain that lost its tail is named as such, not by its
    // edge (which then covers more than the chain).
    if (head.tree_size) {
      // The stored edge must be the edge of this chain's tree at its size: a tampered or stale
      // edge would make every checkpoint and proof built on it wrong.
      if (*head.tree_size > head.seq) {
        Problem(t, head.seq, "the stored Merkle edge covers " + std::to_string(*head.tree_size) +
                                 " events, more than the chain's " + std::to_string(head.seq));
        return false;
      }
      if (!edge_at_stored_size || *edge_at_stored_size != head.tree_edge) {
        Problem(t, *head.tree_size, "the stored Merkle edge at size " + std::to_string(*head.tree_size) +
                                        " is not the edge of the chain's tree (its root would not be the chain's)");
        return false;
      }
    }
    if (!CheckCheckpoints(t, head.seq, cps, root_at)) return false;
    return true;
  }

  // A checkpoint document as read (published, or seen by an earlier run), parsed without
  // trusting it yet.
  struct CheckpointDoc {
    std::string which;  // "published" or "seen"
    std::string note;
    std::optional<tlog::Checkpoint> body;
    std::string error;  // why it does not parse
  };
  static CheckpointDoc ParseCheckpointDoc(std::string which, std::string note) {
    CheckpointDoc d{std::move(which), std::move(note), std::nullopt, ""};
    auto body = tlog::ParseCheckpointNote(d.note);
    if (body.ok()) {
      d.body = std::move(*body);
    } else {
      d.error = body.status().message();
    }
    return d;
  }

  // Where this deployment's seen checkpoints are kept: one directory per root key (deployments,
  // or re-inits, sharing a home never read each other's), one file per chain.
  std::string SeenDir() const {
    const std::string anchor =
        opts_.root_public_key.empty() ? "unanchored" : crypto::Hex(crypto::Sha256(opts_.root_public_key)).substr(0, 16);
    return opts_.seen_checkpoints_dir + "/" + anchor;
  }
  std::string SeenPath(const std::string& tenant) const { return SeenDir() + "/" + tenant; }

  // After the walk (keys_ complete): each checkpoint opens with a key of the key chain under its
  // own origin ("<any tlog_origin>/<tenant>"), covers no more than the chain, and has the chain's
  // root at its size; the published one is not behind the one seen before. A clean chain
  // records the larger of the two as seen.
  bool CheckCheckpoints(const TenantInfo& t, int64_t head_seq, const std::vector<CheckpointDoc>& cps,
                        const std::map<uint64_t, std::string>& root_at) {
    if (cps.empty()) return true;
    const CheckpointDoc* published = nullptr;
    const CheckpointDoc* seen = nullptr;
    for (const auto& c : cps) (c.which == "published" ? published : seen) = &c;
    const auto pair = [&](const CheckpointDoc& c) -> std::string {
      if (c.which != "seen" || !published || !published->body || !c.body) return "";
      return " (the first inconsistent pair: the checkpoint an earlier `oml verify` saw, size " +
             std::to_string(c.body->size) + ", and the published one, size " + std::to_string(published->body->size) + ")";
    };
    const std::string suffix = "/" + t.tenant_id;
    for (const auto& c : cps) {
      if (!c.body) {
        Problem(t, 0, "the " + c.which + " checkpoint does not verify: " + c.error);
        return false;
      }
      const std::string& origin = c.body->origin;
      if (origin.size() <= suffix.size() || origin.compare(origin.size() - suffix.size(), suffix.size(), suffix) != 0) {
        Problem(t, 0, "the " + c.which + " checkpoint's origin " + origin + " is not this chain's (<tlog_origin>" + suffix + ")");
        return false;
      }
      std::vector<tlog::NoteKey> keys;
      for (const auto& [id, k] : keys_) keys.push_back(tlog::MakeNoteKey(origin, k.public_key.raw()));
      if (auto opened = tlog::OpenNote(c.note, keys); !opened.ok()) {
        Problem(t, 0, "the " + c.which + " checkpoint does not verify: " + opened.status().message());
        return false;
      }
      if (c.body->size > static_cast<uint64_t>(head_seq)) {
        Problem(t, head_seq + 1, "the " + c.which + " checkpoint covers " + std::to_string(c.body->size) +
                                     " events but the chain ends at seq " + std::to_string(head_seq) +
                                     ": the database lost committed events" + pair(c));
        return false;
      }
      auto it = root_at.find(c.body->size);
      if (c.body->size > 0 && (it == root_at.end() || it->second != c.body->root)) {
        Problem(t, static_cast<int64_t>(c.body->size),
                "the " + c.which + " checkpoint at size " + std::to_string(c.body->size) +
                    " is not the chain's tree at that size (the chain diverged from what was signed)" + pair(c));
        return false;
      }
    }
    if (published && seen && published->body->size < seen->body->size) {
      Problem(t, 0, "the published checkpoint (size " + std::to_string(published->body->size) +
                        ") is behind the one an earlier `oml verify` saw (size " + std::to_string(seen->body->size) +
                        "): the published log was rolled back");
      return false;
    }
    if (published && !opts_.seen_checkpoints_dir.empty()) {
      // Recorded only after a clean pass, never moving back: the next run holds the chain to it.
      std::error_code ec;
      std::filesystem::create_directories(SeenDir(), ec);
      const std::string path = SeenPath(t.tenant_id);
      const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(
                                                    std::hash<std::thread::id>{}(std::this_thread::get_id()));
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << published->note;
      out.close();
      if (out) std::filesystem::rename(tmp, path, ec);
      if (!out || ec) {
        std::filesystem::remove(tmp, ec);
        log::Warn("verify: the seen checkpoint could not be recorded", {{"file", path}});
      }
    }
    return true;
  }

  Status VerifyProvider(const TenantInfo& t) {
    // Key timeline: the signature of seq s is checked against `current`, which a verified
    // key.issued at seq s replaces for s+1 onward. The first key.issued also covers seq 1.
    std::string current_id;
    int64_t first_key_seq = 0;  // seq of the first key.issued, once it parsed
    // Find the first key (by event type; the walk below checks it is signed and in place).
    OML_ASSIGN_OR_RETURN(std::vector<Row> first, src_.FirstKeyIssued(t.tenant_id));
    bool root_mismatch = false;
    if (!first.empty()) {
      const Row& r = first.front();
      auto env = Envelope::FromSignedBytes(r.signed_bytes);
      auto issued = env.ok() ? ParseKeyIssued(*env) : Result<IssuedKey>(env.status());
      if (issued.ok() && !opts_.root_public_key.empty() && issued->raw != opts_.root_public_key) {
        // The trust anchor: without it, whoever can rewrite the database could re-sign every
        // chain under a key of their own and still pass.
        Problem(t, r.seq, "the first key.issued is not the deployment's root key");  // always reported
        root_mismatch = true;
      } else if (issued.ok()) {  // otherwise the walk below reports this seq
        KeyInfo k;
        k.public_key = issued->key;
        k.issued_seq = r.seq;
        k.issued_us = ParseTime(env->time);
        current_id = issued->key_id;
        first_key_seq = r.seq;
        keys_[current_id] = k;
      }
    }
    std::string last_id = current_id;
    auto sig_ok = [&](const Row& r, const Envelope& e) -> Status { return Status::Ok(); };
    auto seq_hook = [&](const Row& r, const Envelope& e) -> Status {
      provider_last_seq_ = r.seq;
      if (r.seq == 1 && e.type != "chain.genesis") return DataLoss("seq 1 is " + e.type + ", not chain.genesis");
      // Sequential: signature under the key in force on the provider chain.
      auto it = keys_.find(last_id);
      if (it == keys_.end()) return DataLoss("no key.issued precedes this event");
      if (r.key_id != last_id) return DataLoss("signed by " + r.key_id + " but the key in force is " + last_id);
      if (!it->second.public_key.Verify(r.signed_bytes, r.signature))
        return DataLoss("signature does not verify under key " + last_id);
      if (e.type == "key.issued") {
        // The key-chain rule (provider.h): a rotation names the key it retires and each chain's
        // head at that moment, bound by the key it issues.
        const bool is_first = r.seq == first_key_seq;
        OML_ASSIGN_OR_RETURN(IssuedKey issued, CheckKeyIssued(e, is_first ? std::string() : last_id,
                                                              [&](const std::string& id) { return keys_.count(id) > 0; }));
        int64_t at = ParseTime(e.time);
        if (!is_first) {
          KeyInfo& old = keys_[last_id];
          old.retired_heads = std::move(issued.retired_heads);
          old.retired_us = at;
          old.retired_seq = r.seq;
          KeyInfo k;
          k.issued_heads = old.retired_heads;  // the new key signs only after them
          k.public_key = issued.key;
          k.issued_seq = r.seq;
          k.issued_us = at;
          keys_[issued.key_id] = k;
          last_id = issued.key_id;
        }
      } else if (e.type == "tenant.created") {
        const std::string id = e.payload.value("tenant_id", "");
        if (!created_.count(id)) created_order_.push_back(id);
        created_[id] = {r.seq, r.event_hash, e.payload.value("name", "")};
      }
      return Status::Ok();
    };
    if (root_mismatch) return Status::Ok();  // no key can be trusted: every tenant fails below
    OML_ASSIGN_OR_RETURN(bool ok, Walk(t, sig_ok, seq_hook));
    (void)ok;
    return Status::Ok();
  }

  Status VerifyTenant(const TenantInfo& t) {
    auto sig_ok = [&](const Row& r, const Envelope& e) -> Status {
      auto it = keys_.find(r.key_id);
      if (it == keys_.end()) return DataLoss("signed by " + r.key_id + ", which no key.issued on the provider chain issued");
      if (ParseTime(e.time) < 0) return DataLoss("malformed time " + e.time);
      const KeyInfo& k = it->second;
      // Key validity is ordered by seq, not by clocks: rotation is exclusive with appends, so the
      // heads it records are exactly where one key's events end and the next key's begin.
      if (auto h = k.issued_heads.find(t.tenant_id); h != k.issued_heads.end() && r.seq <= h->second)
        return DataLoss("signed by " + r.key_id + " before that key was issued: the rotation at provider seq " +
                        std::to_string(k.issued_seq) + " recorded this chain's head at seq " + std::to_string(h->second));
      if (k.retired_us != INT64_MAX) {
        auto h = k.retired_heads.find(t.tenant_id);
        const int64_t last = h == k.retired_heads.end() ? 0 : h->second;
        if (r.seq > last)
          return DataLoss("signed by " + r.key_id + " after that key was retired: the rotation at provider seq " +
                          std::to_string(k.retired_seq) + " recorded this chain's head at seq " + std::to_string(last));
      }
      if (!k.public_key.Verify(r.signed_bytes, r.signature))
        return DataLoss("signature does not verify under key " + r.key_id);
      return Status::Ok();
    };
    auto seq_hook = [&](const Row& r, const Envelope& e) -> Status {
      if (r.seq != 1) return Status::Ok();
      if (e.type != "chain.genesis") return DataLoss("seq 1 is " + e.type + ", not chain.genesis");
      auto it = created_.find(t.tenant_id);
      if (it == created_.end()) return DataLoss("no tenant.created for this tenant on the provider chain");
      const auto& p = e.refs.value("provider", nlohmann::json::object());
      if (p.value("tenant", "") != kProviderTenant || p.value("seq", int64_t{-1}) != it->second.seq ||
          p.value("event_hash", "") != crypto::Hex(it->second.event_hash))
        return DataLoss("genesis does not reference provider tenant.created at seq " + std::to_string(it->second.seq));
      return Status::Ok();
    };
    return Walk(t, sig_ok, seq_hook).status();
  }

  ChainSource& src_;
  VerifyOptions opts_;
  int threads_ = 1;
  int page_ = kDefaultPage;
  WorkPool* checks_ = nullptr;              // per-row checks for every walker
  std::map<std::string, std::string> published_;   // tenant -> head document, read before the snapshot
  std::map<std::string, std::string> checkpoints_;  // tenant -> published checkpoint, read before the snapshot
  std::vector<std::string> replaced_;              // kInvalidHeadsPrefix objects
  std::unique_ptr<WorkPool> owned_checks_;  // when the caller gave none
  bool by_tenants_ = false;
  int64_t tenants_done_ = 0;  // GUARDED_BY(mu_)
  std::mutex mu_;             // guards report_ and progress while workers run
  int64_t total_ = 0;
  VerifyReport report_;
  std::map<std::string, KeyInfo> keys_;
  std::map<std::string, Created> created_;       // tenant.created by tenant id
  std::vector<std::string> created_order_;        // tenant ids in provider seq order
  std::map<std::string, bool> missing_row_;       // tenant.created without a tenants row
  int64_t provider_last_seq_ = 0;                 // last provider seq walked (set before other chains)
};

}  // namespace

Result<VerifyReport> VerifyChains(ChainSource& source, const VerifyOptions& opts) {
  Verifier v(source, opts);
  return v.Run();
}

Result<VerifyReport> VerifyChains(db::Pool& pool, const VerifyOptions& opts) {
  PgChainSource source(pool);
  return VerifyChains(source, opts);
}

}  // namespace oml::journal
