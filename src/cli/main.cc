// The `oml` command: one binary, one subcommand per operation (ARCHITECTURE.md "Components").
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <jemalloc/jemalloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "admission/claims.h"
#include "admission/kek_rotation.h"
#include "api/http.h"
#include "api/server.h"
#include "uploads/uploads.h"
#include "admission/attachments.h"
#include "admission/retention.h"
#include "review/review.h"
#include "blob/object_store.h"
#include "cli/claim_submit.h"
#include "cli/http_client.h"
#include "cli/exit_codes.h"
#include "common/config.h"
#include "common/log.h"
#include "common/periodic.h"
#include "common/metrics.h"
#include "common/secret_file.h"
#include "crypto/crypto.h"
#include "db/durability.h"
#include "db/local_cluster.h"
#include "db/migrate.h"
#include "journal/canonical_json.h"
#include "journal/folds.h"
#include "journal/heads.h"
#include "journal/journal.h"
#include "journal/merkle_edge.h"
#include "journal/tlog_store.h"
#include "tlog/checkpoint.h"
#include "tlog/note.h"
#include "tlog/witness.h"
#include "journal/provider.h"
#include "journal/verify.h"
#include "lake/verify_lake.h"
#include "lake/delta_tables.h"
#include "lake/dead_letter.h"
#include "lake/lakewriter.h"
#include "reconcile/reconcile.h"
#include "reconcile/repair.h"
#include "lake/lake_status.h"
#include "lake/rebuild.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace oml::cli {
namespace {

int Fail(const Status& s) {
  std::cerr << "oml: " << s.ToString() << "\n";
  return ExitCodeFor(s);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The file's bytes exactly (ReadFile trims the end), at most `max` of them: for documents whose
// last newline is part of them (a signed note, a tlog-proof).
Result<std::string> ReadExactFile(const std::string& path, size_t max) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::string s(max + 1, '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(in.gcount()));
  if (s.size() > max) return InvalidArgument(path + " is larger than " + std::to_string(max) + " bytes");
  return s;
}

std::string PgDir(const Config& c) { return c.home + "/pg"; }

// The application database URL: OML_DATABASE_URL, else the local cluster's app.url.
Result<std::string> AppUrl(const Config& c) {
  if (!c.database_url.empty()) return c.database_url;
  std::string f = PgDir(c) + "/app.url";
  if (fs::exists(f)) return ReadFile(f);
  return FailedPrecondition("no database: set OML_DATABASE_URL (or database_url in oml.toml), or run `oml dev`");
}

// The lake writer's database URL (role oml_lakewriter): OML_LAKEWRITER_DATABASE_URL, else the
// local cluster's lakewriter.url.
Result<std::string> LakewriterUrl(const Config& c) {
  if (!c.lakewriter_database_url.empty()) return c.lakewriter_database_url;
  std::string f = PgDir(c) + "/lakewriter.url";
  if (fs::exists(f)) return ReadFile(f);
  return FailedPrecondition(
      "no lake writer database: set OML_LAKEWRITER_DATABASE_URL (or lakewriter_database_url in oml.toml) to a URL "
      "of the oml_lakewriter role, or run `oml dev`");
}

// The reconciler's database URL (role oml_reconciler, sql/0023_reconciler.sql):
// OML_RECONCILER_DATABASE_URL, else the local cluster's reconciler.url.
[[maybe_unused]] Result<std::string> ReconcilerUrl(const Config& c) {
  if (!c.reconciler_database_url.empty()) return c.reconciler_database_url;
  std::string f = PgDir(c) + "/reconciler.url";
  if (fs::exists(f)) return ReadFile(f);
  return FailedPrecondition(
      "no reconciler database: set OML_RECONCILER_DATABASE_URL (or reconciler_database_url in oml.toml) to a URL "
      "of the oml_reconciler role, or run `oml dev`");
}

// The lake writer's signing key for materialize-skipped (lake/dead_letter.h): the deployment's
// signing key file. Without it the writer runs, but a poison row stops the stream instead of being
// dead-lettered (logged).
std::unique_ptr<crypto::SigningKey> LakeWriterKey(const Config& c) {
  auto k = crypto::SigningKey::LoadFile(c.signing_key_file, c.allow_insecure_key_files);
  if (!k.ok()) {
    log::Warn("lake writer: no signing key; poison rows cannot be dead-lettered",
              {{"file", c.signing_key_file}, {"error", k.status().ToString()}});
    return nullptr;
  }
  return std::make_unique<crypto::SigningKey>(std::move(k).value());
}

std::string PublicKeyFile(const Config& c) { return c.signing_key_file + ".pub"; }
// The deployment's first signing key, written once at first key generation and never replaced by
// rotation: `oml verify`'s trust anchor.
std::string RootKeyFile(const Config& c) { return c.signing_key_file + ".root.pub"; }

// Reads a public key file: JSON {"key_id", "public_key": base64} or one base64 line.
Result<std::string> ReadPublicKey(const std::string& path) {
  if (!fs::exists(path)) return NotFound("public key file " + path + " not found");
  std::string text = ReadFile(path);
  auto j = json::parse(text, nullptr, false);
  std::string b64 = text;
  if (!j.is_discarded() && j.is_object() && j.value("public_key", json()).is_string()) b64 = j["public_key"];
  auto pub = crypto::FromBase64(b64);
  if (!pub.ok() || pub->size() != 32) return InvalidArgument(path + " does not hold an Ed25519 public key");
  return *pub;
}

// {"key_id", "public_key" (base64)}: the format ReadPublicKey and verify-receipt read.
Status WritePublicKey(const std::string& path, const crypto::SigningKey& k) {
  // Public, but written whole (temp file, rename) like the secrets: never a truncated trust anchor.
  return WriteSecretFile(path, json{{"key_id", k.key_id()}, {"public_key", crypto::Base64(k.public_key())}}.dump() + "\n",
                         0644);
}

// Generates the signing key and KEK if missing (local profile and `oml init`).
Status EnsureKeys(const Config& c) {
  if (!fs::exists(c.signing_key_file)) {
    OML_ASSIGN_OR_RETURN(crypto::SigningKey k, crypto::SigningKey::Generate());
    OML_RETURN_IF_ERROR(k.SaveFile(c.signing_key_file));
    OML_RETURN_IF_ERROR(WritePublicKey(PublicKeyFile(c), k));
    if (!fs::exists(RootKeyFile(c))) OML_RETURN_IF_ERROR(WritePublicKey(RootKeyFile(c), k));
    log::Info("signing key generated", {{"file", c.signing_key_file}, {"key_id", k.key_id()}});
  }
  if (!fs::exists(c.kek_file)) {
    OML_RETURN_IF_ERROR(crypto::FileKekProvider::Generate(c.kek_file));
    log::Info("KEK generated", {{"file", c.kek_file}});
  }
  if (!fs::exists(c.cursor_secret_file)) {
    OML_RETURN_IF_ERROR(crypto::HmacKeyRing::GenerateFile(c.cursor_secret_file));
    log::Info("cursor secret generated", {{"file", c.cursor_secret_file}});
  }
  return Status::Ok();
}

// The cursor secret (cursor_secret_file, admission/cursor.h). Never made up here: replicas must
// share it, so a missing file stops `oml serve` with what to do.
Result<crypto::HmacKeyRing> LoadCursorKeys(const Config& c) {
  auto ring = crypto::HmacKeyRing::LoadFile(c.cursor_secret_file, c.allow_insecure_key_files);
  if (ring.status().code() == Code::kNotFound)
    return NotFound("cursor secret file " + c.cursor_secret_file +
                    " does not exist (setting cursor_secret_file, env OML_CURSOR_SECRET_FILE). Every replica needs "
                    "the same file: copy the deployment's, or create the first one with `oml cursor-secret generate " +
                    c.cursor_secret_file + "` (or `oml init`) and copy it to every replica "
                    "(docs/operations/deployment.md, \"Cursor secret\")");
  return ring;
}

// journal::WitnessPost over HTTP: POST <url>/add-checkpoint, one keep-alive client per witness
// (requests serialized: the publisher and the startup check are one thread each).
journal::WitnessPost MakeWitnessPost(std::chrono::milliseconds timeout) {
  struct Client {
    std::mutex mu;  // one request at a time on its connection
    std::unique_ptr<HttpClient> http;
  };
  struct Clients {
    std::mutex mu;  // guards the map only
    std::map<std::string, std::unique_ptr<Client>> by_url;
  };
  auto clients = std::make_shared<Clients>();
  return [clients, timeout](const journal::TlogWitness& w, const std::string& body) -> Result<journal::WitnessReply> {
    Client* client;
    {
      std::lock_guard<std::mutex> l(clients->mu);
      auto& slot = clients->by_url[w.url];
      if (!slot) slot = std::make_unique<Client>();
      client = slot.get();
    }
    const size_t slash = w.url.find('/', std::string("http://").size());
    const std::string base = slash == std::string::npos ? w.url : w.url.substr(0, slash);
    const std::string path = slash == std::string::npos ? "" : w.url.substr(slash);
    std::lock_guard<std::mutex> l(client->mu);
    if (!client->http) {
      OML_ASSIGN_OR_RETURN(ServerUrl server, ParseServerUrl(base));
      client->http = std::make_unique<HttpClient>(std::move(server), timeout);
    }
    OML_ASSIGN_OR_RETURN(HttpResponse r, client->http->Send("POST", path + "/add-checkpoint",
                                                            {{"Content-Type", "text/plain; charset=utf-8"}}, body));
    return journal::WitnessReply{r.status, r.Header("Content-Type").value_or(""), std::move(r.body)};
  };
}

// The witnesses of the configuration (settings tlog_witnesses, tlog_witness_quorum,
// tlog_witness_timeout_ms), with HTTP as the transport.
Result<journal::WitnessPolicy> WitnessPolicyOf(const Config& c) {
  journal::WitnessPolicy p;
  OML_ASSIGN_OR_RETURN(p.witnesses, journal::ParseTlogWitnesses(c.tlog_witnesses));
  OML_ASSIGN_OR_RETURN(p.quorum, journal::WitnessQuorum(c.tlog_witness_quorum, p.witnesses.size()));
  p.post = MakeWitnessPost(std::chrono::milliseconds(c.tlog_witness_timeout_ms));
  return p;
}

// Everything a command that talks to the database needs. Commands that append events also
// publish the signed heads of what they committed (flushed when the Runtime is destroyed).
struct Runtime {
  Config config;
  std::unique_ptr<db::Pool> pool;
  std::unique_ptr<crypto::SigningKey> key;
  std::unique_ptr<blob::ObjectStore> store;
  std::unique_ptr<journal::ChainGuard> guard;  // the write gate and the known heads (journal/chain_guard.h)
  std::unique_ptr<journal::Journal> journal;
  std::unique_ptr<journal::HeadPublisher> publisher;  // destroyed first: flushes pending heads
  std::string root_public_key;                        // empty: no root key file (warned)
  journal::TrustedKeys trusted;                       // the key chain anchored in root_public_key
  journal::WitnessPolicy witnesses;                   // tlog_witnesses (none: checkpoints published as signed)

  // acquire_timeout_ms > 0: a pool acquisition fails with 503 database-busy after that long
  // (`oml serve`); 0 waits (the CLI).
  static Result<std::unique_ptr<Runtime>> Open(const Config& c, bool need_key, int pool_size = 4, int acquire_timeout_ms = 0) {
    auto rt = std::make_unique<Runtime>();
    rt->config = c;
    OML_ASSIGN_OR_RETURN(rt->witnesses, WitnessPolicyOf(c));
    OML_ASSIGN_OR_RETURN(std::string url, AppUrl(c));
    db::Pool::Options po;
    po.size = pool_size;
    po.acquire_timeout = std::chrono::milliseconds(acquire_timeout_ms);
    rt->pool = std::make_unique<db::Pool>(url, po);
    {
      OML_ASSIGN_OR_RETURN(db::Pool::Handle h, rt->pool->Acquire());
      OML_RETURN_IF_ERROR(db::CheckSchemaVersion(*h));
    }
    if (need_key) {
      OML_ASSIGN_OR_RETURN(crypto::SigningKey k, crypto::SigningKey::LoadFile(c.signing_key_file, c.allow_insecure_key_files));
      rt->key = std::make_unique<crypto::SigningKey>(std::move(k));
      OML_ASSIGN_OR_RETURN(rt->store, blob::OpenObjectStore(c.object_store_url));
      OML_RETURN_IF_ERROR(rt->LoadKeyChain());
      rt->guard = std::make_unique<journal::ChainGuard>();
      rt->journal = std::make_unique<journal::Journal>(rt->pool.get(), rt->key.get());
      rt->journal->SetChainGuard(rt->guard.get());
      journal::TrustedKeys publisher_keys = rt->trusted;
      publisher_keys[rt->key->key_id()] = rt->key->public_key();  // its own heads
      rt->publisher = std::make_unique<journal::HeadPublisher>(rt->store.get(), rt->key.get(), c.head_publish_ms,
                                                               rt->pool.get(), rt->guard.get(), std::move(publisher_keys),
                                                               rt->root_public_key);
      rt->journal->SetCommitListener([p = rt->publisher.get()](const journal::Receipt& r) { p->OnCommit(r); });
      // What other replicas acknowledged reaches this one through their published heads: a tenant
      // written to has its published head read again at most once a second (or once a publish
      // interval), on the publisher's thread, so writes never wait for the object store.
      rt->guard->SetRefresher([p = rt->publisher.get()](const std::string& t) { p->RequestRefresh(t); },
                              std::chrono::milliseconds(std::max(1000, c.head_publish_ms)));
    }
    return rt;
  }

  // The root public key (keys/signing.key.root.pub) and the key chain anchored in it: what
  // published heads are checked against (never the signing_keys table).
  Status LoadKeyChain() {
    const std::string root_file = RootKeyFile(config);
    if (fs::exists(root_file)) {
      OML_ASSIGN_OR_RETURN(root_public_key, ReadPublicKey(root_file));
    } else {
      log::Warn("no root public key file; published heads are checked against the first key.issued in the database",
                {{"file", root_file}});
    }
    OML_ASSIGN_OR_RETURN(trusted, journal::LoadTrustedKeys(*pool, root_public_key));
    return Status::Ok();
  }

  // REQUIRES: LoadKeyChain. A process that signs must hold a key of the anchored key chain: its
  // heads are checked against that chain, and a partial chain must not be taken for the whole.
  Status RequireOwnKeyTrusted() const {
    auto it = trusted.find(key->key_id());
    if (it == trusted.end() || it->second != key->public_key())
      return FailedPrecondition("signing key " + key->key_id() +
                                    " is not in the key chain anchored in the root key (run `oml verify`)",
                                "signing-key-not-in-force");
    return Status::Ok();
  }

  // The fork check of the chains `only` (all published heads if empty). Verified heads are
  // recorded in the guard; forks close it; invalid head documents are repaired when `repair`.
  // Returns the findings.
  Result<journal::ForkCheck> CheckForks(const std::vector<std::string>& only, bool repair) {
    OML_ASSIGN_OR_RETURN(journal::ForkCheck fc, AllForkChecks(*store, only));
    // Forks close first, so a chain is closed for its finding, not for the conflict between a
    // published head and the stored hash a checkpoint's head carries (Observe below).
    for (const auto& f : fc.findings)
      if (!f.invalid_head) guard->Close(f.tenant, f.what);
    for (const auto& h : fc.heads) guard->Observe(h.tenant, h.seq, h.event_hash);
    for (const auto& f : fc.findings) {
      if (!f.invalid_head) continue;
      Metrics::Get().ChainIntegrity("head-invalid");
      log::Error("published head is invalid", {{"tenant", f.tenant}, {"error", f.what}, {"repair", repair}});
      if (!repair) continue;
      if (f.checkpoint) {  // the tlog publisher writes the chain's log again, the checkpoint last
        Status st = journal::RepublishTlog(*pool, f.tenant);
        if (!st.ok()) log::Error("cannot republish the transparency log", {{"tenant", f.tenant}, {"error", st.ToString()}});
        continue;
      }
      OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool->Acquire());
      auto r = c->Scoped(f.tenant, {"SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(f.tenant)}});
      if (r.ok() && r->size() > 0) {
        Status st = publisher->Repair(f.tenant, r->GetInt(0, 0), r->GetBytes(0, 1));
        if (!st.ok()) log::Error("cannot repair published head", {{"tenant", f.tenant}, {"error", st.ToString()}});
        else log::Info("published head repaired", {{"tenant", f.tenant}, {"seq", r->GetInt(0, 0)}});
      }
    }
    return fc;
  }
  // The fork checks of the chains `only` (all if empty): the published head documents
  // (journal::CheckForks) and the published checkpoints, which need a quorum of witness
  // cosignatures when witnesses are configured (journal::CheckPublishedCheckpoints).
  // REQUIRES: LoadKeyChain.
  Result<journal::ForkCheck> AllForkChecks(blob::ObjectStore& objects, const std::vector<std::string>& only) {
    OML_ASSIGN_OR_RETURN(journal::ForkCheck fc, journal::CheckForks(*pool, objects, trusted, only));
    std::vector<std::string> chains = only;
    if (chains.empty()) {
      OML_ASSIGN_OR_RETURN(auto tenants, journal::ListTenants(*pool));
      for (const auto& t : tenants) chains.push_back(t.tenant_id);
    }
    OML_RETURN_IF_ERROR(journal::CheckPublishedCheckpoints(*pool, objects, trusted, config.tlog_origin, witnesses,
                                                           chains, &fc));
    return fc;
  }
  // What every command that signs must hold before it appends to `chains` (REQUIRES need_key):
  // its key is the key in force and anchored in the root key; outside the local profile (its own
  // cluster, reduced by definition) synchronous quorum replication, unless reduced durability is
  // accepted, as `oml serve` requires; and, like `oml serve`, no fork on a chain it extends.
  Status ReadyToAppend(const std::vector<std::string>& chains) {
    OML_RETURN_IF_ERROR(journal::CheckSigningKeyInForce(*pool, *key));
    OML_RETURN_IF_ERROR(RequireOwnKeyTrusted());
    if (!config.database_url.empty() && !config.reduced_durability) {
      OML_ASSIGN_OR_RETURN(db::Pool::Handle h, pool->Acquire());
      OML_ASSIGN_OR_RETURN(db::DurabilitySettings settings, db::ReadDurabilitySettings(*h));
      const db::DurabilityVerdict v = db::EvaluateDurability(settings);
      if (!v.quorum)
        return Unavailable("writes are refused: " + v.detail +
                               " (set OML_REDUCED_DURABILITY=1 to accept reduced durability)",
                           "durability-reduced");
    }
    OML_ASSIGN_OR_RETURN(journal::ForkCheck forks, CheckForks(chains, /*repair=*/false));
    for (const auto& f : forks.findings)
      if (!f.invalid_head) return Unavailable("tenant " + f.tenant + ": " + f.what + " (run `oml doctor`)", "chain-fork");
    // With witnesses, the chains it extends are shown to them too (a database and object store
    // rolled back together pass the checks above); a witness that does not answer is no refusal.
    journal::WitnessSizes sizes;
    OML_ASSIGN_OR_RETURN(journal::TlogRound w, journal::RecheckWitnesses(*pool, witnesses, &sizes, chains));
    for (const auto& [tenant, st] : w.forks)
      return Unavailable("tenant " + tenant + ": " + st.message() + " (run `oml doctor`)", "chain-fork");
    return Status::Ok();
  }

};

Status DoInit(const Config& c, bool quiet) {
  OML_RETURN_IF_ERROR(EnsureKeys(c));
  OML_ASSIGN_OR_RETURN(auto rt, Runtime::Open(c, true));
  OML_ASSIGN_OR_RETURN(bool created, journal::InitProvider(*rt->journal));
  OML_RETURN_IF_ERROR(lake::EnsureLakeTables(c.lake_root));
  if (!quiet) {
    std::cout << (created ? "initialized: provider chain genesis and key.issued for " : "already initialized; signing key ")
              << rt->key->key_id() << "\nlake: " << c.lake_root << " (";
    const auto names = lake::LakeTableNames();
    for (size_t i = 0; i < names.size(); ++i) std::cout << (i ? ", " : "") << names[i];
    std::cout << ")\n";
  }
  return Status::Ok();
}

// The oml_app password for `oml migrate`: the first line of `file` if given, else
// $OML_APP_PASSWORD, else "" (no password set). Never from argv, where every local user can read
// it in the process table (/proc/<pid>/cmdline).
// A login role's password for `oml migrate`: the first line of `file`, else the environment
// variable `env`, else empty (none is set). Never from argv. `what` names it in errors ("app",
// "lakewriter", "reconciler").
Result<std::string> RolePassword(const std::string& file, const char* env, const std::string& what) {
  if (file.empty()) {
    const char* v = std::getenv(env);
    return std::string(v ? v : "");
  }
  std::ifstream in(file);
  if (!in) return NotFound("cannot read the " + what + " password file " + file);
  std::string pw;
  std::getline(in, pw);
  if (!pw.empty() && pw.back() == '\r') pw.pop_back();
  if (pw.empty()) return InvalidArgument("the " + what + " password file " + file + " is empty (its first line is the password)");
  return pw;
}

Status DoMigrate(const std::string& admin_url, const db::MigrateOptions& opts) {
  OML_ASSIGN_OR_RETURN(db::Conn admin, db::Conn::Connect(admin_url));
  OML_ASSIGN_OR_RETURN(auto applied, db::Migrate(admin, opts));
  if (applied.empty()) {
    std::cout << "schema is up to date (version " << db::LatestSchemaVersion() << ")\n";
  } else {
    for (int v : applied) std::cout << "applied migration " << v << "\n";
  }
  return Status::Ok();
}

// `oml kek purge-residue`: rewrites the tables that hold wrapped DEKs (VACUUM FULL) so that the
// row versions an erasure, an ended upload or a KEK rotation left behind, wrapped keys included,
// are not in their files any more, then CHECKPOINTs. Each table is locked ACCESS EXCLUSIVE while
// it is rewritten (reads and writes of it wait; the lock is waited for at most 60 s). A session
// or replication slot whose snapshot predates the purge keeps those versions alive: the command
// then fails (kFailedPrecondition "purge-incomplete", exit 4) naming it. The old files' blocks
// are freed, not overwritten, on the filesystem. As an administrator: the owner or a superuser
// (CHECKPOINT needs a superuser or pg_checkpoint). WAL and backups keep what they hold until
// their retention ends (docs/data/event-catalog.md, "What an erasure leaves").
Status DoPurgeKeyResidue(const std::string& admin_url) {
  OML_ASSIGN_OR_RETURN(db::Conn admin, db::Conn::Connect(admin_url));
  // A transaction that read a key table and stays open would hold VACUUM FULL (and every upload
  // and read queued behind its lock) for ever: give up after a minute instead.
  OML_RETURN_IF_ERROR(admin.Exec("SET lock_timeout = '60s'").status());
  // A snapshot older than the purge keeps VACUUM FULL from dropping what was deleted after it
  // (the rewritten file would still hold those row versions): such holders are named at the end.
  OML_ASSIGN_OR_RETURN(db::Rows start, admin.Query("SELECT (txid_current() % 4294967296)::text"));
  const std::string start_xid = start.Get(0, 0);
  for (const char* table : {"oml.artifact_keys", "oml.attachment_keys", "oml.upload_sessions"}) {
    const std::string size = std::string("SELECT pg_total_relation_size('") + table + "')";
    OML_ASSIGN_OR_RETURN(db::Rows before, admin.Query(size));
    OML_ASSIGN_OR_RETURN(db::Rows done, admin.Exec(std::string("VACUUM (FULL, ANALYZE) ") + table));
    (void)done;
    OML_ASSIGN_OR_RETURN(db::Rows after, admin.Query(size));
    std::cout << table << ": rewritten, " << before.GetInt(0, 0) << " -> " << after.GetInt(0, 0) << " bytes\n";
  }
  OML_ASSIGN_OR_RETURN(
      db::Rows holders,
      admin.Query("SELECT 'pid ' || pid || ' (' || coalesce(nullif(application_name, ''), backend_type) || ', ' || "
                  "coalesce(state, '') || ')' FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                  "AND backend_xmin IS NOT NULL AND age(backend_xmin) >= age($1::xid) "
                  "UNION ALL SELECT 'replication slot ' || slot_name FROM pg_replication_slots "
                  "WHERE coalesce(xmin, catalog_xmin) IS NOT NULL AND age(coalesce(xmin, catalog_xmin)) >= age($1::xid)",
                  {db::Text(start_xid)}));
  if (holders.size() > 0) {
    std::string names;
    for (int i = 0; i < holders.size(); ++i) names += (i ? ", " : "") + holders.Get(i, 0);
    return FailedPrecondition("shredded keys may remain in the rewritten files: " + names +
                                  " held a snapshot from before the purge; end it and run the purge again",
                              "purge-incomplete");
  }
  OML_ASSIGN_OR_RETURN(db::Rows cp, admin.Exec("CHECKPOINT"));
  (void)cp;
  std::cout << "checkpoint done; WAL segments and backups older than now may still hold shredded keys\n";
  return Status::Ok();
}

// The KEKs of this process: kek_file wraps new DEKs; previous_kek_file (set while `oml kek rotate`
// moves DEKs to kek_file's KEK) and `extra_previous` only unwrap. Each DEK is unwrapped under the
// KEK its artifact_keys row names.
Result<std::unique_ptr<crypto::KekRing>> LoadKeks(const Config& c, const std::vector<std::string>& extra_previous = {}) {
  OML_ASSIGN_OR_RETURN(auto primary, crypto::FileKekProvider::Load(c.kek_file, c.allow_insecure_key_files));
  std::vector<std::unique_ptr<crypto::KekProvider>> previous;
  std::vector<std::string> files = extra_previous;
  if (!c.previous_kek_file.empty()) files.insert(files.begin(), c.previous_kek_file);
  for (const auto& f : files) {
    OML_ASSIGN_OR_RETURN(auto p, crypto::FileKekProvider::Load(f, c.allow_insecure_key_files));
    if (primary->Holds(p->kek_id())) continue;  // the same KEK twice
    previous.push_back(std::move(p));
  }
  return std::make_unique<crypto::KekRing>(std::move(primary), std::move(previous));
}

// How often a StagingSweeper looks: half the grace, between 1 s and 15 min.
std::chrono::milliseconds StagingSweepInterval(const Config& c) {
  return std::chrono::milliseconds(std::clamp<int64_t>(c.staging_grace_s * 500, 1000, 15 * 60 * 1000));
}

// Signals end the serve loop: SIGINT/SIGTERM are blocked in every thread and taken by sigwait.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// `oml witness` (tlog/witness.h): a C2SP tlog-witness over HTTP, POST /add-checkpoint. Each
// `log_vkeys` entry is a note verifier key of a log whose key name is the log's checkpoint origin
// (as oml's are: "<tlog_origin>/<tenant>"); each `deployment_vkeys` entry one whose name is an
// oml deployment's tlog_origin, witnessing every chain of that deployment. The witness key is `key_file` (PKCS#8 PEM, created
// 0600 if missing); its state is `state_dir`. Prints its cosignature/v1 verifier key, then serves
// until SIGINT/SIGTERM.
Status Witness(const std::string& listen, const std::string& key_file, const std::string& name,
               const std::vector<std::string>& log_vkeys, const std::vector<std::string>& deployment_vkeys,
               const std::string& state_dir) {
  if (!tlog::IsValidKeyName(name)) return InvalidArgument("--name " + name + ": not a note key name (no space or '+')");
  if (log_vkeys.empty() && deployment_vkeys.empty())
    return InvalidArgument("give at least one --log <verifier key> or --deployment <verifier key>");
  // Before any thread starts (the server's workers inherit the mask): SIGTERM ends the loop.
  sigset_t set = BlockStopSignals();
  std::map<std::string, std::vector<tlog::NoteKey>> logs;
  for (const auto& v : log_vkeys) {
    OML_ASSIGN_OR_RETURN(tlog::NoteKey k, tlog::ParseVerifierKey(v));
    if (k.alg != tlog::kAlgEd25519) return InvalidArgument("--log " + v + ": not an Ed25519 note key");
    auto& keys = logs[k.name];
    if (std::none_of(keys.begin(), keys.end(), [&](const tlog::NoteKey& o) { return o.hash == k.hash && o.public_key == k.public_key; }))
      keys.push_back(std::move(k));  // a key given twice is one key (OpenNote refuses ambiguous ones)
  }
  std::map<std::string, std::vector<std::string>> deployments;
  for (const auto& v : deployment_vkeys) {
    OML_ASSIGN_OR_RETURN(tlog::NoteKey k, tlog::ParseVerifierKey(v));
    if (k.alg != tlog::kAlgEd25519) return InvalidArgument("--deployment " + v + ": not an Ed25519 note key");
    auto& keys = deployments[k.name];
    if (std::find(keys.begin(), keys.end(), k.public_key) == keys.end()) keys.push_back(k.public_key);
  }
  std::error_code exists_ec;
  if (!fs::exists(key_file, exists_ec)) {
    if (exists_ec) return InvalidArgument("--key " + key_file + ": " + exists_ec.message());
    OML_ASSIGN_OR_RETURN(crypto::SigningKey fresh, crypto::SigningKey::Generate());
    OML_RETURN_IF_ERROR(fresh.SaveFile(key_file));
    log::Info("witness key generated", {{"file", key_file}});
  }
  OML_ASSIGN_OR_RETURN(crypto::SigningKey key, crypto::SigningKey::LoadFile(key_file));
  OML_ASSIGN_OR_RETURN(auto state, tlog::DirWitnessState::Open(state_dir));
  tlog::Witness witness(std::move(logs), name, &key, state.get(), std::move(deployments));
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("--listen " + listen + ": want HOST:PORT");
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
    return InvalidArgument("--listen " + listen + ": want HOST:PORT");
  }
  api::http::Limits limits;
  limits.max_body_bytes = tlog::kMaxNoteBytes + 64 * 64;
  limits.worker_threads = 4;
  std::vector<api::http::Route> routes = {
      {"POST", "/add-checkpoint", "/add-checkpoint", api::http::BodyPolicy::kRequired,
       [&](const api::http::Request& req, api::http::Response& res) {
         const uint64_t now = static_cast<uint64_t>(std::time(nullptr));
         tlog::WitnessAnswer a = witness.AddCheckpoint(req.body, now);
         res.status = a.status;
         res.content_type = a.content_type;
         res.body = a.body;
         if (a.status != 200) log::Info("witness: add-checkpoint refused", {{"status", a.status}, {"why", a.body}});
       }}};
  auto problem = [](int status, const std::string& slug, const std::string& detail, const std::string&) {
    api::http::Response r;
    r.status = status;
    r.content_type = "text/plain; charset=utf-8";
    r.body = slug + ": " + detail + "\n";
    return r;
  };
  api::http::Server server(limits, std::move(routes), problem, [](const std::string&, const std::string&, int, double) {});
  OML_RETURN_IF_ERROR(server.Bind(listen.substr(0, colon), port));
  std::cout << witness.VerifierKey() << "\n" << std::flush;
  log::Info("witness listening", {{"address", listen.substr(0, colon) + ":" + std::to_string(server.port())},
                                  {"name", name}, {"vkey", witness.VerifierKey()}, {"state", state_dir}});
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    server.Stop();
  });
  Status st = server.Run();
  if (!st.ok()) pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return st;
}

// Sets jemalloc's dirty and muzzy decay to 0 for every arena, present and future (the binary's
// allocator: src/cli/CMakeLists.txt). Internal if jemalloc refuses (it is not the allocator).
Status ReturnFreedMemoryAtOnce() {
  ssize_t zero = 0;
  for (const char* name : {"arenas.dirty_decay_ms", "arenas.muzzy_decay_ms"})
    if (int e = mallctl(name, nullptr, nullptr, &zero, sizeof zero); e != 0)
      return Internal(std::string("jemalloc: mallctl ") + name + ": " + std::strerror(e));
  unsigned narenas = 0;
  size_t len = sizeof narenas;
  if (int e = mallctl("arenas.narenas", &narenas, &len, nullptr, 0); e != 0)
    return Internal(std::string("jemalloc: mallctl arenas.narenas: ") + std::strerror(e));
  for (unsigned i = 0; i < narenas; ++i) {
    for (const char* what : {"dirty_decay_ms", "muzzy_decay_ms"}) {
      const std::string name = "arena." + std::to_string(i) + "." + what;
      // EFAULT: arena i is not initialized yet (it will take the defaults set above).
      if (int e = mallctl(name.c_str(), nullptr, nullptr, &zero, sizeof zero); e != 0 && e != EFAULT)
        return Internal("jemalloc: mallctl " + name + ": " + std::strerror(e));
    }
  }
  return Status::Ok();
}

// `local_profile`: `oml dev`, whose durability is reduced by definition (one disk, no standbys).
Status Serve(const Config& c, const std::function<void()>& on_ready, bool local_profile = false) {
  // Freed pages go back to the system at once (jemalloc otherwise keeps them ~10 s in each of
  // its arenas): a 1 GiB tus upload in 6 MiB chunks over 32 workers otherwise left ~100 MiB more
  // resident at its peak (tests/test_uploads.py, memory). The batch commands keep the default.
  OML_RETURN_IF_ERROR(ReturnFreedMemoryAtOnce());
  OML_ASSIGN_OR_RETURN(auto rt, Runtime::Open(c, true, c.db_pool_size, c.db_acquire_timeout_ms));
  OML_RETURN_IF_ERROR(journal::CheckSigningKeyInForce(*rt->pool, *rt->key));
  OML_RETURN_IF_ERROR(rt->RequireOwnKeyTrusted());
  OML_ASSIGN_OR_RETURN(auto kek, LoadKeks(c));
  if (!kek->previous_ids().empty())
    log::Info("KEK rotation: wrapping under the new KEK, also unwrapping under the previous one",
              {{"kek_id", kek->kek_id()}, {"previous_kek_ids", kek->previous_ids()}});
  OML_ASSIGN_OR_RETURN(const crypto::HmacKeyRing cursor_keys, LoadCursorKeys(c));
  log::Info("cursor secret loaded", {{"file", c.cursor_secret_file},
                                     {"signing_key_id", cursor_keys.signing_key_id()},
                                     {"key_ids", cursor_keys.key_ids()}});
  // Startup fork check: forked tenants are closed in the guard (writes 503 chain-fork), invalid
  // head documents are repaired. While serving, the journal and the publisher keep checking.
  OML_RETURN_IF_ERROR(rt->CheckForks({}, /*repair=*/true).status());
  // With witnesses, each chain's newest checkpoint is shown to them before any write: a database
  // restored behind what they cosigned is refused even if the published objects were rolled back
  // too. A witness that cannot be reached does not stop the start (the publisher keeps asking).
  journal::WitnessSizes witness_sizes;
  if (rt->witnesses.enabled()) {
    OML_ASSIGN_OR_RETURN(journal::TlogRound w, journal::RecheckWitnesses(*rt->pool, rt->witnesses, &witness_sizes));
    for (const auto& [tenant, st] : w.forks) rt->guard->Close(tenant, st.message());
    for (const auto& [tenant, st] : w.failures)
      if (st.type() != "tlog-fork")
        log::Warn("transparency log: the startup witness check of a chain did not complete",
                  {{"tenant", tenant}, {"error", st.ToString()}});
  }
  api::ForkState& fork = *rt->guard;
  journal::HeadPublisher& publisher = *rt->publisher;
  publisher.Start();
  admission::Claims claims(rt->journal.get(), rt->pool.get(), kek.get(), c.max_body_bytes);
  // Durability gate (db/durability.h): without synchronous quorum replication writes are refused
  // unless durability is reduced on purpose; re-checked every durability_check_ms.
  db::DurabilityMonitor durability(rt->pool->url(),
                                   local_profile          ? db::DurabilityMode::kReducedLocal
                                   : c.reduced_durability ? db::DurabilityMode::kReduced
                                                          : db::DurabilityMode::kEnforced,
                                   std::chrono::milliseconds(c.durability_check_ms));
  OML_RETURN_IF_ERROR(durability.Start());
  // A COMMIT that waits longer than this for the synchronous standbys is cancelled and answered
  // 503 commit-not-replicated (db/conn.h), so a lost quorum never holds a client for ever.
  db::SetCommitWaitBound(std::chrono::milliseconds(c.commit_replication_timeout_ms));
  // tus uploads (uploads/uploads.h): parts and objects in the quarantine bucket; a sweep expires
  // sessions (and complete ones no claim attached within upload_complete_ttl_s) and removes what
  // they left, every min(60 s, min(upload_expiry_s, upload_complete_ttl_s) / 2).
  OML_ASSIGN_OR_RETURN(auto quarantine, blob::OpenBucket(c, c.quarantine_bucket));
  uploads::Options uo;
  uo.max_length = c.upload_max_bytes;
  uo.expiry = std::chrono::seconds(c.upload_expiry_s);
  uo.tombstone_retention = std::chrono::seconds(c.upload_expiry_s);
  uo.complete_ttl = std::chrono::seconds(c.upload_complete_ttl_s);
  uo.max_sessions_per_key = c.upload_sessions_per_key;
  uo.max_sessions_per_tenant = c.upload_sessions_per_tenant;
  uo.max_pending_bytes_per_key = c.upload_pending_bytes_per_key;
  uo.max_pending_bytes_per_tenant = c.upload_pending_bytes_per_tenant;
  uo.min_chunk_bytes = c.upload_min_chunk_bytes;
  uploads::Uploads uploads(rt->pool.get(), kek.get(), quarantine.get(), uo);
  uploads::Sweeper sweeper(&uploads, std::chrono::milliseconds(std::clamp<int64_t>(
                                         std::min(c.upload_expiry_s, c.upload_complete_ttl_s) * 500, 1000, 60000)));
  // Attachments and the review gate (admission/attachments.h): promoted files go to the bodies
  // bucket; the deny-list file and clamd address are checked here, at startup.
  OML_ASSIGN_OR_RETURN(auto bodies, blob::OpenBucket(c, c.bodies_bucket));
  // What a killed write left in either bucket or in the heads store (object_store_url: the
  // published chain heads; staging files, incomplete multipart uploads): removed now and then
  // every min(grace / 2, 15 min) once older than staging_grace_s.
  std::vector<blob::ObjectStore*> swept = {quarantine.get(), bodies.get()};
  std::vector<std::string> swept_names = {c.quarantine_bucket, c.bodies_bucket};
  if (rt->store) {
    swept.push_back(rt->store.get());
    swept_names.push_back("heads");
  }
  blob::StagingSweeper staging_sweeper(swept, swept_names, std::chrono::seconds(c.staging_grace_s),
                                       StagingSweepInterval(c));
  OML_ASSIGN_OR_RETURN(review::Options review_opts, review::OptionsFromConfig(c));
  // PDFs are extracted in child processes of this binary, never in the server (pdf_sandbox.h).
  // "/proc/self/exe" itself, not the path it names now: an in-place upgrade never makes this
  // server spawn another version's extractor, and a deleted binary is still this one.
  OML_ASSIGN_OR_RETURN(review_opts.pdf, review::PdfSandboxFromConfig(c, "/proc/self/exe"));
  admission::AttachmentsOptions attachment_opts;
  attachment_opts.inline_body_max_bytes = c.inline_body_max_bytes;
  admission::Attachments attachments(rt->pool.get(), rt->journal.get(), kek.get(), &uploads, quarantine.get(),
                                     bodies.get(), std::move(review_opts), attachment_opts);
  claims.set_attachments(&attachments);
  // Rejected claims are erased at the end of their retention (admission/retention.h), checked
  // every min(1 h, rejected_retention_s / 2), at least every second.
  admission::RejectedRetention retention(rt->pool.get(), &claims, std::chrono::seconds(c.rejected_retention_s));
  retention.Start(std::chrono::milliseconds(std::clamp<int64_t>(c.rejected_retention_s * 500, 1000, 3600 * 1000)));
  // The search index of promoted claims is built after each promotion commits (sql/0028): the
  // queue is drained at start and every 250 ms (Claims::IndexSearchQueue).
  admission::SearchIndexer indexer(&claims, std::chrono::milliseconds(250));
  // Chains that existed before 0029 get their Merkle edge built from the journal (journal/
  // merkle_edge.h), at start and then hourly (an edge an append found malformed is dropped).
  journal::TreeBuilder tree_builder(rt->pool.get(), std::chrono::hours(1));
  // Each chain as a transparency log (journal/tlog_store.h): its tiles extended to the commit
  // point's edge, a checkpoint signed over them and the tiles, entry bundles and checkpoint
  // written to the object store (oml-tlog/<tenant>/), every tlog_publish_ms (busy at most a quarter of the time).
  // With witnesses (tlog_witnesses), each checkpoint is published once a quorum cosigned it; a
  // witness's answer that names a fork closes the chain for writes, as the head check does.
  // tlog_publish_ms = 0: another replica publishes (or nobody: proofs then answer 409).
  std::optional<journal::TlogPublisher> tlog_publisher;
  if (c.tlog_publish_ms > 0)
    tlog_publisher.emplace(rt->pool.get(), rt->store.get(), c.tlog_origin, rt->key.get(),
                           std::chrono::milliseconds(c.tlog_publish_ms), rt->witnesses, std::move(witness_sizes),
                           [g = rt->guard.get()](const std::string& tenant, const std::string& what) {
                             g->Close(tenant, what);
                           });
  else
    log::Warn("tlog_publish_ms is 0: this replica signs and publishes no checkpoint", {});
  api::ServerDeps deps{&rt->config, rt->pool.get(), rt->journal.get(), &claims, &fork, &cursor_keys, &durability};
  deps.uploads = &uploads;
  api::Server server(deps);

  sigset_t set = BlockStopSignals();
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    log::Info("stopping", {{"signal", sig}});
    server.Stop();
  });
  std::thread ready([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (on_ready) on_ready();
  });
  Status st = server.Listen(c.ListenHost(), c.ListenPort());
  ready.join();
  if (!st.ok()) {
    pthread_kill(waiter.native_handle(), SIGTERM);
  }
  waiter.join();
  OML_RETURN_IF_ERROR(publisher.Flush());
  return st;
}

Status Dev(Config c) {
  log::Info("oml dev: local profile", {{"home", c.home}});
  std::unique_ptr<db::LocalCluster> cluster;
  if (c.database_url.empty()) {
    cluster = std::make_unique<db::LocalCluster>(PgDir(c));
    OML_RETURN_IF_ERROR(cluster->Start());
    OML_ASSIGN_OR_RETURN(db::Conn admin, db::Conn::Connect(cluster->SuperuserUrl()));
    OML_RETURN_IF_ERROR(db::Migrate(admin, {}).status());
    c.database_url = cluster->AppUrl();
  }
  Status st = [&]() -> Status {
    OML_RETURN_IF_ERROR(DoInit(c, true));
    std::string token_file = c.home + "/dev-writer.token";
    if (!fs::exists(token_file)) {
      OML_ASSIGN_OR_RETURN(auto rt, Runtime::Open(c, true));
      auto t = journal::LookupTenant(*rt->pool, "demo");
      std::string tenant_id;
      if (t.ok()) {
        tenant_id = t->tenant_id;
      } else {
        OML_ASSIGN_OR_RETURN(auto created, journal::CreateTenant(*rt->journal, "demo"));
        tenant_id = created.tenant_id;
      }
      OML_ASSIGN_OR_RETURN(auto key, journal::CreateApiKey(*rt->journal, tenant_id, "dev", "writer"));
      // 0600 from the start and whole or not at all (temp file, rename): never a truncated token.
      OML_RETURN_IF_ERROR(WriteSecretFile(token_file, key.token + "\n", 0600, IfExists::kRefuse));
    }
    // `oml lake tail` of this home, spelled so that it works from any shell.
    std::error_code ec;
    fs::path self = fs::read_symlink("/proc/self/exe", ec);
    std::string tail_cmd = "OML_HOME=" + c.home + " " + (ec ? std::string("oml") : self.string()) + " lake tail -n 1";
    auto on_ready = [&] {
      std::string base = "http://" + c.listen;
      std::cout << "\noml dev is running (local profile; durability: reduced (local profile), this one disk).\n"
                << "  API:        " << base << "   metrics: " << (c.metrics_listen.empty() ? std::string("off") : "http://" + c.metrics_listen + "/metrics") << "\n"
                << "  database:   " << PgDir(c) << "/superuser.url\n"
                << "  tenant:     demo   writer key: " << token_file << "\n\n"
                << "Submit a first claim:\n"
                << "  curl -sS -X POST " << base << "/v1/claims \\\n"
                << "    -H \"Authorization: Bearer $(cat " << token_file << ")\" \\\n"
                << "    -H 'Content-Type: application/json' \\\n"
                << "    -d '{\"body\":\"hello, oml\",\"workarea_id\":\"wa-1\",\"path\":\"notes/hello.md\",\"provenance\":\"human\"}'\n"
                << "Two seconds later, its row in the lake (bronze/events, written by the lake writer):\n"
                << "  sleep 2; " << tail_cmd << "\n"
                << "Then fetch it with GET " << base << "/v1/claims/<artifact_id> (same header).\n"
                << "Press Ctrl-C to stop oml, its lake writer and its PostgreSQL.\n"
                << std::flush;
    };
    // The lake writer runs in-process on $OML_HOME/lake (lake_root) as oml_lakewriter. Stop order
    // on Ctrl-C: the API (Serve returns), then the lake writer (joined here), then PostgreSQL.
    std::atomic<bool> lw_stop{false};
    std::thread lw_thread;
    auto lw_url = LakewriterUrl(c);
    std::unique_ptr<crypto::SigningKey> lw_key = LakeWriterKey(c);
    if (lw_url.ok()) {
      lake::LakeWriterOptions o;
      o.database_url = *lw_url;
      o.lake_root = c.lake_root;
      o.signing_key = lw_key.get();  // outlives the thread: joined below
      o.signing_key_file = c.signing_key_file;  // re-read after a rotation
      o.allow_insecure_key_files = c.allow_insecure_key_files;
      lw_thread = std::thread([o = std::move(o), &lw_stop]() mutable {
        lake::LakeWriter writer(std::move(o));
        Status s = writer.Run(&lw_stop);
        if (!s.ok()) log::Error("oml dev: the lake writer stopped", {{"error", s.ToString()}});
      });
    } else {
      log::Warn("oml dev: no lake writer (the lake stays empty)", {{"error", lw_url.status().ToString()}});
    }
    Status served = Serve(c, on_ready, /*local_profile=*/true);
    lw_stop = true;
    if (lw_thread.joinable()) lw_thread.join();
    return served;
  }();
  if (cluster) {
    Status stop = cluster->Stop();
    if (!stop.ok()) log::Error("cannot stop PostgreSQL", {{"error", stop.ToString()}});
    else log::Info("PostgreSQL stopped");
  }
  return st;
}

// `oml lakewriter --nice`: adds `nice` to the nice value of every thread this process has (Linux
// keeps one per thread, and a thread starts with its creator's, so threads started later, the
// Delta adapter's included, inherit it). 0 changes nothing. Lowering needs no privilege.
Status LowerPriority(int nice) {
  if (nice == 0) return Status::Ok();
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const int tid = std::atoi(task.path().filename().c_str());
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    if (errno != 0) continue;  // the thread has exited
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::min(19, now + nice)) != 0 && errno != ESRCH)
      return Internal("cannot lower the lake writer's CPU priority (--nice " + std::to_string(nice) +
                      "): " + std::strerror(errno));
  }
  if (ec) return Internal("cannot list /proc/self/task to apply --nice: " + ec.message());
  return Status::Ok();
}

// `oml lakewriter`: the lake writer of one outbox stream (lake/lakewriter.h) until SIGINT/SIGTERM,
// or with `once` until the stable horizon it finds at start is drained. Serves GET /metrics
// (common/metrics.h, oml_lake_*) on lakewriter_metrics_listen unless that is "off".
Status RunLakewriter(const Config& c, lake::LakeWriterOptions o, bool once) {
  sigset_t set = BlockStopSignals();  // before any thread exists (delta-rs starts its own)
  OML_ASSIGN_OR_RETURN(o.database_url, LakewriterUrl(c));
  o.lake_root = c.lake_root;
  std::unique_ptr<crypto::SigningKey> key = LakeWriterKey(c);
  o.signing_key = key.get();
  o.signing_key_file = c.signing_key_file;  // re-read after a rotation (LakeWriterOptions)
  o.allow_insecure_key_files = c.allow_insecure_key_files;
  // Staging files or multipart uploads of Parquet and commit files a killed writer left.
  OML_ASSIGN_OR_RETURN(auto lake_store, blob::OpenObjectStore(c.lake_root));
  blob::StagingSweeper staging_sweeper({lake_store.get()}, {"lake"}, std::chrono::seconds(c.staging_grace_s),
                                       StagingSweepInterval(c));
  log::Info("oml lakewriter", {{"stream", o.stream}, {"lake_root", o.lake_root}, {"once", once},
                               {"max_rows", o.max_rows}, {"poll_ms", o.poll_every.count()}, {"min_batch_ms", o.min_batch_interval.count()},
                               {"gold_every_ms", o.gold_every.count()},
                               {"dead_letter_after", o.dead_letter_after},
                               {"metrics", c.lakewriter_metrics_listen}});
  std::unique_ptr<api::http::Server> metrics;
  std::thread metrics_thread;
  if (!c.lakewriter_metrics_listen.empty()) {
    api::http::Limits ml;
    ml.worker_threads = 1;
    ml.max_connections = 64;
    ml.max_body_bytes = 0;
    std::vector<api::http::Route> routes = {{"GET", "/metrics", "/metrics", api::http::BodyPolicy::kNone,
                                             [](const api::http::Request&, api::http::Response& res) {
                                               res.content_type = "text/plain; version=0.0.4";
                                               res.body = Metrics::Get().Serialize();
                                             }}};
    auto problem = [](int status, const std::string& slug, const std::string& detail, const std::string&) {
      api::http::Response r;
      r.status = status;
      r.content_type = "application/problem+json";
      r.body = json{{"type", slug}, {"status", status}, {"detail", detail}}.dump();
      return r;
    };
    metrics = std::make_unique<api::http::Server>(ml, std::move(routes), problem,
                                                  [](const std::string&, const std::string&, int, double) {});
    const std::string& m = c.lakewriter_metrics_listen;
    OML_RETURN_IF_ERROR(metrics->Bind(Config::HostOf(m), Config::PortOf(m)));
    log::Info("lake writer: metrics listening",
              {{"address", Config::HostOf(m) + ":" + std::to_string(metrics->port())}});
    metrics_thread = std::thread([&metrics] { (void)metrics->Run(); });
  }
  lake::LakeWriter writer(std::move(o));
  std::atomic<bool> stop{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    if (!stop.exchange(true)) log::Info("lake writer: stopping", {{"signal", sig}});
  });
  Status st = once ? writer.RunOnce(&stop) : writer.Run(&stop);
  if (!stop.exchange(true)) pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  if (metrics) {
    metrics->Stop();
    metrics_thread.join();
  }
  return st;
}

// `oml status`: the lake writer's position (lake/lake_status.h), read as the lakewriter role
// (the same URL lookup as `oml lakewriter`).
Status ShowStatus(const Config& c, const std::string& stream, bool as_json) {
  OML_ASSIGN_OR_RETURN(lake::OutboxStream s, lake::ResolveStream(stream));
  OML_ASSIGN_OR_RETURN(std::string url, LakewriterUrl(c));
  OML_ASSIGN_OR_RETURN(db::Conn conn, db::Conn::Connect(url));
  OML_ASSIGN_OR_RETURN(lake::LakeStatus st, lake::ReadLakeStatus(conn, s, c.lake_root));
  if (as_json) std::cout << st.ToJson().dump() << "\n";
  else std::cout << st.ToText();
  return Status::Ok();
}

// `oml lake rebuild --table T` (lake/rebuild.h): empties T and lets the lake writer refill it
// from the outbox exactly once. Prints one JSON object. With wait > 0, then waits (polling `oml
// status`) until T holds everything up to the frontier it was emptied at: exit 0, or kUnavailable
// "lake-rebuild-waiting" when the wait ends first (no writer holds the lease, or it is slow).
Status LakeRebuild(const Config& c, const std::string& stream, const std::string& table, int64_t wait_s) {
  OML_ASSIGN_OR_RETURN(lake::OutboxStream s, lake::ResolveStream(stream));
  OML_ASSIGN_OR_RETURN(std::string url, LakewriterUrl(c));
  OML_ASSIGN_OR_RETURN(db::Conn conn, db::Conn::Connect(url));
  OML_ASSIGN_OR_RETURN(lake::RebuildStart r, lake::StartRebuild(conn, s, c.lake_root, table));
  OML_ASSIGN_OR_RETURN(lake::LakeStatus st, lake::ReadLakeStatus(conn, s, c.lake_root));
  json out = {{"table", r.table},
              {"stream", s.name},
              {"emptied_version", r.truncated_version},
              {"refill_to", r.frontier},
              {"lease_held", st.lease_held},
              {"lease_holder", st.lease_held ? json(st.lease_holder) : json(nullptr)}};
  if (!st.lease_held) {
    std::cerr << "oml: no lake writer holds the lease of stream " << s.name
              << ": start `oml lakewriter` (or run `oml lakewriter --once`) to refill " << table << "\n";
  }
  if (wait_s <= 0) {
    std::cout << out.dump() << "\n";
    return Status::Ok();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  const std::string uri = lake::TableUri(c.lake_root, table);
  for (;;) {
    // Refilled: T holds what its record says (the writer lowers the record to T's txn when T's
    // own rows end before the frontier). One txn read and one row a second: no table listing.
    OML_ASSIGN_OR_RETURN(db::Rows rec, conn.Query("SELECT txn_version FROM oml.lake_table_txn WHERE stream = $1 "
                                                  "AND table_name = $2",
                                                  {db::Text(s.name), db::Text(table)}));
    auto t = lake::DeltaTable::Open(uri);
    if (t.ok() && rec.size() == 1) {
      OML_ASSIGN_OR_RETURN(lake::LastTxn txn, t->ReadLastTxn(lake::AppIdFor(s.name)));
      if (std::max<int64_t>(txn.version, 0) >= rec.GetInt(0, 0)) {
        out["refilled_txn"] = txn.version;
        std::cout << out.dump() << "\n";
        return Status::Ok();
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::cout << out.dump() << "\n";
      return Unavailable(table + " is not refilled yet after " + std::to_string(wait_s) +
                             " s (a lake writer holding the lease refills it; see `oml status`)",
                         "lake-rebuild-waiting");
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// `oml lake tail`: the newest `n` bronze/events rows (by outbox_seq), oldest first, one JSON
// object a line, without signed_bytes and signature. Reads the whole table (DeltaTable::
// ReadRowsJsonl): meant for the local profile and small lakes. No database.
Status LakeTail(const Config& c, int64_t n, const std::string& tenant_id) {
  std::string root = c.lake_root;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  OML_ASSIGN_OR_RETURN(lake::DeltaTable t, lake::DeltaTable::Open(root + "/bronze/events"));
  OML_ASSIGN_OR_RETURN(std::string jsonl, t.ReadRowsJsonl());
  std::vector<json> rows;
  std::istringstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json r = json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.is_object()) return Internal("bronze/events: unreadable row from the Delta adapter");
    if (!tenant_id.empty() && r.value("tenant_id", "") != tenant_id) continue;
    r.erase("signed_bytes");
    r.erase("signature");
    rows.push_back(std::move(r));
  }
  std::sort(rows.begin(), rows.end(),
            [](const json& a, const json& b) { return a.value("outbox_seq", int64_t{0}) < b.value("outbox_seq", int64_t{0}); });
  size_t from = rows.size() > static_cast<size_t>(n) ? rows.size() - static_cast<size_t>(n) : 0;
  for (size_t i = from; i < rows.size(); ++i) std::cout << rows[i].dump() << "\n";
  return Status::Ok();
}

// `oml reconcile` (reconcile/reconcile.h): the key-less audit, as oml_reconciler. Prints the
// findings (text, or one JSON object with --json); exit 0 when clean, 3 with findings, 4 on a
// usage or access error. The audit loads no key: the report's key_material_uses must be 0, else
// the run fails (a code path reached key material it must never touch). With --repair
// (reconcile/repair.h), the signing key is loaded after the audit, for the lake.repair events.
struct ReconcileArgs {
  reconcile::Options opts;
  bool json = false;
  int64_t stale_after_s = 300;
  int64_t object_grace_s = 3600;
  bool no_objects = false;
  bool repair = false;
  std::string metrics_file;
  std::string since;  // --since as given (SinceMicros)
};

// --since: an RFC 3339 time, or an age "<n>s|m|h|d" before now; Unix microseconds.
Result<int64_t> SinceMicros(const std::string& s) {
  if (auto t = lake::UtcMicros(nlohmann::json(s)); t && s.size() > 10 && *t > 0) return *t;
  static const std::map<char, int64_t> kUnit = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}};
  if (s.size() >= 2 && kUnit.count(s.back()) &&
      std::all_of(s.begin(), s.end() - 1, [](char c) { return c >= '0' && c <= '9'; }) && s.size() <= 10) {
    const int64_t now_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const int64_t n = std::stoll(s.substr(0, s.size() - 1));  // at most 9 digits
    if (n <= now_us / 1000000 / kUnit.at(s.back())) {  // not before 1970 (and no overflow)
      const int64_t since = now_us - n * kUnit.at(s.back()) * 1000000;
      if (since > 0) return since;
    }
  }
  return InvalidArgument("--since " + s + ": give an RFC 3339 time (2026-12-01T00:00:00Z) or an age (36h, 7d)");
}

// Records the run (oml.reconcile_runs, for `oml doctor`) and writes the Prometheus textfile;
// a failure of either is logged, never hides the findings.
void RecordReconcile(db::Conn& conn, const reconcile::Report& r, const ReconcileArgs& a, int64_t repaired) {
  if (Status s = reconcile::RecordRun(conn, r, a.opts, repaired); !s.ok())
    log::Warn("reconcile: the run was not recorded in oml.reconcile_runs", {{"error", s.ToString()}});
  if (a.metrics_file.empty()) return;
  // Atomically, as the textfile collector needs: a reader sees the old file or the new one.
  const std::string tmp = a.metrics_file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << r.PrometheusText();
    if (!out) {
      log::Warn("reconcile: cannot write the metrics file", {{"file", tmp}});
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, a.metrics_file, ec);
  if (ec) log::Warn("reconcile: cannot write the metrics file", {{"file", a.metrics_file}, {"error", ec.message()}});
}

// The audit reads the buckets and the lake with S3 credentials of its own when they are given:
// OML_RECONCILER_AWS_ACCESS_KEY_ID, OML_RECONCILER_AWS_SECRET_ACCESS_KEY (both, or neither) and
// OML_RECONCILER_AWS_SESSION_TOKEN (optional), meant to allow reads only (docs/operations/
// reconcile.md). They replace the process's AWS_* credentials before any store is opened (every
// store reads them from the environment). --repair writes, so it keeps the deployment's.
// Returns which credentials are in use: "reconciler" or "deployment".
Result<std::string> UseReconcilerS3Credentials(bool repair) {
  auto env = [](const char* k) { const char* v = std::getenv(k); return v == nullptr ? std::string() : std::string(v); };
  const std::string id = env("OML_RECONCILER_AWS_ACCESS_KEY_ID"), secret = env("OML_RECONCILER_AWS_SECRET_ACCESS_KEY");
  if (id.empty() && secret.empty()) return std::string("deployment");
  if (id.empty() || secret.empty())
    return InvalidArgument("set both OML_RECONCILER_AWS_ACCESS_KEY_ID and OML_RECONCILER_AWS_SECRET_ACCESS_KEY, or neither",
                           "reconciler-credentials");
  if (repair) return std::string("deployment");
  const std::string token = env("OML_RECONCILER_AWS_SESSION_TOKEN");
  if (setenv("AWS_ACCESS_KEY_ID", id.c_str(), 1) != 0 || setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1) != 0 ||
      (token.empty() ? unsetenv("AWS_SESSION_TOKEN") : setenv("AWS_SESSION_TOKEN", token.c_str(), 1)) != 0)
    return Internal("cannot set the reconciler's S3 credentials in the environment");
  return std::string("reconciler");
}

int RunReconcile(const Config& c, ReconcileArgs a) {
  auto creds = UseReconcilerS3Credentials(a.repair);
  if (!creds.ok()) {
    std::cerr << "oml: " << creds.status().ToString() << "\n";
    return kExitPrecondition;  // a usage error: 4, as verify
  }
  log::Info("reconcile: S3 credentials", {{"credentials", *creds}, {"repair", a.repair}});
  a.opts.stale_after = std::chrono::seconds(a.stale_after_s);
  a.opts.object_grace = std::chrono::seconds(a.object_grace_s);
  a.opts.objects = !a.no_objects;
  if (!a.since.empty()) {
    auto since = SinceMicros(a.since);
    if (!since.ok()) {
      std::cerr << "oml: " << since.status().ToString() << "\n";
      return kExitPrecondition;
    }
    if (a.opts.full) {
      std::cerr << "oml: --since compares part of the lake and --full all of it: give one\n";
      return kExitPrecondition;
    }
    a.opts.since_us = *since;
  }
  auto url = ReconcilerUrl(c);
  if (!url.ok()) return Fail(url.status());
  auto conn = db::Conn::Connect(*url);
  if (!conn.ok()) return Fail(conn.status());
  std::unique_ptr<blob::ObjectStore> quarantine, bodies;
  auto open_buckets = [&]() -> Status {
    OML_ASSIGN_OR_RETURN(quarantine, blob::OpenBucket(c, c.quarantine_bucket));
    OML_ASSIGN_OR_RETURN(bodies, blob::OpenBucket(c, c.bodies_bucket));
    return Status::Ok();
  };
  reconcile::Stores stores;
  if (a.opts.objects) {
    if (Status s = open_buckets(); !s.ok()) return Fail(s);
    stores = {quarantine.get(), bodies.get()};
  }
  auto report = reconcile::Reconcile(*conn, c.lake_root, stores, a.opts);
  if (!report.ok()) {
    const Status& s = report.status();
    // An access error (a role without the grants, S3 credentials that may not read, a wrong
    // stream or tenant) is exit 4, like verify.
    if (s.code() == Code::kPermissionDenied || s.type() == "storage-permission" || s.type() == "tenant-not-found" ||
        s.type() == "unknown-stream") {
      std::cerr << "oml: " << s.ToString() << "\n";
      return kExitPrecondition;
    }
    return Fail(s);
  }
  if (report->key_material_uses != 0) {
    return Fail(Internal("reconcile reached key material " + std::to_string(report->key_material_uses) +
                         " time(s); it must run key-less"));
  }
  for (const auto& f : report->findings)
    log::Warn("reconcile finding", {{"class", f.cls}, {"table", f.table}, {"tenant", f.tenant}, {"seq", f.seq},
                                    {"key", f.key}, {"column", f.column}});
  log::Info("reconcile done", {{"findings", report->findings.size()}, {"events", report->events},
                               {"seconds", report->seconds}});
  if (!a.repair || report->findings.empty()) {
    RecordReconcile(*conn, *report, a, 0);
    if (a.json) std::cout << report->ToJson().dump() << "\n";
    else std::cout << report->ToText();
    return report->findings.empty() ? kExitOk : kExitVerifyFailed;
  }
  // --repair: only now is the signing key loaded (the lake.repair events), never a KEK.
  auto rt = Runtime::Open(c, /*need_key=*/true);
  if (!rt.ok()) return Fail(rt.status());
  Runtime& R = **rt;
  std::vector<std::string> chains = {std::string(journal::kProviderTenant)};
  for (const auto& f : report->findings)
    if (!f.tenant.empty()) chains.push_back(f.tenant);
  std::sort(chains.begin(), chains.end());
  chains.erase(std::unique(chains.begin(), chains.end()), chains.end());
  if (Status s = R.ReadyToAppend(chains); !s.ok()) return Fail(s);
  auto lw_url = LakewriterUrl(c);
  if (!lw_url.ok()) return Fail(lw_url.status());
  auto lw = db::Conn::Connect(*lw_url);
  if (!lw.ok()) return Fail(lw.status());
  if (!a.opts.objects) {
    if (Status s = open_buckets(); !s.ok()) return Fail(s);
  }
  reconcile::RepairDeps deps;
  deps.journal = R.journal.get();
  deps.lakewriter = &*lw;
  deps.reader = &*conn;
  deps.quarantine = quarantine.get();
  deps.bodies = bodies.get();
  deps.lake_root = c.lake_root;
  deps.stream = a.opts.stream;
  auto repaired = reconcile::Repair(*report, deps);
  if (!repaired.ok()) return Fail(repaired.status());
  RecordReconcile(*conn, *report, a, static_cast<int64_t>(repaired->actions.size()));
  bool all_ok = repaired->left.empty();
  for (const auto& act : repaired->actions) {
    all_ok = all_ok && act.ok;
    log::Info("reconcile repair", {{"action", act.action}, {"class", act.cls}, {"table", act.table},
                                   {"tenant", act.tenant}, {"event_seq", act.event_seq}, {"ok", act.ok},
                                   {"outcome", act.outcome}});
  }
  if (a.json) {
    json out = report->ToJson();
    out["repair"] = repaired->ToJson();
    std::cout << out.dump() << "\n";
  } else {
    std::cout << report->ToText() << repaired->ToText();
  }
  return all_ok ? kExitOk : kExitVerifyFailed;
}

class ProgressBar {
 public:
  explicit ProgressBar(bool on) : on_(on) {}
  void Update(int64_t done, int64_t total) {
    if (!on_) return;
    int pct = total > 0 ? static_cast<int>(done * 100 / total) : 100;
    int filled = pct * 30 / 100;
    std::fprintf(stderr, "\rverify [%.*s%*s] %3d%% %lld/%lld", filled, "##############################",
                 30 - filled, "", pct, static_cast<long long>(done), static_cast<long long>(total));
    std::fflush(stderr);
  }
  void Done() {
    if (on_) std::fprintf(stderr, "\n");
  }

 private:
  bool on_;
};

int Main(int argc, char** argv) {
  CLI::App app{"oml: the storage core of a reviewed memory system (commit point, lake, attachments)"};
  app.require_subcommand(1);
  auto loaded = LoadConfig();
  if (!loaded.ok()) return Fail(loaded.status());
  Config cfg = *loaded;
  log::Init(cfg.log_level);

  auto* dev = app.add_subcommand("dev", "local profile: private PostgreSQL under $OML_HOME/pg, keys, genesis, API");
  auto* serve = app.add_subcommand("serve", "serve the HTTP API (production: connect as oml_app)");
  bool reduced_durability = false;
  serve->add_flag("--reduced-durability", reduced_durability,
                  "accept writes without synchronous quorum replication (reported by /v1/health and /metrics)");

  auto* witness = app.add_subcommand("witness", "a C2SP tlog-witness: cosign checkpoints consistent with the last one cosigned");
  std::string witness_listen = "127.0.0.1:8473", witness_key, witness_name, witness_state;
  std::vector<std::string> witness_logs;
  witness->add_option("--listen", witness_listen, "HOST:PORT (default 127.0.0.1:8473; port 0 picks one)");
  witness->add_option("--key", witness_key, "the witness's Ed25519 key, PKCS#8 PEM; created if missing")->required();
  witness->add_option("--name", witness_name, "the witness's key name, e.g. witness.example.com/w1")->required();
  std::vector<std::string> witness_deployments;
  witness->add_option("--log", witness_logs,
                      "verifier key of a log to witness; its key name is the log's origin (repeatable)");
  witness->add_option("--deployment", witness_deployments,
                      "verifier key of an oml deployment (`oml key public --witness-vkey`): witness every chain "
                      "\"<its name>/<tenant>\" it signs (repeatable)");
  witness->add_option("--state", witness_state, "directory of the witness's durable state")->required();

  auto* migrate = app.add_subcommand("migrate", "create roles and apply schema migrations as an administrator");
  std::string admin_url, app_password_file, lakewriter_password_file, reconciler_password_file, argv_password;
  migrate->add_option("--admin-url", admin_url, "libpq URL of an administrator (superuser or CREATEROLE)")->required();
  migrate->add_option("--app-password-file", app_password_file,
                      "file whose first line is the password to set on the oml_app login role "
                      "(else $OML_APP_PASSWORD; else no password is set)");
  migrate->add_option("--lakewriter-password-file", lakewriter_password_file,
                      "file whose first line is the password to set on the oml_lakewriter login role "
                      "(else $OML_LAKEWRITER_PASSWORD; else no password is set)");
  migrate->add_option("--reconciler-password-file", reconciler_password_file,
                      "file whose first line is the password to set on the oml_reconciler login role "
                      "(else $OML_RECONCILER_PASSWORD; else no password is set)");
  // Removed: a password on the command line is readable by every local user. Still parsed, so
  // that it is refused with the alternatives instead of "unknown option".
  migrate->add_option("--app-password", argv_password)->group("");

  auto* kek = app.add_subcommand("kek", "key encryption keys (the KEK wraps every claim's DEK)");
  kek->require_subcommand(1);
  auto* kek_generate = kek->add_subcommand("generate", "create a new random KEK file (mode 0600; refuses to overwrite)");
  std::string kek_generate_file;
  kek_generate->add_option("file", kek_generate_file, "where to write the KEK")->required();
  auto* kek_rotate = kek->add_subcommand(
      "rotate", "re-wrap every DEK under a new KEK, in batches (resumable), then journal kek.rotated");
  std::string new_kek_file;
  std::vector<std::string> old_kek_files;
  int kek_batch = 500;
  kek_rotate->add_option("--new-kek-file", new_kek_file, "the new KEK (e.g. from `oml kek generate`)")->required();
  kek_rotate->add_option("--old-kek-file", old_kek_files,
                         "a KEK to re-wrap from, besides kek_file and previous_kek_file (repeatable)");
  kek_rotate->add_option("--batch-size", kek_batch, "DEKs per transaction (default 500)")->check(CLI::PositiveNumber);

  auto* kek_purge = kek->add_subcommand(
      "purge-residue",
      "rewrite the tables holding wrapped DEKs (VACUUM FULL, then CHECKPOINT) so that keys shredded by erasures, "
      "ended uploads or a rotation leave no old row version behind; locks each table while it is rewritten");
  std::string purge_admin_url;
  kek_purge->add_option("--admin-url", purge_admin_url,
                        "libpq URL of the schema owner or a superuser (default: the local profile's superuser.url)");

  auto* cursor_secret = app.add_subcommand("cursor-secret", "the HMAC secret of recall cursors (cursor_secret_file)");
  cursor_secret->require_subcommand(1);
  auto* cursor_secret_generate = cursor_secret->add_subcommand(
      "generate", "create a new cursor secret file with one random key (mode 0600; refuses to overwrite)");
  std::string cursor_secret_file;
  cursor_secret_generate->add_option("file", cursor_secret_file, "where to write it")->required();

  auto* init = app.add_subcommand("init", "provider chain genesis, key.issued, empty lake tables (idempotent)");

  auto* cluster = app.add_subcommand("cluster", "the local profile's private PostgreSQL cluster");
  cluster->require_subcommand(1);
  auto* cluster_start = cluster->add_subcommand("start", "initdb if needed, start, migrate; prints the superuser URL");
  auto* cluster_stop = cluster->add_subcommand("stop", "stop the cluster");

  auto* tenant = app.add_subcommand("tenant", "tenants");
  tenant->require_subcommand(1);
  auto* tenant_create = tenant->add_subcommand("create", "journal tenant.created and open the tenant's chain");
  std::string tenant_name;
  tenant_create->add_option("name", tenant_name, "tenant name ([a-z0-9][a-z0-9_-]*)")->required();
  auto* tenant_list = tenant->add_subcommand("list", "list tenants");

  auto* key = app.add_subcommand("key", "API keys and the deployment signing key");
  key->require_subcommand(1);
  auto* key_create = key->add_subcommand("create", "create an API key and print it (shown once)");
  std::string key_tenant, key_role, key_principal;
  key_create->add_option("--tenant", key_tenant, "tenant name or id")->required();
  key_create->add_option("--role", key_role, "writer | reviewer | admin")->required();
  key_create->add_option("--principal", key_principal,
                         "principal name (default: <role>:<key id>, the key's own: keys share own work and served "
                         "files only through a principal given to both)");
  auto* key_revoke = key->add_subcommand("revoke", "journal api_key.revoked; writes with the token fail at once, reads within 10 s");
  std::string key_id, key_reason;
  key_revoke->add_option("--tenant", key_tenant, "tenant name or id")->required();
  key_revoke->add_option("key_id", key_id, "ak_... (from `oml key list`, or the api_key.created event)")->required();
  key_revoke->add_option("--reason", key_reason, "recorded in the event");
  auto* key_list = key->add_subcommand("list", "list a tenant's API keys (JSON lines; never the tokens)");
  key_list->add_option("--tenant", key_tenant, "tenant name or id")->required();
  auto* key_rotate = key->add_subcommand("rotate", "journal key.issued for a new signing key and install it");
  auto* key_public = key->add_subcommand("public", "print the deployment public key (JSON)");
  bool key_public_witness_vkey = false;
  key_public->add_flag("--witness-vkey", key_public_witness_vkey,
                       "print its note verifier key under tlog_origin instead (for `oml witness --deployment`)");

  auto* verify = app.add_subcommand("verify", "verify every chain from genesis; exit 3 on the first bad seq per tenant");
  std::string verify_tenant, verify_root;
  int verify_threads = 0;
  verify->add_option("--root-key", verify_root, "the deployment's first public key (default: <signing key>.root.pub)");
  verify->add_option("--tenant", verify_tenant, "only this tenant (name or id)");
  verify->add_option("--threads", verify_threads, "threads checking signatures (default: all cores)");
  std::string verify_seen;
  verify->add_option("--seen-checkpoints", verify_seen,
                     "directory of the checkpoints earlier runs verified, one file per chain: each must still be the "
                     "chain's tree (default <home>/verify/checkpoints)");
  bool verify_folds = false;
  verify->add_flag("--folds", verify_folds, "then recompute the fold tables from the chains and report every difference");
  bool verify_from_lake = false;
  verify->add_flag("--from-lake", verify_from_lake,
                   "read the chains from the lake's bronze/events (lake_root), nothing from PostgreSQL");
  verify->get_option("--from-lake")->excludes(verify->get_option("--folds"));
  int64_t verify_lag_grace = 60;
  verify->add_option("--lag-grace", verify_lag_grace,
                     "with --from-lake: seconds a published head may be ahead of the lake before the lake's "
                     "chain counts as short (default 60)")
      ->check(CLI::NonNegativeNumber)
      ->needs(verify->get_option("--from-lake"));

  auto* verify_receipt = app.add_subcommand("verify-receipt", "check a receipt offline with the deployment public key");
  std::string receipt_file, public_key_file;
  verify_receipt->add_option("file", receipt_file, "receipt JSON (or a 201 response containing \"receipt\")")->required();
  verify_receipt->add_option("--public-key", public_key_file, "public key file (default: <signing key>.pub)");
  std::string receipt_proof_file, receipt_origin;
  verify_receipt->add_option("--proof", receipt_proof_file,
                             "also check this C2SP tlog-proof (GET /v1/proofs/inclusion?seq=N): the receipt's event "
                             "is in the signed checkpoint it carries");
  verify_receipt->add_option("--origin", receipt_origin, "the deployment's tlog_origin (default: the setting's)")
      ->needs(verify_receipt->get_option("--proof"));
  std::string checkpoint_key_file;
  verify_receipt
      ->add_option("--checkpoint-key", checkpoint_key_file,
                   "public key file of the key that signed the proof's checkpoint (default: the receipt's, "
                   "--public-key; after a key rotation, the newer key)")
      ->needs(verify_receipt->get_option("--proof"));
  auto* verify_consistency = app.add_subcommand(
      "verify-consistency", "check offline, in O(log n), that a newer checkpoint extends an older one");
  std::string consistency_old, consistency_proof;
  std::vector<std::string> consistency_witnesses;
  verify_consistency->add_option("old", consistency_old, "the older checkpoint (a signed note, as published)")->required();
  verify_consistency
      ->add_option("--proof", consistency_proof,
                   "GET /v1/proofs/consistency?from=<old size>'s answer (JSON: from, to, hashes, checkpoint)")
      ->required();
  verify_consistency->add_option("--public-key", public_key_file, "public key file (default: <signing key>.pub)");
  std::string consistency_old_key;
  verify_consistency->add_option("--old-key", consistency_old_key,
                                 "public key file of the key that signed the older checkpoint (default: --public-key; "
                                 "after a key rotation, the retired key)");
  verify_consistency->add_option("--witness", consistency_witnesses,
                                 "cosignature/v1 verifier key of a witness that must have cosigned the newer "
                                 "checkpoint (repeatable)");
  auto* canonicalize = app.add_subcommand(
      "canonicalize", "stdin: one JSON document per line; stdout: hex of its RFC 8785 bytes, or `error: <why>`");

  auto* erase = app.add_subcommand("erase", "crypto-shred a claim: destroy its DEK and journal artifact.erased");
  std::string erase_tenant, erase_id, erase_reason;
  erase->add_option("--tenant", erase_tenant, "tenant name or id")->required();
  erase->add_option("artifact_id", erase_id)->required();
  erase->add_option("--reason", erase_reason, "recorded in the event");

  auto* doctor = app.add_subcommand("doctor", "explain the deployment's state: database, schema, forks, durability");

  auto* lakewriter = app.add_subcommand(
      "lakewriter", "drain the outbox into the Delta lake (one writer per stream holds the lease; others wait as standby)");
  std::string lw_stream = lake::kDefaultStream;
  bool lw_once = false, lw_bypass_lease = false;
  int64_t lw_max_rows = 10000;
  int lw_poll_ms = 200;
  int lw_min_batch_ms = 150;
  int lw_gold_every_ms = 10000;
  int lw_nice = 5;
  int lw_compact_every = 100;
  int lw_compact_target_mb = 128;
  int64_t lw_vacuum_every_s = 6 * 3600;
  int64_t lw_vacuum_retention_h = 7 * 24;
  int64_t lw_prune_every_s = 300;
  int64_t lw_outbox_retention_h = 7 * 24;
  int lw_prune_batch = 10000;
  lakewriter->add_option("--stream", lw_stream, "outbox stream (default: default)");
  lakewriter->add_flag("--once", lw_once, "drain up to the stable horizon found at start, then exit 0");
  lakewriter->add_option("--max-rows", lw_max_rows, "outbox rows per batch at most (default 10000)")
      ->check(CLI::PositiveNumber);
  lakewriter->add_option("--compact-every", lw_compact_every,
                         "OPTIMIZE a table after this many commits to it (default 100; 0: never)")
      ->check(CLI::Range(0, 1000000));
  lakewriter->add_option("--compact-target-mb", lw_compact_target_mb,
                         "compaction bin-packs files smaller than this into files of about this size "
                         "(MiB, default 128)")
      ->check(CLI::Range(1, 1 << 20));
  lakewriter->add_option("--vacuum-every", lw_vacuum_every_s,
                         "VACUUM every table this often, in seconds, while holding the lease (default 21600; 0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{366} * 86400));
  lakewriter->add_option("--vacuum-retention-hours", lw_vacuum_retention_h,
                         "VACUUM deletes only files removed from the log (or never in it) longer ago than this "
                         "(1..168, default 168: readers of any version of the last 7 days find their files; a "
                         "checkpoint forgets older tombstones)")
      ->check(CLI::Range(int64_t{1}, int64_t{168}));
  lakewriter->add_option("--prune-every", lw_prune_every_s,
                         "prune the outbox this often, in seconds, while holding the lease (default 300; 0: never); "
                         "--once prunes once after it drained")
      ->check(CLI::Range(int64_t{0}, int64_t{366} * 86400));
  lakewriter->add_option("--outbox-retention-hours", lw_outbox_retention_h,
                         "prune only outbox rows at or below the frontier enqueued longer ago than this "
                         "(0..8784, default 168; 0: every row the lake holds)")
      ->check(CLI::Range(int64_t{0}, int64_t{8784}));
  lakewriter->add_option("--prune-batch", lw_prune_batch, "outbox rows deleted per transaction (default 10000)")
      ->check(CLI::Range(1, 1000000));
  lakewriter->add_option("--poll-ms", lw_poll_ms, "horizon poll interval when idle (default 200)")
      ->check(CLI::Range(1, 60000));
  lakewriter->add_option("--min-batch-ms", lw_min_batch_ms,
                         "start batches at most this often when keeping up (default 150; a backlog drains "
                         "without waiting)")
      ->check(CLI::Range(0, 60000));
  lakewriter->add_option("--gold-every-ms", lw_gold_every_ms,
                         "let gold/daily_activity trail the frontier by up to this long while batches keep coming "
                         "(default 10000; 0: gold commits with every batch; it catches up when the writer is idle; "
                         "not used by --once)")
      ->check(CLI::Range(0, 600000));
  lakewriter->add_option("--nice", lw_nice,
                         "lower the writer's CPU priority by this much (0..19, default 5): the commit point keeps "
                         "the CPU when both want it; compaction threads run at nice 10, or at this if it is higher")
      ->check(CLI::Range(0, 19));
  // TEST ONLY (tests/test_lakewriter.py): run without the lease, so that two writers race on
  // purpose and only the Delta commit conflict fences them. Hidden from --help.
  lakewriter->add_flag("--test-bypass-lease", lw_bypass_lease)->group("");

  auto* lake_cmd = app.add_subcommand("lake", "read or rebuild the Delta lake");
  auto* lake_tail = lake_cmd->add_subcommand(
      "tail", "the last rows of bronze/events as JSON lines (signed bytes and signature left out); reads the whole "
              "table: for the local profile and small lakes");
  int64_t tail_n = 10;
  std::string tail_tenant;
  lake_tail->add_option("-n,--rows", tail_n, "rows to show (default 10)")->check(CLI::PositiveNumber);
  lake_tail->add_option("--tenant-id", tail_tenant, "only this tenant's rows (tenant uuid)");
  auto* lake_rebuild = lake_cmd->add_subcommand(
      "rebuild", "empty a lake table and let the lake writer refill it from the outbox, exactly once, while it runs");
  std::string rebuild_table, rebuild_stream = lake::kDefaultStream;
  int64_t rebuild_wait = 0;
  lake_rebuild->add_option("--table", rebuild_table, "bronze/events, silver/claims or gold/daily_activity")
      ->required();
  lake_rebuild->add_option("--stream", rebuild_stream, "outbox stream (default: default)");
  lake_rebuild->add_option("--wait", rebuild_wait,
                           "then wait up to this many seconds until the lake writer refilled it (default 0: "
                           "do not wait)")
      ->check(CLI::NonNegativeNumber);
  lake_cmd->require_subcommand(1);

  auto* dead_letter = app.add_subcommand("dead-letter", "outbox rows the lake writer moved aside (materialize-skipped)");
  std::string dl_stream = lake::kDefaultStream;
  bool dl_json = false;
  int64_t dl_id = 0;
  auto* dl_list = dead_letter->add_subcommand("list", "every dead letter of the stream, oldest first");
  dl_list->add_option("--stream", dl_stream, "outbox stream (default: default)");
  dl_list->add_flag("--json", dl_json, "JSON lines instead of a table");
  auto* dl_requeue = dead_letter->add_subcommand(
      "requeue", "enqueue a dead letter's row again, through a journalled materialize-requeued event (once)");
  dl_requeue->add_option("ID", dl_id, "dead letter id (oml dead-letter list)")->required()->check(CLI::PositiveNumber);
  dl_requeue->add_option("--stream", dl_stream, "outbox stream (default: default)");
  dead_letter->require_subcommand(1);

  auto* status = app.add_subcommand(
      "status", "where the lake writer stands: frontier, stable horizon, lag, what holds it back, txn versions, dead letters");
  std::string status_stream = lake::kDefaultStream;
  bool status_json = false;
  status->add_option("--stream", status_stream, "outbox stream (default: default)");
  status->add_flag("--json", status_json, "one JSON object instead of text");

  auto* reconcile_cmd = app.add_subcommand(
      "reconcile",
      "audit the lake and the buckets against the signed journal, key-less; exit 0 clean, 3 findings, 4 access error");
  ReconcileArgs rc_args;
  reconcile_cmd->add_flag("--json", rc_args.json, "one JSON object: findings and a summary");
  reconcile_cmd->add_option("--tenant", rc_args.opts.only_tenant, "audit one tenant (uuid)");
  reconcile_cmd->add_option("--stream", rc_args.opts.stream, "outbox stream (default: default)");
  reconcile_cmd->add_option("--stale-after", rc_args.stale_after_s,
                            "seconds of lake writer lag that make a stale-frontier finding (default 300)")
      ->check(CLI::NonNegativeNumber);
  reconcile_cmd->add_option("--object-grace", rc_args.object_grace_s,
                            "seconds an object must be old before it counts as orphan, stale or misplaced "
                            "(default 3600: writes in progress are not findings)")
      ->check(CLI::NonNegativeNumber);
  reconcile_cmd->add_flag("--no-objects", rc_args.no_objects, "compare the lake only, not the buckets");
  reconcile_cmd->add_option("--since", rc_args.since,
                            "compare only what events committed since then left in the lake and the buckets: an RFC "
                            "3339 time, or an age such as 36h or 7d (from the start of its UTC day; bronze is still "
                            "read whole; no orphan search)");
  reconcile_cmd->add_flag("--full", rc_args.opts.full,
                          "re-read everything; without it a run starts from the newest clean run's checkpoint and "
                          "reads only what changed since (docs/operations/reconcile.md)");
  reconcile_cmd->add_option("--page-rows", rc_args.opts.page_rows,
                            "journal events per fetch (default 4096; a few pages are in memory at once)")
      ->check(CLI::Range(1, 1 << 20));
  reconcile_cmd->add_option("--metrics-file", rc_args.metrics_file,
                            "also write the run's metrics here, in Prometheus text (for node_exporter's textfile "
                            "collector): oml_reconcile_findings{class}, oml_reconcile_last_run_timestamp_seconds, ...");
  reconcile_cmd->add_flag("--repair", rc_args.repair,
                          "then repair what was found, each group journalled as a signed lake.repair event first "
                          "(loads the signing key, never a KEK); exit 0 when everything found was repaired or is "
                          "being refilled");

  // `oml claim submit` (cli/claim_submit.h): an HTTP client of a running server.
  ClaimSubmitOptions claim_opts;
  auto* claim_submit = AddClaimSubmit(app, &claim_opts);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  if (*claim_submit) return RunClaimSubmit(cfg, claim_opts);  // no database, keys or store: HTTP only

  if (*dev || *serve) {
    // Before any thread exists, so every thread inherits the mask and only sigwait sees them.
    (void)BlockStopSignals();
  }
  if (*dev) {
    Status s = Dev(cfg);
    return s.ok() ? 0 : Fail(s);
  }
  if (*witness) {
    Status s = Witness(witness_listen, witness_key, witness_name, witness_logs, witness_deployments, witness_state);
    return s.ok() ? 0 : Fail(s);
  }
  if (*serve) {
    if (reduced_durability) cfg.reduced_durability = true;
    Status s = Serve(cfg, nullptr);
    return s.ok() ? 0 : Fail(s);
  }
  if (*migrate) {
    if (migrate->count("--app-password") > 0)
      return Fail(InvalidArgument(
          "--app-password is no longer accepted: a password on the command line is visible to every local user "
          "in the process table. Use --app-password-file FILE or the environment variable OML_APP_PASSWORD "
          "(and consider changing the password you just passed)"));
    auto pw = RolePassword(app_password_file, "OML_APP_PASSWORD", "app");
    if (!pw.ok()) return Fail(pw.status());
    auto lw_pw = RolePassword(lakewriter_password_file, "OML_LAKEWRITER_PASSWORD", "lakewriter");
    if (!lw_pw.ok()) {
      crypto::Wipe(&*pw);
      return Fail(lw_pw.status());
    }
    auto rc_pw = RolePassword(reconciler_password_file, "OML_RECONCILER_PASSWORD", "reconciler");
    if (!rc_pw.ok()) {
      crypto::Wipe(&*pw);
      crypto::Wipe(&*lw_pw);
      return Fail(rc_pw.status());
    }
    db::MigrateOptions opts{*pw, *lw_pw, *rc_pw};  // copies, not moves: a moved-from short string keeps its bytes
    Status s = DoMigrate(admin_url, opts);
    for (std::string* secret : {&*pw, &*lw_pw, &*rc_pw, &opts.app_password, &opts.lakewriter_password,
                                &opts.reconciler_password})
      crypto::Wipe(secret);
    return s.ok() ? 0 : Fail(s);
  }
  if (*kek_purge) {
    std::string url = purge_admin_url;
    if (url.empty()) {
      if (!fs::exists(PgDir(cfg) + "/superuser.url"))
        return Fail(InvalidArgument("give --admin-url (no local profile superuser.url under " + PgDir(cfg) + ")"));
      url = ReadFile(PgDir(cfg) + "/superuser.url");
    }
    Status s = DoPurgeKeyResidue(url);
    return s.ok() ? 0 : Fail(s);
  }
  if (*kek_generate) {
    Status s = crypto::FileKekProvider::Generate(kek_generate_file);
    if (!s.ok()) return Fail(s);
    auto k = crypto::FileKekProvider::Load(kek_generate_file, cfg.allow_insecure_key_files);
    if (!k.ok()) return Fail(k.status());
    std::cout << json{{"file", kek_generate_file}, {"kek_id", (*k)->kek_id()}}.dump() << "\n";
    return 0;
  }
  if (*cursor_secret_generate) {
    Status s = crypto::HmacKeyRing::GenerateFile(cursor_secret_file);
    if (!s.ok()) return Fail(s);
    auto ring = crypto::HmacKeyRing::LoadFile(cursor_secret_file, cfg.allow_insecure_key_files);
    if (!ring.ok()) return Fail(ring.status());
    std::cout << json{{"file", cursor_secret_file}, {"key_id", ring->signing_key_id()}}.dump() << "\n";
    return 0;
  }
  if (*cluster) {
    db::LocalCluster lc(PgDir(cfg));
    if (*cluster_start) {
      Status s = lc.Start();
      if (s.ok()) {
        auto admin = db::Conn::Connect(lc.SuperuserUrl());
        s = admin.ok() ? db::Migrate(*admin, {}).status() : admin.status();
      }
      if (!s.ok()) return Fail(s);
      std::cout << lc.SuperuserUrl() << "\n";
      return 0;
    }
    if (*cluster_stop) {
      Status s = lc.Stop();
      return s.ok() ? 0 : Fail(s);
    }
  }
  if (*init) {
    Status s = DoInit(cfg, false);
    return s.ok() ? 0 : Fail(s);
  }
  if (*lakewriter) {
    lake::LakeWriterOptions o;
    o.stream = lw_stream;
    o.max_rows = lw_max_rows;
    o.poll_every = std::chrono::milliseconds(lw_poll_ms);
    o.min_batch_interval = std::chrono::milliseconds(lw_min_batch_ms);
    o.gold_every = std::chrono::milliseconds(lw_gold_every_ms);
    o.compact_every = lw_compact_every;
    o.compact_target_bytes = static_cast<uint64_t>(lw_compact_target_mb) << 20;
    o.vacuum_every = std::chrono::seconds(lw_vacuum_every_s);
    o.vacuum_retention_hours = lw_vacuum_retention_h;
    o.prune_every = std::chrono::seconds(lw_prune_every_s);
    o.outbox_retention_hours = lw_outbox_retention_h;
    o.prune_batch = lw_prune_batch;
    o.bypass_lease = lw_bypass_lease;
    if (Status niced = LowerPriority(lw_nice); !niced.ok()) return Fail(niced);
    Status s = RunLakewriter(cfg, std::move(o), lw_once);
    return s.ok() ? 0 : Fail(s);
  }
  if (*lake_rebuild) {
    Status s = LakeRebuild(cfg, rebuild_stream, rebuild_table, rebuild_wait);
    return s.ok() ? 0 : Fail(s);
  }
  if (*lake_tail) {
    Status s = LakeTail(cfg, tail_n, tail_tenant);
    return s.ok() ? 0 : Fail(s);
  }
  if (*reconcile_cmd) return RunReconcile(cfg, rc_args);
  if (*status) {
    Status s = ShowStatus(cfg, status_stream, status_json);
    return s.ok() ? 0 : Fail(s);
  }
  if (*key_public) {
    auto k = crypto::SigningKey::LoadFile(cfg.signing_key_file, cfg.allow_insecure_key_files);
    if (!k.ok()) return Fail(k.status());
    // --witness-vkey: what `oml witness --deployment` takes to witness every chain's checkpoints
    // (the key's note verifier key under the deployment origin, tlog_origin).
    if (key_public_witness_vkey) {
      std::cout << tlog::EncodeVerifierKey(tlog::MakeNoteKey(cfg.tlog_origin, k->public_key())) << "\n";
      return 0;
    }
    std::cout << json{{"key_id", k->key_id()}, {"public_key", crypto::Base64(k->public_key())}}.dump() << "\n";
    return 0;
  }
  if (*canonicalize) {  // no database or keys: a pure filter, for cross-checking other implementations
    bool all_ok = true;
    for (std::string line; std::getline(std::cin, line);) {
      auto v = journal::ParseRfc8785Input(line);
      auto bytes = v.ok() ? journal::CanonicalizeRfc8785(*v) : Result<std::string>(v.status());
      if (bytes.ok()) {
        std::cout << crypto::Hex(*bytes) << "\n";
      } else {
        all_ok = false;
        std::cout << "error: " << bytes.status().message() << "\n";
      }
    }
    std::cout.flush();
    return all_ok ? kExitOk : kExitUsage;
  }
  if (*verify_receipt) {
    std::string text = ReadFile(receipt_file);
    auto j = json::parse(text, nullptr, false);
    if (j.is_discarded()) return Fail(InvalidArgument(receipt_file + " is not JSON"));
    if (j.contains("receipt")) j = j["receipt"];
    auto r = journal::Receipt::FromJson(j);
    if (!r.ok()) return Fail(r.status());
    auto pub = ReadPublicKey(public_key_file.empty() ? PublicKeyFile(cfg) : public_key_file);
    if (!pub.ok()) return Fail(pub.status());
    Status s = journal::VerifyReceipt(*r, *pub);
    if (!s.ok()) {
      std::cout << "receipt INVALID: " << s.message() << "\n";
      return kExitVerifyFailed;
    }
    std::cout << "receipt OK: tenant " << r->tenant << " seq " << r->seq << " event_hash " << crypto::Hex(r->event_hash)
              << " signed by " << r->key_id << "\n";
    if (receipt_proof_file.empty()) return 0;
    // The inclusion proof: leaf seq - 1 of the tenant's tree, under a checkpoint signed by the
    // same key, whose note key name is the checkpoint origin "<tlog_origin>/<tenant>".
    const std::string origin = journal::CheckpointOrigin(receipt_origin.empty() ? cfg.tlog_origin : receipt_origin, r->tenant);
    auto proof_text = ReadExactFile(receipt_proof_file, 1 << 20);
    if (!proof_text.ok()) return Fail(proof_text.status());
    std::string checkpoint_pub = *pub;
    if (!checkpoint_key_file.empty()) {
      auto k = ReadPublicKey(checkpoint_key_file);
      if (!k.ok()) return Fail(k.status());
      checkpoint_pub = *k;
    }
    auto c = tlog::VerifyTlogProof(*proof_text, r->signed_bytes, static_cast<uint64_t>(r->seq - 1),
                                   tlog::MakeNoteKey(origin, checkpoint_pub), origin);
    if (!c.ok()) {
      std::cout << "proof INVALID: " << c.status().message() << "\n";
      return kExitVerifyFailed;
    }
    std::cout << "inclusion OK: seq " << r->seq << " is leaf " << r->seq - 1 << " of the checkpoint " << origin << " size "
              << c->size << " root " << crypto::Hex(c->root) << "\n";
    return 0;
  }

  if (*verify_consistency) {
    auto pub = ReadPublicKey(public_key_file.empty() ? PublicKeyFile(cfg) : public_key_file);
    if (!pub.ok()) return Fail(pub.status());
    auto old_note = ReadExactFile(consistency_old, tlog::kMaxNoteBytes);
    if (!old_note.ok()) return Fail(old_note.status());
    auto answer = ReadExactFile(consistency_proof, 1 << 20);
    if (!answer.ok()) return Fail(answer.status());
    std::vector<tlog::NoteKey> cosigners;
    for (const auto& v : consistency_witnesses) {
      auto k = tlog::ParseVerifierKey(v);
      if (!k.ok()) return Fail(k.status());
      cosigners.push_back(std::move(*k));
    }
    // The answer: {"from": M, "to": N, "hashes": [base64...], "checkpoint": note}.
    auto j = json::parse(*answer, nullptr, false);
    const auto invalid = [](const std::string& why) {
      std::cout << "consistency INVALID: " << why << "\n";
      return kExitVerifyFailed;
    };
    if (j.is_discarded() || !j.is_object() || !j.contains("from") || !j["from"].is_number_unsigned() ||
        !j.contains("to") || !j["to"].is_number_unsigned() || !j.contains("hashes") || !j["hashes"].is_array() ||
        !j.contains("checkpoint") || !j["checkpoint"].is_string())
      return invalid(consistency_proof + " is not a /v1/proofs/consistency answer (from, to, hashes, checkpoint)");
    std::vector<std::string> hashes;
    for (const auto& h : j["hashes"]) {
      auto raw = h.is_string() ? crypto::FromBase64(h.get<std::string>()) : Result<std::string>(InvalidArgument(""));
      if (!raw.ok() || raw->size() != 32 || hashes.size() == 64) return invalid("a proof hash is not the base64 of 32 bytes");
      hashes.push_back(std::move(*raw));
    }
    const std::string new_note = j["checkpoint"].get<std::string>();
    auto old_cp = tlog::ParseCheckpointNote(*old_note);
    auto new_cp = tlog::ParseCheckpointNote(new_note);
    if (old_cp.ok() && old_cp->size != j["from"].get<uint64_t>())
      return invalid("the proof is from size " + std::to_string(j["from"].get<uint64_t>()) + ", the old checkpoint's is " +
                     std::to_string(old_cp->size));
    if (new_cp.ok() && new_cp->size != j["to"].get<uint64_t>())
      return invalid("the proof is to size " + std::to_string(j["to"].get<uint64_t>()) + ", its checkpoint's is " +
                     std::to_string(new_cp->size));
    std::string old_pub;
    if (!consistency_old_key.empty()) {
      auto k = ReadPublicKey(consistency_old_key);
      if (!k.ok()) return Fail(k.status());
      old_pub = *k;
    }
    auto c = tlog::VerifyCheckpointConsistency(*old_note, new_note, hashes, *pub, cosigners, old_pub);
    if (!c.ok()) return invalid(c.status().message());
    std::cout << "consistency OK: " << c->origin << " size " << old_cp->size << " -> " << c->size << " ("
              << hashes.size() << " hashes) root " << crypto::Hex(c->root) << "\n";
    return 0;
  }

  // The options both verify modes share: tenant filter, threads, the root key (or a warning
  // naming where the first key.issued is trusted from), the published heads and a progress bar.
  std::unique_ptr<blob::ObjectStore> heads_store;
  auto verify_options = [&](ProgressBar& bar, const char* source) -> Result<journal::VerifyOptions> {
    journal::VerifyOptions vo;
    vo.only_tenant = verify_tenant;
    vo.threads = verify_threads;
    std::string root_file = verify_root.empty() ? RootKeyFile(cfg) : verify_root;
    if (!verify_root.empty() || fs::exists(root_file)) {
      OML_ASSIGN_OR_RETURN(vo.root_public_key, ReadPublicKey(root_file));
    } else {
      std::cerr << "warning: no root key (" << root_file << "): trusting the first key.issued in the " << source << "\n";
    }
    // Every profile has a heads store: chains are compared with their published signed heads.
    OML_ASSIGN_OR_RETURN(heads_store, blob::OpenObjectStore(cfg.object_store_url));
    vo.heads = heads_store.get();
    vo.checkpoints = true;
    vo.seen_checkpoints_dir = verify_seen.empty() ? cfg.home + "/verify/checkpoints" : verify_seen;
    vo.prefix_lag_grace = std::chrono::seconds(verify_lag_grace);
    vo.progress = [&bar](int64_t d, int64_t t) { bar.Update(d, t); };
    return vo;
  };

  if (*verify && verify_from_lake) {
    // The same chain checks over bronze/events (lake/verify_lake.h); PostgreSQL is not opened.
    // The published heads (object store) are still compared where the lake holds their seq.
    ProgressBar bar(isatty(2));
    auto vo_or = verify_options(bar, "lake");
    if (!vo_or.ok()) return Fail(vo_or.status());
    journal::VerifyOptions vo = std::move(vo_or).value();
    auto t0 = std::chrono::steady_clock::now();
    auto rep = lake::VerifyChainsFromLake(cfg.lake_root, vo);
    bar.Done();
    if (!rep.ok()) return Fail(rep.status());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const journal::VerifyReport& chains = rep->chains;
    for (const auto& p : chains.problems)
      std::cout << "FAIL tenant " << p.tenant_name << " (" << p.tenant_id << ") seq " << p.seq << ": " << p.what << "\n";
    std::cout << "lake: " << rep->table_uri << " version " << rep->table_version << ", " << rep->rows << " rows\n";
    std::cout << (chains.problems.empty() ? "OK" : "FAILED") << ": " << chains.tenants << " tenants, " << chains.events
              << " events verified in " << secs << " s ("
              << static_cast<int64_t>(chains.events / (secs > 0 ? secs : 1)) << " events/s)\n";
    return chains.problems.empty() ? 0 : kExitVerifyFailed;
  }

  // Everything below talks to the database.
  bool need_key = *tenant_create || *key_rotate || *erase || *key_create || *key_revoke || *kek_rotate || *dl_requeue;
  auto rt = Runtime::Open(cfg, need_key);
  if (!rt.ok()) return Fail(rt.status());
  Runtime& R = **rt;
  // The tenant named by --tenant, resolved once.
  std::optional<journal::TenantInfo> target;
  if (*erase || *key_create || *key_revoke || *key_list) {
    auto t = journal::LookupTenant(*R.pool, *erase ? erase_tenant : key_tenant);
    if (!t.ok()) return Fail(t.status());
    target = *t;
  }
  if (need_key) {
    const std::vector<std::string> chains = {target ? target->tenant_id : std::string(journal::kProviderTenant)};
    if (Status s = R.ReadyToAppend(chains); !s.ok()) return Fail(s);
  }

  if (*tenant_create) {
    auto t = journal::CreateTenant(*R.journal, tenant_name);
    if (!t.ok()) return Fail(t.status());
    std::cout << json{{"tenant_id", t->tenant_id}, {"name", t->name}}.dump() << "\n";
    return 0;
  }
  if (*tenant_list) {
    auto ts = journal::ListTenants(*R.pool);
    if (!ts.ok()) return Fail(ts.status());
    for (const auto& t : *ts) std::cout << t.tenant_id << "  " << t.name << "\n";
    return 0;
  }
  if (*key_create) {
    auto k = journal::CreateApiKey(*R.journal, target->tenant_id, key_principal, key_role);
    if (!k.ok()) return Fail(k.status());
    std::cout << k->token << "\n";  // stdout carries the token alone, for scripts
    std::cerr << "key id " << k->key_id << ", principal " << k->principal << " (api_key.created at seq "
              << k->receipt.seq << ")\n";
    return 0;
  }
  if (*key_revoke) {
    auto rc = journal::RevokeApiKey(*R.journal, target->tenant_id, key_id, key_reason);
    if (!rc.ok()) return Fail(rc.status());
    std::cout << json{{"key_id", key_id}, {"revoked_seq", rc->seq}, {"receipt", rc->ToJson()}}.dump() << "\n";
    return 0;
  }
  if (*key_list) {
    auto keys = journal::ListApiKeys(*R.pool, target->tenant_id);
    if (!keys.ok()) return Fail(keys.status());
    for (const auto& k : *keys) {
      json j{{"key_id", k.key_id}, {"principal", k.principal}, {"role", k.role}, {"created_at", k.created_at},
             {"created_seq", k.created_seq ? json(k.created_seq) : json(nullptr)},
             {"revoked_at", k.revoked_at.empty() ? json(nullptr) : json(k.revoked_at)},
             {"revoked_seq", k.revoked_seq ? json(k.revoked_seq) : json(nullptr)}};
      std::cout << j.dump() << "\n";
    }
    return 0;
  }
  if (*key_rotate) {
    auto nk = crypto::SigningKey::Generate();
    if (!nk.ok()) return Fail(nk.status());
    std::string staged = cfg.signing_key_file + ".new";
    fs::remove(staged);
    if (Status s = nk->SaveFile(staged); !s.ok()) return Fail(s);
    auto rc = journal::IssueKey(*R.journal, *nk);
    if (!rc.ok()) {
      // kUnavailable: the COMMIT may have happened (connection lost, or committed without the
      // standbys' confirmation). The new key may then be the only key in force: keep it.
      if (rc.status().code() == Code::kUnavailable) {
        std::cerr << "oml: the rotation's outcome is unknown (" << rc.status().message() << ").\n"
                  << "  The new key is kept at " << staged << ". If `SELECT oml.key_in_force()` answers "
                  << nk->key_id() << ",\n  move it to " << cfg.signing_key_file
                  << "; otherwise delete it and rotate again.\n";
        return Fail(rc.status());
      }
      fs::remove(staged);
      return Fail(rc.status());
    }
    std::string old_id = R.key->key_id();
    // The retired private key is not kept: nothing needs it (verification uses the public keys
    // journalled by key.issued), and a copy beside the server would let whoever holds it and the
    // database forge backdated events. rename() replaces the old file atomically.
    fs::rename(staged, cfg.signing_key_file);
    (void)WritePublicKey(PublicKeyFile(cfg), *nk);
    std::cout << "key.issued at provider seq " << rc->seq << ": " << nk->key_id() << " replaces " << old_id
              << "\nrunning `oml serve` replicas now refuse writes (503 signing-key-not-in-force) until restarted "
                 "with the new key file " << cfg.signing_key_file << "\n";
    return 0;
  }
  if (*kek_rotate) {
    auto target = crypto::FileKekProvider::Load(new_kek_file, cfg.allow_insecure_key_files);
    if (!target.ok()) return Fail(target.status());
    auto sources = LoadKeks(cfg, old_kek_files);
    if (!sources.ok()) return Fail(sources.status());
    admission::KekRotationOptions ko;
    ko.batch_size = kek_batch;
    auto r = admission::RotateKek(*R.journal, **target, **sources, ko);
    if (!r.ok()) return Fail(r.status());
    json out{{"kek_id", r->kek_id}, {"rewrapped", r->rewrapped}, {"rewrapped_from", r->rewrapped_from},
             {"keys", r->keys}, {"batches", r->batches},
             {"kek_rotated_seq", r->receipt ? json(r->receipt->seq) : json(nullptr)}};
    std::cout << out.dump() << "\n";
    std::cerr << "every DEK is wrapped under " << r->kek_id << " (" << new_kek_file << ").\n"
              << "Make sure every server has kek_file = " << new_kek_file
              << ", then remove previous_kek_file and destroy the old KEK file\n"
              << "(backups taken before this rotation still need the old KEK).\n";
    return 0;
  }
  if (*dl_list) {
    auto h = R.pool->Acquire();
    if (!h.ok()) return Fail(h.status());
    auto all = lake::ListDeadLetters(**h, dl_stream);
    if (!all.ok()) return Fail(all.status());
    if (dl_json) {
      for (const auto& d : *all) std::cout << d.dump() << "\n";
      return 0;
    }
    if (all->empty()) {
      std::cout << "no dead letters in stream " << dl_stream << "\n";
      return 0;
    }
    for (const auto& d : *all) {
      std::cout << "#" << d["id"] << "  outbox seq " << d["outbox_seq"] << "  " << d["target_table"].get<std::string>()
                << "  tenant " << d["tenant_id"].get<std::string>() << " seq " << d["journal_seq"] << "  skipped by seq "
                << d["skipped_seq"] << "  " << d["attempts"] << " attempts  "
                << (d["requeued_at"].is_null() ? std::string("not requeued")
                                               : "requeued as outbox seq " + d["requeued_outbox_seq"].dump())
                << "\n    " << d["error"].get<std::string>() << "\n";
    }
    return 0;
  }
  if (*dl_requeue) {
    auto out = lake::RequeueDeadLetter(*R.journal, dl_stream, dl_id, "operator");
    if (!out.ok()) return Fail(out.status());
    std::cout << json{{"dead_letter_id", dl_id}, {"outbox_seq", out->outbox_seq}, {"receipt", out->receipt.ToJson()}}.dump()
              << "\n";
    return 0;
  }
  if (*erase) {
    auto kek = crypto::FileKekProvider::Load(cfg.kek_file, cfg.allow_insecure_key_files);
    if (!kek.ok()) return Fail(kek.status());
    admission::Claims claims(R.journal.get(), R.pool.get(), kek->get(), cfg.max_body_bytes);
    // Attachments and body objects are shredded and deleted with the claim, as over the API.
    auto quarantine = blob::OpenBucket(cfg, cfg.quarantine_bucket);
    if (!quarantine.ok()) return Fail(quarantine.status());
    auto bodies = blob::OpenBucket(cfg, cfg.bodies_bucket);
    if (!bodies.ok()) return Fail(bodies.status());
    uploads::Uploads uploads(R.pool.get(), kek->get(), quarantine->get(), uploads::Options{});
    admission::AttachmentsOptions attachment_opts;
    attachment_opts.inline_body_max_bytes = cfg.inline_body_max_bytes;
    admission::Attachments attachments(R.pool.get(), R.journal.get(), kek->get(), &uploads, quarantine->get(),
                                       bodies->get(), review::Options{}, attachment_opts);
    claims.set_attachments(&attachments);
    admission::Caller op{target->tenant_id, "operator", "admin", "cli"};
    auto out = claims.Erase(op, erase_id, erase_reason);
    if (!out.ok()) return Fail(out.status());
    std::cout << json{{"artifact_id", erase_id}, {"erased_seq", out->second.seq}, {"receipt", out->second.ToJson()}}.dump()
              << "\n";
    return 0;
  }
  if (*verify) {
    ProgressBar bar(isatty(2));
    auto vo_or = verify_options(bar, "database");
    if (!vo_or.ok()) return Fail(vo_or.status());
    journal::VerifyOptions vo = std::move(vo_or).value();
    // One worker pool for the chain pass's row checks and the folds pass.
    WorkPool checks(verify_threads > 0 ? verify_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    vo.checks = &checks;
    auto t0 = std::chrono::steady_clock::now();
    auto rep = journal::VerifyChains(*R.pool, vo);
    bar.Done();
    if (!rep.ok()) return Fail(rep.status());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& p : rep->problems)
      std::cout << "FAIL tenant " << p.tenant_name << " (" << p.tenant_id << ") seq " << p.seq << ": " << p.what << "\n";
    std::cout << (rep->problems.empty() ? "OK" : "FAILED") << ": " << rep->tenants << " tenants, " << rep->events
              << " events verified in " << secs << " s (" << static_cast<int64_t>(rep->events / (secs > 0 ? secs : 1))
              << " events/s)\n";
    if (!verify_folds) return rep->problems.empty() ? 0 : kExitVerifyFailed;
    // The folds pass (journal/folds.h): artifacts, api_keys, tenants, signing_keys against the chains.
    journal::FoldOptions fo;
    fo.only_tenant = verify_tenant;
    auto f0 = std::chrono::steady_clock::now();
    auto folds = journal::VerifyFolds(*R.pool, checks, fo);
    if (!folds.ok()) return Fail(folds.status());
    double fsecs = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
    for (const auto& d : folds->diffs) std::cout << journal::FormatFoldDiff(d) << "\n";
    std::cout << (folds->diffs.empty() ? "FOLDS OK" : "FOLDS FAILED") << ": " << folds->diffs.size() << " differences; "
              << folds->tenants << " tenants, " << folds->events << " events replayed, " << folds->rows
              << " rows compared in " << fsecs << " s ("
              << static_cast<int64_t>(folds->events / (fsecs > 0 ? fsecs : 1)) << " events/s)\n";
    return rep->problems.empty() && folds->diffs.empty() ? 0 : kExitVerifyFailed;
  }
  if (*doctor) {
    int problems = 0;
    std::cout << "database: reachable, schema version " << db::LatestSchemaVersion() << "\n";
    {
      auto h = R.pool->Acquire();
      if (h.ok()) {
        // The same check as `oml serve`'s write gate (db/durability.h).
        auto r = db::ReadDurabilitySettings(**h);
        if (r.ok()) {
          const db::DurabilityVerdict v = db::EvaluateDurability(*r);
          std::cout << "durability: synchronous_commit=" << r->synchronous_commit << " synchronous_standby_names='"
                    << r->synchronous_standby_names << "' -> "
                    << (v.quorum ? "synchronous quorum replication: the production requirement holds"
                                 : "NOT the production requirement (" + v.detail +
                                       "): a failover can lose acknowledged writes; `oml serve` refuses writes "
                                       "unless run with --reduced-durability (`oml dev`: reduced by definition)")
                    << "\n";
          // The standbys streaming now (sql/0026_sync_standbys.sql): below the quorum, every
          // commit waits for one to return, and `oml serve` answers 503 commit-not-replicated.
          // Counted as a problem only where the requirement holds: otherwise the line above
          // already says what is wrong (and `oml serve` refuses writes, or runs reduced on purpose).
          const db::StandbyCount n = db::ReadStandbyCount(**h, *r);
          if (v.quorum && n.BelowQuorum()) {
            ++problems;
            std::cout << "REPLICATION: below the quorum: " << n.Describe()
                      << ".\n  Every commit waits for a synchronous standby to return (up to "
                         "commit_replication_timeout_ms, then 503 commit-not-replicated); start or repair one.\n";
          } else {
            std::cout << "replication: " << n.HealthValue() << " (" << n.Describe() << ")\n";
          }
        }
        // The database boundary (sql/0017_pinned_search_path.sql): a function whose names a
        // role could shadow from pg_temp is a problem; TEMP still granted is reported only.
        auto b = (*h)->Query(
            "SELECT coalesce((SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1) FROM pg_proc p "
            "  WHERE p.pronamespace = 'oml'::regnamespace AND p.prosqlbody IS NULL "
            "    AND NOT coalesce(p.proconfig @> ARRAY['search_path=oml, pg_catalog, pg_temp'], false)), ''), "
            "has_database_privilege(current_user, current_database(), 'TEMPORARY')");
        if (b.ok()) {
          if (!b->Get(0, 0).empty()) {
            ++problems;
            std::cout << "BOUNDARY: functions without the pinned search_path (oml, pg_catalog, pg_temp): "
                      << b->Get(0, 0) << ".\n  A role could shadow their types or tables from pg_temp; run `oml "
                         "migrate`.\n";
          } else {
            std::cout << "boundary: every oml function pins search_path = oml, pg_catalog, pg_temp"
                      << (b->Get(0, 1) == "t" ? "; TEMPORARY on the database is still granted to this role (run "
                                                "`oml migrate` as the database owner to revoke it)"
                                              : "; this role cannot create temporary objects")
                      << "\n";
          }
        }
      }
    }
    {
      // The newest whole-deployment `oml reconcile` (sql/0024): when, and what it found.
      auto h = R.pool->Acquire();
      auto r = h.ok() ? (*h)->Query("SELECT to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
                                    "extract(epoch FROM now() - finished_at)::bigint, findings, classes::text, repaired "
                                    "FROM oml.reconcile_runs WHERE tenant_id IS NULL ORDER BY id DESC LIMIT 1")
                      : Result<db::Rows>(h.status());
      if (r.ok() && r->size() == 0) {
        std::cout << "reconcile: never run (run `oml reconcile` daily: it audits the lake and the buckets against "
                     "the journal)\n";
      } else if (r.ok()) {
        const int64_t n = r->GetInt(0, 2), repaired = r->GetInt(0, 4);
        // Findings nobody repaired are a problem; after a --repair, the next audit says what is left.
        const bool open = n > 0 && repaired == 0;
        if (open) ++problems;
        std::cout << (open ? "RECONCILE" : "reconcile") << ": last run " << r->Get(0, 0) << " (" << r->GetInt(0, 1)
                  << " s ago): " << n << " finding(s)" << (n > 0 ? " " + r->Get(0, 3) : std::string())
                  << (repaired > 0 ? ", " + std::to_string(repaired) +
                                         " repair group(s) journalled; run `oml reconcile` again to confirm\n"
                                   : std::string(open ? ".\n  Run `oml reconcile` to see them and `oml reconcile "
                                                        "--repair` to repair them.\n"
                                                      : "\n"));
      }
    }
    auto store = blob::OpenObjectStore(cfg.object_store_url);
    if (!store.ok()) return Fail(store.status());
    if (!fs::exists(RootKeyFile(cfg)))
      std::cout << "root key: no " << RootKeyFile(cfg) << "; published heads are checked against the first key.issued\n";
    if (Status kc = R.LoadKeyChain(); !kc.ok()) {
      if (kc.code() != Code::kDataLoss) return Fail(kc);
      std::cout << "KEY CHAIN: " << kc.message() << "\n";
      return kExitVerifyFailed;
    }
    auto f = R.AllForkChecks(**store, {});
    if (!f.ok()) return Fail(f.status());
    if (f->findings.empty()) {
      std::cout << "fork check: every stored chain head agrees with its published signed head and checkpoint\n";
    }
    // With witnesses: each chain's newest checkpoint is shown to them again; a witness that
    // cosigned more of a chain than the database holds names a fork even when the published
    // objects were rolled back with the database.
    if (R.witnesses.enabled()) {
      journal::WitnessSizes sizes;
      auto w = journal::RecheckWitnesses(*R.pool, R.witnesses, &sizes);
      if (!w.ok()) return Fail(w.status());
      for (const auto& [tenant, st] : w->failures) {
        ++problems;
        if (st.type() == "tlog-fork") {
          std::cout << "FORK tenant " << tenant << ": " << st.message() << ".\n"
                    << "  The database lost committed events or diverged from what the witnesses cosigned. `oml serve`\n"
                    << "  refuses writes until it is repaired: restore the missing tail from a standby or backup.\n";
        } else {
          std::cout << "WITNESSES tenant " << tenant << ": " << st.message() << "\n";
        }
      }
      for (const auto& [tenant, why] : w->unchecked) {
        ++problems;
        std::cout << "WITNESSES tenant " << tenant << ": not every witness checked the chain's checkpoint: " << why << "\n";
      }
      if (w->failures.empty() && w->unchecked.empty())
        std::cout << "witnesses: " << R.witnesses.witnesses.size() << " configured (quorum " << R.witnesses.quorum
                  << "); every chain's newest checkpoint is consistent with what they cosigned\n";
    }
    // Head documents that did not verify and were replaced: kept until an operator looks.
    auto replaced = (*store)->List(journal::kInvalidHeadsPrefix);
    if (!replaced.ok()) return Fail(replaced.status());
    for (const auto& k : *replaced) {
      ++problems;
      std::cout << "REPLACED HEAD " << k << ": a published head that did not verify was replaced by `oml serve`.\n"
                << "  It may have been damaged to hide a cut tail: run `oml verify`, inspect the object, then delete it.\n";
    }
    for (const auto& x : f->findings) {
      ++problems;
      if (x.invalid_head && x.checkpoint) {
        std::cout << "INVALID CHECKPOINT tenant " << x.tenant << ": " << x.what
                  << ".\n  `oml serve` publishes the chain's log again at startup, its newest checkpoint over this one.\n";
        continue;
      }
      if (x.invalid_head) {
        std::cout << "INVALID HEAD tenant " << x.tenant << ": " << x.what
                  << ".\n  The published head document does not verify against the key chain; `oml serve` "
                     "republishes the current head over it at startup.\n";
        continue;
      }
      std::cout << "FORK tenant " << x.tenant << ": " << x.what << " (published seq " << x.published_seq
                << ", stored seq " << x.stored_seq << ").\n"
                << "  The database lost committed events or diverged from what was published. `oml serve` refuses\n"
                << "  writes until it is repaired: restore the missing tail from a standby or backup that holds seq "
                << x.published_seq << ",\n  then run `oml verify --tenant " << x.tenant << "`.\n";
    }
    return problems ? kExitVerifyFailed : 0;
  }
  return 0;
}

}  // namespace
}  // namespace oml::cli

int main(int argc, char** argv) {
  // The PDF extractor child (review/pdf_sandbox.h): before anything else is set up.
  if (argc >= 2 && std::string_view(argv[1]) == "__extract-pdf") return oml::review::RunPdfChild(argc, argv);
  return oml::cli::Main(argc, argv);
}
