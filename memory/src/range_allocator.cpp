#include "strata/memory/range_allocator.hpp"

#include <string>

#include "strata/core/error.hpp"

namespace strata {

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity / alignment * alignment), alignment_(alignment) {
  STRATA_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two");
  if (capacity_ > 0) insert_free(0, capacity_);
}

void RangeAllocator::insert_free(uint64_t off, uint64_t len) {
  free_by_offset_.emplace(off, len);
  free_by_size_.emplace(len, off);
}

void RangeAllocator::erase_free(uint64_t off, uint64_t len) {
  free_by_offset_.erase(off);
  free_by_size_.erase({len, off});
}

std::optional<uint64_t> RangeAllocator::allocate(uint64_t bytes, Placement where) {
  uint64_t len = round(bytes == 0 ? 1 : bytes);
  uint64_t off = 0;
  if (where == Placement::Low) {
    auto it = free_by_size_.lower_bound({len, 0});
    if (it == free_by_size_.end()) return std::nullopt;
    auto [flen, foff] = *it;
    erase_free(foff, flen);
    if (flen > len) insert_free(foff + len, flen - len);
    off = foff;
  } else {
    auto it = free_by_offset_.rbegin();
    while (it != free_by_offset_.rend() && it->second < len) ++it;
    if (it == free_by_offset_.rend()) return std::nullopt;
    const uint64_t foff = it->first, flen = it->second;
    erase_free(foff, flen);
    if (flen > len) insert_free(foff, flen - len);
    off = foff + flen - len;
  }
  live_.emplace(off, len);
  used_ += len;
  if (used_ > peak_) peak_ = used_;
  return off;
}

void RangeAllocator::free(uint64_t offset) {
  auto it = live_.find(offset);
  STRATA_CHECK(it != live_.end(), "free of an offset that is not allocated: " + std::to_string(offset));
  uint64_t off = offset, len = it->second;
  live_.erase(it);
  used_ -= len;
  // Coalesce with the following and preceding free ranges.
  auto next = free_by_offset_.lower_bound(off);
  if (next != free_by_offset_.end() && next->first == off + len) {
    uint64_t nlen = next->second;
    erase_free(next->first, nlen);
    len += nlen;
  }
  auto after = free_by_offset_.lower_bound(off);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == off) {
      uint64_t poff = prev->first, plen = prev->second;
      erase_free(poff, plen);
      off = poff;
      len += plen;
    }
  }
  insert_free(off, len);
}

uint64_t RangeAllocator::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

uint64_t RangeAllocator::size_of(uint64_t offset) const {
  auto it = live_.find(offset);
  STRATA_CHECK(it != live_.end(), "size_of an offset that is not allocated");
  return it->second;
}

}  // namespace strata
