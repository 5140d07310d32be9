#include "strata/memory/tier.hpp"

#include <algorithm>

#include <unistd.h>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/memory/topology.hpp"

namespace strata {

const char* to_string(Tier t) {
  switch (t) {
    case Tier::Device: return "device";
    case Tier::Pinned: return "pinned";
    case Tier::Nvme: return "nvme";
  }
  return "?";
}

Tier parse_tier(const std::string& s) {
  if (s == "device" || s == "gpu" || s == "none") return Tier::Device;
  if (s == "pinned" || s == "cpu") return Tier::Pinned;
  if (s == "nvme") return Tier::Nvme;
  throw ConfigError("unknown tier '" + s + "': use one of device, pinned (cpu), nvme");
}

TierPool::TierPool(Tier tier, void* base, uint64_t bytes, uint64_t alignment, std::function<void()> release)
    : tier_(tier), base_(static_cast<char*>(base)), release_(std::move(release)), ranges_(bytes, alignment) {}

TierPool::~TierPool() {
  if (release_) release_();
}

void* TierPool::try_allocate(uint64_t bytes, const std::string& owner, Event* reuse_fence,
                             RangeAllocator::Placement where) {
  std::lock_guard<std::mutex> lock(mu_);
  auto off = ranges_.allocate(bytes, where);
  if (!off) return nullptr;
  owner_of_.emplace(*off, owner);
  const uint64_t n = by_owner_[owner] += ranges_.size_of(*off);
  uint64_t& peak = peak_by_owner_[owner];
  peak = std::max(peak, n);
  if (reuse_fence) *reuse_fence = fences_.covering(*off, ranges_.size_of(*off));
  return base_ + *off;
}

void TierPool::free(void* p, Event fence) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK(static_cast<char*>(p) >= base_ && static_cast<char*>(p) < base_ + ranges_.capacity(),
               std::string("free of a pointer outside the ") + to_string(tier_) + " pool");
  uint64_t off = static_cast<uint64_t>(static_cast<char*>(p) - base_);
  uint64_t len = ranges_.size_of(off);
  auto it = owner_of_.find(off);
  if (it != owner_of_.end()) {
    auto& n = by_owner_[it->second];
    n -= len;
    if (n == 0) by_owner_.erase(it->second);
    owner_of_.erase(it);
  }
  fences_.add(off, len, std::move(fence));
  ranges_.free(off);
}

uint64_t TierPool::capacity() const { return ranges_.capacity(); }

uint64_t TierPool::largest_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranges_.largest_free();
}

TierUsage TierPool::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TierUsage{ranges_.capacity(), ranges_.used(), ranges_.peak(), by_owner_, peak_by_owner_};
}

bool TierPool::contains(const void* p) const {
  auto* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + ranges_.capacity();
}

std::unique_ptr<TierPool> make_device_arena(Device& device, uint64_t budget) {
  budget = budget / kTierAlignment * kTierAlignment;
  if (budget == 0) throw ConfigError("device budget is 0 bytes: set strata.device_budget to at least 4 KiB");
  void* base = device.allocate(budget);
  Device* dev = &device;
  return std::make_unique<TierPool>(Tier::Device, base, budget, kTierAlignment,
                                    [dev, base, budget] { dev->deallocate(base, budget); });
}

std::unique_ptr<TierPool> make_pinned_pool(Device& device, const PinnedOptions& opts) {
  uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t bytes = (opts.budget + page - 1) / page * page;
  if (bytes == 0) throw ConfigError("pinned budget is 0 bytes: set strata.pinned_budget to at least 4 KiB");
  int node = opts.numa_node >= 0 ? opts.numa_node : nearest_numa_node(device);
  bool locked = false;
  void* base = device.allocate_host(bytes, node, opts.lock, &locked);  // warns when locking is refused
  bool registered = device.register_host(base, bytes);
  if (!registered)
    log::warn_once("pinned-register", "pinned pool: the device refused to register host memory; copies will be slower");
  Device* dev = &device;
  return std::make_unique<TierPool>(Tier::Pinned, base, bytes, kTierAlignment, [=] {
    if (registered) dev->unregister_host(base);
    dev->deallocate_host(base, bytes);
  });
}

}  // namespace strata
