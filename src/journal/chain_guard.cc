#include "journal/chain_guard.h"

#include "common/log.h"
#include "crypto/crypto.h"
#include "journal/event.h"

namespace oml::journal {

bool ChainGuard::Observe(const std::string& tenant, int64_t seq, const std::string& event_hash) {
  if (seq <= 0) return true;
  std::string conflict;
  {
    std::lock_guard<std::mutex> l(mu_);
    Head& h = known_[tenant];
    if (seq > h.seq) {
      h = {seq, event_hash};
      return true;
    }
    if (seq < h.seq || h.event_hash == event_hash) return true;
    conflict = "two different events were acknowledged or published for seq " + std::to_string(seq) + " (" +
               crypto::Hex(h.event_hash).substr(0, 16) + "... and " + crypto::Hex(event_hash).substr(0, 16) + "...)";
  }
  Close(tenant, conflict);
  return false;
}

ChainGuard::Head ChainGuard::Known(const std::string& tenant) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = known_.find(tenant);
  return it == known_.end() ? Head{} : it->second;
}

void ChainGuard::SetRefresher(std::function<void(const std::string&)> fn, std::chrono::milliseconds every) {
  refresh_ = std::move(fn);
  refresh_every_ = every;
}

void ChainGuard::MaybeRefresh(const std::string& tenant) {
  if (!refresh_) return;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = refreshed_.find(tenant);
    if (it != refreshed_.end() && now - it->second < refresh_every_) return;
    refreshed_[tenant] = now;
  }
  refresh_(tenant);
}

void ChainGuard::Close(const std::string& tenant, const std::string& what) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!closed_.emplace(tenant, what).second) return;  // closed already: logged once
  }
  log::Error("chain fork detected; writes to this chain are refused until it is repaired and oml restarts",
             {{"tenant", tenant}, {"what", what}, {"known_seq", Known(tenant).seq}});
}

std::optional<std::string> ChainGuard::Closed(const std::string& tenant) const {
  std::lock_guard<std::mutex> l(mu_);
  auto p = closed_.find(kProviderTenant);
  if (p != closed_.end()) return "the deployment's provider chain is forked: " + p->second;
  auto it = closed_.find(tenant);
  if (it == closed_.end()) return std::nullopt;
  return it->second;
}

bool ChainGuard::ProviderClosed() const {
  std::lock_guard<std::mutex> l(mu_);
  return closed_.count(kProviderTenant) > 0;
}

size_t ChainGuard::ClosedCount() const {
  std::lock_guard<std::mutex> l(mu_);
  return closed_.size();
}

}  // namespace oml::journal
