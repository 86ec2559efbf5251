#include "lake/lake_status.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>

#include "lake/delta_tables.h"
#include "lake/lakewriter.h"

namespace oml::lake {
namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

Result<LakeStatus> ReadLakeStatus(db::Conn& c, const OutboxStream& s, const std::string& lake_root,
                                  std::chrono::milliseconds stable_wait) {
  LakeStatus st;
  st.stream = s.name;
  st.app_id = AppIdFor(s.name);

  // The probe first: the frontier read after it is then at least the frontier the probe saw.
  // Without an xid: monitors poll status (outbox_cut.h, ProbeHorizonWithoutXid).
  OML_ASSIGN_OR_RETURN(HorizonProbe probe, ProbeHorizonWithoutXid(c, s));
  st.candidate = probe.candidate;
  auto deadline = std::chrono::steady_clock::now() + stable_wait;
  for (;;) {
    OML_ASSIGN_OR_RETURN(st.stable, IsStable(c, probe));
    if (st.stable || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!st.stable) {
    OML_ASSIGN_OR_RETURN(st.holders, HorizonHolders(c, probe));
  }

  OML_ASSIGN_OR_RETURN(
      db::Rows f,
      c.Query("SELECT frontier_seq, coalesce(lease_holder, ''), lease_epoch, EXISTS (SELECT 1 FROM pg_locks l "
              "  WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database "
              "  WHERE datname = current_database()) AND l.classid = ($2::bigint & 4294967295)::oid "
              "  AND l.objid = ($3::bigint & 4294967295)::oid AND l.objsubid = 2) "
              "FROM oml.lake_frontier WHERE stream = $1",
              {db::Text(s.name), db::Int(kLeaseClassId), db::Int(Fnv1a32(st.app_id))}));
  if (f.size() != 1) return NotFound("no outbox stream " + s.name + " (oml.lake_frontier)", "unknown-stream");
  st.frontier = f.GetInt(0, 0);
  st.last_holder = f.Get(0, 1);
  st.lease_epoch = f.GetInt(0, 2);
  st.lease_held = f.Get(0, 3) == "t";
  if (st.lease_held) st.lease_holder = st.last_holder;

  OML_ASSIGN_OR_RETURN(db::Rows dl, c.Query("SELECT count(*) FROM oml.dead_letter WHERE stream = $1 AND requeued_at IS NULL",
                                            {db::Text(s.name)}));
  st.dead_letters = dl.GetInt(0, 0);

  OML_ASSIGN_OR_RETURN(db::Rows rec, c.Query("SELECT table_name, txn_version FROM oml.lake_table_txn WHERE stream = $1",
                                             {db::Text(s.name)}));
  for (const auto& target : TargetTables()) {
    TableStatus t;
    t.name = target.name;
    for (int i = 0; i < rec.size(); ++i)
      if (rec.Get(i, 0) == target.name) t.recorded_txn = rec.GetInt(i, 1);
    t.uri = TableUri(lake_root, target.name);
    auto table = DeltaTable::Open(t.uri);
    if (!table.ok()) {
      if (table.status().type() == "lake-commit-damaged") {
        t.exists = true;
        t.unreadable = table.status().message();
      } else if (table.status().code() != Code::kNotFound) {
        return table.status();
      }
    } else {
      t.exists = true;
      OML_ASSIGN_OR_RETURN(t.table_version, table->SnapshotVersion());
      OML_ASSIGN_OR_RETURN(LastTxn txn, table->ReadLastTxn(st.app_id));
      t.txn_version = txn.version;
      OML_ASSIGN_OR_RETURN(t.missing_files, table->MissingFiles());
    }
    st.tables.push_back(std::move(t));
  }
  // Lag: the rows above the frontier, or above the txn of a table behind what it committed (its
  // lost rows are lag too, until the writer refills them).
  int64_t lag_from = st.frontier;
  for (const auto& t : st.tables)
    if (t.behind()) lag_from = std::min(lag_from, std::max<int64_t>(t.txn_version, 0));
  // s.table comes from the stream registry (ResolveStream), never from input.
  OML_ASSIGN_OR_RETURN(
      db::Rows lag, c.Query("SELECT count(*), extract(epoch FROM now() - min(enqueued_at))::float8 FROM " + s.table +
                                " WHERE seq > $1",
                            {db::Int(lag_from)}));
  st.lag_rows = lag.GetInt(0, 0);
  if (!lag.IsNull(0, 1)) st.lag_seconds = std::stod(lag.Get(0, 1));
  return st;
}

nlohmann::json LakeStatus::ToJson() const {
  using nlohmann::json;
  auto opt = [](const auto& o) { return o ? json(*o) : json(nullptr); };
  json holders = json::array();
  for (const auto& h : this->holders) {
    holders.push_back({{"xid", std::to_string(h.xid)},
                       {"xid_age", h.xid_age},
                       {"pid", opt(h.pid)},
                       {"gid", h.gid.empty() ? json(nullptr) : json(h.gid)},
                       {"role", h.role},
                       {"application_name", h.application_name},
                       {"state", h.state},
                       {"xact_age_seconds", opt(h.xact_age_s)},
                       {"xact_start", opt(h.xact_start)},
                       {"query_start", opt(h.query_start)}});
  }
  json tables = json::array();
  for (const auto& t : this->tables) {
    tables.push_back({{"name", t.name},
                      {"uri", t.uri},
                      {"exists", t.exists},
                      {"table_version", opt(t.table_version)},
                      {"txn_version", t.txn_version >= 0 ? json(t.txn_version) : json(nullptr)},
                      {"recorded_txn_version", t.recorded_txn >= 0 ? json(t.recorded_txn) : json(nullptr)},
                      {"behind", t.behind()},
                      {"missing_files", t.missing_files},
                      {"unreadable", t.unreadable.empty() ? json(nullptr) : json(t.unreadable)}});
  }
  return {{"stream", stream},
          {"app_id", app_id},
          {"frontier", frontier},
          {"horizon", {{"candidate", candidate}, {"stable", stable}, {"stable_horizon", opt(stable_horizon())}}},
          {"lag", {{"rows", lag_rows}, {"seconds", opt(lag_seconds)}}},
          {"holders", holders},
          {"tables", tables},
          {"dead_letters", dead_letters},
          {"lease",
           {{"held", lease_held},
            {"holder", lease_holder.empty() ? json(nullptr) : json(lease_holder)},
            {"last_holder", last_holder.empty() ? json(nullptr) : json(last_holder)},
            {"epoch", lease_epoch}}}};
}

std::string LakeStatus::ToText() const {
  std::ostringstream o;
  o << "stream:          " << stream << " (appId " << app_id << ")\n";
  o << "frontier:        " << frontier << "\n";
  if (stable) {
    o << "stable horizon:  " << candidate << "\n";
  } else {
    o << "stable horizon:  not yet: candidate " << candidate << " is held back by " << holders.size()
      << " transaction(s)\n";
  }
  o << "lag:             " << lag_rows << " rows";
  if (lag_seconds) o << ", oldest enqueued " << Seconds(*lag_seconds) << " ago";
  o << "\n";
  for (const auto& h : holders) {
    o << "  held by:       ";
    if (h.pid) o << "pid " << *h.pid;
    else o << "prepared transaction " << h.gid;
    o << " (role " << (h.role.empty() ? "?" : h.role);
    if (!h.application_name.empty()) o << ", application " << h.application_name;
    if (!h.state.empty()) o << ", " << h.state;
    o << "), xid " << h.xid << " (age " << h.xid_age << ")";
    if (h.xact_age_s) o << ", transaction open " << Seconds(*h.xact_age_s);
    if (h.query_start) o << ", query start " << *h.query_start;
    o << "\n";
  }
  o << "lake tables:\n";
  for (const auto& t : tables) {
    o << "  " << t.name << ": ";
    if (!t.exists) {
      o << "missing (" << t.uri << "; run `oml init`)\n";
      continue;
    }
    if (!t.unreadable.empty()) {
      o << "UNREADABLE: " << t.unreadable << " (the lake writer sets a damaged newest commit aside; else run "
        << "`oml lake rebuild --table " << t.name << "`)\n";
      continue;
    }
    o << "txn " << (t.txn_version >= 0 ? std::to_string(t.txn_version) : std::string("none"));
    if (t.table_version) o << ", table version " << *t.table_version;
    if (t.behind()) {
      o << ", BEHIND: it committed up to " << t.recorded_txn
        << " (lost commits or replaced); the lake writer refills it when it next recovers";
    }
    if (!t.missing_files.empty()) {
      o << ", DAMAGED: " << t.missing_files.size() << " data file(s) missing (" << t.missing_files.front()
        << (t.missing_files.size() > 1 ? ", ..." : "") << "): run `oml lake rebuild --table " << t.name << "`";
    }
    o << "\n";
  }
  if (lease_held) {
    o << "lease:           held by " << lease_holder << " (epoch " << lease_epoch << ")\n";
  } else {
    o << "lease:           not held: no lake writer is running"
      << (last_holder.empty() ? std::string() : " (last holder " + last_holder + ")") << " (epoch " << lease_epoch
      << ")\n";
  }
  o << "dead letters:    " << dead_letters << "\n";
  return o.str();
}

}  // namespace oml::lake
