#include "journal/merkle_edge.h"

#include <optional>
#include <vector>

#include "common/log.h"
#include "common/sync_point.h"
#include "journal/event.h"

namespace oml::journal {
namespace {

constexpr int64_t kBatch = 10000;  // journal rows per read

// Appends the chain's events (tree->size(), upto] to `tree`. Stops early (kAborted) once *stop.
Status AppendFromJournal(db::Conn& conn, const std::string& tenant, int64_t upto_seq, merkle::CompactRange* tree,
                         bool scoped, const std::atomic<bool>* stop = nullptr) {
  while (static_cast<int64_t>(tree->size()) < upto_seq) {
    if (stop != nullptr && stop->load()) return Status(Code::kAborted, "stopping", "stopping");
    const int64_t from = static_cast<int64_t>(tree->size());
    db::Stmt q{"SELECT seq, signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq > $2 AND seq <= $3 "
               "ORDER BY seq LIMIT $4",
               {db::Text(tenant), db::Int(from), db::Int(upto_seq), db::Int(kBatch)},
               "oml_tree_from_journal"};
    OML_ASSIGN_OR_RETURN(db::Rows r, scoped ? conn.Scoped(tenant, q) : conn.Query(q.sql, q.params));
    if (r.size() == 0)
      return Status(Code::kDataLoss, "chain " + tenant + " has no event at seq " + std::to_string(from + 1), "integrity");
    for (int i = 0; i < r.size(); ++i) {
      const int64_t seq = r.GetInt(i, 0);
      if (seq != static_cast<int64_t>(tree->size()) + 1)
        return Status(Code::kDataLoss,
                      "chain " + tenant + " has no event at seq " + std::to_string(tree->size() + 1), "integrity");
      tree->Append(merkle::HashLeaf(r.GetBytes(i, 1)));
    }
  }
  return Status::Ok();
}

// Builds one chain's edge: the leaves it covers, or 0 if the chain had one meanwhile (or has none).
Result<int64_t> BuildTree(db::Pool& pool, const std::string& tenant, const std::atomic<bool>* stop) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool.Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows head, conn->Scoped(tenant, {"SELECT seq FROM oml.chain_heads WHERE tenant_id = $1",
                                                            {db::Text(tenant)}}));
  if (head.size() == 0) return int64_t{0};
  // Without the lock: the events up to the head seen now (they never change).
  merkle::CompactRange tree;
  OML_RETURN_IF_ERROR(AppendFromJournal(*conn, tenant, head.GetInt(0, 0), &tree, /*scoped=*/true, stop));
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("journal.tree_build.before_lock"));  // tests: an append lands here
  // Under the chain's lock (as an append takes it): what was appended meanwhile, then the edge.
  OML_RETURN_IF_ERROR(conn->Exec("BEGIN ISOLATION LEVEL READ COMMITTED").status());
  struct Rollback {
    db::Conn& c;
    bool done = false;
    ~Rollback() {
      if (!done) (void)c.Exec("ROLLBACK");
    }
  } rollback{*conn};
  OML_ASSIGN_OR_RETURN(std::vector<db::Rows> locked,
                       conn->Pipeline({db::ScopeTo(tenant),
                                       {"SELECT head_seq FROM oml.lock_head($1::uuid)", {db::Text(tenant)}},
                                       {"SELECT tree_edge IS NULL FROM oml.chain_heads WHERE tenant_id = $1",
                                        {db::Text(tenant)}}}));
  if (locked[2].size() == 0 || locked[2].Get(0, 0) != "t") return int64_t{0};  // built meanwhile
  // A head behind what was read (a restore or a cut tail meanwhile): no edge from this read.
  if (locked[1].GetInt(0, 0) < static_cast<int64_t>(tree.size())) return int64_t{0};
  OML_RETURN_IF_ERROR(AppendFromJournal(*conn, tenant, locked[1].GetInt(0, 0), &tree, /*scoped=*/false));
  OML_RETURN_IF_ERROR(conn->Query("UPDATE oml.chain_heads SET tree_size = $2, tree_edge = $3 WHERE tenant_id = $1",
                                  {db::Text(tenant), db::Int(static_cast<int64_t>(tree.size())),
                                   db::Bytes(tree.Encode())})
                          .status());
  OML_RETURN_IF_ERROR(conn->Exec("COMMIT").status());
  rollback.done = true;
  return static_cast<int64_t>(tree.size());
}

}  // namespace

Result<merkle::CompactRange> TreeFromJournal(db::Conn& conn, const std::string& tenant, int64_t upto_seq) {
  merkle::CompactRange tree;
  OML_RETURN_IF_ERROR(AppendFromJournal(conn, tenant, upto_seq, &tree, /*scoped=*/true));
  return tree;
}

Result<std::optional<merkle::CompactRange>> StoredTree(db::Conn& conn, const std::string& tenant) {
  OML_ASSIGN_OR_RETURN(db::Rows r, conn.Scoped(tenant, {"SELECT tree_size, tree_edge FROM oml.chain_heads WHERE "
                                                        "tenant_id = $1 AND tree_edge IS NOT NULL",
                                                        {db::Text(tenant)}}));
  if (r.size() == 0) return std::optional<merkle::CompactRange>();
  auto tree = merkle::CompactRange::Decode(static_cast<uint64_t>(r.GetInt(0, 0)), r.GetBytes(0, 1));
  if (!tree.ok())
    return Status(Code::kDataLoss, "chain " + tenant + ": the stored Merkle edge is malformed: " + tree.status().message(),
                  "integrity");
  return std::optional<merkle::CompactRange>(std::move(tree).value());
}

Result<TreeBuildReport> BuildMissingTrees(db::Pool& pool, const std::atomic<bool>* stop) {
  std::vector<std::string> tenants;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool.Acquire());
    // The provider scope lists every tenant (tenants_scope); each chain is then read in its own.
    OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(kProviderTenant, {"SELECT tenant_id::text FROM oml.tenants "
                                                                    "ORDER BY tenant_id", {}}));
    for (int i = 0; i < r.size(); ++i) tenants.push_back(r.Get(i, 0));
  }
  TreeBuildReport rep;
  Status first_error;
  for (const std::string& t : tenants) {
    if (stop != nullptr && stop->load()) break;
    bool missing = false;
    {
      OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool.Acquire());
      OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(t, {"SELECT 1 FROM oml.chain_heads WHERE tenant_id = $1 AND "
                                                        "tree_edge IS NULL",
                                                        {db::Text(t)}}));
      missing = r.size() > 0;
    }
    if (!missing) continue;
    // One chain's failure (a gap in its seqs, a database error) is logged and counted; the
    // chains after it are still built.
    Result<int64_t> leaves = BuildTree(pool, t, stop);
    if (!leaves.ok()) {
      if (leaves.status().type() == "stopping") break;
      ++rep.failed;
      log::Warn("Merkle trees: a chain's edge could not be built", {{"tenant", t}, {"error", leaves.status().ToString()}});
      if (first_error.ok()) first_error = leaves.status();
      continue;
    }
    if (*leaves > 0) {
      ++rep.chains;
      rep.leaves += *leaves;
    }
  }
  if (!first_error.ok())
    return Status(first_error.code(), std::to_string(rep.failed) + " chain(s) without an edge; the first: " +
                                          first_error.message(), first_error.type());
  return rep;
}

TreeBuilder::TreeBuilder(db::Pool* pool, std::chrono::milliseconds interval)
    : pool_(pool), thread_(interval, [this] { BuildOnce(); }, /*run_at_start=*/true) {}

TreeBuilder::~TreeBuilder() { stop_ = true; }  // then thread_ joins: a build stops at its next batch

void TreeBuilder::BuildOnce() {
  auto r = BuildMissingTrees(*pool_, &stop_);
  if (!r.ok()) {
    log::Warn("Merkle trees: some chains have no edge yet (retried next interval)", {{"error", r.status().ToString()}});
  } else if (r->chains > 0) {
    log::Info("Merkle trees built from the journal", {{"chains", r->chains}, {"events", r->leaves}});
  }
}

}  // namespace oml::journal
