// `oml claim submit`: the CLI client of attachments (issue 9). Uploads each --file with tus 1.0
// (POST /v1/uploads, then PATCH chunks; api/uploads_handlers.h), resumably, then submits the
// claim (POST /v1/claims with "attachments": [upload ids]) and prints its receipt on stdout.
//
// Per file:
//   1. SHA-256 of the whole file, read in blocks (bounded memory), declared at creation in
//      Upload-Metadata (`sha256`, `filename`, `content-type`: --media-type, else guessed from
//      the extension, GuessMediaType).
//   2. A state file per (server, API key, file SHA-256, size) in the state directory
//      (StateDir) holds the session's URL. If one exists, HEAD tells the server's offset and
//      the upload continues there; 404 or 410 (cancelled, expired, failed, another key's)
//      starts a new session.
//   3. PATCH chunks of --chunk-size bytes (default 4 MiB) with Upload-Checksum: sha256 per
//      chunk. A 413 body-too-large (the chunk is above the server's request limit) halves the
//      chunk, down to kMinChunk. A 409 upload-offset-mismatch continues at the server's offset.
//   4. Connection errors, 503, and 409 upload-busy are retried with exponential backoff
//      (--retries times in a row at most; a success resets the count). After a lost
//      connection the session is HEADed before the next chunk: a chunk is never sent twice
//      when the server already took it.
// Then the claim, under a random Idempotency-Key that a claim state file (ClaimStateFileName)
// remembers with the upload ids before the request is sent. A re-run of the same command after
// a lost answer asks again with that key and those ids first, so the server replays the
// committed claim's receipt instead of committing a second claim (or commits it now, if the
// first never arrived). On 201 the claim's state file and its uploads' are removed; a refusal
// (4xx) removes the claim's.
//
// Progress goes to stderr: a bar (bytes/total, rate) when stderr is a terminal, plain lines
// otherwise (start, resume, every 10 %, done). stdout carries only the 201 body (or, with
// --upload-only, the uploads as JSON).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace oml::cli {

struct ClaimSubmitOptions {
  std::vector<std::string> files;
  std::string workarea_id, path;
  std::string body, body_file;
  std::string provenance = "human";
  std::string media_type;       // of every --file; empty: guessed from the extension
  std::string body_media_type;  // the claim's media_type (of its body); empty: the server's default
  std::string simulation_id;
  std::string server;           // empty: http://<config listen>
  std::string api_key_file;     // empty: $OML_API_KEY, else $OML_HOME/dev-writer.token
  std::string state_dir;        // empty: StateDir()
  uint64_t chunk_size = 4u << 20;
  int retries = 8;
  int timeout_s = 60;
  bool upload_only = false;
  int64_t test_kill_after_chunks = 0;  // TEST ONLY: SIGKILL itself after this many chunks
  bool test_kill_after_claim = false;  // TEST ONLY: SIGKILL itself when the claim was answered 201
};

inline constexpr uint64_t kMinChunk = 64 * 1024;
inline constexpr uint64_t kMaxChunk = uint64_t{1} << 30;

// Adds `claim submit` (and its parent `claim`) to `app`; `opts` is filled at parse.
CLI::App* AddClaimSubmit(CLI::App& app, ClaimSubmitOptions* opts);

// Runs the command; returns the process exit code (cli/exit_codes.h).
int RunClaimSubmit(const Config& cfg, const ClaimSubmitOptions& opts);

// --- pure parts (cli_client_test.cc) ---------------------------------------------------------

// The media type of a file name by its extension (case-insensitive), e.g. "a.md" ->
// "text/markdown"; application/octet-stream when unknown.
std::string GuessMediaType(const std::string& filename);

// Upload-Metadata of a creation: sha256 (raw digest), filename, content-type; tus encoding
// (key SP base64(value), comma-separated).
std::string UploadMetadata(const std::string& sha256_raw, const std::string& filename, const std::string& media_type);

// Where state files live: $OML_HOME/uploads if OML_HOME is set, else $XDG_CACHE_HOME/oml/uploads,
// else $HOME/.cache/oml/uploads.
std::string StateDir();

// The state file's name (64 hex + ".json") for one file on one server with one API key. The
// token itself never reaches the name or the file: only SHA-256(token).
std::string StateFileName(const std::string& server_base, const std::string& token, const std::string& sha256_raw,
                          uint64_t size);

// The claim state file's name (64 hex + ".claim.json") of one claim: the server, SHA-256 of the
// token, SHA-256 of its request without attachments (`request`, the JSON text), and its files'
// (raw SHA-256, size) in order. It holds {"idempotency_key", "attachments": [upload ids]}: never
// the token or the body.
std::string ClaimStateFileName(const std::string& server_base, const std::string& token, const std::string& request,
                               const std::vector<std::pair<std::string, uint64_t>>& files);

// The Status of a problem answer (RFC 9457 body, else the status line): code by HTTP status
// (400/422/460 kInvalidArgument, 401 kUnauthenticated, 403 kPermissionDenied, 404 kNotFound,
// 409 kFailedPrecondition, 410 kGone, 413 kPayloadTooLarge, 500 integrity kDataLoss, other
// 5xx kUnavailable, other 4xx kInvalidArgument), type the problem's slug, message its detail
// and what was asked ("(HTTP 409, PATCH /v1/uploads/...)").
Status StatusOfProblem(int http_status, const std::string& body, const std::string& what);

// The delay before retry `attempt` (1-based): 500 ms doubling, at most 15 s, at least
// `retry_after_s` seconds when the server said so.
std::chrono::milliseconds Backoff(int attempt, int retry_after_s = 0);

}  // namespace oml::cli
