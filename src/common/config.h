// Settings: $OML_HOME/oml.toml, overridden by environment variables.
//
// Precedence (highest first): environment, oml.toml, built-in defaults. OML_HOME itself comes
// only from the environment (default ".oml"). Every path default is relative to OML_HOME.
//
//   key in oml.toml       environment            default
//   database_url          OML_DATABASE_URL       "" (oml dev: start the private cluster)
//   lakewriter_database_url OML_LAKEWRITER_DATABASE_URL "" (`oml lakewriter`, as oml_lakewriter;
//                                                 empty: $OML_HOME/pg/lakewriter.url when present)
//   reconciler_database_url OML_RECONCILER_DATABASE_URL "" (`oml reconcile`, as oml_reconciler;
//                                                 empty: $OML_HOME/pg/reconciler.url when present)
//   listen                OML_LISTEN             127.0.0.1:8470
//   signing_key_file      OML_SIGNING_KEY        $OML_HOME/keys/signing.key
//   kek_file              OML_KEK_FILE           $OML_HOME/keys/kek.key
//   previous_kek_file     OML_PREVIOUS_KEK_FILE  "" (during a KEK rotation: the KEK being replaced)
//   cursor_secret_file    OML_CURSOR_SECRET_FILE $OML_HOME/keys/cursor.key
//   object_store_url      OML_OBJECT_STORE_URL   file://$OML_HOME/objects (absolute)
//   quarantine_bucket     OML_QUARANTINE_BUCKET  oml-quarantine (held uploads and attachments)
//   bodies_bucket         OML_BODIES_BUCKET      oml-bodies (promoted attachments)
//   lake_root             OML_LAKE_ROOT          $OML_HOME/lake
//   max_body_bytes        OML_MAX_BODY_BYTES     1048576
//   db_pool_size          OML_DB_POOL_SIZE       16
//   http_threads          OML_HTTP_THREADS       32
//   head_publish_ms       OML_HEAD_PUBLISH_MS    200
//   idempotency_ttl_s     OML_IDEMPOTENCY_TTL_S  86400 (1..2592000 s; how long an Idempotency-Key is honoured)
//   log_level             OML_LOG_LEVEL          info
//   reduced_durability    OML_REDUCED_DURABILITY false  (true/false, 1/0, yes/no, on/off; toml bool ok)
//   durability_check_ms   OML_DURABILITY_CHECK_MS 5000  (at least 100)
//   commit_replication_timeout_ms OML_COMMIT_REPLICATION_TIMEOUT_MS 5000 (100..3600000; `oml serve`'s
//                         bound on a COMMIT's wait for the synchronous standbys: then 503
//                         commit-not-replicated, db::SetCommitWaitBound)
//   metrics_listen        OML_METRICS_LISTEN     127.0.0.1:8471 ("off": no metrics listener)
//   lakewriter_metrics_listen OML_LAKEWRITER_METRICS_LISTEN 127.0.0.1:8472 (`oml lakewriter`'s /metrics; "off": none)
//   http_max_request_bytes   OML_HTTP_MAX_REQUEST_BYTES   6 * max_body_bytes + 64 KiB (body on the wire)
//   http_max_header_bytes    OML_HTTP_MAX_HEADER_BYTES    16384 (request line + header lines)
//   http_request_timeout_ms  OML_HTTP_REQUEST_TIMEOUT_MS  10000 (whole request, idle keep-alive included)
//   http_max_connections     OML_HTTP_MAX_CONNECTIONS     1024
//   http_keepalive_requests  OML_HTTP_KEEPALIVE_REQUESTS  1000 (requests per connection)
//   db_acquire_timeout_ms    OML_DB_ACQUIRE_TIMEOUT_MS    2000 (then 503 database-busy)
//   events_page_max_bytes    OML_EVENTS_PAGE_MAX_BYTES    4194304 (GET /v1/events page, signed bytes)
//   upload_expiry_s          OML_UPLOAD_EXPIRY_S          86400 (1..31536000: a tus upload's life, Upload-Expires)
//   upload_complete_ttl_s    OML_UPLOAD_COMPLETE_TTL_S    upload_expiry_s (1..31536000: how long a complete upload
//                                                         waits for a claim to attach it before it expires)
//   upload_max_bytes         OML_UPLOAD_MAX_BYTES         8589934592 (0..80 GiB: largest Upload-Length, Tus-Max-Size)
//   inline_body_max_bytes    OML_INLINE_BODY_MAX_BYTES    65536 (0..1 GiB: a body whose ciphertext is larger is kept as an
//                                                         object in the quarantine bucket, sql/0015)
//   rejected_retention_s     OML_REJECTED_RETENTION_S     2592000 (1 s..10 years: a rejected claim is erased this long
//                                                         after its claim.rejected, admission/retention.h)
//   attachment_serve_max_bytes OML_ATTACHMENT_SERVE_MAX_BYTES accepted and ignored (attachments are streamed
//                                                         whatever their size, issue 19)
//   allow_insecure_key_files OML_ALLOW_INSECURE_KEY_FILES false (booleans as above)
//   deny_list_file           OML_DENY_LIST_FILE           "" (built-in patterns only; review/deny_list.h)
//   clamd_address            OML_CLAMD_ADDRESS            "" (no ClamAV scan; review/clamd.h)
//   clamd_timeout_ms         OML_CLAMD_TIMEOUT_MS         30000 (1..3600000, per socket operation)
//   tlog_origin              OML_TLOG_ORIGIN              oml.local (each chain's checkpoint origin and note key
//                                                         name is "<tlog_origin>/<tenant uuid>"; 1..200 printable
//                                                         ASCII, no space or '+'; journal/tlog_store.h)
//   tlog_witnesses           OML_TLOG_WITNESSES           "" (no witness; else "<url> <verifier key>" entries
//                                                         separated by ",": the C2SP tlog-witnesses asked to
//                                                         cosign each checkpoint, journal/tlog_store.h)
//   tlog_witness_quorum      OML_TLOG_WITNESS_QUORUM      0 = a majority of tlog_witnesses (1..their number:
//                                                         cosignatures a checkpoint needs to be published and
//                                                         trusted by the fork checks)
//   tlog_witness_timeout_ms  OML_TLOG_WITNESS_TIMEOUT_MS  5000 (100..600000, per request to a witness)
//   tlog_publish_ms          OML_TLOG_PUBLISH_MS          1000 (100..3600000: the tlog publisher's round interval,
//                                                         stretched to keep it busy at most a quarter of the time;
//                                                         0: this replica signs and publishes no checkpoint)
//   review_max_text_bytes    OML_REVIEW_MAX_TEXT_BYTES    8388608 (1024..1 GiB, extracted text per item)
//   pdf_extract_memory_mb    OML_PDF_EXTRACT_MEMORY_MB    1024 (192..65536: address space of one PDF extractor
//                                                         process, review/pdf_sandbox.h; it needs ~151 MiB to start)
//   pdf_extract_cpu_s        OML_PDF_EXTRACT_CPU_S        10 (1..3600: CPU seconds of one PDF extraction)
//   pdf_extract_timeout_s    OML_PDF_EXTRACT_TIMEOUT_S    20 (1..3600: wall clock of one, waiting for a slot included)
//   pdf_extract_max          OML_PDF_EXTRACT_MAX          4 (1..256: PDF extractor processes at once)
//   pdf_extract_per_tenant   OML_PDF_EXTRACT_PER_TENANT   2 (1..256, at most pdf_extract_max: of one tenant)
//   upload_sessions_per_key  OML_UPLOAD_SESSIONS_PER_KEY  64 (0 = no limit: open tus sessions of one API key)
//   upload_sessions_per_tenant OML_UPLOAD_SESSIONS_PER_TENANT 1024 (0 = no limit: of one tenant)
//   upload_pending_bytes_per_key OML_UPLOAD_PENDING_BYTES_PER_KEY 68719476736 (64 GiB; 0 = no limit: declared
//                                                         bytes not yet received, over one key's open sessions)
//   upload_pending_bytes_per_tenant OML_UPLOAD_PENDING_BYTES_PER_TENANT 1099511627776 (1 TiB; 0 = no limit)
//   upload_min_chunk_bytes   OML_UPLOAD_MIN_CHUNK_BYTES   min(1048576, http_max_request_bytes) (0..1 GiB: least bytes
//                                                         in a PATCH that does not end its upload; 0 = any; set above
//                                                         http_max_request_bytes: refused)
//   staging_grace_s          OML_STAGING_GRACE_S          21600 (600..31536000: age at which `oml serve` removes a
//                                                         killed write's staging file or incomplete multipart upload
//                                                         from the buckets, and `oml lakewriter` from the lake; must
//                                                         exceed the longest write, blob::ObjectStore::SweepStaging)
//
// reduced_durability: `oml serve` acknowledges writes although the database does not run
// synchronous quorum replication (db/durability.h); the --reduced-durability flag sets it too.
// Without it, such a database gets every write refused (503 durability-reduced). The settings
// are re-checked every durability_check_ms.
//
// kek_file / previous_kek_file: new DEKs are wrapped under kek_file's KEK. While `oml kek rotate`
// moves DEKs from one KEK to another, kek_file names the new KEK and previous_kek_file the old
// one: each DEK is unwrapped under the KEK its row names (docs/operations/deployment.md).
//
// cursor_secret_file: the HMAC-SHA-256 secrets of recall cursors (admission/cursor.h), lines
// "<key id> <hex secret>" (crypto::HmacKeyRing): the first signs, every one verifies. Every
// replica must hold the same file, or a cursor one issued is refused by the next. `oml serve`
// refuses to start without it; `oml init` and `oml dev` generate it when missing.
//
// quarantine_bucket / bodies_bucket: S3 bucket names (3..63 of a-z 0-9 . -, starting and ending
// with a letter or digit, no "..", not an IPv4 address, no xn-- / sthree- prefix, no -s3alias /
// --ol-s3 suffix), and different from each other. With a file:// object_store_url each is a
// subdirectory of it; with s3:// each is its own S3 bucket (blob::BucketUrl).
//
// allow_insecure_key_files: the signing key, KEK and cursor secret files are refused at load unless owned by
// the process's user with no group/other permission (common/secret_file.h). Set it only where a
// container mount cannot set modes; each load of such a file then logs a warning instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace oml {

struct Config {
  std::string home = ".oml";
  std::string database_url;
  std::string lakewriter_database_url;
  std::string reconciler_database_url;
  std::string listen = "127.0.0.1:8470";
  std::string signing_key_file;
  std::string kek_file;
  std::string previous_kek_file;  // empty: none
  std::string cursor_secret_file;
  std::string object_store_url;
  std::string quarantine_bucket = "oml-quarantine";
  std::string bodies_bucket = "oml-bodies";
  std::string lake_root;
  uint64_t max_body_bytes = 1 << 20;
  int db_pool_size = 16;
  int http_threads = 32;
  int head_publish_ms = 200;
  int64_t idempotency_ttl_s = 86400;
  std::string log_level = "info";
  bool reduced_durability = false;
  int durability_check_ms = 5000;
  int commit_replication_timeout_ms = 5000;
  std::string metrics_listen = "127.0.0.1:8471";
  std::string lakewriter_metrics_listen = "127.0.0.1:8472";
  uint64_t http_max_request_bytes = 6 * (1 << 20) + 64 * 1024;
  int http_max_header_bytes = 16384;
  int http_request_timeout_ms = 10000;
  int http_max_connections = 1024;
  int http_keepalive_requests = 1000;
  int db_acquire_timeout_ms = 2000;
  uint64_t events_page_max_bytes = 4 << 20;
  int64_t upload_expiry_s = 86400;
  int64_t upload_complete_ttl_s = 86400;  // LoadConfig: upload_expiry_s unless set
  uint64_t upload_max_bytes = uint64_t{8} << 30;
  uint64_t inline_body_max_bytes = 64 * 1024;
  int64_t rejected_retention_s = 30 * 86400;
  uint64_t attachment_serve_max_bytes = uint64_t{64} << 20;
  bool allow_insecure_key_files = false;
  std::string deny_list_file;  // empty: the built-in deny-list
  std::string clamd_address;   // empty: no ClamAV scan
  std::string tlog_origin = "oml.local";
  std::string tlog_witnesses;  // raw; parsed by journal::ParseTlogWitnesses
  int tlog_witness_quorum = 0;
  int tlog_witness_timeout_ms = 5000;
  int tlog_publish_ms = 1000;  // 0: no tlog publisher in this process
  int clamd_timeout_ms = 30000;
  uint64_t review_max_text_bytes = 8 << 20;
  int64_t pdf_extract_memory_mb = 1024;
  int64_t pdf_extract_cpu_s = 10;
  int64_t pdf_extract_timeout_s = 20;
  int64_t pdf_extract_max = 4;
  int64_t pdf_extract_per_tenant = 2;
  int64_t upload_sessions_per_key = 64;
  int64_t upload_sessions_per_tenant = 1024;
  uint64_t upload_pending_bytes_per_key = uint64_t{64} << 30;
  uint64_t upload_pending_bytes_per_tenant = uint64_t{1} << 40;
  uint64_t upload_min_chunk_bytes = uint64_t{1} << 20;
  int64_t staging_grace_s = 6 * 3600;

  std::string ListenHost() const;
  int ListenPort() const;
  // host and port of an "address:port" setting such as metrics_listen.
  static std::string HostOf(const std::string& addr);
  static int PortOf(const std::string& addr);
};

// True if `name` follows the S3 general purpose bucket naming rules listed above.
bool IsValidBucketName(std::string_view name);

// Loads the configuration as described above. Fails with kInvalidArgument on a malformed
// oml.toml or an unparsable numeric value, naming the key.
Result<Config> LoadConfig();

}  // namespace oml
