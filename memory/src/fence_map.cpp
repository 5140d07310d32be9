#include "strata/memory/fence_map.hpp"

#include <vector>

namespace strata {

void FenceMap::add(uint64_t offset, uint64_t bytes, Event fence) {
  if (bytes == 0) return;
  const uint64_t begin = offset, end = offset + bytes;
  std::vector<Event> join{std::move(fence)};
  // Cut out what overlaps [begin, end), keeping the parts outside it with their fences.
  auto it = fences_.lower_bound(begin);
  if (it != fences_.begin() && std::prev(it)->second.end > begin) --it;
  while (it != fences_.end() && it->first < end) {
    const uint64_t b = it->first;
    Fenced f = it->second;
    it = fences_.erase(it);
    join.push_back(f.fence);
    if (b < begin) fences_.emplace(b, Fenced{begin, f.fence});
    if (f.end > end) {
      fences_.emplace(end, Fenced{f.end, f.fence});
      break;
    }
  }
  Event joined = when_done(when_all(std::move(join)));
  if (joined.impl() != nullptr) fences_.emplace(begin, Fenced{end, std::move(joined)});
}

Event FenceMap::covering(uint64_t offset, uint64_t bytes) const {
  if (bytes == 0 || fences_.empty()) return Event();
  const uint64_t end = offset + bytes;
  std::vector<Event> parts;
  auto it = fences_.lower_bound(offset);
  if (it != fences_.begin() && std::prev(it)->second.end > offset) --it;
  for (; it != fences_.end() && it->first < end; ++it) parts.push_back(it->second.fence);
  return when_all(std::move(parts));
}

}  // namespace strata
