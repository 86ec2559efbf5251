#include "common/config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <toml++/toml.h>

namespace oml {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

Status ParseInt(const std::string& key, const std::string& text, int64_t* out) {
  try {
    size_t pos = 0;
    long long v = std::stoll(text, &pos);
    if (pos != text.size() || v < 0) throw std::invalid_argument(text);
    *out = v;
    return Status::Ok();
  } catch (const std::exception&) {
    return InvalidArgument("setting " + key + ": not a non-negative integer: '" + text + "'");
  }
}

Status ParseBool(const std::string& key, const std::string& text, bool* out) {
  std::string t = text;
  for (auto& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "true" || t == "1" || t == "yes" || t == "on") {
    *out = true;
  } else if (t == "false" || t == "0" || t == "no" || t == "off") {
    *out = false;
  } else {
    return InvalidArgument("setting " + key + ": not a boolean (true/false, 1/0, yes/no, on/off): '" + text + "'");
  }
  return Status::Ok();
}

}  // namespace

std::string Config::HostOf(const std::string& addr) {
  auto p = addr.rfind(':');
  return p == std::string::npos ? addr : addr.substr(0, p);
}

int Config::PortOf(const std::string& addr) {
  auto p = addr.rfind(':');
  if (p == std::string::npos) return 8470;
  return std::atoi(addr.c_str() + p + 1);
}

bool IsValidBucketName(std::string_view n) {
  if (n.size() < 3 || n.size() > 63) return false;
  auto alnum = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); };
  for (char ch : n)
    if (!alnum(ch) && ch != '.' && ch != '-') return false;
  if (!alnum(n.front()) || !alnum(n.back())) return false;
  if (n.find("..") != n.npos || n.find(".-") != n.npos || n.find("-.") != n.npos) return false;
  if (n.starts_with("xn--") || n.starts_with("sthree-") || n.ends_with("-s3alias") || n.ends_with("--ol-s3"))
    return false;
  // Not formatted as an IPv4 address (four dot-separated groups of digits).
  int groups = 1;
  bool only_digits_and_dots = true;
  for (char ch : n) {
    if (ch == '.') ++groups;
    else if (ch < '0' || ch > '9') only_digits_and_dots = false;
  }
  return !(only_digits_and_dots && groups == 4);
}

std::string Config::ListenHost() const { return HostOf(listen); }
int Config::ListenPort() const { return PortOf(listen); }

Result<Config> LoadConfig() {
  Config c;
  if (auto h = Env("OML_HOME"); !h.empty()) c.home = h;
  namespace fs = std::filesystem;
  const fs::path home = fs::absolute(c.home).lexically_normal();

  // Values as strings, file first, then environment.
  struct Item { const char* key; const char* env; std::string value; };
  Item items[] = {
      {"database_url", "OML_DATABASE_URL", ""}, {"listen", "OML_LISTEN", ""},
      {"lakewriter_database_url", "OML_LAKEWRITER_DATABASE_URL", ""},
      {"reconciler_database_url", "OML_RECONCILER_DATABASE_URL", ""},
      {"signing_key_file", "OML_SIGNING_KEY", ""}, {"kek_file", "OML_KEK_FILE", ""},
      {"previous_kek_file", "OML_PREVIOUS_KEK_FILE", ""}, {"cursor_secret_file", "OML_CURSOR_SECRET_FILE", ""},
      {"object_store_url", "OML_OBJECT_STORE_URL", ""}, {"lake_root", "OML_LAKE_ROOT", ""},
      {"quarantine_bucket", "OML_QUARANTINE_BUCKET", ""}, {"bodies_bucket", "OML_BODIES_BUCKET", ""},
      {"max_body_bytes", "OML_MAX_BODY_BYTES", ""}, {"db_pool_size", "OML_DB_POOL_SIZE", ""},
      {"http_threads", "OML_HTTP_THREADS", ""}, {"head_publish_ms", "OML_HEAD_PUBLISH_MS", ""},
      {"log_level", "OML_LOG_LEVEL", ""}, {"idempotency_ttl_s", "OML_IDEMPOTENCY_TTL_S", ""},
      {"reduced_durability", "OML_REDUCED_DURABILITY", ""}, {"durability_check_ms", "OML_DURABILITY_CHECK_MS", ""},
      {"commit_replication_timeout_ms", "OML_COMMIT_REPLICATION_TIMEOUT_MS", ""},
      {"allow_insecure_key_files", "OML_ALLOW_INSECURE_KEY_FILES", ""},
      {"metrics_listen", "OML_METRICS_LISTEN", ""},
      {"lakewriter_metrics_listen", "OML_LAKEWRITER_METRICS_LISTEN", ""},
      {"http_max_request_bytes", "OML_HTTP_MAX_REQUEST_BYTES", ""},
      {"http_max_header_bytes", "OML_HTTP_MAX_HEADER_BYTES", ""},
      {"http_request_timeout_ms", "OML_HTTP_REQUEST_TIMEOUT_MS", ""},
      {"http_max_connections", "OML_HTTP_MAX_CONNECTIONS", ""},
      {"http_keepalive_requests", "OML_HTTP_KEEPALIVE_REQUESTS", ""},
      {"db_acquire_timeout_ms", "OML_DB_ACQUIRE_TIMEOUT_MS", ""},
      {"events_page_max_bytes", "OML_EVENTS_PAGE_MAX_BYTES", ""},
      {"upload_expiry_s", "OML_UPLOAD_EXPIRY_S", ""}, {"upload_max_bytes", "OML_UPLOAD_MAX_BYTES", ""},
      {"upload_complete_ttl_s", "OML_UPLOAD_COMPLETE_TTL_S", ""},
      {"deny_list_file", "OML_DENY_LIST_FILE", ""}, {"clamd_address", "OML_CLAMD_ADDRESS", ""},
      {"clamd_timeout_ms", "OML_CLAMD_TIMEOUT_MS", ""}, {"tlog_origin", "OML_TLOG_ORIGIN", "oml.local"},
      {"tlog_witnesses", "OML_TLOG_WITNESSES", ""}, {"tlog_witness_quorum", "OML_TLOG_WITNESS_QUORUM", ""},
      {"tlog_witness_timeout_ms", "OML_TLOG_WITNESS_TIMEOUT_MS", ""}, {"tlog_publish_ms", "OML_TLOG_PUBLISH_MS", ""},
      {"inline_body_max_bytes", "OML_INLINE_BODY_MAX_BYTES", ""},
      {"rejected_retention_s", "OML_REJECTED_RETENTION_S", ""},
      {"attachment_serve_max_bytes", "OML_ATTACHMENT_SERVE_MAX_BYTES", ""}, {"review_max_text_bytes", "OML_REVIEW_MAX_TEXT_BYTES", ""},
      {"pdf_extract_memory_mb", "OML_PDF_EXTRACT_MEMORY_MB", ""}, {"pdf_extract_cpu_s", "OML_PDF_EXTRACT_CPU_S", ""},
      {"pdf_extract_timeout_s", "OML_PDF_EXTRACT_TIMEOUT_S", ""}, {"pdf_extract_max", "OML_PDF_EXTRACT_MAX", ""},
      {"pdf_extract_per_tenant", "OML_PDF_EXTRACT_PER_TENANT", ""},
      {"upload_sessions_per_key", "OML_UPLOAD_SESSIONS_PER_KEY", ""},
      {"upload_sessions_per_tenant", "OML_UPLOAD_SESSIONS_PER_TENANT", ""},
      {"upload_pending_bytes_per_key", "OML_UPLOAD_PENDING_BYTES_PER_KEY", ""},
      {"upload_pending_bytes_per_tenant", "OML_UPLOAD_PENDING_BYTES_PER_TENANT", ""},
      {"upload_min_chunk_bytes", "OML_UPLOAD_MIN_CHUNK_BYTES", ""},
      {"staging_grace_s", "OML_STAGING_GRACE_S", ""},
  };
  const fs::path file = home / "oml.toml";
  if (fs::exists(file)) {
    toml::table tbl;
    try {
      tbl = toml::parse_file(file.string());
    } catch (const toml::parse_error& e) {
      return InvalidArgument(file.string() + ": " + std::string(e.description()));
    }
    for (auto& [k, node] : tbl) {
      bool known = false;
      for (auto& it : items) {
        if (k.str() != it.key) continue;
        known = true;
        if (auto s = node.value<std::string>()) it.value = *s;
        else if (auto i = node.value<int64_t>()) it.value = std::to_string(*i);
        else if (auto b = node.value<bool>()) it.value = *b ? "true" : "false";
        else return InvalidArgument(file.string() + ": " + it.key + " must be a string, integer or boolean");
      }
      if (!known) return InvalidArgument(file.string() + ": unknown setting '" + std::string(k.str()) + "'");
    }
  }
  for (auto& it : items) {
    if (auto e = Env(it.env); !e.empty()) it.value = e;
  }
  auto get = [&](const char* key) -> const std::string& {
    for (auto& it : items) if (std::string(it.key) == key) return it.value;
    static std::string empty;
    return empty;
  };
  c.home = home.string();
  c.database_url = get("database_url");
  c.lakewriter_database_url = get("lakewriter_database_url");
  c.reconciler_database_url = get("reconciler_database_url");
  if (!get("listen").empty()) c.listen = get("listen");
  c.signing_key_file = get("signing_key_file").empty() ? (home / "keys/signing.key").string() : get("signing_key_file");
  c.kek_file = get("kek_file").empty() ? (home / "keys/kek.key").string() : get("kek_file");
  c.previous_kek_file = get("previous_kek_file");
  c.cursor_secret_file =
      get("cursor_secret_file").empty() ? (home / "keys/cursor.key").string() : get("cursor_secret_file");
  c.object_store_url = get("object_store_url").empty() ? "file://" + (home / "objects").string() : get("object_store_url");
  c.lake_root = get("lake_root").empty() ? (home / "lake").string() : get("lake_root");
  if (!get("quarantine_bucket").empty()) c.quarantine_bucket = get("quarantine_bucket");
  if (!get("bodies_bucket").empty()) c.bodies_bucket = get("bodies_bucket");
  for (const char* key : {"quarantine_bucket", "bodies_bucket"}) {
    const std::string& name = std::string(key) == "bodies_bucket" ? c.bodies_bucket : c.quarantine_bucket;
    if (!IsValidBucketName(name))
      return InvalidArgument(std::string("setting ") + key + ": not a valid S3 bucket name: '" + name + "'");
  }
  // Promotion copies quarantine -> bodies under the same key and then deletes the quarantine copy.
  if (c.quarantine_bucket == c.bodies_bucket)
    return InvalidArgument("settings quarantine_bucket and bodies_bucket must differ: '" + c.bodies_bucket + "'");
  if (!get("log_level").empty()) c.log_level = get("log_level");
  int64_t v = 0;
  if (!get("max_body_bytes").empty()) { OML_RETURN_IF_ERROR(ParseInt("max_body_bytes", get("max_body_bytes"), &v)); c.max_body_bytes = v; }
  if (!get("db_pool_size").empty()) { OML_RETURN_IF_ERROR(ParseInt("db_pool_size", get("db_pool_size"), &v)); c.db_pool_size = static_cast<int>(v); }
  if (!get("http_threads").empty()) { OML_RETURN_IF_ERROR(ParseInt("http_threads", get("http_threads"), &v)); c.http_threads = static_cast<int>(v); }
  if (!get("head_publish_ms").empty()) { OML_RETURN_IF_ERROR(ParseInt("head_publish_ms", get("head_publish_ms"), &v)); c.head_publish_ms = static_cast<int>(v); }
  if (!get("idempotency_ttl_s").empty()) { OML_RETURN_IF_ERROR(ParseInt("idempotency_ttl_s", get("idempotency_ttl_s"), &v)); c.idempotency_ttl_s = v; }
  if (c.idempotency_ttl_s < 1 || c.idempotency_ttl_s > 30 * 86400)
    return InvalidArgument("setting idempotency_ttl_s: must be 1..2592000 (30 days)");
  if (!get("reduced_durability").empty())
    OML_RETURN_IF_ERROR(ParseBool("reduced_durability", get("reduced_durability"), &c.reduced_durability));
  if (!get("allow_insecure_key_files").empty())
    OML_RETURN_IF_ERROR(ParseBool("allow_insecure_key_files", get("allow_insecure_key_files"), &c.allow_insecure_key_files));
  if (!get("durability_check_ms").empty()) {
    OML_RETURN_IF_ERROR(ParseInt("durability_check_ms", get("durability_check_ms"), &v));
    c.durability_check_ms = static_cast<int>(std::min<int64_t>(v, 86400000));  // a day at most: fits an int
  }
  if (c.durability_check_ms < 100) return InvalidArgument("setting durability_check_ms: must be at least 100");
  if (!get("commit_replication_timeout_ms").empty()) {
    OML_RETURN_IF_ERROR(ParseInt("commit_replication_timeout_ms", get("commit_replication_timeout_ms"), &v));
    if (v < 100 || v > 3600000)
      return InvalidArgument("setting commit_replication_timeout_ms: must be 100..3600000 (an hour)");
    c.commit_replication_timeout_ms = static_cast<int>(v);
  }
  if (!get("metrics_listen").empty()) c.metrics_listen = get("metrics_listen") == "off" ? "" : get("metrics_listen");
  if (!get("lakewriter_metrics_listen").empty())
    c.lakewriter_metrics_listen = get("lakewriter_metrics_listen") == "off" ? "" : get("lakewriter_metrics_listen");
  // The HTTP limits (docs/operations/deployment.md "Limits"): each a positive integer within a
  // range that keeps the server usable.
  struct Bound { const char* key; int64_t lo, hi; int64_t* out; };
  int64_t req_bytes = -1, hdr = c.http_max_header_bytes, tmo = c.http_request_timeout_ms, conns = c.http_max_connections,
          ka = c.http_keepalive_requests, acq = c.db_acquire_timeout_ms, page = c.events_page_max_bytes,
          up_expiry = c.upload_expiry_s, up_max = static_cast<int64_t>(c.upload_max_bytes), up_complete_ttl = -1,
          clamd_tmo = c.clamd_timeout_ms, review_text = c.review_max_text_bytes,
          inline_max = static_cast<int64_t>(c.inline_body_max_bytes), rejected_ret = c.rejected_retention_s,
          serve_max = static_cast<int64_t>(c.attachment_serve_max_bytes), pdf_mem = c.pdf_extract_memory_mb,
          pdf_cpu = c.pdf_extract_cpu_s, pdf_tmo = c.pdf_extract_timeout_s, pdf_max = c.pdf_extract_max,
          pdf_tenant = c.pdf_extract_per_tenant, up_key_n = c.upload_sessions_per_key,
          up_ten_n = c.upload_sessions_per_tenant, up_key_b = static_cast<int64_t>(c.upload_pending_bytes_per_key),
          up_ten_b = static_cast<int64_t>(c.upload_pending_bytes_per_tenant),
          up_min_chunk = -1, staging_grace = c.staging_grace_s;
  for (const Bound& b : {Bound{"http_max_request_bytes", 1024, int64_t(1) << 32, &req_bytes},
                         Bound{"http_max_header_bytes", 1024, 1 << 20, &hdr},
                         Bound{"http_request_timeout_ms", 100, 3600000, &tmo},
                         Bound{"http_max_connections", 1, 1000000, &conns},
                         Bound{"http_keepalive_requests", 1, 1000000000, &ka},
                         Bound{"db_acquire_timeout_ms", 1, 3600000, &acq},
                         Bound{"events_page_max_bytes", 64 * 1024, int64_t(1) << 32, &page},
                         Bound{"upload_expiry_s", 1, 31536000, &up_expiry},
                         Bound{"upload_complete_ttl_s", 1, 31536000, &up_complete_ttl},
                         Bound{"upload_max_bytes", 0, int64_t(80) << 30, &up_max},
                         Bound{"clamd_timeout_ms", 1, 3600000, &clamd_tmo},
                         Bound{"review_max_text_bytes", 1024, int64_t(1) << 30, &review_text},
                         Bound{"inline_body_max_bytes", 0, int64_t(1) << 30, &inline_max},
                         Bound{"rejected_retention_s", 1, int64_t(10) * 366 * 86400, &rejected_ret},
                         Bound{"attachment_serve_max_bytes", 64 * 1024, int64_t(1) << 30, &serve_max},
                         Bound{"pdf_extract_memory_mb", 192, 65536, &pdf_mem},
                         Bound{"pdf_extract_cpu_s", 1, 3600, &pdf_cpu},
                         Bound{"pdf_extract_timeout_s", 1, 3600, &pdf_tmo},
                         Bound{"pdf_extract_max", 1, 256, &pdf_max},
                         Bound{"pdf_extract_per_tenant", 1, 256, &pdf_tenant},
                         Bound{"upload_sessions_per_key", 0, 1000000, &up_key_n},
                         Bound{"upload_sessions_per_tenant", 0, 100000000, &up_ten_n},
                         Bound{"upload_pending_bytes_per_key", 0, int64_t(1) << 60, &up_key_b},
                         Bound{"upload_pending_bytes_per_tenant", 0, int64_t(1) << 60, &up_ten_b},
                         Bound{"upload_min_chunk_bytes", 0, int64_t(1) << 30, &up_min_chunk},
                         Bound{"staging_grace_s", 600, 31536000, &staging_grace}}) {
    if (get(b.key).empty()) continue;
    OML_RETURN_IF_ERROR(ParseInt(b.key, get(b.key), b.out));
    if (*b.out < b.lo || *b.out > b.hi)
      return InvalidArgument(std::string("setting ") + b.key + ": must be " + std::to_string(b.lo) + ".." + std::to_string(b.hi));
  }
  // A text body of max_body_bytes may grow up to 6x when JSON-escaped (\u00XX per byte).
  c.http_max_request_bytes = req_bytes >= 0 ? uint64_t(req_bytes) : c.max_body_bytes * 6 + 64 * 1024;
  c.http_max_header_bytes = static_cast<int>(hdr);
  c.http_request_timeout_ms = static_cast<int>(tmo);
  c.http_max_connections = static_cast<int>(conns);
  c.http_keepalive_requests = static_cast<int>(ka);
  c.db_acquire_timeout_ms = static_cast<int>(acq);
  c.events_page_max_bytes = uint64_t(page);
  c.upload_expiry_s = up_expiry;
  c.upload_complete_ttl_s = up_complete_ttl >= 0 ? up_complete_ttl : up_expiry;
  c.upload_max_bytes = uint64_t(up_max);
  c.clamd_timeout_ms = static_cast<int>(clamd_tmo);
  c.review_max_text_bytes = uint64_t(review_text);
  c.inline_body_max_bytes = uint64_t(inline_max);
  c.rejected_retention_s = rejected_ret;
  c.attachment_serve_max_bytes = uint64_t(serve_max);
  c.pdf_extract_memory_mb = pdf_mem;
  c.pdf_extract_cpu_s = pdf_cpu;
  c.pdf_extract_timeout_s = pdf_tmo;
  c.pdf_extract_max = pdf_max;
  c.pdf_extract_per_tenant = pdf_tenant;
  c.upload_sessions_per_key = up_key_n;
  c.upload_sessions_per_tenant = up_ten_n;
  c.upload_pending_bytes_per_key = uint64_t(up_key_b);
  c.upload_pending_bytes_per_tenant = uint64_t(up_ten_b);
  // Unset: 1 MiB, or less when the request limit is smaller (a chunk must fit in a request).
  c.upload_min_chunk_bytes = up_min_chunk >= 0 ? uint64_t(up_min_chunk)
                                               : std::min<uint64_t>(c.upload_min_chunk_bytes, c.http_max_request_bytes);
  c.staging_grace_s = staging_grace;
  if (c.upload_min_chunk_bytes > c.http_max_request_bytes)
    return InvalidArgument("setting upload_min_chunk_bytes: must be at most http_max_request_bytes (" +
                           std::to_string(c.http_max_request_bytes) + "), or no chunk but the last could pass");
  if (c.pdf_extract_per_tenant > c.pdf_extract_max)
    return InvalidArgument("setting pdf_extract_per_tenant: must be at most pdf_extract_max");
  c.deny_list_file = get("deny_list_file");
  c.clamd_address = get("clamd_address");
  c.tlog_origin = get("tlog_origin");
  // The checkpoint origin and note key name are "<tlog_origin>/<tenant uuid>" (journal/tlog_store.h):
  // printable ASCII with no space or '+' (a C2SP key name), and short.
  if (c.tlog_origin.empty() || c.tlog_origin.size() > 200 ||
      std::any_of(c.tlog_origin.begin(), c.tlog_origin.end(), [](char ch) { return ch <= ' ' || ch > '~' || ch == '+'; }))
    return InvalidArgument("setting tlog_origin: 1..200 printable ASCII characters, no space or '+' (e.g. "
                           "oml.example.com/log): '" + c.tlog_origin + "'");
  c.tlog_witnesses = get("tlog_witnesses");
  // A witness keeps one record per origin: two deployments under the same origin would each look
  // like a fork of the other to it (the provider chain's id is the same in every deployment).
  if (c.tlog_witnesses.find_first_not_of(" \t,") != std::string::npos && c.tlog_origin == "oml.local")
    return InvalidArgument("setting tlog_witnesses: set tlog_origin to this deployment's own name first (e.g. "
                           "oml.example.com/log): witnesses keep one record per origin, and the default oml.local is "
                           "every deployment's that kept it");
  if (!get("tlog_witness_quorum").empty()) {
    OML_RETURN_IF_ERROR(ParseInt("tlog_witness_quorum", get("tlog_witness_quorum"), &v));
    if (v < 0 || v > 100) return InvalidArgument("setting tlog_witness_quorum: 0 (a majority) or 1..the number of tlog_witnesses");
    c.tlog_witness_quorum = static_cast<int>(v);
  }
  if (!get("tlog_witness_timeout_ms").empty()) {
    OML_RETURN_IF_ERROR(ParseInt("tlog_witness_timeout_ms", get("tlog_witness_timeout_ms"), &v));
    if (v < 100 || v > 600000) return InvalidArgument("setting tlog_witness_timeout_ms: 100..600000");
    c.tlog_witness_timeout_ms = static_cast<int>(v);
  }
  if (!get("tlog_publish_ms").empty()) {
    OML_RETURN_IF_ERROR(ParseInt("tlog_publish_ms", get("tlog_publish_ms"), &v));
    if (v != 0 && (v < 100 || v > 3600000))
      return InvalidArgument("setting tlog_publish_ms: 0 (no publisher on this replica) or 100..3600000");
    c.tlog_publish_ms = static_cast<int>(v);
  }
  if (c.db_pool_size < 1) return InvalidArgument("setting db_pool_size: must be at least 1");
  if (c.http_threads < 1) return InvalidArgument("setting http_threads: must be at least 1");
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error"};
  if (std::find(std::begin(kLevels), std::end(kLevels), c.log_level) == std::end(kLevels))
    return InvalidArgument("setting log_level: must be one of trace, debug, info, warn, error: '" + c.log_level + "'");
  return c;
}

}  // namespace oml
