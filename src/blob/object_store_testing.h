// For tests: an ObjectStore that forwards every call to another, so that a test overrides only
// the calls it observes or changes (fault injection, counting, another minimum part size).
#pragma once

#include "blob/object_store.h"

namespace oml::blob::testing {

class ForwardingStore : public ObjectStore {
 public:
  // REQUIRES: `s` outlives this object.
  explicit ForwardingStore(ObjectStore* s) : s_(s) {}
  Status Put(const std::string& k, const std::string& b) override { return s_->Put(k, b); }
  Result<bool> PutIfAbsent(const std::string& k, const std::string& b) override { return s_->PutIfAbsent(k, b); }
  Result<std::optional<std::string>> Get(const std::string& k) override { return s_->Get(k); }
  Result<std::optional<std::string>> GetRange(const std::string& k, uint64_t o, uint64_t n) override {
    return s_->GetRange(k, o, n);
  }
  Result<std::optional<uint64_t>> Size(const std::string& k) override { return s_->Size(k); }
  Result<std::vector<std::string>> List(const std::string& p) override { return s_->List(p); }
  Status Delete(const std::string& k) override { return s_->Delete(k); }
  Status Copy(const std::string& f, const std::string& t) override { return s_->Copy(f, t); }
  Result<std::unique_ptr<ObjectWriter>> OpenWriter(const std::string& k) override { return s_->OpenWriter(k); }
  uint64_t ResumableMinPart() const override { return s_->ResumableMinPart(); }
  Result<std::string> ResumableStart(const std::string& k) override { return s_->ResumableStart(k); }
  Result<std::string> ResumablePut(const std::string& k, const std::string& h, uint32_t n, uint64_t o,
                                   std::string_view b, bool sync) override {
    return s_->ResumablePut(k, h, n, o, b, sync);
  }
  Status ResumableFinish(const std::string& k, const std::string& h, const std::vector<std::string>& t, uint64_t n,
                         const std::string& f) override {
    return s_->ResumableFinish(k, h, t, n, f);
  }
  Status ResumableAbort(const std::string& k, const std::string& h) override { return s_->ResumableAbort(k, h); }
  Result<uint64_t> SweepStaging(std::chrono::seconds grace) override { return s_->SweepStaging(grace); }

 private:
  ObjectStore* s_;
};

}  // namespace oml::blob::testing
