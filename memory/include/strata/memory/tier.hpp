// Tiers and the byte pools behind the two memory tiers.
//
// A TierPool owns one region of memory taken up front (the whole budget) and
// sub-allocates it with a RangeAllocator, so no tier can ever hold more than its
// budget: the hard limit is the region's size. It keeps current and peak use, in
// total and per owner. DeviceArena and PinnedPool are the two ways to get a region.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/device.hpp"
#include "strata/memory/fence_map.hpp"
#include "strata/memory/range_allocator.hpp"

namespace strata {

enum class Tier : uint8_t { Device = 0, Pinned = 1, Nvme = 2 };
inline constexpr int kTierCount = 3;
const char* to_string(Tier t);
Tier parse_tier(const std::string& s);  // "device"/"gpu", "pinned"/"cpu", "nvme"

struct TierUsage {
  uint64_t budget = 0;  // bytes
  uint64_t used = 0;    // bytes
  uint64_t peak = 0;    // bytes, high-water mark since creation
  std::map<std::string, uint64_t> by_owner;  // bytes per owner
  std::map<std::string, uint64_t> peak_by_owner;  // each owner's high-water mark (memory tiers)
};

class TierPool {
 public:
  // region: [base, base+bytes); release is called once on destruction.
  TierPool(Tier tier, void* base, uint64_t bytes, uint64_t alignment, std::function<void()> release);
  ~TierPool();
  TierPool(const TierPool&) = delete;
  TierPool& operator=(const TierPool&) = delete;

  // nullptr when no free range is large enough (the caller may evict and retry).
  // reuse_fence, when given, receives the fence of the memory handed out (fence_map.hpp):
  // write it only after that event.
  // where: RangeAllocator::Placement (transient buffers High, data that stays Low).
  void* try_allocate(uint64_t bytes, const std::string& owner, Event* reuse_fence = nullptr,
                     RangeAllocator::Placement where = RangeAllocator::Placement::Low);
  // fence: the last work using [p, p+size) issued so far; the range is reused after it.
  void free(void* p, Event fence = {});

  Tier tier() const { return tier_; }
  void* base() const { return base_; }
  uint64_t capacity() const;
  uint64_t largest_free() const;
  TierUsage usage() const;
  bool contains(const void* p) const;

 private:
  Tier tier_;
  char* base_;
  std::function<void()> release_;
  mutable std::mutex mu_;
  RangeAllocator ranges_;
  FenceMap fences_;
  std::map<uint64_t, std::string> owner_of_;  // offset -> owner
  std::map<std::string, uint64_t> by_owner_;
  std::map<std::string, uint64_t> peak_by_owner_;
};

// Device memory: one region of `budget` bytes from the device, sub-allocated.
std::unique_ptr<TierPool> make_device_arena(Device& device, uint64_t budget);

struct PinnedOptions {
  uint64_t budget = 0;   // bytes
  int numa_node = -1;    // -1: the node nearest the device (topology), if known
  bool lock = true;      // mlock; refused locking falls back to unlocked memory, one warning
};
// Pinned host memory: page-aligned, placed on a NUMA node, locked and registered with
// the device for fast copies.
std::unique_ptr<TierPool> make_pinned_pool(Device& device, const PinnedOptions& opts);

// Alignment of every tier allocation: enough for O_DIRECT on any file system we meet.
inline constexpr uint64_t kTierAlignment = 4096;
// The bytes a tier allocation of `bytes` takes: rounded up to kTierAlignment.
inline constexpr uint64_t tier_allocation_bytes(uint64_t bytes) {
  return (bytes + kTierAlignment - 1) / kTierAlignment * kTierAlignment;
}

}  // namespace strata
