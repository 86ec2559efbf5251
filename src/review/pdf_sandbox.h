// PDF text extraction isolated from the server (issue 19, "One small PDF stalls every tenant").
//
// poppler runs in a child process per extraction, never in the server: a 204 KB PDF whose 30
// pages share one 81 MB content stream took 70 s in-process, behind a process-wide mutex that
// every other tenant's PDF waited on. Here each extraction is `<oml> __extract-pdf` (the server's
// own binary, RunPdfChild below), spawned with:
//   - an address-space limit (RLIMIT_AS) and a CPU-time limit (RLIMIT_CPU), set by the child on
//     itself before it reads a byte;
//   - a wall-clock deadline enforced by the parent (SIGKILL at the deadline);
//   - no lock shared with any other extraction (each child has its own poppler);
//   - a per-tenant bound on concurrent extractions and a bound for the whole process: one
//     tenant's PDFs never take another tenant's slots, and a request finding none free (after
//     half a second) is answered 503 pdf-extraction-busy rather than holding a request thread;
//   - its own descriptors only (the pipes and stderr), an empty environment, default signals.
// A file that hits a limit gets an honest result: PdfOutcome::kLimit with the limit named
// ("not-extracted: limit: cpu 10 s"), which the review flags ("not-extracted") for the reviewer;
// never a silent empty text.
//
// Protocol: the parent writes the PDF to the child's stdin as it reads it (the server never holds
// the whole file; the child does, poppler needs it in one piece) and closes it. The child writes
// frames to stdout: 'T' <u32 big-endian n> <n bytes of text> for the extracted text as it is
// produced (extract.h's normal form, all of it: the parent keeps a prefix and its tap scans the
// whole), then one 'H' <u32 n> <n bytes of JSON {"outcome", "pages", "pages_extracted",
// "notes", "incomplete"}>, and exits 0.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"
#include "review/extract.h"

namespace oml::review {

struct PdfSandboxOptions {
  std::string binary;                     // the executable that answers `__extract-pdf` (oml)
  uint64_t memory_bytes = 1ull << 30;     // RLIMIT_AS of the child
  int cpu_seconds = 10;                   // RLIMIT_CPU of the child
  std::chrono::milliseconds wall{20000};  // from the request, the slot wait included
  int max_concurrent = 4;                 // children at once, all tenants
  int max_per_tenant = 2;                 // children at once for one tenant
};

class PdfSandbox {
 public:
  explicit PdfSandbox(PdfSandboxOptions o) : opts_(std::move(o)) {}
  PdfSandbox(const PdfSandbox&) = delete;
  PdfSandbox& operator=(const PdfSandbox&) = delete;

  // The text of `bytes` into `sink`, as ExtractPdf would give it, from a child process. A limit
  // hit (memory, CPU, wall clock) is PdfOutcome::kLimit with the limit in notes; a child that
  // fails otherwise (crash) is kUnreadable with a note. No slot free within half a second (the
  // tenant's or all tenants' extractions busy) is kUnavailable "pdf-extraction-busy": the
  // request is answered 503 and retried by the client, nothing is signed. Errors of the sandbox
  // itself (cannot spawn) are returned.
  Result<PdfText> Extract(std::string_view bytes, TextSink* sink, const std::string& tenant);
  // The same over a PDF of `size` bytes read in pieces: `next` returns the next piece ("" at the
  // end; valid until the next call). An error of `next` kills the child and is returned. The
  // child may stop reading early (a limit): the caller reads the rest itself if it needs it.
  Result<PdfText> Extract(const std::function<Result<std::string_view>()>& next, uint64_t size, TextSink* sink,
                          const std::string& tenant);

  const PdfSandboxOptions& options() const { return opts_; }

 private:
  // Takes a slot for `tenant` before `deadline`; false if none came free in time.
  bool Acquire(const std::string& tenant, std::chrono::steady_clock::time_point deadline);
  void Release(const std::string& tenant);

  PdfSandboxOptions opts_;
  std::mutex mu_;
  std::condition_variable freed_;
  int running_ = 0;
  std::map<std::string, int> by_tenant_;
};

// The child: `oml __extract-pdf <memory_bytes> <cpu_seconds>`. Sets its limits,
// reads the PDF from stdin, extracts (ExtractPdf), writes the answer to stdout. Returns the exit
// code. Called from main() before anything else is set up.
int RunPdfChild(int argc, char** argv);

}  // namespace oml::review
