// Named sync/fault points, after rocksdb's test_util/sync_point.h.
//
// Production code marks a point with OML_SYNC_POINT("Journal::AfterJournalInsert"). A test
// installs a callback for that name; the callback may block (to force an interleaving) or return
// a non-OK Status, which the marked code returns as if the step had failed (fault injection).
// With OML_SYNC_POINTS undefined the macro compiles to an OK status and costs nothing.
//
// Points can also be armed from the environment for black-box tests (read once per process):
//   OML_FAULT=<name>       makes the point named <name> fail with kInternal (type "injected-fault").
//   OML_FAULT=<name>:kill  kills the process with SIGKILL the first time it reaches <name>: a
//                          crash with no cleanup at all (tests/test_lakewriter.py kills the lake
//                          writer at each step of its protocol this way).
//   OML_FAULT=<name>:stop  stops the process with SIGSTOP the first time it reaches <name> (the
//                          thread at <name> runs no further); it goes on (as if the point were not
//                          armed) after the test sends SIGCONT. Used to hold one process at an
//                          exact step while another one runs.
// Point names never contain ':'.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"

namespace oml {

class SyncPoints {
 public:
  using Callback = std::function<Status()>;
  // Thread-safe. Replaces any callback already set for `name`.
  static void Set(const std::string& name, Callback cb);
  static void Clear(const std::string& name);
  static void ClearAll();
  // Runs the callback for `name`, if any; OK otherwise.
  static Status Process(const char* name);
};

}  // namespace oml

#ifdef OML_SYNC_POINTS
#define OML_SYNC_POINT(name) ::oml::SyncPoints::Process(name)
#else
#define OML_SYNC_POINT(name) ::oml::Status::Ok()
#endif
