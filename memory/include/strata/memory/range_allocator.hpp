// Best-fit allocator of aligned ranges inside [0, capacity). One allocator serves all
// three tiers: offsets into the device arena, into the pinned pool, and into the NVMe
// swap space. Freed ranges coalesce with their neighbours and are reused.
// Not thread-safe: owners lock around it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace strata {

class RangeAllocator {
 public:
  RangeAllocator(uint64_t capacity, uint64_t alignment);

  // Where a range is carved. Low: the smallest free range that fits, from its start
  // (best fit). High: the highest free range that fits, from its end. Data that stays
  // (homes, caches) low and transient buffers high keep the two apart, so that what the
  // transient ones leave when they go is one range, not holes between cached tensors.
  enum class Placement { Low, High };

  // Returns the offset of a range of at least `bytes` (rounded up to the alignment),
  // or nullopt when no free range is large enough.
  std::optional<uint64_t> allocate(uint64_t bytes, Placement where = Placement::Low);
  void free(uint64_t offset);  // offset must come from allocate()

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t used() const { return used_; }          // bytes, after rounding
  uint64_t peak() const { return peak_; }          // bytes, high-water mark of used()
  uint64_t largest_free() const;                   // bytes
  uint64_t size_of(uint64_t offset) const;         // bytes of a live allocation
  uint64_t round(uint64_t bytes) const { return (bytes + alignment_ - 1) / alignment_ * alignment_; }

 private:
  void insert_free(uint64_t off, uint64_t len);
  void erase_free(uint64_t off, uint64_t len);

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;             // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;    // (length, offset)
  std::map<uint64_t, uint64_t> live_;                       // offset -> length
};

}  // namespace strata
