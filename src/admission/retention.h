// The retention of rejected claims (issue 9, "Admission lifecycle": a rejected claim "stays in
// quarantine until its retention ends, then it is removed (journalled)").
//
// The removal is an erasure, journalled like any other: artifact.erased by the principal
// "oml-retention" (role admin, no API key) with reason "retention: rejected at seq <n>, kept
// <retention> s". It shreds the claim's keys and those of its attachments, and deletes its
// objects from quarantine (Claims::Erase with attachments). Its metadata, digests and events
// stay; fetch then answers 410.
//
// A claim is due when its newest version is rejected, not erased, and its claim.rejected event
// (signed time) is older than the retention (sql/0015 rejected_retention_due). A pass that loses a
// race to another erasure skips that claim. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "admission/claims.h"
#include "common/status.h"
#include "db/conn.h"

namespace oml::admission {

inline constexpr char kRetentionPrincipal[] = "oml-retention";

class RejectedRetention {
 public:
  // REQUIRES: pool and claims outlive this object; claims has its attachments set (else only the
  // claims' own keys are shredded).
  RejectedRetention(db::Pool* pool, Claims* claims, std::chrono::seconds retention);
  ~RejectedRetention();  // stops the background pass, if started
  RejectedRetention(const RejectedRetention&) = delete;
  RejectedRetention& operator=(const RejectedRetention&) = delete;

  // One pass: erases every due claim. Returns how many it erased; the first error other than a
  // lost race ends the pass.
  Result<int64_t> SweepOnce();
  // Runs SweepOnce every `interval` on a thread until destruction (errors are logged).
  void Start(std::chrono::milliseconds interval);

 private:
  db::Pool* pool_;
  Claims* claims_;
  const std::chrono::seconds retention_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace oml::admission
